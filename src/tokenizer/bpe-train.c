/* bpe-train.c: training a byte-level BPE vocabulary from a corpus
 * (the algorithm of Hugging Face `tokenizers`' BpeTrainer / Sennrich et al.
 * 2016 on GPT-2's byte-level alphabet).
 *
 * The corpus is pre-tokenized with the chosen pre-tokenizer (GPT-2's regex
 * by default) and the distinct words counted. Every adjacent symbol pair
 * keeps a count (over word frequencies) and the list of words it occurs in;
 * a max-heap of (count, pair) with lazy invalidation picks the next merge:
 * an entry whose count is stale is re-pushed with the current count. A merge
 * rewrites only the words that contain the pair, subtracting their old pair
 * counts and adding the new ones, so each step costs the size of the words
 * it touches, not the corpus. Ties break on the smaller (left, right) id
 * pair, which makes training deterministic.
 *
 * Ids: the special tokens first, then the 256 bytes (in byte order, written
 * in GPT-2's byte-to-unicode form), then one token per merge.
 */
#include "tokenizer-impl.h"

#include <stdio.h>
#include <stdlib.h>

struct word {
    int32_t *sym;
    int32_t n;
    int64_t count;
};

struct pair {
    int32_t a, b;
    int64_t count;
    int32_t *words; /* indices of words that held this pair (may be stale or repeated) */
    int32_t nw, capw;
};

struct hent {
    int64_t count;
    int32_t a, b; /* for the deterministic tie-break */
    int32_t pair;
};

struct trainer {
    /* distinct words: hash of byte strings -> index */
    struct word *words;
    char **wtext;
    uint32_t *wlen;
    int32_t nwords, capwords;
    uint32_t *wslots;
    uint64_t wmask;
    /* pairs: (a, b) -> index */
    struct pair *pairs;
    int32_t npairs, cappairs;
    int32_t *pslots; /* pair index + 1 */
    uint64_t pmask;
    struct hent *heap;
    size_t nheap, capheap;
    /* tokens: byte strings */
    char **tok;
    uint32_t *toklen;
    int32_t ntok;
    enum toy_status st;
};

static enum toy_status oom(void) { return toy_error(TOY_ERR_NOMEM, "bpe train: out of memory"); }

static bool grow(void **p, int32_t *cap, int32_t need, size_t elem) {
    if (need <= *cap) return true;
    int32_t c = *cap ? *cap : 1024;
    while (c < need) c *= 2;
    void *q = realloc(*p, (size_t)c * elem);
    if (!q) return false;
    *p = q;
    *cap = c;
    return true;
}

static enum toy_status rehash_words(struct trainer *T) {
    uint64_t cap = (T->wmask + 1) * 2;
    uint32_t *s = calloc(cap, sizeof *s);
    if (!s) return oom();
    for (int32_t i = 0; i < T->nwords; i++) {
        uint64_t h = tok_hash(T->wtext[i], T->wlen[i]) & (cap - 1);
        while (s[h]) h = (h + 1) & (cap - 1);
        s[h] = (uint32_t)i + 1;
    }
    free(T->wslots);
    T->wslots = s;
    T->wmask = cap - 1;
    return TOY_OK;
}

static enum toy_status count_word(void *ctx, const char *w, size_t n) {
    struct trainer *T = ctx;
    if (n == 0 || n > 1u << 20) return TOY_OK;
    uint64_t h = tok_hash(w, n) & T->wmask;
    for (;;) {
        uint32_t v = T->wslots[h];
        if (!v) break;
        if (T->wlen[v - 1] == n && !memcmp(T->wtext[v - 1], w, n)) {
            T->words[v - 1].count++;
            return TOY_OK;
        }
        h = (h + 1) & T->wmask;
    }
    if (T->nwords >= INT32_MAX / 2) return toy_error(TOY_ERR_RANGE, "bpe train: too many distinct words");
    int32_t cw = T->capwords;
    if (!grow((void **)&T->words, &cw, T->nwords + 1, sizeof *T->words)) return oom();
    cw = T->capwords;
    if (!grow((void **)&T->wtext, &cw, T->nwords + 1, sizeof *T->wtext)) return oom();
    cw = T->capwords;
    if (!grow((void **)&T->wlen, &cw, T->nwords + 1, sizeof *T->wlen)) return oom();
    T->capwords = cw;
    int32_t i = T->nwords++;
    T->wtext[i] = malloc(n);
    T->words[i] = (struct word){malloc(n * sizeof(int32_t)), (int32_t)n, 1};
    if (!T->wtext[i] || !T->words[i].sym) return oom();
    memcpy(T->wtext[i], w, n);
    T->wlen[i] = (uint32_t)n;
    T->wslots[h] = (uint32_t)i + 1;
    if ((uint64_t)T->nwords * 2 > T->wmask) return rehash_words(T);
    return TOY_OK;
}

static int32_t pair_find(struct trainer *T, int32_t a, int32_t b, bool create) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    uint64_t h = tok_pair_hash(key + 1) & T->pmask;
    for (;;) {
        int32_t v = T->pslots[h];
        if (!v) break;
        if (T->pairs[v - 1].a == a && T->pairs[v - 1].b == b) return v - 1;
        h = (h + 1) & T->pmask;
    }
    if (!create) return -1;
    if (!grow((void **)&T->pairs, &T->cappairs, T->npairs + 1, sizeof *T->pairs)) { T->st = oom(); return -1; }
    int32_t i = T->npairs++;
    T->pairs[i] = (struct pair){a, b, 0, NULL, 0, 0};
    T->pslots[h] = i + 1;
    if ((uint64_t)T->npairs * 2 > T->pmask) {
        uint64_t cap = (T->pmask + 1) * 2;
        int32_t *s = calloc(cap, sizeof *s);
        if (!s) { T->st = oom(); return -1; }
        for (int32_t k = 0; k < T->npairs; k++) {
            uint64_t kk = ((uint64_t)(uint32_t)T->pairs[k].a << 32) | (uint32_t)T->pairs[k].b;
            uint64_t g = tok_pair_hash(kk + 1) & (cap - 1);
            while (s[g]) g = (g + 1) & (cap - 1);
            s[g] = k + 1;
        }
        free(T->pslots);
        T->pslots = s;
        T->pmask = cap - 1;
    }
    return i;
}

static inline bool hent_better(const struct hent *x, const struct hent *y) {
    if (x->count != y->count) return x->count > y->count;
    if (x->a != y->a) return x->a < y->a;
    return x->b < y->b;
}

static void heap_push(struct trainer *T, int32_t p) {
    if (T->nheap == T->capheap) {
        size_t c = T->capheap ? T->capheap * 2 : 4096;
        struct hent *h = realloc(T->heap, c * sizeof *h);
        if (!h) { T->st = oom(); return; }
        T->heap = h;
        T->capheap = c;
    }
    struct hent e = {T->pairs[p].count, T->pairs[p].a, T->pairs[p].b, p};
    size_t i = T->nheap++;
    while (i > 0) {
        size_t q = (i - 1) / 2;
        if (!hent_better(&e, &T->heap[q])) break;
        T->heap[i] = T->heap[q];
        i = q;
    }
    T->heap[i] = e;
}

static struct hent heap_pop(struct trainer *T) {
    struct hent top = T->heap[0], last = T->heap[--T->nheap];
    size_t i = 0, m = T->nheap;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, s = i;
        const struct hent *best = &last;
        if (l < m && hent_better(&T->heap[l], best)) { s = l; best = &T->heap[l]; }
        if (r < m && hent_better(&T->heap[r], best)) s = r;
        if (s == i) break;
        T->heap[i] = T->heap[s];
        i = s;
    }
    if (m) T->heap[i] = last;
    return top;
}

static void pair_add(struct trainer *T, int32_t a, int32_t b, int64_t delta, int32_t w) {
    int32_t p = pair_find(T, a, b, delta > 0);
    if (p < 0) return;
    struct pair *P = &T->pairs[p];
    P->count += delta;
    if (delta > 0 && (P->nw == 0 || P->words[P->nw - 1] != w)) {
        if (!grow((void **)&P->words, &P->capw, P->nw + 1, sizeof *P->words)) { T->st = oom(); return; }
        P->words[P->nw++] = w;
    }
}

static void free_trainer(struct trainer *T) {
    for (int32_t i = 0; i < T->nwords; i++) { free(T->words[i].sym); free(T->wtext[i]); }
    free(T->words);
    free(T->wtext);
    free(T->wlen);
    free(T->wslots);
    for (int32_t i = 0; i < T->npairs; i++) free(T->pairs[i].words);
    free(T->pairs);
    free(T->pslots);
    free(T->heap);
    for (int32_t i = 0; i < T->ntok; i++) free(T->tok[i]);
    free(T->tok);
    free(T->toklen);
}

/* GPT-2 byte-level text of raw bytes (each byte one code point). */
static char *byte_level(const char *b, size_t n) {
    char *o = malloc(2 * n + 1);
    if (!o) return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += (size_t)toy_tok_utf8_encode(toy_tok_byte_to_cp[(unsigned char)b[i]], o + k);
    o[k] = 0;
    return o;
}

enum toy_status toy_tokenizer_train_bpe(const char *text, size_t len, const struct toy_bpe_train_opts *opts,
                                        struct toy_tokenizer **out) {
    if (!out) return toy_error(TOY_ERR_INVALID_ARG, "toy_tokenizer_train_bpe: out is NULL");
    *out = NULL;
    static const char *const default_special[] = {"<|endoftext|>"};
    const char *const *special = opts && opts->special_tokens ? opts->special_tokens : default_special;
    int n_special = opts && opts->special_tokens ? opts->n_special : 1;
    int64_t vocab = opts ? opts->vocab_size : 0;
    int64_t min_freq = opts && opts->min_frequency > 0 ? opts->min_frequency : 2;
    const char *pre = opts && opts->pre ? opts->pre : "gpt-2";
    if (n_special < 0 || vocab < 256 + n_special || vocab >= INT32_MAX / 2)
        return toy_error(TOY_ERR_INVALID_ARG, "bpe train: vocab_size %lld must hold the 256 bytes and %d special tokens",
                         (long long)vocab, n_special);
    int n_re;
    const char *const *res;
    if (!toy_tok_pre_regexes(pre, &n_re, &res)) return toy_error(TOY_ERR_UNSUPPORTED, "bpe train: unknown pre-tokenizer '%s'", pre);

    struct trainer T = {0};
    struct tok_scratch s = {0};
    pcre2_code *re[TOK_MAX_REGEX] = {0};
    char **merges = NULL, **texts = NULL;
    int32_t *types = NULL;
    int64_t nm = 0;
    enum toy_status st = TOY_OK;
    for (int i = 0; i < n_re; i++) {
        int err;
        PCRE2_SIZE off;
        re[i] = pcre2_compile((PCRE2_SPTR)res[i], PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &off, NULL);
        if (!re[i]) { st = toy_error(TOY_ERR_STATE, "bpe train: regex failed to compile"); goto done; }
        pcre2_jit_compile(re[i], PCRE2_JIT_COMPLETE);
    }
    T.wmask = 4095;
    T.pmask = 4095;
    T.wslots = calloc(T.wmask + 1, sizeof *T.wslots);
    T.pslots = calloc(T.pmask + 1, sizeof *T.pslots);
    T.tok = calloc((size_t)vocab, sizeof *T.tok);
    T.toklen = calloc((size_t)vocab, sizeof *T.toklen);
    if (!T.wslots || !T.pslots || !T.tok || !T.toklen) { st = oom(); goto done; }

    /* 1. words, split at the special tokens so none is learned across them */
    size_t frag = 0;
    for (size_t pos = 0; pos < len;) {
        int hit = -1;
        for (int k = 0; k < n_special && hit < 0; k++) {
            size_t l = strlen(special[k]);
            if (l && l <= len - pos && !memcmp(text + pos, special[k], l)) hit = k;
        }
        if (hit < 0) { pos++; continue; }
        if (pos > frag && (st = toy_tok_pre_split(re, n_re, &s, text + frag, pos - frag, count_word, &T))) goto done;
        pos += strlen(special[hit]);
        frag = pos;
    }
    if (len > frag && (st = toy_tok_pre_split(re, n_re, &s, text + frag, len - frag, count_word, &T))) goto done;

    /* 2. the alphabet: specials, then bytes */
    for (int k = 0; k < n_special; k++) {
        if (!(T.tok[T.ntok] = strdup(special[k]))) { st = oom(); goto done; }
        T.toklen[T.ntok++] = (uint32_t)strlen(special[k]);
    }
    int32_t byte0 = T.ntok;
    for (int b = 0; b < 256; b++) {
        if (!(T.tok[T.ntok] = malloc(1))) { st = oom(); goto done; }
        T.tok[T.ntok][0] = (char)b;
        T.toklen[T.ntok++] = 1;
    }
    for (int32_t w = 0; w < T.nwords; w++) {
        struct word *W = &T.words[w];
        for (int32_t i = 0; i < W->n; i++) W->sym[i] = byte0 + (unsigned char)T.wtext[w][i];
        for (int32_t i = 0; i + 1 < W->n; i++) pair_add(&T, W->sym[i], W->sym[i + 1], W->count, w);
    }
    if ((st = T.st)) goto done;
    for (int32_t p = 0; p < T.npairs; p++) heap_push(&T, p);

    /* 3. merges */
    merges = calloc((size_t)vocab, sizeof *merges);
    if (!merges) { st = oom(); goto done; }
    while (T.ntok < vocab && T.nheap && !T.st) {
        struct hent e = heap_pop(&T);
        struct pair *P = &T.pairs[e.pair];
        if (P->count != e.count) { /* stale: requeue with the current count */
            if (P->count > 0) heap_push(&T, e.pair);
            continue;
        }
        if (P->count < min_freq) break;
        int32_t a = P->a, b = P->b, id = T.ntok;
        size_t la = T.toklen[a], lb = T.toklen[b];
        if (!(T.tok[id] = malloc(la + lb))) { st = oom(); goto done; }
        memcpy(T.tok[id], T.tok[a], la);
        memcpy(T.tok[id] + la, T.tok[b], lb);
        T.toklen[id] = (uint32_t)(la + lb);
        T.ntok++;
        char *ta = byte_level(T.tok[a], la), *tb = byte_level(T.tok[b], lb);
        if (!ta || !tb) { free(ta); free(tb); st = oom(); goto done; }
        size_t na = strlen(ta), nb = strlen(tb);
        merges[nm] = malloc(na + nb + 2);
        if (!merges[nm]) { free(ta); free(tb); st = oom(); goto done; }
        memcpy(merges[nm], ta, na);
        merges[nm][na] = ' ';
        memcpy(merges[nm] + na + 1, tb, nb + 1);
        nm++;
        free(ta);
        free(tb);
        /* rewrite the words holding (a, b); the list is copied since pair_add may grow it */
        int32_t nw = P->nw;
        int32_t *ws = malloc((size_t)(nw ? nw : 1) * sizeof *ws);
        if (!ws) { st = oom(); goto done; }
        memcpy(ws, P->words, (size_t)nw * sizeof *ws);
        for (int32_t k = 0; k < nw && !T.st; k++) {
            struct word *W = &T.words[ws[k]];
            bool has = false;
            for (int32_t i = 0; i + 1 < W->n && !has; i++) has = W->sym[i] == a && W->sym[i + 1] == b;
            if (!has) continue;
            for (int32_t i = 0; i + 1 < W->n; i++) pair_add(&T, W->sym[i], W->sym[i + 1], -W->count, ws[k]);
            int32_t o = 0;
            for (int32_t i = 0; i < W->n; i++) {
                if (i + 1 < W->n && W->sym[i] == a && W->sym[i + 1] == b) { W->sym[o++] = id; i++; }
                else W->sym[o++] = W->sym[i];
            }
            W->n = o;
            for (int32_t i = 0; i + 1 < W->n; i++) {
                pair_add(&T, W->sym[i], W->sym[i + 1], W->count, ws[k]);
            }
        }
        /* only pairs with the new token can have grown: queue them */
        for (int32_t k = 0; k < nw && !T.st; k++) {
            struct word *W = &T.words[ws[k]];
            for (int32_t i = 0; i + 1 < W->n; i++) {
                if (W->sym[i] != id && W->sym[i + 1] != id) continue;
                int32_t p = pair_find(&T, W->sym[i], W->sym[i + 1], false);
                if (p >= 0 && T.pairs[p].count > 0) heap_push(&T, p);
            }
        }
        free(ws);
    }
    if ((st = T.st)) goto done;

    /* 4. the tokenizer */
    texts = calloc((size_t)T.ntok, sizeof *texts);
    types = calloc((size_t)T.ntok, sizeof *types);
    if (!texts || !types) { st = oom(); goto done; }
    for (int32_t i = 0; i < T.ntok; i++) {
        texts[i] = i < n_special ? strdup(T.tok[i]) : byte_level(T.tok[i], T.toklen[i]);
        if (!texts[i]) { st = oom(); goto done; }
        types[i] = i < n_special ? TOY_TOKEN_CONTROL : TOY_TOKEN_NORMAL;
    }
    struct toy_tokenizer_spec spec = {
        .kind = TOY_TOKENIZER_BPE,
        .n_tokens = T.ntok,
        .tokens = (const char *const *)texts,
        .types = types,
        .n_merges = nm,
        .merges = (const char *const *)merges,
        .pre = pre,
        .bos = n_special > 0 ? 0 : -1, /* the first special token; the second is EOS (<s>, </s>), one is both */
        .eos = n_special > 1 ? 1 : n_special > 0 ? 0 : -1,
        .unk = -1,
        .pad = -1,
        .eot = -1,
    };
    st = toy_tokenizer_init(&spec, out);
done:
    for (int i = 0; i < n_re; i++) pcre2_code_free(re[i]);
    if (texts) for (int32_t i = 0; i < T.ntok; i++) free(texts[i]);
    free(texts);
    free(types);
    if (merges) for (int64_t i = 0; i < nm; i++) free(merges[i]);
    free(merges);
    free(s.buf);
    free(s.buf2);
    free(s.buf3);
    if (s.md) pcre2_match_data_free(s.md);
    if (s.jit) pcre2_jit_stack_free(s.jit);
    if (s.mctx) pcre2_match_context_free(s.mctx);
    free_trainer(&T);
    return st;
}
