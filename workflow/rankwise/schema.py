"""What rankwise's own files hold, checked once where each kind is read.

rankwise reads back what it wrote: ranks and embedding stores (their Zarr attributes),
statistics summaries, the JSON of ``rankwise metrics`` and ``rankwise verify``, the
report's cache entries.  A hand-edited file, one cut short or one written by another
tool can lack a key or hold a value of another type; read as it stands, that is a
``KeyError`` traceback far from the file, or a number computed from the wrong thing.

Each kind declares its keys once, as a table ``{dotted key: Field}`` beside its reader
(:data:`rankwise.store.RANKS_ATTRS`, :data:`rankwise.embeddings.EMBEDDING_ATTRS`,
:data:`rankwise.summary.SUMMARY_META`, :data:`rankwise.report.document.METRICS_JSON`
and ``VERIFICATION_JSON``, :data:`rankwise.report.pairs.PAIR_ENTRY`,
:data:`rankwise.report.worst.WORST_QUERIES`), and its reader calls :func:`check` (an
error in one line naming the file, the key and the command that writes the file) or,
for a cache that recomputes what it cannot use, :func:`problem` (``None``: nothing
wrong).  A table built from another (:func:`optional`) keeps one home per key: the
metrics JSON's ``provenance`` is the ranks store's attributes, which hold the embedding
stores'.  A key ``"a.b"`` is key ``b`` of the object under ``a``; it is checked only when
``a`` is there (``a``'s own field says whether it must be).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from .errors import RankwiseError


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


#: kind -> (what it must be, in a message; the test of a value)
KINDS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "string": ("a string", lambda v: isinstance(v, str)),
    "path": ("a path", lambda v: isinstance(v, str)),
    "integer": ("an integer", _integer),
    "count": ("a non-negative integer", lambda v: _integer(v) and v >= 0),
    "number": ("a number", _number),
    "boolean": ("true or false", lambda v: isinstance(v, bool)),
    "object": ("an object", lambda v: isinstance(v, dict)),
    "list": ("a list", lambda v: isinstance(v, list)),
    "strings": (
        "a list of strings",
        lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
    ),
    "numbers": ("a list of numbers", lambda v: isinstance(v, list) and all(map(_number, v))),
    "interval": (
        "a [low, high] pair of numbers",
        lambda v: isinstance(v, list) and len(v) == 2 and all(map(_number, v)),
    ),
}


@dataclass(frozen=True)
class Field:
    """One key of a file.

    kind : one of :data:`KINDS`.
    required : the key must be there (else it may be absent).
    nullable : ``null`` is allowed (and then not checked further).
    choices : the allowed values.
    length : ``(other key, offset)``: a list whose length is that of the list under the
        other key plus ``offset``, or the other key's integer plus ``offset``.
    each : an object's values are each of this kind (named ``key.name`` in messages).
    when : ``(other key, value)``: checked only when the other key holds that value (a
        copy of another file's keys, checked only when that file is rankwise's own).
    """

    kind: str
    required: bool = False
    nullable: bool = False
    choices: tuple | None = None
    length: tuple[str, int] | None = None
    each: str | None = None
    when: tuple[str, Any] | None = None


def optional(
    table: Mapping[str, Field],
    prefix: str = "",
    *,
    nullable: bool = False,
    when: tuple[str, Any] | None = None,
) -> dict[str, Field]:
    """``table`` with every key optional (and ``null`` allowed if ``nullable``), its keys
    (and those its fields' ``when`` names) under ``prefix`` (``"a."``); ``when``: that of
    the fields without one, a key of the new table."""
    return {
        prefix + key: replace(
            field,
            required=False,
            nullable=field.nullable or nullable,
            when=when if field.when is None else (prefix + field.when[0], field.when[1]),
        )
        for key, field in table.items()
    }


_MISSING = object()


def _lookup(data: Any, key: str) -> Any:
    """The value under dotted ``key``, or ``_MISSING`` (a parent absent or not an
    object: its own field reports that)."""
    for part in key.split("."):
        if not isinstance(data, dict) or part not in data:
            return _MISSING
        data = data[part]
    return data


def _shown(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


def problem(data: Any, table: Mapping[str, Field], *, noun: str = "") -> str | None:
    """What is wrong with ``data`` against ``table`` (the first key in table order), in
    words naming the key (``noun``: what to call a key, e.g. ``"attribute "``), or
    ``None``."""
    if not isinstance(data, dict):
        return f"holds {_shown(data)}, not an object of keys"
    for key, field in table.items():
        parent = key.rpartition(".")[0]
        if parent and not isinstance(_lookup(data, parent), dict):
            continue
        if field.when is not None and _lookup(data, field.when[0]) != field.when[1]:
            continue
        value = _lookup(data, key)
        if value is _MISSING:
            if field.required:
                return f"{noun}'{key}' is missing"
            continue
        if value is None and field.nullable:
            continue
        what, test = KINDS[field.kind]
        if not test(value):
            return f"{noun}'{key}' must be {what}{' or null' * field.nullable}, got {_shown(value)}"
        if field.each is not None:
            what, test = KINDS[field.each]
            for name, item in value.items():
                if not test(item):
                    return f"{noun}'{key}.{name}' must be {what}, got {_shown(item)}"
        if field.choices is not None and value not in field.choices:
            return (
                f"{noun}'{key}' must be one of {', '.join(map(str, field.choices))}, "
                f"got {_shown(value)}"
            )
        if field.length is not None:
            other, offset = field.length
            base = _lookup(data, other)
            size = len(base) if isinstance(base, list) else base if _integer(base) else None
            if size is not None and len(value) != size + offset:
                return (
                    f"{noun}'{key}' has {len(value)} items, expected {size + offset} "
                    f"(to match '{other}')"
                )
    return None


#: The layout of rankwise's Zarr stores (ranks, embeddings: their arrays, attributes and
#: what they mean), written as each store's ``rankwise_format`` attribute.  A release that
#: changes the layout in a way an older reader would misread raises it; a reader refuses a
#: larger number than its own.  A store without the attribute (older ones) is format 1.
STORE_FORMAT = 1


def check_store_format(attrs: Mapping[str, Any], where: str, fix: str) -> None:
    """Refuse a store of another layout than this version's: a ``rankwise_format``
    above :data:`STORE_FORMAT` (a newer rankwise wrote it) or not a positive integer
    (``fix``: the command that writes the store again, with this version)."""
    found = attrs.get("rankwise_format", 1)
    if not (_integer(found) and found >= 1):
        raise RankwiseError(
            f"{where}: store attribute 'rankwise_format' must be a positive integer, "
            f"found {found!r}; {fix}"
        )
    if found > STORE_FORMAT:
        raise RankwiseError(
            f"{where}: written by a newer rankwise (store format {found}; this version "
            f"reads format {STORE_FORMAT} and older), whose layout it could misread; "
            f"upgrade rankwise (pip install -U rankwise), or {fix}"
        )


def check(data: Any, table: Mapping[str, Field], *, where: str, fix: str, noun: str = "") -> None:
    """Refuse ``data`` read from ``where`` unless it matches ``table``: one line naming
    ``where``, the key and ``fix`` (the command that writes the file)."""
    found = problem(data, table, noun=noun)
    if found is not None:
        raise RankwiseError(f"{where}: {found}; {fix}")
