/* bench-sft-pack.c: fine-tuning throughput with packed rows versus one
 * example per row (with the length buckets T, T/2, T/4, T/8 that limit
 * padding), over the same synthetic SFT set: one epoch of short
 * prompt/completion examples (a few to ~80 tokens each), LoRA rank 8 on q,v
 * of a Llama model of the "small" shape (d 256, 4 layers, 8/4 heads) or
 * SmolLM2-135M's (with --smollm), T 256, B 4, through toy_finetuner_run.
 * Reports per mode: steps, seconds per step, target (completion) tokens per
 * second, example tokens per second and the fraction of the positions run
 * that held example tokens. Both modes see every example once, so the
 * ratio of their times is the speed-up packing brings.
 * Usage: bench-sft-pack THREADS [N_EXAMPLES] [--smollm] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "toy/finetune.h"
#include "toy/toy.h"

static const char *const words[] = {"the", "red", "cat", "sat", "on", "mat", "blue", "dog", "ran", "what",
                                    "color", "is", "a", "big", "small", "tree", "under", "over", "and", "then"};

int main(int argc, char **argv) {
    int nth = argc > 1 ? atoi(argv[1]) : 4;
    int n = argc > 2 && argv[2][0] != '-' ? atoi(argv[2]) : 600;
    bool smollm = argc > 2 && !strcmp(argv[argc - 1], "--smollm");
    const int64_t T = 256, B = 4;
    /* the tokenizer: byte-level BPE trained on the words */
    char text[4096];
    size_t len = 0;
    for (int i = 0; i < 200; i++) len += (size_t)snprintf(text + len, sizeof text - len, "%s ", words[i % 20]);
    struct toy_bpe_train_opts bo = {.vocab_size = 320};
    struct toy_tokenizer *tok;
    if (toy_tokenizer_train_bpe(text, len, &bo, &tok)) { fprintf(stderr, "%s\n", toy_last_error()); return 1; }
    /* the data: prompts of 2..30 words, completions of 1..30 words */
    size_t cap = (size_t)n * 600, jl = 0;
    char *jsonl = malloc(cap);
    struct toy_rng r;
    toy_rng_seed(&r, 7);
    for (int i = 0; i < n; i++) {
        int np = 2 + (int)toy_rng_below(&r, 29), nc = 1 + (int)toy_rng_below(&r, 30);
        jl += (size_t)snprintf(jsonl + jl, cap - jl, "{\"prompt\": \"Q:");
        for (int k = 0; k < np; k++) jl += (size_t)snprintf(jsonl + jl, cap - jl, " %s", words[toy_rng_below(&r, 20)]);
        jl += (size_t)snprintf(jsonl + jl, cap - jl, "\", \"completion\": \" A:");
        for (int k = 0; k < nc; k++) jl += (size_t)snprintf(jsonl + jl, cap - jl, " %s", words[toy_rng_below(&r, 20)]);
        jl += (size_t)snprintf(jsonl + jl, cap - jl, "\"}\n");
    }
    struct toy_threadpool *tp = toy_threadpool_new(nth);
    char dir[] = "/tmp/toy-bench-pack-XXXXXX";
    if (!mkdtemp(dir)) return 1;
    double secs[2] = {0};
    for (int pack = 1; pack >= 0; pack--) {
        struct toy_sft *d;
        struct toy_sft_opts so = {.ctx = T, .heldout = 0, .seed = 1};
        if (toy_sft_from_text(jsonl, jl, tok, &so, &d)) { fprintf(stderr, "%s\n", toy_last_error()); return 1; }
        struct toy_llama_config c = toy_llama_preset(smollm ? "smollm2-135m" : "small");
        c.vocab = toy_tokenizer_n_vocab(tok);
        c.max_ctx = T;
        struct toy_llama *m = toy_llama_new(&c, 1);
        struct toy_lora *a;
        struct toy_lora_opts lo = {.rank = 8, .alpha = 16, .targets = TOY_LORA_DEFAULT_TARGETS, .seed = 1};
        if (!m || toy_lora_attach(m, &lo, &a)) { fprintf(stderr, "%s\n", toy_last_error()); return 1; }
        struct toy_finetune_opts fo = {.method = TOY_FT_LORA, .batch = B, .epochs = 1, .no_pack = !pack};
        fo.train = (struct toy_train_opts){.accum = 1, .lr = 1e-3f, .schedule = TOY_LR_CONSTANT, .beta1 = 0.9f,
                                           .beta2 = 0.999f, .eps = 1e-8f, .clip = 1.0f, .seed = 1};
        struct toy_finetuner *f;
        char rd[300];
        snprintf(rd, sizeof rd, "%s/%s", dir, pack ? "packed" : "unpacked");
        if (toy_finetuner_new(m, a, tok, d, &fo, rd, NULL, nth, &f)) { fprintf(stderr, "%s\n", toy_last_error()); return 1; }
        struct toy_train_result res;
        if (toy_finetuner_run(f, &res)) { fprintf(stderr, "%s\n", toy_last_error()); return 1; }
        struct toy_sft_state st;
        toy_sft_get_state(d, &st);
        int64_t positions = toy_sft_positions(d);
        secs[pack] = res.seconds;
        printf("{\"bench\": \"sft_pack\", \"model\": \"%s\", \"mode\": \"%s\", \"threads\": %d, \"T\": %lld, \"B\": %lld, "
               "\"examples\": %lld, \"steps\": %lld, \"s_per_step\": %.4f, \"seconds\": %.3f, "
               "\"target_tokens_per_s\": %.0f, \"example_tokens_per_s\": %.0f, \"pack_efficiency\": %.4f}\n",
               smollm ? "smollm2-135m" : "small", pack ? "packed" : "unpacked", nth, (long long)T, (long long)B,
               (long long)toy_sft_n_train(d), (long long)res.final_step, res.seconds / (double)res.final_step,
               res.seconds, res.tokens_per_s, (double)positions / res.seconds, toy_finetuner_pack_efficiency(f));
        fflush(stdout);
        toy_finetuner_free(f);
        toy_lora_free(a);
        toy_llama_free(m);
        toy_sft_free(d);
    }
    printf("{\"bench\": \"sft_pack\", \"speedup_packed_vs_unpacked\": %.2f}\n", secs[0] / secs[1]);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd)) {}
    free(jsonl);
    toy_threadpool_free(tp);
    toy_tokenizer_free(tok);
    return 0;
}
