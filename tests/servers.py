"""Real servers for tests: a throwaway PostgreSQL cluster and MLflow tracking servers on loopback.

PostgreSQL comes from Debian's ``postgresql`` package (tests/run.sh installs it); the cluster lives in a temporary
directory owned by the ``postgres`` user (initdb refuses to run as root), listens on 127.0.0.1 only and is
removed afterwards.
"""

from __future__ import annotations

import contextlib
import glob
import secrets
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator

from loopscale.search.ui import start_server, stop_server


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def postgres_bin(name: str) -> str | None:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return found[-1] if found else None


def as_postgres(*cmd: str) -> None:
    subprocess.run(["runuser", "-u", "postgres", "--", *cmd], check=True, capture_output=True, timeout=120)


@contextlib.contextmanager
def postgres_database(name: str = "mlflow") -> Iterator[str]:
    """Start a PostgreSQL cluster on a free loopback port; yields a SQLAlchemy URI of database ``name``."""
    initdb, pg_ctl = postgres_bin("initdb"), postgres_bin("pg_ctl")
    if initdb is None or pg_ctl is None:
        raise RuntimeError("PostgreSQL server binaries not found: apt-get install postgresql (tests/run.sh does)")
    root = tempfile.mkdtemp(prefix="loopscale-pg-", dir="/tmp")
    shutil.chown(root, "postgres", "postgres")
    data, port = f"{root}/data", free_port()
    as_postgres(initdb, "-D", data, "-A", "trust", "-U", "postgres", "--no-sync")
    as_postgres(pg_ctl, "-D", data, "-l", f"{root}/log", "-w", "-o",
                f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off", "start")
    try:
        as_postgres(postgres_bin("createdb") or "createdb", "-h", "127.0.0.1", "-p", str(port), name)
        yield f"postgresql://postgres@127.0.0.1:{port}/{name}"
    finally:
        as_postgres(pg_ctl, "-D", data, "-m", "immediate", "-w", "stop")
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def mlflow_server(backend_uri: str, artifacts: str, *, auth_config: str | None = None,
                  env: dict[str, str] | None = None) -> Iterator[str]:
    """An MLflow tracking server on a free loopback port that proxies artifacts to ``artifacts``; yields its URL.

    ``auth_config``: path of a basic-auth ini file; the server then runs MLflow's ``basic-auth`` app."""
    extra: tuple[str, ...] = ("--artifacts-destination", artifacts)
    env = dict(env or {})
    if auth_config:
        extra += ("--app-name", "basic-auth")
        env["MLFLOW_AUTH_CONFIG_PATH"] = auth_config
        env.setdefault("MLFLOW_FLASK_SERVER_SECRET_KEY", secrets.token_hex(16))  # the auth app's CSRF key
    for attempt in range(3):
        try:
            proc, base = start_server(backend_uri, port=free_port(), extra_args=extra, env=env, timeout_s=120)
            break
        except (RuntimeError, ValueError) as exc:
            # another process (a second suite's Ray or server) took the port between its choice and the server's
            # bind: a new port, not a longer wait
            if attempt == 2 or "in use" not in str(exc).lower():
                raise
    try:
        yield base
    finally:
        stop_server(proc)
