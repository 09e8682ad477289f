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
from .noise import Noise
from .recipe import normalize_recipe
from .testing import after_trial, before_trial
from .trial import accounting_metrics, model_config


def simulate(trial_config: dict[str, Any]) -> dict[str, Any]:
    """Loss of the trial under ``trial_config["law"]`` (default: the paper's fit) with seeded deviations
    (trial-config keys ``noise``, ``cell_noise``, ``misspec``; defaults ``objectives.noise.Noise()``)."""
    config = model_config(trial_config)
    law = JointLaw(**trial_config["law"]) if trial_config.get("law") else PAPER_LAW
    noise = Noise(**{k: float(trial_config[k]) for k in ("noise", "cell_noise", "misspec") if k in trial_config})
    metrics = accounting_metrics(config, trial_config["budget_flops"], int(trial_config["batch_tokens"]))
    if metrics["tokens"] == 0:
        raise ValueError(f"budget {trial_config['budget_flops']:.3g} FLOPs buys no optimizer step at width "
                         f"{config.width}")
    fault = before_trial(trial_config)
    seed, budget = int(trial_config.get("seed", 0)), float(trial_config["budget_flops"])

    def observe(tokens: int, point_budget: float) -> float:
        clean = law.loss(metrics["N_once"], metrics["N_rec"], config.r, tokens)
        return noise.observe(clean, seed=seed, budget=point_budget, r=config.r, width=config.width,
                             run_budget=budget)

    loss = observe(metrics["tokens"], budget) if fault != "nan" else float("nan")
    batch_tokens = int(trial_config["batch_tokens"])
    branches = branch_plan(branch_budgets(trial_config), normalize_recipe(trial_config.get("recipe"))["warmdown_frac"],
                           config, budget, metrics["steps"], batch_tokens)
    for b in branches:
        b["val_loss"] = observe(b["steps"] * batch_tokens, b["budget_flops"])
    metrics["flops_spent"] = trial_flops(metrics["flops_per_token"], metrics["tokens"], branches, batch_tokens)
    nan = float("nan")
    after_trial(trial_config)
    return {**metrics, "val_loss": loss, "val_bpb": nan, "train_loss": loss, "s": float(trial_config["s"]),
            "lr": nan, "tokens_per_s": nan, "mfu": nan, "wall_s": 0.0, "status": "ok", "reason": "",
            **branch_metrics(branches, metrics["flops_per_token"], batch_tokens)}

