/* registry.c: the one place that knows which backends were compiled in, and
 * the device names ("cpu", "cuda", "cuda:N") that select them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/backend-impl.h"
#include "backends/cpu/cpu-impl.h"
#include "core/internal.h"
#include "toy/device.h"

#ifdef TOY_CUDA
#include "backends/cuda/cuda-impl.h"
#endif

static const struct toy_backend_ops cpu_ops = {
    "cpu", toy_cpu_init, toy_cpu_work_size, toy_cpu_compute, NULL, NULL, NULL, &toy_cpu_fuse_target,
    TOY_BACKEND_ROWS_ATTENTION,
};

#ifdef TOY_CUDA
static void cuda_init_noop(void) {}
static const struct toy_backend_ops cuda_ops = {
    "cuda", cuda_init_noop, NULL, NULL, toy_cuda_graph_compute, toy_cuda_graph_free, &toy_cuda_optim_ops,
    &toy_cuda_fuse_target, 0,
};
static const struct toy_backend_ops *const backends[] = {&cpu_ops, &cuda_ops};
#else
static const struct toy_backend_ops *const backends[] = {&cpu_ops};
#endif

const struct toy_backend_ops *toy_backend_get(const char *name) {
    for (size_t i = 0; i < sizeof backends / sizeof backends[0]; i++)
        if (!strcmp(backends[i]->name, name)) return backends[i];
    return NULL;
}

const struct toy_backend_ops *toy_backend_default(void) { return &cpu_ops; }

enum toy_status toy_backend_optim_attach(const struct toy_optim_param_ref *ps, int n,
                                         const struct toy_optim_dev_ops **ops, struct toy_dev_optim **out) {
    *ops = NULL;
    *out = NULL;
    for (size_t i = 0; i < sizeof backends / sizeof backends[0]; i++) {
        if (!backends[i]->optim) continue;
        enum toy_status st = backends[i]->optim->attach(ps, n, out);
        if (st) return st;
        if (*out) {
            *ops = backends[i]->optim;
            return TOY_OK;
        }
    }
    return TOY_OK;
}

/* ---- device names ------------------------------------------------------------- */

bool toy_cuda_built(void) {
#ifdef TOY_CUDA
    return true;
#else
    return false;
#endif
}

int toy_cuda_device_count(void) {
#ifdef TOY_CUDA
    return toy_cuda_count();
#else
    return 0;
#endif
}

/* name -> backend and index; checks that the device exists */
static enum toy_status resolve(const char *name, const struct toy_backend_ops **be, int *device) {
    if (!name) return toy_error(TOY_ERR_INVALID_ARG, "device: NULL name");
    if (!strcmp(name, "cpu")) {
        *be = &cpu_ops;
        *device = 0;
        return TOY_OK;
    }
    long idx = 0;
    if (!strncmp(name, "cuda", 4) && (name[4] == 0 || name[4] == ':')) {
        if (name[4] == ':') {
            char *end = NULL;
            idx = strtol(name + 5, &end, 10);
            if (!name[5] || *end || idx < 0 || idx > 1024)
                return toy_error(TOY_ERR_INVALID_ARG, "device '%s': expected cuda:N with N a device index", name);
        }
    } else {
        return toy_error(TOY_ERR_INVALID_ARG, "device '%s': expected cpu, cuda or cuda:N", name);
    }
#ifdef TOY_CUDA
    enum toy_status st = toy_cuda_check_device((int)idx);
    if (st) return st;
    *be = &cuda_ops;
    *device = (int)idx;
    return TOY_OK;
#else
    return toy_error(TOY_ERR_UNSUPPORTED, "device '%s': this toy was built without CUDA (rebuild with make CUDA=1)",
                     name);
#endif
}

enum toy_status toy_device_check(const char *name) {
    const struct toy_backend_ops *be;
    int d;
    return resolve(name, &be, &d);
}

/* The process default. Set once from the command line before graphs run;
 * not synchronised with graphs computing on other threads. */
static const struct toy_backend_ops *default_be = &cpu_ops;
static int default_dev;
static char default_name[32] = "cpu";

enum toy_status toy_device_set_default(const char *name) {
    const struct toy_backend_ops *be;
    int d;
    enum toy_status st = resolve(name, &be, &d);
    if (st) return st;
    default_be = be;
    default_dev = d;
    if (be == &cpu_ops) snprintf(default_name, sizeof default_name, "cpu");
    else snprintf(default_name, sizeof default_name, "%s:%d", be->name, d);
    return TOY_OK;
}

const char *toy_device_default(void) { return default_name; }

bool toy_backend_default_has(unsigned caps) { return (default_be->caps & caps) == caps; }

const struct toy_backend_ops *toy_backend_for_graph(const struct toy_graph *g, int *device) {
    if (g->be) {
        *device = g->device;
        return g->be;
    }
    *device = default_dev;
    return default_be;
}

enum toy_status toy_graph_set_device(struct toy_graph *g, const char *name) {
    const struct toy_backend_ops *be;
    int d;
    enum toy_status st = resolve(name, &be, &d);
    if (st) return st;
    if (g->fused_for && g->fused_for != be)
        return toy_error(TOY_ERR_STATE, "graph: fused for %s when it was planned; cannot move it to %s",
                         g->fused_for->name, name);
    int cur_dev;
    const struct toy_backend_ops *cur = toy_backend_for_graph(g, &cur_dev);
    if (cur->graph_free && (cur != be || cur_dev != d)) cur->graph_free(g);
    g->be = be;
    g->device = d;
    return TOY_OK;
}

void toy_device_update(const void *data, size_t size) {
#ifdef TOY_CUDA
    if (data && size) toy_cu_resident_update(data, size);
#else
    (void)data;
    (void)size;
#endif
}

void toy_graph_device_reset(struct toy_graph *g) {
    int d;
    const struct toy_backend_ops *be = toy_backend_for_graph(g, &d);
    if (be->graph_free) be->graph_free(g);
}

const char *toy_cpu_bf16_gemm(void) {
    toy_cpu_init();
    return toy_cpu_bf16_route();
}

bool toy_cpu_bf16_native(void) {
    toy_cpu_init();
    int64_t rows;
    return toy_cpu_bf16_kernel(&rows) != NULL;
}

const char *toy_cpu_f32_gemm(void) {
    toy_cpu_init();
    return toy_cpu_sgemm_own() ? "toy AVX-512" : "OpenBLAS";
}

enum toy_status toy_device_list(struct toy_device_info *out, int max, int *n) {
    if (!n || (!out && max > 0)) return toy_error(TOY_ERR_INVALID_ARG, "toy_device_list: %s is NULL", n ? "out" : "n");
    *n = 0;
    if (max <= 0) return TOY_OK;
    memset(&out[0], 0, sizeof out[0]);
    snprintf(out[0].name, sizeof out[0].name, "cpu");
    toy_cpu_init();
    char ahead[48] = "no prefetch";
    int one = toy_cpu_prefetch_ahead(), several = toy_cpu_prefetch_ahead_rows(2);
    if (one == several && one) snprintf(ahead, sizeof ahead, "prefetch %d B ahead", one);
    else if (one != several) snprintf(ahead, sizeof ahead, "prefetch %d B ahead from 2 rows", several);
    bool own = toy_cpu_sgemm_own(); /* F32 products: toy's kernel, else OpenBLAS's named kernels */
    bool f32_wide = toy_cpu_wide_loads_f32() && !toy_cpu_wide_loads();
    snprintf(out[0].description, sizeof out[0].description, "host CPU (%s, %s%s, %s decode loads%s, %s, bf16: %s)",
             toy_simd_name(), own ? "f32: toy AVX-512 GEMM" : "OpenBLAS ", own ? "" : toy_blas_core(),
             toy_cpu_wide_loads() ? "64-byte" : "narrow", f32_wide ? " (f32 64-byte)" : "", ahead,
             toy_cpu_bf16_route());
    *n = 1;
#ifdef TOY_CUDA
    int c = toy_cuda_count();
    for (int i = 0; i < c && *n < max; i++) {
        enum toy_status st = toy_cuda_device_info(i, &out[*n]);
        if (st) return st;
        (*n)++;
    }
#endif
    return TOY_OK;
}
