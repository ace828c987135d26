/* harness.c: see harness.h. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "toy/quant.h"
#include "toy/rng.h"
#include "toy/gguf.h"
#include "toy/tokenizer.h"

char th_dir[256];

void th_mkdir(const char *tag) {
    snprintf(th_dir, sizeof th_dir, "/tmp/toy-test-%s-XXXXXX", tag);
    cr_assert(mkdtemp(th_dir), "cannot make %s", th_dir);
}

void th_rmdir(void) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", th_dir);
    if (system(cmd)) {}
}

struct toy_tensor *th_weight(struct toy_ctx *ctx, enum toy_dtype type, int64_t k, int64_t n, float scale,
                             struct toy_rng *r) {
    float *f = malloc((size_t)(k * n) * sizeof *f);
    cr_assert_not_null(f);
    for (int64_t i = 0; i < k * n; i++) f[i] = toy_rng_normal(r) * scale;
    struct toy_tensor *w = toy_new_tensor_2d(ctx, type, k, n);
    for (int64_t j = 0; j < n; j++) {
        char *row = (char *)w->data + j * w->nb[1];
        switch (type) {
        case TOY_F32: memcpy(row, f + j * k, (size_t)k * sizeof(float)); break;
        case TOY_F16: toy_f32_to_f16_row(f + j * k, (toy_f16 *)row, k); break;
        case TOY_BF16: toy_f32_to_bf16_row(f + j * k, (toy_bf16 *)row, k); break;
        default: cr_assert_eq(toy_quantize_row(type, f + j * k, row, k), TOY_OK);
        }
    }
    free(f);
    return w;
}

json_t *th_torch(const char *script, json_t *cases) {
    char spec[400], out[400], cmd[1200];
    snprintf(spec, sizeof spec, "%s/spec.json", th_dir);
    snprintf(out, sizeof out, "%s/out.json", th_dir);
    json_t *root = json_pack("{s:o}", "cases", cases);
    cr_assert_eq(json_dump_file(root, spec, 0), 0);
    json_decref(root);
    const char *py = getenv("TOY_PY") ? getenv("TOY_PY") : "/usr/bin/python3";
    if (access(py, X_OK)) cr_skip_test("no %s for the PyTorch reference", py);
    snprintf(cmd, sizeof cmd, "%s tests/torch/%s '%s' '%s'", py, script, spec, out);
    cr_assert_eq(system(cmd), 0, "the PyTorch reference failed: %s", cmd);
    json_error_t err;
    json_t *res = json_load_file(out, 0, &err);
    cr_assert(res, "%s", err.text);
    return res;
}

float *th_logits(th_forward_fn fwd, void *model, const int32_t *tokens, int T, int B) {
    struct toy_ctx *ctx = toy_ctx_init(true);
    struct toy_tensor *tok = toy_new_tensor_2d(ctx, TOY_I32, T, B), *pos = toy_new_tensor_1d(ctx, TOY_I32, T);
    memcpy(tok->data, tokens, sizeof(int32_t) * (size_t)(T * B));
    for (int t = 0; t < T; t++) ((int32_t *)pos->data)[t] = t;
    struct toy_tensor *lg = fwd(ctx, model, tok, pos);
    toy_set_output(lg);
    struct toy_graph *g = toy_graph_new(ctx);
    toy_graph_build(g, lg);
    struct toy_threadpool *tp = toy_threadpool_new(2);
    cr_assert_eq(toy_graph_compute(g, tp), TOY_OK, "%s", toy_last_error());
    size_t n = (size_t)toy_nelements(lg);
    float *out = malloc(n * sizeof *out);
    memcpy(out, lg->data, n * sizeof *out);
    toy_threadpool_free(tp);
    toy_ctx_free(ctx);
    return out;
}

json_t *th_floats(const float *x, int64_t n) {
    json_t *a = json_array();
    for (int64_t i = 0; i < n; i++) json_array_append_new(a, json_real(x[i]));
    return a;
}

double th_worst_rel(const float *ours, json_t *ref) {
    double worst = 0;
    for (size_t k = 0; k < json_array_size(ref); k++) {
        double r = json_number_value(json_array_get(ref, k));
        double e = fabs(ours[k] - r) / (1 + fabs(r));
        if (e > worst || isnan(e)) worst = isnan(e) ? INFINITY : e;
    }
    return worst;
}

void th_train_vs_torch(struct toy_lm lm, const char *script, const char *gguf, int T, int B, int steps) {
    cr_assert(steps >= 1 && steps <= 64);
    struct toy_ctx *ctx = toy_ctx_init(true);
    struct toy_tensor *tok = toy_new_tensor_2d(ctx, TOY_I32, T, B), *tgt = toy_new_tensor_2d(ctx, TOY_I32, T, B);
    struct toy_tensor *pos = toy_new_tensor_1d(ctx, TOY_I32, T);
    for (int t = 0; t < T; t++) ((int32_t *)pos->data)[t] = t;
    struct toy_tensor *loss = toy_cross_entropy(ctx, lm.forward(lm.self, ctx, tok, pos), tgt, -100);
    struct toy_graph *g = toy_graph_new(ctx);
    toy_graph_build(g, loss);
    toy_graph_backward(g, loss);
    struct toy_optim *o = toy_optim_new(TOY_OPTIM_ADAMW);
    int grp = toy_optim_add_group(o, &(struct toy_optim_group){.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                                                               .weight_decay = 0.1f});
    for (int i = 0; i < lm.n_tensors(lm.self); i++) /* not a routing bias, which only chooses */
        if (lm.tensor(lm.self, i)->flags & TOY_FLAG_PARAM) toy_optim_add_param(o, lm.tensor(lm.self, i), grp);
    struct toy_threadpool *tp = toy_threadpool_new(2);
    struct toy_rng r;
    toy_rng_seed(&r, 3);
    json_t *batches = json_array();
    float losses[64] = {0};
    for (int s = 0; s < steps; s++) {
        json_t *bt = json_array(), *bg = json_array();
        for (int b = 0; b < B; b++) {
            json_t *rt = json_array(), *rg = json_array();
            for (int t = 0; t < T; t++) {
                int32_t a = (int32_t)toy_rng_below(&r, 61), y = (int32_t)toy_rng_below(&r, 61);
                ((int32_t *)tok->data)[b * T + t] = a;
                ((int32_t *)tgt->data)[b * T + t] = y;
                json_array_append_new(rt, json_integer(a));
                json_array_append_new(rg, json_integer(y));
            }
            json_array_append_new(bt, rt);
            json_array_append_new(bg, rg);
        }
        json_array_append_new(batches, json_pack("[o,o]", bt, bg));
        toy_optim_zero_grad(o);
        cr_assert_eq(toy_graph_compute(g, tp), TOY_OK, "%s", toy_last_error());
        losses[s] = *(float *)loss->data;
        toy_optim_step(o, 1e-3f, tp);
    }
    json_t *spec = json_array();
    json_array_append_new(spec, json_pack("{s:s,s:{s:i,s:f,s:f,s:f,s:f,s:f,s:o}}", "gguf", gguf, "train", "steps",
                                          steps, "lr", 1e-3, "beta1", 0.9, "beta2", 0.95, "eps", 1e-8, "wd", 0.1,
                                          "batches", batches));
    json_t *res = th_torch(script, spec);
    json_t *ref = json_object_get(json_array_get(json_object_get(res, "cases"), 0), "losses");
    double worst = 0;
    for (int s = 0; s < steps; s++) {
        double rv = json_number_value(json_array_get(ref, (size_t)s));
        worst = fmax(worst, fabs(losses[s] - rv) / (1 + fabs(rv)));
    }
    cr_log_info("%s: %d AdamW steps: loss %.4f -> %.4f, max |toy - torch| / (1 + |torch|) = %.2e", script, steps,
                losses[0], losses[steps - 1], worst);
    cr_assert_leq(worst, 1e-4);
    cr_assert_lt(losses[steps - 1], losses[0]);
    json_decref(res);
    toy_optim_free(o);
    toy_threadpool_free(tp);
    toy_ctx_free(ctx);
}

double th_kv_decode_vs_full(th_cached_fn fwd, void *model, struct toy_kv_cache *kv, const int32_t *tokens, int T,
                            int P, int64_t V, const float *full) {
    struct toy_threadpool *tp = toy_threadpool_new(2);
    double worst = 0;
    for (int phase = 0; phase < 2; phase++) {
        int tn = phase == 0 ? P : 1;
        struct toy_ctx *ctx = toy_ctx_init(true);
        struct toy_tensor *tok = toy_new_tensor_2d(ctx, TOY_I32, tn, 1), *pos = toy_new_tensor_1d(ctx, TOY_I32, tn);
        struct toy_tensor *lg = fwd(ctx, model, kv, tok, pos);
        toy_set_output(lg);
        struct toy_graph *g = toy_graph_new(ctx);
        toy_graph_build(g, lg);
        for (int start = phase == 0 ? 0 : P; start < (phase == 0 ? 1 : T); start++) {
            int n0 = phase == 0 ? 0 : start;
            *(int32_t *)kv->n_past->data = n0;
            for (int i = 0; i < tn; i++) {
                ((int32_t *)tok->data)[i] = tokens[n0 + i];
                ((int32_t *)pos->data)[i] = n0 + i;
            }
            cr_assert_eq(toy_graph_compute(g, tp), TOY_OK, "%s", toy_last_error());
            for (int i = 0; i < tn; i++)
                for (int64_t v = 0; v < V; v++) {
                    double a = ((float *)lg->data)[i * V + v], b = full[(n0 + i) * V + v];
                    worst = fmax(worst, fabs(a - b) / (1 + fabs(b)));
                }
        }
        toy_ctx_free(ctx);
    }
    toy_threadpool_free(tp);
    return worst;
}

void th_save_llama(struct toy_llama *m, enum toy_dtype type, const char *path) {
    th_save_llama_tok(m, NULL, type, path);
}

void th_save_llama_tok(struct toy_llama *m, const struct toy_tokenizer *tok, enum toy_dtype type, const char *path) {
    struct toy_lm lm = toy_llama_lm(m);
    th_save_lm_tok(&lm, tok, type, path);
}

void th_save_lm(const struct toy_lm *lm, enum toy_dtype type, const char *path) { th_save_lm_tok(lm, NULL, type, path); }

void th_save_lm_tok(const struct toy_lm *lm, const struct toy_tokenizer *tok, enum toy_dtype type, const char *path) {
    struct toy_gguf_writer *w;
    cr_assert_eq(toy_gguf_writer_init(&w), TOY_OK);
    cr_assert_eq(lm->write_gguf(lm->self, w, type), TOY_OK, "%s", toy_last_error());
    if (tok) cr_assert_eq(toy_tokenizer_write_gguf(tok, w), TOY_OK, "%s", toy_last_error());
    cr_assert_eq(toy_gguf_writer_write(w, path), TOY_OK, "%s", toy_last_error());
    toy_gguf_writer_free(w);
}

void th_retype_gguf(const char *in, const char *out, const char *part, enum toy_dtype type) {
    struct toy_gguf *g;
    cr_assert_eq(toy_gguf_open(in, &g), TOY_OK, "%s", toy_last_error());
    struct toy_gguf_writer *w;
    cr_assert_eq(toy_gguf_writer_init(&w), TOY_OK);
    for (int64_t i = 0; i < toy_gguf_n_kv(g); i++) toy_gguf_writer_copy_kv(w, g, i);
    toy_gguf_writer_remove(w, "general.file_type");
    int64_t n = toy_gguf_n_tensors(g);
    void **bufs = calloc((size_t)n, sizeof *bufs);
    for (int64_t i = 0; i < n; i++) {
        const struct toy_gguf_tensor *t = toy_gguf_tensor(g, i);
        int nd = t->n_dims < 1 ? 1 : t->n_dims;
        if (part && !strstr(t->name, part)) {
            cr_assert_eq(toy_gguf_writer_add_tensor(w, t->name, t->type, nd, t->ne, t->data), TOY_OK, "%s",
                         toy_last_error());
            continue;
        }
        float *f = malloc((size_t)t->n_elements * sizeof(float));
        cr_assert_eq(toy_gguf_tensor_read_f32(g, i, f, t->n_elements), TOY_OK, "%s", toy_last_error());
        if (type == TOY_F32) {
            bufs[i] = f;
        } else {
            bufs[i] = malloc(toy_row_bytes(type, t->ne[0]) * (size_t)(t->n_elements / t->ne[0]));
            cr_assert_eq(toy_quantize_row(type, f, bufs[i], t->n_elements), TOY_OK, "%s: %s", t->name,
                         toy_last_error());
            free(f);
        }
        cr_assert_eq(toy_gguf_writer_add_tensor(w, t->name, type, nd, t->ne, bufs[i]), TOY_OK, "%s", toy_last_error());
    }
    cr_assert_eq(toy_gguf_writer_write(w, out), TOY_OK, "%s", toy_last_error());
    toy_gguf_writer_free(w);
    for (int64_t i = 0; i < n; i++) free(bufs[i]);
    free(bufs);
    toy_gguf_close(g);
}

bool th_log_token(void *ud, int32_t id, const char *text, size_t len, float lp) {
    (void)text, (void)len;
    struct th_gen_log *g = ud;
    if (id >= 0 && g->n < 64) g->ids[g->n] = id, g->lps[g->n++] = lp;
    return true;
}

bool th_files_equal(const char *a, const char *b) {
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    bool eq = fa && fb;
    while (eq) {
        int ca = fgetc(fa), cb = fgetc(fb);
        if (ca != cb) eq = false;
        if (ca == EOF || cb == EOF) break;
    }
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    return eq;
}

/* ---- a scripted model (harness.h) ---- */

static bool is_control(const char *t) {
    size_t n = strlen(t);
    return n > 4 && !strncmp(t, "<|", 2) && !strcmp(t + n - 2, "|>");
}

void th_script_model_write(const struct th_script_model *sm, const char *path) {
    char *tokens[512];
    int32_t types[512];
    int V = 0, succ[512];
    for (int b = 0, extra = 0; b < 256; b++) { /* GPT-2's bytes_to_unicode */
        int cp = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174) ? b : 256 + extra++;
        char u[4] = {0};
        if (cp < 0x80) u[0] = (char)cp;
        else u[0] = (char)(0xC0 | cp >> 6), u[1] = (char)(0x80 | (cp & 63));
        types[V] = TOY_TOKEN_NORMAL;
        tokens[V++] = strdup(u);
    }
    int first[3];
    for (int s = 0; s < 3 && sm->scripts[s]; s++) {
        first[s] = V;
        for (const char *const *t = sm->scripts[s]; *t; t++) {
            types[V] = is_control(*t) ? TOY_TOKEN_CONTROL : TOY_TOKEN_USER_DEFINED;
            tokens[V++] = strdup(*t);
        }
    }
    int eos = V;
    const char *ends[] = {"<|eos|>", "<|return|>", "<|call|>"};
    for (int k = 0; k < 3; k++) types[V] = TOY_TOKEN_CONTROL, tokens[V++] = strdup(ends[k]);
    for (int k = 0; k < 3; k++)
        if (!strcmp(ends[k], sm->eos)) eos = V - 3 + k;
    for (int v = 0; v < V; v++) succ[v] = eos;
    for (int s = 0; s < 3 && sm->scripts[s]; s++) {
        char go[32];
        snprintf(go, sizeof go, "<|go%d|>", s + 1);
        types[V] = TOY_TOKEN_CONTROL;
        tokens[V] = strdup(go);
        succ[V++] = first[s];
        int k = first[s];
        for (const char *const *t = sm->scripts[s]; t[1]; t++, k++) succ[k] = k + 1;
    }
    struct toy_tokenizer_spec spec = {.kind = TOY_TOKENIZER_BPE, .n_tokens = V, .tokens = (const char *const *)tokens,
                                      .types = types, .pre = "gpt-2", .bos = -1, .eos = eos, .unk = -1, .pad = -1,
                                      .eot = -1, .chat_template = sm->tmpl, .add_eos = sm->add_eos};
    struct toy_tokenizer *tok;
    cr_assert_eq(toy_tokenizer_init(&spec, &tok), TOY_OK, "%s", toy_last_error());
    struct toy_llama_config c = toy_llama_preset("tiny");
    c.vocab = V;
    c.d_model = (V + 15) / 16 * 16;
    c.n_layers = 1, c.n_heads = 1, c.n_kv_heads = 1, c.d_ff = 16, c.max_ctx = 1024, c.tied = false;
    struct toy_llama *m = toy_llama_new(&c, 1);
    cr_assert(m, "%s", toy_last_error());
    int64_t d = c.d_model;
    float *emb = m->tok_embd->data, *out = m->output->data;
    memset(emb, 0, (size_t)(d * V) * sizeof(float));
    memset(out, 0, (size_t)(d * V) * sizeof(float));
    for (int v = 0; v < V; v++) emb[v * d + v] = 1, out[succ[v] * d + v] = 10;
    memset(m->layers[0].wo->data, 0, toy_nbytes(m->layers[0].wo));
    memset(m->layers[0].w_down->data, 0, toy_nbytes(m->layers[0].w_down));
    struct toy_gguf_writer *w;
    cr_assert_eq(toy_gguf_writer_init(&w), TOY_OK);
    cr_assert_eq(toy_llama_write_gguf(m, w, TOY_F32), TOY_OK, "%s", toy_last_error());
    cr_assert_eq(toy_tokenizer_write_gguf(tok, w), TOY_OK, "%s", toy_last_error());
    cr_assert_eq(toy_gguf_writer_write(w, path), TOY_OK, "%s", toy_last_error());
    toy_gguf_writer_free(w);
    toy_llama_free(m);
    toy_tokenizer_free(tok);
    for (int v = 0; v < V; v++) free(tokens[v]);
}
