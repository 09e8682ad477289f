"""``loopscale plan SPEC``: what a sweep will run and roughly how long, without training anything.

Per cell, every feasible width with N_once, N_rec, D and tokens per parameter (the first guess marked) and,
when the sweep trains, the peak learning rates that width's trial will use (objectives.trial_lrs: the matrix
rate and the AdamW groups', moved from the recipe's base by the transfer rules);
the total FLOPs (each trial spends at most its budget, D = C / F in whole optimizer steps); and a wall-time
estimate from step times measured here in a few seconds.

A trial's optimizer step does not cost a fixed amount per FLOP: a small model's step is dominated by work that
does not grow with its tokens (the optimizers' updates, Muon's orthogonalisation, kernel launches), so the
FLOP/s of one shape over- or under-prices the others (here a width-8 step ran at a third of a width-40 step's
FLOP/s). The probe therefore times the trial's own step (its model, optimizers and batch, random tokens) at the
narrowest and the widest width the sweep may train and fits

    step seconds = step_s + step FLOPs / flops_per_s

through the two points, with the set-up each trial pays once (building the model and its optimizers, and the
first step's excess over a later one: torch.compile where the trial compiles). A trial at width s then takes
set-up + steps(s) x step seconds + F / 3 x val_tokens / flops_per_s (the validation pass) + Tune's overhead,
and a cell's first trial is priced at the first guess (where every study starts), the others at the mean over
the cell's feasible widths (the sampler spreads them across the window). The sweep's wall time is the sum over
stages of their trials' seconds divided by the trials side by side (no more than the stage has), plus Ray's
start. It reflects this machine, not a GPU
cluster the spec may be meant for.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import torch

from loopscale import objectives
from loopscale.analysis.flops import paper_grid_reference
from loopscale.model import (LoopedLM, count_params, flops_per_token, iso_depth_template, runtime,
                             tokens_for_budget)
from loopscale.objectives.recipe import build_optimizers

from . import space
from .spec import STAGES, Cell, SweepSpec

# Measured by tests/benchmarks/bench_overhead.py on this machine (2 cores): 0.31 s of wall time per trial with two
# side by side when Tune snapshots after every step (training), i.e. ~0.6 s per trial slot; ~10 s once per sweep
# for imports, ray.init (4 s) and a fresh MLflow store (1-7 s).
OVERHEAD_S_PER_TRIAL = 0.6
RAY_START_S = 10.0
PROBE_MAX_FLOPS = 2e11  # one probe step at most; about 2-5 s on two CPU cores


@dataclass(frozen=True)
class Throughput:
    """One trial's optimizer step here: ``step_s`` seconds plus its FLOPs at ``flops_per_s`` (module docstring)."""

    flops_per_s: float
    step_s: float
    shape: str
    device: str
    setup_s: float = 0.0  # once per trial: building the model and optimizers, the first step's extra (compile)

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
    (which can bracket a smaller cell's optimum for it), 3 in each r's largest cell and 1 in every other cell
    (its first); next to the paper grid's figure when the cells match it (analysis.flops)."""
    cap = floor = total_flops(spec)
    text = f"total: {cap:.3g} FLOPs (each trial spends at most its budget)"
    if spec.sampler == "law":
        top = {r: max(spec.budgets) for r in spec.recurrences}

        def fewest(c) -> int:
            return min(3 if not spec.branches or c.budget == top[c.r] else 1, c.n_trials)
        floor = sum(fewest(c) * c.budget for c in spec.cells()) + sum(
            c.n_trials * trial_flops(spec, c.budget) for c in spec.cells("calibrate"))
        least = "3 widths in each r's largest cell and 1 in the others (warmdown branches fill their brackets)" \
            if spec.branches else "3 widths per cell at least"
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


def measure_throughput(spec: SweepSpec, max_steps: int = 5, min_seconds: float = 0.5) -> Throughput | None:
    """Time the trial's own optimizer step (its threads, batch, model and optimizers) at the narrowest and the
    widest width the sweep may train, and fit the step time as affine in the step's FLOPs; None if not even the
    narrowest step is small enough to time quickly. A single timable width gives a pure FLOP rate."""
    device = runtime.pick_device("auto" if spec.gpus_per_trial > 0 else "cpu")  # no CUDA here: time the CPU
    shapes = sorted({(float(s), c.r, c) for stage in STAGES for c in spec.cells(stage) for s in c.widths},
                    key=lambda item: _step_flops(spec, item[0], item[1]))
    timable = [item for item in shapes
               if _step_flops(spec, item[0], item[1]) <= PROBE_MAX_FLOPS or device.type == "cuda"]
    if not timable:
        return None
    probes = [timable[0]] if len(timable) == 1 else [timable[0], timable[-1]]
    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, int(spec.cpus_per_trial)))  # as a trial runs; shared cores stay fair
    try:
        timed = [_time_steps(space.trial_config(spec, cell, s, recipe=spec.recipe), device, max_steps, min_seconds)
                 for s, _, cell in probes]
    finally:
        torch.set_num_threads(threads)
    shape = " and ".join(f"s={s:g} r={r} width {spec.model(s, r).width}" for s, r, _ in probes)
    shape += f", {spec.batch_tokens:,} tokens per step"
    setup = sum(setup_s for setup_s, _ in timed) / len(timed)
    points = [(_step_flops(spec, s, r), step_s) for (s, r, _), (_, step_s) in zip(probes, timed)]
    (f0, t0), (f1, t1) = points[0], points[-1]
    if len(timed) == 2 and f1 > f0 and t1 > t0:
        per_flop = (t1 - t0) / (f1 - f0)
        return Throughput(1.0 / per_flop, max(0.0, t0 - f0 * per_flop), shape, device.type, setup)
    return Throughput(f1 / t1, 0.0, shape, device.type, setup)  # one point (or noise made them disagree): a rate


def _step_flops(spec: SweepSpec, s: float, r: int) -> float:
    return float(flops_per_token(spec.model(s, r)) * spec.batch_tokens)


def _time_steps(trial_config: dict, device: torch.device, max_steps: int, min_seconds: float) -> tuple[float, float]:
    """(setup seconds, step seconds) of the trial's own optimizer step (forward + backward per micro-batch, every
    optimizer, compiled where the trial compiles) on random tokens: the step averaged over up to ``max_steps``
    timed steps; setup = building the model and optimizers plus the first step's excess over a later one."""
    torch.manual_seed(0)
    started = time.perf_counter()
    config = objectives.model_config(trial_config)
    recipe = objectives.normalize_recipe(trial_config.get("recipe"))
    model = LoopedLM(config).to(device)
    optimizers = build_optimizers(model, objectives.trial_lrs(trial_config), recipe)
    model, _ = runtime.maybe_compile(model, device, recipe["compile"])
    rows = trial_config["batch_tokens"] // config.seq_len
    micro = (recipe["micro_batch"] or trial_config["batch_tokens"]) // config.seq_len
    tokens = torch.randint(0, config.vocab_size, (rows, config.seq_len + 1), device=device)

    def step() -> None:
        for batch in tokens.split(micro):
            with runtime.autocast(device, recipe["bf16"]):
                loss = model(batch[:, :-1], batch[:, 1:])
            (loss / max(1, rows // micro)).backward()
        for optimizer in optimizers:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    step()
    _sync(device)
    first = time.perf_counter() - started
    started, steps = time.perf_counter(), 0
    while steps < max_steps and (steps == 0 or time.perf_counter() - started < min_seconds):
        step()
        steps += 1
    _sync(device)
    step_s = (time.perf_counter() - started) / steps
    return max(0.0, first - step_s), step_s


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def estimate_seconds(spec: SweepSpec, throughput: Throughput | None) -> float | None:
    trains = spec.objective == "train" or spec.calibrate is not None
    if trains and throughput is None:
        return None
    seconds = RAY_START_S
    for stage in STAGES:
        cells = spec.cells(stage)
        if not cells:
            continue
        trial_seconds = sum(c.n_trials * OVERHEAD_S_PER_TRIAL for c in cells)
        if stage == "calibrate" or spec.objective == "train":
            trial_seconds += sum(_cell_seconds(spec, c, throughput) for c in cells)
        # a stage with fewer trials than slots (a one-trial calibration) cannot fill them
        seconds += trial_seconds / min(spec.concurrency(stage, _cpus()), sum(c.n_trials for c in cells))
    return seconds


def _cell_seconds(spec: SweepSpec, cell: Cell, throughput: Throughput) -> float:
    """Seconds of the cell's trials: the first at the first guess (every study starts there), the others at
    the mean over the cell's feasible widths."""
    rest = sum(_trial_seconds(spec, cell, s, throughput) for s in cell.widths) / len(cell.widths)
    return _trial_seconds(spec, cell, cell.first_guess, throughput) + (cell.n_trials - 1) * rest


def _trial_seconds(spec: SweepSpec, cell: Cell, s: float, throughput: Throughput) -> float:
    """One trial at width s: its set-up, whole optimizer steps at the measured step time, and a forward pass
    (a third of F) per validation token."""
    config = spec.model(s, cell.r)
    f = flops_per_token(config)
    steps = tokens_for_budget(config, cell.budget, spec.batch_tokens) // spec.batch_tokens
    steps += round((trial_flops(spec, cell.budget) - cell.budget) / (f * spec.batch_tokens))  # branch warmdowns
    return (throughput.setup_s + steps * throughput.step_seconds(f * spec.batch_tokens)
            + f / 3 * spec.val_tokens / throughput.flops_per_s)


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
        lines.append(f"step time here: {throughput.step_s * 1e3:.0f} ms + FLOPs at {throughput.flops_per_s / 1e9:.1f} "
                     f"GFLOP/s, {throughput.setup_s:.1f} s set-up per trial ({throughput.device}, timed at "
                     f"{throughput.shape})")
    seconds = estimate_seconds(spec, throughput)
    lines.append(f"estimated wall time here: {_duration(seconds)} with {spec.concurrency('search', _cpus())} "
                 f"trials side by side"
                 if seconds is not None else
                 "estimated wall time here: not measured (even the narrowest model's step is too big to time "
                 "quickly on this machine)")
    return "\n".join(lines)


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
