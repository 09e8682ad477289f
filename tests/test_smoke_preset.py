"""The smoke preset's numbers mean something: replayed with its law (``loopscale search smoke --objective
simulate``, then ``analyze``), every loss lies below uniform guessing over its vocabulary, log V, and every cell's
IsoFLOP optimum is interior, not at the narrowest width."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pandas as pd
import pytest

from loopscale.search import SweepSpec


def test_the_smoke_preset_has_its_own_vocabulary_and_law(tmp_path):
    spec = SweepSpec.from_toml("smoke", objective="simulate", tracking_uri=f"sqlite:///{tmp_path}/m.db")
    assert spec.grid.template["vocab_size"] == 256  # the KJV bytes its calibration trial reads
    assert spec.simulation.law is not None  # the paper's law puts these tiny models above log V


@pytest.mark.integration
def test_a_smoke_replay_reaches_below_log_vocab_with_interior_optima(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    stores = ["--set", f"storage={tmp_path / 'tune'}", "--set", f"cache_dir={tmp_path / 'cache'}"]
    for argv in (["search", "smoke", "--objective", "simulate", *stores],
                 ["analyze", "--experiment", "smoke", "--n-starts", "40", "--n-bootstrap", "20", "--no-log",
                  "--out", str(tmp_path / "out")]):
        done = subprocess.run([sys.executable, "-m", "loopscale.search.cli", *argv, "--tracking-uri", uri],
                              cwd=tmp_path, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
    import mlflow

    client = mlflow.MlflowClient(uri)
    experiment = client.get_experiment_by_name("smoke")
    runs = client.search_runs([experiment.experiment_id], "tags.`loopscale.kind` = 'trial'")
    losses = [run.data.metrics["val_loss"] for run in runs]
    assert len(losses) >= 12 and max(losses) < math.log(256)
    optima = pd.read_csv(tmp_path / "out" / "tables" / "cell_optima.csv")
    assert len(optima) == 6 and (optima["status"] == "ok").all(), optima[["r", "budget_flops", "reason"]]
    for cell in optima.itertuples():  # interior: the optimum lies inside the widths the cell tried
        assert cell.logN_min < math.log(cell.N_opt) < cell.logN_max
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert 0.3 < summary["joint"]["phi"] < 0.7  # the preset's law has phi = 0.5
