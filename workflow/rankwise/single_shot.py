"""CUHK03 single-gallery-shot CMC (torchreid's and fast-reid's ``eval_cuhk03``).

For an evaluated query q (reid validity: q's own id, same label AND same camera, and
junk labels are not ranked), the gallery is cut down to ONE valid item per identity,
drawn at random, and q's *single-shot rank* is the drawn true match's rank among the
drawn items:

    r = 1 + #{identities j != label(q) : key(drawn_j) <= key(drawn_q)}

(``key`` the engine's canonical distance; ``<=`` is the README's tie rule: a
non-relevant item at equal distance is ahead.)  ``rankK`` and ``mrr`` read r (mean of
``[r <= K]`` and of ``1 / r`` over the draws); ``map`` and ``minp`` read the full valid
list, as ``eval_cuhk03`` computes AP.  Their rank is the position in ``np.argsort``
order (ties broken by luck); on tie-free data the two agree.

The draws (``repeats`` of them, default 10, ``seed`` default 0) are a function of the
inputs only, never of gallery row order or tiling:

- q's identities are the labels of its valid items, in ascending label (string)
  order; each identity's items in ascending gallery id (string) order;
- q's generator is numpy's ``default_rng([seed, h])`` with ``h`` the first 8 bytes
  (little-endian) of the SHA-256 of q's id (UTF-8; a pooled multi-query query: its
  representative's id);
- ``pick = rng.integers(0, sizes, size=(repeats, n_identities))``: draw ``d`` takes
  item ``pick[d, i]`` of identity i (``sizes`` the identities' item counts).

``repeats="exact"`` is the expectation over ALL draws (each identity's item uniform
and independent): with the true match t uniform among q's m valid relevant items and
``p_j(t) = #{items g of j : key(g) <= key(t)} / n_j``, the number of identities ahead
of t is Poisson-binomial with probabilities ``p_j(t)``, so

    P(r = k) = (1/m) sum_t PB(p(t))[k - 1].

Each query's distribution of r is stored (``shot_offsets`` / ``shot_pmf``: CSR,
``shot_pmf[shot_offsets[i] + k - 1] = P(r = k)``); sampled draws give multiples of
``1 / repeats``.  Queries are processed in blocks of at most ``query_block`` rows and
:data:`MAX_BLOCK_VALUES` keys: never the ``Q x G`` matrix.
"""

from __future__ import annotations

import hashlib

import numpy as np

from . import kernels
from .embeddings import EmbeddingSource
from .kernels import njit  # numba's, compiling per process where no cache is writable
from .options import GALLERY_CHUNK
from .protocols import Problem, dense_masks
from .ranking import prepare_chunk

#: Keys held at once: a block of queries x the gallery (float64, 256 MB).
MAX_BLOCK_VALUES = 1 << 25


def query_generator(seed: int, query_id: str) -> np.random.Generator:
    """The generator of one query's draws (module docstring)."""
    digest = hashlib.sha256(str(query_id).encode("utf-8")).digest()
    return np.random.default_rng([int(seed), int.from_bytes(digest[:8], "little")])


@njit(cache=True, nogil=True)
def poisson_binomial(p):
    """``pmf[c] = P(c of the independent events happen)``, event j with probability
    ``p[j]``; ``(len(p) + 1,)`` float64 (the textbook recursion, one event at a time)."""
    pmf = np.zeros(p.shape[0] + 1)
    pmf[0] = 1.0
    for j in range(p.shape[0]):
        pj = p[j]
        for c in range(j + 1, 0, -1):
            pmf[c] = pmf[c] * (1.0 - pj) + pmf[c - 1] * pj
        pmf[0] *= 1.0 - pj
    return pmf


def identities(labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Split items already ordered by (label, id) into identities: ``(starts, sizes)``."""
    starts = np.flatnonzero(np.r_[True, labels[1:] != labels[:-1]])
    return starts, np.diff(np.r_[starts, len(labels)])


def sampled_pmf(keys, starts, sizes, own: int, repeats: int, rng) -> np.ndarray:
    """Distribution of r over ``repeats`` seeded draws: ``(max r,)``, multiples of 1/repeats.

    ``keys``: the valid items' keys in (label, id) order; ``starts``/``sizes``: its
    identities; ``own``: the query's identity.
    """
    pick = rng.integers(0, sizes, size=(repeats, len(sizes)))
    drawn = keys[starts + pick]  # (repeats, n_identities)
    ahead = (drawn <= drawn[:, own : own + 1]).sum(axis=1) - 1  # minus its own draw
    return np.bincount(ahead, minlength=1) / repeats


def exact_pmf(keys, starts, sizes, own: int) -> np.ndarray:
    """Expected distribution of r over all draws (module docstring): ``(max r,)``."""
    mine = keys[starts[own] : starts[own] + sizes[own]]
    others = np.arange(len(sizes)) != own
    total = np.zeros(1)
    for t in mine:
        # p_j(t): the fraction of identity j's items at or ahead of t (tie rule: <=)
        p = (np.add.reduceat((keys <= t).astype(np.int64), starts) / sizes)[others]
        always = int((p == 1.0).sum())  # certainly ahead: a shift, not a factor
        pmf = np.r_[np.zeros(always), poisson_binomial(p[(p > 0) & (p < 1)])]
        if len(pmf) > len(total):
            total = np.r_[total, np.zeros(len(pmf) - len(total))]
        total[: len(pmf)] += pmf
    return total / len(mine)


def shot_ranks(
    problem: Problem,
    query: EmbeddingSource,
    gallery: EmbeddingSource,
    *,
    evaluated: np.ndarray,
    query_ids: np.ndarray,
    gallery_order: np.ndarray,
    cosine: bool,
    query_block: int,
) -> dict[str, np.ndarray]:
    """``shot_offsets`` / ``shot_pmf`` of every evaluated query (module docstring).

    Parameters
    ----------
    problem : reid, with ``options`` holding ``shot_repeats`` and ``shot_seed``.
    query, gallery : the embedding sources ranked, ``(Q, D)`` / ``(G, D)``.
    evaluated : ``(n_eval,)`` query rows (of ``query``), ascending.
    query_ids : ``(Q,)`` str, the ids that seed each query's draws.
    gallery_order : ``(G,)`` gallery rows sorted by (label, id) as strings.
    cosine : the distance; query_block : queries per block.
    """
    repeats = problem.options["shot_repeats"]
    seed = problem.options["shot_seed"]
    n_g = gallery.shape[0]
    block = max(1, min(query_block, MAX_BLOCK_VALUES // max(n_g, 1)))
    chunk = GALLERY_CHUNK.default  # gallery rows read at a time
    qrows, _ = prepare_chunk(query, 0, query.shape[0], cosine)
    pmfs: list[np.ndarray] = []
    all_g = np.arange(n_g, dtype=np.int64)
    for lo in range(0, len(evaluated), block):
        rows = evaluated[lo : lo + block]
        keys = np.empty((len(rows), n_g), np.float64)
        sub = np.ascontiguousarray(qrows[rows])
        for start in range(0, n_g, chunk):
            stop = min(start + chunk, n_g)
            grows, _ = prepare_chunk(gallery, start, stop, cosine)
            keys[:, start:stop] = kernels.tile_keys(sub, grows, cosine)
        for n, q in enumerate(rows):
            valid, _ = dense_masks(problem, np.int64(q), all_g)
            items = gallery_order[valid[gallery_order]]
            labels = problem.glab[items]
            starts, sizes = identities(labels)
            own = int(np.flatnonzero(labels[starts] == problem.qlab[q])[0])
            if repeats == "exact":
                pmf = exact_pmf(keys[n, items], starts, sizes, own)
            else:
                rng = query_generator(seed, query_ids[q])
                pmf = sampled_pmf(keys[n, items], starts, sizes, own, int(repeats), rng)
            pmfs.append(np.trim_zeros(pmf, "b"))
    sizes = np.array([len(p) for p in pmfs], np.int64)
    return {
        "shot_offsets": np.r_[0, np.cumsum(sizes)].astype(np.int64),
        "shot_pmf": np.concatenate(pmfs) if pmfs else np.zeros(0),
    }
