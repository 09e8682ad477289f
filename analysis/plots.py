"""The analysis figures, drawn with matplotlib's object API on the Agg canvas (no pyplot, no global state), each
saved as PNG (for the MLflow UI and the README), SVG and PDF (for a paper).

isoflop_figure      loss against N in each (budget, r) cell, the cell's parabola and its optimum
frontier_figure     loss against training FLOPs, the Pareto frontier per r and the law's compute-optimal curve
law_figure          the law's L*(C) and N*(C) per r against the per-cell IsoFLOP optima
residual_figure     observed minus predicted loss of every fitted run
phi_figure          the bootstrap distribution of phi with the point estimate and interval
depth_figure        kept models' loss against the recurrences they were evaluated at, the trained r marked
validation_figure   the law's L*(C) band past the sweep, the sweep's optima, the rungs predicted and achieved
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from . import numbers

from .fit_types import LawFit
from .frontier import training_flops
from .isoflop import IsoflopResult


def _figure(width: float = 7.5, height: float = 5.0) -> Figure:
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


FORMATS = ("png", "svg", "pdf")


def save(fig: Figure, stem: Path) -> list[Path]:
    """``fig`` as ``stem.png``, ``stem.svg`` and ``stem.pdf``; the paths written. The constrained layout is
    computed once, for the PNG, and kept for the others (the vector formats' own would move an axis by at most
    ~0.25% of the figure; computing it again was a third of their drawing time)."""
    paths = [stem.with_suffix(f".{form}") for form in FORMATS]
    for path in paths:
        fig.savefig(path, dpi=120)
        fig.set_layout_engine("none")
    return paths


def _color(i: int) -> str:
    return f"C{i % 10}"


def _grid(fig: Figure, n: int):
    """``n`` panels, two to a row, sharing the loss axis so that the r panels read against each other."""
    cols = min(n, 2)
    rows = int(np.ceil(n / cols))
    return np.atleast_1d(fig.subplots(rows, cols, squeeze=False, sharey=True).ravel())


def _flops_tick(value: float) -> str:
    mantissa, _, exponent = f"{value:.0e}".partition("e")
    return f"{mantissa}e{int(exponent)}"


def _count_tick(value: float) -> str:
    """``numbers.count`` without trailing zeros, as a tick label reads: 5k, 10k, 20k, 1.5M."""
    return re.sub(r"\.?0+(?=[kMBT]?$)", "", text) if "." in (text := numbers.count(value)) else text


def _log_ticks(axis, form) -> None:
    """A log axis labelled at 1, 2 and 5 per decade in ``form`` (10k, 20k, 50k; 1e12, 2e12): a sweep's range is
    often under a decade, where matplotlib labels one tick or none, and its minor labels overlap."""
    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda value, _: form(value)))
    axis.set_minor_formatter(NullFormatter())


def isoflop_figure(runs: pd.DataFrame, optima: IsoflopResult) -> Figure:
    """One panel per r: each budget's runs, its parabola in log N and the optimum with its interval."""
    table = optima.table
    rs = sorted(runs["r"].unique().astype(int))
    fig = _figure(9.0, 3.6 * int(np.ceil(len(rs) / 2)))
    budgets = sorted(runs["budget_flops"].unique())
    axes = _grid(fig, len(rs))
    for ax, r in zip(axes, rs):
        for i, budget in enumerate(budgets):
            cell = runs[(runs["r"] == r) & (runs["budget_flops"] == budget)]
            if cell.empty:
                continue
            n = cell["N_once"] + cell["N_rec"]
            ax.scatter(n, cell["val_loss"], s=14, color=_color(i), label=f"C = {numbers.flops(budget)}")
            match = table[(table["r"] == r) & (table["budget_flops"] == budget)]
            if match.empty or "c2" not in match or not np.isfinite(match["c2"].iloc[0]):
                continue
            row = match.iloc[0]
            x = np.linspace(row["logN_min"], row["logN_max"], 100)
            u = x - row["x_center"]
            ax.plot(np.exp(x), row["c0"] + row["c1"] * u + row["c2"] * u * u, color=_color(i), lw=1)
            if row["status"] == "ok":
                err = None
                if np.isfinite(row.get("N_lo", np.nan)):
                    # a percentile interval need not contain the point estimate: clip to keep bars drawable
                    err = np.clip([[row["N_opt"] - row["N_lo"]], [row["N_hi"] - row["N_opt"]]], 0, None)
                ax.errorbar([row["N_opt"]], [row["L_opt"]], xerr=err, fmt="*", ms=10, color=_color(i),
                            mec="black", mew=0.5)
        ax.set_xscale("log")
        _log_ticks(ax.xaxis, _count_tick)
        ax.set_title(f"r = {r}")
        ax.set_xlabel("unique non-embedding parameters N")
        ax.yaxis.set_tick_params(labelleft=True)  # shared, but each panel is read on its own too
    for ax in axes[::2]:
        ax.set_ylabel("validation loss (nats)")
    for ax in axes[len(rs):]:
        ax.set_visible(False)
    colours = {f"C = {numbers.flops(b)}": _color(i) for i, b in enumerate(budgets)}
    handles = [Line2D([], [], color=c, marker="o", ls="-", lw=1, ms=4, label=k) for k, c in colours.items()]
    handles.append(Line2D([], [], color="grey", marker="*", ms=10, mec="black", mew=0.5, ls="", label="optimum"))
    fig.legend(handles=handles, loc="outside right center", fontsize=8, title="budget")
    fig.suptitle("IsoFLOP curves: a parabola in log N per (budget, r); stars: interior optima with their interval")
    return fig


def frontier_figure(runs: pd.DataFrame, frontier: pd.DataFrame, law_curves: pd.DataFrame | None) -> Figure:
    """All runs by r, each r's Pareto frontier (steps) and, where given, the law's L*_r(C)."""
    fig = _figure()
    ax = fig.subplots()
    handles = []
    for i, r in enumerate(sorted(runs["r"].unique().astype(int))):
        mine = runs[runs["r"] == r]
        ax.scatter(training_flops(mine), mine["val_loss"], s=8, alpha=0.25, color=_color(i), lw=0)
        front = frontier[frontier["group"] == f"r={r}"]
        ax.step(front["training_flops"], front["val_loss"], where="post", color=_color(i), lw=1.8)
        ax.scatter(front["training_flops"], front["val_loss"], s=18, color=_color(i), edgecolor="black", lw=0.4,
                   zorder=3)
        if law_curves is not None:
            curve = law_curves[law_curves["r"] == r]
            ax.plot(curve["budget_flops"], curve["loss"], ls="--", color=_color(i), lw=1)
        handles.append(Line2D([], [], color=_color(i), lw=1.8, label=f"r = {r}"))
    handles += [Line2D([], [], color="grey", marker="o", ls="", alpha=0.4, ms=4, label="every run"),
                Line2D([], [], color="grey", lw=1.8, marker="o", ms=4, mec="black", label="Pareto frontier")]
    if law_curves is not None:
        handles.append(Line2D([], [], color="grey", ls="--", lw=1, label="law: compute-optimal L*(C)"))
    ax.set_xscale("log")
    _log_ticks(ax.xaxis, _flops_tick)
    ax.set_xlabel("training FLOPs")
    ax.set_ylabel("validation loss (nats)")
    ax.set_title("Lowest loss reached for the compute spent, per r")
    ax.legend(handles=handles, fontsize=8)
    return fig


def law_figure(optima: IsoflopResult, law_curves: pd.DataFrame) -> Figure:
    """The law's compute-optimal L* and N* per r (lines) against the per-cell optima (points, intervals)."""
    fig = _figure(10.0, 4.2)
    ax_l, ax_n = fig.subplots(1, 2)
    ok = optima.table[optima.table["status"] == "ok"] if "N_opt" in optima.table else optima.table.iloc[:0]
    for i, r in enumerate(sorted(law_curves["r"].unique())):
        curve = law_curves[law_curves["r"] == r]
        ax_l.plot(curve["budget_flops"], curve["loss"], color=_color(i), label=f"law r = {r}")
        ax_n.plot(curve["budget_flops"], curve["N"], color=_color(i))
        cells = ok[ok["r"] == r]
        if cells.empty:
            continue
        for ax, q in ((ax_l, "L"), (ax_n, "N")):
            err = np.vstack([cells[f"{q}_opt"] - cells[f"{q}_lo"], cells[f"{q}_hi"] - cells[f"{q}_opt"]])
            ax.errorbar(cells["budget_flops"], cells[f"{q}_opt"], yerr=np.clip(np.nan_to_num(err), 0, None),
                        fmt="o", ms=4, color=_color(i))
    for ax in (ax_l, ax_n):
        ax.set_xscale("log")
        ax.set_xlabel("budget C (FLOPs)")
    ax_n.set_yscale("log")
    for ax in (ax_l, ax_n):
        _log_ticks(ax.xaxis, _flops_tick)
    _log_ticks(ax_n.yaxis, _count_tick)
    ax_l.set_ylabel("compute-optimal loss L* (nats)")
    ax_n.set_ylabel("compute-optimal N*")
    ax_l.legend(fontsize=8)
    fig.suptitle("Joint law (lines) versus per-cell IsoFLOP optima (points)")
    return fig


def validation_figure(band: pd.DataFrame, optima: IsoflopResult, rungs: pd.DataFrame) -> Figure:
    """Per r: the law's compute-optimal loss across budgets with the interval of its mean (``band``), the
    sweep's per-cell optima, and each rung's predicted interval for one run (bar) and achieved loss (star)."""
    fig = _figure()
    ax = fig.subplots()
    ok = optima.table[optima.table["status"] == "ok"] if "L_opt" in optima.table else optima.table.iloc[:0]
    for i, r in enumerate(sorted(band["r"].unique())):
        curve = band[band["r"] == r]
        ax.plot(curve["budget_flops"], curve["loss"], color=_color(i), label=f"law r = {r}")
        ax.fill_between(curve["budget_flops"], curve["loss_lo"], curve["loss_hi"], color=_color(i), alpha=0.2)
        cells = ok[ok["r"] == r]
        ax.plot(cells["budget_flops"], cells["L_opt"], "o", ms=4, color=_color(i))
        mine = rungs[rungs["r"] == r]
        x = mine["budget_flops"] * np.exp(0.03 * i)  # the r's of a rung side by side on the log axis
        err = np.vstack([mine["predicted"] - mine["predicted_lo"], mine["predicted_hi"] - mine["predicted"]])
        ax.errorbar(x, mine["predicted"], yerr=np.clip(np.nan_to_num(err), 0, None), fmt="_",
                    ms=10, capsize=4, color=_color(i))
        ax.plot(x, mine["achieved"], "*", ms=11, color=_color(i), markeredgecolor="black")
    ax.set_xscale("log")
    _log_ticks(ax.xaxis, _flops_tick)
    ax.set_xlabel("budget C (FLOPs)")
    ax.set_ylabel("loss (nats)")
    ax.legend(handles=ax.get_legend_handles_labels()[0] + [
        Line2D([], [], marker="o", ls="", color="gray", label="sweep's optimum per cell"),
        Line2D([], [], marker="_", ms=10, ls="", color="gray", label="rung predicted (one run's interval)"),
        Line2D([], [], marker="*", ms=11, ls="", color="gray", markeredgecolor="black", label="rung achieved")],
        fontsize=8)
    fig.suptitle("Validation rungs: predicted (the law's band) and achieved")
    return fig


def residual_figure(fitted: pd.DataFrame, fit: LawFit) -> Figure:
    """Observed minus predicted loss (nats) of each fitted run, by r."""
    fig = _figure()
    ax = fig.subplots()
    residual = fitted["val_loss"].to_numpy() - fit.predict(fitted)
    x = fitted["budget_flops"].to_numpy(float)
    for i, r in enumerate(sorted(fitted["r"].unique().astype(int))):
        mine = fitted["r"].to_numpy() == r
        jitter = np.exp(0.04 * (i - 1.5))  # spread the r groups apart on the log axis
        ax.scatter(x[mine] * jitter, residual[mine], s=12, color=_color(i),
                   label=f"r = {r} (RMSE {fit.rmse_per_r.get(r, np.nan):.4f})")
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("budget C (FLOPs)")
    ax.set_ylabel("observed - predicted loss (nats)")
    ax.set_title(f"Residuals of the joint fit (R^2 {fit.r2:.4f}, max |residual| {fit.max_residual:.4f})")
    ax.legend(fontsize=8)
    return fig


def phi_figure(fit: LawFit) -> Figure:
    """Histogram of the bootstrap phi with the point estimate and the percentile interval."""
    fig = _figure(6.5, 4.0)
    ax = fig.subplots()
    draws = fit.draws()["phi"].to_numpy()
    if draws.size:
        ax.hist(draws, bins=30, color="C0", alpha=0.7)
    ax.axvline(fit.phi, color="black", label=f"phi = {fit.phi:.3f}")
    for edge in fit.phi_ci:
        if np.isfinite(edge):
            ax.axvline(edge, color="black", ls="--", lw=0.8)
    ax.set_xlabel("phi")
    ax.set_ylabel("bootstrap resamples")
    ax.set_title(f"{fit.interval.capitalize()} bootstrap of phi ({fit.n_cells} cells): {fit.n_bootstrap} resamples, "
                 f"{100 * fit.confidence:.0f}% CI {fit.phi_ci[0]:.3f} to {fit.phi_ci[1]:.3f}", fontsize=9)
    ax.legend()
    return fig


def depth_figure(depth: pd.DataFrame) -> Figure:
    """Per evaluated kept model (analysis/depth.py: one per cell with keep_models = "best"), its validation loss
    against r_eval, the loss at its trained r (its trial's) marked by a star."""
    fig = _figure()
    ax = fig.subplots()
    for i, (run_id, mine) in enumerate(depth.groupby("run_id", sort=False)):
        first = mine.iloc[0]
        label = f"C={_flops_tick(first['budget_flops'])} r={first['r']} d={first['width']:.0f}"
        if first["stage"] != "search":
            label = f"{first['stage']} {label}"
        ax.plot(mine["r_eval"], mine["val_loss_r_eval"], marker="o", ms=4, color=_color(i), lw=1.2, label=label)
        ax.scatter([first["r"]], [first["val_loss"]], marker="*", s=140, color=_color(i), edgecolor="black",
                   lw=0.5, zorder=3)
    ax.set_xscale("log", base=2)
    ticks = sorted({*depth["r_eval"], *depth["r"]})
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("recurrences at evaluation (r_eval)")
    ax.set_ylabel("validation loss (nats)")
    ax.set_title("Kept models at other recurrence counts (star: the r trained at)")
    ax.legend(fontsize=8)
    return fig
