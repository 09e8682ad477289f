"""The demo's per-trial noise: run-to-run scatter of val_loss at a fixed shape, by eval size, and what common
random numbers (one data order and init seed for every width of a cell) buy.

    python tests/benchmarks/bench_demo_noise.py                          # Muon and MuonH, 4 seeds (~25 trials)
    python tests/benchmarks/bench_demo_noise.py --optimizers muonh --seeds 6

The demo's template (effective depth 8 = 2 + 4 + 2, heads of 4, sequence 128, KJV bytes, 4,096-token batches,
wsd schedule), r = 2, C = 2e11 (a mid-size demo cell), two widths a factor 2 apart (``--widths``, s = width / 4).
Per optimizer:

* init scatter: width 1 trained with init seeds 0..k-1 on one data order (data seed 0). Inside a demo every
  trial shares the data order, and widths of a cell get different initial weights whatever the seed (the
  tensors differ in shape), so this is the independent noise of one trial at fixed data: the ``noise`` of
  objectives/noise.py that tests/benchmarks/bench_demo_design.py needs.
* data scatter: both widths trained with init seed 0 on data seeds 0..k-1 (the data seed also draws the
  validation documents). sd of a width's loss over data seeds, and sd of the paired difference
  L(width 2) - L(width 1) at the same data seed: common random numbers cut the noise of a difference from
  sqrt(sd1^2 + sd2^2) (unpaired) to sd(paired).
* eval size: every trial is evaluated on the first 8k, 32k and all ``--val-tokens`` validation tokens (one
  model, nested prefixes of the same rows); scatter is reported at each.

Quality figures (losses): not timing-sensitive; the seconds per trial printed are, and depend on load.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import tempfile
import time

import numpy as np

from loopscale.objectives import train

train_module = importlib.import_module("loopscale.objectives.training")

TEMPLATE = dict(depth=8, prelude=2, coda=2, width_unit=4, head_dim=4, injection="linear", vocab_size=256,
                seq_len=128)
RATES = {"muon": 0.04, "muonh": 0.056}  # the demo's Muon base; MuonH's best base in bench_muonh.py
EVAL_SIZES = (8192, 32768)


class PrefixEval:
    """Wraps objectives.training.evaluate: also evaluates the model on nested prefixes of the validation rows."""

    def __init__(self, sizes: tuple[int, ...]):
        self.sizes, self.last = sizes, {}
        self.inner = train_module.evaluate

    def __call__(self, model, packed, device, bf16, rows, group=None):
        full = self.inner(model, packed, device, bf16, rows, group)
        seq = packed.seq_len
        self.last = {size: self.inner(model, dataclasses.replace(packed, val=packed.val[:size // seq]), device,
                                      bf16, rows, group) for size in self.sizes}
        self.last[len(packed.val) * seq] = full
        return full


def trial(cache: str, s: float, seed: int, data_seed: int, optimizer: str, args) -> dict:
    return dict(budget_flops=args.budget, s=s, r=args.r, template=TEMPLATE, batch_tokens=4096, seed=seed,
                data={"source": "kjv", "seed": data_seed}, cache_dir=cache, val_tokens=args.val_tokens,
                num_threads=1, recipe={"optimizer": optimizer, "base_lr": RATES[optimizer], "ref_batch": 4096,
                                       "schedule": "wsd"})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--optimizers", default="muon,muonh")
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--widths", default="8,16", help="two widths (multiples of 4)")
    parser.add_argument("--r", type=int, default=2)
    parser.add_argument("--budget", type=float, default=2e11)
    parser.add_argument("--val-tokens", type=int, default=131072)
    args = parser.parse_args()
    w1, w2 = (int(w) for w in args.widths.split(","))
    evaluator = PrefixEval(EVAL_SIZES)
    train_module.evaluate = evaluator  # the trial's evaluation, with the prefixes recorded
    print(f"r {args.r}, C {args.budget:.3g}, widths {w1}/{w2}, {args.seeds} seeds; val loss in nats", flush=True)
    with tempfile.TemporaryDirectory() as cache:
        for optimizer in args.optimizers.split(","):
            losses: dict[tuple, dict[int, float]] = {}

            def run(width: int, seed: int, data_seed: int) -> None:
                started = time.time()
                m = train(trial(cache, width / 4, seed, data_seed, optimizer, args))
                losses[width, seed, data_seed] = dict(evaluator.last)
                print(f"  {optimizer} width {width} init {seed} data {data_seed}: {m['val_loss']:.4f} "
                      f"({m['steps']} steps, lr {m['lr']:.3g}, {time.time() - started:.0f} s)", flush=True)

            for k in range(args.seeds):
                run(w1, 0, k)
                run(w2, 0, k)
            for k in range(1, args.seeds):
                run(w1, k, 0)
            sizes = sorted(next(iter(losses.values())))
            print(f"{optimizer}: {'eval tokens':>11} {'init sd':>8} {'data sd w1':>10} {'data sd w2':>10} "
                  f"{'unpaired diff sd':>16} {'paired diff sd':>14} {'mean w1':>8} {'mean w2':>8}")
            for size in sizes:
                init = np.array([losses[w1, k, 0][size] for k in range(args.seeds)])
                a = np.array([losses[w1, 0, k][size] for k in range(args.seeds)])
                b = np.array([losses[w2, 0, k][size] for k in range(args.seeds)])
                sd = lambda x: x.std(ddof=1)  # noqa: E731
                print(f"{'':>8}{size:>11} {sd(init):>8.4f} {sd(a):>10.4f} {sd(b):>10.4f} "
                      f"{np.hypot(sd(a), sd(b)):>16.4f} {sd(b - a):>14.4f} {a.mean():>8.4f} {b.mean():>8.4f}",
                      flush=True)


if __name__ == "__main__":
    main()
