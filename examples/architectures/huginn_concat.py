"""A Huginn-style recurrent depth model (Geiping et al. 2025, "Scaling up Test-Time Compute with Latent
Reasoning: A Recurrent Depth Approach"), written only against loopscale's architecture interface.

What sets it apart from loopscale's built-in linear injection, at the same prelude / shared block / coda shape:
- the recurrent state does not start from the prelude's output e: it starts from noise, h_0 ~ N(0, state_std^2)
  per token and channel, drawn afresh at every forward (training and evaluation alike, as Huginn does);
- the adapter concatenates the state and the embedding, u_t = A [h_t ; e] with A of shape d x 2d, and A is an
  ordinary random matrix (uniform, standard deviation 1/sqrt(2d)), not the identity-on-e start of the built-in.
The shared block then maps u_t to h_{t+1} = norm(block(u_t)) and the coda reads h_r. At r = 1 the model is the
same plain 20-layer stack as the built-in's, so both families share their r = 1 baseline.

Blocks, norms, rotary tables and the capped head are loopscale's own (``loopscale.model.looped``), so only the loop differs.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn as nn

from loopscale.model import LoopedConfig
from loopscale.model.lm_head import capped_cross_entropy, capped_logits
from loopscale.model.looped import Block, RMSNorm, rotary_tables


class ConcatAdapterLM(nn.Module):
    """Embedding -> prelude -> (noise state, concat adapter, shared block) x r -> coda -> head."""

    def __init__(self, config: LoopedConfig, state_std: float):
        super().__init__()
        if state_std <= 0:
            raise ValueError(f"state_std must be positive, got {state_std}")
        self.config, self.state_std = config, state_std
        d = config.width
        self.embed = nn.Embedding(config.vocab_size, d)
        self.embed_norm = RMSNorm(d, config.norm_eps)
        self.prelude = nn.ModuleList(Block(config) for _ in range(config.n_prelude))
        self.adapter = nn.Linear(2 * d, d, bias=False) if config.looped else None
        self.core = nn.ModuleList(Block(config) for _ in range(config.n_recur))
        self.state_norm = RMSNorm(d, config.norm_eps) if config.looped else None
        self.coda = nn.ModuleList(Block(config) for _ in range(config.n_coda))
        self.final_norm = RMSNorm(d, config.norm_eps)
        self.lm_head = nn.Linear(d, config.vocab_size, bias=False)
        self.register_buffer("rope", rotary_tables(config.seq_len, config.head_dim, config.rope_theta),
                             persistent=False)
        self._initialise()

    @torch.no_grad()
    def _initialise(self) -> None:
        """Embedding N(0, 1), head N(0, 1e-3); every matrix uniform with standard deviation 1/sqrt(fan-in)."""
        nn.init.normal_(self.embed.weight, 0.0, 1.0)
        nn.init.normal_(self.lm_head.weight, 0.0, 1e-3)
        for module in self.modules():
            if isinstance(module, nn.Linear) and module is not self.lm_head:
                bound = math.sqrt(3 / module.in_features)
                nn.init.uniform_(module.weight, -bound, bound)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """idx (B, T) -> fp32 logits (B, T, V), or the mean cross-entropy (nats) against targets."""
        rope = self.rope
        x = self.embed_norm(self.embed(idx))
        for block in self.prelude:
            x = block(x, rope)
        x = self._loop(x, rope) if self.config.looped else self._stack(self.core, x, rope)
        x = self._stack(self.coda, x, rope)
        x = self.final_norm(x)
        if targets is None:
            return capped_logits(self.lm_head(x), self.config.logit_softcap)
        return capped_cross_entropy(x, self.lm_head.weight, targets, self.config.logit_softcap)

    def _loop(self, e: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        """r recurrences from a noise state; the first r - bptt_k run without gradients."""
        h = torch.randn_like(e) * self.state_std
        forward_only = self.config.r - self.config.grad_recurrences
        for step in range(self.config.r):
            with torch.no_grad() if step < forward_only else contextlib.nullcontext():
                u = self.adapter(torch.cat((h, e), dim=-1))
                h = self.state_norm(self._stack(self.core, u, rope))
        return h

    @staticmethod
    def _stack(blocks: nn.ModuleList, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        for block in blocks:
            x = block(x, rope)
        return x


def build(config: LoopedConfig, state_std: float = 1.0) -> ConcatAdapterLM:
    """The factory a spec names: ``architecture = "huginn_concat.py:build"``. ``state_std`` 1 puts the noise
    state at the scale of the normalised states that follow it."""
    return ConcatAdapterLM(config, state_std)
