"""The optimizers of a training recipe (objectives/recipe.py): AdamW for embedding, LM head, norms and lane
weights; MuonH (objectives/muonh.py, the paper's) or torch's Muon for the block and injection matrices, or AdamW
for them too; each param group carrying its peak rate, which the schedule scales (``set_lr``).

Apart from the recipe's settings and rates so that those, which a simulated trial reads too, need no torch."""

from __future__ import annotations

from typing import Any

import torch

from loopscale.model.architecture import param_groups

from .muonh import MuonH


def build_optimizers(model: torch.nn.Module, lrs: dict[str, float], recipe: dict[str, Any],
                     vocab_size: int | None = None) -> list[torch.optim.Optimizer]:
    """AdamW for embedding, LM head, norms and lane weights (and matrices with "adamw"); MuonH or Muon for the
    matrices with "muonh" / "muon". ``lrs``: ``group_lrs``. The groups are the module's own
    (``loopscale_param_groups``) or, given the model's ``vocab_size``, found by shape (model/architecture.py).

    Every param group carries its peak rate as ``peak_lr``; ``set_lr`` scales from it.
    """
    groups = param_groups(model, vocab_size)  # the architecture's own, or by shape (model/architecture.py)
    adamw_names = ["embedding", "lm_head", "norms", "lanes"] + (["matrices"] if recipe["optimizer"] == "adamw" else [])
    adamw_groups = [{"params": groups[name], "lr": lrs[name], "peak_lr": lrs[name]}
                    for name in adamw_names if groups[name]]
    fused = next(model.parameters()).is_cuda  # fused kernels exist for CUDA; foreach is the CPU fast path
    optimizers: list[torch.optim.Optimizer] = [torch.optim.AdamW(
        adamw_groups, betas=recipe["betas"], eps=recipe["eps"], weight_decay=recipe["weight_decay"],
        fused=fused or None, foreach=None if fused else True)]
    matrices = [{"params": groups["matrices"], "lr": lrs["matrices"], "peak_lr": lrs["matrices"]}]
    if recipe["optimizer"] == "muonh":  # no weight decay: a first-order no-op on MuonH's sphere
        optimizers.append(MuonH(matrices, lr=lrs["matrices"], momentum=recipe["momentum"]))
    elif recipe["optimizer"] == "muon":
        optimizers.append(torch.optim.Muon(
            matrices, lr=lrs["matrices"], weight_decay=recipe["weight_decay"], momentum=recipe["momentum"],
            nesterov=True, ns_steps=recipe["ns_steps"]))
    return optimizers


def set_lr(optimizers: list[torch.optim.Optimizer], multiplier: float) -> None:
    """Every group's rate at ``multiplier`` times its peak (``recipe.lr_multiplier``)."""
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            group["lr"] = group["peak_lr"] * multiplier
