"""Device-dependent speed options: bf16 autocast and ``torch.compile``.

Both are requested by the caller and applied only where they pay off: bf16 on CUDA; ``torch.compile`` on
CUDA, and on CPU when the caller asks for it too (``cpu=True``): on CPU compiled steps run faster than eager,
after tens of seconds of compilation per shape (docs/log.md has the figures). That warm-up is paid once per
shape per sweep: ``cache_dir`` points Inductor's on-disk caches (FX graph cache,
AOTAutograd cache; TORCHINDUCTOR_CACHE_DIR) at a folder the sweep's trials share, so a later trial of the
same shape, in any process, loads the compiled graphs instead of compiling them; each compile starts from a
clean in-memory state (``torch._dynamo.reset``), so a process that runs many trials keeps compiling them.
Eager stays the default on CPU (tests, tiny trials) and the reason string says what ran, so a sweep spec is
portable.
"""

from __future__ import annotations

import contextlib
import os

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


def maybe_compile(module: torch.nn.Module, device: torch.device, enabled: bool, *, cpu: bool = False,
                  cache_dir: str | None = None) -> tuple[torch.nn.Module, str]:
    """``torch.compile`` the module on CUDA when asked, and on CPU when ``cpu`` too; compiled artifacts are
    cached under ``cache_dir`` (module docstring). Returns (module, reason) where reason says what ran."""
    if not enabled:
        return module, "eager (compile not requested)"
    if device.type != "cuda" and not cpu:
        return module, "eager (compile skipped on CPU: not requested for CPU)"
    if cache_dir:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.abspath(cache_dir)  # read by Inductor at each compile
    import torch._dynamo
    import torch._inductor.config as inductor_config  # lazily: importing Inductor costs seconds

    inductor_config.fx_graph_cache = True
    # A process may run many trials (Tune reuses its actors), and Dynamo keeps at most recompile_limit (8) graphs
    # per code object: each shape adds two (training and evaluation), so from the fifth shape on LoopedLM.forward
    # would run eager, silently. Each trial compiles as in a fresh process instead; the on-disk caches stay.
    torch._dynamo.reset()
    return torch.compile(module), "compiled"
