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


def _spread_tables(rng, n_query, n_gallery, labels):
    query = pd.DataFrame(
        {"id": [f"q{i}" for i in range(n_query)], "label": rng.integers(0, labels, n_query)}
    )
    gallery = pd.DataFrame(
        {"id": [f"g{i}" for i in range(n_gallery)], "label": rng.integers(0, labels, n_gallery)}
    )
    return query.astype({"label": str}), gallery.astype({"label": str})


@pytest.mark.parametrize("scale", [3e-15, 7e-8, 1.0, 3e9, 9e16])
def test_euclidean_exact_across_the_allowed_norm_range(scale):
    # Quantised coordinates (exact ties and near-ties) times a non-power-of-two scale,
    # down to norms near 2^-50 and up to near 2^60: the float64 brute force's ranks.
    from reference import evaluate_reference

    rng = np.random.default_rng(3)
    query, gallery = _spread_tables(rng, 30, 400, 15)
    base_q = np.round(rng.standard_normal((30, 12)) * 4) / 4 + 0.25
    base_g = np.round(rng.standard_normal((400, 12)) * 4) / 4 + 0.25
    qe = (base_q * scale).astype(np.float32)
    ge = (base_g * scale).astype(np.float32)
    got = rankwise.evaluate(query, gallery, qe, ge, distance="euclidean", ks=(1,), gallery_chunk=64)
    # the float64 definition: squared distances summed coordinate by coordinate in order
    # (np.cumsum is sequential), no square root to merge neighbouring values into ties
    diff = qe.astype(np.float64)[:, None, :] - ge.astype(np.float64)[None, :, :]
    keys = np.cumsum(diff * diff, axis=2)[:, :, -1]
    ref = evaluate_reference(query, gallery, qe, ge, distance="euclidean", ks=(1,), dist=keys)
    assert got.per_query["first_rank"].tolist() == ref.first_rank.tolist()
    assert got.metrics["map"] == pytest.approx(ref.metrics["map"], abs=1e-9)


@pytest.mark.parametrize(
    "scale, row, role", [(1e-17, 7, "gallery"), (2e19, 7, "gallery"), (1e-17, 2, "query")]
)
def test_euclidean_norm_outside_the_float32_range_is_an_error(scale, row, role):
    # Products that underflow (or sums that overflow) float32 break the error bound:
    # without the check these rows were ranked silently wrong.  One row out of range is
    # enough; a zero row is fine (it multiplies exactly).
    rng = np.random.default_rng(4)
    query, gallery = _spread_tables(rng, 5, 20, 4)
    qe = rng.standard_normal((5, 8)).astype(np.float32)
    ge = rng.standard_normal((20, 8)).astype(np.float32)
    ge[3] = 0.0
    target = ge if role == "gallery" else qe
    target[row] *= np.float32(scale)
    message = rf"{role} embeddings row {row} \(0-based\) has norm"
    with pytest.raises(rankwise.RankwiseError, match=message):
        rankwise.evaluate(query, gallery, qe, ge, distance="euclidean", ks=(1,))
    # cosine normalises every row first: the same scales rank (a zero row has no cosine)
    ge[3] = 1.0
    result = rankwise.evaluate(query, gallery, qe, ge, distance="cosine", ks=(1,))
    assert result.num_queries + result.num_skipped == 5
