"""How busy a sweep kept its trial slots, from its trial runs' start and end times.

A sweep with ``slots`` trials side by side (cores / cpus per trial) over the wall interval [t0, t1] has
``slots (t1 - t0)`` slot-seconds; the trials used ``sum(end - start)`` of them and the rest stood idle: between
stages, while a sampler held a slot back, at the tail when fewer trials than slots remained, and in every
start-up. With one core per trial, idle slot-seconds are idle core-seconds. The trial runs' times are MLflow's
(a run starts when Tune starts its trial, ends when its result is logged), so Ray's per-trial start-up counts as
busy.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Occupancy:
    wall_s: float
    slots: int
    busy_s: float                  # slot-seconds the trials ran
    running_s: dict[int, float]    # wall seconds with k trials running, k = 0, 1, ...

    @property
    def idle_s(self) -> float:
        """Slot-seconds no trial used (negative if more trials than slots overlapped)."""
        return self.slots * self.wall_s - self.busy_s

    def line(self) -> str:
        spans = ", ".join(f"{k} running {s:.0f} s" for k, s in sorted(self.running_s.items()))
        return (f"{self.slots} slots over {self.wall_s:.0f} s: {self.busy_s:.0f} slot-seconds busy, "
                f"{self.idle_s:.0f} idle ({self.idle_s / (self.slots * self.wall_s):.1%}); {spans}")


def occupancy(trials: Iterable[tuple[float, float]], start: float, end: float, slots: int) -> Occupancy:
    """The occupancy of ``slots`` over [start, end] (seconds) by trials given as (start, end) pairs, each
    clipped to the interval."""
    spans = [(max(a, start), min(b, end)) for a, b in trials if min(b, end) > max(a, start)]
    events = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
    running: dict[int, float] = {}
    level, last = 0, start
    for t, change in events:
        running[level] = running.get(level, 0.0) + t - last
        level, last = level + change, t
    running[level] = running.get(level, 0.0) + end - last
    return Occupancy(wall_s=end - start, slots=slots, busy_s=sum(b - a for a, b in spans),
                     running_s={k: s for k, s in running.items() if s > 0})
