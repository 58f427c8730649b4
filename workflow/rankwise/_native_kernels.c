/* The rank path's kernels in C: prepare_rows (and row_norms), pair_keys, count_tile,
 * ranks_from_hist, and on AVX-512 or AVX2 + FMA CPUs count_fused (count_tile's counts
 * with the tile's products computed in the same pass, see its section).
 *
 * The numba kernels' steps (kernels.py: read their docstrings for the maths), with
 * AVX-512 and AVX2 paths where the CPU has them, compiled ahead of time by
 * rankwise/native.py and called through ctypes (which releases the GIL), so a ranking
 * process never imports numba.  Every decision is the same rigorous test as in
 * kernels.py, so the outputs are identical integers; the canonical key is the same
 * sequential float64 sum, bit for bit.  That needs IEEE float32/float64 arithmetic
 * exactly as written: build with -ffp-contract=off and without -ffast-math (native.py
 * does), so no multiply-add is fused and no sum reordered except in fast_key, whose
 * reordering its bound covers.  An optimiser can still break that (GCC 12's SLP
 * vectoriser dropped a float32 rounding from an interleaved prepare_rows, since
 * reverted): native.py caches a build only after it reproduces known answers.
 */
#include <math.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#define U32 (1.0 / 16777216.0)          /* 2^-24, float32 unit roundoff */
#define U64 (1.0 / 9007199254740992.0)  /* 2^-53, float64 unit roundoff */

typedef int64_t i64;

/* ------------------------------------------------------------------ prepare_rows */

/* A row's squared norm: the float64 sum of its squares in order (prepare_rows' and
 * row_norms' sq). */
#define SUM_SQ(NAME, T)                                   \
    static inline double NAME(const T *xi, i64 d)         \
    {                                                     \
        double s = 0.0;                                   \
        for (i64 k = 0; k < d; k++) {                     \
            double v = (double)xi[k];                     \
            s += v * v;                                   \
        }                                                 \
        return s;                                         \
    }

SUM_SQ(sum_sq_f32, float)
SUM_SQ(sum_sq_f64, double)

#define PREPARE(NAME, T, SUM)                                                         \
    i64 NAME(const T *x, i64 n, i64 d, int cosine, float *rows, double *sq, i64 *why) \
    {                                                                                 \
        for (i64 i = 0; i < n; i++) {                                                 \
            const T *xi = x + i * d;                                                  \
            double s = SUM(xi, d);                                                    \
            if (!isfinite(s)) {                                                       \
                *why = 1;                                                             \
                return i;                                                             \
            }                                                                         \
            float *ri = rows + i * d;                                                 \
            if (cosine) {                                                             \
                if (s == 0.0) {                                                       \
                    *why = 2;                                                         \
                    return i;                                                         \
                }                                                                     \
                double inv = 1.0 / sqrt(s);                                           \
                double t = 0.0;                                                       \
                for (i64 k = 0; k < d; k++) {                                         \
                    float r = (float)((double)xi[k] * inv);                           \
                    ri[k] = r;                                                        \
                    t += (double)r * (double)r;                                       \
                }                                                                     \
                sq[i] = t;                                                            \
            } else {                                                                  \
                for (i64 k = 0; k < d; k++) ri[k] = (float)xi[k];                     \
                sq[i] = s;                                                            \
            }                                                                         \
        }                                                                             \
        *why = 0;                                                                     \
        return -1;                                                                    \
    }

PREPARE(rw_prepare_rows_f32, float, sum_sq_f32)
PREPARE(rw_prepare_rows_f64, double, sum_sq_f64)

/* prepare_rows' euclidean squared norms (and its NaN/inf check) of float32 rows, which
 * it would copy unchanged: the caller ranks x itself, and no chunk is copied. */
i64 rw_row_norms_f32(const float *x, i64 n, i64 d, double *sq, i64 *why)
{
    i64 i = 0;
#if defined(__AVX512F__)
    /* eight rows at once, one per lane: each lane's sum is its row's sequential sum (the
     * same roundings in the same order), eight times the throughput of one latency-bound
     * chain; lane j gathers x[(i + j) d + k] */
    if (d > 0 && d <= INT32_MAX / 8) {
        const __m256i at = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                              _mm256_set1_epi32((int)d));
        for (; i + 8 <= n; i += 8) {
            const float *xi = x + i * d;
            __m512d s = _mm512_setzero_pd();
            for (i64 k = 0; k < d; k++) {
                __m512d v = _mm512_cvtps_pd(_mm256_i32gather_ps(xi + k, at, 4));
                s = _mm512_add_pd(s, _mm512_mul_pd(v, v));
            }
            double out[8];
            _mm512_storeu_pd(out, s);
            for (int j = 0; j < 8; j++) {
                if (!isfinite(out[j])) {
                    *why = 1;
                    return i + j;
                }
                sq[i + j] = out[j];
            }
        }
    }
#endif
    for (; i < n; i++) {
        double s = sum_sq_f32(x + i * d, d);
        if (!isfinite(s)) {
            *why = 1;
            return i;
        }
        sq[i] = s;
    }
    *why = 0;
    return -1;
}

/* ------------------------------------------------------------------ keys */

static inline double canonical_key(const float *q, const float *g, i64 d, int cosine)
{
    double s = 0.0;
    if (cosine) {
        for (i64 k = 0; k < d; k++) s += (double)q[k] * (double)g[k];
        return -s;
    }
    for (i64 k = 0; k < d; k++) {
        double t = (double)q[k] - (double)g[k];
        s += t * t;
    }
    return s;
}

/* The canonical key's terms summed in any order (interleaved partial sums, fused
 * multiply-adds: vectorised): within fast_bound of the canonical key, like
 * kernels._fast_key (the bound holds for every order, fused or not). */
static inline double fast_key(const float *q, const float *g, i64 d, int cosine)
{
    double s = 0.0;
    i64 k = 0;
#if defined(__AVX512F__)
    __m512d a0 = _mm512_setzero_pd(), a1 = _mm512_setzero_pd();
    __m512d a2 = _mm512_setzero_pd(), a3 = _mm512_setzero_pd();
    if (cosine) {
        for (; k + 32 <= d; k += 32) {
            __m512d x0, y0, x1, y1, x2, y2, x3, y3;
            x0 = _mm512_cvtps_pd(_mm256_loadu_ps(q + k));
            y0 = _mm512_cvtps_pd(_mm256_loadu_ps(g + k));
            x1 = _mm512_cvtps_pd(_mm256_loadu_ps(q + k + 8));
            y1 = _mm512_cvtps_pd(_mm256_loadu_ps(g + k + 8));
            x2 = _mm512_cvtps_pd(_mm256_loadu_ps(q + k + 16));
            y2 = _mm512_cvtps_pd(_mm256_loadu_ps(g + k + 16));
            x3 = _mm512_cvtps_pd(_mm256_loadu_ps(q + k + 24));
            y3 = _mm512_cvtps_pd(_mm256_loadu_ps(g + k + 24));
            a0 = _mm512_fmadd_pd(x0, y0, a0);
            a1 = _mm512_fmadd_pd(x1, y1, a1);
            a2 = _mm512_fmadd_pd(x2, y2, a2);
            a3 = _mm512_fmadd_pd(x3, y3, a3);
        }
        for (; k + 8 <= d; k += 8)
            a0 = _mm512_fmadd_pd(_mm512_cvtps_pd(_mm256_loadu_ps(q + k)),
                                 _mm512_cvtps_pd(_mm256_loadu_ps(g + k)), a0);
    } else {
        for (; k + 32 <= d; k += 32) {
            __m512d t0 = _mm512_sub_pd(_mm512_cvtps_pd(_mm256_loadu_ps(q + k)),
                                       _mm512_cvtps_pd(_mm256_loadu_ps(g + k)));
            __m512d t1 = _mm512_sub_pd(_mm512_cvtps_pd(_mm256_loadu_ps(q + k + 8)),
                                       _mm512_cvtps_pd(_mm256_loadu_ps(g + k + 8)));
            __m512d t2 = _mm512_sub_pd(_mm512_cvtps_pd(_mm256_loadu_ps(q + k + 16)),
                                       _mm512_cvtps_pd(_mm256_loadu_ps(g + k + 16)));
            __m512d t3 = _mm512_sub_pd(_mm512_cvtps_pd(_mm256_loadu_ps(q + k + 24)),
                                       _mm512_cvtps_pd(_mm256_loadu_ps(g + k + 24)));
            a0 = _mm512_fmadd_pd(t0, t0, a0);
            a1 = _mm512_fmadd_pd(t1, t1, a1);
            a2 = _mm512_fmadd_pd(t2, t2, a2);
            a3 = _mm512_fmadd_pd(t3, t3, a3);
        }
        for (; k + 8 <= d; k += 8) {
            __m512d t = _mm512_sub_pd(_mm512_cvtps_pd(_mm256_loadu_ps(q + k)),
                                      _mm512_cvtps_pd(_mm256_loadu_ps(g + k)));
            a0 = _mm512_fmadd_pd(t, t, a0);
        }
    }
    s = _mm512_reduce_add_pd(_mm512_add_pd(_mm512_add_pd(a0, a1), _mm512_add_pd(a2, a3)));
#else
    double acc[8] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
    if (cosine) {
        for (; k + 8 <= d; k += 8)
            for (int l = 0; l < 8; l++) acc[l] += (double)q[k + l] * (double)g[k + l];
    } else {
        for (; k + 8 <= d; k += 8)
            for (int l = 0; l < 8; l++) {
                double t = (double)q[k + l] - (double)g[k + l];
                acc[l] += t * t;
            }
    }
    s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
#endif
    for (; k < d; k++) {
        if (cosine) {
            s += (double)q[k] * (double)g[k];
        } else {
            double t = (double)q[k] - (double)g[k];
            s += t * t;
        }
    }
    return cosine ? -s : s;
}

static inline double fast_bound(double key, double qn, double gn, i64 dim, int cosine)
{
    if (cosine) return 4.0 * (double)(dim + 2) * U64 * qn * gn;
    return 4.0 * (double)(dim + 2) * U64 * fabs(key);
}

/* Four pairs' canonical keys at once: four independent sequential sums, each in the
 * canonical order (bit-identical to canonical_key), interleaved so that the adds of
 * one pair do not wait on its previous add (latency-bound alone). */
static inline void canonical_keys4(const float *const q[4], const float *const g[4], i64 d,
                                   int cosine, double out[4])
{
    double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
    if (cosine) {
        for (i64 k = 0; k < d; k++) {
            s0 += (double)q[0][k] * (double)g[0][k];
            s1 += (double)q[1][k] * (double)g[1][k];
            s2 += (double)q[2][k] * (double)g[2][k];
            s3 += (double)q[3][k] * (double)g[3][k];
        }
        out[0] = -s0, out[1] = -s1, out[2] = -s2, out[3] = -s3;
        return;
    }
    for (i64 k = 0; k < d; k++) {
        double t0 = (double)q[0][k] - (double)g[0][k];
        double t1 = (double)q[1][k] - (double)g[1][k];
        double t2 = (double)q[2][k] - (double)g[2][k];
        double t3 = (double)q[3][k] - (double)g[3][k];
        s0 += t0 * t0;
        s1 += t1 * t1;
        s2 += t2 * t2;
        s3 += t3 * t3;
    }
    out[0] = s0, out[1] = s1, out[2] = s2, out[3] = s3;
}

void rw_pair_keys(const float *qrows, const float *grows, const i64 *pq, const i64 *pg, i64 n,
                  i64 d, int cosine, double *out)
{
    i64 i = 0;
    for (; i + 4 <= n; i += 4) {
        const float *q[4] = {qrows + pq[i] * d, qrows + pq[i + 1] * d, qrows + pq[i + 2] * d,
                             qrows + pq[i + 3] * d};
        const float *g[4] = {grows + pg[i] * d, grows + pg[i + 1] * d, grows + pg[i + 2] * d,
                             grows + pg[i + 3] * d};
        canonical_keys4(q, g, d, cosine, out + i);
    }
    for (; i < n; i++) out[i] = canonical_key(qrows + pq[i] * d, grows + pg[i] * d, d, cosine);
}

/* fast_key of each pair (for the tests: it must lie within fast_bound of pair_keys) */
void rw_fast_keys(const float *qrows, const float *grows, const i64 *pq, const i64 *pg, i64 n,
                  i64 d, int cosine, double *out)
{
    for (i64 i = 0; i < n; i++) out[i] = fast_key(qrows + pq[i] * d, grows + pg[i] * d, d, cosine);
}

/* ------------------------------------------------------------------ count_tile */

static inline i64 count_less_d(const double *thr, i64 lo, i64 hi, double x)
{
    if (hi - lo <= 64) {
        i64 n = 0;
        for (i64 k = lo; k < hi; k++) n += thr[k] < x;
        return n;
    }
    i64 a = lo, b = hi;
    while (a < b) {
        i64 m = (a + b) >> 1;
        if (thr[m] < x)
            a = m + 1;
        else
            b = m;
    }
    return a - lo;
}

static inline i64 count_less_f(const float *thr, i64 r, float x)
{
    i64 a = 0, b = r;
    while (a < b) {
        i64 m = (a + b) >> 1;
        if (thr[m] < x)
            a = m + 1;
        else
            b = m;
    }
    return a;
}

static inline double key_bound(double qn, double gn, double bound, int cosine)
{
    if (cosine) return bound * qn * gn;
    double e = qn + gn;
    return 2.0 * bound * (qn * gn + 0x1p-20 * e * e);
}

static void float32_bounds(const double *thr, i64 lo, i64 hi, double h0, double scale,
                           double margin, float *aup, float *bdn)
{
    i64 r = hi - lo;
    for (i64 p = 0; p < r; p++) {
        double h = (thr[lo + p] - h0) * scale;
        double m = margin + 4.0 * U32 * fabs(h);
        float a = (float)(h + m);
        if ((double)a < h + m) a = nextafterf(a, INFINITY);
        float b = (float)(h - m);
        if ((double)b > h - m) b = nextafterf(b, -INFINITY);
        aup[p] = a;
        bdn[p] = b;
    }
    for (i64 p = 1; p < r; p++)
        if (aup[p] < aup[p - 1]) aup[p] = aup[p - 1];
    for (i64 p = r - 2; p >= 0; p--)
        if (bdn[p] > bdn[p + 1]) bdn[p] = bdn[p + 1];
    bdn[r] = INFINITY;
}

#if !defined(__AVX512F__) && !defined(__AVX2__)
/* Bit k of the result: off[k] - s[k] <= cut (float32; false for a NaN off), k < 64. */
static inline uint64_t ahead_word(const float *off, const float *s, float cut)
{
    uint64_t m = 0;
    for (int k = 0; k < 64; k++) m |= (uint64_t)(off[k] - s[k] <= cut) << k;
    return m;
}
#endif

#if defined(__AVX2__) && !defined(__AVX512F__)
/* Row m of the table: the lanes whose bit is set in m, in order, then zeros: the
 * permutation that packs an 8-lane register's selected lanes to its front (AVX2 has no
 * compressing instruction).  Filled when the library is loaded. */
static uint8_t pack_lanes[256][8];

__attribute__((constructor)) static void fill_pack_lanes(void)
{
    for (int m = 0; m < 256; m++) {
        int n = 0;
        for (int l = 0; l < 8; l++)
            if (m >> l & 1) pack_lanes[m][n++] = (uint8_t)l;
        while (n < 8) pack_lanes[m][n++] = 0;
    }
}
#endif

/* compact_row's items j0 .. c one at a time (the SIMD paths' last, partial group):
 * appended to vv / jj from n on; returns the new n. */
static inline i64 compact_tail(const float *off, const float *srow, i64 j0, i64 c, float cut,
                               const i64 *glab, const i64 *gid, i64 ql, i64 qi,
                               int exclude_self, float *vv, int32_t *jj, i64 n)
{
    for (i64 j = j0; j < c; j++) {
        float v = off[j] - srow[j];
        vv[n] = v;
        jj[n] = (int32_t)j;
        n += (v <= cut) & (glab[j] != ql) & !(exclude_self && gid[j] == qi);
    }
    return n;
}

/* The items of one row at or ahead of the deepest threshold (float32 proxy
 * v = off - s <= cut), without the query's own label (relevant items, same-camera junk)
 * and, with exclude_self, its own id: their proxies into vv and indices into jj, in
 * gallery order; returns how many.  vv and jj have room for 16 more than c; masks for
 * (c + 63) / 64 words, spad for 64 floats (zeros). */
static i64 compact_row(const float *off, const float *srow, i64 c, float cut, const i64 *glab,
                       const i64 *gid, i64 ql, i64 qi, int exclude_self, uint64_t *masks,
                       float *spad, float *vv, int32_t *jj)
{
    i64 n = 0;
#if defined(__AVX512F__)
    /* 16 items a step: compare, drop own label / id, compress into registers (a
     * compressing store is slow on some CPUs) and store all 16 lanes */
    __m512 cv = _mm512_set1_ps(cut);
    __m512i lv = _mm512_set1_epi64(ql), iv = _mm512_set1_epi64(qi);
    __m512i idx = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i sixteen = _mm512_set1_epi32(16);
    i64 base = 0;
    for (; base + 16 <= c; base += 16, idx = _mm512_add_epi32(idx, sixteen)) {
        __m512 v = _mm512_sub_ps(_mm512_loadu_ps(off + base), _mm512_loadu_ps(srow + base));
        /* no branch on m: at typical densities it would mispredict a third of the time */
        __mmask16 m = _mm512_cmp_ps_mask(v, cv, _CMP_LE_OQ);
        __mmask16 own = (__mmask16)(_mm512_cmpeq_epi64_mask(_mm512_loadu_si512(glab + base), lv) |
                                    (_mm512_cmpeq_epi64_mask(_mm512_loadu_si512(glab + base + 8), lv) << 8));
        if (exclude_self)
            own |= (__mmask16)(_mm512_cmpeq_epi64_mask(_mm512_loadu_si512(gid + base), iv) |
                               (_mm512_cmpeq_epi64_mask(_mm512_loadu_si512(gid + base + 8), iv) << 8));
        m &= (__mmask16)~own;
        _mm512_storeu_ps(vv + n, _mm512_maskz_compress_ps(m, v));
        _mm512_storeu_si512(jj + n, _mm512_maskz_compress_epi32(m, idx));
        n += __builtin_popcount((unsigned)m);
    }
    n = compact_tail(off, srow, base, c, cut, glab, gid, ql, qi, exclude_self, vv, jj, n);
    (void)masks;
    (void)spad;
#else
    /* first the items ahead as bit masks, 64 a word (bit k of word w: item 64 w + k),
     * and how many */
    i64 nw = (c + 63) >> 6, ahead = 0;
#if defined(__AVX2__)
    uint8_t *gm = (uint8_t *)masks; /* a byte per 8 items: the same bits */
    __m256 cv = _mm256_set1_ps(cut);
    i64 ng = c >> 3;
    for (i64 g = 0; g < ng; g++) {
        __m256 v = _mm256_sub_ps(_mm256_loadu_ps(off + 8 * g), _mm256_loadu_ps(srow + 8 * g));
        unsigned m = (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(v, cv, _CMP_LE_OQ));
        gm[g] = (uint8_t)m;
        ahead += __builtin_popcount(m);
    }
    for (i64 g = ng; g < 8 * nw; g++) gm[g] = 0;
    if (c > 8 * ng) { /* the last, partial group */
        unsigned m = 0;
        for (i64 j = 8 * ng; j < c; j++) m |= (unsigned)(off[j] - srow[j] <= cut) << (j - 8 * ng);
        gm[ng] = (uint8_t)m;
        ahead += __builtin_popcount(m);
    }
    (void)spad;
#else
    for (i64 w = 0; w < nw; w++) {
        i64 base = w << 6;
        uint64_t m;
        if (base + 64 <= c) {
            m = ahead_word(off + base, srow + base, cut);
        } else { /* the last, partial word: the padding's off is NaN */
            for (i64 k = 0; k < c - base; k++) spad[k] = srow[base + k];
            m = ahead_word(off + base, spad, cut);
        }
        masks[w] = m;
        ahead += __builtin_popcountll(m);
    }
#endif
    if (ahead == 0) return 0;
#if defined(__AVX2__)
    if (8 * ahead >= c) {
        /* dense (one item in 8 or more): 8 items a step, as AVX-512 does, without a
         * branch per item: drop own label / id, pack the kept lanes to the front with a
         * permutation from pack_lanes, store all 8 */
        __m256i lv = _mm256_set1_epi64x(ql), iv = _mm256_set1_epi64x(qi);
        __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        const __m256i eight = _mm256_set1_epi32(8);
        for (i64 g = 0; g < ng; g++, idx = _mm256_add_epi32(idx, eight)) {
            i64 base = 8 * g;
            __m256 v = _mm256_sub_ps(_mm256_loadu_ps(off + base), _mm256_loadu_ps(srow + base));
#define RW_EQ4(x, at) \
    (unsigned)_mm256_movemask_pd(_mm256_castsi256_pd( \
        _mm256_cmpeq_epi64(_mm256_loadu_si256((const __m256i *)(at)), x)))
            unsigned own = RW_EQ4(lv, glab + base) | RW_EQ4(lv, glab + base + 4) << 4;
            if (exclude_self) own |= RW_EQ4(iv, gid + base) | RW_EQ4(iv, gid + base + 4) << 4;
#undef RW_EQ4
            unsigned m = gm[g] & ~own;
            __m256i perm =
                _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)pack_lanes[m]));
            _mm256_storeu_ps(vv + n, _mm256_permutevar8x32_ps(v, perm));
            _mm256_storeu_si256((__m256i *)(jj + n), _mm256_permutevar8x32_epi32(idx, perm));
            n += __builtin_popcount(m);
        }
        /* the last, partial group */
        return compact_tail(off, srow, 8 * ng, c, cut, glab, gid, ql, qi, exclude_self, vv,
                            jj, n);
    }
#endif
    /* sparse: item by item, from the masks */
    for (i64 w = 0; w < nw; w++) {
        uint64_t m = masks[w];
        while (m != 0) {
            i64 j = (w << 6) + __builtin_ctzll(m);
            vv[n] = off[j] - srow[j];
            jj[n] = (int32_t)j;
            n += (glab[j] != ql) & !(exclude_self && gid[j] == qi);
            m &= m - 1;
        }
    }
#endif
    return n;
}

/* A chunk's per-item values shared by its rows: norms gn, the float32 proxy offsets off
 * (junk items NaN: never ahead), and the largest norm and half squared norm. */
static void chunk_setup(const double *gsq, const uint8_t *gjunk, i64 c, int cosine, double *gn,
                        float *off, double *gmax, double *hmax)
{
    double gm = 0.0;
    float hm = -INFINITY;
    for (i64 j = 0; j < c; j++) {
        gn[j] = sqrt(gsq[j]);
        if (gn[j] > gm || j == 0) gm = gn[j];
        float h = (float)(gsq[j] / 2.0);
        if (h > hm || j == 0) hm = h;
        off[j] = gjunk[j] ? NAN : (cosine ? 0.0f : h);
    }
    *gmax = gm;
    *hmax = (double)hm;
}

/* A query row's float32 bounds aup[0 .. r), bdn[0 .. r] of its thresholds thr[lo .. hi). */
static void row_bounds(const double *thr, i64 lo, i64 hi, double qsq_i, double gmax,
                       double hmax, int cosine, double bound, float *aup, float *bdn)
{
    double qn = sqrt(qsq_i);
    if (cosine) {
        float32_bounds(thr, lo, hi, 0.0, 1.0, key_bound(qn, gmax, bound, 1), aup, bdn);
    } else {
        double margin = key_bound(qn, gmax, bound, 0) / 2.0 + 4.0 * U32 * (hmax + qn * gmax);
        float32_bounds(thr, lo, hi, qsq_i, 0.5, margin, aup, bdn);
    }
}

#if defined(__AVX512F__)
/* Entry idx (0 .. 63) of the 64 floats in t[0..3] for each lane (t[2], t[3] only when
 * wide). */
static inline __m512 lookup64(__m512i idx, const __m512 t[4], int wide)
{
    __m512 x = _mm512_permutex2var_ps(t[0], idx, t[1]);
    if (!wide) return x;
    __mmask16 up = _mm512_test_epi32_mask(idx, _mm512_set1_epi32(32));
    return _mm512_mask_mov_ps(x, up, _mm512_permutex2var_ps(t[2], idx, t[3]));
}

/* count_row's settling for r < 64 thresholds, 16 items a step: p = the number of
 * upper bounds below the proxy, by a branchless binary search over the bounds held in
 * registers (+inf past r); settled items counted into four interleaved histograms (no
 * chain of increments of one counter), open items' indices jj compressed into opn (room
 * for n + 16).  Adds the settled counts to hist[0 .. r); returns how many are open. */
static i64 settle_row(const float *vv, const int32_t *jj, i64 n, const float *aup,
                      const float *bdn, i64 r, i64 *hist, int32_t *opn)
{
    const __m512 inf = _mm512_set1_ps(INFINITY);
    __m512 a[4], b[4];
    for (int h = 0; h < 4; h++) {
        i64 s = 16 * h;
        i64 na = r - s < 0 ? 0 : (r - s > 16 ? 16 : r - s);
        i64 nb = r + 1 - s < 0 ? 0 : (r + 1 - s > 16 ? 16 : r + 1 - s);
        a[h] = _mm512_mask_loadu_ps(inf, (__mmask16)((1u << na) - 1), aup + s);
        b[h] = _mm512_mask_loadu_ps(inf, (__mmask16)((1u << nb) - 1), bdn + s);
    }
    int wide = r >= 32;
    int32_t cnt[4][64];
    for (int h = 0; h < 4; h++)
        for (i64 p = 0; p <= r; p++) cnt[h][p] = 0;
    int32_t pl[16];
    const __m512i one = _mm512_set1_epi32(1);
    i64 n_open = 0;
    for (i64 t = 0; t < n; t += 16) {
        __mmask16 live = n - t >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - t)) - 1);
        __m512 v = _mm512_maskz_loadu_ps(live, vv + t);
        __m512i p = _mm512_setzero_si512();
        for (int s = wide ? 32 : 16; s >= 1; s >>= 1) {
            __m512i cand = _mm512_add_epi32(p, _mm512_set1_epi32(s));
            __m512 below = lookup64(_mm512_sub_epi32(cand, one), a, wide);
            p = _mm512_mask_mov_epi32(p, _mm512_cmp_ps_mask(below, v, _CMP_LT_OQ), cand);
        }
        __mmask16 settled = _mm512_cmp_ps_mask(v, lookup64(p, b, wide), _CMP_LE_OQ) & live;
        __mmask16 open = live & (__mmask16)~settled;
        _mm512_storeu_si512(opn + n_open,
                            _mm512_maskz_compress_epi32(open, _mm512_maskz_loadu_epi32(live, jj + t)));
        n_open += __builtin_popcount((unsigned)open);
        _mm512_storeu_si512(pl, p);
        for (int l = 0; l < 16; l++) cnt[l & 3][pl[l]] += (settled >> l) & 1;
    }
    for (i64 p = 0; p < r; p++) hist[p] += cnt[0][p] + cnt[1][p] + cnt[2][p] + cnt[3][p];
    return n_open;
}
#endif

#if defined(__AVX2__) && !defined(__AVX512F__)
/* Rows with fewer thresholds than this are settled by a binary search in registers,
 * over their bounds laid out in RW_LAY floats. */
#define RW_SEARCH 32
#define RW_LAY 64

/* A row's bounds laid out for that search (r < RW_SEARCH), +inf past r: lay[0 .. 16)
 * aup[0, 2, .., 30], lay[16 .. 24) aup[1, 5, .., 29], lay[24 .. 28) aup[3, 11, 19, 27],
 * lay[28 .. 31) aup[7], aup[23], aup[15]; lay[32 .. 64) bdn[0 .. 32). */
static void search_layout(const float *aup, const float *bdn, i64 r, float *lay)
{
    float a[32];
    for (int q = 0; q < 32; q++) {
        a[q] = q < r ? aup[q] : INFINITY;
        lay[32 + q] = q <= r ? bdn[q] : INFINITY;
    }
    for (int k = 0; k < 16; k++) lay[k] = a[2 * k];
    for (int k = 0; k < 8; k++) lay[16 + k] = a[4 * k + 1];
    for (int k = 0; k < 4; k++) lay[24 + k] = a[8 * k + 3];
    lay[28] = a[7];
    lay[29] = a[23];
    lay[30] = a[15];
    lay[31] = INFINITY;
}
#define RW_LAYOUT(aup, bdn, r, lay) \
    do {                             \
        if ((r) < RW_SEARCH) search_layout(aup, bdn, r, lay); \
    } while (0)

/* Lane-wise y where bit `bit` of k is set, else x (a blend on that bit moved to the
 * sign). */
static inline __m256 pick(__m256 x, __m256 y, __m256i k, int bit)
{
    return _mm256_blendv_ps(x, y, _mm256_castsi256_ps(_mm256_slli_epi32(k, 31 - bit)));
}

/* p += s where c < v (lane-wise) */
static inline __m256i step(__m256i p, __m256 c, __m256 v, int s)
{
    __m256i t = _mm256_castps_si256(_mm256_cmp_ps(c, v, _CMP_LT_OQ));
    return _mm256_add_epi32(p, _mm256_and_si256(t, _mm256_set1_epi32(s)));
}

/* For 8 proxies v: p = the number of upper bounds below each (a branchless binary
 * search, 16 + 8 + 4 + 2 + 1, each step's candidates one broadcast or permutation of
 * the layout), and in *bp the lower bound bdn[p]. */
static inline __m256i place8(__m256 v, const float *lay, __m256 *bp)
{
    __m256i p = step(_mm256_setzero_si256(), _mm256_broadcast_ss(lay + 30), v, 16);
    p = step(p, pick(_mm256_broadcast_ss(lay + 28), _mm256_broadcast_ss(lay + 29), p, 4), v, 8);
    p = step(p, _mm256_permutevar8x32_ps(_mm256_loadu_ps(lay + 24), _mm256_srli_epi32(p, 3)), v, 4);
    p = step(p, _mm256_permutevar8x32_ps(_mm256_loadu_ps(lay + 16), _mm256_srli_epi32(p, 2)), v, 2);
    __m256i h = _mm256_srli_epi32(p, 1);
    p = step(p, pick(_mm256_permutevar8x32_ps(_mm256_loadu_ps(lay), h),
                     _mm256_permutevar8x32_ps(_mm256_loadu_ps(lay + 8), h), p, 4), v, 1);
    const float *b = lay + 32;
    __m256 lo = pick(_mm256_permutevar8x32_ps(_mm256_loadu_ps(b), p),
                     _mm256_permutevar8x32_ps(_mm256_loadu_ps(b + 8), p), p, 3);
    __m256 hi = pick(_mm256_permutevar8x32_ps(_mm256_loadu_ps(b + 16), p),
                     _mm256_permutevar8x32_ps(_mm256_loadu_ps(b + 24), p), p, 3);
    *bp = pick(lo, hi, p, 4);
    return p;
}

/* count_row's settling for r <= 64 thresholds, 16 items a step (AVX2 has no 16-lane
 * permutation, so no AVX-512-style search of 64 bounds in registers): with r <
 * RW_SEARCH, each item's place p by place8 over the row's layout `lay`, settled when
 * v <= bdn[p]; else ca = the number of upper bounds below v (its place) and cb = the
 * number of lower bounds below it, by a scan of the bounds with the items held in
 * registers: since bdn[q] <= aup[q] and both are non-decreasing, cb >= ca, and
 * v <= bdn[ca] (settled) exactly when cb == ca.  Adds the settled items to hist[0 .. r)
 * (those with p = r are ahead of none), open items' indices jj to opn; returns how many
 * are open. */
static i64 settle_row(const float *vv, const int32_t *jj, i64 n, const float *aup,
                      const float *bdn, const float *lay, i64 r, i64 *hist, int32_t *opn)
{
    /* settled items counted by place into cnt, lane l into cnt[l & 3] (most items share
     * the last places: four counters a place, not one chain of increments); open and
     * absent lanes (past n) into cnt[.][r], not added: every lane is counted, without a
     * branch per lane */
    int32_t cnt[4][65], pl[16];
    for (int h = 0; h < 4; h++)
        for (i64 p = 0; p <= r; p++) cnt[h][p] = 0;
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), rv = _mm256_set1_epi32((int)r);
    i64 n_open = 0;
    for (i64 t = 0; t < n; t += 16) {
        __m256i in0 = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n - t)), lane);
        __m256i in1 = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n - t - 8)), lane);
        __m256 v0 = _mm256_maskload_ps(vv + t, in0), v1 = _mm256_maskload_ps(vv + t + 8, in1);
        __m256i a0, a1, s0, s1; /* places; settled lanes (all bits set) */
        if (r < RW_SEARCH) {
            __m256 b0, b1;
            a0 = place8(v0, lay, &b0);
            a1 = place8(v1, lay, &b1);
            s0 = _mm256_castps_si256(_mm256_cmp_ps(v0, b0, _CMP_LE_OQ));
            s1 = _mm256_castps_si256(_mm256_cmp_ps(v1, b1, _CMP_LE_OQ));
        } else {
            a0 = a1 = _mm256_setzero_si256();
            __m256i b0 = a0, b1 = a0;
            for (i64 q = 0; q < r; q++) { /* a true comparison is -1 in every bit */
                __m256 x = _mm256_broadcast_ss(aup + q), y = _mm256_broadcast_ss(bdn + q);
                a0 = _mm256_sub_epi32(a0, _mm256_castps_si256(_mm256_cmp_ps(x, v0, _CMP_LT_OQ)));
                a1 = _mm256_sub_epi32(a1, _mm256_castps_si256(_mm256_cmp_ps(x, v1, _CMP_LT_OQ)));
                b0 = _mm256_sub_epi32(b0, _mm256_castps_si256(_mm256_cmp_ps(y, v0, _CMP_LT_OQ)));
                b1 = _mm256_sub_epi32(b1, _mm256_castps_si256(_mm256_cmp_ps(y, v1, _CMP_LT_OQ)));
            }
            s0 = _mm256_cmpeq_epi32(a0, b0);
            s1 = _mm256_cmpeq_epi32(a1, b1);
        }
        s0 = _mm256_and_si256(s0, in0);
        s1 = _mm256_and_si256(s1, in1);
        _mm256_storeu_si256((__m256i *)pl, _mm256_blendv_epi8(rv, a0, s0));
        _mm256_storeu_si256((__m256i *)(pl + 8), _mm256_blendv_epi8(rv, a1, s1));
        for (int l = 0; l < 16; l++) cnt[l & 3][pl[l]] += 1;
        unsigned live = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(in0)) |
                        (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(in1)) << 8;
        unsigned settled = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(s0)) |
                           (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(s1)) << 8;
        for (unsigned open = live & ~settled; open != 0; open &= open - 1)
            opn[n_open++] = jj[t + __builtin_ctz(open)];
    }
    for (i64 p = 0; p < r; p++) hist[p] += cnt[0][p] + cnt[1][p] + cnt[2][p] + cnt[3][p];
    return n_open;
}
#endif

#if !defined(RW_LAYOUT) /* only the AVX2 settling searches a layout */
#define RW_LAY 1
#define RW_LAYOUT(aup, bdn, r, lay) ((void)(lay))
#endif

/* Scratch arrays of count_row, for rows of up to `c` items and `rmax` thresholds. */
struct row_scratch {
    float *vv;
    int32_t *jj, *pos;
    i64 *row_hist;
    uint64_t *masks;
    float *spad;
};

/* Items too close to call from their row's bounds, queued by count_row and decided by
 * count_open: the row i of the tile, the chunk's item j and their float32 product.  A
 * queue holds RW_OPEN of them plus one row's items (count_row runs count_open first
 * when it is fuller), and what count_open needs to decide them. */
#define RW_OPEN 4096
struct open_item {
    int32_t i, j;
    float s;
};
struct open_queue {
    struct open_item *it;
    i64 n;
    const float *qrows, *grows;
    const double *qsq, *gsq, *gn, *thr;
    const i64 *toff;
    i64 dim;
    int cosine;
    double bound;
    i64 *hist;
};

/* Decide the queued items and empty the queue: each one's place among its row's
 * thresholds from its product when that is farther than the products' bound from every
 * threshold, else from a float64 key in any order, else from the canonical key; adds 1
 * to hist there.  Queued across rows, so the rows each key needs are prefetched a few
 * items ahead (a key reads two 4 D-byte rows, most often from memory). */
static void count_open(struct open_queue *q)
{
    const struct open_item *it = q->it;
    const float *qrows = q->qrows, *grows = q->grows;
    const double *qsq = q->qsq, *gsq = q->gsq, *gn = q->gn, *thr = q->thr;
    const i64 *toff = q->toff;
    i64 n = q->n, dim = q->dim, *hist = q->hist;
    int cosine = q->cosine;
    double bound = q->bound;
    for (i64 u = 0; u < n; u++) {
        if (u + 4 < n) {
            const char *qa = (const char *)(qrows + (i64)it[u + 4].i * dim);
            const char *ga = (const char *)(grows + (i64)it[u + 4].j * dim);
            for (i64 b8 = 0; b8 < dim * 4; b8 += 64) {
                __builtin_prefetch(qa + b8);
                __builtin_prefetch(ga + b8);
            }
        }
        i64 i = it[u].i, j = it[u].j, lo = toff[i], hi = toff[i + 1];
        double qsq_i = qsq[i], qn = sqrt(qsq_i), s = (double)it[u].s;
        double key = cosine ? -s : qsq_i + gsq[j] - 2.0 * s;
        double eps = key_bound(qn, gn[j], bound, cosine);
        i64 p = count_less_d(thr, lo, hi, key - eps);
        if (lo + p < hi && thr[lo + p] < key + eps) {
            /* too close to call from the tile: a float64 key in any order, the
             * canonical one when a threshold lies within that key's bound */
            const float *qrow = qrows + i * dim, *grow = grows + j * dim;
            double fk = fast_key(qrow, grow, dim, cosine);
            double fe = fast_bound(fk, qn, gn[j], dim, cosine);
            p = count_less_d(thr, lo, hi, fk - fe);
            if (lo + p < hi && thr[lo + p] < fk + fe)
                p = count_less_d(thr, lo, hi, canonical_key(qrow, grow, dim, cosine));
        }
        if (lo + p < hi) hist[lo + p] += 1;
    }
    q->n = 0;
}

/* Query row i's counts against items j0 .. j0 + c of the gallery chunk: srow (c float32
 * products), off / glab / gid from item j0 on, aup / bdn the row's float32 bounds
 * (float32_bounds) of its thresholds [lo .. hi) (r = hi - lo >= 1), lay their
 * RW_LAYOUT (RW_LAY floats).  Adds the settled items to hist[lo .. hi) and queues the others
 * in `open` (room for RW_OPEN + c). */
static void count_row(const float *srow, i64 c, i64 j0, const float *off, const float *aup,
                      const float *bdn, const float *lay, i64 lo, i64 hi, i64 i, i64 ql, i64 qi,
                      const i64 *glab, const i64 *gid, int exclude_self,
                      const struct row_scratch *w, i64 *hist, struct open_queue *open)
{
    i64 r = hi - lo;
    (void)lay; /* read by the AVX2 settling only */
    float *vv = w->vv;
    int32_t *jj = w->jj, *pos = w->pos;
    i64 *row_hist = w->row_hist;
    i64 n = compact_row(off, srow, c, aup[r - 1], glab, gid, ql, qi, exclude_self, w->masks,
                        w->spad, vv, jj);
    if (n == 0) return;
    /* each item's place p among the upper bounds (the number below its proxy); settled
     * (at or below bdn[p]: ahead of exactly the thresholds from p on) are counted,
     * the others' indices go to the open list (pos) */
    i64 n_open;
#if defined(__AVX512F__)
    if (r < 64) {
        n_open = settle_row(vv, jj, n, aup, bdn, r, hist + lo, pos);
    } else
#elif defined(__AVX2__)
    if (r <= 64) {
        n_open = settle_row(vv, jj, n, aup, bdn, lay, r, hist + lo, pos);
    } else
#endif
    {
        if (r <= 64) {
            for (i64 t = 0; t < n; t++) pos[t] = 0;
            for (i64 p = 0; p < r; p++) {
                float a = aup[p];
                for (i64 t = 0; t < n; t++) pos[t] += vv[t] > a;
            }
        } else {
            for (i64 t = 0; t < n; t++) pos[t] = (int32_t)count_less_f(aup, r, vv[t]);
        }
        for (i64 p = 0; p <= r; p++) row_hist[p] = 0;
        n_open = 0;
        for (i64 t = 0; t < n; t++) {
            int32_t p = pos[t];
            int settled = vv[t] <= bdn[p];
            row_hist[p] += settled;
            pos[n_open] = jj[t];
            n_open += !settled;
        }
        for (i64 p = 0; p < r; p++) hist[lo + p] += row_hist[p];
    }
    if (open->n > RW_OPEN) count_open(open);
    struct open_item *q = open->it + open->n;
    for (i64 u = 0; u < n_open; u++) {
        q[u].i = (int32_t)i;
        q[u].j = (int32_t)(j0 + pos[u]);
        q[u].s = srow[pos[u]];
    }
    open->n += n_open;
}

/* kernels.count_tile, the same steps; hist (length toff[b]) must be zeroed by the
 * caller.  sim: (b, c) float32 with row stride ld.  Returns 0, or -1 when out of
 * memory. */
int rw_count_tile(const float *sim, i64 b, i64 c, i64 ld, const float *qrows, const double *qsq,
                  const i64 *qlab, const i64 *qid, const float *grows, const double *gsq,
                  const i64 *glab, const i64 *gid, const uint8_t *gjunk, const double *thr,
                  const i64 *toff, i64 dim, int exclude_self, int cosine, double bound, i64 *hist)
{
    if (c == 0) return 0;
    i64 rmax = 0;
    for (i64 i = 0; i < b; i++)
        if (toff[i + 1] - toff[i] > rmax) rmax = toff[i + 1] - toff[i];
    i64 nw = (c + 63) >> 6;
    i64 cp = nw << 6; /* off padded to whole words */
    double *gn = malloc(sizeof(double) * c);
    float *off = malloc(sizeof(float) * cp);
    float *aup = malloc(sizeof(float) * (rmax + 1));
    float *bdn = malloc(sizeof(float) * (rmax + 1));
    i64 *row_hist = malloc(sizeof(i64) * (rmax + 1));
    uint64_t *masks = malloc(sizeof(uint64_t) * nw);
    float *vv = malloc(sizeof(float) * (c + 16));
    int32_t *jj = malloc(sizeof(int32_t) * (c + 16));
    int32_t *pos = malloc(sizeof(int32_t) * (c + 16));
    float *spad = malloc(sizeof(float) * 64);
    struct open_queue open = {malloc(sizeof(struct open_item) * (RW_OPEN + c)), 0, qrows,
                              grows, qsq, gsq, gn, thr, toff, dim, cosine, bound, hist};
    int status = 0;
    if (!gn || !off || !aup || !bdn || !row_hist || !masks || !vv || !jj || !pos || !spad ||
        !open.it) {
        status = -1;
        goto done;
    }
    struct row_scratch scratch = {vv, jj, pos, row_hist, masks, spad};
    float lay[RW_LAY];
    double gmax, hmax;
    chunk_setup(gsq, gjunk, c, cosine, gn, off, &gmax, &hmax);
    for (i64 j = c; j < cp; j++) off[j] = NAN;
    for (int k = 0; k < 64; k++) spad[k] = 0.0f;
    for (i64 i = 0; i < b; i++) {
        i64 lo = toff[i], hi = toff[i + 1];
        if (hi == lo) continue;
        row_bounds(thr, lo, hi, qsq[i], gmax, hmax, cosine, bound, aup, bdn);
        RW_LAYOUT(aup, bdn, hi - lo, lay);
        count_row(sim + i * ld, c, 0, off, aup, bdn, lay, lo, hi, i, qlab[i], qid[i], glab, gid,
                  exclude_self, &scratch, hist, &open);
    }
    count_open(&open);
done:
    free(open.it);
    free(gn);
    free(off);
    free(aup);
    free(bdn);
    free(row_hist);
    free(masks);
    free(vv);
    free(jj);
    free(pos);
    free(spad);
    return status;
}

/* ------------------------------------------------- fused tiles (AVX-512, or AVX2 + FMA)
 *
 * rw_count_fused: count_tile's counts, with the tile's float32 products computed here
 * instead of by BLAS, RW_NB gallery items at a time into a block that stays in the
 * core's cache (1 MB at 1,024 query rows: in a 2 MB L2; a 512 KB L2 keeps half of it),
 * and counted right away: the 32 MB tile is never written out and read back.  The
 * products are float32 multiply-adds in four partial sums (a different rounding from
 * BLAS's, with a smaller bound: micro_kernel), and every decision is made
 * within the bound the caller passes (at least the products' own, rw_fused_roundings), so
 * every count, and every rank, is the one count_tile gives.  The product is a register-
 * blocked micro-kernel (RW_MR query rows x RW_NR gallery items: 24 AVX-512 accumulators,
 * or 12 AVX2 ones, whose sums are the same bits) over operands packed once per query
 * block and gallery chunk (rw_pack_rows), the layout of BLIS / OpenBLAS's own kernels;
 * measured as fast as numpy's OpenBLAS sgemm on a Xeon (AVX-512) and an EPYC (AVX2). */
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#if defined(__AVX512F__)
#define RW_MR 12
#define RW_NR 32
#else /* AVX2: 6 x 16, 12 accumulators of the 16 registers (OpenBLAS's Haswell shape) */
#define RW_MR 6
#define RW_NR 16
#endif
#define RW_NB 256

void rw_panel_widths(i64 *widths)
{
    widths[0] = RW_MR;
    widths[1] = RW_NR;
}

/* x (n x d) in panels of `width` rows, each k-major: out[p*d + k*width + i] =
 * x[(p + i)*d + k] for panel start p; rows past n are zeros.  out: ceil(n/width)*width*d. */
void rw_pack_rows(const float *x, i64 n, i64 d, i64 width, float *out)
{
    for (i64 p = 0; p < n; p += width) {
        i64 h = n - p < width ? n - p : width;
        float *dst = out + p * d;
        for (i64 k = 0; k < d; k++, dst += width) {
            for (i64 i = 0; i < h; i++) dst[i] = x[(p + i) * d + k];
            for (i64 i = h; i < width; i++) dst[i] = 0.0f;
        }
    }
}

/* The products' summation: RW_PARTS sequential partial sums of kc = ceil(d / RW_PARTS)
 * terms each (float32 fused multiply-adds in k order), added in order.  A term of the dot
 * product then goes through at most kc + RW_PARTS - 1 roundings instead of d, so the
 * products' error bound is gamma_{kc + parts - 1} |q||g| (rw_fused_roundings), about a
 * quarter of BLAS's gamma_d: a quarter as many items too close to call from the tile.
 * Four parts, not more: with m = kc + 3 roundings the bound error_bound_factor(m) =
 * 2 (m + 2) u exceeds gamma_m by (m + 4) u |q||g|, which must still cover the d + 3
 * operations' underflow errors (ranking.EUCLIDEAN_MIN_SQ: |q||g| >= 2^-100, so each
 * < 2^-126 <= u |q||g| / 4): (d + 3) / 4 <= m + 4 needs kc >= d / 4. */
#define RW_PARTS 4

static inline i64 fused_kc(i64 d) { return (d + RW_PARTS - 1) / RW_PARTS; }

/* The most roundings a term of count_fused's products goes through (see above). */
i64 rw_fused_roundings(i64 d)
{
    if (d <= 0) return 0;
    i64 kc = fused_kc(d);
    return kc + (d + kc - 1) / kc - 1;
}

/* c[i*ldc + j] = sum_k a[k*RW_MR + i] * b[k*RW_NR + j], i < RW_MR, j < RW_NR, as partial
 * sums of kc terms (float32 fused multiply-adds in k order) added in order; c 64-byte
 * aligned and ldc a multiple of 16 (b need not be: packed rows that travelled to a
 * cluster's worker may not be). */
#if defined(__AVX512F__)
static inline void micro_kernel(const float *a, const float *b, i64 d, i64 kc, float *c,
                                i64 ldc)
{
    for (i64 k0 = 0; k0 < d; k0 += kc) {
        i64 kn = d - k0 < kc ? d - k0 : kc;
        __m512 c00 = _mm512_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00,
               c21 = c00, c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00,
               c60 = c00, c61 = c00, c70 = c00, c71 = c00, c80 = c00, c81 = c00, c90 = c00,
               c91 = c00, ca0 = c00, ca1 = c00, cb0 = c00, cb1 = c00;
        for (i64 k = 0; k < kn; k++, a += RW_MR, b += RW_NR) {
            __m512 b0 = _mm512_loadu_ps(b), b1 = _mm512_loadu_ps(b + 16), x;
#define RW_ROW(i, r0, r1)            \
    x = _mm512_set1_ps(a[i]);        \
    r0 = _mm512_fmadd_ps(x, b0, r0); \
    r1 = _mm512_fmadd_ps(x, b1, r1);
            RW_ROW(0, c00, c01) RW_ROW(1, c10, c11) RW_ROW(2, c20, c21) RW_ROW(3, c30, c31)
            RW_ROW(4, c40, c41) RW_ROW(5, c50, c51) RW_ROW(6, c60, c61) RW_ROW(7, c70, c71)
            RW_ROW(8, c80, c81) RW_ROW(9, c90, c91) RW_ROW(10, ca0, ca1) RW_ROW(11, cb0, cb1)
#undef RW_ROW
        }
        /* the first part stored, each later one added to the sum so far */
#define RW_PUT(i, r0, r1)                                                      \
    if (k0 == 0) {                                                             \
        _mm512_store_ps(c + (i) * ldc, r0);                                    \
        _mm512_store_ps(c + (i) * ldc + 16, r1);                               \
    } else {                                                                   \
        _mm512_store_ps(c + (i) * ldc, _mm512_add_ps(_mm512_load_ps(c + (i) * ldc), r0)); \
        _mm512_store_ps(c + (i) * ldc + 16,                                    \
                        _mm512_add_ps(_mm512_load_ps(c + (i) * ldc + 16), r1)); \
    }
        RW_PUT(0, c00, c01) RW_PUT(1, c10, c11) RW_PUT(2, c20, c21) RW_PUT(3, c30, c31)
        RW_PUT(4, c40, c41) RW_PUT(5, c50, c51) RW_PUT(6, c60, c61) RW_PUT(7, c70, c71)
        RW_PUT(8, c80, c81) RW_PUT(9, c90, c91) RW_PUT(10, ca0, ca1) RW_PUT(11, cb0, cb1)
#undef RW_PUT
    }
}
#else
/* The same sums with 8-lane registers: each entry the same chain of fused multiply-adds
 * in k order per part, the parts added in order, so the products are bit for bit the
 * AVX-512 kernel's (c 32-byte aligned, ldc a multiple of 8). */
static inline void micro_kernel(const float *a, const float *b, i64 d, i64 kc, float *c,
                                i64 ldc)
{
    for (i64 k0 = 0; k0 < d; k0 += kc) {
        i64 kn = d - k0 < kc ? d - k0 : kc;
        __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00,
               c21 = c00, c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
        for (i64 k = 0; k < kn; k++, a += RW_MR, b += RW_NR) {
            __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8), x;
#define RW_ROW(i, r0, r1)            \
    x = _mm256_broadcast_ss(a + i);  \
    r0 = _mm256_fmadd_ps(x, b0, r0); \
    r1 = _mm256_fmadd_ps(x, b1, r1);
            RW_ROW(0, c00, c01) RW_ROW(1, c10, c11) RW_ROW(2, c20, c21) RW_ROW(3, c30, c31)
            RW_ROW(4, c40, c41) RW_ROW(5, c50, c51)
#undef RW_ROW
        }
#define RW_PUT(i, r0, r1)                                                               \
    if (k0 == 0) {                                                                      \
        _mm256_store_ps(c + (i) * ldc, r0);                                             \
        _mm256_store_ps(c + (i) * ldc + 8, r1);                                         \
    } else {                                                                            \
        _mm256_store_ps(c + (i) * ldc, _mm256_add_ps(_mm256_load_ps(c + (i) * ldc), r0)); \
        _mm256_store_ps(c + (i) * ldc + 8,                                              \
                        _mm256_add_ps(_mm256_load_ps(c + (i) * ldc + 8), r1));          \
    }
        RW_PUT(0, c00, c01) RW_PUT(1, c10, c11) RW_PUT(2, c20, c21) RW_PUT(3, c30, c31)
        RW_PUT(4, c40, c41) RW_PUT(5, c50, c51)
#undef RW_PUT
    }
}
#endif

/* The fused kernel's products alone, out (b x c, row-major): for the tests (each lies
 * within gamma_{rw_fused_roundings(d)} sum_k |q_k g_k| of the exact dot product). */
void rw_fused_products(const float *qpack, const float *gpack, i64 b, i64 c, i64 d,
                       float *out)
{
    float tmp[RW_MR * RW_NR] __attribute__((aligned(64)));
    i64 kc = fused_kc(d);
    for (i64 ip = 0; ip < b; ip += RW_MR)
        for (i64 jp = 0; jp < c; jp += RW_NR) {
            micro_kernel(qpack + ip * d, gpack + jp * d, d, kc, tmp, RW_NR);
            for (i64 i = 0; i < RW_MR && ip + i < b; i++)
                for (i64 j = 0; j < RW_NR && jp + j < c; j++)
                    out[(ip + i) * c + jp + j] = tmp[i * RW_NR + j];
        }
}

/* count_tile's arguments, with the packed query block (RW_MR panels) and gallery chunk
 * (RW_NR panels) in place of the tile; `bound` may be error_bound_factor of
 * rw_fused_roundings(dim) instead of dim.  hist must be zeroed by the caller.  Returns 0,
 * or -1 when out of memory. */
int rw_count_fused(const float *qpack, const float *gpack, i64 b, i64 c, const float *qrows,
                   const double *qsq, const i64 *qlab, const i64 *qid, const float *grows,
                   const double *gsq, const i64 *glab, const i64 *gid, const uint8_t *gjunk,
                   const double *thr, const i64 *toff, i64 dim, int exclude_self, int cosine,
                   double bound, i64 *hist)
{
    if (c == 0 || b == 0) return 0;
    i64 bp = (b + RW_MR - 1) / RW_MR * RW_MR, rmax = 0, kc = fused_kc(dim);
    for (i64 i = 0; i < b; i++)
        if (toff[i + 1] - toff[i] > rmax) rmax = toff[i + 1] - toff[i];
    i64 cp = (c + 63) >> 6 << 6; /* off padded to whole 64-item words (compact_row) */
    double *gn = malloc(sizeof(double) * c);
    float *off = malloc(sizeof(float) * cp);
    /* every row's float32 bounds, once per tile: row i's aup from toff[i] (r of them),
     * its bdn from toff[i] + i (r + 1 of them) */
    float *aup = malloc(sizeof(float) * (toff[b] + 1));
    float *bdn = malloc(sizeof(float) * (toff[b] + b + 1));
    i64 *row_hist = malloc(sizeof(i64) * (rmax + 1));
    float *vv = malloc(sizeof(float) * (RW_NB + 16));
    int32_t *jj = malloc(sizeof(int32_t) * (RW_NB + 16));
    int32_t *pos = malloc(sizeof(int32_t) * (RW_NB + 16));
    float *blk = aligned_alloc(64, sizeof(float) * bp * RW_NB); /* 1 MB at b = 1024 */
    float *lays = malloc(sizeof(float) * RW_LAY * b); /* each row's RW_LAYOUT */
    /* compact_row's word masks and padded last word (used without AVX-512) */
    uint64_t *masks = malloc(sizeof(uint64_t) * (RW_NB >> 6));
    float *spad = calloc(64, sizeof(float));
    struct open_queue open = {malloc(sizeof(struct open_item) * (RW_OPEN + RW_NB)), 0, qrows,
                              grows, qsq, gsq, gn, thr, toff, dim, cosine, bound, hist};
    int status = 0;
    if (!gn || !off || !aup || !bdn || !row_hist || !vv || !jj || !pos || !blk || !lays ||
        !masks || !spad || !open.it) {
        status = -1;
        goto done;
    }
    struct row_scratch scratch = {vv, jj, pos, row_hist, masks, spad};
    double gmax, hmax;
    chunk_setup(gsq, gjunk, c, cosine, gn, off, &gmax, &hmax);
    for (i64 j = c; j < cp; j++) off[j] = NAN; /* never ahead: the last block's padding */
    for (i64 i = 0; i < b; i++)
        if (toff[i + 1] > toff[i]) {
            row_bounds(thr, toff[i], toff[i + 1], qsq[i], gmax, hmax, cosine, bound,
                       aup + toff[i], bdn + toff[i] + i);
            RW_LAYOUT(aup + toff[i], bdn + toff[i] + i, toff[i + 1] - toff[i], lays + RW_LAY * i);
        }
    for (i64 j0 = 0; j0 < c; j0 += RW_NB) {
        i64 nb = c - j0 < RW_NB ? c - j0 : RW_NB;
        for (i64 jp = 0; jp < nb; jp += RW_NR)
            for (i64 ip = 0; ip < bp; ip += RW_MR)
                micro_kernel(qpack + ip * dim, gpack + (j0 + jp) * dim, dim, kc,
                             blk + ip * RW_NB + jp, RW_NB);
        for (i64 i = 0; i < b; i++) {
            i64 lo = toff[i], hi = toff[i + 1];
            if (hi == lo) continue;
            count_row(blk + i * RW_NB, nb, j0, off + j0, aup + lo, bdn + lo + i,
                      lays + RW_LAY * i, lo, hi, i, qlab[i], qid[i], glab + j0, gid + j0,
                      exclude_self, &scratch, hist, &open);
        }
    }
    count_open(&open);
done:
    free(open.it);
    free(gn);
    free(off);
    free(aup);
    free(bdn);
    free(row_hist);
    free(vv);
    free(jj);
    free(pos);
    free(blk);
    free(lays);
    free(masks);
    free(spad);
    return status;
}
#endif

/* ------------------------------------------------------------------ ranks_from_hist */

void rw_ranks_from_hist(const i64 *hist, const i64 *toff, i64 nq, i64 *ranks)
{
    for (i64 i = 0; i < nq; i++) {
        i64 ahead = 0;
        for (i64 p = toff[i]; p < toff[i + 1]; p++) {
            ahead += hist[p];
            ranks[p] = 1 + ahead + (p - toff[i]);
        }
    }
}
