/* cuda-mock.c: a stand-in for the CUDA runtime, cuBLAS and the CUDA kernels,
 * for `make CUDA_MOCK=1` (docs/cuda.md).
 *
 * It lets the CUDA backend's host side (src/backends/cuda/cuda-device.c,
 * cuda-graph.c: device selection, the device mirror of the plan, leaf
 * uploads, resident and shared KV copies, downloads, staging, the error
 * word, CUDA graph capture and replay) run on a machine without a GPU:
 * "device memory" is host memory (filled with NaN bytes when allocated, as
 * real device memory holds garbage), copies are memcpy, and toy_cu_run
 * computes each node descriptor with the CPU kernels. tests/test-cuda.c then
 * runs unchanged against it: what it checks in this build is the executor,
 * not the kernels. Never linked into a real build.
 *
 * `make CUDA_EMU=1` links this runtime with the real kernels instead, run
 * by the CPU emulator (tools/cuda-emu/), which then provides the calls
 * that depend on launches and capture (the parts under #ifndef
 * TOY_CUDA_EMU here).
 */
#ifdef TOY_CUDA_MOCK
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cuda/cuda-impl.h"
#include "core/internal.h"

/* ---- the runtime ---------------------------------------------------------------- */

static int cur_dev;

cudaError_t cudaGetDeviceCount(int *count) {
    *count = 1;
    return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device) {
    if (device != 0) return cudaErrorInvalidDevice;
    memset(prop, 0, sizeof *prop);
#ifdef TOY_CUDA_EMU
    strcpy(prop->name, "toy CUDA emulator (kernels on CPU fibers)");
#else
    strcpy(prop->name, "toy CUDA mock (CPU kernels)");
#endif
    prop->totalGlobalMem = (size_t)1 << 34;
    prop->major = 9;
    prop->multiProcessorCount = 1;
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
    if (device != 0) return cudaErrorInvalidDevice;
    cur_dev = device;
    return cudaSuccess;
}
cudaError_t cudaGetDevice(int *device) {
    *device = cur_dev;
    return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t *fr, size_t *total) {
    *fr = *total = (size_t)1 << 34;
    return cudaSuccess;
}
static int stream_token;
cudaError_t cudaStreamCreate(cudaStream_t *s) {
    *s = (cudaStream_t)&stream_token;
    return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags) {
    (void)flags;
    return cudaStreamCreate(s);
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
    (void)s;
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    (void)s;
    return cudaSuccess;
}
/* a device that refuses allocations over this many bytes (0: none), so
 * tests can see what happens when memory runs out */
size_t toy_cu_mock_max_alloc;

cudaError_t cudaMalloc(void **p, size_t size) {
    *p = NULL;
    if (toy_cu_mock_max_alloc && size > toy_cu_mock_max_alloc) return cudaErrorMemoryAllocation;
    /* 256-byte aligned, as the runtime's are (kernels may rely on it) */
    if (posix_memalign(p, 256, size ? size : 1)) return cudaErrorMemoryAllocation;
    memset(*p, 0xff, size); /* NaN floats: a kernel that reads what nobody wrote shows */
    return cudaSuccess;
}
cudaError_t cudaFree(void *p) {
    free(p);
    return cudaSuccess;
}
cudaError_t cudaMallocHost(void **p, size_t size) {
    *p = malloc(size ? size : 1);
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFreeHost(void *p) {
    free(p);
    return cudaSuccess;
}
cudaError_t cudaHostRegister(void *p, size_t size, unsigned int flags) {
    (void)p, (void)size, (void)flags;
    return cudaSuccess;
}
cudaError_t cudaHostUnregister(void *p) {
    (void)p;
    return cudaSuccess;
}
/* bytes copied host -> device and device -> host, for tests that check
 * what a run or an optimizer step transfers (tests/test-cuda.c reads them
 * through a weak reference: absent in real builds) */
size_t toy_cu_mock_copied[2];

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind) {
    if (kind == cudaMemcpyHostToDevice) toy_cu_mock_copied[0] += n;
    else if (kind == cudaMemcpyDeviceToHost) toy_cu_mock_copied[1] += n;
    memmove(dst, src, n);
    return cudaSuccess;
}
#ifndef TOY_CUDA_EMU /* the emulator's versions know about capture and launch errors */
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind, cudaStream_t s) {
    (void)s;
    return cudaMemcpy(dst, src, n, kind);
}
cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s) {
    (void)s;
    memset(p, v, n);
    return cudaSuccess;
}
cudaError_t cudaGetLastError(void) { return cudaSuccess; }
const char *cudaGetErrorString(cudaError_t e) { return e == cudaSuccess ? "no error" : "mock error"; }
const char *cudaGetErrorName(cudaError_t e) { return e == cudaSuccess ? "cudaSuccess" : "cudaErrorMock"; }
#endif
cudaError_t cudaEventCreate(cudaEvent_t *e) {
    *e = (cudaEvent_t)&stream_token;
    return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags) {
    (void)flags;
    return cudaEventCreate(e);
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
    (void)e;
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    (void)e, (void)s;
    return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t e) {
    (void)e;
    return cudaSuccess;
}
cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *p) {
    memset(a, 0, sizeof *a);
    a->type = cudaMemoryTypeDevice;
    a->devicePointer = (void *)p;
    return cudaSuccess;
}

#ifndef TOY_CUDA_EMU
/* capture: toy_cu_run records node descriptors; a launch replays them */
struct mock_graph {
    struct toy_cu_node *nodes;
    int n, cap;
};
static struct mock_graph *capturing;

cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode mode) {
    (void)s, (void)mode;
    if (capturing) return cudaErrorIllegalState;
    capturing = calloc(1, sizeof *capturing);
    return capturing ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g) {
    (void)s;
    *g = (cudaGraph_t)capturing;
    capturing = NULL;
    return *g ? cudaSuccess : cudaErrorIllegalState;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *e, cudaGraph_t g, unsigned long long flags) {
    (void)flags;
    struct mock_graph *src = (struct mock_graph *)g, *copy = calloc(1, sizeof *copy);
    if (!copy) return cudaErrorMemoryAllocation;
    copy->n = src->n;
    copy->nodes = malloc((size_t)(src->n ? src->n : 1) * sizeof *copy->nodes);
    if (!copy->nodes) return cudaErrorMemoryAllocation;
    memcpy(copy->nodes, src->nodes, (size_t)src->n * sizeof *copy->nodes);
    *e = (cudaGraphExec_t)copy;
    return cudaSuccess;
}
static void mock_graph_free(struct mock_graph *g) {
    if (!g) return;
    free(g->nodes);
    free(g);
}
cudaError_t cudaGraphDestroy(cudaGraph_t g) {
    mock_graph_free((struct mock_graph *)g);
    return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e) {
    mock_graph_free((struct mock_graph *)e);
    return cudaSuccess;
}
static int run_fused(const struct toy_cu_node *n);
cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t s) {
    (void)s;
    struct mock_graph *g = (struct mock_graph *)e;
    for (int i = 0; i < g->n; i++)
        if (run_fused(&g->nodes[i])) return cudaErrorLaunchFailure;
    return cudaSuccess;
}

#endif

/* ---- cuBLAS: only the handle calls (matmuls run on the CPU kernels) ---------------- */

static int blas_token;
cublasStatus_t cublasCreate_v2(cublasHandle_t *h) {
    *h = (cublasHandle_t)&blas_token;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy_v2(cublasHandle_t h) {
    (void)h;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream_v2(cublasHandle_t h, cudaStream_t s) {
    (void)h, (void)s;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t h, void *w, size_t n) {
    (void)h, (void)w, (void)n;
    return CUBLAS_STATUS_SUCCESS;
}
const char *cublasGetStatusString(cublasStatus_t s) { return s == CUBLAS_STATUS_SUCCESS ? "success" : "mock error"; }

#ifndef TOY_CUDA_EMU /* the emulator runs the real kernels (tools/cuda-emu/) */
/* ---- the kernels: each node descriptor computed by the CPU backend ------------------- */

static void as_tensor(struct toy_tensor *t, const struct toy_cu_tensor *d) {
    memset(t, 0, sizeof *t);
    t->type = (enum toy_dtype)d->type;
    t->n_dims = 4;
    for (int i = 0; i < 4; i++) {
        t->ne[i] = d->ne[i];
        t->nb[i] = (size_t)d->nb[i];
    }
    t->data = d->data;
}

static int run_node(const struct toy_cu_node *n) {
    struct toy_tensor dst, src[6];
    as_tensor(&dst, &n->dst);
    dst.op = (enum toy_op)n->op;
    memcpy(dst.op_params, n->op_params, sizeof dst.op_params);
    for (int i = 0; i < 6; i++) {
        if (!n->has_src[i]) continue;
        as_tensor(&src[i], &n->src[i]);
        dst.src[i] = &src[i];
    }
    if (n->op == TOY_OP_VIEW_BACK) { /* the CPU kernel reads the view's offset from its params */
        src[1].op_params[0] = (int32_t)(n->view_off & 0x7fffffff);
        src[1].op_params[1] = (int32_t)(n->view_off >> 31);
    }
    toy_cpu_init();
    size_t ws = toy_cpu_work_size(&dst, 1);
    void *work = NULL;
    if (posix_memalign(&work, 64, ws ? ws : 64)) return 1;
    memset(work, 0, ws ? ws : 64); /* as the graph's: the kernels' shared counters start at zero */
    toy_cpu_compute(&dst, 0, 1, work, ws);
    free(work);
    if (dst.op_params[TOY_MAX_OP_PARAMS - 1]) *n->err = n->index + 1;
    return 0;
}

/* f32 scratch shaped as t, contiguous */
static struct toy_cu_tensor scratch_like(const struct toy_cu_tensor *t, float **mem) {
    struct toy_cu_tensor c = {NULL, TOY_F32, {t->ne[0], t->ne[1], t->ne[2], t->ne[3]}, {4, 0, 0, 0}};
    for (int d = 1; d < 4; d++) c.nb[d] = c.nb[d - 1] * c.ne[d - 1];
    size_t bytes = (size_t)(c.nb[3] * c.ne[3]);
    *mem = malloc(bytes ? bytes : 4);
    c.data = (char *)*mem;
    return c;
}

/* a node of op over dst and sources (has_src set for those given) */
static int run_op(const struct toy_cu_node *like, enum toy_op op, struct toy_cu_tensor dst,
                  const struct toy_cu_tensor *s0, const struct toy_cu_tensor *s1, const struct toy_cu_tensor *s2) {
    struct toy_cu_node k;
    memset(&k, 0, sizeof k);
    k.op = op;
    k.index = like->index;
    k.err = like->err;
    k.dst = dst;
    const struct toy_cu_tensor *src[3] = {s0, s1, s2};
    for (int i = 0; i < 3; i++)
        if (src[i]) k.src[i] = *src[i], k.has_src[i] = true;
    if (op == TOY_OP_LAYER_NORM) k.op_params[P_EPS] = like->op_params[P_MM_EPS];
    return run_node(&k);
}

/* A product with a LayerNorm or GELU prologue or a bias row (graph-fuse.c's
 * rewrites for GPT-2, which the CPU kernels do not take), or one that adds
 * into the residual, as its unfused nodes: the prologue into scratch, the
 * product, the bias added, then the residual when it accumulates. The
 * device's GEMVs add a whole dot product into the residual once, as the
 * unfused ADD does; the CPU's sgemm, given the residual to accumulate into,
 * adds its k-blocks' partial sums one after another, which rounded another
 * way (a Q4_K product over 3 rows with toy's own AVX-512 sgemm). */
static int run_product(const struct toy_cu_node *n) {
    int pre = n->op_params[P_MM_PRE];
    bool own_pre = pre == TOY_MM_PRE_LAYER || pre == TOY_MM_PRE_GELU, accum = n->op_params[P_MM_ACCUM];
    if (!own_pre && !n->has_src[4] && !accum) return run_node(n);
    struct toy_cu_node one = *n;
    float *a = NULL, *c = NULL;
    int rc = 0;
    if (own_pre) {
        struct toy_cu_tensor at = scratch_like(&n->src[0], &a);
        rc = !a || (pre == TOY_MM_PRE_LAYER ? run_op(n, TOY_OP_LAYER_NORM, at, &n->src[0], n->has_src[2] ? &n->src[2] : NULL,
                                                     n->has_src[3] ? &n->src[3] : NULL)
                                            : run_op(n, TOY_OP_GELU, at, &n->src[0], NULL, NULL));
        one.src[0] = at;
        one.op_params[P_MM_PRE] = TOY_MM_PRE_NONE;
        one.has_src[2] = one.has_src[3] = false;
    }
    if (!rc && (n->has_src[4] || accum)) {
        bool bias = n->has_src[4];
        one.has_src[4] = one.has_src[5] = false;
        one.op_params[P_MM_ACCUM] = 0;
        if (accum) one.dst = scratch_like(&n->dst, &c);
        rc = (accum && !c) || run_node(&one) || (bias && run_op(n, TOY_OP_ADD, one.dst, &one.dst, &n->src[4], NULL)) ||
             (accum && run_op(n, TOY_OP_ADD, n->dst, &n->dst, &one.dst, NULL));
    } else if (!rc) {
        rc = run_node(&one);
    }
    free(a);
    free(c);
    return rc;
}

/* A node that does other nodes' work (graph-fuse.c), as the kernels do:
 * a product with siblings computes each of them; a fused attention first
 * runs the ROPEs and KV_STOREs it leads, then attends as unfused. */
static int run_fused(const struct toy_cu_node *n) {
    struct toy_cu_node one = *n;
    if (n->op == TOY_OP_MATMUL && n->n_sib) {
        one.n_sib = 0;
        if (run_product(&one)) return 1;
        for (int s = 0; s < n->n_sib; s++) {
            one.dst = n->sib_dst[s];
            one.src[1] = n->sib_b[s];
            one.src[4] = n->sib_bias[s];
            one.has_src[4] = n->sib_bias[s].data != NULL;
            if (run_product(&one)) return 1;
        }
        return 0;
    }
    if (n->op == TOY_OP_MATMUL) return run_product(n);
    if (n->op == TOY_OP_ATTENTION && n->op_params[P_AT_FUSED]) {
        static const int order[4] = {0, 2, 1, 3}; /* q's ROPE, k's ROPE, the two stores */
        for (int i = 0; i < 4; i++)
            if (!n->led[order[i]] || run_node(n->led[order[i]])) return 1;
        one.op_params[P_AT_FUSED] = 0;
        return run_node(&one);
    }
    return run_node(n);
}

int toy_cu_run(const struct toy_cu_node *n, char *msg, size_t msg_size) {
    (void)msg, (void)msg_size;
    if (capturing) {
        if (capturing->n == capturing->cap) {
            int nc = capturing->cap ? 2 * capturing->cap : 64;
            struct toy_cu_node *nn = realloc(capturing->nodes, (size_t)nc * sizeof *nn);
            if (!nn) return TOY_ERR_NOMEM;
            capturing->nodes = nn;
            capturing->cap = nc;
        }
        capturing->nodes[capturing->n++] = *n;
        return 0;
    }
    return run_fused(n) ? TOY_ERR_NOMEM : 0;
}

size_t toy_cu_work_size(const struct toy_cu_node *n, bool lean) {
    (void)n, (void)lean;
    return 0;
}

/* the device optimizer's kernels: the arithmetic of kernels-ops.cu, in plain C */
int toy_cu_adamw(float *p, const float *g, float *m, float *v, int64_t n, float lr, float b1, float b2, float eps,
                 float wd, float bc1, float bc2sqrt, void *stream) {
    (void)stream;
    float decay = 1.0f - lr * wd, step = lr / bc1;
    for (int64_t i = 0; i < n; i++) {
        p[i] *= decay;
        m[i] = m[i] * b1 + g[i] * (1.0f - b1);
        v[i] = v[i] * b2 + (1.0f - b2) * g[i] * g[i];
        p[i] += -step * (m[i] / (sqrtf(v[i]) / bc2sqrt + eps));
    }
    return 0;
}

int toy_cu_scale_f32(float *x, int64_t n, float s, void *stream) {
    (void)stream;
    for (int64_t i = 0; i < n; i++) x[i] = s * x[i];
    return 0;
}

int toy_cu_sumsq_f32(const float *x, int64_t n, double *partial, void *stream) {
    (void)stream;
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += (double)x[i] * x[i];
    partial[0] = s;
    for (int b = 1; b < TOY_CU_SUMSQ_BLOCKS; b++) partial[b] = 0;
    return 0;
}

int toy_cu_sum_f64(const double *x, int64_t n, double *out, void *stream) {
    (void)stream;
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += x[i];
    *out = s;
    return 0;
}
#endif /* TOY_CUDA_EMU */
#endif
