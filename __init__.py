"""loopscale: find compute-optimal looped language models and measure what one recurrence is worth.

The public contract of DESIGN.md, importable from the top: ``from loopscale import LoopedConfig, fit_joint_law``.
Names resolve on first use (PEP 562), so ``import loopscale`` and ``loopscale --help`` do not pay for torch;
``model``, ``analysis`` and ``search`` resolve theirs the same way (``model/lazy.py``).
"""

from .model.lazy import on_first_use

_EXPORTS = {
    "LoopedConfig": "model", "LoopedLM": "model", "count_params": "model", "flops_per_token": "model",
    "tokens_for_budget": "model", "JointLaw": "model", "PAPER_LAW": "model",
    "train": "objectives", "simulate": "objectives",
    "SweepSpec": "search",
    "load_runs": "analysis", "fit_joint_law": "analysis", "allocation_table": "analysis", "LawFit": "analysis",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = on_first_use(__name__, _EXPORTS)
