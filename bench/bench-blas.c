/* bench-blas.c: OpenBLAS versus BLIS SGEMM on the engine's shapes, both
 * loaded with dlopen into one process (their cblas_sgemm symbols clash when
 * linked). This is the measurement behind toy's choice of OpenBLAS.
 * Skips a library that is not installed (BLIS: Debian libblis4-pthread). */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef void (*sgemm_fn)(int, int, int, int, int, int, float, const float *, int, const float *, int, float,
                         float *, int);

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double run(sgemm_fn f, int M, int K, int N, float *a, float *b, float *c) {
    double best = 1e30;
    for (int rep = 0; rep < 5; rep++) {
        int iters = N > 10000 ? 2 : 10;
        double t0 = now();
        for (int i = 0; i < iters; i++) f(101, 111, 112, M, N, K, 1.0f, a, K, b, K, 0.0f, c, N); /* RowMajor, N, T */
        double dt = (now() - t0) / iters;
        if (dt < best) best = dt;
    }
    return 2.0 * M * N * K / best / 1e9;
}

int main(int argc, char **argv) {
    int nth = argc > 1 ? atoi(argv[1]) : 2;
    char nbuf[16];
    snprintf(nbuf, sizeof nbuf, "%d", nth);
    setenv("BLIS_NUM_THREADS", nbuf, 1);
    setenv("OPENBLAS_NUM_THREADS", nbuf, 1);
    const char *libs[][2] = {{"OpenBLAS", "libopenblas.so.0"},
                             {"BLIS", "libblis.so.4"}};
    int shapes[][3] = {{256, 576, 1536}, {256, 576, 49152}};
    float *a = malloc(sizeof(float) * 256 * 576), *b = malloc(sizeof(float) * 49152 * 576),
          *c = malloc(sizeof(float) * 256 * 49152);
    for (long i = 0; i < 256L * 576; i++) a[i] = (float)(i % 7) * 0.1f;
    for (long i = 0; i < 49152L * 576; i++) b[i] = (float)(i % 5) * 0.1f;
    for (int l = 0; l < 2; l++) {
        void *h = dlopen(libs[l][1], RTLD_NOW | RTLD_LOCAL);
        if (!h) { printf("blas: %s not installed, skipped\n", libs[l][0]); continue; }
        sgemm_fn f = (sgemm_fn)dlsym(h, "cblas_sgemm");
        if (!f) { printf("blas: %s has no cblas_sgemm\n", libs[l][0]); continue; }
        for (int s = 0; s < 2; s++)
            printf("blas: %-8s sgemm %dx%dx%d, %d threads: %.1f GFLOPS\n", libs[l][0], shapes[s][0], shapes[s][1],
                   shapes[s][2], nth, run(f, shapes[s][0], shapes[s][1], shapes[s][2], a, b, c));
    }
    free(a);
    free(b);
    free(c);
    return 0;
}
