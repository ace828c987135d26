/* toy/device.h: compute devices: which exist, and which one graphs run on.
 *
 * A graph runs on the CPU unless a device is chosen for it or for the
 * process. Device names: "cpu", "cuda" (= "cuda:0"), "cuda:N". CUDA devices
 * exist only in a build made with `make CUDA=1` (docs/cuda.md).
 *
 *     if (toy_device_set_default("cuda:0")) {          // e.g. from --device
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
 * t->data after a run works unchanged. The exception: the parameters and
 * gradients of an AdamW optimizer that works on the device (toy/optim.h)
 * live there between runs, and their host copies are refreshed on demand
 * (toy_optim_sync_host, a checkpoint write). KV caches and constants keep one
 * device copy per device, shared by every graph that reads them (a
 * generation's prefill and decode graphs); after writing into one of them
 * on the host, call toy_device_update on the bytes written.
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
    char description[192];    /* "NVIDIA H200" */
    size_t total_memory;      /* bytes (0 for the CPU) */
    size_t free_memory;       /* bytes free now (0 for the CPU) */
    int cc_major, cc_minor;   /* compute capability (0 for the CPU) */
    int multiprocessors;
};

/* The CPU's GEMM library: OpenBLAS's kernel set ("Cooperlake", "Haswell",
 * ...), and a note when toy chose it because OpenBLAS had fallen back to its
 * generic kernels on a CPU it does not know (else NULL). OPENBLAS_CORETYPE,
 * when set, is OpenBLAS's and is left alone. */
const char *toy_blas_core(void);
const char *toy_blas_core_note(void);
/* How BF16 products run on this CPU: "AMX tiles", "AVX-512 BF16 dot
 * products", "sgemm" (the bf16 values widened) or "dequantize + sgemm"
 * (no AVX-512 BF16); $TOY_BF16_GEMM overrides the choice. */
const char *toy_cpu_bf16_gemm(void);
/* True where products marked bf16 run as bf16 (AMX tiles or AVX-512 BF16
 * dot products), faster than f32; elsewhere they keep f32 arithmetic. */
bool toy_cpu_bf16_native(void);
/* Who runs F32 x F32 products: "OpenBLAS", or "toy AVX-512" (toy's own
 * kernel, where the CPU has AVX-512 and OpenBLAS runs older kernels, e.g.
 * OPENBLAS_CORETYPE=Haswell on a Zen 5); $TOY_SGEMM=own or =blas overrides. */
const char *toy_cpu_f32_gemm(void);

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
enum toy_status toy_device_set_default(const char *name);
const char *toy_device_default(void);

/* The device this graph runs on (overrides the process default). Frees
 * whatever the graph held on its previous device. */
enum toy_status toy_graph_set_device(struct toy_graph *g, const char *name);

/* Drops the graph's device-side state (the next run builds it again; shared
 * copies of constants and KV caches stay while other graphs hold them). A
 * no-op on the CPU. */
void toy_graph_device_reset(struct toy_graph *g);

/* After the host wrote into [data, data+size) of a KV cache or a constant
 * tensor that graphs on a device read: copies those bytes to the device
 * copies. A no-op without device copies (and in a CPU-only build). */
void toy_device_update(const void *data, size_t size);

#ifdef __cplusplus
}
#endif
#endif
