"""The line analyze opens with when the sweep it fits is unfinished: how many trials are in, and whether its
driver still runs or stopped (and how to finish it).

Read from the store (the sweep's parent run stays RUNNING until every planned trial has its ended run; it
records ``planned_trials``) and from the sweep's driver lock, ``<storage>/<sweep>/driver.lock``, read without
taking it (``store.lock_holder``). The storage is the spec's (logged as ``spec.toml``); a relative one, or the
default ``loopscale-runs/tune``, is looked up from the working folder and from beside a default sqlite store
(``<dir>/loopscale-runs/mlflow.db``, whose search ran in ``<dir>``).
"""

from __future__ import annotations

from pathlib import Path

from .store import DEFAULT_RUN_DIR, DEFAULT_STORAGE, holder_alive, lock_holder, sqlite_path


def unfinished_note(experiment: str, tracking_uri: str) -> str:
    """'' for a finished sweep (or runs not logged by a sweep), else one line saying where it stands."""
    from .tracking import read_sweep_progress

    progress = read_sweep_progress(experiment, tracking_uri)
    if progress is None:
        return ""
    planned = progress["planned"]
    line = (f"sweep {experiment} is unfinished: {progress['ended']} of {planned if planned else 'its'} planned "
            "trials logged" + (f", {progress['running']} running" if progress["running"] else ""))
    folder = sweep_folder(progress["storage"], experiment, tracking_uri)
    holder = lock_holder(folder) if folder is not None else None
    if holder is not None and holder_alive(holder):
        return line + f"; the driver (pid {holder.get('pid')} on host {holder.get('host')}) is running"
    resume = "`loopscale search <its spec> --resume` finishes it"
    if folder is None:
        return line + f"; no driver lock found (Tune storage {progress['storage'] or 'not known'}): if its " \
                      f"driver stopped, {resume}"
    return line + f"; its driver stopped: {resume}"


def sweep_folder(storage: str | None, experiment: str, tracking_uri: str) -> Path | None:
    """``<storage>/<experiment>`` of the first candidate storage that holds it (module docstring); None when
    none does or the storage is remote (s3://, ...: no lock there)."""
    if storage is not None and "://" in storage:
        return None
    relative = Path(storage or Path(DEFAULT_RUN_DIR) / DEFAULT_STORAGE).expanduser()
    bases = [Path.cwd()]
    database = sqlite_path(tracking_uri)
    if database is not None and database.parent.name == DEFAULT_RUN_DIR:
        bases.append(database.resolve().parent.parent)
    for base in bases:
        folder = base / relative / experiment  # an absolute storage ignores the base
        if folder.is_dir():
            return folder
    return None
