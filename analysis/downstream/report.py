"""What ``loopscale analyze`` reports of downstream scores, when a sweep's kept models carry them: per axis the
gap to the reference r at matched compute (analysis/downstream/compute.py) and the shift at matched loss
(analysis/downstream/matched_loss.py), as tables, one verdict line per axis, summary.json's ``downstream`` and a
figure (accuracy against compute by r, and against loss with the fitted curve)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .compute import gap_at_compute, reference_r
from .matched_loss import LossCurve, fit_loss_curve
from .table import at_trained_r, score_table


@dataclass(eq=False)
class Downstream:
    """The per-axis results of a runs table's downstream scores (empty ``scores`` when it has none)."""

    scores: pd.DataFrame
    confidence: float = 0.95
    gaps: dict[str, dict[int, dict]] = field(default_factory=dict)
    curves: dict[str, LossCurve | None] = field(default_factory=dict)
    trained: dict[str, pd.DataFrame] = field(default_factory=dict)  # per axis, the rows the gaps and curves use

    def _reference(self, axis: str) -> int:
        return reference_r(self.trained[axis])

    @property
    def empty(self) -> bool:
        return self.scores.empty

    def summary(self) -> dict:
        """summary.json's ``downstream``: per axis ``gap_at_compute`` and ``shift_at_loss`` per r (fractions, each
        with ``ci``), the reference r and the ``verdict`` line."""
        out = {}
        for axis in self.gaps:
            curve = self.curves[axis]
            shifts = {} if curve is None else {str(r): {"shift": s.shift, "ci": list(s.ci), "dof": s.dof,
                                                        "verdict": s.verdict} for r, s in curve.shifts.items()}
            out[axis] = {"reference_r": self._reference(axis),
                         "gap_at_compute": {str(r): g for r, g in self.gaps[axis].items()},
                         "shift_at_loss": shifts, "verdict": self.verdict(axis)}
        return out

    def verdict(self, axis: str) -> str:
        """One line: the shift of each r at equal loss, with its interval and what it says."""
        curve, name, pct = self.curves[axis], axis.replace("_", " "), f"{100 * self.confidence:.0f}%"
        if curve is None:
            trained = self.trained[axis]
            if len(trained) - 1 - trained["r"].nunique() < 1:  # no dof left: analysis/downstream/matched_loss.py
                return (f"at equal loss on {name}: not tested ({len(trained)} models with a loss; the curve and "
                        "one shift per r need more)")
            return f"at equal loss on {name}: not tested (every model scored {trained['score'].iloc[0]:.3f})"
        parts = [f"r = {r} is {100 * s.shift:+.1f} points ({pct} CI {100 * s.ci[0]:+.1f} to {100 * s.ci[1]:+.1f}): "
                 f"{s.verdict}" for r, s in curve.shifts.items()]
        return f"at equal loss on {name}, against r = {curve.reference}: " + "; ".join(parts)

    def lines(self) -> list[str]:
        out = []
        pct = f"{100 * self.confidence:.0f}%"
        for axis, gaps in self.gaps.items():
            if gaps:
                ref = self._reference(axis)
                out.append(f"at equal compute on {axis.replace('_', ' ')}, against r = {ref}: " + "; ".join(
                    f"r = {r} is {100 * g['gap']:+.1f} points ({pct} CI {100 * g['ci'][0]:+.1f} to "
                    f"{100 * g['ci'][1]:+.1f}, {g['budgets']} budgets)" for r, g in gaps.items()))
            out.append(self.verdict(axis))
        return out

    def tables(self) -> dict[str, pd.DataFrame]:
        rows = []
        for axis, gaps in self.gaps.items():
            curve = self.curves[axis]
            for r in sorted(set(gaps) | set(curve.shifts if curve else ())):
                shift = curve.shifts.get(r) if curve else None
                gap = gaps.get(r, {})
                rows.append({"axis": axis, "r": r, "gap_at_compute": gap.get("gap", np.nan),
                             "gap_lo": gap.get("ci", [np.nan])[0], "gap_hi": gap.get("ci", [np.nan, np.nan])[1],
                             "shift_at_loss": shift.shift if shift else np.nan,
                             "shift_lo": shift.ci[0] if shift else np.nan, "shift_hi": shift.ci[1] if shift else np.nan,
                             "verdict": shift.verdict if shift else "not tested"})
        return {"downstream_scores": self.scores, "downstream_axes": pd.DataFrame(rows)}

    def mlflow_metrics(self) -> dict[str, float]:
        metrics = {}
        for axis, gaps in self.gaps.items():
            metrics.update({f"gap_at_compute.{axis}_r{r}": g["gap"] for r, g in gaps.items()})
            curve = self.curves[axis]
            metrics.update({f"shift_at_loss.{axis}_r{r}": s.shift for r, s in (curve.shifts if curve else {}).items()})
        return metrics

    def figure(self):
        """Per axis (a row): score against training compute, a line per r; score against loss with the fitted
        curve of each r."""
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        axes_names = list(self.gaps)
        fig = Figure(figsize=(10, 3.2 * len(axes_names)), layout="constrained")
        FigureCanvasAgg(fig)
        grid = fig.subplots(len(axes_names), 2, squeeze=False)
        for row, axis in enumerate(axes_names):
            trained = self.trained[axis]
            by_compute, by_loss = grid[row]
            curve = self.curves[axis]
            for r, group in trained.groupby("r"):
                group = group.sort_values("flops")
                line = by_compute.errorbar(group["flops"], group["score"], yerr=1.96 * group["se"], marker="o",
                                           capsize=2, label=f"r={r}")
                by_loss.errorbar(group["loss"], group["score"], yerr=1.96 * group["se"], fmt="o", capsize=2,
                                 color=line[0].get_color(), label=f"r={r}")
                if curve is not None:
                    grid_loss = np.linspace(trained["loss"].min(), trained["loss"].max(), 50)
                    by_loss.plot(grid_loss, curve.accuracy(grid_loss, int(r)), color=line[0].get_color())
            by_compute.set(xscale="log", xlabel="training FLOPs", ylabel=f"{axis} score")
            by_loss.set(xlabel="validation loss (nats/token)", ylabel=f"{axis} score")
            by_compute.legend(fontsize=7)
        return fig


def downstream(runs: pd.DataFrame, confidence: float = 0.95, stage: str | None = "search") -> Downstream:
    """The downstream results of ``runs`` (module docstring); the gaps and curves from the models of ``stage``
    (None: every stage), as the law's fit takes its runs; ``scores`` lists every stage's."""
    scores = score_table(runs)
    result = Downstream(scores=scores, confidence=confidence)
    for axis, group in scores.groupby("axis", sort=True):
        trained = at_trained_r(group if stage is None else group[group["stage"] == stage])
        if trained.empty:
            continue
        result.trained[axis] = trained
        result.gaps[axis] = gap_at_compute(trained, confidence)
        result.curves[axis] = fit_loss_curve(trained, confidence)
    return result
