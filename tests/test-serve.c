/* test-serve.c: `toy serve` end to end (src/serve/, docs/serve.md): each
 * test starts the real server ($TOY_BIN, default build/toy) on a free
 * loopback port and drives it with the curl command (and, when node and npm
 * are there, the official `openai` npm package): completions, chat,
 * streaming equal to the plain response with the same seed, embeddings,
 * the error objects of bad input, 8 concurrent requests each equal to the
 * same request alone (continuous batching), the prefix cache, the full
 * queue's 503, client disconnects, SIGTERM draining a request in flight, and
 * 300 fuzzed bodies (fuzz/fuzz-serve.py) that must never get a 5xx; and a
 * GPT-2 served the same way.
 *
 * Model: $TOY_SERVE_MODEL, else ../shared/testdata's llama-2-tiny-random
 * (random weights, the real Llama-2 vocabulary), else a tiny model trained
 * on the spot with `toy train`. Loopback only; every wait is bounded. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "serve/serve-internal.h"
#include "toy/graph.h"
#include "toy/bert.h"
#include "toy/gguf.h"
#include "toy/llama.h"
#include "toy/tokenizer.h"

#define SHARED_MODEL "../shared/testdata/model-gguf-llama2-tiny-random/llama-2-tiny-random.gguf"

static const char *toy_bin(void) {
    const char *b = getenv("TOY_BIN");
    return b && *b ? b : "build/toy";
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    size_t got = fread(s, 1, (size_t)n, f);
    s[got] = 0;
    fclose(f);
    return s;
}

static void spit(const char *path, const char *text, size_t n) {
    FILE *f = fopen(path, "wb");
    cr_assert(f, "cannot write %s", path);
    fwrite(text, 1, n, f);
    fclose(f);
}

/* runs argv, stdout/stderr to files (NULL: /dev/null); returns the pid */
static pid_t spawn(char *const argv[], const char *out, const char *err) {
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* a failed test (its process gone) takes its server along */
        int o = open(out ? out : "/dev/null", O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int e = open(err ? err : "/dev/null", O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(o, 1);
        dup2(e, 2);
        execvp(argv[0], argv);
        _exit(127);
    }
    return pid;
}

/* waits at most `timeout` seconds; returns the exit status, or -1 (killed after the timeout) */
static int wait_for(pid_t pid, double timeout) {
    double end = now_s() + timeout;
    int status;
    for (;;) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        if (now_s() > end) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            return -1;
        }
        usleep(5000);
    }
}

/* ---- the model --------------------------------------------------------------------------- */

static char g_model[4096];

/* a tiny model of arch ("llama" or "gpt2") trained in dir on a made-up text: a few seconds */
static const char *train_tiny(const char *dir, const char *arch) {
    char data[4200], out[4200];
    snprintf(data, sizeof data, "%s/data.txt", dir);
    FILE *f = fopen(data, "w");
    const char *w[] = {"the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "to", "park"};
    unsigned s = 1;
    for (int i = 0; i < 20000; i++) { /* enough that the held-out tenth holds a 512-token window */
        s = s * 1103515245u + 12345u;
        fprintf(f, "%s%s", w[(s >> 16) % 11], i % 12 == 11 ? "\n" : " ");
    }
    fclose(f);
    snprintf(out, sizeof out, "%s/run", dir);
    char *argv[] = {(char *)toy_bin(), "train", "--arch", (char *)arch, "--data", data, "--preset", "tiny", "--steps",
                    "30", "--ctx", "512", "--batch", "2", "--out", out, NULL};
    cr_assert_eq(wait_for(spawn(argv, NULL, NULL), 120), 0, "toy train --arch %s failed", arch);
    snprintf(g_model, sizeof g_model, "%s/run/weights/latest", dir);
    return g_model;
}

static const char *model(const char *dir) {
    const char *env = getenv("TOY_SERVE_MODEL");
    if (env && *env) return env;
    if (access(SHARED_MODEL, R_OK) == 0) return SHARED_MODEL;
    return train_tiny(dir, "llama");
}

/* ---- the server ---------------------------------------------------------------------------- */

struct server {
    pid_t pid;
    int port;
    char dir[256];
    char log[300];
    int seq;
};

static void server_start_model(struct server *s, const char *model_path, const char *const *extra);
static void server_start(struct server *s, const char *const *extra) { server_start_model(s, NULL, extra); }

/* model_path NULL: model() */
static void server_start_model(struct server *s, const char *model_path, const char *const *extra) {
    memset(s, 0, sizeof *s);
    snprintf(s->dir, sizeof s->dir, "/tmp/toy-serve-test-XXXXXX");
    cr_assert(mkdtemp(s->dir));
    snprintf(s->log, sizeof s->log, "%s/server.log", s->dir);
    char runs[300];
    snprintf(runs, sizeof runs, "%s/runs", s->dir);
    char *argv[64];
    int n = 0;
    argv[n++] = (char *)toy_bin();
    argv[n++] = "serve";
    argv[n++] = "-m";
    argv[n++] = (char *)(model_path ? model_path : model(s->dir));
    argv[n++] = "--port";
    argv[n++] = "0";
    argv[n++] = "--name";
    argv[n++] = "tiny";
    argv[n++] = "--runs";
    argv[n++] = runs;
    argv[n++] = "--threads";
    argv[n++] = "1";
    for (int i = 0; extra && extra[i] && n < 62; i++) argv[n++] = (char *)extra[i];
    argv[n] = NULL;
    s->pid = spawn(argv, NULL, s->log);
    double end = now_s() + 30;
    while (now_s() < end && !s->port) {
        char *log = slurp(s->log);
        const char *p = log ? strstr(log, "listening on http://127.0.0.1:") : NULL;
        if (p) s->port = atoi(p + strlen("listening on http://127.0.0.1:"));
        free(log);
        int st;
        if (!s->port && waitpid(s->pid, &st, WNOHANG) == s->pid) {
            char *l = slurp(s->log);
            cr_assert_fail("toy serve exited: %s", l ? l : "");
        }
        usleep(10000);
    }
    cr_assert(s->port > 0, "toy serve did not start");
}

static void server_clean(struct server *s) {
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", s->dir);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", s->dir);
}

/* SIGTERM; the exit status (-1: it had to be killed); removes the folder */
static int server_stop(struct server *s) {
    kill(s->pid, SIGTERM);
    int rc = wait_for(s->pid, 30);
    server_clean(s);
    return rc;
}

struct resp {
    int code;
    char *body, *headers;
    json_t *json;
};

static void resp_free(struct resp *r) {
    free(r->body);
    free(r->headers);
    json_decref(r->json);
}

/* starts curl for METHOD path with body (may be NULL); outputs go to files named by tag */
static pid_t curl_start(struct server *s, const char *method, const char *path, const char *body, size_t blen,
                        const char *const *extra, char tag[320]) {
    snprintf(tag, 320, "%s/r%d", s->dir, s->seq++);
    char url[256], bfile[400], hfile[400], ofile[400], codefile[400];
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", s->port, path);
    snprintf(bfile, sizeof bfile, "%s.req", tag);
    snprintf(hfile, sizeof hfile, "%s.hdr", tag);
    snprintf(ofile, sizeof ofile, "%s.out", tag);
    snprintf(codefile, sizeof codefile, "%s.code", tag);
    char data[420];
    snprintf(data, sizeof data, "@%s", bfile);
    char *argv[40];
    int n = 0;
    argv[n++] = "curl";
    argv[n++] = "-s";
    argv[n++] = "-N";
    argv[n++] = "--max-time";
    argv[n++] = "30";
    argv[n++] = "-X";
    argv[n++] = (char *)method;
    argv[n++] = "-D";
    argv[n++] = hfile;
    argv[n++] = "-o";
    argv[n++] = ofile;
    argv[n++] = "-w";
    argv[n++] = "%{http_code}";
    if (body) {
        spit(bfile, body, blen);
        argv[n++] = "-H";
        argv[n++] = "Content-Type: application/json";
        argv[n++] = "--data-binary";
        argv[n++] = data;
    }
    for (int i = 0; extra && extra[i] && n < 38; i++) argv[n++] = (char *)extra[i];
    argv[n++] = url;
    argv[n] = NULL;
    return spawn(argv, codefile, NULL);
}

static struct resp curl_finish(pid_t pid, const char *tag) {
    struct resp r = {0};
    wait_for(pid, 40);
    char f[400];
    snprintf(f, sizeof f, "%s.code", tag);
    char *code = slurp(f);
    r.code = code ? atoi(code) : 0;
    free(code);
    snprintf(f, sizeof f, "%s.out", tag);
    r.body = slurp(f);
    if (!r.body) r.body = strdup("");
    snprintf(f, sizeof f, "%s.hdr", tag);
    r.headers = slurp(f);
    if (!r.headers) r.headers = strdup("");
    r.json = json_loads(r.body, JSON_ALLOW_NUL, NULL); /* a model may well generate byte 0 */
    return r;
}

static struct resp http_x(struct server *s, const char *method, const char *path, const char *body,
                          const char *const *extra) {
    char tag[320];
    pid_t pid = curl_start(s, method, path, body, body ? strlen(body) : 0, extra, tag);
    return curl_finish(pid, tag);
}

static struct resp http(struct server *s, const char *method, const char *path, const char *body) {
    return http_x(s, method, path, body, NULL);
}

static const char *jstr(json_t *o, const char *path) {
    /* "choices.0.text": objects by key, arrays by index */
    char buf[256];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *tok = strtok(buf, "."); tok && o; tok = strtok(NULL, "."))
        o = json_is_array(o) ? json_array_get(o, (size_t)atoi(tok)) : json_object_get(o, tok);
    return json_string_value(o);
}

static json_t *jget(json_t *o, const char *path) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *tok = strtok(buf, "."); tok && o; tok = strtok(NULL, "."))
        o = json_is_array(o) ? json_array_get(o, (size_t)atoi(tok)) : json_object_get(o, tok);
    return o;
}

static long long jint(json_t *o, const char *path) { return json_integer_value(jget(o, path)); }

/* the value of an unlabelled /metrics line (-1 when absent) */
static long long metric(struct server *s, const char *name) {
    struct resp m = http(s, "GET", "/metrics", NULL);
    char key[128];
    snprintf(key, sizeof key, "\n%s ", name);
    const char *p = m.body ? strstr(m.body, key) : NULL;
    long long v = p ? atoll(p + strlen(key)) : -1;
    resp_free(&m);
    return v;
}

/* polls /metrics until NAME reads VALUE; false after `timeout` seconds. The
 * tests that need a slot busy or a request queued wait for the server to
 * say so, rather than sleeping for a time a slower (or faster) machine may
 * not match. */
static bool wait_metric(struct server *s, const char *name, long long value, double timeout) {
    for (double end = now_s() + timeout; now_s() < end; usleep(10000))
        if (metric(s, name) == value) return true;
    return false;
}

/* the context the server gives a request */
static long long server_n_ctx(struct server *s) {
    struct resp mr = http(s, "GET", "/v1/models", NULL);
    long long n_ctx = jint(mr.json, "data.0.meta.n_ctx");
    resp_free(&mr);
    return n_ctx;
}

/* the SSE stream's data payloads, text reassembled; returns the number of data lines */
struct sse {
    char text[65536];
    int n_chunks;
    bool done, usage_last;
    long long usage_completion;
    char finish[32];
};

/* the chunks of choice `index` (-1: every chunk) */
static void sse_parse_choice(const char *body, bool chat, int index, struct sse *out) {
    memset(out, 0, sizeof *out);
    const char *p = body;
    while ((p = strstr(p, "data: "))) {
        p += 6;
        const char *e = strstr(p, "\n\n");
        cr_assert(e, "an SSE event without its blank line");
        if (!strncmp(p, "[DONE]", 6)) { out->done = true; break; }
        json_t *c = json_loadb(p, (size_t)(e - p), JSON_ALLOW_NUL, NULL);
        cr_assert(c, "chunk is not JSON: %.*s", (int)(e - p), p);
        json_t *ch = json_array_get(json_object_get(c, "choices"), 0);
        if (index >= 0 && ch && json_integer_value(json_object_get(ch, "index")) != index) {
            json_decref(c);
            p = e;
            continue;
        }
        out->n_chunks++;
        const char *t = chat ? jstr(ch, "delta.content") : jstr(ch, "text");
        if (t) strncat(out->text, t, sizeof out->text - strlen(out->text) - 1);
        if (jstr(ch, "finish_reason")) snprintf(out->finish, sizeof out->finish, "%s", jstr(ch, "finish_reason"));
        json_t *u = json_object_get(c, "usage");
        out->usage_last = json_is_object(u);
        if (out->usage_last) out->usage_completion = jint(u, "completion_tokens");
        json_decref(c);
        p = e;
    }
}

static void sse_parse(const char *body, bool chat, struct sse *out) { sse_parse_choice(body, chat, -1, out); }

/* ---- tests ------------------------------------------------------------------------------------ */

/* The n completion bodies sent one at a time, then all at once: how many
 * of them got, together, the text they got alone (each response a 200,
 * and as many tokens as max_tokens asks where the body ignores EOS). */
static int together_as_alone(struct server *s, char bodies[][256], int n) {
    char **alone = calloc((size_t)n, sizeof *alone), (*tags)[320] = calloc((size_t)n, sizeof *tags);
    pid_t *pids = calloc((size_t)n, sizeof *pids);
    cr_assert(alone && tags && pids);
    for (int i = 0; i < n; i++) {
        struct resp r = http(s, "POST", "/v1/completions", bodies[i]);
        cr_assert_eq(r.code, 200, "%s", r.body);
        alone[i] = strdup(jstr(r.json, "choices.0.text"));
        resp_free(&r);
    }
    for (int i = 0; i < n; i++) pids[i] = curl_start(s, "POST", "/v1/completions", bodies[i], strlen(bodies[i]), NULL, tags[i]);
    int same = 0;
    for (int i = 0; i < n; i++) {
        struct resp r = curl_finish(pids[i], tags[i]);
        cr_assert_eq(r.code, 200, "%s", r.body);
        same += !strcmp(jstr(r.json, "choices.0.text"), alone[i]);
        json_t *b = json_loads(bodies[i], 0, NULL); /* ignore_eos: every request runs to its max_tokens */
        if (json_is_true(json_object_get(b, "ignore_eos")))
            cr_expect_eq(jint(r.json, "usage.completion_tokens"), json_integer_value(json_object_get(b, "max_tokens")),
                         "request %d", i);
        json_decref(b);
        resp_free(&r);
        free(alone[i]);
    }
    free(alone), free(tags), free(pids);
    return same;
}

/* /metrics: decode rows and decode steps so far */
static void decode_counts(struct server *s, long long *rows, long long *steps) {
    struct resp m = http(s, "GET", "/metrics", NULL);
    const char *st = strstr(m.body, "\ntoy_decode_steps_total "), *rw = strstr(m.body, "\ntoy_decode_rows_total ");
    cr_assert(st && rw, "%s", m.body);
    *steps = atoll(st + strlen("\ntoy_decode_steps_total "));
    *rows = atoll(rw + strlen("\ntoy_decode_rows_total "));
    resp_free(&m);
}

Test(serve, health_models_cors_metrics, .timeout = 60) {
    struct server s;
    server_start(&s, NULL);
    struct resp r = http(&s, "GET", "/health", NULL);
    cr_assert_eq(r.code, 200);
    cr_assert_str_eq(jstr(r.json, "status"), "ok");
    resp_free(&r);
    r = http(&s, "GET", "/v1/models", NULL);
    cr_assert_eq(r.code, 200);
    cr_assert_str_eq(jstr(r.json, "object"), "list");
    cr_assert_str_eq(jstr(r.json, "data.0.id"), "tiny");
    cr_assert(strstr(r.headers, "Access-Control-Allow-Origin: *"), "%s", r.headers);
    resp_free(&r);
    r = http(&s, "GET", "/v1/models/tiny", NULL);
    cr_assert_eq(r.code, 200);
    resp_free(&r);
    const char *pre[] = {"-H", "Origin: http://example.com", "-H", "Access-Control-Request-Method: POST", "-H",
                         "Access-Control-Request-Headers: authorization, content-type", NULL};
    r = http_x(&s, "OPTIONS", "/v1/chat/completions", NULL, pre);
    cr_assert_eq(r.code, 204);
    cr_assert(strstr(r.headers, "Access-Control-Allow-Methods: GET, POST, DELETE, OPTIONS"), "%s", r.headers);
    cr_assert(strstr(r.headers, "Access-Control-Allow-Headers: authorization, content-type"), "%s", r.headers);
    resp_free(&r);
    r = http(&s, "POST", "/v1/completions", "{\"prompt\":\"Hello\",\"max_tokens\":3,\"ignore_eos\":true}");
    cr_assert_eq(r.code, 200);
    resp_free(&r);
    /* a second server on the same port fails cleanly */
    char port[16], log2[400];
    snprintf(port, sizeof port, "%d", s.port);
    snprintf(log2, sizeof log2, "%s/second.log", s.dir);
    char *argv2[] = {(char *)toy_bin(), "serve", "-m", (char *)model(s.dir), "--port", port, "--no-events", NULL};
    cr_assert_eq(wait_for(spawn(argv2, NULL, log2), 30), 1);
    char *l2 = slurp(log2);
    cr_assert(l2 && strstr(l2, "cannot listen"), "%s", l2 ? l2 : "");
    free(l2);
    r = http(&s, "GET", "/metrics", NULL);
    cr_assert_eq(r.code, 200);
    cr_assert(strstr(r.body, "toy_requests_total{endpoint=\"/v1/completions\",code=\"200\"} 1"), "%s", r.body);
    cr_assert(strstr(r.body, "toy_completion_tokens_total 3"), "%s", r.body);
    cr_assert(strstr(r.body, "toy_time_to_first_token_seconds_count 1"), "%s", r.body);
    cr_assert(strstr(r.body, "# TYPE toy_queue_depth gauge"));
    resp_free(&r);
    cr_assert_eq(server_stop(&s), 0);
}

Test(serve, completions_text_tokens_logprobs_stop, .timeout = 60) {
    struct server s;
    server_start(&s, NULL);
    struct resp r = http(&s, "POST", "/v1/completions",
                         "{\"model\":\"tiny\",\"prompt\":\"Once upon a time\",\"max_tokens\":8,\"temperature\":0,"
                         "\"ignore_eos\":true,\"logprobs\":3}");
    cr_assert_eq(r.code, 200, "%s", r.body);
    cr_assert_str_eq(jstr(r.json, "object"), "text_completion");
    cr_assert_str_eq(jstr(r.json, "choices.0.finish_reason"), "length");
    cr_assert_eq(jint(r.json, "usage.completion_tokens"), 8);
    long long n_prompt = jint(r.json, "usage.prompt_tokens");
    cr_assert_gt(n_prompt, 1);
    cr_assert_eq(jint(r.json, "usage.total_tokens"), n_prompt + 8);
    json_t *lp = jget(r.json, "choices.0.logprobs");
    cr_assert_eq(json_array_size(json_object_get(lp, "tokens")), 8);
    cr_assert_eq(json_array_size(json_object_get(lp, "token_logprobs")), 8);
    json_t *top0 = json_array_get(json_object_get(lp, "top_logprobs"), 0);
    cr_assert(json_object_size(top0) >= 1 && json_object_size(top0) <= 3);
    /* greedy: the chosen token is the best one */
    double best = -INFINITY;
    const char *k;
    json_t *v;
    json_object_foreach(top0, k, v) best = fmax(best, json_real_value(v));
    cr_assert_float_eq(json_real_value(json_array_get(json_object_get(lp, "token_logprobs"), 0)), best, 1e-5);
    char *text = strdup(jstr(r.json, "choices.0.text"));
    resp_free(&r);

    /* a token-array prompt */
    r = http(&s, "POST", "/v1/completions", "{\"prompt\":[1, 45, 96],\"max_tokens\":4,\"ignore_eos\":true}");
    cr_assert_eq(r.code, 200, "%s", r.body);
    cr_assert_eq(jint(r.json, "usage.prompt_tokens"), 3);
    resp_free(&r);

    /* a stop string cut out of the greedy text: the text ends before it (not for a text of stand-ins for bytes
     * that are no characters: U+FFFD was never generated, so it stops nothing) */
    if (strlen(text) > 6 && !strstr(text, "\xef\xbf\xbd")) {
        char body[512], stop[8];
        snprintf(stop, sizeof stop, "%.3s", text + 3);
        json_t *b = json_pack("{s:s,s:i,s:i,s:b,s:s,s:i}", "prompt", "Once upon a time", "max_tokens", 8, "temperature",
                              0, "ignore_eos", 1, "stop", stop, "logprobs", 1);
        char *bs = json_dumps(b, 0);
        snprintf(body, sizeof body, "%s", bs);
        free(bs);
        json_decref(b);
        r = http(&s, "POST", "/v1/completions", body);
        cr_assert_eq(r.code, 200);
        const char *t = jstr(r.json, "choices.0.text");
        cr_assert(strlen(t) <= 3 && !strncmp(t, text, strlen(t)), "'%s' vs '%s' stop '%s'", t, text, stop);
        cr_assert_str_eq(jstr(r.json, "choices.0.finish_reason"), "stop");
        /* the tokens listed are those whose text starts before the cut (the stop string's were listed too, their
         * text_offset past the end of the text) */
        json_t *offs = jget(r.json, "choices.0.logprobs.text_offset");
        size_t n_chars = 0;
        for (const char *c = t; *c; c++) n_chars += ((unsigned char)*c & 0xC0) != 0x80;
        cr_assert(json_array_size(offs) >= (n_chars > 0) && json_array_size(offs) <= n_chars, "%s", r.body);
        for (size_t i = 0; i < json_array_size(offs); i++)
            cr_assert_lt(json_integer_value(json_array_get(offs, i)), (json_int_t)n_chars, "%s", r.body);
        /* ... while usage counts every token generated, those cut off too */
        cr_assert_geq(jint(r.json, "usage.completion_tokens"), (long long)json_array_size(offs), "%s", r.body);
        cr_assert_gt(jint(r.json, "usage.completion_tokens"), 0, "%s", r.body);
        resp_free(&r);
    }
    free(text);
    cr_assert_eq(server_stop(&s), 0);
}

/* logit_bias pushes the end-of-sequence token: generation stops there, in completions and chat */
Test(serve, logit_bias_and_eos, .timeout = 60) {
    struct server s;
    server_start(&s, NULL);
    struct resp mr = http(&s, "GET", "/v1/models", NULL);
    long long eos = jint(mr.json, "data.0.meta.eos");
    resp_free(&mr);
    if (eos < 0) {
        server_stop(&s);
        cr_skip_test("the model's tokenizer has no EOS");
    }
    for (int chat = 0; chat < 2; chat++) {
        char body[400];
        snprintf(body, sizeof body,
                 "{%s,\"max_tokens\":8,\"temperature\":0,\"logit_bias\":{\"%lld\":100},\"logprobs\":%s}",
                 chat ? "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]" : "\"prompt\":\"Once\"", eos,
                 chat ? "true" : "1");
        struct resp r = http(&s, "POST", chat ? "/v1/chat/completions" : "/v1/completions", body);
        cr_assert_eq(r.code, 200, "%s", r.body);
        cr_assert_str_eq(jstr(r.json, "choices.0.finish_reason"), "stop", "%s", r.body);
        cr_assert_eq(jint(r.json, "usage.completion_tokens"), 1, "%s", r.body);
        cr_assert_str_eq(chat ? jstr(r.json, "choices.0.message.content") : jstr(r.json, "choices.0.text"), "");
        /* as OpenAI's: the end-of-sequence token is not among the logprobs */
        json_t *lp = jget(r.json, chat ? "choices.0.logprobs.content" : "choices.0.logprobs.tokens");
        cr_assert(json_is_array(lp) && json_array_size(lp) == 0, "%s", r.body);
        resp_free(&r);
    }
    struct resp bad = http(&s, "POST", "/v1/completions", "{\"prompt\":\"x\",\"logit_bias\":{\"abc\":1}}");
    cr_assert_eq(bad.code, 400);
    cr_assert_str_eq(jstr(bad.json, "error.param"), "logit_bias");
    resp_free(&bad);
    bad = http(&s, "POST", "/v1/completions", "{\"prompt\":\"x\",\"logit_bias\":{\"5\":1000}}");
    cr_assert_eq(bad.code, 400);
    resp_free(&bad);
    cr_assert_eq(server_stop(&s), 0);
}

Test(serve, stream_equals_plain_response, .timeout = 60) {
    struct server s;
    server_start(&s, NULL);
    for (int chat = 0; chat < 2; chat++) {
        const char *path = chat ? "/v1/chat/completions" : "/v1/completions";
        const char *pin = chat ? "\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
                                 "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"Tell a story\"}]}]"
                               : "\"prompt\":\"Tell a story\"";
        char plain[512], stream[600];
        snprintf(plain, sizeof plain, "{%s,\"max_tokens\":24,\"temperature\":0.9,\"top_p\":0.95,\"seed\":7}", pin);
        snprintf(stream, sizeof stream,
                 "{%s,\"max_tokens\":24,\"temperature\":0.9,\"top_p\":0.95,\"seed\":7,\"stream\":true,"
                 "\"stream_options\":{\"include_usage\":true}}", pin);
        struct resp a = http(&s, "POST", path, plain);
        cr_assert_eq(a.code, 200, "%s", a.body);
        struct resp b = http(&s, "POST", path, stream);
        cr_assert_eq(b.code, 200);
        cr_assert(strstr(b.headers, "Content-Type: text/event-stream"), "%s", b.headers);
        struct sse ev;
        sse_parse(b.body, chat, &ev);
        cr_assert(ev.done, "no [DONE]: %s", b.body);
        cr_assert(ev.usage_last, "the last chunk carries usage");
        const char *want = chat ? jstr(a.json, "choices.0.message.content") : jstr(a.json, "choices.0.text");
        cr_assert_str_eq(ev.text, want);
        cr_assert_str_eq(ev.finish, jstr(a.json, "choices.0.finish_reason"));
        cr_assert_eq(ev.usage_completion, jint(a.json, "usage.completion_tokens"));
        if (chat) cr_assert_str_eq(jstr(a.json, "choices.0.message.role"), "assistant");
        resp_free(&a);
        resp_free(&b);
    }
    /* chat logprobs */
    struct resp r = http(&s, "POST", "/v1/chat/completions",
                         "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":4,\"logprobs\":true,"
                         "\"top_logprobs\":2,\"ignore_eos\":true}");
    cr_assert_eq(r.code, 200, "%s", r.body);
    json_t *content = jget(r.json, "choices.0.logprobs.content");
    cr_assert_eq(json_array_size(content), 4);
    cr_assert_eq(json_array_size(jget(content, "0.top_logprobs")), 2);
    cr_assert(json_is_array(jget(content, "0.bytes")));
    /* greedy, each token's log-probability is its first alternative's, with or without the alternatives */
    struct resp g[2];
    for (int k = 0; k < 2; k++) {
        g[k] = http(&s, "POST", "/v1/chat/completions",
                    k ? "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":4,\"logprobs\":true,"
                        "\"top_logprobs\":1,\"ignore_eos\":true,\"temperature\":0}"
                      : "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":4,\"logprobs\":true,"
                        "\"ignore_eos\":true,\"temperature\":0}");
        cr_assert_eq(g[k].code, 200, "%s", g[k].body);
    }
    for (int i = 0; i < 4; i++) {
        char at[64];
        snprintf(at, sizeof at, "choices.0.logprobs.content.%d.logprob", i);
        double plain = json_real_value(jget(g[0].json, at)), with = json_real_value(jget(g[1].json, at));
        snprintf(at, sizeof at, "choices.0.logprobs.content.%d.top_logprobs.0.logprob", i);
        cr_assert(plain < 0 && plain == with && with == json_real_value(jget(g[1].json, at)), "%s\n%s", g[0].body,
                  g[1].body);
    }
    resp_free(&g[0]);
    resp_free(&g[1]);
    resp_free(&r);
    cr_assert_eq(server_stop(&s), 0);
}

Test(serve, embeddings, .timeout = 60) {
    struct server s;
    server_start(&s, NULL);
    struct resp r = http(&s, "POST", "/v1/embeddings", "{\"input\":[\"the cat\",\"a dog\",\"the cat\"]}");
    cr_assert_eq(r.code, 200, "%s", r.body);
    json_t *data = json_object_get(r.json, "data");
    cr_assert_eq(json_array_size(data), 3);
    size_t dim = json_array_size(jget(data, "0.embedding"));
    cr_assert_gt(dim, 0);
    double ss = 0, diff01 = 0, diff02 = 0;
    for (size_t i = 0; i < dim; i++) {
        double a = json_real_value(json_array_get(jget(data, "0.embedding"), i));
        double b = json_real_value(json_array_get(jget(data, "1.embedding"), i));
        double c = json_real_value(json_array_get(jget(data, "2.embedding"), i));
        ss += a * a, diff01 += fabs(a - b), diff02 += fabs(a - c);
    }
    cr_assert_float_eq(ss, 1.0, 1e-4, "L2-normalised");
    cr_assert_gt(diff01, 1e-4, "different inputs, different vectors");
    cr_assert_lt(diff02, 1e-6, "the same input, the same vector");
    cr_assert_gt(jint(r.json, "usage.prompt_tokens"), 3);
    resp_free(&r);
    r = http(&s, "POST", "/v1/embeddings", "{\"input\":[1,45,96],\"encoding_format\":\"base64\",\"normalize\":false}");
    cr_assert_eq(r.code, 200, "%s", r.body);
    cr_assert_eq(strlen(jstr(r.json, "data.0.embedding")), (dim * 4 + 2) / 3 * 4);
    cr_assert_eq(jint(r.json, "usage.prompt_tokens"), 3);
    resp_free(&r);
    cr_assert_eq(server_stop(&s), 0);
}

/* Embeds n made-up token ids on server s and returns the largest difference from the one graph over them
 * (toy_srv_forward of model sm, as an input of a chunk or less is computed), relative to 1 + its largest value */
static double embedding_vs_one_graph(struct server *s, const struct srv_model *sm, int64_t n) {
    const int64_t d = sm->d_model;
    int32_t *ids = malloc((size_t)n * sizeof *ids);
    size_t cap = (size_t)n * 8 + 64;
    char *body = malloc(cap);
    strcpy(body, "{\"normalize\":false,\"input\":[");
    for (int64_t i = 0; i < n; i++) {
        ids[i] = (int32_t)(1 + (i * 7919) % (sm->vocab - 1));
        snprintf(body + strlen(body), cap - strlen(body), "%s%d", i ? "," : "", ids[i]);
    }
    strcat(body, "]}");
    struct resp r = http(s, "POST", "/v1/embeddings", body);
    cr_assert_eq(r.code, 200, "%s", r.body);
    cr_assert_eq(jint(r.json, "usage.prompt_tokens"), n);
    json_t *got = jget(r.json, "data.0.embedding");
    cr_assert_eq((int64_t)json_array_size(got), d);
    struct toy_ctx *ctx = toy_ctx_init(true);
    struct toy_tensor *tok = toy_new_tensor_2d(ctx, TOY_I32, n, 1), *pos = toy_new_tensor_1d(ctx, TOY_I32, n);
    for (int64_t i = 0; i < n; i++) ((int32_t *)tok->data)[i] = ids[i], ((int32_t *)pos->data)[i] = (int32_t)i;
    struct toy_tensor *h = toy_srv_forward(ctx, sm, tok, pos, NULL, SRV_OUT_MEAN_HIDDEN, 0);
    toy_set_output(h);
    struct toy_graph *g = toy_graph_new(ctx);
    toy_graph_build(g, h);
    cr_assert_eq(toy_graph_compute(g, NULL), TOY_OK, "%s", toy_last_error());
    double worst = 0, scale = 0;
    for (int64_t k = 0; k < d; k++) {
        double want = ((float *)h->data)[k];
        worst = fmax(worst, fabs(json_number_value(json_array_get(got, (size_t)k)) - want));
        scale = fmax(scale, fabs(want));
    }
    cr_log_info("embedding of %lld tokens in chunks vs one graph: max |diff| %.3g (max |x| %.3g)", (long long)n, worst,
                scale);
    toy_ctx_free(ctx);
    resp_free(&r);
    free(body);
    free(ids);
    return worst / (1 + scale);
}

/* An input longer than a prefill chunk is embedded a chunk per engine step through a KV cache of its own (so the
 * streams move on between chunks): the vector is the one graph over the whole input gives, to float rounding */
/* the unnormalised embedding of each input of body (ids lists) into v[i][0..dim) */
static size_t embed_vectors(struct server *s, const char *inputs, double v[][1024]) {
    char body[8192];
    snprintf(body, sizeof body, "{\"input\":%s,\"normalize\":false}", inputs);
    struct resp r = http(s, "POST", "/v1/embeddings", body);
    cr_assert_eq(r.code, 200, "%s", r.body);
    json_t *data = json_object_get(r.json, "data");
    size_t dim = json_array_size(jget(data, "0.embedding"));
    cr_assert(dim > 0 && dim <= 1024);
    for (size_t i = 0; i < json_array_size(data); i++)
        for (size_t k = 0; k < dim; k++)
            v[i][k] = json_number_value(json_array_get(json_object_get(json_array_get(data, i), "embedding"), k));
    resp_free(&r);
    return dim;
}

/* --pooling (and a GGUF's pooling_type): last gives the last position's final-norm state, cls the first's. With
 * causal attention the last of [a, b, c] is 3 mean(a, b, c) - 2 mean(a, b), and the first is [a]'s alone, also
 * for an input longer than a prefill chunk (whose later chunks are then skipped) */
Test(serve, embedding_pooling_mean_cls_last, .timeout = 120) {
    static double mean[4][1024], last[4][1024], cls[4][1024];
    char ids[2048] = "[1";
    for (int i = 1; i < 300; i++) snprintf(ids + strlen(ids), sizeof ids - strlen(ids), ",%d", 3 + i % 90);
    char inputs[4096];
    snprintf(inputs, sizeof inputs, "[[1,45,96],[1,45],[1],%s]]", ids);
    char dir[] = "/tmp/toy-serve-test-XXXXXX", path[600];
    cr_assert(mkdtemp(dir));
    snprintf(path, sizeof path, "%s", model(dir)); /* one model for the three servers */
    struct server s;
    server_start_model(&s, path, NULL);
    size_t dim = embed_vectors(&s, inputs, mean);
    cr_assert_eq(server_stop(&s), 0);
    const char *as_last[] = {"--pooling", "last", NULL}, *as_cls[] = {"--pooling", "cls", NULL};
    server_start_model(&s, path, as_last);
    cr_assert_eq(embed_vectors(&s, inputs, last), dim);
    cr_assert_eq(server_stop(&s), 0);
    server_start_model(&s, path, as_cls);
    cr_assert_eq(embed_vectors(&s, inputs, cls), dim);
    cr_assert_eq(server_stop(&s), 0);
    snprintf(path, sizeof path, "rm -rf '%s'", dir);
    cr_assert_eq(system(path), 0);
    double err_last = 0, err_cls = 0, err_one = 0, err_long = 0, scale = 0;
    for (size_t k = 0; k < dim; k++) {
        scale = fmax(scale, fabs(mean[2][k]));
        err_last = fmax(err_last, fabs(last[0][k] - (3 * mean[0][k] - 2 * mean[1][k])));
        err_cls = fmax(err_cls, fabs(cls[0][k] - mean[2][k]));
        err_one = fmax(err_one, fabs(last[2][k] - mean[2][k]));
        err_long = fmax(err_long, fabs(cls[3][k] - mean[2][k]));
    }
    cr_expect_lt(err_last, 1e-3 * scale, "last: %g (scale %g)", err_last, scale);
    cr_expect_lt(err_cls, 1e-4 * scale, "cls: %g", err_cls);
    cr_expect_lt(err_one, 1e-4 * scale, "one token: %g", err_one);
    cr_expect_lt(err_long, 1e-4 * scale, "cls of a 300-token input: %g", err_long);
    double diff = 0;
    for (size_t k = 0; k < dim; k++) diff += fabs(last[3][k] - mean[3][k]);
    cr_expect_gt(diff, 1e-3, "a long input's last state is not its mean");
    const char *bad[] = {"--pooling", "max", NULL};
    char *argv[] = {(char *)toy_bin(), "serve", "-m", "x.gguf", (char *)bad[0], (char *)bad[1], NULL};
    cr_expect_eq(wait_for(spawn(argv, NULL, NULL), 30), 2, "--pooling max is a usage error");
}

Test(serve, long_embedding_input_in_chunks_equals_one_graph, .timeout = 120) {
    struct server s;
    server_start(&s, NULL);
    struct toy_llama *m;
    cr_assert_eq(toy_llama_load(model(s.dir), false, &m), TOY_OK, "%s", toy_last_error());
    struct srv_model sm = toy_srv_model_llama(m);
    cr_expect_lt(embedding_vs_one_graph(&s, &sm, 700), 1e-4); /* two full chunks of 256 and a part */
    toy_llama_free(m);
    cr_assert_eq(server_stop(&s), 0);
}

/* the embedding (pooled as asked, not normalized) that toy_bert gives ids in process */
static void bert_embedding(struct toy_bert *m, const int32_t *ids, int n, enum toy_pooling pool, float *out) {
    struct toy_ctx *ctx = toy_ctx_init(true);
    struct toy_tensor *tok = toy_new_tensor_2d(ctx, TOY_I32, n, 1), *pos = toy_new_tensor_1d(ctx, TOY_I32, n);
    for (int i = 0; i < n; i++) ((int32_t *)tok->data)[i] = ids[i], ((int32_t *)pos->data)[i] = i;
    struct toy_tensor *e = toy_cont(ctx, toy_bert_pool(ctx, toy_bert_forward(ctx, m, tok, pos), pool));
    toy_set_output(e);
    struct toy_graph *g = toy_graph_new(ctx);
    toy_graph_build(g, e);
    cr_assert_eq(toy_graph_compute(g, NULL), TOY_OK, "%s", toy_last_error());
    memcpy(out, e->data, (size_t)m->cfg.d_model * sizeof *out);
    toy_ctx_free(ctx);
}

/* A BERT encoder is served for embeddings alone: each input whole (every position sees every other), pooled as
 * its file says (CLS here) or as --pooling says, normalized unless asked not to; an input longer than its positions
 * is a 400, and so is any generating endpoint */
Test(serve, bert_encoder_embeds_and_only_embeds, .timeout = 120) {
    char dir[] = "/tmp/toy-serve-bert-XXXXXX", path[600];
    cr_assert(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/bert.gguf", dir);
    struct toy_bert_config c = {.vocab = 61, .d_model = 64, .n_layers = 2, .n_heads = 4, .d_ff = 128, .max_ctx = 300,
                                .n_types = 2, .norm_eps = 1e-12f, .pooling = TOY_POOLING_CLS};
    struct toy_bert *w = toy_bert_new(&c, 11);
    cr_assert(w);
    struct toy_gguf_writer *gw;
    cr_assert_eq(toy_gguf_writer_init(&gw), TOY_OK);
    cr_assert_eq(toy_bert_write_gguf(w, gw, TOY_F32), TOY_OK, "%s", toy_last_error());
    cr_assert_eq(toy_gguf_writer_write(gw, path), TOY_OK, "%s", toy_last_error());
    toy_gguf_writer_free(gw);
    toy_bert_free(w);
    struct toy_bert *m;
    cr_assert_eq(toy_bert_load(path, &m), TOY_OK, "%s", toy_last_error());
    const int32_t a[] = {1, 5, 9, 13, 17}, b[] = {2, 4};
    float want[2][64], got[64];
    for (int mode = 0; mode < 2; mode++) { /* the file's pooling (CLS), then --pooling mean */
        const char *mean[] = {"--pooling", "mean", NULL};
        struct server s;
        server_start_model(&s, path, mode ? mean : NULL);
        enum toy_pooling pool = mode ? TOY_POOLING_MEAN : TOY_POOLING_CLS;
        bert_embedding(m, a, 5, pool, want[0]);
        bert_embedding(m, b, 2, pool, want[1]);
        struct resp r = http(&s, "POST", "/v1/embeddings", "{\"input\":[[1,5,9,13,17],[2,4]],\"normalize\":false}");
        cr_assert_eq(r.code, 200, "%s", r.body);
        for (int i = 0; i < 2; i++) {
            char at[40];
            snprintf(at, sizeof at, "data.%d.embedding", i);
            json_t *v = jget(r.json, at);
            cr_assert_eq(json_array_size(v), 64);
            for (int k = 0; k < 64; k++) got[k] = (float)json_number_value(json_array_get(v, (size_t)k));
            for (int k = 0; k < 64; k++)
                cr_assert(fabsf(got[k] - want[i][k]) <= 1e-5f * (1 + fabsf(want[i][k])), "mode %d, input %d, %d: %g vs %g",
                          mode, i, k, (double)got[k], (double)want[i][k]);
        }
        resp_free(&r);
        r = http(&s, "POST", "/v1/embeddings", "{\"input\":[1,5,9,13,17]}"); /* normalized */
        cr_assert_eq(r.code, 200, "%s", r.body);
        double n2 = 0, dot = 0, nw = 0;
        for (int k = 0; k < 64; k++) {
            double x = json_number_value(json_array_get(jget(r.json, "data.0.embedding"), (size_t)k));
            n2 += x * x, dot += x * want[0][k], nw += (double)want[0][k] * want[0][k];
        }
        cr_assert(fabs(n2 - 1) < 1e-5 && dot / sqrt(nw) > 1 - 1e-5, "%g %g", n2, dot / sqrt(nw));
        resp_free(&r);
        if (!mode) {
            /* longer than a prefill chunk (256), whole all the same; one more than its positions, refused */
            int32_t ids[301];
            char body[2400] = "{\"normalize\":false,\"input\":[0";
            ids[0] = 0;
            for (int i = 1; i < 301; i++) {
                ids[i] = (i * 7) % 61;
                snprintf(body + strlen(body), sizeof body - strlen(body), ",%d", ids[i]);
            }
            strcat(body, "]}");
            r = http(&s, "POST", "/v1/embeddings", body);
            cr_assert_eq(r.code, 400, "%s", r.body);
            cr_assert_str_eq(jstr(r.json, "error.code"), "context_length_exceeded");
            resp_free(&r);
            char *cut = strrchr(body, ',');
            strcpy(cut, "]}");
            r = http(&s, "POST", "/v1/embeddings", body);
            cr_assert_eq(r.code, 200, "%s", r.body);
            bert_embedding(m, ids, 300, TOY_POOLING_CLS, want[0]);
            for (int k = 0; k < 64; k++) {
                double x = json_number_value(json_array_get(jget(r.json, "data.0.embedding"), (size_t)k));
                cr_assert(fabs(x - want[0][k]) <= 1e-5 * (1 + fabs(want[0][k])), "300 tokens, %d: %g vs %g", k, x,
                          (double)want[0][k]);
            }
            resp_free(&r);
            const char *gen[][2] = {{"/v1/completions", "{\"prompt\":[1,2],\"max_tokens\":2}"},
                                    {"/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}"},
                                    {"/v1/responses", "{\"input\":\"x\"}"}};
            for (int i = 0; i < 3; i++) {
                r = http(&s, "POST", gen[i][0], gen[i][1]);
                cr_assert_eq(r.code, 400, "%s: %s", gen[i][0], r.body);
                cr_assert(strstr(r.body, "text encoder"), "%s", r.body);
                resp_free(&r);
            }
        }
        cr_assert_eq(server_stop(&s), 0);
    }
    toy_bert_free(m);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}

/* A GPT-2 is served as a Llama-family model is: /v1/models names its architecture, a greedy completion is toy
 * generate's (the same forward and cache type, the same tokens), requests decoded together in one batch each get
 * what they get alone, and an embedding input longer than a chunk is the one graph's over it */
Test(serve, gpt2_model, .timeout = 180) {
    char dir[] = "/tmp/toy-serve-gpt2-XXXXXX";
    cr_assert(mkdtemp(dir));
    char path[4200];
    snprintf(path, sizeof path, "%s", train_tiny(dir, "gpt2"));
    struct server s;
    const char *extra[] = {"--parallel", "4", NULL};
    server_start_model(&s, path, extra);
    struct resp r = http(&s, "GET", "/v1/models", NULL);
    cr_assert_eq(r.code, 200);
    cr_assert_str_eq(jstr(r.json, "data.0.meta.arch"), "gpt2");
    resp_free(&r);

    enum { N = 4 };
    const char *prompts[N] = {"the cat", "a dog ran", "on the mat and", "park"};
    char bodies[N][256], *alone[N];
    for (int i = 0; i < N; i++) {
        snprintf(bodies[i], sizeof bodies[i],
                 "{\"prompt\":\"%s\",\"max_tokens\":%d,\"temperature\":%s,\"seed\":%d,\"ignore_eos\":true}", prompts[i],
                 150 + 30 * i, i % 2 ? "0.9" : "0", 7 + i); /* long enough to overlap */
        r = http(&s, "POST", "/v1/completions", bodies[i]);
        cr_assert_eq(r.code, 200, "%s", r.body);
        alone[i] = strdup(jstr(r.json, "choices.0.text"));
        resp_free(&r);
    }
    /* greedy: toy generate's text */
    char cmd[16384], out[4300];
    snprintf(out, sizeof out, "%s/gen.json", dir);
    snprintf(cmd, sizeof cmd, "%s generate -m '%s' -p 'the cat' -n 150 --temp 0 --ignore-eos --json > '%s'", toy_bin(),
             path, out);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    json_error_t jerr;
    json_t *gen = json_load_file(out, 0, &jerr);
    cr_assert(gen, "%s", jerr.text);
    cr_assert_str_eq(json_string_value(json_object_get(gen, "text")), alone[0], "served vs toy generate");
    json_decref(gen);
    /* together: the same texts. A tiny model decodes a request in tens of ms, so on a loaded machine the requests
     * may happen not to meet: again, until a round shared its decode steps */
    bool shared = false;
    for (int round = 0; round < 5 && !shared; round++) {
        long long steps0 = metric(&s, "toy_decode_steps_total"), rows0 = metric(&s, "toy_decode_rows_total");
        char tags[N][320];
        pid_t pids[N];
        for (int i = N - 1; i >= 0; i--) /* the longest first */
            pids[i] = curl_start(&s, "POST", "/v1/completions", bodies[i], strlen(bodies[i]), NULL, tags[i]);
        for (int i = 0; i < N; i++) {
            r = curl_finish(pids[i], tags[i]);
            cr_assert_eq(r.code, 200, "%s", r.body);
            cr_assert_str_eq(jstr(r.json, "choices.0.text"), alone[i], "request %d", i);
            resp_free(&r);
        }
        shared = metric(&s, "toy_decode_rows_total") - rows0 > metric(&s, "toy_decode_steps_total") - steps0;
    }
    cr_assert(shared, "the requests never shared a decode step");
    for (int i = 0; i < N; i++) free(alone[i]);

    /* an embedding over more than a chunk of 256 tokens */
    struct toy_gpt2 *m;
    cr_assert_eq(toy_gpt2_load(path, false, &m), TOY_OK, "%s", toy_last_error());
    struct srv_model sm = toy_srv_model_gpt2(m);
    cr_expect_lt(embedding_vs_one_graph(&s, &sm, 300), 1e-4);
    toy_gpt2_free(m);
    cr_assert_eq(server_stop(&s), 0);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}

static void expect_error(struct server *s, const char *path, const char *body, int code, const char *param,
                         const char *err_code) {
    struct resp r = http(s, "POST", path, body);
    cr_assert_eq(r.code, code, "%s -> %d %s", body, r.code, r.body);
    cr_assert(json_is_object(jget(r.json, "error")), "not an error object: %s", r.body);
    cr_assert(jstr(r.json, "error.message") && jstr(r.json, "error.type"), "%s", r.body);
    if (param) cr_assert_str_eq(jstr(r.json, "error.param"), param, "%s", r.body);
    if (err_code) cr_assert_str_eq(jstr(r.json, "error.code"), err_code, "%s", r.body);
    resp_free(&r);
}

Test(serve, bad_input_gets_4xx_error_objects, .timeout = 60) {
    struct server s;
    const char *extra[] = {"--ctx", "64", "--max-body", "20000", NULL};
    server_start(&s, extra);
    const char *C = "/v1/completions", *CH = "/v1/chat/completions", *E = "/v1/embeddings";
    expect_error(&s, C, "{\"prompt\": \"x\",", 400, NULL, NULL);
    expect_error(&s, C, "[1,2,3]", 400, NULL, NULL);
    expect_error(&s, C, "", 400, NULL, NULL);
    expect_error(&s, C, "{\"prompt\":\"x\",\"temperature\":\"hot\"}", 400, "temperature", NULL);
    expect_error(&s, C, "{\"prompt\":\"x\",\"temperature\":9}", 400, "temperature", NULL);
    expect_error(&s, C, "{\"prompt\":\"x\",\"max_tokens\":-1}", 400, "max_tokens", NULL);
    expect_error(&s, C, "{\"prompt\":\"x\",\"max_tokens\":1.5}", 400, "max_tokens", NULL);
    expect_error(&s, C, "{\"prompt\":\"x\",\"stop\":[1]}", 400, "stop", NULL);
    expect_error(&s, C, "{\"prompt\":\"x\",\"n\":2,\"best_of\":3,\"stream\":true}", 400, "best_of", NULL);
    expect_error(&s, C, "{\"prompt\":\"x\",\"n\":129}", 400, "n", NULL);
    expect_error(&s, C, "{\"prompt\":\"x\",\"stream\":\"yes\"}", 400, "stream", NULL);
    expect_error(&s, C, "{\"prompt\":{}}", 400, "prompt", NULL);
    expect_error(&s, C, "{\"prompt\":[1,99999999]}", 400, "prompt", NULL);
    expect_error(&s, C, "{\"prompt\":[1,-3]}", 400, "prompt", NULL);
    expect_error(&s, C, "{\"max_tokens\":3}", 400, "prompt", NULL);
    expect_error(&s, C, "{\"prompt\":\"x\",\"model\":\"gpt-4\"}", 404, "model", "model_not_found");
    expect_error(&s, C, "{\"prompt\":\"x\",\"model\":7}", 400, "model", NULL);
    expect_error(&s, C, "{\"prompt\":\"\\ud800\"}", 400, NULL, NULL);
    expect_error(&s, CH, "{\"messages\":[]}", 400, "messages", NULL);
    expect_error(&s, CH, "{\"messages\":\"hi\"}", 400, "messages", NULL);
    expect_error(&s, CH, "{\"messages\":[{\"content\":\"hi\"}]}", 400, "messages", NULL);
    expect_error(&s, CH, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}", 400,
                 "messages", NULL);
    expect_error(&s, CH, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_logprobs\":3}", 400,
                 "top_logprobs", NULL);
    expect_error(&s, E, "{\"input\":[]}", 400, "input", NULL);
    expect_error(&s, E, "{\"input\":3}", 400, "input", NULL);
    { /* the message names which of several inputs holds the bad id */
        struct resp r = http(&s, "POST", E, "{\"input\":[[1,2],[45,99999999]]}");
        cr_expect_eq(r.code, 400);
        cr_expect(jstr(r.json, "error.message") && strstr(jstr(r.json, "error.message"), "'input[1]'[1]"), "%s",
                  r.body);
        resp_free(&r);
    }
    expect_error(&s, E, "{\"input\":\"x\",\"encoding_format\":\"hex\"}", 400, "encoding_format", NULL);
    /* over-long prompt: 80 token ids in a 64-position context */
    char body[2048] = "{\"prompt\":[1";
    for (int i = 0; i < 79; i++) strcat(body, ",45");
    strcat(body, "]}");
    expect_error(&s, C, body, 400, "prompt", "context_length_exceeded");
    expect_error(&s, E, "{\"input\":[1,45,45,45,45,45,45,45,45,45,45,45,45,45,45,45,45,45,45,45,45,45,"
                        "45,45,45,45,45,45,45,45,45,45,45,45,45,45,45,45,45,45,45,45,45,45,45,45,"
                        "45,45,45,45,45,45,45,45,45,45,45,45,45,45,45,45,45,45,45,45,45,45,45]}",
                 400, "input", "context_length_exceeded");
    /* invalid UTF-8 in the body */
    char tag[320];
    const char bad[] = "{\"prompt\":\"caf\xe9\"}";
    struct resp r = curl_finish(curl_start(&s, "POST", C, bad, sizeof bad - 1, NULL, tag), tag);
    cr_assert_eq(r.code, 400);
    cr_assert(strstr(jstr(r.json, "error.message"), "UTF-8"), "%s", r.body);
    resp_free(&r);
    /* oversized body: 413, before or after reading it */
    size_t big = 50000;
    char *huge = malloc(big + 1);
    memset(huge, ' ', big);
    huge[big] = 0;
    r = curl_finish(curl_start(&s, "POST", C, huge, big, NULL, tag), tag);
    cr_assert_eq(r.code, 413, "%d %s", r.code, r.body);
    cr_assert_str_eq(jstr(r.json, "error.code"), "request_too_large");
    resp_free(&r);
    const char *chunked[] = {"-H", "Transfer-Encoding: chunked", NULL};
    r = curl_finish(curl_start(&s, "POST", C, huge, big, chunked, tag), tag);
    cr_assert_eq(r.code, 413, "%d %s", r.code, r.body);
    resp_free(&r);
    free(huge);
    /* paths and methods */
    r = http(&s, "GET", "/v2/nothing", NULL);
    cr_assert_eq(r.code, 404);
    cr_assert(jstr(r.json, "error.message"));
    resp_free(&r);
    r = http(&s, "GET", "/v1/completions", NULL);
    cr_assert_eq(r.code, 405);
    resp_free(&r);
    r = http(&s, "GET", "/v1/models/gpt-4", NULL);
    cr_assert_eq(r.code, 404);
    resp_free(&r);
    /* still alive and well */
    r = http(&s, "POST", C, "{\"prompt\":\"ok\",\"max_tokens\":2}");
    cr_assert_eq(r.code, 200);
    resp_free(&r);
    cr_assert_eq(server_stop(&s), 0);
}

Test(serve, api_key, .timeout = 60) {
    struct server s;
    const char *extra[] = {"--api-key", "sekret", NULL};
    server_start(&s, extra);
    struct resp r = http(&s, "GET", "/v1/models", NULL);
    cr_assert_eq(r.code, 401);
    cr_assert_str_eq(jstr(r.json, "error.code"), "invalid_api_key");
    resp_free(&r);
    const char *wrong[] = {"-H", "Authorization: Bearer sekreT", NULL};
    r = http_x(&s, "GET", "/v1/models", NULL, wrong);
    cr_assert_eq(r.code, 401);
    resp_free(&r);
    const char *right[] = {"-H", "Authorization: Bearer sekret", NULL};
    r = http_x(&s, "GET", "/v1/models", NULL, right);
    cr_assert_eq(r.code, 200);
    resp_free(&r);
    const char *anthropic[] = {"-H", "x-api-key: sekret", NULL}; /* Anthropic's SDKs send the key so */
    r = http_x(&s, "GET", "/v1/models", NULL, anthropic);
    cr_assert_eq(r.code, 200);
    resp_free(&r);
    r = http(&s, "POST", "/v1/messages", "{}"); /* Anthropic's routes answer in Anthropic's error shape */
    cr_assert_eq(r.code, 401);
    cr_assert_str_eq(jstr(r.json, "type"), "error");
    cr_assert_str_eq(jstr(r.json, "error.type"), "authentication_error");
    resp_free(&r);
    r = http(&s, "GET", "/health", NULL); /* health stays open for probes */
    cr_assert_eq(r.code, 200);
    resp_free(&r);
    cr_assert_eq(server_stop(&s), 0);
}

/* 8 concurrent requests (4 slots: some share decode steps, some queue) each
 * give exactly what they give alone, greedy and seeded */
Test(serve, concurrent_requests_match_alone, .timeout = 120) {
    struct server s;
    const char *extra[] = {"--parallel", "4", NULL};
    server_start(&s, extra);
    enum { N = 8 };
    const char *prompts[N] = {"The cat", "Once upon a time", "In a galaxy", "Hello", "Why is the sky",
                              "1, 2, 3,", "def main():", "The quick brown fox"};
    char bodies[N][256];
    for (int i = 0; i < N; i++)
        snprintf(bodies[i], sizeof bodies[i],
                 "{\"prompt\":\"%s\",\"max_tokens\":%d,\"temperature\":%s,\"seed\":%d,\"ignore_eos\":true}", prompts[i],
                 20 + 3 * i, i % 2 ? "0.8" : "0", i % 4 == 1 ? -(100 + i) : 100 + i); /* a negative seed is a seed too */
    cr_assert_eq(together_as_alone(&s, bodies, N), N, "requests together got other text than alone");
    /* the batch really was shared: more rows than steps */
    long long n_rows, n_steps;
    decode_counts(&s, &n_rows, &n_steps);
    cr_assert_gt(n_rows, n_steps, "rows %lld, steps %lld", n_rows, n_steps);
    cr_assert_eq(server_stop(&s), 0);
}

/* "echo": the text starts with the prompt's; with logprobs the prompt's tokens are scored (the first has none), as
 * an evaluation harness asks (max_tokens 0): each token's log-probability given the ones before it is the one decoding
 * gave it when it was generated; the completion's offsets follow the prompt's text; streamed, the same text */
Test(serve, echo_scores_the_prompt, .timeout = 120) {
    struct server s;
    server_start(&s, NULL);
    /* a greedy completion with its logprobs, then the prompt and it echoed and scored */
    struct resp g = http(&s, "POST", "/v1/completions", "{\"prompt\":\"Once upon a time\",\"max_tokens\":6,"
                         "\"temperature\":0,\"logprobs\":1,\"ignore_eos\":true}");
    cr_assert_eq(g.code, 200, "%s", g.body);
    struct resp e = http(&s, "POST", "/v1/completions", "{\"prompt\":\"Once upon a time\",\"max_tokens\":6,"
                         "\"temperature\":0,\"logprobs\":1,\"ignore_eos\":true,\"echo\":true}");
    cr_assert_eq(e.code, 200, "%s", e.body);
    long long np = jint(e.json, "usage.prompt_tokens");
    json_t *elp = jget(e.json, "choices.0.logprobs"), *glp = jget(g.json, "choices.0.logprobs");
    cr_assert_eq((long long)json_array_size(json_object_get(elp, "tokens")), np + 6, "%s", e.body);
    cr_assert(json_is_null(json_array_get(json_object_get(elp, "token_logprobs"), 0)), "%s", e.body);
    cr_assert(json_is_null(json_array_get(json_object_get(elp, "top_logprobs"), 0)), "%s", e.body);
    const char *ptext = jstr(e.json, "choices.0.text"), *gtext = jstr(g.json, "choices.0.text");
    size_t plen = strlen(ptext) - strlen(gtext);
    cr_assert_str_eq(ptext + plen, gtext, "%s", e.body);
    cr_assert(!strncmp(ptext, "Once upon a time", plen) && plen >= 15, "%s", e.body);
    for (int k = 0; k < 6; k++) { /* the completion's part: the same tokens, logprobs, and offsets after the prompt */
        json_t *et = json_array_get(json_object_get(elp, "token_logprobs"), (size_t)(np + k));
        json_t *gt = json_array_get(json_object_get(glp, "token_logprobs"), (size_t)k);
        cr_assert_float_eq(json_number_value(et), json_number_value(gt), 1e-6, "%s", e.body);
        cr_assert_eq(json_integer_value(json_array_get(json_object_get(elp, "text_offset"), (size_t)(np + k))),
                     json_integer_value(json_array_get(json_object_get(glp, "text_offset"), (size_t)k)) + (long long)plen);
    }
    /* the prompt and the completion as one prompt, scored: the completion's tokens get the logprobs decoding gave */
    json_t *rq = json_pack("{s:s,s:i,s:b,s:i}", "prompt", ptext, "max_tokens", 0, "echo", 1, "logprobs", 2);
    char *full = json_dumps(rq, JSON_COMPACT);
    struct resp sc = http(&s, "POST", "/v1/completions", full);
    free(full);
    json_decref(rq);
    cr_assert_eq(sc.code, 200, "%s", sc.body);
    json_t *slp = jget(sc.json, "choices.0.logprobs");
    size_t ns = json_array_size(json_object_get(slp, "tokens"));
    cr_assert_eq(jint(sc.json, "usage.completion_tokens"), 0, "%s", sc.body);
    cr_assert_str_eq(jstr(sc.json, "choices.0.text"), ptext, "%s", sc.body);
    if (ns == (size_t)(np + 6)) /* the text tokenizes back to the same tokens: compare their scores */
        for (int k = 0; k < 6; k++) {
            double got = json_number_value(json_array_get(json_object_get(slp, "token_logprobs"), (size_t)(np + k)));
            double want = json_number_value(json_array_get(json_object_get(glp, "token_logprobs"), (size_t)k));
            cr_assert(fabs(got - want) < 2e-3, "token %d: scored %g, decoded %g: %s", k, got, want, sc.body);
            json_t *top = json_array_get(json_object_get(slp, "top_logprobs"), (size_t)(np + k));
            cr_assert(json_object_size(top) >= 1 && json_object_size(top) <= 2, "%s", sc.body);
        }
    else /* (a greedy text the tokenizer would split otherwise: pick another prompt) */
        cr_assert_fail("the prompt and completion tokenized to %zu tokens, not %lld: %s", ns, np + 6, sc.body);
    /* streamed: the same text, the prompt's first */
    struct resp st = http(&s, "POST", "/v1/completions", "{\"prompt\":\"Once upon a time\",\"max_tokens\":6,"
                          "\"temperature\":0,\"ignore_eos\":true,\"echo\":true,\"stream\":true}");
    cr_assert_eq(st.code, 200, "%s", st.body);
    struct sse ev;
    sse_parse(st.body, false, &ev);
    cr_assert_str_eq(ev.text, ptext);
    /* echo alone, nothing generated */
    struct resp z = http(&s, "POST", "/v1/completions", "{\"prompt\":\"Once upon\",\"max_tokens\":0,\"echo\":true}");
    cr_assert_eq(z.code, 200, "%s", z.body);
    cr_assert_str_eq(jstr(z.json, "choices.0.text"), "Once upon", "%s", z.body);
    cr_assert(json_is_null(jget(z.json, "choices.0.logprobs")));
    resp_free(&g), resp_free(&e), resp_free(&sc), resp_free(&st), resp_free(&z);
    cr_assert_eq(server_stop(&s), 0);
}

/* "n": each choice is the request of its own, choice i with the seed plus i: its text is the one a request with
 * that seed gets alone; greedy choices agree; usage counts every choice's tokens. "best_of": the best n of that many
 * by mean logprob per token */
Test(serve, n_choices_are_requests_of_their_own, .timeout = 120) {
    struct server s;
    const char *extra[] = {"--parallel", "2", NULL};
    server_start(&s, extra);
    const char *eps[2] = {"/v1/completions", "/v1/chat/completions"};
    const char *fmt[2] = {"{\"prompt\":\"Once upon\",\"max_tokens\":12,\"temperature\":0.9,\"seed\":%d%s}",
                          "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"max_tokens\":12,"
                          "\"temperature\":0.9,\"seed\":%d%s}"};
    const char *text[2] = {"text", "message.content"};
    for (int e = 0; e < 2; e++) {
        char body[512], path[64];
        snprintf(body, sizeof body, fmt[e], 40, ",\"n\":3,\"ignore_eos\":true");
        struct resp all = http(&s, "POST", eps[e], body);
        cr_assert_eq(all.code, 200, "%s", all.body);
        cr_assert_eq(json_array_size(jget(all.json, "choices")), 3, "%s", all.body);
        long long made = 0;
        for (int i = 0; i < 3; i++) {
            snprintf(body, sizeof body, fmt[e], 40 + i, ",\"ignore_eos\":true");
            struct resp one = http(&s, "POST", eps[e], body);
            cr_assert_eq(one.code, 200, "%s", one.body);
            snprintf(path, sizeof path, "choices.%d.index", i);
            cr_assert_eq(jint(all.json, path), i, "%s", all.body);
            snprintf(path, sizeof path, "choices.%d.%s", i, text[e]);
            char want[64];
            snprintf(want, sizeof want, "choices.0.%s", text[e]);
            cr_assert_str_eq(jstr(all.json, path), jstr(one.json, want), "%s choice %d", eps[e], i);
            made += jint(one.json, "usage.completion_tokens");
            resp_free(&one);
        }
        cr_assert_eq(jint(all.json, "usage.completion_tokens"), made, "%s", all.body);
        cr_assert_eq(jint(all.json, "usage.total_tokens"), made + jint(all.json, "usage.prompt_tokens"));
        /* streamed: each index's chunks give its choice's text and finish, then the usage of all, then [DONE] */
        snprintf(body, sizeof body, fmt[e], 40, ",\"n\":3,\"ignore_eos\":true,\"stream\":true,"
                 "\"stream_options\":{\"include_usage\":true}");
        struct resp st = http(&s, "POST", eps[e], body);
        cr_assert_eq(st.code, 200, "%s", st.body);
        for (int i = 0; i < 3; i++) {
            struct sse ev;
            sse_parse_choice(st.body, e == 1, i, &ev);
            snprintf(path, sizeof path, "choices.%d.%s", i, text[e]);
            cr_assert_str_eq(ev.text, jstr(all.json, path), "%s choice %d: %s", eps[e], i, st.body);
            cr_assert_str_eq(ev.finish, "length", "%s choice %d", eps[e], i);
            cr_assert(ev.done && ev.usage_last, "%s", st.body);
            cr_assert_eq(ev.usage_completion, made, "%s", st.body);
        }
        resp_free(&st);
        resp_free(&all);
    }
    struct resp g = http(&s, "POST", "/v1/completions", "{\"prompt\":\"Once\",\"max_tokens\":8,\"temperature\":0,\"n\":2}");
    cr_assert_eq(g.code, 200, "%s", g.body);
    cr_assert_str_eq(jstr(g.json, "choices.0.text"), jstr(g.json, "choices.1.text"));
    resp_free(&g);
    /* best_of 4, n 2: the two of the four seeds' texts with the highest mean logprob per token, best first; usage
     * counts all four */
    const char *bfmt = "{\"prompt\":\"Once upon\",\"max_tokens\":10,\"temperature\":1.2,\"seed\":60,"
                       "\"ignore_eos\":true%s}";
    char body[256];
    snprintf(body, sizeof body, bfmt, ",\"n\":2,\"best_of\":4");
    struct resp b = http(&s, "POST", "/v1/completions", body);
    cr_assert_eq(b.code, 200, "%s", b.body);
    cr_assert_eq(json_array_size(jget(b.json, "choices")), 2, "%s", b.body);
    double mean[4];
    char texts[4][512];
    long long made = 0;
    for (int i = 0; i < 4; i++) {
        char seeded[64];
        snprintf(seeded, sizeof seeded, ",\"logprobs\":0,\"seed\":%d", 60 + i);
        snprintf(body, sizeof body, bfmt, seeded);
        struct resp one = http(&s, "POST", "/v1/completions", body);
        cr_assert_eq(one.code, 200, "%s", one.body);
        json_t *lps = jget(one.json, "choices.0.logprobs.token_logprobs");
        mean[i] = 0;
        for (size_t k = 0; k < json_array_size(lps); k++) mean[i] += json_number_value(json_array_get(lps, k));
        mean[i] /= (double)json_array_size(lps);
        snprintf(texts[i], sizeof texts[i], "%s", jstr(one.json, "choices.0.text"));
        made += jint(one.json, "usage.completion_tokens");
        resp_free(&one);
    }
    int best = 0, second = -1;
    for (int i = 1; i < 4; i++)
        if (mean[i] > mean[best]) best = i;
    for (int i = 0; i < 4; i++)
        if (i != best && (second < 0 || mean[i] > mean[second])) second = i;
    cr_assert_str_eq(jstr(b.json, "choices.0.text"), texts[best], "%s", b.body);
    cr_assert_str_eq(jstr(b.json, "choices.1.text"), texts[second], "%s", b.body);
    cr_assert_eq(jint(b.json, "usage.completion_tokens"), made, "%s", b.body);
    resp_free(&b);
    /* several prompts, n 2 each: choice p * 2 + c is prompt p's with seed 70 + c; usage sums the prompts and choices;
     * streamed, the same by index */
    const char *prompts[2] = {"\"Once upon\"", "[5, 9, 13]"};
    char want[4][512];
    long long want_prompt = 0, want_made = 0;
    for (int p = 0; p < 2; p++)
        for (int c = 0; c < 2; c++) {
            snprintf(body, sizeof body, "{\"prompt\":%s,\"max_tokens\":6,\"temperature\":0.9,\"seed\":%d,"
                     "\"ignore_eos\":true}", prompts[p], 70 + c);
            struct resp one = http(&s, "POST", "/v1/completions", body);
            cr_assert_eq(one.code, 200, "%s", one.body);
            snprintf(want[p * 2 + c], sizeof want[0], "%s", jstr(one.json, "choices.0.text"));
            want_prompt += c ? 0 : jint(one.json, "usage.prompt_tokens");
            want_made += jint(one.json, "usage.completion_tokens");
            resp_free(&one);
        }
    for (int streamed = 0; streamed < 2; streamed++) {
        snprintf(body, sizeof body, "{\"prompt\":[%s,%s],\"n\":2,\"max_tokens\":6,\"temperature\":0.9,\"seed\":70,"
                 "\"ignore_eos\":true%s}", prompts[0], prompts[1],
                 streamed ? ",\"stream\":true,\"stream_options\":{\"include_usage\":true}" : "");
        struct resp m = http(&s, "POST", "/v1/completions", body);
        cr_assert_eq(m.code, 200, "%s", m.body);
        for (int t = 0; t < 4; t++) {
            char path[32];
            struct sse ev;
            if (streamed) {
                sse_parse_choice(m.body, false, t, &ev);
            } else {
                snprintf(path, sizeof path, "choices.%d.index", t);
                cr_assert_eq(jint(m.json, path), t, "%s", m.body);
                snprintf(path, sizeof path, "choices.%d.text", t);
            }
            cr_assert_str_eq(streamed ? ev.text : jstr(m.json, path), want[t], "choice %d: %s", t, m.body);
            if (streamed) cr_assert_eq(ev.usage_completion, want_made, "%s", m.body);
        }
        if (!streamed) {
            cr_assert_eq(jint(m.json, "usage.prompt_tokens"), want_prompt, "%s", m.body);
            cr_assert_eq(jint(m.json, "usage.completion_tokens"), want_made, "%s", m.body);
        }
        resp_free(&m);
    }
    b = http(&s, "POST", "/v1/completions", "{\"prompt\":[\"a\",7]}");
    cr_assert_eq(b.code, 400, "%s", b.body);
    resp_free(&b);
    b = http(&s, "POST", "/v1/completions", "{\"prompt\":\"x\",\"best_of\":2,\"stream\":true}");
    cr_assert_eq(b.code, 400, "%s", b.body);
    cr_assert_str_eq(jstr(b.json, "error.param"), "best_of", "%s", b.body);
    resp_free(&b);
    cr_assert_eq(server_stop(&s), 0);
}

/* toy serve --lookup: each slot drafts from its own text and keeps the drafted tokens it samples anyway. Every
 * request gets the text, tokens and logprobs a server without it gives, alone, streamed and batched (greedy, sampled,
 * a stop string, a max_tokens shorter than a draft), while drafts were kept: fewer decode steps than tokens. The
 * random model loops, and leaves loops, so drafts are both kept and refused. */
Test(serve, lookup_gives_the_plain_text, .timeout = 180) {
    struct server plain, spec;
    const char *xp[] = {"--parallel", "4", NULL}, *xs[] = {"--parallel", "4", "--lookup", "6", NULL};
    server_start(&plain, xp);
    server_start(&spec, xs);
    enum { N = 4 };
    char bodies[N][256];
    snprintf(bodies[0], 256, "{\"prompt\":\"a cat\",\"max_tokens\":80,\"temperature\":0,\"ignore_eos\":true,\"logprobs\":2}");
    snprintf(bodies[1], 256, "{\"prompt\":\"on a mat\",\"max_tokens\":70,\"temperature\":0,\"ignore_eos\":true}");
    snprintf(bodies[2], 256, "{\"prompt\":\"the cat sat on a mat and the cat sat on a\",\"max_tokens\":60,"
                             "\"temperature\":0,\"stop\":[\"leb Paulo\"]}");
    snprintf(bodies[3], 256, "{\"prompt\":\"on a mat\",\"max_tokens\":29,\"temperature\":0.7,\"seed\":5,\"ignore_eos\":true}");
    for (int i = 0; i < N; i++) {
        struct resp a = http(&plain, "POST", "/v1/completions", bodies[i]), b = http(&spec, "POST", "/v1/completions", bodies[i]);
        cr_assert_eq(a.code, 200, "%s", a.body);
        cr_assert_eq(b.code, 200, "%s", b.body);
        cr_assert_str_eq(jstr(b.json, "choices.0.text"), jstr(a.json, "choices.0.text"), "request %d", i);
        cr_assert_str_eq(jstr(b.json, "choices.0.finish_reason"), i == 2 ? "stop" : "length", "request %d", i);
        cr_assert_str_eq(jstr(b.json, "choices.0.finish_reason"), jstr(a.json, "choices.0.finish_reason"), "request %d", i);
        cr_assert_eq(jint(b.json, "usage.completion_tokens"), jint(a.json, "usage.completion_tokens"), "request %d", i);
        json_t *la = jget(a.json, "choices.0.logprobs.token_logprobs"), *lb = jget(b.json, "choices.0.logprobs.token_logprobs");
        cr_assert_eq(json_array_size(lb), json_array_size(la));
        for (size_t k = 0; k < json_array_size(la); k++)
            cr_assert_float_eq(json_real_value(json_array_get(lb, k)), json_real_value(json_array_get(la, k)), 1e-3,
                               "token %zu's logprob", k);
        resp_free(&a);
        resp_free(&b);
    }
    cr_assert_eq(metric(&plain, "toy_draft_tokens_total"), 0);
    long long drafted = metric(&spec, "toy_draft_tokens_total"), kept = metric(&spec, "toy_draft_tokens_accepted_total");
    long long steps = metric(&spec, "toy_decode_steps_total"), made = metric(&spec, "toy_completion_tokens_total");
    cr_assert_gt(kept, 20, "%lld of %lld drafted tokens kept", kept, drafted);
    fprintf(stderr, "lookup: %lld of %lld drafted tokens kept, %lld steps for %lld tokens\n", kept, drafted, steps, made);
    cr_assert_gt(drafted, kept, "no draft was refused (%lld drafted)", drafted);
    cr_assert_leq(steps, made - kept, "%lld steps for %lld tokens, %lld of them drafts kept", steps, made, kept);
    /* streamed: the same text */
    char body[300];
    snprintf(body, sizeof body, "%.*s,\"stream\":true}", (int)strlen(bodies[2]) - 1, bodies[2]);
    struct resp a = http(&plain, "POST", "/v1/completions", bodies[2]), st = http(&spec, "POST", "/v1/completions", body);
    cr_assert_eq(st.code, 200, "%s", st.body);
    struct sse ev;
    sse_parse(st.body, false, &ev);
    cr_assert(ev.done);
    cr_assert_str_eq(ev.text, jstr(a.json, "choices.0.text"));
    resp_free(&a);
    resp_free(&st);
    /* together: the texts they get alone, while the slots draft side by side */
    cr_assert_eq(together_as_alone(&spec, bodies, N), N, "requests together got other text than alone");
    /* each request's event says what was drafted for it */
    char cmd[700], evp[400];
    snprintf(evp, sizeof evp, "%s/all.jsonl", spec.dir);
    snprintf(cmd, sizeof cmd, "cat %s/runs/*/events.jsonl > %s", spec.dir, evp);
    cr_assert_eq(system(cmd), 0);
    char *evs = slurp(evp);
    const char *dr = evs ? strstr(evs, "\"draft\":{\"drafted\":") : NULL;
    cr_assert(dr && strstr(dr, "\"accepted\":") && atoll(strstr(dr, "\"accepted\":") + 11) > 0, "%s",
              evs ? evs : "");
    free(evs);
    cr_assert_eq(server_stop(&plain), 0);
    cr_assert_eq(server_stop(&spec), 0);
    /* --lookup is 0..15 */
    char *argv[] = {(char *)toy_bin(), "serve", "-m", "x.gguf", "--lookup", "16", NULL}, log[64];
    snprintf(log, sizeof log, "/tmp/toy-serve-lookup-%d.log", (int)getpid());
    cr_assert_eq(wait_for(spawn(argv, NULL, log), 30), 2);
    char *l = slurp(log);
    cr_assert(l && strstr(l, "--lookup"), "%s", l ? l : "");
    free(l);
    unlink(log);
}

/* a random tiny Llama of vocab tokens and max_ctx positions, without a tokenizer, as dir/name */
static void write_random_llama(const char *dir, const char *name, int64_t vocab, int64_t max_ctx, uint64_t seed,
                               char *path, size_t n) {
    struct toy_llama_config c = toy_llama_preset("tiny");
    c.vocab = vocab;
    c.max_ctx = max_ctx;
    struct toy_llama *m = toy_llama_new(&c, seed);
    cr_assert(m, "%s", toy_last_error());
    snprintf(path, n, "%s/%s", dir, name);
    th_save_llama(m, TOY_F32, path);
    toy_llama_free(m);
}

/* toy serve --draft: a draft model writes each slot's draft, the slot keeps the drafted tokens it samples anyway.
 * Requests get the text and tokens a server without it gives, bit for bit (the rows of a pass that checks a draft
 * are the decode steps' own numbers), alone, streamed and batched: with the model drafting for itself (every
 * greedy draft kept), with the model in Q8_0 and a 48-position context (drafts kept and refused, and texts
 * that outgrow the draft's context), and with prompt lookup as well. A draft of another
 * vocabulary is refused at start. */
Test(serve, draft_model_gives_the_plain_text, .timeout = 240) {
    char dir[] = "/tmp/toy-serve-draft-XXXXXX", other[256], alien[256];
    cr_assert(mkdtemp(dir));
    const char *main_model = model(dir);
    /* the other draft: the model in Q8_0 (its argmax now and then another token), with 48 positions */
    struct toy_llama *mm, *mapped;
    struct toy_tokenizer *tok;
    cr_assert_eq(toy_llama_load(main_model, false, &mapped), TOY_OK, "%s", toy_last_error());
    cr_assert_eq(toy_tokenizer_load_gguf(mapped->gguf, &tok), TOY_OK, "%s", toy_last_error());
    toy_llama_free(mapped);
    cr_assert_eq(toy_llama_load(main_model, true, &mm), TOY_OK, "%s", toy_last_error());
    mm->cfg.max_ctx = 48;
    snprintf(other, sizeof other, "%s/other.gguf", dir);
    th_save_llama_tok(mm, tok, TOY_Q8_0, other);
    write_random_llama(dir, "alien.gguf", mm->cfg.vocab + 300, 64, 6, alien, sizeof alien);
    toy_tokenizer_free(tok);
    toy_llama_free(mm);
    enum { N = 4 };
    char bodies[N][256];
    snprintf(bodies[0], 256, "{\"prompt\":\"a cat\",\"max_tokens\":60,\"temperature\":0,\"ignore_eos\":true,\"logprobs\":1}");
    snprintf(bodies[1], 256, "{\"prompt\":\"on a mat\",\"max_tokens\":50,\"temperature\":0.8,\"seed\":9,\"ignore_eos\":true}");
    snprintf(bodies[2], 256, "{\"prompt\":\"the cat sat on a mat and the cat sat on a\",\"max_tokens\":60,"
                             "\"temperature\":0,\"stop\":[\"leb Paulo\"]}");
    snprintf(bodies[3], 256, "{\"prompt\":\"a dog\",\"max_tokens\":7,\"temperature\":0.5,\"seed\":2,\"ignore_eos\":true}");
    struct server plain;
    const char *xp[] = {"--parallel", "4", NULL};
    server_start(&plain, xp);
    struct resp want[N];
    for (int i = 0; i < N; i++) {
        want[i] = http(&plain, "POST", "/v1/completions", bodies[i]);
        cr_assert_eq(want[i].code, 200, "%s", want[i].body);
    }
    cr_assert_eq(server_stop(&plain), 0);
    const char *drafts[3][10] = {
        {"--parallel", "4", "--draft", main_model, "--draft-p-min", "0", "--draft-max", "4", NULL},
        {"--parallel", "4", "--draft", other, "--draft-p-min", "0", NULL},
        {"--parallel", "4", "--draft", other, "--lookup", "3", "--draft-p-min", "0.1", NULL},
    };
    for (int d = 0; d < 3; d++) {
        struct server spec;
        server_start(&spec, drafts[d]);
        long long dr0 = 0, kp0 = 0;
        for (int i = 0; i < N; i++) {
            struct resp r = http(&spec, "POST", "/v1/completions", bodies[i]);
            cr_assert_eq(r.code, 200, "%s", r.body);
            cr_assert_str_eq(jstr(r.json, "choices.0.text"), jstr(want[i].json, "choices.0.text"), "draft %d request %d", d, i);
            cr_assert_str_eq(jstr(r.json, "choices.0.finish_reason"), jstr(want[i].json, "choices.0.finish_reason"));
            json_t *la = jget(want[i].json, "choices.0.logprobs.token_logprobs"), *lb = jget(r.json, "choices.0.logprobs.token_logprobs");
            cr_assert_eq(json_array_size(lb), json_array_size(la));
            for (size_t k = 0; k < json_array_size(la); k++)
                cr_assert_eq(json_real_value(json_array_get(lb, k)), json_real_value(json_array_get(la, k)),
                             "draft %d: token %zu's logprob", d, k);
            resp_free(&r);
            long long dr = metric(&spec, "toy_draft_tokens_total"), kp = metric(&spec, "toy_draft_tokens_accepted_total");
            if (d == 0 && i == 0) /* greedy to max_tokens, drafting for itself: every draft is kept */
                cr_assert(dr > dr0 && kp - kp0 == dr - dr0, "request %d drafting for itself: %lld of %lld kept", i,
                          kp - kp0, dr - dr0);
            dr0 = dr, kp0 = kp;
        }
        if (d == 0) { /* on request 0's slot, whose draft cache holds "a cat" and request 0's text: only "a cat" kept */
            struct resp r = http(&spec, "POST", "/v1/completions",
                                 "{\"prompt\":\"a cat sat\",\"max_tokens\":40,\"temperature\":0,\"ignore_eos\":true}");
            cr_assert_eq(r.code, 200, "%s", r.body);
            cr_assert_gt(jint(r.json, "usage.prompt_tokens_details.cached_tokens"), 0);
            resp_free(&r);
            long long dr = metric(&spec, "toy_draft_tokens_total"), kp = metric(&spec, "toy_draft_tokens_accepted_total");
            cr_assert(dr > dr0 && kp - kp0 == dr - dr0, "a prompt sharing a cached one's start: %lld of %lld kept",
                      kp - kp0, dr - dr0);
        }
        long long drafted = metric(&spec, "toy_draft_tokens_total"), kept = metric(&spec, "toy_draft_tokens_accepted_total");
        fprintf(stderr, "draft %d: %lld of %lld drafted tokens kept\n", d, kept, drafted);
        cr_assert_gt(kept, 10, "draft %d: %lld of %lld drafted tokens kept", d, kept, drafted);
        if (d == 1) cr_assert_gt(drafted, kept, "draft %d: none refused", d);
        char body[300];
        snprintf(body, sizeof body, "%.*s,\"stream\":true}", (int)strlen(bodies[1]) - 1, bodies[1]);
        struct resp st = http(&spec, "POST", "/v1/completions", body);
        struct sse ev;
        sse_parse(st.body, false, &ev);
        cr_assert(ev.done);
        cr_assert_str_eq(ev.text, jstr(want[1].json, "choices.0.text"), "draft %d streamed", d);
        resp_free(&st);
        cr_assert_eq(together_as_alone(&spec, bodies, N), N, "draft %d: requests together got other text", d);
        cr_assert_eq(server_stop(&spec), 0);
    }
    for (int i = 0; i < N; i++) resp_free(&want[i]);
    /* refused: another vocabulary, a missing file, --draft-max 16 */
    char log[300];
    snprintf(log, sizeof log, "%s/refused.log", dir);
    const char *bad[3][8] = {{"--draft", alien}, {"--draft", "/nonexistent/draft.gguf"}, {"--draft", other, "--draft-max", "16"}};
    const char *says[3] = {"draft model's vocabulary", "draft.gguf", "--draft-max"};
    for (int i = 0; i < 3; i++) {
        char *argv[12] = {(char *)toy_bin(), "serve", "-m", (char *)main_model, "--port", "0", "--no-events"};
        int n = 7;
        for (int k = 0; bad[i][k]; k++) argv[n++] = (char *)bad[i][k];
        argv[n] = NULL;
        int rc = wait_for(spawn(argv, NULL, log), 30);
        cr_assert(rc == 1 || rc == 2, "refusal %d: exit %d", i, rc);
        char *l = slurp(log);
        cr_assert(l && strstr(l, says[i]), "refusal %d: %s", i, l ? l : "");
        free(l);
    }
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}

/* OpenAI's Predicted Outputs: "prediction" drafts the reply where it follows the predicted text. The reply is the
 * one it is without (greedy, sampled, streamed, chat), the prediction's stretches are kept (fewer decode steps than
 * tokens), an edited prediction has tokens kept and refused, and usage says how many of each. Malformed ones get a
 * 400 naming "prediction". */
Test(serve, prediction_drafts_the_reply, .timeout = 120) {
    struct server s;
    server_start(&s, NULL);
    const char *base = "\"prompt\":\"on a mat\",\"max_tokens\":60,\"ignore_eos\":true";
    char body[8192], ptext[4096];
    snprintf(body, sizeof body, "{%s,\"temperature\":0}", base);
    struct resp a = http(&s, "POST", "/v1/completions", body);
    cr_assert_eq(a.code, 200, "%s", a.body);
    const char *text = jstr(a.json, "choices.0.text");
    cr_assert(strlen(text) > 60);
    cr_assert_null(jget(a.json, "usage.completion_tokens_details"));
    /* the reply itself, then with an edit in the middle: as JSON strings */
    char *whole = json_dumps(json_string(text), JSON_ENCODE_ANY), edited[4096];
    size_t cut0 = 30, cut1 = 50; /* on characters' first bytes */
    while (((unsigned char)text[cut0] & 0xC0) == 0x80) cut0++;
    while (((unsigned char)text[cut1] & 0xC0) == 0x80) cut1++;
    snprintf(edited, sizeof edited, "%.*s and an edit %s", (int)cut0, text, text + cut1);
    char *edj = json_dumps(json_string(edited), JSON_ENCODE_ANY);
    const char *preds[2] = {whole, edj};
    for (int pi = 0; pi < 2; pi++) {
        long long steps0 = metric(&s, "toy_decode_steps_total");
        snprintf(body, sizeof body, "{%s,\"temperature\":0,\"prediction\":{\"type\":\"content\",\"content\":%s}}", base,
                 preds[pi]);
        struct resp b = http(&s, "POST", "/v1/completions", body);
        cr_assert_eq(b.code, 200, "%s", b.body);
        cr_assert_str_eq(jstr(b.json, "choices.0.text"), text, "prediction %d", pi);
        long long acc = jint(b.json, "usage.completion_tokens_details.accepted_prediction_tokens"),
                  rej = jint(b.json, "usage.completion_tokens_details.rejected_prediction_tokens");
        fprintf(stderr, "prediction %d: %lld kept, %lld refused, %lld steps\n", pi, acc, rej,
                metric(&s, "toy_decode_steps_total") - steps0);
        cr_assert_geq(acc, pi ? 20 : 35, "prediction %d: %lld kept", pi, acc);
        if (pi) cr_assert_gt(rej, 0, "the edit refused nothing");
        cr_assert_leq(metric(&s, "toy_decode_steps_total") - steps0, 59 - acc);
        resp_free(&b);
    }
    /* sampled, and as text parts: the sampled text */
    snprintf(body, sizeof body, "{%s,\"temperature\":0.9,\"seed\":5}", base);
    struct resp c = http(&s, "POST", "/v1/completions", body);
    snprintf(ptext, sizeof ptext, "%s", jstr(c.json, "choices.0.text"));
    char *cj = json_dumps(json_string(ptext), JSON_ENCODE_ANY);
    snprintf(body, sizeof body, "{%s,\"temperature\":0.9,\"seed\":5,\"prediction\":{\"type\":\"content\",\"content\":"
             "[{\"type\":\"text\",\"text\":%s}]}}", base, cj);
    struct resp d = http(&s, "POST", "/v1/completions", body);
    cr_assert_eq(d.code, 200, "%s", d.body);
    cr_assert_str_eq(jstr(d.json, "choices.0.text"), ptext);
    cr_assert_gt(jint(d.json, "usage.completion_tokens_details.accepted_prediction_tokens"), 20);
    /* streamed, with usage at the end */
    snprintf(body, sizeof body, "{%s,\"temperature\":0,\"stream\":true,\"stream_options\":{\"include_usage\":true},"
             "\"prediction\":{\"type\":\"content\",\"content\":%s}}", base, whole);
    struct resp st = http(&s, "POST", "/v1/completions", body);
    struct sse ev;
    sse_parse(st.body, false, &ev);
    cr_assert(ev.done && ev.usage_last);
    cr_assert_str_eq(ev.text, text);
    /* chat: the reply it gives without */
    const char *chat = "\"messages\":[{\"role\":\"user\",\"content\":\"say it\"}],\"max_tokens\":40,\"temperature\":0";
    snprintf(body, sizeof body, "{%s}", chat);
    struct resp e = http(&s, "POST", "/v1/chat/completions", body);
    cr_assert_eq(e.code, 200, "%s", e.body);
    char *ej = json_dumps(json_string(jstr(e.json, "choices.0.message.content")), JSON_ENCODE_ANY);
    snprintf(body, sizeof body, "{%s,\"prediction\":{\"type\":\"content\",\"content\":%s}}", chat, ej);
    struct resp f = http(&s, "POST", "/v1/chat/completions", body);
    cr_assert_eq(f.code, 200, "%s", f.body);
    cr_assert_str_eq(jstr(f.json, "choices.0.message.content"), jstr(e.json, "choices.0.message.content"));
    /* malformed */
    const char *bad[] = {"{\"type\":\"text\",\"content\":\"x\"}", "{\"type\":\"content\"}", "{\"type\":\"content\",\"content\":5}",
                         "{\"type\":\"content\",\"content\":[{\"type\":\"image\"}]}", "\"x\""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(body, sizeof body, "{%s,\"prediction\":%s}", base, bad[i]);
        struct resp g = http(&s, "POST", "/v1/completions", body);
        cr_assert_eq(g.code, 400, "%s: %s", bad[i], g.body);
        cr_assert_str_eq(jstr(g.json, "error.param"), "prediction", "%s", g.body);
        resp_free(&g);
    }
    free(whole), free(edj), free(cj), free(ej);
    resp_free(&a), resp_free(&c), resp_free(&d), resp_free(&st), resp_free(&e), resp_free(&f);
    cr_assert_eq(server_stop(&s), 0);
}

Test(serve, prefix_cache_reuses_the_prompt, .timeout = 60) {
    struct server s;
    const char *extra[] = {"--parallel", "2", NULL};
    server_start(&s, extra);
    const char *b1 = "{\"prompt\":[1,45,96,173,17,43,43,43,1,2,3,4,5,6,7,8,9,10],\"max_tokens\":6,"
                     "\"temperature\":0,\"ignore_eos\":true}";
    const char *b2 = "{\"prompt\":[1,45,96,173,17,43,43,43,1,2,3,4,5,6,7,8,9,10,11,12],\"max_tokens\":6,"
                     "\"temperature\":0,\"ignore_eos\":true}";
    struct resp a = http(&s, "POST", "/v1/completions", b2); /* cold */
    cr_assert_eq(a.code, 200);
    cr_assert_eq(jint(a.json, "usage.prompt_tokens_details.cached_tokens"), 0);
    struct resp b = http(&s, "POST", "/v1/completions", b1); /* shares 18 tokens with the first */
    cr_assert_eq(b.code, 200);
    cr_assert_eq(jint(b.json, "usage.prompt_tokens_details.cached_tokens"), 17); /* the last one runs for logits */
    struct resp c = http(&s, "POST", "/v1/completions", b2); /* warm: the same answer as cold */
    cr_assert_eq(c.code, 200);
    cr_assert_geq(jint(c.json, "usage.prompt_tokens_details.cached_tokens"), 18);
    cr_assert_str_eq(jstr(c.json, "choices.0.text"), jstr(a.json, "choices.0.text"));
    resp_free(&a);
    resp_free(&b);
    resp_free(&c);
    /* a 600-token prompt (or what the context allows): prefilled in chunks of 256 when cold, its last tokens alone when warm; the same text */
    struct resp mr = http(&s, "GET", "/v1/models", NULL);
    long long n_ctx = jint(mr.json, "data.0.meta.n_ctx"), n_big = n_ctx - 16 < 600 ? n_ctx - 16 : 600;
    resp_free(&mr);
    char *big = malloc(8192);
    strcpy(big, "{\"prompt\":[1");
    for (int i = 1; i < n_big; i++) sprintf(big + strlen(big), ",%d", (i * 7) % 250 + 3);
    strcat(big, "],\"max_tokens\":8,\"temperature\":0,\"ignore_eos\":true}");
    a = http(&s, "POST", "/v1/completions", big);
    b = http(&s, "POST", "/v1/completions", big);
    cr_assert_eq(a.code, 200, "%s", a.body);
    cr_assert_eq(b.code, 200);
    cr_assert_eq(jint(b.json, "usage.prompt_tokens_details.cached_tokens"), n_big - 1);
    cr_assert_str_eq(jstr(b.json, "choices.0.text"), jstr(a.json, "choices.0.text"));
    resp_free(&a);
    resp_free(&b);
    free(big);
    cr_assert_eq(server_stop(&s), 0);
}

/* one slot, one waiting place: a third request gets 503 with Retry-After;
 * a client that goes away (its curl killed while the server says its
 * generation runs) is cancelled and frees the slot for the one waiting */
Test(serve, full_queue_503_and_disconnect_cancels, .timeout = 90) {
    struct server s;
    const char *extra[] = {"--parallel", "1", "--queue", "2", NULL};
    server_start(&s, extra);
    long long n_ctx = server_n_ctx(&s);
    if (n_ctx < 2048) {
        server_stop(&s);
        cr_skip_test("the model's context (%lld) is too short to keep a slot busy", n_ctx);
    }
    const char *longb = "{\"prompt\":\"a\",\"max_tokens\":100000,\"ignore_eos\":true,\"stream\":true}";
    const char *quick = "{\"prompt\":\"b\",\"max_tokens\":2}";
    char ta[320], tb[320], tb2[320];
    pid_t pa = curl_start(&s, "POST", "/v1/completions", longb, strlen(longb), NULL, ta); /* A runs */
    cr_assert(wait_metric(&s, "toy_active_sequences", 1, 20), "A never ran");
    pid_t pb = curl_start(&s, "POST", "/v1/completions", quick, strlen(quick), NULL, tb); /* B waits */
    cr_assert(wait_metric(&s, "toy_queue_depth", 1, 20), "B never waited");
    pid_t pb2 = curl_start(&s, "POST", "/v1/completions", quick, strlen(quick), NULL, tb2); /* B2 waits behind B */
    cr_assert(wait_metric(&s, "toy_queue_depth", 2, 20), "B2 never waited");
    struct resp c = http(&s, "POST", "/v1/completions", quick); /* C: no room */
    cr_assert_eq(c.code, 503, "%d %s", c.code, c.body);
    cr_assert(strstr(c.headers, "Retry-After: 1"), "%s", c.headers);
    cr_assert_str_eq(jstr(c.json, "error.code"), "queue_full");
    resp_free(&c);
    cr_assert_eq(metric(&s, "toy_queue_depth"), 2, "A ran to the end of its context before its client went away");
    /* B2's client goes away while B2 waits behind B: its place is free at once, not once B gets a slot */
    kill(pb2, SIGKILL);
    struct resp b2 = curl_finish(pb2, tb2);
    resp_free(&b2);
    cr_assert(wait_metric(&s, "toy_queue_depth", 1, 20), "an abandoned request kept its place in the queue");
    cr_assert_eq(metric(&s, "toy_active_sequences"), 1, "A still runs");
    pb2 = curl_start(&s, "POST", "/v1/completions", quick, strlen(quick), NULL, tb2); /* B2 again: there is room */
    cr_assert(wait_metric(&s, "toy_queue_depth", 2, 20), "B2 never waited again");
    kill(pa, SIGKILL); /* A's client goes away */
    struct resp a = curl_finish(pa, ta);
    struct resp b = curl_finish(pb, tb); /* B and B2 run once A is cancelled */
    cr_assert_eq(b.code, 200, "%s", b.body);
    b2 = curl_finish(pb2, tb2);
    cr_assert_eq(b2.code, 200, "%s", b2.body);
    resp_free(&a);
    resp_free(&b);
    resp_free(&b2);
    struct resp m = http(&s, "GET", "/metrics", NULL);
    cr_assert(strstr(m.body, "toy_jobs_cancelled_total 2"), "%s", m.body);
    cr_assert(strstr(m.body, "toy_active_sequences 0"), "%s", m.body);
    resp_free(&m);
    /* a plain (not streamed) request whose client goes away is cancelled too */
    const char *longp = "{\"prompt\":\"a\",\"max_tokens\":100000,\"ignore_eos\":true}";
    pa = curl_start(&s, "POST", "/v1/completions", longp, strlen(longp), NULL, ta);
    cr_assert(wait_metric(&s, "toy_active_sequences", 1, 20), "the plain request never ran");
    kill(pa, SIGKILL);
    a = curl_finish(pa, ta);
    cr_assert_eq(a.code, 0, "curl was killed");
    resp_free(&a);
    cr_assert(wait_metric(&s, "toy_jobs_cancelled_total", 3, 10), "the abandoned generation was not cancelled");
    cr_assert(wait_metric(&s, "toy_active_sequences", 0, 10));
    /* the clients that left are counted as 499, none as a success nor as a server error */
    bool counted = false;
    for (double end = now_s() + 10; !counted && now_s() < end; usleep(20000)) {
        m = http(&s, "GET", "/metrics", NULL);
        counted = strstr(m.body, "toy_requests_total{endpoint=\"/v1/completions\",code=\"499\"} 3\n") != NULL;
        if (counted) {
            cr_assert(strstr(m.body, "code=\"200\"} 2\n"), "only B and B2 succeeded: %s", m.body);
            cr_assert(strstr(m.body, "code=\"503\"} 1\n"), "only C was refused: %s", m.body);
        }
        resp_free(&m);
    }
    cr_assert(counted, "the three disconnects are not counted as 499");
    cr_assert_eq(server_stop(&s), 0);
}

/* SIGTERM while a request runs: it completes, new connections are refused, exit 0, run_end written */
Test(serve, sigterm_drains, .timeout = 90) {
    struct server s;
    server_start(&s, NULL);
    /* long enough that the server is seen generating it before it ends */
    long long n = server_n_ctx(&s) - 16;
    n = n > 1000 ? 1000 : n;
    char body[128];
    snprintf(body, sizeof body, "{\"prompt\":\"a\",\"max_tokens\":%lld,\"ignore_eos\":true}", n);
    struct resp bad = http(&s, "POST", "/v1/chat/completions", "{\"messages\":\"x\",\"temperature\":0.5}");
    cr_assert_eq(bad.code, 400, "%s", bad.body);
    resp_free(&bad);
    char tag[320];
    pid_t p = curl_start(&s, "POST", "/v1/completions", body, strlen(body), NULL, tag);
    cr_assert(wait_metric(&s, "toy_active_sequences", 1, 20), "the request never ran");
    kill(s.pid, SIGTERM);
    struct resp r = curl_finish(p, tag);
    cr_assert_eq(r.code, 200, "%d %s", r.code, r.body);
    cr_assert_eq(jint(r.json, "usage.completion_tokens"), n, "%s", r.body);
    resp_free(&r);
    cr_assert_eq(wait_for(s.pid, 30), 0);
    struct resp after = http(&s, "GET", "/health", NULL);
    cr_assert_eq(after.code, 0, "nobody listens after the drain");
    resp_free(&after);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "cat %s/runs/*/events.jsonl > %s/all.jsonl", s.dir, s.dir);
    cr_assert_eq(system(cmd), 0);
    snprintf(cmd, sizeof cmd, "%s/all.jsonl", s.dir);
    char *ev = slurp(cmd);
    cr_assert(ev && strstr(ev, "\"kind\":\"run_start\"") && strstr(ev, "\"phase\":\"serve\""));
    char want[64];
    snprintf(want, sizeof want, "\"completion_tokens\":%lld", n);
    cr_assert(strstr(ev, "\"name\":\"request\"") && strstr(ev, want), "%s", ev);
    /* the refused request's event has no sampling block (it had one of zeros); the served one has its own */
    const char *b400 = strstr(ev, "\"status\":400"), *e400 = b400 ? strchr(b400, '\n') : NULL;
    cr_assert(b400 && e400, "%s", ev);
    const char *samp = strstr(ev, "\"sampling\":");
    cr_assert(samp && (samp < b400 || samp > e400) && !strstr(e400, "\"temperature\":0.5"), "%s", ev);
    cr_assert(strstr(ev, "\"kind\":\"run_end\""), "%s", ev);
    free(ev);
    server_clean(&s);
}

/* the official openai npm package (installed once into $TMPDIR; skipped without node/npm or a registry) */
/* The path of a Node script `name` in a folder where npm package pkg is installed (installed there first if need
 * be); the test is skipped without node and npm, or when the install fails (offline) */
static void npm_script(const char *pkg, const char *name, char *path, size_t n) {
    if (system("command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1")) cr_skip_test("no node/npm");
    const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    char dir[512], cmd[2048];
    snprintf(dir, sizeof dir, "%s/toy-serve-npm", tmp);
    snprintf(cmd, sizeof cmd, "%s/node_modules/%s/package.json", dir, pkg);
    if (access(cmd, R_OK)) { /* one install at a time: tests run in parallel, and two npm installs into one folder
                                 leave a package half written */
        snprintf(cmd, sizeof cmd,
                 "mkdir -p %s && cd %s && flock .install sh -c 'test -r node_modules/%s/package.json || "
                 "timeout 120 npm install --no-audit --no-fund --silent %s' >/dev/null 2>&1",
                 dir, dir, pkg, pkg);
        if (system(cmd)) cr_skip_test("npm install %s failed (offline?)", pkg);
    }
    snprintf(path, n, "%s/%s", dir, name);
}

/* Saves the Node script js at path and runs it (in its folder, where the SDKs are installed) with the server's
 * base URL (its address and base) as argument; what it prints, as JSON */
static json_t *node_client(struct server *s, const char *path, const char *js, const char *base) {
    spit(path, js, strlen(js));
    char cmd[2048], f[400];
    const char *slash = strrchr(path, '/');
    snprintf(cmd, sizeof cmd, "cd %.*s && timeout 60 node %s http://127.0.0.1:%d%s > %s/out.json 2> %s/err.txt",
             (int)(slash - path), path, slash + 1, s->port, base, s->dir, s->dir);
    int rc = system(cmd);
    snprintf(f, sizeof f, "%s/err.txt", s->dir);
    char *errs = slurp(f);
    cr_assert_eq(rc, 0, "node client failed: %s", errs ? errs : "");
    free(errs);
    snprintf(f, sizeof f, "%s/out.json", s->dir);
    json_t *o = json_load_file(f, 0, NULL);
    cr_assert(o, "the client printed no JSON");
    return o;
}

Test(serve, openai_npm_client, .timeout = 180) {
    char script[600];
    npm_script("openai", "client.mjs", script, sizeof script);
    struct server s;
    const char *extra[] = {"--api-key", "k", NULL};
    server_start(&s, extra);
    /* the Responses API too: the SDK's output_text, whole and from the event stream */
    const char *js =
        "import OpenAI from 'openai';\n"
        "const c = new OpenAI({baseURL: process.argv[2], apiKey: 'k', maxRetries: 0});\n"
        "const out = {};\n"
        "out.models = (await c.models.list()).data.map(m => m.id);\n"
        "const p = {model: 'tiny', prompt: 'Once upon', max_tokens: 12, temperature: 0.7, seed: 5};\n"
        "out.completion = (await c.completions.create(p)).choices[0].text;\n"
        "let s = ''; for await (const ch of await c.completions.create({...p, stream: true})) s += ch.choices[0]?.text ?? '';\n"
        "out.completion_stream = s;\n"
        "const q = {model: 'tiny', messages: [{role: 'user', content: 'Hi!'}], max_tokens: 10, seed: 3};\n"
        "const r = await c.chat.completions.create(q);\n"
        "out.chat = r.choices[0].message.content; out.usage = r.usage;\n"
        "let t = ''; let u = null;\n"
        "for await (const ch of await c.chat.completions.create({...q, stream: true, stream_options: {include_usage: true}})) {\n"
        "  t += ch.choices[0]?.delta?.content ?? ''; if (ch.usage) u = ch.usage; }\n"
        "out.chat_stream = t; out.stream_usage = u;\n"
        "const e = await c.embeddings.create({model: 'tiny', input: ['a', 'b']});\n"
        "out.emb = e.data.map(d => d.embedding.length);\n"
        "out.emb_norm = Math.hypot(...e.data[0].embedding);\n"
        "const rq = {model: 'tiny', input: 'Hi!', instructions: 'Be brief.', max_output_tokens: 10, temperature: 0};\n"
        "out.resp = (await c.responses.create(rq)).output_text;\n"
        "let rt = ''; let last = null;\n"
        "for await (const ev of await c.responses.create({...rq, stream: true})) {\n"
        "  if (ev.type === 'response.output_text.delta') rt += ev.delta; last = ev; }\n"
        "out.resp_stream = rt; out.resp_last = last.type; out.resp_last_text = last.response.output_text ??\n"
        "  last.response.output[0].content[0].text;\n"
        "const made = await c.responses.create({model: 'tiny', max_output_tokens: 2,\n"
        "  input: [{role: 'user', content: 'a'}, {role: 'user', content: 'b'}, {role: 'user', content: 'c'}]});\n"
        "out.items = []; for await (const it of c.responses.inputItems.list(made.id, {limit: 1})) out.items.push(it.content[0].text);\n"
        "try { await c.completions.create({...p, model: 'nope'}); out.err = 'none'; } catch (x) { out.err = x.status; }\n"
        "console.log(JSON.stringify(out));\n";
    json_t *o = node_client(&s, script, js, "/v1");
    /* the SDK's pages of input items (limit 1, after the last), newest first */
    cr_assert_eq(json_array_size(jget(o, "items")), 3, "%s", json_dumps(o, 0));
    cr_assert_str_eq(jstr(o, "items.0"), "c");
    cr_assert_str_eq(jstr(o, "items.2"), "a");
    cr_assert_str_eq(jstr(o, "models.0"), "tiny");
    cr_assert_str_eq(jstr(o, "completion"), jstr(o, "completion_stream"));
    cr_assert_str_eq(jstr(o, "chat"), jstr(o, "chat_stream"));
    cr_assert_eq(jint(o, "usage.completion_tokens"), jint(o, "stream_usage.completion_tokens"));
    cr_assert_eq(json_array_size(jget(o, "emb")), 2);
    cr_assert_gt(jint(o, "emb.0"), 0);
    cr_assert_float_eq(json_real_value(jget(o, "emb_norm")), 1.0, 1e-4);
    cr_assert_eq(jint(o, "err"), 404);
    cr_assert(jstr(o, "resp") && *jstr(o, "resp"), "the SDK's output_text");
    cr_assert_str_eq(jstr(o, "resp"), jstr(o, "resp_stream"));
    cr_assert_str_eq(jstr(o, "resp"), jstr(o, "resp_last_text"));
    cr_assert(!strcmp(jstr(o, "resp_last"), "response.incomplete") || !strcmp(jstr(o, "resp_last"), "response.completed"));
    json_decref(o);
    cr_assert_eq(server_stop(&s), 0);
}

/* Anthropic's TypeScript SDK against /v1/messages: a message, the same text streamed (its stream helper's final
 * message too), count_tokens, and an error the SDK reads as one */
Test(serve, anthropic_npm_client, .timeout = 180) {
    char script[600];
    npm_script("@anthropic-ai/sdk", "anthropic.mjs", script, sizeof script);
    struct server s;
    const char *extra[] = {"--api-key", "k", NULL};
    server_start(&s, extra);
    const char *js =
        "import Anthropic from '@anthropic-ai/sdk';\n"
        "const c = new Anthropic({baseURL: process.argv[2], apiKey: 'k', maxRetries: 0});\n"
        "const out = {};\n"
        "const q = {model: 'tiny', max_tokens: 12, system: 'Be brief.', messages: [{role: 'user', content: 'Hi!'}],\n"
        "           temperature: 0};\n"
        "const text = m => m.content.filter(b => b.type === 'text').map(b => b.text).join('');\n"
        "const m = await c.messages.create(q);\n"
        "out.text = text(m); out.stop = m.stop_reason; out.usage = m.usage;\n"
        "let t = ''; for await (const ev of await c.messages.create({...q, stream: true}))\n"
        "  if (ev.type === 'content_block_delta' && ev.delta.type === 'text_delta') t += ev.delta.text;\n"
        "out.stream = t;\n"
        "out.final = text(await c.messages.stream(q).finalMessage());\n"
        "out.count = (await c.messages.countTokens({model: 'tiny', system: 'Be brief.',\n"
        "  messages: [{role: 'user', content: 'Hi!'}]})).input_tokens;\n"
        "try { await c.messages.create({...q, model: 'nope'}); out.err = 'none'; }\n"
        "catch (x) { out.err = x.status; out.err_type = x.error?.error?.type ?? x.error?.type; }\n"
        "console.log(JSON.stringify(out));\n";
    json_t *o = node_client(&s, script, js, "");
    cr_assert(jstr(o, "text") && *jstr(o, "text"), "no text");
    cr_assert_str_eq(jstr(o, "text"), jstr(o, "stream"));
    cr_assert_str_eq(jstr(o, "text"), jstr(o, "final"));
    cr_assert(!strcmp(jstr(o, "stop"), "max_tokens") || !strcmp(jstr(o, "stop"), "end_turn"), "%s", jstr(o, "stop"));
    cr_assert_eq(jint(o, "count"), jint(o, "usage.input_tokens") + jint(o, "usage.cache_read_input_tokens"));
    cr_assert_eq(jint(o, "err"), 404);
    cr_assert_str_eq(jstr(o, "err_type"), "not_found_error");
    json_decref(o);
    cr_assert_eq(server_stop(&s), 0);
}

/* 300 mutated bodies (fuzz/fuzz-serve.py): every answer a 2xx or 4xx, the server alive after */
Test(serve, fuzzed_bodies_never_5xx, .timeout = 120) {
    if (system("command -v python3 >/dev/null 2>&1")) cr_skip_test("no python3");
    if (access("fuzz/fuzz-serve.py", R_OK)) cr_skip_test("run from the repository root");
    struct server s;
    const char *extra[] = {"--ctx", "256", NULL};
    server_start(&s, extra);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "timeout 100 python3 fuzz/fuzz-serve.py %d 1 300 > %s/fuzz.txt 2>&1", s.port, s.dir);
    int rc = system(cmd);
    snprintf(cmd, sizeof cmd, "%s/fuzz.txt", s.dir);
    char *out = slurp(cmd);
    cr_assert_eq(rc, 0, "%s", out ? out : "");
    free(out);
    struct resp r = http(&s, "GET", "/health", NULL);
    cr_assert_eq(r.code, 200);
    resp_free(&r);
    cr_assert_eq(server_stop(&s), 0);
}

/* --timeout bounds a generation: it ends early with finish_reason "length" */
Test(serve, timeout_ends_a_generation, .timeout = 60) {
    struct server s;
    const char *extra[] = {"--timeout", "1", NULL};
    server_start(&s, extra);
    long long n_ctx = server_n_ctx(&s);
    if (n_ctx < 2048) {
        server_stop(&s);
        cr_skip_test("the model's context (%lld) is too short for a long generation", n_ctx);
    }
    double t0 = now_s();
    struct resp r = http(&s, "POST", "/v1/completions", "{\"prompt\":\"a\",\"max_tokens\":100000,\"ignore_eos\":true}");
    double dt = now_s() - t0;
    cr_assert_eq(r.code, 200, "%s", r.body);
    cr_assert_str_eq(jstr(r.json, "choices.0.finish_reason"), "length");
    long long n = jint(r.json, "usage.completion_tokens");
    if (n >= n_ctx - 2 && dt < 1.5) { /* a generation that fills the context is over before the limit matters */
        server_stop(&s);
        cr_skip_test("this machine generates the whole %lld-token context in %.2f s, too fast to test a 1 s limit",
                     n_ctx, dt);
    }
    cr_assert_lt(n, n_ctx - 2, "it stopped before the context was full (%.2f s)", dt);
    cr_assert(dt > 0.95 && dt < 10.0, "%.2f s", dt);
    resp_free(&r);
    cr_assert_eq(server_stop(&s), 0);

    /* the limit counts from when a request gets a slot: B, queued behind A for most of A's second, still runs
     * a second of its own (so about 2 s from its submission, not 1) */
    const char *extra1[] = {"--timeout", "1", "--parallel", "1", NULL};
    server_start(&s, extra1);
    const char *longb = "{\"prompt\":\"a\",\"max_tokens\":100000,\"ignore_eos\":true}";
    char ta[320], tb[320];
    pid_t pa = curl_start(&s, "POST", "/v1/completions", longb, strlen(longb), NULL, ta);
    cr_assert(wait_metric(&s, "toy_active_sequences", 1, 20), "the long request never ran");
    double tb0 = now_s();
    pid_t pb = curl_start(&s, "POST", "/v1/completions", longb, strlen(longb), NULL, tb);
    struct resp a = curl_finish(pa, ta);
    double ta1 = now_s();
    struct resp b = curl_finish(pb, tb);
    double tb1 = now_s();
    cr_assert_eq(a.code, 200, "%s", a.body);
    cr_assert_eq(b.code, 200, "%s", b.body);
    cr_assert_gt(jint(b.json, "usage.completion_tokens"), 0, "%s", b.body);
    cr_assert(tb1 - ta1 > 0.8, "B ran %.2f s after A ended, not its own second (%.2f s in all)", tb1 - ta1,
              tb1 - tb0);
    resp_free(&a);
    resp_free(&b);
    cr_assert_eq(server_stop(&s), 0);
}

/* A chat request's reasoning_effort (OpenAI's; gpt-oss's template reads it) and chat_template_kwargs (llama.cpp's)
 * reach the template as variables; kwargs do not replace the messages; either of the wrong type is a 400 */
Test(serve, reasoning_effort_and_template_kwargs_reach_the_template, .timeout = 60) {
    struct server s;
    const char *extra[] = {"--chat-template",
                           "{{ reasoning_effort | default('') }}|{{ note | default('') }}|"
                           "{% for m in messages %}{{ m.content }}{% endfor %}",
                           NULL};
    server_start(&s, extra);
    const char *bodies[] = {
        "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":1}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":1,"
        "\"reasoning_effort\":\"high high high high\"}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":1,"
        "\"chat_template_kwargs\":{\"note\":\"more words in the note\",\"messages\":[]}}"};
    long long n[3];
    for (int i = 0; i < 3; i++) {
        struct resp r = http(&s, "POST", "/v1/chat/completions", bodies[i]);
        cr_assert_eq(r.code, 200, "%d: %s", i, r.body);
        n[i] = jint(r.json, "usage.prompt_tokens");
        resp_free(&r);
    }
    cr_assert(n[1] > n[0] && n[2] > n[0], "prompt tokens %lld, %lld, %lld: the variables did not reach the template",
              n[0], n[1], n[2]);
    const char *bad[][2] = {{"{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"reasoning_effort\":3}",
                             "reasoning_effort"},
                            {"{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"chat_template_kwargs\":[1]}",
                             "chat_template_kwargs"}};
    for (int i = 0; i < 2; i++) {
        struct resp r = http(&s, "POST", "/v1/chat/completions", bad[i][0]);
        cr_assert_eq(r.code, 400, "%s", r.body);
        cr_assert(strstr(r.body, bad[i][1]), "%s", r.body);
        resp_free(&r);
    }
    cr_assert_eq(server_stop(&s), 0);
}

/* --chat-template picks the rendering; a template that does not parse stops the server at startup */
Test(serve, chat_template_flag, .timeout = 60) {
    const char *body = "{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":\"user\",\"content\":"
                       "\"Hello there\"}],\"max_tokens\":1}";
    long long n[2];
    const char *names[2] = {"chatml", "llama2"};
    for (int t = 0; t < 2; t++) {
        struct server s;
        const char *extra[] = {"--chat-template", names[t], NULL};
        server_start(&s, extra);
        struct resp r = http(&s, "POST", "/v1/chat/completions", body);
        cr_assert_eq(r.code, 200, "%s", r.body);
        n[t] = jint(r.json, "usage.prompt_tokens");
        resp_free(&r);
        cr_assert_eq(server_stop(&s), 0);
    }
    cr_assert_neq(n[0], n[1], "chatml and llama2 render differently (%lld tokens each)", n[0]);
    char dir[] = "/tmp/toy-serve-test-XXXXXX", log[64];
    cr_assert(mkdtemp(dir));
    snprintf(log, sizeof log, "%s/log", dir);
    char *argv[] = {(char *)toy_bin(), "serve", "-m", (char *)model(dir), "--port", "0", "--no-events",
                    "--chat-template", "{% if %}", NULL};
    cr_assert_eq(wait_for(spawn(argv, NULL, log), 30), 1);
    argv[8] = "chatml2"; /* a mistyped name is not rendered as a template of plain text */
    cr_assert_eq(wait_for(spawn(argv, NULL, log), 30), 1);
    char *l = slurp(log);
    cr_assert(l && strstr(l, "'chatml2'"), "%s", l ? l : "");
    free(l);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}

/* The edges of a request: max_tokens 0, a prompt that exactly fills the context, logprobs' text_offset with
 * and without a stop string, a completion's first space, 405's Allow header, options toy does not implement */
Test(serve, request_edges, .timeout = 60) {
    struct server s;
    const char *extra[] = {"--ctx", "128", NULL};
    server_start(&s, extra);
    cr_assert_eq(server_n_ctx(&s), 128);
    for (int chat = 0; chat < 2; chat++) {
        struct resp r = http(&s, "POST", chat ? "/v1/chat/completions" : "/v1/completions",
                             chat ? "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":0}"
                                  : "{\"prompt\":\"Once\",\"max_tokens\":0}");
        cr_assert_eq(r.code, 200, "%s", r.body);
        cr_assert_eq(jint(r.json, "usage.completion_tokens"), 0, "%s", r.body);
        cr_assert_str_eq(jstr(r.json, "choices.0.finish_reason"), "length");
        resp_free(&r);
    }
    /* prompt + completion fill the 128 positions exactly; a 128-token prompt leaves no room */
    char ids[512] = "[1";
    for (int i = 1; i < 127; i++) strcat(ids, ",5");
    char body[700];
    snprintf(body, sizeof body, "{\"prompt\":%s],\"max_tokens\":100,\"ignore_eos\":true}", ids);
    struct resp r = http(&s, "POST", "/v1/completions", body);
    cr_assert_eq(r.code, 200, "%s", r.body);
    cr_assert_eq(jint(r.json, "usage.prompt_tokens"), 127, "%s", r.body);
    cr_assert_eq(jint(r.json, "usage.total_tokens"), 128, "%s", r.body);
    cr_assert_str_eq(jstr(r.json, "choices.0.finish_reason"), "length");
    resp_free(&r);
    snprintf(body, sizeof body, "{\"prompt\":%s,5],\"max_tokens\":1}", ids);
    r = http(&s, "POST", "/v1/completions", body);
    cr_assert_eq(r.code, 400, "%s", r.body);
    cr_assert_str_eq(jstr(r.json, "error.code"), "context_length_exceeded");
    resp_free(&r);
    /* text_offset counts characters of the text returned, whether or not text was held back for a stop string;
     * the text is the tokens' text, the first one's space included */
    json_t *offs[2] = {NULL, NULL};
    for (int stop = 0; stop < 2; stop++) {
        r = http(&s, "POST", "/v1/completions",
                 stop ? "{\"prompt\":\"Hello\",\"max_tokens\":8,\"temperature\":0,\"ignore_eos\":true,\"logprobs\":0,"
                        "\"stop\":\"qqqqqq\"}"
                      : "{\"prompt\":\"Hello\",\"max_tokens\":8,\"temperature\":0,\"ignore_eos\":true,\"logprobs\":0}");
        cr_assert_eq(r.code, 200, "%s", r.body);
        offs[stop] = json_incref(jget(r.json, "choices.0.logprobs.text_offset"));
        json_t *toks = jget(r.json, "choices.0.logprobs.tokens");
        char cat[4096] = "";
        bool whole = true; /* every token is whole characters (no U+FFFD stand-in) */
        long long chars = 0;
        for (size_t i = 0; i < json_array_size(toks); i++) {
            const char *t = json_string_value(json_array_get(toks, i));
            cr_assert_eq(json_integer_value(json_array_get(offs[stop], i)), chars, "token %zu: %s", i, r.body);
            for (const char *c = t; *c; c++) chars += ((unsigned char)*c & 0xC0) != 0x80;
            whole &= !strstr(t, "\xef\xbf\xbd");
            strncat(cat, t, sizeof cat - strlen(cat) - 1);
        }
        if (whole && !stop) cr_assert_str_eq(jstr(r.json, "choices.0.text"), cat);
        resp_free(&r);
    }
    cr_assert(json_equal(offs[0], offs[1]), "a stop string moved the offsets");
    json_decref(offs[0]);
    json_decref(offs[1]);
    r = http(&s, "GET", "/v1/completions", NULL);
    cr_assert_eq(r.code, 405);
    cr_assert(strstr(r.headers, "Allow: POST"), "%s", r.headers);
    resp_free(&r);
    const char *refused[][2] = {{"/v1/completions", "{\"prompt\":\"a\",\"echo\":\"yes\"}"},
                                {"/v1/completions", "{\"prompt\":\"a\",\"best_of\":2,\"n\":3}"},
                                {"/v1/completions", "{\"prompt\":\"a\",\"suffix\":7}"},
                                {"/v1/chat/completions", "{\"messages\":[{\"role\":\"wizard\",\"content\":\"a\"}]}"},
                                {"/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"tools\":\"x\"}"},
                                {"/v1/completions", "{\"prompt\":\"a\",\"seed\":1180591620717411303424}"}};
    const char *param[] = {"echo", "best_of", "suffix", "messages", "tools", NULL};
    for (int i = 0; i < 6; i++) {
        r = http(&s, "POST", refused[i][0], refused[i][1]);
        cr_assert_eq(r.code, 400, "%s: %s", refused[i][1], r.body);
        if (param[i]) cr_assert_str_eq(jstr(r.json, "error.param"), param[i], "%s", r.body);
        else cr_assert(strstr(jstr(r.json, "error.message"), "out of range"), "%s", r.body);
        resp_free(&r);
    }
    /* with include_usage every chunk but the usage one has "usage": null, the first (role) one too */
    r = http(&s, "POST", "/v1/chat/completions",
             "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":2,\"stream\":true,"
             "\"stream_options\":{\"include_usage\":true}}");
    cr_assert_eq(r.code, 200);
    const char *first = strstr(r.body, "data: "), *end = first ? strstr(first, "\n\n") : NULL;
    cr_assert(end, "%s", r.body);
    char *c1 = strndup(first, (size_t)(end - first));
    cr_assert(strstr(c1, "\"role\":\"assistant\"") && strstr(c1, "\"usage\":null"), "%s", c1);
    free(c1);
    resp_free(&r);
    cr_assert_eq(server_stop(&s), 0);
}

/* connects to the server and sends nothing (an idle client holding a connection) */
static int idle_connection(struct server *s) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)s->port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert(fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0);
    return fd;
}

/* beyond --max-connections a client gets a prompt 503, not a hang in the listen backlog */
Test(serve, max_connections_refuses, .timeout = 60) {
    struct server s;
    const char *extra[] = {"--max-connections", "2", NULL};
    server_start(&s, extra);
    int a = idle_connection(&s), b = idle_connection(&s);
    const char *mt[] = {"--max-time", "5", NULL};
    struct resp r = {0};
    for (double end = now_s() + 10; now_s() < end; usleep(20000)) { /* until the server has seen both */
        resp_free(&r);
        r = http_x(&s, "GET", "/v1/models", NULL, mt);
        if (r.code == 503) break;
    }
    cr_assert_eq(r.code, 503, "%d %s", r.code, r.body);
    cr_assert_str_eq(jstr(r.json, "error.code"), "too_many_connections");
    resp_free(&r);
    close(a);
    close(b);
    for (double end = now_s() + 10; now_s() < end; usleep(20000)) {
        r = http_x(&s, "GET", "/v1/models", NULL, mt);
        if (r.code == 200) break;
        resp_free(&r);
    }
    cr_assert_eq(r.code, 200, "served again once the idle clients left");
    resp_free(&r);
    cr_assert_eq(server_stop(&s), 0);
}

/* when --drain runs out, what still runs ends as an error: a stream gets an error event and [DONE], a plain
 * request a 503; neither is cut off or reported as a finished completion */
Test(serve, drain_expiry_ends_requests_cleanly, .timeout = 90) {
    struct server s;
    const char *extra[] = {"--drain", "1", "--parallel", "2", NULL};
    server_start(&s, extra);
    long long n_ctx = server_n_ctx(&s);
    if (n_ctx < 2048) {
        server_stop(&s);
        cr_skip_test("the model's context (%lld) is too short to outlast the drain", n_ctx);
    }
    const char *sb = "{\"prompt\":\"a\",\"max_tokens\":100000,\"ignore_eos\":true,\"stream\":true}";
    const char *pb = "{\"prompt\":\"b\",\"max_tokens\":100000,\"ignore_eos\":true}";
    char ts[320], tp[320];
    pid_t ps = curl_start(&s, "POST", "/v1/completions", sb, strlen(sb), NULL, ts);
    pid_t pp = curl_start(&s, "POST", "/v1/completions", pb, strlen(pb), NULL, tp);
    cr_assert(wait_metric(&s, "toy_active_sequences", 2, 20), "the requests never ran");
    double t0 = now_s();
    kill(s.pid, SIGTERM);
    struct resp a = curl_finish(ps, ts), b = curl_finish(pp, tp);
    cr_assert_eq(wait_for(s.pid, 30), 0);
    if (now_s() - t0 < 1.0) { /* both finished inside the drain: nothing to check */
        resp_free(&a);
        resp_free(&b);
        server_clean(&s);
        cr_skip_test("the generations ended within the 1 s drain");
    }
    cr_assert_eq(a.code, 200);
    cr_assert(strstr(a.body, "\"error\"") && strstr(a.body, "data: [DONE]\n\n"), "%s",
              a.body + (strlen(a.body) > 400 ? strlen(a.body) - 400 : 0));
    cr_assert_eq(b.code, 503, "%d %.300s", b.code, b.body);
    cr_assert(strstr(jstr(b.json, "error.message"), "stopped"), "%s", b.body);
    resp_free(&a);
    resp_free(&b);
    server_clean(&s);
}

/* Q8_0 weights: a product of <= 8 rows uses integer dot products, a larger
 * one dequantizes for sgemm; the server multiplies in groups of 8 rows so 16
 * concurrent sequences (and prefix-cache hits) get exactly what each gets
 * alone. A tiny model trained and quantized on the spot (d_model 64: the
 * integer path needs rows of a multiple of 32). */
Test(serve, q8_batch_of_16_matches_alone, .timeout = 180) {
    char dir[] = "/tmp/toy-serve-test-XXXXXX", data[64], out[64], q8[64];
    cr_assert(mkdtemp(dir));
    snprintf(data, sizeof data, "%s/data.txt", dir);
    snprintf(out, sizeof out, "%s/run", dir);
    snprintf(q8, sizeof q8, "%s/q8.gguf", dir);
    FILE *f = fopen(data, "w");
    const char *w[] = {"the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "to", "park"};
    unsigned r = 7;
    for (int i = 0; i < 4000; i++) {
        r = r * 1103515245u + 12345u;
        fprintf(f, "%s%s", w[(r >> 16) % 11], i % 12 == 11 ? "\n" : " ");
    }
    fclose(f);
    char *train[] = {(char *)toy_bin(), "train", "--data", data, "--preset", "tiny", "--steps", "10", "--ctx", "256",
                     "--batch", "2", "--out", out, "--eval-every", "0", NULL};
    cr_assert_eq(wait_for(spawn(train, NULL, NULL), 120), 0, "toy train failed");
    char latest[80];
    snprintf(latest, sizeof latest, "%s/weights/latest", out);
    char *quant[] = {(char *)toy_bin(), "quantize", latest, q8, "q8_0", NULL};
    cr_assert_eq(wait_for(spawn(quant, NULL, NULL), 60), 0, "toy quantize failed");
    struct server s;
    const char *extra[] = {"--parallel", "16", NULL};
    server_start_model(&s, q8, extra);
    /* a toy-trained BPE model has a BOS it does not add: "" starts from it, as toy generate -p "" does */
    struct resp e = http(&s, "POST", "/v1/completions", "{\"prompt\":\"\",\"max_tokens\":2}");
    cr_expect_eq(e.code, 200, "%s", e.body);
    cr_expect_eq(jint(e.json, "usage.prompt_tokens"), 1, "%s", e.body);
    resp_free(&e);
    enum { N = 16 };
    char bodies[N][256];
    for (int i = 0; i < N; i++)
        snprintf(bodies[i], sizeof bodies[i],
                 "{\"prompt\":[1,%d,%d,%d],\"max_tokens\":64,\"temperature\":%s,\"seed\":%d,\"ignore_eos\":true}",
                 10 + i, 20 + i % 3, 30 + i % 5, i % 2 ? "0.8" : "0", i);
    int same = together_as_alone(&s, bodies, N);
    cr_assert_eq(same, N, "%d of %d requests got the tokens they get alone", same, N);
    long long n_rows, n_steps;
    decode_counts(&s, &n_rows, &n_steps);
    cr_assert_gt(n_rows, n_steps, "decode steps were shared");
    cr_assert_eq(server_stop(&s), 0);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}

/* A mixture of experts (Q8_0 experts on the int8 kernels) serves: requests
 * batched together get the tokens they get alone, so a token's experts do
 * not depend on the others in its decode step. set() shapes the tiny model. */
static void batch_matches_alone(void (*set)(struct toy_llama_config *c)) {
    char dir[] = "/tmp/toy-serve-test-XXXXXX", path[80];
    cr_assert(mkdtemp(dir));
    struct toy_tokenizer *tok;
    cr_assert_eq(toy_tokenizer_load(train_tiny(dir, "llama"), &tok), TOY_OK, "%s", toy_last_error());
    struct toy_llama_config c = toy_llama_preset("tiny");
    c.vocab = toy_tokenizer_n_vocab(tok);
    c.max_ctx = 256;
    /* wide enough that a request's 200 tokens outlast starting the next ones' clients, even on 2 loaded cores:
     * at d_model 64 they were done in ~10 ms, and under CI's parallel tests no decode step was shared */
    c.d_model = 256;
    set(&c);
    struct toy_llama *m = toy_llama_new(&c, 3);
    cr_assert(m, "%s", toy_last_error());
    for (int i = 0; i < toy_llama_n_tensors(m); i++) { /* sharper than the 0.02 init: tokens that differ */
        struct toy_tensor *t = toy_llama_tensor(m, i);
        for (int64_t k = 0; t->ne[1] > 1 && k < toy_nelements(t); k++) ((float *)t->data)[k] *= 6.0f;
    }
    snprintf(path, sizeof path, "%s/moe.gguf", dir);
    th_save_llama_tok(m, tok, TOY_Q8_0, path);
    toy_llama_free(m);
    toy_tokenizer_free(tok);
    struct server s;
    const char *extra[] = {"--parallel", "4", NULL};
    server_start_model(&s, path, extra);
    enum { N = 4 };
    char bodies[N][256];
    for (int i = 0; i < N; i++)
        snprintf(bodies[i], sizeof bodies[i],
                 "{\"prompt\":[%d,%d,%d],\"max_tokens\":200,\"temperature\":%s,\"seed\":%d,\"ignore_eos\":true}", 5 + i,
                 9 + 2 * i, 3 + i, i % 2 ? "0.8" : "0", i);
    /* the clients start one by one, so on loaded cores a request may be done before the next arrives: up to
     * three tries to see decode steps shared (the alone runs add as many rows as steps) */
    long long n_rows = 0, n_steps = 0;
    for (int attempt = 0; attempt < 3 && n_rows <= n_steps; attempt++) {
        int same = together_as_alone(&s, bodies, N);
        cr_expect_eq(same, N, "%d of %d requests got the tokens they get alone", same, N);
        decode_counts(&s, &n_rows, &n_steps);
    }
    cr_expect_gt(n_rows, n_steps, "no decode step was shared in three tries");
    cr_assert_eq(server_stop(&s), 0);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}

static void qwen3moe(struct toy_llama_config *c) {
    snprintf(c->arch, sizeof c->arch, "qwen3moe");
    c->rope_mode = TOY_ROPE_NEOX;
    c->qk_norm = true;
    c->n_experts = 8, c->n_experts_used = 2, c->d_ff_expert = 64, c->moe_norm = true;
}

Test(serve, mixture_of_experts_batch_matches_alone, .timeout = 180) { batch_matches_alone(qwen3moe); }

/* DeepSeek-V2's: latent attention, whose one cached latent a position is the keys and the values (each
 * sequence's own cache), a dense first layer, then experts with shared ones */
static void deepseek2(struct toy_llama_config *c) {
    snprintf(c->arch, sizeof c->arch, "deepseek2");
    c->n_kv_heads = 1, c->kv_lora_rank = 32, c->rope_dim = 8, c->head_dim = 24, c->head_dim_v = 16;
    c->n_layers = 3, c->n_dense_lead = 1;
    c->n_experts = 8, c->n_experts_used = 2, c->d_ff_expert = 64, c->d_ff_shared = 64, c->shared_ungated = true;
}

Test(serve, latent_attention_batch_matches_alone, .timeout = 180) { batch_matches_alone(deepseek2); }

/* ---- split replies: reasoning, content and tool calls ----------------------------------------------- */

/* a server on a scripted model (harness.h) written into dir (27 bytes or more), and its end */
static void scripted_start(struct server *s, const struct th_script_model *sm, char *dir) {
    char path[80];
    strcpy(dir, "/tmp/toy-serve-test-XXXXXX");
    cr_assert(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/scripted.gguf", dir);
    th_script_model_write(sm, path);
    server_start_model(s, path, NULL);
}

static void scripted_stop(struct server *s, const char *dir) {
    cr_assert_eq(server_stop(s), 0);
    server_clean(s);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}

/* A tokenizer that adds EOS (Qwen3-Embedding's) gets it at the end of an embedding's text input, which
 * last-token pooling then reads: the same vector as the ids with the EOS written out */
Test(serve, embedding_text_gets_the_eos_its_tokenizer_adds, .timeout = 60) {
    static const char *const script[] = {"Hello", NULL};
    struct th_script_model sm = {"{{ messages[0].content }}", {script}, "<|eos|>", true};
    char dir[32];
    struct server s;
    scripted_start(&s, &sm, dir);
    struct resp r = http(&s, "POST", "/v1/embeddings", "{\"input\":\"ab\",\"normalize\":false}");
    cr_assert_eq(r.code, 200, "%s", r.body);
    cr_expect_eq(jint(r.json, "usage.prompt_tokens"), 3, "a, b and the EOS: %s", r.body);
    resp_free(&r);
    scripted_stop(&s, dir);
}

/* "suffix": a vocabulary with fill-in-the-middle tokens gets the prompt [prefix] prompt [suffix] suffix [middle],
 * and the completion is the middle (the scripted model writes "filled" after <|fim_middle|>); a vocabulary without
 * them, and echo with a suffix, are 400s */
Test(serve, suffix_fills_in_the_middle, .timeout = 60) {
    static const char *const script[] = {"<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "filled", NULL};
    struct th_script_model sm = {"{{ messages[0].content }}", {script}, "<|eos|>", false};
    char dir[32];
    struct server s;
    scripted_start(&s, &sm, dir);
    struct resp r = http(&s, "POST", "/v1/completions",
                         "{\"prompt\":\"def f(\",\"suffix\":\")\\n\",\"max_tokens\":4,\"temperature\":0}");
    cr_assert_eq(r.code, 200, "%s", r.body);
    cr_assert_str_eq(jstr(r.json, "choices.0.text"), "filled", "%s", r.body);
    cr_assert_eq(jint(r.json, "usage.prompt_tokens"), 6 + 2 + 3, "the prompt's bytes, the suffix's, 3 markers: %s",
                 r.body);
    resp_free(&r);
    r = http(&s, "POST", "/v1/completions", "{\"prompt\":\"def f(\",\"max_tokens\":4,\"temperature\":0}");
    cr_assert_eq(r.code, 200, "%s", r.body);
    cr_assert_str_neq(jstr(r.json, "choices.0.text"), "filled", "without a suffix, no middle: %s", r.body);
    resp_free(&r);
    r = http(&s, "POST", "/v1/completions", "{\"prompt\":\"def f(\",\"suffix\":\")\",\"echo\":true}");
    cr_assert_eq(r.code, 400, "%s", r.body);
    cr_assert_str_eq(jstr(r.json, "error.param"), "echo", "%s", r.body);
    resp_free(&r);
    scripted_stop(&s, dir);
    server_start(&s, NULL);
    r = http(&s, "POST", "/v1/completions", "{\"prompt\":\"def f(\",\"suffix\":\")\"}");
    cr_assert_eq(r.code, 400, "%s", r.body);
    cr_assert_str_eq(jstr(r.json, "error.param"), "suffix", "%s", r.body);
    resp_free(&r);
    cr_assert_eq(server_stop(&s), 0);
}

static const char tools_json[] =
    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"city\":{\"type\":\"string\"}}}}}]";

/* a stream's split deltas put together */
struct split {
    char reasoning[1024], content[1024], names[256], args[1024], finish[32];
    int n_calls, n_chunks;
};

static void split_stream(const char *body, struct split *out) {
    memset(out, 0, sizeof *out);
    const char *p = body;
    while ((p = strstr(p, "data: "))) {
        p += 6;
        const char *e = strstr(p, "\n\n");
        cr_assert(e);
        if (!strncmp(p, "[DONE]", 6)) break;
        json_t *c = json_loadb(p, (size_t)(e - p), 0, NULL), *ch = json_array_get(json_object_get(c, "choices"), 0);
        cr_assert(c, "chunk is not JSON: %.*s", (int)(e - p), p);
        out->n_chunks++;
        const char *r = jstr(ch, "delta.reasoning_content"), *t = jstr(ch, "delta.content");
        if (r) strncat(out->reasoning, r, sizeof out->reasoning - strlen(out->reasoning) - 1);
        if (t) strncat(out->content, t, sizeof out->content - strlen(out->content) - 1);
        json_t *calls = jget(ch, "delta.tool_calls");
        for (size_t k = 0; k < json_array_size(calls); k++) {
            json_t *call = json_array_get(calls, k);
            json_int_t index = json_integer_value(json_object_get(call, "index"));
            if (jstr(call, "id")) { /* a call begins: its id, type and name, then its arguments piece by piece */
                cr_assert_eq(index, out->n_calls, "tool call indices in order");
                cr_assert_str_eq(jstr(call, "type"), "function");
                strncat(out->names, jstr(call, "function.name"), sizeof out->names - strlen(out->names) - 2);
                strcat(out->names, ";");
                out->n_calls++;
            } else {
                cr_assert_eq(index, out->n_calls - 1, "more of the call begun last");
                cr_assert(!jget(call, "function.name"), "a call's name comes once");
            }
            const char *a = jstr(call, "function.arguments");
            cr_assert(a, "each piece has arguments");
            strncat(out->args, a, sizeof out->args - strlen(out->args) - 1);
        }
        if (jstr(ch, "finish_reason")) snprintf(out->finish, sizeof out->finish, "%s", jstr(ch, "finish_reason"));
        json_decref(c);
        p = e;
    }
}

/* What a stream sends of the calls as a reply grows token by token (here byte by byte, in every family): each
 * call begun once (its name), its arguments in several pieces as the model writes them, which add up to the
 * whole reply's arguments, and ended once: a call closed before the reply ends is ended then. */
Test(serve, streamed_calls_send_their_arguments_as_they_are_written) {
    static const char *const names[] = {"get_weather", "get_time"};
#define SYN(f, ...) {.format = TOY_CHAT_FORMAT_##f, .tools = true, .tool_names = names, .n_tool_names = 2, __VA_ARGS__}
#define DS(x) "<\xef\xbd\x9c" x "\xef\xbd\x9c>"
#define U "\xe2\x96\x81"
    static const struct {
        struct toy_chat_syntax syn;
        const char *text;
        size_t n_calls, closed_at; /* the first call's end: where its closing marker ends (0: the reply's) */
    } cases[] = {
        {SYN(HERMES, .think = true), "<think>hm</think>Sure.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
         "{\"city\": \"Paris\", \"days\": [1, 2]}}\n</tool_call><tool_call>{\"name\": \"get_time\", \"arguments\": "
         "{\"tz\": \"CET\"}}</tool_call>", 2, 0},
        {SYN(LLAMA3), "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}; "
         "{\"name\": \"get_time\", \"parameters\": {}}", 2, 0},
        {SYN(MISTRAL), "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Bern\"}[TOOL_CALLS]get_time[ARGS]{\"tz\": \"UTC\"}",
         2, 0},
        {SYN(DEEPSEEK), DS("tool" U "calls" U "begin") DS("tool" U "call" U "begin") "get_weather" DS("tool" U "sep")
         "{\"city\": \"Kyiv\"}" DS("tool" U "call" U "end") DS("tool" U "calls" U "end"), 1, 0},
        {SYN(HARMONY), "<|channel|>analysis<|message|>Need it.<|end|><|start|>assistant<|channel|>commentary "
         "to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Tokyo\"}<|call|>", 1, 0},
    };
#undef SYN
#undef DS
#undef U
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const char *t = cases[c].text;
        size_t n = strlen(t);
        struct srv_sent sent = {0};
        char args[4][256] = {{0}}, name[4][32] = {{0}};
        int begun[4] = {0}, ended[4] = {0}, pieces[4] = {0};
        for (size_t k = 1; k <= n; k++) {
            bool final = k == n;
            struct toy_chat_reply p;
            cr_assert_eq(toy_chat_reply_parse(&cases[c].syn, t, k, !final, &p), TOY_OK);
            struct srv_call_step st[8];
            cr_assert_leq(p.n_calls, 4);
            size_t ns = toy_srv_call_steps(&p, &sent, final, st);
            for (size_t i = 0; i < ns; i++) {
                size_t q = st[i].k;
                cr_assert(st[i].c && q < 4, "case %zu at %zu", c, k);
                cr_assert(!ended[q], "case %zu at %zu: call %zu after its end", c, k, q);
                if (st[i].begin) begun[q]++, snprintf(name[q], sizeof name[q], "%s", st[i].c->name);
                cr_assert(begun[q], "case %zu: call %zu's arguments before its start", c, q);
                if (st[i].n) pieces[q]++, strncat(args[q], st[i].delta, st[i].n);
                if (st[i].end) ended[q]++;
            }
            if (final) {
                cr_assert_eq(p.n_calls, cases[c].n_calls, "case %zu", c);
                for (size_t q = 0; q < p.n_calls; q++) {
                    cr_expect_eq(begun[q], 1, "case %zu call %zu", c, q);
                    cr_expect_eq(ended[q], 1, "case %zu call %zu", c, q);
                    cr_expect_str_eq(name[q], p.calls[q].name, "case %zu call %zu", c, q);
                    cr_expect_str_eq(args[q], p.calls[q].arguments, "case %zu call %zu", c, q);
                    cr_expect_gt(pieces[q], 1, "case %zu call %zu: its arguments in pieces", c, q);
                }
            } else if (p.n_calls > 1) {
                cr_expect_eq(ended[0], 1, "case %zu at %zu: the first call ended when the next began", c, k);
            }
            toy_chat_reply_free(&p);
        }
    }
}

/* Qwen-style: <think> reasoning, then content and a <tool_call>: split in the answer and, delta by delta,
 * in the stream; without tools the call is content as written */
/* A Qwen-like reply: reasoning, content and a call; and a template of that family that writes each message's
 * role, calls and call id before its content (the prompt ends with the last message's content, whose last token
 * starts the script) */
static const char *const qwen_script[] = {"<think>", "\nThe user wants Paris weather.", "\n</think>\n\n",
                                          "Let me check.", "\n", "<tool_call>",
                                          "\n{\"name\": \"get_weather\", ", "\"arguments\": {\"city\": \"Pa",
                                          "ris\"}}\n", "</tool_call>", NULL};
static const char qwen_echo_template[] =
    "{# a Qwen-like family: <tool_call> and <think> #}{% for m in messages %}[{{ m.role }}{% for c in m.tool_calls "
    "or [] %}|{{ c.id }} {{ c.function.name }}{{ c.function.arguments }}{% endfor %}{{ m.tool_call_id or '' }}:"
    "{{ m.content }}{% endfor %}";

Test(serve, qwen_style_replies_split_into_reasoning_content_and_tool_calls, .timeout = 120) {
    struct th_script_model sm = {"{# a Qwen-like family: <tool_call> and <think> #}{% for m in messages %}"
                                 "{{ m.content }}{% endfor %}",
                                 {qwen_script}, "<|eos|>", false};
    char dir[32];
    struct server s;
    scripted_start(&s, &sm, dir);
    char body[1024];
    snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"<|go1|>\"}],\"temperature\":0,%s}",
             tools_json);
    struct resp r = http(&s, "POST", "/v1/chat/completions", body);
    cr_assert_eq(r.code, 200, "%s", r.body);
    cr_expect_str_eq(jstr(r.json, "choices.0.message.reasoning_content"), "The user wants Paris weather.");
    cr_expect_str_eq(jstr(r.json, "choices.0.message.content"), "Let me check.");
    cr_expect_str_eq(jstr(r.json, "choices.0.message.tool_calls.0.function.name"), "get_weather");
    cr_expect_str_eq(jstr(r.json, "choices.0.message.tool_calls.0.function.arguments"), "{\"city\":\"Paris\"}");
    cr_expect_str_eq(jstr(r.json, "choices.0.message.tool_calls.0.type"), "function");
    cr_expect_str_eq(jstr(r.json, "choices.0.finish_reason"), "tool_calls");
    cr_expect_eq(jint(r.json, "usage.completion_tokens"), 11, "the script and EOS");
    resp_free(&r);

    snprintf(body, sizeof body,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"<|go1|>\"}],\"temperature\":0,\"stream\":true,%s}",
             tools_json);
    r = http(&s, "POST", "/v1/chat/completions", body);
    cr_assert_eq(r.code, 200, "%s", r.body);
    struct split sp;
    split_stream(r.body, &sp);
    cr_expect_str_eq(sp.reasoning, "The user wants Paris weather.");
    cr_expect_str_eq(sp.content, "Let me check.");
    cr_expect_str_eq(sp.names, "get_weather;");
    cr_expect_str_eq(sp.args, "{\"city\":\"Paris\"}");
    cr_expect_str_eq(sp.finish, "tool_calls");
    resp_free(&r);

    /* offered no tools (or told "none"), the model's call is text; the reasoning is still apart */
    for (int k = 0; k < 2; k++) {
        snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"<|go1|>\"}],\"temperature\":0%s%s}",
                 k ? ",\"tool_choice\":\"none\"," : "", k ? tools_json : "");
        r = http(&s, "POST", "/v1/chat/completions", body);
        cr_assert_eq(r.code, 200, "%s", r.body);
        cr_expect_str_eq(jstr(r.json, "choices.0.message.reasoning_content"), "The user wants Paris weather.");
        cr_expect_str_eq(jstr(r.json, "choices.0.message.content"),
                         "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}"
                         "\n</tool_call>");
        cr_expect_null(jget(r.json, "choices.0.message.tool_calls"));
        cr_expect_str_eq(jstr(r.json, "choices.0.finish_reason"), "stop");
        resp_free(&r);
    }
    /* a tool_choice toy does not know is refused, not ignored */
    snprintf(body, sizeof body,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"tool_choice\":\"sometimes\",%s}", tools_json);
    r = http(&s, "POST", "/v1/chat/completions", body);
    cr_expect_eq(r.code, 400, "%s", r.body);
    cr_expect_str_eq(jstr(r.json, "error.param"), "tool_choice");
    resp_free(&r);
    scripted_stop(&s, dir);
}

/* gpt-oss's channels (special tokens): the analysis is reasoning, <|end|> ends a message and not the reply, the
 * final channel is content, and a commentary message to=functions.NAME is a call that <|call|> ends */
/* A stream of named events ("event: TYPE", then "data: JSON" whose type is TYPE), as an array of the objects */
static json_t *sse_events(const char *body) {
    json_t *out = json_array();
    for (const char *p = body; (p = strstr(p, "event: "));) {
        const char *nl = strchr(p, '\n'), *d = strstr(p, "data: "), *e = d ? strstr(d, "\n\n") : NULL;
        cr_assert(nl && d == nl + 1 && e, "not an event: %s", p);
        json_t *o = json_loadb(d + 6, (size_t)(e - d - 6), 0, NULL);
        cr_assert(o, "data is not JSON: %.*s", (int)(e - d), d);
        const char *type = jstr(o, "type");
        cr_assert(type && (size_t)(nl - p - 7) == strlen(type) && !strncmp(p + 7, type, strlen(type)),
                  "the event's name is not its type: %.*s", (int)(e - p), p);
        json_array_append_new(out, o);
        p = e;
    }
    return out;
}

/* event i is a delta of the same type as the one before it */
static bool same_delta(json_t *events, size_t i) {
    const char *t = jstr(json_array_get(events, i), "type");
    size_t n = strlen(t);
    return i > 0 && n > 5 && !strcmp(t + n - 5, "delta") && !strcmp(t, jstr(json_array_get(events, i - 1), "type"));
}

/* OpenAI's Responses API on the chat path: a reasoning item, the message and a function_call, whole and as the
 * event stream (created, in_progress, each item added / its deltas / done, completed), which ends with the same
 * output; input items (messages with parts, a call and its output) become the chat the template sees; what toy
 * cannot do (item references, hosted tools) is refused, naming the Responses parameter */
Test(serve, responses_api_whole_and_streamed, .timeout = 120) {
    struct th_script_model sm = {qwen_echo_template, {qwen_script}, "<|eos|>", false};
    char dir[32];
    struct server s;
    scripted_start(&s, &sm, dir);
    const char *tools = "\"tools\":[{\"type\":\"function\",\"name\":\"get_weather\",\"parameters\":{\"type\":"
                        "\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}}]";
    char body[2048];
    snprintf(body, sizeof body, "{\"input\":\"<|go1|>\",\"instructions\":\"Be brief.\",\"temperature\":0,%s}", tools);
    struct resp r = http(&s, "POST", "/v1/responses", body);
    cr_assert_eq(r.code, 200, "%s", r.body);
    cr_expect_str_eq(jstr(r.json, "object"), "response");
    cr_expect_str_eq(jstr(r.json, "status"), "completed");
    cr_expect_str_eq(jstr(r.json, "instructions"), "Be brief.");
    cr_expect_str_eq(jstr(r.json, "output.0.type"), "reasoning");
    cr_expect_str_eq(jstr(r.json, "output.0.content.0.text"), "The user wants Paris weather.");
    cr_expect_str_eq(jstr(r.json, "output.1.type"), "message");
    cr_expect_str_eq(jstr(r.json, "output.1.content.0.type"), "output_text");
    cr_expect_str_eq(jstr(r.json, "output.1.content.0.text"), "Let me check.");
    cr_expect_str_eq(jstr(r.json, "output.2.type"), "function_call");
    cr_expect_str_eq(jstr(r.json, "output.2.name"), "get_weather");
    cr_expect_str_eq(jstr(r.json, "output.2.arguments"), "{\"city\":\"Paris\"}");
    cr_expect(jstr(r.json, "output.2.call_id") && !strncmp(jstr(r.json, "output.2.call_id"), "call_", 5));
    cr_expect_eq(jint(r.json, "usage.output_tokens"), 11);
    cr_expect_eq(jint(r.json, "usage.total_tokens"), jint(r.json, "usage.input_tokens") + 11, "%s", r.body);
    char *whole = json_dumps(json_object_get(r.json, "output"), JSON_COMPACT);
    resp_free(&r);

    snprintf(body, sizeof body, "{\"input\":\"<|go1|>\",\"instructions\":\"Be brief.\",\"temperature\":0,"
             "\"stream\":true,%s}", tools);
    r = http(&s, "POST", "/v1/responses", body);
    cr_assert_eq(r.code, 200, "%s", r.body);
    char types[2048] = "", reasoning[256] = "", text[256] = "";
    json_t *done = NULL;
    int seq = 0;
    json_t *events = sse_events(r.body);
    for (size_t i = 0; i < json_array_size(events); i++) {
        json_t *o = json_array_get(events, i);
        const char *type = jstr(o, "type");
        cr_expect_eq(jint(o, "sequence_number"), seq++, "%s", type);
        if (!same_delta(events, i)) /* how many deltas a stream takes depends on the timing: one stands for all */
            snprintf(types + strlen(types), sizeof types - strlen(types), "%s,", type + strlen("response."));
        if (!strcmp(type, "response.reasoning_text.delta")) strncat(reasoning, jstr(o, "delta"), 100);
        if (!strcmp(type, "response.output_text.delta")) strncat(text, jstr(o, "delta"), 100);
        if (!strcmp(type, "response.completed")) done = json_incref(json_object_get(o, "response"));
    }
    json_decref(events);
    cr_expect_str_eq(types, "created,in_progress,output_item.added,content_part.added,reasoning_text.delta,"
                            "reasoning_text.done,content_part.done,output_item.done,output_item.added,"
                            "content_part.added,output_text.delta,output_text.done,content_part.done,output_item.done,"
                            "output_item.added,function_call_arguments.delta,function_call_arguments.done,"
                            "output_item.done,completed,");
    cr_expect_str_eq(reasoning, "The user wants Paris weather.");
    cr_expect_str_eq(text, "Let me check.");
    cr_assert(done, "no response.completed");
    json_t *out = json_object_get(done, "output"), *want = json_loads(whole, 0, NULL);
    cr_expect_eq(json_array_size(out), 3);
    for (size_t k = 0; k < 3; k++) { /* as the whole response's, but for the ids (another response's) */
        json_t *a = json_deep_copy(json_array_get(out, k)), *b = json_deep_copy(json_array_get(want, k));
        const char *keys[] = {"id", "call_id"};
        for (int i = 0; i < 2; i++) json_object_del(a, keys[i]), json_object_del(b, keys[i]);
        cr_expect(json_equal(a, b), "item %zu differs", k);
        json_decref(a), json_decref(b);
    }
    json_decref(want), json_decref(done), free(whole);
    resp_free(&r);

    /* input items: a message with parts, the call made and its output reach the template as the chat messages
     * written out do (the same prompt: the same count of tokens) */
    snprintf(body, sizeof body, "{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_text\",\"text\":\"a\"},"
             "{\"type\":\"input_text\",\"text\":\"b\"}]},{\"type\":\"function_call\",\"call_id\":\"c1\",\"name\":"
             "\"get_weather\",\"arguments\":\"{\\\"city\\\": \\\"Oslo\\\"}\"},{\"type\":\"function_call_output\","
             "\"call_id\":\"c1\",\"output\":\"sunny\"},{\"type\":\"message\",\"role\":\"user\",\"content\":\"<|go1|>\"}],"
             "\"max_output_tokens\":1,%s}", tools);
    r = http(&s, "POST", "/v1/responses", body);
    cr_expect_eq(r.code, 200, "%s", r.body);
    cr_expect_str_eq(jstr(r.json, "status"), "incomplete");
    cr_expect_str_eq(jstr(r.json, "incomplete_details.reason"), "max_output_tokens");
    long long input_tokens = jint(r.json, "usage.input_tokens");
    resp_free(&r);
    snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"ab\"},{\"role\":\"assistant\","
             "\"content\":null,\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":"
             "\"get_weather\",\"arguments\":\"{\\\"city\\\": \\\"Oslo\\\"}\"}}]},{\"role\":\"tool\",\"tool_call_id\":"
             "\"c1\",\"content\":\"sunny\"},{\"role\":\"user\",\"content\":\"<|go1|>\"}],\"max_tokens\":1}");
    r = http(&s, "POST", "/v1/chat/completions", body);
    cr_expect_eq(r.code, 200, "%s", r.body);
    cr_expect_eq(jint(r.json, "usage.prompt_tokens"), input_tokens, "%s", r.body);
    cr_expect_gt(input_tokens, 30);
    resp_free(&r);
    const char *bad[][2] = {
        {"{\"input\":\"x\",\"previous_response_id\":\"resp_1\"}", "previous_response_id"},
        {"{\"input\":\"x\",\"tools\":[{\"type\":\"web_search\"}]}", "tools"},
        {"{\"input\":[{\"type\":\"item_reference\",\"id\":\"msg_1\"}]}", "input"},
        {"{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_image\",\"image_url\":\"x\"}]}]}", "input"},
        {"{\"instructions\":\"x\"}", "input"},
        {"{\"input\":\"x\",\"max_output_tokens\":-1}", "max_output_tokens"},
        {"{\"input\":\"x\",\"text\":{\"format\":{\"type\":\"json_schema\",\"name\":\"r\",\"schema\":{\"type\":\"string\","
         "\"pattern\":\"a\"}}}}", "text.format"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        r = http(&s, "POST", "/v1/responses", bad[i][0]);
        cr_expect_eq(r.code, 400, "case %zu: %s", i, r.body);
        cr_expect_str_eq(jstr(r.json, "error.param"), bad[i][1], "case %zu: %s", i, r.body);
        resp_free(&r);
    }
    r = http(&s, "POST", "/v1/responses", "{\"input\":\"x\",\"max_output_tokens\":-1}");
    cr_expect(strstr(r.body, "'max_output_tokens'"), "%s", r.body);
    resp_free(&r);
    scripted_stop(&s, dir);
}

/* Responses are kept: a request continues one by previous_response_id (its reasoning, message and call reach
 * the template as the chat written out does: the same prompt), streamed or whole; GET returns a kept response,
 * DELETE drops it; "store": false keeps nothing; the newest --responses N are kept, and --responses 0 keeps none */
/* the number of <id>.json files in folder d, and whether <id>.json is one of them */
static int json_files(const char *d, const char *id, bool *has) {
    char cmd[400];
    snprintf(cmd, sizeof cmd, "ls '%s' | grep -c '\\.json$'", d);
    FILE *p = popen(cmd, "r");
    int n = -1;
    cr_assert(p && fscanf(p, "%d", &n) == 1);
    pclose(p);
    if (id) {
        snprintf(cmd, sizeof cmd, "%s/%s.json", d, id);
        *has = access(cmd, F_OK) == 0;
    }
    return n;
}

/* With --responses-dir the kept responses are files, and a server started again on the folder keeps them: GET
 * gives the same object, previous_response_id the same prompt. A file that is not a stored response is skipped
 * and left; DELETE and eviction (the least recently used first, the next server's order too) remove files; a second
 * server on the folder is refused while the first runs. */
Test(serve, responses_outlive_a_restart_with_a_folder, .timeout = 120) {
    static const char *const script[] = {"Hello there", NULL};
    struct th_script_model sm = {"{% for m in messages %}{{ m.content }}{% endfor %}", {script}, "<|eos|>", false};
    char dir[32], rdir[64], path[300], body[600];
    strcpy(dir, "/tmp/toy-serve-test-XXXXXX");
    cr_assert(mkdtemp(dir));
    char gguf[80];
    snprintf(gguf, sizeof gguf, "%s/scripted.gguf", dir);
    th_script_model_write(&sm, gguf);
    snprintf(rdir, sizeof rdir, "%s/kept", dir);
    const char *extra[] = {"--responses-dir", rdir, "--responses", "3", NULL};
    struct server s;
    server_start_model(&s, gguf, extra);
    struct resp r[3];
    for (int i = 0; i < 3; i++) {
        if (i) snprintf(body, sizeof body, "{\"input\":\"more %d\",\"previous_response_id\":\"%s\",\"temperature\":0}", i,
                        jstr(r[i - 1].json, "id"));
        else snprintf(body, sizeof body, "{\"input\":\"first\",\"temperature\":0}");
        r[i] = http(&s, "POST", "/v1/responses", body);
        cr_assert_eq(r[i].code, 200, "%s", r[i].body);
        bool has = false;
        cr_assert_eq(json_files(rdir, jstr(r[i].json, "id"), &has), i + 1);
        cr_assert(has);
    }
    /* one server per folder */
    char log2[300];
    snprintf(log2, sizeof log2, "%s/second.log", dir);
    char *argv2[] = {(char *)toy_bin(), "serve", "-m", gguf, "--port", "0", "--no-events", "--responses-dir", rdir, NULL};
    cr_assert_neq(wait_for(spawn(argv2, NULL, log2), 30), 0);
    char *l2 = slurp(log2);
    cr_assert(l2 && strstr(l2, "another server"), "%s", l2 ? l2 : "");
    free(l2);
    /* the prompt a continuation of the last gets, before the restart */
    snprintf(body, sizeof body, "{\"input\":\"again\",\"previous_response_id\":\"%s\",\"max_output_tokens\":1,"
             "\"store\":false}", jstr(r[2].json, "id"));
    struct resp before = http(&s, "POST", "/v1/responses", body);
    cr_assert_eq(before.code, 200, "%s", before.body);
    snprintf(path, sizeof path, "/v1/responses/%s", jstr(r[0].json, "id"));
    struct resp g = http(&s, "GET", path, NULL); /* r0 used last, then r2 (by `before`), then r1 */
    cr_assert_eq(g.code, 200, "%s", g.body);
    resp_free(&g);
    cr_assert_eq(server_stop(&s), 0);
    /* not ours: skipped, left */
    snprintf(path, sizeof path, "%s/resp_junk.json", rdir);
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fputs("{\"object\":\"toy.stored_response\",", f);
    fclose(f);

    /* room for two: the two most recently used, r0 and r2; r1 stays on disk */
    const char *extra2[] = {"--responses-dir", rdir, "--responses", "2", NULL};
    server_start_model(&s, gguf, extra2);
    struct resp after = http(&s, "POST", "/v1/responses", body);
    cr_assert_eq(after.code, 200, "%s", after.body);
    cr_assert_eq(jint(after.json, "usage.input_tokens"), jint(before.json, "usage.input_tokens"));
    cr_assert_gt(jint(after.json, "usage.input_tokens"), 10);
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "/v1/responses/%s", jstr(r[i].json, "id"));
        g = http(&s, "GET", path, NULL);
        cr_assert_eq(g.code, i == 1 ? 404 : 200, "%d: %s", i, g.body);
        if (i != 1) cr_assert(json_equal(g.json, r[i].json), "%s\nvs\n%s", g.body, r[i].body);
        resp_free(&g);
    }
    snprintf(path, sizeof path, "/v1/responses/%s/input_items", jstr(r[2].json, "id"));
    struct resp li = http(&s, "GET", path, NULL);
    cr_assert_eq(li.code, 200, "%s", li.body);
    cr_assert_str_eq(jstr(li.json, "data.0.content.0.text"), "more 2", "%s", li.body);
    resp_free(&li);
    char *log = slurp(s.log);
    cr_assert(log && strstr(log, "resp_junk.json is skipped") &&
              strstr(log, "2 responses kept from") && strstr(log, "1 skipped, 1 older ones left there unread"),
              "%s", log ? log : "");
    free(log);
    /* DELETE removes the file */
    snprintf(path, sizeof path, "/v1/responses/%s", jstr(r[0].json, "id"));
    struct resp d = http(&s, "DELETE", path, NULL);
    cr_assert_eq(d.code, 200, "%s", d.body);
    resp_free(&d);
    bool has = true;
    cr_assert_eq(json_files(rdir, jstr(r[0].json, "id"), &has), 3); /* r1, r2 and the junk */
    cr_assert(!has);
    /* a full store drops its least recently used, r2, and its file; r1, never read, stays */
    struct resp x[2];
    for (int i = 0; i < 2; i++) {
        x[i] = http(&s, "POST", "/v1/responses", "{\"input\":\"x\",\"max_output_tokens\":1}");
        cr_assert_eq(x[i].code, 200, "%s", x[i].body);
    }
    cr_assert_eq(json_files(rdir, jstr(r[2].json, "id"), &has), 4);
    cr_assert(!has);
    cr_assert_eq(json_files(rdir, jstr(r[1].json, "id"), &has), 4);
    cr_assert(has);
    cr_assert_eq(json_files(rdir, "resp_junk", &has), 4);
    cr_assert(has);
    for (int i = 0; i < 2; i++) resp_free(&x[i]);
    /* a file that cannot be written (the folder gone): the response is still answered, and kept in memory */
    snprintf(path, sizeof path, "mv '%s' '%s.moved' && touch '%s'", rdir, rdir, rdir);
    cr_assert_eq(system(path), 0);
    x[0] = http(&s, "POST", "/v1/responses", "{\"input\":\"x\",\"max_output_tokens\":1}");
    cr_assert_eq(x[0].code, 200, "%s", x[0].body);
    snprintf(path, sizeof path, "/v1/responses/%s", jstr(x[0].json, "id"));
    g = http(&s, "GET", path, NULL);
    cr_assert_eq(g.code, 200, "%s", g.body);
    resp_free(&g), resp_free(&x[0]);
    log = slurp(s.log);
    cr_assert(log && strstr(log, "is kept in memory only") && strstr(log, "kept/resp_"), "%s", log ? log : "");
    free(log);
    for (int i = 0; i < 3; i++) resp_free(&r[i]);
    resp_free(&before), resp_free(&after);
    cr_assert_eq(server_stop(&s), 0);
    snprintf(path, sizeof path, "rm -f '%s' && mv '%s.moved' '%s'", rdir, rdir, rdir);
    cr_assert_eq(system(path), 0);
    /* a folder and no store */
    char *argv0[] = {(char *)toy_bin(), "serve", "-m", gguf, "--port", "0", "--no-events", "--responses", "0",
                     "--responses-dir", rdir, NULL};
    cr_assert_neq(wait_for(spawn(argv0, NULL, log2), 30), 0);
    snprintf(path, sizeof path, "rm -rf '%s'", dir);
    cr_assert_eq(system(path), 0);
}

Test(serve, responses_kept_for_previous_response_id, .timeout = 120) {
    struct th_script_model sm = {qwen_echo_template, {qwen_script}, "<|eos|>", false};
    char dir[32], body[4096], path[300];
    struct server s;
    scripted_start(&s, &sm, dir);
    const char *tools = "\"tools\":[{\"type\":\"function\",\"name\":\"get_weather\",\"parameters\":{\"type\":"
                        "\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}}]";
    snprintf(body, sizeof body, "{\"input\":\"<|go1|>\",\"temperature\":0,%s}", tools);
    struct resp a = http(&s, "POST", "/v1/responses", body);
    cr_assert_eq(a.code, 200, "%s", a.body);
    cr_assert(json_is_true(jget(a.json, "store")));
    cr_assert_str_eq(jstr(a.json, "output.2.type"), "function_call");
    const char *aid = jstr(a.json, "id"), *call = jstr(a.json, "output.2.call_id");
    /* the call's output, after the kept response: the prompt of the chat written out */
    snprintf(body, sizeof body, "{\"previous_response_id\":\"%s\",\"input\":[{\"type\":\"function_call_output\","
             "\"call_id\":\"%s\",\"output\":\"sunny\"}],\"max_output_tokens\":1,%s}", aid, call, tools);
    struct resp b = http(&s, "POST", "/v1/responses", body);
    cr_assert_eq(b.code, 200, "%s", b.body);
    cr_assert_str_eq(jstr(b.json, "previous_response_id"), aid);
    snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"<|go1|>\"},{\"role\":\"assistant\","
             "\"content\":\"Let me check.\",\"reasoning_content\":\"The user wants Paris weather.\",\"tool_calls\":"
             "[{\"id\":\"%s\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":"
             "\"{\\\"city\\\":\\\"Paris\\\"}\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"%s\",\"content\":\"sunny\"}],"
             "\"max_tokens\":1,\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":"
             "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}}}]}", call, call);
    struct resp c = http(&s, "POST", "/v1/chat/completions", body);
    cr_assert_eq(c.code, 200, "%s", c.body);
    cr_assert_eq(jint(b.json, "usage.input_tokens"), jint(c.json, "usage.prompt_tokens"));
    cr_assert_gt(jint(b.json, "usage.input_tokens"), 40);
    /* the same conversation from a's kept output items by reference: the same prompt */
    snprintf(body, sizeof body, "{\"input\":[{\"role\":\"user\",\"content\":\"<|go1|>\"},{\"type\":\"item_reference\","
             "\"id\":\"%s\"},{\"type\":\"item_reference\",\"id\":\"%s\"},{\"type\":\"item_reference\",\"id\":\"%s\"},"
             "{\"type\":\"function_call_output\",\"call_id\":\"%s\",\"output\":\"sunny\"}],\"max_output_tokens\":1,%s}",
             jstr(a.json, "output.0.id"), jstr(a.json, "output.1.id"), jstr(a.json, "output.2.id"), call, tools);
    struct resp ref = http(&s, "POST", "/v1/responses", body);
    cr_assert_eq(ref.code, 200, "%s", ref.body);
    cr_assert_eq(jint(ref.json, "usage.input_tokens"), jint(b.json, "usage.input_tokens"), "%s", ref.body);
    resp_free(&ref);
    ref = http(&s, "POST", "/v1/responses", "{\"input\":[{\"type\":\"item_reference\",\"id\":\"msg_none\"}]}");
    cr_assert_eq(ref.code, 400, "%s", ref.body);
    cr_assert_str_eq(jstr(ref.json, "error.code"), "item_not_found");
    resp_free(&ref);
    /* input items: listed newest first, in pages, with ids; an input item is referred to as an output one is */
    ref = http(&s, "POST", "/v1/responses", "{\"input\":[{\"role\":\"user\",\"content\":\"x1\"},{\"role\":"
               "\"assistant\",\"content\":\"x2\"},{\"type\":\"message\",\"role\":\"user\",\"content\":[{\"type\":"
               "\"input_text\",\"text\":\"x3\"}]}],\"max_output_tokens\":1}");
    cr_assert_eq(ref.code, 200, "%s", ref.body);
    char items[160], iid[3][96];
    snprintf(items, sizeof items, "/v1/responses/%s/input_items", jstr(ref.json, "id"));
    struct resp li = http(&s, "GET", items, NULL);
    cr_assert_eq(li.code, 200, "%s", li.body);
    cr_assert_str_eq(jstr(li.json, "object"), "list");
    cr_assert_eq(json_array_size(jget(li.json, "data")), 3, "%s", li.body);
    cr_assert(json_is_false(jget(li.json, "has_more")));
    for (int i = 0; i < 3; i++) {
        char at[32];
        snprintf(at, sizeof at, "data.%d.id", 2 - i);
        snprintf(iid[i], sizeof iid[i], "%s", jstr(li.json, at));
    }
    cr_assert_str_eq(jstr(li.json, "first_id"), iid[2]);
    cr_assert_str_eq(jstr(li.json, "last_id"), iid[0]);
    cr_assert_str_eq(jstr(li.json, "data.0.content.0.text"), "x3");
    cr_assert_str_eq(jstr(li.json, "data.1.type"), "message");
    cr_assert_str_eq(jstr(li.json, "data.1.content.0.type"), "output_text");
    cr_assert_str_eq(jstr(li.json, "data.2.content.0.type"), "input_text");
    cr_assert(strcmp(iid[0], iid[1]) && strcmp(iid[1], iid[2]), "%s", li.body);
    resp_free(&li);
    const struct { const char *query; size_t n; const char *first; bool more; } pages[] = {
        {"?limit=2", 2, iid[2], true}, {"?limit=2&after=%s", 1, iid[0], false}, {"?order=asc&before=%s", 2, iid[0], false},
    };
    for (int i = 0; i < 3; i++) {
        char q[400], url[600];
        snprintf(q, sizeof q, pages[i].query, iid[i == 1 ? 1 : 2]);
        snprintf(url, sizeof url, "%s%s", items, q);
        li = http(&s, "GET", url, NULL);
        cr_assert_eq(li.code, 200, "%s: %s", url, li.body);
        cr_assert_eq(json_array_size(jget(li.json, "data")), pages[i].n, "%s: %s", url, li.body);
        cr_assert_str_eq(jstr(li.json, "first_id"), pages[i].first, "%s: %s", url, li.body);
        cr_assert_eq(json_is_true(jget(li.json, "has_more")), pages[i].more, "%s: %s", url, li.body);
        resp_free(&li);
    }
    const char *refused[] = {"?limit=0", "?limit=101", "?limit=x", "?order=up", "?after=nope"};
    for (int i = 0; i < 5; i++) {
        char url[400];
        snprintf(url, sizeof url, "%s%s", items, refused[i]);
        li = http(&s, "GET", url, NULL);
        cr_assert_eq(li.code, 400, "%s: %s", url, li.body);
        resp_free(&li);
    }
    li = http(&s, "GET", "/v1/responses/resp_none/input_items", NULL);
    cr_assert_eq(li.code, 404, "%s", li.body);
    resp_free(&li);
    li = http(&s, "POST", items, "{}");
    cr_assert_eq(li.code, 405, "%s", li.body);
    resp_free(&li);
    snprintf(body, sizeof body, "{\"input\":[{\"type\":\"item_reference\",\"id\":\"%s\"},{\"role\":\"user\","
             "\"content\":\"x3\"}],\"max_output_tokens\":1}", iid[0]);
    li = http(&s, "POST", "/v1/responses", body);
    struct resp inl = http(&s, "POST", "/v1/responses", "{\"input\":[{\"role\":\"user\",\"content\":\"x1\"},"
                           "{\"role\":\"user\",\"content\":\"x3\"}],\"max_output_tokens\":1}");
    cr_assert_eq(li.code, 200, "%s", li.body);
    cr_assert_eq(jint(li.json, "usage.input_tokens"), jint(inl.json, "usage.input_tokens"), "%s", li.body);
    resp_free(&li), resp_free(&inl), resp_free(&ref);
    /* GET: the response as it was returned */
    snprintf(path, sizeof path, "/v1/responses/%s", aid);
    struct resp g = http(&s, "GET", path, NULL);
    cr_assert_eq(g.code, 200, "%s", g.body);
    cr_assert(json_equal(g.json, a.json), "%s\nvs\n%s", g.body, a.body);
    resp_free(&g);
    /* streamed, after b: kept too */
    snprintf(body, sizeof body, "{\"previous_response_id\":\"%s\",\"input\":\"<|go1|>\",\"stream\":true,%s}",
             jstr(b.json, "id"), tools);
    struct resp st = http(&s, "POST", "/v1/responses", body);
    cr_assert_eq(st.code, 200, "%s", st.body);
    json_t *events = sse_events(st.body), *done = json_array_get(events, json_array_size(events) - 1);
    cr_assert_str_eq(jstr(done, "type"), "response.completed");
    cr_assert(json_is_true(jget(done, "response.store")));
    cr_assert_str_eq(jstr(done, "response.previous_response_id"), jstr(b.json, "id"));
    snprintf(path, sizeof path, "/v1/responses/%s", jstr(done, "response.id"));
    g = http(&s, "GET", path, NULL);
    cr_assert_eq(g.code, 200, "%s", g.body);
    cr_assert_gt(jint(g.json, "usage.input_tokens"), jint(b.json, "usage.input_tokens"));
    resp_free(&g);
    json_decref(events);
    /* DELETE, then it is gone */
    snprintf(path, sizeof path, "/v1/responses/%s", aid);
    g = http(&s, "DELETE", path, NULL);
    cr_assert_eq(g.code, 200, "%s", g.body);
    cr_assert(json_is_true(jget(g.json, "deleted")));
    cr_assert_str_eq(jstr(g.json, "object"), "response.deleted");
    resp_free(&g);
    const char *methods[] = {"GET", "DELETE"};
    for (int i = 0; i < 2; i++) {
        g = http(&s, methods[i], path, NULL);
        cr_assert_eq(g.code, 404, "%s %s", methods[i], g.body);
        resp_free(&g);
    }
    snprintf(body, sizeof body, "{\"previous_response_id\":\"%s\",\"input\":\"x\"}", aid);
    g = http(&s, "POST", "/v1/responses", body);
    cr_assert_eq(g.code, 400, "%s", g.body);
    cr_assert_str_eq(jstr(g.json, "error.code"), "previous_response_not_found");
    cr_assert_str_eq(jstr(g.json, "error.param"), "previous_response_id");
    resp_free(&g);
    g = http(&s, "POST", path, "{}");
    cr_assert_eq(g.code, 405, "%s", g.body);
    resp_free(&g);
    /* "store": false keeps nothing; a store that is not a boolean is refused */
    g = http(&s, "POST", "/v1/responses", "{\"input\":\"x\",\"max_output_tokens\":2,\"store\":false}");
    cr_assert_eq(g.code, 200, "%s", g.body);
    cr_assert(json_is_false(jget(g.json, "store")));
    snprintf(path, sizeof path, "/v1/responses/%s", jstr(g.json, "id"));
    resp_free(&g);
    g = http(&s, "GET", path, NULL);
    cr_assert_eq(g.code, 404, "%s", g.body);
    resp_free(&g);
    g = http(&s, "POST", "/v1/responses", "{\"input\":\"x\",\"store\":\"yes\"}");
    cr_assert_eq(g.code, 400, "%s", g.body);
    cr_assert_str_eq(jstr(g.json, "error.param"), "store");
    resp_free(&g);
    resp_free(&a), resp_free(&b), resp_free(&c), resp_free(&st);
    scripted_stop(&s, dir);
    /* the newest 2, then none */
    const char *keep2[] = {"--responses", "2", NULL}, *keep0[] = {"--responses", "0", NULL};
    server_start(&s, keep2);
    char ids[3][64];
    for (int i = 0; i < 3; i++) {
        g = http(&s, "POST", "/v1/responses", "{\"input\":\"x\",\"max_output_tokens\":2}");
        cr_assert_eq(g.code, 200, "%s", g.body);
        snprintf(ids[i], sizeof ids[i], "%s", jstr(g.json, "id"));
        resp_free(&g);
    }
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "/v1/responses/%s", ids[i]);
        g = http(&s, "GET", path, NULL);
        cr_assert_eq(g.code, i ? 200 : 404, "response %d: %s", i, g.body);
        resp_free(&g);
    }
    cr_assert_eq(metric(&s, "toy_responses_kept"), 2);
    cr_assert_gt(metric(&s, "toy_responses_kept_bytes"), 200);
    cr_assert_eq(server_stop(&s), 0);
    server_start(&s, keep0);
    g = http(&s, "POST", "/v1/responses", "{\"input\":\"x\",\"max_output_tokens\":2}");
    cr_assert(json_is_false(jget(g.json, "store")), "%s", g.body);
    resp_free(&g);
    g = http(&s, "POST", "/v1/responses", "{\"input\":\"x\",\"previous_response_id\":\"resp_1\"}");
    cr_assert_eq(g.code, 400, "%s", g.body);
    cr_assert(strstr(jstr(g.json, "error.message"), "--responses 0"), "%s", g.body);
    resp_free(&g);
    cr_assert_eq(server_stop(&s), 0);
}

/* The SDKs' own stream helpers put a streamed tool call together from its pieces: OpenAI's chat stream
 * (finalChatCompletion), its Responses event stream, and Anthropic's (finalMessage reads the input's partial JSON) */
Test(serve, npm_clients_assemble_streamed_tool_calls, .timeout = 240) {
    char script[600];
    npm_script("@anthropic-ai/sdk", "tools.mjs", script, sizeof script);
    npm_script("openai", "tools.mjs", script, sizeof script);
    struct th_script_model sm = {qwen_echo_template, {qwen_script}, "<|eos|>", false};
    char dir[32];
    struct server s;
    scripted_start(&s, &sm, dir);
    const char *js =
        "import OpenAI from 'openai';\n"
        "import Anthropic from '@anthropic-ai/sdk';\n"
        "const o = new OpenAI({baseURL: process.argv[2] + '/v1', apiKey: 'k', maxRetries: 0});\n"
        "const a = new Anthropic({baseURL: process.argv[2], apiKey: 'k', maxRetries: 0});\n"
        "const params = {type: 'object', properties: {city: {type: 'string'}}};\n"
        "const messages = [{role: 'user', content: '<|go1|>'}];\n"
        "const out = {};\n"
        "const fc = await o.chat.completions.stream({model: 'tiny', messages, temperature: 0,\n"
        "  tools: [{type: 'function', function: {name: 'get_weather', parameters: params}}]}).finalChatCompletion();\n"
        "out.chat = fc.choices[0].message.tool_calls[0].function; out.chat_finish = fc.choices[0].finish_reason;\n"
        "let args = '';\n"
        "for await (const ev of await o.responses.create({model: 'tiny', input: '<|go1|>', stream: true,\n"
        "    tools: [{type: 'function', name: 'get_weather', parameters: params}]})) {\n"
        "  if (ev.type === 'response.function_call_arguments.delta') args += ev.delta;\n"
        "  if (ev.type === 'response.completed') out.resp_item = ev.response.output.find(i => i.type === 'function_call');\n"
        "}\n"
        "out.resp_args = args;\n"
        "const m = await a.messages.stream({model: 'tiny', max_tokens: 100, messages,\n"
        "  tools: [{name: 'get_weather', input_schema: params}]}).finalMessage();\n"
        "out.anth = m.content.find(b => b.type === 'tool_use'); out.anth_stop = m.stop_reason;\n"
        "console.log(JSON.stringify(out));\n";
    json_t *o = node_client(&s, script, js, "");
    cr_expect_str_eq(jstr(o, "chat.name"), "get_weather");
    cr_expect_str_eq(jstr(o, "chat.arguments"), "{\"city\":\"Paris\"}");
    cr_expect_str_eq(jstr(o, "chat_finish"), "tool_calls");
    cr_expect_str_eq(jstr(o, "resp_args"), "{\"city\":\"Paris\"}");
    cr_expect_str_eq(jstr(o, "resp_item.arguments"), "{\"city\":\"Paris\"}");
    cr_expect_str_eq(jstr(o, "resp_item.name"), "get_weather");
    cr_expect_str_eq(jstr(o, "anth.name"), "get_weather");
    cr_expect_str_eq(jstr(o, "anth.input.city"), "Paris");
    cr_expect_str_eq(jstr(o, "anth_stop"), "tool_use");
    json_decref(o);
    scripted_stop(&s, dir);
}

/* Anthropic's Messages API on the chat path: thinking, text and tool_use blocks with stop_reason tool_use, whole
 * and as the event stream (message_start, a block's start / deltas / stop, message_delta, message_stop); blocks
 * in (a tool_use and its tool_result) become the chat the template sees, as count_tokens counts; errors in
 * Anthropic's shape */
Test(serve, anthropic_messages_whole_and_streamed, .timeout = 120) {
    struct th_script_model sm = {qwen_echo_template, {qwen_script}, "<|eos|>", false};
    char dir[32];
    struct server s;
    scripted_start(&s, &sm, dir);
    const char *tools = "\"tools\":[{\"name\":\"get_weather\",\"description\":\"weather\",\"input_schema\":{\"type\":"
                        "\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}}]";
    char body[2048];
    snprintf(body, sizeof body, "{\"model\":\"tiny\",\"max_tokens\":100,\"system\":\"Be brief.\",\"messages\":[{\"role\":"
             "\"user\",\"content\":\"<|go1|>\"}],%s}", tools);
    struct resp r = http(&s, "POST", "/v1/messages", body);
    cr_assert_eq(r.code, 200, "%s", r.body);
    cr_expect_str_eq(jstr(r.json, "type"), "message");
    cr_expect_str_eq(jstr(r.json, "role"), "assistant");
    cr_expect_str_eq(jstr(r.json, "content.0.type"), "thinking");
    cr_expect_str_eq(jstr(r.json, "content.0.thinking"), "The user wants Paris weather.");
    cr_expect_str_eq(jstr(r.json, "content.1.type"), "text");
    cr_expect_str_eq(jstr(r.json, "content.1.text"), "Let me check.");
    cr_expect_str_eq(jstr(r.json, "content.2.type"), "tool_use");
    cr_expect_str_eq(jstr(r.json, "content.2.name"), "get_weather");
    cr_expect_str_eq(jstr(r.json, "content.2.input.city"), "Paris");
    cr_expect(jstr(r.json, "content.2.id") && !strncmp(jstr(r.json, "content.2.id"), "toolu_", 6));
    cr_expect_str_eq(jstr(r.json, "stop_reason"), "tool_use");
    cr_expect_eq(jint(r.json, "usage.output_tokens"), 11);
    long long in_tokens = jint(r.json, "usage.input_tokens") + jint(r.json, "usage.cache_read_input_tokens");
    resp_free(&r);

    snprintf(body, sizeof body, "{\"model\":\"tiny\",\"max_tokens\":100,\"system\":\"Be brief.\",\"stream\":true,"
             "\"messages\":[{\"role\":\"user\",\"content\":\"<|go1|>\"}],%s}", tools);
    r = http(&s, "POST", "/v1/messages", body);
    cr_assert_eq(r.code, 200, "%s", r.body);
    char types[1024] = "", thinking[256] = "", text[256] = "", json[256] = "", stop[32] = "";
    json_t *events = sse_events(r.body);
    for (size_t i = 0; i < json_array_size(events); i++) {
        json_t *o = json_array_get(events, i);
        const char *type = jstr(o, "type");
        if (!same_delta(events, i)) /* how many deltas a stream takes depends on the timing: one stands for all */
            snprintf(types + strlen(types), sizeof types - strlen(types), "%s%s,", type,
                     !strcmp(type, "content_block_start") ? jstr(o, "content_block.type") : "");
        const char *dt = jstr(o, "delta.type");
        if (dt && !strcmp(dt, "thinking_delta")) strncat(thinking, jstr(o, "delta.thinking"), 100);
        if (dt && !strcmp(dt, "text_delta")) strncat(text, jstr(o, "delta.text"), 100);
        if (dt && !strcmp(dt, "input_json_delta")) strncat(json, jstr(o, "delta.partial_json"), 100);
        if (!strcmp(type, "message_delta")) snprintf(stop, sizeof stop, "%s", jstr(o, "delta.stop_reason"));
    }
    json_decref(events);
    cr_expect_str_eq(types, "message_start,content_block_startthinking,content_block_delta,content_block_stop,"
                            "content_block_starttext,content_block_delta,content_block_stop,content_block_starttool_use,"
                            "content_block_delta,content_block_stop,message_delta,message_stop,");
    cr_expect_str_eq(thinking, "The user wants Paris weather.");
    cr_expect_str_eq(text, "Let me check.");
    cr_expect_str_eq(json, "{\"city\":\"Paris\"}");
    cr_expect_str_eq(stop, "tool_use");
    resp_free(&r);

    /* a stop sequence of the request's ends it, and is named */
    r = http(&s, "POST", "/v1/messages", "{\"max_tokens\":100,\"stop_sequences\":[\"zzz\",\"check\"],\"messages\":"
             "[{\"role\":\"user\",\"content\":\"<|go1|>\"}]}");
    cr_assert_eq(r.code, 200, "%s", r.body);
    cr_expect_str_eq(jstr(r.json, "stop_reason"), "stop_sequence", "%s", r.body);
    cr_expect_str_eq(jstr(r.json, "stop_sequence"), "check", "%s", r.body);
    cr_expect_str_eq(jstr(r.json, "content.1.text"), "Let me", "%s", r.body);
    resp_free(&r);
    r = http(&s, "POST", "/v1/messages", "{\"max_tokens\":100,\"messages\":[{\"role\":\"user\",\"content\":"
             "\"<|go1|>\"}]}"); /* no tools offered: the call is text, and the reply ends at its end of turn */
    cr_assert_eq(r.code, 200, "%s", r.body);
    cr_expect_str_eq(jstr(r.json, "stop_reason"), "end_turn", "%s", r.body);
    cr_expect(json_is_null(jget(r.json, "stop_sequence")), "%s", r.body);
    resp_free(&r);

    /* count_tokens counts the prompt the request would run */
    snprintf(body, sizeof body, "{\"model\":\"tiny\",\"system\":\"Be brief.\",\"messages\":[{\"role\":\"user\","
             "\"content\":\"<|go1|>\"}],%s}", tools);
    r = http(&s, "POST", "/v1/messages/count_tokens", body);
    cr_assert_eq(r.code, 200, "%s", r.body);
    cr_expect_eq(jint(r.json, "input_tokens"), in_tokens, "%s", r.body);
    resp_free(&r);
    /* a prompt longer than the context is counted all the same (the count is how a client finds out), where
     * running it is refused */
    long long n_ctx = server_n_ctx(&s);
    size_t cap = (size_t)n_ctx * 2 + 256;
    char *big = malloc(cap), *xs = malloc((size_t)n_ctx * 2 + 1);
    memset(xs, 'x', (size_t)n_ctx * 2);
    xs[n_ctx * 2] = 0;
    snprintf(big, cap, "{\"model\":\"tiny\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"%s\"}]}", xs);
    r = http(&s, "POST", "/v1/messages/count_tokens", big);
    cr_assert_eq(r.code, 200, "%s", r.body);
    cr_expect_gt(jint(r.json, "input_tokens"), n_ctx, "%s", r.body);
    resp_free(&r);
    r = http(&s, "POST", "/v1/messages", big);
    cr_expect_eq(r.code, 400, "%s", r.body);
    resp_free(&r);
    free(big), free(xs);
    /* blocks: a text block list, a tool_use and its tool_result reach the template as the chat messages do */
    snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
             "{\"type\":\"text\",\"text\":\"b\"}]},{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_use\",\"id\":"
             "\"c1\",\"name\":\"get_weather\",\"input\":{\"city\":\"Oslo\"}}]},{\"role\":\"user\",\"content\":[{\"type\":"
             "\"tool_result\",\"tool_use_id\":\"c1\",\"content\":\"sunny\"}]},{\"role\":\"user\",\"content\":"
             "\"<|go1|>\"}]}");
    r = http(&s, "POST", "/v1/messages/count_tokens", body);
    cr_assert_eq(r.code, 200, "%s", r.body);
    long long counted = jint(r.json, "input_tokens");
    resp_free(&r);
    snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"ab\"},{\"role\":\"assistant\","
             "\"content\":null,\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":"
             "\"get_weather\",\"arguments\":{\"city\":\"Oslo\"}}}]},{\"role\":\"tool\",\"tool_call_id\":\"c1\","
             "\"content\":\"sunny\"},{\"role\":\"user\",\"content\":\"<|go1|>\"}],\"max_tokens\":1}");
    r = http(&s, "POST", "/v1/chat/completions", body);
    cr_assert_eq(r.code, 200, "%s", r.body);
    cr_expect_eq(jint(r.json, "usage.prompt_tokens"), counted, "%s", r.body);
    cr_expect_gt(counted, 30);
    resp_free(&r);
    const char *bad[] = {
        "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",                            /* max_tokens */
        "{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image\"}]}]}",
        ("{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":"
         "\"web_search_20250305\",\"name\":\"web_search\"}]}"),
        "{\"max_tokens\":5,\"messages\":[{\"role\":\"system\",\"content\":\"x\"}]}",
        "{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":{\"type\":\"maybe\"}}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        r = http(&s, "POST", "/v1/messages", bad[i]);
        cr_expect_eq(r.code, 400, "case %zu: %s", i, r.body);
        cr_expect_str_eq(jstr(r.json, "type"), "error", "case %zu", i);
        cr_expect_str_eq(jstr(r.json, "error.type"), "invalid_request_error", "case %zu: %s", i, r.body);
        resp_free(&r);
    }
    scripted_stop(&s, dir);
}

Test(serve, harmony_replies_split_by_channel, .timeout = 120) {
    static const char *const answer[] = {"<|channel|>", "analysis", "<|message|>", "User greets. Reply.", "<|end|>",
                                         "<|start|>", "assistant", "<|channel|>", "final", "<|message|>",
                                         "Hello! How can I help?", "<|return|>", NULL};
    static const char *const call[] = {"<|channel|>", "analysis", "<|message|>", "Need the weather.", "<|end|>",
                                       "<|start|>", "assistant", "<|channel|>", "commentary to=functions.get_weather ",
                                       "<|constrain|>", "json", "<|message|>", "{\"city\":\"Paris\"}", "<|call|>", NULL};
    struct th_script_model sm = {"{# gpt-oss: <|start|>assistant<|channel|>final<|message|> #}{% for m in messages %}"
                              "{{ m.content }}{{ m.thinking if m.thinking is defined else '' }}{% endfor %}",
                              {answer, call}, "<|return|>", false};
    char dir[32];
    struct server s;
    scripted_start(&s, &sm, dir);
    char body[1024];
    for (int stream = 0; stream < 2; stream++) {
        snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"<|go1|>\"}],\"temperature\":0,"
                 "\"stream\":%s}", stream ? "true" : "false");
        struct resp r = http(&s, "POST", "/v1/chat/completions", body);
        cr_assert_eq(r.code, 200, "%s", r.body);
        struct split sp = {0};
        if (stream) split_stream(r.body, &sp);
        cr_expect_str_eq(stream ? sp.reasoning : jstr(r.json, "choices.0.message.reasoning_content"),
                         "User greets. Reply.");
        cr_expect_str_eq(stream ? sp.content : jstr(r.json, "choices.0.message.content"), "Hello! How can I help?",
                         "%s", r.body);
        cr_expect_str_eq(stream ? sp.finish : jstr(r.json, "choices.0.finish_reason"), "stop");
        resp_free(&r);

        snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"<|go2|>\"}],\"temperature\":0,"
                 "\"stream\":%s,%s}", stream ? "true" : "false", tools_json);
        r = http(&s, "POST", "/v1/chat/completions", body);
        cr_assert_eq(r.code, 200, "%s", r.body);
        if (stream) {
            split_stream(r.body, &sp);
            cr_expect_str_eq(sp.reasoning, "Need the weather.");
            cr_expect_str_eq(sp.content, "");
            cr_expect_str_eq(sp.names, "get_weather;");
            cr_expect_str_eq(sp.args, "{\"city\":\"Paris\"}");
            cr_expect_str_eq(sp.finish, "tool_calls");
        } else {
            cr_expect_str_eq(jstr(r.json, "choices.0.message.reasoning_content"), "Need the weather.");
            cr_expect(json_is_null(jget(r.json, "choices.0.message.content")), "%s", r.body);
            cr_expect_str_eq(jstr(r.json, "choices.0.message.tool_calls.0.function.name"), "get_weather");
            cr_expect_str_eq(jstr(r.json, "choices.0.message.tool_calls.0.function.arguments"), "{\"city\":\"Paris\"}");
            cr_expect_str_eq(jstr(r.json, "choices.0.finish_reason"), "tool_calls");
        }
        resp_free(&r);
    }
    /* the call goes back in the next turn: arguments as JSON text, as clients send them, reach the template */
    snprintf(body, sizeof body,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"<|go1|>\"},{\"role\":\"assistant\",\"content\":null,"
             "\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
             "\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"call_1\","
             "\"content\":\"<|go1|>\"}],\"temperature\":0,\"max_tokens\":3}");
    struct resp r = http(&s, "POST", "/v1/chat/completions", body);
    cr_expect_eq(r.code, 200, "%s", r.body);
    resp_free(&r);
    /* a reply's reasoning_content sent back reaches the template as gpt-oss's "thinking" (here it starts script 2) */
    snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"<|go1|>\"},{\"role\":\"assistant\","
             "\"content\":\"\",\"reasoning_content\":\"<|go2|>\"}],\"temperature\":0,%s}", tools_json);
    r = http(&s, "POST", "/v1/chat/completions", body);
    cr_expect_eq(r.code, 200, "%s", r.body);
    cr_expect_str_eq(jstr(r.json, "choices.0.message.reasoning_content"), "Need the weather.", "%s", r.body);
    resp_free(&r);
    snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"assistant\",\"content\":\"x\",\"tool_calls\":[{\"id\":1}]}]}");
    r = http(&s, "POST", "/v1/chat/completions", body);
    cr_expect_eq(r.code, 400, "%s", r.body);
    cr_expect(strstr(r.body, "tool_calls[0]"), "%s", r.body);
    resp_free(&r);
    scripted_stop(&s, dir);
}

/* ---- response_format: replies sampled within a JSON grammar ------------------------------------------ */

/* A model that writes anything (random weights, sampled at temperature 1) answers in JSON the schema takes,
 * whole or streamed, on both endpoints; json_object gives an object; schemas toy cannot enforce are refused */
Test(serve, response_format_constrains_replies_to_the_schema, .timeout = 180) {
    struct server s;
    server_start(&s, NULL);
    const char *schema = "{\"type\":\"object\",\"properties\":{\"ok\":{\"type\":\"boolean\"},\"n\":{\"enum\":[1,2,3]},"
                         "\"tag\":{\"type\":[\"string\",\"null\"],\"maxLength\":5}},\"required\":[\"ok\",\"n\"],"
                         "\"additionalProperties\":false}";
    char body[2048];
    int whole = 0;
    for (int k = 0; k < 6; k++) {
        bool chat = k % 2, stream = k >= 4;
        const char *fmt = k < 2 ? "{\"type\":\"json_object\"}" : NULL;
        char rf[1024];
        snprintf(rf, sizeof rf, "{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"r\",\"strict\":true,\"schema\":%s}}",
                 schema);
        snprintf(body, sizeof body, "{%s,\"max_tokens\":300,\"temperature\":1,\"seed\":%d,\"stream\":%s,"
                 "\"response_format\":%s}",
                 chat ? "\"messages\":[{\"role\":\"user\",\"content\":\"Answer in JSON\"}]" : "\"prompt\":\"JSON:\"", k,
                 stream ? "true" : "false", fmt ? fmt : rf);
        struct resp r = http(&s, "POST", chat ? "/v1/chat/completions" : "/v1/completions", body);
        cr_assert_eq(r.code, 200, "%s", r.body);
        struct sse sp;
        const char *text, *finish;
        if (stream) {
            sse_parse(r.body, chat, &sp);
            text = sp.text, finish = sp.finish;
        } else {
            text = jstr(r.json, chat ? "choices.0.message.content" : "choices.0.text");
            finish = jstr(r.json, "choices.0.finish_reason");
        }
        cr_assert(text && finish, "%s", r.body);
        if (!strcmp(finish, "stop")) {
            whole++;
            json_t *v = json_loads(text, 0, NULL);
            cr_assert(json_is_object(v), "case %d: not a JSON object: %s", k, text);
            if (!fmt) { /* the schema's rules */
                cr_expect(json_is_boolean(json_object_get(v, "ok")), "case %d: %s", k, text);
                json_int_t n = json_integer_value(json_object_get(v, "n"));
                cr_expect(n >= 1 && n <= 3, "case %d: %s", k, text);
                json_t *tag = json_object_get(v, "tag");
                cr_expect(!tag || json_is_null(tag) || (json_is_string(tag) && json_string_length(tag) <= 15),
                          "case %d: %s", k, text);
                const char *key;
                json_t *x;
                json_object_foreach(v, key, x) cr_expect(!strcmp(key, "ok") || !strcmp(key, "n") || !strcmp(key, "tag"),
                                                         "case %d: key %s", k, key);
            }
            json_decref(v);
        }
        resp_free(&r);
    }
    cr_expect_geq(whole, 4, "only %d of 6 replies ended within 300 tokens", whole);
    const char *bad[][2] = {
        {"{\"type\":\"xml\"}", "xml"},
        {"{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"r\",\"schema\":{\"type\":\"string\",\"pattern\":\"a+\"}}}",
         "pattern"},
        {"{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"r\"}}", "schema"},
        {"\"json\"", "response_format"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(body, sizeof body, "{\"prompt\":\"x\",\"response_format\":%s}", bad[i][0]);
        struct resp r = http(&s, "POST", "/v1/completions", body);
        cr_expect_eq(r.code, 400, "%s", r.body);
        cr_expect_str_eq(jstr(r.json, "error.param"), "response_format");
        cr_expect(strstr(r.body, bad[i][1]), "%s does not name %s", r.body, bad[i][1]);
        resp_free(&r);
    }
    cr_assert_eq(server_stop(&s), 0);
    server_clean(&s);
}

/* tool_choice "required" or a named function: a model that writes anything (random weights, temperature 1)
 * answers with a call in its template's syntax (Hermes here), to an offered tool, with arguments its
 * parameters allow; a template whose call syntax toy cannot force gets a 400 */
Test(serve, tool_choice_forces_a_call, .timeout = 180) {
    struct server s;
    const char *extra[] = {"--chat-template",
                           "{# Hermes-style calls: <tool_call> #}{% for m in messages %}<|im_start|>{{ m.role }}\n"
                           "{{ m.content }}<|im_end|>\n{% endfor %}<|im_start|>assistant\n",
                           NULL};
    server_start(&s, extra);
    const char *tools = "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{"
                        "\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\",\"maxLength\":8}},"
                        "\"required\":[\"city\"],\"additionalProperties\":false}}},{\"type\":\"function\",\"function\":"
                        "{\"name\":\"get_time\",\"parameters\":{\"type\":\"object\",\"properties\":{}}}}]";
    /* one tool offered, or one named: its parameters shape the arguments (get_time's are any object, which a
     * random model need not finish: below) */
    const char *one_tool = "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{"
                           "\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\",\"maxLength\":8}},"
                           "\"required\":[\"city\"],\"additionalProperties\":false}}}]";
    char body[2048];
    int calls = 0;
    for (int k = 0; k < 4; k++) {
        bool stream = k >= 2;
        snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"weather?\"}],\"temperature\":1,"
                 "\"seed\":%d,\"max_tokens\":400,\"stream\":%s,%s,\"tool_choice\":%s}", k, stream ? "true" : "false",
                 k % 2 ? tools : one_tool,
                 k % 2 ? "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}}" : "\"required\"");
        struct resp r = http(&s, "POST", "/v1/chat/completions", body);
        cr_assert_eq(r.code, 200, "%s", r.body);
        struct split sp = {0};
        const char *finish, *name, *args;
        if (stream) {
            split_stream(r.body, &sp);
            finish = sp.finish, args = sp.args;
            if (sp.n_calls) sp.names[strlen(sp.names) - 1] = 0;
            name = sp.n_calls == 1 ? sp.names : NULL;
        } else {
            finish = jstr(r.json, "choices.0.finish_reason");
            name = jstr(r.json, "choices.0.message.tool_calls.0.function.name");
            args = jstr(r.json, "choices.0.message.tool_calls.0.function.arguments");
        }
        if (finish && !strcmp(finish, "length")) { /* cut off: no verdict */
            resp_free(&r);
            continue;
        }
        cr_expect_str_eq(finish, "tool_calls", "case %d: %s", k, r.body);
        cr_assert(name && args, "case %d: no call: %s", k, r.body);
        cr_expect_str_eq(name, "get_weather", "case %d", k);
        json_t *a = json_loads(args, 0, NULL);
        cr_assert(json_is_object(a), "case %d: arguments %s", k, args);
        json_t *city = json_object_get(a, "city"); /* the tool's own parameters */
        cr_expect(json_is_string(city) && json_object_size(a) == 1, "case %d: %s", k, args);
        json_decref(a);
        calls++;
        resp_free(&r);
    }
    cr_expect_geq(calls, 3, "only %d of 4 forced calls ended within 400 tokens", calls);
    /* several tools, "required": a call to one of them, begun at once */
    snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"temperature\":1,\"seed\":9,"
             "\"max_tokens\":24,%s,\"tool_choice\":\"required\"}", tools);
    struct resp q = http(&s, "POST", "/v1/chat/completions", body);
    cr_expect_eq(q.code, 200, "%s", q.body);
    const char *c = jstr(q.json, "choices.0.message.content"), *nm = jstr(q.json, "choices.0.message.tool_calls.0.function.name");
    cr_expect((c && !strncmp(c, "<tool_call>\n", 12)) || (nm && (!strcmp(nm, "get_weather") || !strcmp(nm, "get_time"))),
              "%s", q.body);
    resp_free(&q);
    snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],%s,\"tool_choice\":"
             "{\"type\":\"function\",\"function\":{\"name\":\"nope\"}}}", tools);
    struct resp r = http(&s, "POST", "/v1/chat/completions", body);
    cr_expect_eq(r.code, 400, "%s", r.body);
    cr_expect(strstr(r.body, "nope"), "%s", r.body);
    resp_free(&r);
    snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],%s,\"tool_choice\":\"required\","
             "\"response_format\":{\"type\":\"json_object\"}}", tools);
    r = http(&s, "POST", "/v1/chat/completions", body);
    cr_expect_eq(r.code, 400, "%s", r.body);
    resp_free(&r);
    cr_assert_eq(server_stop(&s), 0);
    server_clean(&s);
    server_start(&s, NULL); /* ChatML: no call syntax to force */
    snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],%s,\"tool_choice\":\"required\"}",
             tools);
    r = http(&s, "POST", "/v1/chat/completions", body);
    cr_expect_eq(r.code, 400, "%s", r.body);
    cr_expect_str_eq(jstr(r.json, "error.param"), "tool_choice");
    resp_free(&r);
    cr_assert_eq(server_stop(&s), 0);
    server_clean(&s);
}

/* A forced call in each family's syntax, end to end through the parser: a scripted model whose script the
 * grammar overrules at every step (greedy among what is left: the lowest id, so blanks where blanks may go)
 * writes the markers and a call: to get_weather, named, with a three-character city; or, "required" with two
 * tools, to whichever the lowest bytes lead to, with that tool's own arguments (get_time's through a $ref) */
Test(serve, tool_choice_forces_each_familys_syntax, .timeout = 180) {
    static const char *const script[] = {"Hello", NULL};
    const char *tmpls[] = {"{# <tool_call> #}{% for m in messages %}{{ m.content }}{% endfor %}",
                           "{# <|start_header_id|> <|python_tag|> #}{% for m in messages %}{{ m.content }}{% endfor %}",
                           "{# [TOOL_CALLS] #}{% for m in messages %}{{ m.content }}{% endfor %}",
                           "{# <|channel|> <|message|> #}{% for m in messages %}{{ m.content }}{% endfor %}",
                           "{# <\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "begin\xef\xbd\x9c> ```json #}"
                           "{% for m in messages %}{{ m.content }}{% endfor %}",
                           "{# <\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "begin\xef\xbd\x9c> #}"
                           "{% for m in messages %}{{ m.content }}{% endfor %}"};
    /* "required" between the two: Hermes and Mistral write "arguments" before "name" ('a' < 'n'), and "city"
     * comes before "tz", so get_weather; the others write the name first, and "get_t" < "get_w" */
    const char *picked[] = {"get_weather", "get_time", "get_weather", "get_time", "get_time", "get_time"};
    const char *weather = "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{"
                          "\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\",\"minLength\":3,"
                          "\"maxLength\":3}},\"required\":[\"city\"]}}}";
    const char *time = "{\"type\":\"function\",\"function\":{\"name\":\"get_time\",\"parameters\":{\"type\":\"object\","
                       "\"properties\":{\"tz\":{\"$ref\":\"#/$defs/tz\"}},\"required\":[\"tz\"],"
                       "\"additionalProperties\":false,\"$defs\":{\"tz\":{\"enum\":[\"UTC\",\"CET\"]}}}}}";
    for (int f = 0; f < 6; f++) {
        struct th_script_model sm = {tmpls[f], {script}, f == 3 ? "<|return|>" : "<|eos|>", false};
        char dir[32], body[2048];
        struct server s;
        scripted_start(&s, &sm, dir);
        for (int req = 0; req < 2; req++) {
            snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"<|go1|>\"}],\"temperature\":0,"
                     "\"max_tokens\":600,\"tools\":[%s,%s],\"tool_choice\":%s}", weather, time,
                     req ? "\"required\"" : "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}}");
            struct resp r = http(&s, "POST", "/v1/chat/completions", body);
            cr_assert_eq(r.code, 200, "%s", r.body);
            const char *name = req ? picked[f] : "get_weather";
            cr_expect_str_eq(jstr(r.json, "choices.0.finish_reason"), "tool_calls", "family %d: %s", f, r.body);
            cr_expect_str_eq(jstr(r.json, "choices.0.message.tool_calls.0.function.name"), name, "family %d: %s", f,
                             r.body);
            cr_expect_str_eq(jstr(r.json, "choices.0.message.tool_calls.0.function.arguments"),
                             strcmp(name, "get_time") ? "{\"city\":\"   \"}" : "{\"tz\":\"CET\"}", "family %d: %s", f,
                             r.body);
            resp_free(&r);
        }
        scripted_stop(&s, dir);
    }
}

/* A model that may think first (its template knows <think>, the prompt does not open one) does, then makes the
 * forced call: the grammar lets a reasoning block come first */
Test(serve, tool_choice_lets_a_model_think_first, .timeout = 120) {
    static const char *const script[] = {"<think>", "Hmm", "</think>", NULL};
    struct th_script_model sm = {"{# <tool_call> <think> #}{% for m in messages %}{{ m.content }}{% endfor %}",
                                 {script}, "<|eos|>", false};
    char dir[32], body[1024];
    struct server s;
    scripted_start(&s, &sm, dir);
    snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"<|go1|>\"}],\"temperature\":0,"
             "\"max_tokens\":600,\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":"
             "{\"type\":\"object\",\"properties\":{\"a\":{\"const\":1}},\"required\":[\"a\"]}}}],"
             "\"tool_choice\":\"required\"}");
    struct resp r = http(&s, "POST", "/v1/chat/completions", body);
    cr_assert_eq(r.code, 200, "%s", r.body);
    cr_expect_str_eq(jstr(r.json, "choices.0.message.reasoning_content"), "Hmm", "%s", r.body);
    cr_expect_str_eq(jstr(r.json, "choices.0.message.tool_calls.0.function.name"), "f", "%s", r.body);
    cr_expect_str_eq(jstr(r.json, "choices.0.message.tool_calls.0.function.arguments"), "{\"a\":1}", "%s", r.body);
    resp_free(&r);
    scripted_stop(&s, dir);
}
