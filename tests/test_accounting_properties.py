"""Property-based tests of the accounting: for every valid shape, counts and FLOPs are positive, consistent
with each other and monotone in width."""

from __future__ import annotations

import dataclasses

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from loopscale.model import LoopedConfig, count_params, flops_per_token, tokens_for_budget
from loopscale.model.accounting import inject_matmul_params
from test_accounting import module_groups


@st.composite
def shapes(draw) -> LoopedConfig:
    r = draw(st.sampled_from([1, 2, 4, 8]))
    n_recur = draw(st.integers(1, 4))
    prelude, coda = draw(st.integers(0, 3)), draw(st.integers(0, 3))
    head_dim = draw(st.sampled_from([8, 16, 32, 64, 128]))
    injection = draw(st.sampled_from(["linear", "additive", "none", "hyperconnect"]))
    return LoopedConfig.iso_depth(
        draw(st.integers(1, 40)), r, depth=prelude + coda + r * n_recur, prelude=prelude, coda=coda,
        width_unit=draw(st.sampled_from([16, 32, 64])), head_dim=head_dim,
        seq_len=draw(st.integers(1, 4096)), vocab_size=draw(st.integers(2, 70_000)),
        injection=injection, lanes=draw(st.integers(1, 4)),  # hyperconnections refuse truncated backprop
        bptt_k=None if injection == "hyperconnect" else draw(st.one_of(st.none(), st.integers(1, r))))


def wider(config: LoopedConfig) -> LoopedConfig:
    return dataclasses.replace(config, width=config.width + config.head_dim)


@settings(max_examples=300, deadline=None)
@given(shapes())
def test_counts_and_flops_are_positive_and_consistent(config):
    p = count_params(config)
    # the closed form against the model itself, built on the meta device, group by group
    assert dataclasses.asdict(p) == module_groups(config)
    assert p.N_once > 0 and p.N_rec > 0
    f = flops_per_token(config)
    # Every parameter of a forward-and-backward part is touched at least 2x (forward) per token.
    assert f >= 2 * (p.N_once + config.r * p.N_rec + p.lm_head)
    # Upper bound: 6 per multiply-add; a hyperconnection lane weight multiplies a whole d-vector per token.
    per_recurrence = p.recur + inject_matmul_params(config)
    assert f <= 6 * (p.N_once + config.r * per_recurrence + p.lm_head) + 12 * config.width * config.seq_len * (
        config.effective_depth)


@settings(max_examples=200, deadline=None)
@given(shapes())
def test_monotone_in_width(config):
    bigger = wider(config)
    p, q = count_params(config), count_params(bigger)
    assert q.N_once > p.N_once and q.N_rec > p.N_rec and q.N_embed > p.N_embed
    assert flops_per_token(bigger) > flops_per_token(config)


@settings(max_examples=200, deadline=None)
@given(shapes(), st.floats(1e6, 1e22), st.integers(1, 1 << 20))
def test_tokens_for_budget_never_overspends(config, budget, batch):
    tokens = tokens_for_budget(config, budget, batch)
    f = flops_per_token(config)
    assert tokens % batch == 0 and tokens >= 0
    assert tokens * f <= budget < (tokens + batch) * f


@settings(max_examples=100, deadline=None)
@given(shapes())
def test_truncation_only_saves(config):
    assume(config.r > 1)
    full = dataclasses.replace(config, bptt_k=None)
    assert flops_per_token(config) <= flops_per_token(full)
    assert count_params(config) == count_params(full)
