"""GPU readiness, where a CUDA device exists (skipped with the reason elsewhere): the trial's CUDA path is bf16
autocast + torch.compile + fused AdamW + SDPA flash attention, and trains to the loss the CPU fp32 path reaches.
tests/gpu_check.sh runs these with the throughput benchmark and a paper-shaped sweep."""

from __future__ import annotations

import math

import pytest
import torch

from loopscale.model import LoopedConfig, LoopedLM, runtime
from loopscale.objectives import TrialConfig, train
from loopscale.objectives.peak import device_peak_flops, peak_description
from loopscale.objectives.optimizers import build_optimizers
from loopscale.objectives.recipe import group_lrs, normalize_recipe

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (none here)")]

TEMPLATE = dict(depth=6, prelude=1, coda=1, width_unit=64, head_dim=64, seq_len=256, vocab_size=256)


def tiny_trial(tmp_path, device, bf16, compile_):
    return TrialConfig(budget_flops=2e11, r=2, s=2.0, template=TEMPLATE, batch_tokens=8192, seed=0,
                       objective="train", data={"source": "kjv"}, device=device, cache_dir=str(tmp_path),
                       val_tokens=8192, recipe={"optimizer": "muonh", "log_every": 5, "bf16": bf16,
                                                "compile": compile_})


def test_cuda_trial_trains_like_the_cpu_trial(tmp_path):
    gpu = train(tiny_trial(tmp_path, "cuda", True, True))
    cpu = train(tiny_trial(tmp_path, "cpu", False, False))
    assert gpu["status"] == cpu["status"] == "ok" and gpu["steps"] == cpu["steps"] >= 10
    # bf16 autocast changes rounding, not the result: the same loss to about a percent
    assert math.isclose(gpu["val_loss"], cpu["val_loss"], rel_tol=0.02), (gpu["val_loss"], cpu["val_loss"])
    assert 0 < gpu["mfu"] < 1 and gpu["tokens_per_s"] > 0


def test_cuda_runtime_compiles_and_autocasts():
    device = torch.device("cuda")
    model, how = runtime.maybe_compile(torch.nn.Linear(4, 4).to(device), device, True)
    assert how == "compiled"
    with runtime.autocast(device, True):
        assert model(torch.ones(2, 4, device=device)).dtype == torch.bfloat16


def test_adamw_is_fused_on_cuda():
    config = LoopedConfig.iso_depth(2, 2, **TEMPLATE)
    model = LoopedLM(config).cuda()
    recipe = normalize_recipe({"optimizer": "muonh"})
    optimizers = build_optimizers(model, group_lrs(recipe, TEMPLATE, config, 8192 * 10, 8192), recipe)
    adamw = next(o for o in optimizers if isinstance(o, torch.optim.AdamW))
    assert adamw.defaults["fused"] is True


def test_attention_runs_on_the_flash_kernel():
    """Only the flash SDPA backend allowed: the model's bf16 forward must still run (it raises otherwise)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    config = LoopedConfig.iso_depth(2, 2, **{**TEMPLATE, "head_dim": 128, "width_unit": 64})
    model = LoopedLM(config).cuda()
    idx = torch.randint(0, config.vocab_size, (2, config.seq_len + 1), device="cuda")
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]), torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(idx[:, :-1], idx[:, 1:])
    loss.backward()
    assert math.isfinite(loss.item())


def test_the_peak_of_this_device_is_known_or_measured():
    device = torch.device("cuda")
    assert device_peak_flops(device) > 1e13
    assert peak_description(device)
