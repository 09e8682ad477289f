"""Measured accounting (model/measured.py) against the closed form and against hand counts, rule by rule.

The built-in LoopedLM, measured on the meta device, must give the closed form's N_once, N_rec, N_embed and FLOPs
(model/accounting.py) exactly, for every injection, r (1 too: its roles read from the same structure at r = 2)
and truncated backprop. Each role rule then on a module written against the interface only
(tests/fixtures/tiny_loop.py): used once, used every loop, embedding (tied or not), per-loop slices, the override,
and a parameter no forward reads.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from loopscale.model import LoopedConfig, account, count_params, flops_per_token
from loopscale.model.measured import measure_inference, measure_module

TINY = Path(__file__).parent / "fixtures" / "tiny_loop.py"
SHAPE = dict(depth=10, prelude=1, coda=1, width_unit=32, head_dim=32, seq_len=64, vocab_size=97)


def looped(r: int, injection: str = "linear", bptt_k: int | None = None, s: float = 4) -> LoopedConfig:
    return LoopedConfig.iso_depth(s, r, injection=injection, bptt_k=bptt_k, **SHAPE)


CASES = [(inj, r, None) for inj in ("linear", "additive", "none", "hyperconnect") for r in (2, 4, 8)]
CASES += [("none", 1, None)]
# bptt_k with an injection that carries the prelude's output into the recurrences that get gradients (with
# "none" it reaches only the forward-only ones, so the prelude gets no gradient and the closed form's 6 P for it
# overcounts; hyperconnect refuses truncation)
CASES += [(inj, r, k) for inj in ("linear", "additive") for r in (2, 4, 8) for k in (1, r // 2) if k >= 1]


@pytest.mark.parametrize("injection,r,bptt_k", CASES)
@pytest.mark.parametrize("s", [2, 4])
def test_looped_lm_measured_equals_the_closed_form(injection, r, bptt_k, s):
    """Every count, the norm scales' FLOPs and the roles at r = 1 included (a plain stack files the layers the
    looped model shares under N_rec, as the closed form does: at r = 1 the law reads only their sum)."""
    config = looped(r, injection, bptt_k, s)
    assert measure_module(config)[0] == account(config)


def test_account_dispatches_on_the_architecture():
    builtin = looped(2)
    assert account(builtin).flops_per_token == flops_per_token(builtin)
    user = LoopedConfig.iso_depth(4, 2, architecture=f"{TINY}:tiny_loop", **SHAPE)
    assert account(user) == measure_module(user)[0]
    with pytest.raises(ValueError, match="closed-form counts are LoopedLM's"):
        count_params(user)


def _tiny(r: int = 2, **options) -> LoopedConfig:
    return LoopedConfig.iso_depth(4, r, architecture=f"{TINY}:tiny_loop", options=options, **SHAPE)


def _block(d: int) -> int:
    return 3 * d * d + d * d + 2 * (2 * d * d) + 2 * d  # qkv, out, up + down (2d wide), two norm scales


def test_a_parameter_used_once_is_n_once_and_the_loop_is_n_rec():
    for r in (1, 2, 4):
        config = _tiny(r)
        d = config.width
        counts, roles = measure_module(config)
        assert counts.N_once == 2 * _block(d) + d  # prelude, coda, final norm
        assert counts.N_rec == _block(d)  # at r = 1 too: read twice at r = 2
        assert roles["core.qkv.weight"] == "loop"
        assert roles["prelude.qkv.weight"] == roles["coda.down.weight"] == "once"


def test_the_embedding_and_the_projection_are_n_embed_tied_or_not():
    d, v = _tiny().width, SHAPE["vocab_size"]
    assert measure_module(_tiny())[0].N_embed == 2 * v * d
    counts, roles = measure_module(_tiny(tied=True))
    assert counts.N_embed == v * d and roles == {**roles, "embed.weight": "embed"}
    assert "head.weight" not in roles  # one tensor, counted once


def test_a_block_of_the_vocabulary_shape_is_no_embedding():
    """The head is the last vocabulary projection a forward calls, not any matrix of its shape: at a width (or
    an MLP width) equal to vocab_size the blocks stay N_once / N_rec."""
    for vocab in (128, 256):  # the width at s = 4, and the fixture's MLP width (2 d)
        config = LoopedConfig.iso_depth(4, 2, architecture=f"{TINY}:tiny_loop", **{**SHAPE, "vocab_size": vocab})
        counts, _ = measure_module(config)
        assert counts.N_embed == 2 * vocab * config.width and counts.N_rec == _block(config.width)
    for vocab in (128, 512):  # LoopedLM's width and its MLP width (4 d)
        config = LoopedConfig.iso_depth(4, 2, **{**SHAPE, "vocab_size": vocab})
        measured, closed = measure_module(config)[0], count_params(config)
        assert (measured.N_once, measured.N_rec, measured.N_embed) == (closed.N_once, closed.N_rec, closed.N_embed)


def test_per_loop_slices_of_one_tensor_are_each_used_once():
    rank = 3
    for r in (2, 4):
        config = _tiny(r, adapters=rank)
        counts, roles = measure_module(config)
        assert roles["down"] == roles["up"] == "once"
        assert counts.N_once == 2 * _block(config.width) + config.width + 2 * r * config.width * rank


def test_loopscale_roles_overrides_the_measured_role():
    config = _tiny(2, roles={"prelude.qkv.weight": "loop", "core.norm.weight": "once"})
    counts, roles = measure_module(config)
    d = config.width
    assert roles["prelude.qkv.weight"] == "loop" and roles["core.norm.weight"] == "once"
    assert counts.N_rec == _block(d) + 3 * d * d - d
    with pytest.raises(ValueError, match="names 'nope', which is no parameter"):
        measure_module(_tiny(2, roles={"nope": "loop"}))
    with pytest.raises(ValueError, match="the role 'twice'"):
        measure_module(_tiny(2, roles={"core.qkv.weight": "twice"}))


def test_a_parameter_no_forward_reads_is_an_error():
    with pytest.raises(ValueError, match=r"parameter 'spare.weight' is read by no forward at r=2 \(and 1 more\)"):
        measure_module(_tiny(2, unused=True))


def test_measured_flops_follow_the_matmuls_and_the_scales():
    """6 x the parameters applied per token (r times for the shared block; its norm scales too) + attention, full
    T; the fixture has no norm of its own after the embedding, so the prelude's first norm, applied straight to
    the embedding's rows, is the embedding's (nothing) and the final norm's 6 d take its place in the sum."""
    for r in (1, 2, 4):
        config = _tiny(r)
        d, v, t = config.width, SHAPE["vocab_size"], SHAPE["seq_len"]
        expected = 6 * ((2 + r) * _block(d) - d + v * d + d) + (2 + r) * 12 * d * t
        assert measure_module(config)[0].flops_per_token == expected


def test_the_fixture_knows_only_the_interface():
    assert "import loopscale" not in TINY.read_text() and "from loopscale" not in TINY.read_text()


RED_TEAM = Path(__file__).parent / "fixtures" / "red_team.py"


def _red_team(design: str, r: int) -> LoopedConfig:
    return LoopedConfig.iso_depth(4, r, architecture=f"{RED_TEAM}:build", options={"design": design}, **SHAPE)


@pytest.mark.parametrize("design", ["chunked", "gru", "sandwich"])
def test_a_weight_read_often_but_not_more_often_with_r_is_used_once(design):
    """A prelude over token chunks, a GRU prelude (read once per time step) and a coda that is the prelude again
    are read more than once per forward, but not more often at a larger r: N_once, at r = 1 too."""
    plain, roles = measure_module(_red_team(design, 1))
    assert plain.N_rec == _block(_red_team(design, 1).width) and roles["core.qkv.weight"] == "loop"
    assert all(role == "once" for name, role in roles.items() if name.startswith("prelude."))
    looped, roles = measure_module(_red_team(design, 2))
    assert looped.N_rec == _block(_red_team(design, 2).width) and roles["core.qkv.weight"] == "loop"
    assert all(role == "once" for name, role in roles.items() if name.startswith("prelude."))


def test_a_shared_weight_derived_once_before_the_loop_is_recurrent():
    """w = W * gain computed once, then applied r times: W and gain are read r times through w."""
    d = _red_team("scaled", 2).width
    counts, roles = measure_module(_red_team("scaled", 2))
    assert roles["shared"] == roles["gain"] == "loop" and counts.N_rec == d * d + 1


def test_a_weight_read_in_the_loop_and_outside_it_has_no_role():
    with pytest.raises(ValueError, match=r"'core\.norm\.weight' is read 3 times per forward at r=2 and 5 at r=4, "
                                         r"neither .* declare its role in loopscale_roles\(\)$"):
        measure_module(_red_team("leaky", 2))


@pytest.mark.parametrize("design,message", [
    ("mv", r"aten\.mv\.default applies 'shared' but FlopCounterMode counts it below 2 FLOPs per weight: an op the "
           r"FLOP counter does not count"),
    ("elementwise", "FlopCounterMode counts 0 FLOPs: its work is element-wise"),
    ("bare", "the module has no parameters"),
])
def test_flops_the_counter_cannot_see_are_refused_in_one_line(design, message):
    with pytest.raises(ValueError, match=message) as caught:
        measure_module(_red_team(design, 2))
    assert "\n" not in str(caught.value)


def test_both_r_are_read_from_the_loss_forward():
    """A coda run after every recurrence in the loss (an exit per loop) and once for the logits is read r times at
    r and 2r at 2r: the loop (issue 63 read it 2 times at r=2 from the loss and once at r=4 from the logits)."""
    counts, roles = measure_module(_red_team("exits", 2))
    assert roles["coda.qkv.weight"] == roles["core.qkv.weight"] == "loop"
    assert all(role == "once" for name, role in roles.items() if name.startswith("prelude."))


def test_a_gate_between_recurrences_read_r_minus_1_times_is_the_loop():
    """Read r - 1 times: one more per recurrence and never outside the loop (issue 63: refused)."""
    for r in (2, 4):
        counts, roles = measure_module(_red_team("skip_last", r))
        assert roles["gate.weight"] == roles["core.qkv.weight"] == "loop"


def test_compute_that_depends_on_the_data_is_refused_in_training_and_not_served_in_evaluation():
    """On the meta device a loop that stops once every token has exited has no values to stop on: in training
    mode it is refused in one line saying what the counter cannot see and what to do; an exit only in evaluation
    mode trains at the full depth (counted), and its serving counts are refused rather than charged the full r."""
    with pytest.raises(ValueError, match=r"forward\(idx(, targets)?\) in training mode reads a tensor's value .*cannot "
                                         r"see compute that depends on the values .*exit early only when not "
                                         r"self\.training") as caught:
        measure_module(_red_team("early_exit", 2))
    assert "\n" not in str(caught.value)
    config = _red_team("eval_exit", 2)
    counts, roles = measure_module(config)
    assert roles["gate.weight"] == "loop" and counts.N_rec == _block(config.width) + config.width + 1
    with pytest.raises(ValueError, match=r"forward\(idx\) in evaluation mode reads a tensor's value .*serving FLOPs "
                                         r"and KV cache depend on the data and are not counted"):
        measure_inference(config, 32)
