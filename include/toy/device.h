/* toy/device.h: compute devices: which exist, and which one graphs run on.
 *
 * A graph runs on the CPU unless a device is chosen for it or for the
 * process. Device names: "cpu", "cuda" (= "cuda:0"), "cuda:N". CUDA devices
 * exist only in a build made with `make CUDA=1` (docs/cuda.md).
 *
 *     if (toy_set_default_device("cuda:0")) {          // e.g. from --device
 *         fprintf(stderr, "toy: %s\n", toy_last_error());
 *         return 1;
 *     }
 *     toy_graph_compute(g, pool);                       // now runs on the GPU
 *
 * On a device, host memory stays the truth between runs: leaves are uploaded
 * before a run (constant weights once: tensors in read-only memory such as
 * a mmapped GGUF, or flagged TOY_FLAG_CONST), and OUTPUT / LOSS results,
 * parameter gradients and the rows a run stored into a KV cache are copied
 * back when toy_graph_compute returns. So every caller that reads
 * t->data after a run works unchanged. A KV cache stays resident on the
 * device: a host-side write into a cache must be followed by
 * toy_graph_device_reset(g) for the graphs reading it.
 */
#ifndef TOY_DEVICE_H
#define TOY_DEVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "toy/status.h"

#ifdef __cplusplus
extern "C" {
#endif

struct toy_graph;

struct toy_device_info {
    char name[32];            /* "cpu", "cuda:0" */
    char description[128];    /* "NVIDIA H200" */
    size_t total_memory;      /* bytes (0 for the CPU) */
    size_t free_memory;       /* bytes free now (0 for the CPU) */
    int cc_major, cc_minor;   /* compute capability (0 for the CPU) */
    int multiprocessors;
};

/* True when this build includes the CUDA backend. */
bool toy_cuda_built(void);
/* Number of CUDA devices usable now (0 without CUDA, a driver or a GPU). */
int toy_cuda_device_count(void);

/* Fills up to max entries (the CPU first, then each CUDA device); *n gets
 * the number written. Never fails for lack of a GPU. */
enum toy_status toy_device_list(struct toy_device_info *out, int max, int *n);

/* Parses and checks a device name: "cpu", "cuda", "cuda:N". Errors:
 * TOY_ERR_INVALID_ARG (bad name), TOY_ERR_UNSUPPORTED (a CPU-only build),
 * TOY_ERR_NOT_FOUND (no such GPU), TOY_ERR_BACKEND (the driver failed). */
enum toy_status toy_device_check(const char *name);

/* The device every graph without its own device runs on (default "cpu").
 * Same errors as toy_device_check; on error the default is unchanged. */
enum toy_status toy_set_default_device(const char *name);
const char *toy_default_device(void);

/* The device this graph runs on (overrides the process default). Frees
 * whatever the graph held on its previous device. */
enum toy_status toy_graph_set_device(struct toy_graph *g, const char *name);

/* Drops the graph's device-side copies (the next run uploads everything
 * again, KV caches included). A no-op on the CPU. */
void toy_graph_device_reset(struct toy_graph *g);

#ifdef __cplusplus
}
#endif
#endif
