/* test-finetune.c: LoRA, QLoRA, SFT data and the fine-tuning loop
 * (src/train/lora.c, sft.c, finetune.c; toy/finetune.h):
 *  - with B = 0 an adapted model's logits equal the base's exactly;
 *  - logits, loss and A/B gradients against PyTorch (tests/torch/ref_lora.py,
 *    PEFT's math in float64) at <= 1e-4 relative, over an F32 base and over
 *    Q8_0 and Q4_0 bases (QLoRA; the reference reads the dequantized weights);
 *  - adapter GGUF: llama.cpp's names, shapes and keys; load + save is
 *    byte-identical;
 *  - merged model's logits equal base + adapter (F32 base, <= 1e-4), and a
 *    quantized base stays quantized when merged;
 *  - SFT rows: -100 on prompt and padding, ids on completion; a
 *    masked-token probe: the loss is the mean over completion tokens only;
 *  - `toy finetune` takes a from-scratch checkpoint to answering a synthetic
 *    instruction set, and a resumed run ends bit-identical to an
 *    uninterrupted one;
 *  - QLoRA on a Q4_0 base of the SmolLM2-135M shape (random weights) keeps
 *    the peak resident memory under base file + adapter state + activations;
 *  - warm start copies (same width) or PCA-projects (narrower) a donor's
 *    embeddings, keeping their inner products;
 *  - a full fine-tune checkpoints the whole model (frozen embeddings
 *    unchanged), and QLoRA refuses an unquantized base. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "toy/convert.h"
#include "toy/finetune.h"
#include "toy/gguf.h"
#include "toy/graph.h"
#include "toy/toy.h"
#include "harness.h"

static const char *toy_bin(void) { return getenv("TOY_BIN") ? getenv("TOY_BIN") : "build/toy"; }

static struct toy_llama_config small_config(void) {
    struct toy_llama_config c = toy_llama_preset("tiny");
    c.vocab = 61;
    c.d_model = 64;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.d_ff = 96;
    c.n_layers = 2;
    c.max_ctx = 64;
    return c;
}

/* a random model with weights large enough for sharp logits, as F32 GGUF */
static void make_base(const char *path, const struct toy_llama_config *c, uint64_t seed) {
    struct toy_llama *m = toy_llama_new(c, seed);
    cr_assert(m, "%s", toy_last_error());
    for (int i = 0; i < toy_llama_n_tensors(m); i++) {
        struct toy_tensor *t = toy_llama_tensor(m, i);
        float *d = t->data;
        if (t->ne[1] > 1)
            for (int64_t k = 0; k < toy_nelements(t); k++) d[k] *= 8.0f;
    }
    th_save_llama(m, TOY_F32, path);
    toy_llama_free(m);
}

static float **grads_out; /* set: run_model copies the gradients of these lora tensors here */
static struct toy_lora *grads_of;

/* logits {vocab, T, B} as a malloc'd copy; with targets, also the loss and
 * (grads_of) the gradients of an adapter's tensors */
static float *run_model(struct toy_llama *m, const int32_t *tokens, const int32_t *targets, int T, int B,
                        float *loss_out) {
    struct toy_ctx *ctx = toy_ctx_init(true);
    struct toy_tensor *tok = toy_new_tensor_2d(ctx, TOY_I32, T, B), *pos = toy_new_tensor_1d(ctx, TOY_I32, T);
    memcpy(tok->data, tokens, sizeof(int32_t) * (size_t)(T * B));
    for (int t = 0; t < T; t++) ((int32_t *)pos->data)[t] = t;
    struct toy_tensor *lg = toy_llama_forward(ctx, m, tok, pos);
    toy_set_output(lg);
    struct toy_tensor *loss = NULL;
    struct toy_graph *g = toy_graph_new(ctx);
    if (targets) {
        struct toy_tensor *tgt = toy_new_tensor_2d(ctx, TOY_I32, T, B);
        memcpy(tgt->data, targets, sizeof(int32_t) * (size_t)(T * B));
        loss = toy_cross_entropy(ctx, lg, tgt, -100);
        toy_graph_build(g, loss);
        toy_graph_backward(g, loss);
        toy_graph_zero_grads(g);
    } else {
        toy_graph_build(g, lg);
    }
    struct toy_threadpool *tp = toy_threadpool_new(2);
    cr_assert_eq(toy_graph_compute(g, tp), TOY_OK, "%s", toy_last_error());
    size_t n = (size_t)toy_nelements(lg);
    float *out = malloc(n * sizeof *out);
    memcpy(out, lg->data, n * sizeof *out);
    if (loss_out && loss) *loss_out = *(float *)loss->data;
    for (int i = 0; grads_of && loss && i < toy_lora_n_tensors(grads_of); i++) {
        struct toy_tensor *p = toy_lora_tensor(grads_of, i);
        cr_assert(p->grad, "%s: no gradient", p->name);
        grads_out[i] = malloc((size_t)toy_nelements(p) * sizeof(float));
        memcpy(grads_out[i], p->grad->data, (size_t)toy_nelements(p) * sizeof(float));
    }
    for (int i = 0; i < toy_graph_n_params(g); i++) toy_graph_param(g, i)->grad = NULL; /* they live in ctx */
    toy_threadpool_free(tp);
    toy_ctx_free(ctx);
    return out;
}

static void fill_tokens(int32_t *tok, int32_t *tgt, int n, int vocab, uint64_t seed) {
    struct toy_rng r;
    toy_rng_seed(&r, seed);
    for (int i = 0; i < n; i++) {
        tok[i] = (int32_t)toy_rng_below(&r, (uint64_t)vocab);
        if (tgt) tgt[i] = i % 3 == 0 ? -100 : (int32_t)toy_rng_below(&r, (uint64_t)vocab);
    }
}

static void randomize_b(struct toy_lora *a, uint64_t seed, float std) {
    struct toy_rng r;
    toy_rng_seed(&r, seed);
    for (int i = 1; i < toy_lora_n_tensors(a); i += 2) {
        struct toy_tensor *t = toy_lora_tensor(a, i);
        float *d = t->data;
        for (int64_t k = 0; k < toy_nelements(t); k++) d[k] = std * toy_rng_normal(&r);
    }
}

/* the logits of base with adapter merged into it, written to merged (toy_lora_merge_file) and loaded mapped */
static float *merged_logits(const char *base, const char *adapter, const char *merged, const int32_t *tok, int T,
                            int B) {
    struct toy_llama *m;
    cr_assert_eq(toy_lora_merge_file(base, adapter, 1.0f, merged), TOY_OK, "%s", toy_last_error());
    cr_assert_eq(toy_llama_load(merged, false, &m), TOY_OK, "%s", toy_last_error());
    float *lg = run_model(m, tok, NULL, T, B, NULL);
    toy_llama_free(m);
    return lg;
}

/* ---- LoRA math -------------------------------------------------------------------- */

Test(finetune, zero_b_leaves_logits_unchanged) {
    th_mkdir("ft");
    struct toy_llama_config c = small_config();
    char path[400];
    snprintf(path, sizeof path, "%s/base.gguf", th_dir);
    make_base(path, &c, 11);
    struct toy_llama *m;
    cr_assert_eq(toy_llama_load(path, false, &m), TOY_OK, "%s", toy_last_error());
    const int T = 12, B = 2;
    int32_t tok[24];
    fill_tokens(tok, NULL, T * B, 61, 5);
    float *base = run_model(m, tok, NULL, T, B, NULL);
    struct toy_lora *a;
    struct toy_lora_opts o = {.rank = 4, .alpha = 8, .targets = (1u << TOY_LORA_N_TARGETS) - 1, .seed = 1};
    cr_assert_eq(toy_lora_attach(m, &o, &a), TOY_OK, "%s", toy_last_error());
    cr_assert_eq(toy_lora_n_tensors(a), 2 * 7 * 2);
    cr_assert_float_eq(m->lora_scale, 2.0f, 0);
    /* A is Kaiming-uniform: within +-1/sqrt(in), not all zero */
    const struct toy_tensor *A = toy_lora_tensor(a, 0);
    float amax = 0;
    for (int64_t k = 0; k < toy_nelements(A); k++) amax = fmaxf(amax, fabsf(((float *)A->data)[k]));
    cr_assert(amax > 0.5f / sqrtf(64.0f) && amax <= 1.0f / sqrtf(64.0f), "A max %g", amax);
    float *adapted = run_model(m, tok, NULL, T, B, NULL);
    for (int64_t i = 0; i < (int64_t)T * B * 61; i++)
        cr_assert(adapted[i] == base[i], "logit %lld: %.9g vs %.9g", (long long)i, adapted[i], base[i]);
    free(base);
    free(adapted);
    toy_lora_free(a);
    cr_assert_null(m->layers[0].lora_a[0]);
    toy_llama_free(m);
    th_rmdir();
}

static json_t *ids_json(const int32_t *v, int T, int B) {
    json_t *rows = json_array();
    for (int b = 0; b < B; b++) {
        json_t *r = json_array();
        for (int t = 0; t < T; t++) json_array_append_new(r, json_integer(v[b * T + t]));
        json_array_append_new(rows, r);
    }
    return rows;
}

/* toy vs PyTorch on `model` (what toy loads) and `ref_model` (what the
 * reference reads: the same weights in F32); bf16: toy's products in bf16
 * (finetune --bf16), against the same f32 reference */
static void check_against_torch_p(const char *model, const char *ref_model, double tol, const char *what, bool bf16) {
    struct toy_llama *m;
    cr_assert_eq(toy_llama_load(model, false, &m), TOY_OK, "%s", toy_last_error());
    if (bf16) m->matmul_type = TOY_BF16;
    struct toy_lora *a;
    struct toy_lora_opts o = {.rank = 4, .alpha = 6, .targets = (1u << TOY_LORA_N_TARGETS) - 1, .seed = 2};
    cr_assert_eq(toy_lora_attach(m, &o, &a), TOY_OK, "%s", toy_last_error());
    randomize_b(a, 9, 0.3f);
    char adapter[400];
    snprintf(adapter, sizeof adapter, "%s/adapter-%s.gguf", th_dir, what);
    cr_assert_eq(toy_lora_save(a, adapter), TOY_OK, "%s", toy_last_error());
    const int T = 10, B = 2;
    int32_t tok[20], tgt[20];
    fill_tokens(tok, tgt, T * B, 61, 17);
    float loss = 0;
    grads_of = a;
    grads_out = calloc((size_t)toy_lora_n_tensors(a), sizeof *grads_out);
    float *lg = run_model(m, tok, tgt, T, B, &loss);
    grads_of = NULL;
    json_t *cases = json_array();
    json_array_append_new(cases, json_pack("{s:s,s:s,s:f,s:o,s:o}", "gguf", ref_model, "adapter", adapter, "scale", 1.0,
                                           "tokens", ids_json(tok, T, B), "targets", ids_json(tgt, T, B)));
    json_t *res = th_torch("ref_lora.py", cases);
    json_t *r0 = json_array_get(json_object_get(res, "cases"), 0);
    json_t *rl = json_object_get(r0, "logits");
    double worst = 0;
    for (size_t i = 0; i < json_array_size(rl); i++) {
        double rv = json_number_value(json_array_get(rl, i));
        worst = fmax(worst, fabs(lg[i] - rv) / (1 + fabs(rv)));
    }
    cr_assert(worst <= tol, "%s logits: worst relative error %g", what, worst);
    double rloss = json_number_value(json_object_get(r0, "loss"));
    cr_assert(fabs(loss - rloss) <= tol * (1 + fabs(rloss)), "%s loss %g vs %g", what, loss, rloss);
    /* gradients: relative to the largest of each tensor */
    json_t *grads = json_object_get(r0, "grads");
    double gworst = 0;
    for (int i = 0; i < toy_lora_n_tensors(a); i++) {
        const struct toy_tensor *p = toy_lora_tensor(a, i);
        json_t *rg = json_object_get(grads, p->name);
        cr_assert(rg && (int64_t)json_array_size(rg) == toy_nelements(p), "%s: no reference gradient", p->name);
        double gmax = 0, err = 0;
        for (int64_t k = 0; k < toy_nelements(p); k++) gmax = fmax(gmax, fabs(json_number_value(json_array_get(rg, (size_t)k))));
        for (int64_t k = 0; k < toy_nelements(p); k++)
            err = fmax(err, fabs(grads_out[i][k] - json_number_value(json_array_get(rg, (size_t)k))));
        cr_assert(gmax > 0, "%s: zero reference gradient", p->name);
        gworst = fmax(gworst, err / gmax);
    }
    cr_assert(gworst <= tol, "%s gradients: worst relative error %g", what, gworst);
    const char *route = toy_cpu_bf16_gemm();
    if (bf16 && strcmp(route, "sgemm") && strcmp(route, "dequantize + sgemm"))
        cr_assert(worst > 1e-6, "%s: logits as exact as f32 (%g): the bf16 products did not run", what, worst);
    fprintf(stderr, "finetune: %s vs PyTorch: logits %.2e, loss %.2e, grads %.2e (relative)\n", what, worst,
            fabs(loss - rloss) / (1 + fabs(rloss)), gworst);
    json_decref(res);
    free(lg);
    for (int i = 0; i < toy_lora_n_tensors(a); i++) free(grads_out[i]);
    free(grads_out);
    toy_lora_free(a);
    toy_llama_free(m);
}
static void check_against_torch(const char *model, const char *ref_model, double tol, const char *what) {
    check_against_torch_p(model, ref_model, tol, what, false);
}

/* QLoRA on f32's quantization to type against PyTorch on the same weights
 * dequantized; q and qf get the two files' paths */
static void qlora_against_torch(const char *f32, enum toy_dtype type, const char *what, char q[400], char qf[400]) {
    snprintf(q, 400, "%s/base-%s.gguf", th_dir, toy_dtype_name(type));
    snprintf(qf, 400, "%s/base-%s-as-f32.gguf", th_dir, toy_dtype_name(type));
    cr_assert_eq(toy_gguf_quantize(f32, q, type, NULL, NULL), TOY_OK, "%s", toy_last_error());
    th_retype_gguf(q, qf, NULL, TOY_F32);
    check_against_torch(q, qf, 1e-4, what);
}

Test(finetune, lora_and_qlora_match_pytorch, .timeout = 300) {
    th_mkdir("ft");
    struct toy_llama_config c = small_config();
    char f32[400], q8[400], q8f[400];
    snprintf(f32, sizeof f32, "%s/base.gguf", th_dir);
    make_base(f32, &c, 21);
    check_against_torch(f32, f32, 1e-4, "LoRA (F32 base)");
    qlora_against_torch(f32, TOY_Q8_0, "QLoRA (Q8_0 base)", q8, q8f);
    qlora_against_torch(f32, TOY_Q4_0, "QLoRA (Q4_0 base)", q8, q8f);
    /* --bf16: the F32 base cast to bf16, the Q4_0 base dequantized to bf16
     * in the products, activations rounded -- bf16's 8 bits against f32
     * sums (seen: logits 5e-2 and 4e-2, gradients 3e-2 and 5e-2 of their
     * largest, loss 9e-4 and 5e-4) */
    check_against_torch_p(f32, f32, 0.1, "LoRA (F32 base, bf16 products)", true);
    check_against_torch_p(q8, q8f, 0.1, "QLoRA (Q4_0 base, bf16 products)", true);
    th_rmdir();
}

/* LoRA and QLoRA on a mixture of experts (Mixtral's shape): adapters on
 * the attention; the gradient reaches them back through every layer's
 * experts and router. Asking for the feed-forward targets only, where
 * every layer's feed-forward is its experts, is an error naming why. */
Test(finetune, lora_on_a_mixture_of_experts_matches_pytorch, .timeout = 300) {
    th_mkdir("ft-moe");
    struct toy_llama_config c = small_config();
    c.n_experts = 4, c.n_experts_used = 2, c.moe_norm = true;
    char f32[400], q8[400], q8f[400];
    snprintf(f32, sizeof f32, "%s/base.gguf", th_dir);
    make_base(f32, &c, 23);
    check_against_torch(f32, f32, 1e-4, "LoRA (mixture of experts)");
    qlora_against_torch(f32, TOY_Q8_0, "QLoRA (Q8_0 mixture of experts)", q8, q8f);
    struct toy_llama *m;
    cr_assert_eq(toy_llama_load(f32, false, &m), TOY_OK, "%s", toy_last_error());
    struct toy_lora *a = NULL;
    struct toy_lora_opts o = {.rank = 4, .targets = (1u << TOY_LORA_GATE) | (1u << TOY_LORA_DOWN), .seed = 2};
    cr_assert_eq(toy_lora_attach(m, &o, &a), TOY_ERR_INVALID_ARG);
    cr_assert(strstr(toy_last_error(), "gate,down") && strstr(toy_last_error(), "experts"), "%s", toy_last_error());
    cr_assert_null(a);
    toy_llama_free(m);
    th_rmdir();
}

/* ---- adapter files and merging ------------------------------------------------------ */

Test(finetune, adapter_gguf_is_llamacpp_convention_and_round_trips) {
    th_mkdir("ft");
    struct toy_llama_config c = small_config();
    char base[400], a1[400], a2[400];
    snprintf(base, sizeof base, "%s/base.gguf", th_dir);
    snprintf(a1, sizeof a1, "%s/a1.gguf", th_dir);
    snprintf(a2, sizeof a2, "%s/a2.gguf", th_dir);
    make_base(base, &c, 3);
    struct toy_llama *m;
    cr_assert_eq(toy_llama_load(base, false, &m), TOY_OK);
    unsigned tg;
    cr_assert_eq(toy_lora_parse_targets("q_proj,v,down", &tg), TOY_OK);
    cr_assert_eq(tg, (1u << TOY_LORA_Q) | (1u << TOY_LORA_V) | (1u << TOY_LORA_DOWN));
    cr_assert_neq(toy_lora_parse_targets("q,zz", &tg), TOY_OK);
    struct toy_lora *a;
    struct toy_lora_opts o = {.rank = 3, .alpha = 5, .targets = tg, .dropout = 0.1f, .seed = 4};
    cr_assert_eq(toy_lora_attach(m, &o, &a), TOY_OK);
    randomize_b(a, 1, 0.1f);
    cr_assert_eq(toy_lora_save(a, a1), TOY_OK, "%s", toy_last_error());
    toy_lora_free(a);
    /* what llama.cpp checks */
    struct toy_gguf *g;
    cr_assert_eq(toy_gguf_open(a1, &g), TOY_OK);
    const char *s;
    size_t n;
    cr_assert_eq(toy_gguf_get_str(g, "general.type", &s, &n), TOY_OK);
    cr_assert(n == 7 && !memcmp(s, "adapter", 7));
    cr_assert_eq(toy_gguf_get_str(g, "adapter.type", &s, &n), TOY_OK);
    cr_assert(n == 4 && !memcmp(s, "lora", 4));
    cr_assert_eq(toy_gguf_get_str(g, "general.architecture", &s, &n), TOY_OK);
    cr_assert(n == 5 && !memcmp(s, "llama", 5));
    float alpha;
    cr_assert_eq(toy_gguf_get_f32(g, "adapter.lora.alpha", &alpha), TOY_OK);
    cr_assert_float_eq(alpha, 5.0f, 0);
    cr_assert_eq(toy_gguf_n_tensors(g), 2 * 3 * 2);
    int64_t ia = toy_gguf_find_tensor(g, "blk.1.ffn_down.weight.lora_a");
    int64_t ib = toy_gguf_find_tensor(g, "blk.1.ffn_down.weight.lora_b");
    cr_assert(ia >= 0 && ib >= 0);
    cr_assert(toy_gguf_tensor(g, ia)->ne[0] == 96 && toy_gguf_tensor(g, ia)->ne[1] == 3); /* {in, r} */
    cr_assert(toy_gguf_tensor(g, ib)->ne[0] == 3 && toy_gguf_tensor(g, ib)->ne[1] == 64); /* {r, out} */
    cr_assert_eq(toy_gguf_tensor(g, ia)->type, TOY_F32);
    toy_gguf_close(g);
    /* load + save: the same bytes */
    cr_assert_eq(toy_lora_load(m, a1, 1.0f, false, &a), TOY_OK, "%s", toy_last_error());
    cr_assert_float_eq(m->lora_scale, 5.0f / 3.0f, 1e-7);
    cr_assert_float_eq(toy_lora_get_opts(a)->dropout, 0.1f, 1e-7);
    cr_assert_eq(toy_lora_save(a, a2), TOY_OK);
    cr_assert(th_files_equal(a1, a2), "adapter changed on load + save");
    toy_lora_free(a);
    /* a wrong base is refused with llama.cpp's shape check */
    struct toy_llama_config c2 = c;
    c2.d_ff = 128;
    char other[400];
    snprintf(other, sizeof other, "%s/other.gguf", th_dir);
    make_base(other, &c2, 3);
    struct toy_llama *m2;
    cr_assert_eq(toy_llama_load(other, false, &m2), TOY_OK);
    cr_assert_eq(toy_lora_load(m2, a1, 1.0f, false, &a), TOY_ERR_SHAPE);
    cr_assert(strstr(toy_last_error(), "wrong base model"), "%s", toy_last_error());
    cr_assert_neq(toy_lora_load(m2, base, 1.0f, false, &a), TOY_OK); /* not an adapter */
    toy_llama_free(m2);
    toy_llama_free(m);
    th_rmdir();
}

Test(finetune, merged_model_equals_base_plus_adapter, .timeout = 120) {
    th_mkdir("ft");
    struct toy_llama_config c = small_config();
    char base[400], ad[400], merged[400], q8[400], q8m[400];
    snprintf(base, sizeof base, "%s/base.gguf", th_dir);
    snprintf(ad, sizeof ad, "%s/adapter.gguf", th_dir);
    snprintf(merged, sizeof merged, "%s/merged.gguf", th_dir);
    snprintf(q8, sizeof q8, "%s/base-q8.gguf", th_dir);
    snprintf(q8m, sizeof q8m, "%s/merged-q8.gguf", th_dir);
    make_base(base, &c, 8);
    struct toy_llama *m;
    cr_assert_eq(toy_llama_load(base, false, &m), TOY_OK);
    struct toy_lora *a;
    struct toy_lora_opts o = {.rank = 4, .alpha = 8, .targets = (1u << TOY_LORA_N_TARGETS) - 1, .seed = 5};
    cr_assert_eq(toy_lora_attach(m, &o, &a), TOY_OK);
    randomize_b(a, 3, 0.3f);
    cr_assert_eq(toy_lora_save(a, ad), TOY_OK);
    const int T = 12, B = 2;
    int32_t tok[24];
    fill_tokens(tok, NULL, T * B, 61, 6);
    float *with = run_model(m, tok, NULL, T, B, NULL);
    toy_lora_free(a);
    float *plain = run_model(m, tok, NULL, T, B, NULL);
    toy_llama_free(m);
    float *mg = merged_logits(base, ad, merged, tok, T, B);
    double worst = 0, moved = 0;
    for (int i = 0; i < T * B * 61; i++) {
        worst = fmax(worst, fabs(mg[i] - with[i]) / (1 + fabs(with[i])));
        moved = fmax(moved, fabs(plain[i] - with[i]));
    }
    cr_assert(moved > 0.05, "the adapter barely changes the logits (%g)", moved);
    cr_assert(worst <= 1e-4, "merged vs adapted: %g", worst);
    /* the same through the CLI, and in memory on a trainable model */
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "%s merge '%s' '%s' -o '%s/cli.gguf' 2>/dev/null", toy_bin(), base, ad, th_dir);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    cr_assert_eq(toy_llama_load(base, true, &m), TOY_OK);
    cr_assert_eq(toy_lora_load(m, ad, 1.0f, false, &a), TOY_OK);
    cr_assert_eq(toy_lora_merge_into(m, a), TOY_OK);
    toy_lora_free(a);
    float *mem = run_model(m, tok, NULL, T, B, NULL);
    for (int i = 0; i < T * B * 61; i++) cr_assert(fabs(mem[i] - with[i]) <= 1e-4 * (1 + fabs(with[i])));
    free(mem);
    toy_llama_free(m);
    /* a Q8_0 base merges into Q8_0 weights */
    cr_assert_eq(toy_gguf_quantize(base, q8, TOY_Q8_0, NULL, NULL), TOY_OK);
    cr_assert_eq(toy_lora_merge_file(q8, ad, 1.0f, q8m), TOY_OK, "%s", toy_last_error());
    struct toy_gguf *g;
    cr_assert_eq(toy_gguf_open(q8m, &g), TOY_OK);
    cr_assert_eq(toy_gguf_tensor(g, toy_gguf_find_tensor(g, "blk.0.attn_q.weight"))->type, TOY_Q8_0);
    toy_gguf_close(g);
    cr_assert_eq(toy_llama_load(q8m, false, &m), TOY_OK);
    float *mq = run_model(m, tok, NULL, T, B, NULL);
    double qworst = 0;
    for (int i = 0; i < T * B * 61; i++) qworst = fmax(qworst, fabs(mq[i] - with[i]) / (1 + fabs(with[i])));
    cr_assert(qworst < 0.05 * moved + 0.02, "Q8_0 merge off by %g (adapter moves %g)", qworst, moved);
    fprintf(stderr, "finetune: merged F32 vs base+adapter %.2e; Q8_0 merged %.2e (adapter moves logits %.2f)\n", worst,
            qworst, moved);
    free(mq);
    toy_llama_free(m);
    free(with);
    free(plain);
    free(mg);
    th_rmdir();
}

/* an adapter file of llama.cpp's kind for a phi3 base: one pair on each layer's fused attn_qkv and ffn_up (as its
 * converter names PEFT's qkv_proj and gate_up_proj pairs), with a pair on attn_q too when clash */
static void write_fused_adapter(const char *path, const struct toy_llama_config *c, int r, bool clash) {
    struct toy_gguf_writer *w;
    cr_assert_eq(toy_gguf_writer_init(&w), TOY_OK);
    toy_gguf_writer_set_str(w, "general.architecture", "phi3");
    toy_gguf_writer_set_str(w, "general.type", "adapter");
    toy_gguf_writer_set_str(w, "adapter.type", "lora");
    toy_gguf_writer_set_f32(w, "adapter.lora.alpha", 2.0f * (float)r);
    int64_t hd = c->d_model / c->n_heads, outs[3] = {hd * (c->n_heads + 2 * c->n_kv_heads), 2 * c->d_ff, hd * c->n_heads};
    const char *names[3] = {"attn_qkv", "ffn_up", "attn_q"};
    static float data[2][64 * 192 * 8];
    struct toy_rng rng;
    toy_rng_seed(&rng, 77);
    for (size_t k = 0; k < sizeof data / sizeof data[0][0]; k++) (&data[0][0])[k] = 0.1f * toy_rng_normal(&rng);
    char name[96];
    for (int64_t l = 0; l < c->n_layers; l++)
        for (int k = 0; k < (clash ? 3 : 2); k++) {
            int64_t na[2] = {c->d_model, r}, nb[2] = {r, outs[k]};
            snprintf(name, sizeof name, "blk.%lld.%s.weight.lora_a", (long long)l, names[k]);
            cr_assert_eq(toy_gguf_writer_add_tensor(w, name, TOY_F32, 2, na, data[0]), TOY_OK);
            snprintf(name, sizeof name, "blk.%lld.%s.weight.lora_b", (long long)l, names[k]);
            cr_assert_eq(toy_gguf_writer_add_tensor(w, name, TOY_F32, 2, nb, data[1]), TOY_OK);
        }
    cr_assert_eq(toy_gguf_writer_write(w, path), TOY_OK, "%s", toy_last_error());
    toy_gguf_writer_free(w);
}

static double worst_rel(const float *a, const float *b, int64_t n) {
    double worst = 0;
    for (int64_t i = 0; i < n; i++) worst = fmax(worst, fabs(a[i] - b[i]) / (1 + fabs(b[i])));
    return worst;
}

/* Phi-3's files keep q, k, v in one attn_qkv and gate and up in one ffn_up. toy adapts the projections one by one
 * (its adapters name them so), and merges such an adapter into the fused tensors' rows of a file (F32, Q8_0); an
 * adapter of llama.cpp's kind, one pair on each fused tensor, loads as the same pair's A with B's rows per
 * projection, and gives what merging it whole gives. LoRA on a phi3 base against PyTorch, too. */
Test(finetune, phi3_adapters_on_fused_projections, .timeout = 120) {
    th_mkdir("ft-phi3");
    struct toy_llama_config c = small_config();
    snprintf(c.arch, sizeof c.arch, "phi3");
    c.rope_mode = TOY_ROPE_NEOX, c.rope_dim = 12, c.tied = false;
    enum { BASE, AD, MERGED, Q8, Q8M, FUSED, CLASH, N_FILES };
    char files[N_FILES][400];
    const char *names[N_FILES] = {"base", "adapter", "merged", "base-q8", "merged-q8", "fused", "clash"};
    for (int i = 0; i < N_FILES; i++) snprintf(files[i], sizeof files[i], "%s/%s.gguf", th_dir, names[i]);
    const char *base = files[BASE], *ad = files[AD], *merged = files[MERGED], *q8 = files[Q8], *q8m = files[Q8M],
               *fused = files[FUSED], *clash = files[CLASH];
    make_base(base, &c, 8);
    check_against_torch(base, base, 1e-4, "LoRA (phi3 F32 base)");
    struct toy_llama *m;
    cr_assert_eq(toy_llama_load(base, false, &m), TOY_OK, "%s", toy_last_error());
    struct toy_lora *a;
    struct toy_lora_opts o = {.rank = 4, .alpha = 8, .targets = (1u << TOY_LORA_N_TARGETS) - 1, .seed = 5};
    cr_assert_eq(toy_lora_attach(m, &o, &a), TOY_OK);
    randomize_b(a, 3, 0.3f);
    cr_assert_eq(toy_lora_save(a, ad), TOY_OK);
    const int T = 12, B = 2, n = T * B * 61;
    int32_t tok[24];
    fill_tokens(tok, NULL, T * B, 61, 6);
    float *with = run_model(m, tok, NULL, T, B, NULL);
    toy_lora_free(a);
    float *plain = run_model(m, tok, NULL, T, B, NULL);
    cr_assert(worst_rel(plain, with, n) > 0.01, "the adapter barely changes the logits");
    /* per projection, merged into the fused rows */
    float *mg = merged_logits(base, ad, merged, tok, T, B);
    double worst = worst_rel(mg, with, n);
    cr_assert(worst <= 1e-4, "merged into the fused file vs adapted: %g", worst);
    cr_assert_eq(toy_gguf_quantize(base, q8, TOY_Q8_0, NULL, NULL), TOY_OK);
    float *mq = merged_logits(q8, ad, q8m, tok, T, B);
    struct toy_gguf *g;
    cr_assert_eq(toy_gguf_open(q8m, &g), TOY_OK);
    cr_assert_eq(toy_gguf_tensor(g, toy_gguf_find_tensor(g, "blk.0.attn_qkv.weight"))->type, TOY_Q8_0);
    toy_gguf_close(g);
    double qworst = worst_rel(mq, with, n), moved = 0;
    for (int i = 0; i < n; i++) moved = fmax(moved, fabs(plain[i] - with[i]));
    cr_assert(qworst < 0.05 * moved + 0.02, "Q8_0 merge into the fused file off by %g (the adapter moves %g)", qworst,
              moved);
    /* llama.cpp's fused pairs: loaded split, against merged whole (the merge's own path for a pair on a file
     * tensor) */
    write_fused_adapter(fused, &c, 4, false);
    cr_assert_eq(toy_lora_load(m, fused, 1.0f, false, &a), TOY_OK, "%s", toy_last_error());
    cr_assert_eq(toy_lora_get_opts(a)->targets, (1u << TOY_LORA_Q | 1u << TOY_LORA_K | 1u << TOY_LORA_V |
                                                 1u << TOY_LORA_GATE | 1u << TOY_LORA_UP));
    float *split = run_model(m, tok, NULL, T, B, NULL);
    toy_lora_free(a);
    float *whole = merged_logits(base, fused, merged, tok, T, B);
    double fworst = worst_rel(split, whole, n), fmoved = worst_rel(plain, whole, n);
    cr_assert(fmoved > 0.01, "the fused adapter barely changes the logits (%g)", fmoved);
    cr_assert(fworst <= 1e-4, "a fused pair loaded split vs merged whole: %g", fworst);
    fprintf(stderr, "finetune: phi3 adapters: merged into fused F32 %.2e, Q8_0 %.2e; fused pairs split vs whole %.2e "
                    "(they move the logits %.2f)\n", worst, qworst, fworst, fmoved);
    /* a projection adapted twice: in the fused pair and on its own */
    write_fused_adapter(clash, &c, 4, true);
    cr_assert_eq(toy_lora_load(m, clash, 1.0f, false, &a), TOY_ERR_FORMAT);
    cr_assert(strstr(toy_last_error(), "attn_q.weight.lora_a adapts a projection that the layer's fused attn_qkv"),
              "%s", toy_last_error());
    toy_llama_free(m);
    free(with);
    free(plain);
    free(mg);
    free(mq);
    free(split);
    free(whole);
    th_rmdir();
}

/* ---- SFT data ------------------------------------------------------------------------- */

static struct toy_tokenizer *small_tokenizer(void) {
    const char *text = "The red cat sat on the mat. The blue dog ran. Q: what color? A: red. user assistant\n";
    struct toy_bpe_train_opts bo = {.vocab_size = 300};
    struct toy_tokenizer *tok;
    cr_assert_eq(toy_tokenizer_train_bpe(text, strlen(text), &bo, &tok), TOY_OK, "%s", toy_last_error());
    return tok;
}

Test(finetune, sft_rows_learn_only_the_completion) {
    struct toy_tokenizer *tok = small_tokenizer();
    const char *jsonl = "{\"prompt\": \"Q: what color?\", \"completion\": \" A: red.\"}\n"
                        "\n"
                        "{\"messages\": [{\"role\": \"user\", \"content\": \"The cat\"},"
                        " {\"role\": \"assistant\", \"content\": \"sat on the mat\"}]}\n"
                        "{\"prompt\": \"The blue dog ran. The blue dog ran. The blue dog ran. The blue dog ran. "
                        "The blue dog ran. The blue dog ran. The blue dog ran. The blue dog ran.\", \"completion\": \" red\"}\n";
    struct toy_sft *d;
    struct toy_sft_opts o = {.ctx = 64, .heldout = 0, .seed = 1};
    cr_assert_eq(toy_sft_from_text(jsonl, strlen(jsonl), tok, &o, &d), TOY_OK, "%s", toy_last_error());
    cr_assert_eq(toy_sft_n_train(d), 2);
    cr_assert_eq(toy_sft_dropped(d), 1); /* its completion is past T+1 tokens */
    const int32_t *ids;
    const unsigned char *mask;
    int64_t n;
    toy_sft_example(d, 0, &ids, &mask, &n);
    struct toy_tokens p = {0}, cpl = {0};
    toy_tokenizer_encode(tok, "Q: what color?", 14, 0, &p);
    toy_tokenizer_encode(tok, " A: red.", 8, 0, &cpl);
    int64_t off = toy_tokenizer_add_bos(tok) ? 1 : 0;
    cr_assert_eq(n, off + p.n + cpl.n + 1);
    for (int64_t i = 0; i < n; i++) cr_assert_eq(mask[i], i >= off + p.n, "mask[%lld]", (long long)i);
    cr_assert_eq(ids[n - 1], toy_tokenizer_eos(tok));
    /* chat example: the assistant text is learned, the user's is not */
    toy_sft_example(d, 1, &ids, &mask, &n);
    int64_t learned = 0;
    for (int64_t i = 0; i < n; i++) learned += mask[i];
    cr_assert(learned > 0 && learned < n);
    /* rows: x the ids, y the next id where learned, else -100; padding -100 */
    int32_t x[64], y[64];
    for (int k = 0; k < 2; k++) {
        toy_sft_next_batch(d, 1, x, y);
        const int32_t *e;
        const unsigned char *mk;
        int64_t en;
        int which = -1;
        for (int j = 0; j < 2; j++) {
            toy_sft_example(d, j, &e, &mk, &en);
            if (e[0] == x[0] && e[1] == x[1] && e[2] == x[2]) which = j;
        }
        cr_assert(which >= 0);
        toy_sft_example(d, which, &e, &mk, &en);
        for (int t = 0; t < 64; t++) {
            if (t + 1 < en) {
                cr_assert_eq(x[t], e[t]);
                cr_assert_eq(y[t], mk[t + 1] ? e[t + 1] : -100, "row %d t %d", which, t);
            } else {
                cr_assert_eq(y[t], -100);
            }
        }
    }
    struct toy_sft_state st;
    toy_sft_get_state(d, &st);
    cr_assert_eq(st.rows, 2);
    cr_assert_eq(st.epoch, 0);
    toy_sft_next_batch(d, 1, x, y);
    toy_sft_get_state(d, &st);
    cr_assert_eq(st.epoch, 1);
    toy_sft_free(d);
    /* bad lines name the line */
    const char *bad = "{\"prompt\": \"a\", \"completion\": \"b\"}\n{\"text\": 1}\n";
    cr_assert_eq(toy_sft_from_text(bad, strlen(bad), tok, &o, &d), TOY_ERR_FORMAT);
    cr_assert(strstr(toy_last_error(), "line 2"), "%s", toy_last_error());
    toy_tokens_free(&p);
    toy_tokens_free(&cpl);
    toy_tokenizer_free(tok);
}

Test(finetune, masked_token_probe_loss_is_on_completion_tokens_only) {
    th_mkdir("ft");
    struct toy_tokenizer *tok = small_tokenizer();
    struct toy_llama_config c = small_config();
    c.vocab = toy_tokenizer_n_vocab(tok);
    char path[400];
    snprintf(path, sizeof path, "%s/base.gguf", th_dir);
    make_base(path, &c, 12);
    struct toy_llama *m;
    cr_assert_eq(toy_llama_load(path, false, &m), TOY_OK);
    const char *jsonl = "{\"prompt\": \"The red cat sat on\", \"completion\": \" the mat.\"}\n";
    struct toy_sft *d;
    struct toy_sft_opts o = {.ctx = 24, .seed = 1};
    cr_assert_eq(toy_sft_from_text(jsonl, strlen(jsonl), tok, &o, &d), TOY_OK, "%s", toy_last_error());
    int32_t x[24], y[24];
    toy_sft_next_batch(d, 1, x, y);
    float loss = 0;
    float *lg = run_model(m, x, y, 24, 1, &loss);
    /* the probe: per-position -log p from the logits; the loss is their
     * mean over the completion positions, not over all positions */
    int64_t V = c.vocab;
    double sum_c = 0, sum_all = 0;
    int nc = 0, na = 0;
    const int32_t *ids;
    const unsigned char *mask;
    int64_t n;
    toy_sft_example(d, 0, &ids, &mask, &n);
    for (int t = 0; t + 1 < n && t < 24; t++) {
        const float *row = lg + (int64_t)t * V;
        double mx = -1e30, se = 0;
        for (int64_t v = 0; v < V; v++) mx = fmax(mx, row[v]);
        for (int64_t v = 0; v < V; v++) se += exp(row[v] - mx);
        double nll = -(row[ids[t + 1]] - mx - log(se));
        sum_all += nll;
        na++;
        if (mask[t + 1]) { sum_c += nll; nc++; }
    }
    cr_assert(nc > 0 && nc < na);
    cr_assert(fabs(loss - sum_c / nc) < 1e-4 * (1 + sum_c / nc), "loss %g, completion mean %g", loss, sum_c / nc);
    cr_assert(fabs(loss - sum_all / na) > 1e-3, "loss %g equals the all-token mean %g", loss, sum_all / na);
    /* what the finetuner's length buckets rely on: cut after the last target, the loss is the same */
    int last = 0;
    for (int t = 0; t < 24; t++)
        if (y[t] != -100) last = t;
    float cut_loss = 0;
    float *lg2 = run_model(m, x, y, last + 1, 1, &cut_loss);
    cr_assert(fabs(cut_loss - loss) <= 1e-6 * (1 + loss), "loss over %d positions %g, over 24 %g", last + 1, cut_loss, loss);
    free(lg2);
    free(lg);
    toy_sft_free(d);
    toy_llama_free(m);
    toy_tokenizer_free(tok);
    th_rmdir();
}

/* ---- end to end ----------------------------------------------------------------------- */

static const char *const colors[8] = {"red", "blue", "green", "gold", "pink", "gray", "teal", "navy"};
static const char *const answers[8] = {"cat", "dogs", "birds", "mat", "sat", "on", "with", "The"};

static void write_text(const char *path, const char *s) {
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fputs(s, f);
    fclose(f);
}

static int run_cmd(const char *cmd) { return system(cmd); }

Test(finetune, finetune_teaches_a_from_scratch_model_and_resumes_exactly, .timeout = 300) {
    th_mkdir("ft");
    char path[600], cmd[3000], text[400], sft[400];
    /* the "pretraining" corpus and a from-scratch checkpoint */
    snprintf(text, sizeof text, "%s/text.txt", th_dir);
    FILE *f = fopen(text, "w");
    struct toy_rng r;
    toy_rng_seed(&r, 1);
    for (int i = 0; i < 400; i++)
        fprintf(f, "The %s cat sat on the mat with %d dogs and %d birds.\n", colors[toy_rng_below(&r, 8)],
                (int)toy_rng_below(&r, 10), (int)toy_rng_below(&r, 10));
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s train --data '%s' --preset tiny --steps 100 --ctx 64 --batch 8 --vocab-size 300 "
             "--eval-every 0 --out '%s/base' --json > /dev/null 2>&1", toy_bin(), text, th_dir);
    cr_assert_eq(run_cmd(cmd), 0, "%s", cmd);
    /* a synthetic instruction set: "The <color>" -> " <word>" */
    snprintf(sft, sizeof sft, "%s/sft.jsonl", th_dir);
    f = fopen(sft, "w");
    for (int i = 0; i < 200; i++) {
        int k = (int)toy_rng_below(&r, 8);
        fprintf(f, "{\"prompt\": \"The %s\", \"completion\": \" %s\"}\n", colors[k], answers[k]);
    }
    fclose(f);
    /* packed (the default): one row of 32 positions holds about 8 examples */
    const char *common = "--method lora --targets all --rank 8 --alpha 16 --lr 1e-2 --batch 1 --ctx 32 "
                         "--warmup 5 --eval-every 50 --seed 7 --threads 2 --json";
    snprintf(cmd, sizeof cmd, "%s finetune --base '%s/base/weights/latest' --data '%s' %s --epochs 10 --out '%s/ft' "
             "> '%s/ft.json' 2>/dev/null", toy_bin(), th_dir, sft, common, th_dir, th_dir);
    cr_assert_eq(run_cmd(cmd), 0, "%s", cmd);
    snprintf(path, sizeof path, "%s/ft.json", th_dir);
    json_error_t err;
    json_t *j = json_load_file(path, 0, &err);
    cr_assert(j, "%s", err.text);
    double eval = json_number_value(json_object_get(j, "eval_loss"));
    cr_assert_str_eq(json_string_value(json_object_get(j, "reason")), "completed");
    int64_t steps = json_integer_value(json_object_get(j, "steps"));
    double pack_eff = json_number_value(json_object_get(j, "pack_efficiency"));
    json_decref(j);
    /* the held-out loss at the first evaluation vs the end, from the events */
    snprintf(path, sizeof path, "%s/ft/events.jsonl", th_dir);
    f = fopen(path, "r");
    char line[4096];
    double first_loss = NAN;
    int n_eval = 0, n_step = 0;
    while (fgets(line, sizeof line, f)) {
        json_t *e = json_loads(line, 0, NULL);
        const char *kind = json_string_value(json_object_get(e, "kind"));
        if (kind && !strcmp(kind, "eval")) n_eval++;
        if (kind && !strcmp(kind, "step") && n_step++ == 0) first_loss = json_number_value(json_object_get(e, "loss"));
        json_decref(e);
    }
    fclose(f);
    /* 10 epochs of 180 examples: 1800 steps one example per row; packed, about 8 a step */
    cr_assert_eq(n_step, steps);
    cr_assert(n_step > 150 && n_step < 400, "%d steps", n_step);
    cr_assert(pack_eff > 0.5, "packing efficiency %g", pack_eff);
    cr_assert(n_eval >= 4);
    /* the answers, greedy, with the adapter */
    int right = 0;
    for (int k = 0; k < 8; k++) {
        snprintf(cmd, sizeof cmd, "%s generate -m '%s/base/weights/latest' --lora '%s/ft/weights/latest' -p 'The %s' "
                 "-n 3 --temp 0 2>/dev/null", toy_bin(), th_dir, th_dir, colors[k]);
        FILE *p = popen(cmd, "r");
        char out[256] = "";
        size_t got = fread(out, 1, sizeof out - 1, p);
        out[got] = 0;
        pclose(p);
        char want[64];
        snprintf(want, sizeof want, "The %s %s", colors[k], answers[k]);
        right += !strncmp(out, want, strlen(want));
    }
    fprintf(stderr, "finetune: LoRA on a from-scratch model: loss %.3f (step 1) -> held-out %.3f, %d/8 answers right "
            "(%d packed steps, %.0f%% of positions example tokens)\n", first_loss, eval, right, n_step, 100 * pack_eff);
    cr_assert(eval < 0.5 * first_loss, "loss %g (step 1) -> held-out %g", first_loss, eval);
    cr_assert_geq(right, 7, "%d/8 answers right", right);

    /* resume: a 24-step run checkpointed at 12; resuming from step 12 ends
     * with the same adapter, to the bit (dropout on, so its generator too) */
    const char *rs = "--method lora --targets q,v --rank 4 --lr 5e-3 --batch 4 --ctx 32 --dropout 0.1 --seed 3 "
                     "--eval-every 0 --heldout 0.1 --threads 2 --json";
    snprintf(cmd, sizeof cmd, "%s finetune --base '%s/base/weights/latest' --data '%s' %s --steps 24 --ckpt-every 12 "
             "--out '%s/run' > /dev/null 2>&1 && cd '%s/run/weights' && mv step_24.gguf straight.gguf && "
             "rm step_24.state.gguf && ln -sfn step_12.gguf latest && cd - > /dev/null && "
             "%s finetune --resume '%s/run' --json > /dev/null 2>&1",
             toy_bin(), th_dir, sft, rs, th_dir, th_dir, toy_bin(), th_dir);
    cr_assert_eq(run_cmd(cmd), 0, "%s", cmd);
    char a1[700], a2[700];
    snprintf(a1, sizeof a1, "%s/run/weights/straight.gguf", th_dir);
    snprintf(a2, sizeof a2, "%s/run/weights/step_24.gguf", th_dir);
    cr_assert(th_files_equal(a1, a2), "resumed adapter differs from the uninterrupted one");
    th_rmdir();
}

/* ---- QLoRA memory ------------------------------------------------------------------------ */

static long peak_rss_kb(const char *cmd, char *out, size_t out_size) {
    int pipefd[2];
    cr_assert_eq(pipe(pipefd), 0);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(pipefd[1], 1);
        close(pipefd[0]);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    close(pipefd[1]);
    size_t n = 0;
    ssize_t got;
    while (n + 1 < out_size && (got = read(pipefd[0], out + n, out_size - 1 - n)) > 0) n += (size_t)got;
    out[n] = 0;
    close(pipefd[0]);
    int status;
    struct rusage ru;
    cr_assert_eq(wait4(pid, &status, 0, &ru), pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s failed: %s", cmd, out);
    return ru.ru_maxrss; /* of the shell's child too: sh execs the last command */
}

Test(finetune, qlora_q4_0_resident_memory_is_bounded, .timeout = 300) {
    th_mkdir("ft");
    struct toy_tokenizer *tok = small_tokenizer();
    struct toy_llama_config c = toy_llama_preset("smollm2-135m");
    c.max_ctx = 256;
    char f32[400], q4[400], sft[400];
    snprintf(f32, sizeof f32, "%s/smollm2-shape.gguf", th_dir);
    snprintf(q4, sizeof q4, "%s/smollm2-shape-q4_0.gguf", th_dir);
    snprintf(sft, sizeof sft, "%s/sft.jsonl", th_dir);
    pid_t pid = fork(); /* the f32 model lives in a child, so this process stays small */
    if (pid == 0) {
        struct toy_llama *m = toy_llama_new(&c, 1);
        struct toy_gguf_writer *w;
        int bad = !m || toy_gguf_writer_init(&w) || toy_llama_write_gguf(m, w, TOY_F32) ||
                  toy_tokenizer_write_gguf(tok, w) || toy_gguf_writer_write(w, f32);
        _exit(bad ? 1 : toy_gguf_quantize(f32, q4, TOY_Q4_0, NULL, NULL) ? 2 : 0);
    }
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "making the SmolLM2-shape base failed");
    write_text(sft, "{\"prompt\": \"The red cat sat on\", \"completion\": \" the mat.\"}\n"
                    "{\"prompt\": \"Q: what color?\", \"completion\": \" A: red.\"}\n");
    struct stat sq, sf;
    cr_assert_eq(stat(q4, &sq), 0);
    cr_assert_eq(stat(f32, &sf), 0);
    char cmd[2000], out[4096];
    snprintf(cmd, sizeof cmd, "exec %s finetune --base '%s' --data '%s' --method qlora --rank 8 --targets q,v --batch 2 "
             "--ctx 64 --steps 2 --heldout 0 --eval-every 0 --threads 2 --out '%s/run' --json 2>/dev/null",
             toy_bin(), q4, sft, th_dir);
    long kb = peak_rss_kb(cmd, out, sizeof out);
    json_t *j = json_loads(out, 0, NULL);
    cr_assert(j, "no JSON from: %s", out);
    cr_assert_str_eq(json_string_value(json_object_get(j, "reason")), "completed");
    double act = (double)json_integer_value(json_object_get(j, "activation_bytes"));
    double tr = (double)json_integer_value(json_object_get(j, "trainable_bytes"));
    json_decref(j);
    double rss = (double)kb * 1024, slack = 64.0 * 1024 * 1024;
    double bound = (double)sq.st_size + act + tr + slack;
    fprintf(stderr, "finetune: QLoRA Q4_0 SmolLM2-135M shape: peak RSS %.0f MB <= file %.0f MB + activations %.0f MB "
            "+ adapter state %.1f MB + 64 MB (F32 file: %.0f MB)\n", rss / 1048576, (double)sq.st_size / 1048576,
            act / 1048576, tr / 1048576, (double)sf.st_size / 1048576);
#if defined(__SANITIZE_ADDRESS__)
    bound *= 1.5; /* ASan's shadow memory and redzones */
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
    bound *= 1.5;
#endif
#endif
    cr_assert(rss <= bound, "peak RSS %.0f MB > bound %.0f MB", rss / 1048576, bound / 1048576);
    cr_assert(rss < (double)sf.st_size, "peak RSS %.0f MB is not below the F32 base (%.0f MB)", rss / 1048576,
              (double)sf.st_size / 1048576);
    toy_tokenizer_free(tok);
    th_rmdir();
}

/* ---- warm start ---------------------------------------------------------------------------- */

Test(finetune, warm_start_copies_or_projects_the_donor_embeddings, .timeout = 120) {
    th_mkdir("ft");
    struct toy_tokenizer *tok = small_tokenizer();
    const int64_t V = toy_tokenizer_n_vocab(tok), R = 12;
    struct toy_llama_config c = small_config();
    c.vocab = V;
    struct toy_llama *donor = toy_llama_new(&c, 5);
    /* donor embeddings of rank R (plus a mean): a projection to 32 dims keeps their geometry */
    struct toy_rng r;
    toy_rng_seed(&r, 2);
    float U[300 * 12], W[12 * 64];
    cr_assert(V <= 300);
    for (int i = 0; i < V * R; i++) U[i] = toy_rng_normal(&r);
    for (int i = 0; i < R * 64; i++) W[i] = 0.1f * toy_rng_normal(&r);
    float *de = donor->tok_embd->data;
    for (int64_t i = 0; i < V; i++)
        for (int j = 0; j < 64; j++) {
            double s = 0.05;
            for (int k = 0; k < R; k++) s += U[i * R + k] * W[k * 64 + j];
            de[i * 64 + j] = (float)s;
        }
    char path[400];
    snprintf(path, sizeof path, "%s/donor.gguf", th_dir);
    struct toy_gguf_writer *w;
    cr_assert_eq(toy_gguf_writer_init(&w), TOY_OK);
    cr_assert_eq(toy_llama_write_gguf(donor, w, TOY_F32), TOY_OK);
    cr_assert_eq(toy_tokenizer_write_gguf(tok, w), TOY_OK);
    cr_assert_eq(toy_gguf_writer_write(w, path), TOY_OK, "%s", toy_last_error());
    toy_gguf_writer_free(w);
    /* same width, 3 more tokens than the tokenizer: rows copied, the extra ones untouched */
    struct toy_llama_config c1 = c;
    c1.vocab = V + 3;
    struct toy_llama *m = toy_llama_new(&c1, 9);
    float extra = ((float *)m->tok_embd->data)[V * 64 + 5];
    struct toy_warm_start_report rep;
    cr_assert_eq(toy_llama_warm_start(m, tok, path, &rep), TOY_OK, "%s", toy_last_error());
    cr_assert_eq(rep.mapped, V);
    cr_assert_eq(rep.unmapped, 3);
    cr_assert(!rep.projected);
    cr_assert(!memcmp(m->tok_embd->data, de, (size_t)(V * 64) * sizeof(float)));
    cr_assert_eq(((float *)m->tok_embd->data)[V * 64 + 5], extra);
    toy_llama_free(m);
    /* half the width: the donor's principal directions keep every inner product (up to one scale) */
    struct toy_llama_config c2 = c;
    c2.d_model = 32;
    c2.n_heads = 2;
    c2.n_kv_heads = 1;
    m = toy_llama_new(&c2, 9);
    cr_assert_eq(toy_llama_warm_start(m, tok, path, &rep), TOY_OK, "%s", toy_last_error());
    cr_assert(rep.projected && rep.mapped == V && rep.donor_d == 64 && rep.model_d == 32);
    cr_assert(rep.explained > 0.999, "explained %g", rep.explained);
    double mean[64] = {0};
    for (int64_t i = 0; i < V; i++)
        for (int j = 0; j < 64; j++) mean[j] += de[i * 64 + j] / (double)V;
    /* the table the model uses: a learned projection starting at the PCA */
    cr_assert(rep.learned && m->embd_proj && m->embd_proj->ne[0] == 32 && m->embd_proj->ne[1] == 64);
    float *pe = malloc((size_t)(V * 32) * sizeof *pe);
    toy_llama_embd_table(m, pe);
    double s2 = 0, n2 = 0, worst = 0, gmax = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int64_t a = 0; a < V; a += 7)
            for (int64_t b = 0; b < V; b += 5) {
                double gd = 0, gp = 0;
                for (int j = 0; j < 64; j++) gd += (de[a * 64 + j] - mean[j]) * (de[b * 64 + j] - mean[j]);
                for (int j = 0; j < 32; j++) gp += (double)pe[a * 32 + j] * pe[b * 32 + j];
                if (pass == 0) { s2 += gp * gd; n2 += gd * gd; gmax = fmax(gmax, fabs(gd)); }
                else worst = fmax(worst, fabs(gp - (s2 / n2) * gd));
            }
    cr_assert(worst <= 1e-3 * (s2 / n2) * gmax, "Gram matrix off by %g (max %g)", worst, (s2 / n2) * gmax);
    /* folded, token_embd is that table */
    toy_llama_embd_proj_fold(m);
    cr_assert(!m->embd_proj);
    for (int64_t i = 0; i < V * 32; i++) cr_assert_float_eq(((float *)m->tok_embd->data)[i], pe[i], 1e-6);
    free(pe);
    toy_llama_free(m);
    toy_llama_free(donor);
    toy_tokenizer_free(tok);
    th_rmdir();
}

Test(finetune, full_finetune_checkpoints_the_model_and_qlora_needs_a_quantized_base, .timeout = 120) {
    th_mkdir("ft");
    struct toy_tokenizer *tok = small_tokenizer();
    struct toy_llama_config c = small_config();
    c.vocab = toy_tokenizer_n_vocab(tok);
    char base[400], sft[400], cmd[2000], path[700];
    snprintf(base, sizeof base, "%s/base.gguf", th_dir);
    snprintf(sft, sizeof sft, "%s/sft.jsonl", th_dir);
    struct toy_llama *m = toy_llama_new(&c, 4);
    struct toy_gguf_writer *w;
    cr_assert_eq(toy_gguf_writer_init(&w), TOY_OK);
    cr_assert_eq(toy_llama_write_gguf(m, w, TOY_F32), TOY_OK);
    cr_assert_eq(toy_tokenizer_write_gguf(tok, w), TOY_OK);
    cr_assert_eq(toy_gguf_writer_write(w, base), TOY_OK);
    toy_gguf_writer_free(w);
    write_text(sft, "{\"prompt\": \"The red\", \"completion\": \" cat sat\"}\n"
                    "{\"messages\": [{\"role\": \"user\", \"content\": \"Q: what color?\"}, "
                    "{\"role\": \"assistant\", \"content\": \"red\"}]}\n");
    snprintf(cmd, sizeof cmd, "%s finetune --base '%s' --data '%s' --method full --freeze-embeddings --steps 6 "
             "--batch 2 --ctx 64 --lr 1e-2 --heldout 0 --threads 2 --out '%s/full' --json > /dev/null 2>&1",
             toy_bin(), base, sft, th_dir);
    cr_assert_eq(run_cmd(cmd), 0, "%s", cmd);
    /* the checkpoint is a whole model with the tokenizer; frozen embeddings did not move, the rest did */
    snprintf(path, sizeof path, "%s/full/weights/latest", th_dir);
    struct toy_llama *ft;
    cr_assert_eq(toy_llama_load(path, false, &ft), TOY_OK, "%s", toy_last_error());
    struct toy_tokenizer *t2;
    cr_assert_eq(toy_tokenizer_load_gguf(ft->gguf, &t2), TOY_OK);
    toy_tokenizer_free(t2);
    cr_assert(!memcmp(ft->tok_embd->data, m->tok_embd->data, (size_t)toy_nelements(m->tok_embd) * sizeof(float)));
    cr_assert(memcmp(ft->layers[0].wq->data, m->layers[0].wq->data, (size_t)toy_nelements(m->layers[0].wq) * sizeof(float)));
    toy_llama_free(ft);
    toy_llama_free(m);
    /* qlora over an F32 base is refused with the way out */
    snprintf(cmd, sizeof cmd, "%s finetune --base '%s' --data '%s' --method qlora --steps 1 --batch 2 --ctx 64 "
             "--heldout 0 --out '%s/q' 2>&1", toy_bin(), base, sft, th_dir);
    FILE *p = popen(cmd, "r");
    char out[2048] = "";
    size_t got = fread(out, 1, sizeof out - 1, p);
    out[got] = 0;
    cr_assert_neq(pclose(p), 0);
    cr_assert(strstr(out, "toy quantize"), "%s", out);
    toy_tokenizer_free(tok);
    th_rmdir();
}

/* ---- merge: adapters as llama.cpp writes them, and what is wrong with broken ones ---------------- */

enum { AD_F16 = 1, AD_NO_ALPHA = 2, AD_TRANSPOSE_A = 4, AD_DROP_B = 8 };

/* a copy of the toy-written adapter src, changed as flags say */
static void rewrite_adapter(const char *src, const char *dst, int flags) {
    struct toy_gguf *g;
    struct toy_gguf_writer *w;
    cr_assert_eq(toy_gguf_open(src, &g), TOY_OK);
    cr_assert_eq(toy_gguf_writer_init(&w), TOY_OK);
    for (int64_t i = 0; i < toy_gguf_n_kv(g); i++)
        if (!(flags & AD_NO_ALPHA) || strcmp(toy_gguf_kv_key(g, i), "adapter.lora.alpha"))
            cr_assert_eq(toy_gguf_writer_copy_kv(w, g, i), TOY_OK);
    void *bufs[64];
    int nb = 0;
    for (int64_t i = 0; i < toy_gguf_n_tensors(g); i++) {
        const struct toy_gguf_tensor *t = toy_gguf_tensor(g, i);
        bool is_a = strstr(t->name, ".lora_a") != NULL;
        if ((flags & AD_DROP_B) && !is_a) continue;
        int64_t ne[2] = {t->ne[0], t->ne[1]};
        float *f = malloc((size_t)t->n_elements * sizeof *f);
        memcpy(f, t->data, (size_t)t->n_elements * sizeof *f);
        if ((flags & AD_TRANSPOSE_A) && is_a) { /* {in, r} -> {r, in} */
            for (int64_t r = 0; r < ne[1]; r++)
                for (int64_t c = 0; c < ne[0]; c++) f[c * ne[1] + r] = ((const float *)t->data)[r * ne[0] + c];
            ne[0] = t->ne[1], ne[1] = t->ne[0];
        }
        void *d = f;
        enum toy_dtype ty = TOY_F32;
        if (flags & AD_F16) {
            d = malloc((size_t)t->n_elements * 2);
            cr_assert_eq(toy_quantize_row(TOY_F16, f, d, t->n_elements), TOY_OK);
            free(f);
            ty = TOY_F16;
        }
        cr_assert(nb < 64);
        bufs[nb++] = d;
        cr_assert_eq(toy_gguf_writer_add_tensor(w, t->name, ty, 2, ne, d), TOY_OK);
    }
    cr_assert_eq(toy_gguf_writer_write(w, dst), TOY_OK, "%s", toy_last_error());
    toy_gguf_writer_free(w);
    for (int i = 0; i < nb; i++) free(bufs[i]);
    toy_gguf_close(g);
}

static float *read_weight(const char *path, const char *name, int64_t *n) {
    struct toy_gguf *g;
    cr_assert_eq(toy_gguf_open(path, &g), TOY_OK, "%s", toy_last_error());
    int64_t i = toy_gguf_find_tensor(g, name);
    cr_assert(i >= 0);
    *n = toy_gguf_tensor(g, i)->n_elements;
    float *f = malloc((size_t)*n * sizeof *f);
    cr_assert_eq(toy_gguf_tensor_read_f32(g, i, f, *n), TOY_OK);
    toy_gguf_close(g);
    return f;
}

/* An f16 pair (llama.cpp's converter's usual type) got "does not fit {64, 64} (wrong base model?)"; it
 * merges (and loads) now, widened to f32. A transposed lora_a is called transposed, a lora_a without its
 * lora_b says so, and a missing adapter.lora.alpha means alpha = rank (scale 1), as llama.cpp reads it. */
Test(finetune, merge_reads_f16_pairs_and_names_what_is_wrong, .timeout = 120) {
    th_mkdir("ftm");
    struct toy_llama_config c = small_config();
    char base[400], ad[400], f16[400], bad[400], out[400], ref[400];
    snprintf(base, sizeof base, "%s/base.gguf", th_dir);
    snprintf(ad, sizeof ad, "%s/adapter.gguf", th_dir);
    snprintf(f16, sizeof f16, "%s/adapter-f16.gguf", th_dir);
    snprintf(bad, sizeof bad, "%s/bad.gguf", th_dir);
    snprintf(out, sizeof out, "%s/out.gguf", th_dir);
    snprintf(ref, sizeof ref, "%s/ref.gguf", th_dir);
    make_base(base, &c, 8);
    struct toy_llama *m;
    cr_assert_eq(toy_llama_load(base, false, &m), TOY_OK);
    struct toy_lora *a;
    /* alpha = rank: scale 1, the same as an absent alpha */
    struct toy_lora_opts o = {.rank = 4, .alpha = 4, .targets = 1u << TOY_LORA_Q, .seed = 5};
    cr_assert_eq(toy_lora_attach(m, &o, &a), TOY_OK);
    randomize_b(a, 3, 0.3f);
    cr_assert_eq(toy_lora_save(a, ad), TOY_OK);
    toy_lora_free(a);
    toy_llama_free(m);
    cr_assert_eq(toy_lora_merge_file(base, ad, 1.0f, ref), TOY_OK, "%s", toy_last_error());
    int64_t n;
    float *w0 = read_weight(base, "blk.0.attn_q.weight", &n), *w32 = read_weight(ref, "blk.0.attn_q.weight", &n);
    double moved = 0;
    for (int64_t i = 0; i < n; i++) moved = fmax(moved, fabs(w32[i] - w0[i]));
    cr_assert(moved > 1e-3, "the adapter does not move the weight (%g)", moved);

    rewrite_adapter(ad, f16, AD_F16);
    cr_assert_eq(toy_lora_merge_file(base, f16, 1.0f, out), TOY_OK, "%s", toy_last_error());
    float *w16 = read_weight(out, "blk.0.attn_q.weight", &n);
    double worst = 0;
    for (int64_t i = 0; i < n; i++) worst = fmax(worst, fabs(w16[i] - w32[i]));
    cr_expect(worst <= 5e-3 * moved, "f16 pair merged %g off (the adapter moves %g)", worst, moved);
    free(w16);
    cr_assert_eq(toy_llama_load(base, true, &m), TOY_OK);
    cr_expect_eq(toy_lora_load(m, f16, 1.0f, false, &a), TOY_OK, "%s", toy_last_error());
    toy_lora_free(a);

    rewrite_adapter(ad, bad, AD_NO_ALPHA);
    cr_assert_eq(toy_lora_merge_file(base, bad, 1.0f, out), TOY_OK, "%s", toy_last_error());
    float *wn = read_weight(out, "blk.0.attn_q.weight", &n);
    for (int64_t i = 0; i < n; i++) cr_assert(fabs(wn[i] - w32[i]) <= 1e-6f * (1 + fabsf(w32[i])), "no alpha: not scale 1");
    free(wn);
    cr_expect_eq(toy_lora_load(m, bad, 1.0f, false, &a), TOY_OK, "%s", toy_last_error());
    toy_lora_free(a);

    rewrite_adapter(ad, bad, AD_TRANSPOSE_A);
    cr_expect_neq(toy_lora_merge_file(base, bad, 1.0f, out), TOY_OK);
    cr_expect(strstr(toy_last_error(), "lora_a is {4, 64}: transposed"), "%s", toy_last_error());
    cr_expect_neq(toy_lora_load(m, bad, 1.0f, false, &a), TOY_OK);
    cr_expect(strstr(toy_last_error(), "transposed"), "%s", toy_last_error());

    rewrite_adapter(ad, bad, AD_DROP_B);
    cr_expect_neq(toy_lora_merge_file(base, bad, 1.0f, out), TOY_OK);
    cr_expect(strstr(toy_last_error(), "blk.0.attn_q.weight.lora_a has no blk.0.attn_q.weight.lora_b"), "%s",
              toy_last_error());
    toy_llama_free(m);
    free(w0);
    free(w32);
    th_rmdir();
}
