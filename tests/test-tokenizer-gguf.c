/* test-tokenizer-gguf.c: tokenizers loaded from GGUF metadata (llama.cpp's
 * vocab-only GGUFs against llama.cpp's and HF's ids), the GGUF metadata
 * round trip (write, read back, same ids), and malformed tokenizer metadata.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "toy/gguf.h"
#include "toy/tokenizer.h"

#define TD "../shared/testdata/"
#define VG TD "llamacpp-vocab-gguf/"
#define MUST(call) cr_assert_eq((call), TOY_OK, "%s: %s", #call, toy_last_error())

static void need(const char *path) {
    if (access(path, R_OK) != 0) cr_skip_test("test data %s is absent", path);
}

static int64_t read_ids(const char *line, int32_t *ids, int64_t cap) {
    int64_t n = 0;
    for (const char *q = line; *q && n < cap;) {
        char *end;
        long v = strtol(q, &end, 10);
        if (end == q) break;
        ids[n++] = (int32_t)v;
        q = *end == ',' ? end + 1 : end;
    }
    return n;
}

static bool same(const struct toy_tokens *t, const int32_t *w, int64_t n) {
    if (t->n != n) return false;
    for (int64_t i = 0; i < n; i++)
        if (t->ids[i] != w[i]) return false;
    return true;
}

/* expected_261_llamacpp/<name>.jsonl: {"text", "ids"} per line. */
static int check_261(const struct toy_tokenizer *tok, const char *path, int *total) {
    FILE *f = fopen(path, "r");
    cr_assert(f, "%s", path);
    char *line = NULL;
    size_t cap = 0;
    int pass = 0, n = 0;
    struct toy_tokens t = {0};
    static int32_t want[8192];
    while (getline(&line, &cap, f) > 0) {
        json_error_t e;
        json_t *o = json_loads(line, 0, &e);
        if (!o) continue;
        json_t *jt = json_object_get(o, "text"), *ids = json_object_get(o, "ids");
        int64_t nw = (int64_t)json_array_size(ids);
        for (int64_t i = 0; i < nw; i++) want[i] = (int32_t)json_integer_value(json_array_get(ids, (size_t)i));
        t.n = 0;
        MUST(toy_tokenizer_encode(tok, json_string_value(jt), json_string_length(jt), 0, &t));
        n++;
        if (same(&t, want, nw)) pass++;
        else if (n - pass <= 3) {
            fprintf(stderr, "%s: \"%.50s\"\n  got :", path, json_string_value(jt));
            for (int64_t i = 0; i < t.n && i < 30; i++) fprintf(stderr, " %d", t.ids[i]);
            fprintf(stderr, "\n  want:");
            for (int64_t i = 0; i < nw && i < 30; i++) fprintf(stderr, " %d", want[i]);
            fprintf(stderr, "\n");
        }
        json_decref(o);
    }
    free(line);
    fclose(f);
    toy_tokens_free(&t);
    *total = n;
    return pass;
}

static int check_inp_out(const struct toy_tokenizer *tok, const char *inp, const char *outp, int *total) {
    FILE *fi = fopen(inp, "rb"), *fo = fopen(outp, "r");
    cr_assert(fi && fo);
    fseek(fi, 0, SEEK_END);
    long il = ftell(fi);
    rewind(fi);
    char *in = malloc((size_t)il + 1);
    cr_assert_eq(fread(in, 1, (size_t)il, fi), (size_t)il);
    in[il] = 0;
    fclose(fi);
    const char *sep = "\n__ggml_vocab_test__\n";
    char *line = NULL;
    size_t cap = 0;
    int pass = 0, n = 0;
    struct toy_tokens t = {0};
    static int32_t want[8192];
    for (char *p = in, *e; (e = strstr(p, sep)); p = e + strlen(sep)) {
        cr_assert(getline(&line, &cap, fo) > 0, "%s: fewer lines than texts", outp);
        int64_t nw = read_ids(line, want, 8192);
        t.n = 0;
        MUST(toy_tokenizer_encode(tok, p, (size_t)(e - p), 0, &t));
        n++;
        if (same(&t, want, nw)) pass++;
        else if (n - pass <= 3) fprintf(stderr, "%s: text %d differs\n", inp, n);
    }
    free(line);
    free(in);
    fclose(fo);
    toy_tokens_free(&t);
    *total = n;
    return pass;
}

static void vocab_case(const char *name, bool has_pairs) {
    char path[512], exp[512], inp[512], out[512];
    snprintf(path, sizeof path, VG "ggml-vocab-%s.gguf", name);
    need(path);
    struct toy_tokenizer *tok = NULL;
    MUST(toy_tokenizer_load(path, &tok));
    snprintf(exp, sizeof exp, VG "expected_261_llamacpp/ggml-vocab-%s.jsonl", name);
    int n, pass = check_261(tok, exp, &n);
    fprintf(stderr, "%s.gguf vs llama.cpp (261 strings): %d/%d\n", name, pass, n);
    cr_expect_eq(n, 261);
    cr_expect_eq(pass, n, "%s: %d/%d", name, pass, n);
    if (has_pairs) {
        snprintf(inp, sizeof inp, VG "ggml-vocab-%s.gguf.inp", name);
        snprintf(out, sizeof out, VG "ggml-vocab-%s.gguf.out", name);
        pass = check_inp_out(tok, inp, out, &n);
        fprintf(stderr, "%s.gguf .inp/.out: %d/%d\n", name, pass, n);
        cr_expect_eq(pass, n, "%s .inp/.out: %d/%d", name, pass, n);
    }
    toy_tokenizer_free(tok);
}

Test(tokenizer_gguf, gpt2) { vocab_case("gpt-2", true); }
Test(tokenizer_gguf, llama_spm) { vocab_case("llama-spm", true); }
Test(tokenizer_gguf, phi3) { vocab_case("phi-3", true); }
Test(tokenizer_gguf, starcoder) { vocab_case("starcoder", true); }
Test(tokenizer_gguf, gpt_neox) { vocab_case("gpt-neox", false); }
Test(tokenizer_gguf, mpt) { vocab_case("mpt", true); }

Test(tokenizer_gguf, metadata) {
    need(VG "ggml-vocab-llama-spm.gguf");
    struct toy_tokenizer *tok = NULL;
    MUST(toy_tokenizer_load(VG "ggml-vocab-phi-3.gguf", &tok));
    cr_expect_eq(toy_tokenizer_kind(tok), TOY_TOKENIZER_SPM);
    cr_expect_eq(toy_tokenizer_n_vocab(tok), 32064);
    cr_expect_eq(toy_tokenizer_bos(tok), 1);
    cr_expect_eq(toy_tokenizer_eos(tok), 32000);
    cr_expect_eq(toy_tokenizer_pad(tok), 32000);
    cr_expect(toy_tokenizer_add_bos(tok));
    cr_expect_not_null(toy_tokenizer_chat_template(tok));
    toy_tokenizer_free(tok);
    /* the tiny model GGUF carries the full Llama-2 vocabulary */
    if (access(TD "model-gguf-llama2-tiny-random/llama-2-tiny-random.gguf", R_OK) == 0) {
        MUST(toy_tokenizer_load(TD "model-gguf-llama2-tiny-random/llama-2-tiny-random.gguf", &tok));
        struct toy_tokens t = {0};
        MUST(toy_tokenizer_encode(tok, "Once upon a time", 16, TOY_ENCODE_MODEL_DEFAULTS, &t));
        const int32_t want[] = {1, 9038, 2501, 263, 931};
        cr_expect(same(&t, want, 5));
        toy_tokens_free(&t);
        toy_tokenizer_free(tok);
    }
}

/* Third-party vocab GGUFs: each loads, or fails with a message. */
Test(tokenizer_gguf, third_party_files) {
    need(TD "gguf-testvectors/valid/gridcore-runner__vocab-spm.gguf");
    static const char *const files[] = {
        "gridcore-runner__vocab-bpe-gpt4o.gguf", "gridcore-runner__vocab-bpe-llama3.gguf",
        "gridcore-runner__vocab-bpe-qwen2.gguf", "gridcore-runner__vocab-bpe-qwen35.gguf",
        "gridcore-runner__vocab-bpe-smollm.gguf", "gridcore-runner__vocab-bpe-spm-gemma4.gguf",
        "gridcore-runner__vocab-spm.gguf", "gridcore-runner__vocab-spm-zeroscores.gguf",
        "bitnet-rs__corrupted-embedded-tokenizer.gguf", "bitnet-rs__llama2-32k.gguf",
    };
    int loaded = 0;
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char path[512];
        snprintf(path, sizeof path, TD "gguf-testvectors/valid/%s", files[i]);
        struct toy_tokenizer *tok = NULL;
        enum toy_status st = toy_tokenizer_load(path, &tok);
        fprintf(stderr, "%s: %s%s\n", files[i], st ? "error: " : "ok", st ? toy_last_error() : "");
        if (st) {
            cr_expect_gt(strlen(toy_last_error()), 0);
            continue;
        }
        loaded++;
        struct toy_tokens t = {0};
        MUST(toy_tokenizer_encode(tok, "Hello world 123 ünïcödé", 25, 0, &t));
        char *d;
        MUST(toy_tokenizer_decode(tok, t.ids, t.n, 0, &d, NULL));
        free(d);
        toy_tokens_free(&t);
        toy_tokenizer_free(tok);
    }
    cr_expect_geq(loaded, 6);
}

/* write -> read -> same ids on every test string */
static void roundtrip(struct toy_tokenizer *a, unsigned flags, size_t allowed) {
    struct toy_gguf_writer *w;
    MUST(toy_gguf_writer_init(&w));
    MUST(toy_tokenizer_write_gguf(a, w));
    void *buf;
    size_t size;
    MUST(toy_gguf_writer_write_memory(w, &buf, &size));
    toy_gguf_writer_free(w);
    struct toy_gguf *g;
    MUST(toy_gguf_open_memory(buf, size, "roundtrip", &g));
    struct toy_tokenizer *b = NULL;
    MUST(toy_tokenizer_load_gguf(g, &b));
    cr_assert_eq(toy_tokenizer_n_vocab(a), toy_tokenizer_n_vocab(b));
    /* a BPE tokenizer without BOS is written with its EOS as BOS (GPT-2's convention): llama.cpp would take
     * token 11 (SmolLM2's <jupyter_start>) for a missing one */
    bool eos_as_bos = toy_tokenizer_bos(a) < 0 && toy_tokenizer_kind(a) == TOY_TOKENIZER_BPE;
    cr_expect_eq(toy_tokenizer_bos(b), eos_as_bos ? toy_tokenizer_eos(a) : toy_tokenizer_bos(a));
    cr_expect_eq(toy_tokenizer_eos(a), toy_tokenizer_eos(b));
    cr_expect_eq(toy_tokenizer_add_bos(a), toy_tokenizer_add_bos(b));
    json_error_t e;
    json_t *strs = json_load_file(TD "tokenizer-test-strings/test_strings.json", 0, &e);
    cr_assert(strs);
    struct toy_tokens ta = {0}, tb = {0};
    size_t i, diff = 0;
    json_t *v;
    json_array_foreach(strs, i, v) {
        ta.n = tb.n = 0;
        MUST(toy_tokenizer_encode(a, json_string_value(v), json_string_length(v), flags, &ta));
        MUST(toy_tokenizer_encode(b, json_string_value(v), json_string_length(v), flags, &tb));
        if (!same(&ta, tb.ids, tb.n)) {
            diff++;
            fprintf(stderr, "GGUF round trip (%s): \"%s\" differs\n", toy_tokenizer_pre(a), json_string_value(v));
        }
    }
    cr_expect_eq(diff, allowed, "%zu strings encode differently after the GGUF round trip", diff);
    json_decref(strs);
    toy_tokens_free(&ta);
    toy_tokens_free(&tb);
    toy_tokenizer_free(b);
    toy_gguf_close(g);
    free(buf);
}

Test(tokenizer_gguf, write_read_roundtrip) {
    need(TD "tokenizer-gpt2/encoder.json");
    struct toy_tokenizer *tok = NULL;
    MUST(toy_tokenizer_load_gpt2(TD "tokenizer-gpt2/encoder.json", TD "tokenizer-gpt2/vocab.bpe", NULL, &tok));
    roundtrip(tok, 0, 0);
    toy_tokenizer_free(tok);
    MUST(toy_tokenizer_load_spm(TD "tokenizer-llama2-spm/tokenizer.model", &tok));
    roundtrip(tok, TOY_ENCODE_MODEL_DEFAULTS, 0);
    toy_tokenizer_free(tok);
    MUST(toy_tokenizer_load(TD "tokenizer-smollm2/tokenizer.json", &tok));
    cr_expect_eq(toy_tokenizer_bos(tok), -1, "tokenizer.json alone names no BOS");
    /* HF's Digits splits ASCII digits where llama.cpp's "smollm" splits every
       \\p{N}: the tokenizer.json regexes travel in tokenizer.toy.pre_regex */
    roundtrip(tok, TOY_ENCODE_PARSE_SPECIAL, 0);
    toy_tokenizer_free(tok);
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

/* a six-token SPM vocabulary for metadata tests */
static const char *toks[] = {"<unk>", "<s>", "</s>", "a", "b", "ab"};
static const float scores[] = {0, 0, 0, -1, -1, -0.5f};
static const int32_t types[] = {2, 3, 3, 1, 1, 1};

Test(tokenizer_gguf, malformed_metadata) {
    struct toy_gguf_writer *w;
    struct toy_tokenizer *tok = NULL;

    MUST(toy_gguf_writer_init(&w));
    cr_expect_eq(load_built(w, &tok), TOY_ERR_NOT_FOUND); /* no tokenizer at all */
    MUST(toy_gguf_writer_set_str(w, "tokenizer.ggml.model", "llama"));
    MUST(toy_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, NULL, 6));
    MUST(toy_gguf_writer_set_arr(w, "tokenizer.ggml.scores", TOY_GGUF_F32, scores, 5)); /* truncated */
    cr_expect_eq(load_built(w, &tok), TOY_ERR_FORMAT);
    cr_expect(strstr(toy_last_error(), "scores"), "%s", toy_last_error());
    MUST(toy_gguf_writer_set_arr(w, "tokenizer.ggml.scores", TOY_GGUF_F32, scores, 6));
    MUST(toy_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", TOY_GGUF_I32, types, 6));
    MUST(load_built(w, &tok));
    struct toy_tokens t = {0};
    MUST(toy_tokenizer_encode(tok, "ab", 2, TOY_ENCODE_MODEL_DEFAULTS, &t));
    cr_expect_eq(t.n, 3); /* <s> ▁ (unk: no byte tokens) ab — or ▁ab */
    toy_tokens_free(&t);
    toy_tokenizer_free(tok);
    MUST(toy_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 99));
    cr_expect_eq(load_built(w, &tok), TOY_ERR_RANGE);
    MUST(toy_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 1));
    const char *bad[] = {"<unk>", "<s>", "</s>", "a\xff", "b", "ab"};
    MUST(toy_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", bad, NULL, 6));
    cr_expect_eq(load_built(w, &tok), TOY_ERR_FORMAT);
    cr_expect(strstr(toy_last_error(), "UTF-8"), "%s", toy_last_error());
    MUST(toy_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, NULL, 6));
    MUST(toy_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", TOY_GGUF_F32, scores, 6));
    cr_expect_neq(load_built(w, &tok), TOY_OK); /* float token types */
    MUST(toy_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", TOY_GGUF_I32, types, 6));
    /* BPE without merges, then a merge naming a missing token */
    MUST(toy_gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2"));
    cr_expect_eq(load_built(w, &tok), TOY_ERR_NOT_FOUND);
    const char *merges[] = {"a b", "a zz"};
    MUST(toy_gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", merges, NULL, 2));
    cr_expect_eq(load_built(w, &tok), TOY_ERR_FORMAT);
    cr_expect(strstr(toy_last_error(), "merge 1"), "%s", toy_last_error());
    MUST(toy_gguf_writer_set_str(w, "tokenizer.ggml.model", "wordpiece"));
    cr_expect_eq(load_built(w, &tok), TOY_ERR_UNSUPPORTED);
    toy_gguf_writer_free(w);
}

/* The end-of-message and fill-in-the-middle ids a file names end generation and are CONTROL, as in
 * llama.cpp, whatever their text; an id past the vocabulary is ignored, as there */
Test(tokenizer_gguf, eom_and_fim_ids_end_generation_and_are_saved) {
    struct toy_gguf_writer *w;
    struct toy_tokenizer *tok = NULL;
    MUST(toy_gguf_writer_init(&w));
    MUST(toy_gguf_writer_set_str(w, "tokenizer.ggml.model", "llama"));
    MUST(toy_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, NULL, 6));
    MUST(toy_gguf_writer_set_arr(w, "tokenizer.ggml.scores", TOY_GGUF_F32, scores, 6));
    MUST(toy_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", TOY_GGUF_I32, types, 6));
    MUST(load_built(w, &tok));
    cr_expect(!toy_tokenizer_is_eog(tok, 3) && !toy_tokenizer_is_eog(tok, 4) && toy_tokenizer_is_eog(tok, 2));
    toy_tokenizer_free(tok);
    MUST(toy_gguf_writer_set_u32(w, "tokenizer.ggml.eom_token_id", 3));
    MUST(toy_gguf_writer_set_u32(w, "tokenizer.ggml.fim_sep_token_id", 4));
    MUST(toy_gguf_writer_set_u32(w, "tokenizer.ggml.fim_pad_token_id", 99));
    MUST(load_built(w, &tok));
    cr_expect(toy_tokenizer_is_eog(tok, 3), "eom_token_id");
    cr_expect(toy_tokenizer_is_eog(tok, 4), "fim_sep_token_id");
    cr_expect(!toy_tokenizer_is_eog(tok, 5) && toy_tokenizer_is_eog(tok, 2));
    cr_expect_eq(toy_tokenizer_token_type(tok, 4), TOY_TOKEN_CONTROL);
    /* saved again, the file names the same ids (not the one outside the vocabulary) */
    struct toy_gguf_writer *again;
    MUST(toy_gguf_writer_init(&again));
    MUST(toy_tokenizer_write_gguf(tok, again));
    void *buf;
    size_t size;
    MUST(toy_gguf_writer_write_memory(again, &buf, &size));
    struct toy_gguf *g;
    MUST(toy_gguf_open_memory(buf, size, "saved", &g));
    uint32_t eom = 0, sep = 0;
    cr_expect(toy_gguf_get_u32(g, "tokenizer.ggml.eom_token_id", &eom) == TOY_OK && eom == 3, "eom %u", eom);
    cr_expect(toy_gguf_get_u32(g, "tokenizer.ggml.fim_sep_token_id", &sep) == TOY_OK && sep == 4, "fim_sep %u", sep);
    cr_expect_lt(toy_gguf_find_key(g, "tokenizer.ggml.fim_pad_token_id"), 0);
    struct toy_tokenizer *back;
    MUST(toy_tokenizer_load_gguf(g, &back));
    cr_expect(toy_tokenizer_is_eog(back, 3) && toy_tokenizer_is_eog(back, 4) && !toy_tokenizer_is_eog(back, 5));
    toy_tokenizer_free(back);
    toy_gguf_close(g);
    free(buf);
    toy_gguf_writer_free(again);
    toy_tokenizer_free(tok);
    toy_gguf_writer_free(w);
}

/* A padded vocabulary (embedding rows past the tokenizer's) is written as llama.cpp's converter writes it:
 * [PAD<id>] tokens of type UNUSED up to the row count; the file reads back with the same encoding */
Test(tokenizer_gguf, padded_to_the_embedding_rows) {
    need(VG "ggml-vocab-llama-spm.gguf");
    struct toy_gguf *g;
    struct toy_tokenizer *tok, *back;
    cr_assert_eq(toy_gguf_open(VG "ggml-vocab-llama-spm.gguf", &g), TOY_OK);
    cr_assert_eq(toy_tokenizer_load_gguf(g, &tok), TOY_OK, "%s", toy_last_error());
    toy_gguf_close(g);
    int64_t n = toy_tokenizer_n_vocab(tok), rows = n + 64;
    struct toy_gguf_writer *w;
    cr_assert_eq(toy_gguf_writer_init(&w), TOY_OK);
    cr_assert_eq(toy_tokenizer_write_gguf_rows(tok, w, rows), TOY_OK, "%s", toy_last_error());
    char path[] = "/tmp/toy-pad-XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    close(fd);
    cr_assert_eq(toy_gguf_writer_write(w, path), TOY_OK, "%s", toy_last_error());
    toy_gguf_writer_free(w);
    cr_assert_eq(toy_gguf_open(path, &g), TOY_OK);
    cr_assert_eq(toy_tokenizer_load_gguf(g, &back), TOY_OK, "%s", toy_last_error());
    cr_expect_eq(toy_tokenizer_n_vocab(back), rows);
    char last[32];
    snprintf(last, sizeof last, "[PAD%lld]", (long long)rows - 1);
    cr_expect_str_eq(toy_tokenizer_piece(back, (int32_t)rows - 1), last);
    struct toy_tokens a = {0}, b = {0};
    cr_assert_eq(toy_tokenizer_encode(tok, "Hello world", 11, 0, &a), TOY_OK);
    cr_assert_eq(toy_tokenizer_encode(back, "Hello world", 11, 0, &b), TOY_OK);
    cr_expect(a.n == b.n && !memcmp(a.ids, b.ids, (size_t)a.n * sizeof *a.ids));
    toy_tokens_free(&a);
    toy_tokens_free(&b);
    toy_tokenizer_free(back);
    toy_tokenizer_free(tok);
    toy_gguf_close(g);
    unlink(path);
}

/* DeepSeek's pre-tokenizers (tokenizer.ggml.pre deepseek-llm, deepseek-coder, deepseek-v3), over SmolLM2's
 * vocabulary and merges (testdata has no DeepSeek vocabulary): the ids of the 261 test strings, hashed (FNV-1a
 * over each id's 4 bytes, -1 after each string), equal those node-llama-cpp 3.21.1 (llama.cpp's own regexes)
 * gave on the same files, model.tokenize(text, false) string by string (by hand: the issue note of the session
 * that added them) */
Test(tokenizer_gguf, deepseek_pre_tokenizers_split_as_llama_cpp) {
    if (access(TD "tokenizer-smollm2/tokenizer.json", R_OK) || access(TD "tokenizer-test-strings/test_strings.json", R_OK))
        cr_skip_test("no SmolLM2 tokenizer or test strings");
    struct toy_tokenizer *base;
    cr_assert_eq(toy_tokenizer_load(TD "tokenizer-smollm2", &base), TOY_OK, "%s", toy_last_error());
    json_error_t err;
    json_t *strs = json_load_file(TD "tokenizer-test-strings/test_strings.json", 0, &err);
    cr_assert(strs, "%s", err.text);
    const char *pres[] = {"deepseek-llm", "deepseek-coder", "deepseek-v3"};
    const uint64_t want[] = {0x0da5b580cbd8027cULL, 0x7c7d8a7dcc511223ULL, 0x2c44b8c0a88b6ce1ULL};
    char path[] = "/tmp/toy-tok-deepseek-XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    close(fd);
    for (int p = 0; p < 3; p++) {
        struct toy_gguf_writer *w;
        cr_assert_eq(toy_gguf_writer_init(&w), TOY_OK);
        cr_assert_eq(toy_tokenizer_write_gguf(base, w), TOY_OK, "%s", toy_last_error());
        cr_assert_eq(toy_gguf_writer_set_str(w, "tokenizer.ggml.pre", pres[p]), TOY_OK);
        toy_gguf_writer_remove(w, "tokenizer.toy.pre_regex"); /* SmolLM2's own splits: the name's instead */
        cr_assert_eq(toy_gguf_writer_write(w, path), TOY_OK, "%s", toy_last_error());
        toy_gguf_writer_free(w);
        struct toy_tokenizer *tok;
        cr_assert_eq(toy_tokenizer_load(path, &tok), TOY_OK, "%s: %s", pres[p], toy_last_error());
        uint64_t h = 0xcbf29ce484222325ULL;
        for (size_t i = 0; i < json_array_size(strs); i++) {
            json_t *s = json_array_get(strs, i);
            struct toy_tokens t = {0};
            cr_assert_eq(toy_tokenizer_encode(tok, json_string_value(s), json_string_length(s), TOY_ENCODE_NO_BOS, &t),
                         TOY_OK, "%s", toy_last_error());
            for (int64_t k = 0; k <= t.n; k++) {
                uint32_t v = k < t.n ? (uint32_t)t.ids[k] : 0xffffffffu;
                for (int b = 0; b < 4; b++) h = (h ^ ((v >> (8 * b)) & 0xff)) * 0x100000001b3ULL;
            }
            toy_tokens_free(&t);
        }
        cr_expect_eq(h, want[p], "%s: ids hash %016llx, llama.cpp's %016llx", pres[p], (unsigned long long)h,
                     (unsigned long long)want[p]);
        toy_tokenizer_free(tok);
    }
    unlink(path);
    json_decref(strs);
    toy_tokenizer_free(base);
}
