/* quant-impl.h: the SIMD dequantizers quant.c dispatches to at run time
 * (internal to libtoy). Each matches its scalar reference in quant.c bit
 * for bit; nb is the number of blocks. */
#ifndef TOY_QUANT_IMPL_H
#define TOY_QUANT_IMPL_H

#include <stdint.h>

/* 6-bit scale and min j (0..7) of a Q4_K / Q5_K super-block's 12 packed
 * bytes q (ggml's get_scale_min_k4); the dequantizers and the packed int8
 * kernels (backends/cpu/qdot.c) share it */
static inline void toy_q4k_scale_min(int j, const uint8_t *q, uint8_t *d, uint8_t *m) {
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

void toy_deq_q8_0_avx2(const uint8_t *b, float *y, int64_t nb);
void toy_deq_q4_0_avx2(const uint8_t *b, float *y, int64_t nb);
void toy_deq_q4_1_avx2(const uint8_t *b, float *y, int64_t nb);
void toy_deq_q5_0_avx2(const uint8_t *b, float *y, int64_t nb);
void toy_deq_q5_1_avx2(const uint8_t *b, float *y, int64_t nb);
void toy_deq_q4_k_avx2(const uint8_t *b, float *y, int64_t nb);
void toy_deq_q5_k_avx2(const uint8_t *b, float *y, int64_t nb);
void toy_deq_q6_k_avx2(const uint8_t *b, float *y, int64_t nb);

#endif
