/* serve-forward.c: the model the server runs (struct srv_model: a
 * Llama-family model, a GPT-2, or a BERT encoder for embeddings alone) and
 * its forward pass, built from the
 * public ops of toy/tensor.h. Each family's forward mirrors its model's
 * (src/models/llama.c, src/models/gpt2.c: same family flags, same op order,
 * so the same numbers as toy generate) with three differences the server
 * needs:
 *
 *  - batched decode over separate KV caches: B sequences, each with its own
 *    cache and n_past (toy_kv_cache has one n_past for all its sequences)
 *    and its own number of positions (struct srv_seqs: a step that checks
 *    drafts of different lengths), share every projection (one matmul over B rows: the weights are read
 *    once per step for the whole batch, which is where batching pays) and,
 *    the caches being sequences of one pool, store and attend every row in
 *    one op each (toy_kv_store_rows, toy_attention_rows; one sequence: per
 *    sequence, which the graph fuses for a decode step);
 *  - row groups: with Q8_0/Q4_0 weights, a product of at most 8 rows takes
 *    the integer dot-product path (activations quantized per row) and a
 *    larger one dequantizes the weights for sgemm on f32 activations
 *    (src/backends/cpu/matmul.c, QDOT_MAX_ROWS). The two round differently,
 *    so a sequence decoded in a batch of 16 would not get the tokens it gets
 *    alone, and a prompt prefilled after a prefix-cache hit (only its last
 *    tokens) would not get the keys and values of a cold prefill. Products
 *    therefore run in groups of at most 8 rows (row_group), which keeps
 *    every row on the same path whatever the batch or the chunk. Weights
 *    packed for inference (toy_llama_pack_weights, on CPUs with AVX-512
 *    VNNI) give the same bits at every row count, so then no grouping;
 *  - outputs: the logits of the last position only (a prefill of T tokens
 *    never materialises T x vocab logits), every position's (a decode step
 *    that checks drafts), or an embedding: the mean of the final-norm hidden
 *    states over positions, or the first's or the last's.
 *
 * Keep in step with src/models/llama.c and gpt2.c when they change.
 */
#include <math.h>

#include "serve/serve-internal.h"
#include "models/qkv.h"
#include "toy/bert.h"

/* ---- the model ---------------------------------------------------------------- */

/* x {d, T, B}: the one position an output needs (the first, for SRV_OUT_FIRST_HIDDEN; else the last), as a view */
static struct toy_tensor *one_position(struct toy_ctx *ctx, struct toy_tensor *x, enum srv_out out) {
    int64_t T = x->ne[1];
    if (T == 1) return x;
    int64_t ne[3] = {x->ne[0], 1, x->ne[2]};
    size_t nb[3] = {x->nb[0], x->nb[1], x->nb[2]};
    return toy_view(ctx, x, 3, ne, nb, out == SRV_OUT_FIRST_HIDDEN ? 0 : (size_t)(T - 1) * x->nb[1]);
}

struct srv_model toy_srv_model_llama(struct toy_llama *m) {
    const struct toy_llama_config *c = &m->cfg;
    return (struct srv_model){.llama = m, .arch = c->arch[0] ? c->arch : "llama", .vocab = c->vocab,
                              .d_model = c->d_model, .n_layers = c->n_layers, .n_heads = c->n_heads,
                              .n_kv_heads = c->n_kv_heads, .d_head = toy_llama_head_dim(c), .d_ff = c->d_ff,
                              .max_ctx = c->max_ctx, .pooling = c->pooling};
}

struct srv_model toy_srv_model_gpt2(struct toy_gpt2 *m) {
    const struct toy_gpt2_config *c = &m->cfg;
    return (struct srv_model){.gpt2 = m, .arch = "gpt2", .vocab = c->vocab, .d_model = c->d_model,
                              .n_layers = c->n_layers, .n_heads = c->n_heads, .n_kv_heads = c->n_heads,
                              .d_head = c->d_model / c->n_heads, .d_ff = c->d_ff, .max_ctx = c->max_ctx};
}

struct srv_model toy_srv_model_bert(struct toy_bert *m) {
    const struct toy_bert_config *c = &m->cfg;
    return (struct srv_model){.bert = m, .arch = "bert", .vocab = c->vocab, .d_model = c->d_model,
                              .n_layers = c->n_layers, .n_heads = c->n_heads, .n_kv_heads = c->n_heads,
                              .d_head = c->d_model / c->n_heads, .d_ff = c->d_ff, .max_ctx = c->max_ctx,
                              .pooling = c->pooling};
}

enum toy_status toy_srv_pack(const struct srv_model *m) {
    return m->llama ? toy_llama_pack_weights(m->llama)
           : m->bert ? toy_bert_pack_weights(m->bert)
                     : toy_gpt2_pack_weights(m->gpt2);
}

enum toy_status toy_srv_cache_init(const struct srv_model *m, struct toy_kv_cache *c, int64_t n_ctx, int64_t n_seq,
                                   enum toy_dtype type) {
    if (m->bert) return toy_error(TOY_ERR_UNSUPPORTED, "a BERT encoder has no KV cache: it encodes each text whole");
    return m->llama ? toy_kv_cache_init_type(c, m->llama, n_ctx, n_seq, type)
                    : toy_gpt2_cache_init_type(c, m->gpt2, n_ctx, n_seq, type);
}

/* ---- the forward ---------------------------------------------------------------- */

static struct toy_tensor *proj(struct toy_ctx *ctx, bool bf16, struct toy_tensor *x, struct toy_tensor *w,
                               struct toy_tensor *b) {
    if (bf16 && w->type == TOY_F32) w = toy_cast(ctx, w, TOY_BF16);
    return toy_linear(ctx, x, w, b);
}

/* proj over groups of at most rg rows of x {in, T, B} (rg 0: one product) */
static struct toy_tensor *projg(struct toy_ctx *ctx, bool bf16, struct toy_tensor *x, struct toy_tensor *w,
                                struct toy_tensor *b, int64_t rg) {
    int64_t T = x->ne[1], B = x->ne[2], R = T * B;
    if (rg <= 0 || R <= rg) return proj(ctx, bf16, x, w, b);
    if (!toy_is_contiguous(x)) x = toy_cont(ctx, x);
    struct toy_tensor *y = NULL;
    for (int64_t r0 = 0; r0 < R; r0 += rg) {
        int64_t ne[2] = {x->ne[0], R - r0 < rg ? R - r0 : rg};
        size_t nb[2] = {x->nb[0], x->nb[1]};
        struct toy_tensor *yg = proj(ctx, bf16, toy_view(ctx, x, 2, ne, nb, (size_t)r0 * x->nb[1]), w, b);
        y = y ? toy_concat(ctx, y, yg, 1) : yg;
    }
    return toy_reshape_3d(ctx, y, y->ne[0], T, B);
}

static bool row_count_dependent(const struct toy_tensor *t) {
    return t && t->n_dims == 2 && (t->type == TOY_Q8_0 || t->type == TOY_Q4_0) && !t->packed;
}

int64_t toy_srv_row_group(const struct srv_model *m) {
    if (m->bert) return 0; /* embeddings only: no tokens sampled, so nothing to keep on one path */
    int n = m->llama ? toy_llama_n_tensors(m->llama) : toy_gpt2_n_tensors(m->gpt2);
    for (int i = 0; i < n; i++)
        if (row_count_dependent(m->llama ? toy_llama_tensor(m->llama, i) : toy_gpt2_tensor(m->gpt2, i))) return 8;
    return row_count_dependent(m->llama ? m->llama->output : m->gpt2->output) ? 8 : 0;
}

/* sequence b's rows of x {D, H, T, B}: x's {D, H, T, b} without off, else rows [off[b], off[b+1]) of x {D, H, R, 1},
 * as a view {D, H, rows, 1} */
static struct toy_tensor *seq_view(struct toy_ctx *ctx, struct toy_tensor *x, const struct srv_seqs *sq, int b) {
    int64_t r0 = sq->off ? sq->off[b] : 0, nr = sq->off ? sq->off[b + 1] - r0 : x->ne[2];
    if (x->ne[3] == 1 && nr == x->ne[2]) return x;
    int64_t ne[4] = {x->ne[0], x->ne[1], nr, 1};
    return toy_view(ctx, x, 4, ne, x->nb, (size_t)(sq->off ? 0 : b) * x->nb[3] + (size_t)r0 * x->nb[2]);
}

/* Attention of layer l over q, k, v {hd, H, T, B}: with seqs, sequence b's keys and values stored into its cache
 * from its n_past and its queries attending over them (with a pool, all rows at once, at their positions pos);
 * without, causal over the T tokens */
static struct toy_tensor *attend(struct toy_ctx *ctx, struct toy_tensor *q, struct toy_tensor *k, struct toy_tensor *v,
                                 struct toy_tensor *pos, const struct srv_seqs *sq, int64_t l,
                                 const struct toy_attn_params *attn) {
    if (!sq) return toy_attention(ctx, q, k, v, attn);
    if (sq->pool && sq->off && sq->n > 1) { /* ~5 nodes a layer instead of ~4 a sequence (~2 ms of a 16-slot step) */
        struct toy_tensor *ks = toy_kv_store_rows(ctx, sq->pool->k[l], k, sq->seq, pos);
        struct toy_tensor *vs = v == k ? ks : toy_kv_store_rows(ctx, sq->pool->v[l], v, sq->seq, pos);
        return toy_attention_rows(ctx, q, ks, vs, sq->seq, pos, attn);
    }
    struct toy_tensor *a = NULL;
    for (int b = 0; b < sq->n; b++) {
        struct toy_kv_cache *kc = sq->caches[b];
        struct toy_tensor *ks = toy_kv_store(ctx, kc->k[l], seq_view(ctx, k, sq, b), kc->n_past);
        struct toy_tensor *vs = v == k ? ks : toy_kv_store(ctx, kc->v[l], seq_view(ctx, v, sq, b), kc->n_past);
        struct toy_tensor *ab = toy_attention_cached(ctx, seq_view(ctx, q, sq, b), ks, vs, kc->n_past, attn);
        a = a ? toy_concat(ctx, a, ab, sq->off ? 2 : 3) : ab;
    }
    return a;
}

static struct toy_tensor *llama_forward(struct toy_ctx *ctx, struct toy_llama *m, struct toy_tensor *tokens,
                                        struct toy_tensor *pos, const struct srv_seqs *sq, enum srv_out out,
                                        int64_t rg) {
    const struct toy_llama_config *c = &m->cfg;
    const bool bf16 = m->matmul_type == TOY_BF16;
    int64_t T = tokens->ne[0], B = tokens->ne[1], d = c->d_model;
    int64_t H = c->n_heads, Hkv = c->n_kv_heads, hd = toy_llama_head_dim(c);
    struct toy_tensor *x = toy_get_rows(ctx, m->tok_embd, tokens); /* {d, T, B} */
    if (c->embed_scale) x = toy_scale(ctx, x, sqrtf((float)d));
    if (c->embed_mult > 0) x = toy_scale(ctx, x, c->embed_mult); /* Granite */
    /* the positions a sequence may reach (LongRoPE's choice), as the model's cached forward takes them */
    const int64_t n_ctx = sq ? sq->caches[0]->k[0]->ne[2] : T;
    for (int64_t l = 0; l < c->n_layers; l++) {
        struct toy_llama_layer *L = &m->layers[l];
        struct toy_attn_params attn = toy_llama_attn_params(m, l);
        /* (OLMo 2 norms after attention and the MLP only) */
        struct toy_tensor *h = L->attn_norm ? toy_rms_norm(ctx, x, L->attn_norm, c->norm_eps) : x, *q, *k, *v;
        if (c->kv_lora_rank) { /* latent attention (its products in one piece: see toy_llama_mla_qkv) */
            toy_llama_mla_qkv(ctx, c, L, h, pos, &q, &k);
            v = k;
        } else {
            q = toy_reshape_4d(ctx, projg(ctx, bf16, h, L->wq, L->bq, rg), hd, H, T, B);
            k = toy_reshape_4d(ctx, projg(ctx, bf16, h, L->wk, L->bk, rg), hd, Hkv, T, B);
            v = toy_reshape_4d(ctx, projg(ctx, bf16, h, L->wv, L->bv, rg), hd, Hkv, T, B);
            toy_llama_qk_norm(ctx, c, L, &q, &k);
            q = toy_llama_rope(ctx, m, l, toy_llama_attn_temp(ctx, m, q, pos), pos, n_ctx);
            k = toy_llama_rope(ctx, m, l, k, pos, n_ctx);
        }
        struct toy_tensor *a = attend(ctx, q, k, v, pos, sq, l, &attn); /* {hd, H, T, B} */
        a = c->kv_lora_rank ? toy_llama_mla_out(ctx, c, L, a) : toy_reshape_3d(ctx, a, hd * H, T, B);
        a = projg(ctx, bf16, a, L->wo, L->bo, rg);
        if (L->post_attn_norm) a = toy_rms_norm(ctx, a, L->post_attn_norm, c->norm_eps);
        if (c->residual_mult > 0) a = toy_scale(ctx, a, c->residual_mult);
        x = toy_add(ctx, x, a);
        h = L->ffn_norm ? toy_rms_norm(ctx, x, L->ffn_norm, c->norm_eps) : x;
        struct toy_tensor *f;
        if (L->ffn_gate_inp) {
            f = toy_llama_moe_ffn(ctx, m, L, h, NULL);
        } else {
            struct toy_tensor *g = projg(ctx, bf16, h, L->w_gate, NULL, rg), *u = projg(ctx, bf16, h, L->w_up, NULL, rg);
            f = projg(ctx, bf16, toy_llama_glu(ctx, c, g, u), L->w_down, NULL, rg);
        }
        if (L->post_ffn_norm) f = toy_rms_norm(ctx, f, L->post_ffn_norm, c->norm_eps);
        if (c->residual_mult > 0) f = toy_scale(ctx, f, c->residual_mult);
        x = toy_add(ctx, x, f);
    }
    if (out == SRV_OUT_MEAN_HIDDEN) {
        x = toy_rms_norm(ctx, x, m->out_norm, c->norm_eps); /* {d, T, B} */
        return toy_mean(ctx, x, 1);                          /* {d, 1, B} */
    }
    /* only the last position goes through the head, unless all are asked for */
    x = toy_rms_norm(ctx, out == SRV_OUT_LOGITS_ALL ? x : one_position(ctx, x, out), m->out_norm, c->norm_eps);
    if (out != SRV_OUT_LOGITS_LAST && out != SRV_OUT_LOGITS_ALL) return x; /* the first or last position's hidden state */
    return toy_llama_head_out(ctx, c, projg(ctx, bf16, x, m->output, NULL, rg)); /* {vocab, 1, B} */
}

static struct toy_tensor *gpt2_forward(struct toy_ctx *ctx, struct toy_gpt2 *m, struct toy_tensor *tokens,
                                       struct toy_tensor *pos, const struct srv_seqs *sq, enum srv_out out,
                                       int64_t rg) {
    const struct toy_gpt2_config *c = &m->cfg;
    const bool bf16 = m->matmul_type == TOY_BF16;
    int64_t T = tokens->ne[0], B = tokens->ne[1], d = c->d_model, H = c->n_heads, hd = d / H;
    struct toy_tensor *x = toy_get_rows(ctx, m->tok_embd, tokens); /* {d, T, B} */
    struct toy_tensor *pe = toy_get_rows(ctx, m->pos_embd, pos);   /* {d, T*B} */
    x = toy_add(ctx, x, B > 1 ? toy_reshape_3d(ctx, pe, d, T, B) : pe);
    const struct toy_attn_params attn = {.causal = true};
    for (int64_t l = 0; l < c->n_layers; l++) {
        struct toy_gpt2_layer *L = &m->layers[l];
        struct toy_tensor *h = toy_layer_norm(ctx, x, L->attn_norm, L->attn_norm_b, c->norm_eps);
        struct toy_tensor *qkv = projg(ctx, bf16, h, L->w_qkv, L->b_qkv, rg); /* {3d, T, B} */
        struct toy_tensor *q = toy_qkv_part(ctx, qkv, 0, hd, H), *k = toy_qkv_part(ctx, qkv, 1, hd, H),
                          *v = toy_qkv_part(ctx, qkv, 2, hd, H);
        struct toy_tensor *a = attend(ctx, q, k, v, pos, sq, l, &attn); /* {hd, H, T, B} */
        a = projg(ctx, bf16, toy_reshape_3d(ctx, a, d, T, B), L->w_o, L->b_o, rg);
        x = toy_add(ctx, x, a);
        h = toy_layer_norm(ctx, x, L->ffn_norm, L->ffn_norm_b, c->norm_eps);
        struct toy_tensor *f = toy_gelu(ctx, projg(ctx, bf16, h, L->w_up, L->b_up, rg)); /* {d_ff, T, B} */
        x = toy_add(ctx, x, projg(ctx, bf16, f, L->w_down, L->b_down, rg));
    }
    if (out == SRV_OUT_MEAN_HIDDEN) {
        x = toy_layer_norm(ctx, x, m->out_norm, m->out_norm_b, c->norm_eps); /* {d, T, B} */
        return toy_mean(ctx, x, 1);                                         /* {d, 1, B} */
    }
    x = toy_layer_norm(ctx, out == SRV_OUT_LOGITS_ALL ? x : one_position(ctx, x, out), m->out_norm, m->out_norm_b,
                       c->norm_eps);
    if (out != SRV_OUT_LOGITS_LAST && out != SRV_OUT_LOGITS_ALL) return x;
    return projg(ctx, bf16, x, m->output, NULL, rg); /* {vocab, 1, B} */
}

/* a BERT's pooled embedding (its hidden states have no final norm or head; logits are never asked of it) */
static struct toy_tensor *bert_forward(struct toy_ctx *ctx, struct toy_bert *m, struct toy_tensor *tokens,
                                       struct toy_tensor *pos, enum srv_out out) {
    struct toy_tensor *h = toy_bert_forward(ctx, m, tokens, pos);
    if (out == SRV_OUT_MEAN_HIDDEN) return toy_bert_pool(ctx, h, TOY_POOLING_MEAN);
    return toy_cont(ctx, toy_bert_pool(ctx, h, out == SRV_OUT_FIRST_HIDDEN ? TOY_POOLING_CLS : TOY_POOLING_LAST));
}

struct toy_tensor *toy_srv_forward(struct toy_ctx *ctx, const struct srv_model *m, struct toy_tensor *tokens,
                                   struct toy_tensor *pos, const struct srv_seqs *seqs, enum srv_out out,
                                   int64_t rg) {
    if (m->bert) return bert_forward(ctx, m->bert, tokens, pos, out);
    return m->llama ? llama_forward(ctx, m->llama, tokens, pos, seqs, out, rg)
                    : gpt2_forward(ctx, m->gpt2, tokens, pos, seqs, out, rg);
}
