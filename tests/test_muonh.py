"""MuonH (objectives/muonh.py) against the paper's step written out here, and its two invariants."""

from __future__ import annotations

import math

import pytest
import torch

from loopscale.objectives.muonh import POLAR_EXPRESS, MuonH, polar_express


def with_singular_values(sigma: torch.Tensor, rows: int, cols: int, seed: int = 0) -> torch.Tensor:
    """A rows x cols matrix U diag(sigma) V^T with random orthonormal U, V."""
    g = torch.Generator().manual_seed(seed)
    u, _ = torch.linalg.qr(torch.randn(rows, len(sigma), generator=g, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(cols, len(sigma), generator=g, dtype=torch.float64))
    return (u * sigma) @ v.T


@pytest.mark.parametrize("rows,cols", [(24, 24), (16, 48), (48, 16)])
def test_polar_express_is_close_to_orthogonal(rows, cols):
    """Every singular value maps through the five odd quintics; from [1e-3, 1] (after the 1.02 ||g||_F
    normalisation) they land in [0.846, 1.142], the band of these coefficients; singular vectors stay."""
    k = min(rows, cols)
    sigma = torch.logspace(0, -2.5, k, dtype=torch.float64)
    g = with_singular_values(sigma, rows, cols)
    out = polar_express(g.float()).double()
    expected = sigma / (1.02 * sigma.norm())  # the scalar map, written out independently
    assert expected.min() > 1e-3
    for a, b, c in POLAR_EXPRESS:
        expected = a * expected + b * expected**3 + c * expected**5
    got = torch.linalg.svdvals(out)
    assert torch.allclose(got, expected.sort(descending=True).values, atol=2e-4)
    assert 0.84 < got.min() and got.max() < 1.15
    u, _, vh = torch.linalg.svd(g, full_matrices=False)  # same singular vectors: X ~ U f(S) V^T
    assert torch.allclose(u.T @ out @ vh.T, torch.diag(u.T @ out @ vh.T).diag(), atol=1e-4)


def test_polar_express_on_random_gradients():
    torch.manual_seed(0)
    for shape in ((64, 256), (256, 64)):
        sv = torch.linalg.svdvals(polar_express(torch.randn(*shape)))
        assert 0.84 < sv.min() and sv.max() < 1.15


def reference_step(w, g, m, w0_norm, lr, mu=0.95):
    """The paper's MuonH step on one matrix, spelled out with explicit loops over the 5 (a, b, c)."""
    m = m + (1 - mu) * (g - m)                  # m <- lerp(m, G, 1 - mu)
    x = g + mu * (m - g)                        # g <- lerp(G, m, mu)
    x = x / (1.02 * math.sqrt(float((x * x).sum())))
    for a, b, c in POLAR_EXPRESS:
        if x.shape[0] > x.shape[1]:
            A = x.T @ x
            x = a * x + x @ (b * A + c * A @ A)
        else:
            A = x @ x.T
            x = a * x + (b * A + c * A @ A) @ x
    x = x * w0_norm / math.sqrt(float((x * x).sum()))
    w = w - lr * x
    w = w * w0_norm / math.sqrt(float((w * w).sum()))
    return w, m


@pytest.mark.parametrize("rows,cols", [(6, 10), (10, 6)])
def test_steps_equal_the_definition(rows, cols):
    torch.manual_seed(1)
    w = torch.nn.Parameter(torch.randn(rows, cols, dtype=torch.float64))
    opt = MuonH([w], lr=0.05)
    ref_w, ref_m = w.detach().clone(), torch.zeros(rows, cols, dtype=torch.float64)
    w0_norm = math.sqrt(float((ref_w * ref_w).sum()))
    for _ in range(3):  # three steps: the momentum buffer carries over
        grad = torch.randn(rows, cols, dtype=torch.float64)
        w.grad = grad.clone()
        opt.step()
        ref_w, ref_m = reference_step(ref_w, grad, ref_m, w0_norm, lr=0.05)
        assert torch.allclose(w.detach(), ref_w, atol=1e-10, rtol=1e-10)
    assert torch.allclose(opt.state[w]["momentum_buffer"], ref_m, atol=1e-12)
    assert torch.equal(w.grad, grad)  # the step reads the gradient, never rewrites it


def test_every_matrix_keeps_its_initial_norm():
    """Many steps on a real model's matrices (every shape the blocks have) with large, varied gradients."""
    torch.manual_seed(2)
    mats = [torch.nn.Parameter(torch.randn(r, c) * s) for r, c, s in ((32, 32, 0.1), (128, 32, 1.0),
                                                                     (32, 128, 3.0), (32, 64, 0.01))]
    norms = [float(m.detach().norm()) for m in mats]
    opt = MuonH(mats, lr=0.2)
    for _ in range(200):
        for m in mats:
            m.grad = torch.randn_like(m) * 10
        opt.step()
    assert [float(m.detach().norm()) for m in mats] == pytest.approx(norms, rel=1e-5)
    assert not any(torch.allclose(m.detach(), torch.zeros_like(m)) for m in mats)


def test_the_update_moves_the_weights_by_lr_relative_to_their_norm():
    """||W_1 - W_0|| ~ lr ||W_0|| for a small lr: the step's size is relative, whatever the shape."""
    torch.manual_seed(3)
    for shape in ((8, 32), (32, 8), (64, 64)):
        w = torch.nn.Parameter(torch.randn(*shape))
        before = w.detach().clone()
        opt = MuonH([w], lr=1e-3)
        w.grad = torch.randn(*shape)
        opt.step()
        assert float((w.detach() - before).norm() / before.norm()) == pytest.approx(1e-3, rel=2e-2)


def test_refuses_non_matrices():
    with pytest.raises(ValueError, match="matrices only"):
        MuonH([torch.nn.Parameter(torch.ones(4))], lr=0.01)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_bf16_orthogonalisation_on_cuda():
    """On CUDA Polar Express runs in bf16: its singular values stay in the band (plus bf16 rounding), and the
    fp32 weights still keep their initial norm, step after step."""
    torch.manual_seed(4)
    sv = torch.linalg.svdvals(polar_express(torch.randn(256, 1024, device="cuda")).float())
    assert 0.8 < sv.min() and sv.max() < 1.2
    w = torch.nn.Parameter(torch.randn(256, 1024, device="cuda"))
    norm = float(w.detach().norm())
    opt = MuonH([w], lr=0.1)
    for _ in range(50):
        w.grad = torch.randn_like(w)
        opt.step()
    assert float(w.detach().norm()) == pytest.approx(norm, rel=1e-5)
