/* attention.cuh: what the attention kernels share (kernels-attention.cu:
 * the F32 SIMT kernels and the dispatch; kernels-attention-tc.cu: the
 * tensor-core kernels): the shape and masking rules, scores, and the
 * tensor-core entry points. */
#ifndef TOY_CUDA_ATTENTION_CUH
#define TOY_CUDA_ATTENTION_CUH

#include "backends/cuda/kernels-common.cuh"

#define AT_SEG P_AT_SEG

struct at {
    int64_t D, Hq, Hkv, Tq, Tk, B, group, off;
    float scale, cap;
    bool causal;
    int window;
    bool seg;
    const int32_t *np; /* cached attention: n_past on the device, else NULL */
};

/* cached attention: the key count of this run */
__device__ __forceinline__ void at_dyn(at &a) {
    if (!a.np) return;
    int64_t tk = (int64_t)*a.np + a.Tq;
    a.Tk = tk < a.Tk ? tk : a.Tk; /* a.Tk starts as the cache length */
    a.off = a.Tk - a.Tq;
}

static inline at at_shape(const struct toy_cu_node *n, const CT &q, const CT &k) {
    at a;
    a.D = q.ne[0];
    a.Hq = q.ne[1];
    a.Tq = q.ne[2];
    a.B = q.ne[3];
    a.Hkv = k.ne[1];
    a.Tk = k.ne[2]; /* cached: the cache length, cut to n_past + Tq in the kernel (at_dyn) */
    a.np = n->op_params[P_AT_DYNKV] ? (const int32_t *)n->src[3].data : NULL;
    a.group = a.Hq / a.Hkv;
    a.off = a.Tk - a.Tq;
    memcpy(&a.scale, &n->op_params[P_AT_SCALE], 4);
    memcpy(&a.cap, &n->op_params[P_AT_SOFTCAP], 4);
    a.causal = n->op_params[P_AT_CAUSAL];
    a.window = n->op_params[P_AT_WINDOW];
    a.seg = n->op_params[AT_SEG] != 0;
    return a;
}

__host__ __device__ __forceinline__ void key_range(const at &a, int64_t t, int64_t *j0, int64_t *j1) {
    *j0 = 0;
    *j1 = a.Tk;
    if (a.causal) {
        *j1 = t + a.off + 1;
        if (*j1 > a.Tk) *j1 = a.Tk;
        if (a.window > 0 && *j1 - a.window > 0) *j0 = *j1 - a.window;
        if (*j1 < 0) *j1 = 0;
    }
}

/* the queries [*t0, *t1) that see key j (the inverse of key_range):
 * t >= j - off when causal, and t < j - off + window with a window */
__host__ __device__ __forceinline__ void query_range(const at &a, int64_t j, int64_t *t0, int64_t *t1) {
    *t0 = 0;
    *t1 = a.Tq;
    if (a.causal) {
        *t0 = j - a.off > 0 ? j - a.off : 0;
        if (a.window > 0 && j - a.off + a.window < *t1) *t1 = j - a.off + a.window;
    }
}

/* the queries that see any key of [j0, j1), as one range */
__host__ __device__ __forceinline__ void block_queries(const at &a, int64_t j0, int64_t j1, int64_t *ts, int64_t *te) {
    int64_t s0, e0, s1, e1;
    query_range(a, j0, &s0, &e0);
    query_range(a, j1 - 1, &s1, &e1);
    *ts = s0 < s1 ? s0 : s1;
    *te = e0 > e1 ? e0 : e1;
}

__device__ __forceinline__ int32_t seg_at(const CT &seg, int64_t t, int64_t b) {
    return *(const int32_t *)(seg.data + t * seg.nb[0] + b * seg.nb[1]);
}

/* keys the block's queries t0..t1-1 see, as one range */
__host__ __device__ __forceinline__ void block_keys(const at &a, int64_t t0, int64_t t1, int64_t *js, int64_t *je) {
    int64_t s0, e0, s1, e1;
    key_range(a, t0, &s0, &e0);
    key_range(a, t1 - 1, &s1, &e1);
    *js = s0 < s1 ? s0 : s1;
    *je = e0 > e1 ? e0 : e1;
}

/* the score of a query against key j after scale and softcap; *c = s / cap */
__device__ __forceinline__ float score(const at &a, float raw, float *c) {
    float s = raw * a.scale;
    if (a.cap > 0) {
        *c = tanhf(s / a.cap);
        s = a.cap * *c;
    }
    return s;
}

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }

__device__ __forceinline__ float ds_of(const at &a, float p, float dp, float di, float c) {
    float ds = p * (dp - di);
    if (a.cap > 0) ds *= 1.0f - c * c;
    return ds;
}

/* Tensor-core attention (kernels-attention-tc.cu): BF16 operands, F32
 * accumulation, for head dims that are a multiple of 16 up to 128 and F32
 * q (k, v F32, or an F16 cache in the forward). */
bool toy_cu_attn_tc_ok(const at &a, int k_type);
/* the forward's variants: one pass over the keys (wmma, the default), two
 * (TOY_CUDA_ATTN=twopass), or on mma.sync with the scores in registers
 * (TOY_CUDA_ATTN=mma) */
enum { TOY_ATTN_TC_ONEPASS, TOY_ATTN_TC_TWOPASS, TOY_ATTN_TC_MMA };
void toy_cu_attn_tc_fwd(CT out, CT q, CT k, CT v, CT seg, at a, float *lse, int variant, cudaStream_t s);
/* ds_t: scratch for dS^T (BF16, {ldT, Tk, Hq, B}, ldT = Tq rounded up to
 * 16), so that dQ need not recompute the scores; NULL: it does. mma: dK/dV
 * on mma.sync where the head dim is at most 64 (TOY_CUDA_ATTN=mma) */
void toy_cu_attn_tc_back(float *dq, float *dk, float *dv, CT dO, CT q, CT k, CT v, CT seg, at a, const float *lse,
                         const float *Di, void *ds_t, int64_t ldT, bool mma, cudaStream_t s);

#endif
