"""``loopscale demo``: the whole study on this machine in one command.

Runs the ``demo`` preset (real training on the embedded King James Bible, on CPU), then ``loopscale analyze`` on
it, prints phi with its interval and the compute-optimal allocation table, and says where the tables and plots
are and how to open the UI. A second ``loopscale demo`` resumes an interrupted sweep or, when it is complete,
reuses it and only re-runs the analysis (replacing the previous analysis run in MLflow).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from loopscale.analysis.store import redact

from .spec import SweepSpec

# The allocation table's columns a person reads first (the CSV next to it has all of them).
SUMMARY_COLUMNS = {"budget_flops": "C (FLOPs)", "r": "r", "width": "width", "N": "N unique", "N_eff": "N_eff",
                   "tokens": "D (tokens)", "tokens_per_param": "D/N", "loss": "loss", "loss_gap_to_r1": "gap to r=1"}


def allocation_summary(csv_path: Path) -> str:
    table = pd.read_csv(csv_path)[list(SUMMARY_COLUMNS)].rename(columns=SUMMARY_COLUMNS)
    return table.to_string(index=False, float_format=lambda v: f"{v:.4g}")


def run_demo(tracking_uri: str | None = None, verbose: bool = False) -> int:
    """Search (resuming or reusing earlier state), analyse, and point at the results."""
    from loopscale.analysis.cli import analyze_experiment

    from .tune_runner import run_search  # imports Ray: only when the demo really runs

    spec = SweepSpec.from_toml("demo", tracking_uri=tracking_uri)
    run_search(spec, resume=True, verbose=verbose)

    out = analyze_experiment(spec.name, spec.tracking_uri)
    allocation = out / "tables" / "allocation.csv"
    if allocation.is_file():
        print("\ncompute-optimal allocation under the fitted law (all columns: "
              f"{allocation}):\n{allocation_summary(allocation)}")
    print(f"\ntables: {out / 'tables'}\nplots:  {out / 'plots'}\n"
          f"browse every run and the analysis in the MLflow UI: loopscale ui --experiment {spec.name}"
          + ("" if tracking_uri is None else f" --tracking-uri {redact(spec.tracking_uri)}"))
    return 0
