"""The law sampler (search/law_sampler.py) driven as Tune drives it (``CellTrials.suggest`` and
``on_trial_complete``, which the Tune searcher calls), without Ray: seeded and deterministic, restorable from
its pickle, bracketing beyond an edge, stopping at the tolerance, cheap cells first; warmdown branches into
smaller open cells, their points counted there; and analysis flagging a cell whose best run is the edge of its
widths."""

from __future__ import annotations

import dataclasses
import math
import pickle
from types import SimpleNamespace

import optuna
import pandas as pd
import pytest

from loopscale.analysis import cell_optima, fit_joint_law
from loopscale.analysis.identify import likely_fixes
from loopscale.analysis.runs import expand_branches
from loopscale.model import PAPER_LAW
from loopscale.objectives import TrialConfig, simulate
from loopscale.search import SweepSpec
from loopscale.search.law_sampler import CellGeometry, LawSurrogate, fewest_trials
from loopscale.search.space import cell_key
from loopscale.search.tune.cells import FINISHED, CellTrials
from loopscale.search.tune.studies import make_studies

BUDGETS = [4.64e17, 1e18, 2.15e18]


@pytest.fixture(scope="module")
def spec(tmp_path_factory) -> SweepSpec:
    """The paper preset replayed (law sampler, shipped noise) on the paper's three cheapest budgets: 12 cells,
    without warmdown branches (``branched`` has them, as the preset ships)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    uri = f"sqlite:///{tmp_path_factory.mktemp('law')}/unused.db"
    paper = SweepSpec.from_toml("paper", objective="simulate", tracking_uri=uri)
    assert paper.sampling.sampler == "law" and paper.sampling.branches
    return dataclasses.replace(paper, grid=dataclasses.replace(paper.grid, budgets=tuple(BUDGETS)),
                               sampling=dataclasses.replace(paper.sampling, branches=False))


@pytest.fixture(scope="module")
def branched(spec) -> SweepSpec:
    return dataclasses.replace(spec, sampling=dataclasses.replace(spec.sampling, branches=True))


def drive(searcher: CellTrials, steps: int | None = None) -> list[tuple[str, float]]:
    """One trial at a time: suggest, simulate, complete. Returns the (cell, s) of each trial."""
    trials = []
    while steps is None or len(trials) < steps:
        config = searcher.suggest(f"t{len(trials)}")
        if config is None or config == FINISHED:
            break
        searcher.on_trial_complete(f"t{len(trials)}", simulate(TrialConfig.from_params(config["trial"])))
        trials.append((config["meta"]["cell"], config["trial"]["s"], tuple(config["trial"].get("branch_budgets", []))))
    return trials


def test_same_seed_same_results_same_proposals_and_a_restored_searcher_continues_alike(spec):
    first = drive(CellTrials(make_studies(spec, "search", None)))
    again = drive(CellTrials(make_studies(spec, "search", None)))
    assert first == again
    cap = sum(c.n_trials for c in spec.cells())
    assert 3 * len(spec.cells()) <= len(first) < cap  # cells stop early, none with fewer than 3 widths
    per_cell = {}
    for cell, s, _ in first:
        per_cell.setdefault(cell, []).append(s)
    assert all(len(set(widths)) == len(widths) for widths in per_cell.values())  # never a width twice
    # cheaper cells first: one trial at a time, a cell is closed for good before a dearer one starts
    assert not any(branches for _, _, branches in first)
    budgets = [next(c.budget for c in spec.cells() if c.key == cell) for cell, _, _ in first]
    assert budgets == sorted(budgets)

    # pickled half-way (as Tune saves the searcher) and restored: the same surrogate goes on the same way
    searcher = CellTrials(make_studies(spec, "search", None))
    head = drive(searcher, steps=len(first) // 2)
    restored = pickle.loads(pickle.dumps(searcher))
    surrogate = next(iter(restored._studies.values())).surrogate
    assert surrogate.theta is not None and surrogate.fits > 0  # the law had been fitted before the save
    assert all(s.surrogate is surrogate for s in restored._studies.values())  # still ONE surrogate for all cells
    assert head + drive(restored) == first


def geometry(spec: SweepSpec, budget: float, r: int) -> CellGeometry:
    return CellGeometry.of(spec, next(c for c in spec.cells() if c.budget == budget and c.r == r))


def clean_loss(spec: SweepSpec, g: CellGeometry, heads: int) -> float:
    i = g.index(heads)
    return PAPER_LAW.loss(g.n_once[i], g.n_rec[i], g.r, g.tokens[i])


def test_a_best_width_on_the_edge_of_the_tried_ones_gets_its_next_trial_beyond_that_edge(spec):
    g = geometry(spec, 2.15e18, 4)
    surrogate = LawSurrogate([g], seed=0, tolerance=0.1)
    low, mid = g.heads[0], g.heads[2]
    surrogate.add(g.key, low, 2.70)
    surrogate.add(g.key, mid, 2.69)  # the best so far is the widest tried
    assert surrogate.status(g.key) == "open"
    assert surrogate.propose(g.key, set()) > mid
    surrogate = LawSurrogate([g], seed=0, tolerance=0.1)
    surrogate.add(g.key, mid, 2.70)
    surrogate.add(g.key, g.heads[-1], 2.71)  # now the narrowest tried is best
    assert surrogate.propose(g.key, set()) < mid
    # a running trial counts as tried: it brackets that side, and the next proposal does not repeat it
    below = surrogate.propose(g.key, set())
    assert surrogate.propose(g.key, {below}) not in (below, mid, g.heads[-1])


def test_a_cell_stops_once_its_optimum_is_located_to_the_tolerance(spec):
    g = geometry(spec, 2.15e18, 4)
    best = min(g.heads, key=lambda h: clean_loss(spec, g, h))
    i = g.index(best)
    bracket = [g.heads[i - 2], best, g.heads[i + 2]]
    loose, strict = (LawSurrogate([g], seed=0, tolerance=t) for t in (0.1, 1e-4))
    for surrogate in (loose, strict):
        for h in bracket:
            surrogate.add(g.key, h, clean_loss(spec, g, h))
    assert loose.status(g.key) == "located"
    assert strict.status(g.key) == "open"  # bracketed and interior, but not yet located that precisely
    assert strict.propose(g.key, set()) in (g.heads[i - 1], g.heads[i + 1])  # inside the bracket, by the vertex


def test_a_best_run_at_the_edge_of_the_cell_is_bound_limited_once_its_neighbour_is_tried(spec):
    g = geometry(spec, 2.15e18, 4)
    surrogate = LawSurrogate([g], seed=0, tolerance=0.1)
    for h, loss in ((g.heads[-1], 2.60), (g.heads[-3], 2.70)):
        surrogate.add(g.key, h, loss)
    assert surrogate.propose(g.key, set()) == g.heads[-2]  # the edge's neighbour decides
    surrogate.add(g.key, g.heads[-2], 2.65)
    assert surrogate.status(g.key) == "edge"


def test_the_shipped_noise_is_correlated_within_cells_and_repeatable(spec):
    cell = spec.cells()[0]
    a = [simulate(spec.trial_config(cell, s))["val_loss"] for s in cell.widths]
    assert a == [simulate(spec.trial_config(cell, s))["val_loss"] for s in cell.widths]
    g = CellGeometry.of(spec, cell)
    # without the per-trial noise, what is left is shared by a cell and smooth in width: neighbours deviate alike
    quiet = dataclasses.replace(spec, simulation=dataclasses.replace(spec.simulation, noise=0.0))
    steps, sizes = [], []
    for c in spec.cells():
        geo = CellGeometry.of(spec, c)
        deviation = [simulate(quiet.trial_config(c, s))["val_loss"] - clean_loss(spec, geo, h)
                     for s, h in zip(c.widths, geo.heads)]
        steps += [abs(a - b) for a, b in zip(deviation, deviation[1:])]
        sizes += [abs(d) for d in deviation]
    assert sum(steps) / len(steps) < 0.5 * sum(sizes) / len(sizes)
    zero = dataclasses.replace(spec, simulation=dataclasses.replace(spec.simulation, noise=0.0, cell_noise=0.0,
                                                                    misspec=0.0))
    assert [simulate(zero.trial_config(cell, s))["val_loss"] for s in cell.widths] == pytest.approx(
        [clean_loss(spec, g, h) for h in g.heads])


def test_analysis_flags_a_cell_whose_best_run_is_the_edge_of_its_widths_as_bound_limited(spec):
    cell = spec.cells()[0]
    g = CellGeometry.of(spec, cell)
    rows = [{**simulate(spec.trial_config(cell, s)), "val_loss": 3.0 - 0.01 * i, "stage": "search",
             "cell_widths": f"{cell.widths[0]:g}-{cell.widths[-1]:g}"} for i, s in enumerate(cell.widths[-3:])]
    table = cell_optima(pd.DataFrame(rows), n_bootstrap=0).table  # the loss falls to the widest width
    assert list(table["status"]) == ["bound_limited"]
    assert f"best run at s={cell.widths[-1]:g}, the widest width" in table["reason"][0]
    assert table["reason"][0].endswith("raise [widths] s_max (or lower the low end of tokens_per_param)")
    assert g.heads[-1] == round(cell.widths[-1] * spec.grid.width_unit / spec.grid.head_dim)
    unrecorded = cell_optima(pd.DataFrame(rows).drop(columns="cell_widths"), n_bootstrap=0).table
    assert list(unrecorded["status"]) == ["no_interior_minimum"]  # without the range, no claim about bounds


def test_a_cell_best_at_its_narrowest_width_names_what_moves_that_edge(spec):
    """One head wide, only a smaller head makes a narrower model (more trials cannot); wider, a lower s_min."""
    cell = spec.cells()[0]
    rows = pd.DataFrame([{**simulate(spec.trial_config(cell, s)), "val_loss": 3.0 + 0.01 * i, "stage": "search",
                          "cell_widths": f"{cell.widths[0]:g}-{cell.widths[-1]:g}"}
                         for i, s in enumerate(cell.widths[:3])])  # the loss rises from the narrowest width
    narrowest = rows["width"][0]
    for head_dim, fix in ((narrowest, f"width {narrowest:g} is one head, the narrowest model the template builds: "
                                      "a smaller [template] head_dim and width_unit, not more trials"),
                          (narrowest / 2, "lower [widths] s_min (or raise the high end of tokens_per_param)")):
        table = cell_optima(rows.assign(**{"template.head_dim": head_dim}), n_bootstrap=0).table
        assert list(table["status"]) == ["bound_limited"]
        assert table["reason"][0].startswith(f"best run at s={cell.widths[0]:g}, the narrowest width")
        assert table["reason"][0].endswith(fix)
        assert likely_fixes(table) == [f"r={cell.r} C={cell.budget:.3g}: {table['reason'][0]}"]


def test_a_trial_branches_into_a_smaller_open_cell_whose_optimum_its_width_is_near(branched):
    small, large = geometry(branched, 1e18, 2), geometry(branched, 2.15e18, 2)
    surrogate = LawSurrogate([small, large], seed=0, tolerance=0.1, branches=True)
    shared = sorted(set(small.heads) & set(large.heads))
    near = min(shared, key=lambda h: abs(h - small.first_guess))
    far = max(shared)
    assert surrogate.branches_for(large.key, near, {}) == [(small.key, small.budget)]
    assert surrogate.branches_for(small.key, near, {}) == []  # never into a larger (or its own) budget
    assert surrogate.branches_for(large.key, near, {small.key: {near}}) == []  # a width the cell's own trial holds
    if abs(math.log(far / small.first_guess)) > 0.5 + 1e-9:  # BRANCH_REACH
        assert surrogate.branches_for(large.key, far, {}) == []
    # announced, the point is as good as a running trial of the small cell: its first proposal goes elsewhere
    surrogate.expect(small.key, near)
    assert surrogate.branches_for(large.key, near, {}) == []
    assert surrogate.propose(small.key, set()) != near
    # it arrives with the large trial's result and counts as a result of the small cell; the larger cell
    # being open, the small one now waits for more of its branches
    surrogate.add(large.key, near, 2.9, ((small.key, near, 3.0),))
    assert surrogate.results[small.key] == {near: 3.0} and surrogate.results[large.key] == {near: 2.9}
    assert surrogate.incoming[small.key] == {}
    assert surrogate.waits(small.key) and not surrogate.waits(large.key)
    plain = LawSurrogate([small, large], seed=0, tolerance=0.1)
    assert plain.branches_for(large.key, near, {}) == [] and not plain.waits(small.key)


def test_a_trial_branches_into_every_smaller_open_cell_of_its_r_whose_optimum_its_width_is_near(branched):
    cells = [geometry(branched, b, 2) for b in BUDGETS]
    surrogate = LawSurrogate(cells, seed=0, tolerance=0.1, branches=True)
    smallest, middle, largest = cells

    def near(g: CellGeometry, heads: int) -> bool:  # BRANCH_REACH of the cell's first guess (nothing fitted yet)
        return abs(math.log(heads / g.first_guess)) <= 0.5 + 1e-9

    shared = sorted(set(smallest.heads) & set(middle.heads) & set(largest.heads))
    reached = set()
    for heads in shared:
        into = {k for k, _ in surrogate.branches_for(largest.key, heads, {})}
        assert into == {g.key for g in (smallest, middle) if near(g, heads)}
        reached |= into
    assert reached == {smallest.key, middle.key}  # two budgets down too
    surrogate.add(smallest.key, smallest.first_guess, 3.0)
    surrogate.add(smallest.key, smallest.heads[-1], 3.1)
    surrogate.add(smallest.key, smallest.heads[0], 3.1)  # bracketed, and noise-free: located, no longer open
    assert surrogate.status(smallest.key) != "open"
    assert all(smallest.key not in {k for k, _ in surrogate.branches_for(largest.key, h, {})} for h in shared)


def test_the_cell_just_below_each_rs_largest_waits_for_its_branches_before_its_first_trial(branched):
    cells = [geometry(branched, b, r) for r in (1, 2) for b in BUDGETS]
    surrogate = LawSurrogate(cells, seed=0, tolerance=0.1, branches=True)
    budget = {g.key: g.budget for g in cells}
    assert {k for k in budget if surrogate.waits(k)} == {k for k, b in budget.items() if b == BUDGETS[1]}
    assert fewest_trials(cells, branches=True) == {k: {BUDGETS[0]: 1, BUDGETS[1]: 0, BUDGETS[2]: 3}[b]
                                                   for k, b in budget.items()}
    # without a cheaper cell the law would have nothing to be fitted on first: the cell takes its trial at once
    two = [g for g in cells if g.budget != BUDGETS[0]]
    assert not any(LawSurrogate(two, seed=0, tolerance=0.1, branches=True).waits(g.key) for g in two)
    assert set(fewest_trials(two, branches=True).values()) == {1, 3}
    # driven as Tune drives it, one slot: each r's middle cell takes no trial of its own before its largest
    # cell has stopped, and it gets the largest cell's branches
    searcher = CellTrials(make_studies(branched, "search", None))
    trials = drive(searcher)
    surrogate = next(iter(searcher._studies.values())).surrogate
    for r in branched.grid.recurrences:
        mine = [n for n, (cell, _, _) in enumerate(trials) if cell == cell_key(BUDGETS[1], r)]
        top = [n for n, (cell, _, _) in enumerate(trials) if cell == cell_key(BUDGETS[2], r)]
        assert not mine or min(mine) > max(top)
        assert any(BUDGETS[1] in branches for cell, _, branches in trials if cell == cell_key(BUDGETS[2], r))
        assert len(surrogate.results[cell_key(BUDGETS[1], r)]) >= 3


def test_deferred_budgets_leave_each_rs_cheapest_cell_its_first_trial():
    """``deferred_budgets`` cells below each r's largest take no trial of their own, but never the cheapest: the
    law is fitted on it first."""
    budgets = (1e17, 1e18, 1e19, 1e20, 1e21)
    cells = [SimpleNamespace(key=f"{b:g}/{r}", budget=b, r=r) for r in (1, 2) for b in budgets]

    def by_budget(deferred: int) -> list[int]:
        fewest = fewest_trials(cells, branches=True, deferred=deferred)
        assert fewest == {c.key: fewest[f"{c.budget:g}/1"] for c in cells}  # the same for every r
        return [fewest[f"{b:g}/1"] for b in budgets]

    assert by_budget(0) == [1, 1, 1, 1, 3]
    assert by_budget(1) == [1, 1, 1, 0, 3]
    assert by_budget(3) == by_budget(9) == [1, 0, 0, 0, 3]
    assert fewest_trials(cells, branches=False, deferred=3) == {c.key: 3 for c in cells}


def test_a_cell_leaves_a_free_slot_to_others_while_its_running_trials_may_settle_it(spec):
    small, large = geometry(spec, BUDGETS[0], 2), geometry(spec, BUDGETS[1], 2)
    surrogate = LawSurrogate([small, large], seed=0, tolerance=0.1)
    below, mid, above = small.heads[0], small.heads[2], small.heads[4]
    assert not surrogate.holds_back(small.key, set())  # nothing of it runs: a first trial
    assert not surrogate.holds_back(small.key, {mid})  # one running: its sides are still open
    assert not surrogate.holds_back(small.key, {mid, below})
    assert surrogate.holds_back(small.key, {mid, below, above})  # bracketed by what runs: a 4th is a guess
    # a larger cell takes no first trial while a cheaper cell of its r has none of its results yet
    assert surrogate.holds_back(large.key, set())
    surrogate.add(small.key, mid, 2.9)
    assert not surrogate.holds_back(large.key, set())
    # with results in, the best run's sides decide: the narrowest tried is best, nothing below it is held
    surrogate.add(small.key, above, 2.8)
    assert not surrogate.holds_back(small.key, {below})
    assert surrogate.holds_back(small.key, {small.heads[-1]})


def test_a_searcher_with_more_slots_than_cells_idles_rather_than_guess_and_still_finishes_every_cell(branched):
    searcher = CellTrials(make_studies(branched, "search", None))
    surrogate = next(iter(searcher._studies.values())).surrogate
    running, n, idled = {}, 0, 0
    while True:
        held = {k for k in searcher._studies if searcher._holds_back(k)}
        config = searcher.suggest(f"t{n}")
        if config == FINISHED:
            break
        if config is not None:
            assert not running or config["meta"]["cell"] not in held
            running[f"t{n}"] = config
            n += 1
            if len(running) < 2 * len(surrogate.cells):
                continue
        else:
            idled += bool(running)
            assert searcher.suggest(f"t{n}") is None  # asked again before a result: still nothing to run
        done = min(running)  # the oldest running trial reports, one at a time
        searcher.on_trial_complete(done, simulate(TrialConfig.from_params(running.pop(done)["trial"])))
    assert idled > 0 and not running
    assert all(surrogate.status(k) != "open" for k in surrogate.cells)


def informed(spec: SweepSpec, information: float) -> tuple[LawSurrogate, dict[str, CellGeometry]]:
    """A surrogate over every cell of ``spec`` with three runs bracketing each cell's optimum (the law's clean
    loss plus an offset shared by the cell, as the shipped noise has), fitted."""
    cells = {c.key: CellGeometry.of(spec, c) for c in spec.cells()}
    surrogate = LawSurrogate(list(cells.values()), seed=0, tolerance=1.0, information=information)
    for n, g in enumerate(cells.values()):
        i = min(range(len(g.heads)), key=lambda j: clean_loss(spec, g, g.heads[j]))
        i = min(max(i, 1), len(g.heads) - 2)
        for h in g.heads[i - 1:i + 2]:
            surrogate.add(g.key, h, clean_loss(spec, g, h) + 0.005 * math.sin(3 * n))
    return surrogate, cells


def test_a_located_cell_takes_more_widths_only_while_they_pay_for_themselves_in_phi(spec):
    off, cells = informed(spec, 0.0)
    assert all(off.status(k) == "located" for k in cells)  # information off: located cells stop, as before
    on, _ = informed(spec, 1.0)
    cheapest = min(cells.values(), key=lambda g: g.budget)
    dearest = max(cells.values(), key=lambda g: g.budget)
    heads, worth = on._informative(cheapest.key, set())
    assert worth > on._informative(dearest.key, set())[1]  # the same share of var(phi) costs less in a cheap cell
    assert heads not in on.results[cheapest.key]
    design = {k: [cells[k].index(h) for h in on.results[k]] for k in cells}
    cut = {h: on._var_phi(design) - on._var_phi({**design, cheapest.key: design[cheapest.key] + [cheapest.index(h)]})
           for h in cheapest.heads if h not in on.results[cheapest.key]}
    assert cut[heads] == max(cut.values()) > 0  # the width that removes the most variance of phi
    # the cell stays open for it (the worth is far above 1 in the cheapest cell) and proposes exactly it
    assert worth >= 1.0 and on.status(cheapest.key) == "open" and on.propose(cheapest.key, set()) == heads
    # the worth is a share per share: a threshold above every cell's worth closes every cell
    strict, _ = informed(spec, 10 * max(on._informative(k, set())[1] for k in cells))
    assert all(strict.status(k) == "located" for k in cells)


def test_a_sweep_with_information_spends_its_extra_trials_in_the_cheap_cells(spec):
    plain = drive(CellTrials(make_studies(dataclasses.replace(spec, sampling=dataclasses.replace(spec.sampling,
                                                                                                 information=0.0)),
                                                                                                 "search", None)))
    informed_trials = drive(CellTrials(make_studies(spec, "search", None)))
    assert spec.sampling.information == 1.0  # the paper preset's
    assert informed_trials == drive(CellTrials(make_studies(spec, "search", None)))  # seeded, deterministic
    budget = {c.key: c.budget for c in spec.cells()}

    def count(trials, b):
        return sum(budget[cell] == b for cell, _, _ in trials)
    assert count(informed_trials, BUDGETS[0]) > count(plain, BUDGETS[0])
    assert len(informed_trials) > len(plain)


def test_branched_sweep_is_deterministic_spends_less_and_every_branch_point_reaches_its_cell(spec, branched):
    plain = drive(CellTrials(make_studies(spec, "search", None)))
    first = drive(CellTrials(make_studies(branched, "search", None)))
    assert first == drive(CellTrials(make_studies(branched, "search", None)))
    assert any(branches for _, _, branches in first)
    cells = {c.key: c for c in branched.cells()}
    assert all(b < cells[cell].budget for cell, _, branches in first for b in branches)  # only into smaller cells

    def flops(trials, sweep_spec):
        return sum(simulate(dataclasses.replace(sweep_spec.trial_config(cells[cell], s), branch_budgets=b))[
            "flops_spent"] for cell, s, b in trials)
    assert flops(first, branched) < flops(plain, spec)
    # every point a branch recorded is a result of its own cell in the surrogate
    searcher = CellTrials(make_studies(branched, "search", None))
    trials = drive(searcher)
    surrogate = next(iter(searcher._studies.values())).surrogate
    for cell, s, budgets in trials:
        heads = round(s * branched.grid.width_unit / branched.grid.head_dim)
        for b in budgets:
            key = next(c.key for c in cells.values() if c.budget == b and c.r == cells[cell].r)
            assert heads in surrogate.results[key]
    assert all(not incoming for incoming in surrogate.incoming.values())


@pytest.mark.parametrize("base_lr", [None, 0.12])
def test_a_calibration_brackets_the_recipes_rate_before_its_model_takes_over(tmp_path, base_lr):
    """The demo's calibration once tried 0.04 and then only rates above it while half of it trained 0.11 nats
    better: its first trials are the rate, half of it and twice it (those inside [low, high])."""
    demo = SweepSpec.from_toml("demo", tracking_uri=f"sqlite:///{tmp_path}/unused.db")
    if base_lr is not None:
        demo = dataclasses.replace(demo, training=dataclasses.replace(demo.training, recipe={**demo.training.recipe,
                                                                                             "base_lr": base_lr}))
    cal, rate = demo.training.calibrate, demo.training.recipe["base_lr"]
    searcher = CellTrials(make_studies(demo, "calibrate", None))
    tried = [searcher.suggest(f"c{i}")["trial"]["recipe"][cal.param] for i in range(3)]
    expected = [x for x in (rate, rate / 2, rate * 2) if cal.low <= x <= cal.high]
    assert tried[:len(expected)] == pytest.approx(expected)
    assert len(expected) == (3 if base_lr is None else 2) and cal.low <= min(tried) and max(tried) <= cal.high



def slots(searcher: CellTrials, workers: int, duration) -> tuple[list[tuple], list[str], pd.DataFrame, float]:
    """Tune's loop on ``workers`` slots, a trial lasting ``duration(config)``: every free slot asked in one step,
    then the trial that ends first reports. Returns the (cell, s, branches) proposed, the order trials ended, the
    runs table analyze would read and the time the last trial ended (tests/benchmarks/bench_rounds.py reads it)."""
    clock, running, proposed, ended, rows, n = 0.0, [], [], [], [], 0
    while True:
        while len(running) < workers:
            config = searcher.suggest(f"t{n}")
            if config is None or config == FINISHED:
                break
            running.append((clock + duration(config), f"t{n}", config))
            proposed.append((config["meta"]["cell"], config["trial"]["s"],
                             tuple(config["trial"].get("branch_budgets", []))))
            n += 1
        if not running:
            runs = pd.DataFrame(rows).assign(run_id=[str(i) for i in range(len(rows))], branch_of="", reason="")
            return proposed, ended, expand_branches(runs), clock
        running.sort(key=lambda t: t[0])
        clock, trial_id, config = running.pop(0)
        ended.append(trial_id)
        result = {**simulate(TrialConfig.from_params(config["trial"])), "stage": "search"}
        searcher.on_trial_complete(trial_id, result)
        rows.append(result)


def test_by_default_the_same_spec_gives_the_same_trials_and_phi_whichever_trial_finishes_first(branched):
    # 6 cells (two budgets x r in {1, 2, 4}) on 3 slots; durations that grow with the budget, and the same
    # reversed (the cheap trials last longest): real training's durations vary with the machine as these do
    def grows(config):
        return config["trial"]["budget_flops"] / 1e17 + 0.01 * config["trial"]["s"]

    def reverse(config):
        return 1e2 / grows(config)

    small = dataclasses.replace(branched, grid=dataclasses.replace(branched.grid, budgets=tuple(BUDGETS[:2]),
                                                                    recurrences=(1, 2, 4)))
    assert small.sampling.rounds_written is None and small.sampling.rounds  # the law sampler's default
    first = slots(CellTrials(make_studies(small, "search", None), rounds=small.sampling.rounds), 3, grows)
    second = slots(CellTrials(make_studies(small, "search", None), rounds=small.sampling.rounds), 3, reverse)
    assert first[1] != second[1]  # the trials did finish in other orders
    assert first[0] == second[0]
    phis = [fit_joint_law(runs, n_starts=20, n_bootstrap=0).phi for _, _, runs, _ in (first, second)]
    assert phis[0] == phis[1]
    # without rounds (the default before) the same two orders give other trials (bench_rounds.py: 5 of 5 seeds)
    unordered = [slots(CellTrials(make_studies(small, "search", None), rounds=False), 3, duration)[0]
                 for duration in (grows, reverse)]
    assert unordered[0] != unordered[1]
