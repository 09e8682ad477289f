"""Where loopscale keeps its folders per user and machine (no torch import: the driver reads it too)."""

from __future__ import annotations

import os


def user_cache_dir(*parts: str) -> str:
    """``$XDG_CACHE_HOME/loopscale/<parts>`` (``~/.cache/loopscale/<parts>``)."""
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "loopscale", *parts)
