"""How close is a warmdown branch's loss at D_k to a run trained for D_k outright? Against run-to-run scatter.

    python tests/benchmarks/bench_warmdown.py              # d = 16, r = 2, KJV bytes, 3 seeds
    python tests/benchmarks/bench_warmdown.py --seeds 5 --s 4

For each seed (model init and data order), one trial at budget C with schedule "wsd" branches warmdowns at
C/4 and C/2 (objectives/training.py); next to it, runs trained for those D_k outright, with the wsd schedule
(what the branch stands for) and with the paper's linear-decay schedule (what a grid of separate runs would
use). Printed per D_k: mean |branch - outright| for both, and the run-to-run scatter (standard deviation over
seeds of the outright paper-schedule runs). Target: branch vs outright within that scatter. Quality figures:
not timing-sensitive.
"""

from __future__ import annotations

import argparse
import tempfile

import numpy as np

from loopscale.objectives import TrialConfig, train

TEMPLATE = dict(depth=8, prelude=2, coda=2, width_unit=8, head_dim=8, seq_len=128, vocab_size=256)
BATCH = 4096


def trial(cache: str, s: float, budget: float, seed: int, recipe: dict) -> TrialConfig:
    return TrialConfig(budget_flops=float(budget), s=float(s), r=2, template=TEMPLATE, batch_tokens=BATCH,
                       seed=seed, data={"source": "kjv", "seed": seed}, cache_dir=cache, val_tokens=16384, num_threads=1,
                       recipe={"ref_batch": BATCH, **recipe})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--s", type=float, default=2.0, help="width multiplier (width = 8 s)")
    parser.add_argument("--budget", type=float, default=4e11)
    args = parser.parse_args()
    wsd = {"schedule": "wsd", "warmdown_frac": 0.2}
    fractions = (0.25, 0.5)
    budgets = [args.budget * f for f in fractions]
    rows = {c: {"branch": [], "wsd": [], "paper": []} for c in budgets}
    with tempfile.TemporaryDirectory() as cache:
        for seed in range(args.seeds):
            main_run = train(trial(cache, args.s, args.budget, seed, {**wsd, "branch_budgets": budgets}))
            for i, c in enumerate(budgets):
                rows[c]["branch"].append(main_run[f"branch{i}.val_loss"])
                rows[c]["wsd"].append(train(trial(cache, args.s, c, seed, wsd))["val_loss"])
                rows[c]["paper"].append(train(trial(cache, args.s, c, seed, {"schedule": "paper"}))["val_loss"])
            print(f"seed {seed}: main run {main_run['val_loss']:.4f} nats at C={args.budget:.3g}, "
                  f"FLOPs spent {main_run['flops_spent']:.3g} "
                  f"({main_run['flops_spent'] / main_run['budget_flops'] - 1:+.1%} "
                  f"for the branches)")
    print(f"width {8 * args.s:g}, r 2, {args.seeds} seeds; losses in nats")
    print(f"{'D_k budget':>11} {'branch':>8} {'paper':>8} {'|br-wsd|':>9} {'|br-paper|':>11} {'scatter (sd)':>13} "
          f"{'verdict':>8}")
    for c, v in rows.items():
        branch, wsd_run, paper = (np.array(v[k]) for k in ("branch", "wsd", "paper"))
        scatter = paper.std(ddof=1) if len(paper) > 1 else float("nan")
        gap = np.abs(branch - paper).mean()
        print(f"{c:>11.3g} {branch.mean():>8.4f} {paper.mean():>8.4f} {np.abs(branch - wsd_run).mean():>9.5f} "
              f"{gap:>11.4f} "
              f"{scatter:>13.4f} {'within' if gap <= scatter else 'outside':>8}")


if __name__ == "__main__":
    main()
