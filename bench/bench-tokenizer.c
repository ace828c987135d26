/* bench-tokenizer.c: single-thread encode throughput (tokens/s, MB/s) on
 * War and Peace for the GPT-2, Llama-3 and Llama-2 vocabularies, and decode
 * throughput; reported as a ratio to the earlier Ruby+ggml toy's measured
 * 0.88 M tokens/s (../shared/reference/toy-features.md). Best of N runs;
 * the ratio uses this thread's CPU time, which other processes on shared
 * cores do not inflate (wall-clock tokens/s is printed beside it).
 *
 * usage: bench-tokenizer [testdata-dir] [repeats]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "toy/tokenizer.h"

static double clock_s(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
static double now(void) { return clock_s(CLOCK_MONOTONIC); }
/* this thread's CPU time: robust when other processes share the cores */
static double cpu(void) { return clock_s(CLOCK_THREAD_CPUTIME_ID); }

#define PEER_TOKENS_PER_S 0.88e6

int main(int argc, char **argv) {
    const char *td = argc > 1 ? argv[1] : "../shared/testdata";
    int reps = argc > 2 ? atoi(argv[2]) : 3;
    char path[1024], p2[1024];
    snprintf(path, sizeof path, "%s/corpus-war-and-peace/war-and-peace.txt", td);
    FILE *f = fopen(path, "rb");
    if (!f) { fprintf(stderr, "bench-tokenizer: %s is absent, skipping\n", path); return 0; }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    char *text = malloc((size_t)n);
    if (!text || fread(text, 1, (size_t)n, f) != (size_t)n) { fprintf(stderr, "read failed\n"); return 1; }
    fclose(f);

    struct { const char *name; int kind; const char *a, *b; } cases[] = {
        {"gpt2", 0, "tokenizer-gpt2/encoder.json", "tokenizer-gpt2/vocab.bpe"},
        {"llama3", 1, "tokenizer-llama3/tokenizer.json", NULL},
        {"llama2", 2, "tokenizer-llama2-spm/tokenizer.model", NULL},
    };
    printf("%-8s %10s %12s %12s %9s %12s %9s\n", "vocab", "tokens", "enc tok/s", "(wall tok/s)", "enc MB/s", "dec MB/s",
           "vs toy-rb");
    struct toy_tokens t = {0};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        struct toy_tokenizer *tok = NULL;
        enum toy_status st;
        snprintf(path, sizeof path, "%s/%s", td, cases[c].a);
        if (cases[c].kind == 0) {
            snprintf(p2, sizeof p2, "%s/%s", td, cases[c].b);
            st = toy_tokenizer_load_gpt2(path, p2, NULL, &tok);
        } else {
            st = toy_tokenizer_load(path, &tok);
        }
        if (st) { fprintf(stderr, "%s: %s\n", cases[c].name, toy_last_error()); continue; }
        double best = 1e30, best_dec = 1e30, best_wall = 1e30;
        for (int r = 0; r < reps; r++) {
            t.n = 0;
            double w0 = now(), t0 = cpu();
            if (toy_tokenizer_encode(tok, text, (size_t)n, 0, &t)) { fprintf(stderr, "%s\n", toy_last_error()); return 1; }
            double t1 = cpu(), w1 = now();
            if (w1 - w0 < best_wall) best_wall = w1 - w0;
            char *dec;
            size_t dl;
            if (toy_tokenizer_decode(tok, t.ids, t.n, 0, &dec, &dl)) { fprintf(stderr, "%s\n", toy_last_error()); return 1; }
            double t2 = cpu();
            if (dl != (size_t)n || memcmp(dec, text, dl)) fprintf(stderr, "%s: round trip differs!\n", cases[c].name);
            free(dec);
            if (t1 - t0 < best) best = t1 - t0;
            if (t2 - t1 < best_dec) best_dec = t2 - t1;
        }
        double tps = (double)t.n / best;
        printf("%-8s %10lld %12.0f %12.0f %9.1f %12.1f %8.1fx\n", cases[c].name, (long long)t.n, tps,
               (double)t.n / best_wall, (double)n / best / 1e6, (double)n / best_dec / 1e6, tps / PEER_TOKENS_PER_S);
        toy_tokenizer_free(tok);
    }
    toy_tokens_free(&t);
    free(text);
    return 0;
}
