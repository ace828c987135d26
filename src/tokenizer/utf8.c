/* utf8.c: checking and repairing UTF-8 for text that leaves toy as JSON
 * (include/toy/tokenizer.h). Decoded tokens can end inside a character
 * and a small model can emit any byte sequence; JSON libraries refuse
 * such strings, so every writer of model text goes through here. The
 * rules (no overlong forms, surrogates or code points past U+10FFFF) are
 * the tokenizer's own decoder's, toy_tok_utf8_decode. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer-impl.h"

bool toy_utf8_valid(const char *s, size_t n) {
    uint32_t cp;
    for (size_t i = 0; i < n;) {
        int k = toy_tok_utf8_decode(s + i, n - i, &cp);
        if (!k) return false;
        i += (size_t)k;
    }
    return true;
}

/* Bytes of the ill-formed sequence at s[0] that one U+FFFD stands for: its "maximal subpart" (Unicode ch. 3,
 * U+FFFD substitution), the longest start of a well-formed character there, or the one byte. A character cut
 * off ("\xe2\x82") is one U+FFFD, as Python, Rust, browsers and llama.cpp's clients print it */
static size_t bad_len(const unsigned char *s, size_t n) {
    unsigned char c = s[0], lo = 0x80, hi = 0xBF;
    size_t need;
    if (c >= 0xC2 && c <= 0xDF) need = 1;
    else if (c >= 0xE0 && c <= 0xEF) need = 2, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
    else if (c >= 0xF0 && c <= 0xF4) need = 3, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
    else return 1;
    size_t k = 1;
    if (k < n && s[k] >= lo && s[k] <= hi) /* the second byte has its own range; the rest are 80..BF */
        for (k++; k <= need && k < n && s[k] >= 0x80 && s[k] <= 0xBF; k++) {}
    return k;
}

char *toy_utf8_clean(const char *s, size_t n, size_t *out_n) {
    char *o = malloc(3 * n + 1);
    if (!o) return NULL;
    size_t w = 0;
    uint32_t cp;
    for (size_t i = 0; i < n;) {
        int k = toy_tok_utf8_decode(s + i, n - i, &cp);
        if (k) {
            memcpy(o + w, s + i, (size_t)k);
            w += (size_t)k, i += (size_t)k;
        } else {
            memcpy(o + w, "\xef\xbf\xbd", 3);
            w += 3, i += bad_len((const unsigned char *)s + i, n - i);
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
        int k = toy_tok_utf8_decode(s + i, n - i, &cp);
        i += k ? (size_t)k : bad_len((const unsigned char *)s + i, n - i);
    }
    return c;
}
