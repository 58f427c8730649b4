"""Who is ranked (valid) and who is relevant, per protocol, as integer arrays.

===============  ===========================================  ========================
protocol         valid gallery items for query q               relevant
===============  ===========================================  ========================
recall           all but the item with q's id                  same label
reid             all but q's id, same label AND same camera    same label
                 (unless ``exclude_same_camera=False``),
                 labels in ``junk_labels``
reassociation    q's sequence at frame q.frame + gap_frames;   same label
                 queries only at frames divisible by
                 ``query_stride``
progressive      all                                           same label (one target)
===============  ===========================================  ========================

Each protocol's rule is data in its :class:`~rankwise.registry.ProtocolSpec`
(self-exclusion, same-camera exclusion, junk labels, candidate rule); this module
turns those flags into arrays, and :func:`dense_masks` is the one statement of the
dense protocols' validity rule.  Dense protocols (recall, reid, progressive) are
described by per-row codes that the tile kernel tests; reassociation lists each
query's candidates explicitly.
Relevant (or candidate) pairs are found from the manifests alone, no embeddings.

``query_stride`` follows the ``reid`` package's re-association protocol: a query row
whose frame is not divisible by ``query_stride`` is not a query at all -- it is left
out of every average and NOT counted in ``num_skipped`` (nor in ``num_queries``);
only queries at stride frames can be skipped (no candidate gap_frames later, fewer
than 2 candidates, or none of its label).  The gallery is unchanged.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field, replace
from types import SimpleNamespace

import numpy as np

from .errors import RankwiseError
from .manifest import row_line
from .options import (
    EXCLUDE_SAME_CAMERA,
    GAP_FRAMES,
    JUNK_LABELS,
    MULTI_QUERY,
    QUERY_STRIDE,
    SHOT_REPEATS,
    SHOT_SEED,
    SINGLE_GALLERY_SHOT,
    spelled,
)
from .registry import get_protocol
from .table import Table, factorize


@dataclass
class Problem:
    """A protocol applied to a query and a gallery manifest (no embeddings yet).

    Attributes
    ----------
    qlab, glab, qid, gid : int64 codes shared by query and gallery (equal code =
        equal string).
    gjunk : (G,) bool, gallery rows that are never ranked (junk labels).
    pair_q, pair_g : int64, the pairs whose canonical keys are computed first: every
        valid relevant pair (dense protocols) or every valid candidate (reassociation),
        grouped by query in ascending query order.
    pair_rel : bool, which pairs are relevant.
    skip : (Q,) bool, queries left out of every average.
    dense : bool, whether the non-relevant valid items are counted by the tile engine.
    group, step : (Q,) int64, progressive sketch number and step (-1 / 0 otherwise).
    """

    protocol: str
    qlab: np.ndarray
    glab: np.ndarray
    qid: np.ndarray
    gid: np.ndarray
    gjunk: np.ndarray
    exclude_self: bool
    pair_q: np.ndarray
    pair_g: np.ndarray
    pair_rel: np.ndarray
    skip: np.ndarray
    dense: bool
    group: np.ndarray
    step: np.ndarray
    num_gallery: int
    num_units: int  # queries, or sketches for progressive
    num_units_skipped: int
    options: dict = field(default_factory=dict)
    qcam: np.ndarray | None = None  # reid with exclude_same_camera only
    gcam: np.ndarray | None = None
    # multi-query: sorted keys ``q * G + g`` of the gallery items that carry one of pooled
    # query q's member ids (the same items: never ranked for q); empty otherwise
    twins: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    # (Q,) int64, each query row's place in the string order of the query ids: the
    # statistics number their units by it, never by row order (``unit_key`` in stores)
    qkey: np.ndarray | None = None
    # (G,) int64, the same for the gallery ids: the order of the items re-ranking and AQE
    # search among (rankwise.rerank.item_order), set by rankwise.api.rank when they run
    gkey: np.ndarray | None = None

    def valid_relevant(self, q: int, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """Masks ``(stop - start,)`` of the valid and the relevant items among gallery
        rows [start, stop) for query row ``q``: :func:`dense_masks` for the dense
        protocols, the listed candidates otherwise.  For display and checks, not speed.
        """
        if not self.dense:
            valid = np.zeros(stop - start, dtype=bool)
            mine = self.pair_g[self.pair_q == q]
            mine = mine[(mine >= start) & (mine < stop)]
            valid[mine - start] = True
            return valid, valid & (self.glab[start:stop] == self.qlab[q])
        return dense_masks(self, np.int64(q), np.arange(start, stop, dtype=np.int64))

    def gallery_subset(self, keep: np.ndarray) -> Problem:
        """The same problem on gallery rows ``keep`` only (ascending), numbered from 0.

        Every pair's gallery item must be kept; ``num_gallery`` stays as it is (it
        counts the rows that can be ranked, and only never-ranked rows may be left out:
        ``drop_junk`` leaves out the junk rows).
        """
        keep = np.asarray(keep, dtype=np.int64)
        n_old, n_new = len(self.glab), len(keep)
        new = np.full(n_old, -1, dtype=np.int64)
        new[keep] = np.arange(n_new)
        pair_g = new[self.pair_g]
        if (pair_g < 0).any():
            raise ValueError("gallery_subset: a pair's gallery item is not kept")
        # twins (multi_query, keys q * G + g) cannot meet drop_junk today (re-ranking and
        # AQE refuse multi_query); re-keyed anyway, so the subset is right for any problem
        q, g = np.divmod(self.twins, max(n_old, 1))
        kept = new[g] >= 0
        return replace(
            self,
            glab=self.glab[keep],
            gid=self.gid[keep],
            gjunk=self.gjunk[keep],
            gcam=None if self.gcam is None else self.gcam[keep],
            gkey=None if self.gkey is None else self.gkey[keep],
            pair_g=pair_g,
            twins=np.sort(q[kept] * n_new + new[g[kept]]),
        )


def dense_masks(codes, q: np.ndarray | np.integer, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rule "which gallery items count" of the dense protocols, in one place.

    For query rows ``q`` and gallery rows ``g`` (broadcastable int arrays) returns
    boolean ``(valid, relevant)`` of their broadcast shape::

        relevant = label(g) == label(q)
        valid    = not junk(g)
                   and not (exclude_self and id(g) == id(q))
                   and not (camera rule and relevant and camera(g) == camera(q))
                   and not (multi-query and g has the id of one of q's members)
        relevant &= valid

    ``codes`` holds the integer codes (``qlab glab qid gid gjunk exclude_self qcam
    gcam``; cameras ``None`` when the protocol has no camera rule; optionally
    ``twins``, :attr:`Problem.twins`): a :class:`Problem`, or the arrays
    :func:`build_problem` is assembling.  A member twin has its group's label
    (checked by :func:`build_problem`), so it is a relevant item: the engine, which
    counts only non-relevant items, needs no twin rule of its own.  It decides
    the relevant pairs (:func:`build_problem`) and the masks of
    :meth:`Problem.valid_relevant`; :func:`rankwise.kernels.count_tile` applies it
    inline to count the valid non-relevant items (label differs, not junk, not self),
    tested equal in tests/test_kernels.py.
    """
    relevant = codes.glab[g] == codes.qlab[q]
    valid = ~codes.gjunk[g]
    if codes.exclude_self:
        valid = valid & (codes.gid[g] != codes.qid[q])
    if codes.qcam is not None:
        valid = valid & ~(relevant & (codes.gcam[g] == codes.qcam[q]))
    twins = getattr(codes, "twins", None)
    if twins is not None and len(twins):
        key = np.asarray(q, dtype=np.int64) * len(codes.glab) + g
        valid = valid & ~np.isin(key, twins)
    return valid, relevant & valid


def id_keys(ids) -> np.ndarray:
    """``(n,)`` int64: each id's dense rank in string (code point) order, equal ids equal
    ranks: a numbering of items that no row order changes.  Memory follows the ids' total
    size (a fixed-width unicode array would take n x the longest id): the distinct ids are
    sorted as Python strings (1M distinct ids: ~1 s)."""
    codes, uniques = factorize(ids)
    text = [str(u) for u in uniques]
    rank = np.empty(len(text), dtype=np.int64)
    rank[np.asarray(sorted(range(len(text)), key=text.__getitem__), dtype=np.int64)] = np.arange(
        len(text)
    )
    return rank[codes]


def _codes(
    query, gallery, column: str | None = None, names: tuple[str, str] = ("", "")
) -> tuple[np.ndarray, np.ndarray]:
    """Integer codes ``(Q,)`` / ``(G,)`` for two columns read as text, equal text ->
    equal code (numbered by first appearance, query rows first).  With ``column``
    (labels, cameras), values the sides write ``3`` and ``3.0`` (:func:`_check_dot_zero`),
    or ``03`` and ``3`` (:func:`_check_integer_spelling`), are refused."""
    codes, uniques = factorize(map(str, itertools.chain(query, gallery)))
    qcodes, gcodes = codes[: len(query)], codes[len(query) :]
    if column is not None:
        seen = [np.bincount(c, minlength=len(uniques)) > 0 for c in (qcodes, gcodes)]  # O(N)
        values = set(uniques[seen[0]]), set(uniques[seen[1]])  # each side's, once
        _check_dot_zero(*values, column, names)
        _check_integer_spelling(*values, column, names)
    return qcodes, gcodes


def _grouped_pairs(qkey: np.ndarray, gkey: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """All (q, g) with ``qkey[q] == gkey[g]``, grouped by q then ascending g."""
    order = np.argsort(gkey, kind="stable")
    sorted_keys = gkey[order]
    starts = np.searchsorted(sorted_keys, qkey, side="left")
    counts = np.searchsorted(sorted_keys, qkey, side="right") - starts
    total = int(counts.sum())
    pair_q = np.repeat(np.arange(len(qkey), dtype=np.int64), counts)
    first = np.repeat(np.cumsum(counts) - counts, counts)
    pair_g = order[np.repeat(starts, counts) + (np.arange(total, dtype=np.int64) - first)]
    return pair_q, pair_g.astype(np.int64)


def _check_dot_zero(qvalues, gvalues, column: str, names: tuple[str, str]) -> None:
    """Refuse labels or cameras that one side writes ``3`` and the other ``3.0``.

    Values are compared as written, and a column written from floats (``3.0``, as pandas
    writes an integer column with a gap) against one written from integers (``3``) would
    silently never match: queries skipped, or the same-camera rule not applied at all.
    ``qvalues`` / ``gvalues``: the distinct values of each side (strings).
    """
    qset, gset = set(qvalues), set(gvalues)

    def float_text(value: str, other: set) -> bool:
        # an integer written from a float ('-3.0'), that the other side writes only as
        # an integer: text labels ('J45' and 'J45.0', 'v1' and 'v1.0') are labels of
        # their own, and a side that writes both spellings matches each as written
        return (
            value.endswith(".0")
            and value not in other
            and value[:-2].lstrip("+-").isdigit()
            and value[:-2].lstrip("+-").isascii()
        )

    pairs = [(q, q[:-2]) for q in qset if float_text(q, gset) and q[:-2] in gset]
    pairs += [(g[:-2], g) for g in gset if float_text(g, qset) and g[:-2] in qset]
    if pairs:
        q, g = min(pairs)
        raise RankwiseError(
            f"{names[0]}, {names[1]}: query {column} {q!r} and gallery {column} {g!r} differ "
            "only by a trailing '.0' (a column written from floats against one written from "
            f"integers), so they would not match; write both sides' {column}s as integers"
        )


_SIGNED_DIGITS = re.compile(r"[+-]?[0-9]+")


def _integer_text(value: str) -> str | None:
    """``value``'s integer as plain text (``"007"`` -> ``"7"``, ``"+3"`` -> ``"3"``,
    ``"-0"`` -> ``"0"``) when it is ASCII digits with an optional sign; else None."""
    if not _SIGNED_DIGITS.fullmatch(value):
        return None
    digits = value.lstrip("+-").lstrip("0") or "0"
    return "-" + digits if value.startswith("-") and digits != "0" else digits


def _check_integer_spelling(qvalues, gvalues, column: str, names: tuple[str, str]) -> None:
    """Refuse labels or cameras that one side writes ``03`` (or ``+3``) and the other ``3``.

    Values are compared as written: MSMT17's cameras read from its file names (``01``)
    against the ``msmt17`` loader's (``1``), or Market-1501 person ids kept as in the
    file names (``0002``) against the loaders' (``2``), would silently never match: the
    same-camera rule not applied to those cameras, or those queries skipped.  Refused
    only where each spelling is written by its side alone (a spelling both sides write
    matches as written: ``07`` and ``7`` stay two labels where the gallery writes both
    and the query ``7``), and only integers: ``J01`` stays a text label.
    ``qvalues`` / ``gvalues``: the distinct values of each side (strings).
    """
    qset, gset = set(qvalues), set(gvalues)

    def unusual(values: set) -> dict[str, list[str]]:
        """plain integer -> the values written otherwise (``007``, ``+7``, ``-0``): one
        of each pair is, so only these are looked at (a million plain labels: 0.1 s)."""
        out: dict[str, list[str]] = {}
        for value in values:
            if value.startswith(("0", "+", "-0")) and value != "0":
                key = _integer_text(value)
                if key is not None:
                    out.setdefault(key, []).append(value)
        return out

    qodd, godd = unusual(qset), unusual(gset)
    pairs = [  # (query spelling, gallery spelling), each written by its side alone
        (q, g)
        for key in qodd.keys() | godd.keys()
        for q in qodd.get(key, []) + [key]
        for g in godd.get(key, []) + [key]
        if q != g and q in qset and g in gset and q not in gset and g not in qset
    ]
    if pairs:
        q, g = min(pairs)
        raise RankwiseError(
            f"{names[0]}, {names[1]}: query {column} {q!r} and gallery {column} {g!r} are "
            "the same integer written differently (leading zeros or a sign), so they would "
            f"not match ({column}s are compared as written); write both sides' {column}s "
            "the same way, e.g. as plain integers"
        )


def _check_junk_spelling(
    junk: set[str], labels, codes: np.ndarray, gjunk: np.ndarray, name: str
) -> None:
    """Refuse a junk label that matches no gallery label as written but does without (or
    with) a trailing ``.0`` (``-1`` against a column written from floats, ``-1.0``), or
    written without (or with) leading zeros or a sign (``0000``, Market-1501's file names,
    against the loaders' ``0``): the junk rows would silently be ranked as distractors.
    ``codes``: the labels' codes (:func:`_codes`), so that each distinct label is looked
    at once."""
    labels = np.asarray(labels, dtype=object)
    missing = junk - {str(v) for v in labels[gjunk]}
    if not missing or not len(codes):
        return
    first = np.zeros(int(codes.max()) + 1, dtype=np.int64)  # a row of each code, O(N)
    first[codes[::-1]] = np.arange(len(codes) - 1, -1, -1)
    present = np.bincount(codes, minlength=len(first)) > 0
    written = {str(v) for v in labels[first[present]]}
    for j in sorted(missing):
        other = j[:-2] if j.endswith(".0") else j + ".0"
        if other in written and other not in junk:  # both spellings given: nothing lost
            raise RankwiseError(
                f"{name}: junk label {j!r} matches no gallery label, but {other!r} does (a "
                "column written from floats against integers): write the labels as "
                f"integers, or give the junk label as {other!r}"
            )
        key = _integer_text(j)  # "0000" against the loaders' "0" (:func:`_integer_text`)
        same = sorted(w for w in written - junk if key is not None and _integer_text(w) == key)
        if same:
            raise RankwiseError(
                f"{name}: junk label {j!r} matches no gallery label, but {same[0]!r} does (the "
                "same integer written differently: leading zeros or a sign): give the junk "
                f"label as {same[0]!r}, or write the labels the same way"
            )


def build_problem(
    query: Table,
    gallery: Table,
    protocol: str,
    *,
    gap_frames: int = GAP_FRAMES.default,
    query_stride: int = QUERY_STRIDE.default,
    junk_labels: tuple[str, ...] = JUNK_LABELS.default,
    exclude_same_camera: bool = EXCLUDE_SAME_CAMERA.default,
    multi_query: str = MULTI_QUERY.default,
    members: tuple[np.ndarray, np.ndarray] | None = None,
    single_gallery_shot: bool = SINGLE_GALLERY_SHOT.default,
    shot_repeats: int | str = SHOT_REPEATS.default,
    shot_seed: int = SHOT_SEED.default,
    names: tuple[str, str] = ("query manifest", "gallery manifest"),
) -> Problem:
    """Apply ``protocol`` to validated manifests (see :func:`rankwise.manifest.read_manifest`).

    ``gap_frames``, ``query_stride``: reassociation; ``junk_labels``,
    ``exclude_same_camera``: reid (each checked, and recorded in ``options``, only by
    the protocols that take it).  ``multi_query`` (reid; recorded when not ``"none"``):
    ``query`` holds the pooled queries' representative rows and ``members`` =
    ``(offsets, ids)`` lists each pooled query's member ids (CSR,
    :class:`rankwise.multiquery.Pooled`): a gallery item with any member's id is not
    ranked.  ``single_gallery_shot`` (reid; with ``shot_repeats``, ``shot_seed``, all
    recorded when it is on): the validity rule is reid's, the CMC is drawn from it by
    :mod:`rankwise.single_shot`.  ``names`` (the manifests' file names) are what error
    messages call them.
    """
    spec = get_protocol(protocol)
    multi_query = check_multi_query(multi_query, protocol, query, names[0])
    shots = _check_single_shot(protocol, single_gallery_shot, shot_repeats, shot_seed)
    qlab, glab = _codes(query["label"], gallery["label"], "label", names)
    qid, gid = _codes(query["id"], gallery["id"])
    if spec.exclude_self and multi_query == "none":  # pooled members: _member_twins
        _check_shared_ids(query, gallery, qid, gid, qlab, glab, names)
    n_q, n_g = len(query), len(gallery)
    gjunk = np.zeros(n_g, dtype=bool)
    group = np.full(n_q, -1, dtype=np.int64)
    step = np.zeros(n_q, dtype=np.int64)
    options: dict = {}
    exclude_self = spec.exclude_self
    qcam = gcam = None
    is_query = np.ones(n_q, dtype=bool)  # rows that are queries at all (query_stride)
    twins = np.zeros(0, dtype=np.int64)

    if spec.candidates == "sequence_gap":
        options["gap_frames"] = gap_frames = GAP_FRAMES.check(gap_frames)
        options["query_stride"] = query_stride = QUERY_STRIDE.check(query_stride)
        qseq, gseq = _codes(query["sequence"], gallery["sequence"])
        qframe = np.asarray(query["frame"], dtype=np.int64)
        gframe = np.asarray(gallery["frame"], dtype=np.int64)
        # One integer per (sequence, frame); a target frame outside the gallery's range
        # can match nothing, so it maps to -1.
        fmin, fmax = int(gframe.min()), int(gframe.max())
        width = fmax - fmin + 1
        gkey = gseq * width + (gframe - fmin)
        target = qframe + gap_frames
        # Like the reid package: only frames divisible by query_stride hold queries.
        is_query = qframe % query_stride == 0
        in_range = (target >= fmin) & (target <= fmax) & is_query
        qkey = np.where(in_range, qseq * width + (target - fmin), -1)
        pair_q, pair_g = _grouped_pairs(qkey, gkey)
        keep = gid[pair_g] != qid[pair_q]
        pair_q, pair_g = pair_q[keep], pair_g[keep]
        pair_rel = glab[pair_g] == qlab[pair_q]
        n_valid = np.bincount(pair_q, minlength=n_q)
        n_rel = np.bincount(pair_q, weights=pair_rel, minlength=n_q)
        skip = (n_valid < spec.min_candidates) | (n_rel == 0) | ~is_query
        dense = False
    elif spec.candidates == "all":
        if spec.junk_labels:
            junk = {str(j) for j in junk_labels}
            options["junk_labels"] = sorted(junk)
            gjunk = np.array([str(v) in junk for v in gallery["label"]], dtype=bool)
            _check_junk_spelling(junk, gallery["label"], glab, gjunk, names[1])
        if spec.exclude_same_camera:
            # No cameras in the problem = no camera rule, in dense_masks and count_tile.
            exclude = EXCLUDE_SAME_CAMERA.check(exclude_same_camera)
            options["exclude_same_camera"] = exclude
            if exclude:
                qcam, gcam = _codes(query["camera"], gallery["camera"], "camera", names)
        pair_q, pair_g = _grouped_pairs(qlab, glab)  # every same-label pair
        if multi_query != "none":
            options["multi_query"] = multi_query
            twins = _member_twins(members, query, gallery, qlab, glab, names)
        codes = SimpleNamespace(
            qlab=qlab,
            glab=glab,
            qid=qid,
            gid=gid,
            gjunk=gjunk,
            exclude_self=exclude_self,
            qcam=qcam,
            gcam=gcam,
            twins=twins,
        )
        _, keep = dense_masks(codes, pair_q, pair_g)
        options.update(shots)
        pair_q, pair_g = pair_q[keep], pair_g[keep]
        pair_rel = np.ones(len(pair_q), dtype=bool)
        skip = np.bincount(pair_q, minlength=n_q) == 0
        dense = True
    else:  # a spec whose candidate rule has no implementation here yet
        raise RankwiseError(
            f"protocol {protocol!r}: candidate rule {spec.candidates!r} is not implemented"
        )

    num_units, num_skipped = int(is_query.sum()), int((skip & is_query).sum())
    if spec.unit == "sketch":
        group, step, skip, num_units, num_skipped = _sketches(query, skip, names[0])
    # Only evaluated queries keep pairs: the engine lays thresholds out per evaluated query.
    keep = ~skip[pair_q]
    pair_q, pair_g, pair_rel = pair_q[keep], pair_g[keep], pair_rel[keep]

    if not is_query.any():
        raise RankwiseError(
            f"{names[0]}: no query row has a frame divisible by query_stride={query_stride} "
            f"({n_q} rows); lower query_stride"
        )
    if spec.candidates == "sequence_gap" and not (n_valid[is_query] > 0).any():
        raise RankwiseError(
            f"{names[0]}, {names[1]}: no query has a gallery item of its sequence at frame + "
            f"gap_frames={gap_frames} (gallery frames {fmin}..{fmax}; {n_q} queries): lower "
            "gap_frames, or check the frame and sequence columns"
        )
    if skip.all():
        removed = int(gjunk.sum())
        if removed == n_g:  # not a matter of ids or cameras: nothing is left to rank
            raise RankwiseError(
                f"{names[1]}: no query has a valid match in the gallery under protocol "
                f"{protocol!r}: all {n_g} gallery items have a junk label "
                f"({_junk_counts(gallery, gjunk)}), and junk rows are never ranked "
                f"({n_q} queries); check the gallery's labels, or set "
                f"{spelled('junk_labels')} to the labels to remove"
            )
        junked = (
            f"; junk labels removed {removed} of them: {_junk_counts(gallery, gjunk)}"
            if removed
            else ""
        )
        raise RankwiseError(
            f"{names[0]}, {names[1]}: no query has a valid match in the gallery under "
            f"protocol {protocol!r} "
            f"({n_q} queries, {n_g} gallery items{junked}): check that query and gallery "
            "labels use the same ids"
            + (" and that queries have other-camera matches" if qcam is not None else "")
        )
    return Problem(
        protocol=protocol,
        qlab=qlab,
        glab=glab,
        qid=qid,
        gid=gid,
        gjunk=gjunk,
        exclude_self=exclude_self,
        pair_q=pair_q,
        pair_g=pair_g,
        pair_rel=pair_rel,
        skip=skip,
        dense=dense,
        group=group,
        step=step,
        num_gallery=int(n_g - gjunk.sum()),
        num_units=int(num_units),
        num_units_skipped=int(num_skipped),
        options=options,
        qcam=qcam,
        gcam=gcam,
        twins=twins,
        qkey=id_keys(query["id"]),
    )


def _junk_counts(gallery: Table, gjunk: np.ndarray) -> str:
    """The junk labels that removed gallery rows, with how many each, for messages:
    ``'-1': 7 rows``, ``'-1': 5 rows, '0': 1 row``."""
    labels, counts = np.unique(np.asarray(gallery["label"])[gjunk].astype(str), return_counts=True)
    return ", ".join(
        f"{label!r}: {count} row{'s' if count != 1 else ''}"
        for label, count in zip(labels.tolist(), counts.tolist(), strict=True)
    )


def _at(table: Table, column: str, row) -> object:
    """One value, for messages."""
    return np.asarray(table[column])[int(row)]


def _check_shared_ids(query, gallery, qid, gid, qlab, glab, names) -> None:
    """An id in both manifests is one item, never its own match (README, "Inputs"): with
    two labels it is a data error, most often ids numbered independently in each file
    (``0, 1, 2, ...``), where every gallery item would silently drop out of the ranking
    of the query that happens to share its number."""
    at = np.full(int(max(qid.max(initial=-1), gid.max(initial=-1))) + 1, -1, dtype=np.int64)
    at[gid] = np.arange(len(gid))
    g = at[qid]
    bad = np.flatnonzero((g >= 0) & (qlab != glab[np.maximum(g, 0)]))
    if len(bad):
        q, j = int(bad[0]), int(g[bad[0]])
        shared = int(np.count_nonzero(g >= 0))
        raise RankwiseError(
            f"{names[0]}, {names[1]}: id {_at(query, 'id', q)!r} is a query (row "
            f"{row_line(q, query)}, label {_at(query, 'label', q)!r}) and a gallery item (row "
            f"{row_line(j, gallery)}, label "
            f"{_at(gallery, 'label', j)!r}); the same id is the same item, never its own "
            f"match, so its labels must agree ({len(bad)} of the {shared} shared ids differ): "
            "give query and gallery items distinct ids (e.g. prefix them q/g), or fix the label"
        )


def check_multi_query(multi_query: str, protocol: str, query: Table, name: str) -> str:
    """``multi_query`` checked: a choice of the option, a protocol that takes it (reid),
    and a query manifest with a ``camera`` column (queries are pooled per label and
    camera)."""
    multi_query = MULTI_QUERY.check(multi_query)
    if multi_query == "none":
        return multi_query
    if "multi_query" not in get_protocol(protocol).options:
        raise RankwiseError(
            f"multi_query {multi_query!r} applies to protocol 'reid' only, not {protocol!r}; "
            "use protocol reid or multi_query none"
        )
    if "camera" not in query.columns:
        raise RankwiseError(
            f"{name}: multi_query needs a 'camera' column (queries are pooled per label and "
            "camera); add it or use multi_query none"
        )
    return multi_query


def _check_single_shot(protocol: str, on: bool, repeats: int | str, seed: int) -> dict:
    """The single-gallery-shot options to record (``{}`` when off), each checked."""
    if not SINGLE_GALLERY_SHOT.check(on):
        return {}
    if "single_gallery_shot" not in get_protocol(protocol).options:
        raise RankwiseError(
            f"single_gallery_shot applies to protocol 'reid' only, not {protocol!r}; "
            "use protocol reid or turn single_gallery_shot off"
        )
    return {
        "single_gallery_shot": True,
        "shot_repeats": SHOT_REPEATS.check(repeats),
        "shot_seed": SHOT_SEED.check(seed),
    }


def _member_twins(members, query, gallery, qlab, glab, names) -> np.ndarray:
    """Multi-query: sorted keys ``q * G + g`` of the gallery items ``g`` with the id of
    one of pooled query q's members (the same item, README: never its own match).

    Same id = same item, so such an item must have the group's label (a different one
    is an error naming the id): it is then a relevant item, which :func:`dense_masks`
    drops and the tile engine never counts.
    """
    if members is None:
        raise RankwiseError("multi_query needs the pooled queries' members (pool_queries)")
    offsets, ids = members
    row_of = {str(v): g for g, v in enumerate(gallery["id"])}  # ids are unique
    twin = np.array([row_of.get(str(v), -1) for v in ids], dtype=np.int64)
    owner = np.repeat(np.arange(len(offsets) - 1, dtype=np.int64), np.diff(offsets))
    owner, twin = owner[twin >= 0], twin[twin >= 0]
    other = np.flatnonzero(glab[twin] != qlab[owner])
    if len(other):
        g = int(twin[other[0]])
        raise RankwiseError(
            f"{names[1]}: row {row_line(g, gallery)}: id {_at(gallery, 'id', g)!r} is also a "
            f"query item (a member of pooled query {_at(query, 'id', owner[other[0]])!r}) but "
            f"its label {_at(gallery, 'label', g)!r} differs from the query's "
            f"{_at(query, 'label', owner[other[0]])!r}: the same id is the same item; fix "
            "the label or the id"
        )
    return np.unique(owner * len(gallery) + twin)


def _sketches(query: Table, skip: np.ndarray, name: str = "query manifest"):
    """Progressive: sketch numbers, steps, and whole-sketch skipping.

    A sketch is evaluated only when every one of its renderings has its target in the
    gallery; otherwise all its rows are skipped.  Returns the sketch-level counts.
    """
    group, names = factorize(map(str, query["sketch"]))
    step = np.asarray(query["step"], dtype=np.int64)
    # first rows of each (sketch, step) and (sketch, label): a stable sort keeps the first
    _, first = np.unique(np.c_[group, step], axis=0, return_index=True)
    dup = np.ones(len(group), dtype=bool)
    dup[first] = False
    if dup.any():
        i = int(np.flatnonzero(dup)[0])
        raise RankwiseError(
            f"{name}: row {row_line(i, query)}: sketch {names[group[i]]!r} has "
            f"step {step[i]} twice; each rendering needs its own step"
        )
    labels, _ = factorize(map(str, query["label"]))
    pairs = np.unique(np.c_[group, labels], axis=0)
    n_labels = np.bincount(pairs[:, 0], minlength=len(names))
    if (n_labels > 1).any():
        g = int(np.flatnonzero(n_labels > 1)[0])
        raise RankwiseError(
            f"{name}: sketch {names[g]!r} has renderings with "
            "different labels; a sketch has one target"
        )
    sketch_skip = np.bincount(group, weights=skip, minlength=len(names)) > 0
    row_skip = sketch_skip[group]
    return group, step, row_skip, len(names), int(sketch_skip.sum())
