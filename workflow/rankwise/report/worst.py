"""The worst queries of an encoder (lowest AP; lowest m@B per sketch) and their
nearest valid gallery items."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..errors import RankwiseError
from ..metrics import per_unit
from ..registry import get_protocol
from ..schema import Field, problem
from ..store import named_inputs

#: The per-unit metric that ranks the worst queries, and its name in the document.
_WORST_METRIC = {"query": "map", "sketch": "m@B"}
_WORST_SCORE = {"query": "ap", "sketch": "m@B"}

#: What :func:`worst_queries_of` returns: the list, each query, each of its top items
#: (what the renderers read; the report cache's entries are checked against them).
WORST_QUERIES = {
    "score": Field("string", required=True, choices=tuple(_WORST_SCORE.values())),
    "queries": Field("list", required=True),
    # a re-ranked store keeps fewer nearest items a query than were asked for
    "top_kept": Field("count"),
}
WORST_QUERY = {
    "query_index": Field("count", required=True),
    "id": Field("string", required=True),
    "label": Field("string", required=True, nullable=True),
    "image": Field("path", required=True, nullable=True),
    "score": Field("number", required=True),
    "rank": Field("count", required=True),
    "num_relevant": Field("count", required=True),
    "sketch": Field("string"),
    "top": Field("list", required=True, nullable=True),
}
WORST_TOP = {
    "rank": Field("count", required=True),
    "gallery_index": Field("count", required=True),
    "id": Field("string", required=True),
    "label": Field("string", required=True, nullable=True),
    "image": Field("path", required=True, nullable=True),
    "relevant": Field("boolean", required=True),
}


def is_worst_queries(value: Any) -> bool:
    """Whether ``value`` is what :func:`worst_queries_of` returns (a cached copy that a
    hand edit or a cut left otherwise is computed again)."""
    return (
        problem(value, WORST_QUERIES) is None
        and all(problem(q, WORST_QUERY) is None for q in value["queries"])
        and all(problem(t, WORST_TOP) is None for q in value["queries"] for t in q["top"] or [])
    )


def _refuse_unranked(attrs: dict, role: str, manifest, embeddings) -> None:
    """One line when the manifest or embeddings found for ``role``
    (:func:`rankwise.store.named_inputs`) are not the ones ranked: rows are matched by
    position, so an edited or re-sorted manifest would name other queries' ids and
    images, and other embeddings other nearest items."""
    from ..hashing import file_sha256
    from ..store import embeddings_difference

    expected = attrs.get(f"{role}_manifest_sha256")
    if manifest and expected and (found := file_sha256(manifest)) != expected:
        raise RankwiseError(
            f"{manifest}: not the {role} manifest the ranks were computed from (its sha256 "
            f"{found[:12]} differs from the ranks store's {str(expected)[:12]}: edited, "
            "re-sorted or another file); restore it, or rank again"
        )
    if embeddings and (key := embeddings_difference(attrs, role, embeddings)):
        from ..embeddings import open_embeddings

        # a broken store (attributes of the wrong type, a missing chunk): its reader's
        # line, which says what is wrong and how to fix it
        open_embeddings(embeddings, name=f"{role} embeddings")
        raise RankwiseError(
            f"{embeddings}: not the {role} embeddings the ranks were computed from (its "
            f"{key!r} differs from the ranks store's record: encoded again or another "
            "store); restore them, or rank again"
        )


def _manifest_or_none(path, store, provenance: dict, protocol: str, role: str):
    """The manifest at ``path`` as evaluated with the embedding store ``store`` (rows an
    id-keyed store dropped left out), or None (no manifest).

    None too when rows were dropped (``provenance``: the ranks store's record of the
    embeddings) and the store that says which is not found: the manifest's rows would
    not be the ranks store's rows.
    """
    from ..inputs import read_evaluated_manifest

    if path is None:
        return None
    dropped = (provenance.get("id_alignment") or {}).get("dropped_rows")
    if dropped and not (store and Path(store).is_dir()):
        return None
    return read_evaluated_manifest(path, store, protocol=protocol, role=role)


def _item(table, row: int, folder: Path | None) -> dict[str, Any]:
    """id, label and image path of one manifest row (``row`` alone without a manifest)."""
    if table is None:
        return {"id": f"row {row}", "label": None, "image": None}
    image = table["path"][row] if "path" in table else None
    return {
        "id": str(table["id"][row]),
        "label": str(table["label"][row]),
        "image": str(folder / image) if image else None,
    }


def worst_queries_of(
    arrays: dict[str, np.ndarray],
    attrs: dict,
    *,
    n: int = 5,
    top_k: int = 10,
    ap: str = "standard",
    first: str | None = None,
    near: str | None = None,
) -> dict[str, Any]:
    """The ``n`` evaluated queries with the lowest score, and their top-``top_k`` items.

    The score is AP (``ap`` variant) per query; for ``progressive``, m@B per sketch, the
    sketch being shown by its complete rendering.  Ties go to the smaller query id (the
    store's ``unit_key``; the lower manifest row in a store written without it).
    The top items need the manifests and embedding stores the ranks store names
    (``query_manifest``..., ``query_embeddings.path``...), found where
    :func:`rankwise.store.named_inputs` finds them (``first``: the folder the ranks store
    was found from, ``""`` here; ``near``: a file of the project, whose folder and those
    above it are searched last); without them ``top`` is ``None``
    and ids are manifest rows; files found there that are not the ones ranked are
    refused (:class:`RankwiseError`).

    Returns
    -------
    ``{"score": "ap" | "m@B", "queries": [...]}``, each query: ``query_index`` (evaluated
    row), ``id``, ``label``, ``image`` (its path or ``None``), ``score`` (percent),
    ``rank`` (first relevant rank; the target's rank at the complete rendering for
    ``progressive``), ``num_relevant``, ``sketch`` (progressive), ``top`` (list of
    ``{"rank", "gallery_index", "id", "label", "image", "relevant"}``).
    """
    from ..neighbours import top_items

    protocol = attrs["protocol"]
    table = per_unit(arrays, attrs, [_WORST_METRIC[get_protocol(protocol).unit]], ap=ap)
    table = table.in_key_order(arrays)  # ties: the smaller id, whatever the row order
    name = _WORST_SCORE[table.unit]
    rows, score, rank = table.last_rows, table.values[:, 0], table.rank
    relevant = table.num_relevant
    pick = np.argsort(score, kind="stable")[:n]
    q_path, g_path, *embeddings = named_inputs(attrs, first, near)
    for role, manifest, found in zip(
        ("query", "gallery"), (q_path, g_path), embeddings, strict=True
    ):
        _refuse_unranked(attrs, role, manifest, found)
    provenance = [attrs.get(f"{side}_embeddings") or {} for side in ("query", "gallery")]
    q_table, g_table = (
        _manifest_or_none(*args, protocol, role)
        for *args, role in zip(
            (q_path, g_path), embeddings, provenance, ("query", "gallery"), strict=True
        )
    )
    tops, kept = None, None
    options = attrs.get("protocol_options") or {}
    if "top_items" in arrays and q_table is not None and g_table is not None:
        # a re-ranked store keeps each query's nearest items by re-ranked distance
        tops = _stored_tops(arrays, rows[pick], q_table, g_table, top_k)
        width = int(np.asarray(arrays["top_items"]).shape[1])
        kept = width if width < top_k else None  # fewer than asked: the documents say so
    elif (
        # an expanded store's top items are not the plain distance's
        not (options.get("rerank") or options.get("aqe"))
        and q_table is not None
        and g_table is not None
        and all(p and Path(p).exists() for p in embeddings)
    ):
        tops = top_items(
            q_path,
            g_path,
            *embeddings,
            rows[pick],
            protocol=protocol,
            distance=attrs.get("distance", "cosine"),
            k=top_k,
            gap_frames=int(options.get("gap_frames", 1)),
            query_stride=int(options.get("query_stride", 1)),
            junk_labels=tuple(options.get("junk_labels", ("-1",))),
            exclude_same_camera=bool(options.get("exclude_same_camera", True)),
            multi_query=str(options.get("multi_query", "none")),
        )
    q_folder = Path(q_path).parent if q_table is not None else None
    g_folder = Path(g_path).parent if g_table is not None else None
    queries = []
    for n_, i in enumerate(pick):
        row = int(rows[i])
        entry = {
            "query_index": row,
            **_item(q_table, row, q_folder),
            "score": 100.0 * float(score[i]),
            "rank": int(rank[i]),
            "num_relevant": int(relevant[i]),
        }
        if table.unit == "sketch" and q_table is not None:
            entry["sketch"] = str(q_table["sketch"][row])
        entry["top"] = (
            None
            if tops is None
            else [
                {
                    "rank": j + 1,
                    "gallery_index": int(g),
                    **_item(g_table, int(g), g_folder),
                    "relevant": bool(rel),
                }
                for j, (g, rel) in enumerate(
                    zip(tops[n_]["gallery_index"], tops[n_]["relevant"], strict=True)
                )
            ]
        )
        queries.append(entry)
    return {"score": name, "queries": queries, **({"top_kept": kept} if kept else {})}


def _stored_tops(arrays, query_rows, q_table, g_table, top_k: int) -> list[dict]:
    """The ranks store's ``top_items`` of ``query_rows`` (manifest rows), as
    :func:`rankwise.neighbours.top_items` returns them (listed items are valid, so
    relevant = same label)."""
    position = {int(r): i for i, r in enumerate(arrays["query_index"])}
    labels = g_table["label"]
    out = []
    for row in query_rows:
        items = arrays["top_items"][position[int(row)]]
        items = items[items >= 0][:top_k]
        label = str(q_table["label"][int(row)])
        out.append({"gallery_index": items, "relevant": labels[items] == label})
    return out
