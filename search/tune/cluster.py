"""The Ray the sweep runs on: started here or joined (``start_ray``, with the spec's architecture shipped to every
worker: ``runtime_env``), checked to hold every trial it must run (``check_trials_fit``), and Ray's, Optuna's and
MLflow's logging quieted unless ``--verbose``."""

from __future__ import annotations

import logging
import math
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager

import optuna
import ray

from loopscale.model import BUILTIN

from ..spec import SweepSpec
from ..stopping import SweepInterrupted, signal_name, signals_noted
from . import live

# What a Ray started here (never a cluster joined) is told through the environment, which its processes and this
# driver's core worker read as they start (Ray's RAY_<setting> convention):
LOCAL_RAY_ENV = {
    # a store that is gone is waited for 5 s, not Ray's default 60: a Ray started here has no fault-tolerant
    # store, so once its GCS is gone (a SIGTERM to the whole process group ends it with the driver) nothing can
    # reconnect, and the wait only delays the driver's exit (at full CPU)
    "RAY_gcs_rpc_server_reconnect_timeout_s": "5",
    # no idle workers started ahead, one per CPU: Tune's trial actors carry a runtime environment and start
    # workers of their own, so those were never used (~0.3 CPU-s each to start, measured on 2 CPUs)
    "RAY_prestart_worker_first_driver": "0",
}


def start_ray(spec: SweepSpec, verbose: bool) -> bool:
    """Connect to ``spec.placement.address`` (or RAY_ADDRESS) or start a local Ray; False when one is already up.

    A signal while Ray starts (seconds) stops the sweep like any other (``live.STOP``), although ``ray.init``
    takes SIGTERM over: at its start it installs ``sys.exit(15)`` as the handler (turned back into
    ``SweepInterrupted`` here), and once connected the driver's Ray core would install a C++ crash handler that
    dumps a stack and may abort on SIGTERM, unless ``RAY_DISABLE_FAILURE_SIGNAL_HANDLER`` was set when Ray was
    imported (it is, in this package's ``__init__``; the processes of a Ray started here then go without those C++
    stack dumps too). A signal whose exception Python swallowed there (``signals_noted``) stops it too.
    Whatever ``ray.init`` started before a signal is shut down; afterwards ``live.STOP`` holds both signals again."""
    if ray.is_initialized():
        return False
    local = not (spec.placement.address or os.environ.get("RAY_ADDRESS"))
    with signals_noted() as noted, _local_ray_env(local):
        try:
            ray.init(address=spec.placement.address, include_dashboard=False, log_to_driver=verbose,
                     logging_level="INFO" if verbose else "ERROR", runtime_env=runtime_env(spec))
            live.STOP.install()
        except SystemExit as exc:  # Ray's own SIGTERM handler
            ray.shutdown()
            if exc.code != signal.SIGTERM:
                raise
            raise SweepInterrupted(signal.SIGTERM, "interrupted by SIGTERM") from None
        except BaseException:  # SweepInterrupted from live.STOP's SIGINT handler, or Ray failing to start
            ray.shutdown()
            raise
    lost = [s for s in noted if s in (signal.SIGINT, signal.SIGTERM)]
    if lost:
        ray.shutdown()
        raise SweepInterrupted(lost[0], f"interrupted by {signal_name(lost[0])}")
    return True


@contextmanager
def _local_ray_env(local: bool) -> Iterator[None]:
    """While ``ray.init`` starts a local Ray: ``LOCAL_RAY_ENV``, each setting the user has not set already. The
    environment is put back afterwards: a cluster joined later keeps Ray's defaults."""
    added = {name: value for name, value in LOCAL_RAY_ENV.items() if local and name not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for name in added:
            del os.environ[name]


def runtime_env(spec: SweepSpec) -> dict | None:
    """The job's Ray runtime environment: the architecture's file or package as ``py_modules``, uploaded to the
    cluster and importable on every worker whether or not it shares this machine's file system
    (model/architecture.py imports it by name there); None for the built-in and installed packages."""
    name = spec.grid.model(spec.grid.s_min, spec.grid.recurrences[0]).architecture
    if name == BUILTIN:  # every worker has it; and the driver of a simulated sweep then never loads torch
        return None
    from loopscale.model import architecture  # torch

    modules = architecture.ray_modules(name)
    return {"py_modules": modules} if modules else None


def check_trials_fit(spec: SweepSpec, can_grow: bool) -> None:
    """A trial that asks for more CPUs or GPUs than any live node of the Ray cluster has would wait forever.
    On a Ray this run started itself (this machine, which cannot grow) that is one error line before anything
    is written; on a cluster someone else runs, which may autoscale, it is a warning."""
    nodes = [node["Resources"] for node in ray.nodes() if node.get("Alive")]
    largest_cpu = max((res.get("CPU", 0.0) for res in nodes), default=0.0)
    largest_gpu = max((res.get("GPU", 0.0) for res in nodes), default=0.0)
    for stage in ("calibrate", "search") if spec.training.calibrate is not None else ("search",):
        need, workers = spec.resources(stage), spec.workers_of(stage)
        # every worker of a data-parallel trial fits some node, and the cluster holds all of them at once
        room = sum(min(res.get("CPU", 0.0) // need["cpu"],
                       res.get("GPU", 0.0) // need["gpu"] if need["gpu"] > 0 else math.inf) for res in nodes)
        if room >= workers:
            continue
        if workers == 1 or room == 0:
            message = (f"[resources] asks for cpus = {need['cpu']:g}, gpus = {need['gpu']:g} per {stage} trial, but "
                       f"no node of the Ray cluster has that much (the most: {largest_cpu:g} CPUs, "
                       f"{largest_gpu:g} GPUs)")
        else:
            message = (f"[resources] asks for {workers} workers of cpus = {need['cpu']:g}, gpus = {need['gpu']:g} "
                       f"per {stage} trial, but the Ray cluster's nodes hold only {room:g} such workers at once")
        if not can_grow:
            raise ValueError(message + "; no trial could ever start")
        print(f"warning: {message}; trials wait until a node that big joins", flush=True)


def quiet(verbose: bool) -> None:
    """Quiet Ray, Optuna and MLflow unless --verbose."""
    if not verbose:
        os.environ["RAY_AIR_NEW_OUTPUT"] = "0"  # the old console honours verbose=0
        # Tune logs a traceback for every state upload that fails (a full disk), MLflow's sqlite store one for
        # every locked or failing write; the sweep says it in one line (``StoreFailure``)
        for name in ("ray.tune", "ray.train", "mlflow.store"):
            logging.getLogger(name).setLevel(logging.CRITICAL)
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        logging.getLogger("mlflow").setLevel(logging.WARNING)

