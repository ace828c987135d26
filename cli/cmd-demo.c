/* cmd-demo.c: `toy demo` (what `make demo` runs): trains a small Llama from
 * scratch on text made by a tiny built-in grammar (no download, no
 * third-party data), through the same trainer as `toy train`: a BPE
 * vocabulary learned on the fly, AdamW with warmup and cosine decay, held-out
 * evaluation, a run bundle in ./runs with the toy/v1 event stream and a GGUF
 * checkpoint, and a sample at the end. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "flags.h"
#include "progress.h"
#include "stop-signals.h"
#include "toy/data.h"
#include "toy/events.h"
#include "toy/run-dir.h"
#include "toy/tokenizer.h"
#include "toy/toy.h"
#include "toy/trainer.h"

/* ---- the built-in corpus: sentences from a small grammar --------------------- */

static const char *const subj[] = {"the cat", "a small dog", "the old man", "my sister", "the robot",
                                   "a bird", "the teacher", "our neighbour", "the child", "a fox"};
static const char *const verb[] = {"sees", "likes", "finds", "follows", "paints", "carries", "helps",
                                   "watches", "draws", "remembers"};
static const char *const adj[] = {"red", "quiet", "tall", "happy", "green", "tiny", "bright", "sleepy"};
static const char *const obj[] = {"ball", "house", "tree", "book", "boat", "garden", "window", "song"};
static const char *const place[] = {"in the park", "by the river", "at home", "under the bridge",
                                    "near the school", "on the hill"};

#define PICK(arr) arr[toy_rng_below(&r, sizeof arr / sizeof arr[0])]

static char *make_corpus(size_t n, uint64_t seed) {
    char *text = malloc(n + 256);
    if (!text) return NULL;
    struct toy_rng r;
    toy_rng_seed(&r, seed);
    size_t len = 0;
    while (len < n) {
        char s[200];
        int k;
        if (toy_rng_below(&r, 3) == 0)
            k = snprintf(s, sizeof s, "%s %s the %s %s %s. ", PICK(subj), PICK(verb), PICK(adj), PICK(obj), PICK(place));
        else
            k = snprintf(s, sizeof s, "%s %s the %s %s. ", PICK(subj), PICK(verb), PICK(adj), PICK(obj));
        memcpy(text + len, s, (size_t)k);
        len += (size_t)k;
    }
    text[n] = 0;
    return text;
}

/* ---- flags -------------------------------------------------------------------- */

struct opts {
    int64_t steps, T, B, d, layers;
    int threads;
    uint64_t seed;
    float lr;
    bool bf16;
};

static int usage_to(FILE *f) {
    fprintf(f,
            "usage: toy demo [--steps N] [--threads N] [--seed S] [--lr LR] [--ctx T] [--batch B]\n"
            "                [--dim D] [--layers L] [--bf16]\n"
            "Trains a small Llama on text from a built-in grammar with the toy train machinery\n"
            "(run bundle in ./runs), then samples from it. Ctrl-C ends it with a checkpoint\n"
            "(a demo run is not resumed: run toy demo again, or toy train --data FILE for your own text).\n");
    return 2;
}

static int parse(int argc, char **argv, struct opts *o) {
    const struct toy_cli_flag flags[] = {
        TOY_FLAG_N("--steps", TOY_CLI_I64, &o->steps, 1, 1e9), TOY_FLAG_N("--threads", TOY_CLI_INT, &o->threads, 0, 1024),
        TOY_FLAG_U("--seed", &o->seed), TOY_FLAG_N("--lr", TOY_CLI_F32, &o->lr, 0, 1e30),
        TOY_FLAG_N("--ctx", TOY_CLI_I64, &o->T, 8, 1 << 20), TOY_FLAG_N("--batch", TOY_CLI_I64, &o->B, 1, 1 << 20),
        TOY_FLAG_N("--dim", TOY_CLI_I64, &o->d, 32, 1 << 16), TOY_FLAG_N("--layers", TOY_CLI_I64, &o->layers, 1, 1024),
        TOY_FLAG_B("--bf16", &o->bf16), TOY_FLAG_END};
    int rc = toy_cli_parse("demo", argc, argv, flags, NULL, 0, NULL);
    if (rc == 1) return usage_to(stdout), 1;
    if (rc) return rc;
    if (o->d % 32) { fprintf(stderr, "toy demo: --dim must be a multiple of 32 (heads of 32), not %lld\n", (long long)o->d); return 2; }
    if (o->bf16) toy_cli_bf16_math();
    return 0;
}

/* ---- training through the real trainer, into a run bundle ------------------------- */

struct demo_ud {
    struct toy_progress pb;
};

static void on_step(void *ud, const struct toy_step_info *s) {
    struct demo_ud *d = ud;
    char extra[96];
    if (isnan(s->eval_loss)) snprintf(extra, sizeof extra, "loss %.3f  grad %.2f", s->loss, s->grad_norm);
    else snprintf(extra, sizeof extra, "loss %.3f  held-out %.3f", s->loss, s->eval_loss);
    toy_progress_update(&d->pb, s->step, (double)s->tokens_done, extra);
    if (!d->pb.tty && (s->step % 100 == 0 || s->step == 1 || !isnan(s->eval_loss))) {
        printf("step %lld: loss=%.4f", (long long)s->step, s->loss);
        if (!isnan(s->eval_loss)) printf(" held-out=%.4f", s->eval_loss);
        printf("\n");
        fflush(stdout);
    }
}

int toy_cmd_demo(int argc, char **argv) {
    struct opts o = {.steps = 800, .threads = 0, .T = 64, .B = 16, .d = 128, .layers = 4, .seed = 1234, .lr = 3e-3f};
    int rc = parse(argc, argv, &o);
    if (rc) return rc == 1 ? 0 : rc;

    size_t n_text = 400000;
    char *text = make_corpus(n_text, o.seed);
    struct toy_tokenizer *tok = NULL;
    struct toy_data *data = NULL;
    struct toy_llama *m = NULL;
    struct toy_events *ev = NULL;
    struct toy_trainer *tr = NULL;
    int run_lock = -1;
    rc = 1;
    if (!text) { fprintf(stderr, "toy demo: out of memory\n"); return 1; }
    /* a small byte-level BPE vocabulary learned from the text, kept in every checkpoint */
    struct toy_bpe_train_opts bo = {.vocab_size = 320};
    struct toy_tokens ids = {0};
    /* the text as toy train reads one (a learned vocabulary asks for no BOS: the same ids as plain encoding) */
    if (toy_tokenizer_train_bpe(text, n_text, &bo, &tok) || toy_tokenizer_encode_corpus(tok, text, n_text, 0, &ids)) {
        fprintf(stderr, "toy demo: %s\n", toy_last_error());
        goto out;
    }
    struct toy_data_opts dopt = {.batch = o.B, .ctx = o.T, .heldout = 0.1, .seed = o.seed};
    if (toy_data_from_ids(ids.ids, ids.n, toy_tokenizer_n_vocab(tok), &dopt, &data)) {
        fprintf(stderr, "toy demo: %s\n", toy_last_error());
        goto out;
    }
    struct toy_llama_config cfg = toy_llama_preset("tiny");
    cfg.vocab = toy_tokenizer_n_vocab(tok);
    cfg.d_model = o.d;
    cfg.n_layers = o.layers;
    cfg.n_heads = o.d / 32;
    cfg.n_kv_heads = cfg.n_heads > 1 ? cfg.n_heads / 2 : 1;
    cfg.d_ff = 3 * o.d;
    cfg.max_ctx = o.T;
    if (!(m = toy_llama_new(&cfg, o.seed))) { fprintf(stderr, "toy demo: %s\n", toy_last_error()); goto out; }

    char run_id[128], run_dir[512], evpath[700];
    if (toy_run_create("runs", "demo-{date}-{seq}", "llama", run_id, sizeof run_id, run_dir, sizeof run_dir) ||
        toy_run_claim(run_dir, true, &run_lock)) { /* fresh: $TOY_RUN_ID may name a used folder */
        fprintf(stderr, "toy demo: %s\n", toy_last_error());
        goto out;
    }
    snprintf(evpath, sizeof evpath, "%s/events.jsonl", run_dir);
    if (toy_events_open(evpath, TOY_EVENTS_TRUNCATE, &ev)) { fprintf(stderr, "toy demo: %s\n", toy_last_error()); goto out; }
    struct toy_train_opts to = {.steps = o.steps, .accum = 1, .lr = o.lr, .lr_min = o.lr / 10, .warmup = o.steps / 20,
                                .schedule = TOY_LR_COSINE, .weight_decay = 0.1f, .beta1 = 0.9f, .beta2 = 0.95f,
                                .eps = 1e-8f, .clip = 1.0f, .seed = o.seed, .eval_every = 200, .eval_batches = 8,
                                .bf16 = o.bf16, .sample_prompt = "the ", .sample_tokens = 60, .stop = &toy_cli_stop};
    if (toy_trainer_new(m, tok, data, &to, run_dir, ev, o.threads, &tr)) {
        fprintf(stderr, "toy demo: %s\n", toy_last_error());
        goto out;
    }
    json_t *model = json_pack("{s:s,s:s,s:I,s:I,s:I}", "arch", "llama", "name", "toy-demo", "vocab", (json_int_t)cfg.vocab,
                              "d_model", (json_int_t)cfg.d_model, "n_layers", (json_int_t)cfg.n_layers);
    json_t *config = toy_train_opts_to_json(&to);
    struct toy_run_start rs = {.run_id = run_id, .phase = "train", .model = model, .config = config};
    toy_events_run_start(ev, &rs);
    json_decref(model);
    json_decref(config);

    printf("toy demo: a %lld-parameter Llama (d %lld, %lld layers, %lld heads / %lld kv heads, vocab %lld BPE tokens)\n"
           "          learns %zu KB of sentences from a built-in grammar: %lld steps of %lld x %lld tokens%s\n"
           "          run %s (events, checkpoints); a uniform guess scores ln(%lld) = %.2f\n",
           (long long)toy_llama_n_params(m), (long long)o.d, (long long)o.layers, (long long)cfg.n_heads, (long long)cfg.n_kv_heads,
           (long long)cfg.vocab, n_text / 1000, (long long)o.steps, (long long)o.B, (long long)o.T, o.bf16 ? ", bf16 matmuls" : "", run_dir,
           (long long)cfg.vocab, log((double)cfg.vocab));
    fflush(stdout);
    struct demo_ud ud;
    toy_progress_start(&ud.pb, "train", o.steps, "tok/s");
    toy_trainer_on_step(tr, on_step, &ud);
    toy_cli_stop_signals_install(); /* a stop request ends the run with a checkpoint and run_end */
    struct toy_train_result res;
    enum toy_status st = toy_trainer_run(tr, &res);
    toy_cli_stop_signals_restore();
    toy_progress_finish(&ud.pb);
    if (st && res.reason != TOY_RUN_INTERRUPTED) { fprintf(stderr, "toy demo: %s\n", toy_last_error()); goto out; }
    printf("%s %lld steps in %.1f s (%.0f tokens/s): loss %.3f, held-out loss %.3f\n",
           res.reason == TOY_RUN_INTERRUPTED ? "interrupted after" : "trained", (long long)res.final_step, res.seconds,
           res.tokens_per_s, res.final_loss, res.final_eval_loss);
    const char *sample = toy_trainer_sample_text(tr);
    printf("checkpoint: %s\n\n", res.checkpoint);
    if (sample && *sample) printf("sample (temperature 0.8):\n%s\n\n", sample); /* none when interrupted */
    printf("next: build/toy generate -m %s -p \"the child\"\n"
           "      build/toy train --data your.txt      (your own text; see README)\n", res.checkpoint);
    rc = res.reason == TOY_RUN_INTERRUPTED ? 130 : 0; /* as toy train */
out:
    toy_trainer_free(tr);
    toy_run_release(run_lock);
    toy_events_close(ev);
    toy_llama_free(m);
    toy_data_free(data);
    toy_tokens_free(&ids);
    toy_tokenizer_free(tok);
    free(text);
    return rc;
}
