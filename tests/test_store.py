"""The MLflow store contract (analysis/store.py): which store a command uses, how one is checked, paging."""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from loopscale.analysis import store
from loopscale.analysis.runs import load_runs
from loopscale.search import SweepSpec
from loopscale.search.cli import main
from loopscale.search.tracking import ready_store
from test_spec import free_port, write_spec


# ---- which store: --tracking-uri > the spec's tracking_uri > $MLFLOW_TRACKING_URI > ./loopscale-runs -------
def test_resolution_order_each_level(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    default = f"sqlite:///{tmp_path / 'loopscale-runs' / 'mlflow.db'}"
    assert store.resolve_tracking_uri() == store.resolve_tracking_uri(None, None) == default
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///env.db")
    assert store.resolve_tracking_uri(None, None) == "sqlite:///env.db"
    assert store.resolve_tracking_uri(None, "sqlite:///spec.db") == "sqlite:///spec.db"
    assert store.resolve_tracking_uri("sqlite:///flag.db", "sqlite:///spec.db") == "sqlite:///flag.db"
    assert store.resolve_tracking_uri("", "") == "sqlite:///env.db"  # an empty value is no value


def test_search_spec_follows_the_order(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    uri = {level: f"sqlite:///{tmp_path / level / 'mlflow.db'}" for level in ("flag", "spec", "env")}
    bare = write_spec(tmp_path, "bare.toml", tracking_uri=None)
    named = write_spec(tmp_path, "named.toml", tracking_uri=uri["spec"])
    assert SweepSpec.from_toml(bare).placement.tracking_uri == f"sqlite:///{tmp_path / 'loopscale-runs' / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri["env"])
    assert SweepSpec.from_toml(bare).placement.tracking_uri == uri["env"]
    assert SweepSpec.from_toml(named).placement.tracking_uri == uri["spec"]
    assert SweepSpec.from_toml(named, tracking_uri=uri["flag"]).placement.tracking_uri == uri["flag"]


@pytest.mark.parametrize("argv", [
    ["analyze", "--experiment", "sweep"], ["export", "--experiment", "sweep"], ["compare", "a", "b"],
    ["predict", "--experiment", "sweep", "--budget", "1e19", "--r", "1"], ["ui", "--port", "0"],
], ids=["analyze", "export", "compare", "predict", "ui"])
def test_reading_commands_use_the_environment_and_the_flag(tmp_path, monkeypatch, capsys, argv):
    """Each reading command names the store it looked in: the variable's, then the flag's over it."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'env' / 'mlflow.db'}")
    assert main(argv) == 2
    assert f"no MLflow database at {tmp_path / 'env' / 'mlflow.db'}" in capsys.readouterr().err
    assert main([*argv, "--tracking-uri", f"sqlite:///{tmp_path / 'flag.db'}"]) == 2
    assert f"no MLflow database at {tmp_path / 'flag.db'}" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # looking wrote nothing


# ---- checks ---------------------------------------------------------------------------------------------
def test_an_empty_database_file_is_no_store_yet(tmp_path):
    """A database without tables (``touch mlflow.db``) is treated as no database: the search may build its
    store there, a reader refuses it and leaves it empty (MLflow would otherwise build its schema in it)."""
    path = tmp_path / "mlflow.db"
    path.touch()
    uri = f"sqlite:///{path}"
    with pytest.raises(ValueError, match=f"no MLflow database at {path}"):
        store.check_store(uri)
    with pytest.raises(ValueError, match=f"no MLflow database at {path}"):
        load_runs("sweep", uri)
    assert path.stat().st_size == 0
    store.check_store(uri, create=True)
    ready_store(uri)  # what the search does next: build the store
    assert {"experiments", "runs"} <= store.sqlite_tables(path)
    store.check_store(uri)  # now a reader accepts it


def test_sqlite_uri_must_name_a_file():
    for uri in ("sqlite://", "sqlite:///", "sqlite:///:memory:"):
        with pytest.raises(ValueError, match="must name a database file"):
            store.check_store(uri, create=True)
    with pytest.raises(ValueError, match="use sqlite:///path/to/mlflow.db or an http"):
        store.check_store("file:///tmp/mlruns")


class _Health(http.server.BaseHTTPRequestHandler):
    status = 200

    def do_GET(self):  # noqa: N802 (http.server's name)
        self.send_response(self.status if self.path == "/health" else 404)
        self.end_headers()
        self.wfile.write(b"OK")

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("status", [200, 503, 204])
def test_health_check_wants_http_200(status):
    handler = type("Handler", (_Health,), {"status": status})
    server = http.server.HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        uri = f"http://alice:hunter2@127.0.0.1:{server.server_port}"
        if status == 200:
            store.check_store(uri)
        else:
            with pytest.raises(ValueError) as err:
                store.check_store(uri)
            assert str(err.value) == (f"tracking server http://alice:***@127.0.0.1:{server.server_port} answered "
                                      f"/health with HTTP {status}")
    finally:
        server.shutdown()
        server.server_close()
    with pytest.raises(ValueError, match=f"http://127.0.0.1:{(port := free_port())} is unreachable"):
        store.check_store(f"http://127.0.0.1:{port}")


class _Failing(http.server.BaseHTTPRequestHandler):
    """An MLflow server that answers /health but fails every API call with HTTP 500 (its database gone)."""

    def answer(self):
        self.send_response(200 if self.path == "/health" else 500)
        self.end_headers()
        self.wfile.write(b"OK")

    do_GET = do_POST = do_PATCH = answer  # noqa: N815 (http.server's names)

    def log_message(self, *args):
        pass


FAILING_PASSWORD = "pw-of-the-red-team"


class _FailingLater(_Failing):
    """A server that passed the store check (``store.check_server``) and fails every other call: its store failed
    after the sweep started."""

    def answer(self):
        self.send_response(200 if self.path in ("/health", store.API_PROBE) else 500)
        self.end_headers()
        self.wfile.write(b"OK")

    do_GET = do_POST = do_PATCH = answer  # noqa: N815 (http.server's names)


@pytest.fixture(params=[_Failing])
def failing_server(request, monkeypatch) -> Iterator[str]:
    """The tracking URI, password included, of a ``_Failing`` server (or the handler a test names by indirect
    parametrisation); MLflow's client retries a 500 for minutes by default, so here not at all (its exception
    still names the URL it asked)."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), request.param)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://rt:{FAILING_PASSWORD}@127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


READ_COMMANDS = {
    "status": lambda uri: ["status", "sweep", "--tracking-uri", uri],
    "analyze": lambda uri: ["analyze", "--experiment", "sweep", "--tracking-uri", uri, "--no-log"],
    "export": lambda uri: ["export", "--experiment", "sweep", "--tracking-uri", uri],
    "predict": lambda uri: ["predict", "--experiment", "sweep", "--tracking-uri", uri, "--budget", "1e19", "--r", "1"],
    "ui": lambda uri: ["ui", "--experiment", "sweep", "--tracking-uri", uri, "--port", str(free_port())],
}


@pytest.mark.parametrize("command", sorted(READ_COMMANDS))
def test_a_failing_server_is_one_line_without_its_password(command, failing_server, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(READ_COMMANDS[command](failing_server)) in (1, 2)
    out, err = capsys.readouterr()
    assert err.startswith("loopscale: error: ") and err.count("\n") == 1, err
    assert FAILING_PASSWORD not in out + err and "rt:***@127.0.0.1" in err, err


def test_status_against_a_server_whose_store_fails_is_one_line_before_mlflow_retries(tmp_path):
    """The red team's case: /health answers 200 and every API call HTTP 500. MLflow's client, at its default of 7
    retries, took ~260 s to say a word; the store check reads the server once, and says so, in one line."""
    asked: list[str] = []
    handler = type("Asked", (_Failing,), {"log_message": lambda self, *args: asked.append(self.path)})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_HTTP_REQUEST")}  # MLflow's defaults
    try:
        done = subprocess.run([sys.executable, "-m", "loopscale.search.cli", "status", "sweep", "--tracking-uri",
                               f"http://127.0.0.1:{server.server_port}"], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=120)
    finally:
        server.shutdown()
        server.server_close()
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "answers /health but failed a read of its experiments with HTTP 500" in done.stderr
    assert asked == ["/health", store.API_PROBE]  # nothing more: no request of MLflow's client, no retry


@pytest.mark.parametrize("failing_server", [_FailingLater], indirect=True)
def test_a_sweeps_store_failure_is_one_line_without_the_password(failing_server, tmp_path, monkeypatch, capsys):
    """The red team's case: the server failed mid-sweep, and the driver's line quoted MLflow's exception, whose
    text holds the URL it asked, password and all. The sweep's failure path is fed the exception MLflow's REST
    client really raises (a real sweep against a server killed mid-way takes minutes)."""
    from mlflow.tracking import MlflowClient

    from loopscale.search.stopping import StoreFailure
    from loopscale.search.tracking import store_errors

    def search_whose_store_fails(spec, **options):
        with store_errors(spec.placement.tracking_uri):
            MlflowClient(spec.placement.tracking_uri).set_terminated("0" * 32)  # where the red team's sweep died

    with pytest.raises(StoreFailure) as failure, store_errors(failing_server):
        MlflowClient(failing_server).set_terminated("0" * 32)
    assert FAILING_PASSWORD not in str(failure.value) and "/api/2.0/mlflow/runs/" in str(failure.value)
    import loopscale.search.tune.driver as driver

    monkeypatch.setattr(driver, "run_search", search_whose_store_fails)
    spec = write_spec(tmp_path, "spec.toml")
    assert main(["search", str(spec), "--tracking-uri", failing_server]) == 1
    out, err = capsys.readouterr()
    assert err.startswith("loopscale: error: MLflow store http://rt:***@127.0.0.1:") and err.count("\n") == 1, err
    assert FAILING_PASSWORD not in out + err


def test_redact_hides_every_uri_password():
    text = "a http://alice:s3cret@host:5000/x and postgresql://bob:pw@db/mlflow; none in http://host:5000"
    assert store.redact(text) == ("a http://alice:***@host:5000/x and postgresql://bob:***@db/mlflow; "
                                  "none in http://host:5000")


# ---- paging ---------------------------------------------------------------------------------------------
def test_iter_runs_reads_every_page(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    ready_store(uri)
    client = MlflowClient(uri)
    experiment = client.create_experiment("paged", artifact_location=(tmp_path / "artifacts").as_uri())
    made = {client.create_run(experiment, tags={store.KIND_TAG: "trial", "stage": "search"}).info.run_id
            for _ in range(5)}
    client.create_run(experiment, tags={store.KIND_TAG: "sweep"})
    monkeypatch.setattr(store, "PAGE_SIZE", 2)  # 5 trial runs: pages of 2, 2 and 1
    assert {r.info.run_id for r in store.iter_runs(client, experiment, store.runs_query("trial", stage="search"))} \
        == made
    client.delete_run(min(made))
    assert len(list(store.iter_runs(client, experiment, store.runs_query("trial")))) == 4
    assert len(list(store.iter_runs(client, experiment, store.runs_query("trial"), active_only=False))) == 5


def test_store_module_imports_neither_ray_nor_optuna_nor_mlflow():
    import subprocess
    import sys

    code = ("import sys, loopscale.analysis.store; "
            "print(sorted(m for m in ('ray', 'mlflow', 'optuna') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
