"""The looped transformer and its exact accounting.

The accounting, the configuration and the law are plain Python: the analysis uses them without torch.
``LoopedLM``, the torch module, is imported on its first use (PEP 562, ``lazy.py``).
"""

from .accounting import (DTYPE_BYTES, Accounting, ParamCounts, account, count_params, flops_per_token, inference,
                         tokens_for_budget)
from .counts import InferenceCost
from .config import (BUILTIN, DEPTH_SAMPLINGS, INJECTIONS, ISO_DEPTH, LoopedConfig, heads_to_s, iso_depth_template,
                     s_to_heads)
from .law import PAPER_LAW, PAPER_PHI_CI, JointLaw
from .lazy import on_first_use

__all__ = [
    "Accounting", "BUILTIN", "DEPTH_SAMPLINGS", "DTYPE_BYTES", "INJECTIONS", "ISO_DEPTH", "InferenceCost", "PAPER_LAW",
    "PAPER_PHI_CI", "JointLaw", "LoopedConfig", "LoopedLM", "ParamCounts", "account", "count_params", "flops_per_token",
    "heads_to_s", "inference", "iso_depth_template", "s_to_heads", "tokens_for_budget",
]

__getattr__, _ = on_first_use(__name__, {"LoopedLM": "looped"})
