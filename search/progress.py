"""Readable progress of a running stage: one line per finished trial, a table per cell at the end.

ETA = (wall time so far / trials finished in this session) x trials left, so it already reflects how many
trials run side by side and what each costs on this machine. Trials left are each open cell's cap less its
finished trials; a cell the sampler has finished (the law sampler stops a cell once its optimum is located)
plans no more, so with the law sampler the ETA is an upper bound that falls as cells finish ("ETA <=").
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any


@dataclass
class CellProgress:
    planned: int
    done: int = 0
    finished: bool = False  # the sampler stopped the cell: planned is what it ran
    failed: int = 0
    diverged: int = 0
    best_loss: float = math.inf
    best_at: float | None = None  # the searched value (s, or the learning rate) of the best trial
    best_width: int | None = None
    flops: float = 0.0  # FLOPs its trials spent


class Progress:
    """Counts per cell; ``record`` returns the line to print, ``table`` the per-cell summary. ``searched`` names
    what the stage searches over (``s``, or the calibrated recipe key); each trial reports its value."""

    def __init__(self, stage: str, cells: dict[str, int], searched: str = "s"):
        self.stage, self.searched = stage, searched
        self.cells = {key: CellProgress(planned=n) for key, n in cells.items()}
        self.started = time.monotonic()
        self.finished_here = 0  # finished in this session (ETA), as opposed to restored from a crash

    def __setstate__(self, state: dict[str, Any]) -> None:
        # Tune unpickles the progress when a sweep resumes: the ETA's clock is this session's, not the first's
        self.__dict__.update(state, started=time.monotonic(), finished_here=0)

    @property
    def planned(self) -> int:
        return sum(c.done if c.finished else c.planned for c in self.cells.values())

    def finish(self, cells: set[str]) -> None:
        """The sampler takes no more trials in ``cells`` (they may have stopped before their cap)."""
        for key in cells:
            if key in self.cells:
                self.cells[key].finished = True

    @property
    def done(self) -> int:
        return sum(c.done for c in self.cells.values())

    def restore(self, cell: str, result: dict[str, Any] | None, value: float) -> None:
        """A trial that finished before a resume: counted, but not part of this session's ETA."""
        self._count(cell, result, value)

    def record(self, cell: str, result: dict[str, Any] | None, value: float) -> str:
        """A trial at ``searched`` = ``value`` finished now (``result`` None when it failed); its progress line."""
        self._count(cell, result, value)
        self.finished_here += 1
        c = self.cells[cell]
        status = "failed" if result is None else str(result.get("status", "ok"))
        key = self.searched
        what = f"{key}={value:.3g} " + (f"val_loss {result['val_loss']:.4f}" if status == "ok" else status)
        best = f"best {c.best_loss:.4f} at {key}={c.best_at:.3g}" if c.best_at is not None else "no best yet"
        bound = "<= " if any(not x.finished and x.done < x.planned for x in self.cells.values()) and \
            any(x.finished for x in self.cells.values()) else ""
        return (f"[{self.stage} {self.done:>{len(str(self.planned))}}/{self.planned}] {cell:<18} "
                f"{c.done}/{c.done if c.finished else c.planned}  {what:<28} {best:<26} FLOPs {c.flops:.2g} cell, {self.flops:.2g} total  "
                f"ETA {bound}{self.eta()}")

    @property
    def flops(self) -> float:
        return sum(c.flops for c in self.cells.values())

    def eta(self) -> str:
        left = self.planned - self.done
        if left <= 0:
            return "0:00:00"
        if self.finished_here == 0:
            return "?"
        seconds = (time.monotonic() - self.started) / self.finished_here * left
        return _clock(seconds)

    def table(self) -> str:
        rows = [f"{'cell':<18} {'trials':>7} {'failed':>6} {'diverged':>8} {'best val_loss':>13} "
                f"{self.searched:>8} {'width':>6} {'FLOPs':>8}"]
        for key, c in self.cells.items():
            loss, at = (f"{c.best_loss:.4f}", f"{c.best_at:.3g}") if c.best_at is not None else ("-", "-")
            rows.append(f"{key:<18} {f'{c.done}/{c.done if c.finished else c.planned}':>7} {c.failed:>6} {c.diverged:>8} {loss:>13} {at:>8} "
                        f"{c.best_width if c.best_width is not None else '-':>6} {c.flops:>8.2g}")
        rows.append(f"{self.stage}: {self.done}/{self.planned} trials, {self.flops:.3g} FLOPs, in "
                    f"{_clock(time.monotonic() - self.started)}")
        return "\n".join(rows)

    def _count(self, cell: str, result: dict[str, Any] | None, value: float) -> None:
        c = self.cells[cell]
        c.done += 1
        if result is not None and _number(result.get("flops_spent")):
            c.flops += float(result["flops_spent"])
        if result is None:
            c.failed += 1
        elif result.get("status", "ok") != "ok":
            c.diverged += 1
        elif result["val_loss"] < c.best_loss:
            c.best_loss, c.best_at, c.best_width = result["val_loss"], value, result.get("width")


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"
