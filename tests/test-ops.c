/* test-ops.c: every op, forward and backward, against PyTorch, and every
 * op's backward against central finite differences of toy's own forward.
 *
 * The cases and PyTorch's values come from tests/torch/gen_op_refs.py
 * ($TOY_REFS/ops.json, made by `make check`): inputs include broadcasting
 * shapes and non-contiguous (transposed) views. Each case runs with 1 and 2
 * threads. Tolerance (F32): |toy - torch| <= tol * (1 + |torch|) with tol
 * 1e-5 (2e-5 for attention, whose softmax sums run over keys), the
 * reference itself computed in float64 from the same float32 inputs.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "backends/cpu/cpu-impl.h"
#include "backends/cpu/qdot.h"
#include "core/internal.h" /* P_VB_STORE */
#include "toy/toy.h"
#include "toy/rng.h"
#include "toy/quant.h"

static bool attn_bf16; /* build_case's attention: products in bf16 */

static json_t *load_refs(void) {
    const char *dir = getenv("TOY_REFS");
    char path[1024];
    snprintf(path, sizeof path, "%s/ops.json", dir ? dir : "build/refs");
    json_error_t err;
    json_t *root = json_load_file(path, 0, &err);
    if (!root) cr_skip_test("no PyTorch references at %s (%s): run make check", path, err.text);
    return root;
}

static void shape_to_ne(json_t *shape, int64_t ne[4], int *nd) {
    int n = (int)json_array_size(shape);
    for (int i = 0; i < 4; i++) ne[i] = 1;
    for (int i = 0; i < n; i++) ne[i] = json_integer_value(json_array_get(shape, (size_t)(n - 1 - i)));
    *nd = n ? n : 1;
}

static float *floats(json_t *arr, size_t *n) {
    *n = json_array_size(arr);
    float *v = malloc((*n ? *n : 1) * sizeof *v);
    for (size_t i = 0; i < *n; i++) v[i] = (float)json_number_value(json_array_get(arr, i));
    return v;
}

struct built {
    struct toy_ctx *ctx;
    struct toy_tensor *store[6]; /* the parameters (storage) */
    struct toy_tensor *in[6];    /* what the op sees (maybe a view) */
    bool transposed[6];
    int n_in;
    struct toy_tensor *out, *loss;
    struct toy_graph *g;
};

static double pnum(json_t *params, const char *k, double def) {
    json_t *v = json_object_get(params, k);
    return v ? json_number_value(v) : def;
}

static struct toy_tensor *int_input(struct built *b, json_t *c, const char *name) {
    json_t *o = json_object_get(json_object_get(c, "ints"), name);
    cr_assert(o, "case lacks int input %s", name);
    int64_t ne[4];
    int nd;
    shape_to_ne(json_object_get(o, "shape"), ne, &nd);
    struct toy_tensor *t = toy_new_tensor(b->ctx, TOY_I32, nd, ne);
    json_t *d = json_object_get(o, "data");
    for (size_t i = 0; i < json_array_size(d); i++)
        ((int32_t *)t->data)[i] = (int32_t)json_integer_value(json_array_get(d, i));
    return t;
}

static struct toy_tensor *like_shape(struct built *b, json_t *params) {
    int64_t ne[4];
    int nd;
    shape_to_ne(json_object_get(params, "like"), ne, &nd);
    return toy_new_tensor(b->ctx, TOY_F32, nd, ne);
}

static void build_case(struct built *b, json_t *c) {
    memset(b, 0, sizeof *b);
    b->ctx = toy_ctx_init(true);
    json_t *inputs = json_object_get(c, "inputs");
    b->n_in = (int)json_array_size(inputs);
    for (int i = 0; i < b->n_in; i++) {
        json_t *in = json_array_get(inputs, (size_t)i);
        int64_t ne[4];
        int nd;
        shape_to_ne(json_object_get(in, "shape"), ne, &nd);
        size_t n;
        float *v = floats(json_object_get(in, "data"), &n);
        bool tr = !strcmp(json_string_value(json_object_get(in, "layout")), "T");
        b->transposed[i] = tr;
        if (tr) {
            /* store (ne1, ne0) row-major, view it transposed */
            struct toy_tensor *s = toy_new_tensor_2d(b->ctx, TOY_F32, ne[1], ne[0]);
            for (int64_t r = 0; r < ne[1]; r++)
                for (int64_t q = 0; q < ne[0]; q++) toy_set_f32(s, r, q, 0, 0, v[r * ne[0] + q]);
            b->store[i] = s;
            b->in[i] = toy_transpose(b->ctx, s);
        } else {
            b->store[i] = toy_new_tensor(b->ctx, TOY_F32, nd, ne);
            memcpy(b->store[i]->data, v, n * sizeof(float));
            b->in[i] = b->store[i];
        }
        toy_set_name(b->store[i], "%s", json_string_value(json_object_get(in, "name")));
        toy_set_param(b->store[i]);
        free(v);
    }
    const char *op = json_string_value(json_object_get(c, "op"));
    json_t *p = json_object_get(c, "params");
    struct toy_ctx *ctx = b->ctx;
    struct toy_tensor **x = b->in, *y = NULL;
    if (!strcmp(op, "add")) y = toy_add(ctx, x[0], x[1]);
    else if (!strcmp(op, "sub")) y = toy_sub(ctx, x[0], x[1]);
    else if (!strcmp(op, "mul")) y = toy_mul(ctx, x[0], x[1]);
    else if (!strcmp(op, "div")) y = toy_div(ctx, x[0], x[1]);
    else if (!strcmp(op, "scale")) y = toy_scale(ctx, x[0], (float)pnum(p, "s", 1));
    else if (!strcmp(op, "sqr")) y = toy_sqr(ctx, x[0]);
    else if (!strcmp(op, "sqrt")) y = toy_sqrt(ctx, x[0]);
    else if (!strcmp(op, "neg")) y = toy_neg(ctx, x[0]);
    else if (!strcmp(op, "tanh")) y = toy_tanh(ctx, x[0]);
    else if (!strcmp(op, "silu")) y = toy_silu(ctx, x[0]);
    else if (!strcmp(op, "gelu")) y = toy_gelu(ctx, x[0]);
    else if (!strcmp(op, "swiglu")) y = toy_swiglu(ctx, x[0], x[1]);
    else if (!strcmp(op, "swiglu_oai"))
        y = toy_swiglu_oai(ctx, x[0], x[1], (float)pnum(p, "alpha", 1.702), (float)pnum(p, "limit", 7));
    else if (!strcmp(op, "swiglu_oai_interleaved")) {
        /* gpt-oss's gate_up rows: gate x[..., ::2], up x[..., 1::2], strided views of x (its rows
         * have one float more, unused: gen_op_refs.py says why) */
        struct toy_tensor *v[2];
        for (int i = 0; i < 2; i++)
            v[i] = toy_view(ctx, x[0], 4, (const int64_t[]){x[0]->ne[0] / 2, x[0]->ne[1], x[0]->ne[2], x[0]->ne[3]},
                            (const size_t[]){2 * sizeof(float), x[0]->nb[1], x[0]->nb[2], x[0]->nb[3]},
                            (size_t)i * sizeof(float));
        y = toy_swiglu_oai(ctx, v[0], v[1], (float)pnum(p, "alpha", 1.702), (float)pnum(p, "limit", 7));
    }
    else if (!strcmp(op, "matmul"))
        y = toy_matmul(ctx, x[0], x[1], pnum(p, "trans_a", 0) != 0, pnum(p, "trans_b", 0) != 0);
    else if (!strcmp(op, "linear")) y = toy_linear(ctx, x[0], x[1], b->n_in > 2 ? x[2] : NULL);
    else if (!strcmp(op, "get_rows")) y = toy_get_rows(ctx, x[0], int_input(b, c, "ids"));
    else if (!strcmp(op, "sum")) y = toy_sum(ctx, x[0], (int)pnum(p, "dim", 0));
    else if (!strcmp(op, "mean")) y = toy_mean(ctx, x[0], (int)pnum(p, "dim", 0));
    else if (!strcmp(op, "sum_all")) y = toy_sum_all(ctx, x[0]);
    else if (!strcmp(op, "repeat")) y = toy_repeat(ctx, x[0], like_shape(b, p));
    else if (!strcmp(op, "sum_to")) y = toy_sum_to(ctx, x[0], like_shape(b, p));
    else if (!strcmp(op, "concat")) y = toy_concat(ctx, x[0], x[1], (int)pnum(p, "dim", 0));
    else if (!strcmp(op, "qkv_views") || !strcmp(op, "qkv_head_views") || !strcmp(op, "overlapping_views") ||
             !strcmp(op, "views_and_whole")) {
        /* views of z = 2x along its rows (an intermediate, so its gradient is the graph's); heads:
         * each view {4, heads, ...} as GPT-2 splits its q, k and v */
        struct toy_tensor *z = toy_scale(ctx, x[0], 2.0f);
        bool heads = !strcmp(op, "qkv_head_views"), qkv = heads || !strcmp(op, "qkv_views");
        bool whole = !strcmp(op, "views_and_whole");
        int64_t w = qkv ? z->ne[0] / 3 : whole ? z->ne[0] / 2 : 2 * z->ne[0] / 3, step = qkv ? w : z->ne[0] - w;
        struct toy_tensor *v[3];
        for (int i = 0; i < (qkv ? 3 : 2); i++)
            v[i] = heads ? toy_view(ctx, z, 4, (const int64_t[]){4, w / 4, z->ne[1], z->ne[2]},
                                    (const size_t[]){4, 16, z->nb[1], z->nb[2]}, (size_t)(i * step) * sizeof(float))
                         : toy_view(ctx, z, 4, (const int64_t[]){w, z->ne[1], z->ne[2], z->ne[3]}, z->nb + 0,
                                    (size_t)(i * step) * sizeof(float));
        y = toy_mul(ctx, v[0], v[1]);
        if (qkv) y = toy_add(ctx, y, v[2]);
        if (whole) y = toy_add(ctx, y, toy_sum(ctx, z, 0));
    } else if (!strcmp(op, "rms_norm"))
        y = toy_rms_norm(ctx, x[0], b->n_in > 1 ? x[1] : NULL, (float)pnum(p, "eps", 1e-5));
    else if (!strcmp(op, "layer_norm"))
        y = toy_layer_norm(ctx, x[0], x[1], x[2], (float)pnum(p, "eps", 1e-5));
    else if (!strcmp(op, "softmax")) {
        struct toy_tensor *mask = NULL;
        json_t *m = json_object_get(p, "mask");
        if (m) {
            int64_t ne[4];
            int nd;
            shape_to_ne(json_object_get(p, "mask_shape"), ne, &nd);
            mask = toy_new_tensor(ctx, TOY_F32, nd, ne);
            for (size_t i = 0; i < json_array_size(m); i++) {
                json_t *e = json_array_get(m, i); /* null is -inf */
                ((float *)mask->data)[i] = json_is_null(e) ? -INFINITY : (float)json_number_value(e);
            }
        }
        y = toy_softmax(ctx, x[0], mask, (float)pnum(p, "scale", 1));
    } else if (!strcmp(op, "attention")) {
        struct toy_attn_params ap = {.bf16 = attn_bf16};
        ap.causal = pnum(p, "causal", 0) != 0;
        ap.window = (int)pnum(p, "window", 0);
        ap.softcap = (float)pnum(p, "softcap", 0);
        if (b->n_in > 3) ap.sinks = x[3]; /* gpt-oss's sinks, one per query head */
        bool seg = json_object_get(json_object_get(c, "ints"), "seg") != NULL; /* packed rows */
        y = toy_attention_seg(ctx, x[0], x[1], x[2], seg ? int_input(b, c, "seg") : NULL, &ap);
    } else if (!strcmp(op, "rope")) {
        struct toy_rope_params rp = {0};
        rp.mode = (enum toy_rope_mode)pnum(p, "mode", 0);
        rp.n_dims = (int)pnum(p, "n_dims", 0);
        rp.freq_base = (float)pnum(p, "base", 10000);
        rp.scaling = (enum toy_rope_scaling)pnum(p, "scaling", 0);
        rp.factor = (float)pnum(p, "factor", 1);
        rp.orig_ctx = (int)pnum(p, "orig_ctx", 0);
        rp.low_freq_factor = (float)pnum(p, "low", 1);
        rp.high_freq_factor = (float)pnum(p, "high", 4);
        rp.beta_fast = (float)pnum(p, "beta_fast", 32);
        rp.beta_slow = (float)pnum(p, "beta_slow", 1);
        y = toy_rope(ctx, x[0], int_input(b, c, "pos"), &rp);
    } else if (!strcmp(op, "moe_ffn") || !strcmp(op, "moe_linear")) {
        /* x {d, N}, the router {d, E}, the experts {d, f, E} (and down {f, d, E}) */
        int64_t d = x[0]->ne[0], N = x[0]->ne[1], E = x[1]->ne[1];
        struct toy_tensor *lg = toy_reshape_2d(ctx, toy_linear(ctx, x[0], x[1], NULL), E, N);
        struct toy_tensor *r = toy_moe_route_scored(ctx, lg, (int)pnum(p, "k", 2), pnum(p, "norm", 0) != 0,
                                                    pnum(p, "sigmoid", 0) != 0, NULL);
        struct toy_tensor *x3 = toy_reshape_3d(ctx, x[0], d, 1, N);
        if (!strcmp(op, "moe_linear")) {
            y = toy_moe_matmul(ctx, x3, x[2], r, true);
        } else {
            struct toy_tensor *g = toy_moe_matmul(ctx, x3, x[2], r, false), *u = toy_moe_matmul(ctx, x3, x[3], r, false);
            y = toy_moe_matmul(ctx, toy_swiglu(ctx, g, u), x[4], r, true);
        }
    } else if (!strcmp(op, "cross_entropy"))
        y = toy_cross_entropy(ctx, x[0], int_input(b, c, "targets"), (int32_t)pnum(p, "ignore", -100));
    cr_assert(y, "unknown op %s", op);
    b->out = y;
    toy_set_output(y);
    size_t n;
    float *dyv = floats(json_object_get(c, "dy"), &n);
    struct toy_tensor *dy = toy_new_tensor(ctx, TOY_F32, 4, y->ne);
    cr_assert_eq((int64_t)n, toy_nelements(y), "%s: dy size", json_string_value(json_object_get(c, "name")));
    memcpy(dy->data, dyv, n * sizeof(float));
    free(dyv);
    b->loss = toy_sum_all(ctx, toy_mul(ctx, y, dy));
    b->g = toy_graph_new(ctx);
    toy_graph_build(b->g, b->loss);
    toy_graph_backward(b->g, b->loss);
}

/* max over elements of |a - ref| / (1 + |ref|) */
static double rel_err(const float *a, json_t *ref, size_t n, size_t *worst) {
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double r = json_number_value(json_array_get(ref, i));
        double e = fabs(a[i] - r) / (1 + fabs(r));
        if (e > m || isnan(e)) { m = isnan(e) ? INFINITY : e; *worst = i; }
    }
    return m;
}

static void logical_grad(struct built *b, int i, float *dst) {
    struct toy_tensor *g = b->store[i]->grad;
    if (b->transposed[i]) {
        struct toy_tensor *v = toy_transpose(b->ctx, g);
        v->data = g->data;
        toy_tensor_to_f32(v, dst);
    } else {
        toy_tensor_to_f32(g, dst);
    }
}

/* only_op: just that op's cases, at tolerance at least tol (bf16 products) */
static void torch_parity_of(const char *simd, const char *only_op, double tol_at_least) {
    if (simd) setenv("TOY_SIMD", simd, 1); /* each Criterion test is its own process */
    json_t *root = load_refs();
    json_t *cases = json_object_get(root, "cases");
    int failures = 0, ran = 0;
    for (int nth = 1; nth <= 2; nth++) {
        struct toy_threadpool *tp = toy_threadpool_new(nth);
        for (size_t ci = 0; ci < json_array_size(cases); ci++) {
            json_t *c = json_array_get(cases, ci);
            const char *name = json_string_value(json_object_get(c, "name"));
            if (only_op && strcmp(json_string_value(json_object_get(c, "op")), only_op)) continue;
            ran++;
            double tol = fmax(pnum(c, "tol", 1e-5), tol_at_least);
            struct built b;
            build_case(&b, c);
            cr_assert_eq(toy_graph_compute(b.g, tp), TOY_OK, "%s: %s", name, toy_last_error());
            size_t n = (size_t)toy_nelements(b.out), worst = 0;
            float *v = malloc(n * sizeof *v);
            toy_tensor_to_f32(b.out, v);
            json_t *ref = json_object_get(c, "out");
            double e = rel_err(v, ref, n, &worst);
            if (!(e <= tol)) {
                cr_log_error("%s (threads %d): forward error %.3g at %zu (toy %g, torch %g)", name, nth, e, worst,
                             v[worst], json_number_value(json_array_get(ref, worst)));
                failures++;
            }
            free(v);
            json_t *grads = json_object_get(c, "grads");
            for (int i = 0; i < b.n_in; i++) {
                json_t *gr = json_array_get(grads, (size_t)i);
                if (!gr || json_is_null(gr)) continue;
                cr_assert(b.store[i]->grad, "%s: input %d got no gradient", name, i);
                size_t m = (size_t)toy_nelements(b.store[i]);
                float *gv = malloc(m * sizeof *gv);
                logical_grad(&b, i, gv);
                double ge = rel_err(gv, gr, m, &worst);
                if (!(ge <= tol)) {
                    cr_log_error("%s (threads %d): grad of input %d error %.3g at %zu (toy %g, torch %g)", name, nth,
                                 i, ge, worst, gv[worst], json_number_value(json_array_get(gr, worst)));
                    failures++;
                }
                free(gv);
            }
            toy_ctx_free(b.ctx);
        }
        toy_threadpool_free(tp);
    }
    json_decref(root);
    cr_assert_gt(ran, 0, "no cases of %s", only_op ? only_op : "any op");
    cr_assert_eq(failures, 0, "%d op/gradient comparisons with PyTorch failed", failures);
}
static void torch_parity(const char *simd) { torch_parity_of(simd, NULL, 0); }

/* the fastest kernels this CPU has, then the AVX2 and the plain C ones */
Test(ops, torch_parity) { torch_parity(NULL); }
/* attention with its products in bf16 (where the CPU has them) against
 * PyTorch's float64 attention: q, k, v, the probabilities and the score
 * gradients each rounded once to 8 bits, at 2e-2 */
Test(ops, torch_parity_attention_bf16) {
    attn_bf16 = true;
    torch_parity_of(NULL, "attention", 2e-2);
}
Test(ops, torch_parity_avx2) { torch_parity("avx2"); }
Test(ops, torch_parity_scalar) { torch_parity("scalar"); }

/* Central differences of toy's own forward, in float32 (h = 1e-2 of the
 * value's scale): checks that each backward is the derivative of its
 * forward, independent of PyTorch. */
Test(ops, finite_differences) {
    json_t *root = load_refs();
    json_t *cases = json_object_get(root, "cases");
    int failures = 0, checked = 0;
    struct toy_threadpool *tp = toy_threadpool_new(2);
    for (size_t ci = 0; ci < json_array_size(cases); ci++) {
        json_t *c = json_array_get(cases, ci);
        const char *name = json_string_value(json_object_get(c, "name"));
        if (pnum(json_object_get(c, "params"), "no_fd", 0)) continue; /* inputs on kinks: PyTorch's side only */
        struct built b;
        build_case(&b, c);
        cr_assert_eq(toy_graph_compute(b.g, tp), TOY_OK, "%s: %s", name, toy_last_error());
        float *grads[6];
        for (int i = 0; i < b.n_in; i++) { /* before the runs below add to them */
            size_t n = (size_t)toy_nelements(b.store[i]);
            grads[i] = malloc(n * sizeof(float));
            memcpy(grads[i], b.store[i]->grad->data, n * sizeof(float)); /* storage order */
        }
        for (int i = 0; i < b.n_in; i++) {
            struct toy_tensor *s = b.store[i];
            int64_t n = toy_nelements(s);
            float *ag = grads[i];
            int64_t step = n > 7 ? n / 7 : 1;
            for (int64_t k = 0; k < n; k += step) {
                float *xv = (float *)s->data + k, x0 = *xv;
                float h = 1e-2f * fmaxf(1.0f, fabsf(x0));
                *xv = x0 + h;
                toy_graph_compute(b.g, tp);
                double lp = *(float *)b.loss->data;
                *xv = x0 - h;
                toy_graph_compute(b.g, tp);
                double lm = *(float *)b.loss->data;
                *xv = x0;
                double fd = (lp - lm) / (2.0 * h);
                /* float32 loss noise scales with |loss| / h */
                double noise = 1e-6 * (fabs(lp) + fabs(lm)) / h;
                double err = fabs(fd - ag[k]);
                if (!(err <= 2e-2 * (1 + fabs(ag[k])) + noise)) {
                    /* kinks (max, masks) can fool a difference: retry smaller */
                    float h2 = h / 8;
                    *xv = x0 + h2;
                    toy_graph_compute(b.g, tp);
                    lp = *(float *)b.loss->data;
                    *xv = x0 - h2;
                    toy_graph_compute(b.g, tp);
                    lm = *(float *)b.loss->data;
                    *xv = x0;
                    fd = (lp - lm) / (2.0 * h2);
                    noise = 1e-6 * (fabs(lp) + fabs(lm)) / h2;
                    err = fabs(fd - ag[k]);
                    if (!(err <= 2e-2 * (1 + fabs(ag[k])) + noise)) {
                        cr_log_error("%s: d/d input %d [%lld]: backward %g, finite difference %g", name, i,
                                     (long long)k, ag[k], fd);
                        failures++;
                    }
                }
                checked++;
            }
            free(ag);
        }
        toy_ctx_free(b.ctx);
    }
    toy_threadpool_free(tp);
    json_decref(root);
    cr_assert_gt(checked, 300);
    cr_assert_eq(failures, 0, "%d of %d finite-difference checks failed", failures, checked);
}

/* A tensor read through views gets its gradient as one buffer: the second
 * view's VIEW_BACK adds its part in place into the first's. That is safe
 * only for a buffer nothing else holds: here z's gradient starts as u's
 * (an ADD passes its gradient on unchanged, to t as well), so r's part
 * must go through an ADD. t comes first in the graph, so its backward
 * reads that shared gradient after z's: a VIEW_BACK that wrote into it
 * would change x2's gradient. */
/* the vector kernels of one TOY_SIMD level (NULL: the best this CPU has);
 * false when the CPU lacks it */
static bool vec_level(const char *lvl, struct toy_vec_ops *out) {
    if (lvl) setenv("TOY_SIMD", lvl, 1);
    else unsetenv("TOY_SIMD");
    toy_simd_init();
    bool ok = !strcmp(toy_simd_name(), lvl ? lvl : "avx512");
    *out = toy_vec;
    unsetenv("TOY_SIMD");
    toy_simd_init();
    return ok;
}

static bool same_bits_d(double a, double b) { return !memcmp(&a, &b, sizeof a); }

/* The layer norm's vector kernels, at every row length up to 70 (each tail
 * of the 16- and 8-lane loops): the per-element ones give the reference's
 * bits at every level; the row sums are within 1e-12 of it, and AVX2 keeps
 * AVX-512's lanes, so its sums have the same bits as AVX-512's */
Test(ops, layer_norm_kernels_match_the_reference_at_every_level) {
    struct toy_vec_ops ref, lv[2];
    cr_assert(vec_level("scalar", &ref));
    bool have[2] = {vec_level("avx2", &lv[0]), vec_level(NULL, &lv[1])};
    if (!have[0]) cr_skip_test("no AVX2 on this CPU");
    enum { N = 70 };
    float x[N], dy[N], w[N], b[N], y0[N + 1], y1[N + 1];
    double acc0[N], acc1[N];
    struct toy_rng rng;
    toy_rng_seed(&rng, 7);
    for (int i = 0; i < N; i++) {
        x[i] = toy_rng_normal(&rng) * 3 + 1.5f;
        dy[i] = toy_rng_normal(&rng);
        w[i] = toy_rng_normal(&rng);
        b[i] = toy_rng_normal(&rng);
    }
    for (int l = 0; l < 2; l++) {
        if (!have[l]) continue;
        const struct toy_vec_ops *v = &lv[l];
        for (int n = 0; n <= N; n++) {
            double mu = ref.sum_d(x, n) / (n ? n : 1), var = ref.sqdev_d(x, mu, n) / (n ? n : 1);
            double r = 1 / sqrt(var + 1e-5);
            cr_assert(fabs(v->sum_d(x, n) - ref.sum_d(x, n)) <= 1e-12 * (1 + fabs(ref.sum_d(x, n))), "sum_d n %d", n);
            cr_assert(fabs(v->sqdev_d(x, mu, n) - ref.sqdev_d(x, mu, n)) <= 1e-12 * (1 + ref.sqdev_d(x, mu, n)),
                      "sqdev_d n %d", n);
            for (int k = 0; k < 4; k++) { /* with and without w and b */
                const float *wk = k & 1 ? w : NULL, *bk = k & 2 ? b : NULL;
                y0[n] = y1[n] = 42; /* past the row: left alone */
                ref.layer_apply(y0, x, wk, bk, (float)mu, (float)r, n);
                v->layer_apply(y1, x, wk, bk, (float)mu, (float)r, n);
                cr_assert(!memcmp(y0, y1, sizeof(float) * (n + 1)), "layer_apply n %d k %d level %d", n, k, l);
                double s0[2], s1[2];
                ref.layer_back_sums(s0, dy, wk, x, mu, r, n);
                v->layer_back_sums(s1, dy, wk, x, mu, r, n);
                for (int j = 0; j < 2; j++)
                    cr_assert(fabs(s0[j] - s1[j]) <= 1e-12 * (1 + fabs(s0[j])), "layer_back_sums n %d", n);
                ref.layer_back_apply(y0, dy, wk, x, mu, r, s0[0] / (n ? n : 1), s0[1] / (n ? n : 1), n);
                v->layer_back_apply(y1, dy, wk, x, mu, r, s0[0] / (n ? n : 1), s0[1] / (n ? n : 1), n);
                cr_assert(!memcmp(y0, y1, sizeof(float) * (n + 1)), "layer_back_apply n %d k %d level %d", n, k, l);
            }
            for (int i = 0; i < n; i++) acc0[i] = acc1[i] = i * 0.25;
            ref.add_d(acc0, x, n), v->add_d(acc1, x, n);
            ref.acc_scaled_prod(acc0, dy, x, mu, r, n), v->acc_scaled_prod(acc1, dy, x, mu, r, n);
            cr_assert(!memcmp(acc0, acc1, sizeof(double) * n), "add_d / acc_scaled_prod n %d level %d", n, l);
        }
    }
    if (!have[1]) return;
    for (int i = 0; i < N; i++) x[i] = ldexpf(x[i], (i * 13) % 36 - 18); /* so that the order of the sums shows */
    for (int n = 0; n <= N; n++) { /* AVX2 sums as AVX-512 does */
        double s0[2], s1[2];
        cr_assert(same_bits_d(lv[0].sum_d(x, n), lv[1].sum_d(x, n)), "sum_d n %d", n);
        cr_assert(same_bits_d(lv[0].sqdev_d(x, 1.0 / 3, n), lv[1].sqdev_d(x, 1.0 / 3, n)), "sqdev_d n %d", n);
        lv[0].layer_back_sums(s0, dy, w, x, 1.0 / 3, 0.7, n);
        lv[1].layer_back_sums(s1, dy, w, x, 1.0 / 3, 0.7, n);
        cr_assert(same_bits_d(s0[0], s1[0]) && same_bits_d(s0[1], s1[1]), "layer_back_sums n %d", n);
    }
}

Test(ops, views_gather_their_gradient_in_one_buffer) {
    enum { N = 8, T = 3 };
    struct toy_ctx *ctx = toy_ctx_init(true);
    struct toy_tensor *x = toy_new_tensor_2d(ctx, TOY_F32, 2 * N, T), *x2 = toy_new_tensor_2d(ctx, TOY_F32, 2 * N, T),
                      *dy = toy_new_tensor_2d(ctx, TOY_F32, N, T);
    struct toy_rng rng;
    toy_rng_seed(&rng, 7);
    float *xv = x->data, *x2v = x2->data, *dyv = dy->data;
    for (int i = 0; i < 2 * N * T; i++) xv[i] = toy_rng_normal(&rng), x2v[i] = toy_rng_normal(&rng);
    for (int i = 0; i < N * T; i++) dyv[i] = toy_rng_normal(&rng);
    toy_set_param(x);
    toy_set_param(x2);
    const int64_t ne[4] = {N, T, 1, 1};
    struct toy_tensor *t = toy_scale(ctx, x2, 3.0f), *z = toy_scale(ctx, x, 2.0f);
    struct toy_tensor *r = toy_view(ctx, z, 4, ne, z->nb, 0);
    struct toy_tensor *u = toy_add(ctx, t, z);
    struct toy_tensor *p = toy_view(ctx, u, 4, ne, u->nb, 0), *q = toy_view(ctx, u, 4, ne, u->nb, N * sizeof(float));
    struct toy_tensor *y = toy_add(ctx, toy_mul(ctx, p, q), toy_sqr(ctx, r));
    struct toy_tensor *loss = toy_sum_all(ctx, toy_mul(ctx, y, dy));
    struct toy_graph *g = toy_graph_new(ctx);
    toy_graph_build(g, t); /* t, z and r before u */
    toy_graph_build(g, r);
    toy_graph_build(g, loss);
    int forward = toy_graph_n_nodes(g);
    toy_graph_backward(g, loss);
    struct toy_threadpool *tp = toy_threadpool_new(2);
    cr_assert_eq(toy_graph_compute(g, tp), TOY_OK, "%s", toy_last_error());
    /* by hand: dL/du = [dy q, dy p], dL/dz = dL/du + [2 r dy, 0], x2 = t / 3, x = z / 2 */
    double worst = 0;
    for (int j = 0; j < T; j++)
        for (int i = 0; i < N; i++) {
            double zl = 2.0 * xv[j * 2 * N + i], zh = 2.0 * xv[j * 2 * N + N + i];
            double pl = 3.0 * x2v[j * 2 * N + i] + zl, qh = 3.0 * x2v[j * 2 * N + N + i] + zh, d = dyv[j * N + i];
            double du[2] = {d * qh, d * pl}, dz[2] = {du[0] + 2 * zl * d, du[1]};
            for (int h = 0; h < 2; h++) {
                int at = j * 2 * N + h * N + i;
                worst = fmax(worst, fabs(((float *)x->grad->data)[at] - 2 * dz[h]) / (1 + fabs(2 * dz[h])));
                worst = fmax(worst, fabs(((float *)x2->grad->data)[at] - 3 * du[h]) / (1 + fabs(3 * du[h])));
            }
        }
    cr_assert_leq(worst, 1e-5, "gradients off by %g", worst);
    /* u's two parts in one buffer, and one ADD in the backward: z's */
    struct toy_tensor *vb[2] = {NULL, NULL};
    int adds = 0;
    for (int i = forward; i < toy_graph_n_nodes(g); i++) {
        struct toy_tensor *n = toy_graph_node(g, i);
        adds += n->op == TOY_OP_ADD;
        if (n->op == TOY_OP_VIEW_BACK && (n->src[1] == p || n->src[1] == q)) vb[n->src[1] == q] = n;
    }
    cr_assert(vb[0] && vb[1], "the views of u have their VIEW_BACKs");
    cr_assert_eq(vb[0]->data, vb[1]->data, "the second view's part goes into the first's buffer");
    cr_assert(vb[0]->op_params[P_VB_STORE] && vb[1]->op_params[P_VB_STORE], "p and q tile u: stored, not added");
    cr_assert_eq(adds, 1, "backward ADDs: %d (z's alone)", adds);
    toy_threadpool_free(tp);
    toy_ctx_free(ctx);
}

/* BF16 weights: AMX tiles, the AVX-512 BF16 kernel, or sgemm over the bf16 values (or
 * the dequantize path on CPUs without AVX-512 BF16), against a double-precision product of the same bf16-rounded
 * operands. Tolerance 1e-4 (1 + |ref|): only the f32 accumulation differs. */
static void bf16_case_t(int64_t m, int64_t k, int64_t n, bool ta, bool tb);
static void bf16_case(int64_t m, int64_t k, int64_t n, bool tb) { bf16_case_t(m, k, n, false, tb); }
static void bf16_case_t(int64_t m, int64_t k, int64_t n, bool ta, bool tb) {
    struct toy_ctx *ctx = toy_ctx_init(true);
    struct toy_rng r;
    toy_rng_seed(&r, (uint64_t)(m * 31 + n));
    struct toy_tensor *a = ta ? toy_new_tensor_2d(ctx, TOY_F32, m, k) : toy_new_tensor_2d(ctx, TOY_F32, k, m);
    struct toy_tensor *b = tb ? toy_new_tensor_2d(ctx, TOY_BF16, k, n) : toy_new_tensor_2d(ctx, TOY_BF16, n, k);
    float *af = a->data;
    for (int64_t i = 0; i < m * k; i++) af[i] = toy_rng_normal(&r);
    toy_bf16 *bb = b->data;
    for (int64_t i = 0; i < n * k; i++) bb[i] = toy_f32_to_bf16(toy_rng_normal(&r));
    struct toy_tensor *c = toy_matmul(ctx, a, b, ta, tb);
    toy_set_output(c);
    struct toy_graph *g = toy_graph_new(ctx);
    toy_graph_build(g, c);
    struct toy_threadpool *tp = toy_threadpool_new(2);
    cr_assert_eq(toy_graph_compute(g, tp), TOY_OK);
    double worst = 0;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double ref = 0;
            for (int64_t q = 0; q < k; q++) {
                double av = toy_bf16_to_f32(toy_f32_to_bf16(ta ? af[q * m + i] : af[i * k + q]));
                double bv = toy_bf16_to_f32(tb ? bb[j * k + q] : bb[q * n + j]);
                ref += av * bv;
            }
            double e = fabs(((float *)c->data)[i * n + j] - ref) / (1 + fabs(ref));
            if (e > worst) worst = e;
        }
    cr_assert_leq(worst, 1e-4, "bf16 matmul %lldx%lldx%lld ta=%d tb=%d: error %g", (long long)m, (long long)k,
                  (long long)n, ta, tb, worst);
    toy_threadpool_free(tp);
    toy_ctx_free(ctx);
}

static void bf16_cases(const char *route) {
    if (route) setenv("TOY_BF16_GEMM", route, 1); /* read once per process; each test is one */
    bf16_case(13, 70, 37, true);   /* ragged edges everywhere */
    bf16_case(64, 576, 200, true);
    bf16_case(9, 33, 130, false);  /* B (k, n): the backward dA = dY W shape */
    bf16_case(20, 64, 2200, true); /* several column blocks of the sgemm route, cut evenly */
    bf16_case(1030, 1100, 40, true);       /* k blocks summed into C */
    bf16_case(2100, 50, 30, true);         /* row blocks against a B widened once */
    bf16_case_t(2100, 64, 24, true, false); /* the same with A transposed (dW of a large output) */
    bf16_case(9, 1500, 530, false);
    bf16_case_t(40, 2100, 30, true, false);
    bf16_case_t(37, 70, 13, true, false);   /* A transposed: the weight gradient dW = dY^T X */
    bf16_case_t(200, 512, 96, true, false); /* rows split between threads, 16 x 16 transposes */
    bf16_case_t(1, 40, 29, false, true);    /* one row: the decode kernel on either route */
    bf16_case(200, 96, 40, false);          /* more rows than columns: threads split the rows */
}
/* the CPU's own choice, then each route (matmul.c: bf16_via_sgemm) */
Test(ops, bf16_matmul) { bf16_cases(NULL); }
Test(ops, bf16_matmul_dot_kernel) { bf16_cases("dot"); }
Test(ops, bf16_matmul_via_sgemm) { bf16_cases("sgemm"); }
/* Runs the graph of sum(y * dy) and its backward `runs` times on a pool of
 * 2 threads (gradients accumulate across runs); the pool is the caller's
 * to free */
static struct toy_threadpool *run_backward(struct toy_ctx *ctx, struct toy_tensor *y, struct toy_tensor *dy,
                                           int runs) {
    struct toy_tensor *loss = toy_sum_all(ctx, toy_mul(ctx, y, dy));
    struct toy_graph *g = toy_graph_new(ctx);
    toy_graph_build(g, loss);
    toy_graph_backward(g, loss);
    struct toy_threadpool *tp = toy_threadpool_new(2);
    for (int run = 0; run < runs; run++) cr_assert_eq(toy_graph_compute(g, tp), TOY_OK, "%s", toy_last_error());
    return tp;
}

/* toy_linear_bf16 over a Q8_0/Q4_0/Q4_K weight (mixed precision over a quantized
 * base), an F16 one (a model's, in inference) or an F32 one (over f32 master weights): the forward x W^T and the
 * backward dX = dY W (and, for F32, dW = dY^T X), against double sums of the
 * bf16-rounded activations and the bf16-rounded (dequantized) weight */
static void bf16_quant_case(enum toy_dtype wt, int64_t m, int64_t k, int64_t n) {
    struct toy_ctx *ctx = toy_ctx_init(true);
    struct toy_rng r;
    toy_rng_seed(&r, (uint64_t)(m * 131 + k + n));
    struct toy_tensor *x = toy_new_tensor_2d(ctx, TOY_F32, k, m), *w = toy_new_tensor_2d(ctx, wt, k, n);
    struct toy_tensor *dy = toy_new_tensor_2d(ctx, TOY_F32, n, m);
    float *xf = x->data, *dyf = dy->data, *wf = malloc((size_t)(n * k) * 4), *wd = malloc((size_t)(n * k) * 4);
    for (int64_t i = 0; i < m * k; i++) xf[i] = toy_rng_normal(&r);
    for (int64_t i = 0; i < n * m; i++) dyf[i] = toy_rng_normal(&r);
    for (int64_t i = 0; i < n * k; i++) wf[i] = toy_rng_normal(&r);
    for (int64_t j = 0; j < n; j++) {
        cr_assert_eq(toy_quantize_row(wt, wf + j * k, (char *)w->data + j * w->nb[1], k), TOY_OK);
        cr_assert_eq(toy_dequantize_row(wt, (char *)w->data + j * w->nb[1], wd + j * k, k), TOY_OK);
    }
    toy_set_param(x);
    if (wt == TOY_F32) toy_set_param(w);
    struct toy_tensor *y = toy_linear_bf16(ctx, x, w, NULL, true);
    toy_set_output(y);
    struct toy_threadpool *tp = run_backward(ctx, y, dy, 1);
#define R(v) ((double)toy_bf16_to_f32(toy_f32_to_bf16(v)))
    double wy = 0, wx = 0;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double ref = 0;
            for (int64_t q = 0; q < k; q++) ref += R(xf[i * k + q]) * R(wd[j * k + q]);
            double e = fabs(((float *)y->data)[i * n + j] - ref) / (1 + fabs(ref));
            if (e > wy) wy = e;
        }
    for (int64_t i = 0; i < m; i++)
        for (int64_t q = 0; q < k; q++) {
            double ref = 0;
            for (int64_t j = 0; j < n; j++) ref += R(dyf[i * n + j]) * R(wd[j * k + q]);
            double e = fabs(((float *)x->grad->data)[i * k + q] - ref) / (1 + fabs(ref));
            if (e > wx) wx = e;
        }
    double ww = 0;
    for (int64_t j = 0; wt == TOY_F32 && j < n; j++)
        for (int64_t q = 0; q < k; q++) {
            double ref = 0;
            for (int64_t i = 0; i < m; i++) ref += R(dyf[i * n + j]) * R(xf[i * k + q]);
            double e = fabs(((float *)w->grad->data)[j * k + q] - ref) / (1 + fabs(ref));
            if (e > ww) ww = e;
        }
#undef R
    cr_assert_leq(ww, 1e-4, "f32 weights, bf16 weight gradient %lldx%lldx%lld: error %g", (long long)m,
                  (long long)k, (long long)n, ww);
    cr_assert_leq(wy, 1e-4, "%s bf16 forward %lldx%lldx%lld: error %g", toy_dtype_name(wt), (long long)m,
                  (long long)k, (long long)n, wy);
    cr_assert_leq(wx, 1e-4, "%s bf16 backward %lldx%lldx%lld: error %g", toy_dtype_name(wt), (long long)m,
                  (long long)k, (long long)n, wx);
    free(wf), free(wd);
    toy_threadpool_free(tp);
    toy_ctx_free(ctx);
}

/* The worst relative error of a weight gradient dW (n x k) against double
 * sums of dY^T X over `rows` rows, both rounded to bf16 as the products
 * marked bf16 round them */
static double bf16_dw_error(const float *dw, const float *dy, const float *x, int64_t rows, int64_t k, int64_t n) {
    double worst = 0;
    for (int64_t j = 0; j < n; j++)
        for (int64_t q = 0; q < k; q++) {
            double ref = 0;
            for (int64_t i = 0; i < rows; i++)
                ref += (double)toy_bf16_to_f32(toy_f32_to_bf16(dy[i * n + j])) *
                       toy_bf16_to_f32(toy_f32_to_bf16(x[i * k + q]));
            worst = fmax(worst, fabs(dw[j * k + q] - ref) / (1 + fabs(ref)));
        }
    return worst;
}

/* The weight gradient of a marked linear over a 3-D activation: its B is
 * the input reshaped (a view, whose data is set only as the graph runs), and it
 * needs the largest scratch of the graph -- which must be sized for the
 * bf16 path on the first run too. Against double sums, as above. */
static void bf16_reshaped_input_case(void) {
    struct toy_ctx *ctx = toy_ctx_init(true);
    struct toy_rng r;
    toy_rng_seed(&r, 17);
    const int64_t k = 64, T = 520, B = 2, n = 48;
    struct toy_tensor *x = toy_new_tensor_3d(ctx, TOY_F32, k, T, B), *w = toy_new_tensor_2d(ctx, TOY_F32, k, n);
    struct toy_tensor *dy = toy_new_tensor_3d(ctx, TOY_F32, n, T, B);
    float *xf = x->data, *wf = w->data, *dyf = dy->data;
    for (int64_t i = 0; i < k * T * B; i++) xf[i] = toy_rng_normal(&r);
    for (int64_t i = 0; i < k * n; i++) wf[i] = toy_rng_normal(&r);
    for (int64_t i = 0; i < n * T * B; i++) dyf[i] = toy_rng_normal(&r);
    toy_set_param(x), toy_set_param(w);
    struct toy_tensor *h = toy_scale(ctx, x, 1.0f); /* an activation: planned, not a leaf */
    struct toy_threadpool *tp = run_backward(ctx, toy_linear_bf16(ctx, h, w, NULL, true), dy, 1);
    double worst = bf16_dw_error(w->grad->data, dyf, xf, T * B, k, n);
    cr_assert_leq(worst, 1e-4, "bf16 weight gradient over a reshaped input: error %g", worst);
    toy_threadpool_free(tp);
    toy_ctx_free(ctx);
}

/* A product over a weight explicitly cast to BF16 (toy_linear(x, cast(W))):
 * its weight gradient is marked bf16 like the forward, so the activation is
 * rounded as it is packed rather than cast -- the graph's only cast is W's
 * -- and dW matches double sums of the bf16-rounded dY and X */
static void bf16_cast_weight_case(void) {
    struct toy_ctx *ctx = toy_ctx_init(true);
    struct toy_rng r;
    toy_rng_seed(&r, 23);
    const int64_t k = 96, m = 70, n = 40;
    struct toy_tensor *x = toy_new_tensor_2d(ctx, TOY_F32, k, m), *w = toy_new_tensor_2d(ctx, TOY_F32, k, n);
    struct toy_tensor *dy = toy_new_tensor_2d(ctx, TOY_F32, n, m);
    float *xf = x->data, *wf = w->data, *dyf = dy->data;
    for (int64_t i = 0; i < k * m; i++) xf[i] = toy_rng_normal(&r);
    for (int64_t i = 0; i < k * n; i++) wf[i] = toy_rng_normal(&r);
    for (int64_t i = 0; i < n * m; i++) dyf[i] = toy_rng_normal(&r);
    toy_set_param(w);
    struct toy_tensor *h = toy_scale(ctx, x, 1.0f);
    struct toy_tensor *loss = toy_sum_all(ctx, toy_mul(ctx, toy_linear(ctx, h, toy_cast(ctx, w, TOY_BF16), NULL), dy));
    struct toy_graph *g = toy_graph_new(ctx);
    toy_graph_build(g, loss);
    toy_graph_backward(g, loss);
    int casts = 0, marked = 0;
    for (int i = 0; i < toy_graph_n_nodes(g); i++) {
        struct toy_tensor *t = toy_graph_node(g, i);
        casts += t->op == TOY_OP_CAST;
        marked += t->op == TOY_OP_MATMUL && t->op_params[P_MM_BF16];
    }
    cr_assert_eq(casts, 1, "%d casts: only the weight's is wanted", casts);
    cr_assert_eq(marked, 1, "the weight gradient's product is marked bf16");
    struct toy_threadpool *tp = toy_threadpool_new(2);
    cr_assert_eq(toy_graph_compute(g, tp), TOY_OK, "%s", toy_last_error());
    double worst = bf16_dw_error(w->grad->data, dyf, xf, m, k, n);
    cr_assert_leq(worst, 1e-4, "bf16 weight gradient over a cast weight: error %g", worst);
    toy_threadpool_free(tp);
    toy_ctx_free(ctx);
}

static void bf16_quant_cases(const char *route) {
    setenv("TOY_BF16_GEMM", route, 1);
    for (int t = 0; t < 2; t++) {
        enum toy_dtype wt = t ? TOY_Q4_0 : TOY_Q8_0;
        bf16_quant_case(wt, 100, 96, 64);  /* more rows than columns: threads split rows */
        bf16_quant_case(wt, 20, 64, 200);  /* columns split, in blocks of 32 for the backward */
        bf16_quant_case(wt, 12, 1088, 40); /* k blocks of 544 (17 quant blocks each) */
        bf16_quant_case(wt, 9, 64, 48);    /* the fewest rows that take it (fewer: the row kernels) */
    }
    /* F32 master weights, rounded as they are packed */
    bf16_reshaped_input_case();
    bf16_cast_weight_case();
    bf16_quant_case(TOY_F32, 100, 96, 64);
    bf16_quant_case(TOY_F32, 20, 70, 200);   /* ragged k; columns split */
    bf16_quant_case(TOY_F32, 12, 1100, 40);  /* k blocks */
    bf16_quant_case(TOY_F32, 300, 256, 130); /* rows split; the weight gradient's A transposed */
    /* F16 weights (toy generate --bf16 over an f16 model), widened then rounded as they are packed */
    bf16_quant_case(TOY_F16, 100, 96, 64);
    bf16_quant_case(TOY_F16, 20, 70, 200); /* ragged k; columns split */
    bf16_quant_case(TOY_F16, 12, 1100, 40);
    bf16_quant_case(TOY_F16, 9, 64, 48);
    /* Q4_K: blocks of 256 values, so k blocks and column chunks of 256 */
    bf16_quant_case(TOY_Q4_K, 20, 512, 256);
    bf16_quant_case(TOY_Q4_K, 40, 1280, 64);  /* k blocks of 768 + 512 */
    bf16_quant_case(TOY_Q4_K, 300, 256, 512); /* rows split; the backward's columns in one chunk of 256 */
}
Test(ops, bf16_quantized_base_dot_kernel) {
    if (!toy_cpu_has_avx512bf16()) cr_skip_test("no AVX-512 BF16");
    bf16_quant_cases("dot");
}
Test(ops, bf16_quantized_base_amx_tiles) {
    if (!toy_cpu_amx_bf16()) cr_skip_test("no AMX-BF16 tiles on this CPU or OS");
    bf16_quant_cases("amx");
}

/* The AVX-512 packing of the BF16 operands writes the bytes its
 * one-value-at-a-time reference writes, on ragged shapes */
Test(ops, bf16_packing_matches_reference) {
    if (!toy_cpu_has_avx512bf16()) cr_skip_test("no AVX-512 BF16");
    struct toy_rng r;
    toy_rng_seed(&r, 5);
    const int64_t shapes[][3] = {{1, 1, 32}, {13, 70, 96}, {16, 64, 64}, {37, 33, 64}, {130, 576, 576}, {5, 1, 32}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int64_t nc = shapes[s][0], k = shapes[s][1], kp = shapes[s][2], ld = nc > k ? nc + 3 : k + 3;
        int64_t np = (nc + 15) / 16, rows = nc > k ? nc : k, pn = np * kp * 16;
        uint16_t *b = malloc((size_t)(rows * ld) * 2), *p0 = malloc((size_t)pn * 2), *p1 = malloc((size_t)pn * 2);
        float *a = malloc((size_t)(rows * ld) * 4);
        for (int64_t i = 0; i < rows * ld; i++) {
            a[i] = toy_rng_normal(&r);
            b[i] = toy_f32_to_bf16(a[i]);
        }
        for (int rc = 0; rc < 2; rc++) {
            memset(p0, 0xee, (size_t)pn * 2), memset(p1, 0x77, (size_t)pn * 2);
            toy_pack_bf16_panels_ref(b, ld, rc, nc, k, kp, p0);
            toy_pack_bf16_panels(b, ld, rc, nc, k, kp, p1);
            cr_assert(!memcmp(p0, p1, (size_t)pn * 2), "panels nc %lld k %lld rows_are_cols %d", (long long)nc,
                      (long long)k, rc);
            memset(p0, 0xee, (size_t)pn * 2), memset(p1, 0x77, (size_t)pn * 2);
            toy_pack_f32_bf16_panels_ref(a, ld, rc, nc, k, kp, p0);
            toy_pack_f32_bf16_panels(a, ld, rc, nc, k, kp, p1);
            cr_assert(!memcmp(p0, p1, (size_t)pn * 2), "f32 panels nc %lld k %lld rows_are_cols %d", (long long)nc,
                      (long long)k, rc);
        }
        /* columns 2 .. 2+nc of a k x ld matrix */
        int64_t cn = nc + 2 < ld ? nc : ld - 2;
        memset(p0, 0xee, (size_t)(cn * kp) * 2), memset(p1, 0x77, (size_t)(cn * kp) * 2);
        toy_pack_f32_bf16_cols_ref(a, ld, 2, cn, k, p0, kp);
        toy_pack_f32_bf16_cols(a, ld, 2, cn, k, p1, kp);
        cr_assert(!memcmp(p0, p1, (size_t)(cn * kp) * 2), "columns nc %lld k %lld", (long long)cn, (long long)k);
        free(a), free(b), free(p0), free(p1);
    }
}

/* A product that adds into C (a leaf's gradient, accumulated over two
 * runs): dA = dY B through the BF16 route, whole tiles and edges */
static void bf16_accumulate_case(int64_t m, int64_t k, int64_t n) {
    struct toy_ctx *ctx = toy_ctx_init(true);
    struct toy_rng r;
    toy_rng_seed(&r, (uint64_t)(m + 7 * n));
    struct toy_tensor *a = toy_new_tensor_2d(ctx, TOY_F32, k, m), *b = toy_new_tensor_2d(ctx, TOY_BF16, k, n);
    struct toy_tensor *dy = toy_new_tensor_2d(ctx, TOY_F32, n, m);
    float *af = a->data, *dyf = dy->data;
    toy_bf16 *bb = b->data;
    for (int64_t i = 0; i < m * k; i++) af[i] = toy_rng_normal(&r);
    for (int64_t i = 0; i < n * k; i++) bb[i] = toy_f32_to_bf16(toy_rng_normal(&r));
    for (int64_t i = 0; i < n * m; i++) dyf[i] = toy_rng_normal(&r);
    toy_set_param(a);
    struct toy_threadpool *tp = run_backward(ctx, toy_matmul(ctx, a, b, false, true), dy, 2);
    double worst = 0;
    for (int64_t i = 0; i < m; i++)
        for (int64_t q = 0; q < k; q++) {
            double ref = 0;
            for (int64_t j = 0; j < n; j++)
                ref += (double)toy_bf16_to_f32(toy_f32_to_bf16(dyf[i * n + j])) * toy_bf16_to_f32(bb[j * k + q]);
            double e = fabs(((float *)a->grad->data)[i * k + q] - 2 * ref) / (1 + fabs(2 * ref));
            if (e > worst) worst = e;
        }
    cr_assert_leq(worst, 1e-4, "accumulated bf16 product %lldx%lldx%lld: error %g", (long long)m, (long long)n,
                  (long long)k, worst);
    toy_threadpool_free(tp);
    toy_ctx_free(ctx);
}

Test(ops, bf16_matmul_accumulates) {
    bf16_accumulate_case(40, 70, 50);
    bf16_accumulate_case(64, 64, 96);
    bf16_accumulate_case(100, 40, 30); /* rows split between threads */
}

Test(ops, bf16_matmul_amx_tiles) {
    if (!toy_cpu_amx_bf16()) cr_skip_test("no AMX-BF16 tiles on this CPU or OS");
    bf16_cases("amx");
    bf16_case(100, 96, 100, true);   /* every edge of the 2 x 2 tile blocks: 16 + 4 rows and columns left */
    bf16_case(48, 2048, 80, true);   /* 64 k steps of one block */
    bf16_case_t(33, 1024, 70, true, false);
    bf16_accumulate_case(40, 70, 50);
    bf16_accumulate_case(64, 64, 96);
}

/* f32 -> f16 and f32 -> bf16 round to nearest even exactly as PyTorch does
 * (overflow to inf, subnormals, ties), bit for bit, and back exactly. */
Test(ops, f16_bf16_conversions_match_torch) {
    json_t *root = load_refs();
    json_t *c = json_object_get(root, "conversions");
    cr_assert(c, "old reference file: rerun make check");
    json_t *f = json_object_get(c, "f32"), *h = json_object_get(c, "f16_bits"), *b = json_object_get(c, "bf16_bits");
    int bad = 0;
    for (size_t i = 0; i < json_array_size(f); i++) {
        float x = (float)json_number_value(json_array_get(f, i));
        uint16_t th = (uint16_t)json_integer_value(json_array_get(h, i));
        uint16_t tb = (uint16_t)json_integer_value(json_array_get(b, i));
        uint16_t oh = toy_f32_to_f16(x), ob = toy_f32_to_bf16(x);
        if (oh != th || ob != tb) {
            if (bad++ < 5) cr_log_error("%.9g: f16 %04x vs torch %04x, bf16 %04x vs torch %04x", x, oh, th, ob, tb);
        }
        float back = toy_f16_to_f32(th);
        if (!isnan(back) && toy_f32_to_f16(back) != th) bad++;
    }
    cr_log_info("%zu values converted", json_array_size(f));
    cr_assert_eq(bad, 0, "%d conversions differ from PyTorch", bad);
    json_decref(root);
}

/* Attention with products in bf16 (toy_attn_params.bf16): the forward and
 * the three gradients against float64 sums whose operands are rounded to
 * bf16 where the kernels round them -- q, k, v, dO, the probabilities and
 * the scaled score gradients -- everything else float64. Rounding differs
 * from it only where a float32 value and its float64 counterpart straddle
 * a bf16 rounding boundary, so the bound is 1e-3 of each result's largest
 * value; the same products in float32 miss it by about 4e-3. */
struct attn_bf16_case {
    int64_t D, Hq, Hkv, Tq, Tk, B;
    bool causal, seg;
    int window;
    float softcap;
};

#define RB(x) ((double)toy_bf16_to_f32(toy_f32_to_bf16((float)(x))))

static void attn_bf16_reference(const struct attn_bf16_case *c, const float *q, const float *k, const float *v,
                                const float *dy, const int32_t *seg, double *o, double *dq, double *dk, double *dv) {
    int64_t D = c->D, G = c->Hq / c->Hkv, off = c->Tk - c->Tq, lq = D * c->Hq, lk = D * c->Hkv;
    double scale = 1.0 / sqrt((double)D), *s = malloc((size_t)c->Tk * 8), *p = malloc((size_t)c->Tk * 8);
    memset(dq, 0, (size_t)(c->B * c->Tq * lq) * 8);
    memset(dk, 0, (size_t)(c->B * c->Tk * lk) * 8);
    memset(dv, 0, (size_t)(c->B * c->Tk * lk) * 8);
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t h = 0; h < c->Hq; h++)
            for (int64_t i = 0; i < c->Tq; i++) {
                const float *qi = q + (b * c->Tq + i) * lq + h * D, *di = dy + (b * c->Tq + i) * lq + h * D;
                double mx = -INFINITY, sum = 0;
                for (int64_t j = 0; j < c->Tk; j++) {
                    bool see = (!c->causal || j <= i + off) && (!c->window || j > i + off - c->window) &&
                               (!seg || seg[b * c->Tk + j] == seg[b * c->Tq + i]);
                    s[j] = -INFINITY;
                    if (!see) continue;
                    double d = 0;
                    for (int64_t e = 0; e < D; e++) d += RB(qi[e]) * RB(k[(b * c->Tk + j) * lk + h / G * D + e]);
                    s[j] = d * scale;
                    if (c->softcap > 0) s[j] = c->softcap * tanh(s[j] / c->softcap);
                    mx = fmax(mx, s[j]);
                }
                for (int64_t j = 0; j < c->Tk; j++) sum += p[j] = s[j] == -INFINITY ? 0 : exp(s[j] - mx);
                double *oi = o + (b * c->Tq + i) * lq + h * D, Di = 0;
                for (int64_t e = 0; e < D; e++) {
                    oi[e] = 0;
                    for (int64_t j = 0; j < c->Tk; j++)
                        oi[e] += RB(p[j] / sum) * RB(v[(b * c->Tk + j) * lk + h / G * D + e]);
                    Di += di[e] * oi[e];
                }
                for (int64_t j = 0; j < c->Tk; j++) {
                    if (p[j] == 0) continue;
                    double pj = p[j] / sum, dp = 0;
                    const float *kj = k + (b * c->Tk + j) * lk + h / G * D, *vj = v + (b * c->Tk + j) * lk + h / G * D;
                    for (int64_t e = 0; e < D; e++) dp += RB(di[e]) * RB(vj[e]);
                    double ds = scale * pj * (dp - Di);
                    if (c->softcap > 0) ds *= 1 - (s[j] / c->softcap) * (s[j] / c->softcap);
                    double dsr = RB(ds);
                    for (int64_t e = 0; e < D; e++) {
                        dq[(b * c->Tq + i) * lq + h * D + e] += dsr * RB(kj[e]);
                        dk[(b * c->Tk + j) * lk + h / G * D + e] += dsr * RB(qi[e]);
                        dv[(b * c->Tk + j) * lk + h / G * D + e] += RB(pj) * RB(di[e]);
                    }
                }
            }
    free(s), free(p);
}

/* |toy - ref| over the largest |ref| */
static double err_of_largest(const float *x, const double *ref, int64_t n) {
    double e = 0, big = 0;
    for (int64_t i = 0; i < n; i++) {
        e = fmax(e, fabs(x[i] - ref[i]));
        if (isnan(x[i])) e = INFINITY;
        big = fmax(big, fabs(ref[i]));
    }
    return e / big;
}

/* runs the case with bf16 products (or not) and returns the worst of the
 * four errors against the reference */
static double attn_bf16_run(const struct attn_bf16_case *c, bool bf16, float *out_copy) {
    struct toy_ctx *ctx = toy_ctx_init(true);
    struct toy_rng r;
    toy_rng_seed(&r, (uint64_t)(c->D * 1000 + c->Tq));
    struct toy_tensor *q = toy_new_tensor_4d(ctx, TOY_F32, c->D, c->Hq, c->Tq, c->B);
    struct toy_tensor *k = toy_new_tensor_4d(ctx, TOY_F32, c->D, c->Hkv, c->Tk, c->B);
    struct toy_tensor *v = toy_new_tensor_4d(ctx, TOY_F32, c->D, c->Hkv, c->Tk, c->B);
    struct toy_tensor *dy = toy_new_tensor_4d(ctx, TOY_F32, c->D, c->Hq, c->Tq, c->B), *sg = NULL;
    struct toy_tensor *all[4] = {q, k, v, dy};
    for (int t = 0; t < 4; t++)
        for (int64_t i = 0; i < toy_nelements(all[t]); i++) ((float *)all[t]->data)[i] = 1.5f * toy_rng_normal(&r);
    if (c->seg) { /* documents of 37 positions, then one to the end of the row */
        sg = toy_new_tensor_2d(ctx, TOY_I32, c->Tq, c->B);
        for (int64_t i = 0; i < c->Tq * c->B; i++) ((int32_t *)sg->data)[i] = (int32_t)(i / 37 < 3 ? i / 37 : 3);
    }
    toy_set_param(q), toy_set_param(k), toy_set_param(v);
    struct toy_attn_params ap = {.causal = c->causal, .window = c->window, .softcap = c->softcap, .bf16 = bf16};
    struct toy_tensor *y = toy_attention_seg(ctx, q, k, v, sg, &ap);
    toy_set_output(y);
    struct toy_threadpool *tp = run_backward(ctx, y, dy, 1);
    int64_t nq = toy_nelements(q), nk = toy_nelements(k);
    double *ref = malloc((size_t)(2 * nq + 2 * nk) * 8);
    attn_bf16_reference(c, q->data, k->data, v->data, dy->data, sg ? sg->data : NULL, ref, ref + nq, ref + 2 * nq,
                        ref + 2 * nq + nk);
    double e = fmax(fmax(err_of_largest(y->data, ref, nq), err_of_largest(q->grad->data, ref + nq, nq)),
                    fmax(err_of_largest(k->grad->data, ref + 2 * nq, nk),
                         err_of_largest(v->grad->data, ref + 2 * nq + nk, nk)));
    if (out_copy) {
        memcpy(out_copy, y->data, (size_t)nq * 4);
        memcpy(out_copy + nq, q->grad->data, (size_t)nq * 4);
        memcpy(out_copy + 2 * nq, k->grad->data, (size_t)nk * 4);
        memcpy(out_copy + 2 * nq + nk, v->grad->data, (size_t)nk * 4);
    }
    free(ref);
    toy_threadpool_free(tp);
    toy_ctx_free(ctx);
    return e;
}

static const struct attn_bf16_case attn_bf16_cases[] = {
    {64, 9, 3, 150, 150, 2, true, false, 0, 0},  /* SmolLM2's heads; three query blocks, the last ragged */
    {48, 6, 6, 100, 100, 1, true, false, 0, 0},  /* stories15M's head size: k padded to 64 */
    {64, 4, 2, 130, 130, 1, true, false, 40, 0}, /* a sliding window: key ranges from inside a block */
    {32, 4, 1, 120, 120, 2, true, true, 0, 0},   /* packed documents: a run's keys start anywhere */
    {64, 2, 1, 70, 70, 1, true, false, 0, 5.0f}, /* softcap */
    {16, 2, 2, 40, 90, 1, false, false, 0, 0},   /* not causal, more keys than queries */
    {64, 2, 1, 33, 100, 1, true, false, 0, 0},   /* causal with keys ahead of the queries (offset 67) */
};

static void attn_bf16_cases_run(const char *route) {
    setenv("TOY_BF16_GEMM", route, 1); /* read once per process; each test is one */
    for (size_t i = 0; i < sizeof attn_bf16_cases / sizeof attn_bf16_cases[0]; i++) {
        const struct attn_bf16_case *c = &attn_bf16_cases[i];
        double e = attn_bf16_run(c, true, NULL), e32 = attn_bf16_run(c, false, NULL);
        cr_log_info("case %zu: bf16 %.2g, f32 products %.2g of the largest", i, e, e32);
        cr_assert_leq(e, 1e-3, "bf16 attention case %zu (D %lld, Tq %lld, Tk %lld): error %g of the largest", i,
                      (long long)c->D, (long long)c->Tq, (long long)c->Tk, e);
    }
}
#undef RB

Test(ops, attention_bf16_dot_kernel) {
    if (!toy_cpu_has_avx512bf16()) cr_skip_test("no AVX-512 BF16");
    attn_bf16_cases_run("dot");
}
Test(ops, attention_bf16_amx_tiles) {
    if (!toy_cpu_amx_bf16()) cr_skip_test("no AMX-BF16 tiles on this CPU or OS");
    attn_bf16_cases_run("amx");
}
/* where bf16 products would be sgemm over widened values (or are not
 * available), the mark changes nothing: the same bits as f32 */
Test(ops, attention_bf16_elsewhere_is_f32) {
    setenv("TOY_BF16_GEMM", "sgemm", 1);
    const struct attn_bf16_case *c = &attn_bf16_cases[2];
    int64_t n = 2 * (c->D * c->Hq * c->Tq * c->B) + 2 * (c->D * c->Hkv * c->Tk * c->B);
    float *a = malloc((size_t)n * 4), *b = malloc((size_t)n * 4);
    attn_bf16_run(c, true, a);
    attn_bf16_run(c, false, b);
    cr_assert(!memcmp(a, b, (size_t)n * 4), "bf16-marked attention differs from f32 on the sgemm route");
    free(a), free(b);
}

/* Packed rows: documents of 70 and 80 positions (the second starts inside a
 * 64-query block) in one segmented row give the outputs and q/k/v gradients
 * that each document gets alone in a row of its own, and padding (an id of
 * its own) changes nothing. GQA (4 query heads over 2), causal. */
static void attn_rows(int64_t T, int64_t B, const int32_t *seg, const float *qv, const float *kv, const float *vv,
                      const float *dyv, float *out, float *dq, float *dk, float *dv) {
    const int64_t D = 16, Hq = 4, Hkv = 2;
    struct toy_ctx *ctx = toy_ctx_init(true);
    struct toy_tensor *q = toy_new_tensor_4d(ctx, TOY_F32, D, Hq, T, B);
    struct toy_tensor *k = toy_new_tensor_4d(ctx, TOY_F32, D, Hkv, T, B);
    struct toy_tensor *v = toy_new_tensor_4d(ctx, TOY_F32, D, Hkv, T, B);
    struct toy_tensor *dy = toy_new_tensor_4d(ctx, TOY_F32, D, Hq, T, B);
    memcpy(q->data, qv, toy_nbytes(q));
    memcpy(k->data, kv, toy_nbytes(k));
    memcpy(v->data, vv, toy_nbytes(v));
    memcpy(dy->data, dyv, toy_nbytes(dy));
    toy_set_param(q);
    toy_set_param(k);
    toy_set_param(v);
    struct toy_tensor *s = NULL;
    if (seg) {
        s = toy_new_tensor_2d(ctx, TOY_I32, T, B);
        memcpy(s->data, seg, (size_t)(T * B) * sizeof(int32_t));
    }
    struct toy_attn_params ap = {.causal = true};
    struct toy_tensor *y = toy_attention_seg(ctx, q, k, v, s, &ap);
    toy_set_output(y);
    struct toy_threadpool *tp = run_backward(ctx, y, dy, 1);
    memcpy(out, y->data, toy_nbytes(y));
    memcpy(dq, q->grad->data, toy_nbytes(q));
    memcpy(dk, k->grad->data, toy_nbytes(k));
    memcpy(dv, v->grad->data, toy_nbytes(v));
    toy_threadpool_free(tp);
    toy_ctx_free(ctx);
}

Test(ops, segment_attention_packed_row_equals_separate_rows) {
    const int64_t D = 16, Hq = 4, Hkv = 2, L0 = 70, L1 = 80, T = 160; /* 10 positions of padding */
    const int64_t nq = D * Hq, nk = D * Hkv;
    struct toy_rng r;
    toy_rng_seed(&r, 77);
    float *q = malloc(T * nq * 4), *k = malloc(T * nk * 4), *v = malloc(T * nk * 4), *dy = malloc(T * nq * 4);
    for (int64_t i = 0; i < T * nq; i++) { q[i] = toy_rng_normal(&r); dy[i] = toy_rng_normal(&r); }
    for (int64_t i = 0; i < T * nk; i++) { k[i] = toy_rng_normal(&r); v[i] = toy_rng_normal(&r); }
    int32_t seg[160];
    for (int64_t t = 0; t < T; t++) seg[t] = t < L0 ? 0 : t < L0 + L1 ? 1 : -1;
    float *po = malloc(T * nq * 4), *pdq = malloc(T * nq * 4), *pdk = malloc(T * nk * 4), *pdv = malloc(T * nk * 4);
    attn_rows(T, 1, seg, q, k, v, dy, po, pdq, pdk, pdv);
    /* each document alone (row 0: doc 0, row 1: doc 1; T = 80, doc 0 padded with zeros it never sees) */
    const int64_t Ts = L1;
    float *sq = calloc(2 * Ts * nq, 4), *sk = calloc(2 * Ts * nk, 4), *sv = calloc(2 * Ts * nk, 4),
          *sdy = calloc(2 * Ts * nq, 4);
    int64_t start[2] = {0, L0}, len[2] = {L0, L1};
    for (int d = 0; d < 2; d++) {
        memcpy(sq + d * Ts * nq, q + start[d] * nq, (size_t)(len[d] * nq) * 4);
        memcpy(sdy + d * Ts * nq, dy + start[d] * nq, (size_t)(len[d] * nq) * 4);
        memcpy(sk + d * Ts * nk, k + start[d] * nk, (size_t)(len[d] * nk) * 4);
        memcpy(sv + d * Ts * nk, v + start[d] * nk, (size_t)(len[d] * nk) * 4);
    }
    float *so = malloc(2 * Ts * nq * 4), *sdq = malloc(2 * Ts * nq * 4), *sdk = malloc(2 * Ts * nk * 4),
          *sdv = malloc(2 * Ts * nk * 4);
    attn_rows(Ts, 2, NULL, sq, sk, sv, sdy, so, sdq, sdk, sdv);
    double worst = 0;
    for (int d = 0; d < 2; d++)
        for (int64_t t = 0; t < len[d]; t++) {
            const float *pairs[4][2] = {{po + (start[d] + t) * nq, so + (d * Ts + t) * nq},
                                        {pdq + (start[d] + t) * nq, sdq + (d * Ts + t) * nq},
                                        {pdk + (start[d] + t) * nk, sdk + (d * Ts + t) * nk},
                                        {pdv + (start[d] + t) * nk, sdv + (d * Ts + t) * nk}};
            for (int w = 0; w < 4; w++)
                for (int64_t i = 0; i < (w < 2 ? nq : nk); i++)
                    worst = fmax(worst, fabs(pairs[w][0][i] - pairs[w][1][i]) / (1 + fabs(pairs[w][1][i])));
        }
    cr_assert_leq(worst, 1e-5, "packed vs separate rows: relative error %g", worst);
    free(q); free(k); free(v); free(dy); free(po); free(pdq); free(pdk); free(pdv);
    free(sq); free(sk); free(sv); free(sdy); free(so); free(sdq); free(sdk); free(sdv);
}

/* The f32 decode GEMVs (16-byte loads, four FMA chains; 64-byte loads
 * where the CPU has AVX-512) against BLAS's sgemv: row lengths with every
 * tail (k mod 64, k mod 16, k mod 4), a row stride wider than the row, and
 * accumulation. 1e-5 of the row's scale: only the summation order differs.
 * ahead: $TOY_PREFETCH for the process (each test is one), NULL for the
 * CPU's own choice. */
static void gemv_f32_cases(const char *ahead) {
    if (ahead) setenv("TOY_PREFETCH", ahead, 1);
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) cr_skip_test("no AVX2 + FMA");
    bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                  __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    struct toy_rng r;
    toy_rng_seed(&r, 41);
    const int64_t ks[] = {1, 5, 17, 64, 100, 576, 1537};
    for (int wide = 0; wide < (avx512 ? 2 : 1); wide++)
    for (size_t t = 0; t < sizeof ks / sizeof ks[0]; t++)
        for (int acc = 0; acc < 2; acc++) {
            int64_t k = ks[t], n = 37, ld = k + 3;
            float *w = malloc((size_t)(n * ld) * sizeof *w), *x = malloc((size_t)k * sizeof *x);
            float *y = malloc((size_t)n * sizeof *y), *yr = malloc((size_t)n * sizeof *yr);
            for (int64_t i = 0; i < n * ld; i++) w[i] = toy_rng_normal(&r);
            for (int64_t i = 0; i < k; i++) x[i] = toy_rng_normal(&r);
            for (int64_t i = 0; i < n; i++) y[i] = yr[i] = toy_rng_normal(&r);
            /* with a side stream to fetch ahead (over the weights themselves): same results */
            struct toy_prefetch pf = {{(const char *)w, (const char *)x}, {(size_t)(n * ld) * sizeof *w, (size_t)k * sizeof *x}};
            struct toy_pf_cursor pc;
            (wide ? toy_gemv_f32_avx512 : toy_gemv_f32_avx2)(w, ld, x, k, y, n, acc,
                                                              toy_pf_start(&pc, acc ? &pf : NULL, n));
            cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)n, (int)k, 1.0f, w, (int)ld, x, 1, acc ? 1.0f : 0.0f, yr, 1);
            for (int64_t i = 0; i < n; i++)
                cr_assert(fabsf(y[i] - yr[i]) <= 1e-5f * (1 + sqrtf((float)k) + fabsf(yr[i])),
                          "%s k %lld accum %d: y[%lld] = %.9g, sgemv %.9g", wide ? "avx512" : "avx2", (long long)k,
                          acc, (long long)i, y[i], yr[i]);
            free(w); free(x); free(y); free(yr);
        }
}
Test(ops, gemv_f32_matches_blas) { gemv_f32_cases(NULL); }
Test(ops, gemv_f32_prefetching_ahead_matches_blas) { gemv_f32_cases("4096"); }
Test(ops, gemv_f32_without_prefetch_matches_blas) { gemv_f32_cases("0"); }

/* toy's own SGEMM (gemm-f32-avx512.c) against double loops: every
 * transpose, alpha 1 and 0.75, beta 0 (C not read: it starts as NaN), 1
 * and 0.5, strides
 * wider than the rows, and shapes that cut blocks of k, of n and of m
 * (TOY_SGEMM_KC / NC / MC) and every tile edge. Columns past n of C keep
 * their sentinel. 1e-5 of the terms' magnitude. */
Test(ops, sgemm_avx512_matches_loops) {
    if (!toy_cpu_has_avx512()) cr_skip_test("no AVX-512");
    struct toy_rng r;
    toy_rng_seed(&r, 77);
    const int64_t shapes[][3] = {{1, 1, 1},      {1, 37, 5},    {13, 70, 37},  {12, 32, 256}, {25, 1100, 33},
                                 {200, 40, 800}, {7, 70, 1100}, {300, 17, 64}, {30, 530, 290}};
    float *pack = malloc(toy_sgemm_avx512_pack_floats() * sizeof(float));
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int t = 0; t < 4; t++)
            for (int bi = 0; bi < 3; bi++) {
                bool ta = t & 1, tb = t & 2;
                int64_t m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
                int64_t lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 5, ldc = n + 2;
                float beta = bi == 0 ? 0.0f : bi == 1 ? 1.0f : 0.5f;
                float *a = malloc((size_t)((ta ? k : m) * lda) * sizeof(float));
                float *b = malloc((size_t)((tb ? n : k) * ldb) * sizeof(float));
                float *c = malloc((size_t)(m * ldc) * sizeof(float)), *c0 = malloc((size_t)(m * ldc) * sizeof(float));
                for (int64_t i = 0; i < (ta ? k : m) * lda; i++) a[i] = toy_rng_normal(&r);
                for (int64_t i = 0; i < (tb ? n : k) * ldb; i++) b[i] = toy_rng_normal(&r);
                for (int64_t i = 0; i < m * ldc; i++)
                    c0[i] = c[i] = i % ldc >= n ? 7.0f : beta == 0 ? NAN : toy_rng_normal(&r);
                float alpha = s % 2 ? 0.75f : 1.0f;
                toy_sgemm_avx512(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, pack);
                for (int64_t i = 0; i < m; i++) {
                    for (int64_t j = 0; j < n; j++) {
                        double ref = beta != 0 ? (double)beta * c0[i * ldc + j] : 0, mag = fabs(ref);
                        for (int64_t q = 0; q < k; q++) {
                            double p = alpha * (double)(ta ? a[q * lda + i] : a[i * lda + q]) *
                                       (tb ? b[j * ldb + q] : b[q * ldb + j]);
                            ref += p, mag += fabs(p);
                        }
                        float v = c[i * ldc + j];
                        cr_assert(fabs(v - ref) <= 1e-5 * (1 + mag),
                                  "%lldx%lldx%lld ta %d tb %d alpha %g beta %g: c[%lld][%lld] = %.9g, loops %.9g",
                                  (long long)m, (long long)n, (long long)k, ta, tb, alpha, beta, (long long)i,
                                  (long long)j, v, ref);
                    }
                    for (int64_t j = n; j < ldc; j++) cr_assert_eq(c[i * ldc + j], 7.0f, "C written past column n");
                }
                free(a), free(b), free(c), free(c0);
            }
    free(pack);
}

/* F32 products through the engine on either route (TOY_SGEMM=own, =blas;
 * read once per process, each test is one), forward and backward, 2
 * threads, against double loops at 1e-5 */
static void f32_matmul_case(int64_t m, int64_t k, int64_t n, bool ta, bool tb) {
    struct toy_ctx *ctx = toy_ctx_init(true);
    struct toy_rng r;
    toy_rng_seed(&r, (uint64_t)(m * 13 + n * 7 + k));
    struct toy_tensor *a = ta ? toy_new_tensor_2d(ctx, TOY_F32, m, k) : toy_new_tensor_2d(ctx, TOY_F32, k, m);
    struct toy_tensor *b = tb ? toy_new_tensor_2d(ctx, TOY_F32, k, n) : toy_new_tensor_2d(ctx, TOY_F32, n, k);
    struct toy_tensor *dy = toy_new_tensor_2d(ctx, TOY_F32, n, m);
    float *af = a->data, *bf = b->data, *dyf = dy->data;
    for (int64_t i = 0; i < m * k; i++) af[i] = toy_rng_normal(&r);
    for (int64_t i = 0; i < n * k; i++) bf[i] = toy_rng_normal(&r);
    for (int64_t i = 0; i < n * m; i++) dyf[i] = toy_rng_normal(&r);
    toy_set_param(a);
    toy_set_param(b);
    struct toy_tensor *c = toy_matmul(ctx, a, b, ta, tb);
    toy_set_output(c);
    struct toy_threadpool *tp = run_backward(ctx, c, dy, 1);
#define AV(i, q) ((double)(ta ? af[(q) * m + (i)] : af[(i) * k + (q)]))
#define BV(q, j) ((double)(tb ? bf[(j) * k + (q)] : bf[(q) * n + (j)]))
    double worst = 0;
    for (int64_t i = 0; i < m; i++) /* C and dA = dY op(B)^T */
        for (int64_t j = 0; j < n; j++) {
            double ref = 0, mag = 0;
            for (int64_t q = 0; q < k; q++) ref += AV(i, q) * BV(q, j), mag += fabs(AV(i, q) * BV(q, j));
            double e = fabs(((float *)c->data)[i * n + j] - ref) / (1 + mag);
            if (e > worst) worst = e;
        }
    for (int64_t i = 0; i < m; i++)
        for (int64_t q = 0; q < k; q++) {
            double ref = 0, mag = 0;
            for (int64_t j = 0; j < n; j++) ref += dyf[i * n + j] * BV(q, j), mag += fabs(dyf[i * n + j] * BV(q, j));
            float g = ((float *)a->grad->data)[ta ? q * m + i : i * k + q];
            double e = fabs(g - ref) / (1 + mag);
            if (e > worst) worst = e;
        }
    for (int64_t q = 0; q < k; q++) /* dB = op(A)^T dY */
        for (int64_t j = 0; j < n; j++) {
            double ref = 0, mag = 0;
            for (int64_t i = 0; i < m; i++) ref += AV(i, q) * dyf[i * n + j], mag += fabs(AV(i, q) * dyf[i * n + j]);
            float g = ((float *)b->grad->data)[tb ? j * k + q : q * n + j];
            double e = fabs(g - ref) / (1 + mag);
            if (e > worst) worst = e;
        }
#undef AV
#undef BV
    cr_assert_leq(worst, 1e-5, "f32 matmul %lldx%lldx%lld ta=%d tb=%d (%s): error %g", (long long)m, (long long)k,
                  (long long)n, ta, tb, toy_cpu_f32_gemm(), worst);
    toy_threadpool_free(tp);
    toy_ctx_free(ctx);
}

static void f32_matmul_cases(const char *route) {
    setenv("TOY_SGEMM", route, 1);
    cr_assert_str_eq(toy_cpu_f32_gemm(), !strcmp(route, "blas") || !toy_cpu_has_avx512() ? "OpenBLAS" : "toy AVX-512");
    f32_matmul_case(13, 70, 37, false, true);
    f32_matmul_case(64, 576, 200, false, true);
    f32_matmul_case(9, 33, 130, false, false);
    f32_matmul_case(37, 70, 13, true, false);
    f32_matmul_case(300, 40, 20, false, true); /* more rows than columns: threads split the rows */
    f32_matmul_case(20, 600, 1100, false, true); /* blocks of k and of n */
}
Test(ops, f32_matmul_own_sgemm) { f32_matmul_cases("own"); }
Test(ops, f32_matmul_blas_sgemm) { f32_matmul_cases("blas"); }

/* The f16 and bf16 decode GEMVs against double loops over the same
 * values: f16 weights convert exactly and meet f32 activations; bf16
 * weights meet activations rounded to bf16 (as the bf16 GEMM rounds them),
 * products exact, sums in f32. Row lengths with every tail, a wide row
 * stride, accumulation. 1e-5 of the terms' magnitude. ahead: as above. */
static void gemv_half_cases(const char *ahead) {
    if (ahead) setenv("TOY_PREFETCH", ahead, 1);
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma") || !toy_cpu_has_f16c())
        cr_skip_test("no AVX2 + FMA + F16C");
    bool bf16 = toy_cpu_has_avx512bf16();
    struct toy_rng r;
    toy_rng_seed(&r, 45);
    const int64_t ks[] = {1, 7, 31, 33, 64, 96, 576, 1537};
    for (size_t t = 0; t < sizeof ks / sizeof ks[0]; t++)
        for (int acc = 0; acc < 2; acc++) {
            int64_t k = ks[t], n = 21, ld = k + 5, kp = (k + 31) / 32 * 32;
            uint16_t *wh = malloc((size_t)(n * ld) * 2), *wb = malloc((size_t)(n * ld) * 2), *xb = calloc((size_t)kp, 2);
            float *x = malloc((size_t)k * sizeof *x), *y = malloc((size_t)n * sizeof *y), *y0 = malloc((size_t)n * sizeof *y0);
            for (int64_t i = 0; i < n * ld; i++) {
                float v = toy_rng_normal(&r);
                wh[i] = toy_f32_to_f16(v);
                wb[i] = toy_f32_to_bf16(v);
            }
            for (int64_t i = 0; i < k; i++) {
                x[i] = toy_rng_normal(&r);
                xb[i] = toy_f32_to_bf16(x[i]);
            }
            for (int64_t i = 0; i < n; i++) y0[i] = toy_rng_normal(&r);
            for (int pass = 0; pass < (bf16 ? 3 : 1); pass++) { /* f16, bf16, bf16 with 64-byte loads */
                memcpy(y, y0, (size_t)n * sizeof *y);
                struct toy_prefetch pf = {{(const char *)x, NULL}, {(size_t)k * sizeof *x, 0}};
                struct toy_pf_cursor pc;
                if (pass == 0) toy_gemv_f16_avx2(wh, ld, x, k, y, n, acc, toy_pf_start(&pc, acc ? &pf : NULL, n));
                else (pass == 1 ? toy_gemv_bf16_avx512 : toy_gemv_bf16_wide_avx512)(
                    wb, ld, xb, k, y, n, acc, toy_pf_start(&pc, acc ? NULL : &pf, n));
                for (int64_t j = 0; j < n; j++) {
                    double e = acc ? y0[j] : 0, mag = fabs(e);
                    for (int64_t i = 0; i < k; i++) {
                        double p = pass == 0 ? (double)toy_f16_to_f32(wh[j * ld + i]) * x[i]
                                             : (double)toy_bf16_to_f32(wb[j * ld + i]) * toy_bf16_to_f32(xb[i]);
                        e += p;
                        mag += fabs(p);
                    }
                    cr_assert(fabs(y[j] - e) <= 1e-5 * (1 + mag), "%s k %lld accum %d: y[%lld] = %.9g, loop %.9g",
                              pass == 2 ? "bf16 wide" : pass ? "bf16" : "f16", (long long)k, acc, (long long)j, y[j], e);
                }
            }
            free(wh); free(wb); free(xb); free(x); free(y); free(y0);
        }
}
Test(ops, gemv_f16_bf16_match_loops) { gemv_half_cases(NULL); }
Test(ops, gemv_f16_bf16_prefetching_ahead_match_loops) { gemv_half_cases("4096"); }
Test(ops, gemv_f16_bf16_without_prefetch_match_loops) { gemv_half_cases("0"); }

/* How far ahead decode prefetches: by vendor (Intel: 2 KB), or the
 * user's $TOY_PREFETCH when it is a byte count toy can use. */
Test(ops, prefetch_distance_follows_vendor_and_override) {
    bool bad;
    cr_assert_eq(toy_cpu_prefetch_choice(true, NULL, 1, &bad), 2048);
    cr_assert(!bad);
    cr_assert_eq(toy_cpu_prefetch_choice(false, NULL, 1, &bad), 0);
    cr_assert_eq(toy_cpu_prefetch_choice(false, "", 1, &bad), 0);
    cr_assert(!bad);
    cr_assert_eq(toy_cpu_prefetch_choice(true, "0", 1, &bad), 0);
    cr_assert_eq(toy_cpu_prefetch_choice(false, "4096", 1, &bad), 4096);
    cr_assert_eq(toy_cpu_prefetch_choice(false, "65536", 1, &bad), 65536);
    cr_assert(!bad);
    const char *no[] = {"100", "-64", "65600", "2k", "abc", " 64", "64 "};
    for (size_t i = 0; i < sizeof no / sizeof no[0]; i++) {
        cr_assert_eq(toy_cpu_prefetch_choice(true, no[i], 1, &bad), 2048, "%s", no[i]);
        cr_assert(bad, "%s taken", no[i]);
        cr_assert_eq(toy_cpu_prefetch_choice(false, no[i], 1, &bad), 0, "%s", no[i]);
        cr_assert_eq(toy_cpu_prefetch_choice(false, no[i], 2, &bad), 4096, "%s", no[i]);
    }
    /* passes over several rows: further ahead on AMD, Intel's distance there, the override for all */
    cr_assert_eq(toy_cpu_prefetch_choice(false, NULL, 2, &bad), 4096);
    cr_assert_eq(toy_cpu_prefetch_choice(false, NULL, 8, &bad), 4096);
    cr_assert_eq(toy_cpu_prefetch_choice(true, NULL, 5, &bad), 2048);
    cr_assert_eq(toy_cpu_prefetch_choice(false, "0", 5, &bad), 0);
    cr_assert_eq(toy_cpu_prefetch_choice(false, "1024", 5, &bad), 1024);
    cr_assert(!bad);
}

/* A decode matmul (one activation row) over f16 and bf16 weights takes the
 * GEMVs above; the same row inside a 3-row product takes the f32-copy /
 * bf16-panel paths: equal within the summation order, at 1 and 2 threads. */
static void half_weights_decode_cases(void);
Test(ops, matmul_half_weights_decode_equals_batch) { half_weights_decode_cases(); }
/* where the CPU has no AVX-512 BF16 (forced off): bf16 rows through
 * gemv-avx2.c's bf16 GEMV against the widened rows' sgemm */
Test(ops, matmul_half_weights_decode_equals_batch_without_avx512_bf16) {
    setenv("TOY_BF16_GEMM", "0", 1); /* each Criterion test is its own process */
    half_weights_decode_cases();
}

static void half_weights_decode_cases(void) {
    struct toy_rng r;
    toy_rng_seed(&r, 46);
    const enum toy_dtype types[] = {TOY_F16, TOY_BF16};
    for (int ti = 0; ti < 2; ti++)
        for (int nth = 1; nth <= 2; nth++) {
            const int64_t k = 200, n = 77;
            struct toy_ctx *ctx = toy_ctx_init(true);
            struct toy_tensor *w = toy_new_tensor_2d(ctx, types[ti], k, n);
            struct toy_tensor *x1 = toy_new_tensor_2d(ctx, TOY_F32, k, 1), *x3 = toy_new_tensor_2d(ctx, TOY_F32, k, 3);
            for (int64_t i = 0; i < k * n; i++) {
                float v = toy_rng_normal(&r);
                ((uint16_t *)w->data)[i] = types[ti] == TOY_F16 ? toy_f32_to_f16(v) : toy_f32_to_bf16(v);
            }
            for (int64_t i = 0; i < 3 * k; i++) ((float *)x3->data)[i] = toy_rng_normal(&r);
            memcpy(x1->data, x3->data, (size_t)k * sizeof(float));
            struct toy_tensor *y1 = toy_matmul(ctx, x1, w, false, true), *y3 = toy_matmul(ctx, x3, w, false, true);
            toy_set_output(y1);
            toy_set_output(y3);
            struct toy_graph *g = toy_graph_new(ctx);
            toy_graph_build(g, y1);
            toy_graph_build(g, y3);
            struct toy_threadpool *tp = toy_threadpool_new(nth);
            cr_assert_eq(toy_graph_compute(g, tp), TOY_OK, "%s", toy_last_error());
            for (int64_t j = 0; j < n; j++) {
                float a = ((float *)y1->data)[j], b = ((float *)y3->data)[j];
                cr_assert(fabsf(a - b) <= 1e-5f * (1 + sqrtf((float)k)), "%s threads %d: column %lld: decode %.9g, batch %.9g",
                          toy_dtype_name(types[ti]), nth, (long long)j, a, b);
            }
            toy_threadpool_free(tp);
            toy_ctx_free(ctx);
        }
}

/* The decode attention products (attn-decode-avx512.c and
 * attn-decode-avx2.c: one query against the cached keys and values) against
 * plain loops, for head sizes 16..256, key counts with every tail, padded
 * row strides. 1e-5 relative: only the summation order differs. */
void toy_attn_decode_scores_avx512(const float *q, const float *K, int64_t ldk, int64_t nk, int64_t D, float scale,
                                   float *s);
void toy_attn_decode_values_avx512(const float *p, const float *V, int64_t ldv, int64_t nk, int64_t D, float *o);
void toy_attn_decode_scores_avx2(const float *q, const float *K, int64_t ldk, int64_t nk, int64_t D, float scale,
                                 float *s);
void toy_attn_decode_values_avx2(const float *p, const float *V, int64_t ldv, int64_t nk, int64_t D, float *o);

static void decode_kernels_case(bool avx512) {
    struct toy_rng r;
    toy_rng_seed(&r, 43);
    const int64_t Ds[] = {16, 64, 128, 256, 24}, nks[] = {1, 3, 5, 130};
    for (size_t a = 0; a < (avx512 ? 4 : 5); a++)
        for (size_t b = 0; b < 4; b++) {
            int64_t D = Ds[a], nk = nks[b], ld = D + 16;
            float *q = malloc((size_t)D * sizeof *q), *K = malloc((size_t)(nk * ld) * sizeof *K);
            float *s = malloc((size_t)nk * sizeof *s), *o = malloc((size_t)D * sizeof *o);
            for (int64_t i = 0; i < D; i++) q[i] = toy_rng_normal(&r);
            for (int64_t i = 0; i < nk * ld; i++) K[i] = toy_rng_normal(&r);
            (avx512 ? toy_attn_decode_scores_avx512 : toy_attn_decode_scores_avx2)(q, K, ld, nk, D, 0.125f, s);
            for (int64_t j = 0; j < nk; j++) {
                double e = 0;
                for (int64_t i = 0; i < D; i++) e += (double)q[i] * K[j * ld + i];
                e *= 0.125;
                cr_assert(fabs(s[j] - e) <= 1e-5 * (1 + sqrt((double)D)), "D %lld nk %lld: s[%lld] %g vs %g",
                          (long long)D, (long long)nk, (long long)j, s[j], e);
            }
            /* the scores as weights, K as values */
            (avx512 ? toy_attn_decode_values_avx512 : toy_attn_decode_values_avx2)(s, K, ld, nk, D, o);
            for (int64_t i = 0; i < D; i++) {
                double e = 0, mag = 0;
                for (int64_t j = 0; j < nk; j++) {
                    e += (double)s[j] * K[j * ld + i];
                    mag += fabs((double)s[j] * K[j * ld + i]);
                }
                cr_assert(fabs(o[i] - e) <= 1e-5 * (1 + mag), "D %lld nk %lld: o[%lld] %g vs %g", (long long)D,
                          (long long)nk, (long long)i, o[i], e);
            }
            free(q); free(K); free(s); free(o);
        }
}

Test(ops, attention_decode_kernels_match_loops) {
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512f")) cr_skip_test("no AVX-512");
    decode_kernels_case(true);
}

Test(ops, attention_decode_kernels_avx2_match_loops) {
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) cr_skip_test("no AVX2");
    decode_kernels_case(false);
}

/* element i of a KV cache (f32 or f16) set to x */
static void cache_set(struct toy_tensor *c, int64_t i, float x) {
    if (c->type == TOY_F16) ((toy_f16 *)c->data)[i] = toy_f32_to_f16(x);
    else ((float *)c->data)[i] = x;
}

/* the cached attention of q over the caches, which first store kn and vn at
 * position *np, computed on nth threads; the result stays in ctx */
static struct toy_tensor *cached_attention_on(struct toy_ctx *ctx, struct toy_tensor *q, struct toy_tensor *kc,
                                              struct toy_tensor *vc, struct toy_tensor *kn, struct toy_tensor *vn,
                                              struct toy_tensor *np, const struct toy_attn_params *ap, int nth) {
    struct toy_tensor *y =
        toy_attention_cached(ctx, q, toy_kv_store(ctx, kc, kn, np), toy_kv_store(ctx, vc, vn, np), np, ap);
    toy_set_output(y);
    struct toy_graph *g = toy_graph_new(ctx);
    toy_graph_build(g, y);
    struct toy_threadpool *tp = toy_threadpool_new(nth);
    cr_assert_eq(toy_graph_compute(g, tp), TOY_OK, "%s", toy_last_error());
    toy_threadpool_free(tp);
    return y;
}

/* A decode step (one query per sequence against the cache) through the
 * attention op: every head at once, the keys split between the threads and
 * the softmax pieces merged (attention.c decode_step) -- against a plain
 * double-precision loop, for f32 and f16 caches, GQA groups of 1..4 and 8, head
 * sizes 64 and 128, windows, softcap, 1..3 threads and key counts from 1 to
 * ~1000 (every 16-key tail). 2e-5 relative: the summation order differs. */
static void decode_step_cases(void);
Test(ops, attention_decode_step_matches_loops) { decode_step_cases(); }
/* the same on the AVX2 kernels (attn-decode-avx2.c) */
Test(ops, attention_decode_step_avx2_matches_loops) {
    setenv("TOY_SIMD", "avx2", 1); /* each Criterion test is its own process */
    decode_step_cases();
}

struct qcase {
    int64_t D, Hq, Hkv, Tk, Tq, B;
    int window;
    float cap;
    enum toy_dtype type;
};
static void cached_attention_cases(const struct qcase *cs, size_t n, uint64_t seed);

static void decode_step_cases(void) {
    static const struct qcase cs[] = {
        {64, 9, 3, 277, 1, 2, 0, 0, TOY_F32}, {64, 9, 3, 277, 1, 1, 0, 0, TOY_F16}, {128, 4, 4, 40, 1, 1, 16, 0, TOY_F32},
        {64, 8, 2, 5, 1, 1, 0, 30, TOY_F32},  {64, 9, 3, 1, 1, 1, 0, 0, TOY_F16},   {128, 6, 2, 1003, 1, 1, 0, 0, TOY_F32},
        {64, 4, 1, 33, 1, 3, 7, 20, TOY_F16}, {128, 16, 2, 300, 1, 1, 0, 0, TOY_F16}, {64, 8, 1, 50, 1, 1, 0, 0, TOY_F32},
    };
    cached_attention_cases(cs, sizeof cs / sizeof cs[0], 7);
}

/* A few queries at once (a speculative pass: the token and its draft) through the attention op: each row as
 * a decode step of its own over the keys it sees (attention.c few_queries), against a plain double-precision
 * loop and, bit for bit, against decode steps, for f32 and f16 caches, 2 to 16 queries (17: the general path),
 * GQA, windows, softcap, 1..3 threads. */
static void few_queries_cases(void);
Test(ops, attention_few_queries_match_loops) { few_queries_cases(); }
/* the same on the AVX2 kernels */
Test(ops, attention_few_queries_avx2_match_loops) {
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) cr_skip_test("no AVX2");
    setenv("TOY_SIMD", "avx2", 1); /* each Criterion test is its own process */
    few_queries_cases();
}

static void few_queries_cases(void) {
    static const struct qcase cs[] = {
        {64, 9, 3, 277, 5, 1, 0, 0, TOY_F16}, {64, 9, 3, 40, 2, 2, 0, 0, TOY_F32},  {128, 4, 4, 60, 16, 1, 16, 0, TOY_F32},
        {64, 8, 2, 9, 8, 1, 0, 30, TOY_F16},  {64, 4, 1, 33, 3, 3, 7, 20, TOY_F16}, {128, 16, 2, 300, 9, 1, 0, 0, TOY_F16},
        {64, 9, 3, 50, 17, 1, 0, 0, TOY_F32},
    };
    cached_attention_cases(cs, sizeof cs / sizeof cs[0], 11);
}

/* The attention op over caches that hold Tk - Tq positions, the last Tq stored by the op itself, for each case
 * on 1..3 threads, against a plain double-precision loop (2e-5 relative: the summation order differs). */
static void cached_attention_cases(const struct qcase *cs, size_t n_cases, uint64_t seed) {
    struct toy_rng r;
    toy_rng_seed(&r, seed);
    for (size_t ci = 0; ci < n_cases; ci++)
        for (int nth = 1; nth <= 3; nth++) {
            struct qcase c = cs[ci];
            struct toy_ctx *ctx = toy_ctx_init(true);
            struct toy_tensor *q = toy_new_tensor_4d(ctx, TOY_F32, c.D, c.Hq, c.Tq, c.B);
            /* the cache holds Tk - Tq positions and 3 unused ones; the pass stores the last Tq */
            const int64_t Tmax = c.Tk + 3, row = c.D * c.Hkv, past = c.Tk - c.Tq;
            struct toy_tensor *kc = toy_new_tensor_4d(ctx, c.type, c.D, c.Hkv, Tmax, c.B);
            struct toy_tensor *vc = toy_new_tensor_4d(ctx, c.type, c.D, c.Hkv, Tmax, c.B);
            struct toy_tensor *kn = toy_new_tensor_4d(ctx, TOY_F32, c.D, c.Hkv, c.Tq, c.B);
            struct toy_tensor *vn = toy_new_tensor_4d(ctx, TOY_F32, c.D, c.Hkv, c.Tq, c.B);
            struct toy_tensor *np = toy_new_tensor_1d(ctx, TOY_I32, 1);
            *(int32_t *)np->data = (int32_t)past;
            int64_t nkv = c.B * c.Tk * row;
            float *kf = malloc((size_t)nkv * sizeof *kf), *vf = malloc((size_t)nkv * sizeof *vf);
            for (int64_t i = 0; i < toy_nelements(q); i++) ((float *)q->data)[i] = toy_rng_normal(&r);
            for (int64_t b = 0; b < c.B; b++)
                for (int64_t j = 0; j < c.Tk; j++)
                    for (int64_t i = 0; i < row; i++) {
                        int64_t at = (b * c.Tk + j) * row + i, in = (b * Tmax + j) * row + i;
                        kf[at] = toy_rng_normal(&r);
                        vf[at] = toy_rng_normal(&r);
                        if (c.type == TOY_F16) { /* values an f16 holds exactly */
                            kf[at] = toy_f16_to_f32(toy_f32_to_f16(kf[at]));
                            vf[at] = toy_f16_to_f32(toy_f32_to_f16(vf[at]));
                        }
                        if (j >= past) {
                            ((float *)kn->data)[(b * c.Tq + j - past) * row + i] = kf[at];
                            ((float *)vn->data)[(b * c.Tq + j - past) * row + i] = vf[at];
                        } else {
                            cache_set(kc, in, kf[at]);
                            cache_set(vc, in, vf[at]);
                        }
                    }
            struct toy_attn_params ap = {.causal = true, .window = c.window, .softcap = c.cap};
            const float *out = cached_attention_on(ctx, q, kc, vc, kn, vn, np, &ap, nth)->data;
            double scale = 1 / sqrt((double)c.D);
            double *p = malloc((size_t)c.Tk * sizeof *p);
            for (int64_t b = 0; b < c.B; b++)
                for (int64_t t = 0; t < c.Tq; t++)
                    for (int64_t h = 0; h < c.Hq; h++) {
                        int64_t gh = h / (c.Hq / c.Hkv), pos = past + t;
                        int64_t j0 = c.window > 0 && pos + 1 > c.window ? pos + 1 - c.window : 0;
                        const float *qh = (const float *)q->data + ((b * c.Tq + t) * c.Hq + h) * c.D;
                        double mx = -INFINITY, sum = 0;
                        for (int64_t j = j0; j <= pos; j++) {
                            const float *kr = kf + ((b * c.Tk + j) * c.Hkv + gh) * c.D;
                            double sc = 0;
                            for (int64_t i = 0; i < c.D; i++) sc += (double)qh[i] * kr[i];
                            sc *= scale;
                            if (c.cap > 0) sc = c.cap * tanh(sc / c.cap);
                            p[j] = sc;
                            if (sc > mx) mx = sc;
                        }
                        for (int64_t j = j0; j <= pos; j++) sum += p[j] = exp(p[j] - mx);
                        for (int64_t i = 0; i < c.D; i++) {
                            double o = 0;
                            for (int64_t j = j0; j <= pos; j++) o += p[j] / sum * vf[((b * c.Tk + j) * c.Hkv + gh) * c.D + i];
                            double got = out[((b * c.Tq + t) * c.Hq + h) * c.D + i];
                            cr_assert(fabs(got - o) <= 2e-5 * (1 + fabs(o)),
                                      "case %zu threads %d b %lld t %lld h %lld: out[%lld] %.8g vs %.8g", ci, nth,
                                      (long long)b, (long long)t, (long long)h, (long long)i, got, o);
                        }
                    }
            free(p);
            /* a few queries (attention.c few_queries): each row the bits a decode step of its own gives it, on as
             * many threads, so a token sampled after a draft is the one plain decoding samples */
            for (int64_t t = 0; c.Tq > 1 && c.Tq <= 16 && t < c.Tq; t++) {
                struct toy_tensor *q1 = toy_new_tensor_4d(ctx, TOY_F32, c.D, c.Hq, 1, c.B);
                struct toy_tensor *k1 = toy_new_tensor_4d(ctx, TOY_F32, c.D, c.Hkv, 1, c.B);
                struct toy_tensor *v1 = toy_new_tensor_4d(ctx, TOY_F32, c.D, c.Hkv, 1, c.B);
                struct toy_tensor *np1 = toy_new_tensor_1d(ctx, TOY_I32, 1);
                *(int32_t *)np1->data = (int32_t)(past + t);
                for (int64_t b = 0; b < c.B; b++) {
                    memcpy((float *)q1->data + b * c.Hq * c.D, (const float *)q->data + (b * c.Tq + t) * c.Hq * c.D,
                           (size_t)(c.Hq * c.D) * sizeof(float));
                    memcpy((float *)k1->data + b * row, (const float *)kn->data + (b * c.Tq + t) * row,
                           (size_t)row * sizeof(float));
                    memcpy((float *)v1->data + b * row, (const float *)vn->data + (b * c.Tq + t) * row,
                           (size_t)row * sizeof(float));
                }
                const float *one = cached_attention_on(ctx, q1, kc, vc, k1, v1, np1, &ap, nth)->data;
                for (int64_t b = 0; b < c.B; b++)
                    cr_assert(!memcmp(one + b * c.Hq * c.D, out + (b * c.Tq + t) * c.Hq * c.D,
                                      (size_t)(c.Hq * c.D) * sizeof(float)),
                              "case %zu threads %d b %lld: query %lld is not the decode step's", ci, nth, (long long)b,
                              (long long)t);
            }
            toy_ctx_free(ctx);
            free(kf);
            free(vf);
        }
}

/* Query rows of several sequences at once (toy serve's decode step over its slots, drafts included):
 * toy_kv_store_rows puts each row's key and value at its sequence's position, and toy_attention_rows gives each
 * row, bit for bit, what a decode step of its sequence alone gives on as many threads -- for f32 and f16 caches,
 * GQA, windows, softcap, sinks, the decode kernels' heads (64, 128), a latent-attention-wide one (576) and one
 * the general path takes (96), on 1..3 threads. A row outside the caches fails the run and writes nothing. */
static void attention_rows_cases(void);
Test(ops, attention_rows_give_each_row_its_decode_step) { attention_rows_cases(); }
Test(ops, attention_rows_avx2_give_each_row_its_decode_step) {
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) cr_skip_test("no AVX2");
    setenv("TOY_SIMD", "avx2", 1); /* each Criterion test is its own process */
    attention_rows_cases();
}

static struct toy_tensor *rows_pass(struct toy_ctx *ctx, struct toy_tensor *q, struct toy_tensor *kc,
                                    struct toy_tensor *vc, struct toy_tensor *kn, struct toy_tensor *vn,
                                    struct toy_tensor *seq, struct toy_tensor *pos, const struct toy_attn_params *ap,
                                    int nth, enum toy_status *st) {
    struct toy_tensor *y = toy_attention_rows(ctx, q, toy_kv_store_rows(ctx, kc, kn, seq, pos),
                                              toy_kv_store_rows(ctx, vc, vn, seq, pos), seq, pos, ap);
    toy_set_output(y);
    struct toy_graph *g = toy_graph_new(ctx);
    toy_graph_build(g, y);
    struct toy_threadpool *tp = toy_threadpool_new(nth);
    *st = toy_graph_compute(g, tp);
    toy_threadpool_free(tp);
    return y;
}

static void attention_rows_cases(void) {
    struct rcase {
        int64_t D, Hq, Hkv, S, R;
        int window;
        float cap;
        bool sinks;
        enum toy_dtype type;
        int32_t seq[12], pos[12];
    };
    static const struct rcase cs[] = {
        {64, 9, 3, 4, 4, 0, 0, false, TOY_F16, {0, 1, 2, 3}, {0, 37, 290, 5}},
        {64, 9, 3, 3, 7, 0, 0, true, TOY_F32, {2, 2, 2, 0, 1, 1, 1}, {100, 101, 102, 16, 3, 4, 5}},
        {128, 8, 2, 2, 5, 24, 30, false, TOY_F16, {1, 0, 0, 0, 0}, {200, 40, 41, 42, 43}},
        {128, 4, 4, 5, 3, 0, 0, false, TOY_F32, {4, 0, 2}, {63, 64, 1}},
        {96, 6, 2, 3, 4, 0, 0, false, TOY_F16, {1, 2, 2, 0}, {50, 7, 8, 120}},
        {576, 16, 1, 2, 3, 0, 0, false, TOY_F16, {1, 1, 0}, {33, 34, 70}},
    };
    const int64_t Tmax = 300;
    struct toy_rng r;
    toy_rng_seed(&r, 23);
    for (size_t ci = 0; ci < sizeof cs / sizeof cs[0]; ci++)
        for (int nth = 1; nth <= 3; nth++) {
            const struct rcase *c = &cs[ci];
            const int64_t row = c->D * c->Hkv;
            struct toy_ctx *ctx = toy_ctx_init(true);
            struct toy_tensor *q = toy_new_tensor_4d(ctx, TOY_F32, c->D, c->Hq, c->R, 1);
            struct toy_tensor *kc = toy_new_tensor_4d(ctx, c->type, c->D, c->Hkv, Tmax, c->S);
            struct toy_tensor *vc = toy_new_tensor_4d(ctx, c->type, c->D, c->Hkv, Tmax, c->S);
            struct toy_tensor *kn = toy_new_tensor_4d(ctx, TOY_F32, c->D, c->Hkv, c->R, 1);
            struct toy_tensor *vn = toy_new_tensor_4d(ctx, TOY_F32, c->D, c->Hkv, c->R, 1);
            struct toy_tensor *seq = toy_new_tensor_1d(ctx, TOY_I32, c->R), *pos = toy_new_tensor_1d(ctx, TOY_I32, c->R);
            struct toy_tensor *sinks = toy_new_tensor_1d(ctx, TOY_F32, c->Hq);
            memcpy(seq->data, c->seq, (size_t)c->R * sizeof(int32_t));
            memcpy(pos->data, c->pos, (size_t)c->R * sizeof(int32_t));
            for (int64_t i = 0; i < toy_nelements(q); i++) ((float *)q->data)[i] = toy_rng_normal(&r);
            for (int64_t i = 0; i < toy_nelements(kn); i++) {
                ((float *)kn->data)[i] = toy_f16_to_f32(toy_f32_to_f16(toy_rng_normal(&r)));
                ((float *)vn->data)[i] = toy_f16_to_f32(toy_f32_to_f16(toy_rng_normal(&r)));
            }
            for (int64_t i = 0; i < toy_nelements(kc); i++) {
                cache_set(kc, i, toy_rng_normal(&r));
                cache_set(vc, i, toy_rng_normal(&r));
            }
            for (int64_t h = 0; h < c->Hq; h++) ((float *)sinks->data)[h] = toy_rng_normal(&r);
            struct toy_attn_params ap = {.window = c->window, .softcap = c->cap, .sinks = c->sinks ? sinks : NULL};
            enum toy_status st;
            const float *out = rows_pass(ctx, q, kc, vc, kn, vn, seq, pos, &ap, nth, &st)->data;
            cr_assert_eq(st, TOY_OK, "case %zu: %s", ci, toy_last_error());
            size_t es = toy_dtype_type_size(c->type), seq_bytes = (size_t)(Tmax * row) * es;
            for (int64_t t = 0; t < c->R; t++) {
                /* the row stored where it belongs */
                float got[576];
                for (int64_t i = 0; i < row; i++) {
                    int64_t at = ((int64_t)c->seq[t] * Tmax + c->pos[t]) * row + i;
                    got[i % c->D] = c->type == TOY_F16 ? toy_f16_to_f32(((const toy_f16 *)kc->data)[at])
                                                       : ((const float *)kc->data)[at];
                    cr_assert_eq(got[i % c->D], ((const float *)kn->data)[t * row + i], "case %zu row %lld: key %lld",
                                 ci, (long long)t, (long long)i);
                }
                /* a decode step of its sequence alone, over a copy of that sequence's caches as the pass left them */
                struct toy_tensor *k1 = toy_new_tensor_4d(ctx, c->type, c->D, c->Hkv, Tmax, 1);
                struct toy_tensor *v1 = toy_new_tensor_4d(ctx, c->type, c->D, c->Hkv, Tmax, 1);
                memcpy(k1->data, (const char *)kc->data + c->seq[t] * seq_bytes, seq_bytes);
                memcpy(v1->data, (const char *)vc->data + c->seq[t] * seq_bytes, seq_bytes);
                struct toy_tensor *q1 = toy_new_tensor_4d(ctx, TOY_F32, c->D, c->Hq, 1, 1);
                struct toy_tensor *kn1 = toy_new_tensor_4d(ctx, TOY_F32, c->D, c->Hkv, 1, 1);
                struct toy_tensor *vn1 = toy_new_tensor_4d(ctx, TOY_F32, c->D, c->Hkv, 1, 1);
                struct toy_tensor *np1 = toy_new_tensor_1d(ctx, TOY_I32, 1);
                *(int32_t *)np1->data = c->pos[t];
                memcpy(q1->data, (const float *)q->data + t * c->Hq * c->D, (size_t)(c->Hq * c->D) * sizeof(float));
                memcpy(kn1->data, (const float *)kn->data + t * row, (size_t)row * sizeof(float));
                memcpy(vn1->data, (const float *)vn->data + t * row, (size_t)row * sizeof(float));
                const float *one = cached_attention_on(ctx, q1, k1, v1, kn1, vn1, np1, &ap, nth)->data;
                cr_assert(!memcmp(one, out + t * c->Hq * c->D, (size_t)(c->Hq * c->D) * sizeof(float)),
                          "case %zu threads %d: row %lld (sequence %d at %d) is not its decode step's", ci, nth,
                          (long long)t, c->seq[t], c->pos[t]);
            }
            /* a row past the caches: the run fails, and no row is written */
            void *before = malloc(toy_nbytes(kc));
            memcpy(before, kc->data, toy_nbytes(kc));
            for (int64_t i = 0; i < toy_nelements(kn); i++) ((float *)kn->data)[i] += 1;
            ((int32_t *)pos->data)[c->R - 1] = (int32_t)Tmax;
            rows_pass(ctx, q, kc, vc, kn, vn, seq, pos, &ap, nth, &st);
            cr_assert_eq(st, TOY_ERR_RANGE, "case %zu: a row past the cache gave %d", ci, st);
            cr_assert(!memcmp(before, kc->data, toy_nbytes(kc)), "case %zu: a failed store wrote rows", ci);
            free(before);
            toy_ctx_free(ctx);
        }
}

/* A prefill over an f16 cache (several query blocks of 64 after earlier
 * positions, GQA, windows, softcap, 1..3 threads) equals the same over an
 * f32 cache that holds the same values, bit for bit: the f16 rows are
 * converted once per kv head and kept for the blocks and query heads that
 * read them next (attention.c struct rows32), and must be the rows each
 * block asks for. */
Test(ops, attention_prefill_over_an_f16_cache_equals_f32) {
    struct pcase {
        int64_t D, Hq, Hkv, past, Tq, B;
        int window;
        float cap;
    } cs[] = {
        {64, 9, 3, 40, 150, 1, 0, 0}, {64, 9, 3, 0, 200, 1, 50, 0}, {128, 4, 2, 7, 70, 2, 0, 20}, {64, 2, 1, 65, 64, 1, 30, 0},
    };
    struct toy_rng r;
    toy_rng_seed(&r, 11);
    for (size_t ci = 0; ci < sizeof cs / sizeof cs[0]; ci++)
        for (int nth = 1; nth <= 3; nth++) {
            struct pcase c = cs[ci];
            const int64_t Tmax = c.past + c.Tq + 3, row = c.D * c.Hkv;
            float *out[2];
            struct toy_rng r0 = r; /* both caches get the same values */
            for (int f16 = 0; f16 < 2; f16++) {
                r = r0;
                enum toy_dtype type = f16 ? TOY_F16 : TOY_F32;
                struct toy_ctx *ctx = toy_ctx_init(true);
                struct toy_tensor *q = toy_new_tensor_4d(ctx, TOY_F32, c.D, c.Hq, c.Tq, c.B);
                struct toy_tensor *kc = toy_new_tensor_4d(ctx, type, c.D, c.Hkv, Tmax, c.B);
                struct toy_tensor *vc = toy_new_tensor_4d(ctx, type, c.D, c.Hkv, Tmax, c.B);
                struct toy_tensor *kn = toy_new_tensor_4d(ctx, TOY_F32, c.D, c.Hkv, c.Tq, c.B);
                struct toy_tensor *vn = toy_new_tensor_4d(ctx, TOY_F32, c.D, c.Hkv, c.Tq, c.B);
                struct toy_tensor *np = toy_new_tensor_1d(ctx, TOY_I32, 1);
                *(int32_t *)np->data = (int32_t)c.past;
                for (int64_t i = 0; i < toy_nelements(q); i++) ((float *)q->data)[i] = toy_rng_normal(&r);
                for (int64_t b = 0; b < c.B; b++)
                    for (int64_t j = 0; j < c.past + c.Tq; j++)
                        for (int64_t i = 0; i < row; i++) {
                            /* values an f16 holds exactly */
                            float kv[2] = {toy_f16_to_f32(toy_f32_to_f16(toy_rng_normal(&r))),
                                           toy_f16_to_f32(toy_f32_to_f16(toy_rng_normal(&r)))};
                            int64_t in = (b * Tmax + j) * row + i;
                            if (j >= c.past) {
                                ((float *)kn->data)[(b * c.Tq + j - c.past) * row + i] = kv[0];
                                ((float *)vn->data)[(b * c.Tq + j - c.past) * row + i] = kv[1];
                            } else {
                                cache_set(kc, in, kv[0]);
                                cache_set(vc, in, kv[1]);
                            }
                        }
                struct toy_attn_params ap = {.causal = true, .window = c.window, .softcap = c.cap};
                struct toy_tensor *y = cached_attention_on(ctx, q, kc, vc, kn, vn, np, &ap, nth);
                out[f16] = malloc(toy_nbytes(y));
                memcpy(out[f16], y->data, toy_nbytes(y));
                int64_t n = toy_nelements(y);
                toy_ctx_free(ctx);
                if (f16)
                    for (int64_t i = 0; i < n; i++)
                        cr_assert(out[0][i] == out[1][i] && isfinite(out[0][i]),
                                  "case %zu threads %d: out[%lld] f16 cache %.9g, f32 cache %.9g", ci, nth,
                                  (long long)i, out[1][i], out[0][i]);
            }
            free(out[0]);
            free(out[1]);
        }
}

/* Each thread keeps the rotary angles of its last positions (cpu.c): runs
 * of one graph with new position contents, and a second graph with other
 * parameters in between, give what a fresh computation gives. */
Test(ops, rope_angle_cache_follows_positions_and_parameters) {
    const int64_t D = 64, H = 3, T = 40;
    struct toy_threadpool *tp = toy_threadpool_new(2);
    struct toy_ctx *ctx = toy_ctx_init(true);
    struct toy_tensor *x = toy_new_tensor_4d(ctx, TOY_F32, D, H, T, 1), *pos = toy_new_tensor_1d(ctx, TOY_I32, T);
    for (int64_t i = 0; i < D * H * T; i++) ((float *)x->data)[i] = sinf(0.37f * (float)i);
    struct toy_rope_params a = {.freq_base = 10000}, b = {.freq_base = 500000, .mode = TOY_ROPE_NEOX};
    struct toy_tensor *ya = toy_rope(ctx, x, pos, &a), *yb = toy_rope(ctx, x, pos, &b);
    toy_set_output(ya);
    toy_set_output(yb);
    struct toy_graph *ga = toy_graph_new(ctx), *gb = toy_graph_new(ctx);
    toy_graph_build(ga, ya);
    toy_graph_build(gb, yb);
    float *first = malloc((size_t)(D * H * T) * sizeof *first);
    for (int run = 0; run < 5; run++) { /* positions A, B (then other parameters), A, B, B */
        for (int64_t t = 0; t < T; t++) ((int32_t *)pos->data)[t] = (int32_t)(run % 2 || run == 4 ? 1000 + 3 * t : t);
        cr_assert_eq(toy_graph_compute(ga, tp), TOY_OK);
        if (run == 0) memcpy(first, ya->data, (size_t)(D * H * T) * sizeof *first);
        if (run == 2) cr_assert(!memcmp(first, ya->data, (size_t)(D * H * T) * sizeof *first), "run 2 differs from run 0");
        /* a plain evaluation of the rotation at these positions */
        for (int64_t t = 0; t < T; t += 13)
            for (int64_t i = 0; i < D / 2; i++) {
                double th = ((int32_t *)pos->data)[t] * pow(10000.0, -2.0 * (double)i / (double)D);
                const float *xr = (const float *)x->data + t * H * D, *yr = (const float *)ya->data + t * H * D;
                double e0 = xr[2 * i] * cos(th) - xr[2 * i + 1] * sin(th);
                cr_assert(fabs(yr[2 * i] - e0) <= 1e-5 * (1 + fabs(e0)), "run %d t %lld i %lld: %g vs %g", run,
                          (long long)t, (long long)i, yr[2 * i], e0);
            }
        if (run == 1) cr_assert_eq(toy_graph_compute(gb, tp), TOY_OK); /* other parameters in between */
    }
    free(first);
    toy_ctx_free(ctx);
    toy_threadpool_free(tp);
}

/* Errors are prefixed with where they happened by passing the last error
 * back in (toy_error(st, "%s: %s", path, toy_last_error())): the message
 * must come out whole, not overwritten while it is read. */
Test(ops, error_messages_can_wrap_the_last_error) {
    toy_error(TOY_ERR_FORMAT, "line %d: expected an object", 2);
    cr_assert_eq(toy_error(TOY_ERR_FORMAT, "%s: %s", "data/sft.jsonl", toy_last_error()), TOY_ERR_FORMAT);
    cr_expect_str_eq(toy_last_error(), "data/sft.jsonl: line 2: expected an object");
    toy_error(TOY_ERR_IO, "%s and %s", toy_last_error(), toy_last_error());
    cr_expect_str_eq(toy_last_error(), "data/sft.jsonl: line 2: expected an object and data/sft.jsonl: line 2: "
                                       "expected an object");
}

/* OpenBLAS falls back to its generic SSE3 kernels ("Prescott") on a CPU
 * newer than its release (blas.c); toy picks the core the CPU's flags
 * allow, and only repairs that fallback. */
Test(ops, blas_core_follows_the_cpu_isa) {
    cr_assert_str_eq(toy_blas_better_core("Prescott", true, true, true), "Cooperlake");
    cr_assert_str_eq(toy_blas_better_core("Prescott", true, true, false), "SkylakeX");
    cr_assert_str_eq(toy_blas_better_core("Prescott", true, false, false), "Haswell");
    cr_assert_str_eq(toy_blas_better_core("Sandybridge", true, false, false), "Haswell");
    cr_assert_null(toy_blas_better_core("Prescott", false, false, false));
    /* a core OpenBLAS chose knowingly, or one this table does not know */
    cr_assert_null(toy_blas_better_core("Haswell", true, true, true));
    cr_assert_null(toy_blas_better_core("Zen", true, true, true));
    cr_assert_null(toy_blas_better_core("SkylakeX", true, true, true));
    cr_assert_null(toy_blas_better_core("SapphireRapids", true, true, true));
    cr_assert_null(toy_blas_better_core("Zen5", true, true, true));
    cr_assert_null(toy_blas_better_core(NULL, true, true, true));
    /* this process: OpenBLAS now runs kernels of this CPU's ISA */
    if (getenv("OPENBLAS_CORETYPE")) return; /* the user's choice stands */
    __builtin_cpu_init();
    bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                  __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    const char *core = toy_blas_core();
    cr_assert_null(toy_blas_better_core(core, avx2, avx512, avx512 && toy_cpu_has_avx512bf16()),
                   "OpenBLAS runs %s kernels on a CPU with%s AVX2%s", core, avx2 ? "" : "out",
                   avx512 ? " and AVX-512" : "");
    if (toy_blas_core_note()) cr_assert(strstr(toy_blas_core_note(), "fell back to"), "%s", toy_blas_core_note());
    /* and computes with them: a 7 x 300 x 45 sgemm against plain loops */
    float a[7 * 300], b[45 * 300], c[7 * 45];
    for (int i = 0; i < 7 * 300; i++) a[i] = (float)((i * 37) % 11) - 5;
    for (int i = 0; i < 45 * 300; i++) b[i] = (float)((i * 53) % 7) - 3;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, 7, 45, 300, 1.0f, a, 300, b, 300, 0.0f, c, 45);
    for (int i = 0; i < 7; i++)
        for (int j = 0; j < 45; j++) {
            float s = 0;
            for (int q = 0; q < 300; q++) s += a[i * 300 + q] * b[j * 300 + q];
            cr_assert_eq(c[i * 45 + j], s, "c[%d][%d] = %g, loops %g", i, j, c[i * 45 + j], s);
        }
}

/* toy_get_f32 / toy_set_f32 check their indexes against the shape: a write
 * one past the end is a named abort, not a silent overwrite of the arena */
static void set_past_the_end(void) {
    struct toy_ctx *ctx = toy_ctx_init(true);
    struct toy_tensor *t = toy_new_tensor_2d(ctx, TOY_F32, 4, 3);
    toy_set_f32(t, 3, 2, 0, 0, 1.0f); /* the last element: fine */
    cr_assert_eq(toy_get_f32(t, 3, 2, 0, 0), 1.0f);
    toy_set_f32(t, 4, 0, 0, 0, 1.0f);
}
Test(ops, element_access_outside_the_shape_aborts, .signal = SIGABRT) { set_past_the_end(); }

/* a NULL operand (an earlier call's failure) is named, not a segfault */
static void matmul_of_null(void) {
    struct toy_ctx *ctx = toy_ctx_init(false);
    struct toy_tensor *a = toy_new_tensor_2d(ctx, TOY_F32, 4, 3);
    toy_matmul(ctx, a, NULL, false, true);
}
Test(ops, a_null_operand_aborts_with_its_name, .signal = SIGABRT) { matmul_of_null(); }

/* the clamped SwiGLU takes gate and up of one shape, as toy_swiglu: a
 * mismatch is a named abort ("swiglu_oai: g (4, 3) f32, u (4, 2) f32: ...") */
static void swiglu_oai_of_unlike_shapes(void) {
    struct toy_ctx *ctx = toy_ctx_init(false);
    struct toy_tensor *g = toy_new_tensor_2d(ctx, TOY_F32, 3, 4), *u = toy_new_tensor_2d(ctx, TOY_F32, 2, 4);
    toy_set_name(g, "g");
    toy_set_name(u, "u");
    toy_swiglu_oai(ctx, g, u, 1.702f, 7.0f);
}
Test(ops, swiglu_oai_of_unlike_shapes_aborts, .signal = SIGABRT) { swiglu_oai_of_unlike_shapes(); }

/* A batched product of a few rows (latent attention's per-head products in a batched decode step) gives each
 * row the bits it gets alone, for every weight type: the server's batched decode equals its requests' alone. */
Test(ops, batched_rows_have_their_own_bits) {
    const enum toy_dtype types[] = {TOY_F32, TOY_F16, TOY_BF16, TOY_Q8_0, TOY_Q4_0};
    const int64_t K = 64, N = 96, H = 4, M = 6;
    struct toy_rng r;
    toy_rng_seed(&r, 3);
    struct toy_threadpool *tp = toy_threadpool_new(2);
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        struct toy_ctx *ctx = toy_ctx_init(true);
        struct toy_tensor *bf = toy_new_tensor_3d(ctx, TOY_F32, K, N, H);
        toy_rng_fill_normal(&r, bf->data, toy_nelements(bf), 1.0f);
        struct toy_tensor *b = bf;
        if (types[ti] != TOY_F32) { /* the weights as a file holds them: rows of `type` */
            b = toy_new_tensor_3d(ctx, TOY_F32, K, N, H);
            size_t rb = toy_row_bytes(types[ti], K);
            void *q = toy_ctx_alloc(ctx, rb * (size_t)(N * H));
            cr_assert_eq(toy_quantize_row(types[ti], bf->data, q, K * N * H), TOY_OK, "%s", toy_last_error());
            b->type = types[ti];
            b->nb[0] = toy_dtype_type_size(types[ti]);
            b->nb[1] = rb;
            b->nb[2] = rb * (size_t)N;
            b->nb[3] = b->nb[2] * (size_t)H;
            b->data = q;
        }
        struct toy_tensor *a = toy_new_tensor_3d(ctx, TOY_F32, K, M, H), *a1 = toy_new_tensor_3d(ctx, TOY_F32, K, 1, H);
        toy_rng_fill_normal(&r, a->data, toy_nelements(a), 1.0f);
        struct toy_tensor *y = toy_matmul(ctx, a, b, false, true), *y1 = toy_matmul(ctx, a1, b, false, true);
        toy_set_output(y);
        toy_set_output(y1);
        struct toy_graph *g = toy_graph_new(ctx), *g1 = toy_graph_new(ctx);
        toy_graph_build(g, y);
        toy_graph_build(g1, y1);
        cr_assert_eq(toy_graph_compute(g, tp), TOY_OK, "%s", toy_last_error());
        for (int64_t i = 0; i < M; i++) {
            for (int64_t h = 0; h < H; h++)
                memcpy((float *)a1->data + h * K, (float *)a->data + (h * M + i) * K, (size_t)K * sizeof(float));
            cr_assert_eq(toy_graph_compute(g1, tp), TOY_OK, "%s", toy_last_error());
            for (int64_t h = 0; h < H; h++)
                cr_assert_eq(memcmp((float *)y->data + (h * M + i) * N, (float *)y1->data + h * N,
                                    (size_t)N * sizeof(float)), 0, "%s: row %lld of head %lld differs from alone",
                             toy_dtype_name(types[ti]), (long long)i, (long long)h);
        }
        toy_ctx_free(ctx);
    }
    toy_threadpool_free(tp);
}
