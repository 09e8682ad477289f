"""Measured accounting: N_once, N_rec, N_embed and training FLOPs per token of any architecture, from its module.

The module is built on the meta device (no memory, no arithmetic) at the trial's shape and run once on one
sequence of ``seq_len`` tokens:

* **Roles.** Every read of a parameter, or of a view of it, by an aten operation is recorded as an access: the
  view path from the parameter, the operation, the argument position and the operation's other non-tensor
  arguments. A parameter read the same way more than once per forward (the shared block, run r times) is
  ``loop`` (N_rec); one whose every access happens once is ``once`` (N_once), and so are per-loop slices of one
  tensor (``A[i]`` at loop i: a different view path each loop). The token embedding and the vocabulary
  projection are ``embed`` (N_embed): an ``nn.Embedding`` of ``vocab_size`` rows and the last ``nn.Linear`` with
  ``vocab_size`` outputs a forward calls, tied or not (``architecture.embed_names``).
  ``module.loopscale_roles()`` overrides the roles of the parameters it names. A parameter no forward reads is
  an error (it would count as a model size but never train).
* **FLOPs.** ``torch.utils.flop_counter.FlopCounterMode`` over forward and backward of the loss, divided by the
  tokens. On the meta device attention counts in full (4 h q T per layer forward, as the paper counts it); the
  fused CPU flash-attention kernel would count 0. Norm scales, softmax and element-wise work count nothing (the
  closed form of LoopedLM counts 6 FLOPs per norm scale: the one difference, model/accounting.py).

Results are kept per process and, once ``cache_in`` named a folder (the sweep's cache_dir), as JSON under
``<cache>/architectures/``, keyed by the architecture's source fingerprint, its options and the config's shape.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import FlopCounterMode

from . import architecture
from .counts import Accounting
from .config import LoopedConfig

ROLES = ("once", "loop", "embed")
_MEMO: dict[str, Accounting] = {}
_CACHE: list[Path] = []  # the folder ``cache_in`` named, if any
# The measuring code is part of the key: a count cached under an older role rule must not outlive the rule.
_MEASURER = hashlib.sha256(Path(architecture.__file__).read_bytes() + Path(__file__).read_bytes()).hexdigest()


def cache_in(folder: str | os.PathLike | None) -> None:
    """Keep measured counts under ``folder`` (a sweep's cache_dir) from now on in this process; None: memory only."""
    _CACHE[:] = [Path(folder)] if folder and "://" not in str(folder) else []


def measure(config: LoopedConfig) -> Accounting:
    """The measured counts of ``config``'s architecture (module docstring); cached."""
    key = cache_key(config)
    if key in _MEMO:
        return _MEMO[key]
    path = _CACHE[0] / "architectures" / f"{key}.json" if _CACHE else None
    if path is not None and path.is_file():
        result = Accounting(**json.loads(path.read_text()))
    else:
        result = measure_module(config)[0]
        if path is not None:
            _write_whole(path, json.dumps(dataclasses.asdict(result), sort_keys=True))
    _MEMO[key] = result
    return result


def cache_key(config: LoopedConfig) -> str:
    shape = {k: v for k, v in config.to_dict().items() if k not in ("architecture", "options")}
    blob = json.dumps({"fingerprint": architecture.fingerprint(config.architecture), "options": config.options,
                       "shape": shape, "measurer": _MEASURER}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def measure_module(config: LoopedConfig) -> tuple[Accounting, dict[str, str]]:
    """(counts, role of every parameter by name), measured on the meta device."""
    with torch.device("meta"):
        module = architecture.build(config)
        idx = torch.zeros(1, config.seq_len, dtype=torch.long)
    check_output(module, config, idx)
    roles = parameter_roles(module, config, idx)
    sizes = dict(module.named_parameters())
    count = {role: sum(sizes[name].numel() for name, r in roles.items() if r == role) for role in ROLES}
    return Accounting(N_once=count["once"], N_rec=count["loop"], N_embed=count["embed"],
                      flops_per_token=training_flops(module, config, idx)), roles


def check_output(module: nn.Module, config: LoopedConfig, idx: torch.Tensor) -> None:
    """The forward's contract: logits (B, T, V) without targets, a 0-d loss with them."""
    name = config.architecture
    expected = (*idx.shape, config.vocab_size)
    logits = call_forward(module, name, idx)
    if not isinstance(logits, torch.Tensor) or tuple(logits.shape) != expected:
        got = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise ValueError(f"architecture {name!r}: forward(idx) returned {got}, expected logits of shape "
                         f"{expected} (batch, seq_len, vocab_size)")
    loss = call_forward(module, name, idx, idx)
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
        got = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise ValueError(f"architecture {name!r}: forward(idx, targets) returned {got}, expected the mean "
                         f"cross-entropy as a 0-d tensor")


def call_forward(module: nn.Module, name: str, idx: torch.Tensor, targets: torch.Tensor | None = None) -> Any:
    """``module(idx)`` or ``module(idx, targets)``; what it raises becomes one line naming the architecture."""
    try:
        return module(idx) if targets is None else module(idx, targets)
    except Exception as exc:
        what = "forward(idx)" if targets is None else "forward(idx, targets)"
        text = str(exc).strip().splitlines()
        raise ValueError(f"architecture {name!r}: {what} raised {type(exc).__name__}: "
                         f"{text[0] if text else '(no message)'}") from None


class _Accesses(TorchDispatchMode):
    """Records each parameter's accesses (module docstring) during one forward."""

    def __init__(self, params: dict[int, str]):
        super().__init__()
        self.origin: dict[int, tuple[str, tuple]] = {i: (name, ()) for i, name in params.items()}
        self.keep: list[torch.Tensor] = []  # views stay alive, so that no other tensor reuses their id
        self.accesses: dict[str, dict[tuple, int]] = defaultdict(lambda: defaultdict(int))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        flat, _ = tree_flatten((args, kwargs))
        others = tuple(repr(a) for a in flat if not isinstance(a, torch.Tensor))
        sources = [self.origin[id(a)] for a in flat if isinstance(a, torch.Tensor) and id(a) in self.origin]
        for position, a in enumerate(flat):
            if isinstance(a, torch.Tensor) and id(a) in self.origin:
                name, path = self.origin[id(a)]
                self.accesses[name][(path, str(func), position, others)] += 1
        out = func(*args, **kwargs)
        schema_args = func._schema.arguments
        is_view = bool(schema_args) and schema_args[0].alias_info is not None and not schema_args[0].alias_info.is_write
        if sources and (is_view or func is torch.ops.aten._to_copy.default):
            name, path = sources[0]
            for o in tree_flatten(out)[0]:
                if isinstance(o, torch.Tensor):
                    self.origin[id(o)] = (name, (*path, (str(func), others)))
                    self.keep.append(o)
        return out


def parameter_roles(module: nn.Module, config: LoopedConfig, idx: torch.Tensor) -> dict[str, str]:
    """The role of every parameter by name (module docstring)."""
    params = dict(module.named_parameters())
    recorder = _Accesses({id(p): name for name, p in params.items()})
    with recorder:
        call_forward(module, config.architecture, idx)
    embedding = architecture.embed_names(module, config.vocab_size)
    roles: dict[str, str] = {}
    for name in params:
        if name in embedding:
            roles[name] = "embed"
        elif name in recorder.accesses:
            roles[name] = "loop" if max(recorder.accesses[name].values()) > 1 else "once"
    for name, role in architecture.roles_asked(module).items():
        if name not in params:
            raise ValueError(f"architecture {config.architecture!r}: loopscale_roles() names {name!r}, which is no "
                             f"parameter of the module")
        if role not in ROLES:
            raise ValueError(f"architecture {config.architecture!r}: loopscale_roles() gives {name!r} the role "
                             f"{role!r}; roles are {', '.join(ROLES)}")
        roles[name] = role
    unused = [name for name in params if name not in roles]
    if unused:
        raise ValueError(f"architecture {config.architecture!r}: parameter {unused[0]!r} is read by no forward at "
                         f"r={config.r}" + (f" (and {len(unused) - 1} more)" if len(unused) > 1 else ""))
    return roles


def training_flops(module: nn.Module, config: LoopedConfig, idx: torch.Tensor) -> int:
    """FLOPs of forward + backward of the loss on ``idx``, per token."""
    counter = FlopCounterMode(display=False)
    with counter:
        loss = call_forward(module, config.architecture, idx, idx)
        if loss.requires_grad:
            loss.backward()
    return round(counter.get_total_flops() / idx.numel())


def _write_whole(path: Path, text: str) -> None:
    """Written to a temporary file, then renamed: a reader never sees half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)
