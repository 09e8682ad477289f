"""``loopscale.load_model``: a kept model (``[resources] keep_models``) back from its trial's MLflow run.

A kept trial's run holds the artifact ``model.pt`` (objectives/kept.py: the weights and the trial config) and
the tag ``loopscale.model`` (search/tune/keep.py). ``load_model(run)`` downloads it and rebuilds the module
through the trial's architecture (the built-in or the spec's own factory, which must still load where it was
named); ``KeptModel.at(r)`` rebuilds it at another recurrence count and ``validation_loss`` evaluates it on the
trial's validation rows exactly as the trial did (``objectives.training.validation_loss``).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from mlflow.tracking import MlflowClient

from loopscale.analysis.store import resolve_tracking_uri
from loopscale.analysis.tracking import PROGRESS_BAR
from loopscale.model import LoopedConfig
from loopscale.objectives import TrialConfig
from loopscale.objectives.kept import read_kept, rebuild
from loopscale.objectives.training import validation_loss

from .tracking import KEPT_TAG


@dataclass(frozen=True)
class KeptModel:
    """A trial's trained model: ``module`` (eval mode, on the CPU, at the trained r), the ``trial`` config that
    built and trained it, and its MLflow ``run_id``."""

    module: torch.nn.Module
    trial: TrialConfig
    run_id: str
    weights: dict[str, torch.Tensor]

    @property
    def config(self) -> LoopedConfig:
        return self.trial.model_config

    def at(self, r: int) -> torch.nn.Module:
        """The module built at ``r`` recurrences with the trained weights; ValueError in one line where the
        architecture cannot take that r (objectives/kept.py)."""
        return self.module if r == self.trial.r else rebuild(self.trial, self.weights, r)

    def validation_loss(self, r: int | None = None, device: str = "cpu") -> float:
        """Mean cross-entropy (nats per token) on the trial's validation rows, at ``r`` (None: as trained)."""
        return validation_loss(self.at(self.trial.r if r is None else r), self.trial, device)


def load_model(run: Any, tracking_uri: str | None = None) -> KeptModel:
    """The kept model of a trial ``run`` (its id, or an MLflow ``Run``) in the store ``tracking_uri`` (default:
    ``$MLFLOW_TRACKING_URI``, else loopscale's default store); ValueError in one line for a run that holds no
    kept model."""
    client = MlflowClient(resolve_tracking_uri(tracking_uri))
    run_id = run if isinstance(run, str) else run.info.run_id
    tags = client.get_run(run_id).data.tags
    artifact = tags.get(KEPT_TAG)
    if not artifact:
        raise ValueError(f"run {run_id} holds no kept model ({tags.get('status', 'no status')}; [resources] "
                         "keep_models keeps the best trial of each cell by default)")
    os.environ.setdefault(PROGRESS_BAR, "false")  # else MLflow draws a bar on stderr for every download
    with tempfile.TemporaryDirectory(prefix="loopscale-model-") as tmp:
        path = Path(client.download_artifacts(run_id, artifact, tmp))
        trial, weights = read_kept(path.read_bytes(), f"run {run_id}'s {artifact}")
    return KeptModel(module=rebuild(trial, weights), trial=trial, run_id=run_id, weights=weights)
