"""What a trial reports and every cell's study minimises (``METRIC``), and what counts as a real value of it.

Its own module, with nothing heavy to import: the trial's worker reads it without loading the studies (Optuna)
and the law sampler behind them (scipy, pandas).
"""

from __future__ import annotations

import math
from typing import Any

METRIC = "val_loss"


def finite(value: Any) -> bool:
    """A real number (not a bool) that is finite."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
