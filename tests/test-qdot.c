/* test-qdot.c: the quantized dot products behind Q8_0/Q4_0 decode: every
 * SIMD level against the plain C reference on random blocks (integer sums
 * are exact; only the float accumulation order differs: 1e-5 relative), and
 * a one-row matmul over Q8_0 / Q4_0 weights against the dequantize + f32
 * product (the activations are quantized to Q8_0, as llama.cpp does: within
 * 1% of the output's RMS). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>

#include "backends/cpu/qdot.h"
#include "toy/quant.h"
#include "toy/rng.h"
#include "toy/toy.h"

static void kernels_match(const char *level) {
    if (level) setenv("TOY_SIMD", level, 1);
    toy_qdot_init();
    struct toy_rng r;
    toy_rng_seed(&r, 3);
    const int64_t n = 32 * 37;
    float *w = malloc(n * sizeof *w), *x = malloc(n * sizeof *x);
    uint8_t *w8 = malloc(n / 32 * 34), *w4 = malloc(n / 32 * 18), *x8 = malloc(n / 32 * 34);
    for (int rep = 0; rep < 20; rep++) {
        for (int64_t i = 0; i < n; i++) { w[i] = toy_rng_normal(&r) * (1 + rep); x[i] = toy_rng_normal(&r); }
        cr_assert_eq(toy_quantize_row(TOY_Q8_0, w, w8, n), TOY_OK);
        cr_assert_eq(toy_quantize_row(TOY_Q4_0, w, w4, n), TOY_OK);
        toy_qdot.quantize_q8_0(x, x8, n);
        float a = toy_qdot.q8_0(w8, x8, n), b = toy_qdot_q8_0_ref(w8, x8, n);
        cr_assert(fabsf(a - b) <= 1e-5f * (1 + fabsf(b)), "%s q8_0: %g vs %g", level ? level : "best", a, b);
        a = toy_qdot.q4_0(w4, x8, n);
        b = toy_qdot_q4_0_ref(w4, x8, n);
        cr_assert(fabsf(a - b) <= 1e-5f * (1 + fabsf(b)), "%s q4_0: %g vs %g", level ? level : "best", a, b);
    }
    free(w); free(x); free(w8); free(w4); free(x8);
}

Test(qdot, best_level_matches_reference) { kernels_match(NULL); }
Test(qdot, avx2_matches_reference) { kernels_match("avx2"); }

static void gemv_case(enum toy_dtype type) {
    struct toy_ctx *ctx = toy_ctx_init(true);
    struct toy_rng r;
    toy_rng_seed(&r, 5);
    const int64_t k = 576, n = 300;
    float *wf = malloc((size_t)(k * n) * sizeof *wf);
    for (int64_t i = 0; i < k * n; i++) wf[i] = toy_rng_normal(&r) * 0.05f;
    struct toy_tensor *w = toy_new_tensor_2d(ctx, type, k, n), *x = toy_new_tensor_2d(ctx, TOY_F32, k, 1);
    for (int64_t j = 0; j < n; j++) toy_quantize_row(type, wf + j * k, (char *)w->data + j * w->nb[1], k);
    for (int64_t i = 0; i < k; i++) ((float *)x->data)[i] = toy_rng_normal(&r);
    struct toy_tensor *y = toy_linear(ctx, x, w, NULL);
    toy_set_output(y);
    struct toy_graph *g = toy_graph_new(ctx);
    toy_graph_build(g, y);
    struct toy_threadpool *tp = toy_threadpool_new(2);
    cr_assert_eq(toy_graph_compute(g, tp), TOY_OK);
    double err = 0, rms = 0;
    float *row = malloc(k * sizeof *row);
    for (int64_t j = 0; j < n; j++) {
        toy_dequantize_row(type, (char *)w->data + j * w->nb[1], row, k);
        double ref = 0;
        for (int64_t i = 0; i < k; i++) ref += (double)row[i] * ((float *)x->data)[i];
        err += pow(((float *)y->data)[j] - ref, 2);
        rms += ref * ref;
    }
    cr_assert_leq(sqrt(err / rms), 1e-2, "%s: relative RMS error %g", toy_dtype_name(type), sqrt(err / rms));
    free(row); free(wf);
    toy_threadpool_free(tp);
    toy_ctx_free(ctx);
}

Test(qdot, gemv_q8_0) { gemv_case(TOY_Q8_0); }
Test(qdot, gemv_q4_0) { gemv_case(TOY_Q4_0); }
