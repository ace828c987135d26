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

/* Q8_0 quantization of activations, bit for bit as toy_quantize_q8_0_ref:
 * d = max|x| / 127 (stored as f16, round to nearest even), q = roundf(x / d)
 * computed as x * (1 / d) with ties away from zero. */
static void quantize_q8_0(const float *x, void *yv, int64_t n) {
    uint8_t *y = yv;
    const __m512 absmask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
    for (int64_t blk = 0; blk < n / 32; blk++, x += 32, y += 34) {
        __m512 a = _mm512_loadu_ps(x), b = _mm512_loadu_ps(x + 16);
        float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_and_ps(a, absmask), _mm512_and_ps(b, absmask)));
        float d = amax / 127.0f, id = d ? 1.0f / d : 0.0f;
        uint16_t h = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
        memcpy(y, &h, 2);
        __m512 vid = _mm512_set1_ps(id);
        __m128i out[2];
        for (int half = 0; half < 2; half++) {
            __m512 t = _mm512_mul_ps(half ? b : a, vid);
            __m512 r = _mm512_roundscale_ps(t, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
            __mmask16 up = _mm512_cmp_ps_mask(_mm512_and_ps(_mm512_sub_ps(t, r), absmask), _mm512_set1_ps(0.5f),
                                              _CMP_GE_OQ);
            /* r + sign(t) where the dropped fraction is at least one half */
            __m512 one = _mm512_or_ps(_mm512_set1_ps(1.0f), _mm512_andnot_ps(absmask, t));
            r = _mm512_mask_add_ps(r, up, r, one);
            out[half] = _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(r));
        }
        _mm_storeu_si128((__m128i *)(y + 2), out[0]);
        _mm_storeu_si128((__m128i *)(y + 18), out[1]);
    }
}

void toy_qgemm_avx512(enum toy_dtype bt, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                      const void *b, size_t ldb, float *c, int64_t ldc, bool accum, void *scratch);

void toy_qgemm_packed_avx512(enum toy_dtype bt, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                             const void *packed, float *c, int64_t ldc, bool accum, void *scratch,
                             const struct toy_prefetch *pf);

void toy_qgemm_packed_prep_avx512(enum toy_dtype bt, int64_t m, int64_t k, const float *a, int64_t lda,
                                  void *scratch);
void toy_qgemm_packed_cols_avx512(enum toy_dtype bt, int64_t m, int64_t n, int64_t k, const void *packed, float *c,
                                  int64_t ldc, bool accum, void *scratch, struct toy_pf_cursor *pc);

void toy_qdot_fill_avx512(struct toy_qdot_ops *ops) {
    ops->q8_0 = q8_0;
    ops->q4_0 = q4_0;
    ops->qgemm = toy_qgemm_avx512;
    ops->qgemm_packed = toy_qgemm_packed_avx512;
    ops->qgemm_packed_prep = toy_qgemm_packed_prep_avx512;
    ops->qgemm_packed_cols = toy_qgemm_packed_cols_avx512;
    ops->quantize_q8_0 = quantize_q8_0;
}
