/* gemm-bf16-avx512.c: C = A B^T over bfloat16 operands with f32
 * accumulation, using AVX-512 BF16 dot products (vdpbf16ps: 32 products of
 * bf16 pairs summed into 16 f32 lanes per instruction).
 *
 * Both operands are packed as rows of kp bf16 (k zero-padded to a multiple
 * of 32), so the inner loop is a plain dot product: a 4x4 block of C keeps 16
 * accumulators and does 16 vdpbf16ps per 8 loads. Rows are padded to a
 * multiple of 4 with zeros; only valid C entries are written.
 * Only called when the CPU reports avx512_bf16 (see matmul.c).
 */
#include <immintrin.h>
#include <stdint.h>

#include "backends/cpu/cpu-impl.h"

void toy_gemm_bf16_packed(int64_t m, int64_t n, int64_t kp, const uint16_t *A, const uint16_t *B, float *C,
                          int64_t ldc, float beta) {
    const int64_t nb_chunk = 64; /* B rows kept hot in L1/L2 while all of A streams */
    for (int64_t j0 = 0; j0 < n; j0 += nb_chunk) {
        int64_t j1 = j0 + nb_chunk < n ? j0 + nb_chunk : n;
        for (int64_t i = 0; i < m; i += 4) {
            const uint16_t *a0 = A + i * kp, *a1 = a0 + kp, *a2 = a1 + kp, *a3 = a2 + kp;
            for (int64_t j = j0; j < j1; j += 4) {
                const uint16_t *b0 = B + j * kp, *b1 = b0 + kp, *b2 = b1 + kp, *b3 = b2 + kp;
                /* 16 named accumulators so they stay in registers */
                __m512 c00 = _mm512_setzero_ps(), c01 = c00, c02 = c00, c03 = c00, c10 = c00, c11 = c00,
                       c12 = c00, c13 = c00, c20 = c00, c21 = c00, c22 = c00, c23 = c00, c30 = c00, c31 = c00,
                       c32 = c00, c33 = c00;
                for (int64_t k = 0; k < kp; k += 32) {
                    __m512bh x0 = (__m512bh)_mm512_loadu_si512(a0 + k), x1 = (__m512bh)_mm512_loadu_si512(a1 + k),
                             x2 = (__m512bh)_mm512_loadu_si512(a2 + k), x3 = (__m512bh)_mm512_loadu_si512(a3 + k);
                    __m512bh y0 = (__m512bh)_mm512_loadu_si512(b0 + k), y1 = (__m512bh)_mm512_loadu_si512(b1 + k),
                             y2 = (__m512bh)_mm512_loadu_si512(b2 + k), y3 = (__m512bh)_mm512_loadu_si512(b3 + k);
                    c00 = _mm512_dpbf16_ps(c00, x0, y0); c01 = _mm512_dpbf16_ps(c01, x0, y1);
                    c02 = _mm512_dpbf16_ps(c02, x0, y2); c03 = _mm512_dpbf16_ps(c03, x0, y3);
                    c10 = _mm512_dpbf16_ps(c10, x1, y0); c11 = _mm512_dpbf16_ps(c11, x1, y1);
                    c12 = _mm512_dpbf16_ps(c12, x1, y2); c13 = _mm512_dpbf16_ps(c13, x1, y3);
                    c20 = _mm512_dpbf16_ps(c20, x2, y0); c21 = _mm512_dpbf16_ps(c21, x2, y1);
                    c22 = _mm512_dpbf16_ps(c22, x2, y2); c23 = _mm512_dpbf16_ps(c23, x2, y3);
                    c30 = _mm512_dpbf16_ps(c30, x3, y0); c31 = _mm512_dpbf16_ps(c31, x3, y1);
                    c32 = _mm512_dpbf16_ps(c32, x3, y2); c33 = _mm512_dpbf16_ps(c33, x3, y3);
                }
                __m512 c[16] = {c00, c01, c02, c03, c10, c11, c12, c13, c20, c21, c22, c23, c30, c31, c32, c33};
                for (int x = 0; x < 4 && i + x < m; x++)
                    for (int y = 0; y < 4 && j + y < j1; y++) {
                        float v = _mm512_reduce_add_ps(c[x * 4 + y]);
                        float *out = C + (i + x) * ldc + j + y;
                        *out = beta != 0 ? *out * beta + v : v;
                    }
            }
        }
    }
}

/* f32 row -> bf16 row, rounded to nearest even, zero padded to kp */
void toy_pack_f32_bf16(const float *x, int64_t k, uint16_t *y, int64_t kp) {
    int64_t i = 0;
    for (; i + 32 <= k; i += 32) {
        __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(x + i));
        _mm512_storeu_si512(y + i, (__m512i)v);
    }
    for (; i < k; i++) y[i] = toy_f32_to_bf16(x[i]);
    for (; i < kp; i++) y[i] = 0;
}
