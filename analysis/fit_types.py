"""What a fit of the joint law returns: ``LawFit`` (constants, intervals, diagnostics) and its ``FitStatus``.

The law's public constants are (E, A, alpha, B, beta, phi) (``CONSTANTS``); the optimiser works on theta =
(a, alpha, b, beta, e, phi) with A = e^a, B = e^b, E = e^e (``options.THETA``), and ``constants_of`` maps one to
the other.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from loopscale.model import JointLaw

from . import numbers

# The public constants, in this order; the internal order of theta is options.THETA.
CONSTANTS = ("E", "A", "alpha", "B", "beta", "phi")


class FitStatus(enum.Enum):
    CONVERGED = "converged"
    AT_BOUND = "at_bound"            # a free parameter sits on its bound: the optimum may lie outside
    STOPPED_EARLY = "stopped_early"  # the projected gradient at the answer is not small
    UNIDENTIFIED = "unidentified"    # converged, but the data do not determine phi (analysis.identify)


@dataclass(frozen=True, eq=False)
class LawFit:
    """A fitted joint law with its diagnostics. ``ci`` holds the bootstrap percentile interval of every constant;
    ``interval`` says which bootstrap made it ("block" or "residual")."""

    E: float
    A: float
    alpha: float
    B: float
    beta: float
    phi: float
    phi_ci: tuple[float, float]
    ci: dict[str, tuple[float, float]]
    r2: float                        # 1 - SS_res / SS_tot of the loss in nats over the fitted rows
    rmse: float                      # nats
    rmse_per_r: dict[int, float]
    max_residual: float              # largest |L - L_hat|, nats
    huber: float                     # the minimised objective
    status: FitStatus
    message: str
    at_bound: tuple[str, ...]
    fixed_phi: float | None
    data: str
    n_runs: int
    n_cells: int
    n_shared_trials: int             # trials whose branch points the block bootstrap resampled with them
    n_starts: int                    # starts the fit ran: the projected grid's local minima (analysis.projection)
    n_starts_at_best: int            # starts that ended at the best objective
    n_bootstrap: int
    interval: str
    bootstrap_stopped_early: int
    confidence: float
    bootstrap: np.ndarray = field(repr=False)  # (n_bootstrap, 6) in CONSTANTS order; read it through draws()
    warnings: tuple[str, ...] = ()   # why phi is not identified (status UNIDENTIFIED)
    single_r: int | None = None      # the one r of a single-r table: the plain law, phi not applicable
    # what the fit says about phi (analysis.identify, from analysis.profile_interval); '' and NaN until it is judged
    verdict: str = ""
    phi_profile_ci: tuple[float, float] = (np.nan, np.nan)  # the hull of phi_profile_stretches
    phi_profile_stretches: tuple[tuple[float, float], ...] = ()  # the interval: one stretch, or the test's several
    p_phi0: float = np.nan           # the F test of phi = 0 against the fit
    p_phi1: float = np.nan           # and of phi = 1

    @property
    def phi_applicable(self) -> bool:
        """False for a single-r table, fitted as the plain law L = E + A N^-alpha + B D^-beta with
        N = N_once + N_rec (phi held at 0): one r cannot tell r^phi N_rec from A."""
        return self.single_r is None

    def phi_text(self) -> str:
        """phi as a line reads it: its value with its interval, fixed, or not applicable (a single r)."""
        if not self.phi_applicable:
            return f"phi not applicable (one r, r={self.single_r}: the plain law L = E + A N^-alpha + B D^-beta)"
        if self.fixed_phi is not None:
            return f"phi {self.fixed_phi:g} (fixed)"
        pct = f"{100 * self.confidence:.0f}%"
        intervals = []
        if self.phi_profile_stretches:
            intervals.append(f"{pct} profile CI {numbers.stretches(self.phi_profile_stretches)}")
        intervals.append(f"bootstrap {pct} CI {self.phi_ci[0]:.3f} to {self.phi_ci[1]:.3f}" if self.n_bootstrap
                         else "no bootstrap")
        return f"phi {self.phi:.3f} ({'; '.join(intervals)})"

    def outside_bootstrap(self) -> list[str]:
        """Where an estimate lies outside its own bootstrap interval, a line for each such constant: the
        percentile interval of the resamples' refits then does not hold the data's fit (its refits settle in another
        stretch of a flat or many-valleyed objective, or are biased to one side), so it does not bound it."""
        lines = []
        for name in CONSTANTS:
            value, (lo, hi) = getattr(self, name), self.ci[name]
            if np.isfinite(lo) and np.isfinite(hi) and not lo <= value <= hi:
                side = "above" if lo > value else "below"
                lines.append(f"the bootstrap interval of {name} ({numbers.span(lo, hi)}) lies wholly {side} its "
                             f"estimate {numbers.sig(value)}: the resamples' refits settle away from the data's fit, "
                             "so it does not bound that estimate")
        return lines

    def draws(self) -> pd.DataFrame:
        """The bootstrap draws by name: one row per resample, one column per constant (E, A, alpha, B, beta,
        phi); empty when the fit ran no bootstrap. A fixed phi is that value in every row."""
        return pd.DataFrame(self.bootstrap, columns=list(CONSTANTS))

    @property
    def law(self) -> JointLaw:
        return JointLaw(E=self.E, A=self.A, alpha=self.alpha, B=self.B, beta=self.beta, phi=self.phi)

    def predict(self, runs: pd.DataFrame) -> np.ndarray:
        """Predicted loss (nats) of each row of a runs table."""
        return np.asarray(self.law.loss(runs["N_once"].to_numpy(float), runs["N_rec"].to_numpy(float),
                                        runs["r"].to_numpy(float), runs["tokens"].to_numpy(float)))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (the bootstrap draws are summarised by ``ci``)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "bootstrap"}
        out["status"] = self.status.value
        out["phi_ci"] = list(self.phi_ci)
        out["phi_profile_ci"] = list(self.phi_profile_ci)
        out["phi_profile_stretches"] = [list(part) for part in self.phi_profile_stretches]
        out["ci"] = {k: list(v) for k, v in self.ci.items()}
        out["rmse_per_r"] = {str(k): v for k, v in self.rmse_per_r.items()}
        out["at_bound"] = list(self.at_bound)
        out["warnings"] = list(self.warnings)
        out["phi_applicable"] = self.phi_applicable
        return out


def constants_of(theta: np.ndarray) -> np.ndarray:
    """(K, 6) theta (a, alpha, b, beta, e, phi) -> (K, 6) constants (E, A, alpha, B, beta, phi)."""
    a, alpha, b, beta, e, phi = theta.T
    return np.stack([np.exp(e), np.exp(a), alpha, np.exp(b), beta, phi], axis=1)


def law_of(theta: np.ndarray) -> JointLaw:
    """The joint law at one theta (6,) in THETA order."""
    return JointLaw(**dict(zip(CONSTANTS, constants_of(theta[None])[0])))
