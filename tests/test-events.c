/* test-events.c: the toy/v1 event stream (src/io/events.c) validated
 * against the schema in docs/events.md (required keys and types of every
 * kind; run_start first, run_end last; t non-decreasing), the producer's
 * ordering rules, NaN -> null, float formatting, UTF-8 repair, concurrent
 * emitters, the reader skipping torn lines and unknown kinds, git
 * provenance from the files of a fake repository, run ids with the daily
 * counter, the atomic `latest` link (src/io/run-dir.c), and `toy runs`
 * (cli/cmd-runs.c, needs TOY_BIN). Everything is written under mkdtemp. */
#include <criterion/criterion.h>
#include <stdarg.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <sys/wait.h>
#include <signal.h>
#include <sys/resource.h>
#include <fcntl.h>
#include <unistd.h>

#include "toy/events.h"
#include "toy/run-dir.h"

/* snprintf through a va_list: paths here are short, and the compiler's
 * truncation warnings for PATH_MAX-sized parts are noise in tests. */
static void pf(char *out, size_t n, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(out, n, fmt, ap);
    va_end(ap);
    cr_assert(k >= 0 && (size_t)k < n, "path too long");
}

static char *tmpdir(void) {
    char *d = strdup("/tmp/toy-test-events-XXXXXX");
    cr_assert(mkdtemp(d));
    return d;
}

static void rm_rf(const char *d) {
    char cmd[PATH_MAX + 16];
    pf(cmd, sizeof cmd, "rm -rf '%s'", d);
    cr_expect_eq(system(cmd), 0);
}

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    cr_assert(f, "%s", path);
    fputs(text, f);
    fclose(f);
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "r");
    cr_assert(f, "%s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    char *s = malloc((size_t)n + 1);
    cr_assert_eq(fread(s, 1, (size_t)n, f), (size_t)n);
    s[n] = 0;
    fclose(f);
    return s;
}

/* ---- the schema, as a consumer checks it ---------------------------------------- */

#define REQ(cond, ...) cr_assert(cond, __VA_ARGS__)

static bool is_int(json_t *o, const char *k) { return json_is_integer(json_object_get(o, k)); }
static bool is_str(json_t *o, const char *k) { return json_is_string(json_object_get(o, k)); }
static bool is_num_or_null(json_t *o, const char *k) {
    json_t *v = json_object_get(o, k);
    return json_is_number(v) || json_is_null(v);
}
static bool is_iso(json_t *o, const char *k) {
    const char *s = json_string_value(json_object_get(o, k));
    int y, mo, d, h, mi, se;
    char z;
    return s && strlen(s) == 20 && sscanf(s, "%4d-%2d-%2dT%2d:%2d:%2d%c", &y, &mo, &d, &h, &mi, &se, &z) == 7 &&
           z == 'Z';
}

/* Checks one event's required keys and types (docs/events.md); line is 1-based. */
static void check_event(json_t *e, int line) {
    const char *kind = json_string_value(json_object_get(e, "kind"));
    REQ(kind, "line %d: no kind", line);
    REQ(json_is_number(json_object_get(e, "t")) && json_number_value(json_object_get(e, "t")) >= 0, "line %d: t", line);
    if (!strcmp(kind, "run_start")) {
        REQ(!strcmp(json_string_value(json_object_get(e, "schema")), "toy/v1"), "line %d: schema", line);
        REQ(is_iso(e, "started_at") && is_str(e, "run_id") && is_str(e, "phase"), "line %d: run_start ids", line);
        json_t *h = json_object_get(e, "host");
        REQ(is_str(h, "name") && is_str(h, "os") && is_str(h, "arch"), "line %d: host", line);
        REQ(is_str(json_object_get(e, "backend"), "kind"), "line %d: backend", line);
        REQ(json_is_object(json_object_get(e, "config")), "line %d: config", line);
        json_t *m = json_object_get(e, "model");
        REQ(!m || json_is_object(m), "line %d: model", line);
        json_t *g = json_object_get(e, "git");
        if (g) {
            const char *sha = json_string_value(json_object_get(g, "sha"));
            REQ(sha && strlen(sha) == 40 && strspn(sha, "0123456789abcdef") == 40, "line %d: git.sha", line);
            json_t *b = json_object_get(g, "branch");
            REQ(json_is_string(b) || json_is_null(b), "line %d: git.branch", line);
        }
    } else if (!strcmp(kind, "step")) {
        REQ(is_int(e, "step") && json_integer_value(json_object_get(e, "step")) >= 1, "line %d: step", line);
        REQ(is_str(e, "phase") && is_num_or_null(e, "loss") && is_num_or_null(e, "lr") && is_int(e, "tokens") &&
                is_int(e, "wall_us") && is_num_or_null(e, "grad_norm"),
            "line %d: step fields", line);
    } else if (!strcmp(kind, "eval")) {
        REQ(!strcmp(json_string_value(json_object_get(e, "phase")), "eval"), "line %d: eval phase", line);
        REQ(is_int(e, "step") && is_str(e, "name") && is_num_or_null(e, "loss") && is_num_or_null(e, "ppl") &&
                is_int(e, "samples"),
            "line %d: eval fields", line);
    } else if (!strcmp(kind, "sample")) {
        REQ(is_int(e, "step") && is_str(e, "prompt") && is_str(e, "text"), "line %d: sample", line);
    } else if (!strcmp(kind, "note")) {
        REQ(is_int(e, "step") && is_str(e, "text"), "line %d: note", line);
    } else if (!strcmp(kind, "op_timing")) {
        REQ(is_int(e, "step") && is_int(e, "compute_us") && json_is_object(json_object_get(e, "buckets")),
            "line %d: op_timing", line);
        const char *k;
        json_t *v;
        json_object_foreach(json_object_get(e, "buckets"), k, v) REQ(json_is_number(v), "line %d: bucket %s", line, k);
    } else if (!strcmp(kind, "run_end")) {
        const char *r = json_string_value(json_object_get(e, "reason"));
        REQ(r && (!strcmp(r, "completed") || !strcmp(r, "interrupted") || !strcmp(r, "aborted") || !strcmp(r, "errored")),
            "line %d: reason", line);
        json_t *err = json_object_get(e, "error");
        REQ(is_iso(e, "ended_at") && (json_is_string(err) || json_is_null(err)) && is_int(e, "final_step") &&
                is_num_or_null(e, "final_loss") && is_int(e, "exit_code"),
            "line %d: run_end fields", line);
    }
}

/* Validates a whole stream; returns its events (an array, caller decrefs). */
static json_t *validate(const char *path) {
    FILE *f = fopen(path, "r");
    cr_assert(f, "%s", path);
    json_t *all = json_array();
    char *l = NULL;
    size_t cap = 0;
    ssize_t len;
    int line = 0;
    double last_t = -1;
    while ((len = getline(&l, &cap, f)) > 0) {
        line++;
        REQ(l[len - 1] == '\n', "line %d: no newline", line);
        json_error_t err;
        json_t *e = json_loadb(l, (size_t)len, 0, &err);
        REQ(json_is_object(e), "line %d: not a JSON object: %s (%s)", line, err.text, l);
        REQ(!strchr(l, '\n') || strchr(l, '\n') == l + len - 1, "line %d: two lines in one", line);
        check_event(e, line);
        double t = json_number_value(json_object_get(e, "t"));
        REQ(t >= last_t, "line %d: t went back (%g < %g)", line, t, last_t);
        last_t = t;
        json_array_append_new(all, e);
    }
    free(l);
    fclose(f);
    size_t n = json_array_size(all);
    REQ(n >= 2, "%zu events", n);
    for (size_t i = 0; i < n; i++) {
        const char *k = json_string_value(json_object_get(json_array_get(all, i), "kind"));
        REQ((i == 0) == !strcmp(k, "run_start"), "event %zu: %s (run_start must be first and only first)", i, k);
        REQ((i == n - 1) == !strcmp(k, "run_end"), "event %zu: %s (run_end must be last and only last)", i, k);
    }
    return all;
}

static json_t *nth(json_t *all, size_t i) { return json_array_get(all, i); }
static const char *kind_of(json_t *e) { return json_string_value(json_object_get(e, "kind")); }

/* A typical short training run. */
static void write_run(const char *path, const char *run_id, int steps, bool nan_last) {
    struct toy_events *ev;
    cr_assert_eq(toy_events_open(path, TOY_EVENTS_TRUNCATE, &ev), TOY_OK, "%s", toy_last_error());
    json_t *model = json_pack("{s:s, s:s, s:i, s:i, s:i}", "arch", "llama", "name", "tiny", "vocab", 256, "d_model", 64,
                              "n_layers", 2);
    json_t *config = json_pack("{s:i, s:i, s:f, s:i}", "context", 32, "steps", steps, "lr", 3e-4, "seed", 7);
    cr_assert_eq(toy_events_run_start(ev, &(struct toy_run_start){.run_id = run_id, .backend = "cpu", .model = model,
                                                                   .config = config}),
                 TOY_OK, "%s", toy_last_error());
    json_decref(model);
    json_decref(config);
    float loss = 5.5f;
    for (int s = 1; s <= steps; s++, loss *= 0.9f) {
        float l = nan_last && s == steps ? NAN : loss;
        cr_assert_eq(toy_events_step(ev, &(struct toy_step_event){.step = s, .loss = l, .lr = 3e-4f, .tokens = 256,
                                                                  .wall_us = 1000 + s, .grad_norm = 1.25f}),
                     TOY_OK);
    }
    cr_assert_eq(toy_events_eval(ev, &(struct toy_eval_event){.step = steps, .loss = 2.5, .samples = 16, .tokens = 512}),
                 TOY_OK);
    cr_assert_eq(toy_events_run_end(ev, &(struct toy_run_end){.reason = nan_last ? TOY_RUN_ABORTED : TOY_RUN_COMPLETED,
                                                              .error = nan_last ? "loss is NaN" : NULL,
                                                              .final_step = steps,
                                                              .final_loss = nan_last ? NAN : loss / 0.9f,
                                                              .exit_code = nan_last ? 1 : 0}),
                 TOY_OK);
    toy_events_close(ev);
}

Test(events, full_run_matches_schema) {
    char *d = tmpdir(), path[PATH_MAX];
    pf(path, sizeof path, "%s/runs/llama-x/events.jsonl", d); /* parents created */
    struct toy_events *ev;
    cr_assert_eq(toy_events_open(path, TOY_EVENTS_TRUNCATE, &ev), TOY_OK, "%s", toy_last_error());
    cr_expect_str_eq(toy_events_path(ev), path);
    cr_expect(toy_events_now(ev) >= 0 && toy_events_now(ev) < 5);
    json_t *model = json_pack("{s:s, s:i}", "arch", "llama", "vocab", 256);
    json_t *config = json_pack("{s:i, s:f, s:b}", "steps", 3, "beta2", 0.95, "bf16", 0);
    json_t *extra = json_pack("{s:s}", "compare_to", "llama-y");
    cr_assert_eq(toy_events_run_start(ev, &(struct toy_run_start){.run_id = "llama-x", .backend = "cpu", .model = model,
                                                                   .config = config, .extra = extra}),
                 TOY_OK, "%s", toy_last_error());
    json_decref(model), json_decref(config), json_decref(extra);
    for (int s = 1; s <= 3; s++) {
        json_t *x = json_pack("{s:f}", "ppl", 12.5);
        cr_assert_eq(toy_events_step(ev, &(struct toy_step_event){.step = s, .loss = 2.25f, .lr = 3e-4f,
                                                                  .tokens = 1024, .wall_us = 5000, .grad_norm = 0.5f,
                                                                  .extra = x}),
                     TOY_OK);
        json_decref(x);
    }
    json_t *buckets = json_pack("{s:i, s:i, s:i}", "MUL_MAT", 900, "ROPE", 20, "other", 80);
    cr_assert_eq(toy_events_op_timing(ev, 3, 1000, buckets), TOY_OK);
    json_decref(buckets);
    json_t *eextra = json_pack("{s:i}", "windows", 4);
    cr_assert_eq(toy_events_eval(ev, &(struct toy_eval_event){.step = 3, .name = "final", .loss = log(8.0), .samples = 4,
                                                              .extra = eextra}),
                 TOY_OK);
    json_decref(eextra);
    cr_assert_eq(toy_events_sample(ev, 3, "Once", "Once upon a time"), TOY_OK);
    cr_assert_eq(toy_events_note(ev, 3, "checkpoint saved"), TOY_OK);
    json_t *tap = json_pack("{s:i, s:s, s:i, s:f, s:s, s:i}", "step", 3, "region", "ffn_out", "layer", 0, "l2", 1.5,
                            "kind", "not-this", "t", -5); /* kind and t are the stream's */
    cr_assert_eq(toy_events_emit(ev, "tap", tap), TOY_OK);
    json_decref(tap);
    cr_assert_eq(toy_events_run_end(ev, &(struct toy_run_end){.reason = TOY_RUN_COMPLETED, .final_step = 3,
                                                              .final_loss = 2.25f}),
                 TOY_OK);
    toy_events_close(ev);

    json_t *all = validate(path);
    cr_assert_eq(json_array_size(all), 10);
    json_t *rs = nth(all, 0);
    cr_expect_str_eq(json_string_value(json_object_get(rs, "run_id")), "llama-x");
    cr_expect_str_eq(json_string_value(json_object_get(rs, "phase")), "train");
    cr_expect_str_eq(json_string_value(json_object_get(json_object_get(rs, "model"), "arch")), "llama");
    cr_expect_eq(json_integer_value(json_object_get(json_object_get(rs, "config"), "steps")), 3);
    cr_expect_str_eq(json_string_value(json_object_get(rs, "compare_to")), "llama-y");
    cr_expect_str_eq(json_string_value(json_object_get(json_object_get(rs, "backend"), "kind")), "cpu");
    cr_expect(json_is_string(json_object_get(json_object_get(rs, "backend"), "bf16_gemm")));
    cr_expect(json_is_string(json_object_get(json_object_get(rs, "backend"), "blas_core")));
    json_t *st = nth(all, 1);
    cr_expect_eq(json_integer_value(json_object_get(st, "step")), 1);
    cr_expect_eq(json_real_value(json_object_get(st, "loss")), 2.25);
    cr_expect_eq(json_real_value(json_object_get(st, "ppl")), 12.5);
    cr_expect_str_eq(kind_of(nth(all, 4)), "op_timing");
    json_t *e = nth(all, 5);
    cr_expect_str_eq(kind_of(e), "eval");
    cr_expect_float_eq(json_real_value(json_object_get(e, "ppl")), 8.0, 1e-9);
    cr_expect_eq(json_integer_value(json_object_get(json_object_get(e, "extra"), "windows")), 4);
    cr_expect_str_eq(json_string_value(json_object_get(nth(all, 6), "text")), "Once upon a time");
    cr_expect_str_eq(kind_of(nth(all, 8)), "tap");
    cr_expect_str_eq(json_string_value(json_object_get(nth(all, 8), "region")), "ffn_out");
    json_t *end = nth(all, 9);
    cr_expect_str_eq(json_string_value(json_object_get(end, "reason")), "completed");
    cr_expect(json_is_null(json_object_get(end, "error")));
    cr_expect_eq(json_integer_value(json_object_get(end, "exit_code")), 0);
    json_decref(all);

    /* the text itself: kind and t lead each line; a float lr prints as 0.0003 */
    char *txt = slurp(path);
    cr_expect(!strncmp(txt, "{\"kind\":\"run_start\",\"t\":", 24), "%.60s", txt);
    cr_expect(strstr(txt, "{\"kind\":\"step\",\"t\":"));
    cr_expect(strstr(txt, "\"lr\":0.0003,"), "%s", txt);
    cr_expect(strstr(txt, "\"grad_norm\":0.5"));
    cr_expect(!strstr(txt, "0.000300000014"));
    free(txt);
    rm_rf(d);
    free(d);
}

Test(events, nan_loss_is_null) {
    char *d = tmpdir(), path[PATH_MAX];
    pf(path, sizeof path, "%s/events.jsonl", d);
    write_run(path, "r", 3, true);
    json_t *all = validate(path);
    json_t *last_step = nth(all, 3), *end = nth(all, 5);
    cr_expect(json_is_null(json_object_get(last_step, "loss")));
    cr_expect(json_is_real(json_object_get(nth(all, 2), "loss")));
    cr_expect(json_is_null(json_object_get(end, "final_loss")));
    cr_expect_str_eq(json_string_value(json_object_get(end, "reason")), "aborted");
    cr_expect_str_eq(json_string_value(json_object_get(end, "error")), "loss is NaN");
    cr_expect_eq(json_integer_value(json_object_get(end, "exit_code")), 1);
    json_decref(all);
    /* infinities too, in eval (ppl as well) and grad_norm */
    struct toy_events *ev;
    cr_assert_eq(toy_events_open(path, TOY_EVENTS_TRUNCATE, &ev), TOY_OK);
    cr_assert_eq(toy_events_run_start(ev, &(struct toy_run_start){.no_git = true}), TOY_OK);
    cr_assert_eq(toy_events_step(ev, &(struct toy_step_event){.step = 1, .loss = INFINITY, .grad_norm = NAN}), TOY_OK);
    cr_assert_eq(toy_events_eval(ev, &(struct toy_eval_event){.step = 1, .loss = -INFINITY}), TOY_OK);
    cr_assert_eq(toy_events_run_end(ev, &(struct toy_run_end){.reason = TOY_RUN_ABORTED, .final_loss = INFINITY}), TOY_OK);
    toy_events_close(ev);
    all = validate(path);
    cr_expect_str_eq(json_string_value(json_object_get(nth(all, 0), "run_id")), "anonymous");
    cr_expect(!json_object_get(nth(all, 0), "git"));
    cr_expect(json_is_null(json_object_get(nth(all, 1), "loss")));
    cr_expect(json_is_null(json_object_get(nth(all, 1), "grad_norm")));
    cr_expect(json_is_null(json_object_get(nth(all, 2), "loss")));
    cr_expect(json_is_null(json_object_get(nth(all, 2), "ppl")));
    json_decref(all);
    char *txt = slurp(path);
    cr_expect(!strstr(txt, "nan") && !strstr(txt, "inf") && !strstr(txt, "NaN"), "%s", txt);
    free(txt);
    rm_rf(d);
    free(d);
}

Test(events, order_is_enforced) {
    char *d = tmpdir(), path[PATH_MAX];
    pf(path, sizeof path, "%s/events.jsonl", d);
    struct toy_events *ev;
    cr_assert_eq(toy_events_open(path, TOY_EVENTS_TRUNCATE, &ev), TOY_OK);
    cr_expect_eq(toy_events_step(ev, &(struct toy_step_event){.step = 1}), TOY_ERR_STATE);
    cr_expect(strstr(toy_last_error(), "before run_start"), "%s", toy_last_error());
    cr_expect_eq(toy_events_run_end(ev, &(struct toy_run_end){0}), TOY_ERR_STATE);
    cr_expect_eq(toy_events_emit(ev, "run_start", NULL), TOY_ERR_INVALID_ARG);
    /* a NULL event struct is an argument error naming the function, not a crash */
    cr_expect_eq(toy_events_run_start(ev, NULL), TOY_ERR_INVALID_ARG);
    cr_expect(strstr(toy_last_error(), "toy_events_run_start: NULL event"), "%s", toy_last_error());
    cr_expect_eq(toy_events_step(ev, NULL), TOY_ERR_INVALID_ARG);
    cr_expect_eq(toy_events_eval(ev, NULL), TOY_ERR_INVALID_ARG);
    cr_expect_eq(toy_events_run_end(ev, NULL), TOY_ERR_INVALID_ARG);
    cr_expect(strstr(toy_last_error(), "toy_events_run_end: NULL event"), "%s", toy_last_error());
    json_t *bad = json_integer(3);
    cr_expect_eq(toy_events_run_start(ev, &(struct toy_run_start){.config = bad}), TOY_ERR_INVALID_ARG);
    json_decref(bad);
    cr_assert_eq(toy_events_run_start(ev, &(struct toy_run_start){.no_git = true}), TOY_OK);
    cr_expect_eq(toy_events_run_start(ev, &(struct toy_run_start){.no_git = true}), TOY_ERR_STATE);
    cr_expect_eq(toy_events_emit(ev, "run_end", NULL), TOY_ERR_INVALID_ARG);
    cr_expect_eq(toy_events_emit(ev, "", NULL), TOY_ERR_INVALID_ARG);
    cr_assert_eq(toy_events_run_end(ev, &(struct toy_run_end){.reason = TOY_RUN_INTERRUPTED}), TOY_OK);
    cr_expect_eq(toy_events_note(ev, 1, "late"), TOY_ERR_STATE);
    cr_expect(strstr(toy_last_error(), "after run_end"), "%s", toy_last_error());
    cr_expect_eq(toy_events_run_end(ev, &(struct toy_run_end){0}), TOY_ERR_STATE);
    toy_events_close(ev);
    toy_events_close(NULL);
    json_t *all = validate(path);
    cr_expect_eq(json_array_size(all), 2);
    cr_expect_str_eq(json_string_value(json_object_get(nth(all, 1), "reason")), "interrupted");
    json_decref(all);
    cr_expect_eq(toy_events_open("/proc/toy-no-such/x/events.jsonl", TOY_EVENTS_TRUNCATE, &ev), TOY_ERR_IO);
    cr_expect_null(ev);
    rm_rf(d);
    free(d);
}

Test(events, text_is_made_valid_utf8) {
    char *d = tmpdir(), path[PATH_MAX];
    pf(path, sizeof path, "%s/events.jsonl", d);
    struct toy_events *ev;
    cr_assert_eq(toy_events_open(path, TOY_EVENTS_TRUNCATE, &ev), TOY_OK);
    cr_assert_eq(toy_events_run_start(ev, &(struct toy_run_start){.no_git = true}), TOY_OK);
    cr_assert_eq(toy_events_note(ev, 0, "ok \xc3\xa9 bad \xff\xc3 \xed\xa0\x80 end \"q\"\n"), TOY_OK);
    cr_assert_eq(toy_events_sample(ev, 0, NULL, "\xe2\x82"), TOY_OK);
    cr_assert_eq(toy_events_run_end(ev, &(struct toy_run_end){0}), TOY_OK);
    toy_events_close(ev);
    json_t *all = validate(path);
    cr_expect_str_eq(json_string_value(json_object_get(nth(all, 1), "text")),
                     "ok \xc3\xa9 bad \xef\xbf\xbd\xef\xbf\xbd \xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd end \"q\"\n");
    cr_expect_str_eq(json_string_value(json_object_get(nth(all, 2), "text")), "\xef\xbf\xbd"); /* one cut character */
    cr_expect_str_eq(json_string_value(json_object_get(nth(all, 2), "prompt")), "");
    json_decref(all);
    rm_rf(d);
    free(d);
}

struct thr {
    struct toy_events *ev;
    int id;
};

static void *emit_many(void *p) {
    struct thr *t = p;
    for (int i = 0; i < 200; i++) {
        json_t *f = json_pack("{s:i, s:i, s:s}", "step", i, "thread", t->id, "text", "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx");
        cr_assert_eq(toy_events_emit(t->ev, "note", f), TOY_OK);
        json_decref(f);
    }
    return NULL;
}

Test(events, concurrent_emitters_never_split_lines) {
    char *d = tmpdir(), path[PATH_MAX];
    pf(path, sizeof path, "%s/events.jsonl", d);
    struct toy_events *ev;
    cr_assert_eq(toy_events_open(path, TOY_EVENTS_TRUNCATE, &ev), TOY_OK);
    cr_assert_eq(toy_events_run_start(ev, &(struct toy_run_start){.no_git = true}), TOY_OK);
    pthread_t th[4];
    struct thr a[4];
    for (int i = 0; i < 4; i++) {
        a[i] = (struct thr){ev, i};
        pthread_create(&th[i], NULL, emit_many, &a[i]);
    }
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
    cr_assert_eq(toy_events_run_end(ev, &(struct toy_run_end){0}), TOY_OK);
    toy_events_close(ev);
    json_t *all = validate(path); /* every line whole, t non-decreasing */
    cr_expect_eq(json_array_size(all), 802);
    json_decref(all);
    rm_rf(d);
    free(d);
}

/* ---- reading back ------------------------------------------------------------------ */

struct seen {
    int n;
    char kinds[16][16];
    int64_t steps[16];
};

static int collect(const char *kind, json_t *e, void *user) {
    struct seen *s = user;
    if (s->n < 16) {
        pf(s->kinds[s->n], sizeof s->kinds[0], "%s", kind);
        s->steps[s->n] = json_integer_value(json_object_get(e, "step"));
    }
    s->n++;
    return 0;
}

static int stop_at_two(const char *kind, json_t *e, void *user) { return ++*(int *)user == 2; }

Test(events, reader_skips_torn_lines_and_unknown_kinds) {
    char *d = tmpdir(), path[PATH_MAX];
    pf(path, sizeof path, "%s/events.jsonl", d);
    write_file(path, "{\"kind\":\"run_start\",\"t\":0.0,\"schema\":\"toy/v1\"}\n"
                     "{\"kind\":\"step\",\"t\":0.5,\"step\":1,\"lo\n"         /* torn mid-line */
                     "garbage\n"
                     "\n"                                                     /* blank: not counted */
                     "[1,2,3]\n"                                              /* not an object */
                     "{\"kind\":\"future_kind\",\"t\":0.7,\"x\":1}\n"         /* unknown: skipped */
                     "{\"kind\":\"step\",\"step\":9}\n"                       /* no t */
                     "{\"kind\":7,\"t\":1}\n"                                 /* kind not a string */
                     "{\"kind\":\"step\",\"t\":1.0,\"step\":2,\"loss\":null,\"new_key\":[1]}\r\n"
                     "{\"kind\":\"run_end\",\"t\":2.0,\"reason\":\"completed\"}\n"
                     "{\"kind\":\"step\",\"t\":2.5,\"st");                    /* torn tail, no newline */
    struct seen s = {0};
    struct toy_events_stats st;
    cr_assert_eq(toy_events_read(path, collect, &s, &st), TOY_OK);
    cr_assert_eq(s.n, 3);
    cr_expect_str_eq(s.kinds[0], "run_start");
    cr_expect_str_eq(s.kinds[1], "step");
    cr_expect_eq(s.steps[1], 2);
    cr_expect_str_eq(s.kinds[2], "run_end");
    cr_expect_eq(st.lines, 10);
    cr_expect_eq(st.events, 3);
    cr_expect_eq(st.unknown, 1);
    cr_expect_eq(st.torn, 6);
    int k = 0;
    cr_expect_eq(toy_events_read(path, stop_at_two, &k, NULL), TOY_OK);
    cr_expect_eq(k, 2);
    char missing[PATH_MAX];
    pf(missing, sizeof missing, "%s/nope.jsonl", d);
    cr_expect_eq(toy_events_read(missing, collect, &s, NULL), TOY_ERR_IO);
    cr_expect(strstr(toy_last_error(), "nope.jsonl"));
    cr_expect(toy_events_kind_known("op_timing") && toy_events_kind_known("region_exit"));
    cr_expect(!toy_events_kind_known("future_kind") && !toy_events_kind_known(NULL));

    /* appending after a torn tail: the tail stays one skipped line */
    struct toy_events *ev;
    cr_assert_eq(toy_events_open(path, TOY_EVENTS_APPEND, &ev), TOY_OK);
    cr_assert_eq(toy_events_run_start(ev, &(struct toy_run_start){.no_git = true}), TOY_OK);
    cr_assert_eq(toy_events_step(ev, &(struct toy_step_event){.step = 3, .loss = 1}), TOY_OK);
    cr_assert_eq(toy_events_run_end(ev, &(struct toy_run_end){.final_step = 3}), TOY_OK);
    toy_events_close(ev);
    memset(&s, 0, sizeof s);
    cr_assert_eq(toy_events_read(path, collect, &s, &st), TOY_OK);
    cr_expect_eq(s.n, 6);
    cr_expect_str_eq(s.kinds[3], "run_start");
    cr_expect_eq(s.steps[4], 3);
    cr_expect_eq(st.torn, 6);
    rm_rf(d);
    free(d);
}

struct times {
    int n;
    double t[16];
};

static int collect_t(const char *kind, json_t *e, void *user) {
    struct times *s = user;
    if (s->n < 16) s->t[s->n++] = json_number_value(json_object_get(e, "t"));
    return 0;
}

/* A resumed run appends a segment whose clock continues from the file's
 * last t (it restarted at 0, so t went back down the file, against
 * docs/events.md); a torn tail after the last event is not read as one. */
Test(events, appended_segment_continues_the_clock) {
    char *d = tmpdir(), path[PATH_MAX];
    pf(path, sizeof path, "%s/events.jsonl", d);
    write_file(path, "{\"kind\":\"run_start\",\"t\":0.0,\"schema\":\"toy/v1\"}\n"
                     "{\"kind\":\"step\",\"t\":40.0,\"step\":1}\n"
                     "{\"kind\":\"run_end\",\"t\":41.25,\"reason\":\"interrupted\"}\n"
                     "{\"kind\":\"step\",\"t\":99.0,\"st");
    struct toy_events *ev;
    cr_assert_eq(toy_events_open(path, TOY_EVENTS_APPEND, &ev), TOY_OK);
    cr_expect(toy_events_now(ev) >= 41.25 && toy_events_now(ev) < 46, "now %g", toy_events_now(ev));
    cr_assert_eq(toy_events_run_start(ev, &(struct toy_run_start){.no_git = true}), TOY_OK);
    cr_assert_eq(toy_events_step(ev, &(struct toy_step_event){.step = 2, .loss = 1}), TOY_OK);
    cr_assert_eq(toy_events_run_end(ev, &(struct toy_run_end){.final_step = 2}), TOY_OK);
    toy_events_close(ev);
    struct times s = {0};
    cr_assert_eq(toy_events_read(path, collect_t, &s, NULL), TOY_OK);
    cr_assert_eq(s.n, 6);
    for (int i = 1; i < s.n; i++) cr_expect_geq(s.t[i], s.t[i - 1], "event %d: t %g after %g", i, s.t[i], s.t[i - 1]);
    cr_expect_lt(s.t[5], 46);
    /* a fresh (truncated) stream starts at 0 */
    cr_assert_eq(toy_events_open(path, TOY_EVENTS_TRUNCATE, &ev), TOY_OK);
    cr_expect_lt(toy_events_now(ev), 5);
    toy_events_close(ev);
    rm_rf(d);
    free(d);
}

/* A disk that fills up (a file-size limit stands in: writes past it fail
 * with EFBIG, as ENOSPC would): the failed event is an error for its
 * caller, leaves no torn line, and says it is out of space (the trainers
 * stop on it and say why, so the stream prints nothing itself); writing
 * goes on when there is room again. */
Test(events, a_full_disk_is_an_error_and_leaves_no_torn_line) {
    char *d = tmpdir(), path[PATH_MAX], errp[PATH_MAX];
    pf(path, sizeof path, "%s/events.jsonl", d);
    pf(errp, sizeof errp, "%s/stderr.txt", d);
    struct toy_events *ev;
    cr_assert_eq(toy_events_open(path, TOY_EVENTS_TRUNCATE, &ev), TOY_OK);
    cr_assert_eq(toy_events_run_start(ev, &(struct toy_run_start){.no_git = true}), TOY_OK);
    struct stat sb;
    cr_assert_eq(stat(path, &sb), 0);
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit old, lim;
    getrlimit(RLIMIT_FSIZE, &old);
    lim = old;
    lim.rlim_cur = (rlim_t)sb.st_size + 10; /* room for part of the next line */
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &lim), 0);
    fflush(stderr);
    int saved = dup(2), fd = open(errp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 2);
    enum toy_status st1 = toy_events_step(ev, &(struct toy_step_event){.step = 1, .loss = 2.5f});
    enum toy_status st2 = toy_events_step(ev, &(struct toy_step_event){.step = 2, .loss = 2.5f});
    fflush(stderr);
    dup2(saved, 2);
    close(fd);
    close(saved);
    setrlimit(RLIMIT_FSIZE, &old);
    cr_expect_eq(st1, TOY_ERR_IO);
    cr_expect_eq(st2, TOY_ERR_IO);
    struct stat after;
    cr_assert_eq(stat(path, &after), 0);
    cr_expect_eq(after.st_size, sb.st_size, "a torn line was left: %lld bytes, was %lld", (long long)after.st_size,
                 (long long)sb.st_size);
    char *err = slurp(errp);
    cr_expect(!strstr(err, "cannot write events"), "stderr: %s", err);
    free(err);
    cr_expect(strstr(toy_last_error(), "events.jsonl") && strstr(toy_last_error(), "too large"), "%s",
              toy_last_error());
    cr_expect(toy_events_out_of_space(ev));
    /* room again: the stream goes on */
    cr_expect_eq(toy_events_step(ev, &(struct toy_step_event){.step = 3, .loss = 2.5f}), TOY_OK);
    cr_expect(!toy_events_out_of_space(ev));
    cr_expect_eq(toy_events_run_end(ev, &(struct toy_run_end){.final_step = 3}), TOY_OK);
    toy_events_close(ev);
    struct toy_events_stats es;
    struct times seen = {0};
    cr_expect_eq(toy_events_read(path, collect_t, &seen, &es), TOY_OK);
    cr_expect_eq(es.torn, 0);
    cr_expect_eq(es.events, 3);
    rm_rf(d);
    free(d);
}

/* ---- git provenance ------------------------------------------------------------------- */

#define SHA1 "0123456789abcdef0123456789abcdef01234567"
#define SHA2 "89abcdef0123456789abcdef0123456789abcdef"

Test(events, git_info_from_repository_files) {
    char *d = tmpdir(), p[PATH_MAX];
    pf(p, sizeof p, "%s/repo/.git/refs/heads", d);
    cr_assert_eq(toy_mkdir_p(p), TOY_OK);
    pf(p, sizeof p, "%s/repo/src/deep", d);
    cr_assert_eq(toy_mkdir_p(p), TOY_OK);
    pf(p, sizeof p, "%s/repo/.git/HEAD", d);
    write_file(p, "ref: refs/heads/feature/x\n");
    pf(p, sizeof p, "%s/repo/.git/packed-refs", d);
    write_file(p, "# pack-refs with: peeled fully-peeled sorted\n" SHA2 " refs/heads/main\n" SHA1
                  " refs/heads/feature/x\n^" SHA2 "\n");
    char sub[PATH_MAX];
    pf(sub, sizeof sub, "%s/repo/src/deep", d);
    struct toy_git_info g;
    cr_assert_eq(toy_git_info(sub, &g), TOY_OK, "%s", toy_last_error());
    cr_expect_str_eq(g.sha, SHA1);
    cr_expect_str_eq(g.branch, "feature/x");
    /* a loose ref wins over packed-refs */
    pf(p, sizeof p, "%s/repo/.git/refs/heads/feature", d);
    cr_assert_eq(toy_mkdir_p(p), TOY_OK);
    pf(p, sizeof p, "%s/repo/.git/refs/heads/feature/x", d);
    write_file(p, SHA2 "\n");
    cr_assert_eq(toy_git_info(sub, &g), TOY_OK);
    cr_expect_str_eq(g.sha, SHA2);
    /* run_start records it */
    char path[PATH_MAX];
    pf(path, sizeof path, "%s/events.jsonl", d);
    struct toy_events *ev;
    cr_assert_eq(toy_events_open(path, TOY_EVENTS_TRUNCATE, &ev), TOY_OK);
    cr_assert_eq(toy_events_run_start(ev, &(struct toy_run_start){.git_dir = sub}), TOY_OK);
    cr_assert_eq(toy_events_run_end(ev, &(struct toy_run_end){0}), TOY_OK);
    toy_events_close(ev);
    json_t *all = validate(path);
    json_t *git = json_object_get(nth(all, 0), "git");
    cr_expect_str_eq(json_string_value(json_object_get(git, "sha")), SHA2);
    cr_expect_str_eq(json_string_value(json_object_get(git, "branch")), "feature/x");
    json_decref(all);
    /* detached HEAD */
    pf(p, sizeof p, "%s/repo/.git/HEAD", d);
    write_file(p, SHA1 "\n");
    cr_assert_eq(toy_git_info(sub, &g), TOY_OK);
    cr_expect_str_eq(g.sha, SHA1);
    cr_expect_str_eq(g.branch, "");
    /* an unborn branch */
    write_file(p, "ref: refs/heads/nothing-yet\n");
    cr_expect_eq(toy_git_info(sub, &g), TOY_ERR_NOT_FOUND);
    /* junk HEAD */
    write_file(p, "ref: refs/../../etc/passwd\n");
    cr_expect_eq(toy_git_info(sub, &g), TOY_ERR_FORMAT);
    /* a worktree: .git is a file naming the worktree's git dir, whose
     * commondir leads back to the shared refs */
    write_file(p, "ref: refs/heads/main\n");
    pf(p, sizeof p, "%s/repo/.git/worktrees/wt", d);
    cr_assert_eq(toy_mkdir_p(p), TOY_OK);
    pf(p, sizeof p, "%s/repo/.git/worktrees/wt/HEAD", d);
    write_file(p, "ref: refs/heads/main\n");
    pf(p, sizeof p, "%s/repo/.git/worktrees/wt/commondir", d);
    write_file(p, "../..\n");
    pf(p, sizeof p, "%s/wt", d);
    cr_assert_eq(toy_mkdir_p(p), TOY_OK);
    pf(p, sizeof p, "%s/wt/.git", d);
    write_file(p, "gitdir: ../repo/.git/worktrees/wt\n");
    pf(p, sizeof p, "%s/wt", d);
    cr_assert_eq(toy_git_info(p, &g), TOY_OK, "%s", toy_last_error());
    cr_expect_str_eq(g.sha, SHA2);
    cr_expect_str_eq(g.branch, "main");
    /* outside any repository (the temp folder itself) */
    pf(p, sizeof p, "%s", d);
    if (toy_git_info("/", &g) == TOY_ERR_NOT_FOUND) cr_expect_eq(toy_git_info(p, &g), TOY_ERR_NOT_FOUND);
    rm_rf(d);
    free(d);
}

/* ---- run ids and the latest link -------------------------------------------------------- */

static void mk(const char *dir, const char *name) {
    char p[PATH_MAX];
    pf(p, sizeof p, "%s/%s", dir, name);
    cr_assert_eq(mkdir(p, 0755), 0, "%s", p);
}

Test(events, run_id_daily_counter) {
    unsetenv("TOY_RUN_ID");
    char *d = tmpdir(), runs[PATH_MAX], id[128], dir[PATH_MAX], name[128];
    pf(runs, sizeof runs, "%s/runs", d);
    time_t now = 1764400000; /* a fixed moment; the date is in local time */
    struct tm tm;
    localtime_r(&now, &tm);
    char date[16], expect[128];
    strftime(date, sizeof date, "%Y%m%d", &tm);
    /* no folder yet: the first of the day */
    cr_assert_eq(toy_run_id_make(runs, NULL, "llama", now, id, sizeof id), TOY_OK, "%s", toy_last_error());
    pf(expect, sizeof expect, "llama-%s-001", date);
    cr_expect_str_eq(id, expect);
    cr_assert_eq(toy_mkdir_p(runs), TOY_OK);
    pf(name, sizeof name, "llama-%s-001", date), mk(runs, name);
    pf(name, sizeof name, "gpt2-%s-007", date), mk(runs, name);     /* any arch counts */
    pf(name, sizeof name, "llama-%s", date), mk(runs, name);        /* no counter after the date */
    mk(runs, "llama-19990101-950");                                       /* another day */
    pf(name, sizeof name, ".llama-%s-900", date), mk(runs, name);   /* hidden */
    cr_assert_eq(toy_run_id_make(runs, NULL, "llama", now, id, sizeof id), TOY_OK);
    pf(expect, sizeof expect, "llama-%s-008", date);
    cr_expect_str_eq(id, expect);
    /* other tokens */
    char hms[16];
    strftime(hms, sizeof hms, "%H%M%S", &tm);
    cr_assert_eq(toy_run_id_make(runs, "{date}_{time}-{arch}", "vit", now, id, sizeof id), TOY_OK);
    pf(expect, sizeof expect, "%s_%s-vit", date, hms);
    cr_expect_str_eq(id, expect);
    cr_expect_eq(toy_run_id_make(runs, "{arch}-{nope}", "x", now, id, sizeof id), TOY_ERR_INVALID_ARG);
    cr_expect_eq(toy_run_id_make(runs, "{arch}", "a/b", now, id, sizeof id), TOY_ERR_INVALID_ARG);
    cr_expect_eq(toy_run_id_make(runs, NULL, "llama", now, id, 8), TOY_ERR_RANGE);
    /* create: today's counter, and never an existing folder */
    cr_assert_eq(toy_run_create(runs, NULL, "llama", id, sizeof id, dir, sizeof dir), TOY_OK, "%s", toy_last_error());
    struct stat sb;
    cr_expect(stat(dir, &sb) == 0 && S_ISDIR(sb.st_mode), "%s", dir);
    char id2[128], dir2[PATH_MAX];
    cr_assert_eq(toy_run_create(runs, NULL, "llama", id2, sizeof id2, dir2, sizeof dir2), TOY_OK);
    cr_expect_str_neq(id, id2);
    cr_expect_eq(strlen(id2), strlen(id));
    cr_expect_gt(strcmp(id2, id), 0);
    /* a template without {seq} whose name is taken */
    cr_assert_eq(toy_run_create(runs, "fixed", "x", id, sizeof id, dir, sizeof dir), TOY_OK);
    cr_expect_eq(toy_run_create(runs, "fixed", "x", id, sizeof id, dir, sizeof dir), TOY_ERR_STATE);
    /* $TOY_RUN_ID overrides, and may name an existing run */
    setenv("TOY_RUN_ID", "my-run", 1);
    cr_assert_eq(toy_run_id_make(runs, NULL, "llama", now, id, sizeof id), TOY_OK);
    cr_expect_str_eq(id, "my-run");
    cr_assert_eq(toy_run_create(runs, NULL, "llama", id, sizeof id, dir, sizeof dir), TOY_OK);
    cr_assert_eq(toy_run_create(runs, NULL, "llama", id, sizeof id, dir, sizeof dir), TOY_OK);
    pf(expect, sizeof expect, "%s/my-run", runs);
    cr_expect_str_eq(dir, expect);
    setenv("TOY_RUN_ID", "../escape", 1);
    cr_expect_eq(toy_run_id_make(runs, NULL, "llama", now, id, sizeof id), TOY_ERR_INVALID_ARG);
    unsetenv("TOY_RUN_ID");
    rm_rf(d);
    free(d);
}

Test(events, latest_link_is_relative_and_replaced) {
    char *d = tmpdir(), w[PATH_MAX], ck[PATH_MAX], link[PATH_MAX], target[256];
    pf(w, sizeof w, "%s/runs/r/weights", d);
    cr_assert_eq(toy_mkdir_p(w), TOY_OK);
    pf(link, sizeof link, "%s/latest", w);
    for (int s = 100; s <= 300; s += 100) {
        pf(ck, sizeof ck, "%s/step_%d.gguf", w, s);
        write_file(ck, "GGUF");
        cr_assert_eq(toy_run_link_latest(ck), TOY_OK, "%s", toy_last_error());
        ssize_t n = readlink(link, target, sizeof target - 1);
        cr_assert_gt(n, 0);
        target[n] = 0;
        char expect[64];
        pf(expect, sizeof expect, "step_%d.gguf", s);
        cr_expect_str_eq(target, expect);
        char *body = slurp(link); /* it resolves */
        cr_expect_str_eq(body, "GGUF");
        free(body);
    }
    /* nothing left behind but the checkpoints and the link */
    char cmd[PATH_MAX + 32];
    pf(cmd, sizeof cmd, "ls -A '%s' | wc -l", w);
    FILE *p = popen(cmd, "r");
    int count = 0;
    cr_assert_eq(fscanf(p, "%d", &count), 1);
    pclose(p);
    cr_expect_eq(count, 4);
    cr_expect_eq(toy_run_link_latest(""), TOY_ERR_INVALID_ARG);
    pf(ck, sizeof ck, "%s/", w);
    cr_expect_eq(toy_run_link_latest(ck), TOY_ERR_INVALID_ARG);
    pf(ck, sizeof ck, "%s/nope/step_1.gguf", d);
    cr_expect_eq(toy_run_link_latest(ck), TOY_ERR_IO);
    /* named by the checkpoint asked for, not the link's temporary name */
    cr_expect(strstr(toy_last_error(), ck) && !strstr(toy_last_error(), ".tmp."), "%s", toy_last_error());
    rm_rf(d);
    free(d);
}

/* ---- toy runs --------------------------------------------------------------------------- */

static char *run_cmd(const char *cmd, int *rc) {
    FILE *p = popen(cmd, "r");
    cr_assert(p, "%s", cmd);
    size_t cap = 1 << 16, len = 0, k;
    char *out = malloc(cap);
    while ((k = fread(out + len, 1, cap - len - 1, p)) > 0) {
        len += k;
        if (cap - len < 1024) out = realloc(out, cap *= 2);
    }
    out[len] = 0;
    *rc = pclose(p);
    return out;
}

/* toy_run_claim: one claim at a time on a run folder (flock: two open
 * descriptions conflict even within one process), a fresh run only in a
 * new or empty folder, and the lock goes with its descriptor. */
Test(events, run_claim_is_exclusive_and_fresh_needs_an_empty_folder) {
    char *d = tmpdir(), run[PATH_MAX], file[PATH_MAX];
    pf(run, sizeof run, "%s/runs/r1", d);
    int a = -1, b = -1;
    cr_assert_eq(toy_run_claim(run, true, &a), TOY_OK, "%s", toy_last_error()); /* made, with its parents */
    cr_expect_geq(a, 0);
    cr_expect_eq(toy_run_claim(run, false, &b), TOY_ERR_STATE);
    cr_expect_eq(b, -1);
    char pid[32];
    pf(pid, sizeof pid, "pid %ld", (long)getpid());
    cr_expect(strstr(toy_last_error(), pid), "%s", toy_last_error());
    toy_run_release(a);
    cr_assert_eq(toy_run_claim(run, true, &a), TOY_OK, "the lock file alone does not make it a run: %s", toy_last_error());
    toy_run_release(a);
    pf(file, sizeof file, "%s/events.jsonl", run);
    write_file(file, "");
    cr_expect_eq(toy_run_claim(run, true, &a), TOY_ERR_STATE);
    /* no train.json or finetune.json: nothing --resume could continue, so it is not suggested */
    cr_expect(strstr(toy_last_error(), "events.jsonl, and no run") && !strstr(toy_last_error(), "--resume"), "%s",
              toy_last_error());
    pf(file, sizeof file, "%s/train.json", run);
    write_file(file, "{}");
    cr_expect_eq(toy_run_claim(run, true, &a), TOY_ERR_STATE);
    cr_expect(strstr(toy_last_error(), "--resume"), "%s", toy_last_error());
    cr_assert_eq(toy_run_claim(run, false, &a), TOY_OK, "%s", toy_last_error()); /* what --resume does */
    toy_run_release(a);
    toy_run_release(-1);
    rm_rf(d);
    free(d);
}

Test(events, toy_runs_lists_runs) {
    const char *b = getenv("TOY_BIN");
    struct stat sb;
    if (!b || stat(b, &sb)) cr_skip("TOY_BIN not set (run through make check)");
    char bin[PATH_MAX];
    cr_assert(realpath(b, bin));
    char *d = tmpdir(), path[PATH_MAX];
    pf(path, sizeof path, "%s/runs/llama-a/events.jsonl", d);
    write_run(path, "llama-a", 4, false);
    pf(path, sizeof path, "%s/runs/llama-b/events.jsonl", d);
    write_run(path, "llama-b", 2, true);
    /* a run that died: no run_end, a torn last line */
    pf(path, sizeof path, "%s/runs/dead/events.jsonl", d);
    char deaddir[PATH_MAX];
    pf(deaddir, sizeof deaddir, "%s/runs/dead", d);
    cr_assert_eq(toy_mkdir_p(deaddir), TOY_OK);
    write_file(path, "{\"kind\":\"run_start\",\"t\":0,\"schema\":\"toy/v1\",\"started_at\":\"2099-01-01T00:00:00Z\","
                     "\"run_id\":\"dead\",\"model\":{\"arch\":\"gpt2\"}}\n"
                     "{\"kind\":\"step\",\"t\":65.5,\"phase\":\"train\",\"step\":7,\"loss\":3.5}\n"
                     "{\"kind\":\"step\",\"t\":70,\"pha");
    pf(path, sizeof path, "%s/runs/not-a-run", d);
    cr_assert_eq(toy_mkdir_p(path), TOY_OK);
    /* a live run (this process holds its lock) under a name that is not UTF-8, resumed once: its second
     * segment's t continues from the first's 10 s, so its time is 12 s (it was counted as 22) */
    char live[PATH_MAX];
    pf(live, sizeof live, "%s/runs/live-\xff", d);
    int lock = -1;
    cr_assert_eq(toy_run_claim(live, false, &lock), TOY_OK, "%s", toy_last_error());
    pf(path, sizeof path, "%s/events.jsonl", live);
    write_file(path, "{\"kind\":\"run_start\",\"t\":0,\"schema\":\"toy/v1\",\"started_at\":\"2099-01-02T00:00:00Z\","
                     "\"run_id\":\"live\",\"model\":{\"arch\":\"llama\"}}\n"
                     "{\"kind\":\"step\",\"t\":10,\"phase\":\"train\",\"step\":1,\"loss\":3}\n"
                     "{\"kind\":\"run_start\",\"t\":10,\"schema\":\"toy/v1\",\"started_at\":\"2099-01-02T00:01:00Z\","
                     "\"run_id\":\"live\",\"model\":{\"arch\":\"llama\"}}\n"
                     "{\"kind\":\"step\",\"t\":12,\"phase\":\"train\",\"step\":2,\"loss\":2}\n");

    char cmd[2 * PATH_MAX];
    pf(cmd, sizeof cmd, "cd '%s' && '%s' runs --json", d, bin);
    int rc;
    char *out = run_cmd(cmd, &rc);
    cr_assert_eq(rc, 0, "%s", out);
    json_error_t err;
    json_t *j = json_loads(out, 0, &err);
    cr_assert(j, "%s: %s", err.text, out);
    cr_expect_str_eq(json_string_value(json_object_get(j, "format")), "toy/runs-v1");
    json_t *runs = json_object_get(j, "runs");
    cr_assert_eq(json_array_size(runs), 4, "%s", out);
    json_t *a = json_array_get(runs, 0), *bb = json_array_get(runs, 1), *dead = json_array_get(runs, 2);
    json_t *lv = json_array_get(runs, 3);
    cr_expect_str_eq(json_string_value(json_object_get(lv, "id")), "live-\xef\xbf\xbd"); /* U+FFFD */
    cr_expect(json_is_true(json_object_get(lv, "running")), "%s", out);
    cr_expect(json_is_false(json_object_get(dead, "running")), "%s", out);
    cr_expect_float_eq(json_number_value(json_object_get(lv, "wall_s")), 12, 1e-9);
    cr_expect_str_eq(json_string_value(json_object_get(a, "id")), "llama-a");
    cr_expect_str_eq(json_string_value(json_object_get(a, "arch")), "llama");
    cr_expect_str_eq(json_string_value(json_object_get(a, "name")), "tiny");
    cr_expect_eq(json_integer_value(json_object_get(a, "steps")), 4);
    cr_expect_float_eq(json_number_value(json_object_get(a, "final_loss")), 5.5 * 0.9 * 0.9 * 0.9, 1e-5);
    cr_expect_float_eq(json_number_value(json_object_get(a, "eval_loss")), 2.5, 1e-9);
    cr_expect_str_eq(json_string_value(json_object_get(a, "reason")), "completed");
    cr_expect_str_eq(json_string_value(json_object_get(bb, "id")), "llama-b");
    cr_expect(json_is_null(json_object_get(bb, "final_loss")));
    cr_expect_str_eq(json_string_value(json_object_get(bb, "reason")), "aborted");
    cr_expect_eq(json_integer_value(json_object_get(bb, "exit_code")), 1);
    cr_expect_str_eq(json_string_value(json_object_get(dead, "id")), "dead");
    cr_expect(json_is_null(json_object_get(dead, "reason")));
    cr_expect_eq(json_integer_value(json_object_get(dead, "steps")), 7);
    cr_expect_float_eq(json_number_value(json_object_get(dead, "wall_s")), 65.5, 1e-9);
    cr_expect_eq(json_integer_value(json_object_get(dead, "torn_lines")), 1);
    json_decref(j);
    free(out);

    pf(cmd, sizeof cmd, "'%s' runs --dir '%s/runs'", bin, d);
    out = run_cmd(cmd, &rc);
    cr_expect_eq(rc, 0);
    cr_expect(strstr(out, "llama-a") && strstr(out, "llama/tiny") && strstr(out, "completed") &&
                  strstr(out, "unfinished") && strstr(out, "1m05s") && strstr(out, "2.5000") &&
                  strstr(out, "running") && strstr(out, "12.0s"),
              "%s", out);
    toy_run_release(lock);
    cr_expect(strstr(out, "llama-a") < strstr(out, "llama-b"), "%s", out);
    free(out);
    pf(cmd, sizeof cmd, "'%s' runs --dir '%s/none' 2>&1", bin, d);
    out = run_cmd(cmd, &rc);
    cr_expect_eq(WEXITSTATUS(rc), 2, "%s", out);
    free(out);
    pf(cmd, sizeof cmd, "cd '%s/runs/dead' && '%s' runs", d, bin);
    out = run_cmd(cmd, &rc);
    cr_expect_eq(rc, 0);
    cr_expect(strstr(out, "no runs"), "%s", out);
    free(out);
    rm_rf(d);
    free(d);
}
