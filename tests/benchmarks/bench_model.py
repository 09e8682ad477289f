"""Training-step throughput of LoopedLM next to the machine's own matmul FLOP/s, measured in the same run.

    python tests/benchmarks/bench_model.py            # CPU shapes of shared/CPU_SCALE.md (+ GPU shapes if CUDA)
    python tests/benchmarks/bench_model.py --quick    # fewer steps

Achieved FLOP/s = flops_per_token (model.accounting, the paper's formula) x tokens/s. On CPU the ratio to a
large fp32 matmul is the figure that matters (CPU_SCALE.md lists the paper's own code at the same shapes:
30-65% of ~115 GFLOP/s). On CUDA it runs the paper's shapes (s = 6-12, seq 2048, bf16 autocast, torch.compile,
flash attention through SDPA) and reports MFU against the device's peak.
"""

from __future__ import annotations

import argparse
import time

import torch

from loopscale.model import LoopedConfig, LoopedLM, flops_per_token
from loopscale.model.runtime import autocast, maybe_compile
from loopscale.objectives.peak import device_peak_flops

# (width, head_dim, r) at depth 20, byte vocabulary, sequence 256, batch 8: the rows of CPU_SCALE.md.
CPU_SHAPES = [(64, 16, 1), (64, 16, 4), (128, 32, 1), (128, 32, 4), (256, 64, 1), (256, 64, 4)]
CPU_REFERENCE_TOKENS_PER_S = {(64, 1): 3468, (64, 4): 3719, (128, 1): 1828, (128, 4): 1839, (256, 1): 623,
                              (256, 4): 660}


def step_throughput(config: LoopedConfig, batch: int, steps: int, device: torch.device, fast: bool) -> float:
    """Tokens per second of full training steps (forward, backward, AdamW), after two warm-up steps."""
    torch.manual_seed(0)
    model = LoopedLM(config).to(device)
    step_model, _ = maybe_compile(model, device, enabled=fast)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=device.type == "cuda")
    idx = torch.randint(0, config.vocab_size, (batch, config.seq_len + 1), device=device)

    def step() -> None:
        with autocast(device, bf16=fast):
            loss = step_model(idx[:, :-1], idx[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(2):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return steps * batch * config.seq_len / (time.perf_counter() - start)


def run_cpu(steps: int) -> None:
    device = torch.device("cpu")
    peak = device_peak_flops(device)
    print(f"CPU, {torch.get_num_threads()} threads; measured fp32 matmul peak {peak / 1e9:.1f} GFLOP/s")
    print(f"{'d':>5} {'hd':>4} {'r':>2} {'tok/s':>8} {'ref tok/s':>9} {'vs ref':>6} {'GFLOP/s':>8} {'of peak':>7}")
    for width, head_dim, r in CPU_SHAPES:
        config = LoopedConfig.iso_depth(width / head_dim, r, width_unit=head_dim, head_dim=head_dim, seq_len=256,
                                        vocab_size=256)
        tps = step_throughput(config, batch=8, steps=steps, device=device, fast=False)
        achieved = tps * flops_per_token(config)
        ref = CPU_REFERENCE_TOKENS_PER_S[(width, r)]
        print(f"{width:>5} {head_dim:>4} {r:>2} {tps:>8.0f} {ref:>9} {tps / ref:>6.2f} {achieved / 1e9:>8.1f} "
              f"{achieved / peak:>7.0%}")


def run_gpu(steps: int) -> None:
    device = torch.device("cuda")
    peak = device_peak_flops(device)
    print(f"GPU {torch.cuda.get_device_name()}: bf16 dense peak {peak / 1e12:.0f} TFLOP/s")
    print(f"{'s':>3} {'d':>5} {'r':>2} {'tok/s':>10} {'TFLOP/s':>8} {'MFU':>5}")
    for s in (6, 8, 10, 12):
        for r in (1, 4):
            config = LoopedConfig.iso_depth(s, r)
            tps = step_throughput(config, batch=8, steps=steps, device=device, fast=True)
            achieved = tps * flops_per_token(config)
            print(f"{s:>3} {config.width:>5} {r:>2} {tps:>10.0f} {achieved / 1e12:>8.1f} {achieved / peak:>5.0%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer timed steps")
    args = parser.parse_args()
    run_cpu(steps=3 if args.quick else 8)
    if torch.cuda.is_available():
        run_gpu(steps=5 if args.quick else 20)
    else:
        print("no CUDA device present: GPU throughput and MFU not measured (nothing guessed)")


if __name__ == "__main__":
    main()
