"""Warmdown branches: which smaller budgets a trial also records its loss at, when, and what that costs.

A trial of budget C on the ``wsd`` schedule (objectives/recipe.py) runs at a constant rate until its own
warmdown. For a budget C_k < C it reaches D_k = ``tokens_for_budget`` (C_k) tokens, S_k steps, with the same
model; at step f_k = ``warmdown_start`` (S_k) it can save its state, warm down linearly over S_k - f_k steps as
a run of S_k steps would, evaluate, and go on from the saved state (the paper's script does this; docs/paper.md).
The branch is then a point (N, D_k) of cell (C_k, r), exact from the accounting, and its warmdown costs the
trial F * (S_k - f_k) * batch FLOPs (``cost_flops``), which the trial's ``flops_spent`` includes.

Where the budgets come from: the recipe's fixed ``branch_budgets`` (every trial of the demo records the same
ones) and, per trial, the TrialConfig's ``branch_budgets``: those the law sampler chose because the trial's
width lands in a smaller cell that is still locating its optimum (search/law_sampler.py).
"""

from __future__ import annotations

from typing import Any

from loopscale.model import LoopedConfig

from .recipe import warmdown_start
from .trial import TrialConfig, accounting_metrics, branch_key


def branch_budgets(trial: TrialConfig) -> list[float]:
    """The budgets the trial branches at: the recipe's fixed list and the trial's own (module docstring)."""
    fixed = (trial.recipe or {}).get("branch_budgets", [])
    return sorted({float(b) for b in [*fixed, *trial.branch_budgets]})


def branch_plan(budgets: list[float], warmdown_frac: float, config: LoopedConfig, budget: float, steps: int,
                batch_tokens: int) -> list[dict[str, Any]]:
    """Per budget C_k < ``budget``: its steps S_k (from ``model``'s accounting) and fork step
    f_k = warmdown_start(S_k). A branch that would fork after the trial's own warmdown has begun, or buys no
    step, is left out."""
    frac = {"warmdown_frac": warmdown_frac}
    out = []
    last_fork = warmdown_start(frac, steps)
    for c_k in budgets:
        steps_k = accounting_metrics(config, c_k, batch_tokens)["steps"] if c_k < budget else 0
        fork = warmdown_start(frac, steps_k)
        if 0 < steps_k < steps and fork <= last_fork:
            out.append({"budget_flops": c_k, "steps": steps_k, "fork": fork})
    return out


def branch_metrics(done: list[dict[str, Any]], flops_per_token: int, batch_tokens: int) -> dict[str, float]:
    """The flat ``branch<i>.*`` metrics of the branches a trial ran (objectives.trial.BRANCH_KEYS)."""
    out: dict[str, float] = {}
    for i, b in enumerate(done):
        tokens = b["steps"] * batch_tokens
        values = {"budget_flops": b["budget_flops"], "tokens": tokens, "steps": b["steps"],
                  "flops_spent": float(flops_per_token * tokens), "val_loss": b["val_loss"],
                  "cost_flops": float(flops_per_token * (b["steps"] - b["fork"]) * batch_tokens)}
        out.update({branch_key(i, k): v for k, v in values.items()})
    return out


def trial_flops(flops_per_token: int, tokens: int, done: list[dict[str, Any]], batch_tokens: int) -> float:
    """A trial's ``flops_spent``: F * (its tokens + every branch's warmdown tokens), in exact integers."""
    return float(flops_per_token * (tokens + sum(b["steps"] - b["fork"] for b in done) * batch_tokens))
