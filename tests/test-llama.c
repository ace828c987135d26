/* test-llama.c: the Llama family against a PyTorch reference written in the
 * tests (tests/torch/ref_llama.py, float64), through GGUF files toy writes:
 *  - logits for each family flag (plain, tied, QKV bias, QK-norm, sliding
 *    window, Gemma 2's softcaps + sandwich norms + embedding scale + GeGLU,
 *    each RoPE scaling) within 1e-4 (1 + |ref|);
 *  - 20 AdamW training steps from the same init and batches: losses within
 *    1e-4 (1 + |ref|);
 *  - KV-cache decode logits equal the full-sequence forward at every position;
 *  - the llama.cpp-made GGUF in ../shared/testdata loads (mapped) and runs. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/internal.h" /* P_MM_ACCUM */
#include "serve/serve-internal.h" /* toy_srv_forward */
#include "toy/convert.h"
#include "toy/gguf.h"
#include "toy/llama.h"
#include "toy/toy.h"
#include "alloc-count.h"
#include "harness.h"

/* random init, then every norm weight and bias perturbed so none is trivial */
static struct toy_llama *random_model(const struct toy_llama_config *c, uint64_t seed) {
    struct toy_llama *m = toy_llama_new(c, seed);
    cr_assert(m, "%s", toy_last_error());
    struct toy_rng r;
    toy_rng_seed(&r, seed + 99);
    for (int i = 0; i < toy_llama_n_tensors(m); i++) {
        struct toy_tensor *t = toy_llama_tensor(m, i);
        if (t->ne[1] > 1) {
            float *d = t->data; /* larger weights than the 0.02 init: sharper logits */
            for (int64_t k = 0; k < toy_nelements(t); k++) d[k] *= 8.0f;
            continue;
        }
        float *d = t->data;
        bool bias = strstr(t->name, ".bias") != NULL;
        for (int64_t k = 0; k < toy_nelements(t); k++) d[k] = (bias ? 0.0f : 1.0f) + 0.2f * toy_rng_normal(&r);
    }
    for (int64_t l = 0; l < c->n_layers && c->swiglu_limit > 0; l++) { /* gpt-oss: gates and ups past its clamps */
        struct toy_llama_layer *L = &m->layers[l];
        struct toy_tensor *const big[] = {L->ffn_gate_exps, L->ffn_up_exps, L->ffn_gate_exps_b, L->ffn_up_exps_b};
        for (int i = 0; i < 4; i++)
            for (int64_t k = 0; k < toy_nelements(big[i]); k++)
                ((float *)big[i]->data)[k] = i < 2 ? 5.0f * ((float *)big[i]->data)[k] : 3.0f * toy_rng_normal(&r);
        for (int64_t h = 0; h < c->n_heads; h++) ((float *)L->attn_sinks->data)[h] = 2.0f * toy_rng_normal(&r);
    }
    if (!strcmp(c->arch, "phi3")) { /* LongRoPE's tables: divisors in [1, 5), the long ones larger */
        int64_t half = (c->rope_dim ? c->rope_dim : toy_llama_head_dim(c)) / 2;
        m->rope_long = toy_set_name(toy_new_tensor_1d(m->ctx, TOY_F32, half), "rope_factors_long.weight");
        m->rope_short = toy_set_name(toy_new_tensor_1d(m->ctx, TOY_F32, half), "rope_factors_short.weight");
        for (int64_t i = 0; i < half; i++) {
            ((float *)m->rope_long->data)[i] = 1.0f + 4.0f * (float)i / (float)half;
            ((float *)m->rope_short->data)[i] = 1.0f + 0.5f * (float)i / (float)half;
        }
    }
    return m;
}

static void save(struct toy_llama *m, const char *path) {
    th_save_llama(m, TOY_F32, path);
}

static struct toy_tensor *fwd(struct toy_ctx *ctx, void *m, struct toy_tensor *tok, struct toy_tensor *pos) {
    return toy_llama_forward(ctx, m, tok, pos);
}

static struct toy_tensor *cfwd(struct toy_ctx *ctx, void *m, struct toy_kv_cache *kv, struct toy_tensor *tok,
                                struct toy_tensor *pos) {
    return toy_llama_forward_cached(ctx, m, kv, tok, pos);
}

struct flag_case {
    const char *name;
    void (*set)(struct toy_llama_config *c);
};

static void f_plain(struct toy_llama_config *c) { c->tied = false; }
static void f_tied(struct toy_llama_config *c) { c->tied = true; }
static void f_qwen2(struct toy_llama_config *c) {
    snprintf(c->arch, sizeof c->arch, "qwen2");
    c->rope_mode = TOY_ROPE_NEOX;
    c->qkv_bias = true;
    c->rope_base = 1000000.0f;
}
static void f_qwen3(struct toy_llama_config *c) {
    snprintf(c->arch, sizeof c->arch, "qwen3");
    c->rope_mode = TOY_ROPE_NEOX;
    c->qk_norm = true;
    c->head_dim = 24; /* not d_model / n_heads, as in Qwen3 */
}
static void f_swa(struct toy_llama_config *c) { c->sliding_window = 5; }
/* mixtures of experts: Mixtral (a "llama" with experts), Qwen3-MoE (QK-norm
 * per head, experts narrower than d_ff), OLMoE (QK-norm over the whole
 * projection, weights not renormalised) */
static void f_mixtral(struct toy_llama_config *c) {
    c->n_experts = 4, c->n_experts_used = 2, c->moe_norm = true;
}
static void f_qwen3moe(struct toy_llama_config *c) {
    f_qwen3(c);
    snprintf(c->arch, sizeof c->arch, "qwen3moe");
    c->n_experts = 8, c->n_experts_used = 3, c->d_ff_expert = 32, c->moe_norm = true;
}
static void f_qwen2moe(struct toy_llama_config *c) { /* QKV bias, and a shared expert */
    f_qwen2(c);
    snprintf(c->arch, sizeof c->arch, "qwen2moe");
    c->n_experts = 4, c->n_experts_used = 2, c->d_ff_expert = 24, c->d_ff_shared = 48, c->moe_norm = false;
}
static void f_olmoe(struct toy_llama_config *c) {
    snprintf(c->arch, sizeof c->arch, "olmoe");
    c->rope_mode = TOY_ROPE_NEOX;
    c->qk_norm = true, c->qk_norm_full = true;
    c->n_experts = 6, c->n_experts_used = 2, c->moe_norm = false;
}
/* DeepSeek-V2-Lite's shape in small: latent attention (queries straight
 * from attn_q), a dense first layer, then experts with two shared ones,
 * weights not renormalised but scaled */
static void f_deepseek2(struct toy_llama_config *c) {
    snprintf(c->arch, sizeof c->arch, "deepseek2");
    c->n_kv_heads = 1;
    c->kv_lora_rank = 24, c->rope_dim = 8, c->head_dim = 20, c->head_dim_v = 12;
    c->n_layers = 3, c->n_dense_lead = 1;
    c->n_experts = 6, c->n_experts_used = 2, c->d_ff_expert = 16, c->d_ff_shared = 32, c->shared_ungated = true;
    c->moe_norm = false, c->moe_scale = 1.5f;
}
/* DeepSeek-V2's: queries through their own latent, weights renormalised, YaRN with its attention correction */
static void f_deepseek2_qlora(struct toy_llama_config *c) {
    f_deepseek2(c);
    c->q_lora_rank = 16, c->n_dense_lead = 0, c->d_ff_shared = 16, c->moe_norm = true, c->moe_scale = 0;
    c->rope_scaling = TOY_ROPE_SCALING_YARN, c->rope_factor = 4, c->rope_orig_ctx = 8, c->rope_yarn_log_mul = 0.707f;
}
/* DeepSeek-V3's routing: sigmoid scores, a bias to choose by, renormalised and scaled */
static void f_deepseek3(struct toy_llama_config *c) {
    f_deepseek2_qlora(c);
    c->moe_sigmoid = true, c->moe_bias = true, c->moe_scale = 2.5f, c->n_dense_lead = 1;
}
static void f_gemma2(struct toy_llama_config *c) {
    snprintf(c->arch, sizeof c->arch, "gemma2");
    c->rope_mode = TOY_ROPE_NEOX;
    c->sliding_window = 4;
    c->swa_period = 2;
    c->attn_softcap = 5.0f;
    c->final_softcap = 3.0f;
    c->sandwich_norm = true;
    c->embed_scale = true;
    c->gelu_mlp = true;
    c->attn_scale = 1.0f / sqrtf(16.0f);
}
/* Gemma 3's in small: QK-norm, a head dim past d_model / n_heads, of each 3 layers the last global (a period
 * llama.cpp has no default for: its key), the sliding ones with their own RoPE base and no scaling */
static void f_gemma3(struct toy_llama_config *c) {
    f_gemma2(c);
    snprintf(c->arch, sizeof c->arch, "gemma3");
    c->attn_softcap = c->final_softcap = 0;
    c->qk_norm = true;
    c->head_dim = 32;
    c->attn_scale = 1.0f / sqrtf(32.0f);
    c->n_layers = 3, c->swa_period = 3;
    c->rope_base = 1000000.0f, c->rope_base_swa = 10000.0f;
    c->rope_scaling = TOY_ROPE_SCALING_LINEAR, c->rope_factor = 2, c->rope_orig_ctx = 64;
}
/* and in llama.cpp's defaults (period 6, local base 10000: no keys), 6 layers */
static void f_gemma3_six(struct toy_llama_config *c) {
    f_gemma3(c);
    c->n_layers = 6, c->swa_period = 6, c->d_model = 32, c->d_ff = 48;
    c->rope_scaling = TOY_ROPE_SCALING_NONE, c->rope_factor = 0, c->rope_orig_ctx = 0;
}
/* SmolLM3's: no rotary embedding on layer 3 of 4 */
static void f_smollm3(struct toy_llama_config *c) {
    snprintf(c->arch, sizeof c->arch, "smollm3");
    c->n_layers = 4, c->nope_period = 4, c->tied = true;
}
/* OLMo 2's: RMSNorm after attention and the MLP only, QK-norm over the whole projections */
static void f_olmo2(struct toy_llama_config *c) {
    snprintf(c->arch, sizeof c->arch, "olmo2");
    c->rope_mode = TOY_ROPE_NEOX;
    c->qk_norm = c->qk_norm_full = c->post_norm = true;
}
/* OLMo 3's (olmo2 with a window): of each 4 layers the last global; the sliding ones rotate with the global base but
 * unscaled, the global ones with YaRN (a ramp from beta_fast 16, not the default 32) and its attention factor */
static void f_olmo3(struct toy_llama_config *c) {
    f_olmo2(c);
    c->n_layers = 4, c->sliding_window = 4, c->swa_period = 4;
    c->rope_base = 10000.0f, c->rope_base_swa = 10000.0f; /* (a base and context where the ramp's bounds move) */
    c->rope_scaling = TOY_ROPE_SCALING_YARN, c->rope_factor = 4, c->rope_orig_ctx = 4096, c->rope_attn_factor = 1.2f;
    c->rope_beta_fast = 16;
}
/* Ministral 3's (mistral3): YaRN without its magnitude, and the queries' temperature growing every 4 positions
 * (its original context here), so that it changes within the tests' sequences */
static void f_mistral3(struct toy_llama_config *c) {
    snprintf(c->arch, sizeof c->arch, "mistral3");
    c->rope_scaling = TOY_ROPE_SCALING_YARN, c->rope_factor = 4, c->rope_orig_ctx = 4, c->rope_attn_factor = 1;
    c->attn_temp_scale = 0.1f, c->tied = false; /* (Ministral 3's beta) */
}
/* ERNIE 4.5's dense models (ernie4_5): a Llama, adjacent pairs rotated, with biases on q, k and v */
static void f_ernie(struct toy_llama_config *c) {
    snprintf(c->arch, sizeof c->arch, "ernie4_5");
    c->qkv_bias = true, c->tied = true;
}
/* gpt-oss's in small: heads wider than d_model / n_heads, biases on q, k, v and o, a sink per head, even layers
 * sliding (over 4 here) and odd ones global, YaRN, and experts with biases and the clamped SwiGLU */
static void f_gptoss(struct toy_llama_config *c) {
    snprintf(c->arch, sizeof c->arch, "gpt-oss");
    c->rope_mode = TOY_ROPE_NEOX;
    c->head_dim = 24;
    c->qkv_bias = true, c->out_bias = true, c->attn_sinks = true, c->moe_biases = true, c->swiglu_limit = 7.0f;
    c->n_experts = 4, c->n_experts_used = 2, c->d_ff_expert = 32, c->moe_norm = true;
    c->sliding_window = 4, c->swa_period = 2;
    c->rope_scaling = TOY_ROPE_SCALING_YARN, c->rope_factor = 4, c->rope_orig_ctx = 8;
    c->tied = false;
}
/* Granite's multipliers: embeddings, residual branches, scores, logits */
static void f_granite(struct toy_llama_config *c) {
    snprintf(c->arch, sizeof c->arch, "granite");
    c->embed_mult = 12.0f, c->residual_mult = 0.22f, c->attn_scale = 0.015625f, c->logit_div = 8.0f;
}
/* Phi-4-mini's in small: three quarters of each head rotate, LongRoPE (its long table: the sequence passes the
 * original context of 8) with its attention factor, q/k/v and gate/up fused in the file */
static void f_phi3(struct toy_llama_config *c) {
    snprintf(c->arch, sizeof c->arch, "phi3");
    c->rope_mode = TOY_ROPE_NEOX;
    c->rope_dim = 12;
    c->rope_orig_ctx = 8, c->rope_attn_factor = 1.19f;
    c->tied = false;
}
/* Phi-3-mini's: LongRoPE's short table (within the original context), every layer sliding; tied as Phi-4-mini */
static void f_phi3_window(struct toy_llama_config *c) {
    f_phi3(c);
    c->rope_orig_ctx = 32, c->sliding_window = 6, c->tied = true;
}
static void f_linear(struct toy_llama_config *c) {
    c->rope_scaling = TOY_ROPE_SCALING_LINEAR;
    c->rope_factor = 4;
    c->rope_orig_ctx = 16;
}
static void f_yarn(struct toy_llama_config *c) {
    c->rope_scaling = TOY_ROPE_SCALING_YARN;
    c->rope_factor = 4;
    c->rope_orig_ctx = 8;
}

static struct toy_llama_config base_config(void) {
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

/* GGUF has no key for Gemma 2's query_pre_attn_scalar: a reader takes 1/sqrt(head_dim), except for the 46-layer
 * 27B, where it is 1/sqrt(d_model / n_heads) (144 for 4608 / 32, not its head dim 128), as llama.cpp's loader
 * does; toy ran every Gemma-2-27B GGUF with the wrong attention scale. Gemma 3's 27B has 62 layers. */
Test(llama, gemma2_27b_attention_scale_is_llama_cpps) {
    th_mkdir("gemma2-scale");
    const int layers[] = {44, 46, 46, 62};
    const float want[] = {1.0f / sqrtf(32.0f), 1.0f / sqrtf(16.0f), 1.0f / sqrtf(32.0f), 1.0f / sqrtf(16.0f)};
    for (int i = 0; i < 4; i++) { /* head_dim 32; d_model / n_heads = 16; gemma2, then gemma3 */
        struct toy_llama_config c = base_config();
        if (i < 2) f_gemma2(&c);
        else f_gemma3(&c);
        c.d_model = 64, c.n_heads = 4, c.n_kv_heads = 2, c.head_dim = 32, c.n_layers = layers[i], c.d_ff = 32;
        c.vocab = 16, c.max_ctx = 8, c.swa_period = i < 2 ? 2 : 6;
        struct toy_llama *m = toy_llama_new(&c, 1);
        cr_assert(m, "%s", toy_last_error());
        char path[600];
        snprintf(path, sizeof path, "%s/g%d-%d.gguf", th_dir, i, layers[i]);
        save(m, path);
        toy_llama_free(m);
        cr_assert_eq(toy_llama_load(path, false, &m), TOY_OK, "%s", toy_last_error());
        cr_expect_float_eq(m->cfg.attn_scale, want[i], 1e-7f, "%d layers: scale %g, not %g", layers[i],
                           (double)m->cfg.attn_scale, (double)want[i]);
        toy_llama_free(m);
    }
    th_rmdir();
}

/* Newer llama.cpp files may give sliding_window_pattern as a bool per layer (true: slides): toy takes the period
 * such an array repeats, and refuses one that no period of sliding layers and then a global one gives */
Test(llama, sliding_window_pattern_as_a_bool_per_layer) {
    th_mkdir("swa-pattern");
    struct toy_llama_config c = base_config();
    f_gemma3(&c);
    c.n_layers = 6, c.swa_period = 2, c.d_model = 32, c.d_ff = 32;
    struct toy_llama *m = toy_llama_new(&c, 3);
    cr_assert(m, "%s", toy_last_error());
    const bool cases[][6] = {{1, 0, 1, 0, 1, 0}, {1, 1, 1, 1, 1, 1}, {0, 0, 0, 0, 0, 0}, {1, 0, 1, 1, 0, 0}};
    const int32_t want[] = {2, 0, 1, -1};
    for (int i = 0; i < 4; i++) {
        char path[400];
        snprintf(path, sizeof path, "%s/p%d.gguf", th_dir, i);
        struct toy_gguf_writer *w;
        cr_assert_eq(toy_gguf_writer_init(&w), TOY_OK);
        cr_assert_eq(toy_llama_write_gguf(m, w, TOY_F32), TOY_OK, "%s", toy_last_error());
        uint8_t b[6];
        for (int l = 0; l < 6; l++) b[l] = cases[i][l];
        cr_assert_eq(toy_gguf_writer_set_arr(w, "gemma3.attention.sliding_window_pattern", TOY_GGUF_BOOL, b, 6), TOY_OK);
        cr_assert_eq(toy_gguf_writer_write(w, path), TOY_OK, "%s", toy_last_error());
        toy_gguf_writer_free(w);
        struct toy_llama *lm = NULL;
        enum toy_status st = toy_llama_load(path, false, &lm);
        if (want[i] < 0) {
            cr_expect_eq(st, TOY_ERR_UNSUPPORTED, "%d: %s", i, toy_last_error());
            cr_expect(strstr(toy_last_error(), "layer 3 slides"), "%s", toy_last_error());
            continue;
        }
        cr_assert_eq(st, TOY_OK, "%d: %s", i, toy_last_error());
        cr_expect_eq(lm->cfg.swa_period, want[i], "%d: period %d, not %d", i, lm->cfg.swa_period, want[i]);
        for (int l = 0; l < 6; l++)
            cr_expect_eq(toy_llama_layer_slides(&lm->cfg, l), cases[i][l], "%d: layer %d", i, l);
        toy_llama_free(lm);
    }
    toy_llama_free(m);
    th_rmdir();
}

Test(llama, logits_match_pytorch_for_every_family_flag, .timeout = 300) {
    th_mkdir("llama");
    const struct flag_case cases[] = {{"plain", f_plain}, {"tied", f_tied}, {"qwen2_qkv_bias", f_qwen2},
                                      {"qwen3_qk_norm", f_qwen3}, {"mistral_swa", f_swa},
                                      {"gemma2", f_gemma2}, {"gemma3", f_gemma3}, {"gemma3_six", f_gemma3_six},
                                      {"smollm3", f_smollm3}, {"olmo2", f_olmo2}, {"granite", f_granite},
                                      {"phi3", f_phi3}, {"phi3_window", f_phi3_window}, {"olmo3", f_olmo3},
                                      {"mistral3", f_mistral3}, {"ernie4_5", f_ernie},
                                      {"rope_linear", f_linear},
                                      {"rope_yarn", f_yarn},
                                      {"mixtral_moe", f_mixtral}, {"qwen3moe", f_qwen3moe}, {"olmoe", f_olmoe},
                                      {"qwen2moe", f_qwen2moe}, {"deepseek2", f_deepseek2},
                                      {"deepseek2_qlora", f_deepseek2_qlora}, {"deepseek3", f_deepseek3},
                                      {"gpt-oss", f_gptoss}};
    const int n = sizeof cases / sizeof cases[0], T = 11, B = 2;
    int32_t tokens[T * B];
    for (int i = 0; i < T * B; i++) tokens[i] = (i * 37 + 5) % 61;
    json_t *specs = json_array();
    float *ours[32];
    for (int i = 0; i < n; i++) {
        struct toy_llama_config c = base_config();
        cases[i].set(&c);
        struct toy_llama *m = random_model(&c, 100 + (uint64_t)i);
        char path[400];
        snprintf(path, sizeof path, "%s/%s.gguf", th_dir, cases[i].name);
        save(m, path);
        toy_llama_free(m);
        /* load it back (weights mapped from the file) and run */
        struct toy_llama *lm;
        cr_assert_eq(toy_llama_load(path, false, &lm), TOY_OK, "%s: %s", cases[i].name, toy_last_error());
        cr_assert_eq(lm->cfg.qkv_bias, c.qkv_bias);
        cr_assert_eq(lm->cfg.qk_norm, c.qk_norm);
        cr_assert_eq(lm->cfg.tied, c.tied);
        cr_assert(lm->cfg.n_experts == c.n_experts && lm->cfg.n_experts_used == c.n_experts_used &&
                      lm->cfg.d_ff_expert == c.d_ff_expert && lm->cfg.moe_norm == c.moe_norm &&
                      lm->cfg.qk_norm_full == c.qk_norm_full && lm->cfg.rope_mode == c.rope_mode &&
                      lm->cfg.d_ff_shared == c.d_ff_shared && lm->cfg.n_dense_lead == c.n_dense_lead &&
                      lm->cfg.kv_lora_rank == c.kv_lora_rank && lm->cfg.q_lora_rank == c.q_lora_rank &&
                      lm->cfg.head_dim_v == c.head_dim_v && lm->cfg.rope_dim == c.rope_dim &&
                      fabsf(lm->cfg.rope_yarn_log_mul - c.rope_yarn_log_mul) < 1e-6f &&
                      toy_llama_attn_scale(&lm->cfg) == toy_llama_attn_scale(&c) &&
                      lm->cfg.moe_sigmoid == c.moe_sigmoid && lm->cfg.moe_bias == c.moe_bias &&
                      lm->cfg.sliding_window == c.sliding_window && lm->cfg.swa_period == c.swa_period &&
                      lm->cfg.rope_base_swa == c.rope_base_swa && lm->cfg.rope_scaling == c.rope_scaling &&
                      lm->cfg.nope_period == c.nope_period && lm->cfg.post_norm == c.post_norm &&
                      lm->cfg.sandwich_norm == c.sandwich_norm && lm->cfg.embed_mult == c.embed_mult &&
                      lm->cfg.residual_mult == c.residual_mult && lm->cfg.logit_div == c.logit_div &&
                      lm->cfg.rope_attn_factor == c.rope_attn_factor && lm->cfg.rope_beta_fast == c.rope_beta_fast &&
                      lm->cfg.attn_temp_scale == c.attn_temp_scale && lm->cfg.attn_sinks == c.attn_sinks &&
                      lm->cfg.out_bias == c.out_bias && lm->cfg.moe_biases == c.moe_biases &&
                      lm->cfg.swiglu_limit == c.swiglu_limit &&
                      (lm->rope_long != NULL) == !strcmp(c.arch, "phi3"),
                  "%s: the config did not come back from its GGUF", cases[i].name);
        ours[i] = th_logits(fwd, lm, tokens, T, B);
        toy_llama_free(lm);
        json_t *tk = json_array();
        for (int b = 0; b < B; b++) {
            json_t *row = json_array();
            for (int t = 0; t < T; t++) json_array_append_new(row, json_integer(tokens[b * T + t]));
            json_array_append_new(tk, row);
        }
        json_array_append_new(specs, json_pack("{s:s,s:o}", "gguf", path, "tokens", tk));
    }
    json_t *res = th_torch("ref_llama.py", specs);
    int failures = 0;
    for (int i = 0; i < n; i++) {
        json_t *ref = json_object_get(json_array_get(json_object_get(res, "cases"), (size_t)i), "logits");
        double worst = 0;
        for (size_t k = 0; k < json_array_size(ref); k++) {
            double r = json_number_value(json_array_get(ref, k));
            double e = fabs(ours[i][k] - r) / (1 + fabs(r));
            if (!(e <= worst)) worst = e;
        }
        cr_log_info("%-16s max |toy - torch| / (1 + |torch|) = %.2e", cases[i].name, worst);
        if (!(worst <= 1e-4)) failures++;
        free(ours[i]);
    }
    json_decref(res);
    th_rmdir();
    cr_assert_eq(failures, 0, "%d family configurations differ from PyTorch", failures);
}

/* The server's forward (src/serve/serve-forward.c, its own loop over the layers for batched decode) gives the
 * model's last-position logits for every family: windows, per-layer RoPE bases, QK-norms, experts, latents */
Test(llama, serve_forward_equals_the_models_for_every_family) {
    const struct flag_case cases[] = {{"plain", f_plain}, {"qwen3_qk_norm", f_qwen3}, {"mistral_swa", f_swa},
                                      {"gemma2", f_gemma2}, {"gemma3", f_gemma3}, {"gemma3_six", f_gemma3_six},
                                      {"smollm3", f_smollm3}, {"olmo2", f_olmo2}, {"granite", f_granite},
                                      {"phi3", f_phi3}, {"phi3_window", f_phi3_window}, {"olmo3", f_olmo3},
                                      {"mistral3", f_mistral3}, {"rope_yarn", f_yarn},
                                      {"qwen2moe", f_qwen2moe},
                                      {"deepseek3", f_deepseek3}, {"gpt-oss", f_gptoss}};
    const int T = 11;
    int32_t tokens[T];
    for (int i = 0; i < T; i++) tokens[i] = (i * 37 + 5) % 61;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct toy_llama_config c = base_config();
        cases[i].set(&c);
        struct toy_llama *m = random_model(&c, 40 + i);
        float *full = th_logits(fwd, m, tokens, T, 1);
        struct toy_ctx *ctx = toy_ctx_init(true);
        struct toy_tensor *tok = toy_new_tensor_2d(ctx, TOY_I32, T, 1), *pos = toy_new_tensor_1d(ctx, TOY_I32, T);
        for (int t = 0; t < T; t++) ((int32_t *)tok->data)[t] = tokens[t], ((int32_t *)pos->data)[t] = t;
        struct srv_model sm = toy_srv_model_llama(m);
        struct toy_tensor *y = toy_srv_forward(ctx, &sm, tok, pos, NULL, SRV_OUT_LOGITS_LAST, 0);
        toy_set_output(y);
        struct toy_graph *g = toy_graph_new(ctx);
        toy_graph_build(g, y);
        cr_assert_eq(toy_graph_compute(g, NULL), TOY_OK, "%s", toy_last_error());
        double worst = 0;
        for (int64_t k = 0; k < c.vocab; k++) {
            double want = full[(T - 1) * c.vocab + k];
            worst = fmax(worst, fabs(((float *)y->data)[k] - want) / (1 + fabs(want)));
        }
        cr_expect_leq(worst, 1e-5, "%s: the server's logits differ from the model's by %.2e", cases[i].name, worst);
        toy_ctx_free(ctx);
        free(full);
        toy_llama_free(m);
    }
}

/* c's model, random (seed), saved under th_dir as name and loaded back trainable, after 20 AdamW steps against
 * PyTorch's (ref_llama.py) loss curve: the caller frees it */
static struct toy_llama *trained_vs_torch(struct toy_llama_config c, uint64_t seed, const char *name) {
    struct toy_llama *m0 = random_model(&c, seed);
    char path[400];
    snprintf(path, sizeof path, "%s/%s.gguf", th_dir, name);
    save(m0, path);
    toy_llama_free(m0);
    struct toy_llama *m;
    cr_assert_eq(toy_llama_load(path, true, &m), TOY_OK, "%s", toy_last_error());
    th_train_vs_torch(toy_llama_lm(m), "ref_llama.py", path, 16, 3, 20);
    return m;
}

Test(llama, training_steps_match_pytorch, .timeout = 300) {
    th_mkdir("llama");
    struct toy_llama_config c = base_config();
    c.tied = false;
    toy_llama_free(trained_vs_torch(c, 7, "train"));
    th_rmdir();
}

/* Gemma 3 (QK-norm, sandwich norms, GeGLU, sliding and global layers), SmolLM3 (a layer without RoPE), OLMo 2
 * (norms after, whole-projection QK-norm), Granite (multipliers) and Phi-3 (fused projections split for training,
 * partial rotary with LongRoPE) train: 20 AdamW steps each against PyTorch's loss curve */
Test(llama, newer_families_training_steps_match_pytorch, .timeout = 300) {
    th_mkdir("llama-families-train");
    void (*fams[])(struct toy_llama_config *) = {f_gemma3, f_smollm3, f_olmo2, f_granite, f_phi3, f_olmo3, f_mistral3};
    for (int i = 0; i < 7; i++) {
        struct toy_llama_config c = base_config();
        fams[i](&c);
        if (c.logit_div > 0) c.logit_div = 1.5f; /* Granite's 8 flattens these tiny logits past learning in 20 steps */
        char name[32];
        snprintf(name, sizeof name, "train-%d", i);
        toy_llama_free(trained_vs_torch(c, 7 + (uint64_t)i, name));
    }
    th_rmdir();
}

/* Training a mixture: the router and the experts get gradients (the
 * experts' through MOE_MATMUL_BACK_W, the router's through the weights of
 * the tokens' chosen experts), 20 AdamW steps against PyTorch's loss curve.
 * Mixtral's renormalised softmax, Qwen2-MoE's plain softmax with a gated
 * shared expert and QKV biases, OLMoE's whole-projection QK-norm; and
 * DeepSeek's V2-Lite, V2 and V3 shapes, whose absorbed latent attention
 * trains against the reference's unabsorbed one (the routing bias is no
 * parameter: it only chooses). */
Test(llama, mixture_training_steps_match_pytorch, .timeout = 300) {
    th_mkdir("llama-moe-train");
    void (*fams[])(struct toy_llama_config *) = {f_mixtral, f_qwen2moe, f_olmoe, f_deepseek2, f_deepseek2_qlora, f_deepseek3,
                                                 f_gptoss};
    for (int i = 0; i < 7; i++) {
        struct toy_llama_config c = base_config();
        c.tied = false;
        fams[i](&c);
        char name[32];
        snprintf(name, sizeof name, "train-%d", i);
        struct toy_llama *m = trained_vs_torch(c, i == 5 ? 8 : 7, name);
        if (c.kv_lora_rank) { /* latent attention trains in full, but takes no adapter */
            struct toy_lora *a = NULL;
            struct toy_lora_opts o = {.rank = 4, .seed = 1};
            cr_assert_eq(toy_lora_attach(m, &o, &a), TOY_ERR_UNSUPPORTED);
            cr_assert(strstr(toy_last_error(), "--method full"), "%s", toy_last_error());
        }
        toy_llama_free(m);
    }
    th_rmdir();
}

/* Prefill 5 tokens, then decode one at a time: every position's logits
 * equal the full-sequence forward's. */
static void kv_equals_full_t(struct toy_llama_config c, enum toy_dtype kvt, double tol);
static void kv_equals_full(struct toy_llama_config c) { kv_equals_full_t(c, TOY_F32, 1e-5); }
static void kv_equals_full_t(struct toy_llama_config c, enum toy_dtype kvt, double tol) {
    struct toy_llama *m = random_model(&c, 21);
    const int T = 14, P = 5;
    int32_t tokens[T];
    for (int i = 0; i < T; i++) tokens[i] = (i * 13 + 2) % 61;
    float *full = th_logits(fwd, m, tokens, T, 1);
    struct toy_kv_cache kv;
    cr_assert_eq(toy_kv_cache_init_type(&kv, m, 32, 1, kvt), TOY_OK);
    double worst = th_kv_decode_vs_full(cfwd, m, &kv, tokens, T, P, c.vocab, full);
    cr_log_info("%s, %s cache: KV decode vs full forward: max relative difference %.2e", c.arch, toy_dtype_name(kvt),
                worst);
    cr_assert_leq(worst, tol);
    free(full);
    toy_kv_cache_free(&kv);
    toy_llama_free(m);
}

Test(llama, kv_cache_decode_equals_full_forward) {
    struct toy_llama_config c = base_config();
    kv_equals_full(c);
    kv_equals_full_t(c, TOY_F16, 5e-3); /* f16 cache: K and V rounded to half precision */
    f_gemma2(&c); /* sliding window and softcaps through the cache too */
    kv_equals_full(c);
    c = base_config();
    f_gemma3(&c); /* sliding and global layers of their own RoPE bases */
    kv_equals_full(c);
    c = base_config();
    f_smollm3(&c); /* a layer without RoPE */
    kv_equals_full(c);
    c = base_config();
    f_olmo2(&c); /* norms after, not before */
    kv_equals_full(c);
    c = base_config();
    f_olmo3(&c); /* sliding layers unscaled, global ones with YaRN */
    kv_equals_full(c);
    c = base_config();
    f_mistral3(&c); /* each step's query temperature, read by its position */
    kv_equals_full(c);
    c = base_config();
    f_phi3(&c); /* partial rotary, LongRoPE's long table (the cache's 32 positions, as the full forward's 14, pass
                 * its original 8) */
    kv_equals_full(c);
    c = base_config();
    f_phi3_window(&c); /* its short table (32 and 14 within 32) and a window */
    kv_equals_full(c);
    c = base_config();
    f_qwen3moe(&c); /* one token's experts against all tokens' */
    kv_equals_full(c);
    c = base_config();
    f_gptoss(&c); /* the sinks through the decode step's merge, sliding and global layers, biased experts */
    kv_equals_full(c);
    c = base_config();
    f_deepseek2_qlora(&c); /* the cache holds latents, which are the values too */
    kv_equals_full(c);
    kv_equals_full_t(c, TOY_F16, 5e-3);
    c.kv_lora_rank = 256, c.rope_dim = 16; /* a latent wider than the decode kernels' heads (DeepSeek's 576) */
    kv_equals_full(c);
    kv_equals_full_t(c, TOY_F16, 5e-3);
}

/* gpt-oss as llama.cpp's converter writes it: the experts' matrices in MXFP4, the rest F32. The mapped MXFP4
 * experts give the logits of their dequantized weights (PyTorch's), packed (int8 products) within the
 * activations' 8-bit rounding, and the KV decode equals the full forward over them */
Test(llama, gptoss_mxfp4_experts_run_as_their_dequantized_weights, .timeout = 120) {
    th_mkdir("gptoss-mxfp4");
    struct toy_llama_config c = base_config();
    f_gptoss(&c);
    struct toy_llama *m = random_model(&c, 31);
    char f32[400], mx[400], deq[400];
    snprintf(f32, sizeof f32, "%s/f32.gguf", th_dir);
    snprintf(mx, sizeof mx, "%s/mxfp4.gguf", th_dir);
    snprintf(deq, sizeof deq, "%s/dequantized.gguf", th_dir);
    save(m, f32);
    toy_llama_free(m);
    th_retype_gguf(f32, mx, "_exps.weight", TOY_MXFP4);
    th_retype_gguf(mx, deq, NULL, TOY_F32);
    struct toy_llama *lm;
    cr_assert_eq(toy_llama_load(mx, false, &lm), TOY_OK, "%s", toy_last_error());
    cr_assert(lm->layers[1].ffn_down_exps->type == TOY_MXFP4 && lm->layers[1].wq->type == TOY_F32);
    const int T = 11;
    int32_t tokens[T];
    for (int i = 0; i < T; i++) tokens[i] = (i * 37 + 5) % 61;
    float *ours = th_logits(fwd, lm, tokens, T, 1);
    json_t *tk = json_array(), *row = json_array();
    for (int t = 0; t < T; t++) json_array_append_new(row, json_integer(tokens[t]));
    json_array_append_new(tk, row);
    json_t *specs = json_array();
    json_array_append_new(specs, json_pack("{s:s,s:o}", "gguf", deq, "tokens", tk));
    json_t *res = th_torch("ref_llama.py", specs);
    json_t *ref = json_object_get(json_array_get(json_object_get(res, "cases"), 0), "logits");
    double worst = 0, top = 0;
    for (size_t k = 0; k < json_array_size(ref); k++) {
        double r = json_number_value(json_array_get(ref, k));
        worst = fmax(worst, fabs(ours[k] - r)), top = fmax(top, fabs(r));
    }
    cr_log_info("gpt-oss, MXFP4 experts vs PyTorch on their dequantized weights: max |diff| %.2e of max |logit| %.2f",
                worst, top);
    cr_assert_leq(worst, 1e-4 * top); /* (unpacked: f32 products of the dequantized rows) */
    /* packed as generate and serve pack them: the experts' int8 kernels, activations rounded to 8 bits */
    cr_assert_eq(toy_llama_pack_weights(lm), TOY_OK, "%s", toy_last_error());
    cr_assert(lm->layers[0].ffn_gate_exps->packed, "the MXFP4 experts were not packed");
    float *packed = th_logits(fwd, lm, tokens, T, 1);
    double pw = 0;
    for (size_t k = 0; k < json_array_size(ref); k++) pw = fmax(pw, fabs(packed[k] - json_number_value(json_array_get(ref, k))));
    cr_log_info("gpt-oss, packed MXFP4 experts (int8 products) vs PyTorch: max |diff| %.2e", pw);
    cr_assert(pw <= 2e-2 * top && pw > worst, "packed: %g", pw);
    struct toy_kv_cache kv;
    cr_assert_eq(toy_kv_cache_init(&kv, lm, 32, 1), TOY_OK);
    double kvw = th_kv_decode_vs_full(cfwd, lm, &kv, tokens, T, 4, c.vocab, packed);
    cr_log_info("gpt-oss, packed MXFP4 experts: KV decode vs full forward %.2e", kvw);
    cr_assert_leq(kvw, 1e-4);
    toy_kv_cache_free(&kv);
    free(packed);
    json_decref(res);
    free(ours);
    toy_llama_free(lm);
    th_rmdir();
}

/* A gpt-oss file that lacks one of the parts its graph needs (the sinks, the router's bias) is refused with the
 * part's name, not run as another model */
Test(llama, gptoss_without_its_sinks_or_router_bias_is_refused) {
    th_mkdir("gptoss-parts");
    struct toy_llama_config c = base_config();
    f_gptoss(&c);
    struct toy_llama *m = random_model(&c, 5);
    char full[400], cut[400];
    snprintf(full, sizeof full, "%s/full.gguf", th_dir);
    save(m, full);
    toy_llama_free(m);
    const char *drop[] = {"blk.0.attn_sinks.weight", "blk.0.ffn_gate_inp.bias"}, *want[] = {"sinks", "router bias"};
    for (int i = 0; i < 2; i++) {
        struct toy_gguf *g;
        cr_assert_eq(toy_gguf_open(full, &g), TOY_OK, "%s", toy_last_error());
        struct toy_gguf_writer *w;
        cr_assert_eq(toy_gguf_writer_init(&w), TOY_OK);
        for (int64_t k = 0; k < toy_gguf_n_kv(g); k++) toy_gguf_writer_copy_kv(w, g, k);
        for (int64_t k = 0; k < toy_gguf_n_tensors(g); k++) {
            const struct toy_gguf_tensor *t = toy_gguf_tensor(g, k);
            if (strcmp(t->name, drop[i]))
                cr_assert_eq(toy_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims < 1 ? 1 : t->n_dims, t->ne,
                                                        t->data), TOY_OK);
        }
        snprintf(cut, sizeof cut, "%s/cut-%d.gguf", th_dir, i);
        cr_assert_eq(toy_gguf_writer_write(w, cut), TOY_OK, "%s", toy_last_error());
        toy_gguf_writer_free(w);
        toy_gguf_close(g);
        struct toy_llama *lm = NULL;
        cr_assert_eq(toy_llama_load(cut, false, &lm), TOY_ERR_FORMAT, "%s", toy_last_error());
        cr_assert(strstr(toy_last_error(), want[i]) && strstr(toy_last_error(), "gpt-oss"), "%s", toy_last_error());
        cr_assert_null(lm);
    }
    th_rmdir();
}

/* the layer's up-projections joined in one attn_kv_b {kv_lora, H (nope + v)}, as llama.cpp wrote DeepSeek files
 * before its MLA conversion (2025; most DeepSeek-V2-Lite GGUFs published), key_length and value_length the
 * heads' */
static void write_legacy_deepseek2(const char *from, const char *to, const struct toy_llama_config *c) {
    struct toy_gguf *g;
    cr_assert_eq(toy_gguf_open(from, &g), TOY_OK, "%s", toy_last_error());
    struct toy_gguf_writer *w;
    cr_assert_eq(toy_gguf_writer_init(&w), TOY_OK);
    for (int64_t i = 0; i < toy_gguf_n_kv(g); i++)
        if (!strstr(toy_gguf_kv_key(g, i), "_mla")) cr_assert_eq(toy_gguf_writer_copy_kv(w, g, i), TOY_OK);
    int64_t H = c->n_heads, r = c->kv_lora_rank, dn = c->head_dim - c->rope_dim, dv = c->head_dim_v;
    cr_assert_eq(toy_gguf_writer_set_u32(w, "deepseek2.attention.key_length", (uint32_t)c->head_dim), TOY_OK);
    cr_assert_eq(toy_gguf_writer_set_u32(w, "deepseek2.attention.value_length", (uint32_t)dv), TOY_OK);
    cr_assert_eq(toy_gguf_writer_set_u32(w, "deepseek2.attention.head_count_kv", (uint32_t)H), TOY_OK);
    float *kvb = malloc((size_t)(c->n_layers * H * (dn + dv) * r) * sizeof(float));
    for (int64_t i = 0; i < toy_gguf_n_tensors(g); i++) {
        const struct toy_gguf_tensor *t = toy_gguf_tensor(g, i);
        if (strstr(t->name, ".attn_v_b.")) continue;
        if (!strstr(t->name, ".attn_k_b.")) {
            cr_assert_eq(toy_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data), TOY_OK);
            continue;
        }
        int l = atoi(t->name + 4);
        char vn[64];
        snprintf(vn, sizeof vn, "blk.%d.attn_v_b.weight", l);
        const float *kb = t->data, *vb = toy_gguf_tensor(g, toy_gguf_find_tensor(g, vn))->data;
        float *out = kvb + l * H * (dn + dv) * r;
        for (int64_t h = 0; h < H; h++)
            for (int64_t x = 0; x < r; x++) {
                for (int64_t j = 0; j < dn; j++) out[(h * (dn + dv) + j) * r + x] = kb[(h * r + x) * dn + j];
                for (int64_t j = 0; j < dv; j++) out[(h * (dn + dv) + dn + j) * r + x] = vb[(h * dv + j) * r + x];
            }
        char kn[64];
        snprintf(kn, sizeof kn, "blk.%d.attn_kv_b.weight", l);
        cr_assert_eq(toy_gguf_writer_add_tensor(w, kn, TOY_F32, 2, (int64_t[]){r, H * (dn + dv), 1, 1}, out), TOY_OK);
    }
    cr_assert_eq(toy_gguf_writer_write(w, to), TOY_OK, "%s", toy_last_error());
    toy_gguf_writer_free(w);
    toy_gguf_close(g);
    free(kvb);
}

/* DeepSeek files of both layouts give the same logits; a Q8_0 file (its up-projections quantized too: attn_v_b
 * Q8_0, attn_k_b's rows of 12 F16, multiplied per head as they are) gives nearly them */
Test(llama, deepseek2_files_load_in_both_layouts_and_quantized, .timeout = 120) {
    th_mkdir("deepseek2");
    struct toy_llama_config c = base_config();
    f_deepseek2(&c);
    c.kv_lora_rank = 32; /* attn_v_b {32, dv, H} quantizes (attn_k_b's rows of 12 do not) */
    struct toy_llama *m = random_model(&c, 5);
    char now[400], old[400], q8[400];
    snprintf(now, sizeof now, "%s/mla.gguf", th_dir);
    snprintf(old, sizeof old, "%s/legacy.gguf", th_dir);
    snprintf(q8, sizeof q8, "%s/q8.gguf", th_dir);
    save(m, now);
    toy_llama_free(m);
    write_legacy_deepseek2(now, old, &c);
    cr_assert_eq(toy_gguf_quantize(now, q8, TOY_Q8_0, NULL, NULL), TOY_OK, "%s", toy_last_error());
    const int T = 7;
    int32_t tokens[T];
    for (int i = 0; i < T; i++) tokens[i] = (i * 11 + 3) % 61;
    float *lg[3];
    const char *paths[] = {now, old, q8};
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(toy_llama_load(paths[i], false, &m), TOY_OK, "%s: %s", paths[i], toy_last_error());
        cr_assert(m->cfg.kv_lora_rank == c.kv_lora_rank && m->cfg.head_dim == c.head_dim &&
                  m->cfg.head_dim_v == c.head_dim_v && m->cfg.n_kv_heads == 1, "%s: the config", paths[i]);
        enum toy_dtype kt = i == 2 ? TOY_F16 : TOY_F32, vt = i == 2 ? TOY_Q8_0 : TOY_F32;
        cr_assert(m->layers[1].wk_b->type == kt && m->layers[1].wv_b->type == vt, "%s: up-projections as %s, %s",
                  paths[i], toy_dtype_name(m->layers[1].wk_b->type), toy_dtype_name(m->layers[1].wv_b->type));
        if (i == 2) cr_assert_eq(toy_llama_pack_weights(m), TOY_OK, "%s", toy_last_error());
        lg[i] = th_logits(fwd, m, tokens, T, 1);
        toy_llama_free(m);
    }
    double worst = 0, spread = 0;
    for (int64_t k = 0; k < T * c.vocab; k++) {
        cr_assert_eq(lg[0][k], lg[1][k], "logit %lld: %g (mla) vs %g (legacy)", (long long)k, lg[0][k], lg[1][k]);
        worst = fmax(worst, fabs(lg[2][k] - lg[0][k]));
        spread = fmax(spread, fabs(lg[0][k]));
    }
    cr_log_info("deepseek2 q8_0 vs f32 logits: max difference %.2e of max |logit| %.2f", worst, spread);
    cr_assert(worst < 0.1 * spread, "q8_0 logits %g from f32's (max %g)", worst, spread);
    for (int i = 0; i < 3; i++) free(lg[i]);
    th_rmdir();
}

static int64_t gguf_int(const struct toy_gguf *g, const char *key) {
    int64_t i = toy_gguf_find_key(g, key), v = -1;
    cr_assert(i >= 0, "no key %s", key);
    cr_assert_eq(toy_gguf_kv_int(g, i, &v), TOY_OK, "%s", toy_last_error());
    return v;
}

/* A phi3 file as llama.cpp's converter writes it: q, k, v in one attn_qkv, gate and up in one ffn_up of 2 d_ff,
 * the rotated dims, LongRoPE's tables and attention factor; toy splits them on loading (mapped rows of the fused
 * tensor, of any type) and fuses them again on writing (a Q8_0 file written back from its mapping is the same
 * bytes); the f32 and Q8_0 files' logits agree. A file with half of LongRoPE, or rotating an odd count, is refused. */
Test(llama, phi3_files_keep_llama_cpps_fused_layout, .timeout = 120) {
    th_mkdir("phi3");
    struct toy_llama_config c = base_config();
    f_phi3(&c);
    struct toy_llama *m = random_model(&c, 9);
    char f32[400], q8[400], back[400], half[400];
    snprintf(f32, sizeof f32, "%s/phi3.gguf", th_dir);
    snprintf(q8, sizeof q8, "%s/q8.gguf", th_dir);
    snprintf(back, sizeof back, "%s/back.gguf", th_dir);
    snprintf(half, sizeof half, "%s/half.gguf", th_dir);
    save(m, f32);
    toy_llama_free(m);
    struct toy_gguf *g;
    cr_assert_eq(toy_gguf_open(f32, &g), TOY_OK, "%s", toy_last_error());
    const int64_t dq = 64, dkv = 32;
    const struct {
        const char *name;
        int64_t ne0, ne1;
    } want[] = {{"blk.1.attn_qkv.weight", 64, dq + 2 * dkv}, {"blk.1.ffn_up.weight", 64, 2 * 96},
                {"blk.1.ffn_down.weight", 96, 64},         {"rope_factors_long.weight", 6, 1},
                {"rope_factors_short.weight", 6, 1}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        int64_t ti = toy_gguf_find_tensor(g, want[i].name);
        cr_assert(ti >= 0, "no tensor %s", want[i].name);
        const struct toy_gguf_tensor *t = toy_gguf_tensor(g, ti);
        cr_expect(t->ne[0] == want[i].ne0 && t->ne[1] == want[i].ne1, "%s is [%lld, %lld]", want[i].name,
                  (long long)t->ne[0], (long long)t->ne[1]);
    }
    const char *absent[] = {"blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.attn_v.weight", "blk.0.ffn_gate.weight"};
    for (size_t i = 0; i < 4; i++) cr_expect(toy_gguf_find_tensor(g, absent[i]) < 0, "%s written", absent[i]);
    cr_expect_eq(gguf_int(g, "phi3.rope.dimension_count"), 12);
    cr_expect_eq(gguf_int(g, "phi3.rope.scaling.original_context_length"), 8);
    double af = 0;
    cr_assert_eq(toy_gguf_kv_float(g, toy_gguf_find_key(g, "phi3.rope.scaling.attn_factor"), &af), TOY_OK);
    cr_expect_float_eq(af, 1.19, 1e-6);
    cr_expect(toy_gguf_find_key(g, "phi3.rope.scaling.type") < 0, "LongRoPE has no scaling type in llama.cpp's files");
    /* the same file without its short table; with 11 dims rotated */
    for (int bad = 0; bad < 2; bad++) {
        struct toy_gguf_writer *w;
        cr_assert_eq(toy_gguf_writer_init(&w), TOY_OK);
        for (int64_t i = 0; i < toy_gguf_n_kv(g); i++) cr_assert_eq(toy_gguf_writer_copy_kv(w, g, i), TOY_OK);
        if (bad) cr_assert_eq(toy_gguf_writer_set_u32(w, "phi3.rope.dimension_count", 11), TOY_OK);
        for (int64_t i = 0; i < toy_gguf_n_tensors(g); i++) {
            const struct toy_gguf_tensor *t = toy_gguf_tensor(g, i);
            if (bad || strcmp(t->name, "rope_factors_short.weight"))
                cr_assert_eq(toy_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data), TOY_OK);
        }
        cr_assert_eq(toy_gguf_writer_write(w, half), TOY_OK, "%s", toy_last_error());
        toy_gguf_writer_free(w);
        cr_expect_eq(toy_llama_load(half, false, &m), TOY_ERR_FORMAT);
        cr_expect(strstr(toy_last_error(), bad ? "rope.dimension_count is 11"
                                               : "rope_factors_long.weight but not rope_factors_short.weight"),
                  "%s", toy_last_error());
    }
    toy_gguf_close(g);

    cr_assert_eq(toy_gguf_quantize(f32, q8, TOY_Q8_0, NULL, NULL), TOY_OK, "%s", toy_last_error());
    cr_assert_eq(toy_llama_load(q8, false, &m), TOY_OK, "%s", toy_last_error());
    cr_assert(m->layers[0].wk->type == TOY_Q8_0 && m->layers[0].w_up->type == TOY_Q8_0, "the fused rows, mapped");
    cr_assert_eq(m->cfg.rope_dim, 12);
    th_save_llama(m, TOY_Q8_0, back);
    const int T = 9;
    int32_t tokens[T];
    for (int i = 0; i < T; i++) tokens[i] = (i * 7 + 3) % 61;
    float *lq = th_logits(fwd, m, tokens, T, 1);
    toy_llama_free(m);
    struct toy_gguf *ga, *gb;
    cr_assert_eq(toy_gguf_open(q8, &ga), TOY_OK, "%s", toy_last_error());
    cr_assert_eq(toy_gguf_open(back, &gb), TOY_OK, "%s", toy_last_error());
    cr_assert_eq(toy_gguf_n_tensors(ga), toy_gguf_n_tensors(gb));
    for (int64_t i = 0; i < toy_gguf_n_tensors(ga); i++) { /* the same tensors, the same bytes */
        const struct toy_gguf_tensor *ta = toy_gguf_tensor(ga, i);
        int64_t j = toy_gguf_find_tensor(gb, ta->name);
        cr_assert(j >= 0, "%s not written back", ta->name);
        const struct toy_gguf_tensor *tb = toy_gguf_tensor(gb, j);
        cr_assert(ta->type == tb->type && ta->n_elements == tb->n_elements && ta->ne[1] == tb->ne[1] &&
                      !memcmp(ta->data, tb->data, toy_row_bytes(ta->type, ta->ne[0]) * (size_t)(ta->n_elements / ta->ne[0])),
                  "%s written back as other bytes", ta->name);
    }
    toy_gguf_close(ga);
    toy_gguf_close(gb);
    cr_assert_eq(toy_llama_load(f32, false, &m), TOY_OK, "%s", toy_last_error());
    float *lf = th_logits(fwd, m, tokens, T, 1);
    toy_llama_free(m);
    double worst = 0, spread = 0;
    for (int64_t k = 0; k < T * c.vocab; k++) worst = fmax(worst, fabs(lq[k] - lf[k])), spread = fmax(spread, fabs(lf[k]));
    cr_log_info("phi3 q8_0 vs f32 logits: max difference %.2e of max |logit| %.2f", worst, spread);
    cr_assert(worst < 0.1 * spread, "q8_0 logits %g from f32's (max %g)", worst, spread);
    free(lq);
    free(lf);
    th_rmdir();
}

/* A prefill that keeps only the last position's logits (what generation
 * samples from) gives, for each of two sequences, the full forward's last row. */
Test(llama, prefill_last_logits_equal_full_forward) {
    struct toy_llama_config c = base_config();
    struct toy_llama *m = random_model(&c, 23);
    const int T = 9, B = 2;
    int32_t tokens[T * B];
    for (int i = 0; i < T * B; i++) tokens[i] = (i * 17 + 5) % 61;
    float *full = th_logits(fwd, m, tokens, T, B);
    struct toy_kv_cache kv;
    cr_assert_eq(toy_kv_cache_init(&kv, m, 16, B), TOY_OK);
    struct toy_threadpool *tp = toy_threadpool_new(2);
    struct toy_ctx *ctx = toy_ctx_init(true);
    struct toy_tensor *tok = toy_new_tensor_2d(ctx, TOY_I32, T, B), *pos = toy_new_tensor_1d(ctx, TOY_I32, T);
    memcpy(tok->data, tokens, sizeof tokens);
    for (int i = 0; i < T; i++) ((int32_t *)pos->data)[i] = i;
    struct toy_tensor *lg = toy_llama_forward_cached_last(ctx, m, &kv, tok, pos);
    cr_assert(lg->ne[0] == c.vocab && lg->ne[1] == 1 && lg->ne[2] == B, "last logits {%lld, %lld, %lld}",
              (long long)lg->ne[0], (long long)lg->ne[1], (long long)lg->ne[2]);
    toy_set_output(lg);
    struct toy_graph *g = toy_graph_new(ctx);
    toy_graph_build(g, lg);
    *(int32_t *)kv.n_past->data = 0;
    cr_assert_eq(toy_graph_compute(g, tp), TOY_OK, "%s", toy_last_error());
    for (int b = 0; b < B; b++)
        for (int64_t v = 0; v < c.vocab; v++) {
            float a = ((float *)lg->data)[b * c.vocab + v], e = full[((int64_t)b * T + T - 1) * c.vocab + v];
            cr_assert(fabsf(a - e) <= 1e-5f * (1 + fabsf(e)), "seq %d logit %lld: %g vs %g", b, (long long)v, a, e);
        }
    toy_ctx_free(ctx);
    free(full);
    toy_threadpool_free(tp);
    toy_kv_cache_free(&kv);
    toy_llama_free(m);
}

Test(llama, kv_cache_overflow_is_an_error) {
    struct toy_llama_config c = base_config();
    struct toy_llama *m = random_model(&c, 1);
    struct toy_kv_cache kv;
    cr_assert_eq(toy_kv_cache_init(&kv, m, 4, 1), TOY_OK);
    struct toy_ctx *ctx = toy_ctx_init(true);
    struct toy_tensor *tok = toy_new_tensor_2d(ctx, TOY_I32, 3, 1), *pos = toy_new_tensor_1d(ctx, TOY_I32, 3);
    struct toy_tensor *lg = toy_llama_forward_cached(ctx, m, &kv, tok, pos);
    struct toy_graph *g = toy_graph_new(ctx);
    toy_graph_build(g, lg);
    *(int32_t *)kv.n_past->data = 2; /* 2 + 3 > 4 */
    cr_assert_eq(toy_graph_compute(g, NULL), TOY_ERR_RANGE);
    toy_ctx_free(ctx);
    toy_kv_cache_free(&kv);
    toy_llama_free(m);
}

Test(llama, loads_llamacpp_gguf_from_testdata) {
    const char *path = "../shared/testdata/model-gguf-llama2-tiny-random/model.gguf";
    if (access(path, R_OK)) {
        /* the folder's file name may differ: take the first .gguf */
        FILE *p = popen("ls ../shared/testdata/model-gguf-llama2-tiny-random/*.gguf 2>/dev/null | head -n1", "r");
        static char found[512];
        if (!p || !fgets(found, sizeof found, p)) cr_skip_test("no ../shared/testdata/model-gguf-llama2-tiny-random");
        pclose(p);
        found[strcspn(found, "\n")] = 0;
        path = found;
    }
    struct toy_llama *m;
    cr_assert_eq(toy_llama_load(path, false, &m), TOY_OK, "%s", toy_last_error());
    cr_log_info("%s: %s, vocab %lld, d %lld, %lld layers, %lld heads, tied %d, %s weights", path, m->cfg.arch,
                (long long)m->cfg.vocab, (long long)m->cfg.d_model, (long long)m->cfg.n_layers,
                (long long)m->cfg.n_heads, m->cfg.tied, toy_dtype_name(m->layers[0].wq->type));
    int32_t tokens[6] = {1, 15043, 3186, 29889, 13, 450};
    for (int i = 0; i < 6; i++) tokens[i] %= (int32_t)m->cfg.vocab;
    float *lg = th_logits(fwd, m, tokens, 6, 1);
    for (int64_t i = 0; i < 6 * m->cfg.vocab; i++) cr_assert(isfinite(lg[i]), "logit %lld is %f", (long long)i, lg[i]);
    free(lg);
    toy_llama_free(m);
}

/* llama.cpp's greedy continuation of the random tiny Llama-2 GGUF
 * (../shared/testdata/.../ref_llamacpp_greedy_WEAK.json). The model is random
 * and its top-2 probabilities differ by < 1e-6, so the reference is weak:
 * we require the tokenized prompt and the first 4 tokens (all 32 matched
 * when this test was written, on AVX-512). */
#include "toy/generate.h"

static bool collect(void *ud, int32_t id, const char *text, size_t len, float lp) {
    struct toy_tokens *t = ud;
    (void)text; (void)len; (void)lp;
    if (id < 0) return true;
    if (t->n == t->cap) {
        t->cap = t->cap ? 2 * t->cap : 64;
        t->ids = realloc(t->ids, (size_t)t->cap * sizeof *t->ids);
    }
    t->ids[t->n++] = id;
    return true;
}

Test(llama, greedy_matches_llamacpp_on_testdata_model) {
    const char *dir = "../shared/testdata/model-gguf-llama2-tiny-random";
    char path[512], ref[512];
    snprintf(path, sizeof path, "%s/llama-2-tiny-random.gguf", dir);
    snprintf(ref, sizeof ref, "%s/ref_llamacpp_greedy_WEAK.json", dir);
    if (access(path, R_OK) || access(ref, R_OK)) cr_skip_test("no %s", path);
    json_error_t err;
    json_t *r = json_load_file(ref, 0, &err);
    cr_assert(r);
    struct toy_llama *m;
    cr_assert_eq(toy_llama_load(path, false, &m), TOY_OK, "%s", toy_last_error());
    struct toy_tokenizer *tok;
    cr_assert_eq(toy_tokenizer_load_gguf(m->gguf, &tok), TOY_OK, "%s", toy_last_error());
    struct toy_tokens prompt = {0}, out = {0};
    const char *text = json_string_value(json_object_get(r, "prompt"));
    cr_assert_eq(toy_tokenizer_encode(tok, text, strlen(text), TOY_ENCODE_ADD_BOS, &prompt), TOY_OK);
    json_t *pids = json_object_get(r, "prompt_tokens_with_bos");
    cr_assert_eq(prompt.n, (int64_t)json_array_size(pids));
    for (int64_t i = 0; i < prompt.n; i++) cr_assert_eq(prompt.ids[i], json_integer_value(json_array_get(pids, (size_t)i)));
    struct toy_threadpool *tp = toy_threadpool_new(2);
    struct toy_generator *gen;
    cr_assert_eq(toy_generator_new(m, tok, 128, tp, &gen), TOY_OK);
    struct toy_generate_params gp = {.n_predict = 32, .ignore_eos = true};
    cr_assert_eq(toy_generate(gen, prompt.ids, prompt.n, &gp, collect, &out, NULL), TOY_OK, "%s", toy_last_error());
    json_t *greedy = json_object_get(r, "greedy_tokens");
    int64_t same = 0;
    while (same < out.n && same < (int64_t)json_array_size(greedy) &&
           out.ids[same] == json_integer_value(json_array_get(greedy, (size_t)same)))
        same++;
    cr_log_info("greedy continuation: %lld of %zu tokens equal llama.cpp's", (long long)same, json_array_size(greedy));
    cr_assert_geq(same, 4);
    toy_generator_free(gen);
    toy_threadpool_free(tp);
    toy_tokens_free(&prompt);
    toy_tokens_free(&out);
    toy_tokenizer_free(tok);
    toy_llama_free(m);
    json_decref(r);
}

/* Mixed precision makes no bf16 copy of anything: the forward products,
 * their dX and their weight gradients dW are marked bf16 (the backend
 * rounds both operands as it packs them) and no weight or activation is
 * cast. Each weight's gradient comes from one marked product that
 * accumulates into the parameter's gradient itself: no ACCUM pass. */
Test(llama, bf16_products_are_marked_not_cast) {
    struct toy_llama_config c = base_config();
    struct toy_llama *m = random_model(&c, 29);
    m->matmul_type = TOY_BF16;
    struct toy_ctx *ctx = toy_ctx_init(true);
    struct toy_tensor *tok = toy_new_tensor_2d(ctx, TOY_I32, 8, 2), *tgt = toy_new_tensor_2d(ctx, TOY_I32, 8, 2);
    struct toy_tensor *pos = toy_new_tensor_1d(ctx, TOY_I32, 8);
    struct toy_tensor *loss = toy_cross_entropy(ctx, toy_llama_forward(ctx, m, tok, pos), tgt, -100);
    struct toy_graph *g = toy_graph_new(ctx);
    toy_graph_build(g, loss);
    toy_graph_backward(g, loss);
    int marked = 0, into_grad = 0, attn = 0;
    for (int i = 0; i < toy_graph_n_nodes(g); i++) {
        struct toy_tensor *t = toy_graph_node(g, i);
        cr_assert(t->op != TOY_OP_CAST, "a cast to %s of '%s' under mixed precision", toy_dtype_name(t->type),
                  t->src[0]->name);
        cr_assert(t->op != TOY_OP_ACCUM || t->src[TOY_MAX_SRC - 1]->ne[1] == 1,
                  "gradient of a weight matrix through an ACCUM node (%s)", t->src[TOY_MAX_SRC - 1]->name);
        if (t->op == TOY_OP_MATMUL && t->op_params[P_MM_BF16]) {
            marked++;
            into_grad += t->op_params[P_MM_ACCUM];
        }
        attn += (t->op == TOY_OP_ATTENTION || t->op == TOY_OP_ATTENTION_BACK) && t->op_params[P_AT_BF16];
    }
    int weights = 7 * (int)c.n_layers + 1; /* and the output head */
    cr_log_info("bf16 products: %d marked, %d into a parameter's gradient", marked, into_grad);
    cr_assert_geq(marked, 3 * weights, "%d marked products for %d weights (forward, dX, dW each)", marked, weights);
    cr_assert_geq(into_grad, 7 * c.n_layers, "%d bf16 weight-gradient products accumulate into a parameter",
                  into_grad);
    cr_assert_eq(attn, 2 * (int)c.n_layers, "attention forward and backward marked bf16 in every layer");
    toy_ctx_free(ctx);
    toy_llama_free(m);
}

/* A decode step (the graph, fused, then sampling) makes no heap allocation
 * once the first has run: f16 cache, head size 64 (the all-heads decode
 * attention), greedy and top-k/top-p sampling with a repeat penalty. */
/* A one-token decode step over kv, fused as generators run it: set *tok,
 * *pos and kv's n_past, compute, read *lg. */
static struct toy_graph *decode_graph(struct toy_ctx *ctx, struct toy_llama *m, struct toy_kv_cache *kv,
                                      struct toy_tensor **tok, struct toy_tensor **pos, struct toy_tensor **lg) {
    *tok = toy_new_tensor_2d(ctx, TOY_I32, 1, 1);
    *pos = toy_new_tensor_1d(ctx, TOY_I32, 1);
    *lg = toy_llama_forward_cached(ctx, m, kv, *tok, *pos);
    toy_set_output(*lg);
    struct toy_graph *g = toy_graph_new(ctx);
    toy_graph_build(g, *lg);
    toy_graph_set_fusion(g, true);
    return g;
}

Test(llama, decode_steps_allocate_nothing) {
    struct toy_llama_config c = base_config();
    c.d_model = 128;
    c.n_heads = 2;
    c.n_kv_heads = 1;
    struct toy_llama *m = random_model(&c, 5);
    struct toy_kv_cache kv;
    cr_assert_eq(toy_kv_cache_init_type(&kv, m, 32, 1, TOY_F16), TOY_OK, "%s", toy_last_error());
    struct toy_ctx *ctx = toy_ctx_init(true);
    struct toy_tensor *tok, *pos, *lg;
    struct toy_graph *g = decode_graph(ctx, m, &kv, &tok, &pos, &lg);
    struct toy_threadpool *tp = toy_threadpool_new(2);
    struct toy_sampler *greedy = toy_sampler_new(&(struct toy_sampler_params){0}, c.vocab);
    struct toy_sampler *topp = toy_sampler_new(
        &(struct toy_sampler_params){.temperature = 0.8f, .top_k = 20, .top_p = 0.9f, .repeat_penalty = 1.1f, .seed = 3},
        c.vocab);
    int32_t next = 1;
    for (int step = 0; step < 12; step++) {
        *(int32_t *)kv.n_past->data = step;
        *(int32_t *)tok->data = next;
        *(int32_t *)pos->data = step;
        long before = toy_test_alloc_count();
        cr_assert_eq(toy_graph_compute(g, tp), TOY_OK, "%s", toy_last_error());
        float lp;
        struct toy_sampler *s = step % 2 ? topp : greedy;
        next = toy_sampler_sample(s, lg->data, &lp);
        toy_sampler_accept(s, next);
        long made = toy_test_alloc_count() - before;
        if (step > 1) cr_assert_eq(made, 0, "decode step %d made %ld heap allocations", step, made);
    }
    toy_sampler_free(greedy);
    toy_sampler_free(topp);
    toy_threadpool_free(tp);
    toy_ctx_free(ctx);
    toy_kv_cache_free(&kv);
    toy_llama_free(m);
}

/* Decode graphs fold their norms, SwiGLUs and residual adds into the
 * products (toy_graph_set_fusion), and the q, k and v products fetch the
 * cache rows of the attention they feed (F32 weights through the f32 GEMV,
 * Q8_0/Q4_0 through the packed kernel, where q computes k and v as its
 * siblings, and gate computes up), and each attention rotates its query
 * and new key and stores the new key and value itself (P_AT_FUSED). The
 * fused decode must give the unfused logits and caches bit for bit at
 * every step, at 1 to 3 threads; a position past the cache is the same
 * error either way. mq's weights as they are; `what` names the case;
 * products: 0 f32, 1 packed (the products' counts checked), -1 neither
 * (a family whose biases, norms or GELU change what the products fold). */
static void fused_vs_unfused(struct toy_llama *mq, enum toy_dtype kvt, int products, const char *what) {
    const struct toy_llama_config c = mq->cfg;
    const int64_t ctx_len = 32;
    struct toy_kv_cache kv[2];
    struct toy_ctx *ctx = toy_ctx_init(true);
    struct toy_tensor *tok[2], *pos[2], *lg[2];
    struct toy_graph *g[2];
    for (int f = 0; f < 2; f++) {
        cr_assert_eq(toy_kv_cache_init_type(&kv[f], mq, ctx_len, 1, kvt), TOY_OK, "%s", toy_last_error());
        tok[f] = toy_new_tensor_2d(ctx, TOY_I32, 1, 1);
        pos[f] = toy_new_tensor_1d(ctx, TOY_I32, 1);
        lg[f] = toy_llama_forward_cached(ctx, mq, &kv[f], tok[f], pos[f]);
        toy_set_output(lg[f]);
        g[f] = toy_graph_new(ctx);
        toy_graph_build(g[f], lg[f]);
        toy_graph_set_fusion(g[f], f == 0);
    }
    cr_assert_eq(toy_graph_plan(g[0], NULL, NULL), TOY_OK);
    int prefetching = 0, norms = 0, siblings = 0, fused = 0, led = 0;
    for (int i = 0; i < toy_graph_n_nodes(g[0]); i++) {
        struct toy_tensor *t = toy_graph_node(g[0], i);
        prefetching += t->prefetch != NULL;
        norms += t->op == TOY_OP_RMS_NORM;
        siblings += (t->siblings[0] != NULL) + (t->siblings[1] != NULL);
        fused += t->op == TOY_OP_ATTENTION && t->op_params[P_AT_FUSED];
        led += (t->op == TOY_OP_ROPE || t->op == TOY_OP_KV_STORE) && t->led_by;
    }
    cr_assert_eq(fused, c.n_layers, "%s: %d attentions do their ropes and stores", what, fused);
    cr_assert_eq(led, 4 * c.n_layers, "%s: %d ropes and stores led", what, led);
    if (products >= 0) {
        bool packed = products == 1;
        cr_assert_eq(norms, 0, "%s: %d norms left", what, norms);
        cr_assert_eq(prefetching, (packed ? 1 : 3) * c.n_layers, "%s: %d products prefetch", what, prefetching);
        cr_assert_eq(siblings, packed ? 3 * c.n_layers : 0, "%s: %d products run as siblings", what, siblings);
    }
    cr_assert_lt(toy_graph_n_nodes(g[0]), toy_graph_n_nodes(g[1]));
    for (int nth = 1; nth <= 3; nth++) {
        struct toy_threadpool *tp = toy_threadpool_new(nth);
        for (int step = 0; step < 12; step++) {
            for (int f = 0; f < 2; f++) {
                *(int32_t *)kv[f].n_past->data = step;
                *(int32_t *)tok[f]->data = (step * 7 + 3) % c.vocab;
                *(int32_t *)pos[f]->data = step;
                cr_assert_eq(toy_graph_compute(g[f], tp), TOY_OK, "%s", toy_last_error());
            }
            cr_assert(memcmp(lg[0]->data, lg[1]->data, (size_t)c.vocab * sizeof(float)) == 0,
                      "%s, %s cache, %d threads, step %d: fused logits differ", what, toy_dtype_name(kvt), nth, step);
            for (int64_t l = 0; l < c.n_layers; l++)
                cr_assert(memcmp(kv[0].k[l]->data, kv[1].k[l]->data, toy_nbytes(kv[0].k[l])) == 0 &&
                              memcmp(kv[0].v[l]->data, kv[1].v[l]->data, toy_nbytes(kv[0].v[l])) == 0,
                          "%s, %s cache, %d threads, step %d, layer %lld: fused caches differ", what,
                          toy_dtype_name(kvt), nth, step, (long long)l);
        }
        for (int f = 0; f < 2; f++) { /* the cache is full: both refuse, naming the range */
            *(int32_t *)kv[f].n_past->data = (int32_t)ctx_len;
            *(int32_t *)pos[f]->data = (int32_t)ctx_len;
            cr_assert_eq(toy_graph_compute(g[f], tp), TOY_ERR_RANGE, "%s: %s graph, %d threads", what,
                         f ? "unfused" : "fused", nth);
        }
        toy_threadpool_free(tp);
    }
    toy_ctx_free(ctx);
    toy_kv_cache_free(&kv[0]);
    toy_kv_cache_free(&kv[1]);
}

/* a random model written to GGUF, quantized and loaded, f16 and f32 caches */
Test(llama, fused_decode_matches_unfused, .timeout = 120) {
    th_mkdir("fuse");
    struct toy_llama_config c = base_config();
    c.d_model = 128;
    c.n_heads = 2; /* head size 64: the all-heads decode attention */
    c.n_kv_heads = 1;
    struct toy_llama *m = random_model(&c, 17);
    char f32[300], q[300];
    snprintf(f32, sizeof f32, "%s/m-f32.gguf", th_dir);
    save(m, f32);
    toy_llama_free(m);
    const enum toy_dtype types[] = {TOY_F32, TOY_Q8_0, TOY_Q4_0};
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        snprintf(q, sizeof q, "%s/m-%s.gguf", th_dir, toy_dtype_name(types[ti]));
        if (types[ti] != TOY_F32) cr_assert_eq(toy_gguf_quantize(f32, q, types[ti], NULL, NULL), TOY_OK, "%s", toy_last_error());
        struct toy_llama *mq;
        cr_assert_eq(toy_llama_load(types[ti] == TOY_F32 ? f32 : q, false, &mq), TOY_OK, "%s", toy_last_error());
        cr_assert_eq(toy_llama_pack_weights(mq), TOY_OK);
        fused_vs_unfused(mq, ti % 2 ? TOY_F32 : TOY_F16, types[ti] != TOY_F32, toy_dtype_name(types[ti]));
        toy_llama_free(mq);
    }
    th_rmdir();
}

/* the same over the families' rotations and windows: NeoX with biases,
 * Gemma 2 (alternating window, softcaps), YaRN and linear scaling, a
 * sliding window (12 steps pass the windows of 4 and 5), Qwen3's q and k
 * norms with head size 64; f32 weights */
Test(llama, fused_decode_matches_unfused_every_family, .timeout = 120) {
    const struct flag_case cases[] = {{"qwen2_qkv_bias", f_qwen2}, {"gemma2", f_gemma2}, {"rope_yarn", f_yarn},
                                      {"rope_linear", f_linear},   {"mistral_swa", f_swa},  {"qwen3_qk_norm", f_qwen3},
                                      {"qwen3moe", f_qwen3moe},    {"olmoe", f_olmoe},   {"qwen2moe", f_qwen2moe},
                                      {"phi3", f_phi3},            {"mistral3", f_mistral3}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct toy_llama_config c = base_config();
        cases[i].set(&c);
        c.d_model = 128;
        c.n_heads = 2;
        c.n_kv_heads = 1;
        c.head_dim = 0;
        struct toy_llama *m = random_model(&c, 40 + (uint64_t)i);
        fused_vs_unfused(m, i % 2 ? TOY_F32 : TOY_F16, -1, cases[i].name);
        toy_llama_free(m);
    }
}

/* toy_llama_pack_weights copies a file's float matrices (F32, F16, BF16)
 * into its huge-page block, releases their file pages, and decodes the
 * same bits as from the mapping; $TOY_MAP_WEIGHTS keeps them mapped. */
static void decode_logits(struct toy_llama *m, float *out, int steps) {
    struct toy_kv_cache kv;
    cr_assert_eq(toy_kv_cache_init(&kv, m, 16, 1), TOY_OK, "%s", toy_last_error());
    struct toy_ctx *ctx = toy_ctx_init(true);
    struct toy_tensor *tok, *pos, *lg;
    struct toy_graph *g = decode_graph(ctx, m, &kv, &tok, &pos, &lg);
    struct toy_threadpool *tp = toy_threadpool_new(2);
    for (int s = 0; s < steps; s++) {
        *(int32_t *)kv.n_past->data = s;
        *(int32_t *)tok->data = (s * 5 + 1) % (int32_t)m->cfg.vocab;
        *(int32_t *)pos->data = s;
        cr_assert_eq(toy_graph_compute(g, tp), TOY_OK, "%s", toy_last_error());
        memcpy(out + s * m->cfg.vocab, lg->data, (size_t)m->cfg.vocab * sizeof(float));
    }
    toy_threadpool_free(tp);
    toy_ctx_free(ctx);
    toy_kv_cache_free(&kv);
}

Test(llama, pack_weights_copies_float_matrices_off_the_mapping) {
    th_mkdir("pack");
    struct toy_llama_config c = base_config();
    struct toy_llama *m = random_model(&c, 23);
    const enum toy_dtype types[] = {TOY_F32, TOY_F16, TOY_BF16};
    for (size_t ti = 0; ti < 3; ti++) {
        char path[300];
        snprintf(path, sizeof path, "%s/m-%s.gguf", th_dir, toy_dtype_name(types[ti]));
        th_save_llama(m, types[ti], path);
        const int steps = 4;
        float *want = malloc((size_t)(steps * c.vocab) * sizeof *want), *got = malloc((size_t)(steps * c.vocab) * sizeof *got);
        for (int keep = 1; keep >= 0; keep--) {
            if (keep) setenv("TOY_MAP_WEIGHTS", "1", 1);
            else unsetenv("TOY_MAP_WEIGHTS");
            struct toy_llama *ml;
            cr_assert_eq(toy_llama_load(path, false, &ml), TOY_OK, "%s", toy_last_error());
            struct toy_tensor *wq = ml->layers[0].wq;
            cr_assert(toy_gguf_maps(ml->gguf, wq->data, toy_nbytes(wq)));
            cr_assert_eq(toy_llama_pack_weights(ml), TOY_OK);
            cr_assert_eq(toy_gguf_maps(ml->gguf, wq->data, toy_nbytes(wq)), keep, "%s, TOY_MAP_WEIGHTS %s",
                         toy_dtype_name(types[ti]), keep ? "set" : "unset");
            cr_assert_eq(wq->type, types[ti]);
            if (!keep) cr_assert_eq((uintptr_t)wq->data % 64, 0);
            cr_assert_eq(toy_llama_pack_weights(ml), TOY_OK); /* idempotent */
            decode_logits(ml, keep ? want : got, steps);
            toy_llama_free(ml);
        }
        cr_assert(memcmp(want, got, (size_t)(steps * c.vocab) * sizeof(float)) == 0, "%s: copied weights decode differently",
                  toy_dtype_name(types[ti]));
        free(want);
        free(got);
    }
    toy_llama_free(m);
    th_rmdir();
}

/* ---- mixed-precision inference (toy_llama_infer_bf16, `--bf16`) ---- */

/* The last position's logits of a prefill of tokens[0..T) from an empty
 * cache, as toy_generate runs it; *marked: its products marked bf16, each
 * over f32 or f16 weights */
static void prefill_logits(struct toy_llama *m, const int32_t *tokens, int T, float *out, int *marked) {
    struct toy_kv_cache kv;
    cr_assert_eq(toy_kv_cache_init(&kv, m, 32, 1), TOY_OK, "%s", toy_last_error());
    struct toy_ctx *ctx = toy_ctx_init(true);
    struct toy_tensor *tok = toy_new_tensor_2d(ctx, TOY_I32, T, 1), *pos = toy_new_tensor_1d(ctx, TOY_I32, T);
    memcpy(tok->data, tokens, (size_t)T * sizeof *tokens);
    for (int i = 0; i < T; i++) ((int32_t *)pos->data)[i] = i;
    struct toy_tensor *lg = toy_llama_forward_cached_last(ctx, m, &kv, tok, pos);
    toy_set_output(lg);
    struct toy_graph *g = toy_graph_new(ctx);
    toy_graph_build(g, lg);
    *marked = 0;
    for (int i = 0; i < toy_graph_n_nodes(g); i++) {
        struct toy_tensor *t = toy_graph_node(g, i);
        if (t->op == TOY_OP_MATMUL && t->op_params[P_MM_BF16]) {
            enum toy_dtype wt = t->src[1]->type;
            cr_assert(wt == TOY_F32 || wt == TOY_F16, "a product over %s weights '%s' marked bf16",
                      toy_dtype_name(wt), t->src[1]->name);
            (*marked)++;
        }
    }
    struct toy_threadpool *tp = toy_threadpool_new(2);
    *(int32_t *)kv.n_past->data = 0;
    cr_assert_eq(toy_graph_compute(g, tp), TOY_OK, "%s", toy_last_error());
    memcpy(out, lg->data, (size_t)m->cfg.vocab * sizeof(float));
    toy_threadpool_free(tp);
    toy_ctx_free(ctx);
    toy_kv_cache_free(&kv);
}

/* With toy_llama_infer_bf16 a prompt's products over a file's f32 or f16
 * weights take bf16 operands: the logits move by about bf16's rounding and
 * no more, and the bits differ (the bf16 kernels ran). A decode step (one
 * row) keeps its arithmetic: the same bits as without. Quantized weights
 * keep their int8 kernels: nothing marked, the same bits. */
Test(llama, infer_bf16_rounds_a_prompts_float_products_only, .timeout = 120) {
    th_mkdir("infer-bf16");
    struct toy_llama_config c = base_config();
    struct toy_llama *m0 = random_model(&c, 31);
    const enum toy_dtype types[] = {TOY_F32, TOY_F16, TOY_Q8_0};
    char path[3][400];
    for (int t = 0; t < 3; t++) {
        snprintf(path[t], sizeof path[t], "%s/m-%s.gguf", th_dir, toy_dtype_name(types[t]));
        if (t == 2) {
            cr_assert_eq(toy_gguf_quantize(path[0], path[t], TOY_Q8_0, NULL, NULL), TOY_OK, "%s", toy_last_error());
            continue;
        }
        th_save_llama(m0, types[t], path[t]);
    }
    toy_llama_free(m0);
    if (!toy_cpu_bf16_native()) cr_skip_test("this CPU has no faster bf16 products (%s)", toy_cpu_bf16_gemm());
    const int T = 20, steps = 3;
    int32_t tokens[20];
    for (int i = 0; i < T; i++) tokens[i] = (i * 13 + 3) % (int32_t)c.vocab;
    size_t V = (size_t)c.vocab;
    float *want = malloc(V * sizeof *want), *got = malloc(V * sizeof *got);
    float *dwant = malloc(steps * V * sizeof *dwant), *dgot = malloc(steps * V * sizeof *dgot);
    for (int t = 0; t < 3; t++) {
        const char *tn = toy_dtype_name(types[t]);
        struct toy_llama *m;
        cr_assert_eq(toy_llama_load(path[t], false, &m), TOY_OK, "%s", toy_last_error());
        cr_assert_eq(m->layers[0].wq->type, types[t]);
        cr_assert_eq(toy_llama_pack_weights(m), TOY_OK, "%s", toy_last_error());
        int marked;
        prefill_logits(m, tokens, T, want, &marked);
        cr_assert_eq(marked, 0);
        decode_logits(m, dwant, steps);
        bool on = toy_llama_infer_bf16(m);
        if (types[t] == TOY_Q8_0) { /* nothing to round: unchanged, and so even when set by hand */
            cr_assert_not(on, "bf16 inference over q8_0 matrices only");
            cr_assert_eq(m->matmul_type, TOY_F32);
            m->matmul_type = TOY_BF16;
            m->bf16_float_only = true;
        } else {
            cr_assert(on, "%s", tn);
        }
        prefill_logits(m, tokens, T, got, &marked);
        if (types[t] == TOY_Q8_0) {
            cr_assert_eq(marked, 0, "%d q8_0 products marked bf16", marked);
            cr_assert(memcmp(want, got, V * sizeof(float)) == 0, "q8_0 prefill changed under bf16 inference");
        } else {
            cr_assert_geq(marked, 7 * (int)c.n_layers, "%s: %d products marked bf16 for %lld layers", tn, marked,
                          (long long)c.n_layers);
            double scale = 0, diff = 0;
            for (size_t v = 0; v < V; v++) {
                scale = fmax(scale, fabsf(want[v]));
                diff = fmax(diff, fabsf(got[v] - want[v]));
            }
            cr_log_info("%s, bf16 prefill: max |logit - %s's| %.3g of max |logit| %.3g", tn, tn, diff, scale);
            cr_assert(diff > 0, "%s: a bf16 prefill gave the same bits: its products did not run in bf16", tn);
            cr_assert(diff <= 2e-2 * scale, "%s: bf16 prefill logits off by %g (max |logit| %g)", tn, diff, scale);
        }
        decode_logits(m, dgot, steps);
        cr_assert(memcmp(dwant, dgot, steps * V * sizeof(float)) == 0, "%s: decode steps changed under bf16", tn);
        toy_llama_free(m);
    }
    free(want);
    free(got);
    free(dwant);
    free(dgot);
    th_rmdir();
}


/* a tiny random model (vocabulary 61) with its matrices six times the init's: greedy picks are far apart, and
 * greedy text soon loops */
static struct toy_llama *sharp_tiny_model(void) {
    struct toy_llama_config c = toy_llama_preset("tiny");
    c.vocab = 61;
    struct toy_llama *m = toy_llama_new(&c, 5);
    cr_assert(m, "%s", toy_last_error());
    for (int i = 0; i < toy_llama_n_tensors(m); i++) {
        struct toy_tensor *t = toy_llama_tensor(m, i);
        for (int64_t k = 0; t->ne[1] > 1 && k < toy_nelements(t); k++) ((float *)t->data)[k] *= 6.0f;
    }
    return m;
}

/* A generator reused for a longer prompt that starts with the last call's prompt and reply (a chat's next
 * turn) computes only the new tokens, and samples what a fresh generator samples: the same greedy tokens,
 * log-probabilities within 1e-4 (the prefill runs in two pieces instead of one) */
Test(llama, generator_reuses_the_cached_prefix) {
    struct toy_llama *m = sharp_tiny_model();
    struct toy_threadpool *tp = toy_threadpool_new(2);
    struct toy_generator *reused, *fresh;
    cr_assert_eq(toy_generator_new(m, NULL, 128, tp, &reused), TOY_OK);
    cr_assert_eq(toy_generator_new(m, NULL, 128, tp, &fresh), TOY_OK);
    struct toy_generate_params gp = {.n_predict = 10, .ignore_eos = true, .reuse_cache = true};
    int32_t turn[64] = {1, 7, 9, 12, 40};
    struct th_gen_log a = {0}, b = {0};
    struct toy_generate_result r;
    cr_assert_eq(toy_generate(reused, turn, 5, &gp, th_log_token, &a, &r), TOY_OK, "%s", toy_last_error());
    cr_expect_eq(r.n_cached, 0);
    /* the next turn: the prompt, the reply but its last token (which was never fed), then new tokens */
    int n = 5;
    for (int i = 0; i + 1 < a.n; i++) turn[n++] = a.ids[i];
    int kept = n;
    turn[n++] = 3, turn[n++] = 30, turn[n++] = 2;
    memset(&a, 0, sizeof a);
    cr_assert_eq(toy_generate(reused, turn, n, &gp, th_log_token, &a, &r), TOY_OK, "%s", toy_last_error());
    cr_expect_eq(r.n_cached, kept, "%lld of the %d tokens in the cache were kept", (long long)r.n_cached, kept);
    cr_assert_eq(toy_generate(fresh, turn, n, &gp, th_log_token, &b, NULL), TOY_OK, "%s", toy_last_error());
    cr_assert_eq(a.n, b.n);
    for (int i = 0; i < a.n; i++) {
        cr_expect_eq(a.ids[i], b.ids[i], "token %d", i);
        cr_expect(fabsf(a.lps[i] - b.lps[i]) < 1e-4f, "token %d: %g vs %g", i, a.lps[i], b.lps[i]);
    }
    /* a prompt that shares nothing starts over; without reuse_cache every call does (a benchmark's repeats) */
    int32_t other[3] = {2, 2, 2};
    cr_assert_eq(toy_generate(reused, other, 3, &gp, NULL, NULL, &r), TOY_OK);
    cr_expect_eq(r.n_cached, 0);
    gp.reuse_cache = false;
    cr_assert_eq(toy_generate(reused, other, 3, &gp, NULL, NULL, &r), TOY_OK);
    cr_expect_eq(r.n_cached, 0);
    toy_generator_free(reused);
    toy_generator_free(fresh);
    toy_threadpool_free(tp);
    toy_llama_free(m);
}

/* Prompt lookup (speculative decoding with drafts copied from the context) samples each token from the model's
 * own logits in turn, so it gives plain decoding's tokens and log-probabilities, greedy or sampled, in fewer
 * passes when the text repeats itself (a small random model soon loops); n_predict and the context end it at
 * the same token, and the cache it leaves serves the next turn as plain decoding's does. */
Test(llama, generator_lookup_gives_the_plain_tokens_in_fewer_passes, .timeout = 120) {
    struct toy_llama *m = sharp_tiny_model();
    struct toy_threadpool *tp = toy_threadpool_new(2);
    struct toy_generator *plain, *spec;
    cr_assert_eq(toy_generator_new(m, NULL, 128, tp, &plain), TOY_OK);
    cr_assert_eq(toy_generator_new(m, NULL, 128, tp, &spec), TOY_OK);
    const int32_t prompt[] = {1, 7, 9, 12, 40, 7, 9, 12, 40, 3};
    struct toy_sampler_params greedy = {0}, sampled = {.temperature = 0.9f, .top_k = 20, .seed = 7},
                              penalised = {.temperature = 0.7f, .repeat_penalty = 1.3f, .seed = 3};
    const struct toy_sampler_params *samplers[] = {&greedy, &sampled, &penalised};
    const int lookups[] = {1, 4, TOY_GENERATE_MAX_LOOKUP, 99};
    int64_t accepted = 0;
    for (int si = 0; si < 3; si++) {
        struct toy_generate_params gp = {.n_predict = 60, .ignore_eos = true, .sampling = *samplers[si]};
        struct th_gen_log a = {0};
        struct toy_generate_result ra, rb;
        cr_assert_eq(toy_generate(plain, prompt, 10, &gp, th_log_token, &a, &ra), TOY_OK, "%s", toy_last_error());
        cr_assert_eq(ra.n_drafted, 0);
        cr_assert_eq(ra.n_steps, 59, "a pass per token but the first");
        for (int li = 0; li < 4; li++) {
            gp.lookup = lookups[li];
            struct th_gen_log b = {0};
            cr_assert_eq(toy_generate(spec, prompt, 10, &gp, th_log_token, &b, &rb), TOY_OK, "%s", toy_last_error());
            cr_assert_eq(b.n, a.n, "sampler %d lookup %d", si, gp.lookup);
            for (int i = 0; i < a.n; i++) {
                cr_assert_eq(b.ids[i], a.ids[i], "sampler %d lookup %d: token %d", si, gp.lookup, i);
                cr_assert(fabsf(a.lps[i] - b.lps[i]) < 1e-4f, "sampler %d lookup %d: token %d: %g vs %g", si,
                          gp.lookup, i, a.lps[i], b.lps[i]);
            }
            cr_assert_eq(rb.n_generated, 60);
            cr_assert_leq(rb.n_accepted, rb.n_drafted);
            cr_assert_eq(rb.n_steps, 59 - rb.n_accepted, "each kept draft token saves a pass");
            accepted += rb.n_accepted;
        }
        gp.lookup = 0;
    }
    cr_assert_gt(accepted, 30, "a looping model's drafts are mostly kept (%lld)", (long long)accepted);

    /* the context's end: the same last token */
    struct toy_generator *small_plain, *small_spec;
    cr_assert_eq(toy_generator_new(m, NULL, 40, tp, &small_plain), TOY_OK);
    cr_assert_eq(toy_generator_new(m, NULL, 40, tp, &small_spec), TOY_OK);
    struct toy_generate_params gp = {.ignore_eos = true};
    struct th_gen_log a = {0}, b = {0};
    struct toy_generate_result ra, rb;
    cr_assert_eq(toy_generate(small_plain, prompt, 10, &gp, th_log_token, &a, &ra), TOY_OK);
    gp.lookup = 8;
    cr_assert_eq(toy_generate(small_spec, prompt, 10, &gp, th_log_token, &b, &rb), TOY_OK);
    cr_assert_eq(ra.reason, TOY_STOP_CONTEXT);
    cr_assert_eq(rb.reason, TOY_STOP_CONTEXT);
    cr_assert_eq(rb.n_generated, ra.n_generated);
    cr_assert(!memcmp(a.ids, b.ids, (size_t)a.n * sizeof a.ids[0]));

    /* the next turn reuses the cache a lookup run left: what a fresh generator samples */
    gp = (struct toy_generate_params){.n_predict = 20, .ignore_eos = true, .reuse_cache = true, .lookup = 6};
    memset(&b, 0, sizeof b);
    cr_assert_eq(toy_generate(spec, prompt, 10, &gp, th_log_token, &b, &rb), TOY_OK);
    int32_t turn[64];
    int n = 0;
    for (int i = 0; i < 10; i++) turn[n++] = prompt[i];
    for (int i = 0; i + 1 < b.n; i++) turn[n++] = b.ids[i];
    int kept = n;
    turn[n++] = 5, turn[n++] = 7;
    memset(&a, 0, sizeof a), memset(&b, 0, sizeof b);
    cr_assert_eq(toy_generate(spec, turn, n, &gp, th_log_token, &b, &rb), TOY_OK);
    cr_expect_eq(rb.n_cached, kept);
    gp.reuse_cache = false, gp.lookup = 0;
    cr_assert_eq(toy_generate(plain, turn, n, &gp, th_log_token, &a, &ra), TOY_OK);
    cr_assert_eq(a.n, b.n);
    for (int i = 0; i < a.n; i++) cr_expect_eq(a.ids[i], b.ids[i], "next turn: token %d", i);
    toy_generator_free(small_plain);
    toy_generator_free(small_spec);
    toy_generator_free(plain);
    toy_generator_free(spec);
    toy_threadpool_free(tp);
    toy_llama_free(m);
}

/* Speculative decoding with a draft model: the text is plain decoding's whatever the draft writes (another
 * random model, the model itself, a draft with a shorter context), in 59 - accepted passes; the model drafting
 * for itself greedily has every draft kept, which it can only if the draft's cache follows the text exactly
 * (kept drafts, dropped drafts, the next turn's new tokens); a draft that is not one is refused by name. */
Test(llama, generator_draft_model_gives_the_plain_tokens, .timeout = 120) {
    struct toy_llama *m = sharp_tiny_model();
    struct toy_llama_config c = toy_llama_preset("tiny");
    c.vocab = 61;
    c.n_layers = 1;
    struct toy_llama *other = toy_llama_new(&c, 11);
    cr_assert(other, "%s", toy_last_error());
    struct toy_threadpool *tp = toy_threadpool_new(2);
    struct toy_generator *plain, *spec, *self_draft, *other_draft, *short_draft;
    cr_assert_eq(toy_generator_new(m, NULL, 128, tp, &plain), TOY_OK);
    cr_assert_eq(toy_generator_new(m, NULL, 128, tp, &spec), TOY_OK);
    cr_assert_eq(toy_generator_new(m, NULL, 128, tp, &self_draft), TOY_OK);
    cr_assert_eq(toy_generator_new(other, NULL, 128, tp, &other_draft), TOY_OK);
    cr_assert_eq(toy_generator_new(m, NULL, 30, tp, &short_draft), TOY_OK);
    const int32_t prompt[] = {1, 7, 9, 12, 40, 7, 9, 12, 40, 3};
    struct toy_sampler_params greedy = {0}, sampled = {.temperature = 0.9f, .top_k = 20, .seed = 7};
    const struct toy_sampler_params *samplers[] = {&greedy, &sampled};
    struct toy_generator *drafts[] = {self_draft, other_draft, short_draft, self_draft};
    const int maxes[] = {4, 0, TOY_GENERATE_MAX_LOOKUP, 3}, lookups[] = {0, 0, 0, 4};
    const float p_mins[] = {0, 0, 0.1f, 0};
    for (int si = 0; si < 2; si++) {
        struct toy_generate_params gp = {.n_predict = 60, .ignore_eos = true, .sampling = *samplers[si]};
        struct th_gen_log a = {0};
        cr_assert_eq(toy_generate(plain, prompt, 10, &gp, th_log_token, &a, NULL), TOY_OK, "%s", toy_last_error());
        for (int di = 0; di < 4; di++) {
            gp.draft = drafts[di], gp.draft_max = maxes[di], gp.draft_p_min = p_mins[di], gp.lookup = lookups[di];
            struct th_gen_log b = {0};
            struct toy_generate_result r;
            cr_assert_eq(toy_generate(spec, prompt, 10, &gp, th_log_token, &b, &r), TOY_OK, "%s", toy_last_error());
            cr_assert_eq(b.n, a.n, "sampler %d draft %d", si, di);
            for (int i = 0; i < a.n; i++) {
                cr_assert_eq(b.ids[i], a.ids[i], "sampler %d draft %d: token %d", si, di, i);
                cr_assert(fabsf(a.lps[i] - b.lps[i]) < 1e-4f, "sampler %d draft %d: token %d: %g vs %g", si, di, i,
                          a.lps[i], b.lps[i]);
            }
            cr_assert_gt(r.n_drafted, 0, "sampler %d draft %d", si, di);
            cr_assert_leq(r.n_accepted, r.n_drafted);
            cr_assert_eq(r.n_steps, 59 - r.n_accepted, "sampler %d draft %d: each kept draft token saves a pass", si, di);
            cr_assert_gt(r.n_draft_steps, 0);
            if (di == 2) { /* p_min 0.1 (this model's picks are mostly 0.08-0.18): fewer tokens drafted than without */
                struct toy_generate_result r0;
                gp.draft_p_min = 0;
                cr_assert_eq(toy_generate(spec, prompt, 10, &gp, NULL, NULL, &r0), TOY_OK);
                cr_assert_lt(r.n_drafted, r0.n_drafted, "sampler %d: p_min drafts %lld, none %lld", si,
                             (long long)r.n_drafted, (long long)r0.n_drafted);
            }
            if (si == 0 && di == 0) /* the model drafting for itself, greedily */
                cr_assert_eq(r.n_accepted, r.n_drafted, "its own greedy drafts are all kept (%lld of %lld)",
                             (long long)r.n_accepted, (long long)r.n_drafted);
        }
    }

    /* the next turn: what it shares with the last stays in both caches, and the text is a fresh generator's */
    struct toy_generate_params gp = {.n_predict = 20, .ignore_eos = true, .reuse_cache = true, .draft = self_draft};
    struct th_gen_log a = {0}, b = {0};
    struct toy_generate_result r;
    cr_assert_eq(toy_generate(spec, prompt, 10, &gp, th_log_token, &b, &r), TOY_OK);
    int32_t turn[64];
    int n = 0;
    for (int i = 0; i < 10; i++) turn[n++] = prompt[i];
    for (int i = 0; i < 6; i++) turn[n++] = b.ids[i]; /* the reply cut short, as a chat that edits it: the */
    turn[n++] = 5, turn[n++] = 7;                     /* draft's cache holds other tokens from here on */
    memset(&b, 0, sizeof b);
    cr_assert_eq(toy_generate(spec, turn, n, &gp, th_log_token, &b, &r), TOY_OK);
    cr_assert_eq(r.n_cached, 16);
    cr_assert_eq(r.n_accepted, r.n_drafted, "the draft's cache follows the turns (%lld of %lld kept)",
                 (long long)r.n_accepted, (long long)r.n_drafted);
    struct toy_generate_params pp = {.n_predict = 20, .ignore_eos = true};
    cr_assert_eq(toy_generate(plain, turn, n, &pp, th_log_token, &a, NULL), TOY_OK);
    cr_assert_eq(a.n, b.n);
    for (int i = 0; i < a.n; i++) cr_expect_eq(a.ids[i], b.ids[i], "next turn: token %d", i);

    /* a draft whose context the prompt outgrows drafts nothing, and changes nothing */
    struct toy_generator *tiny_draft;
    cr_assert_eq(toy_generator_new(m, NULL, 8, tp, &tiny_draft), TOY_OK);
    gp = (struct toy_generate_params){.n_predict = 12, .ignore_eos = true, .draft = tiny_draft};
    memset(&a, 0, sizeof a), memset(&b, 0, sizeof b);
    cr_assert_eq(toy_generate(spec, prompt, 10, &gp, th_log_token, &b, &r), TOY_OK, "%s", toy_last_error());
    cr_assert_eq(r.n_drafted, 0);
    pp.n_predict = 12;
    cr_assert_eq(toy_generate(plain, prompt, 10, &pp, th_log_token, &a, NULL), TOY_OK);
    cr_assert(a.n == b.n && !memcmp(a.ids, b.ids, (size_t)a.n * sizeof a.ids[0]));
    toy_generator_free(tiny_draft);

    /* refused: the generator drafting for itself, bad bounds, another vocabulary */
    gp = (struct toy_generate_params){.n_predict = 5, .draft = spec};
    cr_assert_eq(toy_generate(spec, prompt, 10, &gp, NULL, NULL, NULL), TOY_ERR_INVALID_ARG);
    cr_assert(strstr(toy_last_error(), "cache of its own"), "%s", toy_last_error());
    gp.draft = self_draft, gp.draft_max = TOY_GENERATE_MAX_LOOKUP + 1;
    cr_assert_eq(toy_generate(spec, prompt, 10, &gp, NULL, NULL, NULL), TOY_ERR_RANGE);
    gp.draft_max = 0, gp.draft_p_min = 1.5f;
    cr_assert_eq(toy_generate(spec, prompt, 10, &gp, NULL, NULL, NULL), TOY_ERR_RANGE);
    c.vocab = 400;
    struct toy_llama *wide = toy_llama_new(&c, 3);
    struct toy_generator *wide_draft;
    cr_assert_eq(toy_generator_new(wide, NULL, 64, tp, &wide_draft), TOY_OK);
    gp.draft = wide_draft, gp.draft_p_min = 0;
    cr_assert_eq(toy_generate(spec, prompt, 10, &gp, NULL, NULL, NULL), TOY_ERR_INVALID_ARG);
    cr_assert(strstr(toy_last_error(), "400 tokens"), "%s", toy_last_error());
    toy_generator_free(wide_draft);
    toy_llama_free(wide);
    toy_generator_free(short_draft);
    toy_generator_free(other_draft);
    toy_generator_free(self_draft);
    toy_generator_free(plain);
    toy_generator_free(spec);
    toy_threadpool_free(tp);
    toy_llama_free(other);
    toy_llama_free(m);
}
