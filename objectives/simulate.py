"""The simulated trial: the joint law evaluated on a trial's exact N_once, N_rec and D, plus seeded noise.

It returns at once with the same metric keys as a training trial, so a user can replay the paper's 116-run
study, plan a sweep before paying for it, and test the search and the analysis against a known truth.

Noise: log L_obs = log L + (noise / L) * z, z ~ N(0, 1), i.e. about ``noise`` nats of spread (the paper's
residuals are ~0.01 nats). z is drawn from a generator seeded by (seed, C, r, width), so the same trial
always gives the same loss: a resumed or repeated sweep reproduces an uninterrupted one exactly.
"""

from __future__ import annotations

import hashlib
import math
import random
from typing import Any

from model import PAPER_LAW, JointLaw

from .trial import accounting_metrics, model_config

DEFAULT_NOISE = 0.01


def simulate(trial_config: dict[str, Any]) -> dict[str, Any]:
    """Loss of the trial under ``trial_config["law"]`` (default: the paper's fit) with seeded noise."""
    config = model_config(trial_config)
    law = JointLaw(**trial_config["law"]) if trial_config.get("law") else PAPER_LAW
    noise = float(trial_config.get("noise", DEFAULT_NOISE))
    metrics = accounting_metrics(config, trial_config["budget_flops"], int(trial_config["batch_tokens"]))
    if metrics["tokens"] == 0:
        raise ValueError(f"budget {trial_config['budget_flops']:.3g} FLOPs buys no optimizer step at width "
                         f"{config.width}")
    clean = law.loss(metrics["N_once"], metrics["N_rec"], config.r, metrics["tokens"])
    key = f"{trial_config.get('seed', 0)}|{float(trial_config['budget_flops']):.6e}|{config.r}|{config.width}"
    z = random.Random(hashlib.sha256(key.encode()).digest()).gauss(0.0, 1.0)
    loss = math.exp(math.log(clean) + (noise / clean) * z)
    nan = float("nan")
    return {**metrics, "val_loss": loss, "val_bpb": nan, "train_loss": loss, "s": float(trial_config["s"]),
            "lr": nan, "tokens_per_s": nan, "mfu": nan, "wall_s": 0.0, "status": "ok", "reason": ""}
