/* speculative.h: what speculative decoding's drafts share between toy_generate
 * (generate.c, which defines these) and toy serve's engine (serve-engine.c):
 * prompt lookup's drafts, a draft model's greedy pick, and the check that a
 * draft model's vocabulary is the model's. */
#ifndef TOY_INFER_SPECULATIVE_H
#define TOY_INFER_SPECULATIVE_H

#include <stdint.h>

#include "toy/status.h"
#include "toy/tokenizer.h"

/* Drafts up to k_max tokens to follow h[0..n): what followed the latest
 * earlier place of h's last 4, 3 or 2 tokens, copied on past h's end as an
 * overlapping copy does. Returns how many (0: no such place). */
int toy_lookup_draft(const int32_t *h, int64_t n, int k_max, int32_t *out);

/* A draft model's next token from its logits lg (vd of them): the largest
 * among the first v (the model's vocabulary, where smaller), or -1 when the
 * softmax over all vd gives it less than p_min (0: any). */
int32_t toy_draft_pick(const float *lg, int64_t vd, int64_t v, float p_min);

/* TOY_OK when a draft model of vd tokens (tokenizer td, may be NULL) can draft
 * for a model of v (tokenizer t, may be NULL): the sizes within 256 of each
 * other (a family's padding rows), and where both tokenizers are known, the
 * same piece for every id both have. Else TOY_ERR_INVALID_ARG naming the
 * first difference. */
enum toy_status toy_draft_vocab_check(const struct toy_tokenizer *t, int64_t v, const struct toy_tokenizer *td,
                                      int64_t vd);

#endif
