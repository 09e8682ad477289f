"""Sweep specs, search spaces, the Ray Tune + Optuna + MLflow glue, and the ``loopscale`` CLI.

``SweepSpec`` resolves on first use (PEP 562): the console entry point (``search/cli.py``) imports this package
before torch, so that its signal handlers are in place before anything slow is imported.
"""

__all__ = ["SweepSpec"]


def __getattr__(name: str):
    if name != "SweepSpec":
        raise AttributeError(f"module 'loopscale.search' has no attribute {name!r}")
    from .spec import SweepSpec

    globals()[name] = SweepSpec  # resolve once
    return SweepSpec
