/* cuda-device.c: CUDA devices, their stream and cuBLAS handle, the caching
 * allocator and resident copies of constant host data.
 *
 * Every failure of the driver or the runtime (no driver, no device, out of
 * memory) comes back as a toy_status whose message carries the CUDA error
 * string; nothing here aborts. Compiled only with `make CUDA=1` (TOY_CUDA).
 *
 * Allocator: cudaMalloc/cudaFree synchronise the device, so freed blocks
 * are kept per device and reused by the next request of the same rounded
 * size class (best fit, at most 2x the request). Graphs allocate once per
 * plan, so in the step loop nothing reaches the driver.
 */
#ifdef TOY_CUDA
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cuda/cuda-impl.h"

#define MAX_DEVICES 64
#define CUBLAS_WORKSPACE ((size_t)32 << 20)

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

enum toy_status toy_cu_check(int err, const char *what) {
    if (err == cudaSuccess) return TOY_OK;
    enum toy_status st = err == cudaErrorMemoryAllocation ? TOY_ERR_NOMEM : TOY_ERR_BACKEND;
    return toy_error(st, "%s: %s (%s)", what, cudaGetErrorString((cudaError_t)err),
                     cudaGetErrorName((cudaError_t)err));
}

int toy_cuda_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); /* clear "no driver" so later calls start clean */
        return 0;
    }
    return n;
}

enum toy_status toy_cuda_check_device(int dev) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return toy_error(TOY_ERR_NOT_FOUND, "cuda:%d: no usable CUDA device (%s)", dev, cudaGetErrorString(e));
    }
    if (dev < 0 || dev >= n)
        return toy_error(TOY_ERR_NOT_FOUND, "cuda:%d: no such device (this machine has %d CUDA device%s)", dev, n,
                         n == 1 ? "" : "s");
    return TOY_OK;
}

enum toy_status toy_cuda_device_info(int dev, struct toy_device_info *out) {
    memset(out, 0, sizeof *out);
    struct cudaDeviceProp p;
    enum toy_status st = toy_cu_check(cudaGetDeviceProperties(&p, dev), "cudaGetDeviceProperties");
    if (st) return st;
    snprintf(out->name, sizeof out->name, "cuda:%d", dev);
    snprintf(out->description, sizeof out->description, "%.127s", p.name);
    out->total_memory = p.totalGlobalMem;
    out->cc_major = p.major;
    out->cc_minor = p.minor;
    out->multiprocessors = p.multiProcessorCount;
    size_t fr = 0, tot = 0;
    int prev = 0;
    cudaGetDevice(&prev);
    if (cudaSetDevice(dev) == cudaSuccess && cudaMemGetInfo(&fr, &tot) == cudaSuccess) out->free_memory = fr;
    else cudaGetLastError();
    cudaSetDevice(prev);
    return TOY_OK;
}

/* ---- per-device state ----------------------------------------------------------- */

static struct toy_cu_device *devices[MAX_DEVICES];

static int math_from_env(void) {
    const char *e = getenv("TOY_CUDA_MATH");
    if (!e) return TOY_CU_MATH_F32;
    if (!strcmp(e, "tf32")) return TOY_CU_MATH_TF32;
    if (!strcmp(e, "bf16")) return TOY_CU_MATH_BF16;
    return TOY_CU_MATH_F32;
}

enum toy_status toy_cu_device_get(int dev, struct toy_cu_device **out) {
    if (dev < 0 || dev >= MAX_DEVICES) return toy_error(TOY_ERR_NOT_FOUND, "cuda:%d: no such device", dev);
    pthread_mutex_lock(&lock);
    enum toy_status st = TOY_OK;
    if (!devices[dev]) {
        struct toy_cu_device *d = calloc(1, sizeof *d);
        cudaStream_t s = NULL;
        cublasHandle_t h = NULL;
        if (!d) st = toy_error(TOY_ERR_NOMEM, "cuda:%d: device state", dev);
        if (!st) st = toy_cuda_check_device(dev);
        if (!st) st = toy_cu_check(cudaSetDevice(dev), "cudaSetDevice");
        if (!st) st = toy_cu_check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
        if (!st) {
            cublasStatus_t cs = cublasCreate(&h);
            if (cs != CUBLAS_STATUS_SUCCESS)
                st = toy_error(TOY_ERR_BACKEND, "cuda:%d: cublasCreate: %s", dev, cublasGetStatusString(cs));
            else if ((cs = cublasSetStream(h, s)) != CUBLAS_STATUS_SUCCESS)
                st = toy_error(TOY_ERR_BACKEND, "cuda:%d: cublasSetStream: %s", dev, cublasGetStatusString(cs));
        }
        /* a workspace of our own, so cuBLAS never allocates while a decode
         * graph is being captured (NVIDIA's advice for stream capture) */
        void *ws = NULL;
        if (!st) st = toy_cu_check(cudaMalloc(&ws, CUBLAS_WORKSPACE), "cudaMalloc (cuBLAS workspace)");
        if (!st) {
            cublasStatus_t cs = cublasSetWorkspace(h, ws, CUBLAS_WORKSPACE);
            if (cs != CUBLAS_STATUS_SUCCESS)
                st = toy_error(TOY_ERR_BACKEND, "cuda:%d: cublasSetWorkspace: %s", dev, cublasGetStatusString(cs));
        }
        if (st && ws) cudaFree(ws);
        if (st) {
            if (h) cublasDestroy(h);
            if (s) cudaStreamDestroy(s);
            free(d);
        } else {
            d->index = dev;
            d->stream = s;
            d->cublas = h;
            d->cublas_ws = ws;
            d->math = math_from_env();
            devices[dev] = d;
        }
    }
    pthread_mutex_unlock(&lock);
    if (st) return st;
    *out = devices[dev];
    return toy_cu_check(cudaSetDevice(dev), "cudaSetDevice");
}

/* ---- caching allocator ------------------------------------------------------------ */

struct blk { void *ptr; size_t size; };
struct pool { struct blk *free; int n, cap; size_t cached; };
static struct pool pools[MAX_DEVICES];
/* live blocks: pointer -> rounded size, so toy_cu_free knows the class */
static struct blk *live[MAX_DEVICES];
static int n_live[MAX_DEVICES], cap_live[MAX_DEVICES];

static size_t round_size(size_t n) {
    if (n < ((size_t)1 << 20)) return (n + 511) / 512 * 512;
    size_t g = (size_t)2 << 20;
    return (n + g - 1) / g * g;
}

static void release_cached(int dev) {
    struct pool *p = &pools[dev];
    for (int i = 0; i < p->n; i++) cudaFree(p->free[i].ptr);
    p->n = 0;
    p->cached = 0;
}

enum toy_status toy_cu_alloc(int dev, size_t size, void **ptr) {
    *ptr = NULL;
    if (dev < 0 || dev >= MAX_DEVICES) return toy_error(TOY_ERR_NOT_FOUND, "cuda:%d: no such device", dev);
    size_t sz = round_size(size ? size : 1);
    pthread_mutex_lock(&lock);
    struct pool *p = &pools[dev];
    int best = -1;
    for (int i = 0; i < p->n; i++)
        if (p->free[i].size >= sz && p->free[i].size <= 2 * sz && (best < 0 || p->free[i].size < p->free[best].size))
            best = i;
    void *d = NULL;
    if (best >= 0) {
        d = p->free[best].ptr;
        sz = p->free[best].size;
        p->cached -= sz;
        p->free[best] = p->free[--p->n];
    } else {
        cudaError_t e = cudaMalloc(&d, sz);
        if (e == cudaErrorMemoryAllocation) { /* give the cache back and retry */
            cudaGetLastError();
            release_cached(dev);
            e = cudaMalloc(&d, sz);
        }
        if (e != cudaSuccess) {
            cudaGetLastError();
            pthread_mutex_unlock(&lock);
            size_t fr = 0, tot = 0;
            cudaMemGetInfo(&fr, &tot);
            cudaGetLastError();
            char what[160];
            snprintf(what, sizeof what, "cuda:%d: cudaMalloc of %.1f MiB (%.1f MiB free of %.1f MiB)", dev,
                     (double)sz / 1048576.0, (double)fr / 1048576.0, (double)tot / 1048576.0);
            return toy_cu_check(e, what);
        }
    }
    if (n_live[dev] == cap_live[dev]) {
        int nc = cap_live[dev] ? 2 * cap_live[dev] : 256;
        struct blk *nl = realloc(live[dev], (size_t)nc * sizeof *nl);
        if (!nl) {
            cudaFree(d);
            pthread_mutex_unlock(&lock);
            return toy_error(TOY_ERR_NOMEM, "cuda allocator: block table");
        }
        live[dev] = nl;
        cap_live[dev] = nc;
    }
    live[dev][n_live[dev]++] = (struct blk){d, sz};
    pthread_mutex_unlock(&lock);
    *ptr = d;
    return TOY_OK;
}

void toy_cu_free(int dev, void *ptr) {
    if (!ptr || dev < 0 || dev >= MAX_DEVICES) return;
    pthread_mutex_lock(&lock);
    size_t sz = 0;
    for (int i = n_live[dev] - 1; i >= 0; i--)
        if (live[dev][i].ptr == ptr) {
            sz = live[dev][i].size;
            live[dev][i] = live[dev][--n_live[dev]];
            break;
        }
    struct pool *p = &pools[dev];
    if (sz && p->n == p->cap) {
        int nc = p->cap ? 2 * p->cap : 64;
        struct blk *nf = realloc(p->free, (size_t)nc * sizeof *nf);
        if (nf) {
            p->free = nf;
            p->cap = nc;
        }
    }
    if (sz && p->n < p->cap) {
        p->free[p->n++] = (struct blk){ptr, sz};
        p->cached += sz;
    } else {
        cudaFree(ptr);
    }
    pthread_mutex_unlock(&lock);
}

/* ---- resident copies ------------------------------------------------------------------ */

struct resident { const void *host; size_t size; void *dptr; int refs; };
static struct resident *res[MAX_DEVICES];
static int n_res[MAX_DEVICES], cap_res[MAX_DEVICES];

enum toy_status toy_cu_resident_acquire(int dev, const void *host, size_t size, void **dptr) {
    pthread_mutex_lock(&lock);
    for (int i = 0; i < n_res[dev]; i++)
        if (res[dev][i].host == host && res[dev][i].size == size) {
            res[dev][i].refs++;
            *dptr = res[dev][i].dptr;
            pthread_mutex_unlock(&lock);
            return TOY_OK;
        }
    pthread_mutex_unlock(&lock);
    void *d = NULL;
    enum toy_status st = toy_cu_alloc(dev, size, &d);
    if (st) return st;
    /* one synchronous copy per constant (an mmapped GGUF's pages are read
     * once; pinning them would cost more than it saves) */
    st = toy_cu_check(cudaMemcpy(d, host, size, cudaMemcpyHostToDevice), "upload of a constant tensor");
    if (st) {
        toy_cu_free(dev, d);
        return st;
    }
    pthread_mutex_lock(&lock);
    if (n_res[dev] == cap_res[dev]) {
        int nc = cap_res[dev] ? 2 * cap_res[dev] : 256;
        struct resident *nr = realloc(res[dev], (size_t)nc * sizeof *nr);
        if (!nr) {
            pthread_mutex_unlock(&lock);
            toy_cu_free(dev, d);
            return toy_error(TOY_ERR_NOMEM, "cuda: resident table");
        }
        res[dev] = nr;
        cap_res[dev] = nc;
    }
    res[dev][n_res[dev]++] = (struct resident){host, size, d, 1};
    pthread_mutex_unlock(&lock);
    *dptr = d;
    return TOY_OK;
}

void toy_cu_resident_release(int dev, const void *host, size_t size) {
    void *d = NULL;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < n_res[dev]; i++)
        if (res[dev][i].host == host && res[dev][i].size == size) {
            if (--res[dev][i].refs == 0) {
                d = res[dev][i].dptr;
                res[dev][i] = res[dev][--n_res[dev]];
            }
            break;
        }
    pthread_mutex_unlock(&lock);
    if (d) toy_cu_free(dev, d);
}

void toy_cu_resident_update(const void *host, size_t size) {
    const char *lo = host, *hi = lo + size;
    pthread_mutex_lock(&lock);
    for (int dev = 0; dev < MAX_DEVICES; dev++)
        for (int i = 0; i < n_res[dev]; i++) {
            const char *a = res[dev][i].host, *b = a + res[dev][i].size;
            if (b <= lo || a >= hi) continue;
            const char *from = a > lo ? a : lo, *to = b < hi ? b : hi;
            int prev = 0;
            cudaGetDevice(&prev);
            if (cudaSetDevice(dev) == cudaSuccess)
                cudaMemcpy((char *)res[dev][i].dptr + (from - a), from, (size_t)(to - from), cudaMemcpyHostToDevice);
            cudaGetLastError();
            cudaSetDevice(prev);
        }
    pthread_mutex_unlock(&lock);
}
#endif
