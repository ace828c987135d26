/* quant.c: row (de)quantization of the ggml block formats, bit-exact with
 * ggml's reference code (ggml-quants.c: dequantize_row_*, and the
 * quantize_row_*_ref functions that llama.cpp's quantizer uses when no
 * importance matrix is given). Block layouts: ggml-common.h, summarised in
 * ../shared/testdata/gguf-spec and below.
 *
 * Bit-exactness rests on doing the same float32 operations in the same
 * order: every expression below keeps ggml's evaluation order, scales go
 * through the same f16 rounding (round to nearest even) before use, and
 * rounding to int uses the same magic-number trick (round half to even) or
 * roundf/truncation where ggml does. Builds must not contract a*b+c into
 * FMA (C11 mode keeps -ffp-contract=off in gcc; clang contracts only on
 * FMA targets, which our default flags are not). These scalar kernels are
 * the reference; quant-avx2.c has faster dequantizers for the common
 * formats, chosen at run time (TOY_QUANT_SCALAR=1 turns them off), that
 * give the same bits. */
#include "toy/quant.h"
#include "core/quant-impl.h"

#include <float.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>

#define QK 32      /* legacy block */
#define QK_K 256   /* k-quant super-block */

static inline float h2f(const uint8_t *p) { uint16_t h; memcpy(&h, p, 2); return toy_f16_to_f32(h); }
static inline void f2h(uint8_t *p, float f) { uint16_t h = toy_f32_to_f16(f); memcpy(p, &h, 2); }

static inline int imin(int a, int b) { return a < b ? a : b; }
static inline int imax(int a, int b) { return a > b ? a : b; }

/* Round to nearest, ties to even, for |f| <= 2^22: adding 1.5 * 2^23 puts
 * the integer in the low mantissa bits (ggml's nearest_int). */
static inline int round_even(float f) {
    float v = f + 12582912.f;
    int32_t i;
    memcpy(&i, &v, 4);
    return (i & 0x007fffff) - 0x00400000;
}

/* ---- legacy formats (blocks of 32) ------------------------------------------------
 * q4_0: f16 d | u8 qs[16]           x = (nibble - 8) * d; low nibbles are
 *                                    elements 0..15, high 16..31
 * q4_1: f16 d, f16 m | u8 qs[16]     x = nibble * d + m
 * q5_0: f16 d | u32 qh | u8 qs[16]   5th bit of element j in qh bit j
 * q5_1: f16 d, f16 m | u32 qh | qs[16]
 * q8_0: f16 d | i8 qs[32]            x = q * d */

static void deq_q4_0(const uint8_t *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += 18, y += QK) {
        const float d = h2f(b);
        const uint8_t *qs = b + 2;
        for (int j = 0; j < QK / 2; j++) {
            const int x0 = (qs[j] & 0x0F) - 8;
            const int x1 = (qs[j] >> 4) - 8;
            y[j] = x0 * d;
            y[j + QK / 2] = x1 * d;
        }
    }
}

static void deq_q4_1(const uint8_t *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += 20, y += QK) {
        const float d = h2f(b), m = h2f(b + 2);
        const uint8_t *qs = b + 4;
        for (int j = 0; j < QK / 2; j++) {
            y[j] = (qs[j] & 0x0F) * d + m;
            y[j + QK / 2] = (qs[j] >> 4) * d + m;
        }
    }
}

static void deq_q5_0(const uint8_t *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += 22, y += QK) {
        const float d = h2f(b);
        uint32_t qh;
        memcpy(&qh, b + 2, 4);
        const uint8_t *qs = b + 6;
        for (int j = 0; j < QK / 2; j++) {
            const uint8_t h0 = ((qh >> j) << 4) & 0x10;
            const uint8_t h1 = (qh >> (j + 12)) & 0x10;
            const int32_t x0 = ((qs[j] & 0x0F) | h0) - 16;
            const int32_t x1 = ((qs[j] >> 4) | h1) - 16;
            y[j] = x0 * d;
            y[j + QK / 2] = x1 * d;
        }
    }
}

static void deq_q5_1(const uint8_t *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += 24, y += QK) {
        const float d = h2f(b), m = h2f(b + 2);
        uint32_t qh;
        memcpy(&qh, b + 4, 4);
        const uint8_t *qs = b + 8;
        for (int j = 0; j < QK / 2; j++) {
            const uint8_t h0 = ((qh >> j) << 4) & 0x10;
            const uint8_t h1 = (qh >> (j + 12)) & 0x10;
            y[j] = ((qs[j] & 0x0F) | h0) * d + m;
            y[j + QK / 2] = ((qs[j] >> 4) | h1) * d + m;
        }
    }
}

static void deq_q8_0(const uint8_t *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += 34, y += QK) {
        const float d = h2f(b);
        const int8_t *qs = (const int8_t *)(b + 2);
        for (int j = 0; j < QK; j++) y[j] = qs[j] * d;
    }
}

static void q_q4_0(const float *x, uint8_t *b, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += 18, x += QK) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < QK; j++)
            if (amax < fabsf(x[j])) { amax = fabsf(x[j]); max = x[j]; }
        const float d = max / -8;
        const float id = d ? 1.0f / d : 0.0f;
        f2h(b, d);
        for (int j = 0; j < QK / 2; j++) {
            const float x0 = x[j] * id, x1 = x[j + QK / 2] * id;
            const uint8_t q0 = (uint8_t)imin(15, (int8_t)(x0 + 8.5f));
            const uint8_t q1 = (uint8_t)imin(15, (int8_t)(x1 + 8.5f));
            b[2 + j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

static void q_q4_1(const float *x, uint8_t *b, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += 20, x += QK) {
        float min = FLT_MAX, max = -FLT_MAX;
        for (int j = 0; j < QK; j++) {
            if (x[j] < min) min = x[j];
            if (x[j] > max) max = x[j];
        }
        const float d = (max - min) / 15;
        const float id = d ? 1.0f / d : 0.0f;
        f2h(b, d);
        f2h(b + 2, min);
        for (int j = 0; j < QK / 2; j++) {
            const float x0 = (x[j] - min) * id, x1 = (x[j + QK / 2] - min) * id;
            const uint8_t q0 = (uint8_t)imin(15, (int8_t)(x0 + 0.5f));
            const uint8_t q1 = (uint8_t)imin(15, (int8_t)(x1 + 0.5f));
            b[4 + j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

static void q_q5_0(const float *x, uint8_t *b, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += 22, x += QK) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < QK; j++)
            if (amax < fabsf(x[j])) { amax = fabsf(x[j]); max = x[j]; }
        const float d = max / -16;
        const float id = d ? 1.0f / d : 0.0f;
        f2h(b, d);
        uint32_t qh = 0;
        for (int j = 0; j < QK / 2; j++) {
            const float x0 = x[j] * id, x1 = x[j + QK / 2] * id;
            const uint8_t q0 = (uint8_t)imin(31, (int8_t)(x0 + 16.5f));
            const uint8_t q1 = (uint8_t)imin(31, (int8_t)(x1 + 16.5f));
            b[6 + j] = (uint8_t)((q0 & 0x0F) | ((q1 & 0x0F) << 4));
            qh |= ((q0 & 0x10u) >> 4) << j;
            qh |= ((q1 & 0x10u) >> 4) << (j + QK / 2);
        }
        memcpy(b + 2, &qh, 4);
    }
}

static void q_q5_1(const float *x, uint8_t *b, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += 24, x += QK) {
        float min = FLT_MAX, max = -FLT_MAX;
        for (int j = 0; j < QK; j++) {
            if (x[j] < min) min = x[j];
            if (x[j] > max) max = x[j];
        }
        const float d = (max - min) / 31;
        const float id = d ? 1.0f / d : 0.0f;
        f2h(b, d);
        f2h(b + 2, min);
        uint32_t qh = 0;
        for (int j = 0; j < QK / 2; j++) {
            const float x0 = (x[j] - min) * id, x1 = (x[j + QK / 2] - min) * id;
            const uint8_t q0 = (uint8_t)(x0 + 0.5f);
            const uint8_t q1 = (uint8_t)(x1 + 0.5f);
            b[8 + j] = (uint8_t)((q0 & 0x0F) | ((q1 & 0x0F) << 4));
            qh |= ((q0 & 0x10u) >> 4) << j;
            qh |= ((q1 & 0x10u) >> 4) << (j + QK / 2);
        }
        memcpy(b + 4, &qh, 4);
    }
}

static void q_q8_0(const float *x, uint8_t *b, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += 34, x += QK) {
        float amax = 0.0f;
        for (int j = 0; j < QK; j++) amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / 127;
        const float id = d ? 1.0f / d : 0.0f;
        f2h(b, d);
        int8_t *qs = (int8_t *)(b + 2);
        for (int j = 0; j < QK; j++) qs[j] = (int8_t)roundf(x[j] * id);
    }
}

/* ---- k-quants (super-blocks of 256) ---------------------------------------------------
 * q2_k: u8 scales[16] (lo: scale, hi: min) | u8 qs[64] | f16 d, dmin       (84)
 * q3_k: u8 hmask[32] | u8 qs[64] | u8 scales[12] (16 x 6-bit) | f16 d       (110)
 * q4_k: f16 d, dmin | u8 scales[12] (8 x 6-bit scale + 6-bit min) | qs[128] (144)
 * q5_k: f16 d, dmin | scales[12] | u8 qh[32] | u8 qs[128]                    (176)
 * q6_k: u8 ql[128] | u8 qh[64] | i8 scales[16] | f16 d                       (210)
 * q8_k: f32 d | i8 qs[256] | i16 bsums[16]                                   (292)
 * iq4_nl (32): f16 d | u8 qs[16]: x = d * codebook[nibble]                    (18)
 * iq4_xs: f16 d | u16 scales_h | u8 scales_l[4] | u8 qs[128]; 8 sub-blocks of
 *         32 with 6-bit scales (ls - 32), the same codebook                  (136)
 * mxfp4 (32): u8 e (E8M0) | u8 qs[16]: x = values[nibble] 2^(e - 128), the
 *         values the E2M1 code points doubled (quant-impl.h)              (17) */

/* IQ4's non-linear 4-bit codebook (ggml-common.h kvalues_iq4nl). */

static void deq_iq4_nl(const uint8_t *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += 18, y += QK) {
        const float d = h2f(b);
        const uint8_t *qs = b + 2;
        for (int j = 0; j < QK / 2; j++) {
            y[j] = d * toy_iq4_codebook[qs[j] & 0xf];
            y[j + QK / 2] = d * toy_iq4_codebook[qs[j] >> 4];
        }
    }
}

static void deq_mxfp4(const uint8_t *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += 17, y += QK) {
        const float d = toy_e8m0_half(b[0]);
        const uint8_t *qs = b + 1;
        for (int j = 0; j < QK / 2; j++) {
            y[j] = toy_mxfp4_values[qs[j] & 0xf] * d;
            y[j + QK / 2] = toy_mxfp4_values[qs[j] >> 4] * d;
        }
    }
}

static void deq_iq4_xs(const uint8_t *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += 136) {
        const float d = h2f(b);
        const uint8_t *qs = b + 8;
        for (int ib = 0; ib < QK_K / 32; ib++) {
            const float dl = d * (toy_iq4xs_scale(b, ib) - 32);
            for (int j = 0; j < 16; j++) {
                y[j] = dl * toy_iq4_codebook[qs[j] & 0xf];
                y[j + 16] = dl * toy_iq4_codebook[qs[j] >> 4];
            }
            y += 32;
            qs += 16;
        }
    }
}

static void deq_q2_k(const uint8_t *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += 84) {
        const uint8_t *sc = b, *q = b + 16;
        const float d = h2f(b + 80), min = h2f(b + 82);
        int is = 0;
        for (int n = 0; n < QK_K; n += 128) {
            int shift = 0;
            for (int j = 0; j < 4; j++) {
                uint8_t s = sc[is++];
                float dl = d * (s & 0xF), ml = min * (s >> 4);
                for (int l = 0; l < 16; l++) *y++ = dl * ((int8_t)((q[l] >> shift) & 3)) - ml;
                s = sc[is++];
                dl = d * (s & 0xF);
                ml = min * (s >> 4);
                for (int l = 0; l < 16; l++) *y++ = dl * ((int8_t)((q[l + 16] >> shift) & 3)) - ml;
                shift += 2;
            }
            q += 32;
        }
    }
}

static void deq_q3_k(const uint8_t *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += 110) {
        const float d_all = h2f(b + 108);
        const uint8_t *hm = b, *q = b + 32;
        int8_t scales[16];
        toy_q3k_scales(b, scales);
        int is = 0;
        uint8_t m = 1;
        for (int n = 0; n < QK_K; n += 128) {
            int shift = 0;
            for (int j = 0; j < 4; j++) {
                float dl = d_all * scales[is++];
                for (int l = 0; l < 16; l++) *y++ = dl * ((int8_t)((q[l] >> shift) & 3) - ((hm[l] & m) ? 0 : 4));
                dl = d_all * scales[is++];
                for (int l = 0; l < 16; l++) *y++ = dl * ((int8_t)((q[l + 16] >> shift) & 3) - ((hm[l + 16] & m) ? 0 : 4));
                shift += 2;
                m = (uint8_t)(m << 1);
            }
            q += 32;
        }
    }
}

static void deq_q4_k(const uint8_t *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += 144) {
        const float d = h2f(b), min = h2f(b + 2);
        const uint8_t *scales = b + 4, *q = b + 16;
        int is = 0;
        uint8_t sc, m;
        for (int j = 0; j < QK_K; j += 64) {
            toy_q4k_scale_min(is + 0, scales, &sc, &m);
            const float d1 = d * sc, m1 = min * m;
            toy_q4k_scale_min(is + 1, scales, &sc, &m);
            const float d2 = d * sc, m2 = min * m;
            for (int l = 0; l < 32; l++) *y++ = d1 * (q[l] & 0xF) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * (q[l] >> 4) - m2;
            q += 32;
            is += 2;
        }
    }
}

static void deq_q5_k(const uint8_t *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += 176) {
        const float d = h2f(b), min = h2f(b + 2);
        const uint8_t *scales = b + 4, *qh = b + 16, *ql = b + 48;
        int is = 0;
        uint8_t sc, m, u1 = 1, u2 = 2;
        for (int j = 0; j < QK_K; j += 64) {
            toy_q4k_scale_min(is + 0, scales, &sc, &m);
            const float d1 = d * sc, m1 = min * m;
            toy_q4k_scale_min(is + 1, scales, &sc, &m);
            const float d2 = d * sc, m2 = min * m;
            for (int l = 0; l < 32; l++) *y++ = d1 * ((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * ((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
            ql += 32;
            is += 2;
            u1 = (uint8_t)(u1 << 2);
            u2 = (uint8_t)(u2 << 2);
        }
    }
}

static void deq_q6_k(const uint8_t *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += 210) {
        const float d = h2f(b + 208);
        const uint8_t *ql = b, *qh = b + 128;
        const int8_t *sc = (const int8_t *)(b + 192);
        for (int n = 0; n < QK_K; n += 128) {
            for (int l = 0; l < 32; l++) {
                const int is = l / 16;
                const int8_t q1 = (int8_t)((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                const int8_t q2 = (int8_t)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int8_t q3 = (int8_t)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int8_t q4 = (int8_t)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l + 0] = d * sc[is + 0] * q1;
                y[l + 32] = d * sc[is + 2] * q2;
                y[l + 64] = d * sc[is + 4] * q3;
                y[l + 96] = d * sc[is + 6] * q4;
            }
            y += 128;
            ql += 64;
            qh += 32;
            sc += 8;
        }
    }
}

static void deq_q8_k(const uint8_t *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += 292, y += QK_K) {
        float d;
        memcpy(&d, b, 4);
        const int8_t *qs = (const int8_t *)(b + 4);
        for (int j = 0; j < QK_K; j++) y[j] = d * qs[j];
    }
}

/* Fits x[i] ~ scale * L[i] - min (L in 0..nmax) by a weighted least-squares
 * search over nstep+1 candidate scales (ggml's make_qkx2_quants), the
 * candidates judged by squared error or, with mad, absolute error. Returns
 * the scale, stores the (positive) min in *the_min. */
static float fit_scale_min(int n, int nmax, const float *x, const float *w, uint8_t *L,
                           float *the_min, uint8_t *Laux, float rmin, float rdelta, int nstep, bool mad) {
    float min = x[0], max = x[0];
    float sum_w = w[0];
    float sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if (min > 0) min = 0;
    if (max == min) {
        for (int i = 0; i < n; i++) L[i] = 0;
        *the_min = -min;
        return 0.f;
    }
    float iscale = nmax / (max - min);
    float scale = 1 / iscale;
    float best = 0;
    for (int i = 0; i < n; i++) {
        const int l = round_even(iscale * (x[i] - min));
        L[i] = (uint8_t)imax(0, imin(nmax, l));
        float diff = scale * L[i] + min - x[i];
        diff = mad ? fabsf(diff) : diff * diff;
        best += w[i] * diff;
    }
    for (int is = 0; is <= nstep; is++) {
        iscale = (rmin + rdelta * is + nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; i++) {
            int l = round_even(iscale * (x[i] - min));
            l = imax(0, imin(nmax, l));
            Laux[i] = (uint8_t)l;
            sum_l += w[i] * l;
            sum_l2 += w[i] * l * l;
            sum_xl += w[i] * l * x[i];
        }
        const float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float err = 0;
            for (int i = 0; i < n; i++) {
                float diff = this_scale * Laux[i] + this_min - x[i];
                diff = mad ? fabsf(diff) : diff * diff;
                err += w[i] * diff;
            }
            if (err < best) {
                memcpy(L, Laux, (size_t)n);
                best = err;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    return scale;
}

/* Shared by q4_k and q5_k: per-sub-block scales/mins quantized to 6 bits
 * against the block maxima, then the values re-quantized with the stored
 * (f16-rounded) scales. nmax = 15 (q4_k) or 31 (q5_k). */
static void kquant_scales(const float *x, uint8_t *hdr /* d, dmin, scales[12] */, uint8_t *L,
                          int nmax, float rmin, int nstep) {
    uint8_t Laux[32];
    float w[32], mins[QK_K / 32], scales[QK_K / 32];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < QK_K / 32; j++) {
        float sum_x2 = 0;
        for (int l = 0; l < 32; l++) sum_x2 += x[32 * j + l] * x[32 * j + l];
        const float av_x = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; l++) w[l] = av_x + fabsf(x[32 * j + l]);
        scales[j] = fit_scale_min(32, nmax, x + 32 * j, w, L + 32 * j, &mins[j], Laux, rmin, 0.1f, nstep, false);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    uint8_t *sc = hdr + 4;
    memset(sc, 0, 12);
    for (int j = 0; j < QK_K / 32; j++) {
        uint8_t ls = (uint8_t)round_even(inv_scale * scales[j]);
        uint8_t lm = (uint8_t)round_even(inv_min * mins[j]);
        ls = (uint8_t)imin(63, ls);
        lm = (uint8_t)imin(63, lm);
        if (j < 4) {
            sc[j] = ls;
            sc[j + 4] = lm;
        } else {
            sc[j + 4] = (uint8_t)((ls & 0xF) | ((lm & 0xF) << 4));
            sc[j - 4] |= (uint8_t)((ls >> 4) << 6);
            sc[j] |= (uint8_t)((lm >> 4) << 6);
        }
    }
    f2h(hdr, max_scale / 63.f);
    f2h(hdr + 2, max_min / 63.f);
    const float dd = h2f(hdr), dmin = h2f(hdr + 2);
    for (int j = 0; j < QK_K / 32; j++) {
        uint8_t s, m;
        toy_q4k_scale_min(j, sc, &s, &m);
        const float d = dd * s;
        if (!d) continue;
        const float dm = dmin * m;
        for (int ii = 0; ii < 32; ii++) {
            const int l = round_even((x[32 * j + ii] + dm) / d);
            L[32 * j + ii] = (uint8_t)imax(0, imin(nmax, l));
        }
    }
}

static void q_q4_k(const float *x, uint8_t *b, int64_t nb) {
    uint8_t L[QK_K];
    for (int64_t i = 0; i < nb; i++, b += 144, x += QK_K) {
        kquant_scales(x, b, L, 15, -1.f, 20);
        uint8_t *q = b + 16;
        for (int j = 0; j < QK_K; j += 64) {
            for (int l = 0; l < 32; l++) q[l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 4));
            q += 32;
        }
    }
}

static void q_q5_k(const float *x, uint8_t *b, int64_t nb) {
    uint8_t L[QK_K];
    for (int64_t i = 0; i < nb; i++, b += 176, x += QK_K) {
        kquant_scales(x, b, L, 31, -0.5f, 15);
        uint8_t *qh = b + 16, *ql = b + 48;
        memset(qh, 0, QK_K / 8);
        uint8_t m1 = 1, m2 = 2;
        for (int n = 0; n < QK_K; n += 64) {
            for (int j = 0; j < 32; j++) {
                int l1 = L[n + j], l2 = L[n + j + 32];
                if (l1 > 15) { l1 -= 16; qh[j] |= m1; }
                if (l2 > 15) { l2 -= 16; qh[j] |= m2; }
                ql[j] = (uint8_t)(l1 | (l2 << 4));
            }
            m1 = (uint8_t)(m1 << 2);
            m2 = (uint8_t)(m2 << 2);
            ql += 32;
        }
    }
}

/* Symmetric scale search for q6_k sub-blocks (ggml's make_qx_quants with
 * rmse_type 1: weights x^2, 19 candidate scales). L gets values + nmax. */
static float fit_scale_sym(int n, int nmax, const float *x, int8_t *L) {
    float max = 0, amax = 0;
    for (int i = 0; i < n; i++) {
        const float ax = fabsf(x[i]);
        if (ax > amax) { amax = ax; max = x[i]; }
    }
    if (amax < 1e-15f) {
        for (int i = 0; i < n; i++) L[i] = 0;
        return 0.f;
    }
    float iscale = -nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        int l = round_even(iscale * x[i]);
        l = imax(-nmax, imin(nmax - 1, l));
        L[i] = (int8_t)(l + nmax);
        const float w = x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    float scale = suml2 ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; is++) {
        if (is == 0) continue;
        iscale = -(nmax + 0.1f * is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; i++) {
            int l = round_even(iscale * x[i]);
            l = imax(-nmax, imin(nmax - 1, l));
            const float w = x[i] * x[i];
            sumlx += w * x[i] * l;
            suml2 += w * l * l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; i++) {
                const int l = round_even(iscale * x[i]);
                L[i] = (int8_t)(nmax + imax(-nmax, imin(nmax - 1, l)));
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

/* the 2-bit values of a q2_k / q3_k super-block (0..3 each) into qs[64]:
 * byte 32 h + l holds elements 128 h + l + 32 s at bits 2s */
static void pack_pairs(const uint8_t *L, uint8_t *qs) {
    for (int j = 0; j < QK_K; j += 128)
        for (int l = 0; l < 32; l++)
            qs[j / 4 + l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
}

/* q2_k (ggml's quantize_row_q2_K_ref): per 16 elements a scale and a min
 * fitted by absolute error, both quantized to 4 bits against the block's
 * largest, then the values (0..3) again with the stored ones */
static void q_q2_k(const float *x, uint8_t *b, int64_t nb) {
    uint8_t L[QK_K], Laux[16];
    float w[16], mins[QK_K / 16], scales[QK_K / 16];
    for (int64_t i = 0; i < nb; i++, b += 84, x += QK_K) {
        float max_scale = 0, max_min = 0;
        for (int j = 0; j < QK_K / 16; j++) {
            for (int l = 0; l < 16; l++) w[l] = fabsf(x[16 * j + l]);
            scales[j] = fit_scale_min(16, 3, x + 16 * j, w, L + 16 * j, &mins[j], Laux, -0.5f, 0.1f, 15, true);
            if (scales[j] > max_scale) max_scale = scales[j];
            if (mins[j] > max_min) max_min = mins[j];
        }
        uint8_t *sc = b;
        memset(sc, 0, 16);
        if (max_scale > 0) {
            const float iscale = 15.f / max_scale;
            for (int j = 0; j < QK_K / 16; j++) sc[j] = (uint8_t)round_even(iscale * scales[j]);
        }
        f2h(b + 80, max_scale > 0 ? max_scale / 15.f : 0.f);
        if (max_min > 0) {
            const float iscale = 15.f / max_min;
            for (int j = 0; j < QK_K / 16; j++) sc[j] |= (uint8_t)(round_even(iscale * mins[j]) << 4);
        }
        f2h(b + 82, max_min > 0 ? max_min / 15.f : 0.f);
        const float dd = h2f(b + 80), dmin = h2f(b + 82);
        for (int j = 0; j < QK_K / 16; j++) {
            const float d = dd * (sc[j] & 0xF);
            if (!d) continue;
            const float dm = dmin * (sc[j] >> 4);
            for (int ii = 0; ii < 16; ii++) {
                const int l = round_even((x[16 * j + ii] + dm) / d);
                L[16 * j + ii] = (uint8_t)imax(0, imin(3, l));
            }
        }
        pack_pairs(L, b + 16);
    }
}

/* Symmetric fit of x[i] ~ scale * L[i], L in -nmax..nmax-1, for q3_k
 * (ggml's make_q3_quants with rmse): weights x^2, then up to 5 passes that
 * move single values while that lowers the error. L gets values + nmax
 * (0 for an all-zero group). */
static float fit_scale_q3(int n, int nmax, const float *x, int8_t *L) {
    float max = 0, amax = 0;
    for (int i = 0; i < n; i++) {
        const float ax = fabsf(x[i]);
        if (ax > amax) { amax = ax; max = x[i]; }
    }
    if (amax < 1e-15f) {
        for (int i = 0; i < n; i++) L[i] = 0;
        return 0.f;
    }
    const float iscale = -nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        const int l = imax(-nmax, imin(nmax - 1, round_even(iscale * x[i])));
        L[i] = (int8_t)l;
        const float w = x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    for (int itry = 0; itry < 5; itry++) {
        int changed = 0;
        for (int i = 0; i < n; i++) {
            const float w = x[i] * x[i];
            float slx = sumlx - w * x[i] * L[i];
            if (slx > 0) {
                float sl2 = suml2 - w * L[i] * L[i];
                const int nl = imax(-nmax, imin(nmax - 1, round_even(x[i] * sl2 / slx)));
                if (nl != L[i]) {
                    slx += w * x[i] * nl;
                    sl2 += w * nl * nl;
                    if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
                        L[i] = (int8_t)nl;
                        sumlx = slx;
                        suml2 = sl2;
                        changed++;
                    }
                }
            }
        }
        if (!changed) break;
    }
    for (int i = 0; i < n; i++) L[i] = (int8_t)(L[i] + nmax);
    return sumlx / suml2;
}

/* q3_k (ggml's quantize_row_q3_K_ref): per 16 elements a signed scale,
 * quantized to 6 bits against the block's largest in magnitude, then the
 * values (-4..3) again with the stored ones; the low 2 bits as q2_k's, the
 * third in hmask (element j at byte j % 32, bit j / 32) */
static void q_q3_k(const float *x, uint8_t *b, int64_t nb) {
    int8_t L[QK_K];
    float scales[QK_K / 16];
    for (int64_t i = 0; i < nb; i++, b += 110, x += QK_K) {
        float max_scale = 0, amax = 0;
        for (int j = 0; j < QK_K / 16; j++) {
            scales[j] = fit_scale_q3(16, 4, x + 16 * j, L + 16 * j);
            const float a = fabsf(scales[j]);
            if (a > amax) { amax = a; max_scale = scales[j]; }
        }
        uint8_t *sc = b + 96;
        memset(sc, 0, 12);
        if (max_scale != 0) {
            const float iscale = -32.f / max_scale;
            for (int j = 0; j < QK_K / 16; j++) {
                int l = imax(-32, imin(31, (int8_t)round_even(iscale * scales[j]))) + 32;
                if (j < 8) sc[j] = (uint8_t)(l & 0xF);
                else sc[j - 8] |= (uint8_t)((l & 0xF) << 4);
                sc[j % 4 + 8] |= (uint8_t)((l >> 4) << (2 * (j / 4)));
            }
            f2h(b + 108, 1 / iscale);
        } else {
            f2h(b + 108, 0.f);
        }
        int8_t scv[16];
        toy_q3k_scales(b, scv);
        const float dd = h2f(b + 108);
        for (int j = 0; j < QK_K / 16; j++) {
            const float d = dd * scv[j];
            if (!d) continue;
            for (int ii = 0; ii < 16; ii++) {
                const int l = round_even(x[16 * j + ii] / d);
                L[16 * j + ii] = (int8_t)(imax(-4, imin(3, l)) + 4);
            }
        }
        uint8_t *hm = b, U[QK_K];
        memset(hm, 0, 32);
        for (int j = 0; j < QK_K; j++) {
            int v = L[j];
            if (v > 3) {
                hm[j % 32] |= (uint8_t)(1 << (j / 32));
                v -= 4;
            }
            U[j] = (uint8_t)v;
        }
        pack_pairs(U, b + 32);
    }
}

/* whether the AVX2 kernels of quant-avx2.c run ($TOY_QUANT_SCALAR=1: the
 * reference ones) */
static bool quant_simd(void) {
    static int simd = -1; /* benign race: every thread computes the same value */
    if (simd < 0) {
        const char *e = getenv("TOY_QUANT_SCALAR");
        simd = !(e && *e && strcmp(e, "0")) && __builtin_cpu_supports("avx2");
    }
    return simd;
}

/* the index of the codebook value nearest v, as ggml's best_index_int8
 * finds it (a tie goes to the larger; below the first value 0, above the
 * last or NaN 15). Its binary search ends at the first value above v (hi);
 * hi is counted here instead, without branches, which runs the quantizers'
 * hot loop without mispredictions; the last comparison is ggml's own. */
static const float iq4_codebook_f[16] = {TOY_IQ4_VALUES}; /* as floats: no conversion in the loop */

static inline int iq4_index(float v) {
    const float *val = iq4_codebook_f;
    int hi = 0;
    for (int k = 0; k < 15; k++) hi += !(v < val[k]);
    hi += hi == 0;
    return v - val[hi - 1] < val[hi] - v ? hi - 1 : hi;
}

/* iq4_fit's inner loop, the reference (quant-impl.h): for each of 16 trial inverse
 * scales id[t], over the 32 values x[j] in order, sums of w q x and w q q
 * (w = x^2, q the codebook value nearest id[t] x[j]) */
void toy_iq4_sums_ref(const float *x, const float *id, float *sqx, float *sq2) {
    for (int t = 0; t < 16; t++) sqx[t] = sq2[t] = 0;
    for (int j = 0; j < 32; j++)
        for (int t = 0; t < 16; t++) {
            const float q = iq4_codebook_f[iq4_index(id[t] * x[j])], w = x[j] * x[j];
            sqx[t] += w * q * x[j];
            sq2[t] += w * q * q;
        }
}

void toy_iq4_indices_ref(const float *x, float id, uint8_t *L) {
    for (int j = 0; j < 32; j++) L[j] = (uint8_t)iq4_index(id * x[j]);
}

static void iq4_indices(const float *x, float id, uint8_t *L) {
    if (quant_simd()) toy_iq4_indices_avx2(x, id, L);
    else toy_iq4_indices_ref(x, id, L);
}

/* The scale of 32 values x over the iq4 codebook (ggml's
 * quantize_row_iq4_nl_impl for one block, no importance weights: weights
 * x^2; the scale -max/127 refit by least squares, then 15 other starting
 * scales each refit and kept if it fits better); 0 for an all-zero block.
 * The 16 trials' sums are independent, so they run side by side (t = 0 the
 * first scale, t = 1..15 ggml's itry = -7..7), each in ggml's order. */
static float iq4_fit(const float *x) {
    const int8_t *val = toy_iq4_codebook;
    float amax = 0, max = 0;
    for (int j = 0; j < 32; j++) {
        const float ax = fabsf(x[j]);
        if (ax > amax) { amax = ax; max = x[j]; }
    }
    if (amax < 1e-15f) return 0.f;
    float id[16], sqx[16], sq2[16];
    id[0] = 1 / (-max / val[0]);
    for (int t = 1; t < 16; t++) id[t] = (t - 8 + val[0]) / max;
    if (quant_simd()) toy_iq4_sums_avx2(x, id, sqx, sq2);
    else toy_iq4_sums_ref(x, id, sqx, sq2);
    float d = sqx[0] / sq2[0], best = d * sqx[0];
    for (int t = 1; t < 16; t++)
        if (sq2[t] > 0 && sqx[t] * sqx[t] > best * sq2[t]) {
            d = sqx[t] / sq2[t];
            best = d * sqx[t];
        }
    return d;
}

/* 32 indices as the block's 16 bytes: element j low nibble, j + 16 high */
static void iq4_pack(const uint8_t *L, uint8_t *qs) {
    for (int j = 0; j < 16; j++) qs[j] = (uint8_t)(L[j] | L[j + 16] << 4);
}

/* iq4_nl (ggml's quantize_iq4_nl without an importance matrix) */
static void q_iq4_nl(const float *x, uint8_t *b, int64_t nb) {
    uint8_t L[32];
    for (int64_t i = 0; i < nb; i++, b += 18, x += 32) {
        const float d = iq4_fit(x);
        f2h(b, d);
        const float id = d ? 1 / d : 0;
        iq4_indices(x, id, L);
        iq4_pack(L, b + 2);
    }
}

/* iq4_xs (ggml's quantize_iq4_xs without an importance matrix): each 32's
 * scale as iq4_nl's, then 6-bit signed sub-scales against the largest in
 * magnitude and the indices again with them (in ggml's unrounded d) */
static void q_iq4_xs(const float *x, uint8_t *b, int64_t nb) {
    uint8_t L[32];
    float scales[8];
    for (int64_t i = 0; i < nb; i++, b += 136, x += QK_K) {
        float max_scale = 0, amax_scale = 0;
        for (int ib = 0; ib < 8; ib++) {
            scales[ib] = iq4_fit(x + 32 * ib);
            const float a = fabsf(scales[ib]);
            if (a > amax_scale) { amax_scale = a; max_scale = scales[ib]; }
        }
        const float d = -max_scale / 32, id = d ? 1 / d : 0;
        f2h(b, d);
        uint16_t sh = 0;
        memset(b + 4, 0, 4);
        for (int ib = 0; ib < 8; ib++) {
            const int l = imax(-32, imin(31, round_even(id * scales[ib])));
            const float dl = d * l, idl = dl ? 1 / dl : 0;
            iq4_indices(x + 32 * ib, idl, L);
            iq4_pack(L, b + 8 + 16 * ib);
            const int u = l + 32;
            b[4 + ib / 2] |= (uint8_t)((u & 0xf) << 4 * (ib % 2));
            sh |= (uint16_t)((u >> 4) << 2 * ib);
        }
        b[2] = (uint8_t)sh;
        b[3] = (uint8_t)(sh >> 8);
    }
}

/* mxfp4 (ggml's quantize_row_mxfp4_ref): the scale from the block's largest
 * magnitude alone, e = floor(log2(amax)) - 2 + 127, so that amax / d lies in
 * [4, 8), about the largest value's 6; then each element the value nearest
 * it (the first of equals: ties go to the smaller index). ggml converts e
 * to uint8 unclamped; a block whose amax is below 2^-125 (e < 0, undefined
 * behaviour there) takes e = 0 here, and e stays at most 254. */
static void q_mxfp4(const float *x, uint8_t *b, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += 17, x += QK) {
        float amax = 0;
        for (int j = 0; j < QK; j++)
            if (amax < fabsf(x[j])) amax = fabsf(x[j]);
        int e = 0;
        if (amax > 0) {
            const float l = floorf(log2f(amax)) - 2 + 127;
            e = l < 0 ? 0 : l > 254 ? 254 : (int)l;
        }
        const float d = toy_e8m0_half((uint8_t)e);
        b[0] = (uint8_t)e;
        for (int j = 0; j < QK; j++) {
            int best = 0;
            float err = fabsf(toy_mxfp4_values[0] * d - x[j]);
            for (int k = 1; k < 16; k++) {
                const float ek = fabsf(toy_mxfp4_values[k] * d - x[j]);
                if (ek < err) {
                    best = k;
                    err = ek;
                }
            }
            if (j < QK / 2) b[1 + j] = (uint8_t)best;
            else b[1 + j - QK / 2] |= (uint8_t)(best << 4);
        }
    }
}

static void q_q6_k(const float *x, uint8_t *b, int64_t nb) {
    int8_t L[QK_K];
    float scales[QK_K / 16];
    for (int64_t i = 0; i < nb; i++, b += 210, x += QK_K) {
        float max_scale = 0, max_abs_scale = 0;
        for (int ib = 0; ib < QK_K / 16; ib++) {
            const float scale = fit_scale_sym(16, 32, x + 16 * ib, L + 16 * ib);
            scales[ib] = scale;
            if (fabsf(scale) > max_abs_scale) {
                max_abs_scale = fabsf(scale);
                max_scale = scale;
            }
        }
        if (max_abs_scale < 1e-15f) {
            memset(b, 0, 210);
            continue;
        }
        int8_t *sc = (int8_t *)(b + 192);
        const float iscale = -128.f / max_scale;
        f2h(b + 208, 1 / iscale);
        for (int ib = 0; ib < QK_K / 16; ib++) sc[ib] = (int8_t)imin(127, round_even(iscale * scales[ib]));
        const float dd = h2f(b + 208);
        for (int j = 0; j < QK_K / 16; j++) {
            const float d = dd * sc[j];
            if (!d) continue;
            for (int ii = 0; ii < 16; ii++) {
                int l = round_even(x[16 * j + ii] / d);
                l = imax(-32, imin(31, l));
                L[16 * j + ii] = (int8_t)(l + 32);
            }
        }
        uint8_t *ql = b, *qh = b + 128;
        for (int j = 0; j < QK_K; j += 128) {
            for (int l = 0; l < 32; l++) {
                const uint8_t q1 = L[j + l] & 0xF, q2 = L[j + l + 32] & 0xF;
                const uint8_t q3 = L[j + l + 64] & 0xF, q4 = L[j + l + 96] & 0xF;
                ql[l] = (uint8_t)(q1 | (q3 << 4));
                ql[l + 32] = (uint8_t)(q2 | (q4 << 4));
                qh[l] = (uint8_t)((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) |
                                  ((L[j + l + 64] >> 4) << 4) | ((L[j + l + 96] >> 4) << 6));
            }
            ql += 64;
            qh += 32;
        }
    }
}

/* ---- entry points ------------------------------------------------------------------ */

typedef void (*deq_fn)(const uint8_t *, float *, int64_t);
typedef void (*q_fn)(const float *, uint8_t *, int64_t);

static deq_fn deq_ref_for(enum toy_dtype t);

/* The fastest dequantizer this CPU runs for t (the reference if none). */
static deq_fn deq_for(enum toy_dtype t) {
    if (quant_simd()) {
        switch (t) {
        case TOY_Q8_0: return toy_deq_q8_0_avx2;
        case TOY_Q4_0: return toy_deq_q4_0_avx2;
        case TOY_Q4_1: return toy_deq_q4_1_avx2;
        case TOY_Q5_0: return toy_deq_q5_0_avx2;
        case TOY_Q5_1: return toy_deq_q5_1_avx2;
        case TOY_Q4_K: return toy_deq_q4_k_avx2;
        case TOY_Q5_K: return toy_deq_q5_k_avx2;
        case TOY_Q6_K: return toy_deq_q6_k_avx2;
        default: break;
        }
    }
    return deq_ref_for(t);
}

static deq_fn deq_ref_for(enum toy_dtype t) {
    switch (t) {
    case TOY_Q4_0: return deq_q4_0;
    case TOY_Q4_1: return deq_q4_1;
    case TOY_Q5_0: return deq_q5_0;
    case TOY_Q5_1: return deq_q5_1;
    case TOY_Q8_0: return deq_q8_0;
    case TOY_Q2_K: return deq_q2_k;
    case TOY_Q3_K: return deq_q3_k;
    case TOY_Q4_K: return deq_q4_k;
    case TOY_Q5_K: return deq_q5_k;
    case TOY_Q6_K: return deq_q6_k;
    case TOY_Q8_K: return deq_q8_k;
    case TOY_IQ4_NL: return deq_iq4_nl;
    case TOY_IQ4_XS: return deq_iq4_xs;
    case TOY_MXFP4: return deq_mxfp4;
    default: return NULL;
    }
}

static q_fn q_for(enum toy_dtype t) {
    switch (t) {
    case TOY_Q4_0: return q_q4_0;
    case TOY_Q4_1: return q_q4_1;
    case TOY_Q5_0: return q_q5_0;
    case TOY_Q5_1: return q_q5_1;
    case TOY_Q8_0: return q_q8_0;
    case TOY_Q2_K: return q_q2_k;
    case TOY_Q3_K: return q_q3_k;
    case TOY_IQ4_NL: return q_iq4_nl;
    case TOY_IQ4_XS: return q_iq4_xs;
    case TOY_MXFP4: return q_mxfp4;
    case TOY_Q4_K: return q_q4_k;
    case TOY_Q5_K: return q_q5_k;
    case TOY_Q6_K: return q_q6_k;
    default: return NULL;
    }
}

bool toy_can_dequantize(enum toy_dtype t) {
    return t == TOY_F32 || t == TOY_F16 || t == TOY_BF16 || deq_ref_for(t) != NULL;
}

bool toy_can_quantize(enum toy_dtype t) {
    return t == TOY_F32 || t == TOY_F16 || t == TOY_BF16 || q_for(t) != NULL;
}

static enum toy_status check_n(enum toy_dtype t, int64_t n, const char *what) {
    const int64_t bs = toy_dtype_block_size(t);
    if (n < 0 || bs <= 0 || n % bs)
        return toy_error(TOY_ERR_INVALID_ARG, "%s: %lld elements is not a multiple of the %s block (%lld)",
                         what, (long long)n, toy_dtype_name(t), (long long)bs);
    return TOY_OK;
}

/* f16/bf16 rows at an odd address (a safetensors tensor, a GGUF opened
 * from an unaligned buffer): the row converters need aligned uint16 loads. */
static void half_row_unaligned(enum toy_dtype t, const uint8_t *src, float *dst, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, src + 2 * i, 2);
        dst[i] = t == TOY_F16 ? toy_f16_to_f32(h) : toy_bf16_to_f32(h);
    }
}

static enum toy_status dequantize(enum toy_dtype t, const void *src, float *dst, int64_t n, bool ref) {
    const bool odd = ((uintptr_t)src & 1) != 0;
    switch (t) {
    case TOY_F32: memcpy(dst, src, (size_t)n * 4); return TOY_OK;
    case TOY_F16:
        if (odd) half_row_unaligned(t, src, dst, n);
        else toy_f16_to_f32_row(src, dst, n);
        return TOY_OK;
    case TOY_BF16:
        if (odd) half_row_unaligned(t, src, dst, n);
        else toy_bf16_to_f32_row(src, dst, n);
        return TOY_OK;
    default: break;
    }
    deq_fn f = ref ? deq_ref_for(t) : deq_for(t);
    if (!f) return toy_error(TOY_ERR_UNSUPPORTED, "dequantize: type %s", toy_dtype_name(t));
    enum toy_status st = check_n(t, n, "dequantize");
    if (st) return st;
    f(src, dst, n / toy_dtype_block_size(t));
    return TOY_OK;
}

enum toy_status toy_dequantize_row(enum toy_dtype t, const void *src, float *dst, int64_t n) {
    if (!dst) return toy_error(TOY_ERR_INVALID_ARG, "toy_dequantize_row: dst is NULL");
    return dequantize(t, src, dst, n, false);
}

enum toy_status toy_dequantize_row_ref(enum toy_dtype t, const void *src, float *dst, int64_t n) {
    if (!dst) return toy_error(TOY_ERR_INVALID_ARG, "toy_dequantize_row_ref: dst is NULL");
    return dequantize(t, src, dst, n, true);
}

enum toy_status toy_quantize_row(enum toy_dtype t, const float *src, void *dst, int64_t n) {
    if (!dst) return toy_error(TOY_ERR_INVALID_ARG, "toy_quantize_row: dst is NULL");
    switch (t) {
    case TOY_F32: memcpy(dst, src, (size_t)n * 4); return TOY_OK;
    case TOY_F16: toy_f32_to_f16_row(src, dst, n); return TOY_OK;
    case TOY_BF16: toy_f32_to_bf16_row(src, dst, n); return TOY_OK;
    default: break;
    }
    q_fn f = q_for(t);
    if (!f) return toy_error(TOY_ERR_UNSUPPORTED, "quantize: type %s", toy_dtype_name(t));
    enum toy_status st = check_n(t, n, "quantize");
    if (st) return st;
    f(src, dst, n / toy_dtype_block_size(t));
    return TOY_OK;
}
