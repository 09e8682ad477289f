"""The wall-time model of ``loopscale plan``: what a sweep will take here, by part, from the step time of its
trials (``Throughput``, measured by ``probe``).

A trial's optimizer step does not cost a fixed amount per FLOP: a small model's step is dominated by work that
does not grow with its tokens (the optimizers' updates, Muon's orthogonalisation, kernel launches), so the
FLOP/s of one shape over- or under-prices the others. The step time is therefore affine in the step's FLOPs,

    step seconds = step_s + step FLOPs / flops_per_s,

fitted through the trial's own step timed at two widths, with as many copies running at once as the sweep
runs training trials side by side (copies on shared CPU cores slow each other down).

A trial at width s costs its set-up (building the model and optimizers, the first step's excess over a later
one), steps(s) x step seconds for its own steps and its warmdown branches' (objectives/branches.py),
a validation pass per evaluation (its own and one per branch; val_tokens / batch_tokens forward passes, a third
of a step each), its checkpoints (``checkpoint_seconds``), and Tune's hand-over to the next trial; a shape's first trial also pays the compile warm-up
where the trial compiles (the sweep's compile cache serves the later ones). A cell's trials are priced at the
widths its sampler is likely to try: the first guess, then the feasible widths nearest it (the law, GP and TPE
samplers bracket the first guess; the grid spreads its trials over the window), and, for the high end of the
range, at the cell's narrowest widths, its costliest (more steps, each with its fixed cost; the law sampler
tends to keep to a cell's narrower widths). A stage's wall time replays the searcher's dispatch
(``search/dispatch.py``) over its slots, so the long trials of the largest budget that run last, with slots
idle beside them, are counted, and so are a sweep's rounds (``rounds``: a round's slots wait for its longest
trial); the law sampler may stop a cell early, so its figure is the cap's. The sweep
adds Ray's start and each stage's start (Tune, the trial workers' imports); the analysis (``loopscale
analyze``, which ``loopscale demo`` runs after the search) is a measured constant. It reflects this machine,
not a GPU cluster the spec may be meant for.
"""

from __future__ import annotations

import heapq
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field

from loopscale import objectives
from loopscale.analysis.rate_sensitivity import RATE_STAGE
from loopscale.model import account, tokens_for_budget
from loopscale.objectives.branches import branch_plan

from .. import space
from ..dispatch import CellState, next_cell
from ..spec import STAGES, Cell, SweepSpec

# Overheads measured on the demo on idle cores (tests/benchmarks/bench_overhead.py, bench_plan_estimate.py): the
# time before the sweep's first run (imports, data, ray.init, a fresh MLflow store), from a stage's start to its
# first trial (Tune, the trial workers' imports), between one trial's end and the next one's start in a slot
# (Tune reuses the worker), and ``loopscale analyze`` (its imports, the joint fit's starts and bootstrap
# resamples, the plots and the logging cost about the same whatever the rows at these sizes).
RAY_START_S = 10.0
# A trial checkpoint (objectives/checkpoint.py) holds fp32 weights and at most two fp32 moments per parameter
# (AdamW's; MuonH keeps one), written once by torch.save and copied once by Tune to the sweep's storage, at
# about 200 MB/s on a local disk (tests/benchmarks/bench_checkpoint.py).
CHECKPOINT_BYTES_PER_PARAM = 12
CHECKPOINT_COPIES = 2
CHECKPOINT_BYTES_PER_S = 2e8
STAGE_START_S = 5.0
OVERHEAD_S_PER_TRIAL = 0.3
ANALYSIS_S = 30.0


@dataclass(frozen=True)
class Throughput:
    """One trial's optimizer step here, timed with ``side_by_side`` copies running at once: ``step_s`` seconds
    plus its FLOPs at ``flops_per_s`` (module docstring)."""

    flops_per_s: float
    step_s: float
    shape: str
    device: str
    setup_s: float = 0.0  # once per trial: building the model and optimizers, the first step's extra
    compile_s: float = 0.0  # once per shape and sweep where the trial compiles: the first compiled step's extra
    side_by_side: int = 1

    def step_seconds(self, step_flops: float) -> float:
        return self.step_s + step_flops / self.flops_per_s


def likely_widths(spec: SweepSpec, cell: Cell) -> tuple[float, ...]:
    """The widths a cell's trials are likely to try, in the order tried: the grid's spread over the window,
    else the first guess and then the feasible widths nearest it in log width (what the law, GP and TPE
    samplers bracket)."""
    if spec.sampling.sampler == "grid":
        return tuple(cell.widths[round(i)] for i in space.spread(len(cell.widths), cell.n_trials))
    near = sorted(cell.widths, key=lambda s: (abs(math.log(s / cell.first_guess)), s))
    return tuple(near[:cell.n_trials])


@dataclass
class Estimate:
    """Wall seconds of a sweep here, by part, and of the analysis that follows it. A search stage's seconds are a
    range: its cells' trials at the widths nearest their first guesses (``likely_widths``) and at their narrowest
    widths, the most a trial of that budget can take (more steps of a fixed cost each)."""

    start_s: float
    stages: dict[str, tuple[float, float, int]] = field(default_factory=dict)  # stage -> (low s, high s, trials)
    analysis_s: float = ANALYSIS_S

    @property
    def sweep_s(self) -> tuple[float, float]:
        return (self.start_s + sum(low for low, _, _ in self.stages.values()),
                self.start_s + sum(high for _, high, _ in self.stages.values()))

    @property
    def total_s(self) -> tuple[float, float]:
        low, high = self.sweep_s
        return low + self.analysis_s, high + self.analysis_s


def estimate(spec: SweepSpec, throughput: Throughput | None) -> Estimate | None:
    """The sweep's wall time here by part (module docstring); None when it trains and nothing was timed."""
    trains = spec.objective == "train" or spec.training.calibrate is not None
    if trains and throughput is None:
        return None
    out = Estimate(start_s=RAY_START_S)
    stages = {stage: spec.cells(stage) for stage in STAGES}
    for name, _ in spec.sensitivity.stages():  # after the search: each cell's best width at another rate
        stages[name] = space.rate_cells(spec.grid, name)
    stages["validate"] = space.rung_cells(spec.grid, spec.rungs.budgets)  # after the search: its rungs, if any
    for stage, cells in stages.items():
        if cells:
            out.stages[stage] = (STAGE_START_S + _stage_seconds(spec, stage, cells, throughput, likely_widths),
                                 STAGE_START_S + _stage_seconds(spec, stage, cells, throughput, narrowest_widths),
                                 sum(c.n_trials for c in cells))
    return out


def narrowest_widths(spec: SweepSpec, cell: Cell) -> tuple[float, ...]:
    """The cell's ``n_trials`` narrowest feasible widths, its costliest trials (the grid's widths are fixed)."""
    return likely_widths(spec, cell) if spec.sampling.sampler == "grid" else cell.widths[:cell.n_trials]


def _tried(widths: tuple[float, ...], cell: Cell) -> list[float]:
    """The widths priced for a cell's trials, one per trial, in the order tried (repeated where a cell has more
    trials than widths, as a calibration cell does)."""
    return [widths[i % len(widths)] for i in range(cell.n_trials)]


def replay(cells: list[Cell], slots: int, seconds: Callable[[Cell, int], float],
           rounds: bool = False) -> list[tuple[float, float, str]]:
    """The stage's trials dispatched over ``slots`` as the searcher dispatches them (``dispatch.next_cell``), the
    n-th trial of a cell (from 0) lasting ``seconds(cell, n)``, asked in this order: (start, end, cell key) of
    each, in the order asked. A slot frees when its trial ends; trials ending at once free in cell-key order; in
    ``rounds`` every slot frees when the round's last trial ends."""
    started = {c.key: 0 for c in cells}
    running: list[tuple[float, str]] = []  # (end, cell key), a heap
    asked: list[tuple[float, float, str]] = []
    now = 0.0
    while any(started[c.key] < c.n_trials for c in cells):
        if len(running) == slots:
            if rounds:  # every slot frees when the round's last trial ends
                now, running = max(running)[0], []
            else:
                now = heapq.heappop(running)[0]
            continue
        busy = {c.key: sum(1 for _, k in running if k == c.key) for c in cells}
        key = next_cell([CellState(c.key, c.budget, busy[c.key], started[c.key], started[c.key] < c.n_trials)
                         for c in cells])
        cell = next(c for c in cells if c.key == key)
        end = now + seconds(cell, started[key])
        started[key] += 1
        heapq.heappush(running, (end, key))
        asked.append((now, end, key))
    return asked


def _stage_seconds(spec: SweepSpec, stage: str, cells: list[Cell], throughput: Throughput | None,
                   widths_of: Callable[[SweepSpec, Cell], tuple[float, ...]]) -> float:
    """The stage's trials (at ``widths_of`` each cell) replayed over its slots (``replay``); a shape's first
    trial also pays the compile warm-up. Returns when the last trial ends."""
    trains = stage == "calibrate" or spec.objective == "train"
    queue = {c.key: _tried(widths_of(spec, c), c) for c in cells}
    slots = min(spec.concurrency(stage, cpus()), sum(c.n_trials for c in cells))
    compiled: set[tuple[float, int]] = set()

    def seconds(cell: Cell, n: int) -> float:
        s = queue[cell.key][n]
        out = OVERHEAD_S_PER_TRIAL
        if trains:
            out += trial_seconds(spec, cell, s, throughput)
            if throughput.compile_s and (s, cell.r) not in compiled:
                compiled.add((s, cell.r))
                out += throughput.compile_s
        return out

    return max(end for _, end, _ in replay(cells, slots, seconds, rounds=spec.sampling.rounds))


def _branches(spec: SweepSpec, cell: Cell, s: float) -> list[dict]:
    """The warmdown branches a training trial of width s in ``cell`` runs at most (objectives.branches): the
    recipe's, and with ``branches = true`` every smaller budget of the sweep the law sampler may choose."""
    if cell.stage.startswith(RATE_STAGE):  # a repeat of a search trial without its branches
        return []
    config = spec.grid.model(s, cell.r)
    recipe = objectives.normalize_recipe(spec.training.recipe)
    budgets = sorted({*recipe["branch_budgets"],
                      *(spec.grid.budgets if spec.sampling.branches and cell.stage == "search" else ())})
    steps = tokens_for_budget(config, cell.budget, spec.grid.batch_tokens) // spec.grid.batch_tokens
    return branch_plan(budgets, recipe["warmdown_frac"], config, cell.budget, steps, spec.grid.batch_tokens)


def trial_seconds(spec: SweepSpec, cell: Cell, s: float, throughput: Throughput) -> float:
    """One trial at width s: its set-up, its own and its branches' optimizer steps at the measured step time,
    and a validation pass (val_tokens / batch_tokens forward passes, a third of a step each) per evaluation:
    its own and one per branch."""
    config = spec.grid.model(s, cell.r)
    step = throughput.step_seconds(account(config).flops_per_token * spec.grid.batch_tokens)
    steps = tokens_for_budget(config, cell.budget, spec.grid.batch_tokens) // spec.grid.batch_tokens
    branches = _branches(spec, cell, s)
    steps += sum(b["steps"] - b["fork"] for b in branches)
    evaluation = spec.training.val_tokens / spec.grid.batch_tokens * step / 3
    training = steps * step + (1 + len(branches)) * evaluation
    return throughput.setup_s + training + checkpoint_seconds(spec, cell, s, training)


def checkpoint_seconds(spec: SweepSpec, cell: Cell, s: float, training_s: float) -> float:
    """The checkpoints of a trial that trains ``training_s`` seconds: one per ``checkpoint_s`` of training, each ``CHECKPOINT_BYTES_PER_PARAM`` x its parameters (embedding included)
    written ``CHECKPOINT_COPIES`` times at ``CHECKPOINT_BYTES_PER_S``."""
    if not spec.placement.checkpoint_s:
        return 0.0
    counts = account(spec.grid.model(s, cell.r))
    write_s = CHECKPOINT_COPIES * CHECKPOINT_BYTES_PER_PARAM * (counts.N + counts.N_embed) / CHECKPOINT_BYTES_PER_S
    return int(training_s // spec.placement.checkpoint_s) * write_s


def cpus() -> int:
    return os.cpu_count() or 1
