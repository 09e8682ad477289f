"""The soft-capped LM head and its cross-entropy, with a fused path for CPU training.

Logits are capped as in the paper's model (Schwethelm et al. 2026; from nanochat): ``l = c tanh(z / c)`` with
``z = h W^T`` in fp32, and the loss is the mean cross-entropy of ``l`` against the targets, in nats.

On CUDA (and wherever ``torch.compile`` traces the model, on the meta device where accounting runs, or with
``fusions.EAGER_FUSIONS`` off) the head is written out plainly, so the compiler fuses it. In CPU eager mode the
(tokens x vocab) logits are the largest tensors of a small model's step (4 MiB at 4,096 tokens and a byte
vocabulary), and every element-wise pass over them runs at memory speed (docs/performance.md). The fused path
works through the rows in chunks that stay in cache, and computes the gradients in the same pass:

    c tanh(z / c) = 2c sigmoid(2z / c) - c         (tanh(x) = 2 sigmoid(2x) - 1)

and the constant -c leaves every softmax unchanged, so the loss is the cross-entropy of ``u = 2c sigmoid(y)``,
``y = 2z / c``. With p = softmax(u), s = sigmoid(y) and one-hot targets t, per token

    dL/du = p - t,   du/dz = 2c s (1 - s) 2 / c = 4 s (1 - s),   dL/dz = (p - t) 4 s (1 - s)

and dL/dh = (dL/dz) W, dL/dW = (dL/dz)^T h, summed over chunks and divided by the token count. (CPU's tanh is
~7x slower than its sigmoid, which is why the identity is used at all.)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import fusions

CHUNK_ELEMENTS = 1 << 16  # logits per chunk: 256 KiB in fp32, within a core's L2 cache
MIN_CHUNK_ROWS = 16
MAX_FUSED_CAP = 40.0  # exp(2c) stays finite in fp32 (the fused path skips softmax's max); the paper's c is 15


def capped_logits(z: torch.Tensor, cap: float) -> torch.Tensor:
    """fp32 logits ``c tanh(z / c)`` of the head's output z = h W^T."""
    return cap * torch.tanh(z.float() / cap)


def capped_cross_entropy(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, cap: float) -> torch.Tensor:
    """Mean cross-entropy (nats) of the capped logits of h (..., d) against targets (...) (module docstring)."""
    h2, t = h.reshape(-1, h.size(-1)), targets.reshape(-1)
    if h.device.type != "cpu" or fusions.plain_formulas() or cap > MAX_FUSED_CAP:
        return F.cross_entropy(capped_logits(F.linear(h2, weight), cap), t)
    if torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad):
        return _FusedCappedCrossEntropy.apply(h2, weight, t, cap)
    with torch.no_grad():
        return _chunked(h2, weight, t, cap, grads=False)[0]


def _chunk_rows(vocab: int) -> int:
    return max(MIN_CHUNK_ROWS, CHUNK_ELEMENTS // vocab)


def _chunked(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, cap: float, grads: bool):
    """(mean loss, dL/dh, dL/dW) over row chunks; the gradients are None unless ``grads``. Each chunk makes ~10
    passes over its logits (the fewest the formulas allow in eager PyTorch), every one in cache."""
    n = h.size(0)
    wide = torch.promote_types(h.dtype, torch.float32)  # the head in fp32 at least, as capped_logits
    total = torch.zeros((), dtype=wide)
    dh = torch.empty_like(h) if grads else None
    dw = torch.zeros_like(weight) if grads else None
    to_y = weight.t().to(wide) * (2 / cap)  # y = 2 z / c straight out of the matmul
    step = _chunk_rows(weight.size(0))
    for start in range(0, n, step):
        hc, tc = h[start:start + step], targets[start:start + step]
        rows = torch.arange(len(tc))
        s = torch.mm(hc.to(wide), to_y).sigmoid_()
        u = s * (2 * cap)
        e = u.exp()  # u lies in (0, 2c): no overflow below c = 44, so no max is subtracted (a pass saved)
        sum_e = e.sum(dim=1, keepdim=True)
        total += (sum_e.log().squeeze(1) - u[rows, tc]).sum()
        if not grads:
            continue
        g = e.div_(sum_e)  # p = softmax(u)
        g[rows, tc] -= 1.0
        g.mul_(torch.addcmul(s, s, s, value=-1.0, out=u))  # (p - t) s (1 - s); the 4 / n goes to the matmuls
        g = g.to(h.dtype)
        # plain mm's, not out= or addmm_: torch's FLOP counter registers these overloads only
        dh[start:start + len(tc)] = torch.mm(g, weight).mul_(4.0 / n)
        dw.add_(torch.mm(g.t(), hc), alpha=4.0 / n)
    return total / n, dh, dw


class _FusedCappedCrossEntropy(torch.autograd.Function):
    """Loss and its gradients in one chunked pass (module docstring); backward scales them by dL_out."""

    @staticmethod
    def forward(ctx, h, weight, targets, cap):
        loss, dh, dw = _chunked(h, weight, targets, cap, grads=True)
        ctx.save_for_backward(dh, dw)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        dh, dw = ctx.saved_tensors
        return dh * grad_loss, dw * grad_loss, None, None
