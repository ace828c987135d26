/* test-fuse.c: toy_graph_set_fusion (src/core/graph-fuse.c). Two
 * pre-norm residual blocks (attention-like and SwiGLU MLP) and an output
 * head, built twice over the same weights: the fused graph must give the
 * unfused graph's bits for every weight type, at 1 and 3 rows and 1-3
 * threads, with the norms, the SwiGLU and the residual adds gone; and it
 * must leave alone what it cannot fuse safely (a residual read after its
 * add, an output norm, more rows than a decode step, a backward pass). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "toy/dtype.h"
#include "toy/quant.h"
#include "toy/rng.h"
#include "toy/toy.h"
#include "harness.h"

#define D 64
#define F 160
#define V 96

struct weights {
    struct toy_tensor *wq, *wv, *wo, *wg, *wu, *wd, *wout, *n1, *n2, *n3;
};

static struct toy_tensor *weight(struct toy_ctx *ctx, enum toy_dtype type, int64_t k, int64_t n, struct toy_rng *r) {
    struct toy_tensor *w = th_weight(ctx, type, k, n, 0.1f, r);
    if (type == TOY_Q8_0 || type == TOY_Q4_0) cr_assert_eq(toy_tensor_pack(w), TOY_OK);
    return w;
}

static struct toy_tensor *norm_weight(struct toy_ctx *ctx, struct toy_rng *r) {
    struct toy_tensor *w = toy_new_tensor_1d(ctx, TOY_F32, D);
    for (int i = 0; i < D; i++) ((float *)w->data)[i] = 1.0f + 0.2f * toy_rng_normal(r);
    return w;
}

static struct weights make_weights(struct toy_ctx *ctx, enum toy_dtype type) {
    struct toy_rng r;
    toy_rng_seed(&r, 11);
    return (struct weights){weight(ctx, type, D, D, &r), weight(ctx, type, D, D, &r), weight(ctx, type, D, D, &r),
                            weight(ctx, type, D, F, &r), weight(ctx, type, D, F, &r), weight(ctx, type, F, D, &r),
                            weight(ctx, type, D, V, &r), norm_weight(ctx, &r),     norm_weight(ctx, &r),
                            norm_weight(ctx, &r)};
}

enum variant { PLAIN, RESIDUAL_READ_LATER, NORM_IS_OUTPUT };

/* x0 = 1 * x; x1 = x0 + Wo (Wq n1(x0) + Wv n1(x0)); x2 = x1 + Wd swiglu(Wg n2(x1), Wu n2(x1));
 * out = Wout n3(x2) (+ x0 in RESIDUAL_READ_LATER: x0's bytes must survive the first add) */
static struct toy_tensor *block(struct toy_ctx *ctx, const struct weights *w, struct toy_tensor *x, enum variant v,
                                struct toy_tensor **extra) {
    struct toy_tensor *x0 = toy_scale(ctx, x, 1.0f);
    struct toy_tensor *h = toy_rms_norm(ctx, x0, w->n1, 1e-5f);
    struct toy_tensor *a = toy_add(ctx, toy_linear(ctx, h, w->wq, NULL), toy_linear(ctx, h, w->wv, NULL));
    struct toy_tensor *x1 = toy_add(ctx, x0, toy_linear(ctx, a, w->wo, NULL));
    struct toy_tensor *h2 = toy_rms_norm(ctx, x1, w->n2, 1e-5f);
    struct toy_tensor *s = toy_swiglu(ctx, toy_linear(ctx, h2, w->wg, NULL), toy_linear(ctx, h2, w->wu, NULL));
    struct toy_tensor *x2 = toy_add(ctx, x1, toy_linear(ctx, s, w->wd, NULL));
    struct toy_tensor *out = toy_linear(ctx, toy_rms_norm(ctx, x2, w->n3, 1e-5f), w->wout, NULL);
    *extra = NULL;
    if (v == RESIDUAL_READ_LATER) *extra = toy_add(ctx, x2, x0);
    if (v == NORM_IS_OUTPUT) *extra = h2;
    return out;
}

struct run {
    struct toy_graph *g;
    struct toy_tensor *out, *extra;
};

static struct run build(struct toy_ctx *ctx, const struct weights *w, struct toy_tensor *x, enum variant v, bool fuse) {
    struct run r;
    r.out = block(ctx, w, x, v, &r.extra);
    toy_set_output(r.out);
    r.g = toy_graph_new(ctx);
    toy_graph_build(r.g, r.out);
    if (r.extra) {
        toy_set_output(r.extra);
        toy_graph_build(r.g, r.extra);
    }
    toy_graph_set_fusion(r.g, fuse);
    return r;
}

static int count_op(struct toy_graph *g, enum toy_op op) {
    int c = 0;
    for (int i = 0; i < toy_graph_n_nodes(g); i++) c += toy_graph_node(g, i)->op == op;
    return c;
}

static void same_bits(const struct toy_tensor *a, const struct toy_tensor *b, const char *what, enum toy_dtype type,
                      int64_t rows, int nth) {
    for (int64_t i = 0; i < toy_nelements(a); i++) {
        float p = ((const float *)a->data)[i], q = ((const float *)b->data)[i];
        cr_assert(memcmp(&p, &q, sizeof p) == 0 && isfinite(p), "%s, %s weights, %lld rows, %d threads, [%lld]: fused %.9g, unfused %.9g",
                  what, toy_dtype_name(type), (long long)rows, nth, (long long)i, p, q);
    }
}

static void check(enum toy_dtype type, int64_t rows, enum variant v, int fused_nodes_expected) {
    struct toy_ctx *ctx = toy_ctx_init(true);
    struct weights w = make_weights(ctx, type);
    struct toy_tensor *x = toy_new_tensor_2d(ctx, TOY_F32, D, rows);
    toy_set_input(x);
    struct run f = build(ctx, &w, x, v, true), u = build(ctx, &w, x, v, false);
    int before = toy_graph_n_nodes(f.g);
    cr_assert_eq(toy_graph_plan(f.g, NULL, NULL), TOY_OK);
    cr_assert_eq(toy_graph_plan(u.g, NULL, NULL), TOY_OK);
    cr_assert_eq(toy_graph_n_nodes(u.g), before);
    cr_assert_eq(before - toy_graph_n_nodes(f.g), fused_nodes_expected, "%s, %lld rows, variant %d: %d -> %d nodes",
                 toy_dtype_name(type), (long long)rows, v, before, toy_graph_n_nodes(f.g));
    struct toy_rng r;
    toy_rng_seed(&r, 5);
    for (int nth = 1; nth <= 3; nth++) {
        struct toy_threadpool *tp = toy_threadpool_new(nth);
        for (int rep = 0; rep < 2; rep++) { /* a second run over the same plan and bytes */
            for (int64_t i = 0; i < D * rows; i++) ((float *)x->data)[i] = toy_rng_normal(&r);
            cr_assert_eq(toy_graph_compute(f.g, tp), TOY_OK);
            cr_assert_eq(toy_graph_compute(u.g, tp), TOY_OK);
            same_bits(f.out, u.out, "output", type, rows, nth);
            if (f.extra) same_bits(f.extra, u.extra, "second output", type, rows, nth);
        }
        toy_threadpool_free(tp);
    }
    if (type == TOY_Q8_0 || type == TOY_Q4_0) {
        toy_tensor_unpack(w.wq); toy_tensor_unpack(w.wv); toy_tensor_unpack(w.wo); toy_tensor_unpack(w.wg);
        toy_tensor_unpack(w.wu); toy_tensor_unpack(w.wd); toy_tensor_unpack(w.wout);
    }
    toy_ctx_free(ctx);
}

/* 15 nodes -> 8: three norms and the SwiGLU become prologues; three adds
 * take the product they add (the two residuals, and q + v in place in v) */
Test(fuse, decode_block_same_bits_every_weight_type) {
    const enum toy_dtype types[] = {TOY_F32, TOY_F16, TOY_BF16, TOY_Q8_0, TOY_Q4_0};
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        check(types[t], 1, PLAIN, 7);
        check(types[t], 3, PLAIN, 7);
    }
}

Test(fuse, fused_node_kinds) {
    struct toy_ctx *ctx = toy_ctx_init(true);
    struct weights w = make_weights(ctx, TOY_F32);
    struct toy_tensor *x = toy_new_tensor_2d(ctx, TOY_F32, D, 1);
    struct run f = build(ctx, &w, x, PLAIN, true);
    cr_assert_eq(toy_graph_plan(f.g, NULL, NULL), TOY_OK);
    cr_assert_eq(count_op(f.g, TOY_OP_RMS_NORM), 0);
    cr_assert_eq(count_op(f.g, TOY_OP_SWIGLU), 0);
    cr_assert_eq(count_op(f.g, TOY_OP_ADD), 0);
    cr_assert_eq(count_op(f.g, TOY_OP_MATMUL), 7);
    /* planning again changes nothing */
    int n = toy_graph_n_nodes(f.g);
    cr_assert_eq(toy_graph_plan(f.g, NULL, NULL), TOY_OK);
    cr_assert_eq(toy_graph_n_nodes(f.g), n);
    toy_ctx_free(ctx);
}

/* x0 is read after the first add: that add stays (its in-place form would
 * overwrite x0); the second still folds, into x1 */
Test(fuse, residual_read_after_its_add_is_kept) {
    check(TOY_Q8_0, 1, RESIDUAL_READ_LATER, 6);
    check(TOY_F32, 2, RESIDUAL_READ_LATER, 6);
}

/* an output norm is kept, and products reading it get no prologue */
Test(fuse, output_norm_is_kept) { check(TOY_Q4_0, 1, NORM_IS_OUTPUT, 6); }

/* more rows than a decode step: nothing changes */
Test(fuse, prefill_rows_are_not_fused) { check(TOY_Q8_0, 12, PLAIN, 0); }

Test(fuse, graph_with_backward_is_not_fused) {
    struct toy_ctx *ctx = toy_ctx_init(true);
    struct weights w = make_weights(ctx, TOY_F32);
    toy_set_param(w.wq);
    struct toy_tensor *x = toy_new_tensor_2d(ctx, TOY_F32, D, 1), *extra;
    for (int i = 0; i < D; i++) ((float *)x->data)[i] = 0.01f * (float)i;
    struct toy_tensor *loss = toy_sum_all(ctx, block(ctx, &w, x, PLAIN, &extra));
    struct toy_graph *g = toy_graph_new(ctx);
    toy_graph_build(g, loss);
    toy_graph_backward(g, loss);
    toy_graph_set_fusion(g, true);
    int n = toy_graph_n_nodes(g);
    cr_assert_eq(toy_graph_compute(g, NULL), TOY_OK);
    cr_assert_eq(toy_graph_n_nodes(g), n);
    cr_assert_gt(count_op(g, TOY_OP_RMS_NORM), 0);
    toy_ctx_free(ctx);
}

/* x + W x: the product reads x, so the add cannot accumulate into x's bytes */
Test(fuse, product_of_the_residual_itself_is_kept) {
    struct toy_ctx *ctx = toy_ctx_init(true);
    struct weights w = make_weights(ctx, TOY_F32);
    struct toy_tensor *x = toy_new_tensor_2d(ctx, TOY_F32, D, 1);
    for (int i = 0; i < D; i++) ((float *)x->data)[i] = 0.1f * (float)(i % 7) - 0.3f;
    struct toy_tensor *outs[2];
    struct toy_graph *gs[2];
    for (int f = 0; f < 2; f++) {
        struct toy_tensor *x0 = toy_scale(ctx, x, 1.0f);
        outs[f] = toy_scale(ctx, toy_add(ctx, x0, toy_linear(ctx, x0, w.wo, NULL)), 1.0f);
        toy_set_output(outs[f]);
        gs[f] = toy_graph_new(ctx);
        toy_graph_build(gs[f], outs[f]);
        toy_graph_set_fusion(gs[f], f == 0);
        cr_assert_eq(toy_graph_compute(gs[f], NULL), TOY_OK);
    }
    cr_assert_eq(toy_graph_n_nodes(gs[0]), 4);
    same_bits(outs[0], outs[1], "x + W x", TOY_F32, 1, 1);
    toy_ctx_free(ctx);
}

/* gpt-oss's clamped SwiGLU is its own op: the matmul prologues know only the
 * plain SwiGLU, so Wd swiglu_oai(Wg x, Wu x) keeps its SWIGLU_OAI node (the
 * products' inputs run past the clamps) and gives the unfused graph's bits */
Test(fuse, clamped_swiglu_is_not_a_prologue) {
    struct toy_ctx *ctx = toy_ctx_init(true);
    struct weights w = make_weights(ctx, TOY_F32);
    struct toy_tensor *x = toy_new_tensor_2d(ctx, TOY_F32, D, 1);
    for (int i = 0; i < D; i++) ((float *)x->data)[i] = 4.0f * (float)(i % 9) - 16.0f;
    struct toy_tensor *outs[2], *s[2];
    struct toy_graph *gs[2];
    for (int f = 0; f < 2; f++) {
        s[f] = toy_swiglu_oai(ctx, toy_linear(ctx, x, w.wg, NULL), toy_linear(ctx, x, w.wu, NULL), 1.702f, 7.0f);
        outs[f] = toy_linear(ctx, s[f], w.wd, NULL);
        toy_set_output(outs[f]);
        if (f == 1) toy_set_output(s[f]->src[0]); /* read below */
        gs[f] = toy_graph_new(ctx);
        toy_graph_build(gs[f], outs[f]);
        toy_graph_set_fusion(gs[f], f == 0);
        cr_assert_eq(toy_graph_compute(gs[f], NULL), TOY_OK);
    }
    cr_assert_eq(count_op(gs[0], TOY_OP_SWIGLU_OAI), 1);
    cr_assert_eq(count_op(gs[0], TOY_OP_MATMUL), 3);
    int past = 0; /* the gate's clamp is reached */
    for (int i = 0; i < F; i++) past += ((const float *)s[1]->src[0]->data)[i] > 7.0f;
    cr_assert_gt(past, 0);
    same_bits(outs[0], outs[1], "Wd swiglu_oai(Wg x, Wu x)", TOY_F32, 1, 1);
    toy_ctx_free(ctx);
}
