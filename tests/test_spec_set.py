"""``--set key=value``: quick grid changes on the command line, validated like the file, and the effective spec
is the one hashed and logged."""

from __future__ import annotations

import subprocess
import sys
import tomllib

import pytest
from mlflow.tracking import MlflowClient

from loopscale.search import SweepSpec
from loopscale.search.cli import main
from loopscale.search.overrides import apply_sets, parse_set
from test_spec import write_spec


@pytest.mark.parametrize("item, parsed", [
    ("trials_per_cell=4", (("trials_per_cell",), 4)),
    ("widths.s_max=8", (("widths", "s_max"), 8)),
    ("budgets=[1e12, 3e12]", (("budgets",), [1e12, 3e12])),
    ("sampler=tpe", (("sampler",), "tpe")),
    ('sampler="tpe"', (("sampler",), "tpe")),
    ("widths.tokens_per_param=[5, 80]", (("widths", "tokens_per_param"), [5, 80])),
])
def test_values_are_toml(item, parsed):
    assert parse_set(item) == parsed


def test_a_set_spec_is_the_edited_file(tmp_path):
    """--set gives the spec (and the hash) the edited file gives, and says so at the top of its text."""
    plain = write_spec(tmp_path)
    edited = write_spec(tmp_path, "edited.toml", trials_per_cell=2, widths={"s_max": 8})
    sets = ["trials_per_cell=2", "widths.s_max=8"]
    spec = SweepSpec.from_toml(plain, sets)
    assert (spec.sampling.trials_per_cell, spec.grid.s_max) == (2, 8.0)
    assert spec.spec_hash == SweepSpec.from_toml(edited).spec_hash != SweepSpec.from_toml(plain).spec_hash
    assert spec.text.startswith("# effective spec") and "# --set widths.s_max=8\n" in spec.text
    assert tomllib.loads(spec.text) == tomllib.loads(edited.read_text())  # the logged text is the effective spec
    assert SweepSpec.from_toml(plain).text == plain.read_text()  # without --set: the file as written


@pytest.mark.parametrize("preset", ["smoke", "demo", "paper"])
def test_every_preset_round_trips_through_the_logged_toml(preset):
    spec = SweepSpec.from_toml(preset, ["seed=1"])
    raw = tomllib.loads(spec.text)
    assert raw["seed"] == 1 and SweepSpec.from_dict(raw).spec_hash == spec.spec_hash


def test_later_sets_win_and_tables_are_not_shared(tmp_path):
    raw = {"widths": {"s_min": 1, "s_max": 12}}
    assert apply_sets(raw, ["widths.s_max=8", "widths.s_max=10"]) == {"widths": {"s_min": 1, "s_max": 10}}
    assert raw == {"widths": {"s_min": 1, "s_max": 12}}


@pytest.mark.parametrize("item, message", [
    ("widths.s_mx=8", "unknown key 's_mx' in [widths] (did you mean 's_max'?)"),
    ("trials_per_cell=0", "trials_per_cell"),
    ("budgets=[1e12", "is not a TOML value"),
    ("name.x=1", "name is a value, not a table"),
    ("=3", "expected key=value"),
    ("seed", "expected key=value"),
])
def test_bad_sets_exit_2_in_one_line_before_anything_is_written(tmp_path, capsys, item, message):
    spec = write_spec(tmp_path)
    assert main(["search", str(spec), "--set", item]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "tune").exists()


@pytest.mark.integration
@pytest.mark.slow
def test_a_sweep_logs_its_effective_spec(tmp_path):
    spec_file = write_spec(tmp_path, recurrences=[1], budgets=[1e12])
    sets = ["trials_per_cell=2", "widths.s_max=6"]
    done = subprocess.run([sys.executable, "-m", "loopscale.search.cli", "search", str(spec_file),
                           *[a for s in sets for a in ("--set", s)]], cwd=tmp_path, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    spec = SweepSpec.from_toml(spec_file, sets)
    client = MlflowClient(spec.placement.tracking_uri)
    experiment = client.get_experiment_by_name("t")
    (parent,) = client.search_runs([experiment.experiment_id], "tags.`loopscale.kind` = 'sweep'")
    assert parent.data.tags["spec_hash"] == spec.spec_hash
    assert parent.data.params["trials_per_cell"] == "2"
    logged = client.download_artifacts(parent.info.run_id, "spec.toml", str(tmp_path))
    assert open(logged).read() == spec.text
    trials = client.search_runs([experiment.experiment_id], "tags.`loopscale.kind` = 'trial'")
    assert len(trials) == 2 and all(float(t.data.params["s"]) <= 6 for t in trials)
