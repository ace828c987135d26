/* collective-impl.h: what an implementation of toy/collective.h provides.
 *
 * The generic layer (collective.c) owns bucketing, packing, the 1/world
 * scaling, the two-slot pipeline and the deadline; an implementation only
 * starts non-blocking operations on a slot and tests them for completion:
 *
 *   mpi  (collective-mpi.c, TOY_MPI): MPI_Iallreduce / MPI_Ibcast /
 *        MPI_Ibarrier on a duplicate of MPI_COMM_WORLD, MPI_Test.
 *   nccl (the CUDA issue; TOY_NCCL, not built yet): ncclAllReduce /
 *        ncclBroadcast on a per-slot stream with a cudaEvent recorded after
 *        it; test = cudaEventQuery; abort = ncclCommAbort then exit(code);
 *        copy/scale/alloc/free = cudaMemcpyAsync on the slot's stream, a
 *        scaling kernel, cudaMalloc/cudaFree (the buffers are device memory).
 *        toy_collective_nccl_open below is the entry point collective.c
 *        calls for TOY_COLLECTIVE_NCCL when TOY_NCCL is defined.
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

#ifdef TOY_MPI
enum toy_status toy_collective_mpi_open(struct toy_collective *c);
#endif
#ifdef TOY_NCCL
enum toy_status toy_collective_nccl_open(struct toy_collective *c);
#endif

#endif
