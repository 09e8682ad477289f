"""The training recipe: optimizers with per-group learning rates, the schedule, and learning-rate transfer.

Defaults follow Schwethelm et al. 2026 (PAPER.md, "Training recipe") where the paper states them, with the
matrix learning rate re-measured for the CPU-sized models (note below)::

    optimizer      "muon"      Muon (torch.optim.Muon; momentum 0.95, Nesterov, 5 Newton-Schulz steps) for
                               block and injection matrices, AdamW for the rest; "adamw": AdamW everywhere.
                               Default "muon" where the installed torch has torch.optim.Muon, else "adamw".
    lr             None        matrix learning rate of this trial; None -> base_lr transferred to the width
    base_lr        None        matrix learning rate at ref_width; None -> 0.04 (muon) / 0.004 (adamw)
    ref_width      640         width the per-group rates below are quoted at (the paper's s = 10)
    embedding_lr   0.3         AdamW, at ref_width
    head_lr        0.004       AdamW, at ref_width
    norm_lr        0.005       AdamW, at ref_width
    betas          (0.8, 0.95) AdamW;  eps 1e-10;  weight_decay 0.0 (every group)
    momentum       0.95        Muon;   ns_steps 5
    schedule       "paper"     "paper": linear decay from the peak to final_lr_frac over the run, no warmup;
                               "cosine": linear warmup then cosine decay to final_lr_frac
    warmup_frac    None        share of steps for linear warmup; None -> 0 (paper) / 0.05 (cosine)
    final_lr_frac  0.1         learning rate at the last step, as a share of the peak
    micro_batch    None        tokens per micro-batch (gradient accumulation); None -> the whole batch
    log_every      10          steps between train-loss reports and divergence checks (one host sync each)
    diverge_factor 1.5         diverged when the train loss is NaN/inf or exceeds this times the first loss
    bf16           True        bf16 autocast (CUDA only; CPU runs fp32)
    compile        True        torch.compile (CUDA only)

Width transfer (the paper's rule for AdamW groups): an AdamW learning rate quoted at ``ref_width`` is used at
width d as ``lr * (d / ref_width) ** -0.5``. Muon's orthogonalised update already has a width-independent
scale (the paper keeps its matrix rate fixed across widths, regret <= 0.005 nats), so the Muon matrix rate is
not transferred. With ``optimizer = "adamw"`` the matrix rate is an AdamW rate and transfers like the others.
So a search can calibrate ``base_lr`` once, at one width, and every width gets its rate by rule.

Note on the matrix rate: the paper's 0.014 was tuned at d = 640 with 262k-token batches. On the CPU demo
shapes (d = 32-128, 4-8k-token batches, a few hundred steps), measured on the KJV bytes at d = 64:
Muon 0.01 / 0.02 / 0.04 / 0.08 reach val 2.02 / 1.95 / 1.88 / 1.83 nats after 100 steps of 4k tokens, AdamW
matrices at 0.004 reach 2.03. 0.04 is the default: near the best at short horizons and stable across the
widths and recurrences of the demo grid. A search that tunes ``lr`` overrides it.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from loopscale.model import LoopedLM

from .hints import did_you_mean

HAS_MUON = hasattr(torch.optim, "Muon")
OPTIMIZERS = ("muon", "adamw")
SCHEDULES = ("paper", "cosine")
DEFAULT_BASE_LR = {"muon": 0.04, "adamw": 0.004}
DEFAULT_WARMUP = {"paper": 0.0, "cosine": 0.05}
ADAMW_WIDTH_EXPONENT = -0.5

RECIPE_DEFAULTS: dict[str, Any] = {
    "optimizer": "muon" if HAS_MUON else "adamw",
    "lr": None,
    "base_lr": None,
    "ref_width": 640,
    "embedding_lr": 0.3,
    "head_lr": 0.004,
    "norm_lr": 0.005,
    "betas": (0.8, 0.95),
    "eps": 1e-10,
    "weight_decay": 0.0,
    "momentum": 0.95,
    "ns_steps": 5,
    "schedule": "paper",
    "warmup_frac": None,
    "final_lr_frac": 0.1,
    "micro_batch": None,
    "log_every": 10,
    "diverge_factor": 1.5,
    "bf16": True,
    "compile": True,
}
# key -> (kind, bound): "pos" a number > bound, "nonneg" >= 0, "frac" in [0, 1], "int" an integer >= bound.
_NUMBERS: dict[str, tuple[str, float]] = {
    "lr": ("pos", 0), "base_lr": ("pos", 0), "embedding_lr": ("nonneg", 0), "head_lr": ("nonneg", 0),
    "norm_lr": ("nonneg", 0), "eps": ("pos", 0), "weight_decay": ("nonneg", 0), "momentum": ("frac", 0),
    "warmup_frac": ("frac", 0), "final_lr_frac": ("frac", 0), "diverge_factor": ("pos", 1),
    "ref_width": ("int", 1), "ns_steps": ("int", 1), "micro_batch": ("int", 1), "log_every": ("int", 1),
}


def validate_recipe(recipe: dict[str, Any]) -> None:
    """Raise ValueError with one clear line for any mistake in a recipe (see the module docstring)."""
    if not isinstance(recipe, dict):
        raise ValueError(f"recipe must be a table/dict, got {type(recipe).__name__}")
    for key, value in recipe.items():
        if key not in RECIPE_DEFAULTS:
            raise ValueError(f"recipe: unknown key {key!r}{did_you_mean(key, RECIPE_DEFAULTS)}; "
                             f"allowed: {', '.join(RECIPE_DEFAULTS)}")
        if key in _NUMBERS:
            _check_number(key, value)
    _check_choice("optimizer", recipe.get("optimizer", RECIPE_DEFAULTS["optimizer"]), OPTIMIZERS)
    _check_choice("schedule", recipe.get("schedule", "paper"), SCHEDULES)
    if recipe.get("optimizer") == "muon" and not HAS_MUON:
        raise ValueError(f"recipe.optimizer 'muon' needs torch.optim.Muon, which torch {torch.__version__} "
                         f"lacks; use 'adamw'")
    betas = recipe.get("betas", RECIPE_DEFAULTS["betas"])
    if (not isinstance(betas, (list, tuple)) or len(betas) != 2
            or not all(_is_number(b) and 0 <= b < 1 for b in betas)):
        raise ValueError(f"recipe.betas must be two numbers in [0, 1), got {betas!r}")
    for key in ("bf16", "compile"):
        if key in recipe and not isinstance(recipe[key], bool):
            raise ValueError(f"recipe.{key} must be true or false, got {recipe[key]!r}")
    if recipe.get("warmup_frac") is not None and recipe["warmup_frac"] >= 1:
        raise ValueError(f"recipe.warmup_frac must be < 1, got {recipe['warmup_frac']!r}")


def normalize_recipe(recipe: dict[str, Any] | None) -> dict[str, Any]:
    """The recipe with every default filled in (validated)."""
    recipe = dict(recipe or {})
    validate_recipe(recipe)
    full = {**RECIPE_DEFAULTS, **recipe}
    if full["base_lr"] is None:
        full["base_lr"] = DEFAULT_BASE_LR[full["optimizer"]]
    if full["warmup_frac"] is None:
        full["warmup_frac"] = DEFAULT_WARMUP[full["schedule"]]
    full["betas"] = tuple(full["betas"])
    return full


def group_lrs(recipe: dict[str, Any], width: int) -> dict[str, float]:
    """Peak learning rate of each parameter group at ``width`` (module docstring: width transfer)."""
    adamw_scale = (width / recipe["ref_width"]) ** ADAMW_WIDTH_EXPONENT
    if recipe["lr"] is not None:
        matrices = recipe["lr"]
    elif recipe["optimizer"] == "muon":
        matrices = recipe["base_lr"]
    else:
        matrices = recipe["base_lr"] * adamw_scale
    return {"matrices": float(matrices), "embedding": recipe["embedding_lr"] * adamw_scale,
            "lm_head": recipe["head_lr"] * adamw_scale, "norms": recipe["norm_lr"] * adamw_scale}


def build_optimizers(model: LoopedLM, recipe: dict[str, Any]) -> list[torch.optim.Optimizer]:
    """AdamW for embedding, LM head and norms (and matrices with "adamw"); Muon for matrices with "muon".

    Every param group carries its peak rate as ``peak_lr``; ``set_lr`` scales from it.
    """
    lrs = group_lrs(recipe, model.config.width)
    groups = model.param_groups()
    adamw_names = ["embedding", "lm_head", "norms"] + (["matrices"] if recipe["optimizer"] == "adamw" else [])
    adamw_groups = [{"params": groups[name], "lr": lrs[name], "peak_lr": lrs[name]}
                    for name in adamw_names if groups[name]]
    fused = next(model.parameters()).is_cuda  # fused kernels exist for CUDA; foreach is the CPU fast path
    optimizers: list[torch.optim.Optimizer] = [torch.optim.AdamW(
        adamw_groups, betas=recipe["betas"], eps=recipe["eps"], weight_decay=recipe["weight_decay"],
        fused=fused or None, foreach=None if fused else True)]
    if recipe["optimizer"] == "muon":
        optimizers.append(torch.optim.Muon(
            [{"params": groups["matrices"], "lr": lrs["matrices"], "peak_lr": lrs["matrices"]}],
            lr=lrs["matrices"], weight_decay=recipe["weight_decay"], momentum=recipe["momentum"],
            nesterov=True, ns_steps=recipe["ns_steps"]))
    return optimizers


def lr_multiplier(recipe: dict[str, Any], step: int, steps: int) -> float:
    """Share of the peak rate at optimizer step ``step`` (0-based) of ``steps``.

    Warmup (both schedules): (step + 1) / w for the first w = round(warmup_frac * steps) steps. Then with
    progress x in [0, 1] over the remaining steps and f = final_lr_frac:
    paper  1 - (1 - f) x  (linear to f);   cosine  f + (1 - f) (1 + cos(pi x)) / 2.
    """
    warmup = round(recipe["warmup_frac"] * steps)
    if step < warmup:
        return (step + 1) / warmup
    x = (step - warmup) / max(steps - warmup - 1, 1)
    f = recipe["final_lr_frac"]
    if recipe["schedule"] == "paper":
        return 1.0 - (1.0 - f) * x
    return f + (1.0 - f) * 0.5 * (1.0 + math.cos(math.pi * x))


def set_lr(optimizers: list[torch.optim.Optimizer], multiplier: float) -> None:
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            group["lr"] = group["peak_lr"] * multiplier


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_number(key: str, value: Any) -> None:
    if value is None and RECIPE_DEFAULTS[key] is None:
        return
    kind, lower = _NUMBERS[key]
    if kind == "int":
        if not isinstance(value, int) or isinstance(value, bool) or value < lower:
            raise ValueError(f"recipe.{key} must be an integer >= {lower:g}, got {value!r}")
        return
    if not _is_number(value) or not math.isfinite(value):
        raise ValueError(f"recipe.{key} must be a number, got {value!r}")
    bad = {"pos": value <= lower, "nonneg": value < 0, "frac": not 0 <= value <= 1}[kind]
    if bad:
        bound = {"pos": f"> {lower:g}", "nonneg": ">= 0", "frac": "in [0, 1]"}[kind]
        raise ValueError(f"recipe.{key} must be {bound}, got {value!r}")


def _check_choice(key: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"recipe.{key}: unknown value {value!r}{did_you_mean(value, choices)}; "
                         f"choose one of {', '.join(choices)}")
