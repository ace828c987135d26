/* test-gpt2.c: GPT-2 (src/models/gpt2.c, gpt2-gguf.c, src/infer/
 * generate-gpt2.c) against a PyTorch reference written in the tests
 * (tests/torch/ref_gpt2.py, float64), through GGUF files toy writes:
 *  - logits of a tied and an untied model, loaded back mapped, within
 *    1e-4 (1 + |ref|);
 *  - 20 AdamW training steps from the same init and batches: losses within
 *    1e-4 (1 + |ref|);
 *  - KV-cache decode logits equal the full-sequence forward at every position;
 *  - a tiny GPT-2 trained through the generic trainer (toy_trainer_new_lm) on
 *    TinyShakespeare beats the unigram baseline on held-out text, its
 *    checkpoint loads back, and it generates text with the KV cache;
 *  - a Hugging Face GPT-2 folder through `toy convert` (f32 and q8_0) loads
 *    and matches the reference;
 *  - `toy train --arch gpt2`, `toy generate` and `toy eval` on its
 *    checkpoint, `--resume`; training with GPT-2's own tokenizer. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "toy/convert.h"
#include "toy/gguf.h"
#include "toy/gpt2.h"
#include "toy/toy.h"
#include "harness.h"
#include "toy/trainer.h"

static struct toy_gpt2_config base_config(void) {
    struct toy_gpt2_config c = toy_gpt2_preset("tiny");
    c.vocab = 61;
    c.d_model = 48;
    c.n_heads = 4;
    c.d_ff = 96;
    c.n_layers = 2;
    c.max_ctx = 32;
    return c;
}

/* random init, larger weights, and every LayerNorm and bias perturbed so none is trivial */
static struct toy_gpt2 *random_model(const struct toy_gpt2_config *c, bool tied, uint64_t seed) {
    struct toy_gpt2 *m = toy_gpt2_new(c, seed);
    cr_assert(m, "%s", toy_last_error());
    if (!tied) { /* an untied head: its own tensor */
        struct toy_tensor *o = toy_set_name(toy_new_tensor_2d(m->ctx, TOY_F32, c->d_model, c->vocab), "output.weight");
        toy_set_param(o);
        m->output = o;
        m->tied = false;
    }
    struct toy_rng r;
    toy_rng_seed(&r, seed + 99);
    for (int i = 0; i < toy_gpt2_n_tensors(m); i++) {
        struct toy_tensor *t = toy_gpt2_tensor(m, i);
        float *d = t->data;
        if (t->ne[1] > 1) {
            for (int64_t k = 0; k < toy_nelements(t); k++) d[k] = (t == m->output && !tied ? 0.02f * toy_rng_normal(&r) : d[k]) * 8.0f;
            continue;
        }
        bool bias = strstr(t->name, ".bias") != NULL;
        for (int64_t k = 0; k < toy_nelements(t); k++) d[k] = (bias ? 0.0f : 1.0f) + 0.2f * toy_rng_normal(&r);
    }
    return m;
}

static void save(struct toy_gpt2 *m, const char *path) {
    struct toy_gguf_writer *w;
    cr_assert_eq(toy_gguf_writer_init(&w), TOY_OK);
    cr_assert_eq(toy_gpt2_write_gguf(m, w, TOY_F32), TOY_OK, "%s", toy_last_error());
    cr_assert_eq(toy_gguf_writer_write(w, path), TOY_OK, "%s", toy_last_error());
    toy_gguf_writer_free(w);
}

/* a random untied model whose rows are whole 32-element blocks (so that it
 * quantizes), saved in f32 as th_dir/name (path: its path); its config */
static struct toy_gpt2_config saved_model(const char *name, uint64_t seed, char *path, size_t n) {
    struct toy_gpt2_config c = base_config();
    c.d_model = 64;
    c.d_ff = 128;
    th_mkdir("gpt2");
    snprintf(path, n, "%s/%s", th_dir, name);
    struct toy_gpt2 *r = random_model(&c, false, seed);
    save(r, path);
    toy_gpt2_free(r);
    return c;
}

/* path: the f32 file itself, or its copy quantized to type */
static void typed_copy(const char *f32, enum toy_dtype type, char *path, size_t n) {
    if (type == TOY_F32) { snprintf(path, n, "%s", f32); return; }
    snprintf(path, n, "%s.%s.gguf", f32, toy_dtype_name(type));
    cr_assert_eq(toy_gguf_quantize(f32, path, type, NULL, NULL), TOY_OK, "%s", toy_last_error());
}

static struct toy_tensor *fwd(struct toy_ctx *ctx, void *m, struct toy_tensor *tok, struct toy_tensor *pos) {
    return toy_gpt2_forward(ctx, m, tok, pos);
}

static struct toy_tensor *cfwd(struct toy_ctx *ctx, void *m, struct toy_kv_cache *kv, struct toy_tensor *tok,
                                struct toy_tensor *pos) {
    return toy_gpt2_forward_cached(ctx, m, kv, tok, pos);
}

/* runs cmd (a toy command printing JSON) with its output into th_dir/out.json,
 * which must succeed; returns the document */
static json_t *cli_json(const char *cmd) {
    char line[4096];
    snprintf(line, sizeof line, "%s > '%s/out.json'", cmd, th_dir);
    cr_assert_eq(system(line), 0, "%s", line);
    snprintf(line, sizeof line, "%s/out.json", th_dir);
    json_error_t err;
    json_t *j = json_load_file(line, 0, &err);
    cr_assert(j, "%s: %s", cmd, err.text);
    return j;
}

Test(gpt2, logits_match_pytorch_tied_and_untied, .timeout = 300) {
    th_mkdir("gpt2");
    const int T = 11, B = 2;
    int32_t tokens[T * B];
    for (int i = 0; i < T * B; i++) tokens[i] = (i * 37 + 5) % 61;
    json_t *specs = json_array();
    float *ours[2];
    for (int i = 0; i < 2; i++) {
        struct toy_gpt2_config c = base_config();
        struct toy_gpt2 *m = random_model(&c, i == 0, 100 + (uint64_t)i);
        char path[400];
        snprintf(path, sizeof path, "%s/%d.gguf", th_dir, i);
        save(m, path);
        toy_gpt2_free(m);
        struct toy_gpt2 *lm;
        cr_assert_eq(toy_gpt2_load(path, false, &lm), TOY_OK, "%s", toy_last_error());
        cr_assert_eq(lm->tied, i == 0);
        cr_assert_eq(lm->cfg.d_model, c.d_model);
        cr_assert_eq(lm->cfg.max_ctx, c.max_ctx);
        ours[i] = th_logits(fwd, lm, tokens, T, B);
        toy_gpt2_free(lm);
        json_t *tk = json_array();
        for (int b = 0; b < B; b++) {
            json_t *row = json_array();
            for (int t = 0; t < T; t++) json_array_append_new(row, json_integer(tokens[b * T + t]));
            json_array_append_new(tk, row);
        }
        json_array_append_new(specs, json_pack("{s:s,s:o}", "gguf", path, "tokens", tk));
    }
    json_t *res = th_torch("ref_gpt2.py", specs);
    for (int i = 0; i < 2; i++) {
        json_t *ref = json_object_get(json_array_get(json_object_get(res, "cases"), (size_t)i), "logits");
        cr_assert_eq(json_array_size(ref), (size_t)(T * B * 61));
        double worst = 0;
        for (size_t k = 0; k < json_array_size(ref); k++) {
            double r = json_number_value(json_array_get(ref, k));
            double e = fabs(ours[i][k] - r) / (1 + fabs(r));
            if (!(e <= worst)) worst = e;
        }
        cr_log_info("gpt2 %s: max |toy - torch| / (1 + |torch|) = %.2e", i ? "untied" : "tied", worst);
        cr_assert_leq(worst, 1e-4);
        free(ours[i]);
    }
    json_decref(res);
    th_rmdir();
}

Test(gpt2, training_steps_match_pytorch, .timeout = 300) {
    th_mkdir("gpt2");
    struct toy_gpt2_config c = base_config();
    struct toy_gpt2 *m0 = random_model(&c, true, 7);
    char path[400];
    snprintf(path, sizeof path, "%s/train.gguf", th_dir);
    save(m0, path);
    toy_gpt2_free(m0);
    struct toy_gpt2 *m;
    cr_assert_eq(toy_gpt2_load(path, true, &m), TOY_OK, "%s", toy_last_error());
    cr_assert(m->tied);
    th_train_vs_torch(toy_gpt2_lm(m), "ref_gpt2.py", path, 16, 3, 20);
    toy_gpt2_free(m);
    th_rmdir();
}

/* Prefill 5 tokens, then decode one at a time: every position's logits
 * equal the full-sequence forward's; with an f16 cache, within its
 * rounding (and not exactly: the keys and values are rounded). */
Test(gpt2, kv_cache_decode_equals_full_forward) {
    struct toy_gpt2_config c = base_config();
    struct toy_gpt2 *m = random_model(&c, true, 21);
    const int T = 14, P = 5;
    int32_t tokens[T];
    for (int i = 0; i < T; i++) tokens[i] = (i * 13 + 2) % 61;
    float *full = th_logits(fwd, m, tokens, T, 1);
    for (int f16 = 0; f16 < 2; f16++) {
        struct toy_kv_cache kv;
        cr_assert_eq(toy_gpt2_cache_init_type(&kv, m, 32, 1, f16 ? TOY_F16 : TOY_F32), TOY_OK);
        cr_assert_eq(kv.k[0]->type, f16 ? TOY_F16 : TOY_F32);
        double worst = th_kv_decode_vs_full(cfwd, m, &kv, tokens, T, P, c.vocab, full);
        cr_log_info("gpt2: KV decode (%s cache) vs full forward: max relative difference %.2e", f16 ? "f16" : "f32",
                    worst);
        if (f16) cr_assert(worst > 0 && worst <= 5e-3, "f16 cache: %g", worst);
        else cr_assert_leq(worst, 1e-5);
        toy_kv_cache_free(&kv);
    }
    struct toy_kv_cache kv;
    cr_assert_eq(toy_gpt2_cache_init_type(&kv, m, 32, 1, TOY_Q8_0), TOY_ERR_INVALID_ARG);
    free(full);
    toy_gpt2_free(m);
}

/* Inference packs a mapped model's matrices (toy_gpt2_pack_weights, which
 * the generator calls): quantized ones into the int8 kernels' layout, float
 * ones copied from the file. The logits stay bit for bit the same, for a
 * prompt and for decoding after it, and the generator still generates. */
Test(gpt2, packed_weights_give_the_same_logits, .timeout = 300) {
    char f32[1024], path[1024];
    struct toy_gpt2_config c = saved_model("pack-f32.gguf", 31, f32, sizeof f32);
    const enum toy_dtype types[] = {TOY_F32, TOY_Q8_0, TOY_Q4_0};
    const int T = 12, P = 4;
    int32_t tokens[T];
    for (int i = 0; i < T; i++) tokens[i] = (i * 17 + 3) % 61;
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        typed_copy(f32, types[ti], path, sizeof path);
        struct toy_gpt2 *m;
        cr_assert_eq(toy_gpt2_load(path, false, &m), TOY_OK, "%s", toy_last_error());
        cr_assert_eq(m->layers[0].w_qkv->type, types[ti]);
        float *before = th_logits(fwd, m, tokens, T, 1);
        bool packable = toy_tensor_pack_bytes(m->layers[0].w_up) > 0;
        const void *file = m->layers[0].w_up->data;
        cr_assert_eq(toy_gpt2_pack_weights(m), TOY_OK, "%s", toy_last_error());
        cr_assert(m->pack_block && m->pack_bytes, "%s: nothing packed or copied", toy_dtype_name(types[ti]));
        if (types[ti] == TOY_F32) cr_assert_neq(m->layers[0].w_up->data, file, "the f32 matrix is copied");
        else cr_assert(!packable || m->layers[0].w_up->packed, "the quantized matrix is packed");
        cr_assert_eq(toy_gpt2_pack_weights(m), TOY_OK); /* again: nothing more */
        float *after = th_logits(fwd, m, tokens, T, 1);
        cr_assert_eq(memcmp(before, after, (size_t)T * c.vocab * sizeof(float)), 0, "%s: logits moved",
                     toy_dtype_name(types[ti]));
        struct toy_kv_cache kv;
        cr_assert_eq(toy_gpt2_cache_init(&kv, m, 32, 1), TOY_OK);
        double worst = th_kv_decode_vs_full(cfwd, m, &kv, tokens, T, P, c.vocab, before);
        cr_assert_leq(worst, 1e-5, "%s: decode after packing: %g", toy_dtype_name(types[ti]), worst);
        toy_kv_cache_free(&kv);
        free(before);
        free(after);
        toy_gpt2_free(m);
    }
    th_rmdir();
}

/* toy quantize's k-quants (q2_k and q3_k too), iq4 types and mxfp4 on a
 * model whose rows fit their 256-element super-blocks: the file holds the type
 * asked, its logits
 * stay near the f32 model's (closer the more bits), and packing the
 * matrices for the int8 kernels moves them by the activations' q8 rounding
 * only (the same products dequantized before). */
Test(gpt2, kquant_files_stay_near_the_f32_model_and_pack, .timeout = 300) {
    struct toy_gpt2_config c = base_config();
    c.d_model = 256;
    c.d_ff = 512;
    th_mkdir("gpt2-kq");
    char f32[1024], path[1024];
    snprintf(f32, sizeof f32, "%s/kq-f32.gguf", th_dir);
    struct toy_gpt2 *r = random_model(&c, false, 61);
    save(r, f32);
    toy_gpt2_free(r);
    /* relative RMS from the f32 logits, measured 0.73, 0.51, 0.27, 0.053 (this model's weights are
     * larger than trained ones'); logits of no relation to them would be ~1.4 */
    const enum toy_dtype types[] = {TOY_Q2_K, TOY_Q3_K, TOY_Q4_K, TOY_Q6_K, TOY_IQ4_NL, TOY_IQ4_XS, TOY_MXFP4};
    /* the iq4 types: about q4_k's; mxfp4 (measured 0.37, its scales powers of two) between q3_k's and q4_k's */
    const double bound[] = {0.9, 0.65, 0.35, 0.08, 0.35, 0.35, 0.45};
    const int T = 8;
    int32_t tokens[T];
    for (int i = 0; i < T; i++) tokens[i] = (i * 13 + 5) % 61;
    struct toy_gpt2 *m0;
    cr_assert_eq(toy_gpt2_load(f32, false, &m0), TOY_OK, "%s", toy_last_error());
    float *ref = th_logits(fwd, m0, tokens, T, 1);
    toy_gpt2_free(m0);
    size_t n = (size_t)T * c.vocab;
    double last = INFINITY;
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        typed_copy(f32, types[ti], path, sizeof path);
        struct toy_gpt2 *m;
        cr_assert_eq(toy_gpt2_load(path, false, &m), TOY_OK, "%s", toy_last_error());
        cr_assert_eq(m->layers[0].w_up->type, types[ti], "%s", toy_dtype_name(m->layers[0].w_up->type));
        float *deq = th_logits(fwd, m, tokens, T, 1);
        cr_assert_eq(toy_gpt2_pack_weights(m), TOY_OK, "%s", toy_last_error());
        cr_assert_not_null(m->layers[0].w_up->packed);
        float *packed = th_logits(fwd, m, tokens, T, 1);
        double e = 0, e_pack = 0, s = 0;
        for (size_t i = 0; i < n; i++) {
            e += ((double)deq[i] - ref[i]) * ((double)deq[i] - ref[i]);
            e_pack += ((double)packed[i] - deq[i]) * ((double)packed[i] - deq[i]);
            s += (double)ref[i] * ref[i];
        }
        e = sqrt(e / s), e_pack = sqrt(e_pack / s);
        cr_log_info("%s: logits %.4f from the f32 model's, packed %.4f from the dequantized", toy_dtype_name(types[ti]),
                    e, e_pack);
        cr_expect_lt(e, bound[ti], "%s: logits %.3g (relative RMS) from the f32 model's", toy_dtype_name(types[ti]), e);
        if (ti < 4) cr_expect_lt(e, last, "%s: %.3g, no closer than fewer bits (%.3g)", toy_dtype_name(types[ti]), e, last);
        cr_expect_lt(e_pack, 0.03, "%s: packed %.3g from the dequantized product", toy_dtype_name(types[ti]), e_pack);
        last = e;
        free(deq);
        free(packed);
        toy_gpt2_free(m);
    }
    free(ref);
    th_rmdir();
}

/* A model written straight to a quantized type (write_gguf quantizes its
 * matrices as it writes: bench-cuda's decode files) says so as llama.cpp
 * reads it: general.file_type for the type, general.quantization_version
 * for quantized ones; and it loads with matrices of that type, both
 * families. Before, every such file claimed to be all f32. */
Test(gpt2, models_written_quantized_name_their_file_type) {
    th_mkdir("gpt2-ftype");
    struct toy_gpt2_config gc = base_config();
    gc.d_model = 64;
    gc.d_ff = 128;
    struct toy_gpt2 *g = random_model(&gc, false, 3);
    struct toy_llama_config lc = toy_llama_preset("tiny");
    lc.vocab = 61;
    lc.d_model = 64;
    lc.d_ff = 128;
    struct toy_llama *l = toy_llama_new(&lc, 3);
    cr_assert(g && l, "%s", toy_last_error());
    struct toy_lm lms[2] = {toy_gpt2_lm(g), toy_llama_lm(l)};
    const enum toy_dtype types[] = {TOY_F32, TOY_F16, TOY_BF16, TOY_Q8_0, TOY_Q4_0};
    for (int f = 0; f < 2; f++)
        for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
            char path[512];
            snprintf(path, sizeof path, "%s/%s-%s.gguf", th_dir, lms[f].arch, toy_dtype_name(types[i]));
            th_save_lm(&lms[f], types[i], path);
            struct toy_gguf *gg;
            cr_assert_eq(toy_gguf_open(path, &gg), TOY_OK, "%s", toy_last_error());
            uint32_t ft = UINT32_MAX, qv = 0;
            cr_expect_eq(toy_gguf_get_u32(gg, "general.file_type", &ft), TOY_OK);
            cr_expect_eq(ft, toy_file_type_for(types[i]), "%s %s: file type %u", lms[f].arch, toy_dtype_name(types[i]),
                         ft);
            bool quant = toy_dtype_info(types[i])->quantized;
            cr_expect_eq(toy_gguf_get_u32(gg, "general.quantization_version", &qv) == TOY_OK, quant, "%s %s",
                         lms[f].arch, toy_dtype_name(types[i]));
            cr_expect_eq(qv, quant ? 2u : 0u);
            toy_gguf_close(gg);
            enum toy_dtype got;
            if (f == 0) {
                struct toy_gpt2 *m;
                cr_assert_eq(toy_gpt2_load(path, false, &m), TOY_OK, "%s", toy_last_error());
                got = m->layers[0].w_up->type;
                toy_gpt2_free(m);
            } else {
                struct toy_llama *m;
                cr_assert_eq(toy_llama_load(path, false, &m), TOY_OK, "%s", toy_last_error());
                got = m->layers[0].w_up->type;
                toy_llama_free(m);
            }
            cr_expect_eq(got, types[i], "%s: %s matrices, not %s", lms[f].arch, toy_dtype_name(got),
                         toy_dtype_name(types[i]));
        }
    toy_gpt2_free(g);
    toy_llama_free(l);
    th_rmdir();
}

/* the logits of the last of tokens[0..T) prefilled into a fresh cache (the generator's prefill) */
static void prefill_logits(struct toy_gpt2 *m, const int32_t *tokens, int T, float *out) {
    struct toy_kv_cache kv;
    cr_assert_eq(toy_gpt2_cache_init(&kv, m, 32, 1), TOY_OK, "%s", toy_last_error());
    struct toy_lm lm = toy_gpt2_lm(m);
    struct toy_ctx *ctx = toy_ctx_init(true);
    struct toy_tensor *tok = toy_new_tensor_2d(ctx, TOY_I32, T, 1), *pos = toy_new_tensor_1d(ctx, TOY_I32, T);
    for (int i = 0; i < T; i++) ((int32_t *)tok->data)[i] = tokens[i], ((int32_t *)pos->data)[i] = i;
    struct toy_tensor *lg = lm.forward_cached(m, ctx, &kv, tok, pos, true);
    cr_assert_eq(lg->ne[1], 1, "the last position only");
    toy_set_output(lg);
    struct toy_graph *g = toy_graph_new(ctx);
    toy_graph_build(g, lg);
    *(int32_t *)kv.n_past->data = 0;
    cr_assert_eq(toy_graph_compute(g, NULL), TOY_OK, "%s", toy_last_error());
    memcpy(out, lg->data, (size_t)m->cfg.vocab * sizeof(float));
    toy_ctx_free(ctx);
    toy_kv_cache_free(&kv);
}

/* toy_gpt2_infer_bf16 (`--bf16`), as toy_llama_infer_bf16: a prompt's
 * products over f32 and f16 matrices take bf16 operands, so the logits move
 * by about bf16's rounding and no more (and do move: the bf16 kernels ran);
 * quantized matrices keep their int8 kernels: refused, and even when set by
 * hand, the same bits */
Test(gpt2, infer_bf16_rounds_a_prompts_float_products_only, .timeout = 120) {
    char f32[1024], path[1024];
    struct toy_gpt2_config c = saved_model("bf16-f32.gguf", 51, f32, sizeof f32);
    if (!toy_cpu_bf16_native()) cr_skip_test("this CPU has no faster bf16 products (%s)", toy_cpu_bf16_gemm());
    const enum toy_dtype types[] = {TOY_F32, TOY_F16, TOY_Q8_0};
    int32_t tokens[20];
    for (int i = 0; i < 20; i++) tokens[i] = (i * 13 + 3) % (int32_t)c.vocab;
    float want[61], got[61];
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const char *tn = toy_dtype_name(types[ti]);
        typed_copy(f32, types[ti], path, sizeof path);
        struct toy_gpt2 *m;
        cr_assert_eq(toy_gpt2_load(path, false, &m), TOY_OK, "%s", toy_last_error());
        cr_assert_eq(m->layers[0].w_qkv->type, types[ti]);
        cr_assert_eq(toy_gpt2_pack_weights(m), TOY_OK, "%s", toy_last_error());
        prefill_logits(m, tokens, 20, want);
        bool on = toy_gpt2_infer_bf16(m);
        if (types[ti] == TOY_Q8_0) {
            cr_assert_not(on, "bf16 inference over q8_0 matrices only");
            cr_assert_eq(m->matmul_type, TOY_F32);
            m->matmul_type = TOY_BF16;
            m->bf16_float_only = true;
            prefill_logits(m, tokens, 20, got);
            cr_assert(memcmp(want, got, sizeof want) == 0, "q8_0 prefill changed under bf16 inference");
        } else {
            cr_assert(on, "%s", tn);
            prefill_logits(m, tokens, 20, got);
            double scale = 0, diff = 0;
            for (int v = 0; v < c.vocab; v++) scale = fmax(scale, fabsf(want[v])), diff = fmax(diff, fabsf(got[v] - want[v]));
            cr_log_info("gpt2 %s, bf16 prefill: max |logit diff| %.3g of max |logit| %.3g", tn, diff, scale);
            cr_assert(diff > 0, "%s: a bf16 prefill gave the same bits: its products did not run in bf16", tn);
            cr_assert(diff <= 2e-2 * scale, "%s: bf16 prefill logits off by %g (max |logit| %g)", tn, diff, scale);
        }
        toy_gpt2_free(m);
    }
    th_rmdir();
}

/* Generation goes through the generic generator (toy_generator_new_lm over
 * toy_gpt2_lm), whose decode graph is fused for the CPU's kernels: the
 * greedy tokens and their log-probabilities have the same bits as with
 * TOY_FUSE=0, for f32 and quantized (packed) weights, and each greedy token
 * is the full forward's argmax at its position (where no near-tie could
 * flip it). */
Test(gpt2, generator_fused_decode_same_bits_as_unfused, .timeout = 300) {
    char f32[1024], path[1024];
    struct toy_gpt2_config c = saved_model("gen-f32.gguf", 41, f32, sizeof f32);
    const enum toy_dtype types[] = {TOY_F32, TOY_Q8_0, TOY_Q4_0};
    const int32_t prompt[] = {3, 17, 40, 8, 59};
    const int P = 5, N = 20;
    struct toy_generate_params gp = {.n_predict = N, .ignore_eos = true, .sampling = {.temperature = 0}};
    struct toy_threadpool *tp = toy_threadpool_new(2);
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        typed_copy(f32, types[ti], path, sizeof path);
        struct th_gen_log runs[2] = {0};
        for (int fused = 0; fused < 2; fused++) {
            struct toy_gpt2 *m;
            cr_assert_eq(toy_gpt2_load(path, false, &m), TOY_OK, "%s", toy_last_error());
            if (!fused) setenv("TOY_FUSE", "0", 1);
            struct toy_generate_result res;
            cr_assert_eq(toy_gpt2_generate_kv(m, NULL, 0, TOY_F32, tp, prompt, P, &gp, th_log_token, &runs[fused], &res),
                         TOY_OK, "%s", toy_last_error());
            unsetenv("TOY_FUSE");
            cr_assert_eq(res.n_generated, N);
            cr_assert_eq(runs[fused].n, N);
            if (fused) { /* against the full forward over the prompt and what was generated */
                int32_t all[5 + 20];
                memcpy(all, prompt, sizeof prompt);
                memcpy(all + P, runs[1].ids, (size_t)(N - 1) * sizeof(int32_t));
                float *full = th_logits(fwd, m, all, P + N - 1, 1);
                int checked = 0;
                for (int i = 0; i < N; i++) {
                    const float *l = full + (size_t)(P - 1 + i) * c.vocab;
                    int best = 0;
                    for (int v = 1; v < c.vocab; v++) best = l[v] > l[best] ? v : best;
                    float gap = INFINITY;
                    for (int v = 0; v < c.vocab; v++) if (v != best) gap = fminf(gap, l[best] - l[v]);
                    if (gap < 1e-3f) continue;
                    cr_assert_eq(runs[1].ids[i], best, "%s: token %d is %d, the forward's argmax %d",
                                 toy_dtype_name(types[ti]), i, runs[1].ids[i], best);
                    checked++;
                }
                cr_assert_geq(checked, N / 2);
                free(full);
            }
            toy_gpt2_free(m);
        }
        cr_assert_eq(memcmp(runs[0].ids, runs[1].ids, sizeof runs[0].ids), 0, "%s: tokens differ",
                     toy_dtype_name(types[ti]));
        cr_assert_eq(memcmp(runs[0].lps, runs[1].lps, sizeof runs[0].lps), 0, "%s: log-probabilities differ",
                     toy_dtype_name(types[ti]));
    }
    toy_threadpool_free(tp);
    th_rmdir();
}

/* Prompt lookup (speculative decoding from the context) on a GPT-2: the same greedy tokens as plain decoding up
 * to the context's end, log-probabilities within 1e-4 (a pass over several tokens rounds differently), f32 and
 * packed q8_0 weights; and with the model drafting for itself, every draft kept */
Test(gpt2, generator_lookup_gives_the_plain_tokens, .timeout = 300) {
    char f32[1024], path[1024];
    saved_model("gen-lookup.gguf", 43, f32, sizeof f32);
    const enum toy_dtype types[] = {TOY_F32, TOY_Q8_0};
    const int32_t prompt[] = {3, 17, 40, 8, 59, 3, 17, 40};
    struct toy_threadpool *tp = toy_threadpool_new(2);
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        if (types[ti] != TOY_F32) typed_copy(f32, types[ti], path, sizeof path);
        struct toy_gpt2 *m;
        if (types[ti] == TOY_F32) { /* in memory, with a longer context */
            struct toy_gpt2_config c = base_config();
            c.max_ctx = 72; /* at most 63 tokens: th_gen_log keeps 64 */
            m = random_model(&c, true, 43);
        } else {
            cr_assert_eq(toy_gpt2_load(path, false, &m), TOY_OK, "%s", toy_last_error());
        }
        for (int i = 0; types[ti] == TOY_F32 && i < toy_gpt2_n_tensors(m); i++) { /* sharper: greedy soon loops */
            struct toy_tensor *t = toy_gpt2_tensor(m, i);
            for (int64_t k = 0; t->ne[1] > 1 && k < toy_nelements(t); k++) ((float *)t->data)[k] *= 6.0f;
        }
        struct th_gen_log runs[2] = {0};
        struct toy_generate_result res[2];
        for (int k = 0; k < 2; k++) {
            struct toy_generate_params gp = {.ignore_eos = true, .lookup = k ? 4 : 0}; /* to the context's end */
            cr_assert_eq(toy_gpt2_generate_kv(m, NULL, 0, TOY_F16, tp, prompt, 8, &gp, th_log_token, &runs[k], &res[k]),
                         TOY_OK, "%s", toy_last_error());
        }
        cr_assert_eq(res[0].reason, TOY_STOP_CONTEXT);
        cr_assert_eq(res[1].reason, TOY_STOP_CONTEXT);
        cr_assert_eq(runs[1].n, runs[0].n);
        for (int i = 0; i < runs[0].n; i++) {
            cr_assert_eq(runs[1].ids[i], runs[0].ids[i], "%s: token %d", toy_dtype_name(types[ti]), i);
            cr_assert(fabsf(runs[1].lps[i] - runs[0].lps[i]) < 1e-4f, "%s: token %d", toy_dtype_name(types[ti]), i);
        }
        cr_assert_gt(res[1].n_drafted, 0, "%s: passes over drafts ran", toy_dtype_name(types[ti]));
        cr_assert_eq(res[1].n_steps, runs[0].n - 1 - res[1].n_accepted);
        /* the model drafting for itself, greedily: every draft is kept, so every row of a pass over one is read */
        struct toy_lm lm = toy_gpt2_lm(m);
        struct toy_generator *gen, *self;
        cr_assert_eq(toy_generator_new_lm(&lm, NULL, 0, TOY_F16, tp, &gen), TOY_OK, "%s", toy_last_error());
        cr_assert_eq(toy_generator_new_lm(&lm, NULL, 0, TOY_F16, tp, &self), TOY_OK, "%s", toy_last_error());
        struct toy_generate_params gp = {.ignore_eos = true, .draft = self, .draft_max = 4};
        struct th_gen_log run = {0};
        struct toy_generate_result r;
        cr_assert_eq(toy_generate(gen, prompt, 8, &gp, th_log_token, &run, &r), TOY_OK, "%s", toy_last_error());
        cr_assert_eq(run.n, runs[0].n);
        for (int i = 0; i < run.n; i++) cr_assert_eq(run.ids[i], runs[0].ids[i], "%s: draft, token %d", toy_dtype_name(types[ti]), i);
        cr_assert(r.n_drafted > 10 && r.n_accepted == r.n_drafted, "%s: %lld of %lld drafted kept",
                  toy_dtype_name(types[ti]), (long long)r.n_accepted, (long long)r.n_drafted);
        toy_generator_free(gen);
        toy_generator_free(self);
        toy_gpt2_free(m);
    }
    toy_threadpool_free(tp);
    th_rmdir();
}

static char *read_text(const char *path, size_t max, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = malloc(max + 1);
    *len = fread(buf, 1, max, f);
    buf[*len] = 0;
    fclose(f);
    return buf;
}

static bool collect(void *ud, int32_t id, const char *text, size_t len, float lp) {
    (void)id;
    (void)lp;
    char *out = ud;
    size_t n = strlen(out);
    if (n + len < 4000) { memcpy(out + n, text, len); out[n + len] = 0; }
    return true;
}

#define SHAKESPEARE "../shared/testdata/corpus-tinyshakespeare/input.txt"

Test(gpt2, tinyshakespeare_beats_unigram_and_generates, .timeout = 300) {
    size_t len;
    char *text = read_text(SHAKESPEARE, 300000, &len);
    if (!text) cr_skip_test("no %s", SHAKESPEARE);
    th_mkdir("gpt2");
    struct toy_tokenizer *tok;
    struct toy_bpe_train_opts bo = {.vocab_size = 384};
    cr_assert_eq(toy_tokenizer_train_bpe(text, len, &bo, &tok), TOY_OK, "%s", toy_last_error());
    struct toy_tokens ids = {0};
    cr_assert_eq(toy_tokenizer_encode(tok, text, len, 0, &ids), TOY_OK);
    free(text);
    struct toy_data_opts dopt = {.batch = 16, .ctx = 64, .heldout = 0.1, .seed = 1};
    struct toy_data *data;
    int64_t V = toy_tokenizer_n_vocab(tok);
    cr_assert_eq(toy_data_from_ids(ids.ids, ids.n, V, &dopt, &data), TOY_OK, "%s", toy_last_error());
    /* unigram baseline: cross-entropy of held-out tokens under training frequencies (add-one) */
    int64_t ntr = toy_data_train_tokens(data), nall = toy_data_count(data);
    double *cnt = calloc((size_t)V, sizeof *cnt);
    for (int64_t i = 0; i < ntr; i++) cnt[ids.ids[i]] += 1;
    double unigram = 0;
    for (int64_t i = ntr; i < nall; i++) unigram -= log((cnt[ids.ids[i]] + 1) / (double)(ntr + V));
    unigram /= (double)(nall - ntr);
    free(cnt);
    toy_tokens_free(&ids);

    struct toy_gpt2_config c = toy_gpt2_preset("tiny");
    c.vocab = V;
    c.max_ctx = 64;
    struct toy_gpt2 *m = toy_gpt2_new(&c, 5);
    struct toy_lm lm = toy_gpt2_lm(m);
    struct toy_train_opts o = {.steps = 150, .accum = 1, .lr = 3e-3f, .lr_min = 3e-4f, .warmup = 20,
                               .schedule = TOY_LR_COSINE, .weight_decay = 0.1f, .beta1 = 0.9f, .beta2 = 0.95f,
                               .eps = 1e-8f, .clip = 1.0f, .seed = 1, .eval_every = 0, .eval_batches = 8};
    struct toy_trainer *tr;
    cr_assert_eq(toy_trainer_new_lm(&lm, tok, data, &o, th_dir, NULL, 2, &tr), TOY_OK, "%s", toy_last_error());
    struct toy_train_result res;
    cr_assert_eq(toy_trainer_run(tr, &res), TOY_OK, "%s", toy_last_error());
    cr_log_info("gpt2 on TinyShakespeare (%lld-token BPE): held-out loss %.3f vs unigram %.3f after %lld steps "
                "(%.1f s, %.0f tok/s)", (long long)V, res.final_eval_loss, unigram, (long long)res.final_step,
                res.seconds, res.tokens_per_s);
    cr_assert_lt(res.final_eval_loss, unigram - 0.3, "held-out %.3f vs unigram %.3f", res.final_eval_loss, unigram);
    cr_assert(res.checkpoint[0]);
    toy_trainer_free(tr);

    /* the checkpoint loads back (mapped) as GPT-2 with its tokenizer, and generates */
    struct toy_gpt2 *back;
    cr_assert_eq(toy_gpt2_load(res.checkpoint, false, &back), TOY_OK, "%s", toy_last_error());
    struct toy_tokenizer *tok2;
    cr_assert_eq(toy_tokenizer_load_gguf(back->gguf, &tok2), TOY_OK, "%s", toy_last_error());
    struct toy_tokens prompt = {0};
    cr_assert_eq(toy_tokenizer_encode(tok2, "ROMEO:", 6, 0, &prompt), TOY_OK);
    struct toy_generate_params gp = {.n_predict = 40, .sampling = {.temperature = 0.0f}};
    char out[4096] = "";
    struct toy_generate_result gr;
    struct toy_threadpool *tp = toy_threadpool_new(2);
    cr_assert_eq(toy_gpt2_generate(back, tok2, 0, tp, prompt.ids, prompt.n, &gp, collect, out, &gr), TOY_OK, "%s",
                 toy_last_error());
    cr_log_info("gpt2 sample: ROMEO:%s", out);
    cr_assert_gt(gr.n_generated, 0);
    cr_assert_gt(strlen(out), 10);
    /* a stop string ends the text before it */
    const char *stops[] = {"e"};
    gp.stop = stops;
    gp.n_stop = 1;
    gp.sampling.temperature = 0.8f;
    gp.sampling.seed = 7;
    out[0] = 0;
    cr_assert_eq(toy_gpt2_generate(back, tok2, 0, tp, prompt.ids, prompt.n, &gp, collect, out, &gr), TOY_OK);
    cr_assert_eq(gr.reason, TOY_STOP_STRING, "reason %d, text %s", gr.reason, out);
    cr_assert_null(strchr(out, 'e'), "%s", out);
    toy_threadpool_free(tp);
    toy_tokens_free(&prompt);
    toy_tokenizer_free(tok2);
    toy_gpt2_free(back);
    toy_gpt2_free(m);
    toy_data_free(data);
    toy_tokenizer_free(tok);
    th_rmdir();
}

/* A Hugging Face GPT-2 folder (tests/torch/make-hf-models.py: Conv1D
 * weights, wte/wpe, the attn.bias buffer) through `toy convert`: the GGUF
 * (output.weight = token_embd, as llama.cpp writes it) loads mapped as a
 * tied GPT-2 and its logits match the reference; a q8_0 conversion runs too. */
Test(gpt2, converted_hf_folder_matches_pytorch, .timeout = 300) {
    th_mkdir("gpt2");
    char cmd[1024], dir[400], f32[400], q8[400];
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 tests/torch/make-hf-models.py '%s/hf' >/dev/null 2>&1", th_dir);
    if (system(cmd)) { th_rmdir(); cr_skip_test("python3 with torch not available"); }
    snprintf(dir, sizeof dir, "%s/hf/gpt2", th_dir);
    snprintf(f32, sizeof f32, "%s/gpt2-f32.gguf", th_dir);
    snprintf(q8, sizeof q8, "%s/gpt2-q8.gguf", th_dir);
    struct toy_convert_opts co = {.type = TOY_F32};
    cr_assert_eq(toy_hf_convert(dir, f32, &co, NULL), TOY_OK, "%s", toy_last_error());
    co.type = TOY_Q8_0;
    cr_assert_eq(toy_hf_convert(dir, q8, &co, NULL), TOY_OK, "%s", toy_last_error());
    const int T = 9, B = 2, V = 320;
    int32_t tokens[T * B];
    for (int i = 0; i < T * B; i++) tokens[i] = (i * 53 + 11) % V;
    struct toy_gpt2 *m;
    cr_assert_eq(toy_gpt2_load(f32, false, &m), TOY_OK, "%s", toy_last_error());
    cr_assert(m->tied, "output.weight equal to token_embd loads as a tied head");
    cr_assert_eq(m->cfg.vocab, V);
    cr_assert_eq(m->cfg.max_ctx, 128);
    float *ours = th_logits(fwd, m, tokens, T, B);
    toy_gpt2_free(m);
    cr_assert_eq(toy_gpt2_load(q8, false, &m), TOY_OK, "%s", toy_last_error());
    cr_assert_eq(m->layers[0].w_qkv->type, TOY_Q8_0);
    float *quant = th_logits(fwd, m, tokens, T, B);
    toy_gpt2_free(m);
    json_t *tk = json_array();
    for (int b = 0; b < B; b++) {
        json_t *row = json_array();
        for (int t = 0; t < T; t++) json_array_append_new(row, json_integer(tokens[b * T + t]));
        json_array_append_new(tk, row);
    }
    json_t *specs = json_array();
    json_array_append_new(specs, json_pack("{s:s,s:o}", "gguf", f32, "tokens", tk));
    json_t *res = th_torch("ref_gpt2.py", specs);
    json_t *ref = json_object_get(json_array_get(json_object_get(res, "cases"), 0), "logits");
    cr_assert_eq(json_array_size(ref), (size_t)(T * B * V));
    double worst = 0, worst_q = 0;
    for (size_t k = 0; k < json_array_size(ref); k++) {
        double r = json_number_value(json_array_get(ref, k));
        worst = fmax(worst, fabs(ours[k] - r) / (1 + fabs(r)));
        worst_q = fmax(worst_q, fabs(quant[k] - r) / (1 + fabs(r)));
    }
    cr_log_info("gpt2 converted from HF: f32 max rel. difference %.2e, q8_0 %.2e", worst, worst_q);
    cr_assert_leq(worst, 1e-4);
    cr_assert_leq(worst_q, 0.1);
    json_decref(res);
    free(ours);
    free(quant);
    /* `toy convert` reports the model's parameters once: the output copy of the tied matrix is not counted */
    const char *bin = getenv("TOY_BIN") ? getenv("TOY_BIN") : "build/toy";
    snprintf(cmd, sizeof cmd, "%s convert '%s' -o '%s/cli.gguf' --type q8_0 2>&1", bin, dir, th_dir);
    FILE *p = popen(cmd, "r");
    cr_assert(p);
    char line[512], model_params[32] = "", file_params[32] = "";
    while (fgets(line, sizeof line, p)) {
        const char *m = strstr(line, "gpt2 model, "), *w = strstr(line, " tensors, ");
        if (m) sscanf(m + strlen("gpt2 model, "), "%31s", model_params);
        if (w) sscanf(w + strlen(" tensors, "), "%31s", file_params);
    }
    cr_assert_eq(pclose(p), 0);
    cr_expect(model_params[0] && !strcmp(model_params, file_params), "convert says '%s' then '%s'", model_params,
              file_params);
    th_rmdir();
}

/* `toy bench` on a GPT-2 GGUF: decode against the bound, with the bytes a
 * step reads (every tensor, but one row of the position table, and of the
 * token table when the head is not tied to it) and the cache's (f16 by
 * default, as toy generate keeps it; f32 twice that); --bf16 on the f32
 * matrices where the CPU multiplies bf16 faster. */
Test(gpt2, cli_bench_measures_a_gpt2, .timeout = 300) {
    const char *bin = getenv("TOY_BIN") ? getenv("TOY_BIN") : "build/toy";
    if (access(bin, X_OK)) cr_skip_test("no %s", bin);
    th_mkdir("gpt2");
    struct toy_gpt2_config c = base_config();
    for (int tied = 0; tied < 2; tied++) {
        struct toy_gpt2 *m = random_model(&c, tied, 5);
        char path[1024], cmd[2048];
        snprintf(path, sizeof path, "%s/bench-%d.gguf", th_dir, tied);
        save(m, path);
        double want = 0;
        for (int i = 0; i < toy_gpt2_n_tensors(m); i++) want += (double)toy_nbytes(toy_gpt2_tensor(m, i));
        want -= (double)(c.max_ctx - 1) * c.d_model * 4;         /* the position table: one row */
        if (!tied) want -= (double)(c.vocab - 1) * c.d_model * 4; /* the token table: one row */
        toy_gpt2_free(m);
        for (int f32 = 0; f32 < 2; f32++) {
            snprintf(cmd, sizeof cmd, "%s bench -m '%s' --threads 1,2 --prompt 8 --gen 3 --reps 1 --json %s", bin, path,
                     f32 ? "--kv-type f32" : "");
            json_t *j = cli_json(cmd);
            cr_expect_str_eq(json_string_value(json_object_get(j, "arch")), "gpt2");
            cr_expect_str_eq(json_string_value(json_object_get(j, "kv_type")), f32 ? "f32" : "f16");
            cr_expect_float_eq(json_real_value(json_object_get(j, "decode_bytes")), want, 0.5, "tied %d", tied);
            cr_expect_float_eq(json_real_value(json_object_get(j, "kv_bytes")),
                               2.0 * c.n_layers * c.d_model * (f32 ? 4 : 2) * (8 + 1), 0.5);
            json_t *runs = json_object_get(j, "runs");
            cr_assert_eq(json_array_size(runs), 2);
            for (size_t i = 0; i < 2; i++) {
                json_t *r = json_array_get(runs, i);
                cr_expect_gt(json_real_value(json_object_get(r, "prefill_tok_s")), 0);
                cr_expect_gt(json_real_value(json_object_get(r, "decode_tok_s")), 0);
                cr_expect_gt(json_real_value(json_object_get(r, "decode_bound_tok_s")), 0);
            }
            json_decref(j);
        }
        snprintf(cmd, sizeof cmd, "%s bench -m '%s' --threads 2 --prompt 8 --gen 3 --reps 1 --json --bf16 2> /dev/null",
                 bin, path);
        json_t *j = cli_json(cmd);
        cr_expect_eq(json_is_true(json_object_get(j, "bf16_products")), toy_cpu_bf16_native(), "--bf16 on f32 matrices");
        json_decref(j);
    }
    th_rmdir();
}

/* `toy train --arch gpt2` writes a run bundle whose checkpoint `toy generate`
 * runs (dispatching on general.architecture), and `--resume` continues it. */
Test(gpt2, cli_train_and_generate, .timeout = 300) {
    const char *bin = getenv("TOY_BIN") ? getenv("TOY_BIN") : "build/toy";
    if (access(bin, X_OK)) cr_skip_test("no %s", bin);
    if (access(SHAKESPEARE, R_OK)) cr_skip_test("no %s", SHAKESPEARE);
    th_mkdir("gpt2");
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "head -c 100000 %s > '%s/text.txt' && %s train --arch gpt2 --preset tiny --data '%s/text.txt' "
             "--vocab-size 300 --steps 30 --batch 4 --ctx 32 --eval-every 15 --sample 'ROMEO:' --sample-tokens 8 "
             "--out '%s/run' --json > '%s/train.json' 2>&1",
             SHAKESPEARE, th_dir, bin, th_dir, th_dir, th_dir);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    snprintf(cmd, sizeof cmd, "%s/run/events.jsonl", th_dir);
    FILE *f = fopen(cmd, "r");
    cr_assert(f);
    char line[8192];
    cr_assert(fgets(line, sizeof line, f));
    cr_assert(strstr(line, "\"arch\":\"gpt2\""), "run_start names the architecture: %s", line);
    bool sampled = false; /* the end of the run generates through the same generator as Llama runs */
    while (fgets(line, sizeof line, f)) sampled |= strstr(line, "\"kind\":\"sample\"") && strstr(line, "\"prompt\":\"ROMEO:\"");
    fclose(f);
    cr_assert(sampled, "no sample event");
    snprintf(cmd, sizeof cmd, "%s generate -m '%s/run/weights/latest' -p 'ROMEO:' -n 12 --temp 0 --json", bin, th_dir);
    json_t *g = cli_json(cmd);
    cr_assert_str_eq(json_string_value(json_object_get(g, "arch")), "gpt2");
    cr_assert_eq(json_array_size(json_object_get(g, "ids")), 12);
    json_decref(g);
    /* the cache f16 by default, or f32; not another type */
    snprintf(cmd, sizeof cmd, "%s generate -m '%s/run/weights/latest' -p 'ROMEO:' -n 12 --temp 0 --kv-type f32 --json",
             bin, th_dir);
    g = cli_json(cmd);
    cr_assert_eq(json_array_size(json_object_get(g, "ids")), 12);
    json_decref(g);
    /* --bf16: the products over the checkpoint's f32 matrices in bf16 (or a note where that is no faster) */
    snprintf(cmd, sizeof cmd, "%s generate -m '%s/run/weights/latest' -p 'ROMEO:' -n 12 --temp 0 --bf16 --json 2> /dev/null",
             bin, th_dir);
    g = cli_json(cmd);
    cr_assert_eq(json_array_size(json_object_get(g, "ids")), 12);
    json_decref(g);
    snprintf(cmd, sizeof cmd, "%s generate -m '%s/run/weights/latest' -p 'x' --kv-type q8_0 > /dev/null 2>&1", bin, th_dir);
    int krc = system(cmd);
    cr_assert(WIFEXITED(krc) && WEXITSTATUS(krc) == 2, "--kv-type q8_0: %d", krc);
    /* --trace: a Chrome trace of the prefill and every decode step, as for Llama models */
    snprintf(cmd, sizeof cmd, "%s generate -m '%s/run/weights/latest' -p 'ROMEO:' -n 6 --temp 0 --trace '%s/t.json' --json",
             bin, th_dir, th_dir);
    json_decref(cli_json(cmd));
    snprintf(cmd, sizeof cmd, "%s/t.json", th_dir);
    json_error_t jerr;
    json_t *tr = json_load_file(cmd, 0, &jerr);
    cr_assert(tr, "trace: %s", jerr.text);
    json_t *evs = json_is_array(tr) ? tr : json_object_get(tr, "traceEvents");
    int phases[2] = {0, 0}, matmuls = 0;
    for (size_t i = 0; i < json_array_size(evs); i++) {
        const char *name = json_string_value(json_object_get(json_array_get(evs, i), "name"));
        if (!name) continue;
        phases[0] += !strcmp(name, "prefill"), phases[1] += !strcmp(name, "decode");
        matmuls += !strcmp(name, "MATMUL");
    }
    cr_assert_eq(phases[0], 1, "one prefill span");
    cr_assert_eq(phases[1], 5, "a decode span per decode step: %d", phases[1]);
    cr_assert_gt(matmuls, 5 * 2 * 4, "the ops of every step");
    json_decref(tr);
    snprintf(cmd, sizeof cmd, "%s eval -m '%s/run/weights/latest' --data '%s/text.txt' --heldout 0.1 --json", bin, th_dir,
             th_dir);
    json_t *e = cli_json(cmd);
    double ce = json_real_value(json_object_get(e, "loss"));
    cr_assert(ce > 0 && ce < log(300.0), "toy eval of the GPT-2 checkpoint: %f", ce);
    json_decref(e);
    snprintf(cmd, sizeof cmd, "%s eval -m '%s/run/weights/latest' --data '%s/text.txt' --heldout 0.1 --bf16 --json 2> /dev/null",
             bin, th_dir, th_dir);
    e = cli_json(cmd);
    cr_assert_float_eq(json_real_value(json_object_get(e, "loss")), ce, 0.02 * ce, "toy eval --bf16 of the GPT-2");
    json_decref(e);
    snprintf(cmd, sizeof cmd, "%s train --resume '%s/run' --steps 40 --json 2> '%s/resume.err'", bin, th_dir, th_dir);
    json_t *r = cli_json(cmd);
    cr_assert_eq(json_integer_value(json_object_get(r, "steps")), 40);
    json_decref(r);
    th_rmdir();
}

/* With GPT-2's own tokenizer (../shared/testdata/tokenizer-gpt2: encoder.json
 * + vocab.bpe, vocabulary 50257): the trained checkpoint carries it, and
 * `toy generate` encodes the prompt to GPT-2's ids. */
Test(gpt2, cli_with_the_gpt2_tokenizer, .timeout = 300) {
    const char *bin = getenv("TOY_BIN") ? getenv("TOY_BIN") : "build/toy";
    const char *tokdir = "../shared/testdata/tokenizer-gpt2";
    if (access(bin, X_OK)) cr_skip_test("no %s", bin);
    if (access(SHAKESPEARE, R_OK) || access(tokdir, R_OK)) cr_skip_test("no test data");
    th_mkdir("gpt2");
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "head -c 20000 %s > '%s/text.txt' && %s train --arch gpt2 --preset tiny --dim 32 --heads 2 "
             "--layers 1 --tokenizer %s --data '%s/text.txt' --steps 3 --batch 2 --ctx 16 --out '%s/run' --json "
             "> /dev/null 2>&1", SHAKESPEARE, th_dir, bin, tokdir, th_dir, th_dir);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    snprintf(cmd, sizeof cmd, "%s generate -m '%s/run/weights/latest' -p 'ROMEO: What' -n 4 --json", bin, th_dir);
    json_t *g = cli_json(cmd);
    json_t *p = json_object_get(g, "prompt_ids");
    const int64_t want[] = {33676, 4720, 25, 1867}; /* GPT-2: "ROM" "EO" ":" " What" */
    cr_assert_eq(json_array_size(p), 4);
    for (size_t i = 0; i < 4; i++) cr_assert_eq(json_integer_value(json_array_get(p, i)), want[i]);
    cr_assert_eq(json_array_size(json_object_get(g, "ids")), 4);
    json_decref(g);
    /* --special reads <|endoftext|> as that token, as for Llama models (it was spelled out in 13 pieces) */
    snprintf(cmd, sizeof cmd, "%s generate -m '%s/run/weights/latest' -p '<|endoftext|>What' --special -n 1 --json", bin,
             th_dir);
    g = cli_json(cmd);
    p = json_object_get(g, "prompt_ids");
    cr_assert_eq(json_array_size(p), 2);
    cr_assert_eq(json_integer_value(json_array_get(p, 0)), 50256);
    json_decref(g);
    th_rmdir();
}
