"""model.accounting against the real module, torch's FLOP counter and the paper's published numbers."""

from __future__ import annotations

import dataclasses
from fractions import Fraction

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from loopscale.model import LoopedConfig, LoopedLM, count_params, flops_per_token, tokens_for_budget
from loopscale.model.accounting import attention_flops_per_layer


def numel(module: torch.nn.Module | None) -> int:
    return 0 if module is None else sum(p.numel() for p in module.parameters())


def module_groups(config: LoopedConfig) -> dict[str, int]:
    """Count the parameters of a LoopedLM built on the meta device (nothing allocated), group by group."""
    with torch.device("meta"):
        m = LoopedLM(config)
    return dict(embedding=numel(m.embed), lm_head=numel(m.lm_head), prelude=numel(m.prelude),
                recur=numel(m.core) + numel(m.recur_norm), coda=numel(m.coda), inject=numel(m.inject),
                scalars=numel(m.embed_norm) + numel(m.final_norm), total=numel(m))


# The paper's s = 10 and s = 20 models, and CPU-sized shapes (byte vocabulary, effective depth 8 and 6).
CPU = dict(depth=8, width_unit=16, head_dim=16, seq_len=128, vocab_size=256)
SHAPES = [LoopedConfig.iso_depth(s, r) for s in (10, 20) for r in (1, 2, 4, 8)] + [
    LoopedConfig.iso_depth(4, r, **CPU) for r in (1, 2, 4)] + [
    LoopedConfig.iso_depth(2, 2, depth=6, width_unit=16, head_dim=16, seq_len=32, vocab_size=64)] + [
    LoopedConfig.iso_depth(s, r, injection=inj)
    for s in (6, 12) for r in (1, 2, 4, 8) for inj in ("linear", "additive", "none", "hyperconnect")
] + [LoopedConfig.iso_depth(6, r, injection="hyperconnect", lanes=k) for r in (2, 4) for k in (1, 3)]


@pytest.mark.parametrize("config", SHAPES, ids=lambda c: f"d{c.width}-r{c.r}-{c.injection}-V{c.vocab_size}")
def test_count_params_equals_module(config):
    counts = count_params(config)
    assert dataclasses.asdict(counts) == module_groups(config)


def test_paper_unique_parameter_counts():
    """The paper (docs/paper.md): at s=10 (d=640) N = 98.3M, 59.8M, 40.2M, 30.3M; unique ratios ~61/41/31%."""
    n = {r: count_params(LoopedConfig.iso_depth(10, r)).N for r in (1, 2, 4, 8)}
    assert LoopedConfig.iso_depth(10, 4).width == 640
    assert [round(n[r] / 1e6, 1) for r in (1, 2, 4, 8)] == [98.3, 59.8, 40.2, 30.3]
    assert [round(100 * n[r] / n[1]) for r in (2, 4, 8)] == [61, 41, 31]


def test_injection_overhead_matches_paper():
    """Injection adds r * 2 d^2 to the 20 * 12 d^2 block matmuls: r/120 (1.7%, 3.3%, 6.7% at r = 2, 4, 8)."""
    for r, share in ((2, 0.017), (4, 0.033), (8, 0.067)):
        with_inj = LoopedConfig.iso_depth(10, r)
        without = dataclasses.replace(with_inj, injection="additive")
        block_matmuls = 6 * 12 * with_inj.width ** 2 * with_inj.effective_depth
        extra = flops_per_token(with_inj) - flops_per_token(without)
        assert extra / block_matmuls == pytest.approx(share, abs=0.0005)


def counted_flops(config: LoopedConfig, batch: int = 2, recurrences: int | None = None) -> Fraction:
    """FLOPs per token that torch's counter sees on a real forward + backward (of ``recurrences`` runs of the
    shared block, default r).

    SDPA runs on its math backend: the fused CPU flash kernel has no FLOP formula registered, while the math
    backend's bmm's are counted (full T x T, like the paper)."""
    torch.manual_seed(0)
    m = LoopedLM(config)
    idx = torch.randint(0, config.vocab_size, (batch, config.seq_len))
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        m(idx, idx, recurrences=recurrences).backward()
    return Fraction(counter.get_total_flops(), batch * config.seq_len)


def norm_flops(config: LoopedConfig, s: int | None = None) -> int:
    """The formula's 6 P (or 2 P forward-only) charge for norm scale vectors of a pass of s recurrences (default
    r): elementwise, invisible to the counter, which only counts matmuls. The embedding norm is excluded by the
    formula, like the lookup."""
    s = config.r if s is None else s
    d, k = config.width, config.grad_recurrences_at(s)
    per_recurrence = 2 * d * config.n_recur + (d if config.looped else 0)
    return 6 * (2 * d * (config.n_prelude + config.n_coda) + d) + (6 * k + 2 * (s - k)) * per_recurrence


TINY = dict(depth=8, width_unit=16, head_dim=16, seq_len=64, vocab_size=128)


@pytest.mark.parametrize("s,r,inj,bptt_k", [
    (2, 1, "none", None), (4, 1, "none", None), (2, 2, "linear", None), (4, 2, "additive", None),
    (3, 4, "linear", None), (2, 4, "none", None), (4, 4, "linear", 2), (2, 2, "linear", 1),
    (2, 2, "hyperconnect", None), (3, 4, "hyperconnect", None), (2, 4, "hyperconnect-3", None),
])
def test_flops_per_token_matches_flop_counter(s, r, inj, bptt_k):
    inj, _, lanes = inj.partition("-")
    config = LoopedConfig.iso_depth(s, r, injection=inj, bptt_k=bptt_k, lanes=int(lanes or 2), **TINY)
    measured = counted_flops(config)
    formula = flops_per_token(config)
    assert abs(measured - formula) / formula < 0.02
    # Beyond the 2% bound: the only difference is the norm scales the counter cannot see.
    assert measured + norm_flops(config) == formula


def test_hyperconnect_counts_its_lane_weights_in_N_rec():
    """Per recurrence alpha (K), M (K x K), beta (K): r (K^2 + 2K) scalars in N_rec; its FLOPs per token are
    6 r (K^2 + 2K) d, under 0.1% of the model's at the paper's shapes."""
    for r in (2, 4, 8):
        hc, plain = (LoopedConfig.iso_depth(10, r, injection=inj) for inj in ("hyperconnect", "none"))
        assert count_params(hc).N_rec - count_params(plain).N_rec == r * (2 * 2 + 2 * 2)
        assert flops_per_token(hc) - flops_per_token(plain) == 6 * r * 8 * 640
        assert (flops_per_token(hc) - flops_per_token(plain)) / flops_per_token(plain) < 1e-3


def test_truncated_backprop_flop_rule():
    """Each forward-only recurrence costs 2 P and 4 h q T per layer instead of 6 P and 12 h q T."""
    full = LoopedConfig.iso_depth(10, 4)
    trunc = dataclasses.replace(full, bptt_k=2)
    p = count_params(full)
    saved = 2 * ((6 - 2) * (p.recur + p.inject)
                 + full.n_recur * (attention_flops_per_layer(full) - attention_flops_per_layer(full, backward=False)))
    assert flops_per_token(full) - flops_per_token(trunc) == saved
    # The paper reports ~30% saved across its truncated runs; at r=4, k=2 the rule gives 24%.
    assert 0.2 < saved / flops_per_token(full) < 0.35


def test_tokens_for_budget_whole_steps():
    config = LoopedConfig.iso_depth(10, 4)
    f, batch = flops_per_token(config), 262_144
    tokens = tokens_for_budget(config, 1e18, batch)
    assert tokens % batch == 0
    assert tokens * f <= 1e18 < (tokens + batch) * f
    assert tokens_for_budget(config, f * batch * 0.99, batch) == 0
    with pytest.raises(ValueError, match="positive"):
        tokens_for_budget(config, 0, batch)


def test_equal_width_flops_nearly_equal_across_r():
    """At equal width F differs across r only by the injection (<7%), while unique parameters fall."""
    f = {r: flops_per_token(LoopedConfig.iso_depth(10, r)) for r in (1, 2, 4, 8)}
    assert all(f[1] < f[r] < 1.07 * f[1] for r in (2, 4, 8))
