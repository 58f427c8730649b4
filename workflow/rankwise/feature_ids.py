"""Id-keyed features: the id of every feature row, and its alignment to a manifest.

Features exported elsewhere (torchreid's way, junk rows dropped; or in any row order)
come with one id per feature row, so the ``precomputed`` encoder can put them in the
manifest's order.  The ids are, by the encoder's options:

- ``ids``/``query_ids``/``gallery_ids`` (a file beside a ``.npy`` or a Zarr array):
  ``*.csv`` -> the column ``ids_column`` (default ``id``); ``*.npy`` -> a 1-D integer or
  string array; any other name -> text, one id per line;
- otherwise, for a Zarr group: its array ``ids`` ``(N,)`` (integers or strings) beside
  ``embeddings``.  No ids anywhere: the rows are taken in manifest order, as before.

Ids compare as strings, like manifest ids: the integer 17 matches the manifest id
``"17"`` (not ``"0017"``); spaces and tabs around a CSV / text id are
stripped, as around a manifest id.

:func:`align` matches them (``on_missing``): duplicate feature ids are always an error;
a manifest id without a feature row, or a feature id not in the manifest, is an error
under ``error`` (the default); under ``drop`` the evaluation keeps the ids on both
sides: manifest rows without features are dropped (counted, one example kept) and
feature rows for other ids are ignored (counted).

Downstream, a drop is recorded, not rewritten: the embedding store holds the kept rows
with their manifest rows (``manifest_row``) and stays tied to the whole manifest (its
sha256); the readers keep those manifest rows (:mod:`rankwise.embeddings`,
:func:`rankwise.inputs.open_inputs`), so no second manifest file exists to go stale.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .errors import RankwiseError, first_line
from .manifest import read_csv_strings, read_utf8_text
from .table import factorize

#: on_missing values: refuse ids missing on either side, or keep the ids both sides have.
ON_MISSING = ("error", "drop")


@dataclass(frozen=True)
class Alignment:
    """Manifest rows matched to feature rows by id.

    Attributes
    ----------
    feature_rows : int64 ``(n_kept,)``, the feature row of each kept manifest row, in
        manifest order.
    manifest_rows : int64 ``(n_kept,)``, the kept manifest rows (ascending).
    num_manifest_rows : rows of the manifest ``M``; ``dropped = M - n_kept``.
    ignored : feature rows whose id is not in the manifest (``drop`` only).
    dropped_example : the id of the first dropped manifest row, or ``None``.
    ids : where the feature ids came from; on_missing : the rule applied.
    """

    feature_rows: np.ndarray
    manifest_rows: np.ndarray
    num_manifest_rows: int
    ignored: int
    dropped_example: str | None
    ids: str
    on_missing: str

    @property
    def dropped(self) -> int:
        return self.num_manifest_rows - len(self.manifest_rows)

    def record(self) -> dict:
        """The store attribute ``id_alignment`` (plain JSON values)."""
        return {
            "ids": self.ids,
            "on_missing": self.on_missing,
            "manifest_rows": int(self.num_manifest_rows),
            "kept_rows": int(len(self.manifest_rows)),
            "dropped_rows": int(self.dropped),
            "dropped_example": self.dropped_example,
            "ignored_features": int(self.ignored),
            # which rows: two stores that dropped as many rows may have dropped others
            "kept_rows_sha256": hashlib.sha256(
                np.asarray(self.manifest_rows, dtype="<i8").tobytes()
            ).hexdigest(),
        }


def _as_strings(values: np.ndarray, where: str) -> np.ndarray:
    """A 1-D array of ids as strings; integers and strings only (a float id is ambiguous)."""
    values = np.asarray(values)
    if values.ndim != 1:
        raise RankwiseError(f"{where}: ids must be 1-D (one per feature row), found {values.shape}")
    if values.dtype.kind in "iu":
        return values.astype(str).astype(object)
    if values.dtype.kind in "USOT":
        if not all(isinstance(v, (str, bytes)) for v in values):
            raise RankwiseError(f"{where}: ids must be integers or strings")
        decoded = []
        for i, v in enumerate(values):
            try:
                decoded.append(v.decode() if isinstance(v, bytes) else str(v))
            except UnicodeDecodeError:
                raise RankwiseError(
                    f"{where}: id {i} (0-based), {bytes(v)!r}, is not UTF-8; save the ids as UTF-8 "
                    "strings (numpy.save of str, not bytes) or as integers"
                ) from None
        return np.array(decoded, dtype=object)
    raise RankwiseError(f"{where}: ids have dtype {values.dtype}; save them as integers or strings")


def read_ids(path: str | Path, *, column: str = "id") -> np.ndarray:
    """The ids in a ``.csv`` (``column``), ``.npy`` (1-D) or text file, as strings ``(N,)``."""
    path = Path(path)
    if not path.is_file():
        raise RankwiseError(f"{path}: ids file not found; check options.ids")
    if path.suffix.lower() == ".npy":
        try:
            values = np.load(path, allow_pickle=False)
        except (ValueError, OSError, EOFError) as exc:
            raise RankwiseError(
                f"{path}: not a readable .npy array of ids ({first_line(exc, 120)}); "
                "save a 1-D integer or string array with numpy.save"
            ) from None
        return _as_strings(values, str(path))
    if path.suffix.lower() == ".csv":
        table = read_csv_strings(path, "CSV of ids")
        if column not in table.columns:
            raise RankwiseError(
                f"{path}: no column {column!r} (found: {', '.join(table.columns) or 'none'}); "
                "set options.ids_column to the column holding the ids"
            )
        # already stripped of spaces and tabs, as manifest values are (read_csv_strings)
        values = np.array(list(table[column]), dtype=object)
        first_row = 2  # line of the first id (after the header)
    else:
        # lines as a CSV's (\n, \r\n or \r), each without the spaces and tabs around it,
        # as manifest ids are read: str.splitlines/strip also take other characters (a
        # no-break space, \x1c, \x85, ...), and an id keeping them in the manifest would
        # no longer match its own line here
        text = read_utf8_text(path, "text file of ids")
        lines = [line.strip(" \t") for line in re.split(r"\r\n|\r|\n", text)]
        while lines and not lines[-1]:  # trailing blank lines
            lines.pop()
        values = np.array(lines, dtype=object)
        first_row = 1
    empty = np.flatnonzero(values == "")
    if len(empty):
        raise RankwiseError(
            f"{path}: line {int(empty[0]) + first_row}: empty id; every row needs one"
        )
    return values


def zarr_ids(path: str | Path) -> np.ndarray:
    """The array ``ids`` of the Zarr group at ``path`` (one id per row), as strings ``(N,)``."""
    import zarr

    where = f"{path}/ids"
    try:
        group = zarr.open_group(str(path), mode="r", use_consolidated=False)
        node: Any = group["ids"]  # an array, or a Group
        values = np.asarray(node[...])
    except Exception as exc:  # zarr/numcodecs raise many types for bad bytes
        raise RankwiseError(
            f"{where}: cannot read the ids ({type(exc).__name__}); write the array again"
        ) from None
    return _as_strings(values, where)


def check_in_order(feature_ids: np.ndarray, manifest_ids, *, ids: str, manifest: str) -> None:
    """Refuse features read positionally whose own ids are not the manifest's, in order.

    For a Zarr group with an ``ids`` array given straight to ranking (no encode step to
    put it in manifest order): ids that agree row by row are fine, anything else is an
    error pointing at ``rankwise encode --kind precomputed``.
    """
    wanted = np.asarray(manifest_ids, dtype=object)
    if len(feature_ids) == len(wanted):
        differ = np.flatnonzero(feature_ids != wanted)
        if not len(differ):
            return
        i = int(differ[0])
        detail = f"row {i} (0-based) has id {feature_ids[i]!r}, the manifest {wanted[i]!r}"
    else:
        detail = f"{len(feature_ids)} ids for {len(wanted)} manifest rows"
    raise RankwiseError(
        f"{ids}: the features' ids are not the ids of {manifest} in order ({detail}); put "
        "them in manifest order by id first: rankwise encode --kind precomputed"
    )


def align(
    manifest_ids, feature_ids: np.ndarray, *, on_missing: str, manifest: str, ids: str
) -> Alignment:
    """Match manifest rows to feature rows by id (module docstring: the rules).

    Parameters
    ----------
    manifest_ids : ``(M,)`` unique strings, in manifest order.
    feature_ids : ``(N,)`` strings, one per feature row.
    on_missing : ``error`` or ``drop``.
    manifest, ids : the two files, for messages.
    """
    if on_missing not in ON_MISSING:
        raise RankwiseError(
            f"on_missing must be one of {', '.join(ON_MISSING)}, got {on_missing!r}"
        )
    wanted = np.asarray(manifest_ids, dtype=object)
    have = np.asarray(feature_ids, dtype=object)
    codes, uniques = factorize(have)
    copies = np.bincount(codes, minlength=len(uniques))
    dup = copies[codes] > 1
    if dup.any():
        first = int(np.flatnonzero(dup)[0])
        rows = np.flatnonzero(codes == codes[first])
        count = int(np.count_nonzero(copies > 1))
        raise RankwiseError(
            f"{ids}: {count} id(s) appear on more than one feature row, e.g. {have[first]!r} "
            f"on rows {int(rows[0])} and {int(rows[1])} (0-based); ids must be unique"
        )
    row_of = {v: i for i, v in enumerate(have.tolist())}
    # feature row per manifest row, -1 if none
    position = np.array([row_of.get(v, -1) for v in wanted.tolist()], dtype=np.int64)
    missing = np.flatnonzero(position < 0)
    listed = set(wanted.tolist())
    extra = np.flatnonzero(np.array([v not in listed for v in have.tolist()], dtype=bool))
    kept = np.flatnonzero(position >= 0)
    if not len(have):  # an empty export: no example feature id to show
        raise RankwiseError(
            f"{ids}: no feature rows (0 ids) for the {len(wanted)} ids of {manifest}; "
            "export the features again"
        )
    if not len(kept):  # first: neither exporting features nor on_missing: drop would help
        raise RankwiseError(
            f"{ids}: none of the {len(wanted)} ids of {manifest} has a feature row (e.g. "
            f"manifest id {wanted[0]!r}, feature id {have[0]!r}); ids compare as strings: "
            "check that both name the same items"
        )
    if on_missing == "error":
        if len(missing):
            raise RankwiseError(
                f"{ids}: {len(missing)} of the {len(wanted)} ids of {manifest} have no feature "
                f"row, e.g. {wanted[missing[0]]!r}; export features for them, or set "
                "options.on_missing: drop to evaluate without those rows"
            )
        if len(extra):
            raise RankwiseError(
                f"{ids}: {len(extra)} of the {len(have)} feature ids are not in {manifest}, e.g. "
                f"{have[extra[0]]!r}; pass the matching manifest, or set options.on_missing: "
                "drop to ignore them"
            )
    return Alignment(
        feature_rows=position[kept].astype(np.int64),
        manifest_rows=kept.astype(np.int64),
        num_manifest_rows=len(wanted),
        ignored=len(extra),
        dropped_example=str(wanted[missing[0]]) if len(missing) else None,
        ids=ids,
        on_missing=on_missing,
    )
