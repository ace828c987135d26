/* cuda-optim.c: the device-resident optimizer of the CUDA backend
 * (toy_optim_dev_ops, src/backends/backend-impl.h), and the table of bound
 * buffers that lets graphs use its copies in place.
 *
 * Attach: when every parameter's gradient is the persistent gradient of a
 * graph that ran on one CUDA device (toy_cuda_graph_grad_device), the
 * optimizer's parameters, gradients and moments get device copies there,
 * uploaded once from the host (which was the truth until then), and the
 * parameter and gradient ranges are bound: from their next run, graphs on
 * that device read the parameters and accumulate the gradients in these
 * copies, with no upload of parameters and no download of gradients.
 * Zeroing, scaling, the global norm (a double sum of squares, reduced in a
 * fixed order) and AdamW (toy_cu_adamw: simd.c's operation order without
 * FMA contraction) run on the device's one stream, in order with the
 * graphs. The host copies are stale until to_host copies them back (a
 * checkpoint, toy_optim_sync_host); detach unbinds, and graphs go back to
 * uploading from the host.
 *
 * Invariants: a host range is bound by at most one optimizer on one
 * device; every change of the table bumps a generation that graphs compare
 * on each run (toy_cu_bound_gen), so no graph keeps a pointer into copies
 * that were freed. Errors come back as a toy_status with the CUDA error
 * string; nothing aborts. Compiled only with TOY_CUDA.
 */
#ifdef TOY_CUDA
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "backends/backend-impl.h"
#include "backends/cuda/cuda-impl.h"
#include "core/internal.h"

/* ---- bound buffers ------------------------------------------------------------------------------ */

struct bound { int dev; const char *host; size_t size; char *dptr; };

static pthread_mutex_t block = PTHREAD_MUTEX_INITIALIZER;
static struct bound *bounds;
static int n_bounds, cap_bounds;
static uint64_t bgen = 1;

bool toy_cu_bound_find(int dev, const void *host, size_t size, void **dptr) {
    const char *h = host;
    bool found = false;
    pthread_mutex_lock(&block);
    for (int i = 0; i < n_bounds && !found; i++) {
        const struct bound *b = &bounds[i];
        if (b->dev == dev && h >= b->host && h + size <= b->host + b->size) {
            *dptr = b->dptr + (h - b->host);
            found = true;
        }
    }
    pthread_mutex_unlock(&block);
    return found;
}

static bool bound_anywhere(const void *host, size_t size) {
    const char *h = host;
    bool found = false;
    pthread_mutex_lock(&block);
    for (int i = 0; i < n_bounds && !found; i++)
        found = h < bounds[i].host + bounds[i].size && bounds[i].host < h + size;
    pthread_mutex_unlock(&block);
    return found;
}

uint64_t toy_cu_bound_gen(void) {
    pthread_mutex_lock(&block);
    uint64_t g = bgen;
    pthread_mutex_unlock(&block);
    return g;
}

/* ---- one optimizer's copies --------------------------------------------------------------------- */

struct dparam {
    struct toy_tensor *t;
    int64_t n;
    float *p, *g, *m, *v; /* device: (n) each; v NULL with one moment */
    float *hm, *hv;       /* host moments */
};

struct toy_dev_optim {
    int dev;
    struct toy_cu_device *cd;
    struct dparam *ps;
    int n;
    double *partial; /* device: (n, TOY_CU_SUMSQ_BLOCKS) */
    double *sum;     /* device: one */
    bool bound;
};

static void free_copies(struct toy_dev_optim *d) {
    for (int i = 0; i < d->n; i++) {
        toy_cu_free(d->dev, d->ps[i].p);
        toy_cu_free(d->dev, d->ps[i].g);
        toy_cu_free(d->dev, d->ps[i].m);
        toy_cu_free(d->dev, d->ps[i].v);
    }
    toy_cu_free(d->dev, d->partial);
    toy_cu_free(d->dev, d->sum);
    free(d->ps);
    free(d);
}

static void unbind(struct toy_dev_optim *d) {
    if (!d->bound) return;
    pthread_mutex_lock(&block);
    for (int i = 0; i < n_bounds;) {
        bool mine = false;
        for (int k = 0; k < d->n && !mine; k++)
            mine = bounds[i].dev == d->dev && (bounds[i].dptr == (char *)d->ps[k].p || bounds[i].dptr == (char *)d->ps[k].g);
        if (mine) bounds[i] = bounds[--n_bounds];
        else i++;
    }
    bgen++;
    pthread_mutex_unlock(&block);
    d->bound = false;
}

static enum toy_status bind(struct toy_dev_optim *d) {
    pthread_mutex_lock(&block);
    if (n_bounds + 2 * d->n > cap_bounds) {
        int nc = cap_bounds ? cap_bounds : 64;
        while (nc < n_bounds + 2 * d->n) nc *= 2;
        struct bound *nb = realloc(bounds, (size_t)nc * sizeof *nb);
        if (!nb) {
            pthread_mutex_unlock(&block);
            return toy_error(TOY_ERR_NOMEM, "cuda optimizer: bound table");
        }
        bounds = nb;
        cap_bounds = nc;
    }
    for (int i = 0; i < d->n; i++) {
        size_t bytes = (size_t)d->ps[i].n * sizeof(float);
        bounds[n_bounds++] = (struct bound){d->dev, d->ps[i].t->data, bytes, (char *)d->ps[i].p};
        bounds[n_bounds++] = (struct bound){d->dev, d->ps[i].t->grad->data, bytes, (char *)d->ps[i].g};
    }
    bgen++;
    pthread_mutex_unlock(&block);
    d->bound = true;
    return TOY_OK;
}

static enum toy_status use(struct toy_dev_optim *d) { return toy_cu_check(cudaSetDevice(d->dev), "cudaSetDevice"); }

static enum toy_status finish(struct toy_dev_optim *d, const char *what) {
    return toy_cu_check(cudaStreamSynchronize((cudaStream_t)d->cd->stream), what);
}

static enum toy_status attach(const struct toy_optim_param_ref *ps, int n, struct toy_dev_optim **out) {
    *out = NULL;
    if (n <= 0) return TOY_OK;
    int dev = -1;
    for (int i = 0; i < n; i++) { /* every gradient on one device, and nobody else's */
        if (!ps[i].p->grad) return TOY_OK;
        int di = toy_cuda_graph_grad_device(ps[i].p->grad);
        if (di < 0 || (dev >= 0 && di != dev)) return TOY_OK;
        dev = di;
        size_t bytes = toy_nbytes(ps[i].p);
        if (bound_anywhere(ps[i].p->data, bytes) || bound_anywhere(ps[i].p->grad->data, bytes)) return TOY_OK;
    }
    struct toy_dev_optim *d = calloc(1, sizeof *d);
    if (!d || !(d->ps = calloc((size_t)n, sizeof *d->ps))) {
        free(d);
        return toy_error(TOY_ERR_NOMEM, "cuda optimizer");
    }
    d->dev = dev;
    enum toy_status st = toy_cu_device_get(dev, &d->cd);
    cudaStream_t s = st ? NULL : (cudaStream_t)d->cd->stream;
    for (int i = 0; i < n && !st; i++) {
        struct dparam *dp = &d->ps[i];
        d->n = i + 1;
        dp->t = ps[i].p;
        dp->n = toy_nelements(ps[i].p);
        dp->hm = ps[i].m;
        dp->hv = ps[i].v;
        size_t bytes = (size_t)dp->n * sizeof(float);
        if (!st) st = toy_cu_alloc(dev, bytes, (void **)&dp->p);
        if (!st) st = toy_cu_alloc(dev, bytes, (void **)&dp->g);
        if (!st) st = toy_cu_alloc(dev, bytes, (void **)&dp->m);
        if (!st && dp->hv) st = toy_cu_alloc(dev, bytes, (void **)&dp->v);
        if (!st) st = toy_cu_check(cudaMemcpyAsync(dp->p, dp->t->data, bytes, cudaMemcpyHostToDevice, s), "upload");
        if (!st)
            st = toy_cu_check(cudaMemcpyAsync(dp->g, dp->t->grad->data, bytes, cudaMemcpyHostToDevice, s), "upload");
        if (!st) st = toy_cu_check(cudaMemcpyAsync(dp->m, dp->hm, bytes, cudaMemcpyHostToDevice, s), "upload");
        if (!st && dp->hv) st = toy_cu_check(cudaMemcpyAsync(dp->v, dp->hv, bytes, cudaMemcpyHostToDevice, s), "upload");
    }
    if (!st) st = toy_cu_alloc(dev, (size_t)n * TOY_CU_SUMSQ_BLOCKS * sizeof(double), (void **)&d->partial);
    if (!st) st = toy_cu_alloc(dev, sizeof(double), (void **)&d->sum);
    if (!st) st = finish(d, "uploading the optimizer's tensors");
    if (!st) st = bind(d);
    if (st) {
        if (d->cd) cudaStreamSynchronize((cudaStream_t)d->cd->stream);
        free_copies(d);
        return st;
    }
    *out = d;
    return TOY_OK;
}

static enum toy_status zero_grad(struct toy_dev_optim *d) {
    enum toy_status us = use(d);
    if (us) return us;
    cudaStream_t s = (cudaStream_t)d->cd->stream;
    for (int i = 0; i < d->n; i++) {
        enum toy_status st = toy_cu_check(
            cudaMemsetAsync(d->ps[i].g, 0, (size_t)d->ps[i].n * sizeof(float), s), "zeroing a gradient");
        if (st) return st;
    }
    return TOY_OK;
}

static enum toy_status scale_grads(struct toy_dev_optim *d, float sc) {
    enum toy_status us = use(d);
    if (us) return us;
    for (int i = 0; i < d->n; i++) {
        int rc = toy_cu_scale_f32(d->ps[i].g, d->ps[i].n, sc, d->cd->stream);
        if (rc) return (enum toy_status)rc;
    }
    return TOY_OK;
}

static enum toy_status grad_sumsq(struct toy_dev_optim *d, double *out) {
    *out = 0;
    enum toy_status us = use(d);
    if (us) return us;
    for (int i = 0; i < d->n; i++) {
        int rc = toy_cu_sumsq_f32(d->ps[i].g, d->ps[i].n, d->partial + (size_t)i * TOY_CU_SUMSQ_BLOCKS, d->cd->stream);
        if (rc) return (enum toy_status)rc;
    }
    int rc = toy_cu_sum_f64(d->partial, (int64_t)d->n * TOY_CU_SUMSQ_BLOCKS, d->sum, d->cd->stream);
    if (rc) return (enum toy_status)rc;
    enum toy_status st = toy_cu_check(
        cudaMemcpyAsync(out, d->sum, sizeof(double), cudaMemcpyDeviceToHost, (cudaStream_t)d->cd->stream),
        "download of the gradient norm");
    if (!st) st = finish(d, "gradient norm");
    return st;
}

static enum toy_status adamw(struct toy_dev_optim *d, int i, float lr, float b1, float b2, float eps, float wd,
                             float bc1, float bc2sqrt) {
    const struct dparam *dp = &d->ps[i];
    enum toy_status us = use(d);
    if (us) return us;
    return (enum toy_status)toy_cu_adamw(dp->p, dp->g, dp->m, dp->v, dp->n, lr, b1, b2, eps, wd, bc1, bc2sqrt,
                                         d->cd->stream);
}

static enum toy_status to_host(struct toy_dev_optim *d, int what) {
    enum toy_status us = use(d);
    if (us) return us;
    cudaStream_t s = (cudaStream_t)d->cd->stream;
    enum toy_status st = TOY_OK;
    for (int i = 0; i < d->n && !st; i++) {
        const struct dparam *dp = &d->ps[i];
        size_t bytes = (size_t)dp->n * sizeof(float);
        if (what & TOY_DEV_PARAMS)
            st = toy_cu_check(cudaMemcpyAsync(dp->t->data, dp->p, bytes, cudaMemcpyDeviceToHost, s), "download");
        if (!st && (what & TOY_DEV_GRADS) && dp->t->grad) /* (an owner may have detached it) */
            st = toy_cu_check(cudaMemcpyAsync(dp->t->grad->data, dp->g, bytes, cudaMemcpyDeviceToHost, s), "download");
        if (!st && (what & TOY_DEV_STATE))
            st = toy_cu_check(cudaMemcpyAsync(dp->hm, dp->m, bytes, cudaMemcpyDeviceToHost, s), "download");
        if (!st && (what & TOY_DEV_STATE) && dp->v)
            st = toy_cu_check(cudaMemcpyAsync(dp->hv, dp->v, bytes, cudaMemcpyDeviceToHost, s), "download");
    }
    enum toy_status fs = finish(d, "copying the optimizer's tensors to the host");
    return st ? st : fs;
}

static enum toy_status state_to_device(struct toy_dev_optim *d) {
    enum toy_status us = use(d);
    if (us) return us;
    cudaStream_t s = (cudaStream_t)d->cd->stream;
    enum toy_status st = TOY_OK;
    for (int i = 0; i < d->n && !st; i++) {
        const struct dparam *dp = &d->ps[i];
        size_t bytes = (size_t)dp->n * sizeof(float);
        st = toy_cu_check(cudaMemcpyAsync(dp->m, dp->hm, bytes, cudaMemcpyHostToDevice, s), "upload");
        if (!st && dp->v) st = toy_cu_check(cudaMemcpyAsync(dp->v, dp->hv, bytes, cudaMemcpyHostToDevice, s), "upload");
    }
    enum toy_status fs = finish(d, "copying the optimizer's state to the device");
    return st ? st : fs;
}

static void detach(struct toy_dev_optim *d) {
    if (!d) return;
    cudaSetDevice(d->dev);
    cudaStreamSynchronize((cudaStream_t)d->cd->stream); /* kernels still reading the copies */
    cudaGetLastError();
    unbind(d);
    free_copies(d);
}

const struct toy_optim_dev_ops toy_cuda_optim_ops = {
    attach, zero_grad, scale_grads, grad_sumsq, adamw, to_host, state_to_device, detach,
};
#endif
