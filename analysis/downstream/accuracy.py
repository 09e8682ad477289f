"""Accuracies over items and their intervals.

A task's accuracy k / n gets the Wilson score interval (Wilson 1927), which keeps its coverage near 0 and 1 where
the normal one collapses. An axis' score is the mean accuracy of its T tasks, a_axis = (1/T) sum_t k_t / n_t, with
the standard error over items

    se = sqrt(sum_t p_t (1 - p_t) / n_t) / T,    p_t = (k_t + 1) / (n_t + 2)

(p_t shrunk toward 1/2 so that a task at 0 or 1 still counts its uncertainty) and the normal interval
a_axis +- z se. These intervals cover the items' sampling only: two models trained from other seeds differ
by more, which the analysis' tests estimate from the models themselves (analysis/downstream/matched_loss.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from scipy.stats import norm


def z_of(confidence: float) -> float:
    return float(norm.ppf(0.5 + confidence / 2))


def wilson(correct: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """The Wilson score interval of the accuracy ``correct`` / ``n``."""
    z, p = z_of(confidence), correct / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def axis_score(correct: Sequence[int], n: Sequence[int]) -> tuple[float, float]:
    """(score, standard error) of an axis whose tasks scored ``correct`` of ``n`` items (module docstring)."""
    shrunk = [(k + 1) / (m + 2) for k, m in zip(correct, n)]
    score = sum(k / m for k, m in zip(correct, n)) / len(n)
    return score, math.sqrt(sum(p * (1 - p) / m for p, m in zip(shrunk, n))) / len(n)


def normal_interval(value: float, se: float, confidence: float = 0.95) -> tuple[float, float]:
    return value - z_of(confidence) * se, value + z_of(confidence) * se
