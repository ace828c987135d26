/* trainer.c: the training loop of toy/trainer.h.
 *
 * One training graph (forward + cross-entropy + backward) is built once and
 * run accum times per optimizer step; gradients add up in the parameters'
 * persistent buffers, are scaled by 1/accum, clipped, and AdamW updates the
 * moments once. A forward-only graph evaluates held-out windows; both graphs
 * share one planned activation buffer (they never run at the same time).
 * Resuming restores weights, moments, the step and the data sampler's RNG,
 * so the continued run draws the same batches and computes the same losses,
 * to the bit, as an uninterrupted one with the same thread count.
 *
 * Data parallelism through a toy_collective (toy_trainer_use_collective):
 * the gradients go to a toy_grad_sync plan in the order the backward pass
 * finishes them; with overlap its node callback starts each bucket during
 * the last micro-batch's backward pass, without it the same buckets go
 * after it (same bits). The 1/accum scaling is the plan's prescale. The
 * gradient sync ends before the step's scalars are summed, so every rank
 * issues its collectives in one order. ZeRO-1: the optimizer keeps the
 * state of this rank's part of the buckets; the clipping norm sums the
 * parts' squares over the ranks; after the update the parameters are
 * all-gathered; a checkpoint gathers the moments on rank 0, which writes
 * them whole (the same file as without ZeRO: any number of ranks resumes).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "toy/collective.h"
#include "toy/generate.h"
#include "toy/gguf.h"
#include "toy/graph.h"
#include "toy/run-dir.h"
#include "toy/trace.h"
#include "toy/trainer.h"

struct toy_trainer {
    struct toy_lm lm;
    const struct toy_tokenizer *tok;
    struct toy_data *data;
    struct toy_train_opts o;
    char run_dir[1024];
    struct toy_events *ev;
    struct toy_threadpool *tp;
    int64_t B, T;
    struct toy_ctx *ctx, *ectx;
    struct toy_tensor *tok_t, *tgt_t, *loss;      /* training graph */
    struct toy_tensor *balance;                   /* a mixture's load-balancing term (its step events), or NULL */
    struct toy_tensor *etok, *etgt, *eloss;       /* eval graph */
    struct toy_graph *g, *eg;
    struct toy_membuf buf;
    struct toy_optim *opt;
    struct toy_lr_schedule sched;
    int64_t step;
    double last_loss; /* the last step's loss as its event has it (run_end repeats it) */
    toy_step_fn on_step;
    void *ud;
    char last_ckpt[1200];
    char sample_text[4096];
    int64_t eval_windows, eval_tokens; /* of the last evaluation */
    toy_allreduce_fn allreduce;        /* data parallelism (NULL: one process) */
    void *allreduce_ud;
    int rank, world;
    struct toy_tensor **params;        /* what the all-reduce averages */
    int n_params;
    toy_reduce_sum_fn reduce;          /* sums of scalars over ranks (NULL: local values) */
    double *stats;                     /* (2 + world): loss, stop requests, compute s per rank */
    struct toy_collective *coll;       /* toy_trainer_use_collective (NULL: the hooks above, if any) */
    struct toy_grad_sync *gs;
    bool overlap, zero;
    int *order;                        /* gs buffer b is optimizer parameter order[b] */
};

void toy_trainer_set_collective(struct toy_trainer *t, toy_allreduce_fn fn, void *ud, int rank, int world) {
    t->allreduce = fn;
    t->allreduce_ud = ud;
    t->rank = rank;
    t->world = world > 0 ? world : 1;
    if (rank != 0) t->ev = NULL; /* rank 0 alone writes events */
    /* gradients are reduced in host memory: the optimizer steps there too */
    if (t->world > 1 && t->opt) toy_optim_set_device_resident(t->opt, false);
}

int toy_trainer_params(const struct toy_trainer *t, struct toy_tensor *const **params) {
    *params = t->params;
    return t->n_params;
}

enum toy_status toy_trainer_set_reduce(struct toy_trainer *t, toy_reduce_sum_fn fn) {
    free(t->stats);
    t->stats = NULL;
    t->reduce = NULL;
    if (!fn) return TOY_OK;
    if (!(t->stats = calloc((size_t)t->world + 2, sizeof *t->stats))) return toy_error(TOY_ERR_NOMEM, "trainer");
    t->reduce = fn;
    return TOY_OK;
}

enum toy_status toy_trainer_use_collective(struct toy_trainer *t, struct toy_collective *c, const struct toy_dp_opts *o) {
    int world = toy_collective_world(c), rank = toy_collective_rank(c), n = t->n_params;
    if (t->gs) return toy_error(TOY_ERR_STATE, "trainer: a collective is in use already");
    if (world == 1) return TOY_OK; /* one rank: nothing to share */
    toy_trainer_set_collective(t, NULL, c, rank, world);
    enum toy_status st = toy_trainer_set_reduce(t, toy_collective_reduce_sum);
    if (st) return st;
    int *lw = malloc((size_t)(n ? n : 1) * sizeof *lw), *ready = malloc((size_t)(n ? n : 1) * sizeof *ready);
    float **grads = malloc((size_t)(n ? n : 1) * sizeof *grads), **data = malloc((size_t)(n ? n : 1) * sizeof *data);
    int64_t *counts = malloc((size_t)(n ? n : 1) * sizeof *counts);
    t->order = malloc((size_t)(n ? n : 1) * sizeof *t->order);
    if (!lw || !ready || !grads || !data || !counts || !t->order) {
        st = toy_error(TOY_ERR_NOMEM, "trainer");
        goto out;
    }
    /* the order the backward pass finishes the gradients in (stable: ties keep the optimizer's order) */
    toy_graph_grad_last_writers(t->g, t->params, n, lw);
    for (int i = 0; i < n; i++) {
        int j = i;
        for (; j > 0 && lw[t->order[j - 1]] > lw[i]; j--) t->order[j] = t->order[j - 1];
        t->order[j] = i;
    }
    for (int b = 0; b < n; b++) {
        struct toy_tensor *p = t->params[t->order[b]];
        if (!p->grad || p->grad->type != TOY_F32) {
            st = toy_error(TOY_ERR_UNSUPPORTED, "data parallelism: %s has no f32 gradient", p->name);
            goto out;
        }
        grads[b] = p->grad->data;
        data[b] = p->data;
        counts[b] = toy_nelements(p);
        ready[b] = lw[t->order[b]];
    }
    t->coll = c;
    t->overlap = o && o->overlap;
    t->zero = o && o->zero > 0;
    if ((st = toy_grad_sync_new(c, grads, data, counts, ready, n, t->zero, &t->gs))) goto out;
    if (t->zero) { /* this rank's parts of the buckets are what its optimizer keeps */
        const struct toy_bucket_piece *pc;
        int np = toy_grad_sync_shard(t->gs, &pc, NULL);
        struct toy_optim_range *r = malloc((size_t)(np ? np : 1) * sizeof *r);
        if (!r) {
            st = toy_error(TOY_ERR_NOMEM, "trainer");
            goto out;
        }
        for (int k = 0; k < np; k++) r[k] = (struct toy_optim_range){t->order[pc[k].buf], pc[k].off, pc[k].count};
        st = toy_optim_shard(t->opt, r, np);
        free(r);
    }
out:
    free(lw);
    free(ready);
    free(grads);
    free(data);
    free(counts);
    return st;
}

size_t toy_trainer_optim_state_bytes(const struct toy_trainer *t) { return toy_optim_state_bytes(t->opt); }

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

json_t *toy_train_opts_to_json(const struct toy_train_opts *o) {
    const char *sched[] = {"constant", "cosine", "linear"};
    return json_pack("{s:I,s:I,s:f,s:f,s:I,s:s,s:f,s:f,s:f,s:f,s:f,s:I,s:I,s:I,s:I,s:b,s:s,s:i,s:f}", "steps",
                     (json_int_t)o->steps, "accum", (json_int_t)o->accum, "lr", (double)o->lr, "lr_min",
                     (double)o->lr_min, "warmup", (json_int_t)o->warmup, "schedule", sched[o->schedule],
                     "weight_decay", (double)o->weight_decay, "beta1", (double)o->beta1, "beta2", (double)o->beta2,
                     "eps", (double)o->eps, "clip", (double)o->clip, "seed", (json_int_t)o->seed, "eval_every",
                     (json_int_t)o->eval_every, "eval_batches", (json_int_t)o->eval_batches, "ckpt_every",
                     (json_int_t)o->ckpt_every, "bf16", o->bf16, "sample_prompt",
                     o->sample_prompt ? o->sample_prompt : "", "sample_tokens", (int)o->sample_tokens, "moe_aux",
                     (double)o->moe_aux);
}

void toy_train_opts_from_json(struct toy_train_opts *o, const json_t *j) {
    json_t *v;
#define GETI(k, f) if ((v = json_object_get(j, k)) && json_is_integer(v)) o->f = json_integer_value(v)
#define GETF(k, f) if ((v = json_object_get(j, k)) && json_is_number(v)) o->f = (float)json_number_value(v)
    GETI("steps", steps);
    GETI("accum", accum);
    GETF("lr", lr);
    GETF("lr_min", lr_min);
    GETI("warmup", warmup);
    GETF("weight_decay", weight_decay);
    GETF("beta1", beta1);
    GETF("beta2", beta2);
    GETF("eps", eps);
    GETF("clip", clip);
    GETF("moe_aux", moe_aux);
    GETI("seed", seed);
    GETI("eval_every", eval_every);
    GETI("eval_batches", eval_batches);
    GETI("ckpt_every", ckpt_every);
    GETI("sample_tokens", sample_tokens);
#undef GETI
#undef GETF
    if ((v = json_object_get(j, "schedule")) && json_is_string(v) && toy_lr_kind_from_name(json_string_value(v)) >= 0)
        o->schedule = (enum toy_lr_kind)toy_lr_kind_from_name(json_string_value(v));
    if ((v = json_object_get(j, "bf16"))) o->bf16 = json_is_true(v);
}

static struct toy_tensor *build_loss(struct toy_ctx *ctx, const struct toy_lm *lm, int64_t T, int64_t B,
                                     struct toy_tensor **tok, struct toy_tensor **tgt) {
    *tok = toy_set_name(toy_new_tensor_2d(ctx, TOY_I32, T, B), "tokens");
    *tgt = toy_set_name(toy_new_tensor_2d(ctx, TOY_I32, T, B), "targets");
    struct toy_tensor *pos = toy_set_name(toy_new_tensor_1d(ctx, TOY_I32, T), "positions");
    for (int64_t t = 0; t < T; t++) ((int32_t *)pos->data)[t] = (int32_t)t;
    return toy_set_name(toy_cross_entropy(ctx, lm->forward(lm->self, ctx, *tok, pos), *tgt, -100), "loss");
}

enum toy_status toy_trainer_new(struct toy_llama *m, const struct toy_tokenizer *tok, struct toy_data *data,
                                const struct toy_train_opts *o, const char *run_dir, struct toy_events *ev,
                                int n_threads, struct toy_trainer **out) {
    if (!out) return toy_error(TOY_ERR_INVALID_ARG, "toy_trainer_new: out is NULL");
    struct toy_lm lm = toy_llama_lm(m);
    return toy_trainer_new_lm(&lm, tok, data, o, run_dir, ev, n_threads, out);
}

enum toy_status toy_trainer_new_lm(const struct toy_lm *lm, const struct toy_tokenizer *tok, struct toy_data *data,
                                   const struct toy_train_opts *o, const char *run_dir, struct toy_events *ev,
                                   int n_threads, struct toy_trainer **out) {
    if (!out) return toy_error(TOY_ERR_INVALID_ARG, "toy_trainer_new_lm: out is NULL");
    enum toy_status cst = toy_optim_check_settings(o->lr, o->lr_min, o->weight_decay, o->beta1, o->beta2, o->eps, o->clip);
    if (cst) return cst;
    *out = NULL;
    struct toy_data_state ds;
    toy_data_get_state(data, &ds);
    if (toy_data_vocab(data) > lm->vocab)
        return toy_error(TOY_ERR_INVALID_ARG, "data has vocabulary %lld, the model only %lld",
                         (long long)toy_data_vocab(data), (long long)lm->vocab);
    if (ds.ctx > lm->max_ctx)
        return toy_error(TOY_ERR_INVALID_ARG, "context %lld is longer than the model's %lld", (long long)ds.ctx,
                         (long long)lm->max_ctx);
    struct toy_trainer *t = calloc(1, sizeof *t);
    if (!t) return toy_error(TOY_ERR_NOMEM, "trainer");
    t->lm = *lm;
    t->tok = tok;
    t->data = data;
    t->o = *o;
    if (t->o.accum < 1) t->o.accum = 1;
    snprintf(t->run_dir, sizeof t->run_dir, "%s", run_dir);
    t->ev = ev;
    t->B = ds.batch;
    t->T = ds.ctx;
    t->tp = toy_threadpool_new(n_threads);
    if (lm->set_matmul_type) lm->set_matmul_type(lm->self, o->bf16 ? TOY_BF16 : TOY_F32);
    t->ctx = toy_ctx_init(true);
    /* a mixture's load-balancing term joins the loss that is differentiated; t->loss stays the cross-entropy */
    struct toy_llama *moe = lm->llama && lm->llama->cfg.n_experts && o->moe_aux > 0 ? lm->llama : NULL;
    if (moe) moe->moe_balance = true;
    t->loss = build_loss(t->ctx, lm, t->T, t->B, &t->tok_t, &t->tgt_t);
    struct toy_tensor *total = t->loss;
    if (moe) {
        moe->moe_balance = false;
        if (moe->moe_aux_loss) {
            toy_set_output(t->loss);
            t->balance = moe->moe_aux_loss;
            toy_set_output(t->balance);
            total = toy_set_name(toy_add(t->ctx, t->loss, toy_scale(t->ctx, moe->moe_aux_loss, o->moe_aux)),
                                 "loss_with_balance");
        }
        moe->moe_aux_loss = NULL;
    }
    t->g = toy_graph_new(t->ctx);
    toy_graph_build(t->g, total);
    toy_graph_backward(t->g, total);
    t->ectx = toy_ctx_init(true);
    t->eloss = build_loss(t->ectx, lm, t->T, t->B, &t->etok, &t->etgt);
    t->eg = toy_graph_new(t->ectx);
    toy_graph_build(t->eg, t->eloss);
    if (o->trace) {
        toy_graph_set_trace(t->g, o->trace);
        toy_graph_set_trace(t->eg, o->trace);
    }
    enum toy_status st = toy_graph_plan(t->g, &t->buf, NULL);
    void *before = t->buf.data;
    if (!st) st = toy_graph_plan(t->eg, &t->buf, NULL);
    if (!st && t->buf.data != before) st = toy_graph_plan(t->g, &t->buf, NULL); /* the buffer moved */
    if (st) { toy_trainer_free(t); return st; }
    t->opt = toy_optim_new(TOY_OPTIM_ADAMW);
    int decay = toy_optim_add_group(t->opt, &(struct toy_optim_group){.beta1 = o->beta1, .beta2 = o->beta2,
                                                                      .eps = o->eps, .weight_decay = o->weight_decay});
    int nodecay = toy_optim_add_group(t->opt, &(struct toy_optim_group){.beta1 = o->beta1, .beta2 = o->beta2, .eps = o->eps});
    for (int i = 0; i < lm->n_tensors(lm->self); i++) {
        struct toy_tensor *p = lm->tensor(lm->self, i);
        if (!(p->flags & TOY_FLAG_PARAM)) continue;
        toy_optim_add_param(t->opt, p, p->ne[1] > 1 ? decay : nodecay); /* no decay on norms and biases */
    }
    t->sched = (struct toy_lr_schedule){o->schedule, o->lr, o->lr_min, o->warmup, o->steps};
    t->world = 1;
    t->n_params = toy_optim_n_params(t->opt);
    t->params = malloc((size_t)(t->n_params ? t->n_params : 1) * sizeof *t->params);
    if (!t->params) { toy_trainer_free(t); return toy_error(TOY_ERR_NOMEM, "trainer"); }
    for (int i = 0; i < t->n_params; i++) t->params[i] = toy_optim_param(t->opt, i);
    t->last_loss = NAN;
    *out = t;
    return TOY_OK;
}

void toy_trainer_free(struct toy_trainer *t) {
    if (!t) return;
    toy_grad_sync_free(t->gs);
    free(t->order);
    free(t->params);
    free(t->stats);
    toy_optim_free(t->opt);
    toy_ctx_free(t->ctx);
    toy_ctx_free(t->ectx);
    toy_membuf_free(&t->buf);
    toy_threadpool_free(t->tp);
    free(t);
}

void toy_trainer_on_step(struct toy_trainer *t, toy_step_fn fn, void *ud) {
    t->on_step = fn;
    t->ud = ud;
}

int64_t toy_trainer_step(const struct toy_trainer *t) { return t->step; }

/* ---- evaluation ---------------------------------------------------------------- */

enum toy_status toy_trainer_eval(struct toy_trainer *t, int64_t n_batches, float *loss) {
    if (!loss) return toy_error(TOY_ERR_INVALID_ARG, "toy_trainer_eval: loss is NULL");
    int64_t windows = toy_data_eval_windows(t->data);
    if (windows <= 0 && !t->reduce) { /* with ranks, this one still takes part in the sum */
        *loss = NAN;
        return toy_error(TOY_ERR_STATE, "no held-out windows to evaluate (use a held-out fraction > 0)");
    }
    double sum = 0;
    int64_t count = 0, used = 0;
    for (int64_t first = 0, b = 0; first < windows && (n_batches <= 0 || b < n_batches); first += t->B, b++) {
        toy_data_eval_batch(t->data, first, t->etok->data, t->etgt->data, -100);
        int64_t n = 0;
        for (int64_t i = 0; i < t->B * t->T; i++) n += ((int32_t *)t->etgt->data)[i] != -100;
        enum toy_status st = toy_graph_compute(t->eg, t->tp);
        if (st) return st;
        sum += (double)*(float *)t->eloss->data * (double)n;
        count += n;
        used += first + t->B < windows ? t->B : windows - first;
    }
    if (t->reduce) { /* every rank evaluated its own windows (i % world == rank) */
        double v[3] = {sum, (double)count, (double)used};
        enum toy_status st = t->reduce(t->allreduce_ud, v, 3);
        if (st) return st;
        sum = v[0], count = (int64_t)v[1], used = (int64_t)v[2];
        if (!count) {
            *loss = NAN;
            return toy_error(TOY_ERR_STATE, "no held-out windows to evaluate (use a held-out fraction > 0)");
        }
    }
    *loss = count ? (float)(sum / (double)count) : NAN;
    t->eval_windows = used;
    t->eval_tokens = count;
    return TOY_OK;
}

/* ---- checkpoints ---------------------------------------------------------------- */

static enum toy_status write_state(struct toy_trainer *t, const char *path, float *const *m, float *const *v) {
    struct toy_gguf_writer *w;
    enum toy_status st = toy_gguf_writer_init(&w);
    if (st) return st;
    struct toy_data_state ds;
    toy_data_get_state(t->data, &ds);
    st = toy_gguf_writer_set_str(w, "general.type", "toy-train-state");
    if (!st) st = toy_gguf_writer_set_u64(w, "toy.step", (uint64_t)t->step);
    if (!st) st = toy_gguf_writer_set_u64(w, "toy.optim.steps", (uint64_t)toy_optim_step_count(t->opt));
    if (!st) st = toy_gguf_writer_set_arr(w, "toy.data.rng", TOY_GGUF_U64, ds.rng.s, 4);
    if (!st) st = toy_gguf_writer_set_i64(w, "toy.data.batches", ds.batches);
    if (!st) st = toy_gguf_writer_set_i64(w, "toy.data.tokens", ds.tokens);
    if (!st) st = toy_gguf_writer_set_u64(w, "toy.data.seed", ds.seed);
    if (!st) st = toy_gguf_writer_set_i64(w, "toy.data.batch", ds.batch);
    if (!st) st = toy_gguf_writer_set_i64(w, "toy.data.ctx", ds.ctx);
    if (!st) st = toy_gguf_writer_set_i64(w, "toy.data.world", ds.world);
    if (!st) st = toy_gguf_writer_set_i64(w, "toy.data.n_train", ds.n_train);
    if (!st) st = toy_gguf_writer_set_f64(w, "toy.last_loss", t->last_loss);
    json_t *oj = toy_train_opts_to_json(&t->o);
    char *os = oj ? json_dumps(oj, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    if (!st && !os) st = toy_error(TOY_ERR_NOMEM, "checkpoint: the training options as JSON");
    if (!st) st = toy_gguf_writer_set_str(w, "toy.train.opts", os);
    free(os);
    json_decref(oj);
    if (!st) st = m ? toy_optim_write_gguf_state(t->opt, w, m, v) : toy_optim_write_gguf(t->opt, w);
    /* parameters the model file holds only folded (a warm start's learned
     * projection and the residual embedding): their exact values */
    for (int i = 0; i < t->lm.n_tensors(t->lm.self) && !st; i++) {
        struct toy_tensor *p = t->lm.tensor(t->lm.self, i);
        if (!(p->flags & TOY_FLAG_STATE)) continue;
        char name[TOY_NAME_MAX + 16];
        snprintf(name, sizeof name, "toy.param.%s", p->name);
        st = toy_gguf_writer_add_tensor(w, name, p->type, p->n_dims, p->ne, p->data);
    }
    if (!st) st = toy_gguf_writer_write(w, path);
    toy_gguf_writer_free(w);
    return st;
}

/* Data parallelism: every rank must hold the same weights (they apply the
 * same update to the same bits). Before a checkpoint the ranks compare a
 * 64-bit hash of their parameters with rank 0's (sent as four 16-bit
 * pieces through the sum: only rank 0 contributes), then agree on the
 * outcome, so a divergence (a transport or kernel that is not
 * deterministic across ranks) is an error, not a silently wrong run. */
static enum toy_status check_replicas(struct toy_trainer *t) {
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < t->n_params; i++) {
        const uint32_t *w = t->params[i]->data;
        for (int64_t k = 0, n = toy_nelements(t->params[i]); k < n; k++) h = (h ^ w[k]) * 1099511628211ull;
    }
    int bad;
    bool self;
    enum toy_status st = toy_reduce_agree(t->reduce, t->allreduce_ud, t->rank, h, &bad, &self);
    if (st) return st;
    if (bad > 0)
        return toy_error(TOY_ERR_STATE, "after step %lld the weights of %d rank(s) differ from rank 0's: the replicas "
                         "diverged (ranks started with other settings, data or checkpoints, or their updates were not "
                         "bit-identical)",
                         (long long)t->step, bad);
    return TOY_OK;
}

/* ZeRO-1: the moments of every rank's shard, whole on rank 0 (*full: m of
 * every parameter, then v; NULL on the other ranks). Every rank calls it. */
static enum toy_status gather_moments(struct toy_trainer *t, float ***full) {
    int n = t->n_params;
    float **f = NULL, **fs = NULL;
    *full = NULL;
    enum toy_status st = TOY_OK;
    if (t->rank == 0) {
        f = calloc((size_t)(n ? n : 1) * 2, sizeof *f);
        fs = malloc((size_t)(n ? n : 1) * sizeof *fs);
        for (int i = 0; f && i < 2 * n; i++)
            if (!(f[i] = malloc((size_t)toy_nelements(t->params[i % n]) * sizeof(float)))) break;
        if (!f || !fs || (n && !f[2 * n - 1])) st = toy_error(TOY_ERR_NOMEM, "gathering the optimizer state");
    }
    /* every rank takes part even when rank 0 could not allocate (it then ends the run) */
    for (int which = 0; which < 2; which++) {
        for (int b = 0; fs && !st && b < n; b++) fs[b] = f[which * n + t->order[b]];
        enum toy_status gst = toy_grad_sync_gather_shard(t->gs, toy_optim_shard_state(t->opt, which, NULL),
                                                         t->rank == 0 && !st ? fs : NULL, 0);
        if (!st) st = gst;
    }
    free(fs);
    if (st || t->rank != 0) {
        for (int i = 0; f && i < 2 * n; i++) free(f[i]);
        free(f);
        return st;
    }
    *full = f;
    return TOY_OK;
}

enum toy_status toy_trainer_checkpoint(struct toy_trainer *t, char *out, size_t out_size) {
    char dir[1100], path[1200], state[1200];
    float **full = NULL;
    enum toy_status st;
    if (t->zero && (st = gather_moments(t, &full))) return st;
    if (t->rank != 0) return TOY_OK; /* rank 0 writes; every rank holds the same weights */
    snprintf(dir, sizeof dir, "%s/weights", t->run_dir);
    st = toy_mkdir_p(dir);
    if (!st) {
        snprintf(path, sizeof path, "%s/step_%lld.gguf", dir, (long long)t->step);
        snprintf(state, sizeof state, "%s/step_%lld.state.gguf", dir, (long long)t->step);
        st = write_state(t, state, full, full ? full + t->n_params : NULL);
    }
    for (int i = 0; full && i < 2 * t->n_params; i++) free(full[i]);
    free(full);
    if (st) return st;
    struct toy_gguf_writer *w;
    if ((st = toy_gguf_writer_init(&w))) return st;
    st = t->lm.write_gguf(t->lm.self, w, TOY_F32);
    if (!st) st = toy_gguf_writer_set_str(w, "general.name", "toy");
    if (!st) st = toy_gguf_writer_set_str(w, "toy.checkpoint_format", "toy-train/v1");
    if (!st) st = toy_gguf_writer_set_u64(w, "toy.step", (uint64_t)t->step);
    if (!st && t->tok) st = toy_tokenizer_write_gguf(t->tok, w);
    if (!st) st = toy_gguf_writer_write(w, path);
    toy_gguf_writer_free(w);
    if (!st) st = toy_run_link_latest(path);
    if (!st) {
        snprintf(t->last_ckpt, sizeof t->last_ckpt, "%s", path);
        if (out) snprintf(out, out_size, "%s", path);
    }
    return st;
}

static enum toy_status get_i64(const struct toy_gguf *g, const char *key, int64_t *v) {
    enum toy_status st = toy_gguf_get_i64(g, key, v);
    if (st) return toy_error(TOY_ERR_FORMAT, "%s: missing or bad %s", toy_gguf_path(g), key);
    return TOY_OK;
}

enum toy_status toy_trainer_load_state(struct toy_trainer *t, const char *path) {
    struct toy_gguf *g;
    enum toy_status st = toy_gguf_open(path, &g);
    if (st) return st;
    int64_t step = 0, osteps = 0;
    struct toy_data_state ds;
    toy_data_get_state(t->data, &ds);
    int64_t rng_kv;
    const uint64_t *rng = NULL;
    st = get_i64(g, "toy.step", &step);
    if (!st) st = get_i64(g, "toy.optim.steps", &osteps);
    if (!st) st = get_i64(g, "toy.data.batches", &ds.batches);
    if (!st) st = get_i64(g, "toy.data.tokens", &ds.tokens);
    if (!st && toy_gguf_get_arr(g, "toy.data.rng", &rng_kv, NULL, NULL) == TOY_OK && toy_gguf_arr_len(g, rng_kv) == 4 &&
        toy_gguf_arr_type(g, rng_kv) == TOY_GGUF_U64)
        rng = toy_gguf_arr_data(g, rng_kv);
    else if (!st)
        st = toy_error(TOY_ERR_FORMAT, "%s: missing toy.data.rng (4 u64)", path);
    if (!st) {
        memcpy(ds.rng.s, rng, sizeof ds.rng.s);
        st = toy_data_set_state(t->data, &ds);
    }
    if (!st) st = toy_optim_read_gguf(t->opt, g);
    for (int i = 0; i < t->lm.n_tensors(t->lm.self) && !st; i++) {
        struct toy_tensor *p = t->lm.tensor(t->lm.self, i);
        if (!(p->flags & TOY_FLAG_STATE)) continue;
        char name[TOY_NAME_MAX + 16];
        snprintf(name, sizeof name, "toy.param.%s", p->name);
        int64_t ti = toy_gguf_find_tensor(g, name);
        if (ti < 0) st = toy_error(TOY_ERR_FORMAT, "%s: no %s (the run's %s is needed to resume exactly)", path, name, p->name);
        else st = toy_gguf_tensor_read_f32(g, ti, p->data, toy_nelements(p));
    }
    double ll;
    if (!st && !toy_gguf_get_f64(g, "toy.last_loss", &ll)) t->last_loss = ll;
    if (!st) {
        t->step = step;
        toy_optim_set_step_count(t->opt, osteps);
    }
    toy_gguf_close(g);
    return st;
}

/* ---- the end-of-run sample ---------------------------------------------------------- */

struct text_buf {
    char *s;
    size_t n, cap;
};

static bool append_text(void *ud, int32_t id, const char *text, size_t len, float lp) {
    struct text_buf *b = ud;
    (void)id;
    (void)lp;
    if (b->n + len + 1 > b->cap) {
        size_t cap = (b->n + len + 1) * 2;
        char *ns = realloc(b->s, cap);
        if (!ns) return false;
        b->s = ns;
        b->cap = cap;
    }
    memcpy(b->s + b->n, text, len);
    b->n += len;
    b->s[b->n] = 0;
    return true;
}

/* Generates opts.sample_tokens after opts.sample_prompt into a `sample`
 * event, as the earlier toy did at the end of a run. */
static void sample(struct toy_trainer *t) {
    const char *prompt = t->o.sample_prompt;
    if (!t->tok || !prompt || !prompt[0] || t->o.sample_tokens <= 0 || !t->lm.forward_cached || t->rank != 0) return;
    struct toy_tokens ids = {0};
    struct text_buf out = {0};
    struct toy_generator *gen = NULL;
    unsigned fl = toy_tokenizer_add_bos(t->tok) ? TOY_ENCODE_ADD_BOS : 0;
    if (!toy_tokenizer_encode(t->tok, prompt, strlen(prompt), fl, &ids) && ids.n > 0 && ids.n < t->lm.max_ctx &&
        !toy_generator_new_lm(&t->lm, t->tok, t->lm.max_ctx, TOY_F32, t->tp, &gen)) {
        struct toy_generate_params gp = {.n_predict = t->o.sample_tokens,
                                         .sampling = {.temperature = 0.8f, .top_k = 40, .seed = t->o.seed}};
        if (!toy_generate(gen, ids.ids, ids.n, &gp, append_text, &out, NULL) && t->ev)
            toy_events_sample(t->ev, t->step, prompt, out.s ? out.s : "");
        snprintf(t->sample_text, sizeof t->sample_text, "%s%s", prompt, out.s ? out.s : "");
    }
    toy_generator_free(gen);
    toy_tokens_free(&ids);
    free(out.s);
}

const char *toy_trainer_sample_text(const struct toy_trainer *t) { return t->sample_text; }

/* ---- the loop ---------------------------------------------------------------------- */

static void emit_end(struct toy_trainer *t, enum toy_run_reason reason, const char *err, int code) {
    if (!t->ev) return;
    struct toy_run_end e = {reason, err, t->step, t->last_loss, code, NULL};
    toy_events_run_end(t->ev, &e);
}

/* The step event of a step stopped before its update (non-finite loss or
 * gradient norm): steps stay dense, and the event says why (null). */
static void emit_stopped_step(struct toy_trainer *t, int64_t step, double loss, double t0) {
    if (!t->ev) return;
    struct toy_step_event se = {step, loss, toy_lr_at(&t->sched, step - 1), t->B * t->T * t->o.accum * t->world,
                                (int64_t)((now_s() - t0) * 1e6), NAN, NULL, NULL};
    toy_events_step(t->ev, &se);
}

enum toy_status toy_trainer_run(struct toy_trainer *t, struct toy_train_result *res) {
    struct toy_train_result r = {.reason = TOY_RUN_COMPLETED, .final_eval_loss = NAN};
    double t_start = now_s();
    int64_t tokens = 0;
    enum toy_status st = TOY_OK;
    char err[512] = "";
    bool diverged = false; /* check_replicas found the ranks' weights differ */
    struct toy_data_state ds0;
    bool stop_all = false;
    while (t->step < t->o.steps) {
        /* with ranks, a stop request is agreed through the step's reduce below */
        if (stop_all || (t->o.stop && *t->o.stop && !t->reduce)) {
            r.reason = TOY_RUN_INTERRUPTED;
            break;
        }
        double t0 = now_s();
        double tr0 = t->o.trace ? toy_trace_now(t->o.trace) : 0;
        if (t->o.op_timing) toy_graph_set_timing(t->g, true); /* resets the buckets */
        toy_optim_zero_grad(t->opt);
        if (t->allreduce || t->gs) toy_data_get_state(t->data, &ds0); /* a failed collective rewinds to it */
        double loss = 0, balance = 0;
        bool sync_err = false;
        for (int64_t a = 0; a < t->o.accum; a++) {
            toy_data_next_batch(t->data, t->tok_t->data, t->tgt_t->data);
            bool last = a == t->o.accum - 1;
            if (t->gs && last && t->overlap) { /* the buckets start as the backward pass finishes them */
                if ((st = toy_grad_sync_begin(t->gs, 1.0f / (float)t->o.accum))) {
                    sync_err = true;
                    break;
                }
                toy_graph_set_node_callback(t->g, toy_grad_sync_on_node, t->gs);
            }
            st = toy_graph_compute(t->g, t->tp);
            if (t->gs && last && t->overlap) toy_graph_set_node_callback(t->g, NULL, NULL);
            if (st) break;
            loss += *(float *)t->loss->data;
            if (t->balance) balance += *(float *)t->balance->data;
        }
        double ar_s = 0, compute_s = now_s() - t0; /* this rank's forward+backward (what overlap hid included) */
        if (!st && t->gs) { /* what is still in flight (all of it without overlap) */
            double ar0 = now_s();
            if (!t->overlap) st = toy_grad_sync_begin(t->gs, 1.0f / (float)t->o.accum);
            if (!st) st = toy_grad_sync_end(t->gs);
            ar_s = now_s() - ar0;
            sync_err = st != TOY_OK;
        }
        if (sync_err) {
            toy_data_set_state(t->data, &ds0);
            snprintf(err, sizeof err, "gradient all-reduce: %s", toy_last_error());
            r.reason = TOY_RUN_ERRORED;
            break;
        }
        if (st) {
            snprintf(err, sizeof err, "%s", toy_last_error());
            r.reason = TOY_RUN_ERRORED;
            break;
        }
        loss /= (double)t->o.accum;
        if (t->reduce) { /* the global batch's loss; every rank sees the same NaN */
            memset(t->stats, 0, (size_t)(t->world + 2) * sizeof *t->stats);
            t->stats[0] = loss;
            t->stats[1] = t->o.stop && *t->o.stop;
            t->stats[2 + t->rank] = compute_s;
            if ((st = t->reduce(t->allreduce_ud, t->stats, t->world + 2))) {
                toy_data_set_state(t->data, &ds0);
                snprintf(err, sizeof err, "loss all-reduce: %s", toy_last_error());
                r.reason = TOY_RUN_ERRORED;
                break;
            }
            loss = t->stats[0] / t->world;
            stop_all = t->stats[1] > 0;
        }
        int64_t step = t->step + 1;
        if (!isfinite(loss)) {
            /* the weights are still those of the last good step */
            snprintf(err, sizeof err, "loss is %s at step %lld: stopped; the last good weights are checkpointed",
                     isnan(loss) ? "NaN" : "infinite", (long long)step);
            emit_stopped_step(t, step, NAN, t0);
            r.reason = TOY_RUN_ABORTED;
            break;
        }
        if (t->o.accum > 1 && !t->gs) toy_optim_scale_grads(t->opt, 1.0f / (float)t->o.accum, t->tp);
        double ar0 = now_s();
        if (t->allreduce && (st = t->allreduce(t->allreduce_ud, t->params, t->n_params))) {
            toy_data_set_state(t->data, &ds0);
            snprintf(err, sizeof err, "gradient all-reduce: %s", toy_last_error());
            r.reason = TOY_RUN_ERRORED;
            break;
        }
        if (t->allreduce) ar_s = now_s() - ar0;
        float gn;
        if (t->zero) { /* the norm over every rank's part */
            double sq = toy_optim_grad_sumsq(t->opt, t->tp);
            if ((st = t->reduce(t->allreduce_ud, &sq, 1))) {
                toy_data_set_state(t->data, &ds0);
                snprintf(err, sizeof err, "gradient norm all-reduce: %s", toy_last_error());
                r.reason = TOY_RUN_ERRORED;
                break;
            }
            gn = toy_optim_clip_to(t->opt, sq, t->o.clip, t->tp);
        } else {
            gn = toy_optim_clip_grad_norm(t->opt, t->o.clip, t->tp);
        }
        if (!isfinite(gn)) {
            /* A finite loss can still have non-finite gradients (an overflow in
             * the backward pass); the update would carry them into every
             * weight, so the run stops before it, as for a non-finite loss.
             * Every rank computed the same norm: they all stop here. */
            snprintf(err, sizeof err, "gradient norm is %s at step %lld (loss %g): stopped before the update; the "
                     "last good weights are checkpointed", isnan(gn) ? "NaN" : "infinite", (long long)step, loss);
            emit_stopped_step(t, step, loss, t0);
            r.reason = TOY_RUN_ABORTED;
            break;
        }
        float lr = toy_lr_at(&t->sched, step - 1);
        if ((st = toy_optim_step(t->opt, lr, t->tp))) {
            snprintf(err, sizeof err, "%s", toy_last_error());
            r.reason = TOY_RUN_ERRORED;
            break;
        }
        if (t->zero && (st = toy_grad_sync_allgather_params(t->gs))) {
            /* the ranks' parts are updated but not shared: no checkpoint of this state can be written */
            snprintf(err, sizeof err, "parameter all-gather: %s", toy_last_error());
            r.reason = TOY_RUN_ERRORED;
            break;
        }
        t->step = step;
        t->last_loss = loss;
        tokens += t->B * t->T * t->o.accum * t->world; /* the global batch */
        double wall = now_s() - t0;
        if (t->ev) {
            struct toy_step_event se = {step, loss, lr, t->B * t->T * t->o.accum * t->world, (int64_t)(wall * 1e6), gn,
                                        NULL, NULL};
            if (t->world > 1) { /* data parallelism: each rank's forward+backward throughput, the all-reduce time */
                se.extra = json_pack("{s:i,s:[],s:I}", "world", t->world, "rank_tokens_per_s", "allreduce_us",
                                     (json_int_t)(ar_s * 1e6));
                for (int k = 0; t->reduce && k < t->world; k++)
                    json_array_append_new(json_object_get(se.extra, "rank_tokens_per_s"),
                                          json_real(t->stats[2 + k] > 0 ? (double)(t->B * t->T * t->o.accum) /
                                                                              t->stats[2 + k] : 0));
            }
            if (t->balance) { /* this rank's micro-batches' mean: 1 when the experts share the tokens evenly */
                if (!se.extra) se.extra = json_object();
                json_object_set_new(se.extra, "moe_balance", json_real(balance / (double)t->o.accum));
            }
            enum toy_status est = toy_events_step(t->ev, &se);
            json_decref(se.extra);
            if (est && toy_events_out_of_space(t->ev)) { /* the checkpoints would fail too: stop before more is lost */
                snprintf(err, sizeof err, "%s", toy_last_error());
                st = est;
                r.reason = TOY_RUN_ERRORED;
                break;
            }
        }
        if (t->o.trace) {
            char name[48];
            snprintf(name, sizeof name, "step %lld", (long long)step);
            toy_trace_span_copy(t->o.trace, name, "step", tr0, toy_trace_now(t->o.trace), 0);
        }
        if (t->o.op_timing && t->ev) {
            const double *us = toy_graph_op_times_us(t->g);
            json_t *buckets = json_object();
            double total = 0;
            for (int op = 0; op < TOY_OP_COUNT; op++)
                if (us[op] > 0) {
                    json_object_set_new(buckets, toy_op_name(op), json_integer((json_int_t)us[op]));
                    total += us[op];
                }
            toy_events_op_timing(t->ev, step, (int64_t)total, buckets);
            json_decref(buckets);
        }
        struct toy_step_info info = {step, t->o.steps, (float)loss, lr, gn, tokens, now_s() - t_start, NAN};
        if (t->o.eval_every > 0 && step % t->o.eval_every == 0 && step < t->o.steps &&
            toy_trainer_eval(t, t->o.eval_batches, &info.eval_loss) == TOY_OK) {
            r.final_eval_loss = info.eval_loss;
            if (t->ev) {
                struct toy_eval_event ee = {step, "validation", info.eval_loss, t->eval_windows, t->eval_tokens, NULL};
                toy_events_eval(t->ev, &ee);
            }
        }
        if (t->on_step) t->on_step(t->ud, &info);
        if (t->o.ckpt_every > 0 && step % t->o.ckpt_every == 0 && step < t->o.steps && t->reduce &&
            (st = check_replicas(t))) {
            snprintf(err, sizeof err, "%s", toy_last_error());
            r.reason = TOY_RUN_ERRORED;
            diverged = st == TOY_ERR_STATE;
            break;
        }
        if (t->o.ckpt_every > 0 && step % t->o.ckpt_every == 0 && step < t->o.steps &&
            (st = toy_trainer_checkpoint(t, NULL, 0))) {
            snprintf(err, sizeof err, "checkpoint: %s", toy_last_error());
            r.reason = TOY_RUN_ERRORED;
            break;
        }
    }
    r.seconds = now_s() - t_start;
    r.tokens_per_s = r.seconds > 0 ? (double)tokens / r.seconds : 0;
    if (t->reduce && (r.reason == TOY_RUN_COMPLETED || r.reason == TOY_RUN_INTERRUPTED) && (st = check_replicas(t))) {
        snprintf(err, sizeof err, "%s", toy_last_error());
        r.reason = TOY_RUN_ERRORED;
        diverged = st == TOY_ERR_STATE;
    }
    /* the last state is saved, whatever ended the run, unless the replicas diverged: then no rank's weights
     * are the run's, and weights/latest stays on the last checkpoint they agreed on */
    enum toy_status cst = TOY_OK;
    if (diverged) {
        size_t n = strlen(err);
        snprintf(err + n, sizeof err - n, "; these weights are not saved: --resume starts from the last checkpoint "
                 "the replicas agreed on, if there is one");
    } else {
        cst = toy_trainer_checkpoint(t, r.checkpoint, sizeof r.checkpoint);
    }
    if (cst && r.reason != TOY_RUN_ERRORED) {
        snprintf(err, sizeof err, "checkpoint: %s", toy_last_error());
        r.reason = TOY_RUN_ERRORED;
        st = cst;
    } else if (cst) { /* say so: the error above may have asked for a --resume that has no checkpoint to start from */
        size_t n = strlen(err);
        snprintf(err + n, sizeof err - n, "; the last checkpoint could not be written either (%s): --resume starts "
                 "from the one before, if there is one", toy_last_error());
    }
    if (r.reason == TOY_RUN_COMPLETED || r.reason == TOY_RUN_INTERRUPTED) {
        float el;
        if ((toy_data_eval_windows(t->data) > 0 || t->reduce) && toy_trainer_eval(t, t->o.eval_batches, &el) == TOY_OK) {
            r.final_eval_loss = el;
            if (t->ev) {
                struct toy_eval_event ee = {t->step, "final", el, t->eval_windows, t->eval_tokens, NULL};
                toy_events_eval(t->ev, &ee);
            }
        }
    }
    if (r.reason == TOY_RUN_COMPLETED) sample(t);
    r.final_step = t->step;
    r.final_loss = t->last_loss;
    if (res) *res = r;
    emit_end(t, r.reason, err[0] ? err : NULL, toy_run_reason_exit_code(r.reason));
    if (r.reason == TOY_RUN_ABORTED) return toy_error(TOY_ERR_NUMERIC, "%s", err);
    if (r.reason == TOY_RUN_ERRORED) return toy_error(st ? st : TOY_ERR_IO, "%s", err);
    return TOY_OK;
}
