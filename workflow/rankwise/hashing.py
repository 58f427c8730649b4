"""Content hashes of files (checkpoints, manifests), cached by the file's stat stamp.

A checkpoint of a few hundred MB takes seconds to hash; Snakemake jobs and repeated
``rankwise encode`` calls would hash it again and again.  :func:`file_sha256` keeps
a small JSON cache mapping the resolved path to ``(size, mtime_ns, inode, ctime_ns)``
and the digest, so a file is hashed once until it changes.  Touching a file (new mtime,
same bytes) costs one re-hash and gives the same digest: the digest depends on the bytes
only.  The change time is in the stamp because it cannot be set back: a rewrite of the
same size whose mtime is then restored (``cp -p``, ``touch -r``, ``rsync -t`` over an
existing file) keeps size, mtime and inode, but every write moves ``st_ctime_ns``.

Cache location, first that applies:

1. the ``cache_path`` argument;
2. the environment variable ``RANKWISE_HASH_CACHE`` (an empty value disables the cache);
3. ``.snakemake/rankwise-hash-cache.json`` in the working directory when it has a
   ``.snakemake`` folder (a pipeline's jobs share it);
4. else ``hash-cache.json`` in the user's rankwise cache
   (:func:`rankwise.cache_dir.user_cache_dir`: ``$RANKWISE_CACHE_DIR``, else
   ``$XDG_CACHE_HOME/rankwise`` or ``~/.cache/rankwise``): a command run in a folder of
   one's own leaves nothing there.

The cache is advisory: a missing, unreadable or corrupt cache file is ignored and
rewritten; concurrent writers may drop each other's new entries, never corrupt them
(each write is a temporary file renamed into place).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

from .errors import RankwiseError

DEFAULT_CACHE = Path(".snakemake") / "rankwise-hash-cache.json"
#: Files smaller than this are hashed directly: reading them is as cheap as the cache.
MIN_CACHED_SIZE = 1 << 20
#: The cache keeps at most this many entries (the oldest are dropped).
MAX_ENTRIES = 4096
_BLOCK = 1 << 20


def _cache_location(cache_path: str | os.PathLike | None) -> Path | None:
    if cache_path is not None:
        return Path(cache_path)
    env = os.environ.get("RANKWISE_HASH_CACHE")
    if env is not None:
        return Path(env) if env.strip() else None
    if DEFAULT_CACHE.parent.is_dir():
        return DEFAULT_CACHE
    from .cache_dir import user_cache_dir

    user = user_cache_dir()
    # no home directory to be found: the working folder's
    return DEFAULT_CACHE if user is None else user / "hash-cache.json"


def _hash_bytes(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def _read_cache(location: Path) -> dict[str, dict]:
    try:
        data = json.loads(location.read_text())
    except (OSError, ValueError):
        return {}
    entries = data.get("entries") if isinstance(data, dict) else None
    return entries if isinstance(entries, dict) else {}


def _write_cache(location: Path, entries: dict[str, dict]) -> None:
    if len(entries) > MAX_ENTRIES:  # dicts keep insertion order: drop the oldest
        entries = dict(list(entries.items())[-MAX_ENTRIES:])
    tmp = None
    try:
        location.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=location.name + ".", suffix=".tmp", dir=location.parent)
        with os.fdopen(fd, "w") as handle:
            json.dump({"version": 1, "entries": entries}, handle, indent=0)
        os.replace(tmp, location)
    except OSError:  # a read-only directory only loses the cache, never the result
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)


def file_sha256(
    path: str | os.PathLike,
    *,
    cache_path: str | os.PathLike | None = None,
    min_cached_size: int = MIN_CACHED_SIZE,
) -> str:
    """The SHA-256 hex digest of a file's bytes, cached by its stat stamp (module docstring).

    Parameters
    ----------
    path : the file to hash.
    cache_path : JSON cache file (default: see the module docstring).
    min_cached_size : files smaller than this many bytes bypass the cache.

    Raises
    ------
    RankwiseError
        If ``path`` does not exist or is not a regular file.
    """
    file = Path(path)
    try:
        stat = file.stat()
    except OSError:
        raise RankwiseError(f"{file}: file not found; check the path") from None
    if not file.is_file():
        raise RankwiseError(f"{file}: not a regular file; pass a file to hash")
    location = _cache_location(cache_path)
    if location is None or stat.st_size < min_cached_size:
        return _hash_bytes(file)
    key = str(file.resolve())
    stamp = {
        "size": int(stat.st_size),
        "mtime_ns": int(stat.st_mtime_ns),
        "ino": int(stat.st_ino),
        "ctime_ns": int(stat.st_ctime_ns),
    }
    entries = _read_cache(location)
    cached = entries.get(key)
    if (
        isinstance(cached, dict)
        and all(cached.get(k) == v for k, v in stamp.items())
        and isinstance(cached.get("sha256"), str)
    ):
        return cached["sha256"]
    digest = _hash_bytes(file)
    entries = _read_cache(location)  # re-read: another job may have added entries
    entries.pop(key, None)
    entries[key] = {**stamp, "sha256": digest}
    _write_cache(location, entries)
    return digest
