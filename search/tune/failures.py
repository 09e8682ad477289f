"""Why a trial failed, in one line from Tune's error log, and whether that was the disk's fault (full,
read-only, failing: retried on ``--resume``) rather than the trial's own. No Ray."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

# Errors of the disk, not of the trial: retried on --resume instead of recorded as the trial's failure.
DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO)


def is_disk_error(reason: str) -> bool:
    """Whether a trial's error line is the disk's (full, read-only, failing), not the trial's own."""
    return any(os.strerror(code) in reason for code in DISK_ERRNOS)


def error_reason(trial: Any) -> str:
    """Why the trial failed, for the run's ``reason`` tag (see ``failure_reason``), from its error log."""
    try:
        log = Path(trial.error_file).read_text()
    except (OSError, TypeError):
        log = ""
    return failure_reason(log)


def failure_reason(log: str) -> str:
    """One line from Tune's error log of a trial (one ``Failure # n`` block per failed attempt): the last
    line of the last block (the exception message), or, when the trial's worker process died (a signal such
    as the out-of-memory killer's SIGKILL, or an exit), Ray's exit type and detail; then how many attempts
    the trial had (1 + the retries)."""
    blocks = log.split("Failure # ")
    lines = [ln.strip() for ln in blocks[-1].splitlines() if ln.strip()]
    died = next((ln for ln in lines if ln.startswith("The actor is dead because its worker process has died")), "")
    if died:  # Ray's line goes on with a list of possible causes; its first sentences say what happened
        reason = "worker process died: " + died.split(" Some common causes")[0].removeprefix(
            "The actor is dead because its worker process has died. ")
    else:
        reason = lines[-1] if lines else "trial raised"
    attempts = max(1, len(blocks) - 1)
    return f"{reason[:400]} ({attempts} attempt{'s' if attempts > 1 else ''})"

