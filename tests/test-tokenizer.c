/* test-tokenizer.c: toy's tokenizers against the reference implementations'
 * ids in ../shared/testdata (GPT-2 gpt-3-encoder, SentencePiece, HF
 * tokenizers for Llama-3 and SmolLM2, llama.cpp's test-tokenizer-0 pairs),
 * round trips, streaming decode, Unigram Viterbi against brute force, and
 * malformed vocabularies. Tests skip when the test data is absent.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "toy/gguf.h"
#include "toy/tokenizer.h"
#include "tokenizer/tokenizer-impl.h" /* toy_tok_pre_regexes */

#define TD "../shared/testdata/"

static void need(const char *path) {
    if (access(path, R_OK) != 0) cr_skip_test("test data %s is absent", path);
}

#define MUST(call) cr_assert_eq((call), TOY_OK, "%s: %s", #call, toy_last_error())

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    cr_assert(f, "%s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    char *b = malloc((size_t)n + 1);
    cr_assert_eq(fread(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    b[n] = 0;
    if (len) *len = (size_t)n;
    return b;
}

static bool same_ids(const struct toy_tokens *t, const int32_t *ids, int64_t n) {
    if (t->n != n) return false;
    for (int64_t i = 0; i < n; i++)
        if (t->ids[i] != ids[i]) return false;
    return true;
}

static void show_mismatch(const char *what, const char *text, const struct toy_tokens *got, const int32_t *want,
                          int64_t nwant) {
    fprintf(stderr, "%s: mismatch for \"%.60s\"\n  got :", what, text);
    for (int64_t i = 0; i < got->n && i < 40; i++) fprintf(stderr, " %d", got->ids[i]);
    fprintf(stderr, "\n  want:");
    for (int64_t i = 0; i < nwant && i < 40; i++) fprintf(stderr, " %d", want[i]);
    fprintf(stderr, "\n");
}

/* Every line of an expected.jsonl ({"text", "ids"} or "ids_with_bos"):
 * encode and compare; also decode(encode(text)) == text. Returns passes. */
static int check_jsonl(const struct toy_tokenizer *tok, const char *path, unsigned flags, const char *ids_key,
                       int *total, int *roundtrips) {
    FILE *f = fopen(path, "r");
    cr_assert(f, "%s", path);
    char *line = NULL;
    size_t cap = 0;
    int pass = 0, n = 0, rt = 0;
    struct toy_tokens t = {0};
    int32_t want[4096];
    while (getline(&line, &cap, f) > 0) {
        json_error_t err;
        json_t *o = json_loads(line, 0, &err);
        if (!o) continue;
        json_t *jt = json_object_get(o, "text");
        const char *text = json_string_value(jt);
        size_t tlen = json_string_length(jt);
        json_t *ids = json_object_get(o, ids_key);
        int64_t nw = (int64_t)json_array_size(ids);
        cr_assert(nw < 4096);
        for (int64_t i = 0; i < nw; i++) want[i] = (int32_t)json_integer_value(json_array_get(ids, (size_t)i));
        t.n = 0;
        cr_assert_eq(toy_tokenizer_encode(tok, text, tlen, flags, &t), TOY_OK, "%s", toy_last_error());
        n++;
        if (same_ids(&t, want, nw)) pass++;
        else if (n - pass <= 5) show_mismatch(path, text, &t, want, nw);
        char *dec;
        size_t dlen;
        const int32_t *dids = t.ids;
        int64_t dn = t.n;
        if ((flags & TOY_ENCODE_ADD_BOS) && dn > 0) { dids++; dn--; }
        cr_assert_eq(toy_tokenizer_decode(tok, dids, dn, 0, &dec, &dlen), TOY_OK);
        if (dlen == tlen && !memcmp(dec, text, tlen)) rt++;
        else if (n - rt <= 3) fprintf(stderr, "%s: round trip of \"%.40s\" gave \"%.40s\"\n", path, text, dec);
        free(dec);
        json_decref(o);
    }
    free(line);
    fclose(f);
    toy_tokens_free(&t);
    *total = n;
    if (roundtrips) *roundtrips = rt;
    return pass;
}

/* llama.cpp test-tokenizer-0: texts separated by "\n__ggml_vocab_test__\n",
 * one line of space-separated ids per text. */
static int check_inp_out(const struct toy_tokenizer *tok, const char *inp, const char *outp, unsigned flags,
                         int *total) {
    size_t il;
    char *in = slurp(inp, &il), *out = slurp(outp, NULL);
    const char *sep = "\n__ggml_vocab_test__\n";
    int pass = 0, n = 0;
    struct toy_tokens t = {0};
    char *p = in, *o = out;
    int32_t want[4096];
    for (;;) {
        char *e = strstr(p, sep);
        if (!e) break;
        char *oe = strchr(o, '\n');
        cr_assert(oe, "%s: fewer lines than texts", outp);
        *oe = 0;
        int64_t nw = 0;
        for (char *q = o; *q;) {
            char *end;
            long v = strtol(q, &end, 10);
            if (end == q) break;
            want[nw++] = (int32_t)v;
            q = end;
        }
        t.n = 0;
        cr_assert_eq(toy_tokenizer_encode(tok, p, (size_t)(e - p), flags, &t), TOY_OK);
        n++;
        if (same_ids(&t, want, nw)) pass++;
        else if (n - pass <= 5) {
            *e = 0;
            show_mismatch(inp, p, &t, want, nw);
        }
        p = e + strlen(sep);
        o = oe + 1;
    }
    toy_tokens_free(&t);
    free(in);
    free(out);
    *total = n;
    return pass;
}

/* ggml examples/prompts: "text => id,id,..." lines. */
static int check_prompts(const struct toy_tokenizer *tok, const char *path, int *total) {
    FILE *f = fopen(path, "r");
    cr_assert(f);
    char *line = NULL;
    size_t cap = 0;
    int pass = 0, n = 0;
    struct toy_tokens t = {0};
    int32_t want[1024];
    ssize_t l;
    while ((l = getline(&line, &cap, f)) > 0) {
        if (line[l - 1] == '\n') line[--l] = 0;
        char *arrow = NULL;
        for (char *q = strstr(line, " => "); q; q = strstr(q + 1, " => ")) arrow = q;
        if (!arrow) continue;
        *arrow = 0;
        int64_t nw = 0;
        for (char *q = arrow + 4; *q;) {
            char *end;
            long v = strtol(q, &end, 10);
            if (end == q) break;
            want[nw++] = (int32_t)v;
            q = *end == ',' ? end + 1 : end;
        }
        t.n = 0;
        cr_assert_eq(toy_tokenizer_encode(tok, line, strlen(line), 0, &t), TOY_OK);
        n++;
        if (same_ids(&t, want, nw)) pass++;
        else if (n - pass <= 5) show_mismatch(path, line, &t, want, nw);
    }
    free(line);
    fclose(f);
    toy_tokens_free(&t);
    *total = n;
    return pass;
}

/* ---- GPT-2 ---- */

Test(tokenizer, gpt2_expected) {
    need(TD "tokenizer-gpt2/encoder.json");
    struct toy_tokenizer *tok = NULL;
    MUST(toy_tokenizer_load_gpt2(TD "tokenizer-gpt2/encoder.json", TD "tokenizer-gpt2/vocab.bpe", NULL, &tok));
    cr_assert_eq(toy_tokenizer_n_vocab(tok), 50257);
    cr_assert_eq(toy_tokenizer_n_merges(tok), 50000);
    cr_assert_eq(toy_tokenizer_eos(tok), 50256);
    int n, rt;
    int pass = check_jsonl(tok, TD "tokenizer-gpt2/expected.jsonl", 0, "ids", &n, &rt);
    fprintf(stderr, "gpt2 expected.jsonl: %d/%d, round trip %d/%d\n", pass, n, rt, n);
    cr_assert_eq(n, 261);
    cr_expect_eq(pass, n);
    cr_expect_eq(rt, n);
    pass = check_prompts(tok, TD "ggml-prompts-tokenization/gpt-2.txt", &n);
    fprintf(stderr, "gpt2 ggml prompts: %d/%d\n", pass, n);
    cr_expect_eq(n, 100);
    cr_expect_eq(pass, n);
    pass = check_inp_out(tok, TD "llamacpp-vocab-gguf/ggml-vocab-gpt-2.gguf.inp",
                         TD "llamacpp-vocab-gguf/ggml-vocab-gpt-2.gguf.out", 0, &n);
    fprintf(stderr, "gpt2 llama.cpp .inp/.out: %d/%d\n", pass, n);
    cr_expect_eq(n, 46);
    cr_expect_eq(pass, n);

    /* the same files under HF's names (vocab.json + merges.txt) in a folder */
    char dir[] = "/tmp/toy-hf-gpt2-XXXXXX", p[600], abs_path[PATH_MAX];
    cr_assert(mkdtemp(dir));
    cr_assert(realpath(TD "tokenizer-gpt2/encoder.json", abs_path));
    snprintf(p, sizeof p, "%s/vocab.json", dir);
    cr_assert_eq(symlink(abs_path, p), 0);
    cr_assert(realpath(TD "tokenizer-gpt2/vocab.bpe", abs_path));
    snprintf(p, sizeof p, "%s/merges.txt", dir);
    cr_assert_eq(symlink(abs_path, p), 0);
    struct toy_tokenizer *hf = NULL;
    MUST(toy_tokenizer_load(dir, &hf));
    cr_expect_eq(toy_tokenizer_n_vocab(hf), 50257);
    toy_tokenizer_free(hf);
    snprintf(p, sizeof p, "rm -rf %s", dir);
    cr_expect_eq(system(p), 0);

    /* special text: plain without PARSE_SPECIAL, one token with it */
    struct toy_tokens t = {0};
    cr_assert_eq(toy_tokenizer_encode(tok, "<|endoftext|>", 13, TOY_ENCODE_PARSE_SPECIAL, &t), TOY_OK);
    cr_assert_eq(t.n, 1);
    cr_assert_eq(t.ids[0], 50256);
    toy_tokens_free(&t);
    toy_tokenizer_free(tok);
}

/* ---- Llama-2 SentencePiece ---- */

Test(tokenizer, llama2_spm_expected) {
    need(TD "tokenizer-llama2-spm/tokenizer.model");
    struct toy_tokenizer *tok = NULL;
    MUST(toy_tokenizer_load_spm(TD "tokenizer-llama2-spm/tokenizer.model", &tok));
    cr_assert_eq(toy_tokenizer_kind(tok), TOY_TOKENIZER_SPM);
    cr_assert_eq(toy_tokenizer_n_vocab(tok), 32000);
    cr_assert_eq(toy_tokenizer_bos(tok), 1);
    cr_assert_eq(toy_tokenizer_eos(tok), 2);
    cr_assert_eq(toy_tokenizer_unk(tok), 0);
    cr_assert_eq(toy_tokenizer_token_type(tok, 13), TOY_TOKEN_BYTE); /* <0x0A> */
    int n, rt;
    int pass = check_jsonl(tok, TD "tokenizer-llama2-spm/expected.jsonl", 0, "ids", &n, &rt);
    fprintf(stderr, "llama2 spm expected.jsonl: %d/%d, round trip %d/%d\n", pass, n, rt, n);
    cr_assert_eq(n, 261);
    cr_expect_eq(pass, n);
    cr_expect_eq(rt, n);
    pass = check_jsonl(tok, TD "tokenizer-llama2-spm/llama-tokenizer-js-cases.jsonl", TOY_ENCODE_ADD_BOS,
                       "ids_with_bos", &n, NULL);
    fprintf(stderr, "llama2 llama-tokenizer-js cases: %d/%d\n", pass, n);
    cr_expect_eq(pass, n);
    pass = check_inp_out(tok, TD "llamacpp-vocab-gguf/ggml-vocab-llama-spm.gguf.inp",
                         TD "llamacpp-vocab-gguf/ggml-vocab-llama-spm.gguf.out", 0, &n);
    fprintf(stderr, "llama2 llama.cpp .inp/.out: %d/%d\n", pass, n);
    cr_expect_eq(pass, n);
    toy_tokenizer_free(tok);
}

Test(tokenizer, llama2c_bin_matches_model) {
    need(TD "tokenizer-llama2-spm/tokenizer.bin");
    struct toy_tokenizer *tok = NULL;
    MUST(toy_tokenizer_load_llama2c(TD "tokenizer-llama2-spm/tokenizer.bin", &tok));
    cr_assert_eq(toy_tokenizer_n_vocab(tok), 32000);
    cr_assert_str_eq(toy_tokenizer_piece(tok, 1), "<s>");
    int n, rt;
    int pass = check_jsonl(tok, TD "tokenizer-llama2-spm/expected.jsonl", 0, "ids", &n, &rt);
    fprintf(stderr, "llama2.c tokenizer.bin expected.jsonl: %d/%d\n", pass, n);
    cr_expect_eq(pass, n);
    toy_tokenizer_free(tok);
}

/* Tokens llama.cpp ends generation at by their text, whatever ids the file names (Phi-3's </s> beside its eos
 * <|endoftext|> and eot <|end|>; Qwen's <|endoftext|> beside an <|im_end|> EOS; Llama-3.1's <|eom_id|>) end it
 * in toy too: toy generated past them */
Test(tokenizer, eog_by_text_as_llama_cpp) {
    need(TD "llamacpp-vocab-gguf/ggml-vocab-phi-3.gguf");
    struct toy_tokenizer *tok = NULL;
    MUST(toy_tokenizer_load(TD "llamacpp-vocab-gguf/ggml-vocab-phi-3.gguf", &tok));
    int32_t eos_text = toy_tokenizer_find(tok, "</s>", 4);
    cr_assert_geq(eos_text, 0, "no </s>");
    cr_expect(eos_text != toy_tokenizer_eos(tok) && eos_text != toy_tokenizer_eot(tok));
    cr_expect(toy_tokenizer_is_eog(tok, eos_text), "</s> (%d) does not end generation", (int)eos_text);
    cr_expect(toy_tokenizer_is_eog(tok, toy_tokenizer_eos(tok)));
    cr_expect(!toy_tokenizer_is_eog(tok, toy_tokenizer_find(tok, "▁the", strlen("▁the"))), "an ordinary token");
    cr_expect(!toy_tokenizer_is_eog(tok, toy_tokenizer_n_vocab(tok)) && !toy_tokenizer_is_eog(tok, -1));
    toy_tokenizer_free(tok);
}

/* A tokenizer.json whose Split regex is one of the named sets as it is (GPT-4o's o200k, Mistral's Tekken) gets that
 * name as its tokenizer.ggml.pre, which llama.cpp splits by: o200k was guessed "llama-bpe" (from its \p{N}{1,3}) and
 * Tekken "qwen2" (from its |\p{N}|), so llama.cpp tokenized "iPhone 15Pro" otherwise than toy */
static void named_set_keeps_its_name(const char *name) {
    need(TD "tokenizer-llama3/tokenizer.json");
    int n;
    const char *const *re;
    cr_assert(toy_tok_pre_regexes(name, &n, &re));
    json_t *j = json_load_file(TD "tokenizer-llama3/tokenizer.json", 0, NULL);
    cr_assert(j);
    json_t *pre = json_object_get(j, "pre_tokenizer"), *list = json_array();
    for (int i = 0; i < n; i++)
        json_array_append_new(list, json_pack("{s:s, s:{s:s}, s:s, s:b}", "type", "Split", "pattern", "Regex", re[i],
                                              "behavior", "Isolated", "invert", 0));
    json_array_append_new(list, json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", 0,
                                          "trim_offsets", 1, "use_regex", 0));
    json_object_set_new(pre, "pretokenizers", list);
    th_mkdir(name);
    char path[300];
    snprintf(path, sizeof path, "%s/tokenizer.json", th_dir);
    cr_assert_eq(json_dump_file(j, path, 0), 0);
    json_decref(j);
    struct toy_tokenizer *tok = NULL;
    MUST(toy_tokenizer_load(path, &tok));
    cr_expect_str_eq(toy_tokenizer_pre(tok), name);
    toy_tokenizer_free(tok);
    th_rmdir();
}

Test(tokenizer, hf_regex_of_a_named_set_keeps_its_name) {
    named_set_keeps_its_name("gpt-4o");
    named_set_keeps_its_name("tekken");
}

/* ---- Llama-3 ---- */

Test(tokenizer, llama3_expected, .timeout = 60) {
    need(TD "tokenizer-llama3/tokenizer.json");
    struct toy_tokenizer *tok = NULL;
    MUST(toy_tokenizer_load(TD "tokenizer-llama3/tokenizer.json", &tok));
    cr_assert_eq(toy_tokenizer_n_vocab(tok), 128256);
    cr_assert_eq(toy_tokenizer_bos(tok), 128000);
    cr_assert_eq(toy_tokenizer_eos(tok), 128001);
    cr_assert_eq(toy_tokenizer_eot(tok), 128009);
    cr_assert_str_eq(toy_tokenizer_pre(tok), "llama-bpe");
    cr_assert_not_null(toy_tokenizer_chat_template(tok));
    int n, rt;
    int pass = check_jsonl(tok, TD "tokenizer-llama3/expected.jsonl", TOY_ENCODE_PARSE_SPECIAL, "ids", &n, &rt);
    fprintf(stderr, "llama3 expected.jsonl: %d/%d, round trip %d/%d\n", pass, n, rt, n);
    cr_assert_eq(n, 261);
    cr_expect_eq(pass, n);
    cr_expect_eq(rt, n);
    pass = check_jsonl(tok, TD "tokenizer-llama3/llama3-tokenizer-js-cases.jsonl", TOY_ENCODE_PARSE_SPECIAL, "ids", &n, NULL);
    fprintf(stderr, "llama3 llama3-tokenizer-js cases: %d/%d (the 14th uses Llama-3.1 names)\n", pass, n);
    cr_expect_eq(pass, 13);
    pass = check_inp_out(tok, TD "llamacpp-vocab-gguf/ggml-vocab-llama-bpe.gguf.inp",
                         TD "llamacpp-vocab-gguf/ggml-vocab-llama-bpe.gguf.out", 0, &n);
    fprintf(stderr, "llama3 llama.cpp .inp/.out: %d/%d\n", pass, n);
    cr_expect_eq(pass, n);
    toy_tokenizer_free(tok);
}

Test(tokenizer, llama3_gpt2_format, .timeout = 60) {
    need(TD "tokenizer-llama3/gpt2-format/encoder.json");
    struct toy_tokenizer *tok = NULL;
    MUST(toy_tokenizer_load_gpt2(TD "tokenizer-llama3/gpt2-format/encoder.json",
                                 TD "tokenizer-llama3/gpt2-format/vocab.bpe", "llama-bpe", &tok));
    cr_assert_eq(toy_tokenizer_n_vocab(tok), 128000);
    int n, rt;
    /* the 261 strings hold no Llama-3 special-token text, so the vocabulary
       without its added tokens gives the same ids */
    int pass = check_jsonl(tok, TD "tokenizer-llama3/expected.jsonl", 0, "ids", &n, &rt);
    fprintf(stderr, "llama3 gpt2-format: %d/%d\n", pass, n);
    cr_expect_eq(pass, n);
    toy_tokenizer_free(tok);
}

/* ---- SmolLM2 ---- */

Test(tokenizer, smollm2_expected) {
    need(TD "tokenizer-smollm2/tokenizer.json");
    struct toy_tokenizer *tok = NULL;
    MUST(toy_tokenizer_load(TD "tokenizer-smollm2", &tok));
    cr_assert_eq(toy_tokenizer_n_vocab(tok), 49152);
    cr_assert_str_eq(toy_tokenizer_pre(tok), "smollm");
    cr_assert_eq(toy_tokenizer_token_type(tok, 1), TOY_TOKEN_CONTROL);
    int n, rt;
    int pass = check_jsonl(tok, TD "tokenizer-smollm2/expected.jsonl", TOY_ENCODE_PARSE_SPECIAL, "ids", &n, &rt);
    fprintf(stderr, "smollm2 expected.jsonl: %d/%d, round trip %d/%d\n", pass, n, rt, n);
    cr_assert_eq(n, 261);
    cr_expect_eq(pass, n);
    cr_expect_eq(rt, n);
    struct toy_tokens t = {0};
    cr_assert_eq(toy_tokenizer_encode(tok, "<|im_start|>user", 16, 0, &t), TOY_OK);
    cr_expect_gt(t.n, 2, "without PARSE_SPECIAL <|im_start|> is text");
    t.n = 0;
    cr_assert_eq(toy_tokenizer_encode(tok, "<|im_start|>user", 16, TOY_ENCODE_PARSE_SPECIAL, &t), TOY_OK);
    cr_expect_eq(t.n, 2);
    cr_expect_eq(t.ids[0], 1);
    toy_tokens_free(&t);
    toy_tokenizer_free(tok);
}

/* ---- decoding ---- */

Test(tokenizer, streaming_decode_holds_split_utf8) {
    need(TD "tokenizer-llama2-spm/tokenizer.model");
    struct toy_tokenizer *tok = NULL;
    MUST(toy_tokenizer_load_spm(TD "tokenizer-llama2-spm/tokenizer.model", &tok));
    const char *text = "日本語 🦙 ok";
    struct toy_tokens t = {0};
    cr_assert_eq(toy_tokenizer_encode(tok, text, strlen(text), TOY_ENCODE_ADD_BOS, &t), TOY_OK);
    struct toy_decoder *d;
    cr_assert_eq(toy_decoder_init(tok, TOY_DECODE_SKIP_SPECIAL, &d), TOY_OK);
    char acc[256] = "";
    size_t al = 0;
    bool saw_hold = false;
    for (int64_t i = 0; i < t.n; i++) {
        const char *s;
        size_t l;
        cr_assert_eq(toy_decoder_push(d, t.ids[i], &s, &l), TOY_OK);
        /* each piece handed out is valid UTF-8 on its own */
        for (size_t k = 0; k < l;) {
            unsigned char c = (unsigned char)s[k];
            size_t cl = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
            cr_assert_leq(k + cl, l, "split character handed out at token %lld", (long long)i);
            k += cl;
        }
        if (l == 0 && i > 0) saw_hold = true;
        memcpy(acc + al, s, l);
        al += l;
    }
    const char *s;
    size_t l;
    toy_decoder_flush(d, &s, &l);
    cr_expect_eq(l, 0);
    acc[al] = 0;
    cr_expect_str_eq(acc, text);
    cr_expect(saw_hold, "🦙 is byte tokens in Llama-2: some pushes must hold");
    toy_decoder_free(d);
    toy_tokens_free(&t);
    toy_tokenizer_free(tok);
}

Test(tokenizer, invalid_utf8_input) {
    need(TD "tokenizer-gpt2/encoder.json");
    struct toy_tokenizer *gpt2 = NULL, *spm = NULL;
    MUST(toy_tokenizer_load_gpt2(TD "tokenizer-gpt2/encoder.json", TD "tokenizer-gpt2/vocab.bpe", NULL, &gpt2));
    MUST(toy_tokenizer_load_spm(TD "tokenizer-llama2-spm/tokenizer.model", &spm));
    const char bad[] = "ab\xff\xfe c\xc3(\xe2\x82 end\xf0\x9f";
    struct toy_tokens t = {0};
    struct toy_tokenizer *toks[2] = {gpt2, spm};
    for (int k = 0; k < 2; k++) {
        t.n = 0;
        cr_assert_eq(toy_tokenizer_encode(toks[k], bad, sizeof bad - 1, 0, &t), TOY_OK, "%s", toy_last_error());
        cr_assert_gt(t.n, 0);
        char *dec;
        size_t dl;
        cr_assert_eq(toy_tokenizer_decode(toks[k], t.ids, t.n, 0, &dec, &dl), TOY_OK);
        cr_expect_eq(dl, sizeof bad - 1, "stray bytes survive the round trip (%d)", k);
        cr_expect(dl == sizeof bad - 1 && !memcmp(dec, bad, dl));
        free(dec);
    }
    int32_t oob = 999999;
    char *dec;
    cr_expect_eq(toy_tokenizer_decode(gpt2, &oob, 1, 0, &dec, NULL), TOY_ERR_RANGE);
    toy_tokens_free(&t);
    toy_tokenizer_free(gpt2);
    toy_tokenizer_free(spm);
}

/* ---- Unigram ---- */

/* Best segmentation score by exhaustive search. */
static double brute(const char *const *pieces, const float *scores, int n, const char *s, size_t len) {
    if (len == 0) return 0;
    double best = -INFINITY;
    for (int i = 0; i < n; i++) {
        size_t l = strlen(pieces[i]);
        if (l <= len && !memcmp(pieces[i], s, l)) {
            double r = brute(pieces, scores, n, s + l, len - l);
            if (r > -INFINITY && r + scores[i] > best) best = r + scores[i];
        }
    }
    return best;
}

Test(tokenizer, unigram_viterbi_is_optimal) {
    /* a vocabulary where greedy longest match loses: "abc" alone scores less
       than "ab"+"cd" when followed by "d" */
    static const char *const pieces[] = {"<unk>", "<s>", "</s>", "\xe2\x96\x81", "a", "b", "c", "d", "ab", "abc",
                                         "cd", "bcd", "\xe2\x96\x81\x61\x62", "da", "x"};
    static const float scores[] = {0, 0, 0, -2, -3, -3, -3, -3, -2.5f, -2, -1.5f, -4, -2.2f, -2.1f, -5};
    int np = (int)(sizeof pieces / sizeof pieces[0]);
    struct toy_tokenizer_spec spec = {.kind = TOY_TOKENIZER_UGM, .n_tokens = np, .tokens = pieces, .scores = scores,
                                      .bos = 1, .eos = 2, .unk = 0, .pad = -1, .eot = -1, .add_space_prefix = true};
    struct toy_tokenizer *tok = NULL;
    MUST(toy_tokenizer_init(&spec, &tok));
    const char *cases[] = {"abcd", "abcdabcd", "dabc", "ab cd", "bcda", "cdab", "abcdab"};
    struct toy_tokens t = {0};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        t.n = 0;
        cr_assert_eq(toy_tokenizer_encode(tok, cases[c], strlen(cases[c]), 0, &t), TOY_OK, "%s", toy_last_error());
        /* the escaped text the model sees */
        char esc[64] = "\xe2\x96\x81";
        size_t o = 3;
        for (const char *p = cases[c]; *p; p++) {
            if (*p == ' ') { memcpy(esc + o, "\xe2\x96\x81", 3); o += 3; }
            else esc[o++] = *p;
        }
        double want = brute(pieces + 3, scores + 3, np - 3, esc, o);
        double got = 0;
        size_t covered = 0;
        for (int64_t i = 0; i < t.n; i++) {
            got += scores[t.ids[i]];
            covered += strlen(pieces[t.ids[i]]);
        }
        cr_expect_eq(covered, o, "%s: pieces cover the text", cases[c]);
        cr_expect(fabs(got - want) < 1e-5, "%s: score %g, optimum %g", cases[c], got, want);
        char *dec;
        cr_assert_eq(toy_tokenizer_decode(tok, t.ids, t.n, 0, &dec, NULL), TOY_OK);
        cr_expect_str_eq(dec, cases[c]);
        free(dec);
    }
    /* an unknown character: one <unk> for a run */
    t.n = 0;
    cr_assert_eq(toy_tokenizer_encode(tok, "abzzcd", 6, 0, &t), TOY_OK);
    int unks = 0;
    for (int64_t i = 0; i < t.n; i++) unks += t.ids[i] == 0;
    cr_expect_eq(unks, 1);
    toy_tokens_free(&t);
    toy_tokenizer_free(tok);
}

/* SentencePiece without the dummy prefix, and texts shorter than one U+2581 */
Test(tokenizer, spm_short_texts_and_no_prefix) {
    static const char *const pieces[] = {"<unk>", "<s>", "</s>", "a", "b", "ab", "\xe2\x96\x81", "\xe2\x96\x81\x61",
                                         "<0x63>"};
    static const float scores[] = {0, 0, 0, -1, -1, -0.5f, -1, -0.2f, 0};
    struct toy_tokenizer_spec spec = {.kind = TOY_TOKENIZER_SPM, .n_tokens = 9, .tokens = pieces, .scores = scores,
                                      .bos = 1, .eos = 2, .unk = 0, .pad = -1, .eot = -1, .add_space_prefix = false};
    struct toy_tokenizer *tok = NULL;
    MUST(toy_tokenizer_init(&spec, &tok));
    cr_expect_eq(toy_tokenizer_token_type(tok, 8), TOY_TOKEN_BYTE);
    struct toy_tokens t = {0};
    const char *cases[] = {"a", "ab", "b a", "c", "a ab", "", "  "};
    const int32_t want[][4] = {{3}, {5}, {4, 7}, {8}, {3, 7, 4}, {0}, {6, 6}};
    const int nwant[] = {1, 1, 2, 1, 3, 0, 2};
    for (int c = 0; c < 7; c++) {
        t.n = 0;
        MUST(toy_tokenizer_encode(tok, cases[c], strlen(cases[c]), 0, &t));
        cr_expect_eq(t.n, nwant[c], "'%s': %lld tokens", cases[c], (long long)t.n);
        for (int i = 0; i < nwant[c] && i < t.n; i++) cr_expect_eq(t.ids[i], want[c][i], "'%s' token %d", cases[c], i);
        char *dec;
        MUST(toy_tokenizer_decode(tok, t.ids, t.n, 0, &dec, NULL));
        cr_expect_str_eq(dec, cases[c]);
        free(dec);
    }
    toy_tokens_free(&t);
    toy_tokenizer_free(tok);
}

/* A Llama-2-style tokenizer.json (BPE + byte_fallback, Prepend/Replace
 * normalizer): Hugging Face merges by pair rank, so "▁ab" is unreachable when
 * no merge makes it from "▁" + "ab", where SentencePiece would merge by score. */
Test(tokenizer, hf_byte_fallback_bpe_merges_by_rank) {
    const char *j =
        "{\"added_tokens\": [{\"id\": 0, \"content\": \"<unk>\", \"special\": true},"
        " {\"id\": 1, \"content\": \"<s>\", \"special\": true}, {\"id\": 2, \"content\": \"</s>\", \"special\": true}],"
        " \"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Prepend\", \"prepend\": \"\u2581\"},"
        "   {\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": \"\u2581\"}]},"
        " \"pre_tokenizer\": null,"
        " \"model\": {\"type\": \"BPE\", \"unk_token\": \"<unk>\", \"fuse_unk\": true, \"byte_fallback\": true,"
        "   \"vocab\": {\"<unk>\": 0, \"<s>\": 1, \"</s>\": 2, \"<0xC3>\": 3, \"<0xA9>\": 4, \"\u2581\": 5, \"a\": 6,"
        "     \"b\": 7, \"c\": 8, \"ab\": 9, \"bc\": 10, \"\u2581a\": 11, \"\u2581ab\": 12},"
        "   \"merges\": [\"b c\", \"a b\", \"\u2581 a\", \"\u2581a b\"]}}";
    struct toy_tokenizer *tok = NULL;
    MUST(toy_tokenizer_load_hf_mem(j, strlen(j), NULL, 0, &tok));
    cr_expect_eq(toy_tokenizer_kind(tok), TOY_TOKENIZER_SPM);
    cr_expect_eq(toy_tokenizer_unk(tok), 0);
    cr_expect_eq(toy_tokenizer_token_type(tok, 3), TOY_TOKEN_BYTE);
    struct {
        const char *text;
        unsigned flags;
        int32_t want[6];
        int n;
    } cases[] = {
        {"ab", 0, {5, 9}, 2},          /* ab first (rank 1), then no merge for (▁, ab) */
        {"abc", 0, {11, 10}, 2},       /* bc (rank 0), then ▁a (rank 2) */
        {"a b", 0, {11, 5, 7}, 3},
        {"\xc3\xa9", 0, {5, 3, 4}, 3},  /* é: byte fallback */
        {"xx", 0, {5, 0}, 2},          /* unknown run: one fused <unk> */
        {"a<s>b", TOY_ENCODE_PARSE_SPECIAL, {11, 1, 5, 7}, 4}, /* Prepend: every fragment gets ▁ */
    };
    struct toy_tokens t = {0};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        t.n = 0;
        MUST(toy_tokenizer_encode(tok, cases[c].text, strlen(cases[c].text), cases[c].flags, &t));
        bool ok = t.n == cases[c].n;
        for (int i = 0; ok && i < cases[c].n; i++) ok = t.ids[i] == cases[c].want[i];
        cr_expect(ok, "'%s': got %lld ids starting %d", cases[c].text, (long long)t.n, t.n ? t.ids[0] : -1);
    }
    char *d;
    t.n = 0;
    MUST(toy_tokenizer_encode(tok, "abc a", 5, 0, &t));
    MUST(toy_tokenizer_decode(tok, t.ids, t.n, 0, &d, NULL));
    cr_expect_str_eq(d, "abc a");
    free(d);
    cr_expect_lt(toy_tokenizer_score(tok, 10), 0.0f, "merged pieces get rank-derived scores");
    toy_tokens_free(&t);
    toy_tokenizer_free(tok);
}

/* tokenizer.json added tokens with lstrip/rstrip swallow the whitespace beside them */
Test(tokenizer, added_token_lstrip_rstrip) {
    const char *j =
        "{\"added_tokens\": [{\"id\": 3, \"content\": \"<L>\", \"special\": true, \"lstrip\": true},"
        " {\"id\": 4, \"content\": \"<R>\", \"special\": false, \"rstrip\": true}],"
        " \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"use_regex\": false},"
        " \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"\u0120\": 1, \"b\": 2}, \"merges\": []}}";
    struct toy_tokenizer *tok = NULL;
    MUST(toy_tokenizer_load_hf_mem(j, strlen(j), NULL, 0, &tok));
    struct toy_tokens t = {0};
    MUST(toy_tokenizer_encode(tok, "a  <L> b", 8, TOY_ENCODE_PARSE_SPECIAL, &t));
    const int32_t w1[] = {0, 3, 1, 2};
    cr_expect(t.n == 4 && !memcmp(t.ids, w1, sizeof w1), "lstrip: %lld ids", (long long)t.n);
    t.n = 0;
    MUST(toy_tokenizer_encode(tok, "a <R>  b", 8, 0, &t)); /* user-defined: matched without PARSE_SPECIAL */
    const int32_t w2[] = {0, 1, 4, 2};
    cr_expect(t.n == 4 && !memcmp(t.ids, w2, sizeof w2), "rstrip: %lld ids", (long long)t.n);
    toy_tokens_free(&t);
    toy_tokenizer_free(tok);
}

/* llama.cpp also ends generation at the fill-in-the-middle pad, repo and
 * file-separator tokens, and makes every FIM token CONTROL: StarCoder's
 * <fim_pad> and SmolLM2's <reponame> ended nothing in toy. With
 * o200k harmony's <|return|> and <|call|>, <|end|> does not end it. */
Test(tokenizer, eog_fim_and_harmony_as_llama_cpp) {
    need(TD "llamacpp-vocab-gguf/ggml-vocab-starcoder.gguf");
    struct toy_tokenizer *tok = NULL;
    MUST(toy_tokenizer_load(TD "llamacpp-vocab-gguf/ggml-vocab-starcoder.gguf", &tok));
    int32_t pad = toy_tokenizer_find(tok, "<fim_pad>", 9), pre = toy_tokenizer_find(tok, "<fim_prefix>", 12);
    cr_assert(pad >= 0 && pre >= 0, "%d %d", (int)pad, (int)pre);
    cr_expect(toy_tokenizer_is_eog(tok, pad), "<fim_pad> (%d)", (int)pad);
    cr_expect(!toy_tokenizer_is_eog(tok, pre), "<fim_prefix> (%d) starts a prompt", (int)pre);
    cr_expect_eq(toy_tokenizer_token_type(tok, pre), TOY_TOKEN_CONTROL);
    toy_tokenizer_free(tok);
    need(TD "tokenizer-smollm2/tokenizer.json");
    MUST(toy_tokenizer_load(TD "tokenizer-smollm2/tokenizer.json", &tok));
    int32_t rep = toy_tokenizer_find(tok, "<reponame>", 10), fname = toy_tokenizer_find(tok, "<filename>", 10);
    cr_assert(rep >= 0 && fname >= 0);
    cr_expect(toy_tokenizer_is_eog(tok, rep), "<reponame> (%d)", (int)rep);
    cr_expect(!toy_tokenizer_is_eog(tok, fname));
    cr_expect(toy_tokenizer_is_eog(tok, toy_tokenizer_find(tok, "<|im_end|>", 10)));
    toy_tokenizer_free(tok);
    const char *toks[] = {"a", "<|end|>", "<|return|>", "<|call|>"};
    struct toy_tokenizer_spec spec = {.kind = TOY_TOKENIZER_BPE, .n_tokens = 4, .tokens = toks, .bos = -1,
                                      .eos = 2, .unk = -1, .pad = -1, .eot = -1};
    MUST(toy_tokenizer_init(&spec, &tok));
    cr_expect(!toy_tokenizer_is_eog(tok, 1), "<|end|> beside <|return|> and <|call|>");
    cr_expect(toy_tokenizer_is_eog(tok, 2) && toy_tokenizer_is_eog(tok, 3) && !toy_tokenizer_is_eog(tok, 0));
    toy_tokenizer_free(tok);
    { /* gpt-oss's message markers decode as text (a reply shows its channels), its ends do not */
        const char *h[] = {"a", "<|end|>", "<|return|>", "<|call|>", "<|channel|>", "<|message|>"};
        int32_t ty[] = {TOY_TOKEN_NORMAL, TOY_TOKEN_CONTROL, TOY_TOKEN_CONTROL, TOY_TOKEN_CONTROL, TOY_TOKEN_CONTROL,
                        TOY_TOKEN_CONTROL};
        struct toy_tokenizer_spec hs = {.kind = TOY_TOKENIZER_BPE, .n_tokens = 6, .tokens = h, .types = ty, .bos = -1,
                                        .eos = 2, .unk = -1, .pad = -1, .eot = -1};
        MUST(toy_tokenizer_init(&hs, &tok));
        int32_t ids[] = {4, 0, 5, 0, 1, 2};
        char *text;
        MUST(toy_tokenizer_decode(tok, ids, 6, TOY_DECODE_SKIP_SPECIAL, &text, NULL));
        cr_expect_str_eq(text, "<|channel|>a<|message|>a<|end|>");
        free(text);
        toy_tokenizer_free(tok);
    }
    /* nor from a GGUF, which guesses an end-of-turn token when it names none (<|end|> would be one), or names
     * <|end|> so: a gpt-oss reply went on past its analysis message only with these */
    th_mkdir("harmony-eog");
    char path[300];
    snprintf(path, sizeof path, "%s/t.gguf", th_dir);
    for (int eot = -1; eot <= 1; eot += 2) {
        spec.eot = eot;
        MUST(toy_tokenizer_init(&spec, &tok));
        struct toy_gguf_writer *w;
        MUST(toy_gguf_writer_init(&w));
        MUST(toy_gguf_writer_set_str(w, "general.architecture", "gpt-oss"));
        MUST(toy_tokenizer_write_gguf(tok, w));
        MUST(toy_gguf_writer_write(w, path));
        toy_gguf_writer_free(w);
        toy_tokenizer_free(tok);
        MUST(toy_tokenizer_load_gguf_file(path, &tok));
        cr_expect(!toy_tokenizer_is_eog(tok, 1), "<|end|> from a GGUF (eot %d)", eot);
        cr_expect(toy_tokenizer_is_eog(tok, 2) && toy_tokenizer_is_eog(tok, 3));
        toy_tokenizer_free(tok);
    }
    th_rmdir();
    spec.eot = -1;
    spec.n_tokens = 3; /* no <|call|>: <|end|> ends generation */
    MUST(toy_tokenizer_init(&spec, &tok));
    cr_expect(toy_tokenizer_is_eog(tok, 1));
    toy_tokenizer_free(tok);
}

/* ---- malformed vocabularies ---- */

Test(tokenizer, malformed_vocabularies) {
    struct toy_tokenizer *tok = NULL;
    const char *toks[] = {"a", "b", "ab"};
    const char *bad_merge[] = {"a c"};
    struct toy_tokenizer_spec spec = {.kind = TOY_TOKENIZER_BPE, .n_tokens = 3, .tokens = toks, .n_merges = 1,
                                      .merges = bad_merge, .bos = -1, .eos = -1, .unk = -1, .pad = -1, .eot = -1};
    cr_expect_eq(toy_tokenizer_init(&spec, &tok), TOY_ERR_FORMAT);
    cr_expect(strstr(toy_last_error(), "merge 0"), "%s", toy_last_error());
    cr_expect_null(tok);
    const char *unmergeable[] = {"b a"};
    spec.merges = unmergeable;
    cr_expect_eq(toy_tokenizer_init(&spec, &tok), TOY_ERR_FORMAT);
    cr_expect(strstr(toy_last_error(), "'ba'"), "%s", toy_last_error());
    spec.merges = NULL;
    spec.n_merges = 0;
    spec.bos = 7;
    cr_expect_eq(toy_tokenizer_init(&spec, &tok), TOY_ERR_RANGE);
    spec.bos = -1;
    int32_t types[] = {1, 1, 99};
    spec.types = types;
    cr_expect_eq(toy_tokenizer_init(&spec, &tok), TOY_ERR_FORMAT);
    spec.types = NULL;
    const char *holes[] = {"a", NULL, "b"};
    spec.tokens = holes;
    cr_expect_eq(toy_tokenizer_init(&spec, &tok), TOY_ERR_FORMAT);

    /* tokenizer.json: a vocabulary with a gap, a bad merge, a non-array merge */
    const char *j1 = "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":2},\"merges\":[]},"
                     "\"pre_tokenizer\":{\"type\":\"ByteLevel\"}}";
    cr_expect_eq(toy_tokenizer_load_hf_mem(j1, strlen(j1), NULL, 0, &tok), TOY_ERR_FORMAT);
    cr_expect(strstr(toy_last_error(), "id 1"), "%s", toy_last_error());
    const char *j2 = "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1},\"merges\":[\"a q\"]},"
                     "\"pre_tokenizer\":{\"type\":\"ByteLevel\"}}";
    cr_expect_eq(toy_tokenizer_load_hf_mem(j2, strlen(j2), NULL, 0, &tok), TOY_ERR_FORMAT);
    const char *j3 = "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":-5},\"merges\":[]}}";
    cr_expect_eq(toy_tokenizer_load_hf_mem(j3, strlen(j3), NULL, 0, &tok), TOY_ERR_FORMAT);
    const char *j4 = "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1},\"merges\":[7]},"
                     "\"pre_tokenizer\":{\"type\":\"ByteLevel\"}}";
    cr_expect_eq(toy_tokenizer_load_hf_mem(j4, strlen(j4), NULL, 0, &tok), TOY_ERR_FORMAT);
    cr_expect_eq(toy_tokenizer_load_hf_mem("{\"model\":", 9, NULL, 0, &tok), TOY_ERR_FORMAT);

    /* SentencePiece protobuf: every truncation of a real file fails cleanly or loads */
    if (access(TD "tokenizer-llama2-spm/tokenizer.model", R_OK) == 0) {
        size_t len;
        char *m = slurp(TD "tokenizer-llama2-spm/tokenizer.model", &len);
        size_t cuts[] = {1, 2, 7, 100, 1000, 4097, len / 2, len - 3, len - 1};
        for (size_t c = 0; c < sizeof cuts / sizeof cuts[0]; c++) {
            enum toy_status st = toy_tokenizer_load_spm_mem(m, cuts[c], &tok);
            if (st == TOY_OK) toy_tokenizer_free(tok);
            else cr_expect(strlen(toy_last_error()) > 0);
        }
        m[5] = (char)0xff; /* a corrupt length varint */
        for (size_t k = 0; k < 8; k++) m[k] = (char)0xff;
        cr_expect_neq(toy_tokenizer_load_spm_mem(m, len, &tok), TOY_OK);
        free(m);
    }
    cr_expect_eq(toy_tokenizer_load("/nonexistent/tokenizer.json", &tok), TOY_ERR_NOT_FOUND);
}

/* A byte-level vocabulary: the 256 bytes plus the merges given. */
static struct toy_tokenizer *byte_vocab(const char *pre, const char *const *merges, int nm, bool nfc) {
    static char store[256][8];
    const char *toks[256 + 16];
    int n = 0;
    for (int b = 0; b < 256; b++) {
        /* GPT-2 byte-to-unicode */
        int cp = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174) ? b : -1;
        if (cp < 0) {
            int k = 0;
            for (int c = 0; c < b; c++)
                if (!((c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174))) k++;
            cp = 256 + k;
        }
        char *o = store[b];
        if (cp < 0x80) { o[0] = (char)cp; o[1] = 0; }
        else { o[0] = (char)(0xC0 | (cp >> 6)); o[1] = (char)(0x80 | (cp & 0x3F)); o[2] = 0; }
        toks[n++] = o;
    }
    static char merged[16][32];
    for (int m = 0; m < nm; m++) {
        const char *sp = strchr(merges[m], ' ');
        snprintf(merged[m], sizeof merged[m], "%.*s%s", (int)(sp - merges[m]), merges[m], sp + 1);
        toks[n++] = merged[m];
    }
    struct toy_tokenizer_spec spec = {.kind = TOY_TOKENIZER_BPE, .n_tokens = n, .tokens = toks, .n_merges = nm,
                                      .merges = merges, .pre = pre, .bos = -1, .eos = -1, .unk = -1, .pad = -1,
                                      .eot = -1, .nfc = nfc};
    struct toy_tokenizer *tok = NULL;
    MUST(toy_tokenizer_init(&spec, &tok));
    return tok;
}

Test(tokenizer, pretokenizer_digit_rules) {
    const char *merges[] = {"1 2", "12 3", "3 4"};
    struct toy_tokens t = {0};
    /* GPT-2 keeps digit runs together, so merges apply across them */
    struct toy_tokenizer *tok = byte_vocab("gpt-2", merges, 3, false);
    MUST(toy_tokenizer_encode(tok, "1234", 4, 0, &t));
    cr_expect_eq(t.n, 2); /* 123 4 */
    toy_tokenizer_free(tok);
    /* Llama-3 splits digits in threes: 123|4 */
    t.n = 0;
    tok = byte_vocab("llama-bpe", merges, 3, false);
    MUST(toy_tokenizer_encode(tok, "123434", 6, 0, &t));
    cr_expect_eq(t.n, 3, "123 | 4 34 -> 123, 4, 34"); /* "434": 4 + 34 */
    toy_tokenizer_free(tok);
    /* Qwen2, SmolLM and Tekken split every digit: no merge applies */
    const char *pres[] = {"qwen2", "smollm", "tekken"};
    for (int k = 0; k < 3; k++) {
        t.n = 0;
        tok = byte_vocab(pres[k], merges, 3, false);
        MUST(toy_tokenizer_encode(tok, "1234", 4, 0, &t));
        cr_expect_eq(t.n, 4, "%s", pres[k]);
        toy_tokenizer_free(tok);
    }
    /* o200k (gpt-4o) and Tekken split at a lower->upper case change: no merge across it */
    const char *case_merge[] = {"o W"};
    const char *pres2[] = {"gpt-2", "gpt-4o", "tekken"};
    for (int k = 0; k < 3; k++) {
        t.n = 0;
        tok = byte_vocab(pres2[k], case_merge, 1, false);
        MUST(toy_tokenizer_encode(tok, "HelloWorld", 10, 0, &t));
        cr_expect_eq(t.n, k == 0 ? 9 : 10, "%s", pres2[k]);
        toy_tokenizer_free(tok);
    }
    toy_tokens_free(&t);
    struct toy_tokenizer *bad = NULL;
    struct toy_tokenizer_spec spec = {.kind = TOY_TOKENIZER_BPE, .n_tokens = 1, .tokens = merges, .pre = "no-such-pre",
                                      .bos = -1, .eos = -1, .unk = -1, .pad = -1, .eot = -1};
    cr_expect_eq(toy_tokenizer_init(&spec, &bad), TOY_ERR_UNSUPPORTED);
}

Test(tokenizer, nfc_normalization) {
    struct toy_tokens a = {0}, b = {0};
    struct toy_tokenizer *tok = byte_vocab("gpt-2", NULL, 0, true);
    const char *nfd = "e\xcc\x81", *nfc = "\xc3\xa9"; /* e + combining acute, é */
    MUST(toy_tokenizer_encode(tok, nfd, strlen(nfd), 0, &a));
    MUST(toy_tokenizer_encode(tok, nfc, strlen(nfc), 0, &b));
    cr_expect_eq(a.n, 2);
    cr_expect(a.n == b.n && !memcmp(a.ids, b.ids, (size_t)a.n * 4), "NFD input is composed first");
    toy_tokenizer_free(tok);
    a.n = 0;
    tok = byte_vocab("gpt-2", NULL, 0, false);
    MUST(toy_tokenizer_encode(tok, nfd, strlen(nfd), 0, &a));
    cr_expect_eq(a.n, 3, "without NFC the combining mark stays");
    toy_tokenizer_free(tok);
    toy_tokens_free(&a);
    toy_tokens_free(&b);
}

Test(tokenizer, decode_flags_and_gpt2_streaming) {
    if (access(TD "tokenizer-gpt2/encoder.json", R_OK)) cr_skip_test("no GPT-2 data");
    struct toy_tokenizer *tok = NULL;
    MUST(toy_tokenizer_load_gpt2(TD "tokenizer-gpt2/encoder.json", TD "tokenizer-gpt2/vocab.bpe", NULL, &tok));
    const char *text = "<|endoftext|>héllo 🦙🦙 wörld";
    struct toy_tokens t = {0};
    MUST(toy_tokenizer_encode(tok, text, strlen(text), TOY_ENCODE_PARSE_SPECIAL, &t));
    cr_expect_eq(t.ids[0], 50256);
    char *d;
    MUST(toy_tokenizer_decode(tok, t.ids, t.n, 0, &d, NULL));
    cr_expect_str_eq(d, text);
    free(d);
    MUST(toy_tokenizer_decode(tok, t.ids, t.n, TOY_DECODE_SKIP_SPECIAL, &d, NULL));
    cr_expect_str_eq(d, text + strlen("<|endoftext|>"));
    free(d);
    /* streaming: every piece handed out is whole UTF-8; together they are the text */
    struct toy_decoder *dec;
    MUST(toy_decoder_init(tok, 0, &dec));
    char acc[256];
    size_t al = 0;
    for (int64_t i = 0; i < t.n; i++) {
        const char *s;
        size_t l;
        MUST(toy_decoder_push(dec, t.ids[i], &s, &l));
        for (size_t k = 0; k < l;) { /* each piece is whole UTF-8 */
            unsigned char c = (unsigned char)s[k];
            size_t cl = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
            cr_expect_leq(k + cl, l, "token %lld hands out a split character", (long long)i);
            k += cl;
        }
        memcpy(acc + al, s, l);
        al += l;
    }
    acc[al] = 0;
    cr_expect_str_eq(acc, text);
    /* a dangling lead byte comes out on flush */
    int32_t lead = toy_tokenizer_find(tok, "\xc3\xb0", 2); /* GPT-2 piece for byte 0xF0 */
    cr_assert_geq(lead, 0);
    const char *s;
    size_t l;
    MUST(toy_decoder_push(dec, lead, &s, &l));
    cr_expect_eq(l, 0);
    toy_decoder_flush(dec, &s, &l);
    cr_expect_eq(l, 1);
    cr_expect_eq((unsigned char)s[0], 0xF0);
    cr_expect_eq(toy_decoder_push(dec, -1, &s, &l), TOY_ERR_RANGE);
    toy_decoder_free(dec);
    toy_tokens_free(&t);
    toy_tokenizer_free(tok);
}

#include <pthread.h>

struct thread_job {
    const struct toy_tokenizer *tok;
    const char *text;
    size_t len;
    int64_t n;
    uint64_t sum;
};

static void *encode_job(void *p) {
    struct thread_job *j = p;
    struct toy_tokens t = {0};
    for (int r = 0; r < 3; r++) {
        t.n = 0;
        if (toy_tokenizer_encode(j->tok, j->text, j->len, 0, &t)) return NULL;
    }
    j->n = t.n;
    for (int64_t i = 0; i < t.n; i++) j->sum = j->sum * 31 + (uint64_t)t.ids[i];
    toy_tokens_free(&t);
    return NULL;
}

Test(tokenizer, concurrent_encode_is_deterministic) {
    if (access(TD "tokenizer-llama2-spm/tokenizer.model", R_OK)) cr_skip_test("no Llama-2 data");
    struct toy_tokenizer *tok = NULL;
    MUST(toy_tokenizer_load_spm(TD "tokenizer-llama2-spm/tokenizer.model", &tok));
    size_t len;
    char *text = slurp(TD "corpus-pride-and-prejudice/pg1342.txt", &len);
    if (len > 200000) len = 200000;
    struct thread_job jobs[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        jobs[i] = (struct thread_job){tok, text, len, 0, 0};
        cr_assert_eq(pthread_create(&th[i], NULL, encode_job, &jobs[i]), 0);
    }
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
    for (int i = 1; i < 4; i++) {
        cr_expect_eq(jobs[i].n, jobs[0].n);
        cr_expect_eq(jobs[i].sum, jobs[0].sum);
    }
    cr_expect_gt(jobs[0].n, 40000);
    free(text);
    toy_tokenizer_free(tok);
}

/* Unigram through tokenizer.json: save a Viterbi vocabulary, load it back */
Test(tokenizer, unigram_tokenizer_json_roundtrip) {
    static const char *const pieces[] = {"<unk>", "<s>", "</s>", "\xe2\x96\x81", "a", "b", "c", "d", "ab", "abc",
                                         "cd", "bcd", "\xe2\x96\x81\x61\x62", "da", "x"};
    static const float scores[] = {0, 0, 0, -2, -3, -3, -3, -3, -2.5f, -2, -1.5f, -4, -2.2f, -2.1f, -5};
    struct toy_tokenizer_spec spec = {.kind = TOY_TOKENIZER_UGM, .n_tokens = 15, .tokens = pieces, .scores = scores,
                                      .bos = 1, .eos = 2, .unk = 0, .pad = -1, .eot = -1, .add_space_prefix = true};
    struct toy_tokenizer *a = NULL, *b = NULL;
    MUST(toy_tokenizer_init(&spec, &a));
    char path[] = "/tmp/toy-ugm-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    close(fd);
    MUST(toy_tokenizer_save_hf(a, path));
    MUST(toy_tokenizer_load_hf(path, NULL, &b));
    unlink(path);
    cr_expect_eq(toy_tokenizer_kind(b), TOY_TOKENIZER_UGM);
    cr_expect_eq(toy_tokenizer_unk(b), 0);
    struct toy_tokens ta = {0}, tb = {0};
    const char *texts[] = {"abcd dabc", "ab cd x", "zzz"};
    for (int i = 0; i < 3; i++) {
        ta.n = tb.n = 0;
        MUST(toy_tokenizer_encode(a, texts[i], strlen(texts[i]), 0, &ta));
        MUST(toy_tokenizer_encode(b, texts[i], strlen(texts[i]), 0, &tb));
        cr_expect(ta.n == tb.n && !memcmp(ta.ids, tb.ids, (size_t)ta.n * 4), "'%s'", texts[i]);
    }
    toy_tokens_free(&ta);
    toy_tokens_free(&tb);
    toy_tokenizer_free(a);
    toy_tokenizer_free(b);
}

/* A Hugging Face SentencePiece folder: tokenizer.model + tokenizer.json
 * (added tokens) + tokenizer_config.json: the .model gives the segmentation,
 * the JSON files the extra tokens, specials and chat template. */
Test(tokenizer, hf_folder_with_sentencepiece_model) {
    if (access(TD "tokenizer-llama2-spm/tokenizer.model", R_OK)) cr_skip_test("no Llama-2 data");
    char dir[] = "/tmp/toy-spm-folder-XXXXXX";
    cr_assert(mkdtemp(dir));
    char p[512], model_abs[PATH_MAX];
    cr_assert(realpath(TD "tokenizer-llama2-spm/tokenizer.model", model_abs));
    snprintf(p, sizeof p, "%s/tokenizer.model", dir);
    cr_assert_eq(symlink(model_abs, p), 0);
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    FILE *f = fopen(p, "w");
    fputs("{\"added_tokens\": [{\"id\": 0, \"content\": \"<unk>\", \"special\": true},"
          " {\"id\": 32000, \"content\": \"<|im_start|>\", \"special\": true},"
          " {\"id\": 32001, \"content\": \"<|im_end|>\", \"special\": true}],"
          " \"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Prepend\", \"prepend\": \"\\u2581\"}]},"
          " \"pre_tokenizer\": null, \"model\": {\"type\": \"BPE\", \"byte_fallback\": true, \"vocab\": {}, \"merges\": []}}", f);
    fclose(f);
    snprintf(p, sizeof p, "%s/tokenizer_config.json", dir);
    f = fopen(p, "w");
    fputs("{\"bos_token\": \"<s>\", \"eos_token\": \"<|im_end|>\", \"add_bos_token\": true,"
          " \"chat_template\": \"{% for m in messages %}<|im_start|>{{ m.role }}{% endfor %}\"}", f);
    fclose(f);
    struct toy_tokenizer *tok = NULL;
    MUST(toy_tokenizer_load(dir, &tok));
    cr_expect_eq(toy_tokenizer_n_vocab(tok), 32002);
    cr_expect_eq(toy_tokenizer_kind(tok), TOY_TOKENIZER_SPM);
    cr_expect_eq(toy_tokenizer_bos(tok), 1);
    cr_expect_eq(toy_tokenizer_eos(tok), 32001);
    cr_expect_eq(toy_tokenizer_eot(tok), 32001);
    cr_expect_not_null(toy_tokenizer_chat_template(tok));
    cr_expect_lt(toy_tokenizer_score(tok, 1000), 0.0f, "scores come from the .model");
    int n, rt;
    int pass = check_jsonl(tok, TD "tokenizer-llama2-spm/expected.jsonl", 0, "ids", &n, &rt);
    cr_expect_eq(pass, n, "the folder tokenizes as sentencepiece: %d/%d", pass, n);
    struct toy_tokens t = {0};
    MUST(toy_tokenizer_encode(tok, "<|im_start|>user", 16, TOY_ENCODE_PARSE_SPECIAL | TOY_ENCODE_MODEL_DEFAULTS, &t));
    cr_expect_eq(t.ids[0], 1);
    cr_expect_eq(t.ids[1], 32000);
    toy_tokens_free(&t);
    toy_tokenizer_free(tok);
    snprintf(p, sizeof p, "rm -rf %s", dir);
    cr_expect_eq(system(p), 0);
}

/* A SentencePiece ModelProto written by hand: Unigram (trainer_spec.model_type
 * = 1), add_dummy_prefix = false, unk id 0; exercises the .model parser on the
 * fields Llama-2's file does not set. */
static size_t pb_varint(unsigned char *o, uint64_t v) {
    size_t n = 0;
    do {
        o[n++] = (unsigned char)((v & 0x7F) | (v > 0x7F ? 0x80 : 0));
        v >>= 7;
    } while (v);
    return n;
}

static size_t pb_piece(unsigned char *o, const char *piece, float score, int type) {
    unsigned char body[128];
    size_t b = 0, l = strlen(piece);
    body[b++] = 0x0A; /* field 1, bytes */
    b += pb_varint(body + b, l);
    memcpy(body + b, piece, l);
    b += l;
    body[b++] = 0x15; /* field 2, fixed32 */
    memcpy(body + b, &score, 4);
    b += 4;
    body[b++] = 0x18; /* field 3, varint */
    b += pb_varint(body + b, (uint64_t)type);
    size_t n = 0;
    o[n++] = 0x0A; /* ModelProto field 1 */
    n += pb_varint(o + n, b);
    memcpy(o + n, body, b);
    return n + b;
}

Test(tokenizer, sentencepiece_unigram_model_proto) {
    unsigned char m[1024];
    size_t n = 0;
    n += pb_piece(m + n, "<unk>", 0, 2);
    n += pb_piece(m + n, "<s>", 0, 3);
    n += pb_piece(m + n, "</s>", 0, 3);
    const char *pieces[] = {"a", "b", "c", "ab", "bc", "abc", "\xe2\x96\x81"};
    const float scores[] = {-3, -3, -3, -2.5f, -1, -4, -2};
    for (int i = 0; i < 7; i++) n += pb_piece(m + n, pieces[i], scores[i], 1);
    /* trainer_spec { model_type: UNIGRAM (field 3) unk_id 0 (40) bos 1 (41) eos 2 (42) } */
    unsigned char ts[] = {0x18, 0x01, 0xC0, 0x02, 0x00, 0xC8, 0x02, 0x01, 0xD0, 0x02, 0x02};
    m[n++] = 0x12;
    n += pb_varint(m + n, sizeof ts);
    memcpy(m + n, ts, sizeof ts);
    n += sizeof ts;
    /* normalizer_spec { add_dummy_prefix: false (field 3) } */
    unsigned char ns[] = {0x18, 0x00};
    m[n++] = 0x1A;
    n += pb_varint(m + n, sizeof ns);
    memcpy(m + n, ns, sizeof ns);
    n += sizeof ns;
    struct toy_tokenizer *tok = NULL;
    MUST(toy_tokenizer_load_spm_mem(m, n, &tok));
    cr_expect_eq(toy_tokenizer_kind(tok), TOY_TOKENIZER_UGM);
    cr_expect_eq(toy_tokenizer_n_vocab(tok), 10);
    cr_expect_eq(toy_tokenizer_unk(tok), 0);
    cr_expect_eq(toy_tokenizer_token_type(tok, 1), TOY_TOKEN_CONTROL);
    struct toy_tokens t = {0};
    /* "abc": a + bc = -4 beats ab + c = -5.5 and abc = -4 ties -> first best kept */
    MUST(toy_tokenizer_encode(tok, "abc", 3, 0, &t));
    cr_expect(t.n >= 1);
    double total = 0;
    for (int64_t i = 0; i < t.n; i++) total += toy_tokenizer_score(tok, t.ids[i]);
    cr_expect_float_eq(total, -4.0, 1e-6, "the optimum scores -4");
    /* no dummy prefix: "b" is one piece; with a space the ▁ piece appears */
    t.n = 0;
    MUST(toy_tokenizer_encode(tok, "b", 1, 0, &t));
    cr_expect_eq(t.n, 1);
    cr_expect_eq(t.ids[0], 4);
    t.n = 0;
    MUST(toy_tokenizer_encode(tok, "a b", 3, 0, &t));
    cr_expect_eq(t.n, 3);
    cr_expect_eq(t.ids[1], 9);
    toy_tokens_free(&t);
    toy_tokenizer_free(tok);
    /* a piece with a truncated length */
    m[1] = 0x7F;
    cr_expect_eq(toy_tokenizer_load_spm_mem(m, 20, &tok), TOY_ERR_FORMAT);
}

/* toy_utf8_valid / toy_utf8_clean: what a JSON writer may pass on */
Test(tokenizer, utf8_check_and_repair) {
    struct {
        const char *in;
        size_t n;
        bool valid;
        const char *clean;
    } c[] = {
        {"plain", 5, true, "plain"},
        {"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", 14, true, "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"},
        {"a\xc3", 2, false, "a\xef\xbf\xbd"},                                 /* cut off */
        {"\xc0\xaf", 2, false, "\xef\xbf\xbd\xef\xbf\xbd"},                       /* overlong '/' */
        {"\xed\xa0\x80x", 4, false, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbdx"},         /* a surrogate */
        {"\xf4\x90\x80\x80", 4, false, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"}, /* past U+10FFFF */
        {"\x80z", 2, false, "\xef\xbf\xbdz"},                                  /* a lone continuation */
        {"a\0b", 3, true, "a\0b"},                                          /* NUL is a character */
        /* one U+FFFD for a character cut off, however much of it is there (Python's errors="replace") */
        {"\xe2\x82", 2, false, "\xef\xbf\xbd"},
        {"\xf0\x9f\x98x", 4, false, "\xef\xbf\xbdx"},
        {"\xe0\x80\xaf", 3, false, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"}, /* overlong: no start of a character */
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        cr_expect_eq(toy_utf8_valid(c[i].in, c[i].n), c[i].valid, "case %zu", i);
        size_t n = 0;
        char *o = toy_utf8_clean(c[i].in, c[i].n, &n);
        cr_assert(o);
        size_t want = i == 7 ? 3 : strlen(c[i].clean);
        cr_expect_eq(n, want, "case %zu: length %zu", i, n);
        cr_expect(!memcmp(o, c[i].clean, want), "case %zu", i);
        cr_expect(toy_utf8_valid(o, n), "case %zu: the repair is valid", i);
        /* characters of the repaired text, counted on the original */
        size_t chars = 0;
        for (size_t k = 0; k < n; k++) chars += ((unsigned char)o[k] & 0xC0) != 0x80;
        cr_expect_eq(toy_utf8_chars(c[i].in, c[i].n), chars, "case %zu", i);
        free(o);
    }
}

/* A continuation keeps the dummy-prefix space of its first token ("Hello" + " world"); a text of its own, or
 * one after nothing but control tokens, starts without it */
Test(tokenizer, streaming_decode_continues_a_prompt) {
    need(TD "tokenizer-llama2-spm/tokenizer.model");
    struct toy_tokenizer *tok = NULL;
    MUST(toy_tokenizer_load_spm(TD "tokenizer-llama2-spm/tokenizer.model", &tok));
    struct toy_tokens p = {0}, w = {0};
    MUST(toy_tokenizer_encode(tok, "Hello", 5, TOY_ENCODE_ADD_BOS, &p));
    MUST(toy_tokenizer_encode(tok, "world", 5, 0, &w)); /* "▁world" */
    cr_assert_eq(w.n, 1);
    const char *want[3] = {" world", "world", "world"};
    for (int c = 0; c < 3; c++) {
        struct toy_decoder *d;
        MUST(toy_decoder_init(tok, TOY_DECODE_SKIP_SPECIAL, &d));
        if (c == 0) toy_decoder_continue(d, p.ids, p.n);
        if (c == 2) toy_decoder_continue(d, p.ids, 1); /* BOS alone: nothing to continue */
        const char *s;
        size_t l;
        MUST(toy_decoder_push(d, w.ids[0], &s, &l));
        cr_expect(l == strlen(want[c]) && !memcmp(s, want[c], l), "case %d: '%.*s'", c, (int)l, s);
        toy_decoder_free(d);
    }
    toy_tokens_free(&p);
    toy_tokens_free(&w);
    toy_tokenizer_free(tok);
}

/* Llama 3's tokenizer.json puts its BOS in a TemplateProcessing inside a Sequence of post-processors, with no
 * add_bos_token in tokenizer_config.json: the BOS is added, as Hugging Face adds it */
Test(tokenizer, bos_from_a_template_processing_in_a_sequence) {
    need(TD "tokenizer-llama3/tokenizer.json");
    json_t *t = json_load_file(TD "tokenizer-llama3/tokenizer.json", 0, NULL);
    cr_assert(t);
    json_t *bos = json_pack("{s:{s:s,s:i}}", "SpecialToken", "id", "<|begin_of_text|>", "type_id", 0);
    json_t *seq = json_pack("{s:{s:s,s:i}}", "Sequence", "id", "A", "type_id", 0);
    json_t *tp = json_pack("{s:s,s:[o,o]}", "type", "TemplateProcessing", "single", bos, seq);
    json_object_set_new(t, "post_processor",
                        json_pack("{s:s,s:[{s:s},o]}", "type", "Sequence", "processors", "type", "ByteLevel", tp));
    char dir[] = "/tmp/toy-tok-tp-XXXXXX", path[64];
    cr_assert(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    cr_assert_eq(json_dump_file(t, path, 0), 0);
    json_decref(t);
    struct toy_tokenizer *tok;
    MUST(toy_tokenizer_load(dir, &tok));
    cr_expect(toy_tokenizer_add_bos(tok));
    cr_expect_eq(toy_tokenizer_bos(tok), 128000);
    toy_tokenizer_free(tok);
    unlink(path);
    rmdir(dir);
}
