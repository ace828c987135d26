/* finetune.c: the fine-tuning loop of toy/finetune.h: LoRA / QLoRA (only
 * the adapter's A and B are parameters; the base is frozen, possibly
 * quantized and mapped) or a full fine-tune, over SFT rows whose targets
 * are -100 outside the completion tokens.
 *
 * The same engine pieces as trainer.c: one training graph built once and
 * run `accum` times per optimizer step (gradients add up in the persistent
 * buffers, scaled by 1/accum), global-norm clipping, AdamW, a forward-only
 * evaluation graph sharing the planned activation buffer, the toy/v1
 * events, checkpoints with a .state.gguf sidecar, and resume. The
 * evaluation graph is built before the dropout masks are hooked in, so it
 * never drops. A resumed run draws the same rows and dropout masks as an
 * uninterrupted one.
 *
 * Packing (the default): each micro-batch is B rows of T positions filled
 * first-fit with whole examples (toy_sft_next_packed), each example its own
 * attention segment with positions restarting at 0
 * (toy_llama_forward_packed), so the loss and gradients are those of the
 * examples one per row while almost no position is padding. The evaluation
 * graph keeps one example per row (its loss is the same either way).
 *
 * Length buckets: rows are mostly padding when examples are short and not
 * packed, so training graphs are built for T, T/2, T/4 and T/8 (down to 16
 * positions), all planned into one buffer and sharing the gradient buffers;
 * each micro-batch runs the shortest graph that holds its last learned
 * target. Causal attention makes the loss the same as at full length:
 * positions past the last target neither carry targets nor feed earlier
 * positions (packed rows too: a later document never feeds an earlier one). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "toy/finetune.h"
#include "toy/gguf.h"
#include "toy/graph.h"
#include "toy/run-dir.h"

struct toy_finetuner {
    struct toy_llama *m;
    struct toy_lora *lora;
    const struct toy_tokenizer *tok;
    struct toy_sft *data;
    struct toy_finetune_opts o;
    char run_dir[1024];
    struct toy_events *ev;
    struct toy_threadpool *tp;
    int64_t B, T, steps;
    struct toy_ctx *ectx;
    struct toy_tensor *etok, *etgt, *eloss;
    struct toy_graph *eg;
    struct bucket {
        int64_t T;
        struct toy_ctx *ctx;
        struct toy_tensor *tok, *tgt, *pos, *seg, *loss; /* pos, seg: packed only */
        struct toy_graph *g;
    } bk[4];                    /* training graphs, longest first */
    int n_bk;
    bool pack;
    int32_t *x, *y, *pos, *seg; /* (B, T) the micro-batch as drawn (pos, seg: packed) */
    int64_t run_positions;      /* positions the training graphs ran (for the packing efficiency) */
    int64_t mine_positions;     /* example positions of the micro-batches this rank ran (of run_positions) */
    struct toy_membuf buf;
    struct toy_optim *opt;
    struct toy_lr_schedule sched;
    int64_t step;
    double last_loss; /* the last step's loss as its event has it (run_end repeats it) */
    toy_step_fn on_step;
    void *ud;
    int64_t eval_rows, eval_tokens;
    struct toy_tensor **own_grads; /* parameters whose gradient buffers live in ctx */
    int n_own_grads;
    /* data parallelism (toy_finetuner_set_collective) */
    int rank, world;
    toy_allreduce_fn allreduce;
    toy_reduce_sum_fn reduce;
    void *coll;
    int32_t *sx, *sy, *spos, *sseg; /* another rank's micro-batch, drawn to keep the sampler in step */
    struct toy_tensor **params;     /* the optimizer's, in order */
    int n_params;
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

const char *toy_ft_method_name(enum toy_ft_method m) {
    return m == TOY_FT_LORA ? "lora" : m == TOY_FT_QLORA ? "qlora" : m == TOY_FT_FULL ? "full" : "?";
}

int toy_ft_method_from_name(const char *s) {
    if (!strcmp(s, "lora")) return TOY_FT_LORA;
    if (!strcmp(s, "qlora")) return TOY_FT_QLORA;
    if (!strcmp(s, "full")) return TOY_FT_FULL;
    return -1;
}

/* packed: pos {T*B} and seg {T, B} are inputs set per micro-batch (else NULL) */
static struct toy_tensor *build_loss(struct toy_ctx *ctx, struct toy_llama *m, int64_t T, int64_t B, bool packed,
                                     struct toy_tensor **tok, struct toy_tensor **tgt, struct toy_tensor **ppos,
                                     struct toy_tensor **pseg) {
    *tok = toy_set_name(toy_new_tensor_2d(ctx, TOY_I32, T, B), "tokens");
    *tgt = toy_set_name(toy_new_tensor_2d(ctx, TOY_I32, T, B), "targets");
    struct toy_tensor *logits;
    if (packed) {
        *ppos = toy_set_name(toy_new_tensor_1d(ctx, TOY_I32, T * B), "positions");
        *pseg = toy_set_name(toy_new_tensor_2d(ctx, TOY_I32, T, B), "segments");
        logits = toy_llama_forward_packed(ctx, m, *tok, *ppos, *pseg);
    } else {
        struct toy_tensor *pos = toy_set_name(toy_new_tensor_1d(ctx, TOY_I32, T), "positions");
        for (int64_t t = 0; t < T; t++) ((int32_t *)pos->data)[t] = (int32_t)t;
        logits = toy_llama_forward(ctx, m, *tok, pos);
    }
    return toy_set_name(toy_cross_entropy(ctx, logits, *tgt, -100), "loss");
}

static bool is_quantized(enum toy_dtype t) { return t != TOY_F32 && t != TOY_F16 && t != TOY_BF16; }

enum toy_status toy_finetuner_new(struct toy_llama *m, struct toy_lora *lora, const struct toy_tokenizer *tok,
                                  struct toy_sft *data, const struct toy_finetune_opts *o, const char *run_dir,
                                  struct toy_events *ev, int n_threads, struct toy_finetuner **out) {
    if (!out) return toy_error(TOY_ERR_INVALID_ARG, "toy_finetuner_new: out is NULL");
    *out = NULL;
    int64_t T = toy_sft_ctx(data), B = o->batch;
    if (B < 1) return toy_error(TOY_ERR_INVALID_ARG, "batch %lld must be >= 1", (long long)B);
    const struct toy_train_opts *tr = &o->train;
    enum toy_status cst =
        toy_optim_check_settings(tr->lr, tr->lr_min, tr->weight_decay, tr->beta1, tr->beta2, tr->eps, tr->clip);
    if (cst) return cst;
    if (T > m->cfg.max_ctx)
        return toy_error(TOY_ERR_INVALID_ARG, "context %lld is longer than the model's %lld", (long long)T,
                         (long long)m->cfg.max_ctx);
    if (tok && toy_tokenizer_n_vocab(tok) > m->cfg.vocab)
        return toy_error(TOY_ERR_INVALID_ARG, "the tokenizer has %lld tokens, the model only %lld",
                         (long long)toy_tokenizer_n_vocab(tok), (long long)m->cfg.vocab);
    if (o->method != TOY_FT_FULL && !lora)
        return toy_error(TOY_ERR_INVALID_ARG, "%s fine-tuning needs an attached adapter", toy_ft_method_name(o->method));
    if (o->method == TOY_FT_FULL && lora)
        return toy_error(TOY_ERR_INVALID_ARG, "a full fine-tune takes no adapter");
    if (o->method == TOY_FT_QLORA && !is_quantized(m->layers[0].wo->type))
        return toy_error(TOY_ERR_INVALID_ARG, "qlora needs a quantized base (its projections are %s): "
                         "`toy quantize base.gguf base-q4_0.gguf q4_0` first, or use --method lora",
                         toy_dtype_name(m->layers[0].wo->type));
    struct toy_finetuner *f = calloc(1, sizeof *f);
    if (!f) return toy_error(TOY_ERR_NOMEM, "finetuner");
    f->m = m;
    f->lora = lora;
    f->tok = tok;
    f->data = data;
    f->o = *o;
    if (f->o.train.accum < 1) f->o.train.accum = 1;
    if (f->o.epochs < 1) f->o.epochs = 1;
    f->pack = !o->no_pack;
    f->world = o->world > 1 ? o->world : 1;
    f->rank = f->world > 1 ? o->rank : 0;
    f->steps = f->o.train.steps;
    int64_t per_step = f->o.train.accum * f->world; /* micro-batches per optimizer step, over all ranks */
    if (f->steps <= 0 && f->pack) { /* the micro-batches the epochs pack into */
        int64_t n = toy_sft_packed_batches(data, B, f->o.epochs, NULL);
        if (n < 0) { free(f); return toy_error(TOY_ERR_NOMEM, "finetuner"); }
        f->steps = (n + per_step - 1) / per_step;
    } else if (f->steps <= 0) {
        int64_t per = B * per_step;
        f->steps = f->o.epochs * ((toy_sft_n_train(data) + per - 1) / per);
    }
    f->o.train.steps = f->steps;
    snprintf(f->run_dir, sizeof f->run_dir, "%s", run_dir);
    f->ev = ev;
    f->B = B;
    f->T = T;
    f->tp = toy_threadpool_new(n_threads);
    m->matmul_type = o->train.bf16 ? TOY_BF16 : TOY_F32;
    if (o->method == TOY_FT_FULL && o->freeze_embeddings) toy_set_frozen(m->tok_embd); /* a tied head too */
    /* evaluation first: no dropout masks in it */
    if (lora) toy_lora_dropout_end(lora);
    f->ectx = toy_ctx_init(true);
    f->eloss = build_loss(f->ectx, m, T, B, false, &f->etok, &f->etgt, NULL, NULL);
    f->eg = toy_graph_new(f->ectx);
    toy_graph_build(f->eg, f->eloss);
    enum toy_status st = TOY_OK;
    f->x = malloc((size_t)(B * T) * sizeof *f->x);
    f->y = malloc((size_t)(B * T) * sizeof *f->y);
    f->pos = malloc((size_t)(B * T) * sizeof *f->pos);
    f->seg = malloc((size_t)(B * T) * sizeof *f->seg);
    if (!f->x || !f->y || !f->pos || !f->seg) { toy_finetuner_free(f); return toy_error(TOY_ERR_NOMEM, "finetuner"); }
    for (int64_t bt = T; f->n_bk < 4 && (bt == T || bt >= 16) && !st; bt /= 2) {
        struct bucket *k = &f->bk[f->n_bk++];
        k->T = bt;
        if (lora && (st = toy_lora_dropout_begin(lora, bt, B))) break; /* masks of this length */
        k->ctx = toy_ctx_init(true);
        k->loss = build_loss(k->ctx, m, bt, B, f->pack, &k->tok, &k->tgt, &k->pos, &k->seg);
        k->g = toy_graph_new(k->ctx);
        toy_graph_build(k->g, k->loss);
        if (f->n_bk == 1) {
            /* the gradient buffers backward creates live in this ctx (the
             * other buckets reuse them): forget them on free */
            f->own_grads = calloc((size_t)toy_graph_n_params(k->g) + 1, sizeof *f->own_grads);
            if (!f->own_grads) { st = toy_error(TOY_ERR_NOMEM, "finetuner"); break; }
            for (int i = 0; i < toy_graph_n_params(k->g); i++)
                if (!toy_graph_param(k->g, i)->grad) f->own_grads[f->n_own_grads++] = toy_graph_param(k->g, i);
        }
        toy_graph_backward(k->g, k->loss);
    }
    if (lora) toy_lora_dropout_end(lora); /* the graphs keep their masks; generation must not see them */
    /* one buffer for all: plan until no plan moves it */
    for (int pass = 0; pass < 3 && !st; pass++) {
        void *before = f->buf.data;
        for (int i = 0; i < f->n_bk && !st; i++) st = toy_graph_plan(f->bk[i].g, &f->buf, NULL);
        if (!st) st = toy_graph_plan(f->eg, &f->buf, NULL);
        if (f->buf.data == before && pass > 0) break;
    }
    if (st) { toy_finetuner_free(f); return st; }
    const struct toy_train_opts *to = &f->o.train;
    f->opt = toy_optim_new(TOY_OPTIM_ADAMW);
    int decay = toy_optim_add_group(f->opt, &(struct toy_optim_group){.beta1 = to->beta1, .beta2 = to->beta2,
                                                                      .eps = to->eps, .weight_decay = to->weight_decay});
    int nodecay = toy_optim_add_group(f->opt, &(struct toy_optim_group){.beta1 = to->beta1, .beta2 = to->beta2, .eps = to->eps});
    int n_params = 0;
    if (lora) {
        for (int i = 0; i < toy_lora_n_tensors(lora); i++, n_params++)
            toy_optim_add_param(f->opt, toy_lora_tensor(lora, i), decay);
    } else {
        for (int i = 0; i < toy_llama_n_tensors(m); i++) {
            struct toy_tensor *p = toy_llama_tensor(m, i);
            if (!(p->flags & TOY_FLAG_PARAM) || !p->grad) continue;
            toy_optim_add_param(f->opt, p, p->ne[1] > 1 ? decay : nodecay);
            n_params++;
        }
    }
    if (!n_params) {
        toy_finetuner_free(f);
        return toy_error(TOY_ERR_INVALID_ARG, "nothing to train: the model has no trainable tensors "
                         "(a full fine-tune needs the base loaded trainable)");
    }
    f->sched = (struct toy_lr_schedule){to->schedule, to->lr, to->lr_min, to->warmup, f->steps};
    f->last_loss = NAN;
    f->n_params = toy_optim_n_params(f->opt);
    if (!(f->params = malloc((size_t)f->n_params * sizeof *f->params))) {
        toy_finetuner_free(f);
        return toy_error(TOY_ERR_NOMEM, "finetuner");
    }
    for (int i = 0; i < f->n_params; i++) f->params[i] = toy_optim_param(f->opt, i);
    *out = f;
    return TOY_OK;
}

void toy_finetuner_free(struct toy_finetuner *f) {
    if (!f) return;
    free(f->sx);
    free(f->sy);
    free(f->spos);
    free(f->sseg);
    free(f->params);
    for (int i = 0; i < f->n_own_grads; i++) f->own_grads[i]->grad = NULL;
    free(f->own_grads);
    toy_optim_free(f->opt);
    for (int i = 0; i < f->n_bk; i++) toy_ctx_free(f->bk[i].ctx);
    free(f->x);
    free(f->y);
    free(f->pos);
    free(f->seg);
    toy_ctx_free(f->ectx);
    toy_membuf_free(&f->buf);
    toy_threadpool_free(f->tp);
    free(f);
}

int toy_finetuner_params(const struct toy_finetuner *f, struct toy_tensor *const **params) {
    *params = f->params;
    return f->n_params;
}

enum toy_status toy_finetuner_set_collective(struct toy_finetuner *f, toy_allreduce_fn allreduce,
                                             toy_reduce_sum_fn reduce, void *ud) {
    if (f->world < 2) return TOY_OK;
    size_t n = (size_t)(f->B * f->T);
    f->sx = malloc(n * sizeof *f->sx);
    f->sy = malloc(n * sizeof *f->sy);
    f->spos = malloc(n * sizeof *f->spos);
    f->sseg = malloc(n * sizeof *f->sseg);
    if (!f->sx || !f->sy || !f->spos || !f->sseg) return toy_error(TOY_ERR_NOMEM, "finetuner: %zu positions", n);
    f->allreduce = allreduce;
    f->reduce = reduce;
    f->coll = ud;
    /* gradients are reduced in host memory: the optimizer steps there too */
    return f->opt ? toy_optim_set_device_resident(f->opt, false) : TOY_OK;
}

void toy_finetuner_on_step(struct toy_finetuner *f, toy_step_fn fn, void *ud) {
    f->on_step = fn;
    f->ud = ud;
}

int64_t toy_finetuner_steps(const struct toy_finetuner *f) { return f->steps; }
int64_t toy_finetuner_step(const struct toy_finetuner *f) { return f->step; }
size_t toy_finetuner_activation_bytes(const struct toy_finetuner *f) { return f->buf.size; }

double toy_finetuner_pack_efficiency(const struct toy_finetuner *f) {
    if (!f->run_positions) return NAN;
    return (double)f->mine_positions / (double)f->run_positions;
}

size_t toy_finetuner_trainable_bytes(const struct toy_finetuner *f) {
    size_t n = 0;
    for (int i = 0; i < toy_optim_n_params(f->opt); i++) n += (size_t)toy_nelements(toy_optim_param(f->opt, i));
    return n * 4 * sizeof(float);
}

static int64_t count_targets(const struct toy_tensor *y) {
    int64_t n = 0;
    for (int64_t i = 0; i < toy_nelements(y); i++) n += ((const int32_t *)y->data)[i] != -100;
    return n;
}

enum toy_status toy_finetuner_eval(struct toy_finetuner *f, int64_t n_batches, float *loss) {
    if (!loss) return toy_error(TOY_ERR_INVALID_ARG, "toy_finetuner_eval: loss is NULL");
    int64_t held = toy_sft_n_heldout(f->data);
    if (held <= 0) {
        *loss = NAN;
        return toy_error(TOY_ERR_STATE, "no held-out examples to evaluate (use a held-out fraction > 0)");
    }
    double sum = 0;
    int64_t count = 0, rows = 0;
    for (int64_t first = 0, b = 0; first < held && (n_batches <= 0 || b < n_batches); first += f->B, b++) {
        rows += toy_sft_eval_batch(f->data, first, f->B, f->etok->data, f->etgt->data);
        int64_t n = count_targets(f->etgt);
        enum toy_status st = toy_graph_compute(f->eg, f->tp);
        if (st) return st;
        sum += (double)*(float *)f->eloss->data * (double)n;
        count += n;
    }
    *loss = count ? (float)(sum / (double)count) : NAN;
    f->eval_rows = rows;
    f->eval_tokens = count;
    return TOY_OK;
}

/* ---- checkpoints ------------------------------------------------------------------ */

static json_t *opts_json(const struct toy_finetuner *f) {
    json_t *j = toy_train_opts_to_json(&f->o.train);
    json_object_set_new(j, "method", json_string(toy_ft_method_name(f->o.method)));
    json_object_set_new(j, "batch", json_integer(f->B));
    json_object_set_new(j, "epochs", json_integer(f->o.epochs));
    json_object_set_new(j, "freeze_embeddings", json_boolean(f->o.freeze_embeddings));
    json_object_set_new(j, "pack", json_boolean(f->pack));
    return j;
}

static enum toy_status write_state(struct toy_finetuner *f, const char *path) {
    struct toy_gguf_writer *w;
    enum toy_status st = toy_gguf_writer_init(&w);
    if (st) return st;
    struct toy_sft_state ds;
    toy_sft_get_state(f->data, &ds);
    st = toy_gguf_writer_set_str(w, "general.type", "toy-finetune-state");
    if (!st) st = toy_gguf_writer_set_u64(w, "toy.step", (uint64_t)f->step);
    if (!st) st = toy_gguf_writer_set_u64(w, "toy.optim.steps", (uint64_t)toy_optim_step_count(f->opt));
    if (!st) st = toy_gguf_writer_set_i64(w, "toy.sft.epoch", ds.epoch);
    if (!st) st = toy_gguf_writer_set_i64(w, "toy.sft.pos", ds.pos);
    if (!st) st = toy_gguf_writer_set_i64(w, "toy.sft.rows", ds.rows);
    if (!st) st = toy_gguf_writer_set_i64(w, "toy.sft.tokens", ds.tokens);
    if (!st && f->lora) st = toy_gguf_writer_set_arr(w, "toy.lora.rng", TOY_GGUF_U64, toy_lora_rng(f->lora)->s, 4);
    if (!st) st = toy_gguf_writer_set_f64(w, "toy.last_loss", f->last_loss);
    json_t *oj = opts_json(f);
    char *os = oj ? json_dumps(oj, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    if (!st && !os) st = toy_error(TOY_ERR_NOMEM, "checkpoint: the fine-tuning options as JSON");
    if (!st) st = toy_gguf_writer_set_str(w, "toy.finetune.opts", os);
    free(os);
    json_decref(oj);
    if (!st) st = toy_optim_write_gguf(f->opt, w);
    if (!st) st = toy_gguf_writer_write(w, path);
    toy_gguf_writer_free(w);
    return st;
}

enum toy_status toy_finetuner_checkpoint(struct toy_finetuner *f, char *out, size_t out_size) {
    char dir[1100], path[1200], state[1200];
    snprintf(dir, sizeof dir, "%s/weights", f->run_dir);
    enum toy_status st = toy_mkdir_p(dir);
    if (st) return st;
    snprintf(path, sizeof path, "%s/step_%lld.gguf", dir, (long long)f->step);
    snprintf(state, sizeof state, "%s/step_%lld.state.gguf", dir, (long long)f->step);
    if ((st = write_state(f, state))) return st;
    struct toy_gguf_writer *w;
    if ((st = toy_gguf_writer_init(&w))) return st;
    if (f->lora) {
        st = toy_lora_write_gguf(f->lora, w);
    } else {
        st = toy_llama_write_gguf(f->m, w, TOY_F32);
        if (!st) st = toy_gguf_writer_set_str(w, "general.name", "toy-finetune");
        if (!st && f->tok) st = toy_tokenizer_write_gguf(f->tok, w);
    }
    if (!st) st = toy_gguf_writer_set_str(w, "toy.checkpoint_format", f->lora ? "toy-lora/v1" : "toy-finetune/v1");
    if (!st) st = toy_gguf_writer_set_u64(w, "toy.step", (uint64_t)f->step);
    if (!st) st = toy_gguf_writer_write(w, path);
    toy_gguf_writer_free(w);
    if (!st) st = toy_run_link_latest(path);
    if (!st && out) snprintf(out, out_size, "%s", path);
    return st;
}

static enum toy_status get_i64(const struct toy_gguf *g, const char *key, int64_t *v) {
    if (toy_gguf_get_i64(g, key, v)) return toy_error(TOY_ERR_FORMAT, "%s: missing or bad %s", toy_gguf_path(g), key);
    return TOY_OK;
}

enum toy_status toy_finetuner_load_state(struct toy_finetuner *f, const char *path) {
    struct toy_gguf *g;
    enum toy_status st = toy_gguf_open(path, &g);
    if (st) return st;
    int64_t step = 0, osteps = 0, kv;
    struct toy_sft_state ds = {0};
    st = get_i64(g, "toy.step", &step);
    if (!st) st = get_i64(g, "toy.optim.steps", &osteps);
    if (!st) st = get_i64(g, "toy.sft.epoch", &ds.epoch);
    if (!st) st = get_i64(g, "toy.sft.pos", &ds.pos);
    if (!st) st = get_i64(g, "toy.sft.rows", &ds.rows);
    if (!st) st = get_i64(g, "toy.sft.tokens", &ds.tokens);
    if (!st && f->lora) {
        if (toy_gguf_get_arr(g, "toy.lora.rng", &kv, NULL, NULL) == TOY_OK && toy_gguf_arr_len(g, kv) == 4 &&
            toy_gguf_arr_type(g, kv) == TOY_GGUF_U64)
            memcpy(toy_lora_rng(f->lora)->s, toy_gguf_arr_data(g, kv), 4 * sizeof(uint64_t));
        else
            st = toy_error(TOY_ERR_FORMAT, "%s: missing toy.lora.rng (4 u64)", path);
    }
    if (!st) st = toy_optim_read_gguf(f->opt, g);
    double ll;
    if (!st && !toy_gguf_get_f64(g, "toy.last_loss", &ll)) f->last_loss = ll;
    if (!st) {
        f->step = step;
        toy_optim_set_step_count(f->opt, osteps);
        toy_sft_set_state(f->data, &ds);
    }
    toy_gguf_close(g);
    return st;
}

/* ---- the loop ------------------------------------------------------------------------ */

/* The shortest graph that holds every learned target of the drawn
 * micro-batch, with the rows copied into its inputs. */
static struct bucket *pick_bucket(struct toy_finetuner *f) {
    int64_t need = 1;
    for (int64_t b = 0; b < f->B; b++)
        for (int64_t t = f->T - 1; t >= need; t--)
            if (f->y[b * f->T + t] != -100) {
                need = t + 1;
                break;
            }
    struct bucket *k = &f->bk[0];
    for (int i = 1; i < f->n_bk; i++)
        if (f->bk[i].T >= need) k = &f->bk[i];
    int32_t *x = k->tok->data, *y = k->tgt->data; /* (B, k->T) */
    for (int64_t b = 0; b < f->B; b++) {
        memcpy(x + b * k->T, f->x + b * f->T, (size_t)k->T * sizeof *x);
        memcpy(y + b * k->T, f->y + b * f->T, (size_t)k->T * sizeof *y);
        if (f->pack) {
            memcpy((int32_t *)k->pos->data + b * k->T, f->pos + b * f->T, (size_t)k->T * sizeof *x);
            memcpy((int32_t *)k->seg->data + b * k->T, f->seg + b * f->T, (size_t)k->T * sizeof *x);
        }
    }
    f->run_positions += f->B * k->T;
    return k;
}

static void emit_end(struct toy_finetuner *f, enum toy_run_reason reason, const char *err, int code) {
    if (!f->ev) return;
    struct toy_run_end e = {reason, err, f->step, f->last_loss, code, NULL};
    toy_events_run_end(f->ev, &e);
}

static void emit_eval(struct toy_finetuner *f, const char *name, float loss) {
    if (!f->ev) return;
    struct toy_eval_event ee = {f->step, name, loss, f->eval_rows, f->eval_tokens, NULL};
    toy_events_eval(f->ev, &ee);
}

enum toy_status toy_finetuner_run(struct toy_finetuner *f, struct toy_train_result *res) {
    struct toy_train_result r = {.reason = TOY_RUN_COMPLETED, .final_eval_loss = NAN};
    const struct toy_train_opts *o = &f->o.train;
    double t_start = now_s();
    int64_t tokens = 0;
    enum toy_status st = TOY_OK;
    char err[512] = "";
    bool dp = f->world > 1 && f->allreduce && f->reduce;
    while (f->step < f->steps) {
        if (!dp && o->stop && *o->stop) { /* ranks agree on stopping after a step (below) */
            r.reason = TOY_RUN_INTERRUPTED;
            break;
        }
        double t0 = now_s();
        toy_optim_zero_grad(f->opt);
        double loss = 0;
        int64_t step_tokens = 0;
        for (int64_t a = 0; a < o->accum && !st; a++) {
            for (int w = 0; w < (dp ? f->world : 1); w++) {
                bool mine = !dp || w == f->rank;
                int32_t *x = mine ? f->x : f->sx, *y = mine ? f->y : f->sy;
                int64_t p0 = toy_sft_positions(f->data); /* every rank draws every micro-batch: count its own */
                if (!f->pack) toy_sft_next_batch(f->data, f->B, x, y);
                else if (toy_sft_next_packed(f->data, f->B, x, y, mine ? f->pos : f->spos, mine ? f->seg : f->sseg) < 0) {
                    st = toy_error(TOY_ERR_NOMEM, "packing a batch");
                    break;
                }
                if (f->lora) toy_lora_dropout_refresh(f->lora); /* every rank's masks, in the same order */
                if (!mine) continue;
                f->mine_positions += toy_sft_positions(f->data) - p0;
                struct bucket *k = pick_bucket(f);
                step_tokens += count_targets(k->tgt);
                if ((st = toy_graph_compute(k->g, f->tp))) break;
                loss += *(float *)k->loss->data;
            }
        }
        if (!st && o->accum > 1) toy_optim_scale_grads(f->opt, 1.0f / (float)o->accum, f->tp);
        bool stop_all = false;
        if (!st && dp) { /* the mean gradient; the global loss, tokens and stop requests */
            st = f->allreduce(f->coll, f->params, f->n_params);
            double v[3] = {loss, (double)step_tokens, o->stop && *o->stop ? 1.0 : 0.0};
            if (!st) st = f->reduce(f->coll, v, 3);
            loss = v[0] / (double)f->world;
            step_tokens = (int64_t)v[1];
            stop_all = v[2] > 0;
        }
        if (st) {
            snprintf(err, sizeof err, "%s", toy_last_error());
            r.reason = TOY_RUN_ERRORED;
            break;
        }
        loss /= (double)o->accum;
        int64_t step = f->step + 1;
        if (!isfinite(loss)) {
            snprintf(err, sizeof err, "loss is %s at step %lld: stopped; the last good weights are checkpointed",
                     isnan(loss) ? "NaN" : "infinite", (long long)step);
            r.reason = TOY_RUN_ABORTED;
            break;
        }
        float gn = toy_optim_clip_grad_norm(f->opt, o->clip, f->tp);
        if (!isfinite(gn)) { /* the update would make the weights non-finite: stop before it (as toy train does) */
            snprintf(err, sizeof err, "gradient norm is %s at step %lld (loss %g): stopped before the update; the "
                     "last good weights are checkpointed", isnan(gn) ? "NaN" : "infinite", (long long)step, loss);
            r.reason = TOY_RUN_ABORTED;
            break;
        }
        float lr = toy_lr_at(&f->sched, step - 1);
        if ((st = toy_optim_step(f->opt, lr, f->tp))) {
            snprintf(err, sizeof err, "%s", toy_last_error());
            r.reason = TOY_RUN_ERRORED;
            break;
        }
        f->step = step;
        f->last_loss = loss;
        tokens += step_tokens;
        double wall = now_s() - t0;
        if (f->ev) {
            json_t *extra = json_pack("{s:I}", "target_tokens", (json_int_t)step_tokens);
            struct toy_step_event se = {step, loss, lr, f->B * f->T * o->accum, (int64_t)(wall * 1e6), gn, NULL, extra};
            enum toy_status est = toy_events_step(f->ev, &se);
            json_decref(extra);
            if (est && toy_events_out_of_space(f->ev)) { /* the checkpoints would fail too: stop before more is lost */
                snprintf(err, sizeof err, "%s", toy_last_error());
                st = est;
                r.reason = TOY_RUN_ERRORED;
                break;
            }
        }
        struct toy_step_info info = {step, f->steps, (float)loss, lr, gn, tokens, now_s() - t_start, NAN};
        if (o->eval_every > 0 && step % o->eval_every == 0 && step < f->steps && toy_sft_n_heldout(f->data) > 0 &&
            toy_finetuner_eval(f, o->eval_batches, &info.eval_loss) == TOY_OK) {
            r.final_eval_loss = info.eval_loss;
            emit_eval(f, "validation", info.eval_loss);
        }
        if (f->on_step) f->on_step(f->ud, &info);
        if (o->ckpt_every > 0 && step % o->ckpt_every == 0 && step < f->steps && f->rank == 0 &&
            (st = toy_finetuner_checkpoint(f, NULL, 0))) {
            snprintf(err, sizeof err, "checkpoint: %s", toy_last_error());
            r.reason = TOY_RUN_ERRORED;
            break;
        }
        if (stop_all && f->step < f->steps) {
            r.reason = TOY_RUN_INTERRUPTED;
            break;
        }
    }
    r.seconds = now_s() - t_start;
    r.tokens_per_s = r.seconds > 0 ? (double)tokens / r.seconds : 0;
    enum toy_status cst = f->rank == 0 ? toy_finetuner_checkpoint(f, r.checkpoint, sizeof r.checkpoint) : TOY_OK;
    if (cst && r.reason != TOY_RUN_ERRORED) {
        snprintf(err, sizeof err, "checkpoint: %s", toy_last_error());
        r.reason = TOY_RUN_ERRORED;
        st = cst;
    } else if (cst) { /* say so: the error above may have asked for a --resume that has no checkpoint to start from */
        size_t n = strlen(err);
        snprintf(err + n, sizeof err - n, "; the last checkpoint could not be written either (%s): --resume starts "
                 "from the one before, if there is one", toy_last_error());
    }
    if ((r.reason == TOY_RUN_COMPLETED || r.reason == TOY_RUN_INTERRUPTED) && toy_sft_n_heldout(f->data) > 0) {
        float el;
        if (toy_finetuner_eval(f, o->eval_batches, &el) == TOY_OK) {
            r.final_eval_loss = el;
            emit_eval(f, "final", el);
        }
    }
    r.final_step = f->step;
    r.final_loss = f->last_loss;
    if (res) *res = r;
    emit_end(f, r.reason, err[0] ? err : NULL, toy_run_reason_exit_code(r.reason));
    if (r.reason == TOY_RUN_ABORTED) return toy_error(TOY_ERR_NUMERIC, "%s", err);
    if (r.reason == TOY_RUN_ERRORED) return toy_error(st ? st : TOY_ERR_IO, "%s", err);
    return TOY_OK;
}
