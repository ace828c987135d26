/* gpt2.c: the GPT-2 graph builder, random init and KV cache (toy/gpt2.h).
 * Architecture: Radford et al. 2019, "Language Models are Unsupervised
 * Multitask Learners" (pre-LN GPT, learned positions), following Hugging
 * Face's modeling_gpt2.py: ln_1 -> c_attn (fused q,k,v) -> causal attention
 * -> c_proj, ln_2 -> c_fc -> gelu_new (tanh) -> c_proj, ln_f, tied lm_head. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "toy/gguf.h"
#include "toy/gpt2.h"
#include "toy/rng.h"
#include "models/pack-weights.h"
#include "models/qkv.h"

struct toy_gpt2 *toy_gpt2_alloc(const struct toy_gpt2_config *cfg, bool tied, bool alloc_data);

struct toy_gpt2_config toy_gpt2_preset(const char *name) {
    struct toy_gpt2_config c = {0};
    c.norm_eps = 1e-5f;
    if (!name) return c; /* an unknown name: d_model 0 */
    if (!strcmp(name, "tiny")) {
        c.d_model = 64; c.n_layers = 2; c.n_heads = 4; c.d_ff = 256; c.max_ctx = 128;
    } else if (!strcmp(name, "small")) {
        c.d_model = 256; c.n_layers = 4; c.n_heads = 8; c.d_ff = 1024; c.max_ctx = 256;
    } else if (!strcmp(name, "124m")) {
        c.vocab = 50257; c.d_model = 768; c.n_layers = 12; c.n_heads = 12; c.d_ff = 3072; c.max_ctx = 1024;
    }
    return c;
}

enum toy_status toy_gpt2_check_config(const struct toy_gpt2_config *c) {
#define NEED(cond, ...) if (!(cond)) return toy_error(TOY_ERR_INVALID_ARG, __VA_ARGS__)
    NEED(c->vocab > 0 && c->vocab < (1LL << 31), "gpt2 config: vocab %lld out of range", (long long)c->vocab);
    NEED(c->d_model > 0, "gpt2 config: d_model %lld must be > 0", (long long)c->d_model);
    NEED(c->n_layers > 0 && c->n_layers < 100000, "gpt2 config: n_layers %lld out of range", (long long)c->n_layers);
    NEED(c->n_heads > 0 && c->d_model % c->n_heads == 0, "gpt2 config: d_model %lld is not a multiple of n_heads %lld",
         (long long)c->d_model, (long long)c->n_heads);
    NEED(c->d_ff > 0, "gpt2 config: d_ff %lld must be > 0", (long long)c->d_ff);
    NEED(c->max_ctx > 0 && c->max_ctx < (1LL << 31), "gpt2 config: context %lld out of range", (long long)c->max_ctx);
    NEED(c->norm_eps > 0, "gpt2 config: norm_eps must be > 0");
#undef NEED
    return TOY_OK;
}

static struct toy_tensor *param(struct toy_gpt2 *m, const char *name, int64_t ne0, int64_t ne1) {
    struct toy_tensor *t = ne1 ? toy_new_tensor_2d(m->ctx, TOY_F32, ne0, ne1) : toy_new_tensor_1d(m->ctx, TOY_F32, ne0);
    toy_set_name(t, "%s", name);
    toy_set_param(t);
    return t;
}

/* Allocates the parameters of cfg under llama.cpp's names, with zeroed f32
 * data when alloc_data (random init, trainable loading), else without data
 * (weights mapped from a file). */
struct toy_gpt2 *toy_gpt2_alloc(const struct toy_gpt2_config *cfg, bool tied, bool alloc_data) {
    if (toy_gpt2_check_config(cfg)) return NULL;
    struct toy_gpt2 *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->cfg = *cfg;
    m->tied = tied;
    m->matmul_type = TOY_F32;
    m->ctx = toy_ctx_init(alloc_data);
    m->layers = calloc((size_t)cfg->n_layers, sizeof *m->layers);
    if (!m->ctx || !m->layers) { toy_gpt2_free(m); return NULL; }
    int64_t d = cfg->d_model, f = cfg->d_ff;
    char name[TOY_NAME_MAX];
    m->tok_embd = param(m, "token_embd.weight", d, cfg->vocab);
    m->pos_embd = param(m, "position_embd.weight", d, cfg->max_ctx);
    for (int64_t l = 0; l < cfg->n_layers; l++) {
        struct toy_gpt2_layer *L = &m->layers[l];
#define P(field, suffix, a, b)                                            \
        snprintf(name, sizeof name, "blk.%lld." suffix, (long long)l);    \
        L->field = param(m, name, a, b);
        P(attn_norm, "attn_norm.weight", d, 0);
        P(attn_norm_b, "attn_norm.bias", d, 0);
        P(w_qkv, "attn_qkv.weight", d, 3 * d);
        P(b_qkv, "attn_qkv.bias", 3 * d, 0);
        P(w_o, "attn_output.weight", d, d);
        P(b_o, "attn_output.bias", d, 0);
        P(ffn_norm, "ffn_norm.weight", d, 0);
        P(ffn_norm_b, "ffn_norm.bias", d, 0);
        P(w_up, "ffn_up.weight", d, f);
        P(b_up, "ffn_up.bias", f, 0);
        P(w_down, "ffn_down.weight", f, d);
        P(b_down, "ffn_down.bias", d, 0);
#undef P
    }
    m->out_norm = param(m, "output_norm.weight", d, 0);
    m->out_norm_b = param(m, "output_norm.bias", d, 0);
    m->output = tied ? m->tok_embd : param(m, "output.weight", d, cfg->vocab);
    return m;
}

static void init_normal(struct toy_tensor *t, struct toy_rng *r, float std) {
    toy_rng_fill_normal(r, t->data, toy_nelements(t), std);
}

static void init_ones(struct toy_tensor *t) {
    float *x = t->data;
    for (int64_t i = 0; i < toy_nelements(t); i++) x[i] = 1.0f;
}

struct toy_gpt2 *toy_gpt2_new(const struct toy_gpt2_config *cfg, uint64_t seed) {
    struct toy_gpt2 *m = toy_gpt2_alloc(cfg, true, true);
    if (!m) return NULL;
    struct toy_rng r;
    toy_rng_seed(&r, seed);
    const float std = 0.02f, std_out = 0.02f / sqrtf(2.0f * (float)cfg->n_layers);
    init_normal(m->tok_embd, &r, std);
    init_normal(m->pos_embd, &r, std);
    for (int64_t l = 0; l < cfg->n_layers; l++) {
        struct toy_gpt2_layer *L = &m->layers[l];
        init_ones(L->attn_norm);
        init_normal(L->w_qkv, &r, std);
        init_normal(L->w_o, &r, std_out);
        init_ones(L->ffn_norm);
        init_normal(L->w_up, &r, std);
        init_normal(L->w_down, &r, std_out);
    }
    init_ones(m->out_norm);
    return m;
}

/* the matrices inference multiplies by (a tied head: the token table) */
static int inference_weights(const struct toy_gpt2 *m, struct toy_tensor **out) {
    int n = 0;
    for (int64_t l = 0; l < m->cfg.n_layers; l++) {
        const struct toy_gpt2_layer *L = &m->layers[l];
        out[n++] = L->w_qkv, out[n++] = L->w_o, out[n++] = L->w_up, out[n++] = L->w_down;
    }
    out[n++] = m->output;
    return n;
}

bool toy_gpt2_infer_bf16(struct toy_gpt2 *m) {
    struct toy_tensor **w = malloc(((size_t)m->cfg.n_layers * 4 + 1) * sizeof *w);
    bool on = w && toy_inference_bf16_pays(w, inference_weights(m, w));
    free(w);
    if (on) m->matmul_type = TOY_BF16, m->bf16_float_only = true; /* quantized: the int8 kernels are the faster */
    return on;
}

enum toy_status toy_gpt2_pack_weights(struct toy_gpt2 *m) {
    if (m->pack_block) return TOY_OK;
    struct toy_tensor **w = malloc(((size_t)m->cfg.n_layers * 4 + 1) * sizeof *w);
    if (!w) return toy_error(TOY_ERR_NOMEM, "packing weights");
    enum toy_status st = toy_pack_inference_weights(m->gguf, w, inference_weights(m, w), &m->pack_block, &m->pack_bytes);
    free(w);
    return st;
}

void toy_gpt2_free(struct toy_gpt2 *m) {
    if (!m) return;
    struct toy_tensor **w = m->layers ? malloc(((size_t)m->cfg.n_layers * 4 + 1) * sizeof *w) : NULL;
    toy_unpack_inference_weights(w, w ? inference_weights(m, w) : 0, m->pack_block, m->pack_bytes);
    free(w);
    toy_ctx_free(m->ctx);
    toy_gguf_close(m->gguf);
    free(m->layers);
    free(m);
}

enum { PER_LAYER = 12 };

int toy_gpt2_n_tensors(const struct toy_gpt2 *m) {
    return 2 + PER_LAYER * (int)m->cfg.n_layers + 2 + (m->tied ? 0 : 1);
}

struct toy_tensor *toy_gpt2_tensor(const struct toy_gpt2 *m, int i) {
    if (i < 0) return NULL;
    if (i == 0) return m->tok_embd;
    if (i == 1) return m->pos_embd;
    i -= 2;
    if (i < PER_LAYER * m->cfg.n_layers) {
        const struct toy_gpt2_layer *L = &m->layers[i / PER_LAYER];
        struct toy_tensor *const all[PER_LAYER] = {L->attn_norm, L->attn_norm_b, L->w_qkv,  L->b_qkv,
                                                   L->w_o,       L->b_o,         L->ffn_norm, L->ffn_norm_b,
                                                   L->w_up,      L->b_up,        L->w_down,   L->b_down};
        return all[i % PER_LAYER];
    }
    i -= PER_LAYER * (int)m->cfg.n_layers;
    if (i == 0) return m->out_norm;
    if (i == 1) return m->out_norm_b;
    if (i == 2 && !m->tied) return m->output;
    return NULL;
}

double toy_gpt2_decode_bytes(const struct toy_gpt2 *m) {
    double bytes = 0;
    for (int i = 0; i < toy_gpt2_n_tensors(m); i++) bytes += (double)toy_nbytes(toy_gpt2_tensor(m, i));
    bytes -= (double)toy_nbytes(m->pos_embd) - (double)m->pos_embd->nb[1];
    if (!m->tied) bytes -= (double)toy_nbytes(m->tok_embd) - (double)m->tok_embd->nb[1];
    return bytes;
}

int64_t toy_gpt2_n_params(const struct toy_gpt2 *m) {
    int64_t n = 0;
    for (int i = 0; i < toy_gpt2_n_tensors(m); i++) n += toy_nelements(toy_gpt2_tensor(m, i));
    return n;
}

/* ---- the graph ---------------------------------------------------------------- */

/* x W^T + b, in bf16 under mixed precision (as the Llama proj) */
static struct toy_tensor *proj(struct toy_ctx *ctx, const struct toy_gpt2 *m, struct toy_tensor *x,
                               struct toy_tensor *w, struct toy_tensor *b) {
    bool bf16 = m->matmul_type == TOY_BF16 && (!m->bf16_float_only || w->type == TOY_F32 || w->type == TOY_F16);
    return toy_linear_bf16(ctx, x, w, b, bf16);
}

static struct toy_tensor *forward(struct toy_ctx *ctx, struct toy_gpt2 *m, struct toy_kv_cache *cache,
                                  struct toy_tensor *tokens, struct toy_tensor *pos, bool last_only) {
    const struct toy_gpt2_config *c = &m->cfg;
    int64_t T = tokens->ne[0], B = tokens->ne[1], d = c->d_model, H = c->n_heads, hd = d / H;
    float eps = c->norm_eps;
    struct toy_tensor *x = toy_get_rows(ctx, m->tok_embd, tokens); /* {d, T, B} */
    struct toy_tensor *pe = toy_get_rows(ctx, m->pos_embd, pos);   /* {d, T} or {d, T*B} */
    if (pe->ne[1] != T) pe = toy_reshape_3d(ctx, pe, d, T, B);
    x = toy_add(ctx, x, pe);
    const struct toy_attn_params attn = {.causal = true};
    for (int64_t l = 0; l < c->n_layers; l++) {
        struct toy_gpt2_layer *L = &m->layers[l];
        struct toy_tensor *h = toy_layer_norm(ctx, x, L->attn_norm, L->attn_norm_b, eps);
        struct toy_tensor *qkv = proj(ctx, m, h, L->w_qkv, L->b_qkv); /* {3d, T, B} */
        struct toy_tensor *q = toy_qkv_part(ctx, qkv, 0, hd, H), *k = toy_qkv_part(ctx, qkv, 1, hd, H),
                          *v = toy_qkv_part(ctx, qkv, 2, hd, H);
        struct toy_tensor *a;
        if (cache) {
            struct toy_tensor *ks = toy_kv_store(ctx, cache->k[l], k, cache->n_past);
            struct toy_tensor *vs = toy_kv_store(ctx, cache->v[l], v, cache->n_past);
            a = toy_attention_cached(ctx, q, ks, vs, cache->n_past, &attn);
        } else {
            /* under mixed precision its products too are bf16 */
            struct toy_attn_params ap = {.causal = true, .bf16 = m->matmul_type == TOY_BF16};
            a = toy_attention(ctx, q, k, v, &ap); /* {hd, H, T, B} */
        }
        a = proj(ctx, m, toy_reshape_3d(ctx, a, d, T, B), L->w_o, L->b_o);
        x = toy_add(ctx, x, a);
        h = toy_layer_norm(ctx, x, L->ffn_norm, L->ffn_norm_b, eps);
        struct toy_tensor *f = toy_gelu(ctx, proj(ctx, m, h, L->w_up, L->b_up)); /* {d_ff, T, B} */
        x = toy_add(ctx, x, proj(ctx, m, f, L->w_down, L->b_down));
    }
    if (last_only && T > 1) /* generation needs the next token after the prompt only: skip T-1 head rows */
        x = toy_cont(ctx, toy_view(ctx, x, 3, (int64_t[]){d, 1, B}, (size_t[]){x->nb[0], x->nb[1], x->nb[2]},
                                   (size_t)(T - 1) * x->nb[1]));
    x = toy_layer_norm(ctx, x, m->out_norm, m->out_norm_b, eps);
    return proj(ctx, m, x, m->output, NULL); /* {vocab, T, B} */
}

struct toy_tensor *toy_gpt2_forward(struct toy_ctx *ctx, struct toy_gpt2 *m, struct toy_tensor *tokens,
                                    struct toy_tensor *pos) {
    return forward(ctx, m, NULL, tokens, pos, false);
}

struct toy_tensor *toy_gpt2_forward_cached(struct toy_ctx *ctx, struct toy_gpt2 *m, struct toy_kv_cache *c,
                                           struct toy_tensor *tokens, struct toy_tensor *pos) {
    return forward(ctx, m, c, tokens, pos, false);
}

/* ---- KV cache ------------------------------------------------------------------ */

enum toy_status toy_gpt2_cache_init(struct toy_kv_cache *c, const struct toy_gpt2 *m, int64_t n_ctx, int64_t n_seq) {
    return toy_gpt2_cache_init_type(c, m, n_ctx, n_seq, TOY_F32);
}

enum toy_status toy_gpt2_cache_init_type(struct toy_kv_cache *c, const struct toy_gpt2 *m, int64_t n_ctx,
                                         int64_t n_seq, enum toy_dtype type) {
    if (!c) return toy_error(TOY_ERR_INVALID_ARG, "toy_gpt2_cache_init: c is NULL");
    memset(c, 0, sizeof *c);
    int64_t L = m->cfg.n_layers, H = m->cfg.n_heads, hd = m->cfg.d_model / H;
    if (n_ctx <= 0 || n_seq <= 0 || n_ctx > m->cfg.max_ctx)
        return toy_error(TOY_ERR_INVALID_ARG, "gpt2 kv cache: context %lld (model: %lld), sequences %lld",
                         (long long)n_ctx, (long long)m->cfg.max_ctx, (long long)n_seq);
    if (type != TOY_F32 && type != TOY_F16)
        return toy_error(TOY_ERR_INVALID_ARG, "gpt2 kv cache: type %s (f32 or f16)", toy_dtype_name(type));
    enum toy_status fit = toy_kv_cache_check_size(L, hd * H, n_ctx, n_seq, type);
    if (fit) return fit;
    c->ctx = toy_ctx_init(true);
    c->k = calloc((size_t)L, sizeof *c->k);
    c->v = calloc((size_t)L, sizeof *c->v);
    if (!c->ctx || !c->k || !c->v) {
        toy_kv_cache_free(c);
        return toy_error(TOY_ERR_NOMEM, "gpt2 kv cache: %lld layers x %lld positions", (long long)L, (long long)n_ctx);
    }
    c->n_layers = L;
    c->n_ctx = n_ctx;
    c->n_seq = n_seq;
    for (int64_t l = 0; l < L; l++) {
        c->k[l] = toy_set_name(toy_new_tensor_4d(c->ctx, type, hd, H, n_ctx, n_seq), "cache_k.%lld", (long long)l);
        c->v[l] = toy_set_name(toy_new_tensor_4d(c->ctx, type, hd, H, n_ctx, n_seq), "cache_v.%lld", (long long)l);
    }
    c->n_past = toy_set_name(toy_new_tensor_1d(c->ctx, TOY_I32, 1), "n_past");
    return TOY_OK;
}

/* ---- the generic interface ---------------------------------------------------------- */

static struct toy_tensor *lm_forward(void *self, struct toy_ctx *ctx, struct toy_tensor *tokens,
                                     struct toy_tensor *pos) {
    return toy_gpt2_forward(ctx, self, tokens, pos);
}
static int lm_n_tensors(void *self) { return toy_gpt2_n_tensors(self); }
static struct toy_tensor *lm_tensor(void *self, int i) { return toy_gpt2_tensor(self, i); }
static enum toy_status lm_write(void *self, struct toy_gguf_writer *w, enum toy_dtype type) {
    return toy_gpt2_write_gguf(self, w, type);
}
static void lm_matmul(void *self, enum toy_dtype type) { ((struct toy_gpt2 *)self)->matmul_type = type; }

static enum toy_status lm_pack(void *self) { return toy_gpt2_pack_weights(self); }
static enum toy_status lm_cache(void *self, struct toy_kv_cache *c, int64_t n_ctx, int64_t n_seq, enum toy_dtype type) {
    return toy_gpt2_cache_init_type(c, self, n_ctx, n_seq, type);
}
static struct toy_tensor *lm_cached(void *self, struct toy_ctx *ctx, struct toy_kv_cache *c, struct toy_tensor *tokens,
                                    struct toy_tensor *pos, bool last_only) {
    return forward(ctx, self, c, tokens, pos, last_only);
}

struct toy_lm toy_gpt2_lm(struct toy_gpt2 *m) {
    return (struct toy_lm){.self = m, .arch = "gpt2", .vocab = m->cfg.vocab, .max_ctx = m->cfg.max_ctx,
                           .forward = lm_forward, .n_tensors = lm_n_tensors, .tensor = lm_tensor,
                           .write_gguf = lm_write, .set_matmul_type = lm_matmul, .pack_weights = lm_pack,
                           .cache_init = lm_cache, .forward_cached = lm_cached};
}
