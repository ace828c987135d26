/* cmd-tokenize.c: `toy tokenize`: text to token ids with a model's
 * tokenizer (GGUF, tokenizer.json, tokenizer.model, or a folder holding
 * one), ids back to text, and whole corpora to packed TOYT token files
 * (docs/formats.md). Uses only include/. */
#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "flags.h"
#include "json-out.h"
#include "paths.h"
#include "toy/file.h"
#include "toy/tokenizer.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: toy tokenize -m MODEL [options] [TEXT | -]\n"
            "       toy tokenize -m MODEL --corpus FILE [--corpus FILE...] -o TOKENS.bin [--eos]\n"
            "       toy tokenize -m MODEL --decode \"ID ID ...\"\n"
            "\n"
            "MODEL is a .gguf, a tokenizer.json, a tokenizer.model, or a folder holding one.\n"
            "TEXT absent or '-' reads standard input.\n"
            "  --pieces        show each token's piece\n"
            "  --special       parse special-token text (<|im_start|>) as those tokens\n"
            "  --bos, --eos    add BOS / EOS; --no-bos: never add BOS (default: as the model says; a\n"
            "                  WordPiece (BERT) vocabulary: [CLS] ... [SEP], or neither with --no-bos)\n"
            "  --json          print JSON {\"ids\": [...], \"pieces\": [...], \"n_tokens\": N}\n"
            "  --corpus FILE   encode a whole file as one document: BOS first as the model says (--bos,\n"
            "                  --no-bos), EOS last with --eos; repeatable, '-' or a pipe too. toy train and\n"
            "                  toy eval read a text file the same way\n"
            "  -o FILE         where --corpus writes the packed TOYT token file\n"
            "  --decode IDS    print the text of space- or comma-separated ids (--json: {\"n_tokens\": N, \"text\": ...})\n");
}

static void json_piece(FILE *f, const char *s) {
    json_t *j = toy_cli_json_text(s, strlen(s)); /* a byte-level piece can be part of a character */
    char *d = j ? json_dumps(j, JSON_ENCODE_ANY) : NULL;
    fputs(d ? d : "null", f);
    free(d);
    json_decref(j);
}

int toy_cmd_tokenize(int argc, char **argv) {
    const char *model = NULL, *text = NULL, *out = NULL, *decode = NULL;
    const char *corpus[64];
    int n_corpus = 0;
    bool pieces = false, json = false, special = false, bos = false, eos = false, no_bos = false;
    struct toy_cli_list corpora = {corpus, 0, 64};
    const struct toy_cli_flag table[] = {
        TOY_FLAG_S("-m", &model), TOY_FLAG_S("--model", &model), TOY_FLAG_B("--pieces", &pieces),
        TOY_FLAG_B("--json", &json), TOY_FLAG_B("--special", &special), TOY_FLAG_B("--bos", &bos),
        TOY_FLAG_B("--no-bos", &no_bos), TOY_FLAG_B("--eos", &eos), TOY_FLAG_L("--corpus", &corpora),
        TOY_FLAG_S("-o", &out), TOY_FLAG_S("--decode", &decode), TOY_FLAG_END,
    };
    int n_text = 0;
    int prc = toy_cli_parse("tokenize", argc, argv, table, &text, 1, &n_text);
    if (prc == 1) { usage(stdout); return 0; }
    if (prc) return prc;
    n_corpus = corpora.n;
    if (!model) { fprintf(stderr, "toy tokenize: -m MODEL is required\n"); usage(stderr); return 2; }
    if (n_corpus && !out) { fprintf(stderr, "toy tokenize: --corpus needs -o TOKENS.bin\n"); return 2; }
    /* one thing at a time: the others were silently ignored (-o without --corpus encoded a file's name) */
    if (out && !n_corpus) {
        fprintf(stderr, "toy tokenize: -o writes the token file of --corpus FILE%s\n",
                n_text ? ": to encode a file, give it as --corpus FILE" : "");
        return 2;
    }
    if (bos && no_bos) { /* one of them was ignored */
        fprintf(stderr, "toy tokenize: give --bos or --no-bos, not both\n");
        return 2;
    }
    if ((decode != NULL) + (n_corpus > 0) + (n_text > 0) > 1) {
        fprintf(stderr, "toy tokenize: give one of TEXT, --corpus FILE... or --decode IDS\n");
        return 2;
    }
    for (int c = 0; c < n_corpus; c++) /* a folder read as an empty corpus, and wrote an empty token file */
        if (toy_cli_check_input("tokenize", corpus[c])) return 1;
    char resolved[4096];
    if (!(model = toy_cli_tokenizer_source("tokenize", model, resolved, sizeof resolved))) return 1;
    struct toy_tokenizer *tok;
    if (toy_tokenizer_load(model, &tok)) { fprintf(stderr, "toy tokenize: %s\n", toy_last_error()); return 1; }
    unsigned flags = (special ? TOY_ENCODE_PARSE_SPECIAL : 0) | (bos ? TOY_ENCODE_ADD_BOS : 0) |
                     (!bos && !no_bos && toy_tokenizer_add_bos(tok) ? TOY_ENCODE_ADD_BOS : 0);
    /* a BERT encoder's input always ends with [SEP] (its EOS), as it is embedded */
    if (toy_tokenizer_kind(tok) == TOY_TOKENIZER_WPM && !no_bos) eos = true;
    int rc = 0;
    struct toy_tokens t = {0};

    if (decode) {
        for (const char *p = decode; *p;) {
            char *end;
            errno = 0;
            long v = strtol(p, &end, 10);
            if (end == p) {
                if (!strchr(", \t\n[]", *p)) { fprintf(stderr, "toy tokenize: --decode: not an id at '%s'\n", p); rc = 2; goto done; }
                p++;
                continue;
            }
            if (errno || v < 0 || v >= toy_tokenizer_n_vocab(tok)) { /* as written, not as strtol clamped it */
                while (p < end && isspace((unsigned char)*p)) p++; /* strtol's leading space */
                fprintf(stderr, "toy tokenize: --decode: '%.*s' is not an id of this vocabulary (0 to %lld)\n",
                        (int)(end - p), p, (long long)toy_tokenizer_n_vocab(tok) - 1);
                rc = 2;
                goto done;
            }
            p = end;
            if (t.n == t.cap) {
                int64_t c = t.cap ? t.cap * 2 : 64;
                int32_t *q = realloc(t.ids, (size_t)c * sizeof *q);
                if (!q) { rc = 1; goto done; }
                t.ids = q;
                t.cap = c;
            }
            t.ids[t.n++] = (int32_t)v;
        }
        char *s;
        size_t l;
        if (toy_tokenizer_decode(tok, t.ids, t.n, TOY_DECODE_SKIP_SPECIAL * !special, &s, &l)) {
            fprintf(stderr, "toy tokenize: %s\n", toy_last_error());
            rc = 1;
            goto done;
        }
        if (json) { /* the text as a JSON string: control bytes escaped, bytes that are not UTF-8 as U+FFFD */
            rc = toy_cli_print_json("tokenize", json_pack("{s:I,s:o}", "n_tokens", (json_int_t)t.n, "text",
                                                          toy_cli_json_text(s, l)), 0);
        } else {
            fwrite(s, 1, l, stdout);
            fputc('\n', stdout);
        }
        free(s);
        goto done;
    }

    if (n_corpus) {
        size_t bytes = 0;
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (int c = 0; c < n_corpus; c++) {
            size_t len;
            char *buf;
            if (toy_file_read_all(corpus[c], &buf, &len)) { /* "-", a pipe or a file, read whole */
                fprintf(stderr, "toy tokenize: %s\n", toy_last_error());
                rc = 1;
                goto done;
            }
            bytes += len;
            /* each file a document, as toy train and toy eval read a text (docs/training.md) */
            unsigned fl = (special ? TOY_ENCODE_PARSE_SPECIAL : 0) | (eos ? TOY_ENCODE_ADD_EOS : 0) |
                          (no_bos ? TOY_ENCODE_NO_BOS : bos ? TOY_ENCODE_ADD_BOS : 0);
            if (toy_tokenizer_encode_corpus(tok, buf, len, fl, &t)) {
                fprintf(stderr, "toy tokenize: %s: %s\n", corpus[c], toy_last_error());
                free(buf);
                rc = 1;
                goto done;
            }
            free(buf);
        }
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        if (toy_token_file_write(out, toy_tokenizer_n_vocab(tok), t.ids, t.n)) {
            fprintf(stderr, "toy tokenize: %s\n", toy_last_error());
            rc = 1;
            goto done;
        }
        if (json) /* the path through jansson: a '"' or '\\' in it, or bytes that are not UTF-8, stay valid JSON */
            rc = toy_cli_print_json("tokenize",
                                    json_pack("{s:o,s:I,s:I,s:I,s:f}", "output", toy_cli_json_text(out, strlen(out)),
                                              "bytes", (json_int_t)bytes, "n_tokens", (json_int_t)t.n, "vocab_size",
                                              (json_int_t)toy_tokenizer_n_vocab(tok), "seconds", secs),
                                    0); /* one line, ", " and ": " as before */
        else
            fprintf(stderr, "toy tokenize: %zu bytes -> %lld tokens (%.2f bytes/token, %.1f MB/s) -> %s\n", bytes,
                    (long long)t.n, t.n ? (double)bytes / (double)t.n : 0.0, secs > 0 ? (double)bytes / secs / 1e6 : 0.0, out);
        goto done;
    }

    char *owned = NULL;
    size_t len;
    if (!text || !strcmp(text, "-")) {
        if (toy_file_read_all("-", &owned, &len)) { fprintf(stderr, "toy tokenize: %s\n", toy_last_error()); rc = 1; goto done; }
        text = owned;
    } else {
        len = strlen(text);
    }
    if (toy_tokenizer_encode(tok, text, len, flags | (eos ? TOY_ENCODE_ADD_EOS : 0), &t)) {
        fprintf(stderr, "toy tokenize: %s\n", toy_last_error());
        free(owned);
        rc = 1;
        goto done;
    }
    free(owned);
    if (json) {
        printf("{\"n_tokens\": %lld, \"ids\": [", (long long)t.n);
        for (int64_t i = 0; i < t.n; i++) printf(i ? ", %d" : "%d", t.ids[i]);
        printf("]");
        if (pieces) {
            printf(", \"pieces\": [");
            for (int64_t i = 0; i < t.n; i++) {
                if (i) printf(", ");
                json_piece(stdout, toy_tokenizer_piece(tok, t.ids[i]));
            }
            printf("]");
        }
        printf("}\n");
    } else if (pieces) {
        for (int64_t i = 0; i < t.n; i++) {
            printf("%6d  ", t.ids[i]);
            json_piece(stdout, toy_tokenizer_piece(tok, t.ids[i]));
            putchar('\n');
        }
    } else {
        for (int64_t i = 0; i < t.n; i++) printf(i ? " %d" : "%d", t.ids[i]);
        putchar('\n');
    }
done:
    toy_tokens_free(&t);
    toy_tokenizer_free(tok);
    return rc;
}
