"""Two designs at matched loss: what one buys in downstream accuracy beyond its loss, against the other
(``loopscale compare A B``).

Per axis both sweeps' kept models score, every model at its trained r enters one curve
(analysis/downstream/matched_loss.py) with a shift for design B against A instead of one per r:

    a_i = c + (1 - c) sigmoid(u + v (L_i - Lbar)) + Delta [i in B]

so Delta is the accuracy B gets at the loss A would need for it; its interval and verdict as the shifts' are.
"""

from __future__ import annotations

import pandas as pd

from .matched_loss import fit_loss_curve
from .table import at_trained_r, score_table


def design_lines(runs_a: pd.DataFrame, runs_b: pd.DataFrame, name_a: str, name_b: str, confidence: float = 0.95,
                 stage: str | None = "search") -> list[str]:
    """One line per axis both sweeps scored (none when they share none; module docstring)."""
    tables = []
    for design, runs in enumerate((runs_a, runs_b)):
        scores = at_trained_r(score_table(runs))
        tables.append(scores[scores["stage"] == stage].assign(design=design) if stage is not None else
                      scores.assign(design=design))
    both = pd.concat(tables, ignore_index=True)
    lines, pct = [], f"{100 * confidence:.0f}%"
    for axis, group in both.groupby("axis", sort=True):
        if group["design"].nunique() < 2:
            continue
        name = axis.replace("_", " ")
        curve = fit_loss_curve(group, confidence, by="design")
        if curve is None:
            lines.append(f"at equal loss on {name}, {name_b} - {name_a}: not tested ({len(group)} models)")
            continue
        s = curve.shifts[1]
        lines.append(f"at equal loss on {name}, {name_b} - {name_a} = {100 * s.shift:+.1f} points ({pct} CI "
                     f"{100 * s.ci[0]:+.1f} to {100 * s.ci[1]:+.1f}): {s.verdict}")
    return lines
