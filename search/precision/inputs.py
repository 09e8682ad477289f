"""What a precision forecast assumes, from the command's inputs: the law and noise (a pilot sweep's fit and
measured scatter; else the spec's ``[simulate]`` table, whose law defaults to the paper's fit and whose noise to
the simulated objective's sizes), and the baseline of Delta-phi (a sweep's fit and design, or a stated phi)."""

from __future__ import annotations

import pandas as pd

from loopscale.analysis import fit_joint_law
from loopscale.analysis.options import FitOptions
from loopscale.analysis.precision import measured_noise, quick_options
from loopscale.analysis.runs import load_runs, own_rows, usable_runs
from loopscale.model import PAPER_LAW, JointLaw
from loopscale.objectives.noise import Noise

from ..spec import SweepSpec
from .design import Design
from .forecast import Baseline, Setting

DESIGN_COLUMNS = ("run_id", "branch_of", "status", "stage", "budget_flops", "r", "width", "N_once", "N_rec", "tokens",
                  "flops_spent")


def measured(experiment: str, tracking_uri: str | None, options: FitOptions) -> tuple[JointLaw, Noise, Design]:
    """A finished sweep's fitted law, its measured noise (scatter within cells, offsets of cells; no separate
    misspecification: the residuals hold it) and its design (its fitted runs)."""
    runs = load_runs(experiment, tracking_uri)
    fit = fit_joint_law(runs, options=quick_options(options))
    within, offsets = measured_noise(fit, runs, options)
    table = usable_runs(runs, stage=options.stage)[list(DESIGN_COLUMNS)].reset_index(drop=True)
    # a table without widths (another model family's runs): each run its own key for its noise draw
    table["width"] = table["width"].fillna(pd.Series(range(1, len(table) + 1), dtype=float))
    own = table[own_rows(table)]
    design = Design(runs=table, trials=len(own), flops=float(own["flops_spent"].sum()))
    return fit.law, Noise(noise=within, cell_noise=offsets, misspec=0.0), design


def setting_of(spec: SweepSpec, pilot: str | None, tracking_uri: str | None, sims: int, slots: int,
               options: FitOptions) -> Setting:
    """The forecast's law and noise: the pilot's, else the spec's ``[simulate]`` ones."""
    if pilot:
        law, noise, _ = measured(pilot, tracking_uri, options)
        return Setting(law=law, noise=noise, law_source=f"the fit of pilot sweep {pilot!r}",
                       noise_source=f"measured on {pilot!r}", sims=sims, slots=slots, options=options)
    sim = spec.simulation
    law = JointLaw(**sim.law) if sim.law else PAPER_LAW
    return Setting(law=law, noise=Noise(noise=sim.noise, cell_noise=sim.cell_noise, misspec=sim.misspec),
                   law_source="the spec's [simulate] law" if sim.law else "the paper's fit",
                   noise_source="the spec's [simulate] sizes", sims=sims, slots=slots, options=options)


def baseline_of(setting: Setting, experiment: str | None, phi: float | None, tracking_uri: str | None) -> Baseline:
    """The baseline: a sweep (its fit is the base law, its runs the design), else the forecast's law with phi
    held at ``phi`` (default: the law's own) on the spec's design."""
    if experiment:
        law, noise, design = measured(experiment, tracking_uri, setting.options)
        return Baseline(phi=law.phi, law=law, noise=noise, design=design, source=f"sweep {experiment!r}")
    held = setting.law.phi if phi is None else phi
    law = JointLaw(**{**setting.law.to_dict(), "phi": held})
    return Baseline(phi=held, law=law, noise=setting.noise, design=None, source="the spec's design")

