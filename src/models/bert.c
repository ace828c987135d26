/* bert.c: BERT-family encoders (toy/bert.h): the graph, random init, GGUF
 * loading and writing in llama.cpp's "bert" conventions. Follows Hugging
 * Face's modeling_bert.py: embeddings (word + token type 0 + position) ->
 * LayerNorm; per layer, self-attention (q, k, v with biases, softmax over
 * every key) -> output dense -> LayerNorm(x + it); intermediate dense ->
 * GELU -> output dense -> LayerNorm(x + it). No head: the last hidden states
 * are what embeddings pool. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/gguf-model.h"
#include "models/pack-weights.h"
#include "toy/bert.h"
#include "toy/convert.h"
#include "toy/gguf.h"
#include "toy/quant.h"
#include "toy/rng.h"

enum toy_status toy_bert_check_config(const struct toy_bert_config *c) {
#define NEED(cond, ...) if (!(cond)) return toy_error(TOY_ERR_INVALID_ARG, __VA_ARGS__)
    NEED(c->vocab > 0 && c->vocab < (1LL << 31), "bert config: vocab %lld out of range", (long long)c->vocab);
    NEED(c->d_model > 0, "bert config: d_model %lld must be > 0", (long long)c->d_model);
    NEED(c->n_layers > 0 && c->n_layers < 100000, "bert config: n_layers %lld out of range", (long long)c->n_layers);
    NEED(c->n_heads > 0 && c->d_model % c->n_heads == 0, "bert config: d_model %lld is not a multiple of n_heads %lld",
         (long long)c->d_model, (long long)c->n_heads);
    NEED(c->d_ff > 0, "bert config: d_ff %lld must be > 0", (long long)c->d_ff);
    NEED(c->max_ctx > 0 && c->max_ctx < (1LL << 31), "bert config: context %lld out of range", (long long)c->max_ctx);
    NEED(c->n_types >= 0 && c->n_types < 1024, "bert config: %lld token types", (long long)c->n_types);
    NEED(c->norm_eps > 0, "bert config: norm_eps must be > 0");
    NEED(c->pooling >= TOY_POOLING_NONE && c->pooling <= TOY_POOLING_RANK, "bert config: pooling %d", (int)c->pooling);
#undef NEED
    return TOY_OK;
}

static struct toy_tensor *param(struct toy_bert *m, const char *name, int64_t ne0, int64_t ne1) {
    struct toy_tensor *t = ne1 ? toy_new_tensor_2d(m->ctx, TOY_F32, ne0, ne1) : toy_new_tensor_1d(m->ctx, TOY_F32, ne0);
    toy_set_name(t, "%s", name);
    toy_set_param(t);
    return t;
}

enum { PER_LAYER = 16 };

/* the parameters of cfg under llama.cpp's names, with f32 data when alloc_data, else without (to be mapped) */
static struct toy_bert *alloc_model(const struct toy_bert_config *cfg, bool alloc_data) {
    if (toy_bert_check_config(cfg)) return NULL;
    struct toy_bert *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->cfg = *cfg;
    m->ctx = toy_ctx_init(alloc_data);
    m->layers = calloc((size_t)cfg->n_layers, sizeof *m->layers);
    if (!m->ctx || !m->layers) {
        toy_bert_free(m);
        return NULL;
    }
    int64_t d = cfg->d_model, f = cfg->d_ff;
    m->tok_embd = param(m, "token_embd.weight", d, cfg->vocab);
    m->type_embd = cfg->n_types ? param(m, "token_types.weight", d, cfg->n_types) : NULL;
    m->pos_embd = param(m, "position_embd.weight", d, cfg->max_ctx);
    m->embd_norm = param(m, "token_embd_norm.weight", d, 0);
    m->embd_norm_b = param(m, "token_embd_norm.bias", d, 0);
    char name[TOY_NAME_MAX];
    for (int64_t l = 0; l < cfg->n_layers; l++) {
        struct toy_bert_layer *L = &m->layers[l];
#define P(field, suffix, a, b)                                         \
        snprintf(name, sizeof name, "blk.%lld." suffix, (long long)l); \
        L->field = param(m, name, a, b);
        P(wq, "attn_q.weight", d, d);
        P(bq, "attn_q.bias", d, 0);
        P(wk, "attn_k.weight", d, d);
        P(bk, "attn_k.bias", d, 0);
        P(wv, "attn_v.weight", d, d);
        P(bv, "attn_v.bias", d, 0);
        P(wo, "attn_output.weight", d, d);
        P(bo, "attn_output.bias", d, 0);
        P(attn_norm, "attn_output_norm.weight", d, 0);
        P(attn_norm_b, "attn_output_norm.bias", d, 0);
        P(w_up, "ffn_up.weight", d, f);
        P(b_up, "ffn_up.bias", f, 0);
        P(w_down, "ffn_down.weight", f, d);
        P(b_down, "ffn_down.bias", d, 0);
        P(out_norm, "layer_output_norm.weight", d, 0);
        P(out_norm_b, "layer_output_norm.bias", d, 0);
#undef P
    }
    return m;
}

int toy_bert_n_tensors(const struct toy_bert *m) {
    return 4 + (m->type_embd ? 1 : 0) + PER_LAYER * (int)m->cfg.n_layers;
}

struct toy_tensor *toy_bert_tensor(const struct toy_bert *m, int i) {
    struct toy_tensor *head[6] = {m->tok_embd, m->pos_embd, m->embd_norm, m->embd_norm_b, m->type_embd, NULL};
    int n_head = m->type_embd ? 5 : 4;
    if (i < n_head) return head[i];
    i -= n_head;
    if (i >= PER_LAYER * (int)m->cfg.n_layers) return NULL;
    const struct toy_bert_layer *L = &m->layers[i / PER_LAYER];
    struct toy_tensor *const per[PER_LAYER] = {L->wq,        L->bq,   L->wk,     L->bk,       L->wv,   L->bv,
                                               L->wo,        L->bo,   L->attn_norm, L->attn_norm_b, L->w_up, L->b_up,
                                               L->w_down,    L->b_down, L->out_norm, L->out_norm_b};
    return per[i % PER_LAYER];
}

struct toy_bert *toy_bert_new(const struct toy_bert_config *cfg, uint64_t seed) {
    struct toy_bert *m = alloc_model(cfg, true);
    if (!m) return NULL;
    struct toy_rng r;
    toy_rng_seed(&r, seed);
    for (int i = 0; i < toy_bert_n_tensors(m); i++) {
        struct toy_tensor *t = toy_bert_tensor(m, i);
        bool norm = strstr(t->name, "norm.weight") != NULL;
        toy_rng_fill_normal(&r, t->data, toy_nelements(t), norm ? 0.1f : 0.02f);
        if (norm)
            for (int64_t k = 0; k < toy_nelements(t); k++) ((float *)t->data)[k] += 1.0f;
    }
    return m;
}

/* the matrices inference multiplies by */
static int inference_weights(const struct toy_bert *m, struct toy_tensor **out) {
    int n = 0;
    for (int64_t l = 0; l < m->cfg.n_layers; l++) {
        const struct toy_bert_layer *L = &m->layers[l];
        out[n++] = L->wq, out[n++] = L->wk, out[n++] = L->wv, out[n++] = L->wo, out[n++] = L->w_up,
        out[n++] = L->w_down;
    }
    return n;
}

enum toy_status toy_bert_pack_weights(struct toy_bert *m) {
    if (m->pack_block) return TOY_OK;
    struct toy_tensor **w = malloc((size_t)m->cfg.n_layers * 6 * sizeof *w);
    if (!w) return toy_error(TOY_ERR_NOMEM, "packing weights");
    enum toy_status st = toy_pack_inference_weights(m->gguf, w, inference_weights(m, w), &m->pack_block, &m->pack_bytes);
    free(w);
    return st;
}

void toy_bert_free(struct toy_bert *m) {
    if (!m) return;
    struct toy_tensor **w = m->layers && m->pack_block ? malloc((size_t)m->cfg.n_layers * 6 * sizeof *w) : NULL;
    toy_unpack_inference_weights(w, w ? inference_weights(m, w) : 0, m->pack_block, m->pack_bytes);
    free(w);
    toy_ctx_free(m->ctx);
    toy_gguf_close(m->gguf);
    free(m->layers);
    free(m);
}

/* ---- the graph ------------------------------------------------------------------------ */

struct toy_tensor *toy_bert_forward(struct toy_ctx *ctx, struct toy_bert *m, struct toy_tensor *tokens,
                                    struct toy_tensor *pos) {
    const struct toy_bert_config *c = &m->cfg;
    int64_t T = tokens->ne[0], B = tokens->ne[1], d = c->d_model, H = c->n_heads, hd = d / H;
    struct toy_tensor *x = toy_get_rows(ctx, m->tok_embd, tokens); /* {d, T, B} */
    if (m->type_embd) { /* every token is of type 0 ("sentence A"), as embedding models are run */
        size_t nb[1] = {m->type_embd->nb[0]};
        int64_t ne[1] = {d};
        x = toy_add(ctx, x, toy_view(ctx, m->type_embd, 1, ne, nb, 0));
    }
    x = toy_add(ctx, x, toy_get_rows(ctx, m->pos_embd, pos)); /* {d, T}, broadcast over the batch */
    x = toy_layer_norm(ctx, x, m->embd_norm, m->embd_norm_b, c->norm_eps);
    const struct toy_attn_params attn = {.causal = false};
    for (int64_t l = 0; l < c->n_layers; l++) {
        const struct toy_bert_layer *L = &m->layers[l];
        struct toy_tensor *q = toy_reshape_4d(ctx, toy_linear(ctx, x, L->wq, L->bq), hd, H, T, B);
        struct toy_tensor *k = toy_reshape_4d(ctx, toy_linear(ctx, x, L->wk, L->bk), hd, H, T, B);
        struct toy_tensor *v = toy_reshape_4d(ctx, toy_linear(ctx, x, L->wv, L->bv), hd, H, T, B);
        struct toy_tensor *a = toy_reshape_3d(ctx, toy_attention(ctx, q, k, v, &attn), d, T, B);
        x = toy_layer_norm(ctx, toy_add(ctx, x, toy_linear(ctx, a, L->wo, L->bo)), L->attn_norm, L->attn_norm_b,
                           c->norm_eps);
        struct toy_tensor *f = toy_gelu(ctx, toy_linear(ctx, x, L->w_up, L->b_up)); /* {d_ff, T, B} */
        x = toy_layer_norm(ctx, toy_add(ctx, x, toy_linear(ctx, f, L->w_down, L->b_down)), L->out_norm,
                           L->out_norm_b, c->norm_eps);
    }
    return x;
}

struct toy_tensor *toy_bert_pool(struct toy_ctx *ctx, struct toy_tensor *h, enum toy_pooling pooling) {
    if (pooling != TOY_POOLING_CLS && pooling != TOY_POOLING_LAST) return toy_mean(ctx, h, 1);
    int64_t ne[3] = {h->ne[0], 1, h->ne[2]};
    size_t nb[3] = {h->nb[0], h->nb[1], h->nb[2]};
    return toy_view(ctx, h, 3, ne, nb, pooling == TOY_POOLING_CLS ? 0 : (size_t)(h->ne[1] - 1) * h->nb[1]);
}

/* ---- GGUF ------------------------------------------------------------------------------ */

bool toy_gguf_is_bert(const struct toy_gguf *g) { return toy_model_arch_is(g, "bert"); }

static int64_t key_int(const struct toy_gguf *g, enum toy_status *st, const char *suffix, int64_t def) {
    return toy_model_key_int(g, "bert", suffix, def, st);
}

static enum toy_status config_from_gguf(const struct toy_gguf *g, struct toy_bert_config *c) {
    memset(c, 0, sizeof *c);
    const char *path = toy_gguf_path(g);
    if (!toy_gguf_is_bert(g)) return toy_error(TOY_ERR_UNSUPPORTED, "%s: general.architecture is not 'bert'", path);
    enum toy_status kst = TOY_OK;
    c->d_model = key_int(g, &kst, "embedding_length", 0);
    c->n_layers = key_int(g, &kst, "block_count", 0);
    c->d_ff = key_int(g, &kst, "feed_forward_length", 4 * c->d_model);
    c->n_heads = key_int(g, &kst, "attention.head_count", 0);
    c->max_ctx = key_int(g, &kst, "context_length", 512);
    int64_t pool = key_int(g, &kst, "pooling_type", TOY_POOLING_NONE);
    double eps = 1e-12;
    int64_t ki = toy_gguf_find_key(g, "bert.attention.layer_norm_epsilon");
    if (ki >= 0 && !kst) kst = toy_gguf_kv_float(g, ki, &eps);
    if (kst) return kst;
    if (pool < TOY_POOLING_NONE || pool > TOY_POOLING_RANK)
        return toy_error(TOY_ERR_FORMAT, "%s: bert.pooling_type %lld (0 none, 1 mean, 2 cls, 3 last, 4 rank)", path,
                         (long long)pool);
    c->pooling = (enum toy_pooling)pool;
    c->norm_eps = (float)eps;
    if (toy_gguf_find_tensor(g, "blk.0.attn_qkv.weight") >= 0)
        return toy_error(TOY_ERR_UNSUPPORTED, "%s: a fused blk.N.attn_qkv (Jina/Nomic-style BERT) is not supported; "
                         "toy reads separate attn_q, attn_k, attn_v", path);
    int64_t te = toy_gguf_find_tensor(g, "token_embd.weight");
    if (te < 0) return toy_error(TOY_ERR_FORMAT, "%s: no token_embd.weight tensor", path);
    c->vocab = toy_gguf_tensor(g, te)->ne[1];
    int64_t ty = toy_gguf_find_tensor(g, "token_types.weight");
    c->n_types = ty >= 0 ? toy_gguf_tensor(g, ty)->ne[1] : 0;
    int64_t pe = toy_gguf_find_tensor(g, "position_embd.weight");
    if (pe >= 0 && toy_gguf_tensor(g, pe)->ne[1] < c->max_ctx) c->max_ctx = toy_gguf_tensor(g, pe)->ne[1];
    enum toy_status st = toy_bert_check_config(c);
    if (st) return toy_error(st, "%s: %s", path, toy_last_error());
    return TOY_OK;
}

/* Points tensor t at its mapped data (1-D ones and the small embedding tables read as f32), checking its shape */
static enum toy_status bind(struct toy_bert *m, struct toy_tensor *t) {
    const struct toy_gguf *g = m->gguf;
    int64_t i;
    enum toy_status st;
    const struct toy_gguf_tensor *gt = toy_model_find_tensor(g, t, t == m->pos_embd, &i, &st);
    if (!gt) return st;
    if (t->n_dims == 1 || t == m->type_embd || t == m->pos_embd) {
        /* norms, biases and the tables whose rows are added as they are: f32 (small) */
        t->data = toy_ctx_alloc(m->ctx, (size_t)gt->n_elements * sizeof(float));
        toy_set_frozen(t);
        return toy_gguf_tensor_read_f32(g, i, t->data, gt->n_elements);
    }
    toy_model_map_tensor(t, gt, gt->data);
    return TOY_OK;
}

enum toy_status toy_bert_load(const char *path, struct toy_bert **out) {
    if (!out) return toy_error(TOY_ERR_INVALID_ARG, "toy_bert_load: out is NULL");
    *out = NULL;
    struct toy_gguf *g;
    enum toy_status st = toy_gguf_open(path, &g);
    if (st) return st;
    struct toy_bert_config cfg;
    if ((st = config_from_gguf(g, &cfg))) {
        toy_gguf_close(g);
        return st;
    }
    struct toy_bert *m = alloc_model(&cfg, false);
    if (!m) {
        toy_gguf_close(g);
        return toy_error(TOY_ERR_NOMEM, "%s: bert model of %lld layers", path, (long long)cfg.n_layers);
    }
    m->gguf = g;
    for (int i = 0; i < toy_bert_n_tensors(m) && !st; i++) st = bind(m, toy_bert_tensor(m, i));
    if (st) {
        toy_bert_free(m);
        return st;
    }
    *out = m;
    return TOY_OK;
}

enum toy_status toy_bert_write_gguf(const struct toy_bert *m, struct toy_gguf_writer *w, enum toy_dtype type) {
    const struct toy_bert_config *c = &m->cfg;
    if (type != TOY_F32 && type != TOY_F16 && type != TOY_BF16)
        return toy_error(TOY_ERR_INVALID_ARG, "toy_bert_write_gguf: type %s (f32, f16 or bf16)", toy_dtype_name(type));
    enum toy_status st = toy_gguf_writer_set_str(w, "general.architecture", "bert");
    if (!st) st = toy_gguf_writer_set_u32(w, "general.alignment", 32);
    if (!st) st = toy_gguf_writer_set_u32(w, "general.file_type", toy_file_type_for(type));
    if (!st) st = toy_gguf_writer_set_u32(w, "bert.context_length", (uint32_t)c->max_ctx);
    if (!st) st = toy_gguf_writer_set_u32(w, "bert.embedding_length", (uint32_t)c->d_model);
    if (!st) st = toy_gguf_writer_set_u32(w, "bert.feed_forward_length", (uint32_t)c->d_ff);
    if (!st) st = toy_gguf_writer_set_u32(w, "bert.block_count", (uint32_t)c->n_layers);
    if (!st) st = toy_gguf_writer_set_u32(w, "bert.attention.head_count", (uint32_t)c->n_heads);
    if (!st) st = toy_gguf_writer_set_f32(w, "bert.attention.layer_norm_epsilon", c->norm_eps);
    if (!st) st = toy_gguf_writer_set_bool(w, "bert.attention.causal", false);
    /* llama.cpp sizes token_types.weight by it */
    if (!st && c->n_types) st = toy_gguf_writer_set_u32(w, "tokenizer.ggml.token_type_count", (uint32_t)c->n_types);
    if (!st && c->pooling != TOY_POOLING_NONE) st = toy_gguf_writer_set_u32(w, "bert.pooling_type", (uint32_t)c->pooling);
    for (int i = 0; i < toy_bert_n_tensors(m) && !st; i++) {
        const struct toy_tensor *t = toy_bert_tensor(m, i);
        int nd = t->n_dims > 1 ? 2 : 1;
        bool table = t == m->tok_embd || t == m->type_embd || t == m->pos_embd;
        st = toy_model_write_tensor(w, m->ctx, t, nd, nd == 1 || table ? t->type : type);
    }
    return st;
}
