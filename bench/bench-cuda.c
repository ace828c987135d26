/* bench-cuda.c: training and decode throughput of toy on a device (for the
 * CUDA backend; bench/bench-cuda.sh runs it next to PyTorch on the same
 * shapes, bench/torch_cuda.py).
 *
 *   bench-cuda train  gpt2-124m|smollm2-135m  B T steps  [device] [f32|bf16]
 *   bench-cuda decode smollm2-135m|llama-1b|gpt2-124m  f32|f16|bf16|q8_0|q4_k n_tokens [device]
 *   bench-cuda op matmul M N K [device]          one product, forward and backward
 *   bench-cuda op attention B H Hkv T D [device] causal attention likewise
 *
 * Random weights. One JSON line per run on stdout:
 *   train:  (bf16: weights cast to BF16 and TOY_CUDA_MATH=bf16 for the F32 x F32
 *           gradient products, as PyTorch's autocast) tokens/s of whole steps
 *           (forward + backward and the AdamW step, all on the device: the
 *           optimizer moves there at its first call, docs/cuda.md), the
 *           forward+backward time alone, and
 *           MFU = 6 N tokens/s / peak (TOY_PEAK_TFLOPS, default 989: H100/H200
 *           dense BF16);
 *   decode: tokens/s of one-token steps through the KV cache (weights are
 *           written to a GGUF and mapped back, so they are read-only and
 *           stay resident on the device).
 * Without CUDA in the build, or without a GPU, it prints a skip line.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "toy/toy.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int die(const char *what) {
    fprintf(stderr, "bench-cuda: %s: %s\n", what, toy_last_error());
    return 1;
}

static int train(const char *model, int B, int T, int steps, const char *device, const char *prec) {
    struct toy_lm lm;
    struct toy_llama *lla = NULL;
    struct toy_gpt2 *gp = NULL;
    if (!strcmp(model, "gpt2-124m")) {
        struct toy_gpt2_config c = toy_gpt2_preset("124m");
        c.max_ctx = T > c.max_ctx ? T : c.max_ctx;
        if (!(gp = toy_gpt2_new(&c, 1))) return die("gpt2");
        lm = toy_gpt2_lm(gp);
    } else {
        struct toy_llama_config c = toy_llama_preset("smollm2-135m");
        c.max_ctx = T > c.max_ctx ? T : c.max_ctx;
        if (!(lla = toy_llama_new(&c, 1))) return die("llama");
        lm = toy_llama_lm(lla);
    }
    if (lm.set_matmul_type) lm.set_matmul_type(lm.self, !strcmp(prec, "bf16") ? TOY_BF16 : TOY_F32);
    /* --bf16 casts the weights; the gradient products (dy x activations) are
     * F32 x F32, which PyTorch's autocast also runs in BF16: do the same */
    if (!strcmp(prec, "bf16")) setenv("TOY_CUDA_MATH", "bf16", 0);
    struct toy_ctx *ctx = toy_ctx_init(true);
    struct toy_tensor *tok = toy_new_tensor_2d(ctx, TOY_I32, T, B), *tgt = toy_new_tensor_2d(ctx, TOY_I32, T, B);
    struct toy_tensor *pos = toy_new_tensor_1d(ctx, TOY_I32, T);
    for (int t = 0; t < T; t++) ((int32_t *)pos->data)[t] = t;
    struct toy_rng r;
    toy_rng_seed(&r, 1);
    for (int i = 0; i < T * B; i++) {
        ((int32_t *)tok->data)[i] = (int32_t)toy_rng_below(&r, (uint64_t)lm.vocab);
        ((int32_t *)tgt->data)[i] = (int32_t)toy_rng_below(&r, (uint64_t)lm.vocab);
    }
    struct toy_tensor *loss = toy_cross_entropy(ctx, lm.forward(lm.self, ctx, tok, pos), tgt, -100);
    struct toy_graph *g = toy_graph_new(ctx);
    toy_graph_build(g, loss);
    toy_graph_backward(g, loss);
    if (toy_graph_set_device(g, device)) return die(device);
    struct toy_optim *o = toy_optim_new(TOY_OPTIM_ADAMW);
    int grp = toy_optim_add_group(o, &(struct toy_optim_group){.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                                                               .weight_decay = 0.1f});
    int64_t n_params = 0;
    for (int i = 0; i < lm.n_tensors(lm.self); i++) {
        toy_optim_add_param(o, lm.tensor(lm.self, i), grp);
        n_params += toy_nelements(lm.tensor(lm.self, i));
    }
    long nth = sysconf(_SC_NPROCESSORS_ONLN);
    struct toy_threadpool *tp = toy_threadpool_new(nth > 0 ? (int)nth : 4);
    double fb = 0, total = 0, l0 = 0, l1 = 0;
    for (int s = 0; s < steps + 2; s++) { /* two warm-up steps: plan, uploads, cuBLAS heuristics */
        double t0 = now_s();
        toy_optim_zero_grad(o);
        if (toy_graph_compute(g, tp)) return die("compute");
        double t1 = now_s();
        if (toy_optim_step(o, 1e-4f, tp)) return die("optimizer");
        double t2 = now_s();
        if (s == 0) l0 = *(float *)loss->data;
        l1 = *(float *)loss->data;
        if (s >= 2) {
            fb += t1 - t0;
            total += t2 - t0;
        }
    }
    double tps = (double)B * T * steps / total, tps_fb = (double)B * T * steps / fb;
    const char *pk = getenv("TOY_PEAK_TFLOPS");
    double peak = (pk ? atof(pk) : 989.0) * 1e12;
    const char *attn = getenv("TOY_CUDA_ATTN");
    printf("{\"bench\":\"train\",\"impl\":\"toy\",\"model\":\"%s\",\"device\":\"%s\",\"precision\":\"%s\",\"attn\":\"%s\",\"B\":%d,"
           "\"T\":%d,\"params\":%lld,\"tokens_per_s\":%.1f,\"tokens_per_s_fwd_bwd\":%.1f,\"step_ms\":%.2f,"
           "\"fwd_bwd_ms\":%.2f,\"mfu\":%.4f,\"mfu_fwd_bwd\":%.4f,\"loss_first\":%.4f,\"loss_last\":%.4f}\n",
           model, device, prec, attn && *attn ? attn : "auto", B, T, (long long)n_params, tps, tps_fb, 1e3 * total / steps, 1e3 * fb / steps,
           6.0 * (double)n_params * tps / peak, 6.0 * (double)n_params * tps_fb / peak, l0, l1);
    fflush(stdout);
    toy_threadpool_free(tp);
    toy_optim_free(o);
    toy_ctx_free(ctx);
    toy_llama_free(lla);
    toy_gpt2_free(gp);
    return 0;
}

/* a model of the named shape, random weights (NULL and an error: no such shape) */
static struct toy_lm new_model(const char *model, void (**free_fn)(void *)) {
    struct toy_lm lm = {0};
    if (!strcmp(model, "gpt2-124m")) {
        struct toy_gpt2_config c = toy_gpt2_preset("124m");
        struct toy_gpt2 *m = toy_gpt2_new(&c, 1);
        if (m) lm = toy_gpt2_lm(m), *free_fn = (void (*)(void *))toy_gpt2_free;
        return lm;
    }
    struct toy_llama_config c = toy_llama_preset("smollm2-135m");
    if (!strcmp(model, "llama-1b")) { /* Llama 3.2 1B shape */
        c.vocab = 128256; c.d_model = 2048; c.n_layers = 16; c.n_heads = 32; c.n_kv_heads = 8; c.d_ff = 8192;
        c.max_ctx = 2048;
    }
    struct toy_llama *m = toy_llama_new(&c, 1);
    if (m) lm = toy_llama_lm(m), *free_fn = (void (*)(void *))toy_llama_free;
    return lm;
}

/* the model in the file, of the family the shape names */
static struct toy_lm load_model(const char *model, const char *path, void (**free_fn)(void *)) {
    struct toy_lm lm = {0};
    if (!strcmp(model, "gpt2-124m")) {
        struct toy_gpt2 *m;
        if (!toy_gpt2_load(path, false, &m)) lm = toy_gpt2_lm(m), *free_fn = (void (*)(void *))toy_gpt2_free;
        return lm;
    }
    struct toy_llama *m;
    if (!toy_llama_load(path, false, &m)) lm = toy_llama_lm(m), *free_fn = (void (*)(void *))toy_llama_free;
    return lm;
}

static int decode(const char *model, const char *wtype, int n_tokens, const char *device) {
    void (*free_fn)(void *) = NULL;
    struct toy_lm m0 = new_model(model, &free_fn);
    if (!m0.self) return die("model");
    char path[256];
    snprintf(path, sizeof path, "/tmp/toy-bench-cuda-%d.gguf", (int)getpid());
    /* q8_0 is written as such (the models quantize their matrices as they
     * write them): one pass, and no 5 GB f32 or bf16 file for the 1B shape */
    enum toy_dtype wt = !strcmp(wtype, "f16")    ? TOY_F16
                        : !strcmp(wtype, "bf16") ? TOY_BF16
                        : !strcmp(wtype, "q8_0") ? TOY_Q8_0
                        : !strcmp(wtype, "q4_k") ? TOY_Q4_K
                                                 : TOY_F32;
    struct toy_gguf_writer *w;
    if (toy_gguf_writer_init(&w) || m0.write_gguf(m0.self, w, wt) || toy_gguf_writer_write(w, path))
        return die("write gguf");
    toy_gguf_writer_free(w);
    free_fn(m0.self);
    struct toy_lm m = load_model(model, path, &free_fn);
    if (!m.self) return die("load");
    struct toy_kv_cache kv;
    int n_ctx = n_tokens + 8;
    if (m.cache_init(m.self, &kv, n_ctx, 1, TOY_F32)) return die("kv cache");
    struct toy_ctx *ctx = toy_ctx_init(true);
    struct toy_tensor *tok = toy_new_tensor_2d(ctx, TOY_I32, 1, 1), *pos = toy_new_tensor_1d(ctx, TOY_I32, 1);
    struct toy_tensor *lg = m.forward_cached(m.self, ctx, &kv, tok, pos, false);
    toy_set_output(lg);
    struct toy_graph *g = toy_graph_new(ctx);
    toy_graph_build(g, lg);
    toy_graph_set_fusion(g, true); /* as toy generate does (TOY_FUSE=0: unfused, to compare) */
    if (toy_graph_set_device(g, device)) return die(device);
    struct toy_threadpool *tp = toy_threadpool_new(4);
    double t0 = 0;
    for (int s = 0; s < n_tokens; s++) {
        if (s == 2) t0 = now_s(); /* after the first uploads */
        *(int32_t *)kv.n_past->data = s;
        ((int32_t *)tok->data)[0] = (int32_t)((s * 31 + 7) % m.vocab);
        ((int32_t *)pos->data)[0] = s;
        if (toy_graph_compute(g, tp)) return die("decode");
    }
    double dt = now_s() - t0;
    printf("{\"bench\":\"decode\",\"impl\":\"toy\",\"model\":\"%s\",\"device\":\"%s\",\"weights\":\"%s\","
           "\"tokens\":%d,\"tokens_per_s\":%.1f,\"ms_per_token\":%.3f}\n",
           model, device, wtype, n_tokens - 2, (n_tokens - 2) / dt, 1e3 * dt / (n_tokens - 2));
    toy_threadpool_free(tp);
    toy_ctx_free(ctx);
    toy_kv_cache_free(&kv);
    free_fn(m.self);
    unlink(path);
    return 0;
}

/* One op alone, forward and forward + backward, on random data: the
 * product C (M x N) = A (M x K) B^T with A and B trainable, or causal
 * attention over {D, H, T, B} queries (Hkv key/value heads). Math as
 * TOY_CUDA_MATH says (bench-cuda.sh's default for these: bf16). */
static double time_graph(struct toy_graph *g, struct toy_threadpool *tp, int reps) {
    for (int i = 0; i < 2; i++)
        if (toy_graph_compute(g, tp)) return -1; /* warm-up: plan, uploads, cuBLAS heuristics */
    double t0 = now_s();
    for (int i = 0; i < reps; i++)
        if (toy_graph_compute(g, tp)) return -1;
    return (now_s() - t0) / reps;
}

static void fill_random(struct toy_tensor *t, struct toy_rng *r) {
    float *x = t->data;
    for (int64_t i = 0; i < toy_nelements(t); i++) x[i] = 2.0f * toy_rng_uniform(r) - 1.0f;
}

static int op_bench(int argc, char **argv, const char *device) {
    bool mm = !strcmp(argv[2], "matmul");
    if (argc < (mm ? 6 : 8)) return 2;
    struct toy_ctx *ctx = toy_ctx_init(true);
    struct toy_rng r;
    toy_rng_seed(&r, 1);
    struct toy_tensor *y, *in[3];
    int n_in;
    double flops; /* forward */
    char shape[128];
    if (mm) {
        int64_t M = atoll(argv[3]), N = atoll(argv[4]), K = atoll(argv[5]);
        in[0] = toy_new_tensor_2d(ctx, TOY_F32, K, M);
        in[1] = toy_new_tensor_2d(ctx, TOY_F32, K, N);
        n_in = 2;
        for (int i = 0; i < n_in; i++) toy_set_param(in[i]);
        y = toy_matmul(ctx, in[0], in[1], false, true);
        flops = 2.0 * M * N * K;
        snprintf(shape, sizeof shape, "\"M\":%lld,\"N\":%lld,\"K\":%lld", (long long)M, (long long)N, (long long)K);
    } else {
        int64_t B = atoll(argv[3]), H = atoll(argv[4]), Hkv = atoll(argv[5]), T = atoll(argv[6]), D = atoll(argv[7]);
        in[0] = toy_new_tensor_4d(ctx, TOY_F32, D, H, T, B);
        in[1] = toy_new_tensor_4d(ctx, TOY_F32, D, Hkv, T, B);
        in[2] = toy_new_tensor_4d(ctx, TOY_F32, D, Hkv, T, B);
        n_in = 3;
        for (int i = 0; i < n_in; i++) toy_set_param(in[i]);
        const char *m = getenv("TOY_CUDA_MATH");
        struct toy_attn_params ap = {.causal = true, .bf16 = m && !strcmp(m, "bf16")};
        y = toy_attention(ctx, in[0], in[1], in[2], &ap);
        flops = 2.0 * B * H * T * T * D; /* causal: half of 4 B H T^2 D */
        snprintf(shape, sizeof shape, "\"B\":%lld,\"H\":%lld,\"Hkv\":%lld,\"T\":%lld,\"D\":%lld", (long long)B,
                 (long long)H, (long long)Hkv, (long long)T, (long long)D);
    }
    for (int i = 0; i < n_in; i++) fill_random(in[i], &r);
    struct toy_tensor *loss = toy_sum_all(ctx, y);
    struct toy_graph *fwd = toy_graph_new(ctx), *both = toy_graph_new(ctx);
    toy_graph_build(fwd, loss);
    toy_graph_build(both, loss);
    toy_graph_backward(both, loss);
    if (toy_graph_set_device(fwd, device) || toy_graph_set_device(both, device)) return die(device);
    struct toy_threadpool *tp = toy_threadpool_new(4);
    double tf = time_graph(fwd, tp, 10), tb = time_graph(both, tp, 10);
    if (tf < 0 || tb < 0) return die("compute");
    const char *math = getenv("TOY_CUDA_MATH"), *attn = getenv("TOY_CUDA_ATTN");
    /* backward: two products of the forward's size (dA, dB), or ~2.5 times
     * the forward for attention (dQ, dK, dV, with P recomputed) */
    double bwd_flops = flops * (mm ? 2.0 : 2.5);
    printf("{\"bench\":\"op\",\"op\":\"%s\",\"device\":\"%s\",\"math\":\"%s\",\"attn\":\"%s\",%s,"
           "\"fwd_ms\":%.3f,\"fwd_bwd_ms\":%.3f,\"fwd_tflops\":%.1f,\"bwd_tflops\":%.1f}\n",
           argv[2], device, math && *math ? math : "f32", attn && *attn ? attn : "auto", shape, 1e3 * tf, 1e3 * tb,
           flops / tf * 1e-12, tb > tf ? bwd_flops / (tb - tf) * 1e-12 : 0.0);
    fflush(stdout);
    toy_threadpool_free(tp);
    toy_ctx_free(ctx);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: bench-cuda train MODEL B T STEPS [DEVICE] [f32|bf16]\n"
                        "       bench-cuda decode MODEL f32|f16|bf16|q8_0|q4_k N_TOKENS [DEVICE]\n"
                        "       bench-cuda op matmul M N K [DEVICE]\n"
                        "       bench-cuda op attention B H HKV T D [DEVICE]\n");
        return 2;
    }
    bool train_mode = !strcmp(argv[1], "train"), op_mode = !strcmp(argv[1], "op");
    int dev_at = train_mode ? 6 : !op_mode ? 5 : argc > 2 && !strcmp(argv[2], "matmul") ? 6 : 8;
    const char *device = argc > dev_at ? argv[dev_at] : "cuda:0";
    if (strcmp(device, "cpu") && (!toy_cuda_built() || toy_cuda_device_count() < 1)) {
        printf("{\"bench\":\"%s\",\"skipped\":\"%s\"}\n", argv[1],
               toy_cuda_built() ? "no CUDA device" : "toy built without CUDA");
        return 0;
    }
    if (train_mode && argc >= 6)
        return train(argv[2], atoi(argv[3]), atoi(argv[4]), atoi(argv[5]), device, argc > 7 ? argv[7] : "bf16");
    if (!strcmp(argv[1], "decode") && argc >= 5) return decode(argv[2], argv[3], atoi(argv[4]), device);
    if (op_mode && argc >= 3 && (!strcmp(argv[2], "matmul") || !strcmp(argv[2], "attention"))) {
        int rc = op_bench(argc, argv, device);
        if (rc != 2) return rc;
    }
    fprintf(stderr, "bench-cuda: bad arguments\n");
    return 2;
}
