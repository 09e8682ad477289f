"""``loopscale analyze`` under what a clean run does not show: an output folder replaced as a whole, bounds on
the work refused before it starts, an interrupt while it logs to MLflow, text from a runs table that would be a
formula or markup, and a sweep that has not finished."""

from __future__ import annotations

import io
import json
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from loopscale.analysis import folder_swap, optimize
from loopscale.analysis.cli import main
from loopscale.analysis.options import MAX_BOOTSTRAP, MAX_RUNS, MAX_STARTS
from loopscale.analysis.store import LOCK_FILE, process_start
from loopscale.analysis.tables import render
from test_analysis_sim import log_sweep, paper_runs, trial_configs

FAST = ["--n-starts", "20", "--n-bootstrap", "5"]
LOOPSCALE = str(Path(sys.executable).parent / "loopscale")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """The paper's 116-run grid in an MLflow sqlite store, as experiment 'paper' (its sweep run FINISHED)."""
    root = tmp_path_factory.mktemp("store")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    log_sweep(uri, "paper", trial_configs(noise=0.01), root / "artifacts")
    return {"uri": uri, "root": root}


def analysis_runs(uri: str, experiment: str = "paper"):
    from mlflow.entities import ViewType
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    return client, client.search_runs([exp.experiment_id], "tags.`loopscale.kind` = 'analysis'",
                                      run_view_type=ViewType.ALL)


def files(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()}


# ---- the output folder, replaced as a whole ------------------------------------------------------------------
@pytest.mark.integration
def test_an_earlier_analysis_leaves_nothing_behind_in_the_folder_or_the_logged_run(store, tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["analyze", "--experiment", "paper", "--tracking-uri", store["uri"], "--out", str(out), *FAST]
    assert main(argv) == 0
    fresh = files(out)
    (out / "tables" / "allocation_r16.csv").write_text("stale\n")  # what an earlier analysis wrote, not this one
    (out / "plots" / "old.png").write_bytes(b"stale")
    stale_scratch = tmp_path / f".out.{socket.gethostname()}.999999999.partial"  # a SIGKILLed analyze's
    (stale_scratch / "tables").mkdir(parents=True)
    assert main(argv) == 0
    assert files(out) == fresh
    assert not stale_scratch.exists() and [p.name for p in tmp_path.iterdir()] == ["out"]
    client, runs = analysis_runs(store["uri"])
    current = [r for r in runs if r.info.lifecycle_stage == "active"]
    assert len(current) == 1
    logged = {a.path for a in client.list_artifacts(current[0].info.run_id, "tables")}
    assert "tables/allocation_r16.csv" not in logged
    assert {a.path for a in client.list_artifacts(current[0].info.run_id, "plots")} == \
        {f"plots/{p.name}" for p in (out / "plots").iterdir()}


def test_a_failed_swap_keeps_the_old_folder_whole(tmp_path, monkeypatch):
    old, new = tmp_path / "out", tmp_path / ".out.host.1.partial"
    for folder, text in ((old, "old"), (new, "new")):
        (folder / "tables").mkdir(parents=True)
        (folder / "tables" / "fits.csv").write_text(text)
        (folder / "summary.json").write_text(text)
    (old / "plots").mkdir()
    (old / "plots" / "isoflop.png").write_text("old")

    def refused(a, b):
        raise OSError(28, "No space left on device", str(b))

    monkeypatch.setattr(folder_swap, "_exchange", refused)
    with pytest.raises(OSError):
        folder_swap.replace_folder(new, old)
    assert {p: (old / p).read_text() for p in files(old)} == \
        {"tables/fits.csv": "old", "summary.json": "old", "plots/isoflop.png": "old"}
    monkeypatch.undo()
    folder_swap.replace_folder(new, old)
    assert {p: (old / p).read_text() for p in files(old)} == {"tables/fits.csv": "new", "summary.json": "new"}
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_analyze_refuses_an_out_folder_that_holds_other_files(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine")
    csv = tmp_path / "sweep.csv"
    paper_runs(noise=0.01).to_csv(csv, index=False)
    assert main(["analyze", "--experiment", str(csv), "--out", str(tmp_path), *FAST]) == 2
    err = capsys.readouterr().err
    assert "holds notes.txt" in err and "replaces that folder as a whole" in err and err.count("\n") == 1
    assert (tmp_path / "notes.txt").read_text() == "mine"


# ---- bounds on the work ----------------------------------------------------------------------------------------
def _limited(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """``loopscale argv`` with its address space capped at 3 GB (so an unbounded allocation fails here instead of
    taking the machine's memory) and a minute to answer."""
    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))

    return subprocess.run([LOOPSCALE, *argv], cwd=cwd, capture_output=True, text=True, timeout=120,
                          preexec_fn=cap)


@pytest.mark.parametrize("case", ["starts", "bootstrap", "runs"])
def test_work_beyond_the_bounds_is_refused_in_one_line_before_it_starts(tmp_path, case):
    runs = paper_runs(noise=0.01)
    if case == "runs":  # the grid repeated at slightly other token counts: 2,088 distinct runs
        runs = pd.concat([runs.assign(tokens=runs["tokens"] * (1 + 1e-3 * k), run_id=runs["run_id"] + f"_{k}")
                          for k in range(MAX_RUNS // len(runs) + 1)], ignore_index=True)
    runs.to_csv(tmp_path / "sweep.csv", index=False)
    flags = {"starts": ["--n-starts", str(10 * MAX_STARTS), "--n-bootstrap", "0"],
             "bootstrap": ["--n-starts", "10", "--n-bootstrap", str(1000 * MAX_BOOTSTRAP)],
             "runs": ["--n-starts", "10", "--n-bootstrap", "0"]}[case]
    started = time.perf_counter()
    done = _limited(["analyze", "--experiment", "sweep.csv", "--out", "out", *flags], tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    bound = {"starts": f"{MAX_STARTS:,}", "bootstrap": f"{MAX_BOOTSTRAP:,}", "runs": f"at most {MAX_RUNS:,}"}[case]
    assert bound in done.stderr
    assert time.perf_counter() - started < 60 and not (tmp_path / "out").exists()


def test_the_help_states_the_bounds():
    done = subprocess.run([LOOPSCALE, "analyze", "--help"], capture_output=True, text=True, timeout=120)
    text = " ".join(done.stdout.split())
    assert f"at most {MAX_STARTS:,}" in text and f"at most {MAX_BOOTSTRAP:,}" in text
    assert f"at most {MAX_RUNS:,} runs" in text


def test_the_objective_is_evaluated_in_bounded_slices_with_the_same_result(monkeypatch):
    target = np.linspace(-1, 1, 3)
    calls = []

    def fun(x, rows):
        calls.append(len(rows))
        return ((x - target) ** 2).sum(1), 2 * (x - target)

    starts = np.random.default_rng(0).uniform(-5, 5, (3 * optimize.EVAL_POINTS, 3))
    lower, upper = np.full(3, -5.0), np.full(3, 5.0)
    sliced = optimize.minimize_batch(fun, starts, lower, upper, max_iter=20)
    assert max(calls) == optimize.EVAL_POINTS
    monkeypatch.setattr(optimize, "EVAL_POINTS", 10 * len(starts))
    whole = optimize.minimize_batch(fun, starts, lower, upper, max_iter=20)
    assert max(calls) == len(starts)
    assert np.array_equal(sliced.x, whole.x) and np.array_equal(sliced.f, whole.f)


# ---- text from the runs table ----------------------------------------------------------------------------------
def test_text_cells_cannot_be_formulas_or_markup():
    table = pd.DataFrame({"run_id": ["=cmd|' /C calc'!A0", "@SUM(A1)", "+1", "-2", "\tx", "plain"],
                          "reason": ["<script>alert(1)</script>", "a|b", "line\nbreak", "x\r\ny", "&amp", ""],
                          "val_loss": [-1.5, 2.0, 3.0, 4.0, 5.0, 6.0]})
    csv = pd.read_csv(io.StringIO(render(table, "csv")), keep_default_na=False)
    assert csv["run_id"].tolist() == ["'=cmd|' /C calc'!A0", "'@SUM(A1)", "'+1", "'-2", "'\tx", "plain"]
    assert csv["val_loss"].tolist() == [-1.5, 2.0, 3.0, 4.0, 5.0, 6.0]  # numbers stay numbers
    md = render(table, "md")
    assert md.count("\n") == 2 + len(table)  # header, rule, one line per row
    assert all(len(re.findall(r"(?<!\\)\|", line)) == 4 for line in md.splitlines())  # 3 cells: no bare '|' in one
    assert "<script>" not in md and "&lt;script&gt;" in md and "line<br>break" in md and "&amp;amp" in md
    latex = render(table, "latex")
    assert latex.count("\n") == 6 + len(table)


def test_analyze_writes_escaped_tables_of_a_hostile_runs_table(tmp_path):
    runs = paper_runs(noise=0.01)
    runs.loc[0, "run_id"] = "=HYPERLINK(\"http://x\")"
    runs.loc[0, "status"], runs.loc[0, "reason"] = "failed", "<img src=x onerror=alert(1)> | a\nb"
    path = tmp_path / "sweep.csv"
    runs.to_csv(path, index=False)
    out = tmp_path / "out"
    assert main(["analyze", "--experiment", str(path), "--out", str(out), *FAST]) == 0
    excluded = pd.read_csv(out / "tables" / "excluded_runs.csv")
    assert excluded["run_id"].tolist() == ["'=HYPERLINK(\"http://x\")"]
    md = (out / "tables" / "excluded_runs.md").read_text()
    assert md.count("\n") == 3 and "<img" not in md


# ---- an interrupt while the analysis run is logged -------------------------------------------------------------
@pytest.mark.integration
@pytest.mark.slow
def test_sigint_while_logging_leaves_one_finished_analysis_and_nothing_running(store, tmp_path):
    out = tmp_path / "out"
    argv = [LOOPSCALE, "analyze", "--experiment", "paper", "--tracking-uri", store["uri"], "--out", str(out), *FAST]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    assert subprocess.run(argv, capture_output=True, timeout=300).returncode == 0  # the analysis to replace
    interrupted = 0
    for delay in (0.0, 0.05, 0.15):
        process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for line in process.stdout:  # the files are written; logging starts now
            if line.startswith("wrote "):
                break
        time.sleep(delay)
        process.send_signal(signal.SIGINT)
        rest, err = process.communicate(timeout=120)
        interrupted += process.returncode == 128 + signal.SIGINT
        assert process.returncode in (0, 128 + signal.SIGINT), err[-2000:]
        if process.returncode:  # (a SIGINT after the command's work, at the interpreter's exit, is not its own)
            assert err.endswith("\nloopscale: interrupted by SIGINT\n") and "Traceback" not in err, err[-2000:]
        _, runs = analysis_runs(store["uri"])
        assert not [r for r in runs if r.info.status == "RUNNING"], [(r.info.status, r.info.lifecycle_stage)
                                                                     for r in runs]
        current = [r for r in runs if r.info.lifecycle_stage == "active"]
        assert len(current) == 1 and current[0].info.status == "FINISHED"
        if process.returncode == 0:
            assert "logged to MLflow run" in rest
    assert interrupted, "no SIGINT arrived while the analysis run was logged"


# ---- an unfinished sweep ---------------------------------------------------------------------------------------
@pytest.mark.integration
def test_analyze_of_an_unfinished_sweep_says_so_first(tmp_path, capsys):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    exp_id = log_sweep(uri, "half", trial_configs(noise=0.01), tmp_path / "artifacts")
    client = MlflowClient(uri)
    sweep = client.search_runs([exp_id], "tags.`loopscale.kind` = 'sweep'")[0].info.run_id
    client.update_run(sweep, status="RUNNING")  # as open_sweep leaves it until the last trial has its run
    client.log_param(sweep, "planned_trials", 130)
    storage = tmp_path / "tune"
    (tmp_path / "spec.toml").write_text(f'name = "half"\nstorage = "{storage}"\n')
    client.log_artifact(sweep, str(tmp_path / "spec.toml"))
    lock = storage / "half" / LOCK_FILE
    lock.parent.mkdir(parents=True)
    me = {"host": socket.gethostname(), "pid": os.getpid(), "process_start": process_start(os.getpid()),
          "since": time.time()}
    lock.write_text(json.dumps(me))
    argv = ["analyze", "--experiment", "half", "--tracking-uri", uri, "--out", str(tmp_path / "out"), "--no-log",
            *FAST]
    capsys.readouterr()  # the store's creation
    assert main(argv) == 0
    printed, err = capsys.readouterr()
    first = err.splitlines()[0]
    assert first == (f"loopscale: warning: sweep half is unfinished: 116 of 130 planned trials logged; the driver "
                     f"(pid {os.getpid()} on host {socket.gethostname()}) is running")
    assert printed.startswith("warning: sweep half is unfinished")
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["unfinished"] == first.split("warning: ")[1]
    assert lock.read_text() == json.dumps(me)  # read, not taken

    lock.write_text(json.dumps({**me, "pid": 999_999_999}))  # a driver that is gone
    assert main(argv) == 0
    first = capsys.readouterr().err.splitlines()[0]
    assert first.endswith("116 of 130 planned trials logged; its driver stopped: "
                          "`loopscale search <its spec> --resume` finishes it")


@pytest.mark.integration
def test_analyze_of_a_finished_sweep_says_nothing_about_it(store, tmp_path, capsys):
    assert main(["analyze", "--experiment", "paper", "--tracking-uri", store["uri"], "--out",
                 str(tmp_path / "out"), "--no-log", *FAST]) == 0
    printed, err = capsys.readouterr()
    assert "unfinished" not in printed + err
