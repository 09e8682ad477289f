"""``loopscale ui``: the MLflow UI on the store the sweeps used.

It runs ``mlflow server`` as a child process, bound to 127.0.0.1 unless the user asks for another host (then with
a warning and MLflow's Host-header guard set to that host), prints the URL of the experiment and stops the server
cleanly on Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from loopscale.analysis import numbers
from loopscale.analysis.store import check_server, check_store, redact
from loopscale.objectives import TrialConfig
from loopscale.search.stopping import SIGNALS, restore_signals

LOOPBACK = "127.0.0.1"
# MLflow 3.17's shared view state: the experiment page with ``?viewStateShareKey=K`` loads the JSON in the
# experiment tag ``mlflow.sharedViewState.K`` (what the UI's Share button writes; plain JSON is accepted beside
# its compressed form). Its keys are the UI's search facets (orderByKey, orderByAsc, ...) and view state
# (selectedColumns, groupBy, ...), read from mlflow/server/js's build of 3.17.
VIEW_KEY = "loopscale"
VIEW_TAG = f"mlflow.sharedViewState.{VIEW_KEY}"
# What a trial is and what it scored, as the runs table shows them: tags written for reading (``view_tags``:
# budgets in e-notation, counts in k/M/B, the loss to 3 decimals), not the numbers themselves, so that a cell's
# group row shows no per-column minimum of its runs (a run that does not exist) and nothing is cut or shown to 10
# digits. The numbers stay at full precision for sorting, charts and the analysis (``store.trial_numbers``).
VIEW_TAGS = ("r", "C", "width", "N", "tokens", "loss")
# The experiment's kind, which MLflow 3's kind selector and older 3.x UIs open it by: training runs, not GenAI.
# MLflow 3.17 itself opens every page in the browser's workflow type (the URL's ``workflowType``, else the user's
# last choice in the sidebar, GenAI at first): ``experiment_url`` carries it.
KIND_TAGS = {"mlflow.experimentKind": "custom_model_development"}


def view_tags(trial: TrialConfig) -> dict[str, str]:
    """The runs table's shape columns of a trial (``VIEW_TAGS`` but ``r``, a tag already, and ``loss``,
    ``loss_tag``), written when its run is created."""
    from loopscale.model import account, tokens_for_budget

    tokens = tokens_for_budget(trial.model_config, trial.budget_flops, trial.batch_tokens)
    return {"C": numbers.flops(trial.budget_flops), "width": str(trial.model_config.width),
            "N": numbers.count(account(trial.model_config).N), "tokens": numbers.count(tokens)}


def loss_tag(result: dict[str, Any]) -> dict[str, str]:
    """The runs table's ``loss`` column of a trial's result ({} without a finite val_loss)."""
    loss = result.get("val_loss")
    return {"loss": numbers.loss(loss)} if isinstance(loss, (int, float)) and math.isfinite(loss) else {}


def runs_view() -> str:
    """The runs table a sweep opens on: the run name and ``VIEW_TAGS`` as columns, sorted by val_loss (best
    first) and grouped by (budget, r) cell, every run shown."""
    run_name = "attributes.`Run Name`"
    columns = [f"tags.`{key}`" for key in VIEW_TAGS]
    return json.dumps({
        "orderByKey": "metrics.`val_loss`", "orderByAsc": True,
        "selectedColumns": [run_name, *columns], "runsHiddenMode": "SHOW_ALL",
        # names in full (e.g. "search C=1e+13 r=4 d=112") and columns in VIEW_TAGS' order, not alphabetical
        "columnOrder": [run_name, *columns], "columnWidths": {run_name: 320, **{c: 90 for c in columns}},
        "groupBy": {"aggregateFunction": "min", "groupByKeys": [{"mode": "tag", "groupByData": "cell"}]},
        # the runs without a cell (the sweep's run, the analysis run) form a group named after the grouping,
        # collapsed unless listed here
        "groupsExpanded": {"tag.cell": True},
    })


def experiment_url(base: str, experiment_id: str | None) -> str:
    """The experiment's runs table in the sweep's view (``runs_view``); MLflow 3 otherwise opens its GenAI
    trace view, empty for training runs."""
    if not experiment_id:
        return f"{base}/#/experiments?workflowType=machine_learning"
    return f"{base}/#/experiments/{experiment_id}/runs?workflowType=machine_learning&viewStateShareKey={VIEW_KEY}"


def port_is_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def server_command(host: str, port: int, extra_args: tuple[str, ...] = ()) -> list[str]:
    """The ``mlflow server`` command line; artifacts stay where each experiment put them unless
    ``extra_args`` say otherwise (e.g. ``--artifacts-destination``, ``--app-name basic-auth``). The store is not
    on it: a password in its URI would show in ``ps``; it travels in the environment (``server_env``)."""
    cmd = [sys.executable, "-m", "mlflow", "server", "--host", host, "--port", str(port), "--workers", "1",
           *extra_args]
    if host != LOOPBACK:
        # MLflow rejects unknown Host headers (DNS-rebinding guard); allow the name the user chose and loopback.
        cmd += ["--allowed-hosts", f"{host},{host}:{port},localhost:{port},{LOOPBACK}:{port}"]
    return cmd


def wait_healthy(base: str, proc: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"mlflow server exited with code {proc.returncode} before it answered")
        try:
            return check_server(base, timeout_s=2)
        except ValueError:  # not up yet
            time.sleep(0.5)
    raise RuntimeError(f"mlflow server did not answer {base}/health within {timeout_s:.0f} s")


def start_server(tracking_uri: str, host: str = LOOPBACK, port: int = 5000, timeout_s: float = 90.0,
                 extra_args: tuple[str, ...] = (), env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str]:
    """Start ``mlflow server`` in its own process group and wait until /health answers.

    Returns (process, base URL). ``env`` adds variables (e.g. MLFLOW_AUTH_CONFIG_PATH for the basic-auth app)."""
    check_address(host, port)
    if not port_is_free(host, port):
        raise ValueError(f"port {port} on {host} is in use; pick another with --port")
    # No job runner: ~7 s faster start, and nothing here uses it. MLflow's server reads the store from
    # MLFLOW_BACKEND_STORE_URI as it would from --backend-store-uri.
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", "MLFLOW_BACKEND_STORE_URI": tracking_uri,
           **(env or {})}
    log = tempfile.TemporaryFile(mode="w+")  # a file, not a pipe: an unread pipe would stall the server
    proc, interrupted = spawn_holding_signals(server_command(host, port, extra_args), env=env,
                                              start_new_session=True, stdout=log, stderr=subprocess.STDOUT, text=True)
    base = f"http://{LOOPBACK if host in (LOOPBACK, '0.0.0.0') else host}:{port}"
    try:
        if interrupted:
            raise KeyboardInterrupt
        wait_healthy(base, proc, timeout_s)
    except RuntimeError as err:
        stop_server(proc)
        log.seek(0)
        lines = redact(log.read()).strip().splitlines()
        # its last error says why (a port taken meanwhile: "address already in use"), not its last line
        last = ([line for line in lines if "ERROR" in line] or lines)[-1:]
        raise RuntimeError(f"{err}{': ' + last[0] if last else ''}") from None
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM while it starts: no server left behind in its own session
        serving = not port_is_free(host, port)  # it took connections (and may have served pages) before /health
        stop_server(proc)
        raise StoppedStarting(base if serving else "") from None
    except BaseException:
        stop_server(proc)
        raise
    finally:
        log.close()  # the child keeps its own handle
    return proc, base


class StoppedStarting(KeyboardInterrupt):
    """Ctrl-C or SIGTERM while ``start_server`` waited for the server's /health, the server stopped; ``serving``:
    the base URL where it already took connections (its pages may have been open), or "" where it never did."""

    def __init__(self, serving: str):
        super().__init__(serving)
        self.serving = serving


def spawn_holding_signals(command: list[str], **popen_args) -> tuple[subprocess.Popen, bool]:
    """(process, whether SIGINT or SIGTERM came meanwhile): ``subprocess.Popen`` with both signals held until it
    returns. Popen waits for the child's exec; a Ctrl-C landing then raises out of it with the child started and
    no Popen object to stop it by, and a server in its own session outlives the command (under load, most
    Ctrl-Cs sent the moment the server process appeared did; docs/log.md). Held here, the signal is acted on once
    the caller holds the process. Off the main thread, where handlers cannot be set, it is a plain Popen."""
    if threading.current_thread() is not threading.main_thread():
        return subprocess.Popen(command, **popen_args), False
    held: list[int] = []
    previous = {s: signal.signal(s, lambda signum, frame: held.append(signum)) for s in SIGNALS}
    try:
        proc = subprocess.Popen(command, **popen_args)
    finally:
        restore_signals(previous)
    return proc, bool(held)


def check_address(host: str, port: int) -> None:
    """One line for a port no socket can have or a host name that does not resolve (bind would fail, and
    the failure read as "port in use")."""
    if not 0 < port < 65536:
        raise ValueError(f"--port {port} is not a TCP port (1-65535)")
    try:
        socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise ValueError(f"--host {host!r} does not resolve to an address of this machine: {exc}") from None


def stop_server(proc: subprocess.Popen) -> None:
    """Terminate the server's whole process group (gunicorn/uvicorn workers included)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt  # SIGTERM stops the UI the same way Ctrl-C does


def experiment_id_of(tracking_uri: str, name: str | None) -> str | None:
    """The id of experiment ``name`` in the store (None for no name); a clear error when it does not exist."""
    if name is None:
        return None
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri)
    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        raise ValueError(f"no experiment {name!r} in {redact(tracking_uri)}; run `loopscale search` first")
    for key, value in {**KIND_TAGS, VIEW_TAG: runs_view()}.items():
        if key not in experiment.tags:  # a sweep logged before the tag existed
            client.set_experiment_tag(experiment.experiment_id, key, value)
    return experiment.experiment_id


def serve(tracking_uri: str, host: str, port: int, experiment: str | None) -> int:
    """Run the UI on ``experiment``'s runs until Ctrl-C / SIGTERM; returns the exit code."""
    check_store(tracking_uri)  # missing, corrupted or not answering: one line, not SQLAlchemy's traceback
    check_address(host, port)
    experiment_id = experiment_id_of(tracking_uri, experiment)
    if host != LOOPBACK:
        print(f"loopscale: warning: the UI will listen on {host}, reachable by others on that network; MLflow's "
              "UI has no login unless you run the basic-auth app (see README)", file=sys.stderr)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        proc, base = start_server(tracking_uri, host, port)
    except StoppedStarting as stop:  # start_server stopped the half-started server
        print(f"MLflow UI stopped: it was serving on {stop.serving} but had not yet answered loopscale's check of "
              f"{stop.serving}/health" if stop.serving else "MLflow UI stopped before it started.", file=sys.stderr)
        return 130
    try:  # from here on a Ctrl-C stops the server it started, the line below included
        print(f"MLflow UI: {experiment_url(base, experiment_id)}  (store {redact(tracking_uri)}; Ctrl-C stops it)",
              flush=True)
        proc.wait()
    except KeyboardInterrupt:
        pass
    finally:
        stop_server(proc)
    print("MLflow UI stopped.")
    return 0
