"""Throughput of the real training trial (objectives.train) at the demo shapes, next to baselines measured
in the same run: the machine's fp32 matmul FLOP/s (the MFU denominator) and a bare model step.

    python tests/benchmarks/bench_train.py                 # demo shapes, 1 thread (one trial per core)
    python tests/benchmarks/bench_train.py --threads 2
    python tests/benchmarks/bench_train.py --isoflop       # also: val loss over widths x budgets (minutes)
    python tests/benchmarks/bench_train.py --compile       # also: the trial with torch.compile on CPU

Demo template: LoopedConfig.iso_depth(s, r, depth=8, prelude=2, coda=2, width_unit=16, head_dim=16,
seq_len=128, vocab_size=256), s in {2, 4, 8} (d = 32, 64, 128), r in {1, 2, 4}, KJV bytes.
"Bare step" = forward + backward + AdamW on a fixed random batch (no data pipeline, no Muon, no schedule):
trial / bare shows what the trial's loop costs on top of the model itself.
Achieved FLOP/s = flops_per_token (model.accounting) x tokens/s; MFU = achieved / matmul peak.
--compile: per shape, two more trials with ``recipe.compile_cpu`` sharing one compile cache (model/runtime.py):
"cold" compiles (its tokens/s include the warm-up), "warm" is a later trial of the same shape that loads the
compiled graphs from the cache, as every trial after the first of a sweep does; "warm/eager" is the speed-up
of a sweep's trial; "graphs" counts the graphs Dynamo compiled for the two (4: training and evaluation, each
compiled by both trials, the warm one from the cache; 0 would mean they ran eager). Every shape runs in this one
process, as trial after trial does in a reused Tune actor. Timing figures: take them on otherwise idle cores.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch
from torch._dynamo.utils import counters

from loopscale.model import LoopedConfig, LoopedLM, flops_per_token
from loopscale.objectives import TrialConfig, train
from loopscale.objectives.peak import device_peak_flops, peak_description

TEMPLATE = dict(depth=8, prelude=2, coda=2, width_unit=16, head_dim=16, seq_len=128, vocab_size=256)


def bare_step_tokens_per_s(config: LoopedConfig, batch_tokens: int, steps: int) -> float:
    torch.manual_seed(0)
    model = LoopedLM(config)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    idx = torch.randint(0, config.vocab_size, (batch_tokens // config.seq_len, config.seq_len + 1))

    def step() -> None:
        model(idx[:, :-1], idx[:, 1:]).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return steps * batch_tokens / (time.perf_counter() - start)


def trial_config(s: float, r: int, budget: float, batch_tokens: int, cache_dir: str, threads: int,
                 **recipe) -> TrialConfig:
    return TrialConfig(budget_flops=float(budget), s=float(s), r=r, template=TEMPLATE, batch_tokens=batch_tokens,
                       seed=0, data={"source": "kjv"}, cache_dir=cache_dir, num_threads=threads, recipe=recipe)


def throughput(cache_dir: str, threads: int, batch_tokens: int, steps: int, compiled: bool = False,
               sizes: tuple[float, ...] = (2, 4, 8)) -> None:
    cpu = torch.device("cpu")
    peak = device_peak_flops(cpu)
    print(f"{peak_description(cpu)}: {peak / 1e9:.1f} GFLOP/s; batch {batch_tokens} tokens, {steps} steps/shape")
    print(f"{'s':>3} {'d':>4} {'r':>2} {'tok/s':>8} {'GFLOP/s':>8} {'MFU':>5} {'bare tok/s':>10} {'trial/bare':>10}"
          + (f" {'cold tok/s':>10} {'warm tok/s':>10} {'warm MFU':>8} {'warm/eager':>10} {'graphs':>6}"
             if compiled else ""))
    for s in sizes:
        for r in (1, 2, 4):
            config = LoopedConfig.iso_depth(s, r, **TEMPLATE)
            f = flops_per_token(config)
            m = train(trial_config(s, r, f * batch_tokens * steps, batch_tokens, cache_dir, threads,
                                   log_every=steps))
            bare = bare_step_tokens_per_s(config, batch_tokens, max(steps // 2, 3))
            line = (f"{s:>3} {config.width:>4} {r:>2} {m['tokens_per_s']:>8.0f} {m['tokens_per_s'] * f / 1e9:>8.1f} "
                    f"{m['mfu']:>5.0%} {bare:>10.0f} {m['tokens_per_s'] / bare:>10.2f}")
            if compiled:
                graphs = counters["stats"]["unique_graphs"]
                cold, warm = (train(trial_config(s, r, f * batch_tokens * steps, batch_tokens, cache_dir, threads,
                                                 log_every=steps, compile_cpu=True)) for _ in range(2))
                line += (f" {cold['tokens_per_s']:>10.0f} {warm['tokens_per_s']:>10.0f} {warm['mfu']:>8.0%} "
                         f"{warm['tokens_per_s'] / m['tokens_per_s']:>10.2f} "
                         f"{counters['stats']['unique_graphs'] - graphs:>6d}")
            print(line, flush=True)


def isoflop(cache_dir: str, threads: int, batch_tokens: int) -> None:
    print("\nval loss (nats/byte) by width and budget, r = 2; KJV unigram entropy ~3.02")
    budgets = (2e11, 8e11, 3.2e12)
    print(f"{'s':>3} {'d':>4} " + " ".join(f"{b:>10.1e}" for b in budgets))
    for s in (2, 4, 8):
        cells = []
        for budget in budgets:
            m = train(trial_config(s, 2, budget, batch_tokens, cache_dir, threads))
            cells.append(f"{m['val_loss']:>6.3f}/{m['steps']:<3d}")
        print(f"{s:>3} {LoopedConfig.iso_depth(s, 2, **TEMPLATE).width:>4} " + " ".join(cells), flush=True)
    print("(cells: val loss / optimizer steps)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch-tokens", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--isoflop", action="store_true", help="also train a small width x budget grid")
    parser.add_argument("--compile", action="store_true", help="also the trial with torch.compile on CPU")
    parser.add_argument("--sizes", default="2,4,8", help="width multipliers s, comma-separated")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as cache_dir:
        throughput(cache_dir, args.threads, args.batch_tokens, args.steps, args.compile,
                   tuple(float(x) for x in args.sizes.split(",")))
        if args.isoflop:
            isoflop(cache_dir, args.threads, args.batch_tokens)


if __name__ == "__main__":
    main()
