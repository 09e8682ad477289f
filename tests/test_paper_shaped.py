"""The paper's sweep, shrunk, end to end through the CLI in CI: the ``paper`` preset with its template's shape
(effective depth 20 = 2 + 16 + 2), its recipe (MuonH, the learning-rate transfer rules, the paper schedule, a
calibration stage), a byte-level BPE trained on the data, and the ``hub`` source streaming a dataset repository
laid out as on the hub, with widths, sequences, budgets and the vocabulary cut to CPU size; then analysed.

Tiny, but every stage a cluster run goes through: plan, BPE training inside ``search``, hub streaming, packing,
calibration, the search over (C, r) cells, MLflow, ``analyze``. About a minute on 2 cores (Ray's start included).
"""

from __future__ import annotations

import json
import os
import tomllib

import pytest
from mlflow.tracking import MlflowClient

from loopscale.objectives.data.sources import kjv_chapters
from loopscale.search import SweepSpec
from loopscale.search.cli import main
from loopscale.search.spec import resolve_spec_path
from test_hub import write_hub_repo
from test_spec import to_toml

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def shrunk_paper_spec(tmp_path, hub_repo):
    """The paper preset with its sizes cut: the design and the recipe stay, the scale goes."""
    spec = tomllib.loads(resolve_spec_path("paper").read_text())
    spec.update(name="paper-tiny", budgets=[1.2e10, 2e10], recurrences=[1, 4], seq_len=64, batch_tokens=512,
                val_tokens=4096, trials_per_cell=2, sampler="grid", branches=False, information=0, min_steps=8,
                # (branches and information: the law sampler's)
                tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}", storage=str(tmp_path / "tune"),
                cache_dir=str(tmp_path / "cache"))
    spec["template"].update(width_unit=16, head_dim=16, vocab_size=512)  # depth, prelude, coda: the paper's
    spec["widths"] = {"s_min": 1, "s_max": 4}
    spec["data"] = {"source": "hub", "name": str(hub_repo), "config": "sample-en", "split": "train",
                    "shuffle_buffer": 100, "tokenizer": "bpe", "tokenizer_train_chars": 400_000}
    spec["recipe"]["ref_batch"] = 512  # rates quoted at this batch, as the demo does (objectives/lr_rules.py)
    spec["calibrate"].update(budget=1.2e10, s=2, trials=2)
    spec["resources"] = {"cpus": 1, "retries": 0}
    spec.pop("validate")  # its rung is sized for the paper's budgets (tests/test_validate.py trains rungs)
    path = tmp_path / "paper-tiny.toml"
    path.write_text(to_toml(spec))
    return path


def test_a_paper_shaped_sweep_runs_end_to_end_and_is_analysed(tmp_path, monkeypatch, capsys):
    import datasets

    monkeypatch.setattr(datasets.config, "SLEEP_TIME_ON_THREADS_SHUTDOWN", 0.2)  # see test_hub.py
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # everything is local: the hub repository is a directory here
    repo = write_hub_repo(tmp_path / "hub", kjv_chapters())
    path = shrunk_paper_spec(tmp_path, repo)
    spec = SweepSpec.from_toml(path)
    assert spec.training.recipe["optimizer"] == "muonh" and spec.training.calibrate is not None
    assert spec.training.data["tokenizer_vocab"] == 512 and spec.grid.model(2, 4).n_recur == 4

    assert main(["plan", str(path)]) == 0
    assert main(["search", str(path)]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "calibrated base_lr" in out and "complete" in out
    # search trained the BPE itself, beside the packed data
    assert any(f.startswith("bpe-512-") for f in os.listdir(tmp_path / "cache" / "tokenizers"))

    client = MlflowClient(spec.placement.tracking_uri)
    experiment = client.get_experiment_by_name(spec.name)
    trials = client.search_runs([experiment.experiment_id], "tags.`loopscale.kind` = 'trial'")
    assert len(trials) == spec.planned_trials() == 2 + 2 * 2 * 2
    assert all(r.data.tags["status"] == "ok" for r in trials), [r.data.tags.get("reason") for r in trials]
    (sweep,) = client.search_runs([experiment.experiment_id], "tags.`loopscale.kind` = 'sweep'")
    assert sweep.data.tags["data_fingerprint"].startswith("hub-T64-")

    out_dir = tmp_path / "analysis"
    assert main(["analyze", "--experiment", spec.name, "--tracking-uri", spec.placement.tracking_uri, "--out",
                 str(out_dir),
                 "--n-starts", "50", "--n-bootstrap", "20"]) == 0, capsys.readouterr().err
    summary = json.loads((out_dir / "summary.json").read_text())
    assert (summary["runs_total"], summary["runs_used"]) == (10, 8)  # the fit uses the search stage's trials
    assert summary["runs_fitted"] >= 4 and summary["joint"]["status"]  # fitted, with whatever status it earned
    analyses = client.search_runs([experiment.experiment_id], "tags.`loopscale.kind` = 'analysis'")
    assert len(analyses) == 1
