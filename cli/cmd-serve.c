/* cmd-serve.c: `toy serve -m model.gguf`: an OpenAI-compatible HTTP server
 * (toy/serve.h; endpoints, flags and examples in docs/serve.md). Loads a
 * Llama-family GGUF (weights mapped) and its tokenizer, then serves until
 * SIGINT or SIGTERM, which drain the requests in flight before exiting 0. */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "flags.h"
#include "toy/serve.h"
#include "toy/toy.h"

static volatile int g_stop;
static volatile sig_atomic_t g_first_s; /* when the first stop signal came (monotonic seconds) */

/* The first SIGINT/SIGTERM drains; another one a second or more later quits at once. One within the second
 * is the same stop delivered twice (GNU timeout signals the process and then its whole group). */
static void on_signal(int sig) {
    (void)sig;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    if (!g_stop) {
        g_stop = 1;
        g_first_s = (sig_atomic_t)ts.tv_sec + 1;
        return;
    }
    if ((sig_atomic_t)ts.tv_sec > g_first_s) {
        static const char msg[] = "toy serve: stopped at once (second signal); requests in flight are cut off\n";
        if (write(2, msg, sizeof msg - 1) < 0) _exit(130);
        _exit(130);
    }
}

/* flags that take a value; anything else that starts with '-' is unknown */
static const char *const value_flags[] = {"-m", "--model", "--host", "--name", "--api-key", "--chat-template",
                                          "--cors-origin", "--runs", "--kv-type", "--port", "-p", "--ctx", "-c",
                                          "--parallel", "-np", "--queue", "--threads", "-t", "--max-body",
                                          "--timeout", "--max-connections", "--drain", NULL};


static int usage_to(FILE *out) {
    fprintf(out,
            "usage: toy serve -m MODEL.gguf [--host 127.0.0.1] [--port 8080] [--name ID] [--api-key KEY]\n"
            "                 [--chat-template NAME|JINJA] [--ctx N] [--parallel 4] [--queue 64] [--threads N]\n"
            "                 [--max-body BYTES] [--timeout SECONDS] [--max-connections 128] [--drain SECONDS]\n"
            "                 [--cors-origin '*'] [--runs DIR | --no-events] [--no-prefix-cache] [--kv-type f16|f32]\n"
            "                 [--quiet]\n"
            "Endpoints: GET /health, GET /v1/models, POST /v1/completions, POST /v1/chat/completions,\n"
            "POST /v1/embeddings, GET /metrics. --port 0 picks a free port (printed on stderr).\n");
    return 2;
}
static int usage(void) { return usage_to(stderr); }

int toy_cmd_serve(int argc, char **argv) {
    struct toy_serve_options o = toy_serve_defaults();
    const char *model = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage_to(stdout); return 0; }
        if (!strcmp(a, "--no-events")) { o.runs_dir = NULL; continue; }
        if (!strcmp(a, "--no-prefix-cache")) { o.no_prefix_cache = true; continue; }
        if (!strcmp(a, "--quiet")) { o.quiet = true; continue; }
        if (!toy_flag_in(a, value_flags)) return toy_flag_unknown("serve", a);
        if (i + 1 >= argc) { fprintf(stderr, "toy serve: %s needs a value\n", a); return 2; }
        const char *v = argv[++i];
        char *end = NULL;
        double x = strtod(v, &end);
        /* whole numbers, except the drain's seconds */
        bool num = end && end != v && !*end && x >= 0 && x <= 1e12 && (x == floor(x) || !strcmp(a, "--drain"));
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--host")) o.host = v;
        else if (!strcmp(a, "--name")) o.model_name = v;
        else if (!strcmp(a, "--api-key")) o.api_key = v;
        else if (!strcmp(a, "--chat-template")) o.chat_template = v;
        else if (!strcmp(a, "--cors-origin")) o.cors_origin = v;
        else if (!strcmp(a, "--runs")) o.runs_dir = v;
        else if (!strcmp(a, "--kv-type")) {
            if (strcmp(v, "f16") && strcmp(v, "f32")) { fprintf(stderr, "toy serve: --kv-type f16|f32\n"); return 2; }
            o.kv_f32 = !strcmp(v, "f32");
        }
        else if (!num) { fprintf(stderr, "toy serve: %s needs a whole number >= 0, not '%s'\n", a, v); return 2; }
        else if (!strcmp(a, "--port") || !strcmp(a, "-p")) {
            if (x > 65535) { fprintf(stderr, "toy serve: port %s out of range (0..65535)\n", v); return 2; }
            o.port = (int)x;
        }
        else if (!strcmp(a, "--ctx") || !strcmp(a, "-c")) o.n_ctx = (int64_t)x;
        else if (!strcmp(a, "--parallel") || !strcmp(a, "-np")) o.n_slots = (int)x;
        else if (!strcmp(a, "--queue")) o.queue_size = (int)x;
        else if (!strcmp(a, "--threads") || !strcmp(a, "-t")) o.n_threads = (int)x;
        else if (!strcmp(a, "--max-body")) {
            if (x < 1) { fprintf(stderr, "toy serve: --max-body must be at least 1 byte\n"); return 2; }
            o.max_body = (size_t)x;
        }
        else if (!strcmp(a, "--timeout")) o.timeout_s = (int)x;
        else if (!strcmp(a, "--max-connections")) o.max_connections = (int)x;
        else if (!strcmp(a, "--drain")) o.drain_s = x;
    }
    if (!model) { fprintf(stderr, "toy serve: -m MODEL is required\n"); return usage(); }
    if (o.n_slots < 1 || o.n_slots > 256) { fprintf(stderr, "toy serve: --parallel 1..256\n"); return 2; }
    if (o.queue_size < 1) { fprintf(stderr, "toy serve: --queue must be at least 1\n"); return 2; }

    struct toy_llama *m;
    if (toy_llama_load(model, false, &m)) { fprintf(stderr, "toy serve: %s\n", toy_last_error()); return 1; }
    struct toy_tokenizer *tok = NULL;
    if (toy_tokenizer_load_gguf(m->gguf, &tok)) {
        fprintf(stderr, "toy serve: %s has no usable tokenizer (%s); only token-id prompts will work\n", model,
                toy_last_error());
        tok = NULL;
    }
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    o.stop = &g_stop;
    int rc = 0;
    if (toy_serve(m, tok, model, &o)) {
        fprintf(stderr, "toy serve: %s\n", toy_last_error());
        rc = 1;
    }
    toy_tokenizer_free(tok);
    toy_llama_free(m);
    return rc;
}
