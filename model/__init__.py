"""The looped transformer and its exact accounting. Depends on torch only."""

from .accounting import ParamCounts, count_params, flops_per_token, tokens_for_budget
from .config import (INJECTIONS, ISO_DEPTH, PRESETS, LoopedConfig, heads_to_s, iso_depth_template,
                     s_to_heads)
from .law import PAPER_LAW, JointLaw
from .looped import LoopedLM

__all__ = [
    "INJECTIONS", "ISO_DEPTH", "PRESETS", "PAPER_LAW", "JointLaw", "LoopedConfig", "LoopedLM", "ParamCounts",
    "count_params", "flops_per_token", "heads_to_s", "iso_depth_template", "s_to_heads", "tokens_for_budget",
]
