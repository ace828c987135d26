/* optim.c: AdamW and SGD with momentum over parameter buffers, gradient
 * clipping by global norm. Semantics: torch.optim.AdamW / torch.optim.SGD
 * (PyTorch 1.13 single-tensor paths), so runs can be checked step by step
 * against PyTorch (tests/test-optim.c). Each step is one pool task; every
 * thread updates its slice of every segment.
 *
 * Segments: what the optimizer updates, each a range of one parameter with
 * its state: the whole of every parameter, or, once sharded (ZeRO-1,
 * toy_optim_shard), only the ranges this rank owns, whose state lies in
 * one flat block per moment in the order of the ranges. AdamW is
 * element-wise, so a sharded update gives each owned element the bits the
 * whole update gives it.
 *
 * On a device: when the graphs that compute the gradients run on a device
 * (CUDA), an unsharded AdamW moves there at its next call (attach: one
 * upload of parameters, gradients and moments) and stays: zeroing,
 * scaling, the global norm and the step run on the device
 * (toy_optim_dev_ops, src/backends/backend-impl.h), graphs use its copies
 * in place, and the host copies are refreshed only on demand (a checkpoint
 * write, toy_optim_state, toy_optim_sync_host, toy_optim_release_device,
 * toy_optim_free). The device does the CPU's arithmetic in the CPU's order
 * (AdamW bit for bit; the norm's double sum in another order). A device
 * error in a call without a status (zero_grad, scale, clip) is kept and
 * returned by the next toy_optim_step. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backends/backend-impl.h"
#include "backends/cpu/cpu-impl.h"
#include "toy/gguf.h"
#include "toy/optim.h"
#include <stdio.h>

struct oparam {
    struct toy_tensor *p;
    int group;
    float *m, *v; /* AdamW moments / SGD momentum (m) */
};

struct seg {
    int param;
    int64_t off, n;
    float *m, *v;
};

struct toy_optim {
    enum toy_optim_kind kind;
    struct toy_optim_group *groups;
    int n_groups;
    struct oparam *params;
    int n_params;
    int64_t steps;
    struct seg *segs; /* NULL until the first step/shard: then rebuilt from params or ranges */
    int n_segs;
    bool sharded;
    float *shard_m, *shard_v; /* sharded: the flat state */
    int64_t shard_elems;
    /* on a device (see the top): the backend's copies, or NULL */
    const struct toy_optim_dev_ops *dops;
    struct toy_dev_optim *dev;
    struct toy_optim_param_ref *refs; /* (n_params), filled when attaching */
    bool host_only;                   /* toy_optim_set_device_resident(false), TOY_CUDA_OPTIM=0 */
    enum toy_status dev_err;          /* a device failure not yet returned */
    char dev_msg[256];
};

/* The segments of an unsharded optimizer: every parameter whole. */
static void build_segs(struct toy_optim *o) {
    if (o->sharded || (o->segs && o->n_segs == o->n_params)) return;
    free(o->segs);
    o->segs = malloc((size_t)(o->n_params ? o->n_params : 1) * sizeof *o->segs);
    if (!o->segs) TOY_ABORT("out of memory (optimizer segments)");
    for (int i = 0; i < o->n_params; i++)
        o->segs[i] = (struct seg){i, 0, toy_nelements(o->params[i].p), o->params[i].m, o->params[i].v};
    o->n_segs = o->n_params;
}

/* One rank of several (data parallelism, toy/collective.h) reduces the
 * gradients on the host, so its optimizer must see them there: the
 * launchers' own variables, read as collective.c's AUTO reads them, keep
 * the optimizer on the host unless TOY_CUDA_OPTIM=1 says otherwise. */
static bool several_ranks(void) {
    const char *n[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS", "WORLD_SIZE"};
    for (size_t i = 0; i < sizeof n / sizeof n[0]; i++) {
        const char *v = getenv(n[i]);
        if (v && atol(v) > 1) return true;
    }
    return getenv("PMIX_RANK") != NULL;
}

struct toy_optim *toy_optim_new(enum toy_optim_kind kind) {
    struct toy_optim *o = calloc(1, sizeof *o);
    if (!o) return NULL;
    o->kind = kind;
    const char *e = getenv("TOY_CUDA_OPTIM");
    o->host_only = e ? !strcmp(e, "0") : several_ranks();
    return o;
}

/* ---- on a device ---------------------------------------------------------------------------------- */

/* Keeps a device failure of a call that returns no status for the next step. */
static void dev_fail(struct toy_optim *o, enum toy_status st) {
    if (!st || o->dev_err) return;
    o->dev_err = st;
    snprintf(o->dev_msg, sizeof o->dev_msg, "%s", toy_last_error());
}

/* True when the optimizer works on a device: already there, or every
 * parameter's gradient now comes from a graph on one (then it moves). */
static bool on_device(struct toy_optim *o) {
    if (o->dev) return true;
    if (o->host_only || o->sharded || o->kind != TOY_OPTIM_ADAMW || o->n_params == 0) return false;
    for (int i = 0; i < o->n_params; i++) {
        if (!o->params[i].p->grad) return false;
        o->refs[i] = (struct toy_optim_param_ref){o->params[i].p, o->params[i].m, o->params[i].v};
    }
    enum toy_status st = toy_backend_optim_attach(o->refs, o->n_params, &o->dops, &o->dev);
    if (st) { /* could not move (e.g. out of device memory): stay on the host, say why at the next step */
        dev_fail(o, st);
        o->host_only = true;
        return false;
    }
    return o->dev != NULL;
}

static enum toy_status dev_to_host(struct toy_optim *o, int what) {
    return o->dev ? o->dops->to_host(o->dev, what) : TOY_OK;
}

bool toy_optim_on_device(const struct toy_optim *o) { return o->dev != NULL; }

enum toy_status toy_optim_sync_host(struct toy_optim *o) {
    return dev_to_host(o, TOY_DEV_PARAMS | TOY_DEV_GRADS | TOY_DEV_STATE);
}

/* Back to the host, copying `what` first (TOY_DEV_* bits). */
static enum toy_status leave_device(struct toy_optim *o, int what) {
    if (!o->dev) return TOY_OK;
    enum toy_status st = dev_to_host(o, what);
    o->dops->detach(o->dev);
    o->dev = NULL;
    o->dops = NULL;
    return st;
}

enum toy_status toy_optim_release_device(struct toy_optim *o) {
    return leave_device(o, TOY_DEV_PARAMS | TOY_DEV_GRADS | TOY_DEV_STATE);
}

enum toy_status toy_optim_set_device_resident(struct toy_optim *o, bool on) {
    o->host_only = !on;
    return on ? TOY_OK : toy_optim_release_device(o);
}

void toy_optim_free(struct toy_optim *o) {
    if (!o) return;
    /* the host holds the last weights; the state dies here, and the
     * gradients may already be gone (owners detach them before this) */
    leave_device(o, TOY_DEV_PARAMS);
    free(o->refs);
    for (int i = 0; i < o->n_params; i++) {
        free(o->params[i].m);
        free(o->params[i].v);
    }
    free(o->segs);
    free(o->shard_m);
    free(o->shard_v);
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
    TOY_ASSERT(p->type == TOY_F32 && toy_is_contiguous(p), "optimizer parameter '%s' must be contiguous f32", toy_label(p));
    TOY_ASSERT(group >= 0 && group < o->n_groups, "group %d of '%s' does not exist", group, toy_label(p));
    TOY_ASSERT(!o->sharded, "optimizer: parameter '%s' added after sharding", toy_label(p));
    /* on a device: attaches again, with p, at its next call (a failed copy back is kept for the next step) */
    dev_fail(o, toy_optim_release_device(o));
    o->params = realloc(o->params, (size_t)(o->n_params + 1) * sizeof *o->params);
    o->refs = realloc(o->refs, (size_t)(o->n_params + 1) * sizeof *o->refs);
    if (!o->params || !o->refs) TOY_ABORT("out of memory (optimizer params)");
    size_t n = (size_t)toy_nelements(p);
    struct oparam op = {p, group, calloc(n ? n : 1, sizeof(float)), NULL};
    if (o->kind == TOY_OPTIM_ADAMW) op.v = calloc(n ? n : 1, sizeof(float));
    if (!op.m || (o->kind == TOY_OPTIM_ADAMW && !op.v)) TOY_ABORT("out of memory (optimizer state of '%s')", toy_label(p));
    o->params[o->n_params++] = op;
}

int toy_optim_n_params(const struct toy_optim *o) { return o->n_params; }
struct toy_tensor *toy_optim_param(const struct toy_optim *o, int i) { return o->params[i].p; }
int64_t toy_optim_step_count(const struct toy_optim *o) { return o->steps; }
void toy_optim_set_step_count(struct toy_optim *o, int64_t s) { o->steps = s; }
float *toy_optim_state(struct toy_optim *o, int i, int which) {
    if (o->dev) dev_fail(o, dev_to_host(o, TOY_DEV_STATE));
    return which ? o->params[i].v : o->params[i].m;
}

static int n_moments(const struct toy_optim *o) { return o->kind == TOY_OPTIM_ADAMW ? 2 : 1; }

size_t toy_optim_state_bytes(const struct toy_optim *o) {
    if (o->sharded) return (size_t)o->shard_elems * sizeof(float) * (size_t)n_moments(o);
    size_t b = 0;
    for (int i = 0; i < o->n_params; i++) b += (size_t)toy_nelements(o->params[i].p) * sizeof(float) * (size_t)n_moments(o);
    return b;
}

enum toy_status toy_optim_shard(struct toy_optim *o, const struct toy_optim_range *r, int n) {
    int64_t total = 0;
    for (int k = 0; k < n; k++) {
        if (r[k].param < 0 || r[k].param >= o->n_params || r[k].off < 0 || r[k].count < 0 ||
            r[k].off + r[k].count > toy_nelements(o->params[r[k].param].p))
            return toy_error(TOY_ERR_INVALID_ARG, "optimizer shard: range %d (parameter %d, %lld + %lld) is outside it", k,
                             r[k].param, (long long)r[k].off, (long long)r[k].count);
        total += r[k].count;
    }
    if (n < 0) return toy_error(TOY_ERR_INVALID_ARG, "optimizer shard: %d ranges", n);
    enum toy_status rst = toy_optim_release_device(o); /* a sharded optimizer works on the host */
    if (rst) return rst;
    struct seg *segs = malloc((size_t)(n > 0 ? n : 1) * sizeof *segs);
    float *m = calloc((size_t)(total ? total : 1), sizeof *m);
    float *v = o->kind == TOY_OPTIM_ADAMW ? calloc((size_t)(total ? total : 1), sizeof *v) : NULL;
    if (!segs || !m || (o->kind == TOY_OPTIM_ADAMW && !v)) {
        free(segs), free(m), free(v);
        return toy_error(TOY_ERR_NOMEM, "optimizer shard of %lld elements", (long long)total);
    }
    int64_t at = 0;
    for (int k = 0; k < n; k++) {
        segs[k] = (struct seg){r[k].param, r[k].off, r[k].count, m + at, v ? v + at : NULL};
        at += r[k].count;
    }
    for (int i = 0; i < o->n_params; i++) { /* the whole-parameter state is what sharding saves */
        free(o->params[i].m);
        free(o->params[i].v);
        o->params[i].m = o->params[i].v = NULL;
    }
    free(o->segs);
    free(o->shard_m);
    free(o->shard_v);
    o->segs = segs;
    o->n_segs = n;
    o->shard_m = m;
    o->shard_v = v;
    o->shard_elems = total;
    o->sharded = true;
    return TOY_OK;
}

float *toy_optim_shard_state(struct toy_optim *o, int which, int64_t *elems) {
    if (elems) *elems = o->sharded ? o->shard_elems : 0;
    return o->sharded ? (which ? o->shard_v : o->shard_m) : NULL;
}

bool toy_optim_sharded(const struct toy_optim *o) { return o->sharded; }

struct step_task {
    struct toy_optim *o;
    float lr;
    double partial[256 * 8];
    float scale;
};

static void step_fn(void *arg, int ith, int nth) {
    struct step_task *st = arg;
    struct toy_optim *o = st->o;
    for (int i = 0; i < o->n_segs; i++) {
        const struct seg *sg = &o->segs[i];
        struct oparam *op = &o->params[sg->param];
        const struct toy_optim_group *g = &o->groups[op->group];
        int64_t e0, e1;
        toy_split(sg->n, ith, nth, &e0, &e1);
        if (e1 <= e0) continue;
        float *p = (float *)op->p->data + sg->off + e0, *gr = (float *)op->p->grad->data + sg->off + e0, *m = sg->m + e0;
        float lr = st->lr * g->lr_scale;
        if (o->kind == TOY_OPTIM_ADAMW) {
            double t = (double)o->steps;
            float bc1 = (float)(1.0 - pow(g->beta1, t));
            float bc2s = (float)sqrt(1.0 - pow(g->beta2, t));
            toy_vec.adamw(p, gr, m, sg->v + e0, e1 - e0, lr, g->beta1, g->beta2, g->eps, g->weight_decay, bc1, bc2s);
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

/* AdamW on the device: the same scalars as step_fn, one launch per parameter */
static enum toy_status dev_step(struct toy_optim *o, float lr) {
    double t = (double)o->steps;
    for (int i = 0; i < o->n_params; i++) {
        const struct toy_optim_group *g = &o->groups[o->params[i].group];
        float bc1 = (float)(1.0 - pow(g->beta1, t));
        float bc2s = (float)sqrt(1.0 - pow(g->beta2, t));
        enum toy_status st =
            o->dops->adamw(o->dev, i, lr * g->lr_scale, g->beta1, g->beta2, g->eps, g->weight_decay, bc1, bc2s);
        if (st) return st;
    }
    return TOY_OK;
}

enum toy_status toy_optim_check_settings(float lr, float lr_min, float weight_decay, float beta1, float beta2,
                                         float eps, float clip) {
    const struct {
        const char *name;
        float v, hi;
    } f[] = {{"lr", lr, INFINITY},     {"lr_min", lr_min, INFINITY}, {"weight_decay", weight_decay, INFINITY},
             {"eps", eps, INFINITY},   {"clip", clip, INFINITY},     {"beta1", beta1, 1},
             {"beta2", beta2, 1}};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (!isfinite(f[i].v) || f[i].v < 0 || f[i].v >= f[i].hi)
            return toy_error(TOY_ERR_INVALID_ARG, "optimizer: %s is %g, not a finite number in [0, %g)", f[i].name,
                             (double)f[i].v, (double)f[i].hi);
    return TOY_OK;
}

enum toy_status toy_optim_step(struct toy_optim *o, float lr, struct toy_threadpool *tp) {
    for (int i = 0; i < o->n_params; i++)
        if (!o->params[i].p->grad)
            return toy_error(TOY_ERR_STATE, "optimizer: parameter '%s' has no gradient (not in the graph?)",
                             toy_label(o->params[i].p));
    bool dev = on_device(o);
    if (o->dev_err) { /* an earlier call failed on the device: this step would use wrong gradients */
        enum toy_status st = o->dev_err;
        o->dev_err = TOY_OK;
        return toy_error(st, "optimizer: %s", o->dev_msg);
    }
    if (dev) {
        o->steps++;
        enum toy_status st = dev_step(o, lr);
        if (st) o->steps--;
        return st;
    }
    toy_cpu_init();
    build_segs(o);
    o->steps++;
    struct step_task st = {.o = o, .lr = lr};
    toy_threadpool_run(tp, step_fn, &st);
    return TOY_OK;
}

static void sumsq_fn(void *arg, int ith, int nth) {
    struct step_task *st = arg;
    double s = 0;
    for (int i = 0; i < st->o->n_segs; i++) {
        const struct seg *sg = &st->o->segs[i];
        struct toy_tensor *p = st->o->params[sg->param].p;
        if (!p->grad) continue;
        int64_t e0, e1;
        toy_split(sg->n, ith, nth, &e0, &e1);
        if (e1 > e0) s += toy_vec.sumsq((float *)p->grad->data + sg->off + e0, e1 - e0);
    }
    st->partial[ith * 8] = s;
}

/* Scales the gradient of every segment (whole: every parameter). */
static void scale_fn(void *arg, int ith, int nth) {
    struct step_task *st = arg;
    for (int i = 0; i < st->o->n_segs; i++) {
        const struct seg *sg = &st->o->segs[i];
        struct toy_tensor *p = st->o->params[sg->param].p;
        if (!p->grad) continue;
        int64_t e0, e1;
        toy_split(sg->n, ith, nth, &e0, &e1);
        float *g = (float *)p->grad->data + sg->off + e0;
        if (e1 > e0) toy_vec.scale(g, g, st->scale, e1 - e0);
    }
}

double toy_optim_grad_sumsq(struct toy_optim *o, struct toy_threadpool *tp) {
    if (on_device(o)) {
        double s = 0;
        enum toy_status st = o->dops->grad_sumsq(o->dev, &s);
        dev_fail(o, st);
        return st ? NAN : s;
    }
    toy_cpu_init();
    build_segs(o);
    struct step_task st = {.o = o}; /* on the stack: a step allocates nothing */
    toy_threadpool_run(tp, sumsq_fn, &st);
    double s = 0;
    for (int i = 0; i < toy_threadpool_size(tp); i++) s += st.partial[i * 8];
    return s;
}

float toy_optim_clip_to(struct toy_optim *o, double sumsq, float max_norm, struct toy_threadpool *tp) {
    float norm = (float)sqrt(sumsq);
    if (max_norm > 0 && norm > max_norm && on_device(o)) {
        dev_fail(o, o->dops->scale_grads(o->dev, (float)(max_norm / ((double)norm + 1e-6))));
    } else if (max_norm > 0 && norm > max_norm) {
        toy_cpu_init();
        build_segs(o);
        struct step_task st = {.o = o, .scale = (float)(max_norm / ((double)norm + 1e-6))};
        toy_threadpool_run(tp, scale_fn, &st);
    }
    return norm;
}

float toy_optim_clip_grad_norm(struct toy_optim *o, float max_norm, struct toy_threadpool *tp) {
    return toy_optim_clip_to(o, toy_optim_grad_sumsq(o, tp), max_norm, tp);
}

void toy_optim_scale_grads(struct toy_optim *o, float s, struct toy_threadpool *tp) {
    if (on_device(o)) {
        dev_fail(o, o->dops->scale_grads(o->dev, s));
        return;
    }
    toy_cpu_init();
    build_segs(o);
    struct step_task st = {.o = o, .scale = s};
    toy_threadpool_run(tp, scale_fn, &st);
}

void toy_optim_zero_grad(struct toy_optim *o) {
    if (on_device(o)) {
        dev_fail(o, o->dops->zero_grad(o->dev));
        return;
    }
    for (int i = 0; i < o->n_params; i++)
        if (o->params[i].p->grad) memset(o->params[i].p->grad->data, 0, toy_nbytes(o->params[i].p->grad));
}

/* ---- state in GGUF ------------------------------------------------------------ */

enum toy_status toy_optim_write_gguf_state(struct toy_optim *o, struct toy_gguf_writer *w, float *const *m,
                                           float *const *v) {
    char name[160];
    enum toy_status st = dev_to_host(o, TOY_DEV_PARAMS); /* what the checkpoint's model file writes next */
    if (st) return st;
    for (int i = 0; i < o->n_params && !st; i++) {
        const struct toy_tensor *p = o->params[i].p;
        for (int which = 0; which < n_moments(o) && !st; which++) {
            snprintf(name, sizeof name, "opt.%c.%s", which ? 'v' : 'm', p->name);
            st = toy_gguf_writer_add_tensor(w, name, TOY_F32, 4, p->ne, which ? v[i] : m[i]);
        }
    }
    return st;
}

enum toy_status toy_optim_write_gguf(struct toy_optim *o, struct toy_gguf_writer *w) {
    if (o->sharded)
        return toy_error(TOY_ERR_STATE, "optimizer: the state is sharded; gather it and use toy_optim_write_gguf_state");
    enum toy_status dst = dev_to_host(o, TOY_DEV_STATE);
    if (dst) return dst;
    float **m = malloc((size_t)(o->n_params ? o->n_params : 1) * 2 * sizeof *m);
    if (!m) return toy_error(TOY_ERR_NOMEM, "optimizer state");
    for (int i = 0; i < o->n_params; i++) m[i] = o->params[i].m, m[o->n_params + i] = o->params[i].v;
    enum toy_status st = toy_optim_write_gguf_state(o, w, m, m + o->n_params);
    free(m);
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
            if (!o->sharded) memcpy(which ? o->params[i].v : o->params[i].m, gt->data, gt->nbytes);
            for (int k = 0; o->sharded && k < o->n_segs; k++) /* only the owned ranges */
                if (o->segs[k].param == i)
                    memcpy(which ? o->segs[k].v : o->segs[k].m, (const float *)gt->data + o->segs[k].off,
                           (size_t)o->segs[k].n * sizeof(float));
        }
    }
    return o->dev ? o->dops->state_to_device(o->dev) : TOY_OK; /* the device's moments follow the host's */
}
