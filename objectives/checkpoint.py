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

A state is sealed (``SEAL_FILE``: its SHA-256 and the identity of the trial that wrote it) and read back with
``torch.load(weights_only=True)``: a file cut short or changed, one of another trial, or one holding anything
but tensors and plain data (a pickle that would run code in every resuming worker) is a ``DamagedCheckpoint``,
which ``restore_or_set_aside`` moves out of the way: the trial trains from step 0 instead of failing for good.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

STATE_FILE = "trial_state.pt"
SEAL_FILE = "trial_state.seal.json"  # {"sha256": of STATE_FILE, "owner": the trial's identity}
SET_ASIDE = ".set-aside"  # suffix of a damaged state kept for a look, out of the way of the next restore


class DamagedCheckpoint(Exception):
    """A saved state that cannot be used; the message says why."""


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


def save_state(state: dict[str, Any], folder: str | Path, owner: str = "") -> Path:
    """Write ``state`` as ``folder/STATE_FILE`` atomically, sealed with its checksum and ``owner`` (the
    trial's identity); the file's path. The seal is renamed into place just before the state: a kill between the
    two leaves a seal that does not match, which ``load_state`` reports rather than load a mix."""
    final, seal = Path(folder) / STATE_FILE, Path(folder) / SEAL_FILE
    partial, partial_seal = final.with_suffix(".partial"), seal.with_suffix(".partial")
    torch.save(state, partial)
    partial_seal.write_text(json.dumps({"sha256": _sha256(partial), "owner": owner}))
    os.replace(partial_seal, seal)
    os.replace(partial, final)
    return final


def load_state(folder: str | Path, owner: str = "") -> dict[str, Any] | None:
    """The state ``save_state`` wrote in ``folder`` for ``owner``, or None where it has none; a
    ``DamagedCheckpoint`` when it has one that is unsealed, of another trial, changed, or not plain data."""
    path, seal_path = Path(folder) / STATE_FILE, Path(folder) / SEAL_FILE
    if not path.is_file():
        return None
    try:
        seal = json.loads(seal_path.read_text())
    except (OSError, ValueError):
        raise DamagedCheckpoint(f"{path} has no readable seal ({SEAL_FILE})") from None
    if seal.get("owner") != owner:
        raise DamagedCheckpoint(f"{path} belongs to another trial ({seal.get('owner')!r}, not {owner!r})")
    if _sha256(path) != seal.get("sha256"):
        raise DamagedCheckpoint(f"{path} does not match its checksum (cut short or changed)")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 (torch raises many kinds for a file it cannot read)
        raise DamagedCheckpoint(f"{path} does not load: {type(exc).__name__}: {str(exc).splitlines()[0]}") \
            from None


def restore_or_set_aside(folder: str | Path, owner: str = "") -> dict[str, Any] | None:
    """``load_state``, but a damaged state is renamed aside (``SET_ASIDE``; kept for a look) with one line on
    stderr, and None returned: the trial trains from step 0 rather than fail on every attempt."""
    try:
        return load_state(folder, owner)
    except DamagedCheckpoint as exc:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        for name in (STATE_FILE, SEAL_FILE):
            try:
                os.replace(Path(folder) / name, Path(folder) / f"{name}{SET_ASIDE}-{stamp}")
            except OSError:  # a read-only copy (object storage): nothing to move
                pass
        print(f"loopscale: checkpoint set aside: {exc}; the trial trains from step 0", file=sys.stderr, flush=True)
        return None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def rng_state() -> dict[str, Any]:
    """torch's generators: the CPU one, and every CUDA device's where CUDA is up."""
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else []
    return {"cpu": torch.get_rng_state(), "cuda": cuda}


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["cpu"])
    if state["cuda"]:
        torch.cuda.set_rng_state_all(state["cuda"])
