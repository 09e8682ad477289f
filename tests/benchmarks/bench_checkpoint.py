"""A trial checkpoint's size and write time against the trial's step time (run on demand; prints figures,
asserts nothing).

    python tests/benchmarks/bench_checkpoint.py [--folder /tmp] [--chunk-mib 256]

Demo: the largest search cell's trial at its first-guess width, built for real on this machine's CPU: one
optimizer step timed (after a warm-up step, so the optimizers hold their state), then its whole state
(objectives/checkpoint.py) written with ``save_state`` to ``--folder``: bytes, seconds, and the write as a
fraction of a step and of ``[resources] checkpoint_s``.

Paper: its largest trial is far beyond this machine's memory, so its state is sized from the accounting
(search/plan/walltime.py: ``CHECKPOINT_BYTES_PER_PARAM`` per parameter, embedding included) and its write
time from ``--chunk-mib`` of fp32 written here the same way; its step time from the step's FLOPs at an
H100's dense bf16 peak and an assumed MFU of 40%.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time

import torch

from loopscale.model import account
from loopscale.model.architecture import build
from loopscale.objectives.checkpoint import rng_state, save_state
from loopscale.objectives.optimizers import build_optimizers
from loopscale.objectives.recipe import group_lrs, normalize_recipe
from loopscale.search import SweepSpec
from loopscale.search.plan.walltime import CHECKPOINT_BYTES_PER_PARAM

H100_BF16_FLOPS = 989e12
ASSUMED_MFU = 0.4


def largest_cell(spec: SweepSpec):
    cell = max(spec.cells("search"), key=lambda c: (c.budget, c.r))
    return cell, spec.grid.model(cell.first_guess, cell.r)


def demo(folder: str) -> None:
    spec = SweepSpec.from_toml("demo")
    cell, config = largest_cell(spec)
    recipe = normalize_recipe(spec.training.recipe)
    torch.manual_seed(0)
    model = build(config)
    optimizers = build_optimizers(model, group_lrs(recipe, spec.grid.template, config, 10 * spec.grid.batch_tokens,
                                                   spec.grid.batch_tokens), recipe, config.vocab_size)
    rows = torch.randint(0, config.vocab_size, (spec.grid.batch_tokens // spec.grid.seq_len, spec.grid.seq_len + 1))

    def step() -> float:
        started = time.perf_counter()
        model(rows[:, :-1], rows[:, 1:]).backward()
        for optimizer in optimizers:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - started

    step()
    step_s = step()
    state = {"model": model.state_dict(), "optimizers": [o.state_dict() for o in optimizers], "rng": rng_state()}
    started = time.perf_counter()
    path = save_state(state, folder)
    write_s = time.perf_counter() - started
    size = path.stat().st_size
    params = sum(p.numel() for p in model.parameters())
    print(f"demo  C={cell.budget:.3g} r={cell.r} width={config.width}: {params / 1e6:.2f}M parameters, "
          f"checkpoint {size / 2**20:.1f} MiB ({size / params:.1f} B/param), written in {write_s:.3f} s; "
          f"step {step_s:.3f} s on {torch.get_num_threads()} CPU threads: a write = {write_s / step_s:.2f} steps, "
          f"{write_s / spec.placement.checkpoint_s:.2e} of checkpoint_s {spec.placement.checkpoint_s:g} s")


def paper(folder: str, chunk_mib: int) -> None:
    spec = SweepSpec.from_toml("paper")
    cell, config = largest_cell(spec)
    counts = account(config)
    params = counts.N + counts.N_embed
    size = CHECKPOINT_BYTES_PER_PARAM * params
    chunk = torch.zeros(chunk_mib * 2**20 // 4)
    started = time.perf_counter()
    save_state({"chunk": chunk}, folder)
    per_byte = (time.perf_counter() - started) / (chunk_mib * 2**20)
    write_s = size * per_byte
    step_s = counts.flops_per_token * spec.grid.batch_tokens / (H100_BF16_FLOPS * ASSUMED_MFU)
    print(f"paper C={cell.budget:.3g} r={cell.r} width={config.width}: {params / 1e6:.0f}M parameters, "
          f"checkpoint ~{size / 2**30:.1f} GiB, ~{write_s:.1f} s at this disk's {1 / per_byte / 1e6:.0f} MB/s; "
          f"step ~{step_s:.3f} s on an H100 at {ASSUMED_MFU:.0%} MFU: a write = {write_s / step_s:.0f} steps, "
          f"{write_s / spec.placement.checkpoint_s:.2%} of checkpoint_s {spec.placement.checkpoint_s:g} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", default="/tmp")
    parser.add_argument("--chunk-mib", type=int, default=256)
    args = parser.parse_args()
    folder = tempfile.mkdtemp(prefix="bench-checkpoint-", dir=args.folder)
    try:
        demo(folder)
        paper(folder, args.chunk_mib)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
