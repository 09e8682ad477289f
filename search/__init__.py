"""Sweep specs, search spaces, the Ray Tune + Optuna + MLflow glue, and the ``loopscale`` CLI."""

from .spec import SweepSpec

__all__ = ["SweepSpec"]
