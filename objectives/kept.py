"""A trained trial's kept model: its final weights with the trial config that built them, as one file.

The file is ``torch.save`` of ``{"format": FORMAT, "trial": TrialConfig.to_params(), "model": state_dict}``
(tensors on the CPU), so it needs nothing else to be rebuilt: the trial config gives the model's shape
(``TrialConfig.model_config``), its architecture (the built-in or the spec's own factory, with its options) and
the validation data. ``read_file`` gives the trial config as the file holds it, unbuilt: building it
(``TrialConfig.from_params``) measures the architecture it names, which imports and runs that code, so only a
file shown to be its run's own (search/models.py) is built. ``rebuild`` builds the module through the
architecture's factory and loads the weights strictly; given another recurrence count ``r`` it builds the factory
at ``config.r = r`` (the evaluation contract, docs/own_architecture.md), and a module that cannot take it (its
parameters' names or shapes depend on r, or the config refuses that r) is refused in one line. At r = 1 the
factory gets the plain stack's config (injection "none", as a sweep's r = 1 cells do); the built-in's loop
(``LoopedConfig.any_depth``) also runs once, at r = 1, the one count no config of its weights expresses. An
evaluation runs the shared block r times over the validation rows, so r is bounded by ``MAX_EVAL_R``.
"""

from __future__ import annotations

import dataclasses
import io
import numbers
from typing import Any

import torch

from loopscale.model import LoopedConfig
from loopscale.model.architecture import build

from .trial import TrialConfig

FORMAT = 1
MAX_EVAL_R = 1024  # 128 times the paper's deepest r = 8: a larger count is a typo whose evaluation never ends


def kept_bytes(model: torch.nn.Module, trial: TrialConfig) -> bytes:
    """The file of ``model`` trained as ``trial`` (module docstring)."""
    raw = getattr(model, "_orig_mod", model)  # a compiled module's weights are its original's
    state = {k: v.detach().cpu() for k, v in raw.state_dict().items()}
    buffer = io.BytesIO()
    torch.save({"format": FORMAT, "trial": trial.to_params(), "model": state}, buffer)
    return buffer.getvalue()


def read_file(data: bytes, where: str) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The trial config (as the file holds it, unbuilt: module docstring) and the weights of a kept model's file;
    ValueError naming ``where`` for anything else. Nothing in the file is imported or run."""
    try:
        kept = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for a damaged or foreign file
        raise ValueError(f"{where} is not a loopscale model file ({type(exc).__name__})") from None
    if not isinstance(kept, dict) or kept.get("format") != FORMAT:
        raise ValueError(f"{where} is not a loopscale model file of format {FORMAT}")
    if not isinstance(kept.get("trial"), dict) or not isinstance(kept.get("model"), dict):
        raise ValueError(f"{where} is not a loopscale model file: it holds no trial config and weights")
    return kept["trial"], kept["model"]


def eval_r(r: Any) -> int:
    """``r`` as a recurrence count to evaluate at: a whole number from 1 to ``MAX_EVAL_R``; ValueError in one line
    for anything else (a float, a string, a bool)."""
    if not isinstance(r, numbers.Integral) or isinstance(r, bool) or not 1 <= r <= MAX_EVAL_R:
        raise ValueError(f"r must be a whole number of recurrences from 1 to {MAX_EVAL_R:,}, got {r!r}")
    return int(r)


def config_at(trial: TrialConfig, r: int | None = None) -> LoopedConfig:
    """The trial's model shape, at ``r`` recurrences of its shared block (None: as trained; a sampled-depth model
    evaluates at its mean r). Only the count changes: the block keeps its layers (``n_recur``), so the weights are
    the same; an evaluation runs exactly r."""
    config = trial.model_config
    if r is None:
        return config
    r = eval_r(r)
    if r == config.r:
        return config
    plain = {"injection": "none"} if r == 1 else {}  # the config of r = 1, a plain stack, has no injection
    try:
        return dataclasses.replace(config, r=r, bptt_k=None, depth_sampling="fixed", **plain)
    except ValueError as exc:
        raise ValueError(f"cannot evaluate at r={r}: {exc}") from None


def rebuild(trial: TrialConfig, weights: dict[str, Any], r: int | None = None) -> torch.nn.Module:
    """The trained module in eval mode, at ``r`` recurrences (None: as trained); ValueError in one line when the
    architecture cannot run that r with these weights, or r is no count ``eval_r`` takes. A looped built-in runs
    its loop once at r = 1."""
    if r is not None:
        r = eval_r(r)
    if r == 1 and trial.model_config.any_depth:
        return _LoopOnce(rebuild(trial, weights)).eval()
    config = config_at(trial, r)
    module = build(config)
    try:
        module.load_state_dict(weights, strict=True)
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()
        detail = first[1].strip() if len(first) > 1 else first[0]
        raise ValueError(f"cannot evaluate at r={config.r}: the module built at r={config.r} does not take the "
                         f"weights trained at r={trial.r} ({detail.rstrip('. ')})") from None
    return module.eval()


class _LoopOnce(torch.nn.Module):
    """A looped built-in model with its shared block run once: injection, block and recurrence norm, as a
    sampled-depth step of s = 1 trains it. No config expresses it: r = 1 is the plain stack, without injection
    and recurrence norm, which these weights do not fit."""

    def __init__(self, looped: torch.nn.Module):
        super().__init__()
        self.looped = looped

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        return self.looped(idx, targets, recurrences=1)
