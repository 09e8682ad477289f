"""The four numbers a model shape is known by, whoever counted them: the closed form of the built-in LoopedLM
(model/accounting.py) or the measurement of any other architecture (model/measured.py). Its own module so that
both can build it without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Accounting:
    """What the search, the law and the analysis need of a model shape: N_once, N_rec, N_embed (the paper's
    roles of the parameters) and training FLOPs per token."""

    N_once: int
    N_rec: int
    N_embed: int
    flops_per_token: int

    @property
    def N(self) -> int:
        """Unique non-embedding parameters, the paper's N."""
        return self.N_once + self.N_rec
