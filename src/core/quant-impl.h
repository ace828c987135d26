/* quant-impl.h: the SIMD dequantizers quant.c dispatches to at run time
 * (internal to libtoy). Each matches its scalar reference in quant.c bit
 * for bit; nb is the number of blocks. */
#ifndef TOY_QUANT_IMPL_H
#define TOY_QUANT_IMPL_H

#include <stdint.h>

void toy_deq_q8_0_avx2(const uint8_t *b, float *y, int64_t nb);
void toy_deq_q4_0_avx2(const uint8_t *b, float *y, int64_t nb);
void toy_deq_q4_1_avx2(const uint8_t *b, float *y, int64_t nb);
void toy_deq_q5_0_avx2(const uint8_t *b, float *y, int64_t nb);
void toy_deq_q5_1_avx2(const uint8_t *b, float *y, int64_t nb);
void toy_deq_q4_k_avx2(const uint8_t *b, float *y, int64_t nb);
void toy_deq_q5_k_avx2(const uint8_t *b, float *y, int64_t nb);
void toy_deq_q6_k_avx2(const uint8_t *b, float *y, int64_t nb);

#endif
