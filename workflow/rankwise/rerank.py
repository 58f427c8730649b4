"""k-reciprocal re-ranking (Zhong et al., CVPR 2017) out of core: embeddings -> ranks.

The numbers are those of the published ``re_ranking(q_g_dist, q_q_dist, g_g_dist, k1,
k2, lambda_value)`` that torchreid (``torchreid/utils/rerank.py``) and fast-reid use,
computed in float64.  Over the N = Q + G items (the queries, then the gallery items,
each in the string order of their ids, :func:`item_order`: "item index" below is this
position, so exactly tied neighbours never follow the manifests' row order), with d the
input distance:

    o(i, j)   = d(i, j)^2 / M_i,  M_i = max_j d(i, j)^2      (the reference squares d and
                                                            divides by column maxima)
    F(i, k)   = the k items nearest to i by o(i, .)         (``initial_rank[i, :k]``)
    R(i, k)   = {j in F(i, k + 1) : i in F(j, k + 1)}       (k-reciprocal neighbours)
    E(i)      = R(i, k1) U every R(c, h), c in R(i, k1), with
                |R(c, h) n R(i, k1)| > 2/3 |R(c, h)|,  h = round(k1 / 2) (numpy's around)
    V(i, j)   = exp(-o(i, j)) / sum_{j' in E(i)} exp(-o(i, j'))  on E(i), else 0
    V'(i)     = mean of V(j) over j in F(i, k2)             (local query expansion; k2 = 1: V)
    J(q, g)   = 1 - m / (2 - m),  m = sum_k min(V'(q, k), V'(g, k))
    final(q, g) = (1 - lambda) J(q, g) + lambda o(q, g)

d is what torchreid hands ``re_ranking``: ``euclidean`` -> squared L2 (its
``euclidean_squared_distance``), ``cosine`` -> ``1 - cos``; each pair's d is the
canonical float64 sum over the float32 rows of :mod:`rankwise.kernels` (symmetric, so
column and row maxima agree).  F orders by d^2 as the reference does (it sorts o): d
itself can be slightly negative (rounding: near-parallel rows under cosine, near-equal
rows under euclidean), where d and d^2 disagree.  Ties of d^2 go by item index (numpy's
stable sort); the division by M_i can merge two d^2 one ulp apart into one o, which F
still orders by d^2 (an order the reference's unstable argsort may give too).  A row
whose distances are all 0 has o = 0.  Ranks then follow
the README's tie rule on ``final`` with the protocol's validity rule (``dense_masks``).

Where the reference's own output differs (it works in float32): o, V, V', m, J and
final are float32 there, so final distances carry relative errors of ~1e-7 and two
gallery items closer than that can swap or tie in its ranking (never here, up to
float64 rounding); its ``np.argsort`` (quicksort) orders exactly tied neighbours
arbitrarily, which can change F at the k1 + 1 / h + 1 / k2 boundaries; pairs sharing
no neighbour have J = 1 in both.  Older copies (float16 V) differ more.

``variant: fastreid`` -- fast-reid's own evaluator (``ReidEvaluator`` with
``TEST.RERANK.ENABLED``) does not call ``re_ranking``: it takes ``build_dist(q, g,
"jaccard", k1, k2)`` (``compute_jaccard_distance`` in ``fastreid/utils/compute_dist.py``,
from OpenUnReID) and mixes it with its plain distance.  On the same N items, with the
features ``x`` (the prepared rows: L2-normalised under cosine, raw under euclidean) and
``s(i, j) = |x_i - x_j|^2`` (``2 d`` for unit rows, d under euclidean):

    F(i, k)   = the k items nearest to i by s (faiss's exact search), at most k1 of
                them: its ``initial_rank`` has k1 columns, so R(i, k1) uses F(i, k1)
                and R(c, h) F(c, min(h + 1, k1)); ties here by item index
    V(i, j)   = softmax over j in E(i) of -s(i, j)          (no division by M_i)
    J         as above, negatives set to 0
    final(q, g) = (1 - lambda) J(q, g) + lambda d(q, g)     (its plain distance: 1 - cos
                                                            or squared L2)

with E, V' and m as above; fast-reid works in float32 (faiss, torch), rankwise in
float64 with the canonical d.  Its "+RK" numbers differ from torchreid's re_ranking by
several points on small galleries.

Out of core: (1) per block of item rows, float32 BLAS tiles against column chunks
screen the pairs and canonical distances decide the top (k1 + 1) neighbours by (d^2,
index) and M_i exactly (:func:`neighbour_task`), never the N x N matrix; (2) the
k-reciprocal sets and V are sparse rows (O(k1) non-zeros), V' has at most k2 times as
many; (3) per block of queries, m (via the inverted index of the gallery rows of V')
and o against the whole gallery give ``final`` for that block only, and the ranks of
its relevant items are counted there.  Memory: the prepared rows (N x D float32), the
neighbour lists, V and V' (~N k2 |E| x 12 bytes) and a few tiles of ~2M float64 values
per worker.  Stage (3) takes o from float32 BLAS tiles too, and canonical d only
for the relevant pairs and for pairs whose final is within its error bound of a
relevant one (:func:`final_task`), as the plain engine does.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .embeddings import EmbeddingSource
from .errors import RankwiseError
from .kernels import _canonical_key, njit, pair_keys
from .options import rerank_applies
from .protocols import Problem, dense_masks

#: Largest (query block x gallery) tile of the final stage, in float64 values.
_TILE_VALUES = 1 << 21
#: Nearest valid gallery items kept per query by re-ranked distance (the report's worst
#: queries show them: the plain distance's neighbours would be the wrong ones).
TOP_STORED = 20


# ----------------------------------------------------------------- compiled kernels


@njit(cache=True, nogil=True)
def distance_tile(a, b, cosine):
    """Per tile: ``(len(a), len(b))`` float64 input distances d (module docstring)."""
    out = np.empty((a.shape[0], b.shape[0]), dtype=np.float64)
    for i in range(a.shape[0]):
        for j in range(b.shape[0]):
            key = _canonical_key(a[i], b[j], cosine)
            out[i, j] = 1.0 + key if cosine else key
    return out


@njit(cache=True, nogil=True)
def pair_distances(x, pi, pj, cosine):
    """d of the pairs ``(x[pi[t]], x[pj[t]])``."""
    out = np.empty(pi.shape[0], dtype=np.float64)
    for t in range(pi.shape[0]):
        key = _canonical_key(x[pi[t]], x[pj[t]], cosine)
        out[t] = 1.0 + key if cosine else key
    return out


@njit(cache=True, nogil=True)
def merge_neighbours(rows, cols, dist, near, best_d, best_i, count, row_max, squared):
    """Per tile: fold the screened pairs ``(rows[t], cols[t])`` with canonical d
    ``dist[t]`` into each row's sorted top list and ``max d^2``.

    ``best_d``/``best_i`` ``(b, K)`` hold the K nearest so far by (key, index), the key
    d^2 (``squared``: re-ranking) or d (query expansion), ``best_d`` holding the key.
    Pairs come row by row, columns ascending, and chunks in ascending column order, so a
    new column never precedes an equal-key one already held.  Only pairs with
    ``near[t]`` may enter the list; every pair updates ``row_max``.
    """
    k = best_d.shape[1]
    for t in range(rows.shape[0]):
        r = rows[t]
        sq = dist[t] * dist[t]
        if sq > row_max[r]:
            row_max[r] = sq
        d = sq if squared else dist[t]
        if not near[t]:
            continue
        n = count[r]
        if n == k:
            if not d < best_d[r, k - 1]:
                continue
            p = k - 1
        else:
            p = n
            count[r] = n + 1
        while p > 0 and best_d[r, p - 1] > d:
            best_d[r, p] = best_d[r, p - 1]
            best_i[r, p] = best_i[r, p - 1]
            p -= 1
        best_d[r, p] = d
        best_i[r, p] = cols[t]


@njit(cache=True, nogil=True)
def min_sums(rows, ptr, idx, val, cptr, crow, cval, n_gallery):
    """Per query block: ``m[b, g] = sum_k min(V'(rows[b], k), V'(g, k))``.

    ``ptr/idx/val``: V' as CSR (all N rows); ``cptr/crow/cval``: its gallery rows by
    column (the inverted index), ``crow`` numbering gallery rows from 0.  Terms are added
    in ascending k, as the reference does.
    """
    out = np.zeros((rows.shape[0], n_gallery), dtype=np.float64)
    for b in range(rows.shape[0]):
        i = rows[b]
        for p in range(ptr[i], ptr[i + 1]):
            k = idx[p]
            v = val[p]
            for t in range(cptr[k], cptr[k + 1]):
                w = cval[t]
                out[b, crow[t]] += v if v < w else w
    return out


# ----------------------------------------------------------------- task functions


def neighbour_task(x, sq, lo, hi, k, chunk, cosine, squared=True):
    """Per row block: the ``k`` nearest items of rows ``[lo, hi)`` by canonical
    (d^2, index) (``squared``; else (d, index): query expansion's most similar first),
    and ``M_i = max_j d(i, j)^2``.

    The float32 BLAS tile screens the pairs by ``|d|`` (or d): its d is within ``eps``
    (the bound of :mod:`rankwise.kernels`) of the canonical one, so a pair with
    ``|approx| - eps`` above an upper bound of the row's final k-th ``|d|`` cannot be
    among the k, and one with ``|approx| + eps`` below ``max |approx| - max eps`` cannot
    be the row's maximum; the canonical d of the others decides.  Exact, and the same
    for every tile shape.
    """
    from .kernels import error_bound_factor, pair_keys

    n, rows = x.shape[0], hi - lo
    bound = error_bound_factor(x.shape[1])
    a, an = x[lo:hi], np.sqrt(sq[lo:hi])
    best_d = np.full((rows, k), np.inf)
    best_i = np.full((rows, k), -1, dtype=np.int64)
    count = np.zeros(rows, dtype=np.int64)
    row_max = np.zeros(rows)
    for c0 in range(0, n, chunk):
        c1 = min(c0 + chunk, n)
        b, bn = x[c0:c1], np.sqrt(sq[c0:c1])
        s = (a @ b.T).astype(np.float64)
        if cosine:
            approx = 1.0 - s
            eps = bound * an[:, None] * bn[None, :]
        else:
            approx = sq[lo:hi, None] + sq[None, c0:c1] - 2.0 * s
            eps = bound * (an[:, None] + bn[None, :]) ** 2
        size = np.abs(approx)  # d^2 orders by |d|
        order = size if squared else approx
        kk = min(k, c1 - c0)
        tile_kth = np.partition(order, kk - 1, axis=1)[:, kk - 1]
        slack = eps.max(axis=1)
        if squared:
            # the held k-th |d|, from its d^2: sqrt's and the square's roundings are far
            # below 2^-50 relative, so this is >= it (and >= any |d| of the same d^2)
            held = np.where(count == k, np.sqrt(best_d[:, k - 1]) * (1.0 + 2.0**-50), np.inf)
        else:
            held = np.where(count == k, best_d[:, k - 1], np.inf)
        upper = np.minimum(held, tile_kth + slack)  # >= the row's final k-th key
        near = order - eps <= upper[:, None]
        top = size + eps >= (size.max(axis=1) - slack)[:, None]
        r, c = np.nonzero(near | top)
        keys = pair_keys(a, b, r, c, cosine)
        d = keys + 1.0 if cosine else keys
        merge_neighbours(r, c + c0, d, near[r, c], best_d, best_i, count, row_max, squared)
    return best_i, row_max


def _final(jaccard, d, scale, lam, fastreid=False):
    """``(1 - lambda) J + lambda o`` with ``o = d^2 / M`` (0 when M = 0), or with
    ``fastreid``: ``(1 - lambda) max(J, 0) + lambda d``: one formula for every pair, so
    that a recomputed pair gets the same bits."""
    if fastreid:
        return np.maximum(jaccard, 0.0) * (1.0 - lam) + d * lam
    original = np.divide(d * d, scale, out=np.zeros_like(d), where=scale > 0)
    return jaccard * (1.0 - lam) + original * lam


def final_task(
    rows, x, sq, n_query, codes, sparse, row_max, lam, chunk, cosine, fastreid=False, at=None
):
    """Per query block: ``final`` against every gallery item, then the sorted ranks of
    each query's valid relevant items (README: ties count against the query).

    ``rows`` are query rows; ``at = (qpos, gorder)`` gives each query row's item
    position in ``x`` (and in ``sq``, ``row_max``, ``sparse``) and the gallery row at
    each gallery position, when the items are laid out in id order (:func:`item_order`;
    ``None``: row order).  Columns stay in position order (a count does not depend on
    it); the validity masks are taken at the positions' rows, the top items given as rows.

    J is exact (sparse); o comes from the float32 BLAS tile, within a bound of the
    canonical o (``|d_a^2 - d^2| <= eps (2 |d_a| + eps)``; ``fastreid``: o is d, within
    eps).  The relevant items' finals
    use canonical d; a non-relevant item whose approximate final lies within its bound
    of one of them is recomputed with canonical d, any other sits on the same side of
    every threshold either way -- so the counts are those of canonical d everywhere.

    Returns ``(ranks, top)``: a list of ``(n_relevant,)`` int64 rank arrays, one per row
    of ``rows``, and ``(len(rows), TOP_STORED)`` int64: each query's nearest valid gallery
    items by (canonical final, relevant last, index), ``-1`` where it has fewer.
    """
    from .kernels import error_bound_factor

    ptr, idx, val = sparse["ptr"], sparse["idx"], sparse["val"]
    cptr, crow, cval = sparse["cptr"], sparse["crow"], sparse["cval"]
    n_gallery = x.shape[0] - n_query
    qpos, gorder = at if at is not None else (None, None)
    items = rows if qpos is None else qpos[rows]  # the queries' positions in x
    bound = error_bound_factor(x.shape[1])
    m = min_sums(items, ptr, idx, val, cptr, crow, cval, n_gallery)
    a, an = x[items], np.sqrt(sq[items])
    d = np.empty_like(m)
    eps = np.empty_like(m)
    for c0 in range(0, n_gallery, chunk):
        c1 = min(c0 + chunk, n_gallery)
        g, gsq = x[n_query + c0 : n_query + c1], sq[n_query + c0 : n_query + c1]
        s = (a @ g.T).astype(np.float64)
        if cosine:
            d[:, c0:c1] = 1.0 - s
            eps[:, c0:c1] = bound * an[:, None] * np.sqrt(gsq)[None, :]
        else:
            d[:, c0:c1] = sq[items][:, None] + gsq[None, :] - 2.0 * s
            eps[:, c0:c1] = bound * (an[:, None] + np.sqrt(gsq)[None, :]) ** 2
    jaccard = 1.0 - m / (2.0 - m)
    scale = row_max[items][:, None]
    final = _final(jaccard, d, scale, lam, fastreid)
    # the bound on final, plus float64 rounding of the formula itself
    if fastreid:
        err = lam * eps
    else:
        err = np.divide(
            lam * eps * (2.0 * np.abs(d) + eps), scale, out=np.zeros_like(d), where=scale > 0
        )
    err += 1e-13 * (1.0 + np.abs(final))
    gallery_rows = np.arange(n_gallery) if gorder is None else gorder  # of each position
    valid, relevant = dense_masks(codes, rows[:, None], gallery_rows[None, :])
    out = []
    top = np.full((len(rows), TOP_STORED), -1, dtype=np.int64)
    for b in range(len(rows)):

        def exact(cols, b=b):
            """Canonical finals of query ``rows[b]`` against gallery positions ``cols``."""
            query = np.full(len(cols), items[b], dtype=np.int64)
            keys = pair_keys(x, x, query, cols + n_query, cosine)
            dist = keys + 1.0 if cosine else keys
            return _final(jaccard[b, cols], dist, scale[b], lam, fastreid)

        thr = np.sort(exact(np.flatnonzero(relevant[b])))
        others = np.flatnonzero(valid[b] & ~relevant[b])
        approx, slack = final[b, others], err[b, others]
        near = np.searchsorted(thr, approx - slack, "left") < np.searchsorted(
            thr, approx + slack, "right"
        )
        approx[near] = exact(others[near])
        ahead = np.sort(approx)
        out.append(1 + np.searchsorted(ahead, thr, side="right") + np.arange(len(thr)))
        top[b] = _top(np.flatnonzero(valid[b]), final[b], err[b], relevant[b], exact)
    if gorder is not None:  # positions -> gallery rows
        top = np.where(top >= 0, gorder[np.maximum(top, 0)], -1)
    return out, top


def _top(cols: np.ndarray, final: np.ndarray, err: np.ndarray, relevant, exact) -> np.ndarray:
    """The ``TOP_STORED`` of ``cols`` nearest by (canonical final, relevant after
    non-relevant -- the engine's tie rule -- , index), ``-1``-padded: every item whose
    approximate final may reach the k-th smallest upper bound gets its canonical final (a
    handful), the others cannot be among the k."""
    out = np.full(TOP_STORED, -1, dtype=np.int64)
    if len(cols) == 0:
        return out
    k = min(TOP_STORED, len(cols))
    lo, hi = final[cols] - err[cols], final[cols] + err[cols]
    kth_upper = np.partition(hi, k - 1)[k - 1]
    candidates = cols[lo <= kth_upper]
    keys = exact(candidates)
    order = np.lexsort((candidates, relevant[candidates], keys))[:k]
    out[:k] = candidates[order]
    return out


def neighbours(
    x, sq, k, block, chunk, cosine, runner, squared=True
) -> tuple[np.ndarray, np.ndarray]:
    """``(nn, row_max)``: every item's ``k`` nearest (``(N, k)`` int64; by d^2, or by d
    when not ``squared``) and ``M_i``, by row blocks of at most ``block`` rows (fewer
    when a tile would pass ~4M values)."""
    from .ranking import _key_maker

    rows = max(1, min(block, _TILE_VALUES // max(min(chunk, len(x)), 1)))
    shared_x, shared_sq = runner.put(x), runner.put(sq)
    key = _key_maker()
    starts = list(range(0, len(x), rows))
    graph = {
        key("nn", lo): (
            neighbour_task,
            shared_x,
            shared_sq,
            lo,
            min(lo + rows, len(x)),
            k,
            chunk,
            cosine,
            squared,
        )
        for lo in starts
    }
    parts = runner.get(graph, [key("nn", lo) for lo in starts])
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


# ----------------------------------------------------------------- sparse stages


def _reciprocal(nn: np.ndarray, k: int, block: int = 4096) -> list[np.ndarray]:
    """R(i, k) for every i: members of F(i, k + 1) whose own F(j, k + 1) holds i
    (in F's order)."""
    forward = nn[:, : k + 1]
    out = []
    for lo in range(0, len(nn), block):
        f = forward[lo : lo + block]
        back = nn[f, : k + 1]
        here = np.arange(lo, lo + len(f))[:, None, None]
        mask = (back == here).any(axis=2)
        out += [row[keep] for row, keep in zip(f, mask, strict=True)]
    return out


def _expansion_sets(nn: np.ndarray, k1: int) -> list[np.ndarray]:
    """E(i): R(i, k1) plus each candidate's R(c, h) sharing more than 2/3 of it."""
    half = int(np.around(k1 / 2.0))
    full, small = _reciprocal(nn, k1), _reciprocal(nn, half)
    sets = []
    for members in full:
        mine = set(members.tolist())
        parts = [members]
        for c in members:
            theirs = small[c]
            # the reference's test, in its own float arithmetic
            if len(mine.intersection(theirs.tolist())) > 2.0 / 3 * len(theirs):
                parts.append(theirs)
        sets.append(np.unique(np.concatenate(parts)))
    return sets


def _weights(x, sets, row_max, cosine, fastreid=False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """V as CSR ``(ptr, idx, val)``: ``exp(-o)`` over E(i), normalised per row; with
    ``fastreid`` o is the squared L2 distance of the features (unit rows under cosine:
    ``2 d``), shifted by the row's smallest o first, as torch's softmax does."""
    sizes = np.array([len(s) for s in sets], dtype=np.int64)
    ptr = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    idx = np.concatenate(sets).astype(np.int64) if len(sets) else np.zeros(0, np.int64)
    rows = np.repeat(np.arange(len(sets), dtype=np.int64), sizes)
    d = pair_distances(x, rows, idx, cosine)
    if fastreid:
        o = 2.0 * d if cosine else d
        if len(o):
            low = np.zeros(len(sets))
            low[sizes > 0] = np.minimum.reduceat(o, ptr[:-1][sizes > 0])
            o = o - low[rows]
    else:
        scale = row_max[rows]
        o = np.divide(d * d, scale, out=np.zeros_like(d), where=scale > 0)
    w = np.exp(-o)
    val = w / np.bincount(rows, weights=w, minlength=len(sets))[rows]
    return ptr, idx, val


def _expand(v, nn, k2, block: int = 8192):
    """V' as CSR: row i is the mean of V's rows F(i, k2) (k2 = 1: V itself).

    Each column's terms are added in ascending source row, not in F(i, k2)'s distance
    order: two items with the same neighbours in another order then get bitwise-equal
    rows, so a tie that is exact in the definition (common at lambda = 0, where only the
    Jaccard distance counts) stays one and the tie rule decides it, whatever the row order.
    """
    ptr, idx, val = v
    if k2 == 1:
        return v
    sizes = np.diff(ptr)
    out_ptr, out_idx, out_val = [np.zeros(1, np.int64)], [], []
    total = 0
    for lo in range(0, len(nn), block):
        src = nn[lo : lo + block, :k2]  # (b, k2) rows to average
        flat = src.ravel()
        n = sizes[flat]
        owner = np.repeat(np.repeat(np.arange(lo, lo + len(src)), k2), n)
        at = np.repeat(ptr[flat], n) + (np.arange(n.sum()) - np.repeat(np.cumsum(n) - n, n))
        col, value, source = idx[at], val[at], np.repeat(flat, n)
        order = np.lexsort((source, col, owner))
        owner, col, value = owner[order], col[order], value[order]
        start = np.flatnonzero(np.r_[True, (owner[1:] != owner[:-1]) | (col[1:] != col[:-1])])
        out_idx.append(col[start])
        out_val.append(np.add.reduceat(value, start) / k2)
        counts = np.bincount(owner[start] - lo, minlength=len(src))
        out_ptr.append(total + np.cumsum(counts))
        total += int(counts.sum())
    return np.concatenate(out_ptr), np.concatenate(out_idx), np.concatenate(out_val)


def _inverted(v, n_query: int, n_all: int):
    """The gallery rows of V' by column: ``(cptr, crow, cval)``, rows counted from 0."""
    ptr, idx, val = v
    lo = ptr[n_query]
    rows = np.repeat(np.arange(n_all - n_query, dtype=np.int64), np.diff(ptr[n_query:]))
    cols, vals = idx[lo:], val[lo:]
    order = np.argsort(cols, kind="stable")
    cptr = np.concatenate([[0], np.cumsum(np.bincount(cols, minlength=n_all))]).astype(np.int64)
    return cptr, rows[order], vals[order]


# ----------------------------------------------------------------- the stage


def neighbour_pass_mb(n_rows: int, block: int, chunk: int, workers: int) -> float:
    """Memory (MB) of the tiled neighbour pass (:func:`neighbour_task`) beyond its
    inputs: per worker, a ``(block, chunk)`` tile's similarities, screened distances,
    bounds and masks (~24 bytes a value alive at once, measured)."""
    b, c = min(block, max(n_rows, 1)), min(chunk, max(n_rows, 1))
    return workers * 24.0 * b * c / 2**20


def estimate_memory_mb(
    n_query: int,
    n_gallery: int,
    dim: int,
    rerank: dict[str, Any],
    workers: int,
    block: int = 1024,
    chunk: int = 8192,
) -> float:
    """Peak resident memory (MB) of re-ranking, from its shapes alone (module docstring's
    memory, with |E| taken as 2 (k1 + 1) and V' at its bound of k2 |E| non-zeros a row).

    Held: the prepared rows (queries, gallery and both together: ``4 D (Q + 2 G + N)``
    bytes), the neighbour lists (``N (k1 + 1)`` distances and indices, and their merge
    buffers), V, V' and V's inverted gallery index (12 bytes a non-zero).  Per worker at
    a time: the neighbour pass's tile (:func:`neighbour_pass_mb`), later the final
    stage's (six float64 arrays of a query block against the gallery, at most
    :data:`_TILE_VALUES` values).
    """
    from .ranking import _BASE_MB

    n_all = n_query + n_gallery
    keep = int(rerank["k1"]) + 1
    expansion = 2 * keep
    held = (
        4.0 * dim * (n_query + 2 * n_gallery + n_all)
        + 32.0 * n_all * keep
        + 12.0 * expansion * (n_all + (int(rerank["k2"]) + 1) * (n_all + n_gallery))
    )
    # the final stage's tiles: rows_per_task x G (as rerank_ranks), one per busy worker
    rows = max(1, min(block, n_query, _TILE_VALUES // max(n_gallery, 1)))
    busy = min(workers, -(-max(n_query, 1) // rows))
    final = busy * 6 * 8.0 * rows * n_gallery / 2**20
    return _BASE_MB + held / 2**20 + max(neighbour_pass_mb(n_all, block, chunk, workers), final)


def item_order(problem: Problem) -> tuple[np.ndarray, np.ndarray]:
    """``(qorder, gorder)``: the query rows and the gallery rows in the string order of
    their ids (``problem.qkey``, ``problem.gkey``; repeated ids, or keys not set: in row
    order): the order in which re-ranking and AQE lay out their items, so that the
    manifests' row order changes no number."""
    qkey = problem.qkey if problem.qkey is not None else np.arange(len(problem.qlab))
    gkey = problem.gkey if problem.gkey is not None else np.arange(len(problem.glab))
    return (
        np.argsort(qkey, kind="stable").astype(np.int64),
        np.argsort(gkey, kind="stable").astype(np.int64),
    )


def rerank_ranks(
    problem: Problem,
    qrows: np.ndarray,
    qsq: np.ndarray,
    gallery: EmbeddingSource,
    *,
    cosine: bool,
    rerank: dict[str, Any],
    options,
    runner,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Ranks of every evaluated query on the re-ranked distance (module docstring).

    Parameters
    ----------
    problem : a protocol re-ranking applies to (:func:`rankwise.options.rerank_applies`).
    qrows, qsq : ``(Q, D)`` float32 prepared query rows and their float64 squared norms
        (:func:`rankwise.kernels.prepare_rows`); gallery: source ``(G, D)``.
    cosine : the distance is ``cosine`` (else ``euclidean``).
    rerank : ``{"k1", "k2", "lambda"}`` and optionally ``"variant"`` (``"fastreid"``:
        fast-reid's evaluator, module docstring) (:func:`rankwise.options.check_rerank`).
    options, runner : :class:`rankwise.ranking.EngineOptions` and its runner (threads or
        a cluster); tiling and workers never change a number.

    Returns
    -------
    ``(offsets, ranks, top)``: CSR over the evaluated queries, ascending query row, and
    their :data:`TOP_STORED` nearest valid gallery rows by re-ranked distance
    (``(n_eval, TOP_STORED)``, ``-1``-padded; :func:`final_task`).
    """
    from .ranking import _key_maker, prepare_chunk

    if not rerank_applies(problem.protocol):  # the API checks first; this guards direct calls
        raise RankwiseError(f"rerank does not apply to protocol {problem.protocol!r}")
    n_query = len(qrows)
    grows, gsq = prepare_chunk(gallery, 0, gallery.shape[0], cosine)
    # items in id order (queries first): exactly tied neighbours at a k cut and the
    # order of V's sums then follow the ids, never the manifests' row order
    qorder, gorder = item_order(problem)
    x = np.empty((n_query + len(grows), qrows.shape[1]), dtype=qrows.dtype)
    np.take(qrows, qorder, axis=0, out=x[:n_query])
    np.take(grows, gorder, axis=0, out=x[n_query:])
    del grows  # the prepared gallery rows live on in x only
    sq = np.concatenate([qsq[qorder], gsq[gorder]])
    at = (np.argsort(qorder), gorder)
    n_all, n_gallery = len(x), len(x) - n_query
    k1, k2, lam = int(rerank["k1"]), int(rerank["k2"]), float(rerank["lambda"])
    fastreid = rerank.get("variant") == "fastreid"
    # fast-reid's initial_rank has k1 columns (by d: squared L2 of the features), so its
    # [:, :k1 + 1] slices hold k1 items; torchreid's has all, sorted by d^2
    keep = min(k1 if fastreid else k1 + 1, n_all)
    shared = runner.put(x)
    block, chunk = options.query_block, options.gallery_chunk
    nn, row_max = neighbours(x, sq, keep, block, chunk, cosine, runner, squared=not fastreid)

    v = _weights(x, _expansion_sets(nn, k1), row_max, cosine, fastreid)
    v = _expand(v, nn, min(k2, keep))
    sparse = dict(
        zip(
            ("ptr", "idx", "val", "cptr", "crow", "cval"),
            (*v, *_inverted(v, n_query, n_all)),
            strict=True,
        )
    )

    evaluated = np.flatnonzero(~problem.skip).astype(np.int64)
    rows_per_task = max(1, min(block, _TILE_VALUES // max(n_gallery, 1)))
    key = _key_maker()
    graph = {}
    spans = list(range(0, len(evaluated), rows_per_task))
    sparse_shared, max_shared = runner.put(sparse), runner.put(row_max)
    sq_shared = runner.put(sq)
    for lo in spans:
        graph[key("final", lo)] = (
            final_task,
            evaluated[lo : lo + rows_per_task],
            shared,
            sq_shared,
            n_query,
            problem,
            sparse_shared,
            max_shared,
            lam,
            chunk,
            cosine,
            fastreid,
            at,
        )
    parts = runner.get(graph, [key("final", lo) for lo in spans])
    lists = [r for part, _ in parts for r in part]
    top = (
        np.concatenate([t for _, t in parts])
        if parts
        else np.zeros((0, TOP_STORED), dtype=np.int64)
    )
    counts = np.array([len(r) for r in lists], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    ranks = np.concatenate(lists).astype(np.int64) if lists else np.zeros(0, np.int64)
    return offsets, ranks, top
