"""Option specs: each option's type, default, bounds and help, declared once.

An :class:`Option` is read by every layer that takes the option:

- the library checks a value with ``spec.check(value)``; the message names the
  parameter: ``query_block must be a positive integer, got 0``;
- the command line builds its click option with ``spec.click()``; the same check runs
  while the command line is parsed and names the flag: ``--query-block must be ...``;
- the config schema's fragment is ``spec.schema()``; config/schema.yaml holds the
  fragments verbatim (tests/test_options.py compares them; ``python -m
  rankwise.options --schema`` prints them, ``--check config/schema.yaml`` diffs them).

An :class:`OptionSet` is the options of one loader or encoder kind (declared beside
the loader / encoder: :data:`rankwise.datasets.LOADERS`, :data:`rankwise.demo.OPTIONS`,
:data:`rankwise.encoders.OPTIONS`): ``check(options)`` fills in the defaults, refuses
unknown and missing keys and checks each value (``pixels: option size must be ...``).

This module declares the options shared by the commands, the library and the config:
evaluation (protocol, distance, ks, ...), engine (query_block, gallery_chunk, ...),
statistics and report options. It imports only the standard library and the
protocol registry, so ``rankwise --help`` can read it.
"""

from __future__ import annotations

import contextlib
import math
import numbers
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .errors import RankwiseError
from .registry import PROTOCOLS, get_protocol

#: Bootstrap resamples (and random sign flips) of every interval and paired test, in
#: ``rankwise ci``, ``compare`` and ``report`` and their library functions.
DEFAULT_RESAMPLES = 10_000
#: The bootstrap holds a (resamples, metrics) float64 array: 10^7 x 10 is 800 MB, and a
#: Monte Carlo p-value resolves 1e-7, far below any Holm-adjusted threshold.
MAX_RESAMPLES = 10_000_000

#: How messages built far from the caller spell an option (:attr:`Option.spelled`):
#: ``"param"`` (``query_block``: Python, and the pipeline config's key) or ``"flag"``
#: (``--query-block``) while a command runs (:func:`flag_spelling`). A process-wide
#: setting, not a context variable: Dask's worker threads build messages too.
_SPELLING = "param"


@contextlib.contextmanager
def flag_spelling():
    """While the command line runs a command: messages name flags, not parameters."""
    global _SPELLING
    before, _SPELLING = _SPELLING, "flag"
    try:
        yield
    finally:
        _SPELLING = before


def spelled(name: str) -> str:
    """Parameter ``name`` as the caller writes it: ``--name-with-dashes`` while the command
    line runs a command (:func:`flag_spelling`), else ``name`` (a Python argument)."""
    return "--" + name.replace("_", "-") if _SPELLING == "flag" else name


_KINDS = (
    "integer",
    "number",
    "string",
    "boolean",
    "enum",
    "size",
    "cutoffs",
    "labels",
    "numbers",
    "object",
    "record",
)


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_bool(value: Any) -> bool:
    """``True``/``False`` or numpy's boolean scalar (``np.False_``: what a numpy
    comparison or a pandas cell gives), told apart without importing numpy."""
    kind = type(value)
    return isinstance(value, bool) or (
        kind.__module__ == "numpy" and kind.__name__ in ("bool", "bool_")  # numpy 2 / 1
    )


def _plain(value: Any) -> Any:
    """``value`` with numpy's scalars as Python's (``np.int64(5)`` -> ``5``,
    ``np.float32(0.25)`` -> ``0.25``, ``np.True_`` -> ``True``), also inside a list or
    tuple (kept a list or tuple); anything else as given."""
    if isinstance(value, (list, tuple)):
        items = [_plain(v) for v in value]
        return items if isinstance(value, list) else tuple(items)
    if _is_bool(value):
        return bool(value)
    if isinstance(value, numbers.Integral) and type(value) is not int:
        return int(value)
    if isinstance(value, numbers.Real) and type(value) not in (int, float):
        return float(value)
    return value


def _label_text(value: Any) -> str | None:
    """One label's text as a manifest holds it, or None when ``value`` is no label: text
    as given, an integer's digits, a float that is a whole number as the integer's
    (``-1.0`` -> ``"-1"``: how a DataFrame's float label column reads,
    :func:`rankwise.manifest.whole_number_text`)."""
    if isinstance(value, str):
        return value
    if _is_int(value):
        return str(int(value))
    if (
        _is_number(value)
        and float(value).is_integer()
        and abs(value) < 2.0**63  # beyond int64: whole_number_text keeps the float's text
    ):
        return str(int(value))
    return None


def _is_number(value: Any) -> bool:
    """A finite real (``inf`` as AQE's alpha zeroed every weight: "a zero vector")."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def _fmt(x: float) -> str:
    return str(x) if isinstance(x, int) else f"{x:g}"  # 2147483647, not 2.14748e+09


@dataclass(frozen=True)
class Option:
    """One option: its name (the parameter / config key; the flag is ``--name-with-dashes``),
    kind, default, bounds and help.

    ``kind``: ``integer``, ``number``, ``string``, ``boolean``, ``enum`` (``choices``),
    ``size`` (``[height, width]``, positive integers), ``cutoffs`` (positive integers,
    ``"1,5,10"`` on the command line), ``labels`` (strings, ``"-1,0"`` on the command
    line), ``numbers`` (``length`` numbers, each within the bounds), ``object`` (a
    mapping), ``record`` (named ``fields``, each an option: a mapping in the config and
    the library, or ``"a,b,c"`` in field order as on the command line; ``relation``
    checks the fields together and returns a message or None; the last ``optional_tail``
    fields may be left out of the ``"a,b,c"`` form, and an ``enum`` field is a word
    there). ``minimum`` /
    ``maximum`` are inclusive, ``above`` / ``below`` exclusive.
    ``nullable``: ``None`` is a value (meaning "automatic" / "not given").
    ``required``: no default; a loader / encoder must be given this key.
    ``noun``: for choices with a name of their own (``protocol``), the message lists
    them as ``unknown protocol 'x'; valid protocols: ...``.
    ``rule``: the wording of the bound in messages, where one reads better than the
    generated one (``at least 1``); ``unit`` completes a number's (``a positive number
    of MB``).
    ``schema_default``: write ``default:`` in the schema (the workflow fills some keys in
    itself, e.g. a manifest loader's protocol).
    ``words``: strings accepted besides the kind's values (``shot_repeats``: an integer
    or ``"exact"``); give ``rule`` to say so in messages.
    ``record_default``: False for an option added after stores were written with its
    kind: at its default it is left out of what is recorded (:meth:`OptionSet.recorded`),
    so stores and the pipeline's params read as before there was the option and nothing
    reruns for those who leave it unset.
    """

    name: str
    kind: str
    default: Any = None
    help: str = ""
    minimum: float | None = None
    maximum: float | None = None
    above: float | None = None
    below: float | None = None
    choices: tuple[str, ...] = ()
    nullable: bool = False
    required: bool = False
    length: int | None = None
    noun: str | None = None
    rule: str | None = None
    unit: str | None = None
    schema_default: bool = True
    words: tuple[str, ...] = ()
    fields: tuple[Option, ...] = ()
    relation: Callable[[dict[str, Any]], str | None] | None = None
    optional_tail: int = 0
    record_default: bool = True

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise ValueError(f"option {self.name}: unknown kind {self.kind!r}")

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def spelled(self) -> str:
        """The option as the caller writes it: the flag under the command line
        (:func:`flag_spelling`), else the parameter (also the pipeline config's key)."""
        return spelled(self.name)

    # ------------------------------------------------------------ checking

    def _bounds(self) -> str:
        """The bound, in words: ``a positive integer``, ``between 0 and 1 (exclusive)``."""
        if self.rule:
            return self.rule
        lo, hi, above, below = self.minimum, self.maximum, self.above, self.below
        if self.kind == "integer":
            if lo is not None and hi is not None:
                return f"an integer in {_fmt(lo)}..{_fmt(hi)}"
            if lo == 1:
                return "a positive integer"
            if lo == 0:
                return "a non-negative integer"
            return f"an integer >= {_fmt(lo)}" if lo is not None else "an integer"
        unit = f" of {self.unit}" if self.unit else ""
        if above is not None and below is not None:
            return f"between {_fmt(above)} and {_fmt(below)} (exclusive)"
        if above is not None and hi is not None:
            return f"a number in ({_fmt(above)}, {_fmt(hi)}]"
        if above == 0 and hi is None:
            return f"a positive number{unit}"
        if lo == 0 and hi is None:
            return f"a non-negative number{unit}"
        parts = [
            f">= {_fmt(lo)}" if lo is not None else None,
            f"> {_fmt(above)}" if above is not None else None,
            f"<= {_fmt(hi)}" if hi is not None else None,
            f"< {_fmt(below)}" if below is not None else None,
        ]
        return " ".join([f"a number{unit}", " and ".join(p for p in parts if p)]).strip()

    def _in_bounds(self, x: float) -> bool:
        return not (
            math.isnan(x)
            or (self.minimum is not None and x < self.minimum)
            or (self.maximum is not None and x > self.maximum)
            or (self.above is not None and x <= self.above)
            or (self.below is not None and x >= self.below)
        )

    def check(self, value: Any, label: str | None = None) -> Any:
        """``value`` checked and normalised (tuple for sequences, int for integers, bool
        for booleans, float for numbers: numpy's scalars come back as Python's).

        ``label`` names the option in the message (default: its name); the CLI passes
        the flag, an option set ``<owner>: option <name>``.
        """
        label = label or self.name
        if value is None and self.nullable:
            return None
        if isinstance(value, str) and value in self.words:
            return value

        def bad(what: str) -> RankwiseError:
            return RankwiseError(f"{label} must be {what}, got {value!r}")

        kind = self.kind
        if kind == "integer":
            if not _is_int(value) or not self._in_bounds(value):
                raise bad(self._bounds())
            return int(value)
        if kind == "number":
            if not _is_number(value) or not self._in_bounds(float(value)):
                raise bad(self._bounds())
            return _plain(value)  # np.float32(0.5) is not JSON; an int stays an int
        if kind == "string":
            if not isinstance(value, str):
                raise bad("a string")
            return value
        if kind == "boolean":
            if not _is_bool(value):
                raise bad("true or false")
            return bool(value)  # np.True_ is recorded (JSON) as True
        if kind == "enum":
            if value not in self.choices:
                if self.noun is None:
                    raise bad(f"one of {', '.join(self.choices)}")
                prefix = "" if label == self.name else f"{label}: "
                raise RankwiseError(
                    f"{prefix}unknown {self.noun} {value!r}; valid "
                    f"{self.noun}s: {', '.join(self.choices)}"
                )
            return value
        if kind == "size":
            if not (
                isinstance(value, (list, tuple))
                and len(value) == 2
                and all(_is_int(v) and v > 0 for v in value)
            ):
                raise bad("[height, width] (two positive integers)")
            return (int(value[0]), int(value[1]))
        if kind == "numbers":
            if not (
                isinstance(value, (list, tuple))
                and (len(value) == self.length if self.length else len(value) >= 1)
                and all(_is_number(v) and self._in_bounds(float(v)) for v in value)
            ):
                each = self.rule or ("" if self.above is None else f"each > {_fmt(self.above)}")
                count = f"{self.length} " if self.length else ""
                raise bad(f"a list of {count}numbers" + (f" ({each})" if each else ""))
            return tuple(_plain(v) for v in value)
        if kind == "object":
            if not isinstance(value, dict):
                raise bad("an object")
            return value
        if kind == "record":
            return self._check_record(value, label, bad)
        if kind == "cutoffs":
            return parse_cutoffs(value, label)
        # labels
        if isinstance(value, str):
            return tuple(j.strip() for j in value.split(",") if j.strip())
        rule = (
            "a list of labels: text, integers, or floats that are whole numbers (-1.0 is "
            "the label '-1', as in a DataFrame's float column)"
        )
        if not isinstance(value, (list, tuple)):
            raise bad(rule)
        texts = [_label_text(v) for v in value]
        if None in texts:
            v = value[texts.index(None)]
            text = repr(str(v)) if isinstance(v, float) and math.isfinite(v) else None
            raise RankwiseError(
                f"{label} must be {rule}; got {v!r} in {value!r}"
                + (f": write it as text ({text}) if the labels are so written" if text else "")
            )
        # manifest values are read without the spaces around them: " -1" is the label -1
        labels = tuple(t.strip() for t in texts if t is not None)
        if "" in labels:
            raise bad("a list of labels, none empty")
        return labels

    def _check_record(self, value: Any, label: str, bad: Callable) -> dict[str, Any]:
        """A ``record``: ``{field: value}`` in field order, each field checked (the
        message names ``<label> <field>``), then ``relation``."""
        names = [f.name for f in self.fields]
        # a field holding a list (verification's fprs) has no "a,b,c" form
        scalar = all(not isinstance(f.default, (list, tuple)) for f in self.fields)
        least = len(names) - self.optional_tail
        form = f"a mapping with keys {', '.join(names)}"
        if scalar:
            text = ",".join(names[:least]) + "".join(f"[,{n}]" for n in names[least:])
            example = ",".join(_fmt(f.default) for f in self.fields[:least])
            # a command-line flag takes the text form only; the config and the API both
            form = f"{text} (e.g. {example})" + ("" if label.startswith("--") else f" or {form}")
        if isinstance(value, str) and scalar:
            tokens = [t.strip() for t in value.split(",")]
            if not least <= len(tokens) <= len(names):
                raise bad(form)
            given: dict[str, Any] = {f.name: f.default for f in self.fields}
            for f, token in zip(self.fields, tokens, strict=False):  # a tail may be left out
                if f.kind == "enum":
                    given[f.name] = token
                    continue
                try:
                    given[f.name] = int(token) if re.fullmatch(r"[+-]?\d+", token) else float(token)
                except ValueError:
                    raise bad(form) from None
        elif isinstance(value, dict):
            unknown = sorted(set(map(str, value)) - set(names))
            if unknown:
                raise RankwiseError(
                    f"{label}: unknown key(s) {', '.join(unknown)}; valid keys: {', '.join(names)}"
                )
            given = {f.name: value.get(f.name, f.default) for f in self.fields}
        else:
            raise bad(form)
        out = {}
        for f in self.fields:
            checked = f.check(given[f.name], f"{label} {f.name}")
            out[f.name] = float(checked) if f.kind == "number" else checked
        message = self.relation(out) if self.relation else None
        if message:
            raise RankwiseError(f"{label}: {message}")
        return out

    # ------------------------------------------------------------ schema

    def schema(self) -> dict[str, Any]:
        """The JSON-schema fragment of this option (config/schema.yaml holds it)."""
        node: dict[str, Any]
        kind = self.kind
        if kind in ("integer", "number", "string", "boolean", "object"):
            node = {"type": [kind, "null"] if self.nullable else kind}
            for key, bound in (
                ("minimum", self.minimum),
                ("maximum", self.maximum),
                ("exclusiveMinimum", self.above),
                ("exclusiveMaximum", self.below),
            ):
                if bound is not None:
                    node[key] = bound
        elif kind == "enum":
            node = {"enum": list(self.choices) + ([None] if self.nullable else [])}
        elif kind == "size":
            node = (
                {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/size"}]}
                if self.nullable
                else {"$ref": "#/$defs/size"}
            )
        elif kind == "numbers":
            item: dict[str, Any] = {"type": "number"}
            for key, bound in (
                ("minimum", self.minimum),
                ("maximum", self.maximum),
                ("exclusiveMinimum", self.above),
                ("exclusiveMaximum", self.below),
            ):
                if bound is not None:
                    item[key] = bound
            node = {"type": "array", "items": item, "minItems": self.length or 1}
            if self.length:
                node["maxItems"] = self.length
        elif kind == "record":
            node = {
                "type": "object",
                "additionalProperties": False,
                "properties": {f.name: f.schema() for f in self.fields},
            }
            if self.nullable:
                node = {"anyOf": [{"type": "null"}, node]}
        elif kind == "cutoffs":
            node = {
                "type": "array",
                "items": {"type": "integer", "minimum": 1},
                "minItems": 1,
                "uniqueItems": True,
            }
        else:  # labels
            node = {"type": "array", "items": {"type": ["string", "integer"]}}
        if self.nullable and kind in ("cutoffs", "labels", "numbers"):
            node = {"anyOf": [{"type": "null"}, node]}
        if self.words:
            node = {"anyOf": [node, {"enum": list(self.words)}]}
        if not self.required and self.schema_default:
            node["default"] = _json_value(self.default)
        if self.help:
            node["description"] = self.help
        return node

    # ------------------------------------------------------------ command line

    def click(
        self, *, default: Any = ..., help: str | None = None, flag: str | None = None, **extra: Any
    ) -> Callable:
        """A click option for this spec: same default and check, messages name the flag.

        ``default=None`` makes the option optional on the command line ("automatic");
        ``extra`` goes to :func:`click.option` (``metavar``, ``type`` for paths...).
        """
        import click

        flag = flag or self.flag
        spec = self if default is ... else replace(self, nullable=self.nullable or default is None)
        value = self.default if default is ... else default
        types = {"integer": click.INT, "number": click.FLOAT, "boolean": click.BOOL}
        if self.kind == "record" and isinstance(value, dict):
            value = ",".join(str(v) for v in value.values())
        if self.kind in ("cutoffs", "labels") and isinstance(value, (list, tuple)):
            value = ",".join(str(v) for v in value)
        metavar = extra.pop("metavar", None)
        if metavar is None and self.kind == "enum":
            metavar = "[" + "|".join(self.choices) + "]"

        def callback(ctx, param, raw):
            if spec.words and isinstance(raw, str) and raw not in spec.words:
                # e.g. "--shot-repeats 20": the kind's value, given as text
                with contextlib.suppress(ValueError):
                    raw = int(raw) if spec.kind == "integer" else float(raw)
            return spec.check(raw, flag)

        return click.option(
            flag,
            self.name,
            default=value,
            show_default=value is not None,
            type=extra.pop("type", click.STRING if self.words else types.get(self.kind)),
            metavar=metavar,
            callback=callback,
            help=help if help is not None else self.help,
            **extra,
        )


def _json_value(value: Any) -> Any:
    """Tuples as lists: schema defaults are JSON values."""
    if isinstance(value, tuple):
        return [_json_value(v) for v in value]
    return value


def parse_cutoffs(value: Any, label: str = "ks") -> tuple[int, ...]:
    """``"1,5,10"`` or an iterable -> sorted unique positive ints, else a clear error."""
    if not isinstance(value, (str, list, tuple)):
        raise RankwiseError(
            f"{label} must be positive integers separated by commas (e.g. 1,5,10); got {value!r}"
        )
    items = value.split(",") if isinstance(value, str) else list(value)
    ks = []
    for item in items:
        token = str(item).strip()
        if not re.fullmatch(r"\+?\d+", token) or int(token) < 1:
            raise RankwiseError(
                f"{label} must be positive integers separated by commas "
                f"(e.g. 1,5,10); got {token!r} in {value!r}"
            )
        ks.append(int(token))
    if not ks:
        raise RankwiseError(f"{label} is empty; give at least one cutoff, e.g. 1,5,10")
    return tuple(sorted(set(ks)))


@dataclass(frozen=True)
class OptionSet:
    """The options of one loader or encoder kind (``owner``), checked together."""

    owner: str
    options: tuple[Option, ...]
    description: str = ""
    #: extra keys of the schema object (e.g. a ``description`` of alternatives)
    schema_extra: dict[str, Any] = field(default_factory=dict)

    @property
    def required(self) -> tuple[str, ...]:
        return tuple(o.name for o in self.options if o.required)

    @property
    def defaults(self) -> dict[str, Any]:
        """``{name: default}`` of the options that have one (JSON values)."""
        return {o.name: _json_value(o.default) for o in self.options if not o.required}

    def __getitem__(self, name: str) -> Option:
        return next(o for o in self.options if o.name == name)

    def recorded(self, values: dict[str, Any]) -> dict[str, Any]:
        """Checked ``values`` as a store and the pipeline's params record them: an option
        with ``record_default=False`` left out at its default."""
        return recorded(self.options, values)

    def check(self, options: dict[str, Any] | None) -> dict[str, Any]:
        """Defaults filled in, every value checked; unknown or missing keys are errors.

        Values keep their JSON form (lists, not tuples): they are recorded in stores.
        numpy's scalars come back as Python's (also in lists), so the record is the same
        as with Python's numbers; an ``object`` option (a factory's params) as given.
        """
        if options is None:
            options = {}
        if not isinstance(options, dict):
            raise RankwiseError(f"{self.owner}: options must be a JSON object, got {options!r}")
        names = [o.name for o in self.options]
        unknown = sorted(set(options) - set(names))
        if unknown:
            raise RankwiseError(
                f"{self.owner}: unknown option(s) {', '.join(unknown)}; valid "
                f"options: {', '.join(sorted(names)) or 'none'}"
            )
        missing = [k for k in self.required if options.get(k) in (None, "")]
        if missing:
            raise RankwiseError(
                f"{self.owner}: missing option(s) {', '.join(missing)}; add them to the options"
            )
        merged = {**self.defaults, **options}
        for option in self.options:
            option.check(merged[option.name], f"{self.owner}: option {option.name}")
            if option.kind != "object":  # np.int64(5) is recorded as 5, np.True_ as True
                merged[option.name] = _plain(merged[option.name])
        return merged

    def schema(self) -> dict[str, Any]:
        """The JSON-schema object of these options."""
        node: dict[str, Any] = {"type": "object", "additionalProperties": False}
        if self.description:
            node["description"] = self.description
        node.update(self.schema_extra)
        if self.required:
            node["required"] = list(self.required)
        node["properties"] = {o.name: o.schema() for o in self.options}
        return node


def group(*options: Option) -> dict[str, Option]:
    """``{name: option}`` in declaration order."""
    return {o.name: o for o in options}


# ---------------------------------------------------------------- evaluation

PROTOCOL = Option(
    "protocol",
    "enum",
    "recall",
    choices=PROTOCOLS,
    noun="protocol",
    help="who is ranked and who is relevant, per query",
)
DISTANCE = Option(
    "distance",
    "enum",
    "cosine",
    choices=("cosine", "euclidean"),
    noun="distance",
    help="cosine = 1 - cos (L2-normalised); euclidean = L2",
)
KS = Option("ks", "cutoffs", (1, 5, 10), help="cutoffs of recall@K / rankK / acc@K")
GAP_FRAMES = Option(
    "gap_frames",
    "integer",
    1,
    minimum=1,
    maximum=2**31 - 1,  # frames are within +-(2^31 - 1) (rankwise.manifest.MAX_INTEGER)
    help="reassociation, candidates at frame + gap_frames",
)
QUERY_STRIDE = Option(
    "query_stride",
    "integer",
    1,
    minimum=1,
    maximum=2**31 - 1,
    help="reassociation, queries only at frames divisible by query_stride (1 = every frame)",
)
JUNK_LABELS = Option(
    "junk_labels", "labels", ("-1",), help="reid, gallery labels removed before ranking"
)


def check_junk_labels(value: Any) -> tuple[str, ...]:
    """:data:`JUNK_LABELS` checked as the Python API takes it: a sequence or a numpy
    array, ``"-1,0"`` as the CLI reads it (``tuple("-1")`` would be ``('-', '1')``), or
    one label given as a number (``-1``, ``-1.0``)."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        value = [value]
    elif hasattr(value, "tolist") and not isinstance(value, str):  # a numpy array
        value = value.tolist()
    return JUNK_LABELS.check(value)


EXCLUDE_SAME_CAMERA = Option(
    "exclude_same_camera",
    "boolean",
    True,
    help="reid, same label AND same camera is not ranked; false keeps those as matches",
)
MULTI_QUERY = Option(
    "multi_query",
    "enum",
    "none",
    choices=("none", "mean", "max"),
    help="reid, one query per (label, camera): the mean or element-wise max of its query "
    "rows; none = every row is a query",
)
SINGLE_GALLERY_SHOT = Option(
    "single_gallery_shot",
    "boolean",
    False,
    help="reid, CUHK03 single-gallery-shot: rankK and mrr over one random gallery item per "
    "identity (shot_repeats draws), map and minp on the full list",
)
SHOT_REPEATS = Option(
    "shot_repeats",
    "integer",
    10,
    minimum=1,
    # each query's draws are held whole: repeats x identities keys (10^4 x 1,467 CUHK03
    # identities: ~120 MB); beyond, 'exact' is both exact and cheaper
    maximum=10_000,
    words=("exact",),
    rule="an integer from 1 to 10000, or 'exact' (the expectation over all draws)",
    help="single_gallery_shot draws per query, or exact = the expectation over all draws",
)
SHOT_SEED = Option(
    "shot_seed", "integer", 0, minimum=0, help="single_gallery_shot, seed of the draws"
)


#: The k-reciprocal re-ranking variants (rankwise.rerank says how they differ).
RERANK_VARIANTS = ("torchreid", "fastreid")


def recorded(options: Sequence[Option], values: dict[str, Any]) -> dict[str, Any]:
    """``values`` without those of ``options`` with ``record_default=False`` that are at
    their default (:meth:`OptionSet.recorded`)."""
    quiet = {o.name: _json_value(o.default) for o in options if not o.record_default}
    return {k: v for k, v in values.items() if k not in quiet or v != quiet[k]}


def recorded_rerank(rerank: dict[str, Any]) -> dict[str, Any]:
    """A checked ``rerank`` as stores record it and the rank rule's flag gives it: the
    default variant left out, so torchreid's re-ranking reads as it did before there were
    variants (its stores and pipeline params unchanged)."""
    return {k: v for k, v in rerank.items() if not (k == "variant" and v == RERANK_VARIANTS[0])}


def _k2_within_k1(values: dict[str, Any]) -> str | None:
    if values["k2"] > values["k1"]:
        return f"k2 must be at most k1, got k2={values['k2']} > k1={values['k1']}"
    return None


RERANK = Option(
    "rerank",
    "record",
    None,
    nullable=True,
    fields=(
        Option("k1", "integer", 20, minimum=1, help="k-reciprocal neighbours"),
        Option("k2", "integer", 6, minimum=1, help="local query expansion (1 = none); <= k1"),
        Option(
            "lambda", "number", 0.3, minimum=0, maximum=1, help="weight of the original distance"
        ),
        Option(
            "variant",
            "enum",
            "torchreid",
            choices=RERANK_VARIANTS,
            help="torchreid = Zhong et al.'s re_ranking (torchreid, fast-reid's re_ranking); "
            "fastreid = fast-reid's evaluator (TEST.RERANK: jaccard distance, OpenUnReID)",
        ),
    ),
    relation=_k2_within_k1,
    optional_tail=1,
    help="recall/reid, k-reciprocal re-ranking (Zhong et al. 2017) with k1, k2, lambda and "
    "the variant; null = none",
)
AQE = Option(
    "aqe",
    "record",
    None,
    nullable=True,
    fields=(
        Option("k", "integer", 5, minimum=1, help="neighbours averaged (the item itself included)"),
        Option("alpha", "number", 3.0, minimum=0, help="weight exponent: cos^alpha"),
    ),
    help="recall/reid, fast-reid's average query expansion of every embedding with k, "
    "alpha; null = none",
)


DROP_JUNK = Option(
    "drop_junk",
    "boolean",
    False,
    help="reid with rerank/aqe: gallery rows with a junk label are left out of the "
    "neighbour sets too, as torchreid's and fast-reid's loaders drop them (they are never "
    "ranked either way); false = Zhong et al.'s code on the whole gallery",
)

#: The options that only some protocols take (:attr:`rankwise.registry.ProtocolSpec.options`
#: names them): set to other than its default under a protocol that does not take it,
#: one is refused by the command line and the Python API, named in a note by the pipeline.
PROTOCOL_OPTIONS = (
    GAP_FRAMES,
    QUERY_STRIDE,
    JUNK_LABELS,
    EXCLUDE_SAME_CAMERA,
    MULTI_QUERY,
    SINGLE_GALLERY_SHOT,
    SHOT_REPEATS,
    SHOT_SEED,
    DROP_JUNK,
)


def rerank_applies(protocol: str) -> bool:
    """Whether re-ranking applies: one query per unit, every gallery item a candidate."""
    spec = get_protocol(protocol)
    return spec.dense and spec.unit == "query"


def check_rerank(
    value: Any, protocol: str, label: str = "rerank", spec: Option | None = None
) -> dict[str, Any] | None:
    """:data:`RERANK` (or ``spec``: :data:`AQE`) checked (``label`` names it: the
    parameter, the flag or the config key), and refused for a protocol it does not
    apply to (:func:`rerank_applies`)."""
    spec = spec or RERANK
    checked = spec.check(value, label)
    if checked is not None and not rerank_applies(protocol):
        valid = ", ".join(p for p in PROTOCOLS if rerank_applies(p))
        what = "k-reciprocal re-ranking" if spec is RERANK else "query expansion"
        raise RankwiseError(
            f"{label} does not apply to protocol {protocol!r}: {what} needs each query "
            f"ranked against the whole gallery (protocols {valid}); drop {label}"
        )
    return checked


def check_drop_junk(
    drop_junk: Any, protocol: str, rerank: Any, aqe: Any, label: str = "drop_junk"
) -> bool:
    """:data:`DROP_JUNK` checked: on, it needs a protocol with junk labels and re-ranking
    or query expansion to act on (it changes nothing else: junk rows are never ranked)."""
    from .registry import REGISTRY

    on = DROP_JUNK.check(drop_junk, label)
    if on and "drop_junk" not in get_protocol(protocol).options:
        takers = " or ".join(n for n, spec in REGISTRY.items() if "drop_junk" in spec.options)
        raise RankwiseError(
            f"{label} applies to protocol {takers} only (junk labels), not {protocol!r}; "
            f"remove {label}"
        )
    if on and rerank is None and aqe is None:
        others = "--rerank or --aqe" if label.startswith("--") else "rerank or aqe"
        raise RankwiseError(
            f"{label} only changes the neighbour sets of re-ranking and query expansion "
            f"(junk rows are never ranked): add {others}, or remove {label}"
        )
    return on


def check_rerank_alone(
    rerank: Any,
    aqe: Any,
    multi_query: Any = "none",
    single_gallery_shot: Any = False,
    *,
    flags: bool = False,
) -> None:
    """Re-ranking and query expansion are not combined with ``multi_query`` or
    ``single_gallery_shot`` (yet): the pooled queries were never tested through the
    k-reciprocal sets, and the single-shot draws rank on the plain distance.  ``flags``:
    the message names the CLI's flags (``--multi-query``) instead of the keys."""

    def name(option: Option) -> str:
        return option.flag if flags else option.name

    used = [name(o) for o, v in ((RERANK, rerank), (AQE, aqe)) if v is not None]
    variant = [
        name(o)
        for o, on in (
            (MULTI_QUERY, multi_query not in (None, "none")),
            (SINGLE_GALLERY_SHOT, single_gallery_shot is True),
        )
        if on
    ]
    if used and variant:
        raise RankwiseError(
            f"{' and '.join(used)} cannot be combined with {' and '.join(variant)} (not "
            "supported yet: each is exact alone); evaluate them separately"
        )


VERIFICATION_FPRS = Option(
    "fprs",
    "numbers",
    (1e-4, 1e-3, 1e-2),  # the levels fast-reid reports
    above=0,
    below=1,
    rule="each between 0 and 1 (exclusive)",
    help="FPR levels of TPR@FPR",
)
VERIFICATION_BINS = Option(
    "bins",
    "integer",
    60,
    minimum=1,
    maximum=10_000,  # each edge is placed by a search over the pairs: 10^9 bins took > 15 GB
    help="bins of the distance histograms",
)
VERIFICATION = Option(
    "verification",
    "record",
    None,
    nullable=True,
    fields=(VERIFICATION_FPRS, VERIFICATION_BINS),
    help="recall/reid, TPR@FPR, the ROC curve and the positive/negative distance histograms "
    "over all query-gallery pairs (the encoder's distances, before AQE/re-ranking) in the "
    "report; null = none",
)


def check_all_pairs(protocol: str, label: str, fix: str = "") -> None:
    """Refuse, naming ``label``, a protocol that does not pair every query with the whole
    gallery (verification metrics need every pair; :func:`rerank_applies`)."""
    if not rerank_applies(protocol):
        valid = ", ".join(p for p in PROTOCOLS if rerank_applies(p))
        raise RankwiseError(
            f"{label} does not apply to protocol {protocol!r}: it needs every query "
            f"paired with the whole gallery (protocols {valid}){fix}"
        )


def check_verification(value: Any, protocol: str, multi_query: Any = "none") -> dict | None:
    """:data:`VERIFICATION` checked, and refused where it does not apply: a protocol that
    does not pair every query with the whole gallery, or pooled queries."""
    checked = VERIFICATION.check(value)
    if checked is None:
        return None
    check_all_pairs(protocol, "verification", "; drop verification")
    if multi_query not in (None, "none"):
        raise RankwiseError(
            "verification does not combine with multi_query (its pairs are the single "
            "queries'); evaluate it in a dataset entry without multi_query"
        )
    return checked


AP = Option(
    "ap",
    "enum",
    "standard",
    choices=("standard", "trapezoid"),
    noun="AP variant",
    help="AP variant: standard, or the official Market-1501 trapezoid (recall, reid)",
)


def check_ap(value: Any, protocol: str, label: str = "ap") -> str:
    """:data:`AP` checked, and refused (naming ``label``) on a protocol that reports no
    AP (``reassociation``, ``progressive``): it would change nothing, yet be recorded."""
    ap = AP.check(value, label)
    spec = get_protocol(protocol)
    if ap != AP.default and "map" not in spec.metric_families:
        raise RankwiseError(
            f"{label} {ap} does not apply to protocol {spec.name!r}: it reports no AP "
            f"({', '.join(spec.metric_families)}); drop {label}"
        )
    return ap


def default_options(protocol: str) -> dict:
    """The ``options`` :func:`rankwise.protocols.build_problem` records for ``protocol``
    with every option at its default: what a report need not mention."""
    spec = get_protocol(protocol)
    if spec.candidates == "sequence_gap":
        return {"gap_frames": GAP_FRAMES.default, "query_stride": QUERY_STRIDE.default}
    options: dict = {}
    if spec.junk_labels:
        options["junk_labels"] = sorted({str(j) for j in JUNK_LABELS.default})
    if spec.exclude_same_camera:
        options["exclude_same_camera"] = EXCLUDE_SAME_CAMERA.default
    return options


#: The options of a dataset entry in the config that say how it is evaluated.
EVALUATION = group(
    PROTOCOL,
    DISTANCE,
    KS,
    GAP_FRAMES,
    QUERY_STRIDE,
    JUNK_LABELS,
    EXCLUDE_SAME_CAMERA,
    MULTI_QUERY,
    SINGLE_GALLERY_SHOT,
    SHOT_REPEATS,
    SHOT_SEED,
    AQE,
    RERANK,
    DROP_JUNK,
    VERIFICATION,
    AP,
)

# ---------------------------------------------------------------- engine

THREADS = Option("threads", "integer", 2, minimum=1, help="threads per encode/rank job")
QUERY_BLOCK = Option("query_block", "integer", 1024, minimum=1, help="queries per tile")
GALLERY_CHUNK = Option("gallery_chunk", "integer", 8192, minimum=1, help="gallery rows per tile")
# Which weights of the file, for the reid and timm encoders: the kinds that read a state
# dict (rankwise.torch_encoders.read_checkpoint); python factories read their own
CHECKPOINT_KEY = Option(
    "checkpoint_key",
    "string",
    None,
    nullable=True,
    record_default=False,  # added later: at null, stores and encode params are as before
    help="the weights to load: the checkpoint's entry (state_dict_ema, model_ema) or their "
    "keys' prefix (model_ema.module); null = found automatically (state_dict; not an EMA "
    "copy)",
)
REID_INTERPOLATION = Option(
    "interpolation",
    "enum",
    None,
    choices=("bilinear", "bicubic", "nearest"),
    nullable=True,
    record_default=False,  # added later: at null, stores and encode params are as before
    help="resize interpolation; null = the architecture's (bilinear, the reid package's and "
    "BoT-SORT's); fast-reid's own test transform is bicubic",
)
#: Every encoder option with ``record_default=False`` (a test keeps the list whole): the
#: pipeline's encode params leave them out at their default from this list, without
#: importing the encoders (numpy, PIL, pandas: ~0.3 s in every Snakemake run). By name,
#: whatever the kind: timm's and torchscript's ``interpolation`` is never null, so only
#: reid's is ever left out.
UNRECORDED_ENCODER_OPTIONS = (CHECKPOINT_KEY, REID_INTERPOLATION)


BATCH_SIZE = Option("batch_size", "integer", 64, minimum=1, help="images per encoder batch")
SCHEDULER = Option(
    "scheduler",
    "string",
    None,
    nullable=True,
    help="dask.distributed scheduler address; null = local threads",
)
WORKERS = Option(
    "workers",
    "integer",
    None,
    minimum=1,
    nullable=True,
    help="threads of the rank job; null = all cores",
)
MEMORY_LIMIT = Option(
    "memory_limit",
    "number",
    None,
    above=0,
    nullable=True,
    unit="MB",
    help="MB; refuse to start when the estimated peak exceeds it",
)

DEVICE = Option(
    "device",
    "enum",
    "cpu",
    choices=("cpu", "cuda", "auto", "torch-cpu"),
    help="rank engine similarities: cpu (numpy), cuda (torch), auto (cuda if torch sees a "
    "GPU), torch-cpu (the cuda code on the CPU: tests)",
)

#: The config's ``engine:`` keys (none of them changes a number).
ENGINE = group(THREADS, QUERY_BLOCK, GALLERY_CHUNK, BATCH_SIZE, SCHEDULER, DEVICE)

# ---------------------------------------------------------------- statistics and report

RESAMPLES = Option(
    "resamples",
    "integer",
    DEFAULT_RESAMPLES,
    minimum=1,
    maximum=MAX_RESAMPLES,
    help="bootstrap resamples (and random sign flips)",
)
FLIPS = replace(RESAMPLES, name="flips", help="random sign flips of a paired test")
SEED = Option("seed", "integer", 0, minimum=0, help="seed of the resampling")
CONFIDENCE = Option(
    "confidence",
    "number",
    0.95,
    above=0,
    below=1,
    help="coverage of the percentile bootstrap interval",
)
BY = Option(
    "by",
    "enum",
    "query",
    choices=("query", "identity"),
    help="resample queries (sketches for progressive), or identities with all their queries",
)
EXACT_MAX = Option(
    "exact_max",
    "integer",
    16,
    minimum=0,
    maximum=20,
    help="enumerate all 2^n sign flips when there are at most this many queries (identities)",
)

TITLE = Option("title", "string", "rankwise report", help="heading of the report")
#: The CMC curve is one Python float per rank in every report.json and statistics
#: summary: 10^5 ranks (a 2 MB curve) covers any gallery worth plotting rank by rank,
#: and a typo such as 10^12 is refused instead of filling the memory.
MAX_CMC_RANK = 100_000
CMC_MAX_RANK = Option(
    "cmc_max_rank",
    "integer",
    50,
    minimum=1,
    maximum=MAX_CMC_RANK,
    help="CMC curves cover ranks 1..cmc_max_rank",
)
REPORT_RESAMPLES = replace(
    RESAMPLES,
    minimum=0,
    rule=f"an integer in 0..{MAX_RESAMPLES} (0: no intervals or tests)",
    help="bootstrap resamples per 95% interval (the tests use at least "
    "as many); 0 = no intervals or tests",
)
WORST_QUERIES = Option(
    "worst_queries",
    "integer",
    5,
    minimum=0,
    rule="a non-negative integer (0: none)",
    help="lowest-AP queries (lowest m@B sketches) listed per dataset; 0 = none",
)
WORST_ENCODERS = Option(
    "worst_encoders",
    "enum",
    "best",
    choices=("best", "all"),
    help="whose worst queries are listed; best = highest headline metric of the dataset",
)
TOP_K = Option(
    "top_k", "integer", 10, minimum=1, rule="at least 1", help="gallery items shown per worst query"
)

FIGURE_FORMATS = Option(
    "figure_formats",
    "enum",
    "svg,pdf",
    choices=("svg,pdf", "svg", "pdf"),
    help="files of each paper figure (results/figures/); a PDF costs about twice an SVG "
    "(font embedding)",
)

#: The config's ``report:`` keys (``rankwise report`` options).
REPORT = group(
    TITLE,
    CMC_MAX_RANK,
    REPORT_RESAMPLES,
    SEED,
    BY,
    WORST_QUERIES,
    WORST_ENCODERS,
    TOP_K,
    FIGURE_FORMATS,
)


# ---------------------------------------------------------------- schema fragments


def schema_fragments() -> dict[tuple[str, ...], Any]:
    """Every generated part of config/schema.yaml: ``{key path: fragment}``."""
    from .datasets import LOADERS
    from .encoders import OPTIONS as ENCODERS

    def branches(key: str, names: Sequence[str], prefix: str) -> list[dict[str, Any]]:
        return [
            {
                "if": {"properties": {key: {"const": name}}},
                "then": {
                    "properties": {
                        "options": {"$ref": f"#/$defs/{prefix}_{name.replace('-', '_')}"}
                    }
                },
            }
            for name in names
        ]

    fragments: dict[tuple[str, ...], Any] = {
        ("properties", "engine", "properties"): {n: o.schema() for n, o in ENGINE.items()},
        ("properties", "report", "properties"): {n: o.schema() for n, o in REPORT.items()},
        ("$defs", "dataset", "properties", "loader", "enum"): list(LOADERS),
        ("$defs", "dataset", "allOf"): branches("loader", list(LOADERS), "loader"),
        ("$defs", "encoder", "properties", "kind", "enum"): list(ENCODERS),
        ("$defs", "encoder", "allOf"): branches("kind", list(ENCODERS), "encoder"),
    }
    for name, option in EVALUATION.items():
        fragments[("$defs", "dataset", "properties", name)] = option.schema()
    for name, loader in LOADERS.items():
        fragments[("$defs", f"loader_{name.replace('-', '_')}")] = loader.options.schema()
    for kind, options in ENCODERS.items():
        fragments[("$defs", f"encoder_{kind.replace('-', '_')}")] = options.schema()
    return fragments


def schema_differences(schema: dict[str, Any]) -> list[str]:
    """Key paths whose fragment in ``schema`` differs from the generated one."""
    wrong = []
    for path, expected in schema_fragments().items():
        node: Any = schema
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        if node != expected:
            wrong.append(".".join(path))
    return wrong


def dump_yaml(node: Any, indent: int = 0, width: int = 110) -> str:
    """YAML in config/schema.yaml's style: a mapping or list on one line (flow style)
    when it fits in ``width`` columns, else one key per line."""
    import yaml

    pad = " " * indent

    def flow(value: Any) -> str:
        return (
            yaml.safe_dump(value, default_flow_style=True, width=10**6, sort_keys=False)
            .strip()
            .removesuffix("\n...")
            .strip()
        )

    lines = []
    items = node.items() if isinstance(node, dict) else [(None, v) for v in node]
    for key, value in items:
        head = f"{pad}{flow(key)}:" if key is not None else f"{pad}-"
        text = flow(value)
        fits = len(head) + 1 + len(text) <= width
        if key is None and isinstance(value, dict) and len(value) > 1:
            fits = False  # list items of several keys: one key per line, like their siblings
        if not isinstance(value, (dict, list)) or not value or fits:
            lines.append(f"{head} {text}")
        elif key is None and isinstance(value, dict):  # "- key: ..." then the other keys
            block = dump_yaml(value, indent + 2, width).splitlines()
            lines.append(f"{pad}- {block[0].lstrip()}")
            lines.extend(block[1:])
        else:
            lines.append(head)
            lines.append(dump_yaml(value, indent + 2, width).rstrip("\n"))
    return "\n".join(lines) + "\n"


def _main(argv: Sequence[str] | None = None) -> int:
    import argparse

    import yaml

    parser = argparse.ArgumentParser(
        prog="python -m rankwise.options", description="The config schema's generated fragments."
    )
    parser.add_argument(
        "--schema",
        action="store_true",
        help="print every generated fragment (YAML), keyed by its path",
    )
    parser.add_argument(
        "--check",
        metavar="SCHEMA",
        help="list the fragments of SCHEMA (config/schema.yaml) that differ",
    )
    args = parser.parse_args(argv)
    if args.check:
        with open(args.check, encoding="utf-8") as file:
            wrong = schema_differences(yaml.safe_load(file))
        for dotted in wrong:
            print(
                f"{args.check}: {dotted} differs from the option specs; paste the fragment "
                "printed by `python -m rankwise.options --schema`"
            )
        return 1 if wrong else 0
    for path, fragment in schema_fragments().items():
        print(f"# {'.'.join(path)}")
        print(dump_yaml({path[-1]: fragment}), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
