"""``loopscale evaluate EXPERIMENT --r 1,2,4,8``: the kept models of a sweep evaluated at other recurrence counts.

Each trial run that holds a kept model (``[resources] keep_models``, search/tune/keep.py) is reloaded
(``load_model``), rebuilt at each ``r_eval`` (``config.r = r_eval``: the block's trained layers run r_eval times),
evaluated on its trial's validation rows by the trial's own evaluation (``objectives.training.validation_loss``),
and the loss added to its run's numbers (``store.NUMBERS_TAG``) as ``val_loss_r{r_eval}`` (nats per token;
``val_loss_r{r}`` at the trained r reproduces its ``val_loss``). A module with ``loopscale_metrics()`` has those
added too, as ``module.<name>_r{r_eval}``. An architecture that cannot run an r (its weights depend on r, or its
config refuses it) is one line per run and r on stderr, and nothing is logged for that r. Every run's file is
checked to be its own (search/models.py) before any evaluation: one that is not stops the command in one line,
nothing imported or logged; a damaged one (truncated, unreadable) is one line naming its run, which is skipped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from loopscale.analysis.store import eval_column, numbers_tags
from loopscale.objectives.trial import module_metrics

if TYPE_CHECKING:
    from .downstream import ModelScores


def parse_recurrences(text: str) -> list[int]:
    """``"1,2,4"`` -> [1, 2, 4]: whole numbers from 1 to ``kept.MAX_EVAL_R``, each once; a ValueError line for
    anything else."""
    from loopscale.objectives.kept import MAX_EVAL_R

    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        values = []
    if not values or any(not 1 <= v <= MAX_EVAL_R for v in values) or len(set(values)) != len(values):
        raise ValueError(f"--r must list distinct whole recurrence counts from 1 to {MAX_EVAL_R:,}, like 1,2,4,8; "
                         f"got {text!r}")
    return values


@dataclass
class Evaluated:
    """One kept model's evaluation: its run, cell and trained r, the loss at each r it could run, and why not
    at the others; or why its file was ``damaged`` and the run skipped."""

    run_id: str
    name: str
    cell: str
    r: int
    losses: dict[int, float] = field(default_factory=dict)
    refused: dict[int, str] = field(default_factory=dict)
    damaged: str = ""


def kept_runs(experiment: str, tracking_uri: str | None = None) -> tuple[Any, str, list[Any], dict[str, str]]:
    """(client, store URI, the trial runs holding a kept model by cell and name, those whose model file is damaged with
    its one line) of ``experiment``; ValueError in one line, before any evaluation, for an experiment without kept
    models, an architecture that no longer loads or (``models.ForeignModel``) a file that is not its run's own."""
    from mlflow.tracking import MlflowClient

    from loopscale.analysis.store import check_store, iter_runs, resolve_tracking_uri, runs_query
    from loopscale.model.architecture import factory

    from .models import check_files
    from .tracking import KEPT_TAG

    uri = resolve_tracking_uri(tracking_uri)
    check_store(uri)
    client = MlflowClient(uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        raise ValueError(f"no experiment {experiment!r} in the MLflow store")
    kept = [run for run in iter_runs(client, found.experiment_id, runs_query("trial")) if run.data.tags.get(KEPT_TAG)]
    if not kept:
        raise ValueError(f"experiment {experiment!r} holds no kept models: its sweep ran with [resources] keep_models "
                         "= \"none\", or before models were kept")
    for run in kept:  # an architecture that no longer loads here: one line before any evaluation
        name = run.data.params.get("template.architecture")
        if name:
            factory(name)
    kept.sort(key=lambda run: (run.data.tags.get("cell", ""), run.info.run_name or ""))
    return client, uri, kept, check_files(client, kept)


def labels(run) -> tuple[str, str, int]:
    """A kept run's name, cell and recorded trained r (0 where the run records none), for its table row."""
    r = run.data.params.get("r", "")
    return run.info.run_name or run.info.run_id, run.data.tags.get("cell", ""), int(r) if r.isdigit() else 0


def evaluate_kept(experiment: str, recurrences: list[int], tracking_uri: str | None = None,
                  device: str = "cpu", threads: int = 0) -> list[Evaluated]:
    """Evaluate every kept model of ``experiment`` at each of ``recurrences`` and add the losses to its run's
    numbers (module docstring), with ``threads`` torch threads (0: torch's default); ValueError in one line, before any
    evaluation, for an experiment without kept models, an architecture that no longer loads or a file that is not
    its run's own (``kept_runs``)."""
    import torch
    from mlflow.entities import RunTag

    from loopscale.objectives.training import validation_loss

    from .models import load_model

    client, uri, kept, damaged = kept_runs(experiment, tracking_uri)
    if threads:
        torch.set_num_threads(threads)
    done = []
    for run in kept:
        name, cell, recorded_r = labels(run)
        if run.info.run_id in damaged:
            done.append(Evaluated(run.info.run_id, name, cell, recorded_r, damaged=damaged[run.info.run_id]))
            continue
        model = load_model(run, uri)
        entry = Evaluated(run.info.run_id, name, cell, model.trial.r)
        metrics: dict[str, float] = {}
        for r in recurrences:
            try:
                module = model.at(r)
            except ValueError as exc:
                entry.refused[r] = str(exc)
                continue
            entry.losses[r] = validation_loss(module, model.trial, device)
            metrics[eval_column(r)] = entry.losses[r]
            metrics.update({f"{key}_r{r}": value for key, value in module_metrics(module).items()})
        client.log_batch(run.info.run_id, tags=[RunTag(k, v) for k, v in numbers_tags(metrics, run).items()])
        done.append(entry)
    return done


def render(evaluated: list[Evaluated], recurrences: list[int]) -> list[str]:
    """One line per kept model: its run, trained r, and the loss at each r_eval ("-" where it could not run)."""
    head = f"{'run':<32} {'cell':<18} {'r':>3} " + " ".join(f"{eval_column(r):>12}" for r in recurrences)
    lines = [head]
    for e in evaluated:
        cells = [f"{e.losses[r]:>12.4f}" if r in e.losses else f"{'-':>12}" for r in recurrences]
        lines.append(f"{e.name[:32]:<32} {e.cell[:18]:<18} {e.r:>3} " + " ".join(cells))
    return lines


def refusals(evaluated: list[Evaluated] | list[ModelScores]) -> list[str]:
    """The one line of each (run, r) that could not be evaluated (or scored, ``downstream.ModelScores``), and of
    each run skipped for its damaged file."""
    lines = []
    for e in evaluated:
        lines += [f"{e.name}: skipped: {e.damaged}"] if e.damaged else []
        lines += [f"{e.name}: {reason}" for reason in e.refused.values()]
    return lines
