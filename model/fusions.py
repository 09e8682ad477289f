"""The switch between the model's eager CPU formulations and its plain formulas.

The fused LM head and loss (model/lm_head.py), RoPE as one complex multiply and relu^2's two-pass backward
(model/looped.py) beat the plain formulas on CPU in eager mode; compiled (Dynamo traces the plain ones, which
Inductor fuses itself) or with ``EAGER_FUSIONS`` off, the model runs the plain formulas. Benchmarks time the one
against the other (tests/benchmarks/bench_step.py); tests check that they agree (tests/test_lm_head.py).
"""

from __future__ import annotations

import torch

EAGER_FUSIONS = True


def plain_formulas() -> bool:
    """Whether the model writes its formulas out plainly here: when asked, and wherever Dynamo traces it."""
    return not EAGER_FUSIONS or torch.compiler.is_compiling()
