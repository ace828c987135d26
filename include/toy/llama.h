/* toy/llama.h: the Llama-family transformer: pre-norm RMSNorm, RoPE,
 * grouped-query attention, SwiGLU (or GeGLU) MLP, tied or untied head, and
 * the family flags of Qwen2 (QKV bias), Qwen3 (QK-norm), Mistral (sliding
 * window), Gemma 2 (alternating sliding window, attention and final logit
 * softcaps, sandwich norms, embedding scale, GeGLU) and Gemma 3 (Gemma 2's
 * norms and GeGLU with QK-norm, five sliding layers to one global, and a
 * RoPE base of their own for the sliding layers), SmolLM3 (no rotary
 * embedding on every fourth layer), OLMo 2 (RMSNorm after attention and
 * the MLP rather than before, QK-norm over the whole projections) and
 * Granite (multipliers on the embeddings, the residual branches, the
 * attention scores and the logits).
 *
 * Parameters use llama.cpp's tensor names (token_embd.weight,
 * blk.N.attn_q.weight, ...) so a model moves to and from GGUF without
 * renaming; toy_llama_load maps a GGUF's tensors straight from the file
 * (any dtype the matmul reads: F32, F16, BF16, Q8_0, Q4_0, K-quants).
 *
 *     struct toy_llama_config cfg = toy_llama_preset("tiny");
 *     cfg.vocab = 256;
 *     struct toy_llama *m = toy_llama_new(&cfg, 1234);        // random init
 *     struct toy_tensor *logits = toy_llama_forward(gctx, m, tokens, pos);
 *
 * Random init (documented, seeded): token embeddings and every projection
 * ~ N(0, 0.02); the projections that write into the residual stream
 * (attn_output, ffn_down) are scaled by 1/sqrt(2 n_layers); norm weights 1,
 * biases 0.
 *
 * RoPE: GGUF "llama" models rotate adjacent pairs (llama.cpp's converter
 * permutes Q and K so this equals Hugging Face's rotate-half); qwen2, qwen3
 * gemma2 and gemma3 rotate halves (NeoX). toy follows the same rule.
 */
#ifndef TOY_LLAMA_H
#define TOY_LLAMA_H

#include <stdbool.h>
#include <stdint.h>

#include "toy/model.h"
#include "toy/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

struct toy_gguf;
struct toy_gguf_writer;

/* gpt-oss's SwiGLU: the gate's sigmoid is of alpha times it (llama.cpp and
 * Hugging Face fix it; the limit is the config's swiglu_limit) */
#define TOY_LLAMA_OAI_ALPHA 1.702f

/* Embedding pooling, with GGUF pooling_type's values (NONE, per-token
 * vectors in llama.cpp, or unstated: toy pools those by the mean; RANK: a
 * reranker's score, not an embedding). */
enum toy_pooling {
    TOY_POOLING_NONE = 0,
    TOY_POOLING_MEAN = 1,
    TOY_POOLING_CLS = 2,  /* the first position's */
    TOY_POOLING_LAST = 3, /* the last position's (Qwen3-Embedding, gte-Qwen2) */
    TOY_POOLING_RANK = 4,
};
/* "none", "mean", "cls", "last", "rank" */
const char *toy_pooling_name(enum toy_pooling p);

struct toy_llama_config {
    char arch[24];          /* GGUF general.architecture: llama, qwen2, qwen3, gemma2, gemma3, ... */
    int64_t vocab, d_model, n_layers, n_heads, n_kv_heads, d_ff, max_ctx;
    int64_t head_dim;       /* 0: d_model / n_heads */
    float norm_eps;
    float rope_base;
    enum toy_rope_mode rope_mode;
    enum toy_rope_scaling rope_scaling;
    float rope_factor, rope_low, rope_high, rope_beta_fast, rope_beta_slow, rope_attn_factor;
    int32_t rope_orig_ctx;
    bool tied;              /* output head shares token_embd */
    bool qkv_bias;          /* Qwen2: biases on q, k, v */
    bool qk_norm;           /* Qwen3, Gemma 3: RMSNorm over each head of q and k, weight (head_dim) */
    int32_t sliding_window; /* > 0: keys within the last W positions */
    /* > 0: of each swa_period layers the last attends globally and the
     * others slide (layer l slides when l % swa_period < swa_period - 1:
     * Gemma 2 has 2, the even layers; Gemma 3 has 6; 1: none); 0: every
     * layer slides */
    int32_t swa_period;
    /* > 0: the sliding layers rotate with this RoPE base and without the
     * rope scaling, which only the global layers take (Gemma 3: 10000,
     * against rope_base 1e6) */
    float rope_base_swa;
    /* > 0: of each nope_period layers the last takes no rotary embedding
     * (SmolLM3: 4, layers 3, 7, ...) */
    int32_t nope_period;
    float attn_softcap;     /* Gemma 2: 50 */
    float final_softcap;    /* Gemma 2: 30 */
    bool sandwich_norm;     /* Gemma 2: post-attention and post-FFN norms */
    bool post_norm;         /* OLMo 2: those norms in place of the ones before (no attn_norm, ffn_norm) */
    /* Granite (GGUF granite: embedding_scale, residual_scale, logit_scale;
     * its attention_multiplier is attn_scale): > 0, the embeddings times
     * embed_mult, each attention and MLP output times residual_mult before
     * its residual add, the logits divided by logit_div */
    float embed_mult, residual_mult, logit_div;
    bool embed_scale;       /* Gemma 2: embeddings times sqrt(d_model) */
    bool gelu_mlp;          /* Gemma: gelu(gate) * up instead of silu */
    float attn_scale;       /* 0: 1/sqrt(head_dim) (Gemma 2: 1/sqrt(query_pre_attn_scalar)) */
    /* Mixture of experts (Mixtral, Qwen3-MoE, OLMoE): n_experts > 0 replaces
     * each layer's MLP by n_experts MLPs of d_ff_expert (0: d_ff), of which
     * a router picks n_experts_used per token; their weights renormalised
     * to sum 1 when moe_norm. Trainable (toy_moe_route, toy_moe_matmul). */
    int64_t n_experts, n_experts_used, d_ff_expert;
    bool moe_norm;
    /* Qwen2-MoE: a shared expert of d_ff_shared (0: none) every token takes
     * too, its output scaled by sigmoid(w . h) */
    int64_t d_ff_shared;
    bool qk_norm_full;      /* OLMoE: q and k normed over the whole projection (weight d_model, d_kv) */
    /* DeepSeek-V2/V3 (arch deepseek2): the first n_dense_lead layers keep a
     * dense MLP of d_ff; the chosen experts' weights are multiplied by
     * moe_scale (0: 1); the shared experts (d_ff_shared wide) are added
     * without a gate when shared_ungated. */
    int64_t n_dense_lead;
    float moe_scale;
    bool shared_ungated;
    /* DeepSeek-V3: experts scored by sigmoids rather than a softmax, and
     * chosen by score plus a per-expert bias (exp_probs_b) when moe_bias */
    bool moe_sigmoid, moe_bias;
    /* Multi-head latent attention (DeepSeek-V2/V3), when kv_lora_rank > 0:
     * each position's keys and values come from one latent of kv_lora_rank
     * (attn_kv_a_mqa, then RMSNorm) plus a rope_dim-wide key part shared by
     * the heads; a query head is head_dim wide (head_dim - rope_dim without
     * rotation, then rope_dim rotated), a value head head_dim_v. Queries
     * come from attn_q, or through a q_lora_rank bottleneck (attn_q_a,
     * RMSNorm, attn_q_b) when q_lora_rank > 0. The graph runs in the
     * absorbed form: per head the key up-projection (attn_k_b) is folded
     * into the query and the value up-projection (attn_v_b) applied after
     * attention, so the cache holds kv_lora_rank + rope_dim numbers a
     * position and layer, for all heads (n_kv_heads is 1). Inference only.
     * Without latent attention, rope_dim > 0 rotates only the first rope_dim
     * dims of each head (partial rotary: Phi-4-mini's 96 of 128;
     * rope.dimension_count); 0 rotates all. */
    int64_t kv_lora_rank, q_lora_rank, rope_dim, head_dim_v;
    /* DeepSeek's YaRN: the attention's magnitude correction (Hugging Face's
     * mscale_all_dim; GGUF rope.scaling.yarn_log_multiplier is a tenth of
     * it), folded into the attention scale (toy_llama_attn_scale) */
    float rope_yarn_log_mul;
    /* Ministral 3 (arch mistral3; GGUF attention.temperature_scale): > 0,
     * the queries of position p times 1 + attn_temp_scale ln(1 + floor(p /
     * rope_orig_ctx)) (Llama 4's temperature tuning, as llama.cpp and
     * Hugging Face's Ministral 3 apply it) */
    float attn_temp_scale;
    /* gpt-oss (GGUF gpt-oss): attn_sinks, a learned logit per query head
     * (blk.N.attn_sinks.weight) that joins every softmax as a key whose
     * value is zero (toy_attn_params.sinks); out_bias, attn_output.bias;
     * moe_biases, biases on the router (ffn_gate_inp.bias) and on each
     * expert's gate, up and down (ffn_*_exps.bias {width, E}; a token's
     * down bias weighted with its expert); swiglu_limit > 0, the clamped
     * SwiGLU min(g, L) sigmoid(1.702 min(g, L)) (clamp(u, -L, L) + 1)
     * (toy_swiglu_oai). Its MLP norm is named post_attention_norm. */
    bool attn_sinks, out_bias, moe_biases;
    float swiglu_limit;
    /* How an embedding pools the final-norm hidden states over positions
     * (GGUF <arch>.pooling_type, llama.cpp's values; sentence-transformers'
     * 1_Pooling/config.json); NONE (unstated) pools by the mean. */
    enum toy_pooling pooling;
};

/* The projections a LoRA adapter can target. */
enum toy_lora_target { TOY_LORA_Q = 0, TOY_LORA_K, TOY_LORA_V, TOY_LORA_O, TOY_LORA_GATE, TOY_LORA_UP,
                       TOY_LORA_DOWN, TOY_LORA_N_TARGETS };

struct toy_llama_layer {
    struct toy_tensor *attn_norm, *wq, *wk, *wv, *wo, *bq, *bk, *bv, *q_norm, *k_norm, *post_attn_norm;
    struct toy_tensor *ffn_norm, *w_gate, *w_up, *w_down, *post_ffn_norm;
    /* mixture of experts: the router {d_model, E} and the experts' matrices
     * {d_model, d_ff_expert, E} (gate, up) and {d_ff_expert, d_model, E}
     * (down); then w_gate, w_up and w_down are NULL */
    struct toy_tensor *ffn_gate_inp, *ffn_gate_exps, *ffn_up_exps, *ffn_down_exps;
    /* the shared expert (d_ff_shared > 0): its gate row {d_model} and its MLP */
    struct toy_tensor *ffn_gate_inp_shexp, *ffn_gate_shexp, *ffn_up_shexp, *ffn_down_shexp;
    struct toy_tensor *exp_probs_b; /* the routing bias {E} (moe_bias) */
    /* gpt-oss: the attention output's bias {d_model}, the sinks {n_heads},
     * the router's bias {E} and the experts' {d_ff_expert, E} (gate, up),
     * {d_model, E} (down); NULL when the config has none */
    struct toy_tensor *bo, *attn_sinks, *ffn_gate_inp_b, *ffn_gate_exps_b, *ffn_up_exps_b, *ffn_down_exps_b;
    /* multi-head latent attention (kv_lora_rank > 0; then wk and wv are
     * NULL, and wq too when q_lora_rank > 0): attn_q_a {d, q_lora},
     * attn_q_a_norm, attn_q_b {q_lora, H head_dim}, attn_kv_a_mqa
     * {d, kv_lora + rope_dim}, attn_kv_a_norm {kv_lora}, and per head the
     * key up-projection transposed, attn_k_b {head_dim - rope_dim, kv_lora, H},
     * and the value up-projection, attn_v_b {kv_lora, head_dim_v, H} */
    struct toy_tensor *wq_a, *q_a_norm, *wq_b, *wkv_a, *kv_a_norm, *wk_b, *wv_b;
    /* LoRA (PEFT semantics): W x + scale * B (A x), A (r, in) i.e. ne {in, r},
     * B (out, r) i.e. ne {r, out}; NULL where no adapter is attached.
     * lora_mask[t], if set, multiplies A's input (dropout mask refreshed by
     * the caller each step; same shape as the projection's input). */
    struct toy_tensor *lora_a[TOY_LORA_N_TARGETS], *lora_b[TOY_LORA_N_TARGETS];
    struct toy_tensor *lora_mask[TOY_LORA_N_TARGETS];
};

struct toy_llama {
    struct toy_llama_config cfg;
    struct toy_ctx *ctx;    /* owns the parameters (or their metadata, when mapped) */
    struct toy_gguf *gguf;  /* the mapped file, when loaded */
    struct toy_tensor *tok_embd, *out_norm, *output; /* output == tok_embd when tied */
    struct toy_tensor *rope_freqs;                   /* GGUF rope_freqs.weight or NULL */
    /* Phi-3's LongRoPE (rope_factors_long/short.weight, F32 {rope dims /
     * 2}): per-frequency divisors for a context past cfg.rope_orig_ctx, and
     * for one within it (toy_llama_rope_factors); NULL when absent */
    struct toy_tensor *rope_long, *rope_short;
    /* with cfg.attn_temp_scale: each position's query scale (F32 {1,
     * max_ctx}), read by the positions (toy_llama_attn_temp) */
    struct toy_tensor *attn_temp;
    /* with cfg.moe_biases: a frozen 1 (F32 {1}), the input the experts'
     * down biases multiply (toy_llama_moe_ffn) */
    struct toy_tensor *one;
    struct toy_llama_layer *layers;
    /* TOY_F32 (default) or TOY_BF16: mixed precision. With BF16 the
     * projections run on bf16 copies of the f32 master weights (cast inside
     * the graph each step; gradients flow back to the f32 masters). */
    enum toy_dtype matmul_type;
    /* With matmul_type TOY_BF16: only f32 and f16 weights' products are
     * marked bf16, quantized ones keep their int8 kernels (inference, where
     * those are faster: toy_llama_infer_bf16). false (default): a quantized
     * base is dequantized to bf16 too (QLoRA, whose gradient products need
     * it). */
    bool bf16_float_only;
    float lora_scale;     /* alpha / r of the attached adapters */
    /* Token embeddings through a learned projection (a warm start from a
     * donor of another width, toy_llama_warm_start): the embedding table is
     * embd_donor embd_proj + tok_embd, with embd_donor {d_donor, vocab}
     * frozen, embd_proj {d_model, d_donor} trainable (the last of
     * toy_llama_tensor's list) and tok_embd the trainable residual. NULL
     * when absent. Writing the model folds them into token_embd.weight. */
    struct toy_tensor *embd_donor, *embd_proj;
    float *embd_fold;     /* (vocab, d_model) the folded table, for writing */
    void *pack_block;     /* the packed matrices (toy_llama_pack_weights), one toy_stream_alloc block */
    size_t pack_bytes;
    /* Training a mixture from scratch: with moe_balance, each uncached
     * forward also builds moe_aux_loss, the mean over the mixture layers of
     * their load-balancing terms (toy_llama_moe_ffn), for the trainer to
     * add to the loss; NULL otherwise. */
    bool moe_balance;
    struct toy_tensor *moe_aux_loss;
};

/* "tiny" (d 64, 2 layers), "small" (d 256, 4 layers), "stories15m" and
 * "smollm2-135m" shapes; vocab must be set by the caller for the first two.
 * Unknown names (and NULL) give a config with d_model 0. */
struct toy_llama_config toy_llama_preset(const char *name);
/* Validates a config: TOY_ERR_INVALID_ARG naming the bad field. */
enum toy_status toy_llama_check_config(const struct toy_llama_config *cfg);

/* A randomly initialised model (trainable f32 parameters). NULL on a bad
 * config (message in toy_last_error) or OOM. */
struct toy_llama *toy_llama_new(const struct toy_llama_config *cfg, uint64_t seed);
void toy_llama_free(struct toy_llama *m);
int64_t toy_llama_n_params(const struct toy_llama *m);
int64_t toy_llama_head_dim(const struct toy_llama_config *cfg);
/* The parameter tensors in a fixed order (for optimizers and checkpoints). */
int toy_llama_n_tensors(const struct toy_llama *m);
struct toy_tensor *toy_llama_tensor(const struct toy_llama *m, int i);

/* Logits {vocab, T, B} for I32 tokens {T, B} at I32 positions {T} or {T*B}. */
struct toy_tensor *toy_llama_forward(struct toy_ctx *ctx, struct toy_llama *m, struct toy_tensor *tokens,
                                     struct toy_tensor *pos);
/* Packed rows (padding-free training): each row of tokens {T, B} holds
 * several documents; seg I32 {T, B} gives each position its document id
 * (attention stays inside a document: toy_attention_seg) and pos I32 {T*B}
 * its position within its document (restarting at 0, as Hugging Face's
 * position_ids do for padding-free packing). Logits {vocab, T, B}; each
 * document's logits equal those it gets alone in a row. seg NULL is
 * toy_llama_forward. */
struct toy_tensor *toy_llama_forward_packed(struct toy_ctx *ctx, struct toy_llama *m, struct toy_tensor *tokens,
                                            struct toy_tensor *pos, struct toy_tensor *seg);

/* Attaches a zeroed embedding projection from d_donor dims (see
 * embd_proj above; the caller fills embd_donor and embd_proj, e.g. the warm
 * start from the donor's PCA). tok_embd must be trainable f32 in memory.
 * Graphs built afterwards use it. TOY_ERR_STATE if one is attached. */
enum toy_status toy_llama_embd_proj_attach(struct toy_llama *m, int64_t d_donor);
/* The embedding table the model uses, (vocab, d_model) f32, into out. */
void toy_llama_embd_table(const struct toy_llama *m, float *out);
/* Folds an attached projection into tok_embd (which becomes the whole
 * table) and detaches it; graphs built before must be rebuilt. No-op
 * without one. */
void toy_llama_embd_proj_fold(struct toy_llama *m);

/* The model behind the generic language-model interface (toy/model.h). */
struct toy_lm toy_llama_lm(struct toy_llama *m);

/* ---- KV-cache inference ------------------------------------------------------ */

struct toy_kv_cache {
    struct toy_ctx *ctx;
    int64_t n_layers, n_ctx, n_seq;
    struct toy_tensor **k, **v;   /* per layer {head_dim, n_kv_heads, n_ctx, n_seq} */
    struct toy_tensor *n_past;    /* I32 (1): positions already in the cache */
    void *block;                  /* every layer's k and v, one toy_stream_alloc block */
    size_t block_bytes;
};

enum toy_status toy_kv_cache_init(struct toy_kv_cache *c, const struct toy_llama *m, int64_t n_ctx, int64_t n_seq);
/* The same with the cache's element type: TOY_F32 or TOY_F16 (half the memory). */
enum toy_status toy_kv_cache_init_type(struct toy_kv_cache *c, const struct toy_llama *m, int64_t n_ctx, int64_t n_seq,
                                       enum toy_dtype type);
void toy_kv_cache_free(struct toy_kv_cache *c);
/* A one-sequence cache over sequence seq of pool's memory (its own n_past; block NULL: toy_kv_cache_free frees
 * the view, not the pool, which must outlive it). A server's slots each take one, and a step over several slots
 * reads the pool (toy_kv_store_rows, toy_attention_rows). */
enum toy_status toy_kv_cache_view_seq(struct toy_kv_cache *view, const struct toy_kv_cache *pool, int64_t seq);
size_t toy_kv_cache_bytes(const struct toy_kv_cache *c);
/* TOY_ERR_NOMEM, naming the size, when a cache of n_layers x 2 x (row elements of `type`) x n_ctx x n_seq is
 * more than the machine's memory or cannot be had; TOY_OK otherwise (the init functions check first). */
enum toy_status toy_kv_cache_check_size(int64_t n_layers, int64_t row, int64_t n_ctx, int64_t n_seq,
                                        enum toy_dtype type);

/* Logits {vocab, Tn, n_seq} of Tn new tokens {Tn, n_seq} at positions
 * n_past .. n_past+Tn-1 (pos is filled by the caller), storing their keys and
 * values in the cache. Build once per Tn (prefill length, then 1 for decode). */
/* Whether toy_llama_load runs GGUF general.architecture `arch` (llama,
 * mistral, mistral3, ernie4_5, qwen2, qwen3, gemma2, gemma3, smollm3,
 * olmo2, granite, phi3, qwen2moe, qwen3moe, olmoe, deepseek2). */
bool toy_llama_arch_known(const char *arch);
/* llama.cpp's conventions for a mixture in GGUF, by general.architecture
 * (GGUF has no key for either): whether the chosen experts' weights are
 * renormalised to sum 1 (llama, i.e. Mixtral, and qwen3moe; not olmoe or
 * qwen2moe), and whether the experts' width is <arch>.expert_feed_forward_length
 * (qwen2moe, qwen3moe) rather than <arch>.feed_forward_length. */
bool toy_llama_moe_renormalises(const char *arch);
bool toy_llama_moe_own_ff_key(const char *arch);
/* llama.cpp's layer rules by general.architecture, which no GGUF key holds
 * (or only an optional one): of each swa_period layers the last attends
 * globally (gemma2 2, gemma3 6, olmo2 4 (OLMo 3, when it has a window); 0:
 * every layer slides), the sliding layers' own RoPE base, unscaled
 * (gemma3 10000; with swa_base_global, olmo2's, rope_base itself, unscaled;
 * 0: none: they rotate as the others), and of each nope_period layers the
 * last takes no RoPE (smollm3 4; 0: none); gpt-oss's period is 2 and its
 * MLP norm is named post_attention_norm (ffn_norm_post_attn). */
struct toy_llama_arch_rules {
    int32_t swa_period, nope_period;
    float rope_base_swa;
    bool swa_base_global, ffn_norm_post_attn;
};
struct toy_llama_arch_rules toy_llama_arch_rules(const char *arch);
/* The query_pre_attn_scalar a Gemma 2 or 3 GGUF means, having no key for
 * it (llama.cpp's rule): the head dim, but d_model / n_heads for the 27Bs
 * (gemma2 of 46 layers, gemma3 of 62); attention scales by 1/sqrt of it */
int64_t toy_llama_gemma_query_scalar(const char *arch, int64_t n_layers, int64_t d_model, int64_t n_heads,
                                     int64_t head_dim);
/* The sliding layers' RoPE base a GGUF of architecture arch (with its
 * window and rope base) means without rope.freq_base_swa: rope_base_swa's
 * default by those rules (for the loader, the writer and toy describe) */
float toy_llama_swa_base_default(const char *arch, int64_t sliding_window, float rope_base);
/* The swa_period a list of n layers' kinds (true: it slides) repeats: the
 * first global layer ends the period, 0 when every layer slides; -1 when
 * no period gives the list, *bad then the first layer that differs. */
int32_t toy_llama_swa_period_of(const bool *slides, int64_t n, int64_t *bad);
/* TOY_ERR_UNSUPPORTED naming `what` when m cannot take a LoRA adapter
 * (latent attention: DeepSeek, whose queries, keys and values come through
 * latents), else TOY_OK. Every model trains in full, mixtures and latent
 * attention included; LoRA on a mixture adapts its attention (and any
 * dense feed-forward layers). */
enum toy_status toy_llama_adaptable(const struct toy_llama *m, const char *what);
/* The attention's score scale: cfg->attn_scale when set; with latent
 * attention 1/sqrt(head_dim) times DeepSeek's YaRN correction squared, as
 * llama.cpp's deepseek2 graph and Hugging Face's DeepseekV2Attention take
 * it; else 0 (the kernels' 1/sqrt of the head dim). */
float toy_llama_attn_scale(const struct toy_llama_config *cfg);
/* The head's output made logits: divided by logit_div (Granite), then
 * softcapped (final_softcap: Gemma 2) */
struct toy_tensor *toy_llama_head_out(struct toy_ctx *ctx, const struct toy_llama_config *cfg, struct toy_tensor *logits);
/* Whether layer l's attention slides (sliding_window, swa_period); the
 * rotary embedding its queries and keys take (rope_base_swa, rope_dim);
 * the per-frequency divisors of a graph over n_ctx positions (rope_freqs;
 * LongRoPE's long ones when n_ctx passes rope_orig_ctx, as llama.cpp picks
 * them by its context and Hugging Face by the sequence's length); and that
 * rotation of x {hd, H, T, B} at positions pos, in a graph over n_ctx
 * positions (a cache's length, or T), with the divisors where the layer
 * takes them (x itself on a layer without one: nope_period) */
bool toy_llama_layer_slides(const struct toy_llama_config *cfg, int64_t l);
struct toy_rope_params toy_llama_rope_params(const struct toy_llama_config *cfg, int64_t l);
struct toy_tensor *toy_llama_rope_factors(const struct toy_llama *m, int64_t n_ctx);
/* q {hd, H, T, B} times its positions' temperature (cfg.attn_temp_scale;
 * pos {T} or {T*B}); q itself without one. Applied before the rotation
 * (the same product: a rotation is linear), so that a decode step's
 * attention still does its query's rotation itself (graph-fuse.c). */
struct toy_tensor *toy_llama_attn_temp(struct toy_ctx *ctx, const struct toy_llama *m, struct toy_tensor *q,
                                       struct toy_tensor *pos);
struct toy_tensor *toy_llama_rope(struct toy_ctx *ctx, const struct toy_llama *m, int64_t l, struct toy_tensor *x,
                                  struct toy_tensor *pos, int64_t n_ctx);
/* Multi-head latent attention of a layer (c->kv_lora_rank > 0), over its
 * normed input h {d, T, B} at positions pos: toy_llama_mla_qkv gives the
 * queries q {kv_lora + rope_dim, H, T, B} and the keys kv {kv_lora +
 * rope_dim, 1, T, B}, which are the values too: attention over them with
 * scale c->attn_scale gives a {kv_lora + rope_dim, H, T, B}, whose first
 * kv_lora rows toy_llama_mla_out turns into the heads' values
 * {H head_dim_v, T, B}, the input of attn_output. */
void toy_llama_mla_qkv(struct toy_ctx *ctx, const struct toy_llama_config *c, const struct toy_llama_layer *L,
                       struct toy_tensor *h, struct toy_tensor *pos, struct toy_tensor **q, struct toy_tensor **kv);
struct toy_tensor *toy_llama_mla_out(struct toy_ctx *ctx, const struct toy_llama_config *c,
                                     const struct toy_llama_layer *L, struct toy_tensor *a);
/* The layer's QK-norm of q {hd, H, T, B} and k (c->qk_norm): RMSNorm
 * over each head (Qwen3), or over each position's whole projection
 * (qk_norm_full: OLMoE); nothing without it. */
void toy_llama_qk_norm(struct toy_ctx *ctx, const struct toy_llama_config *c, const struct toy_llama_layer *L,
                       struct toy_tensor **q, struct toy_tensor **k);
/* A mixture-of-experts layer's MLP over its normed input h {d, ...}
 * (m->cfg.n_experts > 0): the router, the chosen experts' SwiGLU (GeGLU
 * with gelu_mlp, the clamped form with swiglu_limit) and their weighted
 * sum, with the router's and the experts' biases where the layer has
 * them, shaped as h. With balance non-NULL
 * (training; ctx must allocate data) it also gets the layer's
 * load-balancing term, Switch Transformer's generalised to k experts a
 * token: E * sum_e f_e P_e, f_e the share of the tokens' k choices that
 * went to expert e (a constant), P_e the mean over tokens of the router's
 * softmax probability for e. 1 when both are uniform. */
struct toy_tensor *toy_llama_moe_ffn(struct toy_ctx *ctx, const struct toy_llama *m,
                                     const struct toy_llama_layer *L, struct toy_tensor *h,
                                     struct toy_tensor **balance);
/* The MLP's gated activation of g and u: SwiGLU, GeGLU (gelu_mlp) or
 * gpt-oss's clamped SwiGLU (swiglu_limit). */
struct toy_tensor *toy_llama_glu(struct toy_ctx *ctx, const struct toy_llama_config *c, struct toy_tensor *g,
                                 struct toy_tensor *u);
/* The attention parameters of layer l: scale, softcap, window, sinks. */
struct toy_attn_params toy_llama_attn_params(const struct toy_llama *m, int64_t l);
struct toy_tensor *toy_llama_forward_cached(struct toy_ctx *ctx, struct toy_llama *m, struct toy_kv_cache *c,
                                            struct toy_tensor *tokens, struct toy_tensor *pos);
/* The same, but logits {vocab, 1, n_seq} of the last new token of each
 * sequence only (a prefill that is followed by sampling needs no more; the
 * output projection is then one row instead of Tn). */
struct toy_tensor *toy_llama_forward_cached_last(struct toy_ctx *ctx, struct toy_llama *m, struct toy_kv_cache *c,
                                                 struct toy_tensor *tokens, struct toy_tensor *pos);

/* ---- GGUF ------------------------------------------------------------------ */

/* Opens a Llama-family GGUF: config from metadata (architecture from
 * general.architecture and tensor presence), weights mapped from the file
 * (not copied; frozen). trainable: copies weights to f32 trainable tensors
 * instead (for training or fine-tuning from a checkpoint). */
enum toy_status toy_llama_load(const char *path, bool trainable, struct toy_llama **out);
/* Prepares the model's quantized matrices for inference on this CPU
 * (toy_tensor_pack: the int8 kernels' layout; the file's pages of those
 * tensors are released, so the weights stay resident once). Generators and
 * the server call it; idempotent; toy_llama_free frees the copies. */
enum toy_status toy_llama_pack_weights(struct toy_llama *m);
/* Inference in mixed precision (`toy generate --bf16`): products of f32 or
 * f16 weights over more than a few rows -- a prompt's prefill, eval's
 * windows -- take their operands rounded to bf16 as they pack them (AVX-512
 * BF16 or AMX; on a Zen 4 about 1.8x the f32 rate), with f32 sums, as
 * training's --bf16 does. Decode steps (a row at a time, bound by memory)
 * keep their arithmetic, and quantized and bf16 weights their own kernels.
 * On a CUDA device (the process default) the marked products run in BF16
 * math. Returns false, changing nothing, where the model has no f32 or f16
 * matrix, or graphs run on a CPU that multiplies bf16 no faster than f32
 * (no AVX-512 BF16, or an Intel CPU without AMX). */
bool toy_llama_infer_bf16(struct toy_llama *m);
/* Bytes of weights one decode step reads: every matrix once (a tied head is
 * the embedding table; an untied table is only looked up, one row). */
double toy_llama_decode_bytes(const struct toy_llama *m);
/* Adds the model's metadata and tensors to a GGUF writer (tensor data is
 * borrowed until the write). type: TOY_F32, TOY_F16 or TOY_BF16 for the 2-D
 * weights (norms and biases stay f32). */
enum toy_status toy_llama_write_gguf(const struct toy_llama *m, struct toy_gguf_writer *w, enum toy_dtype type);

#ifdef __cplusplus
}
#endif
#endif
