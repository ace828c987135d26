/* toy/collective.h: the communication layer of data parallelism: N
 * processes ("ranks") train one model, each on its own shard of every
 * batch, and after the backward pass every gradient is replaced by its mean
 * over the ranks (an all-reduce), so every rank applies the same optimizer
 * step to the same weights. docs/distributed.md has the design, the checks
 * and the cost model.
 *
 * Implementations, chosen at run time by toy_collective_open:
 *   local  one process, world 1: every call is a no-op (always built);
 *   mpi    MPI ranks on CPUs (Open MPI), built with `make MPI=1`;
 *   nccl   one rank per GPU (src/train/collective-nccl.c), built with
 *          `make CUDA=1 MPI=1`: MPI bootstraps NCCL's communicator.
 *
 *     struct toy_collective *c;
 *     if (toy_collective_open(TOY_COLLECTIVE_AUTO, NULL, &c)) { fprintf(stderr, "%s\n", toy_last_error()); ... }
 *     struct toy_data_opts d = {.batch = 8, .ctx = 256, .seed = 1,
 *                               .rank = toy_collective_rank(c), .world = toy_collective_world(c)};
 *     ... build the model, then make every rank start from rank 0's weights:
 *     toy_collective_broadcast_tensors(c, params, n_params, 0);
 *     toy_trainer_set_collective(tr, toy_collective_allreduce_grads, c, rank, world);
 *     toy_trainer_set_reduce(tr, toy_collective_reduce_sum);
 *     ...
 *     toy_collective_close(c);   // MPI_Finalize (or MPI_Abort after a failure)
 *
 * Bucketing: the buffers of one call, taken as one array in order, are cut
 * into buckets of at most bucket_bytes; each bucket is one message (small
 * tensors are packed together, a large one is split), and two buckets are
 * in flight at a time so packing one overlaps the transfer of the other.
 * A bucket holds at most TOY_BUCKET_MAX_PIECES pieces of buffers.
 *
 * Failure: every collective waits with a deadline (opts.timeout_s). A rank
 * that died or hangs makes the others' next collective fail with
 * TOY_ERR_IO and a message naming the operation and the timeout, instead of
 * waiting forever; the collective is then broken (every later call fails at
 * once) and toy_collective_close ends the whole job (MPI_Abort), because
 * MPI cannot finalize with a peer missing.
 *
 * Every rank receives the same result bits (MPI's all-reduce algorithms
 * compute each sum once and share it, and a two-term sum does not depend
 * on the order), so replicas that apply the same update stay identical.
 * A toy_collective is used from one thread.
 */
#ifndef TOY_COLLECTIVE_H
#define TOY_COLLECTIVE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "toy/status.h"
#include "toy/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

enum toy_collective_kind {
    TOY_COLLECTIVE_AUTO = 0, /* $TOY_COLLECTIVE (mpi, nccl, local) when set; else mpi when launched by
                                mpirun/srun in an MPI build, else local */
    TOY_COLLECTIVE_LOCAL,
    TOY_COLLECTIVE_MPI,
    TOY_COLLECTIVE_NCCL,
};

#define TOY_COLLECTIVE_BUCKET_BYTES ((size_t)16 << 20) /* 16 MiB */
#define TOY_COLLECTIVE_TIMEOUT_S 300.0
#define TOY_BUCKET_MAX_PIECES 256

struct toy_collective_opts {
    size_t bucket_bytes; /* largest message; 0: TOY_COLLECTIVE_BUCKET_BYTES; at least 64 */
    double timeout_s;    /* deadline of one collective; 0: TOY_COLLECTIVE_TIMEOUT_S; < 0: none */
};

struct toy_collective;

/* Opens a communicator over all ranks of the job (MPI: MPI_Init_thread,
 * unless the program initialized MPI itself, and a duplicate of
 * MPI_COMM_WORLD). o may be NULL. AUTO picks mpi when the environment says
 * an MPI launcher started this process (OMPI_COMM_WORLD_SIZE, PMI_SIZE or
 * PMIX_RANK) and MPI is built in; launched by mpirun with more than one rank
 * but built without MPI is an error (the ranks would train independently).
 * Errors: TOY_ERR_UNSUPPORTED (a kind not built in), TOY_ERR_IO (MPI
 * failed), TOY_ERR_INVALID_ARG, TOY_ERR_NOMEM. */
enum toy_status toy_collective_open(enum toy_collective_kind kind, const struct toy_collective_opts *o,
                                    struct toy_collective **out);

/* Finalizes (MPI_Finalize after a barrier). On a broken collective (a
 * failed or timed-out call) it ends every rank of the job with MPI_Abort
 * (exit code 1) and does not return: rank 0 at once (a trainer checkpoints
 * before it gets here), any other rank only after waiting up to
 * min(timeout_s, 30) seconds for rank 0 to do so, so that a surviving
 * rank 0 is not killed in the middle of writing its checkpoint. NULL is a
 * no-op. */
void toy_collective_close(struct toy_collective *c);

/* Whether a call failed or timed out (every later call fails; close ends
 * the job). */
bool toy_collective_broken(const struct toy_collective *c);

/* Ends every rank of the job now with exit code `code` (MPI_Abort); with
 * the local implementation it returns and the caller exits as it likes. */
void toy_collective_abort(struct toy_collective *c, int code);

int toy_collective_rank(const struct toy_collective *c);
int toy_collective_world(const struct toy_collective *c);
/* This rank among the ranks on its machine, and how many share it (from
 * the launcher's environment; 0 and 1 when unknown). */
int toy_collective_local_rank(const struct toy_collective *c);
int toy_collective_local_size(const struct toy_collective *c);
/* Threads one rank should compute with: the cores the launcher bound it to
 * (mpirun binds each of up to 2 ranks to one core by default), else its
 * share of the machine's cores; at least 1. */
int toy_collective_threads(const struct toy_collective *c);
/* "local", "mpi", "nccl". */
const char *toy_collective_name(const struct toy_collective *c);

/* Replaces every element of bufs[i][0..counts[i]) by its mean over the
 * ranks, on every rank. The same call (same counts, same order) must be
 * made on every rank. */
enum toy_status toy_collective_allreduce_mean(struct toy_collective *c, float *const *bufs, const int64_t *counts,
                                              int n);

/* Element-wise sum of v[0..n) over the ranks, in place on every rank (small
 * vectors: losses, token counts, timings; one message). */
enum toy_status toy_collective_allreduce_sum_f64(struct toy_collective *c, double *v, int n);

/* Copies root's bufs[i][0..bytes[i]) to every other rank. */
enum toy_status toy_collective_broadcast(struct toy_collective *c, void *const *bufs, const size_t *bytes, int n,
                                         int root);

/* Broadcasts the data of n contiguous tensors (any dtype). */
enum toy_status toy_collective_broadcast_tensors(struct toy_collective *c, struct toy_tensor *const *t, int n,
                                                 int root);

enum toy_status toy_collective_barrier(struct toy_collective *c);

/* Whether every rank holds the same 64-bit value h (a hash of its
 * settings, say): *differ is the number of ranks whose h is not rank 0's,
 * the same on every rank; *self whether this rank is one of them. Every rank
 * calls it, before collectives whose sizes depend on what h hashes.
 * toy_reduce_agree does it over a sum hook (the trainer's, toy/trainer.h):
 * rank 0's h goes round in 16-bit pieces, exact in doubles. */
enum toy_status toy_collective_agree(struct toy_collective *c, uint64_t h, int *differ, bool *self);
enum toy_status toy_reduce_agree(enum toy_status (*sum)(void *ud, double *v, int n), void *ud, int rank, uint64_t h,
                                 int *differ, bool *self);

/* Adapters with the trainer's hook signatures (toy/trainer.h), ud = the
 * collective: the mean of each tensor's f32 gradient (p->grad->data,
 * toy_nelements(p) floats), and the sum of a vector of doubles. */
enum toy_status toy_collective_allreduce_grads(void *c, struct toy_tensor *const *params, int n_params);
enum toy_status toy_collective_reduce_sum(void *c, double *v, int n);

/* ---- gradients bucket by bucket, overlapped with the backward pass ---- */

/* A plan for one model's gradients, made once: n buffers grads[i] of
 * counts[i] floats, in the order the backward pass finishes them, where
 * buffer i is final once the node `ready[i]` of the training graph has run
 * (toy_graph_grad_last_writers; -1: final from the start; ready NULL: all
 * -1). The buffers are cut into buckets as toy_collective_allreduce_mean
 * cuts them, and each bucket is startable once the largest ready of its
 * buffers has been reported.
 *
 * One step:
 *     toy_grad_sync_begin(s, 1.0f / accum);
 *     toy_graph_set_node_callback(g, toy_grad_sync_on_node, s);   // overlap
 *     toy_graph_compute(g, tp);                                   // the last micro-batch
 *     toy_graph_set_node_callback(g, NULL, NULL);
 *     toy_grad_sync_end(s);        // starts what is left, waits for all of it
 * Without the callback (or with ready NULL) the same buckets are sent after
 * the backward pass: overlap changes when a bucket is sent, never what is
 * summed, so both give the same bits. Each element is multiplied by
 * `prescale` before it is sent and the sum by 1/world, so grads end as the
 * mean over the ranks of prescale x grads. Buckets start in order, at most
 * TOY_COLLECTIVE_SLOTS in flight (later ready ones wait for a slot, started
 * by a later report); the one in flight longest is tested at every report,
 * which is what advances MPI's non-blocking collectives.
 *
 * zero (ZeRO-1): instead of an all-reduce, each bucket is reduce-scattered:
 * rank r receives the mean of its part (elements [E r/W, E (r+1)/W) of a
 * bucket of E), written into grads at those positions; the other
 * positions of grads are left unreduced. After updating its part of the
 * parameters (params[i], laid out like grads[i]), every rank calls
 * toy_grad_sync_allgather_params. With one rank (or the local
 * implementation) every call only applies the prescale; a ZeRO-1 plan then
 * owns everything.
 * Errors: TOY_ERR_NOMEM, TOY_ERR_UNSUPPORTED (ZeRO-1 over a transport
 * without reduce-scatter), TOY_ERR_IO from begin/end/all-gather as for the
 * other collectives (a failure during the backward pass is reported by
 * end), TOY_ERR_STATE for calls out of order. */
struct toy_grad_sync;
struct toy_bucket_piece;
enum toy_status toy_grad_sync_new(struct toy_collective *c, float *const *grads, float *const *params,
                                  const int64_t *counts, const int *ready, int n, bool zero,
                                  struct toy_grad_sync **out);
void toy_grad_sync_free(struct toy_grad_sync *s);
enum toy_status toy_grad_sync_begin(struct toy_grad_sync *s, float prescale);
/* Reports that every node up to `node` has run (cheap: a comparison and
 * one test of the oldest bucket in flight). */
void toy_grad_sync_ready(struct toy_grad_sync *s, int node);
/* toy_grad_sync_ready with toy_graph_node_fn's signature (ud = the plan). */
void toy_grad_sync_on_node(void *s, int node);
enum toy_status toy_grad_sync_end(struct toy_grad_sync *s);
int toy_grad_sync_n_buckets(const struct toy_grad_sync *s);
/* Bucket k's ready node, and how many buckets this step has started (for
 * tests and traces). */
int toy_grad_sync_bucket_ready(const struct toy_grad_sync *s, int k);
int toy_grad_sync_started(const struct toy_grad_sync *s);

/* ZeRO-1: this rank's part of the gradients, as pieces of the plan's
 * buffers in the order of its flat shard (*elems floats in all); 0 pieces
 * without zero. */
int toy_grad_sync_shard(const struct toy_grad_sync *s, const struct toy_bucket_piece **pieces, int64_t *elems);
/* After each rank updated its part of params: every rank gets all of it. */
enum toy_status toy_grad_sync_allgather_params(struct toy_grad_sync *s);
/* Collects every rank's flat shard (e.g. of an optimizer moment) into
 * root's full[i] (laid out like grads[i]); full is only used on root.
 * Every rank must call it. */
enum toy_status toy_grad_sync_gather_shard(struct toy_grad_sync *s, const float *shard, float *const *full, int root);

/* What went over the wire so far (this rank's view). */
struct toy_collective_stats {
    int64_t calls;   /* collective operations */
    int64_t buckets; /* messages */
    int64_t bytes;   /* payload bytes reduced or broadcast */
    double seconds;  /* wall time inside the calls */
};
void toy_collective_get_stats(const struct toy_collective *c, struct toy_collective_stats *s);

/* ---- bucketing (what the implementations share; exposed for tests) ---- */

/* A piece of a bucket: elements [off, off + count) of buffer `buf`. */
struct toy_bucket_piece {
    int buf;
    int64_t off, count;
};

/* Where the next bucket starts: {0, 0} before the first. */
struct toy_bucket_cursor {
    int buf;
    int64_t off;
};

/* Cuts the next bucket off the buffers counts[0..n) (elements of any size),
 * starting at *cur: the following elements, in buffer order, up to cap of
 * them or max_pieces pieces, whichever comes first; empty buffers are
 * skipped. Writes the pieces, sets *elems to the bucket's elements, advances
 * *cur and returns the number of pieces; 0 when nothing is left. cap >= 1,
 * max_pieces >= 1. */
int toy_bucket_next(const int64_t *counts, int n, int64_t cap, struct toy_bucket_cursor *cur,
                    struct toy_bucket_piece *pieces, int max_pieces, int64_t *elems);

#ifdef __cplusplus
}
#endif
#endif
