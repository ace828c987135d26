/* utf8.c: checking and repairing UTF-8 for text that leaves toy as JSON
 * (include/toy/tokenizer.h). Decoded tokens can end inside a character
 * and a small model can emit any byte sequence; JSON libraries refuse
 * such strings, so every writer of model text goes through here. */
#include <stdlib.h>
#include <string.h>

#include "toy/tokenizer.h"

/* length of the valid UTF-8 sequence at s (n bytes left), 0 if invalid:
 * no overlong forms, no surrogates, nothing past U+10FFFF */
static size_t seq_len(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    if (c < 0x80) return 1;
    size_t len;
    unsigned cp, min;
    if (c >= 0xc2 && c <= 0xdf) len = 2, cp = c & 0x1f, min = 0x80;
    else if (c >= 0xe0 && c <= 0xef) len = 3, cp = c & 0x0f, min = 0x800;
    else if (c >= 0xf0 && c <= 0xf4) len = 4, cp = c & 0x07, min = 0x10000;
    else return 0;
    if (n < len) return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        cp = cp << 6 | (s[i] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
    return len;
}

bool toy_utf8_valid(const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        size_t k = seq_len(p + i, n - i);
        if (!k) return false;
        i += k;
    }
    return true;
}

char *toy_utf8_clean(const char *s, size_t n, size_t *out_n) {
    char *o = malloc(3 * n + 1);
    if (!o) return NULL;
    const unsigned char *p = (const unsigned char *)s;
    size_t w = 0;
    for (size_t i = 0; i < n;) {
        size_t k = seq_len(p + i, n - i);
        if (k) {
            memcpy(o + w, p + i, k);
            w += k, i += k;
        } else {
            memcpy(o + w, "\xef\xbf\xbd", 3);
            w += 3, i++;
        }
    }
    o[w] = 0;
    if (out_n) *out_n = w;
    return o;
}
