"""The simulated trial: the joint law evaluated on a trial's exact N_once, N_rec and D, plus seeded deviations.

It returns at once with the same metric keys as a training trial, so a user can replay the paper's 116-run
study, plan a sweep before paying for it, and test the search and the analysis against a known truth.

Deviations from the law (``objectives.noise``): independent noise per trial (``noise``), a per-cell offset
(``cell_noise``) and a smooth per-cell curve in log width (``misspec``), all in nats and all seeded, so the
same trial always gives the same loss: a resumed or repeated sweep reproduces an uninterrupted one exactly.

Warmdown branches (objectives/branches.py) are simulated like a training trial records them: the same steps,
tokens, FLOPs and warmdown cost, and a loss at (N, D_k) that deviates from the law by the branch's own cell's
offset and curve (they belong to the point, cell (C_k, r)) and by the independent noise of the trial it
branched from (one run: the same init and data order).

Test aids (a journal of executions, a rendezvous, injected faults, a delay) come from objectives/testing.py;
they never change the loss of a trial that completes.
"""

from __future__ import annotations

from typing import Any

from loopscale.model import PAPER_LAW, JointLaw

from .branches import branch_budgets, branch_metrics, branch_plan, trial_flops
from .recipe import recipe_setting
from .testing import after_trial, before_trial
from .trial import TrialConfig, accounting_metrics


def simulate(trial: TrialConfig) -> dict[str, Any]:
    """Loss of the trial under ``trial.law`` (None: the paper's fit) with its seeded deviations
    (``trial.noise_model``)."""
    config = trial.model_config
    law = JointLaw(**trial.law) if trial.law else PAPER_LAW
    noise = trial.noise_model
    batch_tokens = trial.batch_tokens
    metrics = accounting_metrics(config, trial.budget_flops, batch_tokens)
    fault = before_trial(trial)

    def observe(tokens: int, point_budget: float) -> float:
        clean = law.loss(metrics["N_once"], metrics["N_rec"], config.r, tokens)
        return noise.observe(clean, seed=trial.seed, budget=point_budget, r=config.r, width=config.width,
                             run_budget=trial.budget_flops)

    loss = observe(metrics["tokens"], trial.budget_flops) if fault != "nan" else float("nan")
    branches = branch_plan(branch_budgets(trial), recipe_setting(trial.recipe, "warmdown_frac"), config,
                           trial.budget_flops, metrics["steps"], batch_tokens)
    for b in branches:
        b["val_loss"] = observe(b["steps"] * batch_tokens, b["budget_flops"])
    metrics["flops_spent"] = trial_flops(metrics["flops_per_token"], metrics["tokens"], branches, batch_tokens)
    nan = float("nan")
    after_trial(trial)
    return {**metrics, "val_loss": loss, "val_bpb": nan, "train_loss": loss, "s": trial.s,
            "lr": nan, "tokens_per_s": nan, "mfu": nan, "wall_s": 0.0, "status": "ok", "reason": "",
            **branch_metrics(branches, metrics["flops_per_token"], batch_tokens)}
