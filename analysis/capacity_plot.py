"""The figure of ``export --plot``: the law's loss against unique parameters N at each fixed budget, one curve per
r, every buildable width trained for the whole steps its budget buys; the model the table chose per r (under its
constraints) marked, the best of the budget starred, and a --max-params cap drawn where there is one.

It answers "what does a parameter cap cost at this budget": left of the uncapped optima every curve falls with N,
and where a looped curve lies below r = 1's at the same N, looping wins at that cap.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from loopscale.model import JointLaw

from . import numbers
from .allocation import built_models, stacked
from .fit_types import LawFit
from .sizes import PAPER_BATCH_TOKENS, SizeCurve

SPAN = 3.0  # widths drawn: up to SPAN x the widest chosen model of the budget


def capacity_figure(law: LawFit | JointLaw, table: pd.DataFrame, *, template: dict[str, Any] | None = None,
                    batch_tokens: int = PAPER_BATCH_TOKENS, max_params: float | None = None) -> Figure:
    """One panel per budget of ``table`` (``constrained.allocation_under``'s), one curve per r."""
    law = law.law if isinstance(law, LawFit) else law
    budgets = list(dict.fromkeys(table["budget_flops"]))
    fig = Figure(figsize=(6.0 * min(len(budgets), 2), 4.5 * int(np.ceil(len(budgets) / 2))), layout="constrained")
    FigureCanvasAgg(fig)
    axes = np.atleast_1d(fig.subplots(int(np.ceil(len(budgets) / 2)), min(len(budgets), 2), squeeze=False).ravel())
    for ax, budget in zip(axes, budgets):
        rows = table[table["budget_flops"] == budget]
        widest, lowest = float(rows["width"].max()), np.inf
        for i, (_, row) in enumerate(rows.iterrows()):
            curve = SizeCurve.from_model(int(row["r"]), template)
            widths = curve.head_dim * np.arange(1, int(SPAN * widest / curve.head_dim) + 1, dtype=float)
            loss = built_models(stacked([law]), curve, widths, budget, batch_tokens)["loss_built"]
            ax.plot(curve.sizes(widths)["N"], loss, color=f"C{i}", label=f"r={int(row['r'])}")
            lowest = min(lowest, float(np.nanmin(loss)))
            ax.plot(row["N_built"], row["loss_built"], "*" if row["best"] else "o", color=f"C{i}",
                    markersize=12 if row["best"] else 6, markeredgecolor="black")
        if max_params is not None:
            ax.axvline(max_params, color="gray", linestyle="--", label=f"cap {numbers.count(max_params)}")
        ax.set_xscale("log")
        ax.set_title(f"C = {numbers.flops(budget)} FLOPs")
        ax.set_xlabel("N = N_once + N_rec (unique non-embedding parameters)")
        ax.set_ylabel("predicted loss (nats)")
        ax.set_ylim(lowest - 0.02, lowest + 0.25)  # the region around the optima, where the curves part
        ax.legend(fontsize="small")
    for ax in axes[len(budgets):]:
        ax.set_visible(False)
    return fig
