/* toy/model.h: the interface between a language-model family and the code
 * that drives any of them (the trainer, evaluation). A family fills a
 * struct toy_lm with its functions; the Llama family's is toy_llama_lm().
 *
 *     struct toy_lm lm = toy_llama_lm(model);
 *     toy_trainer_new_lm(&lm, tok, data, &opts, run_dir, events, 0, &trainer);
 *
 * Plain data: copy it freely; `self` is borrowed.
 */
#ifndef TOY_MODEL_H
#define TOY_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "toy/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

struct toy_gguf_writer;
struct toy_kv_cache;
struct toy_llama;

struct toy_lm {
    void *self;
    const char *arch;           /* "llama", "gpt2", ... */
    int64_t vocab, max_ctx;
    /* logits {vocab, T, B} of I32 tokens {T, B} at I32 positions {T} */
    struct toy_tensor *(*forward)(void *self, struct toy_ctx *ctx, struct toy_tensor *tokens, struct toy_tensor *pos);
    /* every parameter tensor, in a fixed order */
    int (*n_tensors)(void *self);
    struct toy_tensor *(*tensor)(void *self, int i);
    /* metadata and tensors into a GGUF writer (llama.cpp conventions) */
    enum toy_status (*write_gguf)(void *self, struct toy_gguf_writer *w, enum toy_dtype type);
    /* TOY_F32 or TOY_BF16 matmuls (mixed precision); may be NULL */
    void (*set_matmul_type)(void *self, enum toy_dtype type);
    /* the Llama model when this is one, else NULL */
    struct toy_llama *llama;
    /* ---- KV-cache inference (toy_generator_new_lm); NULL where a family has none */
    /* lays the weights out for this CPU's inference kernels (may be NULL) */
    enum toy_status (*pack_weights)(void *self);
    /* a cache of n_ctx positions for n_seq sequences, of TOY_F32 or TOY_F16 rows */
    enum toy_status (*cache_init)(void *self, struct toy_kv_cache *c, int64_t n_ctx, int64_t n_seq, enum toy_dtype type);
    /* logits {vocab, T, B} of tokens {T, B} at positions pos, stored into the
     * cache from its n_past; last_only: of the last position only {vocab, 1, B} */
    struct toy_tensor *(*forward_cached)(void *self, struct toy_ctx *ctx, struct toy_kv_cache *c,
                                         struct toy_tensor *tokens, struct toy_tensor *pos, bool last_only);
};

#ifdef __cplusplus
}
#endif
#endif
