"""Replacing a folder as a whole: ``replace_folder(new, target)``.

A reader of ``target`` sees the whole old folder or the whole new one at every instant, never a mixture:
Linux's ``renameat2(..., RENAME_EXCHANGE)`` swaps the two names in one step, after which the old contents sit
under the new folder's name and are removed. Where that call is missing (another kernel, or a file system
that refuses it with EINVAL), the old folder is renamed aside and the new one renamed in: two renames,
between which ``target`` is briefly absent, but still never mixed.

The new folder is written first under ``scratch_for(target)``: ``.<name>.<host>.<pid>.partial`` beside the
target, on the same file system (a rename cannot cross one). A process killed while writing (SIGKILL), or
between the swap and the removal, leaves such a folder behind (or its ``.old`` twin of the fallback);
``scratch_for`` removes those of this host's processes that are gone.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import re
import shutil
import socket
from pathlib import Path

from .store import holder_alive

AT_FDCWD = -100
RENAME_EXCHANGE = 2  # linux/fs.h


def scratch_for(target: Path) -> Path:
    """The scratch folder of this process for ``target`` (not created), after removing stale ones."""
    remove_stale(target)
    return target.parent / f".{target.name}.{socket.gethostname()}.{os.getpid()}.partial"


def remove_stale(target: Path) -> list[Path]:
    """Remove the scratch folders of ``target`` left by processes that no longer run; returns them."""
    host = socket.gethostname()  # a folder on a shared disk may be another machine's, whose pids are not ours
    pattern = re.compile(rf"\.{re.escape(target.name)}\.{re.escape(host)}\.(\d+)\.partial(\.old)?")
    try:
        entries = list(target.parent.iterdir())
    except OSError:  # no parent yet: nothing left behind
        return []
    stale = [p for p in entries
             if (m := pattern.fullmatch(p.name)) and not holder_alive({"host": host, "pid": int(m[1])})]
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
    return stale


def replace_folder(new: Path, target: Path) -> None:
    """Put folder ``new`` in place of ``target`` (which may not exist) as one step (module docstring); ``new``
    is gone afterwards."""
    if not target.exists():
        os.rename(new, target)
        return
    if not _exchange(new, target):
        aside = new.with_name(new.name + ".old")
        os.rename(target, aside)
        try:
            os.rename(new, target)
        except OSError:
            os.rename(aside, target)
            raise
        new = aside
    shutil.rmtree(new, ignore_errors=True)  # the old contents now


def _exchange(a: Path, b: Path) -> bool:
    """Swap the names ``a`` and ``b`` atomically; False when this system cannot."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None:
        return False
    if renameat2(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
        return False
    raise OSError(code, os.strerror(code), str(b))
