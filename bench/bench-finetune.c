/* bench-finetune.c: LoRA / QLoRA training-step time on the SmolLM2-135M
 * shape (random weights; vocab 49152, d 576, 30 layers, 9/3 heads, d_ff
 * 1536), T 256, B 4, rank 8 on q and v (alpha 16): forward + cross-entropy +
 * backward (adapter gradients only; the base is frozen) + AdamW on the
 * adapter. Bases: F32, BF16 and Q4_0 weights (stored in that type, as a
 * mapped GGUF would be; QLoRA = the Q4_0 rows, in f32 and in bf16 products
 * as `toy finetune --bf16` runs them). Prints JSON lines that
 * bench/torch_lora.py reads and compares with PyTorch's same-math step.
 * Usage: bench-finetune THREADS [STEPS] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench-quant.h"
#include "toy/finetune.h"
#include "toy/quant.h"
#include "toy/toy.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* re-stores every 2-D weight of m in `type`, frozen; returns the weight bytes */
static size_t store_as(struct toy_llama *m, enum toy_dtype type, void **keep, int *n_keep) {
    size_t bytes = 0;
    for (int i = 0; i < toy_llama_n_tensors(m); i++) {
        struct toy_tensor *t = toy_llama_tensor(m, i);
        toy_set_frozen(t);
        if (t->ne[1] <= 1 || type == TOY_F32) {
            bytes += toy_row_bytes(TOY_F32, t->ne[0]) * (size_t)t->ne[1];
            continue;
        }
        keep[(*n_keep)++] = bench_requantize(t, type);
        bytes += toy_row_bytes(type, t->ne[0]) * (size_t)t->ne[1];
    }
    return bytes;
}

static void bench(struct toy_threadpool *tp, int nth, enum toy_dtype type, bool bf16, int steps) {
    const int64_t T = 256, B = 4;
    struct toy_llama_config c = toy_llama_preset("smollm2-135m");
    struct toy_llama *m = toy_llama_new(&c, 1);
    void *keep[512];
    int n_keep = 0;
    size_t base_bytes = store_as(m, type, keep, &n_keep);
    m->matmul_type = bf16 ? TOY_BF16 : TOY_F32; /* toy finetune --bf16 */
    struct toy_lora *a;
    struct toy_lora_opts lo = {.rank = 8, .alpha = 16, .targets = TOY_LORA_DEFAULT_TARGETS, .seed = 1};
    if (toy_lora_attach(m, &lo, &a)) { fprintf(stderr, "%s\n", toy_last_error()); exit(1); }
    struct toy_ctx *ctx = toy_ctx_init(true);
    struct toy_tensor *tok = toy_new_tensor_2d(ctx, TOY_I32, T, B), *tgt = toy_new_tensor_2d(ctx, TOY_I32, T, B);
    struct toy_tensor *pos = toy_new_tensor_1d(ctx, TOY_I32, T);
    for (int64_t i = 0; i < T * B; i++) {
        ((int32_t *)tok->data)[i] = (int32_t)((i * 7919) % c.vocab);
        ((int32_t *)tgt->data)[i] = (int32_t)((i * 104729 + 3) % c.vocab);
    }
    for (int64_t t = 0; t < T; t++) ((int32_t *)pos->data)[t] = (int32_t)t;
    struct toy_tensor *loss = toy_cross_entropy(ctx, toy_llama_forward(ctx, m, tok, pos), tgt, -100);
    struct toy_graph *g = toy_graph_new(ctx);
    toy_graph_build(g, loss);
    toy_graph_backward(g, loss);
    struct toy_plan_info pi;
    toy_graph_plan(g, NULL, &pi);
    struct toy_optim *o = toy_optim_new(TOY_OPTIM_ADAMW);
    int grp = toy_optim_add_group(o, &(struct toy_optim_group){.beta1 = 0.9f, .beta2 = 0.999f});
    for (int i = 0; i < toy_lora_n_tensors(a); i++) toy_optim_add_param(o, toy_lora_tensor(a, i), grp);
    double best = 1e30;
    for (int i = 0; i < steps + 1; i++) {
        double t0 = now();
        toy_optim_zero_grad(o);
        toy_graph_compute(g, tp);
        toy_optim_clip_grad_norm(o, 1.0f, tp);
        toy_optim_step(o, 1e-4f, tp);
        double dt = now() - t0;
        if (i > 0 && dt < best) best = dt; /* the first step warms up */
    }
    printf("{\"bench\":\"lora\",\"base\":\"%s\",\"products\":\"%s\",\"threads\":%d,\"rank\":8,\"targets\":\"q,v\","
           "\"T\":%lld,\"B\":%lld,\"toy_s\":%.3f,\"base_mb\":%.1f,\"adapter_params\":%lld,\"peak_act_mb\":%.1f,\"loss\":%.4f}\n",
           toy_dtype_name(type), bf16 ? "bf16" : "f32", nth, (long long)T, (long long)B, best, base_bytes / 1e6,
           (long long)toy_lora_n_params(a), pi.peak_bytes / 1e6, *(float *)loss->data);
    fflush(stdout);
    toy_optim_free(o);
    toy_ctx_free(ctx);
    toy_lora_free(a);
    toy_llama_free(m);
    for (int i = 0; i < n_keep; i++) free(keep[i]);
}

int main(int argc, char **argv) {
    int nth = argc > 1 ? atoi(argv[1]) : 2;
    int steps = argc > 2 ? atoi(argv[2]) : 2;
    struct toy_threadpool *tp = toy_threadpool_new(nth);
    bench(tp, nth, TOY_F32, false, steps);
    bench(tp, nth, TOY_BF16, false, steps);
    bench(tp, nth, TOY_Q4_0, false, steps);
    bench(tp, nth, TOY_Q4_0, true, steps); /* QLoRA with --bf16: the base dequantized to bf16 in the products */
    toy_threadpool_free(tp);
    return 0;
}
