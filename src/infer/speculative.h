/* speculative.h: what speculative decoding's drafts share between toy_generate
 * (generate.c, which defines these) and toy serve's engine (serve-engine.c):
 * prompt lookup's drafts, a draft model's greedy pick, and the check that a
 * draft model's vocabulary is the model's. */
#ifndef TOY_INFER_SPECULATIVE_H
#define TOY_INFER_SPECULATIVE_H

#include <stdbool.h>
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

/* How long the next draft may be, and when to draft at all. A draft of k tokens
 * makes a pass of k + 1 rows, which costs time whether the draft is kept or
 * not (9 rows ~2x one on the CPU), and a draft model's pass costs time even
 * when it writes nothing. So the next draft is one longer than what the last
 * kept, or up to twice the last when all of it was kept (at most max); and a
 * draft that kept nothing, or a draft model that wrote none, skips drafting
 * for 1 step, then 2, 4, 8 and 16 on further misses, until a draft is kept:
 * on text no draft matches, a step in 17 at most pays for one. */
#define TOY_DRAFT_BACKOFF_MAX 16

struct toy_draft_pace {
    int cap, max;   /* the longest draft now, and ever */
    int skip;       /* steps to go without drafting */
    int backoff;    /* steps the next miss skips (0: none yet) */
};

static inline void toy_draft_pace_init(struct toy_draft_pace *p, int max) {
    *p = (struct toy_draft_pace){.cap = max, .max = max};
}

/* the longest draft this step may have (0: skip it) */
static inline int toy_draft_pace_next(struct toy_draft_pace *p) {
    if (p->skip > 0) return p->skip--, 0;
    return p->cap;
}

/* after a step: a draft model ran (ran_model) and k tokens were drafted, kept of them kept */
static inline void toy_draft_pace_done(struct toy_draft_pace *p, bool ran_model, int k, int kept) {
    if (k > 0 && kept < k) p->cap = kept + 1;
    else if (k > 0 && 2 * k > p->cap) p->cap = 2 * k < p->max ? 2 * k : p->max;
    if ((k > 0 && kept == 0) || (ran_model && k == 0)) {
        p->backoff = p->backoff ? (2 * p->backoff < TOY_DRAFT_BACKOFF_MAX ? 2 * p->backoff : TOY_DRAFT_BACKOFF_MAX) : 1;
        p->skip = p->backoff;
    } else if (kept > 0) {
        p->backoff = 0;
    }
}

#endif
