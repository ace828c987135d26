/* bench-gpt2-vit.c: training speed of the GPT-2 and ViT families on the
 * issue's shapes, one JSON line for bench/torch_gpt2_vit.py, which times
 * PyTorch on the same shape in the same run and prints the ratio.
 *   gpt2  GPT-2 124M (vocab 50257, d 768, 12 layers, 12 heads), B 4, T 64:
 *         forward + cross-entropy + backward + clip + AdamW, s/step
 *   vit   ViT-Tiny/16 (224x224x3, d 192, 12 layers, 3 heads, 1000 classes),
 *         B 8: the same step, images/s
 * The first step (planning, warm-up) is not timed; best of the rest.
 * Usage: bench-gpt2-vit THREADS gpt2|vit */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "toy/gpt2.h"
#include "toy/toy.h"
#include "toy/vit.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* TOY_BENCH_OPS=1: per-op time of the last step on stderr */
static double time_steps(struct toy_graph *g, struct toy_optim *o, struct toy_threadpool *tp, int steps) {
    bool ops = getenv("TOY_BENCH_OPS") != NULL;
    toy_graph_set_timing(g, ops);
    double best = 1e30;
    for (int i = 0; i < steps + 1; i++) {
        double t0 = now();
        toy_optim_zero_grad(o);
        toy_graph_compute(g, tp);
        toy_optim_clip_grad_norm(o, 1.0f, tp);
        toy_optim_step(o, 1e-4f, tp);
        double dt = now() - t0;
        if (i > 0 && dt < best) best = dt;
    }
    const double *us = toy_graph_op_times_us(g);
    for (int k = 0; ops && k < TOY_OP_COUNT; k++)
        if (us[k] > 0) fprintf(stderr, "%-20s %9.1f ms (all %d steps)\n", toy_op_name((enum toy_op)k), us[k] / 1e3, steps + 1);
    return best;
}

int main(int argc, char **argv) {
    int nth = argc > 1 ? atoi(argv[1]) : 2;
    const char *which = argc > 2 ? argv[2] : "gpt2";
    struct toy_threadpool *tp = toy_threadpool_new(nth);
    struct toy_ctx *ctx = toy_ctx_init(true);
    struct toy_optim *o = toy_optim_new(TOY_OPTIM_ADAMW);
    int grp = toy_optim_add_group(o, &(struct toy_optim_group){.beta1 = 0.9f, .beta2 = 0.95f, .weight_decay = 0.1f});
    if (!strcmp(which, "gpt2")) {
        const int64_t B = 4, T = 64;
        struct toy_gpt2_config c = toy_gpt2_preset("124m");
        struct toy_gpt2 *m = toy_gpt2_new(&c, 1);
        struct toy_tensor *tok = toy_new_tensor_2d(ctx, TOY_I32, T, B), *tgt = toy_new_tensor_2d(ctx, TOY_I32, T, B);
        struct toy_tensor *pos = toy_new_tensor_1d(ctx, TOY_I32, T);
        for (int64_t i = 0; i < T * B; i++) {
            ((int32_t *)tok->data)[i] = (int32_t)((i * 7919) % c.vocab);
            ((int32_t *)tgt->data)[i] = (int32_t)((i * 104729 + 3) % c.vocab);
        }
        for (int64_t t = 0; t < T; t++) ((int32_t *)pos->data)[t] = (int32_t)t;
        struct toy_tensor *loss = toy_cross_entropy(ctx, toy_gpt2_forward(ctx, m, tok, pos), tgt, -100);
        struct toy_graph *g = toy_graph_new(ctx);
        toy_graph_build(g, loss);
        toy_graph_backward(g, loss);
        for (int i = 0; i < toy_gpt2_n_tensors(m); i++) toy_optim_add_param(o, toy_gpt2_tensor(m, i), grp);
        double s = time_steps(g, o, tp, 3);
        printf("{\"bench\":\"gpt2_train\",\"shape\":\"124M B4 T64\",\"threads\":%d,\"params\":%lld,\"toy_s\":%.4f,"
               "\"toy_tok_s\":%.1f}\n", nth, (long long)toy_gpt2_n_params(m), s, (double)(B * T) / s);
        toy_gpt2_free(m);
    } else {
        const int64_t B = 8;
        struct toy_vit_config c = toy_vit_preset("tiny");
        struct toy_vit *m = toy_vit_new(&c, 1);
        struct toy_tensor *img = toy_new_tensor_4d(ctx, TOY_F32, c.image_w, c.image_h, c.channels, B);
        struct toy_tensor *lab = toy_new_tensor_1d(ctx, TOY_I32, B);
        struct toy_rng r;
        toy_rng_seed(&r, 1);
        for (int64_t i = 0; i < toy_nelements(img); i++) ((float *)img->data)[i] = toy_rng_normal(&r);
        for (int64_t b = 0; b < B; b++) ((int32_t *)lab->data)[b] = (int32_t)(b * 97 % c.n_classes);
        struct toy_tensor *loss = toy_cross_entropy(ctx, toy_vit_forward(ctx, m, img), lab, -100);
        struct toy_graph *g = toy_graph_new(ctx);
        toy_graph_build(g, loss);
        toy_graph_backward(g, loss);
        for (int i = 0; i < toy_vit_n_tensors(m); i++) toy_optim_add_param(o, toy_vit_tensor(m, i), grp);
        double s = time_steps(g, o, tp, 3);
        printf("{\"bench\":\"vit_train\",\"shape\":\"ViT-Tiny/16 224 B8\",\"threads\":%d,\"params\":%lld,\"toy_s\":%.4f,"
               "\"toy_img_s\":%.2f}\n", nth, (long long)toy_vit_n_params(m), s, (double)B / s);
        toy_vit_free(m);
    }
    fflush(stdout);
    toy_optim_free(o);
    toy_ctx_free(ctx);
    toy_threadpool_free(tp);
    return 0;
}
