"""Kept models (``[resources] keep_models``): which trials' trained weights MLflow keeps, decided when their stage
has ended. No Ray.

Each training trial that ends "ok" saves its model file (objectives/kept.py) in the stage's folder of models
(``receipts.model_file``) before its receipt, so every finished trial has one. When the stage ends, every cell is
complete and its best trial known: the driver uploads the kept ones (``kept_keys``: "best", each cell's lowest
``val_loss``; "all", every "ok" trial) as the artifact ``model.pt`` of the trial's run, tagged ``KEPT_TAG`` and
``KEPT_DIGEST_TAG``, the file's sha256, which ``load_model`` checks the artifact against (``TrialTracker.keep_model``,
search/models.py), and only then deletes the stage's files. A crash in between loses nothing: on
resume the stage ends again, the files still there are uploaded again to the same artifact path (replacing, not
adding, a copy) and then deleted; a kept file is never deleted before its upload.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loopscale.objectives.trial import MODEL_FILE

from .metric import METRIC, finite
from .receipts import model_file

if TYPE_CHECKING:
    from ..tracking import TrialTracker


def kept_keys(results: Iterable[dict[str, Any]], mode: str) -> set[str]:
    """The trial keys whose models ``mode`` keeps among a stage's ``results`` (each with ``trial_key``, ``cell``,
    ``status`` and the metric): "all" every "ok" trial with a finite metric, "best" each cell's lowest (ties: the
    first key), "none" nothing."""
    ok = sorted((r for r in results if r.get("status") == "ok" and finite(r.get(METRIC))), key=lambda r: r["trial_key"])
    if mode == "all":
        return {r["trial_key"] for r in ok}
    if mode == "none":
        return set()
    best: dict[str, dict[str, Any]] = {}
    for result in ok:
        held = best.get(result["cell"])
        if held is None or result[METRIC] < held[METRIC]:
            best[result["cell"]] = result
    return {r["trial_key"] for r in best.values()}


def keep_models(tracker: TrialTracker, results: list[dict[str, Any]], folder: str, mode: str) -> int:
    """Upload the models ``mode`` keeps of a stage's ``results`` from the stage's ``folder`` of models to their
    trials' runs, then delete every file of the stage's trials there; how many were uploaded (module docstring)."""
    files = {r["trial_key"]: model_file(folder, r["trial_key"], r["trial"]) for r in results}
    uploaded = 0
    with tempfile.TemporaryDirectory(prefix="loopscale-model-") as tmp:
        for key in sorted(kept_keys(results, mode)):
            data = files[key].read_bytes()
            if data is None:  # uploaded before a crash that came before the delete, or a trial that saved none
                continue
            path = Path(tmp) / MODEL_FILE
            path.write_bytes(data)
            tracker.keep_model(key, str(path))
            uploaded += 1
    for file in files.values():
        file.delete()
    return uploaded
