"""Which cell of a stage a free slot asks next: the one rule the sweep's searcher follows
(``search/tune/cells.py``) and ``loopscale plan`` replays to price a stage's wall time (``search/plan/walltime.py``),
so the plan prices the order the sweep runs in. Pure: no Ray, no Optuna.

Among the open cells (under their cap; with the law sampler, not yet located), a cell that holds back while
trials run (with the law sampler, its next trial would be a guess that the running trials' results may settle:
``LawSurrogate.holds_back``) leaves the slot to the others, or idle. Of the rest, the slot goes to the cell with

1. the fewest running trials (a second trial proposed before the first has reported is a guess),
2. then one that need not wait for larger cells' warmdown branches (``LawSurrogate.waits``),
3. then the smallest budget (the cheapest: with the law sampler, large budgets are then proposed by a law
   fitted on the small ones),
4. then the fewest trials asked so far,

the first listed of those that tie.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class CellState:
    """What the rule reads of one cell at the moment a slot is free."""

    key: str
    budget: float
    running: int  # its trials running now
    asked: int  # its trials asked so far
    open: bool = True  # it takes another trial
    waits: bool = False  # it should let others go first (law sampler: ``LawSurrogate.waits``)
    holds_back: bool = False  # it leaves a slot idle while trials run (law sampler: ``LawSurrogate.holds_back``)


def priority(cell: CellState) -> tuple[int, bool, float, int]:
    """The order free slots go to cells in (module docstring), smallest first."""
    return cell.running, cell.waits, cell.budget, cell.asked


def next_cell(cells: Sequence[CellState]) -> str | None:
    """The key of the cell the free slot asks, or None when no cell may take it (none open, or every open one
    holds back while trials run)."""
    running = any(c.running for c in cells)
    free = [c for c in cells if c.open and not (running and c.holds_back)]
    return min(free, key=priority).key if free else None
