/* test-tokenizer-wpm.c: the WordPiece tokenizer (BERT's) on a small
 * synthetic vocabulary in llama.cpp's GGUF form ("▁the" word-initial, "aff"
 * for "##aff"), with the expected ids written by hand from the definition
 * (Hugging Face's BertNormalizer, BertPreTokenizer and WordPiece model):
 * lowercasing and accent stripping, punctuation and CJK splitting, greedy
 * longest match, [UNK] for a word with no cover or of more than 100 code
 * points, [CLS]/[SEP], specials in the text, decoding, the GGUF round trip
 * and llama.cpp's "bert" defaults, and tokenizer.json's WordPiece giving the
 * GGUF form's ids.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "toy/gguf.h"
#include "toy/tokenizer.h"

#define MUST(call) cr_assert_eq((call), TOY_OK, "%s: %s", #call, toy_last_error())
#define N(a) (sizeof(a) / sizeof(a)[0])

/* The vocabulary, as llama.cpp's converter stores a BERT one. */
static const char *const vocab[] = {
    "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]",                         /* 0-4 CONTROL */
    "▁the", "▁un", "aff", "able", "ab", "le", "▁hello", "▁world",         /* 5-12 */
    "▁,", "▁.", "▁!", "▁caf", "e", "▁naive", "▁a", "a",                   /* 13-20 */
    "▁+", "▁b", "▁中", "▁文", "▁«", "▁»", "▁—", "▁[",                     /* 21-28 */
    "▁]", "▁sep", "▁д", "д", "▁ab", "bc", "▁cat", "▁'",                   /* 29-36 */
    "▁s", "▁don", "▁t", "▁$", "▁5", "▁Hello",                            /* 37-42 */
};
enum { PAD, UNK, CLS, SEP, MASK, THE, UN, AFF, ABLE, AB, LE, HELLO, WORLD, COMMA, DOT, BANG, CAF, E_, NAIVE, A1, A,
       PLUS, B, ZHONG, WEN, LQ, RQ, DASH, LBR, RBR, SEPW, DE1, DE, AB1, BC, CAT, APOS, S1, DON, T1, DOLLAR, FIVE,
       HELLO_CASED, NV };
_Static_assert(NV == N(vocab), "the enum names every token");

static struct toy_tokenizer *make(bool keep_case, int32_t max_word_chars) {
    int32_t types[NV];
    for (int i = 0; i < NV; i++) types[i] = i < 5 ? TOY_TOKEN_CONTROL : TOY_TOKEN_NORMAL;
    struct toy_tokenizer_spec s = {.kind = TOY_TOKENIZER_WPM, .n_tokens = NV, .tokens = vocab, .types = types,
                                   .bos = CLS, .eos = SEP, .unk = UNK, .pad = PAD, .eot = -1, .add_bos = true,
                                   .add_eos = true, .keep_case = keep_case, .max_word_chars = max_word_chars};
    struct toy_tokenizer *tok = NULL;
    MUST(toy_tokenizer_init(&s, &tok));
    return tok;
}

static void expect_ids(const struct toy_tokenizer *tok, const char *text, size_t len, unsigned flags,
                       const int32_t *want, int64_t n) {
    struct toy_tokens t = {0};
    MUST(toy_tokenizer_encode(tok, text, len, flags, &t));
    bool ok = t.n == n;
    for (int64_t i = 0; ok && i < n; i++) ok = t.ids[i] == want[i];
    if (!ok) {
        fprintf(stderr, "\"%.*s\"\n  got :", (int)len, text);
        for (int64_t i = 0; i < t.n; i++) fprintf(stderr, " %d", t.ids[i]);
        fprintf(stderr, "\n  want:");
        for (int64_t i = 0; i < n; i++) fprintf(stderr, " %d", want[i]);
        fprintf(stderr, "\n");
    }
    cr_expect(ok, "\"%.*s\" encodes to other ids", (int)len, text);
    toy_tokens_free(&t);
}
#define EXPECT(tok, text, flags, ...)                                                                                  \
    do {                                                                                                               \
        static const int32_t want_[] = {__VA_ARGS__};                                                                  \
        expect_ids(tok, text, strlen(text), flags, want_, (int64_t)N(want_));                                         \
    } while (0)

static char *decode(const struct toy_tokenizer *tok, const int32_t *ids, int64_t n, unsigned flags) {
    char *text;
    MUST(toy_tokenizer_decode(tok, ids, n, flags, &text, NULL));
    return text;
}

/* Texts the round trips below check, each with a feature of the algorithm. */
static const char *const texts[] = {
    "Hello, world! The cat.", "unaffable", "CAFÉ naïve", "a+b $5", "«hello»—world", "中文hello", "hello [SEP] world",
    "hel\xe2\x80\x8blo wor\x01ld", "abc", "helloq xyzzy", "don't", "Hello", "  \t\n ", "", "the\xcc\x81 cat",
};

Test(tokenizer_wpm, lowercases_and_strips_accents) {
    struct toy_tokenizer *tok = make(false, 0);
    cr_expect_eq(toy_tokenizer_kind(tok), TOY_TOKENIZER_WPM);
    EXPECT(tok, "The", 0, THE);
    EXPECT(tok, "HELLO World", 0, HELLO, WORLD);
    EXPECT(tok, "CAFÉ", 0, CAF, E_);           /* É -> E + U+0301 -> e */
    EXPECT(tok, "Naïve", 0, NAIVE);
    EXPECT(tok, "the\xcc\x81", 0, THE);         /* a combining acute (Mn) after the word is dropped */
    EXPECT(tok, "ДД", 0, DE1, DE);             /* Cyrillic lowercases too */
    toy_tokenizer_free(tok);
}

Test(tokenizer_wpm, splits_punctuation_symbols_and_cjk) {
    struct toy_tokenizer *tok = make(false, 0);
    EXPECT(tok, "hello,world!", 0, HELLO, COMMA, WORLD, BANG);
    EXPECT(tok, "a+b", 0, A1, PLUS, B);        /* ASCII symbols count as punctuation */
    EXPECT(tok, "$5", 0, DOLLAR, FIVE);
    EXPECT(tok, "«hello»", 0, LQ, HELLO, RQ);   /* Pi, Pf */
    EXPECT(tok, "hello—world", 0, HELLO, DASH, WORLD); /* Pd */
    EXPECT(tok, "中文hello", 0, ZHONG, WEN, HELLO); /* each ideograph is a word */
    EXPECT(tok, "hello\xc2\xa0world\xe3\x80\x80the\r\n", 0, HELLO, WORLD, THE); /* NBSP, ideographic space */
    toy_tokenizer_free(tok);
}

Test(tokenizer_wpm, drops_controls_and_bad_bytes) {
    struct toy_tokenizer *tok = make(false, 0);
    EXPECT(tok, "hel\xe2\x80\x8blo", 0, HELLO);     /* U+200B, a format character (Cf) */
    EXPECT(tok, "hel\x01lo", 0, HELLO);             /* Cc */
    EXPECT(tok, "hel\xef\xbf\xbdlo", 0, HELLO);     /* U+FFFD */
    EXPECT(tok, "hel\xfflo", 0, HELLO);             /* a byte that starts no character */
    EXPECT(tok, "hel\vlo", 0, HELLO);               /* \v is Cc: HF deletes it (llama.cpp splits there) */
    expect_ids(tok, "hel\0lo", 6, 0, (const int32_t[]){HELLO}, 1); /* NUL */
    toy_tokenizer_free(tok);
}

Test(tokenizer_wpm, greedy_longest_match_first) {
    struct toy_tokenizer *tok = make(false, 0);
    /* "able" is taken whole where "ab" + "le" would also cover */
    EXPECT(tok, "unaffable", 0, UN, AFF, ABLE);
    EXPECT(tok, "Unaffable cat", 0, UN, AFF, ABLE, CAT);
    /* greedy, no backtracking: "▁ab" leaves "c", which nothing covers, so the word is [UNK] although
       "▁a" + "bc" would have covered it */
    EXPECT(tok, "abc", 0, UNK);
    toy_tokenizer_free(tok);
}

Test(tokenizer_wpm, a_word_without_cover_is_one_unk) {
    struct toy_tokenizer *tok = make(false, 0);
    EXPECT(tok, "hello xyzzy world", 0, HELLO, UNK, WORLD);
    EXPECT(tok, "helloq", 0, UNK); /* the whole word, not "▁hello" then [UNK] */
    EXPECT(tok, "hello, xyzzy!", 0, HELLO, COMMA, UNK, BANG);
    toy_tokenizer_free(tok);
}

Test(tokenizer_wpm, a_word_over_100_code_points_is_unk) {
    struct toy_tokenizer *tok = make(false, 0);
    char buf[512];
    int32_t want[100];
    memset(buf, 'a', 100);
    want[0] = A1;
    for (int i = 1; i < 100; i++) want[i] = A;
    expect_ids(tok, buf, 100, 0, want, 100);
    memset(buf, 'a', 101);
    expect_ids(tok, buf, 101, 0, (const int32_t[]){UNK}, 1);
    memcpy(buf + 101, " the", 4);
    expect_ids(tok, buf, 105, 0, (const int32_t[]){UNK, THE}, 2);
    /* code points, not bytes: 100 two-byte letters are one word of 100 */
    want[0] = DE1;
    for (int i = 1; i < 100; i++) want[i] = DE;
    for (int i = 0; i < 101; i++) memcpy(buf + 2 * i, "д", 2);
    expect_ids(tok, buf, 200, 0, want, 100);
    expect_ids(tok, buf, 202, 0, (const int32_t[]){UNK}, 1);
    toy_tokenizer_free(tok);
    tok = make(false, 3); /* max_word_chars */
    EXPECT(tok, "aaa aaaa", 0, A1, A, A, UNK);
    toy_tokenizer_free(tok);
}

Test(tokenizer_wpm, cls_and_sep_added) {
    struct toy_tokenizer *tok = make(false, 0);
    cr_expect_eq(toy_tokenizer_bos(tok), CLS);
    cr_expect_eq(toy_tokenizer_eos(tok), SEP);
    EXPECT(tok, "Hello world", TOY_ENCODE_MODEL_DEFAULTS, CLS, HELLO, WORLD, SEP);
    EXPECT(tok, "Hello world", TOY_ENCODE_ADD_BOS | TOY_ENCODE_ADD_EOS, CLS, HELLO, WORLD, SEP);
    EXPECT(tok, "Hello world", 0, HELLO, WORLD);
    EXPECT(tok, "", TOY_ENCODE_MODEL_DEFAULTS, CLS, SEP);
    toy_tokenizer_free(tok);
}

Test(tokenizer_wpm, specials_in_the_text) {
    struct toy_tokenizer *tok = make(false, 0);
    EXPECT(tok, "hello [SEP] world", TOY_ENCODE_PARSE_SPECIAL, HELLO, SEP, WORLD);
    EXPECT(tok, "hello[SEP]world[MASK]", TOY_ENCODE_PARSE_SPECIAL, HELLO, SEP, WORLD, MASK);
    /* without parse_special it is text: "[", "sep", "]" */
    EXPECT(tok, "hello [SEP] world", 0, HELLO, LBR, SEPW, RBR, WORLD);
    /* matched as written, before normalization, as HF's normalized=false specials are */
    EXPECT(tok, "[sep]", TOY_ENCODE_PARSE_SPECIAL, LBR, SEPW, RBR);
    toy_tokenizer_free(tok);
}

Test(tokenizer_wpm, decodes_as_hf_wordpiece_decoder) {
    struct toy_tokenizer *tok = make(false, 0);
    struct toy_tokens t = {0};
    const char *text = "Hello, world! The cat.";
    MUST(toy_tokenizer_encode(tok, text, strlen(text), TOY_ENCODE_MODEL_DEFAULTS, &t));
    const int32_t want[] = {CLS, HELLO, COMMA, WORLD, BANG, THE, CAT, DOT, SEP};
    cr_assert_eq(t.n, (int64_t)N(want));
    for (size_t i = 0; i < N(want); i++) cr_expect_eq(t.ids[i], want[i]);
    char *d = decode(tok, t.ids, t.n, TOY_DECODE_SKIP_SPECIAL);
    cr_expect_str_eq(d, "hello, world! the cat.");
    free(d);
    d = decode(tok, t.ids, t.n, 0);
    cr_expect_str_eq(d, "[CLS] hello, world! the cat. [SEP]");
    free(d);
    /* the streaming decoder gives the same text */
    struct toy_decoder *dec;
    MUST(toy_decoder_init(tok, TOY_DECODE_SKIP_SPECIAL, &dec));
    char acc[128] = "";
    for (int64_t i = 0; i < t.n; i++) {
        const char *p;
        size_t l;
        MUST(toy_decoder_push(dec, t.ids[i], &p, &l));
        strncat(acc, p, l);
    }
    cr_expect_str_eq(acc, "hello, world! the cat.");
    toy_decoder_free(dec);
    toy_tokens_free(&t);

    const int32_t un[] = {UN, AFF, ABLE, CAF, E_};
    d = decode(tok, un, 5, 0);
    cr_expect_str_eq(d, "unaffable cafe"); /* continuations glue to the piece before */
    free(d);
    d = decode(tok, un, 1, TOY_DECODE_KEEP_LEADING_SPACE);
    cr_expect_str_eq(d, " un");
    free(d);
    /* the cleanup is per token, as in tokenizers' WordPiece decoder: " ' " spans tokens and stays */
    const int32_t dont[] = {DON, APOS, T1};
    d = decode(tok, dont, 3, 0);
    cr_expect_str_eq(d, "don ' t");
    free(d);
    size_t l;
    cr_expect_str_eq(toy_tokenizer_token_bytes(tok, HELLO, &l), " hello");
    cr_expect_str_eq(toy_tokenizer_token_bytes(tok, AFF, &l), "aff");
    toy_tokenizer_free(tok);
}

Test(tokenizer_wpm, cased_keeps_case_and_accents) {
    struct toy_tokenizer *tok = make(true, 0);
    EXPECT(tok, "Hello hello", 0, HELLO_CASED, HELLO);
    EXPECT(tok, "CAFÉ", 0, UNK);     /* no lowercasing, no accent stripping (strip_accents follows lowercase) */
    toy_tokenizer_free(tok);
    int32_t types[NV];
    for (int i = 0; i < NV; i++) types[i] = i < 5 ? TOY_TOKEN_CONTROL : TOY_TOKEN_NORMAL;
    struct toy_tokenizer_spec s = {.kind = TOY_TOKENIZER_WPM, .n_tokens = NV, .tokens = vocab, .types = types,
                                   .bos = CLS, .eos = SEP, .unk = UNK, .pad = PAD, .eot = -1, .strip_accents = -1};
    MUST(toy_tokenizer_init(&s, &tok)); /* lowercase, accents kept */
    EXPECT(tok, "Naïve Hello", 0, UNK, HELLO);
    toy_tokenizer_free(tok);
}

Test(tokenizer_wpm, needs_an_unk_token) {
    struct toy_tokenizer_spec s = {.kind = TOY_TOKENIZER_WPM, .n_tokens = NV, .tokens = vocab, .bos = CLS,
                                   .eos = SEP, .unk = -1, .pad = -1, .eot = -1};
    struct toy_tokenizer *tok = NULL;
    cr_expect_eq(toy_tokenizer_init(&s, &tok), TOY_ERR_FORMAT);
    cr_expect(strstr(toy_last_error(), "[UNK]"), "%s", toy_last_error());
    cr_expect_null(tok);
    s.unk = UNK;
    s.max_word_chars = -1;
    cr_expect_eq(toy_tokenizer_init(&s, &tok), TOY_ERR_INVALID_ARG);
}

/* Arbitrary bytes (broken UTF-8, controls, marks, CJK, long runs) never fail or crash, every id is in the
 * vocabulary, and the decoder takes them back. */
Test(tokenizer_wpm, arbitrary_bytes) {
    struct toy_tokenizer *tok = make(false, 0);
    static const char *const bits[] = {"a", "A", "\xc3\x89", "\xcc\x81", "\xe4\xb8\xad", " ", "\t", "!", "[SEP]", "\xff",
                                       "\xe2\x80", "\x00", "\xf0\x9f\x98\x80", "aff", "able", "\xd0\x94", "\xe2\x80\x8b"};
    static const size_t lens[] = {1, 1, 2, 2, 3, 1, 1, 1, 5, 1, 2, 1, 4, 3, 4, 2, 3};
    uint64_t r = 42;
    char buf[1024];
    struct toy_tokens t = {0};
    for (int it = 0; it < 2000; it++) {
        size_t n = 0;
        int parts = (int)((r >> 33) % 60);
        for (int k = 0; k < parts; k++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            size_t b = (size_t)(r >> 33) % N(bits);
            memcpy(buf + n, bits[b], lens[b]);
            n += lens[b];
        }
        t.n = 0;
        MUST(toy_tokenizer_encode(tok, buf, n, it & 1 ? TOY_ENCODE_PARSE_SPECIAL | TOY_ENCODE_MODEL_DEFAULTS : 0, &t));
        for (int64_t i = 0; i < t.n; i++) cr_assert(t.ids[i] >= 0 && t.ids[i] < NV);
        char *d = decode(tok, t.ids, t.n, it & 2 ? TOY_DECODE_SKIP_SPECIAL : 0);
        free(d);
        r = r * 6364136223846793005ull + 1442695040888963407ull;
    }
    toy_tokens_free(&t);
    toy_tokenizer_free(tok);
}

/* ---- GGUF ---- */

static struct toy_tokenizer *gguf_roundtrip(const struct toy_tokenizer *a) {
    struct toy_gguf_writer *w;
    MUST(toy_gguf_writer_init(&w));
    MUST(toy_tokenizer_write_gguf(a, w));
    void *buf;
    size_t size;
    MUST(toy_gguf_writer_write_memory(w, &buf, &size));
    toy_gguf_writer_free(w);
    struct toy_gguf *g;
    MUST(toy_gguf_open_memory(buf, size, "roundtrip", &g));
    const char *model;
    MUST(toy_gguf_get_str(g, "tokenizer.ggml.model", &model, NULL));
    cr_expect_str_eq(model, "bert");
    int64_t kv = toy_gguf_find_key(g, "tokenizer.ggml.seperator_token_id"), v = -1;
    cr_expect(kv >= 0 && toy_gguf_kv_int(g, kv, &v) == TOY_OK && v == toy_tokenizer_eos(a), "seperator_token_id");
    struct toy_tokenizer *b = NULL;
    MUST(toy_tokenizer_load_gguf(g, &b));
    toy_gguf_close(g);
    free(buf);
    return b;
}

static void same_everywhere(const struct toy_tokenizer *a, const struct toy_tokenizer *b) {
    cr_assert_eq(toy_tokenizer_n_vocab(a), toy_tokenizer_n_vocab(b));
    cr_expect_eq(toy_tokenizer_kind(b), TOY_TOKENIZER_WPM);
    for (int32_t i = 0; i < toy_tokenizer_n_vocab(a); i++) {
        cr_expect_str_eq(toy_tokenizer_piece(a, i), toy_tokenizer_piece(b, i), "token %d", i);
        cr_expect_eq(toy_tokenizer_token_type(a, i), toy_tokenizer_token_type(b, i), "token %d", i);
    }
    cr_expect_eq(toy_tokenizer_bos(a), toy_tokenizer_bos(b));
    cr_expect_eq(toy_tokenizer_eos(a), toy_tokenizer_eos(b));
    cr_expect_eq(toy_tokenizer_unk(a), toy_tokenizer_unk(b));
    cr_expect_eq(toy_tokenizer_pad(a), toy_tokenizer_pad(b));
    cr_expect_eq(toy_tokenizer_add_bos(a), toy_tokenizer_add_bos(b));
    cr_expect_eq(toy_tokenizer_add_eos(a), toy_tokenizer_add_eos(b));
    static const unsigned flags[] = {0, TOY_ENCODE_MODEL_DEFAULTS | TOY_ENCODE_PARSE_SPECIAL};
    char longw[130];
    memset(longw, 'a', sizeof longw);
    for (size_t f = 0; f < N(flags); f++)
        for (size_t k = 0; k <= N(texts); k++) {
            const char *t = k < N(texts) ? texts[k] : longw;
            size_t len = k < N(texts) ? strlen(t) : sizeof longw;
            struct toy_tokens ta = {0}, tb = {0};
            MUST(toy_tokenizer_encode(a, t, len, flags[f], &ta));
            MUST(toy_tokenizer_encode(b, t, len, flags[f], &tb));
            bool same = ta.n == tb.n;
            for (int64_t i = 0; same && i < ta.n; i++) same = ta.ids[i] == tb.ids[i];
            cr_expect(same, "\"%.*s\" (flags %u) encodes differently", (int)len, t, flags[f]);
            char *da = decode(a, ta.ids, ta.n, 0), *db = decode(b, tb.ids, tb.n, 0);
            cr_expect_str_eq(da, db);
            free(da), free(db);
            toy_tokens_free(&ta);
            toy_tokens_free(&tb);
        }
}

Test(tokenizer_wpm, gguf_write_read_roundtrip) {
    struct toy_tokenizer *a = make(false, 0), *b = gguf_roundtrip(a);
    same_everywhere(a, b);
    toy_tokenizer_free(b);
    toy_tokenizer_free(a);
    /* a cased one stays cased (llama.cpp would lowercase a file without normalizer.lowercase), and the word
       limit travels in a toy key */
    a = make(true, 5);
    b = gguf_roundtrip(a);
    same_everywhere(a, b);
    EXPECT(b, "Hello aaaaaa", 0, HELLO_CASED, UNK);
    toy_tokenizer_free(b);
    toy_tokenizer_free(a);
}

/* A GGUF as llama.cpp's converter writes a BERT vocabulary: ids 0 [PAD], 100 [UNK], 101 [CLS], 102 [SEP],
 * 103 [MASK], word pieces elsewhere, no scores. */
static struct toy_gguf_writer *bert_gguf(int n) {
    static char names[120][16];
    const char *toks[120];
    int32_t types[120];
    for (int i = 0; i < n; i++) {
        snprintf(names[i], sizeof names[i], "▁w%d", i);
        toks[i] = names[i];
        types[i] = TOY_TOKEN_NORMAL;
    }
    static const char *const special[] = {"[UNK]", "[CLS]", "[SEP]", "[MASK]"};
    toks[0] = "[PAD]";
    types[0] = TOY_TOKEN_CONTROL;
    for (int k = 0; k < 4 && 100 + k < n; k++) toks[100 + k] = special[k], types[100 + k] = TOY_TOKEN_CONTROL;
    toks[5] = "▁hello", toks[6] = "▁world", toks[7] = "ing", toks[8] = "▁play", toks[9] = "▁Hello";
    struct toy_gguf_writer *w;
    MUST(toy_gguf_writer_init(&w));
    MUST(toy_gguf_writer_set_str(w, "tokenizer.ggml.model", "bert"));
    MUST(toy_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, NULL, (uint64_t)n));
    MUST(toy_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", TOY_GGUF_I32, types, (uint64_t)n));
    return w;
}

static enum toy_status load_built(struct toy_gguf_writer *w, struct toy_tokenizer **tok) {
    void *buf;
    size_t size;
    MUST(toy_gguf_writer_write_memory(w, &buf, &size));
    struct toy_gguf *g;
    MUST(toy_gguf_open_memory(buf, size, "built", &g));
    enum toy_status st = toy_tokenizer_load_gguf(g, tok);
    toy_gguf_close(g);
    free(buf);
    return st;
}

Test(tokenizer_wpm, gguf_bert_defaults_as_llama_cpp) {
    struct toy_gguf_writer *w = bert_gguf(110);
    struct toy_tokenizer *tok = NULL;
    /* older converters wrote add_bos_token false for BERT: llama.cpp adds [CLS] and [SEP] anyway */
    MUST(toy_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", false));
    MUST(load_built(w, &tok));
    cr_expect_eq(toy_tokenizer_kind(tok), TOY_TOKENIZER_WPM);
    cr_expect_eq(toy_tokenizer_bos(tok), 101);
    cr_expect_eq(toy_tokenizer_eos(tok), 102);
    cr_expect_eq(toy_tokenizer_unk(tok), 100);
    cr_expect_eq(toy_tokenizer_pad(tok), 0);
    EXPECT(tok, "Hello playing, zzz", TOY_ENCODE_MODEL_DEFAULTS, 101, 5, 8, 7, 100, 100, 102);
    toy_tokenizer_free(tok);
    /* cls_token_id alone (older files) names the BOS; bos_token_id wins over it; the separator comes from
       seperator_token_id, not eos_token_id */
    MUST(toy_gguf_writer_set_u32(w, "tokenizer.ggml.cls_token_id", 103));
    MUST(toy_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 104));
    MUST(load_built(w, &tok));
    EXPECT(tok, "hello", TOY_ENCODE_MODEL_DEFAULTS, 103, 5, 102);
    toy_tokenizer_free(tok);
    MUST(toy_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 101));
    MUST(toy_gguf_writer_set_u32(w, "tokenizer.ggml.seperator_token_id", 104));
    MUST(load_built(w, &tok));
    EXPECT(tok, "hello", TOY_ENCODE_MODEL_DEFAULTS, 101, 5, 104);
    toy_tokenizer_free(tok);
    /* normalizer.lowercase false: cased (strip_accents follows it) */
    MUST(toy_gguf_writer_set_bool(w, "tokenizer.ggml.normalizer.lowercase", false));
    MUST(load_built(w, &tok));
    EXPECT(tok, "Hello hello", 0, 9, 5);
    toy_tokenizer_free(tok);
    MUST(toy_gguf_writer_set_u32(w, "tokenizer.ggml.seperator_token_id", 999));
    cr_expect_eq(load_built(w, &tok), TOY_ERR_RANGE);
    cr_expect(strstr(toy_last_error(), "seperator"), "%s", toy_last_error());
    toy_gguf_writer_free(w);
}

Test(tokenizer_wpm, gguf_without_unk_is_an_error) {
    /* 50 tokens: the default ids 100-102 are past the vocabulary, so there is no [UNK] */
    struct toy_gguf_writer *w = bert_gguf(50);
    struct toy_tokenizer *tok = NULL;
    cr_expect_eq(load_built(w, &tok), TOY_ERR_FORMAT);
    cr_expect(strstr(toy_last_error(), "[UNK]"), "%s", toy_last_error());
    MUST(toy_gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id", 1));
    MUST(load_built(w, &tok));
    cr_expect_eq(toy_tokenizer_bos(tok), -1);
    EXPECT(tok, "hello zzz", TOY_ENCODE_MODEL_DEFAULTS, 5, 1); /* nothing to add */
    toy_tokenizer_free(tok);
    toy_gguf_writer_free(w);
}

/* ---- tokenizer.json ---- */

/* The synthetic vocabulary as Hugging Face writes it: "##aff", "the", specials as added tokens. */
static json_t *hf_json(void) {
    json_t *v = json_object(), *added = json_array();
    for (int i = 0; i < NV; i++) {
        char buf[64];
        if (i < 5) {
            snprintf(buf, sizeof buf, "%s", vocab[i]);
            json_array_append_new(added, json_pack("{sisssbsbsbsbsb}", "id", i, "content", vocab[i], "single_word", 0,
                                                   "lstrip", 0, "rstrip", 0, "normalized", 0, "special", 1));
        } else if (!strncmp(vocab[i], "▁", 3)) {
            snprintf(buf, sizeof buf, "%s", vocab[i] + 3);
        } else {
            snprintf(buf, sizeof buf, "##%s", vocab[i]);
        }
        json_object_set_new(v, buf, json_integer(i));
    }
    return json_pack(
        "{sssoso s{sssbsbsnsb} s{ss} s{sss[{s{sssi}}{s{sssi}}{s{sssi}}]} s{sssssb}"
        " s{sssssssiso}}",
        "version", "1.0", "added_tokens", added, "truncation", json_null(),
        "normalizer", "type", "BertNormalizer", "clean_text", 1, "handle_chinese_chars", 1, "strip_accents",
        "lowercase", 1,
        "pre_tokenizer", "type", "BertPreTokenizer",
        "post_processor", "type", "TemplateProcessing", "single", "SpecialToken", "id", "[CLS]", "type_id", 0,
        "Sequence", "id", "A", "type_id", 0, "SpecialToken", "id", "[SEP]", "type_id", 0,
        "decoder", "type", "WordPiece", "prefix", "##", "cleanup", 1,
        "model", "type", "WordPiece", "unk_token", "[UNK]", "continuing_subword_prefix", "##",
        "max_input_chars_per_word", 100, "vocab", v);
}

static enum toy_status load_json(json_t *j, const char *config, struct toy_tokenizer **tok) {
    char *s = json_dumps(j, 0);
    cr_assert(s);
    enum toy_status st = toy_tokenizer_load_hf_mem(s, strlen(s), config, config ? strlen(config) : 0, tok);
    free(s);
    return st;
}

Test(tokenizer_wpm, tokenizer_json_gives_the_gguf_ids) {
    json_t *j = hf_json();
    cr_assert(j);
    struct toy_tokenizer *a = make(false, 0), *b = NULL;
    MUST(load_json(j, NULL, &b));
    same_everywhere(a, b);
    toy_tokenizer_free(b);
    /* and its GGUF, as `toy convert` writes it */
    MUST(load_json(j, NULL, &b));
    struct toy_tokenizer *c = gguf_roundtrip(b);
    same_everywhere(a, c);
    toy_tokenizer_free(c);
    toy_tokenizer_free(b);
    /* saved as tokenizer.json and read back */
    th_mkdir("wpm");
    char path[400];
    snprintf(path, sizeof path, "%s/tokenizer.json", th_dir);
    MUST(toy_tokenizer_save_hf(a, path));
    MUST(toy_tokenizer_load_hf(path, NULL, &b));
    same_everywhere(a, b);
    toy_tokenizer_free(b);
    th_rmdir();
    toy_tokenizer_free(a);
    json_decref(j);
}

Test(tokenizer_wpm, tokenizer_json_settings) {
    json_t *j = hf_json();
    struct toy_tokenizer *tok = NULL;
    json_t *norm = json_object_get(j, "normalizer");
    /* a cased normalizer, and tokenizer_config.json's do_lower_case over it (transformers' rule) */
    json_object_set_new(norm, "lowercase", json_false());
    MUST(load_json(j, NULL, &tok));
    EXPECT(tok, "Hello hello", 0, HELLO_CASED, HELLO);
    toy_tokenizer_free(tok);
    MUST(load_json(j, "{\"do_lower_case\": true}", &tok));
    EXPECT(tok, "Hello CAFÉ", 0, HELLO, CAF, E_);
    toy_tokenizer_free(tok);
    json_object_set_new(norm, "lowercase", json_true());
    /* BertProcessing names [CLS]/[SEP] as [text, id] pairs; no post-processor adds nothing */
    json_object_set_new(j, "post_processor", json_pack("{sss[si]s[si]}", "type", "BertProcessing", "sep", "[SEP]", SEP,
                                                       "cls", "[CLS]", CLS));
    MUST(load_json(j, NULL, &tok));
    EXPECT(tok, "hello", TOY_ENCODE_MODEL_DEFAULTS, CLS, HELLO, SEP);
    toy_tokenizer_free(tok);
    json_object_set_new(j, "post_processor", json_null());
    MUST(load_json(j, NULL, &tok));
    EXPECT(tok, "hello", TOY_ENCODE_MODEL_DEFAULTS, HELLO);
    cr_expect_eq(toy_tokenizer_bos(tok), CLS);
    toy_tokenizer_free(tok);
    /* max_input_chars_per_word */
    json_object_set_new(json_object_get(j, "model"), "max_input_chars_per_word", json_integer(3));
    MUST(load_json(j, NULL, &tok));
    EXPECT(tok, "aaa aaaa", 0, A1, A, A, UNK);
    toy_tokenizer_free(tok);
    json_decref(j);
}

Test(tokenizer_wpm, tokenizer_json_refusals) {
    struct toy_tokenizer *tok = NULL;
    json_t *j = hf_json();
    json_object_set_new(j, "normalizer", json_pack("{ss}", "type", "Lowercase"));
    cr_expect_eq(load_json(j, NULL, &tok), TOY_ERR_UNSUPPORTED);
    cr_expect(strstr(toy_last_error(), "Lowercase"), "%s", toy_last_error());
    json_decref(j);
    j = hf_json();
    json_object_set_new(json_object_get(j, "normalizer"), "handle_chinese_chars", json_false());
    cr_expect_eq(load_json(j, NULL, &tok), TOY_ERR_UNSUPPORTED);
    cr_expect(strstr(toy_last_error(), "handle_chinese_chars"), "%s", toy_last_error());
    json_decref(j);
    j = hf_json();
    json_object_set_new(j, "pre_tokenizer", json_pack("{ss}", "type", "Whitespace"));
    cr_expect_eq(load_json(j, NULL, &tok), TOY_ERR_UNSUPPORTED);
    cr_expect(strstr(toy_last_error(), "Whitespace"), "%s", toy_last_error());
    json_decref(j);
    j = hf_json();
    json_object_set_new(json_object_get(j, "model"), "unk_token", json_string("<unk>"));
    cr_expect_eq(load_json(j, NULL, &tok), TOY_ERR_FORMAT);
    cr_expect(strstr(toy_last_error(), "<unk>"), "%s", toy_last_error());
    json_decref(j);
    cr_expect_null(tok);
}
