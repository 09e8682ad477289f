"""Where a sweep stands, from any terminal, while it runs or after it stopped: ``loopscale status NAME``.

Everything is read, nothing taken or written: the sweep's parent run (its start, ``planned_trials``, whether it
finished), its trial runs (stage, cell, status, val_loss, FLOPs spent) and its driver lock, read without taking
it (analysis/unfinished.py finds the lock the same way analyze does). A running sweep's ETA is the time so far
scaled by the trials still missing, ``elapsed * (planned - ended) / ended``: trials of one sweep grow with their
budgets, so it is a pace, not a promise, and the report says so.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field

from mlflow.tracking import MlflowClient

from . import numbers
from .store import (DamagedNumbers, check_store, holder_alive, lock_holder, redact, resolve_tracking_uri,
                    trial_numbers)
from .tracking import _experiment, _runs_of_kind, read_sweep_spec
from .unfinished import sweep_folder


@dataclass
class CellBest:
    """A cell's trials so far and its best run (lowest val_loss of the runs that ended ok)."""

    trials: int = 0
    val_loss: float = float("inf")
    width: float | None = None
    N: float | None = None


@dataclass
class SweepStatus:
    name: str
    state: str                      # "finished", "running", "stopped" or "unknown" (no driver lock found)
    driver: str                     # "pid P on host H", or "" when no lock is found
    elapsed_s: float
    planned: int | None
    ended: dict[str, int]           # trial runs ended per stage
    running: int
    failed: int
    flops_spent: float
    cells: dict[str, CellBest] = field(default_factory=dict)
    damaged: list[str] = field(default_factory=list)  # a line per run set aside: its numbers do not read back

    @property
    def done(self) -> int:
        """Trials of the plan that ended (the validation rungs that follow a sweep are not in its plan)."""
        return sum(n for stage, n in self.ended.items() if stage != "validate")

    @property
    def eta_s(self) -> float | None:
        done = self.done
        if self.state != "running" or not self.planned or not done:
            return None
        return self.elapsed_s * max(0, self.planned - done) / done

    def lines(self) -> list[str]:
        done, rungs = self.done, self.ended.get("validate", 0)
        head = {"finished": "finished", "running": f"running (driver {self.driver})",
                "stopped": "stopped before its last trial: `loopscale search <its spec> --resume` finishes it",
                "unknown": "unfinished, and no driver lock found from here (its driver may run on another machine, "
                           "or stopped: `loopscale search <its spec> --resume` finishes it)"}
        out = [f"sweep {self.name}: {head[self.state]}",
               f"trials: {done} of {self.planned if self.planned else '?'} planned ended ("
               + ", ".join(f"{stage} {n}" for stage, n in sorted(self.ended.items()) if stage != "validate") + ")"
               + (f" and {rungs} validation rungs" if rungs else "")
               + f", {self.running} {'running' if self.state in ('running', 'unknown') else 'cut off'}, "
               f"{self.failed} failed",
               f"FLOPs spent: {numbers.flops(self.flops_spent)}; "
               + ("ran " if self.state != "running" else "running for ") + numbers.duration(self.elapsed_s)]
        out += [f"set aside {line}" for line in self.damaged]
        if self.eta_s is not None:
            out.append(f"ETA: {numbers.duration(self.eta_s)} more at the pace so far (larger budgets run longer)")
        if self.cells:
            out.append(f"  {'cell':<22} {'trials':>6} {'best val_loss':>13} {'width':>6} {'N':>8}")
            for cell, best in sorted(self.cells.items(), key=lambda item: _cell_order(item[0])):
                found = best.width is not None
                out.append(f"  {cell:<22} {best.trials:>6} {numbers.loss(best.val_loss) if found else '-':>13} "
                           f"{int(best.width) if found else '-':>6} {numbers.count(best.N) if found else '-':>8}")
        return out


def _cell_order(cell: str) -> tuple:
    """Cells ``C=1e+12,r=2`` by budget, then r; anything else after them, by name."""
    try:
        parts = dict(part.split("=", 1) for part in cell.split(","))
        return (0, float(parts["C"]), int(parts["r"]), cell)
    except (KeyError, ValueError):
        return (1, 0.0, 0, cell)


def sweep_status(name: str, tracking_uri: str | None) -> SweepStatus:
    """The status of sweep ``name`` in the store at ``tracking_uri`` (one ValueError line when it has none)."""
    uri = resolve_tracking_uri(tracking_uri)
    check_store(uri)
    client = MlflowClient(tracking_uri=uri)
    experiment = _experiment(client, name, uri)
    sweeps = _runs_of_kind(client, experiment.experiment_id, "sweep")
    if not sweeps:
        raise ValueError(f"experiment {name!r} at {redact(uri)} holds no sweep run (runs logged by hand?)")
    parent = sweeps[0]
    trials = _runs_of_kind(client, experiment.experiment_id, "trial")

    finished = parent.info.status == "FINISHED"
    storage = (read_sweep_spec(name, uri) or {}).get("storage")
    folder = sweep_folder(storage, name, uri)
    holder = lock_holder(folder) if folder is not None else None
    alive = not finished and holder is not None and holder_alive(holder)
    state = "finished" if finished else "running" if alive else "stopped" if holder is not None else "unknown"
    driver = f"pid {holder.get('pid')} on host {holder.get('host')}" if holder else ""
    end_ms = parent.info.end_time if finished and parent.info.end_time else time.time() * 1000
    elapsed = max(0.0, (end_ms - parent.info.start_time) / 1000)

    ended: dict[str, int] = defaultdict(int)
    cells: dict[str, CellBest] = defaultdict(CellBest)
    running = failed = 0
    spent = 0.0
    damaged = []
    for run in trials:
        tags = run.data.tags
        if run.info.status == "RUNNING":
            running += 1
            continue
        ended[tags.get("stage", "search")] += 1
        try:
            metrics = trial_numbers(run)
        except DamagedNumbers as exc:  # counted as ended, and named; no FLOPs or best to read from it
            damaged.append(str(exc))
            continue
        spent += metrics.get("flops_spent", 0.0)
        best = cells[tags.get("cell", "")]
        best.trials += 1
        if tags.get("status") != "ok":
            failed += 1
        elif metrics.get("val_loss", float("inf")) < best.val_loss:
            best.val_loss, best.width, best.N = metrics["val_loss"], metrics.get("width"), metrics.get("N")
    planned = parent.data.params.get("planned_trials")
    return SweepStatus(name=name, state=state, driver=driver, elapsed_s=elapsed,
                       planned=int(planned) if planned else None, ended=dict(ended), running=running,
                       failed=failed, flops_spent=spent, cells=dict(cells), damaged=damaged)
