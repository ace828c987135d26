/* toy/generate.h: text generation with a KV cache: the whole prompt is
 * prefilled in one graph, then one graph (built once) decodes a token per
 * run; tokens stream to a callback as they are produced.
 *
 *     struct toy_generator *gen;
 *     toy_generator_new(model, tok, 2048, pool, &gen);
 *     struct toy_generate_params p = {.n_predict = 64, .sampling = {.temperature = 0.8f, .seed = 1}};
 *     toy_generate(gen, prompt_ids, n_prompt, &p, on_token, stdout, &result);
 *     toy_generator_free(gen);
 */
#ifndef TOY_GENERATE_H
#define TOY_GENERATE_H

#include <stdbool.h>
#include <stdint.h>

#include "toy/llama.h"
#include "toy/model.h"
#include "toy/sampler.h"
#include "toy/threadpool.h"
#include "toy/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

struct toy_json_grammar;

struct toy_generate_params {
    int32_t n_predict;              /* tokens to generate at most (<= 0: until EOS or the context is full) */
    struct toy_sampler_params sampling;
    const char *const *stop;        /* stop strings (the text ends before them; none may be empty) */
    int n_stop;
    bool ignore_eos;
    /* NULL: free text; else each token is sampled among those the grammar
     * takes next, and the end only once its JSON value is complete (needs
     * the tokenizer; toy/json-grammar.h) */
    const struct toy_json_grammar *grammar;
    bool keep_special;              /* special tokens produce their text (a chat reply's markers, chat-reply.h) */
    /* the prompt's first tokens that the generator's last call left in its
     * cache (its prompt and what it generated) are not computed again: a
     * chat's earlier turns. Off, every call prefills the whole prompt (as a
     * benchmark wants). */
    bool reuse_cache;
    /* Speculative decoding by prompt lookup: > 0, each step drafts up to
     * this many tokens (at most TOY_GENERATE_MAX_LOOKUP) by finding the
     * context's last 4, 3 or 2 tokens earlier in it (prompt and text so
     * far, the latest place) and copying what followed; the model reads
     * them all in one pass and keeps those it samples itself, in order, and
     * the token after. Each token is still sampled from the model's own
     * logits, one after another, so the text is the one plain decoding
     * gives (the same tokens for the same seed), only sooner when it
     * repeats what came before: code edits, quotes, structured output. */
    int32_t lookup;
    /* Speculative decoding with a draft model: a generator over a smaller
     * model of the same vocabulary (its own cache; not this generator).
     * Each step it writes up to draft_max tokens (0: 8; at most
     * TOY_GENERATE_MAX_LOOKUP) greedily after the text so far, stopping
     * before a token it gives a probability under draft_p_min (0: never);
     * the model reads them in one pass and keeps them as it keeps a
     * lookup's: the text is still plain decoding's, and the draft only
     * decides how soon. With lookup too, the context's own draft goes first
     * and the draft model writes when none is found. The draft generator's
     * cache keeps what it shares with the text (a chat's earlier turns). */
    struct toy_generator *draft;
    int32_t draft_max;
    float draft_p_min;
};

#define TOY_GENERATE_MAX_LOOKUP 15
#define TOY_GENERATE_DRAFT_MAX 8   /* draft_max 0 */

/* Called for each new token with the text it completes (possibly empty while
 * a UTF-8 character is incomplete, or while it could be the start of a stop
 * string); return false to stop. Text still held back when generation ends
 * comes in one last call with id -1 and logprob 0 (not a token: do not
 * count it or index with it). */
typedef bool (*toy_token_fn)(void *ud, int32_t id, const char *text, size_t len, float logprob);

enum toy_stop_reason { TOY_STOP_LENGTH = 0, TOY_STOP_EOS = 1, TOY_STOP_STRING = 2, TOY_STOP_CALLER = 3,
                       TOY_STOP_CONTEXT = 4 };

struct toy_generate_result {
    int64_t n_prompt, n_generated;
    int64_t n_cached;               /* prompt tokens whose keys and values the last call left in the cache */
    enum toy_stop_reason reason;
    double prefill_s, decode_s;     /* wall time of each phase */
    int64_t n_drafted, n_accepted;  /* speculative decoding (lookup, draft model): tokens drafted, and kept */
    int64_t n_steps;                /* model passes after the prefill */
    int64_t n_draft_steps;          /* the draft model's passes (its prefill included) */
    double draft_s;                 /* ... and their wall time (part of prefill_s and decode_s) */
};

struct toy_generator;

/* tok may be NULL (then text is empty and stop strings are ignored).
 * n_ctx <= 0 or above the model's context is the model's context. */
enum toy_status toy_generator_new(struct toy_llama *m, const struct toy_tokenizer *tok, int64_t n_ctx,
                                  struct toy_threadpool *tp, struct toy_generator **out);
/* The same with the KV cache's element type (TOY_F32 or TOY_F16). */
enum toy_status toy_generator_new_kv(struct toy_llama *m, const struct toy_tokenizer *tok, int64_t n_ctx,
                                     enum toy_dtype kv_type, struct toy_threadpool *tp, struct toy_generator **out);
/* Any family behind toy/model.h's inference functions: toy_llama_lm(m),
 * toy_gpt2_lm(m). *lm is copied; its model must outlive the generator. */
enum toy_status toy_generator_new_lm(const struct toy_lm *lm, const struct toy_tokenizer *tok, int64_t n_ctx,
                                     enum toy_dtype kv_type, struct toy_threadpool *tp, struct toy_generator **out);
void toy_generator_free(struct toy_generator *g);
/* TOY_OK when draft can draft for g (toy_generate_params.draft): another
 * generator whose vocabulary is g's (the pieces of the ids both have agree
 * when both have tokenizers; sizes within 256 of each other). toy_generate
 * checks it too. */
enum toy_status toy_generator_check_draft(const struct toy_generator *g, const struct toy_generator *draft);
/* Records prefill and decode ops (and one span per phase) into a Chrome trace. */
struct toy_trace;
void toy_generator_set_trace(struct toy_generator *g, struct toy_trace *tr);
/* Generates after `prompt` (which is prefilled from position 0). p NULL is
 * the defaults (all zero: greedy, until EOS or the context is full); fn,
 * ud and res may be NULL. The generator may be reused: each call starts
 * again from position 0 (with p->reuse_cache, past what its cache holds of
 * the prompt). */
enum toy_status toy_generate(struct toy_generator *g, const int32_t *prompt, int64_t n_prompt,
                             const struct toy_generate_params *p, toy_token_fn fn, void *ud,
                             struct toy_generate_result *res);

#ifdef __cplusplus
}
#endif
#endif
