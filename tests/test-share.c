/* test-share.c: decode's matrix-vector products share their rows (column
 * groups of packed weights) out to threads (cpu-impl.h's toy_share): each
 * thread owns a run and claims it front to back, and a thread done with its
 * own takes the back of the others'. A chain of one-row products of every
 * weight type, run many times on 1 to 8 threads (more threads than cores,
 * so some are descheduled mid-node and the others take from their runs),
 * must give the bits of the single-threaded run every time: each output is
 * one thread's whole dot product, and the runs a node leaves must read as
 * empty to the next, including after a product small enough to run on one
 * thread alone. toy_share itself, driven directly: every unit exactly once,
 * each thread's own run in one front-to-back stream, a slow thread helped,
 * and no help with less than TOY_SHARE_STEAL_MIN bytes left. The pool
 * itself must notice when its threads share the cores with others, and spin
 * less, and its bandwidth probes give rates (threadpool.c). */
#include <criterion/criterion.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "toy/dtype.h"
#include "toy/quant.h"
#include "toy/rng.h"
#include "toy/toy.h"
#include "backends/cpu/cpu-impl.h"
#include "harness.h"

static struct toy_tensor *weight(struct toy_ctx *ctx, enum toy_dtype type, int64_t k, int64_t n, struct toy_rng *r) {
    struct toy_tensor *w = th_weight(ctx, type, k, n, 0.05f, r);
    cr_assert_eq(toy_tensor_pack(w), TOY_OK);
    return w;
}

/* x (1 x 256) -> 1024 -> 256 -> 32 (one thread alone: small) -> 256 -> 2050 (a ragged last group), and
 * x -> 20480 */
static void chain_case(enum toy_dtype type) {
    struct toy_ctx *ctx = toy_ctx_init(true);
    struct toy_rng r;
    toy_rng_seed(&r, 5);
    const int64_t dims[] = {256, 1024, 256, 32, 256, 2050};
    const int nw = 6;
    const int64_t wide = 20480;
    struct toy_tensor *x = toy_new_tensor_2d(ctx, TOY_F32, dims[0], 1), *h = x;
    for (int64_t i = 0; i < dims[0]; i++) ((float *)x->data)[i] = toy_rng_normal(&r);
    struct toy_tensor *outs[6];
    for (int l = 0; l < nw - 1; l++) {
        /* Q4_K wants k a multiple of 256: the 32-wide step stays f32 */
        enum toy_dtype t = type == TOY_Q4_K && dims[l] % 256 ? TOY_F32 : type;
        h = toy_linear(ctx, h, weight(ctx, t, dims[l], dims[l + 1], &r), NULL);
        toy_set_output(h);
        outs[l] = h;
    }
    outs[nw - 1] = toy_linear(ctx, x, weight(ctx, type, dims[0], wide, &r), NULL);
    toy_set_output(outs[nw - 1]);
    struct toy_graph *g = toy_graph_new(ctx);
    toy_graph_build(g, h);
    toy_graph_build(g, outs[nw - 1]);
    size_t total = 0;
    for (int l = 0; l < nw; l++) total += (size_t)outs[l]->ne[0];
    float *want = malloc(total * sizeof *want), *got = malloc(total * sizeof *got);
    cr_assert_eq(toy_graph_compute(g, NULL), TOY_OK); /* plans the outputs' memory */
    for (int nth = 1; nth <= 8; nth++) {
        struct toy_threadpool *tp = toy_threadpool_new(nth);
        for (int run = 0; run < 30; run++) {
            for (int l = 0; l < nw; l++) memset(outs[l]->data, 0xff, toy_nbytes(outs[l])); /* NaN if unwritten */
            cr_assert_eq(toy_graph_compute(g, tp), TOY_OK);
            size_t at = 0;
            for (int l = 0; l < nw; l++) {
                memcpy((nth == 1 && run == 0 ? want : got) + at, outs[l]->data, toy_nbytes(outs[l]));
                at += (size_t)outs[l]->ne[0];
            }
            if (nth == 1 && run == 0) continue;
            for (size_t i = 0; i < total; i++)
                cr_assert(memcmp(&got[i], &want[i], sizeof(float)) == 0,
                          "%s, %d threads, run %d, output %zu: %.9g, one thread %.9g", toy_dtype_name(type), nth, run,
                          i, got[i], want[i]);
        }
        toy_threadpool_free(tp);
    }
    free(want);
    free(got);
    toy_ctx_free(ctx);
}

Test(share, decode_products_f32) { chain_case(TOY_F32); }
Test(share, decode_products_f16) { chain_case(TOY_F16); }
Test(share, decode_products_bf16) { chain_case(TOY_BF16); }
Test(share, decode_products_q8_0) { chain_case(TOY_Q8_0); }
Test(share, decode_products_q4_0) { chain_case(TOY_Q4_0); }
Test(share, decode_products_q4_k) { chain_case(TOY_Q4_K); }

/* toy_share on its own: n elements in units of `unit` over the pool's
 * threads, thread 0 slowed by `slow_us` per unit it takes; who took each
 * element, and in what pieces */
#define SH_MAX_PIECES 4096
struct share_run {
    void *work;
    int64_t n, unit;
    size_t unit_bytes;
    int slow_us;
    _Atomic int owner[4000]; /* thread + 1 that took each element; 0: none */
    atomic_int set; /* thread 0 has set its run (a helper looking before takes nothing from it) */
    atomic_int twice;
    int64_t piece[8][SH_MAX_PIECES][2];
    int n_piece[8];
};

static void share_task(void *arg, int ith, int nth) {
    struct share_run *r = arg;
    struct toy_share sh;
    toy_share_init(&sh, r->work, r->n, r->unit, r->unit_bytes, ith, nth);
    if (ith == 0) atomic_store(&r->set, 1);
    /* the others start once it has (as in a node, where all start together;
     * a sanitized build's thread 1 can otherwise be done before thread 0 runs) */
    while (r->slow_us && !atomic_load(&r->set)) sched_yield();
    int64_t u0, u1;
    while (toy_share_next(&sh, &u0, &u1)) {
        if (r->n_piece[ith] < SH_MAX_PIECES) {
            r->piece[ith][r->n_piece[ith]][0] = u0;
            r->piece[ith][r->n_piece[ith]][1] = u1;
            r->n_piece[ith]++;
        }
        for (int64_t e = u0; e < u1; e++) {
            int none = 0;
            if (!atomic_compare_exchange_strong(&r->owner[e], &none, ith + 1)) atomic_fetch_add(&r->twice, 1);
        }
        if (ith == 0 && r->slow_us) {
            struct timespec ts = {0, (long)r->slow_us * 1000L * ((u1 - u0 + r->unit - 1) / r->unit)};
            nanosleep(&ts, NULL);
        }
    }
}

/* runs the share; returns how many of thread 0's own run's elements others took */
static int64_t share_once(struct share_run *r, struct toy_threadpool *tp) {
    int nth = toy_threadpool_size(tp);
    for (int64_t e = 0; e < r->n; e++) atomic_store(&r->owner[e], 0);
    atomic_store(&r->twice, 0);
    atomic_store(&r->set, 0);
    memset(r->n_piece, 0, sizeof r->n_piece);
    toy_threadpool_run(tp, share_task, r);
    cr_assert_eq(atomic_load(&r->twice), 0, "%d threads, n %lld: elements taken twice", nth, (long long)r->n);
    for (int64_t e = 0; e < r->n; e++)
        cr_assert_neq(atomic_load(&r->owner[e]), 0, "%d threads, n %lld: element %lld never taken", nth,
                      (long long)r->n, (long long)e);
    int64_t units = (r->n + r->unit - 1) / r->unit, helped = 0;
    for (int t = 0; t < nth; t++) {
        /* its own run's pieces come first, adjacent, front to back from the run's start */
        int64_t at = units * t / nth * r->unit, end = units * (t + 1) / nth * r->unit;
        if (end > r->n) end = r->n;
        for (int i = 0; i < r->n_piece[t] && at < end; i++) {
            if (r->piece[t][i][0] != at) break; /* someone took the rest of its run */
            cr_assert(r->piece[t][i][1] > at && r->piece[t][i][1] <= end, "thread %d piece %d: [%lld, %lld)", t, i,
                      (long long)r->piece[t][i][0], (long long)r->piece[t][i][1]);
            at = r->piece[t][i][1];
        }
        for (int64_t e = at; e < end; e++)
            cr_assert_neq(atomic_load(&r->owner[e]), t + 1, "thread %d took element %lld of its own run out of order",
                          t, (long long)e);
        if (t == 0) helped = end - at;
    }
    return helped;
}

Test(share, every_unit_once_and_a_slow_thread_helped) {
    struct share_run *r = calloc(1, sizeof *r);
    r->work = aligned_alloc(64, TOY_WORK_HEAD);
    memset(r->work, 0, TOY_WORK_HEAD);
    for (int nth = 1; nth <= 4; nth++) {
        struct toy_threadpool *tp = toy_threadpool_new(nth);
        const int64_t ns[] = {0, 1, 7, 100, 999, 4000};
        for (int i = 0; i < 6; i++)
            for (int64_t unit = 1; unit <= 5; unit += 2) {
                r->n = ns[i], r->unit = unit, r->unit_bytes = 4096, r->slow_us = 0;
                for (int rep = 0; rep < 3; rep++) share_once(r, tp); /* each run leaves the next empty runs */
            }
        if (nth > 1) {
            /* thread 0 slow: the others, done with their own runs, take from its */
            r->n = 4000, r->unit = 4, r->unit_bytes = 8192, r->slow_us = 200;
            int64_t helped = share_once(r, tp);
            cr_expect_gt(helped, 0, "%d threads: thread 0, 200 us a unit, was not helped", nth);
            /* units of 64 bytes: nothing left is worth TOY_SHARE_STEAL_MIN (8 KB), so no help */
            r->n = 200, r->unit = 1, r->unit_bytes = 64, r->slow_us = 20;
            cr_expect_eq(share_once(r, tp), 0, "%d threads: help with less than TOY_SHARE_STEAL_MIN left", nth);
        }
        toy_threadpool_free(tp);
    }
    free(r->work);
    free(r);
}

/* More pool threads than cores: the caller is preempted all the time, and
 * the pool must notice it and spin less (threadpool.c), while every task
 * still runs on every thread exactly once. */
struct tally {
    atomic_long hits;
    int n;
};

static void count_task(void *arg, int ith, int nth) {
    struct tally *t = arg;
    volatile double x = 1;
    for (int i = 0; i < 2000; i++) x = x * 1.0000001 + 1e-9; /* a few microseconds of work */
    if (nth == t->n && ith >= 0 && ith < nth) atomic_fetch_add(&t->hits, 1);
}

Test(share, pool_spins_less_on_shared_cores) {
    int cores = toy_num_cores();
    if (cores > 16) cr_skip_test("%d cores: too many to oversubscribe here", cores);
    struct tally t = {.n = 4 * cores};
    struct toy_threadpool *tp = toy_threadpool_new(t.n);
    cr_assert(tp);
    long runs = 0;
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (now = t0; runs < 200000 && !toy_threadpool_shared(tp) && now.tv_sec - t0.tv_sec < 10; runs++) {
        clock_gettime(CLOCK_MONOTONIC, &now); /* a bound on a failing run, not a timing */
        toy_threadpool_run(tp, count_task, &t);
    }
    cr_expect_gt(toy_threadpool_shared(tp), 0, "%d threads on %d cores, %ld tasks: the pool never saw them shared",
                 t.n, cores, runs);
    cr_expect_eq(atomic_load(&t.hits), runs * t.n, "every task on every thread once");
    toy_threadpool_free(tp);
}

/* a file of the fake cpu tree, its directories made on the way */
static void put(const char *root, const char *rel, const char *text) {
    char path[512], cmd[600];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    snprintf(cmd, sizeof cmd, "mkdir -p \"$(dirname '%s')\"", path);
    cr_assert_eq(system(cmd), 0);
    FILE *f = fopen(path, "w");
    cr_assert(f, "%s", path);
    fputs(text, f);
    fclose(f);
}

/* The last-level cache is read from the kernel's cpu tree: the highest
 * level, each cache once however many cpus share it, instruction caches
 * and unreadable sizes left out; no tree at all is 0 (toy_llc_bytes then
 * asks glibc). Five cpus, one offline, two L3s of 16 MiB, an L2 each. */
Test(share, last_level_cache_counts_each_cache_once) {
    th_mkdir("llc");
    const char *root = th_dir;
    for (int cpu = 0; cpu < 5; cpu++) {
        if (cpu == 3) continue; /* offline: the kernel lists no caches for it */
        char rel[128];
        const char *idx[][4] = {{"1", "Data", "32K", NULL},
                                {"1", "Instruction", "32K", NULL},
                                {"2", "Unified", "1024K", NULL},
                                {"3", "Unified", "16M", cpu < 2 ? "0-1" : "2-4"}};
        for (int i = 0; i < 4; i++) {
            char own[16];
            snprintf(own, sizeof own, "%d", cpu);
            const char *files[4][2] = {{"level", idx[i][0]}, {"type", idx[i][1]}, {"size", idx[i][2]},
                                       {"shared_cpu_list", idx[i][3] ? idx[i][3] : own}};
            for (int f = 0; f < 4; f++) {
                snprintf(rel, sizeof rel, "cpu%d/cache/index%d/%s", cpu, i, files[f][0]);
                put(root, rel, files[f][1]);
            }
        }
    }
    cr_expect_eq(toy_llc_bytes_at(root), 32L << 20);
    put(root, "cpu2/cache/index3/size", "garbage"); /* that cache is then unknown, not guessed */
    put(root, "cpu4/cache/index3/size", "16Q");
    cr_expect_eq(toy_llc_bytes_at(root), 16L << 20);
    char missing[600];
    snprintf(missing, sizeof missing, "%s/none", root);
    cr_expect_eq(toy_llc_bytes_at(missing), 0);
    th_rmdir();
    cr_expect_geq(toy_llc_bytes(), 0);
}

/* The bandwidth probes the benchmarks' bounds come from: a rate for any
 * thread count, and the sustained one runs at least one round however
 * short the time asked; its rounds count towards the peak, so it is never
 * above it. */
Test(share, memory_probes_give_rates) {
    for (int nth = 1; nth <= 2; nth++) {
        struct toy_threadpool *tp = toy_threadpool_new(nth);
        double none = -1, some = -1, peak = toy_memory_read_gbs(tp), peak0 = toy_memory_read_rates(tp, 0, &none),
               peak1 = toy_memory_read_rates(tp, 0.05, &some), triad = toy_memory_bandwidth_gbs(tp);
        cr_expect(peak > 0 && peak < 1e5, "%d threads: read %g GB/s", nth, peak);
        cr_expect(none > 0 && none <= peak0, "%d threads: sustained for 0 s %g GB/s, peak %g", nth, none, peak0);
        cr_expect(some > 0 && some <= peak1, "%d threads: sustained for 50 ms %g GB/s, peak %g", nth, some, peak1);
        cr_expect(triad > 0 && triad < 1e5, "%d threads: triad %g GB/s", nth, triad);
        toy_threadpool_free(tp);
    }
}
