"""One dataclass for every looped-transformer shape.

The paper's template (Schwethelm et al. 2026, "How Much Is One Recurrence Worth?", Sec. 3): effective depth
``L_eff = n_prelude + r * n_recur + n_coda`` is held fixed (20). With r = 1 the model is a plain stack of 20
unique layers with no injection; with r > 1 it is 2 prelude layers, a shared block of (16 / r) layers run r
times, and 2 coda layers. Width ``d = width_unit * s`` rounded up to a multiple of the head dim (64 and 128 in
the paper), heads = d / head_dim.

Derived sizes are properties and never written back into fields, so a config round-trips through
``dataclasses.asdict`` / pickling unchanged.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

INJECTIONS = ("linear", "additive", "none", "hyperconnect")
# How many recurrences a training step runs: "fixed" (r every step) or "uniform" (s drawn per step, model/depth.py)
DEPTH_SAMPLINGS = ("fixed", "uniform")
# Fields added after caches keyed by ``to_dict`` were written, with the value that behaves as before: left out of
# ``to_dict`` at that value, so every existing key (model/measured.py's counts) stays what it was
ADDED_FIELDS: dict[str, Any] = {"depth_sampling": "fixed"}
BUILTIN = "loopscale:looped"  # the architecture name of the built-in LoopedLM (model/architecture.py)
# The paper's iso-depth template (Sec. 3; 32,000 tokens padded to 32,064): every default of
# ``LoopedConfig.iso_depth``. The search, its plan and the analysis ask ``iso_depth_template`` for them.
ISO_DEPTH: dict[str, Any] = dict(depth=20, prelude=2, coda=2, width_unit=64, head_dim=128, seq_len=2048,
                                 vocab_size=32064, injection="linear")


def iso_depth_template(template: dict[str, Any] | None = None) -> dict[str, Any]:
    """``template`` with every key it leaves out filled from the paper's (``ISO_DEPTH``)."""
    return {**ISO_DEPTH, **(template or {})}


def s_to_heads(s: float, width_unit: int, head_dim: int) -> float:
    """Heads of width multiplier s: width_unit * s / head_dim (whole when the width is buildable as is)."""
    return width_unit * s / head_dim


def heads_to_s(heads: float, width_unit: int, head_dim: int) -> float:
    """The width multiplier of ``heads`` heads: heads * head_dim / width_unit."""
    return heads * head_dim / width_unit


@dataclass(frozen=True)
class LoopedConfig:
    """Shape of a prelude / recurrent block / coda language model.

    Fields are exactly what a user chooses; ``n_heads``, ``effective_depth``, ``looped`` and
    ``mlp_hidden`` are derived.

    ``bptt_k``: truncated backprop through recurrences. ``None`` (default) back-propagates through all r
    recurrences; ``k`` in [1, r] lets only the last k recurrences carry gradients, the first r - k run
    forward-only (the paper's Delta-phi case study uses k = ceil(r / 2)).

    ``depth_sampling``: ``"fixed"`` (default) runs r recurrences at every training step; ``"uniform"`` draws the
    step's s from {1, ..., 2r - 1} (mean r; model/depth.py), gradients through the last min(s, ``bptt_k``), and
    evaluates at r. The built-in only, looped (r > 1), not with hyperconnections (their lane weights are per
    recurrence, r of them).

    ``lanes``: K, the number of lane states of ``injection = "hyperconnect"`` (the paper's best variant uses 2);
    ignored by the other injections.

    ``architecture``: the module this shape is built as, ``"package.module:factory"`` or
    ``"/abs/path/file.py:factory"`` (model/architecture.py), with ``options`` its factory's keyword arguments;
    ``BUILTIN`` is ``LoopedLM``, the one architecture counted in closed form (model/accounting.py).
    """

    width: int
    r: int = 1
    n_prelude: int = 2
    n_recur: int = 16
    n_coda: int = 2
    head_dim: int = ISO_DEPTH["head_dim"]
    vocab_size: int = ISO_DEPTH["vocab_size"]
    seq_len: int = ISO_DEPTH["seq_len"]
    injection: str = "none"
    bptt_k: int | None = None
    depth_sampling: str = "fixed"
    lanes: int = 2
    mlp_ratio: int = 4
    rope_theta: float = 10_000.0
    norm_eps: float = 1e-6
    logit_softcap: float = 15.0
    architecture: str = BUILTIN
    options: Mapping[str, Any] = field(default_factory=dict, hash=False)  # a dict is unhashable; eq compares it

    def __post_init__(self) -> None:
        _require(self.width > 0, f"width must be positive, got {self.width}")
        _require(self.head_dim > 0 and self.head_dim % 2 == 0,
                 f"head_dim must be a positive even number (RoPE rotates pairs), got {self.head_dim}")
        _require(self.width % self.head_dim == 0,
                 f"width {self.width} is not a multiple of head_dim {self.head_dim}")
        _require(self.r >= 1, f"r must be >= 1, got {self.r}")
        _require(self.n_recur >= 1, f"n_recur must be >= 1, got {self.n_recur}")
        _require(self.n_prelude >= 0 and self.n_coda >= 0, "n_prelude and n_coda must be >= 0")
        _require(self.injection in INJECTIONS, f"injection must be one of {INJECTIONS}, got {self.injection!r}")
        _require(self.r > 1 or self.injection == "none",
                 "r = 1 is a plain transformer: injection must be 'none'")
        _require(self.bptt_k is None or 1 <= self.bptt_k <= self.r,
                 f"bptt_k must be None or in [1, r={self.r}], got {self.bptt_k}")
        _require(self.lanes >= 1, f"lanes must be >= 1, got {self.lanes}")
        _require(self.injection != "hyperconnect" or self.grad_recurrences == self.r,
                 f"injection 'hyperconnect' needs backprop through every recurrence (its per-recurrence lane "
                 f"weights would get no gradient): bptt_k must be unset or r={self.r}, got {self.bptt_k}")
        _require(self.vocab_size >= 2 and self.seq_len >= 1, "vocab_size >= 2 and seq_len >= 1 required")
        _require(self.depth_sampling in DEPTH_SAMPLINGS,
                 f"depth_sampling must be one of {DEPTH_SAMPLINGS}, got {self.depth_sampling!r}")
        _require(self.depth_sampling == "fixed" or self.any_depth,
                 f"depth_sampling {self.depth_sampling!r} needs the built-in looped model (r > 1) without "
                 f"hyperconnections, whose loop runs any number of times; got architecture {self.architecture!r}, "
                 f"r={self.r}, injection {self.injection!r}")

    # ---- derived sizes -------------------------------------------------------------------------------
    @property
    def builtin(self) -> bool:
        """Built as ``LoopedLM``, whose counts are closed-form; any other architecture's are measured."""
        return self.architecture == BUILTIN

    @property
    def n_heads(self) -> int:
        return self.width // self.head_dim

    @property
    def looped(self) -> bool:
        """r > 1: the shared block is reused, with injection and a norm at the end of every recurrence."""
        return self.r > 1

    @property
    def any_depth(self) -> bool:
        """The built-in's loop, which runs any number of times with the same weights: looped, and without
        hyperconnections (whose lane weights exist for exactly r recurrences). Sampled depth needs it, and so
        does evaluating a looped model once (objectives/kept.py)."""
        return self.builtin and self.looped and self.injection != "hyperconnect"

    @property
    def effective_depth(self) -> int:
        """L_eff = n_prelude + r * n_recur + n_coda (the number of block applications per token)."""
        return self.n_prelude + self.r * self.n_recur + self.n_coda

    @property
    def mlp_hidden(self) -> int:
        return self.mlp_ratio * self.width

    @property
    def grad_recurrences(self) -> int:
        """How many of the r recurrences carry gradients (the last ``bptt_k``, or all r)."""
        return self.grad_recurrences_at(self.r)

    def grad_recurrences_at(self, s: int) -> int:
        """How many recurrences carry gradients in a pass that runs s of them: the last min(s, ``bptt_k``), or
        all s."""
        return s if self.bptt_k is None else min(s, self.bptt_k)

    # ---- constructors --------------------------------------------------------------------------------
    @classmethod
    def iso_depth(cls, s: float, r: int, *, depth: int = ISO_DEPTH["depth"], prelude: int = ISO_DEPTH["prelude"],
                  coda: int = ISO_DEPTH["coda"], width_unit: int = ISO_DEPTH["width_unit"],
                  head_dim: int = ISO_DEPTH["head_dim"], seq_len: int = ISO_DEPTH["seq_len"],
                  vocab_size: int = ISO_DEPTH["vocab_size"], injection: str = ISO_DEPTH["injection"],
                  bptt_k: int | None = None, depth_sampling: str = "fixed", **extra: Any) -> "LoopedConfig":
        """The paper's iso-depth template at width multiplier ``s`` and recurrence count ``r``.

        width = ceil(width_unit * s / head_dim) * head_dim. r = 1 gives ``depth`` unique layers
        (split prelude / recur / coda only for naming; no injection, no recurrence norm). r > 1 gives
        ``prelude`` + (depth - prelude - coda) / r shared layers run r times + ``coda``. ``bptt_k`` and
        ``depth_sampling`` act on looped models only (a template holds them for every r).
        """
        _require(s > 0, f"width multiplier s must be positive, got {s}")
        _require(width_unit > 0, f"width_unit must be positive, got {width_unit}")
        shared = depth - prelude - coda
        _require(shared >= 1, f"depth {depth} leaves no shared layers after prelude {prelude} and coda {coda}")
        _require(shared % r == 0,
                 f"r={r} does not divide the shared depth {shared} (= depth {depth} - prelude {prelude} - coda {coda})")
        width = math.ceil(s_to_heads(s, width_unit, head_dim)) * head_dim
        return cls(width=width, r=r, n_prelude=prelude, n_recur=shared // r, n_coda=coda, head_dim=head_dim,
                   vocab_size=vocab_size, seq_len=seq_len, injection=injection if r > 1 else "none",
                   bptt_k=bptt_k if r > 1 else None, depth_sampling=depth_sampling if r > 1 else "fixed", **extra)

    def to_dict(self) -> dict[str, Any]:
        """The fields, those of ``ADDED_FIELDS`` left out at their old behaviour's value."""
        fields = dataclasses.asdict(self)
        return {k: v for k, v in fields.items() if not (k in ADDED_FIELDS and v == ADDED_FIELDS[k])}


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)
