"""The Python API: ``rankwise.evaluate`` and ``rankwise.recall_at_k``."""

from __future__ import annotations

import copy
import json
import sys
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from .metrics import compute_metrics, parse_ks
from .options import (
    DEVICE,
    DROP_JUNK,
    EXCLUDE_SAME_CAMERA,
    GALLERY_CHUNK,
    GAP_FRAMES,
    JUNK_LABELS,
    KS,
    MULTI_QUERY,
    PROTOCOL_OPTIONS,
    QUERY_BLOCK,
    QUERY_STRIDE,
    SHOT_REPEATS,
    SHOT_SEED,
    SINGLE_GALLERY_SHOT,
    check_ap,
    check_junk_labels,
    default_options,
)
from .registry import get_protocol

if TYPE_CHECKING:  # the engine (numba) loads only when ranking: `rankwise metrics` and
    # the report read ranks stores without it
    from .ranking import RankResult
    from .table import Table

REPORT_KEYS = (
    "protocol",
    "distance",
    "num_queries",
    "num_skipped",
    "num_gallery",
    "embedding_dim",
    "metrics",
)


@dataclass
class EvaluationResult:
    """Numbers of one evaluation.

    ``metrics`` maps names (``rank1``, ``map``, ...) to percentages; ``per_query``
    holds per evaluated query arrays (``query_index``, ``first_rank``, ``ap``, ``inp``,
    ``rr``, ``num_relevant``; progressive adds ``sketches``).  ``variant``: what says
    which numbers these are when they are not the protocol's defaults
    (:func:`variant_keys`: ``protocol_options``, ``ap``), part of the JSON report.
    """

    protocol: str
    distance: str
    num_queries: int
    num_skipped: int
    num_gallery: int
    embedding_dim: int
    metrics: dict[str, float]
    per_query: dict[str, Any] = field(default_factory=dict, repr=False)
    variant: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The JSON report: exactly the keys the README lists, and ``variant``'s (a copy:
        editing it leaves the result as it is)."""
        report = {key: getattr(self, key) for key in REPORT_KEYS} | self.variant
        return copy.deepcopy(report)


def variant_keys(attrs: dict[str, Any], ap: str = "standard") -> dict[str, Any]:
    """What a report adds to those keys so that it says which numbers it holds:
    ``protocol_options`` when the ranks store's options differ from its protocol's
    defaults (re-ranking, query expansion, multi-query, single-gallery-shot, other junk
    labels, kept same-camera matches, another gap), ``ap`` when it is not the standard
    AP. Empty for a default run, whose report keeps exactly those keys."""
    keys: dict[str, Any] = {}
    options = attrs.get("protocol_options") or {}
    if options != default_options(attrs["protocol"]):
        keys["protocol_options"] = options
    if ap != "standard":
        keys["ap"] = ap
    return keys


def format_text(report: dict[str, Any]) -> str:
    """Text report of a JSON report dict (with the keys of :func:`variant_keys` when
    present)."""
    lines = [
        "[evaluation]",
        f"protocol: {report['protocol']}",
        *(
            [f"protocol options: {json.dumps(report['protocol_options'], sort_keys=True)}"]
            if "protocol_options" in report
            else []
        ),
        *([f"ap: {report['ap']}"] if "ap" in report else []),
        f"distance: {report['distance']}",
        f"num queries: {report['num_queries']}",
        f"num skipped: {report['num_skipped']}",
        f"num gallery: {report['num_gallery']}",
        f"embedding_dim: {report['embedding_dim']}",
        "[metrics]",
    ]
    lines += [f"{name}: {value:.4f}" for name, value in report["metrics"].items()]
    return "\n".join(lines) + "\n"


def result_from_ranks(
    ranks: RankResult | tuple[dict, dict], *, ks=(1, 5, 10), ap: str = "standard"
) -> EvaluationResult:
    """Metrics of a rank result or of ``(arrays, attrs)`` read from a ranks store."""
    if isinstance(ranks, tuple):
        arrays, attrs = ranks
    else:
        arrays, attrs = ranks.arrays(), ranks.attrs
    check_ap(ap, attrs["protocol"])
    metrics, pq = compute_metrics(arrays, attrs, ks=parse_ks(ks), ap=ap)
    return EvaluationResult(
        protocol=attrs["protocol"],
        distance=attrs["distance"],
        num_queries=int(attrs["num_queries"]),
        num_skipped=int(attrs["num_skipped"]),
        num_gallery=int(attrs["num_gallery"]),
        embedding_dim=int(attrs["embedding_dim"]),
        metrics=metrics,
        per_query=pq,
        variant=variant_keys(attrs, ap),
    )


_PROTOCOL_OPTIONS = {spec.name: spec for spec in PROTOCOL_OPTIONS}


def _refuse_ignored(protocol: str, single_gallery_shot: bool, **given: Any) -> None:
    """An option the protocol does not take, given a value other than its default, is an
    error, as on the command line: it would be ignored without a word (``junk_labels``
    under the default ``recall`` ranked the junk rows)."""
    from .errors import RankwiseError
    from .registry import REGISTRY

    taken = get_protocol(protocol).options
    for name, value in given.items():
        if value == _PROTOCOL_OPTIONS[name].default:
            continue
        if name in taken:
            if name.startswith("shot_") and not single_gallery_shot:
                raise RankwiseError(
                    f"{name} applies with single_gallery_shot=True only; pass it or leave "
                    f"{name} out"
                )
            continue
        takers = [n for n, spec in REGISTRY.items() if name in spec.options]
        raise RankwiseError(
            f"{name}={value!r} applies to protocol {' or '.join(takers)} only, not "
            f"{protocol!r}: it would be ignored; pass protocol={takers[0]!r} or leave "
            f"{name} out"
        )


class _DefaultProtocol(str):
    """``protocol``'s default, ``"recall"`` (as signatures and ``help()`` show it), told
    apart from a ``"recall"`` the caller passes: only the default warns on manifests that
    look like re-identification data (:func:`_reid_hint`)."""


_DEFAULT_PROTOCOL = _DefaultProtocol("recall")


def _outside_rankwise() -> int:
    """The ``stacklevel`` that makes a warning raised by this function's caller name the
    first line outside the rankwise package: the user's call, through :func:`evaluate`
    or :func:`rank` alike."""
    level, frame = 1, sys._getframe(1)
    while frame.f_globals.get("__name__", "").split(".")[0] == "rankwise" and frame.f_back:
        level, frame = level + 1, frame.f_back
    return level


def _reid_hint(query: Table, gallery: Table) -> str | None:
    """The :class:`~rankwise.errors.ProtocolHint` that ``recall`` ran by default on
    manifests that look like re-identification data, as the command line's note says
    (:func:`rankwise.manifest.reid_signs`), or None."""
    from .manifest import reid_signs

    found = reid_signs(query, gallery)
    if found is None:
        return None
    return (
        "ran protocol recall (the default), but the manifests look like re-identification "
        f'data ({found}); pass protocol="reid" to exclude same-camera matches and junk '
        'labels, or protocol="recall" to silence this warning'
    )


def rank(
    query,
    gallery,
    query_embeddings,
    gallery_embeddings,
    *,
    protocol: str = _DEFAULT_PROTOCOL,
    distance: str = "cosine",
    gap_frames: int = GAP_FRAMES.default,
    query_stride: int = QUERY_STRIDE.default,
    junk_labels: Iterable[str] = JUNK_LABELS.default,
    exclude_same_camera: bool = EXCLUDE_SAME_CAMERA.default,
    multi_query: str = MULTI_QUERY.default,
    single_gallery_shot: bool = SINGLE_GALLERY_SHOT.default,
    shot_repeats: int | str = SHOT_REPEATS.default,
    shot_seed: int = SHOT_SEED.default,
    rerank: dict | str | None = None,
    aqe: dict | str | None = None,
    drop_junk: bool = DROP_JUNK.default,
    query_block: int = QUERY_BLOCK.default,
    gallery_chunk: int = GALLERY_CHUNK.default,
    workers: int | None = None,
    scheduler=None,
    progress: bool = False,
    memory_limit_mb: float | None = None,
    device: str = DEVICE.default,
) -> RankResult:
    """Validate the inputs and compute the ranks (see :func:`evaluate` for parameters)."""
    from .inputs import open_inputs
    from .options import AQE, check_drop_junk, check_rerank, check_rerank_alone
    from .ranking import EngineOptions, check_distance, compute_ranks

    defaulted = protocol is _DEFAULT_PROTOCOL
    if defaulted:
        protocol = "recall"
    check_distance(distance)
    junk_labels = check_junk_labels(junk_labels)
    # checked here, before anything compares them (np.True_ is not True): each comes
    # back a Python bool, recorded as such
    exclude_same_camera = EXCLUDE_SAME_CAMERA.check(exclude_same_camera)
    single_gallery_shot = SINGLE_GALLERY_SHOT.check(single_gallery_shot)
    _refuse_ignored(
        protocol,
        single_gallery_shot,
        gap_frames=gap_frames,
        query_stride=query_stride,
        junk_labels=junk_labels,
        exclude_same_camera=exclude_same_camera,
        shot_repeats=shot_repeats,
        shot_seed=shot_seed,
    )
    rerank = check_rerank(rerank, get_protocol(protocol).name)
    aqe = check_rerank(aqe, protocol, "aqe", AQE)
    check_rerank_alone(rerank, aqe, multi_query, single_gallery_shot)
    drop_junk = check_drop_junk(drop_junk, protocol, rerank, aqe)
    options = EngineOptions(
        query_block=query_block,
        gallery_chunk=gallery_chunk,
        workers=workers,
        scheduler=scheduler,
        progress=progress,
        memory_limit_mb=memory_limit_mb,
        device=device,
    )
    inputs = open_inputs(query, gallery, query_embeddings, gallery_embeddings, protocol=protocol)
    hint = _reid_hint(inputs.query, inputs.gallery) if defaulted else None
    query_rows = len(inputs.query)  # the evaluated manifest's rows (before pooling)
    # the manifest's row of each kept query row (id-keyed, on_missing: drop), taken
    # before pooling: the pooled source is an array that knows no manifest rows
    manifest_rows = inputs.query_embeddings.manifest_rows
    inputs = inputs.pool(multi_query, distance=distance)
    pooled = inputs.pooled
    problem = inputs.problem(
        gap_frames=gap_frames,
        query_stride=query_stride,
        junk_labels=junk_labels,
        exclude_same_camera=exclude_same_camera,
        single_gallery_shot=single_gallery_shot,
        shot_repeats=shot_repeats,
        shot_seed=shot_seed,
    )
    if rerank is not None or aqe is not None:  # their item order (rerank.item_order)
        from .protocols import id_keys

        problem = replace(problem, gkey=id_keys(inputs.gallery["id"]))
    q_src, g_src = inputs.query_embeddings, inputs.gallery_embeddings
    shots = None
    if problem.options.get("single_gallery_shot"):
        # What the draws are keyed by (single_shot's docstring): query ids, gallery
        # rows by (label, id).
        g_label, g_id = inputs.gallery["label"], inputs.gallery["id"]
        shots = (inputs.query["id"], np.lexsort((g_id, g_label)))
    # The string tables are no longer needed: free them before the tiles are allocated
    # (2M gallery rows hold ~240 MB of Python strings).
    del inputs
    result = compute_ranks(
        problem, q_src, g_src, distance=distance, options=options, rerank=rerank, aqe=aqe,
        drop_junk=drop_junk,
    )  # fmt: skip
    # what --by identity's labels must match (rankwise.stats.query_labels)
    result.attrs["num_query_rows"] = query_rows
    result.query_rows = manifest_rows
    if shots is not None:
        from .single_shot import shot_ranks

        result.extra.update(
            shot_ranks(
                problem,
                q_src,
                g_src,
                evaluated=result.query_index,
                query_ids=shots[0],
                gallery_order=shots[1],
                cosine=distance == "cosine",
                query_block=query_block,
            )
        )
    if pooled is not None:
        # Pooled query p is reported as its representative's manifest row; its members
        # are listed beside it.
        p = result.query_index
        sizes = np.diff(pooled.offsets)[p]
        members = [pooled.members[pooled.offsets[i] : pooled.offsets[i + 1]] for i in p]
        result.query_index = pooled.rows[p]
        result.extra["members_offsets"] = np.r_[0, np.cumsum(sizes)].astype(np.int64)
        result.extra["members"] = (
            np.concatenate(members).astype(np.int64) if members else np.zeros(0, np.int64)
        )
    if hint is not None:  # once ranked, as the command line's note follows the report
        from .errors import ProtocolHint

        warnings.warn(hint, ProtocolHint, stacklevel=_outside_rankwise())
    return result


def evaluate(
    query,
    gallery,
    query_embeddings,
    gallery_embeddings,
    *,
    protocol: str = _DEFAULT_PROTOCOL,
    distance: str = "cosine",
    ks: Iterable[int] | str = KS.default,
    gap_frames: int = GAP_FRAMES.default,
    query_stride: int = QUERY_STRIDE.default,
    junk_labels: Iterable[str] = JUNK_LABELS.default,
    exclude_same_camera: bool = EXCLUDE_SAME_CAMERA.default,
    multi_query: str = MULTI_QUERY.default,
    single_gallery_shot: bool = SINGLE_GALLERY_SHOT.default,
    shot_repeats: int | str = SHOT_REPEATS.default,
    shot_seed: int = SHOT_SEED.default,
    rerank: dict | str | None = None,
    aqe: dict | str | None = None,
    drop_junk: bool = DROP_JUNK.default,
    ap: str = "standard",
    query_block: int = QUERY_BLOCK.default,
    gallery_chunk: int = GALLERY_CHUNK.default,
    workers: int | None = None,
    scheduler=None,
    memory_limit_mb: float | None = None,
    device: str = DEVICE.default,
) -> EvaluationResult:
    """Evaluate embeddings under a protocol.

    Parameters
    ----------
    query, gallery : manifest CSV path or DataFrame (``id``, ``label``, and what the protocol
        needs: README "Inputs"), one row per embedding row.
    query_embeddings, gallery_embeddings : ``.npy`` path, Zarr store/array path, or
        array ``(n_query, dim)`` / ``(n_gallery, dim)``.
    protocol : ``recall`` (default) | ``reid`` | ``reassociation`` | ``progressive``.
        Left out, on manifests that look like re-identification data (a ``camera``
        column, or gallery label ``-1``), ``recall`` runs with a
        :class:`~rankwise.errors.ProtocolHint` warning naming ``protocol="reid"``
        (``protocol="recall"`` silences it), as the command line's note.
    distance : ``cosine`` (default) or ``euclidean``.
    ks : cutoffs for ``recall@K`` / ``rankK`` / ``acc@K``.
    gap_frames : reassociation frame gap.
    query_stride : reassociation, queries only at frames divisible by it (default 1:
        every frame); other query rows are left out, not counted as skipped.
    junk_labels : reid labels removed from the gallery (default ``-1``).
    exclude_same_camera : reid, same label AND same camera is not ranked (default);
        False keeps those items as valid matches (the query's own id stays excluded).
    multi_query : reid, ``none`` (default: every query row is a query), ``mean`` or
        ``max``: one query per (label, camera) pooling its rows
        (:mod:`rankwise.multiquery` says exactly how); ``query_index`` is then the
        representative's row (smallest id) and ``per_query`` counts pooled queries.
    single_gallery_shot, shot_repeats, shot_seed : reid, CUHK03's single-gallery-shot
        CMC: ``rankK`` and ``mrr`` over ``shot_repeats`` seeded draws of one valid gallery
        item per identity (``"exact"``: the expectation over all draws), ``map`` and
        ``minp`` on the full list (:mod:`rankwise.single_shot` defines the draws).
    rerank : k-reciprocal re-ranking (recall, reid): ``{"k1": 20, "k2": 6, "lambda":
        0.3, "variant": "torchreid"}`` (missing keys take these defaults) or
        ``"20,6,0.3"``; ``variant`` ``"fastreid"`` (``"20,6,0.3,fastreid"``) is fast-reid's
        evaluator's jaccard re-ranking instead of torchreid's ``re_ranking``; None
        (default) ranks on the plain distance.  See :mod:`rankwise.rerank`.
    aqe : average query expansion (recall, reid; fast-reid's AQE, applied before
        ``rerank``): ``{"k": 5, "alpha": 3.0}`` or ``"5,3"``; None (default): none.
        See :mod:`rankwise.query_expansion`.
    drop_junk : reid with ``rerank`` or ``aqe``: leave the gallery rows with a junk label
        out of the neighbour sets as well, as torchreid's and fast-reid's dataset loaders
        do (they drop those rows); default False: every gallery row is an item of the
        neighbour sets, as in Zhong et al.'s code.  Junk rows are never ranked either way.
    ap : ``standard`` or ``trapezoid`` (official Market-1501 evaluation; recall and reid,
        the protocols that report AP).
    query_block, gallery_chunk, workers, scheduler : how the work is tiled and run
        (threads, or a dask.distributed Client/address); they never change a number.
    memory_limit_mb : refuse, before any work, a run whose estimated peak memory
        exceeds this many MB.
    device : where the tile similarities run (:mod:`rankwise.devices`): ``cpu``
        (default, numpy BLAS), ``cuda`` (torch on the GPU; an error when none is
        usable), ``auto`` (cuda when torch sees a GPU, else cpu) or ``torch-cpu`` (the
        cuda code path on the CPU). The numbers are identical on every device.
        Re-ranking, query expansion and single-gallery-shot draws run on the CPU
        whatever the device.

    Returns
    -------
    EvaluationResult
    """
    ks = parse_ks(ks)
    check_ap(ap, get_protocol(protocol).name)  # before the ranking work
    ranks = rank(
        query,
        gallery,
        query_embeddings,
        gallery_embeddings,
        protocol=protocol,
        distance=distance,
        gap_frames=gap_frames,
        query_stride=query_stride,
        junk_labels=junk_labels,
        exclude_same_camera=exclude_same_camera,
        multi_query=multi_query,
        single_gallery_shot=single_gallery_shot,
        shot_repeats=shot_repeats,
        shot_seed=shot_seed,
        rerank=rerank,
        aqe=aqe,
        drop_junk=drop_junk,
        query_block=query_block,
        gallery_chunk=gallery_chunk,
        workers=workers,
        scheduler=scheduler,
        memory_limit_mb=memory_limit_mb,
        device=device,
    )
    result = result_from_ranks(ranks, ks=ks, ap=ap)
    if ranks.query_rows is not None:  # the kept rows' indices -> the manifest's rows
        result.per_query["query_index"] = ranks.query_rows[result.per_query["query_index"]]
        sketches = result.per_query.get("sketches")
        for name in ("query_index", "last_query_index"):  # progressive: the join keys
            if sketches is not None and name in sketches:
                sketches[name] = ranks.query_rows[np.asarray(sketches[name])]
    return result


def recall_at_k(
    query_emb,
    gallery_emb,
    query_labels,
    gallery_labels,
    ks=(1, 5, 10),
    *,
    query_ids=None,
    gallery_ids=None,
    distance: str = "cosine",
) -> dict[str, float]:
    """Recall@K (percentages) for in-memory embeddings and labels.

    The one-liner of the Recall@K seed: ``query_emb (Q, D)``, ``gallery_emb (G, D)``,
    labels ``(Q,)`` / ``(G,)`` compared as strings (floats that are whole numbers as
    integers: ``3.0`` is ``"3"``; a missing one is an error).  With ids ``(Q,)`` /
    ``(G,)``, an item never matches itself; queries whose label has no other gallery item
    are skipped.
    """

    from .errors import RankwiseError
    from .manifest import whole_number_text
    from .table import Table

    def column(values, name: str, rows: int | None = None) -> np.ndarray:
        values = np.asarray(values)
        if values.ndim != 1 or (rows is not None and len(values) != rows):
            want = "one value per row" if rows is None else f"{rows} values, one per row"
            raise RankwiseError(f"{name} must be 1-D with {want}; got shape {values.shape}")
        missing = np.flatnonzero(_missing(values))
        if len(missing):  # not the label "None" / "nan" that astype(str) would write
            raise RankwiseError(
                f"{name}[{missing[0]}] is missing ({values[missing[0]]}); every item needs a value"
            )
        whole = whole_number_text(values)  # 3.0 -> "3": pandas' integers with a gap
        return whole.astype(str) if whole is not None else values.astype(str)

    def table(side, emb, labels, ids, other_ids):
        labels = column(labels, f"{side}_labels", len(emb) if emb.ndim == 2 else None)
        if ids is not None:
            ids = column(ids, f"{side}_ids", len(labels))
        else:  # numbered ids, none of them an id of the other side: never the same item
            taken = np.asarray(other_ids if other_ids is not None else [], dtype=str)
            prefix = side[0]
            while True:
                ids = np.char.add(prefix, np.arange(len(labels)).astype(str))
                if not np.isin(ids, taken).any():
                    break
                prefix += side[0]
        return Table({"id": ids.astype(object), "label": labels.astype(object)})

    query_emb, gallery_emb = np.asarray(query_emb), np.asarray(gallery_emb)
    result = evaluate(
        table("query", query_emb, query_labels, query_ids, gallery_ids),
        table("gallery", gallery_emb, gallery_labels, gallery_ids, query_ids),
        query_emb,
        gallery_emb,
        protocol="recall",
        distance=distance,
        ks=ks,
    )
    return {name: value for name, value in result.metrics.items() if name.startswith("recall@")}


def _missing(values: np.ndarray) -> np.ndarray:
    """``(N,)`` bool: which of ``values`` are missing (None, NaN, NaT, ``pandas.NA``), as
    ``pandas.isna`` tells, without importing pandas."""
    if values.dtype.kind in "fcmM":
        return values != values  # NaN and NaT only are unequal to themselves
    if values.dtype.kind != "O":
        return np.zeros(len(values), dtype=bool)

    def missing(value) -> bool:
        try:
            return value is None or bool(value != value)
        except TypeError:  # pandas.NA: neither equal nor unequal to itself
            return True

    return np.fromiter(map(missing, values), dtype=bool, count=len(values))
