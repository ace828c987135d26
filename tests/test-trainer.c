/* test-trainer.c: the training loop and run bundles.
 *  - resume: a run stopped at step k and resumed gives the same losses and
 *    weights, to the bit, as an uninterrupted run (same seed and threads);
 *  - a non-finite loss aborts with a checkpoint of the last good weights,
 *    `loss: null` and run_end reason "aborted";
 *  - a corrupt state file is a clear error on resume;
 *  - events.jsonl follows the toy/v1 rules (run_start first, run_end last,
 *    t monotonic, required keys per kind);
 *  - `toy train` interrupted by SIGINT leaves a loadable checkpoint and
 *    run_end reason "interrupted";
 *  - a small model trained a few hundred steps on TinyShakespeare ends with a
 *    held-out loss clearly below the unigram baseline. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "toy/data.h"
#include "toy/events.h"
#include "toy/gguf.h"
#include "toy/run-dir.h"
#include "toy/toy.h"
#include "toy/trainer.h"

static char tmp[256];

static void make_tmp(void) {
    snprintf(tmp, sizeof tmp, "/tmp/toy-test-trainer-XXXXXX");
    cr_assert(mkdtemp(tmp));
}

static void rm_tmp(void) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    if (system(cmd)) {}
}

/* a token stream with structure: a noisy repeating pattern over 40 ids */
static struct toy_data *make_data(uint64_t seed) {
    static int32_t ids[20000];
    struct toy_rng r;
    toy_rng_seed(&r, 5);
    for (int i = 0; i < 20000; i++) ids[i] = toy_rng_below(&r, 10) == 0 ? (int32_t)toy_rng_below(&r, 40) : (i * 7) % 40;
    struct toy_data_opts o = {.batch = 4, .ctx = 16, .heldout = 0.1, .seed = seed};
    struct toy_data *d;
    cr_assert_eq(toy_data_from_ids(ids, 20000, 40, &o, &d), TOY_OK, "%s", toy_last_error());
    return d;
}

static struct toy_train_opts base_opts(int64_t steps, volatile sig_atomic_t *stop) {
    return (struct toy_train_opts){.steps = steps, .accum = 2, .lr = 3e-3f, .lr_min = 3e-4f, .warmup = 3,
                                   .schedule = TOY_LR_COSINE, .weight_decay = 0.1f, .beta1 = 0.9f, .beta2 = 0.95f,
                                   .eps = 1e-8f, .clip = 1.0f, .seed = 9, .eval_every = 4, .eval_batches = 2,
                                   .stop = stop};
}

static struct toy_llama *small_model(void) {
    struct toy_llama_config c = toy_llama_preset("tiny");
    c.vocab = 40;
    c.max_ctx = 16;
    struct toy_llama *m = toy_llama_new(&c, 4);
    cr_assert(m);
    return m;
}

/* records losses; raises the stop flag after step stop_at (as Ctrl-C would) */
struct rec {
    float loss[64];
    volatile sig_atomic_t *stop;
    int64_t stop_at;
};

static void record(void *ud, const struct toy_step_info *s) {
    struct rec *r = ud;
    r->loss[s->step - 1] = s->loss;
    if (r->stop && s->step == r->stop_at) *r->stop = 1;
}

static float *copy_weights(struct toy_llama *m, int64_t *n) {
    int64_t total = toy_llama_n_params(m), at = 0;
    float *w = malloc((size_t)total * sizeof *w);
    for (int i = 0; i < toy_llama_n_tensors(m); i++) {
        struct toy_tensor *t = toy_llama_tensor(m, i);
        memcpy(w + at, t->data, (size_t)toy_nelements(t) * sizeof *w);
        at += toy_nelements(t);
    }
    *n = total;
    return w;
}

Test(trainer, resume_is_bit_identical, .timeout = 120) {
    make_tmp();
    const int64_t K = 6, N = 12;
    struct rec full = {0}, part = {0};
    int64_t nw;
    char dir[300];
    snprintf(dir, sizeof dir, "%s/full", tmp);
    cr_assert_eq(toy_mkdir_p(dir), TOY_OK);
    struct toy_llama *m = small_model();
    struct toy_data *d = make_data(9);
    struct toy_train_opts o = base_opts(N, NULL);
    struct toy_trainer *t;
    cr_assert_eq(toy_trainer_new(m, NULL, d, &o, dir, NULL, 2, &t), TOY_OK, "%s", toy_last_error());
    toy_trainer_on_step(t, record, &full);
    cr_assert_eq(toy_trainer_run(t, NULL), TOY_OK, "%s", toy_last_error());
    float *w_full = copy_weights(m, &nw);
    toy_trainer_free(t);
    toy_data_free(d);
    toy_llama_free(m);

    /* the same run, stopped after step K */
    snprintf(dir, sizeof dir, "%s/part", tmp);
    cr_assert_eq(toy_mkdir_p(dir), TOY_OK);
    volatile sig_atomic_t stop = 0;
    part.stop = &stop;
    part.stop_at = K;
    m = small_model();
    d = make_data(9);
    o = base_opts(N, &stop);
    cr_assert_eq(toy_trainer_new(m, NULL, d, &o, dir, NULL, 2, &t), TOY_OK);
    toy_trainer_on_step(t, record, &part);
    struct toy_train_result res;
    cr_assert_eq(toy_trainer_run(t, &res), TOY_OK);
    cr_assert_eq(res.reason, TOY_RUN_INTERRUPTED);
    cr_assert_eq(res.final_step, K);
    toy_trainer_free(t);
    toy_data_free(d);
    toy_llama_free(m);

    /* a new process would do this: load the checkpoint and its state */
    char ckpt[400], state[400];
    snprintf(ckpt, sizeof ckpt, "%s/weights/step_%lld.gguf", dir, (long long)K);
    snprintf(state, sizeof state, "%s/weights/step_%lld.state.gguf", dir, (long long)K);
    cr_assert_eq(toy_llama_load(ckpt, true, &m), TOY_OK, "%s", toy_last_error());
    d = make_data(9);
    o = base_opts(N, NULL);
    part.stop = NULL;
    cr_assert_eq(toy_trainer_new(m, NULL, d, &o, dir, NULL, 2, &t), TOY_OK);
    cr_assert_eq(toy_trainer_load_state(t, state), TOY_OK, "%s", toy_last_error());
    cr_assert_eq(toy_trainer_step(t), K);
    toy_trainer_on_step(t, record, &part);
    cr_assert_eq(toy_trainer_run(t, NULL), TOY_OK);
    int64_t nw2;
    float *w_res = copy_weights(m, &nw2);
    cr_assert_eq(nw, nw2);
    for (int64_t s = 0; s < N; s++)
        cr_assert(full.loss[s] == part.loss[s], "step %lld: %.9g uninterrupted, %.9g resumed", (long long)s + 1,
                  full.loss[s], part.loss[s]);
    cr_assert(!memcmp(w_full, w_res, (size_t)nw * sizeof(float)), "weights differ after resume");
    cr_log_info("resume: %lld steps, losses %.4f -> %.4f, identical to the bit", (long long)N, full.loss[0], full.loss[N - 1]);

    /* a corrupt state file is a clear error */
    FILE *f = fopen(state, "r+b");
    cr_assert(f);
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    cr_assert_eq(ftruncate(fileno(f), sz / 2), 0);
    fclose(f);
    cr_assert_neq(toy_trainer_load_state(t, state), TOY_OK);
    cr_assert(strstr(toy_last_error(), "step_6.state.gguf"), "the message names the file: %s", toy_last_error());
    toy_trainer_free(t);
    toy_data_free(d);
    toy_llama_free(m);
    free(w_full);
    free(w_res);
    rm_tmp();
}

/* events.jsonl: every line one JSON object, run_start first, run_end last,
 * t non-decreasing, required keys by kind */
static void check_events(const char *path, const char *want_reason) {
    FILE *f = fopen(path, "r");
    cr_assert(f, "no %s", path);
    char line[1 << 16];
    int n = 0;
    double t_prev = -1;
    const char *last_kind = "";
    static char kind_buf[32];
    while (fgets(line, sizeof line, f)) {
        json_error_t err;
        json_t *e = json_loads(line, 0, &err);
        cr_assert(e, "line %d is not JSON: %s", n + 1, err.text);
        const char *kind = json_string_value(json_object_get(e, "kind"));
        cr_assert(kind, "line %d has no kind", n + 1);
        double t = json_number_value(json_object_get(e, "t"));
        cr_assert(json_is_number(json_object_get(e, "t")) && t >= t_prev, "line %d: t %.6f after %.6f", n + 1, t, t_prev);
        t_prev = t;
        if (n == 0) {
            cr_assert_str_eq(kind, "run_start");
            cr_assert_str_eq(json_string_value(json_object_get(e, "schema")), "toy/v1");
            const char *req[] = {"started_at", "run_id", "phase", "host", "backend", "model", "config"};
            for (size_t i = 0; i < sizeof req / sizeof req[0]; i++)
                cr_assert(json_object_get(e, req[i]), "run_start lacks %s", req[i]);
        }
        if (!strcmp(kind, "step")) {
            const char *req[] = {"step", "loss", "lr", "tokens", "wall_us", "grad_norm"};
            for (size_t i = 0; i < sizeof req / sizeof req[0]; i++)
                cr_assert(json_object_get(e, req[i]), "step lacks %s", req[i]);
            json_t *l = json_object_get(e, "loss");
            cr_assert(json_is_number(l) || json_is_null(l));
        }
        if (!strcmp(kind, "run_end")) {
            cr_assert_str_eq(json_string_value(json_object_get(e, "reason")), want_reason);
            cr_assert(json_object_get(e, "final_step") && json_object_get(e, "exit_code"));
        }
        snprintf(kind_buf, sizeof kind_buf, "%s", kind);
        last_kind = kind_buf;
        json_decref(e);
        n++;
    }
    fclose(f);
    cr_assert_str_eq(last_kind, "run_end");
}

Test(trainer, nan_loss_aborts_with_a_checkpoint_of_the_last_good_state) {
    make_tmp();
    struct toy_llama *m = small_model();
    struct toy_data *d = make_data(1);
    struct toy_events *ev;
    char path[400];
    snprintf(path, sizeof path, "%s/events.jsonl", tmp);
    cr_assert_eq(toy_events_open(path, TOY_EVENTS_TRUNCATE, &ev), TOY_OK);
    json_t *model = json_pack("{s:s}", "arch", "llama"), *config = json_pack("{s:i}", "steps", 5);
    struct toy_run_start rs = {.run_id = "nan-test", .model = model, .config = config};
    cr_assert_eq(toy_events_run_start(ev, &rs), TOY_OK);
    json_decref(model);
    json_decref(config);
    struct toy_train_opts o = base_opts(5, NULL);
    struct toy_trainer *t;
    cr_assert_eq(toy_trainer_new(m, NULL, d, &o, tmp, ev, 2, &t), TOY_OK);
    float good = ((float *)m->out_norm->data)[0];
    ((float *)m->out_norm->data)[0] = NAN; /* poison: the first loss is NaN */
    struct toy_train_result res;
    cr_assert_eq(toy_trainer_run(t, &res), TOY_ERR_NUMERIC);
    cr_assert_eq(res.reason, TOY_RUN_ABORTED);
    cr_assert_eq(res.final_step, 0);
    cr_assert(strstr(toy_last_error(), "NaN"), "%s", toy_last_error());
    toy_events_close(ev);
    check_events(path, "aborted");
    /* the step event says loss: null */
    char cmd[600];
    snprintf(cmd, sizeof cmd, "grep -q '\"kind\":\"step\".*\"loss\":null' '%s'", path);
    cr_assert_eq(system(cmd), 0, "no step event with loss null");
    snprintf(path, sizeof path, "%s/weights/step_0.gguf", tmp);
    cr_assert_eq(access(path, R_OK), 0, "no checkpoint of the last good state");
    (void)good;
    toy_trainer_free(t);
    toy_data_free(d);
    toy_llama_free(m);
    rm_tmp();
}

static const char *toy_bin(void) { return getenv("TOY_BIN") ? getenv("TOY_BIN") : "build/toy"; }

/* A NaN or out-of-range optimizer setting is refused before anything is
 * built (it used to train to a NaN loss and then crash writing the
 * checkpoint, whose options JSON could not hold the NaN); the CLI refuses
 * non-finite numbers at parsing. */
/* Two trainers, one after the other, on the same model: the first one's gradient buffers went with its graph's
 * context, and the second one's backward reused them after they were freed (ASan: use after free) */
Test(trainer, a_second_trainer_on_the_same_model) {
    make_tmp();
    struct toy_llama *m = small_model();
    for (int round = 0; round < 2; round++) {
        struct toy_data *d = make_data(1);
        struct toy_train_opts o = base_opts(2, NULL);
        o.eval_every = 0;
        char dir[300];
        snprintf(dir, sizeof dir, "%s/r%d", tmp, round);
        struct toy_trainer *t;
        cr_assert_eq(toy_trainer_new(m, NULL, d, &o, dir, NULL, 1, &t), TOY_OK, "%s", toy_last_error());
        struct toy_train_result r;
        cr_assert_eq(toy_trainer_run(t, &r), TOY_OK, "%s", toy_last_error());
        cr_expect(isfinite(r.final_loss));
        toy_trainer_free(t);
        toy_data_free(d);
        for (int i = 0; i < toy_llama_n_tensors(m); i++)
            cr_expect_null(toy_llama_tensor(m, i)->grad, "round %d: a gradient outlived its trainer", round);
    }
    toy_llama_free(m);
    rm_tmp();
}

/* Graphs sharing one membuf: planning a bigger one moves the block, and the one planned before follows it (it
 * wrote into the freed block); and a second backward of the same loss is refused, not appended */
Test(trainer, graphs_share_a_membuf) {
    struct toy_ctx *ctx = toy_ctx_init(true);
    struct toy_tensor *w = toy_new_tensor_1d(ctx, TOY_F32, 4);
    for (int i = 0; i < 4; i++) ((float *)w->data)[i] = (float)i;
    struct toy_tensor *small = toy_sum_all(ctx, toy_sqr(ctx, w));
    struct toy_tensor *big_in = toy_new_tensor_1d(ctx, TOY_F32, 1 << 16);
    struct toy_tensor *big = toy_sum_all(ctx, toy_sqr(ctx, toy_scale(ctx, big_in, 2.0f)));
    struct toy_graph *g1 = toy_graph_new(ctx), *g2 = toy_graph_new(ctx);
    toy_graph_build(g1, small);
    toy_graph_build(g2, big);
    struct toy_membuf mb = {0};
    struct toy_threadpool *tp = toy_threadpool_new(1);
    cr_assert_eq(toy_graph_plan(g1, &mb, NULL), TOY_OK);
    void *before = mb.data;
    cr_assert_eq(toy_graph_plan(g2, &mb, NULL), TOY_OK);
    cr_assert_neq(mb.data, before, "the bigger plan moved the block");
    cr_assert_eq(toy_graph_compute(g1, tp), TOY_OK);
    cr_expect_float_eq(*(float *)small->data, 14.0f, 1e-6);
    cr_assert_eq(toy_graph_compute(g2, tp), TOY_OK);
    toy_threadpool_free(tp);
    toy_membuf_free(&mb);
    toy_ctx_free(ctx);
}

static void backward_twice(void) {
    struct toy_ctx *ctx = toy_ctx_init(true);
    struct toy_tensor *w = toy_new_tensor_1d(ctx, TOY_F32, 4);
    toy_set_param(w);
    struct toy_tensor *l = toy_sum_all(ctx, toy_sqr(ctx, w));
    struct toy_graph *g = toy_graph_new(ctx);
    toy_graph_build(g, l);
    toy_graph_backward(g, l);
    toy_graph_backward(g, l);
}

Test(trainer, a_second_backward_is_refused, .signal = SIGABRT) { backward_twice(); }

Test(trainer, bad_optimizer_settings_are_refused) {
    make_tmp();
    struct toy_llama *m = small_model();
    struct toy_data *d = make_data(1);
    struct toy_trainer *t = NULL;
    struct toy_train_opts o = base_opts(2, NULL);
    o.lr = NAN;
    cr_expect_eq(toy_trainer_new(m, NULL, d, &o, tmp, NULL, 1, &t), TOY_ERR_INVALID_ARG);
    cr_expect(strstr(toy_last_error(), "lr"), "%s", toy_last_error());
    o = base_opts(2, NULL);
    o.beta2 = 1.0f;
    cr_expect_eq(toy_trainer_new(m, NULL, d, &o, tmp, NULL, 1, &t), TOY_ERR_INVALID_ARG);
    o = base_opts(2, NULL);
    o.clip = INFINITY;
    cr_expect_eq(toy_trainer_new(m, NULL, d, &o, tmp, NULL, 1, &t), TOY_ERR_INVALID_ARG);
    cr_expect_null(t);
    toy_data_free(d);
    toy_llama_free(m);
    if (!access(toy_bin(), X_OK)) {
        char cmd[800];
        snprintf(cmd, sizeof cmd, "%s train --data /dev/null --lr nan --out %s/cli 2>&1 | grep -q \"bad value 'nan' for --lr\"",
                 toy_bin(), tmp);
        cr_expect_eq(system(cmd), 0, "toy train --lr nan was not refused at parsing");
        snprintf(cmd, sizeof cmd, "%s generate -m /dev/null -p x --temp inf 2>&1 | grep -q \"bad value 'inf' for --temp\"",
                 toy_bin());
        cr_expect_eq(system(cmd), 0, "toy generate --temp inf was not refused at parsing");
    }
    rm_tmp();
}

/* A disk that cannot take the checkpoint (a file-size limit stands in for
 * a full disk: writes past it fail with EFBIG, as ENOSPC would): a clear
 * error naming the file, exit 1, a run_end event saying so, and no
 * half-written file under weights/. The checkpoint writers go through a
 * temporary file and a rename, so an earlier checkpoint would stay whole. */
Test(trainer, cli_full_disk_is_a_clear_error_without_partial_files, .timeout = 120) {
    if (access(toy_bin(), X_OK)) cr_skip_test("no %s", toy_bin());
    make_tmp();
    char text[300], cmd[1600];
    snprintf(text, sizeof text, "%s/text.txt", tmp);
    FILE *f = fopen(text, "w");
    for (int i = 0; i < 800; i++) fprintf(f, "the %s fox jumps over the lazy dog. ", i % 3 ? "quick" : "slow");
    fclose(f);
    snprintf(cmd, sizeof cmd,
             "sh -c \"trap '' XFSZ; ulimit -f 8; exec '%s' train --data '%s' --vocab-size 300 --steps 3 --dim 64 "
             "--layers 2 --heads 2 --ff 128 --ctx 32 --batch 2 --threads 1 --out '%s/run'\" > '%s/out.txt' 2>&1",
             toy_bin(), text, tmp, tmp);
    int st = system(cmd);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 1, "exit status %d", WEXITSTATUS(st));
    snprintf(cmd, sizeof cmd, "grep -q 'checkpoint: .*step_3.*File too large' '%s/out.txt'", tmp);
    cr_expect_eq(system(cmd), 0, "no error naming the checkpoint and the reason");
    snprintf(cmd, sizeof cmd, "%s/run/events.jsonl", tmp);
    check_events(cmd, "errored");
    snprintf(cmd, sizeof cmd, "test -z \"$(ls -A '%s/run/weights')\"", tmp);
    cr_expect_eq(system(cmd), 0, "a partial file was left in weights/");
    rm_tmp();
}

Test(trainer, cli_interrupt_leaves_a_loadable_checkpoint, .timeout = 120) {
    if (access(toy_bin(), X_OK)) cr_skip_test("no %s", toy_bin());
    make_tmp();
    char text[300], out[300];
    snprintf(text, sizeof text, "%s/text.txt", tmp);
    snprintf(out, sizeof out, "%s/run", tmp);
    FILE *f = fopen(text, "w");
    for (int i = 0; i < 3000; i++) fprintf(f, "the %s fox jumps over the %s dog. ", i % 3 ? "quick" : "slow", i % 5 ? "lazy" : "sleepy");
    fclose(f);
    pid_t pid = fork();
    if (pid == 0) {
        int null = open("/dev/null", 1);
        dup2(null, 1);
        dup2(null, 2);
        execl(toy_bin(), "toy", "train", "--data", text, "--preset", "tiny", "--vocab-size", "300", "--steps", "100000",
              "--batch", "2", "--ctx", "32", "--eval-every", "0", "--threads", "1", "--out", out, (char *)NULL);
        _exit(127);
    }
    /* wait for a few steps, then Ctrl-C */
    char ev[400];
    snprintf(ev, sizeof ev, "%s/events.jsonl", out);
    for (int i = 0; i < 600; i++) {
        char cmd[600];
        snprintf(cmd, sizeof cmd, "grep -q '\"step\":5,' '%s' 2>/dev/null", ev);
        if (!system(cmd)) break;
        usleep(50000);
    }
    kill(pid, SIGINT);
    int status;
    waitpid(pid, &status, 0);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 130, "exit status %d", WEXITSTATUS(status));
    check_events(ev, "interrupted");
    char latest[400];
    snprintf(latest, sizeof latest, "%s/weights/latest", out);
    struct toy_llama *m;
    cr_assert_eq(toy_llama_load(latest, false, &m), TOY_OK, "%s", toy_last_error());
    toy_llama_free(m);
    rm_tmp();
}

/* Held-out cross-entropy of a unigram model fitted on the training part
 * (add-one smoothed): the baseline a language model must beat. */
static double unigram_baseline(struct toy_data *d) {
    int64_t V = toy_data_vocab(d), n_train = toy_data_train_tokens(d), n = toy_data_count(d);
    const uint32_t *ids = toy_data_ids(d);
    double *cnt = calloc((size_t)V, sizeof *cnt);
    for (int64_t i = 0; i < n_train; i++) cnt[ids[i]] += 1;
    double ce = 0;
    for (int64_t i = n_train; i < n; i++) ce -= log((cnt[ids[i]] + 1) / (double)(n_train + V));
    free(cnt);
    return ce / (double)(n - n_train);
}

Test(trainer, tinyshakespeare_beats_the_unigram_baseline, .timeout = 600) {
    const char *path = "../shared/testdata/corpus-tinyshakespeare/input.txt";
    FILE *f = fopen(path, "rb");
    if (!f) cr_skip_test("no %s", path);
    static char text[1 << 21];
    size_t len = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[len] = 0;
    make_tmp();
    struct toy_tokenizer *tok;
    struct toy_bpe_train_opts bo = {.vocab_size = 384};
    cr_assert_eq(toy_tokenizer_train_bpe(text, len, &bo, &tok), TOY_OK, "%s", toy_last_error());
    struct toy_tokens ids = {0};
    cr_assert_eq(toy_tokenizer_encode(tok, text, len, 0, &ids), TOY_OK);
    struct toy_data_opts dopt = {.batch = 8, .ctx = 64, .heldout = 0.05, .seed = 1};
    struct toy_data *d;
    cr_assert_eq(toy_data_from_ids(ids.ids, ids.n, toy_tokenizer_n_vocab(tok), &dopt, &d), TOY_OK);
    struct toy_llama_config c = toy_llama_preset("tiny");
    c.vocab = toy_tokenizer_n_vocab(tok);
    c.d_model = 96;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.d_ff = 256;
    c.n_layers = 2;
    c.max_ctx = 64;
    struct toy_llama *m = toy_llama_new(&c, 1);
    struct toy_train_opts o = base_opts(300, NULL);
    o.accum = 1;
    o.lr = 4e-3f;
    o.warmup = 20;
    o.eval_every = 0;
    o.eval_batches = 16;
    struct toy_trainer *t;
    cr_assert_eq(toy_trainer_new(m, tok, d, &o, tmp, NULL, 2, &t), TOY_OK);
    struct toy_train_result res;
    cr_assert_eq(toy_trainer_run(t, &res), TOY_OK, "%s", toy_last_error());
    double base = unigram_baseline(d);
    cr_log_info("TinyShakespeare, %lld tokens (BPE 384): held-out loss %.3f after 300 steps vs unigram %.3f "
                "(uniform %.3f), %.0f tokens/s", (long long)ids.n, res.final_eval_loss, base, log((double)c.vocab),
                res.tokens_per_s);
    cr_assert_lt(res.final_eval_loss, base - 0.3, "held-out %.3f is not clearly below the unigram %.3f",
                 res.final_eval_loss, base);
    toy_trainer_free(t);
    toy_data_free(d);
    toy_llama_free(m);
    toy_tokens_free(&ids);
    toy_tokenizer_free(tok);
    rm_tmp();
}
