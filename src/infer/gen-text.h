/* gen-text.h: the generated text both generators (generate.c, GPT-2's
 * generate-gpt2.c) keep to find stop strings in, and what they share about
 * it: growing it, the earliest stop string, and the bytes of a character
 * the decoder still holds at the end. */
#ifndef TOY_INFER_GEN_TEXT_H
#define TOY_INFER_GEN_TEXT_H

#include <stdlib.h>
#include <string.h>

#include "toy/generate.h"
#include "toy/tokenizer.h"

struct gen_text {
    char *s;                 /* NUL-terminated */
    size_t len, cap;
    size_t emitted;          /* bytes handed to the token callback */
};

static inline enum toy_status gen_text_add(struct gen_text *t, const char *p, size_t n) {
    if (t->len + n + 1 > t->cap) {
        size_t cap = (t->len + n + 1) * 2;
        char *s = realloc(t->s, cap);
        if (!s) return toy_error(TOY_ERR_NOMEM, "generate: out of memory for the text");
        t->s = s, t->cap = cap;
    }
    if (n) memcpy(t->s + t->len, p, n);
    t->len += n;
    t->s[t->len] = 0;
    return TOY_OK;
}

/* Where the stop string that starts first begins, looking from `emitted -
 * max_stop` on (what an earlier token could not yet complete); NULL: none.
 * The first hit in list order was used, and printed part of an earlier one. */
static inline const char *gen_text_stop(const struct gen_text *t, const char *const *stop, int n_stop,
                                        size_t max_stop) {
    const char *first = NULL;
    for (int i = 0; t->s && i < n_stop; i++) {
        const char *hit = strstr(t->s + (t->emitted > max_stop ? t->emitted - max_stop : 0), stop[i]);
        if (hit && (!first || hit < first)) first = hit;
    }
    return first;
}

/* At the end: the bytes of an incomplete last character, as decoding all
 * the ids gives them (they were dropped). */
static inline enum toy_status gen_text_flush(struct gen_text *t, struct toy_decoder *dec) {
    if (!dec) return TOY_OK;
    const char *tail;
    size_t n;
    toy_decoder_flush(dec, &tail, &n);
    return gen_text_add(t, tail, n);
}

#endif
