"""Device-dependent speed options: bf16 autocast and ``torch.compile``.

Both are requested by the caller and applied only where they pay off (CUDA); on CPU they degrade to plain
fp32 eager execution and say so through the returned reason, so a sweep spec is portable between a laptop
and a GPU cluster.
"""

from __future__ import annotations

import contextlib

import torch


def pick_device(requested: str = "auto") -> torch.device:
    """``auto`` -> cuda when available, else cpu; anything else is passed to ``torch.device``."""
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(requested)


def autocast(device: torch.device, bf16: bool) -> contextlib.AbstractContextManager:
    """bf16 autocast on CUDA when asked; a no-op context elsewhere (CPU bf16 matmuls are slower than fp32)."""
    if bf16 and device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def maybe_compile(module: torch.nn.Module, device: torch.device, enabled: bool) -> tuple[torch.nn.Module, str]:
    """``torch.compile`` the module on CUDA when asked. Returns (module, reason) where reason says what ran."""
    if not enabled:
        return module, "eager (compile not requested)"
    if device.type != "cuda":
        return module, "eager (compile skipped: only enabled on CUDA, where it pays for its start-up)"
    return torch.compile(module), "compiled"
