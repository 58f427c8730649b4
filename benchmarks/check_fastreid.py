"""rankwise's ``rerank`` variant ``fastreid`` against fast-reid's own evaluator code.

Not a benchmark of speed: a reference check that needs what the repository must not ship,
a fast-reid checkout (its code is read from there, never copied into rankwise) and faiss.

    pip install faiss-cpu            # torch comes with rankwise's [torch] extra
    git clone https://github.com/JDAI-CV/fast-reid /tmp/fast-reid
    python benchmarks/check_fastreid.py --fastreid /tmp/fast-reid [--seeds 6]

What runs on fast-reid's side is its ``ReidEvaluator.evaluate`` with ``TEST.RERANK.ENABLED``
(fastreid/evaluation/reid_evaluation.py), step for step: ``build_dist`` with the metric,
features L2-normalised for cosine, ``compute_jaccard_distance`` on the concatenated
features (fastreid/utils/compute_dist.py, unmodified), ``(1 - lambda) J + lambda d``, then
``evaluate_rank`` (fastreid/evaluation/rank.py, its Python ``eval_market1501``).  The one
departure: ``search_option=3`` (faiss ``IndexFlatL2`` on the CPU) instead of ``build_dist``'s
``0`` (faiss on the GPU); pass ``--search-option 0`` where a GPU and faiss-gpu exist.

On synthetic re-ID data (identities around random centres, ``--scales``: a larger scale
spreads the centres, so the data are easier; label-0 distractors; 1-4 cameras), for each
distance, (k1, k2, lambda) and seed it compares, query by query, the 1-based ranks of the
relevant gallery items (fast-reid's order: a stable argsort of its float32 distances) with
``rankwise.rank(..., rerank={..., "variant": "fastreid"})``, and fast-reid's Rank-1/5/10,
mAP and mINP with ``rankwise.evaluate``'s (equal ranks leave differences of ~1e-5 points:
fast-reid accumulates its CMC and AP in float32).

Exit status 0 when every query's ranks agree for every lambda > 0; 1 otherwise.  At
lambda = 0 (the Jaccard distance alone) many distances are mathematically equal, so
fast-reid's ranks depend on its argsort's order of ties and on float32 rounding, where
rankwise applies the README's tie rule to the float64 value: those rows are printed (with
the number of queries whose relevant items tie with a non-relevant one) and not judged.
"""

from __future__ import annotations

import argparse
import importlib
import shutil
import sys
import tempfile
import warnings
from pathlib import Path
from typing import NoReturn

import numpy as np

#: fast-reid's files the check runs, relative to the checkout (package, module name).
FASTREID_FILES = {
    "fastreid/utils/compute_dist.py": "compute_dist",
    "fastreid/utils/faiss_utils.py": "faiss_utils",
    "fastreid/evaluation/rank.py": "rank",
}
SETTINGS = ((20, 6, 0.3), (5, 3, 0.5), (10, 1, 0.2), (8, 4, 0.0))
METRICS = ("rank1", "rank5", "rank10", "map", "minp")


def fail(message: str) -> NoReturn:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def load_fastreid(root: Path):
    """fast-reid's three modules as one throw-away package (its ``fastreid`` package's
    ``__init__`` imports the whole framework: detectron-style config, cv2, ...)."""
    missing = [rel for rel in FASTREID_FILES if not (root / rel).is_file()]
    if missing:
        fail(f"{root / missing[0]}: not found; pass the root of a fast-reid checkout")
    package = Path(tempfile.mkdtemp(prefix="fastreid_check_")) / "fastreid_ref"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for rel, name in FASTREID_FILES.items():
        shutil.copyfile(root / rel, package / f"{name}.py")
    sys.path.insert(0, str(package.parent))
    try:
        compute_dist = importlib.import_module("fastreid_ref.compute_dist")
        rank = importlib.import_module("fastreid_ref.rank")
    except ImportError as error:
        fail(f"{error}; the check needs torch and faiss (pip install faiss-cpu)")
    return compute_dist, rank


def make_data(seed: int, scale: float):
    """Query/gallery features (float32), person ids and cameras of a small re-ID set."""
    rng = np.random.default_rng(seed)
    n_id, dim = int(rng.integers(15, 41)), int(rng.integers(16, 65))
    query, gallery = [], []
    for pid in range(1, n_id + 1):
        centre = rng.normal(size=dim) * scale
        for _ in range(int(rng.integers(2, 8))):
            gallery.append((centre + 0.7 * rng.normal(size=dim), pid, int(rng.integers(1, 5))))
        for _ in range(int(rng.integers(1, 3))):
            query.append((centre + 0.7 * rng.normal(size=dim), pid, int(rng.integers(1, 5))))
    for _ in range(int(rng.integers(10, 40))):  # distractors: label 0, never relevant
        gallery.append((rng.normal(size=dim) * 1.2, 0, int(rng.integers(1, 5))))
    gallery = [gallery[i] for i in rng.permutation(len(gallery))]

    def split(rows):
        feats = np.stack([r[0] for r in rows]).astype(np.float32)
        return feats, np.array([r[1] for r in rows]), np.array([r[2] for r in rows])

    return split(query), split(gallery)


def fastreid_distances(fr, qf, gf, metric, k1, k2, lam, search_option):
    """ReidEvaluator.evaluate's rerank branch (build_dist inlined for the search option)."""
    import torch
    import torch.nn.functional as F

    q, g = torch.from_numpy(qf), torch.from_numpy(gf)
    dist = fr.build_dist(q, g, metric)
    if metric == "cosine":
        q, g = F.normalize(q, dim=1), F.normalize(g, dim=1)
    jaccard = fr.compute_jaccard_distance(
        torch.cat((q, g), dim=0), k1=k1, k2=k2, search_option=search_option
    )
    return jaccard[: q.size(0), q.size(0) :] * (1 - lam) + dist * lam


def fastreid_ranks(dist, qp, gp, qc, gc):
    """Query row -> 1-based ranks of its relevant items in a stable argsort of ``dist``
    (eval_market1501's order), over the items it keeps (not same id and camera)."""
    ranks, tied = {}, 0
    for i in range(len(qp)):
        valid = ~((gp == qp[i]) & (gc == qc[i]))
        relevant = (gp == qp[i]) & valid
        if not relevant.any():
            continue
        kept = np.flatnonzero(valid)
        order = kept[np.argsort(dist[i, kept], kind="stable")]
        ranks[i] = np.flatnonzero(relevant[order]) + 1
        others = dist[i, valid & ~relevant]
        tied += bool(np.isin(dist[i, relevant], others).any())
    return ranks, tied


def rankwise_run(qf, gf, query, gallery, metric, rerank):
    import pandas as pd

    import rankwise

    def table(labels, cameras, prefix):
        ids = [f"{prefix}{i}" for i in range(len(labels))]
        return pd.DataFrame({"id": ids, "label": [str(p) for p in labels], "camera": cameras})

    qdf, gdf = table(*query, "q"), table(*gallery, "g")
    common = dict(protocol="reid", distance=metric, rerank=rerank)
    metrics = rankwise.evaluate(qdf, gdf, qf, gf, ks=(1, 5, 10), **common).metrics
    result = rankwise.rank(qdf, gdf, qf, gf, **common)
    ranks = {
        int(q): np.asarray(result.ranks[result.offsets[j] : result.offsets[j + 1]])
        for j, q in enumerate(result.query_index)
    }
    return metrics, ranks


def compare(fr, metric, k1, k2, lam, scale, seeds, search_option) -> tuple[int, int, int, list]:
    """(queries, queries whose ranks differ, queries with a tie, fast-reid's and rankwise's
    Rank-1/5/10, mAP, mINP per seed) for one setting."""
    compute_dist, rank = fr
    n_queries = n_differ = n_tied = 0
    theirs, ours = [], []
    for seed in range(seeds):
        (qf, qp, qc), (gf, gp, gc) = make_data(seed, scale)
        dist = fastreid_distances(compute_dist, qf, gf, metric, k1, k2, lam, search_option)
        cmc, ap, inp = rank.evaluate_rank(dist, qp, gp, qc, gc, use_cython=False)
        theirs.append([*(cmc[[0, 4, 9]] * 100), np.mean(ap) * 100, np.mean(inp) * 100])
        rerank = {"k1": k1, "k2": k2, "lambda": lam, "variant": "fastreid"}
        metrics, rw_ranks = rankwise_run(qf, gf, (qp, qc), (gp, gc), metric, rerank)
        ours.append([metrics[k] for k in METRICS])
        fr_ranks, tied = fastreid_ranks(dist, qp, gp, qc, gc)
        if set(fr_ranks) != set(rw_ranks):
            fail(f"the evaluated queries differ (seed {seed})")
        n_queries += len(fr_ranks)
        n_differ += sum(not np.array_equal(fr_ranks[i], rw_ranks[i]) for i in fr_ranks)
        n_tied += tied
    return n_queries, n_differ, n_tied, [np.array(theirs), np.array(ours)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fastreid", type=Path, required=True, help="fast-reid checkout")
    parser.add_argument("--seeds", type=int, default=6, help="data sets per scale")
    parser.add_argument("--scales", default="0.35,0.6,1.0", help="identity-centre scales")
    parser.add_argument("--search-option", type=int, default=3, help="3: faiss on the CPU")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    fr = load_fastreid(args.fastreid)
    print(
        "distance   k1 k2 lambda scale | queries  ranks differ  ties | fast-reid r1 / mAP / mINP "
        "| rankwise r1 / mAP / mINP | max |diff| (points)"
    )
    failed = False
    for metric in ("cosine", "euclidean"):
        for k1, k2, lam in SETTINGS:
            for scale in (float(s) for s in args.scales.split(",")):
                n, differ, tied, (theirs, ours) = compare(
                    fr, metric, k1, k2, lam, scale, args.seeds, args.search_option
                )
                gap = float(np.max(np.abs(theirs - ours)))
                a, b = theirs.mean(axis=0)[[0, 3, 4]], ours.mean(axis=0)[[0, 3, 4]]
                failed |= lam > 0 and differ > 0
                verdict = "not judged (ties)" if lam == 0 else "DIFFER" if differ else "ok"
                print(
                    f"{metric:9s} {k1:3d} {k2:2d} {lam:6.1f} {scale:5.2f} | {n:7d} {differ:13d} "
                    f"{tied:5d} | {a[0]:6.2f} {a[1]:6.2f} {a[2]:6.2f} "
                    f"| {b[0]:6.2f} {b[1]:6.2f} {b[2]:6.2f} | {gap:.2e} {verdict}",
                    flush=True,
                )
    print("FAILED: ranks differ at lambda > 0" if failed else "all lambda > 0 rows agree")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
