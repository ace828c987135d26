/* bench-llama.c: Llama training and inference speed on the shapes.
 *   train   step time (forward + cross-entropy + backward + AdamW), f32 and
 *           bf16 mixed precision, tokens/s (train-f32, train-bf16: one of them)
 *   infer   prefill tokens/s (T 256, one graph) and KV-cache decode tokens/s
 *           (256-token context, f16 cache) over f32, q8_0 and q4_0 weights,
 *           and over f32 weights with bf16 products (f32+bf16: toy generate
 *           --bf16),
 *           with the memory-bandwidth bound:
 *           the larger of the triad and the read-only bandwidth measured
 *           now (toy/threadpool.h) / weight bytes read per token; and
 *           beside it the bound from the read rate sustained over as long
 *           as the decode run took (a peak of a few ms can come from a fast
 *           moment of the machine a 0.1-0.7 s run never sees)
 * Shapes: S = stories15M (vocab 32000, d 288, 6 layers, 6 heads, d_ff 768,
 * T 256, B 8); M = SmolLM2-135M (vocab 49152, d 576, 30 layers, 9/3 heads,
 * d_ff 1536, T 256, B 4); K = M at width 512 (8/4 heads of 64), so every
 * matrix's rows fit the k-quants' super-blocks (gguf and file only); E = K
 * with 12 layers of 32 experts 512 wide, 4 a token (train, gguf and file;
 * its model FLOPs count the parameters a token uses).
 * Prints JSON lines for bench/report.py.
 *   gguf    writes the M shape with random weights (f32) and a tokenizer to a
 *           GGUF, for the llama.cpp comparison (bench/llama_cpp.sh)
 *   file    prefill and decode tokens/s of a GGUF file as a user runs it
 *           (mmapped weights), the same protocol as bench/llama_cpp.mjs
 *   scale   how the S training step grows with T (128 -> 1024, B 8) and how
 *           M decode falls with context (256 -> 2048, q8_0 weights)
 *   stream  decode's products alone against loads alone over the same
 *           weights and nodes (bench_stream), f32, q8_0 and q4_0
 *   lookup  M decode with prompt lookup (drafts of 4 and 8) against plain, and
 *           with a draft model (M's own first 2 or 6 layers) against plain
 * Usage: bench-llama THREADS [S|M|E] [train|infer|scale|stream|lookup]
 *        bench-llama 0 [M|K] gguf OUT.gguf TOKENIZER_DIR
 *        bench-llama THREADS M file MODEL.gguf */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench-quant.h"
#include "toy/generate.h"
#include "toy/quant.h"
#include "toy/tokenizer.h"
#include "toy/toy.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static struct toy_llama_config shape(const char *s, int64_t *T, int64_t *B) {
    struct toy_llama_config c = toy_llama_preset(!strcmp(s, "S") ? "stories15m" : "smollm2-135m");
    *T = 256;
    *B = !strcmp(s, "S") ? 8 : 4;
    if (!strcmp(s, "K")) { /* M with rows the k-quants' 256-element super-blocks fit (M's 576 does not) */
        c.d_model = 512;
        c.n_heads = 8;
        c.n_kv_heads = 4;
        c.head_dim = 64;
    }
    if (!strcmp(s, "E")) { /* a mixture of experts at K's width: 12 layers of 32 experts, 4 a token (Mixtral's
                              layout, OLMoE's 1/8 active) */
        c.d_model = 512;
        c.n_heads = 8;
        c.n_kv_heads = 4;
        c.head_dim = 64;
        c.n_layers = 12;
        c.n_experts = 32, c.n_experts_used = 4, c.d_ff_expert = 512, c.moe_norm = true;
    }
    return c;
}

static double bench_train_T(struct toy_threadpool *tp, int nth, const char *s, bool bf16, int64_t T_override);
static void bench_train(struct toy_threadpool *tp, int nth, const char *s, bool bf16) {
    bench_train_T(tp, nth, s, bf16, 0);
}

static double bench_train_T(struct toy_threadpool *tp, int nth, const char *s, bool bf16, int64_t T_override) {
    int64_t T, B;
    struct toy_llama_config c = shape(s, &T, &B);
    if (T_override) T = T_override;
    struct toy_llama *m = toy_llama_new(&c, 1);
    m->matmul_type = bf16 ? TOY_BF16 : TOY_F32;
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
    int grp = toy_optim_add_group(o, &(struct toy_optim_group){.beta1 = 0.9f, .beta2 = 0.95f, .weight_decay = 0.1f});
    for (int i = 0; i < toy_llama_n_tensors(m); i++) toy_optim_add_param(o, toy_llama_tensor(m, i), grp);
    int steps = T_override ? 2 : !strcmp(s, "S") ? 5 : 3;
    double best = 1e30;
    for (int i = 0; i < steps + 1; i++) {
        double t0 = now();
        toy_optim_zero_grad(o);
        toy_graph_compute(g, tp);
        toy_optim_clip_grad_norm(o, 1.0f, tp);
        toy_optim_step(o, 1e-4f, tp);
        double dt = now() - t0;
        if (i > 0 && dt < best) best = dt; /* the first step plans and warms up */
    }
    double n = (double)toy_llama_n_params(m);
    if (c.n_experts) /* a mixture: the parameters a token uses (k of its experts) */
        n -= (double)(c.n_layers - c.n_dense_lead) * 3.0 * (double)(c.d_model * c.d_ff_expert) *
             (double)(c.n_experts - c.n_experts_used);
    double flops = 6.0 * n * (double)(T * B); /* model FLOPs, attention excluded */
    if (!T_override) {
        printf("{\"bench\":\"train\",\"shape\":\"%s\",\"dtype\":\"%s\",\"threads\":%d,\"toy_s\":%.3f,\"toy_tok_s\":%.0f,"
               "\"toy_gflops\":%.1f,\"peak_act_mb\":%.1f}\n", s, bf16 ? "bf16" : "f32", nth, best, (double)(T * B) / best,
               flops / best / 1e9, pi.peak_bytes / 1e6);
        fflush(stdout);
    } else {
        printf("scaling: train %s f32 T %4lld B %lld: %.3f s/step, %.0f tok/s, %.1f GFLOPS (model), activations %.0f MB\n",
               s, (long long)T, (long long)B, best, (double)(T * B) / best, flops / best / 1e9, pi.peak_bytes / 1e6);
        fflush(stdout);
    }
    toy_optim_free(o);
    toy_ctx_free(ctx);
    toy_llama_free(m);
    return best;
}

static bool count_tok(void *ud, int32_t id, const char *text, size_t len, float lp);

/* A model of shape s with random weights, its 2-D weights re-stored in
 * `type` (as a quantized GGUF's would be; TOY_F32: left as they are), and
 * the buffers that hold them. */
struct qmodel {
    struct toy_llama_config c;
    struct toy_llama *m;
    void *keep[512];
    int n_keep;
};
static void qmodel_quantize(struct qmodel *q, enum toy_dtype type);
static void qmodel_new(struct qmodel *q, const char *s, enum toy_dtype type, int64_t max_ctx) {
    int64_t T, B;
    q->c = shape(s, &T, &B);
    if (max_ctx) q->c.max_ctx = max_ctx;
    q->m = toy_llama_new(&q->c, 1);
    qmodel_quantize(q, type);
}
static void qmodel_quantize(struct qmodel *q, enum toy_dtype type) {
    q->n_keep = 0;
    for (int i = 0; type != TOY_F32 && i < toy_llama_n_tensors(q->m); i++) {
        struct toy_tensor *t = toy_llama_tensor(q->m, i);
        if (t->ne[1] <= 1) continue;
        q->keep[q->n_keep++] = bench_requantize(t, type);
        toy_set_frozen(t);
    }
}
static void qmodel_free(struct qmodel *q) {
    toy_llama_free(q->m);
    for (int i = 0; i < q->n_keep; i++) free(q->keep[i]);
}

/* decode tokens/s of M (q8_0 weights, f16 cache) after prompts of 256 .. 2048 tokens */
static void bench_ctx_scaling(struct toy_threadpool *tp) {
    struct qmodel q;
    qmodel_new(&q, "M", TOY_Q8_0, 8192); /* SmolLM2-135M's trained context */
    struct toy_llama *m = q.m;
    struct toy_llama_config c = q.c;
    int32_t *prompt = malloc(2048 * sizeof *prompt);
    for (int i = 0; i < 2048; i++) prompt[i] = (int32_t)((i * 31 + 7) % c.vocab);
    struct toy_generator *gen;
    toy_generator_new_kv(m, NULL, 2048 + 64, TOY_F16, tp, &gen); /* the CLI's default cache */
    struct toy_generate_params gp = {.n_predict = 16, .ignore_eos = true};
    double first = 0;
    for (int64_t n = 256; n <= 2048; n *= 2) {
        double bd = 0, bp = 0;
        for (int rep = 0; rep < 2; rep++) {
            struct toy_generate_result r;
            int k = 0;
            if (toy_generate(gen, prompt, n, &gp, count_tok, &k, &r)) {
                fprintf(stderr, "bench-llama: context %lld: %s\n", (long long)n, toy_last_error());
                break;
            }
            double steps = (double)(r.n_generated - 1); /* decode steps: the first token is the prompt's */
            if (steps / r.decode_s > bd) bd = steps / r.decode_s;
            if (r.n_prompt / r.prefill_s > bp) bp = r.n_prompt / r.prefill_s;
        }
        if (bd == 0) break;
        if (!first) first = bd;
        printf("scaling: decode M q8_0 (f16 cache) context %4lld: %.1f tok/s (%.2fx of context 256); prefill %.0f tok/s\n",
               (long long)n, bd, bd / first, bp);
        fflush(stdout);
    }
    toy_generator_free(gen);
    free(prompt);
    qmodel_free(&q);
}

/* The fastest of 5 runs of each of n settings (128 tokens after the 256-token prompt), the runs interleaved so that
 * the machine's slow spells fall on all of them: the result and its tokens/s after the prompt's token */
static void best_runs(struct toy_generator *gen, const int32_t *prompt, const struct toy_generate_params *gps, int n,
                      struct toy_generate_result *bests, double *bts, const char *what) {
    for (int i = 0; i < n; i++) bts[i] = 0, bests[i] = (struct toy_generate_result){0};
    for (int rep = 0; rep < 5; rep++)
        for (int i = 0; i < n; i++) {
            struct toy_generate_result r;
            int k = 0;
            if (toy_generate(gen, prompt, 256, &gps[i], count_tok, &k, &r)) {
                fprintf(stderr, "bench-llama: %s: %s\n", what, toy_last_error());
                return;
            }
            double tps = (double)(r.n_generated - 1) / r.decode_s;
            if (tps > bts[i]) bts[i] = tps, bests[i] = r;
        }
}

/* Prompt lookup (speculative decoding from the context) on M, q8_0 weights: 128 greedy tokens after a
 * 256-token prompt that is one 64-token passage four times (text that repeats itself, as an edit of code
 * does), plain and with drafts of 4 and 8 tokens: tokens/s, the drafts kept, and what a pass over a draft costs
 * against a one-token pass. The random model soon repeats itself too, so most drafts are kept: an upper end. */
static void bench_lookup(struct toy_threadpool *tp) {
    struct qmodel q;
    qmodel_new(&q, "M", TOY_Q8_0, 512);
    int32_t prompt[256];
    for (int i = 0; i < 256; i++) prompt[i] = (int32_t)(((i % 64) * 2654435761u >> 7) % (uint32_t)q.c.vocab);
    struct toy_generator *gen;
    toy_generator_new_kv(q.m, NULL, 512, TOY_F16, tp, &gen);
    double plain_tps = 0, plain_pass = 0;
    const int lookups[] = {0, 4, 8};
    struct toy_generate_params gps[3];
    for (int li = 0; li < 3; li++) gps[li] = (struct toy_generate_params){.n_predict = 128, .ignore_eos = true,
                                                                           .lookup = lookups[li]};
    struct toy_generate_result bests[3];
    double bts[3];
    best_runs(gen, prompt, gps, 3, bests, bts, "lookup");
    for (int li = 0; li < 3; li++) {
        struct toy_generate_result best = bests[li];
        double bt = bts[li];
        double pass_ms = best.n_steps ? 1e3 * best.decode_s / (double)best.n_steps : 0;
        if (!li) plain_tps = bt, plain_pass = pass_ms;
        printf("lookup: M q8_0, draft %d: %.1f tok/s (%.2fx plain), %lld of %lld drafted tokens kept, %lld passes for "
               "%lld tokens, %.2f ms a pass (%.2fx a one-token pass)\n",
               lookups[li], bt, plain_tps > 0 ? bt / plain_tps : 0, (long long)best.n_accepted,
               (long long)best.n_drafted, (long long)best.n_steps, (long long)best.n_generated, pass_ms,
               plain_pass > 0 ? pass_ms / plain_pass : 0);
        printf("{\"bench\":\"lookup\",\"shape\":\"M\",\"weights\":\"q8_0\",\"draft\":%d,\"decode_tok_s\":%.1f,"
               "\"speedup\":%.3f,\"drafted\":%lld,\"accepted\":%lld,\"passes\":%lld,\"pass_ms\":%.3f}\n",
               lookups[li], bt, plain_tps > 0 ? bt / plain_tps : 0, (long long)best.n_drafted,
               (long long)best.n_accepted, (long long)best.n_steps, pass_ms);
        fflush(stdout);
    }
    toy_generator_free(gen);
    qmodel_free(&q);
}

/* Speculative decoding with a draft model on M, q8_0 weights: 128 greedy tokens after a 256-token prompt that
 * does not repeat itself, plain and with drafts of 4 tokens by M's own first L layers (its embedding, final norm
 * and head; a self-speculative draft, as layer-skipping drafts are: random weights give no real pair of models
 * that agree): tokens/s, the drafts kept, what a draft pass costs against a model pass, and where it breaks even. */
static void bench_draft(struct toy_threadpool *tp) {
    struct qmodel q;
    int64_t T, B;
    q.c = shape("M", &T, &B);
    q.c.max_ctx = 512;
    q.m = toy_llama_new(&q.c, 1);
    const int layers[] = {2, 6};
    struct qmodel dq[2];
    for (int i = 0; i < 2; i++) { /* M's first layers, copied before either is quantized */
        dq[i].c = q.c;
        dq[i].c.n_layers = layers[i];
        dq[i].m = toy_llama_new(&dq[i].c, 2);
        for (int t = 0; t < toy_llama_n_tensors(dq[i].m); t++) {
            struct toy_tensor *d = toy_llama_tensor(dq[i].m, t);
            for (int u = 0; u < toy_llama_n_tensors(q.m); u++) {
                struct toy_tensor *src = toy_llama_tensor(q.m, u);
                if (!strcmp(src->name, d->name)) memcpy(d->data, src->data, toy_nbytes(d));
            }
        }
        qmodel_quantize(&dq[i], TOY_Q8_0);
    }
    qmodel_quantize(&q, TOY_Q8_0);
    int32_t prompt[256];
    for (int i = 0; i < 256; i++) prompt[i] = (int32_t)(((uint32_t)(i + 1) * 2654435761u >> 7) % (uint32_t)q.c.vocab);
    struct toy_generator *gen, *drafts[2];
    toy_generator_new_kv(q.m, NULL, 512, TOY_F16, tp, &gen);
    for (int i = 0; i < 2; i++) toy_generator_new_kv(dq[i].m, NULL, 512, TOY_F16, tp, &drafts[i]);
    double plain_tps = 0, plain_pass = 0;
    struct toy_generate_params gps[3];
    for (int di = -1; di < 2; di++)
        gps[di + 1] = (struct toy_generate_params){.n_predict = 128, .ignore_eos = true,
                                                   .draft = di < 0 ? NULL : drafts[di], .draft_max = 4};
    struct toy_generate_result bests[3];
    double bts[3];
    best_runs(gen, prompt, gps, 3, bests, bts, "draft");
    for (int di = -1; di < 2; di++) {
        struct toy_generate_result best = bests[di + 1];
        double bt = bts[di + 1];
        double model_s = best.decode_s - best.draft_s; /* the draft's prefill is in prefill_s: its passes here */
        double draft_pass = best.n_draft_steps > 1 ? 1e3 * best.draft_s / (double)best.n_draft_steps : 0;
        double pass_ms = best.n_steps ? 1e3 * (di < 0 ? best.decode_s : model_s) / (double)best.n_steps : 0;
        if (di < 0) {
            plain_tps = bt, plain_pass = pass_ms;
            printf("draft: M q8_0 plain: %.1f tok/s, %.2f ms a pass\n", bt, pass_ms);
        } else {
            printf("draft: M q8_0, draft of 4 by its first %d layers: %.1f tok/s (%.2fx plain), %lld of %lld drafted "
                   "tokens kept, %lld passes for %lld tokens, a draft pass %.2f ms (%.2fx a model pass)\n",
                   layers[di], bt, plain_tps > 0 ? bt / plain_tps : 0, (long long)best.n_accepted,
                   (long long)best.n_drafted, (long long)best.n_steps, (long long)best.n_generated, draft_pass,
                   plain_pass > 0 ? draft_pass / plain_pass : 0);
        }
        printf("{\"bench\":\"draft\",\"shape\":\"M\",\"weights\":\"q8_0\",\"draft_layers\":%d,\"decode_tok_s\":%.1f,"
               "\"speedup\":%.3f,\"drafted\":%lld,\"accepted\":%lld,\"passes\":%lld,\"draft_passes\":%lld,"
               "\"draft_pass_ms\":%.3f}\n",
               di < 0 ? 0 : layers[di], bt, plain_tps > 0 ? bt / plain_tps : 0, (long long)best.n_drafted,
               (long long)best.n_accepted, (long long)best.n_steps, (long long)best.n_draft_steps, draft_pass);
        fflush(stdout);
    }
    for (int i = 0; i < 2; i++) toy_generator_free(drafts[i]), qmodel_free(&dq[i]);
    toy_generator_free(gen);
    qmodel_free(&q);
}

static bool count_tok(void *ud, int32_t id, const char *text, size_t len, float lp) {
    (void)id; (void)text; (void)len; (void)lp;
    (*(int *)ud)++;
    return true;
}

static void bench_infer(struct toy_threadpool *tp, int nth, const char *s, enum toy_dtype wtype, bool bf16) {
    struct qmodel q;
    qmodel_new(&q, s, wtype, 0);
    struct toy_llama *m = q.m;
    struct toy_llama_config c = q.c;
    if (bf16 && !toy_llama_infer_bf16(m)) { /* no faster bf16 products here: the f32 row says it all */
        qmodel_free(&q);
        return;
    }
    int32_t *prompt = malloc(256 * sizeof *prompt);
    for (int i = 0; i < 256; i++) prompt[i] = (int32_t)((i * 31 + 7) % c.vocab);
    struct toy_generator *gen;
    toy_generator_new_kv(m, NULL, 512, TOY_F16, tp, &gen); /* the cache toy generate keeps by default */
    struct toy_generate_params gp = {.n_predict = 32, .ignore_eos = true};
    struct toy_generate_result r;
    double bp = 0, bd = 0, triad = 0, rd = 0, sr = 0;
    for (int i = 0; i < 3; i++) { /* each run's bound: the bandwidth measured right after it (as toy bench) */
        int n = 0;
        toy_generate(gen, prompt, 256, &gp, count_tok, &n, &r);
        double sus, rb = toy_memory_read_rates(tp, r.decode_s, &sus); /* first: sustained right after the run */
        double t = toy_memory_bandwidth_gbs(tp);
        double p = r.n_prompt / r.prefill_s, d = (double)(r.n_generated - 1) / r.decode_s; /* decode steps */
        if (p > bp) bp = p;
        if (d > bd) {
            bd = d;
            triad = t;
            rd = rb;
            sr = sus;
        }
    }
    double gbs = triad > rd ? triad : rd;
    double bytes = toy_llama_decode_bytes(m);
    printf("{\"bench\":\"infer\",\"shape\":\"%s\",\"dtype\":\"%s\",\"threads\":%d,\"prefill_tok_s\":%.1f,"
           "\"decode_tok_s\":%.1f,\"triad_gbs\":%.1f,\"read_gbs\":%.1f,\"weight_mb\":%.1f,\"decode_bound_tok_s\":%.1f,"
           "\"sustained_read_gbs\":%.1f,\"decode_bound_sustained_tok_s\":%.1f}\n",
           s, bf16 ? "f32+bf16" : toy_dtype_name(wtype), nth, bp, bd, triad, rd, bytes / 1e6, gbs * 1e9 / bytes, sr,
           sr * 1e9 / bytes);
    fflush(stdout);
    toy_generator_free(gen);
    free(prompt);
    qmodel_free(&q);
}

static int write_gguf(const char *which, const char *out, const char *tok_dir) {
    int64_t T, B;
    struct toy_llama_config c = shape(which, &T, &B);
    struct toy_tokenizer *tok = NULL;
    struct toy_gguf_writer *w = NULL;
    if (toy_tokenizer_load(tok_dir, &tok)) goto fail;
    if (toy_tokenizer_n_vocab(tok) != c.vocab) {
        fprintf(stderr, "bench-llama: %s has %lld tokens, the %s shape needs %lld\n", tok_dir,
                (long long)toy_tokenizer_n_vocab(tok), which, (long long)c.vocab);
        toy_tokenizer_free(tok);
        return 1;
    }
    struct toy_llama *m = toy_llama_new(&c, 1);
    enum toy_status st = toy_gguf_writer_init(&w);
    if (!st) st = toy_llama_write_gguf(m, w, TOY_F32);
    if (!st) st = toy_tokenizer_write_gguf(tok, w);
    if (!st) st = toy_gguf_writer_write(w, out);
    toy_gguf_writer_free(w);
    toy_llama_free(m);
    toy_tokenizer_free(tok);
    if (!st) return 0;
fail:
    fprintf(stderr, "bench-llama: %s\n", toy_last_error());
    return 1;
}

/* 256-token prompt, then 64 tokens greedily, best of 5, f16 KV cache: what
 * bench/llama_cpp.mjs does with llama.cpp on the same file (its decode rate
 * counts 64 evaluations, ours the 63 steps after the prompt's token) */
static int bench_file(struct toy_threadpool *tp, int nth, const char *path) {
    struct toy_llama *m;
    if (toy_llama_load(path, false, &m)) {
        fprintf(stderr, "bench-llama: %s\n", toy_last_error());
        return 1;
    }
    int32_t prompt[256];
    for (int i = 0; i < 256; i++) prompt[i] = (int32_t)((i * 31 + 7) % m->cfg.vocab);
    struct toy_generator *gen;
    if (toy_generator_new_kv(m, NULL, 512, TOY_F16, tp, &gen)) { /* llama.cpp's default cache type */
        fprintf(stderr, "bench-llama: %s\n", toy_last_error());
        toy_llama_free(m);
        return 1;
    }
    struct toy_generate_params gp = {.n_predict = 64, .ignore_eos = true};
    double bp = 0, bd = 0, triad = 0, rd = 0, sr = 0;
    for (int i = 0; i < 5; i++) { /* each run's bound: the bandwidth measured right after it (as toy bench) */
        struct toy_generate_result r;
        int n = 0;
        toy_generate(gen, prompt, 256, &gp, count_tok, &n, &r);
        double sus, d = toy_memory_read_rates(tp, r.decode_s, &sus); /* first: sustained right after the run */
        double t = toy_memory_bandwidth_gbs(tp);
        if (r.n_prompt / r.prefill_s > bp) bp = r.n_prompt / r.prefill_s;
        double steps = (double)(r.n_generated - 1); /* decode steps: the first token is the prompt's */
        if (steps / r.decode_s > bd) {
            bd = steps / r.decode_s;
            triad = t;
            rd = d;
            sr = sus;
        }
    }
    const char *wt = toy_dtype_name(m->layers[0].wo->type);
    double gbs = triad > rd ? triad : rd;
    double bytes = toy_llama_decode_bytes(m);
    printf("{\"bench\":\"file\",\"dtype\":\"%s\",\"threads\":%d,\"prefill_tok_s\":%.1f,\"decode_tok_s\":%.1f,"
           "\"triad_gbs\":%.1f,\"read_gbs\":%.1f,\"weight_mb\":%.1f,\"decode_bound_tok_s\":%.1f,"
           "\"sustained_read_gbs\":%.1f,\"decode_bound_sustained_tok_s\":%.1f}\n",
           wt, nth, bp, bd, triad, rd, bytes / 1e6, gbs * 1e9 / bytes, sr, sr * 1e9 / bytes);
    fflush(stdout);
    toy_generator_free(gen);
    toy_llama_free(m);
    return 0;
}

/* stream: the decode step's products alone -- every weight of the shape,
 * one row, in decode's order and with its fusions (q, k and v in one pass,
 * gate and up in one) -- against a loads-only pass over the same bytes, in
 * the same nodes, on the same pool, and against the same loads in one pool
 * run, the three alternated pass by pass. The products' share of the node
 * loads' rate is how near the kernels come to what the memory gives this
 * access pattern, whatever phase the machine is in; the node loads' share
 * of the one-run loads is what the pattern itself (the nodes and the
 * pool's syncs between them) costs. */
struct replay {
    const char *p[3];
    size_t n[3];
};
static const struct replay *replay_node;
static int replay_count; /* nodes replay_all reads */
static volatile uint64_t replay_sink;
static uint64_t replay_read(const struct replay *r, int ith, int nth) {
    uint64_t acc = 0;
    for (int s = 0; s < 3 && r->p[s]; s++) {
        size_t lines = r->n[s] / 64, l0 = lines * ith / nth, l1 = lines * (ith + 1) / nth;
        const uint64_t *w = (const uint64_t *)r->p[s];
        for (size_t l = l0; l < l1; l++) acc ^= w[8 * l] ^ w[8 * l + 4]; /* a load in each half of the line */
    }
    return acc;
}
static void replay_part(void *arg, int ith, int nth) { (void)arg; replay_sink += replay_read(replay_node, ith, nth); }
/* every node's share in one run: the same bytes, no syncs between them */
static void replay_all(void *arg, int ith, int nth) {
    (void)arg;
    uint64_t acc = 0;
    for (int r = 0; r < replay_count; r++) acc ^= replay_read(&replay_node[r], ith, nth);
    replay_sink += acc;
}

static void bench_stream(struct toy_threadpool *tp, int nth, const char *s, enum toy_dtype wtype) {
    struct qmodel q;
    qmodel_new(&q, s, wtype, 0);
    struct toy_llama *m = q.m;
    struct toy_llama_config c = q.c;
    if (toy_llama_pack_weights(m)) {
        fprintf(stderr, "bench-llama stream: %s\n", toy_last_error());
        qmodel_free(&q);
        return;
    }
    struct toy_ctx *ctx = toy_ctx_init(true);
    struct toy_graph *g = toy_graph_new(ctx);
    double bytes = 0;
    for (int64_t l = 0; l <= c.n_layers; l++) {
        struct toy_llama_layer *L = l < c.n_layers ? &m->layers[l] : NULL;
        struct toy_tensor *w[7] = {0}, *x[4];
        int role[7] = {0, 0, 0, 1, 2, 2, 3};
        if (L) memcpy(w, (struct toy_tensor *[7]){L->wq, L->wk, L->wv, L->wo, L->w_gate, L->w_up, L->w_down}, sizeof w);
        else w[0] = m->output; /* the head, after the last layer */
        for (int r = 0; r < 4; r++) { /* an input per layer and role: the fusions are decode's */
            x[r] = toy_new_tensor_2d(ctx, TOY_F32, r == 3 ? c.d_ff : c.d_model, 1);
            for (int64_t i = 0; i < x[r]->ne[0]; i++) ((float *)x[r]->data)[i] = 0.01f * (float)((i * 7 + r) % 13) - 0.06f;
        }
        for (int i = 0; i < 7 && w[i]; i++) {
            toy_graph_build(g, toy_matmul(ctx, x[role[i]], w[i], false, true));
            bytes += (double)toy_nbytes(w[i]);
        }
    }
    toy_graph_set_fusion(g, true);
    if (toy_graph_compute(g, tp)) { /* plans it, and fuses */
        fprintf(stderr, "bench-llama stream: %s\n", toy_last_error());
        toy_ctx_free(ctx);
        qmodel_free(&q);
        return;
    }
    /* the replay: each node the pool runs, with the bytes its product (and
     * the siblings it computes) reads */
    int n = toy_graph_n_nodes(g), nr = 0;
    struct replay *rp = calloc((size_t)n, sizeof *rp);
    for (int i = 0; i < n; i++) {
        struct toy_tensor *t = toy_graph_node(g, i);
        bool led = false;
        for (int j = 0; j < n && !led; j++)
            for (int k = 0; k < 2; k++) led |= toy_graph_node(g, j)->siblings[k] == t;
        if (t->op != TOY_OP_MATMUL || led) continue;
        for (int k = 0; k < 3; k++) {
            struct toy_tensor *wt = (k ? t->siblings[k - 1] : t);
            if (!wt) break;
            wt = wt->src[1];
            rp[nr].p[k] = wt->packed ? wt->packed : wt->data;
            rp[nr].n[k] = toy_nbytes(wt); /* (packed: the same bytes, laid out for the kernel) */
        }
        nr++;
    }
    double tprod = 0, tload = 0, twhole = 0, t0, t1, t2, t3;
    int reps = wtype == TOY_F32 ? 20 : 80;
    for (int i = 0; i < 3; i++) toy_graph_compute(g, tp);
    for (int i = 0; i < reps; i++) { /* the three alternated, so that they meet the same phases */
        t0 = now();
        toy_graph_compute(g, tp);
        t1 = now();
        for (int r = 0; r < nr; r++) {
            replay_node = &rp[r];
            toy_threadpool_run(tp, replay_part, NULL);
        }
        t2 = now();
        replay_node = rp;
        replay_count = nr;
        toy_threadpool_run(tp, replay_all, NULL);
        t3 = now();
        tprod += t1 - t0;
        tload += t2 - t1;
        twhole += t3 - t2;
    }
    double pg = bytes * reps / tprod / 1e9, lg = bytes * reps / tload / 1e9, wg = bytes * reps / twhole / 1e9;
    printf("stream: %s %s, %d threads, %d nodes of %.1f MB: products %.1f GB/s = %.0f%% of loads over the same nodes "
           "(%.1f GB/s = %.0f%% of the same loads in one run, %.1f GB/s)\n",
           s, toy_dtype_name(wtype), nth, nr, bytes / 1e6, pg, 100 * pg / lg, lg, 100 * lg / wg, wg);
    printf("{\"bench\":\"stream\",\"shape\":\"%s\",\"dtype\":\"%s\",\"threads\":%d,\"nodes\":%d,\"weight_mb\":%.1f,"
           "\"products_gbs\":%.1f,\"node_loads_gbs\":%.1f,\"loads_gbs\":%.1f}\n",
           s, toy_dtype_name(wtype), nth, nr, bytes / 1e6, pg, lg, wg);
    fflush(stdout);
    free(rp);
    toy_ctx_free(ctx);
    qmodel_free(&q);
}

/* figures measured beside other work are the machine's load as much as toy's */
static void shared_cores_warning(const struct toy_threadpool *tp, const char *mode) {
    if (toy_threadpool_shared(tp))
        fprintf(stderr, "bench-llama %s: other work shared the cores during this run (%ld looks of the pool found "
                "them shared): its figures are low\n", mode, toy_threadpool_shared(tp));
}

int main(int argc, char **argv) {
    int nth = argc > 1 ? atoi(argv[1]) : 2;
    const char *which = argc > 2 ? argv[2] : "S";
    const char *mode = argc > 3 ? argv[3] : "train";
    if (!strcmp(mode, "gguf")) return argc > 5 ? write_gguf(which, argv[4], argv[5]) : 2;
    struct toy_threadpool *tp = toy_threadpool_new(nth);
    if (!strcmp(mode, "file")) {
        int rc = argc > 4 ? bench_file(tp, nth, argv[4]) : 2;
        shared_cores_warning(tp, mode);
        toy_threadpool_free(tp);
        return rc;
    }
    if (!strcmp(mode, "lookup")) {
        bench_lookup(tp);
        bench_draft(tp);
        toy_threadpool_free(tp);
        return 0;
    }
    if (!strcmp(mode, "scale")) {
        for (int64_t T = 128; T <= 1024; T *= 2) bench_train_T(tp, nth, "S", false, T);
        bench_ctx_scaling(tp);
    } else if (!strcmp(mode, "train")) {
        bench_train(tp, nth, which, false);
        bench_train(tp, nth, which, true);
    } else if (!strcmp(mode, "stream")) {
        bench_stream(tp, nth, which, TOY_F32);
        bench_stream(tp, nth, which, TOY_Q8_0);
        bench_stream(tp, nth, which, TOY_Q4_0);
    } else if (!strcmp(mode, "train-f32") || !strcmp(mode, "train-bf16")) { /* one of the two, for profiling */
        bench_train(tp, nth, which, !strcmp(mode, "train-bf16"));
    } else {
        bench_infer(tp, nth, which, TOY_F32, false);
        bench_infer(tp, nth, which, TOY_F32, true);
        bench_infer(tp, nth, which, TOY_Q8_0, false);
        bench_infer(tp, nth, which, TOY_Q4_0, false);
    }
    shared_cores_warning(tp, mode);
    toy_threadpool_free(tp);
    return 0;
}
