"""One driver per sweep: ``<storage>/<name>/driver.lock``, created with O_EXCL.

Two drivers of one sweep would each log every trial (twice the runs, and the analysis fits both copies). The
lock is a file rather than a kernel lock so that it also holds on storage several machines share (O_EXCL
creation is atomic on local file systems and NFSv3+); it names its holder: host, pid, the process's start
time (so a recycled pid is not mistaken for the driver) and when it took the lock. A lock whose holder is
gone is stale: on the same host, a process that is no longer alive (or another process under that pid);
a lock held from another host cannot be checked from here and is reported, naming it, for the user to judge.
Object-storage URIs (s3://, gs://) have no atomic create-if-absent, and are not locked.
"""

from __future__ import annotations

import json
import os
import socket
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

# the lock's format, also read by analyze (without taking it): one home for both
from loopscale.analysis.store import LOCK_FILE, process_start
from loopscale.analysis.store import holder_alive as alive

BREAK_TIMEOUT_S = 30.0  # a driver breaking a stale lock holds the break file for milliseconds


def describe(holder: dict[str, Any]) -> str:
    since = datetime.fromtimestamp(float(holder.get("since", 0)), timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    return f"pid {holder.get('pid')} on host {holder.get('host')} since {since}"


class SweepLock:
    """``with SweepLock(folder):`` holds the sweep's lock, or raises ValueError naming the driver that does."""

    def __init__(self, folder: str | os.PathLike):
        self.path = Path(folder) / LOCK_FILE
        self.me = {"host": socket.gethostname(), "pid": os.getpid(), "process_start": process_start(os.getpid()),
                   "since": time.time()}
        self.held = False
        self._created: list[Path] = []  # folders the lock made, removed again if left empty

    def __enter__(self) -> "SweepLock":
        self.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def acquire(self) -> None:
        folder = self.path.parent
        self._created = [p for p in (folder, *folder.parents) if not p.exists()]
        folder.mkdir(parents=True, exist_ok=True)
        while True:
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder = self._read()
                if holder == {}:  # released meanwhile
                    continue
                if holder is not None and alive(holder):
                    raise ValueError(f"sweep {self.path.parent.name!r} is already being run by {describe(holder)} "
                                     f"(lock {self.path}); wait for it, or stop it and run again with --resume. "
                                     "If that driver is gone, remove the lock") from None
                self._break_stale(holder)
                continue
            with os.fdopen(fd, "w") as f:
                f.write(json.dumps(self.me))
                f.flush()
                os.fsync(f.fileno())
            self.held = True
            return

    def release(self) -> None:
        if self.held and self._read() == self.me:
            self.path.unlink(missing_ok=True)
        self.held = False
        for folder in self._created:  # innermost first; one that holds anything stays
            try:
                folder.rmdir()
            except OSError:
                break

    def _read(self) -> dict[str, Any] | None:
        """The holder named in the lock; None for a lock that stays empty or unreadable (its creator died
        between creating and writing it), after giving a live creator a moment to write."""
        for _ in range(20):
            try:
                return json.loads(self.path.read_text())
            except FileNotFoundError:
                return {}  # released meanwhile: not alive, nothing to break
            except (OSError, ValueError):
                time.sleep(0.05)
        return None

    def _break_stale(self, judged: dict[str, Any] | None) -> None:
        """Remove the stale lock, unless another driver replaced it meanwhile. Breakers take turns through an
        O_EXCL break file, so that one never removes the fresh lock another has just taken."""
        breaker = self.path.with_name(f"{LOCK_FILE}.break")
        try:
            fd = os.open(breaker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            try:
                if time.time() - breaker.stat().st_mtime > BREAK_TIMEOUT_S:  # its breaker died
                    breaker.unlink(missing_ok=True)
            except FileNotFoundError:
                pass
            time.sleep(0.05)
            return
        os.close(fd)
        try:
            if self._read() in (judged, {}):
                self.path.unlink(missing_ok=True)
        finally:
            breaker.unlink(missing_ok=True)
