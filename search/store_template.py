"""A new sqlite store for MLflow, without MLflow's dozens of migrations every time (``write_empty_store``).

MLflow builds a store's schema by running every migration since its first release, one transaction each: about
a second of CPU per new store, paid by every sweep that starts in a new folder. The schema that results depends
only on the MLflow version, so the first store built under a version is kept, emptied, in the user cache
(``$XDG_CACHE_HOME/loopscale/mlflow/empty-<version>.db``) and later stores start as a copy of it.

"Emptied": the copy holds no experiment, not even MLflow's "Default", whose artifact location MLflow derives
from the working directory of whoever opens the store; MLflow creates it when it first opens the copy, exactly
as it does in a store it builds itself (``search.tracking.ready_store`` opens every store it makes).
"""

from __future__ import annotations

import os
import shutil
import sqlite3
from contextlib import closing
from pathlib import Path

import mlflow
from mlflow.tracking import MlflowClient

from loopscale.model.user_cache import user_cache_dir


def template_path() -> Path:
    """Where this MLflow version's empty store is kept."""
    return Path(user_cache_dir("mlflow")) / f"empty-{mlflow.__version__}.db"


def write_empty_store(path: Path) -> None:
    """A complete, empty store at ``path`` (which must not exist): a copy of the cached template, or built by
    MLflow and then cached. The caller renames ``path`` into place, so a kill leaves no half-built store."""
    template = template_path()
    if template.is_file():
        shutil.copyfile(template, path)
    else:
        MlflowClient(f"sqlite:///{path}").search_experiments(max_results=1)  # MLflow builds it on first use
        _keep_as_template(path, template)


def _keep_as_template(store: Path, template: Path) -> None:
    """Copy a new store, emptied, to ``template``, written whole (to a temporary name, then renamed): two
    drivers caching at once each rename a complete copy. A cache that cannot be written is no error."""
    try:
        template.parent.mkdir(parents=True, exist_ok=True)
        scratch = template.with_name(f"{template.name}.{os.getpid()}.new")
        shutil.copyfile(store, scratch)
        with closing(sqlite3.connect(scratch)) as db:
            db.execute("DELETE FROM experiment_tags WHERE experiment_id = 0")
            db.execute("DELETE FROM experiments WHERE experiment_id = 0")
            db.commit()
        os.replace(scratch, template)
    except (OSError, sqlite3.Error):
        pass
