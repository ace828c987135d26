/* spm.c: SentencePiece encoding: BPE by piece score (Llama-2, Mistral) and
 * Unigram by Viterbi (Gemma/T5-style).
 *
 * Both see the text as SentencePiece's identity normalizer leaves it: spaces
 * become U+2581 and, when asked, one U+2581 is prepended (the dummy prefix).
 * Only NORMAL, USER_DEFINED and UNUSED pieces take part in segmentation
 * (sentencepiece's ModelInterface::pieces_; control, unknown and byte pieces
 * are reserved). A character no piece covers becomes its UTF-8 bytes as
 * <0xHH> tokens when the vocabulary has them (byte_fallback), else <unk>.
 *
 * BPE (sentencepiece bpe_model.cc, llama.cpp llm_tokenizer_spm): start from
 * characters, repeatedly merge the adjacent pair whose concatenation is a
 * piece with the highest score, leftmost on ties, via a max-heap whose stale
 * entries are recognised by their length.
 * Unigram (sentencepiece unigram_model.cc): the segmentation maximising the
 * sum of piece scores; a character without a piece is an unknown of score
 * min_score - 10; consecutive unknowns fuse into one <unk>.
 */
#include "tokenizer-impl.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>

static inline bool seg_piece(const struct toy_tokenizer *tok, int32_t id) {
    if (id < 0) return false;
    int32_t t = tok->types[id];
    return t == TOY_TOKEN_NORMAL || t == TOY_TOKEN_USER_DEFINED || t == TOY_TOKEN_UNUSED;
}

static inline int32_t piece_id(const struct toy_tokenizer *tok, const char *s, size_t n) {
    int32_t id = tok_strmap_get(&tok->text_map, s, n);
    return seg_piece(tok, id) ? id : -1;
}

/* Writes (▁ prefix) + text with ' ' -> ▁ into s->buf3; returns its length. */
static enum toy_status escape(struct tok_scratch *s, const char *text, size_t len, bool add_prefix, size_t *n) {
    enum toy_status st = toy_tok_reserve(&s->buf3, &s->cap3, 3 * len + 4);
    if (st) return st;
    char *e = s->buf3;
    size_t o = 0;
    if (add_prefix) { memcpy(e, "\xe2\x96\x81", 3); o = 3; }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') { memcpy(e + o, "\xe2\x96\x81", 3); o += 3; }
        else e[o++] = text[i];
    }
    *n = o;
    return TOY_OK;
}

/* One character; a byte that does not start a valid UTF-8 sequence is a
 * character of its own (it ends up as its <0xHH> token). */
static inline size_t char_len(const char *e, size_t i, size_t n) {
    if ((unsigned char)e[i] < 0x80) return 1;
    uint32_t cp;
    int l = toy_tok_utf8_decode(e + i, n - i, &cp);
    return l ? (size_t)l : 1;
}

/* A span no piece covers: its bytes, or <unk>. */
static enum toy_status fallback(const struct toy_tokenizer *tok, const char *e, size_t n, struct toy_tokens *out) {
    enum toy_status st;
    bool bytes = true;
    for (size_t i = 0; i < n; i++) if (tok->byte_tok[(unsigned char)e[i]] < 0) bytes = false;
    if (bytes) {
        for (size_t i = 0; i < n; i++)
            if ((st = toy_tok_push(out, tok->byte_tok[(unsigned char)e[i]]))) return st;
        return TOY_OK;
    }
    if (tok->unk < 0) return toy_error(TOY_ERR_NOT_FOUND, "tokenizer: text '%.*s' has no piece, no byte tokens and no <unk>", (int)n, e);
    return toy_tok_push(out, tok->unk);
}

/* ---- BPE ---- */

struct ssym {
    uint32_t start, n;
    int32_t prev, next;
};
struct bigram {
    float score;
    int32_t left;
    uint32_t size;
};

static inline bool bg_better(const struct bigram *x, const struct bigram *y) {
    return x->score > y->score || (x->score == y->score && x->left < y->left);
}

static void bg_push(struct bigram *h, size_t *n, struct bigram c) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!bg_better(&c, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = c;
}

static struct bigram bg_pop(struct bigram *h, size_t *n) {
    struct bigram top = h[0], last = h[--*n];
    size_t i = 0, m = *n;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, s = i;
        const struct bigram *best = &last;
        if (l < m && bg_better(&h[l], best)) { s = l; best = &h[l]; }
        if (r < m && bg_better(&h[r], best)) s = r;
        if (s == i) break;
        h[i] = h[s];
        i = s;
    }
    if (m) h[i] = last;
    return top;
}

static void try_bigram(const struct toy_tokenizer *tok, const char *e, const struct ssym *sy, int32_t l,
                       struct bigram *h, size_t *nh) {
    if (l < 0) return;
    int32_t r = sy[l].next;
    if (r < 0) return;
    uint32_t size = sy[l].n + sy[r].n;
    int32_t id = piece_id(tok, e + sy[l].start, size);
    if (id >= 0) bg_push(h, nh, (struct bigram){tok->scores[id], l, size});
}

/* BPE over e[0..n): the escaped text of one word or of a whole fragment. */
static enum toy_status spm_bpe(const struct toy_tokenizer *tok, struct tok_scratch *s, const char *e, size_t n,
                               struct toy_tokens *out) {
    enum toy_status st;
    if ((st = toy_tok_reserve(&s->buf, &s->cap, (n + 1) * sizeof(struct ssym)))) return st;
    if ((st = toy_tok_reserve(&s->buf2, &s->cap2, 3 * (n + 1) * sizeof(struct bigram)))) return st;
    struct ssym *sy = s->buf;
    struct bigram *h = s->buf2;
    size_t nh = 0;
    int32_t ns = 0;
    for (size_t i = 0; i < n;) {
        size_t l = char_len(e, i, n);
        sy[ns] = (struct ssym){(uint32_t)i, (uint32_t)l, ns - 1, i + l < n ? ns + 1 : -1};
        ns++;
        i += l;
    }
    for (int32_t i = 0; i + 1 < ns; i++) try_bigram(tok, e, sy, i, h, &nh);
    while (nh) {
        struct bigram b = bg_pop(h, &nh);
        struct ssym *l = &sy[b.left];
        if (l->n == 0 || l->next < 0) continue;
        struct ssym *r = &sy[l->next];
        if (l->n + r->n != b.size) continue; /* one side changed since this entry was pushed */
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) sy[r->next].prev = b.left;
        try_bigram(tok, e, sy, l->prev, h, &nh);
        try_bigram(tok, e, sy, b.left, h, &nh);
    }
    for (int32_t i = ns ? 0 : -1; i >= 0; i = sy[i].next) {
        int32_t id = piece_id(tok, e + sy[i].start, sy[i].n);
        st = id >= 0 ? toy_tok_push(out, id) : fallback(tok, e + sy[i].start, sy[i].n, out);
        if (st) return st;
    }
    return TOY_OK;
}

/* Hugging Face's BPE with byte_fallback over the escaped text as one word:
 * characters without a piece become their <0xHH> tokens (which never merge)
 * or one <unk> per run (fuse_unk); then merges by rank. */
static enum toy_status spm_ranked(const struct toy_tokenizer *tok, struct tok_scratch *s, const char *e, size_t n,
                                  struct toy_tokens *out) {
    enum toy_status st;
    if ((st = toy_tok_reserve(&s->buf4, &s->cap4, (n + 1) * sizeof(int32_t)))) return st;
    int32_t *ids = s->buf4;
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        size_t l = char_len(e, i, n);
        int32_t id = piece_id(tok, e + i, l);
        if (id >= 0) {
            ids[k++] = id;
        } else {
            bool bytes = true;
            for (size_t j = 0; j < l; j++) bytes &= tok->byte_tok[(unsigned char)e[i + j]] >= 0;
            if (bytes) for (size_t j = 0; j < l; j++) ids[k++] = tok->byte_tok[(unsigned char)e[i + j]];
            else if (k == 0 || ids[k - 1] != -1) ids[k++] = -1; /* <unk>, fused */
        }
        i += l;
    }
    return toy_tok_merge_ids(tok, s, ids, k, out);
}

enum toy_status toy_tok_spm_encode(const struct toy_tokenizer *tok, struct tok_scratch *s, const char *text,
                                   size_t len, bool add_prefix, struct toy_tokens *out) {
    enum toy_status st;
    size_t n;
    if ((st = escape(s, text, len, add_prefix, &n))) return st;
    if (n >= UINT32_MAX / 2) return toy_error(TOY_ERR_RANGE, "tokenizer: text of %zu bytes is too long", len);
    const char *e = s->buf3;
    if (tok->spm_ranked) return spm_ranked(tok, s, e, n, out);
    if (!tok->spm_word_split) return spm_bpe(tok, s, e, n, out);
    /* No piece holds U+2581 after another character, so no merge crosses the
     * point before a U+2581 that follows a non-U+2581: encode word by word
     * (same result, small heaps). */
    size_t start = 0;
    for (size_t i = 1; i <= n; i++) {
        if (i < n && (i + 3 > n || memcmp(e + i, "\xe2\x96\x81", 3) || (i >= 3 && !memcmp(e + i - 3, "\xe2\x96\x81", 3))))
            continue;
        /* e[start..i) is one word */
        if (!toy_tok_cache_get(&s->cache, e + start, i - start, out)) {
            int64_t before = out->n;
            if ((st = spm_bpe(tok, s, e + start, i - start, out))) return st;
            if (out->n > before) toy_tok_cache_put(&s->cache, e + start, i - start, out->ids + before, out->n - before);
        }
        start = i;
        if (i < n) i += 2;
    }
    return TOY_OK;
}

/* ---- Unigram ---- */

struct node {
    double score;
    uint32_t from; /* start byte of the best last piece */
    int32_t id;    /* its id, -1 = unknown */
};

enum toy_status toy_tok_ugm_encode(const struct toy_tokenizer *tok, struct tok_scratch *s, const char *text,
                                   size_t len, bool add_prefix, struct toy_tokens *out) {
    enum toy_status st;
    size_t n;
    if ((st = escape(s, text, len, add_prefix, &n))) return st;
    if (n >= UINT32_MAX / 2) return toy_error(TOY_ERR_RANGE, "tokenizer: text of %zu bytes is too long", len);
    if ((st = toy_tok_reserve(&s->buf, &s->cap, (n + 1) * sizeof(struct node)))) return st;
    if ((st = toy_tok_reserve(&s->buf2, &s->cap2, (n + 1) * sizeof(uint32_t)))) return st;
    const char *e = s->buf3;
    struct node *best = s->buf;
    for (size_t i = 0; i <= n; i++) best[i] = (struct node){-INFINITY, 0, -1};
    best[0].score = 0;
    const double unk_score = (double)tok->min_score - 10.0;
    for (size_t i = 0; i < n;) {
        size_t cl = char_len(e, i, n);
        if (best[i].score > -INFINITY) {
            bool single = false;
            for (size_t j = i + cl; j <= n && j - i <= tok->max_piece_len;) {
                int32_t id = piece_id(tok, e + i, j - i);
                if (id >= 0) {
                    double sc = best[i].score + (double)tok->scores[id];
                    if (sc > best[j].score) best[j] = (struct node){sc, (uint32_t)i, id};
                    if (j == i + cl) single = true;
                }
                if (j == n) break;
                j += char_len(e, j, n);
            }
            if (!single) {
                double sc = best[i].score + unk_score;
                if (sc > best[i + cl].score) best[i + cl] = (struct node){sc, (uint32_t)i, -1};
            }
        }
        i += cl;
    }
    /* backtrack into buf2 as end positions, then emit forward */
    uint32_t *ends = s->buf2;
    size_t k = 0;
    for (size_t j = n; j > 0; j = best[j].from) ends[k++] = (uint32_t)j;
    size_t start = 0;
    while (k > 0) {
        size_t end = ends[--k];
        int32_t id = best[end].id;
        if (id >= 0) {
            if ((st = toy_tok_push(out, id))) return st;
            start = end;
            continue;
        }
        /* fuse a run of unknowns */
        while (k > 0 && best[ends[k - 1]].id < 0) end = ends[--k];
        if ((st = fallback(tok, e + start, end - start, out))) return st;
        start = end;
    }
    return TOY_OK;
}
