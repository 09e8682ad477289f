"""The FLOPs a sweep may spend: each trial's budget plus its warmdown branches', summed over the planned trials,
or with the law sampler between its fewest trials and the cap, next to the paper grid's figure."""

from __future__ import annotations

from loopscale import objectives
from loopscale.analysis import numbers
from loopscale.analysis.flops import paper_grid_reference

from ..law_sampler import fewest_trials
from ..spec import STAGES, SweepSpec


def trial_flops(spec: SweepSpec, budget: float) -> float:
    """What one trial of ``budget`` spends at most: its budget, plus the warmdowns of its branches (a share
    ``warmdown_frac`` of each smaller branch budget; objectives/branches.py): the recipe's fixed ones, and with
    ``branches = true`` any smaller budget of the sweep the law sampler may choose."""
    recipe = objectives.normalize_recipe(spec.training.recipe if spec.objective == "train" else None)
    fixed = recipe["branch_budgets"] if spec.objective == "train" else []
    chosen = spec.grid.budgets if spec.sampling.branches else []
    return budget + recipe["warmdown_frac"] * sum(c for c in {*fixed, *chosen} if c < budget)


def total_flops(spec: SweepSpec) -> float:
    """Upper bound on the FLOPs of every planned trial (a trial spends its budget to within one step, plus
    its branches' warmdowns)."""
    return sum(c.n_trials * trial_flops(spec, c.budget) for stage in STAGES for c in spec.cells(stage))


def flops_range(spec: SweepSpec) -> tuple[float, float]:
    """(fewest, most) FLOPs the sweep may spend: every planned trial, or with the law sampler from its fewest
    trials (``flops_estimate``) to the cap."""
    cap = total_flops(spec)
    if spec.sampling.sampler != "law":
        return cap, cap
    fewest = fewest_trials(spec.cells(), spec.sampling.branches, spec.sampling.deferred_budgets)
    return sum(min(fewest[c.key], c.n_trials) * c.budget for c in spec.cells()) + sum(
        c.n_trials * trial_flops(spec, c.budget) for c in spec.cells("calibrate")), cap


def flops_estimate(spec: SweepSpec) -> str:
    """The FLOPs the sweep may spend: every planned trial, or with the law sampler, which stops a cell once its
    optimum is located, between its fewest trials and the cap: 3 widths per cell, or with warmdown branches
    (which can bracket a smaller cell's optimum for it), 3 in each r's largest cell, none in the
    ``deferred_budgets`` cells just below it (while a cheaper one remains) and 1 in every other cell (its first;
    ``law_sampler.fewest_trials``); next to the paper grid's figure when the sweep covers its cells
    (analysis.flops)."""
    floor, cap = flops_range(spec)
    text = f"total: {numbers.flops(cap)} FLOPs (each trial spends at most its budget)"
    sampling = spec.sampling
    if sampling.sampler == "law":
        deferred = sampling.deferred_budgets
        below = "just below it" if deferred == 1 else f"in the {deferred} budgets below it"
        least = "3 widths per cell at least"
        if sampling.branches:
            least = (f"3 widths in each r's largest cell, none {below} (while a cheaper budget remains) and 1 in the "
                     "others (warmdown branches fill their brackets)")
        text = (f"total: {numbers.span(floor, cap, numbers.flops)} FLOPs (the law sampler stops a cell once its optimum is located: "
                f"{least}, trials_per_cell at most)")
    reference = paper_grid_reference(spec.grid.budgets, spec.grid.recurrences, spec.grid.model_template(),
                                     spec.grid.batch_tokens)
    if reference is not None:
        share = f"{cap / reference:.0%}" if floor == cap else f"{floor / reference:.0%} to {cap / reference:.0%}"
        text += f"; the paper's grid of 116 runs spent {numbers.flops(reference)} ({share} of it here)"
    return text


def rungs_estimate(spec: SweepSpec) -> str:
    """The FLOPs (and on GPUs the GPU time) of the ``[validate]`` rungs: one trial per rung budget and r, each
    spending at most its budget ("" without rungs)."""
    budgets = spec.rungs.budgets
    if not budgets:
        return ""
    flops = sum(budgets) * len(spec.grid.recurrences)
    text = (f"validation rungs: {len(budgets) * len(spec.grid.recurrences)} trials (the law's compute-optimal model "
            f"per r at {', '.join(numbers.flops(c) for c in budgets)} FLOPs), {numbers.flops(flops)} FLOPs more")
    if spec.placement.gpus_per_trial > 0 and spec.objective == "train":
        text += f", {gpu_hours(flops):.3g} GPU-hours at that MFU"
    return text


def rate_sensitivity_estimate(spec: SweepSpec) -> str:
    """The FLOPs of ``rate_sensitivity``: one trial per search cell and rate, each spending at most its budget
    ("" when off)."""
    factors = spec.sensitivity.factors
    if not factors:
        return ""
    cells = len(spec.grid.budgets) * len(spec.grid.recurrences)
    flops = sum(spec.grid.budgets) * len(spec.grid.recurrences) * len(factors)
    text = (f"rate sensitivity: {cells * len(factors)} trials (each cell's best width at the rate "
            f"{' and '.join(f'x {f:g}' for f in factors)}), {numbers.flops(flops)} FLOPs more at most")
    if spec.placement.gpus_per_trial > 0 and spec.objective == "train":
        text += f", {gpu_hours(flops):.3g} GPU-hours at that MFU"
    return text


# The GPU time of a sweep on GPUs is its FLOPs at an assumed model FLOPs utilisation of an assumed chip: 40% of
# an H100 SXM's dense bf16 peak, a common figure for transformer pre-training at these sizes.
MFU = 0.40
PEAK_FLOPS = 989e12
PEAK_NAME = "an H100 SXM's 989 TFLOP/s dense bf16 peak"


def gpu_hours(flops: float, mfu: float = MFU, peak: float = PEAK_FLOPS) -> float:
    """GPU-hours = FLOPs / (MFU x peak FLOP/s) / 3600."""
    return flops / (mfu * peak) / 3600


def gpu_hours_estimate(spec: SweepSpec) -> str:
    """GPU-hours = FLOPs / (MFU x peak) / 3600, for a sweep whose trials run on GPUs ("" otherwise): what the
    sweep costs on a cluster, which the wall time measured here cannot say."""
    if spec.placement.gpus_per_trial <= 0 or spec.objective != "train":
        return ""
    hours = [gpu_hours(f) for f in flops_range(spec)]
    return (f"GPU time: {numbers.span(*hours)} GPU-hours, assuming {MFU:.0%} MFU of {PEAK_NAME} "
            f"(FLOPs / (MFU x peak))")
