"""Peak FLOP/s of the device a trial runs on: the denominator of its model FLOPs utilisation (MFU).

CUDA: the vendor's dense bf16 tensor-core peak for known parts (H100 / H200 SXM 989 TFLOP/s, A100 312
TFLOP/s), else a measured bf16 matmul. CPU: a measured fp32 matmul at the thread count in force; that is the
ceiling a CPU training step can approach (a CPU step is bound by its matmuls), so CPU MFU reads "share of what
this machine's matmul reaches". Measured once per (device, thread count) per process, in about 0.3 s.
"""

from __future__ import annotations

import time

import torch

# Dense bf16 peaks (no sparsity) by a substring of ``torch.cuda.get_device_name``; first match wins.
CUDA_PEAKS = (("H200", 989e12), ("H100", 989e12), ("A100", 312e12))
MEASURE_SIZE = 1024
MEASURE_SECONDS = 0.3

_cache: dict[tuple[str, int], tuple[float, str]] = {}


def device_peak_flops(device: torch.device) -> float:
    """Peak FLOP/s of ``device`` (at the current thread count on CPU)."""
    return _cached(device)[0]


def peak_description(device: torch.device) -> str:
    """How ``device_peak_flops`` got its number: a table value or a measurement, and of what."""
    return _cached(device)[1]


def _cached(device: torch.device) -> tuple[float, str]:
    key = (str(device), torch.get_num_threads())
    if key not in _cache:
        _cache[key] = _peak(device)
    return _cache[key]


def _peak(device: torch.device) -> tuple[float, str]:
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for part, flops in CUDA_PEAKS:
            if part in name:
                return flops, f"{name}: dense bf16 table value"
        # A 1024 matmul takes microseconds on a GPU: time bigger ones, several per timing.
        return measure_matmul_flops(device, torch.bfloat16, size=4096, reps=20), f"{name}: measured bf16 matmul"
    return measure_matmul_flops(device, torch.float32), f"cpu: measured fp32 matmul, {torch.get_num_threads()} threads"


def measure_matmul_flops(device: torch.device, dtype: torch.dtype, size: int = MEASURE_SIZE,
                         seconds: float = MEASURE_SECONDS, reps: int = 1) -> float:
    """Best achieved FLOP/s of ``reps`` square ``size`` matmuls (2 size^3 FLOPs each), timed together,
    over about ``seconds``."""
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    out = torch.empty(size, size, device=device, dtype=dtype)
    torch.matmul(a, b, out=out)  # warm-up: kernel selection, thread pool start
    _sync(device)
    best = float("inf")
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        start = time.perf_counter()
        for _ in range(reps):
            torch.matmul(a, b, out=out)
        _sync(device)
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 * reps / best


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
