/* ops.c: op constructors. Each checks shapes and dtypes (aborting with
 * file:line on a programming error), creates the result tensor (no data: the
 * planner places it) and records its sources and parameters. The kernels are
 * in src/backends/cpu/, the gradients in src/core/autodiff.c. */
#include <math.h>
#include <stdio.h>

#include "core/internal.h"
#include "toy/quant.h"

static const char *const op_names[] = {
#define TOY_X_NAME(n) #n,
    TOY_OP_LIST(TOY_X_NAME)
#undef TOY_X_NAME
};

const char *toy_op_name(enum toy_op op) {
    return (unsigned)op < TOY_OP_COUNT ? op_names[op] : "?";
}

#include <stdarg.h>

/* Aborts naming the op, the operands (name and shape) and the problem. */
__attribute__((format(printf, 6, 7))) static _Noreturn void
check_fail(const char *file, int line, const char *op, const struct toy_tensor *a,
           const struct toy_tensor *b, const char *fmt, ...) {
    char msg[256], sa[96] = "", sb[96] = "";
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (a) toy_shape_str(a, sa, sizeof sa);
    if (b) toy_shape_str(b, sb, sizeof sb);
    toy_abort(file, line, "%s: %s %s%s%s %s: %s", op, a && a->name[0] ? a->name : "a", sa, b ? ", " : "",
              b ? (b->name[0] ? b->name : "b") : "", sb, msg);
}

#define CHECK(cond, op, a, b, ...)                                                 \
    do {                                                                           \
        if (!(cond)) check_fail(__FILE__, __LINE__, op, a, b, __VA_ARGS__);        \
    } while (0)

/* A NULL operand is a caller's error (often an earlier call that failed and
 * returned NULL): named, rather than a segfault inside the op. */
#define NEED(op, x)                                                                                     \
    do {                                                                                                \
        if (!(x)) toy_abort(__FILE__, __LINE__, "%s: argument '%s' is NULL (did the call that made it fail?)", \
                            op, #x);                                                                    \
    } while (0)

static struct toy_tensor *new_result(struct toy_ctx *ctx, enum toy_op op, enum toy_dtype type,
                                     const int64_t *ne) {
    struct toy_tensor *t = toy_tensor_alloc_meta(ctx, type, 4, ne);
    int nd = 4;
    while (nd > 1 && ne[nd - 1] == 1) nd--;
    t->n_dims = nd;
    t->op = op;
    return t;
}

static struct toy_tensor *like(struct toy_ctx *ctx, enum toy_op op, const struct toy_tensor *a) {
    return new_result(ctx, op, TOY_F32, a->ne);
}

static bool is_float(const struct toy_tensor *t) { return t->type == TOY_F32; }

/* Row-contiguous: elements of a row are adjacent (rows may be strided). */
static bool rows_contiguous(const struct toy_tensor *t) {
    return t->nb[0] == toy_dtype_type_size(t->type) || t->ne[0] == 1;
}

static struct toy_tensor *need_rows(struct toy_ctx *ctx, struct toy_tensor *a) {
    return rows_contiguous(a) ? a : toy_cont(ctx, a);
}

struct toy_tensor *toy_cont(struct toy_ctx *ctx, struct toy_tensor *a) {
    NEED("cont", a);
    struct toy_tensor *t = new_result(ctx, TOY_OP_CONT, a->type, a->ne);
    CHECK(toy_dtype_block_size(a->type) == 1, "cont", a, NULL, "block types cannot be copied");
    t->src[0] = a;
    return t;
}

struct toy_tensor *toy_cast(struct toy_ctx *ctx, struct toy_tensor *a, enum toy_dtype type) {
    NEED("cast", a);
    CHECK(type == TOY_F32 || type == TOY_F16 || type == TOY_BF16, "cast", a, NULL,
          "to %s unsupported", toy_dtype_name(type));
    CHECK(a->type == TOY_F32 || a->type == TOY_F16 || a->type == TOY_BF16 ||
              toy_dtype_block_size(a->type) > 1,
          "cast", a, NULL, "from %s unsupported", toy_dtype_name(a->type));
    struct toy_tensor *t = new_result(ctx, TOY_OP_CAST, type, a->ne);
    t->src[0] = a;
    return t;
}

/* ---- elementwise ------------------------------------------------------------ */

static struct toy_tensor *binary(struct toy_ctx *ctx, enum toy_op op, struct toy_tensor *a,
                                 struct toy_tensor *b) {
    NEED(toy_op_name(op), a);
    NEED(toy_op_name(op), b);
    CHECK(is_float(a) && is_float(b), toy_op_name(op), a, b, "f32 only");
    for (int i = 0; i < 4; i++)
        CHECK(b->ne[i] == 1 || b->ne[i] == a->ne[i], toy_op_name(op), a, b,
              "b does not broadcast to a in dim %d", i);
    struct toy_tensor *t = like(ctx, op, a);
    t->src[0] = a;
    t->src[1] = b;
    return t;
}

struct toy_tensor *toy_add(struct toy_ctx *ctx, struct toy_tensor *a, struct toy_tensor *b) {
    return binary(ctx, TOY_OP_ADD, a, b);
}
struct toy_tensor *toy_sub(struct toy_ctx *ctx, struct toy_tensor *a, struct toy_tensor *b) {
    return binary(ctx, TOY_OP_SUB, a, b);
}
struct toy_tensor *toy_mul(struct toy_ctx *ctx, struct toy_tensor *a, struct toy_tensor *b) {
    return binary(ctx, TOY_OP_MUL, a, b);
}
struct toy_tensor *toy_div(struct toy_ctx *ctx, struct toy_tensor *a, struct toy_tensor *b) {
    return binary(ctx, TOY_OP_DIV, a, b);
}

static struct toy_tensor *unary(struct toy_ctx *ctx, enum toy_op op, struct toy_tensor *a) {
    NEED(toy_op_name(op), a);
    CHECK(is_float(a), toy_op_name(op), a, NULL, "f32 only");
    struct toy_tensor *t = like(ctx, op, a);
    t->src[0] = a;
    return t;
}

struct toy_tensor *toy_scale(struct toy_ctx *ctx, struct toy_tensor *a, float s) {
    struct toy_tensor *t = unary(ctx, TOY_OP_SCALE, a);
    toy_param_f32_set(t, P_SCALE, s);
    return t;
}
struct toy_tensor *toy_sqr(struct toy_ctx *ctx, struct toy_tensor *a) { return unary(ctx, TOY_OP_SQR, a); }
struct toy_tensor *toy_sqrt(struct toy_ctx *ctx, struct toy_tensor *a) { return unary(ctx, TOY_OP_SQRT, a); }
struct toy_tensor *toy_neg(struct toy_ctx *ctx, struct toy_tensor *a) { return unary(ctx, TOY_OP_NEG, a); }
struct toy_tensor *toy_tanh(struct toy_ctx *ctx, struct toy_tensor *a) { return unary(ctx, TOY_OP_TANH, a); }
struct toy_tensor *toy_silu(struct toy_ctx *ctx, struct toy_tensor *a) { return unary(ctx, TOY_OP_SILU, a); }
struct toy_tensor *toy_gelu(struct toy_ctx *ctx, struct toy_tensor *a) { return unary(ctx, TOY_OP_GELU, a); }

struct toy_tensor *toy_swiglu(struct toy_ctx *ctx, struct toy_tensor *gate, struct toy_tensor *up) {
    NEED("swiglu", gate);
    NEED("swiglu", up);
    CHECK(is_float(gate) && is_float(up) && toy_same_shape(gate, up), "swiglu", gate, up,
          "gate and up must be f32 of one shape");
    struct toy_tensor *t = like(ctx, TOY_OP_SWIGLU, gate);
    t->src[0] = gate;
    t->src[1] = up;
    return t;
}

struct toy_tensor *toy_swiglu_oai(struct toy_ctx *ctx, struct toy_tensor *gate, struct toy_tensor *up, float alpha,
                                  float limit) {
    NEED("swiglu_oai", gate);
    NEED("swiglu_oai", up);
    CHECK(is_float(gate) && is_float(up) && toy_same_shape(gate, up), "swiglu_oai", gate, up,
          "gate and up must be f32 of one shape");
    CHECK(isfinite(alpha), "swiglu_oai", gate, up, "alpha must be finite (got %g)", (double)alpha);
    CHECK(!isnan(limit), "swiglu_oai", gate, up, "limit is NaN (0 or less: no clamping)");
    /* its own op, not SWIGLU: graph-fuse.c folds SWIGLU into matmul prologues, which know no clamp */
    struct toy_tensor *t = like(ctx, TOY_OP_SWIGLU_OAI, gate);
    t->src[0] = gate;
    t->src[1] = up;
    toy_param_f32_set(t, P_SWO_ALPHA, alpha);
    toy_param_f32_set(t, P_SWO_LIMIT, limit);
    return t;
}

/* ---- matmul ------------------------------------------------------------------ */

struct toy_tensor *toy_matmul(struct toy_ctx *ctx, struct toy_tensor *a, struct toy_tensor *b,
                              bool trans_a, bool trans_b) {
    NEED("matmul", a);
    NEED("matmul", b);
    CHECK(a->type == TOY_F32, "matmul", a, b, "A must be f32");
    CHECK(toy_dtype_valid(b->type), "matmul", a, b, "bad B type");
    CHECK(b->type == TOY_F32 || b->type == TOY_F16 || b->type == TOY_BF16 || toy_can_dequantize(b->type), "matmul",
          a, b, "B of type %s cannot be read (no kernel dequantizes it)", toy_dtype_name(b->type));
    a = need_rows(ctx, a);
    if (toy_dtype_block_size(b->type) == 1) b = need_rows(ctx, b);
    CHECK(rows_contiguous(b), "matmul", a, b, "quantized B must have contiguous rows");
    int64_t m = trans_a ? a->ne[0] : a->ne[1];
    int64_t k = trans_a ? a->ne[1] : a->ne[0];
    int64_t kb = trans_b ? b->ne[0] : b->ne[1];
    int64_t n = trans_b ? b->ne[1] : b->ne[0];
    CHECK(k == kb, "matmul", a, b, "inner dims %lld vs %lld", (long long)k, (long long)kb);
    int64_t ne[4] = {n, m, 1, 1};
    for (int i = 2; i < 4; i++) {
        int64_t x = a->ne[i], y = b->ne[i];
        CHECK(x % y == 0 || y % x == 0, "matmul", a, b, "batch dim %d does not broadcast", i);
        ne[i] = x > y ? x : y;
    }
    struct toy_tensor *t = new_result(ctx, TOY_OP_MATMUL, TOY_F32, ne);
    t->src[0] = a;
    t->src[1] = b;
    t->op_params[P_MM_TRANS_A] = trans_a;
    t->op_params[P_MM_TRANS_B] = trans_b;
    return t;
}

struct toy_tensor *toy_linear(struct toy_ctx *ctx, struct toy_tensor *x, struct toy_tensor *w,
                              struct toy_tensor *bias) {
    return toy_linear_bf16(ctx, x, w, bias, false);
}

struct toy_tensor *toy_linear_bf16(struct toy_ctx *ctx, struct toy_tensor *x, struct toy_tensor *w,
                                   struct toy_tensor *bias, bool bf16) {
    NEED("linear", x);
    NEED("linear", w);
    CHECK(x->ne[0] == w->ne[0], "linear", x, w, "in features differ");
    CHECK(w->ne[2] == 1 && w->ne[3] == 1, "linear", x, w, "weight must be 2-D");
    struct toy_tensor *x2 = x;
    bool flat = toy_is_contiguous(x) && (x->ne[2] > 1 || x->ne[3] > 1);
    if (flat) x2 = toy_reshape_2d(ctx, x, x->ne[0], toy_nrows(x));
    struct toy_tensor *y = toy_matmul(ctx, x2, w, false, true);
    if (bf16 && y) y->op_params[P_MM_BF16] = 1;
    if (flat) y = toy_reshape_4d(ctx, y, w->ne[1], x->ne[1], x->ne[2], x->ne[3]);
    if (bias) {
        CHECK(bias->ne[0] == w->ne[1] && toy_nelements(bias) == bias->ne[0], "linear", bias, w,
              "bias must be (out)");
        y = toy_add(ctx, y, bias);
    }
    return y;
}

/* ---- indexing, reductions ------------------------------------------------------- */

struct toy_tensor *toy_get_rows(struct toy_ctx *ctx, struct toy_tensor *table,
                                struct toy_tensor *ids) {
    NEED("get_rows", table);
    NEED("get_rows", ids);
    CHECK(ids->type == TOY_I32, "get_rows", table, ids, "ids must be i32");
    CHECK(table->type == TOY_F32 || table->type == TOY_F16 || table->type == TOY_BF16 ||
              toy_can_dequantize(table->type),
          "get_rows", table, ids, "a table of type %s cannot be read (no kernel dequantizes it)",
          toy_dtype_name(table->type));
    CHECK(table->ne[2] == 1 && table->ne[3] == 1, "get_rows", table, ids, "table must be 2-D");
    CHECK(ids->ne[3] == 1, "get_rows", table, ids, "ids up to 3-D");
    int64_t ne[4] = {table->ne[0], ids->ne[0], ids->ne[1], ids->ne[2]};
    struct toy_tensor *t = new_result(ctx, TOY_OP_GET_ROWS, TOY_F32, ne);
    t->src[0] = table;
    t->src[1] = ids;
    return t;
}

static struct toy_tensor *reduce_dim(struct toy_ctx *ctx, enum toy_op op, struct toy_tensor *a, int dim) {
    NEED(toy_op_name(op), a);
    CHECK(is_float(a) && dim >= 0 && dim < 4, toy_op_name(op), a, NULL, "dim %d", dim);
    int64_t ne[4] = {a->ne[0], a->ne[1], a->ne[2], a->ne[3]};
    ne[dim] = 1;
    struct toy_tensor *t = new_result(ctx, op, TOY_F32, ne);
    t->src[0] = a;
    t->op_params[P_DIM] = dim;
    return t;
}

struct toy_tensor *toy_sum(struct toy_ctx *ctx, struct toy_tensor *a, int dim) {
    return reduce_dim(ctx, TOY_OP_SUM, a, dim);
}
struct toy_tensor *toy_mean(struct toy_ctx *ctx, struct toy_tensor *a, int dim) {
    return reduce_dim(ctx, TOY_OP_MEAN, a, dim);
}

struct toy_tensor *toy_sum_all(struct toy_ctx *ctx, struct toy_tensor *a) {
    NEED("sum_all", a);
    CHECK(is_float(a), "sum_all", a, NULL, "f32 only");
    struct toy_tensor *t = new_result(ctx, TOY_OP_SUM_ALL, TOY_F32, (int64_t[]){1, 1, 1, 1});
    t->src[0] = a;
    return t;
}

struct toy_tensor *toy_repeat(struct toy_ctx *ctx, struct toy_tensor *a, struct toy_tensor *shape) {
    NEED("repeat", a);
    NEED("repeat", shape);
    for (int i = 0; i < 4; i++)
        CHECK(a->ne[i] == 1 || a->ne[i] == shape->ne[i], "repeat", a, shape, "dim %d", i);
    struct toy_tensor *t = new_result(ctx, TOY_OP_REPEAT, TOY_F32, shape->ne);
    t->src[0] = a;
    return t;
}

struct toy_tensor *toy_sum_to(struct toy_ctx *ctx, struct toy_tensor *a, struct toy_tensor *shape) {
    NEED("sum_to", a);
    NEED("sum_to", shape);
    for (int i = 0; i < 4; i++)
        CHECK(shape->ne[i] == 1 || a->ne[i] == shape->ne[i], "sum_to", a, shape, "dim %d", i);
    struct toy_tensor *t = new_result(ctx, TOY_OP_SUM_TO, TOY_F32, shape->ne);
    t->src[0] = a;
    return t;
}

struct toy_tensor *toy_concat(struct toy_ctx *ctx, struct toy_tensor *a, struct toy_tensor *b,
                              int dim) {
    NEED("concat", a);
    NEED("concat", b);
    CHECK(is_float(a) && is_float(b) && dim >= 0 && dim < 4, "concat", a, b, "dim %d", dim);
    int64_t ne[4];
    for (int i = 0; i < 4; i++) {
        CHECK(i == dim || a->ne[i] == b->ne[i], "concat", a, b, "dim %d differs", i);
        ne[i] = i == dim ? a->ne[i] + b->ne[i] : a->ne[i];
    }
    struct toy_tensor *t = new_result(ctx, TOY_OP_CONCAT, TOY_F32, ne);
    t->src[0] = a;
    t->src[1] = b;
    t->op_params[P_DIM] = dim;
    return t;
}

/* ---- norms, softmax -------------------------------------------------------------- */

struct toy_tensor *toy_rms_norm(struct toy_ctx *ctx, struct toy_tensor *x, struct toy_tensor *w,
                                float eps) {
    NEED("rms_norm", x);
    CHECK(is_float(x), "rms_norm", x, w, "f32 only");
    if (w) CHECK(is_float(w) && toy_nelements(w) == x->ne[0], "rms_norm", x, w, "weight must be (ne0)");
    struct toy_tensor *t = like(ctx, TOY_OP_RMS_NORM, x);
    t->src[0] = need_rows(ctx, x);
    t->src[1] = w;
    toy_param_f32_set(t, P_EPS, eps);
    return t;
}

struct toy_tensor *toy_layer_norm(struct toy_ctx *ctx, struct toy_tensor *x, struct toy_tensor *w,
                                  struct toy_tensor *b, float eps) {
    NEED("layer_norm", x);
    CHECK(is_float(x), "layer_norm", x, w, "f32 only");
    if (w) CHECK(is_float(w) && toy_nelements(w) == x->ne[0], "layer_norm", x, w, "weight must be (ne0)");
    if (b) CHECK(is_float(b) && toy_nelements(b) == x->ne[0], "layer_norm", x, b, "bias must be (ne0)");
    struct toy_tensor *t = like(ctx, TOY_OP_LAYER_NORM, x);
    t->src[0] = need_rows(ctx, x);
    t->src[1] = w;
    t->src[2] = b;
    toy_param_f32_set(t, P_EPS, eps);
    return t;
}

struct toy_tensor *toy_softmax(struct toy_ctx *ctx, struct toy_tensor *x, struct toy_tensor *mask,
                               float scale) {
    NEED("softmax", x);
    CHECK(is_float(x), "softmax", x, mask, "f32 only");
    if (mask)
        for (int i = 0; i < 4; i++)
            CHECK(is_float(mask) && (mask->ne[i] == 1 || mask->ne[i] == x->ne[i]), "softmax", x,
                  mask, "mask does not broadcast in dim %d", i);
    struct toy_tensor *t = like(ctx, TOY_OP_SOFTMAX, x);
    t->src[0] = need_rows(ctx, x);
    t->src[1] = mask;
    toy_param_f32_set(t, P_SM_SCALE, scale);
    return t;
}

/* ---- attention, rope -------------------------------------------------------------- */

/* p into attention t of queries q: scale, causal, window, softcap, bf16 products, and the sinks as src[5] */
static void attn_params(struct toy_tensor *t, const struct toy_tensor *q, const struct toy_attn_params *p,
                        const char *op) {
    toy_param_f32_set(t, P_AT_SCALE, p->scale > 0 ? p->scale : 1.0f / sqrtf((float)q->ne[0]));
    t->op_params[P_AT_CAUSAL] = p->causal;
    t->op_params[P_AT_WINDOW] = p->window;
    toy_param_f32_set(t, P_AT_SOFTCAP, p->softcap);
    t->op_params[P_AT_BF16] = p->bf16;
    if (p->sinks) {
        CHECK(p->sinks->type == TOY_F32 && toy_is_contiguous(p->sinks) && toy_nelements(p->sinks) == q->ne[1], op, q,
              p->sinks, "sinks must be contiguous f32 with one value per query head (%lld)", (long long)q->ne[1]);
        t->src[5] = p->sinks;
    }
}

struct toy_tensor *toy_attention(struct toy_ctx *ctx, struct toy_tensor *q, struct toy_tensor *k,
                                 struct toy_tensor *v, const struct toy_attn_params *p) {
    return toy_attention_seg(ctx, q, k, v, NULL, p);
}

struct toy_tensor *toy_attention_seg(struct toy_ctx *ctx, struct toy_tensor *q, struct toy_tensor *k,
                                     struct toy_tensor *v, struct toy_tensor *seg, const struct toy_attn_params *p) {
    NEED("attention", q);
    NEED("attention", k);
    NEED("attention", v);
    NEED("attention", p);
    bool cached16 = k->op == TOY_OP_KV_STORE && k->type == TOY_F16 && v->type == TOY_F16;
    CHECK(is_float(q) && ((is_float(k) && is_float(v)) || cached16), "attention", q, k,
          "f32 (or an f16 KV cache) only");
    CHECK(k->ne[0] == q->ne[0] && v->ne[0] == q->ne[0], "attention", q, k, "head dims differ");
    CHECK(toy_same_shape(k, v), "attention", k, v, "k and v differ");
    CHECK(k->ne[1] > 0 && q->ne[1] % k->ne[1] == 0, "attention", q, k,
          "query heads not a multiple of kv heads");
    CHECK(k->ne[3] == q->ne[3], "attention", q, k, "batch differs");
    CHECK(!p->causal || k->ne[2] >= q->ne[2], "attention", q, k, "causal needs Tk >= Tq");
    struct toy_tensor *t = like(ctx, TOY_OP_ATTENTION, q);
    t->src[0] = need_rows(ctx, q);
    t->src[1] = need_rows(ctx, k);
    t->src[2] = need_rows(ctx, v);
    attn_params(t, q, p, "attention");
    /* log-sum-exp of every query row: (B, Tq, Hq) */
    t->aux_bytes = (size_t)(q->ne[1] * q->ne[2] * q->ne[3]) * sizeof(float);
    if (seg) {
        CHECK(seg->type == TOY_I32 && toy_is_contiguous(seg) && seg->ne[0] == q->ne[2] && seg->ne[1] == q->ne[3] &&
                  toy_nelements(seg) == q->ne[2] * q->ne[3],
              "attention", q, seg, "segment ids must be contiguous i32 {Tq, B}");
        CHECK(k->ne[2] == q->ne[2] && k->op != TOY_OP_KV_STORE, "attention", q, k,
              "segments need Tk == Tq (no KV cache)");
        t->op_params[P_AT_SEG] = 1;
        t->src[4] = seg;
    }
    return t;
}

/* what a KV store asks of its cache: a contiguous f32 or f16 leaf with data */
static void check_cache(const char *op, struct toy_tensor *cache, struct toy_tensor *x) {
    CHECK((cache->type == TOY_F32 || cache->type == TOY_F16) && toy_is_contiguous(cache), op, cache, x,
          "cache must be contiguous f32 or f16");
    CHECK(cache->op == TOY_OP_NONE && cache->data, op, cache, x, "cache must be a leaf with data");
}

struct toy_tensor *toy_kv_store(struct toy_ctx *ctx, struct toy_tensor *cache, struct toy_tensor *x,
                                struct toy_tensor *n_past) {
    NEED("kv_store", cache);
    NEED("kv_store", x);
    NEED("kv_store", n_past);
    check_cache("kv_store", cache, x);
    CHECK(x->ne[0] == cache->ne[0] && x->ne[1] == cache->ne[1] && x->ne[3] == cache->ne[3], "kv_store", cache, x,
          "head dim, heads and batch must match");
    CHECK(n_past->type == TOY_I32 && toy_nelements(n_past) == 1, "kv_store", cache, n_past, "n_past: one i32");
    struct toy_tensor *t = new_result(ctx, TOY_OP_KV_STORE, cache->type, cache->ne);
    t->src[0] = cache;
    t->src[1] = need_rows(ctx, x);
    t->src[2] = n_past;
    return t;
}

struct toy_tensor *toy_attention_cached(struct toy_ctx *ctx, struct toy_tensor *q, struct toy_tensor *k_store,
                                        struct toy_tensor *v_store, struct toy_tensor *n_past,
                                        const struct toy_attn_params *p) {
    NEED("attention_cached", q);
    NEED("attention_cached", k_store);
    NEED("attention_cached", v_store);
    NEED("attention_cached", n_past);
    NEED("attention_cached", p);
    struct toy_attn_params pc = *p;
    pc.causal = true;
    CHECK(k_store->op == TOY_OP_KV_STORE && v_store->op == TOY_OP_KV_STORE, "attention_cached", k_store, v_store,
          "k and v must come from toy_kv_store");
    struct toy_tensor *t = toy_attention(ctx, q, k_store, v_store, &pc);
    t->op_params[P_AT_DYNKV] = 1;
    t->src[3] = n_past;
    return t;
}

static bool rows_index(const struct toy_tensor *t, int64_t R) {
    return t && t->type == TOY_I32 && toy_is_contiguous(t) && toy_nelements(t) == R;
}

struct toy_tensor *toy_kv_store_rows(struct toy_ctx *ctx, struct toy_tensor *cache, struct toy_tensor *x,
                                     struct toy_tensor *seq, struct toy_tensor *pos) {
    NEED("kv_store_rows", cache);
    NEED("kv_store_rows", x);
    NEED("kv_store_rows", seq);
    NEED("kv_store_rows", pos);
    check_cache("kv_store_rows", cache, x);
    CHECK(x->ne[0] == cache->ne[0] && x->ne[1] == cache->ne[1] && x->ne[3] == 1, "kv_store_rows", cache, x,
          "x must be rows {D, H, R, 1} of the cache's head dim and heads");
    CHECK(rows_index(seq, x->ne[2]) && rows_index(pos, x->ne[2]), "kv_store_rows", seq, pos,
          "seq and pos: contiguous i32, one per row of x (%lld)", (long long)x->ne[2]);
    struct toy_tensor *t = new_result(ctx, TOY_OP_KV_STORE, cache->type, cache->ne);
    t->src[0] = cache;
    t->src[1] = need_rows(ctx, x);
    t->src[2] = pos;
    t->src[3] = seq;
    t->op_params[P_KV_ROWS] = 1;
    return t;
}

struct toy_tensor *toy_attention_rows(struct toy_ctx *ctx, struct toy_tensor *q, struct toy_tensor *k_store,
                                      struct toy_tensor *v_store, struct toy_tensor *seq, struct toy_tensor *pos,
                                      const struct toy_attn_params *p) {
    NEED("attention_rows", q);
    NEED("attention_rows", k_store);
    NEED("attention_rows", v_store);
    NEED("attention_rows", seq);
    NEED("attention_rows", pos);
    NEED("attention_rows", p);
    struct toy_tensor *k = k_store, *v = v_store;
    CHECK(k->op == TOY_OP_KV_STORE && v->op == TOY_OP_KV_STORE && k->op_params[P_KV_ROWS] &&
              v->op_params[P_KV_ROWS], "attention_rows", k, v, "k and v must come from toy_kv_store_rows");
    CHECK(is_float(q) && k->type == v->type, "attention_rows", q, k, "f32 queries, k and v caches of one type");
    CHECK(q->ne[3] == 1 && k->ne[0] == q->ne[0], "attention_rows", q, k,
          "q must be rows {D, Hq, R, 1} of the caches' head dim");
    CHECK(toy_same_shape(k, v), "attention_rows", k, v, "k and v differ");
    CHECK(k->ne[1] > 0 && q->ne[1] % k->ne[1] == 0, "attention_rows", q, k, "query heads not a multiple of kv heads");
    CHECK(rows_index(seq, q->ne[2]) && rows_index(pos, q->ne[2]), "attention_rows", seq, pos,
          "seq and pos: contiguous i32, one per row of q (%lld)", (long long)q->ne[2]);
    CHECK(!p->bf16, "attention_rows", q, NULL, "no bf16 products (inference only)");
    struct toy_tensor *t = like(ctx, TOY_OP_ATTENTION, q);
    t->src[0] = need_rows(ctx, q);
    t->src[1] = k;
    t->src[2] = v;
    t->src[3] = pos;
    t->src[4] = seq;
    struct toy_attn_params pc = *p;
    pc.causal = true;
    attn_params(t, q, &pc, "attention_rows");
    t->op_params[P_AT_ROWS] = 1;
    t->aux_bytes = (size_t)(q->ne[1] * q->ne[2]) * sizeof(float); /* each row's log-sum-exps */
    return t;
}

/* ---- mixture of experts --------------------------------------------------------- */

struct toy_tensor *toy_moe_route(struct toy_ctx *ctx, struct toy_tensor *logits, int k, bool norm) {
    return toy_moe_route_scored(ctx, logits, k, norm, false, NULL);
}

struct toy_tensor *toy_moe_route_scored(struct toy_ctx *ctx, struct toy_tensor *logits, int k, bool norm, bool sigmoid,
                                        struct toy_tensor *bias) {
    NEED("moe_route", logits);
    CHECK(!bias || (bias->type == TOY_F32 && toy_is_contiguous(bias) && toy_nelements(bias) == logits->ne[0]),
          "moe_route", bias, logits, "the bias must be contiguous f32 of one value an expert");
    CHECK(is_float(logits) && toy_is_contiguous(logits), "moe_route", logits, NULL, "logits must be contiguous f32");
    CHECK(k >= 1 && k <= logits->ne[0] && k <= 64, "moe_route", logits, NULL,
          "k = %d experts per token: want 1..min(64, E)", k);
    int64_t rows = toy_nrows(logits);
    struct toy_tensor *t = new_result(ctx, TOY_OP_MOE_ROUTE, TOY_I32, (int64_t[]){k, rows, 1, 1});
    t->src[0] = logits;
    t->op_params[P_MR_K] = k;
    t->op_params[P_MR_NORM] = norm;
    t->op_params[P_MR_SIGMOID] = sigmoid;
    t->src[1] = bias;
    t->aux_bytes = (size_t)(k * rows) * sizeof(float); /* the weights */
    return t;
}

struct toy_tensor *toy_moe_matmul(struct toy_ctx *ctx, struct toy_tensor *x, struct toy_tensor *w,
                                  struct toy_tensor *route, bool combine) {
    NEED("moe_matmul", x);
    NEED("moe_matmul", w);
    NEED("moe_matmul", route);
    CHECK(route->op == TOY_OP_MOE_ROUTE, "moe_matmul", route, NULL, "route must come from toy_moe_route");
    int64_t k = route->ne[0], N = route->ne[1];
    CHECK(is_float(x) && toy_is_contiguous(x) && x->ne[3] == 1, "moe_matmul", x, NULL, "x must be contiguous f32, 3-d");
    CHECK(x->ne[2] == N && (x->ne[1] == 1 || x->ne[1] == k), "moe_matmul", x, route,
          "x must be {K, 1 or k, N} for a route of {k, N}");
    CHECK(w->ne[0] == x->ne[0] && w->ne[3] == 1 && rows_contiguous(w) && w->data, "moe_matmul", w, x,
          "weights must be {K, n, E} with data, K as x's");
    CHECK(toy_dtype_block_size(w->type) == 1 || w->ne[0] % toy_dtype_block_size(w->type) == 0, "moe_matmul", w, NULL,
          "rows must be whole blocks");
    CHECK(route->src[0]->ne[0] == w->ne[2], "moe_matmul", w, route, "the router picks among %lld experts, w has %lld",
          (long long)route->src[0]->ne[0], (long long)w->ne[2]);
    struct toy_tensor *t = new_result(ctx, TOY_OP_MOE_MATMUL, TOY_F32,
                                      combine ? (int64_t[]){w->ne[1], N, 1, 1} : (int64_t[]){w->ne[1], k, N, 1});
    t->src[0] = x;
    t->src[1] = w;
    t->src[2] = route;
    t->op_params[P_MM_COMBINE] = combine;
    return t;
}

struct toy_tensor *toy_rope_impl(struct toy_ctx *ctx, struct toy_tensor *x, struct toy_tensor *pos,
                                 const int32_t *params, bool inverse) {
    struct toy_tensor *t = like(ctx, TOY_OP_ROPE, x);
    t->src[0] = need_rows(ctx, x);
    t->src[1] = pos;
    memcpy(t->op_params, params, sizeof(int32_t) * TOY_MAX_OP_PARAMS);
    t->op_params[P_RP_INVERSE] = inverse;
    return t;
}

struct toy_tensor *toy_rope(struct toy_ctx *ctx, struct toy_tensor *x, struct toy_tensor *pos,
                            const struct toy_rope_params *p) {
    return toy_rope_ff(ctx, x, pos, p, NULL);
}

struct toy_tensor *toy_rope_ff(struct toy_ctx *ctx, struct toy_tensor *x, struct toy_tensor *pos,
                               const struct toy_rope_params *p, struct toy_tensor *ff) {
    NEED("rope", x);
    NEED("rope", pos);
    NEED("rope", p);
    CHECK(is_float(x), "rope", x, pos, "f32 only");
    CHECK(pos->type == TOY_I32, "rope", x, pos, "positions must be i32");
    CHECK(toy_nelements(pos) == x->ne[2] || toy_nelements(pos) == x->ne[2] * x->ne[3], "rope",
          x, pos, "need T or T*B positions");
    int n_dims = p->n_dims > 0 ? p->n_dims : (int)x->ne[0];
    CHECK(n_dims % 2 == 0 && n_dims <= x->ne[0], "rope", x, pos, "n_dims %d", n_dims);
    CHECK(p->mode == TOY_ROPE_NORMAL || p->mode == TOY_ROPE_NEOX, "rope", x, pos, "mode %d", p->mode);
    int32_t prm[TOY_MAX_OP_PARAMS] = {0};
    struct toy_tensor tmp;
    prm[P_RP_NDIMS] = n_dims;
    prm[P_RP_MODE] = p->mode;
    prm[P_RP_SCALING] = p->scaling;
    prm[P_RP_ORIG] = p->orig_ctx;
    memcpy(tmp.op_params, prm, sizeof prm);
    toy_param_f32_set(&tmp, P_RP_BASE, p->freq_base > 0 ? p->freq_base : 10000.0f);
    toy_param_f32_set(&tmp, P_RP_FACTOR, p->factor > 0 ? p->factor : 1.0f);
    toy_param_f32_set(&tmp, P_RP_LOW, p->low_freq_factor > 0 ? p->low_freq_factor : 1.0f);
    toy_param_f32_set(&tmp, P_RP_HIGH, p->high_freq_factor > 0 ? p->high_freq_factor : 4.0f);
    toy_param_f32_set(&tmp, P_RP_BFAST, p->beta_fast > 0 ? p->beta_fast : 32.0f);
    toy_param_f32_set(&tmp, P_RP_BSLOW, p->beta_slow > 0 ? p->beta_slow : 1.0f);
    float af = p->attn_factor;
    if (af <= 0) af = p->scaling == TOY_ROPE_SCALING_YARN && p->factor > 1
                          ? 0.1f * logf(p->factor) + 1.0f : 1.0f;
    toy_param_f32_set(&tmp, P_RP_ATTN, af);
    if (ff) CHECK(ff->type == TOY_F32 && toy_nelements(ff) == n_dims / 2, "rope", x, ff, "freq factors: n_dims/2 f32");
    struct toy_tensor *t = toy_rope_impl(ctx, x, pos, tmp.op_params, false);
    t->src[2] = ff;
    return t;
}

/* ---- losses ------------------------------------------------------------------------ */

struct toy_tensor *toy_cross_entropy(struct toy_ctx *ctx, struct toy_tensor *logits,
                                     struct toy_tensor *targets, int32_t ignore_index) {
    NEED("cross_entropy", logits);
    NEED("cross_entropy", targets);
    CHECK(is_float(logits), "cross_entropy", logits, targets, "logits f32");
    CHECK(targets->type == TOY_I32 && toy_nelements(targets) == toy_nrows(logits),
          "cross_entropy", logits, targets, "need one i32 target per row");
    struct toy_tensor *t = new_result(ctx, TOY_OP_CROSS_ENTROPY, TOY_F32, (int64_t[]){1, 1, 1, 1});
    t->src[0] = need_rows(ctx, logits);
    t->src[1] = targets;
    t->op_params[P_CE_IGNORE] = ignore_index;
    /* per-row log-sum-exp, then the count of counted rows */
    t->aux_bytes = (size_t)(toy_nrows(logits) + 1) * sizeof(float);
    return t;
}
