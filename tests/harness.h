/* harness.h: what the model tests share: a scratch folder per test, the
 * PyTorch reference scripts (tests/torch/), running a forward pass and
 * comparing with a reference. Each Criterion test is a process of its own,
 * so the scratch folder is one per test. */
#ifndef TOY_TEST_HARNESS_H
#define TOY_TEST_HARNESS_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "toy/llama.h"
#include "toy/model.h"
#include "toy/toy.h"

/* the test's scratch folder, made by th_mkdir */
extern char th_dir[256];
/* makes /tmp/toy-test-TAG-XXXXXX into th_dir */
void th_mkdir(const char *tag);
/* removes th_dir and everything in it */
void th_rmdir(void);

/* A {k, n} weight of `type` (F32, F16, BF16 or a quantized type) from
 * normal values times `scale` drawn from r, row by row. */
struct toy_rng;
struct toy_tensor *th_weight(struct toy_ctx *ctx, enum toy_dtype type, int64_t k, int64_t n, float scale,
                             struct toy_rng *r);

/* Writes {"cases": cases} (stolen) to th_dir/spec.json, runs
 * tests/torch/SCRIPT on it with /usr/bin/python3 (or $TOY_PY) and returns
 * what it wrote; skips the test when there is no Python. */
json_t *th_torch(const char *script, json_t *cases);

/* A model's forward pass: tokens {T, B}, positions {T} -> logits */
typedef struct toy_tensor *(*th_forward_fn)(struct toy_ctx *ctx, void *model, struct toy_tensor *tokens,
                                            struct toy_tensor *pos);
/* The logits of tokens (B rows of T, positions 0..T-1) on 2 threads; malloc'd */
float *th_logits(th_forward_fn fwd, void *model, const int32_t *tokens, int T, int B);

/* `steps` AdamW steps (lr 1e-3, betas 0.9 / 0.95, eps 1e-8, weight decay
 * 0.1) of lm on random B x T tokens and targets (< 61), then the same run
 * of the PyTorch reference SCRIPT on the model file GGUF (what lm was
 * loaded from): the losses agree to 1e-4 relative and fall. */
void th_train_vs_torch(struct toy_lm lm, const char *script, const char *gguf, int T, int B, int steps);

/* A model's cached forward pass (the KV cache's n_past is set by the caller) */
typedef struct toy_tensor *(*th_cached_fn)(struct toy_ctx *ctx, void *model, struct toy_kv_cache *kv,
                                           struct toy_tensor *tokens, struct toy_tensor *pos);
/* Prefills tokens[0..P) through kv, then decodes the rest one at a time;
 * returns the largest |cached - full| / (1 + |full|) over every position's
 * V logits, full being the whole sequence's forward (T x V). */
double th_kv_decode_vs_full(th_cached_fn fwd, void *model, struct toy_kv_cache *kv, const int32_t *tokens, int T,
                            int P, int64_t V, const float *full);

/* What a generation's token callback saw (toy_token_fn; ud: a struct
 * th_gen_log): each token's id and log-probability, the first 64 */
struct th_gen_log {
    int32_t ids[64];
    float lps[64];
    int n;
};
bool th_log_token(void *ud, int32_t id, const char *text, size_t len, float lp);

/* m written to path as a GGUF with matrices of type (norms stay f32); _tok: with tok's vocabulary (NULL: none) */
void th_save_llama(struct toy_llama *m, enum toy_dtype type, const char *path);
void th_save_llama_tok(struct toy_llama *m, const struct toy_tokenizer *tok, enum toy_dtype type, const char *path);
/* any family's model, through its toy_lm */
void th_save_lm(const struct toy_lm *lm, enum toy_dtype type, const char *path);
void th_save_lm_tok(const struct toy_lm *lm, const struct toy_tokenizer *tok, enum toy_dtype type, const char *path);

/* GGUF `in` copied to `out` (its keys, general.file_type dropped) with every
 * tensor whose name contains `part` (NULL: every tensor) stored as type
 * (F32: dequantized), the others as they are */
void th_retype_gguf(const char *in, const char *out, const char *part, enum toy_dtype type);

/* the two files exist and hold the same bytes */
bool th_files_equal(const char *a, const char *b);

/* a JSON array of n floats */
json_t *th_floats(const float *x, int64_t n);
/* max over k of |ours[k] - ref[k]| / (1 + |ref[k]|) */
double th_worst_rel(const float *ours, json_t *ref);


/* A model that says what it is told (for the chat-reply, serve and chat
 * tests): each scripted token's one successor. Its embedding of token t is
 * the one-hot e_t, its layers add nothing (wo and w_down are 0), and its
 * head maps e_t to a logit on the token after t, so greedy decoding after a
 * start token writes that script's tokens, special ones and all, then EOS.
 * The vocabulary is GPT-2's 256 byte tokens (any prompt encodes), then each
 * script's tokens, a token per use (a text twice is two ids; the text
 * encodes as the first), <|eos|>, <|return|> and <|call|> (which end a
 * reply) and each script's start token <|goN|>. tmpl is the GGUF's chat
 * template, whose markers name the family; a user message "<|go1|>" starts
 * script 1 when the template writes the messages' content. */
struct th_script_model {
    const char *tmpl;
    const char *const *scripts[3]; /* NULL-ended token texts */
    const char *eos;               /* the EOS token's text */
    bool add_eos;                  /* the tokenizer adds EOS (an embedding model's) */
};
void th_script_model_write(const struct th_script_model *sm, const char *path);

#endif
