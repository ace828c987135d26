/* toy/gpt2.h: the GPT-2 family (Radford et al. 2019): learned position
 * embeddings, pre-LN blocks with LayerNorm (weight + bias), one fused QKV
 * projection, causal multi-head attention, a GELU (tanh) MLP, biases on
 * every projection, a final LayerNorm and a head tied to the token
 * embeddings.
 *
 * Parameters use llama.cpp's gpt2 tensor names (token_embd.weight,
 * position_embd.weight, blk.N.attn_norm.{weight,bias},
 * blk.N.attn_qkv.{weight,bias} with rows [q; k; v], blk.N.attn_output,
 * blk.N.ffn_norm, blk.N.ffn_up, blk.N.ffn_down, output_norm.{weight,bias})
 * and its `gpt2.*` metadata keys, so `toy convert` output of a Hugging Face
 * GPT-2 folder and llama.cpp's own GPT-2 GGUFs load directly.
 *
 *     struct toy_gpt2_config cfg = toy_gpt2_preset("tiny");
 *     cfg.vocab = 512;
 *     struct toy_gpt2 *m = toy_gpt2_new(&cfg, 1234);          // random init
 *     struct toy_tensor *logits = toy_gpt2_forward(gctx, m, tokens, pos);
 *     struct toy_lm lm = toy_gpt2_lm(m);                      // for the trainer
 *
 * Random init (GPT-2 / nanoGPT): token and position embeddings and every
 * projection ~ N(0, 0.02), attn_output and ffn_down scaled by
 * 1/sqrt(2 n_layers); LayerNorm weights 1; every bias 0.
 */
#ifndef TOY_GPT2_H
#define TOY_GPT2_H

#include <stdbool.h>
#include <stdint.h>

#include "toy/generate.h"
#include "toy/llama.h"
#include "toy/model.h"
#include "toy/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

struct toy_gguf;
struct toy_gguf_writer;

struct toy_gpt2_config {
    int64_t vocab, d_model, n_layers, n_heads, d_ff, max_ctx;
    float norm_eps;         /* LayerNorm epsilon (1e-5) */
};

struct toy_gpt2_layer {
    struct toy_tensor *attn_norm, *attn_norm_b;   /* (d) */
    struct toy_tensor *w_qkv, *b_qkv;             /* (3d, d), (3d) */
    struct toy_tensor *w_o, *b_o;                 /* (d, d), (d) */
    struct toy_tensor *ffn_norm, *ffn_norm_b;     /* (d) */
    struct toy_tensor *w_up, *b_up;               /* (d_ff, d), (d_ff) */
    struct toy_tensor *w_down, *b_down;           /* (d, d_ff), (d) */
};

struct toy_gpt2 {
    struct toy_gpt2_config cfg;
    struct toy_ctx *ctx;    /* owns the parameters (or their metadata, when mapped) */
    struct toy_gguf *gguf;  /* the mapped file, when loaded */
    struct toy_tensor *tok_embd, *pos_embd;        /* (V, d), (max_ctx, d) */
    struct toy_tensor *out_norm, *out_norm_b;      /* (d) */
    struct toy_tensor *output;                     /* == tok_embd when tied */
    bool tied;
    struct toy_gpt2_layer *layers;
    enum toy_dtype matmul_type;                    /* TOY_F32 or TOY_BF16 (mixed precision) */
    bool bf16_float_only;                          /* with TOY_BF16: only f32/f16 matrices (toy_gpt2_infer_bf16) */
    void *pack_block;                              /* the packed matrices (toy_gpt2_pack_weights) */
    size_t pack_bytes;
};

/* "tiny" (d 64, 2 layers, 4 heads), "small" (d 256, 4 layers, 8 heads),
 * "124m" (GPT-2 small: vocab 50257, d 768, 12 layers, 12 heads, context
 * 1024). vocab must be set by the caller for the first two. Unknown names
 * (and NULL) give a config with d_model 0. */
struct toy_gpt2_config toy_gpt2_preset(const char *name);
/* TOY_ERR_INVALID_ARG naming the bad field. */
enum toy_status toy_gpt2_check_config(const struct toy_gpt2_config *cfg);

/* A randomly initialised model (trainable f32 parameters, tied head). NULL
 * on a bad config (message in toy_last_error) or OOM. */
struct toy_gpt2 *toy_gpt2_new(const struct toy_gpt2_config *cfg, uint64_t seed);
void toy_gpt2_free(struct toy_gpt2 *m);
int64_t toy_gpt2_n_params(const struct toy_gpt2 *m);
/* The parameter tensors in a fixed order (for optimizers and checkpoints). */
int toy_gpt2_n_tensors(const struct toy_gpt2 *m);
struct toy_tensor *toy_gpt2_tensor(const struct toy_gpt2 *m, int i);
/* Bytes of weights one decode step reads: every tensor once, but one row
 * of the position table (and of the token table, when the head is not
 * tied to it). */
double toy_gpt2_decode_bytes(const struct toy_gpt2 *m);

/* Logits {vocab, T, B} of I32 tokens {T, B} at I32 positions {T} (shared by
 * the batch) or {T*B}. Positions must be < max_ctx (get_rows checks). */
struct toy_tensor *toy_gpt2_forward(struct toy_ctx *ctx, struct toy_gpt2 *m, struct toy_tensor *tokens,
                                    struct toy_tensor *pos);

/* The model behind the generic language-model interface (toy/model.h). */
struct toy_lm toy_gpt2_lm(struct toy_gpt2 *m);

/* ---- KV-cache inference ------------------------------------------------------
 * The cache is the Llama family's struct toy_kv_cache (per layer
 * {head_dim, n_heads, n_ctx, n_seq} keys and values); free it with
 * toy_kv_cache_free. Rows are f32; _type: TOY_F32 or TOY_F16 (half the
 * memory and the attention's reads, as `toy generate` keeps it). */
enum toy_status toy_gpt2_cache_init(struct toy_kv_cache *c, const struct toy_gpt2 *m, int64_t n_ctx, int64_t n_seq);
enum toy_status toy_gpt2_cache_init_type(struct toy_kv_cache *c, const struct toy_gpt2 *m, int64_t n_ctx,
                                         int64_t n_seq, enum toy_dtype type);
/* Logits {vocab, Tn, n_seq} of Tn new tokens at positions n_past ..
 * n_past+Tn-1 (pos filled by the caller; c->n_past set before each run). */
struct toy_tensor *toy_gpt2_forward_cached(struct toy_ctx *ctx, struct toy_gpt2 *m, struct toy_kv_cache *c,
                                           struct toy_tensor *tokens, struct toy_tensor *pos);

/* Generation, once: a toy_generator over toy_gpt2_lm(m) (toy/generate.h),
 * made, run and freed: `prompt` prefilled in one graph, then one token a run
 * of a graph built once, with the sampler, stop conditions (EOS, stop
 * strings, n_predict, the context) and callback of toy/generate.h. n_ctx <=
 * 0: the model's context. The cache is f32; _kv: kv_type TOY_F32 or
 * TOY_F16. To generate again, or with a trace, keep a generator:
 * toy_generator_new_lm(&lm, ...) with lm = toy_gpt2_lm(m). */
enum toy_status toy_gpt2_generate(struct toy_gpt2 *m, const struct toy_tokenizer *tok, int64_t n_ctx,
                                  struct toy_threadpool *tp, const int32_t *prompt, int64_t n_prompt,
                                  const struct toy_generate_params *p, toy_token_fn fn, void *ud,
                                  struct toy_generate_result *res);
enum toy_status toy_gpt2_generate_kv(struct toy_gpt2 *m, const struct toy_tokenizer *tok, int64_t n_ctx,
                                     enum toy_dtype kv_type, struct toy_threadpool *tp, const int32_t *prompt,
                                     int64_t n_prompt, const struct toy_generate_params *p, toy_token_fn fn, void *ud,
                                     struct toy_generate_result *res);

/* ---- GGUF ------------------------------------------------------------------ */

/* Opens a GGUF whose general.architecture is "gpt2". Weights are mapped
 * (frozen; F32/F16/BF16/quantized 2-D weights) or, with trainable, copied to
 * f32 trainable tensors. An output.weight equal to token_embd.weight (as
 * llama.cpp's converter writes it) loads as a tied head. */
enum toy_status toy_gpt2_load(const char *path, bool trainable, struct toy_gpt2 **out);
/* Prepares the model's matrices for inference on this CPU, as
 * toy_llama_pack_weights does (quantized ones in the int8 kernels' layout,
 * float ones the file maps copied; the file's pages released). The
 * generator calls it; idempotent; toy_gpt2_free frees the copies. */
enum toy_status toy_gpt2_pack_weights(struct toy_gpt2 *m);
/* Mixed-precision inference, as toy_llama_infer_bf16 (`--bf16`): the
 * products over f32 and f16 matrices in bf16 (quantized ones keep the int8
 * kernels), where the CPU multiplies bf16 faster than f32 or the default
 * device is a GPU. Returns whether any product now runs in bf16. */
bool toy_gpt2_infer_bf16(struct toy_gpt2 *m);
/* Metadata and tensors into a GGUF writer; type TOY_F32, TOY_F16 or
 * TOY_BF16 for the 2-D weights (LayerNorms, biases and position embeddings
 * of any type stay as they are when F32). A tied head writes no
 * output.weight. */
enum toy_status toy_gpt2_write_gguf(const struct toy_gpt2 *m, struct toy_gguf_writer *w, enum toy_dtype type);
/* True when the file's general.architecture is "gpt2". */
bool toy_gguf_is_gpt2(const struct toy_gguf *g);

#ifdef __cplusplus
}
#endif
#endif
