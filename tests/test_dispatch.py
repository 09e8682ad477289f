"""The dispatch rule (search/dispatch.py) on its own, and that ``loopscale plan``'s replay of a stage
(plan.walltime.replay) and the sweep's searcher (tune.cells.CellTrials, driven as Tune drives it, without Ray)
ask the cells in the same order."""

from __future__ import annotations

import heapq

from loopscale.objectives import TrialConfig, simulate
from loopscale.search import SweepSpec
from loopscale.search.dispatch import CellState, next_cell
from loopscale.search.plan.walltime import replay
from loopscale.search.tune.cells import FINISHED, CellTrials
from loopscale.search.tune.studies import make_studies


def test_fewest_running_first_then_not_waiting_then_smallest_budget_then_fewest_asked():
    cheap, dear = CellState("a", 1e12, running=1, asked=1), CellState("b", 1e13, running=0, asked=3)
    assert next_cell([cheap, dear]) == "b"  # fewer running beats a smaller budget
    assert next_cell([CellState("a", 1e12, 0, 1, waits=True), CellState("b", 1e13, 0, 3)]) == "b"
    assert next_cell([CellState("a", 1e13, 0, 1), CellState("b", 1e12, 0, 3)]) == "b"  # the smaller budget
    assert next_cell([CellState("a", 1e12, 0, 2), CellState("b", 1e12, 0, 1)]) == "b"  # the fewer asked
    assert next_cell([CellState("a", 1e12, 0, 1), CellState("b", 1e12, 0, 1)]) == "a"  # a tie: the first listed


def test_closed_cells_and_cells_holding_back_while_trials_run_take_no_slot():
    closed = CellState("a", 1e12, 0, 3, open=False)
    assert next_cell([closed, CellState("b", 1e13, 0, 0)]) == "b"
    assert next_cell([closed]) is None
    holding = CellState("b", 1e12, 0, 1, holds_back=True)
    assert next_cell([holding, CellState("c", 1e13, 0, 0)]) == "b"  # nothing runs: holding back means nothing
    assert next_cell([holding, CellState("c", 1e13, 1, 1)]) == "c"
    assert next_cell([holding, CellState("c", 1e13, 1, 1, open=False)]) is None  # a slot left idle


def seconds(cell, n: int) -> float:
    """A trial's made-up length: longer at a larger budget, every other trial of a cell twice as long."""
    return cell.budget / 1e12 * (1 + n % 2)


def searcher_order(spec: SweepSpec, slots: int) -> list[str]:
    """The cells the searcher asks, in order, when each trial lasts ``seconds`` and ``slots`` run at once: the
    replay's events (a slot frees when its trial ends; trials ending at once in cell-key order)."""
    cells = {c.key: c for c in spec.cells()}
    searcher = CellTrials(make_studies(spec, "search", None))
    asked, running, now = [], [], 0.0  # running: a heap of (end, cell key, trial id, config)
    while True:
        if len(running) < slots:
            config = searcher.suggest(f"t{len(asked)}")
            if config not in (None, FINISHED):
                key = config["meta"]["cell"]
                n = sum(k == key for k in asked)
                heapq.heappush(running, (now + seconds(cells[key], n), key, f"t{len(asked)}", config))
                asked.append(key)
                continue
        if not running:
            return asked
        now, _, trial_id, config = heapq.heappop(running)
        searcher.on_trial_complete(trial_id, simulate(TrialConfig.from_params(config["trial"])))


def test_plan_replays_the_order_the_searcher_asks_the_cells_in(tmp_path):
    spec = SweepSpec.from_toml("smoke", ['sampler="random"', "resources.max_concurrent=4"],
                               tracking_uri=f"sqlite:///{tmp_path}/unused.db")
    cells = spec.cells()
    planned = [key for _, _, key in replay(cells, 4, seconds)]
    assert len(planned) == sum(c.n_trials for c in cells)
    assert planned != sorted(planned, key=lambda k: next(c.budget for c in cells if c.key == k))  # not trivial
    assert searcher_order(spec, 4) == planned


def test_in_rounds_the_plan_replays_slots_that_wait_for_their_rounds_slowest_trial(tmp_path):
    spec = SweepSpec.from_toml("smoke", ['sampler="random"', "resources.max_concurrent=4"],
                               tracking_uri=f"sqlite:///{tmp_path}/unused.db")
    cells = spec.cells()
    free, rounds = replay(cells, 4, seconds), replay(cells, 4, seconds, rounds=True)
    starts = sorted({start for start, _, _ in rounds})
    assert [sum(start == s for s, _, _ in rounds) for start in starts[:-1]] == [4] * (len(starts) - 1)
    for start in starts[1:]:  # a round starts when every trial before it has ended
        assert start == max(end for s, end, _ in rounds if s < start)
    assert max(end for _, end, _ in rounds) > max(end for _, end, _ in free)
