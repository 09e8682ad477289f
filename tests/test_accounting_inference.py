"""Serving counts (model/accounting.py ``inference``): the closed form of LoopedLM against a count of a real
forward (FlopCounterMode), the keys and values its attention computes, and its parameters; the measured counts of
an own architecture (model/measured.py) against the same closed form."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from loopscale.model import DTYPE_BYTES, LoopedConfig, LoopedLM, account, inference
from loopscale.model.measured import measure_inference

TINY = dict(depth=8, width_unit=16, head_dim=16, seq_len=64, vocab_size=128)
CASES = [(1, "none"), (2, "linear"), (4, "additive"), (4, "none"), (2, "hyperconnect"), (4, "hyperconnect")]


def built(s: float, r: int, injection: str) -> LoopedConfig:
    return LoopedConfig.iso_depth(s, r, injection=injection, **TINY)


def forward_counts(config: LoopedConfig, context: int) -> tuple[float, float, int]:
    """(FLOPs per token FlopCounterMode counts on a real forward, numbers per token in the K and V projections'
    outputs of that forward, parameters of the module), the module built for ``context`` tokens."""
    torch.manual_seed(0)
    model = LoopedLM(dataclasses.replace(config, seq_len=context))
    kv = []
    hooks = [lin.register_forward_hook(lambda mod, inp, out: kv.append(out.numel()))
             for block in model.blocks() for lin in (block.attn.k, block.attn.v)]
    idx = torch.randint(0, config.vocab_size, (2, context))
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(idx)
    for hook in hooks:
        hook.remove()
    return counter.get_total_flops() / idx.numel(), sum(kv) / idx.numel(), sum(p.numel() for p in model.parameters())


def norm_scales_applied(config: LoopedConfig) -> int:
    """Norm scales the closed form charges 2 FLOPs each forward and the counter does not see: two per block
    application, the recurrence norm r times when looped, the final norm (the embedding norm is not charged)."""
    d = config.width
    return 2 * d * config.effective_depth + (config.r * d if config.looped else 0) + d


@pytest.mark.parametrize("r,injection", CASES)
@pytest.mark.parametrize("context", [16, 48])
def test_closed_form_equals_a_real_forward(r, injection, context):
    config = built(4, r, injection)
    flops, kv, params = forward_counts(config, context)
    cost = inference(config, context)
    assert cost.context == context
    assert cost.forward_flops_per_token == flops + 2 * norm_scales_applied(config)
    assert cost.kv_entries_per_token == kv  # one K and one V per block application: per loop
    assert cost.params == params


def test_attention_grows_with_the_context_and_nothing_else_does():
    config = built(4, 2, "linear")
    short, long = inference(config, 16), inference(config, 48)
    per_layer = 4 * config.n_heads * config.head_dim  # QK^T and AV over one more token of context
    assert long.forward_flops_per_token - short.forward_flops_per_token == 32 * per_layer * config.effective_depth
    assert (long.kv_entries_per_token, long.params) == (short.kv_entries_per_token, short.params)


def test_bytes_follow_the_dtype_and_the_cache_the_batch():
    cost = inference(built(4, 4, "linear"), 32)
    counts = account(built(4, 4, "linear"))
    assert cost.weight_bytes(DTYPE_BYTES["bfloat16"]) == 2 * (counts.N + counts.N_embed)
    kv = cost.kv_bytes_per_token(DTYPE_BYTES["float32"])
    assert cost.memory_bytes(3, DTYPE_BYTES["float32"]) == cost.weight_bytes(4) + 3 * 32 * kv


def test_training_forward_is_the_serving_forward_at_its_sequence_length():
    """With every recurrence carrying gradients, training is forward + backward = 3 x the forward."""
    from loopscale.model import flops_per_token

    config = built(4, 4, "linear")
    assert flops_per_token(config) == 3 * inference(config).forward_flops_per_token


@pytest.mark.parametrize("r,injection", [(1, "none"), (2, "linear"), (4, "additive")])
def test_measured_serving_counts_equal_the_closed_form(r, injection):
    """LoopedLM measured as an own architecture would be: the closed form exactly, its norm scales' 2 FLOPs per
    entry included (the counter alone sees none of them)."""
    config = built(4, r, injection)
    assert measure_inference(config, 48) == inference(config, 48)


def test_a_context_of_no_tokens_is_refused():
    with pytest.raises(ValueError, match="context must be a positive number of tokens, got 0"):
        inference(built(4, 2, "linear"), 0)


def test_an_own_architecture_is_measured_from_its_forward():
    """tests/fixtures/tiny_loop.py, counted by hand: each block multiplies qkv (3 d^2), out (d^2), up and down
    (2 d^2 each) and attends over the context (4 d T); prelude, r loops and coda are r + 2 applications, each
    with its K and V (2 d); the head 2 d V; each norm scale 2 d (the prelude's first, applied straight to the
    embedding's rows, nothing, and the final norm in its place); the embedding lookup nothing."""
    from pathlib import Path

    fixture = Path(__file__).parent / "fixtures" / "tiny_loop.py"
    shape = dict(depth=10, prelude=1, coda=1, width_unit=32, head_dim=32, seq_len=64, vocab_size=97)
    config = LoopedConfig.iso_depth(4, 2, architecture=f"{fixture}:tiny_loop", **shape)
    d, applications, context = config.width, config.r + 2, 40
    cost = inference(config, context)
    assert cost.forward_flops_per_token == applications * (2 * 8 * d * d + 4 * d * context + 2 * 2 * d) + 2 * d * 97
    assert cost.kv_entries_per_token == applications * 2 * d
    counts = account(config)
    assert cost.params == counts.N + counts.N_embed
