/* bench-allreduce.c: the gradient all-reduce of toy/collective.h
 * (bucketed, non-blocking, polled against a deadline) against the peer it
 * wraps, one blocking MPI_Allreduce of the whole buffer, in the same run.
 *
 *   mpirun -np 2 build-mpi/bench/bench-allreduce [ITERS]
 *
 * For each size (4 KiB .. 64 MiB of f32, spread over 64 tensors like a
 * model's gradients) rank 0 prints the median time of toy's all-reduce
 * mean and of MPI_Allreduce (+ the 1/world scaling, for the same result),
 * the algorithm bandwidth (bytes / time) and the ratio. Without MPI (or
 * with one rank) it reports that there is nothing to measure. The figures
 * feed the cost model of docs/distributed.md. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "toy/collective.h"
#ifdef TOY_MPI
#include <mpi.h>
#endif

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    int iters = argc > 1 ? atoi(argv[1]) : 20;
    if (iters < 3) iters = 3;
    struct toy_collective *c;
    if (toy_collective_open(TOY_COLLECTIVE_AUTO, NULL, &c)) {
        fprintf(stderr, "bench-allreduce: %s\n", toy_last_error());
        return 1;
    }
    int rank = toy_collective_rank(c), world = toy_collective_world(c);
    if (world < 2) {
        printf("bench-allreduce: one rank (%s): nothing to measure; run it under mpirun -np 2 in a make MPI=1 build\n",
               toy_collective_name(c));
        toy_collective_close(c);
        return 0;
    }
    enum { NT = 64 };
    const int64_t sizes[] = {1 << 10, 1 << 14, 1 << 18, 1 << 20, 3279104, 1 << 22, 1 << 24}; /* floats */
    double *t_toy = malloc(sizeof(double) * (size_t)iters), *t_mpi = malloc(sizeof(double) * (size_t)iters);
    if (rank == 0)
        printf("%-10s %12s %12s %10s %10s %8s\n", "MB", "toy ms", "MPI ms", "toy GB/s", "MPI GB/s", "MPI/toy");
    for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
        int64_t n = sizes[si];
        float *all = malloc(sizeof(float) * (size_t)n);
        for (int64_t i = 0; i < n; i++) all[i] = (float)((i * 7 + rank) % 13);
        float *bufs[NT];
        int64_t counts[NT];
        for (int k = 0; k < NT; k++) {
            int64_t lo = n * k / NT, hi = n * (k + 1) / NT;
            bufs[k] = all + lo;
            counts[k] = hi - lo;
        }
        for (int it = 0; it < iters + 2; it++) {
            toy_collective_barrier(c);
            double t0 = now_s();
            if (toy_collective_allreduce_mean(c, bufs, counts, NT)) {
                fprintf(stderr, "bench-allreduce: %s\n", toy_last_error());
                toy_collective_close(c);
                return 1;
            }
            if (it >= 2) t_toy[it - 2] = now_s() - t0;
#ifdef TOY_MPI
            toy_collective_barrier(c);
            t0 = now_s();
            MPI_Allreduce(MPI_IN_PLACE, all, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            for (int64_t i = 0; i < n; i++) all[i] *= 1.0f / (float)world;
            if (it >= 2) t_mpi[it - 2] = now_s() - t0;
#else
            if (it >= 2) t_mpi[it - 2] = 0;
#endif
        }
        qsort(t_toy, (size_t)iters, sizeof(double), cmp_d);
        qsort(t_mpi, (size_t)iters, sizeof(double), cmp_d);
        double mt = t_toy[iters / 2], mm = t_mpi[iters / 2], mb = (double)n * 4 / 1e6;
        if (rank == 0)
            printf("%-10.3f %12.3f %12.3f %10.2f %10.2f %8.2f\n", mb, mt * 1e3, mm * 1e3, mb / 1e3 / mt,
                   mm > 0 ? mb / 1e3 / mm : 0, mm > 0 ? mm / mt : 0);
        free(all);
    }
    free(t_toy);
    free(t_mpi);
    toy_collective_close(c);
    return 0;
}
