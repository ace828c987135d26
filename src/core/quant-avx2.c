/* quant-avx2.c: AVX2 dequantization of the formats inference reads most
 * (q8_0, q4_0, q4_1, q4_k, q5_k, q6_k), and the inner loop of the iq4
 * quantizers, chosen at run time by quant.c.
 * Block layouts: see quant.c and ggml-common.h.
 *
 * The results are bit-identical to the scalar reference kernels in
 * quant.c: each element is computed with the same float operations in the
 * same order (an int converted to float, one multiply, then one add or
 * subtract where the format has a min), never fused into an FMA. gcc keeps
 * -ffp-contract=off in C11 mode; clang is told so below. test-quant.c
 * compares the two on every block type. */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "toy/dtype.h"
#include "core/quant-impl.h"

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

#define QK 32
#define QK_K 256

static inline float h2f(const uint8_t *p) { uint16_t h; memcpy(&h, p, 2); return toy_f16_to_f32(h); }

/* 8 int8 -> 8 floats times d, stored at y. */
static inline void put8_i8(float *y, __m128i q8, __m256 d) {
    _mm256_storeu_ps(y, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8)), d));
}

/* 8 int32 -> floats: d * q - m (two roundings, as the scalar code). */
static inline void put8_dm(float *y, __m256i q, __m256 d, __m256 m) {
    _mm256_storeu_ps(y, _mm256_sub_ps(_mm256_mul_ps(d, _mm256_cvtepi32_ps(q)), m));
}

void toy_deq_q8_0_avx2(const uint8_t *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += 34, y += QK) {
        const __m256 d = _mm256_set1_ps(h2f(b));
        for (int k = 0; k < 4; k++) put8_i8(y + 8 * k, _mm_loadl_epi64((const __m128i *)(b + 2 + 8 * k)), d);
    }
}

void toy_deq_q4_0_avx2(const uint8_t *b, float *y, int64_t nb) {
    const __m128i mask = _mm_set1_epi8(0x0F), eight = _mm_set1_epi8(8);
    for (int64_t i = 0; i < nb; i++, b += 18, y += QK) {
        const __m256 d = _mm256_set1_ps(h2f(b));
        const __m128i x = _mm_loadu_si128((const __m128i *)(b + 2));
        const __m128i lo = _mm_sub_epi8(_mm_and_si128(x, mask), eight);                    /* elements 0..15 */
        const __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(x, 4), mask), eight); /* 16..31 */
        put8_i8(y + 0, lo, d);
        put8_i8(y + 8, _mm_srli_si128(lo, 8), d);
        put8_i8(y + 16, hi, d);
        put8_i8(y + 24, _mm_srli_si128(hi, 8), d);
    }
}

void toy_deq_q4_1_avx2(const uint8_t *b, float *y, int64_t nb) {
    const __m128i mask = _mm_set1_epi8(0x0F);
    for (int64_t i = 0; i < nb; i++, b += 20, y += QK) {
        const __m256 d = _mm256_set1_ps(h2f(b)), m = _mm256_set1_ps(h2f(b + 2));
        const __m128i x = _mm_loadu_si128((const __m128i *)(b + 4));
        const __m128i lo = _mm_and_si128(x, mask), hi = _mm_and_si128(_mm_srli_epi16(x, 4), mask);
        const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
        for (int k = 0; k < 4; k++) {
            const __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(parts[k]));
            _mm256_storeu_ps(y + 8 * k, _mm256_add_ps(_mm256_mul_ps(q, d), m));
        }
    }
}

/* A Q5_0 / Q5_1 block's 32 unsigned 5-bit values u: nibbles qs (16 bytes:
 * low ones elements 0-15, high ones 16-31) with bit e of qh as element e's
 * fifth bit */
static inline __m256i q5_values(const uint8_t *qs, uint32_t qh) {
    const __m128i mask = _mm_set1_epi8(0x0F);
    const __m128i x = _mm_loadu_si128((const __m128i *)qs);
    __m256i u = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(x, 4), mask), _mm_and_si128(x, mask));
    /* byte e of the fifth bits: qh's byte e / 8 (within each 128-bit lane), bit e % 8 */
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3,
                                            3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    __m256i h = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), spread);
    h = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(h, bit), bit), _mm256_set1_epi8(0x10));
    return _mm256_or_si256(u, h);
}

/* y = (u - off) d + m for the 32 values u (off 16 and no m: Q5_0; off 0: Q5_1) */
static inline void q5_store(__m256i u, int off, __m256 d, const __m256 *m, float *y) {
    const __m128i lo = _mm256_castsi256_si128(u), hi = _mm256_extracti128_si256(u, 1);
    const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    const __m256i o = _mm256_set1_epi32(off);
    for (int k = 0; k < 4; k++) {
        __m256 q = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_cvtepu8_epi32(parts[k]), o));
        __m256 v = _mm256_mul_ps(q, d);
        _mm256_storeu_ps(y + 8 * k, m ? _mm256_add_ps(v, *m) : v);
    }
}

void toy_deq_q5_0_avx2(const uint8_t *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += 22, y += QK) {
        uint32_t qh;
        memcpy(&qh, b + 2, 4);
        q5_store(q5_values(b + 6, qh), 16, _mm256_set1_ps(h2f(b)), NULL, y);
    }
}

void toy_deq_q5_1_avx2(const uint8_t *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += 24, y += QK) {
        uint32_t qh;
        memcpy(&qh, b + 4, 4);
        const __m256 m = _mm256_set1_ps(h2f(b + 2));
        q5_store(q5_values(b + 8, qh), 0, _mm256_set1_ps(h2f(b)), &m, y);
    }
}

void toy_deq_q4_k_avx2(const uint8_t *b, float *y, int64_t nb) {
    const __m256i mask = _mm256_set1_epi8(0x0F);
    for (int64_t i = 0; i < nb; i++, b += 144) {
        const float d = h2f(b), min = h2f(b + 2);
        const uint8_t *scales = b + 4, *q = b + 16;
        for (int j = 0; j < 4; j++, q += 32) {
            uint8_t sc, m;
            toy_q4k_scale_min(2 * j, scales, &sc, &m);
            const __m256 d1 = _mm256_set1_ps(d * sc), m1 = _mm256_set1_ps(min * m);
            toy_q4k_scale_min(2 * j + 1, scales, &sc, &m);
            const __m256 d2 = _mm256_set1_ps(d * sc), m2 = _mm256_set1_ps(min * m);
            const __m256i x = _mm256_loadu_si256((const __m256i *)q);
            const __m256i lo = _mm256_and_si256(x, mask), hi = _mm256_and_si256(_mm256_srli_epi16(x, 4), mask);
            const __m128i l0 = _mm256_castsi256_si128(lo), l1 = _mm256_extracti128_si256(lo, 1);
            const __m128i h0 = _mm256_castsi256_si128(hi), h1 = _mm256_extracti128_si256(hi, 1);
            put8_dm(y + 0, _mm256_cvtepu8_epi32(l0), d1, m1);
            put8_dm(y + 8, _mm256_cvtepu8_epi32(_mm_srli_si128(l0, 8)), d1, m1);
            put8_dm(y + 16, _mm256_cvtepu8_epi32(l1), d1, m1);
            put8_dm(y + 24, _mm256_cvtepu8_epi32(_mm_srli_si128(l1, 8)), d1, m1);
            put8_dm(y + 32, _mm256_cvtepu8_epi32(h0), d2, m2);
            put8_dm(y + 40, _mm256_cvtepu8_epi32(_mm_srli_si128(h0, 8)), d2, m2);
            put8_dm(y + 48, _mm256_cvtepu8_epi32(h1), d2, m2);
            put8_dm(y + 56, _mm256_cvtepu8_epi32(_mm_srli_si128(h1, 8)), d2, m2);
            y += 64;
        }
    }
}

void toy_deq_q5_k_avx2(const uint8_t *b, float *y, int64_t nb) {
    const __m256i mask = _mm256_set1_epi32(0x0F);
    for (int64_t i = 0; i < nb; i++, b += 176) {
        const float d = h2f(b), min = h2f(b + 2);
        const uint8_t *scales = b + 4, *qh = b + 16, *ql = b + 48;
        for (int j = 0; j < 4; j++, ql += 32) {
            uint8_t sc, m;
            toy_q4k_scale_min(2 * j, scales, &sc, &m);
            const __m256 d1 = _mm256_set1_ps(d * sc), m1 = _mm256_set1_ps(min * m);
            toy_q4k_scale_min(2 * j + 1, scales, &sc, &m);
            const __m256 d2 = _mm256_set1_ps(d * sc), m2 = _mm256_set1_ps(min * m);
            const __m256i sh1 = _mm256_set1_epi32(2 * j), sh2 = _mm256_set1_epi32(2 * j + 1);
            const __m256i one = _mm256_set1_epi32(1);
            for (int l = 0; l < 32; l += 8) {
                const __m256i x = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(ql + l)));
                const __m256i h = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(qh + l)));
                /* + 16 where bit (2j) / (2j+1) of qh is set */
                const __m256i b1 = _mm256_slli_epi32(_mm256_and_si256(_mm256_srlv_epi32(h, sh1), one), 4);
                const __m256i b2 = _mm256_slli_epi32(_mm256_and_si256(_mm256_srlv_epi32(h, sh2), one), 4);
                put8_dm(y + l, _mm256_add_epi32(_mm256_and_si256(x, mask), b1), d1, m1);
                put8_dm(y + 32 + l, _mm256_add_epi32(_mm256_srli_epi32(x, 4), b2), d2, m2);
            }
            y += 64;
        }
    }
}

void toy_deq_q6_k_avx2(const uint8_t *b, float *y, int64_t nb) {
    const __m256i m4 = _mm256_set1_epi32(0x0F), m2 = _mm256_set1_epi32(3), c32 = _mm256_set1_epi32(32);
    for (int64_t i = 0; i < nb; i++, b += 210) {
        const float d = h2f(b + 208);
        const uint8_t *ql = b, *qh = b + 128;
        const int8_t *sc = (const int8_t *)(b + 192);
        for (int n = 0; n < QK_K; n += 128, y += 128, ql += 64, qh += 32, sc += 8) {
            for (int l = 0; l < 32; l += 8) {
                const int is = l / 16;
                const __m256i a = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(ql + l)));
                const __m256i c = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(ql + l + 32)));
                const __m256i h = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(qh + l)));
                const __m256i q1 = _mm256_sub_epi32(
                    _mm256_or_si256(_mm256_and_si256(a, m4), _mm256_slli_epi32(_mm256_and_si256(h, m2), 4)), c32);
                const __m256i q2 = _mm256_sub_epi32(
                    _mm256_or_si256(_mm256_and_si256(c, m4),
                                    _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(h, 2), m2), 4)), c32);
                const __m256i q3 = _mm256_sub_epi32(
                    _mm256_or_si256(_mm256_srli_epi32(a, 4),
                                    _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(h, 4), m2), 4)), c32);
                const __m256i q4 = _mm256_sub_epi32(
                    _mm256_or_si256(_mm256_srli_epi32(c, 4),
                                    _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(h, 6), m2), 4)), c32);
                /* (d * sc) * q, as the scalar code groups it */
                _mm256_storeu_ps(y + l, _mm256_mul_ps(_mm256_set1_ps(d * sc[is + 0]), _mm256_cvtepi32_ps(q1)));
                _mm256_storeu_ps(y + l + 32, _mm256_mul_ps(_mm256_set1_ps(d * sc[is + 2]), _mm256_cvtepi32_ps(q2)));
                _mm256_storeu_ps(y + l + 64, _mm256_mul_ps(_mm256_set1_ps(d * sc[is + 4]), _mm256_cvtepi32_ps(q3)));
                _mm256_storeu_ps(y + l + 96, _mm256_mul_ps(_mm256_set1_ps(d * sc[is + 6]), _mm256_cvtepi32_ps(q4)));
            }
        }
    }
}

/* The IQ4 codebook value nearest each lane of v, and its index, as
 * quant.c's iq4_index finds them: hi counts the values not above v (NaN:
 * all of them), at least 1, then v - val[hi - 1] < val[hi] - v picks. */
struct iq4_tab {
    __m256 lo, hi; /* codebook values 0..7, 8..15 */
};

static inline struct iq4_tab iq4_tab(void) {
    struct iq4_tab t = {
        _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)toy_iq4_codebook))),
        _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(toy_iq4_codebook + 8))))};
    return t;
}

static inline __m256 iq4_lookup(struct iq4_tab t, __m256i i) {
    return _mm256_blendv_ps(_mm256_permutevar8x32_ps(t.lo, i), _mm256_permutevar8x32_ps(t.hi, i),
                            _mm256_castsi256_ps(_mm256_cmpgt_epi32(i, _mm256_set1_epi32(7))));
}

static inline __m256 iq4_nearest(struct iq4_tab t, __m256 v, __m256i *index) {
    const __m256i one = _mm256_set1_epi32(1);
    __m256i hi = _mm256_setzero_si256();
    for (int k = 0; k < 15; k++) /* a lane's mask is -1 where !(v < val[k]) */
        hi = _mm256_sub_epi32(
            hi, _mm256_castps_si256(_mm256_cmp_ps(v, _mm256_set1_ps((float)toy_iq4_codebook[k]), _CMP_NLT_UQ)));
    hi = _mm256_max_epi32(hi, one);
    const __m256i lo = _mm256_sub_epi32(hi, one);
    const __m256 vlo = iq4_lookup(t, lo), vhi = iq4_lookup(t, hi);
    const __m256 nearer_lo = _mm256_cmp_ps(_mm256_sub_ps(v, vlo), _mm256_sub_ps(vhi, v), _CMP_LT_OQ);
    *index = _mm256_blendv_epi8(hi, lo, _mm256_castps_si256(nearer_lo));
    return _mm256_blendv_ps(vhi, vlo, nearer_lo);
}

/* iq4_fit's sums (quant.c toy_iq4_sums_ref): the 16 trial scales in two
 * vectors of 8 lanes, the 32 values in order, so each lane adds what the
 * scalar loop adds in the same order. */
void toy_iq4_sums_avx2(const float *x, const float *id, float *sqx, float *sq2) {
    const struct iq4_tab t = iq4_tab();
    for (int h = 0; h < 2; h++) {
        const __m256 vid = _mm256_loadu_ps(id + 8 * h);
        __m256 s_qx = _mm256_setzero_ps(), s_q2 = _mm256_setzero_ps();
        for (int j = 0; j < 32; j++) {
            const __m256 xj = _mm256_set1_ps(x[j]), w = _mm256_set1_ps(x[j] * x[j]);
            __m256i idx;
            const __m256 q = iq4_nearest(t, _mm256_mul_ps(vid, xj), &idx);
            const __m256 wq = _mm256_mul_ps(w, q);
            s_qx = _mm256_add_ps(s_qx, _mm256_mul_ps(wq, xj));
            s_q2 = _mm256_add_ps(s_q2, _mm256_mul_ps(wq, q));
        }
        _mm256_storeu_ps(sqx + 8 * h, s_qx);
        _mm256_storeu_ps(sq2 + 8 * h, s_q2);
    }
}

/* quant.c toy_iq4_indices_ref: the codebook index nearest id x[j] of each
 * of 32 values */
void toy_iq4_indices_avx2(const float *x, float id, uint8_t *L) {
    const struct iq4_tab t = iq4_tab();
    const __m256 vid = _mm256_set1_ps(id);
    for (int j = 0; j < 32; j += 8) {
        __m256i idx;
        (void)iq4_nearest(t, _mm256_mul_ps(vid, _mm256_loadu_ps(x + j)), &idx);
        const __m128i w16 = _mm_packus_epi32(_mm256_castsi256_si128(idx), _mm256_extracti128_si256(idx, 1));
        _mm_storel_epi64((__m128i *)(L + j), _mm_packus_epi16(w16, w16));
    }
}
