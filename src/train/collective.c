/* collective.c: the implementation-independent half of toy/collective.h:
 * choosing an implementation, the single-process one (world 1, no-ops),
 * bucketing, packing and the 1/world scaling, the two-slot pipeline, and
 * the deadline that turns a dead or hung rank into an error instead of a
 * hang. The transports are behind struct toy_collective_ops
 * (collective-impl.h; MPI in collective-mpi.c).
 *
 * Invariants: every rank cuts the same buckets (the cut depends only on the
 * counts, the bucket size and TOY_BUCKET_MAX_PIECES), so the messages match
 * up; at most TOY_COLLECTIVE_SLOTS operations are in flight and a slot is
 * reused only after it tested complete; after any failure the collective is
 * broken and never starts another operation (MPI's state is unknown).
 */
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "toy/threadpool.h"
#include "train/collective-impl.h"

double toy_coll_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int env_int(const char *const *names, int dflt) {
    for (int i = 0; names[i]; i++) {
        const char *v = getenv(names[i]);
        if (v && *v) return atoi(v);
    }
    return dflt;
}

/* ---- bucketing ------------------------------------------------------------------ */

int toy_bucket_next(const int64_t *counts, int n, int64_t cap, struct toy_bucket_cursor *cur,
                    struct toy_bucket_piece *pieces, int max_pieces, int64_t *elems) {
    int np = 0;
    int64_t got = 0;
    while (cur->buf < n && got < cap && np < max_pieces) {
        int64_t left = counts[cur->buf] - cur->off;
        if (left <= 0) {
            cur->buf++;
            cur->off = 0;
            continue;
        }
        int64_t take = left < cap - got ? left : cap - got;
        pieces[np++] = (struct toy_bucket_piece){cur->buf, cur->off, take};
        got += take;
        cur->off += take;
        if (cur->off == counts[cur->buf]) {
            cur->buf++;
            cur->off = 0;
        }
    }
    *elems = got;
    return np;
}

/* ---- open / close ------------------------------------------------------------- */

static bool launched_by_mpi(int *env_world) {
    static const char *const world_vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", NULL};
    *env_world = env_int(world_vars, 0);
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK");
}

enum toy_status toy_collective_open(enum toy_collective_kind kind, const struct toy_collective_opts *o,
                                    struct toy_collective **out) {
    if (!out) return toy_error(TOY_ERR_INVALID_ARG, "toy_collective_open: out is NULL");
    *out = NULL;
    struct toy_collective_opts d = {0};
    if (!o) o = &d;
    if (o->bucket_bytes && (o->bucket_bytes < 64 || o->bucket_bytes > ((size_t)1 << 30)))
        return toy_error(TOY_ERR_INVALID_ARG, "collective bucket of %zu bytes: must be 64 B .. 1 GiB", o->bucket_bytes);
    int env_world = 0;
    bool launched = launched_by_mpi(&env_world);
    const char *want = getenv("TOY_COLLECTIVE"); /* nccl for GPU ranks (the CLI has no flag for it yet) */
    if (kind == TOY_COLLECTIVE_AUTO && want && *want) {
        if (!strcmp(want, "nccl")) kind = TOY_COLLECTIVE_NCCL;
        else if (!strcmp(want, "mpi")) kind = TOY_COLLECTIVE_MPI;
        else if (!strcmp(want, "local")) kind = TOY_COLLECTIVE_LOCAL;
        else return toy_error(TOY_ERR_INVALID_ARG, "TOY_COLLECTIVE=%s: expected mpi, nccl or local", want);
    }
    if (kind == TOY_COLLECTIVE_AUTO) {
#ifdef TOY_MPI
        kind = launched ? TOY_COLLECTIVE_MPI : TOY_COLLECTIVE_LOCAL;
#else
        if (launched && env_world > 1)
            return toy_error(TOY_ERR_UNSUPPORTED,
                             "started by an MPI launcher with %d ranks, but this toy was built without MPI "
                             "(build it with `make MPI=1`, or run one process)",
                             env_world);
        kind = TOY_COLLECTIVE_LOCAL;
#endif
    }
    struct toy_collective *c = calloc(1, sizeof *c);
    if (!c) return toy_error(TOY_ERR_NOMEM, "collective");
    c->world = 1;
    c->local_size = 1;
    c->bucket_bytes = (o->bucket_bytes ? o->bucket_bytes : TOY_COLLECTIVE_BUCKET_BYTES) & ~(size_t)7;
    c->timeout_s = o->timeout_s == 0 ? TOY_COLLECTIVE_TIMEOUT_S : o->timeout_s;
    enum toy_status st = TOY_OK;
    switch (kind) {
    case TOY_COLLECTIVE_LOCAL:
        break;
    case TOY_COLLECTIVE_MPI:
#ifdef TOY_MPI
        st = toy_collective_mpi_open(c);
#else
        st = toy_error(TOY_ERR_UNSUPPORTED, "this toy was built without MPI (build it with `make MPI=1`)");
#endif
        break;
    case TOY_COLLECTIVE_NCCL:
#ifdef TOY_CUDA
        st = toy_collective_nccl_open(c);
#else
        st = toy_error(TOY_ERR_UNSUPPORTED, "this toy was built without NCCL (build it with `make CUDA=1 MPI=1`)");
#endif
        break;
    default:
        st = toy_error(TOY_ERR_INVALID_ARG, "unknown collective kind %d", (int)kind);
    }
    if (st) {
        free(c);
        return st;
    }
    if (c->ops) {
        static const char *const lr[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID", NULL};
        static const char *const ls[] = {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", NULL};
        c->local_rank = env_int(lr, 0);
        c->local_size = env_int(ls, 1);
        if (c->local_size < 1) c->local_size = 1;
    }
    *out = c;
    return TOY_OK;
}

static void free_stage(struct toy_collective *c) {
    for (int s = 0; s < TOY_COLLECTIVE_SLOTS; s++) {
        if (!c->stage[s]) continue;
        if (c->ops && c->ops->free) c->ops->free(c, c->stage[s]);
        else free(c->stage[s]);
        c->stage[s] = NULL;
    }
}

void toy_collective_abort(struct toy_collective *c, int code) {
    if (c && c->ops && c->ops->abort) c->ops->abort(c, code);
}

void toy_collective_close(struct toy_collective *c) {
    if (!c) return;
    if (c->ops && c->broken) {
        if (c->rank != 0) { /* a live rank 0 checkpoints, then ends the job itself */
            double grace = c->timeout_s >= 0 && c->timeout_s < 30 ? c->timeout_s : 30;
            fprintf(stderr, "toy: %s; giving rank 0 %g s to checkpoint and end the job\n", c->broken_msg, grace);
            nanosleep(&(struct timespec){(time_t)grace, (long)((grace - (double)(time_t)grace) * 1e9)}, NULL);
        }
        fprintf(stderr, "toy: ending the job: %s\n", c->broken_msg);
        c->ops->abort(c, 1);
    }
    free_stage(c);
    if (c->ops && c->ops->finalize) c->ops->finalize(c);
    free(c->bufs);
    free(c->counts);
    free(c->sizes);
    free(c);
}

bool toy_collective_broken(const struct toy_collective *c) { return c && c->broken; }
int toy_collective_rank(const struct toy_collective *c) { return c ? c->rank : 0; }
int toy_collective_world(const struct toy_collective *c) { return c ? c->world : 1; }
int toy_collective_local_rank(const struct toy_collective *c) { return c ? c->local_rank : 0; }
int toy_collective_local_size(const struct toy_collective *c) { return c ? c->local_size : 1; }
const char *toy_collective_name(const struct toy_collective *c) {
    return c && c->ops ? c->ops->name : "local";
}

void toy_collective_get_stats(const struct toy_collective *c, struct toy_collective_stats *s) {
    *s = c->stats;
}

/* ---- the machinery ----------------------------------------------------------------- */

enum toy_status toy_coll_broken_error(struct toy_collective *c) {
    return toy_error(TOY_ERR_IO, "the communicator is broken after an earlier failure: %s", c->broken_msg);
}

enum toy_status toy_coll_fail(struct toy_collective *c, enum toy_status st) {
    c->broken = true;
    snprintf(c->broken_msg, sizeof c->broken_msg, "%s", toy_last_error());
    return st;
}

/* Polls the slot until it completes, fails, or the deadline passes. MPI
 * progresses a non-blocking collective only inside MPI_Test, so for the
 * first 50 ms the loop polls continuously (yielding now and then, for
 * oversubscribed machines); a rank still waiting after that is waiting for
 * a slow or dead peer, and naps (10 us doubling to 200 us) between polls. */
enum toy_status toy_coll_wait(struct toy_collective *c, int slot, const char *what, double t0) {
    double deadline = c->timeout_s >= 0 ? t0 + c->timeout_s : INFINITY, t_wait = toy_coll_now();
    long nap_ns = 0;
    for (unsigned i = 0;; i++) {
        int r = c->ops->test(c, slot);
        if (r > 0) return TOY_OK;
        if (r < 0) {
            char msg[400];
            snprintf(msg, sizeof msg, "%s", toy_last_error());
            return toy_coll_fail(c, toy_error(TOY_ERR_IO, "rank %d of %d: %s failed: %s", c->rank, c->world, what, msg));
        }
        double now = toy_coll_now();
        if (now > deadline)
            return toy_coll_fail(c, toy_error(TOY_ERR_IO,
                                     "rank %d of %d: %s did not complete within %g s: another rank died, "
                                     "hangs or stopped calling it",
                                     c->rank, c->world, what, c->timeout_s));
        if (now - t_wait < 0.05) {
            if ((i & 63) == 63) sched_yield();
            continue;
        }
        nap_ns = nap_ns ? (nap_ns * 2 > 200000 ? 200000 : nap_ns * 2) : 10000;
        nanosleep(&(struct timespec){0, nap_ns}, NULL);
    }
}

enum toy_status toy_coll_ensure_stage(struct toy_collective *c) {
    for (int s = 0; s < TOY_COLLECTIVE_SLOTS; s++) {
        if (c->stage[s]) continue;
        if (c->ops->alloc) c->stage[s] = c->ops->alloc(c, c->bucket_bytes);
        else c->stage[s] = aligned_alloc(64, (c->bucket_bytes + 63) & ~(size_t)63);
        if (!c->stage[s]) return toy_error(TOY_ERR_NOMEM, "collective staging buffer of %zu bytes", c->bucket_bytes);
    }
    return TOY_OK;
}

void toy_coll_copy(struct toy_collective *c, int slot, void *dst, const void *src, size_t n) {
    if (c->ops && c->ops->copy) c->ops->copy(c, slot, dst, src, n);
    else memcpy(dst, src, n);
}

void toy_coll_scale(struct toy_collective *c, int slot, float *x, int64_t n, float s) {
    if (c->ops && c->ops->scale) {
        c->ops->scale(c, slot, x, n, s);
        return;
    }
    for (int64_t i = 0; i < n; i++) x[i] *= s;
}

/* Scales a completed bucket by 1/world and unpacks it. */
static void finish_mean(struct toy_collective *c, int slot, struct toy_bucket_inflight *f, float *const *bufs) {
    float s = 1.0f / (float)c->world;
    if (!f->staged) {
        toy_coll_scale(c, slot, bufs[f->pieces[0].buf] + f->pieces[0].off, f->elems, s);
    } else {
        float *stage = c->stage[slot];
        toy_coll_scale(c, slot, stage, f->elems, s);
        int64_t at = 0;
        for (int i = 0; i < f->n; i++) {
            toy_coll_copy(c, slot, bufs[f->pieces[i].buf] + f->pieces[i].off, stage + at, (size_t)f->pieces[i].count * 4);
            at += f->pieces[i].count;
        }
    }
    f->n = 0;
}

enum toy_status toy_collective_allreduce_mean(struct toy_collective *c, float *const *bufs, const int64_t *counts,
                                              int n) {
    if (!c->ops || c->world == 1) return TOY_OK; /* the mean over one rank */
    if (c->broken) return toy_coll_broken_error(c);
    enum toy_status st = toy_coll_ensure_stage(c);
    if (st) return st;
    double t0 = toy_coll_now();
    int64_t cap = (int64_t)(c->bucket_bytes / sizeof(float)), bytes = 0, buckets = 0;
    struct toy_bucket_cursor cur = {0, 0};
    struct toy_bucket_inflight *fl = c->fl;
    for (int k = 0; k < TOY_COLLECTIVE_SLOTS; k++) fl[k].n = 0;
    int slot = 0, active = -1;
    char what[96];
    for (;;) {
        struct toy_bucket_inflight *f = &fl[slot];
        f->n = toy_bucket_next(counts, n, cap, &cur, f->pieces, TOY_BUCKET_MAX_PIECES, &f->elems);
        if (!f->n) break;
        float *buf;
        f->staged = f->n > 1;
        if (!f->staged) {
            buf = bufs[f->pieces[0].buf] + f->pieces[0].off;
        } else {
            buf = c->stage[slot];
            int64_t at = 0;
            for (int i = 0; i < f->n; i++) {
                toy_coll_copy(c, slot, buf + at, bufs[f->pieces[i].buf] + f->pieces[i].off, (size_t)f->pieces[i].count * 4);
                at += f->pieces[i].count;
            }
        }
        if ((st = c->ops->start_allreduce_f32(c, slot, buf, f->elems))) return toy_coll_fail(c, st);
        bytes += f->elems * 4;
        buckets++;
        if (active >= 0) {
            snprintf(what, sizeof what, "all-reduce of bucket %lld (%lld floats)", (long long)buckets - 1,
                     (long long)fl[active].elems);
            if ((st = toy_coll_wait(c, active, what, t0))) return st;
            finish_mean(c, active, &fl[active], bufs);
        }
        active = slot;
        slot = (slot + 1) % TOY_COLLECTIVE_SLOTS;
    }
    if (active >= 0) {
        snprintf(what, sizeof what, "all-reduce of bucket %lld (%lld floats)", (long long)buckets,
                 (long long)fl[active].elems);
        if ((st = toy_coll_wait(c, active, what, t0))) return st;
        finish_mean(c, active, &fl[active], bufs);
    }
    c->stats.calls++;
    c->stats.buckets += buckets;
    c->stats.bytes += bytes;
    c->stats.seconds += toy_coll_now() - t0;
    return TOY_OK;
}

enum toy_status toy_collective_allreduce_sum_f64(struct toy_collective *c, double *v, int n) {
    if (!c->ops || c->world == 1 || n <= 0) return TOY_OK;
    if (c->broken) return toy_coll_broken_error(c);
    double t0 = toy_coll_now();
    enum toy_status st = c->ops->start_allreduce_f64(c, 0, v, n);
    if (st) return toy_coll_fail(c, st);
    if ((st = toy_coll_wait(c, 0, "all-reduce of the step's scalars", t0))) return st;
    c->stats.calls++;
    c->stats.buckets++;
    c->stats.bytes += (int64_t)n * 8;
    c->stats.seconds += toy_coll_now() - t0;
    return TOY_OK;
}

enum toy_status toy_collective_broadcast(struct toy_collective *c, void *const *bufs, const size_t *bytes, int n,
                                         int root) {
    if (!c->ops || c->world == 1) return TOY_OK;
    if (c->broken) return toy_coll_broken_error(c);
    if (root < 0 || root >= c->world)
        return toy_error(TOY_ERR_INVALID_ARG, "broadcast from rank %d of %d", root, c->world);
    enum toy_status st = toy_coll_ensure_stage(c);
    if (st) return st;
    int64_t *counts = malloc((size_t)(n > 0 ? n : 1) * sizeof *counts);
    if (!counts) return toy_error(TOY_ERR_NOMEM, "broadcast");
    for (int i = 0; i < n; i++) counts[i] = (int64_t)bytes[i];
    double t0 = toy_coll_now();
    struct toy_bucket_cursor cur = {0, 0};
    struct toy_bucket_inflight *f = &c->fl[0];
    int64_t total = 0, buckets = 0;
    char what[96];
    while ((f->n = toy_bucket_next(counts, n, (int64_t)c->bucket_bytes, &cur, f->pieces, TOY_BUCKET_MAX_PIECES,
                                   &f->elems))) {
        char *stage = c->stage[0];
        bool staged = f->n > 1;
        char *buf = staged ? stage : (char *)bufs[f->pieces[0].buf] + f->pieces[0].off;
        if (staged && c->rank == root)
            for (int i = 0, at = 0; i < f->n; at += (int)f->pieces[i].count, i++)
                toy_coll_copy(c, 0, stage + at, (char *)bufs[f->pieces[i].buf] + f->pieces[i].off, (size_t)f->pieces[i].count);
        if ((st = c->ops->start_bcast(c, 0, buf, (size_t)f->elems, root))) {
            st = toy_coll_fail(c, st);
            break;
        }
        snprintf(what, sizeof what, "broadcast of bucket %lld (%lld bytes) from rank %d", (long long)buckets + 1,
                 (long long)f->elems, root);
        if ((st = toy_coll_wait(c, 0, what, t0))) break;
        if (staged && c->rank != root)
            for (int i = 0, at = 0; i < f->n; at += (int)f->pieces[i].count, i++)
                toy_coll_copy(c, 0, (char *)bufs[f->pieces[i].buf] + f->pieces[i].off, stage + at, (size_t)f->pieces[i].count);
        total += f->elems;
        buckets++;
    }
    free(counts);
    if (st) return st;
    c->stats.calls++;
    c->stats.buckets += buckets;
    c->stats.bytes += total;
    c->stats.seconds += toy_coll_now() - t0;
    return TOY_OK;
}

enum toy_status toy_collective_barrier(struct toy_collective *c) {
    if (!c->ops || c->world == 1) return TOY_OK;
    if (c->broken) return toy_coll_broken_error(c);
    double t0 = toy_coll_now();
    enum toy_status st = c->ops->start_barrier(c, 0);
    if (st) return toy_coll_fail(c, st);
    if ((st = toy_coll_wait(c, 0, "barrier", t0))) return st;
    c->stats.calls++;
    c->stats.seconds += toy_coll_now() - t0;
    return TOY_OK;
}

/* ---- adapters ---------------------------------------------------------------------- */

static enum toy_status grow_lists(struct toy_collective *c, int n) {
    if (n <= c->list_cap) return TOY_OK;
    float **b = realloc(c->bufs, (size_t)n * sizeof *b);
    if (b) c->bufs = b;
    int64_t *k = realloc(c->counts, (size_t)n * sizeof *k);
    if (k) c->counts = k;
    size_t *z = realloc(c->sizes, (size_t)n * sizeof *z);
    if (z) c->sizes = z;
    if (!b || !k || !z) return toy_error(TOY_ERR_NOMEM, "collective lists of %d", n);
    c->list_cap = n;
    return TOY_OK;
}

enum toy_status toy_collective_allreduce_grads(void *ud, struct toy_tensor *const *params, int n_params) {
    struct toy_collective *c = ud;
    if (!c->ops || c->world == 1) return TOY_OK;
    enum toy_status st = grow_lists(c, n_params);
    if (st) return st;
    for (int i = 0; i < n_params; i++) {
        const struct toy_tensor *g = params[i]->grad;
        if (g && g->type != TOY_F32)
            return toy_error(TOY_ERR_UNSUPPORTED, "all-reduce of %s: gradient is %s, only f32 is supported",
                             params[i]->name, toy_dtype_name(g->type));
        c->bufs[i] = g ? g->data : NULL;
        c->counts[i] = g ? toy_nelements(params[i]) : 0;
    }
    return toy_collective_allreduce_mean(c, c->bufs, c->counts, n_params);
}

enum toy_status toy_reduce_agree(enum toy_status (*sum)(void *ud, double *v, int n), void *ud, int rank, uint64_t h,
                                 int *differ, bool *self) {
    if (!differ || !self)
        return toy_error(TOY_ERR_INVALID_ARG, "toy_reduce_agree: %s is NULL", differ ? "self" : "differ");
    *differ = 0;
    *self = false;
    double v[4]; /* rank 0's h in 16-bit pieces (exact in doubles): the sum is rank 0's alone */
    for (int k = 0; k < 4; k++) v[k] = rank == 0 ? (double)((h >> (16 * k)) & 0xffff) : 0;
    enum toy_status st = sum(ud, v, 4);
    if (st) return st;
    for (int k = 0; k < 4; k++) *self = *self || v[k] != (double)((h >> (16 * k)) & 0xffff);
    double bad = *self;
    if ((st = sum(ud, &bad, 1))) return st;
    *differ = (int)bad;
    return TOY_OK;
}

enum toy_status toy_collective_agree(struct toy_collective *c, uint64_t h, int *differ, bool *self) {
    if (!differ || !self)
        return toy_error(TOY_ERR_INVALID_ARG, "toy_collective_agree: %s is NULL", differ ? "self" : "differ");
    *differ = 0;
    *self = false;
    if (!c->ops || c->world == 1) return TOY_OK;
    return toy_reduce_agree(toy_collective_reduce_sum, c, c->rank, h, differ, self);
}

enum toy_status toy_collective_reduce_sum(void *ud, double *v, int n) {
    return toy_collective_allreduce_sum_f64(ud, v, n);
}

enum toy_status toy_collective_broadcast_tensors(struct toy_collective *c, struct toy_tensor *const *t, int n,
                                                 int root) {
    if (!c->ops || c->world == 1) return TOY_OK;
    enum toy_status st = grow_lists(c, n);
    if (st) return st;
    void **ptrs = malloc((size_t)(n > 0 ? n : 1) * sizeof *ptrs);
    if (!ptrs) return toy_error(TOY_ERR_NOMEM, "broadcast");
    for (int i = 0; i < n; i++) {
        if (!toy_is_contiguous(t[i]) || !t[i]->data) {
            free(ptrs);
            return toy_error(TOY_ERR_INVALID_ARG, "broadcast of %s: needs a contiguous tensor with data", t[i]->name);
        }
        ptrs[i] = t[i]->data;
        c->sizes[i] = toy_nbytes(t[i]);
    }
    st = toy_collective_broadcast(c, ptrs, c->sizes, n, root);
    free(ptrs);
    return st;
}

int toy_collective_threads(const struct toy_collective *c) {
    int cores = toy_num_cores(), local = toy_collective_local_size(c), share = cores / (local > 0 ? local : 1);
    cpu_set_t set;
    if (!sched_getaffinity(0, sizeof set, &set) && CPU_COUNT(&set) < cores) share = CPU_COUNT(&set);
    return share > 1 ? share : 1;
}
