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

#include "backends/cpu/cpu-impl.h"

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
 * NV = 4 or 8 (64 or 128).
 *   scores: S[h][j] = q_h . k_{j, h / G}   (q already scaled): 8 positions
 *           at a time, all kv heads, up to 3 query heads of one kv head per
 *           pass with 24 accumulators in registers, each row converted from
 *           f16 once for them; then the 8 accumulators of a head folded
 *           into its 8 sums (a transposing tree of adds);
 *   values: O[h] += sum_j P[h][j] v_{j, h / G}, chunks of 32 positions, the
 *           heads of one kv head together.
 *
 * Both stream their rows from memory at long contexts, and both compute
 * too slowly for the hardware prefetchers to keep up: on a Zen 4 the
 * scores and values of 966 positions (SmolLM2's 3 f16 kv heads, one
 * thread) took 40 + 40 us from memory against 15 + 13 from cache. So each
 * step also fetches its share of the rows a fixed distance ahead, a few
 * lines at a time in the order the kernel walks them (20 + 18 us). The
 * first fetches of a short run would still wait; the products before the
 * attention fetch its start (graph-fuse.c). */

/* how far ahead, in bytes of the run, the scores and values fetch: 4 and
 * 8 KB. On the Zen 4 above a whole SmolLM2-135M decode step took 0.6-2.4%
 * less time with them than with 8 and 16 KB (eight runs, contexts 256 to
 * 1700, Q4_0 and Q8_0, the two alternated step by step in each run);
 * 2 + 4 KB and 16 + 32 KB were slower, and fetching nothing ahead 17% slower
 * at 1700. */
#define QK_AHEAD TOY_ATTN_K_AHEAD
#define PV_AHEAD TOY_ATTN_V_AHEAD

static inline __attribute__((always_inline)) __m512 ld_row(const char *p, bool f16) {
    return f16 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)) : _mm512_loadu_ps((const float *)p);
}

/* fetch the lines of [p, p + n), not past end */
static inline __attribute__((always_inline)) void fetch_span(const char *p, int64_t n, const char *end) {
    for (const char *e = p + n < end ? p + n : end; p < e; p += 64) _mm_prefetch(p, _MM_HINT_T0);
}

/* r[k] = sum of the 16 lanes of a[k], k < 8 */
static inline __attribute__((always_inline)) __m256 fold8(const __m512 a[8]) {
    __m512 b[4], c[2];
    #pragma GCC unroll 4
    for (int i = 0; i < 4; i++) /* lanes 0,2 | 1,3 of each 128-bit quarter: keys 2i | 2i+1 */
        b[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]), _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
    #pragma GCC unroll 2
    for (int i = 0; i < 2; i++) /* each quarter: keys 4i .. 4i+3 */
        c[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(b[2 * i]), _mm512_castps_pd(b[2 * i + 1]))),
                             _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(b[2 * i]), _mm512_castps_pd(b[2 * i + 1]))));
    /* quarters: keys 0-3 (dims of quarters 0+1), 0-3 (2+3), 4-7 (0+1), 4-7 (2+3) */
    __m512 d = _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], 0x88), _mm512_shuffle_f32x4(c[0], c[1], 0xdd));
    d = _mm512_shuffle_f32x4(d, d, 0xd8); /* keys 0-3 twice, then 4-7 twice */
    return _mm256_add_ps(_mm512_castps512_ps256(d), _mm512_extractf32x8_ps(d, 1));
}

/* NH <= 3 query heads (rows of 16 NV at qh) against the 8 rows at kb, ldk
 * bytes apart: S[h lds + k] */
static inline __attribute__((always_inline)) void qk8(const float *qh, const char *kb, int64_t ldk, float *S, int64_t lds,
                                                      const int NV, const int NH, const bool f16) {
    const int64_t es = f16 ? 2 : 4;
    __m512 acc[3][8];
    #pragma GCC unroll 3
    for (int h = 0; h < NH; h++)
        #pragma GCC unroll 8
        for (int k = 0; k < 8; k++) acc[h][k] = _mm512_setzero_ps();
    #pragma GCC unroll 8
    for (int c = 0; c < NV; c++) {
        /* GCC otherwise hoists all 8 NV row loads to the top and spills them */
        __asm__ volatile("" ::: "memory");
        __m512 qv[3];
        #pragma GCC unroll 3
        for (int h = 0; h < NH; h++) qv[h] = _mm512_loadu_ps(qh + h * 16 * NV + 16 * c);
        #pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            __m512 kv = ld_row(kb + k * ldk + c * 16 * es, f16);
            #pragma GCC unroll 3
            for (int h = 0; h < NH; h++) acc[h][k] = _mm512_fmadd_ps(qv[h], kv, acc[h][k]);
        }
    }
    #pragma GCC unroll 3
    for (int h = 0; h < NH; h++) _mm256_storeu_ps(S + h * lds, fold8(acc[h]));
}

static inline __attribute__((always_inline)) void qk_all(const float *q, const char *K, int64_t ldk, int64_t ldh,
                                                         int64_t nk, int64_t Hq, int64_t G, float *S, int64_t lds,
                                                         const int NV, const bool f16) {
    const int64_t es = f16 ? 2 : 4, Hkv = Hq / G;
    const int64_t share = (8 * ldk + Hkv - 1) / Hkv; /* bytes each kv head's pass fetches */
    const char *end = K + nk * ldk;
    int64_t j = 0;
    for (; j + 8 <= nk; j += 8)
        for (int64_t g = 0; g < Hkv; g++) {
            fetch_span(K + j * ldk + g * share + QK_AHEAD, share, end);
            const char *kb = K + j * ldk + g * ldh;
            for (int64_t h = g * G; h < (g + 1) * G;) {
                int64_t n = (g + 1) * G - h;
                float *s = S + h * lds + j;
                if (n >= 3) qk8(q + h * 16 * NV, kb, ldk, s, lds, NV, 3, f16), h += 3;
                else if (n == 2) qk8(q + h * 16 * NV, kb, ldk, s, lds, NV, 2, f16), h += 2;
                else qk8(q + h * 16 * NV, kb, ldk, s, lds, NV, 1, f16), h += 1;
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

/* NH heads (h0 .. h0+NH-1, one kv head) over positions [j0, j1), each
 * position also fetching `step` bytes from pf on */
static inline __attribute__((always_inline)) void pv_heads(const float *P, int64_t lds, const char *V, int64_t ldv,
                                                           int64_t j0, int64_t j1, float *O, int64_t h0, const char *pf,
                                                           int64_t step, const char *end, const int NV, const int NH,
                                                           const bool f16) {
    const int64_t es = f16 ? 2 : 4;
    __m512 acc[24];
    #pragma GCC unroll 16
    for (int i = 0; i < NH; i++)
        #pragma GCC unroll 16
        for (int c = 0; c < NV; c++) acc[i * NV + c] = _mm512_loadu_ps(O + (h0 + i) * 16 * NV + 16 * c);
    for (int64_t j = j0; j < j1; j++) {
        const char *vr = V + j * ldv;
        fetch_span(pf + (j - j0) * step, step, end);
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
    /* a chunk's passes (pv_heads calls) fetch the next chunks' bytes in turn */
    const int64_t passes = Hq / G * ((G + HB - 1) / HB), step = ((ldv + passes - 1) / passes + 63) / 64 * 64;
    const char *end = V + nk * ldv;
    for (int64_t j0 = 0; j0 < nk; j0 += 32) { /* 32 positions (<= 24 KB of V) stay in L1 across kv heads */
        int64_t j1 = j0 + 32 < nk ? j0 + 32 : nk;
        const char *pf = V + j0 * ldv + PV_AHEAD;
        for (int64_t h = 0; h < Hq;) {
            int64_t g = h / G, n = (g + 1) * G - h;
            if (n > HB) n = HB;
            const char *Vg = V + g * ldh;
            switch (n) {
#define PV_CASE(k) \
    case k: pv_heads(P, lds, Vg, ldv, j0, j1, O, h, pf, step, end, NV, (k) <= HB ? (k) : 1, f16); break;
                PV_CASE(1) PV_CASE(2) PV_CASE(3) PV_CASE(4) PV_CASE(5) PV_CASE(6)
#undef PV_CASE
            }
            h += n;
            pf += (j1 - j0) * step;
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
