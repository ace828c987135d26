/* qdot-avx2.c: Q8_0 x Q8_0 and Q4_0 x Q8_0 block dot products with AVX2
 * (maddubs on |w| x sign(x, w), then madd to int32). Reference: qdot.c. */
#include <immintrin.h>
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
    __m256i p16 = _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(x, w));
    __m256i p32 = _mm256_madd_epi16(p16, _mm256_set1_epi16(1));
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(p32), _mm256_set1_ps(scale), acc);
}

static float q8_0(const void *wv, const void *xv, int64_t n) {
    const uint8_t *w = wv, *x = xv;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / 32; b++, w += 34, x += 34)
        acc = block_dot(_mm256_loadu_si256((const __m256i *)(w + 2)), _mm256_loadu_si256((const __m256i *)(x + 2)),
                        f16(w) * f16(x), acc);
    return hsum8(acc);
}

static float q4_0(const void *wv, const void *xv, int64_t n) {
    const uint8_t *w = wv, *x = xv;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / 32; b++, w += 18, x += 34) {
        __m128i v = _mm_loadu_si128((const __m128i *)(w + 2));
        __m256i both = _mm256_set_m128i(_mm_srli_epi16(v, 4), v);
        __m256i q = _mm256_sub_epi8(_mm256_and_si256(both, _mm256_set1_epi8(15)), _mm256_set1_epi8(8));
        acc = block_dot(q, _mm256_loadu_si256((const __m256i *)(x + 2)), f16(w) * f16(x), acc);
    }
    return hsum8(acc);
}

void toy_qdot_fill_qgemm_avx2(struct toy_qdot_ops *ops); /* qgemm-avx2.c */

void toy_qdot_fill_avx2(struct toy_qdot_ops *ops) {
    ops->q8_0 = q8_0;
    ops->q4_0 = q4_0;
    toy_qdot_fill_qgemm_avx2(ops);
}
