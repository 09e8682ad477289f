"""The sweep spec: presets, cells, trial configs, and one clear error line (exit 2, nothing written) per mistake.

``write_spec`` builds spec files for the search tests too (they import it from here).
"""

from __future__ import annotations

import math
import socket
import sys
from pathlib import Path
from typing import Any

import pytest

from loopscale.model import count_params, tokens_for_budget
from loopscale.objectives import simulate
from loopscale.search import SweepSpec
from loopscale.search.cli import main
from loopscale.search.plan.flops import total_flops
from loopscale.search.plan.probe import measure_throughput
from loopscale.search.plan.render import render_plan
from loopscale.analysis import numbers
from loopscale.analysis.flops import PAPER_GRID, paper_grid_flops
from loopscale.analysis.store import redact
from loopscale.search.tracking import flatten_params, is_secret_key, redact_text

TINY_TEMPLATE = {"depth": 6, "prelude": 1, "coda": 1, "width_unit": 16, "head_dim": 16, "injection": "linear"}


def base_spec(tmp_path: Path, **overrides: Any) -> dict[str, Any]:
    """A small simulated sweep whose every file lives under tmp_path."""
    spec: dict[str, Any] = {
        "name": "t", "objective": "simulate", "seed": 0, "budgets": [1e12, 1e13], "recurrences": [1, 2],
        "seq_len": 64, "batch_tokens": 512, "trials_per_cell": 3, "sampler": "gp",
        "tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "storage": str(tmp_path / "tune"),
        "cache_dir": str(tmp_path / "cache"),
        "template": dict(TINY_TEMPLATE), "widths": {"s_min": 1, "s_max": 12},
    }
    for key, value in overrides.items():
        if value is None:
            spec.pop(key, None)
        elif isinstance(value, dict) and isinstance(spec.get(key), dict):
            spec[key] = {**spec[key], **value}
        else:
            spec[key] = value
    return spec


def write_spec(tmp_path: Path, filename: str = "spec.toml", **overrides: Any) -> Path:
    path = tmp_path / filename
    path.write_text(to_toml(base_spec(tmp_path, **overrides)))
    return path


def to_toml(spec: dict[str, Any]) -> str:
    """Just enough TOML for specs: scalars and lists at the top, then tables (nested dicts inline)."""
    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        if isinstance(v, dict):
            return "{" + ", ".join(f"{k} = {value(x)}" for k, x in v.items()) + "}"
        return repr(v)

    top = [f"{k} = {value(v)}" for k, v in spec.items() if not isinstance(v, dict)]
    tables = [f"\n[{k}]\n" + "\n".join(f"{kk} = {value(vv)}" for kk, vv in v.items())
              for k, v in spec.items() if isinstance(v, dict)]
    return "\n".join(top) + "\n" + "\n".join(tables) + "\n"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# ---- presets and cells --------------------------------------------------------------------------------------
@pytest.mark.parametrize("preset", ["smoke", "demo"])
def test_presets_load(preset, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = SweepSpec.from_toml(preset)
    assert spec.name == preset and spec.cells()
    assert spec.placement.storage == str(tmp_path / "loopscale-runs" / "tune")
    assert spec.placement.tracking_uri == f"sqlite:///{tmp_path / 'loopscale-runs' / 'mlflow.db'}"
    assert not (tmp_path / "loopscale-runs").exists()  # reading a spec writes nothing


def test_demo_preset_covers_what_the_demo_promises():
    spec = SweepSpec.from_toml("demo")
    assert spec.objective == "train" and len(spec.grid.budgets) >= 3 and set(spec.grid.recurrences) >= {1, 2, 4}
    assert spec.grid.template["vocab_size"] == 256  # byte-level KJV
    # identifiability of the law: budgets over 4.5x from 3e11 (lower budgets sat at the narrowest width near a loss
    # plateau the law cannot follow: search/presets/demo.toml), warmdown branches at every smaller budget
    assert max(spec.grid.budgets) / min(spec.grid.budgets) >= 4.5 and min(spec.grid.budgets) >= 3e11
    assert spec.training.recipe["schedule"] == "wsd"
    assert spec.training.recipe["branch_budgets"] == sorted(spec.grid.budgets)[:-1]


def test_paper_preset_is_the_papers_design():
    spec = SweepSpec.from_toml("paper", objective="simulate")
    # the paper's six budgets, and two cheap ones below them in its spacing (search/presets/paper.toml)
    assert spec.grid.budgets == (1e17, 2.15e17, 4.64e17, 1e18, 2.15e18, 4.64e18, 1e19, 2.15e19)
    assert spec.grid.recurrences == (1, 2, 4, 8) and spec.training.calibrate is None  # simulate: nothing to calibrate
    config = spec.grid.model(10, 4)
    assert (config.width, config.n_prelude, config.n_recur, config.n_coda) == (640, 2, 4, 2)
    assert len(spec.cells()) == 32 and all(c.n_trials <= 6 for c in spec.cells())
    assert spec.sampling.trials_per_cell >= 4  # a cap per cell, and no cell plans more widths than its window has
    assert all(c.n_trials == min(spec.sampling.trials_per_cell, len(c.widths)) for c in spec.cells())
    assert spec.planned_trials() == sum(c.n_trials for c in spec.cells()) == 127  # 1e17, r = 1: 3 widths
    # the cheap cells cost under 1% of what the paper's grid spent, even at the cap of trials in every one
    cheap = sum(c.n_trials * c.budget for c in spec.cells() if c.budget not in PAPER_GRID)
    assert cheap / paper_grid_flops() < 0.01
    # as a training sweep it trains its own BPE of the template's vocabulary: no file anyone must supply
    train = SweepSpec.from_toml("paper")
    assert train.training.data["tokenizer"] == "bpe"
    assert train.training.data["tokenizer_vocab"] == train.grid.template["vocab_size"] == 32064
    # warmdown branches (the paper's script has them) chosen by the law sampler, on the schedule they need
    assert train.sampling.sampler == "law" and train.sampling.branches and train.training.recipe["schedule"] == "wsd"


def test_cells_hold_whole_heads_that_train(tmp_path):
    spec = SweepSpec.from_toml(write_spec(tmp_path, min_steps=20, widths={"tokens_per_param": [1, 100]}))
    assert [c.key for c in spec.cells()] == ["C=1e+12,r=1", "C=1e+12,r=2", "C=1e+13,r=1", "C=1e+13,r=2"]
    for cell in spec.cells():
        assert cell.n_trials == min(3, len(cell.widths)) and cell.first_guess in cell.widths
        for s in cell.widths:
            config = spec.grid.model(s, cell.r)
            tokens = tokens_for_budget(config, cell.budget, spec.grid.batch_tokens)
            assert config.width == 16 * s and tokens // spec.grid.batch_tokens >= 20
            assert 1 <= tokens / count_params(config).N <= 100
        # the first guess is the width whose D / N is nearest 20 tokens per parameter
        tpp = {s: tokens_for_budget(spec.grid.model(s, cell.r), cell.budget, 512)
               / count_params(spec.grid.model(s, cell.r)).N for s in cell.widths}
        assert cell.first_guess == min(tpp, key=lambda s: abs(math.log(tpp[s] / 20)))


def test_trial_configs_feed_the_objectives(tmp_path):
    spec = SweepSpec.from_toml(write_spec(tmp_path, simulate={"noise": 0.0}))
    cell = spec.cells()[0]
    config = spec.trial_config(cell, cell.first_guess)
    result = simulate(config)
    assert result["budget_flops"] == cell.budget and result["r"] == cell.r and result["s"] == cell.first_guess
    assert result["flops_spent"] <= cell.budget and config.template["vocab_size"] == 32064


def test_train_trial_config_carries_data_and_resources(tmp_path):
    spec = SweepSpec.from_toml(write_spec(tmp_path, objective="train", data={"source": "kjv"},
                                          recipe={"base_lr": 0.04}, resources={"cpus": 2}))
    config = spec.trial_config(spec.cells()[0], 2)
    assert config.template["vocab_size"] == 256  # from the byte tokenizer
    assert config.num_threads == 2 and config.device == "cpu"
    assert config.cache_dir == str(tmp_path / "cache") and config.data == {"source": "kjv"}


def test_spec_hash_tracks_the_design_not_the_location(tmp_path):
    a = SweepSpec.from_toml(write_spec(tmp_path))
    moved = SweepSpec.from_toml(write_spec(tmp_path, "b.toml", storage=str(tmp_path / "elsewhere")))
    changed = SweepSpec.from_toml(write_spec(tmp_path, "c.toml", seed=1))
    assert a.spec_hash == moved.spec_hash != changed.spec_hash


def test_a_field_added_since_leaves_earlier_sweeps_hash_alone(tmp_path):
    """A sweep started before ``information`` existed resumes after the upgrade: at its old behaviour (0) the field
    stays out of spec_hash. The literals are the hashes these specs had before the field was added (1b647ab)."""
    plain = SweepSpec.from_toml(write_spec(tmp_path))
    law = SweepSpec.from_toml(write_spec(tmp_path, "law.toml", sampler="law"))
    assert (plain.spec_hash, law.spec_hash) == ("42abded7f929", "c73e08eee687")
    informed = SweepSpec.from_toml(write_spec(tmp_path, "info.toml", sampler="law", information=1))
    assert informed.design()["information"] == 1.0 and informed.spec_hash != law.spec_hash
    branched, deferred = (SweepSpec.from_toml(write_spec(tmp_path, f"d{n}.toml", sampler="law", branches=True,
                                                         deferred_budgets=n)) for n in (1, 2))
    assert "deferred_budgets" not in branched.design() and deferred.design()["deferred_budgets"] == 2
    assert deferred.spec_hash != branched.spec_hash


def test_objective_override_drops_calibration(tmp_path):
    path = write_spec(tmp_path, objective="train", data={"source": "kjv"}, recipe={"base_lr": 0.04},
                      calibrate={"budget": 1e10, "s": 2, "r": 1, "trials": 2, "low": 0.01, "high": 0.1})
    assert SweepSpec.from_toml(path).training.calibrate.trials == 2
    assert SweepSpec.from_toml(path, objective="simulate").training.calibrate is None


def test_a_simulated_replay_is_of_the_design_it_trains(tmp_path):
    """``--objective simulate`` replays the trained design: the model's vocabulary is still the data's (256 bytes,
    not iso_depth's 32,064), so every cell has the same feasible widths and steps, and the plan previews the same
    models."""
    trained, simulated = SweepSpec.from_toml("demo"), SweepSpec.from_toml("demo", objective="simulate")
    assert simulated.grid.template == trained.grid.template and trained.grid.template["vocab_size"] == 256
    assert [(c.key, c.widths) for c in simulated.cells()] == [(c.key, c.widths) for c in trained.cells()]
    config = lambda spec: spec.trial_config(spec.cells()[0], spec.cells()[0].widths[0]).model_config  # noqa: E731
    assert config(simulated) == config(trained)
    path = write_spec(tmp_path, data={"source": "nowhere"})  # read for its vocabulary, so checked
    with pytest.raises(ValueError, match="unknown source 'nowhere'"):
        SweepSpec.from_toml(path)


# ---- one line per mistake -----------------------------------------------------------------------------------
MISTAKES = [
    ({"colour": "red"}, "unknown key 'colour' in top level"),
    ({"template": {"depht": 6}}, r"unknown key 'depht' in \[template\]"),
    ({"recurrences": [1, 3]}, "r=3 does not divide the shared depth 4"),
    ({"budgets": [1e7]}, "buys fewer than min_steps=10 optimizer steps"),
    ({"widths": {"s_min": 1.5}}, "gives width 24, not a multiple of head_dim 16"),
    ({"widths": {"tokens_per_param": [1e6, 1e7]}}, "inside tokens_per_param"),
    ({"tracking_uri": "sqlite:////etc/hostname/mlflow.db"}, "cannot be created"),
    ({"tracking_uri": "file:///tmp/mlruns"}, "use sqlite"),
    ({"budgets": [1e12, 1e12]}, "duplicates"),
    ({"sampler": "cma"}, "sampler must be one of"),
    ({"sampler": "gp", "branches": True}, "branches = true needs sampler"),
    ({"sampler": "law", "branches": "yes"}, "must be true or false"),
    ({"sampler": "gp", "information": 1}, "information = 1 needs sampler"),
    ({"sampler": "law", "information": -1}, "information must be >= 0"),
    ({"sampler": "law", "deferred_budgets": 2}, "deferred_budgets = 2 needs branches = true"),
    ({"sampler": "law", "branches": True, "deferred_budgets": -1}, "deferred_budgets must be >= 0"),
    ({"sampler": "law", "branches": True, "objective": "train", "data": {"source": "kjv"},
      "recipe": {"schedule": "paper"}}, "needs \\[recipe\\] schedule"),
    ({"name": None}, "needs 'name'"),
    ({"trials_per_cell": "five"}, "must be an integer"),
    ({"objective": "train", "data": {"source": "kjv"}, "recipe": {"lr_base": 1}}, "lr_base"),
    ({"objective": "train", "batch_tokens": 500}, "whole number of sequences"),
    ({"objective": "train", "data": {"source": "nowhere"}, "recipe": {}}, "unknown source"),
    ({"objective": "train", "data": {"source": "kjv"}, "recipe": {"schedule": "wsd", "branch_budgets": [3e12]}},
     r"branch_budgets 3e\+12 is not one of budgets \(1e\+12, 1e\+13\)"),
    ({"objective": "train", "data": {"source": "kjv"}, "recipe": {},
      "calibrate": {"budget": 1e12, "s": 2, "low": 0.1, "high": 0.01}}, "low < high"),
    ({"objective": "train", "data": {"source": "kjv"}, "recipe": {},
      "calibrate": {"budget": 1e12, "s": 2, "low": 0.01, "high": 0.1, "param": "speed"}}, "not a recipe key"),
]


@pytest.mark.parametrize("overrides, message", MISTAKES)
def test_each_mistake_is_one_line(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message) as info:
        SweepSpec.from_toml(write_spec(tmp_path, **overrides))
    assert "\n" not in str(info.value) and str(info.value).startswith("spec.toml: ")


def test_unreachable_tracking_server(tmp_path):
    with pytest.raises(ValueError, match="is unreachable"):
        SweepSpec.from_toml(write_spec(tmp_path, tracking_uri=f"http://127.0.0.1:{free_port()}"))


def test_cli_error_exit_2_before_anything_is_written(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    bad = write_spec(tmp_path, recurrences=[1, 3], tracking_uri=None, storage=None, cache_dir=None)
    assert main(["search", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("loopscale: error: spec.toml: r=3 does not divide") and err.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.toml"]  # no loopscale-runs, no mlflow.db
    assert "ray" not in sys.modules or not sys.modules["ray"].is_initialized()
    assert main(["plan", "no-such-spec"]) == 2
    assert "no spec file 'no-such-spec' (presets: smoke, demo, paper)" in capsys.readouterr().err


# ---- plan -----------------------------------------------------------------------------------------------
def test_plan_lists_cells_and_estimates(tmp_path, capsys):
    spec = SweepSpec.from_toml(write_spec(tmp_path))
    text = render_plan(spec, None, widths=True)
    for cell in spec.cells():
        assert f"cell {cell.key}: {cell.n_trials} trials over {len(cell.widths)} widths" in text
    assert f"total: {numbers.flops(total_flops(spec))} FLOPs" in text and "estimated wall time here:" in text
    assert total_flops(spec) == sum(c.n_trials * c.budget for c in spec.cells())
    assert main(["plan", str(write_spec(tmp_path, "p.toml"))]) == 0
    assert "\n  C=1e+13,r=2 " in capsys.readouterr().out  # one line per cell


def test_plan_counts_the_warmdown_branches(tmp_path):
    """A trial of C = 1e13 that branches at 1e12 spends 20% (warmdown_frac) of 1e12 more; a 1e12 one nothing."""
    recipe = {"schedule": "wsd", "branch_budgets": [1e12]}
    spec = SweepSpec.from_toml(write_spec(tmp_path, objective="train", recipe=recipe))
    assert total_flops(spec) == sum(c.n_trials * (c.budget + (0.2e12 if c.budget == 1e13 else 0))
                                    for c in spec.cells())


def test_plan_measures_throughput_of_a_sweep_shape():
    spec = SweepSpec.from_toml("smoke", ['objective="train"', "resources.max_concurrent=1"])  # one copy: here
    throughput = measure_throughput(spec, max_steps=2, min_seconds=0.0)
    assert throughput is not None and throughput.flops_per_s > 1e7 and throughput.device == "cpu"
    assert throughput.step_s >= 0 and " and " in throughput.shape  # timed at the narrowest and widest width


# ---- secrets --------------------------------------------------------------------------------------------
def test_secrets_never_reach_mlflow():
    assert redact("http://alice:s3cret@host:5000") == "http://alice:***@host:5000"
    assert is_secret_key("data.hf_token") and is_secret_key("password") and not is_secret_key("val_tokens")
    params = flatten_params({"data": {"hf_token": "abc", "url": "https://u:pw@h/x"}, "batch_tokens": 4})
    assert params == {"data.hf_token": "***", "data.url": "https://u:***@h/x", "batch_tokens": "4"}
    text = redact_text('tracking_uri = "http://bob:hunter2@mlflow:5000"\napi_key = "k-123"\nval_tokens = 8\n')
    assert "hunter2" not in text and "k-123" not in text and "val_tokens = 8" in text
