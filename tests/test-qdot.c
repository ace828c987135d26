/* test-qdot.c: the quantized dot products behind Q8_0/Q4_0 decode: every
 * SIMD level against the plain C reference on random blocks (integer sums
 * are exact; only the float accumulation order differs: 1e-5 relative), and
 * a one-row matmul over Q8_0 / Q4_0 weights against the dequantize + f32
 * product (the activations are quantized to Q8_0, as llama.cpp does: within
 * 1% of the output's RMS). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/cpu-impl.h" /* toy_cpu_work_size, struct toy_graph */
#include "backends/cpu/qdot.h"
#include "toy/quant.h"
#include "toy/rng.h"
#include "toy/toy.h"

/* k floats as a row of type t (toy's quantizers, which write every packed type) */
static void weight_row(enum toy_dtype t, const float *w, void *dst, int64_t k) {
    cr_assert_eq(toy_quantize_row(t, w, dst, k), TOY_OK, "%s: %s", toy_dtype_name(t), toy_last_error());
}

static void kernels_match(const char *level) {
    if (level) setenv("TOY_SIMD", level, 1);
    toy_qdot_init();
    struct toy_rng r;
    toy_rng_seed(&r, 3);
    const int64_t n = 32 * 37;
    float *w = malloc(n * sizeof *w), *x = malloc(n * sizeof *x);
    uint8_t *w8 = malloc(n / 32 * 34), *w4 = malloc(n / 32 * 18), *x8 = malloc(n / 32 * 34), *xr = malloc(n / 32 * 34);
    for (int rep = 0; rep < 20; rep++) {
        for (int64_t i = 0; i < n; i++) { w[i] = toy_rng_normal(&r) * (1 + rep); x[i] = toy_rng_normal(&r); }
        cr_assert_eq(toy_quantize_row(TOY_Q8_0, w, w8, n), TOY_OK);
        cr_assert_eq(toy_quantize_row(TOY_Q4_0, w, w4, n), TOY_OK);
        if (rep == 0) /* ties: scaled values k + 1/2 exactly (d = 1), rounded away from zero */
            for (int64_t i = 0; i < 32; i++) x[i] = i ? (float)(i - 16) + 0.5f : 127.0f;
        toy_qdot.quantize_q8_0(x, x8, n);
        toy_quantize_q8_0_ref(x, xr, n);
        cr_assert(memcmp(x8, xr, (size_t)(n / 32 * 34)) == 0, "%s: Q8_0 quantization differs from the reference",
                  level ? level : "best");
        float a = toy_qdot.q8_0(w8, x8, n), b = toy_qdot_q8_0_ref(w8, x8, n);
        cr_assert(fabsf(a - b) <= 1e-5f * (1 + fabsf(b)), "%s q8_0: %g vs %g", level ? level : "best", a, b);
        a = toy_qdot.q4_0(w4, x8, n);
        b = toy_qdot_q4_0_ref(w4, x8, n);
        cr_assert(fabsf(a - b) <= 1e-5f * (1 + fabsf(b)), "%s q4_0: %g vs %g", level ? level : "best", a, b);
    }
    free(w); free(x); free(w8); free(w4); free(x8); free(xr);
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

/* The int8 GEMM (prefill, batched serving) equals its reference bit for bit:
 * block dots are exact integers and both accumulate the blocks in order with
 * one fused multiply-add each. Shapes cover row tails (m % 4), column tails
 * (n % 16, n % 32), one block and many, and accumulation into C. */
static void qgemm_case(enum toy_dtype type, int64_t m, int64_t n, int64_t k, bool accum) {
    struct toy_rng r;
    toy_rng_seed(&r, (uint64_t)(m * 1000003 + n * 1009 + k));
    size_t ldb = toy_row_bytes(type, k);
    float *a = malloc((size_t)(m * k) * sizeof *a), *w = malloc((size_t)k * sizeof *w);
    float *c = malloc((size_t)(m * n) * sizeof *c), *cr = malloc((size_t)(m * n) * sizeof *cr);
    uint8_t *b = malloc(ldb * (size_t)n);
    for (int64_t i = 0; i < m * k; i++) a[i] = toy_rng_normal(&r) * (i % 7 == 0 ? 4.0f : 1.0f);
    for (int64_t j = 0; j < n; j++) {
        for (int64_t i = 0; i < k; i++) w[i] = toy_rng_normal(&r) * 0.1f;
        weight_row(type, w, b + (size_t)j * ldb, k);
    }
    for (int64_t i = 0; i < m * n; i++) c[i] = cr[i] = toy_rng_normal(&r);
    void *scratch = NULL;
    cr_assert_eq(posix_memalign(&scratch, 64, toy_qgemm_scratch(m, k)), 0);
    toy_qdot.qgemm(type, m, n, k, a, k, b, ldb, c, n, accum, scratch);
    toy_qgemm_ref(type, m, n, k, a, k, b, ldb, cr, n, accum);
    for (int64_t i = 0; i < m * n; i++)
        cr_assert(c[i] == cr[i], "%s m %lld n %lld k %lld: c[%lld] = %.9g, reference %.9g", toy_dtype_name(type),
                  (long long)m, (long long)n, (long long)k, (long long)i, c[i], cr[i]);
    free(scratch); free(a); free(w); free(c); free(cr); free(b);
}

Test(qdot, qgemm_matches_reference_exactly) {
    unsetenv("TOY_SIMD");
    toy_qdot_init();
    if (!toy_qdot.qgemm) cr_skip_test("no AVX-512 VNNI on this CPU");
    const int64_t shapes[][3] = {{9, 16, 32}, {13, 33, 576}, {4, 7, 64}, {1, 48, 96}, {17, 100, 1536}, {64, 192, 576}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int acc = 0; acc < 2; acc++) {
            qgemm_case(TOY_Q8_0, shapes[s][0], shapes[s][1], shapes[s][2], acc);
            qgemm_case(TOY_Q4_0, shapes[s][0], shapes[s][1], shapes[s][2], acc);
        }
}

/* Through the graph: a 40-row linear over quantized weights (the qgemm
 * path, rows split between threads, batches flattened) equals the
 * reference; with a backward pass the same product runs exactly in f32. */
static void qgemm_graph_case(enum toy_dtype type) {
    struct toy_ctx *ctx = toy_ctx_init(true);
    struct toy_rng r;
    toy_rng_seed(&r, 11);
    const int64_t k = 576, n = 200, T = 20, B = 2;
    float *wf = malloc((size_t)(k * n) * sizeof *wf);
    for (int64_t i = 0; i < k * n; i++) wf[i] = toy_rng_normal(&r) * 0.05f;
    struct toy_tensor *w = toy_new_tensor_2d(ctx, type, k, n), *x = toy_new_tensor_3d(ctx, TOY_F32, k, T, B);
    for (int64_t j = 0; j < n; j++) toy_quantize_row(type, wf + j * k, (char *)w->data + j * w->nb[1], k);
    for (int64_t i = 0; i < k * T * B; i++) ((float *)x->data)[i] = toy_rng_normal(&r);
    struct toy_tensor *y = toy_linear(ctx, x, w, NULL);
    toy_set_output(y);
    struct toy_graph *g = toy_graph_new(ctx);
    toy_graph_build(g, y);
    struct toy_threadpool *tp = toy_threadpool_new(2);
    cr_assert_eq(toy_graph_compute(g, tp), TOY_OK);
    float *ref = malloc((size_t)(n * T * B) * sizeof *ref);
    toy_qgemm_ref(type, T * B, n, k, x->data, k, w->data, w->nb[1], ref, n, false);
    for (int64_t i = 0; i < n * T * B; i++)
        cr_assert(((float *)y->data)[i] == ref[i], "%s: y[%lld] = %.9g, reference %.9g", toy_dtype_name(type),
                  (long long)i, ((float *)y->data)[i], ref[i]);
    free(ref); free(wf);
    toy_threadpool_free(tp);
    toy_ctx_free(ctx);
}

Test(qdot, qgemm_graph_q8_0) {
    unsetenv("TOY_SIMD");
    toy_qdot_init();
    if (!toy_qdot.qgemm) cr_skip_test("no AVX-512 VNNI on this CPU");
    qgemm_graph_case(TOY_Q8_0);
}
Test(qdot, qgemm_graph_q4_0) {
    unsetenv("TOY_SIMD");
    toy_qdot_init();
    if (!toy_qdot.qgemm) cr_skip_test("no AVX-512 VNNI on this CPU");
    qgemm_graph_case(TOY_Q4_0);
}

/* Every SIMD level quantizes activations to the same bytes as the reference
 * (scales round to nearest even in f16, values round half away from zero),
 * including ties, zero blocks and blocks small enough for f16 subnormals. */
Test(qdot, quantize_matches_reference_exactly) {
    const char *levels[] = {NULL, "avx2"};
    for (int l = 0; l < 2; l++) {
        if (levels[l]) setenv("TOY_SIMD", levels[l], 1);
        else unsetenv("TOY_SIMD");
        toy_qdot_init();
        struct toy_rng r;
        toy_rng_seed(&r, 17);
        const int64_t n = 32 * 64;
        float *x = malloc(n * sizeof *x);
        uint8_t *a = malloc(n / 32 * 34), *b = malloc(n / 32 * 34);
        for (int rep = 0; rep < 50; rep++) {
            float scale = rep % 5 == 0 ? 1e-6f : rep % 5 == 1 ? 1e4f : 1.0f;
            for (int64_t i = 0; i < n; i++) x[i] = toy_rng_normal(&r) * scale;
            for (int64_t i = 0; i < 32; i++) x[i] = 0;                         /* a zero block */
            for (int64_t i = 32; i < 64; i++) x[i] = (float)(i - 48) * 0.5f; /* exact ties */
            toy_qdot.quantize_q8_0(x, a, n);
            toy_quantize_q8_0_ref(x, b, n);
            for (int64_t i = 0; i < n / 32 * 34; i++)
                cr_assert_eq(a[i], b[i], "%s rep %d: byte %lld differs", levels[l] ? levels[l] : "best", rep,
                             (long long)i);
        }
        free(x); free(a); free(b);
    }
    unsetenv("TOY_SIMD");
    toy_qdot_init();
}

/* The packed layout (toy_qpack, what toy_tensor_pack builds for inference)
 * gives the reference's results bit for bit at every row count, so a
 * sequence's logits do not depend on how many rows run with it. */
static void qpacked_case(enum toy_dtype type, int64_t m, int64_t n, int64_t k, bool accum) {
    struct toy_rng r;
    toy_rng_seed(&r, (uint64_t)(m * 104729 + n * 13 + k));
    size_t ldb = toy_row_bytes(type, k);
    float *a = malloc((size_t)(m * k) * sizeof *a), *w = malloc((size_t)k * sizeof *w);
    float *c = malloc((size_t)(m * n) * sizeof *c), *cr = malloc((size_t)(m * n) * sizeof *cr);
    uint8_t *b = malloc(ldb * (size_t)n);
    for (int64_t i = 0; i < m * k; i++) a[i] = toy_rng_normal(&r);
    for (int64_t j = 0; j < n; j++) {
        for (int64_t i = 0; i < k; i++) w[i] = toy_rng_normal(&r) * 0.1f;
        weight_row(type, w, b + (size_t)j * ldb, k);
    }
    for (int64_t i = 0; i < m * n; i++) c[i] = cr[i] = toy_rng_normal(&r);
    void *scratch = NULL, *pk = NULL;
    cr_assert_eq(posix_memalign(&scratch, 64, toy_qgemm_scratch(m, k)), 0);
    cr_assert_eq(posix_memalign(&pk, 64, toy_qpack_bytes(type, n, k)), 0);
    toy_qpack(type, n, k, b, ldb, pk);
    toy_qdot.qgemm_packed(type, m, n, k, a, k, pk, c, n, accum, scratch, NULL);
    toy_qgemm_ref(type, m, n, k, a, k, b, ldb, cr, n, accum);
    for (int64_t i = 0; i < m * n; i++)
        cr_assert(c[i] == cr[i], "%s packed m %lld n %lld k %lld: c[%lld] = %.9g, reference %.9g",
                  toy_dtype_name(type), (long long)m, (long long)n, (long long)k, (long long)i, c[i], cr[i]);
    free(scratch); free(pk); free(a); free(w); free(c); free(cr); free(b);
}

/* loads: "narrow" or "wide" (toy_cpu_wide_loads, read once per process;
 * each test is one), ahead: bytes to prefetch ahead ($TOY_PREFETCH, read
 * the same way); NULL for the CPU's own choice */
static void qpacked_cases_at(const char *level, const char *loads, const char *ahead) {
    if (level) setenv("TOY_SIMD", level, 1);
    else unsetenv("TOY_SIMD");
    if (loads) setenv("TOY_LOADS", loads, 1);
    if (ahead) setenv("TOY_PREFETCH", ahead, 1);
    toy_qdot_init();
    if (!toy_qdot.qgemm_packed) cr_skip_test("no int8 kernels (AVX2 or AVX-512 VNNI) on this CPU");
    const int64_t shapes[][3] = {{1, 1, 32},   {1, 17, 288}, {2, 20, 64},   {3, 33, 576}, {5, 40, 96}, {6, 16, 128},
                                 {7, 33, 64}, {8, 64, 1536}, {13, 100, 96}, {40, 48, 64}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int acc = 0; acc < 2; acc++) {
            qpacked_case(TOY_Q8_0, shapes[s][0], shapes[s][1], shapes[s][2], acc);
            qpacked_case(TOY_Q4_0, shapes[s][0], shapes[s][1], shapes[s][2], acc);
            qpacked_case(TOY_Q5_0, shapes[s][0], shapes[s][1], shapes[s][2], acc);
            qpacked_case(TOY_Q4_1, shapes[s][0], shapes[s][1], shapes[s][2], acc);
            qpacked_case(TOY_Q5_1, shapes[s][0], shapes[s][1], shapes[s][2], acc);
            qpacked_case(TOY_IQ4_NL, shapes[s][0], shapes[s][1], shapes[s][2], acc);
            qpacked_case(TOY_MXFP4, shapes[s][0], shapes[s][1], shapes[s][2], acc);
        }
    /* Q4_K: 256-element super-blocks, a scale and a min per 32. Packed,
     * 4.625 bits a weight (the file's 4.5, the 16 rows' d and dmin in f16,
     * each scale and min a byte): decode streams these bytes */
    cr_assert_eq(toy_qpack_bytes(TOY_Q4_K, 32, 512), 2 * 2 * 2368);
    cr_assert_leq((double)toy_qpack_bytes(TOY_Q4_K, 1024, 4096), 1.03 * 1024 * toy_row_bytes(TOY_Q4_K, 4096));
    /* Q6_K: 6.625 bits a weight against the file's 6.5625 */
    cr_assert_eq(toy_qpack_bytes(TOY_Q6_K, 32, 512), 2 * 2 * 3392);
    cr_assert_leq((double)toy_qpack_bytes(TOY_Q6_K, 1024, 4096), 1.01 * 1024 * toy_row_bytes(TOY_Q6_K, 4096));
    /* Q5_0 as the file, Q5_K 5.625 against 5.5 */
    cr_assert_eq(toy_qpack_bytes(TOY_Q5_0, 1024, 4096), 1024 * toy_row_bytes(TOY_Q5_0, 4096));
    cr_assert_eq(toy_qpack_bytes(TOY_Q4_1, 1024, 4096), 1024 * toy_row_bytes(TOY_Q4_1, 4096));
    cr_assert_eq(toy_qpack_bytes(TOY_Q5_1, 1024, 4096), 1024 * toy_row_bytes(TOY_Q5_1, 4096));
    cr_assert_leq((double)toy_qpack_bytes(TOY_Q5_K, 1024, 4096), 1.03 * 1024 * toy_row_bytes(TOY_Q5_K, 4096));
    /* IQ4_NL as the file, IQ4_XS 4.375 bits a weight against 4.25 */
    cr_assert_eq(toy_qpack_bytes(TOY_IQ4_NL, 1024, 4096), 1024 * toy_row_bytes(TOY_IQ4_NL, 4096));
    /* MXFP4 as the file too (a scale byte and 16 of nibbles a block) */
    cr_assert_eq(toy_qpack_bytes(TOY_MXFP4, 1024, 4096), 1024 * toy_row_bytes(TOY_MXFP4, 4096));
    cr_assert_leq((double)toy_qpack_bytes(TOY_IQ4_XS, 1024, 4096), 1.03 * 1024 * toy_row_bytes(TOY_IQ4_XS, 4096));
    /* Q3_K 3.625 against 3.4375 */
    cr_assert_leq((double)toy_qpack_bytes(TOY_Q3_K, 1024, 4096), 1.06 * 1024 * toy_row_bytes(TOY_Q3_K, 4096));
    cr_assert_eq(toy_qpack_bytes(TOY_Q2_K, 1024, 4096), 1024 * toy_row_bytes(TOY_Q2_K, 4096)); /* as the file */
    const int64_t kshapes[][3] = {{1, 17, 256}, {3, 33, 512}, {8, 64, 1536}, {13, 100, 256}, {40, 48, 768}};
    for (size_t s = 0; s < sizeof kshapes / sizeof kshapes[0]; s++)
        for (int acc = 0; acc < 2; acc++) {
            qpacked_case(TOY_Q4_K, kshapes[s][0], kshapes[s][1], kshapes[s][2], acc);
            qpacked_case(TOY_Q5_K, kshapes[s][0], kshapes[s][1], kshapes[s][2], acc);
            qpacked_case(TOY_Q6_K, kshapes[s][0], kshapes[s][1], kshapes[s][2], acc);
            qpacked_case(TOY_IQ4_XS, kshapes[s][0], kshapes[s][1], kshapes[s][2], acc);
            qpacked_case(TOY_Q3_K, kshapes[s][0], kshapes[s][1], kshapes[s][2], acc);
            qpacked_case(TOY_Q2_K, kshapes[s][0], kshapes[s][1], kshapes[s][2], acc);
        }
}
static void qpacked_cases(const char *loads, const char *ahead) { qpacked_cases_at(NULL, loads, ahead); }
Test(qdot, qgemm_packed_matches_reference_exactly) { qpacked_cases(NULL, NULL); }
/* the AVX2 kernels (qgemm-avx2.c: vpmaddubsw in place of vpdpbusd), which
 * CPUs without AVX-512 VNNI run */
Test(qdot, qgemm_packed_avx2_matches_reference_exactly) { qpacked_cases_at("avx2", NULL, NULL); }
Test(qdot, qgemm_packed_avx2_prefetching_ahead_matches_reference_exactly) { qpacked_cases_at("avx2", NULL, "4096"); }
Test(qdot, qgemm_packed_narrow_loads_match_reference_exactly) { qpacked_cases("narrow", "0"); }
Test(qdot, qgemm_packed_wide_loads_match_reference_exactly) { qpacked_cases("wide", "0"); }
Test(qdot, qgemm_packed_prefetching_ahead_matches_reference_exactly) { qpacked_cases("narrow", "4096"); }
Test(qdot, qgemm_packed_wide_loads_prefetching_ahead_match_reference_exactly) { qpacked_cases("wide", "4096"); }

/* Weights at their extremes against activations at +-127: the largest
 * sums the kernels' integer steps can meet (the AVX2 kernels add products
 * in int16 and must never saturate), still the reference's bits. Every
 * byte 0xff (nibbles 15, fifth and top bits set, 6-bit scales and mins 63,
 * Q6_K's scales -1), Q8_0's values -128 or 127; the f16 scales 1, and
 * MXFP4's E8M0 ones 128 (d = 1) with nibbles 15 (-12) or 7 (12). */
static void extreme_case(enum toy_dtype type, uint8_t fill, float xv) {
    const int64_t m = 5, n = 20, k = 512;
    size_t ldb = toy_row_bytes(type, k), bs = toy_dtype_type_size(type); /* a block's bytes */
    uint8_t *b = malloc(ldb * (size_t)n);
    memset(b, fill, ldb * (size_t)n);
    const toy_f16 one = toy_f32_to_f16(1.0f);
    int halves[2] = {0, type == TOY_Q4_1 || type == TOY_Q5_1 || type == TOY_Q4_K || type == TOY_Q5_K ? 2 : -1};
    if (type == TOY_Q6_K) halves[0] = 208;
    if (type == TOY_Q3_K) halves[0] = 108;
    if (type == TOY_Q2_K) halves[0] = 80, halves[1] = 82;
    if (type == TOY_MXFP4) halves[0] = -1;
    for (size_t o = 0; o < ldb * (size_t)n; o += bs) {
        for (int h = 0; h < 2; h++)
            if (halves[h] >= 0) memcpy(b + o + halves[h], &one, 2);
        if (type == TOY_MXFP4) b[o] = 128;
    }
    float *a = malloc((size_t)(m * k) * sizeof *a), *c = malloc((size_t)(m * n) * sizeof *c),
          *cr = malloc((size_t)(m * n) * sizeof *cr);
    for (int64_t i = 0; i < m * k; i++) a[i] = xv;
    void *scratch = NULL, *pk = NULL;
    cr_assert_eq(posix_memalign(&scratch, 64, toy_qgemm_scratch(m, k)), 0);
    cr_assert_eq(posix_memalign(&pk, 64, toy_qpack_bytes(type, n, k)), 0);
    toy_qpack(type, n, k, b, ldb, pk);
    toy_qdot.qgemm_packed(type, m, n, k, a, k, pk, c, n, false, scratch, NULL);
    toy_qgemm_ref(type, m, n, k, a, k, b, ldb, cr, n, false);
    for (int64_t i = 0; i < m * n; i++)
        cr_assert(c[i] == cr[i] && isfinite(cr[i]), "%s bytes %#x x %g: c[%lld] = %.9g, reference %.9g",
                  toy_dtype_name(type), fill, xv, (long long)i, c[i], cr[i]);
    free(scratch); free(pk); free(a); free(c); free(cr); free(b);
}

static void extreme_cases(const char *level) {
    if (level) setenv("TOY_SIMD", level, 1);
    else unsetenv("TOY_SIMD");
    toy_qdot_init();
    if (!toy_qdot.qgemm_packed) cr_skip_test("no int8 kernels on this CPU");
    enum toy_dtype types[] = {TOY_Q8_0, TOY_Q4_0, TOY_Q4_1, TOY_Q5_0, TOY_Q5_1, TOY_Q4_K, TOY_Q5_K, TOY_Q6_K,
                              TOY_IQ4_NL, TOY_IQ4_XS, TOY_Q3_K, TOY_Q2_K, TOY_MXFP4};
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++)
        for (int sign = -1; sign <= 1; sign += 2) {
            extreme_case(types[t], 0xff, (float)sign);
            if (types[t] == TOY_MXFP4) extreme_case(types[t], 0x77, (float)sign); /* +12 */
            if (types[t] == TOY_IQ4_NL || types[t] == TOY_IQ4_XS || types[t] == TOY_Q3_K || types[t] == TOY_Q2_K)
                /* -127 / -4, scale -32 (Q2_K: values, scales and mins 0) */
                extreme_case(types[t], 0x00, (float)sign);
            if (types[t] == TOY_Q8_0) {
                extreme_case(types[t], 0x80, (float)sign); /* -128 */
                extreme_case(types[t], 0x7f, (float)sign);
            }
        }
    unsetenv("TOY_SIMD");
    toy_qdot_init();
}
Test(qdot, qgemm_packed_extreme_values_match_reference) { extreme_cases(NULL); }
Test(qdot, qgemm_packed_avx2_extreme_values_match_reference) { extreme_cases("avx2"); }

/* MXFP4's E8M0 scales over their whole range, which the kernels turn into
 * floats themselves: blocks of random nibbles with scale bytes drawn from
 * [lo, hi], against activations of magnitude `amp` (chosen so that every
 * sum stays finite and the smallest scales, the subnormal 2^-128 and
 * 2^-127, still decide the result); the reference's bits at each level,
 * and packed rows of an odd byte length (17 a block) straight from the
 * file. */
static void mxfp4_scale_case(int lo, int hi, float amp) {
    const int64_t m = 5, n = 37, k = 544; /* 17 blocks a row: rows 289 bytes long */
    size_t ldb = toy_row_bytes(TOY_MXFP4, k);
    cr_assert_eq(ldb, 289);
    struct toy_rng r;
    toy_rng_seed(&r, (uint64_t)(lo * 1000 + hi));
    uint8_t *b = malloc(ldb * (size_t)n + 1), *row = b + 1; /* odd addresses throughout */
    for (size_t i = 0; i < ldb * (size_t)n; i++) row[i] = (uint8_t)toy_rng_below(&r, 256);
    for (size_t o = 0; o < ldb * (size_t)n; o += 17)
        row[o] = (uint8_t)(lo + (int)toy_rng_below(&r, (uint64_t)(hi - lo + 1)));
    float *a = malloc((size_t)(m * k) * sizeof *a), *c = malloc((size_t)(m * n) * sizeof *c),
          *cr = malloc((size_t)(m * n) * sizeof *cr);
    for (int64_t i = 0; i < m * k; i++) a[i] = toy_rng_normal(&r) * amp;
    void *scratch = NULL, *pk = NULL;
    cr_assert_eq(posix_memalign(&scratch, 64, toy_qgemm_scratch(m, k)), 0);
    cr_assert_eq(posix_memalign(&pk, 64, toy_qpack_bytes(TOY_MXFP4, n, k)), 0);
    toy_qpack(TOY_MXFP4, n, k, row, ldb, pk);
    toy_qdot.qgemm_packed(TOY_MXFP4, m, n, k, a, k, pk, c, n, false, scratch, NULL);
    toy_qgemm_ref(TOY_MXFP4, m, n, k, a, k, row, ldb, cr, n, false);
    int nonzero = 0;
    for (int64_t i = 0; i < m * n; i++) {
        cr_assert(c[i] == cr[i] && isfinite(cr[i]), "scales %d..%d: c[%lld] = %a, reference %a", lo, hi, (long long)i,
                  c[i], cr[i]);
        nonzero += cr[i] != 0;
    }
    cr_assert_gt(nonzero, m * n / 2, "scales %d..%d: the products vanished", lo, hi);
    free(scratch); free(pk); free(a); free(c); free(cr); free(b);
}

static void mxfp4_scale_cases(const char *level) {
    if (level) setenv("TOY_SIMD", level, 1);
    else unsetenv("TOY_SIMD");
    toy_qdot_init();
    if (!toy_qdot.qgemm_packed) cr_skip_test("no int8 kernels on this CPU");
    mxfp4_scale_case(0, 2, 1e4f);     /* 2^-128, 2^-127 (subnormal), 2^-126 */
    mxfp4_scale_case(0, 0, 1e4f);
    mxfp4_scale_case(1, 1, 1e4f);
    mxfp4_scale_case(120, 135, 1.0f); /* trained weights' range */
    mxfp4_scale_case(250, 255, 1e-5f); /* up to 2^127 */
    mxfp4_scale_case(0, 255, 1e-5f);
    unsetenv("TOY_SIMD");
    toy_qdot_init();
}
Test(qdot, qgemm_packed_mxfp4_every_scale_matches_reference) { mxfp4_scale_cases(NULL); }
Test(qdot, qgemm_packed_avx2_mxfp4_every_scale_matches_reference) { mxfp4_scale_cases("avx2"); }

/* Through the graph with a packed weight: one row (decode: column groups
 * split between threads) and 40 rows (rows split) give the same bits for
 * the same input row; a graph with a backward pass ignores the packed copy. */
static void packed_graph_case(enum toy_dtype type) {
    struct toy_ctx *ctx = toy_ctx_init(true);
    struct toy_rng r;
    toy_rng_seed(&r, 29);
    const int64_t k = toy_dtype_block_size(type) == 256 ? 512 : 576, n = 200, M = 40;
    float *wf = malloc((size_t)(k * n) * sizeof *wf);
    for (int64_t i = 0; i < k * n; i++) wf[i] = toy_rng_normal(&r) * 0.05f;
    struct toy_tensor *w = toy_new_tensor_2d(ctx, type, k, n);
    for (int64_t j = 0; j < n; j++) weight_row(type, wf + j * k, (char *)w->data + j * w->nb[1], k);
    cr_assert_eq(toy_tensor_pack(w), TOY_OK);
    cr_assert_not_null(w->packed);
    struct toy_tensor *x1 = toy_new_tensor_2d(ctx, TOY_F32, k, 1), *xm = toy_new_tensor_2d(ctx, TOY_F32, k, M);
    for (int64_t i = 0; i < k * M; i++) ((float *)xm->data)[i] = toy_rng_normal(&r);
    struct toy_tensor *y1 = toy_linear(ctx, x1, w, NULL), *ym = toy_linear(ctx, xm, w, NULL);
    toy_set_output(y1);
    toy_set_output(ym);
    struct toy_graph *g1 = toy_graph_new(ctx), *gm = toy_graph_new(ctx);
    toy_graph_build(g1, y1);
    toy_graph_build(gm, ym);
    struct toy_threadpool *tp = toy_threadpool_new(2);
    cr_assert_eq(toy_graph_compute(gm, tp), TOY_OK);
    float *ref = malloc((size_t)(n * M) * sizeof *ref);
    toy_qgemm_ref(type, M, n, k, xm->data, k, w->data, w->nb[1], ref, n, false);
    for (int64_t row = 0; row < M; row += 13) {
        memcpy(x1->data, (float *)xm->data + row * k, (size_t)k * sizeof(float));
        cr_assert_eq(toy_graph_compute(g1, tp), TOY_OK);
        for (int64_t j = 0; j < n; j++) {
            float one = ((float *)y1->data)[j], many = ((float *)ym->data)[row * n + j];
            cr_assert(one == many && many == ref[row * n + j], "%s row %lld col %lld: 1 row %.9g, %lld rows %.9g, ref %.9g",
                      toy_dtype_name(type), (long long)row, (long long)j, one, (long long)M, many, ref[row * n + j]);
        }
    }
    /* and the reference itself is the dequantized product, up to the Q8
     * rounding of the activations (1% of the output's RMS) */
    double err = 0, rms = 0;
    float *row = malloc((size_t)k * sizeof *row);
    for (int64_t j = 0; j < n; j++) {
        toy_dequantize_row(type, (char *)w->data + j * w->nb[1], row, k);
        for (int64_t i = 0; i < M; i++) {
            double e = 0;
            for (int64_t q = 0; q < k; q++) e += (double)row[q] * ((float *)xm->data)[i * k + q];
            err += pow(ref[i * n + j] - e, 2);
            rms += e * e;
        }
    }
    cr_assert_leq(sqrt(err / rms), 1e-2, "%s: relative RMS error %g against the dequantized product",
                  toy_dtype_name(type), sqrt(err / rms));
    free(row);
    toy_tensor_unpack(w);
    cr_assert_null(w->packed);
    free(ref); free(wf);
    toy_threadpool_free(tp);
    toy_ctx_free(ctx);
}

Test(qdot, packed_weight_is_batch_invariant_q8_0) {
    unsetenv("TOY_SIMD");
    toy_qdot_init();
    if (!toy_qdot.qgemm_packed) cr_skip_test("no int8 kernels (AVX2 or AVX-512 VNNI) on this CPU");
    packed_graph_case(TOY_Q8_0);
}
Test(qdot, packed_weight_is_batch_invariant_q4_0) {
    unsetenv("TOY_SIMD");
    toy_qdot_init();
    if (!toy_qdot.qgemm_packed) cr_skip_test("no int8 kernels (AVX2 or AVX-512 VNNI) on this CPU");
    packed_graph_case(TOY_Q4_0);
}
Test(qdot, packed_weight_is_batch_invariant_q4_k) {
    unsetenv("TOY_SIMD");
    toy_qdot_init();
    if (!toy_qdot.qgemm_packed) cr_skip_test("no int8 kernels (AVX2 or AVX-512 VNNI) on this CPU");
    packed_graph_case(TOY_Q4_K);
}
Test(qdot, packed_weight_is_batch_invariant_q5_0) {
    unsetenv("TOY_SIMD");
    toy_qdot_init();
    if (!toy_qdot.qgemm_packed) cr_skip_test("no int8 kernels (AVX2 or AVX-512 VNNI) on this CPU");
    packed_graph_case(TOY_Q5_0);
}
Test(qdot, packed_weight_is_batch_invariant_q4_1) {
    unsetenv("TOY_SIMD");
    toy_qdot_init();
    if (!toy_qdot.qgemm_packed) cr_skip_test("no int8 kernels (AVX2 or AVX-512 VNNI) on this CPU");
    packed_graph_case(TOY_Q4_1);
}
Test(qdot, packed_weight_is_batch_invariant_q5_1) {
    unsetenv("TOY_SIMD");
    toy_qdot_init();
    if (!toy_qdot.qgemm_packed) cr_skip_test("no int8 kernels (AVX2 or AVX-512 VNNI) on this CPU");
    packed_graph_case(TOY_Q5_1);
}
Test(qdot, packed_weight_is_batch_invariant_q5_k) {
    unsetenv("TOY_SIMD");
    toy_qdot_init();
    if (!toy_qdot.qgemm_packed) cr_skip_test("no int8 kernels (AVX2 or AVX-512 VNNI) on this CPU");
    packed_graph_case(TOY_Q5_K);
}
Test(qdot, packed_weight_is_batch_invariant_q6_k) {
    unsetenv("TOY_SIMD");
    toy_qdot_init();
    if (!toy_qdot.qgemm_packed) cr_skip_test("no int8 kernels (AVX2 or AVX-512 VNNI) on this CPU");
    packed_graph_case(TOY_Q6_K);
}

Test(qdot, packed_weight_is_batch_invariant_iq4_nl) {
    unsetenv("TOY_SIMD");
    toy_qdot_init();
    if (!toy_qdot.qgemm_packed) cr_skip_test("no int8 kernels (AVX2 or AVX-512 VNNI) on this CPU");
    packed_graph_case(TOY_IQ4_NL);
}
Test(qdot, packed_weight_is_batch_invariant_iq4_xs) {
    unsetenv("TOY_SIMD");
    toy_qdot_init();
    if (!toy_qdot.qgemm_packed) cr_skip_test("no int8 kernels (AVX2 or AVX-512 VNNI) on this CPU");
    packed_graph_case(TOY_IQ4_XS);
}

Test(qdot, packed_weight_is_batch_invariant_mxfp4) {
    unsetenv("TOY_SIMD");
    toy_qdot_init();
    if (!toy_qdot.qgemm_packed) cr_skip_test("no int8 kernels (AVX2 or AVX-512 VNNI) on this CPU");
    packed_graph_case(TOY_MXFP4);
}

Test(qdot, packed_weight_is_batch_invariant_q3_k) {
    unsetenv("TOY_SIMD");
    toy_qdot_init();
    if (!toy_qdot.qgemm_packed) cr_skip_test("no int8 kernels (AVX2 or AVX-512 VNNI) on this CPU");
    packed_graph_case(TOY_Q3_K);
}

Test(qdot, packed_weight_is_batch_invariant_q2_k) {
    unsetenv("TOY_SIMD");
    toy_qdot_init();
    if (!toy_qdot.qgemm_packed) cr_skip_test("no int8 kernels (AVX2 or AVX-512 VNNI) on this CPU");
    packed_graph_case(TOY_Q2_K);
}

Test(qdot, packed_weight_is_batch_invariant_with_avx2) {
    setenv("TOY_SIMD", "avx2", 1);
    toy_qdot_init();
    if (!toy_qdot.qgemm_packed) cr_skip_test("no AVX2 on this CPU");
    enum toy_dtype types[] = {TOY_Q8_0, TOY_Q4_0, TOY_Q4_1, TOY_Q5_0, TOY_Q5_1, TOY_Q4_K, TOY_Q5_K, TOY_Q6_K,
                              TOY_IQ4_NL, TOY_IQ4_XS, TOY_Q3_K, TOY_Q2_K, TOY_MXFP4};
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) packed_graph_case(types[t]);
}

/* toy_tensor_pack_into writes the very bytes toy_tensor_pack does, into the
 * caller's block (a model's one streamed block), and unpacking leaves that
 * block to its owner */
Test(qdot, pack_into_a_stream_block_matches_pack) {
    unsetenv("TOY_SIMD");
    toy_qdot_init();
    if (!toy_qdot.qgemm_packed) cr_skip_test("no int8 kernels (AVX2 or AVX-512 VNNI) on this CPU");
    enum toy_dtype types[] = {TOY_Q8_0, TOY_Q4_0, TOY_Q4_1, TOY_Q5_0, TOY_Q5_1, TOY_Q4_K, TOY_Q5_K, TOY_Q6_K,
                              TOY_IQ4_NL, TOY_IQ4_XS, TOY_Q3_K, TOY_Q2_K, TOY_MXFP4};
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        struct toy_ctx *ctx = toy_ctx_init(true);
        struct toy_rng r;
        toy_rng_seed(&r, 31);
        const int64_t k = 512, n = 37; /* a last group of 5 columns */
        float *wf = malloc((size_t)(k * n) * sizeof *wf);
        for (int64_t i = 0; i < k * n; i++) wf[i] = toy_rng_normal(&r);
        struct toy_tensor *a = toy_new_tensor_2d(ctx, types[t], k, n), *b = toy_new_tensor_2d(ctx, types[t], k, n);
        for (int64_t j = 0; j < n; j++) weight_row(types[t], wf + j * k, (char *)a->data + j * a->nb[1], k);
        memcpy(b->data, a->data, toy_nbytes(a));
        size_t bytes = toy_tensor_pack_bytes(a);
        cr_assert_eq(bytes, (toy_qpack_bytes(types[t], n, k) + 63) / 64 * 64);
        cr_assert_eq(toy_tensor_pack(a), TOY_OK);
        /* a block twice that size, packed into its second half */
        unsigned char *block = toy_stream_alloc(2 * bytes);
        cr_assert_not_null(block);
        cr_assert_eq((uintptr_t)block % 4096, 0);
        for (size_t i = 0; i < 2 * bytes; i++) cr_assert_eq(block[i], 0, "stream memory is zeroed");
        toy_tensor_pack_into(b, block + bytes);
        cr_assert_eq(b->packed, block + bytes);
        cr_assert_eq(memcmp(a->packed, b->packed, toy_qpack_bytes(types[t], n, k)), 0, "%s", toy_dtype_name(types[t]));
        toy_tensor_unpack(b);
        cr_assert_null(b->packed);
        cr_assert_eq(b->flags & TOY_FLAG_PACK_BORROWED, 0);
        block[bytes] ^= 1; /* still the caller's memory */
        toy_tensor_unpack(a);
        toy_stream_free(block, 2 * bytes);
        free(wf);
        toy_ctx_free(ctx);
    }
    /* not packable: F32, or a trainable weight */
    struct toy_ctx *ctx = toy_ctx_init(true);
    cr_assert_eq(toy_tensor_pack_bytes(toy_new_tensor_2d(ctx, TOY_F32, 64, 4)), 0);
    struct toy_tensor *p = toy_new_tensor_2d(ctx, TOY_Q8_0, 64, 4);
    p->flags |= TOY_FLAG_PARAM;
    cr_assert_eq(toy_tensor_pack_bytes(p), 0);
    toy_ctx_free(ctx);
}

/* a streamed block of 2 MiB or more starts on a 2 MiB boundary (so the
 * kernel can back it with huge pages) and is all there */
Test(qdot, stream_alloc_large_blocks_are_huge_page_aligned) {
    size_t sizes[] = {1, 4096, (2u << 20) - 1, 2u << 20, (5u << 20) + 123};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        unsigned char *p = toy_stream_alloc(sizes[i]);
        cr_assert_not_null(p, "%zu bytes", sizes[i]);
        if (sizes[i] >= (2u << 20)) cr_assert_eq((uintptr_t)p % (2u << 20), 0, "%zu bytes at %p", sizes[i], (void *)p);
        memset(p, 0xab, sizes[i]);
        cr_assert_eq(p[sizes[i] - 1], 0xab);
        toy_stream_free(p, sizes[i]);
    }
    toy_stream_free(NULL, 100); /* a no-op */
}

/* toy_graph_compute keeps its nodes' scratch size once two runs have asked
 * for it; packing the weight of a product (another kernel, another
 * scratch) or unpacking it asks again, and every run gives the bits of a
 * graph that never kept anything. */
static size_t fresh_work_size(const struct toy_graph *g, int nth) {
    size_t ws = 0;
    for (int i = 0; i < toy_graph_n_nodes(g); i++) {
        size_t w = toy_cpu_work_size(toy_graph_node(g, i), nth);
        if (w > ws) ws = w;
    }
    return ws;
}

Test(qdot, graph_scratch_is_asked_again_after_packing) {
    struct toy_ctx *ctx = toy_ctx_init(true);
    struct toy_rng r;
    toy_rng_seed(&r, 41);
    const int64_t k = 576, n = 96, M = 3;
    struct toy_tensor *w = toy_new_tensor_2d(ctx, TOY_Q8_0, k, n), *x = toy_new_tensor_2d(ctx, TOY_F32, k, M);
    float *wf = malloc((size_t)k * sizeof *wf);
    for (int64_t j = 0; j < n; j++) {
        for (int64_t i = 0; i < k; i++) wf[i] = toy_rng_normal(&r) * 0.05f;
        toy_quantize_row(TOY_Q8_0, wf, (char *)w->data + j * w->nb[1], k);
    }
    for (int64_t i = 0; i < k * M; i++) ((float *)x->data)[i] = toy_rng_normal(&r);
    struct toy_tensor *y = toy_linear(ctx, x, w, NULL);
    toy_set_output(y);
    struct toy_graph *g = toy_graph_new(ctx);
    toy_graph_build(g, y);
    struct toy_threadpool *tp = toy_threadpool_new(2);
    float *want = malloc((size_t)(n * M) * sizeof *want), *ref = malloc((size_t)(n * M) * sizeof *ref);
    size_t need[3];
    for (int round = 0; round < 3; round++) { /* unpacked, packed, unpacked again */
        if (round == 1) cr_assert_eq(toy_tensor_pack(w), TOY_OK);
        if (round == 2) toy_tensor_unpack(w);
        for (int run = 0; run < 4; run++) {
            cr_assert_eq(toy_graph_compute(g, tp), TOY_OK, "%s", toy_last_error());
            cr_assert_eq(g->ws, fresh_work_size(g, 2), "round %d run %d: scratch %zu kept, the nodes need %zu", round,
                         run, g->ws, fresh_work_size(g, 2));
            cr_assert_eq(g->ws_runs, run < 2 ? run + 1 : 2, "round %d run %d: %d runs asked", round, run, g->ws_runs);
            if (run == 0) memcpy(want, y->data, (size_t)(n * M) * sizeof *want);
            else cr_assert(memcmp(want, y->data, (size_t)(n * M) * sizeof *want) == 0, "round %d run %d", round, run);
        }
        need[round] = fresh_work_size(g, 2);
        if (round == 0) memcpy(ref, want, (size_t)(n * M) * sizeof *ref);
        if (round == 2) cr_assert(memcmp(ref, want, (size_t)(n * M) * sizeof *ref) == 0, "unpacked twice, other bits");
    }
    cr_assert_neq(need[0], need[1], "packing left the scratch as it was: this test would not see a stale one");
    cr_assert_eq(need[0], need[2]);
    free(wf), free(want), free(ref);
    toy_threadpool_free(tp);
    toy_ctx_free(ctx);
}

/* A leaf without data is an error naming it, never a crash: before any
 * node runs while the graph's scratch is still being asked for, and then,
 * with the scratch kept (graph.c checks each node's leaves as it runs
 * them), at the node that reads it. */
Test(qdot, graph_refuses_a_leaf_without_data_before_and_after_keeping_its_scratch) {
    struct toy_ctx *ctx = toy_ctx_init(true);
    const int64_t k = 64, n = 32;
    struct toy_tensor *w = toy_new_tensor_2d(ctx, TOY_F32, k, n), *x = toy_new_tensor_2d(ctx, TOY_F32, k, 1);
    toy_set_name(x, "the_input");
    memset(w->data, 0, toy_nbytes(w));
    memset(x->data, 0, toy_nbytes(x));
    struct toy_tensor *y = toy_silu(ctx, toy_linear(ctx, x, w, NULL));
    toy_set_output(y);
    struct toy_graph *g = toy_graph_new(ctx);
    toy_graph_build(g, y);
    struct toy_threadpool *tp = toy_threadpool_new(2);
    void *data = x->data;
    x->data = NULL;
    cr_assert_eq(toy_graph_compute(g, tp), TOY_ERR_STATE);
    cr_assert(strstr(toy_last_error(), "the_input"), "%s", toy_last_error());
    x->data = data;
    for (int run = 0; run < 3; run++) cr_assert_eq(toy_graph_compute(g, tp), TOY_OK, "%s", toy_last_error());
    cr_assert_eq(g->ws_runs, 2, "the scratch is kept: the check is now the one made per node");
    x->data = NULL;
    cr_assert_eq(toy_graph_compute(g, tp), TOY_ERR_STATE);
    cr_assert(strstr(toy_last_error(), "the_input"), "%s", toy_last_error());
    x->data = data;
    cr_assert_eq(toy_graph_compute(g, tp), TOY_OK, "%s", toy_last_error());
    toy_threadpool_free(tp);
    toy_ctx_free(ctx);
}
