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

#include <stdint.h>

#include "toy/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

struct toy_gguf_writer;
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
    /* the Llama model when this is one (text generation at the end of a run), else NULL */
    struct toy_llama *llama;
};

#ifdef __cplusplus
}
#endif
#endif
