/* gpt2-gguf.c: GPT-2 models to and from GGUF in llama.cpp's "gpt2"
 * conventions: keys gpt2.{context_length, embedding_length,
 * feed_forward_length, block_count, attention.head_count,
 * attention.layer_norm_epsilon} (llama.cpp's LLM_KV_* names), tensors as
 * listed in toy/gpt2.h, dims innermost first. The vocabulary size comes from
 * token_embd.weight. llama.cpp's converter (and `toy convert`) writes an
 * output.weight that is a copy of token_embd.weight; it loads as a tied head
 * when the bytes are equal, as an untied one otherwise. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/gguf-model.h"
#include "toy/convert.h"
#include "toy/gguf.h"
#include "toy/gpt2.h"
#include "toy/quant.h"

struct toy_gpt2 *toy_gpt2_alloc(const struct toy_gpt2_config *cfg, bool tied, bool alloc_data);

bool toy_gguf_is_gpt2(const struct toy_gguf *g) { return toy_model_arch_is(g, "gpt2"); }

static int64_t key_int(const struct toy_gguf *g, enum toy_status *st, const char *suffix, int64_t def) {
    return toy_model_key_int(g, "gpt2", suffix, def, st);
}

static enum toy_status config_from_gguf(const struct toy_gguf *g, struct toy_gpt2_config *c, bool *tied) {
    memset(c, 0, sizeof *c);
    if (!toy_gguf_is_gpt2(g))
        return toy_error(TOY_ERR_UNSUPPORTED, "%s: general.architecture is not 'gpt2'", toy_gguf_path(g));
    enum toy_status kst = TOY_OK; /* a key of the wrong type (key_int) */
    c->d_model = key_int(g, &kst, "embedding_length", 0);
    c->n_layers = key_int(g, &kst, "block_count", 0);
    c->d_ff = key_int(g, &kst, "feed_forward_length", 4 * c->d_model);
    c->n_heads = key_int(g, &kst, "attention.head_count", 0);
    c->max_ctx = key_int(g, &kst, "context_length", 1024);
    double eps = 1e-5;
    int64_t ki = toy_gguf_find_key(g, "gpt2.attention.layer_norm_epsilon");
    if (ki >= 0 && !kst) kst = toy_gguf_kv_float(g, ki, &eps);
    if (kst) return kst;
    c->norm_eps = (float)eps;
    int64_t te = toy_gguf_find_tensor(g, "token_embd.weight");
    if (te < 0) return toy_error(TOY_ERR_FORMAT, "%s: no token_embd.weight tensor", toy_gguf_path(g));
    const struct toy_gguf_tensor *tt = toy_gguf_tensor(g, te);
    c->vocab = tt->ne[1];
    int64_t pe = toy_gguf_find_tensor(g, "position_embd.weight");
    if (pe >= 0 && toy_gguf_tensor(g, pe)->ne[1] < c->max_ctx) c->max_ctx = toy_gguf_tensor(g, pe)->ne[1];
    int64_t oi = toy_gguf_find_tensor(g, "output.weight");
    *tied = true;
    if (oi >= 0) {
        const struct toy_gguf_tensor *ot = toy_gguf_tensor(g, oi);
        *tied = ot->type == tt->type && ot->nbytes == tt->nbytes && !memcmp(ot->data, tt->data, tt->nbytes);
    }
    enum toy_status st = toy_gpt2_check_config(c);
    if (st) return toy_error(st, "%s: %s", toy_gguf_path(g), toy_last_error());
    return TOY_OK;
}

/* Points (mapped) or copies (trainable) tensor t->name into t, checking its shape. */
static enum toy_status bind(struct toy_gpt2 *m, struct toy_tensor *t, bool trainable) {
    const struct toy_gguf *g = m->gguf;
    int64_t i;
    enum toy_status cst;
    const struct toy_gguf_tensor *gt = toy_model_find_tensor(g, t, t == m->pos_embd, &i, &cst);
    if (!gt) return cst;
    if (trainable) {
        if (gt->n_elements == toy_nelements(t)) return toy_gguf_tensor_read_f32(g, i, t->data, toy_nelements(t));
        float *all = malloc((size_t)gt->n_elements * sizeof(float)); /* a longer position table: keep the head */
        if (!all) return toy_error(TOY_ERR_NOMEM, "%s: %s", toy_gguf_path(g), t->name);
        enum toy_status st = toy_gguf_tensor_read_f32(g, i, all, gt->n_elements);
        if (!st) memcpy(t->data, all, (size_t)toy_nelements(t) * sizeof(float));
        free(all);
        return st;
    }
    if (t->n_dims == 1 && gt->type != TOY_F32) {
        /* LayerNorms and biases must be f32 for the kernels: convert (tiny) */
        t->data = toy_ctx_alloc(m->ctx, (size_t)toy_nelements(t) * sizeof(float));
        toy_set_frozen(t);
        return toy_gguf_tensor_read_f32(g, i, t->data, toy_nelements(t));
    }
    toy_model_map_tensor(t, gt, gt->data);
    return TOY_OK;
}

enum toy_status toy_gpt2_load(const char *path, bool trainable, struct toy_gpt2 **out) {
    if (!out) return toy_error(TOY_ERR_INVALID_ARG, "toy_gpt2_load: out is NULL");
    *out = NULL;
    struct toy_gguf *g;
    enum toy_status st = toy_gguf_open(path, &g);
    if (st) return st;
    struct toy_gpt2_config cfg;
    bool tied = true;
    if ((st = config_from_gguf(g, &cfg, &tied))) { toy_gguf_close(g); return st; }
    struct toy_gpt2 *m = toy_gpt2_alloc(&cfg, tied, trainable);
    if (!m) {
        toy_gguf_close(g);
        return toy_error(TOY_ERR_NOMEM, "%s: gpt2 model of %lld layers", path, (long long)cfg.n_layers);
    }
    m->gguf = g;
    for (int i = 0; i < toy_gpt2_n_tensors(m) && !st; i++) st = bind(m, toy_gpt2_tensor(m, i), trainable);
    if (st) { toy_gpt2_free(m); return st; }
    if (trainable) { /* the file is no longer needed */
        toy_gguf_close(m->gguf);
        m->gguf = NULL;
    }
    *out = m;
    return TOY_OK;
}

/* ---- writing ------------------------------------------------------------------------ */

enum toy_status toy_gpt2_write_gguf(const struct toy_gpt2 *m, struct toy_gguf_writer *w, enum toy_dtype type) {
    const struct toy_gpt2_config *c = &m->cfg;
    enum toy_status st = toy_gguf_writer_set_str(w, "general.architecture", "gpt2");
    if (!st) st = toy_gguf_writer_set_u32(w, "general.alignment", 32);
    if (!st) st = toy_gguf_writer_set_u32(w, "general.file_type", toy_file_type_for(type));
    if (!st && toy_dtype_info(type)->quantized) st = toy_gguf_writer_set_u32(w, "general.quantization_version", 2);
    if (!st) st = toy_gguf_writer_set_u32(w, "gpt2.vocab_size", (uint32_t)c->vocab);
    if (!st) st = toy_gguf_writer_set_u32(w, "gpt2.context_length", (uint32_t)c->max_ctx);
    if (!st) st = toy_gguf_writer_set_u32(w, "gpt2.embedding_length", (uint32_t)c->d_model);
    if (!st) st = toy_gguf_writer_set_u32(w, "gpt2.feed_forward_length", (uint32_t)c->d_ff);
    if (!st) st = toy_gguf_writer_set_u32(w, "gpt2.block_count", (uint32_t)c->n_layers);
    if (!st) st = toy_gguf_writer_set_u32(w, "gpt2.attention.head_count", (uint32_t)c->n_heads);
    if (!st) st = toy_gguf_writer_set_f32(w, "gpt2.attention.layer_norm_epsilon", c->norm_eps);
    for (int i = 0; i < toy_gpt2_n_tensors(m) && !st; i++) {
        const struct toy_tensor *t = toy_gpt2_tensor(m, i);
        int nd = t->ne[1] > 1 ? 2 : 1;
        st = toy_model_write_tensor(w, m->ctx, t, nd, nd == 2 && t != m->pos_embd ? type : t->type);
    }
    return st;
}
