"""examples/slurm/loopscale.sbatch run here without SLURM: ``srun`` and ``scontrol`` stand-ins run each step on
this machine, so the script's own Ray start makes a 2-node Ray cluster of two raylets (each node its own port
set from the job id), and the sweep it runs with ``--resume`` ends complete with trials on both nodes."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from loopscale.search import SweepSpec
from loopscale.search.ui import port_is_free
from test_kill_resume import kill_leftovers, trial_runs
from test_spec import base_spec, to_toml

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.usefixtures("testing_aids")]
SCRIPT = Path(__file__).resolve().parent.parent / "examples" / "slurm" / "loopscale.sbatch"
# the script's ports: a block of 2,000 from 10000 + (job id % 25) * 2000, of which two nodes use the first 250
PORT_BLOCKS, BLOCK_PORTS = 25, 250


def job_id_with_free_ports() -> int:
    """A job id whose port block is free on this machine now, drawn at random among the free ones: a fixed id
    gave every run of the script here the same ports, and a second suite beside this one started its Ray head
    on them (the head then found another session's name in its store and died)."""
    def free(block: int) -> bool:
        first = 10000 + block * 2000
        return all(port_is_free("", port) for port in range(first, first + BLOCK_PORTS))

    blocks = random.sample(range(PORT_BLOCKS), PORT_BLOCKS)
    return 4200 + next(block for block in blocks if free(block))  # 4200 % 25 == 0: block number = id - 4200


STAND_INS = {
    # srun [options] -w NODE COMMAND...: the command, here
    "srun": '#!/bin/bash\nwhile [[ $1 == -* ]]; do [[ $1 == -w ]] && shift; shift; done\nexec "$@"\n',
    "scontrol": '#!/bin/bash\n[[ $1 == show && $2 == hostnames ]] && printf "node1\\nnode2\\n"\n',
    "ray": f'#!/bin/bash\nexec {sys.executable} -m ray.scripts.scripts "$@"\n',
}


@pytest.fixture
def fake_slurm(tmp_path):
    """A bin folder of stand-ins, a short Ray temp dir and the job's id (its requeue keeps it, as SLURM's does);
    every process left under the folders is killed after."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in STAND_INS.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    ray_tmp = tempfile.mkdtemp(prefix="lss", dir="/tmp")
    yield bin_dir, ray_tmp, job_id_with_free_ports()
    kill_leftovers(ray_tmp)
    shutil.rmtree(ray_tmp, ignore_errors=True)


def write_sweep(tmp_path: Path, trials_per_cell: int) -> Path:
    """Simulated trials of a second each, two at a time (one per node: each has one CPU). The first two wait for
    each other (``[testing] rendezvous``), so the second node runs one however late it joins: on a machine
    running two suites all four ran on the first, the second node not yet in the cluster."""
    folder = tmp_path / "sweep"
    folder.mkdir()
    spec_path = folder / "spec.toml"
    aids = {"delay_s": 1.0, "journal": str(folder / "journal.jsonl"), "rendezvous": 2}
    spec_path.write_text(to_toml(base_spec(folder, budgets=[1e12], recurrences=[1, 2],
                                           trials_per_cell=trials_per_cell, sampler="grid",
                                           testing=aids, resources={"max_concurrent": 2})))
    return spec_path


def script(spec_path: Path, fake_slurm: tuple[Path, str, int]) -> subprocess.Popen:
    """The sbatch script as SLURM would run it on two nodes of one CPU (no requeue: there is no SLURM to take
    it)."""
    bin_dir, ray_tmp, job_id = fake_slurm
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": str(job_id),
           "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_CPUS_PER_TASK": "1", "LOOPSCALE_RAY_TMP": ray_tmp,
           "LOOPSCALE": f"{sys.executable} -m loopscale.search.cli", "LOOPSCALE_REQUEUE": "0"}
    env.pop("RAY_ADDRESS", None)
    return subprocess.Popen(["bash", str(SCRIPT), str(spec_path)], cwd=spec_path.parent, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def test_the_sbatch_script_starts_a_two_node_ray_cluster_and_completes_the_sweep(tmp_path, fake_slurm):
    spec_path = write_sweep(tmp_path, trials_per_cell=2)
    job = script(spec_path, fake_slurm)
    output, _ = job.communicate(timeout=600)
    assert job.returncode == 0, output[-4000:]
    runs = trial_runs(SweepSpec.from_toml(spec_path))
    assert len(runs) == 4 and all(r.data.tags["status"] == "ok" for r in runs)
    assert len({r.data.tags["node"] for r in runs}) == 2  # two trials at a time, one CPU a node: both nodes


def test_a_preempted_job_stops_cleanly_and_its_requeue_finishes_the_sweep(tmp_path, fake_slurm):
    spec_path = write_sweep(tmp_path, trials_per_cell=6)
    job = script(spec_path, fake_slurm)
    seen = []
    for line in job.stdout:  # SLURM's SIGTERM (--signal=B:TERM) once the first trial has finished
        seen.append(line)
        if line.startswith("[search "):
            job.send_signal(signal.SIGTERM)
            break
    output = "".join(seen) + job.communicate(timeout=300)[0]
    assert job.returncode == 128 + signal.SIGTERM, output[-4000:]
    spec = SweepSpec.from_toml(spec_path)
    assert len([r for r in trial_runs(spec) if r.info.status == "FINISHED"]) < 12, "the job ended the sweep"

    requeued = script(spec_path, fake_slurm)  # the requeued job: the same script, the same command
    output, _ = requeued.communicate(timeout=600)
    assert requeued.returncode == 0, output[-4000:]
    runs = trial_runs(spec)
    assert sorted(r.data.tags["trial_key"] for r in runs) == sorted({r.data.tags["trial_key"] for r in runs})
    assert len(runs) == 12 and all(r.info.status == "FINISHED" and r.data.tags["status"] == "ok" for r in runs)
