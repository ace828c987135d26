/* attn-decode-avx512.c: the two products of one decode query head (one
 * query row against nk cached f32 key and value rows of D, D a multiple of
 * 16 up to 256): s_j = scale q.k_j and o = sum_j p_j v_j, with the query
 * and the output held in registers and four keys per step, so no call per
 * key (BLAS's m = 1 paths spend more on setup than on the 64-wide rows).
 * Reference: the BLAS calls of attention.c. */
#include <immintrin.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

void toy_attn_decode_scores_avx512(const float *q, const float *K, int64_t ldk, int64_t nk, int64_t D, float scale,
                                   float *s) {
    __m512 qv[16];
    int nv = (int)(D / 16);
    for (int c = 0; c < nv; c++) qv[c] = _mm512_mul_ps(_mm512_loadu_ps(q + 16 * c), _mm512_set1_ps(scale));
    int64_t j = 0;
    for (; j + 4 <= nk; j += 4) {
        const float *k0 = K + j * ldk, *k1 = k0 + ldk, *k2 = k1 + ldk, *k3 = k2 + ldk;
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int c = 0; c < nv; c++) {
            a0 = _mm512_fmadd_ps(qv[c], _mm512_loadu_ps(k0 + 16 * c), a0);
            a1 = _mm512_fmadd_ps(qv[c], _mm512_loadu_ps(k1 + 16 * c), a1);
            a2 = _mm512_fmadd_ps(qv[c], _mm512_loadu_ps(k2 + 16 * c), a2);
            a3 = _mm512_fmadd_ps(qv[c], _mm512_loadu_ps(k3 + 16 * c), a3);
        }
        s[j] = _mm512_reduce_add_ps(a0);
        s[j + 1] = _mm512_reduce_add_ps(a1);
        s[j + 2] = _mm512_reduce_add_ps(a2);
        s[j + 3] = _mm512_reduce_add_ps(a3);
    }
    for (; j < nk; j++) {
        __m512 a0 = _mm512_setzero_ps();
        for (int c = 0; c < nv; c++) a0 = _mm512_fmadd_ps(qv[c], _mm512_loadu_ps(K + j * ldk + 16 * c), a0);
        s[j] = _mm512_reduce_add_ps(a0);
    }
}

void toy_attn_decode_values_avx512(const float *p, const float *V, int64_t ldv, int64_t nk, int64_t D, float *o) {
    __m512 acc[16], acc2[16];
    int nv = (int)(D / 16);
    for (int c = 0; c < nv; c++) acc[c] = acc2[c] = _mm512_setzero_ps();
    int64_t j = 0;
    for (; j + 2 <= nk; j += 2) { /* two independent chains per output vector */
        __m512 p0 = _mm512_set1_ps(p[j]), p1 = _mm512_set1_ps(p[j + 1]);
        const float *v0 = V + j * ldv, *v1 = v0 + ldv;
        for (int c = 0; c < nv; c++) {
            acc[c] = _mm512_fmadd_ps(p0, _mm512_loadu_ps(v0 + 16 * c), acc[c]);
            acc2[c] = _mm512_fmadd_ps(p1, _mm512_loadu_ps(v1 + 16 * c), acc2[c]);
        }
    }
    for (; j < nk; j++) {
        __m512 p0 = _mm512_set1_ps(p[j]);
        for (int c = 0; c < nv; c++) acc[c] = _mm512_fmadd_ps(p0, _mm512_loadu_ps(V + j * ldv + 16 * c), acc[c]);
    }
    for (int c = 0; c < nv; c++) _mm512_storeu_ps(o + 16 * c, _mm512_add_ps(acc[c], acc2[c]));
}

/* ---- all heads of one decode query at once ---------------------------------
 *
 * The kernels below serve a whole decode step: every query head against a
 * run of cached positions, K and V read once, front to back (a position's
 * kv heads are adjacent in the cache), f32 or f16 rows, head size 16 NV for
 * NV = 4 or 8 (64 or 128) so the accumulators stay in registers.
 *   scores: S[h][j] = q_h . k_{j, h / G}   (q already scaled), 16 keys per
 *           block: 16 partial-sum vectors folded into one vector of 16 sums
 *           (a transposing tree of 15 adds instead of 16 horizontal sums);
 *   values: O[h] += sum_j P[h][j] v_{j, h / G}, blocks of 16 positions, the
 *           heads of one kv head together. */

/* How many positions ahead the values' loop fetches its V rows. It reads
 * each chunk of 32 positions one kv head at a time, 128 bytes every 384
 * apart (SmolLM2), which the hardware prefetchers do not follow well: V
 * from memory streamed at 5-6 GB/s on one thread; fetching a chunk ahead,
 * 10-11 GB/s (3500 positions, f16, Emerald Rapids; the values took 127-135
 * us against 212-264). K's loop fetches its next block too (qk_all). */
#define PV_AHEAD 32

static inline __attribute__((always_inline)) __m512 ld_row(const char *p, bool f16) {
    return f16 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)) : _mm512_loadu_ps((const float *)p);
}

/* r[k] = sum of the 16 lanes of a[k], k < 16 */
static inline __attribute__((always_inline)) __m512 fold16(__m512 a[16]) {
    __m512 b[8], c[4], d[2];
    #pragma GCC unroll 16
    for (int i = 0; i < 8; i++) /* lanes 0,2 | 1,3 of each 128-bit quarter: keys 2i | 2i+1 */
        b[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]), _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
    #pragma GCC unroll 16
    for (int i = 0; i < 4; i++) /* each quarter: keys 4i .. 4i+3 */
        c[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(b[2 * i]), _mm512_castps_pd(b[2 * i + 1]))),
                             _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(b[2 * i]), _mm512_castps_pd(b[2 * i + 1]))));
    #pragma GCC unroll 16
    for (int i = 0; i < 2; i++) /* quarters: keys 8i..8i+3 twice, 8i+4..8i+7 twice */
        d[i] = _mm512_add_ps(_mm512_shuffle_f32x4(c[2 * i], c[2 * i + 1], 0x88), _mm512_shuffle_f32x4(c[2 * i], c[2 * i + 1], 0xdd));
    return _mm512_add_ps(_mm512_shuffle_f32x4(d[0], d[1], 0x88), _mm512_shuffle_f32x4(d[0], d[1], 0xdd));
}

static inline __attribute__((always_inline)) void qk_all(const float *q, const char *K, int64_t ldk, int64_t ldh,
                                                         int64_t nk, int64_t Hq, int64_t G, float *S, int64_t lds,
                                                         const int NV, const bool f16) {
    const int64_t es = f16 ? 2 : 4;
    float kf[16 * 16 * 8] __attribute__((aligned(64))); /* an f16 block as f32: 16 rows of D <= 128 */
    int64_t j = 0;
    for (; j + 16 <= nk; j += 16) {
        /* the next block's lines; the first block's with it */
        for (const char *pf = K + (j ? j + 16 : 0) * ldk, *pe = K + (j + 32 < nk ? j + 32 : nk) * ldk; pf < pe; pf += 64)
            _mm_prefetch(pf, _MM_HINT_T0);
        for (int64_t g = 0; g < Hq / G; g++) {
            const char *kb = K + j * ldk + g * ldh;
            int64_t ldb = ldk; /* bytes between the block's rows */
            if (f16) { /* the kv head's 16 rows to f32 once, for the G query heads that read them */
                #pragma GCC unroll 16
                for (int k = 0; k < 16; k++)
                    #pragma GCC unroll 16
                    for (int c = 0; c < NV; c++) _mm512_store_ps(kf + (k * NV + c) * 16, ld_row(kb + k * ldk + c * 32, true));
                kb = (const char *)kf;
                ldb = 64 * NV;
            }
            for (int64_t h = g * G; h < (g + 1) * G; h++) {
                const float *qh = q + h * 16 * NV;
                __m512 acc[16];
                #pragma GCC unroll 16
                for (int k = 0; k < 16; k++) acc[k] = _mm512_setzero_ps();
                #pragma GCC unroll 16
                for (int c = 0; c < NV; c++) {
                    __m512 qv = _mm512_loadu_ps(qh + 16 * c);
                    #pragma GCC unroll 16
                    for (int k = 0; k < 16; k++)
                        acc[k] = _mm512_fmadd_ps(qv, _mm512_loadu_ps((const float *)(kb + k * ldb) + 16 * c), acc[k]);
                }
                _mm512_storeu_ps(S + h * lds + j, fold16(acc));
            }
        }
    }
    for (; j < nk; j++)
        for (int64_t h = 0; h < Hq; h++) {
            const char *kr = K + j * ldk + (h / G) * ldh;
            __m512 acc = _mm512_setzero_ps();
            #pragma GCC unroll 16
            for (int c = 0; c < NV; c++) acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + h * 16 * NV + 16 * c), ld_row(kr + c * 16 * es, f16), acc);
            S[h * lds + j] = _mm512_reduce_add_ps(acc);
        }
}

/* NH heads (h0 .. h0+NH-1, one kv head) over positions [j0, j1) */
static inline __attribute__((always_inline)) void pv_heads(const float *P, int64_t lds, const char *V, int64_t ldv,
                                                           int64_t j0, int64_t j1, int64_t nk, float *O, int64_t h0,
                                                           const int NV, const int NH, const bool f16) {
    const int64_t es = f16 ? 2 : 4;
    __m512 acc[24];
    #pragma GCC unroll 16
    for (int i = 0; i < NH; i++)
        #pragma GCC unroll 16
        for (int c = 0; c < NV; c++) acc[i * NV + c] = _mm512_loadu_ps(O + (h0 + i) * 16 * NV + 16 * c);
    for (int64_t j = j0; j < j1; j++) {
        const char *vr = V + j * ldv;
        if (j + PV_AHEAD < nk)
            #pragma GCC unroll 16
            for (int c = 0; c < NV * 16 * (int)es; c += 64) _mm_prefetch(vr + PV_AHEAD * ldv + c, _MM_HINT_T0);
        __m512 p[6];
        #pragma GCC unroll 16
        for (int i = 0; i < NH; i++) p[i] = _mm512_set1_ps(P[(h0 + i) * lds + j]);
        #pragma GCC unroll 16
        for (int c = 0; c < NV; c++) {
            __m512 v = ld_row(vr + c * 16 * es, f16);
            #pragma GCC unroll 16
            for (int i = 0; i < NH; i++) acc[i * NV + c] = _mm512_fmadd_ps(p[i], v, acc[i * NV + c]);
        }
    }
    #pragma GCC unroll 16
    for (int i = 0; i < NH; i++)
        #pragma GCC unroll 16
        for (int c = 0; c < NV; c++) _mm512_storeu_ps(O + (h0 + i) * 16 * NV + 16 * c, acc[i * NV + c]);
}

static inline __attribute__((always_inline)) void pv_all(const float *P, int64_t lds, const char *V, int64_t ldv,
                                                         int64_t ldh, int64_t nk, int64_t Hq, int64_t G, float *O,
                                                         const int NV, const bool f16) {
    const int HB = 24 / NV; /* heads whose accumulators fit the registers with the loaded row */
    memset(O, 0, (size_t)(Hq * 16 * NV) * sizeof(float));
    for (int64_t j0 = 0; j0 < nk; j0 += 32) { /* 32 positions (<= 24 KB of V) stay in L1 across kv heads */
        int64_t j1 = j0 + 32 < nk ? j0 + 32 : nk;
        for (int64_t h = 0; h < Hq;) {
            int64_t g = h / G, n = (g + 1) * G - h;
            if (n > HB) n = HB;
            const char *Vg = V + g * ldh;
            switch (n) {
#define PV_CASE(k) \
    case k: pv_heads(P, lds, Vg, ldv, j0, j1, nk, O, h, NV, (k) <= HB ? (k) : 1, f16); break;
                PV_CASE(1) PV_CASE(2) PV_CASE(3) PV_CASE(4) PV_CASE(5) PV_CASE(6)
#undef PV_CASE
            }
            h += n;
        }
    }
}

/* S (Hq x nk, row stride lds) = qs_h . k_{j, h / G}; qs: Hq rows of D
 * already scaled; K: position j, kv head g at K + j ldk + g ldh (bytes),
 * f32 or f16. Returns false when D is not 64 or 128. */
bool toy_attn_decode_qk_avx512(const float *qs, const void *K, bool f16, int64_t ldk, int64_t ldh, int64_t nk,
                               int64_t D, int64_t Hq, int64_t G, float *S, int64_t lds) {
    if (D == 64) {
        if (f16) qk_all(qs, K, ldk, ldh, nk, Hq, G, S, lds, 4, true);
        else qk_all(qs, K, ldk, ldh, nk, Hq, G, S, lds, 4, false);
    } else if (D == 128) {
        if (f16) qk_all(qs, K, ldk, ldh, nk, Hq, G, S, lds, 8, true);
        else qk_all(qs, K, ldk, ldh, nk, Hq, G, S, lds, 8, false);
    } else {
        return false;
    }
    return true;
}

/* O (Hq rows of D) = sum_j P[h][j] v_{j, h / G}, layout as above */
bool toy_attn_decode_pv_avx512(const float *P, int64_t lds, const void *V, bool f16, int64_t ldv, int64_t ldh,
                               int64_t nk, int64_t D, int64_t Hq, int64_t G, float *O) {
    if (D == 64) {
        if (f16) pv_all(P, lds, V, ldv, ldh, nk, Hq, G, O, 4, true);
        else pv_all(P, lds, V, ldv, ldh, nk, Hq, G, O, 4, false);
    } else if (D == 128) {
        if (f16) pv_all(P, lds, V, ldv, ldh, nk, Hq, G, O, 8, true);
        else pv_all(P, lds, V, ldv, ldh, nk, Hq, G, O, 8, false);
    } else {
        return false;
    }
    return true;
}
