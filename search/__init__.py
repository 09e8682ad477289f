"""Sweep specs, search spaces, the Ray Tune + Optuna + MLflow glue, and the ``loopscale`` CLI.

``SweepSpec`` resolves on first use (PEP 562, ``model/lazy.py``): the console entry point (``search/cli.py``)
imports this package before torch, so that its signal handlers are in place before anything slow is imported.
"""

from loopscale.model.lazy import on_first_use

__all__ = ["SweepSpec", "load_model"]
__getattr__, __dir__ = on_first_use(__name__, {"SweepSpec": "spec", "load_model": "models"})
