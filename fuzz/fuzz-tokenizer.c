/* fuzz-tokenizer.c: libFuzzer harness for the tokenizer: the first input
 * byte picks a target and the rest is its input:
 *   0  SentencePiece .model parser (toy_tokenizer_load_spm_mem)
 *   1  tokenizer.json parser (toy_tokenizer_load_hf_mem)
 *   2  encode with byte-level BPE (Llama-3 pre-tokenizer): must not fail and
 *      decode(encode(x)) == x for any bytes, invalid UTF-8 included
 *   3  encode with SentencePiece BPE with byte fallback: same round trip
 *   4  the same with special-token parsing and the streaming decoder
 *   5  chat templates: parse and render the input as Jinja
 *   6  tokenizer from GGUF metadata (toy_gguf_open_memory + toy_tokenizer_load_gguf)
 *   7  encode with WordPiece (BERT's): must not fail, gives ids of the
 *      vocabulary between [CLS] and [SEP], and decodes, whole and streamed
 * Build: clang -fsanitize=fuzzer,address,undefined (see fuzz/Makefile for the
 * flags; sources: every src/tokenizer file, src/core/status.c and the GGUF files).
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "toy/chat-template.h"
#include "toy/gguf.h"
#include "toy/tokenizer.h"
#include "tokenizer/tokenizer-impl.h" /* toy_tok_byte_to_cp, toy_tok_utf8_encode */

static struct toy_tokenizer *bpe, *spm, *wpm;

/* GPT-2's piece for byte b (its byte-to-unicode table), NUL-terminated in o[4] */
static const char *byte_piece(int b, char *o) {
    o[toy_tok_utf8_encode(toy_tok_byte_to_cp[b], o)] = 0;
    return o;
}

static void init(void) {
    static char bytes[256][4];
    static const char *toks[300];
    int n = 0;
    toks[n++] = "<|special|>";
    for (int b = 0; b < 256; b++) toks[n++] = byte_piece(b, bytes[b]);
    static const char *merges[] = {"a b", "ab c", "\xc4\xa0 a", "\xc4\xa0\x61 b", "1 2", "12 3"};
    toks[n++] = "ab";
    toks[n++] = "abc";
    toks[n++] = "\xc4\xa0\x61";
    toks[n++] = "\xc4\xa0\x61\x62";
    toks[n++] = "12";
    toks[n++] = "123";
    int32_t types[300];
    for (int i = 0; i < n; i++) types[i] = i == 0 ? TOY_TOKEN_CONTROL : TOY_TOKEN_NORMAL;
    struct toy_tokenizer_spec s = {.kind = TOY_TOKENIZER_BPE, .n_tokens = n, .tokens = toks, .types = types,
                                   .n_merges = 6, .merges = merges, .pre = "llama-bpe", .bos = 0, .eos = 0,
                                   .unk = -1, .pad = -1, .eot = -1, .ignore_merges = true};
    if (toy_tokenizer_init(&s, &bpe)) abort();
    /* SentencePiece: <unk> <s> </s>, 256 byte pieces, a few pieces */
    static char hex[256][8];
    static const char *sp[300];
    float sc[300];
    int m = 0;
    sp[m++] = "<unk>";
    sp[m++] = "<s>";
    sp[m++] = "</s>";
    for (int b = 0; b < 256; b++) { snprintf(hex[b], sizeof hex[b], "<0x%02X>", b); sp[m++] = hex[b]; }
    const char *extra[] = {"\xe2\x96\x81", "a", "b", "ab", "\xe2\x96\x81\x61\x62", "\xe2\x96\x81\xe2\x96\x81", "\xc3\xa9"};
    for (int i = 0; i < 7; i++) sp[m++] = extra[i];
    for (int i = 0; i < m; i++) sc[i] = i < 259 ? 0.0f : -(float)(i - 258);
    struct toy_tokenizer_spec q = {.kind = TOY_TOKENIZER_SPM, .n_tokens = m, .tokens = sp, .scores = sc, .bos = 1,
                                   .eos = 2, .unk = 0, .pad = -1, .eot = -1, .add_space_prefix = true, .add_bos = true};
    if (toy_tokenizer_init(&q, &spm)) abort();
    /* WordPiece in llama.cpp's form: specials, word-initial pieces after U+2581, continuations bare */
    static const char *wp[] = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "\xe2\x96\x81" "a", "\xe2\x96\x81" "ab", "b", "c",
                               "\xe2\x96\x81" ",", "\xe2\x96\x81\xe4\xb8\x80", "\xe2\x96\x81" "1", "23", "\xe2\x96\x81" "e"};
    int32_t wt[13];
    for (int i = 0; i < 13; i++) wt[i] = i < 4 ? TOY_TOKEN_CONTROL : TOY_TOKEN_NORMAL;
    struct toy_tokenizer_spec w = {.kind = TOY_TOKENIZER_WPM, .n_tokens = 13, .tokens = wp, .types = wt, .bos = 2,
                                   .eos = 3, .unk = 1, .pad = 0, .eot = -1, .add_bos = true, .add_eos = true,
                                   .max_word_chars = 8};
    if (toy_tokenizer_init(&w, &wpm)) abort();
}

static void wordpiece(const char *text, size_t len) {
    struct toy_tokens t = {0};
    if (toy_tokenizer_encode(wpm, text, len, TOY_ENCODE_PARSE_SPECIAL | TOY_ENCODE_MODEL_DEFAULTS, &t)) abort();
    if (t.n < 2 || t.ids[0] != 2 || t.ids[t.n - 1] != 3) abort();
    for (int64_t i = 0; i < t.n; i++)
        if (t.ids[i] < 0 || t.ids[i] >= 13) abort();
    char *d;
    size_t dl;
    if (toy_tokenizer_decode(wpm, t.ids, t.n, TOY_DECODE_SKIP_SPECIAL, &d, &dl)) abort();
    free(d);
    struct toy_decoder *dec;
    if (toy_decoder_init(wpm, 0, &dec)) abort();
    for (int64_t i = 0; i < t.n; i++) {
        const char *s;
        size_t l;
        if (toy_decoder_push(dec, t.ids[i], &s, &l)) abort();
    }
    toy_decoder_free(dec);
    toy_tokens_free(&t);
}

static void roundtrip(struct toy_tokenizer *tok, const char *text, size_t len, unsigned flags) {
    struct toy_tokens t = {0};
    if (toy_tokenizer_encode(tok, text, len, flags, &t)) abort();
    char *d;
    size_t dl;
    if (toy_tokenizer_decode(tok, t.ids, t.n, 0, &d, &dl)) abort();
    /* SentencePiece decodes a literal U+2581 in the input as a space, as the reference does */
    bool exact = !(flags & TOY_ENCODE_PARSE_SPECIAL) && !(tok == spm && memmem(text, len, "\xe2\x96\x81", 3));
    if (exact && (dl != len || memcmp(d, text, len))) {
        fprintf(stderr, "round trip differs (%zu -> %zu bytes)\n", len, dl);
        abort();
    }
    free(d);
    struct toy_decoder *dec;
    if (toy_decoder_init(tok, 0, &dec)) abort();
    size_t total = 0;
    for (int64_t i = 0; i < t.n; i++) {
        const char *s;
        size_t l;
        if (toy_decoder_push(dec, t.ids[i], &s, &l)) abort();
        total += l;
    }
    const char *s;
    size_t l;
    toy_decoder_flush(dec, &s, &l);
    total += l;
    if (exact && total != len) abort();
    toy_decoder_free(dec);
    toy_tokens_free(&t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!bpe) init();
    if (size < 1) return 0;
    const char *p = (const char *)data + 1;
    size_t n = size - 1;
    struct toy_tokenizer *tok = NULL;
    switch (data[0] % 8) {
    case 0:
        if (!toy_tokenizer_load_spm_mem(p, n, &tok)) toy_tokenizer_free(tok);
        break;
    case 1:
        if (!toy_tokenizer_load_hf_mem(p, n, NULL, 0, &tok)) {
            struct toy_tokens t = {0};
            toy_tokenizer_encode(tok, "Hello world 123", 15, TOY_ENCODE_PARSE_SPECIAL, &t);
            toy_tokens_free(&t);
            toy_tokenizer_free(tok);
        }
        break;
    case 2: roundtrip(bpe, p, n, 0); break;
    case 3: roundtrip(spm, p, n, 0); break;
    case 4:
        roundtrip(bpe, p, n, TOY_ENCODE_PARSE_SPECIAL | TOY_ENCODE_ADD_BOS);
        roundtrip(spm, p, n, TOY_ENCODE_PARSE_SPECIAL | TOY_ENCODE_ADD_BOS);
        break;
    case 5: {
        char *src = malloc(n + 1);
        if (!src) return 0;
        memcpy(src, p, n);
        src[n] = 0;
        struct toy_chat_template *ct;
        if (!toy_chat_template_init(src, &ct)) {
            struct toy_chat_vars v = {.bos_token = "<s>", .add_generation_prompt = true};
            char *out;
            if (!toy_chat_template_render_json(ct, "[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\",\"content\":\"yo\"}]", &v, &out))
                free(out);
            toy_chat_template_free(ct);
        }
        free(src);
        break;
    }
    case 6: {
        struct toy_gguf *g;
        if (toy_gguf_open_memory(p, n, "fuzz", &g)) break;
        if (!toy_tokenizer_load_gguf(g, &tok)) {
            struct toy_tokens t = {0};
            toy_tokenizer_encode(tok, "Hello world 123 <s> \xc3\xa9", 23, TOY_ENCODE_PARSE_SPECIAL | TOY_ENCODE_MODEL_DEFAULTS, &t);
            char *d;
            if (!toy_tokenizer_decode(tok, t.ids, t.n, 0, &d, NULL)) free(d);
            toy_tokens_free(&t);
            toy_tokenizer_free(tok);
        }
        toy_gguf_close(g);
        break;
    }
    case 7: wordpiece(p, n); break;
    }
    return 0;
}
