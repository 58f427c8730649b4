"""The protocol registry: one :class:`ProtocolSpec` per protocol, read by every layer.

A protocol says, for each query, which gallery items are *ranked* (valid) and which
of those are *relevant* (README, "What the numbers mean").  Everything a layer needs to
know about a protocol is declared here once, as data:

- the manifest checks read ``columns`` (required columns per role),
- :func:`rankwise.protocols.build_problem` reads the validity flags
  (``exclude_self``, ``exclude_same_camera``, ``junk_labels``, ``candidates``),
- the metrics read ``metric_families`` (report order) and the statistics ``unit``,
- the report reads ``headline`` (overview metrics; they pick the best encoder, in order),
- the CLI choices and help, and the config schema's ``protocol`` enum, read
  :data:`PROTOCOLS` and ``summary``.

Adding a protocol (or a variant of one) is one new spec here, plus its rule in
``build_problem`` when its validity is not expressible by the flags below.

This module imports nothing heavy: ``rankwise --help`` reads it.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import RankwiseError

ROLES = ("query", "gallery")


@dataclass(frozen=True)
class ProtocolSpec:
    """Everything protocol-specific, declared once.

    Attributes
    ----------
    name : the protocol's name (``--protocol``, ``protocol:`` in the config).
    summary : one line for help texts: who is ranked and who is relevant.
    columns : ``{role: required manifest columns}`` for ``query`` and ``gallery``.
    metric_families : metric families in report order; ``K`` stands for each cutoff
        (``"rankK"`` -> ``rank1``, ``rank5``, ...).
    headline : the overview's metrics; they pick the best encoder (``headline[0]``, the
        next ones on ties).
    unit, units : what one evaluated unit is called (``query`` / ``sketch``).
    exclude_self : the gallery item with the query's id is never ranked.
    exclude_same_camera : gallery items with the query's label AND camera are not ranked
        (by default; the protocol option ``exclude_same_camera`` can turn it off).
    junk_labels : gallery items whose label is in ``junk_labels`` are not ranked.
    candidates : ``"all"`` (every other gallery item is ranked, counted by the tile
        engine) or ``"sequence_gap"`` (only the query's sequence at frame + ``gap_frames``,
        listed per query; queries only at frames divisible by ``query_stride``).
    options : the protocol options it takes, beside ``distance``.
    min_candidates : a query with fewer valid items is skipped.
    """

    name: str
    summary: str
    columns: dict[str, tuple[str, ...]]
    metric_families: tuple[str, ...]
    headline: tuple[str, ...]
    unit: str = "query"
    units: str = "queries"
    exclude_self: bool = True
    exclude_same_camera: bool = False
    junk_labels: bool = False
    candidates: str = "all"
    options: tuple[str, ...] = ()
    min_candidates: int = 1

    @property
    def dense(self) -> bool:
        """Whether the non-relevant valid items are counted by the tile engine."""
        return self.candidates == "all"

    def required_columns(self, role: str) -> tuple[str, ...]:
        """Columns a manifest must have in ``role`` (``query`` or ``gallery``)."""
        if role not in ROLES:
            raise RankwiseError(f"role must be one of {', '.join(ROLES)}; got {role!r}")
        return self.columns[role]


_SPECS = (
    ProtocolSpec(
        name="recall",
        summary="all gallery items but the query's own id are ranked; same label is relevant",
        columns={"query": ("id", "label"), "gallery": ("id", "label")},
        metric_families=("recall@K", "map", "mrr", "minp", "precision@K", "r_precision", "map@r"),
        headline=("recall@1", "map@r", "map"),
    ),
    ProtocolSpec(
        name="reid",
        summary="re-ID: same label AND same camera and junk labels are not ranked",
        columns={"query": ("id", "label", "camera"), "gallery": ("id", "label", "camera")},
        metric_families=("rankK", "map", "minp", "mrr"),
        headline=("rank1", "map"),
        exclude_same_camera=True,
        junk_labels=True,
        options=(
            "junk_labels",
            "exclude_same_camera",
            "multi_query",
            "single_gallery_shot",
            "shot_repeats",
            "shot_seed",
            "drop_junk",
        ),
    ),
    ProtocolSpec(
        name="reassociation",
        summary="only the query's sequence at frame + gap_frames is ranked",
        columns={
            "query": ("id", "label", "sequence", "frame"),
            "gallery": ("id", "label", "sequence", "frame"),
        },
        metric_families=("rankK", "mrr"),
        headline=("rank1", "mrr"),
        candidates="sequence_gap",
        options=("gap_frames", "query_stride"),
        min_candidates=2,
    ),
    ProtocolSpec(
        name="progressive",
        summary="sketches revealed step by step: m@A, m@B over each sketch's renderings",
        columns={"query": ("id", "label", "sketch", "step"), "gallery": ("id", "label")},
        metric_families=("m@A", "m@B", "wm@A", "wm@B", "acc@K"),
        headline=("m@A", "m@B"),
        unit="sketch",
        units="sketches",
        exclude_self=False,
    ),
)

#: name -> spec, in the order help texts and the schema list them.
REGISTRY: dict[str, ProtocolSpec] = {spec.name: spec for spec in _SPECS}
#: The protocol names (CLI choices, the config schema's enum).
PROTOCOLS: tuple[str, ...] = tuple(REGISTRY)
#: Manifest columns holding integers.
INTEGER_COLUMNS = ("frame", "step")


def get_protocol(name: str) -> ProtocolSpec:
    """The spec of protocol ``name``, or an error listing the valid ones."""
    try:
        return REGISTRY[name]
    except (KeyError, TypeError):
        raise RankwiseError(
            f"unknown protocol {name!r}; valid protocols: {', '.join(PROTOCOLS)}"
        ) from None


def metric_family_names() -> tuple[str, ...]:
    """Every metric family of every protocol, once, in registry order."""
    return tuple(dict.fromkeys(f for spec in _SPECS for f in spec.metric_families))
