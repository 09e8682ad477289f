"""``loopscale plan SPEC``: what a sweep will run and roughly how long, without training anything.

Per cell, every feasible width with N_once, N_rec, D and tokens per parameter (the first guess marked) and,
when the sweep trains, the peak learning rates that width's trial will use (objectives.trial_lrs: the matrix
rate and the AdamW groups', moved from the recipe's base by the transfer rules);
the total FLOPs (each trial spends at most its budget, D = C / F in whole optimizer steps); and a wall-time
estimate from a throughput measured here in a second or two:

    wall ~ (sum over trials of (C + F / 3 x val_tokens) + trials x per-trial overhead) / (trials side by side)

with C in seconds at the FLOP/s of ONE trial measured here: a few optimizer steps of one of the sweep's own
shapes (the middle cell's first guess, or the narrowest width when that step is too big to time quickly) with
the trial's own thread count. It reflects this machine, not a GPU cluster the spec may be meant for.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import torch

from loopscale import objectives
from loopscale.analysis.flops import paper_grid_reference
from loopscale.model import LoopedConfig, LoopedLM, count_params, flops_per_token, runtime, tokens_for_budget

from .spec import STAGES, Cell, SweepSpec

# Measured by tests/benchmarks/bench_overhead.py on this machine (2 cores): 0.31 s of wall time per trial with two
# side by side when Tune snapshots after every step (training), i.e. ~0.6 s per trial slot; ~10 s once per sweep
# for imports, ray.init (4 s) and a fresh MLflow store (1-7 s).
OVERHEAD_S_PER_TRIAL = 0.6
RAY_START_S = 10.0
PROBE_MAX_FLOPS = 2e11  # one probe step at most; about 2-5 s on two CPU cores


@dataclass(frozen=True)
class Throughput:
    flops_per_s: float
    shape: str
    device: str


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


def total_flops(spec: SweepSpec) -> float:
    """Upper bound on the FLOPs of every planned trial (a trial spends its budget to within one step)."""
    return sum(c.n_trials * c.budget for stage in STAGES for c in spec.cells(stage))


def flops_estimate(spec: SweepSpec) -> str:
    """The FLOPs the sweep may spend: every planned trial, or with the law sampler, which stops a cell once its
    optimum is located, between 3 widths per cell and the cap; next to the paper grid's figure when the cells
    match it (analysis.flops)."""
    cap = total_flops(spec)
    text = f"total: {cap:.3g} FLOPs (each trial spends at most its budget)"
    if spec.sampler == "law":
        floor = sum(min(3, c.n_trials) * c.budget for c in spec.cells()) + sum(
            c.n_trials * c.budget for c in spec.cells("calibrate"))
        text = (f"total: {floor:.3g} to {cap:.3g} FLOPs (the law sampler stops a cell once its optimum is located: "
                f"3 widths per cell at least, trials_per_cell at most)")
    reference = paper_grid_reference(spec.budgets, spec.recurrences, spec.model_template(), spec.batch_tokens)
    if reference is not None:
        text += f"; the paper's grid of 116 runs spent {reference:.3g} ({cap / reference:.0%} at most here)"
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
    """Training FLOP/s of one trial (its threads) over a few AdamW steps of one of the sweep's shapes here;
    None if no shape is small enough to time quickly."""
    device = runtime.pick_device("auto" if spec.gpus_per_trial > 0 else "cpu")  # no CUDA here: time the CPU
    cells = spec.cells()
    middle = cells[len(cells) // 2]
    for s, r in ((middle.first_guess, middle.r), (spec.s_min, spec.recurrences[0])):
        config = spec.model(s, r)
        rows = max(1, min(spec.batch_tokens, 2048) // config.seq_len)
        step_flops = flops_per_token(config) * rows * config.seq_len
        if step_flops <= PROBE_MAX_FLOPS or device.type == "cuda":
            threads = torch.get_num_threads()
            torch.set_num_threads(max(1, int(spec.cpus_per_trial)))  # as a trial runs; shared cores stay fair
            try:
                seconds, steps = _time_steps(config, rows, device, max_steps, min_seconds)
            finally:
                torch.set_num_threads(threads)
            return Throughput(step_flops * steps / seconds,
                              f"s={s:g} r={r} width {config.width}, {rows} x {config.seq_len} tokens", device.type)
    return None


def _time_steps(config: LoopedConfig, rows: int, device: torch.device, max_steps: int,
                min_seconds: float) -> tuple[float, int]:
    """(seconds, steps) of timed forward + backward + AdamW steps on random tokens, after one warm-up step."""
    torch.manual_seed(0)
    model = LoopedLM(config).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, config.vocab_size, (rows, config.seq_len + 1), device=device)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        model(tokens[:, :-1], tokens[:, 1:]).backward()
        optimizer.step()

    step()
    _sync(device)
    started, steps = time.perf_counter(), 0
    while steps < max_steps and (steps == 0 or time.perf_counter() - started < min_seconds):
        step()
        steps += 1
    _sync(device)
    return time.perf_counter() - started, steps


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
            # training spends the budget; the validation pass costs a forward pass, a third of F, per token
            evaluation = [flops_per_token(spec.model(c.first_guess, c.r)) / 3 * spec.val_tokens for c in cells]
            trial_seconds += sum(c.n_trials * (c.budget + e) for c, e in zip(cells, evaluation)) \
                / throughput.flops_per_s
        seconds += trial_seconds / spec.concurrency(stage, _cpus())
    return seconds


def render_plan(spec: SweepSpec, throughput: Throughput | None) -> str:
    t = spec.model_template()
    lines = [
        f"sweep {spec.name!r}: objective {spec.objective}, sampler {spec.sampler}, seed {spec.seed}, "
        f"{len(spec.budgets)} budgets x {len(spec.recurrences)} recurrences = {len(spec.cells())} cells, "
        f"{spec.planned_trials()} trials",
        f"template: depth {t.get('depth', 20)} (prelude {t.get('prelude', 2)}, coda {t.get('coda', 2)}), "
        f"width = {spec.width_unit} s in heads of {spec.head_dim}, seq_len {spec.seq_len}, vocab {t['vocab_size']}, "
        f"injection {t.get('injection', 'linear')}; batch {spec.batch_tokens:,} tokens",
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
        lines.append(f"throughput here: {throughput.flops_per_s / 1e9:.1f} GFLOP/s per trial "
                     f"({throughput.device}, {throughput.shape})")
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
