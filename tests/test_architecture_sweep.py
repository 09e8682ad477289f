"""A spec's own architecture end to end: a tiny ``loopscale search`` with ``objective = "train"`` on a model
defined in a file next to the spec runs through real Ray Tune and MLflow, every run carries the measured
N_once, N_rec and FLOPs per token of its width, ``loopscale analyze`` fits it and ``loopscale compare`` sets it
against the built-in on the same shapes. Ray receives the file through
its runtime environment (``py_modules``): a Ray task imports it by name from there, with no file system shared.
"""

from __future__ import annotations

import importlib
import shutil
from pathlib import Path

import pytest
import ray
from mlflow.tracking import MlflowClient

from loopscale.analysis.store import trial_numbers
from loopscale.model import account
from loopscale.search import SweepSpec
from loopscale.search.cli import main
from loopscale.search.tune.cluster import runtime_env
from test_analysis_cli import FAST
from test_spec import write_spec

pytestmark = pytest.mark.integration
FIXTURE = Path(__file__).parent / "fixtures" / "tiny_loop.py"


def _spec(tmp_path: Path, **overrides) -> Path:
    shutil.copy(FIXTURE, tmp_path / "tiny_loop.py")
    return write_spec(tmp_path, template={"architecture": "tiny_loop.py:tiny_loop", "options": {"adapters": 2}},
                      **overrides)


@pytest.mark.slow
def test_a_train_sweep_of_an_architecture_in_a_file_runs_and_analyzes(tmp_path, capsys):
    shapes = dict(objective="train", budgets=[2e9, 4e9, 8e9], recurrences=[1, 2], trials_per_cell=2, sampler="grid",
                  val_tokens=2048, data={"source": "kjv"}, recipe={"log_every": 2}, widths={"s_min": 1, "s_max": 3})
    path = _spec(tmp_path, **shapes)
    spec = SweepSpec.from_toml(path)
    assert main(["search", str(path)]) == 0
    client = MlflowClient(spec.placement.tracking_uri)
    experiment = client.get_experiment_by_name(spec.name)
    runs = client.search_runs([experiment.experiment_id], "tags.`loopscale.kind` = 'trial'")
    assert len(runs) == spec.planned_trials() >= 10
    for run in runs:
        assert run.data.tags["status"] == "ok", run.data.tags.get("reason")
        numbers = trial_numbers(run)
        r, s = int(numbers["r"]), float(numbers["s"])
        counts = account(spec.grid.model(s, r))
        assert run.data.params["template.architecture"].endswith("tiny_loop.py:tiny_loop")
        assert numbers["N_once"] == counts.N_once and numbers["N_rec"] == counts.N_rec
        assert numbers["flops_per_token"] == counts.flops_per_token
        assert counts.N_rec > 0  # at r = 1 too: the layers the loop shares, as the closed form files them
    out = tmp_path / "analysis"
    assert main(["analyze", "--experiment", spec.name, "--tracking-uri", spec.placement.tracking_uri, "--out", str(out),
                 *FAST]) == 0
    assert (out / "tables" / "excluded_runs.csv").exists()
    capsys.readouterr()
    # export sizes models of the architecture, rebuilt from its runs' params with its options
    assert main(["export", "--experiment", spec.name, "--tracking-uri", spec.placement.tracking_uri, "--budgets", "8e9",
                 "--r", "2", *FAST]) == 0
    rows = capsys.readouterr().out.strip().splitlines()
    assert rows[0].startswith("budget (FLOPs),r,width") and rows[1].startswith("8000000000.0,2,")

    # the built-in on the same shapes, then Delta-phi between the two
    builtin = write_spec(tmp_path, "builtin.toml", name="builtin", **shapes)
    assert main(["search", str(builtin)]) == 0
    assert main(["compare", "builtin", spec.name, "--tracking-uri", spec.placement.tracking_uri, *FAST]) == 0
    printed = capsys.readouterr().out
    assert "Delta-phi (B - A) = " in printed and f"{spec.name}: phi = " in printed and "builtin: phi = " in printed


def test_ray_ships_the_architecture_file_to_its_workers(tmp_path):
    spec = SweepSpec.from_toml(_spec(tmp_path))
    env = runtime_env(spec)
    assert env == {"py_modules": [str(tmp_path / "tiny_loop.py")]}
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, logging_level="ERROR", runtime_env=env)
    try:
        @ray.remote
        def on_a_worker() -> tuple[str, str]:
            from loopscale.model import architecture

            shipped = importlib.import_module("tiny_loop").__file__  # from Ray's copy, not tmp_path
            # a path this worker lacks (another machine's): the factory is imported by its stem instead
            factory = architecture.factory(f"/elsewhere/{tmp_path.name}/tiny_loop.py:tiny_loop")
            return shipped, factory.__module__

        shipped, module = ray.get(on_a_worker.remote())
    finally:
        ray.shutdown()
    assert not shipped.startswith(str(tmp_path)) and Path(shipped).name == "tiny_loop.py" and module == "tiny_loop"
    assert runtime_env(SweepSpec.from_toml(write_spec(tmp_path, filename="plain.toml"))) is None
