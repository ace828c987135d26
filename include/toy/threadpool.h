/* toy/threadpool.h: a fixed pool of pthreads that run one parallel task at a
 * time. The caller's thread takes part as thread 0, so a pool of n threads
 * starts n-1 workers. Between tasks workers spin briefly, then sleep; they
 * spin far less while the caller is being preempted often (other work
 * wants the cores), where spinning would keep the caller off a core.
 *
 *     struct toy_threadpool *tp = toy_threadpool_new(0);  // the cores it may use
 *     toy_threadpool_run(tp, fn, arg);  // fn(arg, ith, nth) on each thread
 *     toy_threadpool_free(tp);
 */
#ifndef TOY_THREADPOOL_H
#define TOY_THREADPOOL_H

#ifdef __cplusplus
extern "C" {
#endif

struct toy_threadpool;

typedef void (*toy_task_fn)(void *arg, int ith, int nth);

/* n_threads <= 0: the number of cores this process may run on (its
 * affinity mask: taskset, a cpuset, an MPI binding; else every online
 * core); $TOY_THREADS overrides. NULL on failure. */
struct toy_threadpool *toy_threadpool_new(int n_threads);
/* The number of threads toy_threadpool_new(n_threads) starts. */
int toy_threads_resolve(int n_threads);
void toy_threadpool_free(struct toy_threadpool *tp);
int toy_threadpool_size(const struct toy_threadpool *tp);
/* Runs fn on every thread of the pool and returns when all are done.
 * tp NULL runs fn(arg, 0, 1). Not reentrant. */
void toy_threadpool_run(struct toy_threadpool *tp, toy_task_fn fn, void *arg);
/* Inside a task (fn of toy_threadpool_run), by thread ith: returns once
 * every thread of the pool has called it, so that what each wrote before
 * is seen by all after. Every thread must call it the same number of
 * times in a task. Waiting spins as a worker does between tasks, then
 * sleeps. */
void toy_threadpool_barrier(struct toy_threadpool *tp, int ith);
/* How many times so far the pool found its cores shared with other work
 * (its caller preempted hundreds of times a second, over two looks of
 * 50 ms or more in a row): 0 on a quiet machine. Speeds measured while it
 * grows are the machine's load as much as toy's. */
long toy_threadpool_shared(const struct toy_threadpool *tp);
/* Number of online cores. */
int toy_num_cores(void);
/* The bytes of last-level cache all online cores have together: the
 * distinct caches of the highest level the kernel lists for them
 * (/sys/devices/system/cpu), or glibc's figure where it lists none; 0
 * when neither can tell. (glibc alone can be far off: on a 2-vCPU VM of
 * an EPYC host it said 320 MiB, the kernel 32 MiB.) toy_llc_bytes_at reads
 * a tree laid out like that directory, with no fallback. */
long toy_llc_bytes(void);
long toy_llc_bytes_at(const char *cpu_dir);
/* Memory bandwidth the pool's threads reach now, in GB/s: a STREAM-style
 * triad (a = b + s c) over 3 x 64 MB, best of 5 (what decode speed is
 * bounded by; benchmarks state their decode figures against it). 0 when
 * the buffers cannot be allocated. */
double toy_memory_bandwidth_gbs(struct toy_threadpool *tp);
/* Read-only memory bandwidth of the pool's threads, in GB/s: a sum over
 * 256 MB with 16-, 32- and 64-byte loads (those the CPU has), the best of
 * 5 rounds of each. What a decode step does (it only reads the weights);
 * which load width streams fastest depends on the CPU (Zen 4: the narrow,
 * Emerald Rapids: the wide ones, by ~40%). */
double toy_memory_read_gbs(struct toy_threadpool *tp);
/* The same, and (sustained not NULL) in the same pass over the same
 * buffers, the rate they sustain for `seconds` (at least one round of
 * 256 MB): after one round of each loop, the fastest run back to back,
 * total bytes over total time. The best round is a peak of a few ms; a
 * decode run's rate is an average over its whole length, and is fairly
 * compared with this, taken over as long right after it. 0s when the
 * buffers cannot be allocated. */
double toy_memory_read_rates(struct toy_threadpool *tp, double seconds, double *sustained);

#ifdef __cplusplus
}
#endif
#endif
