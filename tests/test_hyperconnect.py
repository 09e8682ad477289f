"""injection = "hyperconnect": the paper's lane equations, what the model is at init, and its refusals."""

from __future__ import annotations

import pytest
import torch

from loopscale.model import LoopedConfig, LoopedLM

TINY = dict(depth=8, width_unit=16, head_dim=16, seq_len=32, vocab_size=64)


def build(r=4, lanes=2, seed=0, injection="hyperconnect") -> LoopedLM:
    torch.manual_seed(seed)
    return LoopedLM(LoopedConfig.iso_depth(2, r, injection=injection, lanes=lanes, **TINY))


def idx_for(m: LoopedLM) -> torch.Tensor:
    return torch.randint(0, m.config.vocab_size, (3, m.config.seq_len), generator=torch.Generator().manual_seed(1))


def head(m: LoopedLM, x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Prelude -> ``x(e)`` -> coda -> capped logits, by hand."""
    e = m.embed_norm(m.embed(idx))
    for block in m.prelude:
        e = block(e, m.rope)
    h = x(e)
    for block in m.coda:
        h = block(h, m.rope)
    cap = m.config.logit_softcap
    return cap * torch.tanh(m.lm_head(m.final_norm(h)) / cap)


def shared(m: LoopedLM, u: torch.Tensor) -> torch.Tensor:
    for block in m.core:
        u = block(u, m.rope)
    return m.recur_norm(u)


def test_lanes_follow_the_papers_equations():
    """K = 3 lanes with random alpha, M, beta: the module equals the equations unrolled lane by lane."""
    m = build(r=4, lanes=3)
    with torch.no_grad():
        for p in m.inject.parameters():
            p.add_(0.3 * torch.randn_like(p))
    hc = m.inject

    def loop(e):
        lanes = [e, e, e]
        for i in range(4):
            s = shared(m, sum(hc.alpha[i, k] * lanes[k] for k in range(3)))
            lanes = [sum(hc.mix[i, k, j] * lanes[j] for j in range(3)) + hc.beta[i, k] * s for k in range(3)]
        return lanes[0] + lanes[1] + lanes[2]

    idx = idx_for(m)
    with torch.no_grad():
        torch.testing.assert_close(m(idx), head(m, loop, idx), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("lanes", [1, 2, 3])
def test_at_init_it_is_the_residual_loop(lanes):
    """alpha_i = e_(i mod K), M_i = I, beta_i = 1 keep every lane equal, so the forward at step 0 is the loop
    u_1 = e, u_(i+1) = u_i + norm(block(u_i)), with K u_(r+1) into the coda. That is the 'plain loop' the
    paper's init means: a residual connection across recurrences, not our linear/additive/none loops."""
    m = build(r=4, lanes=lanes)
    hc = m.inject
    assert torch.equal(hc.alpha, torch.eye(lanes)[torch.arange(4) % lanes])
    assert torch.equal(hc.mix, torch.eye(lanes).expand(4, lanes, lanes)) and torch.equal(hc.beta, torch.ones(4, lanes))

    def residual_loop(e):
        u = e
        for _ in range(4):
            u = u + shared(m, u)
        return lanes * u

    idx = idx_for(m)
    with torch.no_grad():
        logits = m(idx)
        torch.testing.assert_close(logits, head(m, residual_loop, idx), rtol=1e-5, atol=1e-5)
        for other in ("linear", "additive", "none"):  # same weights, a different loop: different logits
            plain = build(r=4, injection=other)
            state = {k: v for k, v in m.state_dict().items() if not k.startswith("inject.")}
            plain.load_state_dict(state, strict=other != "linear")
            assert not torch.allclose(plain(idx), logits, atol=1e-3)


def test_every_lane_weight_gets_a_gradient_and_its_own_group():
    m = build(r=4, lanes=2)
    idx = idx_for(m)
    m(idx, idx).backward()
    for name, p in m.inject.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    groups = m.param_groups()
    assert {id(p) for p in groups["lanes"]} == {id(p) for p in m.inject.parameters()}
    assert not {id(p) for p in groups["lanes"]} & {id(p) for p in groups["matrices"]}


def test_refused_with_truncated_backprop_and_bad_lanes():
    with pytest.raises(ValueError, match="hyperconnect' needs backprop through every recurrence") as info:
        LoopedConfig.iso_depth(10, 4, injection="hyperconnect", bptt_k=2)
    assert "\n" not in str(info.value)
    LoopedConfig.iso_depth(10, 4, injection="hyperconnect", bptt_k=4)  # all recurrences: allowed
    with pytest.raises(ValueError, match="lanes must be >= 1"):
        LoopedConfig.iso_depth(10, 4, injection="hyperconnect", lanes=0)
