/* utf8.c: checking and repairing UTF-8 for text that leaves toy as JSON
 * (include/toy/tokenizer.h). Decoded tokens can end inside a character
 * and a small model can emit any byte sequence; JSON libraries refuse
 * such strings, so every writer of model text goes through here. The
 * rules (no overlong forms, surrogates or code points past U+10FFFF) are
 * the tokenizer's own decoder's, tok_utf8_decode. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer-impl.h"

bool toy_utf8_valid(const char *s, size_t n) {
    uint32_t cp;
    for (size_t i = 0; i < n;) {
        int k = tok_utf8_decode(s + i, n - i, &cp);
        if (!k) return false;
        i += (size_t)k;
    }
    return true;
}

char *toy_utf8_clean(const char *s, size_t n, size_t *out_n) {
    char *o = malloc(3 * n + 1);
    if (!o) return NULL;
    size_t w = 0;
    uint32_t cp;
    for (size_t i = 0; i < n;) {
        int k = tok_utf8_decode(s + i, n - i, &cp);
        if (k) {
            memcpy(o + w, s + i, (size_t)k);
            w += (size_t)k, i += (size_t)k;
        } else {
            memcpy(o + w, "\xef\xbf\xbd", 3);
            w += 3, i++;
        }
    }
    o[w] = 0;
    if (out_n) *out_n = w;
    return o;
}

size_t toy_utf8_chars(const char *s, size_t n) {
    size_t c = 0;
    uint32_t cp;
    for (size_t i = 0; i < n; c++) {
        int k = tok_utf8_decode(s + i, n - i, &cp);
        i += k ? (size_t)k : 1;
    }
    return c;
}
