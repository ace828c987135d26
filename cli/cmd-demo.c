/* cmd-demo.c: `toy demo`: trains a small character-level Llama from scratch
 * on text made by a tiny built-in grammar (no download, no third-party
 * data), shows the loss falling, evaluates on held-out text, and samples.
 * It exercises the whole engine: graph, autodiff, planner, AdamW with warmup
 * and cosine decay, gradient clipping, and the thread pool. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "progress.h"
#include "toy/toy.h"

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
    int steps, threads, T, B, d, layers;
    uint64_t seed;
    float lr;
    bool bf16;
};

static int usage(void) {
    fprintf(stderr,
            "usage: toy demo [--steps N] [--threads N] [--seed S] [--lr LR] [--ctx T] [--batch B]\n"
            "                [--dim D] [--layers L] [--bf16]\n"
            "Trains a character-level Llama on built-in grammar text, then samples from it.\n");
    return 2;
}

static int parse(int argc, char **argv, struct opts *o) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return usage(), 1;
        if (!strcmp(a, "--bf16")) { o->bf16 = true; continue; }
        if (i + 1 >= argc) { fprintf(stderr, "toy demo: %s needs a value\n", a); return 2; }
        const char *v = argv[++i];
        char *end;
        double x = strtod(v, &end);
        if (*end || x < 0) { fprintf(stderr, "toy demo: bad value '%s' for %s\n", v, a); return 2; }
        if (!strcmp(a, "--steps")) o->steps = (int)x;
        else if (!strcmp(a, "--threads")) o->threads = (int)x;
        else if (!strcmp(a, "--seed")) o->seed = (uint64_t)x;
        else if (!strcmp(a, "--lr")) o->lr = (float)x;
        else if (!strcmp(a, "--ctx")) o->T = (int)x;
        else if (!strcmp(a, "--batch")) o->B = (int)x;
        else if (!strcmp(a, "--dim")) o->d = (int)x;
        else if (!strcmp(a, "--layers")) o->layers = (int)x;
        else { fprintf(stderr, "toy demo: unknown flag %s\n", a); return usage(); }
    }
    if (o->T < 8 || o->B < 1 || o->d < 16 || o->d % 32 || o->layers < 1 || o->steps < 1) {
        fprintf(stderr, "toy demo: need --ctx >= 8, --batch >= 1, --dim a multiple of 32, --layers >= 1, --steps >= 1\n");
        return 2;
    }
    return 0;
}

/* ---- sampling: full-context forward of a window, temperature sampling ---- */

static void sample(struct toy_llama *m, struct toy_threadpool *tp, const char *prompt, int n_new, float temp,
                   uint64_t seed) {
    int T = (int)m->cfg.max_ctx;
    struct toy_ctx *ctx = toy_ctx_init(true);
    struct toy_tensor *tok = toy_new_tensor_2d(ctx, TOY_I32, T, 1), *pos = toy_new_tensor_1d(ctx, TOY_I32, T);
    for (int t = 0; t < T; t++) ((int32_t *)pos->data)[t] = t;
    struct toy_tensor *logits = toy_llama_forward(ctx, m, tok, pos);
    toy_set_output(logits);
    struct toy_graph *g = toy_graph_new(ctx);
    toy_graph_build(g, logits);
    struct toy_rng r;
    toy_rng_seed(&r, seed);
    char *text = malloc(strlen(prompt) + (size_t)n_new + 1);
    strcpy(text, prompt);
    size_t len = strlen(text);
    printf("%s", prompt);
    int64_t V = m->cfg.vocab;
    float *p = malloc((size_t)V * sizeof *p);
    for (int i = 0; i < n_new; i++) {
        size_t start = len > (size_t)T ? len - (size_t)T : 0;
        int n = (int)(len - start);
        for (int t = 0; t < T; t++) ((int32_t *)tok->data)[t] = t < n ? (unsigned char)text[start + (size_t)t] : ' ';
        if (toy_graph_compute(g, tp)) break;
        const float *row = (const float *)logits->data + (size_t)(n - 1) * (size_t)V;
        float mx = -INFINITY, sum = 0;
        for (int64_t v = 0; v < V; v++) mx = fmaxf(mx, row[v]);
        for (int64_t v = 0; v < V; v++) sum += p[v] = expf((row[v] - mx) / temp);
        float u = toy_rng_uniform(&r) * sum, acc = 0;
        int64_t pick = V - 1;
        for (int64_t v = 0; v < V; v++)
            if ((acc += p[v]) > u) { pick = v; break; }
        text[len++] = (char)pick;
        putchar((int)pick);
        fflush(stdout);
    }
    putchar('\n');
    free(p);
    free(text);
    toy_ctx_free(ctx);
}

/* ---- training -------------------------------------------------------------- */

int toy_cmd_demo(int argc, char **argv) {
    struct opts o = {.steps = 1200, .threads = 0, .T = 64, .B = 16, .d = 128, .layers = 4, .seed = 1234, .lr = 3e-3f};
    int rc = parse(argc, argv, &o);
    if (rc) return rc == 1 ? 0 : rc;

    size_t n_text = 400000;
    char *text = make_corpus(n_text, o.seed);
    if (!text) { fprintf(stderr, "toy demo: out of memory\n"); return 1; }
    size_t n_train = n_text * 9 / 10; /* the last 10% is held out */

    struct toy_llama_config cfg = toy_llama_preset("tiny");
    cfg.vocab = 128;
    cfg.d_model = o.d;
    cfg.n_layers = o.layers;
    cfg.n_heads = o.d / 32;
    cfg.n_kv_heads = cfg.n_heads > 1 ? cfg.n_heads / 2 : 1;
    cfg.d_ff = 3 * o.d;
    cfg.max_ctx = o.T;
    struct toy_llama *m = toy_llama_new(&cfg, o.seed);
    if (!m) { fprintf(stderr, "toy demo: %s\n", toy_last_error()); free(text); return 1; }
    if (o.bf16) m->matmul_type = TOY_BF16; /* mixed precision: bf16 matmuls, f32 master weights */
    struct toy_threadpool *tp = toy_threadpool_new(o.threads);

    struct toy_ctx *ctx = toy_ctx_init(true);
    struct toy_tensor *tok = toy_new_tensor_2d(ctx, TOY_I32, o.T, o.B), *tgt = toy_new_tensor_2d(ctx, TOY_I32, o.T, o.B);
    struct toy_tensor *pos = toy_new_tensor_1d(ctx, TOY_I32, o.T);
    for (int t = 0; t < o.T; t++) ((int32_t *)pos->data)[t] = t;
    struct toy_tensor *loss = toy_cross_entropy(ctx, toy_llama_forward(ctx, m, tok, pos), tgt, -100);
    struct toy_graph *g = toy_graph_new(ctx);
    toy_graph_build(g, loss);
    toy_graph_backward(g, loss);
    struct toy_plan_info plan;
    if (toy_graph_plan(g, NULL, &plan)) { fprintf(stderr, "toy demo: %s\n", toy_last_error()); return 1; }

    struct toy_optim *opt = toy_optim_new(TOY_OPTIM_ADAMW);
    int decay = toy_optim_add_group(opt, &(struct toy_optim_group){.beta1 = 0.9f, .beta2 = 0.95f, .weight_decay = 0.1f});
    int nodecay = toy_optim_add_group(opt, &(struct toy_optim_group){.beta1 = 0.9f, .beta2 = 0.95f});
    for (int i = 0; i < toy_graph_n_params(g); i++) {
        struct toy_tensor *p = toy_graph_param(g, i);
        toy_optim_add_param(opt, p, p->n_dims >= 2 ? decay : nodecay); /* no decay on norm weights */
    }
    struct toy_lr_schedule sched = {TOY_LR_COSINE, o.lr, o.lr / 10, o.steps / 20, o.steps};

    printf("toy demo: a %lld-parameter character-level Llama (d %d, %d layers, %lld heads / %lld kv heads)\n"
           "          on %zu KB of generated sentences; %d steps of %d x %d tokens on %d threads (%s)\n"
           "          activation memory planned: %.1f MB (%.0f%% of the naive %.1f MB)\n",
           (long long)toy_llama_n_params(m), o.d, o.layers, (long long)cfg.n_heads, (long long)cfg.n_kv_heads,
           n_text / 1000, o.steps, o.B, o.T, toy_threadpool_size(tp),
           o.bf16 ? "AdamW, warmup + cosine, bf16 matmuls" : "AdamW, warmup + cosine",
           plan.peak_bytes / 1e6, 100.0 * (double)plan.peak_bytes / (double)plan.naive_bytes, plan.naive_bytes / 1e6);
    printf("          untrained loss would be ln(128) = %.3f per character\n", log(128.0));

    struct toy_rng r;
    toy_rng_seed(&r, o.seed + 1);
    struct toy_progress pb;
    toy_progress_start(&pb, "train", o.steps, "tok/s");
    float l = 0, first = 0;
    double t_start = toy_now();
    for (int step = 0; step < o.steps; step++) {
        for (int b = 0; b < o.B; b++) {
            size_t at = (size_t)toy_rng_below(&r, n_train - (size_t)o.T - 1);
            for (int t = 0; t < o.T; t++) {
                ((int32_t *)tok->data)[b * o.T + t] = (unsigned char)text[at + (size_t)t];
                ((int32_t *)tgt->data)[b * o.T + t] = (unsigned char)text[at + (size_t)t + 1];
            }
        }
        toy_optim_zero_grad(opt);
        if (toy_graph_compute(g, tp)) { fprintf(stderr, "\ntoy demo: %s\n", toy_last_error()); return 1; }
        l = *(float *)loss->data;
        if (step == 0) first = l;
        if (!isfinite(l)) { fprintf(stderr, "\ntoy demo: loss became %f at step %d\n", l, step); return 1; }
        float gn = toy_optim_clip_grad_norm(opt, 1.0f, tp);
        toy_optim_step(opt, toy_lr_at(&sched, step), tp);
        char extra[64];
        snprintf(extra, sizeof extra, "loss %.3f  grad %.2f", l, gn);
        toy_progress_update(&pb, step + 1, (double)(step + 1) * o.B * o.T, extra);
        if (!pb.tty && ((step + 1) % 100 == 0 || step == 0))
            printf("step %d: loss=%.4f\n", step + 1, l);
    }
    toy_progress_finish(&pb);
    double secs = toy_now() - t_start;

    /* held-out loss over windows of the last 10% (same graph; no optimizer step) */
    double ev = 0;
    int n_eval = 0;
    for (size_t at = n_train; at + (size_t)o.T * o.B + 1 < n_text && n_eval < 8; at += (size_t)o.T * o.B, n_eval++) {
        for (int b = 0; b < o.B; b++)
            for (int t = 0; t < o.T; t++) {
                size_t i = at + (size_t)b * o.T + (size_t)t;
                ((int32_t *)tok->data)[b * o.T + t] = (unsigned char)text[i];
                ((int32_t *)tgt->data)[b * o.T + t] = (unsigned char)text[i + 1];
            }
        toy_graph_compute(g, tp);
        ev += *(float *)loss->data;
    }
    printf("trained %d steps in %.1f s (%.0f tokens/s): train loss %.3f -> %.3f, held-out loss %.3f\n", o.steps,
           secs, o.steps * (double)o.B * o.T / secs, first, l, n_eval ? ev / n_eval : NAN);
    printf("sample (temperature 0.7):\n\n");
    sample(m, tp, "the ", 300, 0.7f, o.seed);

    toy_optim_free(opt);
    toy_ctx_free(ctx);
    toy_threadpool_free(tp);
    toy_llama_free(m);
    free(text);
    return 0;
}
