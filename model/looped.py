"""The looped transformer: prelude -> shared block run r times -> coda (Schwethelm et al. 2026, Sec. 3).

Block: pre-norm RMSNorm (learnable scale), attention with RoPE (``apply_rotary``: adjacent dimension pairs, one
complex multiply) then parameter-free QK RMSNorm, squared-ReLU MLP 4d wide, no biases. Model-level RMSNorms
after the embedding, at the end of every recurrence (looped models only) and before the untied LM head; logits
soft-capped ``c * tanh(x / c)`` in fp32, and the loss fused with the head on CPU (model/lm_head.py).

Injection of the prelude output e into every recurrence (state h):
  linear    u_t = W [e ; h_t], W (d x 2d) initialised [I | 0], h_0 = e
  additive  u_t = h_t + e, h_0 = 0
  none      u_t = h_t, h_0 = e
The shared block maps u_t to the next state, h_{t+1} = norm(block(u_t)). A training step at sampled depth
(``depth_sampling``, model/depth.py) runs the same loop s times instead of r: the same injection, initial state
and norm, gradients through the last min(s, bptt_k) recurrences.

  hyperconnect (K lanes; docs/paper.md, "Hyperconnections"): lanes L_k = e for k = 1..K; recurrence i runs the
            block on u_i = sum_k alpha_i[k] L_k, s_i = norm(block(u_i)), then L <- M_i L + beta_i s_i (each
            lane k gets M_i[k, :] L + beta_i[k] s_i); the coda reads sum_k L_k. alpha_i (K), M_i (K x K),
            beta_i (K) are separate per recurrence, initialised alpha_i = e_(i mod K), M_i = I, beta_i = 1.
            At that init every lane holds the same state, so the model starts as the residual loop
            u_{i+1} = u_i + s_i (u_1 = e) whose coda input is K u_{r+1}: NOT the linear, additive or none loop
            (tests/test_model.py checks exactly this). The lane update is one (K x (K + 1)) matmul with
            [M_i | beta_i] over the stacked [L; s], the read-out one (1 x K) matmul: 2 (K^2 + 2K) d FLOPs per
            token forward, as model/accounting.py counts them.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import fusions
from .config import LoopedConfig
from .lm_head import capped_cross_entropy, capped_logits


class RMSNorm(nn.Module):
    """RMSNorm with a learnable scale vector (initialised to ones)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.size(-1),), self.weight, self.eps)


def rotary_tables(seq_len: int, head_dim: int, theta: float) -> torch.Tensor:
    """The rotation of each position, (T, head_dim / 2, 2) as (cos, sin) of t w_j, w_j = theta^(-2j / head_dim):
    a real tensor (buffers of every dtype travel through ``.to`` and DDP), read as complex by ``apply_rotary``."""
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv_freq)
    return torch.stack((angles.cos(), angles.sin()), dim=-1)


def apply_rotary(x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
    """RoPE on x (B, T, heads, head_dim): dims (2j, 2j + 1) form z_j = x_2j + i x_2j+1, turned clockwise by
    position, z_j exp(-i t w_j), in fp32. Eager: one complex multiply (bf16 has no complex type, hence fp32);
    compiled (or ``fusions.EAGER_FUSIONS`` off): the same rotation in reals, (x_2j cos + x_2j+1 sin,
    x_2j+1 cos - x_2j sin), which Inductor fuses (it generates no code for complex arithmetic)."""
    pairs = x.float().unflatten(-1, (-1, 2))
    turn = rope[: x.size(1)].unsqueeze(1)  # (T, 1, head_dim / 2, 2)
    if fusions.plain_formulas():
        (even, odd), (cos, sin) = pairs.unbind(-1), turn.unbind(-1)
        turned = torch.stack((even * cos + odd * sin, odd * cos - even * sin), dim=-1)
    else:
        turned = torch.view_as_real(torch.view_as_complex(pairs) * torch.view_as_complex(turn).conj())
    return turned.flatten(-2).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, config: LoopedConfig):
        super().__init__()
        d = config.width
        self.n_heads, self.head_dim, self.eps = config.n_heads, config.head_dim, config.norm_eps
        self.q, self.k, self.v, self.o = (nn.Linear(d, d, bias=False) for _ in range(4))

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        B, T, d = x.shape
        H, hd = self.n_heads, self.head_dim
        # q and k side by side, (B, T, 2H, hd), so that RoPE and the QK-norm are one operation each
        qk = torch.stack((self.q(x), self.k(x)), dim=2).view(B, T, 2 * H, hd)
        qk = F.rms_norm(apply_rotary(qk, rope), (hd,), eps=self.eps)  # QK-norm after RoPE, no parameters
        q, k = qk.transpose(1, 2).split(H, dim=1)  # (B, H, T, hd) each
        v = self.v(x).view(B, T, H, hd).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # flash kernels on GPU and CPU
        return self.o(y.transpose(1, 2).reshape(B, T, d))


class MLP(nn.Module):
    def __init__(self, config: LoopedConfig):
        super().__init__()
        self.fc = nn.Linear(config.width, config.mlp_hidden, bias=False)
        self.proj = nn.Linear(config.mlp_hidden, config.width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        return self.proj(F.relu(h).square() if fusions.plain_formulas() else _ReluSquare.apply(h))


class _ReluSquare(torch.autograd.Function):
    """relu(x)^2 with a two-pass backward, 2 relu(x) g, where autograd's takes three (the MLP's activations are a
    small model's largest tensors after the logits, and each pass over them runs at memory speed on CPU)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(x)
        ctx.save_for_backward(y)
        return y * y

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        (y,) = ctx.saved_tensors
        return (grad * y).mul_(2.0)


class Block(nn.Module):
    def __init__(self, config: LoopedConfig):
        super().__init__()
        self.attn_norm = RMSNorm(config.width, config.norm_eps)
        self.attn = Attention(config)
        self.mlp_norm = RMSNorm(config.width, config.norm_eps)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), rope)
        return x + self.mlp(self.mlp_norm(x))


class HyperConnections(nn.Module):
    """The per-recurrence lane weights of ``injection = "hyperconnect"`` (module docstring)."""

    def __init__(self, r: int, lanes: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.empty(r, lanes))
        self.mix = nn.Parameter(torch.empty(r, lanes, lanes))
        self.beta = nn.Parameter(torch.empty(r, lanes))

    @torch.no_grad()
    def reset_parameters(self) -> None:
        r, lanes = self.alpha.shape
        self.alpha.zero_()
        self.alpha[torch.arange(r), torch.arange(r) % lanes] = 1.0
        self.mix.copy_(torch.eye(lanes).expand(r, lanes, lanes))
        self.beta.fill_(1.0)

    def read(self, lanes: torch.Tensor, step: int) -> torch.Tensor:
        """u = sum_k alpha[step, k] L_k for lanes L of shape (K, B, T, d)."""
        return (self.alpha[step].unsqueeze(0) @ lanes.reshape(lanes.size(0), -1)).view(lanes.shape[1:])

    def write(self, lanes: torch.Tensor, s: torch.Tensor, step: int) -> torch.Tensor:
        """L <- M L + beta s, as one matmul of [M | beta] with the stacked [L; s]."""
        update = torch.cat((self.mix[step], self.beta[step].unsqueeze(1)), dim=1)
        stacked = torch.cat((lanes, s.unsqueeze(0))).reshape(lanes.size(0) + 1, -1)
        return (update @ stacked).view(lanes.shape)


class LoopedLM(nn.Module):
    """Language model of shape ``config``; ``forward(idx)`` -> logits, ``forward(idx, targets)`` -> loss.

    Submodules are named after the loop's parts so parameter groups read straight off them:
    ``embed, embed_norm, prelude, core, inject, recur_norm, coda, final_norm, lm_head``.
    """

    def __init__(self, config: LoopedConfig):
        super().__init__()
        self.config = config
        d = config.width
        self.embed = nn.Embedding(config.vocab_size, d)
        self.embed_norm = RMSNorm(d, config.norm_eps)
        self.prelude = nn.ModuleList(Block(config) for _ in range(config.n_prelude))
        self.core = nn.ModuleList(Block(config) for _ in range(config.n_recur))
        self.coda = nn.ModuleList(Block(config) for _ in range(config.n_coda))
        self.inject: nn.Module | None = None
        if config.injection == "linear":
            self.inject = nn.Linear(2 * d, d, bias=False)
        elif config.injection == "hyperconnect":
            self.inject = HyperConnections(config.r, config.lanes)
        self.recur_norm = RMSNorm(d, config.norm_eps) if config.looped else None
        self.final_norm = RMSNorm(d, config.norm_eps)
        self.lm_head = nn.Linear(d, config.vocab_size, bias=False)
        self.register_buffer("rope", rotary_tables(config.seq_len, config.head_dim, config.rope_theta),
                             persistent=False)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """The paper's init: embedding N(0, 1); LM head N(0, 1e-3); block matrices U(+-sqrt(3/d)) except the
        MLP output U(+-sqrt(3/(4d))); norm scales 1; linear injection [I | 0] so that u_1 = e; hyperconnection
        lanes as in the module docstring."""
        d = self.config.width
        nn.init.normal_(self.embed.weight, 0.0, 1.0)
        nn.init.normal_(self.lm_head.weight, 0.0, 1e-3)
        bound, out_bound = math.sqrt(3 / d), math.sqrt(3 / self.config.mlp_hidden)
        for block in self.blocks():
            for lin in (block.attn.q, block.attn.k, block.attn.v, block.attn.o, block.mlp.fc):
                nn.init.uniform_(lin.weight, -bound, bound)
            nn.init.uniform_(block.mlp.proj.weight, -out_bound, out_bound)
        if isinstance(self.inject, HyperConnections):
            self.inject.reset_parameters()
        elif self.inject is not None:
            self.inject.weight.zero_()
            self.inject.weight[:, :d].copy_(torch.eye(d))
        for module in self.modules():
            if isinstance(module, RMSNorm):
                nn.init.ones_(module.weight)

    def blocks(self) -> list[Block]:
        return [*self.prelude, *self.core, *self.coda]

    def param_groups(self) -> dict[str, list[nn.Parameter]]:
        """Parameters by optimizer group: ``embedding``, ``lm_head``, ``matrices`` (block and linear injection
        weights), ``norms`` (every RMSNorm scale) and ``lanes`` (hyperconnection weights). Every parameter is
        in exactly one group."""
        norms = [m.weight for m in self.modules() if isinstance(m, RMSNorm)]
        lanes = list(self.inject.parameters()) if isinstance(self.inject, HyperConnections) else []
        special = {id(self.embed.weight), id(self.lm_head.weight)} | {id(p) for p in norms + lanes}
        matrices = [p for p in self.parameters() if id(p) not in special]
        return {"embedding": [self.embed.weight], "lm_head": [self.lm_head.weight], "matrices": matrices,
                "norms": norms, "lanes": lanes}

    loopscale_param_groups = param_groups  # the optimizer groups' hook of every architecture (model/architecture.py)

    def loopscale_roles(self) -> dict[str, str]:
        """Hyperconnection lane weights are the recurrent part's (N_rec), as the paper counts them, although each
        recurrence reads its own slice once (which measured accounting alone would call N_once)."""
        if not isinstance(self.inject, HyperConnections):
            return {}
        return {f"inject.{name}": "loop" for name, _ in self.inject.named_parameters()}

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None,
                recurrences: int | None = None) -> torch.Tensor:
        """idx: (B, T) token ids. Returns fp32 logits (B, T, V), or the mean cross-entropy (nats) on targets.
        ``recurrences``: the shared block's runs in this pass, a training step's drawn depth (default r)."""
        rope = self.rope
        x = self.embed_norm(self.embed(idx))
        for block in self.prelude:
            x = block(x, rope)
        if self.config.looped:
            x = self._recur(x, rope, recurrences or self.config.r)
        else:
            x = self._run(self.core, x, rope)
        for block in self.coda:
            x = block(x, rope)
        x = self.final_norm(x)
        if targets is None:
            return capped_logits(self.lm_head(x), self.config.logit_softcap)
        return capped_cross_entropy(x, self.lm_head.weight, targets, self.config.logit_softcap)

    @staticmethod
    def _run(blocks: nn.ModuleList, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        for block in blocks:
            x = block(x, rope)
        return x

    def _recur(self, e: torch.Tensor, rope: torch.Tensor, runs: int) -> torch.Tensor:
        """Run the shared block ``runs`` times on the prelude output e; all but the last k run without gradients."""
        cfg = self.config
        if isinstance(self.inject, HyperConnections):
            return self._hyperconnect(e, rope)
        h = torch.zeros_like(e) if cfg.injection == "additive" else e
        no_grad_steps = runs - cfg.grad_recurrences_at(runs)
        for step in range(runs):
            with torch.no_grad() if step < no_grad_steps else contextlib.nullcontext():
                h = self.recurrence(e, h, rope)
        return h

    def _hyperconnect(self, e: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        """K lanes through r recurrences (full backprop: the config refuses truncation); the coda reads their sum."""
        lanes = e.unsqueeze(0).expand(self.config.lanes, *e.shape)
        for step in range(self.config.r):
            s = self.recur_norm(self._run(self.core, self.inject.read(lanes, step), rope))
            lanes = self.inject.write(lanes, s, step)
        return lanes.sum(0)

    def recurrence(self, e: torch.Tensor, h: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        """One application of the shared block: inject e into the state h, run the block, normalise."""
        if self.config.injection == "linear":
            u = self.inject(torch.cat((e, h), dim=-1))
        elif self.config.injection == "additive":
            u = h + e
        else:
            u = h
        return self.recur_norm(self._run(self.core, u, rope))
