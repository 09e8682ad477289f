"""Training-step throughput of LoopedLM next to two baselines measured in the same run.

    python tests/benchmarks/bench_model.py            # CPU shapes (+ the paper's shapes if CUDA)
    python tests/benchmarks/bench_model.py --quick    # fewer steps

Achieved FLOP/s = flops_per_token (model.accounting, the paper's formula) x tokens/s. On CPU each shape's step
(forward, backward, AdamW) is timed twice on the same weights and tokens: through LoopedLM, and through the
project's independent reference forward (``ref_logits`` in tests/test_model.py, the paper's formulas written
out on the raw weights, which the model's tests compare it to), so "vs ref" says what the module's fused
kernels (SDPA, F.rms_norm, real-valued RoPE) buy over the plain formulas. "of peak" is the achieved FLOP/s over
a large fp32 matmul on this machine at the same thread count, measured in this run (objectives.peak): the
ceiling a CPU training step can approach. On CUDA it runs the paper's shapes (s = 6-12, seq 2048, bf16
autocast, torch.compile, flash attention through SDPA) and reports MFU against the device's dense bf16 peak.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from loopscale.model import LoopedConfig, LoopedLM, flops_per_token
from loopscale.model.runtime import autocast, maybe_compile
from loopscale.objectives.peak import device_peak_flops, peak_description

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for the reference model
from test_model import ref_logits  # noqa: E402

# (width, head_dim, r) at depth 20, byte vocabulary, sequence 256, batch 8.
CPU_SHAPES = [(64, 16, 1), (64, 16, 4), (128, 32, 1), (128, 32, 4), (256, 64, 1), (256, 64, 4)]

# the loss of a step: (model, inputs, targets) -> scalar
StepLoss = Callable[[torch.nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]


def model_loss(model: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return model(inputs, targets)


def reference_loss(model: LoopedLM, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The same cross-entropy through the reference forward on ``model``'s weights."""
    logits = ref_logits(model, inputs)
    return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


def step_throughput(config: LoopedConfig, batch: int, steps: int, device: torch.device, fast: bool,
                    loss_of: StepLoss = model_loss) -> float:
    """Tokens per second of full training steps (forward, backward, AdamW), after two warm-up steps; the loss
    through LoopedLM, or through ``loss_of`` on its weights."""
    torch.manual_seed(0)
    model = LoopedLM(config).to(device)
    step_model, _ = maybe_compile(model, device, enabled=fast)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=device.type == "cuda")
    idx = torch.randint(0, config.vocab_size, (batch, config.seq_len + 1), device=device)

    def step() -> None:
        with autocast(device, bf16=fast):
            loss = loss_of(step_model, idx[:, :-1], idx[:, 1:])
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


def run_cpu(steps: int, widths: set[int]) -> None:
    device = torch.device("cpu")
    peak = device_peak_flops(device)
    print(f"{peak_description(device)}: {peak / 1e9:.1f} GFLOP/s (this run)")
    print(f"{'d':>5} {'hd':>4} {'r':>2} {'tok/s':>8} {'ref tok/s':>9} {'vs ref':>6} {'GFLOP/s':>8} {'of peak':>7}")
    for width, head_dim, r in (shape for shape in CPU_SHAPES if shape[0] in widths):
        config = LoopedConfig.iso_depth(width / head_dim, r, width_unit=head_dim, head_dim=head_dim, seq_len=256,
                                        vocab_size=256)
        tps = step_throughput(config, batch=8, steps=steps, device=device, fast=False)
        ref = step_throughput(config, batch=8, steps=steps, device=device, fast=False, loss_of=reference_loss)
        achieved = tps * flops_per_token(config)
        print(f"{width:>5} {head_dim:>4} {r:>2} {tps:>8.0f} {ref:>9.0f} {tps / ref:>6.2f} {achieved / 1e9:>8.1f} "
              f"{achieved / peak:>7.0%}", flush=True)


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


def cpu_widths(text: str) -> set[int]:
    """``--widths``: comma-separated widths of CPU_SHAPES."""
    known = {w for w, _, _ in CPU_SHAPES}
    widths = {int(w) for w in text.split(",") if w.strip().isdigit()}
    if not widths or len(widths) != len([w for w in text.split(",") if w.strip()]) or not widths <= known:
        raise argparse.ArgumentTypeError(f"{text!r}: widths of the CPU shapes, comma-separated, from "
                                         f"{', '.join(map(str, sorted(known)))}")
    return widths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer timed steps")
    parser.add_argument("--widths", type=cpu_widths, default={w for w, _, _ in CPU_SHAPES},
                        help="CPU shapes of these widths only, e.g. 64,128")
    args = parser.parse_args()
    run_cpu(steps=2 if args.quick else 8, widths=args.widths)
    if torch.cuda.is_available():
        run_gpu(steps=5 if args.quick else 20)
    else:
        print("no CUDA device present: GPU throughput and MFU not measured (nothing guessed)")


if __name__ == "__main__":
    main()
