"""Validation rungs (``loopscale validate``, ``[validate] budgets``): the prediction interval of one run, the
verdicts, bad rung budgets refused before anything starts, and rungs trained once each through a kill, a
resume and a second driver, logged under stage ``validate`` and compared by ``analyze``.

The sweeps are the smallest real ones: simulated trials (objectives/simulation.py) through real Ray Tune,
Optuna and an MLflow sqlite store."""

from __future__ import annotations

import os
import queue
import shutil
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from loopscale.analysis import FitOptions, analyze, fit_joint_law, load_runs
from loopscale.analysis import validation
from loopscale.analysis.store import trial_numbers
from loopscale.model import PAPER_LAW
from loopscale.search import SweepSpec
from loopscale.search.cli import main
from loopscale.search.validate import ran_spec
from test_kill_resume import Driver, journal, ray_dir  # noqa: F401 (a fixture)
from test_spec import base_spec, to_toml

FAST = FitOptions(n_starts=50, n_bootstrap=40)
TINY_LOOP = Path(__file__).parent / "fixtures" / "tiny_loop.py"


# ---- the prediction interval of one run (no Ray) -------------------------------------------------------------
def law_runs(noise: float, seed: int = 0) -> pd.DataFrame:
    """Runs of the paper's law at 3 budgets x r in {1, 2} x 4 widths, with Gaussian noise of ``noise`` nats."""
    rng = np.random.default_rng(seed)
    rows = []
    for budget in (1e18, 3e18, 1e19):
        for r in (1, 2):
            for n_once in (2e7, 4e7, 8e7, 1.6e8):
                n_rec, tokens = n_once / 2, budget / (6 * (n_once + r * n_once / 2))
                loss = PAPER_LAW.loss(n_once, n_rec, r, tokens) + rng.normal(0, noise)
                rows.append({"r": r, "budget_flops": budget, "N_once": n_once, "N_rec": n_rec, "tokens": tokens,
                             "val_loss": float(loss), "stage": "search", "status": "ok"})
    return pd.DataFrame(rows)


def rung(r: int, budget: float = 3e19, n_once: float = 1.2e8) -> dict:
    n_rec = n_once / 2
    return {"budget_flops": budget, "r": r, "width": 512, "N_once": n_once, "N_rec": n_rec,
            "tokens": budget / (6 * (n_once + r * n_rec))}


def test_the_interval_of_one_run_holds_the_noise_the_sweep_measured():
    quiet, noisy = law_runs(0.002), law_runs(0.05)
    rungs = pd.DataFrame([rung(1), rung(2)])
    widths = {}
    for name, runs in (("quiet", quiet), ("noisy", noisy)):
        fit = fit_joint_law(runs, options=FAST)
        residuals = validation.noise_residuals(fit, runs, FAST)
        assert residuals.size == len(runs)
        table = validation.predictions(fit, rungs, residuals)
        mean = validation._mean_draws(fit, rungs)
        tail = 100 * (1 - fit.confidence) / 2
        mean_lo, mean_hi = np.percentile(mean, [tail, 100 - tail], axis=0)
        # one run's interval holds the interval of the mean, and more: its noise
        assert (table["predicted_lo"] < mean_lo).all() and (table["predicted_hi"] > mean_hi).all()
        assert (table["predicted_lo"] < table["predicted"]).all() and (table["predicted"] < table["predicted_hi"]).all()
        widths[name] = float((table["predicted_hi"] - table["predicted_lo"]).iloc[0])
        gap = table.iloc[1]
        assert gap["gap_lo"] < gap["gap_predicted"] < gap["gap_hi"]
        assert np.isclose(gap["gap_predicted"], table["predicted"].iloc[1] - table["predicted"].iloc[0])
        assert np.isnan(table["gap_predicted"].iloc[0])  # r = 1 has no gap to itself
    # noise of 0.05 nats per run: a 95% interval at least +-1.96 x 0.05 wide (less the fit's own residual shrink)
    assert widths["noisy"] > 3 * 0.05 > widths["quiet"]


def test_a_miss_is_reported_as_a_miss_with_what_it_may_mean():
    runs = law_runs(0.01)
    fit = fit_joint_law(runs, options=FAST)
    predicted = validation.predictions(fit, pd.DataFrame([rung(1), rung(2)]),
                                       validation.noise_residuals(fit, runs, FAST))
    inside, above = predicted["predicted"].iloc[0], predicted["predicted_hi"].iloc[1] + 0.1
    achieved = pd.DataFrame({"budget_flops": [3e19, 3e19], "r": [1, 2], "val_loss": [inside, above]})
    table = validation.verdicts(predicted, achieved, fitted_top=1e19)
    assert list(table["verdict"]) == ["hit", "miss"]
    assert table["note"].iloc[0] == ""
    assert "worse than predicted" in table["note"].iloc[1] and "misspecified" in table["note"].iloc[1]
    assert "learning rate" in table["note"].iloc[1] and "3x the largest fitted budget" in table["note"].iloc[1]
    assert np.isclose(table["gap_achieved"].iloc[1], above - inside)
    text = "\n".join(validation.lines(table))
    assert "1 hit, 1 miss of 2" in text and "predicted" in text and "achieved" in text
    assert all(len(line) <= 120 for line in text.splitlines())
    below = validation.verdicts(predicted, achieved.assign(val_loss=[inside, inside - 1.0]), fitted_top=1e19)
    assert below["verdict"].iloc[1] == "miss" and "better than predicted" in below["note"].iloc[1]
    wide_gap = inside + predicted["gap_hi"].iloc[1] + 0.05  # the gap to r = 1 misses, whatever the loss does
    gapped = validation.verdicts(predicted, achieved.assign(val_loss=[inside, wide_gap]), fitted_top=1e19)
    assert gapped["gap_verdict"].iloc[1] == "miss" and "gap to r=1 lies outside" in gapped["note"].iloc[1]
    untrained = validation.verdicts(predicted, achieved.iloc[:1], fitted_top=1e19)
    assert untrained["verdict"].iloc[1] == "not trained"


def test_analyze_compares_the_rungs_not_their_branch_points():
    runs = law_runs(0.01)
    own = {**rung(1), "val_loss": 2.5, "stage": "validate", "status": "ok", "branch_of": "", "run_id": "a"}
    branch = {**rung(1, budget=2e19), "val_loss": 2.6, "stage": "validate", "status": "ok", "branch_of": "a",
              "run_id": "a/branch0"}
    table = pd.concat([runs.assign(branch_of="", run_id=[f"s{i}" for i in range(len(runs))]),
                       pd.DataFrame([own, branch])], ignore_index=True)
    fit = fit_joint_law(table, options=FAST)
    compared = validation.compare(fit, table, FAST)
    assert list(compared["budget_flops"]) == [3e19] and list(compared["achieved"]) == [2.5]
    assert validation.compare(fit, table, FitOptions(n_starts=50, n_bootstrap=40, stage=None)).empty


# ---- real sweeps -------------------------------------------------------------------------------------------------
def write_sweep(folder: Path, **overrides) -> SweepSpec:
    folder.mkdir(parents=True, exist_ok=True)
    spec = base_spec(folder, budgets=[1e12, 3e12, 1e13], recurrences=[1, 2], trials_per_cell=3, **overrides)
    (folder / "spec.toml").write_text(to_toml(spec))
    return SweepSpec.from_toml(folder / "spec.toml")


def rung_runs(spec: SweepSpec) -> list:
    client = MlflowClient(spec.placement.tracking_uri)
    experiment = client.get_experiment_by_name(spec.name)
    query = "tags.`loopscale.kind` = 'trial' and tags.stage = 'validate'"
    return client.search_runs([experiment.experiment_id], query)


@pytest.fixture(scope="module")
def sweep_with_rungs(tmp_path_factory):
    """A finished sweep whose spec ends with a rung at 3e13 FLOPs per r (``[validate] budgets``)."""
    spec = write_sweep(tmp_path_factory.mktemp("rungs"), validate={"budgets": [3e13]})
    assert main(["search", spec.source]) == 0
    return spec


@pytest.mark.integration
def test_a_sweep_ends_with_its_rungs_and_analyze_compares_them(sweep_with_rungs, capsys, tmp_path):
    spec = sweep_with_rungs
    runs = rung_runs(spec)
    assert sorted(int(r.data.tags["r"]) for r in runs) == [1, 2]
    for run in runs:
        assert run.info.status == "FINISHED" and run.info.run_name.startswith("validate C=3e+13")
        assert float(run.data.tags["budget"]) == 3e13 and run.data.tags["validation"] in ("hit", "miss")
        predicted = trial_numbers(run)
        assert predicted["predicted_lo"] <= predicted["predicted"] <= predicted["predicted_hi"]
    # `loopscale validate` of the same rungs trains nothing more: it prints the comparison
    capsys.readouterr()
    uri = spec.placement.tracking_uri
    assert main(["validate", spec.name, "--budget", "3e13", "--tracking-uri", uri]) == 0
    out = capsys.readouterr().out
    assert "trained already" in out and "predicted" in out and "achieved" in out
    assert len(rung_runs(spec)) == 2
    # analyze leaves them out of the fit and compares them with its law
    table = load_runs(spec.name, uri)
    result = analyze(table, name=spec.name, options=FAST)
    assert (result.used["stage"] == "search").all()
    compared = result.validation
    assert sorted(compared["r"]) == [1, 2] and set(compared["verdict"]) <= {"hit", "miss"}
    achieved = {int(r.data.tags["r"]): r.data.metrics["val_loss"] for r in runs}
    assert dict(zip(compared["r"], compared["achieved"])) == achieved
    assert "validation rungs:" in result.summary_text()
    assert "validation" in result.tables and "validation" in result.figures()
    metrics = result.mlflow_record()[0]
    assert metrics["validate_rungs"] == 2 and "validate_r2_C3.000e13_gap_achieved" in metrics


def validate(spec: SweepSpec, *argv: str) -> int:
    """``loopscale validate`` of ``spec``'s sweep in this process; its exit code (argparse's too)."""
    try:
        return main(["validate", spec.name, *argv, "--tracking-uri", spec.placement.tracking_uri])
    except SystemExit as exc:  # argparse refused an argument
        return exc.code


@pytest.mark.integration
@pytest.mark.parametrize("argv, message", [
    (["--budget", "1e13"], "not above the sweep's largest budget"),
    (["--budget", "5e12,3e13"], "not above the sweep's largest budget"),
    (["--budget", "3e13", "--r", "3"], "is not a recurrence of sweep"),
    (["--budget", "4e13"], "already has its rungs"),
    (["--budget", "-1"], "expected positive numbers"),
    (["--budget", "inf"], "--budget inf is not a FLOP count"),
    (["--budget", "3e13", "--r", "1,1"], "--r lists 1 twice"),
    (["--budget", "3e13,3e13"], "--budget lists 3e+13 twice"),
])
def test_bad_rungs_are_one_line_and_start_nothing(sweep_with_rungs, capsys, argv, message):
    spec = sweep_with_rungs
    folder = Path(spec.placement.storage) / spec.name
    before = {p: p.stat().st_mtime_ns for p in folder.rglob("*")}
    capsys.readouterr()
    assert validate(spec, *argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert message in err[-1] and err[-1].startswith(("loopscale: error:", "loopscale validate: error:"))
    assert len(err) == 1 or err[0].startswith("usage:"), err  # argparse's usage line, then its one error line
    assert {p: p.stat().st_mtime_ns for p in folder.rglob("*")} == before  # nothing written, no stage started
    assert len(rung_runs(spec)) == 2


def test_a_rung_budget_below_the_sweep_in_the_spec_is_refused(tmp_path):
    with pytest.raises(ValueError, match="not above the sweep's largest budget 1e\\+13"):
        write_sweep(tmp_path, validate={"budgets": [1e13]})
    with pytest.raises(ValueError, match="unknown"):
        write_sweep(tmp_path, validate={"budget": [3e13]})


@pytest.mark.integration
def test_an_unfinished_or_unknown_sweep_is_refused(tmp_path, capsys):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert main(["validate", "nothing", "--budget", "1e14", "--tracking-uri", uri]) == 2
    assert "no sweep 'nothing'" in capsys.readouterr().err
    assert not (tmp_path / "mlflow.db").exists()


@pytest.fixture(scope="module")
def sweep_run_elsewhere(tmp_path_factory):
    """A finished sweep (its rung at 3e13 FLOPs per r included) whose spec, in ``ran/specs``, names its Tune
    storage and cache relative to the folder its search ran in (``ran``) and its architecture file relative to
    its own folder, as the docs have it (docs/spec.md)."""
    root = tmp_path_factory.mktemp("elsewhere")
    specs = root / "ran" / "specs"
    specs.mkdir(parents=True)
    shutil.copy(TINY_LOOP, specs / "tiny_loop.py")
    raw = base_spec(root, budgets=[1e12, 3e12, 1e13], recurrences=[1, 2], trials_per_cell=3, storage="tune",
                    cache_dir="cache", template={"architecture": "tiny_loop.py:tiny_loop"},
                    validate={"budgets": [3e13]})
    (specs / "spec.toml").write_text(to_toml(raw))
    here = Path.cwd()
    os.chdir(root / "ran")
    try:
        assert main(["search", "specs/spec.toml"]) == 0
        spec = SweepSpec.from_toml("specs/spec.toml")
    finally:
        os.chdir(here)
    return spec, root


@pytest.mark.integration
def test_validate_from_another_folder_finds_the_sweep_where_it_ran(sweep_run_elsewhere, tmp_path, monkeypatch,
                                                                   capsys):
    spec, root = sweep_run_elsewhere
    assert spec.placement.storage == str(root / "ran" / "tune")
    monkeypatch.chdir(tmp_path)  # neither the spec's folder nor the search's
    capsys.readouterr()
    assert validate(spec, "--budget", "3e13") == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "trained already" in out and "validation rungs: " in out
    assert not (tmp_path / "tune").exists()


@pytest.mark.integration
def test_the_spec_read_back_resolves_its_paths_where_its_sweep_did(sweep_run_elsewhere, tmp_path, monkeypatch):
    spec, root = sweep_run_elsewhere
    decoy = tmp_path / "tiny_loop.py"  # what resolving against the working folder would pick up
    decoy.write_text(TINY_LOOP.read_text() + "\n# another file of the same name\n")
    monkeypatch.chdir(tmp_path)
    read = ran_spec(spec.name, spec.placement.tracking_uri)
    assert read.grid.template["architecture"] == f"{root / 'ran' / 'specs' / 'tiny_loop.py'}:tiny_loop"
    assert (read.placement.storage, read.placement.cache_dir) == (spec.placement.storage, spec.placement.cache_dir)
    assert read.spec_hash == spec.spec_hash


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.usefixtures("testing_aids")
def test_rungs_train_once_each_through_a_kill_a_resume_and_a_second_driver(tmp_path, ray_dir):  # noqa: F811
    hold = tmp_path / "hold"
    spec = write_sweep(tmp_path / "sweep", testing={"delay_s": 0.3, "journal": str(tmp_path / "journal.jsonl"),
                                                    "hold": str(hold)}, resources={"max_concurrent": 1})
    assert main(["search", spec.source]) == 0
    command = ["validate", spec.name, "--budget", "2e13,3e13", "--tracking-uri", spec.placement.tracking_uri]

    hold.touch()  # the rungs wait while it exists
    first = Validator(command, tmp_path, ray_dir)
    assert first.wait_for("validation: 4 rungs", 1), "".join(first.output)
    # a second driver while the first runs: refused in one line, exit 2, nothing trained
    second = subprocess.run([sys.executable, "-m", "loopscale.search.cli", *command], cwd=tmp_path,
                            capture_output=True, text=True, timeout=120, env={**os.environ, "RAY_TMPDIR": ray_dir})
    assert second.returncode == 2 and "already being run by" in second.stderr, second.stderr[-2000:]
    assert len(second.stderr.strip().splitlines()) == 1, second.stderr
    hold.unlink()
    assert first.wait_for("[validate ", 1), "".join(first.output)
    first.kill(ray_dir)
    finished = {r.data.tags["trial_key"] for r in rung_runs(spec) if r.info.status == "FINISHED"}
    assert finished, "no rung had finished at the kill"
    at_kill = len(journal(spec))

    resumed = Validator(command, tmp_path, ray_dir)
    assert not resumed.wait_for("never printed", 1, timeout_s=300)
    assert resumed.process.wait(timeout=30) == 0, "".join(resumed.output)
    assert any(line.startswith("validation rungs: ") for line in resumed.output), "".join(resumed.output)

    runs = rung_runs(spec)
    keys = sorted(r.data.tags["trial_key"] for r in runs)
    assert keys == sorted(f"validate/C={c:.3g},r={r}/1" for c in (2e13, 3e13) for r in (1, 2))
    assert all(r.info.status == "FINISHED" and r.data.tags["status"] == "ok" for r in runs)
    entries = [e for e in journal(spec) if e["budget_flops"] > 1e13]
    ended = Counter((e["budget_flops"], e["r"]) for e in entries if e["event"] == "end")
    assert sorted(ended) == sorted((c, r) for c in (2e13, 3e13) for r in (1, 2)) and set(ended.values()) == {1}
    rung_of = {r.data.tags["trial_key"]: (float(r.data.tags["budget"]), int(r.data.tags["r"])) for r in runs}
    again = [e for e in journal(spec)[at_kill:] if e["event"] == "start"
             and (e["budget_flops"], e["r"]) in {rung_of[k] for k in finished}]
    assert not again, f"a rung finished before the kill ran again: {again}"


class Validator(Driver):
    """``loopscale validate ...`` as a subprocess with its own Ray, its output read line by line (``Driver``'s
    reader, waits and kill)."""

    def __init__(self, argv: list[str], cwd: Path, ray_dir: str):  # noqa: F811
        env = {**os.environ, "RAY_TMPDIR": ray_dir}
        self.process = subprocess.Popen([sys.executable, "-m", "loopscale.search.cli", *argv], cwd=cwd, env=env,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.output: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()


# ---- the plan and the presets (no Ray) ---------------------------------------------------------------------------
def test_the_paper_preset_ends_with_a_rung_at_twice_its_top_budget_and_the_plan_prices_it():
    from loopscale.analysis import numbers
    from loopscale.search.plan.render import render_plan

    paper = SweepSpec.from_toml("paper")
    assert paper.rungs.budgets == (2 * max(paper.grid.budgets),)
    text = render_plan(paper, None)
    rung_flops = numbers.flops(paper.rungs.budgets[0] * len(paper.grid.recurrences))
    assert f"validation rungs: {len(paper.grid.recurrences)} trials" in text and f"{rung_flops} FLOPs more" in text
    # rungs follow the sweep: the same hash without them, so a sweep started before resumes
    bare = SweepSpec.from_toml("paper", ["validate.budgets=[]"])
    assert bare.rungs.budgets == () and bare.spec_hash == paper.spec_hash


def test_demo_validate_adds_a_rung_per_r_at_twice_its_top_budget_and_a_validate_stage_to_the_estimate():
    from loopscale.search.demo import demo_spec
    from loopscale.search.plan.walltime import Throughput, estimate

    plain, rungs = demo_spec(), demo_spec(validate=True)
    assert plain.rungs.budgets == () and rungs.rungs.budgets == (2 * max(plain.grid.budgets),)
    assert rungs.spec_hash == plain.spec_hash
    throughput = Throughput(step_s=0.01, flops_per_s=1e10, setup_s=1.0, compile_s=0.0, side_by_side=2,
                            device="cpu", shape="test")
    with_rungs, without = estimate(rungs, throughput), estimate(plain, throughput)
    assert "validate" in with_rungs.stages and "validate" not in without.stages
    low, high, trials = with_rungs.stages["validate"]
    assert trials == len(plain.grid.recurrences) and 0 < low <= high
    assert with_rungs.sweep_s[0] == without.sweep_s[0] + low
