/* bench-engine.c: the engine against its peers on this machine.
 *
 *  gemm       y = x W^T through the engine (pool-split single-threaded
 *             sgemm) versus one cblas_sgemm call with OpenBLAS's own threads,
 *             same shapes, same thread count: the engine's overhead.
 *  attention  fused attention forward + backward (T 256, 9 heads / 3 kv
 *             heads, head dim 64, batch 4), also with its products in bf16
 *             (attention_bf16), rms_norm and swiglu forward + backward:
 *             times written as JSON lines for bench/report.py to put beside
 *             PyTorch's f32 ones (bench/torch_ops.py).
 *  sample_*   one token drawn from 49152 logits (normal, sd 3: a flat
 *             distribution, where top-p keeps thousands) at temperature 0.8,
 *             alone, with top-p 0.95 and with top-k 40, against PyTorch's
 *             softmax + multinomial (top-p as Hugging Face's sort + cumsum).
 * Usage: bench-engine THREADS   (prints JSON lines on stdout)
 */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "toy/toy.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void fill(struct toy_tensor *t, struct toy_rng *r) {
    float *d = t->data;
    for (int64_t i = 0; i < toy_nelements(t); i++) d[i] = toy_rng_normal(r) * 0.5f;
}

/* best of `reps` timings of `iters` runs */
#define BEST(reps, iters, stmt, out)                         \
    do {                                                     \
        out = 1e30;                                          \
        for (int r_ = 0; r_ < (reps); r_++) {                \
            double t0_ = now();                              \
            for (int i_ = 0; i_ < (iters); i_++) { stmt; }   \
            double dt_ = (now() - t0_) / (iters);            \
            if (dt_ < out) out = dt_;                        \
        }                                                    \
    } while (0)

/* y = x W^T with W in bf16: the AVX-512 BF16 kernel against f32 sgemm */
static void bench_gemm_bf16(struct toy_threadpool *tp, int nth, int64_t M, int64_t K, int64_t N, double blas_gflops) {
    struct toy_ctx *ctx = toy_ctx_init(true);
    struct toy_rng r;
    toy_rng_seed(&r, 1);
    struct toy_tensor *x = toy_new_tensor_2d(ctx, TOY_F32, K, M), *w = toy_new_tensor_2d(ctx, TOY_BF16, K, N);
    fill(x, &r);
    for (int64_t i = 0; i < K * N; i++) ((toy_bf16 *)w->data)[i] = toy_f32_to_bf16(toy_rng_normal(&r));
    struct toy_tensor *y = toy_linear(ctx, x, w, NULL);
    toy_set_output(y);
    struct toy_graph *g = toy_graph_new(ctx);
    toy_graph_build(g, y);
    toy_graph_compute(g, tp);
    double t;
    BEST(5, N > 10000 ? 3 : 20, toy_graph_compute(g, tp), t);
    double gf = 2.0 * M * N * K / t / 1e9;
    printf("{\"bench\":\"gemm_bf16\",\"shape\":\"%lldx%lldx%lld\",\"threads\":%d,\"bf16_gflops\":%.1f,"
           "\"vs_f32_sgemm\":%.2f}\n", (long long)M, (long long)K, (long long)N, nth, gf, gf / blas_gflops);
    toy_ctx_free(ctx);
}

static double bench_gemm(struct toy_threadpool *tp, int nth, int64_t M, int64_t K, int64_t N) {
    struct toy_ctx *ctx = toy_ctx_init(true);
    struct toy_rng r;
    toy_rng_seed(&r, 1);
    struct toy_tensor *x = toy_new_tensor_2d(ctx, TOY_F32, K, M), *w = toy_new_tensor_2d(ctx, TOY_F32, K, N);
    fill(x, &r);
    fill(w, &r);
    struct toy_tensor *y = toy_linear(ctx, x, w, NULL);
    toy_set_output(y);
    struct toy_graph *g = toy_graph_new(ctx);
    toy_graph_build(g, y);
    toy_graph_compute(g, tp); /* plans, initialises */
    float *c = malloc((size_t)(M * N) * sizeof(float));
    int iters = N > 10000 ? 3 : 20;
    double t_engine, t_blas;
    openblas_set_num_threads(nth);
    BEST(5, iters, cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)M, (int)N, (int)K, 1.0f, x->data,
                               (int)K, w->data, (int)K, 0.0f, c, (int)N), t_blas);
    openblas_set_num_threads(1);
    BEST(5, iters, toy_graph_compute(g, tp), t_engine);
    double flop = 2.0 * M * N * K;
    printf("{\"bench\":\"gemm\",\"shape\":\"%lldx%lldx%lld\",\"threads\":%d,\"engine_gflops\":%.1f,"
           "\"blas_gflops\":%.1f,\"overhead_pct\":%.1f}\n",
           (long long)M, (long long)K, (long long)N, nth, flop / t_engine / 1e9, flop / t_blas / 1e9,
           100.0 * (t_engine / t_blas - 1));
    free(c);
    toy_ctx_free(ctx);
    return flop / t_blas / 1e9;
}

/* forward + backward of one op; the loss is sum(y * dy) so the backward
 * starts from a random upstream gradient, as in tests/test-ops.c */
static void bench_op(struct toy_threadpool *tp, int nth, const char *name) {
    struct toy_ctx *ctx = toy_ctx_init(true);
    struct toy_rng r;
    toy_rng_seed(&r, 2);
    struct toy_tensor *y = NULL, *ins[3] = {0};
    int n_in = 0;
    const int64_t B = 4, T = 256, D = 64, H = 9, Hkv = 3, C = 576, F = 1536;
    if (!strncmp(name, "attention", 9)) {
        ins[0] = toy_new_tensor_4d(ctx, TOY_F32, D, H, T, B);
        ins[1] = toy_new_tensor_4d(ctx, TOY_F32, D, Hkv, T, B);
        ins[2] = toy_new_tensor_4d(ctx, TOY_F32, D, Hkv, T, B);
        n_in = 3;
        y = toy_attention(ctx, ins[0], ins[1], ins[2],
                          &(struct toy_attn_params){.causal = true, .bf16 = !strcmp(name, "attention_bf16")});
    } else if (!strcmp(name, "rms_norm")) {
        ins[0] = toy_new_tensor_2d(ctx, TOY_F32, C, T * B);
        ins[1] = toy_new_tensor_1d(ctx, TOY_F32, C);
        n_in = 2;
        y = toy_rms_norm(ctx, ins[0], ins[1], 1e-5f);
    } else {
        ins[0] = toy_new_tensor_2d(ctx, TOY_F32, F, T * B);
        ins[1] = toy_new_tensor_2d(ctx, TOY_F32, F, T * B);
        n_in = 2;
        y = toy_swiglu(ctx, ins[0], ins[1]);
    }
    for (int i = 0; i < n_in; i++) {
        fill(ins[i], &r);
        toy_set_param(ins[i]);
    }
    struct toy_tensor *dy = toy_new_tensor(ctx, TOY_F32, 4, y->ne);
    fill(dy, &r);
    struct toy_tensor *loss = toy_sum_all(ctx, toy_mul(ctx, y, dy));
    struct toy_graph *g = toy_graph_new(ctx);
    toy_graph_build(g, loss);
    toy_graph_backward(g, loss);
    toy_graph_compute(g, tp);
    /* time the op's own kernels: forward op + its backward ops */
    toy_graph_set_timing(g, true);
    int iters = 10;
    double best = 1e30;
    for (int rep = 0; rep < 5; rep++) {
        toy_graph_set_timing(g, true);
        for (int i = 0; i < iters; i++) toy_graph_compute(g, tp);
        const double *us = toy_graph_op_times_us(g);
        double t = 0;
        enum toy_op ops[] = {TOY_OP_ATTENTION, TOY_OP_ATTENTION_BACK, TOY_OP_RMS_NORM, TOY_OP_RMS_NORM_BACK,
                             TOY_OP_RMS_NORM_BACK_W, TOY_OP_SWIGLU, TOY_OP_SWIGLU_BACK};
        for (size_t k = 0; k < sizeof ops / sizeof ops[0]; k++) t += us[ops[k]];
        t /= iters;
        if (t < best) best = t;
    }
    printf("{\"bench\":\"%s\",\"threads\":%d,\"toy_ms\":%.3f}\n", name, nth, best / 1000.0);
    toy_ctx_free(ctx);
}

static void bench_sample(const char *name, struct toy_sampler_params p) {
    enum { V = 49152, N = 200 };
    float *logits = malloc(V * sizeof *logits);
    struct toy_rng r;
    toy_rng_seed(&r, 5);
    for (int i = 0; i < V; i++) logits[i] = 3 * toy_rng_normal(&r);
    struct toy_sampler *s = toy_sampler_new(&p, V);
    long sink = 0;
    double best = 1e30;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = now();
        for (int i = 0; i < N; i++) sink += toy_sampler_sample(s, logits, NULL);
        double t = (now() - t0) / N;
        best = t < best ? t : best;
    }
    printf("{\"bench\":\"%s\",\"threads\":1,\"toy_ms\":%.4f,\"draws_sum\":%ld}\n", name, best * 1e3, sink);
    toy_sampler_free(s);
    free(logits);
}

int main(int argc, char **argv) {
    int nth = argc > 1 ? atoi(argv[1]) : 2;
    struct toy_threadpool *tp = toy_threadpool_new(nth);
    double g1 = bench_gemm(tp, nth, 256, 576, 1536);
    double g2 = bench_gemm(tp, nth, 256, 576, 49152);
    bench_gemm_bf16(tp, nth, 256, 576, 1536, g1);
    bench_gemm_bf16(tp, nth, 256, 576, 49152, g2);
    bench_op(tp, nth, "attention");
    bench_op(tp, nth, "attention_bf16");
    bench_op(tp, nth, "rms_norm");
    bench_op(tp, nth, "swiglu");
    bench_sample("sample_temp", (struct toy_sampler_params){.temperature = 0.8f, .seed = 1});
    bench_sample("sample_top_p", (struct toy_sampler_params){.temperature = 0.8f, .top_p = 0.95f, .seed = 1});
    bench_sample("sample_top_k", (struct toy_sampler_params){.temperature = 0.8f, .top_k = 40, .seed = 1});
    toy_threadpool_free(tp);
    return 0;
}
