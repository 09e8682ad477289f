"""What ONE trial does: data -> train to a FLOP budget -> metrics, or the simulated law."""

from .simulate import simulate
from .trial import METRIC_KEYS, model_config

__all__ = ["METRIC_KEYS", "model_config", "simulate"]
