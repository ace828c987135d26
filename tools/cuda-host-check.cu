/* cuda-host-check.cu: the parts of the CUDA backend's device code that are
 * plain arithmetic, run on the host (no GPU needed) against the CPU
 * library: the in-kernel dequantizers of every quantized type the CUDA
 * backend reads, index unravelling, and the tiling of the attention
 * kernels: every (query, key) pair the causal / sliding-window mask allows
 * is visited exactly once by the tiled forward / dQ walk and by the tiled
 * dK / dV walk, for many shapes and tile sizes. Built and run by
 * `make CUDA=1 cuda-host-check` (and by CI wherever nvcc exists). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "backends/cuda/kernels-common.cuh"
/* the attention kernels' range logic (the file's extern "C" launchers take
 * the place of the library's copies in this program) */
#include "backends/cuda/kernels-attention.cu"

extern "C" {
#include "toy/quant.h"
#include "toy/rng.h"
}

int main(void) {
    int fails = 0;
    struct toy_rng r;
    toy_rng_seed(&r, 1);
    const int types[] = {TOY_Q8_0, TOY_Q4_0, TOY_Q4_1, TOY_Q5_0, TOY_Q5_1, TOY_Q4_K, TOY_Q5_K, TOY_Q6_K};
    const int64_t n = 1024;
    float *x = (float *)malloc(n * sizeof(float)), *ref = (float *)malloc(n * sizeof(float));
    char *q = (char *)malloc(8 * n);
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        int t = types[ti];
        for (int64_t i = 0; i < n; i++) x[i] = 3.0f * (toy_rng_uniform(&r) - 0.5f) + (i % 7 == 0 ? 2.0f : 0.0f);
        if (toy_quantize_row((enum toy_dtype)t, x, q, n) || toy_dequantize_row_ref((enum toy_dtype)t, q, ref, n)) {
            printf("%s: cannot quantize: %s\n", toy_dtype_name((enum toy_dtype)t), toy_last_error());
            fails++;
            continue;
        }
        int bad = 0;
        for (int64_t i = 0; i < n; i++) {
            float v = ld_row(t, q, i, 0);
            if (v != ref[i]) {
                if (bad++ < 3)
                    printf("%s: element %lld: device decoder %g, CPU %g\n", toy_dtype_name((enum toy_dtype)t),
                           (long long)i, v, ref[i]);
            }
        }
        printf("%-5s %s (%lld elements)\n", toy_dtype_name((enum toy_dtype)t), bad ? "DIFFERS" : "matches the CPU",
               (long long)n);
        fails += bad != 0;
    }
    int64_t ne[4] = {5, 3, 4, 2}, idx[4];
    for (int64_t e = 0; e < 120; e++) {
        unravel4(e, ne, idx);
        if (idx[0] + 5 * (idx[1] + 3 * (idx[2] + 4 * idx[3])) != e) fails++;
    }
    /* attention tiling */
    int shapes = 0, bad_shapes = 0;
    const int tqs[] = {1, 5, 8, 9, 17, 33, 70};
    for (int causal = 0; causal < 2; causal++)
        for (size_t qi = 0; qi < sizeof tqs / sizeof tqs[0]; qi++)
            for (int extra = 0; extra < 3; extra++)
                for (int window = 0; window < 10; window += 3)
                    for (int nt = 16; nt <= 64; nt *= 2) {
                        at a = {};
                        a.Tq = tqs[qi];
                        a.Tk = a.Tq + (extra == 0 ? 0 : extra == 1 ? 3 : 40);
                        a.off = a.Tk - a.Tq;
                        a.causal = causal;
                        a.window = window;
                        int64_t Tq = a.Tq, Tk = a.Tk;
                        int *want = (int *)calloc((size_t)(Tq * Tk), sizeof(int));
                        int *fwd = (int *)calloc((size_t)(Tq * Tk), sizeof(int));
                        int *bwd = (int *)calloc((size_t)(Tq * Tk), sizeof(int));
                        for (int64_t t = 0; t < Tq; t++) {
                            int64_t j0, j1;
                            key_range(a, t, &j0, &j1);
                            for (int64_t j = j0; j < j1; j++) want[t * Tk + j] = 1;
                        }
                        for (int64_t t0 = 0; t0 < Tq; t0 += TW) { /* forward, dQ */
                            int64_t t1 = t0 + TW < Tq ? t0 + TW : Tq, js, je;
                            block_keys(a, t0, t1, &js, &je);
                            for (int64_t jt = js; jt < je; jt += nt) {
                                int64_t n = je - jt < nt ? je - jt : nt;
                                for (int64_t t = t0; t < t1; t++) {
                                    int64_t j0, j1;
                                    key_range(a, t, &j0, &j1);
                                    int64_t lo = j0 > jt ? j0 : jt, hi = j1 < jt + n ? j1 : jt + n;
                                    for (int64_t j = lo; j < hi; j++) fwd[t * Tk + j]++;
                                }
                            }
                        }
                        for (int64_t jb0 = 0; jb0 < Tk; jb0 += TW) { /* dK, dV */
                            int64_t jb1 = jb0 + TW < Tk ? jb0 + TW : Tk, bs, be;
                            block_queries(a, jb0, jb1, &bs, &be);
                            for (int64_t tt = bs; tt < be; tt += nt) {
                                int64_t n = be - tt < nt ? be - tt : nt;
                                for (int64_t j = jb0; j < jb1; j++) {
                                    int64_t q0, q1;
                                    query_range(a, j, &q0, &q1);
                                    int64_t lo = q0 > tt ? q0 : tt, hi = q1 < tt + n ? q1 : tt + n;
                                    for (int64_t t = lo; t < hi; t++) bwd[t * Tk + j]++;
                                }
                            }
                        }
                        int off = 0;
                        for (int64_t e = 0; e < Tq * Tk; e++) off += fwd[e] != want[e] || bwd[e] != want[e];
                        if (off && bad_shapes++ < 3)
                            printf("attention tiling: Tq %lld Tk %lld causal %d window %d tile %d: %d pairs differ\n",
                                   (long long)Tq, (long long)Tk, causal, window, nt, off);
                        shapes++;
                        free(want);
                        free(fwd);
                        free(bwd);
                    }
    printf("attention tiling: %d of %d shapes visit every allowed (query, key) pair exactly once\n",
           shapes - bad_shapes, shapes);
    fails += bad_shapes;
    printf("%s\n", fails ? "cuda-host-check: FAILED" : "cuda-host-check: ok");
    free(x);
    free(ref);
    free(q);
    return fails ? 1 : 0;
}
