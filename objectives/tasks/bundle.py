"""A task set: DCLM / CORE-style bundles read unchanged, and the ``Task`` every scorer takes.

A bundle is ``NAME.yaml`` beside a folder ``eval_data/``; the YAML lists its tasks under ``tasks:`` (the paper's
evaluation code) or ``icl_tasks:`` (DCLM, llm-foundry and nanochat's CORE bundle), each with::

    label                   the task's name (numbers are logged as task.<label>_r<k>)
    dataset_uri             its JSONL file, relative to eval_data/ (one item per line)
    task_type               multiple_choice | schema | language_modeling  (``icl_task_type`` in DCLM's spelling)
    num_fewshot             examples drawn from the same file before each item; an int, or a list (one task per
                            value, labelled <label>_<k>shot when the list holds more than one)
    continuation_delimiter  between an item's context and its continuation (default " ")
    group                   the axis the task counts toward (default: the first folder of dataset_uri)
    random_baseline         optional chance accuracy in percent, as nanochat's eval_meta_data.csv gives it

Items: multiple_choice ``query``, ``choices`` (strings), ``gold`` (index); schema ``context_options``,
``continuation``, ``gold``; language_modeling ``context``, ``continuation``. A ``random_baseline`` missing from
the YAML is read from ``eval_meta_data.csv`` beside it (columns ``Eval Task``, ``Random baseline``) when there is
one, else it is the chance of guessing: the mean of 1 / options over the items (0 for language modeling). A task
kept on the Hugging Face hub (DCLM's ``hf_repo``, or a ``dataset_uri`` that is a URL) is refused in one line:
evaluation reads local files only.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..checks import did_you_mean

TASK_TYPES = ("multiple_choice", "schema", "language_modeling")
ITEM_KEYS = {"multiple_choice": ("query", "choices", "gold"), "schema": ("context_options", "continuation", "gold"),
             "language_modeling": ("context", "continuation")}
TASK_KEYS = {"label", "dataset_uri", "task_type", "icl_task_type", "num_fewshot", "continuation_delimiter", "group",
             "random_baseline", "has_categories", "metric_names", "prompt_string", "example_delimiter"}
HUB_KEYS = ("hf_repo", "hf_loading_vars", "hf_parsing_map")
META_FILE = "eval_meta_data.csv"


@dataclass(frozen=True)
class Task:
    """One task: its items (dicts in the format's keys), how each is prompted, the axis it counts toward and its
    chance accuracy (a fraction)."""

    label: str
    task_type: str
    items: tuple[dict[str, Any], ...]
    axis: str
    baseline: float
    num_fewshot: int = 0
    continuation_delimiter: str = " "


def load_bundle(path: str | Path) -> list[Task]:
    """The tasks of the bundle YAML ``path`` (module docstring), every item checked; ValueError in one line naming
    the file, task and line for anything else, before any scoring."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"--tasks: no such file {str(path)!r} (a bundle YAML, or a built-in set: probes)")
    try:
        spec = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not YAML ({str(exc).splitlines()[0]})") from None
    entries = spec.get("tasks", spec.get("icl_tasks")) if isinstance(spec, dict) else None
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{path}: a bundle lists its tasks under 'tasks:' (or 'icl_tasks:')")
    baselines = _meta_baselines(path.parent / META_FILE)
    tasks = [task for i, entry in enumerate(entries) for task in _tasks_of(entry, i, path, baselines)]
    labels = [task.label for task in tasks]
    twice = sorted({label for label in labels if labels.count(label) > 1})
    if twice:
        raise ValueError(f"{path}: task label {twice[0]!r} appears more than once")
    return tasks


def _tasks_of(entry: Any, index: int, path: Path, baselines: dict[str, float]) -> list[Task]:
    where = f"{path}: task {index + 1}"
    if not isinstance(entry, dict):
        raise ValueError(f"{where} must be a mapping of keys, got {type(entry).__name__}")
    label = entry.get("label")
    if not isinstance(label, str) or not label:
        raise ValueError(f"{where} needs a label")
    where = f"{path}: task {label!r}"
    hub = [key for key in HUB_KEYS if key in entry]
    uri = entry.get("dataset_uri")
    if hub or (isinstance(uri, str) and "://" in uri):
        source = entry.get("hf_repo", uri)
        raise ValueError(f"{where} is a Hugging Face hub dataset ({source}); evaluation reads local files only: "
                         f"save its items as JSONL under eval_data/ and name that file in dataset_uri")
    unknown = sorted(set(entry) - TASK_KEYS)
    if unknown:
        raise ValueError(f"{where}: unknown key {unknown[0]!r}{did_you_mean(unknown[0], TASK_KEYS)}")
    task_type = entry.get("task_type", entry.get("icl_task_type"))
    if task_type not in TASK_TYPES:
        raise ValueError(f"{where}: task_type must be one of {', '.join(TASK_TYPES)}, got {task_type!r}")
    if not isinstance(uri, str) or not uri:
        raise ValueError(f"{where} needs a dataset_uri (its JSONL file, relative to eval_data/)")
    shots = entry.get("num_fewshot", 0)
    shots = shots if isinstance(shots, list) else [shots]
    if not shots or any(not isinstance(k, int) or isinstance(k, bool) or k < 0 for k in shots):
        raise ValueError(f"{where}: num_fewshot must be a whole number >= 0 or a list of them, got "
                         f"{entry.get('num_fewshot')!r}")
    delimiter = entry.get("continuation_delimiter", " ")
    if not isinstance(delimiter, str):
        raise ValueError(f"{where}: continuation_delimiter must be a string, got {delimiter!r}")
    items = read_items(path.parent / "eval_data" / uri, task_type, where)
    if max(shots) >= len(items):
        raise ValueError(f"{where}: num_fewshot {max(shots)} needs more than {len(items)} items (the examples "
                         f"come from the same file, the item itself left out)")
    folders = Path(uri).parts[:-1]
    axis = entry.get("group") or (folders[0] if folders else label)
    percent = entry.get("random_baseline", baselines.get(label))
    baseline = chance(task_type, items) if percent is None else float(percent) / 100
    if not 0 <= baseline < 1:
        raise ValueError(f"{where}: random_baseline must be a percentage in [0, 100), got {percent!r}")
    return [Task(label=label if len(shots) == 1 else f"{label}_{k}shot", task_type=task_type, items=items,
                 axis=str(axis), baseline=baseline, num_fewshot=k, continuation_delimiter=delimiter) for k in shots]


def read_items(path: Path, task_type: str, where: str) -> tuple[dict[str, Any], ...]:
    """The items of a JSONL file, each checked to hold its task type's keys."""
    if not path.is_file():
        raise ValueError(f"{where}: no such file {str(path)!r}")
    items = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{where}: {path.name} line {number} is not JSON ({exc.msg})") from None
        check_item(item, task_type, f"{where}: {path.name} line {number}")
        items.append(item)
    if len(items) < 1:
        raise ValueError(f"{where}: {path.name} holds no items")
    return tuple(items)


def check_item(item: Any, task_type: str, where: str) -> None:
    """Raise ValueError naming ``where`` unless ``item`` is a well-formed item of ``task_type``."""
    missing = [key for key in ITEM_KEYS[task_type] if not isinstance(item, dict) or key not in item]
    if missing:
        raise ValueError(f"{where}: a {task_type} item needs {', '.join(ITEM_KEYS[task_type])}; "
                         f"{missing[0]!r} is missing")
    options = item.get("choices", item.get("context_options"))
    if task_type != "language_modeling":
        if not isinstance(options, list) or len(options) < 2 or not all(isinstance(o, str) for o in options):
            raise ValueError(f"{where}: a {task_type} item needs at least two options, each a string")
        gold = item["gold"]
        if not isinstance(gold, int) or isinstance(gold, bool) or not 0 <= gold < len(options):
            raise ValueError(f"{where}: gold must index its {len(options)} options, got {gold!r}")
    text = [item[key] for key in ITEM_KEYS[task_type] if key not in ("choices", "context_options", "gold")]
    if not all(isinstance(t, str) for t in text):
        raise ValueError(f"{where}: an item's query, context and continuation must be strings")


def chance(task_type: str, items: tuple[dict[str, Any], ...]) -> float:
    """The accuracy of guessing: the mean over the items of 1 / options (0 for language modeling)."""
    if task_type == "language_modeling":
        return 0.0
    key = "choices" if task_type == "multiple_choice" else "context_options"
    return sum(1 / len(item[key]) for item in items) / len(items)


def _meta_baselines(path: Path) -> dict[str, float]:
    """Task label -> random baseline in percent from nanochat's ``eval_meta_data.csv``; {} without one."""
    if not path.is_file():
        return {}
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    try:
        return {row["Eval Task"]: float(row["Random baseline"]) for row in rows}
    except (KeyError, ValueError):
        raise ValueError(f"{path}: needs the columns 'Eval Task' and 'Random baseline' (a number)") from None
