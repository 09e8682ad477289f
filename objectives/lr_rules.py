"""Learning-rate transfer: the peak rate of every parameter group of ONE trial, from the recipe's base rates.

The three rules of Schwethelm et al. 2026 (docs/paper.md, "The training recipe"; exponents from HyperP,
arXiv:2603.28743), each a factor on a base rate quoted at a reference point::

    batch   every lr          x (B / B_ref) ^ 0.558     B = batch_tokens; B_ref = recipe.ref_batch (262,144)
    data    MuonH's matrix lr x (D / D_ref) ^ -0.32     D = the trial's training tokens (its budget's
                                                        whole steps); D_ref = 10 x N_ref (below)
    width   the AdamW groups  x (d / d_ref) ^ -0.5      d = the trial's width; d_ref = recipe.ref_width (640)

So at the reference point (B_ref, D_ref, d_ref) every group runs at its base rate, and the [calibrate] stage,
which tunes ``base_lr`` at one cell, tunes the base of these rules: each search trial gets the calibrated base
moved to its own batch, tokens and width.

The reference model (``reference_config``): the sweep's own template at s = REF_S = 10, as in the paper's
training script. r = 1 trials refer to the template's plain r = 1 stack (the paper's 20-layer model); looped
trials to the template's looped model at r = REF_LOOPS = 4 with linear injection (the paper's 2 + 4x4 + 2). A
template whose shared depth 4 does not divide takes the largest r in (1, 4] that divides it, else the trial's
own r. N_ref is the reference model's "scaling parameters" in the paper's sense: non-embedding parameters
counted once per application, N_once + r_ref N_rec (so both paper references count ~20 blocks: D_ref = 983M
tokens for r = 1, 1.01B for looped runs at d = 640). With D = C / F, wider models under a fixed budget train on
fewer tokens and so get a higher matrix rate: 0.0072-0.0202 across the paper's grid at the base 0.014, the
span the paper states (tests/test_train.py checks it). Counting the looped reference at the trial's own r
instead (N_once + r N_rec of the 2 + 4 + 2 model) would give 0.0062-0.0244.

Why d_ref stays the paper's 640 for every template (the default of recipe.ref_width): the base AdamW rates
(embedding 0.3, head 0.004, norms 0.005) were tuned at d = 640, and on the CPU shapes the rule extrapolated
from 640 trains better than one re-anchored at the template's own s = 10 width (lower validation loss with
both Muon and MuonH on the CPU shapes; docs/log.md). A recipe can pin ``ref_width`` (and ``ref_batch``) to any
number.
"""

from __future__ import annotations

from typing import Any

from loopscale.model import LoopedConfig, account

BATCH_EXPONENT = 0.558
DATA_EXPONENT = -0.32
WIDTH_EXPONENT = -0.5
REF_BATCH = 262_144
REF_S = 10
REF_LOOPS = 4
REF_TOKENS_PER_PARAM = 10


def batch_factor(batch_tokens: int, ref_batch: int) -> float:
    """Every group: x (B / B_ref)^0.558."""
    return (batch_tokens / ref_batch) ** BATCH_EXPONENT


def data_factor(tokens: int, ref_tokens: float) -> float:
    """The matrix group: x (D / D_ref)^-0.32."""
    return (tokens / ref_tokens) ** DATA_EXPONENT


def width_factor(width: int, ref_width: int) -> float:
    """The AdamW groups: x (d / d_ref)^-0.5."""
    return (width / ref_width) ** WIDTH_EXPONENT


def reference_config(template: dict[str, Any], r: int) -> LoopedConfig:
    """The reference model of a trial with r recurrences under ``template`` (module docstring)."""
    base = {k: v for k, v in template.items() if k not in ("injection", "bptt_k", "lanes")}
    if r == 1:
        return LoopedConfig.iso_depth(REF_S, 1, **base)
    plain = LoopedConfig.iso_depth(REF_S, 1, **base)
    shared = plain.n_recur  # the layers between prelude and coda
    loops = next((k for k in range(REF_LOOPS, 1, -1) if shared % k == 0), r)
    return LoopedConfig.iso_depth(REF_S, loops, injection="linear", **base)


def reference_tokens(template: dict[str, Any], r: int) -> float:
    """D_ref = 10 x (N_once + r_ref N_rec) of the reference model."""
    config = reference_config(template, r)
    p = account(config)  # the sweep's own architecture at the reference shape
    return REF_TOKENS_PER_PARAM * (p.N_once + config.r * p.N_rec)


def transfer_factors(recipe: dict[str, Any], template: dict[str, Any], config: LoopedConfig, tokens: int,
                     batch_tokens: int) -> dict[str, float]:
    """The three factors for one trial: ``batch`` (every group), ``data`` (matrices), ``width`` (AdamW)."""
    return {"batch": batch_factor(batch_tokens, recipe["ref_batch"]),
            "data": data_factor(tokens, reference_tokens(template, config.r)),
            "width": width_factor(config.width, recipe["ref_width"])}
