"""The four numbers a model shape is known by, whoever counted them: the closed form of the built-in LoopedLM
(model/accounting.py) or the measurement of any other architecture (model/measured.py). Its own module so that
both can build it without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction


@dataclass(frozen=True)
class Accounting:
    """What the search, the law and the analysis need of a model shape: N_once, N_rec, N_embed (the paper's
    roles of the parameters) and training FLOPs per token (whole, but for sampled depth's exact expectation)."""

    N_once: int
    N_rec: int
    N_embed: int
    flops_per_token: int | Fraction

    @property
    def N(self) -> int:
        """Unique non-embedding parameters, the paper's N."""
        return self.N_once + self.N_rec


@dataclass(frozen=True)
class InferenceCost:
    """What serving a model shape costs, whoever counted it (model/accounting.py ``inference``): forward FLOPs per
    token at a context length, the numbers its KV cache holds per token of context, and every parameter held."""

    context: int
    forward_flops_per_token: int
    kv_entries_per_token: int
    params: int

    def weight_bytes(self, dtype_bytes: int) -> int:
        """Every parameter, embedding and LM head included: all are held to serve."""
        return self.params * dtype_bytes

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        return self.kv_entries_per_token * dtype_bytes

    def memory_bytes(self, batch: int, dtype_bytes: int) -> int:
        """Weights plus a full KV cache of ``batch`` sequences of ``context`` tokens."""
        return self.weight_bytes(dtype_bytes) + self.kv_bytes_per_token(dtype_bytes) * self.context * batch
