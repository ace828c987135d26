/* collective-impl.h: what an implementation of toy/collective.h provides.
 *
 * The generic layer (collective.c) owns bucketing, packing, the 1/world
 * scaling, the two-slot pipeline and the deadline; an implementation only
 * starts non-blocking operations on a slot and tests them for completion:
 *
 *   mpi  (collective-mpi.c, TOY_MPI): MPI_Iallreduce / MPI_Ibcast /
 *        MPI_Ibarrier on a duplicate of MPI_COMM_WORLD, MPI_Test.
 *   nccl (collective-nccl.c, TOY_CUDA: `make CUDA=1`, with MPI=1 for the
 *        bootstrap under mpirun): ncclAllReduce / ncclBroadcast / grouped
 *        ncclReduce and ncclBroadcast for ZeRO-1, on one stream, a
 *        cudaEvent per slot; test = cudaEventQuery; abort = ncclCommAbort
 *        then MPI_Abort / _Exit. For now the buffers are host memory staged
 *        through pinned and device bounce buffers; once gradients live on
 *        the device, copy/scale/alloc/free become cudaMemcpyAsync, a
 *        scaling kernel and cudaMalloc/cudaFree.
 *        toy_collective_nccl_open below is the entry point collective.c
 *        calls for TOY_COLLECTIVE_NCCL when TOY_CUDA is defined.
 *
 * Slots: at most TOY_COLLECTIVE_SLOTS operations are in flight; the generic
 * layer never starts an operation on a slot before its previous one has
 * tested complete.
 */
#ifndef TOY_COLLECTIVE_IMPL_H
#define TOY_COLLECTIVE_IMPL_H

#include <stdbool.h>

#include "toy/collective.h"

#define TOY_COLLECTIVE_SLOTS 2

struct toy_collective;

struct toy_collective_ops {
    const char *name;
    /* Start an in-place element-wise sum over the ranks. */
    enum toy_status (*start_allreduce_f32)(struct toy_collective *c, int slot, float *buf, int64_t n);
    enum toy_status (*start_allreduce_f64)(struct toy_collective *c, int slot, double *buf, int64_t n);
    enum toy_status (*start_bcast)(struct toy_collective *c, int slot, void *buf, size_t bytes, int root);
    enum toy_status (*start_barrier)(struct toy_collective *c, int slot);
    /* 1: the slot's operation is complete; 0: not yet; -1: failed (the
     * message is set with toy_error). */
    int (*test)(struct toy_collective *c, int slot);
    /* Ends every rank (does not return for multi-rank implementations). */
    void (*abort)(struct toy_collective *c, int code);
    /* Clean shutdown of a healthy communicator. */
    void (*finalize)(struct toy_collective *c);
    /* Memory the collective buffers live in (NULL: host memcpy, a host
     * loop, aligned host allocation). */
    void (*copy)(struct toy_collective *c, int slot, void *dst, const void *src, size_t bytes);
    void (*scale)(struct toy_collective *c, int slot, float *buf, int64_t n, float s);
    void *(*alloc)(struct toy_collective *c, size_t bytes);
    void (*free)(struct toy_collective *c, void *p);
    /* ZeRO-1 (toy_grad_sync with zero; NULL: this transport cannot shard).
     * Reduce-scatter: the sum over the ranks of send[0 .. sum(counts)),
     * rank r receiving its part, counts[r] floats from offset
     * counts[0] + .. + counts[r-1], into recv. All-gather, in place: rank
     * r's counts[r] floats at buf + displs[r] go to every rank. */
    enum toy_status (*start_reduce_scatter_f32)(struct toy_collective *c, int slot, const float *send, float *recv,
                                                const int *counts);
    enum toy_status (*start_allgather_f32)(struct toy_collective *c, int slot, float *buf, const int *counts,
                                           const int *displs);
};

/* A bucket in flight on a slot. */
struct toy_bucket_inflight {
    int n; /* pieces; 0: nothing in flight */
    bool staged;
    int64_t elems;
    struct toy_bucket_piece pieces[TOY_BUCKET_MAX_PIECES];
};

struct toy_collective {
    const struct toy_collective_ops *ops; /* NULL: local (world 1) */
    int rank, world, local_rank, local_size;
    size_t bucket_bytes;
    double timeout_s;                 /* < 0: none */
    bool broken;                      /* a call failed or timed out */
    char broken_msg[512];
    void *stage[TOY_COLLECTIVE_SLOTS]; /* bucket_bytes each, allocated on first use */
    float **bufs;                     /* scratch for the tensor adapters */
    int64_t *counts;
    size_t *sizes;
    int list_cap;
    struct toy_collective_stats stats;
    struct toy_bucket_inflight fl[TOY_COLLECTIVE_SLOTS];
    void *impl;                       /* the implementation's state */
};

/* The generic machinery, shared with grad-sync.c: the current failure as
 * the error of a broken collective; marking it broken; polling a slot to
 * completion against the deadline t0 + timeout_s; the staging buffers;
 * copy and scale in the collective's memory (host when ops is NULL). */
double toy_coll_now(void);
enum toy_status toy_coll_broken_error(struct toy_collective *c);
enum toy_status toy_coll_fail(struct toy_collective *c, enum toy_status st);
enum toy_status toy_coll_wait(struct toy_collective *c, int slot, const char *what, double t0);
enum toy_status toy_coll_ensure_stage(struct toy_collective *c);
void toy_coll_copy(struct toy_collective *c, int slot, void *dst, const void *src, size_t bytes);
void toy_coll_scale(struct toy_collective *c, int slot, float *x, int64_t n, float s);

#ifdef TOY_MPI
enum toy_status toy_collective_mpi_open(struct toy_collective *c);
#endif
#ifdef TOY_CUDA
enum toy_status toy_collective_nccl_open(struct toy_collective *c);
#endif

#endif
