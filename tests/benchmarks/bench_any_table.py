"""How well ``loopscale analyze`` finds the compute-optimal N of a plain study no template builds (run on demand;
prints figures).

    python tests/benchmarks/bench_any_table.py [--seeds 3]

Per seed, a 117-run study in the shape of a public IsoFLOP study (r = 1, four columns: budget, parameters,
tokens, loss; ``test_any_runs_table.public_study``: Hoffmann et al.'s law, 0.5% log-normal noise) goes through
``loopscale analyze`` with its default fit (500 starts, 200 resamples), its columns mapped by ``--columns``.
Printed per seed: the exit code, the CPU seconds of the command (user + system of the child: wall time on
shared cores says little), and at the largest budget the law's N* with its 95% interval against the true
optimum (a dense search along C = 6 N D under the true law), with their ratio and whether the interval holds it.
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for the study's shape
from test_any_runs_table import CHINCHILLA, public_study  # noqa: E402

MAPPING = "budget_flops=budget,N_once=parameters,val_loss=loss"


def true_optimum(budget: float) -> float:
    grid = np.geomspace(1e6, 1e13, 400_001)
    return float(grid[np.argmin(CHINCHILLA.loss(grid, 0.0, 1, budget / (6 * grid)))])


def one_seed(seed: int, folder: Path) -> dict:
    path = folder / f"study{seed}.csv"
    public_study(seed=seed).to_csv(path, index=False)
    out = folder / f"out{seed}"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([sys.executable, "-m", "loopscale.search.cli", "analyze", "--experiment", str(path),
                           "--out", str(out), "--columns", MAPPING], capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    row = {"seed": seed, "exit": done.returncode,
           "cpu_s": after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime}
    if done.returncode == 0:
        table = pd.read_csv(out / "tables" / "allocation.csv")
        top = table.loc[table["budget_flops"].idxmax()]
        truth = true_optimum(top["budget_flops"])
        row.update(budget=top["budget_flops"], N=top["N"], N_lo=top["N_lo"], N_hi=top["N_hi"], true_N=truth,
                   ratio=top["N"] / truth, covered=bool(top["N_lo"] <= truth <= top["N_hi"]))
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        rows = [one_seed(seed, Path(folder)) for seed in range(args.seeds)]
    table = pd.DataFrame(rows)
    print(table.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    print(f"N*/truth {table['ratio'].min():.3f} to {table['ratio'].max():.3f}; truth inside the 95% interval in "
          f"{int(table['covered'].sum())} of {len(table)}; CPU median {table['cpu_s'].median():.1f} s")


if __name__ == "__main__":
    main()
