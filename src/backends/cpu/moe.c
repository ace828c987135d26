/* moe.c: the mixture-of-experts kernels (toy_moe_route, toy_moe_matmul).
 *
 * MOE_ROUTE: per row of router logits, the experts' scores (the softmax
 * over the E experts, or each one's sigmoid), the k largest of the scores
 * plus the op's bias, if any (ties to the lower index), and their unbiased
 * scores as weights, renormalised when the op says so; ids into the result,
 * the weights after it (aux).
 *
 * MOE_MATMUL: the (token, slot) pairs are sorted by expert (a counting
 * sort every thread does for itself: k x N ids). Prefill: each thread owns
 * a range of output columns, the same for every expert, so it reads its
 * share of each chosen expert's matrix once per 64 of the expert's rows,
 * and an output element is written by one thread only: the combined sum
 * needs no second pass. Decode (at most 16 pairs): each thread takes whole
 * experts instead, one stream a matrix rather than a slice of each (a
 * short stream's start costs ~1.75 us a thread on 2 Zen 4 threads, and
 * halving the matrices doubled the starts); each pair's row goes to its
 * own place and the last thread out sums them. Either way a token's sum
 * adds its experts in id order, so the result does not depend on the
 * thread count. Packed weights (toy_tensor_pack of
 * a 3-d tensor: each expert's matrix packed in turn) run the int8 kernels
 * as a MATMUL's do; other dtypes run f32 rows (dequantized 32 at a time)
 * through sgemm. */
#include <math.h>
#include <string.h>

#include "backends/cpu/cpu-impl.h"
#include "backends/cpu/qdot.h"

#define MOE_MR 64  /* an expert's rows taken together */
#define MOE_NC 256 /* output columns a pass */
#define MOE_DQ 32  /* weight rows dequantized at a time (other dtypes) */
#define MOE_BYEXP_PAIRS 16 /* at most this many (token, slot) pairs (decode): threads take whole experts */

void toy_cpu_moe_route(struct toy_tensor *t, int ith, int nth, float *tmp) {
    const struct toy_tensor *lg = t->src[0];
    int64_t E = lg->ne[0], rows = t->ne[1], r0, r1;
    int k = t->op_params[P_MR_K];
    bool norm = t->op_params[P_MR_NORM], sigmoid = t->op_params[P_MR_SIGMOID];
    const float *bias = t->src[1] ? (const float *)t->src[1]->data : NULL;
    float *wts = (float *)((char *)t->data + toy_nbytes(t)), *choice = tmp + E;
    toy_split(rows, ith, nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        const float *x = (const float *)lg->data + r * E;
        float sum = 1;
        if (sigmoid) {
            for (int64_t e = 0; e < E; e++) tmp[e] = 1.0f / (1.0f + expf(-x[e]));
        } else {
            float mx = toy_vec.max(x, E);
            sum = toy_vec.exp_sum(tmp, x, mx, E);
        }
        int32_t *id = (int32_t *)t->data + r * k;
        float *w = wts + r * k, picked = 0;
        for (int64_t e = 0; e < E; e++) { /* a NaN logit: never above another, but an id all the same */
            if (!(tmp[e] >= 0)) tmp[e] = 0;
            choice[e] = bias ? tmp[e] / sum + bias[e] : tmp[e];
            if (isnan(choice[e])) choice[e] = -INFINITY;
        }
        for (int s = 0; s < k; s++) {
            int64_t best = -1;
            for (int64_t e = 0; e < E; e++) /* the largest not yet taken (taken ones are NaN) */
                if (!isnan(choice[e]) && (best < 0 || choice[e] > choice[best])) best = e;
            id[s] = (int32_t)best;
            w[s] = tmp[best] / sum;
            picked += w[s];
            choice[best] = NAN;
        }
        if (norm)
            for (int s = 0; s < k; s++) w[s] /= picked;
    }
}

struct moe_plan {
    int64_t E, k, N, K, n, R;
    int32_t *first; /* (E + 1) where each expert's pairs start in `pairs` */
    int32_t *pairs; /* (k N) token * k + slot, sorted by expert, then token */
    float *a;       /* (MOE_MR x K) gathered rows */
    float *c;       /* (MOE_MR x MOE_NC) products */
    float *deq;     /* (MOE_DQ x K) dequantized weight rows */
    void *q;        /* the int8 kernels' scratch for MOE_MR rows */
    float *pack;    /* toy's sgemm's panel scratch, or NULL */
};

static size_t al64(size_t b) { return (b + 63) / 64 * 64; }

static bool moe_packed(const struct toy_tensor *w) { return w->packed && toy_qdot.qgemm_packed; }

/* a product the autodiff differentiates runs on f32 activations: no int8 */
static bool moe_int8(const struct toy_tensor *t) { return moe_packed(t->src[1]) && !t->op_params[P_MOE_EXACT]; }

/* one thread's scratch: the plan's arrays one after another */
static size_t moe_scratch(const struct toy_tensor *t, struct moe_plan *p, char *base) {
    const struct toy_tensor *x = t->src[0], *w = t->src[1], *route = t->src[2];
    int64_t E = w->ne[2], k = route->ne[0], N = route->ne[1], K = x->ne[0];
    size_t off = 0;
#define TAKE(field, type, bytes)                                   \
    do {                                                           \
        if (p) p->field = base ? (type)(void *)(base + off) : NULL; \
        off += al64(bytes);                                        \
    } while (0)
    TAKE(first, int32_t *, (size_t)(E + 1) * sizeof(int32_t));
    TAKE(pairs, int32_t *, (size_t)(k * N) * sizeof(int32_t));
    TAKE(a, float *, (size_t)(MOE_MR * K) * sizeof(float));
    TAKE(c, float *, (size_t)(MOE_MR * MOE_NC) * sizeof(float));
    /* then either path's scratch, room for the larger: the weights may be
     * packed (or unpacked) after the graph was planned */
    size_t rest = off;
    TAKE(q, void *, toy_qgemm_scratch(MOE_MR, K) + 128);
    size_t packed_end = off;
    off = rest;
    TAKE(deq, float *, w->type == TOY_F32 ? 0 : (size_t)(MOE_DQ * K) * sizeof(float));
    TAKE(pack, float *, toy_cpu_sgemm_own() ? toy_cpu_sgemm_pack_bytes() : 0);
    if (p && !toy_cpu_sgemm_own()) p->pack = NULL;
    if (off < packed_end) off = packed_end;
#undef TAKE
    if (p) *p = (struct moe_plan){E, k, N, K, w->ne[1], x->ne[1], p->first, p->pairs, p->a, p->c, p->deq, p->q, p->pack};
    return off;
}

static size_t moe_shared_bytes(const struct toy_tensor *t);

size_t toy_cpu_moe_work(const struct toy_tensor *t, int nth) {
    return TOY_WORK_HEAD + moe_shared_bytes(t) + (size_t)nth * (moe_scratch(t, NULL, NULL) + 64);
}

/* the (token, slot) pairs by expert: a counting sort */
static void moe_sort(const struct toy_tensor *route, struct moe_plan *p) {
    const int32_t *id = route->data;
    memset(p->first, 0, (size_t)(p->E + 1) * sizeof(int32_t));
    for (int64_t i = 0; i < p->k * p->N; i++) p->first[id[i] + 1]++;
    for (int64_t e = 0; e < p->E; e++) p->first[e + 1] += p->first[e];
    for (int64_t i = 0; i < p->k * p->N; i++) {
        int32_t e = id[i];
        p->pairs[p->first[e]++] = (int32_t)i;
    }
    for (int64_t e = p->E; e > 0; e--) p->first[e] = p->first[e - 1]; /* the fill moved each start to the next */
    p->first[0] = 0;
}

/* C (m x nc, ldc MOE_NC) = A (m x K) times expert e's rows [j, j + nc) */
static void moe_product(const struct toy_tensor *w, bool int8, const struct moe_plan *p, int64_t e, int64_t m,
                        int64_t j, int64_t nc) {
    const int64_t K = p->K;
    if (int8) {
        size_t per = toy_cpu_pack_stride(w), group = toy_qpack_group_bytes(w->type, K);
        const char *pk = (const char *)w->packed + (size_t)e * per + (size_t)(j / 16) * group;
        toy_qdot.qgemm_packed_cols(w->type, m, nc, K, pk, p->c, MOE_NC, false, p->q, NULL);
        return;
    }
    const char *base = (const char *)w->data + (size_t)e * w->nb[2];
    for (int64_t r = 0; r < nc; r += MOE_DQ) {
        int64_t rn = nc - r < MOE_DQ ? nc - r : MOE_DQ;
        const float *rows;
        int64_t ldr;
        if (w->type == TOY_F32) {
            rows = (const float *)(base + (size_t)(j + r) * w->nb[1]);
            ldr = (int64_t)(w->nb[1] / sizeof(float));
        } else {
            for (int64_t i = 0; i < rn; i++) {
                float *dst = p->deq + i * K;
                const float *src = toy_cpu_row_f32(w, base + (size_t)(j + r + i) * w->nb[1], dst);
                if (src != dst) memcpy(dst, src, (size_t)K * sizeof(float));
            }
            rows = p->deq;
            ldr = K;
        }
        toy_cpu_sgemm(false, true, m, rn, K, 1.0f, p->a, K, rows, ldr, 0.0f, p->c + r, MOE_NC, p->pack);
    }
}

/* expert e's pairs, columns [j0, j1): each pair's products into its row
 * of out (row = the pair's index, n apart), or (combine) added with the
 * route's weight into its token's row */
static void run_expert(const struct toy_tensor *x, const struct toy_tensor *w, bool int8, const struct moe_plan *p,
                       int64_t e, int64_t j0, int64_t j1, float *out, bool combine, const float *wts) {
    for (int64_t r = p->first[e]; r < p->first[e + 1]; r += MOE_MR) {
        int64_t m = p->first[e + 1] - r < MOE_MR ? p->first[e + 1] - r : MOE_MR;
        for (int64_t i = 0; i < m; i++) { /* gather the pairs' input rows */
            int64_t pair = p->pairs[r + i], row = p->R == 1 ? pair / p->k : pair;
            memcpy(p->a + i * p->K, (const float *)x->data + row * p->K, (size_t)p->K * sizeof(float));
        }
        if (int8) toy_qdot.qgemm_packed_prep(w->type, m, p->K, p->a, p->K, p->q);
        for (int64_t j = j0; j < j1; j += MOE_NC) {
            int64_t nc = j1 - j < MOE_NC ? j1 - j : MOE_NC;
            moe_product(w, int8, p, e, m, j, nc);
            for (int64_t i = 0; i < m; i++) { /* scatter: the pair's row, or its token's sum */
                int64_t pair = p->pairs[r + i];
                const float *c = p->c + i * MOE_NC;
                if (combine) toy_vec.axpy(out + (pair / p->k) * p->n + j, c, wts[pair], nc);
                else memcpy(out + pair * p->n + j, c, (size_t)nc * sizeof(float));
            }
        }
    }
}

/* the shared rows of a product split by experts: one per pair */
static size_t moe_shared_bytes(const struct toy_tensor *t) {
    return al64((size_t)MOE_BYEXP_PAIRS * (size_t)t->src[1]->ne[1] * sizeof(float));
}

void toy_cpu_moe_matmul(struct toy_tensor *t, int ith, int nth, void *work, size_t ws) {
    const struct toy_tensor *x = t->src[0], *w = t->src[1], *route = t->src[2];
    bool combine = t->op_params[P_MM_COMBINE], int8 = moe_int8(t);
    size_t head = TOY_WORK_HEAD + moe_shared_bytes(t);
    float *shared = (float *)((char *)work + TOY_WORK_HEAD);
    struct moe_plan p;
    moe_scratch(t, &p, (char *)toy_work_slice((char *)work + head, ws - head, ith, nth));
    moe_sort(route, &p);
    const float *wts = (const float *)((const char *)route->data + toy_nbytes(route));
    float *out = t->data;
    int64_t active = 0;
    for (int64_t e = 0; e < p.E; e++) active += p.first[e + 1] > p.first[e];
    if (nth > 1 && p.k * p.N <= MOE_BYEXP_PAIRS && active >= nth) {
        /* decode: each thread whole experts (one stream a matrix, not a slice of each), every pair's row its
         * own; the last thread out sums a token's rows as the column split does (experts in id order) */
        int64_t a0 = active * ith / nth, a1 = active * (ith + 1) / nth, seen = 0;
        for (int64_t e = 0; e < p.E; e++) {
            if (p.first[e + 1] == p.first[e]) continue;
            if (seen >= a0 && seen < a1) run_expert(x, w, int8, &p, e, 0, p.n, combine ? shared : out, false, wts);
            seen++;
        }
        if (!combine || !toy_last_thread((atomic_int *)&t->op_params[TOY_MAX_OP_PARAMS - 2], nth)) return;
        memset(out, 0, (size_t)(p.N * p.n) * sizeof(float));
        for (int64_t i = 0; i < p.k * p.N; i++) {
            int64_t pair = p.pairs[i];
            toy_vec.axpy(out + (pair / p.k) * p.n, shared + pair * p.n, wts[pair], p.n);
        }
        return;
    }
    /* this thread's columns of every expert: whole 32-column units (two packed groups) */
    int64_t units = (p.n + 31) / 32, u0, u1;
    toy_split(units, ith, nth, &u0, &u1);
    int64_t j0 = u0 * 32, j1 = u1 * 32 < p.n ? u1 * 32 : p.n;
    if (j1 <= j0) return;
    if (combine)
        for (int64_t i = 0; i < p.N; i++) memset(out + i * p.n + j0, 0, (size_t)(j1 - j0) * sizeof(float));
    for (int64_t e = 0; e < p.E; e++) run_expert(x, w, int8, &p, e, j0, j1, out, combine, wts);
}

/* ---- the gradients -----------------------------------------------------------------------------------
 *
 * MOE_MATMUL_BACK (the input's gradient): src[0] dy ({n, N} when the
 * forward combined the slots, else {n, k, N}), src[1] the weights {K, n, E},
 * src[2] the route, src[3] the forward's x {K, 1 or k, N}. Each (token,
 * slot) pair p, expert e, gets g_p = dy_p W_e (K wide; dy_p its token's row
 * when combined). dst: the pairs' rows {K, k, N}, g_p times the pair's
 * weight when combined, else g_p; then (combined) the weights' gradients
 * {k, N}: g_p . x_p, which is dy_p . W_e x_p, the pair's unweighted product,
 * without computing that product again. A thread takes a range of the
 * pairs sorted by expert, so each row has one writer.
 *
 * MOE_MATMUL_BACK_W (the weights' gradient {K, n, E}): src[0] dy, src[1] x,
 * src[2] the route. dW_e = sum over e's pairs of dy_p^T x_p (dy_p weighted
 * when combined); an expert no token chose gets zeros. A thread owns the
 * same rows of every expert's gradient.
 *
 * MOE_ROUTE_BACK (the router logits' gradient {E, N}): src[0] the weights'
 * gradient {k, N}, src[1] the route, src[2] its logits; its P_MR_NORM and
 * P_MR_SIGMOID are the route's. The ids are
 * constants; a weight is its expert's softmax probability (or sigmoid),
 * renormalised over the k chosen when the route says so:
 *   softmax:         d x_e = p_e (g_e - c), c = sum_s g_s w_s, g_e = 0 unless chosen
 *   softmax, norm:   the weights are a softmax over the chosen logits: d x_id = w (g - c)
 *   sigmoid:         d x_id = g s (1 - s)
 *   sigmoid, norm:   d x_id = (g - c) / S s (1 - s), S = the chosen scores' sum
 * The routing bias only chooses, so it has no gradient. */

static void *take(char *base, size_t *off, size_t bytes) {
    void *p = base ? base + *off : NULL;
    *off += al64(bytes);
    return p;
}

static size_t moe_back_scratch(const struct toy_tensor *t, struct moe_plan *p, char *base) {
    bool dx = t->op == TOY_OP_MOE_MATMUL_BACK;
    const struct toy_tensor *route = t->src[2], *x = dx ? t->src[3] : t->src[1];
    const int64_t *wne = dx ? t->src[1]->ne : t->ne;
    int64_t K = wne[0], n = wne[1], E = wne[2], k = route->ne[0], N = route->ne[1], wide = K > n ? K : n;
    struct moe_plan q = {E, k, N, K, n, x->ne[1], NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    size_t off = 0;
    q.first = take(base, &off, (size_t)(E + 1) * sizeof(int32_t));
    q.pairs = take(base, &off, (size_t)(k * N) * sizeof(int32_t));
    q.a = take(base, &off, (size_t)(MOE_MR * wide) * sizeof(float));
    q.c = take(base, &off, (size_t)(MOE_MR * wide) * sizeof(float));
    q.deq = take(base, &off, dx && t->src[1]->type != TOY_F32 ? (size_t)(MOE_DQ * K) * sizeof(float) : 0);
    q.pack = toy_cpu_sgemm_own() ? take(base, &off, toy_cpu_sgemm_pack_bytes()) : NULL;
    if (p) *p = q;
    return off;
}

size_t toy_cpu_moe_back_work(const struct toy_tensor *t, int nth) {
    return TOY_WORK_HEAD + (size_t)nth * (moe_back_scratch(t, NULL, NULL) + 64);
}

/* c (m x K) = a (m x n) times expert e's matrix (n x K), dequantized MOE_DQ rows at a time */
static void expert_times(const struct toy_tensor *w, const struct moe_plan *p, int64_t e, int64_t m) {
    const char *base = (const char *)w->data + (size_t)e * w->nb[2];
    const int64_t K = p->K, n = p->n;
    if (w->type == TOY_F32) {
        toy_cpu_sgemm(false, false, m, K, n, 1.0f, p->a, n, (const float *)base, (int64_t)(w->nb[1] / sizeof(float)),
                      0.0f, p->c, K, p->pack);
        return;
    }
    for (int64_t j = 0; j < n; j += MOE_DQ) {
        int64_t rn = n - j < MOE_DQ ? n - j : MOE_DQ;
        for (int64_t i = 0; i < rn; i++) {
            float *dst = p->deq + i * K;
            const float *src = toy_cpu_row_f32(w, base + (size_t)(j + i) * w->nb[1], dst);
            if (src != dst) memcpy(dst, src, (size_t)K * sizeof(float));
        }
        toy_cpu_sgemm(false, false, m, K, rn, 1.0f, p->a + j, n, p->deq, K, j ? 1.0f : 0.0f, p->c, K, p->pack);
    }
}

void toy_cpu_moe_matmul_back(struct toy_tensor *t, int ith, int nth, void *work, size_t ws) {
    const struct toy_tensor *dy = t->src[0], *w = t->src[1], *route = t->src[2], *x = t->src[3];
    bool combine = t->op_params[P_MM_COMBINE];
    struct moe_plan p;
    moe_back_scratch(t, &p, toy_work_slice((char *)work + TOY_WORK_HEAD, ws - TOY_WORK_HEAD, ith, nth));
    moe_sort(route, &p);
    const float *wts = (const float *)((const char *)route->data + toy_nbytes(route));
    const float *dyd = dy->data, *xd = x->data;
    float *dx = t->data, *dw = dx + p.K * p.k * p.N;
    int64_t P0, P1;
    toy_split(p.k * p.N, ith, nth, &P0, &P1);
    for (int64_t e = 0; e < p.E; e++) {
        int64_t lo = p.first[e] > P0 ? p.first[e] : P0, hi = p.first[e + 1] < P1 ? p.first[e + 1] : P1;
        for (int64_t r = lo; r < hi; r += MOE_MR) {
            int64_t m = hi - r < MOE_MR ? hi - r : MOE_MR;
            for (int64_t i = 0; i < m; i++) {
                int64_t pair = p.pairs[r + i];
                memcpy(p.a + i * p.n, dyd + (combine ? pair / p.k : pair) * p.n, (size_t)p.n * sizeof(float));
            }
            expert_times(w, &p, e, m);
            for (int64_t i = 0; i < m; i++) {
                int64_t pair = p.pairs[r + i];
                const float *g = p.c + i * p.K;
                if (!combine) {
                    memcpy(dx + pair * p.K, g, (size_t)p.K * sizeof(float));
                    continue;
                }
                dw[pair] = toy_vec.dot(g, xd + (p.R == 1 ? pair / p.k : pair) * p.K, p.K);
                toy_vec.scale(dx + pair * p.K, g, wts[pair], p.K);
            }
        }
    }
}

void toy_cpu_moe_matmul_back_w(struct toy_tensor *t, int ith, int nth, void *work, size_t ws) {
    const struct toy_tensor *dy = t->src[0], *x = t->src[1], *route = t->src[2];
    bool combine = t->op_params[P_MM_COMBINE];
    struct moe_plan p;
    moe_back_scratch(t, &p, toy_work_slice((char *)work + TOY_WORK_HEAD, ws - TOY_WORK_HEAD, ith, nth));
    int64_t units = (p.n + 15) / 16, u0, u1;
    toy_split(units, ith, nth, &u0, &u1);
    int64_t r0 = u0 * 16, r1 = u1 * 16 < p.n ? u1 * 16 : p.n, nr = r1 - r0;
    if (nr <= 0) return;
    moe_sort(route, &p);
    const float *wts = (const float *)((const char *)route->data + toy_nbytes(route));
    const float *dyd = dy->data, *xd = x->data;
    for (int64_t e = 0; e < p.E; e++) {
        float *o = (float *)t->data + (e * p.n + r0) * p.K;
        memset(o, 0, (size_t)(nr * p.K) * sizeof(float));
        for (int64_t r = p.first[e]; r < p.first[e + 1]; r += MOE_MR) {
            int64_t m = p.first[e + 1] - r < MOE_MR ? p.first[e + 1] - r : MOE_MR;
            for (int64_t i = 0; i < m; i++) {
                int64_t pair = p.pairs[r + i];
                memcpy(p.a + i * p.K, xd + (p.R == 1 ? pair / p.k : pair) * p.K, (size_t)p.K * sizeof(float));
                const float *d = dyd + (combine ? pair / p.k : pair) * p.n + r0;
                if (combine) toy_vec.scale(p.c + i * nr, d, wts[pair], nr);
                else memcpy(p.c + i * nr, d, (size_t)nr * sizeof(float));
            }
            toy_cpu_sgemm(true, false, nr, p.K, m, 1.0f, p.c, nr, p.a, p.K, 1.0f, o, p.K, p.pack);
        }
    }
}

void toy_cpu_moe_route_back(struct toy_tensor *t, int ith, int nth, float *tmp) {
    const struct toy_tensor *route = t->src[1], *lg = t->src[2];
    int64_t E = lg->ne[0], k = route->ne[0], r0, r1;
    bool norm = t->op_params[P_MR_NORM], sigmoid = t->op_params[P_MR_SIGMOID]; /* the route's */
    const float *wts = (const float *)((const char *)route->data + toy_nbytes(route));
    toy_split(route->ne[1], ith, nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        const float *x = (const float *)lg->data + r * E, *g = (const float *)t->src[0]->data + r * k, *w = wts + r * k;
        const int32_t *id = (const int32_t *)route->data + r * k;
        float *d = (float *)t->data + r * E, c = 0, S = 0;
        for (int64_t s = 0; s < k; s++) c += g[s] * w[s];
        if (!sigmoid && !norm) { /* p_e (g_e - c) over every expert */
            float sum = toy_vec.exp_sum(tmp, x, toy_vec.max(x, E), E);
            for (int64_t e = 0; e < E; e++) d[e] = -c * tmp[e] / sum;
            for (int64_t s = 0; s < k; s++) d[id[s]] += g[s] * tmp[id[s]] / sum;
            continue;
        }
        memset(d, 0, (size_t)E * sizeof(float));
        if (!sigmoid) {
            for (int64_t s = 0; s < k; s++) d[id[s]] = w[s] * (g[s] - c);
            continue;
        }
        for (int64_t s = 0; s < k; s++) S += 1.0f / (1.0f + expf(-x[id[s]]));
        for (int64_t s = 0; s < k; s++) {
            float sg = 1.0f / (1.0f + expf(-x[id[s]]));
            d[id[s]] = (norm ? (g[s] - c) / S : g[s]) * sg * (1.0f - sg);
        }
    }
}
