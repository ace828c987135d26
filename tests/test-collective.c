/* test-collective.c: the collective layer (src/train/collective.c) and the
 * trainer's data-parallel hooks, in the default (MPI-less) build:
 *  - bucketing: every element of every buffer lands in exactly one bucket,
 *    in order, no bucket passes its element or piece limit (exhaustive over
 *    small cases, then random ones);
 *  - the single-process implementation: world 1, every call leaves the data
 *    as it was; AUTO under an MPI launcher without MPI built in is a clear
 *    error; MPI/NCCL not built in are TOY_ERR_UNSUPPORTED;
 *  - the generic machinery over a fake 2-rank transport (the "other rank"
 *    holds the same values, so the mean must give them back): packing,
 *    the two-slot pipeline, the 1/world scaling, broadcast, and a transport
 *    that never completes: a TOY_ERR_IO naming the timeout, after which the
 *    collective is broken and close ends the job through ops->abort (on a
 *    rank other than 0 after a grace for rank 0's checkpoint);
 *  - the trainer with the hooks: identity hooks change no loss; a collective
 *    failing at step k ends the run "errored" with a checkpoint of step k-1
 *    whose resume reproduces the uninterrupted run bit for bit; ranks whose
 *    weights differ from rank 0's are caught before the checkpoint.
 * The 2-process checks (2 ranks x B = 1 rank x 2B, a killed rank) are
 * tests/mpi/test-dp.sh, run by .ci/run on the MPI build. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "toy/collective.h"
#include "toy/graph.h"
#include "toy/model.h"
#include "toy/rng.h"
#include "toy/run-dir.h"
#include "toy/toy.h"
#include "toy/trainer.h"
#include "train/collective-impl.h"

/* ---- bucketing ---------------------------------------------------------------- */

/* Cuts all buckets and checks coverage, order and limits; returns the count. */
static int64_t check_buckets(const int64_t *counts, int n, int64_t cap, int max_pieces) {
    int64_t total = 0;
    for (int i = 0; i < n; i++) total += counts[i];
    struct toy_bucket_cursor cur = {0, 0};
    struct toy_bucket_piece pieces[TOY_BUCKET_MAX_PIECES];
    int expect_buf = 0;
    int64_t expect_off = 0, seen = 0, buckets = 0, elems;
    int np;
    while ((np = toy_bucket_next(counts, n, cap, &cur, pieces, max_pieces, &elems)) > 0) {
        cr_assert_leq(np, max_pieces);
        cr_assert_leq(elems, cap);
        cr_assert_gt(elems, 0);
        int64_t sum = 0;
        for (int p = 0; p < np; p++) {
            while (expect_buf < n && expect_off == counts[expect_buf]) expect_buf++, expect_off = 0;
            cr_assert_eq(pieces[p].buf, expect_buf, "bucket %lld piece %d: buffer %d, expected %d", (long long)buckets,
                         p, pieces[p].buf, expect_buf);
            cr_assert_eq(pieces[p].off, expect_off);
            cr_assert_gt(pieces[p].count, 0);
            cr_assert_leq(pieces[p].off + pieces[p].count, counts[pieces[p].buf]);
            expect_off += pieces[p].count;
            sum += pieces[p].count;
        }
        cr_assert_eq(sum, elems);
        /* a bucket ends early only at the piece limit or the very end */
        if (elems < cap) cr_assert(np == max_pieces || seen + elems == total);
        seen += elems;
        buckets++;
    }
    cr_assert_eq(seen, total, "covered %lld of %lld elements", (long long)seen, (long long)total);
    return buckets;
}

Test(collective, buckets_pack_small_and_split_large) {
    const int64_t counts[] = {0, 5, 3, 0, 10, 1};
    struct toy_bucket_cursor cur = {0, 0};
    struct toy_bucket_piece p[8];
    int64_t elems;
    /* cap 4: [1:0+4] [1:4+1, 2:0+3] [4:0+4] [4:4+4] [4:8+2, 5:0+1] */
    cr_assert_eq(toy_bucket_next(counts, 6, 4, &cur, p, 8, &elems), 1);
    cr_assert(p[0].buf == 1 && p[0].off == 0 && p[0].count == 4 && elems == 4);
    cr_assert_eq(toy_bucket_next(counts, 6, 4, &cur, p, 8, &elems), 2);
    cr_assert(p[0].buf == 1 && p[0].off == 4 && p[0].count == 1);
    cr_assert(p[1].buf == 2 && p[1].off == 0 && p[1].count == 3 && elems == 4);
    cr_assert_eq(toy_bucket_next(counts, 6, 4, &cur, p, 8, &elems), 1);
    cr_assert(p[0].buf == 4 && p[0].off == 0 && p[0].count == 4);
    cr_assert_eq(toy_bucket_next(counts, 6, 4, &cur, p, 8, &elems), 1);
    cr_assert(p[0].buf == 4 && p[0].off == 4 && p[0].count == 4);
    cr_assert_eq(toy_bucket_next(counts, 6, 4, &cur, p, 8, &elems), 2);
    cr_assert(p[0].buf == 4 && p[0].off == 8 && p[0].count == 2);
    cr_assert(p[1].buf == 5 && p[1].off == 0 && p[1].count == 1 && elems == 3);
    cr_assert_eq(toy_bucket_next(counts, 6, 4, &cur, p, 8, &elems), 0);
    cr_assert_eq(elems, 0);
    /* one big bucket holds everything; the piece limit cuts it */
    cr_assert_eq(check_buckets(counts, 6, 1000, 8), 1);
    cr_assert_eq(check_buckets(counts, 6, 1000, 2), 2);
    cr_assert_eq(check_buckets(counts, 6, 1000, 1), 4);
    /* nothing to send */
    cr_assert_eq(check_buckets(counts, 0, 4, 8), 0);
    const int64_t zeros[] = {0, 0, 0};
    cr_assert_eq(check_buckets(zeros, 3, 4, 8), 0);
}

Test(collective, buckets_random_layouts) {
    struct toy_rng r;
    toy_rng_seed(&r, 11);
    int64_t counts[64];
    for (int trial = 0; trial < 2000; trial++) {
        int n = (int)toy_rng_below(&r, 64);
        for (int i = 0; i < n; i++)
            counts[i] = toy_rng_below(&r, 4) == 0 ? 0 : (int64_t)toy_rng_below(&r, toy_rng_below(&r, 2) ? 10 : 5000);
        int64_t cap = 1 + (int64_t)toy_rng_below(&r, 3000);
        int max_pieces = 1 + (int)toy_rng_below(&r, TOY_BUCKET_MAX_PIECES);
        check_buckets(counts, n, cap, max_pieces);
    }
}

/* ---- the single-process implementation ---------------------------------------- */

Test(collective, local_is_world_one_and_changes_nothing) {
    struct toy_collective *c;
    cr_assert_eq(toy_collective_open(TOY_COLLECTIVE_LOCAL, NULL, &c), TOY_OK, "%s", toy_last_error());
    cr_assert_eq(toy_collective_rank(c), 0);
    cr_assert_eq(toy_collective_world(c), 1);
    cr_assert_eq(toy_collective_local_size(c), 1);
    cr_assert_str_eq(toy_collective_name(c), "local");
    float a[5] = {1, -2, 3.5f, 1e-30f, NAN}, b[3] = {7, 8, 9};
    float *bufs[2] = {a, b};
    int64_t counts[2] = {5, 3};
    cr_assert_eq(toy_collective_allreduce_mean(c, bufs, counts, 2), TOY_OK);
    cr_assert(a[0] == 1 && a[1] == -2 && a[2] == 3.5f && a[3] == 1e-30f && isnan(a[4]) && b[2] == 9);
    double v[2] = {0.25, 3};
    cr_assert_eq(toy_collective_allreduce_sum_f64(c, v, 2), TOY_OK);
    cr_assert(v[0] == 0.25 && v[1] == 3);
    void *pb[1] = {b};
    size_t nb[1] = {sizeof b};
    cr_assert_eq(toy_collective_broadcast(c, pb, nb, 1, 0), TOY_OK);
    cr_assert_eq(b[0], 7);
    cr_assert_eq(toy_collective_barrier(c), TOY_OK);
    toy_collective_abort(c, 1); /* returns with one process */
    struct toy_collective_stats s;
    toy_collective_get_stats(c, &s);
    cr_assert_eq(s.calls, 0);
    toy_collective_close(c);
    toy_collective_close(NULL);
}

Test(collective, auto_and_unbuilt_kinds) {
    struct toy_collective *c;
#ifndef TOY_MPI
    unsetenv("OMPI_COMM_WORLD_SIZE");
    unsetenv("PMI_SIZE");
    unsetenv("PMIX_RANK");
    cr_assert_eq(toy_collective_open(TOY_COLLECTIVE_AUTO, NULL, &c), TOY_OK);
    cr_assert_str_eq(toy_collective_name(c), "local");
    toy_collective_close(c);
    /* mpirun -np 2 of a build without MPI: two independent runs would follow */
    setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
    cr_assert_eq(toy_collective_open(TOY_COLLECTIVE_AUTO, NULL, &c), TOY_ERR_UNSUPPORTED);
    cr_assert(strstr(toy_last_error(), "make MPI=1"), "%s", toy_last_error());
    cr_assert_null(c);
    setenv("OMPI_COMM_WORLD_SIZE", "1", 1); /* mpirun -np 1 is just one process */
    cr_assert_eq(toy_collective_open(TOY_COLLECTIVE_AUTO, NULL, &c), TOY_OK);
    toy_collective_close(c);
    unsetenv("OMPI_COMM_WORLD_SIZE");
    cr_assert_eq(toy_collective_open(TOY_COLLECTIVE_MPI, NULL, &c), TOY_ERR_UNSUPPORTED);
    cr_assert(strstr(toy_last_error(), "MPI"), "%s", toy_last_error());
#endif
#ifndef TOY_CUDA /* a CUDA build has NCCL (collective-nccl.c) */
    cr_assert_eq(toy_collective_open(TOY_COLLECTIVE_NCCL, NULL, &c), TOY_ERR_UNSUPPORTED);
    cr_assert(strstr(toy_last_error(), "NCCL"), "%s", toy_last_error());
    setenv("TOY_COLLECTIVE", "nccl", 1); /* AUTO chooses what the environment says */
    cr_assert_eq(toy_collective_open(TOY_COLLECTIVE_AUTO, NULL, &c), TOY_ERR_UNSUPPORTED);
    unsetenv("TOY_COLLECTIVE");
#endif
    setenv("TOY_COLLECTIVE", "carrier-pigeon", 1);
    cr_assert_eq(toy_collective_open(TOY_COLLECTIVE_AUTO, NULL, &c), TOY_ERR_INVALID_ARG);
    unsetenv("TOY_COLLECTIVE");
    cr_assert_eq(toy_collective_open(TOY_COLLECTIVE_LOCAL, &(struct toy_collective_opts){.bucket_bytes = 8}, &c),
                 TOY_ERR_INVALID_ARG);
}

/* ---- the generic machinery over a fake two-rank transport --------------------- */

/* The other rank holds the same data: a sum doubles every element, a
 * broadcast from rank 1 writes 0x5a bytes. Operations complete on the
 * second test() call, so the pipeline really has two in flight. */
struct fake {
    void *buf[TOY_COLLECTIVE_SLOTS];
    int64_t n[TOY_COLLECTIVE_SLOTS];
    int kind[TOY_COLLECTIVE_SLOTS]; /* 0 idle, 1 f32, 2 f64, 3 bcast, 4 barrier */
    int polls[TOY_COLLECTIVE_SLOTS];
    int root[TOY_COLLECTIVE_SLOTS];
    int max_in_flight, started, violations, aborted, finalized;
    int64_t max_elems;
    bool hang; /* never complete */
    bool replica; /* f64 sums of 1 or 4 values (the replica check) get nothing from the others */
    const float *send[TOY_COLLECTIVE_SLOTS]; /* reduce-scatter */
    int64_t skip[TOY_COLLECTIVE_SLOTS];
};

static struct fake *fk(struct toy_collective *c) { return c->impl; }

static void begin(struct toy_collective *c, int slot, int kind, void *buf, int64_t n) {
    struct fake *f = fk(c);
    if (f->kind[slot]) f->violations++;
    f->kind[slot] = kind, f->buf[slot] = buf, f->n[slot] = n, f->polls[slot] = 0;
    f->started++;
    if (n > f->max_elems) f->max_elems = n;
    int live = 0;
    for (int s = 0; s < TOY_COLLECTIVE_SLOTS; s++) live += f->kind[s] != 0;
    if (live > f->max_in_flight) f->max_in_flight = live;
}
static enum toy_status f_ar32(struct toy_collective *c, int slot, float *b, int64_t n) {
    begin(c, slot, 1, b, n);
    return TOY_OK;
}
static enum toy_status f_ar64(struct toy_collective *c, int slot, double *b, int64_t n) {
    begin(c, slot, 2, b, n);
    return TOY_OK;
}
static enum toy_status f_bcast(struct toy_collective *c, int slot, void *b, size_t n, int root) {
    begin(c, slot, 3, b, (int64_t)n);
    fk(c)->root[slot] = root;
    return TOY_OK;
}
static enum toy_status f_barrier(struct toy_collective *c, int slot) {
    begin(c, slot, 4, NULL, 0);
    return TOY_OK;
}
/* ZeRO-1: the other rank holds the same gradients (this rank's part of
 * the sum is twice its own) and the same parameters (an all-gather leaves
 * the buffer as it is). */
static enum toy_status f_rs(struct toy_collective *c, int slot, const float *send, float *recv, const int *counts) {
    int64_t skip = 0;
    for (int r = 0; r < c->rank; r++) skip += counts[r];
    begin(c, slot, 5, recv, counts[c->rank]);
    fk(c)->send[slot] = send;
    fk(c)->skip[slot] = skip;
    return TOY_OK;
}
static enum toy_status f_ag(struct toy_collective *c, int slot, float *buf, const int *counts, const int *displs) {
    begin(c, slot, 6, buf, 0);
    return TOY_OK;
}
static int f_test(struct toy_collective *c, int slot) {
    struct fake *f = fk(c);
    if (!f->kind[slot]) { f->violations++; return -1; }
    if (f->hang || ++f->polls[slot] < 2) return 0;
    if (f->kind[slot] == 1)
        for (int64_t i = 0; i < f->n[slot]; i++) ((float *)f->buf[slot])[i] *= (float)c->world;
    if (f->kind[slot] == 2 && !(f->replica && (f->n[slot] == 1 || f->n[slot] == 4)))
        for (int64_t i = 0; i < f->n[slot]; i++) ((double *)f->buf[slot])[i] *= c->world;
    if (f->kind[slot] == 5)
        for (int64_t i = 0; i < f->n[slot]; i++) ((float *)f->buf[slot])[i] = 2 * f->send[slot][f->skip[slot] + i];
    if (f->kind[slot] == 3 && f->root[slot] != c->rank) memset(f->buf[slot], 0x5a, (size_t)f->n[slot]);
    f->kind[slot] = 0;
    return 1;
}
static void f_abort(struct toy_collective *c, int code) { fk(c)->aborted = code; }
static void f_finalize(struct toy_collective *c) { fk(c)->finalized = 1; }

static const struct toy_collective_ops fake_ops = {"fake", f_ar32, f_ar64, f_bcast, f_barrier, f_test,
                                                   f_abort, f_finalize, NULL, NULL, NULL, NULL, f_rs, f_ag};

static struct toy_collective *fake_open(struct fake *f, size_t bucket_bytes, double timeout_s) {
    struct toy_collective *c;
    cr_assert_eq(toy_collective_open(TOY_COLLECTIVE_LOCAL,
                                     &(struct toy_collective_opts){.bucket_bytes = bucket_bytes, .timeout_s = timeout_s},
                                     &c), TOY_OK);
    c->ops = &fake_ops;
    c->impl = f;
    c->rank = 0;
    c->world = 2;
    return c;
}

Test(collective, mean_over_a_fake_second_rank_gives_the_values_back) {
    struct fake f = {0};
    struct toy_collective *c = fake_open(&f, 64, 0); /* 16 floats a bucket */
    enum { N = 7 };
    int64_t counts[N] = {3, 0, 40, 1, 1, 16, 5};
    float *bufs[N], *want[N];
    struct toy_rng r;
    toy_rng_seed(&r, 3);
    for (int i = 0; i < N; i++) {
        bufs[i] = malloc(sizeof(float) * (size_t)(counts[i] + 1));
        want[i] = malloc(sizeof(float) * (size_t)(counts[i] + 1));
        for (int64_t k = 0; k <= counts[i]; k++) want[i][k] = bufs[i][k] = toy_rng_normal(&r);
    }
    cr_assert_eq(toy_collective_allreduce_mean(c, bufs, counts, N), TOY_OK, "%s", toy_last_error());
    for (int i = 0; i < N; i++)
        for (int64_t k = 0; k <= counts[i]; k++) /* x*2*0.5 is exact; the guard element is untouched */
            cr_assert_eq(bufs[i][k], want[i][k], "buffer %d element %lld", i, (long long)k);
    cr_assert_eq(f.violations, 0);
    cr_assert_eq(f.max_in_flight, 2, "the pipeline keeps two buckets in flight");
    cr_assert_eq(f.max_elems, 16);
    struct toy_collective_stats s;
    toy_collective_get_stats(c, &s);
    cr_assert_eq(s.bytes, 66 * 4);
    cr_assert_eq(s.buckets, 5); /* ceil(66 / 16) */
    /* scalars and a broadcast from the other rank (packed: several pieces) */
    double v[3] = {1, 2.5, -3};
    cr_assert_eq(toy_collective_allreduce_sum_f64(c, v, 3), TOY_OK);
    cr_assert(v[0] == 2 && v[1] == 5 && v[2] == -6);
    unsigned char x[10] = {0}, y[100] = {0};
    void *pb[2] = {x, y};
    size_t nb[2] = {sizeof x, sizeof y};
    cr_assert_eq(toy_collective_broadcast(c, pb, nb, 2, 1), TOY_OK);
    for (int i = 0; i < 10; i++) cr_assert_eq(x[i], 0x5a);
    for (int i = 0; i < 100; i++) cr_assert_eq(y[i], 0x5a);
    memset(x, 1, sizeof x);
    cr_assert_eq(toy_collective_broadcast(c, pb, nb, 2, 0), TOY_OK); /* this rank is the root: unchanged */
    cr_assert_eq(x[9], 1);
    cr_assert_eq(toy_collective_barrier(c), TOY_OK);
    cr_assert_eq(f.violations, 0);
    toy_collective_close(c);
    cr_assert_eq(f.finalized, 1);
    cr_assert_eq(f.aborted, 0);
    for (int i = 0; i < N; i++) free(bufs[i]), free(want[i]);
}

Test(collective, a_peer_that_never_answers_is_a_timeout_not_a_hang, .timeout = 30) {
    struct fake f = {.hang = true};
    struct toy_collective *c = fake_open(&f, 0, 0.3);
    float a[100] = {0};
    float *bufs[1] = {a};
    int64_t counts[1] = {100};
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    cr_assert_eq(toy_collective_allreduce_mean(c, bufs, counts, 1), TOY_ERR_IO);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
    cr_assert(s >= 0.3 && s < 5, "gave up after %.2f s", s);
    cr_assert(strstr(toy_last_error(), "did not complete within"), "%s", toy_last_error());
    cr_assert(strstr(toy_last_error(), "rank 0 of 2"), "%s", toy_last_error());
    /* broken: everything fails at once, and close ends the job */
    f.hang = false;
    cr_assert_eq(toy_collective_barrier(c), TOY_ERR_IO);
    cr_assert(strstr(toy_last_error(), "broken"), "%s", toy_last_error());
    cr_assert_eq(f.started, 1);
    cr_assert(toy_collective_broken(c));
    toy_collective_close(c);
    cr_assert_eq(f.aborted, 1);
    /* on another rank, close first gives rank 0 (which checkpoints) the grace of min(timeout, 30 s) */
    struct fake g = {.hang = true};
    c = fake_open(&g, 0, 0.3);
    c->rank = 1;
    cr_assert_eq(toy_collective_barrier(c), TOY_ERR_IO);
    cr_assert(strstr(toy_last_error(), "rank 1 of 2: barrier did not complete within 0.3 s"), "%s", toy_last_error());
    clock_gettime(CLOCK_MONOTONIC, &t0);
    toy_collective_close(c);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    s = (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
    cr_assert(s >= 0.29 && s < 5, "closed after %.2f s", s);
    cr_assert_eq(g.aborted, 1);
}

/* ---- the trainer's hooks -------------------------------------------------------- */

static struct toy_data *make_data(void) {
    static int32_t ids[12000];
    struct toy_rng r;
    toy_rng_seed(&r, 5);
    for (int i = 0; i < 12000; i++) ids[i] = toy_rng_below(&r, 8) == 0 ? (int32_t)toy_rng_below(&r, 40) : (i * 7) % 40;
    struct toy_data_opts o = {.batch = 4, .ctx = 16, .heldout = 0.1, .seed = 3};
    struct toy_data *d;
    cr_assert_eq(toy_data_from_ids(ids, 12000, 40, &o, &d), TOY_OK, "%s", toy_last_error());
    return d;
}

static struct toy_llama *small_model(void) {
    struct toy_llama_config c = toy_llama_preset("tiny");
    c.vocab = 40;
    c.max_ctx = 16;
    struct toy_llama *m = toy_llama_new(&c, 4);
    cr_assert(m);
    return m;
}

struct hooks {
    int calls, fail_at; /* the all-reduce of step fail_at fails (0: never) */
    int reduces;
    bool diverge;       /* "rank 0" sends another weight hash */
    float loss[32];
};

static enum toy_status h_allreduce(void *ud, struct toy_tensor *const *params, int n) {
    struct hooks *h = ud;
    cr_assert_gt(n, 0);
    for (int i = 0; i < n; i++) cr_assert(params[i]->grad && params[i]->grad->data);
    if (++h->calls == h->fail_at) return toy_error(TOY_ERR_IO, "rank 1 of 2 is gone (test)");
    return TOY_OK;
}

static enum toy_status h_reduce(void *ud, double *v, int n) {
    struct hooks *h = ud;
    h->reduces++;
    if (h->diverge && n == 4) v[0] = v[0] == 0 ? 1 : 0; /* the replica check's hash pieces */
    return TOY_OK;
}

static void h_step(void *ud, const struct toy_step_info *s) { ((struct hooks *)ud)->loss[s->step - 1] = s->loss; }

static struct toy_train_opts opts(int64_t steps) {
    return (struct toy_train_opts){.steps = steps, .accum = 2, .lr = 3e-3f, .lr_min = 3e-4f, .warmup = 2,
                                   .schedule = TOY_LR_COSINE, .weight_decay = 0.1f, .beta1 = 0.9f, .beta2 = 0.95f,
                                   .eps = 1e-8f, .clip = 1.0f, .seed = 9, .eval_every = 3, .eval_batches = 2};
}

/* Runs `steps` steps (resuming from state when given) with the hooks when
 * h is given; returns the status. */
static enum toy_status train(const char *dir, const char *ckpt, const char *state, struct hooks *h, struct hooks *rec,
                             int64_t steps, struct toy_train_result *res) {
    struct toy_llama *m;
    if (ckpt) cr_assert_eq(toy_llama_load(ckpt, true, &m), TOY_OK, "%s", toy_last_error());
    else m = small_model();
    struct toy_data *d = make_data();
    struct toy_train_opts o = opts(steps);
    struct toy_trainer *t;
    cr_assert_eq(toy_mkdir_p(dir), TOY_OK);
    cr_assert_eq(toy_trainer_new(m, NULL, d, &o, dir, NULL, 1, &t), TOY_OK, "%s", toy_last_error());
    if (state) cr_assert_eq(toy_trainer_load_state(t, state), TOY_OK, "%s", toy_last_error());
    if (h) {
        toy_trainer_set_collective(t, h_allreduce, h, 0, 1);
        cr_assert_eq(toy_trainer_set_reduce(t, h_reduce), TOY_OK);
    }
    toy_trainer_on_step(t, h_step, rec);
    enum toy_status st = toy_trainer_run(t, res);
    toy_trainer_free(t);
    toy_data_free(d);
    toy_llama_free(m);
    return st;
}

Test(collective, trainer_hooks_identity_and_failure_resume, .timeout = 120) {
    char tmp[] = "/tmp/toy-test-collective-XXXXXX";
    cr_assert(mkdtemp(tmp));
    char dir[200], ckpt[300], state[300];
    struct toy_train_result res;
    /* plain */
    struct hooks plain = {0}, ident = {0}, rec = {0}, fail = {.fail_at = 5}, rec2 = {0}, rec3 = {0};
    snprintf(dir, sizeof dir, "%s/plain", tmp);
    cr_assert_eq(train(dir, NULL, NULL, NULL, &plain, 8, &res), TOY_OK, "%s", toy_last_error());
    /* identity hooks (a world of one): the same losses, to the bit */
    snprintf(dir, sizeof dir, "%s/ident", tmp);
    cr_assert_eq(train(dir, NULL, NULL, &ident, &rec, 8, &res), TOY_OK, "%s", toy_last_error());
    cr_assert_eq(ident.calls, 8);
    cr_assert_geq(ident.reduces, 8 + 2 + 1); /* every step, the evaluations at 3 and 6, the final one */
    for (int s = 0; s < 8; s++) cr_assert_eq(rec.loss[s], plain.loss[s], "step %d", s + 1);
    /* the all-reduce of step 5 fails: errored, a checkpoint of step 4 */
    snprintf(dir, sizeof dir, "%s/fail", tmp);
    cr_assert_eq(train(dir, NULL, NULL, &fail, &rec2, 8, &res), TOY_ERR_IO);
    cr_assert_eq(res.reason, TOY_RUN_ERRORED);
    cr_assert_eq(res.final_step, 4);
    cr_assert(strstr(toy_last_error(), "rank 1 of 2 is gone"), "%s", toy_last_error());
    snprintf(ckpt, sizeof ckpt, "%s/weights/step_4.gguf", dir);
    snprintf(state, sizeof state, "%s/weights/step_4.state.gguf", dir);
    cr_assert_str_eq(res.checkpoint, ckpt);
    /* ... which resumes into exactly the uninterrupted run: the sampler was rewound */
    cr_assert_eq(train(dir, ckpt, state, NULL, &rec3, 8, &res), TOY_OK, "%s", toy_last_error());
    for (int s = 4; s < 8; s++) cr_assert_eq(rec3.loss[s], plain.loss[s], "step %d", s + 1);
    /* replicas whose weights differ from rank 0's: the check before the last checkpoint says so */
    struct hooks div = {.diverge = true}, rec4 = {0};
    snprintf(dir, sizeof dir, "%s/diverge", tmp);
    cr_assert_eq(train(dir, NULL, NULL, &div, &rec4, 4, &res), TOY_ERR_STATE);
    cr_assert_eq(res.reason, TOY_RUN_ERRORED);
    cr_assert(strstr(toy_last_error(), "replicas diverged"), "%s", toy_last_error());
    cr_assert_eq(res.final_step, 4);
    /* and no rank's weights are the run's: none is saved, weights/latest stays where the replicas agreed (found by
     * the MPI walk: a stale run folder on one rank made a diverged checkpoint the next --resume's start) */
    cr_assert(!res.checkpoint[0], "diverged weights were saved as %s", res.checkpoint);
    cr_assert(strstr(toy_last_error(), "these weights are not saved"), "%s", toy_last_error());
    snprintf(ckpt, sizeof ckpt, "%s/weights/step_4.gguf", dir);
    cr_assert_neq(access(ckpt, F_OK), 0, "%s was written", ckpt);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    if (system(cmd)) {}
}

/* ---- overlap: the graph's hooks, the gradient sync, the trainer ------------------ */

struct seen {
    int n, last, bad;
    int *order;
};

static void on_node(void *ud, int node) {
    struct seen *s = ud;
    if (node <= s->last) s->bad++;
    s->last = node;
    s->order[s->n++] = node;
}

static int param_index(struct toy_tensor *const *ps, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (!strcmp(ps[i]->name, name)) return i;
    cr_assert_fail("no parameter %s", name);
    return -1;
}

/* A tiny Llama's training graph: the callback sees every node that runs,
 * once, in order; each gradient's last writer writes it and no later node
 * does; the backward pass finishes the last layer's gradients first. */
Test(collective, graph_node_callback_and_last_writers) {
    struct toy_llama *m = small_model();
    struct toy_lm lm = toy_llama_lm(m);
    struct toy_ctx *ctx = toy_ctx_init(true);
    struct toy_tensor *tok = toy_new_tensor_2d(ctx, TOY_I32, 16, 2), *tgt = toy_new_tensor_2d(ctx, TOY_I32, 16, 2);
    struct toy_tensor *pos = toy_new_tensor_1d(ctx, TOY_I32, 16);
    for (int i = 0; i < 32; i++) ((int32_t *)tok->data)[i] = i % 40, ((int32_t *)tgt->data)[i] = (i * 3) % 40;
    for (int i = 0; i < 16; i++) ((int32_t *)pos->data)[i] = i;
    struct toy_tensor *loss = toy_cross_entropy(ctx, lm.forward(lm.self, ctx, tok, pos), tgt, -100);
    struct toy_graph *g = toy_graph_new(ctx);
    toy_graph_build(g, loss);
    toy_graph_backward(g, loss);
    int nn = toy_graph_n_nodes(g), np = 0;
    struct toy_tensor *ps[256];
    for (int i = 0; i < lm.n_tensors(lm.self); i++) {
        struct toy_tensor *p = lm.tensor(lm.self, i);
        if (p->flags & TOY_FLAG_PARAM) ps[np++] = p;
    }
    int lw[256];
    toy_graph_grad_last_writers(g, ps, np, lw);
    for (int i = 0; i < np; i++) {
        cr_assert_geq(lw[i], 0, "%s: no node writes its gradient", ps[i]->name);
        cr_assert_eq(toy_graph_node(g, lw[i])->src[TOY_MAX_SRC - 1], ps[i]->grad, "%s", ps[i]->name);
        for (int k = lw[i] + 1; k < nn; k++) {
            struct toy_tensor *t = toy_graph_node(g, k);
            bool writer = t->op == TOY_OP_ACCUM || t->op == TOY_OP_MATMUL || t->op == TOY_OP_GET_ROWS_BACK;
            cr_assert(!(writer && t->src[TOY_MAX_SRC - 1] == ps[i]->grad), "%s written again at node %d", ps[i]->name, k);
        }
    }
    cr_assert_lt(lw[param_index(ps, np, "blk.1.attn_q.weight")], lw[param_index(ps, np, "blk.0.attn_q.weight")]);
    cr_assert_lt(lw[param_index(ps, np, "output_norm.weight")], lw[param_index(ps, np, "blk.0.ffn_up.weight")]);
    struct seen s = {.last = -1, .order = calloc((size_t)nn, sizeof(int))};
    toy_graph_set_node_callback(g, on_node, &s);
    cr_assert_eq(toy_graph_compute(g, NULL), TOY_OK, "%s", toy_last_error());
    int runs = 0, last_run = -1;
    for (int k = 0; k < nn; k++) {
        enum toy_op op = toy_graph_node(g, k)->op;
        if (op != TOY_OP_VIEW && op != TOY_OP_RESHAPE && op != TOY_OP_PERMUTE) runs++, last_run = k;
    }
    cr_assert_eq(s.bad, 0, "callback out of order");
    cr_assert_eq(s.n, runs, "%d calls for %d nodes that run", s.n, runs);
    cr_assert_eq(s.last, last_run);
    int before = s.n;
    toy_graph_set_node_callback(g, NULL, NULL); /* off: no more calls */
    cr_assert_eq(toy_graph_compute(g, NULL), TOY_OK);
    cr_assert_eq(s.n, before);
    free(s.order);
    toy_ctx_free(ctx);
    toy_llama_free(m);
}

/* Buckets start as soon as their buffers are reported final (two in
 * flight at most), and the result is the same bits as sending them all
 * after the "backward pass"; ZeRO-1 parts cover every element once. */
Test(collective, grad_sync_starts_buckets_as_they_become_ready) {
    enum { N = 6 };
    const int64_t counts[N] = {5, 3, 10, 1, 7, 20};
    const int ready[N] = {-1, 2, 4, 4, 7, 9};
    float *a[N], *b[N], *orig[N];
    for (int i = 0; i < N; i++) {
        a[i] = malloc((size_t)counts[i] * sizeof(float));
        b[i] = malloc((size_t)counts[i] * sizeof(float));
        orig[i] = malloc((size_t)counts[i] * sizeof(float));
        for (int64_t k = 0; k < counts[i]; k++) orig[i][k] = a[i][k] = b[i][k] = 0.37f * (float)(i * 31 + k) - 3.1f;
    }
    struct fake f = {0};
    struct toy_collective *c = fake_open(&f, 64, 0); /* 16 floats a bucket */
    struct toy_grad_sync *s;
    cr_assert_eq(toy_grad_sync_new(c, a, NULL, counts, ready, N, false, &s), TOY_OK, "%s", toy_last_error());
    int nb = toy_grad_sync_n_buckets(s);
    cr_assert_eq(nb, 3); /* 46 floats, 16 a bucket */
    for (int k = 1; k < nb; k++) cr_assert_geq(toy_grad_sync_bucket_ready(s, k), toy_grad_sync_bucket_ready(s, k - 1));
    cr_assert_eq(toy_grad_sync_begin(s, 0.25f), TOY_OK);
    int prev = toy_grad_sync_started(s);
    cr_assert_eq(prev, 0, "bucket 0 holds buffer 2 (ready at 4)");
    for (int node = 0; node < 12; node++) {
        toy_grad_sync_ready(s, node);
        toy_grad_sync_ready(s, node); /* a second report lets the fake complete one */
        int started = toy_grad_sync_started(s), may = 0;
        while (may < nb && toy_grad_sync_bucket_ready(s, may) <= node) may++;
        cr_assert_leq(started, may, "node %d: %d buckets started, %d ready", node, started, may);
        cr_assert_geq(started, prev);
        if (may > prev) cr_assert_gt(started, prev, "node %d: a ready bucket did not start", node);
        prev = started;
    }
    cr_assert_leq(f.max_in_flight, TOY_COLLECTIVE_SLOTS);
    cr_assert_eq(toy_grad_sync_end(s), TOY_OK, "%s", toy_last_error());
    cr_assert_eq(f.violations, 0);
    toy_grad_sync_free(s);
    /* the same plan without reports: everything after the "backward pass" */
    cr_assert_eq(toy_grad_sync_new(c, b, NULL, counts, ready, N, false, &s), TOY_OK);
    cr_assert_eq(toy_grad_sync_begin(s, 0.25f), TOY_OK);
    cr_assert_eq(toy_grad_sync_end(s), TOY_OK);
    toy_grad_sync_free(s);
    for (int i = 0; i < N; i++)
        for (int64_t k = 0; k < counts[i]; k++) {
            cr_assert_eq(a[i][k], orig[i][k] * 0.25f, "buffer %d [%lld]", i, (long long)k);
            cr_assert_eq(a[i][k], b[i][k]);
        }
    /* ZeRO-1: rank 0's and rank 1's parts cover every element once; the reduce-scatter fills rank 0's */
    char *covered[N];
    for (int i = 0; i < N; i++) covered[i] = calloc((size_t)counts[i], 1);
    int64_t total = 0;
    for (int r = 0; r < 2; r++) {
        c->rank = r;
        for (int i = 0; i < N; i++) memcpy(a[i], orig[i], (size_t)counts[i] * sizeof(float));
        cr_assert_eq(toy_grad_sync_new(c, a, b, counts, ready, N, true, &s), TOY_OK, "%s", toy_last_error());
        const struct toy_bucket_piece *pc;
        int64_t elems, sum = 0;
        int np = toy_grad_sync_shard(s, &pc, &elems);
        cr_assert_gt(np, 0);
        cr_assert_eq(toy_grad_sync_begin(s, 0.5f), TOY_OK);
        for (int node = 0; node < 12; node++) toy_grad_sync_ready(s, node);
        cr_assert_eq(toy_grad_sync_end(s), TOY_OK, "%s", toy_last_error());
        for (int k = 0; k < np; k++) {
            for (int64_t e = pc[k].off; e < pc[k].off + pc[k].count; e++) {
                cr_assert_eq(covered[pc[k].buf][e]++, 0, "element %lld of buffer %d owned twice", (long long)e, pc[k].buf);
                cr_assert_eq(a[pc[k].buf][e], orig[pc[k].buf][e] * 0.5f);
            }
            sum += pc[k].count;
        }
        cr_assert_eq(sum, elems);
        total += elems;
        cr_assert_eq(toy_grad_sync_allgather_params(s), TOY_OK, "%s", toy_last_error());
        toy_grad_sync_free(s);
    }
    cr_assert_eq(total, 46);
    cr_assert_eq(f.violations, 0);
    c->rank = 0;
    for (int i = 0; i < N; i++) free(a[i]), free(b[i]), free(orig[i]), free(covered[i]);
    c->ops = NULL; /* the fake needs no finalize */
    toy_collective_close(c);
}

/* The trainer over fake other ranks (replicas: the mean of their gradients
 * and ours is ours, exactly with 4 ranks): overlap on and off give the
 * losses and weights of one process, to the bit. */
static enum toy_status train_dp(const char *dir, bool overlap, size_t bucket_bytes, float *loss, uint64_t *hash) {
    struct toy_llama *m = small_model();
    struct toy_data *d = make_data();
    struct toy_train_opts o = opts(6);
    struct toy_trainer *t;
    cr_assert_eq(toy_mkdir_p(dir), TOY_OK);
    cr_assert_eq(toy_trainer_new(m, NULL, d, &o, dir, NULL, 1, &t), TOY_OK, "%s", toy_last_error());
    struct fake f = {.replica = true};
    struct toy_collective *c = NULL;
    if (bucket_bytes) {
        c = fake_open(&f, bucket_bytes, 0);
        c->world = 4; /* not 2: the step's scalars (world + 2 of them) must not look like the replica check's 4 */
        cr_assert_eq(toy_trainer_use_collective(t, c, &(struct toy_dp_opts){.overlap = overlap}), TOY_OK, "%s",
                     toy_last_error());
    }
    struct hooks rec = {0};
    toy_trainer_on_step(t, h_step, &rec);
    struct toy_train_result res;
    enum toy_status st = toy_trainer_run(t, &res);
    memcpy(loss, rec.loss, 6 * sizeof(float));
    struct toy_tensor *const *ps;
    int n = toy_trainer_params(t, &ps);
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < n; i++) {
        const uint32_t *w = ps[i]->data;
        for (int64_t k = 0; k < toy_nelements(ps[i]); k++) h = (h ^ w[k]) * 1099511628211ull;
    }
    *hash = h;
    if (c) cr_assert_eq(f.violations, 0);
    toy_trainer_free(t);
    if (c) {
        c->ops = NULL;
        toy_collective_close(c);
    }
    toy_data_free(d);
    toy_llama_free(m);
    return st;
}

Test(collective, trainer_overlap_on_and_off_match_one_process, .timeout = 120) {
    char tmp[] = "/tmp/toy-test-overlap-XXXXXX";
    cr_assert(mkdtemp(tmp));
    char dir[200];
    float l0[6], l1[6], l2[6];
    uint64_t h0, h1, h2;
    snprintf(dir, sizeof dir, "%s/one", tmp);
    cr_assert_eq(train_dp(dir, false, 0, l0, &h0), TOY_OK, "%s", toy_last_error());
    snprintf(dir, sizeof dir, "%s/after", tmp);
    cr_assert_eq(train_dp(dir, false, 4096, l1, &h1), TOY_OK, "%s", toy_last_error());
    snprintf(dir, sizeof dir, "%s/overlap", tmp);
    cr_assert_eq(train_dp(dir, true, 4096, l2, &h2), TOY_OK, "%s", toy_last_error());
    for (int s = 0; s < 6; s++) {
        cr_assert_eq(l1[s], l0[s], "step %d: after backward %g, one process %g", s + 1, l1[s], l0[s]);
        cr_assert_eq(l2[s], l0[s], "step %d: overlapped %g, one process %g", s + 1, l2[s], l0[s]);
    }
    cr_assert_eq(h1, h0, "weights differ (after backward)");
    cr_assert_eq(h2, h0, "weights differ (overlapped)");
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    if (system(cmd)) {}
}

/* ---- the NCCL transport's bookkeeping, over the stand-in CUDA runtime ------------- */

#if defined(TOY_CUDA_MOCK) && !defined(TOY_MPI)
/* `make CUDA_MOCK=1` (no GPU): device memory is host memory
 * (tools/cuda-mock.c), and these stand in for NCCL: one process, rank 0 of
 * 2, whose peer holds the same gradients (a sum doubles) and sends 0x5a
 * bytes when it is the root of a broadcast (an all-gather's part). What runs
 * for real is collective-nccl.c's staging (host -> pinned -> device ->
 * pinned -> host), its copy back on completion, the reduce-scatter's output
 * place, the id-file bootstrap and the shutdown. In suite cuda, so the CI's
 * mock check (check-cuda) runs it. */
#include <nccl.h>

struct ncclComm {
    int nranks, rank, destroyed;
};
static int mock_groups;

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    memset(id, 7, sizeof *id);
    return ncclSuccess;
}
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
    (void)id;
    *comm = calloc(1, sizeof **comm);
    (*comm)->nranks = nranks;
    (*comm)->rank = rank;
    return ncclSuccess;
}
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    free(comm);
    return ncclSuccess;
}
ncclResult_t ncclCommAbort(ncclComm_t comm) { return ncclCommDestroy(comm); }
const char *ncclGetErrorString(ncclResult_t r) { return r == ncclSuccess ? "no error" : "mock NCCL error"; }
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *e) {
    (void)comm;
    *e = ncclSuccess;
    return ncclSuccess;
}
static void mock_double(const void *send, void *recv, size_t n, ncclDataType_t t) {
    if (t == ncclFloat32)
        for (size_t i = 0; i < n; i++) ((float *)recv)[i] = 2 * ((const float *)send)[i];
    else if (t == ncclFloat64)
        for (size_t i = 0; i < n; i++) ((double *)recv)[i] = 2 * ((const double *)send)[i];
    else
        cr_assert_fail("mock NCCL: sum of type %d", (int)t);
}
ncclResult_t ncclAllReduce(const void *send, void *recv, size_t n, ncclDataType_t t, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t s) {
    (void)comm, (void)s;
    cr_assert_eq(op, ncclSum);
    mock_double(send, recv, n, t);
    return ncclSuccess;
}
ncclResult_t ncclReduce(const void *send, void *recv, size_t n, ncclDataType_t t, ncclRedOp_t op, int root,
                        ncclComm_t comm, cudaStream_t s) {
    (void)s;
    cr_assert_eq(op, ncclSum);
    cr_assert_gt(mock_groups, 0, "the reduce-scatter's reduces are grouped");
    if (root == comm->rank) mock_double(send, recv, n, t);
    return ncclSuccess;
}
ncclResult_t ncclBroadcast(const void *send, void *recv, size_t n, ncclDataType_t t, int root, ncclComm_t comm,
                           cudaStream_t s) {
    (void)s;
    size_t bytes = n * (t == ncclFloat32 ? 4 : 1);
    cr_assert(t == ncclFloat32 || t == ncclUint8);
    if (root != comm->rank) memset(recv, 0x5a, bytes); /* the peer's bytes */
    else if (send != recv) memmove(recv, send, bytes);
    return ncclSuccess;
}
ncclResult_t ncclGroupStart(void) {
    mock_groups++;
    return ncclSuccess;
}
ncclResult_t ncclGroupEnd(void) {
    mock_groups--;
    return ncclSuccess;
}

Test(cuda, nccl_transport_staging_over_the_mock) {
    char idf[] = "/tmp/toy-test-nccl-id-XXXXXX";
    int fd = mkstemp(idf);
    cr_assert_geq(fd, 0);
    close(fd);
    remove(idf); /* rank 0 writes it */
    setenv("TOY_NCCL_ID_FILE", idf, 1);
    setenv("WORLD_SIZE", "2", 1);
    setenv("RANK", "0", 1);
    struct toy_collective *c;
    cr_assert_eq(toy_collective_open(TOY_COLLECTIVE_NCCL, &(struct toy_collective_opts){.bucket_bytes = 64}, &c),
                 TOY_OK, "%s", toy_last_error());
    cr_assert_str_eq(toy_collective_name(c), "nccl");
    cr_assert_eq(toy_collective_world(c), 2);
    FILE *f = fopen(idf, "rb");
    cr_assert(f, "rank 0 wrote the id file");
    fclose(f);
    /* the mean of packed and split buckets gives the values back */
    enum { N = 4 };
    const int64_t counts[N] = {5, 3, 40, 1};
    float *a[N], *orig[N];
    for (int i = 0; i < N; i++) {
        a[i] = malloc((size_t)counts[i] * sizeof(float));
        orig[i] = malloc((size_t)counts[i] * sizeof(float));
        for (int64_t k = 0; k < counts[i]; k++) a[i][k] = orig[i][k] = 0.25f * (float)(i * 50 + k) - 7;
    }
    cr_assert_eq(toy_collective_allreduce_mean(c, a, counts, N), TOY_OK, "%s", toy_last_error());
    for (int i = 0; i < N; i++)
        for (int64_t k = 0; k < counts[i]; k++) cr_assert_eq(a[i][k], orig[i][k], "buffer %d [%lld]", i, (long long)k);
    double v[2] = {1.5, -2};
    cr_assert_eq(toy_collective_allreduce_sum_f64(c, v, 2), TOY_OK);
    cr_assert(v[0] == 3 && v[1] == -4);
    void *bp[1] = {a[2]};
    size_t bb[1] = {40 * sizeof(float)};
    cr_assert_eq(toy_collective_broadcast(c, bp, bb, 1, 0), TOY_OK); /* from this rank: unchanged */
    for (int64_t k = 0; k < 40; k++) cr_assert_eq(a[2][k], orig[2][k]);
    float peer;
    memset(&peer, 0x5a, sizeof peer);
    cr_assert_eq(toy_collective_broadcast(c, bp, bb, 1, 1), TOY_OK); /* from the peer: its bytes come back */
    for (int64_t k = 0; k < 40; k++) cr_assert_eq(a[2][k], peer);
    memcpy(a[2], orig[2], 40 * sizeof(float));
    /* ZeRO-1: the reduce-scatter's result lands at this rank's part, scaled */
    float *p[N];
    for (int i = 0; i < N; i++) p[i] = malloc((size_t)counts[i] * sizeof(float)), memcpy(p[i], orig[i], (size_t)counts[i] * sizeof(float));
    struct toy_grad_sync *s;
    cr_assert_eq(toy_grad_sync_new(c, a, p, counts, NULL, N, true, &s), TOY_OK, "%s", toy_last_error());
    cr_assert_eq(toy_grad_sync_begin(s, 0.5f), TOY_OK);
    cr_assert_eq(toy_grad_sync_end(s), TOY_OK, "%s", toy_last_error());
    const struct toy_bucket_piece *pc;
    int64_t elems;
    int np = toy_grad_sync_shard(s, &pc, &elems);
    cr_assert_eq(elems, 24, "rank 0 owns the first half of each bucket (16, 16, 16 and 1 floats: 8 + 8 + 8 + 0)");
    char *mine[N];
    for (int i = 0; i < N; i++) mine[i] = calloc((size_t)counts[i], 1);
    for (int k = 0; k < np; k++)
        for (int64_t e = pc[k].off; e < pc[k].off + pc[k].count; e++) {
            cr_assert_eq(a[pc[k].buf][e], orig[pc[k].buf][e] * 0.5f, "buffer %d [%lld]", pc[k].buf, (long long)e);
            mine[pc[k].buf][e] = 1;
        }
    /* the all-gather: this rank's part stays, the peer's part arrives */
    cr_assert_eq(toy_grad_sync_allgather_params(s), TOY_OK, "%s", toy_last_error());
    for (int i = 0; i < N; i++)
        for (int64_t k = 0; k < counts[i]; k++)
            cr_assert_eq(p[i][k], mine[i][k] ? orig[i][k] : peer, "parameter %d [%lld]", i, (long long)k);
    for (int i = 0; i < N; i++) free(mine[i]);
    toy_grad_sync_free(s);
    cr_assert_eq(mock_groups, 0);
    toy_collective_close(c); /* barrier, ncclCommDestroy, the bounce buffers */
    for (int i = 0; i < N; i++) free(a[i]), free(orig[i]), free(p[i]);
    remove(idf);
    unsetenv("TOY_NCCL_ID_FILE");
    unsetenv("WORLD_SIZE");
    unsetenv("RANK");
}
#endif
