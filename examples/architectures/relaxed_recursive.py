"""A relaxed recursive transformer (Bae et al. 2024, "Relaxed Recursive Transformers: Effective Parameter Sharing
with Layer-wise LoRA"), written only against loopscale's architecture interface.

The shared block keeps one set of weights W for all r recurrences, and every matrix of it gets a low-rank
correction of its own per recurrence: at recurrence i the layer computes x W^T + (x A_i^T) B_i^T, with A_i of
shape (rank, d_in) and B_i of shape (d_out, rank). W is read r times per forward, so it is recurrent (N_rec);
each A_i and B_i is read once, so the LoRA weights are used once per forward and belong to N_once, although they
live inside the loop. Measured accounting finds that from how often each parameter is read, with no help from
this file. B_i starts at zero, so at initialisation the model is exactly loopscale's built-in looped model with
the same injection; A_i is uniform with standard deviation 1/sqrt(d_in). Bae et al. initialise the LoRA from a
truncated SVD of the gap between pretrained layers and the shared one; a model trained from scratch has no such
gap, hence the zero start.

The model is the built-in ``LoopedLM`` with the relaxation added: ``recurrence`` (one application of the shared
block) is where the current loop index is set. The LoRA weights train with AdamW, in the optimizer group that
loopscale's recipe gives AdamW and its own rate ("lanes"): MuonH holds every matrix at the norm it started with,
which would keep each B_i at zero for ever.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from loopscale.model import LoopedConfig, LoopedLM


class PerLoopLoRA(nn.Linear):
    """A shared linear layer with one low-rank correction per recurrence; ``loop`` selects the correction. It keeps
    the shared layer's weight under its own name (``weight``), so the shared block reads as the same parameters
    at every r, the plain stack's at r = 1 included."""

    def __init__(self, shared: nn.Linear, loops: int, rank: int):
        super().__init__(shared.in_features, shared.out_features, bias=False, device=shared.weight.device,
                         dtype=shared.weight.dtype)
        self.weight, self.loop = shared.weight, 0
        self.down = nn.ParameterList(nn.Parameter(torch.empty(rank, shared.in_features)) for _ in range(loops))
        self.up = nn.ParameterList(nn.Parameter(torch.zeros(shared.out_features, rank)) for _ in range(loops))
        bound = math.sqrt(3 / shared.in_features)
        for down in self.down:
            nn.init.uniform_(down.detach(), -bound, bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) + (x @ self.down[self.loop].t()) @ self.up[self.loop].t()


class RelaxedRecursiveLM(LoopedLM):
    """LoopedLM whose shared block's six matrices (q, k, v, o, MLP in and out) carry per-recurrence LoRA."""

    def __init__(self, config: LoopedConfig, rank: int):
        if config.injection == "hyperconnect":
            raise ValueError("relaxed_recursive takes the linear, additive or none injection, not hyperconnect")
        if rank < 1:
            raise ValueError(f"rank must be >= 1, got {rank}")
        super().__init__(config)
        self.relaxed: list[PerLoopLoRA] = []
        if not config.looped:
            return  # r = 1: a plain stack, nothing to relax
        for block in self.core:
            for owner, name in ((block.attn, "q"), (block.attn, "k"), (block.attn, "v"), (block.attn, "o"),
                                (block.mlp, "fc"), (block.mlp, "proj")):
                lora = PerLoopLoRA(getattr(owner, name), config.r, rank)
                setattr(owner, name, lora)
                self.relaxed.append(lora)
        self._loop = 0

    def loopscale_param_groups(self) -> dict[str, list[nn.Parameter]]:
        """LoopedLM's groups with the LoRA weights moved from the matrices (MuonH) to AdamW's "lanes"."""
        groups = self.param_groups()
        lora = [p for module in self.relaxed for p in (*module.down, *module.up)]
        taken = {id(p) for p in lora}
        groups["matrices"] = [p for p in groups["matrices"] if id(p) not in taken]
        groups["lanes"] = groups["lanes"] + lora
        return groups

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        self._loop = 0
        return super().forward(idx, targets)

    def recurrence(self, e: torch.Tensor, h: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        for lora in self.relaxed:
            lora.loop = self._loop
        self._loop += 1
        return super().recurrence(e, h, rope)


def build(config: LoopedConfig, rank: int = 8) -> RelaxedRecursiveLM:
    """The factory a spec names: ``architecture = "relaxed_recursive.py:build"``, ``[template.options] rank``."""
    return RelaxedRecursiveLM(config, rank)
