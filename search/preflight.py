"""Checks a sweep passes before Ray starts: the Ray cluster answers, and the disks have room.

Each failure is one ``ValueError`` line (exit 2), raised before anything is written. ``ray.init`` on an address
where nothing listens retries for minutes; a TCP connect with a short timeout says the same in seconds.
A full disk under the Tune storage or the sqlite store would otherwise surface half-way through the sweep,
trial after trial.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from pathlib import Path

CONNECT_TIMEOUT_S = 5.0
MIB = 2**20
# Room a sweep needs before it starts: Tune's experiment state, one folder, result file and receipt per trial
# (about 60 KiB per simulated trial here), the sqlite store's rows; and the least room it keeps while it runs.
MIN_FREE_BYTES = 32 * MIB
BYTES_PER_TRIAL = 256 * 1024


def ray_address(address: str | None) -> str | None:
    """The cluster a sweep will join: the spec's or --address, else RAY_ADDRESS; None for a local Ray."""
    return address or os.environ.get("RAY_ADDRESS") or None


def check_ray_address(address: str | None, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """A ``host:port`` or ``ray://host:port`` address must accept a TCP connection within ``timeout_s``.
    ``auto`` and ``local`` are Ray's own lookups and answer quickly by themselves."""
    if not address or address in ("auto", "local"):
        return
    where = "--address / the spec's address" + (" / RAY_ADDRESS" if os.environ.get("RAY_ADDRESS") else "")
    host, _, port = address.split("://", 1)[-1].rstrip("/").rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"Ray address {address!r} is not host:port or ray://host:port (from {where})")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__  # a timeout has no strerror
        raise ValueError(f"Ray cluster at {address} is unreachable ({reason}); check {where}") from None


def nearest_existing(path: str | os.PathLike) -> Path:
    existing = Path(path)
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    return existing


def check_folder(label: str, path: str) -> None:
    """A local folder the sweep will create must be creatable: its nearest existing ancestor a folder in which
    a folder can be made (tried, and removed at once: permissions alone do not tell for /proc or a read-only
    mount, nor for root). Object-storage URIs pass."""
    if "://" in path or Path(path).is_dir():
        return
    parent = nearest_existing(path)
    if parent == Path(path):
        raise ValueError(f"{label} {path} is a file; name a folder")
    if not parent.is_dir():
        raise ValueError(f"{label} {path} cannot be made: {parent} is not a folder")
    try:
        os.rmdir(tempfile.mkdtemp(dir=parent, prefix=".loopscale-probe-"))
    except OSError as exc:
        raise ValueError(f"{label} {path} cannot be made in {parent}: {exc.strerror or exc}") from None


def free_bytes(path: str | os.PathLike) -> int:
    return shutil.disk_usage(nearest_existing(path)).free


def check_free_space(paths: dict[str, str], planned_trials: int) -> None:
    """Every local path in ``paths`` (label -> path) must have room for the sweep (see ``BYTES_PER_TRIAL``)."""
    need = MIN_FREE_BYTES + planned_trials * BYTES_PER_TRIAL
    for label, path in paths.items():
        if "://" in path:  # object storage: no disk to ask
            continue
        free = free_bytes(path)
        if free < need:
            raise ValueError(f"{label} {path} has {free / MIB:.1f} MiB free, less than the {need / MIB:.0f} MiB "
                             f"a sweep of {planned_trials} trials needs; free some space or point it elsewhere")


def low_space(paths: dict[str, str]) -> str:
    """One line when a local path in ``paths`` has less than ``MIN_FREE_BYTES`` left (checked while the sweep
    runs, so it stops before a write fails), else ""."""
    for label, path in paths.items():
        if "://" not in path:
            free = free_bytes(path)
            if free < MIN_FREE_BYTES:
                return f"{label} {path} is nearly full ({free / MIB:.1f} MiB free)"
    return ""
