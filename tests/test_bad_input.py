"""Bad input through the real ``loopscale`` CLI: one ``loopscale: error:`` line on stderr, exit code 2, and nothing
written — the working directory (where every default path points) is byte-for-byte what it was, Ray never
starts, and a store the command was pointed at is left untouched.

Spec mistakes are driven through ``search.cli.main`` in-process (fast); one test runs the console entry point
(``python -m search.cli``) as a subprocess to prove the exit code and the absence of a traceback. The spec
parser's own messages are covered mistake by mistake in test_spec.py and at random in test_spec_properties.py;
here each class of mistake goes end to end.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from loopscale.search.cli import main
from test_spec import base_spec, free_port, to_toml



def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root`` with its bytes (None for a directory)."""
    return {str(p.relative_to(root)): (None if p.is_dir() else p.read_bytes()) for p in sorted(root.rglob("*"))}


def one_error_line(capsys) -> str:
    captured = capsys.readouterr()
    err = captured.err
    assert err.startswith("loopscale: error: ") and err.count("\n") == 1 and err.endswith("\n"), err
    assert "Traceback" not in err + captured.out
    return err


def refuses(argv: list[str], root: Path, capsys, message: str) -> str:
    """Run the CLI on bad input: exit 2, one error line containing ``message``, ``root`` unchanged."""
    before = snapshot(root)
    assert main(argv) == 2
    err = one_error_line(capsys)
    assert message in err, err
    assert snapshot(root) == before
    ray = sys.modules.get("ray")
    assert ray is None or not ray.is_initialized()
    return err


@pytest.fixture
def workdir(tmp_path, monkeypatch) -> Path:
    """An empty working directory: the defaults (./loopscale-runs/...) would land here."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def spec_file(root: Path, **overrides: Any) -> Path:
    """A small simulated spec that names no paths, so every default points into ``root``."""
    path = root / "spec.toml"
    path.write_text(to_toml(base_spec(root, **{"tracking_uri": None, "storage": None, "cache_dir": None, **overrides})))
    return path


def garbage_db(root: Path) -> str:
    (root / "mlflow.db").write_bytes(b"\x00not a database\xff" * 300)
    return f"sqlite:///{root / 'mlflow.db'}"


def foreign_db(root: Path) -> str:
    """A healthy SQLite file of some other program: MLflow must not add its tables to it."""
    with contextlib.closing(sqlite3.connect(root / "mlflow.db")) as db:
        db.execute("CREATE TABLE notes (body TEXT)")
        db.commit()
    return f"sqlite:///{root / 'mlflow.db'}"


def directory_db(root: Path) -> str:
    (root / "mlflow.db").mkdir()
    return f"sqlite:///{root / 'mlflow.db'}"


@contextlib.contextmanager
def silent_server() -> Iterator[str]:
    """A port that accepts connections and never answers (a hung server, or a firewall that drops)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


@contextlib.contextmanager
def babbling_server() -> Iterator[str]:
    """A port whose server answers every connection in binary, not HTTP (another service's port: a database's,
    Ray's gRPC)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)

        def answer() -> None:
            with contextlib.suppress(OSError):  # the socket closed: the test is over
                while True:
                    connection, _ = sock.accept()
                    with connection:
                        connection.sendall(b"\x00\x00\x12\x04\x00\x00\x00\x00\x00\x00\x03\x7f\xff\xff\xff\r\n")

        threading.Thread(target=answer, daemon=True).start()
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


def a_file(path: Path) -> Path:
    path.write_text("x")
    return path


# ---- search ------------------------------------------------------------------------------------------------
# (what is wrong, spec overrides or a function of the directory giving the spec's text, expected message)
SPEC_MISTAKES: list[tuple[str, Any, str]] = [
    ("malformed TOML", lambda root: 'name = "x"\nbudgets = [1e12,\n', "spec.toml: not valid TOML"),
    ("not text at all", lambda root: b"\xff\xfe\x00binary", "spec.toml: not valid TOML"),
    ("misspelled top-level key", {"budgets": None, "budget": [1e12]},
     "unknown key 'budget' in top level (did you mean 'budgets'?)"),
    ("misspelled table key", {"template": {"depht": 6}}, "unknown key 'depht' in [template] (did you mean 'depth'?)"),
    ("misspelled [widths] key", {"widths": {"s_mx": 12}}, "unknown key 's_mx' in [widths] (did you mean 's_max'?)"),
    ("unknown table", {"optimiser": {"lr": 1}}, "unknown key 'optimiser' in top level"),
    ("list given as a string", {"budgets": "1e12"}, "budgets in top level must be a list, got '1e12'"),
    ("float for an integer", {"seed": 1.5}, "seed in top level must be an integer, got 1.5"),
    ("string for a number", {"widths": {"s_min": "one"}}, "s_min in [widths] must be a number, got 'one'"),
    ("boolean for an integer", {"trials_per_cell": True}, "trials_per_cell in top level must be an integer"),
    ("table for a scalar", {"sampler": {"kind": "gp"}}, "sampler in top level must be a string"),
    ("negative budget", {"budgets": [1e12, -1e13]}, "budgets must be positive finite FLOP counts"),
    ("zero budget", {"budgets": [0]}, "budgets must be positive finite FLOP counts"),
    ("infinite budget", {"budgets": [float("inf")]}, "must be a list of finite numbers"),
    ("zero trials per cell", {"trials_per_cell": 0}, "trials_per_cell must be >= 1, got 0"),
    ("negative trials per cell", {"trials_per_cell": -3}, "trials_per_cell must be >= 1, got -3"),
    ("zero batch", {"batch_tokens": 0}, "batch_tokens must be >= 1, got 0"),
    ("r that does not divide the shared depth", {"recurrences": [1, 2, 3]},
     "r=3 does not divide the shared depth 4 (= depth 6 - prelude 1 - coda 1)"),
    ("r = 0", {"recurrences": [0]}, "recurrences must be >= 1"),
    ("width below the head dim", {"widths": {"s_min": 0.5}},
     "[widths] s_min = 0.5 gives width 8, not a multiple of head_dim 16"),
    ("widths narrower than one head", {"template": {"head_dim": 32}, "widths": {"s_min": 1}},
     "s_min = 1 gives width 16, not a multiple of head_dim 32"),
    ("head dim of zero", {"template": {"head_dim": 0}}, "head_dim in [template] must be >= 1, got 0"),
    ("a width range nobody could sweep", {"widths": {"s_max": 1e9}}, "more than 1000; narrow it"),
    ("budget too small for the narrowest model", {"budgets": [1e12, 1e7]},
     "budget 1e+07 FLOPs buys fewer than min_steps=10 optimizer steps of 512 tokens even at the narrowest width"),
    ("missing data file", lambda root: to_toml(base_spec(
        root, tracking_uri=None, storage=None, cache_dir=None, objective="train",
        data={"source": "files", "path": str(root / "corpus.txt")}, recipe={})),
     "data.path: no such file"),
    ("missing tokenizer file", lambda root: to_toml(base_spec(
        root, tracking_uri=None, storage=None, cache_dir=None, objective="train",
        data={"source": "kjv", "tokenizer": str(root / "tokenizer.json")}, recipe={})),
     "data.tokenizer: no such file"),
    ("misspelled data key", lambda root: to_toml(base_spec(
        root, tracking_uri=None, storage=None, cache_dir=None, objective="train", data={"sorce": "kjv"}, recipe={})),
     "unknown key 'sorce' for source 'kjv' (did you mean 'source'?)"),
    # these once started Ray, or wrote state, before failing
    ("a 300-character name", {"name": "n" * 300}, "name is 300 bytes long; keep it to 128"),
    ("a file as the Tune storage", lambda root: to_toml(base_spec(
        root, tracking_uri=None, storage=str(a_file(root / "tune")), cache_dir=None)), "is a file; name a folder"),
    ("a read-only sqlite store", lambda root: to_toml(base_spec(
        root, tracking_uri=f"sqlite:///{root / 'mlflow.db'}?mode=ro", storage=None, cache_dir=None)),
     "carries options (mode=ro)"),
    ("a NaN in the simulated law", {"simulate": {"law": {"E": float("nan"), "A": 1.0, "alpha": 0.3, "B": 1.0,
                                                         "beta": 0.3, "phi": 0.5}}},
     "E in [simulate] law must be a finite number, got nan"),
]


@pytest.mark.parametrize("what, spec, message", SPEC_MISTAKES, ids=[m[0] for m in SPEC_MISTAKES])
def test_search_refuses_a_bad_spec_and_writes_nothing(workdir, capsys, what, spec, message):
    path = workdir / "spec.toml"
    if callable(spec):
        text = spec(workdir)
        path.write_bytes(text) if isinstance(text, bytes) else path.write_text(text)
    else:
        spec_file(workdir, **spec)
    for command in ("search", "plan"):
        err = refuses([command, str(path)], workdir, capsys, message)
        assert err.split(": ")[2].endswith("spec.toml")  # the file is named


@pytest.mark.parametrize("name, content, message", [
    ("corpus.parquet", b"PAR1 not really parquet" * 40, "as parquet: ArrowInvalid: Parquet magic bytes not found"),
    ("corpus.jsonl", b'{"text": "In the beginning"}\n{"text": cut sho', "as json: ArrowInvalid: JSON parse error"),
], ids=["parquet", "jsonl"])
def test_search_refuses_a_corrupted_data_file_and_leaves_no_cache(workdir, capsys, name, content, message):
    """Found only when the driver reads the data, before Ray or MLflow: the half-built cache goes too."""
    (workdir / name).write_bytes(content)
    path = spec_file(workdir, objective="train", data={"source": "files", "path": str(workdir / name)}, recipe={})
    refuses(["search", str(path)], workdir, capsys, f"data.path: cannot read '{workdir / name}' {message}")


@pytest.mark.integration
@pytest.mark.parametrize("resources, asked", [({"cpus": os.cpu_count() + 1}, f"cpus = {os.cpu_count() + 1}, gpus = 0"),
                                              ({"gpus": 1}, "cpus = 1, gpus = 1")], ids=["cpus", "gpus"])
def test_search_refuses_a_trial_bigger_than_this_machine(workdir, tmp_path_factory, capsys, resources, asked):
    """On the Ray it starts itself the sweep would wait forever for such a trial: Ray starts, says how big its
    node is, and stops again before anything is written (the data cache, complete and reusable, lives apart)."""
    cache = tmp_path_factory.mktemp("cache")
    path = spec_file(workdir, objective="train", data={"source": "synthetic", "tokens": 20_000}, val_tokens=2048, recipe={},
                     resources=resources, cache_dir=str(cache))
    err = refuses(["search", str(path)], workdir, capsys, f"[resources] asks for {asked} per search trial, but no "
                  f"node of the Ray cluster has that much (the most: {os.cpu_count()} CPUs, 0 GPUs)")
    assert err.endswith("no trial could ever start\n")


STORES: list[tuple[str, Callable[[Path], str], str]] = [
    ("garbage file", garbage_db, "is not a readable SQLite database: file is not a database"),
    ("another program's database", foreign_db, "is an SQLite database but not MLflow's"),
    ("a directory", directory_db, "is not a readable and writable file"),
]


@pytest.mark.parametrize("what, make, message", STORES, ids=[s[0] for s in STORES])
def test_search_refuses_an_unusable_tracking_database(workdir, capsys, what, make, message):
    uri = make(workdir)
    refuses(["search", str(spec_file(workdir, tracking_uri=uri))], workdir, capsys, message)
    refuses(["search", str(spec_file(workdir)), "--tracking-uri", uri], workdir, capsys, message)


@pytest.mark.parametrize("what, make, message", STORES[:2], ids=[s[0] for s in STORES[:2]])
def test_ui_refuses_an_unusable_tracking_database(workdir, capsys, what, make, message):
    """`loopscale ui` checks the store before it starts MLflow's server (no server, no traceback)."""
    uri = make(workdir)
    refuses(["ui", "--tracking-uri", uri, "--port", str(free_port())], workdir, capsys, message)
    refuses(["ui", "--tracking-uri", uri, "--experiment", "t", "--port", str(free_port())], workdir, capsys, message)


def test_search_refuses_a_tracking_server_that_does_not_answer(workdir, capsys):
    closed = f"http://127.0.0.1:{free_port()}"
    refuses(["search", str(spec_file(workdir)), "--tracking-uri", closed], workdir, capsys,
            f"tracking server {closed} is unreachable")
    with silent_server() as hung:  # MLflow's own client would retry for minutes; the check gives up in 5 s
        refuses(["search", str(spec_file(workdir, tracking_uri=hung))], workdir, capsys,
                f"tracking server {hung} is unreachable: timed out")


# ---- analyze / export / compare ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def small_store(tmp_path_factory) -> Path:
    """An MLflow database with an empty experiment and one whose every trial failed."""
    from mlflow.tracking import MlflowClient

    root = tmp_path_factory.mktemp("store")
    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    client.create_experiment("empty", artifact_location=(root / "artifacts").as_uri())
    failed = client.create_experiment("all-failed", artifact_location=(root / "artifacts").as_uri())
    for s in (2, 4):
        run = client.create_run(failed, tags={"loopscale.kind": "trial", "sweep": "all-failed", "stage": "search",
                                              "r": "1", "budget": "1e12", "status": "failed",
                                              "reason": "worker died"})
        client.log_param(run.info.run_id, "s", s)
        client.set_terminated(run.info.run_id, "FAILED")
    return root / "mlflow.db"


ANALYSIS_COMMANDS = {
    "analyze": lambda exp, uri: ["analyze", "--experiment", exp, "--tracking-uri", uri],
    "export": lambda exp, uri: ["export", "--experiment", exp, "--tracking-uri", uri],
    "predict": lambda exp, uri: ["predict", "--experiment", exp, "--tracking-uri", uri, "--budget", "1e19", "--r", "1"],
    "compare": lambda exp, uri: ["compare", exp, exp, "--tracking-uri", uri],
}


@pytest.mark.integration
@pytest.mark.parametrize("command", sorted(ANALYSIS_COMMANDS))
@pytest.mark.parametrize("experiment, message", [
    ("nope", "no experiment 'nope' at sqlite:///"),
    ("empty", "experiment 'empty' at sqlite:///"),
])
def test_analysis_refuses_missing_and_empty_experiments(workdir, capsys, small_store, command, experiment,
                                                        message):
    shutil.copy(small_store, workdir / "mlflow.db")  # in the snapshot: reading must not change a byte of it
    err = refuses(ANALYSIS_COMMANDS[command](experiment, f"sqlite:///{workdir / 'mlflow.db'}"), workdir, capsys,
                  message)
    assert ("known: Default, all-failed, empty" in err) if experiment == "nope" else ("has no trial runs" in err)


@pytest.mark.integration
def test_analyze_refuses_an_experiment_without_a_usable_run(workdir, capsys, small_store):
    shutil.copy(small_store, workdir / "mlflow.db")
    refuses(["analyze", "--experiment", "all-failed"], workdir, capsys, "no MLflow database at")  # not the default
    (workdir / "loopscale-runs").mkdir()
    shutil.move(workdir / "mlflow.db", workdir / "loopscale-runs" / "mlflow.db")
    refuses(["analyze", "--experiment", "all-failed"], workdir, capsys,
            "no usable runs in all-failed: 2 failed (worker died)")


@pytest.mark.parametrize("command", sorted(ANALYSIS_COMMANDS))
@pytest.mark.parametrize("what, make, message", [
    ("garbage file", garbage_db, "is not a readable SQLite database"),
    ("another program's database", foreign_db, "is an SQLite database but not MLflow's"),
    ("missing file", lambda root: f"sqlite:///{root / 'missing' / 'mlflow.db'}", "no MLflow database at"),
], ids=["garbage file", "another program's database", "missing file"])
def test_analysis_refuses_an_unusable_database(workdir, capsys, command, what, make, message):
    refuses(ANALYSIS_COMMANDS[command]("sweep", make(workdir)), workdir, capsys, message)


def test_analysis_refuses_a_tracking_server_that_does_not_answer(workdir, capsys):
    closed = f"http://127.0.0.1:{free_port()}"
    for command in sorted(ANALYSIS_COMMANDS):
        refuses(ANALYSIS_COMMANDS[command]("sweep", closed), workdir, capsys, f"{closed} is unreachable")
    with silent_server() as hung:
        refuses(["analyze", "--experiment", "sweep", "--tracking-uri", hung], workdir, capsys,
                f"{hung} is unreachable: timed out")
    with babbling_server() as other:  # was http.client.BadStatusLine's traceback
        for argv in (["analyze", "--experiment", "sweep", "--tracking-uri", other],
                     ["search", str(spec_file(workdir)), "--tracking-uri", other]):
            refuses(argv, workdir, capsys, f"tracking server {other} answered /health with something that is not HTTP")


# ---- the console entry point -------------------------------------------------------------------------------
def test_console_exit_code_is_2_with_one_line_and_no_traceback(tmp_path):
    env = dict(os.environ)  # the installed loopscale, as a user runs it
    spec = spec_file(tmp_path, recurrences=[1, 3])
    garbage = garbage_db(tmp_path)
    before = snapshot(tmp_path)
    for argv, message in ((["search", "spec.toml"], "r=3 does not divide the shared depth"),
                          (["analyze", "--experiment", "sweep", "--tracking-uri", garbage],
                           "is not a readable SQLite database")):
        done = subprocess.run([sys.executable, "-m", "loopscale.search.cli", *argv], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 2, done.stderr
        assert done.stderr.startswith("loopscale: error: ") and done.stderr.count("\n") == 1, done.stderr
        assert message in done.stderr and done.stdout == ""
    assert snapshot(tmp_path) == before and spec.exists()


# ---- outputs, ports, hosts, runs tables --------------------------------------------------------------------
def test_analyze_and_export_refuse_an_out_of_the_wrong_kind_before_any_work(workdir, capsys):
    (workdir / "a-file").write_text("x")
    (workdir / "a-folder").mkdir()
    refuses(["analyze", "--experiment", "nothing", "--out", "a-file"], workdir, capsys, "--out a-file is a file")
    refuses(["export", "--law", "paper", "--out", "a-folder"], workdir, capsys, "--out a-folder is a folder")


@pytest.mark.parametrize("argv, message", [
    (["--port", "70000"], "--port 70000 is not a TCP port (1-65535)"),
    (["--host", "no-such-host.invalid"], "--host 'no-such-host.invalid' does not resolve"),
], ids=["port", "host"])
def test_ui_refuses_an_impossible_port_or_host(workdir, capsys, small_store, argv, message):
    refuses(["ui", "--tracking-uri", f"sqlite:///{small_store}", *argv], workdir, capsys, message)


def test_export_refuses_a_budget_no_model_can_train(workdir, capsys):
    refuses(["export", "--law", "paper", "--budgets", "1"], workdir, capsys,
            "budget 1.00e0 FLOPs buys no optimizer step of 262144 tokens at r=1 and any buildable width")


@pytest.mark.parametrize("argv, message", [
    (["--budget", "1e19", "--r", "4", "--width", "100"], "--width 100 is not buildable: widths are multiples of "
                                                          "head_dim 128"),
    (["--budget", "1", "--r", "1"], "budget 1.00e0 FLOPs buys no optimizer step of 262144 tokens at r=1"),
    (["--budget", "1e19", "--r", "5"], "r=5 does not divide"),
    (["--budget", "1e19", "--r", "1", "--fix-phi", "nan"], "fix_phi must be finite"),
    (["--budget", "1e19", "--r", "1", "--fix-phi", "0.5"], "--fix-phi holds phi in a fit of a sweep"),
])
def test_predict_refuses_a_request_it_cannot_answer(workdir, capsys, argv, message):
    refuses(["predict", "--law", "paper", *argv], workdir, capsys, message)


def test_a_runs_table_listing_a_run_twice_is_refused(workdir, capsys):
    from test_analysis_sim import paper_runs

    table = paper_runs(noise=0.01)
    pd.concat([table, table.iloc[:3]]).to_csv(workdir / "runs.csv", index=False)
    refuses(["analyze", "--experiment", "runs.csv", "--out", "out"], workdir, capsys,
            f"runs table lists run_id {table['run_id'].iloc[0]!r} more than once (3 repeated row(s))")


def test_a_runs_table_with_overflowing_numbers_excludes_those_rows(workdir, capsys):
    """1e308 FLOPs overflowed the fit half-way through writing its outputs; now those rows are excluded."""
    from test_analysis_sim import paper_runs

    table = paper_runs(noise=0.01)
    table.loc[table.index[:5], "budget_flops"] = 1e308
    table.to_csv(workdir / "runs.csv", index=False)
    assert main(["analyze", "--experiment", "runs.csv", "--out", "out", "--n-starts", "20",
                 "--n-bootstrap", "5"]) == 0
    captured = capsys.readouterr()
    assert "116 runs, 111 used, 5 excluded" in captured.out and "Traceback" not in captured.err
    assert "budget_flops is above 1e+60" in "".join(p.read_text() for p in (workdir / "out").rglob("excluded*.csv"))
