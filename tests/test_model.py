"""LoopedLM behaves as the paper's architecture: tiny float32 configs on CPU."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from loopscale.model import LoopedConfig, LoopedLM
from loopscale.model.runtime import autocast, maybe_compile, pick_device

TINY = dict(depth=8, width_unit=16, head_dim=16, seq_len=32, vocab_size=64)


def build(s=2, r=2, seed=0, **kw) -> LoopedLM:
    torch.manual_seed(seed)
    return LoopedLM(LoopedConfig.iso_depth(s, r, **{**TINY, **kw}))


def tokens(config: LoopedConfig, batch=3, seed=1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, config.vocab_size, (batch, config.seq_len), generator=g)


def test_iso_depth_template():
    assert [(c.n_prelude, c.n_recur, c.n_coda, c.effective_depth, c.injection)
            for c in (LoopedConfig.iso_depth(10, r) for r in (1, 2, 4, 8))] == [
        (2, 16, 2, 20, "none"), (2, 8, 2, 20, "linear"), (2, 4, 2, 20, "linear"), (2, 2, 2, 20, "linear")]
    assert LoopedConfig.iso_depth(10, 4).width == 640 and LoopedConfig.iso_depth(10, 4).n_heads == 5
    assert LoopedConfig.iso_depth(7, 2).width == 512  # 448 rounded up to a multiple of head_dim 128
    assert LoopedConfig.iso_depth(3, 2, width_unit=16, head_dim=16).width == 48


@pytest.mark.parametrize("kwargs,message", [
    (dict(s=10, r=3), "does not divide the shared depth 16"),
    (dict(s=0, r=2), "must be positive"),
    (dict(s=10, r=2, injection="concat"), "injection must be one of"),
    (dict(s=10, r=4, bptt_k=5), "bptt_k"),
])
def test_invalid_shapes_fail_clearly(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LoopedConfig.iso_depth(**kwargs)


def test_width_must_be_multiple_of_head_dim():
    with pytest.raises(ValueError, match="not a multiple of head_dim"):
        LoopedConfig(width=100, head_dim=16)


# ---- an independent reference forward, written from the paper's formulas on the raw weights -----------------
EPS, THETA, CAP = 1e-6, 10_000.0, 15.0  # the paper (docs/paper.md): RMSNorm eps, RoPE theta, logit soft-cap


def ref_rms(x: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps), times a learnable scale where the norm has one."""
    y = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + EPS)
    return y if scale is None else y * scale


def ref_rope(x: torch.Tensor) -> torch.Tensor:
    """RoPE on (B, H, T, hd) as complex numbers: dims (2j, 2j + 1) form z_j, rotated by position t at
    frequency theta^(-2j/hd). The angle's sign is a convention (both signs give scores that depend on
    position differences only); the model's is clockwise, z_j * exp(-i t w_j)."""
    hd, t = x.size(-1), torch.arange(x.size(-2), dtype=torch.float64)
    w = THETA ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    z = torch.complex(x[..., 0::2].double(), x[..., 1::2].double()) * torch.exp(-1j * torch.outer(t, w))
    return torch.stack((z.real, z.imag), -1).flatten(-2).to(x.dtype)


def ref_block(x: torch.Tensor, w: dict[str, torch.Tensor], name: str, head_dim: int) -> torch.Tensor:
    """Pre-norm block: x + Attn(RMSNorm(x)), then + MLP(RMSNorm(.)); causal attention with RoPE, then
    parameter-free QK RMSNorm, scores scaled by 1/sqrt(hd); squared-ReLU MLP; no biases."""
    B, T, d = x.shape
    a = ref_rms(x, w[f"{name}.attn_norm.weight"])
    q, k, v = ((a @ w[f"{name}.attn.{p}.weight"].T).view(B, T, d // head_dim, head_dim).transpose(1, 2)
               for p in "qkv")
    q, k = ref_rms(ref_rope(q)), ref_rms(ref_rope(k))
    scores = (q @ k.transpose(-1, -2)) / head_dim ** 0.5
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, d)
    x = x + y @ w[f"{name}.attn.o.weight"].T
    m = ref_rms(x, w[f"{name}.mlp_norm.weight"])
    return x + torch.relu(m @ w[f"{name}.mlp.fc.weight"].T).square() @ w[f"{name}.mlp.proj.weight"].T


def ref_logits(m: LoopedLM, idx: torch.Tensor, no_grad_recurrences: int = 0) -> torch.Tensor:
    """Embedding, RMSNorm, prelude; r recurrences of the shared block on the injection u (linear: W [e; h],
    h_0 = e; additive: h + e, h_0 = 0; none: h, h_0 = e), each ending in an RMSNorm; coda; RMSNorm; LM head;
    c * tanh(logits / c). The first ``no_grad_recurrences`` run without gradients (truncated backprop)."""
    c = m.config
    w = dict(m.named_parameters())
    layer = lambda x, part, i: ref_block(x, w, f"{part}.{i}", c.head_dim)  # noqa: E731
    e = ref_rms(w["embed.weight"][idx], w["embed_norm.weight"])
    for i in range(c.n_prelude):
        e = layer(e, "prelude", i)
    h = e
    if c.looped:
        h = torch.zeros_like(e) if c.injection == "additive" else e
        for t in range(c.r):
            with torch.set_grad_enabled(t >= no_grad_recurrences and torch.is_grad_enabled()):
                u = {"linear": lambda: torch.cat((e, h), -1) @ w["inject.weight"].T, "additive": lambda: h + e,
                     "none": lambda: h}[c.injection]()
                for i in range(c.n_recur):
                    u = layer(u, "core", i)
                h = ref_rms(u, w["recur_norm.weight"])
    else:
        for i in range(c.n_recur):
            h = layer(h, "core", i)
    for i in range(c.n_coda):
        h = layer(h, "coda", i)
    return CAP * torch.tanh((ref_rms(h, w["final_norm.weight"]) @ w["lm_head.weight"].T).float() / CAP)


def large_logits(m: LoopedLM) -> LoopedLM:
    """Logits of tens of nats (the head scaled up), where the soft-cap bends them: at init they are ~0.1."""
    with torch.no_grad():
        m.lm_head.weight.mul_(300.0)
    return m


def test_r1_is_a_plain_transformer():
    """r=1: embedding, norm, n unique blocks one after another, final norm, head - no injection, no loop norm."""
    m = large_logits(build(r=1))
    assert m.inject is None and m.recur_norm is None and len(m.blocks()) == 8
    idx = tokens(m.config)
    with torch.no_grad():
        torch.testing.assert_close(m(idx), ref_logits(m, idx), rtol=1e-5, atol=1e-5)


def prelude_output(m: LoopedLM, idx: torch.Tensor) -> torch.Tensor:
    x = m.embed_norm(m.embed(idx))
    for block in m.prelude:
        x = block(x, m.rope)
    return x


def first_core_inputs(m: LoopedLM, idx: torch.Tensor) -> list[torch.Tensor]:
    seen = []
    handle = m.core[0].register_forward_hook(lambda mod, args, out: seen.append(args[0].detach().clone()))
    with torch.no_grad():
        m(idx)
    handle.remove()
    return seen


@pytest.mark.parametrize("injection", ["linear", "additive", "none"])
def test_first_recurrence_sees_the_prelude_output(injection):
    m = build(r=4, injection=injection)
    idx = tokens(m.config)
    inputs = first_core_inputs(m, idx)
    assert len(inputs) == 4  # the shared block runs r times
    with torch.no_grad():
        e = prelude_output(m, idx)
    assert torch.equal(inputs[0], e) if injection != "linear" else torch.allclose(inputs[0], e, atol=1e-6)


def test_linear_injection_initialised_identity_on_e():
    m = build(r=2, injection="linear")
    d = m.config.width
    assert torch.equal(m.inject.weight, torch.cat((torch.eye(d), torch.zeros(d, d)), dim=1))


@pytest.mark.parametrize("injection", ["linear", "additive", "none"])
def test_the_loop_computes_the_papers_forward(injection):
    """The model's logits are those of the reference written from the paper (docs/paper.md), for every injection."""
    m = large_logits(build(r=4, injection=injection))
    with torch.no_grad():  # make the injection's h-half non-zero so the state really matters
        if m.inject is not None:
            m.inject.weight.add_(0.05 * torch.randn_like(m.inject.weight))
    idx = tokens(m.config)
    with torch.no_grad():
        torch.testing.assert_close(m(idx), ref_logits(m, idx), rtol=1e-5, atol=1e-5)


def test_truncated_backprop_gradients():
    """bptt_k=1 at r=4: every gradient equals that of the reference forward with its first 3 recurrences run
    without gradients; and the shared block's differs from full backprop (so gradient really stopped)."""
    truncated = build(r=4, bptt_k=1)
    with torch.no_grad():  # at the [I | 0] init the state h is ignored, so earlier recurrences get no gradient
        truncated.inject.weight.add_(0.05 * torch.randn_like(truncated.inject.weight))
    full = build(r=4)
    full.load_state_dict(truncated.state_dict())
    idx = tokens(truncated.config)
    truncated(idx, idx).backward()
    full(idx, idx).backward()

    manual = build(r=4)
    manual.load_state_dict(truncated.state_dict())
    logits = ref_logits(manual, idx, no_grad_recurrences=3)
    torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), idx.view(-1)).backward()

    for (name, p_t), p_m, p_f in zip(truncated.named_parameters(), manual.parameters(), full.parameters()):
        torch.testing.assert_close(p_t.grad, p_m.grad, rtol=1e-5, atol=1e-7, msg=name)
    core_t = torch.cat([p.grad.flatten() for p in truncated.core.parameters()])
    core_f = torch.cat([p.grad.flatten() for p in full.core.parameters()])
    assert not torch.allclose(core_t, core_f)


def test_param_groups_partition_the_parameters():
    m = build(r=2)
    groups = m.param_groups()
    ids = [id(p) for ps in groups.values() for p in ps]
    assert len(ids) == len(set(ids)) == len(list(m.parameters()))
    assert all(p.ndim == 2 for p in groups["matrices"]) and all(p.ndim == 1 for p in groups["norms"])


@pytest.mark.parametrize("r", [1, 2, 4])
def test_model_trains_on_cpu(r):
    """A few AdamW steps on a fixed batch drive the loss down from ~log V."""
    m = build(r=r, seq_len=32)
    idx = tokens(m.config, batch=4)
    opt = torch.optim.AdamW(m.parameters(), lr=3e-3, betas=(0.8, 0.95))
    losses = []
    for _ in range(15):
        loss = m(idx[:, :-1], idx[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[0] == pytest.approx(torch.log(torch.tensor(64.0)).item(), abs=0.3)
    assert losses[-1] < losses[0] - 0.5


def test_runtime_options_degrade_on_cpu():
    device = pick_device("cpu")
    m = build(r=2)
    compiled, reason = maybe_compile(m, device, enabled=True)
    assert compiled is m and "skipped" in reason
    with autocast(device, bf16=True):
        logits = m(tokens(m.config))
    assert logits.dtype == torch.float32


def test_config_round_trips():
    c = LoopedConfig.iso_depth(6, 4, bptt_k=2)
    assert LoopedConfig(**c.to_dict()) == c
    assert dataclasses.replace(LoopedConfig.iso_depth(10, 4), bptt_k=2).grad_recurrences == 2
