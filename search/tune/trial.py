"""The trial on a Tune worker (``run_trial``): simulate or train, data-parallel through Ray Train when it has
several workers, its result checked and kept as a receipt; a receipt the disk refuses waits in the Ray
cluster's key-value store for the driver (``hold_unsaved``, ``log_unsaved``).

A training trial with ``[resources] workers = k > 1`` runs data-parallel through Ray Train inside its Tune trial
(``train_data_parallel``): a ``TorchTrainer`` of k workers (gloo on CPUs, NCCL on GPUs), whose progress reaches
Tune through ``TuneReportCallback``, exactly as a one-worker trial's does.

A one-worker training trial checkpoints through Tune's own API (``tune_checkpoints``): every ``[resources]
checkpoint_s`` seconds of training it reports its state (objectives/checkpoint.py) as a ``tune.Checkpoint``,
which Tune copies to the sweep's storage, keeping the latest only, and one more when the driver asks before it
stops (``ask_checkpoint``: a signal, as a scheduler's preemption sends); a trial Tune starts again (a retry after a
lost worker, or ``--resume`` after a killed driver) gets it back from ``tune.get_checkpoint()`` and goes on
from its step. A data-parallel trial's rank 0 writes its state to a shared folder instead
(``train_data_parallel``).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ray
from ray import tune
from ray.experimental import internal_kv
from ray.experimental.internal_kv import (_internal_kv_del, _internal_kv_exists, _internal_kv_get, _internal_kv_list,
                                         _internal_kv_put)

from loopscale import objectives
from loopscale.objectives import TrialConfig

from .receipts import JsonFile, Receipt, trial_identity
from .metric import METRIC, finite

if TYPE_CHECKING:
    from loopscale.objectives.checkpoint import Checkpointing

    from ..tracking import TrialTracker

INFRA_KEY = "infra_error"  # a trial's result that could not be kept on disk (its receipt): the sweep stops
# ... and that receipt itself, for the driver to keep on the trial's MLflow run (``Receipt.carried``)
UNSAVED_KEY = "unsaved_receipt"
CHECKPOINT_KEY = "checkpoint_step"  # the report that carries a trial's checkpoint: the step it was taken after
# a trial asked for a checkpoint before the sweep stops (``ask_checkpoint``), in the key-value store, and how
# often a training trial looks (one GCS read)
CHECKPOINT_ASKED = "checkpoint-before-stop/"
ASKED_POLL_S = 1.0
ASK_TIMEOUT_S = 2.0  # a live cluster's store answers in milliseconds
KV_NAMESPACE = "loopscale"  # of the Ray cluster's key-value store, where such receipts also wait (hold_unsaved)


def run_trial(config: dict[str, Any], receipts: str = "", workers: int = 1,
              worker_resources: dict[str, float] | None = None, data_parallel_dir: str = "",
              checkpoint_s: float = 0) -> None:
    """One Tune trial: simulate or train, forwarding training progress so the curve reaches MLflow.

    The final result is saved as a receipt in the folder ``receipts`` before it is reported, and a trial that
    finds its receipt reports it instead of running again. Tune saves its experiment state every few seconds
    and copies it to storage in the background, so after a crash it restarts trials that had already
    finished (and been logged); with the receipt none of them is simulated or trained twice. A receipt the
    disk refuses (full) travels in the report instead (``UNSAVED_KEY``), to the trial's MLflow run, from which
    ``--resume`` writes it (``restore_receipts``) before Tune restarts the trial.
    """
    params = config["trial"]
    trial = TrialConfig.from_params(params)
    owner = trial_identity(config["meta"]["trial_key"], params)  # of its receipt, and sealed in its checkpoints
    receipt = Receipt(receipts, config["meta"]["trial_key"], params) if receipts else None
    result = receipt.load() if receipt else None
    if result is None:
        if trial.objective == "simulate":
            result = checked(objectives.simulate(trial))
        elif workers > 1:
            result = checked(train_data_parallel(params, workers, worker_resources or {}, data_parallel_dir,
                                                 checkpoint_s, owner))
        else:
            result = checked(objectives.train(trial, report=tune.report,
                                              checkpoint=tune_checkpoints(checkpoint_s, owner)))
        # the Ray node it ran on, for the run's ``node`` tag (hostnames and IPs repeat across a machine's nodes);
        # a data-parallel trial's workers' nodes, in rank order, comma-separated
        result = {"node": ray.get_runtime_context().get_node_id(), **result}
        if receipt:
            try:
                receipt.save(result)
            except OSError as exc:  # a full or failing disk: the result is sound, and the driver stops the sweep
                carried = receipt.carried(result)
                hold_unsaved(receipt, config, carried)
                result = {**result, INFRA_KEY: f"cannot write the trial's receipt in {receipts}: {exc.strerror or exc}",
                          UNSAVED_KEY: carried}
    tune.report(result)


def tune_checkpoints(period_s: float, owner: str) -> Checkpointing:
    """A trial's checkpoints through Tune: each state saved in a fresh folder, sealed as ``owner``'s, and reported
    with the step it was taken after (Tune copies the folder to the trial's storage before ``tune.report``
    returns); one asked for by the driver (``ask_checkpoint``) at the next step boundary; the latest one Tune
    holds restored, unless damaged (set aside: the trial trains from step 0)."""
    from loopscale.objectives.checkpoint import Checkpointing, restore_or_set_aside, save_state  # torch

    trial_id = tune.get_context().get_trial_id()

    def save(state: dict[str, Any]) -> None:
        with tempfile.TemporaryDirectory(prefix="loopscale-checkpoint-") as folder:
            save_state(state, folder, owner)
            tune.report({CHECKPOINT_KEY: state["loop"]["step"]}, checkpoint=tune.Checkpoint.from_directory(folder))
        answered(trial_id)

    def restore() -> dict[str, Any] | None:
        latest = tune.get_checkpoint()
        if latest is None:
            return None
        with latest.as_directory() as folder:
            return restore_or_set_aside(folder, owner)

    return Checkpointing(period_s=period_s, save=save, restore=restore, requested=asked_poll(trial_id))


def ask_checkpoint(trial_id: str) -> bool:
    """Ask a running training trial for a checkpoint at its next step boundary (driver side). False when the
    cluster's store did not take the question within ``ASK_TIMEOUT_S``: a signal sent to the whole process group
    (``timeout``, ``kill -- -PGID``, a batch system's stop) ends Ray's own processes too, and a put without a
    timeout then retries for minutes at full CPU while the driver waits."""
    try:
        internal_kv.global_gcs_client.internal_kv_put(f"{CHECKPOINT_ASKED}{trial_id}".encode(), b"1", True,
                                                      KV_NAMESPACE.encode(), timeout=ASK_TIMEOUT_S)
    except Exception:  # a timeout, an RPC error, no client: no trial will hear the question
        return False
    return True


def asked_poll(trial_id: str) -> Callable[[], bool]:
    """Whether the driver asked the trial for a checkpoint (``ask_checkpoint``), looked up at most every
    ``ASKED_POLL_S``."""
    looked = [-math.inf]

    def asked() -> bool:
        if time.monotonic() - looked[0] < ASKED_POLL_S:
            return False
        looked[0] = time.monotonic()
        return _internal_kv_exists(f"{CHECKPOINT_ASKED}{trial_id}", namespace=KV_NAMESPACE)

    return asked


def answered(trial_id: str) -> None:
    """The trial saved a checkpoint: a question the driver asked is answered."""
    _internal_kv_del(f"{CHECKPOINT_ASKED}{trial_id}", namespace=KV_NAMESPACE)


def drop_checkpoint(trial: Any) -> None:
    """Remove the latest checkpoint of a trial (Tune's Trial or Result) from storage: its run is logged, and
    nothing resumes it."""
    latest = trial.checkpoint
    if latest is not None:
        try:
            latest.filesystem.delete_dir(latest.path)
        except FileNotFoundError:
            pass


def hold_unsaved(receipt: Receipt, config: dict[str, Any], carried: str) -> None:
    """Keep the ``Receipt.carried`` text of a trial's refused receipt, with the trial's config, in the Ray
    cluster's key-value store (the GCS; Tune keeps its registry there too) under the receipt's path: the
    driver logs it from there after Tune stops (``log_unsaved``). The trial's report carries it too, but a
    report that arrives while Tune stops (as it does for a disk failure) is dropped."""
    kept = {"meta": config["meta"], "trial": config["trial"], "receipt": carried}
    _internal_kv_put(receipt.path, json.dumps(kept), namespace=KV_NAMESPACE)


def log_unsaved(tracker: TrialTracker, receipts: str) -> int:
    """Log, with their receipts, the trials ``hold_unsaved`` kept for the stage whose receipts folder is
    ``receipts`` (a trial logged already is left as it is: ``TrialTracker.start``), then forget them; how many
    were held. Raises ``StoreFailure`` when the store fails."""
    from ..tracking import store_errors  # the driver's half: a trial's worker never loads MLflow (~1 s a worker)

    held = _internal_kv_list(f"{receipts.rstrip('/')}/", namespace=KV_NAMESPACE)
    if held:
        with store_errors():
            tracker.open()
            for name in held:
                kept = json.loads(_internal_kv_get(name, namespace=KV_NAMESPACE))
                meta, carried = kept["meta"], kept["receipt"]
                tracker.start(meta["trial_key"], meta, TrialConfig.from_params(kept["trial"]))
                tracker.finish(meta["trial_key"], json.loads(json.loads(carried)["text"]), carried)
                _internal_kv_del(name, namespace=KV_NAMESPACE)
    return len(held)


def train_data_parallel(params: dict[str, Any], workers: int, resources: dict[str, float],
                        storage: str, checkpoint_s: float = 0, owner: str = "") -> dict[str, Any]:
    """Train one trial (``params``: its ``TrialConfig.to_params``) data-parallel on ``workers`` Ray Train workers
    of ``resources`` each (Ray Train V2's
    ``TorchTrainer`` inside a Tune trial, with ``TuneReportCallback`` forwarding the workers' progress reports to
    this trial). Ray Train retries nothing (Tune's ``FailureConfig`` does, as for every trial); the final result
    comes back from rank 0 as a JSON file under ``storage`` (the sweep's storage, which every node sees), where
    Ray Train keeps its run state too.

    Its checkpoints (``checkpoint_s``): rank 0 writes the state to ``<storage>/<trial id>.state/`` (a shared
    folder: Ray Train's own checkpoints belong to its run, and each attempt is a fresh run), where the workers
    of a later attempt, on any nodes, restore it; removed once the trial has its result. On object storage
    (``s3://``) the workers keep none."""
    import ray.train
    from ray.train.torch import TorchConfig, TorchTrainer
    from ray.tune.integration.ray_train import TuneReportCallback

    trial_id = tune.get_context().get_trial_id()
    run = f"{trial_id}-{time.time_ns()}"  # a fresh Ray Train run per attempt
    final = JsonFile(f"{storage.rstrip('/')}/{run}.result.json")
    state = "" if "://" in storage or not checkpoint_s else f"{storage.rstrip('/')}/{trial_id}.state"
    gpus = resources.get("gpu", 0.0)
    trainer = TorchTrainer(
        functools.partial(_data_parallel_worker, result_file=final.path, state=state, checkpoint_s=checkpoint_s,
                          trial_id=trial_id, owner=owner),
        train_loop_config=params,
        torch_config=TorchConfig(backend="nccl" if gpus > 0 else "gloo"),
        scaling_config=ray.train.ScalingConfig(num_workers=workers, use_gpu=gpus > 0,
                                               resources_per_worker={"CPU": resources.get("cpu", 1.0),
                                                                     **({"GPU": gpus} if gpus > 0 else {})}),
        run_config=ray.train.RunConfig(name=run, storage_path=storage, callbacks=[TuneReportCallback()],
                                       failure_config=ray.train.FailureConfig(max_failures=0)))
    trainer.fit()
    result = final.load()
    if result is None:
        raise RuntimeError("data-parallel trial finished without a result from rank 0")
    if state:
        shutil.rmtree(state, ignore_errors=True)
    return result


def _data_parallel_worker(params: dict[str, Any], result_file: str, state: str = "", checkpoint_s: float = 0,
                          trial_id: str = "", owner: str = "") -> None:
    """One Ray Train worker: train on this worker's share (objectives.train), from the trial's ``state``
    folder's checkpoint where it holds one and saving there (rank 0 writes), report progress from every
    worker (a report is a barrier), and rank 0 writes the final result with every worker's node."""
    import ray.train
    import ray.train.torch
    import torch.distributed as dist

    from loopscale.objectives.checkpoint import Checkpointing, restore_or_set_aside, save_state

    trial = dataclasses.replace(TrialConfig.from_params(params), device=str(ray.train.torch.get_device()))
    checkpoint = None
    if state:
        def save(saved: dict[str, Any]) -> None:
            if dist.get_rank() == 0:
                Path(state).mkdir(parents=True, exist_ok=True)
                save_state(saved, state, owner)
                answered(trial_id)
            ray.train.report({CHECKPOINT_KEY: saved["loop"]["step"]})  # a barrier: rank 0 has written it

        checkpoint = Checkpointing(period_s=checkpoint_s, save=save,
                                   restore=lambda: restore_or_set_aside(state, owner), requested=asked_poll(trial_id))
    result = objectives.train(trial, report=ray.train.report, checkpoint=checkpoint)
    nodes: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(nodes, ray.get_runtime_context().get_node_id())
    if dist.get_rank() == 0:
        JsonFile(result_file).save({**result, "node": ",".join(nodes)})


def checked(result: dict[str, Any]) -> dict[str, Any]:
    """An "ok" result without a finite loss becomes status "invalid" with the reason, so that neither MLflow,
    the searcher nor the progress lines take it for a measurement."""
    if result.get("status") == "ok" and not finite(result.get(METRIC)):
        return {**result, "status": "invalid",
                "reason": f"the objective returned {METRIC} = {result.get(METRIC)} with status ok"}
    return result

