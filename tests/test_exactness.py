"""Near-ties closer than float32 BLAS can resolve are decided by the exact distance.

The tile engine compares float32 matmul values only when they are farther apart than
their error bound; these cases put a non-relevant item one float32 step behind or ahead
of a relevant one, where only the canonical (float64) distance gets the order right.
"""

import numpy as np
import pandas as pd
import pytest

import rankwise


def _tables(n_gallery):
    query = pd.DataFrame({"id": ["q"], "label": ["a"]})
    gallery = pd.DataFrame(
        {"id": [f"g{i}" for i in range(n_gallery)], "label": ["a"] + ["b"] * (n_gallery - 1)}
    )
    return query, gallery


@pytest.mark.parametrize("chunk", [1, 2, 64])
@pytest.mark.parametrize("steps, expected_rank", [(+1, 1), (-1, 2), (0, 2), (+3, 1), (-3, 2)])
def test_euclidean_one_float32_step_apart(steps, expected_rank, chunk):
    # 1-D: the relevant item at distance 1, a non-relevant one `steps` float32 ulps away.
    one = np.float32(1.0)
    other = one
    for _ in range(abs(steps)):
        other = np.nextafter(other, np.float32(np.inf if steps > 0 else -np.inf))
    query, gallery = _tables(2)
    qe = np.zeros((1, 1), np.float32)
    ge = np.array([[one], [other]], np.float32)
    result = rankwise.evaluate(
        query, gallery, qe, ge, distance="euclidean", ks=(1,), gallery_chunk=chunk
    )
    # Farther (steps > 0): the relevant item keeps rank 1; equal or closer: it is behind.
    assert result.per_query["first_rank"].tolist() == [expected_rank]


@pytest.mark.parametrize("chunk", [1, 3, 64])
def test_cosine_near_ties_follow_the_exact_angle(chunk):
    rng = np.random.default_rng(0)
    dim = 64
    q = rng.standard_normal(dim).astype(np.float32)
    rel = rng.standard_normal(dim).astype(np.float32)
    # Non-relevant items: the relevant vector with one coordinate nudged by a few ulps,
    # so their cosines differ from the relevant one's by ~1e-8 (below float32 matmul error).
    others = []
    for k in range(40):
        v = rel.copy()
        j = k % dim
        v[j] = np.nextafter(v[j], np.float32(np.inf if k % 2 else -np.inf))
        others.append(v)
    ge = np.vstack([rel, *others]).astype(np.float32)
    query, gallery = _tables(len(ge))
    result = rankwise.evaluate(
        query, gallery, q[None, :], ge, distance="cosine", ks=(1,), gallery_chunk=chunk
    )

    from rankwise.kernels import prepare_rows  # the rows as the engine normalises them

    qn = prepare_rows(q[None, :], True)[0].astype(np.float64)[0]
    gn = prepare_rows(ge, True)[0].astype(np.float64)
    exact = np.array(
        [-sum(float(a) * float(b) for a, b in zip(qn, row, strict=True)) for row in gn]
    )
    expected = 1 + int((exact[1:] <= exact[0]).sum())
    assert 1 < expected < len(ge)  # the case really mixes items ahead and behind
    assert result.per_query["first_rank"].tolist() == [expected]
