"""The looped transformer and its exact accounting. Depends on torch only."""

from .accounting import ParamCounts, count_params, flops_per_token, tokens_for_budget
from .config import INJECTIONS, PRESETS, LoopedConfig
from .law import PAPER_LAW, JointLaw
from .looped import LoopedLM

__all__ = [
    "INJECTIONS", "PRESETS", "PAPER_LAW", "JointLaw", "LoopedConfig", "LoopedLM", "ParamCounts",
    "count_params", "flops_per_token", "tokens_for_budget",
]
