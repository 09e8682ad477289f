"""Depth at evaluation: per kept model, its loss against the recurrences it was evaluated at (``loopscale evaluate
--r``), fitted by the saturating exponential decay that test-time looping follows (Prairie et al., "Parcae:
Scaling Laws For Stable Looped Language Models", arXiv 2604.12946, 2026):

    L(r_eval) = L_inf + A exp(-k r_eval),    k > 0

by least squares over the r_eval >= the trained r (where looping more can only refine what training taught; a
model read at fewer loops than it was trained with is another regime), from at least 4 of them. ``r_flat`` is
where the gain still to come, A exp(-k r), falls to ``FLAT_NATS``: ln(A / FLAT_NATS) / k, the trained r when it
is there already. A model whose loss rises with r_eval (A < 0: looping past training hurts) has no r_flat.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy.optimize import curve_fit

FLAT_NATS = 0.01
MIN_POINTS = 4
CURVE_COLUMNS = ("run_id", "budget_flops", "r", "points", "L_inf", "A", "k", "r_flat", "rmse")


def _decay(r: np.ndarray, l_inf: float, a: float, k: float) -> np.ndarray:
    return l_inf + a * np.exp(-k * r)


def depth_curves(depth: pd.DataFrame) -> pd.DataFrame:
    """One row per kept model of ``depth`` (analysis/depth.py's table) with enough r_eval at or above its trained
    r: the fitted L_inf, A, k, r_flat and the fit's rmse (module docstring); empty, with its columns, otherwise."""
    rows = []
    for run_id, mine in depth.groupby("run_id", sort=False):
        r = int(mine["r"].iloc[0])
        above = mine[mine["r_eval"] >= r].sort_values("r_eval")
        if len(above) < MIN_POINTS:
            continue
        x, y = above["r_eval"].to_numpy(float), above["val_loss_r_eval"].to_numpy(float)
        start = (y[-1], y[0] - y[-1], 1.0 / max(x.mean(), 1.0))
        try:
            (l_inf, a, k), _ = curve_fit(_decay, x, y, p0=start, bounds=([-np.inf, -np.inf, 1e-6], np.inf),
                                         maxfev=20_000)
        except RuntimeError:  # no least-squares optimum within its evaluations: no curve for this model
            continue
        flat = float(max(r, math.log(a / FLAT_NATS) / k)) if a > FLAT_NATS else (float(r) if a > 0 else math.nan)
        rows.append({"run_id": run_id, "budget_flops": mine["budget_flops"].iloc[0], "r": r, "points": len(above),
                     "L_inf": float(l_inf), "A": float(a), "k": float(k), "r_flat": flat,
                     "rmse": float(np.sqrt(np.mean((_decay(x, l_inf, a, k) - y) ** 2)))})
    return pd.DataFrame(rows, columns=list(CURVE_COLUMNS))
