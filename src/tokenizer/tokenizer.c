/* tokenizer.c: the vocabulary of a toy_tokenizer (building it from a spec,
 * queries), the special-token partition of input text, dispatch to the four
 * algorithms, and decoding (whole and streaming).
 *
 * Special tokens follow llama.cpp's llama_vocab::tokenize: USER_DEFINED
 * tokens are always matched in the text, CONTROL/UNKNOWN tokens only when the
 * caller asks (Hugging Face's encode(add_special_tokens=False) matches every
 * added token, i.e. TOY_ENCODE_PARSE_SPECIAL). The longest token wins at the
 * leftmost position. SentencePiece's dummy prefix goes on the first text
 * fragment and on each one that follows a special token (llama.cpp).
 * Decoding strips the dummy-prefix space once, at the start of the output
 * (SentencePiece's DecodeIds, Hugging Face's Strip decoder). WordPiece
 * decodes as Hugging Face's WordPiece decoder: a space before each token
 * but continuations and the first, then its cleanup, token by token.
 */
#include "tokenizer-impl.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <utf8proc.h>

enum toy_status toy_tok_reserve(void **buf, size_t *cap, size_t need) {
    if (need <= *cap) return TOY_OK;
    size_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *p = realloc(*buf, c);
    if (!p) return toy_error(TOY_ERR_NOMEM, "tokenizer: out of memory (%zu bytes)", c);
    *buf = p;
    *cap = c;
    return TOY_OK;
}

enum toy_status toy_tok_push(struct toy_tokens *out, int32_t id) {
    if (out->n == out->cap) {
        int64_t c = out->cap ? out->cap * 2 : 256;
        int32_t *p = realloc(out->ids, (size_t)c * sizeof *p);
        if (!p) return toy_error(TOY_ERR_NOMEM, "tokenizer: out of memory (%lld ids)", (long long)c);
        out->ids = p;
        out->cap = c;
    }
    out->ids[out->n++] = id;
    return TOY_OK;
}

bool toy_tok_cache_get(struct tok_cache *c, const char *w, size_t n, struct toy_tokens *out) {
    if (!c->tab || n > TOK_CACHE_WORD) return false;
    uint64_t h = tok_hash(w, n);
    for (uint32_t i = (uint32_t)h & c->mask;; i = (i + 1) & c->mask) {
        const struct tok_cache_ent *e = &c->tab[i];
        if (!e->wlen) return false;
        if (e->h == h && e->wlen == n && !memcmp(c->bytes + e->woff, w, n)) {
            if (out->n + e->nids > out->cap) {
                int64_t cap = out->cap ? out->cap : 256;
                while (cap < out->n + e->nids) cap *= 2;
                int32_t *p = realloc(out->ids, (size_t)cap * sizeof *p);
                if (!p) return false; /* the slow path reports the error */
                out->ids = p;
                out->cap = cap;
            }
            memcpy(out->ids + out->n, c->ids + e->ioff, e->nids * sizeof *c->ids);
            out->n += e->nids;
            return true;
        }
    }
}

void toy_tok_cache_put(struct tok_cache *c, const char *w, size_t n, const int32_t *ids, int64_t k) {
    if (n == 0 || n > TOK_CACHE_WORD || k <= 0 || k > TOK_CACHE_WORD || c->count >= TOK_CACHE_MAX) return;
    if (!c->tab || (c->count + 1) * 2 > c->mask + 1) {
        /* grow by doubling: a small table stays in cache for short texts */
        uint32_t cap = c->tab ? 2 * (c->mask + 1) : 4096;
        struct tok_cache_ent *t = calloc(cap, sizeof *t);
        if (!t) return;
        for (uint32_t i = 0; c->tab && i <= c->mask; i++) {
            if (!c->tab[i].wlen) continue;
            uint32_t j = (uint32_t)c->tab[i].h & (cap - 1);
            while (t[j].wlen) j = (j + 1) & (cap - 1);
            t[j] = c->tab[i];
        }
        free(c->tab);
        c->tab = t;
        c->mask = cap - 1;
    }
    void *p = c->bytes;
    if (toy_tok_reserve(&p, &c->cb, c->nb + n)) return;
    c->bytes = p;
    p = c->ids;
    size_t cib = c->ci * sizeof *c->ids;
    if (toy_tok_reserve(&p, &cib, (c->ni + (size_t)k) * sizeof *c->ids)) return;
    c->ids = p;
    c->ci = cib / sizeof *c->ids;
    uint64_t h = tok_hash(w, n);
    uint32_t i = (uint32_t)h & c->mask;
    while (c->tab[i].wlen) i = (i + 1) & c->mask;
    memcpy(c->bytes + c->nb, w, n);
    memcpy(c->ids + c->ni, ids, (size_t)k * sizeof *ids);
    c->tab[i] = (struct tok_cache_ent){h, (uint32_t)c->nb, (uint32_t)n, (uint32_t)c->ni, (uint32_t)k};
    c->nb += n;
    c->ni += (size_t)k;
    c->count++;
}

void toy_tok_cache_free(struct tok_cache *c) {
    free(c->tab);
    free(c->bytes);
    free(c->ids);
    memset(c, 0, sizeof *c);
}

void toy_tokens_free(struct toy_tokens *t) {
    if (!t) return;
    free(t->ids);
    t->ids = NULL;
    t->n = t->cap = 0;
}

int toy_tok_utf8_decode(const char *s, size_t n, uint32_t *cp) {
    const unsigned char *u = (const unsigned char *)s;
    if (n == 0) return 0;
    if (u[0] < 0x80) { *cp = u[0]; return 1; }
    int len;
    uint32_t c, min;
    if (u[0] >= 0xC2 && u[0] <= 0xDF) { len = 2; c = u[0] & 0x1F; min = 0x80; }
    else if (u[0] >= 0xE0 && u[0] <= 0xEF) { len = 3; c = u[0] & 0x0F; min = 0x800; }
    else if (u[0] >= 0xF0 && u[0] <= 0xF4) { len = 4; c = u[0] & 0x07; min = 0x10000; }
    else return 0;
    if ((size_t)len > n) return 0;
    for (int i = 1; i < len; i++) {
        if ((u[i] & 0xC0) != 0x80) return 0;
        c = (c << 6) | (u[i] & 0x3F);
    }
    if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) return 0;
    *cp = c;
    return len;
}

int toy_tok_utf8_encode(uint32_t cp, char *out) {
    unsigned char *o = (unsigned char *)out;
    if (cp < 0x80) { o[0] = (unsigned char)cp; return 1; }
    if (cp < 0x800) { o[0] = 0xC0 | (cp >> 6); o[1] = 0x80 | (cp & 0x3F); return 2; }
    if (cp < 0x10000) {
        o[0] = 0xE0 | (cp >> 12); o[1] = 0x80 | ((cp >> 6) & 0x3F); o[2] = 0x80 | (cp & 0x3F);
        return 3;
    }
    o[0] = 0xF0 | (cp >> 18); o[1] = 0x80 | ((cp >> 12) & 0x3F);
    o[2] = 0x80 | ((cp >> 6) & 0x3F); o[3] = 0x80 | (cp & 0x3F);
    return 4;
}

static enum toy_status strmap_build(struct tok_strmap *m, int32_t n, char *const *keys, const uint32_t *lens,
                                    const bool *include) {
    uint64_t cap = 16;
    while (cap < (uint64_t)n * 2) cap *= 2;
    m->slots = calloc(cap, sizeof *m->slots);
    if (!m->slots) return toy_error(TOY_ERR_NOMEM, "tokenizer: out of memory (vocabulary map)");
    m->mask = cap - 1;
    m->keys = (const char *const *)keys;
    m->lens = lens;
    for (int32_t id = 0; id < n; id++) {
        if (include && !include[id]) continue;
        uint64_t i = tok_hash(keys[id], lens[id]) & m->mask;
        for (;;) {
            uint32_t v = m->slots[i];
            if (!v) { m->slots[i] = (uint32_t)id + 1; break; }
            uint32_t o = v - 1;
            if (lens[o] == lens[id] && memcmp(keys[o], keys[id], lens[id]) == 0) break; /* first id wins */
            i = (i + 1) & m->mask;
        }
    }
    return TOY_OK;
}

int toy_tok_parse_byte_piece(const char *s, size_t n) {
    /* "<0xHH>" -> HH, else -1 */
    if (n != 6 || s[0] != '<' || s[1] != '0' || s[2] != 'x' || s[5] != '>') return -1;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10
              : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

static int cmp_special_len(const void *a, const void *b, void *ctx) {
    const struct toy_tokenizer *tok = ctx;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    if (tok->text_len[x] != tok->text_len[y]) return tok->text_len[x] > tok->text_len[y] ? -1 : 1;
    return x < y ? -1 : x > y;
}

void toy_tokenizer_free(struct toy_tokenizer *tok) {
    if (!tok) return;
    if (tok->text) for (int32_t i = 0; i < tok->n_vocab; i++) {
        if (tok->bytes && tok->bytes[i] != tok->text[i]) free(tok->bytes[i]);
        free(tok->text[i]);
    }
    free(tok->text);
    free(tok->text_len);
    free(tok->bytes);
    free(tok->bytes_len);
    free(tok->scores);
    free(tok->types);
    free(tok->attrs);
    free(tok->text_map.slots);
    free(tok->bytes_map.slots);
    toy_tok_bpe_free(tok);
    free(tok->special);
    free(tok->chat_template);
    free(tok->pre);
    free(tok);
}

static int32_t check_special(const struct toy_tokenizer_spec *spec, int32_t id, const char *what,
                             enum toy_status *st) {
    if (id < -1 || id >= spec->n_tokens) {
        *st = toy_error(TOY_ERR_RANGE, "tokenizer: %s token id %d out of range [0, %lld)", what, id,
                        (long long)spec->n_tokens);
        return -1;
    }
    return id;
}

enum toy_status toy_tokenizer_init(const struct toy_tokenizer_spec *spec, struct toy_tokenizer **out) {
    if (!out) return toy_error(TOY_ERR_INVALID_ARG, "toy_tokenizer_init: out is NULL");
    *out = NULL;
    if (!spec || spec->n_tokens <= 0 || spec->n_tokens >= INT32_MAX || !spec->tokens)
        return toy_error(TOY_ERR_INVALID_ARG, "tokenizer: empty or oversized vocabulary (%lld tokens)",
                         spec ? (long long)spec->n_tokens : 0LL);
    if (spec->kind != TOY_TOKENIZER_BPE && spec->kind != TOY_TOKENIZER_SPM && spec->kind != TOY_TOKENIZER_UGM &&
        spec->kind != TOY_TOKENIZER_WPM)
        return toy_error(TOY_ERR_UNSUPPORTED, "tokenizer: unknown kind %d", (int)spec->kind);
    if (spec->kind == TOY_TOKENIZER_WPM &&
        (spec->max_word_chars < 0 || spec->strip_accents < -1 || spec->strip_accents > 1))
        return toy_error(TOY_ERR_INVALID_ARG, "tokenizer: WordPiece max_word_chars %d or strip_accents %d out of range",
                         (int)spec->max_word_chars, spec->strip_accents);
    struct toy_tokenizer *tok = calloc(1, sizeof *tok);
    if (!tok) return toy_error(TOY_ERR_NOMEM, "tokenizer: out of memory");
    enum toy_status st = TOY_OK;
    int32_t n = (int32_t)spec->n_tokens;
    tok->kind = spec->kind;
    tok->n_vocab = n;
    tok->text = calloc((size_t)n, sizeof *tok->text);
    tok->bytes = calloc((size_t)n, sizeof *tok->bytes);
    tok->text_len = calloc((size_t)n, sizeof *tok->text_len);
    tok->bytes_len = calloc((size_t)n, sizeof *tok->bytes_len);
    tok->scores = calloc((size_t)n, sizeof *tok->scores);
    tok->types = calloc((size_t)n, sizeof *tok->types);
    bool *normal = calloc((size_t)n, sizeof *normal);
    if (spec->attrs && (tok->attrs = malloc((size_t)n))) memcpy(tok->attrs, spec->attrs, (size_t)n);
    if (!tok->text || !tok->bytes || !tok->text_len || !tok->bytes_len || !tok->scores || !tok->types || !normal ||
        (spec->attrs && !tok->attrs)) {
        st = toy_error(TOY_ERR_NOMEM, "tokenizer: out of memory (%d tokens)", n);
        goto fail;
    }
    tok->bos = check_special(spec, spec->bos, "BOS", &st);
    tok->eos = check_special(spec, spec->eos, "EOS", &st);
    tok->unk = check_special(spec, spec->unk, "UNK", &st);
    tok->pad = check_special(spec, spec->pad, "PAD", &st);
    tok->eot = check_special(spec, spec->eot, "EOT", &st);
    if (st) goto fail;
    if (spec->kind == TOY_TOKENIZER_WPM && tok->unk < 0) {
        /* a word WordPiece cannot cover is [UNK]: HF fails at encode (MissingUnkToken), we at load */
        st = toy_error(TOY_ERR_FORMAT, "tokenizer: a WordPiece vocabulary needs an [UNK] token (no unk id)");
        goto fail;
    }
    tok->wpm_lower = !spec->keep_case;
    tok->wpm_strip = spec->strip_accents ? spec->strip_accents > 0 : tok->wpm_lower;
    tok->wpm_max_chars = spec->max_word_chars ? spec->max_word_chars : 100;
    for (int k = 0; k < 4; k++) tok->named_eog[k] = -1;
    tok->add_bos = spec->add_bos && tok->bos >= 0;
    tok->add_eos = spec->add_eos && tok->eos >= 0;
    tok->add_space_prefix = spec->add_space_prefix;
    tok->prefix_every_fragment = spec->prefix_every_fragment;
    tok->ignore_merges = spec->ignore_merges;
    tok->nfc = spec->nfc;
    memset(tok->byte_tok, 0xff, sizeof tok->byte_tok);
    tok->min_score = 1e30f;

    for (int32_t i = 0; i < n; i++) {
        const char *s = spec->tokens[i];
        if (!s) { st = toy_error(TOY_ERR_FORMAT, "tokenizer: token %d is missing", i); goto fail; }
        size_t len = strlen(s);
        if (len >= UINT32_MAX) { st = toy_error(TOY_ERR_FORMAT, "tokenizer: token %d too long", i); goto fail; }
        tok->text[i] = malloc(len + 1);
        if (!tok->text[i]) { st = toy_error(TOY_ERR_NOMEM, "tokenizer: out of memory"); goto fail; }
        memcpy(tok->text[i], s, len + 1);
        tok->text_len[i] = (uint32_t)len;
        tok->scores[i] = spec->scores ? spec->scores[i] : 0.0f;
        int32_t ty = spec->types ? spec->types[i] : TOY_TOKEN_NORMAL;
        if (ty < TOY_TOKEN_UNDEFINED || ty > TOY_TOKEN_BYTE) {
            st = toy_error(TOY_ERR_FORMAT, "tokenizer: token %d ('%s') has unknown type %d", i, s, ty);
            goto fail;
        }
        if (ty == TOY_TOKEN_UNDEFINED) ty = TOY_TOKEN_NORMAL;
        int byte = toy_tok_parse_byte_piece(s, len);
        if (!spec->types && (spec->kind == TOY_TOKENIZER_SPM || spec->kind == TOY_TOKENIZER_UGM) && byte >= 0)
            ty = TOY_TOKEN_BYTE;
        if (!spec->types && (i == tok->bos || i == tok->eos || i == tok->pad || i == tok->eot))
            ty = TOY_TOKEN_CONTROL;
        if (!spec->types && i == tok->unk) ty = TOY_TOKEN_UNKNOWN;
        tok->types[i] = ty;
        normal[i] = ty == TOY_TOKEN_NORMAL || ty == TOY_TOKEN_USER_DEFINED;
        /* WordPiece looks every token up by its text, as llama.cpp does */
        if (spec->kind == TOY_TOKENIZER_WPM && len > tok->max_piece_len) tok->max_piece_len = (uint32_t)len;
        if ((spec->kind == TOY_TOKENIZER_SPM || spec->kind == TOY_TOKENIZER_UGM) &&
            (ty == TOY_TOKEN_NORMAL || ty == TOY_TOKEN_USER_DEFINED)) {
            if (len > tok->max_piece_len) tok->max_piece_len = (uint32_t)len;
            if (tok->scores[i] < tok->min_score) tok->min_score = tok->scores[i];
        }
    }
    if (tok->min_score > 1e29f) tok->min_score = 0;

    /* bytes each token decodes to */
    for (int32_t i = 0; i < n; i++) {
        const char *s = tok->text[i];
        size_t len = tok->text_len[i];
        int32_t ty = tok->types[i];
        tok->bytes[i] = tok->text[i];
        tok->bytes_len[i] = (uint32_t)len;
        if (tok->kind == TOY_TOKENIZER_BPE) {
            if (ty == TOY_TOKEN_CONTROL || ty == TOY_TOKEN_UNKNOWN) continue;
            /* GPT-2 byte-level form: every code point stands for one byte */
            char *b = malloc(len + 1);
            if (!b) { st = toy_error(TOY_ERR_NOMEM, "tokenizer: out of memory"); goto fail; }
            size_t o = 0, p = 0;
            bool ok = true;
            while (p < len) {
                uint32_t cp;
                int l = toy_tok_utf8_decode(s + p, len - p, &cp);
                int by = l ? toy_tok_cp_to_byte(cp) : -1;
                if (by < 0) { ok = false; break; }
                b[o++] = (char)by;
                p += (size_t)l;
            }
            if (!ok) { free(b); continue; } /* added token stored as plain text */
            b[o] = 0;
            tok->bytes[i] = b;
            tok->bytes_len[i] = (uint32_t)o;
        } else {
            int byte = toy_tok_parse_byte_piece(s, len);
            if (ty == TOY_TOKEN_BYTE && byte >= 0) {
                char *b = malloc(2);
                if (!b) { st = toy_error(TOY_ERR_NOMEM, "tokenizer: out of memory"); goto fail; }
                b[0] = (char)byte;
                b[1] = 0;
                tok->bytes[i] = b;
                tok->bytes_len[i] = 1;
                if (tok->byte_tok[byte] < 0) tok->byte_tok[byte] = i;
                continue;
            }
            if (ty == TOY_TOKEN_CONTROL || ty == TOY_TOKEN_UNKNOWN) continue;
            if (!strstr(s, "\xe2\x96\x81")) continue;
            char *b = malloc(len + 1);
            if (!b) { st = toy_error(TOY_ERR_NOMEM, "tokenizer: out of memory"); goto fail; }
            size_t o = 0;
            for (size_t p = 0; p < len;) {
                if (p + 3 <= len && !memcmp(s + p, "\xe2\x96\x81", 3)) { b[o++] = ' '; p += 3; }
                else b[o++] = s[p++];
            }
            b[o] = 0;
            tok->bytes[i] = b;
            tok->bytes_len[i] = (uint32_t)o;
        }
    }

    if ((st = strmap_build(&tok->text_map, n, tok->text, tok->text_len, NULL))) goto fail;
    toy_tok_eog_setup(tok);
    if (tok->kind == TOY_TOKENIZER_BPE) {
        for (int32_t i = 0; i < n; i++)
            if (tok->bytes[i] == tok->text[i] && tok->types[i] != TOY_TOKEN_NORMAL) normal[i] = false;
        if ((st = strmap_build(&tok->bytes_map, n, tok->bytes, tok->bytes_len, normal))) goto fail;
        for (int b = 0; b < 256; b++) {
            char c = (char)b;
            tok->byte_tok[b] = tok_strmap_get(&tok->bytes_map, &c, 1);
        }
        if ((st = toy_tok_bpe_setup(tok, spec))) goto fail;
    } else if (tok->kind == TOY_TOKENIZER_WPM) {
        if (!(tok->pre = strdup("default"))) { st = toy_error(TOY_ERR_NOMEM, "tokenizer: out of memory"); goto fail; }
    } else {
        if (tok->kind == TOY_TOKENIZER_SPM && spec->merges && spec->n_merges > 0) {
            if ((st = toy_tok_merges_setup(tok, spec))) goto fail;
            tok->spm_ranked = true;
        }
        tok->spm_word_split = !tok->spm_ranked;
        for (int32_t i = 0; i < n && tok->spm_word_split; i++) {
            int32_t ty = tok->types[i];
            if (ty != TOY_TOKEN_NORMAL && ty != TOY_TOKEN_USER_DEFINED && ty != TOY_TOKEN_UNUSED) continue;
            const char *t = tok->text[i];
            for (const char *m = strstr(t, "\xe2\x96\x81"); m; m = strstr(m + 3, "\xe2\x96\x81"))
                if (m > t && !(m - t >= 3 && !memcmp(m - 3, "\xe2\x96\x81", 3))) { tok->spm_word_split = false; break; }
        }
        tok->pre = strdup("default");
        if (!tok->pre) { st = toy_error(TOY_ERR_NOMEM, "tokenizer: out of memory"); goto fail; }
    }

    /* special tokens matched in text */
    tok->special = malloc((size_t)n * sizeof *tok->special);
    if (!tok->special) { st = toy_error(TOY_ERR_NOMEM, "tokenizer: out of memory"); goto fail; }
    for (int32_t i = 0; i < n; i++) {
        int32_t ty = tok->types[i];
        if ((ty == TOY_TOKEN_CONTROL || ty == TOY_TOKEN_USER_DEFINED || ty == TOY_TOKEN_UNKNOWN) &&
            tok->text_len[i] > 0) {
            tok->special[tok->n_special++] = i;
            tok->special_first[(unsigned char)tok->text[i][0]] = 1;
        }
    }
    qsort_r(tok->special, (size_t)tok->n_special, sizeof *tok->special, cmp_special_len, tok);

    if (spec->chat_template && !(tok->chat_template = strdup(spec->chat_template))) {
        st = toy_error(TOY_ERR_NOMEM, "tokenizer: out of memory");
        goto fail;
    }
    free(normal);
    *out = tok;
    return TOY_OK;
fail:
    free(normal);
    toy_tokenizer_free(tok);
    return st;
}

/* ---- encode ---- */

static enum toy_status encode_fragment(const struct toy_tokenizer *tok, struct tok_scratch *s, const char *text,
                                       size_t len, bool prev_special, struct toy_tokens *out) {
    bool prefix = tok->add_space_prefix && (prev_special || tok->prefix_every_fragment);
    switch (tok->kind) {
    case TOY_TOKENIZER_BPE: return toy_tok_bpe_encode(tok, s, text, len, out);
    case TOY_TOKENIZER_SPM: return toy_tok_spm_encode(tok, s, text, len, prefix, out);
    case TOY_TOKENIZER_UGM: return toy_tok_ugm_encode(tok, s, text, len, prefix, out);
    case TOY_TOKENIZER_WPM: return toy_tok_wpm_encode(tok, s, text, len, out);
    }
    return TOY_ERR_STATE;
}

enum toy_status toy_tokenizer_encode(const struct toy_tokenizer *tok, const char *text, size_t len,
                                     unsigned flags, struct toy_tokens *out) {
    if (!out) return toy_error(TOY_ERR_INVALID_ARG, "toy_tokenizer_encode: out is NULL");
    if (!tok || (!text && len)) return toy_error(TOY_ERR_INVALID_ARG, "tokenizer_encode: NULL argument");
    enum toy_status st = TOY_OK;
    struct tok_scratch s = {0};
    char *norm = NULL;
    bool add_bos = !(flags & TOY_ENCODE_NO_BOS) &&
                   ((flags & TOY_ENCODE_ADD_BOS) || ((flags & TOY_ENCODE_MODEL_DEFAULTS) && tok->add_bos));
    bool add_eos = (flags & TOY_ENCODE_ADD_EOS) || ((flags & TOY_ENCODE_MODEL_DEFAULTS) && tok->add_eos);
    bool parse_special = flags & TOY_ENCODE_PARSE_SPECIAL;
    if (add_bos && tok->bos >= 0 && (st = toy_tok_push(out, tok->bos))) return st;

    if (tok->nfc && len) {
        utf8proc_uint8_t *dst = NULL;
        utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)text, (utf8proc_ssize_t)len, &dst,
                                          UTF8PROC_STABLE | UTF8PROC_COMPOSE);
        if (r >= 0) { /* invalid UTF-8 is left as it is */
            norm = (char *)dst;
            text = norm;
            len = (size_t)r;
        } else {
            free(dst);
        }
    }

    bool prev_special = true;
    size_t frag = 0, pos = 0;
    while (pos < len) {
        unsigned char c = (unsigned char)text[pos];
        int32_t hit = -1;
        if (tok->special_first[c]) {
            for (int k = 0; k < tok->n_special; k++) {
                int32_t id = tok->special[k];
                uint32_t l = tok->text_len[id];
                if (l > len - pos || (unsigned char)tok->text[id][0] != c) continue;
                if (tok->types[id] != TOY_TOKEN_USER_DEFINED && !parse_special) continue;
                if (memcmp(tok->text[id], text + pos, l) == 0) { hit = id; break; }
            }
        }
        if (hit < 0) { pos++; continue; }
        /* Hugging Face added tokens may swallow the whitespace beside them */
        size_t fend = pos;
        if (tok->attrs && (tok->attrs[hit] & TOY_TOKEN_ATTR_LSTRIP))
            while (fend > frag && isspace((unsigned char)text[fend - 1])) fend--;
        if (fend > frag && (st = encode_fragment(tok, &s, text + frag, fend - frag, prev_special, out))) goto done;
        if ((st = toy_tok_push(out, hit))) goto done;
        prev_special = true;
        pos += tok->text_len[hit];
        if (tok->attrs && (tok->attrs[hit] & TOY_TOKEN_ATTR_RSTRIP))
            while (pos < len && isspace((unsigned char)text[pos])) pos++;
        frag = pos;
    }
    if (len > frag && (st = encode_fragment(tok, &s, text + frag, len - frag, prev_special, out))) goto done;
    if (add_eos && tok->eos >= 0) st = toy_tok_push(out, tok->eos);
done:
    free(norm);
    toy_tok_cache_free(&s.cache);
    free(s.buf);
    free(s.buf2);
    free(s.buf3);
    free(s.buf4);
    if (s.md) pcre2_match_data_free(s.md);
    if (s.jit) pcre2_jit_stack_free(s.jit);
    if (s.mctx) pcre2_match_context_free(s.mctx);
    return st;
}

/* ---- decode ---- */

const char *toy_tokenizer_token_bytes(const struct toy_tokenizer *tok, int32_t id, size_t *len) {
    if (!tok || id < 0 || id >= tok->n_vocab) return NULL;
    if (len) *len = tok->bytes_len[id];
    return tok->bytes[id];
}

struct toy_decoder {
    const struct toy_tokenizer *tok;
    unsigned flags;
    bool started;  /* something was output: no more leading-space stripping */
    char *buf;     /* pending bytes + returned text */
    size_t cap, held, ret;
};

enum toy_status toy_decoder_init(const struct toy_tokenizer *tok, unsigned flags, struct toy_decoder **out) {
    if (!out) return toy_error(TOY_ERR_INVALID_ARG, "toy_decoder_init: out is NULL");
    *out = calloc(1, sizeof **out);
    if (!*out) return toy_error(TOY_ERR_NOMEM, "decoder: out of memory");
    (*out)->tok = tok;
    (*out)->flags = flags;
    return TOY_OK;
}

void toy_decoder_free(struct toy_decoder *d) {
    if (!d) return;
    free(d->buf);
    free(d);
}

/* A WordPiece token as Hugging Face's WordPiece decoder writes it: a
 * continuation (a normal piece stored without the word-initial U+2581, whose
 * bytes therefore start with no space) glued to what came before, any other
 * token after a space, which the first token written goes without; then
 * the decoder's cleanup of that token's text. Tokens skipped as special are
 * not there for the decoder, as HF drops them before it. */
static enum toy_status wpm_append(struct toy_decoder *d, int32_t id, const char *b, size_t n) {
    int32_t ty = d->tok->types[id];
    bool cont = (ty == TOY_TOKEN_NORMAL || ty == TOY_TOKEN_UNUSED) && !(n && b[0] == ' ');
    bool space = !cont && !(n && b[0] == ' ');
    if (!d->started) {
        if (!(d->flags & TOY_DECODE_KEEP_LEADING_SPACE)) {
            space = false;
            if (n && b[0] == ' ') { b++; n--; }
        }
        d->started = true;
    }
    void *p = d->buf;
    enum toy_status st = toy_tok_reserve(&p, &d->cap, d->held + n + 2);
    if (st) return st;
    d->buf = p;
    char *o = d->buf + d->held;
    if (space) *o = ' ';
    memcpy(o + space, b, n);
    d->held += toy_tok_wpm_cleanup(o, n + space);
    return TOY_OK;
}

/* Appends the bytes of `id` after the held bytes; returns them in d->buf. */
static enum toy_status decoder_append(struct toy_decoder *d, int32_t id) {
    const struct toy_tokenizer *tok = d->tok;
    if (id < 0 || id >= tok->n_vocab)
        return toy_error(TOY_ERR_RANGE, "decode: token id %d out of range [0, %d)", id, tok->n_vocab);
    int32_t ty = tok->types[id];
    if ((d->flags & TOY_DECODE_SKIP_SPECIAL) &&
        (ty == TOY_TOKEN_CONTROL || ty == TOY_TOKEN_UNKNOWN || ty == TOY_TOKEN_UNUSED))
        return TOY_OK;
    const char *b = tok->bytes[id];
    size_t n = tok->bytes_len[id];
    if (tok->kind == TOY_TOKENIZER_WPM) return wpm_append(d, id, b, n);
    if (!d->started && n > 0) {
        if (tok->kind != TOY_TOKENIZER_BPE && tok->add_space_prefix && !(d->flags & TOY_DECODE_KEEP_LEADING_SPACE) &&
            b[0] == ' ' && ty != TOY_TOKEN_BYTE) {
            b++;
            n--;
        }
        d->started = true;
    }
    void *p = d->buf;
    enum toy_status st = toy_tok_reserve(&p, &d->cap, d->held + n + 1);
    if (st) return st;
    d->buf = p;
    memcpy(d->buf + d->held, b, n);
    d->held += n;
    return TOY_OK;
}

/* Length of the prefix of s[0..n) that ends on a character boundary: an
 * incomplete but so-far valid multi-byte sequence at the end is held back. */
static size_t complete_prefix(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t k = 1; k <= 3 && k <= n; k++) {
        unsigned char c = u[n - k];
        if ((c & 0xC0) == 0x80) continue; /* continuation byte: look further back */
        int need = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 1;
        return (size_t)need > k ? n - k : n;
    }
    return n;
}

enum toy_status toy_decoder_push(struct toy_decoder *d, int32_t id, const char **text, size_t *len) {
    if (!text || !len) return toy_error(TOY_ERR_INVALID_ARG, "toy_decoder_push: %s is NULL", text ? "len" : "text");
    /* drop what was returned last time, keep the held tail */
    if (d->ret) {
        memmove(d->buf, d->buf + d->ret, d->held - d->ret);
        d->held -= d->ret;
        d->ret = 0;
    }
    *text = "";
    *len = 0;
    enum toy_status st = decoder_append(d, id);
    if (st) return st;
    if (!d->held) return TOY_OK;
    size_t k = complete_prefix(d->buf, d->held);
    /* return the complete part; the tail stays held */
    *text = d->buf;
    *len = k;
    d->ret = k;
    return TOY_OK;
}

void toy_decoder_continue(struct toy_decoder *d, const int32_t *ids, int64_t n) {
    const struct toy_tokenizer *tok = d->tok;
    for (int64_t i = 0; i < n && !d->started; i++) {
        if (ids[i] < 0 || ids[i] >= tok->n_vocab || !tok->bytes_len[ids[i]]) continue;
        int32_t ty = tok->types[ids[i]];
        if (ty != TOY_TOKEN_CONTROL && ty != TOY_TOKEN_UNKNOWN && ty != TOY_TOKEN_UNUSED) d->started = true;
    }
}

void toy_decoder_flush(struct toy_decoder *d, const char **text, size_t *len) {
    if (d->ret) {
        memmove(d->buf, d->buf + d->ret, d->held - d->ret);
        d->held -= d->ret;
        d->ret = 0;
    }
    *text = d->buf ? d->buf : "";
    *len = d->held;
    d->ret = d->held;
}

enum toy_status toy_tokenizer_decode(const struct toy_tokenizer *tok, const int32_t *ids, int64_t n,
                                     unsigned flags, char **text, size_t *len) {
    if (!text) return toy_error(TOY_ERR_INVALID_ARG, "toy_tokenizer_decode: text is NULL");
    *text = NULL;
    if (len) *len = 0;
    struct toy_decoder d = {.tok = tok, .flags = flags};
    enum toy_status st = TOY_OK;
    for (int64_t i = 0; i < n && !st; i++) st = decoder_append(&d, ids[i]);
    if (!st) {
        void *p = d.buf;
        st = toy_tok_reserve(&p, &d.cap, d.held + 1);
        d.buf = p;
    }
    if (st) { free(d.buf); return st; }
    d.buf[d.held] = 0;
    *text = d.buf;
    if (len) *len = d.held;
    return TOY_OK;
}

/* ---- queries ---- */

int64_t toy_tokenizer_n_vocab(const struct toy_tokenizer *tok) { return tok->n_vocab; }
enum toy_tokenizer_kind toy_tokenizer_kind(const struct toy_tokenizer *tok) { return tok->kind; }
const char *toy_tokenizer_pre(const struct toy_tokenizer *tok) { return tok->pre ? tok->pre : "default"; }

const char *toy_tokenizer_piece(const struct toy_tokenizer *tok, int32_t id) {
    return id >= 0 && id < tok->n_vocab ? tok->text[id] : NULL;
}

int32_t toy_tokenizer_find(const struct toy_tokenizer *tok, const char *piece, size_t len) {
    return tok_strmap_get(&tok->text_map, piece, len);
}

enum toy_token_type toy_tokenizer_token_type(const struct toy_tokenizer *tok, int32_t id) {
    return id >= 0 && id < tok->n_vocab ? (enum toy_token_type)tok->types[id] : TOY_TOKEN_UNDEFINED;
}

float toy_tokenizer_score(const struct toy_tokenizer *tok, int32_t id) {
    return id >= 0 && id < tok->n_vocab ? tok->scores[id] : 0.0f;
}

int32_t toy_tokenizer_bos(const struct toy_tokenizer *tok) { return tok->bos; }
int32_t toy_tokenizer_eos(const struct toy_tokenizer *tok) { return tok->eos; }
int32_t toy_tokenizer_unk(const struct toy_tokenizer *tok) { return tok->unk; }
int32_t toy_tokenizer_pad(const struct toy_tokenizer *tok) { return tok->pad; }
int32_t toy_tokenizer_eot(const struct toy_tokenizer *tok) { return tok->eot; }
bool toy_tokenizer_add_bos(const struct toy_tokenizer *tok) { return tok->add_bos; }
bool toy_tokenizer_add_eos(const struct toy_tokenizer *tok) { return tok->add_eos; }
/* Texts llama.cpp (llama_vocab::impl::load) takes for end of generation,
 * and for the fill-in-the-middle roles: prefix, suffix, middle, pad, repo
 * and file separator. */
static const char *const eog_text[] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
                                       "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "<|end_of_text|>", "<|return|>",
                                       "<|call|>", "<end_of_utterance>", NULL};
enum { FIM_PRE, FIM_SUF, FIM_MID, FIM_PAD, FIM_REP, FIM_SEP, N_FIM };
static const char *const fim_text[N_FIM][8] = {
    {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<\xef\xbd\x9c" "fim\xe2\x96\x81" "begin\xef\xbd\x9c>", "<PRE>",
     "\xe2\x96\x81<PRE>", "<|code_prefix|>", NULL},
    {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<\xef\xbd\x9c" "fim\xe2\x96\x81" "hole\xef\xbd\x9c>", "<SUF>",
     "\xe2\x96\x81<SUF>", "<|code_suffix|>", NULL},
    {"<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<\xef\xbd\x9c" "fim\xe2\x96\x81" "end\xef\xbd\x9c>", "<MID>",
     "\xe2\x96\x81<MID>", "<|code_middle|>", NULL},
    {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", NULL},
    {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>", NULL},
    {"<|file_sep|>", NULL},
};

static bool in_list(const char *text, const char *const *list) {
    for (; text && *list; list++)
        if (!strcmp(text, *list)) return true;
    return false;
}

bool toy_tok_is_control_text(const char *text) {
    if (in_list(text, eog_text)) return true;
    for (int k = 0; k < N_FIM; k++)
        if (in_list(text, fim_text[k])) return true;
    return false;
}

static int32_t find_text(const struct toy_tokenizer *tok, const char *s) {
    return tok_strmap_get(&tok->text_map, s, strlen(s));
}

void toy_tok_eog_add(struct toy_tokenizer *tok, int32_t id) {
    if (id < 0 || tok->n_eog == TOK_MAX_EOG) return;
    for (int i = 0; i < tok->n_eog; i++)
        if (tok->eog[i] == id) return;
    tok->eog[tok->n_eog++] = id;
}

/* The tokens that end generation, as llama.cpp chooses them: EOS and EOT,
 * every token whose text is in eog_text, and the fill-in-the-middle pad,
 * repo and file-separator tokens (the lowest id of each role's texts).
 * With <|return|> and <|call|> (o200k harmony) <|end|> ends a message,
 * not the generation, even where a file names it the end of turn; then
 * the message markers (<|channel|>, <|message|>, <|start|>, <|constrain|>,
 * <|end|>) become user-defined tokens, which decode as text. */
void toy_tok_eog_setup(struct toy_tokenizer *tok) {
    tok->n_eog = 0;
    toy_tok_eog_add(tok, tok->eos);
    toy_tok_eog_add(tok, tok->eot);
    for (const char *const *t = eog_text; *t; t++) toy_tok_eog_add(tok, find_text(tok, *t));
    for (int k = FIM_PAD; k <= FIM_SEP; k++) {
        int32_t best = -1;
        for (const char *const *t = fim_text[k]; *t; t++) {
            int32_t id = find_text(tok, *t);
            if (id >= 0 && (best < 0 || id < best)) best = id;
        }
        toy_tok_eog_add(tok, best);
    }
    int32_t end = find_text(tok, "<|end|>");
    if (end >= 0 && end != tok->eos && find_text(tok, "<|return|>") >= 0 && find_text(tok, "<|call|>") >= 0) {
        for (int i = 0; i < tok->n_eog; i++)
            if (tok->eog[i] == end) tok->eog[i] = tok->eog[--tok->n_eog];
        /* and, as llama.cpp has it, the markers of gpt-oss's messages are text: a reply shows its channels */
        static const char *const marks[] = {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>", "<|end|>"};
        for (int k = 0; k < 5; k++) {
            int32_t id = find_text(tok, marks[k]);
            if (id >= 0 && tok->types[id] == TOY_TOKEN_CONTROL) tok->types[id] = TOY_TOKEN_USER_DEFINED;
        }
    }
}

int32_t toy_tokenizer_fim(const struct toy_tokenizer *tok, int role) {
    if (role < FIM_PRE || role > FIM_MID) return -1;
    int32_t best = -1; /* the lowest id of the role's texts, as for pad, repo and separator */
    for (const char *const *t = fim_text[role]; *t; t++) {
        int32_t id = find_text(tok, *t);
        if (id >= 0 && (best < 0 || id < best)) best = id;
    }
    return best;
}

bool toy_tokenizer_is_eog(const struct toy_tokenizer *tok, int32_t id) {
    if (id < 0) return false;
    for (int i = 0; i < tok->n_eog; i++)
        if (tok->eog[i] == id) return true;
    return false;
}
const char *toy_tokenizer_chat_template(const struct toy_tokenizer *tok) { return tok->chat_template; }
int64_t toy_tokenizer_n_merges(const struct toy_tokenizer *tok) { return tok->n_merges; }
const char *toy_tokenizer_merge(const struct toy_tokenizer *tok, int64_t rank) {
    return rank >= 0 && rank < tok->n_merges ? tok->merges[rank] : NULL;
}
