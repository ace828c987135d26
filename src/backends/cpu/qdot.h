/* qdot.h: quantized dot products for GEMV over Q8_0 / Q4_0 weights (qdot.c). */
#ifndef TOY_QDOT_H
#define TOY_QDOT_H

#include <stdbool.h>
#include <stdint.h>

#include "toy/dtype.h"

struct toy_qdot_ops {
    float (*q8_0)(const void *w, const void *x_q8, int64_t n); /* n: multiple of 32 */
    float (*q4_0)(const void *w, const void *x_q8, int64_t n);
    void (*quantize_q8_0)(const float *x, void *y, int64_t n);
    /* C (m x n, ldc floats) = or += Q8_0(A) (m x k, lda floats) times B^T,
     * B: n rows of k Q8_0/Q4_0 elements, ldb bytes apart; k a multiple of
     * 32; scratch: toy_qgemm_scratch(m, k) bytes, 64-aligned. NULL where the
     * CPU has no AVX-512 VNNI (then dequantize + sgemm is the fast way). */
    void (*qgemm)(enum toy_dtype bt, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const void *b,
                  size_t ldb, float *c, int64_t ldc, bool accum, void *scratch);
};
extern struct toy_qdot_ops toy_qdot;
void toy_qdot_init(void);

float toy_qdot_q8_0_ref(const void *w, const void *x, int64_t n);
float toy_qdot_q4_0_ref(const void *w, const void *x, int64_t n);
void toy_quantize_q8_0_ref(const float *x, void *y, int64_t n);
/* What qgemm computes, element by element: A's rows quantized with
 * quantize_q8_0, then c_ij = sum over blocks in order of
 * fmaf((float)dot_int(w_jb, x_ib), d_w * d_x, c) — qgemm matches it exactly. */
void toy_qgemm_ref(enum toy_dtype bt, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const void *b,
                   size_t ldb, float *c, int64_t ldc, bool accum);
size_t toy_qgemm_scratch(int64_t m, int64_t k);

#endif
