"""MuonH ("Muon-Hyperball", HyperP, arXiv:2603.28743): the matrix optimizer of Schwethelm et al. 2026.

Every matrix W lives on the sphere of its initial Frobenius norm c_W = ||W_0||_F (read when the optimizer is
built, before any step). One step on W with gradient G, momentum mu = 0.95 (docs/paper.md, "The training recipe")::

    m <- lerp(m, G, 1 - mu)                  Nesterov momentum, lerp form
    g <- lerp(G, m, mu)
    X <- polar_express(g)                    ~ U V^T of g = U S V^T (below)
    X <- X * c_W / ||X||_F                   the update has the weight's own norm
    W <- W - lr * X
    W <- W * c_W / ||W||_F                   back onto the sphere

so ``lr`` is the relative size of an update, whatever the matrix's shape. No weight decay: on the sphere it is a
first-order no-op. NOT torch.optim.Muon, which scales by max(1, rows / cols)^0.5 and never projects.

Polar Express (Amsel et al. 2025, arXiv:2505.16932; 5 iterations, safety 2e-2, cushion 2): normalise
X = g / (1.02 ||g||_F), so every singular value lies in (0, 1), then per iteration (a, b, c) of
``POLAR_EXPRESS``: X <- a X + (b A + c A^2) X with A = X X^T; when X has more rows than columns the smaller
Gram matrix A = X^T X acts from the right, X <- a X + X (b A + c A^2) (the same polynomial in X). Each
iteration maps every singular value sigma to a sigma + b sigma^3 + c sigma^5, pushing them towards 1. Runs in
bf16 on CUDA (tensor cores; the iteration tolerates it), fp32 (or the gradient's own wider dtype) on CPU,
where bf16 matmuls are slower.

Matrices of equal shape are stepped together as one batched tensor (one Polar Express per shape), which keeps
the number of kernel launches per step small on a GPU.
"""

from __future__ import annotations

from collections import defaultdict

import torch

POLAR_EXPRESS = (
    (8.156554524902461, -22.48329292557795, 15.878769915207462),
    (4.042929935166739, -2.808917465908714, 0.5000178451051316),
    (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
    (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
    (2.3465413258596377, -1.7097828382687081, 0.42323551169305323),
)
NORMALISE_MARGIN = 1.02  # ||g||_F is an upper bound on sigma_max; the 2% keeps sigma strictly below 1 in bf16
TINY = 1e-12  # guards the divisions for an all-zero gradient or weight


def polar_express(g: torch.Tensor) -> torch.Tensor:
    """Approximate orthogonal polar factor of each matrix in ``g`` (..., rows, cols), in g's dtype."""
    x = g.to(torch.bfloat16 if g.is_cuda else torch.promote_types(g.dtype, torch.float32))
    x = x / (NORMALISE_MARGIN * _fro(x)).clamp_min(TINY)
    tall = x.size(-2) > x.size(-1)
    for a, b, c in POLAR_EXPRESS:
        if tall:
            gram = x.mT @ x
            x = a * x + x @ (b * gram + c * (gram @ gram))
        else:
            gram = x @ x.mT
            x = a * x + (b * gram + c * (gram @ gram)) @ x
    return x.to(g.dtype)


class MuonH(torch.optim.Optimizer):
    """MuonH for 2-D parameters (module docstring). Param groups take ``lr`` and ``momentum``."""

    def __init__(self, params, lr: float, momentum: float = 0.95):
        if lr < 0 or not 0 <= momentum < 1:
            raise ValueError(f"MuonH needs lr >= 0 and momentum in [0, 1), got lr={lr}, momentum={momentum}")
        super().__init__(params, {"lr": lr, "momentum": momentum})
        for group in self.param_groups:
            for p in group["params"]:
                if p.ndim != 2:
                    raise ValueError(f"MuonH steps matrices only, got a parameter of shape {tuple(p.shape)}")
                # c_W = ||W_0||_F: the sphere every later step projects back to
                self.state[p]["init_norm"] = _fro(p.detach().to(torch.promote_types(p.dtype, torch.float32)))
                self.state[p]["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            by_shape: dict[tuple, list[torch.Tensor]] = defaultdict(list)
            for p in group["params"]:
                if p.grad is not None:
                    by_shape[(p.shape, p.dtype, p.device)].append(p)
            for params in by_shape.values():
                self._step_stack(params, group["lr"], group["momentum"])
        return loss

    def _step_stack(self, params: list[torch.Tensor], lr: float, momentum: float) -> None:
        """One MuonH step on matrices of one shape, stacked along a new leading axis."""
        states = [self.state[p] for p in params]
        weights = torch.stack(params)
        grads = torch.stack([p.grad for p in params])
        buffers = torch.stack([s["momentum_buffer"] for s in states])
        radius = torch.stack([s["init_norm"] for s in states]).to(weights.dtype)
        buffers.lerp_(grads, 1 - momentum)
        update = polar_express(grads.lerp_(buffers, momentum))
        update = update * (radius / _fro(update).clamp_min(TINY))
        weights.sub_(lr * update)
        weights.mul_(radius / _fro(weights).clamp_min(TINY))
        torch._foreach_copy_(params, list(weights.unbind(0)))
        torch._foreach_copy_([s["momentum_buffer"] for s in states], list(buffers.unbind(0)))


def _fro(x: torch.Tensor) -> torch.Tensor:
    """Frobenius norm of each matrix of x (..., rows, cols), keeping the last two dims for broadcasting."""
    return x.norm(dim=(-2, -1), keepdim=True)
