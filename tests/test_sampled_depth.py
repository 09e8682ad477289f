"""Sampled-depth training (``[template] depth_sampling = "uniform"``, model/depth.py): the expected FLOPs per token
against the FLOPs of passes counted at every depth, the draws against their pmf, a real trial that runs exactly its
drawn depths and resumes with them, and fixed-depth specs, shapes and trials left as they were."""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from fractions import Fraction

import pytest
import torch

from loopscale.analysis.sizes import SizeCurve
from loopscale.model import LoopedConfig, flops_per_token, tokens_for_budget
from loopscale.model.accounting import flops_at_depth
from loopscale.model.depth import depth_pmf, draw_depth
from loopscale.objectives import TrialConfig, train
from loopscale.search import SweepSpec
from test_accounting import counted_flops, norm_flops
from test_checkpoint import interrupted
from test_spec import write_spec

TINY = dict(depth=6, prelude=1, coda=1, width_unit=16, head_dim=16, vocab_size=64, injection="linear")


def test_expected_flops_are_the_pmf_over_the_flops_counted_at_each_depth():
    """r = 2, gradients through the last 2: a pass of s in 1..3 recurrences counted by torch's FLOP counter (plus
    the norm scales it cannot see) is F(s), and F is the pmf's expectation of those counts, exactly."""
    config = LoopedConfig.iso_depth(2, 2, seq_len=32, bptt_k=2, depth_sampling="uniform", **TINY)
    pmf = depth_pmf(config)
    assert sorted(pmf) == [1, 2, 3] and sum(pmf.values()) == 1
    counted = {s: counted_flops(config, recurrences=s) + norm_flops(config, s) for s in pmf}
    assert all(counted[s] == flops_at_depth(config, s) for s in pmf)
    assert flops_per_token(config) == sum(p * counted[s] for s, p in pmf.items())
    # truncation makes F(s) concave in s: cheaper in expectation than the fixed-depth trial
    assert flops_at_depth(config, 1) < flops_per_token(config) < flops_at_depth(config, 2)
    # the analysis sizes a runs table's models by the same expectation (from_model checks it is a quadratic in
    # width, exactly; the curve evaluates it in floats)
    template = {**TINY, "seq_len": 32, "bptt_k": 2, "depth_sampling": "uniform"}
    curve = SizeCurve.from_model(2, template)
    assert curve.sizes(config.width)["F"] == pytest.approx(float(flops_per_token(config)), rel=1e-12)
    # without truncation F(s) is linear in s, and the mean depth is r: the fixed-depth count, to the FLOP
    full = dataclasses.replace(config, bptt_k=None)
    assert flops_per_token(full) == flops_per_token(dataclasses.replace(full, depth_sampling="fixed"))

    # the draws follow the pmf: each depth's share of 3,000 steps within 4.5 binomial sd of 1/3
    draws = Counter(draw_depth(config, 0, step) for step in range(3000))
    assert set(draws) == set(pmf)
    assert all(abs(draws[s] - 1000) < 4.5 * math.sqrt(3000 * (1 / 3) * (2 / 3)) for s in pmf)
    again = [draw_depth(config, 0, step) for step in range(50)]
    assert again == [draw_depth(config, 0, step) for step in range(50)] != [draw_depth(config, 1, step)
                                                                            for step in range(50)]


def depths_run(passes: list[tuple[bool, int, int]]) -> list[tuple[int, int]]:
    """(s, k) of each training pass among the recorded (grad enabled, blocks run with, without gradients)
    passes of a model with one prelude block, one shared block and one coda block."""
    return [(with_grad - 2 + without, with_grad - 2) for training, with_grad, without in passes if training]


def test_a_sampled_depth_trial_runs_its_drawn_depths_and_resumes_with_them(tmp_path):
    """A real trial (r = 4, k = 2, 14 steps): every training step runs the shared block exactly the drawn s times,
    gradients through min(s, 2); killed after 5 steps and resumed, it draws the same depths and ends bit for bit
    as the trial that never stopped. Its FLOPs are the expectation's; the drawn steps' own lie within sampling
    noise of it."""
    from loopscale.model.looped import Block, LoopedLM

    template = {**TINY, "vocab_size": 256, "seq_len": 64, "bptt_k": 2, "depth_sampling": "uniform"}
    trial = TrialConfig(budget_flops=4e9, s=2.0, r=4, template=template, batch_tokens=512, seed=3,
                        data={"source": "kjv"}, cache_dir=str(tmp_path / "cache"), val_tokens=1024, num_threads=1,
                        recipe={"log_every": 2, "ref_batch": 512})
    config = trial.model_config
    passes: list[tuple[bool, int, int]] = []
    blocks = Counter()

    def count(module, args, output):  # every module's forward, as it ends: blocks before the model they run in
        if isinstance(module, Block):
            blocks[torch.is_grad_enabled()] += 1
        elif isinstance(module, LoopedLM):
            passes.append((torch.is_grad_enabled(), blocks[True], blocks[False]))
            blocks.clear()

    hook = torch.nn.modules.module.register_module_forward_hook(count)
    try:
        whole = train(trial)
        whole_passes = depths_run(passes)
        passes.clear()
        resumed, _, resumed_from = interrupted(trial, tmp_path, kill_after=5)
    finally:
        hook.remove()
    steps = whole["steps"]
    drawn = [draw_depth(config, trial.seed, step) for step in range(steps)]
    assert steps == tokens_for_budget(config, 4e9, 512) // 512 == 14 and len(set(drawn)) > 3
    assert whole_passes == [(s, min(s, 2)) for s in drawn]
    assert resumed_from == 5 and depths_run(passes) == [(s, min(s, 2)) for s in drawn]  # steps 0-4, then 5-13
    assert resumed["val_loss"] == whole["val_loss"] and resumed["status"] == "ok"

    expected = flops_per_token(config)
    assert isinstance(expected, Fraction) and whole["flops_per_token"] == float(expected)
    assert whole["flops_spent"] == pytest.approx(float(expected) * steps * 512, rel=1e-15)
    pmf = depth_pmf(config)
    sd = math.sqrt(sum(p * (flops_at_depth(config, s) - expected) ** 2 for s, p in pmf.items()) / steps)
    ran = Fraction(sum(flops_at_depth(config, s) for s in drawn), steps)
    assert abs(ran - expected) < 4 * sd


def test_fixed_depth_keeps_its_hash_shape_and_trials_and_sampling_is_checked(tmp_path):
    plain = SweepSpec.from_toml(write_spec(tmp_path))
    fixed = SweepSpec.from_toml(write_spec(tmp_path, "fixed.toml", template={"depth_sampling": "fixed"}))
    sampled = SweepSpec.from_toml(write_spec(tmp_path, "sampled.toml", template={"depth_sampling": "uniform"}))
    assert fixed.spec_hash == plain.spec_hash != sampled.spec_hash
    cell_1, cell_2 = (next(c for c in sampled.cells() if c.r == r) for r in (1, 2))
    assert fixed.trial_config(cell_2, 2.0) == plain.trial_config(cell_2, 2.0)
    assert "depth_sampling" not in plain.trial_config(cell_2, 2.0).to_params()["template"]
    assert sampled.trial_config(cell_2, 2.0).model_config.depth_sampling == "uniform"
    assert sampled.trial_config(cell_1, 2.0).model_config.depth_sampling == "fixed"  # r = 1 has no loop to sample
    # the keys a fixed-depth shape is cached by (model/measured.py) are those it had before sampled depth existed
    assert list(sampled.grid.model(2.0, 1).to_dict()) == [
        "width", "r", "n_prelude", "n_recur", "n_coda", "head_dim", "vocab_size", "seq_len", "injection", "bptt_k",
        "lanes", "mlp_ratio", "rope_theta", "norm_eps", "logit_softcap", "architecture", "options"]
    for template, message in (({"depth_sampling": "poisson"}, "depth_sampling must be one of fixed, uniform, got "
                                                                "'poisson'"),
                              ({"depth_sampling": "uniform", "injection": "hyperconnect"},
                               r"depth_sampling 'uniform' needs the built-in looped model \(r > 1\) without "
                               "hyperconnections")):
        with pytest.raises(ValueError, match=f"^bad.toml: {message}"):
            SweepSpec.from_toml(write_spec(tmp_path, "bad.toml", template=template))
