/* cmd-tokenizer.c: `toy tokenizer train`: learn a byte-level BPE vocabulary
 * (GPT-2 pre-tokenizer by default) from text files and save it as a GGUF
 * holding only tokenizer.ggml.* metadata, or as a tokenizer.json when the
 * output name ends in .json. Uses only include/. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli-error.h"
#include "flags.h"
#include "json-out.h"
#include "paths.h"
#include "toy/gguf.h"
#include "toy/tokenizer.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: toy tokenizer train --vocab-size N CORPUS.txt [CORPUS...] -o OUT.gguf|OUT.json\n"
            "  --vocab-size N       total tokens: special tokens + 256 bytes + merges\n"
            "  --min-frequency F    stop when no pair occurs F times (default 2)\n"
            "  --pre NAME           pre-tokenizer: gpt-2 (default), llama-bpe, qwen2, smollm, ...\n"
            "  --special TEXT       a special token (repeatable; default <|endoftext|>); the first is BOS,\n"
            "                       the second EOS (one alone is both)\n"
            "  --json               print a JSON summary\n");
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static bool ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

int toy_cmd_tokenizer(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) { usage(argc < 2 ? stderr : stdout); return argc < 2 ? 2 : 0; }
    if (strcmp(argv[1], "train")) { fprintf(stderr, "toy tokenizer: unknown subcommand '%s'\n", argv[1]); usage(stderr); return 2; }
    struct toy_bpe_train_opts o = {0};
    const char *out = NULL, *files[64], *special[64];
    int nf = 0, ns = 0;
    bool json = false;
    struct toy_cli_list specials = {special, 0, 64};
    const struct toy_cli_flag flags[] = {
        TOY_FLAG_N("--vocab-size", TOY_CLI_I64, &o.vocab_size, 1, INT32_MAX),
        TOY_FLAG_N("--min-frequency", TOY_CLI_I64, &o.min_frequency, 1, 1e15), TOY_FLAG_S("--pre", &o.pre),
        TOY_FLAG_L("--special", &specials), TOY_FLAG_S("-o", &out), TOY_FLAG_B("--json", &json), TOY_FLAG_END,
    };
    /* argv[1] is "train": the flags follow it */
    int rc = toy_cli_parse("tokenizer train", argc - 1, argv + 1, flags, files, 64, &nf);
    if (rc == 1) { usage(stdout); return 0; }
    if (rc) return rc;
    ns = specials.n;
    if (!o.vocab_size || !nf || !out) { fprintf(stderr, "toy tokenizer train: --vocab-size, a corpus and -o are required\n"); usage(stderr); return 2; }
    for (int k = 0; k < nf; k++) /* a folder read as an empty corpus */
        if (toy_cli_check_input("tokenizer train", files[k])) return 1;
    for (int k = 0; k < ns; k++) { /* an empty or repeated one would be a token no text can reach, or two ids */
        if (!*special[k]) { fprintf(stderr, "toy tokenizer train: --special needs a non-empty text\n"); return 2; }
        for (int q = 0; q < k; q++)
            if (!strcmp(special[q], special[k])) {
                fprintf(stderr, "toy tokenizer train: --special %s is given twice\n", special[k]);
                return 2;
            }
    }
    if (ns) { o.special_tokens = special; o.n_special = ns; }
    /* the corpus files, one after another (a newline between files) */
    char *text = NULL;
    size_t len = 0, cap = 0;
    for (int k = 0; k < nf; k++) {
        FILE *f = fopen(files[k], "rb");
        if (!f) { fprintf(stderr, "toy tokenizer train: %s: %s\n", files[k], strerror(errno)); free(text); return 1; }
        for (;;) {
            if (cap - len < 65536) {
                cap = cap ? cap * 2 : 1 << 20;
                char *p = realloc(text, cap);
                if (!p) { fprintf(stderr, "toy tokenizer train: out of memory\n"); fclose(f); free(text); return 1; }
                text = p;
            }
            size_t r = fread(text + len, 1, cap - len - 1, f);
            len += r;
            if (r == 0) break;
        }
        fclose(f);
        if (k + 1 < nf && len && text[len - 1] != '\n') text[len++] = '\n';
    }
    if (!len) { /* no merges can be learnt: the tokenizer would be the 256 bytes alone */
        fprintf(stderr, "toy tokenizer train: the corpus is empty (%d file%s, 0 bytes)\n", nf, nf > 1 ? "s" : "");
        free(text);
        return 1;
    }
    double t0 = now();
    struct toy_tokenizer *tok;
    enum toy_status st = toy_tokenizer_train_bpe(text ? text : "", len, &o, &tok);
    double secs = now() - t0;
    if (st) { fprintf(stderr, "toy tokenizer train: %s\n", toy_cli_error("tokenizer train")); free(text); return 1; }
    struct toy_tokens ids = {0};
    if (toy_tokenizer_encode(tok, text ? text : "", len, 0, &ids)) ids.n = 0;
    free(text);
    if (ends_with(out, ".json")) {
        st = toy_tokenizer_save_hf(tok, out);
    } else {
        struct toy_gguf_writer *w;
        st = toy_gguf_writer_init(&w);
        if (!st) st = toy_gguf_writer_set_str(w, "general.architecture", "llama"); /* the one key GGUF requires */
        if (!st) st = toy_gguf_writer_set_str(w, "general.name", "toy-bpe");
        if (!st) st = toy_tokenizer_write_gguf(tok, w);
        if (!st) st = toy_gguf_writer_write(w, out);
        toy_gguf_writer_free(w);
    }
    if (st) { fprintf(stderr, "toy tokenizer train: %s\n", toy_cli_error("tokenizer train")); toy_tokenizer_free(tok); toy_tokens_free(&ids); return 1; }
    rc = 0;
    if (json) /* through jansson: a '"' or '\\' in the path, or bytes that are not UTF-8, stay valid JSON */
        rc = toy_cli_print_json("tokenizer train",
                                json_pack("{s:o,s:I,s:I,s:I,s:I,s:f}", "output", toy_cli_json_text(out, strlen(out)),
                                          "vocab_size", (json_int_t)toy_tokenizer_n_vocab(tok), "merges",
                                          (json_int_t)toy_tokenizer_n_merges(tok), "corpus_bytes", (json_int_t)len,
                                          "corpus_tokens", (json_int_t)ids.n, "seconds", secs),
                                0); /* one line, ", " and ": " as before */
    else
        fprintf(stderr, "toy tokenizer train: %lld tokens (%lld merges) from %zu bytes in %.2f s; the corpus is %lld tokens "
                "(%.2f bytes/token) -> %s\n", (long long)toy_tokenizer_n_vocab(tok), (long long)toy_tokenizer_n_merges(tok),
                len, secs, (long long)ids.n, ids.n ? (double)len / (double)ids.n : 0.0, out);
    if (toy_tokenizer_n_vocab(tok) < o.vocab_size) /* the corpus ran out of pairs seen --min-frequency times */
        fprintf(stderr, "toy tokenizer train: note: %lld tokens, not the %lld asked for: the corpus has no more pairs "
                "that occur %lld times or more (a bigger corpus, or a lower --min-frequency, gives more)\n",
                (long long)toy_tokenizer_n_vocab(tok), (long long)o.vocab_size,
                (long long)(o.min_frequency > 0 ? o.min_frequency : 2));
    toy_tokens_free(&ids);
    toy_tokenizer_free(tok);
    return rc;
}
