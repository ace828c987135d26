/* optim.c: AdamW and SGD with momentum over parameter buffers, gradient
 * clipping by global norm. Semantics: torch.optim.AdamW / torch.optim.SGD
 * (PyTorch 1.13 single-tensor paths), so runs can be checked step by step
 * against PyTorch (tests/test-optim.c). Each step is one pool task; every
 * thread updates its slice of every parameter. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/cpu-impl.h"
#include "toy/gguf.h"
#include "toy/optim.h"
#include <stdio.h>

struct oparam {
    struct toy_tensor *p;
    int group;
    float *m, *v; /* AdamW moments / SGD momentum (m) */
};

struct toy_optim {
    enum toy_optim_kind kind;
    struct toy_optim_group *groups;
    int n_groups;
    struct oparam *params;
    int n_params;
    int64_t steps;
};

struct toy_optim *toy_optim_new(enum toy_optim_kind kind) {
    struct toy_optim *o = calloc(1, sizeof *o);
    if (o) o->kind = kind;
    return o;
}

void toy_optim_free(struct toy_optim *o) {
    if (!o) return;
    for (int i = 0; i < o->n_params; i++) {
        free(o->params[i].m);
        free(o->params[i].v);
    }
    free(o->params);
    free(o->groups);
    free(o);
}

int toy_optim_add_group(struct toy_optim *o, const struct toy_optim_group *g) {
    o->groups = realloc(o->groups, (size_t)(o->n_groups + 1) * sizeof *o->groups);
    if (!o->groups) TOY_ABORT("out of memory (optimizer groups)");
    struct toy_optim_group d = *g;
    if (d.lr_scale == 0) d.lr_scale = 1;
    if (d.beta1 == 0 && d.beta2 == 0) { d.beta1 = 0.9f; d.beta2 = 0.999f; }
    if (d.eps == 0) d.eps = 1e-8f;
    o->groups[o->n_groups] = d;
    return o->n_groups++;
}

void toy_optim_add_param(struct toy_optim *o, struct toy_tensor *p, int group) {
    TOY_ASSERT(p->type == TOY_F32 && toy_is_contiguous(p), "optimizer parameter '%s' must be contiguous f32", p->name);
    TOY_ASSERT(group >= 0 && group < o->n_groups, "group %d of '%s' does not exist", group, p->name);
    o->params = realloc(o->params, (size_t)(o->n_params + 1) * sizeof *o->params);
    if (!o->params) TOY_ABORT("out of memory (optimizer params)");
    size_t n = (size_t)toy_nelements(p);
    struct oparam op = {p, group, calloc(n ? n : 1, sizeof(float)), NULL};
    if (o->kind == TOY_OPTIM_ADAMW) op.v = calloc(n ? n : 1, sizeof(float));
    if (!op.m || (o->kind == TOY_OPTIM_ADAMW && !op.v)) TOY_ABORT("out of memory (optimizer state of '%s')", p->name);
    o->params[o->n_params++] = op;
}

int toy_optim_n_params(const struct toy_optim *o) { return o->n_params; }
struct toy_tensor *toy_optim_param(const struct toy_optim *o, int i) { return o->params[i].p; }
int64_t toy_optim_step_count(const struct toy_optim *o) { return o->steps; }
void toy_optim_set_step_count(struct toy_optim *o, int64_t s) { o->steps = s; }
float *toy_optim_state(struct toy_optim *o, int i, int which) { return which ? o->params[i].v : o->params[i].m; }

size_t toy_optim_state_bytes(const struct toy_optim *o) {
    size_t b = 0;
    for (int i = 0; i < o->n_params; i++)
        b += (size_t)toy_nelements(o->params[i].p) * sizeof(float) * (o->kind == TOY_OPTIM_ADAMW ? 2 : 1);
    return b;
}

struct step_task {
    struct toy_optim *o;
    float lr;
    double partial[256 * 8];
    float scale;
};

static void step_fn(void *arg, int ith, int nth) {
    struct step_task *st = arg;
    struct toy_optim *o = st->o;
    for (int i = 0; i < o->n_params; i++) {
        struct oparam *op = &o->params[i];
        const struct toy_optim_group *g = &o->groups[op->group];
        int64_t n = toy_nelements(op->p), e0, e1;
        toy_split(n, ith, nth, &e0, &e1);
        if (e1 <= e0) continue;
        float *p = (float *)op->p->data + e0, *gr = (float *)op->p->grad->data + e0, *m = op->m + e0;
        float lr = st->lr * g->lr_scale;
        if (o->kind == TOY_OPTIM_ADAMW) {
            double t = (double)o->steps;
            float bc1 = (float)(1.0 - pow(g->beta1, t));
            float bc2s = (float)sqrt(1.0 - pow(g->beta2, t));
            toy_vec.adamw(p, gr, m, op->v + e0, e1 - e0, lr, g->beta1, g->beta2, g->eps, g->weight_decay, bc1, bc2s);
        } else {
            bool first = o->steps == 1;
            for (int64_t k = 0; k < e1 - e0; k++) {
                float d = gr[k];
                if (g->weight_decay != 0) d += g->weight_decay * p[k];
                if (g->momentum != 0) {
                    m[k] = first ? d : g->momentum * m[k] + d;
                    d = m[k];
                }
                p[k] += -lr * d;
            }
        }
    }
}

enum toy_status toy_optim_step(struct toy_optim *o, float lr, struct toy_threadpool *tp) {
    for (int i = 0; i < o->n_params; i++)
        if (!o->params[i].p->grad)
            return toy_error(TOY_ERR_STATE, "optimizer: parameter '%s' has no gradient (not in the graph?)",
                             o->params[i].p->name);
    toy_cpu_init();
    o->steps++;
    struct step_task st = {.o = o, .lr = lr};
    toy_threadpool_run(tp, step_fn, &st);
    return TOY_OK;
}

static void sumsq_fn(void *arg, int ith, int nth) {
    struct step_task *st = arg;
    double s = 0;
    for (int i = 0; i < st->o->n_params; i++) {
        struct toy_tensor *p = st->o->params[i].p;
        if (!p->grad) continue;
        int64_t e0, e1;
        toy_split(toy_nelements(p), ith, nth, &e0, &e1);
        if (e1 > e0) s += toy_vec.sumsq((float *)p->grad->data + e0, e1 - e0);
    }
    st->partial[ith * 8] = s;
}

static void scale_fn(void *arg, int ith, int nth) {
    struct step_task *st = arg;
    for (int i = 0; i < st->o->n_params; i++) {
        struct toy_tensor *p = st->o->params[i].p;
        if (!p->grad) continue;
        int64_t e0, e1;
        toy_split(toy_nelements(p), ith, nth, &e0, &e1);
        float *g = (float *)p->grad->data + e0;
        if (e1 > e0) toy_vec.scale(g, g, st->scale, e1 - e0);
    }
}

float toy_optim_clip_grad_norm(struct toy_optim *o, float max_norm, struct toy_threadpool *tp) {
    toy_cpu_init();
    struct step_task st = {.o = o}; /* on the stack: a step allocates nothing */
    toy_threadpool_run(tp, sumsq_fn, &st);
    double s = 0;
    for (int i = 0; i < toy_threadpool_size(tp); i++) s += st.partial[i * 8];
    float norm = (float)sqrt(s);
    if (max_norm > 0 && norm > max_norm) {
        st.scale = (float)(max_norm / ((double)norm + 1e-6));
        toy_threadpool_run(tp, scale_fn, &st);
    }
    return norm;
}

void toy_optim_scale_grads(struct toy_optim *o, float s, struct toy_threadpool *tp) {
    toy_cpu_init();
    struct step_task st = {.o = o, .scale = s};
    toy_threadpool_run(tp, scale_fn, &st);
}

void toy_optim_zero_grad(struct toy_optim *o) {
    for (int i = 0; i < o->n_params; i++)
        if (o->params[i].p->grad) memset(o->params[i].p->grad->data, 0, toy_nbytes(o->params[i].p->grad));
}

/* ---- state in GGUF ------------------------------------------------------------ */

static int n_moments(const struct toy_optim *o) { return o->kind == TOY_OPTIM_ADAMW ? 2 : 1; }

enum toy_status toy_optim_write_gguf(struct toy_optim *o, struct toy_gguf_writer *w) {
    char name[160];
    enum toy_status st = TOY_OK;
    for (int i = 0; i < o->n_params && !st; i++) {
        const struct toy_tensor *p = o->params[i].p;
        for (int which = 0; which < n_moments(o) && !st; which++) {
            snprintf(name, sizeof name, "opt.%c.%s", which ? 'v' : 'm', p->name);
            st = toy_gguf_writer_add_tensor(w, name, TOY_F32, 4, p->ne, which ? o->params[i].v : o->params[i].m);
        }
    }
    return st;
}

enum toy_status toy_optim_read_gguf(struct toy_optim *o, const struct toy_gguf *g) {
    char name[160];
    for (int i = 0; i < o->n_params; i++) {
        const struct toy_tensor *p = o->params[i].p;
        for (int which = 0; which < n_moments(o); which++) {
            snprintf(name, sizeof name, "opt.%c.%s", which ? 'v' : 'm', p->name);
            int64_t ti = toy_gguf_find_tensor(g, name);
            if (ti < 0) return toy_error(TOY_ERR_FORMAT, "%s: missing optimizer tensor %s", toy_gguf_path(g), name);
            const struct toy_gguf_tensor *gt = toy_gguf_tensor(g, ti);
            if (gt->type != TOY_F32 || gt->n_elements != toy_nelements(p))
                return toy_error(TOY_ERR_SHAPE, "%s: %s has %lld %s elements, the model needs %lld f32 (offset %zu)",
                                 toy_gguf_path(g), name, (long long)gt->n_elements, toy_dtype_name(gt->type),
                                 (long long)toy_nelements(p), gt->file_offset);
            memcpy(which ? o->params[i].v : o->params[i].m, gt->data, gt->nbytes);
        }
    }
    return TOY_OK;
}
