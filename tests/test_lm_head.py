"""The CPU step's eager formulations (the fused LM head and loss, RoPE as a complex multiply) against the plain
formulas a compiled or CUDA step runs: the same loss and the same gradients."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from loopscale.model import LoopedConfig, LoopedLM, fusions
from loopscale.model.lm_head import capped_cross_entropy, capped_logits

CAP = 15.0


@pytest.mark.parametrize("rows, width, vocab", [(4096, 16, 256), (77, 8, 50), (300, 32, 5000)])
def test_fused_head_matches_the_capped_cross_entropy(rows, width, vocab):
    """Rows that are not a multiple of the chunk (77, 300 rows at 16-256 per chunk), logits beyond the cap."""
    gen = torch.Generator().manual_seed(0)
    h = torch.randn(rows, width, generator=gen, requires_grad=True)
    w = (3 * torch.randn(vocab, width, generator=gen)).requires_grad_()
    t = torch.randint(0, vocab, (rows,), generator=gen)
    plain_loss = F.cross_entropy(capped_logits(h @ w.T, CAP), t)
    assert capped_logits(h @ w.T, CAP).abs().max() > 0.9 * CAP  # the cap is in play
    dh, dw = torch.autograd.grad(3.0 * plain_loss, (h, w))
    fused = capped_cross_entropy(h, w, t, CAP)
    fh, fw = torch.autograd.grad(3.0 * fused, (h, w))
    torch.testing.assert_close(fused, plain_loss, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fh, dh, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(fw, dw, rtol=1e-4, atol=1e-6)
    with torch.no_grad():
        torch.testing.assert_close(capped_cross_entropy(h, w, t, CAP), plain_loss, rtol=1e-5, atol=1e-5)


def step_grads(r: int, injection: str) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    m = LoopedLM(LoopedConfig.iso_depth(2, r, depth=8, width_unit=8, head_dim=8, seq_len=32, vocab_size=256,
                                        injection=injection))
    idx = torch.randint(0, 256, (4, 33), generator=torch.Generator().manual_seed(1))
    loss = m(idx[:, :-1], idx[:, 1:])
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in m.named_parameters()}


@pytest.mark.parametrize("r, injection", [(1, "linear"), (2, "hyperconnect"), (4, "linear")])
def test_a_model_step_is_the_same_with_the_plain_formulas(r, injection):
    fused_loss, fused = step_grads(r, injection)
    fusions.EAGER_FUSIONS = False
    try:
        plain_loss, plain = step_grads(r, injection)
    finally:
        fusions.EAGER_FUSIONS = True
    torch.testing.assert_close(fused_loss, plain_loss, rtol=1e-5, atol=1e-6)
    for name, grad in plain.items():
        torch.testing.assert_close(fused[name], grad, rtol=1e-4, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")
