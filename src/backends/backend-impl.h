/* backend-impl.h: the interface every compute backend implements. A graph
 * runs on one backend; the backend computes one node at a time on the
 * threads of a pool (CPU) or on its device (CUDA, later). Exactly one file,
 * registry.c, knows which backends were compiled in. */
#ifndef TOY_BACKEND_IMPL_H
#define TOY_BACKEND_IMPL_H

#include <stddef.h>

#include "toy/tensor.h"

struct toy_backend_ops {
    const char *name;                 /* "cpu", "cuda" */
    void (*init)(void);               /* idempotent, thread-safe */
    /* scratch bytes the node needs on nth threads */
    size_t (*work_size)(const struct toy_tensor *node, int nth);
    /* computes node as thread ith of nth */
    void (*compute)(struct toy_tensor *node, int ith, int nth, void *work, size_t work_size);
};

/* The backend named `name` ("cpu"), or NULL if it was not compiled in. */
const struct toy_backend_ops *toy_backend_get(const char *name);
/* The default backend (the CPU). */
const struct toy_backend_ops *toy_backend_default(void);

#endif
