"""What a model must fit and how it is served: ``Constraints`` (a cap on N = N_once + N_rec, a cap on the bytes to
serve, and the context, batch, dtype and tokens that serving is counted at), the command-line flags that give
them, and the widest buildable model of an r that fits (``largest_width``).

Light on purpose (numpy and the accounting only): the parser of every ``loopscale`` command registers these flags,
and loads neither scipy nor matplotlib (analysis/cli.py). The allocation under them is analysis/constrained.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from loopscale.model import DTYPE_BYTES, inference, iso_depth_template

from . import numbers
from .sizes import SizeCurve


@dataclass(frozen=True)
class Constraints:
    """What the model must fit and how it is served. ``context`` None: the template's seq_len."""

    max_params: float | None = None
    max_memory: float | None = None
    context: int | None = None
    batch: int = 1
    dtype: str = "bfloat16"
    inference_tokens: float = 0.0

    def __post_init__(self) -> None:
        for name in ("max_params", "max_memory"):
            value = getattr(self, name)
            if value is not None and not (np.isfinite(value) and value > 0):
                raise ValueError(f"--{name.replace('_', '-')} must be a positive number, got {value:g}")
        if self.context is not None and self.context < 1:
            raise ValueError(f"--context must be a positive number of tokens, got {self.context}")
        if self.batch < 1:
            raise ValueError(f"--batch must be a positive number of sequences, got {self.batch}")
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"--dtype must be one of {', '.join(DTYPE_BYTES)}, got {self.dtype!r}")
        if not (np.isfinite(self.inference_tokens) and self.inference_tokens >= 0):
            raise ValueError(f"--inference-tokens must be a number of tokens >= 0, got {self.inference_tokens:g}")

    @property
    def capped(self) -> bool:
        return self.max_params is not None or self.max_memory is not None

    def context_of(self, curve: SizeCurve) -> int:
        return self.context or iso_depth_template(curve.template)["seq_len"]

    def memory_bytes(self, curve: SizeCurve, width: int) -> int:
        """Weights + KV cache of ``batch`` sequences of ``context`` tokens, the buildable model of ``width``."""
        return inference(curve.config(width), self.context_of(curve)).memory_bytes(self.batch, DTYPE_BYTES[self.dtype])

    def fits(self, curve: SizeCurve, width: int) -> bool:
        if self.max_params is not None and curve.sizes(width)["N"] > self.max_params:
            return False
        return self.max_memory is None or self.memory_bytes(curve, width) <= self.max_memory

    def text(self, template: dict[str, Any] | None) -> str:
        """One line saying what is capped and how serving is counted."""
        context = self.context or iso_depth_template(template)["seq_len"]
        parts = []
        if self.max_params is not None:
            parts.append(f"N = N_once + N_rec (unique non-embedding parameters) <= {numbers.count(self.max_params)}")
        if self.max_memory is not None:
            parts.append(f"weights + KV cache <= {numbers.count(self.max_memory)} bytes")
        serving = (f"served in {self.dtype}, KV cache of {self.batch} x {context} tokens, one K and V per block "
                   f"application (per loop)")
        if self.inference_tokens:
            serving += f", {numbers.count(self.inference_tokens)} tokens served at that context"
        return f"constraints: {'; '.join(parts) or 'none'}; {serving}"


def largest_width(curve: SizeCurve, constraints: Constraints) -> float:
    """The widest buildable model of ``curve`` that fits ``constraints`` (inf uncapped); a ValueError with one
    line when not even the narrowest (one head) does. Doubling, then bisection: both caps grow with width."""
    if not constraints.capped:
        return np.inf
    unit = curve.head_dim
    if not constraints.fits(curve, unit):
        narrowest = f"N {numbers.count(float(curve.sizes(unit)['N']))}"
        if constraints.max_memory is not None:
            narrowest += f", {numbers.count(constraints.memory_bytes(curve, unit))} bytes to serve"
        raise ValueError(f"the constraints are below the smallest buildable model at r={curve.r} (width {unit}: "
                         f"{narrowest}): raise the cap or leave that r out")
    lo, hi = 1, 2  # lo heads fit; find hi that does not
    while constraints.fits(curve, hi * unit):
        lo, hi = hi, 2 * hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if constraints.fits(curve, mid * unit) else (lo, mid)
    return float(lo * unit)


def check(constraints: Constraints, recurrences, template: dict[str, Any] | None) -> None:
    """Every requested r has a buildable model within the constraints (``largest_width``'s error otherwise)."""
    for r in recurrences:
        largest_width(SizeCurve.from_model(r, template), constraints)


def add_arguments(parser) -> None:
    """--max-params, --max-memory and how serving is counted (--context, --batch, --dtype, --inference-tokens)."""
    group = parser.add_argument_group("constraints (analysis/constrained.py)")
    group.add_argument("--max-params", type=float, default=None, metavar="P",
                       help="cap N = N_once + N_rec, the law's unique non-embedding parameters (embedding and LM "
                            "head are not counted)")
    group.add_argument("--max-memory", type=float, default=None, metavar="BYTES",
                       help="cap the bytes to serve: every weight (embedding included) + the KV cache of --batch "
                            "sequences of --context tokens in --dtype, one K and V per block application (per loop)")
    group.add_argument("--context", type=int, default=None,
                       help="tokens of context for the KV cache and the forward FLOPs (default: the template's "
                            "seq_len)")
    group.add_argument("--batch", type=int, default=1, help="sequences served at once (default 1)")
    group.add_argument("--dtype", default="bfloat16",
                       help=f"dtype of weights and KV cache: {', '.join(DTYPE_BYTES)} (default bfloat16)")
    group.add_argument("--inference-tokens", type=float, default=0.0, metavar="T",
                       help="tokens served over the model's life: adds serving FLOPs (T x forward FLOPs per token "
                            "at --context) and lifetime FLOPs (training + serving) to the table")


def from_args(args) -> Constraints:
    """The constraints of parsed ``add_arguments``; a ValueError with one line on a bad value."""
    return Constraints(max_params=args.max_params, max_memory=args.max_memory, context=args.context,
                       batch=args.batch, dtype=args.dtype, inference_tokens=args.inference_tokens)
