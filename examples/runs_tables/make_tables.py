"""Two small runs tables of the shape a researcher's own study has, made from a known law with noise:

* ``single_r.csv``: a plain (non-looped) study, r = 1 only: 4 budgets x 5 widths;
* ``looped.csv``: the same budgets and widths at r = 1, 2 and 4.

Each row is a model of the paper's iso-depth template (``loopscale.model``) trained for the whole optimizer steps
its budget buys (``tokens_for_budget``), with a loss from the law L = E + A (N_once + r^phi N_rec)^-alpha +
B D^-beta at the paper's published constants, times log-normal noise of 1% (seeded). Written: the required
columns of a runs table, width and flops_per_token (the analysis checks the template against them) and
flops_spent.

    python examples/runs_tables/make_tables.py OUT_DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

from loopscale.model import PAPER_LAW, LoopedConfig, account, tokens_for_budget

BATCH_TOKENS = 262_144  # the paper's batch
WIDTHS = {1e18: (6, 8, 12, 16, 22), 3e18: (8, 12, 16, 22, 30), 1e19: (12, 16, 22, 30, 42),
          3e19: (16, 22, 30, 42, 58)}  # budget (FLOPs) -> width multipliers s around the optimum
NOISE = 0.01


def runs_table(recurrences: tuple[int, ...], *, seed: int = 0) -> pd.DataFrame:
    """One row per (budget, r, width): sizes and FLOPs from the model's accounting, loss from the law."""
    rng = np.random.default_rng(seed)
    rows = []
    for budget, widths in WIDTHS.items():
        for r in recurrences:
            for s in widths:
                config = LoopedConfig.iso_depth(s, r)
                counts = account(config)
                tokens = tokens_for_budget(config, budget, BATCH_TOKENS)
                loss = PAPER_LAW.loss(counts.N_once, counts.N_rec, r, tokens) * np.exp(NOISE * rng.standard_normal())
                rows.append({"r": r, "budget_flops": budget, "width": config.width, "N_once": counts.N_once,
                             "N_rec": counts.N_rec, "flops_per_token": counts.flops_per_token, "tokens": tokens,
                             "flops_spent": counts.flops_per_token * tokens, "val_loss": loss})
    return pd.DataFrame(rows)


def main(out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, recurrences in (("single_r", (1,)), ("looped", (1, 2, 4))):
        path = out_dir / f"{name}.csv"
        runs_table(recurrences).to_csv(path, index=False)
        written.append(path)
    return written


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python examples/runs_tables/make_tables.py OUT_DIR")
    for path in main(Path(sys.argv[1])):
        print(f"wrote {path}")
