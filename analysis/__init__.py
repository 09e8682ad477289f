"""Runs table -> per-cell optima, Pareto frontier, joint-law fit, allocation tables, plots, exports.

Reads only the runs table, so it runs wherever the table is; never imports Ray. Sizes, FLOPs and tokens come
from ``model``.
Names resolve on first use (PEP 562, ``model/lazy.py``), as at the package's top level:
``loopscale --help`` registers the analysis commands without loading scipy or matplotlib.
"""

from loopscale.model.lazy import on_first_use

# No module may share an exported name: importing it would bind the module over the name (``fit_suite`` did).
_EXPORTS = {
    "allocation_table": "allocation",
    "Comparison": "compare", "compare_runs": "compare",
    "DEFAULT_BOUNDS": "options", "DEFAULT_FIT_OPTIONS": "options", "Bounds": "options", "FitOptions": "options",
    "FitStatus": "fit_types", "LawFit": "fit_types", "fit_joint_law": "fit",
    "FitSuite": "suite", "fit_suite": "suite",
    "pareto_frontier": "frontier", "power_laws": "frontier",
    "IsoflopResult": "isoflop", "cell_optima": "isoflop",
    "spread_of": "intervals", "with_intervals": "intervals",
    "Analysis": "report", "analyze": "report",
    "RUN_COLUMNS": "runs", "exclusions": "runs", "load_runs": "runs", "usable_runs": "runs",
    "PAPER_BATCH_TOKENS": "sizes", "PAPER_TEMPLATE": "sizes", "SizeCurve": "sizes",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = on_first_use(__name__, _EXPORTS)
