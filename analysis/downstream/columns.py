"""The downstream numbers on a trial run (``loopscale evaluate --tasks``, search/downstream.py), one place for
their names::

    task.<label>_r<k>       the task's accuracy with the shared block run k times
    task.<label>_n          its number of items
    axis.<axis>_r<k>        the axis' score at k: the mean accuracy of its tasks
    axis.<axis>_r<k>_se     its standard error over items (analysis/downstream/accuracy.py)
    axis.<axis>_chance      the axis' chance score: the mean of its tasks' chance accuracies
"""

from __future__ import annotations

import re

TASK_COLUMN = re.compile(r"^task\.(.+)_r(\d+)$")
AXIS_COLUMN = re.compile(r"^axis\.(.+)_r(\d+)$")
DOWNSTREAM_COLUMN = re.compile(r"^(task|axis)\.")


def task_column(label: str, r: int) -> str:
    return f"task.{label}_r{r}"


def task_items(label: str) -> str:
    return f"task.{label}_n"


def axis_column(axis: str, r: int) -> str:
    return f"axis.{axis}_r{r}"


def axis_se(axis: str, r: int) -> str:
    return f"{axis_column(axis, r)}_se"


def axis_chance(axis: str) -> str:
    return f"axis.{axis}_chance"
