"""The training recipe: its settings, per-group learning rates, the schedule, and learning-rate transfer (the
optimizers it names are built in objectives/optimizers.py).

Defaults follow Schwethelm et al. 2026 (docs/paper.md, "The training recipe") where the paper states them, with the
matrix learning rate re-measured for the CPU-sized models (note below)::

    optimizer      "muon"      "muonh": MuonH (objectives/muonh.py; the paper's) for block and injection
                               matrices, AdamW for the rest; "muon": torch.optim.Muon (momentum 0.95,
                               Nesterov, 5 Newton-Schulz steps) for the matrices; "adamw": AdamW everywhere.
                               Default "muon" where the installed torch has torch.optim.Muon, else "adamw".
    lr             None        matrix learning rate of this trial as is; None -> base_lr moved by the rules
    base_lr        None        matrix learning rate at the rules' reference point (objectives/lr_rules.py);
                               None -> 0.014 (muonh, the paper's) / 0.04 (muon) / 0.004 (adamw)
    ref_batch      262144      batch the base rates are quoted at (the paper's)
    ref_width      640         width the AdamW rates are quoted at (the paper's s = 10)
    embedding_lr   0.3         AdamW, at ref_width
    head_lr        0.004       AdamW, at ref_width
    norm_lr        0.005       AdamW, at ref_width
    lane_lr        0.01        AdamW, at ref_width: hyperconnection lane weights (injection "hyperconnect")
    betas          (0.8, 0.95) AdamW;  eps 1e-10;  weight_decay 0.0 (every group)
    momentum       0.95        Muon and MuonH;   ns_steps 5 (Muon; MuonH runs Polar Express's 5 iterations)
    schedule       "paper"     "paper": linear decay from the peak to final_lr_frac over the run, no warmup;
                               "cosine": linear warmup then cosine decay to final_lr_frac;
                               "wsd": warmup, constant peak, then a linear warmdown to final_lr_frac over the
                               last warmdown_frac of the steps (the schedule warmdown branches need)
    warmdown_frac  0.2         "wsd": share of the run's steps spent warming down
    branch_budgets []          "wsd": budgets C_k below the trial's at which it branches a warmdown from its
                               constant phase and records the loss at D_k = C_k / F (objectives/training.py)
    warmup_frac    None        share of steps for linear warmup; None -> 0 (paper) / 0.05 (cosine)
    final_lr_frac  0.1         learning rate at the last step, as a share of the peak
    micro_batch    None        tokens per micro-batch (gradient accumulation); None -> the whole batch
    log_every      10          steps between train-loss reports and divergence checks (one host sync each)
    diverge_factor 1.5         diverged when the train loss is NaN/inf or exceeds this times the first loss
    bf16           True        bf16 autocast (CUDA only; CPU runs fp32)
    compile        True        torch.compile on CUDA
    compile_cpu    False       torch.compile on CPU too (every transformer block), its warm-up paid once per
                               width per machine through the user's compile cache (model/runtime.py); eager is
                               the default for tests, tiny trials and the demo, which the warm-up would dominate

Learning-rate transfer (batch, data and width rules, with their sources): objectives/lr_rules.py. The data
rule is MuonH's (HyperP derived it for MuonH, and the paper's script applies it to MuonH only): torch's Muon
matrix rate follows the batch rule alone, as its 0.04 default was chosen without it (with it that default
grows several-fold at the CPU shapes and trains worse; docs/log.md). With
``optimizer = "adamw"`` the matrix rate is an AdamW rate and follows the AdamW groups' rules (batch, width).
A search calibrates ``base_lr`` once, at one cell, and every trial gets its rates by rule.

Note on the matrix rate: the paper's 0.014 (MuonH) was tuned at d = 640 with 262k-token batches. Torch's
Muon default 0.04 was chosen on the CPU demo shapes before the transfer rules existed (docs/log.md); a search
that calibrates ``base_lr`` overrides it.
"""

from __future__ import annotations

import functools
import math
from typing import Any

from loopscale.model import LoopedConfig, tokens_for_budget

from .lr_rules import REF_BATCH, transfer_factors
from .trial import TrialConfig

from .checks import did_you_mean

OPTIMIZERS = ("muonh", "muon", "adamw")
SCHEDULES = ("paper", "cosine", "wsd")
DEFAULT_BASE_LR = {"muonh": 0.014, "muon": 0.04, "adamw": 0.004}
DEFAULT_WARMUP = {"paper": 0.0, "cosine": 0.05, "wsd": 0.0}

# torch is imported only to build optimizers (objectives/optimizers.py) or to resolve the default optimizer, so
# that a simulated trial, which reads the schedule alone, starts without it
RECIPE_DEFAULTS: dict[str, Any] = {
    "optimizer": None,  # "muon" where the installed torch has torch.optim.Muon, else "adamw" (default_optimizer)
    "lr": None,
    "base_lr": None,
    "ref_batch": REF_BATCH,
    "ref_width": 640,
    "embedding_lr": 0.3,
    "head_lr": 0.004,
    "norm_lr": 0.005,
    "lane_lr": 0.01,
    "betas": (0.8, 0.95),
    "eps": 1e-10,
    "weight_decay": 0.0,
    "momentum": 0.95,
    "ns_steps": 5,
    "schedule": "paper",
    "warmup_frac": None,
    "warmdown_frac": 0.2,
    "branch_budgets": [],
    "final_lr_frac": 0.1,
    "micro_batch": None,
    "log_every": 10,
    "diverge_factor": 1.5,
    "bf16": True,
    "compile": True,
    "compile_cpu": False,
}
# key -> (kind, bound): "pos" a number > bound, "nonneg" >= 0, "frac" in [0, 1], "int" an integer >= bound.
_NUMBERS: dict[str, tuple[str, float]] = {
    "lr": ("pos", 0), "base_lr": ("pos", 0), "embedding_lr": ("nonneg", 0), "head_lr": ("nonneg", 0),
    "norm_lr": ("nonneg", 0), "lane_lr": ("nonneg", 0), "eps": ("pos", 0), "weight_decay": ("nonneg", 0), "momentum": ("frac", 0),
    "warmup_frac": ("frac", 0), "warmdown_frac": ("frac", 0), "final_lr_frac": ("frac", 0), "diverge_factor": ("pos", 1),
    "ref_width": ("int", 1), "ref_batch": ("int", 1), "ns_steps": ("int", 1), "micro_batch": ("int", 1), "log_every": ("int", 1),
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
    if "optimizer" in recipe:
        _check_choice("optimizer", recipe["optimizer"], OPTIMIZERS)
    _check_choice("schedule", recipe.get("schedule", "paper"), SCHEDULES)
    if recipe.get("optimizer") == "muon" and not has_muon():
        import torch

        raise ValueError(f"recipe.optimizer 'muon' needs torch.optim.Muon, which torch {torch.__version__} "
                         f"lacks; use 'adamw'")
    betas = recipe.get("betas", RECIPE_DEFAULTS["betas"])
    if (not isinstance(betas, (list, tuple)) or len(betas) != 2
            or not all(_is_number(b) and 0 <= b < 1 for b in betas)):
        raise ValueError(f"recipe.betas must be two numbers in [0, 1), got {betas!r}")
    for key in ("bf16", "compile", "compile_cpu"):
        if key in recipe and not isinstance(recipe[key], bool):
            raise ValueError(f"recipe.{key} must be true or false, got {recipe[key]!r}")
    if recipe.get("warmup_frac") is not None and recipe["warmup_frac"] >= 1:
        raise ValueError(f"recipe.warmup_frac must be < 1, got {recipe['warmup_frac']!r}")
    branches = recipe.get("branch_budgets", [])
    if not isinstance(branches, (list, tuple)) or not all(_is_number(b) and math.isfinite(b) and b > 0
                                                          for b in branches):
        raise ValueError(f"recipe.branch_budgets must be a list of positive FLOP budgets, got {branches!r}")
    if branches and recipe.get("schedule", "paper") != "wsd":
        raise ValueError("recipe.branch_budgets needs schedule = \"wsd\" (branches leave a constant-lr phase)")


def normalize_recipe(recipe: dict[str, Any] | None) -> dict[str, Any]:
    """The recipe with every default filled in (validated)."""
    recipe = dict(recipe or {})
    validate_recipe(recipe)
    full = {**RECIPE_DEFAULTS, **recipe}
    if full["optimizer"] is None:
        full["optimizer"] = default_optimizer()
    if full["base_lr"] is None:
        full["base_lr"] = DEFAULT_BASE_LR[full["optimizer"]]
    if full["warmup_frac"] is None:
        full["warmup_frac"] = DEFAULT_WARMUP[full["schedule"]]
    full["betas"] = tuple(full["betas"])
    full["branch_budgets"] = sorted(float(b) for b in full["branch_budgets"])
    return full


def recipe_setting(recipe: dict[str, Any] | None, key: str) -> Any:
    """One setting of a validated ``recipe``, or its default: what reads the schedule alone (a simulated
    trial's warmdown) without resolving the optimizer, which needs torch."""
    return (recipe or {}).get(key, RECIPE_DEFAULTS[key])


@functools.cache
def has_muon() -> bool:
    import torch

    return hasattr(torch.optim, "Muon")


def default_optimizer() -> str:
    return "muon" if has_muon() else "adamw"


def group_lrs(recipe: dict[str, Any], template: dict[str, Any], config: LoopedConfig, tokens: int,
              batch_tokens: int) -> dict[str, float]:
    """Peak learning rate of each parameter group of a trial of shape ``config`` (from ``template``) that
    trains ``tokens`` in batches of ``batch_tokens``: the base rates moved by objectives/lr_rules.py."""
    f = transfer_factors(recipe, template, config, tokens, batch_tokens)
    adamw = f["batch"] * f["width"]
    if recipe["lr"] is not None:
        matrices = recipe["lr"]
    elif recipe["optimizer"] == "muonh":
        matrices = recipe["base_lr"] * f["batch"] * f["data"]
    elif recipe["optimizer"] == "muon":
        matrices = recipe["base_lr"] * f["batch"]
    else:
        matrices = recipe["base_lr"] * adamw
    return {"matrices": float(matrices), "embedding": recipe["embedding_lr"] * adamw,
            "lm_head": recipe["head_lr"] * adamw, "norms": recipe["norm_lr"] * adamw,
            "lanes": recipe["lane_lr"] * adamw}


def trial_lrs(trial: TrialConfig) -> dict[str, float]:
    """``group_lrs`` of a trial (objectives/trial.py): what that trial will train with."""
    config = trial.model_config
    tokens = tokens_for_budget(config, trial.budget_flops, trial.batch_tokens)
    return group_lrs(normalize_recipe(trial.recipe), trial.template, config, tokens, trial.batch_tokens)


def lr_multiplier(recipe: dict[str, Any], step: int, steps: int) -> float:
    """Share of the peak rate at optimizer step ``step`` (0-based) of ``steps``.

    Warmup (both schedules): (step + 1) / w for the first w = round(warmup_frac * steps) steps. Then with
    progress x in [0, 1] over the remaining steps and f = final_lr_frac:
    paper  1 - (1 - f) x  (linear to f);   cosine  f + (1 - f) (1 + cos(pi x)) / 2;
    wsd    1 until the last k = round(warmdown_frac * steps) steps (``warmdown_start``), then linear to f at the
    last step. The multiplier before the warmdown does not depend on ``steps``: a wsd run of any length
    follows the same rates there, which is what lets a warmdown branch stand for a run trained outright.
    """
    warmup = round(recipe["warmup_frac"] * steps)
    if step < warmup:
        return (step + 1) / warmup
    if recipe["schedule"] == "wsd":
        start = warmdown_start(recipe, steps)
        x = (step - start + 1) / (steps - start) if step >= start else 0.0
        return 1.0 - (1.0 - recipe["final_lr_frac"]) * x
    x = (step - warmup) / max(steps - warmup - 1, 1)
    f = recipe["final_lr_frac"]
    if recipe["schedule"] == "paper":
        return 1.0 - (1.0 - f) * x
    return f + (1.0 - f) * 0.5 * (1.0 + math.cos(math.pi * x))


def warmdown_start(recipe: dict[str, Any], steps: int) -> int:
    """First step of a wsd run's warmdown (``steps`` when it has none)."""
    return steps - round(recipe["warmdown_frac"] * steps)


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
