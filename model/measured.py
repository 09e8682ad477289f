"""Measured accounting: N_once, N_rec, N_embed and training FLOPs per token of any architecture, from its module.

The module is built on the meta device (no memory, no arithmetic) at the trial's shape and run on one sequence
of ``seq_len`` tokens: the loss forward in training mode (counted, with its backward, and read), the logits
forward (checked, and its vocabulary projection found):

* **Roles.** Every read of a parameter by an aten operation is recorded as an access: the path of operations
  from the parameter (views, casts and any arithmetic on weights alone, such as ``w = W * scale``: data flow
  from parameters that does not pass through the tokens), the operation, the argument position and its other
  non-tensor arguments. Per parameter, n(r) is how often its most repeated access happens in one forward at r.
  The module is built a second time at r' = 2r (else r + 1, the first the factory builds; the same shapes and
  shared block, ``n_recur`` layers, run r' times: LoopedConfig needs no divisibility, only ``iso_depth`` does)
  and the role follows from the growth: n(r') = n(r) is ``once`` (N_once); k more reads per recurrence and none
  outside the loop, n = k r - c with c >= 0, is ``loop`` (N_rec: in proportion to r, c = 0, or a gate skipped on
  the last recurrence, read r - 1 times). A weight read several times whatever r (a prelude over token chunks, a
  GRU's steps, a prelude reused as the coda) is once; per-loop slices of one tensor (``A[i]`` at loop i: a
  different path each loop) are once; a weight read in the loop and outside it (n = r + c, c > 0) has no role
  and is refused in one line, as is
  a module that no second r builds: ``module.loopscale_roles()`` declares roles, and overrides the measured
  role of the parameters it names. Both r are read from the same forward, the loss's in training mode (a coda
  run after every exit is read r times at r and 2r at 2r: the loop). The rule is the same at r = 1: the plain
  stack's layers that the module at r' = 2 runs twice are ``loop``, as the closed form files the shared block of
  a plain LoopedLM under N_rec (at r = 1 the law reads only N = N_once + N_rec, r^phi = 1); a parameter of the
  plain stack that the module at r' lacks (a plain stack the factory replaces when looped) repeats nowhere: once.
  The token embedding and the vocabulary projection are ``embed`` (N_embed): an ``nn.Embedding`` of
  ``vocab_size`` rows and the last ``nn.Linear`` with ``vocab_size`` outputs a forward calls, tied or not
  (``architecture.embed_names``). A parameter no forward reads is an error (it would count as a model size but
  never train), and so is a module without parameters.
* **FLOPs.** ``torch.utils.flop_counter.FlopCounterMode`` over forward and backward of the loss, divided by the
  tokens. On the meta device attention counts in full (4 h q T per layer forward, as the paper counts it); the
  fused CPU flash-attention kernel would count 0. Softmax and element-wise work between activations count
  nothing. A scale (a weight-derived tensor of at most one dimension, applied to the tokens by an op the counter
  counts nothing for: a norm's scale, a bias, a gate) counts as the closed form counts LoopedLM's norm scales
  (model/accounting.py): 2 FLOPs per weight entry and position forward, 6 when gradients flow through it (a
  recurrence run without gradients: 2). The scale applied straight to the embedding's rows (the embedding's own
  norm: the rows reach it through no weight) counts with the lookup, nothing, as the paper's code counts it. So
  the built-in measured is its closed form, to the FLOP (tests/test_measured.py).
  The count is checked against a floor, call by call in the forward. An *application* reads a weight-derived
  tensor W of two or more dimensions (n entries) together with tokens, in an operation that is neither
  element-wise, a view nor a gather (``_Reads``). Whatever its layout (a matmul over T tokens costs 2 n T, a
  matrix-vector product 2 n, a depthwise convolution 2 n T / d_in ... ), it multiplies every entry of W at
  least once, so it costs at least 2 n FLOPs in the counter's convention (a multiply-add is 2). An application
  counted below 2 n is an op the counter has no formula for (``torch.mv``, a custom kernel: counted 0) and is
  refused in one line naming it, however small its share of the total: a floor summed over the model (2 n per
  token and application, x 3 with backward's dW and dX) would be masked by attention, which it cannot bound.
  A total of 0 FLOPs (a module whose work is all element-wise) is refused too: budgets are spent in FLOPs.
  Backward is counted, not checked: a custom autograd function's backward in uncounted ops goes unseen.
* **Compute that depends on the data.** The meta device holds no values, so a forward that reads one to decide
  what to compute (``if done.all(): break``, ``.item()``, a mask's ``nonzero``) cannot run there, and the
  counter cannot see what it would compute. In training mode that is refused in one line (a trial's tokens
  follow from FLOPs its shape fixes: exit early only when not ``self.training``); an exit in evaluation mode
  alone trains at the counted full depth, and its serving counts (``measure_inference``, in evaluation mode) are
  refused in one line rather than charged the full r.

Serving counts (``measure_inference``): forward FLOPs per token are FlopCounterMode's count of one forward to the
logits on ``context`` tokens in evaluation mode (no backward; scales at 2 FLOPs per entry), the module built with
``seq_len = context``; the KV cache holds, per
token, the keys and values of every ``F.scaled_dot_product_attention`` call of that forward (their sizes, read
as the call is made: grouped or shared keys count as the module computes them). Attention written without that
function is not seen and counts no cache; weights are N + N_embed of ``measure``.

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
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import FlopCounterMode

from . import architecture
from .counts import Accounting, InferenceCost
from .config import LoopedConfig

ROLES = ("once", "loop", "embed")
_MEMO: dict[str, Accounting] = {}
_SERVING: dict[str, InferenceCost] = {}  # measure_inference's, per process
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
    """(counts, role of every parameter by name), measured on the meta device: the logits forward checked and its
    vocabulary projection found, the loss forward (and backward) counted and read at r, the loss forward read at
    r' (module docstring)."""
    with torch.device("meta"):
        module = architecture.build(config)
        idx = torch.zeros(1, config.seq_len, dtype=torch.long)
    sizes = dict(module.named_parameters())
    if not sizes:
        raise ValueError(f"architecture {config.architecture!r}: the module has no parameters, nothing to count "
                         f"or train")
    called = check_logits(module, config, idx)
    flops, reads = training_flops(module, config, idx)
    embedding = architecture.embed_names(module, config.vocab_size, called)
    roles = parameter_roles(module, config, reads, embedding)
    count = {role: sum(sizes[name].numel() for name, r in roles.items() if r == role) for role in ROLES}
    return Accounting(N_once=count["once"], N_rec=count["loop"], N_embed=count["embed"],
                      flops_per_token=flops), roles


def check_logits(module: nn.Module, config: LoopedConfig, idx: torch.Tensor) -> list[str]:
    """The forward's contract without targets, logits (B, T, V), checked on one forward in training mode without
    gradients; the names of the ``nn.Linear`` of V outputs it called, in order (``architecture.embed_names``)."""
    name = config.architecture
    expected = (*idx.shape, config.vocab_size)
    module.train()
    with architecture.vocab_linear_calls(module, config.vocab_size) as called, torch.no_grad():
        logits = call_forward(module, name, idx)
    if not isinstance(logits, torch.Tensor) or tuple(logits.shape) != expected:
        got = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise ValueError(f"architecture {name!r}: forward(idx) returned {got}, expected logits of shape "
                         f"{expected} (batch, seq_len, vocab_size)")
    return called


def _check_loss(loss: Any, name: str) -> None:
    """The forward's contract with targets: the mean cross-entropy, a 0-d tensor."""
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
        got = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise ValueError(f"architecture {name!r}: forward(idx, targets) returned {got}, expected the mean "
                         f"cross-entropy as a 0-d tensor")


def call_forward(module: nn.Module, name: str, idx: torch.Tensor, targets: torch.Tensor | None = None) -> Any:
    """``module(idx)`` or ``module(idx, targets)``; what it raises becomes one line naming the architecture. On the
    meta device a forward that reads a tensor's value (``.item()``, ``if mask.all()``, a mask's ``nonzero``) has
    none to read: that line says what the counter cannot see (``DATA_DEPENDENT``)."""
    try:
        return module(idx) if targets is None else module(idx, targets)
    except Exception as exc:
        what = "forward(idx)" if targets is None else "forward(idx, targets)"
        text = str(exc).strip().splitlines()
        first = text[0] if text else "(no message)"
        if idx.device.type == "meta" and _reads_values(exc):
            mode = "training" if module.training else "evaluation"
            raise ValueError(f"architecture {name!r}: {what} in {mode} mode reads a tensor's value ({first}), but "
                             f"the FLOP counter runs on the meta device, without data, and cannot see compute that "
                             f"depends on the values (an early exit): {DATA_DEPENDENT[mode]}") from None
        raise ValueError(f"architecture {name!r}: {what} raised {type(exc).__name__}: {first}") from None


# What a forward that branches on values meets on the meta device, and, per mode, what to do about it.
_VALUE_READS = ("cannot be called on meta tensors", "no data!", "data-independent implementation does not exist")
DATA_DEPENDENT = {
    "training": "a trial's tokens follow from FLOPs its shape fixes, so train at the full depth (exit early only "
                "when not self.training)",
    "evaluation": "its serving FLOPs and KV cache depend on the data and are not counted; ask only for its "
                  "training counts (no --inference-tokens, --max-memory)",
}


def _reads_values(exc: BaseException) -> bool:
    return isinstance(exc, (RuntimeError, NotImplementedError)) and any(m in str(exc) for m in _VALUE_READS)


class _Reads(TorchDispatchMode):
    """Records, during one forward, each parameter's reads (module docstring) and, under a ``FlopCounterMode``
    entered before it, the first application of a weight that the counter counts below its floor and the FLOPs
    of the scales (``scale_flops``).

    A tensor is an activation when it flows from the tokens (``inputs``), weight-derived when it flows from
    parameters and not from the tokens (a view, a cast, ``W * scale``): reading it reads those parameters, along
    the path of operations that derived it. An application is an operation, neither element-wise, a view nor
    a gather, that reads a weight-derived tensor of two or more dimensions together with an activation. A scale
    is a weight-derived tensor of at most one dimension that an operation the counter counts nothing for applies
    to an activation (a norm's scale, a bias, a gate); ``rows`` are the activations computed from the embedding's
    rows by operations that read no weight, whose scale is the embedding's own.
    """

    def __init__(self, params: dict[int, str], inputs: tuple[torch.Tensor, ...], counter: FlopCounterMode | None):
        super().__init__()
        self.origin: dict[int, tuple[tuple[str, tuple], ...]] = {i: ((name, ()),) for i, name in params.items()}
        self.activations = {id(t) for t in inputs}
        self.rows: set[int] = set()
        self.keep: list[torch.Tensor] = []  # outputs stay alive, so that no other tensor reuses their id
        self.accesses: dict[str, dict[tuple, int]] = defaultdict(lambda: defaultdict(int))
        self.counter, self.uncounted, self.scale_flops = counter, None, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        flat, _ = tree_flatten((args, kwargs))
        others = tuple(repr(a) for a in flat if not isinstance(a, torch.Tensor))
        derived: list[tuple[str, tuple]] = []
        for position, a in enumerate(flat):
            for name, path in self.origin.get(id(a), ()):
                self.accesses[name][(path, str(func), position, others)] += 1
                derived.append((name, (*path, (str(func), position, others))))
        tensors = [a for a in flat if isinstance(a, torch.Tensor)]
        fed = [a for a in tensors if id(a) in self.activations]
        weights = [a for a in tensors if id(a) in self.origin]
        before = self.counter.get_total_flops() if self.counter is not None else 0
        out = func(*args, **kwargs)
        outputs = [o for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor)]
        if fed and weights and self.counter is not None:
            self._count(func, fed, weights, outputs, self.counter.get_total_flops() - before,
                        torch.is_grad_enabled() and any(t.requires_grad for t in tensors))
        gather = fed and weights and func.overloadpacket.__name__ in _GATHERS
        row = gather or (fed and not weights and all(id(a) in self.rows for a in fed))
        for o in outputs:
            if fed or derived:
                self.keep.append(o)
                if fed:
                    self.activations.add(id(o))
                    self.origin.pop(id(o), None)
                    if row:
                        self.rows.add(id(o))
                else:
                    self.origin[id(o)] = tuple(derived)
        return out

    def _count(self, func, fed: list[torch.Tensor], weights: list[torch.Tensor], outputs: list[torch.Tensor],
               counted: int, backward: bool) -> None:
        """The floor of an application (module docstring) and the FLOPs of a scale: 2 per weight entry and
        position it applies to forward, 6 with backward, as the closed form counts a norm scale."""
        matrices = [w for w in weights if w.dim() >= 2]
        if matrices and self.uncounted is None and _applies(func) and counted < 2 * sum(w.numel() for w in matrices):
            self.uncounted = (str(func), self.origin[id(matrices[0])][0][0])
        scales = [w for w in weights if w.dim() <= 1]
        if scales and counted == 0 and outputs and not all(id(a) in self.rows for a in fed):
            positions = outputs[0].numel() // max(w.numel() for w in scales)
            self.scale_flops += (6 if backward else 2) * positions * sum(w.numel() for w in scales)


_GATHERS = ("embedding", "_embedding_bag", "embedding_bag", "index", "index_select", "gather", "take", "cat",
            "stack", "copy_", "index_put", "index_put_", "scatter", "masked_scatter")


def _applies(func) -> bool:
    """An operation that may apply a weight: neither element-wise, a view nor a gather (``_Reads``)."""
    first = func._schema.arguments[0].alias_info if func._schema.arguments else None
    return (torch.Tag.pointwise not in func.tags and (first is None or first.is_write)
            and func.overloadpacket.__name__ not in _GATHERS)


def _reads(module: nn.Module, config: LoopedConfig, idx: torch.Tensor,
           counter: FlopCounterMode | None = None) -> tuple[_Reads, Any]:
    """(the reads of one loss forward in training mode, the loss); under ``counter`` backward runs too, outside
    the reads. Every r is read from this same forward (``parameter_roles``)."""
    recorder = _Reads({id(p): name for name, p in module.named_parameters()}, (idx,), counter)
    module.train()
    with recorder:
        loss = call_forward(module, config.architecture, idx, idx)
    _check_loss(loss, config.architecture)
    if counter is not None and loss.requires_grad:
        loss.backward()
    return recorder, loss


def _most_reads(recorder: _Reads) -> dict[str, int]:
    """Per parameter, how often its most repeated access happens in one forward."""
    return {name: max(accesses.values()) for name, accesses in recorder.accesses.items()}


def parameter_roles(module: nn.Module, config: LoopedConfig, reads: dict[str, int],
                    embedding: set[str]) -> dict[str, str]:
    """The role of every parameter by name (module docstring), from ``reads`` (``_most_reads`` at config.r) and
    ``embedding`` (``architecture.embed_names``)."""
    params = dict(module.named_parameters())
    asked = architecture.roles_asked(module)
    for name, role in asked.items():
        if name not in params:
            raise ValueError(f"architecture {config.architecture!r}: loopscale_roles() names {name!r}, which is no "
                             f"parameter of the module")
        if role not in ROLES:
            raise ValueError(f"architecture {config.architecture!r}: loopscale_roles() gives {name!r} the role "
                             f"{role!r}; roles are {', '.join(ROLES)}")
    unused = [name for name in params if name not in reads and name not in embedding and name not in asked]
    if unused:
        raise ValueError(f"architecture {config.architecture!r}: parameter {unused[0]!r} is read by no forward at "
                         f"r={config.r}" + (f" (and {len(unused) - 1} more)" if len(unused) > 1 else ""))
    measured = [name for name in params if name not in embedding and name not in asked]
    grown = _reads_grown(config, measured) if measured else {}
    roles = {name: "embed" for name in embedding if name in params}
    for name in measured:
        (r_a, n_a), (r_b, n_b) = (config.r, reads[name]), grown[name]
        if n_b is None and r_a == 1:  # the plain stack's layer, replaced in the looped module: nothing repeats
            roles[name] = "once"
        elif n_b is None:
            raise ValueError(f"architecture {config.architecture!r}: parameter {name!r} is no parameter of the "
                             f"module built at r={r_b}, so its role cannot be measured; declare it in "
                             f"loopscale_roles()")
        elif n_b == n_a:
            roles[name] = "once"
        elif (n_b - n_a) % (r_b - r_a) == 0 and 0 < (n_b - n_a) // (r_b - r_a) * r_a >= n_a:
            roles[name] = "loop"  # k reads more per recurrence, and none outside the loop: n = k r - c, c >= 0
        else:
            raise ValueError(f"architecture {config.architecture!r}: parameter {name!r} is read {n_a} times per "
                             f"forward at r={r_a} and {n_b} at r={r_b}, neither the same (used once) nor growing "
                             f"with r and read only in the loop; declare its role in loopscale_roles()")
    return {**roles, **asked}


def _reads_grown(config: LoopedConfig, names: list[str]) -> dict[str, tuple[int, int | None]]:
    """(r', most repeated access at r') of each named parameter, the module built at r' = 2r, else r + 1 (the
    first the factory builds): the same shapes and shared block (n_recur), run r' times; ``bptt_k`` keeps its
    share of the recurrences. None for a name the module at r' has no parameter of, 0 for one it does not read."""
    tried = []
    for r in (2 * config.r, config.r + 1):
        k = None if config.bptt_k is None else max(1, config.bptt_k * r // config.r)
        try:
            grown = dataclasses.replace(config, r=r, bptt_k=k)
            with torch.device("meta"):
                module = architecture.build(grown)
                idx = torch.zeros(1, config.seq_len, dtype=torch.long)
        except ValueError as exc:
            tried.append(f"r={r}: {exc}")
            continue
        params, reads = dict(module.named_parameters()), _most_reads(_reads(module, grown, idx)[0])
        return {name: (r, reads.get(name, 0) if name in params else None) for name in names}
    raise ValueError(f"architecture {config.architecture!r}: roles are measured by building the module at a "
                     f"second r, and {'; '.join(tried)}; declare every role in loopscale_roles()")


def training_flops(module: nn.Module, config: LoopedConfig, idx: torch.Tensor) -> tuple[int, dict[str, int]]:
    """(FLOPs of forward + backward of the loss on ``idx`` per token, the most repeated access of every
    parameter in that forward); a count the module docstring's floor refutes is a one-line ValueError."""
    counter = FlopCounterMode(display=False)
    with counter:
        recorder, _ = _reads(module, config, idx, counter)
    name = config.architecture
    if recorder.uncounted is not None:
        op, param = recorder.uncounted
        raise ValueError(f"architecture {name!r}: {op} applies {param!r} but FlopCounterMode counts it below 2 "
                         f"FLOPs per weight: an op the FLOP counter does not count; write it with torch.matmul "
                         f"or F.linear")
    total = counter.get_total_flops()
    if total == 0:
        raise ValueError(f"architecture {name!r}: FlopCounterMode counts 0 FLOPs: its work is element-wise or "
                         f"in ops the FLOP counter does not count, and budgets are spent in FLOPs")
    return round((total + recorder.scale_flops) / idx.numel()), _most_reads(recorder)


def measure_inference(config: LoopedConfig, context: int) -> InferenceCost:
    """The measured serving counts of ``config``'s architecture at ``context`` tokens (module docstring)."""
    key = f"{cache_key(config)}-{context}"
    if key not in _SERVING:
        with torch.device("meta"):
            module = architecture.build(dataclasses.replace(config, seq_len=context))
            idx = torch.zeros(1, context, dtype=torch.long)
        counter, cache = FlopCounterMode(display=False), _KeysAndValues()
        recorder = _Reads({id(p): name for name, p in module.named_parameters()}, (idx,), counter)
        module.eval()  # served as evaluated: in evaluation mode
        with counter, cache, recorder, torch.no_grad():
            call_forward(module, config.architecture, idx)
        counts = measure(config)
        flops = counter.get_total_flops() + recorder.scale_flops
        _SERVING[key] = InferenceCost(context=context, forward_flops_per_token=round(flops / context),
                                      kv_entries_per_token=cache.entries // context, params=counts.N + counts.N_embed)
    return _SERVING[key]


class _KeysAndValues(TorchFunctionMode):
    """Counts the numbers in the keys and values of every ``F.scaled_dot_product_attention`` call."""

    def __init__(self) -> None:
        super().__init__()
        self.entries = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.nn.functional.scaled_dot_product_attention:
            named = dict(zip(("query", "key", "value"), args), **kwargs)
            self.entries += named["key"].numel() + named["value"].numel()
        return func(*args, **kwargs)


def _write_whole(path: Path, text: str) -> None:
    """Written to a temporary file, then renamed: a reader never sees half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)
