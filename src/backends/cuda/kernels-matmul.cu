/* kernels-matmul.cu: batched matrix products on CUDA (semantics of
 * src/backends/cpu/matmul.c).
 *
 * C (m x n, row-major F32) = op(A) op(B), batch dims broadcast by ratio
 * (GQA: batch i of C reads batch i / (C batches / B batches) of B). cuBLAS is
 * column-major, so it computes C^T = op(B)^T op(A)^T: a row-major matrix is
 * its transpose in column-major, which makes the calls below
 * gemm(opB, opA, n, m, k, B, A, C) with the row strides as leading dims.
 *
 *   B F32        F32 compute (TOY_CUDA_MATH=f32, the default: matches the
 *                CPU), TF32 tensor cores (tf32), or A and B rounded to BF16
 *                (bf16);
 *   B F16/BF16   A converted to B's type, F32 accumulation;
 *   B quantized  up to 8 rows (decode): a GEMV kernel that dequantizes in
 *                registers (the 32-element block types, IQ4_NL and MXFP4 one,
 *                the k-quants and IQ4_XS a warp per super-block; rows not
 *                so aligned element by element); more rows: chunks of B
 *                dequantized to F32 in scratch, then F32 GEMM (as the CPU
 *                does).
 * Accumulating products (persistent gradients) use beta = 1.
 */
#include <cublas_v2.h>
#include <type_traits>

#include "backends/cuda/kernels-common.cuh"

#define QCHUNK_BYTES ((size_t)64 << 20)
#define GEMV_MAX_ROWS 8

__host__ __device__ static int64_t bratio(int64_t i, int64_t n_out, int64_t n_src) {
    return n_src == n_out ? i : n_src == 1 ? 0 : i / (n_out / n_src);
}

static bool is_quant(int t) {
    return t == TOY_Q8_0 || t == TOY_Q4_0 || t == TOY_Q4_1 || t == TOY_Q5_0 || t == TOY_Q5_1 || t == TOY_Q4_K ||
           t == TOY_Q5_K || t == TOY_Q6_K || t == TOY_Q2_K || t == TOY_Q3_K || t == TOY_IQ4_NL || t == TOY_IQ4_XS ||
           t == TOY_MXFP4;
}

/* contiguous copy of x (logical order) in half / bfloat16 / float */
template <typename T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }

template <typename T> __global__ void k_convert(T *out, CT x, int64_t pitch) {
    int64_t n = ct_nel(x);
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        int64_t i[4];
        unravel4(e, x.ne, i);
        out[((i[3] * x.ne[2] + i[2]) * x.ne[1] + i[1]) * pitch + i[0]] = from_f<T>(ld(x, i[0], i[1], i[2], i[3]));
    }
}

/* Converted operands' rows start 16-byte aligned: the row pitch is rounded
 * up to 8 elements. cuBLAS's fast (TMA, vectorised) kernels need aligned
 * leading dimensions; GPT-2's vocabulary (50257) makes the gradient
 * products' rows odd otherwise. */
static int64_t pitch_of(int64_t ne0) { return (ne0 + 7) / 8 * 8; }
static size_t converted_elems(const CT &x) { return (size_t)(pitch_of(x.ne[0]) * ct_nrows(x)); }

/* the same for a contiguous f32 x at a 16-byte aligned address (most
 * products) into an 8-byte aligned out: four elements a thread (store4),
 * no index arithmetic */
template <typename T> __global__ void k_convert_flat(T *out, const float *x, int64_t n) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x, n4 = n / 4;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n4; i += stride)
        store4(out + 4 * i, ((const float4 *)x)[i]);
    for (int64_t e = 4 * n4 + blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n; e += stride) out[e] = from_f<T>(x[e]);
}

/* x (f32, any strides) as a T array of rows pitch_of(ne0) apart */
template <typename T> static void convert(T *out, const CT &x, cudaStream_t st) {
    int64_t n = ct_nel(x), pitch = pitch_of(x.ne[0]);
    if (x.type == TOY_F32 && ct_flat(x) && pitch == x.ne[0] && (uintptr_t)x.data % 16 == 0 && (uintptr_t)out % 8 == 0)
        k_convert_flat<T><<<grid_for(cdiv(n, 4), 256), 256, 0, st>>>(out, (const float *)x.data, n);
    else
        k_convert<T><<<grid_for(n, 256), 256, 0, st>>>(out, x, pitch);
}

/* rows [r0, r0+nr) of a 2-D slice of a quantized B as f32 or bf16 (nr x k) */
template <typename T>
__global__ void k_dequant_rows(T *out, const char *b, int type, int64_t nb1, int64_t k, int64_t r0, int64_t nr) {
    int64_t n = nr * k;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = e / k, c = e % k;
        out[e] = from_f<T>(ld_row(type, b + (r0 + r) * nb1, c, 0));
    }
}

/* A prologue folded into the product (graph-fuse.c, P_MM_PRE): A's rows
 * are RMS_NORM(x) (times w), LAYER_NORM(x) (times w, plus b), SWIGLU(g, u)
 * or GELU(x) of the rows the product reads, computed as they are loaded,
 * with the norm, SWIGLU and GELU kernels' arithmetic (a row's statistics
 * summed as the warp-per-row norms sum them: norm_stats), so the products
 * are bit for bit the unfused ones where the norm ran a warp per row (rows
 * up to 4096). It saves the norm's or activation's launch. The
 * GEMV kernels take the prologue as a template argument (PRE, a
 * TOY_MM_PRE_*), so the plain products compile as before: a runtime mode
 * cost them 2-4x the registers. */
struct gemv_pro {
    int mode;      /* TOY_MM_PRE_* */
    const char *w; /* norms: the weight, f32 (NULL: none); SwiGLU: u's rows, as A's */
    const char *b; /* LayerNorm: the bias, f32 (NULL: none) */
    int64_t u_nb1; /* SwiGLU: u's row stride, bytes */
    float eps;
};
/* the prologue's row statistics in shared memory: 1/rms, or LayerNorm's
 * mean at [i] and 1/std at [GEMV_MAX_ROWS + i] */
#define GEMV_STATS (2 * GEMV_MAX_ROWS)
static __host__ __device__ bool pro_norm(int mode) { return mode == TOY_MM_PRE_RMS || mode == TOY_MM_PRE_LAYER; }

static gemv_pro pro_of(const struct toy_cu_node *nd) {
    gemv_pro P;
    memset(&P, 0, sizeof P);
    P.mode = nd->op_params[P_MM_PRE];
    if (P.mode && nd->has_src[2]) {
        P.w = nd->src[2].data;
        P.u_nb1 = nd->src[2].nb[1];
    }
    if (P.mode == TOY_MM_PRE_LAYER && nd->has_src[3]) P.b = nd->src[3].data;
    memcpy(&P.eps, &nd->op_params[P_MM_EPS], sizeof P.eps);
    return P;
}

/* The norms' statistics of each of A's m rows (a at row 0, rows nb1
 * apart) into rstd (GEMV_STATS), a warp per row: RMS's 1/rms, or
 * LayerNorm's mean and 1/std. The block's threads wait for it. */
__device__ void pro_begin(const gemv_pro &P, const char *a, int64_t nb1, int64_t m, int64_t k, float *rstd) {
    int w = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (w < m) {
        const float *x = (const float *)(a + w * nb1);
        if (P.mode == TOY_MM_PRE_LAYER) {
            double mu, rs;
            norm_stats(row_warp(w, lane), [&](int64_t i) { return x[i]; }, k, true, P.eps, &mu, &rs);
            if (lane == 0) rstd[w] = (float)mu, rstd[GEMV_MAX_ROWS + w] = (float)rs;
        } else {
            float ss = 0;
            for (int64_t i = lane; i < k; i += 32) {
                float v = x[i];
                ss += v * v;
            }
            ss = warp_sum(ss);
            if (lane == 0) rstd[w] = rsqrtf(ss / (float)k + P.eps);
        }
    }
    __syncthreads();
}

/* element c of A's row i, x being the loaded element */
template <int PRE>
__device__ __forceinline__ float pro_at(const gemv_pro &P, const float *rstd, int i, int64_t c, float x) {
    if (PRE == TOY_MM_PRE_RMS) {
        float v = x * rstd[i];
        return P.w ? v * ((const float *)P.w)[c] : v;
    }
    if (PRE == TOY_MM_PRE_SWIGLU) {
        float u = *(const float *)(P.w + i * P.u_nb1 + c * 4);
        return x / (1.0f + expf(-x)) * u;
    }
    if (PRE == TOY_MM_PRE_LAYER)
        return layer_out(x, rstd[i], rstd[GEMV_MAX_ROWS + i], P.w != NULL, P.w ? ((const float *)P.w)[c] : 0.0f,
                         P.b != NULL, P.b ? ((const float *)P.b)[c] : 0.0f);
    if (PRE == TOY_MM_PRE_GELU) return gelu_f(x);
    return x;
}

/* The products one GEMV launch computes: a product and its siblings
 * (graph-fuse.c: the same A and prologue, other weights and results),
 * blocks [first[p], first[p + 1]) taking product p's columns. */
#define GEMV_MAX_PRODUCTS 3
struct gemv_out { /* what a GEMV needs of a product: C, B and a bias row */
    char *c;
    int64_t n, c_nb2, c_nb3;
    const float *bias; /* added to each of C's rows before any accumulation (NULL: none) */
    const char *b;
    int64_t b_nb1, b_nb2, b_nb3, b_ne2, b_ne3;
    int b_type;
};
struct gemv_set {
    gemv_out p[GEMV_MAX_PRODUCTS];
    unsigned first[GEMV_MAX_PRODUCTS];
    int n;
    int64_t m, ne2, ne3; /* C's rows and batches (the same for every product) */
};

static gemv_out gemv_out_of(const CT &dst, const CT &B, const CT *bias) {
    gemv_out o = {dst.data, dst.ne[0], dst.nb[2], dst.nb[3], bias ? (const float *)bias->data : NULL,
                  B.data, B.nb[1], B.nb[2], B.nb[3], B.ne[2], B.ne[3], B.type};
    return o;
}

/* The GEMVs' common parts: a warp per output column j of batch (i2, i3) of
 * the block's product, A's batch and B's row j, as bratio broadcasts them;
 * the prologue's row statistics; and the warp's sums written (or added) to
 * C's m rows. */
template <int PRE> struct gemv_at {
    int64_t n, m, k, j, i2, i3;
    int lane, b_type;
    const char *a, *brow;
    char *cc;
    const float *bias;
    __device__ gemv_at(const gemv_set &S, const CT &A, const gemv_pro &P, float *rstd) {
        const int p = S.n > 2 && blockIdx.x >= S.first[2] ? 2 : S.n > 1 && blockIdx.x >= S.first[1] ? 1 : 0;
        const gemv_out &o = p == 2 ? S.p[2] : p == 1 ? S.p[1] : S.p[0];
        n = o.n, m = S.m, k = A.ne[0];
        b_type = o.b_type;
        j = (blockIdx.x - S.first[p]) * (int64_t)(blockDim.x / 32) + threadIdx.x / 32;
        lane = threadIdx.x % 32;
        i2 = blockIdx.y % S.ne2, i3 = blockIdx.y / S.ne2;
        a = A.data + bratio(i2, S.ne2, A.ne[2]) * A.nb[2] + bratio(i3, S.ne3, A.ne[3]) * A.nb[3];
        brow = o.b + bratio(i2, S.ne2, o.b_ne2) * o.b_nb2 + bratio(i3, S.ne3, o.b_ne3) * o.b_nb3 + (j < n ? j : 0) * o.b_nb1;
        cc = o.c + i2 * o.c_nb2 + i3 * o.c_nb3;
        bias = o.bias;
        if (pro_norm(PRE)) pro_begin(P, a, A.nb[1], m, k, rstd); /* before any warp leaves: it waits for the block */
    }
    /* the sums, plus the bias (ADD(product, bias)'s rounding), then into C
     * or added to it (the residual ADD's) */
    __device__ void store(float *acc, bool accum) const {
        float *c = (float *)cc;
        for (int i = 0; i < GEMV_MAX_ROWS; i++) {
            if (i >= m) break;
            float v = warp_sum(acc[i]);
            if (bias) v = v + bias[j];
            if (lane == 0) c[i * n + j] = accum ? c[i * n + j] + v : v;
        }
    }
};

/* C[i, j] (+)= sum_c A[i, c] B[j, c]: a warp per j, m <= GEMV_MAX_ROWS rows of A */
template <int PRE> __global__ void k_qgemv(gemv_set S, CT A, gemv_pro P, bool accum) {
    __shared__ float rstd[GEMV_STATS];
    const gemv_at<PRE> G(S, A, P, rstd);
    if (G.j >= G.n) return;
    const int64_t m = G.m, k = G.k;
    const int lane = G.lane;
    const char *a = G.a, *brow = G.brow;
    float acc[GEMV_MAX_ROWS];
    for (int i = 0; i < GEMV_MAX_ROWS; i++) acc[i] = 0.0f;
    for (int64_t c = lane; c < k; c += 32) {
        float w = ld_row(G.b_type, brow, c, 0);
        for (int i = 0; i < GEMV_MAX_ROWS; i++)
            if (i < m) acc[i] += w * pro_at<PRE>(P, rstd, i, c, *(const float *)(a + i * A.nb[1] + c * 4));
    }
    G.store(acc, accum);
}

/* The same for Q8_0 / Q4_0 / Q4_1 / Q5_0 / Q5_1 weights, a half-warp per
 * 32-element block (two blocks a step): lane l of the half takes two of
 * the block's weights
 * (q_block_pair), so the warp reads the weights and A's rows in contiguous
 * runs. (A lane per block read A with a 128-byte stride between lanes: 32
 * cache lines per load instruction.) */
template <int PRE> __global__ void k_qgemv_blocks(gemv_set S, CT A, gemv_pro P, bool accum) {
    __shared__ float rstd[GEMV_STATS];
    const gemv_at<PRE> G(S, A, P, rstd);
    if (G.j >= G.n) return;
    const int64_t m = G.m, k = G.k;
    const int lane = G.lane;
    const char *a = G.a;
    const uint8_t *brow = (const uint8_t *)G.brow;
    const int half = lane / 16, l = lane % 16;
    const int t = G.b_type;
    const bool min = t == TOY_Q4_1 || t == TOY_Q5_1;
    int64_t nblk = k / 32, bsz = q_block_bytes(t);
    float acc[GEMV_MAX_ROWS];
    for (int i = 0; i < GEMV_MAX_ROWS; i++) acc[i] = 0.0f;
    for (int64_t blk = half; blk < nblk; blk += 2) {
        const uint8_t *bp = brow + blk * bsz;
        int e[2];
        float w[2], mn, d = q_block_d(bp, t);
        q_block_pair(bp, t, l, e, w, &mn);
        for (int i = 0; i < GEMV_MAX_ROWS; i++) {
            if (i >= m) break;
            const float *x = (const float *)(a + i * A.nb[1]) + blk * 32;
            float x0 = pro_at<PRE>(P, rstd, i, blk * 32 + e[0], x[e[0]]);
            float x1 = pro_at<PRE>(P, rstd, i, blk * 32 + e[1], x[e[1]]);
            if (min) acc[i] += d * (w[0] * x0 + w[1] * x1) + mn * (x0 + x1);
            else acc[i] += d * (w[0] * x0 + w[1] * x1);
        }
    }
    G.store(acc, accum);
}

/* A row's eight elements c[0..3] and c[4..7] (consecutive runs of four,
 * 16-byte aligned) as the prologue makes them */
template <int PRE>
__device__ __forceinline__ void pro_run4(const gemv_pro &P, const float *rstd, int i, int64_t c, float4 &x) {
    if (PRE) {
        x.x = pro_at<PRE>(P, rstd, i, c, x.x), x.y = pro_at<PRE>(P, rstd, i, c + 1, x.y);
        x.z = pro_at<PRE>(P, rstd, i, c + 2, x.z), x.w = pro_at<PRE>(P, rstd, i, c + 3, x.w);
    }
}

/* The same for Q4_K and Q5_K weights (super-blocks of 256: f16 d and dmin,
 * 12 bytes of 6-bit sub-block scales and mins; Q5_K then 32 bytes of fifth
 * bits qh; 128 bytes of nibbles): a warp per super-block a step. Lane l
 * takes the four bytes 4(l % 8) of 64-element chunk g = l / 8: their low
 * nibbles are four elements of the chunk's first sub-block, the high ones
 * four of its second. So the warp reads the nibbles in one contiguous
 * 128-byte run, a 4-byte load a lane, and A's rows in 16-byte runs. For
 * Q5_K lane l also loads qh's four bytes 4(l % 8): bit 2g of byte t is the
 * fifth bit of its low nibble t, bit 2g + 1 that of the high one. Each
 * sub-block adds d sc sum(q x) - dmin m sum(x). (The element-wise kernel
 * dequantized each weight on its own: the scales unpacked again per
 * element.) Needs 16-byte aligned rows of A (rows_aligned16) and 4-byte
 * aligned super-blocks. */
template <int T, int PRE> __global__ void k_qgemv_q45k(gemv_set S, CT A, gemv_pro P, bool accum) {
    __shared__ float rstd[GEMV_STATS];
    const gemv_at<PRE> G(S, A, P, rstd);
    if (G.j >= G.n) return;
    const int64_t m = G.m, nblk = G.k / 256;
    const int g = G.lane / 8, p = G.lane % 8;
    const int64_t bsz = T == TOY_Q5_K ? 176 : 144, qs = T == TOY_Q5_K ? 48 : 16;
    float acc[GEMV_MAX_ROWS];
    for (int i = 0; i < GEMV_MAX_ROWS; i++) acc[i] = 0.0f;
    for (int64_t blk = 0; blk < nblk; blk++) {
        const uint8_t *bp = (const uint8_t *)G.brow + blk * bsz;
        int sc0, m0, sc1, m1;
        q4k_scale_min(2 * g, bp + 4, &sc0, &m0);
        q4k_scale_min(2 * g + 1, bp + 4, &sc1, &m1);
        const float d = h2f_at(bp), dmin = h2f_at(bp + 2);
        const float ds0 = d * (float)sc0, dm0 = dmin * (float)m0, ds1 = d * (float)sc1, dm1 = dmin * (float)m1;
        const uint32_t q = *(const uint32_t *)(bp + qs + 32 * g + 4 * p);
        /* the fifth bits, as 16: bit 8t + 4 for low nibble t, 8t + 5 for the high one */
        const uint32_t h = T == TOY_Q5_K ? (*(const uint32_t *)(bp + 16 + 4 * p) >> (2 * g)) << 4 : 0;
        float lw[4], hw[4];
        for (int t = 0; t < 4; t++) {
            lw[t] = (float)(((q >> (8 * t)) & 0xF) | ((h >> (8 * t)) & 0x10));
            hw[t] = (float)(((q >> (8 * t + 4)) & 0xF) | ((h >> (8 * t + 1)) & 0x10));
        }
        const int64_t c = blk * 256 + 64 * g + 4 * p; /* the low nibbles' first element; the high ones' is c + 32 */
        for (int i = 0; i < GEMV_MAX_ROWS; i++) {
            if (i >= m) break;
            const float *x = (const float *)(G.a + i * A.nb[1]) + c;
            float4 lo = *(const float4 *)x, hi = *(const float4 *)(x + 32);
            pro_run4<PRE>(P, rstd, i, c, lo);
            pro_run4<PRE>(P, rstd, i, c + 32, hi);
            acc[i] += ds0 * (lw[0] * lo.x + lw[1] * lo.y + lw[2] * lo.z + lw[3] * lo.w) -
                      dm0 * (lo.x + lo.y + lo.z + lo.w) +
                      ds1 * (hw[0] * hi.x + hw[1] * hi.y + hw[2] * hi.z + hw[3] * hi.w) -
                      dm1 * (hi.x + hi.y + hi.z + hi.w);
        }
    }
    G.store(acc, accum);
}

/* The Q6_K, Q3_K and Q2_K GEMVs' sums: lane elements c + 32 r and c + 32 r
 * + 1 (r = 0..3, the four quarters of a half super-block) of each of A's
 * rows, as the prologue makes them, times the weights w[r], scaled by
 * ds[r], less dm[r] times their sum where MIN */
template <bool MIN, int PRE>
__device__ __forceinline__ void quarters_dot(const gemv_at<PRE> &G, const CT &A, const gemv_pro &P, const float *rstd,
                                             int64_t c, const float (&w)[4][2], const float *ds, const float *dm,
                                             float *acc) {
    for (int i = 0; i < GEMV_MAX_ROWS; i++) {
        if (i >= G.m) break;
        const float *x = (const float *)(G.a + i * A.nb[1]) + c;
        float s = 0.0f;
        for (int r = 0; r < 4; r++) {
            float2 v = *(const float2 *)(x + 32 * r);
            if (PRE) {
                v.x = pro_at<PRE>(P, rstd, i, c + 32 * r, v.x);
                v.y = pro_at<PRE>(P, rstd, i, c + 32 * r + 1, v.y);
            }
            s += ds[r] * (w[r][0] * v.x + w[r][1] * v.y);
            if (MIN) s -= dm[r] * (v.x + v.y);
        }
        acc[i] += s;
    }
}

/* The same for Q6_K weights (super-blocks of 256: 128 bytes of low
 * nibbles ql, 64 of high bit pairs qh, 16 int8 scales, f16 d; two halves
 * of 128 elements): a warp per super-block a step, half-warp h on half h.
 * Lane l of it takes elements 2l and 2l + 1 of each of the half's four
 * 32-element quarters: two bytes each of ql (low and high 32) and qh, a
 * 2-byte load apiece (a super-block is 210 bytes, so only 2-byte aligned). */
template <int PRE> __global__ void k_qgemv_q6k(gemv_set S, CT A, gemv_pro P, bool accum) {
    __shared__ float rstd[GEMV_STATS];
    const gemv_at<PRE> G(S, A, P, rstd);
    if (G.j >= G.n) return;
    const int64_t nblk = G.k / 256;
    const int h = G.lane / 16, l = 2 * (G.lane % 16);
    float acc[GEMV_MAX_ROWS];
    for (int i = 0; i < GEMV_MAX_ROWS; i++) acc[i] = 0.0f;
    for (int64_t blk = 0; blk < nblk; blk++) {
        const uint8_t *bp = (const uint8_t *)G.brow + blk * 210;
        const uint16_t la = *(const uint16_t *)(bp + 64 * h + l), lb = *(const uint16_t *)(bp + 64 * h + 32 + l),
                       hb = *(const uint16_t *)(bp + 128 + 32 * h + l);
        const int8_t *sc = (const int8_t *)(bp + 192) + 8 * h + l / 16;
        const float d = h2f_at(bp + 208);
        float w[4][2]; /* quarter, element: q */
        for (int t = 0; t < 2; t++) {
            int a = (la >> (8 * t)) & 0xFF, b = (lb >> (8 * t)) & 0xFF, hh = (hb >> (8 * t)) & 0xFF;
            w[0][t] = (float)(((a & 0xF) | ((hh & 3) << 4)) - 32);
            w[1][t] = (float)(((b & 0xF) | (((hh >> 2) & 3) << 4)) - 32);
            w[2][t] = (float)(((a >> 4) | (((hh >> 4) & 3) << 4)) - 32);
            w[3][t] = (float)(((b >> 4) | (((hh >> 6) & 3) << 4)) - 32);
        }
        float ds[4];
        for (int r = 0; r < 4; r++) ds[r] = d * (float)sc[2 * r];
        quarters_dot<false, PRE>(G, A, P, rstd, blk * 256 + 128 * h + l, w, ds, NULL, acc);
    }
    G.store(acc, accum);
}

/* The same for Q2_K and Q3_K weights (super-blocks of 256 in two halves of
 * 128; 2-bit values, byte l of a half's 32 holding element l of each of its
 * four 32-element quarters at bits 2r; a scale per 16 elements), lanes as
 * k_qgemv_q6k's: half-warp h on half h, lane l on elements l and l + 1 of
 * each quarter (a 2-byte load of the values, and for Q3_K of the third
 * bits). Q2_K (84 bytes: scale | min << 4 bytes, values, f16 d and dmin)
 * adds d sc sum(q x) - dmin m sum(x) per 16; Q3_K (110 bytes: third bits,
 * values, 12 bytes of 6-bit scales, f16 d) d (sc - 32) sum(q x), q - 4
 * where the third bit is clear. Needs 2-byte aligned super-blocks and A's
 * rows 16-byte aligned. */
template <int T, int PRE> __global__ void k_qgemv_q23k(gemv_set S, CT A, gemv_pro P, bool accum) {
    __shared__ float rstd[GEMV_STATS];
    const gemv_at<PRE> G(S, A, P, rstd);
    if (G.j >= G.n) return;
    const int64_t nblk = G.k / 256;
    const int h = G.lane / 16, l = 2 * (G.lane % 16);
    const int64_t bsz = T == TOY_Q2_K ? 84 : 110;
    float acc[GEMV_MAX_ROWS];
    for (int i = 0; i < GEMV_MAX_ROWS; i++) acc[i] = 0.0f;
    for (int64_t blk = 0; blk < nblk; blk++) {
        const uint8_t *bp = (const uint8_t *)G.brow + blk * bsz;
        const uint32_t qv = *(const uint16_t *)(bp + (T == TOY_Q2_K ? 16 : 32) + 32 * h + l);
        float w[4][2], ds[4], dm[4];
        if (T == TOY_Q2_K) {
            const float d = h2f_at(bp + 80), dmin = h2f_at(bp + 82);
            for (int r = 0; r < 4; r++) {
                const int sm = bp[8 * h + 2 * r + (l >= 16)];
                ds[r] = d * (float)(sm & 0xF), dm[r] = dmin * (float)(sm >> 4);
                for (int t = 0; t < 2; t++) w[r][t] = (float)((qv >> (8 * t + 2 * r)) & 3);
            }
        } else {
            const float d = h2f_at(bp + 108);
            const uint32_t hm = *(const uint16_t *)(bp + l) >> (4 * h); /* bit 8t + r: element t of quarter r */
            for (int r = 0; r < 4; r++) {
                ds[r] = d * (float)q3k_scale(bp + 96, 8 * h + 2 * r + (l >= 16)), dm[r] = 0.0f;
                for (int t = 0; t < 2; t++)
                    w[r][t] = (float)((int)((qv >> (8 * t + 2 * r)) & 3) - ((hm >> (8 * t + r)) & 1 ? 0 : 4));
            }
        }
        quarters_dot<T == TOY_Q2_K, PRE>(G, A, P, rstd, blk * 256 + 128 * h + l, w, ds, dm, acc);
    }
    G.store(acc, accum);
}

/* The same for IQ4_XS weights (super-blocks of 256: f16 d, 2 + 4 bytes of
 * 6-bit sub-block scales, 128 bytes of codebook indices, 16 a 32-element
 * sub-block): a warp per super-block a step. Lane l takes the four bytes
 * 4(l % 4) of sub-block l / 4: their low nibbles are four elements of it,
 * the high ones the four 16 further on, all under one scale. The warp reads
 * the indices in one 128-byte run, a 4-byte load a lane (super-blocks are
 * 136 bytes, 8-byte aligned in 8-byte aligned rows), and A's rows in
 * 16-byte runs (rows_aligned16). */
template <int PRE> __global__ void k_qgemv_iq4xs(gemv_set S, CT A, gemv_pro P, bool accum) {
    __shared__ float rstd[GEMV_STATS];
    const gemv_at<PRE> G(S, A, P, rstd);
    if (G.j >= G.n) return;
    const int64_t m = G.m, nblk = G.k / 256;
    const int ib = G.lane / 4, p = G.lane % 4;
    float acc[GEMV_MAX_ROWS];
    for (int i = 0; i < GEMV_MAX_ROWS; i++) acc[i] = 0.0f;
    for (int64_t blk = 0; blk < nblk; blk++) {
        const uint8_t *bp = (const uint8_t *)G.brow + blk * 136;
        const int ls = ((bp[4 + ib / 2] >> (4 * (ib % 2))) & 0xF) | ((((int)bp[2] | (int)bp[3] << 8) >> (2 * ib)) & 3) << 4;
        const float dl = h2f_at(bp) * (float)(ls - 32);
        const uint32_t q = *(const uint32_t *)(bp + 8 + 16 * ib + 4 * p);
        const float v0 = (float)iq4_val(q & 0xF), v1 = (float)iq4_val((q >> 8) & 0xF),
                    v2 = (float)iq4_val((q >> 16) & 0xF), v3 = (float)iq4_val((q >> 24) & 0xF),
                    w0 = (float)iq4_val((q >> 4) & 0xF), w1 = (float)iq4_val((q >> 12) & 0xF),
                    w2 = (float)iq4_val((q >> 20) & 0xF), w3 = (float)iq4_val(q >> 28);
        const int64_t c = blk * 256 + 32 * ib + 4 * p; /* the low nibbles' first element; the high ones' is c + 16 */
        for (int i = 0; i < GEMV_MAX_ROWS; i++) {
            if (i >= m) break;
            const float *x = (const float *)(G.a + i * A.nb[1]) + c;
            float4 lo = *(const float4 *)x, hi = *(const float4 *)(x + 16);
            pro_run4<PRE>(P, rstd, i, c, lo);
            pro_run4<PRE>(P, rstd, i, c + 16, hi);
            acc[i] += dl * (v0 * lo.x + v1 * lo.y + v2 * lo.z + v3 * lo.w + w0 * hi.x + w1 * hi.y + w2 * hi.z + w3 * hi.w);
        }
    }
    G.store(acc, accum);
}

/* The same for F16 / BF16 weights: a warp per j, each lane eight weights
 * (one 16-byte load) and eight of A's elements (two) a step. A's elements
 * are rounded to the weight's type first, as the GEMM path converts A, so
 * both paths multiply the same numbers. Needs 16-byte aligned rows
 * (half_gemv_ok). */
__device__ __forceinline__ float2 pair_f(__half2 h) { return __half22float2(h); }
__device__ __forceinline__ float2 pair_f(__nv_bfloat162 h) { return __bfloat1622float2(h); }
__device__ __forceinline__ float round_to(float v, const __half *) { return __half2float(__float2half_rn(v)); }
__device__ __forceinline__ float round_to(float v, const __nv_bfloat16 *) {
    return __bfloat162float(__float2bfloat16_rn(v));
}

template <typename T2, int PRE> __global__ void k_hgemv(gemv_set S, CT A, gemv_pro P, bool accum) {
    __shared__ float rstd[GEMV_STATS];
    const gemv_at<PRE> G(S, A, P, rstd);
    if (G.j >= G.n) return;
    const int64_t m = G.m, k = G.k;
    const int lane = G.lane;
    const char *a = G.a, *brow = G.brow;
    typedef typename std::conditional<std::is_same<T2, __half2>::value, __half, __nv_bfloat16>::type T;
    const T *tag = NULL;
    float acc[GEMV_MAX_ROWS];
    for (int i = 0; i < GEMV_MAX_ROWS; i++) acc[i] = 0.0f;
    for (int64_t c = 8 * lane; c < k; c += 256) {
        uint4 raw = *(const uint4 *)(brow + 2 * c);
        const T2 *h = (const T2 *)&raw;
        float2 w0 = pair_f(h[0]), w1 = pair_f(h[1]), w2 = pair_f(h[2]), w3 = pair_f(h[3]);
        for (int i = 0; i < GEMV_MAX_ROWS; i++) {
            if (i >= m) break;
            const float4 *x = (const float4 *)(a + i * A.nb[1] + 4 * c);
            float4 x0 = x[0], x1 = x[1];
            pro_run4<PRE>(P, rstd, i, c, x0);
            pro_run4<PRE>(P, rstd, i, c + 4, x1);
            acc[i] += w0.x * round_to(x0.x, tag) + w0.y * round_to(x0.y, tag) + w1.x * round_to(x0.z, tag) +
                      w1.y * round_to(x0.w, tag) + w2.x * round_to(x1.x, tag) + w2.y * round_to(x1.y, tag) +
                      w3.x * round_to(x1.z, tag) + w3.y * round_to(x1.w, tag);
        }
    }
    G.store(acc, accum);
}

/* A prologue for the products no GEMV kernel takes (F32 weights, odd
 * rows): A's m rows (m <= GEMV_MAX_ROWS) computed once into out, m x k
 * contiguous; one block */
__global__ void k_mm_prologue(float *out, CT A, gemv_pro P) {
    __shared__ float rstd[GEMV_STATS];
    int64_t m = A.ne[1], k = A.ne[0];
    if (pro_norm(P.mode)) pro_begin(P, A.data, A.nb[1], m, k, rstd);
    for (int64_t e = threadIdx.x; e < m * k; e += blockDim.x) {
        int64_t i = e / k, c = e % k;
        float x = *(const float *)(A.data + i * A.nb[1] + c * 4);
        switch (P.mode) {
        case TOY_MM_PRE_RMS: out[e] = pro_at<TOY_MM_PRE_RMS>(P, rstd, (int)i, c, x); break;
        case TOY_MM_PRE_SWIGLU: out[e] = pro_at<TOY_MM_PRE_SWIGLU>(P, rstd, (int)i, c, x); break;
        case TOY_MM_PRE_LAYER: out[e] = pro_at<TOY_MM_PRE_LAYER>(P, rstd, (int)i, c, x); break;
        default: out[e] = pro_at<TOY_MM_PRE_GELU>(P, rstd, (int)i, c, x); break;
        }
    }
}

struct mm {
    bool ta, tb, accum;
    int64_t m, n, k, nbatch;
};

static mm mm_shape(const struct toy_cu_node *nd) {
    mm s;
    s.ta = nd->op_params[P_MM_TRANS_A];
    s.tb = nd->op_params[P_MM_TRANS_B];
    s.accum = nd->op_params[P_MM_ACCUM];
    s.n = nd->dst.ne[0];
    s.m = nd->dst.ne[1];
    s.k = s.ta ? nd->src[0].ne[1] : nd->src[0].ne[0];
    s.nbatch = nd->dst.ne[2] * nd->dst.ne[3];
    return s;
}

/* every row of t starts 16-byte aligned */
static bool rows_aligned16(const CT &t) {
    uintptr_t al = (uintptr_t)t.data;
    for (int d = 1; d < 4; d++) al |= (uintptr_t)t.nb[d];
    return al % 16 == 0;
}

/* F16/BF16 weights, up to GEMV_MAX_ROWS rows (decode): k_hgemv, where every
 * row of A and B starts 16-byte aligned */
static bool half_gemv_ok(const CT &A, const CT &B, const mm &s) {
    if (!(B.type == TOY_F16 || B.type == TOY_BF16) || B.nb[0] != 2 || !s.tb || s.ta || s.m > GEMV_MAX_ROWS || s.k % 8)
        return false;
    return rows_aligned16(A) && rows_aligned16(B);
}

/* the GEMV kernel that computes A times weights B, if one does: quantized
 * weights (k_qgemv_blocks for the 32-element block types, a warp per
 * super-block for the k-quants and IQ4_XS, else k_qgemv element by
 * element) and F16/BF16 ones (k_hgemv), up to GEMV_MAX_ROWS rows */
enum gemv_kind { GV_NONE, GV_Q, GV_QBLOCKS, GV_Q4K, GV_Q5K, GV_Q6K, GV_Q2K, GV_Q3K, GV_IQ4XS, GV_F16, GV_BF16 };
static gemv_kind gemv_of(const CT &A, const CT &B, const mm &s) {
    if (is_quant(B.type)) {
        if (!s.tb || s.ta || s.m > GEMV_MAX_ROWS) return GV_NONE;
        /* the super-block kernels: A's float4 and float2 loads need its rows
         * 16-byte aligned, the weights' 4- or 2-byte loads rows of so
         * aligned super-blocks (Q4_K's and Q6_K's always are on the device) */
        uintptr_t bal = (uintptr_t)B.data | (uintptr_t)B.nb[1];
        if (s.k % 256 == 0 && rows_aligned16(A)) switch (B.type) {
            case TOY_Q4_K: return GV_Q4K;
            case TOY_Q6_K: return GV_Q6K;
            case TOY_Q5_K: if (bal % 4 == 0) return GV_Q5K; break;
            case TOY_Q2_K: if (bal % 2 == 0) return GV_Q2K; break;
            case TOY_Q3_K: if (bal % 2 == 0) return GV_Q3K; break;
            case TOY_IQ4_XS: if (bal % 8 == 0) return GV_IQ4XS; break;
            default: break;
            }
        return q_block_bytes(B.type) && s.k % 32 == 0 ? GV_QBLOCKS : GV_Q;
    }
    if (half_gemv_ok(A, B, s)) return B.type == TOY_F16 ? GV_F16 : GV_BF16;
    return GV_NONE;
}

/* product p of a node (0: its own; then its siblings) as a node of its own */
static toy_cu_node product_of(const struct toy_cu_node *nd, int p) {
    toy_cu_node one = *nd;
    one.n_sib = 0;
    if (p) {
        one.dst = nd->sib_dst[p - 1];
        one.src[1] = nd->sib_b[p - 1];
        one.src[4] = nd->sib_bias[p - 1];
        one.has_src[4] = nd->sib_bias[p - 1].data != NULL;
    }
    return one;
}

/* the bytes of a prologue's A computed ahead (k_mm_prologue), 256-byte multiples */
static size_t prologue_bytes(const struct toy_cu_node *nd) {
    return ((size_t)ct_nel(nd->src[0]) * 4 + 255) / 256 * 256;
}

/* the node with A = its prologue's result at `at` (m x k, contiguous), the
 * prologue gone, and the work after it */
static toy_cu_node with_prologue_done(const struct toy_cu_node *nd, char *at) {
    toy_cu_node one = *nd;
    CT &A = one.src[0];
    A.data = at;
    A.nb[0] = 4;
    A.nb[1] = 4 * A.ne[0];
    A.nb[2] = A.nb[1] * A.ne[1];
    A.nb[3] = A.nb[2] * A.ne[2];
    one.op_params[P_MM_PRE] = TOY_MM_PRE_NONE;
    one.has_src[2] = one.has_src[3] = false;
    size_t pb = prologue_bytes(nd);
    one.work = nd->work ? nd->work + pb : NULL;
    one.work_size = nd->work_size > pb ? nd->work_size - pb : 0;
    return one;
}

/* rows of B dequantized at a time: QCHUNK_BYTES of f32, at least 64;
 * TOY_CUDA_QCHUNK_KB sets the bytes (tests use it to cut small weights
 * into several chunks) */
static int64_t qchunk_rows(int64_t k) {
    static size_t bytes;
    if (!bytes) {
        const char *e = getenv("TOY_CUDA_QCHUNK_KB");
        long kb = e ? atol(e) : 0;
        bytes = kb > 0 ? (size_t)kb << 10 : QCHUNK_BYTES;
    }
    int64_t r = (int64_t)(bytes / ((size_t)k * 4));
    return r < 64 ? 64 : r;
}

/* scratch for nr dequantized rows of B: f32, or bf16 under BF16 math;
 * 256-byte multiples, so what follows stays aligned */
static size_t qchunk_bytes(const struct toy_cu_node *nd, int64_t nr) {
    size_t es = nd->math == TOY_CU_MATH_BF16 ? 2 : 4;
    return ((size_t)nr * (size_t)nd->src[1].ne[0] * es + 255) / 256 * 256;
}

/* C's rows are n floats apart. When n * 4 is not a multiple of 16 (GPT-2's
 * 50257-wide output layer) cuBLAS leaves its fast kernels, so a large
 * product (one matrix, A not transposed) runs in chunks of rows into
 * scratch whose rows are padded to 8 floats, and each chunk is copied (or,
 * accumulating, added) into C. TOY_CUDA_PAD_C=0 turns it off; =N sets the
 * scratch to N KiB (tests use it to cut small products into chunks). */
#define PADC_BYTES ((size_t)256 << 20)
static size_t pad_c_setting(void) {
    static size_t bytes = 1; /* 1: not read yet */
    if (bytes == 1) {
        const char *e = getenv("TOY_CUDA_PAD_C");
        long kb = e && *e ? atol(e) : -1;
        bytes = kb == 0 ? 0 : kb > 0 ? (size_t)kb << 10 : PADC_BYTES;
    }
    return bytes;
}
static bool pad_c(const mm &s) {
    return pad_c_setting() && s.n % 4 && !s.ta && s.nbatch == 1 && (double)s.m * (double)s.n >= (double)(1 << 22);
}
static int64_t pad_c_rows(const mm &s) {
    int64_t r = (int64_t)(pad_c_setting() / ((size_t)pitch_of(s.n) * 4)) / 8 * 8;
    if (r < 8) r = 8;
    return r < s.m ? r : s.m;
}
static size_t pad_c_bytes(const mm &s) { return pad_c(s) ? (size_t)pad_c_rows(s) * pitch_of(s.n) * 4 + 256 : 0; }

/* the bytes of an operand converted to 16-bit elements (convert()),
 * 256-byte multiples, so what follows in the work stays aligned */
static size_t half_bytes(const CT &x) { return (converted_elems(x) * 2 + 255) / 256 * 256; }

/* where a GEMM path's padded C scratch starts in the node's work: after
 * the converted operands (F32 B under BF16 math: A, then B; F16/BF16 B: A) */
static size_t pad_c_at(const struct toy_cu_node *nd) {
    const CT &A = nd->src[0], &B = nd->src[1];
    if (B.type == TOY_F32 && nd->math == TOY_CU_MATH_BF16) return half_bytes(A) + half_bytes(B);
    if (B.type == TOY_F16 || B.type == TOY_BF16) return half_bytes(A);
    return 0;
}

/* rows [0, rows) of the padded chunk into C (n floats a row), or added to it */
__global__ void k_store_rows(float *c, const float *chunk, int64_t rows, int64_t n, int64_t pitch, bool add) {
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < rows * n; e += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = e / n, j = e - r * n;
        float v = chunk[r * pitch + j];
        c[e] = add ? c[e] + v : v;
    }
}

extern "C" size_t toy_cu_matmul_work(const struct toy_cu_node *nd) {
    mm s = mm_shape(nd);
    const CT &A = nd->src[0], &B = nd->src[1];
    if (nd->n_sib) { /* the products one at a time, when they cannot run as one */
        size_t w = 0;
        for (int p = 0; p <= nd->n_sib; p++) {
            toy_cu_node one = product_of(nd, p);
            size_t wp = toy_cu_matmul_work(&one);
            if (wp > w) w = wp;
        }
        return w;
    }
    if (nd->op_params[P_MM_PRE] && gemv_of(A, B, s) == GV_NONE) {
        /* A computed ahead; sized with A's own strides, which can only ask for more */
        toy_cu_node one = *nd;
        one.op_params[P_MM_PRE] = TOY_MM_PRE_NONE;
        return prologue_bytes(nd) + toy_cu_matmul_work(&one);
    }
    size_t w = 0;
    if (B.type == TOY_F32) w = pad_c_at(nd) + pad_c_bytes(s) + (nd->math == TOY_CU_MATH_BF16 ? 512 : 0);
    else if ((B.type == TOY_F16 || B.type == TOY_BF16) && !half_gemv_ok(A, B, s)) w = pad_c_at(nd) + pad_c_bytes(s) + 512;
    else if (is_quant(B.type) && gemv_of(A, B, s) == GV_NONE) {
        int64_t rows = s.tb ? B.ne[1] : s.k; /* rows of one B slice */
        int64_t cr = qchunk_rows(B.ne[0]);
        w = qchunk_bytes(nd, rows < cr ? rows : cr) + 512;
        if (nd->math == TOY_CU_MATH_BF16) w += converted_elems(A) * 2; /* A in bf16 */
    }
    return w;
}

template <int PRE>
static void launch_gemv(gemv_kind kind, dim3 grid, cudaStream_t st, const gemv_set &S, const CT &A, const gemv_pro &P,
                        bool accum) {
    switch (kind) {
    case GV_QBLOCKS: k_qgemv_blocks<PRE><<<grid, 256, 0, st>>>(S, A, P, accum); break;
    case GV_Q4K: k_qgemv_q45k<TOY_Q4_K, PRE><<<grid, 256, 0, st>>>(S, A, P, accum); break;
    case GV_Q5K: k_qgemv_q45k<TOY_Q5_K, PRE><<<grid, 256, 0, st>>>(S, A, P, accum); break;
    case GV_Q6K: k_qgemv_q6k<PRE><<<grid, 256, 0, st>>>(S, A, P, accum); break;
    case GV_Q2K: k_qgemv_q23k<TOY_Q2_K, PRE><<<grid, 256, 0, st>>>(S, A, P, accum); break;
    case GV_Q3K: k_qgemv_q23k<TOY_Q3_K, PRE><<<grid, 256, 0, st>>>(S, A, P, accum); break;
    case GV_IQ4XS: k_qgemv_iq4xs<PRE><<<grid, 256, 0, st>>>(S, A, P, accum); break;
    case GV_Q: k_qgemv<PRE><<<grid, 256, 0, st>>>(S, A, P, accum); break;
    case GV_F16: k_hgemv<__half2, PRE><<<grid, 256, 0, st>>>(S, A, P, accum); break;
    default: k_hgemv<__nv_bfloat162, PRE><<<grid, 256, 0, st>>>(S, A, P, accum); break;
    }
}

/* One GEMV launch over the node's product and its first n_sib siblings */
static int run_gemv(const struct toy_cu_node *nd, const mm &s, gemv_kind kind, int n_sib, char *msg, size_t msg_size) {
    gemv_set S;
    memset(&S, 0, sizeof S);
    unsigned x = 0;
    for (int p = 0; p <= n_sib; p++) {
        const CT &dst = p ? nd->sib_dst[p - 1] : nd->dst;
        const CT *bias = p ? (nd->sib_bias[p - 1].data ? &nd->sib_bias[p - 1] : NULL) : nd->has_src[4] ? &nd->src[4] : NULL;
        S.p[p] = gemv_out_of(dst, p ? nd->sib_b[p - 1] : nd->src[1], bias);
        S.first[p] = x;
        x += (unsigned)cdiv(dst.ne[0], 8);
    }
    S.n = n_sib + 1;
    S.m = nd->dst.ne[1];
    S.ne2 = nd->dst.ne[2];
    S.ne3 = nd->dst.ne[3];
    dim3 grid(x, (unsigned)s.nbatch);
    gemv_pro P = pro_of(nd);
    cudaStream_t st = CU_STREAM(nd);
    switch (P.mode) {
    case TOY_MM_PRE_RMS: launch_gemv<TOY_MM_PRE_RMS>(kind, grid, st, S, nd->src[0], P, s.accum); break;
    case TOY_MM_PRE_SWIGLU: launch_gemv<TOY_MM_PRE_SWIGLU>(kind, grid, st, S, nd->src[0], P, s.accum); break;
    case TOY_MM_PRE_LAYER: launch_gemv<TOY_MM_PRE_LAYER>(kind, grid, st, S, nd->src[0], P, s.accum); break;
    case TOY_MM_PRE_GELU: launch_gemv<TOY_MM_PRE_GELU>(kind, grid, st, S, nd->src[0], P, s.accum); break;
    default: launch_gemv<TOY_MM_PRE_NONE>(kind, grid, st, S, nd->src[0], P, s.accum); break;
    }
    return launch_status(kind == GV_F16 || kind == GV_BF16 ? "hgemv" : "qgemv", msg, msg_size);
}

static int cublas_status(cublasStatus_t st, const char *what, char *msg, size_t msg_size) {
    if (st == CUBLAS_STATUS_SUCCESS) return 0;
    snprintf(msg, msg_size, "%s: %s", what, cublasGetStatusString(st));
    return st == CUBLAS_STATUS_ALLOC_FAILED ? TOY_ERR_NOMEM : TOY_ERR_BACKEND;
}

/* one (strided-)batched cuBLAS product over the batch dims, B and A given as
 * (pointer, type, row stride in elements, batch strides in elements) */
struct operand {
    const char *p;
    cudaDataType_t type;
    int64_t es;              /* element bytes */
    int64_t ld;              /* row stride, elements */
    int64_t s2, s3;          /* batch strides, elements */
    int64_t ne2, ne3;        /* batch sizes */
};

/* One strided-batched GEMM in cuBLAS's column-major terms:
 * C[b] (n x m) = op(B[b]) op(A[b]) for b < batch, with A[b] = A + b sA
 * (elements) and so on. Built on the host (gemm_plan) and run by
 * gemm_batches; tools/cuda-host-check.cu runs the same plans with a host
 * GEMM to check the row-major -> column-major mapping without a GPU. */
struct gemm_call {
    cublasOperation_t opB, opA;
    int n, m, k;
    const char *B, *A;
    char *C;
    int ldb, lda, ldc;
    int64_t sB, sA, sC; /* batch strides, elements */
    int batch;
    float beta;
};

static bool gemm_regular(const struct toy_cu_node *nd, const operand &A, const operand &B) {
    int64_t ne2 = nd->dst.ne[2];
    return (A.ne2 == ne2 || A.ne2 == 1) && (B.ne2 == ne2 || B.ne2 == 1);
}

/* the number of calls of one product: one per dim-3 index when the dim-2
 * batches are regular (equal or broadcast), else one per (i2, i3) (GQA ratio) */
static int64_t gemm_count(const struct toy_cu_node *nd, const operand &A, const operand &B) {
    return nd->dst.ne[3] * (gemm_regular(nd, A, B) ? 1 : nd->dst.ne[2]);
}

static gemm_call gemm_at(const struct toy_cu_node *nd, const mm &s, const operand &A, const operand &B, int64_t c) {
    const CT &C = nd->dst;
    int64_t ne2 = C.ne[2], ne3 = C.ne[3];
    bool regular = gemm_regular(nd, A, B);
    int64_t i3 = regular ? c : c / ne2, i2 = regular ? 0 : c % ne2;
    const char *a3 = A.p + bratio(i3, ne3, A.ne3) * A.s3 * A.es;
    const char *b3 = B.p + bratio(i3, ne3, B.ne3) * B.s3 * B.es;
    char *c3 = C.data + i3 * C.nb[3];
    gemm_call g;
    g.opB = s.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    g.opA = s.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    g.n = (int)s.n;
    g.m = (int)s.m;
    g.k = (int)s.k;
    g.B = regular ? b3 : b3 + bratio(i2, ne2, B.ne2) * B.s2 * B.es;
    g.A = regular ? a3 : a3 + bratio(i2, ne2, A.ne2) * A.s2 * A.es;
    g.C = regular ? c3 : c3 + i2 * C.nb[2];
    g.ldb = (int)B.ld;
    g.lda = (int)A.ld;
    g.ldc = (int)s.n;
    g.sB = regular && B.ne2 != 1 ? B.s2 : 0;
    g.sA = regular && A.ne2 != 1 ? A.s2 : 0;
    g.sC = C.nb[2] / 4;
    g.batch = regular ? (int)ne2 : 1;
    g.beta = s.accum ? 1.0f : 0.0f;
    return g;
}

static int gemm_batches(const struct toy_cu_node *nd, const mm &s, const operand &A, const operand &B,
                        cublasComputeType_t ct, char *msg, size_t msg_size) {
    cublasHandle_t h = (cublasHandle_t)nd->cublas;
    float alpha = 1.0f, zero = 0.0f;
    if (pad_c(s) && gemm_count(nd, A, B) == 1) { /* rows of C in chunks through padded scratch */
        gemm_call g = gemm_at(nd, s, A, B, 0);
        float *cs = (float *)(nd->work + pad_c_at(nd));
        int64_t pitch = pitch_of(s.n), rows = pad_c_rows(s);
        for (int64_t r0 = 0; r0 < s.m; r0 += rows) {
            int64_t mr = s.m - r0 < rows ? s.m - r0 : rows;
            const char *a = g.A + r0 * g.lda * A.es; /* A not transposed: its rows are C's */
            cublasStatus_t st = cublasGemmStridedBatchedEx(h, g.opB, g.opA, g.n, (int)mr, g.k, &alpha, g.B, B.type,
                                                           g.ldb, 0, a, A.type, g.lda, 0, &zero, cs, CUDA_R_32F,
                                                           (int)pitch, 0, 1, ct, CUBLAS_GEMM_DEFAULT);
            int rc = cublas_status(st, "cublasGemmStridedBatchedEx", msg, msg_size);
            if (rc) return rc;
            k_store_rows<<<grid_for(mr * s.n, 256), 256, 0, CU_STREAM(nd)>>>((float *)g.C + r0 * s.n, cs, mr, s.n, pitch,
                                                                            s.accum);
            if ((rc = launch_status("padded rows", msg, msg_size))) return rc;
        }
        return 0;
    }
    for (int64_t c = 0, n = gemm_count(nd, A, B); c < n; c++) {
        gemm_call g = gemm_at(nd, s, A, B, c);
        cublasStatus_t st = cublasGemmStridedBatchedEx(h, g.opB, g.opA, g.n, g.m, g.k, &alpha, g.B, B.type, g.ldb, g.sB,
                                                       g.A, A.type, g.lda, g.sA, &g.beta, g.C, CUDA_R_32F, g.ldc, g.sC,
                                                       g.batch, ct, CUBLAS_GEMM_DEFAULT);
        int rc = cublas_status(st, "cublasGemmStridedBatchedEx", msg, msg_size);
        if (rc) return rc;
    }
    return 0;
}

static operand as_is(const CT &t, cudaDataType_t type, int64_t es) {
    operand o = {t.data, type, es, t.nb[1] / es, t.nb[2] / es, t.nb[3] / es, t.ne[2], t.ne[3]};
    return o;
}

/* as convert() wrote it: rows pitch_of(ne0) apart */
static operand packed(const char *p, const CT &t, cudaDataType_t type, int64_t es) {
    int64_t ld = pitch_of(t.ne[0]);
    operand o = {p, type, es, ld, ld * t.ne[1], ld * t.ne[1] * t.ne[2], t.ne[2], t.ne[3]};
    return o;
}

extern "C" int toy_cu_matmul(const struct toy_cu_node *nd, char *msg, size_t msg_size) {
    cudaStream_t st = CU_STREAM(nd);
    mm s = mm_shape(nd);
    const CT &A = nd->src[0], &B = nd->src[1];
    if (A.type != TOY_F32 || A.nb[0] != 4) {
        snprintf(msg, msg_size, "A must be f32 with contiguous rows");
        return TOY_ERR_UNSUPPORTED;
    }
    if (nd->n_sib) { /* with its siblings: one launch when one GEMV kernel takes them all */
        gemv_kind kind = s.nbatch == 1 ? gemv_of(A, B, s) : GV_NONE;
        for (int p = 0; p < nd->n_sib && kind != GV_NONE; p++)
            if (gemv_of(A, nd->sib_b[p], s) != kind || nd->sib_dst[p].ne[1] != s.m) kind = GV_NONE;
        if (kind != GV_NONE && !s.accum && s.k) return run_gemv(nd, s, kind, nd->n_sib, msg, msg_size);
        for (int p = 0; p <= nd->n_sib; p++) {
            toy_cu_node one = product_of(nd, p);
            int rc = toy_cu_matmul(&one, msg, msg_size);
            if (rc) return rc;
        }
        return 0;
    }
    if (s.m == 0 || s.n == 0) return 0;
    if (nd->op_params[P_MM_PRE] && s.k && gemv_of(A, B, s) == GV_NONE) { /* the prologue ahead, then the product */
        if (s.m > GEMV_MAX_ROWS || s.nbatch != 1 || !nd->work || nd->work_size < prologue_bytes(nd)) {
            snprintf(msg, msg_size, "a fused prologue needs at most %d rows and its scratch", GEMV_MAX_ROWS);
            return TOY_ERR_UNSUPPORTED;
        }
        k_mm_prologue<<<1, 256, 0, st>>>((float *)nd->work, A, pro_of(nd));
        int rc = launch_status("prologue", msg, msg_size);
        if (rc) return rc;
        toy_cu_node one = with_prologue_done(nd, nd->work);
        return toy_cu_matmul(&one, msg, msg_size);
    }
    if (nd->has_src[4] && (!s.k || gemv_of(A, B, s) == GV_NONE)) { /* graph-fuse.c asks the GEMV kernels only */
        snprintf(msg, msg_size, "a fused bias needs weights a GEMV kernel streams, and a sum");
        return TOY_ERR_UNSUPPORTED;
    }
    if (s.k == 0) { /* an empty sum */
        if (!s.accum) cudaMemsetAsync(nd->dst.data, 0, (size_t)ct_nel(nd->dst) * 4, st);
        return launch_status("memset", msg, msg_size);
    }
    gemv_kind kind = gemv_of(A, B, s); /* up to 8 rows over streamed weights */
    if (kind != GV_NONE) return run_gemv(nd, s, kind, 0, msg, msg_size);
    if (B.type == TOY_F32) {
        if (B.nb[0] != 4) {
            snprintf(msg, msg_size, "B must have contiguous rows");
            return TOY_ERR_UNSUPPORTED;
        }
        if (nd->math == TOY_CU_MATH_BF16) {
            __nv_bfloat16 *a16 = (__nv_bfloat16 *)nd->work, *b16 = (__nv_bfloat16 *)(nd->work + half_bytes(A));
            convert(a16, A, st);
            convert(b16, B, st);
            int rc = launch_status("convert", msg, msg_size);
            if (rc) return rc;
            return gemm_batches(nd, s, packed((const char *)a16, A, CUDA_R_16BF, 2),
                                packed((const char *)b16, B, CUDA_R_16BF, 2), CUBLAS_COMPUTE_32F, msg, msg_size);
        }
        cublasComputeType_t ct = nd->math == TOY_CU_MATH_TF32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
        return gemm_batches(nd, s, as_is(A, CUDA_R_32F, 4), as_is(B, CUDA_R_32F, 4), ct, msg, msg_size);
    }
    if (B.type == TOY_F16 || B.type == TOY_BF16) {
        if (B.nb[0] != 2) {
            snprintf(msg, msg_size, "B must have contiguous rows");
            return TOY_ERR_UNSUPPORTED;
        }
        cudaDataType_t t = B.type == TOY_F16 ? CUDA_R_16F : CUDA_R_16BF;
        if (B.type == TOY_F16) convert((__half *)nd->work, A, st);
        else convert((__nv_bfloat16 *)nd->work, A, st);
        int rc = launch_status("convert", msg, msg_size);
        if (rc) return rc;
        return gemm_batches(nd, s, packed(nd->work, A, t, 2), as_is(B, t, 2), CUBLAS_COMPUTE_32F, msg, msg_size);
    }
    if (!is_quant(B.type)) {
        snprintf(msg, msg_size, "B of dtype %d is not supported by the CUDA matmul", (int)B.type);
        return TOY_ERR_UNSUPPORTED;
    }
    /* quantized B, many rows: chunks of B's rows dequantized (to f32, or to
     * bf16 with A converted once under BF16 math), a GEMM per chunk in the
     * device's math */
    bool bf = nd->math == TOY_CU_MATH_BF16;
    int64_t kb = B.ne[0], cr = qchunk_rows(kb), rows = s.tb ? B.ne[1] : s.k; /* rows of one B slice */
    char *scratch = nd->work; /* as toy_cu_matmul_work sized it: a chunk, then A in bf16 */
    __nv_bfloat16 *a16 = bf ? (__nv_bfloat16 *)(nd->work + qchunk_bytes(nd, rows < cr ? rows : cr)) : NULL;
    if (bf) convert(a16, A, st);
    cudaDataType_t et = bf ? CUDA_R_16BF : CUDA_R_32F;
    cublasComputeType_t ct = nd->math == TOY_CU_MATH_TF32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    int64_t es = bf ? 2 : 4, lda = bf ? pitch_of(A.ne[0]) : A.nb[1] / 4;
    cublasHandle_t h = (cublasHandle_t)nd->cublas;
    const CT &C = nd->dst;
    float alpha = 1.0f;
    for (int64_t bi = 0; bi < s.nbatch; bi++) {
        int64_t i2 = bi % C.ne[2], i3 = bi / C.ne[2], a2 = bratio(i2, C.ne[2], A.ne[2]), a3 = bratio(i3, C.ne[3], A.ne[3]);
        const char *a = bf ? (const char *)(a16 + (a3 * A.ne[2] + a2) * lda * A.ne[1])
                           : A.data + a2 * A.nb[2] + a3 * A.nb[3];
        const char *b = B.data + bratio(i2, C.ne[2], B.ne[2]) * B.nb[2] + bratio(i3, C.ne[3], B.ne[3]) * B.nb[3];
        float *c = (float *)(C.data + i2 * C.nb[2] + i3 * C.nb[3]);
        for (int64_t r0 = 0; r0 < rows; r0 += cr) {
            int64_t nr = rows - r0 < cr ? rows - r0 : cr;
            if (bf)
                k_dequant_rows<<<grid_for(nr * kb, 256), 256, 0, st>>>((__nv_bfloat16 *)scratch, b, B.type, B.nb[1], kb,
                                                                       r0, nr);
            else
                k_dequant_rows<<<grid_for(nr * kb, 256), 256, 0, st>>>((float *)scratch, b, B.type, B.nb[1], kb, r0, nr);
            int rc = launch_status("dequantize", msg, msg_size);
            if (rc) return rc;
            cublasStatus_t cs;
            if (s.tb) { /* scratch rows are C columns r0.. : C[:, r0:r0+nr] = op(A) scratch^T */
                float beta = s.accum ? 1.0f : 0.0f;
                cs = cublasGemmStridedBatchedEx(h, CUBLAS_OP_T, s.ta ? CUBLAS_OP_T : CUBLAS_OP_N, (int)nr, (int)s.m,
                                                (int)s.k, &alpha, scratch, et, (int)kb, 0, a, et, (int)lda, 0, &beta,
                                                c + r0, CUDA_R_32F, (int)s.n, 0, 1, ct, CUBLAS_GEMM_DEFAULT);
            } else { /* scratch rows are k indices r0.. : C += op(A)[:, r0:] scratch */
                float beta = (r0 == 0 && !s.accum) ? 0.0f : 1.0f;
                const char *as = a + (s.ta ? r0 * lda : r0) * es;
                cs = cublasGemmStridedBatchedEx(h, CUBLAS_OP_N, s.ta ? CUBLAS_OP_T : CUBLAS_OP_N, (int)s.n, (int)s.m,
                                                (int)nr, &alpha, scratch, et, (int)kb, 0, as, et, (int)lda, 0, &beta, c,
                                                CUDA_R_32F, (int)s.n, 0, 1, ct, CUBLAS_GEMM_DEFAULT);
            }
            rc = cublas_status(cs, "cublasGemmStridedBatchedEx", msg, msg_size);
            if (rc) return rc;
        }
    }
    return 0;
}
