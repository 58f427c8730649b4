"""The evaluation inputs: a query and a gallery manifest with their embeddings, opened together.

:func:`open_inputs` is the one way every command that ranks opens its four inputs
(:func:`rankwise.api.rank`, :func:`rankwise.neighbours.top_items`, the report's worst
queries), so each gets the same checks in the same order:

1. each manifest with :func:`rankwise.manifest.read_manifest` (the protocol's columns
   for its role, non-empty values, unique ids, integer columns);
2. each embeddings with :func:`rankwise.embeddings.open_embeddings` (file, dtype,
   shape, completeness mark; a store opened with a manifest other than the one it was
   encoded from is refused; rows equal to the manifest's);
3. query and gallery of the same dimension, and two stores of one encoder encoded from
   the same bytes of its checkpoint file (:func:`~rankwise.embeddings.check_same_checkpoint`);
4. features carrying their own ids (a Zarr group with ``ids``) read as they are: those
   ids equal the manifest's, row by row (else encode them first, which aligns them);
5. a store encoded from id-keyed features with rows dropped (``on_missing: drop``,
   :mod:`rankwise.feature_ids`) keeps only its manifest rows (:func:`aligned_table`), so
   every row index downstream (``query_index`` in the ranks store, gallery rows) counts
   rows of the manifest *as evaluated*.  :func:`read_evaluated_manifest` gives the same
   table to the commands that re-read a manifest from a ranks store's provenance.

Row values (NaN, zero vectors under cosine, missing or corrupt chunks) are checked
as the rows are read.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from .embeddings import (
    EmbeddingSource,
    check_manifest,
    check_rows,
    check_same_checkpoint,
    check_same_dim,
    open_embeddings,
)
from .manifest import read_manifest
from .options import (
    EXCLUDE_SAME_CAMERA,
    GAP_FRAMES,
    JUNK_LABELS,
    QUERY_STRIDE,
    SHOT_REPEATS,
    SHOT_SEED,
    SINGLE_GALLERY_SHOT,
)
from .protocols import Problem, build_problem, check_multi_query
from .table import Table, is_dataframe

if TYPE_CHECKING:
    from .multiquery import Pooled


@dataclass
class Inputs:
    """Validated query/gallery manifests and their embedding sources.

    Attributes
    ----------
    protocol : the protocol the manifests were checked for.
    query, gallery : manifests ``(Q rows)`` / ``(G rows)`` from ``read_manifest``.
    query_embeddings, gallery_embeddings : sources ``(Q, D)`` / ``(G, D)``.
    names : the manifests' file names for messages (``"query table"`` for a DataFrame
        or Table).
    pooled : multi-query only (:meth:`pool`): the groups; ``query`` and
        ``query_embeddings`` then hold the pooled queries ``(P rows)`` / ``(P, D)``.
    """

    protocol: str
    query: Table
    gallery: Table
    query_embeddings: EmbeddingSource
    gallery_embeddings: EmbeddingSource
    names: tuple[str, str]
    pooled: Pooled | None = None

    def pool(self, multi_query: str, *, distance: str) -> Inputs:
        """These inputs with one pooled query per (label, camera)
        (:func:`rankwise.multiquery.pool_queries`); themselves for ``"none"``."""
        multi_query = check_multi_query(multi_query, self.protocol, self.query, self.names[0])
        if multi_query == "none":
            return self
        from .multiquery import pool_queries

        pooled = pool_queries(
            self.query,
            self.query_embeddings,
            multi_query,
            cosine=distance == "cosine",
            name=self.names[0],
        )
        source = EmbeddingSource(
            kind="array",
            shape=pooled.embeddings.shape,
            name=f"pooled query embeddings ({multi_query} per label and camera)",
            array=pooled.embeddings,
        )
        return replace(self, query=pooled.table, query_embeddings=source, pooled=pooled)

    def problem(
        self,
        *,
        gap_frames: int = GAP_FRAMES.default,
        query_stride: int = QUERY_STRIDE.default,
        junk_labels: tuple[str, ...] = JUNK_LABELS.default,
        exclude_same_camera: bool = EXCLUDE_SAME_CAMERA.default,
        single_gallery_shot: bool = SINGLE_GALLERY_SHOT.default,
        shot_repeats: int | str = SHOT_REPEATS.default,
        shot_seed: int = SHOT_SEED.default,
    ) -> Problem:
        """The protocol applied to the manifests (:func:`rankwise.protocols.build_problem`)."""
        return build_problem(
            self.query,
            self.gallery,
            self.protocol,
            gap_frames=gap_frames,
            query_stride=query_stride,
            junk_labels=tuple(str(j) for j in junk_labels),
            exclude_same_camera=exclude_same_camera,
            multi_query=self.pooled.pooling if self.pooled else "none",
            members=(self.pooled.offsets, self.pooled.member_ids) if self.pooled else None,
            single_gallery_shot=single_gallery_shot,
            shot_repeats=shot_repeats,
            shot_seed=shot_seed,
            names=self.names,
        )


def open_inputs(query, gallery, query_embeddings, gallery_embeddings, *, protocol: str) -> Inputs:
    """Read and check the four inputs of an evaluation (module docstring).

    Parameters
    ----------
    query, gallery : manifest CSV path or DataFrame.
    query_embeddings, gallery_embeddings : ``.npy`` path, Zarr store/array path, or
        array ``(n_rows, dim)``, rows aligned with the manifest.
    protocol : decides the manifests' required columns.
    """
    q_table = read_manifest(query, protocol=protocol, role="query")
    g_table = read_manifest(gallery, protocol=protocol, role="gallery")
    q_name, g_name = _name(query), _name(gallery)
    q_src = open_embeddings(
        query_embeddings, name="query embeddings", n_rows=len(q_table), manifest=q_name
    )
    g_src = open_embeddings(
        gallery_embeddings, name="gallery embeddings", n_rows=len(g_table), manifest=g_name
    )
    check_same_dim(q_src, g_src)
    check_same_checkpoint(q_src, g_src)
    for table, src, name in ((q_table, q_src, q_name), (g_table, g_src, g_name)):
        _check_keyed(table, src, name)
    _check_whole_sketches(q_table, q_src, q_name, protocol)
    return Inputs(
        protocol=protocol,
        query=aligned_table(q_table, q_src),
        gallery=aligned_table(g_table, g_src),
        query_embeddings=q_src,
        gallery_embeddings=g_src,
        names=(q_name or "query table", g_name or "gallery table"),
    )


def _check_whole_sketches(
    table: Table, source: EmbeddingSource, manifest: str | None, protocol: str
) -> None:
    """Sketch units with id-keyed query features that left rows out (``on_missing:
    drop``): a sketch keeps all its renderings or none.  One left out of a sketch whose
    others were kept would make a shorter sketch of it, its last kept rendering scored as
    the complete one (acc@K) and its weights shifted, silently."""
    import numpy as np

    from .errors import RankwiseError
    from .manifest import row_line
    from .registry import get_protocol

    if source.manifest_rows is None or get_protocol(protocol).unit != "sketch":
        return
    sketch = np.asarray(table["sketch"]).astype(str)
    kept = np.zeros(len(table), dtype=bool)
    kept[np.asarray(source.manifest_rows, dtype=np.int64)] = True
    partial = np.intersect1d(sketch[kept], sketch[~kept])
    if len(partial):
        row = int(np.flatnonzero(~kept & np.isin(sketch, partial))[0])  # manifest order
        raise RankwiseError(
            f"{source.path}: the id-keyed query features left out step "
            f"{table['step'][row]} of sketch {str(sketch[row])!r} ({manifest or 'query table'} "
            f"line {row_line(row, table)}) but kept its other renderings "
            f"({len(partial)} such sketch(es)): a sketch is scored with all its renderings "
            "(acc@K on the complete one); give features for every rendering, or remove the "
            "sketch's rows from the manifest"
        )


def _check_keyed(table: Table, source: EmbeddingSource, manifest: str | None) -> None:
    """Features keyed by ids (a Zarr group's ``ids``) are read by row: the ids must agree."""
    if source.ids_array is None:
        return
    assert source.path is not None  # keyed features are a Zarr group on disk
    from .feature_ids import check_in_order, zarr_ids

    check_in_order(
        zarr_ids(source.path),
        table["id"],
        ids=f"{source.path}/{source.ids_array}",
        manifest=manifest or "the manifest",
    )


def aligned_table(table: Table, source: EmbeddingSource) -> Table:
    """The manifest rows ``source`` holds (all of them, unless rows were dropped), 0..N-1."""
    if source.manifest_rows is None:
        return table
    return table.take(source.manifest_rows)


def read_evaluated_manifest(
    manifest, embeddings, *, protocol: str, role: str, name: str | None = None
) -> Table:
    """A manifest as it was evaluated with ``embeddings`` (a store's path, or None).

    The rows a ranks store's indices count: the whole manifest, or, when ``embeddings``
    is a store with dropped rows, those it holds (then checked like :func:`open_inputs`:
    the manifest must be the one the store was encoded from).
    """
    table = read_manifest(manifest, protocol=protocol, role=role)
    if embeddings is None or not os.path.isdir(str(embeddings)):
        return table
    source = open_embeddings(embeddings, name=name or f"{role} embeddings")
    if source.manifest_rows is None:
        return table
    check_manifest(source, _name(manifest))
    check_rows(source, len(table), _name(manifest))
    return aligned_table(table, source)


def _name(source) -> str | None:
    return None if is_dataframe(source) or isinstance(source, Table) else str(source)
