"""What ``loopscale plan`` prints: the sweep's design, each cell's table of widths, the edge warnings, the FLOPs,
the measured step time and the wall-time estimate by part, ending with the ETA."""

from __future__ import annotations

from loopscale import objectives
from loopscale.model import account, iso_depth_template, tokens_for_budget

from ..spec import Cell, SweepSpec
from .flops import flops_estimate
from .walltime import Estimate, Throughput, cpus, estimate


def cell_table(spec: SweepSpec, cell: Cell) -> str:
    """The cell's feasible widths with their sizes, tokens, tokens per parameter and (training) learning rates."""
    trains = spec.objective == "train" or cell.stage == "calibrate"
    lr_groups = _lr_groups(spec) if trains else ()
    rows = [f"  {'':1} {'s':>5} {'width':>6} {'N_once':>11} {'N_rec':>11} {'N':>11} {'D':>11} {'D/N':>7} {'steps':>7}"
            + "".join(f" {label:>8}" for _, label in lr_groups)]
    for s in cell.widths:
        config = spec.model(s, cell.r)
        p = account(config)
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
    lines = [f"estimated wall time here: {spec.concurrency('search', cpus())} trials side by side",
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


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 3 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.0f} days"
