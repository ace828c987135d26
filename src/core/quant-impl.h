/* quant-impl.h: the SIMD dequantizers quant.c dispatches to at run time
 * (internal to libtoy). Each matches its scalar reference in quant.c bit
 * for bit; nb is the number of blocks. */
#ifndef TOY_QUANT_IMPL_H
#define TOY_QUANT_IMPL_H

#include <stdint.h>

#include "toy/dtype.h"

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

/* the 16 scales of a Q3_K super-block b (its 110 bytes), minus 32: 6 bits
 * each, the low 4 in bytes 96..103, the top 2 in 104..107 */
static inline void toy_q3k_scales(const uint8_t *b, int8_t sc[16]) {
    const uint8_t *s = b + 96;
    for (int i = 0; i < 16; i++) {
        int lo = i < 8 ? s[i] & 15 : s[i - 8] >> 4, hi = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
        sc[i] = (int8_t)((lo | hi << 4) - 32);
    }
}

/* IQ4_NL's and IQ4_XS's non-linear 4-bit codebook (ggml's kvalues_iq4nl) */
#define TOY_IQ4_VALUES -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113
static const int8_t toy_iq4_codebook[16] = {TOY_IQ4_VALUES};

/* MXFP4's 16 values (ggml's kvalues_mxfp4): the E2M1 code points doubled,
 * so that they are integers; nibble bit 3 is the sign. A block's weights
 * are value x 2^(e - 128), e its E8M0 byte (the halving undoes the
 * doubling: the OCP MX scale is 2^(e - 127)). */
#define TOY_MXFP4_VALUES 0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12
static const int8_t toy_mxfp4_values[16] = {TOY_MXFP4_VALUES};

/* 2^(e - 128) exactly, as an f32 bit pattern (ggml's E8M0 to fp32 half):
 * (e - 1) << 23 for e >= 2, the subnormals 2^-127 and 2^-128 for e = 1, 0 */
static inline float toy_e8m0_half(uint8_t e) {
    return toy_bits_f32(e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23);
}

/* the 6-bit scale of sub-block ib (0..7) of an IQ4_XS super-block b (its
 * 136 bytes): the sub-block's elements are d (scale - 32) codebook[q] */
static inline int toy_iq4xs_scale(const uint8_t *b, int ib) {
    uint16_t h = (uint16_t)(b[2] | b[3] << 8);
    return ((b[4 + ib / 2] >> 4 * (ib % 2)) & 0xf) | (((h >> 2 * ib) & 3) << 4);
}

void toy_deq_q8_0_avx2(const uint8_t *b, float *y, int64_t nb);
void toy_deq_q4_0_avx2(const uint8_t *b, float *y, int64_t nb);
void toy_deq_q4_1_avx2(const uint8_t *b, float *y, int64_t nb);
void toy_deq_q5_0_avx2(const uint8_t *b, float *y, int64_t nb);
void toy_deq_q5_1_avx2(const uint8_t *b, float *y, int64_t nb);
void toy_deq_q4_k_avx2(const uint8_t *b, float *y, int64_t nb);
void toy_deq_q5_k_avx2(const uint8_t *b, float *y, int64_t nb);
void toy_deq_q6_k_avx2(const uint8_t *b, float *y, int64_t nb);
/* iq4_fit's search: for each of 16 trial inverse scales id[t], over 32
 * values x[j] in order, the sums of w q x and w q q (w = x^2, q the IQ4
 * codebook value nearest id[t] x[j]); the AVX2 one gives the same bits */
void toy_iq4_sums_ref(const float *x, const float *id, float *sqx, float *sq2);
void toy_iq4_sums_avx2(const float *x, const float *id, float *sqx, float *sq2);
/* the IQ4 codebook index nearest id x[j] for each of 32 values x */
void toy_iq4_indices_ref(const float *x, float id, uint8_t *L);
void toy_iq4_indices_avx2(const float *x, float id, uint8_t *L);

#endif
