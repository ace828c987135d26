/* kernels-common.cuh: device helpers every kernel file shares: element
 * loads of any dtype (with in-kernel dequantization of Q8_0 / Q4_0 / Q4_K,
 * block layouts as in src/core/quant.c), index unravelling, block
 * reductions, launch-error checks. */
#ifndef TOY_KERNELS_COMMON_CUH
#define TOY_KERNELS_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* the C headers, read as C++ (C11's _Noreturn is a GNU attribute there) */
#ifndef _Noreturn
#define _Noreturn __attribute__((noreturn))
#endif
extern "C" {
#include "core/internal.h"
}
#include "backends/cuda/cuda-impl.h"

typedef struct toy_cu_tensor CT;

#define CU_STREAM(n) ((cudaStream_t)(n)->stream)

__host__ __device__ static inline int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* grid size for n elements with `threads` per block, capped (grid-stride loops) */
static inline unsigned grid_for(int64_t n, int threads) {
    int64_t g = cdiv(n, threads);
    if (g > 65535LL * 16) g = 65535LL * 16;
    return (unsigned)(g < 1 ? 1 : g);
}

__host__ __device__ static inline int64_t ct_nel(const CT &t) { return t.ne[0] * t.ne[1] * t.ne[2] * t.ne[3]; }
__host__ __device__ static inline int64_t ct_nrows(const CT &t) { return t.ne[1] * t.ne[2] * t.ne[3]; }

__host__ __device__ __forceinline__ const char *ct_row(const CT &t, int64_t i1, int64_t i2, int64_t i3) {
    return t.data + i1 * t.nb[1] + i2 * t.nb[2] + i3 * t.nb[3];
}

/* 6-bit scale and min j of a Q4_K super-block (quant-impl.h toy_q4k_scale_min) */
__host__ __device__ __forceinline__ void q4k_scale_min(int j, const uint8_t *q, int *d, int *m) {
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

__host__ __device__ __forceinline__ float h2f_at(const uint8_t *p) { /* an f16 at a 2-byte aligned address */
    return __half2float(*(const __half *)p);
}
__host__ __device__ __forceinline__ uint32_t u32_at(const uint8_t *p) { /* unaligned little-endian u32 */
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

/* the fifth bit of element j (0..31) of a Q5_0 / Q5_1 block, as 0 or 16 */
__host__ __device__ __forceinline__ int q5_high(uint32_t qh, int j) {
    return j < 16 ? (int)(((qh >> j) << 4) & 0x10) : (int)((qh >> (j - 16 + 12)) & 0x10);
}

/* the 6-bit scale of 16-element group is (0..15) of a Q3_K super-block's
 * 12 scale bytes sc, minus 32 (quant-impl.h toy_q3k_scales) */
__host__ __device__ __forceinline__ int q3k_scale(const uint8_t *sc, int is) {
    return ((is < 8 ? sc[is] & 0xF : sc[is - 8] >> 4) | ((sc[8 + is % 4] >> (2 * (is / 4))) & 3) << 4) - 32;
}

/* value i (0..15) of the IQ4 codebook (quant-impl.h toy_iq4_codebook), from
 * two words: no table in memory */
__host__ __device__ __forceinline__ int iq4_val(int i) {
    uint64_t w = i < 8 ? 0xF6EADDCFBFAD9881ULL : 0x7159453526190D01ULL;
    return (int)(int8_t)(uint8_t)(w >> (8 * (i & 7)));
}

/* value i (0..15) of MXFP4 (quant-impl.h toy_mxfp4_values: the E2M1 code
 * points doubled), from two words as iq4_val */
__host__ __device__ __forceinline__ int mxfp4_val(int i) {
    uint64_t w = i < 8 ? 0x0C08060403020100ULL : 0xF4F8FAFCFDFEFF00ULL;
    return (int)(int8_t)(uint8_t)(w >> (8 * (i & 7)));
}

/* an MXFP4 block's scale from its E8M0 byte: 2^(e - 128) exactly
 * (quant-impl.h toy_e8m0_half), subnormal for e < 2 */
__host__ __device__ __forceinline__ float e8m0_half(uint8_t e) {
    uint32_t u = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* element i0 of a row of any supported dtype, as f32 */
__host__ __device__ __forceinline__ float ld_row(int type, const char *row, int64_t i0, int64_t nb0) {
    switch (type) {
    case TOY_F32: return *(const float *)(row + i0 * nb0);
    case TOY_F16: return __half2float(*(const __half *)(row + i0 * nb0));
    case TOY_BF16: return __bfloat162float(*(const __nv_bfloat16 *)(row + i0 * nb0));
    case TOY_I32: return (float)*(const int32_t *)(row + i0 * nb0);
    case TOY_Q8_0: {
        const char *b = row + (i0 / 32) * 34;
        return __half2float(*(const __half *)b) * (float)((const int8_t *)(b + 2))[i0 % 32];
    }
    case TOY_Q4_0: {
        const char *b = row + (i0 / 32) * 18;
        int j = (int)(i0 % 32);
        uint8_t byte = ((const uint8_t *)(b + 2))[j % 16];
        int nib = j < 16 ? (byte & 0xF) : (byte >> 4);
        return __half2float(*(const __half *)b) * (float)(nib - 8);
    }
    case TOY_Q4_K: {
        const uint8_t *b = (const uint8_t *)row + (i0 / 256) * 144;
        int j = (int)(i0 % 256), chunk = j / 64, w = j % 64;
        int sc, m;
        q4k_scale_min(2 * chunk + (w >= 32), b + 4, &sc, &m);
        uint8_t byte = b[16 + chunk * 32 + (w % 32)];
        int nib = w < 32 ? (byte & 0xF) : (byte >> 4);
        float d = __half2float(*(const __half *)b), dmin = __half2float(*(const __half *)(b + 2));
        return d * (float)sc * (float)nib - dmin * (float)m;
    }
    case TOY_Q4_1: {
        const uint8_t *b = (const uint8_t *)row + (i0 / 32) * 20;
        int j = (int)(i0 % 32);
        uint8_t byte = b[4 + j % 16];
        int nib = j < 16 ? (byte & 0xF) : (byte >> 4);
        return (float)nib * h2f_at(b) + h2f_at(b + 2);
    }
    case TOY_Q5_0: {
        const uint8_t *b = (const uint8_t *)row + (i0 / 32) * 22;
        int j = (int)(i0 % 32);
        uint8_t byte = b[6 + j % 16];
        int x = (j < 16 ? (byte & 0xF) : (byte >> 4)) | q5_high(u32_at(b + 2), j);
        return (float)(x - 16) * h2f_at(b);
    }
    case TOY_Q5_1: {
        const uint8_t *b = (const uint8_t *)row + (i0 / 32) * 24;
        int j = (int)(i0 % 32);
        uint8_t byte = b[8 + j % 16];
        int x = (j < 16 ? (byte & 0xF) : (byte >> 4)) | q5_high(u32_at(b + 4), j);
        return (float)x * h2f_at(b) + h2f_at(b + 2);
    }
    case TOY_Q5_K: {
        const uint8_t *b = (const uint8_t *)row + (i0 / 256) * 176;
        int j = (int)(i0 % 256), chunk = j / 64, w = j % 64, l = w % 32;
        int sc, m;
        q4k_scale_min(2 * chunk + (w >= 32), b + 4, &sc, &m);
        uint8_t byte = b[48 + chunk * 32 + l], hb = b[16 + l];
        int low = w < 32 ? (byte & 0xF) : (byte >> 4);
        int high = (hb >> (2 * chunk + (w >= 32))) & 1;
        return h2f_at(b) * (float)sc * (float)(low + 16 * high) - h2f_at(b + 2) * (float)m;
    }
    case TOY_Q6_K: {
        const uint8_t *b = (const uint8_t *)row + (i0 / 256) * 210;
        int j = (int)(i0 % 256), n = j / 128, r = j % 128, quarter = r / 32, l = r % 32;
        const uint8_t *ql = b + 64 * n, *qh = b + 128 + 32 * n;
        const int8_t *sc = (const int8_t *)(b + 192) + 8 * n;
        int lo = quarter & 1 ? ql[l + 32] : ql[l];
        lo = quarter < 2 ? (lo & 0xF) : (lo >> 4);
        int q = (lo | (((qh[l] >> (2 * quarter)) & 3) << 4)) - 32;
        return h2f_at(b + 208) * (float)sc[l / 16 + 2 * quarter] * (float)q;
    }
    case TOY_Q2_K: { /* 16-element groups: d scale q - dmin min, q 0..3 */
        const uint8_t *b = (const uint8_t *)row + (i0 / 256) * 84;
        int j = (int)(i0 % 256), n = j / 128, s = (j % 128) / 32, l = j % 32;
        int q = (b[16 + 32 * n + l] >> (2 * s)) & 3, sm = b[8 * n + 2 * s + (l >= 16)];
        return h2f_at(b + 80) * (float)(sm & 0xF) * (float)q - h2f_at(b + 82) * (float)(sm >> 4);
    }
    case TOY_Q3_K: { /* 16-element groups: d (scale - 32) q, q -4..3 */
        const uint8_t *b = (const uint8_t *)row + (i0 / 256) * 110;
        int j = (int)(i0 % 256), n = j / 128, s = (j % 128) / 32, l = j % 32, is = 8 * n + 2 * s + (l >= 16);
        int q = ((b[32 + 32 * n + l] >> (2 * s)) & 3) - ((b[l] >> (4 * n + s)) & 1 ? 0 : 4);
        return h2f_at(b + 108) * (float)q3k_scale(b + 96, is) * (float)q;
    }
    case TOY_IQ4_NL: {
        const uint8_t *b = (const uint8_t *)row + (i0 / 32) * 18;
        int j = (int)(i0 % 32);
        uint8_t byte = b[2 + j % 16];
        return h2f_at(b) * (float)iq4_val(j < 16 ? (byte & 0xF) : (byte >> 4));
    }
    case TOY_MXFP4: { /* u8 e | u8 qs[16]: byte-aligned blocks of 17 */
        const uint8_t *b = (const uint8_t *)row + (i0 / 32) * 17;
        int j = (int)(i0 % 32);
        uint8_t byte = b[1 + j % 16];
        return (float)mxfp4_val(j < 16 ? (byte & 0xF) : (byte >> 4)) * e8m0_half(b[0]);
    }
    case TOY_IQ4_XS: { /* 32-element groups: d (scale - 32) codebook[q] */
        const uint8_t *b = (const uint8_t *)row + (i0 / 256) * 136;
        int j = (int)(i0 % 256), ib = j / 32, w = j % 32;
        uint8_t byte = b[8 + 16 * ib + w % 16];
        int ls = ((b[4 + ib / 2] >> (4 * (ib % 2))) & 0xF) | ((((int)b[2] | (int)b[3] << 8) >> (2 * ib)) & 3) << 4;
        return h2f_at(b) * (float)(ls - 32) * (float)iq4_val(w < 16 ? (byte & 0xF) : (byte >> 4));
    }
    default: return 0.0f; /* rejected on the host (type_ok) */
    }
}

/* Bytes of a 32-element block of the types the decode GEMV takes a
 * half-warp a block (k_qgemv_blocks), 0 for the others */
__host__ __device__ __forceinline__ int q_block_bytes(int t) {
    return t == TOY_Q8_0 ? 34 : t == TOY_Q4_0 || t == TOY_IQ4_NL ? 18 : t == TOY_Q4_1 ? 20 : t == TOY_Q5_0 ? 22
         : t == TOY_Q5_1 ? 24 : t == TOY_MXFP4 ? 17 : 0;
}

/* the scale d of such a block at b: an f16 at offset 0 (b 2-byte aligned),
 * or MXFP4's E8M0 byte (its blocks of 17 bytes are byte-aligned only) */
__host__ __device__ __forceinline__ float q_block_d(const uint8_t *b, int t) {
    return t == TOY_MXFP4 ? e8m0_half(b[0]) : h2f_at(b);
}

/* Lane l (0..15) of the half-warp that takes one 32-element block of type
 * t (q_block_bytes) in the decode GEMV: the block's elements e[0], e[1]
 * that it owns and their unscaled weights w[0], w[1]; element = d w + m,
 * d = q_block_d(b, t), m the block's min (Q4_1, Q5_1; else 0). Q8_0: bytes 2l and
 * 2l + 1, one 2-byte load (b is 2-byte aligned: rows and blocks are
 * multiples of 34 bytes); the others: byte l's nibbles, elements l and
 * l + 16, with their fifth bits for Q5_0 / Q5_1. */
__host__ __device__ __forceinline__ void q_block_pair(const uint8_t *b, int t, int l, int *e, float *w, float *m) {
    *m = 0.0f;
    if (t == TOY_Q8_0) {
        uint16_t q = *(const uint16_t *)(b + 2 + 2 * l);
        e[0] = 2 * l, e[1] = 2 * l + 1;
        w[0] = (float)(int8_t)(q & 0xff);
        w[1] = (float)(int8_t)(q >> 8);
        return;
    }
    e[0] = l, e[1] = l + 16;
    if (t == TOY_Q4_0) {
        uint8_t q = b[2 + l];
        w[0] = (float)((q & 0xF) - 8);
        w[1] = (float)((q >> 4) - 8);
        return;
    }
    if (t == TOY_IQ4_NL) {
        uint8_t q = b[2 + l];
        w[0] = (float)iq4_val(q & 0xF);
        w[1] = (float)iq4_val(q >> 4);
        return;
    }
    if (t == TOY_MXFP4) {
        uint8_t q = b[1 + l];
        w[0] = (float)mxfp4_val(q & 0xF);
        w[1] = (float)mxfp4_val(q >> 4);
        return;
    }
    bool min = t == TOY_Q4_1 || t == TOY_Q5_1, fifth = t == TOY_Q5_0 || t == TOY_Q5_1;
    const uint8_t *qs = b + (t == TOY_Q4_1 ? 4 : t == TOY_Q5_0 ? 6 : 8);
    uint32_t qh = fifth ? u32_at(b + (min ? 4 : 2)) : 0;
    int u0 = (qs[l] & 0xF) | (int)((qh >> l) & 1) << 4, u1 = (qs[l] >> 4) | (int)((qh >> (l + 16)) & 1) << 4;
    int off = min ? 0 : 16; /* Q5_0: q = u - 16 */
    w[0] = (float)(u0 - off);
    w[1] = (float)(u1 - off);
    if (min) *m = h2f_at(b + 2);
}

__host__ __device__ __forceinline__ float ld(const CT &t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
    return ld_row(t.type, ct_row(t, i1, i2, i3), i0, t.nb[0]);
}

/* with broadcasting of size-1 dims */
__host__ __device__ __forceinline__ float ld_b(const CT &t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
    return ld(t, t.ne[0] == 1 ? 0 : i0, t.ne[1] == 1 ? 0 : i1, t.ne[2] == 1 ? 0 : i2, t.ne[3] == 1 ? 0 : i3);
}

/* flat index -> (i0, i1, i2, i3); 32-bit division when it fits (64-bit
 * division is tens of instructions on a GPU) */
__host__ __device__ __forceinline__ void unravel4(int64_t e, const int64_t *ne, int64_t *i) {
    if (e < 0xffffffffLL && ne[0] < 0xffffffffLL && ne[1] < 0xffffffffLL && ne[2] < 0xffffffffLL) {
        uint32_t x = (uint32_t)e, n0 = (uint32_t)ne[0], n1 = (uint32_t)ne[1], n2 = (uint32_t)ne[2];
        i[0] = x % n0;
        x /= n0;
        i[1] = x % n1;
        x /= n1;
        i[2] = x % n2;
        i[3] = x / n2;
        return;
    }
    i[0] = e % ne[0];
    e /= ne[0];
    i[1] = e % ne[1];
    e /= ne[1];
    i[2] = e % ne[2];
    i[3] = e / ne[2];
}

/* element e of a contiguous tensor of a plain dtype */
__device__ __forceinline__ float ld_flat(const CT &t, int64_t e) {
    switch (t.type) {
    case TOY_F32: return ((const float *)t.data)[e];
    case TOY_F16: return __half2float(((const __half *)t.data)[e]);
    case TOY_BF16: return __bfloat162float(((const __nv_bfloat16 *)t.data)[e]);
    default: return (float)((const int32_t *)t.data)[e];
    }
}

/* four floats to out[0..3] as two half2 / bfloat162 stores (out 4-byte
 * aligned): the conversions of GEMM operands and of attention tiles */
__device__ __forceinline__ void store4(__half *out, float4 v) {
    __half2 *o = (__half2 *)out;
    o[0] = __floats2half2_rn(v.x, v.y);
    o[1] = __floats2half2_rn(v.z, v.w);
}
__device__ __forceinline__ void store4(__nv_bfloat16 *out, float4 v) {
    __nv_bfloat162 *o = (__nv_bfloat162 *)out;
    o[0] = __floats2bfloat162_rn(v.x, v.y);
    o[1] = __floats2bfloat162_rn(v.z, v.w);
}

/* two floats as a BF16 pair in one register (lo in the low half): an mma
 * operand */
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    uint32_t u;
    memcpy(&u, &h, 4);
    return u;
}

/* d = a b + c, one mma.sync.m16n8k16: A 16 x 16 and B 16 x 8 in BF16, C and
 * D in F32, each lane's registers in PTX's fragment layout (with g = lane /
 * 4, t = lane % 4: a = A[g][2t..], A[g+8][2t..], A[g][2t+8..],
 * A[g+8][2t+8..]; b = B[2t..][g], B[2t+8..][g]; c, d = C[g][2t], C[g][2t+1],
 * C[g+8][2t], C[g+8][2t+1]; tools/cuda-emu/emu.h computes it so) */
__device__ __forceinline__ void mma_bf16(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]) {
#ifdef TOY_CUDA_EMU
    toy_emu_mma_bf16(d, a, b, c);
#else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%10, %11, %12, %13};\n"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
                   "f"(c[3]));
#endif
}

/* contiguous with a plain (non-block) dtype: element e sits at e * size */
static inline bool ct_flat(const CT &t) {
    int64_t es = t.type == TOY_F32 || t.type == TOY_I32 ? 4 : t.type == TOY_F16 || t.type == TOY_BF16 ? 2 : 0;
    if (!es) return false;
    int64_t want = es;
    for (int d = 0; d < 4; d++) {
        if (t.ne[d] != 1 && t.nb[d] != want) return false;
        want *= t.ne[d];
    }
    return true;
}

static inline bool same_shape(const CT &a, const CT &b) {
    return a.ne[0] == b.ne[0] && a.ne[1] == b.ne[1] && a.ne[2] == b.ne[2] && a.ne[3] == b.ne[3];
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* block-wide sum / max (blockDim a multiple of 32, <= 1024); every thread gets the result */
__device__ __forceinline__ float block_sum(float v) {
    __shared__ float sh[32];
    __syncthreads();
    v = warp_sum(v);
    int lane = threadIdx.x % 32, w = threadIdx.x / 32, nw = blockDim.x / 32;
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : 0.0f;
    return warp_sum(v);
}
__device__ __forceinline__ float block_max(float v) {
    __shared__ float sh[32];
    __syncthreads();
    v = warp_max(v);
    int lane = threadIdx.x % 32, w = threadIdx.x / 32, nw = blockDim.x / 32;
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : -INFINITY;
    return warp_max(v);
}
__device__ __forceinline__ double block_sum_d(double v) {
    __shared__ double shd[32];
    __syncthreads();
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    int lane = threadIdx.x % 32, w = threadIdx.x / 32, nw = blockDim.x / 32;
    if (lane == 0) shd[w] = v;
    __syncthreads();
    v = lane < nw ? shd[lane] : 0.0;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* A warp as the thread group of one row (kernels-ops.cu's row kernels;
 * the GEMV's norm prologues): lane t of 32, row r; sums in a fixed order. */
struct row_warp {
    int64_t r;
    int t, nt;
    __device__ row_warp() : r(blockIdx.x * (int64_t)(blockDim.x / 32) + threadIdx.x / 32), t(threadIdx.x % 32), nt(32) {}
    __device__ row_warp(int64_t row, int lane) : r(row), t(lane), nt(32) {}
    __device__ float sum(float v) const { return warp_sum(v); }
    __device__ double sum_d(double v) const {
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        return v;
    }
};

/* A norm's row statistics in double, as the CPU: the mean (layer) and
 * 1/std, or 1/rms (mean 0). Group g's thread t sums elements t, t + nt, ...
 * of the n that at(i) loads. The LAYER_NORM kernels and the GEMV's
 * LayerNorm prologue (kernels-matmul.cu) both use it and layer_out, so a
 * fused product reads the norm's very bits. */
template <class G, class LD>
__device__ void norm_stats(const G &g, const LD &at, int64_t n, bool layer, float eps, double *mu, double *rstd) {
    double s = 0;
    if (layer) {
        for (int64_t i = g.t; i < n; i += g.nt) s += at(i);
        s = g.sum_d(s) / (double)n;
    }
    double v = 0;
    for (int64_t i = g.t; i < n; i += g.nt) {
        double d = (double)at(i) - s;
        v += d * d;
    }
    v = g.sum_d(v) / (double)n;
    *mu = s;
    *rstd = 1.0 / sqrt(v + (double)eps);
}

/* a LayerNorm's output element: (x - mu) rstd, times w, plus b, each step
 * rounded (no FMA: the same bits wherever it is inlined) */
__device__ __forceinline__ float layer_out(float x, float mu, float rstd, bool has_w, float w, bool has_b, float b) {
    float v = __fmul_rn(x - mu, rstd);
    if (has_w) v = __fmul_rn(v, w);
    return has_b ? __fadd_rn(v, b) : v;
}

/* GELU, tanh approximation (the GELU kernel and the GEMV's GELU prologue) */
#define GELU_C 0.7978845608028654f
__device__ __forceinline__ float gelu_f(float x) { return 0.5f * x * (1.0f + tanhf(GELU_C * (x + 0.044715f * x * x * x))); }

/* One AdamW element in torch's operation order (simd.c's ref_adamw), every
 * product, quotient and sum rounded on its own: in device code through the
 * _rn intrinsics, so nvcc cannot contract a product and a sum into an FMA
 * (the CPU's bits); on the host (tools/cuda-host-check.cu compares it with
 * the CPU library) as plain float arithmetic. */
#ifdef __CUDA_ARCH__
#define TOY_CU_MUL(a, b) __fmul_rn((a), (b))
#define TOY_CU_ADD(a, b) __fadd_rn((a), (b))
#define TOY_CU_DIV(a, b) __fdiv_rn((a), (b))
#define TOY_CU_SQRT(a) __fsqrt_rn(a)
#else
#define TOY_CU_MUL(a, b) ((float)((a) * (b)))
#define TOY_CU_ADD(a, b) ((float)((a) + (b)))
#define TOY_CU_DIV(a, b) ((float)((a) / (b)))
#define TOY_CU_SQRT(a) sqrtf(a)
#endif
__host__ __device__ __forceinline__ void toy_cu_adamw_elem(float *p, float g, float *m, float *v, float lr, float b1,
                                                           float b2, float eps, float wd, float bc1, float bc2sqrt) {
    float decay = 1.0f - TOY_CU_MUL(lr, wd), step = TOY_CU_DIV(lr, bc1);
    float pi = TOY_CU_MUL(*p, decay);
    float mi = TOY_CU_ADD(TOY_CU_MUL(*m, b1), TOY_CU_MUL(g, 1.0f - b1));
    float vi = TOY_CU_ADD(TOY_CU_MUL(*v, b2), TOY_CU_MUL(TOY_CU_MUL(1.0f - b2, g), g));
    float denom = TOY_CU_ADD(TOY_CU_DIV(TOY_CU_SQRT(vi), bc2sqrt), eps);
    *p = TOY_CU_ADD(pi, TOY_CU_MUL(-step, TOY_CU_DIV(mi, denom)));
    *m = mi;
    *v = vi;
}

/* the last launch's error as a toy_status (0 when fine) */
static inline int launch_status(const char *what, char *msg, size_t msg_size) {
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) return 0;
    snprintf(msg, msg_size, "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
    return e == cudaErrorMemoryAllocation ? TOY_ERR_NOMEM : TOY_ERR_BACKEND;
}

/* launchers in other files */
extern "C" {
int toy_cu_matmul(const struct toy_cu_node *n, char *msg, size_t msg_size);
size_t toy_cu_matmul_work(const struct toy_cu_node *n);
int toy_cu_attention(const struct toy_cu_node *n, char *msg, size_t msg_size);
/* a fused attention's ROPEs and KV_STOREs (kernels-ops.cu) */
int toy_cu_attention_prologue(const struct toy_cu_node *n, char *msg, size_t msg_size);
int toy_cu_attention_back(const struct toy_cu_node *n, char *msg, size_t msg_size);
int toy_cu_attn_sinks_back(const struct toy_cu_node *n, char *msg, size_t msg_size);
size_t toy_cu_attention_work(const struct toy_cu_node *n, bool lean);
}

#endif
