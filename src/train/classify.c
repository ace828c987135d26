/* classify.c: the image-classification training loop for ViT
 * (toy/classify.h). One training graph (forward, cross-entropy, backward)
 * and one forward-only evaluation graph are built once for the batch size
 * and planned once; nothing is allocated per step.
 * AdamW follows torch.optim.AdamW (toy/optim.h) with two groups, as timm
 * does: weight decay on the 2-D weights only. The step's learning rate is
 * toy_lr_at(step) (linear warmup, then cosine to lr_min). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "toy/classify.h"
#include "toy/gguf.h"
#include "toy/graph.h"
#include "toy/run-dir.h"

struct toy_classifier {
    struct toy_vit *m;
    const struct toy_image_set *train, *test;
    struct toy_classify_opts o;
    char run_dir[1024];
    struct toy_events *ev;
    struct toy_threadpool *tp;
    struct toy_ctx *ctx;
    struct toy_graph *g, *eg;           /* training graph, evaluation graph */
    struct toy_tensor *img, *lab, *loss, *eimg, *elogits;
    struct toy_membuf buf, ebuf;        /* the training and evaluation graphs' memory */
    struct toy_optim *opt;
    struct toy_rng rng;                 /* batch sampler and augmentation */
    int64_t step;
    float last_loss;
    int64_t *idx;                       /* (batch) */
    char last_ckpt[1200];
    toy_classify_step_fn fn;
    void *ud;
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static bool same_shape(const struct toy_vit_config *c, const struct toy_image_set *s) {
    return s->channels == c->channels && s->height == c->image_h && s->width == c->image_w;
}

/* Mean loss and correct predictions over images [first, first + n) of s,
 * through the forward-only graph of batch B (a short last batch repeats its
 * first image and counts only the real ones). */
/* The model's class of each of the set's classes: by name when both have names (class folders: the set's folder
 * order need not be the model's), else the same index, which must be one of the model's. */
static enum toy_status class_map(const struct toy_vit *m, const struct toy_image_set *s, int32_t *map) {
    const int64_t K = m->cfg.n_classes;
    for (int64_t i = 0; i < s->n_classes; i++) {
        if (s->class_names && m->class_names) {
            int64_t j = 0;
            while (j < K && strcmp(s->class_names[i], m->class_names[j])) j++;
            if (j == K)
                return toy_error(TOY_ERR_INVALID_ARG, "evaluate: class '%s' of the images is not one of the model's %lld",
                                 s->class_names[i], (long long)K);
            map[i] = (int32_t)j;
        } else if (i >= K) {
            return toy_error(TOY_ERR_INVALID_ARG, "evaluate: the images have %lld classes, the model %lld",
                             (long long)s->n_classes, (long long)K);
        } else {
            map[i] = (int32_t)i;
        }
    }
    return TOY_OK;
}

static enum toy_status eval_graph(struct toy_vit *m, const struct toy_image_set *s, struct toy_graph *g,
                                  struct toy_tensor *img, struct toy_tensor *logits, struct toy_threadpool *tp,
                                  int64_t *idx, double *loss_sum, int64_t *correct) {
    const int64_t B = img->ne[3], K = m->cfg.n_classes;
    int32_t *lab = malloc((size_t)B * sizeof *lab), *map = malloc((size_t)(s->n_classes + 1) * sizeof *map);
    if (!lab || !map) { free(lab); free(map); return toy_error(TOY_ERR_NOMEM, "evaluation"); }
    enum toy_status st = class_map(m, s, map);
    for (int64_t first = 0; first < s->n && !st; first += B) {
        int64_t n = s->n - first < B ? s->n - first : B;
        for (int64_t b = 0; b < B; b++) idx[b] = first + (b < n ? b : 0);
        toy_images_batch(s, idx, B, m->mean, m->std, NULL, NULL, img->data, lab);
        for (int64_t b = 0; b < n; b++) {
            if (lab[b] < 0 || lab[b] >= s->n_classes) {
                st = toy_error(TOY_ERR_FORMAT, "evaluate: image %lld has label %d of %lld classes",
                               (long long)idx[b], (int)lab[b], (long long)s->n_classes);
                break;
            }
            lab[b] = map[lab[b]];
        }
        if (st || (st = toy_graph_compute(g, tp))) break;
        const float *lg = logits->data; /* (B, K) */
        for (int64_t b = 0; b < n; b++) {
            const float *row = lg + b * K;
            int64_t best = 0;
            float mx = row[0];
            for (int64_t k = 1; k < K; k++)
                if (row[k] > mx) mx = row[k], best = k;
            double se = 0;
            for (int64_t k = 0; k < K; k++) se += exp((double)row[k] - mx);
            *loss_sum += log(se) + mx - row[lab[b]];
            *correct += best == lab[b];
        }
    }
    free(lab);
    free(map);
    return st;
}

enum toy_status toy_vit_evaluate(struct toy_vit *m, const struct toy_image_set *s, int64_t batch,
                                 struct toy_threadpool *tp, float *loss, float *acc) {
    const struct toy_vit_config *c = &m->cfg;
    if (!same_shape(c, s))
        return toy_error(TOY_ERR_SHAPE, "evaluate: images are %lldx%lldx%lld, the model takes %lldx%lldx%lld",
                         (long long)s->channels, (long long)s->height, (long long)s->width, (long long)c->channels,
                         (long long)c->image_h, (long long)c->image_w);
    if (batch <= 0) batch = 64;
    struct toy_ctx *ctx = toy_ctx_init(true);
    int64_t *idx = malloc((size_t)batch * sizeof *idx);
    if (!ctx || !idx) { toy_ctx_free(ctx); free(idx); return toy_error(TOY_ERR_NOMEM, "evaluate"); }
    struct toy_tensor *img = toy_new_tensor_4d(ctx, TOY_F32, c->image_w, c->image_h, c->channels, batch);
    struct toy_tensor *lg = toy_vit_forward(ctx, m, img);
    toy_set_output(lg);
    struct toy_graph *g = toy_graph_new(ctx);
    toy_graph_build(g, lg);
    double ls = 0;
    int64_t correct = 0;
    enum toy_status st = eval_graph(m, s, g, img, lg, tp, idx, &ls, &correct);
    if (loss) *loss = s->n ? (float)(ls / (double)s->n) : NAN;
    if (acc) *acc = s->n ? (float)correct / (float)s->n : NAN;
    free(idx);
    toy_ctx_free(ctx);
    return st;
}

enum toy_status toy_classifier_new(struct toy_vit *m, const struct toy_image_set *train,
                                   const struct toy_image_set *test, const struct toy_classify_opts *o,
                                   const char *run_dir, struct toy_events *ev, int n_threads,
                                   struct toy_classifier **out) {
    if (!out) return toy_error(TOY_ERR_INVALID_ARG, "toy_classifier_new: out is NULL");
    *out = NULL;
    enum toy_status cst = toy_optim_check_settings(o->lr, o->lr_min, o->weight_decay, o->beta1, o->beta2, o->eps, o->clip);
    if (cst) return cst;
    const struct toy_vit_config *c = &m->cfg;
    if (!same_shape(c, train) || (test && !same_shape(c, test)))
        return toy_error(TOY_ERR_SHAPE, "classifier: images are %lldx%lldx%lld (C x H x W), the model takes "
                         "%lldx%lldx%lld", (long long)train->channels, (long long)train->height,
                         (long long)train->width, (long long)c->channels, (long long)c->image_h, (long long)c->image_w);
    if (train->n_classes > c->n_classes)
        return toy_error(TOY_ERR_RANGE, "classifier: the images have %lld classes, the model %lld",
                         (long long)train->n_classes, (long long)c->n_classes);
    if (o->batch <= 0 || o->steps < 0 || train->n <= 0)
        return toy_error(TOY_ERR_INVALID_ARG, "classifier: batch %lld, steps %lld, %lld training images",
                         (long long)o->batch, (long long)o->steps, (long long)train->n);
    struct toy_classifier *t = calloc(1, sizeof *t);
    if (!t) return toy_error(TOY_ERR_NOMEM, "classifier");
    t->m = m, t->train = train, t->test = test, t->o = *o, t->ev = ev;
    if (run_dir) snprintf(t->run_dir, sizeof t->run_dir, "%s", run_dir);
    t->tp = toy_threadpool_new(n_threads);
    t->ctx = toy_ctx_init(true);
    t->idx = malloc((size_t)o->batch * sizeof *t->idx);
    t->opt = toy_optim_new(TOY_OPTIM_ADAMW);
    if (!t->tp || !t->ctx || !t->idx || !t->opt) { toy_classifier_free(t); return toy_error(TOY_ERR_NOMEM, "classifier"); }
    toy_rng_seed(&t->rng, o->seed);
    bool unset = true;
    for (int64_t k = 0; k < c->channels; k++) unset = unset && m->mean[k] == 0.0f && m->std[k] == 1.0f;
    if (unset) toy_images_stats(train, m->mean, m->std);
    if (!m->class_names && train->class_names && train->n_classes == c->n_classes)
        toy_vit_set_class_names(m, train->class_names);
    int64_t B = o->batch;
    t->img = toy_set_name(toy_new_tensor_4d(t->ctx, TOY_F32, c->image_w, c->image_h, c->channels, B), "images");
    t->lab = toy_set_name(toy_new_tensor_1d(t->ctx, TOY_I32, B), "labels");
    t->loss = toy_set_name(toy_cross_entropy(t->ctx, toy_vit_forward(t->ctx, m, t->img), t->lab, -100), "loss");
    t->g = toy_graph_new(t->ctx);
    toy_graph_build(t->g, t->loss);
    toy_graph_backward(t->g, t->loss);
    /* evaluation in batches of at most the test set: a batch bigger than it would compute padding */
    int64_t eB = test && test->n > 0 && test->n < B ? test->n : B;
    t->eimg = toy_set_name(toy_new_tensor_4d(t->ctx, TOY_F32, c->image_w, c->image_h, c->channels, eB), "eval_images");
    t->elogits = toy_vit_forward(t->ctx, m, t->eimg);
    toy_set_output(t->elogits);
    t->eg = toy_graph_new(t->ctx);
    toy_graph_build(t->eg, t->elogits);
    enum toy_status st = toy_graph_plan(t->g, &t->buf, NULL);
    if (!st) st = toy_graph_plan(t->eg, &t->ebuf, NULL);
    if (st) { toy_classifier_free(t); return st; }
    struct toy_optim_group decay = {.beta1 = o->beta1, .beta2 = o->beta2, .eps = o->eps, .weight_decay = o->weight_decay};
    struct toy_optim_group plain = decay;
    plain.weight_decay = 0;
    int gd = toy_optim_add_group(t->opt, &decay), gp = toy_optim_add_group(t->opt, &plain);
    for (int i = 0; i < toy_vit_n_tensors(m); i++) {
        struct toy_tensor *p = toy_vit_tensor(m, i);
        bool is_matrix = p->ne[1] > 1 && p != m->pos;
        toy_optim_add_param(t->opt, p, is_matrix ? gd : gp);
    }
    *out = t;
    return TOY_OK;
}

void toy_classifier_free(struct toy_classifier *t) {
    if (!t) return;
    toy_optim_free(t->opt);
    toy_ctx_free(t->ctx);
    toy_membuf_free(&t->buf);
    toy_membuf_free(&t->ebuf);
    toy_threadpool_free(t->tp);
    free(t->idx);
    free(t);
}

void toy_classifier_on_step(struct toy_classifier *t, toy_classify_step_fn fn, void *ud) { t->fn = fn, t->ud = ud; }
int64_t toy_classifier_step(const struct toy_classifier *t) { return t->step; }

/* ---- checkpoints ---------------------------------------------------------------- */

static enum toy_status write_state(struct toy_classifier *t, const char *path) {
    struct toy_gguf_writer *w;
    enum toy_status st = toy_gguf_writer_init(&w);
    if (st) return st;
    st = toy_gguf_writer_set_str(w, "general.type", "toy-classify-state");
    if (!st) st = toy_gguf_writer_set_u64(w, "toy.step", (uint64_t)t->step);
    if (!st) st = toy_gguf_writer_set_u64(w, "toy.optim.steps", (uint64_t)toy_optim_step_count(t->opt));
    if (!st) st = toy_gguf_writer_set_arr(w, "toy.sampler.rng", TOY_GGUF_U64, t->rng.s, 4);
    if (!st) st = toy_gguf_writer_set_f32(w, "toy.last_loss", t->last_loss);
    if (!st) st = toy_optim_write_gguf(t->opt, w);
    if (!st) st = toy_gguf_writer_write(w, path);
    toy_gguf_writer_free(w);
    return st;
}

enum toy_status toy_classifier_checkpoint(struct toy_classifier *t, char *out, size_t out_size) {
    if (!t->run_dir[0]) return TOY_OK;
    char dir[1100], path[1200], state[1200];
    snprintf(dir, sizeof dir, "%s/weights", t->run_dir);
    enum toy_status st = toy_mkdir_p(dir);
    if (st) return st;
    snprintf(path, sizeof path, "%s/step_%lld.gguf", dir, (long long)t->step);
    snprintf(state, sizeof state, "%s/step_%lld.state.gguf", dir, (long long)t->step);
    if ((st = write_state(t, state))) return st;
    struct toy_gguf_writer *w;
    if ((st = toy_gguf_writer_init(&w))) return st;
    st = toy_vit_write_gguf(t->m, w);
    if (!st) st = toy_gguf_writer_set_str(w, "general.name", "toy");
    if (!st) st = toy_gguf_writer_set_str(w, "toy.checkpoint_format", "toy-classify/v1");
    if (!st) st = toy_gguf_writer_set_u64(w, "toy.step", (uint64_t)t->step);
    if (!st) st = toy_gguf_writer_write(w, path);
    toy_gguf_writer_free(w);
    if (!st) st = toy_run_link_latest(path);
    if (!st) {
        snprintf(t->last_ckpt, sizeof t->last_ckpt, "%s", path);
        if (out) snprintf(out, out_size, "%s", path);
    }
    return st;
}

enum toy_status toy_classifier_load_state(struct toy_classifier *t, const char *path) {
    struct toy_gguf *g;
    enum toy_status st = toy_gguf_open(path, &g);
    if (st) return st;
    uint64_t step = 0, osteps = 0;
    int64_t ai;
    uint64_t n = 0;
    if (toy_gguf_get_u64(g, "toy.step", &step) || toy_gguf_get_u64(g, "toy.optim.steps", &osteps) ||
        toy_gguf_get_arr(g, "toy.sampler.rng", &ai, NULL, &n) || n != 4 || toy_gguf_arr_type(g, ai) != TOY_GGUF_U64) {
        toy_gguf_close(g);
        return toy_error(TOY_ERR_FORMAT, "%s: not a toy-classify state (toy.step, toy.optim.steps, toy.sampler.rng)", path);
    }
    memcpy(t->rng.s, toy_gguf_arr_data(g, ai), sizeof t->rng.s);
    if (!st) st = toy_optim_read_gguf(t->opt, g);
    float ll = NAN;
    toy_gguf_get_f32(g, "toy.last_loss", &ll);
    toy_gguf_close(g);
    if (st) return st;
    t->step = (int64_t)step;
    t->last_loss = ll;
    toy_optim_set_step_count(t->opt, (int64_t)osteps);
    return TOY_OK;
}

/* ---- the loop -------------------------------------------------------------------- */

static enum toy_status evaluate(struct toy_classifier *t, float *loss, float *acc) {
    *loss = *acc = NAN;
    if (!t->test || t->test->n == 0) return TOY_OK;
    double ls = 0;
    int64_t correct = 0;
    enum toy_status st = eval_graph(t->m, t->test, t->eg, t->eimg, t->elogits, t->tp, t->idx, &ls, &correct);
    *loss = (float)(ls / (double)t->test->n);
    *acc = (float)correct / (float)t->test->n;
    if (!st && t->ev) {
        json_t *extra = json_pack("{s:f,s:I}", "accuracy", (double)*acc, "correct", (json_int_t)correct);
        toy_events_eval(t->ev, &(struct toy_eval_event){.step = t->step, .name = "validation", .loss = *loss,
                                                        .samples = t->test->n, .extra = extra});
        json_decref(extra);
    }
    return st;
}

enum toy_status toy_classifier_run(struct toy_classifier *t, struct toy_classify_result *res) {
    struct toy_classify_result r = {.reason = TOY_RUN_COMPLETED, .final_loss = NAN, .test_loss = NAN, .test_acc = NAN};
    const struct toy_classify_opts *o = &t->o;
    struct toy_lr_schedule sched = {.kind = o->schedule, .lr = o->lr, .lr_min = o->lr_min, .warmup = o->warmup,
                                    .total = o->steps};
    const int64_t B = o->batch, first_step = t->step;
    double t0 = now_s();
    enum toy_status st = TOY_OK;
    while (t->step < o->steps) {
        double ts = now_s();
        for (int64_t b = 0; b < B; b++) t->idx[b] = (int64_t)toy_rng_below(&t->rng, (uint64_t)t->train->n);
        toy_images_batch(t->train, t->idx, B, t->m->mean, t->m->std, &o->aug, &t->rng, t->img->data, t->lab->data);
        toy_optim_zero_grad(t->opt);
        if ((st = toy_graph_compute(t->g, t->tp))) break;
        float loss = *(float *)t->loss->data;
        float gn = isfinite(loss) ? toy_optim_clip_grad_norm(t->opt, o->clip, t->tp) : NAN;
        if (!isfinite(loss) || !isfinite(gn)) { /* the update would make the weights non-finite: stop before it */
            r.reason = TOY_RUN_ABORTED;
            /* the step's event says so ("loss": null or "grad_norm": null, docs/events.md), as toy train's does */
            if (t->ev)
                toy_events_step(t->ev, &(struct toy_step_event){.step = t->step + 1, .loss = loss,
                                                                .lr = toy_lr_at(&sched, t->step), .tokens = B,
                                                                .wall_us = (int64_t)((now_s() - ts) * 1e6),
                                                                .grad_norm = gn});
            char err[256];
            if (!isfinite(loss)) snprintf(err, sizeof err, "step %lld: loss is %f", (long long)t->step + 1, loss);
            else snprintf(err, sizeof err, "step %lld: gradient norm is %f (loss %f): stopped before the update",
                          (long long)t->step + 1, gn, loss);
            /* the last good weights are kept, so that the run can be resumed (with other settings, from a copy) */
            if (toy_classifier_checkpoint(t, NULL, 0))
                st = toy_error(TOY_ERR_NUMERIC, "%s; the last good weights could not be checkpointed: %s", err,
                               toy_last_error());
            else st = toy_error(TOY_ERR_NUMERIC, "%s: the last good weights are checkpointed", err);
            break;
        }
        float lr = toy_lr_at(&sched, t->step);
        if ((st = toy_optim_step(t->opt, lr, t->tp))) break;
        t->step++;
        t->last_loss = loss;
        if (t->ev &&
            toy_events_step(t->ev, &(struct toy_step_event){.step = t->step, .loss = loss, .lr = lr, .tokens = B,
                                                            .wall_us = (int64_t)((now_s() - ts) * 1e6),
                                                            .grad_norm = gn}) &&
            toy_events_out_of_space(t->ev)) { /* the checkpoints would fail too: stop before more is lost */
            st = TOY_ERR_IO; /* toy_events_step's error says so */
            break;
        }
        struct toy_classify_step info = {.step = t->step, .steps = o->steps, .loss = loss, .lr = lr, .grad_norm = gn,
                                         .elapsed_s = now_s() - t0, .test_loss = NAN, .test_acc = NAN};
        bool last = t->step == o->steps || (o->stop && *o->stop);
        if ((o->eval_every > 0 && t->step % o->eval_every == 0) || last) {
            if ((st = evaluate(t, &info.test_loss, &info.test_acc))) break;
            r.test_loss = info.test_loss;
            r.test_acc = info.test_acc;
        }
        if (t->fn) t->fn(t->ud, &info);
        bool stop = o->stop && *o->stop; /* the callback may ask too */
        last = last || stop;
        if ((o->ckpt_every > 0 && t->step % o->ckpt_every == 0) || last)
            if ((st = toy_classifier_checkpoint(t, NULL, 0))) break;
        if (stop) { r.reason = TOY_RUN_INTERRUPTED; break; }
    }
    if (!st && isnan(r.test_acc)) { /* no evaluation yet: nothing to train, or stopped from the callback */
        float l, a;
        if (!(st = evaluate(t, &l, &a))) r.test_loss = l, r.test_acc = a;
    }
    if (st && r.reason == TOY_RUN_COMPLETED) r.reason = TOY_RUN_ERRORED;
    r.final_step = t->step;
    r.final_loss = t->last_loss;
    r.seconds = now_s() - t0;
    r.images_per_s = r.seconds > 0 ? (double)(t->step - first_step) * (double)B / r.seconds : 0;
    snprintf(r.checkpoint, sizeof r.checkpoint, "%s", t->last_ckpt);
    if (res) *res = r;
    return st;
}
