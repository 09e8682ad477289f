"""Tokens/s and MFU of the real training trial (objectives.train: MuonH, bf16 autocast, torch.compile, fused
AdamW, SDPA flash attention) at the paper's shapes on one CUDA device. Run by tests/gpu_check.sh.

    python tests/benchmarks/bench_gpu.py                       # s = 6, 10, 12 x r = 1, 4; 9 steps each
    python tests/benchmarks/bench_gpu.py --shapes 10:4 --steps 17

The paper's template (depth 20 = 2 + 16 + 2, width 64 s rounded to 128-wide heads, sequence 2048, vocabulary
32,064) at its batch of 262,144 tokens, in micro-batches of ``--micro`` tokens, on the embedded KJV text with a
trained 32,064-token BPE. Steady state: the trial reports its loss at steps 1, 2, 4, ...; tokens/s is taken
between the report of step 2 and the last one, so the first steps (torch.compile's tracing, cuDNN and allocator
warm-up) are left out. Each report reads the loss on the host, which synchronises the device, so the
timestamps are honest. MFU = flops_per_token (model.accounting, the paper's count) x tokens/s / the device's dense
bf16 peak (objectives/peak.py). "graphs" counts the graphs Dynamo compiled for the shape (training and
evaluation): 0 would mean the shape ran eager while the trial said "compiled" (Dynamo's recompile limit, see
model/runtime.maybe_compile), so its figures would not be compiled figures.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time

import torch
from torch._dynamo.utils import counters

from loopscale.model import LoopedConfig, flops_per_token
from loopscale.objectives import TrialConfig, prepare_data, train
from loopscale.objectives.peak import device_peak_flops, peak_description

TEMPLATE = dict(depth=20, prelude=2, coda=2, width_unit=64, head_dim=128, seq_len=2048, vocab_size=32064)
BATCH_TOKENS = 262_144
DATA = {"source": "kjv", "tokenizer": "bpe", "tokenizer_vocab": 32064}


def measure(s: float, r: int, steps: int, micro: int, cache_dir: str) -> dict[str, float]:
    config = LoopedConfig.iso_depth(s, r, **TEMPLATE)
    f = flops_per_token(config)
    marks: list[tuple[int, float]] = []
    graphs = counters["stats"]["unique_graphs"]
    trial = {"budget_flops": float(f * BATCH_TOKENS * steps), "r": r, "s": float(s), "template": TEMPLATE,
             "batch_tokens": BATCH_TOKENS, "seed": 0, "objective": "train", "data": DATA, "device": "cuda",
             "cache_dir": cache_dir, "val_tokens": 4 * TEMPLATE["seq_len"],
             "recipe": {"optimizer": "muonh", "micro_batch": micro, "log_every": 2, "bf16": True, "compile": True}}
    result = train(TrialConfig(**trial), report=lambda m: marks.append((m["tokens"], time.perf_counter())))
    (tokens_a, t_a), (tokens_b, t_b) = marks[1], marks[-1]
    tokens_per_s = (tokens_b - tokens_a) / (t_b - t_a)
    return {"width": config.width, "tokens_per_s": tokens_per_s,
            "mfu": tokens_per_s * f / device_peak_flops(torch.device("cuda")), "val_loss": result["val_loss"],
            "status": result["status"], "wall_s": result["wall_s"],
            "graphs": counters["stats"]["unique_graphs"] - graphs}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="6:1,6:4,10:1,10:4,12:1,12:4", help="s:r pairs, comma-separated")
    parser.add_argument("--steps", type=int, default=9, help="optimizer steps per shape (>= 4)")
    parser.add_argument("--micro", type=int, default=65_536, help="tokens per micro-batch")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_gpu: no CUDA device (torch.cuda.is_available() is False); nothing to measure", file=sys.stderr)
        return 1
    device = torch.device("cuda")
    print(f"{torch.cuda.get_device_name()}: peak {device_peak_flops(device) / 1e12:.0f} TFLOP/s "
          f"({peak_description(device)})", flush=True)
    with tempfile.TemporaryDirectory() as cache:
        started = time.perf_counter()
        prepare_data(DATA, TEMPLATE["seq_len"], cache, 4 * TEMPLATE["seq_len"])
        print(f"data: KJV, trained BPE, packed in {time.perf_counter() - started:.1f} s", flush=True)
        print(f"{'s':>4} {'r':>2} {'width':>6} {'tokens/s':>12} {'MFU':>6} {'val_loss':>9} {'wall_s':>7} "
              f"{'graphs':>6}", flush=True)
        for pair in args.shapes.split(","):
            s, r = pair.split(":")
            m = measure(float(s), int(r), args.steps, args.micro, cache)
            print(f"{float(s):>4g} {int(r):>2} {m['width']:>6} {m['tokens_per_s']:>12,.0f} {m['mfu']:>6.1%} "
                  f"{m['val_loss']:>9.4f} {m['wall_s']:>7.1f} {m['graphs']:>6d}  {m['status']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
