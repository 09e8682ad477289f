"""What ``loopscale plan SPEC --precision`` prints: the assumptions, phi's forecast interval and tests, Delta-phi's
against a baseline, the design's cost in FLOPs and GPU-hours, and the search's cheapest designs. Numbers go
through ``analysis.numbers``; every line fits its ``COLUMNS``."""

from __future__ import annotations

from loopscale.analysis import numbers
from loopscale.analysis.precision import Forecast, share_error
from loopscale.model import JointLaw
from loopscale.objectives.noise import Noise

from ..plan.flops import gpu_hours, trial_flops
from ..spec import SweepSpec
from .candidates import searched_range
from .forecast import Baseline, Outcome, Search, Setting, Target


def calibration_flops(spec: SweepSpec) -> float:
    """What the spec's calibration stage spends (every planned trial), beside the design's search trials."""
    return sum(c.n_trials * trial_flops(spec, c.budget) for c in spec.cells("calibrate"))


def _law(law: JointLaw) -> str:
    return ", ".join(f"{k} {numbers.sig(v)}" for k, v in law.to_dict().items())


def _noise(noise: Noise) -> str:
    return (f"{numbers.sig(noise.noise)} nats per run, {numbers.sig(noise.cell_noise)} per cell (offset), "
            f"{numbers.sig(noise.misspec)} smooth in width")


def _share(value: float, n: int) -> str:
    return f"{100 * value:.0f}% (+-{100 * share_error(value, n):.0f}%)"


def _half_width(f: Forecast) -> str:
    lo, hi = f.range80
    return (f"median {numbers.sig(f.median)} (+-{numbers.sig(f.median_error, 2)} Monte Carlo), 80% of copies "
            f"{numbers.span(lo, hi, numbers.sig)}")


def _unidentified(f: Forecast, name: str) -> str:
    """Where some copies' verdicts are "not identified", how many: they count in no power, and their intervals'
    hulls are in the half-width."""
    if not f.unidentified:
        return ""
    return (f"; {name} not identified in {round(f.unidentified * f.n)} of {f.n} copies (an interval in separate "
            "stretches or reaching the fit's bound), which count in no power")


def cost_line(spec: SweepSpec, outcome: Outcome, mfu: float, peak: float) -> str:
    flops = outcome.design.flops + calibration_flops(spec)
    calibration = f", calibration {numbers.flops(calibration_flops(spec))} of it" if calibration_flops(spec) else ""
    return (f"~{numbers.flops(flops)} FLOPs ({outcome.design.trials} trials with their warmdown branches"
            f"{calibration}), ~{numbers.sig(gpu_hours(flops, mfu, peak))} GPU-hours at {mfu:.0%} MFU of "
            f"{numbers.sig(peak / 1e12)} TFLOP/s")


def render_precision(spec: SweepSpec, setting: Setting, own: Outcome, *, baseline: Baseline | None,
                     delta: float | None, mfu: float, peak: float, target: Target | None = None,
                     search: Search | None = None) -> str:
    pct = f"{100 * setting.options.confidence:.0f}%"
    runs = own.design.runs
    cells = runs.groupby(["budget_flops", "r"]).ngroup().nunique()
    lines = [
        f"precision forecast for sweep {spec.name!r}: {setting.sims} simulated copies of its design "
        f"({own.design.trials} trials, {len(runs)} runs over {cells} cells, as its {spec.sampling.sampler} sampler "
        f"proposes them under the law below on {setting.slots} slot(s)), each fitted as `loopscale analyze` fits "
        f"(phi's {pct} profile interval and its F tests)",
        f"law: {setting.law_source} ({_law(setting.law)})",
        f"noise: {_noise(setting.noise)} ({setting.noise_source})",
        f"phi's {pct} interval half-width: {_half_width(own.phi)}",
        f"power to reject phi = 0: {_share(own.phi.power('phi = 0'), own.phi.n)}; phi = 1: "
        f"{_share(own.phi.power('phi = 1'), own.phi.n)}" + _unidentified(own.phi, "phi"),
    ]
    if own.delta is not None and baseline is not None:
        power = _share(own.delta.power("Delta = 0"), own.delta.n)
        lines += [f"Delta-phi against the baseline ({baseline.source}, phi {numbers.sig(baseline.phi)}, noise "
                  f"{_noise(baseline.noise)}) at Delta = {delta:g}, one model with a shared base law: half-width "
                  f"{_half_width(own.delta)}; power to tell it from 0: {power}" + _unidentified(own.delta, "Delta-phi")]
    lines.append(f"cost: {cost_line(spec, own, mfu, peak)}")
    if search is not None and target is not None:
        lines += search_lines(spec, search, target, mfu, peak)
    lines.append(f"Monte Carlo: +- is one standard error over the {setting.sims} copies (--sims); the design is one "
                 f"draw of the sampler (seed {spec.sampling.seed}), held fixed while the losses are redrawn")
    return numbers.wrap("\n".join(lines))


def _goal(target: Target) -> str:
    if target.half_width is not None:
        return f"to measure phi to +-{target.half_width:g} (median half-width)"
    return f"to tell Delta-phi = {target.delta:g} from 0 with {target.power:.0%} power"


def _reached(outcome: Outcome, target: Target) -> str:
    if target.half_width is not None:
        return f"half-width {numbers.sig(outcome.phi.median)}"
    return f"power {_share(outcome.delta.power('Delta = 0'), outcome.delta.n)}" if outcome.delta else ""


def search_lines(spec: SweepSpec, search: Search, target: Target, mfu: float, peak: float) -> list[str]:
    head = (f"cheapest designs {_goal(target)} ({search.screened} screened by the linearised fit, "
            f"{search.simulated} simulated):")
    if search.met:
        return [head] + [f"  {o.label}: {cost_line(spec, o, mfu, peak)}; {_reached(o, target)}; "
                         f"--set {' --set '.join(repr(s) for s in o.sets)}" for o in search.met]
    best = search.best
    return [head, f"  none in the searched range ({searched_range()}) reaches it; the best simulated, {best.label}: "
                  f"{_reached(best, target)}, {cost_line(spec, best, mfu, peak)}"]
