"""The trial config: what the search hands to ONE trial, and what every trial reports back.

A trial config is a plain dict (so Ray can ship it and MLflow can log it)::

    budget_flops  float   the FLOP budget C of the trial's cell
    r             int     recurrences
    s             float   width multiplier; width = ceil(width_unit * s / head_dim) * head_dim
    template      dict    keyword arguments of ``LoopedConfig.iso_depth`` other than s and r
                          (depth, prelude, coda, width_unit, head_dim, seq_len, vocab_size, injection, bptt_k,
                          lanes)
    batch_tokens  int     tokens per optimizer step
    seed          int
    objective     str     "train" | "simulate"
    law, noise            simulate only: JointLaw fields and the noise sd in nats
    data, recipe, device, num_threads, cache_dir, val_tokens
                          train only (see objectives.train)

Both objectives return a dict with ``METRIC_KEYS`` (and nothing else, but for a training trial with warmdown
branches: ``branch<i>.<name>`` for each branch i and each of ``BRANCH_KEYS``, see objectives/train.py): ``val_loss`` in nats per token, ``val_bpb`` bits
per byte (NaN where it does not apply: simulated trials, synthetic data), ``status`` "ok" | "diverged" and
``reason`` ("" when ok).
"""

from __future__ import annotations

from typing import Any

from loopscale.model import LoopedConfig, count_params, flops_per_token, tokens_for_budget

METRIC_KEYS = (
    "val_loss", "val_bpb", "train_loss", "tokens", "steps", "flops_per_token", "budget_flops", "flops_spent",
    "N_once", "N_rec", "N", "N_embed", "width", "s", "r", "n_prelude", "n_recur", "n_coda", "lr",
    "tokens_per_s", "mfu", "wall_s", "status", "reason",
)

# A warmdown branch's point: the budget whose tokens it reaches, those tokens and steps, the FLOPs of a run
# trained for them outright (F * tokens), its validation loss, and the FLOPs its warmdown cost the trial.
BRANCH_KEYS = ("budget_flops", "tokens", "steps", "flops_spent", "val_loss", "cost_flops")
BRANCH_PREFIX = "branch"


def branch_key(index: int, name: str) -> str:
    """The flat metric name of a branch's value, e.g. ``branch0.val_loss``."""
    return f"{BRANCH_PREFIX}{index}.{name}"


def is_branch_key(key: str) -> bool:
    head, dot, name = key.partition(".")
    return bool(dot) and head.startswith(BRANCH_PREFIX) and head[len(BRANCH_PREFIX):].isdigit() and name in BRANCH_KEYS


def model_config(trial_config: dict[str, Any]) -> LoopedConfig:
    """The model shape of a trial: the iso-depth template at the trial's s and r."""
    return LoopedConfig.iso_depth(trial_config["s"], int(trial_config["r"]), **trial_config["template"])


def accounting_metrics(config: LoopedConfig, budget_flops: float, batch_tokens: int) -> dict[str, Any]:
    """Sizes, tokens and FLOPs of a trial, all from ``model``'s accounting."""
    p = count_params(config)
    f = flops_per_token(config)
    tokens = tokens_for_budget(config, budget_flops, batch_tokens)
    return {"tokens": tokens, "steps": tokens // batch_tokens, "flops_per_token": f,
            "budget_flops": float(budget_flops), "flops_spent": float(f * tokens), "N_once": p.N_once,
            "N_rec": p.N_rec, "N": p.N, "N_embed": p.N_embed, "width": config.width, "r": config.r,
            "n_prelude": config.n_prelude, "n_recur": config.n_recur, "n_coda": config.n_coda}
