"""Secrets never reach MLflow, the servers the project starts listen on loopback only, and its local Ray
refuses clients without its token.

A small simulated sweep and its analysis run against MLflow's basic-auth server (tests/servers.py): the search
with the password in the tracking URI, the analysis with it in MLFLOW_TRACKING_USERNAME/PASSWORD, and a spec
holding secret-looking keys (``data.token`` in an inline table and again in a comment, ``recipe.api_key``).
Then every param, tag and run name of every run of the experiment (deleted ones included), every artifact file
in the server's artifact store, the server's raw database, the console output, the analysis output and the
local Tune state are searched for the secret strings. The server is also checked to listen on loopback only.
Ray's servers cannot be held to loopback, so the local Ray a sweep starts is checked to refuse drivers without
its token (none, or a wrong one) and to accept one with it.
"""

from __future__ import annotations

import os
import secrets
import socket
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import ray
from mlflow.entities import ViewType
from mlflow.tracking import MlflowClient

from loopscale.search import SweepSpec
from loopscale.search.cli import build_parser, main
from loopscale.analysis.store import SUPPRESS_URLS
from loopscale.search.tune.cluster import start_ray
from loopscale.search.ui import LOOPBACK, server_command
from servers import mlflow_server
from test_kill_resume import ray_dir  # noqa: F401  (a fixture)
from test_spec import base_spec, to_toml, write_spec

PASSWORD = f"pw-{secrets.token_hex(8)}"  # the tracking server's admin password
TOKEN = f"hf_{secrets.token_hex(8)}"  # a data token in the spec
API_KEY = f"sk-{secrets.token_hex(8)}"  # a recipe API key in the spec
SECRETS = (PASSWORD, TOKEN, API_KEY)


def listening_addresses(port: int) -> set[str]:
    """Local addresses with a socket in LISTEN state on ``port`` (from /proc/net/tcp and tcp6)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            address, hex_port = fields[1].split(":")
            if fields[3] != "0A" or int(hex_port, 16) != port:  # 0A: LISTEN
                continue
            if len(address) == 8:
                found.add(socket.inet_ntop(socket.AF_INET, struct.pack("<I", int(address, 16))))
            else:  # four little-endian 32-bit words
                words = struct.pack("<4I", *(int(address[i:i + 8], 16) for i in range(0, 32, 8)))
                found.add(socket.inet_ntop(socket.AF_INET6, words))
    return found


def assert_loopback_only(base_url: str) -> None:
    port = int(base_url.rsplit(":", 1)[1])
    assert listening_addresses(port) == {LOOPBACK}, listening_addresses(port)
    others = {info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)} - {LOOPBACK}
    for address in others:  # and the machine's other addresses really refuse it
        with socket.socket() as sock, pytest.raises(OSError):
            sock.settimeout(3)
            sock.connect((address, port))


def test_ui_and_servers_default_to_loopback():
    """What the commands bind to; that the launcher's default really listens on loopback only is checked on a
    running server (``assert_loopback_only`` in test_no_secret_reaches_params_tags_or_artifacts)."""
    cmd = server_command(LOOPBACK, 5000)
    assert cmd[cmd.index("--host") + 1] == LOOPBACK and "--allowed-hosts" not in cmd
    assert build_parser().parse_args(["ui"]).host == LOOPBACK  # `loopscale ui` without --host


def every_text_of(runs: list) -> list[str]:
    """Names, params and tags of runs."""
    return [text for run in runs for text in (run.info.run_name or "", *map(str, run.data.params.items()),
                                              *map(str, run.data.tags.items()))]


def files_text(root: Path) -> str:
    return "\n".join(f.read_bytes().decode(errors="replace") for f in sorted(root.rglob("*")) if f.is_file())


@pytest.mark.integration
@pytest.mark.slow
def test_no_secret_reaches_params_tags_or_artifacts(tmp_path, monkeypatch, capsys):
    config = tmp_path / "basic_auth.ini"
    config.write_text("[mlflow]\ndefault_permission = READ\n"
                      f"database_uri = sqlite:///{tmp_path}/auth.db\n"
                      f"admin_username = admin\nadmin_password = {PASSWORD}\n"
                      "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n")
    for name in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_URI", SUPPRESS_URLS):
        monkeypatch.delenv(name, raising=False)
    with mlflow_server(f"sqlite:///{tmp_path / 'server.db'}", str(tmp_path / "server-artifacts"),
                       auth_config=str(config)) as url:
        assert_loopback_only(url)  # the project's server launcher, as `loopscale ui` uses it
        with_password = url.replace("http://", f"http://admin:{PASSWORD}@")
        spec = base_spec(tmp_path, name="secrets", tracking_uri=with_password, budgets=[1e12, 1e13],
                         recurrences=[1, 2], trials_per_cell=2, template={"vocab_size": 256},
                         recipe={"api_key": API_KEY, "hub_token": TOKEN})
        # a simulated sweep checks [data] too (its vocabulary is the design's), so the table holds only real keys
        text = (f"# the hub token, for later: {TOKEN}\n"
                'data = { source = "hub", name = "org/set" }\n' + to_toml(spec))
        path = tmp_path / "spec.toml"
        path.write_text(text)

        assert main(["search", str(path)]) == 0  # credentials in the URI
        monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "admin")
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", PASSWORD)
        out = tmp_path / "analysis"
        fit = ["--n-starts", "30", "--n-bootstrap", "0", "--out", str(out)]
        # credentials in the environment (reading only: every request to the auth app costs a password hash)
        assert main(["analyze", "--experiment", "secrets", "--tracking-uri", url, "--no-log", *fit]) == 0
        # in the URI, logging the analysis run
        assert main(["analyze", "--experiment", "secrets", "--tracking-uri", with_password, *fit]) == 0
        console = capsys.readouterr()

        client = MlflowClient(url)
        experiment = client.get_experiment_by_name("secrets")
        runs = client.search_runs([experiment.experiment_id], run_view_type=ViewType.ALL, max_results=1000)
        kinds = sorted(r.data.tags.get("loopscale.kind", "") for r in runs)
        assert kinds == ["analysis", "sweep"] + ["trial"] * 8
        texts = [experiment.name, *map(str, experiment.tags.items()), *every_text_of(runs)]
        # every artifact went through the server to its store (read below, file by file), none elsewhere
        assert all(r.info.artifact_uri.startswith("mlflow-artifacts:/") for r in runs)

    artifacts = {str(f.relative_to(tmp_path)): f.read_bytes().decode(errors="replace")
                 for f in sorted((tmp_path / "server-artifacts").rglob("*")) if f.is_file()}
    store = (tmp_path / "server.db").read_bytes().decode(errors="replace")
    everything = "\n".join([*texts, *artifacts.values(), console.out, console.err, store, files_text(out),
                            files_text(tmp_path / "tune")])
    for secret in SECRETS:
        assert secret not in everything
    # the places a leak would show up were really searched: the logged spec, the analysis output, the console
    (spec_artifact,) = [text for name, text in artifacts.items() if name.endswith("spec.toml")]
    assert spec_artifact.startswith("# the hub token, for later: ***")
    assert 'token = "***"' in spec_artifact and 'api_key = "***"' in spec_artifact
    assert "admin:***@" in spec_artifact and "admin:***@" in console.out and "[search 8/8]" in console.out
    assert sum(name.endswith("summary.json") for name in artifacts) == 1  # the analysis run's artifacts


CONNECT = ("import sys, ray\n"
           "ray.init(address=sys.argv[1], log_to_driver=False, logging_level='ERROR')\n"
           "print('connected to', ray.get_runtime_context().get_node_id())\n")


def connect(address: str, home: Path, token: str | None) -> subprocess.Popen:
    """A Ray driver in a fresh process, as another user of the machine would start one: its own HOME (so not
    the token file of ours) and the token given, or none."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(HOME=str(home), **({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token} if token else {}))
    return subprocess.Popen([sys.executable, "-c", CONNECT, address], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


@pytest.mark.integration
@pytest.mark.waits
def test_the_local_ray_a_sweep_starts_refuses_clients_without_its_token(tmp_path, ray_dir, monkeypatch):
    """Ray's servers listen on every interface (Ray's choice, not ours to change), so the local Ray that
    ``loopscale search`` starts must refuse anyone without its token, at the machine's own address too."""
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)  # Ray's default for a local cluster, as a user has it
    monkeypatch.setenv("RAY_TMPDIR", ray_dir)
    spec = SweepSpec.from_toml(write_spec(tmp_path))
    assert start_ray(spec, verbose=False)
    try:
        address = ray.get_runtime_context().gcs_address
        host, port = address.rsplit(":", 1)
        assert listening_addresses(int(port)) - {LOOPBACK, host}  # it does listen beyond loopback ...
        token = Path(os.environ.get("RAY_AUTH_TOKEN_PATH", Path.home() / ".ray" / "auth_token")).read_text().strip()
        home = tmp_path / "home"
        home.mkdir()
        clients = {who: connect(address, home, given) for who, given in (  # side by side: a refusal takes ~20 s
            ("no token", None), ("a wrong token", secrets.token_hex(32)), ("the token", token))}
        outcome = {who: (*client.communicate(timeout=180), client.returncode) for who, client in clients.items()}
        for who in ("no token", "a wrong token"):  # ... but refuses these
            out, err, code = outcome[who]
            assert code != 0 and "connected to" not in out, who
            assert "Unauthenticated: RPC error: InvalidAuthToken" in err, (who, err[-2000:])
        out, err, code = outcome["the token"]
        assert code == 0 and "connected to" in out, err[-2000:]
    finally:
        ray.shutdown()


# ---- one redaction for every path -----------------------------------------------------------------------
LEAKY_URIS = [  # forms the old regex missed: no user, '@' (and '/', ':') inside the password
    f"http://:{PASSWORD}@127.0.0.1:{{port}}",
    f"http://u:p@{PASSWORD}@127.0.0.1:{{port}}",
    f"http://bob:{PASSWORD}:x/y@127.0.0.1:{{port}}",
]


@pytest.mark.parametrize("uri", LEAKY_URIS, ids=["empty user", "@ in password", "/ and : in password"])
def test_no_form_of_uri_password_is_printed_or_put_in_the_spec_artifact(tmp_path, monkeypatch, capsys, uri):
    from loopscale.analysis.store import redact
    from loopscale.search.tracking import redact_text

    monkeypatch.chdir(tmp_path)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        uri = uri.format(port=sock.getsockname()[1])  # nothing listens there once the socket closes
    assert PASSWORD not in redact(uri) and redact(uri).endswith("@127.0.0.1:" + uri.rpartition(":")[2])
    assert PASSWORD not in redact_text(f'name = "t"\ntracking_uri = "{uri}"\n')  # the spec.toml artifact
    for argv in (["analyze", "--experiment", "t", "--tracking-uri", uri],
                 ["export", "--experiment", "t", "--tracking-uri", uri],
                 ["ui", "--tracking-uri", uri, "--port", "1"],
                 ["search", str(write_spec(tmp_path)), "--tracking-uri", uri]):
        assert main(argv) == 2
        captured = capsys.readouterr()
        assert "unreachable" in captured.err and PASSWORD not in captured.out + captured.err, argv


def test_the_ui_server_gets_the_store_from_its_environment_never_its_command_line():
    assert not any("://" in part for part in server_command(LOOPBACK, 5000))
    assert "--backend-store-uri" not in server_command(LOOPBACK, 5000)
