/* collective-nccl.c: the NCCL transport of toy/collective.h, one rank per
 * GPU (built with `make CUDA=1`, which defines TOY_CUDA and links cudart
 * and nccl; without it this file is empty). docs/distributed.md, "NCCL".
 *
 * Bootstrap: the ranks agree on an ncclUniqueId before ncclCommInitRank.
 *   - with MPI built in (`make CUDA=1 MPI=1`, launched by mpirun): MPI
 *     gives rank and world, rank 0 makes the id and broadcasts it
 *     (MPI_Ibcast polled against the collective's deadline);
 *   - without MPI: rank and world come from the launcher's environment
 *     (OMPI_COMM_WORLD_*, PMI_*, SLURM_PROCID/SLURM_NTASKS, RANK/WORLD_SIZE)
 *     and the id goes through a file named by TOY_NCCL_ID_FILE on a shared
 *     filesystem (rank 0 writes it under a temporary name and renames it;
 *     the others wait for it until the deadline; use a fresh path per job).
 * Device: this rank's GPU is TOY_NCCL_DEVICE when set, else its local rank
 * modulo the GPUs it sees (one process per GPU: `--device cuda:LOCAL_RANK`).
 *
 * Interim design, until gradients live in device memory: the generic layer
 * hands this transport host buffers (the CUDA backend copies parameter
 * gradients back to the host after each graph run, toy/device.h). Each
 * operation is staged: host buffer -> pinned bounce buffer (memcpy) ->
 * device buffer (cudaMemcpyAsync) -> NCCL -> pinned (cudaMemcpyAsync) ->
 * host buffer (memcpy, when test() first sees the slot's event complete).
 * Pinned memory keeps every copy asynchronous, so a start never blocks and
 * a peer that hangs is caught by the generic deadline instead of a blocked
 * cudaMemcpy. Device pointers are refused (TOY_ERR_UNSUPPORTED) until the
 * CUDA backend provides the scaling kernel and device buffers (then copy/
 * scale/alloc/free in the ops become cudaMemcpyAsync / a kernel /
 * cudaMalloc, and the staging goes away).
 *
 * Ordering: all operations go to one CUDA stream in the order the generic
 * layer starts them (the same order on every rank, which NCCL requires);
 * each slot records an event after its operation, and test = cudaEventQuery
 * plus ncclCommGetAsyncError (a peer's failure is an error, not a hang).
 * NCCL has no variable-count reduce-scatter or all-gather: ZeRO-1's parts
 * (which differ by at most one element) are a group of ncclReduce / ncclBroadcast
 * calls, one per rank. NCCL's ring and tree all-reduces compute each sum
 * once and share it, so every rank receives the same bits.
 *
 * Abort: ncclCommAbort (which unblocks a stream stuck on a dead peer), then
 * MPI_Abort, or without MPI _Exit(code): the documented contract of
 * toy_collective_abort (it ends the process of every live rank).
 *
 * Not run on a GPU: there was none on the machine this was written on. It
 * compiles (gcc and clang, -DTOY_CUDA against CUDA 13 / NCCL 2.28), and its
 * bookkeeping (staging, copy-back, the reduce-scatter's output, the
 * bootstrap file) runs in `make CUDA_MOCK=1` against the stand-in runtime
 * and a one-process NCCL stand-in (tests/test-collective.c, suite cuda);
 * NCCL itself, the GPU and a second rank are untested.
 */
#ifdef TOY_CUDA
#include <cuda_runtime_api.h>
#include <errno.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#ifdef TOY_MPI
#include <mpi.h>
#endif

#include "train/collective-impl.h"

struct nccl_slot {
    void *pinned, *dev; /* bounce buffers */
    size_t cap;         /* bytes of each */
    void *host;         /* where the result goes back (NULL: nothing) */
    size_t host_off, host_bytes;
    bool pending;       /* the result is still to be copied back */
};

struct nccl_state {
    ncclComm_t comm;
    cudaStream_t stream;
    cudaEvent_t ev[TOY_COLLECTIVE_SLOTS];
    struct nccl_slot slot[TOY_COLLECTIVE_SLOTS];
    int device;
#ifdef TOY_MPI
    bool we_initialized_mpi;
#endif
};

static struct nccl_state *st_of(struct toy_collective *c) { return c->impl; }

static enum toy_status cuda_err(cudaError_t e, const char *what) {
    return toy_error(TOY_ERR_IO, "%s: %s", what, cudaGetErrorString(e));
}

static enum toy_status nccl_err(ncclResult_t r, const char *what) {
    return toy_error(TOY_ERR_IO, "%s: %s", what, ncclGetErrorString(r));
}

static bool is_device_ptr(const void *p) {
#ifdef TOY_CUDA_MOCK /* the stand-in runtime (tools/cuda-mock.c) calls every pointer device memory */
    (void)p;
    return false;
#endif
    struct cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        cudaGetLastError(); /* plain host memory on old runtimes: clear the sticky error */
        return false;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

/* Grows a slot's bounce buffers (first steps only: they keep the largest). */
static enum toy_status ensure(struct nccl_state *m, int s, size_t bytes) {
    struct nccl_slot *sl = &m->slot[s];
    if (bytes <= sl->cap) return TOY_OK;
    cudaError_t e = cudaStreamSynchronize(m->stream); /* the old buffers may be in use */
    if (e != cudaSuccess) return cuda_err(e, "cudaStreamSynchronize");
    cudaFreeHost(sl->pinned);
    cudaFree(sl->dev);
    sl->pinned = sl->dev = NULL;
    sl->cap = 0;
    if ((e = cudaMallocHost(&sl->pinned, bytes)) != cudaSuccess) return cuda_err(e, "cudaMallocHost");
    if ((e = cudaMalloc(&sl->dev, bytes)) != cudaSuccess) return cuda_err(e, "cudaMalloc");
    sl->cap = bytes;
    return TOY_OK;
}

/* Stages `bytes` of host memory at src into the slot's device buffer. */
static enum toy_status stage_in(struct nccl_state *m, int s, const void *src, size_t bytes, size_t cap) {
    if (is_device_ptr(src))
        return toy_error(TOY_ERR_UNSUPPORTED, "NCCL: device buffers are not supported yet (host staging only)");
    enum toy_status st = ensure(m, s, cap > bytes ? cap : bytes);
    if (st) return st;
    if (!bytes) return TOY_OK;
    memcpy(m->slot[s].pinned, src, bytes);
    cudaError_t e = cudaMemcpyAsync(m->slot[s].dev, m->slot[s].pinned, bytes, cudaMemcpyHostToDevice, m->stream);
    return e == cudaSuccess ? TOY_OK : cuda_err(e, "cudaMemcpyAsync (to the device)");
}

/* Queues the copy back of dev[off, off + bytes) to host + off and the slot's event. */
static enum toy_status stage_out(struct nccl_state *m, int s, void *host, size_t off, size_t bytes) {
    struct nccl_slot *sl = &m->slot[s];
    cudaError_t e = cudaSuccess;
    if (bytes)
        e = cudaMemcpyAsync((char *)sl->pinned + off, (char *)sl->dev + off, bytes, cudaMemcpyDeviceToHost, m->stream);
    if (e != cudaSuccess) return cuda_err(e, "cudaMemcpyAsync (to the host)");
    if ((e = cudaEventRecord(m->ev[s], m->stream)) != cudaSuccess) return cuda_err(e, "cudaEventRecord");
    sl->host = host;
    sl->host_off = off;
    sl->host_bytes = bytes;
    sl->pending = host && bytes;
    return TOY_OK;
}

static enum toy_status start_sum(struct toy_collective *c, int s, void *buf, int64_t n, size_t esize,
                                 ncclDataType_t type) {
    struct nccl_state *m = st_of(c);
    size_t bytes = (size_t)n * esize;
    enum toy_status st = stage_in(m, s, buf, bytes, 0);
    if (st) return st;
    ncclResult_t r = ncclAllReduce(m->slot[s].dev, m->slot[s].dev, (size_t)n, type, ncclSum, m->comm, m->stream);
    if (r != ncclSuccess) return nccl_err(r, "ncclAllReduce");
    return stage_out(m, s, buf, 0, bytes);
}

static enum toy_status start_allreduce_f32(struct toy_collective *c, int s, float *buf, int64_t n) {
    return start_sum(c, s, buf, n, sizeof(float), ncclFloat32);
}

static enum toy_status start_allreduce_f64(struct toy_collective *c, int s, double *buf, int64_t n) {
    return start_sum(c, s, buf, n, sizeof(double), ncclFloat64);
}

static enum toy_status start_bcast(struct toy_collective *c, int s, void *buf, size_t bytes, int root) {
    struct nccl_state *m = st_of(c);
    enum toy_status st = c->rank == root ? stage_in(m, s, buf, bytes, 0) : ensure(m, s, bytes);
    if (st) return st;
    ncclResult_t r = ncclBroadcast(m->slot[s].dev, m->slot[s].dev, bytes, ncclUint8, root, m->comm, m->stream);
    if (r != ncclSuccess) return nccl_err(r, "ncclBroadcast");
    return stage_out(m, s, c->rank == root ? NULL : buf, 0, c->rank == root ? 0 : bytes);
}

/* NCCL has no barrier: a sum of one float does the same synchronisation. */
static enum toy_status start_barrier(struct toy_collective *c, int s) {
    struct nccl_state *m = st_of(c);
    enum toy_status st = ensure(m, s, 64);
    if (st) return st;
    ncclResult_t r = ncclAllReduce(m->slot[s].dev, m->slot[s].dev, 1, ncclFloat32, ncclSum, m->comm, m->stream);
    if (r != ncclSuccess) return nccl_err(r, "ncclAllReduce (barrier)");
    return stage_out(m, s, NULL, 0, 0);
}

/* Variable counts: rank q's part is reduced to rank q (ncclReduce), all in one group. */
static enum toy_status start_reduce_scatter_f32(struct toy_collective *c, int s, const float *send, float *recv,
                                                const int *counts) {
    struct nccl_state *m = st_of(c);
    int64_t total = 0;
    for (int q = 0; q < c->world; q++) total += counts[q];
    size_t bytes = (size_t)total * sizeof(float);
    /* the device buffer: the bucket, then room for this rank's part */
    enum toy_status st = stage_in(m, s, send, bytes, bytes + (size_t)counts[c->rank] * sizeof(float));
    if (st) return st;
    float *dev = m->slot[s].dev, *out = dev + total;
    ncclResult_t r = ncclGroupStart();
    int64_t off = 0;
    for (int q = 0; q < c->world && r == ncclSuccess; q++) {
        r = ncclReduce(dev + off, q == c->rank ? out : dev + off, (size_t)counts[q], ncclFloat32, ncclSum, q, m->comm,
                       m->stream);
        off += counts[q];
    }
    ncclResult_t r2 = ncclGroupEnd();
    if (r != ncclSuccess || r2 != ncclSuccess) return nccl_err(r != ncclSuccess ? r : r2, "ncclReduce (reduce-scatter)");
    /* the result lies after the bucket: copy it back to recv through the pinned buffer */
    struct nccl_slot *sl = &m->slot[s];
    size_t rb = (size_t)counts[c->rank] * sizeof(float);
    cudaError_t e = rb ? cudaMemcpyAsync(sl->pinned, out, rb, cudaMemcpyDeviceToHost, m->stream) : cudaSuccess;
    if (e != cudaSuccess) return cuda_err(e, "cudaMemcpyAsync (to the host)");
    if ((e = cudaEventRecord(m->ev[s], m->stream)) != cudaSuccess) return cuda_err(e, "cudaEventRecord");
    sl->host = recv;
    sl->host_off = 0;
    sl->host_bytes = rb;
    sl->pending = rb > 0;
    return TOY_OK;
}

/* In place, variable counts: rank q broadcasts its part, all in one group. */
static enum toy_status start_allgather_f32(struct toy_collective *c, int s, float *buf, const int *counts,
                                           const int *displs) {
    struct nccl_state *m = st_of(c);
    int64_t end = 0;
    for (int q = 0; q < c->world; q++)
        if (displs[q] + counts[q] > end) end = displs[q] + counts[q];
    size_t bytes = (size_t)end * sizeof(float);
    enum toy_status st = stage_in(m, s, buf, bytes, 0); /* only this rank's part matters */
    if (st) return st;
    float *dev = m->slot[s].dev;
    ncclResult_t r = ncclGroupStart();
    for (int q = 0; q < c->world && r == ncclSuccess; q++)
        r = ncclBroadcast(dev + displs[q], dev + displs[q], (size_t)counts[q], ncclFloat32, q, m->comm, m->stream);
    ncclResult_t r2 = ncclGroupEnd();
    if (r != ncclSuccess || r2 != ncclSuccess) return nccl_err(r != ncclSuccess ? r : r2, "ncclBroadcast (all-gather)");
    return stage_out(m, s, buf, 0, bytes);
}

static int test(struct toy_collective *c, int s) {
    struct nccl_state *m = st_of(c);
    ncclResult_t ar;
    if (ncclCommGetAsyncError(m->comm, &ar) == ncclSuccess && ar != ncclSuccess && ar != ncclInProgress) {
        nccl_err(ar, "NCCL (a peer failed)");
        return -1;
    }
    cudaError_t e = cudaEventQuery(m->ev[s]);
    if (e == cudaErrorNotReady) return 0;
    if (e != cudaSuccess) {
        cuda_err(e, "cudaEventQuery");
        return -1;
    }
    struct nccl_slot *sl = &m->slot[s];
    if (sl->pending) {
        memcpy((char *)sl->host + sl->host_off, (char *)sl->pinned + sl->host_off, sl->host_bytes);
        sl->pending = false;
    }
    return 1;
}

static void nccl_abort(struct toy_collective *c, int code) {
    struct nccl_state *m = st_of(c);
    fflush(stdout);
    fflush(stderr);
    if (m) ncclCommAbort(m->comm);
#ifdef TOY_MPI
    MPI_Abort(MPI_COMM_WORLD, code);
#endif
    _Exit(code);
}

static void release(struct nccl_state *m) {
    for (int s = 0; s < TOY_COLLECTIVE_SLOTS; s++) {
        cudaFreeHost(m->slot[s].pinned);
        cudaFree(m->slot[s].dev);
        if (m->ev[s]) cudaEventDestroy(m->ev[s]);
    }
    if (m->stream) cudaStreamDestroy(m->stream);
}

static void finalize(struct toy_collective *c) {
    struct nccl_state *m = st_of(c);
    /* a barrier with the deadline first: ncclCommDestroy waits for the peers without one */
    if (toy_collective_barrier(c) != TOY_OK) {
        fprintf(stderr, "toy: ending the job: %s\n", toy_last_error());
        nccl_abort(c, 1);
    }
    ncclCommDestroy(m->comm);
    release(m);
#ifdef TOY_MPI
    if (m->we_initialized_mpi) MPI_Finalize();
#endif
    free(m);
    c->impl = NULL;
}

static const struct toy_collective_ops nccl_ops = {
    .name = "nccl",
    .start_allreduce_f32 = start_allreduce_f32,
    .start_allreduce_f64 = start_allreduce_f64,
    .start_bcast = start_bcast,
    .start_barrier = start_barrier,
    .test = test,
    .abort = nccl_abort,
    .finalize = finalize,
    .start_reduce_scatter_f32 = start_reduce_scatter_f32,
    .start_allgather_f32 = start_allgather_f32,
};

/* ---- bootstrap ------------------------------------------------------------------- */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

#ifdef TOY_MPI
static enum toy_status bootstrap(struct toy_collective *c, struct nccl_state *m, ncclUniqueId *id) {
    int inited = 0, rc;
    MPI_Initialized(&inited);
    if (!inited) {
        int provided;
        if ((rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided)) != MPI_SUCCESS)
            return toy_error(TOY_ERR_IO, "MPI_Init_thread failed (%d)", rc);
        m->we_initialized_mpi = true;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &c->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &c->world);
    if (c->rank == 0) {
        ncclResult_t r = ncclGetUniqueId(id);
        if (r != ncclSuccess) return nccl_err(r, "ncclGetUniqueId");
    }
    MPI_Request req;
    if ((rc = MPI_Ibcast(id, (int)sizeof *id, MPI_BYTE, 0, MPI_COMM_WORLD, &req)) != MPI_SUCCESS)
        return toy_error(TOY_ERR_IO, "MPI_Ibcast of the NCCL id failed (%d)", rc);
    double deadline = c->timeout_s >= 0 ? now_s() + c->timeout_s : 1e300;
    for (int done = 0; !done;) {
        MPI_Test(&req, &done, MPI_STATUS_IGNORE);
        if (!done && now_s() > deadline)
            return toy_error(TOY_ERR_IO, "rank %d of %d: the NCCL id from rank 0 did not arrive within %g s", c->rank,
                             c->world, c->timeout_s);
        if (!done) nanosleep(&(struct timespec){0, 100000}, NULL);
    }
    return TOY_OK;
}
#else
static int env_first(const char *const *names, int dflt) {
    for (int i = 0; names[i]; i++) {
        const char *v = getenv(names[i]);
        if (v && *v) return atoi(v);
    }
    return dflt;
}

static enum toy_status bootstrap(struct toy_collective *c, struct nccl_state *m, ncclUniqueId *id) {
    (void)m;
    static const char *const rank_vars[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", "RANK", NULL};
    static const char *const world_vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS", "WORLD_SIZE", NULL};
    c->rank = env_first(rank_vars, 0);
    c->world = env_first(world_vars, 1);
    if (c->world < 1 || c->rank < 0 || c->rank >= c->world)
        return toy_error(TOY_ERR_INVALID_ARG, "NCCL: rank %d of %d from the environment", c->rank, c->world);
    const char *path = getenv("TOY_NCCL_ID_FILE");
    if (c->world > 1 && (!path || !*path))
        return toy_error(TOY_ERR_INVALID_ARG, "NCCL without MPI: set TOY_NCCL_ID_FILE to a fresh path on a filesystem "
                                              "every rank sees (or build with MPI=1 and launch with mpirun)");
    if (c->rank == 0) {
        ncclResult_t r = ncclGetUniqueId(id);
        if (r != ncclSuccess) return nccl_err(r, "ncclGetUniqueId");
        if (c->world == 1) return TOY_OK;
        char tmp[4200];
        snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
        FILE *f = fopen(tmp, "wb");
        if (!f) return toy_error(TOY_ERR_IO, "NCCL id file %s: %s", tmp, strerror(errno));
        bool ok = fwrite(id, sizeof *id, 1, f) == 1;
        ok = fclose(f) == 0 && ok;
        if (!ok || rename(tmp, path)) {
            remove(tmp);
            return toy_error(TOY_ERR_IO, "NCCL id file %s: %s", path, strerror(errno));
        }
        return TOY_OK;
    }
    double deadline = c->timeout_s >= 0 ? now_s() + c->timeout_s : 1e300;
    for (;;) {
        FILE *f = fopen(path, "rb");
        if (f) {
            size_t got = fread(id, sizeof *id, 1, f);
            fclose(f);
            if (got == 1) return TOY_OK;
        }
        if (now_s() > deadline)
            return toy_error(TOY_ERR_IO, "rank %d of %d: no NCCL id in %s after %g s (is rank 0 running?)", c->rank,
                             c->world, path, c->timeout_s);
        nanosleep(&(struct timespec){0, 20000000}, NULL);
    }
}
#endif

enum toy_status toy_collective_nccl_open(struct toy_collective *c) {
    struct nccl_state *m = calloc(1, sizeof *m);
    if (!m) return toy_error(TOY_ERR_NOMEM, "NCCL state");
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    enum toy_status st = bootstrap(c, m, &id);
    int n_dev = 0;
    cudaError_t e = cudaSuccess;
    if (!st && (e = cudaGetDeviceCount(&n_dev)) != cudaSuccess) st = cuda_err(e, "cudaGetDeviceCount");
    if (!st && n_dev < 1) st = toy_error(TOY_ERR_UNSUPPORTED, "NCCL: no CUDA device");
    if (!st) {
        static const char *const lr[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID", "LOCAL_RANK",
                                         NULL};
        const char *dv = getenv("TOY_NCCL_DEVICE");
        int local = 0;
        for (int i = 0; lr[i]; i++)
            if (getenv(lr[i]) && *getenv(lr[i])) {
                local = atoi(getenv(lr[i]));
                break;
            }
        m->device = dv && *dv ? atoi(dv) : local % n_dev;
        if ((e = cudaSetDevice(m->device)) != cudaSuccess) st = cuda_err(e, "cudaSetDevice");
    }
    if (!st && (e = cudaStreamCreateWithFlags(&m->stream, cudaStreamNonBlocking)) != cudaSuccess)
        st = cuda_err(e, "cudaStreamCreate");
    for (int s = 0; !st && s < TOY_COLLECTIVE_SLOTS; s++)
        if ((e = cudaEventCreateWithFlags(&m->ev[s], cudaEventDisableTiming)) != cudaSuccess)
            st = cuda_err(e, "cudaEventCreate");
    if (!st) {
        /* blocking: a rank that dies between the bootstrap and here leaves the others waiting
         * (mpirun then ends the job) */
        ncclResult_t r = ncclCommInitRank(&m->comm, c->world, id, c->rank);
        if (r != ncclSuccess) st = nccl_err(r, "ncclCommInitRank");
    }
    if (st) {
        release(m);
#ifdef TOY_MPI
        if (m->we_initialized_mpi) MPI_Finalize();
#endif
        free(m);
        return st;
    }
    c->impl = m;
    c->ops = &nccl_ops;
    return TOY_OK;
}
#else
/* ISO C wants a translation unit to declare something. */
typedef int toy_collective_nccl_not_built;
#endif
