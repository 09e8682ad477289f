"""Device-dependent speed options: bf16 autocast and ``torch.compile``.

Both are requested by the caller and applied only where they pay off: bf16 on CUDA; ``torch.compile`` on
CUDA (the whole model, one graph), and on CPU when the caller asks for it too (``cpu=True``). On CPU the
compiled unit is the transformer ``Block`` (every one of the model, which all share one shape): a width compiles
once whatever r, into a small graph (6-7 s cold per width on this project's 2-core machine after a process's
first, 17 s, against ~36 s for the whole model), and the rest of the step (the loop, the fused LM head of
model/lm_head.py) stays eager.
An architecture without ``Block`` modules is compiled whole.

The warm-up is paid once per shape per machine: Inductor's on-disk caches (FX graph cache, AOTAutograd cache;
TORCHINDUCTOR_CACHE_DIR) live in ``compile_cache_dir()``, a user cache folder that every trial of every sweep
on the machine shares, so a later trial of a shape, in any process and any sweep, loads the compiled graphs
instead of compiling them. Each compile starts from a clean in-memory state (``torch._dynamo.reset``), so a
process that runs many trials keeps compiling them. Eager stays the default on CPU (tests, tiny trials) and the
reason string says what ran, so a sweep spec is portable.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys

import torch

from .user_cache import user_cache_dir


def compile_cache_dir() -> str:
    """Where compiled graphs are kept for every sweep on this machine (module docstring)."""
    return user_cache_dir("inductor")


def keep_freed_memory(device: torch.device) -> bool:
    """Have glibc keep freed blocks of up to 32 MiB for reuse instead of handing them back to the kernel (mallopt
    M_MMAP_THRESHOLD 32 MiB, its maximum, and M_TRIM_THRESHOLD 1 GiB). By default blocks above 128 KiB are
    mapped afresh at each allocation, and a CPU step's activations (0.5-4 MiB at the demo's shapes) then pay
    page faults on first touch every step: 1-3% of a demo step, measured two trials side by side
    (docs/log.md, 2026-12-06). The process keeps its peak memory. CPU steps on Linux with glibc only; elsewhere a
    no-op (False)."""
    if device.type != "cpu" or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # musl and other C libraries
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # <malloc.h>
    return bool(libc.mallopt(m_mmap_threshold, 32 << 20)) and bool(libc.mallopt(m_trim_threshold, 1 << 30))


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


def maybe_compile(module: torch.nn.Module, device: torch.device, enabled: bool, *, cpu: bool = False,
                  cache_dir: str | None = None) -> tuple[torch.nn.Module, str]:
    """``torch.compile`` the module on CUDA when asked, and its blocks on CPU when ``cpu`` too; compiled graphs
    are cached under ``cache_dir`` (default ``compile_cache_dir()``; module docstring). Returns (module, reason)
    where reason says what ran."""
    if not enabled:
        return module, "eager (compile not requested)"
    if device.type != "cuda" and not cpu:
        return module, "eager (compile skipped on CPU: not requested for CPU)"
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.abspath(cache_dir or compile_cache_dir())  # read at each compile
    import torch._dynamo
    import torch._inductor.config as inductor_config  # lazily: importing Inductor costs seconds

    from .looped import Block

    inductor_config.fx_graph_cache = True
    # A process may run many trials (Tune reuses its actors), and Dynamo keeps at most recompile_limit (8) graphs
    # per code object: each shape adds two (training and evaluation), so from the fifth shape on the model
    # would run eager, silently. Each trial compiles as in a fresh process instead; the on-disk caches stay.
    torch._dynamo.reset()
    blocks = [m for m in module.modules() if isinstance(m, Block)] if device.type != "cuda" else []
    if not blocks:
        return torch.compile(module), "compiled"
    for block in blocks:
        block.compile()
    return module, "compiled"
