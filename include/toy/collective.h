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
 *   nccl   one rank per GPU, for the CUDA backend (not built yet: the
 *          interface point is src/train/collective-impl.h).
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
    TOY_COLLECTIVE_AUTO = 0, /* mpi when launched by mpirun/srun in an MPI build, else local */
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

/* Adapters with the trainer's hook signatures (toy/trainer.h), ud = the
 * collective: the mean of each tensor's f32 gradient (p->grad->data,
 * toy_nelements(p) floats), and the sum of a vector of doubles. */
enum toy_status toy_collective_allreduce_grads(void *c, struct toy_tensor *const *params, int n_params);
enum toy_status toy_collective_reduce_sum(void *c, double *v, int n);

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
