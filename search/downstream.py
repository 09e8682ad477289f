"""``loopscale evaluate EXPERIMENT --tasks SPEC [--r ...]``: the kept models of a sweep scored on downstream tasks.

SPEC is the built-in probes (``probes``, or ``probes:SEED`` for another seed's; objectives/tasks/probes.py) or a
bundle YAML read unchanged (objectives/tasks/bundle.py). Every kept model is scored at its trained r and at each
r of ``--r``, on every task (objectives/tasks/scoring.py), with its own tokenizer; its run's numbers get, per
task and r, ``task.<label>_r<k>`` and ``task.<label>_n``, and per axis (a task's group) ``axis.<axis>_r<k>``,
its standard error ``axis.<axis>_r<k>_se`` and its chance score ``axis.<axis>_chance``
(analysis/downstream/columns.py). The table prints each axis' score with its interval over items; ``loopscale
analyze`` then fits them against compute and loss (analysis/downstream/). An r the architecture cannot run is
one line per run and r on stderr, as ``evaluate --r`` says it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from loopscale.analysis.downstream.accuracy import axis_score, normal_interval, wilson
from loopscale.analysis.downstream.columns import axis_chance, axis_column, axis_se, task_column, task_items
from loopscale.analysis.store import numbers_tags
from loopscale.objectives.tasks.bundle import Task, load_bundle
from loopscale.objectives.tasks.probes import BUILT_IN, probe_tasks


def load_tasks(spec: str) -> list[Task]:
    """The tasks ``--tasks`` names (module docstring); ValueError in one line for anything else."""
    name, _, seed = spec.partition(":")
    if name == BUILT_IN:
        if seed and not seed.isdigit():
            raise ValueError(f"--tasks {spec!r}: the probes' seed must be a whole number, like probes:1")
        return probe_tasks(int(seed or 0))
    return load_bundle(spec)


@dataclass
class ModelScores:
    """One kept model's scores: per r, each task's (correct, items) and each axis' (score, se); why not at an r."""

    run_id: str
    name: str
    cell: str
    r: int
    tasks: dict[int, dict[str, tuple[int, int]]] = field(default_factory=dict)
    axes: dict[int, dict[str, tuple[float, float]]] = field(default_factory=dict)
    refused: dict[int, str] = field(default_factory=dict)
    damaged: str = ""  # why its model file was skipped (evaluate.kept_runs), else ''


def axis_numbers(tasks: list[Task], correct: dict[str, tuple[int, int]], r: int) -> tuple[dict, dict[str, tuple]]:
    """The numbers of one model at ``r`` (module docstring) and its axes' (score, se)."""
    numbers: dict[str, float] = {}
    axes: dict[str, tuple[float, float]] = {}
    for task in tasks:
        k, n = correct[task.label]
        numbers[task_column(task.label, r)], numbers[task_items(task.label)] = k / n, n
    for axis in sorted({t.axis for t in tasks}):
        mine = [t for t in tasks if t.axis == axis]
        score, se = axis_score([correct[t.label][0] for t in mine], [correct[t.label][1] for t in mine])
        axes[axis] = (score, se)
        numbers[axis_column(axis, r)], numbers[axis_se(axis, r)] = score, se
        numbers[axis_chance(axis)] = sum(t.baseline for t in mine) / len(mine)
    return numbers, axes


def evaluate_tasks(experiment: str, spec: str, recurrences: list[int], tracking_uri: str | None = None,
                   device: str = "cpu", threads: int = 0) -> tuple[list[Task], list[ModelScores]]:
    """Score every kept model of ``experiment`` on the tasks of ``spec`` at its trained r and each of
    ``recurrences``, and add the numbers to its run (module docstring)."""
    import torch
    from mlflow.entities import RunTag

    from loopscale.model import runtime
    from loopscale.objectives.tasks.scoring import score_task
    from loopscale.objectives.tasks.tokens import trial_codec

    from .evaluate import kept_runs, labels
    from .models import load_model

    tasks = load_tasks(spec)
    client, uri, kept, damaged = kept_runs(experiment, tracking_uri)
    if threads:
        torch.set_num_threads(threads)
    target = runtime.pick_device(device)
    done = []
    for run in kept:
        name, cell, recorded_r = labels(run)
        if run.info.run_id in damaged:
            done.append(ModelScores(run.info.run_id, name, cell, recorded_r, damaged=damaged[run.info.run_id]))
            continue
        model = load_model(run, uri)
        codec = trial_codec(model.trial)  # a sweep's models share their data: the first one refuses
        entry = ModelScores(run.info.run_id, name, cell, model.trial.r)
        numbers: dict[str, float] = {}
        for r in dict.fromkeys([model.trial.r, *recurrences]):
            try:
                module = model.at(r).to(target)
            except ValueError as exc:
                entry.refused[r] = str(exc)
                continue
            correct = {}
            for task in tasks:
                marks = score_task(module, task, codec.encode, codec.separator, model.config.seq_len, target)
                correct[task.label] = (sum(marks), len(marks))
            values, entry.axes[r] = axis_numbers(tasks, correct, r)
            entry.tasks[r] = correct
            numbers.update(values)
        client.log_batch(run.info.run_id, tags=[RunTag(k, v) for k, v in numbers_tags(numbers, run).items()])
        done.append(entry)
    return tasks, done


def render(tasks: list[Task], scored: list[ModelScores], confidence: float = 0.95) -> list[str]:
    """Two tables: each model's axis scores at each r with their interval over items, then each task's accuracy
    with its Wilson interval."""
    axes = sorted({t.axis for t in tasks})
    pct = f"{100 * confidence:.0f}%"
    lines = [f"axis scores (mean task accuracy, {pct} interval over items):",
             f"{'run':<28} {'r':>2} {'r_eval':>6} " + " ".join(f"{a[:22]:>22}" for a in axes)]
    for s in scored:
        for r, values in s.axes.items():
            cells = []
            for axis in axes:
                score, se = values[axis]
                lo, hi = normal_interval(score, se, confidence)
                cells.append(f"{score:.3f} [{max(lo, 0):.2f},{min(hi, 1):.2f}]".rjust(22))
            lines.append(f"{s.name[:28]:<28} {s.r:>2} {r:>6} " + " ".join(cells))
    lines += ["", f"task accuracy ({pct} Wilson interval; the task's chance after its label):",
              f"{'task':<28} {'run':<28} {'r_eval':>6} {'acc':>6} {'interval':>15}"]
    for task in tasks:
        for s in scored:
            for r, correct in s.tasks.items():
                k, n = correct[task.label]
                lo, hi = wilson(k, n, confidence)
                label = f"{task.label} ({task.baseline:.2f})"
                lines.append(f"{label[:28]:<28} {s.name[:28]:<28} {r:>6} {k / n:>6.3f} {f'[{lo:.3f}, {hi:.3f}]':>15}")
    return lines

