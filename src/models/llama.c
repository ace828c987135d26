/* llama.c: the Llama-family graph builder, random init and KV cache.
 * Architecture: Touvron et al. 2023 (pre-norm RMSNorm, RoPE, SwiGLU, GQA),
 * with the Qwen2/Qwen3/Mistral/Gemma 2 variations listed in toy/llama.h,
 * following the Hugging Face reference implementations of each family. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <string.h>

#include "toy/device.h"
#include "toy/gguf.h"
#include "toy/llama.h"
#include "toy/rng.h"
#include "toy/file.h"
#include "models/pack-weights.h"

struct toy_llama_config toy_llama_preset(const char *name) {
    struct toy_llama_config c = {0};
    snprintf(c.arch, sizeof c.arch, "llama");
    c.norm_eps = 1e-5f;
    c.rope_base = 10000.0f;
    c.rope_mode = TOY_ROPE_NORMAL;
    c.tied = true;
    if (!name) return c; /* an unknown name: d_model 0 */
    if (!strcmp(name, "tiny")) {
        c.d_model = 64; c.n_layers = 2; c.n_heads = 4; c.n_kv_heads = 2; c.d_ff = 192; c.max_ctx = 128;
    } else if (!strcmp(name, "small")) {
        c.d_model = 256; c.n_layers = 4; c.n_heads = 8; c.n_kv_heads = 4; c.d_ff = 768; c.max_ctx = 256;
    } else if (!strcmp(name, "stories15m")) {
        c.vocab = 32000; c.d_model = 288; c.n_layers = 6; c.n_heads = 6; c.n_kv_heads = 6; c.d_ff = 768;
        c.max_ctx = 256;
    } else if (!strcmp(name, "smollm2-135m")) {
        c.vocab = 49152; c.d_model = 576; c.n_layers = 30; c.n_heads = 9; c.n_kv_heads = 3; c.d_ff = 1536;
        c.max_ctx = 2048; c.rope_base = 100000.0f;
    } else {
        c.d_model = 0;
    }
    return c;
}

const char *toy_pooling_name(enum toy_pooling p) {
    static const char *const names[] = {"none", "mean", "cls", "last", "rank"};
    return p >= 0 && p <= TOY_POOLING_RANK ? names[p] : "?";
}

int64_t toy_llama_head_dim(const struct toy_llama_config *c) {
    return c->head_dim > 0 ? c->head_dim : (c->n_heads > 0 ? c->d_model / c->n_heads : 0);
}

enum toy_status toy_llama_check_config(const struct toy_llama_config *c) {
#define NEED(cond, ...) if (!(cond)) return toy_error(TOY_ERR_INVALID_ARG, __VA_ARGS__)
    NEED(c->vocab > 0 && c->vocab < (1LL << 31), "model config: vocab %lld out of range", (long long)c->vocab);
    NEED(c->d_model > 0, "model config: d_model %lld must be > 0", (long long)c->d_model);
    NEED(c->n_layers > 0 && c->n_layers < 100000, "model config: n_layers %lld out of range", (long long)c->n_layers);
    NEED(c->n_heads > 0, "model config: n_heads %lld must be > 0", (long long)c->n_heads);
    NEED(c->head_dim > 0 || c->d_model % c->n_heads == 0,
         "model config: d_model %lld is not a multiple of n_heads %lld", (long long)c->d_model, (long long)c->n_heads);
    NEED(c->n_kv_heads > 0 && c->n_heads % c->n_kv_heads == 0,
         "model config: n_heads %lld is not a multiple of n_kv_heads %lld", (long long)c->n_heads,
         (long long)c->n_kv_heads);
    NEED(toy_llama_head_dim(c) % 2 == 0, "model config: head dim %lld must be even (RoPE)",
         (long long)toy_llama_head_dim(c));
    NEED(c->d_ff > 0, "model config: d_ff %lld must be > 0", (long long)c->d_ff);
    NEED(c->max_ctx > 0, "model config: context %lld must be > 0", (long long)c->max_ctx);
    /* a NaN or negative number here turns every output into NaN without a word */
    NEED(isfinite(c->norm_eps) && c->norm_eps > 0 && c->norm_eps < 1, "model config: norm epsilon %g is not in (0, 1)",
         (double)c->norm_eps);
    NEED(isfinite(c->rope_base) && c->rope_base > 0, "model config: rope base %g must be > 0", (double)c->rope_base);
    NEED(isfinite(c->rope_base_swa) && c->rope_base_swa >= 0, "model config: sliding layers' rope base %g must be >= 0",
         (double)c->rope_base_swa);
    NEED(c->swa_period >= 0 && c->swa_period <= c->n_layers + 1, "model config: sliding-window period %d for %lld layers",
         (int)c->swa_period, (long long)c->n_layers);
    NEED(!(c->post_norm && c->sandwich_norm), "model config: post_norm (norms after attention and the MLP only) and "
         "sandwich_norm (before and after) exclude each other");
    NEED(isfinite(c->embed_mult) && c->embed_mult >= 0 && isfinite(c->residual_mult) && c->residual_mult >= 0 &&
             isfinite(c->logit_div) && c->logit_div >= 0,
         "model config: Granite's multipliers %g, %g, %g must be >= 0", (double)c->embed_mult, (double)c->residual_mult,
         (double)c->logit_div);
    /* GGUF has keys for them under granite only (llama.cpp reads them there) */
    NEED(!strcmp(c->arch, "granite") || !(c->embed_mult > 0 || c->residual_mult > 0 || c->logit_div > 0),
         "model config: embedding, residual and logit multipliers are architecture granite's, not %s's", c->arch);
    /* llama.cpp fixes SmolLM3's period, and no GGUF key holds another */
    NEED(c->nope_period == toy_llama_arch_rules(c->arch).nope_period, "model config: no rotary embedding on every "
         "%dth layer: architecture %s has %d", (int)c->nope_period, c->arch[0] ? c->arch : "llama",
         (int)toy_llama_arch_rules(c->arch).nope_period);
    NEED(isfinite(c->rope_factor) && c->rope_factor >= 0, "model config: rope scaling factor %g must be >= 0",
         (double)c->rope_factor);
    NEED(isfinite(c->attn_temp_scale) && c->attn_temp_scale >= 0 && (!c->attn_temp_scale || c->rope_orig_ctx > 0),
         "model config: query temperature %g (wants >= 0, and an original context for its steps, not %d)",
         (double)c->attn_temp_scale, (int)c->rope_orig_ctx);
    /* GGUF has its key under mistral3 (llama.cpp reads it there, and for Llama 4) */
    NEED(!strcmp(c->arch, "mistral3") || !c->attn_temp_scale, "model config: a query temperature is architecture "
         "mistral3's, not %s's", c->arch);
    NEED(isfinite(c->attn_softcap) && c->attn_softcap >= 0 && isfinite(c->final_softcap) && c->final_softcap >= 0,
         "model config: logit softcaps %g, %g must be >= 0", (double)c->attn_softcap, (double)c->final_softcap);
    NEED(c->n_experts >= 0 && c->n_experts <= 4096, "model config: %lld experts: want 0 (none) to 4096",
         (long long)c->n_experts);
    NEED(!c->n_experts || (c->n_experts_used >= 1 && c->n_experts_used <= c->n_experts && c->n_experts_used <= 64),
         "model config: %lld experts used of %lld: want 1 to the experts (at most 64)", (long long)c->n_experts_used,
         (long long)c->n_experts);
    NEED(c->d_ff_expert >= 0, "model config: expert d_ff %lld must be >= 0", (long long)c->d_ff_expert);
    NEED(c->d_ff_shared >= 0 && (!c->d_ff_shared || c->n_experts), "model config: shared expert d_ff %lld needs experts",
         (long long)c->d_ff_shared);
    NEED(c->n_dense_lead >= 0 && c->n_dense_lead <= c->n_layers && (!c->n_dense_lead || c->n_experts),
         "model config: %lld leading dense layers of %lld (a mixture's)", (long long)c->n_dense_lead,
         (long long)c->n_layers);
    NEED(isfinite(c->moe_scale) && c->moe_scale >= 0, "model config: expert weights scale %g must be >= 0",
         (double)c->moe_scale);
    NEED(!(c->moe_sigmoid || c->moe_bias) || c->n_experts, "model config: sigmoid routing or a routing bias needs experts");
    /* GGUF has keys for these under deepseek2 only: a model of another architecture would lose them in its file */
    NEED(!strcmp(c->arch, "deepseek2") || !(c->kv_lora_rank || c->n_dense_lead || c->shared_ungated || c->moe_sigmoid ||
                                            c->moe_bias || (c->moe_scale > 0 && c->moe_scale != 1)),
         "model config: latent attention, leading dense layers, ungated shared experts and DeepSeek's routing are "
         "architecture deepseek2's, not %s's", c->arch);
    NEED(isfinite(c->swiglu_limit) && c->swiglu_limit >= 0, "model config: SwiGLU limit %g must be >= 0",
         (double)c->swiglu_limit);
    NEED(!c->moe_biases || c->n_experts, "model config: expert biases need experts");
    /* GGUF has these (tensors, and llama.cpp's fixed clamp) under gpt-oss only */
    NEED(!strcmp(c->arch, "gpt-oss") || !(c->attn_sinks || c->out_bias || c->moe_biases || c->swiglu_limit > 0),
         "model config: attention sinks, an attention-output bias, expert biases and the clamped SwiGLU are "
         "architecture gpt-oss's, not %s's", c->arch);
    NEED(!(c->attn_sinks || c->out_bias) || !c->kv_lora_rank, "model config: latent attention takes no sinks or output bias");
    if (c->kv_lora_rank) {
        int64_t hd = toy_llama_head_dim(c);
        NEED(c->kv_lora_rank > 0 && c->q_lora_rank >= 0, "model config: latent ranks %lld (kv), %lld (q)",
             (long long)c->kv_lora_rank, (long long)c->q_lora_rank);
        NEED(c->rope_dim > 0 && c->rope_dim % 2 == 0 && c->rope_dim < hd,
             "model config: latent attention's rope dims %lld: want even, > 0 and below the head dim %lld",
             (long long)c->rope_dim, (long long)hd);
        NEED(c->head_dim_v > 0, "model config: latent attention's value head dim %lld must be > 0",
             (long long)c->head_dim_v);
        NEED(c->n_kv_heads == 1, "model config: latent attention has one key/value head (the latent), not %lld",
             (long long)c->n_kv_heads);
        NEED(!c->qkv_bias && !c->qk_norm, "model config: latent attention has no QKV bias or QK-norm");
    } else {
        NEED(c->rope_dim >= 0 && c->rope_dim % 2 == 0 && c->rope_dim <= toy_llama_head_dim(c),
             "model config: rotary dims %lld: want 0 (the whole head) or even and at most the head dim %lld",
             (long long)c->rope_dim, (long long)toy_llama_head_dim(c));
    }
#undef NEED
    return TOY_OK;
}

static struct toy_tensor *param(struct toy_llama *m, const char *name, int64_t ne0, int64_t ne1) {
    struct toy_tensor *t = ne1 ? toy_new_tensor_2d(m->ctx, TOY_F32, ne0, ne1) : toy_new_tensor_1d(m->ctx, TOY_F32, ne0);
    toy_set_name(t, "%s", name);
    toy_set_param(t);
    return t;
}

static struct toy_tensor *param3(struct toy_llama *m, const char *name, int64_t ne0, int64_t ne1, int64_t ne2) {
    struct toy_tensor *t = toy_new_tensor_3d(m->ctx, TOY_F32, ne0, ne1, ne2);
    toy_set_name(t, "%s", name);
    toy_set_param(t);
    return t;
}

static void init_normal(struct toy_tensor *t, struct toy_rng *r, float std) {
    toy_rng_fill_normal(r, t->data, toy_nelements(t), std);
}

static void init_ones(struct toy_tensor *t) {
    float *d = t->data;
    for (int64_t i = 0; i < toy_nelements(t); i++) d[i] = 1.0f;
}

/* Allocates the parameter tensors of cfg, named as llama.cpp names them,
 * with zeroed f32 data when alloc_data (random init, trainable loading) or
 * without data (weights mapped from a file). */
struct toy_llama *toy_llama_alloc(const struct toy_llama_config *cfg, bool alloc_data) {
    if (toy_llama_check_config(cfg)) return NULL;
    struct toy_llama *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->cfg = *cfg;
    m->matmul_type = TOY_F32;
    m->ctx = toy_ctx_init(alloc_data);
    m->layers = calloc((size_t)cfg->n_layers, sizeof *m->layers);
    if (!m->ctx || !m->layers) { toy_llama_free(m); return NULL; }
    int64_t d = cfg->d_model, hd = toy_llama_head_dim(cfg), dq = hd * cfg->n_heads, dkv = hd * cfg->n_kv_heads;
    char name[TOY_NAME_MAX];
    m->tok_embd = param(m, "token_embd.weight", d, cfg->vocab);
    for (int64_t l = 0; l < cfg->n_layers; l++) {
        struct toy_llama_layer *L = &m->layers[l];
#define P(field, suffix, a, b)                                            \
        snprintf(name, sizeof name, "blk.%lld." suffix, (long long)l);    \
        L->field = param(m, name, a, b);
        if (!cfg->post_norm) { P(attn_norm, "attn_norm.weight", d, 0); }
        if (cfg->kv_lora_rank) { /* latent attention */
            int64_t H = cfg->n_heads, r = cfg->kv_lora_rank, dr = cfg->rope_dim;
            if (cfg->q_lora_rank) {
                P(wq_a, "attn_q_a.weight", d, cfg->q_lora_rank);
                P(q_a_norm, "attn_q_a_norm.weight", cfg->q_lora_rank, 0);
                P(wq_b, "attn_q_b.weight", cfg->q_lora_rank, dq);
            } else {
                P(wq, "attn_q.weight", d, dq);
            }
            P(wkv_a, "attn_kv_a_mqa.weight", d, r + dr);
            P(kv_a_norm, "attn_kv_a_norm.weight", r, 0);
            snprintf(name, sizeof name, "blk.%lld.attn_k_b.weight", (long long)l);
            L->wk_b = param3(m, name, hd - dr, r, H);
            snprintf(name, sizeof name, "blk.%lld.attn_v_b.weight", (long long)l);
            L->wv_b = param3(m, name, r, cfg->head_dim_v, H);
            dq = cfg->head_dim_v * H; /* attn_output's input */
        } else {
            P(wq, "attn_q.weight", d, dq);
            P(wk, "attn_k.weight", d, dkv);
            P(wv, "attn_v.weight", d, dkv);
        }
        if (cfg->qkv_bias) {
            P(bq, "attn_q.bias", dq, 0);
            P(bk, "attn_k.bias", dkv, 0);
            P(bv, "attn_v.bias", dkv, 0);
        }
        if (cfg->qk_norm) {
            P(q_norm, "attn_q_norm.weight", cfg->qk_norm_full ? dq : hd, 0);
            P(k_norm, "attn_k_norm.weight", cfg->qk_norm_full ? dkv : hd, 0);
        }
        P(wo, "attn_output.weight", dq, d);
        if (cfg->out_bias) { P(bo, "attn_output.bias", d, 0); }
        if (cfg->attn_sinks) { P(attn_sinks, "attn_sinks.weight", cfg->n_heads, 0); }
        dq = hd * cfg->n_heads;
        if (cfg->sandwich_norm || cfg->post_norm) { P(post_attn_norm, "post_attention_norm.weight", d, 0); }
        if (!cfg->post_norm && toy_llama_arch_rules(cfg->arch).ffn_norm_post_attn) {
            P(ffn_norm, "post_attention_norm.weight", d, 0); /* gpt-oss's name for the MLP's norm */
        } else if (!cfg->post_norm) {
            P(ffn_norm, "ffn_norm.weight", d, 0);
        }
        if (cfg->n_experts && l >= cfg->n_dense_lead) {
            int64_t E = cfg->n_experts, fe = cfg->d_ff_expert ? cfg->d_ff_expert : cfg->d_ff;
            P(ffn_gate_inp, "ffn_gate_inp.weight", d, E);
            if (cfg->moe_biases) {
                P(ffn_gate_inp_b, "ffn_gate_inp.bias", E, 0);
                P(ffn_gate_exps_b, "ffn_gate_exps.bias", fe, E);
                P(ffn_up_exps_b, "ffn_up_exps.bias", fe, E);
                P(ffn_down_exps_b, "ffn_down_exps.bias", d, E);
            }
            if (cfg->moe_bias) { /* it only chooses (no gradient reaches it): not trained */
                P(exp_probs_b, "exp_probs_b.bias", E, 0);
                L->exp_probs_b->flags &= ~TOY_FLAG_PARAM;
            }
            snprintf(name, sizeof name, "blk.%lld.ffn_gate_exps.weight", (long long)l);
            L->ffn_gate_exps = param3(m, name, d, fe, E);
            snprintf(name, sizeof name, "blk.%lld.ffn_up_exps.weight", (long long)l);
            L->ffn_up_exps = param3(m, name, d, fe, E);
            snprintf(name, sizeof name, "blk.%lld.ffn_down_exps.weight", (long long)l);
            L->ffn_down_exps = param3(m, name, fe, d, E);
            if (cfg->d_ff_shared) {
                if (!cfg->shared_ungated) { P(ffn_gate_inp_shexp, "ffn_gate_inp_shexp.weight", d, 0); }
                P(ffn_gate_shexp, "ffn_gate_shexp.weight", d, cfg->d_ff_shared);
                P(ffn_up_shexp, "ffn_up_shexp.weight", d, cfg->d_ff_shared);
                P(ffn_down_shexp, "ffn_down_shexp.weight", cfg->d_ff_shared, d);
            }
        } else {
            P(w_gate, "ffn_gate.weight", d, cfg->d_ff);
            P(w_up, "ffn_up.weight", d, cfg->d_ff);
            P(w_down, "ffn_down.weight", cfg->d_ff, d);
        }
        if (cfg->sandwich_norm || cfg->post_norm) { P(post_ffn_norm, "post_ffw_norm.weight", d, 0); }
#undef P
    }
    m->out_norm = param(m, "output_norm.weight", d, 0);
    if (cfg->moe_biases) { /* the input of the experts' down biases (toy_llama_moe_ffn) */
        m->one = toy_set_name(toy_new_tensor_1d(m->ctx, TOY_F32, 1), "one");
        if (!m->one->data) m->one->data = toy_ctx_alloc(m->ctx, sizeof(float));
        *(float *)m->one->data = 1.0f;
        toy_set_frozen(m->one);
    }
    if (cfg->attn_temp_scale > 0) { /* a frozen table of the positions' query scales */
        m->attn_temp = toy_set_name(toy_new_tensor_2d(m->ctx, TOY_F32, 1, cfg->max_ctx), "attn_temp");
        if (!m->attn_temp->data) m->attn_temp->data = toy_ctx_alloc(m->ctx, (size_t)cfg->max_ctx * sizeof(float));
        float *s = m->attn_temp->data;
        for (int64_t p = 0; p < cfg->max_ctx; p++)
            s[p] = (float)(1.0 + cfg->attn_temp_scale * log(1.0 + floor((double)p / (double)cfg->rope_orig_ctx)));
        toy_set_frozen(m->attn_temp);
    }
    m->output = cfg->tied ? m->tok_embd : param(m, "output.weight", d, cfg->vocab);
    return m;
}

struct toy_llama *toy_llama_new(const struct toy_llama_config *cfg, uint64_t seed) {
    struct toy_llama *m = toy_llama_alloc(cfg, true);
    if (!m) return NULL;
    struct toy_rng r;
    toy_rng_seed(&r, seed);
    const float std = 0.02f, std_out = 0.02f / sqrtf(2.0f * (float)cfg->n_layers);
    init_normal(m->tok_embd, &r, std);
    for (int64_t l = 0; l < cfg->n_layers; l++) {
        struct toy_llama_layer *L = &m->layers[l];
        if (L->attn_norm) init_ones(L->attn_norm);
        struct toy_tensor *const w[] = {L->wq, L->wk, L->wv, L->wq_a, L->wq_b, L->wkv_a, L->wk_b, L->wv_b};
        for (size_t i = 0; i < sizeof w / sizeof w[0]; i++)
            if (w[i]) init_normal(w[i], &r, std);
        if (L->q_a_norm) init_ones(L->q_a_norm);
        if (L->kv_a_norm) init_ones(L->kv_a_norm);
        init_normal(L->wo, &r, std_out);
        if (L->q_norm) { init_ones(L->q_norm); init_ones(L->k_norm); }
        if (L->post_attn_norm) init_ones(L->post_attn_norm);
        if (L->ffn_norm) init_ones(L->ffn_norm);
        if (L->ffn_gate_inp) {
            init_normal(L->ffn_gate_inp, &r, std);
            if (L->exp_probs_b) init_normal(L->exp_probs_b, &r, std);
            init_normal(L->ffn_gate_exps, &r, std);
            init_normal(L->ffn_up_exps, &r, std);
            init_normal(L->ffn_down_exps, &r, std_out);
            if (L->ffn_gate_shexp) {
                if (L->ffn_gate_inp_shexp) init_normal(L->ffn_gate_inp_shexp, &r, std);
                init_normal(L->ffn_gate_shexp, &r, std);
                init_normal(L->ffn_up_shexp, &r, std);
                init_normal(L->ffn_down_shexp, &r, std_out);
            }
        } else {
            init_normal(L->w_gate, &r, std);
            init_normal(L->w_up, &r, std);
            init_normal(L->w_down, &r, std_out);
        }
        if (L->post_ffn_norm) init_ones(L->post_ffn_norm);
    }
    init_ones(m->out_norm);
    if (!cfg->tied) init_normal(m->output, &r, std);
    return m;
}

#define WEIGHTS_PER_LAYER 14 /* at most: q (or q_a, q_b), k, v (or kv_a), o and gate, up, down or the router,
                                 the experts' three and the shared expert's three */

/* the matrices inference multiplies by (a tied head too: its row lookups
 * read t->data, a few pages per token) */
static int inference_weights(struct toy_llama *m, struct toy_tensor **out) {
    int n = 0;
    for (int64_t l = 0; l < m->cfg.n_layers; l++) {
        struct toy_llama_layer *L = &m->layers[l];
        /* not attn_k_b and attn_v_b: batched products, a head each (toy_llama_mla_qkv), on the file's rows */
        struct toy_tensor *const w[] = {L->wq,     L->wk,           L->wv,          L->wo,         L->w_gate,
                                        L->w_up,   L->w_down,       L->ffn_gate_inp, L->ffn_gate_exps,
                                        L->ffn_up_exps, L->ffn_down_exps, L->ffn_gate_shexp, L->ffn_up_shexp,
                                        L->ffn_down_shexp, L->wq_a, L->wq_b, L->wkv_a};
        for (size_t i = 0; i < sizeof w / sizeof w[0]; i++)
            if (w[i]) out[n++] = w[i];
    }
    if (m->output) out[n++] = m->output;
    return n;
}

enum toy_status toy_llama_pack_weights(struct toy_llama *m) {
    if (m->pack_block) return TOY_OK;
    struct toy_tensor **w = malloc(((size_t)m->cfg.n_layers * WEIGHTS_PER_LAYER + 1) * sizeof *w);
    if (!w) return toy_error(TOY_ERR_NOMEM, "packing weights");
    enum toy_status st = toy_pack_inference_weights(m->gguf, w, inference_weights(m, w), &m->pack_block, &m->pack_bytes);
    free(w);
    return st;
}

bool toy_llama_infer_bf16(struct toy_llama *m) {
    struct toy_tensor **w = malloc(((size_t)m->cfg.n_layers * WEIGHTS_PER_LAYER + 1) * sizeof *w);
    bool on = w && toy_inference_bf16_pays(w, inference_weights(m, w)); /* else attention too stays as it was */
    free(w);
    if (on) m->matmul_type = TOY_BF16, m->bf16_float_only = true; /* quantized: the int8 kernels are the faster (1.6x) */
    return on;
}

double toy_llama_decode_bytes(const struct toy_llama *m) {
    double bytes = 0, used = m->cfg.n_experts ? (double)m->cfg.n_experts_used / (double)m->cfg.n_experts : 1;
    for (int i = 0; i < toy_llama_n_tensors(m); i++) {
        const struct toy_tensor *t = toy_llama_tensor(m, i);
        bytes += (double)toy_nbytes(t) * (strstr(t->name, "_exps.") ? used : 1); /* a token reads k of E experts */
    }
    if (!m->cfg.tied) bytes -= (double)toy_nbytes(m->tok_embd);
    return bytes;
}

void toy_llama_free(struct toy_llama *m) {
    if (!m) return;
    struct toy_tensor **w = malloc(((size_t)m->cfg.n_layers * WEIGHTS_PER_LAYER + 1) * sizeof *w);
    toy_unpack_inference_weights(w, w ? inference_weights(m, w) : 0, m->pack_block, m->pack_bytes);
    free(w);
    toy_ctx_free(m->ctx);
    toy_gguf_close(m->gguf);
    free(m->layers);
    free(m);
}

/* a layer's parameters in file order (those it has): their count */
#define LAYER_TENSORS 38
static int layer_tensors(const struct toy_llama_layer *L, struct toy_tensor **out) {
    struct toy_tensor *const all[LAYER_TENSORS] = {
        L->attn_norm, L->wq,     L->wq_a,  L->q_a_norm, L->wq_b, L->wkv_a, L->kv_a_norm, L->wk_b, L->wv_b,
        L->wk,           L->wv,          L->wo,           L->bq,        L->bk,
        L->bv,        L->bo,     L->attn_sinks, L->q_norm, L->k_norm,       L->post_attn_norm, L->ffn_norm,
        L->w_gate,    L->w_up,
        L->w_down,    L->ffn_gate_inp, L->ffn_gate_inp_b, L->exp_probs_b, L->ffn_gate_exps, L->ffn_up_exps,
        L->ffn_down_exps, L->ffn_gate_exps_b, L->ffn_up_exps_b, L->ffn_down_exps_b, L->ffn_gate_inp_shexp,
        L->ffn_gate_shexp, L->ffn_up_shexp, L->ffn_down_shexp, L->post_ffn_norm};
    int n = 0;
    for (int k = 0; k < LAYER_TENSORS; k++)
        if (all[k]) out[n++] = all[k];
    return n;
}

int toy_llama_n_tensors(const struct toy_llama *m) {
    int n = 2 + (m->cfg.tied ? 0 : 1) + (m->embd_proj != NULL);
    struct toy_tensor *all[LAYER_TENSORS];
    for (int64_t l = 0; l < m->cfg.n_layers; l++) n += layer_tensors(&m->layers[l], all);
    return n;
}

struct toy_tensor *toy_llama_tensor(const struct toy_llama *m, int i) {
    if (i == 0) return m->tok_embd;
    i--;
    struct toy_tensor *all[LAYER_TENSORS];
    for (int64_t l = 0; l < m->cfg.n_layers; l++) {
        int n = layer_tensors(&m->layers[l], all);
        if (i < n) return all[i];
        i -= n;
    }
    if (i-- == 0) return m->out_norm;
    if (!m->cfg.tied && i-- == 0) return m->output;
    if (m->embd_proj && i == 0) return m->embd_proj;
    return NULL;
}

int64_t toy_llama_n_params(const struct toy_llama *m) {
    int64_t n = 0;
    for (int i = 0; i < toy_llama_n_tensors(m); i++) n += toy_nelements(toy_llama_tensor(m, i));
    return n;
}

/* ---- the graph ---------------------------------------------------------------- */

enum toy_status toy_llama_adaptable(const struct toy_llama *m, const char *what) {
    if (m && m->cfg.kv_lora_rank)
        return toy_error(TOY_ERR_UNSUPPORTED, "%s: a model with latent attention (DeepSeek, kv rank %lld) takes no "
                         "LoRA adapter: its queries, keys and values come through latents, not the q/k/v "
                         "projections adapters go on; fine-tune it in full (toy finetune --method full)",
                         what, (long long)m->cfg.kv_lora_rank);
    return TOY_OK;
}

void toy_llama_qk_norm(struct toy_ctx *ctx, const struct toy_llama_config *c, const struct toy_llama_layer *L,
                       struct toy_tensor **q, struct toy_tensor **k) {
    if (!c->qk_norm) return;
    if (!c->qk_norm_full) {
        *q = toy_rms_norm(ctx, *q, L->q_norm, c->norm_eps);
        *k = toy_rms_norm(ctx, *k, L->k_norm, c->norm_eps);
        return;
    }
    struct toy_tensor *x[2] = {*q, *k}, *w[2] = {L->q_norm, L->k_norm};
    for (int i = 0; i < 2; i++) { /* {hd, H, T, B} as {hd H, T, B}, normed, and back */
        const int64_t *ne = x[i]->ne;
        struct toy_tensor *y = toy_reshape_3d(ctx, x[i], ne[0] * ne[1], ne[2], ne[3]);
        x[i] = toy_reshape(ctx, toy_rms_norm(ctx, y, w[i], c->norm_eps), 4, ne);
    }
    *q = x[0], *k = x[1];
}

struct toy_tensor *toy_llama_glu(struct toy_ctx *ctx, const struct toy_llama_config *c, struct toy_tensor *g,
                                 struct toy_tensor *u) {
    if (c->swiglu_limit > 0) return toy_swiglu_oai(ctx, g, u, TOY_LLAMA_OAI_ALPHA, c->swiglu_limit);
    return c->gelu_mlp ? toy_mul(ctx, toy_gelu(ctx, g), u) : toy_swiglu(ctx, g, u);
}

/* the layer's load-balancing term (toy_llama_moe_ffn): the choices
 * counted as rows of an identity matrix taken by the route's ids */
static struct toy_tensor *moe_balance(struct toy_ctx *ctx, struct toy_tensor *logits, struct toy_tensor *route) {
    int64_t E = logits->ne[0], N = logits->ne[1], k = route->ne[0];
    struct toy_tensor *eye = toy_new_tensor_2d(ctx, TOY_F32, E, E);
    TOY_ASSERT(eye->data, "the load-balancing term needs a context that allocates data");
    memset(eye->data, 0, toy_nbytes(eye));
    for (int64_t e = 0; e < E; e++) ((float *)eye->data)[e * E + e] = 1;
    struct toy_tensor *chosen = toy_reshape_2d(ctx, toy_get_rows(ctx, eye, route), E, k * N); /* one-hot rows */
    struct toy_tensor *f = toy_scale(ctx, toy_sum(ctx, chosen, 1), 1.0f / (float)(k * N));
    struct toy_tensor *P = toy_mean(ctx, toy_softmax(ctx, logits, NULL, 1.0f), 1);
    return toy_scale(ctx, toy_sum_all(ctx, toy_mul(ctx, f, P)), (float)E);
}

struct toy_tensor *toy_llama_moe_ffn(struct toy_ctx *ctx, const struct toy_llama *m,
                                     const struct toy_llama_layer *L, struct toy_tensor *h,
                                     struct toy_tensor **balance) {
    const struct toy_llama_config *c = &m->cfg;
    int64_t d = h->ne[0], N = toy_nrows(h);
    struct toy_tensor *x = toy_reshape_3d(ctx, h, d, 1, N);
    struct toy_tensor *logits = toy_linear(ctx, h, L->ffn_gate_inp, L->ffn_gate_inp_b);
    logits = toy_reshape_2d(ctx, logits, c->n_experts, N);
    struct toy_tensor *route = toy_moe_route_scored(ctx, logits, (int)c->n_experts_used, c->moe_norm, c->moe_sigmoid,
                                                    L->exp_probs_b);
    if (balance) *balance = moe_balance(ctx, logits, route);
    struct toy_tensor *g = toy_moe_matmul(ctx, x, L->ffn_gate_exps, route, false); /* {d_ff, k, N} */
    struct toy_tensor *u = toy_moe_matmul(ctx, x, L->ffn_up_exps, route, false);
    if (L->ffn_gate_exps_b) { /* gpt-oss: each slot's expert's biases, rows of {d_ff, E} */
        g = toy_add(ctx, g, toy_get_rows(ctx, L->ffn_gate_exps_b, route));
        u = toy_add(ctx, u, toy_get_rows(ctx, L->ffn_up_exps_b, route));
    }
    struct toy_tensor *a = toy_llama_glu(ctx, c, g, u);
    struct toy_tensor *f = toy_moe_matmul(ctx, a, L->ffn_down_exps, route, true); /* {d, N} */
    if (L->ffn_down_exps_b) { /* sum_s w_s b[e_s]: the biases as the experts' {1, d} matrices, times a 1 */
        TOY_ASSERT(m->one, "layer with expert biases but no model constant 1");
        struct toy_tensor *like = toy_view(ctx, x, 3, (int64_t[]){1, 1, N}, x->nb, 0); /* (for its shape) */
        struct toy_tensor *ones = toy_repeat(ctx, toy_reshape_3d(ctx, m->one, 1, 1, 1), like);
        struct toy_tensor *bw = toy_reshape_3d(ctx, L->ffn_down_exps_b, 1, d, c->n_experts);
        f = toy_add(ctx, f, toy_moe_matmul(ctx, ones, bw, route, true));
    }
    f = toy_reshape(ctx, f, h->n_dims, h->ne);
    if (c->moe_scale > 0 && c->moe_scale != 1) f = toy_scale(ctx, f, c->moe_scale); /* the sum is linear in them */
    if (L->ffn_gate_shexp) { /* + shared(h), gated by sigmoid(w . h) as (1 + tanh(z / 2)) / 2 (Qwen2-MoE) */
        struct toy_tensor *gs = toy_linear(ctx, h, L->ffn_gate_shexp, NULL), *us = toy_linear(ctx, h, L->ffn_up_shexp, NULL);
        struct toy_tensor *y = toy_linear(ctx, toy_swiglu(ctx, gs, us), L->ffn_down_shexp, NULL);
        if (L->ffn_gate_inp_shexp) {
            struct toy_tensor *z = toy_linear(ctx, h, L->ffn_gate_inp_shexp, NULL); /* {1, ...} */
            y = toy_scale(ctx, toy_add(ctx, y, toy_mul(ctx, y, toy_tanh(ctx, toy_scale(ctx, z, 0.5f)))), 0.5f);
        }
        f = toy_add(ctx, f, y);
    }
    return f;
}

/* x W^T (+ b), in bf16 under mixed precision: the product and its
 * gradients marked, so the backend rounds the f32 master weights (or
 * dequantizes a QLoRA base) to bf16 as it packs them, with no bf16 copy */
static struct toy_tensor *proj(struct toy_ctx *ctx, const struct toy_llama *m, struct toy_tensor *x,
                               struct toy_tensor *w, struct toy_tensor *b) {
    bool bf16 = m->matmul_type == TOY_BF16 && (!m->bf16_float_only || w->type == TOY_F32 || w->type == TOY_F16);
    return toy_linear_bf16(ctx, x, w, b, bf16);
}

/* proj plus the layer's LoRA branch for target t, if attached:
 * y = x W^T (+ b) + scale * (mask * x) A^T B^T */
static struct toy_tensor *proj_lora(struct toy_ctx *ctx, const struct toy_llama *m, const struct toy_llama_layer *L,
                                    enum toy_lora_target t, struct toy_tensor *x, struct toy_tensor *w,
                                    struct toy_tensor *b) {
    struct toy_tensor *y = proj(ctx, m, x, w, b);
    if (!L->lora_a[t]) return y;
    struct toy_tensor *xin = L->lora_mask[t] ? toy_mul(ctx, x, L->lora_mask[t]) : x;
    struct toy_tensor *low = toy_linear(ctx, xin, L->lora_a[t], NULL);  /* (.., r) */
    struct toy_tensor *up = toy_linear(ctx, low, L->lora_b[t], NULL);   /* (.., out) */
    return toy_add(ctx, y, toy_scale(ctx, up, m->lora_scale));
}

struct toy_attn_params toy_llama_attn_params(const struct toy_llama *m, int64_t l) {
    const struct toy_llama_config *c = &m->cfg;
    struct toy_attn_params a = {.causal = true, .scale = toy_llama_attn_scale(c), .softcap = c->attn_softcap};
    if (toy_llama_layer_slides(c, l)) a.window = c->sliding_window;
    a.sinks = m->layers[l].attn_sinks;
    return a;
}

bool toy_llama_layer_slides(const struct toy_llama_config *c, int64_t l) {
    return c->sliding_window > 0 && (c->swa_period == 0 || l % c->swa_period < c->swa_period - 1);
}

struct toy_rope_params toy_llama_rope_params(const struct toy_llama_config *c, int64_t l) {
    struct toy_rope_params r = {0};
    r.mode = c->rope_mode;
    r.freq_base = c->rope_base;
    if (c->rope_base_swa > 0 && toy_llama_layer_slides(c, l)) { /* Gemma 3's local layers: their own base, unscaled */
        r.freq_base = c->rope_base_swa;
        return r;
    }
    r.scaling = c->rope_scaling;
    r.factor = c->rope_factor;
    r.orig_ctx = c->rope_orig_ctx;
    r.low_freq_factor = c->rope_low;
    r.high_freq_factor = c->rope_high;
    r.beta_fast = c->rope_beta_fast;
    r.beta_slow = c->rope_beta_slow;
    r.attn_factor = c->rope_attn_factor;
    if (!c->kv_lora_rank) r.n_dims = (int32_t)c->rope_dim; /* partial rotary (0: the whole head) */
    return r;
}

struct toy_tensor *toy_llama_rope_factors(const struct toy_llama *m, int64_t n_ctx) {
    if (m->rope_freqs || !m->rope_long) return m->rope_freqs;
    return n_ctx > m->cfg.rope_orig_ctx ? m->rope_long : m->rope_short;
}

struct toy_tensor *toy_llama_rope(struct toy_ctx *ctx, const struct toy_llama *m, int64_t l, struct toy_tensor *x,
                                  struct toy_tensor *pos, int64_t n_ctx) {
    const struct toy_llama_config *c = &m->cfg;
    if (c->nope_period > 0 && l % c->nope_period == c->nope_period - 1) return x; /* SmolLM3's NoPE layers */
    struct toy_rope_params r = toy_llama_rope_params(c, l);
    /* Llama 3's per-frequency factors are a scaling: none on sliding layers of their own base */
    struct toy_tensor *ff = c->rope_base_swa > 0 && toy_llama_layer_slides(c, l) ? NULL : toy_llama_rope_factors(m, n_ctx);
    return toy_rope_ff(ctx, x, pos, &r, ff);
}

struct toy_tensor *toy_llama_attn_temp(struct toy_ctx *ctx, const struct toy_llama *m, struct toy_tensor *q,
                                       struct toy_tensor *pos) {
    if (!m->attn_temp) return q;
    int64_t T = q->ne[2], B = toy_nelements(pos) == T ? 1 : q->ne[3];
    struct toy_tensor *s = toy_get_rows(ctx, m->attn_temp, pos); /* {1, T} or {1, T*B} */
    return toy_mul(ctx, q, toy_reshape_4d(ctx, s, 1, 1, T, B));
}

struct toy_tensor *toy_llama_head_out(struct toy_ctx *ctx, const struct toy_llama_config *c, struct toy_tensor *logits) {
    if (c->logit_div > 0) logits = toy_scale(ctx, logits, 1.0f / c->logit_div); /* Granite */
    if (c->final_softcap > 0) { /* Gemma 2: s tanh(logits / s) */
        float s = c->final_softcap;
        logits = toy_scale(ctx, toy_tanh(ctx, toy_scale(ctx, logits, 1.0f / s)), s);
    }
    return logits;
}

float toy_llama_attn_scale(const struct toy_llama_config *c) {
    if (c->attn_scale > 0 || !c->kv_lora_rank) return c->attn_scale;
    float f = c->rope_scaling == TOY_ROPE_SCALING_YARN && c->rope_factor > 1 ? c->rope_factor : 1;
    /* llama.cpp: the rotation's own YaRN factor is 1 when a log multiplier is given, else 1 + 0.1 ln f */
    float m = (c->rope_yarn_log_mul != 0 ? 1.0f : 1.0f + 0.1f * logf(f)) * (1.0f + 0.1f * c->rope_yarn_log_mul * logf(f));
    return m * m / sqrtf((float)toy_llama_head_dim(c));
}

/* q_pe {dr, n, T*B} (a view) rotated, as {dr, n, T, B}: DeepSeek's rope
 * turns adjacent pairs of its rope_dim-wide part (llama.cpp's NORM mode) */
static struct toy_tensor *mla_rope(struct toy_ctx *ctx, const struct toy_llama_config *c, struct toy_tensor *x,
                                   int64_t T, int64_t B, struct toy_tensor *pos) {
    struct toy_rope_params r = toy_llama_rope_params(c, 0); /* (latent attention never slides) */
    r.mode = TOY_ROPE_NORMAL;
    r.n_dims = 0;
    /* the rotation keeps its length: DeepSeek's YaRN magnitude is in attn_scale (the loader's) */
    if (r.scaling == TOY_ROPE_SCALING_YARN) r.attn_factor = 1.0f;
    x = toy_reshape_4d(ctx, toy_cont(ctx, x), x->ne[0], x->ne[1], T, B);
    return toy_rope(ctx, x, pos, &r);
}

void toy_llama_mla_qkv(struct toy_ctx *ctx, const struct toy_llama_config *c, const struct toy_llama_layer *L,
                       struct toy_tensor *h, struct toy_tensor *pos, struct toy_tensor **q_out,
                       struct toy_tensor **kv_out) {
    int64_t T = h->ne[1], B = h->n_dims > 2 ? h->ne[2] : 1, N = T * B, H = c->n_heads;
    int64_t hd = toy_llama_head_dim(c), dr = c->rope_dim, dn = hd - dr, r = c->kv_lora_rank;
    struct toy_tensor *q = L->wq_a ? toy_linear(ctx, toy_rms_norm(ctx, toy_linear(ctx, h, L->wq_a, NULL), L->q_a_norm,
                                                                   c->norm_eps), L->wq_b, NULL)
                                   : toy_linear(ctx, h, L->wq, NULL);
    q = toy_reshape_3d(ctx, q, hd, H, N); /* each head: dn unrotated, then dr rotated */
    size_t es = sizeof(float);
    struct toy_tensor *q_nope = toy_view(ctx, q, 3, (int64_t[]){dn, H, N}, (size_t[]){es, q->nb[1], q->nb[2]}, 0);
    struct toy_tensor *q_pe = toy_view(ctx, q, 3, (int64_t[]){dr, H, N}, (size_t[]){es, q->nb[1], q->nb[2]},
                                       (size_t)dn * es);
    /* absorbed: per head h, q_nope . (Wk_h c) = (Wk_h^T q_nope) . c, a query against the latent */
    struct toy_tensor *qn = toy_cont(ctx, toy_permute(ctx, q_nope, 0, 2, 1, 3));          /* {dn, N, H} */
    struct toy_tensor *ql = toy_matmul(ctx, qn, L->wk_b, false, true);                    /* {r, N, H} */
    ql = toy_cont(ctx, toy_permute(ctx, ql, 0, 2, 1, 3));                                 /* {r, H, N} */
    ql = toy_reshape_4d(ctx, ql, r, H, T, B);
    *q_out = toy_concat(ctx, ql, mla_rope(ctx, c, q_pe, T, B, pos), 0);                  /* {r + dr, H, T, B} */
    struct toy_tensor *kv = toy_linear(ctx, h, L->wkv_a, NULL);                           /* {r + dr, T, B} */
    kv = toy_reshape_2d(ctx, kv, r + dr, N);
    struct toy_tensor *lat = toy_view(ctx, kv, 2, (int64_t[]){r, N}, (size_t[]){es, kv->nb[1]}, 0);
    struct toy_tensor *k_pe = toy_view(ctx, kv, 3, (int64_t[]){dr, 1, N}, (size_t[]){es, kv->nb[1], kv->nb[1]},
                                       (size_t)r * es);
    lat = toy_reshape_4d(ctx, toy_rms_norm(ctx, toy_cont(ctx, lat), L->kv_a_norm, c->norm_eps), r, 1, T, B);
    *kv_out = toy_concat(ctx, lat, mla_rope(ctx, c, k_pe, T, B, pos), 0);                /* {r + dr, 1, T, B} */
}

struct toy_tensor *toy_llama_mla_out(struct toy_ctx *ctx, const struct toy_llama_config *c,
                                     const struct toy_llama_layer *L, struct toy_tensor *a) {
    int64_t H = c->n_heads, r = c->kv_lora_rank, T = a->ne[2], B = a->ne[3], N = T * B;
    if (!toy_is_contiguous(a)) a = toy_cont(ctx, a);
    /* the first r rows of each head: its attention-weighted latent; the rope rows past them are unused */
    struct toy_tensor *lat = toy_view(ctx, a, 3, (int64_t[]){r, H, N}, (size_t[]){a->nb[0], a->nb[1], a->nb[2]}, 0);
    lat = toy_cont(ctx, toy_permute(ctx, lat, 0, 2, 1, 3));                              /* {r, N, H} */
    struct toy_tensor *v = toy_matmul(ctx, lat, L->wv_b, false, true);                   /* {dv, N, H} */
    v = toy_cont(ctx, toy_permute(ctx, v, 0, 2, 1, 3));                                  /* {dv, H, N} */
    return toy_reshape_3d(ctx, v, c->head_dim_v * H, T, B);
}

/* The whole network; with a cache, keys and values go through it. */
static struct toy_tensor *forward(struct toy_ctx *ctx, struct toy_llama *m, struct toy_kv_cache *cache,
                                  struct toy_tensor *tokens, struct toy_tensor *pos, struct toy_tensor *seg,
                                  bool last_only) {
    const struct toy_llama_config *c = &m->cfg;
    int64_t T = tokens->ne[0], B = tokens->ne[1], d = c->d_model;
    int64_t H = c->n_heads, Hkv = c->n_kv_heads, hd = toy_llama_head_dim(c);
    struct toy_tensor *embd = m->tok_embd, *head = m->output;
    if (m->embd_proj) { /* warm start through a learned projection: donor P + residual */
        embd = toy_add(ctx, toy_matmul(ctx, m->embd_donor, m->embd_proj, false, false), m->tok_embd);
        if (head == m->tok_embd) head = embd;
    }
    struct toy_tensor *x = toy_get_rows(ctx, embd, tokens); /* {d, T, B} */
    if (c->embed_scale) x = toy_scale(ctx, x, sqrtf((float)d));
    if (c->embed_mult > 0) x = toy_scale(ctx, x, c->embed_mult); /* Granite */
    int n_moe = 0;
    if (!cache) m->moe_aux_loss = NULL;
    const int64_t n_ctx = cache ? cache->k[0]->ne[2] : T; /* the positions this graph serves (LongRoPE's choice) */
    for (int64_t l = 0; l < c->n_layers; l++) {
        struct toy_llama_layer *L = &m->layers[l];
        struct toy_attn_params attn = toy_llama_attn_params(m, l);
        /* (OLMo 2 norms after attention and the MLP only) */
        struct toy_tensor *h = L->attn_norm ? toy_rms_norm(ctx, x, L->attn_norm, c->norm_eps) : x, *q, *k, *v;
        if (c->kv_lora_rank) { /* latent attention: one key tensor, which is the values too */
            toy_llama_mla_qkv(ctx, c, L, h, pos, &q, &k);
            v = k;
        } else {
            q = toy_reshape_4d(ctx, proj_lora(ctx, m, L, TOY_LORA_Q, h, L->wq, L->bq), hd, H, T, B);
            k = toy_reshape_4d(ctx, proj_lora(ctx, m, L, TOY_LORA_K, h, L->wk, L->bk), hd, Hkv, T, B);
            v = toy_reshape_4d(ctx, proj_lora(ctx, m, L, TOY_LORA_V, h, L->wv, L->bv), hd, Hkv, T, B);
            toy_llama_qk_norm(ctx, c, L, &q, &k);
            q = toy_llama_rope(ctx, m, l, toy_llama_attn_temp(ctx, m, q, pos), pos, n_ctx);
            k = toy_llama_rope(ctx, m, l, k, pos, n_ctx);
        }
        struct toy_tensor *a;
        if (cache) {
            struct toy_tensor *ks = toy_kv_store(ctx, cache->k[l], k, cache->n_past);
            struct toy_tensor *vs = v == k ? ks : toy_kv_store(ctx, cache->v[l], v, cache->n_past);
            a = toy_attention_cached(ctx, q, ks, vs, cache->n_past, &attn);
        } else {
            attn.bf16 = m->matmul_type == TOY_BF16; /* under mixed precision its products too */
            a = toy_attention_seg(ctx, q, k, v, seg, &attn); /* {hd, H, T, B}; seg: packed documents */
        }
        a = c->kv_lora_rank ? toy_llama_mla_out(ctx, c, L, a) : toy_reshape_3d(ctx, a, hd * H, T, B);
        a = proj_lora(ctx, m, L, TOY_LORA_O, a, L->wo, L->bo);
        if (L->post_attn_norm) a = toy_rms_norm(ctx, a, L->post_attn_norm, c->norm_eps);
        if (c->residual_mult > 0) a = toy_scale(ctx, a, c->residual_mult);
        x = toy_add(ctx, x, a);
        h = L->ffn_norm ? toy_rms_norm(ctx, x, L->ffn_norm, c->norm_eps) : x;
        struct toy_tensor *f;
        if (L->ffn_gate_inp) {
            struct toy_tensor *bal = NULL;
            f = toy_llama_moe_ffn(ctx, m, L, h, m->moe_balance && !cache ? &bal : NULL);
            if (bal) {
                m->moe_aux_loss = m->moe_aux_loss ? toy_add(ctx, m->moe_aux_loss, bal) : bal;
                n_moe++;
            }
        } else {
            struct toy_tensor *g = proj_lora(ctx, m, L, TOY_LORA_GATE, h, L->w_gate, NULL);
            struct toy_tensor *u = proj_lora(ctx, m, L, TOY_LORA_UP, h, L->w_up, NULL);
            f = proj_lora(ctx, m, L, TOY_LORA_DOWN, toy_llama_glu(ctx, c, g, u), L->w_down, NULL);
        }
        if (L->post_ffn_norm) f = toy_rms_norm(ctx, f, L->post_ffn_norm, c->norm_eps);
        if (c->residual_mult > 0) f = toy_scale(ctx, f, c->residual_mult);
        x = toy_add(ctx, x, f);
    }
    if (n_moe > 1) m->moe_aux_loss = toy_scale(ctx, m->moe_aux_loss, 1.0f / (float)n_moe);
    if (last_only && T > 1) /* generation needs the next token after the prompt only: skip T-1 head rows */
        x = toy_cont(ctx, toy_view(ctx, x, 3, (int64_t[]){d, 1, B}, (size_t[]){x->nb[0], x->nb[1], x->nb[2]},
                                   (size_t)(T - 1) * x->nb[1]));
    x = toy_rms_norm(ctx, x, m->out_norm, c->norm_eps);
    return toy_llama_head_out(ctx, c, proj(ctx, m, x, head, NULL)); /* {vocab, T, B} */
}

struct toy_tensor *toy_llama_forward(struct toy_ctx *ctx, struct toy_llama *m, struct toy_tensor *tokens,
                                     struct toy_tensor *pos) {
    return forward(ctx, m, NULL, tokens, pos, NULL, false);
}

struct toy_tensor *toy_llama_forward_packed(struct toy_ctx *ctx, struct toy_llama *m, struct toy_tensor *tokens,
                                            struct toy_tensor *pos, struct toy_tensor *seg) {
    return forward(ctx, m, NULL, tokens, pos, seg, false);
}

struct toy_tensor *toy_llama_forward_cached(struct toy_ctx *ctx, struct toy_llama *m, struct toy_kv_cache *c,
                                            struct toy_tensor *tokens, struct toy_tensor *pos) {
    return forward(ctx, m, c, tokens, pos, NULL, false);
}

struct toy_tensor *toy_llama_forward_cached_last(struct toy_ctx *ctx, struct toy_llama *m, struct toy_kv_cache *c,
                                                 struct toy_tensor *tokens, struct toy_tensor *pos) {
    return forward(ctx, m, c, tokens, pos, NULL, true);
}

/* ---- KV cache ------------------------------------------------------------------ */

enum toy_status toy_kv_cache_init(struct toy_kv_cache *c, const struct toy_llama *m, int64_t n_ctx, int64_t n_seq) {
    if (!c) return toy_error(TOY_ERR_INVALID_ARG, "toy_kv_cache_init: c is NULL");
    return toy_kv_cache_init_type(c, m, n_ctx, n_seq, TOY_F32);
}

/* A model's full context can be far more than the machine holds (128k positions): an error naming the size,
 * not an abort inside the arena. The probe allocation is returned at once (with overcommit it costs nothing). */
enum toy_status toy_kv_cache_check_size(int64_t n_layers, int64_t row, int64_t n_ctx, int64_t n_seq,
                                        enum toy_dtype type) {
    double bytes = 2.0 * (double)n_layers * (double)row * (double)n_ctx * (double)n_seq *
                   (double)toy_dtype_type_size(type);
    double ram = toy_ram_bytes();
    void *probe = bytes < 9e18 && (ram <= 0 || bytes <= ram) ? malloc((size_t)bytes + 1) : NULL;
    if (!probe)
        return toy_error(TOY_ERR_NOMEM,
                         "kv cache: %lld positions x %lld sequences x %lld layers need %.1f GiB, more than this "
                         "machine has (%.1f GiB); ask for a shorter context (--ctx)",
                         (long long)n_ctx, (long long)n_seq, (long long)n_layers, bytes / (1 << 30), ram / (1 << 30));
    free(probe);
    return TOY_OK;
}

enum toy_status toy_kv_cache_init_type(struct toy_kv_cache *c, const struct toy_llama *m, int64_t n_ctx, int64_t n_seq,
                                       enum toy_dtype type) {
    if (!c) return toy_error(TOY_ERR_INVALID_ARG, "toy_kv_cache_init_type: c is NULL");
    memset(c, 0, sizeof *c);
    if (type != TOY_F32 && type != TOY_F16)
        return toy_error(TOY_ERR_UNSUPPORTED, "kv cache type %s (f32 or f16)", toy_dtype_name(type));
    int64_t L = m->cfg.n_layers, hd = toy_llama_head_dim(&m->cfg), Hkv = m->cfg.n_kv_heads;
    /* latent attention: one latent key a position (kv_lora + rope_dim), which is the values too */
    bool mla = m->cfg.kv_lora_rank > 0;
    if (mla) hd = m->cfg.kv_lora_rank + m->cfg.rope_dim, Hkv = 1;
    if (n_ctx <= 0 || n_seq <= 0) return toy_error(TOY_ERR_INVALID_ARG, "kv cache: context %lld, sequences %lld",
                                                   (long long)n_ctx, (long long)n_seq);
    /* (k and v: latent attention's one tensor counts half a layer's two) */
    enum toy_status fit = toy_kv_cache_check_size(L, mla ? (hd + 1) / 2 : hd * Hkv, n_ctx, n_seq, type);
    if (fit) return fit;
    /* one zeroed block; its pages come as positions are written */
    size_t row = toy_row_bytes(type, hd) * (size_t)Hkv, per = (row * (size_t)n_ctx * (size_t)n_seq + 63) / 64 * 64;
    c->ctx = toy_ctx_init(false);
    c->k = calloc((size_t)L, sizeof *c->k);
    c->v = calloc((size_t)L, sizeof *c->v);
    c->block_bytes = (mla ? 1 : 2) * (size_t)L * per;
    c->block = c->ctx && c->k && c->v ? toy_stream_alloc(c->block_bytes) : NULL;
#ifdef MADV_NOHUGEPAGE
    /* ordinary pages, even where THP is "always": a 2 MiB page here holds
     * thousands of one layer's positions, so a short prompt's first token
     * would zero 2 x layers huge pages (120 MiB for SmolLM2 at 8192) before
     * it is out; on this VM that cost 50-450 ms of a 4-token prefill. Decode
     * at 2000 positions ran within 1.5% either way (q8_0, 2 threads). */
    if (c->block) madvise(c->block, c->block_bytes, MADV_NOHUGEPAGE);
#endif
    if (!c->block) {
        toy_kv_cache_free(c);
        return toy_error(TOY_ERR_NOMEM, "kv cache: %lld layers x %lld positions", (long long)L, (long long)n_ctx);
    }
    c->n_layers = L;
    c->n_ctx = n_ctx;
    c->n_seq = n_seq;
    char *at = c->block;
    for (int64_t l = 0; l < L; l++) {
        c->k[l] = toy_set_name(toy_new_tensor_4d(c->ctx, type, hd, Hkv, n_ctx, n_seq), "cache_k.%lld", (long long)l);
        c->k[l]->data = at;
        at += per;
        if (mla) { c->v[l] = c->k[l]; continue; }
        c->v[l] = toy_set_name(toy_new_tensor_4d(c->ctx, type, hd, Hkv, n_ctx, n_seq), "cache_v.%lld", (long long)l);
        c->v[l]->data = at;
        at += per;
    }
    c->n_past = toy_set_name(toy_new_tensor_1d(c->ctx, TOY_I32, 1), "n_past");
    c->n_past->data = toy_ctx_alloc(c->ctx, sizeof(int32_t));
    return TOY_OK;
}

void toy_kv_cache_free(struct toy_kv_cache *c) {
    if (!c) return;
    toy_ctx_free(c->ctx);
    toy_stream_free(c->block, c->block_bytes);
    free(c->k);
    free(c->v);
    memset(c, 0, sizeof *c);
}

size_t toy_kv_cache_bytes(const struct toy_kv_cache *c) {
    if (c->block_bytes || !c->k) return c->block_bytes;
    size_t n = 0; /* a view, or a cache in its context's memory: the bytes its tensors span */
    for (int64_t l = 0; l < c->n_layers; l++) n += toy_nbytes(c->k[l]) + (c->v[l] != c->k[l] ? toy_nbytes(c->v[l]) : 0);
    return n;
}

enum toy_status toy_kv_cache_view_seq(struct toy_kv_cache *view, const struct toy_kv_cache *pool, int64_t seq) {
    if (!view || !pool || !pool->k) return toy_error(TOY_ERR_INVALID_ARG, "toy_kv_cache_view_seq: no cache");
    memset(view, 0, sizeof *view);
    if (seq < 0 || seq >= pool->n_seq)
        return toy_error(TOY_ERR_INVALID_ARG, "kv cache view: sequence %lld of %lld", (long long)seq,
                         (long long)pool->n_seq);
    const int64_t L = pool->n_layers;
    view->ctx = toy_ctx_init(false);
    view->k = calloc((size_t)L, sizeof *view->k);
    view->v = calloc((size_t)L, sizeof *view->v);
    if (!view->ctx || !view->k || !view->v) {
        toy_kv_cache_free(view);
        return toy_error(TOY_ERR_NOMEM, "kv cache view");
    }
    view->n_layers = L;
    view->n_ctx = pool->n_ctx;
    view->n_seq = 1;
    for (int64_t l = 0; l < L; l++)
        for (int kv = 0; kv < 2; kv++) {
            const struct toy_tensor *p = kv ? pool->v[l] : pool->k[l];
            struct toy_tensor **t = kv ? &view->v[l] : &view->k[l];
            if (kv && pool->v[l] == pool->k[l]) { /* latent attention: one tensor */
                *t = view->k[l];
                continue;
            }
            *t = toy_set_name(toy_new_tensor_4d(view->ctx, p->type, p->ne[0], p->ne[1], p->ne[2], 1), "%s.seq%lld",
                              p->name, (long long)seq);
            (*t)->data = (char *)p->data + (size_t)seq * p->nb[3];
        }
    view->n_past = toy_set_name(toy_new_tensor_1d(view->ctx, TOY_I32, 1), "n_past");
    view->n_past->data = toy_ctx_alloc(view->ctx, sizeof(int32_t));
    return TOY_OK;
}

/* ---- the generic interface ---------------------------------------------------------- */

static struct toy_tensor *lm_forward(void *self, struct toy_ctx *ctx, struct toy_tensor *tokens,
                                     struct toy_tensor *pos) {
    return toy_llama_forward(ctx, self, tokens, pos);
}
static int lm_n_tensors(void *self) { return toy_llama_n_tensors(self); }
static struct toy_tensor *lm_tensor(void *self, int i) { return toy_llama_tensor(self, i); }
static enum toy_status lm_write(void *self, struct toy_gguf_writer *w, enum toy_dtype type) {
    return toy_llama_write_gguf(self, w, type);
}
static void lm_matmul(void *self, enum toy_dtype type) { ((struct toy_llama *)self)->matmul_type = type; }

static enum toy_status lm_pack(void *self) { return toy_llama_pack_weights(self); }
static enum toy_status lm_cache(void *self, struct toy_kv_cache *c, int64_t n_ctx, int64_t n_seq, enum toy_dtype type) {
    return toy_kv_cache_init_type(c, self, n_ctx, n_seq, type);
}
static struct toy_tensor *lm_cached(void *self, struct toy_ctx *ctx, struct toy_kv_cache *c, struct toy_tensor *tokens,
                                    struct toy_tensor *pos, bool last_only) {
    return forward(ctx, self, c, tokens, pos, NULL, last_only);
}

struct toy_lm toy_llama_lm(struct toy_llama *m) {
    return (struct toy_lm){.self = m, .arch = m->cfg.arch[0] ? m->cfg.arch : "llama", .vocab = m->cfg.vocab,
                           .max_ctx = m->cfg.max_ctx, .forward = lm_forward, .n_tensors = lm_n_tensors,
                           .tensor = lm_tensor, .write_gguf = lm_write, .set_matmul_type = lm_matmul, .llama = m,
                           .pack_weights = lm_pack, .cache_init = lm_cache, .forward_cached = lm_cached};
}
