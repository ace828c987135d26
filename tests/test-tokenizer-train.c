/* test-tokenizer-train.c: byte-level BPE training: the merge order on a
 * corpus small enough to count by hand, then a real corpus (TinyShakespeare):
 * vocabulary size, exact round trips, compression, determinism, and the
 * trained tokenizer surviving tokenizer.json and GGUF round trips.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "toy/gguf.h"
#include "toy/tokenizer.h"

#define TD "../shared/testdata/"
#define MUST(call) cr_assert_eq((call), TOY_OK, "%s: %s", #call, toy_last_error())

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    char *b = malloc((size_t)n + 1);
    cr_assert_eq(fread(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    b[n] = 0;
    *len = (size_t)n;
    return b;
}

Test(tokenizer_train, merge_order_by_hand) {
    /* words (GPT-2 split): "low"x5, " low"x... keep it simple: no spaces */
    const char *corpus = "hug hug hug pug pug pun bun hugs";
    struct toy_bpe_train_opts o = {.vocab_size = 1 + 256 + 4, .min_frequency = 2};
    struct toy_tokenizer *tok = NULL;
    MUST(toy_tokenizer_train_bpe(corpus, strlen(corpus), &o, &tok));
    /* words: "hug" 1, " hug" 2, " pug" 2, " pun" 1, " bun" 1, " hugs" 1.
       pair counts: "ug" 1+2+2+1=6 is the most frequent; then " h"... after
       ug: (" ", "h") 3, ("h","ug") 4 -> "hug"; then (" ", "hug") 3 vs (" ","p") 3
       -> tie broken by smaller ids: " " (id 33) with "hug" (id 259) vs " " with "p" (113): "p" is smaller */
    cr_expect_eq(toy_tokenizer_n_vocab(tok), 261);
    cr_expect_str_eq(toy_tokenizer_merge(tok, 0), "u g");
    cr_expect_str_eq(toy_tokenizer_merge(tok, 1), "h ug");
    cr_expect_str_eq(toy_tokenizer_merge(tok, 2), "\xc4\xa0 p");
    cr_expect_str_eq(toy_tokenizer_merge(tok, 3), "\xc4\xa0 hug");
    cr_expect_eq(toy_tokenizer_bos(tok), 0);
    cr_expect_str_eq(toy_tokenizer_piece(tok, 0), "<|endoftext|>");
    struct toy_tokens t = {0};
    MUST(toy_tokenizer_encode(tok, " hugs", 5, 0, &t));
    cr_expect_eq(t.n, 2); /* " hug" + "s" */
    toy_tokens_free(&t);
    toy_tokenizer_free(tok);
    /* too small a vocabulary */
    o.vocab_size = 100;
    cr_expect_eq(toy_tokenizer_train_bpe(corpus, strlen(corpus), &o, &tok), TOY_ERR_INVALID_ARG);
}

Test(tokenizer_train, tinyshakespeare, .timeout = 60) {
    size_t len;
    char *text = slurp(TD "corpus-tinyshakespeare/input.txt", &len);
    if (!text) cr_skip_test("no TinyShakespeare");
    struct toy_bpe_train_opts o = {.vocab_size = 2048};
    struct toy_tokenizer *tok = NULL, *tok2 = NULL;
    clock_t c0 = clock();
    MUST(toy_tokenizer_train_bpe(text, len, &o, &tok));
    double secs = (double)(clock() - c0) / CLOCKS_PER_SEC;
    fprintf(stderr, "trained 2048 tokens on %zu bytes in %.2f s\n", len, secs);
    cr_expect_lt(secs, 20.0);
    cr_expect_eq(toy_tokenizer_n_vocab(tok), 2048);
    cr_expect_eq(toy_tokenizer_n_merges(tok), 2048 - 257);

    struct toy_tokens t = {0};
    MUST(toy_tokenizer_encode(tok, text, len, 0, &t));
    fprintf(stderr, "%zu bytes -> %lld tokens (%.2f bytes/token)\n", len, (long long)t.n, (double)len / (double)t.n);
    cr_expect_gt((double)len / (double)t.n, 2.5, "a 2k BPE vocabulary compresses Shakespeare > 2.5x");
    char *dec;
    size_t dl;
    MUST(toy_tokenizer_decode(tok, t.ids, t.n, 0, &dec, &dl));
    cr_expect(dl == len && !memcmp(dec, text, len), "decode(encode(corpus)) == corpus");
    free(dec);

    /* deterministic */
    MUST(toy_tokenizer_train_bpe(text, len, &o, &tok2));
    for (int64_t r = 0; r < toy_tokenizer_n_merges(tok); r++)
        if (strcmp(toy_tokenizer_merge(tok, r), toy_tokenizer_merge(tok2, r))) {
            cr_expect_fail("merge %lld differs between two runs", (long long)r);
            break;
        }
    toy_tokenizer_free(tok2);

    /* tokenizer.json and GGUF round trips keep every id */
    const char *sample = "ROMEO: But, soft! what light through yonder window breaks? 1234 ünï";
    struct toy_tokens a = {0}, b = {0};
    MUST(toy_tokenizer_encode(tok, sample, strlen(sample), 0, &a));
    char path[] = "/tmp/toy-tok-train-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    close(fd);
    MUST(toy_tokenizer_save_hf(tok, path));
    MUST(toy_tokenizer_load_hf(path, NULL, &tok2));
    unlink(path);
    MUST(toy_tokenizer_encode(tok2, sample, strlen(sample), 0, &b));
    cr_expect_eq(a.n, b.n);
    cr_expect(!memcmp(a.ids, b.ids, (size_t)a.n * sizeof *a.ids));
    cr_expect_str_eq(toy_tokenizer_pre(tok2), "gpt-2");
    cr_expect_eq(toy_tokenizer_eos(tok2), 0);
    toy_tokenizer_free(tok2);

    struct toy_gguf_writer *w;
    MUST(toy_gguf_writer_init(&w));
    MUST(toy_tokenizer_write_gguf(tok, w));
    void *buf;
    size_t size;
    MUST(toy_gguf_writer_write_memory(w, &buf, &size));
    toy_gguf_writer_free(w);
    struct toy_gguf *g;
    MUST(toy_gguf_open_memory(buf, size, "trained", &g));
    MUST(toy_tokenizer_load_gguf(g, &tok2));
    b.n = 0;
    MUST(toy_tokenizer_encode(tok2, sample, strlen(sample), 0, &b));
    cr_expect(a.n == b.n && !memcmp(a.ids, b.ids, (size_t)a.n * sizeof *a.ids));
    toy_tokenizer_free(tok2);
    toy_gguf_close(g);
    free(buf);

    toy_tokens_free(&a);
    toy_tokens_free(&b);
    toy_tokens_free(&t);
    toy_tokenizer_free(tok);
    free(text);
}

Test(token_file, roundtrip_and_corruption) {
    char path[] = "/tmp/toy-toyt-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    close(fd);
    int32_t ids[1000];
    for (int i = 0; i < 1000; i++) ids[i] = (i * 7919) % 50257;
    MUST(toy_token_file_write(path, 50257, ids, 1000));
    int64_t nv, n;
    int32_t *back;
    MUST(toy_token_file_read(path, &nv, &back, &n));
    cr_expect_eq(nv, 50257);
    cr_expect_eq(n, 1000);
    cr_expect(!memcmp(ids, back, sizeof ids));
    free(back);
    /* header layout: magic, version, vocab, count */
    FILE *f = fopen(path, "r+b");
    unsigned char h[20];
    cr_assert_eq(fread(h, 1, 20, f), 20);
    cr_expect(!memcmp(h, "TOYT\x01\x00\x00\x00\x51\xc4\x00\x00\xe8\x03\x00\x00\x00\x00\x00\x00", 20));
    /* a count larger than the file */
    h[13] = 0x7f;
    fseek(f, 0, SEEK_SET);
    fwrite(h, 1, 20, f);
    fflush(f);
    cr_expect_eq(toy_token_file_read(path, &nv, &back, &n), TOY_ERR_FORMAT);
    cr_expect(strstr(toy_last_error(), "at offset 12"), "%s", toy_last_error()); /* one validator with the loader's */
    /* an id beyond the vocabulary */
    h[13] = 0x03;
    h[8] = 0x10;
    h[9] = 0x00; /* vocab 16 */
    fseek(f, 0, SEEK_SET);
    fwrite(h, 1, 20, f);
    fflush(f);
    cr_expect_eq(toy_token_file_read(path, &nv, &back, &n), TOY_ERR_RANGE);
    cr_expect(strstr(toy_last_error(), "token 1 (offset 24) is id 7919"), "%s", toy_last_error());
    /* a vocabulary past INT32_MAX: its ids would read back negative (found by fuzz/fuzz-data.c); the data
     * loader's reader of the same format refused it already */
    h[8] = 0x00, h[11] = 0xa2;
    fseek(f, 0, SEEK_SET);
    fwrite(h, 1, 20, f);
    fflush(f);
    cr_expect_eq(toy_token_file_read(path, &nv, &back, &n), TOY_ERR_FORMAT);
    cr_expect(strstr(toy_last_error(), "vocabulary size 2717908992"), "%s", toy_last_error());
    fseek(f, 0, SEEK_SET);
    fwrite("XXXX", 1, 4, f);
    fclose(f);
    cr_expect_eq(toy_token_file_read(path, &nv, &back, &n), TOY_ERR_FORMAT);
    ids[5] = 60000;
    cr_expect_eq(toy_token_file_write(path, 50257, ids, 1000), TOY_ERR_RANGE);
    unlink(path);
}
