"""loopscale: find compute-optimal looped language models and measure what one recurrence is worth.

The public API, importable from the top: ``from loopscale import LoopedConfig, fit_joint_law``. This folder holds
only the namespace: its subpackages are the repository's top-level folders (``model/``, ``objectives/``,
``search/``, ``analysis/``; mapped in pyproject.toml), so the repository root is no package and pytest never
imports it by the checkout's folder name.
Names resolve on first use (PEP 562), so ``import loopscale`` and ``loopscale --help`` do not pay for torch;
``model``, ``analysis`` and ``search`` resolve theirs the same way (``model/lazy.py``).
"""

from .model.lazy import on_first_use

_EXPORTS = {
    "LoopedConfig": "model", "LoopedLM": "model", "count_params": "model", "flops_per_token": "model",
    "tokens_for_budget": "model", "JointLaw": "model", "PAPER_LAW": "model",
    "train": "objectives", "simulate": "objectives",
    "SweepSpec": "search", "load_model": "search",
    "load_runs": "analysis", "fit_joint_law": "analysis", "allocation_table": "analysis", "LawFit": "analysis",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = on_first_use(__name__, _EXPORTS)
