"""loopscale: find compute-optimal looped language models and measure what one recurrence is worth.

The public contract of DESIGN.md, importable from the top: ``from loopscale import LoopedConfig, fit_joint_law``.
Names resolve on first use (PEP 562), so ``import loopscale`` and ``loopscale --help`` do not pay for torch.
"""

from importlib import import_module

_EXPORTS = {
    "LoopedConfig": "loopscale.model", "LoopedLM": "loopscale.model", "count_params": "loopscale.model",
    "flops_per_token": "loopscale.model", "tokens_for_budget": "loopscale.model", "JointLaw": "loopscale.model",
    "PAPER_LAW": "loopscale.model",
    "train": "loopscale.objectives", "simulate": "loopscale.objectives",
    "SweepSpec": "loopscale.search",
    "load_runs": "loopscale.analysis", "fit_joint_law": "loopscale.analysis",
    "allocation_table": "loopscale.analysis", "LawFit": "loopscale.analysis",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'loopscale' has no attribute {name!r}")
    value = getattr(import_module(_EXPORTS[name]), name)
    globals()[name] = value  # resolve once
    return value


def __dir__() -> list[str]:
    return __all__
