"""``loopscale plan SPEC --precision``: what phi's interval (and Delta-phi's against a baseline) will be for a
spec's design, what the design costs, and the cheapest design that reaches a target.

A forecast draws ``sims`` copies of the design's final-loss table (``design.Design.copy``) and fits each as
``analyze`` does (``analysis.precision``). Against a baseline, each copy is paired with a copy of the baseline's
design under one base law (E, A, alpha, B, beta) with phi_A for the baseline and phi_A + Delta for the spec.

The search (``cheapest``) builds every candidate's design (``candidates``), ranks them by the linearised screen
(``screen``) scaled by the ratio of the spec's own Monte Carlo half-width to its screen, and confirms by Monte
Carlo, cheapest FLOPs first, the candidates the screen expects to reach the target, until ``REPORTED`` meet it
or ``CONFIRM_LIMIT`` have been simulated.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from scipy import stats

from loopscale.analysis.options import FitOptions
from loopscale.analysis.precision import Forecast, forecast_delta, forecast_phi
from loopscale.model import JointLaw
from loopscale.objectives.noise import Noise

from ..spec import SweepSpec
from .candidates import buildable, candidates
from .design import Design, design_of
from .screen import linear_sd_phi

REPORTED = 3       # designs the search reports that meet the target
CONFIRM_LIMIT = 6  # candidates it simulates at most, beyond the spec's own
BASELINE_SEED = 500_000  # the baseline copies' noise seeds start here: independent of the spec's copies


@dataclass(frozen=True)
class Setting:
    """What a forecast assumes: the law, the noise (and where each comes from), the copies, the fit."""

    law: JointLaw
    noise: Noise
    law_source: str
    noise_source: str
    sims: int
    slots: int
    options: FitOptions


@dataclass(frozen=True, eq=False)
class Baseline:
    """The sweep Delta-phi is measured against: its phi, its design (None: the spec's own) and noise."""

    phi: float
    law: JointLaw          # the base law both sweeps share (its phi is the baseline's)
    noise: Noise
    design: Design | None
    source: str


@dataclass(frozen=True, eq=False)
class Outcome:
    """One design's forecast."""

    label: str
    sets: tuple[str, ...]
    design: Design
    phi: Forecast
    delta: Forecast | None


def forecast(spec: SweepSpec, setting: Setting, baseline: Baseline | None = None, delta: float | None = None,
             label: str = "the spec as it is", sets: tuple[str, ...] = (), design: Design | None = None) -> Outcome:
    """The spec's design (or ``design``) simulated ``setting.sims`` times: phi's interval, and with a baseline
    and ``delta`` Delta-phi's."""
    design = design or design_of(spec, setting.law, setting.noise, setting.slots)
    phi = forecast_phi((design.copy(setting.law, setting.noise, k) for k in range(setting.sims)), setting.options)
    shared = None
    if baseline is not None and delta is not None:
        variant = dataclasses.replace(baseline.law, phi=baseline.phi + delta)
        own = baseline.design or design
        shared = forecast_delta(((own.copy(baseline.law, baseline.noise, BASELINE_SEED + k),
                                  design.copy(variant, setting.noise, k)) for k in range(setting.sims)),
                                setting.options)
    return Outcome(label, sets, design, phi, shared)


@dataclass(frozen=True)
class Target:
    """What the search must reach: phi's median half-width at most ``half_width``, or the power ``power`` to
    tell Delta-phi = ``delta`` from 0."""

    half_width: float | None = None
    delta: float | None = None
    power: float | None = None

    def met(self, outcome: Outcome) -> bool:
        if self.half_width is not None:
            return outcome.phi.median <= self.half_width
        return outcome.delta is not None and outcome.delta.power("Delta = 0") >= self.power

    def screen_half_width(self, confidence: float) -> float:
        """The median half-width of phi that reaching the target asks for: ``half_width``; for a power, z (the
        test's two-sided quantile) times the sd at which |Delta| / sd = z + z_power, over sqrt(2) (two sweeps of
        about equal precision)."""
        if self.half_width is not None:
            return self.half_width
        z = stats.norm.ppf(1 - (1 - confidence) / 2)
        return z * abs(self.delta) / (z + stats.norm.ppf(self.power)) / 2 ** 0.5


@dataclass(frozen=True, eq=False)
class Search:
    """The search's result: the designs confirmed to meet the target (cheapest first), the best one simulated
    when none does, and how many candidates were screened and simulated."""

    met: list[Outcome]
    best: Outcome | None
    screened: int
    simulated: int


def cheapest(spec: SweepSpec, make: Callable[[tuple[str, ...]], SweepSpec], setting: Setting, own: Outcome,
             target: Target, baseline: Baseline | None = None, reported: int = REPORTED) -> Search:
    """The ``reported`` cheapest designs among ``candidates(spec)`` (each built by ``make`` from its ``--set``
    items) that reach ``target``, ``own`` being the spec's own forecast."""
    ratio = own.phi.median / (linear_sd_phi(own.design, setting.law, setting.noise) or float("nan"))
    limit = target.screen_half_width(setting.options.confidence)
    ranked = []
    for candidate in candidates(spec)[1:]:
        variant = buildable(make, candidate)
        if variant is None:
            continue
        design = design_of(variant, setting.law, setting.noise, setting.slots)
        ranked.append((ratio * linear_sd_phi(design, setting.law, setting.noise), candidate, variant, design))
    met = [own] if target.met(own) else []
    tried = [own]

    def simulate(candidate, variant, design) -> None:
        delta = target.delta if target.power is not None else None  # Delta's fits only where the target asks
        outcome = forecast(variant, setting, baseline, delta, candidate.label, candidate.sets, design)
        tried.append(outcome)
        if target.met(outcome):
            met.append(outcome)

    for expected, candidate, variant, design in sorted(ranked, key=lambda t: t[3].flops):
        if len(met) >= reported or len(tried) > CONFIRM_LIMIT:
            break
        if expected <= limit:
            simulate(candidate, variant, design)
    if not met and ranked:  # what the most precise candidate by the screen reaches
        _, candidate, variant, design = min(ranked, key=lambda t: t[0])
        if all(o.sets != candidate.sets for o in tried):
            simulate(candidate, variant, design)
    met.sort(key=lambda o: o.design.flops)
    best = None if met else min(tried, key=lambda o: _shortfall(o, target))
    return Search(met=met[:reported], best=best, screened=len(ranked) + 1, simulated=len(tried))


def _shortfall(outcome: Outcome, target: Target) -> float:
    if target.half_width is not None:
        return outcome.phi.median
    return -outcome.delta.power("Delta = 0") if outcome.delta is not None else 0.0
