"""What ``loopscale plan`` prints: its warnings first, the sweep's design, one line per cell (or with
``--widths`` each cell's table of widths), the FLOPs, the GPU time at a stated MFU when trials run on GPUs, the
measured step time and the wall-time estimate by part, ending with the ETA. Every number goes through
``analysis.numbers``, and every line fits ``numbers.COLUMNS``."""

from __future__ import annotations

from loopscale import objectives
from loopscale.analysis import numbers
from loopscale.analysis.rate_sensitivity import RATE_STAGE
from loopscale.model import account, iso_depth_template, tokens_for_budget

from ..spec import Cell, SweepSpec
from .flops import flops_estimate, gpu_hours_estimate, rate_sensitivity_estimate, rungs_estimate
from .kept import kept_bytes_range
from .walltime import Estimate, Throughput, cpus, estimate

def _sizes(spec: SweepSpec, cell: Cell, s: float) -> tuple[int, int, int, int, int]:
    """(width, N_once, N_rec, N, D) of the cell's model at width s."""
    config = spec.grid.model(s, cell.r)
    p = account(config)
    return config.width, p.N_once, p.N_rec, p.N, tokens_for_budget(config, cell.budget, spec.grid.batch_tokens)


def _trains(spec: SweepSpec, cell: Cell) -> bool:
    return spec.objective == "train" or cell.stage == "calibrate"


def cell_table(spec: SweepSpec, cell: Cell) -> str:
    """The cell's feasible widths with their sizes, tokens, tokens per parameter and (training) learning rates."""
    lr_groups = _lr_groups(spec) if _trains(spec, cell) else ()
    rows = [f"  {'':1} {'s':>5} {'width':>6} {'N_once':>8} {'N_rec':>8} {'N':>8} {'D':>8} {'D/N':>6} {'steps':>6}"
            + "".join(f" {label:>8}" for _, label in lr_groups)]
    for s in cell.widths:
        width, n_once, n_rec, n, tokens = _sizes(spec, cell, s)
        lrs = objectives.trial_lrs(spec.trial_config(cell, s)) if lr_groups else {}
        rows.append(f"  {'*' if s == cell.first_guess else '':1} {s:>5g} {width:>6} {numbers.count(n_once):>8} "
                    f"{numbers.count(n_rec):>8} {numbers.count(n):>8} {numbers.count(tokens):>8} "
                    f"{numbers.sig(tokens / n):>6} {numbers.count(tokens // spec.grid.batch_tokens):>6}"
                    + "".join(f" {numbers.sig(lrs[group]):>8}" for group, _ in lr_groups))
    return "\n".join(rows)


CELL_HEADER = (f"  {'cell':<14} {'trials':>6} {'widths':>6} {'s (first)':>11} {'width':>9} {'N (params)':>13} "
               f"{'D (tokens)':>13} {'D/N':>11} {'steps':>11} {'lr':>14}")


def cell_line(spec: SweepSpec, cell: Cell) -> str:
    """One cell on one line: its trials, how many widths it may try, and the range of s (its first guess in
    brackets), width, N, D, D/N, steps and (training) the matrices' learning rate over those widths."""
    sizes = [_sizes(spec, cell, s) for s in (cell.widths[0], cell.widths[-1])]
    (w0, _, _, n0, d0), (w1, _, _, n1, d1) = sizes
    s_range = f"{numbers.span(cell.widths[0], cell.widths[-1], _g)} ({cell.first_guess:g})"
    lr = ""
    if _trains(spec, cell):
        rates = [objectives.trial_lrs(spec.trial_config(cell, s))["matrices"] for s in (cell.widths[0], cell.widths[-1])]
        lr = numbers.span(*rates)
    steps = numbers.span(d0 // spec.grid.batch_tokens, d1 // spec.grid.batch_tokens, numbers.count)
    return (f"  {cell.key:<14} {cell.n_trials:>6} {len(cell.widths):>6} {s_range:>11} {numbers.span(w0, w1, _g):>9} "
            f"{numbers.span(n0, n1, numbers.count):>13} {numbers.span(d0, d1, numbers.count):>13} "
            f"{numbers.span(d0 / n0, d1 / n1, _tpp):>11} {steps:>11} {lr:>14}").rstrip()


def _g(value: float) -> str:
    return f"{value:g}"


def _tpp(value: float) -> str:
    """Tokens per parameter: three significant figures, whole numbers from 100 (2.5, 40.3, 321)."""
    return f"{value:.0f}" if value >= 100 else numbers.sig(value)


def _lr_groups(spec: SweepSpec) -> tuple[tuple[str, str], ...]:
    """(group, column label) of the learning rates a trial of this sweep uses."""
    groups = (("matrices", "lr"), ("embedding", "lr_emb"), ("lm_head", "lr_head"), ("norms", "lr_norm"))
    return groups + ((("lanes", "lr_lanes"),) if spec.grid.template.get("injection") == "hyperconnect" else ())


def _lr_note(spec: SweepSpec) -> str:
    """How the per-width learning rates were made, and what calibration changes."""
    recipe = objectives.normalize_recipe(spec.training.recipe)
    note = (f"learning rates: {recipe['optimizer']} matrices (lr) and AdamW groups, peak of each trial, moved from "
            f"base_lr {recipe['base_lr']:g} by the batch/data/width rules (objectives/lr_rules.py)")
    if spec.training.calibrate is not None:
        param = spec.training.calibrate.param
        note += f"; calibration tunes {param}" + (", and every matrix lr scales with it" if param == "base_lr" else "")
    return note


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


def render_plan(spec: SweepSpec, throughput: Throughput | None, widths: bool = False) -> str:
    """The plan's text; ``widths``: every cell's table of widths instead of one line per cell."""
    t = iso_depth_template(spec.grid.model_template())
    lines = edge_warnings(spec)
    lines += [
        f"sweep {spec.name!r}: objective {spec.objective}, sampler {spec.sampling.sampler}, seed {spec.sampling.seed}, "
        f"{len(spec.grid.budgets)} budgets x {len(spec.grid.recurrences)} recurrences = {len(spec.cells())} cells, "
        f"{spec.planned_trials()} trials",
        f"template: depth {t['depth']} (prelude {t['prelude']}, coda {t['coda']}), "
        f"width = {spec.grid.width_unit} s in heads of {spec.grid.head_dim}, seq_len {spec.grid.seq_len}, "
        f"vocab {t['vocab_size']}, "
        f"injection {t['injection']}; batch {numbers.count(spec.grid.batch_tokens)} tokens",
    ]
    if spec.objective == "train" or spec.training.calibrate is not None:
        lines.append(_lr_note(spec))
    for cell in spec.cells("calibrate"):
        cal = spec.training.calibrate
        lines.append(f"calibration: {cal.param} in [{cal.low:g}, {cal.high:g}] (log) at s={cal.s:g}, r={cal.r}, "
                     f"C={numbers.flops(cal.budget)}: {cal.trials} trials; the best rate goes to every search trial")
    guess = f"~{spec.grid.first_guess_tokens_per_param:g} tokens per parameter"
    if widths:
        for cell in spec.cells():
            lines += ["", f"cell {cell.key}: {cell.n_trials} trials over {len(cell.widths)} widths "
                          f"(* = first guess, {guess})", cell_table(spec, cell)]
        lines.append("")
    else:
        lines += ["", f"cells: each column low-high over the cell's widths (s in brackets: the first guess, {guess}; "
                      f"every width: --widths)"]
        trains = any(_trains(spec, cell) for cell in spec.cells())
        lines.append(CELL_HEADER if trains else CELL_HEADER.removesuffix("lr").rstrip())
        lines += [cell_line(spec, cell) for cell in spec.cells()]
    lines.append(flops_estimate(spec))
    lines += [line for line in (kept_line(spec), gpu_hours_estimate(spec), rungs_estimate(spec),
                                rate_sensitivity_estimate(spec)) if line]
    if throughput is not None:
        compile_note = f", {numbers.duration(throughput.compile_s)} compile warm-up per shape" if throughput.compile_s else ""
        lines.append(f"step time here: {numbers.sig(throughput.step_s * 1e3)} ms + FLOPs at "
                     f"{numbers.sig(throughput.flops_per_s / 1e9)} GFLOP/s with {throughput.side_by_side} trial(s) "
                     f"stepping at once, {numbers.duration(throughput.setup_s)} set-up per trial{compile_note} "
                     f"({throughput.device}, timed at {throughput.shape})")
    lines += render_estimate(spec, estimate(spec, throughput))
    return numbers.wrap("\n".join(lines))


def kept_line(spec: SweepSpec) -> str:
    """What keeping the trained models costs in MLflow's artifact store ("" when none are kept)."""
    models, low, high = kept_bytes_range(spec)
    if not models:
        return ""
    which = "each cell's best trial" if spec.placement.keep_models == "best" else "every trial that ends ok"
    return (f"kept models ([resources] keep_models = {spec.placement.keep_models!r}: {which}): up to {models}, "
            f"{numbers.span(low, high, _bytes)} of fp32 weights in MLflow (narrowest to widest widths)")


def _bytes(value: float) -> str:
    return f"{numbers.sig(value / 1e6)} MB"


def render_estimate(spec: SweepSpec, parts: Estimate | None) -> list[str]:
    """The wall-time estimate by part, ending with the ETA of search + analysis (what ``loopscale demo`` runs)."""
    if parts is None:
        return ["estimated wall time here: not measured (even the narrowest model's step is too big to time "
                "quickly on this machine)"]
    lines = [f"estimated wall time here: {spec.concurrency('search', cpus())} trials side by side",
             f"  {'start (imports, data, Ray, MLflow)':<36} {_duration(parts.start_s)}"]
    for stage, (low, high, trials) in parts.stages.items():
        why = ""
        if high != low:
            why = "; from the widths nearest each cell's first guess to its narrowest widths"
        if stage == "search" and spec.sampling.sampler == "law":
            why += "; the law sampler may stop cells early"
        if stage == "validate":
            why = "; widths guessed: the law the sweep fits picks them"
        if stage.startswith(RATE_STAGE):
            why = "; widths guessed: each cell's best search trial picks them"
        lines.append(f"  {stage + ' stage':<36} {_span(low, high)} ({trials} trials{why})")
    lines += [f"  {'= loopscale search':<36} {_span(*parts.sweep_s)}",
              f"  {'analysis (loopscale analyze)':<36} {_duration(parts.analysis_s)}"]
    demo = ""
    if spec.design() == SweepSpec.from_toml("demo").design() and not spec.sensitivity.factors:
        demo = " = the ETA of loopscale demo" + (" --validate" if spec.rungs.budgets else "")
    lines.append(f"ETA search + analysis: {_span(*parts.total_s)}{demo}")
    return lines


def _duration(seconds: float) -> str:
    """A wall-time estimate: to the second under 2 minutes, to the minute above (its seconds mean nothing)."""
    return numbers.duration(seconds if seconds < 120 else round(seconds / 60) * 60)


def _span(low: float, high: float) -> str:
    """``19 min-23 min``, the shorter first; one figure when both round alike."""
    return numbers.span(low, high, _duration)
