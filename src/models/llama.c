/* llama.c: the Llama-family graph builder and random init.
 * Architecture: Touvron et al. 2023 (pre-norm RMSNorm, RoPE NeoX-style as in
 * llama.cpp's "llama" GGUFs after conversion, SwiGLU, GQA). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "toy/llama.h"
#include "toy/rng.h"

struct toy_llama_config toy_llama_preset(const char *name) {
    struct toy_llama_config c = {0};
    c.norm_eps = 1e-5f;
    c.rope_base = 10000.0f;
    if (!strcmp(name, "tiny")) {
        c.d_model = 64; c.n_layers = 2; c.n_heads = 4; c.n_kv_heads = 2; c.d_ff = 192; c.max_ctx = 128; c.tied = true;
    } else if (!strcmp(name, "small")) {
        c.d_model = 256; c.n_layers = 4; c.n_heads = 8; c.n_kv_heads = 4; c.d_ff = 768; c.max_ctx = 256; c.tied = true;
    } else if (!strcmp(name, "stories15m")) {
        c.vocab = 32000; c.d_model = 288; c.n_layers = 6; c.n_heads = 6; c.n_kv_heads = 6; c.d_ff = 768;
        c.max_ctx = 256; c.tied = true;
    } else if (!strcmp(name, "smollm2-135m")) {
        c.vocab = 49152; c.d_model = 576; c.n_layers = 30; c.n_heads = 9; c.n_kv_heads = 3; c.d_ff = 1536;
        c.max_ctx = 2048; c.tied = true; c.rope_base = 100000.0f;
    } else {
        c.d_model = 0;
    }
    return c;
}

enum toy_status toy_llama_check_config(const struct toy_llama_config *c) {
#define NEED(cond, ...) if (!(cond)) return toy_error(TOY_ERR_INVALID_ARG, __VA_ARGS__)
    NEED(c->vocab > 0, "model config: vocab %lld must be > 0", (long long)c->vocab);
    NEED(c->d_model > 0, "model config: d_model %lld must be > 0", (long long)c->d_model);
    NEED(c->n_layers > 0, "model config: n_layers %lld must be > 0", (long long)c->n_layers);
    NEED(c->n_heads > 0 && c->d_model % c->n_heads == 0,
         "model config: d_model %lld is not a multiple of n_heads %lld", (long long)c->d_model, (long long)c->n_heads);
    NEED(c->n_kv_heads > 0 && c->n_heads % c->n_kv_heads == 0,
         "model config: n_heads %lld is not a multiple of n_kv_heads %lld", (long long)c->n_heads,
         (long long)c->n_kv_heads);
    NEED((c->d_model / c->n_heads) % 2 == 0, "model config: head dim %lld must be even (RoPE)",
         (long long)(c->d_model / c->n_heads));
    NEED(c->d_ff > 0, "model config: d_ff %lld must be > 0", (long long)c->d_ff);
    NEED(c->max_ctx > 0, "model config: context %lld must be > 0", (long long)c->max_ctx);
#undef NEED
    return TOY_OK;
}

static struct toy_tensor *param(struct toy_llama *m, const char *name, int64_t ne0, int64_t ne1) {
    struct toy_tensor *t = ne1 ? toy_new_tensor_2d(m->ctx, TOY_F32, ne0, ne1) : toy_new_tensor_1d(m->ctx, TOY_F32, ne0);
    toy_set_name(t, "%s", name);
    toy_set_param(t);
    return t;
}

static void init_normal(struct toy_tensor *t, struct toy_rng *r, float std) {
    float *d = t->data;
    for (int64_t i = 0; i < toy_nelements(t); i++) d[i] = std * toy_rng_normal(r);
}

static void init_ones(struct toy_tensor *t) {
    float *d = t->data;
    for (int64_t i = 0; i < toy_nelements(t); i++) d[i] = 1.0f;
}

struct toy_llama *toy_llama_new(const struct toy_llama_config *cfg, uint64_t seed) {
    if (toy_llama_check_config(cfg)) return NULL;
    struct toy_llama *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->cfg = *cfg;
    m->ctx = toy_ctx_init(true);
    m->layers = calloc((size_t)cfg->n_layers, sizeof *m->layers);
    if (!m->ctx || !m->layers) { toy_llama_free(m); return NULL; }
    int64_t d = cfg->d_model, hd = d / cfg->n_heads, dkv = hd * cfg->n_kv_heads;
    struct toy_rng r;
    toy_rng_seed(&r, seed);
    const float std = 0.02f, std_out = 0.02f / sqrtf(2.0f * (float)cfg->n_layers);
    char name[TOY_NAME_MAX];
    m->tok_embd = param(m, "token_embd.weight", d, cfg->vocab);
    init_normal(m->tok_embd, &r, std);
    for (int64_t l = 0; l < cfg->n_layers; l++) {
        struct toy_llama_layer *L = &m->layers[l];
#define P(field, suffix, a, b, init)                                      \
        snprintf(name, sizeof name, "blk.%lld." suffix, (long long)l);    \
        L->field = param(m, name, a, b);                                  \
        init;
        P(attn_norm, "attn_norm.weight", d, 0, init_ones(L->attn_norm));
        P(wq, "attn_q.weight", d, d, init_normal(L->wq, &r, std));
        P(wk, "attn_k.weight", d, dkv, init_normal(L->wk, &r, std));
        P(wv, "attn_v.weight", d, dkv, init_normal(L->wv, &r, std));
        P(wo, "attn_output.weight", d, d, init_normal(L->wo, &r, std_out));
        P(ffn_norm, "ffn_norm.weight", d, 0, init_ones(L->ffn_norm));
        P(w_gate, "ffn_gate.weight", d, cfg->d_ff, init_normal(L->w_gate, &r, std));
        P(w_up, "ffn_up.weight", d, cfg->d_ff, init_normal(L->w_up, &r, std));
        P(w_down, "ffn_down.weight", cfg->d_ff, d, init_normal(L->w_down, &r, std_out));
#undef P
    }
    m->out_norm = param(m, "output_norm.weight", d, 0);
    init_ones(m->out_norm);
    if (cfg->tied) {
        m->output = m->tok_embd;
    } else {
        m->output = param(m, "output.weight", d, cfg->vocab);
        init_normal(m->output, &r, std);
    }
    return m;
}

void toy_llama_free(struct toy_llama *m) {
    if (!m) return;
    toy_ctx_free(m->ctx);
    free(m->layers);
    free(m);
}

int64_t toy_llama_n_params(const struct toy_llama *m) {
    const struct toy_llama_config *c = &m->cfg;
    int64_t d = c->d_model, dkv = d / c->n_heads * c->n_kv_heads;
    int64_t per = 2 * d + d * d * 2 + 2 * d * dkv + 3 * d * c->d_ff;
    return c->vocab * d * (c->tied ? 1 : 2) + c->n_layers * per + d;
}

/* x W^T with W cast to the model's matmul type (mixed precision) */
static struct toy_tensor *proj(struct toy_ctx *ctx, const struct toy_llama *m, struct toy_tensor *x,
                               struct toy_tensor *w) {
    if (m->matmul_type == TOY_BF16 && w->type == TOY_F32) w = toy_cast(ctx, w, TOY_BF16);
    return toy_linear(ctx, x, w, NULL);
}

struct toy_tensor *toy_llama_forward(struct toy_ctx *ctx, struct toy_llama *m, struct toy_tensor *tokens,
                                     struct toy_tensor *pos) {
    const struct toy_llama_config *c = &m->cfg;
    int64_t T = tokens->ne[0], B = tokens->ne[1], d = c->d_model;
    int64_t H = c->n_heads, Hkv = c->n_kv_heads, hd = d / H;
    struct toy_rope_params rope = {.mode = TOY_ROPE_NEOX, .freq_base = c->rope_base};
    struct toy_attn_params attn = {.causal = true};
    struct toy_tensor *x = toy_get_rows(ctx, m->tok_embd, tokens); /* {d, T, B} */
    for (int64_t l = 0; l < c->n_layers; l++) {
        struct toy_llama_layer *L = &m->layers[l];
        struct toy_tensor *h = toy_rms_norm(ctx, x, L->attn_norm, c->norm_eps);
        struct toy_tensor *q = toy_reshape_4d(ctx, proj(ctx, m, h, L->wq), hd, H, T, B);
        struct toy_tensor *k = toy_reshape_4d(ctx, proj(ctx, m, h, L->wk), hd, Hkv, T, B);
        struct toy_tensor *v = toy_reshape_4d(ctx, proj(ctx, m, h, L->wv), hd, Hkv, T, B);
        q = toy_rope(ctx, q, pos, &rope);
        k = toy_rope(ctx, k, pos, &rope);
        struct toy_tensor *a = toy_attention(ctx, q, k, v, &attn); /* {hd, H, T, B} */
        a = toy_reshape_3d(ctx, a, d, T, B);
        x = toy_add(ctx, x, proj(ctx, m, a, L->wo));
        h = toy_rms_norm(ctx, x, L->ffn_norm, c->norm_eps);
        struct toy_tensor *f = toy_swiglu(ctx, proj(ctx, m, h, L->w_gate), proj(ctx, m, h, L->w_up));
        x = toy_add(ctx, x, proj(ctx, m, f, L->w_down));
    }
    x = toy_rms_norm(ctx, x, m->out_norm, c->norm_eps);
    return proj(ctx, m, x, m->output); /* {vocab, T, B} */
}
