"""``loopscale analyze``: a sweep's runs -> every table and figure of the study, written and logged.

``analyze`` computes everything in memory (so bad input fails before anything is written); ``Analysis.write``
puts the tables (CSV, Markdown, LaTeX, JSON) under ``tables/``, the figures under ``plots/`` and a summary
(``summary.json``, ``summary.txt``) in the output folder; ``log_to_mlflow`` attaches that folder to an
``analysis`` run of the sweep's experiment.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from . import numbers, validation
from .allocation import allocation_table, buildable, r1_not_run, readable
from .backtest import Backtest, backtest
from .compare import excluded_text
from .depth import depth_table, depth_text
from .depth_curve import depth_curves
from .downstream.report import Downstream, downstream
from .fit import TooFewRuns
from .fit_problem import fit_rows
from .suite import FitSuite, fit_suite
from .folder_swap import replace_folder, scratch_for
from .fit_types import LawFit
from .frontier import MIN_CELLS, pareto_frontier, power_laws
from .intervals import spread_of, with_intervals
from .identify import likely_fixes, status_label
from .isoflop import IsoflopResult, cell_gaps, cell_optima
from .law_optimum import RunCosts, optimum_table, short_table
from .options import DEFAULT_FIT_OPTIONS, FitOptions
from .rate_sensitivity import lines as rate_lines
from .rate_sensitivity import rate_sensitivity
from .plots import (depth_figure, frontier_figure, isoflop_figure, law_figure, phi_figure, residual_figure, save,
                    validation_figure)
from .flops import flops_spent, flops_text
from .runs import excluded_runs, exclusions, template_of, usable_runs
from .sizes import template_mismatch
from .tables import write_all

LAW_CURVE_POINTS = 40


@dataclass(eq=False)
class Analysis:
    """Everything ``loopscale analyze`` reports about one sweep."""

    name: str
    runs: pd.DataFrame
    options: FitOptions
    optima: IsoflopResult
    frontier: pd.DataFrame
    power_laws: pd.DataFrame
    suite: FitSuite
    allocation: pd.DataFrame  # a template's allocation table, or the law's optimum (analysis/law_optimum.py)
    law_curves: pd.DataFrame
    template_note: str
    seconds: float
    backtest: Backtest | None = None
    backtest_skipped: str = ""  # why no backtest although three budgets or more were run; '' otherwise
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    unfinished: str = ""  # where an unfinished sweep stands (analysis/unfinished.py); '' when it finished
    validation: pd.DataFrame = field(default_factory=pd.DataFrame)  # rungs predicted and achieved (validation.py)
    validation_band: pd.DataFrame | None = None
    calibration: dict[str, Any] | None = None  # the sweep's recorded calibration choice (analysis/calibration.py)
    rate_sensitivity: dict[str, Any] | None = None  # phi at other rates, where the sweep ran it (rate_sensitivity.py)
    downstream: Downstream | None = None  # kept models' downstream scores (analysis/downstream/), when they have any

    @property
    def used(self) -> pd.DataFrame:
        return usable_runs(self.runs, stage=self.options.stage)

    def summary(self) -> dict[str, Any]:
        joint = self.suite.joint
        excluded = exclusions(self.runs, stage=self.options.stage)
        return {
            "experiment": self.name, "unfinished": self.unfinished or None,
            "runs_total": len(self.runs), "runs_used": len(self.used), "runs_fitted": joint.n_runs,
            "excluded": excluded.to_dict(orient="records"),
            "joint": self._joint_record(), **{name: fit.to_dict() if fit else None for name, fit in
                                         (("phi0", self.suite.phi0), ("phi1", self.suite.phi1))},
            "per_r": {str(r): f.to_dict() for r, f in self.suite.per_r.items()},
            "bootstrap_outside_estimate": joint.outside_bootstrap(),
            "gap_to_r1": self.gap_ranges(),
            "gap_to_r1_warning": (r1_not_run(self.used["r"]) if self.gap_ranges() else "") or None,
            "cells_flagged": self.optima.table.query("status != 'ok'")[["r", "budget_flops", "status", "reason"]]
            .to_dict(orient="records") if not self.optima.table.empty else [],
            "backtest": self.backtest.summary() if self.backtest else None,
            "backtest_skipped": self.backtest_skipped or None,
            "flops_spent": flops_spent(self.runs) if self.runs["flops_spent"].notna().any() else None,
            "template": self.template_note, "seconds": self.seconds,
            "likely_fixes": likely_fixes(self.optima.table) if joint.warnings else [],
            "validation": self.validation.to_dict(orient="records"),
            "calibration": self.calibration,
            **({"downstream": self.downstream.summary()} if self._has_downstream else {}),
        }

    @property
    def _has_downstream(self) -> bool:
        return self.downstream is not None and not self.downstream.empty

    def _joint_record(self) -> dict[str, Any]:
        """The joint fit's record, with phi at other rates where the sweep trained them."""
        record = self.suite.joint.to_dict()
        if self.rate_sensitivity:
            record["rate_sensitivity"] = self.rate_sensitivity
        return record

    def gap_ranges(self) -> dict[str, list[float]]:
        """Per r > 1, [min, max] over the sweep's budgets of the law's gap to r = 1 at the optimum (nats)."""
        if not self.suite.joint.phi_applicable:
            return {}
        looped = self.allocation[self.allocation["r"] > 1]
        return {str(int(r)): [float(g["loss_gap_to_r1"].min()), float(g["loss_gap_to_r1"].max())]
                for r, g in looped.groupby("r")}

    def summary_text(self) -> str:
        joint, s = self.suite.joint, self.summary()
        pct = f"{100 * joint.confidence:.0f}%"
        lines = [f"warning: {self.unfinished}"] if self.unfinished else []
        lines += [f"{self.name}: {s['runs_total']} runs, {s['runs_used']} used, "
                  f"{s['runs_total'] - s['runs_used']} excluded; fitted {joint.n_runs} ({joint.data})",
                  f"{_phi_line(joint)} {status_label(joint, self.options.bounds)}", f"verdict: {joint.verdict}",
                  *_constant_lines(joint), *[f"warning: {line}" for line in joint.outside_bootstrap()],
                  _r2_line(self.suite)]
        gaps = s["gap_to_r1"]
        if gaps:
            lines.append("gap to r=1 at the compute optimum (law, nats; smallest and largest over the budgets): "
                         + ", ".join(f"r={r} {numbers.loss(lo)} to {numbers.loss(hi)}" for r, (lo, hi) in gaps.items()))
            if s["gap_to_r1_warning"]:
                lines.append(f"warning: {s['gap_to_r1_warning']}")
        if self.backtest is not None:
            lines.append(self.backtest.text())
        elif self.backtest_skipped:
            lines.append(f"backtest: none ({self.backtest_skipped})")
        depth = self.tables.get("depth_eval", pd.DataFrame())
        if not depth.empty:
            lines.append(depth_text(depth))
        lines += self.downstream.lines() if self._has_downstream else []
        lines += validation.lines(self.validation, joint.confidence)
        if self.calibration:
            lines.append(self.calibration["line"])
        lines += rate_lines(self.rate_sensitivity)
        lines.append("excluded: " + excluded_text(self.runs, self.options.stage))
        spent = s["flops_spent"]
        if spent is not None:
            lines.append(f"spent: {flops_text(spent['total'], spent['paper_grid'])}; per cell "
                         + ", ".join(f"{k} {numbers.flops(v)}" for k, v in spent["per_cell"].items()))
        if s["cells_flagged"]:
            reasons = pd.Series([c["reason"] for c in s["cells_flagged"]]).value_counts()
            lines.append(f"cells without a usable IsoFLOP optimum: {len(s['cells_flagged'])} of "
                         f"{len(self.optima.table)} (" + "; ".join(f"{n} {why}" for why, n in reasons.items())
                         + "); see tables/cell_optima")
        if joint.warnings:
            lines += [f"warning: {problem}" for problem in joint.warnings]
            lines += [f"  likely fix: {fix}" for fix in s["likely_fixes"]]
            if joint.phi_applicable:
                pilot = self.name or "NAME"
                lines.append(f"  what a decisive answer costs: `loopscale plan SPEC --precision --pilot {pilot} "
                             "--target-half-width 0.1` forecasts phi's interval for larger designs of the spec, and "
                             "their FLOPs and GPU-hours")
        if "width_built" in self.allocation:
            lines.append("compute-optimal models under the fitted law (buildable; every column: tables/allocation):")
        else:
            lines.append(f"compute-optimal N and D under the fitted law; {self.template_note} (every column: "
                         "tables/allocation):")
        lines.append(f"intervals: {spread_of(joint)[1]}")
        return numbers.wrap("\n".join(lines)) + "\n" + readable(short_table(self.allocation)).to_string(index=False)

    def write(self, out_dir: Path) -> list[Path]:
        """Write tables, figures and the summary as the folder ``out_dir``, which is replaced as a whole
        (``folder_swap``): files an earlier analysis left there go, and a figure or number that fails to render,
        or a swap that fails, leaves the old folder whole. Returns the files written."""
        scratch = scratch_for(out_dir)
        try:
            written = self._write(scratch)
            replace_folder(scratch, out_dir)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return [out_dir / path.relative_to(scratch) for path in written]

    def _write(self, out_dir: Path) -> list[Path]:
        (out_dir / "tables").mkdir(parents=True, exist_ok=True)
        (out_dir / "plots").mkdir(exist_ok=True)
        paths = []
        for name, table in self.tables.items():
            paths += write_all(table, out_dir / "tables" / name)
        for name, fig in self.figures().items():
            paths += save(fig, out_dir / "plots" / name)
        summary = json.dumps(_plain(self.summary()), indent=1, allow_nan=False)
        (out_dir / "summary.json").write_text(summary + "\n")
        (out_dir / "summary.txt").write_text(self.summary_text() + "\n")
        return paths + [out_dir / "summary.json", out_dir / "summary.txt"]

    def figures(self) -> dict:
        used = self.used
        figures = {"isoflop": isoflop_figure(used, self.optima),
                   "frontier": frontier_figure(used, self.frontier, self.law_curves),
                   "residuals": residual_figure(fit_rows(self.runs, self.options), self.suite.joint),
                   "phi_bootstrap": phi_figure(self.suite.joint)}
        figures["law_vs_optima"] = law_figure(self.optima, self.law_curves)
        if not self.tables.get("depth_eval", pd.DataFrame()).empty:
            figures["loss_vs_r_eval"] = depth_figure(self.tables["depth_eval"])
        if self.validation_band is not None:
            figures["validation"] = validation_figure(self.validation_band, self.optima, self.validation)
        if self._has_downstream:
            figures["downstream"] = self.downstream.figure()
        return figures

    def mlflow_record(self) -> tuple[dict[str, float], dict[str, Any], dict[str, str]]:
        """(metrics, params, tags) of the analysis run."""
        joint = self.suite.joint
        metrics = {"E": joint.E, "A": joint.A, "alpha": joint.alpha, "B": joint.B, "beta": joint.beta,
                   "r2_joint": joint.r2, "rmse_joint": joint.rmse,
                   "runs_used": len(self.used), "runs_excluded": len(self.runs) - len(self.used)}
        if self.suite.restricted:
            metrics.update(r2_phi0=self.suite.phi0.r2, r2_phi1=self.suite.phi1.r2)
        if joint.phi_applicable:
            metrics.update(phi=joint.phi, phi_lo=joint.phi_ci[0], phi_hi=joint.phi_ci[1])
        if np.isfinite(joint.phi_profile_ci[0]):
            metrics.update(phi_profile_lo=joint.phi_profile_ci[0], phi_profile_hi=joint.phi_profile_ci[1],
                           p_phi0=joint.p_phi0, p_phi1=joint.p_phi1)
        metrics.update({f"r2_r{r}": f.r2 for r, f in self.suite.per_r.items()})
        for r, (lo, hi) in self.gap_ranges().items():
            metrics[f"gap_r{r}_min"], metrics[f"gap_r{r}_max"] = lo, hi
        if self.backtest is not None:
            metrics["backtest_runs_rmse"] = self.backtest.runs_rmse
            errors = self.backtest.cells["loss_error"].dropna()
            if len(errors):
                metrics["backtest_loss_error_mean_abs"] = float(errors.abs().mean())
        metrics.update(validation.mlflow_metrics(self.validation))
        metrics.update(self.downstream.mlflow_metrics() if self._has_downstream else {})
        params = {"data": self.options.data, "stage": self.options.stage, "n_starts": self.options.n_starts,
                  "n_bootstrap": self.options.n_bootstrap, "interval": joint.interval, "seed": self.options.seed,
                  "delta": self.options.delta, "template": self.template_note}
        return metrics, params, {"fit_status": joint.status.value, "verdict": joint.verdict}


def analyze(runs: pd.DataFrame, *, name: str = "", options: FitOptions = DEFAULT_FIT_OPTIONS,
            budgets=None, recurrences=None, progress: Callable[[str], None] | None = None) -> Analysis:
    """Per-cell optima, frontier, power laws, the fit suite and the allocation table of a runs table;
    ``progress`` gets a line as each step starts."""
    say = progress or (lambda line: None)
    start = time.perf_counter()
    used = usable_runs(runs, stage=options.stage)
    if used.empty:
        counts = exclusions(runs, stage=options.stage)
        detail = "; ".join(f"{c} {s} ({why})" for s, why, c in counts.itertuples(index=False))
        raise ValueError(f"no usable runs in {name or 'the table'}: {detail or 'none ok'}")
    budgets = sorted(used["budget_flops"].unique()) if budgets is None else list(budgets)
    recurrences = sorted(int(r) for r in used["r"].unique()) if recurrences is None else list(recurrences)
    template, batch_tokens, note = template_of(runs)
    mismatch = template_mismatch(used, template)
    costs = RunCosts.of(used) if mismatch else None  # no template builds the runs: the law's own optimum
    if costs is not None:
        costs.check(recurrences)
    say(f"{len(used)} runs in {used.groupby(['budget_flops', 'r']).ngroups} cells: IsoFLOP optima, frontier, "
        "power laws")
    optima = cell_optima(used, stage=None, n_bootstrap=options.n_bootstrap, seed=options.seed,
                         confidence=options.confidence)
    frontier = pareto_frontier(used, stage=None)
    laws = power_laws(optima, confidence=options.confidence)
    suite = fit_suite(runs, options=options, progress=say)
    say("allocation tables")
    fine = np.geomspace(min(budgets) / 2, max(budgets) * 2, LAW_CURVE_POINTS)
    if costs is not None:
        allocation = optimum_table(suite.joint, budgets, recurrences, costs=costs, spread=spread_of(suite.joint)[0])
        law_curves = optimum_table(suite.joint, fine, recurrences, costs=costs)
        note = f"no template builds these runs ({mismatch}); {costs.note}"
    else:
        allocation = with_intervals(allocation_table(suite.joint, budgets, recurrences, template=template,
                                                     batch_tokens=batch_tokens), spread_of(suite.joint)[0],
                                    template=template, batch_tokens=batch_tokens)
        law_curves = allocation_table(suite.joint, fine, recurrences, template=template, batch_tokens=batch_tokens)
        note = f"template {template} ({note}), batch {batch_tokens} tokens"
    say("backtest: the law refitted without the largest budget (when 3 or more were run)")
    try:
        held_out, skipped = backtest(runs, optima, options=options, allocate=partial(optimum_table, costs=costs)
                                     if costs else partial(allocation_table, template=template,
                                                           batch_tokens=batch_tokens)), ""
    except TooFewRuns as exc:
        held_out, skipped = None, f"{exc} below the largest budget"
    analysis = Analysis(name=name, runs=runs, options=options, optima=optima, frontier=frontier, power_laws=laws,
                        suite=suite, allocation=allocation, law_curves=law_curves, template_note=note,
                        seconds=time.perf_counter() - start, backtest=held_out, backtest_skipped=skipped)
    analysis.rate_sensitivity = rate_sensitivity(runs, suite.joint, options)
    analysis.validation = validation.compare(suite.joint, runs, options)
    if not analysis.validation.empty and not mismatch:
        analysis.validation_band = validation.band(suite.joint, analysis.validation, used["budget_flops"],
                                                   template=template, batch_tokens=batch_tokens)
    analysis.downstream = downstream(runs, options.confidence, options.stage)
    analysis.tables = _tables(analysis)
    return analysis


def _r2_line(suite: FitSuite) -> str:
    """R^2 of the joint fit, and of the paper's comparison fits where there are any (runs of several r)."""
    if not suite.restricted:
        return f"R^2: {suite.joint.r2:.4f}"
    return ("R^2: joint {:.4f} | phi=0 {:.4f} | phi=1 {:.4f}".format(suite.joint.r2, suite.phi0.r2, suite.phi1.r2)
            + "".join(f" | r={r} {f.r2:.4f}" for r, f in sorted(suite.per_r.items())))


def _phi_line(joint: LawFit) -> str:
    """phi with its profile interval (the verdict's) and, named as such, the bootstrap's, or why there is none."""
    if not joint.phi_applicable or joint.fixed_phi is not None or not joint.n_bootstrap:
        return joint.phi_text()
    pct = f"{100 * joint.confidence:.0f}%"
    return (f"phi = {joint.phi:.3f} ({pct} profile CI {numbers.stretches(joint.phi_profile_stretches)}; "
            f"bootstrap {pct} CI {joint.phi_ci[0]:.3f} to {joint.phi_ci[1]:.3f} from {joint.n_bootstrap} "
            f"{joint.interval}-bootstrap resamples over {joint.n_cells} cells"
            + (f" and the {joint.n_shared_trials} trials with branch points" if joint.n_shared_trials else "") + ")")


def _constant_lines(joint: LawFit, width: int = numbers.COLUMNS) -> list[str]:
    """Each constant with its interval (``low-high``, analysis/numbers.py), as few lines within ``width`` as hold
    them."""
    parts = [f"{name} {numbers.sig(getattr(joint, name))}"
             + (f" ({numbers.span(*joint.ci[name])})" if numbers.span(*joint.ci[name]) else "")
             for name in ("E", "A", "alpha", "B", "beta")]
    lines = [f"  constants ({100 * joint.confidence:.0f}% CI):"]
    for part in parts:
        if len(lines[-1]) + 2 + len(part) > width:
            lines.append("  ")
        lines[-1] += " " * (1 if lines[-1].endswith(":") else 2) + part
    return lines


def _tables(a: Analysis) -> dict[str, pd.DataFrame]:
    joint = a.suite.joint
    constants = pd.DataFrame([{"constant": k, "value": getattr(joint, k), "lo": joint.ci[k][0], "hi": joint.ci[k][1]}
                              for k in ("E", "A", "alpha", "B", "beta", "phi")])
    rmse = pd.DataFrame([{"r": r, "rmse_joint": v, "rmse_per_r_fit": a.suite.per_r[r].rmse if r in a.suite.per_r
                          else np.nan} for r, v in sorted(joint.rmse_per_r.items())])
    tables = {"fits": a.suite.table(), "joint_constants": constants, "rmse_per_r": rmse,
              "cell_optima": a.optima.table, "frontier": _frontier_columns(a.frontier),
              "power_laws": _power_law_rows(a.power_laws, a.optima.table),
              "excluded": exclusions(a.runs, stage=a.options.stage),
              "excluded_runs": excluded_runs(a.runs, stage=a.options.stage),
              "gaps_measured": cell_gaps(a.optima.table) if "L_opt" in a.optima.table else pd.DataFrame()}
    tables["allocation"] = a.allocation
    if "width_built" in a.allocation:
        tables["allocation_buildable"] = buildable(a.allocation)
    if a.backtest is not None:
        tables["backtest"] = a.backtest.cells
    depth = depth_table(a.runs)
    if not depth.empty:
        tables["depth_eval"] = depth
        curves = depth_curves(depth)
        if not curves.empty:
            tables["depth_curves"] = curves
    if not a.validation.empty:
        tables["validation"] = a.validation
    if a._has_downstream:
        tables.update(a.downstream.tables())
    return tables


def _power_law_rows(laws: pd.DataFrame, optima: pd.DataFrame) -> pd.DataFrame:
    """The fitted power laws plus, for each r without one, a row saying why: the table is never blank."""
    missing = []
    for r in sorted(optima["r"].unique()) if "r" in optima else []:
        if laws.empty or r not in set(laws["r"]):
            cells = optima[optima["r"] == r]
            n_ok = int((cells["status"] == "ok").sum())
            missing.append({"r": int(r), "n_cells": n_ok,
                            "note": f"no power law: {n_ok} of {len(cells)} cells have an interior IsoFLOP optimum "
                                    f"(a fit needs {MIN_CELLS})"})
    return pd.concat([laws, pd.DataFrame(missing)], ignore_index=True) if missing else laws


def _frontier_columns(frontier: pd.DataFrame) -> pd.DataFrame:
    keep = ["group", "run_id", "r", "budget_flops", "width", "N_once", "N_rec", "tokens", "training_flops",
            "val_loss"]
    return frontier[[c for c in keep if c in frontier]]


def _plain(value):
    """``value`` with numpy scalars as Python numbers and NaN/inf as None (strict JSON)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value) if np.isfinite(value) else None
    return value
