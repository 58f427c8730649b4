"""Brute-force reference implementations of every rankwise metric.

Written from DESIGN.md and the published evaluation code, independently of the
rankwise engine. Everything here holds the full (n_queries, n_gallery) distance
matrix in float64 and loops over queries in Python: fine for the small tables the
tests use, and easy to read against the originals:

- torchreid ``eval_market1501`` (torchreid/metrics/rank.py): full distance matrix,
  sort each row, drop invalid gallery items, cumulative match -> Rank-k,
  AP = mean over matches of the precision at each match;
- fast-reid mINP (fastreid/evaluation/rank.py): INP = G / (rank of the last match);
- the official Market-1501 MATLAB ``compute_AP`` (trapezoid rule), simulated step by step;
- SLFIR m@A / m@B (Bhunia et al., CVPR 2020) with DESIGN.md's formulas.

The one deliberate departure from the originals is the sort: torchreid uses
``np.argsort`` (ties broken by luck); DESIGN.md's pessimistic tie rule orders the
valid items by (distance ascending, non-relevant before relevant, gallery row
order), done here with ``np.lexsort``.

All metrics are returned as percentages, like rankwise's reports.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

PROTOCOLS = ("recall", "reid", "reassociation", "progressive")


# ---------------------------------------------------------------------------
# distances and protocol masks
# ---------------------------------------------------------------------------


def distance_matrix(query_emb, gallery_emb, distance: str) -> np.ndarray:
    """Float64 (n_queries, n_gallery) distances: ``cosine`` = 1 - cos, ``euclidean`` = L2.

    Identical gallery rows get bit-identical distances (each distinct row is
    computed once), so exact duplicates are exact ties.
    """
    q = np.asarray(query_emb, dtype=np.float64)
    g = np.asarray(gallery_emb, dtype=np.float64)
    uniq, inverse = np.unique(g, axis=0, return_inverse=True)
    inverse = np.asarray(inverse).reshape(-1)
    if distance == "cosine":
        qn = q / np.linalg.norm(q, axis=1, keepdims=True)
        un = uniq / np.linalg.norm(uniq, axis=1, keepdims=True)
        d = np.empty((len(q), len(uniq)))
        for i in range(len(q)):
            d[i] = 1.0 - (un * qn[i]).sum(axis=1)
    elif distance == "euclidean":
        d = np.empty((len(q), len(uniq)))
        for i in range(len(q)):
            d[i] = np.sqrt(((uniq - q[i]) ** 2).sum(axis=1))
    else:
        raise ValueError(distance)
    return d[:, inverse]


def protocol_masks(
    protocol, query: pd.DataFrame, gallery: pd.DataFrame, *, junk_labels=("-1",), gap_frames=1
):
    """Boolean (n_queries, n_gallery) ``valid`` and ``relevant`` masks (DESIGN.md table).

    ``relevant`` is already restricted to valid items.
    """
    ql = query["label"].astype(str).to_numpy()
    gl = gallery["label"].astype(str).to_numpy()
    qid = query["id"].astype(str).to_numpy()
    gid = gallery["id"].astype(str).to_numpy()
    same_label = ql[:, None] == gl[None, :]
    not_self = qid[:, None] != gid[None, :]
    if protocol == "recall":
        valid = not_self
    elif protocol == "reid":
        qc = query["camera"].astype(str).to_numpy()
        gc = gallery["camera"].astype(str).to_numpy()
        same_cam = qc[:, None] == gc[None, :]
        junk = np.isin(gl, [str(j) for j in junk_labels])[None, :]
        valid = not_self & ~(same_label & same_cam) & ~junk
    elif protocol == "reassociation":
        qs = query["sequence"].astype(str).to_numpy()
        gs = gallery["sequence"].astype(str).to_numpy()
        qf = query["frame"].astype(np.int64).to_numpy()
        gf = gallery["frame"].astype(np.int64).to_numpy()
        valid = (qs[:, None] == gs[None, :]) & (gf[None, :] == qf[:, None] + gap_frames) & not_self
    elif protocol == "progressive":
        valid = np.ones_like(same_label)
    else:
        raise ValueError(protocol)
    return valid, same_label & valid


# ---------------------------------------------------------------------------
# per-query pieces, in the style of the originals
# ---------------------------------------------------------------------------


def sorted_matches(dist_row, valid_row, relevant_row) -> np.ndarray:
    """torchreid's ``raw_cmc``: relevance of the valid items in ranked order.

    Sort key (DESIGN.md): distance ascending, then non-relevant before relevant,
    then gallery row order. Invalid items are sorted along and then removed, as
    torchreid removes same-pid-same-camera items after its argsort.
    """
    order = np.lexsort((np.arange(len(dist_row)), relevant_row.astype(np.int8), dist_row))
    keep = valid_row[order]
    return relevant_row[order][keep]


def market1501_query(raw_cmc: np.ndarray, max_rank: int):
    """torchreid ``eval_market1501`` inner loop + fast-reid INP for one query.

    Returns ``(cmc[:max_rank], AP, INP)`` or ``None`` when there is no match.
    """
    if not np.any(raw_cmc):
        return None
    cmc = raw_cmc.cumsum()
    pos_idx = np.where(raw_cmc == 1)
    pos_max_idx = np.max(pos_idx)
    inp = cmc[pos_max_idx] / (pos_max_idx + 1.0)  # fast-reid mINP
    cmc[cmc > 1] = 1
    cmc_cut = np.zeros(max_rank)
    n = min(max_rank, len(cmc))
    cmc_cut[:n] = cmc[:n]
    if n < max_rank and n > 0:
        cmc_cut[n:] = cmc[n - 1]
    num_rel = raw_cmc.sum()
    tmp_cmc = raw_cmc.cumsum()
    tmp_cmc = np.asarray([x / (i + 1.0) for i, x in enumerate(tmp_cmc)]) * raw_cmc
    ap = tmp_cmc.sum() / num_rel
    return cmc_cut, float(ap), float(inp)


def matlab_trapezoid_ap(raw_cmc: np.ndarray) -> float:
    """The official Market-1501 ``compute_AP.m``, step by step (junk already removed)."""
    ngood = int(raw_cmc.sum())
    old_recall, old_precision, ap = 0.0, 1.0, 0.0
    intersect_size, j, good_now = 0, 0, 0
    for flag in raw_cmc:
        if flag:
            good_now += 1
            intersect_size += 1
        recall = intersect_size / ngood
        precision = intersect_size / (j + 1)
        ap += (recall - old_recall) * ((old_precision + precision) / 2)
        old_recall, old_precision = recall, precision
        j += 1
        if good_now == ngood:
            break
    return ap


def pml_query(raw_cmc: np.ndarray, ks) -> dict:
    """pytorch-metric-learning's ``AccuracyCalculator`` formulas for one query, on its
    ranked relevance row (``avg_of_avgs=False``, ``k=None``: R = number of relevant items).

    precision@K = (relevant in the top K) / K; R-precision = (relevant in the top R) / R;
    MAP@R = (1/R) sum_{i <= R, item i relevant} precision@i.
    """
    R = int(raw_cmc.sum())
    top = np.zeros(max(max(ks), R), dtype=np.float64)
    top[: min(len(top), len(raw_cmc))] = raw_cmc[: len(top)]
    precision_at_i = np.cumsum(top) / np.arange(1, len(top) + 1)
    out = {f"precision@{k}": float(top[:k].sum()) / k for k in ks}
    out["r_precision"] = float(top[:R].sum()) / R
    out["map@r"] = float((precision_at_i[:R] * top[:R]).sum()) / R
    return out


def first_match_rank(raw_cmc: np.ndarray) -> int:
    """1-based rank of the first match (for MRR and recall@K)."""
    return int(np.flatnonzero(raw_cmc)[0]) + 1


def relevant_ranks(raw_cmc: np.ndarray) -> np.ndarray:
    """Sorted 1-based ranks of the relevant items."""
    return np.flatnonzero(raw_cmc) + 1


def ranks_by_counting(dist_row, valid_row, relevant_row) -> np.ndarray:
    """Second, independent route: DESIGN.md's rank formula, item by item.

    rank(j) = 1 + #{valid non-relevant g : d(g) <= d(j)}
                + #{valid relevant g : d(g) < d(j), or d(g) = d(j) and g before j}
    """
    out = []
    rel_idx = np.flatnonzero(relevant_row)
    nonrel = valid_row & ~relevant_row
    for j in rel_idx:
        dj = dist_row[j]
        r = 1 + int(np.sum(nonrel & (dist_row <= dj)))
        for g in rel_idx:
            if dist_row[g] < dj or (dist_row[g] == dj and g < j):
                r += 1
        out.append(r)
    return np.sort(np.asarray(out, dtype=np.int64))


# ---------------------------------------------------------------------------
# whole evaluations
# ---------------------------------------------------------------------------


@dataclass
class Reference:
    """What a reference evaluation returns (JSON-like fields + per-query detail)."""

    protocol: str
    distance: str
    num_queries: int
    num_skipped: int
    num_gallery: int
    embedding_dim: int
    metrics: dict
    query_index: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    first_rank: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    ranks: list = field(default_factory=list)

    def to_json(self) -> dict:
        return {
            "protocol": self.protocol,
            "distance": self.distance,
            "num_queries": self.num_queries,
            "num_skipped": self.num_skipped,
            "num_gallery": self.num_gallery,
            "embedding_dim": self.embedding_dim,
            "metrics": dict(self.metrics),
        }


def _rank_key(protocol):
    return "recall@{}" if protocol == "recall" else "rank{}"


def evaluate_reference(
    query,
    gallery,
    query_emb,
    gallery_emb,
    *,
    protocol="recall",
    distance="cosine",
    ks=(1, 5, 10),
    gap_frames=1,
    junk_labels=("-1",),
    ap="standard",
    dist=None,
) -> Reference:
    """Brute-force evaluation for every protocol (metrics as percentages).

    ``dist``: a ``(n_queries, n_gallery)`` distance matrix to rank by instead of the
    embeddings' (e.g. the re-ranked one of :func:`re_ranking`).
    """
    if protocol == "progressive":
        return progressive_reference(
            query, gallery, query_emb, gallery_emb, distance=distance, ks=ks
        )
    if dist is None:
        dist = distance_matrix(query_emb, gallery_emb, distance)
    valid, relevant = protocol_masks(
        protocol, query, gallery, junk_labels=junk_labels, gap_frames=gap_frames
    )
    max_rank = max(ks)
    cmcs, aps, inps, rrs, qidx, firsts, all_ranks, pmls = [], [], [], [], [], [], [], []
    skipped = 0
    for i in range(len(query)):
        if protocol == "reassociation" and valid[i].sum() < 2:
            skipped += 1
            continue
        raw_cmc = sorted_matches(dist[i], valid[i], relevant[i])
        res = market1501_query(raw_cmc, max_rank)
        if res is None:
            skipped += 1
            continue
        cmc, ap_std, inp = res
        cmcs.append(cmc)
        aps.append(matlab_trapezoid_ap(raw_cmc) if ap == "trapezoid" else ap_std)
        inps.append(inp)
        r1 = first_match_rank(raw_cmc)
        rrs.append(1.0 / r1)
        firsts.append(r1)
        qidx.append(i)
        all_ranks.append(relevant_ranks(raw_cmc))
        pmls.append(pml_query(raw_cmc, ks))
    n = len(cmcs)
    key = _rank_key(protocol)
    metrics = {}
    if n:
        cmc = np.mean(np.asarray(cmcs), axis=0)
        for k in ks:
            metrics[key.format(k)] = 100.0 * float(cmc[k - 1])
        if protocol != "reassociation":
            metrics["map"] = 100.0 * float(np.mean(aps))
            metrics["minp"] = 100.0 * float(np.mean(inps))
        metrics["mrr"] = 100.0 * float(np.mean(rrs))
        if protocol == "recall":  # the metric-learning families (PML's definitions)
            for name in pmls[0]:
                metrics[name] = 100.0 * float(np.mean([p[name] for p in pmls]))
    if protocol == "reid":
        junk = np.isin(gallery["label"].astype(str).to_numpy(), [str(j) for j in junk_labels])
        num_gallery = int((~junk).sum())
    else:
        num_gallery = len(gallery)
    return Reference(
        protocol,
        distance,
        n,
        skipped,
        num_gallery,
        int(np.asarray(gallery_emb).shape[1]),
        metrics,
        np.asarray(qidx, np.int64),
        np.asarray(firsts, np.int64),
        all_ranks,
    )


def slfir_weights(T: int) -> np.ndarray:
    """w_t = exp(1 - t/T) / e for t = 1..T."""
    return np.array([math.exp(1.0 - t / T) / math.e for t in range(1, T + 1)])


def progressive_reference(
    query, gallery, query_emb, gallery_emb, *, distance="cosine", ks=(1, 5, 10)
) -> Reference:
    """SLFIR m@A, m@B, wm@A, wm@B, acc@K per DESIGN.md, averaged over sketches."""
    dist = distance_matrix(query_emb, gallery_emb, distance)
    valid, relevant = protocol_masks("progressive", query, gallery)
    N = len(gallery)
    sketches = query["sketch"].astype(str).to_numpy()
    steps = query["step"].astype(np.int64).to_numpy()
    per = {"m@A": [], "m@B": [], "wm@A": [], "wm@B": []}
    accs = {k: [] for k in ks}
    skipped = 0
    for s in sorted(set(sketches.tolist())):
        rows = np.flatnonzero(sketches == s)
        rows = rows[np.argsort(steps[rows], kind="stable")]
        r = []
        for i in rows:
            raw_cmc = sorted_matches(dist[i], valid[i], relevant[i])
            if not raw_cmc.any():
                r = None
                break
            r.append(first_match_rank(raw_cmc))
        if r is None:
            skipped += 1
            continue
        r = np.asarray(r, dtype=np.float64)
        T = len(r)
        w = slfir_weights(T)
        a = (N - r) / (N - 1)
        b = 1.0 / r
        per["m@A"].append(a.mean())
        per["m@B"].append(b.mean())
        per["wm@A"].append((w * a).sum() / T)
        per["wm@B"].append((w * b).sum() / T)
        for k in ks:
            accs[k].append(float(r[-1] <= k))
    metrics = {name: 100.0 * float(np.mean(v)) for name, v in per.items()}
    for k in ks:
        metrics[f"acc@{k}"] = 100.0 * float(np.mean(accs[k]))
    return Reference(
        "progressive",
        distance,
        len(per["m@A"]),
        skipped,
        N,
        int(np.asarray(gallery_emb).shape[1]),
        metrics,
    )


# ---------------------------------------------------------------------------
# k-reciprocal re-ranking (Zhong et al., CVPR 2017)
# ---------------------------------------------------------------------------


def rerank_input_distances(query_emb, gallery_emb, distance: str):
    """``(q_g, q_q, g_g)``: what torchreid hands ``re_ranking`` -- squared L2
    (``euclidean``) or ``1 - cos`` (``cosine``, rows L2-normalised in float32 first, as
    rankwise prepares them) -- in float64 from the float32 rows."""
    q = np.asarray(query_emb, np.float32).astype(np.float64)
    g = np.asarray(gallery_emb, np.float32).astype(np.float64)
    if distance == "cosine":
        q = (q / np.sqrt((q**2).sum(axis=1, keepdims=True))).astype(np.float32).astype(np.float64)
        g = (g / np.sqrt((g**2).sum(axis=1, keepdims=True))).astype(np.float32).astype(np.float64)

    def d(a, b):
        if distance == "cosine":
            return 1.0 - np.einsum("ik,jk->ij", a, b)
        return ((a[:, None, :] - b[None, :, :]) ** 2).sum(axis=2)

    return d(q, g), d(q, q), d(g, g)


def re_ranking(q_g_dist, q_q_dist, g_g_dist, k1=20, k2=6, lambda_value=0.3, dtype=np.float64):
    """k-reciprocal re-ranking as the published ``re_ranking(q_g_dist, q_q_dist,
    g_g_dist, k1, k2, lambda_value)`` (torchreid ``torchreid/utils/rerank.py``, from
    zhunzhong07/person-re-ranking) computes it, re-written densely in float64.

    Its steps: the (Q+G) x (Q+G) input distances squared and divided by their column
    maxima, then transposed; each row's neighbours by ``argsort``; k-reciprocal sets
    R(i, k1) and their expansion by every R(c, round(k1/2)) sharing more than 2/3 of
    its members with R(i, k1); weights exp(-o) normalised per row; local query
    expansion (mean over the k2 nearest rows); Jaccard ``1 - m / (2 - m)`` with m the
    sum of element-wise minima; ``(1 - lambda) J + lambda o``.  Arithmetic only differs:
    float64 where it uses float32, and a stable argsort (exactly tied neighbours in row
    order) where it uses numpy's default quicksort.  ``dtype=np.float32`` does the
    arithmetic in float32 as the original does (benchmarks/bench_rerank.py), to see
    where that changes the numbers.
    """
    n_q = q_g_dist.shape[0]
    dist = np.block([[q_q_dist, q_g_dist], [q_g_dist.T, g_g_dist]]).astype(dtype) ** 2
    dist = (dist / dist.max(axis=0)).T  # column maxima, then transposed
    order = np.argsort(dist, axis=1, kind="stable")
    n = len(dist)

    def reciprocal(i, k):
        ahead = order[i, : k + 1]
        return ahead[np.array([i in order[j, : k + 1] for j in ahead], dtype=bool)]

    half = int(np.around(k1 / 2.0))
    v = np.zeros((n, n), dtype=dtype)
    for i in range(n):
        core = reciprocal(i, k1)
        members = [core]
        for c in core:
            extra = reciprocal(c, half)
            if len(np.intersect1d(extra, core)) > 2.0 / 3 * len(extra):
                members.append(extra)
        expanded = np.unique(np.concatenate(members))
        weight = np.exp(-dist[i, expanded])
        v[i, expanded] = weight / weight.sum()
    if k2 != 1:
        # neighbour rows added in ascending index (the original: in distance order):
        # the same sum, but two items with the same neighbours get bitwise-equal rows,
        # so ties exact in the definition stay ties (lambda = 0) in any row order
        v = np.stack([v[np.sort(order[i, :k2])].mean(axis=0) for i in range(n)])
    jaccard = np.empty((n_q, n), dtype=dtype)
    for i in range(n_q):
        # m accumulated over i's non-zero columns in ascending order, as the original
        # does: pure-Jaccard scores (lambda = 0) hold many mathematically equal values,
        # which stay equal only when every pair is summed in the same order
        shared = np.zeros(n, dtype=dtype)
        for k in np.flatnonzero(v[i]):
            shared += np.minimum(v[i, k], v[:, k])
        jaccard[i] = 1.0 - shared / (2.0 - shared)
    final = jaccard * (1 - lambda_value) + dist[:n_q] * lambda_value
    return final[:, n_q:]


def average_query_expansion(query_emb, gallery_emb, k=5, alpha=3.0):
    """fast-reid's ``aqe`` (one round), densely: every item of query + gallery becomes
    the mean of its k most cosine-similar items' raw rows, each weighted by
    ``cos^alpha``; ties in item order.  Rows normalised in float32 as rankwise prepares
    them; the result as float32 rows (as fast-reid's features are)."""
    n_q = len(query_emb)
    raw = np.concatenate([query_emb, gallery_emb]).astype(np.float32).astype(np.float64)
    unit = (raw / np.sqrt((raw**2).sum(axis=1, keepdims=True))).astype(np.float32)
    unit = unit.astype(np.float64)
    sim = np.einsum("ik,jk->ij", unit, unit)
    nearest = np.argsort(-sim, axis=1, kind="stable")[:, :k]
    weights = np.take_along_axis(sim, nearest, axis=1) ** alpha
    expanded = (raw[nearest] * weights[:, :, None]).mean(axis=1).astype(np.float32)
    return expanded[:n_q], expanded[n_q:]


def fastreid_jaccard_reranking(
    query_emb, gallery_emb, distance: str, k1=20, k2=6, lambda_value=0.3
):
    """fast-reid's re-ranked distance, densely in float64: its ``ReidEvaluator`` with
    ``TEST.RERANK.ENABLED`` computes ``build_dist(q, g, "jaccard", k1, k2) * (1 - lambda)
    + build_dist(q, g, TEST.METRIC) * lambda`` (``fastreid/utils/compute_dist.py``'s
    ``compute_jaccard_distance``, from OpenUnReID), re-written here from that code:

    - features: the rows, L2-normalised (float32, as rankwise prepares them) under
      ``cosine``; raw under ``euclidean``; N = Q + G items, queries first;
    - ``initial_rank``: each item's k1 nearest by squared L2 (faiss's exact search;
      here ties in item order), itself included -- k1 columns, so ``initial_rank[i,
      :k1 + 1]`` holds k1 items;
    - R(i, k) = members of ``initial_rank[i, :k + 1]`` whose own ``initial_rank[j, :k +
      1]`` holds i; E(i) = R(i, k1) and every R(c, round(k1/2)) sharing more than 2/3 of
      its members with it;
    - V(i, E(i)) = softmax(-squared L2 between the features) (unit rows: 2 (1 - cos));
    - V' = mean of V over ``initial_rank[i, :k2]`` (added in ascending index); m = sum
      of element-wise minima,
      J = 1 - m / (2 - m), negatives set to 0;
    - the original distance: ``1 - cos`` (cosine) or squared L2 (euclidean).
    """
    n_q = len(query_emb)
    x = np.concatenate([query_emb, gallery_emb]).astype(np.float32).astype(np.float64)
    # every sum in one fixed order (the canonical keys' and rankwise's): with lambda = 0
    # many re-ranked distances are mathematically equal, and stay equal bit for bit only
    # when both sides add the same terms in the same order
    d = np.zeros((len(x), len(x)))
    if distance == "cosine":
        x = (x / np.sqrt((x**2).sum(axis=1, keepdims=True))).astype(np.float32).astype(np.float64)
        for k in range(x.shape[1]):
            d += x[:, None, k] * x[None, :, k]
        d = 1.0 - d
        sq_l2 = 2.0 * d
    else:
        for k in range(x.shape[1]):
            d += (x[:, None, k] - x[None, :, k]) ** 2
        sq_l2 = d
    n = len(x)
    initial_rank = np.argsort(sq_l2, axis=1, kind="stable")[:, :k1]

    def reciprocal(i, k):
        ahead = initial_rank[i, : k + 1]
        back = initial_rank[ahead, : k + 1]
        return ahead[np.flatnonzero((back == i).any(axis=1))]

    half = int(np.around(k1 / 2))
    v = np.zeros((n, n))
    for i in range(n):
        core = reciprocal(i, k1)
        expansion = core
        for c in core:
            extra = reciprocal(c, half)
            if len(np.intersect1d(extra, core)) > 2 / 3 * len(extra):
                expansion = np.append(expansion, extra)
        expansion = np.unique(expansion)
        logits = -sq_l2[i, expansion]
        weight = np.exp(logits - logits.max())  # softmax, as torch computes it
        total = 0.0
        for w in weight:
            total += w
        v[i, expansion] = weight / total
    if k2 != 1:  # neighbour rows in ascending index, as in re_ranking above
        v = np.stack([v[np.sort(initial_rank[i, :k2])].mean(axis=0) for i in range(n)])
    jaccard = np.empty((n_q, n))
    for i in range(n_q):
        shared = np.zeros(n)
        for k in np.flatnonzero(v[i]):  # ascending columns, as the original
            shared += np.minimum(v[i, k], v[:, k])
        jaccard[i] = 1.0 - shared / (2.0 - shared)
    jaccard[jaccard < 0] = 0.0
    return (jaccard * (1 - lambda_value) + d[:n_q] * lambda_value)[:, n_q:]
