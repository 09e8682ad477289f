"""A hyperconnection sweep end to end: spec -> Ray Tune trials -> MLflow -> `loopscale compare` against a baseline.

Simulated trials (the paper's law on the trial's exact accounting), so the pair runs in seconds; the real
training path of hyperconnections is covered by tests/test_hyperconnect.py and tests/test_train.py.
"""

from __future__ import annotations

import pytest
import ray

from loopscale.analysis.cli import main as analysis_main
from loopscale.analysis.store import trial_numbers
from loopscale.model import count_params
from loopscale.search import SweepSpec
from loopscale.search.tune.driver import run_search
from test_search import trial_runs
from test_spec import write_spec

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module", autouse=True)
def ray_session():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    yield
    ray.shutdown()


def test_baseline_and_hyperconnect_sweeps_compare(tmp_path, capsys):
    common = dict(recurrences=[1, 2, 4], budgets=[1e12, 3e12, 1e13, 3e13], trials_per_cell=3,
                  storage=str(tmp_path / "tune"))
    base = SweepSpec.from_toml(write_spec(tmp_path, "base.toml", name="base", **common))
    hyper = SweepSpec.from_toml(write_spec(tmp_path, "hyper.toml", name="hyper", **common,
                                           template={"injection": "hyperconnect", "lanes": 2}))
    assert base.placement.tracking_uri == hyper.placement.tracking_uri
    run_search(base)
    run_search(hyper)
    runs = trial_runs(hyper)
    assert len(runs) == hyper.planned_trials()
    for run in runs:  # the lane weights are in N_rec, exactly as the accounting counts them
        s, r = float(run.data.params["s"]), int(run.data.tags["r"])
        config = hyper.grid.model(s, r)
        assert config.injection == ("hyperconnect" if r > 1 else "none")
        assert trial_numbers(run)["N_rec"] == count_params(config).N_rec
        assert run.data.params["template.lanes"] == "2"
    assert analysis_main(["compare", "base", "hyper", "--tracking-uri", base.placement.tracking_uri,
                          "--n-starts", "40", "--n-bootstrap", "40"]) == 0
    out = capsys.readouterr().out
    assert "Delta-phi (B - A) = " in out and "base: phi = " in out and "hyper: phi = " in out
