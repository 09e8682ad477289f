"""Runs table -> per-cell optima, Pareto frontier, joint-law fit, allocation tables, plots, exports.

Reads only the runs table (DESIGN.md); never imports Ray. Sizes, FLOPs and tokens come from ``model``.
"""

from .allocation import allocation_table
from .compare import Comparison, compare_runs
from .fit import (DEFAULT_BOUNDS, DEFAULT_FIT_OPTIONS, Bounds, FitOptions, FitStatus, FitSuite, LawFit,
                  fit_joint_law, fit_suite)
from .frontier import pareto_frontier, power_laws
from .isoflop import IsoflopResult, cell_optima
from .report import Analysis, analyze
from .runs import RUN_COLUMNS, exclusions, load_runs, usable_runs
from .sizes import PAPER_BATCH_TOKENS, PAPER_TEMPLATE, SizeCurve

__all__ = [
    "DEFAULT_BOUNDS", "DEFAULT_FIT_OPTIONS", "PAPER_BATCH_TOKENS", "PAPER_TEMPLATE", "RUN_COLUMNS", "Analysis",
    "Bounds", "Comparison", "FitOptions", "FitStatus", "FitSuite", "IsoflopResult", "LawFit", "SizeCurve",
    "allocation_table", "analyze", "cell_optima", "compare_runs", "exclusions", "fit_joint_law", "fit_suite",
    "load_runs", "pareto_frontier", "power_laws", "usable_runs",
]
