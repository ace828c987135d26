/* backend-impl.h: the interface every compute backend implements. A graph
 * runs on one backend. The CPU computes one node at a time on the threads of
 * a pool (init / work_size / compute); a device backend (CUDA) runs the
 * whole graph on its device (graph_compute) and keeps per-graph device state
 * that graph.c frees through graph_free. Exactly one file, registry.c, knows
 * which backends were compiled in. */
#ifndef TOY_BACKEND_IMPL_H
#define TOY_BACKEND_IMPL_H

#include <stddef.h>

#include "toy/tensor.h"

struct toy_graph;

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
};

/* The backend named `name` ("cpu"), or NULL if it was not compiled in. */
const struct toy_backend_ops *toy_backend_get(const char *name);
/* The CPU backend. */
const struct toy_backend_ops *toy_backend_default(void);
/* The backend and device index graph g runs on: its own choice
 * (toy_graph_set_device), else the process default (toy_device_set_default). */
const struct toy_backend_ops *toy_backend_for_graph(const struct toy_graph *g, int *device);

#endif
