/* test-moe.c: the mixture-of-experts ops (toy_moe_route, toy_moe_matmul)
 * against a plain reference written here: the router's softmax, top k and
 * renormalisation, and each (token, slot)'s product with its expert's
 * matrix, one row and one slot at a time. Weights f32, f16, Q8_0, Q4_K and
 * MXFP4 (gpt-oss's experts), as the file holds them and packed for the int8
 * kernels; 1 and 2 threads; decode (one token) and prefill (more of an
 * expert's rows than a pass takes); and where the files keep the experts'
 * width. The models' logits against PyTorch are in test-llama.c. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "toy/gguf.h"
#include "toy/llama.h"
#include "toy/quant.h"
#include "toy/toy.h"

#define E 6
#define KS 2

static float urand(uint64_t *s) {
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((*s >> 40) & 0xffffff) / 16777216.0f * 2 - 1;
}

/* the reference route: ids and weights of one row of logits */
static void route_ref(const float *lg, int k, bool norm, int32_t *id, float *w) {
    double p[E], sum = 0, mx = -INFINITY;
    for (int e = 0; e < E; e++) mx = lg[e] > mx ? lg[e] : mx;
    for (int e = 0; e < E; e++) sum += p[e] = exp(lg[e] - mx);
    bool taken[E] = {0};
    double picked = 0;
    for (int s = 0; s < k; s++) {
        int b = -1;
        for (int e = 0; e < E; e++)
            if (!taken[e] && (b < 0 || p[e] > p[b])) b = e;
        taken[b] = true;
        id[s] = b;
        w[s] = (float)(p[b] / sum);
        picked += p[b] / sum;
    }
    for (int s = 0; norm && s < k; s++) w[s] = (float)(w[s] / picked);
}

/* runs out = moe_matmul(x, w, route(logits)) on nth threads */
static void run(struct toy_tensor *lg, struct toy_tensor *x, struct toy_tensor *w, bool combine, bool norm, int nth,
                float *out, int32_t *ids, float *wts) {
    struct toy_ctx *ctx = toy_ctx_init(true);
    struct toy_tensor *route = toy_moe_route(ctx, lg, KS, norm);
    struct toy_tensor *y = toy_moe_matmul(ctx, x, w, route, combine);
    toy_set_output(y);
    toy_set_output(route);
    struct toy_graph *g = toy_graph_new(ctx);
    toy_graph_build(g, y);
    struct toy_threadpool *tp = toy_threadpool_new(nth);
    cr_assert_eq(toy_graph_compute(g, tp), TOY_OK, "%s", toy_last_error());
    memcpy(out, y->data, toy_nbytes(y));
    if (ids) memcpy(ids, route->data, toy_nbytes(route));
    if (wts) memcpy(wts, (char *)route->data + toy_nbytes(route), toy_nbytes(route));
    toy_threadpool_free(tp);
    toy_ctx_free(ctx);
}

static void check(enum toy_dtype type, int64_t K, int64_t n, int64_t N, bool per_slot, bool combine, bool pack) {
    uint64_t seed = 42 + (uint64_t)(K * 7 + n * 3 + N) + type;
    struct toy_ctx *ctx = toy_ctx_init(true);
    struct toy_tensor *lg = toy_new_tensor_2d(ctx, TOY_F32, E, N);
    struct toy_tensor *x = toy_new_tensor_3d(ctx, TOY_F32, K, per_slot ? KS : 1, N);
    struct toy_tensor *wf = toy_new_tensor_3d(ctx, TOY_F32, K, n, E);
    for (int64_t i = 0; i < toy_nelements(lg); i++) ((float *)lg->data)[i] = 3 * urand(&seed);
    for (int64_t i = 0; i < toy_nelements(x); i++) ((float *)x->data)[i] = urand(&seed);
    for (int64_t i = 0; i < toy_nelements(wf); i++) ((float *)wf->data)[i] = urand(&seed) * 0.1f;
    /* w in `type`, and its values as f32 (what the reference multiplies by) */
    struct toy_tensor *w = wf;
    float *wv = wf->data;
    if (type != TOY_F32) {
        w = toy_new_tensor_3d(ctx, TOY_F32, K, n, E); /* described as `type` below, its data the rows */
        size_t rb = toy_row_bytes(type, K);
        void *q = toy_ctx_alloc(ctx, rb * (size_t)(n * E));
        cr_assert_eq(toy_quantize_row(type, wf->data, q, K * n * E), TOY_OK, "%s", toy_last_error());
        w->type = type;
        w->nb[0] = toy_dtype_type_size(type);
        w->nb[1] = rb;
        w->nb[2] = rb * (size_t)n;
        w->nb[3] = w->nb[2] * (size_t)E;
        w->data = q;
        wv = malloc(sizeof(float) * (size_t)(K * n * E));
        cr_assert_eq(toy_dequantize_row(type, q, wv, K * n * E), TOY_OK, "%s", toy_last_error());
        if (pack) cr_assert_eq(toy_tensor_pack(w), TOY_OK, "%s", toy_last_error());
        cr_assert(!pack || w->packed, "%s: not packed", toy_dtype_name(type));
    }
    int64_t rows = combine ? N : N * KS;
    float *got1 = malloc(sizeof(float) * (size_t)(rows * n)), *got2 = malloc(sizeof(float) * (size_t)(rows * n));
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(N * KS));
    float *wts = malloc(sizeof(float) * (size_t)(N * KS));
    run(lg, x, w, combine, combine, 1, got1, ids, wts);
    run(lg, x, w, combine, combine, 2, got2, NULL, NULL);
    cr_expect_eq(memcmp(got1, got2, sizeof(float) * (size_t)(rows * n)), 0, "%s: 1 and 2 threads differ",
                 toy_dtype_name(type));
    /* the reference */
    double worst = 0, scale = 0;
    for (int64_t t = 0; t < N; t++) {
        int32_t rid[KS];
        float rw[KS];
        route_ref((const float *)lg->data + t * E, KS, combine, rid, rw);
        for (int s = 0; s < KS; s++) {
            cr_assert_eq(ids[t * KS + s], rid[s], "token %lld slot %d: expert %d, not %d", (long long)t, s,
                         ids[t * KS + s], rid[s]);
            cr_assert_float_eq(wts[t * KS + s], rw[s], 1e-6f, "token %lld slot %d: weight", (long long)t, s);
        }
        for (int64_t j = 0; j < n; j++) {
            double sum = 0;
            for (int s = 0; s < KS; s++) {
                const float *xr = (const float *)x->data + (t * (per_slot ? KS : 1) + (per_slot ? s : 0)) * K;
                const float *wr = wv + ((int64_t)rid[s] * n + j) * K;
                double dot = 0;
                for (int64_t i = 0; i < K; i++) dot += (double)xr[i] * wr[i];
                if (combine) sum += rw[s] * dot;
                else {
                    double e = fabs(got1[(t * KS + s) * n + j] - dot);
                    worst = e > worst ? e : worst;
                    scale = fabs(dot) > scale ? fabs(dot) : scale;
                }
            }
            if (combine) {
                double e = fabs(got1[t * n + j] - sum);
                worst = e > worst ? e : worst;
                scale = fabs(sum) > scale ? fabs(sum) : scale;
            }
        }
    }
    /* the int8 kernels round x to Q8_0 (1/254 of a block's largest) */
    double tol = pack ? 2e-2 : 1e-5;
    cr_log_info("%s K %lld n %lld N %lld%s%s%s: max |toy - ref| %.2e of %.2e", toy_dtype_name(type), (long long)K,
                (long long)n, (long long)N, per_slot ? " per slot" : "", combine ? " combined" : "",
                pack ? " packed" : "", worst, scale);
    cr_expect_leq(worst, tol * scale, "%s: products differ from the reference", toy_dtype_name(type));
    if (w->packed) toy_tensor_unpack(w);
    if (wv != wf->data) free(wv);
    free(got1), free(got2), free(ids), free(wts);
    toy_ctx_free(ctx);
}

Test(moe, route_and_products_match_the_reference, .timeout = 120) {
    const enum toy_dtype types[] = {TOY_F32, TOY_F16, TOY_Q8_0, TOY_Q4_K, TOY_MXFP4};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        int64_t K = 256; /* decode's products at least graph.c's 2e5 flops: run by both threads */
        for (int packed = 0; packed < (types[i] == TOY_F32 || types[i] == TOY_F16 ? 1 : 2); packed++) {
            check(types[i], K, 300, 1, false, false, packed);   /* decode: gate / up */
            check(types[i], K, 400, 1, true, true, packed);     /* decode: down, combined */
            check(types[i], K, 40, 200, false, false, packed);  /* prefill: > 64 rows an expert */
            check(types[i], K, 290, 150, true, true, packed);   /* prefill: down, combined */
        }
    }
}

/* The files load in llama.cpp: it reads a mixture's expert width from
 * expert_feed_forward_length for qwen3moe only, from feed_forward_length
 * for Mixtral (llama) and OLMoE; toy writes each so and reads it back. */
Test(moe, expert_width_is_written_where_llama_cpp_reads_it) {
    th_mkdir("moe-width");
    const char *arch[] = {"llama", "olmoe", "qwen3moe"};
    for (int i = 0; i < 3; i++) {
        struct toy_llama_config c = toy_llama_preset("tiny");
        c.vocab = 40, c.d_ff = 96;
        snprintf(c.arch, sizeof c.arch, "%s", arch[i]);
        c.n_experts = 4, c.n_experts_used = 2, c.d_ff_expert = 32, c.moe_norm = i != 1;
        struct toy_llama *m = toy_llama_new(&c, 1);
        cr_assert(m, "%s", toy_last_error());
        char path[400];
        snprintf(path, sizeof path, "%s/%s.gguf", th_dir, arch[i]);
        th_save_llama(m, TOY_F32, path);
        toy_llama_free(m);
        struct toy_gguf *g;
        cr_assert_eq(toy_gguf_open(path, &g), TOY_OK, "%s", toy_last_error());
        char key[96];
        uint32_t ff = 0, fe = 0;
        snprintf(key, sizeof key, "%s.feed_forward_length", arch[i]);
        cr_assert_eq(toy_gguf_get_u32(g, key, &ff), TOY_OK);
        snprintf(key, sizeof key, "%s.expert_feed_forward_length", arch[i]);
        bool has_fe = toy_gguf_get_u32(g, key, &fe) == TOY_OK;
        if (i == 2) cr_expect(has_fe && fe == 32 && ff == 96, "%s: ff %u, expert ff %u", arch[i], ff, fe);
        else cr_expect(!has_fe && ff == 32, "%s: ff %u (want the experts' 32), expert key %d", arch[i], ff, has_fe);
        toy_gguf_close(g);
        cr_assert_eq(toy_llama_load(path, false, &m), TOY_OK, "%s", toy_last_error());
        cr_expect_eq(m->layers[0].ffn_up_exps->ne[1], 32, "%s: experts %lld wide", arch[i],
                     (long long)m->layers[0].ffn_up_exps->ne[1]);
        toy_llama_free(m);
    }
    th_rmdir();
}

/* DeepSeek-V3's routing: sigmoid scores, the k best of score + bias, weighed by their unbiased scores
 * (renormalised or not); the bias large enough to change the choice */
Test(moe, sigmoid_scores_choose_with_the_bias_and_weigh_without) {
    enum { N = 9, K = 3 };
    uint64_t seed = 7;
    struct toy_ctx *ctx = toy_ctx_init(true);
    struct toy_tensor *lg = toy_new_tensor_2d(ctx, TOY_F32, E, N), *bias = toy_new_tensor_1d(ctx, TOY_F32, E);
    for (int64_t i = 0; i < toy_nelements(lg); i++) ((float *)lg->data)[i] = 3 * urand(&seed);
    for (int e = 0; e < E; e++) ((float *)bias->data)[e] = 0.4f * urand(&seed);
    int changed = 0;
    for (int norm = 0; norm < 2; norm++) {
        struct toy_tensor *r = toy_moe_route_scored(ctx, lg, K, norm, true, bias);
        struct toy_tensor *r0 = toy_moe_route_scored(ctx, lg, K, norm, true, NULL);
        toy_set_output(r);
        toy_set_output(r0);
        struct toy_graph *g = toy_graph_new(ctx);
        toy_graph_build(g, r);
        toy_graph_build(g, r0);
        struct toy_threadpool *tp = toy_threadpool_new(2);
        cr_assert_eq(toy_graph_compute(g, tp), TOY_OK, "%s", toy_last_error());
        toy_threadpool_free(tp);
        const int32_t *ids = r->data, *ids0 = r0->data;
        const float *w = (const float *)((char *)r->data + toy_nbytes(r));
        for (int t = 0; t < N; t++) {
            const float *x = (const float *)lg->data + t * E;
            double sc[E], ch[E], picked = 0;
            bool taken[E] = {0};
            for (int e = 0; e < E; e++) sc[e] = 1 / (1 + exp(-(double)x[e])), ch[e] = sc[e] + ((float *)bias->data)[e];
            int rid[K];
            for (int s = 0; s < K; s++) {
                int b = -1;
                for (int e = 0; e < E; e++)
                    if (!taken[e] && (b < 0 || ch[e] > ch[b])) b = e;
                taken[b] = true, rid[s] = b, picked += sc[b];
            }
            for (int s = 0; s < K; s++) {
                cr_assert_eq(ids[t * K + s], rid[s], "token %d slot %d: expert %d, not %d", t, s, ids[t * K + s], rid[s]);
                double want = norm ? sc[rid[s]] / picked : sc[rid[s]];
                cr_assert_float_eq(w[t * K + s], want, 1e-6, "token %d slot %d: weight %g, not %g", t, s, w[t * K + s], want);
                changed += ids0[t * K + s] != rid[s];
            }
        }
    }
    cr_assert_gt(changed, 0, "the bias changed no choice: the test would not see it ignored");
    toy_ctx_free(ctx);
}

/* Training a mixture: the load-balancing term toy_llama_moe_ffn builds
 * (Switch Transformer's, for k experts a token) and its gradient, against
 * the formula in double: E sum_e f_e P_e with f_e the share of the
 * choices that went to e (constants) and P_e the mean softmax probability;
 * d/d logit[n][e] = E / N p[n][e] (f_e - sum_j f_j p[n][j]). */
Test(moe, load_balancing_term_and_its_gradient) {
    enum { D = 8, F = 12, N = 20 };
    struct toy_llama_config c = toy_llama_preset("tiny");
    c.d_model = D, c.d_ff = F, c.n_experts = E, c.n_experts_used = KS, c.moe_norm = true;
    struct toy_ctx *ctx = toy_ctx_init(true);
    uint64_t s = 5;
    struct toy_llama_layer L = {0};
    L.ffn_gate_inp = toy_new_tensor_2d(ctx, TOY_F32, D, E);
    toy_set_param(L.ffn_gate_inp);
    L.ffn_gate_exps = toy_new_tensor_3d(ctx, TOY_F32, D, F, E);
    L.ffn_up_exps = toy_new_tensor_3d(ctx, TOY_F32, D, F, E);
    L.ffn_down_exps = toy_new_tensor_3d(ctx, TOY_F32, F, D, E);
    struct toy_tensor *h = toy_new_tensor_2d(ctx, TOY_F32, D, N);
    struct toy_tensor *all[] = {L.ffn_gate_inp, L.ffn_gate_exps, L.ffn_up_exps, L.ffn_down_exps, h};
    for (int i = 0; i < 5; i++)
        for (int64_t j = 0; j < toy_nelements(all[i]); j++) ((float *)all[i]->data)[j] = urand(&s);
    struct toy_tensor *bal = NULL;
    struct toy_llama m = {.cfg = c};
    toy_llama_moe_ffn(ctx, &m, &L, h, &bal);
    cr_assert(bal);
    struct toy_graph *g = toy_graph_new(ctx);
    toy_graph_build(g, bal);
    toy_graph_backward(g, bal);
    struct toy_threadpool *tp = toy_threadpool_new(2);
    cr_assert_eq(toy_graph_compute(g, tp), TOY_OK, "%s", toy_last_error());
    const float *W = L.ffn_gate_inp->data, *x = h->data, *gw = L.ffn_gate_inp->grad->data;
    double p[N][E], f[E] = {0}, P[E] = {0};
    for (int n = 0; n < N; n++) {
        float lg[E];
        int32_t id[KS];
        float w[KS];
        for (int e = 0; e < E; e++) {
            double z = 0;
            for (int i = 0; i < D; i++) z += (double)W[e * D + i] * x[n * D + i];
            lg[e] = (float)z;
        }
        route_ref(lg, KS, true, id, w);
        for (int k = 0; k < KS; k++) f[id[k]] += 1.0 / (N * KS);
        double mx = -INFINITY, sum = 0;
        for (int e = 0; e < E; e++) mx = fmax(mx, lg[e]);
        for (int e = 0; e < E; e++) sum += p[n][e] = exp(lg[e] - mx);
        for (int e = 0; e < E; e++) P[e] += (p[n][e] /= sum) / N;
    }
    double want = 0;
    for (int e = 0; e < E; e++) want += E * f[e] * P[e];
    cr_assert(fabs(*(float *)bal->data - want) < 1e-5, "term %g, want %g", *(float *)bal->data, want);
    cr_assert(want > 1.0, "a random router is not balanced: %g", want);
    double worst = 0, gmax = 0;
    for (int e = 0; e < E; e++)
        for (int i = 0; i < D; i++) {
            double d = 0;
            for (int n = 0; n < N; n++) {
                double fp = 0;
                for (int j = 0; j < E; j++) fp += f[j] * p[n][j];
                d += (double)E / N * p[n][e] * (f[e] - fp) * x[n * D + i];
            }
            worst = fmax(worst, fabs(gw[e * D + i] - d));
            gmax = fmax(gmax, fabs(d));
        }
    cr_assert(gmax > 1e-3 && worst <= 1e-5 * (1 + gmax), "gradient off by %g (largest %g)", worst, gmax);
    toy_threadpool_free(tp);
    toy_ctx_free(ctx);
}
