/* gemv-avx2.c: y = W x (+ y) over f32 rows, for decode (one activation
 * row): each weight row is one front-to-back stream and is read with
 * 16-byte loads into four independent FMA chains. On this Zen 4 a single
 * thread streams weights this way at 24-28 GB/s, where OpenBLAS's
 * single-threaded sgemv reaches 13-15 (and 512-bit loads ~20): narrower
 * loads let the hardware prefetchers run further ahead. Reference:
 * cblas_sgemv (matmul.c uses it where this is not available). */
#include <immintrin.h>
#include <stdbool.h>
#include <stdint.h>

#include "backends/cpu/cpu-impl.h"
#include "backends/cpu/qdot.h"

static inline float dot(const float *w, const float *x, int64_t k, int ahead) {
    __m128 s0 = _mm_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t i = 0;
    for (; i + 16 <= k; i += 16) {
        if (ahead) _mm_prefetch((const char *)(w + i) + ahead, _MM_HINT_T0);
        s0 = _mm_fmadd_ps(_mm_loadu_ps(w + i), _mm_loadu_ps(x + i), s0);
        s1 = _mm_fmadd_ps(_mm_loadu_ps(w + i + 4), _mm_loadu_ps(x + i + 4), s1);
        s2 = _mm_fmadd_ps(_mm_loadu_ps(w + i + 8), _mm_loadu_ps(x + i + 8), s2);
        s3 = _mm_fmadd_ps(_mm_loadu_ps(w + i + 12), _mm_loadu_ps(x + i + 12), s3);
    }
    for (; i + 4 <= k; i += 4) s0 = _mm_fmadd_ps(_mm_loadu_ps(w + i), _mm_loadu_ps(x + i), s0);
    __m128 s = _mm_add_ps(_mm_add_ps(s0, s1), _mm_add_ps(s2, s3));
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
