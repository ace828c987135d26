/* collective-mpi.c: the MPI transport of toy/collective.h (built with
 * `make MPI=1`, which defines TOY_MPI; without it this file is empty).
 *
 * Every operation is non-blocking (MPI_Iallreduce, MPI_Ibcast,
 * MPI_Ibarrier, and for ZeRO-1 MPI_Ireduce_scatter and an in-place
 * MPI_Iallgatherv; MPI-3, Open MPI >= 1.7) on a duplicate of MPI_COMM_WORLD
 * whose error handler returns codes instead of aborting, so that the
 * generic layer can poll it with MPI_Test against a deadline and report a
 * dead or hung rank itself. Open MPI makes progress on non-blocking
 * collectives inside MPI_Test, which the generic layer calls in its wait
 * loop, and which toy_grad_sync's node callback calls between the nodes of
 * the backward pass (that is what lets buckets travel during it, without a
 * communication thread). MPI is initialized with MPI_THREAD_FUNNELED: only
 * the thread that opened the collective calls MPI (the compute threads,
 * and the callback runs on the calling thread, never do).
 */
#ifdef TOY_MPI
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#include "train/collective-impl.h"

struct mpi_state {
    MPI_Comm comm;
    MPI_Request req[TOY_COLLECTIVE_SLOTS];
    bool we_initialized;
};

static enum toy_status mpi_err(int rc, const char *what) {
    char s[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, s, &len) != MPI_SUCCESS) snprintf(s, sizeof s, "MPI error %d", rc);
    return toy_error(TOY_ERR_IO, "%s: %s", what, s);
}

static struct mpi_state *st_of(struct toy_collective *c) { return c->impl; }

static enum toy_status start_allreduce_f32(struct toy_collective *c, int slot, float *buf, int64_t n) {
    struct mpi_state *m = st_of(c);
    int rc = MPI_Iallreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, m->comm, &m->req[slot]);
    return rc == MPI_SUCCESS ? TOY_OK : mpi_err(rc, "MPI_Iallreduce");
}

static enum toy_status start_allreduce_f64(struct toy_collective *c, int slot, double *buf, int64_t n) {
    struct mpi_state *m = st_of(c);
    int rc = MPI_Iallreduce(MPI_IN_PLACE, buf, (int)n, MPI_DOUBLE, MPI_SUM, m->comm, &m->req[slot]);
    return rc == MPI_SUCCESS ? TOY_OK : mpi_err(rc, "MPI_Iallreduce");
}

static enum toy_status start_bcast(struct toy_collective *c, int slot, void *buf, size_t bytes, int root) {
    struct mpi_state *m = st_of(c);
    int rc = MPI_Ibcast(buf, (int)bytes, MPI_BYTE, root, m->comm, &m->req[slot]);
    return rc == MPI_SUCCESS ? TOY_OK : mpi_err(rc, "MPI_Ibcast");
}

static enum toy_status start_barrier(struct toy_collective *c, int slot) {
    struct mpi_state *m = st_of(c);
    int rc = MPI_Ibarrier(m->comm, &m->req[slot]);
    return rc == MPI_SUCCESS ? TOY_OK : mpi_err(rc, "MPI_Ibarrier");
}

/* ZeRO-1 */
static enum toy_status start_reduce_scatter_f32(struct toy_collective *c, int slot, const float *send, float *recv,
                                                const int *counts) {
    struct mpi_state *m = st_of(c);
    int rc = MPI_Ireduce_scatter(send, recv, counts, MPI_FLOAT, MPI_SUM, m->comm, &m->req[slot]);
    return rc == MPI_SUCCESS ? TOY_OK : mpi_err(rc, "MPI_Ireduce_scatter");
}

static enum toy_status start_allgather_f32(struct toy_collective *c, int slot, float *buf, const int *counts,
                                           const int *displs) {
    struct mpi_state *m = st_of(c);
    int rc = MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, counts, displs, MPI_FLOAT, m->comm, &m->req[slot]);
    return rc == MPI_SUCCESS ? TOY_OK : mpi_err(rc, "MPI_Iallgatherv");
}

static int test(struct toy_collective *c, int slot) {
    struct mpi_state *m = st_of(c);
    int done = 0;
    int rc = MPI_Test(&m->req[slot], &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) {
        mpi_err(rc, "MPI_Test");
        return -1;
    }
    return done ? 1 : 0;
}

static void mpi_abort(struct toy_collective *c, int code) {
    fflush(stdout);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, code);
}

static void finalize(struct toy_collective *c) {
    struct mpi_state *m = st_of(c);
    /* a barrier with the deadline first: MPI_Finalize itself has none */
    if (toy_collective_barrier(c) != TOY_OK) {
        fprintf(stderr, "toy: ending the job: %s\n", toy_last_error());
        mpi_abort(c, 1);
    }
    MPI_Comm_free(&m->comm);
    if (m->we_initialized) MPI_Finalize();
    free(m);
    c->impl = NULL;
}

static const struct toy_collective_ops mpi_ops = {
    .name = "mpi",
    .start_allreduce_f32 = start_allreduce_f32,
    .start_allreduce_f64 = start_allreduce_f64,
    .start_bcast = start_bcast,
    .start_barrier = start_barrier,
    .test = test,
    .abort = mpi_abort,
    .finalize = finalize,
    .start_reduce_scatter_f32 = start_reduce_scatter_f32,
    .start_allgather_f32 = start_allgather_f32,
};

enum toy_status toy_collective_mpi_open(struct toy_collective *c) {
    struct mpi_state *m = calloc(1, sizeof *m);
    if (!m) return toy_error(TOY_ERR_NOMEM, "MPI state");
    int inited = 0, rc;
    MPI_Initialized(&inited);
    if (!inited) {
        int provided;
        if ((rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided)) != MPI_SUCCESS) {
            free(m);
            return mpi_err(rc, "MPI_Init_thread");
        }
        m->we_initialized = true;
    }
    if ((rc = MPI_Comm_dup(MPI_COMM_WORLD, &m->comm)) != MPI_SUCCESS) {
        free(m);
        return mpi_err(rc, "MPI_Comm_dup");
    }
    MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN);
    for (int s = 0; s < TOY_COLLECTIVE_SLOTS; s++) m->req[s] = MPI_REQUEST_NULL;
    MPI_Comm_rank(m->comm, &c->rank);
    MPI_Comm_size(m->comm, &c->world);
    c->impl = m;
    c->ops = &mpi_ops;
    return TOY_OK;
}
#else
/* ISO C wants a translation unit to declare something. */
typedef int toy_collective_mpi_not_built;
#endif
