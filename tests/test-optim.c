/* test-optim.c: AdamW and SGD against torch.optim step by step, an MLP's
 * 20-step loss curve against PyTorch, gradient clipping and schedules.
 * Optimizer tolerance: 1e-6 relative, with |p| floored at 0.1 (parameters
 * near zero are compared to 1e-7 absolute: one float ulp of 0.1 is 7e-9). */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "toy/toy.h"

static json_t *load(void) {
    const char *dir = getenv("TOY_REFS");
    char path[1024];
    snprintf(path, sizeof path, "%s/train.json", dir ? dir : "build/refs");
    json_error_t err;
    json_t *root = json_load_file(path, 0, &err);
    if (!root) cr_skip_test("no PyTorch references at %s: run make check", path);
    return root;
}

static void fill(float *dst, json_t *arr) {
    for (size_t i = 0; i < json_array_size(arr); i++) dst[i] = (float)json_number_value(json_array_get(arr, i));
}

static double num(json_t *o, const char *k) { return json_number_value(json_object_get(o, k)); }

static void run_opt(const char *which, enum toy_optim_kind kind, double tol) {
    json_t *root = load(), *r = json_object_get(root, which);
    json_t *p0 = json_object_get(r, "p0"), *grads = json_object_get(r, "grads"), *traj = json_object_get(r, "traj");
    int64_t n = (int64_t)json_array_size(p0);
    struct toy_ctx *ctx = toy_ctx_init(true);
    struct toy_tensor *p = toy_new_tensor_1d(ctx, TOY_F32, n);
    toy_set_param(p);
    p->grad = toy_new_tensor_1d(ctx, TOY_F32, n);
    fill(p->data, p0);
    struct toy_optim *o = toy_optim_new(kind);
    struct toy_optim_group g = {0};
    g.weight_decay = (float)num(r, "wd");
    if (kind == TOY_OPTIM_ADAMW) {
        g.beta1 = (float)num(r, "beta1");
        g.beta2 = (float)num(r, "beta2");
        g.eps = (float)num(r, "eps");
    } else {
        g.momentum = (float)num(r, "momentum");
    }
    toy_optim_add_param(o, p, toy_optim_add_group(o, &g));
    struct toy_threadpool *tp = toy_threadpool_new(2);
    double worst = 0;
    for (size_t s = 0; s < json_array_size(grads); s++) {
        fill(p->grad->data, json_array_get(grads, s));
        cr_assert_eq(toy_optim_step(o, (float)num(r, "lr"), tp), TOY_OK);
        json_t *ref = json_array_get(traj, s);
        for (int64_t i = 0; i < n; i++) {
            double t = json_number_value(json_array_get(ref, (size_t)i));
            double e = fabs(((float *)p->data)[i] - t) / fmax(fabs(t), 1e-1);
            if (e > worst) worst = e;
        }
    }
    cr_log_info("%s: worst relative difference to torch.optim over 20 steps: %.3g", which, worst);
    cr_assert_leq(worst, tol, "%s differs from torch.optim by %.3g (relative)", which, worst);
    toy_optim_free(o);
    toy_threadpool_free(tp);
    toy_ctx_free(ctx);
    json_decref(root);
}

Test(optim, adamw_matches_torch) { run_opt("adamw", TOY_OPTIM_ADAMW, 1e-6); }
Test(optim, sgd_momentum_matches_torch) { run_opt("sgd", TOY_OPTIM_SGD, 1e-6); }

Test(optim, mlp_training_matches_torch) {
    json_t *root = load(), *r = json_object_get(root, "mlp");
    int N = (int)num(r, "N"), D = (int)num(r, "D"), H = (int)num(r, "H"), C = (int)num(r, "C");
    struct toy_ctx *ctx = toy_ctx_init(true);
    struct toy_tensor *x = toy_new_tensor_2d(ctx, TOY_F32, D, N);
    struct toy_tensor *y = toy_new_tensor_1d(ctx, TOY_I32, N);
    struct toy_tensor *w1 = toy_new_tensor_2d(ctx, TOY_F32, D, H), *b1 = toy_new_tensor_1d(ctx, TOY_F32, H);
    struct toy_tensor *w2 = toy_new_tensor_2d(ctx, TOY_F32, H, C);
    fill(x->data, json_object_get(r, "x"));
    for (int i = 0; i < N; i++) ((int32_t *)y->data)[i] = (int32_t)json_integer_value(json_array_get(json_object_get(r, "y"), (size_t)i));
    json_t *init = json_object_get(r, "init");
    fill(w1->data, json_array_get(init, 0));
    fill(b1->data, json_array_get(init, 1));
    fill(w2->data, json_array_get(init, 2));
    toy_set_param(w1);
    toy_set_param(b1);
    toy_set_param(w2);
    struct toy_tensor *h = toy_silu(ctx, toy_linear(ctx, x, w1, b1));
    struct toy_tensor *loss = toy_cross_entropy(ctx, toy_linear(ctx, h, w2, NULL), y, -100);
    struct toy_graph *g = toy_graph_new(ctx);
    toy_graph_build(g, loss);
    toy_graph_backward(g, loss);
    struct toy_optim *o = toy_optim_new(TOY_OPTIM_ADAMW);
    int grp = toy_optim_add_group(o, &(struct toy_optim_group){.beta1 = (float)num(r, "beta1"),
                                                               .beta2 = (float)num(r, "beta2"),
                                                               .eps = 1e-8f, .weight_decay = (float)num(r, "wd")});
    toy_optim_add_param(o, w1, grp);
    toy_optim_add_param(o, b1, grp);
    toy_optim_add_param(o, w2, grp);
    struct toy_threadpool *tp = toy_threadpool_new(2);
    json_t *losses = json_object_get(r, "losses");
    double worst = 0;
    for (size_t s = 0; s < json_array_size(losses); s++) {
        toy_optim_zero_grad(o);
        cr_assert_eq(toy_graph_compute(g, tp), TOY_OK);
        double ref = json_number_value(json_array_get(losses, s));
        double e = fabs(*(float *)loss->data - ref) / fabs(ref);
        worst = fmax(worst, e);
        toy_optim_step(o, (float)num(r, "lr"), tp);
    }
    cr_log_info("mlp: worst relative loss difference to PyTorch over 20 AdamW steps: %.3g", worst);
    cr_assert_leq(worst, 1e-4);
    toy_optim_free(o);
    toy_threadpool_free(tp);
    toy_ctx_free(ctx);
    json_decref(root);
}

Test(optim, clip_grad_norm) {
    struct toy_ctx *ctx = toy_ctx_init(true);
    struct toy_tensor *a = toy_new_tensor_1d(ctx, TOY_F32, 3), *b = toy_new_tensor_1d(ctx, TOY_F32, 1);
    toy_set_param(a);
    toy_set_param(b);
    a->grad = toy_new_tensor_1d(ctx, TOY_F32, 3);
    b->grad = toy_new_tensor_1d(ctx, TOY_F32, 1);
    float *ga = a->grad->data, *gb = b->grad->data;
    ga[0] = 3; ga[1] = 0; ga[2] = 0; gb[0] = 4; /* norm 5 */
    struct toy_optim *o = toy_optim_new(TOY_OPTIM_SGD);
    int grp = toy_optim_add_group(o, &(struct toy_optim_group){0});
    toy_optim_add_param(o, a, grp);
    toy_optim_add_param(o, b, grp);
    cr_assert_float_eq(toy_optim_clip_grad_norm(o, 10, NULL), 5.0f, 1e-6);
    cr_assert_float_eq(ga[0], 3.0f, 1e-7); /* under the limit: untouched */
    cr_assert_float_eq(toy_optim_clip_grad_norm(o, 1, NULL), 5.0f, 1e-6);
    cr_assert_float_eq(ga[0], 3.0f / (5.0f + 1e-6f), 1e-6);
    cr_assert_float_eq(gb[0], 4.0f / (5.0f + 1e-6f), 1e-6);
    toy_optim_free(o);
    toy_ctx_free(ctx);
}

/* a step with a parameter that got no gradient is refused before any
 * parameter changes, naming it, or "(unnamed)" for a tensor without a name */
Test(optim, step_without_a_gradient_names_the_parameter) {
    struct toy_ctx *ctx = toy_ctx_init(true);
    struct toy_tensor *a = toy_new_tensor_1d(ctx, TOY_F32, 3), *b = toy_new_tensor_1d(ctx, TOY_F32, 2);
    toy_set_param(a);
    toy_set_param(b);
    for (int i = 0; i < 3; i++) ((float *)a->data)[i] = 1.0f + (float)i;
    for (int i = 0; i < 2; i++) ((float *)b->data)[i] = -1.0f;
    a->grad = toy_new_tensor_1d(ctx, TOY_F32, 3);
    for (int i = 0; i < 3; i++) ((float *)a->grad->data)[i] = 0.5f;
    struct toy_optim *o = toy_optim_new(TOY_OPTIM_SGD);
    int grp = toy_optim_add_group(o, &(struct toy_optim_group){0});
    toy_optim_add_param(o, a, grp);
    toy_optim_add_param(o, b, grp);
    cr_assert_eq(toy_optim_step(o, 0.1f, NULL), TOY_ERR_STATE);
    cr_assert(strstr(toy_last_error(), "parameter '(unnamed)' has no gradient"), "%s", toy_last_error());
    for (int i = 0; i < 3; i++) cr_assert_eq(((float *)a->data)[i], 1.0f + (float)i); /* nothing stepped */
    toy_set_name(b, "head.bias");
    cr_assert_eq(toy_optim_step(o, 0.1f, NULL), TOY_ERR_STATE);
    cr_assert(strstr(toy_last_error(), "parameter 'head.bias' has no gradient"), "%s", toy_last_error());
    toy_optim_free(o);
    toy_ctx_free(ctx);
}

Test(optim, schedules) {
    struct toy_lr_schedule s = {TOY_LR_COSINE, 1e-3f, 1e-4f, 10, 110};
    cr_assert_float_eq(toy_lr_at(&s, 0), 1e-4f, 1e-9);    /* warmup: lr * 1/10 */
    cr_assert_float_eq(toy_lr_at(&s, 9), 1e-3f, 1e-9);
    cr_assert_float_eq(toy_lr_at(&s, 10), 1e-3f, 1e-9);   /* cosine starts at the peak */
    cr_assert_float_eq(toy_lr_at(&s, 60), 5.5e-4f, 1e-8); /* halfway: mean of peak and floor */
    cr_assert_float_eq(toy_lr_at(&s, 110), 1e-4f, 1e-9);  /* floor */
    cr_assert_float_eq(toy_lr_at(&s, 500), 1e-4f, 1e-9);
    s.kind = TOY_LR_LINEAR;
    cr_assert_float_eq(toy_lr_at(&s, 60), 5.5e-4f, 1e-8);
    s.kind = TOY_LR_CONSTANT;
    cr_assert_float_eq(toy_lr_at(&s, 60), 1e-3f, 1e-9);
    cr_assert_eq(toy_lr_kind_from_name("cosine"), TOY_LR_COSINE);
    cr_assert_eq(toy_lr_kind_from_name("nope"), -1);
}

/* Without a graph on a device (always, in a CPU-only build) the optimizer
 * never leaves the host: the device calls are no-ops and a step updates
 * p->data in place. */
Test(optim, stays_on_the_host_without_a_device_graph) {
    struct toy_ctx *ctx = toy_ctx_init(true);
    struct toy_tensor *p = toy_new_tensor_1d(ctx, TOY_F32, 5);
    toy_set_param(p);
    p->grad = toy_new_tensor_1d(ctx, TOY_F32, 5);
    for (int i = 0; i < 5; i++) ((float *)p->data)[i] = 1.0f, ((float *)p->grad->data)[i] = (float)i - 2;
    struct toy_optim *o = toy_optim_new(TOY_OPTIM_ADAMW);
    toy_optim_add_param(o, p, toy_optim_add_group(o, &(struct toy_optim_group){.weight_decay = 0}));
    struct toy_threadpool *tp = toy_threadpool_new(1);
    toy_optim_zero_grad(o);
    ((float *)p->grad->data)[0] = 3.0f;
    cr_assert_eq(toy_optim_step(o, 0.1f, tp), TOY_OK);
    cr_assert(!toy_optim_on_device(o));
    cr_assert_eq(toy_optim_sync_host(o), TOY_OK);
    cr_assert_eq(toy_optim_release_device(o), TOY_OK);
    cr_assert_eq(toy_optim_set_device_resident(o, false), TOY_OK);
    /* AdamW's first step moves an element by lr against its gradient's sign */
    cr_assert_float_eq(((float *)p->data)[0], 0.9f, 1e-6f);
    cr_assert_float_eq(((float *)p->data)[1], 1.0f, 1e-6f);
    cr_assert_float_eq(toy_optim_state(o, 0, 0)[0], 0.3f, 1e-6f);
    toy_optim_free(o);
    toy_threadpool_free(tp);
    toy_ctx_free(ctx);
}
