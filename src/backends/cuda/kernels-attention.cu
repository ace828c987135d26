/* kernels-attention.cu: fused scaled-dot-product attention on CUDA, forward
 * and backward (semantics of src/backends/cpu/attention.c).
 *
 * q {D, Hq, Tq, B}, k, v {D, Hkv, Tk, B} (F32, or an F16 KV cache), out like
 * q, contiguous, with lse = log-sum-exp of every query row (B, Tq, Hq) in
 * its aux bytes. Query head h reads kv head h / (Hq / Hkv). Causal: query t
 * sees keys j <= t + (Tk - Tq); a window W drops keys j <= t + (Tk - Tq) - W;
 * softcap c: s -> c tanh(s / c); packed documents: with segment ids
 * (op_params[AT_SEG], I32 {T, B}) query t of row b sees key j only when
 * seg[b][j] == seg[b][t]. Cached attention: Tk = n_past + Tq, n_past read
 * by the kernels from the device (so a captured decode graph replays).
 *
 * Forward: one warp per query row; each lane holds D/32 elements of q and
 * of the output accumulator; keys stream once with an online softmax (the
 * flash-attention recurrence), so the Tq x Tk matrix never exists.
 * Backward recomputes P from lse:
 *   Di = rowsum(dO O);  ds = p (dO.v - Di) (times the softcap derivative);
 *   dQ = scale sum_j ds k_j   (a warp per query row),
 *   dK = scale sum_t ds q_t, dV = sum_t p dO_t   (a warp per key row, over
 *   every query head of its group) -- every output has one writer, no
 *   atomics, deterministic.
 * Head dims up to 256; the forward also takes wider heads, up to 576
 * (DeepSeek's latent attention: 512 + 64), on the one-warp-per-row and
 * split kernels with more registers a lane (WIDE_DPL). The kernels used by
 * default are the tiled versions
 * further down (blocks of rows share K/V or Q/dO tiles in shared memory);
 * the one-warp-per-row kernels right below are their reference
 * (TOY_CUDA_ATTN=simple). All are SIMT FP32. With BF16 math the tensor-core
 * kernels of kernels-attention-tc.cu take head dims 16..128 (multiples of 16).
 */
#include "backends/cuda/attention.cuh"

#define MAX_DPL 8      /* elements per lane: head dim <= 256 */
#define WIDE_DPL 18    /* the forward's wide heads: head dim <= 576 */
#define WARPS 4

/* row t of head h, batch b of x (rows contiguous, element type T) into
 * registers: lane l holds elements l, l + 32, ... */
template <typename T, int DPL = MAX_DPL>
__device__ __forceinline__ void load_row(const CT &x, int64_t h, int64_t t, int64_t b, int64_t D, float *r) {
    const T *row = (const T *)(x.data + h * x.nb[1] + t * x.nb[2] + b * x.nb[3]);
    int lane = threadIdx.x % 32;
#pragma unroll
    for (int i = 0; i < DPL; i++) {
        int64_t d = lane + 32 * i;
        r[i] = d < D ? to_f(row[d]) : 0.0f;
    }
}

template <int DPL = MAX_DPL>
__device__ __forceinline__ float dot_row(const float *r, const float *s) {
    float acc = 0.0f;
#pragma unroll
    for (int i = 0; i < DPL; i++) acc += r[i] * s[i];
    return warp_sum(acc);
}

template <typename KT, int DPL = MAX_DPL>
__global__ void k_attn_fwd(CT out, CT q, CT k, CT v, CT seg, at a, float *lse) {
    at_dyn(a);
    int64_t row = blockIdx.x * (int64_t)WARPS + threadIdx.x / 32; /* (b, t, h) in out order */
    if (row >= a.B * a.Tq * a.Hq) return;
    int64_t h = row % a.Hq, t = (row / a.Hq) % a.Tq, b = row / (a.Hq * a.Tq), g = h / a.group;
    int lane = threadIdx.x % 32;
    float qr[DPL], kr[DPL], o[DPL];
    load_row<float, DPL>(q, h, t, b, a.D, qr);
#pragma unroll
    for (int i = 0; i < DPL; i++) o[i] = 0.0f;
    int64_t j0, j1;
    key_range(a, t, &j0, &j1);
    int32_t my_seg = a.seg ? seg_at(seg, t, b) : 0;
    float m = -INFINITY, l = 0.0f;
    for (int64_t j = j0; j < j1; j++) {
        if (a.seg && seg_at(seg, j, b) != my_seg) continue;
        load_row<KT, DPL>(k, g, j, b, a.D, kr);
        float c;
        float s = score(a, dot_row<DPL>(qr, kr), &c);
        float mn = fmaxf(m, s);
        float corr = expf(m - mn), p = expf(s - mn);
        l = l * corr + p;
        load_row<KT, DPL>(v, g, j, b, a.D, kr);
#pragma unroll
        for (int i = 0; i < DPL; i++) o[i] = o[i] * corr + p * kr[i];
        m = mn;
    }
    float *orow = (float *)(out.data + h * out.nb[1] + t * out.nb[2] + b * out.nb[3]);
    float inv = l > 0 ? 1.0f / l : 0.0f;
#pragma unroll
    for (int i = 0; i < DPL; i++) {
        int64_t d = lane + 32 * i;
        if (d < a.D) orow[d] = o[i] * inv;
    }
    if (lane == 0) lse[(b * a.Tq + t) * a.Hq + h] = l > 0 ? m + logf(l) : -INFINITY;
}

/* Di = rowsum(dO O) per query row */
__global__ void k_attn_di(float *Di, CT dO, CT o, at a) {
    int64_t row = blockIdx.x * (int64_t)WARPS + threadIdx.x / 32;
    if (row >= a.B * a.Tq * a.Hq) return;
    int64_t h = row % a.Hq, t = (row / a.Hq) % a.Tq, b = row / (a.Hq * a.Tq);
    float x[MAX_DPL], y[MAX_DPL];
    load_row<float>(dO, h, t, b, a.D, x);
    load_row<float>(o, h, t, b, a.D, y);
    float d = dot_row(x, y);
    if (threadIdx.x % 32 == 0) Di[(b * a.Tq + t) * a.Hq + h] = d;
}

template <typename KT>
__global__ void k_attn_dq(float *dq, CT dO, CT q, CT k, CT v, CT seg, at a, const float *lse, const float *Di) {
    int64_t row = blockIdx.x * (int64_t)WARPS + threadIdx.x / 32;
    if (row >= a.B * a.Tq * a.Hq) return;
    int64_t h = row % a.Hq, t = (row / a.Hq) % a.Tq, b = row / (a.Hq * a.Tq), g = h / a.group;
    int lane = threadIdx.x % 32;
    float qr[MAX_DPL], dor[MAX_DPL], kr[MAX_DPL], vr[MAX_DPL], acc[MAX_DPL];
    load_row<float>(q, h, t, b, a.D, qr);
    load_row<float>(dO, h, t, b, a.D, dor);
#pragma unroll
    for (int i = 0; i < MAX_DPL; i++) acc[i] = 0.0f;
    int64_t ri = (b * a.Tq + t) * a.Hq + h;
    float L = lse[ri], di = Di[ri];
    int64_t j0, j1;
    key_range(a, t, &j0, &j1);
    int32_t my_seg = a.seg ? seg_at(seg, t, b) : 0;
    if (L != -INFINITY)
        for (int64_t j = j0; j < j1; j++) {
            if (a.seg && seg_at(seg, j, b) != my_seg) continue;
            load_row<KT>(k, g, j, b, a.D, kr);
            load_row<KT>(v, g, j, b, a.D, vr);
            float c = 0;
            float s = score(a, dot_row(qr, kr), &c);
            float p = expf(s - L);
            float ds = ds_of(a, p, dot_row(dor, vr), di, c);
#pragma unroll
            for (int i = 0; i < MAX_DPL; i++) acc[i] += ds * kr[i];
        }
    float *out = dq + ((b * a.Tq + t) * a.Hq + h) * a.D;
#pragma unroll
    for (int i = 0; i < MAX_DPL; i++) {
        int64_t d = lane + 32 * i;
        if (d < a.D) out[d] = a.scale * acc[i];
    }
}

template <typename KT>
__global__ void k_attn_dkv(float *dk, float *dv, CT dO, CT q, CT k, CT v, CT seg, at a, const float *lse,
                           const float *Di) {
    int64_t row = blockIdx.x * (int64_t)WARPS + threadIdx.x / 32; /* (b, j, g) */
    if (row >= a.B * a.Tk * a.Hkv) return;
    int64_t g = row % a.Hkv, j = (row / a.Hkv) % a.Tk, b = row / (a.Hkv * a.Tk);
    int lane = threadIdx.x % 32;
    float kr[MAX_DPL], vr[MAX_DPL], qr[MAX_DPL], dor[MAX_DPL], dka[MAX_DPL], dva[MAX_DPL];
    load_row<KT>(k, g, j, b, a.D, kr);
    load_row<KT>(v, g, j, b, a.D, vr);
#pragma unroll
    for (int i = 0; i < MAX_DPL; i++) dka[i] = dva[i] = 0.0f;
    int64_t t0, t1;
    query_range(a, j, &t0, &t1);
    int32_t key_seg = a.seg ? seg_at(seg, j, b) : 0;
    for (int64_t t = t0; t < t1; t++) {
        if (a.seg && seg_at(seg, t, b) != key_seg) continue;
        for (int64_t h = g * a.group; h < (g + 1) * a.group; h++) {
            int64_t ri = (b * a.Tq + t) * a.Hq + h;
            float L = lse[ri];
            if (L == -INFINITY) continue;
            load_row<float>(q, h, t, b, a.D, qr);
            load_row<float>(dO, h, t, b, a.D, dor);
            float c = 0;
            float s = score(a, dot_row(qr, kr), &c);
            float p = expf(s - L);
            float ds = ds_of(a, p, dot_row(dor, vr), Di[ri], c);
#pragma unroll
            for (int i = 0; i < MAX_DPL; i++) {
                dva[i] += p * dor[i];
                dka[i] += ds * qr[i];
            }
        }
    }
    int64_t base = ((b * a.Tk + j) * a.Hkv + g) * a.D;
#pragma unroll
    for (int i = 0; i < MAX_DPL; i++) {
        int64_t d = lane + 32 * i;
        if (d < a.D) {
            dk[base + d] = a.scale * dka[i];
            dv[base + d] = dva[i];
        }
    }
}

/* ---- tiled kernels ---------------------------------------------------------------------------
 * The same arithmetic as the kernels above, with the rows that several warps
 * need staged in shared memory: a block of TW warps takes TW consecutive
 * query rows of one (batch, head) (forward, dQ) or TW consecutive key rows of
 * one (batch, kv head) (dK, dV) and walks the other side in tiles of NT rows
 * that it loads once for all its warps, so K/V (Q/dO) traffic drops by TW.
 * TOY_CUDA_ATTN=simple selects the one-warp-per-row kernels above (the
 * reference when a tiled result is in doubt). */

#define TW 8

static int tile_rows(int64_t D) { return D <= 64 ? 64 : D <= 128 ? 32 : 16; }

/* rows [r0, r0 + n) of head h of x (rows contiguous, type T) into smem as f32 (n x D) */
template <typename T>
__device__ __forceinline__ void stage_rows(float *dst, const CT &x, int64_t h, int64_t r0, int64_t n, int64_t b,
                                           int64_t D) {
    for (int64_t e = threadIdx.x; e < n * D; e += blockDim.x) {
        int64_t r = e / D, d = e % D;
        const T *row = (const T *)(x.data + h * x.nb[1] + (r0 + r) * x.nb[2] + b * x.nb[3]);
        dst[e] = to_f(row[d]);
    }
}

/* r (registers) . a staged row of Dp = 32 dpl floats */
__device__ __forceinline__ float dot_smem(const float *r, const float *srow, int dpl) {
    int lane = threadIdx.x % 32;
    float acc = 0.0f;
#pragma unroll
    for (int i = 0; i < MAX_DPL; i++)
        if (i < dpl) acc += r[i] * srow[lane + 32 * i];
    return warp_sum(acc);
}

/* blocks: (query tile, head, batch); smem: K and V tiles, NT x Dp each
 * (Dp: D rounded up to 32, the padding columns zero) */
template <typename KT>
__global__ void k_attn_fwd_tiled(CT out, CT q, CT k, CT v, CT seg, at a, float *lse, int nt) {
    at_dyn(a);
    extern __shared__ float sm[];
    const int dpl = (int)cdiv(a.D, 32);
    const int64_t Dp = 32 * dpl;
    float *Ks = sm, *Vs = sm + nt * Dp;
    int64_t nqt = cdiv(a.Tq, TW);
    int64_t qt = blockIdx.x % nqt, h = (blockIdx.x / nqt) % a.Hq, b = blockIdx.x / (nqt * a.Hq), g = h / a.group;
    int w = threadIdx.x / 32, lane = threadIdx.x % 32;
    int64_t t0 = qt * TW, t1 = t0 + TW < a.Tq ? t0 + TW : a.Tq, t = t0 + w;
    bool live = t < t1;
    float qr[MAX_DPL], o[MAX_DPL];
    if (live) load_row<float>(q, h, t, b, a.D, qr);
#pragma unroll
    for (int i = 0; i < MAX_DPL; i++) o[i] = 0.0f;
    int64_t j0 = 0, j1 = 0, js, je;
    if (live) key_range(a, t, &j0, &j1);
    block_keys(a, t0, t1, &js, &je);
    int32_t my_seg = a.seg && live ? seg_at(seg, t, b) : 0;
    float m = -INFINITY, l = 0.0f;
    for (int i = threadIdx.x; i < 2 * nt * Dp; i += blockDim.x) sm[i] = 0.0f; /* padding columns stay 0 */
    for (int64_t jt = js; jt < je; jt += nt) {
        int64_t n = je - jt < nt ? je - jt : nt;
        __syncthreads();
        for (int64_t e = threadIdx.x; e < n * a.D; e += blockDim.x) {
            int64_t r = e / a.D, d = e % a.D;
            Ks[r * Dp + d] = to_f(((const KT *)(k.data + g * k.nb[1] + (jt + r) * k.nb[2] + b * k.nb[3]))[d]);
            Vs[r * Dp + d] = to_f(((const KT *)(v.data + g * v.nb[1] + (jt + r) * v.nb[2] + b * v.nb[3]))[d]);
        }
        __syncthreads();
        if (!live) continue;
        int64_t lo = j0 > jt ? j0 : jt, hi = j1 < jt + n ? j1 : jt + n;
        for (int64_t j = lo; j < hi; j++) {
            if (a.seg && seg_at(seg, j, b) != my_seg) continue;
            float c;
            float s = score(a, dot_smem(qr, Ks + (j - jt) * Dp, dpl), &c);
            float mn = fmaxf(m, s);
            float corr = expf(m - mn), p = expf(s - mn);
            l = l * corr + p;
            const float *vr = Vs + (j - jt) * Dp;
#pragma unroll
            for (int i = 0; i < MAX_DPL; i++)
                if (i < dpl) o[i] = o[i] * corr + p * vr[lane + 32 * i];
            m = mn;
        }
    }
    if (!live) return;
    float *orow = (float *)(out.data + h * out.nb[1] + t * out.nb[2] + b * out.nb[3]);
    float inv = l > 0 ? 1.0f / l : 0.0f;
#pragma unroll
    for (int i = 0; i < MAX_DPL; i++) {
        int64_t d = lane + 32 * i;
        if (d < a.D) orow[d] = o[i] * inv;
    }
    if (lane == 0) lse[(b * a.Tq + t) * a.Hq + h] = l > 0 ? m + logf(l) : -INFINITY;
}

template <typename KT>
__global__ void k_attn_dq_tiled(float *dq, CT dO, CT q, CT k, CT v, CT seg, at a, const float *lse, const float *Di,
                                int nt) {
    extern __shared__ float sm[];
    const int dpl = (int)cdiv(a.D, 32);
    const int64_t Dp = 32 * dpl;
    float *Ks = sm, *Vs = sm + nt * Dp;
    int64_t nqt = cdiv(a.Tq, TW);
    int64_t qt = blockIdx.x % nqt, h = (blockIdx.x / nqt) % a.Hq, b = blockIdx.x / (nqt * a.Hq), g = h / a.group;
    int w = threadIdx.x / 32, lane = threadIdx.x % 32;
    int64_t t0 = qt * TW, t1 = t0 + TW < a.Tq ? t0 + TW : a.Tq, t = t0 + w;
    bool live = t < t1;
    float qr[MAX_DPL], dor[MAX_DPL], acc[MAX_DPL];
#pragma unroll
    for (int i = 0; i < MAX_DPL; i++) acc[i] = 0.0f;
    float L = -INFINITY, di = 0.0f;
    int64_t j0 = 0, j1 = 0, js, je;
    if (live) {
        load_row<float>(q, h, t, b, a.D, qr);
        load_row<float>(dO, h, t, b, a.D, dor);
        int64_t ri = (b * a.Tq + t) * a.Hq + h;
        L = lse[ri];
        di = Di[ri];
        key_range(a, t, &j0, &j1);
    }
    block_keys(a, t0, t1, &js, &je);
    int32_t my_seg = a.seg && live ? seg_at(seg, t, b) : 0;
    for (int i = threadIdx.x; i < 2 * nt * Dp; i += blockDim.x) sm[i] = 0.0f;
    for (int64_t jt = js; jt < je; jt += nt) {
        int64_t n = je - jt < nt ? je - jt : nt;
        __syncthreads();
        for (int64_t e = threadIdx.x; e < n * a.D; e += blockDim.x) {
            int64_t r = e / a.D, d = e % a.D;
            Ks[r * Dp + d] = to_f(((const KT *)(k.data + g * k.nb[1] + (jt + r) * k.nb[2] + b * k.nb[3]))[d]);
            Vs[r * Dp + d] = to_f(((const KT *)(v.data + g * v.nb[1] + (jt + r) * v.nb[2] + b * v.nb[3]))[d]);
        }
        __syncthreads();
        if (!live || L == -INFINITY) continue;
        int64_t lo = j0 > jt ? j0 : jt, hi = j1 < jt + n ? j1 : jt + n;
        for (int64_t j = lo; j < hi; j++) {
            if (a.seg && seg_at(seg, j, b) != my_seg) continue;
            const float *kr = Ks + (j - jt) * Dp;
            float c = 0;
            float s = score(a, dot_smem(qr, kr, dpl), &c);
            float p = expf(s - L);
            float ds = ds_of(a, p, dot_smem(dor, Vs + (j - jt) * Dp, dpl), di, c);
#pragma unroll
            for (int i = 0; i < MAX_DPL; i++)
                if (i < dpl) acc[i] += ds * kr[lane + 32 * i];
        }
    }
    if (!live) return;
    float *outp = dq + ((b * a.Tq + t) * a.Hq + h) * a.D;
#pragma unroll
    for (int i = 0; i < MAX_DPL; i++) {
        int64_t d = lane + 32 * i;
        if (d < a.D) outp[d] = a.scale * acc[i];
    }
}

/* blocks: (key tile, kv head, batch); smem: Q and dO tiles of one query
 * head, NT x Dp each, and their lse and Di */
template <typename KT>
__global__ void k_attn_dkv_tiled(float *dk, float *dv, CT dO, CT q, CT k, CT v, CT seg, at a, const float *lse,
                                 const float *Di, int nt) {
    extern __shared__ float sm[];
    const int dpl = (int)cdiv(a.D, 32);
    const int64_t Dp = 32 * dpl;
    float *Qs = sm, *Os = sm + nt * Dp, *Ls = Os + nt * Dp, *Ds = Ls + nt;
    int64_t nkt = cdiv(a.Tk, TW);
    int64_t kt = blockIdx.x % nkt, g = (blockIdx.x / nkt) % a.Hkv, b = blockIdx.x / (nkt * a.Hkv);
    int w = threadIdx.x / 32, lane = threadIdx.x % 32;
    int64_t jb0 = kt * TW, jb1 = jb0 + TW < a.Tk ? jb0 + TW : a.Tk, j = jb0 + w;
    bool live = j < jb1;
    float kr[MAX_DPL], vr[MAX_DPL], dka[MAX_DPL], dva[MAX_DPL];
#pragma unroll
    for (int i = 0; i < MAX_DPL; i++) dka[i] = dva[i] = 0.0f;
    int64_t q0 = 0, q1 = 0, bs, be;
    int32_t key_seg = 0;
    if (live) {
        load_row<KT>(k, g, j, b, a.D, kr);
        load_row<KT>(v, g, j, b, a.D, vr);
        query_range(a, j, &q0, &q1);
        if (a.seg) key_seg = seg_at(seg, j, b);
    }
    block_queries(a, jb0, jb1, &bs, &be); /* the union over the block's keys */
    for (int i = threadIdx.x; i < 2 * nt * Dp; i += blockDim.x) sm[i] = 0.0f;
    for (int64_t h = g * a.group; h < (g + 1) * a.group; h++)
        for (int64_t tt = bs; tt < be; tt += nt) {
            int64_t n = be - tt < nt ? be - tt : nt;
            __syncthreads();
            for (int64_t e = threadIdx.x; e < n * a.D; e += blockDim.x) {
                int64_t r = e / a.D, d = e % a.D;
                Qs[r * Dp + d] = ((const float *)(q.data + h * q.nb[1] + (tt + r) * q.nb[2] + b * q.nb[3]))[d];
                Os[r * Dp + d] = ((const float *)(dO.data + h * dO.nb[1] + (tt + r) * dO.nb[2] + b * dO.nb[3]))[d];
            }
            for (int64_t r = threadIdx.x; r < n; r += blockDim.x) {
                int64_t ri = (b * a.Tq + tt + r) * a.Hq + h;
                Ls[r] = lse[ri];
                Ds[r] = Di[ri];
            }
            __syncthreads();
            if (!live) continue;
            int64_t lo = q0 > tt ? q0 : tt, hi = q1 < tt + n ? q1 : tt + n;
            for (int64_t t = lo; t < hi; t++) {
                int64_t r = t - tt;
                if (Ls[r] == -INFINITY) continue;
                if (a.seg && seg_at(seg, t, b) != key_seg) continue;
                const float *qrow = Qs + r * Dp, *orow = Os + r * Dp;
                float c = 0;
                float s = score(a, dot_smem(kr, qrow, dpl), &c);
                float p = expf(s - Ls[r]);
                float ds = ds_of(a, p, dot_smem(vr, orow, dpl), Ds[r], c);
#pragma unroll
                for (int i = 0; i < MAX_DPL; i++)
                    if (i < dpl) {
                        dva[i] += p * orow[lane + 32 * i];
                        dka[i] += ds * qrow[lane + 32 * i];
                    }
            }
        }
    if (!live) return;
    int64_t base = ((b * a.Tk + j) * a.Hkv + g) * a.D;
#pragma unroll
    for (int i = 0; i < MAX_DPL; i++) {
        int64_t d = lane + 32 * i;
        if (d < a.D) {
            dk[base + d] = a.scale * dka[i];
            dv[base + d] = dva[i];
        }
    }
}

/* TOY_CUDA_ATTN=simple: the one-warp-per-row kernels; =simt: the tiled F32
 * kernels even where the tensor-core ones apply; =twopass: the tensor-core
 * forward in two passes, =mma: on mma.sync (kernels-attention-tc.cu);
 * default: tiled, or tensor cores when the math is BF16 */
enum { ATTN_AUTO, ATTN_SIMPLE, ATTN_SIMT, ATTN_TWOPASS, ATTN_MMA };
static int attn_mode(void) {
    static int mode = -1;
    if (mode < 0) {
        const char *e = getenv("TOY_CUDA_ATTN");
        mode = e && !strcmp(e, "simple")    ? ATTN_SIMPLE
               : e && !strcmp(e, "simt")    ? ATTN_SIMT
               : e && !strcmp(e, "twopass") ? ATTN_TWOPASS
               : e && !strcmp(e, "mma")     ? ATTN_MMA
                                            : ATTN_AUTO;
    }
    return mode;
}
static bool use_simple(void) { return attn_mode() == ATTN_SIMPLE; }
static bool use_tc(const struct toy_cu_node *n, const at &a, int k_type) {
    return (attn_mode() == ATTN_AUTO || attn_mode() == ATTN_TWOPASS || attn_mode() == ATTN_MMA) &&
           n->math == TOY_CU_MATH_BF16 &&
           toy_cu_attn_tc_ok(a, k_type);
}

/* ---- split-key decode (flash-decoding) -------------------------------------------------------
 * Cached attention with few query rows (decode) has too few rows to fill
 * the GPU, and each row walks the whole cache alone. The keys are cut into
 * SPLITS chunks (sized on the device from this run's n_past); a warp per
 * (chunk, query row) keeps a partial (max, sum, output), and a second kernel
 * merges the chunks: M = max m_s, L = sum l_s e^(m_s - M),
 * O = sum o_s e^(m_s - M) / L, lse = M + log L. */

#define SPLITS 32
#define DECODE_ROWS 8 /* cached attention with at most this many query rows per head goes split */

/* keys [*c0, *c1) of chunk s of SPLITS over [0, Tk) */
__host__ __device__ __forceinline__ void split_chunk(int64_t Tk, int s, int64_t *c0, int64_t *c1) {
    int64_t per = (Tk + SPLITS - 1) / SPLITS;
    *c0 = (int64_t)s * per < Tk ? (int64_t)s * per : Tk;
    *c1 = *c0 + per < Tk ? *c0 + per : Tk;
}

template <typename KT, int DPL = MAX_DPL>
__global__ void k_attn_split(CT q, CT k, CT v, at a, float *part) {
    at_dyn(a);
    int64_t w = blockIdx.x * (int64_t)WARPS + threadIdx.x / 32; /* (s, row) with row = (b, t, h) */
    int64_t rows = a.B * a.Tq * a.Hq;
    if (w >= rows * SPLITS) return;
    int64_t row = w / SPLITS;
    int sidx = (int)(w % SPLITS);
    int64_t h = row % a.Hq, t = (row / a.Hq) % a.Tq, b = row / (a.Hq * a.Tq), g = h / a.group;
    int lane = threadIdx.x % 32;
    float qr[DPL], kr[DPL], o[DPL];
    load_row<float, DPL>(q, h, t, b, a.D, qr);
#pragma unroll
    for (int i = 0; i < DPL; i++) o[i] = 0.0f;
    int64_t j0, j1, c0, c1;
    key_range(a, t, &j0, &j1);
    split_chunk(a.Tk, sidx, &c0, &c1);
    if (c0 > j0) j0 = c0;
    if (c1 < j1) j1 = c1;
    float m = -INFINITY, l = 0.0f;
    for (int64_t j = j0; j < j1; j++) {
        load_row<KT, DPL>(k, g, j, b, a.D, kr);
        float c;
        float sc = score(a, dot_row<DPL>(qr, kr), &c);
        float mn = fmaxf(m, sc);
        float corr = expf(m - mn), p = expf(sc - mn);
        l = l * corr + p;
        load_row<KT, DPL>(v, g, j, b, a.D, kr);
#pragma unroll
        for (int i = 0; i < DPL; i++) o[i] = o[i] * corr + p * kr[i];
        m = mn;
    }
    float *pp = part + w * (a.D + 2); /* (m, l, o[D]) */
#pragma unroll
    for (int i = 0; i < DPL; i++) {
        int64_t d = lane + 32 * i;
        if (d < a.D) pp[2 + d] = o[i];
    }
    if (lane == 0) {
        pp[0] = m;
        pp[1] = l;
    }
}

template <int DPL = MAX_DPL>
__global__ void k_attn_merge(CT out, at a, const float *part, float *lse) {
    int64_t row = blockIdx.x * (int64_t)WARPS + threadIdx.x / 32;
    if (row >= a.B * a.Tq * a.Hq) return;
    int64_t h = row % a.Hq, t = (row / a.Hq) % a.Tq, b = row / (a.Hq * a.Tq);
    int lane = threadIdx.x % 32;
    const float *pr = part + row * SPLITS * (a.D + 2);
    float M = -INFINITY;
    for (int s = 0; s < SPLITS; s++) M = fmaxf(M, pr[s * (a.D + 2)]);
    float L = 0.0f, o[DPL];
#pragma unroll
    for (int i = 0; i < DPL; i++) o[i] = 0.0f;
    if (M != -INFINITY)
        for (int s = 0; s < SPLITS; s++) {
            const float *pp = pr + s * (a.D + 2);
            if (pp[0] == -INFINITY) continue; /* an empty chunk (its o is 0) */
            float f = expf(pp[0] - M);
            L += pp[1] * f;
#pragma unroll
            for (int i = 0; i < DPL; i++) {
                int64_t d = lane + 32 * i;
                if (d < a.D) o[i] += pp[2 + d] * f;
            }
        }
    float *orow = (float *)(out.data + h * out.nb[1] + t * out.nb[2] + b * out.nb[3]);
    float inv = L > 0 ? 1.0f / L : 0.0f;
#pragma unroll
    for (int i = 0; i < DPL; i++) {
        int64_t d = lane + 32 * i;
        if (d < a.D) orow[d] = o[i] * inv;
    }
    if (lane == 0) lse[(b * a.Tq + t) * a.Hq + h] = L > 0 ? M + logf(L) : -INFINITY;
}

static bool use_split(const struct toy_cu_node *n) {
    return n->op == TOY_OP_ATTENTION && n->op_params[P_AT_DYNKV] && !n->op_params[AT_SEG] &&
           n->src[0].ne[2] <= DECODE_ROWS;
}

/* The tensor-core backward stores dS (BF16, {ldT, Tk, Hq, B}) for dQ
 * rather than computing every score a second time, when it fits under
 * TOY_CUDA_ATTN_DS_MB (by default 1 GiB or a sixteenth of the device's
 * memory, whichever is less; 0: always recompute; GPT-2 at B 16, T 1024
 * needs 384 MiB). Returns its bytes, 0 when dQ recomputes. */
static double ds_cap(void) {
    const char *e = getenv("TOY_CUDA_ATTN_DS_MB");
    if (e && *e) return atof(e) * 1048576.0;
    static const double dflt = [] {
        size_t fr = 0, tot = 0;
        bool ok = cudaMemGetInfo(&fr, &tot) == cudaSuccess;
        if (!ok) cudaGetLastError();
        return ok ? fmin(1073741824.0, (double)tot / 16) : 0.0;
    }();
    return dflt;
}

static size_t ds_bytes(const struct toy_cu_node *n, const at &a, int64_t *ldT) {
    *ldT = (a.Tq + 15) / 16 * 16;
    if (n->op != TOY_OP_ATTENTION_BACK || !use_tc(n, a, n->src[2].type)) return 0;
    double bytes = 2.0 * (double)a.B * (double)a.Hq * (double)a.Tk * (double)*ldT;
    return bytes > 0 && bytes <= ds_cap() ? (size_t)bytes : 0;
}

/* the backward's work: Di (a float a query row), then dS when it is kept */
static size_t di_bytes(const at &a) { return ((size_t)(a.B * a.Tq * a.Hq) * sizeof(float) + 255) / 256 * 256; }

extern "C" size_t toy_cu_attention_work(const struct toy_cu_node *n, bool lean) {
    if (use_split(n)) {
        const CT &q = n->src[0];
        return (size_t)(q.ne[1] * q.ne[2] * q.ne[3]) * SPLITS * (size_t)(q.ne[0] + 2) * sizeof(float) + 256;
    }
    if (n->op != TOY_OP_ATTENTION_BACK) return 0;
    at a = at_shape(n, n->src[1], n->src[2]);
    int64_t ldT;
    return di_bytes(a) + (lean ? 0 : ds_bytes(n, a, &ldT));
}

static int check_shape(const at &a, const CT &q, const CT &k, const CT &v, char *msg, size_t msg_size,
                       int max_dpl = MAX_DPL) {
    if ((k.type != TOY_F32 && k.type != TOY_F16) || k.type != v.type || q.type != TOY_F32) {
        snprintf(msg, msg_size, "attention reads f32 q and f32 or f16 k, v");
        return TOY_ERR_UNSUPPORTED;
    }
    int64_t ek = k.type == TOY_F16 ? 2 : 4;
    if (q.nb[0] != 4 || k.nb[0] != ek || v.nb[0] != ek) {
        snprintf(msg, msg_size, "attention needs rows with contiguous elements");
        return TOY_ERR_UNSUPPORTED;
    }
    if (a.D > 32 * max_dpl) {
        snprintf(msg, msg_size, "head dim %lld is over the CUDA kernel's %d", (long long)a.D, 32 * max_dpl);
        return TOY_ERR_UNSUPPORTED;
    }
    return 0;
}

/* Attention sinks (gpt-oss; src[5]: one logit s_h a query head): every
 * kernel above normalises over the keys alone, and a sink is one more key
 * whose value is zero, so each row's output is the keys' part of the new
 * sum: o *= exp(lse - lse'), lse' = log(exp(lse) + exp(s_h)). A warp a row. */
__global__ void k_attn_sinks(CT out, at a, const float *sinks, float *lse) {
    int64_t r = (int64_t)blockIdx.x * WARPS + threadIdx.x / 32; /* (b * Tq + t) * Hq + h */
    if (r >= a.B * a.Tq * a.Hq) return;
    int64_t h = r % a.Hq, t = (r / a.Hq) % a.Tq, b = r / (a.Hq * a.Tq);
    float L = lse[r], s = sinks[h], M = fmaxf(L, s);
    float L2 = M + logf(expf(L - M) + expf(s - M)); /* L = -inf (no key): the sink alone, o stays 0 */
    float f = L == -INFINITY ? 0.0f : expf(L - L2);
    float *o = (float *)(out.data + h * out.nb[1] + t * out.nb[2] + b * out.nb[3]);
    for (int64_t d = threadIdx.x % 32; d < a.D; d += 32) o[d] *= f;
    __syncwarp();
    if (threadIdx.x % 32 == 0) lse[r] = L2;
}

/* ATTN_SINKS_BACK (dO, the forward ATTENTION, the sinks): d s_h = -sum over
 * the rows of head h of exp(s_h - lse) rowsum(dO O); a block a head. */
__global__ void k_attn_sinks_back(float *ds, CT dO, CT o, at a, const float *sinks, const float *lse) {
    int64_t h = blockIdx.x, rows = a.B * a.Tq;
    float acc = 0.0f;
    for (int64_t r = threadIdx.x / 32; r < rows; r += WARPS) {
        int64_t t = r % a.Tq, b = r / a.Tq;
        const float *y = (const float *)(o.data + h * o.nb[1] + t * o.nb[2] + b * o.nb[3]);
        const float *g = (const float *)(dO.data + h * dO.nb[1] + t * dO.nb[2] + b * dO.nb[3]);
        float di = 0.0f;
        for (int64_t d = threadIdx.x % 32; d < a.D; d += 32) di += y[d] * g[d];
        di = warp_sum(di);
        acc += expf(sinks[h] - lse[r * a.Hq + h]) * di;
    }
    __shared__ float part[WARPS];
    if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        float sum = 0.0f;
        for (int w = 0; w < WARPS; w++) sum += part[w];
        ds[h] = -sum;
    }
}

extern "C" int toy_cu_attn_sinks_back(const struct toy_cu_node *n, char *msg, size_t msg_size) {
    const CT &dO = n->src[0], &o = n->src[1];
    at a = {};
    a.D = o.ne[0], a.Hq = o.ne[1], a.Tq = o.ne[2], a.B = o.ne[3];
    const float *lse = (const float *)(o.data + o.ne[0] * o.ne[1] * o.ne[2] * o.ne[3] * 4);
    if (a.Hq) k_attn_sinks_back<<<(unsigned)a.Hq, 32 * WARPS, 0, CU_STREAM(n)>>>((float *)n->dst.data, dO, o, a,
                                                                                 (const float *)n->src[2].data, lse);
    return launch_status("attention sinks backward", msg, msg_size);
}

static int attention_fwd(const struct toy_cu_node *n, char *msg, size_t msg_size);

extern "C" int toy_cu_attention(const struct toy_cu_node *n, char *msg, size_t msg_size) {
    int rc = attention_fwd(n, msg, msg_size);
    if (rc || !n->has_src[5]) return rc;
    const CT &q = n->src[0], &k = n->src[1];
    at a = at_shape(n, q, k);
    int64_t rows = a.B * a.Tq * a.Hq;
    if (rows)
        k_attn_sinks<<<(unsigned)cdiv(rows, WARPS), 32 * WARPS, 0, CU_STREAM(n)>>>(
            n->dst, a, (const float *)n->src[5].data, (float *)(n->dst.data + n->dst_nbytes));
    return launch_status("attention sinks", msg, msg_size);
}

static int attention_fwd(const struct toy_cu_node *n, char *msg, size_t msg_size) {
    const CT &q = n->src[0], &k = n->src[1], &v = n->src[2];
    at a = at_shape(n, q, k);
    int rc = check_shape(a, q, k, v, msg, msg_size, WIDE_DPL);
    if (rc) return rc;
    CT seg = a.seg ? n->src[4] : CT{};
    float *lse = (float *)(n->dst.data + n->dst_nbytes);
    int64_t rows = a.B * a.Tq * a.Hq;
    if (n->op_params[P_AT_FUSED] && (rc = toy_cu_attention_prologue(n, msg, msg_size))) return rc;
    if (!rows) return 0;
    cudaStream_t s = CU_STREAM(n);
    if (a.D > 32 * MAX_DPL) { /* wide heads: the split kernels for decode, else a warp a row */
        bool f16 = k.type == TOY_F16;
        if (use_split(n)) {
            float *part = (float *)n->work;
            unsigned blocks = (unsigned)cdiv(rows * SPLITS, WARPS);
            if (f16) k_attn_split<__half, WIDE_DPL><<<blocks, 32 * WARPS, 0, s>>>(q, k, v, a, part);
            else k_attn_split<float, WIDE_DPL><<<blocks, 32 * WARPS, 0, s>>>(q, k, v, a, part);
            k_attn_merge<WIDE_DPL><<<(unsigned)cdiv(rows, WARPS), 32 * WARPS, 0, s>>>(n->dst, a, part, lse);
        } else if (f16) {
            k_attn_fwd<__half, WIDE_DPL><<<(unsigned)cdiv(rows, WARPS), 32 * WARPS, 0, s>>>(n->dst, q, k, v, seg, a, lse);
        } else {
            k_attn_fwd<float, WIDE_DPL><<<(unsigned)cdiv(rows, WARPS), 32 * WARPS, 0, s>>>(n->dst, q, k, v, seg, a, lse);
        }
        return launch_status("attention (wide heads)", msg, msg_size);
    }
    if (use_split(n) && !use_simple()) {
        float *part = (float *)n->work;
        unsigned blocks = (unsigned)cdiv(rows * SPLITS, WARPS);
        if (k.type == TOY_F16) k_attn_split<__half><<<blocks, 32 * WARPS, 0, s>>>(q, k, v, a, part);
        else k_attn_split<float><<<blocks, 32 * WARPS, 0, s>>>(q, k, v, a, part);
        k_attn_merge<<<(unsigned)cdiv(rows, WARPS), 32 * WARPS, 0, s>>>(n->dst, a, part, lse);
        return launch_status("attention (split keys)", msg, msg_size);
    }
    if (use_simple()) {
        if (k.type == TOY_F16)
            k_attn_fwd<__half><<<(unsigned)cdiv(rows, WARPS), 32 * WARPS, 0, s>>>(n->dst, q, k, v, seg, a, lse);
        else
            k_attn_fwd<float><<<(unsigned)cdiv(rows, WARPS), 32 * WARPS, 0, s>>>(n->dst, q, k, v, seg, a, lse);
        return launch_status("attention", msg, msg_size);
    }
    if (use_tc(n, a, k.type)) {
        int variant = attn_mode() == ATTN_TWOPASS ? TOY_ATTN_TC_TWOPASS
                      : attn_mode() == ATTN_MMA   ? TOY_ATTN_TC_MMA
                                                  : TOY_ATTN_TC_ONEPASS;
        toy_cu_attn_tc_fwd(n->dst, q, k, v, seg, a, lse, variant, s);
        return launch_status("attention (tensor cores)", msg, msg_size);
    }
    int nt = tile_rows(a.D);
    unsigned blocks = (unsigned)(cdiv(a.Tq, TW) * a.Hq * a.B);
    size_t smem = (size_t)2 * nt * 32 * cdiv(a.D, 32) * sizeof(float); /* <= 32 KiB */
    if (k.type == TOY_F16)
        k_attn_fwd_tiled<__half><<<blocks, 32 * TW, smem, s>>>(n->dst, q, k, v, seg, a, lse, nt);
    else
        k_attn_fwd_tiled<float><<<blocks, 32 * TW, smem, s>>>(n->dst, q, k, v, seg, a, lse, nt);
    return launch_status("attention", msg, msg_size);
}

extern "C" int toy_cu_attention_back(const struct toy_cu_node *n, char *msg, size_t msg_size) {
    const CT &dO = n->src[0], &q = n->src[1], &k = n->src[2], &v = n->src[3], &o = n->src[4];
    at a = at_shape(n, q, k);
    int rc = check_shape(a, q, k, v, msg, msg_size);
    if (rc) return rc;
    CT seg = a.seg ? n->src[5] : CT{};
    /* lse sits after the forward output's bytes (contiguous {D, Hq, Tq, B} f32) */
    const float *lse = (const float *)(o.data + o.ne[0] * o.ne[1] * o.ne[2] * o.ne[3] * 4);
    float *Di = (float *)n->work;
    float *dq = (float *)n->dst.data, *dk = dq + ct_nel(q), *dv = dk + ct_nel(k);
    int64_t rows = a.B * a.Tq * a.Hq, krows = a.B * a.Tk * a.Hkv;
    cudaStream_t s = CU_STREAM(n);
    if (!rows) return 0;
    k_attn_di<<<(unsigned)cdiv(rows, WARPS), 32 * WARPS, 0, s>>>(Di, dO, o, a);
    if (k.type != TOY_F32) {
        snprintf(msg, msg_size, "attention backward needs f32 k and v");
        return TOY_ERR_UNSUPPORTED;
    }
    if (use_simple()) {
        k_attn_dq<float><<<(unsigned)cdiv(rows, WARPS), 32 * WARPS, 0, s>>>(dq, dO, q, k, v, seg, a, lse, Di);
        if (krows)
            k_attn_dkv<float><<<(unsigned)cdiv(krows, WARPS), 32 * WARPS, 0, s>>>(dk, dv, dO, q, k, v, seg, a, lse, Di);
        return launch_status("attention backward", msg, msg_size);
    }
    if (use_tc(n, a, k.type)) {
        int64_t ldT;
        size_t ds = ds_bytes(n, a, &ldT);
        void *ds_t = ds && di_bytes(a) + ds <= n->work_size ? n->work + di_bytes(a) : NULL;
        toy_cu_attn_tc_back(dq, dk, dv, dO, q, k, v, seg, a, lse, Di, ds_t, ldT, attn_mode() == ATTN_MMA, s);
        return launch_status("attention backward (tensor cores)", msg, msg_size);
    }
    int nt = tile_rows(a.D);
    size_t smem = (size_t)2 * nt * 32 * cdiv(a.D, 32) * sizeof(float); /* <= 32 KiB */
    k_attn_dq_tiled<float><<<(unsigned)(cdiv(a.Tq, TW) * a.Hq * a.B), 32 * TW, smem, s>>>(dq, dO, q, k, v, seg, a, lse,
                                                                                          Di, nt);
    if (krows)
        k_attn_dkv_tiled<float><<<(unsigned)(cdiv(a.Tk, TW) * a.Hkv * a.B), 32 * TW, smem + 2 * nt * sizeof(float),
                                   s>>>(dk, dv, dO, q, k, v, seg, a, lse, Di, nt);
    return launch_status("attention backward", msg, msg_size);
}
