"""The joint fit next to the paper's comparisons (Schwethelm et al. 2026, arXiv 2604.21106): phi fixed at 0 and
at 1, and a Chinchilla fit per r."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pandas as pd

from .fit import fit_joint_law
from .fit_problem import fit_rows, with_overrides
from .fit_types import LawFit
from .identify import with_identification
from .options import DEFAULT_FIT_OPTIONS, FitOptions
from .runs import usable_runs


@dataclass(frozen=True, eq=False)
class FitSuite:
    """The joint fit next to the paper's comparisons: phi fixed at 0 and at 1, and a Chinchilla fit per r.

    Runs of a single r have no comparisons (``phi0``, ``phi1`` None, ``per_r`` empty): at one r every phi gives
    the same fit, and the one per-r fit is the joint fit itself."""

    joint: LawFit
    phi0: LawFit | None
    phi1: LawFit | None
    per_r: dict[int, LawFit]

    @property
    def restricted(self) -> bool:
        """Whether the comparison fits were run (runs of more than one r)."""
        return self.phi0 is not None

    def table(self) -> pd.DataFrame:
        """One row per fit: the constants, phi's interval, R^2, RMSE, max residual, status."""
        rows = [("joint", self.joint)]
        if self.restricted:
            rows += [("phi=0", self.phi0), ("phi=1", self.phi1)]
        rows += [(f"r={r} (Chinchilla)", fit) for r, fit in sorted(self.per_r.items())]
        return pd.DataFrame([{"fit": name, "E": f.E, "A": f.A, "alpha": f.alpha, "B": f.B, "beta": f.beta,
                              "phi": f.phi, "phi_lo": f.phi_ci[0], "phi_hi": f.phi_ci[1], "r2": f.r2,
                              "rmse": f.rmse, "max_residual": f.max_residual, "n_runs": f.n_runs,
                              "status": f.status.value} for name, f in rows])


def fit_suite(runs: pd.DataFrame, *, options: FitOptions = DEFAULT_FIT_OPTIONS,
              progress: Callable[[str], None] | None = None, **overrides: Any) -> FitSuite:
    """``fit_joint_law`` with bootstrap, the restricted fits (phi = 0, phi = 1) and per-r Chinchilla fits.

    The comparison fits skip the bootstrap: only the joint fit's interval is reported. A joint fit that
    converged although its phi is not identified (its interval reaches a bound, or phi = 0 fits as well) is
    returned as UNIDENTIFIED with the reasons in ``warnings`` (``analysis.identify``). A per-r fit is
    L = E + A N^-alpha + B D^-beta on that r's runs (phi fixed at 0 makes N_eff = N_once + N_rec = N);
    r values with too few runs for five parameters are left out; runs of a single r get none of these
    (``FitSuite``). ``progress`` is called with a line before each fit (the joint fit with its bootstrap takes
    most of the time).
    """
    options = with_overrides(options, overrides)
    say = progress or (lambda line: None)
    say(f"joint fit: {options.n_starts} starts, {options.n_bootstrap} bootstrap resamples")
    joint = fit_joint_law(runs, options=options)
    usable = usable_runs(runs, stage=options.stage)
    recurrences = sorted(usable["r"].unique())
    if len(recurrences) == 1:
        return FitSuite(joint=joint, phi0=None, phi1=None, per_r={})
    quick = dataclasses.replace(options, n_bootstrap=0)
    say("restricted fits: phi = 0, phi = 1")
    phi0 = fit_joint_law(runs, options=quick, fix_phi=0.0)
    phi1 = fit_joint_law(runs, options=quick, fix_phi=1.0)
    joint = with_identification(joint, phi0, options.bounds)
    per_r = {}
    say(f"per-r Chinchilla fits: r = {', '.join(str(int(r)) for r in recurrences)}")
    for r in recurrences:
        subset = usable[usable["r"] == r]
        if len(fit_rows(subset, options)) > 5:
            per_r[int(r)] = fit_joint_law(subset, options=quick, fix_phi=0.0)
    return FitSuite(joint=joint, phi0=phi0, phi1=phi1, per_r=per_r)
