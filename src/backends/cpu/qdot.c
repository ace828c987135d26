/* qdot.c: dot products of quantized weight rows with activations quantized
 * to Q8_0 on the fly (the fast way to run a matrix-vector product over
 * Q8_0/Q4_0 weights: integer multiply-adds on 32-element blocks, one float
 * scale per block pair). Plain C reference here; AVX-512 VNNI / AVX2 versions
 * in qdot-avx512.c / qdot-avx2.c are tested against it.
 * Block layouts (ggml): q8_0 = f16 d | i8 q[32], x = q d;
 * q4_0 = f16 d | u8 q[16], x_j = ((q[j] & 15) - 8) d, x_{j+16} = ((q[j] >> 4) - 8) d;
 * mxfp4 = u8 e | u8 q[16], Q4_0's nibbles indexing its values, d = 2^(e - 128)
 * (17 bytes: its rows and blocks are byte-aligned only). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/qdot.h"
#include "core/quant-impl.h"

float toy_qdot_q8_0_ref(const void *w, const void *x, int64_t n) {
    const uint8_t *a = w, *b = x;
    float sum = 0;
    for (int64_t blk = 0; blk < n / 32; blk++, a += 34, b += 34) {
        toy_f16 da, db;
        memcpy(&da, a, 2);
        memcpy(&db, b, 2);
        int32_t s = 0;
        for (int j = 0; j < 32; j++) s += (int8_t)a[2 + j] * (int8_t)b[2 + j];
        sum += (float)s * toy_f16_to_f32(da) * toy_f16_to_f32(db);
    }
    return sum;
}

float toy_qdot_q4_0_ref(const void *w, const void *x, int64_t n) {
    const uint8_t *a = w, *b = x;
    float sum = 0;
    for (int64_t blk = 0; blk < n / 32; blk++, a += 18, b += 34) {
        toy_f16 da, db;
        memcpy(&da, a, 2);
        memcpy(&db, b, 2);
        int32_t s = 0;
        for (int j = 0; j < 16; j++) {
            s += ((a[2 + j] & 15) - 8) * (int8_t)b[2 + j];
            s += ((a[2 + j] >> 4) - 8) * (int8_t)b[2 + 16 + j];
        }
        sum += (float)s * toy_f16_to_f32(da) * toy_f16_to_f32(db);
    }
    return sum;
}

/* the same rounding as ggml's quantize_row_q8_0_ref: d = max|x| / 127,
 * q = round(x / d) */
void toy_quantize_q8_0_ref(const float *x, void *y, int64_t n) {
    uint8_t *o = y;
    for (int64_t blk = 0; blk < n / 32; blk++, x += 32, o += 34) {
        float amax = 0;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
        float d = amax / 127.0f, id = d ? 1.0f / d : 0.0f;
        toy_f16 dh = toy_f32_to_f16(d);
        memcpy(o, &dh, 2);
        for (int j = 0; j < 32; j++) o[2 + j] = (uint8_t)(int8_t)roundf(x[j] * id);
    }
}

/* Q4_K sub-block sb (32 elements) of a row: its super-block's d and dmin
 * (f16), its 6-bit scale and min, and its 32 values q (0..15): element e
 * is d scale q[e] - dmin min */

static void q4k_sub_raw(const uint8_t *row, int64_t sb, toy_f16 *d, toy_f16 *dmin, uint8_t *scale, uint8_t *min,
                        uint8_t *q) {
    const uint8_t *b = row + (sb / 8) * 144;
    int j = (int)(sb % 8);
    memcpy(d, b, 2);
    memcpy(dmin, b + 2, 2);
    toy_q4k_scale_min(j, b + 4, scale, min);
    const uint8_t *qs = b + 16 + 32 * (j / 2);
    for (int e = 0; e < 32; e++) q[e] = j % 2 ? qs[e] >> 4 : qs[e] & 15;
}

/* The same for Q5_K (q 0..31: the nibble and the fifth bit from qh) */
static void q5k_sub_raw(const uint8_t *row, int64_t sb, toy_f16 *d, toy_f16 *dmin, uint8_t *scale, uint8_t *min,
                        uint8_t *q) {
    const uint8_t *b = row + (sb / 8) * 176, *qh = b + 16;
    int j = (int)(sb % 8);
    memcpy(d, b, 2);
    memcpy(dmin, b + 2, 2);
    toy_q4k_scale_min(j, b + 4, scale, min);
    const uint8_t *qs = b + 48 + 32 * (j / 2);
    for (int e = 0; e < 32; e++) q[e] = (uint8_t)((j % 2 ? qs[e] >> 4 : qs[e] & 15) | ((qh[e] >> j) & 1) << 4);
}

/* Q4_1 or Q5_1 block blk of a row: d, m and the unsigned values u
 * (element = d u + m) */
static void q_1_block(enum toy_dtype bt, const uint8_t *row, int64_t blk, toy_f16 *d, toy_f16 *m, uint8_t *u) {
    bool q5 = bt == TOY_Q5_1;
    const uint8_t *b = row + blk * (q5 ? 24 : 20), *qs = b + (q5 ? 8 : 4);
    uint32_t qh = 0;
    memcpy(d, b, 2);
    memcpy(m, b + 2, 2);
    if (q5) memcpy(&qh, b + 4, 4);
    for (int e = 0; e < 16; e++) {
        u[e] = (uint8_t)((qs[e] & 15) | ((qh >> e) & 1) << 4);
        u[e + 16] = (uint8_t)((qs[e] >> 4) | ((qh >> (e + 16)) & 1) << 4);
    }
}

/* Q5_0 block blk of a row: d and the values q + 16 (0..31) */
static void q5_0_block(const uint8_t *row, int64_t blk, toy_f16 *d, uint8_t *u) {
    const uint8_t *b = row + blk * 22, *qs = b + 6;
    uint32_t qh;
    memcpy(d, b, 2);
    memcpy(&qh, b + 2, 4);
    for (int e = 0; e < 16; e++) {
        u[e] = (uint8_t)((qs[e] & 15) | ((qh >> e) & 1) << 4);
        u[e + 16] = (uint8_t)((qs[e] >> 4) | ((qh >> (e + 16)) & 1) << 4);
    }
}


/* Q6_K elements 32 blk .. 32 blk + 31 of a row: the super-block's d, the
 * scales of their two 16-element sub-blocks and their values q (-32..31) */
static void q6k_sub(const uint8_t *row, int64_t blk, toy_f16 *d, int8_t sc[2], int8_t *q) {
    const uint8_t *b = row + (blk / 8) * 210;
    int n = (int)(blk % 8) / 4, quarter = (int)(blk % 4);
    const uint8_t *ql = b + 64 * n, *qh = b + 128 + 32 * n;
    memcpy(d, b + 208, 2);
    sc[0] = (int8_t)b[192 + 8 * n + 2 * quarter];
    sc[1] = (int8_t)b[192 + 8 * n + 2 * quarter + 1];
    for (int l = 0; l < 32; l++) {
        int lo = quarter & 1 ? ql[l + 32] : ql[l];
        lo = quarter < 2 ? (lo & 0xF) : (lo >> 4);
        q[l] = (int8_t)((lo | (((qh[l] >> (2 * quarter)) & 3) << 4)) - 32);
    }
}

/* IQ4_XS elements 32 blk .. 32 blk + 31 of a row: the super-block's d,
 * the sub-block's scale - 32 and the 32 codebook indices */
static void iq4xs_sub(const uint8_t *row, int64_t blk, toy_f16 *d, int8_t *sc, uint8_t *idx) {
    const uint8_t *b = row + (blk / 8) * 136, *qs = b + 8 + 16 * (blk % 8);
    memcpy(d, b, 2);
    *sc = (int8_t)(toy_iq4xs_scale(b, (int)(blk % 8)) - 32);
    for (int e = 0; e < 16; e++) {
        idx[e] = qs[e] & 15;
        idx[e + 16] = qs[e] >> 4;
    }
}

/* Q3_K elements 32 blk .. 32 blk + 31 of a row: the super-block's d, the
 * scales - 32 of their two 16-element sub-blocks and their values q
 * (-4..3) */
static void q3k_sub(const uint8_t *row, int64_t blk, toy_f16 *d, int8_t sc[2], int8_t *q) {
    const uint8_t *b = row + (blk / 8) * 110, *hm = b;
    int sb = (int)(blk % 8), shift = 2 * (sb % 4);
    const uint8_t *qs = b + 32 + 32 * (sb / 4);
    int8_t all[16];
    toy_q3k_scales(b, all);
    sc[0] = all[2 * sb];
    sc[1] = all[2 * sb + 1];
    memcpy(d, b + 108, 2);
    for (int l = 0; l < 32; l++) q[l] = (int8_t)(((qs[l] >> shift) & 3) - ((hm[l] >> sb) & 1 ? 0 : 4));
}

/* Q2_K elements 32 blk .. 32 blk + 31 of a row: the super-block's d and
 * dmin, the scale-and-min bytes of their two 16-element sub-blocks and
 * their values q (0..3) */
static void q2k_sub(const uint8_t *row, int64_t blk, toy_f16 *d, toy_f16 *dmin, uint8_t sm[2], uint8_t *q) {
    const uint8_t *b = row + (blk / 8) * 84;
    int sb = (int)(blk % 8), shift = 2 * (sb % 4);
    const uint8_t *qs = b + 16 + 32 * (sb / 4);
    sm[0] = b[2 * sb];
    sm[1] = b[2 * sb + 1];
    memcpy(d, b + 80, 2);
    memcpy(dmin, b + 82, 2);
    for (int l = 0; l < 32; l++) q[l] = (uint8_t)((qs[l] >> shift) & 3);
}

void toy_qgemm_ref(enum toy_dtype bt, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const void *b,
                   size_t ldb, float *c, int64_t ldc, bool accum) {
    int64_t nb = k / 32;
    uint8_t *q8 = malloc((size_t)nb * 34);
    if (!q8) abort();
    for (int64_t i = 0; i < m; i++) {
        toy_qdot.quantize_q8_0(a + i * lda, q8, k);
        for (int64_t j = 0; j < n; j++) {
            const uint8_t *w = (const uint8_t *)b + j * ldb;
            float acc = 0;
            for (int64_t blk = 0; blk < nb; blk++) {
                const uint8_t *x = q8 + blk * 34;
                toy_f16 dw, dx;
                memcpy(&dx, x, 2);
                int32_t s = 0;
                if (bt == TOY_Q4_K || bt == TOY_Q5_K) { /* acc += s_w d_x dot(q, x) - mn_w d_x sum(x) */
                    toy_f16 d, dmin;
                    uint8_t q[32], scale, min;
                    (bt == TOY_Q4_K ? q4k_sub_raw : q5k_sub_raw)(w, blk, &d, &dmin, &scale, &min, q);
                    float sw = toy_f16_to_f32(d) * scale, mn = toy_f16_to_f32(dmin) * min;
                    int32_t xs = 0;
                    for (int e = 0; e < 32; e++) {
                        s += q[e] * (int8_t)x[2 + e];
                        xs += (int8_t)x[2 + e];
                    }
                    float dxf = toy_f16_to_f32(dx);
                    acc = fmaf((float)s, sw * dxf, acc);
                    acc = fmaf(-mn, dxf * (float)xs, acc);
                    continue;
                }
                if (bt == TOY_Q6_K || bt == TOY_Q3_K) { /* per 16-element sub-block: acc += dot(q, x) (d sc) d_x */
                    toy_f16 d;
                    int8_t sc[2], q[32];
                    (bt == TOY_Q6_K ? q6k_sub : q3k_sub)(w, blk, &d, sc, q);
                    float dxf = toy_f16_to_f32(dx), df = toy_f16_to_f32(d);
                    for (int h = 0; h < 2; h++) {
                        int32_t sh = 0;
                        for (int e = 16 * h; e < 16 * h + 16; e++) sh += q[e] * (int8_t)x[2 + e];
                        acc = fmaf((float)sh, df * (float)sc[h] * dxf, acc);
                    }
                    continue;
                }
                if (bt == TOY_Q4_1 || bt == TOY_Q5_1) { /* acc += d_w d_x dot(u, x) + m_w d_x sum(x) */
                    toy_f16 d, mw;
                    uint8_t u[32];
                    int32_t xs = 0;
                    q_1_block(bt, w, blk, &d, &mw, u);
                    for (int e = 0; e < 32; e++) {
                        s += u[e] * (int8_t)x[2 + e];
                        xs += (int8_t)x[2 + e];
                    }
                    float dxf = toy_f16_to_f32(dx);
                    acc = fmaf((float)s, toy_f16_to_f32(d) * dxf, acc);
                    acc = fmaf(toy_f16_to_f32(mw), dxf * (float)xs, acc);
                    continue;
                }
                if (bt == TOY_Q2_K) { /* per 16: acc += dot(q, x) (d sc) d_x, then the mins */
                    toy_f16 d, dmin;
                    uint8_t sm[2], q[32];
                    int32_t sh[2] = {0, 0}, xh[2] = {0, 0};
                    q2k_sub(w, blk, &d, &dmin, sm, q);
                    for (int e = 0; e < 32; e++) {
                        sh[e / 16] += q[e] * (int8_t)x[2 + e];
                        xh[e / 16] += (int8_t)x[2 + e];
                    }
                    float dxf = toy_f16_to_f32(dx), df = toy_f16_to_f32(d), mf = toy_f16_to_f32(dmin);
                    for (int h = 0; h < 2; h++) acc = fmaf((float)sh[h], df * (float)(sm[h] & 15) * dxf, acc);
                    for (int h = 0; h < 2; h++) acc = fmaf(-(mf * (float)(sm[h] >> 4)), dxf * (float)xh[h], acc);
                    continue;
                }
                if (bt == TOY_IQ4_XS) { /* acc += dot(v, x) (d (scale - 32)) d_x */
                    toy_f16 d;
                    int8_t sc;
                    uint8_t idx[32];
                    iq4xs_sub(w, blk, &d, &sc, idx);
                    for (int e = 0; e < 32; e++) s += toy_iq4_codebook[idx[e]] * (int8_t)x[2 + e];
                    acc = fmaf((float)s, toy_f16_to_f32(d) * (float)sc * toy_f16_to_f32(dx), acc);
                    continue;
                }
                if (bt == TOY_MXFP4) { /* acc += dot(v, x) (2^(e - 128) d_x) */
                    const uint8_t *q = w + blk * 17;
                    for (int e = 0; e < 16; e++)
                        s += toy_mxfp4_values[q[1 + e] & 15] * (int8_t)x[2 + e] +
                             toy_mxfp4_values[q[1 + e] >> 4] * (int8_t)x[18 + e];
                    acc = fmaf((float)s, toy_e8m0_half(q[0]) * toy_f16_to_f32(dx), acc);
                    continue;
                }
                if (bt == TOY_IQ4_NL) {
                    const uint8_t *q = w + blk * 18;
                    memcpy(&dw, q, 2);
                    for (int e = 0; e < 16; e++)
                        s += toy_iq4_codebook[q[2 + e] & 15] * (int8_t)x[2 + e] +
                             toy_iq4_codebook[q[2 + e] >> 4] * (int8_t)x[18 + e];
                } else if (bt == TOY_Q8_0) {
                    const uint8_t *q = w + blk * 34;
                    memcpy(&dw, q, 2);
                    for (int e = 0; e < 32; e++) s += (int8_t)q[2 + e] * (int8_t)x[2 + e];
                } else if (bt == TOY_Q5_0) {
                    uint8_t u[32];
                    q5_0_block(w, blk, &dw, u);
                    for (int e = 0; e < 32; e++) s += (u[e] - 16) * (int8_t)x[2 + e];
                } else {
                    const uint8_t *q = w + blk * 18;
                    memcpy(&dw, q, 2);
                    for (int e = 0; e < 16; e++)
                        s += ((q[2 + e] & 15) - 8) * (int8_t)x[2 + e] + ((q[2 + e] >> 4) - 8) * (int8_t)x[18 + e];
                }
                acc = fmaf((float)s, toy_f16_to_f32(dw) * toy_f16_to_f32(dx), acc);
            }
            c[i * ldc + j] = accum ? c[i * ldc + j] + acc : acc;
        }
    }
    free(q8);
}

size_t toy_qgemm_scratch(int64_t m, int64_t k) {
    int64_t nb = k / 32;
    return (size_t)(m * nb * 44) + (size_t)((nb * 34 + 63) / 64 * 64) + (size_t)(2 * nb * 576) + 64;
}

size_t toy_qpack_group_bytes(enum toy_dtype bt, int64_t k) {
    switch (bt) {
    case TOY_Q4_K: return (size_t)(k / 256) * TOY_QPACK_SUPER_Q4_K;
    case TOY_Q5_K: return (size_t)(k / 256) * TOY_QPACK_SUPER_Q5_K;
    case TOY_Q6_K: return (size_t)(k / 256) * TOY_QPACK_SUPER_Q6_K;
    case TOY_IQ4_XS: return (size_t)(k / 256) * TOY_QPACK_SUPER_IQ4_XS;
    case TOY_Q3_K: return (size_t)(k / 256) * TOY_QPACK_SUPER_Q3_K;
    case TOY_Q2_K: return (size_t)(k / 256) * TOY_QPACK_SUPER_Q2_K;
    case TOY_Q8_0: return (size_t)(k / 32) * TOY_QPACK_BLOCK_Q8_0;
    case TOY_Q4_1: return (size_t)(k / 32) * TOY_QPACK_BLOCK_Q4_1;
    case TOY_Q5_0: return (size_t)(k / 32) * TOY_QPACK_BLOCK_Q5_0;
    case TOY_Q5_1: return (size_t)(k / 32) * TOY_QPACK_BLOCK_Q5_1;
    case TOY_MXFP4: return (size_t)(k / 32) * TOY_QPACK_BLOCK_MXFP4;
    default: return (size_t)(k / 32) * TOY_QPACK_BLOCK_Q4_0;
    }
}

size_t toy_qpack_bytes(enum toy_dtype bt, int64_t n, int64_t k) {
    return (size_t)((n + 15) / 16) * toy_qpack_group_bytes(bt, k);
}

/* 32 values u (0..31) of column c of a group: their low 4 bits as Q4_0's
 * nibble vectors (4 x 64 bytes at dst); with fifth, their fifth bits in the
 * vector after them (quad t at bit t) */
static void pack_values(uint8_t *dst, const uint8_t *u, int c, bool fifth) {
    for (int t = 0; t < 4; t++)
        for (int e = 0; e < 4; e++) {
            dst[64 * t + 4 * c + e] = (uint8_t)((u[4 * t + e] & 15) | (u[16 + 4 * t + e] & 15) << 4);
            if (fifth)
                dst[256 + 4 * c + e] |= (uint8_t)((u[4 * t + e] >> 4) << t | (u[16 + 4 * t + e] >> 4) << (t + 4));
        }
}

/* Block blk (32 elements) of weight row `row` into column c of its packed
 * group grp (zeroed before), in bt's layout (qdot.h) */
static void pack_block(enum toy_dtype bt, const uint8_t *row, int64_t blk, uint8_t *grp, int c) {
    uint8_t u[32];
    toy_f16 d, d2;
    switch (bt) {
    case TOY_Q8_0:
    case TOY_Q4_0:
    case TOY_IQ4_NL: { /* IQ4_NL: the index nibbles as Q4_0's */
        bool q8 = bt == TOY_Q8_0;
        const uint8_t *src = row + (size_t)blk * (q8 ? 34 : 18);
        uint8_t *dst = grp + (size_t)blk * (q8 ? TOY_QPACK_BLOCK_Q8_0 : TOY_QPACK_BLOCK_Q4_0);
        memcpy(dst + 2 * c, src, 2);
        for (int t = 0; t < (q8 ? 8 : 4); t++)
            for (int e = 0; e < 4; e++) {
                uint8_t v = src[2 + 4 * t + e];
                dst[32 + 64 * t + 4 * c + e] = q8 ? (uint8_t)(v ^ 0x80) : v;
            }
        return;
    }
    case TOY_MXFP4: { /* the scale byte, then the index nibbles as Q4_0's */
        const uint8_t *src = row + (size_t)blk * 17;
        uint8_t *dst = grp + (size_t)blk * TOY_QPACK_BLOCK_MXFP4;
        dst[c] = src[0];
        for (int t = 0; t < 4; t++)
            for (int e = 0; e < 4; e++) dst[16 + 64 * t + 4 * c + e] = src[1 + 4 * t + e];
        return;
    }
    case TOY_Q5_0: {
        uint8_t *dst = grp + (size_t)blk * TOY_QPACK_BLOCK_Q5_0;
        q5_0_block(row, blk, &d, u);
        memcpy(dst + 2 * c, &d, 2);
        pack_values(dst + 32, u, c, true);
        return;
    }
    case TOY_Q4_1:
    case TOY_Q5_1: {
        uint8_t *dst = grp + (size_t)blk * (bt == TOY_Q5_1 ? TOY_QPACK_BLOCK_Q5_1 : TOY_QPACK_BLOCK_Q4_1);
        q_1_block(bt, row, blk, &d, &d2, u);
        memcpy(dst + 2 * c, &d, 2);
        memcpy(dst + 32 + 2 * c, &d2, 2);
        pack_values(dst + 64, u, c, bt == TOY_Q5_1);
        return;
    }
    case TOY_Q4_K:
    case TOY_Q5_K: {
        bool q5 = bt == TOY_Q5_K;
        int sb = (int)(blk % 8);
        uint8_t *sup = grp + (size_t)(blk / 8) * (q5 ? TOY_QPACK_SUPER_Q5_K : TOY_QPACK_SUPER_Q4_K);
        (q5 ? q5k_sub_raw : q4k_sub_raw)(row, blk, &d, &d2, &sup[64 + 16 * sb + c], &sup[192 + 16 * sb + c], u);
        memcpy(sup + 2 * c, &d, 2);
        memcpy(sup + 32 + 2 * c, &d2, 2);
        pack_values(sup + TOY_QPACK_HEAD_Q4_K + (q5 ? 320 : 256) * sb, u, c, q5);
        return;
    }
    case TOY_Q3_K: {
        int sb = (int)(blk % 8);
        uint8_t *sup = grp + (size_t)(blk / 8) * TOY_QPACK_SUPER_Q3_K, *dst = sup + TOY_QPACK_HEAD_Q6_K + 192 * sb;
        int8_t sc[2], q[32];
        q3k_sub(row, blk, &d, sc, q);
        memcpy(sup + 2 * c, &d, 2);
        sup[32 + 16 * (2 * sb) + c] = (uint8_t)sc[0];
        sup[32 + 16 * (2 * sb + 1) + c] = (uint8_t)sc[1];
        for (int e = 0; e < 32; e++) u[e] = (uint8_t)(q[e] + 4);
        for (int t = 0; t < 4; t++)
            for (int e = 0; e < 4; e++) {
                uint8_t a = u[4 * t + e], b = u[16 + 4 * t + e]; /* quads t and t + 4 */
                dst[4 * c + e] |= (uint8_t)((a & 3) << (2 * t));
                dst[64 + 4 * c + e] |= (uint8_t)((b & 3) << (2 * t));
                dst[128 + 4 * c + e] |= (uint8_t)((a >> 2) << t | (b >> 2) << (t + 4));
            }
        return;
    }
    case TOY_Q2_K: {
        int sb = (int)(blk % 8);
        uint8_t *sup = grp + (size_t)(blk / 8) * TOY_QPACK_SUPER_Q2_K, *dst = sup + TOY_QPACK_HEAD_Q2_K + 128 * sb;
        uint8_t sm[2];
        q2k_sub(row, blk, &d, &d2, sm, u);
        memcpy(sup + 2 * c, &d, 2);
        memcpy(sup + 32 + 2 * c, &d2, 2);
        sup[64 + 16 * (2 * sb) + c] = sm[0];
        sup[64 + 16 * (2 * sb + 1) + c] = sm[1];
        for (int t = 0; t < 4; t++)
            for (int e = 0; e < 4; e++) {
                dst[4 * c + e] |= (uint8_t)(u[4 * t + e] << (2 * t));
                dst[64 + 4 * c + e] |= (uint8_t)(u[16 + 4 * t + e] << (2 * t));
            }
        return;
    }
    case TOY_IQ4_XS: {
        int sb = (int)(blk % 8);
        uint8_t *sup = grp + (size_t)(blk / 8) * TOY_QPACK_SUPER_IQ4_XS;
        int8_t sc;
        iq4xs_sub(row, blk, &d, &sc, u);
        memcpy(sup + 2 * c, &d, 2);
        sup[32 + 16 * sb + c] = (uint8_t)sc;
        pack_values(sup + TOY_QPACK_HEAD_IQ4_XS + 256 * sb, u, c, false);
        return;
    }
    case TOY_Q6_K: {
        int sb = (int)(blk % 8);
        uint8_t *sup = grp + (size_t)(blk / 8) * TOY_QPACK_SUPER_Q6_K, *dst = sup + TOY_QPACK_HEAD_Q6_K + 384 * sb;
        int8_t sc[2], q[32];
        q6k_sub(row, blk, &d, sc, q);
        memcpy(sup + 2 * c, &d, 2);
        sup[32 + 16 * (2 * sb) + c] = (uint8_t)sc[0];
        sup[32 + 16 * (2 * sb + 1) + c] = (uint8_t)sc[1];
        for (int e = 0; e < 32; e++) u[e] = (uint8_t)(q[e] + 32);
        pack_values(dst, u, c, false);
        for (int t = 0; t < 4; t++) /* the top bit pairs: quads 0-3, then 4-7 */
            for (int e = 0; e < 4; e++) {
                dst[256 + 4 * c + e] |= (uint8_t)((u[4 * t + e] >> 4) << (2 * t));
                dst[320 + 4 * c + e] |= (uint8_t)((u[16 + 4 * t + e] >> 4) << (2 * t));
            }
        return;
    }
    default: return; /* packable() admits the types above only */
    }
}

void toy_qpack(enum toy_dtype bt, int64_t n, int64_t k, const void *bv, size_t ldb, void *outv) {
    const uint8_t *b = bv;
    uint8_t *out = outv;
    memset(out, 0, toy_qpack_bytes(bt, n, k));
    for (int64_t j = 0; j < n; j++)
        for (int64_t blk = 0; blk < k / 32; blk++)
            pack_block(bt, b + (size_t)j * ldb, blk, out + (size_t)(j / 16) * toy_qpack_group_bytes(bt, k), (int)(j % 16));
}

struct toy_qdot_ops toy_qdot = {toy_qdot_q8_0_ref, toy_qdot_q4_0_ref, toy_quantize_q8_0_ref, NULL, NULL, NULL, NULL};

void toy_qdot_fill_avx512(struct toy_qdot_ops *ops);
void toy_qdot_fill_avx2(struct toy_qdot_ops *ops);

void toy_qdot_init(void) {
    const char *force = getenv("TOY_SIMD");
    toy_qdot = (struct toy_qdot_ops){toy_qdot_q8_0_ref, toy_qdot_q4_0_ref, toy_quantize_q8_0_ref, NULL, NULL, NULL, NULL};
    if (force && !strcmp(force, "scalar")) return;
    __builtin_cpu_init();
    bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    bool vnni = __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl") &&
                __builtin_cpu_supports("avx512bw");
    if (vnni && !(force && !strcmp(force, "avx2"))) toy_qdot_fill_avx512(&toy_qdot);
    else if (avx2) toy_qdot_fill_avx2(&toy_qdot);
}
