/* attn-decode-avx2.c: the decode attention products of attn-decode-avx512.c
 * for CPUs with AVX2 but not AVX-512: one query head's scores and values
 * over cached f32 rows, and a whole decode step's over an f32 or f16 cache
 * (every head at once, K and V read once, f16 rows converted in registers).
 * Without them those CPUs converted each head's f16 rows to f32 in memory
 * every step and called BLAS once per head: on GPT-2 124M at 256-512
 * positions the conversion alone took longer than all the weight products.
 *
 * With 16 registers the shapes shrink from the AVX-512 ones: the scores
 * take 8 positions of one query head a pass (8 accumulators), the values
 * 64 dimensions of one head a pass. Reference: the plain loops of
 * test-ops.c and the BLAS calls of attention.c. */
#include <immintrin.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "backends/cpu/cpu-impl.h"

static inline __attribute__((always_inline)) __m256 ld8(const char *p, bool f16) {
    return f16 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)) : _mm256_loadu_ps((const float *)p);
}

static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* r[k] = sum of the 8 lanes of a[k], k < 8 */
static inline __attribute__((always_inline)) __m256 fold8(const __m256 a[8]) {
    __m256 b0 = _mm256_hadd_ps(a[0], a[1]), b1 = _mm256_hadd_ps(a[2], a[3]);
    __m256 b2 = _mm256_hadd_ps(a[4], a[5]), b3 = _mm256_hadd_ps(a[6], a[7]);
    __m256 c0 = _mm256_hadd_ps(b0, b1), c1 = _mm256_hadd_ps(b2, b3); /* per 128-bit half: keys 0-3 | 4-7 */
    return _mm256_add_ps(_mm256_permute2f128_ps(c0, c1, 0x20), _mm256_permute2f128_ps(c0, c1, 0x31));
}

/* s_j = scale q.k_j for nk f32 key rows ldk floats apart, D a multiple of 8
 * up to 256 */
void toy_attn_decode_scores_avx2(const float *q, const float *K, int64_t ldk, int64_t nk, int64_t D, float scale,
                                 float *s) {
    float qs[256];
    int nv = (int)(D / 8);
    for (int c = 0; c < nv; c++) _mm256_storeu_ps(qs + 8 * c, _mm256_mul_ps(_mm256_loadu_ps(q + 8 * c), _mm256_set1_ps(scale)));
    int64_t j = 0;
    for (; j + 4 <= nk; j += 4) {
        const float *k0 = K + j * ldk, *k1 = k0 + ldk, *k2 = k1 + ldk, *k3 = k2 + ldk;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int c = 0; c < nv; c++) {
            __m256 qv = _mm256_loadu_ps(qs + 8 * c);
            a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + 8 * c), a0);
            a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k1 + 8 * c), a1);
            a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k2 + 8 * c), a2);
            a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k3 + 8 * c), a3);
        }
        s[j] = hsum8(a0);
        s[j + 1] = hsum8(a1);
        s[j + 2] = hsum8(a2);
        s[j + 3] = hsum8(a3);
    }
    for (; j < nk; j++) {
        __m256 a0 = _mm256_setzero_ps();
        for (int c = 0; c < nv; c++) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(qs + 8 * c), _mm256_loadu_ps(K + j * ldk + 8 * c), a0);
        s[j] = hsum8(a0);
    }
}

/* o = sum_j p_j v_j over nk f32 value rows, 64 dimensions a pass */
void toy_attn_decode_values_avx2(const float *p, const float *V, int64_t ldv, int64_t nk, int64_t D, float *o) {
    for (int64_t d0 = 0; d0 < D; d0 += 64) {
        int nv = (int)((D - d0 < 64 ? D - d0 : 64) / 8);
        __m256 acc[8];
        for (int c = 0; c < 8; c++) acc[c] = _mm256_setzero_ps();
        for (int64_t j = 0; j < nk; j++) {
            __m256 pj = _mm256_set1_ps(p[j]);
            const float *v = V + j * ldv + d0;
            if (nv == 8) {
#pragma GCC unroll 8
                for (int c = 0; c < 8; c++) acc[c] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(v + 8 * c), acc[c]);
            } else {
                for (int c = 0; c < nv; c++) acc[c] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(v + 8 * c), acc[c]);
            }
        }
        for (int c = 0; c < nv; c++) _mm256_storeu_ps(o + d0 + 8 * c, acc[c]);
    }
}

/* ---- all heads of one decode query at once (attn-decode-avx512.c's plan) */

#define QK_AHEAD TOY_ATTN_K_AHEAD
#define PV_AHEAD TOY_ATTN_V_AHEAD

static inline __attribute__((always_inline)) void fetch_span(const char *p, int64_t n, const char *end) {
    for (const char *e = p + n < end ? p + n : end; p < e; p += 64) _mm_prefetch(p, _MM_HINT_T0);
}

/* one query head (8 NV floats at qh) against the 8 rows at kb, ldk bytes
 * apart: s[0..7] */
static inline __attribute__((always_inline)) void qk8(const float *qh, const char *kb, int64_t ldk, float *s,
                                                      const int NV, const bool f16) {
    const int64_t es = f16 ? 2 : 4;
    __m256 acc[8];
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) acc[k] = _mm256_setzero_ps();
#pragma GCC unroll 16
    for (int c = 0; c < NV; c++) {
        __m256 qv = _mm256_loadu_ps(qh + 8 * c);
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) acc[k] = _mm256_fmadd_ps(qv, ld8(kb + k * ldk + c * 8 * es, f16), acc[k]);
    }
    _mm256_storeu_ps(s, fold8(acc));
}

static inline __attribute__((always_inline)) void qk_all(const float *q, const char *K, int64_t ldk, int64_t ldh,
                                                         int64_t nk, int64_t Hq, int64_t G, float *S, int64_t lds,
                                                         const int NV, const bool f16) {
    const int64_t es = f16 ? 2 : 4, Hkv = Hq / G;
    const int64_t share = (8 * ldk + Hkv - 1) / Hkv;
    const char *end = K + nk * ldk;
    int64_t j = 0;
    for (; j + 8 <= nk; j += 8)
        for (int64_t g = 0; g < Hkv; g++) {
            fetch_span(K + j * ldk + g * share + QK_AHEAD, share, end);
            const char *kb = K + j * ldk + g * ldh;
            for (int64_t h = g * G; h < (g + 1) * G; h++) qk8(q + h * 8 * NV, kb, ldk, S + h * lds + j, NV, f16);
        }
    for (; j < nk; j++)
        for (int64_t h = 0; h < Hq; h++) {
            const char *kr = K + j * ldk + (h / G) * ldh;
            __m256 acc = _mm256_setzero_ps();
#pragma GCC unroll 16
            for (int c = 0; c < NV; c++) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + h * 8 * NV + 8 * c), ld8(kr + c * 8 * es, f16), acc);
            S[h * lds + j] = hsum8(acc);
        }
}

/* dimensions [8 c0, 8 c0 + 64) of head h over positions [j0, j1), each
 * position also fetching `step` bytes from pf on */
static inline __attribute__((always_inline)) void pv_head(const float *P, const char *V, int64_t ldv, int64_t j0,
                                                          int64_t j1, float *o, int c0, const char *pf, int64_t step,
                                                          const char *end, const bool f16) {
    const int64_t es = f16 ? 2 : 4;
    __m256 acc[8];
#pragma GCC unroll 8
    for (int c = 0; c < 8; c++) acc[c] = _mm256_loadu_ps(o + 8 * (c0 + c));
    for (int64_t j = j0; j < j1; j++) {
        const char *vr = V + j * ldv + 8 * c0 * es;
        fetch_span(pf + (j - j0) * step, step, end);
        __m256 p = _mm256_set1_ps(P[j]);
#pragma GCC unroll 8
        for (int c = 0; c < 8; c++) acc[c] = _mm256_fmadd_ps(p, ld8(vr + c * 8 * es, f16), acc[c]);
    }
#pragma GCC unroll 8
    for (int c = 0; c < 8; c++) _mm256_storeu_ps(o + 8 * (c0 + c), acc[c]);
}

static inline __attribute__((always_inline)) void pv_all(const float *P, int64_t lds, const char *V, int64_t ldv,
                                                         int64_t ldh, int64_t nk, int64_t Hq, int64_t G, float *O,
                                                         const int NV, const bool f16) {
    memset(O, 0, (size_t)(Hq * 8 * NV) * sizeof(float));
    const int64_t passes = Hq * (NV / 8), step = ((ldv + passes - 1) / passes + 63) / 64 * 64;
    const char *end = V + nk * ldv;
    for (int64_t j0 = 0; j0 < nk; j0 += 32) { /* 32 positions stay in L1 across heads */
        int64_t j1 = j0 + 32 < nk ? j0 + 32 : nk;
        const char *pf = V + j0 * ldv + PV_AHEAD;
        for (int64_t h = 0; h < Hq; h++)
            for (int c0 = 0; c0 < NV; c0 += 8) {
                pv_head(P + h * lds, V + (h / G) * ldh, ldv, j0, j1, O + h * 8 * NV, c0, pf, step, end, f16);
                pf += (j1 - j0) * step;
            }
    }
}

/* toy_attn_decode_qk_avx512's contract: S (Hq x nk, row stride lds) =
 * qs_h . k_{j, h / G}, qs already scaled, K position j, kv head g at
 * K + j ldk + g ldh bytes, f32 or f16; false when D is not 64 or 128 */
bool toy_attn_decode_qk_avx2(const float *qs, const void *K, bool f16, int64_t ldk, int64_t ldh, int64_t nk,
                             int64_t D, int64_t Hq, int64_t G, float *S, int64_t lds) {
    if (D == 64) {
        if (f16) qk_all(qs, K, ldk, ldh, nk, Hq, G, S, lds, 8, true);
        else qk_all(qs, K, ldk, ldh, nk, Hq, G, S, lds, 8, false);
    } else if (D == 128) {
        if (f16) qk_all(qs, K, ldk, ldh, nk, Hq, G, S, lds, 16, true);
        else qk_all(qs, K, ldk, ldh, nk, Hq, G, S, lds, 16, false);
    } else {
        return false;
    }
    return true;
}

/* O (Hq rows of D) = sum_j P[h][j] v_{j, h / G} */
bool toy_attn_decode_pv_avx2(const float *P, int64_t lds, const void *V, bool f16, int64_t ldv, int64_t ldh,
                             int64_t nk, int64_t D, int64_t Hq, int64_t G, float *O) {
    if (D == 64) {
        if (f16) pv_all(P, lds, V, ldv, ldh, nk, Hq, G, O, 8, true);
        else pv_all(P, lds, V, ldv, ldh, nk, Hq, G, O, 8, false);
    } else if (D == 128) {
        if (f16) pv_all(P, lds, V, ldv, ldh, nk, Hq, G, O, 16, true);
        else pv_all(P, lds, V, ldv, ldh, nk, Hq, G, O, 16, false);
    } else {
        return false;
    }
    return true;
}
