/* toy/llama.h: the Llama-family transformer (pre-norm RMSNorm, RoPE,
 * grouped-query attention, SwiGLU MLP, tied or untied output head).
 *
 * Parameters live in one context and use llama.cpp's tensor names
 * (token_embd.weight, blk.N.attn_q.weight, ...), so a model moves to and
 * from GGUF without renaming. The forward pass is a graph: build it once for
 * a (T, B) shape and run it many times.
 *
 *     struct toy_llama_config cfg = toy_llama_preset("tiny");
 *     cfg.vocab = 256;
 *     struct toy_llama *m = toy_llama_new(&cfg, 1234);        // random init
 *     struct toy_tensor *logits = toy_llama_forward(gctx, m, tokens, pos);
 *
 * Random init (documented, seeded): token embeddings and every projection
 * ~ N(0, 0.02); the projections that write into the residual stream
 * (attn_output, ffn_down) are scaled by 1/sqrt(2 n_layers); norm weights 1.
 */
#ifndef TOY_LLAMA_H
#define TOY_LLAMA_H

#include <stdbool.h>
#include <stdint.h>

#include "toy/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

struct toy_llama_config {
    int64_t vocab, d_model, n_layers, n_heads, n_kv_heads, d_ff, max_ctx;
    float norm_eps;
    float rope_base;
    bool tied;          /* output head shares token_embd */
};

struct toy_llama_layer {
    struct toy_tensor *attn_norm, *wq, *wk, *wv, *wo;
    struct toy_tensor *ffn_norm, *w_gate, *w_up, *w_down;
};

struct toy_llama {
    struct toy_llama_config cfg;
    /* TOY_F32 (default) or TOY_BF16: mixed precision. With BF16 the
     * projections run on bf16 copies of the f32 master weights (cast inside
     * the graph each step; gradients flow back to the f32 masters). */
    enum toy_dtype matmul_type;
    struct toy_ctx *ctx; /* owns the parameters */
    struct toy_tensor *tok_embd, *out_norm, *output; /* output == tok_embd when tied */
    struct toy_llama_layer *layers;
};

/* "tiny" (d 64, 2 layers), "small" (d 256, 4 layers), "stories15m" and
 * "smollm2-135m" shapes; vocab must be set by the caller for the first two.
 * Unknown names give a zeroed config (d_model 0). */
struct toy_llama_config toy_llama_preset(const char *name);
/* Validates a config: TOY_ERR_INVALID_ARG naming the bad field. */
enum toy_status toy_llama_check_config(const struct toy_llama_config *cfg);

/* A randomly initialised model (trainable parameters). NULL on OOM. */
struct toy_llama *toy_llama_new(const struct toy_llama_config *cfg, uint64_t seed);
void toy_llama_free(struct toy_llama *m);
int64_t toy_llama_n_params(const struct toy_llama *m);

/* Logits {vocab, T, B} for I32 tokens {T, B} at I32 positions {T}. */
struct toy_tensor *toy_llama_forward(struct toy_ctx *ctx, struct toy_llama *m, struct toy_tensor *tokens,
                                     struct toy_tensor *pos);

#ifdef __cplusplus
}
#endif
#endif
