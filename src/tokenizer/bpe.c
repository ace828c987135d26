/* bpe.c: byte-level BPE (GPT-2 family): the pre-tokenizer regexes of each
 * model family (PCRE2 with JIT), and merging by rank with a binary heap.
 *
 * Semantics (Hugging Face `tokenizers` models/bpe, identical to llama.cpp's
 * llm_tokenizer_bpe): the text is split by the pre-tokenizer's regexes in
 * sequence, keeping both the matches and the text between them ("Isolated");
 * each piece starts as one symbol per byte and the adjacent pair with the
 * lowest merge rank is merged, leftmost first on ties, until no pair has a
 * rank. With ignore_merges (Llama-3) a piece that is a token is emitted whole.
 * Regexes are those of llama.cpp's llama-vocab.cpp per tokenizer.ggml.pre
 * name, which equal the Split/ByteLevel regexes of the models' tokenizer.json.
 *
 * The vocabulary is indexed by raw bytes (the byte->unicode mapping of GPT-2
 * is undone once at load), so encoding never builds strings: symbols are ids
 * and a merge is a lookup in a (left id, right id) hash map.
 */
#include "tokenizer-impl.h"

#include <stdio.h>
#include <stdlib.h>

/* GPT-2's bytes_to_unicode(): printable bytes map to themselves, the other
 * 68 to U+0100.. in byte order. */
const uint16_t toy_tok_byte_to_cp[256] = {
    256, 257, 258, 259, 260, 261, 262, 263, 264, 265, 266, 267, 268, 269, 270, 271,
    272, 273, 274, 275, 276, 277, 278, 279, 280, 281, 282, 283, 284, 285, 286, 287,
    288, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47,
    48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63,
    64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79,
    80, 81, 82, 83, 84, 85, 86, 87, 88, 89, 90, 91, 92, 93, 94, 95,
    96, 97, 98, 99, 100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111,
    112, 113, 114, 115, 116, 117, 118, 119, 120, 121, 122, 123, 124, 125, 126, 289,
    290, 291, 292, 293, 294, 295, 296, 297, 298, 299, 300, 301, 302, 303, 304, 305,
    306, 307, 308, 309, 310, 311, 312, 313, 314, 315, 316, 317, 318, 319, 320, 321,
    322, 161, 162, 163, 164, 165, 166, 167, 168, 169, 170, 171, 172, 323, 174, 175,
    176, 177, 178, 179, 180, 181, 182, 183, 184, 185, 186, 187, 188, 189, 190, 191,
    192, 193, 194, 195, 196, 197, 198, 199, 200, 201, 202, 203, 204, 205, 206, 207,
    208, 209, 210, 211, 212, 213, 214, 215, 216, 217, 218, 219, 220, 221, 222, 223,
    224, 225, 226, 227, 228, 229, 230, 231, 232, 233, 234, 235, 236, 237, 238, 239,
    240, 241, 242, 243, 244, 245, 246, 247, 248, 249, 250, 251, 252, 253, 254, 255,
};

int toy_tok_cp_to_byte(uint32_t cp) {
    if ((cp >= 33 && cp <= 126) || (cp >= 161 && cp <= 172) || (cp >= 174 && cp <= 255)) return (int)cp;
    /* U+0100.. stand for the other bytes in order: 0..32, 127..160, 173 */
    if (cp >= 256 && cp < 256 + 33) return (int)cp - 256;
    if (cp >= 256 + 33 && cp < 256 + 67) return 127 + (int)cp - (256 + 33);
    if (cp == 256 + 67) return 173;
    return -1;
}

/* ---- pre-tokenizers ---- */

#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
#define RE_LLAMA3                                                                                       \
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}" \
    "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_QWEN2                                                                                        \
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}"      \
    "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

static const struct {
    const char *names; /* space-separated GGUF tokenizer.ggml.pre names */
    int n;
    const char *re[TOK_MAX_REGEX];
} pretoks[] = {
    {"none", 0, {NULL}}, /* no splitting: the whole text is one word */
    {"gpt-2 gpt2 mpt olmo phi-2 roberta-bpe jina-es jina-de poro jais trillion", 1, {RE_GPT2}},
    /* llama.cpp's LLAMA_VOCAB_PRE_TYPE_DEFAULT (a GGUF without tokenizer.ggml.pre, e.g. GPT-NeoX) */
    {"default", 4, {"[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2, "\\p{N}+", "[0-9][0-9][0-9]"}},
    {"llama-bpe llama3 llama-v3 falcon3 pixtral dbrx smaug-bpe", 1, {RE_LLAMA3}},
    {"qwen2 qwen3 deepseek-r1-qwen stablelm2 hunyuan", 1, {RE_QWEN2}},
    {"qwen35", 1, {"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}"
                   "| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}},
    /* o200k (GPT-4o), the tokenizer.json regex as is: PCRE2 has the classes and (?i:) */
    {"gpt-4o minimax-m2", 1, {"[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"
                              "(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+"
                              "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*"
                              "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}},
    {"smollm smollm2 starcoder refact command-r codeshell exaone minerva", 2, {"\\p{N}", RE_GPT2}},
    /* Mistral's Tekken (Nemo, Small 3, Ministral, Devstral): o200k's case-aware words without its contractions,
     * single digits; the tokenizer.json regex as is */
    {"tekken", 1, {"[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"
                   "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*"
                   "|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}},
    /* DeepSeek LLM (V2, V2-Lite) and Coder: newlines alone, letters of the cased scripts with a space before,
     * ASCII and full-width punctuation, trailing spaces, CJK runs, digits (llama.cpp's regexes; its character
     * ranges as code points) */
    {"deepseek-llm", 6, {"[\\r\\n]",
                         "\\s?[A-Za-z\\x{b5}\\x{c0}-\\x{d6}\\x{d8}-\\x{f6}\\x{f8}-\\x{1ba}\\x{1bc}-\\x{1bf}\\x{1c4}-\\x{293}"
                         "\\x{295}-\\x{2af}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37b}-\\x{37d}\\x{37f}\\x{386}\\x{388}-"
                         "\\x{38a}\\x{38c}\\x{38e}-\\x{3a1}\\x{3a3}-\\x{3f5}\\x{3f7}-\\x{481}\\x{48a}-\\x{52f}\\x{531}-"
                         "\\x{556}\\x{10a0}-\\x{10c5}\\x{13a0}-\\x{13f5}\\x{13f8}-\\x{13fd}\\x{1c90}-\\x{1cba}\\x{1cbd}-"
                         "\\x{1cbf}\\x{1d00}-\\x{1d2b}\\x{1d6b}-\\x{1d77}\\x{1d79}-\\x{1d9a}\\x{1e00}-\\x{1f15}\\x{1f18}-"
                         "\\x{1f1d}\\x{1f20}-\\x{1f45}\\x{1f48}-\\x{1f4d}\\x{1f50}-\\x{1f57}\\x{1f59}\\x{1f5b}\\x{1f5d}"
                         "\\x{1f5f}-\\x{1f7d}\\x{1f80}-\\x{1fb4}\\x{1fb6}-\\x{1fbc}\\x{1fbe}\\x{1fc2}-\\x{1fc4}\\x{1fc6}-"
                         "\\x{1fcc}\\x{1fd0}-\\x{1fd3}\\x{1fd6}-\\x{1fdb}\\x{1fe0}-\\x{1fec}\\x{1ff2}-\\x{1ff4}\\x{1ff6}-"
                         "\\x{1ffc}\\x{2102}\\x{2107}\\x{210a}-\\x{2113}\\x{2115}\\x{2119}-\\x{211d}\\x{2124}\\x{2126}"
                         "\\x{2128}\\x{212a}-\\x{212d}\\x{212f}-\\x{2134}\\x{2139}\\x{213c}-\\x{213f}\\x{2145}-\\x{2149}"
                         "\\x{214e}\\x{2183}\\x{2184}\\x{2c00}-\\x{2c7b}\\x{2c7e}-\\x{2ce4}\\x{2ceb}-\\x{2cee}\\x{2cf2}"
                         "\\x{2cf3}\\x{a640}-\\x{a66d}\\x{a680}-\\x{a69b}\\x{a722}-\\x{a76f}\\x{a771}-\\x{a787}\\x{a78b}-"
                         "\\x{a78e}\\x{ab70}-\\x{abbf}\\x{fb00}-\\x{fb06}\\x{fb13}-\\x{fb17}\\x{ff21}-\\x{ff3a}\\x{ff41}-"
                         "\\x{ff5a}\\x{10400}-\\x{1044f}\\x{104b0}-\\x{104d3}\\x{104d8}-\\x{104fb}\\x{10c80}-\\x{10cb2}"
                         "\\x{10cc0}-\\x{10cf2}\\x{118a0}-\\x{118df}\\x{1e900}-\\x{1e943}]+",
                         "\\s?[!-/:-~\\x{ff01}-\\x{ff0f}\\x{ff1a}-\\x{ff5e}\\x{2018}-\\x{201f}\\x{3000}-\\x{3002}]+",
                         "\\s+$", "[\\x{4e00}-\\x{9fa5}\\x{800}-\\x{4e00}\\x{ac00}-\\x{d7ff}]+", "\\p{N}+"}},
    {"deepseek-coder", 5, {"[\\r\\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", "[\\x{4e00}-\\x{9fa5}\\x{800}-\\x{4e00}\\x{ac00}-\\x{d7ff}]+", "\\p{N}"}},
    /* DeepSeek-V3 (and R1, Moonlight's are tiktoken's): up to 3 digits, CJK and kana runs, then words */
    {"deepseek-v3", 3, {"\\p{N}{1,3}", "[\\x{4e00}-\\x{9fa5}\\x{3040}-\\x{309f}\\x{30a0}-\\x{30ff}]+",
                        "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]"
                        "+| ?[\\p{P}\\p{S}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}},
};

bool toy_tok_pre_regexes(const char *name, int *n, const char *const **re);

static bool name_in(const char *names, const char *name) {
    size_t n = strlen(name);
    for (const char *p = names; *p;) {
        const char *e = strchr(p, ' ');
        size_t l = e ? (size_t)(e - p) : strlen(p);
        if (l == n && !memcmp(p, name, n)) return true;
        if (!e) break;
        p = e + 1;
    }
    return false;
}

enum toy_status toy_tok_compile_re(struct toy_tokenizer *tok, const char *re) {
    if (tok->n_regex >= TOK_MAX_REGEX) return toy_error(TOY_ERR_UNSUPPORTED, "tokenizer: more than %d pre-tokenizer regexes", TOK_MAX_REGEX);
    int err;
    PCRE2_SIZE off;
    pcre2_code *code = pcre2_compile((PCRE2_SPTR)re, PCRE2_ZERO_TERMINATED,
                                     PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &off, NULL);
    if (!code) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return toy_error(TOY_ERR_FORMAT, "tokenizer: pre-tokenizer regex /%s/ at %zu: %s", re, (size_t)off, (char *)msg);
    }
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE); /* falls back to the interpreter if JIT is unavailable */
    if (!(tok->re_src[tok->n_regex] = strdup(re))) { pcre2_code_free(code); return toy_error(TOY_ERR_NOMEM, "tokenizer: out of memory"); }
    tok->re[tok->n_regex++] = code;
    return TOY_OK;
}

bool toy_tok_pre_regexes(const char *name, int *n, const char *const **re) {
    for (size_t i = 0; i < sizeof pretoks / sizeof pretoks[0]; i++)
        if (name_in(pretoks[i].names, name)) {
            *n = pretoks[i].n;
            *re = pretoks[i].re;
            return true;
        }
    return false;
}

void toy_tok_bpe_free(struct toy_tokenizer *tok) {
    for (int i = 0; i < tok->n_regex; i++) {
        pcre2_code_free(tok->re[i]);
        free(tok->re_src[i]);
    }
    tok->n_regex = 0;
    if (tok->merges) for (int64_t i = 0; i < tok->n_merges; i++) free(tok->merges[i]);
    free(tok->merges);
    tok->merges = NULL;
    free(tok->pairs.slots);
    tok->pairs.slots = NULL;
}

enum toy_status toy_tok_bpe_setup(struct toy_tokenizer *tok, const struct toy_tokenizer_spec *spec) {
    enum toy_status st;
    if (spec->n_pre_regex > 0) {
        if (!spec->pre_regex) return toy_error(TOY_ERR_INVALID_ARG, "tokenizer: n_pre_regex without pre_regex");
        for (int i = 0; i < spec->n_pre_regex; i++)
            if ((st = toy_tok_compile_re(tok, spec->pre_regex[i]))) return st;
        tok->pre = strdup(spec->pre ? spec->pre : "custom");
    } else {
        const char *name = spec->pre ? spec->pre : "default";
        int k = -1;
        for (size_t i = 0; i < sizeof pretoks / sizeof pretoks[0]; i++)
            if (name_in(pretoks[i].names, name)) k = (int)i;
        if (k < 0) return toy_error(TOY_ERR_UNSUPPORTED, "tokenizer: unknown pre-tokenizer '%s'", name);
        for (int i = 0; i < pretoks[k].n; i++)
            if ((st = toy_tok_compile_re(tok, pretoks[k].re[i]))) return st;
        tok->pre = strdup(name);
    }
    if (!tok->pre) return toy_error(TOY_ERR_NOMEM, "tokenizer: out of memory");
    if (!spec->merges && spec->n_tokens > 256 + 64)
        return toy_error(TOY_ERR_FORMAT, "tokenizer: byte-level BPE vocabulary of %lld tokens has no merges",
                         (long long)spec->n_tokens);
    return toy_tok_merges_setup(tok, spec);
}

enum toy_status toy_tok_merges_setup(struct toy_tokenizer *tok, const struct toy_tokenizer_spec *spec) {
    enum toy_status st;
    int64_t nm = spec->merges ? spec->n_merges : 0;
    if (nm < 0 || nm >= INT32_MAX) return toy_error(TOY_ERR_FORMAT, "tokenizer: %lld merges", (long long)nm);
    uint64_t cap = 16;
    while (cap < (uint64_t)nm * 2) cap *= 2;
    tok->pairs.slots = calloc(cap, sizeof *tok->pairs.slots);
    tok->merges = calloc(nm ? (size_t)nm : 1, sizeof *tok->merges);
    if (!tok->pairs.slots || !tok->merges) return toy_error(TOY_ERR_NOMEM, "tokenizer: out of memory (%lld merges)", (long long)nm);
    tok->pairs.mask = cap - 1;
    char *cat = NULL;
    size_t cat_cap = 0;
    for (int64_t r = 0; r < nm; r++) {
        const char *m = spec->merges[r];
        if (!m) { st = toy_error(TOY_ERR_FORMAT, "tokenizer: merge %lld is missing", (long long)r); goto out; }
        size_t len = strlen(m);
        if (!(tok->merges[r] = strdup(m))) { st = toy_error(TOY_ERR_NOMEM, "tokenizer: out of memory"); goto out; }
        tok->n_merges = r + 1;
        int32_t a = -1, b = -1;
        for (const char *sp = strchr(m, ' '); sp; sp = strchr(sp + 1, ' ')) {
            a = tok_strmap_get(&tok->text_map, m, (size_t)(sp - m));
            b = a >= 0 ? tok_strmap_get(&tok->text_map, sp + 1, len - (size_t)(sp - m) - 1) : -1;
            if (a >= 0 && b >= 0) break;
        }
        if (a < 0 || b < 0) {
            st = toy_error(TOY_ERR_FORMAT, "tokenizer: merge %lld '%s' names a token that is not in the vocabulary",
                           (long long)r, m);
            goto out;
        }
        size_t la = tok->text_len[a], lb = tok->text_len[b];
        void *p = cat;
        if ((st = toy_tok_reserve(&p, &cat_cap, la + lb))) goto out;
        cat = p;
        memcpy(cat, tok->text[a], la);
        memcpy(cat + la, tok->text[b], lb);
        int32_t ab = tok_strmap_get(&tok->text_map, cat, la + lb);
        if (ab < 0) {
            st = toy_error(TOY_ERR_FORMAT, "tokenizer: merge %lld '%s': the merged token '%.*s' is not in the vocabulary",
                           (long long)r, m, (int)(la + lb), cat);
            goto out;
        }
        uint64_t key = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
        uint64_t i = tok_pair_hash(key) & tok->pairs.mask;
        while (tok->pairs.slots[i].key && tok->pairs.slots[i].key != key) i = (i + 1) & tok->pairs.mask;
        if (!tok->pairs.slots[i].key) /* a repeated merge keeps its first rank */
            tok->pairs.slots[i] = (struct tok_pair){key, (int32_t)r, ab};
    }
    st = TOY_OK;
out:
    free(cat);
    return st;
}

/* ---- merging ---- */

struct sym {
    int32_t id, prev, next;
};
struct cand {
    int32_t rank, pos, lid, rid;
};

static inline bool cand_less(const struct cand *x, const struct cand *y) {
    return x->rank < y->rank || (x->rank == y->rank && x->pos < y->pos);
}

static void heap_push(struct cand *h, size_t *n, struct cand c) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!cand_less(&c, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = c;
}

static struct cand heap_pop(struct cand *h, size_t *n) {
    struct cand top = h[0], last = h[--*n];
    size_t i = 0, m = *n;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, s = i;
        const struct cand *best = &last;
        if (l < m && cand_less(&h[l], best)) { s = l; best = &h[l]; }
        if (r < m && cand_less(&h[r], best)) s = r;
        if (s == i) break;
        h[i] = h[s];
        i = s;
    }
    if (m) h[i] = last;
    return top;
}

static inline void try_pair(const struct toy_tokenizer *tok, const struct sym *sy, int32_t i, struct cand *h,
                            size_t *nh) {
    int32_t j = sy[i].next;
    if (j < 0 || sy[i].id < 0 || sy[j].id < 0) return;
    const struct tok_pair *p = tok_pairmap_get(&tok->pairs, sy[i].id, sy[j].id);
    if (p) heap_push(h, nh, (struct cand){p->rank, i, sy[i].id, sy[j].id});
}

/* Merges the symbols in s->buf (sy[0..n), linked) by rank and appends the
 * resulting ids; a symbol id < 0 (a byte or character without a token)
 * becomes <unk>, or nothing when there is none. */
static enum toy_status merge_syms(const struct toy_tokenizer *tok, struct tok_scratch *s, size_t n,
                                  struct toy_tokens *out) {
    enum toy_status st;
    if ((st = toy_tok_reserve(&s->buf2, &s->cap2, 3 * n * sizeof(struct cand)))) return st;
    struct sym *sy = s->buf;
    struct cand *h = s->buf2;
    size_t nh = 0;
    for (size_t i = 0; i + 1 < n; i++) try_pair(tok, sy, (int32_t)i, h, &nh);
    while (nh) {
        struct cand c = heap_pop(h, &nh);
        struct sym *l = &sy[c.pos];
        if (l->id != c.lid || l->next < 0 || sy[l->next].id != c.rid) continue; /* stale */
        struct sym *r = &sy[l->next];
        l->id = tok_pairmap_get(&tok->pairs, c.lid, c.rid)->id;
        l->next = r->next;
        if (r->next >= 0) sy[r->next].prev = c.pos;
        r->id = -2;
        r->next = -1;
        if (l->prev >= 0) try_pair(tok, sy, l->prev, h, &nh);
        try_pair(tok, sy, c.pos, h, &nh);
    }
    for (int32_t i = n ? 0 : -1; i >= 0; i = sy[i].next) {
        int32_t id = sy[i].id;
        if (id < 0) id = tok->unk;
        if (id >= 0 && (st = toy_tok_push(out, id))) return st;
    }
    return TOY_OK;
}

enum toy_status toy_tok_merge_ids(const struct toy_tokenizer *tok, struct tok_scratch *s, const int32_t *ids, size_t n,
                                  struct toy_tokens *out) {
    enum toy_status st;
    if ((st = toy_tok_reserve(&s->buf, &s->cap, (n ? n : 1) * sizeof(struct sym)))) return st;
    struct sym *sy = s->buf;
    for (size_t i = 0; i < n; i++) sy[i] = (struct sym){ids[i], (int32_t)i - 1, i + 1 < n ? (int32_t)i + 1 : -1};
    return merge_syms(tok, s, n, out);
}

static enum toy_status bpe_word(const struct toy_tokenizer *tok, struct tok_scratch *s, const unsigned char *w,
                                size_t n, struct toy_tokens *out) {
    enum toy_status st;
    if (n == 1 && tok->byte_tok[w[0]] >= 0) return toy_tok_push(out, tok->byte_tok[w[0]]);
    if (tok->ignore_merges) {
        int32_t id = tok_strmap_get(&tok->bytes_map, (const char *)w, n);
        if (id >= 0) return toy_tok_push(out, id);
    }
    if ((st = toy_tok_reserve(&s->buf, &s->cap, n * sizeof(struct sym)))) return st;
    struct sym *sy = s->buf;
    for (size_t i = 0; i < n; i++) sy[i] = (struct sym){tok->byte_tok[w[i]], (int32_t)i - 1, i + 1 < n ? (int32_t)i + 1 : -1};
    return merge_syms(tok, s, n, out);
}

/* Splits text[0..len) with re[level] and recurses into each piece; the
 * pieces of the last level go to `word`. */
static enum toy_status split(pcre2_code *const *re, int n_re, struct tok_scratch *s, int level, const char *text,
                             size_t len, tok_word_fn word, void *ctx) {
    if (level == n_re) return word(ctx, text, len);
    enum toy_status st;
    size_t pos = 0, prev = 0;
    while (pos < len) {
        int rc = pcre2_match(re[level], (PCRE2_SPTR)text, len, pos, PCRE2_NO_UTF_CHECK, s->md, s->mctx);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[128];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return toy_error(TOY_ERR_STATE, "tokenizer: pre-tokenizer regex failed at byte %zu: %s", pos, (char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(s->md);
        size_t ms = ov[0], me = ov[1];
        if (me == ms) { /* an empty match: step over one character */
            pos = ms + (size_t)tok_utf8_len((unsigned char)text[ms]);
            if (pos > len) pos = len;
            continue;
        }
        if (ms > prev && (st = split(re, n_re, s, level + 1, text + prev, ms - prev, word, ctx))) return st;
        if ((st = split(re, n_re, s, level + 1, text + ms, me - ms, word, ctx))) return st;
        prev = pos = me;
    }
    if (len > prev && (st = split(re, n_re, s, level + 1, text + prev, len - prev, word, ctx))) return st;
    return TOY_OK;
}

enum toy_status toy_tok_pre_split(pcre2_code *const *re, int n_re, struct tok_scratch *s, const char *text, size_t len,
                                  tok_word_fn word, void *ctx) {
    if (n_re && !s->md) {
        s->md = pcre2_match_data_create(1, NULL);
        s->mctx = pcre2_match_context_create(NULL);
        s->jit = pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, NULL);
        if (!s->md || !s->mctx || !s->jit) return toy_error(TOY_ERR_NOMEM, "tokenizer: out of memory (regex)");
        pcre2_jit_stack_assign(s->mctx, NULL, s->jit);
    }
    return split(re, n_re, s, 0, text, len, word, ctx);
}

struct encode_ctx {
    const struct toy_tokenizer *tok;
    struct tok_scratch *s;
    struct toy_tokens *out;
};

static enum toy_status encode_word(void *ctx, const char *w, size_t n) {
    struct encode_ctx *e = ctx;
    if (n > 1 && toy_tok_cache_get(&e->s->cache, w, n, e->out)) return TOY_OK;
    int64_t before = e->out->n;
    enum toy_status st = bpe_word(e->tok, e->s, (const unsigned char *)w, n, e->out);
    if (!st && n > 1 && e->out->n > before) toy_tok_cache_put(&e->s->cache, w, n, e->out->ids + before, e->out->n - before);
    return st;
}

enum toy_status toy_tok_bpe_encode(const struct toy_tokenizer *tok, struct tok_scratch *s, const char *text,
                                   size_t len, struct toy_tokens *out) {
    struct encode_ctx e = {tok, s, out};
    return toy_tok_pre_split(tok->re, tok->n_regex, s, text, len, encode_word, &e);
}
