/* toy/bert.h: BERT-family text encoders (Devlin et al. 2018) for
 * embeddings: bge, all-MiniLM, e5, as llama.cpp's converter writes them
 * (GGUF general.architecture "bert"). Token, token-type (row 0, "sentence
 * A") and learned position embeddings, a LayerNorm over their sum, then
 * post-LN blocks: x = LN(x + attn(x)), x = LN(x + ffn(x)), with
 * bidirectional multi-head attention, a GELU MLP and biases on every
 * projection. The hidden states of the last block are the output; pooling
 * (mean over the positions, or the first, [CLS], position's) makes one
 * vector of a text.
 *
 * Tensors (llama.cpp's names): token_embd.weight, token_types.weight,
 * position_embd.weight, token_embd_norm.{weight,bias}, and per block
 * blk.N.attn_{q,k,v,output}.{weight,bias}, blk.N.attn_output_norm.{weight,
 * bias}, blk.N.ffn_{up,down}.{weight,bias}, blk.N.layer_output_norm.{weight,
 * bias}. Keys: bert.{context_length, embedding_length, feed_forward_length,
 * block_count, attention.head_count, attention.layer_norm_epsilon,
 * pooling_type}.
 *
 * GELU is the tanh approximation, as llama.cpp computes BERT's; Hugging
 * Face's "gelu" is the exact erf form (embeddings differ by ~1e-4 in cosine
 * similarity: tests/torch/ref_bert.py measures it).
 *
 *     struct toy_bert *m;
 *     if (toy_bert_load("bge-small-en-v1.5.gguf", &m)) ...;     // mapped
 *     struct toy_tensor *h = toy_bert_forward(ctx, m, tokens, pos);  // {d, T, B}
 *     struct toy_tensor *e = toy_bert_pool(ctx, m, h, TOY_POOLING_MEAN); // {d, 1, B}
 */
#ifndef TOY_BERT_H
#define TOY_BERT_H

#include <stdbool.h>
#include <stdint.h>

#include "toy/llama.h"
#include "toy/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

struct toy_gguf;
struct toy_gguf_writer;

struct toy_bert_config {
    int64_t vocab, d_model, n_layers, n_heads, d_ff, max_ctx;
    int64_t n_types;          /* rows of token_types.weight (2); 0: none */
    float norm_eps;           /* LayerNorm epsilon (1e-12) */
    enum toy_pooling pooling; /* bert.pooling_type; NONE when the file names none */
};

struct toy_bert_layer {
    struct toy_tensor *wq, *bq, *wk, *bk, *wv, *bv; /* (d, d), (d) */
    struct toy_tensor *wo, *bo;                     /* (d, d), (d) */
    struct toy_tensor *attn_norm, *attn_norm_b;     /* (d): after attention and its residual */
    struct toy_tensor *w_up, *b_up;                 /* (d_ff, d), (d_ff) */
    struct toy_tensor *w_down, *b_down;             /* (d, d_ff), (d) */
    struct toy_tensor *out_norm, *out_norm_b;       /* (d): after the MLP and its residual */
};

struct toy_bert {
    struct toy_bert_config cfg;
    struct toy_ctx *ctx;   /* owns the parameters (or their metadata, when mapped) */
    struct toy_gguf *gguf; /* the mapped file, when loaded */
    struct toy_tensor *tok_embd, *type_embd, *pos_embd; /* (V, d), (n_types, d) or NULL, (max_ctx, d) */
    struct toy_tensor *embd_norm, *embd_norm_b;          /* (d) */
    struct toy_bert_layer *layers;
    void *pack_block; /* the packed matrices (toy_bert_pack_weights) */
    size_t pack_bytes;
};

/* TOY_ERR_INVALID_ARG naming the bad field. */
enum toy_status toy_bert_check_config(const struct toy_bert_config *cfg);
/* A randomly initialised model (f32; weights ~ N(0, 0.02) except the norms,
 * which are 1 + N(0, 0.1), and biases N(0, 0.02): every parameter matters
 * in a test against a reference). NULL on a bad config or OOM. */
struct toy_bert *toy_bert_new(const struct toy_bert_config *cfg, uint64_t seed);
void toy_bert_free(struct toy_bert *m);
/* The parameter tensors in a fixed order. */
int toy_bert_n_tensors(const struct toy_bert *m);
struct toy_tensor *toy_bert_tensor(const struct toy_bert *m, int i);

/* Hidden states {d, T, B} of I32 tokens {T, B} at I32 positions {T}
 * (shared by the batch; < max_ctx). Every position attends every other of
 * its sequence: a text is encoded whole, never in chunks. */
struct toy_tensor *toy_bert_forward(struct toy_ctx *ctx, struct toy_bert *m, struct toy_tensor *tokens,
                                    struct toy_tensor *pos);
/* One vector {d, 1, B} of hidden states h {d, T, B}: their mean over the
 * positions (MEAN, and NONE), the first's (CLS) or the last's (LAST). */
struct toy_tensor *toy_bert_pool(struct toy_ctx *ctx, struct toy_tensor *h, enum toy_pooling pooling);

/* ---- GGUF ------------------------------------------------------------------ */

/* True when the file's general.architecture is "bert". */
bool toy_gguf_is_bert(const struct toy_gguf *g);
/* Opens a GGUF of architecture "bert", its weights mapped (F32, F16, BF16 or
 * quantized matrices; norms and biases read as f32). Errors name the file
 * and the tensor or key: TOY_ERR_UNSUPPORTED (another architecture, a
 * fused attn_qkv, a type toy cannot read), TOY_ERR_FORMAT (a missing
 * tensor), TOY_ERR_SHAPE. */
enum toy_status toy_bert_load(const char *path, struct toy_bert **out);
/* Prepares the matrices for inference on this CPU (toy_llama_pack_weights'
 * layouts); idempotent; toy_bert_free frees the copies. */
enum toy_status toy_bert_pack_weights(struct toy_bert *m);
/* Metadata and tensors into a GGUF writer (2-D weights as type: TOY_F32,
 * TOY_F16 or TOY_BF16; the embedding tables, norms and biases stay f32). */
enum toy_status toy_bert_write_gguf(const struct toy_bert *m, struct toy_gguf_writer *w, enum toy_dtype type);

#ifdef __cplusplus
}
#endif
#endif
