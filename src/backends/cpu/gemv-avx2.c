/* gemv-avx2.c: y = W x (+ y) over f32 rows, for decode (one activation
 * row): each weight row is one front-to-back stream and is read with
 * 32-byte loads into two FMA chains of 8 lanes, summed as four chains of
 * 4 lanes would be. On this Zen 4 a single thread streams weights with
 * 16-byte loads at 24-28 GB/s, where OpenBLAS's single-threaded sgemv
 * reaches 13-15 (and 64-byte loads ~20): narrower loads let the hardware
 * prefetchers run further ahead. 32-byte loads, with half the
 * instructions, took SmolLM2-135M F32 decode steps 1.7% less time than
 * 16-byte ones (five runs, the two alternated step by step in each run).
 * Reference: cblas_sgemv (matmul.c uses it where this is not available). */
#include <immintrin.h>
#include <stdbool.h>
#include <stdint.h>

#include "backends/cpu/cpu-impl.h"
#include "backends/cpu/qdot.h"

/* lanes 0-3 of the first chain, 4-7 of it, 0-3 of the second and 4-7 of
 * it are the four 4-lane chains of the 16-byte form (c0 .. c3); they are
 * added as it added them, (c0 + c1) + (c2 + c3), so both give the same
 * bits */
static inline float dot(const float *w, const float *x, int64_t k, int ahead) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0;
    int64_t i = 0;
    for (; i + 16 <= k; i += 16) {
        if (ahead) _mm_prefetch((const char *)(w + i) + ahead, _MM_HINT_T0);
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 8), _mm256_loadu_ps(x + i + 8), s1);
    }
    __m128 c0 = _mm256_castps256_ps128(s0);
    for (; i + 4 <= k; i += 4) c0 = _mm_fmadd_ps(_mm_loadu_ps(w + i), _mm_loadu_ps(x + i), c0);
    __m128 s = _mm_add_ps(_mm_add_ps(c0, _mm256_extractf128_ps(s0, 1)),
                          _mm_add_ps(_mm256_castps256_ps128(s1), _mm256_extractf128_ps(s1, 1)));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    float r = _mm_cvtss_f32(s);
    for (; i < k; i++) r += w[i] * x[i];
    return r;
}

void toy_gemv_f32_avx2(const float *w, int64_t ldw, const float *x, int64_t k, float *y, int64_t n, bool accum,
                       struct toy_pf_cursor *pc) {
    TOY_GEMV_ROWS(dot, w, ldw, x, k, y, n, accum, pc);
}

/* The same over f16 weight rows (F16C converts them exactly to f32): the
 * arithmetic of converting the rows and calling the f32 product, without
 * the f32 copy. */
static inline float dot_f16(const uint16_t *w, const float *x, int64_t k, int ahead) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t i = 0;
    for (; i + 32 <= k; i += 32) {
        if (ahead) _mm_prefetch((const char *)(w + i) + ahead, _MM_HINT_T0);
        s0 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + i))), _mm256_loadu_ps(x + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + i + 8))), _mm256_loadu_ps(x + i + 8), s1);
        s2 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + i + 16))), _mm256_loadu_ps(x + i + 16), s2);
        s3 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + i + 24))), _mm256_loadu_ps(x + i + 24), s3);
    }
    for (; i + 8 <= k; i += 8)
        s0 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + i))), _mm256_loadu_ps(x + i), s0);
    __m256 s = _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3));
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    float r = _mm_cvtss_f32(h);
    for (; i < k; i++) r += _cvtsh_ss(w[i]) * x[i];
    return r;
}

void toy_gemv_f16_avx2(const uint16_t *w, int64_t ldw, const float *x, int64_t k, float *y, int64_t n, bool accum,
                       struct toy_pf_cursor *pc) {
    TOY_GEMV_ROWS(dot_f16, w, ldw, x, k, y, n, accum, pc);
}

/* The same over bf16 weight rows (widened exactly by a 16-bit shift), for
 * CPUs without AVX-512 BF16: decode of a bf16 model streams its rows once
 * with no f32 copy (before: rows widened into a buffer for an sgemm). */
static inline __m256 bf16x8(const uint16_t *w) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)w)), 16));
}

static inline float dot_bf16(const uint16_t *w, const float *x, int64_t k, int ahead) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t i = 0;
    for (; i + 32 <= k; i += 32) {
        if (ahead) _mm_prefetch((const char *)(w + i) + ahead, _MM_HINT_T0);
        s0 = _mm256_fmadd_ps(bf16x8(w + i), _mm256_loadu_ps(x + i), s0);
        s1 = _mm256_fmadd_ps(bf16x8(w + i + 8), _mm256_loadu_ps(x + i + 8), s1);
        s2 = _mm256_fmadd_ps(bf16x8(w + i + 16), _mm256_loadu_ps(x + i + 16), s2);
        s3 = _mm256_fmadd_ps(bf16x8(w + i + 24), _mm256_loadu_ps(x + i + 24), s3);
    }
    for (; i + 8 <= k; i += 8) s0 = _mm256_fmadd_ps(bf16x8(w + i), _mm256_loadu_ps(x + i), s0);
    __m256 s = _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3));
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    float r = _mm_cvtss_f32(h);
    for (; i < k; i++) r += toy_bf16_to_f32(w[i]) * x[i];
    return r;
}

void toy_gemv_bf16_avx2(const uint16_t *w, int64_t ldw, const float *x, int64_t k, float *y, int64_t n, bool accum,
                        struct toy_pf_cursor *pc) {
    TOY_GEMV_ROWS(dot_bf16, w, ldw, x, k, y, n, accum, pc);
}
