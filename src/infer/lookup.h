/* lookup.h: prompt lookup, the drafts speculative decoding copies from the
 * text itself. toy_generate (generate.c, which defines it) and toy serve's
 * engine (serve-engine.c) both draft with it. */
#ifndef TOY_INFER_LOOKUP_H
#define TOY_INFER_LOOKUP_H

#include <stdint.h>

/* Drafts up to k_max tokens to follow h[0..n): what followed the latest
 * earlier place of h's last 4, 3 or 2 tokens, copied on past h's end as an
 * overlapping copy does. Returns how many (0: no such place). */
int toy_lookup_draft(const int32_t *h, int64_t n, int k_max, int32_t *out);

#endif
