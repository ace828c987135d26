/* registry.c: the one place that knows which backends were compiled in. */
#include <string.h>

#include "backends/backend-impl.h"
#include "core/internal.h"

static const struct toy_backend_ops cpu_ops = {
    "cpu", toy_cpu_init, toy_cpu_work_size, toy_cpu_compute,
};

static const struct toy_backend_ops *const backends[] = {&cpu_ops};

const struct toy_backend_ops *toy_backend_get(const char *name) {
    for (size_t i = 0; i < sizeof backends / sizeof backends[0]; i++)
        if (!strcmp(backends[i]->name, name)) return backends[i];
    return NULL;
}

const struct toy_backend_ops *toy_backend_default(void) { return &cpu_ops; }
