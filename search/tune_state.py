"""A last readable copy of Tune's experiment state, for a stage whose own copy a full disk cut short.

Tune keeps a stage's state in ``<storage>/<sweep>/<stage>/``: ``experiment_state-<session>.json`` (every
trial's status), ``search_gen_state-<session>.json`` (a pickle, despite its name: how many trials Tune has
created), ``searcher-state-<session>.pkl`` (the pickled ``CellSearcher``: the cells' Optuna studies) and
``tuner.pkl``. It writes a snapshot in its driver's staging folder every few seconds and copies it over the
previous one in storage, in place, every sync period (``tune/stage.py`` makes that the snapshot period; Tune's
default is 5 minutes) and when the stage stops. A disk that fills up during such a copy leaves the files
truncated (all three can be left at 0 bytes between two syncs), and ``Tuner.restore`` cannot read them.

``StateKeeper.refresh`` (called by the driver at every step of the stage) copies the files to
``last-good-<n>/`` whenever Tune has put a new set in storage that reads back whole and is one snapshot (its
three files written within ``SNAPSHOT_S``: a ``search_gen_state`` newer than the searcher makes Tune create
fewer trials than the searcher still has to propose, and the stage waits forever). The copy goes to a fresh
folder that counts once it is complete (and its sources unchanged meanwhile); the one before is removed only
then. ``StateKeeper.recover`` puts the newest copy in place of damaged files. The stage then resumes from that
snapshot, a few seconds older than the damaged one: the trials that finished since are started again by Tune
and answered by their receipts (``tune.trial.run_trial``), as after a driver killed between two snapshots,
so none runs twice and each is logged to MLflow once.

Nothing here imports Ray: the file names are Tune's (``TuneController``, ``SearchGenerator`` and
``Searcher.CKPT_FILE_TMPL``, the tuner's ``tuner.pkl``), checked by the tests against a real stage.
"""

from __future__ import annotations

import fnmatch
import json
import os
import pickle
import shutil
from pathlib import Path

# one snapshot's three files (written together), then the tuner's, written once when the stage starts
STATE_FILES = ("experiment_state-*.json", "search_gen_state-*.json", "searcher-state-*.pkl", "tuner.pkl")
COPY_PREFIX = "last-good-"
COMPLETE = "complete"  # written last into a copy's folder: the copy is whole
SNAPSHOT_S = 1.0  # Tune copies a snapshot's files within milliseconds, and writes one every 2 s (tune/stage.py)


class StateKeeper:
    """The last readable copies of the Tune state of one stage folder ``path`` (local storage only)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._kept: tuple | None = None  # (name, size, mtime) of each state file last copied
        self._rejected: tuple | None = None  # the same, of a set found unreadable or not one snapshot

    def state_files(self) -> dict[str, Path]:
        """Tune's newest state file of each kind in the stage folder (fewer when some are missing)."""
        try:
            names = os.listdir(self.path)
        except OSError:
            return {}
        found = {}
        for pattern in STATE_FILES:
            matching = sorted(fnmatch.filter(names, pattern))
            if matching:
                found[pattern] = self.path / matching[-1]
        return found

    def refresh(self) -> None:
        """Copy Tune's state files when it has written a new set that reads back whole and is one snapshot; a
        failure (a full disk) keeps the previous copy and is not raised (the free-space watch reports it)."""
        files = self.state_files()
        try:
            look = tuple((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files.values())
        except OSError:
            return
        if look in (self._kept, self._rejected):
            return
        if len(files) < len(STATE_FILES) or not one_snapshot(look) or not readable(files.values()) \
                or not self._copy(files.values(), look):
            self._rejected = look  # until Tune writes again
            return
        self._kept = look

    def _copy(self, files, look: tuple) -> bool:
        copies = self.copies()
        number = int(copies[-1].name.removeprefix(COPY_PREFIX)) + 1 if copies else 1
        target = self.path / f"{COPY_PREFIX}{number}"
        try:
            target.mkdir()
            for source in files:
                shutil.copyfile(source, target / source.name)
            if tuple((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files) != look:
                raise OSError("Tune wrote its state again while it was copied: not one snapshot")
            (target / COMPLETE).touch()
        except OSError:
            shutil.rmtree(target, ignore_errors=True)
            return False
        for older in copies:
            shutil.rmtree(older, ignore_errors=True)
        return True

    def copies(self) -> list[Path]:
        """The complete copies, oldest first (normally one)."""
        found = [p for p in self.path.glob(f"{COPY_PREFIX}*") if (p / COMPLETE).exists()
                 and p.name.removeprefix(COPY_PREFIX).isdigit()]
        return sorted(found, key=lambda p: int(p.name.removeprefix(COPY_PREFIX)))

    def damaged(self) -> bool:
        """Whether Tune's state in the folder is incomplete or unreadable while a copy could replace it."""
        files = self.state_files()
        return bool(self.copies()) and (len(files) < len(STATE_FILES) or not readable(files.values()))

    def recover(self) -> Path | None:
        """Put the newest copy in place of Tune's state files (the damaged ones are renamed ``*.damaged``);
        the copy used, or None when there is none."""
        copies = self.copies()
        if not copies:
            return None
        self.set_aside()
        for saved in copies[-1].iterdir():
            if saved.name != COMPLETE:
                shutil.copyfile(saved, self.path / saved.name)
        return copies[-1]

    def set_aside(self) -> None:
        """Rename Tune's state files in the folder ``*.damaged`` (kept, and no longer Tune's)."""
        for damaged in self.state_files().values():
            os.replace(damaged, damaged.with_name(damaged.name + ".damaged"))


def one_snapshot(look: tuple) -> bool:
    """Whether the snapshot's files (``look``'s first three) were written together."""
    times = [ns for _, _, ns in look[:3]]
    return max(times) - min(times) < SNAPSHOT_S * 1e9


def readable(files) -> bool:
    """Whether each file reads back whole: a pickle that loads (``search_gen_state-*.json`` is one too), or
    JSON that parses."""
    try:
        for path in files:
            data = Path(path).read_bytes()
            if data[:1] == pickle.PROTO:
                pickle.loads(data)
            else:
                json.loads(data)
    except Exception:  # noqa: BLE001 (a truncated pickle raises whatever its cut-off opcode leads to)
        return False
    return True
