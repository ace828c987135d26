/* cuda-impl.h: what the CUDA backend's files share (C and CUDA C++).
 *
 * The C side (cuda-device.c: devices, the caching allocator, resident
 * copies; cuda-graph.c: running a graph) describes each node to the kernel
 * side (kernels-*.cu) as a `toy_cu_node`: device pointers with the host
 * tensor's shape and byte strides, the op and its params. The kernel side
 * never sees a host tensor, so every .cu file is independent of the graph
 * structures. All work of one device goes onto one stream.
 */
#ifndef TOY_CUDA_IMPL_H
#define TOY_CUDA_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "toy/device.h"
#include "toy/status.h"

#ifdef __cplusplus
extern "C" {
#endif

struct toy_graph;

/* A tensor on the device: data is a device pointer; ne/nb as on the host. */
struct toy_cu_tensor {
    char *data;
    int32_t type;              /* enum toy_dtype */
    int64_t ne[4];
    int64_t nb[4];             /* bytes */
};

/* GEMM precision for F32 x F32 products (TOY_CUDA_MATH=f32|tf32|bf16). */
enum toy_cu_math { TOY_CU_MATH_F32 = 0, TOY_CU_MATH_TF32 = 1, TOY_CU_MATH_BF16 = 2 };

struct toy_cu_node {
    int32_t op;                /* enum toy_op */
    int32_t index;             /* node index in the graph (error reports) */
    int32_t op_params[16];
    struct toy_cu_tensor dst;
    struct toy_cu_tensor src[6];
    bool has_src[6];
    size_t dst_nbytes;         /* toy_nbytes(dst): aux bytes start there */
    char *work;                /* device scratch of work_size bytes */
    size_t work_size;
    void *stream;              /* cudaStream_t */
    void *cublas;              /* cublasHandle_t bound to stream */
    int32_t *err;              /* device word: set to index+1 on a bad index */
    int64_t n_past;            /* KV_STORE / cached attention: read on the host, else -1 */
    const double *rope_freq;   /* ROPE: device table of n_dims/2 inverse frequencies */
    int32_t math;              /* enum toy_cu_math */
    int64_t view_off;          /* VIEW_BACK: byte offset of the view (src[1]) in dst */
    /* MATMUL: the products it computes with it (graph-fuse.c's siblings:
     * the same A and prologue), their results, weights and bias rows
     * (data NULL: none) */
    int32_t n_sib;
    struct toy_cu_tensor sib_dst[2], sib_b[2], sib_bias[2];
    /* ATTENTION with P_AT_FUSED: the nodes it does the work of (graph-fuse.c),
     * its query's ROPE, the key's KV_STORE, the key's ROPE, the value's
     * KV_STORE */
    const struct toy_cu_node *led[4];
};

/* ---- kernels (kernels-*.cu) ---- */

/* Enqueues the node's kernels. 0 or a toy_status with msg filled. */
int toy_cu_run(const struct toy_cu_node *n, char *msg, size_t msg_size);
/* Device scratch the node needs (bytes); lean: without the scratch a node
 * only runs faster with (the attention backward's stored dS), which it does
 * without when its work is smaller. */
size_t toy_cu_work_size(const struct toy_cu_node *n, bool lean);
/* AdamW over n floats on the device (for a device-resident optimizer):
 * m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
 * p -= lr (m / bc1 / (sqrt(v) / bc2sqrt + eps) + wd p). */
int toy_cu_adamw(float *p, const float *g, float *m, float *v, int64_t n, float lr, float b1, float b2, float eps,
                 float wd, float bc1, float bc2sqrt, void *stream);
/* x *= s over n floats (toy_vec.scale's rounding). */
int toy_cu_scale_f32(float *x, int64_t n, float s, void *stream);
/* The sum of squares of n floats in double, as TOY_CU_SUMSQ_BLOCKS
 * partials (all written); toy_cu_sum_f64 adds n doubles into *out. Both
 * add in a fixed order: the same bits every run. */
#define TOY_CU_SUMSQ_BLOCKS 256
int toy_cu_sumsq_f32(const float *x, int64_t n, double *partial, void *stream);
int toy_cu_sum_f64(const double *x, int64_t n, double *out, void *stream);

/* ---- devices (cuda-device.c) ---- */

int toy_cuda_count(void);
enum toy_status toy_cuda_check_device(int dev);
enum toy_status toy_cuda_device_info(int dev, struct toy_device_info *out);

/* Per-device state: stream and cuBLAS handle, made on first use. */
struct toy_cu_device {
    int index;
    void *stream;
    void *cublas;
    void *cublas_ws; /* cuBLAS's workspace: ours, lives as long as the device state */
    int math;
};
enum toy_status toy_cu_device_get(int dev, struct toy_cu_device **out);

/* Caching allocator: blocks are rounded up (512 B / 2 MiB granules) and
 * kept in per-device free lists after toy_cu_free; a failed cudaMalloc
 * returns every cached block to the driver and retries once. */
enum toy_status toy_cu_alloc(int dev, size_t size, void **ptr);
void toy_cu_free(int dev, void *ptr);

/* Resident copies of constant host data, shared by graphs and counted:
 * the first acquire uploads, the last release frees. */
enum toy_status toy_cu_resident_acquire(int dev, const void *host, size_t size, void **dptr);
void toy_cu_resident_release(int dev, const void *host, size_t size);
/* Copies host bytes [host, host+size) again into every resident copy that
 * overlaps them, on every device (toy_device_update). */
void toy_cu_resident_update(const void *host, size_t size);

/* Error helpers: a toy_status with the CUDA error string. */
enum toy_status toy_cu_check(int err, const char *what);

/* ---- graphs (cuda-graph.c) ---- */

struct toy_tensor;
enum toy_status toy_cuda_graph_compute(struct toy_graph *g, int device);
/* the graph-fuse.c rewrites the kernels run */
struct toy_fuse_target;
extern const struct toy_fuse_target toy_cuda_fuse_target;
void toy_cuda_graph_free(struct toy_graph *g);
/* The device of a graph whose device state holds `grad` as a persistent
 * gradient (the graph ran there with a backward pass), or -1. */
int toy_cuda_graph_grad_device(const struct toy_tensor *grad);

/* ---- the device-resident optimizer (cuda-optim.c) ---- */

/* Bound buffers: host ranges whose device copy on `dev` is the truth (a
 * device-resident optimizer's parameters and gradients). A graph on dev
 * whose leaf lies inside one uses the copy in place: no upload before a
 * run, no download after. True and *dptr when [host, host+size) is inside
 * a bound range of dev. */
bool toy_cu_bound_find(int dev, const void *host, size_t size, void **dptr);
/* Changes whenever a range is bound or unbound: graphs prepared under
 * another generation build their device state again. */
uint64_t toy_cu_bound_gen(void);

struct toy_optim_dev_ops;
extern const struct toy_optim_dev_ops toy_cuda_optim_ops;

#ifdef __cplusplus
}
#endif
#endif
