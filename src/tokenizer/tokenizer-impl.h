/* tokenizer-impl.h: the private layout of struct toy_tokenizer, shared by
 * tokenizer.c (vocabulary, special tokens, decode), bpe.c (byte-level BPE),
 * spm.c (SentencePiece BPE and Unigram), wpm.c (WordPiece) and the loaders.
 *
 * Invariants: every id in [0, n_vocab); text[i] is the stored piece, bytes[i]
 * the raw bytes it decodes to; the hash maps index these pools and never own
 * memory of their own besides their slot arrays.
 */
#ifndef TOY_TOKENIZER_IMPL_H
#define TOY_TOKENIZER_IMPL_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "toy/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

/* String -> id open-addressing map over (ptr, len) keys owned elsewhere. */
struct tok_strmap {
    uint32_t *slots; /* id + 1; 0 = empty */
    uint64_t mask;
    const char *const *keys; /* keys[id] */
    const uint32_t *lens;    /* lens[id] */
};

static inline uint64_t tok_hash(const void *p, size_t n) {
    /* FNV-1a on 8-byte words with a final mix: short keys dominate. */
    const unsigned char *s = p;
    uint64_t h = 0xcbf29ce484222325ull ^ (n * 0x9e3779b97f4a7c15ull);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ w) * 0x100000001b3ull;
        h ^= h >> 29;
        s += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, s, n);
    h = (h ^ w) * 0x9e3779b97f4a7c15ull;
    return h ^ (h >> 32);
}

static inline int32_t tok_strmap_get(const struct tok_strmap *m, const char *s, size_t n) {
    if (!m->slots) return -1;
    uint64_t i = tok_hash(s, n) & m->mask;
    for (;;) {
        uint32_t v = m->slots[i];
        if (!v) return -1;
        uint32_t id = v - 1;
        if (m->lens[id] == n && memcmp(m->keys[id], s, n) == 0) return (int32_t)id;
        i = (i + 1) & m->mask;
    }
}

/* (left id, right id) -> (rank, merged id). */
struct tok_pair {
    uint64_t key; /* (left << 32 | right) + 1; 0 = empty */
    int32_t rank, id;
};
struct tok_pairmap {
    struct tok_pair *slots;
    uint64_t mask;
};

static inline uint64_t tok_pair_hash(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    return k;
}

static inline const struct tok_pair *tok_pairmap_get(const struct tok_pairmap *m, int32_t a, int32_t b) {
    uint64_t key = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
    uint64_t i = tok_pair_hash(key) & m->mask;
    for (;;) {
        const struct tok_pair *p = &m->slots[i];
        if (p->key == key) return p;
        if (!p->key) return NULL;
        i = (i + 1) & m->mask;
    }
}

#define TOK_MAX_REGEX 6 /* deepseek-llm's */
#define TOK_MAX_EOG 32

struct toy_tokenizer {
    enum toy_tokenizer_kind kind;
    int32_t n_vocab;
    char **text;      /* [n_vocab] stored piece, NUL-terminated */
    uint32_t *text_len;
    char **bytes;     /* [n_vocab] decoded bytes (may alias text) */
    uint32_t *bytes_len;
    float *scores;
    int32_t *types;
    uint8_t *attrs; /* TOY_TOKEN_ATTR_* per token, or NULL */
    struct tok_strmap text_map;  /* stored piece -> id */
    struct tok_strmap bytes_map; /* BPE: raw bytes -> id (normal tokens) */

    /* BPE */
    int64_t n_merges;
    char **merges;
    struct tok_pairmap pairs;
    int32_t byte_tok[256]; /* BPE: token of a single byte; SPM/UGM: <0xHH>; -1 if none */
    int n_regex;
    pcre2_code *re[TOK_MAX_REGEX];
    char *re_src[TOK_MAX_REGEX];
    char *pre;
    bool ignore_merges, nfc;

    /* SPM / UGM */
    bool add_space_prefix;
    bool prefix_every_fragment; /* HF Prepend normalizer: each text fragment gets the dummy prefix */
    bool spm_ranked;     /* SPM pieces merge by merge rank (a tokenizer.json BPE with byte_fallback) */
    bool spm_word_split; /* no piece has U+2581 after another character: words merge independently */
    uint32_t max_piece_len; /* WPM: over every token, CONTROL ones too (llama.cpp looks them all up) */
    float min_score;

    /* WPM: BertNormalizer's lowercase and strip_accents (resolved), HF's max_input_chars_per_word */
    bool wpm_lower, wpm_strip;
    int32_t wpm_max_chars;

    /* specials matched in text, sorted by length, longest first */
    int32_t *special;
    int n_special;
    uint8_t special_first[256]; /* byte can start a special token */

    int32_t bos, eos, unk, pad, eot;
    int32_t eog[TOK_MAX_EOG]; /* the tokens that end generation (toy_tok_eog_setup) */
    int n_eog;
    /* the ids a GGUF named for end of message and the fill-in-the-middle
     * pad, repo and file separator (tokenizer-gguf.c, eog_keys), -1 where
     * it named none: written back when the tokenizer is saved */
    int32_t named_eog[4];
    bool add_bos, add_eos;
    char *chat_template;
};

/* Word -> ids memo for one encode call: long texts repeat their words, and
 * a hit skips the merge loop. Bounded (TOK_CACHE_MAX entries of at most
 * TOK_CACHE_WORD bytes); lives in the scratch, so encode stays reentrant. */
#define TOK_CACHE_MAX (1u << 16)
#define TOK_CACHE_WORD 48
struct tok_cache_ent {
    uint64_t h;
    uint32_t woff, wlen, ioff, nids;
};
struct tok_cache {
    struct tok_cache_ent *tab;
    uint32_t mask, count;
    char *bytes;
    size_t nb, cb;
    int32_t *ids;
    size_t ni, ci;
};
/* Appends the cached ids of w to out; false on a miss. */
bool toy_tok_cache_get(struct tok_cache *c, const char *w, size_t n, struct toy_tokens *out);
void toy_tok_cache_put(struct tok_cache *c, const char *w, size_t n, const int32_t *ids, int64_t k);
void toy_tok_cache_free(struct tok_cache *c);

/* Per-call scratch shared by the algorithms (never stored in the tokenizer:
 * encode runs concurrently). */
struct tok_scratch {
    struct tok_cache cache;
    void *buf;
    size_t cap;
    void *buf2;
    size_t cap2;
    void *buf3;
    size_t cap3;
    void *buf4;
    size_t cap4;
    pcre2_match_data *md;
    pcre2_jit_stack *jit;
    pcre2_match_context *mctx;
};

enum toy_status toy_tok_push(struct toy_tokens *out, int32_t id);
enum toy_status toy_tok_reserve(void **buf, size_t *cap, size_t need);

/* bpe.c */
enum toy_status toy_tok_bpe_setup(struct toy_tokenizer *tok, const struct toy_tokenizer_spec *spec);
enum toy_status toy_tok_bpe_encode(const struct toy_tokenizer *tok, struct tok_scratch *s, const char *text,
                                   size_t len, struct toy_tokens *out);
void toy_tok_bpe_free(struct toy_tokenizer *tok);
/* The (left, right) -> merged pair map from spec->merges (rank = index). */
enum toy_status toy_tok_merges_setup(struct toy_tokenizer *tok, const struct toy_tokenizer_spec *spec);
/* Rank-merges a sequence of ids (ids < 0 become <unk>) and appends the result. */
enum toy_status toy_tok_merge_ids(const struct toy_tokenizer *tok, struct tok_scratch *s, const int32_t *ids, size_t n,
                                  struct toy_tokens *out);
/* Pre-tokenization: calls word() for each piece of text split by the
 * regexes in sequence (matches and the gaps between them). */
typedef enum toy_status (*tok_word_fn)(void *ctx, const char *w, size_t n);
enum toy_status toy_tok_pre_split(pcre2_code *const *re, int n_re, struct tok_scratch *s, const char *text, size_t len,
                                  tok_word_fn word, void *ctx);
enum toy_status toy_tok_compile_re(struct toy_tokenizer *tok, const char *re);
/* The regexes of a tokenizer.ggml.pre name; false if unknown. */
bool toy_tok_pre_regexes(const char *name, int *n, const char *const **re);
/* Whether a token's text is one llama.cpp ends generation at whatever ids the file names (its special_eog_ids
 * text list: Qwen's <|endoftext|> beside an <|im_end|> EOS, Phi-3's </s>, Llama-3.1's <|eom_id|>, ...) */
bool toy_tok_is_control_text(const char *text); /* end of generation or fill-in-the-middle: llama.cpp makes it CONTROL */
void toy_tok_eog_setup(struct toy_tokenizer *tok);
void toy_tok_eog_add(struct toy_tokenizer *tok, int32_t id); /* one more token that ends generation */
/* GPT-2's byte <-> unicode code point table. */
extern const uint16_t toy_tok_byte_to_cp[256];
int toy_tok_cp_to_byte(uint32_t cp); /* -1 when cp is not one of the 256 */

/* spm.c */
enum toy_status toy_tok_spm_encode(const struct toy_tokenizer *tok, struct tok_scratch *s, const char *text,
                                   size_t len, bool add_prefix, struct toy_tokens *out);
enum toy_status toy_tok_ugm_encode(const struct toy_tokenizer *tok, struct tok_scratch *s, const char *text,
                                   size_t len, bool add_prefix, struct toy_tokens *out);

/* wpm.c */
enum toy_status toy_tok_wpm_encode(const struct toy_tokenizer *tok, struct tok_scratch *s, const char *text,
                                   size_t len, struct toy_tokens *out);
/* HF's WordPiece decoder cleanup (" ." -> ".", " 's" -> "'s", ...) on one token's text, in place; the new length. */
size_t toy_tok_wpm_cleanup(char *s, size_t n);

/* "<0xHH>" -> HH, else -1 */
int toy_tok_parse_byte_piece(const char *s, size_t n);

/* utf-8 helpers */
static inline int tok_utf8_len(unsigned char c) {
    static const int8_t lens[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return lens[c >> 4];
}
/* Decodes one code point at s (n bytes available); returns its length, or 0
 * for an invalid sequence. */
int toy_tok_utf8_decode(const char *s, size_t n, uint32_t *cp);
int toy_tok_utf8_encode(uint32_t cp, char *out);

#endif
