/* toy/sampler.h: choosing the next token from logits.
 *
 * The pipeline, in order (Hugging Face's; llama.cpp's default applies the
 * temperature last): repetition penalty (positive logits of the last
 * penalty_last_n tokens, prompt included, divided by it, negative ones
 * multiplied),
 * frequency and presence penalties (OpenAI style: logit -= f * count +
 * p * [count > 0]), temperature (0 = greedy: the first maximum), top-k,
 * top-p (smallest set with cumulative probability >= p), min-p (drop tokens
 * below min_p times the best probability), then a draw from a seeded
 * generator, so the same seed gives the same text.
 *
 *     struct toy_sampler *s = toy_sampler_new(&(struct toy_sampler_params){
 *         .temperature = 0.8f, .top_p = 0.95f, .seed = 42}, n_vocab);
 *     int32_t id = toy_sampler_sample(s, logits, &logprob);
 *     toy_sampler_accept(s, id);    // history for the penalties
 */
#ifndef TOY_SAMPLER_H
#define TOY_SAMPLER_H

#include <stdint.h>

#include "toy/status.h"

#ifdef __cplusplus
extern "C" {
#endif

struct toy_sampler_params {
    float temperature;       /* <= 0: greedy */
    int32_t top_k;           /* 0: off */
    float top_p;             /* 0 or >= 1: off */
    float min_p;             /* 0: off */
    float repeat_penalty;    /* 0 or 1: off */
    float frequency_penalty; /* 0: off */
    float presence_penalty;  /* 0: off */
    int32_t penalty_last_n;  /* tokens of history the penalties look at; 0: 64, -1: all */
    uint64_t seed;
};

struct toy_sampler;

/* TOY_OK, or TOY_ERR_INVALID_ARG naming the first parameter that is not a
 * finite number in its range (temperature, the penalties: any finite
 * value; top_p >= 0; min_p in [0, 1]; top_k >= 0). toy_generate checks.
 * p NULL, here and in toy_sampler_new, is the defaults (all zero: greedy). */
enum toy_status toy_sampler_params_check(const struct toy_sampler_params *p);

/* NULL on OOM or n_vocab <= 0. */
struct toy_sampler *toy_sampler_new(const struct toy_sampler_params *p, int64_t n_vocab);
void toy_sampler_free(struct toy_sampler *s);
/* Forgets the history and reseeds. */
void toy_sampler_reset(struct toy_sampler *s, uint64_t seed);
/* Adds a token to the history (prompt tokens too, if they should count). */
void toy_sampler_accept(struct toy_sampler *s, int32_t token);
/* Picks a token. logprob (may be NULL): its log-probability under the
 * model's distribution (log-softmax of the raw logits). */
int32_t toy_sampler_sample(struct toy_sampler *s, const float *logits, float *logprob);

/* The k most likely tokens of log_softmax(logits), best first (ties: the
 * lower id first; where fewer than k logits are finite, the rest are id -1,
 * -inf). Returns log(sum(exp(logits))), from which any token's
 * log-probability is logits[id] - it, as toy_logprob gives. */
double toy_top_logprobs(const float *logits, int64_t n_vocab, int k, int32_t *ids, float *logprobs);
/* log softmax(logits)[id]: the log-probability the logits give token id */
float toy_logprob(const float *logits, int64_t n_vocab, int32_t id);

#ifdef __cplusplus
}
#endif
#endif
