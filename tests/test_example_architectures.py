"""The two architectures of examples/architectures/, written only against the architecture interface: their
forward contract, what they are at initialisation, and their measured accounting (model/measured.py), which must
put the relaxed recursive transformer's per-loop LoRA weights in N_once without help."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch

from loopscale.model import LoopedConfig, LoopedLM
from loopscale.model.accounting import account
from loopscale.model.architecture import build, param_groups
from loopscale.search.cli import main

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "architectures"
RELAXED = f"{EXAMPLES / 'relaxed_recursive.py'}:build"
HUGINN = f"{EXAMPLES / 'huginn_concat.py'}:build"


def shape(r: int, injection: str = "linear", **extra) -> LoopedConfig:
    return LoopedConfig.iso_depth(2, r, depth=8, prelude=2, coda=2, width_unit=8, head_dim=8, seq_len=32,
                                  vocab_size=256, injection=injection, **extra)


def as_arch(config: LoopedConfig, architecture: str, **options) -> LoopedConfig:
    return dataclasses.replace(config, architecture=architecture, options=options)


def tokens(config: LoopedConfig) -> torch.Tensor:
    return torch.randint(0, config.vocab_size, (2, config.seq_len + 1), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("architecture", [RELAXED, HUGINN])
@pytest.mark.parametrize("r", [1, 2, 4])
def test_forward_contract_and_the_loss_at_init_is_log_v(architecture, r):
    config = as_arch(shape(r), architecture)
    torch.manual_seed(0)
    model = build(config)
    idx = tokens(config)
    assert model(idx[:, :-1]).shape == (2, config.seq_len, config.vocab_size)
    loss = model(idx[:, :-1], idx[:, 1:])
    assert loss.dim() == 0 and abs(loss.item() - math.log(config.vocab_size)) < 0.05


@pytest.mark.parametrize("injection", ["linear", "additive", "none"])
@pytest.mark.parametrize("r", [1, 2, 4])
def test_the_relaxed_model_starts_as_the_built_in_loop(injection, r):
    """B_i = 0: the LoRA adds nothing until it trains, so the logits equal LoopedLM's of the same seed."""
    config = shape(r, injection if r > 1 else "none")
    torch.manual_seed(0)
    plain = LoopedLM(config)
    torch.manual_seed(0)
    relaxed = build(as_arch(config, RELAXED, rank=3))
    idx = tokens(config)[:, :-1]
    assert torch.equal(plain(idx), relaxed(idx))


def test_each_recurrence_uses_its_own_lora():
    """With B_i set, recurrence i's correction changes the output, and another recurrence's does not stand in."""
    config = as_arch(shape(4), RELAXED, rank=2)
    torch.manual_seed(0)
    model = build(config)
    idx = tokens(config)[:, :-1]
    before = model(idx)
    with torch.no_grad():
        model.relaxed[0].up[3].normal_()  # the last recurrence's q correction only
    after = model(idx)
    assert not torch.equal(before, after)
    with torch.no_grad():
        model.relaxed[0].up[3].zero_()
    assert torch.equal(before, model(idx))


@pytest.mark.parametrize("r", [2, 4])
def test_lora_weights_are_measured_as_n_once_and_the_shared_block_as_n_rec(r):
    config = shape(r)
    rank, d = 2, config.width
    plain, relaxed = account(config), account(as_arch(config, RELAXED, rank=rank))
    # per block and recurrence: q, k, v, o (d -> d), MLP in (d -> 4d) and out (4d -> d), rank * (d_in + d_out)
    lora = r * config.n_recur * rank * (4 * 2 * d + 2 * 5 * d)
    assert relaxed.N_once == plain.N_once + lora
    assert (relaxed.N_rec, relaxed.N_embed) == (plain.N_rec, plain.N_embed)
    assert relaxed.flops_per_token > plain.flops_per_token


@pytest.mark.parametrize("r", [2, 4])
def test_the_concat_adapter_counts_as_the_linear_injection_does(r):
    """Its d x 2d adapter runs every recurrence, as the built-in linear injection's W does: both are N_rec."""
    config = shape(r)
    plain, huginn = account(config), account(as_arch(config, HUGINN))
    assert (huginn.N_once, huginn.N_rec, huginn.N_embed) == (plain.N_once, plain.N_rec, plain.N_embed)


def test_the_noise_state_is_drawn_from_the_seeded_generator():
    config = as_arch(shape(4), HUGINN)
    torch.manual_seed(0)
    model = build(config)
    idx = tokens(config)[:, :-1]
    torch.manual_seed(5)
    first = model(idx)
    torch.manual_seed(5)
    assert torch.equal(first, model(idx))
    assert not torch.equal(first, model(idx))  # a fresh draw of h_0 at every forward


def test_lora_weights_train_with_adamw_and_every_parameter_is_in_one_group():
    config = as_arch(shape(4), RELAXED, rank=2)
    model = build(config)
    groups = param_groups(model, config.vocab_size)
    lora = {id(p) for m in model.relaxed for p in (*m.down, *m.up)}
    assert lora and lora <= {id(p) for p in groups["lanes"]}
    assert not lora & {id(p) for p in groups["matrices"]}
    grouped = [id(p) for ps in groups.values() for p in ps]
    assert sorted(grouped) == sorted(id(p) for p in model.parameters())


@pytest.mark.parametrize("spec", ["relaxed_recursive.toml", "huginn_concat.toml"])
def test_the_example_specs_pass_check_arch(spec, capsys):
    assert main(["check-arch", str(EXAMPLES / spec)]) == 0, capsys.readouterr().err


@pytest.mark.parametrize("architecture", [RELAXED, HUGINN])
@pytest.mark.parametrize("s", [1, 4])
def test_at_r1_each_design_is_counted_as_the_built_in_plain_stack_it_is(architecture, s):
    """At one recurrence both designs are LoopedLM's plain stack: measured, they give its closed form exactly
    (N_once and N_rec as the closed form splits them, N_embed, FLOPs), so a sweep of either borrows the built-in's
    r = 1 runs (issue 63: 6,288 / 0 and no norm-scale FLOPs against 3,152 / 3,136)."""
    config = dataclasses.replace(shape(1, "none"), width=8 * s)
    assert account(as_arch(config, architecture)) == account(config)
