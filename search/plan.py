"""``loopscale plan SPEC``: what a sweep will run and roughly how long, without training anything.

Per cell, every feasible width with N_once, N_rec, D and tokens per parameter (the first guess marked) and,
when the sweep trains, the peak learning rates that width's trial will use (objectives.trial_lrs: the matrix
rate and the AdamW groups', moved from the recipe's base by the transfer rules);
the total FLOPs (each trial spends at most its budget, D = C / F in whole optimizer steps); and a wall-time
estimate of the whole command from step times measured here in a few seconds.

A trial's optimizer step does not cost a fixed amount per FLOP: a small model's step is dominated by work that
does not grow with its tokens (the optimizers' updates, Muon's orthogonalisation, kernel launches), so the
FLOP/s of one shape over- or under-prices the others (here a width-8 step ran at a third of a width-40 step's
FLOP/s). The probe therefore times the trial's own step (its model, optimizers and batch, random tokens,
compiled where the trial compiles) at the narrowest and the widest of the widths the sweep is likely to train,
and fits

    step seconds = step_s + step FLOPs / flops_per_s

through the two points. It times them with as many copies running at once as the sweep runs training trials
side by side (separate processes): on this machine's 2 cores a step ran 1.5-1.9x slower with two copies at once
than alone, and the demo's 40 trials (24 min 18 s on idle cores) each trained 1.5-1.75x longer than a one-copy
probe priced them (its estimate was 12 min).

A trial at width s costs its set-up (building the model and optimizers, the first step's excess over a later
one), steps(s) x step seconds for its own steps and its warmdown branches' (objectives/branches.py),
a validation pass per evaluation (its own and one per branch; val_tokens / batch_tokens forward passes, a third
of a step each), and Tune's hand-over to the next trial; a shape's first trial also pays the compile warm-up
where the trial compiles (the sweep's compile cache serves the later ones). A cell's trials are priced at the
widths its sampler is likely to try: the first guess, then the feasible widths nearest it (the law, GP and TPE
samplers bracket the first guess; the grid spreads its trials over the window), and, for the high end of the
range, at the cell's narrowest widths, its costliest (more steps, each with its fixed cost). The demo's law
sampler kept to its cells' narrowest widths (s = 1-5 where the first guesses are s = 2-7): with the one-copy
probe's step times scaled by the demo's measured 1.6x, this model prices the widths it trained at 24.4 min
(it took 24 min 18 s) and the widths nearest the first guesses at 20.2 min. A stage's wall time replays
the searcher's dispatch (a free slot takes the open cell with the fewest running trials, then the smallest
budget) over its slots, so the long trials of the largest budget that run last, with slots idle beside them,
are counted; the law sampler may stop a cell early, so its figure is the cap's. The sweep adds Ray's start and
each stage's start (Tune, the trial workers' imports); the analysis (``loopscale analyze``, which
``loopscale demo`` runs after the search) is a measured constant. It reflects this machine, not a GPU
cluster the spec may be meant for.
"""

from __future__ import annotations

import heapq
import math
import multiprocessing
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from loopscale import objectives
from loopscale.analysis.flops import paper_grid_reference
from loopscale.model import (LoopedLM, count_params, flops_per_token, iso_depth_template, runtime,
                             tokens_for_budget)
from loopscale.objectives.recipe import build_optimizers
from loopscale.objectives.branches import branch_plan

from . import space
from .law_sampler import fewest_trials
from .spec import STAGES, Cell, SweepSpec

# Measured on the demo run on idle cores (24 min 18 s; its MLflow run times against each trial's own wall_s):
# ~10 s before the sweep's first run (imports, data, ray.init, a fresh MLflow store; tests/benchmarks/
# bench_overhead.py measured the same), 4-5 s from a stage's start to its first trial (Tune, the trial workers'
# imports) and 0.1-0.3 s between one trial's end and the next one's start in a slot (Tune reuses the worker).
# ``loopscale analyze`` took 32 s for the demo's 90 runs-table rows, and 32 s for 12 rows of a cut-down demo (load
# ~8; tests/benchmarks/bench_plan_estimate.py): at these sizes its imports, the joint fit's 500 starts and 200
# bootstrap resamples, the plots and the logging cost about the same whatever the rows.
RAY_START_S = 10.0
STAGE_START_S = 5.0
OVERHEAD_S_PER_TRIAL = 0.3
ANALYSIS_S = 30.0
PROBE_MAX_FLOPS = 2e11  # one probe step at most; about 2-5 s on two CPU cores


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


def cell_table(spec: SweepSpec, cell: Cell) -> str:
    """The cell's feasible widths with their sizes, tokens, tokens per parameter and (training) learning rates."""
    trains = spec.objective == "train" or cell.stage == "calibrate"
    lr_groups = _lr_groups(spec) if trains else ()
    rows = [f"  {'':1} {'s':>5} {'width':>6} {'N_once':>11} {'N_rec':>11} {'N':>11} {'D':>11} {'D/N':>7} {'steps':>7}"
            + "".join(f" {label:>8}" for _, label in lr_groups)]
    for s in cell.widths:
        config = spec.model(s, cell.r)
        p = count_params(config)
        tokens = tokens_for_budget(config, cell.budget, spec.batch_tokens)
        lrs = objectives.trial_lrs(spec.trial_config(cell, s)) if trains else {}
        rows.append(f"  {'*' if s == cell.first_guess else '':1} {s:>5g} {config.width:>6} {p.N_once:>11,} "
                    f"{p.N_rec:>11,} {p.N:>11,} {tokens:>11,} {tokens / p.N:>7.1f} {tokens // spec.batch_tokens:>7,}"
                    + "".join(f" {lrs[group]:>8.3g}" for group, _ in lr_groups))
    return "\n".join(rows)


def _lr_groups(spec: SweepSpec) -> tuple[tuple[str, str], ...]:
    """(group, column label) of the learning rates a trial of this sweep uses."""
    groups = (("matrices", "lr"), ("embedding", "lr_emb"), ("lm_head", "lr_head"), ("norms", "lr_norm"))
    return groups + ((("lanes", "lr_lanes"),) if spec.template.get("injection") == "hyperconnect" else ())


def _lr_note(spec: SweepSpec) -> str:
    """How the per-width learning rates were made, and what calibration changes."""
    recipe = objectives.normalize_recipe(spec.recipe)
    note = (f"learning rates: {recipe['optimizer']} matrices (lr) and AdamW groups, peak of each trial, moved from "
            f"base_lr {recipe['base_lr']:g} by the batch/data/width rules (objectives/lr_rules.py)")
    if spec.calibrate is not None:
        param = spec.calibrate.param
        note += f"; calibration tunes {param}" + (", and every matrix lr scales with it" if param == "base_lr" else "")
    return note


def trial_flops(spec: SweepSpec, budget: float) -> float:
    """What one trial of ``budget`` spends at most: its budget, plus the warmdowns of its branches (a share
    ``warmdown_frac`` of each smaller branch budget; objectives/branches.py): the recipe's fixed ones, and with
    ``branches = true`` any smaller budget of the sweep the law sampler may choose."""
    recipe = objectives.normalize_recipe(spec.recipe if spec.objective == "train" else None)
    fixed = recipe["branch_budgets"] if spec.objective == "train" else []
    chosen = spec.budgets if spec.branches else []
    return budget + recipe["warmdown_frac"] * sum(c for c in {*fixed, *chosen} if c < budget)


def total_flops(spec: SweepSpec) -> float:
    """Upper bound on the FLOPs of every planned trial (a trial spends its budget to within one step, plus
    its branches' warmdowns)."""
    return sum(c.n_trials * trial_flops(spec, c.budget) for stage in STAGES for c in spec.cells(stage))


def flops_estimate(spec: SweepSpec) -> str:
    """The FLOPs the sweep may spend: every planned trial, or with the law sampler, which stops a cell once its
    optimum is located, between its fewest trials and the cap: 3 widths per cell, or with warmdown branches
    (which can bracket a smaller cell's optimum for it), 3 in each r's largest cell, none in the
    ``deferred_budgets`` cells just below it (while a cheaper one remains) and 1 in every other cell (its first;
    ``law_sampler.fewest_trials``); next to the paper grid's figure when the sweep covers its cells
    (analysis.flops)."""
    cap = floor = total_flops(spec)
    text = f"total: {cap:.3g} FLOPs (each trial spends at most its budget)"
    if spec.sampler == "law":
        fewest = fewest_trials(spec.cells(), spec.branches, spec.deferred_budgets)
        floor = sum(min(fewest[c.key], c.n_trials) * c.budget for c in spec.cells()) + sum(
            c.n_trials * trial_flops(spec, c.budget) for c in spec.cells("calibrate"))
        below = "just below it" if spec.deferred_budgets == 1 else f"in the {spec.deferred_budgets} budgets below it"
        least = (f"3 widths in each r's largest cell, none {below} (while a cheaper budget remains) and 1 in the "
                 "others (warmdown branches fill their brackets)") if spec.branches else "3 widths per cell at least"
        text = (f"total: {floor:.3g} to {cap:.3g} FLOPs (the law sampler stops a cell once its optimum is located: "
                f"{least}, trials_per_cell at most)")
    reference = paper_grid_reference(spec.budgets, spec.recurrences, spec.model_template(), spec.batch_tokens)
    if reference is not None:
        share = f"{cap / reference:.0%}" if floor == cap else f"{floor / reference:.0%} to {cap / reference:.0%}"
        text += f"; the paper's grid of 116 runs spent {reference:.3g} ({share} of it here)"
    return text


def edge_warnings(spec: SweepSpec) -> list[str]:
    """A warning per cell whose first guess is an edge of its widths: if the optimum lies there, the cell
    cannot bracket it and analysis will flag it bound-limited."""
    warnings = []
    for cell in spec.cells():
        if len(cell.widths) > 1 and cell.first_guess in (cell.widths[0], cell.widths[-1]):
            side = "narrowest" if cell.first_guess == cell.widths[0] else "widest"
            warnings.append(f"warning: cell {cell.key}: the first guess s={cell.first_guess:g} is the {side} width "
                            f"the cell may try (s_min/s_max or the tokens_per_param window); if its optimum lies "
                            f"there, the cell cannot bracket it and will be flagged bound-limited: widen [widths]")
    return warnings


def likely_widths(spec: SweepSpec, cell: Cell) -> tuple[float, ...]:
    """The widths a cell's trials are likely to try, in the order tried: the grid's spread over the window,
    else the first guess and then the feasible widths nearest it in log width (what the law, GP and TPE
    samplers bracket)."""
    if spec.sampler == "grid":
        return tuple(cell.widths[round(i)] for i in space.spread(len(cell.widths), cell.n_trials))
    near = sorted(cell.widths, key=lambda s: (abs(math.log(s / cell.first_guess)), s))
    return tuple(near[:cell.n_trials])


def measure_throughput(spec: SweepSpec, max_steps: int = 5, min_seconds: float = 0.5) -> Throughput | None:
    """Time the trial's own optimizer step (its threads, batch, model, optimizers and compilation) at the
    narrowest and the widest of the widths the sweep's training trials are priced at, with as many copies at once as the
    sweep runs trials side by side on a CPU, and fit the step time as affine in the step's FLOPs; None if not
    even the narrowest step is small enough to time quickly. A single timable width gives a pure FLOP rate."""
    device = runtime.pick_device("auto" if spec.gpus_per_trial > 0 else "cpu")  # no CUDA here: time the CPU
    trained = [c for stage in STAGES for c in spec.cells(stage) if stage == "calibrate" or spec.objective == "train"]
    shapes = sorted({(float(s), c.r, c) for c in trained for s in likely_widths(spec, c) + narrowest_widths(spec, c)},
                    key=lambda item: _step_flops(spec, item[0], item[1]))
    timable = [item for item in shapes
               if _step_flops(spec, item[0], item[1]) <= PROBE_MAX_FLOPS or device.type == "cuda"]
    if not timable:
        return None
    probes = [timable[0]] if len(timable) == 1 else [timable[0], timable[-1]]
    configs = [space.trial_config(spec, cell, s, recipe=spec.recipe) for s, _, cell in probes]
    copies = 1 if device.type == "cuda" else side_by_side(spec)
    timed = _time_side_by_side(configs, device.type, max(1, int(spec.cpus_per_trial)), copies, max_steps,
                               min_seconds)
    shape = " and ".join(f"s={s:g} r={r} width {spec.model(s, r).width}" for s, r, _ in probes)
    shape += f", {spec.batch_tokens:,} tokens per step"
    setup = sum(t.setup_s for t in timed) / len(timed)
    compile_s = sum(t.compile_s for t in timed) / len(timed)
    points = [(_step_flops(spec, s, r), t.step_s) for (s, r, _), t in zip(probes, timed)]
    (f0, t0), (f1, t1) = points[0], points[-1]
    common = {"shape": shape, "device": device.type, "setup_s": setup, "compile_s": compile_s,
              "side_by_side": copies}
    if len(timed) == 2 and f1 > f0 and t1 > t0:
        per_flop = (t1 - t0) / (f1 - f0)
        return Throughput(1.0 / per_flop, max(0.0, t0 - f0 * per_flop), **common)
    return Throughput(f1 / t1, 0.0, **common)  # one point (or noise made them disagree): a rate


def side_by_side(spec: SweepSpec) -> int:
    """Training trials the sweep runs at once here: the most of any stage that trains, no more than it has."""
    return max([min(spec.concurrency(stage, _cpus()), sum(c.n_trials for c in spec.cells(stage)))
                for stage in STAGES if spec.cells(stage) and (stage == "calibrate" or spec.objective == "train")],
               default=1)


def _step_flops(spec: SweepSpec, s: float, r: int) -> float:
    return float(flops_per_token(spec.model(s, r)) * spec.batch_tokens)


@dataclass(frozen=True)
class _Timing:
    setup_s: float  # building the model and optimizers, and the first eager step's excess
    compile_s: float  # the first compiled step's excess (0 when eager)
    step_s: float


def _time_side_by_side(configs: list[objectives.TrialConfig], device: str, threads: int, copies: int, max_steps: int,
                       min_seconds: float) -> list[_Timing]:
    """Each config's timing averaged over ``copies`` processes that time it at the same moment (a barrier
    before each config); one copy times it in this process."""
    if copies == 1:
        previous = torch.get_num_threads()
        torch.set_num_threads(threads)  # as a trial runs; shared cores stay fair
        try:
            with tempfile.TemporaryDirectory() as cache:  # a cold compile, as a fresh sweep's first trial
                return [_time_steps(c, torch.device(device), max_steps, min_seconds, cache) for c in configs]
        finally:
            torch.set_num_threads(previous)
    context = multiprocessing.get_context("spawn")  # a fresh interpreter: no forked torch thread pools
    barrier, results = context.Barrier(copies), context.Queue()
    workers = [context.Process(target=_probe_copy, args=(configs, device, threads, max_steps, min_seconds,
                                                          barrier, results), daemon=True) for _ in range(copies)]
    for worker in workers:
        worker.start()
    try:
        timed = [results.get(timeout=600) for _ in workers]
    finally:
        for worker in workers:
            worker.join(timeout=10)
    if any(isinstance(t, str) for t in timed):
        raise RuntimeError(next(t for t in timed if isinstance(t, str)))
    return [_Timing(*(sum(getattr(t[i], f) for t in timed) / copies for f in ("setup_s", "compile_s", "step_s")))
            for i in range(len(configs))]


def _probe_copy(configs: list[objectives.TrialConfig], device: str, threads: int, max_steps: int, min_seconds: float,
                barrier: object, results: object) -> None:
    """One copy of the side-by-side probe: time every config after the other copies are ready to."""
    torch.set_num_threads(threads)
    try:
        with tempfile.TemporaryDirectory() as cache:
            out = []
            for config in configs:
                barrier.wait()
                out.append(_time_steps(config, torch.device(device), max_steps, min_seconds, cache))
        results.put(out)
    except Exception as exc:  # the parent raises it: a probe copy that dies silently would hang the plan
        barrier.abort()
        results.put(f"plan's step probe failed: {type(exc).__name__}: {exc}")


def _time_steps(trial: objectives.TrialConfig, device: torch.device, max_steps: int, min_seconds: float,
                compile_cache: str) -> _Timing:
    """The trial's own optimizer step (forward + backward per micro-batch, every optimizer, compiled where the
    trial compiles, into ``compile_cache``) on random tokens: the step averaged over up to ``max_steps`` timed
    steps; the set-up (building the model and optimizers) and the first step's excess over a later one, which is
    the compile warm-up where it compiles."""
    torch.manual_seed(0)
    started = time.perf_counter()
    config = trial.model_config
    recipe = objectives.normalize_recipe(trial.recipe)
    model = LoopedLM(config).to(device)
    optimizers = build_optimizers(model, objectives.trial_lrs(trial), recipe)
    model, how = runtime.maybe_compile(model, device, recipe["compile"], cpu=recipe["compile_cpu"],
                                       cache_dir=compile_cache)
    rows = trial.batch_tokens // config.seq_len
    micro = (recipe["micro_batch"] or trial.batch_tokens) // config.seq_len
    tokens = torch.randint(0, config.vocab_size, (rows, config.seq_len + 1), device=device)
    built = time.perf_counter() - started

    def step() -> None:
        for batch in tokens.split(micro):
            with runtime.autocast(device, recipe["bf16"]):
                loss = model(batch[:, :-1], batch[:, 1:])
            (loss / max(1, rows // micro)).backward()
        for optimizer in optimizers:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    started = time.perf_counter()
    step()
    _sync(device)
    first = time.perf_counter() - started
    started, steps = time.perf_counter(), 0
    while steps < max_steps and (steps == 0 or time.perf_counter() - started < min_seconds):
        step()
        steps += 1
    _sync(device)
    step_s = (time.perf_counter() - started) / steps
    excess = max(0.0, first - step_s)
    if how == "compiled":
        return _Timing(built, excess, step_s)
    return _Timing(built + excess, 0.0, step_s)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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
    trains = spec.objective == "train" or spec.calibrate is not None
    if trains and throughput is None:
        return None
    out = Estimate(start_s=RAY_START_S)
    for stage in STAGES:
        cells = spec.cells(stage)
        if cells:
            out.stages[stage] = (STAGE_START_S + _stage_seconds(spec, stage, cells, throughput, likely_widths),
                                 STAGE_START_S + _stage_seconds(spec, stage, cells, throughput, narrowest_widths),
                                 sum(c.n_trials for c in cells))
    return out


def narrowest_widths(spec: SweepSpec, cell: Cell) -> tuple[float, ...]:
    """The cell's ``n_trials`` narrowest feasible widths, its costliest trials (the grid's widths are fixed)."""
    return likely_widths(spec, cell) if spec.sampler == "grid" else cell.widths[:cell.n_trials]


def _tried(widths: tuple[float, ...], cell: Cell) -> list[float]:
    """The widths priced for a cell's trials, one per trial, in the order tried (repeated where a cell has more
    trials than widths, as a calibration cell does)."""
    return [widths[i % len(widths)] for i in range(cell.n_trials)]


def _stage_seconds(spec: SweepSpec, stage: str, cells: list[Cell], throughput: Throughput | None,
                   widths_of: Callable[[SweepSpec, Cell], tuple[float, ...]]) -> float:
    """The stage's trials (at ``widths_of`` each cell) replayed through the searcher's dispatch over its slots: a
    free slot takes the open cell with the fewest running trials, then the smallest budget, then the fewest
    started; a shape's first trial also pays the compile warm-up. Returns when the last trial ends."""
    trains = stage == "calibrate" or spec.objective == "train"
    queue = {c.key: _tried(widths_of(spec, c), c) for c in cells}
    started = {c.key: 0 for c in cells}
    running: list[tuple[float, str]] = []  # (end, cell key), a heap
    slots = min(spec.concurrency(stage, _cpus()), sum(c.n_trials for c in cells))
    compiled: set[tuple[float, int]] = set()
    now = 0.0
    while any(started[c.key] < c.n_trials for c in cells):
        if len(running) == slots:
            now = heapq.heappop(running)[0]
            continue
        busy = {key: sum(1 for _, k in running if k == key) for key in queue}
        cell = min((c for c in cells if started[c.key] < c.n_trials),
                   key=lambda c: (busy[c.key], c.budget, started[c.key]))
        s = queue[cell.key][started[cell.key]]
        started[cell.key] += 1
        seconds = OVERHEAD_S_PER_TRIAL
        if trains:
            seconds += _trial_seconds(spec, cell, s, throughput)
            if throughput.compile_s and (s, cell.r) not in compiled:
                compiled.add((s, cell.r))
                seconds += throughput.compile_s
        heapq.heappush(running, (now + seconds, cell.key))
    return max(end for end, _ in running)


def _branches(spec: SweepSpec, cell: Cell, s: float) -> list[dict]:
    """The warmdown branches a training trial of width s in ``cell`` runs at most (objectives.branches): the
    recipe's, and with ``branches = true`` every smaller budget of the sweep the law sampler may choose."""
    config = spec.model(s, cell.r)
    recipe = objectives.normalize_recipe(spec.recipe)
    budgets = sorted({*recipe["branch_budgets"], *(spec.budgets if spec.branches and cell.stage == "search" else ())})
    steps = tokens_for_budget(config, cell.budget, spec.batch_tokens) // spec.batch_tokens
    return branch_plan(budgets, recipe["warmdown_frac"], config, cell.budget, steps, spec.batch_tokens)


def _trial_seconds(spec: SweepSpec, cell: Cell, s: float, throughput: Throughput) -> float:
    """One trial at width s: its set-up, its own and its branches' optimizer steps at the measured step time,
    and a validation pass (val_tokens / batch_tokens forward passes, a third of a step each) per evaluation:
    its own and one per branch."""
    config = spec.model(s, cell.r)
    step = throughput.step_seconds(flops_per_token(config) * spec.batch_tokens)
    steps = tokens_for_budget(config, cell.budget, spec.batch_tokens) // spec.batch_tokens
    branches = _branches(spec, cell, s)
    steps += sum(b["steps"] - b["fork"] for b in branches)
    evaluation = spec.val_tokens / spec.batch_tokens * step / 3
    return throughput.setup_s + steps * step + (1 + len(branches)) * evaluation


def render_plan(spec: SweepSpec, throughput: Throughput | None) -> str:
    t = iso_depth_template(spec.model_template())
    lines = [
        f"sweep {spec.name!r}: objective {spec.objective}, sampler {spec.sampler}, seed {spec.seed}, "
        f"{len(spec.budgets)} budgets x {len(spec.recurrences)} recurrences = {len(spec.cells())} cells, "
        f"{spec.planned_trials()} trials",
        f"template: depth {t['depth']} (prelude {t['prelude']}, coda {t['coda']}), "
        f"width = {spec.width_unit} s in heads of {spec.head_dim}, seq_len {spec.seq_len}, vocab {t['vocab_size']}, "
        f"injection {t['injection']}; batch {spec.batch_tokens:,} tokens",
    ]
    if spec.objective == "train" or spec.calibrate is not None:
        lines.append(_lr_note(spec))
    for cell in spec.cells("calibrate"):
        cal = spec.calibrate
        lines.append(f"calibration: {cal.param} in [{cal.low:g}, {cal.high:g}] (log) at s={cal.s:g}, r={cal.r}, "
                     f"C={cal.budget:.3g}: {cal.trials} trials; the best rate goes to every search trial")
    for cell in spec.cells():
        lines += ["", f"cell {cell.key}: {cell.n_trials} trials over {len(cell.widths)} widths "
                      f"(* = first guess, ~{spec.first_guess_tokens_per_param:g} tokens per parameter)",
                  cell_table(spec, cell)]
    lines += [""] + edge_warnings(spec)
    lines.append(flops_estimate(spec))
    if throughput is not None:
        compile_note = f", {throughput.compile_s:.0f} s compile warm-up per shape" if throughput.compile_s else ""
        lines.append(f"step time here: {throughput.step_s * 1e3:.0f} ms + FLOPs at {throughput.flops_per_s / 1e9:.1f} "
                     f"GFLOP/s with {throughput.side_by_side} trial(s) stepping at once, {throughput.setup_s:.1f} s "
                     f"set-up per trial{compile_note} ({throughput.device}, timed at {throughput.shape})")
    lines += render_estimate(spec, estimate(spec, throughput))
    return "\n".join(lines)


def render_estimate(spec: SweepSpec, parts: Estimate | None) -> list[str]:
    """The wall-time estimate by part, ending with the ETA of search + analysis (what ``loopscale demo`` runs)."""
    if parts is None:
        return ["estimated wall time here: not measured (even the narrowest model's step is too big to time "
                "quickly on this machine)"]
    lines = [f"estimated wall time here: {spec.concurrency('search', _cpus())} trials side by side",
             f"  {'start (imports, data, Ray, MLflow)':<36} {_duration(parts.start_s)}"]
    for stage, (low, high, trials) in parts.stages.items():
        why = ""
        if high > low:
            why = "; from the widths nearest each cell's first guess to its narrowest (costliest) widths"
        if stage == "search" and spec.sampler == "law":
            why += "; the law sampler may stop cells early"
        lines.append(f"  {stage + ' stage':<36} {_span(low, high)} ({trials} trials{why})")
    lines += [f"  {'= loopscale search':<36} {_span(*parts.sweep_s)}",
              f"  {'analysis (loopscale analyze)':<36} {_duration(parts.analysis_s)}"]
    demo = " = the ETA of loopscale demo" if spec.design() == SweepSpec.from_toml("demo").design() else ""
    lines.append(f"ETA search + analysis: {_span(*parts.total_s)}{demo}")
    return lines


def _span(low: float, high: float) -> str:
    """``19-23 min``, ``50 s to 2 min``, or one figure when both round alike."""
    low_text, high_text = _duration(low), _duration(high)
    if low_text == high_text:
        return low_text
    (low_n, low_unit), (_, high_unit) = low_text.split(" ", 1), high_text.split(" ", 1)
    return f"{low_n}-{high_text}" if low_unit == high_unit else f"{low_text} to {high_text}"


def _cpus() -> int:
    return os.cpu_count() or 1


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 3 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.0f} days"
