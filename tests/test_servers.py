"""The shared-server set-up of the README: a PostgreSQL-backed MLflow server, and the basic-auth app refusing
clients without credentials. Real servers on loopback."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from tests.servers import free_port, mlflow_server, postgres_database

pytestmark = [pytest.mark.integration, pytest.mark.slow]

LOG_ONE_RUN = """
import mlflow, sys
mlflow.set_tracking_uri(sys.argv[1])
mlflow.set_experiment("shared")
with mlflow.start_run(run_name="probe"):
    mlflow.log_param("width", 64)
    mlflow.log_metric("val_loss", 2.5)
client = mlflow.MlflowClient()
runs = client.search_runs([mlflow.get_experiment_by_name("shared").experiment_id])
print(len(runs), runs[0].data.metrics["val_loss"])
"""


def log_one_run(url: str, **env: str) -> subprocess.CompletedProcess:
    """Log through a fresh client process, so credentials come only from the environment given here."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_TRACKING_")}
    return subprocess.run([sys.executable, "-c", LOG_ONE_RUN, url], env={**clean, **env}, capture_output=True,
                          text=True, timeout=120)


def test_postgres_backed_tracking_server(tmp_path):
    with postgres_database() as db, mlflow_server(db, str(tmp_path / "artifacts")) as url:
        done = log_one_run(url)
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines()[-1].split() == ["1", "2.5"]


def test_basic_auth_refuses_anonymous_and_accepts_credentials(tmp_path):
    config = tmp_path / "basic_auth.ini"
    config.write_text("[mlflow]\ndefault_permission = READ\n"
                      f"database_uri = sqlite:///{tmp_path}/auth.db\n"
                      "admin_username = admin\nadmin_password = s3cret-Passw0rd\n"
                      "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n")
    with mlflow_server(f"sqlite:///{tmp_path}/mlflow.db", str(tmp_path / "artifacts"),
                       auth_config=str(config)) as url:
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{url}/api/2.0/mlflow/experiments/search?max_results=10", timeout=10)
        assert refused.value.code == 401

        anonymous = log_one_run(url)
        assert anonymous.returncode != 0 and "401" in anonymous.stderr

        wrong = log_one_run(url, MLFLOW_TRACKING_USERNAME="admin", MLFLOW_TRACKING_PASSWORD="guess")
        assert wrong.returncode != 0

        admin = log_one_run(url, MLFLOW_TRACKING_USERNAME="admin", MLFLOW_TRACKING_PASSWORD="s3cret-Passw0rd")
        assert admin.returncode == 0, admin.stderr
        assert admin.stdout.splitlines()[-1].split() == ["1", "2.5"]


def test_a_server_whose_port_is_taken_as_it_starts_says_why(tmp_path, monkeypatch):
    """The port free when checked, then taken before the server binds it (another program; a second test suite
    beside this one): the error names the failed bind, not the server's last log line ("Application shutdown
    complete"), so the caller can tell it from a broken store."""
    from loopscale.search import ui

    monkeypatch.setattr(ui, "port_is_free", lambda host, port: True)  # the check passed; then the port went
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port := free_port()))
        taken.listen(1)
        with pytest.raises(RuntimeError, match=r"before it answered: .*address already in use"):
            ui.start_server(f"sqlite:///{tmp_path / 'mlflow.db'}", port=port, timeout_s=60)
