"""top_items agrees with a brute-force sort and with the engine's first ranks."""

import numpy as np
import pandas as pd

import rankwise
from rankwise.neighbours import top_items


def test_top_items_match_brute_force_and_ranks():
    rng = np.random.default_rng(5)
    n_q, n_g = 12, 90
    qlab, glab = rng.integers(0, 8, n_q), rng.integers(0, 8, n_g)
    qcam, gcam = rng.integers(0, 3, n_q), rng.integers(0, 3, n_g)
    query = pd.DataFrame({"id": [f"q{i}" for i in range(n_q)], "label": qlab, "camera": qcam})
    gallery = pd.DataFrame({"id": [f"g{i}" for i in range(n_g)], "label": glab, "camera": gcam})
    qe = rng.integers(-2, 3, (n_q, 4)).astype(np.float32)
    ge = rng.integers(-2, 3, (n_g, 4)).astype(np.float32)
    result = rankwise.evaluate(query, gallery, qe, ge, protocol="reid", distance="euclidean")
    evaluated = result.per_query["query_index"]
    tops = top_items(query, gallery, qe, ge, evaluated, protocol="reid", distance="euclidean",
                     k=5, chunk=7)
    for top, first in zip(tops, result.per_query["first_rank"]):
        q = top["query_index"]
        d = ((qe[q].astype(float) - ge.astype(float)) ** 2).sum(1)
        valid = ~((glab == qlab[q]) & (gcam == qcam[q]))
        rel = glab == qlab[q]
        idx = np.flatnonzero(valid)
        order = idx[np.lexsort((idx, rel[idx], d[idx]))][:5]
        np.testing.assert_array_equal(top["gallery_index"], order)
        np.testing.assert_array_equal(top["relevant"], rel[order])
        np.testing.assert_allclose(top["distance_key"], d[order])
        if first <= 5:  # the engine's first rank is where the first relevant item shows
            assert np.flatnonzero(top["relevant"])[0] + 1 == first
        else:
            assert not top["relevant"].any()
