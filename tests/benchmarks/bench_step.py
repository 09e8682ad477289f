"""The training step (forward, backward, every optimizer) at the demo's and the paper's shapes, against the
project's own plain path and against the machine's fp32 matmul peak, all measured in this run.

    python tests/benchmarks/bench_step.py                   # demo shapes, 1 thread (one trial per core)
    python tests/benchmarks/bench_step.py --paper 6,10      # also the paper's s = 6 and 10 (one 2,048-token row)
    python tests/benchmarks/bench_step.py --compile         # also the step with its blocks compiled (CPU)
    python tests/benchmarks/bench_step.py --profile 2,2     # a torch.profiler table of one demo step (s, r)

Variants of one model (same weights, same batch), timed in turns, ``--rounds`` rounds of ``--steps`` steps,
the median round reported:
  plain     the formulas written out (``fusions.EAGER_FUSIONS`` off: the soft-capped head and cross-entropy as
            separate passes, RoPE in reals) and MuonH stepping each matrix alone: the step as it was before the
            fusions and MuonH's batching;
  eager     the default CPU step: fused head and loss, RoPE as one complex multiply, MuonH batched by shape;
  compiled  (--compile) eager with every Block compiled (model/runtime.py), timed warm; its cold compile
            (training and evaluation graphs) is reported apart.
Columns: step time; optimizer share of the eager step (MuonH + AdamW ``step()``); achieved GFLOP/s =
``flops_per_token`` (model.accounting, the FLOPs the sweep charges) x tokens / step time; MFU against the fp32
matmul peak measured at this thread count; the ratios. Demo template: the demo preset's (effective depth 8 =
2 + 4 + 2, width 8 s, heads of 8, hyperconnections K = 2, sequence 128, byte vocabulary, 4,096-token batch, MuonH).
Paper template: the paper preset's (depth 20 = 2 + 16 + 2, width 64 s, heads of 128, linear injection, vocabulary
32,064, sequence 2,048), one row per step. Take the figures on otherwise idle cores (``uptime``) and quote the
matmul peak with them.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from loopscale.model import flops_per_token, fusions, runtime
from loopscale.model.looped import LoopedLM
from loopscale.objectives import TrialConfig
from loopscale.objectives.muonh import MuonH
from loopscale.objectives.peak import measure_matmul_flops
from loopscale.objectives.optimizers import build_optimizers
from loopscale.objectives.recipe import group_lrs, normalize_recipe

DEMO = dict(depth=8, prelude=2, coda=2, width_unit=8, head_dim=8, injection="hyperconnect", seq_len=128,
            vocab_size=256)
PAPER = dict(depth=20, prelude=2, coda=2, width_unit=64, head_dim=128, injection="linear", seq_len=2048,
             vocab_size=32064)
RECIPE = {"optimizer": "muonh", "base_lr": 0.02, "ref_batch": 4096, "schedule": "wsd"}


class UnbatchedMuonH(MuonH):
    """MuonH stepping every matrix alone (one Polar Express each): the optimizer before batching by shape."""

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self._step_stack([p], group["lr"], group["momentum"])


class Step:
    """One model, its optimizers and a fixed batch; ``__call__`` is one optimizer step, timed by part."""

    def __init__(self, template: dict, s: float, r: int, batch_tokens: int, unbatched: bool = False):
        trial = TrialConfig(budget_flops=1e12, s=float(s), r=r, template=template, batch_tokens=batch_tokens,
                            seed=0, data={"source": "kjv"}, recipe=RECIPE)
        self.config = trial.model_config
        recipe = normalize_recipe(trial.recipe)
        torch.manual_seed(0)
        self.model = LoopedLM(self.config)
        lrs = group_lrs(recipe, trial.template, self.config, 10 ** 6, batch_tokens)
        self.optimizers = build_optimizers(self.model, lrs, recipe, self.config.vocab_size)
        if unbatched:
            self.optimizers = [_unbatched(o) for o in self.optimizers]
        rows = batch_tokens // self.config.seq_len
        self.idx = torch.randint(0, self.config.vocab_size, (rows, self.config.seq_len + 1),
                                 generator=torch.Generator().manual_seed(1))
        self.optimizer_s = 0.0

    def __call__(self) -> None:
        self.model(self.idx[:, :-1], self.idx[:, 1:]).backward()
        started = time.perf_counter()
        for optimizer in self.optimizers:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        self.optimizer_s += time.perf_counter() - started


def _unbatched(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    if not isinstance(optimizer, MuonH):
        return optimizer
    plain = UnbatchedMuonH([p for g in optimizer.param_groups for p in g["params"]], lr=optimizer.defaults["lr"],
                           momentum=optimizer.defaults["momentum"])
    plain.param_groups[0].update({k: v for k, v in optimizer.param_groups[0].items() if k != "params"})
    return plain


def timed(step: Step, steps: int, fused: bool) -> tuple[float, float]:
    """(seconds per step, optimizer seconds per step) over ``steps`` steps, with the fusions on or off."""
    fusions.EAGER_FUSIONS = fused
    try:
        step.optimizer_s = 0.0
        started = time.perf_counter()
        for _ in range(steps):
            step()
        return (time.perf_counter() - started) / steps, step.optimizer_s / steps
    finally:
        fusions.EAGER_FUSIONS = True


def compile_blocks(step: Step) -> tuple[float, float]:
    """Compile the step's blocks (as a trial with ``compile_cpu`` does); (training, evaluation) compile seconds."""
    runtime.maybe_compile(step.model, torch.device("cpu"), True, cpu=True)
    started = time.perf_counter()
    step()
    train_s = time.perf_counter() - started
    started = time.perf_counter()
    with torch.no_grad():
        step.model(step.idx[:, :-1], step.idx[:, 1:])
    return train_s, time.perf_counter() - started


def compare(label: str, template: dict, s: float, r: int, batch_tokens: int, rounds: int, steps: int,
            compiled: bool, peak: float) -> None:
    variants: dict[str, tuple[Step, bool]] = {
        "plain": (Step(template, s, r, batch_tokens, unbatched=True), False),
        "eager": (Step(template, s, r, batch_tokens), True),
    }
    cold = ""
    if compiled:
        variants["compiled"] = (Step(template, s, r, batch_tokens), True)
        train_s, eval_s = compile_blocks(variants["compiled"][0])
        cold = f"  cold compile {train_s:.1f} s + {eval_s:.1f} s eval"
    for step, fused in variants.values():
        timed(step, 1, fused)  # warm-up: allocations, lazy state
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, (step, fused) in variants.items():
            times[name].append(timed(step, steps, fused))
    config = variants["eager"][0].config
    f = flops_per_token(config)
    median: Callable[[str, int], float] = lambda name, i: statistics.median(t[i] for t in times[name])  # noqa: E731
    cells = []
    for name in variants:
        sec = median(name, 0)
        cells.append(f"{name} {sec * 1e3:8.1f} ms {f * batch_tokens / sec / 1e9:6.1f} GFLOP/s "
                     f"{f * batch_tokens / sec / peak:4.0%}")
    eager = median("eager", 0)
    ratios = f"plain/eager {median('plain', 0) / eager:.2f}"
    if compiled:
        ratios += f"  eager/compiled {eager / median('compiled', 0):.2f}"
    print(f"{label} s={s:g} d={config.width} r={r}: " + " | ".join(cells), flush=True)
    print(f"    {ratios}  optimizer share: plain {median('plain', 1) / median('plain', 0):.0%}, eager "
          f"{median('eager', 1) / eager:.0%}{cold}", flush=True)


def profile(s: float, r: int, batch_tokens: int) -> None:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    step = Step(DEMO, s, r, batch_tokens)
    for _ in range(3):
        step()
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(5):
            step()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20, max_name_column_width=50))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--demo", default="1,2,3,4", help="demo width multipliers s, comma-separated ('' for none)")
    parser.add_argument("--paper", default="", help="paper width multipliers s, e.g. 6,10 (slow on CPU)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--profile", default="", help="s,r: print a profile of one demo step instead")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.profile:
        s, r = args.profile.split(",")
        return profile(float(s), int(r), 4096)
    peak = measure_matmul_flops(torch.device("cpu"), torch.float32)
    print(f"fp32 matmul peak, {args.threads} thread(s): {peak / 1e9:.1f} GFLOP/s (measured now)")
    for s in (float(x) for x in args.demo.split(",") if x):
        for r in (1, 2, 4):
            compare("demo", DEMO, s, r, 4096, args.rounds, args.steps, args.compile, peak)
    for s in (float(x) for x in args.paper.split(",") if x):
        for r in (1, 4):
            compare("paper", PAPER, s, r, PAPER["seq_len"], max(2, args.rounds // 2), 1, args.compile, peak)


if __name__ == "__main__":
    main()
