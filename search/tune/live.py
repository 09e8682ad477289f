"""What the driver's Tune callbacks and searcher reach by name rather than by reference, for the sweep this
process drives: on ``--resume`` Tune restores the callbacks and the searcher from their own pickles
(``Tuner.restore`` takes no new callbacks), so a reference the driver handed them would point at a copy."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..stopping import StopRequest

if TYPE_CHECKING:
    from .cells import CellTrials

# What the driver is asked to stop for (a signal, a failing store or disk); ``run_search`` resets it per sweep.
STOP = StopRequest()
# The cells at work in this driver, by stage: the progress lines ask them which cells are finished (the
# searcher and the progress callback come back from separate pickles, so they cannot hold each other).
SEARCHERS: dict[str, "CellTrials"] = {}
