/* gemv-avx512.c: the f32 decode GEMV of gemv-avx2.c with one 64-byte
 * weight load per step instead of 16-byte ones, for CPUs whose prefetchers
 * stream wide loads faster (toy_cpu_wide_loads: on an Emerald Rapids Xeon,
 * SmolLM2-135M f32 decode on 2 threads runs 49 tok/s this way against 35
 * with 16-byte loads; on a Zen 4 the narrow loads are the faster). Same
 * arithmetic as the reference, cblas_sgemv, up to the order of the sums.
 * The f16 GEMV has no such variant: there vcvtph2ps, not the loads, sets
 * the pace (~15 bytes a cycle from cache with either width, one row or
 * four at a time), and 64-byte loads measured even in decode. */
#include <immintrin.h>
#include <stdbool.h>
#include <stdint.h>

#include "backends/cpu/cpu-impl.h"
#include "backends/cpu/qdot.h"

static inline float dot(const float *w, const float *x, int64_t k, int ahead) {
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t i = 0;
    for (; i + 64 <= k; i += 64) {
        if (ahead)
            for (int o = 0; o < 256; o += 64) _mm_prefetch((const char *)(w + i) + ahead + o, _MM_HINT_T0);
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i), _mm512_loadu_ps(x + i), s0);
        s1 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i + 16), _mm512_loadu_ps(x + i + 16), s1);
        s2 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i + 32), _mm512_loadu_ps(x + i + 32), s2);
        s3 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i + 48), _mm512_loadu_ps(x + i + 48), s3);
    }
    for (; i + 16 <= k; i += 16) s0 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i), _mm512_loadu_ps(x + i), s0);
    if (i < k) {
        __mmask16 m = (__mmask16)((1u << (k - i)) - 1);
        s1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, w + i), _mm512_maskz_loadu_ps(m, x + i), s1);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
}

void toy_gemv_f32_avx512(const float *w, int64_t ldw, const float *x, int64_t k, float *y, int64_t n, bool accum,
                         struct toy_pf_cursor *pc) {
    TOY_GEMV_ROWS(dot, w, ldw, x, k, y, n, accum, pc);
}
