/* qdot-avx512.c: Q8_0 x Q8_0 and Q4_0 x Q8_0 block dot products with
 * AVX-512 VNNI on 256-bit vectors (vpdpbusd wants unsigned x signed: the
 * usual |w| x sign(x, w) rewrite keeps it exact). Reference: qdot.c. */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "backends/cpu/qdot.h"

static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline float f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

static inline __m256 block_dot(__m256i w, __m256i x, float scale, __m256 acc) {
    __m256i aw = _mm256_abs_epi8(w);
    __m256i sx = _mm256_sign_epi8(x, w);
    __m256i dot = _mm256_dpbusd_epi32(_mm256_setzero_si256(), aw, sx);
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(scale), acc);
}

#define LD(p) _mm256_loadu_si256((const __m256i *)(p))
static float q8_0(const void *wv, const void *xv, int64_t n) {
    const uint8_t *w = wv, *x = xv;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t nb = n / 32, b = 0;
    for (; b + 3 < nb; b += 4, w += 136, x += 136) {
        a0 = block_dot(LD(w + 2), LD(x + 2), f16(w) * f16(x), a0);
        a1 = block_dot(LD(w + 36), LD(x + 36), f16(w + 34) * f16(x + 34), a1);
        a2 = block_dot(LD(w + 70), LD(x + 70), f16(w + 68) * f16(x + 68), a2);
        a3 = block_dot(LD(w + 104), LD(x + 104), f16(w + 102) * f16(x + 102), a3);
    }
    for (; b < nb; b++, w += 34, x += 34) a0 = block_dot(LD(w + 2), LD(x + 2), f16(w) * f16(x), a0);
    return hsum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
}

static inline __m256i unpack_q4(const uint8_t *q) {
    __m128i v = _mm_loadu_si128((const __m128i *)q);
    __m256i both = _mm256_set_m128i(_mm_srli_epi16(v, 4), v);
    return _mm256_sub_epi8(_mm256_and_si256(both, _mm256_set1_epi8(15)), _mm256_set1_epi8(8));
}

static float q4_0(const void *wv, const void *xv, int64_t n) {
    const uint8_t *w = wv, *x = xv;
    /* four independent accumulators: one chain would be latency-bound */
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t nb = n / 32, b = 0;
    for (; b + 3 < nb; b += 4, w += 72, x += 136) {
        a0 = block_dot(unpack_q4(w + 2), _mm256_loadu_si256((const __m256i *)(x + 2)), f16(w) * f16(x), a0);
        a1 = block_dot(unpack_q4(w + 20), _mm256_loadu_si256((const __m256i *)(x + 36)), f16(w + 18) * f16(x + 34), a1);
        a2 = block_dot(unpack_q4(w + 38), _mm256_loadu_si256((const __m256i *)(x + 70)), f16(w + 36) * f16(x + 68), a2);
        a3 = block_dot(unpack_q4(w + 56), _mm256_loadu_si256((const __m256i *)(x + 104)), f16(w + 54) * f16(x + 102), a3);
    }
    for (; b < nb; b++, w += 18, x += 34)
        a0 = block_dot(unpack_q4(w + 2), _mm256_loadu_si256((const __m256i *)(x + 2)), f16(w) * f16(x), a0);
    return hsum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
}

void toy_qdot_fill_avx512(struct toy_qdot_ops *ops) {
    ops->q8_0 = q8_0;
    ops->q4_0 = q4_0;
}
