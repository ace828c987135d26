/* attention.c: fused scaled-dot-product attention, forward and backward.
 *
 * Shapes (innermost first): q {D, Hq, Tq, B}, k, v {D, Hkv, Tk, B}, out like
 * q. Query head h reads kv head h / (Hq / Hkv) (grouped-query attention).
 * Causal: query t sees keys j <= t + (Tk - Tq); a sliding window W also
 * drops keys j <= t + (Tk - Tq) - W. Softcap c: s -> c tanh(s / c).
 *
 * Queries are processed in blocks of QB rows: S = Q_blk K^T (QB x Tk, BLAS),
 * a row softmax, then O_blk = P V (BLAS). Memory per thread is QB x Tk, never
 * Tq x Tk. The forward keeps lse = log sum exp of every row (aux bytes of the
 * output) so the backward recomputes P exactly without storing it:
 *   dV = P^T dO,  dP = dO V^T,  dS = P (dP - rowsum(dO O)),
 *   dQ = scale dS K,  dK = scale dS^T Q   (dS times the softcap derivative).
 * The backward runs one (batch, kv head) per work item so dK and dV have a
 * single writer.
 *
 * Segments (packed rows): with seg {T, B} a query sees only keys of its own
 * segment id. Each block of queries is cut into runs of one id; a run's key
 * range shrinks to the first and last key of that id inside its causal
 * range, so packed documents cost what they would one per row (whole
 * blocks of other documents are never computed); keys of other ids inside
 * the range (ids that recur non-contiguously) are masked to -inf.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/cpu-impl.h"
#include "backends/cpu/qdot.h"

#define QB 64
#define FEW_Q 16 /* at most this many queries take few_queries (a draft of TOY_GENERATE_MAX_LOOKUP and its token) */

#define QROW(x, h, t, b) ((float *)((char *)(x)->data + (h) * (x)->nb[1] + (t) * (x)->nb[2] + (b) * (x)->nb[3]))

void toy_attn_decode_scores_avx512(const float *q, const float *K, int64_t ldk, int64_t nk, int64_t D, float scale,
                                   float *s);
void toy_attn_decode_values_avx512(const float *p, const float *V, int64_t ldv, int64_t nk, int64_t D, float *o);
bool toy_attn_decode_qk_avx512(const float *qs, const void *K, bool f16, int64_t ldk, int64_t ldh, int64_t nk,
                               int64_t D, int64_t Hq, int64_t G, float *S, int64_t lds);
bool toy_attn_decode_pv_avx512(const float *P, int64_t lds, const void *V, bool f16, int64_t ldv, int64_t ldh,
                               int64_t nk, int64_t D, int64_t Hq, int64_t G, float *O);

void toy_attn_decode_scores_avx2(const float *q, const float *K, int64_t ldk, int64_t nk, int64_t D, float scale,
                                 float *s);
void toy_attn_decode_values_avx2(const float *p, const float *V, int64_t ldv, int64_t nk, int64_t D, float *o);
bool toy_attn_decode_qk_avx2(const float *qs, const void *K, bool f16, int64_t ldk, int64_t ldh, int64_t nk,
                             int64_t D, int64_t Hq, int64_t G, float *S, int64_t lds);
bool toy_attn_decode_pv_avx2(const float *P, int64_t lds, const void *V, bool f16, int64_t ldv, int64_t ldh,
                             int64_t nk, int64_t D, int64_t Hq, int64_t G, float *O);

/* one-query products without BLAS (attn-decode-avx512.c, attn-decode-avx2.c)
 * where the CPU has AVX-512 or AVX2 and D fits them: head sizes a multiple
 * of `mult` up to 256 (the whole-step ones: 64 and 128). $TOY_SIMD=avx2
 * picks the AVX2 ones, =scalar BLAS. */
struct decode_ops {
    void (*scores)(const float *q, const float *K, int64_t ldk, int64_t nk, int64_t D, float scale, float *s);
    void (*values)(const float *p, const float *V, int64_t ldv, int64_t nk, int64_t D, float *o);
    bool (*qk)(const float *qs, const void *K, bool f16, int64_t ldk, int64_t ldh, int64_t nk, int64_t D, int64_t Hq,
               int64_t G, float *S, int64_t lds);
    bool (*pv)(const float *P, int64_t lds, const void *V, bool f16, int64_t ldv, int64_t ldh, int64_t nk, int64_t D,
               int64_t Hq, int64_t G, float *O);
    int64_t mult;
};

static const struct decode_ops *decode_ops(void) {
    static const struct decode_ops avx512 = {toy_attn_decode_scores_avx512, toy_attn_decode_values_avx512,
                                             toy_attn_decode_qk_avx512, toy_attn_decode_pv_avx512, 16};
    static const struct decode_ops avx2 = {toy_attn_decode_scores_avx2, toy_attn_decode_values_avx2,
                                           toy_attn_decode_qk_avx2, toy_attn_decode_pv_avx2, 8};
    static const struct decode_ops *ops;
    static bool chosen;
    if (!chosen) { /* the same answer from every thread */
        const char *e = getenv("TOY_SIMD");
        __builtin_cpu_init();
        bool has2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
        bool best = !e || (strcmp(e, "avx2") && strcmp(e, "scalar")); /* as simd.c reads it */
        ops = best && toy_cpu_has_avx512() ? &avx512 : has2 && (best || !strcmp(e, "avx2")) ? &avx2 : NULL;
        chosen = true;
    }
    return ops;
}

static bool decode_kernels(int64_t D) {
    const struct decode_ops *o = decode_ops();
    return o && D % o->mult == 0 && D <= 256;
}

struct attn {
    int64_t D, Hq, Hkv, Tq, Tk, B, group, off;
    float scale, cap;
    bool causal;
    int window;
    const int32_t *seg; /* (B, T) segment ids, or NULL */
    float *pack;        /* this thread's scratch for toy's sgemm (the slice's end), or NULL: BLAS */
};

static struct attn attn_shape(const struct toy_tensor *q, const struct toy_tensor *k, const struct toy_tensor *p) {
    struct attn a;
    int64_t dyn = -1; /* cached attention: keys are the first n_past + Tq cache rows */
    if (p->op_params[P_AT_DYNKV]) dyn = *(const int32_t *)p->src[3]->data;
    a.D = q->ne[0];
    a.Hq = q->ne[1];
    a.Tq = q->ne[2];
    a.B = q->ne[3];
    a.Hkv = k->ne[1];
    a.Tk = dyn >= 0 ? dyn + q->ne[2] : k->ne[2];
    if (a.Tk > k->ne[2]) a.Tk = k->ne[2]; /* kv_store has flagged the overflow */
    a.group = a.Hq / a.Hkv;
    a.off = a.Tk - a.Tq;
    a.scale = toy_param_f32(p, P_AT_SCALE);
    a.cap = toy_param_f32(p, P_AT_SOFTCAP);
    a.causal = p->op_params[P_AT_CAUSAL];
    a.window = p->op_params[P_AT_WINDOW];
    a.seg = NULL;
    a.pack = NULL;
    if (p->op_params[P_AT_SEG]) a.seg = p->src[p->op == TOY_OP_ATTENTION ? 4 : 5]->data;
    return a;
}

/* a thread's f32 scratch: scores, probabilities and their gradients, row
 * statistics, one output block */
static size_t f32_bytes(int64_t D, int64_t Tk) {
    return (size_t)(3 * QB * Tk + 2 * QB + QB * D) * sizeof(float) + 256;
}

static int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

/* ---- products in bf16 (P_AT_BF16: mixed-precision training) ----
 * Where the op is marked bf16 (toy_attn_params.bf16), K and V are f32 and
 * this CPU multiplies bf16 as bf16 (AMX tiles or AVX-512 BF16 dot products,
 * toy_cpu_bf16_kernel; not the sgemm route), the six products take their
 * operands rounded to bf16 -- Q, K, V, dO, the probabilities P and the
 * scaled score gradients dS -- and sum in f32, as autocast attention does.
 * The mask, softmax, its statistics and dS itself stay f32.
 *
 * A thread packs one (batch, kv head)'s K and V once for all the blocks
 * and heads that read them: as panels whose columns are keys (for Q K^T
 * and dO V^T) and as panels whose k is keys (for P V and dS K). A block's
 * key range then starts at a multiple of 32, so that its k runs over whole
 * tiles of those panels; the keys added in front lie before the window or
 * in another segment, so the mask gives them probability 0 and gradient 0. */
struct bf {
    toy_bf16_kernel kern;
    int64_t tr, kpD, Tp, pe_n, pe_k; /* tile rows; D, Tk padded to 32; panel strides */
    uint16_t *Kn, *Vn, *Kk, *Vk;     /* panels: keys as columns (n), keys as k (k) */
    uint16_t *A, *Ab, *At, *Bq;      /* A operands (rows, long rows, transposed), a block's B */
    int64_t b, g;                    /* the (batch, kv head) packed, or -1 */
};

/* The bf16 part of a thread's scratch from base on, in 64-byte aligned
 * pieces: sets f's pointers where base is given and returns the bytes
 * either way, so that the work size and the layout are one definition */
static size_t bf_layout(struct bf *f, int64_t D, int64_t Tk, char *base) {
    int64_t kpD = round_up(D, 32), Tp = round_up(Tk, 32), D16 = round_up(D, 16), T16 = round_up(Tk, 16),
            Q32 = round_up(QB, 32);
    struct {
        uint16_t **at;
        int64_t elems;
    } piece[] = {{&f->Kn, T16 * kpD},        {&f->Vn, T16 * kpD},       {&f->Kk, D16 * Tp},
                 {&f->Vk, D16 * Tp},         {&f->A, (QB + 16) * kpD},  {&f->Ab, (QB + 16) * Tp},
                 {&f->At, (Tk + 16) * Q32}, {&f->Bq, D16 * Q32}};
    size_t off = 0;
    for (size_t i = 0; i < sizeof piece / sizeof *piece; i++) {
        if (base) *piece[i].at = (uint16_t *)(base + off);
        off += ((size_t)piece[i].elems * sizeof(uint16_t) + 63) / 64 * 64;
    }
    return off;
}

/* the f32 part ends 64-aligned, and toy_work_slice rounds a slice down to 64 */
static size_t bf_bytes(int64_t D, int64_t Tk) {
    struct bf unused;
    return bf_layout(&unused, D, Tk, NULL) + 2 * 64;
}

/* the bf16 state over a thread's scratch after its f32 part, or false where
 * the products stay f32 */
static bool bf_init(struct bf *f, const struct toy_tensor *dst, const struct toy_tensor *k,
                    const struct toy_tensor *v, int64_t D, int64_t Tk, void *scratch, size_t room) {
    if (!dst->op_params[P_AT_BF16] || k->type != TOY_F32 || v->type != TOY_F32) return false;
    f->kern = toy_cpu_bf16_kernel(&f->tr);
    if (!f->kern) return false;
    f->kpD = round_up(D, 32);
    f->Tp = round_up(Tk, 32);
    f->pe_n = 16 * f->kpD;
    f->pe_k = 16 * f->Tp;
    size_t f32 = (f32_bytes(D, Tk) + 63) / 64 * 64, used = f32 + bf_layout(f, D, Tk, (char *)scratch + f32);
    TOY_ASSERT(used <= room, "attention: bf16 scratch %zu bytes, room %zu", used, room);
    f->b = f->g = -1;
    return true;
}

/* rows of an f32 matrix (ld floats apart) as a B operand, rounded as they
 * are packed: their values are C's columns (panels of kp) or its k (panels
 * over kp rows) */
static void bf_b_cols(const struct bf *f, const float *x, int64_t ld, int64_t rows, int64_t D, uint16_t *out) {
    toy_pack_f32_bf16_panels(x, ld, true, rows, D, f->kpD, out);
}
static void bf_b_k(const float *x, int64_t ld, int64_t rows, int64_t D, int64_t kp, uint16_t *out) {
    toy_pack_f32_bf16_panels(x, ld, false, D, rows, kp, out);
}
/* m rows (or, transposed, m columns of k rows) of f32 as an A operand of kp,
 * zero rows up to the kernel's tile */
static void bf_a(const struct bf *f, const float *x, int64_t ld, bool trans, int64_t m, int64_t k, int64_t kp,
                 uint16_t *out) {
    if (trans) toy_pack_f32_bf16_cols(x, ld, 0, m, k, out, kp);
    else
        for (int64_t r = 0; r < m; r++) toy_pack_f32_bf16(x + r * ld, k, out + r * kp, kp);
    memset(out + m * kp, 0, (size_t)((round_up(m, f->tr) - m) * kp) * sizeof(uint16_t));
}

/* kv head g of batch b packed (its keys as columns of K for the scores,
 * as k of V for the outputs; the backward also wants V as columns and K
 * as k) */
static void bf_pack_kv(struct bf *f, const struct toy_tensor *k, const struct toy_tensor *v, int64_t g, int64_t b,
                       int64_t Tk, bool backward) {
    if (f->b == b && f->g == g) return;
    int64_t D = k->ne[0], ldk = (int64_t)(k->nb[2] / 4), ldv = (int64_t)(v->nb[2] / 4);
    const float *K = QROW(k, g, 0, b), *V = QROW(v, g, 0, b);
    bf_b_cols(f, K, ldk, Tk, D, f->Kn);
    if (backward) {
        bf_b_cols(f, V, ldv, Tk, D, f->Vn);
        bf_b_k(K, ldk, Tk, D, f->Tp, f->Kk);
    } else {
        bf_b_k(V, ldv, Tk, D, f->Tp, f->Vk);
    }
    f->b = b;
    f->g = g;
}

/* the fused prologue's scratch (P_AT_FUSED), 64-byte aligned: a key row,
 * and toy_cpu_rope_decode_row's 2 D + 16 floats and D doubles */
#define DECODE_ROPE_FLOATS(D) (5 * (D) + 32)

/* toy_attention_rows' fast path's scratch (rows_attention): every unit's share (R x nth x Hq x (D + 2)), then each thread's queries, scores and
 * row buffer */
static size_t rows_shares_bytes(int64_t R, int64_t Hq, int64_t D, int nth) {
    return ((size_t)(R * nth * Hq * (D + 2)) * sizeof(float) + 63) / 64 * 64;
}
static size_t rows_thread_bytes(int64_t Hq, int64_t D, int64_t Tmax) {
    return ((size_t)(Hq * D + Hq * ((Tmax + 15) / 16 * 16 + 16) + D + 16) * sizeof(float) + 63) / 64 * 64;
}

size_t toy_cpu_attention_work(const struct toy_tensor *dst, int nth) {
    const struct toy_tensor *q = dst->op == TOY_OP_ATTENTION ? dst->src[0] : dst->src[1];
    const struct toy_tensor *k = dst->op == TOY_OP_ATTENTION ? dst->src[1] : dst->src[2];
    size_t per = f32_bytes(q->ne[0], k->ne[2]);
    if (k->type != TOY_F32) per += (size_t)(2 * k->ne[2] * k->ne[0]) * sizeof(float); /* f16 K/V rows as f32 */
    else if (dst->op_params[P_AT_BF16]) per += bf_bytes(q->ne[0], k->ne[2]);
    if (dst->op == TOY_OP_ATTENTION && q->ne[2] == 1) { /* decode_step: partials, scaled queries, scores, prologue */
        size_t dec = (size_t)(q->ne[3] * q->ne[1] * (q->ne[0] + 2) + q->ne[1] * q->ne[0] +
                              q->ne[1] * (k->ne[2] + 16) + DECODE_ROPE_FLOATS(q->ne[0]) + 16) * sizeof(float) + 256;
        if (dec > per) per = dec;
    }
    if (dst->op == TOY_OP_ATTENTION && q->ne[2] > 1 && q->ne[2] <= FEW_Q) { /* few_queries: queries, scores, shares */
        size_t few = (size_t)(q->ne[1] * q->ne[0] + q->ne[1] * (k->ne[2] + 16) + nth * q->ne[1] * (q->ne[0] + 2) + 16) *
                         sizeof(float) + 256;
        if (few > per) per = few;
    }
    per += toy_cpu_sgemm_pack_bytes() + 64; /* at the slice's end (sgemm_pack) */
    size_t w = TOY_WORK_HEAD + per * (size_t)nth;
    if (dst->op == TOY_OP_ATTENTION && dst->op_params[P_AT_ROWS]) { /* rows_attention's fast path */
        size_t fast = TOY_WORK_HEAD + rows_shares_bytes(q->ne[2], q->ne[1], q->ne[0], nth) +
                      (size_t)nth * rows_thread_bytes(q->ne[1], q->ne[0], k->ne[2]);
        if (fast > w) w = fast;
    }
    return w;
}

/* the bytes of a thread's slice before toy's sgemm's scratch, which ends it */
static size_t slice_room(size_t ws, int nth) {
    return toy_work_slice_bytes(ws - TOY_WORK_HEAD, nth) - toy_cpu_sgemm_pack_bytes();
}

/* that scratch, or NULL where BLAS runs the blocks' products */
static float *sgemm_pack(void *work, size_t ws, int ith, int nth) {
    if (!toy_cpu_sgemm_pack_bytes()) return NULL;
    return (float *)((char *)toy_work_slice((char *)work + TOY_WORK_HEAD, ws - TOY_WORK_HEAD, ith, nth) +
                     slice_room(ws, nth));
}

/* visible key range [j0, j1) of query t */
static inline void key_range(const struct attn *a, int64_t t, int64_t *j0, int64_t *j1) {
    *j0 = 0;
    *j1 = a->Tk;
    if (a->causal) {
        *j1 = t + a->off + 1;
        if (a->window > 0 && *j1 - a->window > 0) *j0 = *j1 - a->window;
    }
}

/* The rows of one (batch, kv head) of K or V as f32: the tensor itself
 * when it is f32; from an f16 KV cache, converted into this thread's
 * scratch (indexed by position) and kept there for the blocks and query
 * heads that read them next -- a thread takes a head's blocks in turn, and
 * the heads of one kv head one after another, so each row is converted
 * once a head group rather than once per block and query head. Holds the
 * converted positions [lo, hi). */
struct rows32 {
    const struct toy_tensor *x;
    float *buf; /* x->ne[2] rows of x->ne[0] */
    int64_t b, g, lo, hi;
};

static void rows32_init(struct rows32 *r, const struct toy_tensor *x, float *buf) {
    *r = (struct rows32){.x = x, .buf = buf, .b = -1, .g = -1};
}

/* rows [js, je) of kv head g, batch b; *ld: their stride in floats */
static const float *rows32_get(struct rows32 *r, int64_t g, int64_t js, int64_t je, int64_t b, int *ld) {
    const struct toy_tensor *x = r->x;
    if (x->type == TOY_F32) {
        *ld = (int)(x->nb[2] / 4);
        return QROW(x, g, js, b);
    }
    int64_t D = x->ne[0];
    if (r->b != b || r->g != g || js < r->lo || js > r->hi) r->b = b, r->g = g, r->lo = r->hi = js;
    for (; r->hi < je; r->hi++)
        toy_f16_to_f32_row((const toy_f16 *)((const char *)x->data + g * x->nb[1] + r->hi * x->nb[2] + b * x->nb[3]),
                           r->buf + r->hi * D, D);
    *ld = (int)D;
    return r->buf + js * D;
}

/* S (nq x [js, je)) = scale * Q_blk K^T with the mask and softcap applied.
 * ld of S is ldS. Returns nothing; masked entries are -inf. With f, the
 * product is in bf16 from the packed keys (js a multiple of 32). */
static void block_scores(const struct attn *a, const struct toy_tensor *q, const struct toy_tensor *k,
                         int64_t h, int64_t b, int64_t t0, int64_t nq, int64_t js, int64_t je, float *S,
                         int64_t ldS, struct rows32 *kr, struct bf *f) {
    int64_t g = h / a->group;
    const float *Q = QROW(q, h, t0, b);
    if (f) {
        bf_a(f, Q, (int64_t)(q->nb[2] / 4), false, nq, a->D, f->kpD, f->A);
        f->kern(nq, je - js, f->kpD, f->A, f->Kn + js * f->kpD, f->pe_n, S, ldS, 0.0f);
        for (int64_t i = 0; i < nq; i++) toy_vec.scale(S + i * ldS, S + i * ldS, a->scale, je - js);
    } else {
        int ldk;
        const float *K = rows32_get(kr, g, js, je, b, &ldk);
        if (nq == 1 && decode_kernels(a->D))
            decode_ops()->scores(Q, K, ldk, je - js, a->D, a->scale, S);
        else
            toy_cpu_sgemm(false, true, nq, je - js, a->D, a->scale, Q, (int64_t)(q->nb[2] / 4), K, ldk, 0.0f, S, ldS,
                          a->pack);
    }
    for (int64_t i = 0; i < nq; i++) {
        float *s = S + i * ldS;
        int64_t j0, j1;
        key_range(a, t0 + i, &j0, &j1);
        if (a->cap > 0)
            for (int64_t j = 0; j < je - js; j++) s[j] = a->cap * tanhf(s[j] / a->cap);
        for (int64_t j = js; j < j0 && j < je; j++) s[j - js] = -INFINITY; /* before the window */
        for (int64_t j = j1 > js ? j1 : js; j < je; j++) s[j - js] = -INFINITY; /* after the query (causal) */
        if (a->seg) {
            const int32_t *sg = a->seg + b * a->Tk;
            int32_t id = sg[t0 + i];
            for (int64_t j = js; j < je; j++)
                if (sg[j] != id) s[j - js] = -INFINITY;
        }
    }
}

/* the keys a run of queries (one segment id, when segmented) can see */
static void block_keys(const struct attn *a, int64_t b, int64_t t0, int64_t nq, int64_t *js, int64_t *je) {
    int64_t s0, e0, s1, e1;
    key_range(a, t0, &s0, &e0);
    key_range(a, t0 + nq - 1, &s1, &e1);
    *js = s0 < s1 ? s0 : s1;
    *je = e0 > e1 ? e0 : e1;
    if (*je > a->Tk) *je = a->Tk;
    if (*js < 0) *js = 0;
    if (a->seg) {
        const int32_t *sg = a->seg + b * a->Tk;
        int32_t id = sg[t0];
        while (*js < *je && sg[*js] != id) (*js)++;
        while (*je > *js && sg[*je - 1] != id) (*je)--;
    }
}

/* the end of the run of queries from t0 (before tend) that share a segment id */
static int64_t run_end(const struct attn *a, int64_t b, int64_t t0, int64_t tend) {
    if (!a->seg) return tend;
    const int32_t *sg = a->seg + b * a->Tk;
    int64_t t = t0 + 1;
    while (t < tend && sg[t] == sg[t0]) t++;
    return t;
}

/* Heads wider than the SIMD decode kernels take (DeepSeek's latent
 * attention: 576, one kv head for all 16 query heads) decode with the
 * plain row products below: each key row (converted once, from f16) dotted
 * with its group's queries, each value row added into its group's
 * outputs. The blocked path this replaces packed every key once per query
 * head for its sgemm: 19% of a DeepSeek-V2-shaped decode step at 300
 * positions. */
static bool wide(int64_t D) { return D > 256 && D % 16 == 0 && decode_ops(); }

static const float *row_f32(const char *r, bool f16, int64_t D, float *buf) {
    if (!f16) return (const float *)r;
    toy_f16_to_f32_row((const toy_f16 *)r, buf, D);
    return buf;
}

static void wide_qk(const float *qs, const char *K, bool f16, int64_t ldk, int64_t ldh, int64_t nk, int64_t D,
                    int64_t Hq, int64_t G, float *S, int64_t lds, float *buf) {
    for (int64_t j = 0; j < nk; j++)
        for (int64_t g = 0; g < Hq / G; g++) {
            const float *kr = row_f32(K + j * ldk + g * ldh, f16, D, buf);
            for (int64_t h = g * G; h < (g + 1) * G; h++) S[h * lds + j] = toy_vec.dot(qs + h * D, kr, D);
        }
}

static void wide_pv(const float *P, int64_t lds, const char *V, bool f16, int64_t ldv, int64_t ldh, int64_t nk,
                    int64_t D, int64_t Hq, int64_t G, float *O, float *buf) {
    memset(O, 0, (size_t)(Hq * D) * sizeof(float));
    for (int64_t j = 0; j < nk; j++)
        for (int64_t g = 0; g < Hq / G; g++) {
            const float *vr = row_f32(V + j * ldv + g * ldh, f16, D, buf);
            for (int64_t h = g * G; h < (g + 1) * G; h++) toy_vec.axpy(O + h * D, vr, P[h * lds + j], D);
        }
}

/* One decode query per sequence (Tq 1), head size 64 or 128, f32 or f16
 * cache with each head's row contiguous: every head at once (K and V read
 * once per step, front to back), the visible keys split between the
 * threads, each thread's (max, sum, unnormalised output) per head merged by
 * the last thread out -- split-softmax ("flash decoding"). */
static bool decode_step_ok(const struct attn *a, const struct toy_tensor *k, const struct toy_tensor *v) {
    size_t es = k->type == TOY_F16 ? 2 : 4;
    return a->Tq == 1 && !a->seg && ((decode_kernels(a->D) && (a->D == 64 || a->D == 128)) || wide(a->D)) &&
           k->type == v->type && (k->type == TOY_F32 || k->type == TOY_F16) && k->nb[0] == es && v->nb[0] == es &&
           a->Hq % a->Hkv == 0;
}

/* the keys [*c0, *c1) thread ith of nth reads in a decode step: whole
 * blocks of 16 keys, as many to each thread as they divide (the last block,
 * maybe partial, to the last thread). Rounding each thread's share up to a
 * block instead left the last thread up to 16 keys a thread short: at 70
 * keys on 2 threads, 48 against 22, and GPT-2 124M's decode attention took
 * 134 us a step on the first thread against 80 on the second. */
static void split_keys(const struct attn *a, int64_t t, int ith, int nth, int64_t *c0, int64_t *c1) {
    int64_t j0, j1;
    key_range(a, t, &j0, &j1);
    if (j1 > a->Tk) j1 = a->Tk;
    int64_t nk = j1 > j0 ? j1 - j0 : 0, blocks = (nk + 15) / 16;
    int64_t b0 = blocks * ith / nth, b1 = blocks * (ith + 1) / nth;
    *c0 = j0 + 16 * b0 < j1 ? j0 + 16 * b0 : j1;
    *c1 = j0 + 16 * b1 < j1 ? j0 + 16 * b1 : j1;
}

static void decode_keys(const struct attn *a, int ith, int nth, int64_t *c0, int64_t *c1) {
    split_keys(a, 0, ith, nth, c0, c1);
}

int toy_cpu_attention_prefetch(const struct toy_tensor *dst, int ith, int nth, struct toy_prefetch *pf) {
    if (dst->op != TOY_OP_ATTENTION || dst->op_params[P_AT_ROWS]) return 0;
    const struct toy_tensor *q = dst->src[0], *k = dst->src[1], *v = dst->src[2];
    /* the cache itself: the step's KV_STORE has not run yet (it gives its data at run time) */
    const struct toy_tensor *kc = k->op == TOY_OP_KV_STORE ? k->src[0] : k, *vc = v->op == TOY_OP_KV_STORE ? v->src[0] : v;
    if (!kc->data || !vc->data || (dst->op_params[P_AT_DYNKV] && !dst->src[3]->data)) return 0;
    struct attn a = attn_shape(q, k, dst);
    if (a.B != 1 || !decode_step_ok(&a, k, v)) return 0;
    int64_t c0, c1;
    decode_keys(&a, ith, nth, &c0, &c1);
    if (c1 <= c0) return 0;
    pf->p[0] = (const char *)kc->data + c0 * k->nb[2];
    pf->n[0] = (size_t)(c1 - c0) * k->nb[2];
    pf->p[1] = (const char *)vc->data + c0 * v->nb[2];
    pf->n[1] = (size_t)(c1 - c0) * v->nb[2];
    /* the attention fetches the rest itself, as it goes */
    if (pf->n[0] > TOY_ATTN_K_AHEAD) pf->n[0] = TOY_ATTN_K_AHEAD;
    if (pf->n[1] > TOY_ATTN_V_AHEAD) pf->n[1] = TOY_ATTN_V_AHEAD;
    return 2;
}

/* The fused prologue (P_AT_FUSED, B = 1): the new key (rotated) and value
 * into the caches at n_past, by the thread whose keys hold that position,
 * before it reads them; false (flagged) when n_past is outside the cache. */
static bool decode_store_new(struct toy_tensor *dst, const struct attn *a, int64_t c0, int64_t c1, float *tmp) {
    const struct toy_tensor *ks = dst->src[1], *vs = dst->src[2];
    int64_t p = *(const int32_t *)ks->src[2]->data;
    if (p < 0 || p >= ks->src[0]->ne[2]) {
        dst->op_params[TOY_MAX_OP_PARAMS - 1] = 1; /* as KV_STORE flags it */
        return false;
    }
    if (p < c0 || p >= c1) return true;
    float *row = tmp + DECODE_ROPE_FLOATS(a->D) - a->D;
    for (int64_t h = 0; h < a->Hkv; h++) {
        toy_cpu_rope_decode_row(ks->src[1], h, row, tmp);
        toy_cpu_kv_put(ks->src[0], h, p, 0, row, a->D);
        toy_cpu_kv_put(vs->src[0], h, p, 0, (const float *)TOY_ROW(vs->src[1], h, 0, 0), a->D);
    }
    return true;
}

/* One share of a decode step: the scaled queries qs (Hq x D) over the n keys and values from K and V, into each
 * head's largest score pm[h], sum of exp(score - pm[h]) pl[h] and output weighted by those exps po (Hq x D); S:
 * room for Hq x lds scores */
static void decode_part(const struct attn *a, const struct toy_tensor *k, const struct toy_tensor *v, const float *qs,
                        const char *K, const char *V, int64_t n, float *S, int64_t lds, float *pm, float *tmp) {
    const int64_t D = a->D, Hq = a->Hq;
    const bool f16 = k->type == TOY_F16;
    float *pl = pm + Hq, *po = pl + Hq;
    if (n <= 0) {
        for (int64_t h = 0; h < Hq; h++) pm[h] = -INFINITY, pl[h] = 0;
        return;
    }
    if (wide(D)) wide_qk(qs, K, f16, (int64_t)k->nb[2], (int64_t)k->nb[1], n, D, Hq, a->group, S, lds, tmp);
    else decode_ops()->qk(qs, K, f16, (int64_t)k->nb[2], (int64_t)k->nb[1], n, D, Hq, a->group, S, lds);
    for (int64_t h = 0; h < Hq; h++) {
        float *s = S + h * lds;
        if (a->cap > 0)
            for (int64_t j = 0; j < n; j++) s[j] = a->cap * tanhf(s[j] / a->cap);
        pm[h] = toy_vec.max(s, n);
        pl[h] = toy_vec.exp_sum(s, s, pm[h], n);
    }
    if (wide(D)) wide_pv(S, lds, V, f16, (int64_t)v->nb[2], (int64_t)v->nb[1], n, D, Hq, a->group, po, tmp);
    else decode_ops()->pv(S, lds, V, f16, (int64_t)v->nb[2], (int64_t)v->nb[1], n, D, Hq, a->group, po);
}

/* The shares part[0..nth) of query t of sequence b (decode_part's pm, pl, po each) merged into its output rows
 * and log-sum-exps */
static void decode_merge(struct toy_tensor *dst, const struct attn *a, int64_t t, int64_t b, const float *const *part,
                         int nth) {
    const int64_t D = a->D, Hq = a->Hq;
    float *lse = (float *)((char *)dst->data + toy_nbytes(dst));
    const float *sinks = dst->src[5] ? dst->src[5]->data : NULL;
    for (int64_t h = 0; h < Hq; h++) {
        float mx = sinks ? sinks[h] : -INFINITY, sum = sinks ? 1.0f : 0.0f; /* a sink: one more key, of value 0 */
        for (int i = 0; i < nth; i++) {
            const float *pm = part[i];
            if (pm[Hq + h] > 0 && pm[h] > mx) {
                sum *= expf(mx - pm[h]); /* the sink's term, rescaled to the new maximum */
                mx = pm[h];
            }
        }
        float *O = QROW(dst, h, t, b);
        memset(O, 0, (size_t)D * sizeof(float));
        for (int i = 0; i < nth && mx > -INFINITY; i++) {
            const float *pm = part[i];
            if (!(pm[Hq + h] > 0)) continue;
            float w = expf(pm[h] - mx);
            sum += w * pm[Hq + h];
            toy_vec.axpy(O, pm + 2 * Hq + h * D, w, D);
        }
        if (sum > 0) toy_vec.scale(O, O, 1.0f / sum, D);
        lse[(b * a->Tq + t) * Hq + h] = sum > 0 ? mx + logf(sum) : -INFINITY;
    }
}

static void decode_step(struct toy_tensor *dst, const struct attn *a, int ith, int nth, void *work, size_t ws) {
    const struct toy_tensor *q = dst->src[0], *k = dst->src[1], *v = dst->src[2];
    const int64_t D = a->D, Hq = a->Hq;
    const bool fused = dst->op_params[P_AT_FUSED];
    int64_t c0, c1;
    decode_keys(a, ith, nth, &c0, &c1);
    int64_t n = c1 - c0;
    float *part = toy_work_slice((char *)work + TOY_WORK_HEAD, ws - TOY_WORK_HEAD, ith, nth); /* B x Hq x (D + 2) */
    float *qs = part + a->B * Hq * (D + 2), *S = qs + Hq * D;
    float *tmp = (float *)(((uintptr_t)(S + Hq * (k->ne[2] + 16)) + 63) & ~(uintptr_t)63); /* the fused prologue's */
    int64_t lds = (n + 15) / 16 * 16;
    if (fused && !decode_store_new(dst, a, c0, c1, tmp)) return; /* every thread alike */
    for (int64_t b = 0; b < a->B; b++) {
        if (n > 0)
            for (int64_t h = 0; h < Hq; h++) {
                if (fused) { /* the query's ROPE, done here: the same bits as the node's */
                    toy_cpu_rope_decode_row(q, h, qs + h * D, tmp);
                    toy_vec.scale(qs + h * D, qs + h * D, a->scale, D);
                } else {
                    toy_vec.scale(qs + h * D, QROW(q, h, 0, b), a->scale, D);
                }
            }
        decode_part(a, k, v, qs, (const char *)k->data + b * k->nb[3] + c0 * k->nb[2],
                    (const char *)v->data + b * v->nb[3] + c0 * v->nb[2], n, S, lds, part + b * Hq * (D + 2), tmp);
    }
    if (!toy_last_thread((atomic_int *)&dst->op_params[TOY_MAX_OP_PARAMS - 2], nth)) return;
    const float *parts[nth];
    for (int64_t b = 0; b < a->B; b++) {
        for (int i = 0; i < nth; i++)
            parts[i] = (const float *)toy_work_slice((char *)work + TOY_WORK_HEAD, ws - TOY_WORK_HEAD, i, nth) +
                       b * Hq * (D + 2);
        decode_merge(dst, a, 0, b, parts, nth);
    }
}

/* A few queries (a speculative pass's draft, at most FEW_Q rows) over a
 * cache the decode kernels read: rows dealt out to the threads, each row
 * computed as a decode step of its own over the keys it sees, all heads at
 * once, in the shares a decode step's nth threads would take and merged as
 * it merges them. So a row gets the bits a decode step gives it: a token
 * sampled after a draft is the one plain decoding samples, whatever the
 * rounding (a row in one share differed from a decode step's two by ~1e-4
 * in its log-probabilities, and sampled text went another way). The
 * general path's blocks (f16 rows converted, products through sgemm) cost
 * ten times a decode step for five rows. */
static bool few_queries_ok(const struct attn *a, const struct toy_tensor *dst, const struct toy_tensor *k,
                           const struct toy_tensor *v) {
    size_t es = k->type == TOY_F16 ? 2 : 4;
    return a->Tq > 1 && a->Tq <= FEW_Q && !a->seg && !dst->op_params[P_AT_FUSED] && decode_kernels(a->D) &&
           (a->D == 64 || a->D == 128) && k->type == v->type && (k->type == TOY_F32 || k->type == TOY_F16) &&
           k->nb[0] == es && v->nb[0] == es && a->Hq % a->Hkv == 0;
}

static void few_queries(struct toy_tensor *dst, const struct attn *a, int ith, int nth, void *work, size_t ws) {
    const struct toy_tensor *q = dst->src[0], *k = dst->src[1], *v = dst->src[2];
    const int64_t D = a->D, Hq = a->Hq;
    float *qs = toy_work_slice((char *)work + TOY_WORK_HEAD, ws - TOY_WORK_HEAD, ith, nth), *S = qs + Hq * D,
          *part = S + Hq * ((a->Tk + 15) / 16 * 16); /* nth x Hq x (D + 2) */
    const float *parts[nth];
    int64_t w0, w1;
    toy_split(a->B * a->Tq, ith, nth, &w0, &w1);
    for (int64_t w = w0; w < w1; w++) {
        int64_t b = w / a->Tq, t = w % a->Tq;
        for (int64_t h = 0; h < Hq; h++) toy_vec.scale(qs + h * D, QROW(q, h, t, b), a->scale, D);
        for (int i = 0; i < nth; i++) {
            int64_t c0, c1;
            split_keys(a, t, i, nth, &c0, &c1);
            float *pm = part + i * Hq * (D + 2);
            decode_part(a, k, v, qs, (const char *)k->data + b * k->nb[3] + c0 * k->nb[2],
                        (const char *)v->data + b * v->nb[3] + c0 * v->nb[2], c1 - c0, S, (c1 - c0 + 15) / 16 * 16,
                        pm, NULL);
            parts[i] = pm;
        }
        decode_merge(dst, a, t, b, parts, nth);
    }
}

bool toy_cpu_attention_fusable(const struct toy_tensor *dst) {
    toy_cpu_init();
    const struct toy_tensor *q = dst->src[0], *k = dst->src[1], *v = dst->src[2];
    if (dst->op != TOY_OP_ATTENTION || !dst->op_params[P_AT_DYNKV] || dst->op_params[P_AT_SEG] || q->ne[2] != 1 ||
        q->ne[3] != 1 || q->src[0]->ne[2] != 1 || k->src[1]->ne[2] != 1 || dst->src[3] != k->src[2] ||
        k->src[1]->ne[0] != q->ne[0] || v->src[1]->ne[0] != q->ne[0] || k->src[1]->ne[1] != k->ne[1] ||
        v->src[1]->ne[1] != v->ne[1] || v->src[1]->type != TOY_F32 || v->src[1]->nb[0] != sizeof(float))
        return false;
    struct attn a = {.D = q->ne[0], .Hq = q->ne[1], .Tq = 1, .B = 1, .Hkv = k->ne[1]};
    return !wide(a.D) && decode_step_ok(&a, k, v); /* the wide heads' products have no prologue */
}

/* The general path: query blocks against key blocks, over q, k and v (dst's sources, or one row's views of them
 * for toy_attention_rows) into dst's rows and the log-sum-exps lse */
static void general(struct toy_tensor *dst, const struct toy_tensor *q, const struct toy_tensor *k,
                   const struct toy_tensor *v, struct attn a, float *lse, int ith, int nth, void *work, size_t ws) {
    a.pack = sgemm_pack(work, ws, ith, nth);
    float *S = toy_work_slice((char *)work + TOY_WORK_HEAD, ws - TOY_WORK_HEAD, ith, nth);
    float *kvs = S + 3 * QB * k->ne[2] + 2 * QB + QB * q->ne[0]; /* f16 rows converted (see _work) */
    struct rows32 kr, vr;
    rows32_init(&kr, k, kvs);
    rows32_init(&vr, v, kvs + k->ne[2] * k->ne[0]);
    const float *sinks = dst->src[5] ? dst->src[5]->data : NULL;
    size_t room = slice_room(ws, nth);
    struct bf bfs, *f = bf_init(&bfs, dst, k, v, a.D, a.Tk, S, room) ? &bfs : NULL;
    /* A causal block sees more keys the later it is, so an item is a block
     * from the front with its mirror from the back (the middle one alone):
     * items cost alike, and the threads' runs of them are balanced. */
    int64_t nblk = (a.Tq + QB - 1) / QB, npair = (nblk + 1) / 2;
    int64_t items = a.B * a.Hq * npair, w0, w1;
    toy_split(items, ith, nth, &w0, &w1);
    for (int64_t s = 2 * w0; s < 2 * w1; s++) { /* item s / 2, its front block then its back one */
        int64_t w = s / 2, side = s % 2;
        int64_t pr = w % npair, h = (w / npair) % a.Hq, b = w / (npair * a.Hq);
        if (side && 2 * pr + 1 == nblk) continue; /* the middle block: one side */
        int64_t blk = side ? nblk - 1 - pr : pr;
        int64_t tb = blk * QB, tend = a.Tq - tb < QB ? a.Tq : tb + QB;
        for (int64_t t0 = tb, t1; t0 < tend; t0 = t1) { /* runs of one segment (the block when unsegmented) */
            t1 = run_end(&a, b, t0, tend);
            int64_t nq = t1 - t0, js, je;
            block_keys(&a, b, t0, nq, &js, &je);
            float *O = QROW(dst, h, t0, b);
            int ldo = (int)(dst->nb[2] / 4);
            if (je - js <= 0) {
                for (int64_t i = 0; i < nq; i++) {
                    memset(O + i * ldo, 0, (size_t)a.D * 4);
                    lse[(b * a.Tq + t0 + i) * a.Hq + h] = sinks ? sinks[h] : -INFINITY; /* the sink alone */
                }
                continue;
            }
            if (f) {
                js = js / 32 * 32; /* the keys in front are masked (see struct bf) */
                bf_pack_kv(f, k, v, h / a.group, b, a.Tk, false);
            }
            int64_t nk = je - js;
            block_scores(&a, q, k, h, b, t0, nq, js, je, S, nk, &kr, f);
            for (int64_t i = 0; i < nq; i++) {
                float *s = S + i * nk;
                float mx = toy_vec.max(s, nk);
                if (sinks && sinks[h] > mx) mx = sinks[h];
                float sum = mx == -INFINITY ? 0 : toy_vec.exp_sum(s, s, mx, nk);
                if (sinks) sum += expf(sinks[h] - mx); /* one more key, of value zero */
                if (sum > 0) toy_vec.scale(s, s, 1.0f / sum, nk);
                else memset(s, 0, (size_t)nk * 4);
                lse[(b * a.Tq + t0 + i) * a.Hq + h] = sum > 0 ? mx + logf(sum) : -INFINITY;
            }
            if (f) {
                int64_t kp = round_up(nk, 32);
                bf_a(f, S, nk, false, nq, nk, kp, f->Ab);
                f->kern(nq, a.D, kp, f->Ab, f->Vk + js * 16, f->pe_k, O, ldo, 0.0f);
                continue;
            }
            int ldv;
            const float *V = rows32_get(&vr, h / a.group, js, je, b, &ldv);
            if (nq == 1 && decode_kernels(a.D))
                decode_ops()->values(S, V, ldv, nk, a.D, O);
            else
                toy_cpu_sgemm(false, false, nq, a.D, nk, 1.0f, S, nk, V, ldv, 0.0f, O, ldo, a.pack);
        }
    }
}

/* ---- query rows of many sequences (toy_attention_rows) ----
 * Row r is a decode step of sequence seq[r] at position pos[r]. Where the
 * decode kernels take the heads, its keys are split in the shares a decode
 * step's nth threads take (split_keys), and a (row, share) is a unit of
 * work: the units are dealt to the threads by their keys, so rows of long and
 * short sequences balance, and the last thread out merges each row's shares
 * as a decode step merges them, so each row gets a decode step's bits.
 * Elsewhere each row runs the general path on views of its query,
 * its sequence's keys and values, and its output, as a one-query attention
 * over that sequence would. */

struct rows_at {
    const int32_t *pos, *seq;
    int64_t R, Tmax, S;
};

static struct rows_at rows_at(const struct toy_tensor *dst) {
    const struct toy_tensor *k = dst->src[1];
    return (struct rows_at){dst->src[3]->data, dst->src[4]->data, dst->src[0]->ne[2], k->ne[2], k->ne[3]};
}

/* row r as a one-query decode of its sequence: keys [0, pos] */
static struct attn row_attn(const struct attn *a, const struct rows_at *ra, int64_t r) {
    struct attn x = *a;
    x.Tq = x.B = 1;
    x.Tk = ra->pos[r] + 1;
    x.off = ra->pos[r];
    return x;
}

static bool rows_fast(const struct attn *a, const struct toy_tensor *k, const struct toy_tensor *v) {
    struct attn one = *a;
    one.Tq = 1;
    return a->Hq <= 256 && decode_step_ok(&one, k, v);
}


static void rows_attention(struct toy_tensor *dst, int ith, int nth, void *work, size_t ws) {
    const struct toy_tensor *q = dst->src[0], *k = dst->src[1], *v = dst->src[2];
    const struct rows_at ra = rows_at(dst);
    for (int64_t r = 0; r < ra.R; r++)
        if (ra.pos[r] < 0 || ra.pos[r] >= ra.Tmax || ra.seq[r] < 0 || ra.seq[r] >= ra.S) {
            if (ith == 0) dst->op_params[TOY_MAX_OP_PARAMS - 1] = 1; /* as KV_STORE flags it */
            return;
        }
    struct attn a = attn_shape(q, k, dst);
    const int64_t D = a.D, Hq = a.Hq;
    float *lse = (float *)((char *)dst->data + toy_nbytes(dst));
    if (!rows_fast(&a, k, v)) {
        for (int64_t r = 0; r < ra.R; r++) {
            struct toy_tensor qr = *q, kr = *k, vr = *v, dr = *dst;
            qr.data = (char *)q->data + r * q->nb[2];
            dr.data = (char *)dst->data + r * dst->nb[2];
            kr.data = (char *)k->data + ra.seq[r] * k->nb[3];
            vr.data = (char *)v->data + ra.seq[r] * v->nb[3];
            qr.ne[2] = dr.ne[2] = 1;
            kr.ne[3] = vr.ne[3] = 1;
            general(&dr, &qr, &kr, &vr, row_attn(&a, &ra, r), lse + r * Hq, ith, nth, work, ws);
        }
        return;
    }
    char *base = (char *)work + TOY_WORK_HEAD;
    float *shares = (float *)base;
    const size_t unit = (size_t)(Hq * (D + 2));
    float *qs = (float *)(base + rows_shares_bytes(ra.R, Hq, D, nth) + (size_t)ith * rows_thread_bytes(Hq, D, ra.Tmax));
    float *S = qs + Hq * D, *tmp = S + Hq * ((ra.Tmax + 15) / 16 * 16 + 16);
    /* the units' keys, each with a share of fixed cost, and this thread's part of their sum */
    int64_t total = 0;
    for (int64_t r = 0; r < ra.R; r++) {
        struct attn x = row_attn(&a, &ra, r);
        for (int i = 0; i < nth; i++) {
            int64_t c0, c1;
            split_keys(&x, 0, i, nth, &c0, &c1);
            total += c1 - c0 + 32;
        }
    }
    int64_t lo = total * ith / nth, hi = total * (ith + 1) / nth, at = 0, scaled = -1;
    for (int64_t r = 0; r < ra.R; r++) {
        struct attn x = row_attn(&a, &ra, r);
        const char *K = (const char *)k->data + ra.seq[r] * k->nb[3], *V = (const char *)v->data + ra.seq[r] * v->nb[3];
        for (int i = 0; i < nth; i++) {
            int64_t c0, c1;
            split_keys(&x, 0, i, nth, &c0, &c1);
            int64_t mid = at + (c1 - c0 + 32) / 2; /* a unit is the thread's whose part holds its middle */
            at += c1 - c0 + 32;
            if (mid < lo || mid >= hi) continue;
            if (scaled != r && c1 > c0) {
                for (int64_t h = 0; h < Hq; h++) toy_vec.scale(qs + h * D, QROW(q, h, r, 0), a.scale, D);
                scaled = r;
            }
            decode_part(&x, k, v, qs, K + c0 * k->nb[2], V + c0 * v->nb[2], c1 - c0, S, (c1 - c0 + 15) / 16 * 16,
                        shares + (size_t)(r * nth + i) * unit, tmp);
        }
    }
    if (!toy_last_thread((atomic_int *)&dst->op_params[TOY_MAX_OP_PARAMS - 2], nth)) return;
    struct attn m = a; /* the rows as one sequence's queries, for the output's and lse's indexing */
    m.B = 1;
    const float *parts[nth];
    for (int64_t r = 0; r < ra.R; r++) {
        for (int i = 0; i < nth; i++) parts[i] = shares + (size_t)(r * nth + i) * unit;
        decode_merge(dst, &m, r, 0, parts, nth);
    }
}

void toy_cpu_attention(struct toy_tensor *dst, int ith, int nth, void *work, size_t ws) {
    const struct toy_tensor *q = dst->src[0], *k = dst->src[1], *v = dst->src[2];
    if (dst->op_params[P_AT_ROWS]) {
        rows_attention(dst, ith, nth, work, ws);
        return;
    }
    struct attn a = attn_shape(q, k, dst);
    if (decode_step_ok(&a, k, v)) {
        decode_step(dst, &a, ith, nth, work, ws);
        return;
    }
    TOY_ASSERT(!dst->op_params[P_AT_FUSED], "attention '%s': fused, but not a decode step", toy_label(dst));
    if (a.Hq <= 256 && few_queries_ok(&a, dst, k, v)) {
        few_queries(dst, &a, ith, nth, work, ws);
        return;
    }
    general(dst, q, k, v, a, (float *)((char *)dst->data + toy_nbytes(dst)), ith, nth, work, ws);
}

/* The backward's products of one block in bf16 (struct bf): P (nq x nk,
 * probabilities), dP (nq x nk scratch), Di = rowsum(dO * O), C = s / cap
 * of capped scores; dK and dV at the block's first key js; the block's
 * dQ rows are written, dK and dV rows added to */
static void bf_back(struct bf *f, const struct attn *a, const float *P, float *dP, const float *Di, const float *C,
                    int64_t nq, int64_t nk, const float *dO, int64_t lddO, const float *Q, int64_t ldQ, float *dQ,
                    int64_t ldq, float *dK, float *dV, int64_t ldk, int64_t js) {
    int64_t D = a->D, kq = round_up(nq, 32), kp = round_up(nk, 32);
    /* dV += P^T dO */
    bf_a(f, P, nk, true, nk, nq, kq, f->At);
    bf_b_k(dO, lddO, nq, D, kq, f->Bq);
    f->kern(nk, D, kq, f->At, f->Bq, 16 * kq, dV, ldk, 1.0f);
    /* dP = dO V^T */
    bf_a(f, dO, lddO, false, nq, D, f->kpD, f->A);
    f->kern(nq, nk, f->kpD, f->A, f->Vn + js * f->kpD, f->pe_n, dP, nk, 0.0f);
    /* dS = scale P (dP - Di), through the softcap; rounded once for both products below */
    for (int64_t i = 0; i < nq; i++) {
        const float *p = P + i * nk;
        float *d = dP + i * nk;
        toy_vec.softmax_back(d, p, Di[i], a->scale, nk);
        if (a->cap > 0)
            for (int64_t j = 0; j < nk; j++)
                if (isfinite(C[i * nk + j])) d[j] *= 1.0f - C[i * nk + j] * C[i * nk + j];
    }
    /* dQ = dS K;  dK += dS^T Q */
    bf_a(f, dP, nk, false, nq, nk, kp, f->Ab);
    f->kern(nq, D, kp, f->Ab, f->Kk + js * 16, f->pe_k, dQ, ldq, 0.0f);
    bf_a(f, dP, nk, true, nk, nq, kq, f->At);
    bf_b_k(Q, ldQ, nq, D, kq, f->Bq);
    f->kern(nk, D, kq, f->At, f->Bq, 16 * kq, dK, ldk, 1.0f);
}

void toy_cpu_attention_back(struct toy_tensor *dst, int ith, int nth, void *work, size_t ws) {
    const struct toy_tensor *dO = dst->src[0], *q = dst->src[1], *k = dst->src[2], *v = dst->src[3],
                            *o = dst->src[4];
    struct attn a = attn_shape(q, k, dst);
    TOY_ASSERT(k->type == TOY_F32 && v->type == TOY_F32, "attention backward '%s': K and V must be f32", toy_label(dst));
    a.pack = sgemm_pack(work, ws, ith, nth);
    const float *lse = (const float *)((const char *)o->data + toy_nbytes(o));
    float *P = toy_work_slice((char *)work + TOY_WORK_HEAD, ws - TOY_WORK_HEAD, ith, nth);
    float *dP = P + QB * a.Tk;
    float *Di = dP + QB * a.Tk;
    float *C = Di + 2 * QB;                      /* s / cap of the capped scores */
    size_t room = slice_room(ws, nth);
    struct bf bfs, *f = bf_init(&bfs, dst, k, v, a.D, a.Tk, P, room) ? &bfs : NULL;
    float *dq = dst->data;                       /* {D, Hq, Tq, B} contiguous */
    float *dk = dq + toy_nelements(q);           /* {D, Hkv, Tk, B} contiguous */
    float *dv = dk + toy_nelements(k);
    int64_t ldq = a.D * a.Hq, ldk = a.D * a.Hkv;
    int64_t nblk = (a.Tq + QB - 1) / QB;
    int64_t items = a.B * a.Hkv, w0, w1;
    toy_split(items, ith, nth, &w0, &w1);
    struct rows32 kr; /* the backward's K is f32: read in place */
    rows32_init(&kr, k, NULL);
    for (int64_t w = w0; w < w1; w++) {
        int64_t g = w % a.Hkv, b = w / a.Hkv;
        float *dK = dk + b * a.Tk * ldk + g * a.D, *dV = dv + b * a.Tk * ldk + g * a.D;
        for (int64_t t = 0; t < a.Tk; t++) {
            memset(dK + t * ldk, 0, (size_t)a.D * 4);
            memset(dV + t * ldk, 0, (size_t)a.D * 4);
        }
        const float *K = QROW(k, g, 0, b), *V = QROW(v, g, 0, b);
        int ldK = (int)(k->nb[2] / 4), ldV = (int)(v->nb[2] / 4);
        for (int64_t h = g * a.group; h < (g + 1) * a.group; h++) {
            for (int64_t blk = 0; blk < nblk; blk++) {
                int64_t tb = blk * QB, tend = a.Tq - tb < QB ? a.Tq : tb + QB;
                for (int64_t t0 = tb, t1; t0 < tend; t0 = t1) {
                    t1 = run_end(&a, b, t0, tend);
                    int64_t nq = t1 - t0, js, je;
                    float *dQ = dq + (b * a.Tq + t0) * ldq + h * a.D;
                    block_keys(&a, b, t0, nq, &js, &je);
                    if (je - js <= 0) {
                        for (int64_t i = 0; i < nq; i++) memset(dQ + i * ldq, 0, (size_t)a.D * 4);
                        continue;
                    }
                    if (f) {
                        js = js / 32 * 32; /* the keys in front are masked (see struct bf) */
                        bf_pack_kv(f, k, v, g, b, a.Tk, true);
                    }
                    int64_t nk = je - js;
                    block_scores(&a, q, k, h, b, t0, nq, js, je, P, nk, &kr, f);
                    if (a.cap > 0)
                        for (int64_t i = 0; i < nq * nk; i++) C[i] = P[i] / a.cap;
                    const float *dOb = QROW(dO, h, t0, b);
                    const float *Ob = QROW(o, h, t0, b);
                    int lddO = (int)(dO->nb[2] / 4), ldO = (int)(o->nb[2] / 4);
                    /* P = exp(S - lse); Di = rowsum(dO * O) */
                    for (int64_t i = 0; i < nq; i++) {
                        float l = lse[(b * a.Tq + t0 + i) * a.Hq + h];
                        float *p = P + i * nk;
                        if (l == -INFINITY) memset(p, 0, (size_t)nk * 4);
                        else toy_vec.exp_sum(p, p, l, nk);
                        Di[i] = toy_vec.dot(dOb + i * lddO, Ob + i * ldO, a.D);
                    }
                    if (f) {
                        bf_back(f, &a, P, dP, Di, C, nq, nk, dOb, lddO, QROW(q, h, t0, b), (int64_t)(q->nb[2] / 4),
                                dQ, ldq, dK + js * ldk, dV + js * ldk, ldk, js);
                        continue;
                    }
                    /* dV[js:je] += P^T dO */
                    toy_cpu_sgemm(true, false, nk, a.D, nq, 1.0f, P, nk, dOb, lddO, 1.0f, dV + js * ldk, ldk, a.pack);
                    /* dP = dO V^T */
                    toy_cpu_sgemm(false, true, nq, nk, a.D, 1.0f, dOb, lddO, V + js * ldV, ldV, 0.0f, dP, nk, a.pack);
                    /* dS = P (dP - Di), through the softcap: d raw = dS (1 - (s/c)^2) */
                    for (int64_t i = 0; i < nq; i++) {
                        float *p = P + i * nk, *d = dP + i * nk;
                        toy_vec.softmax_back(d, p, Di[i], 1.0f, nk);
                        if (a.cap > 0)
                            for (int64_t j = 0; j < nk; j++)
                                if (isfinite(C[i * nk + j])) d[j] *= 1.0f - C[i * nk + j] * C[i * nk + j];
                    }
                    /* dQ = scale dS K;  dK += scale dS^T Q */
                    toy_cpu_sgemm(false, false, nq, a.D, nk, a.scale, dP, nk, K + js * ldK, ldK, 0.0f, dQ, ldq, a.pack);
                    toy_cpu_sgemm(true, false, nk, a.D, nq, a.scale, dP, nk, QROW(q, h, t0, b), (int64_t)(q->nb[2] / 4),
                                  1.0f, dK + js * ldk, ldk, a.pack);
                }
            }
        }
    }
}

/* The sinks' gradient (ATTN_SINKS_BACK: dO, the forward ATTENTION, the
 * sinks): a sink's weight in row r is exp(s_h - lse_r) and its value is
 * zero, so d s_h = -sum over the rows of head h of exp(s_h - lse_r) Di_r,
 * Di_r = rowsum(dO O) (as in the backward of any softmax weight). */
void toy_cpu_attn_sinks_back(struct toy_tensor *dst, int ith, int nth) {
    const struct toy_tensor *dO = dst->src[0], *o = dst->src[1];
    const float *sinks = dst->src[2]->data, *lse = (const float *)((const char *)o->data + toy_nbytes(o));
    const int64_t D = o->ne[0], Hq = o->ne[1], rows = o->ne[2] * o->ne[3];
    int64_t h0, h1;
    toy_split(Hq, ith, nth, &h0, &h1);
    for (int64_t h = h0; h < h1; h++) {
        double acc = 0;
        for (int64_t r = 0; r < rows; r++) {
            int64_t t = r % o->ne[2], b = r / o->ne[2];
            const float *y = (const float *)((const char *)o->data + h * o->nb[1] + t * o->nb[2] + b * o->nb[3]);
            const float *g = (const float *)((const char *)dO->data + h * dO->nb[1] + t * dO->nb[2] + b * dO->nb[3]);
            acc += (double)expf(sinks[h] - lse[r * Hq + h]) * (double)toy_vec.dot(g, y, D);
        }
        ((float *)dst->data)[h] = (float)-acc;
    }
}
