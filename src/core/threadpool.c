/* threadpool.c: a fixed pool of pthreads running one task at a time.
 *
 * The caller is thread 0. A task is published by bumping `gen`; workers spin
 * on it for a short while (tasks of a graph come back to back), then sleep on
 * a condition variable. Completion is counted with an atomic; the caller
 * spins (then yields) until every worker has finished.
 *
 * Spinning pays only while every thread has a core to itself. When other
 * work wants the cores too (another process, more threads than cores), a
 * thread spinning for the next task holds a core that the caller, still
 * computing its share, needs: a SmolLM2-135M Q4_0 decode on 2 threads of a
 * 2-core Zen 4 fell from ~300 to 68-103 tok/s beside one busy loop (1 thread
 * alone: 259), and to 32 tok/s at 3 threads. The kernel then preempts the
 * caller hundreds of times a second (1800/s there, against ~10/s on the
 * quiet machine), so the caller watches its own involuntary context
 * switches (getrusage), and above BUSY_HZ in two looks in a row the pool
 * spins SPIN_BUSY times instead of SPIN_ITERS, until a second has passed
 * below it.
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "toy/tensor.h"
#include "toy/threadpool.h"

#define SPIN_ITERS 4000 /* ~110 us of pause (28 ns each on a Zen 4): long enough for back-to-back
                           graph nodes, short enough not to starve a descheduled peer */
#define SPIN_BUSY 64    /* while the cores are shared */
#define BUSY_HZ 200     /* the caller's involuntary switches a second that mean they are */
#define CHECK_NS 50000000LL   /* how often the caller looks (at most; once per 64 tasks) */
#define QUIET_NS 1000000000LL /* below BUSY_HZ this long before spinning long again */

struct toy_threadpool {
    int n;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_uint gen;
    atomic_int pending;
    /* toy_threadpool_barrier: arrivals, and the phase the last arrival
     * bumps, each on a line of its own (the waiters spin on the phase) */
    _Alignas(64) atomic_uint bar_count;
    _Alignas(64) atomic_uint bar_phase;
    atomic_int bar_sleepers; /* waiters past their spin, asleep on bar_cv */
    _Alignas(64) pthread_mutex_t bar_mu; /* what follows the phase is on another line */
    pthread_cond_t bar_cv;
    atomic_bool stop;
    atomic_int spin; /* SPIN_ITERS, or SPIN_BUSY while the cores are shared */
    atomic_long shared; /* looks that found them shared */
    toy_task_fn fn;
    void *arg;
    /* the caller's watch (only the caller touches it) */
    pthread_t caller;
    unsigned runs;
    long long looked, busy_until; /* CLOCK_MONOTONIC ns */
    long nivcsw;
    int hot; /* looks in a row above BUSY_HZ */
};

struct worker_arg {
    struct toy_threadpool *tp;
    int ith;
};

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

/* the calling thread's involuntary context switches so far, or -1 */
static long involuntary_switches(void) {
#ifdef RUSAGE_THREAD
    struct rusage ru;
    if (getrusage(RUSAGE_THREAD, &ru) == 0) return ru.ru_nivcsw;
#endif
    return -1;
}

/* Called by the caller before each task: sets the pool's spin from how
 * often the kernel has been preempting it since it last looked. */
static void watch_cores(struct toy_threadpool *tp) {
    if (++tp->runs % 64) return;
    long long t = now_ns();
    if (t - tp->looked < CHECK_NS) return;
    long n = involuntary_switches();
    bool same = pthread_equal(tp->caller, pthread_self()) && tp->looked;
    /* two looks in a row: a burst of kernel work (page reclaim, a huge page
     * compacted) can preempt the caller ten times in one 50 ms look */
    tp->hot = n >= 0 && same && (double)(n - tp->nivcsw) * 1e9 / (double)(t - tp->looked) > BUSY_HZ ? tp->hot + 1 : 0;
    if (tp->hot >= 2) {
        tp->busy_until = t + QUIET_NS;
        atomic_store_explicit(&tp->spin, SPIN_BUSY, memory_order_relaxed);
        atomic_fetch_add_explicit(&tp->shared, 1, memory_order_relaxed);
    } else if (t > tp->busy_until) {
        atomic_store_explicit(&tp->spin, SPIN_ITERS, memory_order_relaxed);
    }
    tp->caller = pthread_self();
    tp->looked = t;
    tp->nivcsw = n;
}

static void *worker_main(void *p) {
    struct worker_arg *wa = p;
    struct toy_threadpool *tp = wa->tp;
    int ith = wa->ith;
    free(wa);
    unsigned seen = 0;
    for (;;) {
        unsigned g;
        int spins = 0, limit = atomic_load_explicit(&tp->spin, memory_order_relaxed);
        while ((g = atomic_load_explicit(&tp->gen, memory_order_acquire)) == seen &&
               !atomic_load(&tp->stop)) {
            if (++spins < limit) {
                cpu_relax();
                continue;
            }
            pthread_mutex_lock(&tp->mu);
            while (atomic_load(&tp->gen) == seen && !atomic_load(&tp->stop))
                pthread_cond_wait(&tp->cv, &tp->mu);
            pthread_mutex_unlock(&tp->mu);
        }
        if (atomic_load(&tp->stop)) break;
        seen = g;
        tp->fn(tp->arg, ith, tp->n);
        atomic_fetch_sub_explicit(&tp->pending, 1, memory_order_acq_rel);
    }
    return NULL;
}

int toy_num_cores(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

/* the first line of dir/name, without its newline; false when unreadable */
static bool read_line(const char *dir, const char *name, char *out, size_t n) {
    char path[1024];
    int w = snprintf(path, sizeof path, "%s/%s", dir, name);
    if (w < 0 || (size_t)w >= sizeof path) return false;
    FILE *f = fopen(path, "r");
    if (!f) return false;
    bool ok = fgets(out, (int)n, f) != NULL;
    fclose(f);
    if (ok) out[strcspn(out, "\n")] = 0;
    return ok;
}

/* "32768K", "1M", "512": bytes, or -1 */
static long parse_cache_size(const char *s) {
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s || v < 0) return -1;
    long mul = *end == 'K' ? 1L << 10 : *end == 'M' ? 1L << 20 : *end == 'G' ? 1L << 30 : 1;
    if (mul > 1) end++;
    return *end ? -1 : v * mul;
}

long toy_llc_bytes_at(const char *cpu_dir) {
    /* per cpu, its caches' indices: the highest level seen wins, and each
     * cache of it counts once (by the cpus that share it) */
    enum { MAX_CACHES = 256 };
    char seen[MAX_CACHES][128];
    int nseen = 0, best_level = 0;
    long total = 0;
    for (int cpu = 0, gap = 0; cpu < 65536 && gap < 64; cpu++) { /* past offline cpus, to 64 missing in a row */
        char dir[768], buf[128];
        int w = snprintf(dir, sizeof dir, "%s/cpu%d/cache", cpu_dir, cpu);
        if (w < 0 || (size_t)w >= sizeof dir || !read_line(dir, "index0/level", buf, sizeof buf)) {
            gap++;
            continue;
        }
        gap = 0;
        for (int i = 0; i < 16; i++) {
            char idx[800], shared[128];
            w = snprintf(idx, sizeof idx, "%s/index%d", dir, i);
            if (w < 0 || (size_t)w >= sizeof idx || !read_line(idx, "level", buf, sizeof buf)) break;
            int level = atoi(buf);
            if (read_line(idx, "type", buf, sizeof buf) && !strcmp(buf, "Instruction")) continue;
            if (level < best_level || !read_line(idx, "size", buf, sizeof buf)) continue;
            long bytes = parse_cache_size(buf);
            if (bytes <= 0) continue;
            if (!read_line(idx, "shared_cpu_list", shared, sizeof shared)) snprintf(shared, sizeof shared, "cpu%d", cpu);
            if (level > best_level) best_level = level, total = 0, nseen = 0;
            bool dup = false;
            for (int k = 0; k < nseen && !dup; k++) dup = !strcmp(seen[k], shared);
            if (dup) continue;
            if (nseen < MAX_CACHES) snprintf(seen[nseen++], sizeof seen[0], "%s", shared);
            total += bytes;
        }
    }
    return total;
}

long toy_llc_bytes(void) {
    long n = toy_llc_bytes_at("/sys/devices/system/cpu");
    if (n > 0) return n;
#ifdef _SC_LEVEL3_CACHE_SIZE
    n = sysconf(_SC_LEVEL3_CACHE_SIZE); /* glibc: 0 or -1 where it cannot tell */
#endif
    return n > 0 ? n : 0;
}

/* The cores this process may run on: its affinity mask (taskset, a
 * cpuset, an MPI launcher's binding), else every online core. A thread
 * per online core on a process bound to fewer shares those few: 2 threads
 * on the one core `mpirun -np 1` binds a rank to. */
static int usable_cores(void) {
    cpu_set_t set;
    if (!sched_getaffinity(0, sizeof set, &set) && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
    return toy_num_cores(); /* more CPUs than a cpu_set_t holds */
}

int toy_threads_resolve(int n_threads) {
    if (n_threads > 0) return n_threads;
    const char *env = getenv("TOY_THREADS");
    return env && atoi(env) > 0 ? atoi(env) : usable_cores();
}

struct toy_threadpool *toy_threadpool_new(int n_threads) {
    n_threads = toy_threads_resolve(n_threads);
    struct toy_threadpool *tp = aligned_alloc(64, (sizeof *tp + 63) / 64 * 64); /* the barrier's lines */
    if (!tp) return NULL;
    memset(tp, 0, sizeof *tp);
    tp->n = n_threads;
    pthread_mutex_init(&tp->mu, NULL);
    pthread_cond_init(&tp->cv, NULL);
    pthread_mutex_init(&tp->bar_mu, NULL);
    pthread_cond_init(&tp->bar_cv, NULL);
    atomic_init(&tp->gen, 0);
    atomic_init(&tp->pending, 0);
    atomic_init(&tp->stop, false);
    atomic_init(&tp->spin, SPIN_ITERS);
    atomic_init(&tp->shared, 0);
    tp->threads = calloc((size_t)n_threads, sizeof(pthread_t));
    if (!tp->threads) { free(tp); return NULL; }
    for (int i = 1; i < n_threads; i++) {
        struct worker_arg *wa = malloc(sizeof *wa);
        if (!wa) { tp->n = i; toy_threadpool_free(tp); return NULL; }
        wa->tp = tp;
        wa->ith = i;
        if (pthread_create(&tp->threads[i], NULL, worker_main, wa)) {
            free(wa);
            tp->n = i;
            toy_threadpool_free(tp);
            return NULL;
        }
    }
    return tp;
}

void toy_threadpool_free(struct toy_threadpool *tp) {
    if (!tp) return;
    pthread_mutex_lock(&tp->mu);
    atomic_store(&tp->stop, true);
    pthread_cond_broadcast(&tp->cv);
    pthread_mutex_unlock(&tp->mu);
    for (int i = 1; i < tp->n; i++) pthread_join(tp->threads[i], NULL);
    pthread_mutex_destroy(&tp->mu);
    pthread_cond_destroy(&tp->cv);
    pthread_mutex_destroy(&tp->bar_mu);
    pthread_cond_destroy(&tp->bar_cv);
    free(tp->threads);
    free(tp);
}

int toy_threadpool_size(const struct toy_threadpool *tp) { return tp ? tp->n : 1; }

long toy_threadpool_shared(const struct toy_threadpool *tp) {
    return tp ? atomic_load_explicit(&tp->shared, memory_order_relaxed) : 0;
}

void toy_threadpool_run(struct toy_threadpool *tp, toy_task_fn fn, void *arg) {
    if (!tp || tp->n == 1) {
        fn(arg, 0, 1);
        return;
    }
    watch_cores(tp);
    tp->fn = fn;
    tp->arg = arg;
    atomic_store_explicit(&tp->pending, tp->n - 1, memory_order_release);
    pthread_mutex_lock(&tp->mu);
    atomic_fetch_add_explicit(&tp->gen, 1, memory_order_acq_rel);
    pthread_cond_broadcast(&tp->cv);
    pthread_mutex_unlock(&tp->mu);
    fn(arg, 0, tp->n);
    int spins = 0, limit = atomic_load_explicit(&tp->spin, memory_order_relaxed);
    while (atomic_load_explicit(&tp->pending, memory_order_acquire) > 0) {
        if (++spins < limit) cpu_relax();
        else sched_yield();
    }
}

/* A shared count of arrivals: ~0.25 us a barrier on 2 cores of a Zen 4
 * VM, where a pool run costs ~0.85 (a slot per thread, each arrival
 * writing its own line and reading the others', measured the same in
 * decode and slower back to back: 0.39 us). A waiter spins as a worker
 * does between tasks, then sleeps; the caller watches its cores at its
 * barriers, a graph being one task. Without that watch, 3 threads on 2
 * cores decoded at 63 tok/s (every barrier waiting out a full spin for
 * the thread that had no core); with it, ~180 (a pool run per node: 90-180). */
void toy_threadpool_barrier(struct toy_threadpool *tp, int ith) {
    if (!tp || tp->n == 1) return;
    if (ith == 0) watch_cores(tp); /* a graph is one task: the caller looks at its barriers too */
    unsigned phase = atomic_load_explicit(&tp->bar_phase, memory_order_acquire);
    if (atomic_fetch_add_explicit(&tp->bar_count, 1, memory_order_acq_rel) == (unsigned)tp->n - 1) {
        /* the last to arrive: whoever sees the new phase sees the count reset */
        atomic_store_explicit(&tp->bar_count, 0, memory_order_relaxed);
        atomic_store(&tp->bar_phase, phase + 1);
        if (atomic_load(&tp->bar_sleepers)) { /* seq_cst, as their count: one side sees the other */
            pthread_mutex_lock(&tp->bar_mu);
            pthread_cond_broadcast(&tp->bar_cv);
            pthread_mutex_unlock(&tp->bar_mu);
        }
        return;
    }
    int spins = 0, limit = atomic_load_explicit(&tp->spin, memory_order_relaxed);
    while (atomic_load_explicit(&tp->bar_phase, memory_order_acquire) == phase) {
        if (++spins < limit) {
            cpu_relax();
            continue;
        }
        pthread_mutex_lock(&tp->bar_mu);
        atomic_fetch_add(&tp->bar_sleepers, 1);
        while (atomic_load(&tp->bar_phase) == phase) pthread_cond_wait(&tp->bar_cv, &tp->bar_mu);
        atomic_fetch_sub(&tp->bar_sleepers, 1);
        pthread_mutex_unlock(&tp->bar_mu);
    }
}

struct triad {
    float *a, *b, *c;
    int64_t n;
};

static void triad_fn(void *arg, int ith, int nth) {
    struct triad *t = arg;
    int64_t per = (t->n + nth - 1) / nth, s = per * ith, e = s + per < t->n ? s + per : t->n;
    for (int64_t i = s; i < e; i++) t->a[i] = t->b[i] + 3.0f * t->c[i];
}

static void fill_fn(void *arg, int ith, int nth) { /* first touch by the thread that streams it */
    struct triad *t = arg;
    int64_t per = (t->n + nth - 1) / nth, s = per * ith, e = s + per < t->n ? s + per : t->n;
    for (int64_t i = s; i < e; i++) {
        t->a[i] = 0;
        t->b[i] = 1;
        t->c[i] = 2;
    }
}

/* seconds one run of fn on the pool takes */
static double timed_run(struct toy_threadpool *tp, toy_task_fn fn, void *arg) {
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    toy_threadpool_run(tp, fn, arg);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
}

double toy_memory_bandwidth_gbs(struct toy_threadpool *tp) {
    struct triad t = {.n = 16 << 20};
    t.a = malloc((size_t)t.n * sizeof(float));
    t.b = malloc((size_t)t.n * sizeof(float));
    t.c = malloc((size_t)t.n * sizeof(float));
    double best = 1e30;
    if (t.a && t.b && t.c) {
        toy_threadpool_run(tp, fill_fn, &t);
        for (int r = 0; r < 5; r++) {
            double dt = timed_run(tp, triad_fn, &t);
            if (dt < best) best = dt;
        }
    }
    free(t.a);
    free(t.b);
    free(t.c);
    return best < 1e30 ? 3.0 * (double)t.n * sizeof(float) / best / 1e9 : 0;
}

struct rd {
    const float *a;
    int64_t n;
    int width; /* bytes per load */
    int ahead; /* bytes to prefetch ahead of the loads, or 0 */
    float sink[256];
};

/* Read loops with 16-, 32- and 64-byte loads, four independent sums each:
 * which width streams fastest depends on the CPU's prefetchers (on a Zen 4
 * the narrow loads, on an Emerald Rapids Xeon the wide ones, by 40%), so
 * the bound is the best of the widths the CPU has, each also with software
 * prefetches 2 KB ahead (as decode's kernels issue them where that pays:
 * toy_cpu_prefetch_ahead), so no kernel can stream faster than its bound
 * by asking for its bytes early. One body, compiled for each width
 * (GCC/clang vector types; the target attribute gives the registers). */
#define READ_LOOP(name, attr, bytes)                                                     \
    attr static float name(const float *a, int64_t s, int64_t e, int ahead) {            \
        typedef float vec __attribute__((vector_size(bytes), aligned(4)));               \
        enum { L = (bytes) / 4 };                                                        \
        vec a0 = {0}, a1 = a0, a2 = a0, a3 = a0;                                         \
        int64_t i = s;                                                                   \
        for (; i + 4 * L <= e; i += 4 * L) {                                             \
            if (ahead)                                                                   \
                for (int o = 0; o < 4 * (bytes); o += 64)                                \
                    __builtin_prefetch((const char *)(a + i) + ahead + o, 0, 3);         \
            a0 += *(const vec *)(a + i);                                                 \
            a1 += *(const vec *)(a + i + L);                                             \
            a2 += *(const vec *)(a + i + 2 * L);                                         \
            a3 += *(const vec *)(a + i + 3 * L);                                         \
        }                                                                                \
        vec t = a0 + a1 + a2 + a3;                                                       \
        float r = 0;                                                                     \
        for (int j = 0; j < L; j++) r += t[j];                                           \
        for (; i < e; i++) r += a[i];                                                    \
        return r;                                                                        \
    }
READ_LOOP(read16, , 16)
READ_LOOP(read32, __attribute__((target("avx2"))), 32)
READ_LOOP(read64, __attribute__((target("avx512f"))), 64)
#undef READ_LOOP

static void read_fn(void *arg, int ith, int nth) {
    struct rd *r = arg;
    int64_t per = (r->n + nth - 1) / nth, s = per * ith, e = s + per < r->n ? s + per : r->n;
    s = s / 64 * 64; /* 256-byte aligned shares (the buffer is) */
    e = ith == nth - 1 ? r->n : e / 64 * 64;
    float v = r->width == 64   ? read64(r->a, s, e, r->ahead)
              : r->width == 32 ? read32(r->a, s, e, r->ahead)
                               : read16(r->a, s, e, r->ahead);
    r->sink[ith & 255] = v; /* kept: the sums are the loop's only result */
}

static void zero_fn(void *arg, int ith, int nth) {
    struct rd *r = arg;
    int64_t per = (r->n + nth - 1) / nth, s = per * ith, e = s + per < r->n ? s + per : r->n;
    for (int64_t i = s; i < e; i++) ((float *)r->a)[i] = 1.0f;
}

/* The probe's buffers (ordinary pages, and the huge pages decode's packed
 * weights get: toy_stream_alloc), filled by the threads that read them,
 * and the loops it runs: every width the CPU has, each with and without
 * software prefetch. */
struct read_probe {
    struct rd r;
    float *bufs[2];
    size_t bytes;
    int widths[3], nw;
};

static bool read_probe_init(struct toy_threadpool *tp, struct read_probe *p) {
    memset(p, 0, sizeof *p);
    p->r.n = 64 << 20;
    p->bytes = (size_t)p->r.n * sizeof(float);
    p->bufs[1] = toy_stream_alloc(p->bytes);
    if (posix_memalign((void **)&p->bufs[0], 256, p->bytes)) p->bufs[0] = NULL;
    for (int b = 0; b < 2; b++)
        if (p->bufs[b]) {
            p->r.a = p->bufs[b];
            toy_threadpool_run(tp, zero_fn, &p->r);
        }
    __builtin_cpu_init();
    p->widths[p->nw++] = 16;
    if (__builtin_cpu_supports("avx2")) p->widths[p->nw++] = 32;
    if (__builtin_cpu_supports("avx512f")) p->widths[p->nw++] = 64;
    return p->bufs[0] || p->bufs[1];
}

static void read_probe_free(struct read_probe *p) {
    free(p->bufs[0]);
    toy_stream_free(p->bufs[1], p->bytes);
}

/* loop w of the 4 x nw: buffer w % 2, prefetch w / 2 % 2, width w / 4;
 * false where its buffer could not be had */
static bool read_probe_loop(struct read_probe *p, int w) {
    if (!(p->r.a = p->bufs[w % 2])) return false;
    p->r.width = p->widths[w / 4];
    p->r.ahead = w / 2 % 2 ? 2048 : 0;
    return true;
}

double toy_memory_read_rates(struct toy_threadpool *tp, double seconds, double *sustained) {
    struct read_probe p;
    double best = 1e30;
    if (sustained) *sustained = 0;
    if (read_probe_init(tp, &p))
        for (int k = 0, fastest = -1; k < 5; k++) { /* loops interleaved, so a change of phase hits all alike */
            for (int w = 0; w < 4 * p.nw; w++) {
                if (!read_probe_loop(&p, w)) continue;
                double dt = timed_run(tp, read_fn, &p.r);
                if (dt < best) best = dt, fastest = w;
            }
            if (k || !sustained) continue;
            /* after one round of each, the fastest back to back for as long as asked (at least once) */
            read_probe_loop(&p, fastest);
            double spent = 0;
            int64_t rounds = 0;
            do {
                double dt = timed_run(tp, read_fn, &p.r);
                if (dt < best) best = dt;
                spent += dt;
                rounds++;
            } while (spent < seconds);
            *sustained = (double)p.bytes * (double)rounds / spent / 1e9;
        }
    read_probe_free(&p);
    return best < 1e30 ? (double)p.bytes / best / 1e9 : 0;
}

double toy_memory_read_gbs(struct toy_threadpool *tp) { return toy_memory_read_rates(tp, 0, NULL); }
