/* test-warm-start.c: warm start through a learned projection
 * (src/train/warm-start.c, src/models/llama-embd-proj.c) when the donor and
 * the model differ in width: the projection P gets the gradient the loss
 * has (central differences), the saved model is a plain GGUF that toy loads
 * and that computes the same logits, and on a small synthetic task a model
 * warm-started from an informative donor reaches a lower loss than a random
 * init (and than the fixed PCA embedding) in the same number of steps. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "toy/finetune.h"
#include "toy/gguf.h"
#include "toy/rng.h"
#include "toy/toy.h"
#include "harness.h"

enum { V = 64, CLASSES = 8, DD = 48, MD = 32 };

static int class_of(int tok) { return tok % CLASSES; }

static struct toy_llama_config model_config(int64_t d) {
    struct toy_llama_config c = toy_llama_preset("tiny");
    c.vocab = V;
    c.d_model = d;
    c.n_heads = 2;
    c.n_kv_heads = 1;
    c.d_ff = 2 * d;
    c.n_layers = 2;
    c.max_ctx = 32;
    return c;
}

/* a donor of width DD whose embeddings know each token's class: a class
 * direction plus a little per-token noise; no tokenizer (same vocabulary,
 * so tokens match by id) */
static void write_donor(const char *path) {
    struct toy_llama_config c = model_config(DD);
    c.n_heads = 4;
    c.n_kv_heads = 2;
    struct toy_llama *d = toy_llama_new(&c, 3);
    struct toy_rng r;
    toy_rng_seed(&r, 4);
    float dir[CLASSES][DD];
    for (int k = 0; k < CLASSES; k++)
        for (int j = 0; j < DD; j++) dir[k][j] = toy_rng_normal(&r);
    float *e = d->tok_embd->data;
    for (int i = 0; i < V; i++)
        for (int j = 0; j < DD; j++) e[i * DD + j] = dir[class_of(i)][j] + 0.1f * toy_rng_normal(&r);
    th_save_llama(d, TOY_F32, path);
    toy_llama_free(d);
}

struct run {
    struct toy_ctx *ctx;
    struct toy_tensor *tok, *tgt, *loss, *logits;
    struct toy_graph *g;
    struct toy_threadpool *tp;
};

/* the task: at each position, predict the class (as token id 0..7) of the
 * token two positions back (so attention, not just the embedding, is needed) */
static void make_batch(struct toy_rng *r, int32_t *x, int32_t *y, int64_t n, int64_t T) {
    for (int64_t i = 0; i < n; i++) {
        x[i] = (int32_t)toy_rng_below(r, V);
        y[i] = i % T >= 2 ? class_of(x[i - 2]) : -100;
    }
}

static void run_init(struct run *rn, struct toy_llama *m, int64_t T, int64_t B, bool backward) {
    rn->ctx = toy_ctx_init(true);
    rn->tok = toy_new_tensor_2d(rn->ctx, TOY_I32, T, B);
    rn->tgt = toy_new_tensor_2d(rn->ctx, TOY_I32, T, B);
    struct toy_tensor *pos = toy_new_tensor_1d(rn->ctx, TOY_I32, T);
    for (int64_t t = 0; t < T; t++) ((int32_t *)pos->data)[t] = (int32_t)t;
    rn->logits = toy_llama_forward(rn->ctx, m, rn->tok, pos);
    toy_set_output(rn->logits);
    rn->loss = toy_cross_entropy(rn->ctx, rn->logits, rn->tgt, -100);
    rn->g = toy_graph_new(rn->ctx);
    toy_graph_build(rn->g, rn->loss);
    if (backward) toy_graph_backward(rn->g, rn->loss);
    rn->tp = toy_threadpool_new(2);
}

static void run_free(struct run *rn) {
    for (int i = 0; i < toy_graph_n_params(rn->g); i++) toy_graph_param(rn->g, i)->grad = NULL; /* in ctx */
    toy_threadpool_free(rn->tp);
    toy_ctx_free(rn->ctx);
}

static float run_loss(struct run *rn) {
    cr_assert_eq(toy_graph_compute(rn->g, rn->tp), TOY_OK, "%s", toy_last_error());
    return *(float *)rn->loss->data;
}

Test(warm_start, projection_gradient_matches_finite_differences, .timeout = 60) {
    th_mkdir("ws");
    char donor[400];
    snprintf(donor, sizeof donor, "%s/donor.gguf", th_dir);
    write_donor(donor);
    struct toy_llama_config c = model_config(MD);
    struct toy_llama *m = toy_llama_new(&c, 9);
    struct toy_warm_start_report rep;
    cr_assert_eq(toy_llama_warm_start(m, NULL, donor, &rep), TOY_OK, "%s", toy_last_error());
    cr_assert(rep.projected && rep.learned && rep.mapped == V);
    struct toy_tensor *P = m->embd_proj;
    cr_assert(P && P->ne[0] == MD && P->ne[1] == DD && (P->flags & TOY_FLAG_PARAM));
    cr_assert_eq(toy_llama_tensor(m, toy_llama_n_tensors(m) - 1), P, "P is the last tensor of the list");
    struct run rn;
    run_init(&rn, m, 16, 2, true);
    struct toy_rng r;
    toy_rng_seed(&r, 5);
    make_batch(&r, rn.tok->data, rn.tgt->data, 32, 16);
    toy_graph_zero_grads(rn.g);
    run_loss(&rn);
    cr_assert(P->grad, "P got no gradient");
    int64_t n = toy_nelements(P);
    float *g = malloc((size_t)n * sizeof *g), *pd = P->data;
    memcpy(g, P->grad->data, (size_t)n * sizeof *g);
    double gmax = 0;
    for (int64_t i = 0; i < n; i++) gmax = fmax(gmax, fabs(g[i]));
    cr_assert_gt(gmax, 0, "P's gradient is zero");
    int bad = 0, checked = 0;
    for (int64_t i = 0; i < n; i += 97) {
        float x0 = pd[i], h = 1e-2f;
        pd[i] = x0 + h;
        double lp = run_loss(&rn);
        pd[i] = x0 - h;
        double lm = run_loss(&rn);
        pd[i] = x0;
        double fd = (lp - lm) / (2 * h);
        if (fabs(fd - g[i]) > 2e-2 * fabs(g[i]) + 2e-3 * gmax + 1e-6 * (fabs(lp) + fabs(lm)) / h) {
            cr_log_error("dL/dP[%lld]: backward %g, finite difference %g", (long long)i, g[i], fd);
            bad++;
        }
        checked++;
    }
    cr_assert_eq(bad, 0, "%d of %d finite-difference checks of P failed", bad, checked);
    free(g);
    run_free(&rn);
    toy_llama_free(m);
    th_rmdir();
}

Test(warm_start, saved_model_is_a_plain_gguf_with_the_same_logits, .timeout = 60) {
    th_mkdir("ws");
    char donor[400], out[400];
    snprintf(donor, sizeof donor, "%s/donor.gguf", th_dir);
    snprintf(out, sizeof out, "%s/model.gguf", th_dir);
    write_donor(donor);
    struct toy_llama_config c = model_config(MD);
    struct toy_llama *m = toy_llama_new(&c, 9);
    cr_assert_eq(toy_llama_warm_start(m, NULL, donor, NULL), TOY_OK, "%s", toy_last_error());
    /* move P and the residual away from their start so the fold has work to do */
    struct toy_rng r;
    toy_rng_seed(&r, 8);
    float *pd = m->embd_proj->data, *ed = m->tok_embd->data;
    for (int64_t i = 0; i < toy_nelements(m->embd_proj); i++) pd[i] += 0.05f * toy_rng_normal(&r);
    for (int64_t i = 0; i < toy_nelements(m->tok_embd); i++) ed[i] += 0.01f * toy_rng_normal(&r);
    th_save_llama(m, TOY_F32, out);
    /* plain: no projection tensor, token_embd of the model's width */
    struct toy_gguf *g;
    cr_assert_eq(toy_gguf_open(out, &g), TOY_OK, "%s", toy_last_error());
    cr_assert_lt(toy_gguf_find_tensor(g, "token_embd_proj.weight"), 0);
    int64_t ti = toy_gguf_find_tensor(g, "token_embd.weight");
    cr_assert_geq(ti, 0);
    cr_assert(toy_gguf_tensor(g, ti)->ne[0] == MD && toy_gguf_tensor(g, ti)->ne[1] == V);
    toy_gguf_close(g);
    struct toy_llama *l;
    cr_assert_eq(toy_llama_load(out, false, &l), TOY_OK, "%s", toy_last_error());
    cr_assert(!l->embd_proj);
    cr_assert_eq(toy_llama_n_tensors(l), toy_llama_n_tensors(m) - 1);
    struct run a, b;
    run_init(&a, m, 16, 2, false);
    run_init(&b, l, 16, 2, false);
    make_batch(&r, a.tok->data, a.tgt->data, 32, 16);
    memcpy(b.tok->data, a.tok->data, 32 * sizeof(int32_t));
    memcpy(b.tgt->data, a.tgt->data, 32 * sizeof(int32_t));
    run_loss(&a);
    run_loss(&b);
    double worst = 0;
    for (int64_t i = 0; i < toy_nelements(a.logits); i++) {
        float x = ((float *)a.logits->data)[i], y = ((float *)b.logits->data)[i];
        worst = fmax(worst, fabs(x - y) / (1 + fabs(y)));
    }
    cr_assert_leq(worst, 1e-5, "logits of the saved model differ by %g", worst);
    run_free(&a);
    run_free(&b);
    toy_llama_free(l);
    toy_llama_free(m);
    th_rmdir();
}

/* AdamW (lr 1e-2) over every trainable tensor of m for `steps` steps on the task;
 * returns the mean loss of the last 10 steps */
static double train(struct toy_llama *m, int steps) {
    const int64_t T = 16, B = 8;
    struct run rn;
    run_init(&rn, m, T, B, true);
    struct toy_optim *o = toy_optim_new(TOY_OPTIM_ADAMW);
    int grp = toy_optim_add_group(o, &(struct toy_optim_group){.beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f});
    for (int i = 0; i < toy_llama_n_tensors(m); i++) {
        struct toy_tensor *p = toy_llama_tensor(m, i);
        if ((p->flags & TOY_FLAG_PARAM) && p->grad) toy_optim_add_param(o, p, grp);
    }
    struct toy_rng r;
    toy_rng_seed(&r, 99); /* the same batches for every init */
    double tail = 0;
    for (int s = 0; s < steps; s++) {
        make_batch(&r, rn.tok->data, rn.tgt->data, T * B, T);
        toy_optim_zero_grad(o);
        float l = run_loss(&rn);
        cr_assert(isfinite(l));
        toy_optim_step(o, 1e-2f, rn.tp);
        if (s >= steps - 10) tail += l / 10.0;
    }
    toy_optim_free(o);
    run_free(&rn);
    return tail;
}

Test(warm_start, learned_projection_trains_faster_than_random_init, .timeout = 120) {
    th_mkdir("ws");
    char donor[400];
    snprintf(donor, sizeof donor, "%s/donor.gguf", th_dir);
    write_donor(donor);
    struct toy_llama_config c = model_config(MD);
    const int steps = 120;
    struct toy_llama *cold = toy_llama_new(&c, 9);
    double lc = train(cold, steps);
    struct toy_llama *fixed = toy_llama_new(&c, 9);
    cr_assert_eq(toy_llama_warm_start(fixed, NULL, donor, NULL), TOY_OK, "%s", toy_last_error());
    toy_llama_embd_proj_fold(fixed); /* the PCA embedding, no projection left to learn */
    double lf = train(fixed, steps);
    struct toy_llama *warm = toy_llama_new(&c, 9);
    cr_assert_eq(toy_llama_warm_start(warm, NULL, donor, NULL), TOY_OK, "%s", toy_last_error());
    float *p0 = malloc(toy_nbytes(warm->embd_proj));
    memcpy(p0, warm->embd_proj->data, toy_nbytes(warm->embd_proj));
    double lw = train(warm, steps);
    double moved = 0;
    for (int64_t i = 0; i < toy_nelements(warm->embd_proj); i++)
        moved = fmax(moved, fabs(((float *)warm->embd_proj->data)[i] - p0[i]));
    fprintf(stderr, "warm_start: loss after %d steps (mean of the last 10): random init %.4f, fixed PCA %.4f, "
            "learned projection %.4f (P moved by up to %.3g); chance is ln 8 = %.4f\n", steps, lc, lf, lw, moved,
            log(8.0));
    cr_assert_gt(moved, 1e-3, "P did not train");
    cr_assert_lt(lw, lc, "warm start %g is not below the random init %g", lw, lc);
    cr_assert_lt(lw, lf, "the learned projection %g is not below the fixed PCA embedding %g", lw, lf);
    free(p0);
    toy_llama_free(cold);
    toy_llama_free(fixed);
    toy_llama_free(warm);
    th_rmdir();
}

/* `toy train --resume` of a run warm-started across widths continues
 * exactly: the checkpoint holds the folded table, the state file the
 * projection and the residual, and resuming re-attaches the projection from
 * the donor. A 16-step run checkpointed at 8 and resumed from 8 ends with
 * the same weights file, to the bit. */
Test(warm_start, resume_of_a_projected_run_is_bit_identical, .timeout = 300) {
    th_mkdir("ws");
    const char *bin = getenv("TOY_BIN") ? getenv("TOY_BIN") : "build/toy";
    char text[300], cmd[4000];
    snprintf(text, sizeof text, "%s/text.txt", th_dir);
    FILE *f = fopen(text, "w");
    cr_assert(f);
    const char *words[] = {"the", "cat", "sat", "on", "a", "red", "mat", "and", "dog", "ran", "to", "big", "tree"};
    struct toy_rng r;
    toy_rng_seed(&r, 8);
    for (int i = 0; i < 3000; i++) fprintf(f, "%s%s", words[toy_rng_below(&r, 13)], i % 12 == 11 ? ".\n" : " ");
    fclose(f);
    /* the donor: 48 wide, with its own BPE vocabulary; the runs: 32 wide,
     * same tokenizer, so every token is matched */
    const char *common = "--preset tiny --layers 2 --heads 2 --kv-heads 1 --ff 64 --batch 4 --ctx 32 --eval-every 0 "
                         "--threads 2 --seed 5 --json";
    snprintf(cmd, sizeof cmd,
             "%s train --data '%s' --vocab-size 300 %s --dim 48 --steps 3 --out '%s/donor' > /dev/null 2>&1 && "
             "%s train --data '%s' --tokenizer '%s/donor/weights/step_3.gguf' --warm-start '%s/donor/weights/step_3.gguf' %s "
             "--dim 32 --steps 16 --ckpt-every 8 --out '%s/run' > /dev/null 2>&1 && cd '%s/run/weights' && "
             "mv step_16.gguf straight.gguf && rm step_16.state.gguf && ln -sfn step_8.gguf latest && cd - > /dev/null && "
             "%s train --resume '%s/run' --json > /dev/null 2>&1",
             bin, text, common, th_dir, bin, text, th_dir, th_dir, common, th_dir, th_dir, bin, th_dir);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    char a[400], b[400];
    snprintf(a, sizeof a, "%s/run/weights/straight.gguf", th_dir);
    snprintf(b, sizeof b, "%s/run/weights/step_16.gguf", th_dir);
    cr_assert(th_files_equal(a, b), "the resumed warm-started run differs from the uninterrupted one");
    /* the state file carries the projection */
    struct toy_gguf *g;
    snprintf(a, sizeof a, "%s/run/weights/step_8.state.gguf", th_dir);
    cr_assert_eq(toy_gguf_open(a, &g), TOY_OK, "%s", toy_last_error());
    cr_assert_geq(toy_gguf_find_tensor(g, "toy.param.token_embd_proj.weight"), 0);
    cr_assert_geq(toy_gguf_find_tensor(g, "toy.param.token_embd.weight"), 0);
    toy_gguf_close(g);
    th_rmdir();
}
