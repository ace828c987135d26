/* test-cli-tokenizer.c: the `toy tokenize`, `toy tokenizer train` and
 * `toy chat-template` commands end to end (needs TOY_BIN, set by make
 * check; skipped otherwise). */
#include <criterion/criterion.h>
#include "toy/gguf.h"
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define TD "../shared/testdata/"

/* Runs `$TOY_BIN args`, returns its stdout (malloc'd) and exit status. */
static char *run(const char *args, int *status) {
    const char *bin = getenv("TOY_BIN");
    if (!bin || access(bin, X_OK)) cr_skip_test("TOY_BIN is not set");
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s %s 2>/dev/null", bin, args);
    FILE *p = popen(cmd, "r");
    cr_assert(p);
    size_t cap = 1 << 16, n = 0;
    char *b = malloc(cap);
    size_t r;
    while ((r = fread(b + n, 1, cap - n - 1, p)) > 0) n += r;
    b[n] = 0;
    int st = pclose(p);
    *status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    return b;
}

Test(cli_tokenizer, tokenize) {
    if (access(TD "tokenizer-smollm2/tokenizer.json", R_OK)) cr_skip_test("no test data");
    int st;
    char *o = run("tokenize -m " TD "tokenizer-smollm2 'Hello world'", &st);
    cr_expect_eq(st, 0);
    cr_expect_str_eq(o, "19556 905\n");
    free(o);
    o = run("tokenize -m " TD "tokenizer-smollm2/tokenizer.json --special --json --pieces '<|im_start|>Hi'", &st);
    cr_expect_eq(st, 0);
    cr_expect(strstr(o, "\"ids\": [1, ") && strstr(o, "\"<|im_start|>\""), "%s", o);
    free(o);
    o = run("tokenize -m " TD "llamacpp-vocab-gguf/ggml-vocab-llama-spm.gguf 'Hello world'", &st);
    cr_expect_str_eq(o, "1 15043 3186\n"); /* the GGUF says add_bos */
    free(o);
    o = run("tokenize -m " TD "llamacpp-vocab-gguf/ggml-vocab-llama-spm.gguf --decode '1 15043 3186'", &st);
    cr_expect_str_eq(o, "Hello world\n");
    free(o);
    /* --json with --decode: a JSON string, its control bytes escaped (it printed the raw text, a NUL included) */
    o = run("tokenize -m " TD "llamacpp-vocab-gguf/ggml-vocab-llama-spm.gguf --decode '1 15043 3 3186' --json", &st);
    cr_expect_str_eq(o, "{\"n_tokens\": 4, \"text\": \"Hello\\u0000 world\"}\n");
    free(o);
    /* an id past the vocabulary, negative, or past 64 bits is named as written (it said "bad id
     * 9223372036854775807", and a negative one exited 1 where a word exited 2) */
    const char *bad_ids[] = {"'1 32000'", "'1, -3'", "'1 99999999999999999999'", "'1 x'"};
    for (int i = 0; i < 4; i++) {
        char a[256];
        snprintf(a, sizeof a, "tokenize -m " TD "llamacpp-vocab-gguf/ggml-vocab-llama-spm.gguf --decode %s", bad_ids[i]);
        free(run(a, &st));
        cr_expect_eq(st, 2, "%s", a);
    }
    o = run("tokenize -m /nonexistent 'x'", &st);
    cr_expect_eq(st, 1);
    free(o);
    o = run("tokenize 'x'", &st);
    cr_expect_eq(st, 2);
    free(o);
}

Test(cli_tokenizer, train_then_tokenize_corpus) {
    if (access(TD "corpus-tinystories-sample/tiny_stories.txt", R_OK)) cr_skip_test("no test data");
    char dir[] = "/tmp/toy-cli-tok-XXXXXX";
    cr_assert(mkdtemp(dir));
    char args[1024];
    int st;
    snprintf(args, sizeof args, "tokenizer train --vocab-size 600 --json " TD "corpus-tinystories-sample/tiny_stories.txt -o %s/t.gguf", dir);
    char *o = run(args, &st);
    cr_expect_eq(st, 0, "%s", o);
    cr_expect(strstr(o, "\"vocab_size\": 600"), "%s", o);
    free(o);
    /* general.architecture, the one key the GGUF spec requires: without it llama.cpp refused the file */
    snprintf(args, sizeof args, "%s/t.gguf", dir);
    struct toy_gguf *g;
    cr_assert_eq(toy_gguf_open(args, &g), TOY_OK, "%s", toy_last_error());
    const char *arch = NULL;
    cr_expect_eq(toy_gguf_get_str(g, "general.architecture", &arch, NULL), TOY_OK);
    cr_expect_str_eq(arch ? arch : "", "llama");
    toy_gguf_close(g);
    /* an output path with a '"' in it: the --json line stays JSON (it was printed into the string as it is) */
    snprintf(args, sizeof args, "tokenize -m %s/t.gguf --corpus " TD "corpus-tinystories-sample/tiny_stories.txt -o '%s/c\"q.bin' --eos --json", dir, dir);
    o = run(args, &st);
    cr_expect_eq(st, 0, "%s", o);
    cr_expect(strstr(o, "\"vocab_size\": 600"), "%s", o);
    json_t *jo = json_loads(o, 0, NULL);
    cr_expect(jo && strstr(json_string_value(json_object_get(jo, "output")), "/c\"q.bin"), "%s", o);
    json_decref(jo);
    free(o);
    snprintf(args, sizeof args, "%s/c\"q.bin", dir);
    FILE *f = fopen(args, "rb");
    cr_assert(f);
    char h[4];
    cr_expect_eq(fread(h, 1, 4, f), 4);
    cr_expect(!memcmp(h, "TOYT", 4));
    fclose(f);
    snprintf(args, sizeof args, "rm -rf %s", dir);
    cr_expect_eq(system(args), 0);
}

Test(cli_tokenizer, chat_template) {
    if (access(TD "tokenizer-llama3/tokenizer_config.json", R_OK)) cr_skip_test("no test data");
    char path[] = "/tmp/toy-cli-msgs-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    const char *m = "[{\"role\": \"user\", \"content\": \"Hi\"}]";
    cr_assert_eq(write(fd, m, strlen(m)), (ssize_t)strlen(m));
    close(fd);
    char args[1024];
    int st;
    snprintf(args, sizeof args, "chat-template -m " TD "tokenizer-llama3 --messages %s", path);
    char *o = run(args, &st);
    cr_expect_eq(st, 0);
    cr_expect_str_eq(o, "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                        "<|start_header_id|>assistant<|end_header_id|>\n\n");
    free(o);
    snprintf(args, sizeof args, "chat-template --template chatml --messages %s", path);
    o = run(args, &st);
    cr_expect_str_eq(o, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    free(o);
    snprintf(args, sizeof args, "chat-template --template gemma --messages %s --no-generation-prompt --bos '<bos>'", path);
    o = run(args, &st);
    cr_expect_str_eq(o, "<bos><start_of_turn>user\nHi<end_of_turn>\n");
    free(o);
    unlink(path);
}

/* One thing at a time: -o without --corpus encoded the file's name and
 * wrote nothing, a TEXT beside --corpus or --decode was ignored. Special
 * tokens: the first is BOS and the second EOS (both were the first), and an
 * empty or repeated one is refused. --bos with --no-bos is refused too. */
Test(cli_tokenizer, flags_that_were_ignored_are_refused) {
    if (access(TD "corpus-tinystories-sample/tiny_stories.txt", R_OK)) cr_skip_test("no test data");
    char dir[] = "/tmp/toy-cli-tok-XXXXXX", args[1024];
    cr_assert(mkdtemp(dir));
    int st;
    snprintf(args, sizeof args, "tokenizer train --vocab-size 300 --special '<s>' --special '</s>' " TD
             "corpus-tinystories-sample/tiny_stories.txt -o %s/t.gguf", dir);
    free(run(args, &st));
    cr_assert_eq(st, 0);
    const char *bad[] = {"tokenize -m %s/t.gguf " TD "corpus-tinystories-sample/tiny_stories.txt -o %s/x.bin",
                         "tokenize -m %s/t.gguf --decode '1 2' 'text' %s",
                         "tokenize -m %s/t.gguf 'text' --corpus " TD "corpus-tinystories-sample/tiny_stories.txt -o %s/x.bin",
                         "tokenizer train --vocab-size 300 --special '<s>' --special '<s>' " TD
                         "corpus-tinystories-sample/tiny_stories.txt -o %s/u.gguf %s",
                         "tokenizer train --vocab-size 300 --special '' " TD
                         "corpus-tinystories-sample/tiny_stories.txt -o %s/u.gguf %s",
                         "tokenize -m %s/t.gguf --bos --no-bos 'text' %s"};
    for (int i = 0; i < 6; i++) {
        snprintf(args, sizeof args, bad[i], dir, i == 1 || i >= 3 ? "" : dir);
        free(run(args, &st));
        cr_expect_eq(st, 2, "%s: exit %d", args, st);
    }
    snprintf(args, sizeof args, "%s/x.bin", dir);
    cr_expect(access(args, F_OK) != 0, "a token file was written");
    /* --eos ends the file with </s>, id 1 */
    snprintf(args, sizeof args, "tokenize -m %s/t.gguf --corpus " TD "corpus-tinystories-sample/tiny_stories.txt "
             "--eos -o %s/c.bin", dir, dir);
    free(run(args, &st));
    cr_assert_eq(st, 0);
    snprintf(args, sizeof args, "%s/c.bin", dir);
    FILE *f = fopen(args, "rb");
    cr_assert(f);
    unsigned char last[4];
    cr_assert_eq(fseek(f, -4, SEEK_END), 0);
    cr_assert_eq(fread(last, 1, 4, f), 4);
    fclose(f);
    cr_expect_eq(last[0] | last[1] << 8 | last[2] << 16 | last[3] << 24, 1, "EOS is not </s>");
    snprintf(args, sizeof args, "rm -rf %s", dir);
    cr_expect_eq(system(args), 0);
}
