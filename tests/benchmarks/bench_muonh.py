"""MuonH against torch's Muon on the demo's shapes: validation loss, same tokens, seed and batch order.

    python tests/benchmarks/bench_muonh.py            # r = 1 and r = 4 at C = 6e11, s = 3 (~219 steps), 3 rates each
    python tests/benchmarks/bench_muonh.py --quick    # r = 1 only, the middle rate of each

A quality benchmark (losses, not seconds): any machine load gives the same figures. The demo template (effective
depth 8 = 2 + 4 + 2, width 8 s, byte vocabulary, sequence 128), the embedded KJV text, 4,096-token batches with
the rates quoted at that batch (``ref_batch``). Each optimizer runs at three base rates a factor 2 apart around
its default, so neither is judged at a rate that suits only the other; the AdamW groups are identical. Also runs
the best MuonH rate with ``injection = "hyperconnect"`` (K = 2) on the looped cell.

Measured 2026-12-01 on the 2-core machine (val loss, nats; rate = the trial's matrix rate):
  r = 1, seed 0   Muon 0.04 / 0.08 / 0.16: 1.922 / 1.913 / 1.987;  MuonH 0.052 / 0.104 / 0.208: 1.725 / 1.721 / 1.821
  r = 1, seed 1   Muon 0.08: 1.899;  MuonH 0.104: 1.740                  (MuonH - Muon: -0.19 and -0.16)
                  (seed 1: the same two trials with model and batch-order seed 1, run by hand)
  r = 4, seed 0   Muon 0.08: 1.988;  MuonH 0.108: 1.944;  MuonH + hyperconnect (K = 2): 1.746
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

from loopscale.objectives import TrialConfig, train, trial_lrs

TEMPLATE = dict(depth=8, prelude=2, coda=2, width_unit=8, head_dim=8, injection="linear", vocab_size=256, seq_len=128)
RATES = {"muon": (0.04, 0.08, 0.16), "muonh": (0.028, 0.056, 0.112)}  # base rates (MuonH's move by the data rule)


def trial(cache_dir: str, optimizer: str, base_lr: float, r: int, injection: str = "linear") -> TrialConfig:
    return TrialConfig(budget_flops=6e11, s=3.0, r=r, template={**TEMPLATE, "injection": injection},
                       batch_tokens=4096, seed=0, data={"source": "kjv"}, cache_dir=cache_dir, val_tokens=32768, num_threads=1,
                       recipe={"optimizer": optimizer, "base_lr": base_lr, "ref_batch": 4096})


def run(config: TrialConfig) -> dict:
    started = time.time()
    metrics = train(config)
    return dict(optimizer=config.recipe["optimizer"], injection=config.template["injection"], r=config.r,
                base_lr=config.recipe["base_lr"], lr=round(trial_lrs(config)["matrices"], 4),
                steps=metrics["steps"], val_loss=round(metrics["val_loss"], 4), status=metrics["status"],
                wall_s=round(time.time() - started, 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    recurrences = (1,) if args.quick else (1, 4)
    with tempfile.TemporaryDirectory() as cache_dir:
        best: dict[tuple[str, int], dict] = {}
        for r in recurrences:
            for optimizer, rates in RATES.items():
                for base_lr in rates[1:2] if args.quick else rates:
                    row = run(trial(cache_dir, optimizer, base_lr, r))
                    print(json.dumps(row), flush=True)
                    if row["status"] == "ok" and row["val_loss"] < best.get((optimizer, r), {"val_loss": 1e9})["val_loss"]:
                        best[(optimizer, r)] = row
            if r > 1 and ("muonh", r) in best:
                print(json.dumps(run(trial(cache_dir, "muonh", best[("muonh", r)]["base_lr"], r, "hyperconnect"))),
                      flush=True)
        for r in recurrences:
            a, b = best.get(("muon", r)), best.get(("muonh", r))
            if a and b:
                print(f"r={r}: best Muon {a['val_loss']:.4f} (lr {a['lr']:g}), best MuonH {b['val_loss']:.4f} "
                      f"(lr {b['lr']:g}); MuonH - Muon = {b['val_loss'] - a['val_loss']:+.4f} nats")


if __name__ == "__main__":
    main()
