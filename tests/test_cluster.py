"""Many machines, on one: a Ray cluster of a head with no CPUs and two 1-CPU worker nodes
(``ray.cluster_utils.Cluster``) runs a simulated sweep through ``loopscale search --address``, logging to an MLflow
tracking server on loopback that is backed by a real PostgreSQL server (tests/servers.py).

Every trial must run on a worker node (the head has no CPU), both workers must get trials, and every run must
reach PostgreSQL through the server with the id of the node it ran on (the ``node`` tag). Starting three Ray
nodes, PostgreSQL and MLflow takes about a minute on 2 cores, so this is the one test that does it.

A second cluster has a worker node that cannot see the folder of a spec's own architecture (its own mount
namespace, an empty tmpfs over the folder): the sweep's training trials run there from the copy Ray ships in the
job's runtime environment, as on machines that share no file system with the driver.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from loopscale.analysis.store import trial_numbers
from loopscale.model import account
from loopscale.search import SweepSpec
from loopscale.search.cli import main
from servers import mlflow_server, postgres_bin, postgres_database
from test_resume import processes_using
from test_spec import write_spec

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.usefixtures("testing_aids")]


def _shut_down(cluster, temp: str) -> None:
    """The cluster, then anything ``cluster.shutdown()`` left behind (found by its private temp dir)."""
    cluster.shutdown()
    for pid in processes_using(temp):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture
def cluster(monkeypatch):
    """Head (0 CPUs) + two workers (1 CPU each); every process is found by its private temp dir afterwards."""
    from ray.cluster_utils import Cluster

    temp = tempfile.mkdtemp(prefix="lsc", dir="/tmp")  # short: Ray's socket paths must stay under 108 bytes
    monkeypatch.setenv("RAY_TMPDIR", temp)
    cluster = Cluster(initialize_head=True, connect=False, head_node_args={"num_cpus": 0})
    try:
        workers = [cluster.add_node(num_cpus=1) for _ in range(2)]
        cluster.wait_for_nodes()
        yield cluster, workers
    finally:
        _shut_down(cluster, temp)


def count_rows(database_uri: str, sql: str) -> int:
    """Ask PostgreSQL itself (not MLflow) how many rows a query returns."""
    url = urllib.parse.urlsplit(database_uri)
    done = subprocess.run(["runuser", "-u", "postgres", "--", postgres_bin("psql") or "psql", "-h", url.hostname,
                           "-p", str(url.port), "-d", url.path.lstrip("/"), "-tAc", sql],
                          check=True, capture_output=True, text=True, timeout=60)
    return int(done.stdout.strip())


def test_a_sweep_spreads_over_two_worker_nodes_and_logs_to_a_postgres_backed_server(tmp_path, cluster, capsys):
    ray_cluster, workers = cluster
    with postgres_database() as database, mlflow_server(database, str(tmp_path / "artifacts")) as url:
        # the first trial holds its worker's only CPU until a second trial has started, which therefore runs on
        # the other worker: both get trials however slowly a loaded machine starts their processes (without it,
        # Tune hands a trial still waiting for a process to a worker that is free, and one worker may take all)
        path = write_spec(tmp_path, tracking_uri=url, budgets=[1e12, 1e13], recurrences=[1, 2], trials_per_cell=2,
                          testing={"journal": str(tmp_path / "journal.jsonl"), "rendezvous": 2})
        spec = SweepSpec.from_toml(path)
        assert main(["search", str(path), "--address", ray_cluster.address]) == 0
        assert "[search 8/8]" in capsys.readouterr().out

        client = MlflowClient(url)
        experiment = client.get_experiment_by_name(spec.name)
        runs = client.search_runs([experiment.experiment_id], "tags.`loopscale.kind` = 'trial'")
        assert len(runs) == spec.planned_trials() == 8
        assert all(r.info.status == "FINISHED" and r.data.tags["status"] == "ok" for r in runs)
        nodes = [r.data.tags["node"] for r in runs]
        assert set(nodes) == {w.node_id for w in workers}  # both workers, never the CPU-less head
        assert ray_cluster.head_node.node_id not in nodes

        # the runs live in PostgreSQL: the sweep's parent run plus one per trial, with their node tags
        assert count_rows(database, "SELECT count(*) FROM runs") == 9
        assert count_rows(database, "SELECT count(*) FROM tags WHERE key = 'node'") == 8
        (parent,) = client.search_runs([experiment.experiment_id], "tags.`loopscale.kind` = 'sweep'")
        assert [a.path for a in client.list_artifacts(parent.info.run_id)] == ["flops_spent.json", "spec.toml"]
    assert not (tmp_path / "mlflow.db").exists()


@pytest.fixture
def blind_cluster(monkeypatch, tmp_path):
    """Head (0 CPUs) + one 1-CPU worker node that cannot see ``tmp_path / "arch"``: the worker's Ray processes run
    in their own mount namespace with an empty tmpfs over that folder, as a machine without the user's files."""
    from ray.cluster_utils import Cluster

    hidden = tmp_path / "arch"
    hidden.mkdir()
    temp = tempfile.mkdtemp(prefix="lsb", dir="/tmp")
    monkeypatch.setenv("RAY_TMPDIR", temp)
    cluster = Cluster(initialize_head=True, connect=False, head_node_args={"num_cpus": 0})
    worker = BlindNode(cluster.address, hidden, tmp_path / "worker.log")
    try:
        yield cluster, hidden, worker
    finally:
        worker.stop()
        _shut_down(cluster, temp)


class BlindNode:
    """The worker node's ``ray start --block`` in its own mount namespace. Ray gives a starting node 30 s to
    register with the head (a constant in ray/_private/node.py) and exits if it has not: on a loaded machine
    that happens, so a node that ended before it joined is started again, its output kept for the failure."""

    STARTS = 3

    def __init__(self, address: str, hidden: Path, log: Path):
        self.command = ["unshare", "--mount", "sh", "-c", 'mount -t tmpfs none "$1" && shift && exec "$@"', "sh",
                        str(hidden), sys.executable, "-m", "ray.scripts.scripts", "start", "--address", address,
                        "--num-cpus", "1", "--block"]
        self.log, self.starts = log, 0
        self._start()

    def _start(self) -> None:
        with open(self.log, "a") as out:
            self.process = subprocess.Popen(self.command, start_new_session=True, stdout=out,
                                            stderr=subprocess.STDOUT)
        self.starts += 1

    def joined(self, ray) -> dict:
        """The node once it is alive in the cluster; restarted if its start-up ended it first."""
        while True:
            alive = [n for n in ray.nodes() if n["Alive"] and n["Resources"].get("CPU")]
            if alive:
                return alive[0]
            if self.process.poll() is not None:
                assert self.starts < self.STARTS, f"the worker node never joined:\n{self.log.read_text()[-3000:]}"
                self._start()
            time.sleep(0.2)

    def stop(self) -> None:
        os.killpg(self.process.pid, signal.SIGTERM)
        self.process.wait(timeout=60)


def test_a_worker_node_without_the_architecture_file_trains_it_from_ray_s_copy(tmp_path, blind_cluster):
    """A spec's own architecture reaches a node that lacks the user's files through Ray's runtime environment
    (``py_modules``): the node cannot see the file, and the sweep's training trials run there all the same."""
    import ray

    cluster, hidden, node = blind_cluster
    shutil.copy(Path(__file__).parent / "fixtures" / "tiny_loop.py", hidden / "tiny_loop.py")
    path = write_spec(tmp_path, objective="train", budgets=[2e9], recurrences=[2], trials_per_cell=2,
                      sampler="grid", val_tokens=2048, data={"source": "kjv"}, widths={"s_min": 1, "s_max": 2},
                      template={"architecture": "arch/tiny_loop.py:tiny_loop"})
    spec = SweepSpec.from_toml(path)
    ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False)
    try:
        worker = node.joined(ray)

        @ray.remote(num_cpus=1)
        def sees(file: str) -> bool:
            return Path(file).exists()

        assert ray.get(sees.remote(str(hidden / "tiny_loop.py")), timeout=300) is False
    finally:
        ray.shutdown()
    assert main(["search", str(path), "--address", cluster.address]) == 0
    client = MlflowClient(spec.placement.tracking_uri)
    runs = client.search_runs([client.get_experiment_by_name(spec.name).experiment_id],
                              "tags.`loopscale.kind` = 'trial'")
    assert len(runs) == spec.planned_trials() == 2
    for run in runs:
        assert run.data.tags["status"] == "ok", run.data.tags.get("reason")
        assert run.data.tags["node"] == worker["NodeID"]
        assert trial_numbers(run)["N_once"] == account(spec.grid.model(float(trial_numbers(run)["s"]), 2)).N_once
