"""A training trial's checkpoint: what ``train`` needs to go on from a step exactly as if it had never stopped.

Training is a pure function of its state at a step boundary: the batch of step t is ``Batches.batch(t)`` (the
data position is the step), the rate of step t is ``lr_multiplier(t, steps)``, and the model's initialisation
draws from torch's generator before step 0. So the state at the end of step t is

    model weights, every optimizer's state (MuonH: momentum buffers and each matrix's initial norm c_W;
    AdamW: moments and step counts), torch's generators (CPU and CUDA), the step t, the train-loss window
    since the last report (its summed losses, its length, the first and the last reported mean), the warmdown
    branches already recorded (a branch runs inside one step boundary and restores the states it saved, so
    none is ever half done at a checkpoint), and the progress reports made so far (the partial loss curve)

and a trial restored from it trains steps t+1 .. S with the same arithmetic as the uninterrupted one: the
same validation loss, bit for bit on a CPU.

Where checkpoints go is the caller's: ``train`` takes a ``Checkpointing`` (Tune's API in
search/tune/trial.py; a folder in the tests), saves every ``period_s`` seconds of training and at the first
step boundary after ``requested()`` turns true (the trial is about to be stopped), and restores the latest one
before its first step. ``save_state`` / ``load_state`` write and read the state in a folder,
atomically (a temporary file renamed into place), so a kill while writing leaves the previous one readable.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

STATE_FILE = "trial_state.pt"


@dataclass(frozen=True)
class Checkpointing:
    """Where a trial's checkpoints go: ``save(state)`` every ``period_s`` seconds of training and when
    ``requested()`` (0: never), ``restore()`` the latest state saved, or None."""

    period_s: float
    save: Callable[[dict[str, Any]], None]
    restore: Callable[[], dict[str, Any] | None]
    requested: Callable[[], bool] = lambda: False

    def due(self, since_s: float) -> bool:
        """Whether to save now, ``since_s`` seconds of training after the last save (or the start)."""
        return self.period_s > 0 and (since_s >= self.period_s or self.requested())

    def __post_init__(self):
        if not self.period_s >= 0:
            raise ValueError(f"checkpoint period must be >= 0 seconds (0 = off), got {self.period_s}")


def save_state(state: dict[str, Any], folder: str | Path) -> Path:
    """Write ``state`` as ``folder/STATE_FILE`` atomically; the file's path."""
    final = Path(folder) / STATE_FILE
    partial = final.with_suffix(".partial")
    torch.save(state, partial)
    os.replace(partial, final)
    return final


def load_state(folder: str | Path) -> dict[str, Any] | None:
    """The state ``save_state`` wrote in ``folder``, or None where it has none."""
    path = Path(folder) / STATE_FILE
    if not path.is_file():
        return None
    return torch.load(path, map_location="cpu", weights_only=False)


def rng_state() -> dict[str, Any]:
    """torch's generators: the CPU one, and every CUDA device's where CUDA is up."""
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else []
    return {"cpu": torch.get_rng_state(), "cuda": cuda}


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["cpu"])
    if state["cuda"]:
        torch.cuda.set_rng_state_all(state["cuda"])
