"""``loopscale.load_model``: a kept model (``[resources] keep_models``) back from its trial's MLflow run.

A kept trial's run holds the artifact ``model.pt`` (objectives/kept.py: the weights and the trial config) and
the tags ``loopscale.model`` and ``loopscale.model.sha256`` (search/tune/keep.py). ``load_model(run)`` downloads
it and rebuilds the module through the trial's architecture (the built-in or the spec's own factory, which must
still load where it was named); ``KeptModel.at(r)`` rebuilds it at another recurrence count and
``validation_loss`` evaluates it on the trial's validation rows exactly as the trial did
(``objectives.training.validation_loss``).

Only what the run itself records is built. Building a trial config measures, and so imports and runs, the
architecture it names, and an artifact is a file anyone with write access to the store can replace; so the
file's trial config must be the run's own before anything is built from it (``own_params``): its architecture
exactly the run's param ``template.architecture``, every other setting its logged param, and its bytes those
whose sha256 the run recorded when it was kept (runs kept before the digest was recorded have only the config
to show). A file that fails is a ``ForeignModel``: one line naming the run's value and the file's, nothing
imported. Two runs' files exchanged are refused for both.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from mlflow.tracking import MlflowClient

from loopscale.analysis.store import resolve_tracking_uri
from loopscale.analysis.tracking import PROGRESS_BAR
from loopscale.model import BUILTIN, LoopedConfig
from loopscale.objectives import TrialConfig
from loopscale.objectives.kept import eval_r, read_file, rebuild
from loopscale.objectives.trial import MODEL_FILE
from loopscale.objectives.training import validation_loss

from .tracking import KEPT_DIGEST_TAG, KEPT_TAG, flatten_params

ARCHITECTURE_PARAM = "template.architecture"


class ForeignModel(ValueError):
    """A run's model file that is not the one kept for it (module docstring); nothing was built from it."""


@dataclass(frozen=True)
class KeptModel:
    """A trial's trained model: ``module`` (eval mode, on the CPU, at ``r`` recurrences: the trained r unless
    ``load_model`` was asked for another), the ``trial`` config that built and trained it, and its MLflow
    ``run_id``."""

    module: torch.nn.Module
    trial: TrialConfig
    run_id: str
    weights: dict[str, torch.Tensor]
    r: int

    @property
    def config(self) -> LoopedConfig:
        return self.trial.model_config

    def at(self, r: int) -> torch.nn.Module:
        """The module built at ``r`` recurrences with the trained weights; ValueError in one line where the
        architecture cannot take that r, or r is no whole count within ``kept.MAX_EVAL_R`` (objectives/kept.py)."""
        r = eval_r(r)
        return self.module if r == self.r else rebuild(self.trial, self.weights, r)

    def validation_loss(self, r: int | None = None, device: str = "cpu") -> float:
        """Mean cross-entropy (nats per token) on the trial's validation rows, at ``r`` (None: ``self.r``)."""
        return validation_loss(self.at(self.r if r is None else r), self.trial, device)


def load_model(run: Any, tracking_uri: str | None = None, r: int | None = None) -> KeptModel:
    """The kept model of a trial ``run`` (its id, or an MLflow ``Run``) in the store ``tracking_uri`` (default:
    ``$MLFLOW_TRACKING_URI``, else loopscale's default store), its module built at ``r`` recurrences (None: the
    trained r); ValueError in one line for a run that holds no kept model, an ``r`` that is no whole count
    within ``kept.MAX_EVAL_R``, a damaged file, and (``ForeignModel``) a file that is not the run's own."""
    if r is not None:
        r = eval_r(r)
    client = MlflowClient(resolve_tracking_uri(tracking_uri))
    found = client.get_run(run if isinstance(run, str) else run.info.run_id)  # the store's record, not the caller's
    trial, weights = own_model(found, download_model(client, found))
    return KeptModel(module=rebuild(trial, weights, r), trial=trial, run_id=found.info.run_id, weights=weights,
                     r=trial.r if r is None else r)


def download_model(client: MlflowClient, run: Any) -> bytes:
    """The bytes of ``run``'s artifact ``model.pt``; ValueError in one line for a run that holds no kept model, or
    none any more (its file deleted). The path is loopscale's own, not the tag's value: a tag can be rewritten to
    name another run's artifact."""
    tags = run.data.tags
    if not tags.get(KEPT_TAG):
        raise ValueError(f"run {run.info.run_id} holds no kept model ({tags.get('status', 'no status')}; "
                         "[resources] keep_models keeps the best trial of each cell by default)")
    if MODEL_FILE not in {artifact.path for artifact in client.list_artifacts(run.info.run_id)}:
        raise ValueError(f"run {run.info.run_id} is tagged {KEPT_TAG} but holds no artifact {MODEL_FILE}")
    os.environ.setdefault(PROGRESS_BAR, "false")  # else MLflow draws a bar on stderr for every download
    with tempfile.TemporaryDirectory(prefix="loopscale-model-") as tmp:
        return Path(client.download_artifacts(run.info.run_id, MODEL_FILE, tmp)).read_bytes()


def check_files(client: MlflowClient, runs: list[Any]) -> dict[str, str]:
    """The runs among ``runs`` whose model file is damaged, each with its one line; ``ForeignModel`` in one line
    naming every run whose file is not its own (module docstring). Each file is downloaded and read, nothing is
    built."""
    damaged, foreign = {}, []
    for run in runs:
        try:
            own_params(run, download_model(client, run))
        except ForeignModel as exc:
            foreign.append((run.info.run_id, str(exc)))
        except ValueError as exc:
            damaged[run.info.run_id] = str(exc)
    if foreign:
        others = ", ".join(run_id for run_id, _ in foreign[1:])
        raise ForeignModel(foreign[0][1] + (f"; nor are the model files of these runs their own: {others}" if others
                                            else ""))
    return damaged


def own_model(run: Any, data: bytes) -> tuple[TrialConfig, dict[str, torch.Tensor]]:
    """The trial config and weights of ``run``'s model file ``data``, built only once the file is shown to be the
    run's own (``own_params``)."""
    params, weights = own_params(run, data)
    return TrialConfig.from_params(params), weights


def own_params(run: Any, data: bytes) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The trial config, unbuilt, and the weights of ``run``'s model file ``data`` once it is shown to be the run's
    own (module docstring): ``ForeignModel`` otherwise, ValueError for a damaged file."""
    where = f"run {run.info.run_id}'s {MODEL_FILE}"
    params, weights = read_file(data, where)
    recorded = dict(run.data.params)
    template = params.get("template")
    architecture = template.get("architecture", BUILTIN) if isinstance(template, dict) else None
    if architecture != recorded.get(ARCHITECTURE_PARAM, BUILTIN):  # the one value that names code: compared whole
        raise ForeignModel(f"{where} was not trained as its run: the file names architecture "
                           f"{_shown(architecture)}, the run {_shown(recorded.get(ARCHITECTURE_PARAM, BUILTIN))}; "
                           "nothing was imported or built")
    try:
        flat = flatten_params(params)
    except (AttributeError, TypeError, ValueError):  # a nested setting of a type loopscale never writes
        raise ForeignModel(f"{where} holds a trial config loopscale does not write; nothing was built") from None
    differ = sorted(key for key in set(flat) | set(recorded) if flat.get(key) != recorded.get(key))
    if differ:
        key = differ[0]
        more = f" (and {len(differ) - 1} more settings)" if len(differ) > 1 else ""
        raise ForeignModel(f"{where} was not trained as its run: the file's {key} is {_shown(flat.get(key))}, the "
                           f"run's {_shown(recorded.get(key))}{more}; nothing was built")
    digest, actual = run.data.tags.get(KEPT_DIGEST_TAG), hashlib.sha256(data).hexdigest()
    if digest and actual != digest:
        raise ForeignModel(f"{where} is not the file kept for the run: its sha256 is {actual[:16]}..., the run "
                           f"recorded {digest[:16]}...; nothing was built")
    return params, weights


def _shown(value: Any) -> str:
    """A setting in a line: quoted, cut at 80 characters; "unset" for none."""
    if value is None:
        return "unset"
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."
