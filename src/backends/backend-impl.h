/* backend-impl.h: the interface every compute backend implements. A graph
 * runs on one backend. The CPU computes one node at a time on the threads of
 * a pool (init / work_size / compute); a device backend (CUDA) runs the
 * whole graph on its device (graph_compute) and keeps per-graph device state
 * that graph.c frees through graph_free. Exactly one file, registry.c, knows
 * which backends were compiled in. */
#ifndef TOY_BACKEND_IMPL_H
#define TOY_BACKEND_IMPL_H

#include <stdbool.h>
#include <stddef.h>

#include "toy/tensor.h"

struct toy_graph;

/* ---- a device-resident optimizer -------------------------------------------------------------
 * When the graphs that compute an optimizer's gradients run on a device,
 * the optimizer (src/train/optim.c) keeps its parameters, their gradients
 * and its moments there: the backend holds the device copies, graphs on
 * that device read and write them in place (no upload of parameters, no
 * download of gradients per run), and the host copies are brought up to
 * date only through to_host. optim.c decides when; the backend does the
 * work on its stream, in the CPU's operation order. */
struct toy_dev_optim; /* the backend's copies of one optimizer's tensors */

struct toy_optim_param_ref {
    struct toy_tensor *p; /* F32, contiguous, with p->grad */
    float *m, *v;         /* host moments of p's elements (AdamW: both) */
};

enum { TOY_DEV_PARAMS = 1, TOY_DEV_GRADS = 2, TOY_DEV_STATE = 4 };

struct toy_optim_dev_ops {
    /* *out = NULL (and TOY_OK) unless every p->grad is the persistent
     * gradient of a graph that ran on one device of this backend; then
     * device copies of every p, p->grad, m and v, uploaded from the host
     * (the host is the truth until then), which graphs on that device use
     * from their next run on. */
    enum toy_status (*attach)(const struct toy_optim_param_ref *ps, int n, struct toy_dev_optim **out);
    enum toy_status (*zero_grad)(struct toy_dev_optim *d);
    enum toy_status (*scale_grads)(struct toy_dev_optim *d, float s);
    /* the sum of squares of every gradient, accumulated in double */
    enum toy_status (*grad_sumsq)(struct toy_dev_optim *d, double *out);
    /* AdamW on parameter i (simd.c's ref_adamw, element for element) */
    enum toy_status (*adamw)(struct toy_dev_optim *d, int i, float lr, float b1, float b2, float eps, float wd,
                             float bc1, float bc2sqrt);
    /* device -> host copies of what (TOY_DEV_* bits); returns when done */
    enum toy_status (*to_host)(struct toy_dev_optim *d, int what);
    /* host -> device copies of the moments (after the host wrote them) */
    enum toy_status (*state_to_device)(struct toy_dev_optim *d);
    /* frees the copies (without copying back); graphs on the device go
     * back to uploading from the host. NULL is a no-op. */
    void (*detach)(struct toy_dev_optim *d);
};

struct toy_backend_ops {
    const char *name;                 /* "cpu", "cuda" */
    void (*init)(void);               /* idempotent, thread-safe */
    /* scratch bytes the node needs on nth threads */
    size_t (*work_size)(const struct toy_tensor *node, int nth);
    /* computes node as thread ith of nth */
    void (*compute)(struct toy_tensor *node, int ith, int nth, void *work, size_t work_size);
    /* device backends: runs every node of the planned graph g on device
     * `device`; NULL for node-by-node backends */
    enum toy_status (*graph_compute)(struct toy_graph *g, int device);
    /* frees g->dev_state (NULL is a no-op) */
    void (*graph_free)(struct toy_graph *g);
    /* device backends: the device-resident optimizer; NULL otherwise */
    const struct toy_optim_dev_ops *optim;
    /* the rewrites of graph-fuse.c its kernels run (toy_graph_set_fusion);
     * NULL: graphs stay unfused */
    const struct toy_fuse_target *fuse;
    unsigned caps; /* TOY_BACKEND_* bits: the ops beyond the common set it runs */
};

/* toy_kv_store_rows and toy_attention_rows (several sequences' rows in one op) */
enum { TOY_BACKEND_ROWS_ATTENTION = 1 };

/* The backend named `name` ("cpu"), or NULL if it was not compiled in. */
const struct toy_backend_ops *toy_backend_get(const char *name);
/* The CPU backend. */
const struct toy_backend_ops *toy_backend_default(void);
/* The backend and device index graph g runs on: its own choice
 * (toy_graph_set_device), else the process default (toy_device_set_default). */
const struct toy_backend_ops *toy_backend_for_graph(const struct toy_graph *g, int *device);
/* Whether the backend graphs run on by default (toy_device_set_default) has every one of the caps. */
bool toy_backend_default_has(unsigned caps);
/* Asks every compiled-in backend with a device optimizer to attach these
 * parameters (toy_optim_dev_ops.attach); *ops and *out stay NULL when none
 * holds their gradients. A CPU-only build always answers NULL. */
enum toy_status toy_backend_optim_attach(const struct toy_optim_param_ref *ps, int n,
                                         const struct toy_optim_dev_ops **ops, struct toy_dev_optim **out);

#endif
