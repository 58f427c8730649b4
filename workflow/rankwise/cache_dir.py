"""The user's rankwise cache folder (compiled kernels, file hashes outside a pipeline).

First that applies: ``$RANKWISE_CACHE_DIR``; ``$XDG_CACHE_HOME/rankwise`` when that
variable is an absolute path (the XDG spec ignores a relative one); ``~/.cache/rankwise``;
``None`` when there is no home directory to be found (a container run under a user id
the passwd file lacks, without ``$HOME``): callers then cache elsewhere or not at all.
"""

from __future__ import annotations

import os
from pathlib import Path


def user_cache_dir() -> Path | None:
    """The folder (maybe not yet made), or ``None`` (see the module docstring)."""
    chosen = os.environ.get("RANKWISE_CACHE_DIR")
    if chosen:
        return Path(chosen)
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    if os.path.isabs(xdg):
        return Path(xdg) / "rankwise"
    try:
        return Path.home() / ".cache" / "rankwise"
    except (RuntimeError, KeyError):  # no $HOME, and no passwd entry for this user
        return None
