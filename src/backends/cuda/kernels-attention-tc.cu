/* kernels-attention-tc.cu: attention forward and backward on tensor cores
 * (wmma, BF16 operands, F32 accumulation), used when the device's math is
 * BF16 (TOY_CUDA_MATH=bf16, the mixed-precision training of
 * bench/bench-cuda.sh) and the head dim is a multiple of 16 up to 128. The
 * semantics are those of the F32 kernels in kernels-attention.cu (causal,
 * window, softcap, GQA, packed segments, cached keys); only the rounding
 * differs: q, k, v, dO, P and dS are rounded to BF16 before each product.
 *
 * A block owns 64 rows (4 warps of 16): query rows for the forward and dQ,
 * key rows for dK/dV. Those rows' operands (Q, or Q and dO, or K and V) are
 * staged once through shared memory into each warp's wmma fragments; the
 * other side streams through shared memory in tiles of 32 rows, converted
 * to BF16 on the way in. Per tile a warp computes its 16 x 32 scores with
 * wmma, stores them to its own shared tile, and the lane pair (2r, 2r+1)
 * applies scale, softcap and masks to row r (16 columns each, interleaved:
 * tile_col); the probabilities (or dS) go back as a BF16 tile for the next
 * product. A tile that every row of the warp sees whole (most tiles below
 * the causal diagonal) skips the masks: the diagonal's and the edges'
 * tiles alone test each score against its row's range and segment.
 * Probabilities are exp2f of scores in log2 units.
 *
 * Forward, in one pass over the keys (flash-attention 2): per row a
 * running max m and sum l, O accumulated as sum_j exp(s_j - m) v_j and
 * divided by l at the end. m moves only when a tile's max passes it by
 * more than 8 (RESCALE_AT), and only then do the accumulators go through
 * shared memory to be rescaled (wmma does not say which lane holds which
 * element), so most tiles are two products and the softmax. The former
 * two-pass forward (each row's log-sum-exp first, then O = sum_j
 * exp(s_j - lse) v_j, computing every score twice) stays as
 * TOY_CUDA_ATTN=twopass.
 * Backward as the F32 kernels: dQ = scale dS K by query tiles, dK = scale
 * dS^T Q and dV = P^T dO by key tiles (over every query head of the
 * group); each output has one writer, no atomics. Di = rowsum(dO O) comes
 * from k_attn_di. The row staging, score tiles and BF16 tiles fit in 48
 * KiB for head dim 128, so no launch needs a shared-memory opt-in. */
#include <mma.h>

#include "backends/cuda/attention.cuh"

using namespace nvcuda;
typedef __nv_bfloat16 bf16;

#define TC_WARPS 4
#define TC_ROWS (16 * TC_WARPS) /* rows a block owns */
#define TC_COLS 32              /* rows of the other side per step */
#define S_LD (TC_COLS + 4)      /* a warp's f32 tile, 16 x TC_COLS */
#define P_LD (TC_COLS + 8)      /* a warp's bf16 tile */
#define S_BYTES (16 * S_LD * 4)
#define P_BYTES (16 * P_LD * 2)

typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> frag_a;
typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::col_major> frag_at; /* A from A^T row-major */
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> frag_bt; /* X^T of a row-major X */
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> frag_b;
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> frag_c;

/* Shared memory, byte offsets from a 32-byte aligned base (wmma needs 32;
 * CUDA promises 16 for dynamic shared memory): the staging area (TC_ROWS
 * rows of ld BF16: the block's own rows, later two TC_COLS-row tiles), per
 * warp an f32 tile S and a BF16 tile P (and S2, P2 in the backward); in
 * dK/dV the streamed query rows' lse and Di (46.3 KiB at head dim 128). ld = D + 8 staggers the rows across
 * banks and keeps every fragment pointer 32-byte aligned. */
struct tc_smem {
    int ld;
    size_t s, s2, p, p2, lse, total;
};

__host__ __device__ __forceinline__ tc_smem tc_layout(int64_t D, bool back) {
    tc_smem m;
    m.ld = (int)D + 8;
    m.s = (size_t)TC_ROWS * m.ld * 2;
    m.s2 = m.s + TC_WARPS * S_BYTES;
    m.p = m.s2 + (back ? TC_WARPS * S_BYTES : 0);
    m.p2 = m.p + TC_WARPS * P_BYTES;
    m.lse = m.p2 + (back ? TC_WARPS * P_BYTES : 0);
    m.total = m.lse + (back ? 2 * TC_COLS * sizeof(float) : 0) + 32;
    return m;
}

/* this thread's view of the block's shared memory: the staging area (or
 * the two streamed tiles X0, X1 in it), the warp's tiles, the lane pair's
 * row r of them and its half hf of the columns */
struct tc_bufs {
    int ld, nd, w, r, hf;
    bf16 *stage, *X0, *X1, *P, *P2;
    float *S, *S2, *Ls, *Ds;
};

__device__ __forceinline__ tc_bufs tc_carve(void *sm, int64_t D, bool back) {
    const tc_smem L = tc_layout(D, back);
    unsigned char *base = (unsigned char *)(((uintptr_t)sm + 31) & ~(uintptr_t)31);
    tc_bufs t;
    t.ld = L.ld;
    t.nd = (int)D / 16;
    t.w = threadIdx.x / 32;
    t.r = threadIdx.x % 32 / 2;
    t.hf = threadIdx.x % 2;
    t.stage = t.X0 = (bf16 *)base;
    t.X1 = t.X0 + TC_COLS * t.ld;
    t.S = (float *)(base + L.s + t.w * S_BYTES);
    t.S2 = (float *)(base + L.s2 + t.w * S_BYTES);
    t.P = (bf16 *)(base + L.p + t.w * P_BYTES);
    t.P2 = (bf16 *)(base + L.p2 + t.w * P_BYTES);
    t.Ls = (float *)(base + L.lse);
    t.Ds = t.Ls + TC_COLS;
    return t;
}

/* Scores are kept in log2 units (scale and softcap, then times log2 e), so
 * each probability is one exp2f; lse goes to and from memory in natural
 * units, as the F32 kernels keep it. */
#define LOG2E 1.44269504088896341f
#define LN2 0.693147180559945309f

/* the column of the warp's 16 x 32 score tile that lane 2r + hf (row r)
 * takes at step c: the row's two lanes interleave, and rows 8-15 walk the
 * columns from the other end, so a step's 32 loads from S (and stores to
 * the BF16 tile P) fall in 32 different banks, where 16 consecutive columns
 * a lane put 4 lanes on each bank. Affine in c, so the unrolled steps need
 * no address registers of their own. */
__device__ __forceinline__ int tile_col(int r, int hf, int c) { return r < 8 ? 2 * c + hf : 30 + hf - 2 * c; }

/* a compile-time flag for the kernels' tile bodies: FULL when every score of
 * the warp's tile is seen (every row live, a whole tile, inside every row's
 * key range, no segments) and there is no softcap, so neither masks nor tanh
 * run; the diagonal's and the edges' tiles take the general body */
template <bool B> struct tile_kind {
    static constexpr bool full = B;
};

/* four consecutive elements of a row as floats (16-byte / 8-byte loads) */
__device__ __forceinline__ float4 load4(const float *p) { return *(const float4 *)p; }
__device__ __forceinline__ float4 load4(const __half *p) {
    const __half2 *h = (const __half2 *)p;
    float2 a = __half22float2(h[0]), b = __half22float2(h[1]);
    return make_float4(a.x, a.y, b.x, b.y);
}

/* rows [r0, r0 + n) of head h, batch b of x (element type T) as BF16 rows
 * 0..rows-1 of dst (ld apart); rows from n on are zero. Four elements a
 * thread at a time when x's rows allow vector loads (`vec`: every row start
 * aligned to 4 elements), else one. */
template <typename T>
__device__ __forceinline__ void stage_bf16(bf16 *dst, int ld, const CT &x, int64_t h, int64_t r0, int64_t n, int rows,
                                           int64_t b, int D, bool vec) {
    const char *base = x.data + h * x.nb[1] + r0 * x.nb[2] + b * x.nb[3];
    if (vec) {
        const int q = D / 4;
        for (int e = threadIdx.x; e < rows * q; e += blockDim.x) {
            int r = e / q, d = 4 * (e - r * q);
            float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (r < n) v = load4((const T *)(base + r * x.nb[2]) + d);
            store4(dst + r * ld + d, v); /* ld, d even: 4-byte aligned */
        }
        return;
    }
    for (int e = threadIdx.x; e < rows * D; e += blockDim.x) {
        int r = e / D, d = e % D;
        float v = r < n ? to_f(((const T *)(base + r * x.nb[2]))[d]) : 0.0f;
        dst[r * ld + d] = __float2bfloat16(v);
    }
}

/* whether x's rows (any head, position, batch) start 4-element aligned */
static bool rows_vec(const CT &x) {
    size_t al = 4 * (size_t)x.nb[0];
    return ((uintptr_t)x.data | (uintptr_t)x.nb[1] | (uintptr_t)x.nb[2] | (uintptr_t)x.nb[3]) % al == 0;
}

/* the lse (in log2 units; +inf, so that P = 0, past n or for a row that
 * sees no key) and Di of the streamed query rows [tt, tt + n) of head h,
 * batch b, for the dK/dV kernels */
__device__ __forceinline__ void stage_lse_di(float *Ls, float *Ds, const float *lse, const float *Di, const at &a,
                                             int64_t b, int64_t h, int64_t tt, int64_t n, int cols) {
    for (int i = threadIdx.x; i < cols; i += blockDim.x) {
        int64_t ri = (b * a.Tq + tt + i) * a.Hq + h;
        Ls[i] = i < n && lse[ri] > -INFINITY ? lse[ri] * LOG2E : INFINITY;
        Ds[i] = i < n ? Di[ri] : 0.0f;
    }
}

/* The ranges a warp's 16 rows all see whole, for the fast tiles (empty
 * for fewer rows, or with segments or softcap, which the general body
 * handles): the keys every query of [t0, t1) sees, and the queries that see
 * every key of [j0, j1). Key and query ranges only move up with the row, so
 * the first and last rows bound them. */
__device__ __forceinline__ void keys_seen_by_all(const at &a, int64_t t0, int64_t t1, int64_t *s, int64_t *e) {
    *s = *e = 0;
    if (t1 - t0 != 16 || a.seg || a.cap > 0) return;
    int64_t s0, e0, s1, e1;
    key_range(a, t0, &s0, &e0);
    key_range(a, t1 - 1, &s1, &e1);
    *s = s1;
    *e = e0;
}
__device__ __forceinline__ void queries_seeing_all(const at &a, int64_t j0, int64_t j1, int64_t *s, int64_t *e) {
    *s = *e = 0;
    if (j1 - j0 != 16 || a.seg || a.cap > 0) return;
    int64_t s0, e0, s1, e1;
    query_range(a, j0, &s0, &e0);
    query_range(a, j1 - 1, &s1, &e1);
    *s = s1;
    *e = e0;
}

/* whether the tile [x, x + cols) lies inside the whole range [s, e) */
__device__ __forceinline__ bool whole_tile(int64_t s, int64_t e, int64_t x, int cols) { return s <= x && x + cols <= e; }

/* this warp's 16 of the block's rows [r0, r0 + n) of head h of x as
 * fragments, through the staging area (the barrier first frees it) */
template <int ND>
__device__ __forceinline__ void own_rows(frag_a *f, bf16 *stage, int ld, const CT &x, int64_t h, int64_t r0, int64_t n,
                                         int64_t b, int D, bool vec) {
    __syncthreads();
    stage_bf16<float>(stage, ld, x, h, r0, n, TC_ROWS, b, D, vec);
    __syncthreads();
    const int w = threadIdx.x / 32, nd = D / 16;
#pragma unroll
    for (int i = 0; i < ND; i++)
        if (i < nd) wmma::load_matrix_sync(f[i], stage + 16 * w * ld + 16 * i, ld);
}

/* the warp's 16 x 32 tile A X^T into S: A as nd fragments, X 32 rows of ld */
template <int ND>
__device__ __forceinline__ void tile_abt(float *S, const frag_a *A, const bf16 *X, int ld, int nd) {
    frag_c c0, c1;
    wmma::fill_fragment(c0, 0.0f);
    wmma::fill_fragment(c1, 0.0f);
#pragma unroll
    for (int i = 0; i < ND; i++)
        if (i < nd) {
            frag_bt x;
            wmma::load_matrix_sync(x, X + 16 * i, ld);
            wmma::mma_sync(c0, A[i], x, c0);
            wmma::load_matrix_sync(x, X + 16 * ld + 16 * i, ld);
            wmma::mma_sync(c1, A[i], x, c1);
        }
    wmma::store_matrix_sync(S, c0, S_LD, wmma::mem_row_major);
    wmma::store_matrix_sync(S + 16, c1, S_LD, wmma::mem_row_major);
}

/* the lane's 16 scores of its row r of the warp's tile S, in log2 units
 * (score(), then times log2 e), in tile_col order: -inf where sees(col) is
 * false, cc[c] the softcap's tanh for the backward */
template <typename K, typename Sees>
__device__ __forceinline__ void row_scores(float *sv, float *cc, K, const float *S, const at &a, float sc2, Sees sees) {
    const int r = threadIdx.x % 32 / 2, hf = threadIdx.x % 2;
#pragma unroll
    for (int c = 0; c < 16; c++) {
        const int col = tile_col(r, hf, c);
        const float raw = S[r * S_LD + col];
        cc[c] = 0.0f;
        if (K::full) sv[c] = raw * sc2;
        else sv[c] = sees(col) ? score(a, raw, &cc[c]) * LOG2E : -INFINITY;
    }
}

/* acc[i] += A Y[:, 16 i ..]: A the warp's 16 x 32 BF16 operand as two
 * fragments (columns 0-15, 16-31), Y 32 rows of ld */
template <int ND, typename FA>
__device__ __forceinline__ void tile_av(frag_c *acc, const FA &p0, const FA &p1, const bf16 *Y, int ld, int nd) {
#pragma unroll
    for (int i = 0; i < ND; i++)
        if (i < nd) {
            frag_b y;
            wmma::load_matrix_sync(y, Y + 16 * i, ld);
            wmma::mma_sync(acc[i], p0, y, acc[i]);
            wmma::load_matrix_sync(y, Y + 16 * ld + 16 * i, ld);
            wmma::mma_sync(acc[i], p1, y, acc[i]);
        }
}

/* acc[i] += P Y[:, 16 i ..]: P the warp's 16 x 32 BF16 tile, Y 32 rows of ld */
template <int ND>
__device__ __forceinline__ void tile_pv(frag_c *acc, const bf16 *P, const bf16 *Y, int ld, int nd) {
    frag_a p0, p1;
    wmma::load_matrix_sync(p0, P, P_LD);
    wmma::load_matrix_sync(p1, P + 16, P_LD);
    tile_av<ND>(acc, p0, p1, Y, ld, nd);
}

/* the warp's 16 rows of acc (times s) to out: row r at out + r * stride;
 * rows at or past `live` are not written; S is the staging tile */
template <int ND>
__device__ __forceinline__ void store_rows(float *out, int64_t stride, int live, const frag_c *acc, float s, float *S,
                                           int nd) {
    int lane = threadIdx.x % 32, r = lane / 2, hf = lane % 2;
#pragma unroll
    for (int i = 0; i < ND; i++)
        if (i < nd) {
            wmma::store_matrix_sync(S, acc[i], S_LD, wmma::mem_row_major);
            __syncwarp();
            if (r < live)
                for (int c = 0; c < 8; c++) out[r * stride + 16 * i + 8 * hf + c] = s * S[r * S_LD + 8 * hf + c];
            __syncwarp();
        }
}

/* acc's rows times f, the lane pair's row r by its own f (the warp's
 * accumulators through the score tile S: wmma does not say which lane
 * holds which element) */
template <int ND>
__device__ __forceinline__ void rescale_rows(frag_c *acc, float f, float *S, int nd) {
    int lane = threadIdx.x % 32, r = lane / 2, hf = lane % 2;
    __syncwarp(); /* S's scores are read */
#pragma unroll
    for (int i = 0; i < ND; i++)
        if (i < nd) {
            wmma::store_matrix_sync(S, acc[i], S_LD, wmma::mem_row_major);
            __syncwarp();
            for (int c = 0; c < 8; c++) S[r * S_LD + 8 * hf + c] *= f;
            __syncwarp();
            wmma::load_matrix_sync(acc[i], S, S_LD, wmma::mem_row_major);
            __syncwarp();
        }
}

/* A block of query rows (forward, dQ): blocks are (query tile, head,
 * batch); the block's rows [t0, t1), the warp's [wt0, wt1), the lane
 * pair's row t (live when inside the block), and the keys [j0, j1) row t
 * sees, [wjs, wje) any of the warp's rows see, [js, je) the block's. */
struct qtile {
    int64_t h, b, g, t0, t1, wt0, wt1, t, j0, j1, wjs, wje, js, je;
    int64_t wfs, wfe; /* keys every one of the warp's 16 rows sees (empty with segments or softcap) */
    bool wlive, rlive;
    int32_t seg; /* row t's segment (packed documents) */
};

/* whether the warp's key tile jt (of TC_COLS) is a full one (a whole one: wfe <= je) */
__device__ __forceinline__ bool full_tile(const qtile &Q, int64_t jt) { return whole_tile(Q.wfs, Q.wfe, jt, TC_COLS); }

__device__ __forceinline__ qtile query_tile(const at &a, const CT &seg) {
    qtile q;
    int64_t nqt = cdiv(a.Tq, TC_ROWS), w = threadIdx.x / 32, r = threadIdx.x % 32 / 2;
    q.h = (blockIdx.x / nqt) % a.Hq;
    q.b = blockIdx.x / (nqt * a.Hq);
    q.g = q.h / a.group;
    q.t0 = blockIdx.x % nqt * TC_ROWS;
    q.t1 = q.t0 + TC_ROWS < a.Tq ? q.t0 + TC_ROWS : a.Tq;
    q.wt0 = q.t0 + 16 * w;
    q.wt1 = q.wt0 + 16 < q.t1 ? q.wt0 + 16 : q.t1;
    q.t = q.wt0 + r;
    q.wlive = q.wt0 < q.t1;
    q.rlive = q.t < q.t1;
    q.j0 = q.j1 = q.wjs = q.wje = 0;
    if (q.rlive) key_range(a, q.t, &q.j0, &q.j1);
    if (q.wlive) block_keys(a, q.wt0, q.wt1, &q.wjs, &q.wje);
    block_keys(a, q.t0, q.t1, &q.js, &q.je);
    keys_seen_by_all(a, q.wt0, q.wt1, &q.wfs, &q.wfe);
    q.seg = a.seg && q.rlive ? seg_at(seg, q.t, q.b) : 0;
    return q;
}

/* The one-pass forward keeps a row's running max m and sum l (of
 * 2^(s - m), s in log2 units) and rescales O only when a tile's max passes
 * m by more than RESCALE_AT (then m moves to it): until then 2^(s - m) <=
 * 2^11.5 (about e^8) stays well inside F32 and BF16, and the accumulators
 * need no round trip through shared memory for most tiles. */
#define RESCALE_AT 11.5f

/* blocks: (query tile, head, batch). one: a single pass over the keys
 * (online softmax, O rescaled as above), else two (lse first, then O with
 * the final probabilities: TOY_CUDA_ATTN=twopass) */
template <int ND, typename KT>
__global__ void k_attn_fwd_tc(CT out, CT q, CT k, CT v, CT seg, at a, float *lse, int vec, bool one) {
    at_dyn(a);
    extern __shared__ float4 tc_sm[];
    const tc_bufs M = tc_carve(tc_sm, a.D, false);
    const int ld = M.ld, D = (int)a.D, nd = M.nd, r = M.r, hf = M.hf;
    bf16 *stage = M.stage, *Ks = M.X0, *Vs = M.X1, *P = M.P;
    float *S = M.S;
    const qtile Q = query_tile(a, seg);
    const float sc2 = a.scale * LOG2E;

    frag_a qf[ND];
    own_rows<ND>(qf, stage, ld, q, Q.h, Q.t0, Q.t1 - Q.t0, Q.b, D, vec & 1);
    frag_c of[ND];
    float m = -INFINITY, l = 0.0f, row_lse = -INFINITY; /* log2 units */
    if (one) {
#pragma unroll
        for (int i = 0; i < ND; i++) wmma::fill_fragment(of[i], 0.0f);
    }
    for (int pass = one ? 1 : 0; pass < 2; pass++) {
        if (pass == 1 && !one) { /* the lane pair's partial (max, sum) make the row's lse */
            float mo = __shfl_xor_sync(0xffffffffu, m, 1), lo = __shfl_xor_sync(0xffffffffu, l, 1);
            float M = fmaxf(m, mo);
            float sum = (m > -INFINITY ? l * exp2f(m - M) : 0.0f) + (mo > -INFINITY ? lo * exp2f(mo - M) : 0.0f);
            row_lse = sum > 0.0f ? M + log2f(sum) : -INFINITY;
#pragma unroll
            for (int i = 0; i < ND; i++) wmma::fill_fragment(of[i], 0.0f);
        }
        for (int64_t jt = Q.js; jt < Q.je; jt += TC_COLS) {
            int64_t n = Q.je - jt < TC_COLS ? Q.je - jt : TC_COLS;
            __syncthreads(); /* the last tiles (or Q's staging) are read */
            stage_bf16<KT>(Ks, ld, k, Q.g, jt, n, TC_COLS, Q.b, D, vec & 2);
            if (pass) stage_bf16<KT>(Vs, ld, v, Q.g, jt, n, TC_COLS, Q.b, D, vec & 4);
            __syncthreads();
            if (!Q.wlive || jt >= Q.wje || jt + n <= Q.wjs) continue;
            tile_abt<ND>(S, qf, Ks, ld, nd);
            __syncwarp();
            float sv[16], cc[16], tmax = -INFINITY;
            auto sees = [&](int col) {
                int64_t j = jt + col;
                return Q.rlive && col < n && j >= Q.j0 && j < Q.j1 && (!a.seg || seg_at(seg, j, Q.b) == Q.seg);
            };
            if (full_tile(Q, jt)) row_scores(sv, cc, tile_kind<true>(), S, a, sc2, sees);
            else row_scores(sv, cc, tile_kind<false>(), S, a, sc2, sees);
            for (int c = 0; c < 16; c++) tmax = fmaxf(tmax, sv[c]);
            if (pass == 0) {
                if (tmax > -INFINITY) {
                    float mn = fmaxf(m, tmax), sum = 0.0f;
                    for (int c = 0; c < 16; c++) sum += exp2f(sv[c] - mn);
                    l = l * exp2f(m - mn) + sum;
                    m = mn;
                }
                continue;
            }
            float base = row_lse; /* 2^(s - base): -inf scores give 0 against a finite base */
            if (one) { /* the row's max over the lane pair; m moves (and O rescales) only past RESCALE_AT */
                float rmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 1));
                bool up = rmax > -INFINITY && (m == -INFINITY || rmax > m + RESCALE_AT);
                float f = up && m > -INFINITY ? exp2f(m - rmax) : 1.0f;
                if (__any_sync(0xffffffffu, f != 1.0f)) rescale_rows<ND>(of, f, S, nd);
                if (up) {
                    l *= f;
                    m = rmax;
                }
                base = m;
            }
            base = base > -INFINITY ? base : 0.0f; /* a row that has seen nothing: every score is -inf */
            for (int c = 0; c < 16; c++) {
                float p = exp2f(sv[c] - base);
                l += one ? p : 0.0f;
                P[r * P_LD + tile_col(r, hf, c)] = __float2bfloat16(p);
            }
            __syncwarp();
            tile_pv<ND>(of, P, Vs, ld, nd);
        }
    }
    float os = 1.0f; /* the lane's row's output scale */
    if (one) { /* the lane pair's sums make the row's; O / l */
        float lr = l + __shfl_xor_sync(0xffffffffu, l, 1);
        row_lse = lr > 0.0f ? m + log2f(lr) : -INFINITY;
        os = lr > 0.0f ? 1.0f / lr : 0.0f;
    }
    if (!Q.wlive) return;
    /* out is {D, Hq, Tq, B} contiguous: consecutive t are Hq D apart */
    float *orow = (float *)(out.data + Q.h * out.nb[1] + Q.wt0 * out.nb[2] + Q.b * out.nb[3]);
    store_rows<ND>(orow, out.nb[2] / 4, (int)(Q.wt1 - Q.wt0), of, os, S, nd);
    if (Q.rlive && hf == 0) lse[(Q.b * a.Tq + Q.t) * a.Hq + Q.h] = row_lse * LN2;
}

/* blocks: (query tile, head, batch) */
template <int ND>
__global__ void k_attn_dq_tc(float *dq, CT dO, CT q, CT k, CT v, CT seg, at a, const float *lse, const float *Di,
                             int vec) {
    extern __shared__ float4 tc_sm[];
    const tc_bufs M = tc_carve(tc_sm, a.D, true);
    const int ld = M.ld, D = (int)a.D, nd = M.nd, r = M.r, hf = M.hf;
    bf16 *stage = M.stage, *Ks = M.X0, *Vs = M.X1, *P = M.P;
    float *S = M.S, *S2 = M.S2;
    const qtile Q = query_tile(a, seg);
    const float sc2 = a.scale * LOG2E;
    float Lr = INFINITY, di = 0.0f; /* lse in log2 units; +inf: P = 0 (no row, or a row that sees no key) */
    if (Q.rlive) {
        int64_t ri = (Q.b * a.Tq + Q.t) * a.Hq + Q.h;
        Lr = lse[ri] > -INFINITY ? lse[ri] * LOG2E : INFINITY;
        di = Di[ri];
    }

    frag_a qf[ND], df[ND];
    own_rows<ND>(qf, stage, ld, q, Q.h, Q.t0, Q.t1 - Q.t0, Q.b, D, vec & 1);
    own_rows<ND>(df, stage, ld, dO, Q.h, Q.t0, Q.t1 - Q.t0, Q.b, D, vec & 8);
    frag_c acc[ND];
#pragma unroll
    for (int i = 0; i < ND; i++) wmma::fill_fragment(acc[i], 0.0f);
    for (int64_t jt = Q.js; jt < Q.je; jt += TC_COLS) {
        int64_t n = Q.je - jt < TC_COLS ? Q.je - jt : TC_COLS;
        __syncthreads();
        stage_bf16<float>(Ks, ld, k, Q.g, jt, n, TC_COLS, Q.b, D, vec & 2);
        stage_bf16<float>(Vs, ld, v, Q.g, jt, n, TC_COLS, Q.b, D, vec & 4);
        __syncthreads();
        if (!Q.wlive || jt >= Q.wje || jt + n <= Q.wjs) continue;
        tile_abt<ND>(S, qf, Ks, ld, nd);  /* scores */
        tile_abt<ND>(S2, df, Vs, ld, nd); /* dP = dO V^T */
        __syncwarp();
        float sv[16], cc[16];
        auto sees = [&](int col) {
            int64_t j = jt + col;
            return Q.rlive && col < n && j >= Q.j0 && j < Q.j1 && (!a.seg || seg_at(seg, j, Q.b) == Q.seg);
        };
        if (full_tile(Q, jt)) row_scores(sv, cc, tile_kind<true>(), S, a, sc2, sees);
        else row_scores(sv, cc, tile_kind<false>(), S, a, sc2, sees);
        for (int c = 0; c < 16; c++) {
            int col = tile_col(r, hf, c);
            P[r * P_LD + col] = __float2bfloat16(ds_of(a, exp2f(sv[c] - Lr), S2[r * S_LD + col], di, cc[c]));
        }
        __syncwarp();
        tile_pv<ND>(acc, P, Ks, ld, nd); /* dQ += dS K */
    }
    if (!Q.wlive) return;
    store_rows<ND>(dq + ((Q.b * a.Tq + Q.wt0) * a.Hq + Q.h) * a.D, a.Hq * a.D, (int)(Q.wt1 - Q.wt0), acc, a.scale, S,
                   nd);
}

/* dQ = scale dS K from the dS that k_attn_dkv_tc stored (ds_t: BF16, key
 * j's row holds its dS against every query, ldT apart; the same BF16
 * values the recomputing kernel above would form): one product a tile
 * and no scores. blocks: (query tile, head, batch). Lane i loads key
 * jt + i's 16 values for the warp's queries into the warp's 32 x 16 tile
 * (dS^T, so dS column-major); outside whole tiles it zeroes the pairs a
 * row does not see, which k_attn_dkv_tc may not have written. */
#define DS_LD 24 /* the tile's row: 16 BF16 and 8 of padding (48 bytes: no bank conflicts) */
template <int ND>
__global__ void k_attn_dq_ds_tc(float *dq, CT k, CT seg, at a, const bf16 *ds_t, int64_t ldT, int vec) {
    extern __shared__ float4 tc_sm[];
    const tc_bufs M = tc_carve(tc_sm, a.D, false);
    const int ld = M.ld, D = (int)a.D, nd = M.nd, lane = threadIdx.x % 32;
    bf16 *Ks = M.X0, *T = (bf16 *)M.S; /* 32 x DS_LD BF16 fit the warp's f32 tile */
    const qtile Q = query_tile(a, seg);
    const bf16 *rows = ds_t + (Q.b * a.Hq + Q.h) * a.Tk * ldT + Q.wt0; /* wt0 < Tq, wt0 + 16 <= ldT */
    frag_c acc[ND];
#pragma unroll
    for (int i = 0; i < ND; i++) wmma::fill_fragment(acc[i], 0.0f);
    for (int64_t jt = Q.js; jt < Q.je; jt += TC_COLS) {
        int64_t n = Q.je - jt < TC_COLS ? Q.je - jt : TC_COLS, j = jt + lane;
        bool mine = Q.wlive && jt < Q.wje && jt + n > Q.wjs;
        uint4 lo = make_uint4(0, 0, 0, 0), hi = lo;
        if (mine && lane < n) { /* issued before the staging: the two loads' latencies overlap */
            const uint4 *src = (const uint4 *)(rows + j * ldT);
            lo = src[0];
            hi = src[1];
        }
        __syncthreads(); /* the last K tile is read */
        stage_bf16<float>(Ks, ld, k, Q.g, jt, n, TC_COLS, Q.b, D, vec & 2);
        __syncthreads();
        if (!mine) continue;
        uint4 *dst = (uint4 *)(T + lane * DS_LD);
        dst[0] = lo;
        dst[1] = hi;
        if (!full_tile(Q, jt))
#pragma unroll 1
            for (int i = 0; i < 16; i++) {
                int64_t t = Q.wt0 + i, j0, j1;
                key_range(a, t, &j0, &j1);
                bool ok = t < Q.t1 && lane < n && j >= j0 && j < j1 &&
                          (!a.seg || seg_at(seg, j, Q.b) == seg_at(seg, t, Q.b));
                if (!ok) T[lane * DS_LD + i] = __float2bfloat16(0.0f);
            }
        __syncwarp();
        frag_at d0, d1;
        wmma::load_matrix_sync(d0, T, DS_LD);
        wmma::load_matrix_sync(d1, T + 16 * DS_LD, DS_LD);
        tile_av<ND>(acc, d0, d1, Ks, ld, nd); /* dQ += dS K */
        __syncwarp(); /* T is read before the next tile's rows land */
    }
    if (!Q.wlive) return;
    store_rows<ND>(dq + ((Q.b * a.Tq + Q.wt0) * a.Hq + Q.h) * a.D, a.Hq * a.D, (int)(Q.wt1 - Q.wt0), acc, a.scale, M.S,
                   nd);
}

/* blocks: (key tile, kv head, batch); the queries of every head of the group
 * stream past. ds_t: where dS goes for k_attn_dq_ds_tc (NULL: dQ recomputes
 * it); then the query tiles start at a multiple of 16, so each row's 16
 * values go out as two 16-byte stores. */
template <int ND>
__global__ void k_attn_dkv_tc(float *dk, float *dv, CT dO, CT q, CT k, CT v, CT seg, at a, const float *lse,
                              const float *Di, int vec, bf16 *ds_t, int64_t ldT) {
    extern __shared__ float4 tc_sm[];
    const tc_bufs M = tc_carve(tc_sm, a.D, true);
    const int ld = M.ld, D = (int)a.D, nd = M.nd, w = M.w, r = M.r, hf = M.hf;
    bf16 *stage = M.stage, *Qs = M.X0, *Os = M.X1, *P = M.P, *P2 = M.P2;
    float *S = M.S, *S2 = M.S2, *Ls = M.Ls, *Ds = M.Ds;
    int64_t nkt = cdiv(a.Tk, TC_ROWS);
    int64_t kt = blockIdx.x % nkt, g = (blockIdx.x / nkt) % a.Hkv, b = blockIdx.x / (nkt * a.Hkv);
    int64_t jb0 = kt * TC_ROWS, jb1 = jb0 + TC_ROWS < a.Tk ? jb0 + TC_ROWS : a.Tk;
    int64_t wj0 = jb0 + 16 * w, wj1 = wj0 + 16 < jb1 ? wj0 + 16 : jb1, j = wj0 + r;
    bool wlive = wj0 < jb1, rlive = j < jb1;
    int64_t q0 = 0, q1 = 0, bs, be, ws = 0, we = 0;
    int32_t key_seg = 0;
    if (rlive) {
        query_range(a, j, &q0, &q1);
        if (a.seg) key_seg = seg_at(seg, j, b);
    }
    if (wlive) block_queries(a, wj0, wj1, &ws, &we);
    block_queries(a, jb0, jb1, &bs, &be);
    if (ds_t) bs -= bs % 16;
    int64_t fs, fe;
    queries_seeing_all(a, wj0, wj1, &fs, &fe);
    const float sc2 = a.scale * LOG2E;

    frag_a kf[ND], vf[ND];
    own_rows<ND>(kf, stage, ld, k, g, jb0, jb1 - jb0, b, D, vec & 2);
    own_rows<ND>(vf, stage, ld, v, g, jb0, jb1 - jb0, b, D, vec & 4);
    frag_c dka[ND], dva[ND];
#pragma unroll
    for (int i = 0; i < ND; i++) {
        wmma::fill_fragment(dka[i], 0.0f);
        wmma::fill_fragment(dva[i], 0.0f);
    }
    for (int64_t h = g * a.group; h < (g + 1) * a.group; h++)
        for (int64_t tt = bs; tt < be; tt += TC_COLS) {
            int64_t n = be - tt < TC_COLS ? be - tt : TC_COLS;
            __syncthreads();
            stage_bf16<float>(Qs, ld, q, h, tt, n, TC_COLS, b, D, vec & 1);
            stage_bf16<float>(Os, ld, dO, h, tt, n, TC_COLS, b, D, vec & 8);
            stage_lse_di(Ls, Ds, lse, Di, a, b, h, tt, n, TC_COLS);
            __syncthreads();
            if (!wlive || tt >= we || tt + n <= ws) continue;
            tile_abt<ND>(S, kf, Qs, ld, nd);  /* S^T = K Q^T */
            tile_abt<ND>(S2, vf, Os, ld, nd); /* dP^T = V dO^T */
            __syncwarp();
            float sv[16], cc[16];
            auto sees = [&](int col) {
                int64_t tq = tt + col; /* past n: tq >= be >= q1 */
                return rlive && tq >= q0 && tq < q1 && (!a.seg || seg_at(seg, tq, b) == key_seg);
            };
            if (whole_tile(fs, fe, tt, TC_COLS)) row_scores(sv, cc, tile_kind<true>(), S, a, sc2, sees);
            else row_scores(sv, cc, tile_kind<false>(), S, a, sc2, sees);
            for (int c = 0; c < 16; c++) {
                int col = tile_col(r, hf, c);
                float p = exp2f(sv[c] - Ls[col]);
                P[r * P_LD + col] = __float2bfloat16(p);
                P2[r * P_LD + col] = __float2bfloat16(ds_of(a, p, S2[r * S_LD + col], Ds[col], cc[c]));
            }
            __syncwarp();
            if (ds_t && rlive && tt + 16 * hf < ldT) { /* tt, ldT multiples of 16: a half is in or out whole */
                const uint4 *src = (const uint4 *)(P2 + r * P_LD + 16 * hf);
                uint4 *dst = (uint4 *)(ds_t + ((b * a.Hq + h) * a.Tk + j) * ldT + tt + 16 * hf);
                dst[0] = src[0];
                dst[1] = src[1];
            }
            tile_pv<ND>(dva, P, Os, ld, nd);  /* dV += P^T dO */
            tile_pv<ND>(dka, P2, Qs, ld, nd); /* dK += dS^T Q */
        }
    if (!wlive) return;
    int64_t off = ((b * a.Tk + wj0) * a.Hkv + g) * a.D;
    store_rows<ND>(dk + off, a.Hkv * a.D, (int)(wj1 - wj0), dka, a.scale, S, nd);
    store_rows<ND>(dv + off, a.Hkv * a.D, (int)(wj1 - wj0), dva, 1.0f, S, nd);
}

/* ---- the forward on mma.sync (TOY_CUDA_ATTN=mma) ------------------------------------------
 * Flash-attention 2 with the scores in registers: a warp's 16 query rows
 * against key tiles of MMA_KEYS, S = Q K^T in m16n8k16 steps (mma_bf16;
 * Q's fragments loaded once), the online softmax on the accumulators (a
 * row's 16 values a tile sit in the four lanes of its group: two shuffles
 * give its max and sum), and P, rounded to BF16, used in place as the A
 * operand of O += P V (two m16n8 accumulators are one m16k16 A fragment).
 * K is staged row-major and V transposed, both BF16, so every B fragment
 * register is one 32-bit shared load, and rows D + 8 (MMA_KEYS + 8)
 * elements apart put a load's 32 lanes on 32 banks. No wmma, no round trip
 * of scores through shared memory. dK/dV likewise (k_attn_dkv_mma, below);
 * dQ stays on wmma (k_attn_dq_ds_tc: one product a tile). */
#define MMA_KEYS 64

/* rows [r0, r0 + n) of head h, batch b of x as the BF16 columns 0..n-1 of
 * dst (dst[d * ld + r]: x transposed), columns n..rows-1 zero */
template <typename T>
__device__ __forceinline__ void stage_bf16_t(bf16 *dst, int ld, const CT &x, int64_t h, int64_t r0, int64_t n,
                                             int rows, int64_t b, int D, bool vec) {
    const char *base = x.data + h * x.nb[1] + r0 * x.nb[2] + b * x.nb[3];
    const int w = vec ? 4 : 1, q = D / w;
    for (int e = threadIdx.x; e < rows * q; e += blockDim.x) {
        int r = e / q, d = w * (e - r * q);
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (r < n) {
            const T *row = (const T *)(base + r * x.nb[2]) + d;
            if (vec) v = load4(row);
            else v.x = to_f(row[0]);
        }
        dst[d * ld + r] = __float2bfloat16(v.x);
        if (vec) {
            dst[(d + 1) * ld + r] = __float2bfloat16(v.y);
            dst[(d + 2) * ld + r] = __float2bfloat16(v.z);
            dst[(d + 3) * ld + r] = __float2bfloat16(v.w);
        }
    }
}

/* a B fragment's two registers: BF16 pairs p[0..1] and p[8..9] of a shared row */
__device__ __forceinline__ void frag_b_at(uint32_t b[2], const bf16 *p) {
    b[0] = *(const uint32_t *)p;
    b[1] = *(const uint32_t *)(p + 8);
}

/* the A fragments of the lane's two rows (g and g + 8 of its warp's 16;
 * NULL: a row past the end, zeros), F32 in memory, columns 16 kk + 2 t4
 * (+ 1, + 8, + 9) for kk < nd */
template <int ND>
__device__ __forceinline__ void frag_a_rows(uint32_t a[ND][4], const float *r0, const float *r1, int nd) {
    const float *rows[2] = {r0, r1};
    const int t4 = threadIdx.x % 4;
#pragma unroll
    for (int kk = 0; kk < ND; kk++)
        for (int i = 0; i < 4; i++) {
            const float *x = kk < nd ? rows[i % 2] : NULL;
            int c = 16 * kk + 2 * t4 + 8 * (i / 2);
            a[kk][i] = x ? pack_bf16(x[c], x[c + 1]) : pack_bf16(0.0f, 0.0f);
        }
}

static size_t mma_smem(int64_t D) { return ((size_t)MMA_KEYS * (D + 8) + (size_t)D * (MMA_KEYS + 8)) * 2 + 32; }

/* one query row of a lane (g or g + 8 of its warp's 16): its keys and segment */
struct mma_row {
    int64_t t, j0, j1;
    int32_t seg;
    bool live;
};

__device__ __forceinline__ mma_row mma_row_at(const at &a, const qtile &Q, const CT &seg, int64_t t) {
    mma_row r;
    r.t = t;
    r.live = Q.wlive && t < Q.t1;
    r.j0 = r.j1 = 0;
    if (r.live) key_range(a, t, &r.j0, &r.j1);
    r.seg = a.seg && r.live ? seg_at(seg, t, Q.b) : 0;
    return r;
}

/* blocks: (query tile of TC_ROWS, head, batch), TC_WARPS warps of 16 rows */
template <int ND, typename KT>
__global__ void k_attn_fwd_mma(CT out, CT q, CT k, CT v, CT seg, at a, float *lse, int vec) {
    at_dyn(a);
    extern __shared__ float4 tc_sm[];
    const int D = (int)a.D, nd = D / 16, kld = D + 8, vld = MMA_KEYS + 8;
    bf16 *Ks = (bf16 *)(((uintptr_t)tc_sm + 31) & ~(uintptr_t)31), *Vt = Ks + MMA_KEYS * kld;
    const qtile Q = query_tile(a, seg);
    const int lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
    const float sc2 = a.scale * LOG2E;
    const mma_row R[2] = {mma_row_at(a, Q, seg, Q.wt0 + g), mma_row_at(a, Q, seg, Q.wt0 + g + 8)};

    uint32_t qa[ND][4]; /* Q's rows g, g + 8 as A fragments, 16 columns each */
    const float *qrow[2];
    for (int i = 0; i < 2; i++)
        qrow[i] = R[i].live ? (const float *)(q.data + Q.h * q.nb[1] + R[i].t * q.nb[2] + Q.b * q.nb[3]) : NULL;
    frag_a_rows<ND>(qa, qrow[0], qrow[1], nd);
    float o[2 * ND][4];
#pragma unroll
    for (int dn = 0; dn < 2 * ND; dn++)
        for (int e = 0; e < 4; e++) o[dn][e] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}; /* log2 units */

    for (int64_t jt = Q.js; jt < Q.je; jt += MMA_KEYS) {
        int64_t n = Q.je - jt < MMA_KEYS ? Q.je - jt : MMA_KEYS;
        __syncthreads(); /* the last tiles are read */
        stage_bf16<KT>(Ks, kld, k, Q.g, jt, n, MMA_KEYS, Q.b, D, vec & 2);
        stage_bf16_t<KT>(Vt, vld, v, Q.g, jt, n, MMA_KEYS, Q.b, D, vec & 4);
        __syncthreads();
        if (!Q.wlive || jt >= Q.wje || jt + n <= Q.wjs) continue;
        float s[8][4]; /* key block nt: keys jt + 8 nt + 2 t4 + (e & 1) of rows g (e < 2), g + 8 */
#pragma unroll
        for (int nt = 0; nt < 8; nt++) {
            for (int e = 0; e < 4; e++) s[nt][e] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < ND; kk++)
                if (kk < nd) {
                    uint32_t b[2];
                    frag_b_at(b, Ks + (8 * nt + g) * kld + 16 * kk + 2 * t4);
                    mma_bf16(s[nt], qa[kk], b, s[nt]);
                }
        }
        const bool full = whole_tile(Q.wfs, Q.wfe, jt, MMA_KEYS);
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
            for (int e = 0; e < 4; e++) {
                float x = s[nt][e] * sc2;
                if (!full) {
                    const mma_row &rw = R[e / 2];
                    int col = 8 * nt + 2 * t4 + (e & 1);
                    int64_t j = jt + col;
                    bool ok = rw.live && col < n && j >= rw.j0 && j < rw.j1 &&
                              (!a.seg || seg_at(seg, j, Q.b) == rw.seg);
                    float cc;
                    x = ok ? score(a, s[nt][e], &cc) * LOG2E : -INFINITY;
                }
                s[nt][e] = x;
                mx[e / 2] = fmaxf(mx[e / 2], x);
            }
        float base[2];
        for (int i = 0; i < 2; i++) { /* the row's max over its 4 lanes; O and l rescale to it */
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
            float mn = fmaxf(m[i], mx[i]);
            float f = mn == -INFINITY ? 1.0f : exp2f(m[i] - mn);
            l[i] *= f;
#pragma unroll
            for (int dn = 0; dn < 2 * ND; dn++) {
                o[dn][2 * i] *= f;
                o[dn][2 * i + 1] *= f;
            }
            m[i] = mn;
            base[i] = mn == -INFINITY ? 0.0f : mn; /* nothing seen yet: every score is -inf */
        }
        uint32_t pa[4][4]; /* P as A fragments, keys 16 j.. */
#pragma unroll
        for (int j = 0; j < 4; j++)
            for (int h2 = 0; h2 < 2; h2++) { /* key blocks 2 j, 2 j + 1 */
                const float *sv = s[2 * j + h2];
                float p0 = exp2f(sv[0] - base[0]), p1 = exp2f(sv[1] - base[0]);
                float p2 = exp2f(sv[2] - base[1]), p3 = exp2f(sv[3] - base[1]);
                l[0] += p0 + p1;
                l[1] += p2 + p3;
                pa[j][2 * h2] = pack_bf16(p0, p1);
                pa[j][2 * h2 + 1] = pack_bf16(p2, p3);
            }
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int dn = 0; dn < 2 * ND; dn++)
                if (dn < 2 * nd) {
                    uint32_t b[2];
                    frag_b_at(b, Vt + (8 * dn + g) * vld + 16 * j + 2 * t4);
                    mma_bf16(o[dn], pa[j], b, o[dn]);
                }
    }
    for (int i = 0; i < 2; i++) {
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
        const mma_row &rw = R[i];
        if (!rw.live) continue;
        float os = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
        float *orow = (float *)(out.data + Q.h * out.nb[1] + rw.t * out.nb[2] + Q.b * out.nb[3]);
#pragma unroll
        for (int dn = 0; dn < 2 * ND; dn++)
            if (dn < 2 * nd) {
                orow[8 * dn + 2 * t4] = o[dn][2 * i] * os;
                orow[8 * dn + 2 * t4 + 1] = o[dn][2 * i + 1] * os;
            }
        if (t4 == 0) lse[(Q.b * a.Tq + rw.t) * a.Hq + Q.h] = l[i] > 0.0f ? (m[i] + log2f(l[i])) * LN2 : -INFINITY;
    }
}

/* dK, dV (and dS for k_attn_dq_ds_tc) on mma.sync, head dims up to 64:
 * blocks of 64 keys (16 a warp, K and V held as A fragments), the queries
 * of every head of the group streaming past in tiles of MMA_KEYS. Per
 * tile S^T = K Q^T and dP^T = V dO^T stay in registers; P^T and dS^T,
 * rounded to BF16, are the A operands of dV += P^T dO and dK += dS^T Q in
 * place. Q and dO are staged twice, row-major (B of the first two
 * products) and transposed (B of the last two). */
template <int ND>
__global__ void k_attn_dkv_mma(float *dk, float *dv, CT dO, CT q, CT k, CT v, CT seg, at a, const float *lse,
                               const float *Di, int vec, bf16 *ds_t, int64_t ldT) {
    extern __shared__ float4 tc_sm[];
    const int D = (int)a.D, nd = D / 16, ld = D + 8, ldt = MMA_KEYS + 8;
    bf16 *Qs = (bf16 *)(((uintptr_t)tc_sm + 31) & ~(uintptr_t)31), *Os = Qs + MMA_KEYS * ld, *Qt = Os + MMA_KEYS * ld,
         *Ot = Qt + D * ldt;
    float *Ls = (float *)(Ot + D * ldt), *Ds = Ls + MMA_KEYS;
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
    int64_t nkt = cdiv(a.Tk, TC_ROWS);
    int64_t kt = blockIdx.x % nkt, gh = (blockIdx.x / nkt) % a.Hkv, b = blockIdx.x / (nkt * a.Hkv);
    int64_t jb0 = kt * TC_ROWS, jb1 = jb0 + TC_ROWS < a.Tk ? jb0 + TC_ROWS : a.Tk;
    int64_t wj0 = jb0 + 16 * w, wj1 = wj0 + 16 < jb1 ? wj0 + 16 : jb1;
    bool wlive = wj0 < jb1;
    int64_t bs, be, ws = 0, we = 0, fs, fe;
    if (wlive) block_queries(a, wj0, wj1, &ws, &we);
    block_queries(a, jb0, jb1, &bs, &be);
    if (ds_t) bs -= bs % 16;
    queries_seeing_all(a, wj0, wj1, &fs, &fe);
    struct key_row {
        int64_t j, q0, q1;
        int32_t seg;
        bool live;
    } R[2];
    for (int i = 0; i < 2; i++) {
        R[i].j = wj0 + g + 8 * i;
        R[i].live = R[i].j < jb1;
        R[i].q0 = R[i].q1 = 0;
        if (R[i].live) query_range(a, R[i].j, &R[i].q0, &R[i].q1);
        R[i].seg = a.seg && R[i].live ? seg_at(seg, R[i].j, b) : 0;
    }
    const float sc2 = a.scale * LOG2E;

    uint32_t ka[ND][4], va[ND][4]; /* the warp's keys g, g + 8 of K and V as A fragments */
    const float *krow[2], *vrow[2];
    for (int i = 0; i < 2; i++) {
        krow[i] = R[i].live ? (const float *)(k.data + gh * k.nb[1] + R[i].j * k.nb[2] + b * k.nb[3]) : NULL;
        vrow[i] = R[i].live ? (const float *)(v.data + gh * v.nb[1] + R[i].j * v.nb[2] + b * v.nb[3]) : NULL;
    }
    frag_a_rows<ND>(ka, krow[0], krow[1], nd);
    frag_a_rows<ND>(va, vrow[0], vrow[1], nd);
    float dka[2 * ND][4], dva[2 * ND][4];
#pragma unroll
    for (int dn = 0; dn < 2 * ND; dn++)
        for (int e = 0; e < 4; e++) dka[dn][e] = dva[dn][e] = 0.0f;

    for (int64_t h = gh * a.group; h < (gh + 1) * a.group; h++)
        for (int64_t tt = bs; tt < be; tt += MMA_KEYS) {
            int64_t n = be - tt < MMA_KEYS ? be - tt : MMA_KEYS;
            __syncthreads(); /* the last tiles are read */
            stage_bf16<float>(Qs, ld, q, h, tt, n, MMA_KEYS, b, D, vec & 1);
            stage_bf16<float>(Os, ld, dO, h, tt, n, MMA_KEYS, b, D, vec & 8);
            stage_bf16_t<float>(Qt, ldt, q, h, tt, n, MMA_KEYS, b, D, vec & 1);
            stage_bf16_t<float>(Ot, ldt, dO, h, tt, n, MMA_KEYS, b, D, vec & 8);
            stage_lse_di(Ls, Ds, lse, Di, a, b, h, tt, n, MMA_KEYS);
            __syncthreads();
            if (!wlive || tt >= we || tt + n <= ws) continue;
            float s[8][4], dp[8][4]; /* query block nt: queries tt + 8 nt + 2 t4 + (e & 1) of keys g (e < 2), g + 8 */
#pragma unroll
            for (int nt = 0; nt < 8; nt++) {
                for (int e = 0; e < 4; e++) s[nt][e] = dp[nt][e] = 0.0f;
#pragma unroll
                for (int kk = 0; kk < ND; kk++)
                    if (kk < nd) {
                        uint32_t bq[2], bo[2];
                        frag_b_at(bq, Qs + (8 * nt + g) * ld + 16 * kk + 2 * t4);
                        frag_b_at(bo, Os + (8 * nt + g) * ld + 16 * kk + 2 * t4);
                        mma_bf16(s[nt], ka[kk], bq, s[nt]);
                        mma_bf16(dp[nt], va[kk], bo, dp[nt]);
                    }
            }
            const bool full = whole_tile(fs, fe, tt, MMA_KEYS);
            uint32_t pa[4][4], da[4][4]; /* P^T and dS^T as A fragments, queries 16 j.. */
#pragma unroll
            for (int nt = 0; nt < 8; nt++) {
                float p[4], ds[4];
                for (int e = 0; e < 4; e++) {
                    int col = 8 * nt + 2 * t4 + (e & 1);
                    float x = s[nt][e] * sc2, cc = 0.0f;
                    if (!full) {
                        const key_row &rw = R[e / 2];
                        int64_t tq = tt + col; /* past n: tq >= be >= q1 */
                        bool ok = rw.live && tq >= rw.q0 && tq < rw.q1 && (!a.seg || seg_at(seg, tq, b) == rw.seg);
                        x = ok ? score(a, s[nt][e], &cc) * LOG2E : -INFINITY;
                    }
                    p[e] = exp2f(x - Ls[col]);
                    ds[e] = ds_of(a, p[e], dp[nt][e], Ds[col], cc);
                }
                int j = nt / 2, hi = nt % 2;
                pa[j][2 * hi] = pack_bf16(p[0], p[1]);
                pa[j][2 * hi + 1] = pack_bf16(p[2], p[3]);
                da[j][2 * hi] = pack_bf16(ds[0], ds[1]);
                da[j][2 * hi + 1] = pack_bf16(ds[2], ds[3]);
                if (ds_t && tt + 8 * nt < ldT) /* tt, ldT multiples of 16 */
                    for (int i = 0; i < 2; i++)
                        if (R[i].live)
                            *(uint32_t *)(ds_t + ((b * a.Hq + h) * a.Tk + R[i].j) * ldT + tt + 8 * nt + 2 * t4) =
                                da[j][2 * hi + i];
            }
#pragma unroll
            for (int j = 0; j < 4; j++)
#pragma unroll
                for (int dn = 0; dn < 2 * ND; dn++)
                    if (dn < 2 * nd) {
                        uint32_t bo[2], bq[2];
                        frag_b_at(bo, Ot + (8 * dn + g) * ldt + 16 * j + 2 * t4);
                        frag_b_at(bq, Qt + (8 * dn + g) * ldt + 16 * j + 2 * t4);
                        mma_bf16(dva[dn], pa[j], bo, dva[dn]); /* dV += P^T dO */
                        mma_bf16(dka[dn], da[j], bq, dka[dn]); /* dK += dS^T Q */
                    }
        }
    for (int i = 0; i < 2; i++) {
        if (!R[i].live) continue;
        int64_t off = ((b * a.Tk + R[i].j) * a.Hkv + gh) * a.D;
#pragma unroll
        for (int dn = 0; dn < 2 * ND; dn++)
            if (dn < 2 * nd) {
                int c = 8 * dn + 2 * t4;
                dk[off + c] = a.scale * dka[dn][2 * i];
                dk[off + c + 1] = a.scale * dka[dn][2 * i + 1];
                dv[off + c] = dva[dn][2 * i];
                dv[off + c + 1] = dva[dn][2 * i + 1];
            }
    }
}

static size_t mma_back_smem(int64_t D) {
    return (2 * (size_t)MMA_KEYS * (D + 8) + 2 * (size_t)D * (MMA_KEYS + 8)) * 2 + 2 * MMA_KEYS * sizeof(float) + 32;
}

bool toy_cu_attn_tc_ok(const at &a, int k_type) {
    return a.D >= 16 && a.D <= 128 && a.D % 16 == 0 && (k_type == TOY_F32 || k_type == TOY_F16);
}

template <int ND, typename KT>
static void fwd_launch(unsigned blocks, cudaStream_t s, CT out, CT q, CT k, CT v, CT seg, at a, float *lse,
                       int variant) {
    int vec = rows_vec(q) | rows_vec(k) << 1 | rows_vec(v) << 2;
    if (variant == TOY_ATTN_TC_MMA)
        k_attn_fwd_mma<ND, KT><<<blocks, 32 * TC_WARPS, mma_smem(a.D), s>>>(out, q, k, v, seg, a, lse, vec);
    else
        k_attn_fwd_tc<ND, KT><<<blocks, 32 * TC_WARPS, tc_layout(a.D, false).total, s>>>(
            out, q, k, v, seg, a, lse, vec, variant == TOY_ATTN_TC_ONEPASS);
}

template <typename KT>
static void fwd_nd(unsigned blocks, cudaStream_t s, CT out, CT q, CT k, CT v, CT seg, at a, float *lse, int variant) {
    if (a.D <= 32) fwd_launch<2, KT>(blocks, s, out, q, k, v, seg, a, lse, variant);
    else if (a.D <= 64) fwd_launch<4, KT>(blocks, s, out, q, k, v, seg, a, lse, variant);
    else fwd_launch<8, KT>(blocks, s, out, q, k, v, seg, a, lse, variant);
}

void toy_cu_attn_tc_fwd(CT out, CT q, CT k, CT v, CT seg, at a, float *lse, int variant, cudaStream_t s) {
    unsigned blocks = (unsigned)(cdiv(a.Tq, TC_ROWS) * a.Hq * a.B);
    if (k.type == TOY_F16) fwd_nd<__half>(blocks, s, out, q, k, v, seg, a, lse, variant);
    else fwd_nd<float>(blocks, s, out, q, k, v, seg, a, lse, variant);
}

/* with ds_t, dK/dV first (storing dS), then dQ from it; else dQ
 * recomputes dS. mma: dK/dV on mma.sync (head dims up to 64) */
template <int ND>
static void back_launch(float *dq, float *dk, float *dv, CT dO, CT q, CT k, CT v, CT seg, at a, const float *lse,
                        const float *Di, bf16 *ds_t, int64_t ldT, bool mma, cudaStream_t s) {
    size_t smem = tc_layout(a.D, true).total;
    int vec = rows_vec(q) | rows_vec(k) << 1 | rows_vec(v) << 2 | rows_vec(dO) << 3;
    unsigned qblocks = (unsigned)(cdiv(a.Tq, TC_ROWS) * a.Hq * a.B), kblocks = (unsigned)(cdiv(a.Tk, TC_ROWS) * a.Hkv * a.B);
    bool done = false;
    if constexpr (ND <= 4) /* past 64 its accumulators and fragments would spill */
        if (a.Tk > 0 && mma) {
            k_attn_dkv_mma<ND><<<kblocks, 32 * TC_WARPS, mma_back_smem(a.D), s>>>(dk, dv, dO, q, k, v, seg, a, lse, Di,
                                                                                vec, ds_t, ldT);
            done = true;
        }
    if (a.Tk > 0 && !done)
        k_attn_dkv_tc<ND><<<kblocks, 32 * TC_WARPS, smem, s>>>(dk, dv, dO, q, k, v, seg, a, lse, Di, vec, ds_t, ldT);
    if (ds_t)
        k_attn_dq_ds_tc<ND><<<qblocks, 32 * TC_WARPS, tc_layout(a.D, false).total, s>>>(dq, k, seg, a, ds_t, ldT, vec);
    else
        k_attn_dq_tc<ND><<<qblocks, 32 * TC_WARPS, smem, s>>>(dq, dO, q, k, v, seg, a, lse, Di, vec);
}

void toy_cu_attn_tc_back(float *dq, float *dk, float *dv, CT dO, CT q, CT k, CT v, CT seg, at a, const float *lse,
                         const float *Di, void *ds_t, int64_t ldT, bool mma, cudaStream_t s) {
    bf16 *d = (bf16 *)ds_t;
    if (a.D <= 32) back_launch<2>(dq, dk, dv, dO, q, k, v, seg, a, lse, Di, d, ldT, mma, s);
    else if (a.D <= 64) back_launch<4>(dq, dk, dv, dO, q, k, v, seg, a, lse, Di, d, ldT, mma, s);
    else back_launch<8>(dq, dk, dv, dO, q, k, v, seg, a, lse, Di, d, ldT, mma, s);
}
