/* test-cuda.c: the CUDA backend against the CPU backend as oracle.
 *
 * Every test builds a graph, runs it on the CPU, then runs the same graph on
 * cuda:0 and compares results (and parameter gradients where the test has a
 * backward pass). The measure is
 *     max |cuda - cpu| / max |cpu|     (over the tensor)
 * and the bounds, per dtype path:
 *     F32 elementwise, norms, rope, softmax, reductions    1e-5
 *     F32 GEMM (TOY_CUDA_MATH=f32, the default), attention 1e-4
 *     F16 / BF16 weights (A rounded to the weight's type)   1e-2
 *     Q8_0 / Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q4_K / Q5_K / Q6_K
 *       weights (the CPU's Q8_0 / Q4_0 paths quantize the
 *       activations to Q8_0; CUDA does not)                2e-2
 *     Llama logits (F32)                                    1e-4
 *     20 AdamW steps of a Llama, loss per step (F32)        1e-4 relative
 *     12 device-resident AdamW steps (accumulation 2, clip
 *       0.5): loss per step 1e-4 relative, norm per step
 *       1e-4 relative, parameters after the last step       2e-3 of max |p|
 * The device-resident optimizer's bookkeeping (copies per step, stale host
 * copies until a sync, release, checkpoint round trip) is checked under
 * the mock runtime (make CUDA_MOCK=1), whose copy counters it reads.
 * Every test skips when toy is built without CUDA or no CUDA device is
 * usable, except the device-name checks, which hold in every build.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "toy/toy.h"
#include "backends/cpu/cpu-impl.h"
#include "serve/serve-internal.h"
#include "harness.h"

#define TOL_F32 1e-5
#define TOL_GEMM 1e-4
#define TOL_HALF 1e-2
#define TOL_QUANT 2e-2
#define TOL_ATTN_BF16 2e-2

static void need_cuda(void) {
    if (!toy_cuda_built()) cr_skip_test("toy is built without CUDA (make CUDA=1)");
    if (toy_cuda_device_count() < 1) cr_skip_test("no usable CUDA device");
}

static struct toy_rng rng;

static void fill(struct toy_tensor *t, float lo, float hi) {
    int64_t n = toy_nelements(t);
    float *tmp = malloc((size_t)n * sizeof *tmp);
    for (int64_t i = 0; i < n; i++) tmp[i] = lo + (hi - lo) * toy_rng_uniform(&rng);
    if (t->type == TOY_F32 || t->type == TOY_F16 || t->type == TOY_BF16) {
        toy_tensor_from_f32(t, tmp);
    } else { /* a quantized weight: rows quantized from the floats */
        int64_t rows = toy_nrows(t);
        for (int64_t r = 0; r < rows; r++)
            cr_assert_eq(toy_quantize_row(t->type, tmp + r * t->ne[0], (char *)t->data + r * t->nb[1], t->ne[0]),
                         TOY_OK);
    }
    free(tmp);
}

static struct toy_tensor *param(struct toy_ctx *ctx, int64_t n0, int64_t n1, int64_t n2, int64_t n3) {
    struct toy_tensor *t = toy_new_tensor_4d(ctx, TOY_F32, n0, n1, n2, n3);
    fill(t, -1.0f, 1.0f);
    toy_set_param(t);
    return t;
}

/* a scalar loss with a non-trivial gradient for y: sum(y * R) */
static struct toy_tensor *loss_of(struct toy_ctx *ctx, struct toy_tensor *y) {
    struct toy_tensor *r = toy_new_tensor(ctx, TOY_F32, 4, y->ne);
    fill(r, -1.0f, 1.0f);
    return toy_sum_all(ctx, toy_mul(ctx, toy_cont(ctx, y), r));
}

static double rel_err(const float *a, const float *ref, int64_t n, int64_t *where) {
    double mx = 0, md = 0;
    *where = -1;
    for (int64_t i = 0; i < n; i++) {
        mx = fmax(mx, fabs(ref[i]));
        double d = fabs((double)a[i] - ref[i]);
        if (isnan(a[i]) != isnan(ref[i])) d = INFINITY;
        if (d > md) {
            md = d;
            *where = i;
        }
    }
    return md / (mx > 1e-30 ? mx : 1.0);
}

static float *copy_f32(const struct toy_tensor *t) {
    float *d = malloc((size_t)toy_nelements(t) * sizeof *d);
    toy_tensor_to_f32(t, d);
    return d;
}

/* Runs out (forward, or forward + backward when it is a scalar loss and
 * backward is set) on the CPU and on cuda:0; compares out (or `cmp`, a
 * tensor out is computed from, when given: a loss summed from many terms
 * can cancel to a small number whose relative error says little) and every
 * parameter gradient. */
static void check_with(struct toy_ctx *ctx, struct toy_tensor *out, struct toy_tensor *cmp, bool backward, double tol,
                       const char *what) {
    toy_set_output(out);
    if (cmp) toy_set_output(cmp);
    else cmp = out;
    struct toy_graph *g = toy_graph_new(ctx);
    toy_graph_build(g, out);
    if (backward) toy_graph_backward(g, out);
    struct toy_threadpool *tp = toy_threadpool_new(2);
    cr_assert_eq(toy_graph_compute(g, tp), TOY_OK, "%s (cpu): %s", what, toy_last_error());
    float *ref = copy_f32(cmp);
    int np = toy_graph_n_params(g);
    float **gref = calloc((size_t)np + 1, sizeof *gref);
    for (int i = 0; i < np; i++)
        if (toy_graph_param(g, i)->grad) gref[i] = copy_f32(toy_graph_param(g, i)->grad);
    toy_graph_zero_grads(g);
    cr_assert_eq(toy_graph_set_device(g, "cuda:0"), TOY_OK, "%s", toy_last_error());
    cr_assert_eq(toy_graph_compute(g, tp), TOY_OK, "%s (cuda): %s", what, toy_last_error());
    float *got = copy_f32(cmp);
    int64_t at;
    double e = rel_err(got, ref, toy_nelements(cmp), &at);
    cr_log_info("%s: output max rel diff %.2e", what, e);
    cr_expect_leq(e, tol, "%s: output differs: %.3e at %lld (cuda %g, cpu %g)", what, e, (long long)at,
                  at >= 0 ? got[at] : 0.0, at >= 0 ? ref[at] : 0.0);
    for (int i = 0; i < np; i++) {
        struct toy_tensor *p = toy_graph_param(g, i);
        if (!gref[i]) continue;
        float *gg = copy_f32(p->grad);
        double eg = rel_err(gg, gref[i], toy_nelements(p->grad), &at);
        cr_expect_leq(eg, tol, "%s: gradient of %s differs: %.3e at %lld (cuda %g, cpu %g)", what,
                      p->name[0] ? p->name : "param", eg, (long long)at, at >= 0 ? gg[at] : 0.0,
                      at >= 0 ? gref[i][at] : 0.0);
        free(gg);
        free(gref[i]);
    }
    free(gref);
    free(ref);
    free(got);
    toy_threadpool_free(tp);
}

static void check(struct toy_ctx *ctx, struct toy_tensor *out, bool backward, double tol, const char *what) {
    check_with(ctx, out, NULL, backward, tol, what);
}

static struct toy_ctx *setup(uint64_t seed) {
    toy_rng_seed(&rng, seed);
    struct toy_ctx *ctx = toy_ctx_init(true);
    cr_assert(ctx);
    return ctx;
}

/* ---- device names: hold in every build ---------------------------------------------------- */

Test(cuda, device_names_are_checked) {
    cr_assert_eq(toy_device_check("cpu"), TOY_OK);
    cr_assert_eq(toy_device_check("gpu"), TOY_ERR_INVALID_ARG);
    cr_assert_eq(toy_device_check("cuda:x"), TOY_ERR_INVALID_ARG);
    cr_assert_eq(toy_device_check("cuda:"), TOY_ERR_INVALID_ARG);
    if (!toy_cuda_built()) {
        cr_assert_eq(toy_device_check("cuda"), TOY_ERR_UNSUPPORTED);
        cr_assert(strstr(toy_last_error(), "CUDA=1"), "%s", toy_last_error());
        cr_assert_eq(toy_device_set_default("cuda:0"), TOY_ERR_UNSUPPORTED);
        cr_assert_str_eq(toy_device_default(), "cpu");
    } else {
        cr_assert_eq(toy_device_check("cuda:999"), TOY_ERR_NOT_FOUND, "%s", toy_last_error());
    }
    struct toy_device_info d[8];
    int n = 0;
    cr_assert_eq(toy_device_list(d, 8, &n), TOY_OK);
    cr_assert_geq(n, 1);
    cr_assert_str_eq(d[0].name, "cpu");
    cr_assert_eq(n, 1 + (toy_cuda_device_count() < 7 ? toy_cuda_device_count() : 7));
}

/* toy devices and --device through the command line (TOY_BIN, set by make check) */
static int run_cli(const char *args, char *out, size_t cap) {
    const char *b = getenv("TOY_BIN");
    if (!b || access(b, X_OK)) cr_skip_test("TOY_BIN not set (run through make check)");
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s %s 2>&1", b, args);
    FILE *p = popen(cmd, "r");
    cr_assert(p);
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

Test(cuda, cli_devices_and_device_flag) {
    char out[8192];
    cr_assert_eq(run_cli("devices", out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "cpu"), "%s", out);
    cr_assert((strstr(out, "OpenBLAS ") || strstr(out, "f32: toy AVX-512 GEMM")) && strstr(out, "decode loads") &&
                  strstr(out, "bf16: "),
              "%s", out);
    setenv("TOY_LOADS", "narrow", 1); /* the CPU's choices say what runs, overrides included */
    cr_assert_eq(run_cli("devices", out, sizeof out), 0, "%s", out);
    unsetenv("TOY_LOADS");
    cr_assert(strstr(out, "narrow decode loads") && !strstr(out, "(f32 64-byte)"), "%s", out); /* all kernels */
    setenv("TOY_PREFETCH", "1024", 1);
    cr_assert_eq(run_cli("devices", out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "prefetch 1024 B ahead"), "%s", out);
    setenv("TOY_PREFETCH", "0", 1);
    cr_assert_eq(run_cli("devices", out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "no prefetch"), "%s", out);
    setenv("TOY_PREFETCH", "100", 1); /* not a multiple of 64: warned about, the CPU's choice runs */
    cr_assert_eq(run_cli("devices", out, sizeof out), 0, "%s", out);
    unsetenv("TOY_PREFETCH");
    cr_assert(strstr(out, "ignoring TOY_PREFETCH=100"), "%s", out);
    if (!toy_cuda_built()) cr_assert(strstr(out, "not built in"), "%s", out);
    cr_assert_eq(run_cli("devices --json", out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "\"cuda_built\""), "%s", out);
    cr_assert(strstr(out, "\"blas_core\""), "%s", out);
    /* OpenBLAS's own override is the user's: toy leaves it as set */
    setenv("OPENBLAS_CORETYPE", "Haswell", 1);
    cr_assert_eq(run_cli("devices --json", out, sizeof out), 0, "%s", out);
    unsetenv("OPENBLAS_CORETYPE");
    cr_assert(strstr(out, "\"blas_core\":\"Haswell\",\"blas_note\":null"), "%s", out);
    /* and F32 products run on toy's own kernel where the CPU has AVX-512 (no
     * longer OpenBLAS's Haswell ones), unless $TOY_SGEMM says BLAS */
    cr_assert(strstr(out, toy_cpu_has_avx512() ? "\"f32_gemm\":\"toy AVX-512\"" : "\"f32_gemm\":\"OpenBLAS\""), "%s", out);
    setenv("OPENBLAS_CORETYPE", "Haswell", 1);
    setenv("TOY_SGEMM", "blas", 1);
    cr_assert_eq(run_cli("devices --json", out, sizeof out), 0, "%s", out);
    unsetenv("TOY_SGEMM");
    unsetenv("OPENBLAS_CORETYPE");
    cr_assert(strstr(out, "OpenBLAS Haswell") && strstr(out, "\"f32_gemm\":\"OpenBLAS\""), "%s", out);
    /* how BF16 products run: the CPU's choice, or $TOY_BF16_GEMM's */
    cr_assert(strstr(out, "\"bf16_gemm\":\""), "%s", out);
    if (toy_cpu_has_avx512bf16()) {
        setenv("TOY_BF16_GEMM", "sgemm", 1);
        cr_assert_eq(run_cli("devices --json", out, sizeof out), 0, "%s", out);
        cr_assert(strstr(out, "\"bf16_gemm\":\"sgemm\""), "%s", out);
        setenv("TOY_BF16_GEMM", "amx", 1); /* where there are no tiles: said so, the CPU's choice runs */
        cr_assert_eq(run_cli("devices --json", out, sizeof out), 0, "%s", out);
        cr_assert(toy_cpu_amx_bf16() ? strstr(out, "\"bf16_gemm\":\"AMX tiles\"") != NULL
                                     : strstr(out, "no AMX-BF16 tiles") != NULL,
                  "%s", out);
        unsetenv("TOY_BF16_GEMM");
    }
    /* a device that is not there: a clear error and exit code 1, before the command runs */
    cr_assert_eq(run_cli("generate --device cuda:63 -m nothing.gguf", out, sizeof out), 1, "%s", out);
    cr_assert(strstr(out, "cuda:63"), "%s", out);
    cr_assert_eq(run_cli("train --device=tpu --data nothing.txt", out, sizeof out), 1, "%s", out);
    cr_assert(strstr(out, "expected cpu, cuda or cuda:N"), "%s", out);
    cr_assert_eq(run_cli("generate --device", out, sizeof out), 2, "%s", out);
    /* --device cpu is accepted and taken out before the command parses its flags */
    cr_assert_eq(run_cli("devices --device cpu", out, sizeof out), 0, "%s", out);
}

/* ---- ops ------------------------------------------------------------------------------------ */

Test(cuda, elementwise_forward_backward) {
    need_cuda();
    struct toy_ctx *ctx = setup(1);
    struct toy_tensor *a = param(ctx, 37, 5, 3, 2), *b = param(ctx, 37, 1, 3, 1), *s = param(ctx, 1, 5, 1, 2);
    struct toy_tensor *pos = toy_new_tensor_4d(ctx, TOY_F32, 37, 5, 3, 2);
    fill(pos, 0.5f, 2.0f);
    toy_set_param(pos);
    struct toy_tensor *ys[] = {
        toy_add(ctx, a, b), toy_sub(ctx, a, b), toy_mul(ctx, a, b), toy_div(ctx, a, pos), toy_add(ctx, a, s),
        toy_scale(ctx, a, 0.7f), toy_sqr(ctx, a), toy_sqrt(ctx, pos), toy_neg(ctx, a), toy_tanh(ctx, a),
        toy_silu(ctx, a), toy_gelu(ctx, a), toy_mul(ctx, toy_transpose(ctx, a), toy_transpose(ctx, a)),
    };
    struct toy_tensor *loss = NULL;
    for (size_t i = 0; i < sizeof ys / sizeof ys[0]; i++) {
        struct toy_tensor *l = loss_of(ctx, ys[i]);
        loss = loss ? toy_add(ctx, loss, l) : l;
    }
    check(ctx, loss, true, TOL_F32, "elementwise");
    toy_ctx_free(ctx);
}

/* a bias's gradient (SUM_TO onto one row) runs as column sums over chunks
 * of rows: many rows, a tail chunk, and a transposed (strided) source */
Test(cuda, bias_gradient_sums_rows_in_chunks) {
    need_cuda();
    struct toy_ctx *ctx = setup(4);
    struct toy_tensor *x = param(ctx, 37, 101, 3, 1), *b = param(ctx, 37, 1, 1, 1), *bt = param(ctx, 101, 1, 1, 1);
    struct toy_tensor *loss =
        toy_add(ctx, loss_of(ctx, toy_add(ctx, x, b)), loss_of(ctx, toy_add(ctx, toy_transpose(ctx, x), bt)));
    check(ctx, loss, true, TOL_F32, "bias gradients");
    toy_ctx_free(ctx);
}

Test(cuda, swiglu_forward_backward) {
    need_cuda();
    struct toy_ctx *ctx = setup(2);
    struct toy_tensor *g = param(ctx, 48, 7, 2, 1), *u = param(ctx, 48, 7, 2, 1);
    check(ctx, loss_of(ctx, toy_swiglu(ctx, g, u)), true, TOL_F32, "swiglu");
    toy_ctx_free(ctx);
}

/* gpt-oss's clamped SwiGLU, forward and both gradients: inputs on both sides
 * of the clamps (|x| up to 10, limit 7) and on them, over contiguous, transposed and
 * interleaved sources (gpt-oss's gate_up rows: gate x[..., ::2], up x[..., 1::2]),
 * and without a clamp (limit 0); every output compared, not only the loss */
Test(cuda, swiglu_oai_forward_backward) {
    need_cuda();
    struct toy_ctx *ctx = setup(5);
    /* gu's rows have one float past the 96 the views read: toy_view's bounds check counts a
     * strided row's last element as nb[0] bytes, which the up view (offset 4) would pass */
    struct toy_tensor *g = param(ctx, 48, 7, 2, 1), *u = param(ctx, 48, 7, 2, 1), *gu = param(ctx, 97, 7, 2, 1);
    fill(g, -10.0f, 10.0f);
    fill(u, -10.0f, 10.0f);
    fill(gu, -10.0f, 10.0f);
    for (int i = 0; i < 4; i++) { /* on the clamps, where PyTorch's clamp passes the gradient */
        toy_set_f32(g, i, 0, 0, 0, 7.0f);
        toy_set_f32(u, i, 0, 0, 0, i % 2 ? -7.0f : 7.0f);
        toy_set_f32(gu, 2 * i, 1, 0, 0, 7.0f);
        toy_set_f32(gu, 2 * i + 1, 1, 0, 0, i % 2 ? -7.0f : 7.0f);
    }
    struct toy_tensor *half[2];
    for (int i = 0; i < 2; i++)
        half[i] = toy_view(ctx, gu, 4, (const int64_t[]){48, 7, 2, 1},
                           (const size_t[]){8, gu->nb[1], gu->nb[2], gu->nb[3]}, (size_t)i * 4);
    struct toy_tensor *ys[] = {
        toy_swiglu_oai(ctx, g, u, 1.702f, 7.0f),
        toy_swiglu_oai(ctx, toy_transpose(ctx, g), toy_transpose(ctx, u), 1.702f, 7.0f),
        toy_swiglu_oai(ctx, half[0], half[1], 1.702f, 7.0f),
        toy_swiglu_oai(ctx, g, u, 0.9f, 0.0f),
    };
    struct toy_tensor *all = NULL;
    for (size_t i = 0; i < sizeof ys / sizeof ys[0]; i++) {
        struct toy_tensor *y = toy_reshape_2d(ctx, ys[i], toy_nelements(ys[i]), 1);
        all = all ? toy_concat(ctx, all, y, 1) : y;
    }
    check_with(ctx, loss_of(ctx, all), all, true, TOL_F32, "swiglu_oai");
    toy_ctx_free(ctx);
}

Test(cuda, reductions_broadcasts_copies) {
    need_cuda();
    struct toy_ctx *ctx = setup(3);
    struct toy_tensor *a = param(ctx, 9, 4, 3, 2), *c = param(ctx, 9, 4, 5, 2), *d = param(ctx, 6, 4, 3, 2);
    struct toy_tensor *small = param(ctx, 9, 1, 3, 1);
    struct toy_tensor *ys[] = {
        toy_sum(ctx, a, 0), toy_sum(ctx, a, 1), toy_mean(ctx, a, 2), toy_mean(ctx, a, 3), toy_sum_all(ctx, a),
        toy_repeat(ctx, small, a), toy_concat(ctx, a, c, 2), toy_concat(ctx, a, d, 0),
        toy_cont(ctx, toy_permute(ctx, a, 2, 0, 3, 1)), toy_cast(ctx, toy_cast(ctx, a, TOY_F16), TOY_F32),
        toy_cast(ctx, toy_cast(ctx, a, TOY_BF16), TOY_F32), toy_reshape_2d(ctx, a, 36, 6),
        /* a strided view (every other row of dims 1-2, from an offset): VIEW_BACK */
        toy_view(ctx, a, 3, (int64_t[]){5, 2, 3}, (size_t[]){4, 2 * a->nb[1], a->nb[2]}, 4 * 2 + a->nb[1]),
    };
    struct toy_tensor *loss = NULL;
    for (size_t i = 0; i < sizeof ys / sizeof ys[0]; i++) {
        struct toy_tensor *l = loss_of(ctx, ys[i]);
        loss = loss ? toy_add(ctx, loss, l) : l;
    }
    check(ctx, loss, true, TOL_F32, "reductions");
    toy_ctx_free(ctx);
}

/* views of an intermediate (GPT-2's q, k, v of one product): the later
 * views' VIEW_BACKs add into the first one's buffer, or store there where
 * the views tile it (autodiff.c) */
Test(cuda, views_of_an_intermediate_gather_one_gradient) {
    need_cuda();
    struct toy_ctx *ctx = setup(6);
    struct toy_tensor *x = param(ctx, 36, 5, 2, 1), *z = toy_scale(ctx, x, 2.0f), *v[3];
    for (int i = 0; i < 3; i++)
        v[i] = toy_view(ctx, z, 3, (int64_t[]){12, 5, 2}, (size_t[]){4, z->nb[1], z->nb[2]}, (size_t)(12 * i) * 4);
    struct toy_tensor *o = toy_view(ctx, z, 3, (int64_t[]){24, 5, 2}, (size_t[]){4, z->nb[1], z->nb[2]}, 12 * 4);
    struct toy_tensor *loss = loss_of(ctx, toy_add(ctx, toy_mul(ctx, v[0], v[1]), v[2]));
    loss = toy_add(ctx, loss, loss_of(ctx, toy_sqr(ctx, o))); /* overlapping the last two */
    /* q, k, v in heads of 4, tiling z2: each stores its part (P_VB_STORE), nothing zeroed */
    struct toy_tensor *x2 = param(ctx, 24, 5, 2, 1), *z2 = toy_scale(ctx, x2, 3.0f), *h[3];
    for (int i = 0; i < 3; i++)
        h[i] = toy_view(ctx, z2, 4, (int64_t[]){4, 2, 5, 2}, (size_t[]){4, 16, z2->nb[1], z2->nb[2]}, (size_t)(8 * i) * 4);
    loss = toy_add(ctx, loss, loss_of(ctx, toy_add(ctx, toy_mul(ctx, h[0], h[1]), h[2])));
    check(ctx, loss, true, TOL_F32, "views");
    toy_ctx_free(ctx);
}

Test(cuda, norms_forward_backward) {
    need_cuda();
    struct toy_ctx *ctx = setup(4);
    struct toy_tensor *x = param(ctx, 96, 6, 2, 1), *w = param(ctx, 96, 1, 1, 1), *b = param(ctx, 96, 1, 1, 1);
    struct toy_tensor *big = param(ctx, 1500, 3, 1, 1);
    struct toy_tensor *loss = toy_add(ctx, loss_of(ctx, toy_rms_norm(ctx, x, w, 1e-5f)),
                                      loss_of(ctx, toy_layer_norm(ctx, x, w, b, 1e-5f)));
    loss = toy_add(ctx, loss, loss_of(ctx, toy_rms_norm(ctx, big, NULL, 1e-6f)));
    loss = toy_add(ctx, loss, loss_of(ctx, toy_layer_norm(ctx, big, NULL, NULL, 1e-6f)));
    /* rows wider than a warp's (ROW_WARP_MAX, 4096): a block per row */
    struct toy_tensor *wide = param(ctx, 5000, 3, 1, 1), *ww = param(ctx, 5000, 1, 1, 1), *wb = param(ctx, 5000, 1, 1, 1);
    loss = toy_add(ctx, loss, loss_of(ctx, toy_rms_norm(ctx, wide, ww, 1e-6f)));
    loss = toy_add(ctx, loss, loss_of(ctx, toy_layer_norm(ctx, wide, ww, wb, 1e-5f)));
    check(ctx, loss, true, TOL_F32, "norms");
    toy_ctx_free(ctx);
}

Test(cuda, softmax_forward_backward) {
    need_cuda();
    struct toy_ctx *ctx = setup(5);
    struct toy_tensor *x = param(ctx, 33, 7, 2, 1);
    struct toy_tensor *mask = toy_new_tensor_2d(ctx, TOY_F32, 33, 7);
    for (int i = 0; i < 7; i++)
        for (int j = 0; j < 33; j++) ((float *)mask->data)[i * 33 + j] = j > 20 + i ? -INFINITY : 0.0f;
    struct toy_tensor *loss = toy_add(ctx, loss_of(ctx, toy_softmax(ctx, x, mask, 0.5f)),
                                      loss_of(ctx, toy_softmax(ctx, x, NULL, 1.3f)));
    check(ctx, loss, true, TOL_F32, "softmax");
    toy_ctx_free(ctx);
}

static void rope_case(struct toy_rope_params p, bool ff, bool per_batch, const char *what) {
    struct toy_ctx *ctx = setup(6);
    const int D = 16, H = 3, T = 6, B = 2;
    struct toy_tensor *x = param(ctx, D, H, T, B);
    struct toy_tensor *pos = toy_new_tensor_1d(ctx, TOY_I32, per_batch ? T * B : T);
    for (int i = 0; i < (per_batch ? T * B : T); i++) ((int32_t *)pos->data)[i] = 3 + 7 * i + (i % 2) * 100;
    struct toy_tensor *y;
    if (ff) {
        struct toy_tensor *f = toy_new_tensor_1d(ctx, TOY_F32, (p.n_dims ? p.n_dims : D) / 2);
        fill(f, 1.0f, 4.0f);
        y = toy_rope_ff(ctx, x, pos, &p, f);
    } else {
        y = toy_rope(ctx, x, pos, &p);
    }
    check(ctx, loss_of(ctx, y), true, TOL_F32, what);
    toy_ctx_free(ctx);
}

Test(cuda, rope_variants_forward_backward) {
    need_cuda();
    rope_case((struct toy_rope_params){.mode = TOY_ROPE_NORMAL, .freq_base = 10000}, false, false, "rope normal");
    rope_case((struct toy_rope_params){.mode = TOY_ROPE_NEOX, .freq_base = 500000, .n_dims = 12}, false, true,
              "rope neox partial, per-batch positions");
    rope_case((struct toy_rope_params){.mode = TOY_ROPE_NEOX, .freq_base = 500000, .scaling = TOY_ROPE_SCALING_LLAMA3,
                                       .factor = 8, .orig_ctx = 64, .low_freq_factor = 1, .high_freq_factor = 4},
              true, false, "rope llama3 + freq factors");
    rope_case((struct toy_rope_params){.mode = TOY_ROPE_NORMAL, .freq_base = 10000, .scaling = TOY_ROPE_SCALING_YARN,
                                       .factor = 4, .orig_ctx = 32},
              false, false, "rope yarn");
    rope_case((struct toy_rope_params){.mode = TOY_ROPE_NORMAL, .freq_base = 10000, .scaling = TOY_ROPE_SCALING_LINEAR,
                                       .factor = 2},
              false, false, "rope linear");
}

Test(cuda, matmul_f32_transposes_batches_gqa) {
    need_cuda();
    struct toy_ctx *ctx = setup(7);
    struct toy_tensor *a = param(ctx, 24, 10, 4, 2);   /* (2, 4, 10, 24) */
    struct toy_tensor *bt = param(ctx, 24, 12, 2, 2);  /* trans_b, GQA ratio 2 */
    struct toy_tensor *bn = param(ctx, 12, 24, 4, 1);  /* (24 x 12), broadcast over dim 3 */
    struct toy_tensor *at = param(ctx, 10, 24, 4, 2);  /* trans_a */
    struct toy_tensor *w = param(ctx, 24, 33, 1, 1), *bias = param(ctx, 33, 1, 1, 1);
    struct toy_tensor *loss = loss_of(ctx, toy_matmul(ctx, a, bt, false, true));
    loss = toy_add(ctx, loss, loss_of(ctx, toy_matmul(ctx, a, bn, false, false)));
    loss = toy_add(ctx, loss, loss_of(ctx, toy_matmul(ctx, at, bn, true, false)));
    loss = toy_add(ctx, loss, loss_of(ctx, toy_linear(ctx, a, w, bias)));
    check(ctx, loss, true, TOL_GEMM, "matmul f32");
    toy_ctx_free(ctx);
}

static void weight_case_k(enum toy_dtype type, int64_t m, int64_t k, double tol) {
    struct toy_ctx *ctx = setup(8);
    const int64_t n = 40;
    struct toy_tensor *a = param(ctx, k, m, 2, 1);
    struct toy_tensor *w = toy_new_tensor_2d(ctx, type, k, n);
    fill(w, -1.0f, 1.0f);
    char what[64];
    snprintf(what, sizeof what, "matmul %s weights, %lld rows of %lld", toy_dtype_name(type), (long long)m, (long long)k);
    /* forward uses trans_b; dA = dy W is the non-transposed product */
    check(ctx, loss_of(ctx, toy_linear(ctx, a, w, NULL)), true, tol, what);
    toy_ctx_free(ctx);
}

static void weight_case(enum toy_dtype type, int64_t m, double tol) { weight_case_k(type, m, 256, tol); }

Test(cuda, matmul_half_and_quantized_weights) {
    need_cuda();
    weight_case(TOY_F16, 5, TOL_HALF);
    weight_case(TOY_BF16, 37, TOL_HALF);
    /* up to 8 rows (m twice: A is [k, m, 2]), the F16/BF16 GEMV when rows are
     * 16-byte aligned, else the GEMM */
    weight_case_k(TOY_F16, 1, 1032, TOL_HALF);
    weight_case_k(TOY_BF16, 4, 264, TOL_HALF);
    weight_case_k(TOY_BF16, 3, 260, TOL_HALF); /* k not a multiple of 8: the GEMM */
    { /* A with padded rows (a view): converted to the weight's type element by element */
        struct toy_ctx *ctx = setup(8);
        const int64_t ne[2] = {256, 9};
        const size_t nb[2] = {4, 264 * 4};
        struct toy_tensor *a = toy_view(ctx, param(ctx, 264, 9, 1, 1), 2, ne, nb, 0);
        struct toy_tensor *w = toy_new_tensor_2d(ctx, TOY_BF16, 256, 40);
        fill(w, -1.0f, 1.0f);
        check(ctx, loss_of(ctx, toy_linear(ctx, a, w, NULL)), true, TOL_HALF, "matmul bf16 weights, padded rows");
        toy_ctx_free(ctx);
    }
    enum toy_dtype q[] = {TOY_Q8_0, TOY_Q4_0, TOY_Q4_1, TOY_Q5_0, TOY_Q5_1, TOY_Q4_K, TOY_Q5_K, TOY_Q6_K,
                          TOY_Q2_K, TOY_Q3_K, TOY_IQ4_NL, TOY_IQ4_XS, TOY_MXFP4};
    for (size_t i = 0; i < sizeof q / sizeof q[0]; i++) {
        weight_case(q[i], 3, TOL_QUANT);  /* GEMV kernel */
        weight_case(q[i], 40, TOL_QUANT); /* dequantize + GEMM */
    }
    for (int i = 0; i < 2; i++) { /* A's rows not 16-byte aligned: the super-block types' element-wise GEMV */
        struct toy_ctx *ctx = setup(9);
        const int64_t ne[2] = {256, 3};
        const size_t nb[2] = {4, 258 * 4};
        struct toy_tensor *a = toy_view(ctx, param(ctx, 258, 3, 1, 1), 2, ne, nb, 0);
        struct toy_tensor *w = toy_new_tensor_2d(ctx, i ? TOY_Q3_K : TOY_Q4_K, 256, 40);
        fill(w, -1.0f, 1.0f);
        check(ctx, loss_of(ctx, toy_linear(ctx, a, w, NULL)), true, TOL_QUANT, "matmul k-quant weights, padded rows");
        toy_ctx_free(ctx);
    }
}

/* Each quantized type's decode GEMV (up to 8 rows; the k-quants and
 * IQ4_XS have kernels of their own, the 32-element types, IQ4_NL and MXFP4 the
 * block one) against the device's other path, chunks of the
 * weights dequantized and a GEMM (more rows): a 3-row product is the first
 * rows of a 12-row one up to the order of the sums, with one and three
 * blocks or super-blocks a row and 72 columns (a last block of warps part
 * empty). Tighter than the comparison with the CPU, which rounds A to Q8. */
Test(cuda, quantized_gemv_equals_the_dequantized_gemm) {
    need_cuda();
    const enum toy_dtype q[] = {TOY_Q8_0, TOY_Q4_0, TOY_Q4_1, TOY_Q5_0, TOY_Q5_1, TOY_Q4_K, TOY_Q5_K, TOY_Q6_K,
                                TOY_Q2_K, TOY_Q3_K, TOY_IQ4_NL, TOY_IQ4_XS, TOY_MXFP4};
    for (size_t t = 0; t < sizeof q / sizeof q[0]; t++)
        for (int64_t k = 256; k <= 768; k += 512) {
            struct toy_ctx *ctx = setup(60 + (uint64_t)k);
            const int64_t n = 72;
            struct toy_tensor *w = toy_new_tensor_2d(ctx, q[t], k, n), *a = toy_new_tensor_2d(ctx, TOY_F32, k, 12);
            fill(w, -1.0f, 1.0f);
            fill(a, -1.0f, 1.0f);
            struct toy_tensor *a3 = toy_view(ctx, a, 2, (int64_t[]){k, 3}, (size_t[]){4, a->nb[1]}, 0);
            struct toy_tensor *y12 = toy_matmul(ctx, a, w, false, true), *y3 = toy_matmul(ctx, a3, w, false, true);
            toy_set_output(y12);
            toy_set_output(y3);
            struct toy_graph *g = toy_graph_new(ctx);
            toy_graph_build(g, y12);
            toy_graph_build(g, y3);
            cr_assert_eq(toy_graph_set_device(g, "cuda:0"), TOY_OK, "%s", toy_last_error());
            cr_assert_eq(toy_graph_compute(g, NULL), TOY_OK, "%s", toy_last_error());
            int64_t at;
            double e = rel_err(y3->data, y12->data, 3 * n, &at);
            cr_expect_leq(e, 2e-6, "%s, rows of %lld: GEMV vs GEMM %.3g at %lld", toy_dtype_name(q[t]), (long long)k, e,
                          (long long)at);
            toy_ctx_free(ctx);
        }
}

/* quantized weights under TF32 and BF16 math: chunks of B dequantized to
 * f32 (TF32 GEMM) or to bf16 with A converted (BF16 GEMM), forward and the
 * non-transposed dA product, in several chunks; each test is a process of
 * its own, so the math holds for that test only */
static void quantized_under_math(const char *math) {
    setenv("TOY_CUDA_MATH", math, 1);
    setenv("TOY_CUDA_QCHUNK_KB", "8", 1);
    enum toy_dtype q[] = {TOY_Q8_0, TOY_Q4_0, TOY_Q4_K, TOY_Q6_K};
    for (int i = 0; i < 4; i++) weight_case(q[i], 40, TOL_QUANT);
}

Test(cuda, matmul_quantized_weights_tf32_math) {
    need_cuda();
    quantized_under_math("tf32");
}

Test(cuda, matmul_quantized_weights_bf16_math) {
    need_cuda();
    quantized_under_math("bf16");
}

/* rows longer than a block's threads (block-stride loops, several
 * partial sums per thread), a vocabulary-sized cross-entropy, and products
 * at the GEMV / GEMM switch and with sizes that are no multiple of
 * anything */
Test(cuda, long_rows_and_odd_products, .timeout = 600) {
    need_cuda();
    struct toy_ctx *ctx = setup(21);
    struct toy_tensor *x = param(ctx, 3001, 3, 1, 1), *w = param(ctx, 3001, 1, 1, 1);
    struct toy_tensor *loss = loss_of(ctx, toy_softmax(ctx, x, NULL, 0.7f));
    loss = toy_add(ctx, loss, loss_of(ctx, toy_rms_norm(ctx, x, w, 1e-6f)));
    loss = toy_add(ctx, loss, loss_of(ctx, toy_sum(ctx, x, 0)));
    check(ctx, loss, true, TOL_F32, "rows of 3001");
    toy_ctx_free(ctx);

    ctx = setup(22);
    struct toy_tensor *lg = param(ctx, 5003, 4, 1, 1);
    struct toy_tensor *tg = toy_new_tensor_2d(ctx, TOY_I32, 4, 1);
    int32_t t[] = {0, 5002, -100, 2500};
    memcpy(tg->data, t, sizeof t);
    check(ctx, toy_cross_entropy(ctx, lg, tg, -100), true, TOL_F32, "cross-entropy over 5003");
    toy_ctx_free(ctx);

    ctx = setup(23);
    int64_t sh[][3] = {{1, 1, 1}, {3, 129, 65}, {17, 33, 5}}; /* m, k, n */
    loss = NULL;
    for (int i = 0; i < 3; i++) {
        struct toy_tensor *a = param(ctx, sh[i][1], sh[i][0], 1, 1), *b = param(ctx, sh[i][1], sh[i][2], 1, 1);
        struct toy_tensor *l = loss_of(ctx, toy_matmul(ctx, a, b, false, true));
        loss = loss ? toy_add(ctx, loss, l) : l;
    }
    check(ctx, loss, true, TOL_GEMM, "odd f32 products");
    toy_ctx_free(ctx);
    for (int m = 7; m <= 9; m++) { /* the quantized GEMV takes up to 8 rows */
        weight_case(TOY_Q8_0, m, TOL_QUANT);
        weight_case(TOY_Q4_0, m, TOL_QUANT);
        weight_case(TOY_Q4_K, m, TOL_QUANT);
    }
    /* an odd number of blocks a row: the GEMV's two half-warps end unevenly */
    weight_case_k(TOY_Q8_0, 1, 96, TOL_QUANT);
    weight_case_k(TOY_Q4_0, 3, 160, TOL_QUANT);
}

/* BF16 math converts F32 operands (and A, for F16/BF16 weights) into rows
 * padded to 8 elements: odd sums and odd widths, forward and backward
 * (whose products take the transposes), against the CPU's F32 */
Test(cuda, bf16_math_products_with_odd_rows) {
    need_cuda();
    setenv("TOY_CUDA_MATH", "bf16", 1);
    struct toy_ctx *ctx = setup(25);
    int64_t sh[][3] = {{5, 37, 11}, {3, 129, 65}, {17, 33, 5}, {9, 16, 24}}; /* m, k, n */
    struct toy_tensor *loss = NULL;
    for (int i = 0; i < 4; i++) {
        struct toy_tensor *a = param(ctx, sh[i][1], sh[i][0], 1, 1), *b = param(ctx, sh[i][1], sh[i][2], 1, 1);
        struct toy_tensor *l = loss_of(ctx, toy_matmul(ctx, a, b, false, true));
        loss = loss ? toy_add(ctx, loss, l) : l;
    }
    for (int i = 0; i < 2; i++) {
        struct toy_tensor *a = param(ctx, 37, 6, 1, 1);
        struct toy_tensor *w = toy_new_tensor_2d(ctx, i ? TOY_BF16 : TOY_F16, 37, 13);
        fill(w, -1.0f, 1.0f);
        loss = toy_add(ctx, loss, loss_of(ctx, toy_matmul(ctx, a, w, false, true)));
    }
    check(ctx, loss, true, TOL_HALF, "bf16 math, odd rows");
    toy_ctx_free(ctx);
}

/* C with rows of an odd width (4099 floats: not 16-byte aligned, as
 * GPT-2's 50257-wide logits) runs in chunks of rows through padded
 * scratch (TOY_CUDA_PAD_C: 56-row chunks here, the last shorter): the
 * forward of the first product, and a2's gradient, two products adding
 * into a persistent gradient */
Test(cuda, products_with_unaligned_c_rows, .timeout = 600) {
    need_cuda();
    setenv("TOY_CUDA_PAD_C", "1024", 1);
    struct toy_ctx *ctx = setup(26);
    struct toy_tensor *a = param(ctx, 64, 1100, 1, 1), *b = param(ctx, 64, 4099, 1, 1);
    struct toy_tensor *loss = loss_of(ctx, toy_matmul(ctx, a, b, false, true));
    struct toy_tensor *a2 = param(ctx, 4099, 1100, 1, 1), *b2 = param(ctx, 4099, 48, 1, 1),
                      *b3 = param(ctx, 4099, 16, 1, 1);
    loss = toy_add(ctx, loss, loss_of(ctx, toy_matmul(ctx, a2, b2, false, true)));
    loss = toy_add(ctx, loss, loss_of(ctx, toy_matmul(ctx, a2, b3, false, true))); /* a second term of a2's gradient */
    check(ctx, loss, true, TOL_GEMM, "products with 4099-wide rows of C");
    toy_ctx_free(ctx);
}

/* a quantized weight dequantized in several chunks (TOY_CUDA_QCHUNK_KB:
 * 64-row chunks here; each test runs in a process of its own), forward
 * (chunks are columns of C) and backward (chunks are rows of the sum) */
Test(cuda, quantized_products_in_chunks) {
    need_cuda();
    setenv("TOY_CUDA_QCHUNK_KB", "1", 1);
    struct toy_ctx *ctx = setup(24);
    struct toy_tensor *a = param(ctx, 256, 24, 1, 1);
    struct toy_tensor *w = toy_new_tensor_2d(ctx, TOY_Q4_0, 256, 160), *w2 = toy_new_tensor_2d(ctx, TOY_Q8_0, 160, 200);
    fill(w, -1.0f, 1.0f);
    fill(w2, -1.0f, 1.0f);
    struct toy_tensor *h = toy_linear(ctx, a, w, NULL); /* (24, 160): 3 chunks of w's rows */
    check(ctx, loss_of(ctx, toy_linear(ctx, h, w2, NULL)), true, TOL_QUANT, "quantized products in chunks");
    toy_ctx_free(ctx);
}

Test(cuda, get_rows_forward_backward) {
    need_cuda();
    struct toy_ctx *ctx = setup(9);
    struct toy_tensor *tab = param(ctx, 8, 20, 1, 1);
    struct toy_tensor *ids = toy_new_tensor_2d(ctx, TOY_I32, 5, 3);
    for (int i = 0; i < 15; i++) ((int32_t *)ids->data)[i] = (i * 7) % 20 / (i % 3 + 1); /* repeats */
    struct toy_tensor *qt = toy_new_tensor_2d(ctx, TOY_Q8_0, 32, 20), *mt = toy_new_tensor_2d(ctx, TOY_MXFP4, 64, 20);
    fill(qt, -1.0f, 1.0f);
    fill(mt, -1.0f, 1.0f);
    struct toy_tensor *loss = toy_add(ctx, loss_of(ctx, toy_get_rows(ctx, tab, ids)),
                                      loss_of(ctx, toy_get_rows(ctx, qt, ids)));
    loss = toy_add(ctx, loss, loss_of(ctx, toy_get_rows(ctx, mt, ids)));
    check(ctx, loss, true, TOL_F32, "get_rows");
    toy_ctx_free(ctx);
}

/* MXFP4's E8M0 scales on the device at their edges: the subnormal 2^-128
 * and 2^-127 (e = 0, 1) up to 2^122, each block's 32 values (blocks of 17
 * bytes: rows at odd addresses), read by GET_ROWS with the CPU's bits; and
 * the decode GEMV over weights whose scales are all subnormal or nearly,
 * which a wrong scale would move by orders of magnitude. */
Test(cuda, mxfp4_scales_match_the_cpu) {
    need_cuda();
    struct toy_ctx *ctx = setup(31);
    const int64_t K = 96, R = 24; /* 3 blocks a row, rows of 51 bytes */
    static const uint8_t es[] = {0, 1, 2, 3, 100, 126, 127, 128, 129, 200, 250};
    struct toy_tensor *tab = toy_new_tensor_2d(ctx, TOY_MXFP4, K, R), *w = toy_new_tensor_2d(ctx, TOY_MXFP4, K, 40);
    uint8_t *b = tab->data;
    for (int64_t i = 0; i < (int64_t)toy_nbytes(tab); i++)
        b[i] = i % 17 ? (uint8_t)toy_rng_below(&rng, 256) : es[(i / 17) % sizeof es];
    b = w->data;
    for (int64_t i = 0; i < (int64_t)toy_nbytes(w); i++)
        b[i] = i % 17 ? (uint8_t)toy_rng_below(&rng, 256) : (uint8_t)toy_rng_below(&rng, 3);
    struct toy_tensor *ids = toy_new_tensor_1d(ctx, TOY_I32, R);
    for (int i = 0; i < R; i++) ((int32_t *)ids->data)[i] = (i * 5) % R;
    struct toy_tensor *y = toy_get_rows(ctx, tab, ids), *a = toy_new_tensor_2d(ctx, TOY_F32, K, 3);
    fill(a, -1.0f, 1.0f);
    struct toy_tensor *p = toy_matmul(ctx, a, w, false, true);
    toy_set_output(y);
    toy_set_output(p);
    struct toy_graph *g = toy_graph_new(ctx);
    toy_graph_build(g, y);
    toy_graph_build(g, p);
    struct toy_threadpool *tp = toy_threadpool_new(2);
    cr_assert_eq(toy_graph_compute(g, tp), TOY_OK, "%s", toy_last_error());
    float *ref = copy_f32(y), *pref = copy_f32(p);
    cr_assert_eq(toy_graph_set_device(g, "cuda:0"), TOY_OK, "%s", toy_last_error());
    cr_assert_eq(toy_graph_compute(g, tp), TOY_OK, "%s", toy_last_error());
    float *got = copy_f32(y), *pgot = copy_f32(p);
    int64_t differ = 0, n = toy_nelements(y), at;
    for (int64_t i = 0; i < n; i++) differ += memcmp(&got[i], &ref[i], sizeof *got) != 0;
    cr_expect_eq(differ, 0, "%lld of %lld rows' elements differ from the CPU's bits", (long long)differ, (long long)n);
    double mx = 0, md = 0; /* rel_err's floor (1e-30) is far above these products */
    at = 0;
    for (int64_t i = 0; i < toy_nelements(p); i++) {
        mx = fmax(mx, fabs(pref[i]));
        if (!(fabs((double)pgot[i] - pref[i]) <= md)) md = fabs((double)pgot[i] - pref[i]), at = i;
    }
    cr_expect(mx > 0 && mx < 1e-30, "the products are of subnormal scales: largest %g", mx);
    cr_expect_leq(md, TOL_GEMM * mx, "GEMV over subnormal scales: %.3g of %.3g at %lld (cuda %g, cpu %g)", md, mx,
                  (long long)at, pgot[at], pref[at]);
    free(ref), free(got), free(pref), free(pgot);
    toy_threadpool_free(tp);
    toy_ctx_free(ctx);
}

/* Repeated ids (every common token): GET_ROWS_BACK adds an id's rows in
 * row order, as the CPU does, so the table's gradient has the CPU's bits;
 * float atomics add them in the order the threads happen to run, which on
 * a GPU changes from run to run (and here with the emulator's schedule:
 * 600 rows of 16, 480 of them id 2, over many blocks) */
Test(cuda, get_rows_back_adds_repeated_ids_in_row_order) {
    need_cuda();
    struct toy_ctx *ctx = setup(23);
    struct toy_tensor *tab = param(ctx, 16, 6, 1, 1);
    struct toy_tensor *ids = toy_new_tensor_2d(ctx, TOY_I32, 200, 3);
    for (int i = 0; i < 600; i++) ((int32_t *)ids->data)[i] = i % 5 ? 2 : i % 6;
    struct toy_tensor *loss = loss_of(ctx, toy_get_rows(ctx, tab, ids));
    toy_set_output(loss);
    struct toy_graph *g = toy_graph_new(ctx);
    toy_graph_build(g, loss);
    toy_graph_backward(g, loss);
    struct toy_threadpool *tp = toy_threadpool_new(2);
    cr_assert_eq(toy_graph_compute(g, tp), TOY_OK, "%s", toy_last_error());
    float *ref = copy_f32(tab->grad);
    toy_graph_zero_grads(g);
    cr_assert_eq(toy_graph_set_device(g, "cuda:0"), TOY_OK, "%s", toy_last_error());
    cr_assert_eq(toy_graph_compute(g, tp), TOY_OK, "%s", toy_last_error());
    float *got = copy_f32(tab->grad);
    int64_t n = toy_nelements(tab), differ = 0;
    for (int64_t i = 0; i < n; i++) differ += memcmp(&got[i], &ref[i], sizeof *got) != 0;
    cr_expect_eq(differ, 0, "%lld of %lld gradient elements differ from the CPU's bits", (long long)differ,
                 (long long)n);
    free(ref);
    free(got);
    toy_threadpool_free(tp);
    toy_ctx_free(ctx);
}

Test(cuda, bad_index_is_an_error_not_a_crash) {
    need_cuda();
    struct toy_ctx *ctx = setup(10);
    struct toy_tensor *tab = param(ctx, 8, 20, 1, 1);
    struct toy_tensor *ids = toy_new_tensor_1d(ctx, TOY_I32, 4);
    ((int32_t *)ids->data)[2] = 20;
    struct toy_tensor *y = toy_get_rows(ctx, tab, ids);
    toy_set_output(y);
    struct toy_graph *g = toy_graph_new(ctx);
    toy_graph_build(g, y);
    cr_assert_eq(toy_graph_set_device(g, "cuda"), TOY_OK);
    struct toy_threadpool *tp = toy_threadpool_new(1);
    cr_assert_eq(toy_graph_compute(g, tp), TOY_ERR_RANGE);
    ((int32_t *)ids->data)[2] = 1; /* inputs are uploaded every run */
    cr_assert_eq(toy_graph_compute(g, tp), TOY_OK, "%s", toy_last_error());
    toy_threadpool_free(tp);
    toy_ctx_free(ctx);
}

Test(cuda, cross_entropy_forward_backward) {
    need_cuda();
    struct toy_ctx *ctx = setup(11);
    struct toy_tensor *lg = param(ctx, 50, 7, 3, 1);
    struct toy_tensor *tg = toy_new_tensor_2d(ctx, TOY_I32, 7, 3);
    for (int i = 0; i < 21; i++) ((int32_t *)tg->data)[i] = i % 5 == 0 ? -100 : (i * 13) % 50;
    check(ctx, toy_cross_entropy(ctx, toy_scale(ctx, lg, 4.0f), tg, -100), true, TOL_F32, "cross-entropy");
    toy_ctx_free(ctx);
}

/* a (D, H, T, B) parameter, or (shifted) a view of one starting an element
 * in, so that no row starts 16-byte aligned */
static struct toy_tensor *attn_input(struct toy_ctx *ctx, int D, int H, int T, int B, bool shifted) {
    if (!shifted) return param(ctx, D, H, T, B);
    struct toy_tensor *all = param(ctx, (int64_t)D * H * T * B + 1, 1, 1, 1);
    const int64_t ne[4] = {D, H, T, B};
    const size_t nb[4] = {4, (size_t)D * 4, (size_t)D * H * 4, (size_t)D * H * T * 4};
    return toy_view(ctx, all, 4, ne, nb, 4);
}

static void attention_case_at(int D, int Hq, int Hkv, int Tq, int Tk, struct toy_attn_params p, bool seg,
                              bool shifted, double tol, const char *what) {
    struct toy_ctx *ctx = setup(12);
    const int B = 2;
    struct toy_tensor *q = attn_input(ctx, D, Hq, Tq, B, shifted), *k = attn_input(ctx, D, Hkv, Tk, B, shifted),
                      *v = attn_input(ctx, D, Hkv, Tk, B, shifted);
    struct toy_tensor *y;
    if (seg) {
        struct toy_tensor *s = toy_new_tensor_2d(ctx, TOY_I32, Tq, B);
        for (int b = 0; b < B; b++)
            for (int t = 0; t < Tq; t++) ((int32_t *)s->data)[b * Tq + t] = b ? t / 3 : (t < 5 ? 0 : 7);
        y = toy_attention_seg(ctx, q, k, v, s, &p);
    } else {
        y = toy_attention(ctx, q, k, v, &p);
    }
    /* y itself, not the loss: BF16 rounding is noise that a sum over
     * thousands of terms can leave larger than the sum */
    check_with(ctx, loss_of(ctx, y), y, true, tol, what);
    toy_ctx_free(ctx);
}

static void attention_case(int D, int Hq, int Hkv, int Tq, int Tk, struct toy_attn_params p, bool seg,
                           const char *what) {
    attention_case_at(D, Hq, Hkv, Tq, Tk, p, seg, false, TOL_GEMM, what);
}

Test(cuda, attention_forward_backward) {
    need_cuda();
    attention_case(32, 4, 2, 9, 9, (struct toy_attn_params){.causal = true}, false, "attention causal gqa");
    attention_case(64, 4, 4, 11, 11, (struct toy_attn_params){.causal = true, .window = 3}, false,
                   "attention sliding window");
    attention_case(80, 6, 2, 7, 7, (struct toy_attn_params){.causal = true, .softcap = 5.0f, .scale = 0.3f}, false,
                   "attention softcap, head dim 80");
    attention_case(128, 2, 1, 5, 13, (struct toy_attn_params){.causal = false}, false, "attention full, Tk > Tq");
    attention_case(32, 4, 2, 12, 12, (struct toy_attn_params){.causal = true}, true, "attention packed segments");
}

/* shapes the kernels' tiling and lanes must get right at their edges:
 * head dims that do not fill the lanes (8, 40, 200) or fill every lane
 * slot (256), sequence lengths across several row tiles, a GQA group of 3,
 * Tq < Tk with a window, one query row (a single key would make dQ and dK
 * zero up to rounding: nothing to compare) */
Test(cuda, attention_shape_sweep, .timeout = 600) {
    need_cuda();
    struct {
        int D, Hq, Hkv, Tq, Tk;
        struct toy_attn_params p;
    } c[] = {
        {8, 3, 1, 37, 37, {.causal = true}},
        {40, 6, 2, 21, 45, {.causal = true, .window = 9}},
        {96, 2, 2, 19, 19, {.causal = false, .softcap = 3.0f}},
        {200, 3, 3, 10, 10, {.causal = true}},
        {256, 2, 1, 9, 17, {.causal = true, .window = 5, .softcap = 8.0f}},
        {64, 4, 2, 1, 2, {.causal = true}},
        {64, 4, 2, 1, 23, {.causal = true}},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        char what[96];
        snprintf(what, sizeof what, "attention D %d Hq %d Hkv %d Tq %d Tk %d", c[i].D, c[i].Hq, c[i].Hkv, c[i].Tq,
                 c[i].Tk);
        attention_case(c[i].D, c[i].Hq, c[i].Hkv, c[i].Tq, c[i].Tk, c[i].p, false, what);
    }
}

/* TOY_CUDA_ATTN=simple: the one-row-per-warp kernels (each test runs in a
 * process of its own, so the setting holds for this test only) */
Test(cuda, attention_simple_kernels_forward_backward) {
    need_cuda();
    setenv("TOY_CUDA_ATTN", "simple", 1);
    attention_case(32, 4, 2, 9, 9, (struct toy_attn_params){.causal = true}, false, "simple attention causal gqa");
    attention_case(80, 6, 2, 7, 7, (struct toy_attn_params){.causal = true, .softcap = 5.0f, .scale = 0.3f, .window = 4},
                   false, "simple attention softcap + window, head dim 80");
    attention_case(128, 2, 1, 5, 13, (struct toy_attn_params){.causal = false}, false, "simple attention, Tk > Tq");
    attention_case(32, 4, 2, 12, 12, (struct toy_attn_params){.causal = true}, true, "simple attention segments");
}

/* BF16 math (TOY_CUDA_MATH=bf16, as mixed-precision training runs): the
 * tensor-core kernels (head dims 16..128, multiples of 16) round q, k, v,
 * dO, P and dS to BF16, hence TOL_ATTN_BF16. Shapes at their edges: the
 * smallest and largest head dims, D = 80 (5 of 8 fragments), rows that
 * fill part of a warp's 16 or of a block's 64, two query tiles, Tq < Tk
 * with a window, a window wide enough for whole tiles (the kernels' fast
 * tiles: no masks) beside partly masked ones, and two shapes (33 x 47 and
 * 33 x 50) whose tiles fall one row or key off whole, at each of a fast
 * tile's four edges (queries' and keys' side, bottom and top), Tq > Tk, GQA groups of 2 and 3, softcap, packed
 * segments, rows that are not 16-byte aligned; and D = 40, which the F32
 * kernels take under BF16 math. */
/* a table of attention shapes, each run through attention_case_at */
struct attn_case {
    int D, Hq, Hkv, Tq, Tk;
    struct toy_attn_params p;
    bool seg;
};

static void attention_cases(const struct attn_case *c, size_t n, const char *label) {
    for (size_t i = 0; i < n; i++) {
        char what[112];
        snprintf(what, sizeof what, "%s attention D %d Hq %d Hkv %d Tq %d Tk %d%s", label, c[i].D, c[i].Hq, c[i].Hkv,
                 c[i].Tq, c[i].Tk, c[i].seg ? " segments" : "");
        attention_case_at(c[i].D, c[i].Hq, c[i].Hkv, c[i].Tq, c[i].Tk, c[i].p, c[i].seg, false, TOL_ATTN_BF16, what);
    }
}

Test(cuda, attention_bf16_tensor_cores, .timeout = 600) {
    need_cuda();
    setenv("TOY_CUDA_MATH", "bf16", 1);
    const struct attn_case c[] = {
        {16, 2, 1, 37, 37, {.causal = true}, false},
        {64, 4, 2, 70, 70, {.causal = true}, false},
        {64, 3, 1, 33, 100, {.causal = true, .window = 20}, false},
        {64, 2, 1, 90, 100, {.causal = true, .window = 48}, false},
        {64, 2, 1, 33, 47, {.causal = true}, false},
        {64, 2, 1, 33, 50, {.causal = true, .window = 48}, false},
        {128, 2, 2, 19, 19, {.causal = false, .softcap = 3.0f}, false},
        {80, 2, 1, 24, 24, {.causal = true, .scale = 0.3f}, false},
        {32, 2, 2, 40, 16, {.causal = false}, false},
        {64, 4, 2, 45, 45, {.causal = true}, true},
        {40, 2, 2, 9, 9, {.causal = true}, false},
    };
    attention_cases(c, sizeof c / sizeof c[0], "bf16");
    /* rows that do not start 16-byte aligned: the element-wise staging */
    attention_case_at(64, 4, 2, 70, 70, (struct toy_attn_params){.causal = true}, false, true, TOL_ATTN_BF16,
                      "bf16 attention, unaligned rows");
    /* dQ from the scores computed again, as when the stored dS would not
     * fit (TOY_CUDA_ATTN_DS_MB); above, dQ reads the dS that dK/dV stored */
    setenv("TOY_CUDA_ATTN_DS_MB", "0", 1);
    attention_case_at(64, 4, 2, 70, 70, (struct toy_attn_params){.causal = true}, false, false, TOL_ATTN_BF16,
                      "bf16 attention, dQ recomputing dS");
    attention_case_at(64, 2, 1, 33, 50, (struct toy_attn_params){.causal = true, .window = 48}, false, false,
                      TOL_ATTN_BF16, "bf16 attention, dQ recomputing dS, window");
    attention_case_at(64, 4, 2, 45, 45, (struct toy_attn_params){.causal = true}, true, false, TOL_ATTN_BF16,
                      "bf16 attention, dQ recomputing dS, segments");
    unsetenv("TOY_CUDA_ATTN_DS_MB");
}

/* Attention on mma.sync (TOY_CUDA_ATTN=mma: scores in registers, tiles of
 * 64): the forward, and dK/dV for head dims up to 64 (the wmma kernel
 * above that), with dQ from the dS they store: the edge shapes of the bf16
 * test above; two (17 x 79, 17 x 82 with a window of 80) whose 64-key
 * tiles fall one key off whole at the forward's fast tiles' top and bottom
 * edge, and two (64 x 78, 64 x 81 with a window of 80) whose 64-query
 * tiles do so for dK/dV's; then dQ recomputing dS beside the mma dK/dV. */
Test(cuda, attention_bf16_mma, .timeout = 600) {
    need_cuda();
    setenv("TOY_CUDA_MATH", "bf16", 1);
    setenv("TOY_CUDA_ATTN", "mma", 1);
    const struct attn_case c[] = {
        {16, 2, 1, 37, 37, {.causal = true}, false},
        {64, 4, 2, 70, 70, {.causal = true}, false},
        {64, 2, 1, 90, 100, {.causal = true, .window = 48}, false},
        {64, 2, 1, 17, 79, {.causal = true}, false},
        {64, 2, 1, 17, 82, {.causal = true, .window = 80}, false},
        {64, 2, 1, 64, 78, {.causal = true}, false},
        {64, 2, 1, 64, 81, {.causal = true, .window = 80}, false},
        {128, 2, 2, 19, 19, {.causal = false, .softcap = 3.0f}, false},
        {80, 2, 1, 24, 24, {.causal = true, .scale = 0.3f}, false},
        {32, 2, 2, 40, 16, {.causal = false}, false},
        {64, 4, 2, 45, 45, {.causal = true}, true},
    };
    attention_cases(c, sizeof c / sizeof c[0], "mma");
    attention_case_at(64, 4, 2, 70, 70, (struct toy_attn_params){.causal = true}, false, true, TOL_ATTN_BF16,
                      "mma attention, unaligned rows");
    setenv("TOY_CUDA_ATTN_DS_MB", "0", 1);
    attention_case_at(64, 2, 1, 90, 100, (struct toy_attn_params){.causal = true, .window = 48}, false, false,
                      TOL_ATTN_BF16, "mma attention, dQ recomputing dS");
    unsetenv("TOY_CUDA_ATTN_DS_MB");
}

/* The mock runtime's allocation limit (tools/cuda-mock.c; absent on a GPU) */
extern size_t toy_cu_mock_max_alloc __attribute__((weak));

/* The tensor-core backward's stored dS (8 MiB here, B Hq Tk Tq BF16) only
 * speeds dQ up: a device that cannot hold it still runs the graph, with dQ
 * computing the scores again, rather than failing for want of memory. Every
 * other allocation here is under 6 MiB, once the device is up. */
Test(cuda, attention_backward_without_room_for_ds, .timeout = 600) {
    need_cuda();
    size_t *volatile max_alloc = &toy_cu_mock_max_alloc; /* (a weak symbol: may be NULL) */
    if (!max_alloc) cr_skip_test("needs the mock runtime's allocation limit (make CUDA_MOCK=1 or CUDA_EMU=1)");
    setenv("TOY_CUDA_MATH", "bf16", 1);
    struct toy_ctx *ctx = setup(5); /* cuda:0 comes up (its 32 MiB cuBLAS workspace) before the limit */
    check(ctx, toy_sum_all(ctx, param(ctx, 8, 1, 1, 1)), false, TOL_GEMM, "device start");
    toy_ctx_free(ctx);
    *max_alloc = (size_t)6 << 20;
    attention_case_at(16, 8, 1, 512, 512, (struct toy_attn_params){.causal = true}, false, false, TOL_ATTN_BF16,
                      "bf16 attention, no room for dS");
    *max_alloc = 0;
}

/* The one-pass tensor-core forward moves a row's max (and rescales its
 * accumulators) when a key tile's scores pass it by more than 8: here
 * head 0's scores climb by 1 a key (32 a tile: a rescale at every tile),
 * head 1's fall (the first tile's max holds). q and k are exact in BF16,
 * so the scores are the CPU's. */
Test(cuda, attention_bf16_rescales_when_scores_climb, .timeout = 600) {
    need_cuda();
    setenv("TOY_CUDA_MATH", "bf16", 1);
    struct toy_ctx *ctx = setup(13);
    const int D = 64, Hq = 2, T = 100, B = 2;
    struct toy_tensor *q = param(ctx, D, Hq, T, B), *k = param(ctx, D, 1, T, B), *v = param(ctx, D, 1, T, B);
    for (int64_t i = 0; i < toy_nelements(q); i++) ((float *)q->data)[i] = i / D % Hq ? -1.0f : 1.0f;
    for (int64_t i = 0; i < toy_nelements(k); i++) ((float *)k->data)[i] = (float)(i / D % T) / 8.0f;
    struct toy_attn_params p = {.causal = true};
    struct toy_tensor *y = toy_attention(ctx, q, k, v, &p);
    /* the forward only: scores this large amplify the BF16 rounding of the
     * backward's dS past any useful tolerance (the two-pass forward's too) */
    check_with(ctx, loss_of(ctx, y), y, false, TOL_ATTN_BF16, "bf16 attention, climbing scores");
    toy_ctx_free(ctx);
}

/* Mixed precision marks products, not the device: toy_linear_bf16 over f32
 * weights (forward, dX, dW) and attention with toy_attn_params.bf16 run in
 * BF16 math under the default F32 math, against the CPU's own bf16 (or,
 * without AVX-512 BF16, f32) products */
Test(cuda, marked_products_run_in_bf16_math) {
    need_cuda();
    struct toy_ctx *ctx = setup(31);
    struct toy_tensor *x = param(ctx, 96, 40, 1, 1), *w = param(ctx, 96, 50, 1, 1);
    struct toy_tensor *y = toy_linear_bf16(ctx, x, w, NULL, true);
    check_with(ctx, loss_of(ctx, y), y, true, TOL_HALF, "bf16-marked linear over f32 weights");
    toy_ctx_free(ctx);
    attention_case_at(64, 4, 2, 70, 70, (struct toy_attn_params){.causal = true, .bf16 = true}, false, false,
                      TOL_ATTN_BF16, "bf16-marked attention");
}

/* decode steps through toy_kv_store + toy_attention_cached, cache on each side */
static struct toy_tensor *decode_graph(struct toy_ctx *ctx, struct toy_tensor *kc, struct toy_tensor *vc,
                                       struct toy_tensor **x, struct toy_tensor **q, struct toy_tensor *np) {
    *x = toy_new_tensor_4d(ctx, TOY_F32, 32, 2, 2, 1);
    *q = toy_new_tensor_4d(ctx, TOY_F32, 32, 4, 2, 1);
    struct toy_tensor *ks = toy_kv_store(ctx, kc, *x, np), *vs = toy_kv_store(ctx, vc, toy_scale(ctx, *x, -0.5f), np);
    struct toy_attn_params p = {.causal = true};
    return toy_attention_cached(ctx, *q, ks, vs, np, &p);
}

/* one decode step on both sides ([0] the CPU, [1] the device) with the
 * same new rows x, queries q and n_past; the output's difference */
static double decode_step(struct toy_tensor **x, struct toy_tensor **q, struct toy_tensor **np, struct toy_graph **g,
                          struct toy_tensor **y, int past, struct toy_threadpool *tp) {
    fill(x[0], -1, 1);
    fill(q[0], -1, 1);
    memcpy(x[1]->data, x[0]->data, toy_nbytes(x[0]));
    memcpy(q[1]->data, q[0]->data, toy_nbytes(q[0]));
    for (int s = 0; s < 2; s++) {
        *(int32_t *)np[s]->data = past;
        cr_assert_eq(toy_graph_compute(g[s], tp), TOY_OK, "%s", toy_last_error());
    }
    int64_t at;
    return rel_err(y[1]->data, y[0]->data, toy_nelements(y[0]), &at);
}

static void kv_case(enum toy_dtype type) {
    toy_rng_seed(&rng, 13);
    struct toy_ctx *ctx = toy_ctx_init(true);
    struct toy_tensor *kc[2], *vc[2], *x[2], *q[2], *np[2], *y[2];
    struct toy_graph *g[2];
    for (int s = 0; s < 2; s++) {
        kc[s] = toy_new_tensor_4d(ctx, type, 32, 2, 16, 1);
        vc[s] = toy_new_tensor_4d(ctx, type, 32, 2, 16, 1);
        np[s] = toy_new_tensor_1d(ctx, TOY_I32, 1);
        y[s] = decode_graph(ctx, kc[s], vc[s], &x[s], &q[s], np[s]);
        toy_set_output(y[s]);
        g[s] = toy_graph_new(ctx);
        toy_graph_build(g[s], y[s]);
    }
    cr_assert_eq(toy_graph_set_device(g[1], "cuda:0"), TOY_OK);
    struct toy_threadpool *tp = toy_threadpool_new(2);
    double worst = 0;
    for (int step = 0; step < 7; step++) worst = fmax(worst, decode_step(x, q, np, g, y, 2 * step, tp));
    /* the rows the device stored came back to the host cache */
    int64_t at;
    float *a = copy_f32(kc[0]), *b = copy_f32(kc[1]);
    cr_expect_leq(rel_err(b, a, toy_nelements(kc[0]), &at), 1e-6, "host copy of the device cache");
    free(a);
    free(b);
    cr_log_info("%s cache: decode max rel diff %.2e", toy_dtype_name(type), worst);
    cr_expect_leq(worst, TOL_GEMM);
    /* past the cache: an error on both sides */
    *(int32_t *)np[1]->data = 15;
    cr_assert_eq(toy_graph_compute(g[1], tp), TOY_ERR_RANGE);
    toy_threadpool_free(tp);
    toy_ctx_free(ctx);
}

/* a host write into a cache reaches the device copy through toy_device_update */
Test(cuda, host_writes_reach_the_device_with_toy_device_update) {
    need_cuda();
    toy_rng_seed(&rng, 17);
    struct toy_ctx *ctx = toy_ctx_init(true);
    struct toy_tensor *kc = toy_new_tensor_4d(ctx, TOY_F32, 32, 2, 8, 1), *vc = toy_new_tensor_4d(ctx, TOY_F32, 32, 2, 8, 1);
    struct toy_tensor *np = toy_new_tensor_1d(ctx, TOY_I32, 1), *x, *q;
    struct toy_tensor *y = decode_graph(ctx, kc, vc, &x, &q, np);
    toy_set_output(y);
    struct toy_graph *g = toy_graph_new(ctx);
    toy_graph_build(g, y);
    cr_assert_eq(toy_graph_set_device(g, "cuda:0"), TOY_OK);
    struct toy_threadpool *tp = toy_threadpool_new(1);
    fill(x, -1, 1);
    fill(q, -1, 1);
    *(int32_t *)np->data = 2;
    cr_assert_eq(toy_graph_compute(g, tp), TOY_OK, "%s", toy_last_error());
    float *before = copy_f32(y);
    /* rows 0..1 were never stored by the graph: write them on the host */
    for (int i = 0; i < 2 * 2 * 32; i++) ((float *)kc->data)[i] = ((float *)vc->data)[i] = 3.0f * (float)(i % 5) - 6.0f;
    toy_device_update(kc->data, (size_t)2 * kc->nb[2]);
    toy_device_update(vc->data, (size_t)2 * vc->nb[2]);
    cr_assert_eq(toy_graph_compute(g, tp), TOY_OK, "%s", toy_last_error());
    float *dev = copy_f32(y);
    /* the CPU on the same host cache is the oracle */
    cr_assert_eq(toy_graph_set_device(g, "cpu"), TOY_OK);
    cr_assert_eq(toy_graph_compute(g, tp), TOY_OK, "%s", toy_last_error());
    int64_t at;
    double e = rel_err(dev, y->data, toy_nelements(y), &at), moved = rel_err(before, y->data, toy_nelements(y), &at);
    cr_expect_leq(e, TOL_GEMM, "the device did not see the host's rows: %.3e", e);
    cr_expect_gt(moved, 1e-3, "the host rows changed nothing (test is vacuous)");
    free(before);
    free(dev);
    toy_threadpool_free(tp);
    toy_ctx_free(ctx);
}

Test(cuda, kv_cache_decode_matches_cpu) {
    need_cuda();
    kv_case(TOY_F32);
    kv_case(TOY_F16);
}

/* Decode with a long cache: the split-key kernels cut the keys into
 * chunks (some empty, some uneven) and merge them. The caches start full
 * of the same random rows on both sides; steps jump through n_past. */
static void long_decode_case(enum toy_dtype type, int D, int Hq, int Hkv, int rows, int n_rows, double tol) {
    toy_rng_seed(&rng, 19);
    struct toy_ctx *ctx = toy_ctx_init(true);
    const int L = 333;
    struct toy_tensor *kc[2], *vc[2], *x[2], *q[2], *np[2], *y[2];
    struct toy_graph *g[2];
    for (int s = 0; s < 2; s++) {
        kc[s] = toy_new_tensor_4d(ctx, type, D, Hkv, L, 1);
        vc[s] = toy_new_tensor_4d(ctx, type, D, Hkv, L, 1);
        if (s == 0) {
            fill(kc[0], -1, 1);
            fill(vc[0], -2, 2);
        } else {
            memcpy(kc[1]->data, kc[0]->data, toy_nbytes(kc[0]));
            memcpy(vc[1]->data, vc[0]->data, toy_nbytes(vc[0]));
        }
        np[s] = toy_new_tensor_1d(ctx, TOY_I32, 1);
        x[s] = toy_new_tensor_4d(ctx, TOY_F32, D, Hkv, rows, 1);
        q[s] = toy_new_tensor_4d(ctx, TOY_F32, D, Hq, rows, 1);
        struct toy_tensor *ks = toy_kv_store(ctx, kc[s], x[s], np[s]), *vs = toy_kv_store(ctx, vc[s], x[s], np[s]);
        struct toy_attn_params p = {.causal = true};
        y[s] = toy_attention_cached(ctx, q[s], ks, vs, np[s], &p);
        toy_set_output(y[s]);
        g[s] = toy_graph_new(ctx);
        toy_graph_build(g[s], y[s]);
    }
    cr_assert_eq(toy_graph_set_device(g[1], "cuda:0"), TOY_OK);
    struct toy_threadpool *tp = toy_threadpool_new(2);
    const int at_past[] = {0, 5, 31, 32, 33, 100, 257, L - 8};
    double worst = 0;
    for (int i = 0; i < n_rows && i < 8; i++) {
        int past = at_past[i] + rows <= L ? at_past[i] : L - rows;
        double e = decode_step(x, q, np, g, y, past, tp);
        cr_expect_leq(e, tol, "%s cache, D %d, %d rows at n_past %d: %.3e", toy_dtype_name(type), D, rows, past, e);
        worst = fmax(worst, e);
    }
    cr_log_info("%s cache, D %d, %d query rows, cache %d: decode max rel diff %.2e", toy_dtype_name(type), D, rows, L,
                worst);
    toy_threadpool_free(tp);
    toy_ctx_free(ctx);
}

Test(cuda, kv_cache_decode_long_context, .timeout = 600) {
    need_cuda();
    long_decode_case(TOY_F16, 64, 9, 3, 1, 8, TOL_GEMM); /* SmolLM2's heads */
    long_decode_case(TOY_F32, 40, 4, 2, 3, 8, TOL_GEMM); /* a few rows, a head dim that leaves lanes idle */
    long_decode_case(TOY_F16, 128, 2, 1, 8, 4, TOL_GEMM); /* the most rows the split kernels take */
    long_decode_case(TOY_F16, 576, 4, 1, 1, 8, TOL_GEMM); /* DeepSeek's latent: wide heads, one kv head */
    long_decode_case(TOY_F32, 330, 2, 1, 3, 4, TOL_GEMM); /* wide, and lanes left idle */
}

/* heads wider than 256 (DeepSeek's latent attention, 512 + 64): the forward, causal over a prompt, with values
 * that are the keys as the latent's are */
Test(cuda, attention_wide_heads_forward) {
    need_cuda();
    const int64_t Ds[] = {576, 300};
    for (int i = 0; i < 2; i++) {
        struct toy_ctx *ctx = setup(60 + (uint64_t)i);
        struct toy_tensor *q = toy_new_tensor_4d(ctx, TOY_F32, Ds[i], 4, 13, 2);
        struct toy_tensor *k = toy_new_tensor_4d(ctx, TOY_F32, Ds[i], 1, 13, 2);
        fill(q, -0.2f, 0.2f);
        fill(k, -1.0f, 1.0f);
        struct toy_attn_params p = {.causal = true, .scale = 0.07f};
        char what[64];
        snprintf(what, sizeof what, "attention, head dim %lld", (long long)Ds[i]);
        check(ctx, toy_attention(ctx, q, k, k, &p), false, TOL_GEMM, what);
        toy_ctx_free(ctx);
    }
}

/* a prefill into a cache under BF16 math: more rows than the split
 * kernels take, so the tensor-core forward reads the F16 / F32 cache with
 * n_past from the device */
Test(cuda, kv_cache_prefill_bf16_tensor_cores, .timeout = 600) {
    need_cuda();
    setenv("TOY_CUDA_MATH", "bf16", 1);
    long_decode_case(TOY_F16, 64, 9, 3, 12, 8, TOL_ATTN_BF16);
    long_decode_case(TOY_F32, 32, 4, 2, 70, 3, TOL_ATTN_BF16);
}

/* the same through the mma.sync forward (TOY_CUDA_ATTN=mma): an F16 cache
 * staged through its half loads, n_past from the device */
Test(cuda, kv_cache_prefill_bf16_mma, .timeout = 600) {
    need_cuda();
    setenv("TOY_CUDA_MATH", "bf16", 1);
    setenv("TOY_CUDA_ATTN", "mma", 1);
    long_decode_case(TOY_F16, 64, 9, 3, 12, 8, TOL_ATTN_BF16);
    long_decode_case(TOY_F32, 32, 4, 2, 70, 3, TOL_ATTN_BF16);
}

/* ---- a model ---------------------------------------------------------------------------------- */

static struct toy_llama_config small_llama(void) {
    struct toy_llama_config c = toy_llama_preset("tiny");
    c.vocab = 61;
    c.d_model = 64;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.d_ff = 96;
    c.n_layers = 2;
    c.max_ctx = 64;
    return c;
}

/* tokens {16, 2} of a 61-token vocabulary and their positions, for the small models' forward */
static void model_batch(struct toy_ctx *ctx, struct toy_tensor **tok, struct toy_tensor **pos) {
    const int T = 16, B = 2;
    *tok = toy_new_tensor_2d(ctx, TOY_I32, T, B);
    *pos = toy_new_tensor_1d(ctx, TOY_I32, T);
    for (int i = 0; i < T * B; i++) ((int32_t *)(*tok)->data)[i] = (i * 17 + 3) % 61;
    for (int t = 0; t < T; t++) ((int32_t *)(*pos)->data)[t] = t;
}

Test(cuda, llama_logits_match_cpu) {
    need_cuda();
    struct toy_llama_config c = small_llama();
    struct toy_llama *m = toy_llama_new(&c, 5);
    cr_assert(m);
    struct toy_ctx *ctx = setup(14);
    struct toy_tensor *tok, *pos;
    model_batch(ctx, &tok, &pos);
    check(ctx, toy_llama_forward(ctx, m, tok, pos), false, TOL_GEMM, "llama logits");
    toy_ctx_free(ctx);
    toy_llama_free(m);
}

/* Gemma 3 in small, loss and gradients: QK-norm, sandwich norms, GeGLU, and of each 3 layers two sliding (window
 * 5 over 16 positions) with their own RoPE base, unscaled, the third global with rope_base, linearly scaled */
Test(cuda, gemma3_loss_and_gradients_match_cpu) {
    need_cuda();
    struct toy_llama_config c = small_llama();
    snprintf(c.arch, sizeof c.arch, "gemma3");
    c.rope_mode = TOY_ROPE_NEOX;
    c.qk_norm = c.sandwich_norm = c.embed_scale = c.gelu_mlp = true;
    c.head_dim = 32, c.attn_scale = 1.0f / sqrtf(32.0f);
    c.n_layers = 3, c.sliding_window = 5, c.swa_period = 3;
    c.rope_base = 1000000.0f, c.rope_base_swa = 10000.0f;
    c.rope_scaling = TOY_ROPE_SCALING_LINEAR, c.rope_factor = 2, c.rope_orig_ctx = 64;
    struct toy_llama *m = toy_llama_new(&c, 8);
    cr_assert(m, "%s", toy_last_error());
    struct toy_ctx *ctx = setup(16);
    struct toy_tensor *tok, *pos;
    model_batch(ctx, &tok, &pos);
    check(ctx, loss_of(ctx, toy_llama_forward(ctx, m, tok, pos)), true, TOL_GEMM, "gemma3 loss and gradients");
    toy_ctx_free(ctx);
    toy_llama_free(m);
}

/* m written as a Q8_0 GGUF (a temporary file) and loaded back mapped, in its place */
static struct toy_llama *reloaded_q8_0(struct toy_llama *m) {
    char path[] = "/tmp/toy-cuda-q8-XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    close(fd);
    th_save_llama(m, TOY_Q8_0, path);
    toy_llama_free(m);
    cr_assert_eq(toy_llama_load(path, false, &m), TOY_OK, "%s", toy_last_error());
    unlink(path); /* (the mapping stays) */
    return m;
}

/* Phi-4-mini in small: 12 of each head's 16 dims rotate, LongRoPE past 8 positions with its attention factor, every
 * layer sliding (window 5) */
static struct toy_llama_config small_phi3(void) {
    struct toy_llama_config c = small_llama();
    snprintf(c.arch, sizeof c.arch, "phi3");
    c.rope_mode = TOY_ROPE_NEOX, c.rope_dim = 12, c.rope_orig_ctx = 8, c.rope_attn_factor = 1.19f;
    c.sliding_window = 5, c.tied = false;
    return c;
}

/* gpt-oss in small: wide heads with biases and sinks, even layers sliding (window 5), YaRN, four experts of which
 * two a token, with biases and the clamped SwiGLU */
static struct toy_llama_config small_gptoss(void) {
    struct toy_llama_config c = small_llama();
    snprintf(c.arch, sizeof c.arch, "gpt-oss");
    c.rope_mode = TOY_ROPE_NEOX, c.head_dim = 24, c.sliding_window = 5, c.swa_period = 2;
    c.qkv_bias = c.out_bias = c.attn_sinks = c.moe_biases = true, c.swiglu_limit = 7.0f;
    c.n_experts = 4, c.n_experts_used = 2, c.d_ff_expert = 32, c.moe_norm = true;
    c.rope_scaling = TOY_ROPE_SCALING_YARN, c.rope_factor = 4, c.rope_orig_ctx = 8, c.tied = false;
    return c;
}

/* c's model, random; a phi3 one with LongRoPE's two tables; a gpt-oss one with sinks and biases not zero, and
 * experts large enough to reach the SwiGLU's clamps */
static struct toy_llama *new_model(const struct toy_llama_config *c, uint64_t seed) {
    struct toy_llama *m = toy_llama_new(c, seed);
    cr_assert(m, "%s", toy_last_error());
    for (int64_t l = 0; l < c->n_layers && !strcmp(c->arch, "gpt-oss"); l++) {
        struct toy_llama_layer *L = &m->layers[l];
        if (L->attn_sinks) fill(L->attn_sinks, -2.0f, 2.0f);
        struct toy_tensor *const b[] = {L->bq, L->bk, L->bv, L->bo, L->ffn_gate_inp_b, L->ffn_gate_exps_b,
                                        L->ffn_up_exps_b, L->ffn_down_exps_b};
        for (int i = 0; i < 8; i++)
            if (b[i]) fill(b[i], i >= 5 && i < 7 ? -6.0f : -0.5f, i >= 5 && i < 7 ? 6.0f : 0.5f);
        if (L->ffn_gate_exps) fill(L->ffn_gate_exps, -0.6f, 0.6f), fill(L->ffn_up_exps, -0.6f, 0.6f);
    }
    if (strcmp(c->arch, "phi3")) return m;
    m->rope_long = toy_set_name(toy_new_tensor_1d(m->ctx, TOY_F32, 6), "rope_factors_long.weight");
    m->rope_short = toy_set_name(toy_new_tensor_1d(m->ctx, TOY_F32, 6), "rope_factors_short.weight");
    for (int i = 0; i < 6; i++) ((float *)m->rope_long->data)[i] = 1.0f + 0.7f * i, ((float *)m->rope_short->data)[i] = 1.0f;
    return m;
}

/* Phi-4-mini in small (the long table: 16 positions): loss and gradients; then the model written as a Q8_0 phi3
 * file (q, k, v in one attn_qkv, gate and up in one ffn_up) and run from its mapping, each projection a view of
 * its fused tensor's rows */
Test(cuda, phi3_loss_gradients_and_fused_file_match_cpu) {
    need_cuda();
    struct toy_llama_config c = small_phi3();
    struct toy_llama *m = new_model(&c, 9);
    struct toy_ctx *ctx = setup(16);
    struct toy_tensor *tok, *pos;
    model_batch(ctx, &tok, &pos);
    check(ctx, loss_of(ctx, toy_llama_forward(ctx, m, tok, pos)), true, TOL_GEMM, "phi3 loss and gradients");
    toy_ctx_free(ctx);
    m = reloaded_q8_0(m);
    cr_assert(m->layers[1].wk->type == TOY_Q8_0 && m->rope_long, "the fused rows, mapped");
    ctx = setup(16);
    model_batch(ctx, &tok, &pos);
    check(ctx, toy_llama_forward(ctx, m, tok, pos), false, TOL_QUANT, "phi3 q8_0 logits");
    toy_ctx_free(ctx);
    toy_llama_free(m);
}

/* gpt-oss in small: loss and every gradient (the sinks', the experts' biases', the clamped SwiGLU's) */
Test(cuda, gptoss_loss_and_gradients_match_cpu) {
    need_cuda();
    struct toy_llama_config c = small_gptoss();
    struct toy_llama *m = new_model(&c, 11);
    struct toy_ctx *ctx = setup(17);
    struct toy_tensor *tok, *pos;
    model_batch(ctx, &tok, &pos);
    check(ctx, loss_of(ctx, toy_llama_forward(ctx, m, tok, pos)), true, TOL_GEMM, "gpt-oss loss and gradients");
    toy_ctx_free(ctx);
    toy_llama_free(m);
}

/* Mixtures of experts: the router and the experts' products on the device
 * against the CPU, weights f32, f16, Q8_0, Q4_K and MXFP4, per slot and
 * combined, one token (decode) and many; then a Qwen3-MoE's logits. */
Test(cuda, moe_route_and_products_match_cpu) {
    need_cuda();
    const enum toy_dtype types[] = {TOY_F32, TOY_F16, TOY_Q8_0, TOY_Q4_K, TOY_MXFP4};
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++)
        for (int N = 1; N <= 37; N += 36)
            for (int combine = 0; combine < 2; combine++) {
                struct toy_ctx *ctx = setup(40 + ti * 4 + (uint64_t)N + (uint64_t)combine);
                const int64_t E = 6, k = 2, K = types[ti] == TOY_Q4_K ? 256 : 96, n = 70;
                struct toy_tensor *lg = toy_new_tensor_2d(ctx, TOY_F32, E, N);
                struct toy_tensor *x = toy_new_tensor_3d(ctx, TOY_F32, K, combine ? k : 1, N);
                struct toy_tensor *w = toy_new_tensor_3d(ctx, types[ti], K, n, E);
                fill(lg, -3.0f, 3.0f);
                fill(x, -1.0f, 1.0f);
                fill(w, -0.3f, 0.3f);
                struct toy_tensor *r = toy_moe_route(ctx, lg, (int)k, combine);
                char what[96];
                snprintf(what, sizeof what, "moe %s, %d tokens%s", toy_dtype_name(types[ti]), N,
                         combine ? ", combined" : "");
                check(ctx, toy_moe_matmul(ctx, x, w, r, combine), false,
                      types[ti] == TOY_F32 ? TOL_GEMM : TOL_HALF, what);
                toy_ctx_free(ctx);
            }
    for (int norm = 0; norm < 2; norm++) { /* DeepSeek-V3's sigmoid scores, chosen with a bias */
        struct toy_ctx *ctx = setup(70 + (uint64_t)norm);
        const int64_t E = 8, k = 3, K = 64, n = 40, N = 21;
        struct toy_tensor *lg = toy_new_tensor_2d(ctx, TOY_F32, E, N), *bias = toy_new_tensor_1d(ctx, TOY_F32, E);
        struct toy_tensor *x = toy_new_tensor_3d(ctx, TOY_F32, K, 1, N), *w = toy_new_tensor_3d(ctx, TOY_F32, K, n, E);
        fill(lg, -3.0f, 3.0f);
        fill(bias, -0.5f, 0.5f);
        fill(x, -1.0f, 1.0f);
        fill(w, -0.3f, 0.3f);
        struct toy_tensor *r = toy_moe_route_scored(ctx, lg, (int)k, norm, true, bias);
        check(ctx, toy_moe_matmul(ctx, x, w, r, true), false, TOL_GEMM, norm ? "moe sigmoid, renormalised" : "moe sigmoid");
        toy_ctx_free(ctx);
    }
}

/* A mixture's gradients on the device: the input's (per pair, summed over
 * the slots that share a row), the experts' and, through the combined
 * product's route weights, the router's; softmax or sigmoid scores,
 * renormalised or not; f32 experts trained, or Q8_0 ones frozen (QLoRA) */
Test(cuda, moe_backward_matches_cpu) {
    need_cuda();
    for (int v = 0; v < 5; v++) {
        struct toy_ctx *ctx = setup(90 + (uint64_t)v);
        const int64_t E = 5, k = 2, d = 64, f = 32, N = 9;
        bool sigmoid = v >= 2 && v < 4, norm = v % 2 == 1, frozen = v == 4;
        struct toy_tensor *h = param(ctx, d, N, 1, 1), *router = param(ctx, d, E, 1, 1);
        struct toy_tensor *w[3];
        for (int i = 0; i < 3; i++) {
            w[i] = toy_new_tensor_3d(ctx, frozen ? TOY_Q8_0 : TOY_F32, i == 2 ? f : d, i == 2 ? d : f, E);
            fill(w[i], -0.5f, 0.5f);
            if (!frozen) toy_set_param(w[i]);
        }
        struct toy_tensor *lg = toy_reshape_2d(ctx, toy_linear(ctx, h, router, NULL), E, N);
        struct toy_tensor *r = toy_moe_route_scored(ctx, lg, (int)k, norm, sigmoid, NULL);
        struct toy_tensor *x = toy_reshape_3d(ctx, h, d, 1, N);
        struct toy_tensor *g = toy_moe_matmul(ctx, x, w[0], r, false), *u = toy_moe_matmul(ctx, x, w[1], r, false);
        struct toy_tensor *y = toy_moe_matmul(ctx, toy_swiglu(ctx, g, u), w[2], r, true);
        char what[96];
        snprintf(what, sizeof what, "moe backward, %s%s%s", sigmoid ? "sigmoid" : "softmax", norm ? ", renormalised" : "",
                 frozen ? ", Q8_0 experts" : "");
        check(ctx, loss_of(ctx, y), true, TOL_GEMM, what);
        toy_ctx_free(ctx);
    }
}

/* DeepSeek's shape in small: latent attention (through a query latent, YaRN's attention correction), a dense
 * first layer, then experts scored by sigmoids with a bias, and a shared one */
static struct toy_llama_config small_deepseek(void) {
    struct toy_llama_config c = small_llama();
    snprintf(c.arch, sizeof c.arch, "deepseek2");
    c.n_kv_heads = 1, c.kv_lora_rank = 32, c.q_lora_rank = 24, c.rope_dim = 8, c.head_dim = 24, c.head_dim_v = 16;
    c.rope_scaling = TOY_ROPE_SCALING_YARN, c.rope_factor = 4, c.rope_orig_ctx = 8, c.rope_yarn_log_mul = 0.707f;
    c.n_layers = 3, c.n_dense_lead = 1, c.n_experts = 8, c.n_experts_used = 3, c.d_ff_expert = 32, c.d_ff_shared = 32;
    c.shared_ungated = true, c.moe_norm = true, c.moe_scale = 2.5f, c.moe_sigmoid = true, c.moe_bias = true;
    return c;
}

Test(cuda, moe_llama_logits_match_cpu) {
    need_cuda();
    for (int shared = 0; shared < 3; shared++) { /* Qwen3-MoE, Qwen2-MoE's shared expert, DeepSeek */
        struct toy_llama_config c = small_llama();
        snprintf(c.arch, sizeof c.arch, shared ? "qwen2moe" : "qwen3moe");
        c.rope_mode = TOY_ROPE_NEOX;
        c.qk_norm = !shared;
        c.n_experts = 8, c.n_experts_used = 3, c.d_ff_expert = 32, c.moe_norm = !shared;
        c.d_ff_shared = shared ? 48 : 0;
        if (shared == 2) c = small_deepseek();
        struct toy_llama *m = toy_llama_new(&c, 6);
        cr_assert(m, "%s", toy_last_error());
        struct toy_ctx *ctx = setup(15);
        struct toy_tensor *tok, *pos;
        model_batch(ctx, &tok, &pos);
        check(ctx, toy_llama_forward(ctx, m, tok, pos), false, TOL_GEMM,
              shared == 2 ? "deepseek2 logits" : shared ? "qwen2moe logits" : "qwen3moe logits");
        toy_ctx_free(ctx);
        toy_llama_free(m);
    }
}

/* a DeepSeek file quantized (Q8_0, and attn_k_b's rows of 16 as F16): the per-head up-projections multiply
 * batched over the heads on the file's own rows, on the device as on the CPU */
Test(cuda, deepseek_quantized_logits_match_cpu) {
    need_cuda();
    struct toy_llama_config c = small_deepseek();
    struct toy_llama *m = toy_llama_new(&c, 7);
    cr_assert(m, "%s", toy_last_error());
    m = reloaded_q8_0(m);
    cr_assert(m->layers[1].wv_b->type == TOY_Q8_0 && m->layers[1].wk_b->type == TOY_F16, "up-projections %s, %s",
              toy_dtype_name(m->layers[1].wv_b->type), toy_dtype_name(m->layers[1].wk_b->type));
    struct toy_ctx *ctx = setup(16);
    struct toy_tensor *tok, *pos;
    model_batch(ctx, &tok, &pos);
    check(ctx, toy_llama_forward(ctx, m, tok, pos), false, TOL_QUANT, "deepseek2 q8_0 logits");
    toy_ctx_free(ctx);
    toy_llama_free(m);
}

/* 20 AdamW steps on each backend from the same weights and batches */
Test(cuda, llama_training_matches_cpu, .timeout = 300) {
    need_cuda();
    struct toy_llama_config c = small_llama();
    const int T = 16, B = 3, steps = 20;
    struct toy_llama *m[2];
    struct toy_ctx *ctx[2];
    struct toy_tensor *tok[2], *tgt[2], *loss[2];
    struct toy_graph *g[2];
    struct toy_optim *o[2];
    for (int s = 0; s < 2; s++) {
        m[s] = toy_llama_new(&c, 7);
        ctx[s] = toy_ctx_init(true);
        tok[s] = toy_new_tensor_2d(ctx[s], TOY_I32, T, B);
        tgt[s] = toy_new_tensor_2d(ctx[s], TOY_I32, T, B);
        struct toy_tensor *pos = toy_new_tensor_1d(ctx[s], TOY_I32, T);
        for (int t = 0; t < T; t++) ((int32_t *)pos->data)[t] = t;
        loss[s] = toy_cross_entropy(ctx[s], toy_llama_forward(ctx[s], m[s], tok[s], pos), tgt[s], -100);
        g[s] = toy_graph_new(ctx[s]);
        toy_graph_build(g[s], loss[s]);
        toy_graph_backward(g[s], loss[s]);
        o[s] = toy_optim_new(TOY_OPTIM_ADAMW);
        int grp = toy_optim_add_group(o[s], &(struct toy_optim_group){.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                                                                       .weight_decay = 0.1f});
        for (int i = 0; i < toy_llama_n_tensors(m[s]); i++) toy_optim_add_param(o[s], toy_llama_tensor(m[s], i), grp);
    }
    cr_assert_eq(toy_graph_set_device(g[1], "cuda:0"), TOY_OK);
    struct toy_threadpool *tp = toy_threadpool_new(2);
    toy_rng_seed(&rng, 3);
    double worst = 0;
    float first = 0, last = 0;
    for (int step = 0; step < steps; step++) {
        for (int i = 0; i < T * B; i++) { /* a learnable target: a function of the token */
            int32_t a = (int32_t)toy_rng_below(&rng, 61);
            ((int32_t *)tok[0]->data)[i] = ((int32_t *)tok[1]->data)[i] = a;
            ((int32_t *)tgt[0]->data)[i] = ((int32_t *)tgt[1]->data)[i] = (a * 7 + 3) % 61;
        }
        float l[2];
        for (int s = 0; s < 2; s++) {
            toy_optim_zero_grad(o[s]);
            cr_assert_eq(toy_graph_compute(g[s], tp), TOY_OK, "%s", toy_last_error());
            l[s] = *(float *)loss[s]->data;
            cr_assert_eq(toy_optim_step(o[s], 1e-3f, tp), TOY_OK);
        }
        worst = fmax(worst, fabs(l[1] - l[0]) / (1 + fabs(l[0])));
        if (step == 0) first = l[1];
        last = l[1];
    }
    cr_log_info("20 AdamW steps on cuda: loss %.4f -> %.4f, max |cuda - cpu| / (1 + |cpu|) = %.2e", first, last,
                worst);
    cr_expect_leq(worst, 1e-4);
    cr_expect_lt(last, first);
    toy_threadpool_free(tp);
    for (int s = 0; s < 2; s++) {
        toy_optim_free(o[s]);
        toy_ctx_free(ctx[s]);
        toy_llama_free(m[s]);
    }
}

/* a prefill graph (5 tokens) then a decode graph (one token a step) over the
 * same cache, as toy generate runs them: on the device both graphs share
 * one copy of the cache */
static void prefill_then_decode(struct toy_llama_config c) {
    struct toy_llama *m = new_model(&c, 21);
    const int P = 5, N = 14;
    struct toy_kv_cache kv[2];
    struct toy_threadpool *tp = toy_threadpool_new(2);
    for (int s = 0; s < 2; s++) cr_assert_eq(toy_kv_cache_init_type(&kv[s], m, 32, 1, TOY_F16), TOY_OK);
    double worst = 0;
    struct toy_ctx *ctx[2][2];
    struct toy_tensor *tok[2][2], *pos[2][2], *lg[2][2];
    struct toy_graph *g[2][2];
    for (int s = 0; s < 2; s++) /* side: cpu, cuda */
        for (int ph = 0; ph < 2; ph++) { /* prefill, decode */
            int tn = ph ? 1 : P;
            ctx[s][ph] = toy_ctx_init(true);
            tok[s][ph] = toy_new_tensor_2d(ctx[s][ph], TOY_I32, tn, 1);
            pos[s][ph] = toy_new_tensor_1d(ctx[s][ph], TOY_I32, tn);
            lg[s][ph] = toy_llama_forward_cached(ctx[s][ph], m, &kv[s], tok[s][ph], pos[s][ph]);
            toy_set_output(lg[s][ph]);
            g[s][ph] = toy_graph_new(ctx[s][ph]);
            toy_graph_build(g[s][ph], lg[s][ph]);
            if (s) cr_assert_eq(toy_graph_set_device(g[s][ph], "cuda:0"), TOY_OK);
        }
    for (int step = 0; step <= N - P; step++) {
        int ph = step ? 1 : 0, tn = ph ? 1 : P, n0 = ph ? P + step - 1 : 0;
        for (int s = 0; s < 2; s++) {
            *(int32_t *)kv[s].n_past->data = n0;
            for (int i = 0; i < tn; i++) {
                ((int32_t *)tok[s][ph]->data)[i] = ((n0 + i) * 13 + 2) % 61;
                ((int32_t *)pos[s][ph]->data)[i] = n0 + i;
            }
            cr_assert_eq(toy_graph_compute(g[s][ph], tp), TOY_OK, "%s", toy_last_error());
        }
        int64_t at;
        worst = fmax(worst, rel_err(lg[1][ph]->data, lg[0][ph]->data, (int64_t)tn * c.vocab, &at));
    }
    cr_log_info("%s prefill + decode, f16 cache: max rel diff %.2e", c.arch, worst);
    cr_expect_leq(worst, 1e-3);
    toy_threadpool_free(tp);
    for (int s = 0; s < 2; s++) {
        for (int ph = 0; ph < 2; ph++) toy_ctx_free(ctx[s][ph]);
        toy_kv_cache_free(&kv[s]);
    }
    toy_llama_free(m);
}

Test(cuda, llama_prefill_then_decode_matches_cpu) {
    need_cuda();
    prefill_then_decode(small_llama());
    prefill_then_decode(small_deepseek()); /* the cache holds latents: one wide kv head, which is the values too */
    prefill_then_decode(small_phi3()); /* partial rotary, LongRoPE's long table (a cache of 32) and its factor */
    struct toy_llama_config c = small_llama(); /* Ministral 3's query temperature, every 4 positions */
    snprintf(c.arch, sizeof c.arch, "mistral3");
    c.rope_scaling = TOY_ROPE_SCALING_YARN, c.rope_factor = 4, c.rope_orig_ctx = 4, c.rope_attn_factor = 1;
    c.attn_temp_scale = 0.1f;
    prefill_then_decode(c);
    prefill_then_decode(small_gptoss()); /* the sinks after each attention kernel, the decode step's included */
}

/* GPT-2 generation (the generic generator: a last-position prefill, then a
 * decode graph fused for the device) on the GPU gives the CPU's greedy
 * tokens and, within f16-cache tolerance, their log-probabilities */
Test(cuda, gpt2_generation_matches_cpu) {
    need_cuda();
    struct toy_gpt2_config c = toy_gpt2_preset("tiny");
    c.vocab = 61;
    c.max_ctx = 64;
    struct toy_gpt2 *m = toy_gpt2_new(&c, 5);
    cr_assert(m, "%s", toy_last_error());
    for (int i = 0; i < toy_gpt2_n_tensors(m); i++) { /* logits far apart: no near-tie to flip a greedy token */
        struct toy_tensor *t = toy_gpt2_tensor(m, i);
        for (int64_t k = 0; k < toy_nelements(t); k++) ((float *)t->data)[k] *= t->ne[1] > 1 ? 8.0f : 1.0f;
    }
    const int32_t prompt[] = {3, 17, 40, 8, 59, 1, 22};
    struct toy_generate_params gp = {.n_predict = 24, .ignore_eos = true, .sampling = {.temperature = 0}};
    struct toy_threadpool *tp = toy_threadpool_new(2);
    struct th_gen_log runs[2] = {0};
    for (int s = 0; s < 2; s++) {
        cr_assert_eq(toy_device_set_default(s ? "cuda:0" : "cpu"), TOY_OK, "%s", toy_last_error());
        cr_assert_eq(toy_gpt2_generate_kv(m, NULL, 0, TOY_F16, tp, prompt, 7, &gp, th_log_token, &runs[s], NULL), TOY_OK,
                     "%s", toy_last_error());
    }
    cr_assert_eq(toy_device_set_default("cpu"), TOY_OK);
    cr_assert_eq(runs[0].n, 24);
    cr_assert_eq(runs[1].n, 24);
    double worst = 0;
    for (int i = 0; i < 24; i++) {
        cr_assert_eq(runs[1].ids[i], runs[0].ids[i], "token %d: cuda %d, cpu %d", i, runs[1].ids[i], runs[0].ids[i]);
        worst = fmax(worst, fabs(runs[1].lps[i] - runs[0].lps[i]));
    }
    cr_log_info("gpt2 generation, cuda vs cpu: max |logprob diff| %.2e", worst);
    cr_expect_leq(worst, 1e-2);
    toy_threadpool_free(tp);
    toy_gpt2_free(m);
}

/* A run's run_start event names the device it computes on: the default
 * device (--device) unless the caller names one */
Test(cuda, run_start_names_the_device) {
    need_cuda();
    th_mkdir("cuda-events");
    char path[1024];
    snprintf(path, sizeof path, "%s/events.jsonl", th_dir);
    cr_assert_eq(toy_device_set_default("cuda:0"), TOY_OK, "%s", toy_last_error());
    for (int named = 0; named < 2; named++) {
        struct toy_events *ev;
        cr_assert_eq(toy_events_open(path, TOY_EVENTS_TRUNCATE, &ev), TOY_OK, "%s", toy_last_error());
        cr_assert_eq(toy_events_run_start(ev, &(struct toy_run_start){.run_id = "x", .backend = named ? "cpu" : NULL,
                                                                      .no_git = true}),
                     TOY_OK, "%s", toy_last_error());
        toy_events_close(ev);
        json_error_t err;
        json_t *e = json_load_file(path, JSON_DISABLE_EOF_CHECK, &err);
        cr_assert(e, "%s", err.text);
        json_t *be = json_object_get(e, "backend");
        cr_assert_str_eq(json_string_value(json_object_get(be, "kind")), named ? "cpu" : "cuda");
        if (!named) cr_assert_str_eq(json_string_value(json_object_get(be, "device")), "cuda:0");
        else cr_assert(json_is_string(json_object_get(be, "blas_core")));
        json_decref(e);
    }
    cr_assert_eq(toy_device_set_default("cpu"), TOY_OK);
    th_rmdir();
}

/* toy bench on the device: decode and prefill rates, the device named, and
 * no memory bound (the one it measures is the CPU's memory, not the GPU's) */
Test(cuda, cli_bench_on_the_device) {
    need_cuda();
    th_mkdir("cuda-bench");
    struct toy_llama_config c = small_llama();
    struct toy_llama *m = toy_llama_new(&c, 3);
    char path[1024], args[1200], out[8192];
    snprintf(path, sizeof path, "%s/m.gguf", th_dir);
    th_save_llama(m, TOY_F32, path);
    toy_llama_free(m);
    snprintf(args, sizeof args, "bench -m '%s' --device cuda --threads 1 --prompt 8 --gen 3 --reps 1 --json", path);
    cr_assert_eq(run_cli(args, out, sizeof out), 0, "%s", out);
    json_error_t err;
    json_t *j = json_loads(strchr(out, '{') ? strchr(out, '{') : out, JSON_DISABLE_EOF_CHECK, &err);
    cr_assert(j, "%s: %s", err.text, out);
    cr_assert_str_eq(json_string_value(json_object_get(j, "device")), "cuda:0");
    json_t *r = json_array_get(json_object_get(j, "runs"), 0);
    cr_assert_gt(json_real_value(json_object_get(r, "decode_tok_s")), 0);
    cr_assert_gt(json_real_value(json_object_get(r, "prefill_tok_s")), 0);
    cr_assert(json_is_null(json_object_get(r, "decode_bound_tok_s")), "no bound from the CPU's memory");
    json_decref(j);
    th_rmdir();
}

/* a greedy generation job of max_tokens after prompt[0..n) */
static struct srv_job *greedy_job(const int32_t *prompt, int64_t n, int64_t max_tokens) {
    struct srv_job *j = toy_srv_job_new(SRV_JOB_GENERATE);
    cr_assert(j);
    j->prompt = malloc((size_t)n * sizeof *j->prompt);
    memcpy(j->prompt, prompt, (size_t)n * sizeof *prompt);
    j->n_prompt = n;
    j->max_tokens = max_tokens;
    j->ignore_eos = true;
    return j;
}

static void wait_job(struct srv_job *j) {
    pthread_mutex_lock(&j->mu);
    while (!j->done) pthread_cond_wait(&j->cv, &j->mu);
    pthread_mutex_unlock(&j->mu);
    cr_assert_eq(j->err, TOY_OK, "%s", j->errmsg);
}

/* The server's engine (continuous batching over per-slot KV caches, the
 * prefix cache, the fused batched decode graph) with its graphs on the
 * device: three requests decoded together, then one whose prompt starts
 * with an earlier one's, give the CPU engine's greedy tokens and, within
 * f16-cache tolerance, their log-probabilities; for a Llama and a GPT-2 */
Test(cuda, serve_engine_matches_cpu, .timeout = 300) {
    need_cuda();
    struct toy_llama_config lc = small_llama();
    struct toy_llama *lm = toy_llama_new(&lc, 9);
    struct toy_gpt2_config gc = toy_gpt2_preset("tiny");
    gc.vocab = 61;
    gc.max_ctx = 64;
    struct toy_gpt2 *gm = toy_gpt2_new(&gc, 9);
    cr_assert(lm && gm, "%s", toy_last_error());
    for (int f = 0; f < 2; f++) /* logits far apart: no near-tie to flip a greedy token */
        for (int i = 0; i < (f ? toy_gpt2_n_tensors(gm) : toy_llama_n_tensors(lm)); i++) {
            struct toy_tensor *t = f ? toy_gpt2_tensor(gm, i) : toy_llama_tensor(lm, i);
            for (int64_t k = 0; t->ne[1] > 1 && k < toy_nelements(t); k++) ((float *)t->data)[k] *= 8.0f;
        }
    const struct srv_model models[2] = {toy_srv_model_llama(lm), toy_srv_model_gpt2(gm)};
    const int32_t prompts[4][6] = {{3, 17, 40, 8, 59, 1}, {5, 9, 2}, {44, 12, 7, 30}, {3, 17, 40, 8, 11, 20}};
    const int64_t lens[4] = {6, 3, 4, 6};
    enum { MAXT = 10 };
    for (int f = 0; f < 2; f++) {
        struct srv_token got[2][4][MAXT];
        for (int side = 0, attempt = 0; side < 2; side++) {
            cr_assert_eq(toy_device_set_default(side ? "cuda:0" : "cpu"), TOY_OK, "%s", toy_last_error());
            struct srv_metrics met = {0};
            pthread_mutex_init(&met.mu, NULL);
            struct srv_engine_opts eo = {.n_slots = 3, .queue_size = 4, .n_ctx = 32, .n_threads = 2,
                                         .prefix_cache = true};
            struct srv_engine *e;
            cr_assert_eq(toy_srv_engine_new(&models[f], NULL, &eo, &met, &e), TOY_OK, "%s", toy_last_error());
            struct srv_job *jobs[4];
            for (int i = 0; i < 4; i++) {
                jobs[i] = greedy_job(prompts[i], lens[i], MAXT);
                if (i == 3) /* after the others: its prompt's first four tokens are in a slot's cache */
                    for (int k = 0; k < 3; k++) wait_job(jobs[k]);
                cr_assert_eq(toy_srv_engine_submit(e, jobs[i]), TOY_OK, "%s", toy_last_error());
            }
            wait_job(jobs[3]);
            /* the first three decode together unless the engine finished one before the next was
             * submitted, which a loaded machine can make happen: then again, on a new engine */
            bool shared = atomic_load(&met.decode_rows) > atomic_load(&met.decode_steps);
            if (!shared && ++attempt < 5) {
                for (int i = 0; i < 4; i++) toy_srv_job_unref(jobs[i]);
                toy_srv_engine_free(e);
                pthread_mutex_destroy(&met.mu);
                side--;
                continue;
            }
            attempt = 0;
            cr_assert(shared, "%s: the requests never shared a decode step", models[f].arch);
            cr_assert_eq(jobs[3]->n_cached, 4, "%s: the prefix cache", models[f].arch);
            for (int i = 0; i < 4; i++) {
                cr_assert_eq(jobs[i]->n_generated, MAXT);
                for (int k = 0; k < MAXT; k++) got[side][i][k] = jobs[i]->toks[k];
                toy_srv_job_unref(jobs[i]);
            }
            toy_srv_engine_free(e);
            pthread_mutex_destroy(&met.mu);
        }
        cr_assert_eq(toy_device_set_default("cpu"), TOY_OK);
        double worst = 0;
        for (int i = 0; i < 4; i++)
            for (int k = 0; k < MAXT; k++) {
                cr_assert_eq(got[1][i][k].id, got[0][i][k].id, "%s: request %d token %d: cuda %d, cpu %d",
                             models[f].arch, i, k, got[1][i][k].id, got[0][i][k].id);
                worst = fmax(worst, fabs(got[1][i][k].logprob - got[0][i][k].logprob));
            }
        cr_log_info("%s serve engine, cuda vs cpu: max |logprob diff| %.2e", models[f].arch, worst);
        cr_expect_leq(worst, 1e-2);
    }
    toy_llama_free(lm);
    toy_gpt2_free(gm);
}

/* Decode graphs fused for CUDA (toy_graph_set_fusion, graph-fuse.c): the
 * norms and activations run as the products' prologues (Llama's RMSNorm
 * and SwiGLU; GPT-2's LayerNorm and GELU), GPT-2's bias adds as their
 * epilogue, the residual adds as their accumulation, Llama's q/k/v and
 * gate/up as one launch each, and its ROPEs and KV_STOREs before an
 * attention as its prologue. The logits must be the unfused graph's bits
 * on the GEMV kernels (F16, BF16 and quantized weights: the same
 * arithmetic, only fewer launches), and near them for F32 weights (the
 * prologue runs ahead, then cuBLAS adds into the residual); and the CPU's
 * within each weight type's tolerance. Steps of one token (siblings) and
 * of three (prologues and adds only). */
/* f32_adds: the adds left with F32 weights (whose products no GEMV takes:
 * GPT-2's and Qwen2's bias adds) */
static void fused_decode_case(const struct toy_lm *lm, enum toy_dtype type, int f32_adds) {
    bool gpt2 = !strcmp(lm->arch, "gpt2"), gemv = type != TOY_F32;
    struct toy_threadpool *tp = toy_threadpool_new(2);
    struct toy_kv_cache kv[3]; /* CUDA fused, CUDA unfused, CPU */
    struct toy_ctx *ctx[3][2];
    struct toy_tensor *tok[3][2], *pos[3][2], *lg[3][2];
    struct toy_graph *g[3][2];
    const int rows[2] = {1, 3};
    for (int s = 0; s < 3; s++) {
        cr_assert_eq(lm->cache_init(lm->self, &kv[s], 32, 1, TOY_F32), TOY_OK, "%s", toy_last_error());
        for (int r = 0; r < 2; r++) {
            ctx[s][r] = toy_ctx_init(true);
            tok[s][r] = toy_new_tensor_2d(ctx[s][r], TOY_I32, rows[r], 1);
            pos[s][r] = toy_new_tensor_1d(ctx[s][r], TOY_I32, rows[r]);
            lg[s][r] = lm->forward_cached(lm->self, ctx[s][r], &kv[s], tok[s][r], pos[s][r], false);
            toy_set_output(lg[s][r]);
            g[s][r] = toy_graph_new(ctx[s][r]);
            toy_graph_build(g[s][r], lg[s][r]);
            toy_graph_set_fusion(g[s][r], s == 0);
            if (s < 2) cr_assert_eq(toy_graph_set_device(g[s][r], "cuda:0"), TOY_OK);
        }
    }
    double worst_cpu = 0, worst_unfused = 0;
    int n0 = 0;
    for (int step = 0; step < 8; step++) {
        int r = step % 3 == 1; /* 1, 3, 1, 1, 3, ... rows */
        for (int s = 0; s < 3; s++) {
            *(int32_t *)kv[s].n_past->data = n0;
            for (int i = 0; i < rows[r]; i++) {
                ((int32_t *)tok[s][r]->data)[i] = (int32_t)(((n0 + i) * 13 + 2) % lm->vocab);
                ((int32_t *)pos[s][r]->data)[i] = n0 + i;
            }
            cr_assert_eq(toy_graph_compute(g[s][r], tp), TOY_OK, "%s", toy_last_error());
        }
        int64_t n = rows[r] * lm->vocab, at;
        if (gemv)
            for (int64_t i = 0; i < n; i++) {
                float a = ((float *)lg[0][r]->data)[i], b = ((float *)lg[1][r]->data)[i];
                cr_assert(memcmp(&a, &b, sizeof a) == 0 && isfinite(a),
                          "%s %s weights, step %d (%d rows), logit %lld: fused %.9g, unfused %.9g", lm->arch,
                          toy_dtype_name(type), step, rows[r], (long long)i, a, b);
            }
        worst_unfused = fmax(worst_unfused, rel_err(lg[0][r]->data, lg[1][r]->data, n, &at));
        worst_cpu = fmax(worst_cpu, rel_err(lg[0][r]->data, lg[2][r]->data, n, &at));
        n0 += rows[r];
    }
    /* what the fusion did: no norm or activation left in a decode step and
     * no add but GPT-2's embedding sum (F32 products keep the bias adds and
     * GPT-2's norms: no GEMV takes them); Llama's q/k/v (with their biases)
     * and gate/up as one launch over streamed weights, its ROPEs and
     * stores done by the attention */
    int leads = 0, led = 0, adds = 0, before = toy_graph_n_nodes(g[1][0]), after = toy_graph_n_nodes(g[0][0]);
    for (int i = 0; i < after; i++) {
        const struct toy_tensor *t = toy_graph_node(g[0][0], i);
        enum toy_op op = t->op;
        bool gone = op == TOY_OP_RMS_NORM || op == TOY_OP_SWIGLU || (gemv && (op == TOY_OP_LAYER_NORM || op == TOY_OP_GELU));
        cr_assert(!gone, "%s %s weights: node %d is %s", lm->arch, toy_dtype_name(type), i, toy_op_name(op));
        adds += op == TOY_OP_ADD;
        leads += op == TOY_OP_MATMUL && t->siblings[0];
        led += t->led_by != NULL;
    }
    int n_layers = 2;
    cr_assert_eq(adds, gemv ? gpt2 : f32_adds, "%s %s weights: %d adds", lm->arch, toy_dtype_name(type), adds);
    cr_assert_eq(leads, gemv && !gpt2 ? 2 * n_layers : 0, "%s %s weights: %d products with siblings", lm->arch,
                 toy_dtype_name(type), leads);
    cr_assert_eq(led, gpt2 ? 0 : 4 * n_layers, "%s %s weights: %d ROPEs and KV_STOREs done by their attention",
                 lm->arch, toy_dtype_name(type), led);
    /* fused for CUDA's kernels: another CUDA device may run it, the CPU may not */
    cr_assert_eq(toy_graph_set_device(g[0][0], "cuda:0"), TOY_OK);
    cr_assert_eq(toy_graph_set_device(g[0][0], "cpu"), TOY_ERR_STATE);
    cr_assert(strstr(toy_last_error(), "fused for cuda"), "%s", toy_last_error());
    cr_log_info("fused decode, %s %s weights: %d -> %d nodes; vs unfused %.2e, vs cpu %.2e", lm->arch,
                toy_dtype_name(type), before, after, worst_unfused, worst_cpu);
    cr_expect_leq(worst_unfused, 1e-6, "%s %s weights", lm->arch, toy_dtype_name(type));
    /* the CPU rounds differently: A to Q8 for quantized weights, kept in F32 for F16 ones */
    double tol = type == TOY_F32 || type == TOY_BF16 ? TOL_GEMM : type == TOY_F16 ? TOL_HALF : TOL_QUANT;
    cr_expect_leq(worst_cpu, tol, "%s %s weights", lm->arch, toy_dtype_name(type));
    toy_threadpool_free(tp);
    for (int s = 0; s < 3; s++) {
        for (int r = 0; r < 2; r++) toy_ctx_free(ctx[s][r]);
        toy_kv_cache_free(&kv[s]);
    }
}

/* one model saved as each weight type, loaded, and its decode checked */
static void fused_decode_types(const struct toy_lm *lm, int f32_adds, const enum toy_dtype *types, int n_types) {
    struct toy_rng r;
    toy_rng_seed(&r, 41);
    for (int i = 0; i < lm->n_tensors(lm->self); i++) { /* norms and biases other than 1 and 0, so that they show */
        struct toy_tensor *t = lm->tensor(lm->self, i);
        float *d = t->data;
        for (int64_t k = 0; t->ne[1] == 1 && k < toy_nelements(t); k++) d[k] += 0.3f * toy_rng_normal(&r);
    }
    th_mkdir("cuda-fuse");
    char path[512], qpath[512];
    for (int i = 0; i < n_types; i++) {
        enum toy_dtype t = types[i];
        bool quant = t != TOY_F32 && t != TOY_F16 && t != TOY_BF16;
        snprintf(path, sizeof path, "%s/m-%d.gguf", th_dir, (int)i);
        th_save_lm(lm, quant ? TOY_F32 : t, path);
        if (quant) {
            snprintf(qpath, sizeof qpath, "%s/q-%d.gguf", th_dir, (int)i);
            cr_assert_eq(toy_gguf_quantize(path, qpath, t, NULL, NULL), TOY_OK, "%s", toy_last_error());
        }
        const char *file = quant ? qpath : path;
        if (!strcmp(lm->arch, "gpt2")) {
            struct toy_gpt2 *m;
            cr_assert_eq(toy_gpt2_load(file, false, &m), TOY_OK, "%s", toy_last_error());
            struct toy_lm ml = toy_gpt2_lm(m);
            cr_assert_eq(m->layers[0].w_up->type, t, "the file holds %s matrices", toy_dtype_name(m->layers[0].w_up->type));
            fused_decode_case(&ml, t, f32_adds);
            toy_gpt2_free(m);
        } else {
            struct toy_llama *m;
            cr_assert_eq(toy_llama_load(file, false, &m), TOY_OK, "%s", toy_last_error());
            struct toy_lm ml = toy_llama_lm(m);
            cr_assert_eq(m->layers[0].w_up->type, t, "the file holds %s matrices", toy_dtype_name(m->layers[0].w_up->type));
            fused_decode_case(&ml, t, f32_adds);
            toy_llama_free(m);
        }
    }
    th_rmdir();
}

static const enum toy_dtype decode_types[] = {TOY_F32, TOY_F16, TOY_BF16, TOY_Q8_0, TOY_Q4_0, TOY_Q5_0};

Test(cuda, fused_decode_same_bits_as_unfused, .timeout = 600) {
    need_cuda();
    unsetenv("TOY_FUSE"); /* fusion on, whatever the caller's environment */
    for (int qkv_bias = 0; qkv_bias < 2; qkv_bias++) { /* Llama; Qwen2's biases on q, k and v */
        struct toy_llama_config c = small_llama();
        c.qkv_bias = qkv_bias;
        struct toy_llama *m = toy_llama_new(&c, 23);
        cr_assert(m);
        struct toy_lm lm = toy_llama_lm(m);
        fused_decode_types(&lm, 3 * c.n_layers * qkv_bias, decode_types, 6);
        toy_llama_free(m);
    }
}

Test(cuda, gpt2_fused_decode_same_bits_as_unfused, .timeout = 600) {
    need_cuda();
    unsetenv("TOY_FUSE");
    struct toy_gpt2_config c = toy_gpt2_preset("tiny");
    c.vocab = 61;
    c.max_ctx = 64;
    struct toy_gpt2 *m = toy_gpt2_new(&c, 29);
    cr_assert(m, "%s", toy_last_error());
    struct toy_lm lm = toy_gpt2_lm(m);
    fused_decode_types(&lm, 1 + 6 * (int)c.n_layers, decode_types, 6); /* the embedding sum; per layer 4 biases, 2 residuals */
    toy_gpt2_free(m);
}

/* The same with the k-quants and IQ4_XS, whose GEMVs are kernels of their
 * own (rows of whole 256-element super-blocks): a Llama and a GPT-2 of
 * width 256 */
Test(cuda, kquant_fused_decode_same_bits_as_unfused, .timeout = 600) {
    need_cuda();
    unsetenv("TOY_FUSE");
    const enum toy_dtype types[] = {TOY_Q4_K, TOY_Q6_K, TOY_Q5_K, TOY_Q2_K, TOY_Q3_K, TOY_IQ4_XS};
    const int n = sizeof types / sizeof types[0];
    struct toy_llama_config lc = small_llama();
    lc.d_model = 256;
    lc.d_ff = 512;
    struct toy_llama *l = toy_llama_new(&lc, 37);
    cr_assert(l, "%s", toy_last_error());
    struct toy_lm lm = toy_llama_lm(l);
    fused_decode_types(&lm, 0, types, n);
    toy_llama_free(l);
    struct toy_gpt2_config gc = toy_gpt2_preset("tiny");
    gc.vocab = 61;
    gc.max_ctx = 64;
    gc.d_model = 256;
    gc.d_ff = 512;
    struct toy_gpt2 *g = toy_gpt2_new(&gc, 41);
    cr_assert(g, "%s", toy_last_error());
    lm = toy_gpt2_lm(g);
    fused_decode_types(&lm, 0, types, n);
    toy_gpt2_free(g);
}

/* ---- the device-resident optimizer ------------------------------------------------------------------------ */

/* The mock runtime's copy counters (tools/cuda-mock.c): bytes host -> device
 * and device -> host. NULL in real builds, where the tests that need them
 * skip. */
extern size_t toy_cu_mock_copied[2] __attribute__((weak));

static const size_t *mock_copied(void) {
    const size_t *volatile c = toy_cu_mock_copied; /* (a weak symbol: may be NULL) */
    return c;
}

static size_t copied(void) { return mock_copied()[0] + mock_copied()[1]; }

/* one side of a CPU / CUDA pair: a small Llama, its training graph and AdamW
 * (two groups: decay on matrices, none on norms, as the trainer sets them) */
struct side {
    struct toy_llama *m;
    struct toy_ctx *ctx;
    struct toy_tensor *tok, *tgt, *loss;
    struct toy_graph *g;
    struct toy_optim *o;
};

enum { SD_T = 16, SD_B = 2 };

static struct toy_optim *side_optim(struct side *s) {
    struct toy_optim *o = toy_optim_new(TOY_OPTIM_ADAMW);
    int decay = toy_optim_add_group(o, &(struct toy_optim_group){.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                                                                  .weight_decay = 0.1f});
    int plain = toy_optim_add_group(o, &(struct toy_optim_group){.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f});
    for (int i = 0; i < toy_llama_n_tensors(s->m); i++) {
        struct toy_tensor *p = toy_llama_tensor(s->m, i);
        toy_optim_add_param(o, p, p->ne[1] > 1 ? decay : plain);
    }
    return o;
}

static void side_init(struct side *s, const char *device) {
    struct toy_llama_config c = small_llama();
    s->m = toy_llama_new(&c, 9);
    cr_assert(s->m);
    s->ctx = toy_ctx_init(true);
    s->tok = toy_new_tensor_2d(s->ctx, TOY_I32, SD_T, SD_B);
    s->tgt = toy_new_tensor_2d(s->ctx, TOY_I32, SD_T, SD_B);
    struct toy_tensor *pos = toy_new_tensor_1d(s->ctx, TOY_I32, SD_T);
    for (int t = 0; t < SD_T; t++) ((int32_t *)pos->data)[t] = t;
    s->loss = toy_cross_entropy(s->ctx, toy_llama_forward(s->ctx, s->m, s->tok, pos), s->tgt, -100);
    s->g = toy_graph_new(s->ctx);
    toy_graph_build(s->g, s->loss);
    toy_graph_backward(s->g, s->loss);
    cr_assert_eq(toy_graph_set_device(s->g, device), TOY_OK, "%s", toy_last_error());
    s->o = side_optim(s);
}

static void side_free(struct side *s) {
    toy_optim_free(s->o);
    toy_ctx_free(s->ctx);
    toy_llama_free(s->m);
}

/* a learnable batch, the same on both sides */
static void batches(struct side *s, int n, struct toy_rng *r) {
    for (int i = 0; i < SD_T * SD_B; i++) {
        int32_t a = (int32_t)toy_rng_below(r, 61);
        for (int k = 0; k < n; k++) {
            ((int32_t *)s[k].tok->data)[i] = a;
            ((int32_t *)s[k].tgt->data)[i] = (a * 7 + 3) % 61;
        }
    }
}

/* One trainer step: zero, `accum` forward + backward passes, scale, clip,
 * AdamW. Returns the mean loss; *norm gets the norm before clipping. */
static float side_step(struct side *s, int accum, float clip, float lr, struct toy_threadpool *tp, struct toy_rng *r,
                       float *norm) {
    toy_optim_zero_grad(s->o);
    float loss = 0;
    for (int a = 0; a < accum; a++) {
        batches(s, 1, r);
        cr_assert_eq(toy_graph_compute(s->g, tp), TOY_OK, "%s", toy_last_error());
        loss += *(float *)s->loss->data;
    }
    if (accum > 1) toy_optim_scale_grads(s->o, 1.0f / (float)accum, tp);
    *norm = toy_optim_clip_grad_norm(s->o, clip, tp);
    cr_assert_eq(toy_optim_step(s->o, lr, tp), TOY_OK, "%s", toy_last_error());
    return loss / (float)accum;
}

/* max |a - b| / max |b| over every parameter of two models */
static double params_diff(const struct side *a, const struct side *b) {
    double md = 0, mx = 0;
    for (int i = 0; i < toy_llama_n_tensors(a->m); i++) {
        const float *x = toy_llama_tensor(a->m, i)->data, *y = toy_llama_tensor(b->m, i)->data;
        for (int64_t k = 0, n = toy_nelements(toy_llama_tensor(a->m, i)); k < n; k++) {
            md = fmax(md, isnan(x[k]) ? INFINITY : fabs((double)x[k] - y[k]));
            mx = fmax(mx, fabs(y[k]));
        }
    }
    return md / (mx > 0 ? mx : 1);
}

/* the worst relative error of a's AdamW moment `which` (0: m, 1: v) against b's */
static double moment_diff(const struct side *a, const struct side *b, int which) {
    double md = 0;
    for (int i = 0; i < toy_optim_n_params(b->o); i++) {
        int64_t at, n = toy_nelements(toy_optim_param(b->o, i));
        md = fmax(md, rel_err(toy_optim_state(a->o, i, which), toy_optim_state(b->o, i, which), n, &at));
    }
    return md;
}

/* N AdamW steps with gradient accumulation (scale on the device) and
 * clipping (the norm and the scale on the device) against the CPU.
 * Bounds (F32, TOY_CUDA_MATH=f32): loss per step 1e-4 relative to 1 + |loss|
 * and the norm per step 1e-4 relative (the gradients differ by the GEMMs'
 * summation order; AdamW itself is the CPU's arithmetic); the parameters
 * after the last step 2e-3 of their largest magnitude (AdamW divides by
 * sqrt(v), so an element whose gradient is near zero may take a step of a
 * different sign: at most 2 lr). Under the mock runtime every difference
 * is zero but for the threads' summation order. */
Test(cuda, adamw_on_device_with_clipping_matches_cpu, .timeout = 300) {
    need_cuda();
    struct side s[2];
    side_init(&s[0], "cpu");
    side_init(&s[1], "cuda:0");
    struct toy_threadpool *tp = toy_threadpool_new(2);
    struct toy_rng r;
    toy_rng_seed(&r, 5);
    const int steps = 12;
    double worst_loss = 0, worst_norm = 0;
    int clipped = 0;
    for (int step = 0; step < steps; step++) {
        float l[2], n[2];
        struct toy_rng keep = r;
        for (int k = 0; k < 2; k++) {
            r = keep;
            l[k] = side_step(&s[k], 2, 0.5f, 3e-3f, tp, &r, &n[k]);
        }
        clipped += n[0] > 0.5f;
        worst_loss = fmax(worst_loss, fabs(l[1] - l[0]) / (1 + fabs(l[0])));
        worst_norm = fmax(worst_norm, fabs(n[1] - n[0]) / fmax(n[0], 1e-30));
        cr_assert(!toy_optim_on_device(s[0].o));
        cr_assert(toy_optim_on_device(s[1].o), "step %d: the optimizer of the cuda graph is not on the device", step);
    }
    cr_assert_eq(toy_optim_step_count(s[1].o), steps);
    cr_assert_eq(toy_optim_sync_host(s[1].o), TOY_OK, "%s", toy_last_error());
    double pd = params_diff(&s[1], &s[0]);
    double md = moment_diff(&s[1], &s[0], 0);
    cr_log_info("%d AdamW steps on the device (%d clipped): loss %.2e, norm %.2e, params %.2e, m %.2e", steps, clipped,
                worst_loss, worst_norm, pd, md);
    cr_expect_gt(clipped, 0, "no step was clipped: the test does not check clipping");
    cr_expect_leq(worst_loss, 1e-4);
    cr_expect_leq(worst_norm, 1e-4);
    cr_expect_leq(pd, 2e-3);
    toy_threadpool_free(tp);
    side_free(&s[0]);
    side_free(&s[1]);
}

/* The bookkeeping, under the mock runtime (its copy counters): once the
 * optimizer is on the device, a step copies the batch and the loss, not
 * parameters or gradients; the host copies stay as they were until
 * toy_optim_sync_host; a forward graph on the device (evaluation) reads
 * the optimizer's parameters without uploading them. */
Test(cuda, device_optimizer_copies_no_parameters_per_step) {
    need_cuda();
    if (!mock_copied()) cr_skip_test("needs the mock runtime's copy counters (make CUDA_MOCK=1)");
    struct side s[2];
    side_init(&s[0], "cpu");
    side_init(&s[1], "cuda:0");
    struct toy_threadpool *tp = toy_threadpool_new(2);
    struct toy_rng r;
    toy_rng_seed(&r, 6);
    size_t pbytes = 0;
    for (int i = 0; i < toy_optim_n_params(s[1].o); i++) pbytes += toy_nbytes(toy_optim_param(s[1].o, i));
    float n[2];
    for (int step = 0; step < 2; step++) { /* the first step moves the optimizer; the second rebinds the graph */
        struct toy_rng keep = r;
        for (int k = 0; k < 2; k++) {
            r = keep;
            side_step(&s[k], 1, 1.0f, 1e-3f, tp, &r, &n[k]);
        }
    }
    cr_assert(toy_optim_on_device(s[1].o));
    struct toy_tensor *p0 = toy_optim_param(s[1].o, 0);
    float *before = copy_f32(p0);
    size_t c0 = copied();
    for (int step = 0; step < 3; step++) {
        struct toy_rng keep = r;
        for (int k = 0; k < 2; k++) {
            r = keep;
            side_step(&s[k], 1, 1.0f, 1e-3f, tp, &r, &n[k]);
        }
    }
    size_t per_step = (copied() - c0) / 3;
    cr_log_info("device optimizer: %zu bytes copied per step, parameters %zu bytes", per_step, pbytes);
    cr_expect_lt(per_step, pbytes / 20, "a step copied %zu bytes (parameters: %zu)", per_step, pbytes);
    cr_expect_eq(memcmp(before, p0->data, toy_nbytes(p0)), 0, "the host copy moved without a sync");
    /* an evaluation graph on the device sees the trained parameters, uploading none */
    struct toy_ctx *ectx[2];
    struct toy_tensor *eloss[2];
    struct toy_graph *eg[2];
    batches(s, 2, &r);
    for (int k = 0; k < 2; k++) {
        ectx[k] = toy_ctx_init(true);
        struct toy_tensor *pos = toy_new_tensor_1d(ectx[k], TOY_I32, SD_T);
        for (int t = 0; t < SD_T; t++) ((int32_t *)pos->data)[t] = t;
        eloss[k] = toy_cross_entropy(ectx[k], toy_llama_forward(ectx[k], s[k].m, s[k].tok, pos), s[k].tgt, -100);
        eg[k] = toy_graph_new(ectx[k]);
        toy_graph_build(eg[k], eloss[k]);
        cr_assert_eq(toy_graph_set_device(eg[k], k ? "cuda:0" : "cpu"), TOY_OK);
    }
    c0 = copied();
    for (int k = 0; k < 2; k++) cr_assert_eq(toy_graph_compute(eg[k], tp), TOY_OK, "%s", toy_last_error());
    float el0 = *(float *)eloss[0]->data, el1 = *(float *)eloss[1]->data;
    cr_expect_lt(copied() - c0, pbytes / 20, "the evaluation uploaded %zu bytes", copied() - c0);
    cr_expect_leq(fabs(el1 - el0) / (1 + fabs(el0)), 1e-5, "eval loss: cuda %g, cpu %g", el1, el0);
    /* on demand: the host copies become the device's */
    cr_assert_eq(toy_optim_sync_host(s[1].o), TOY_OK, "%s", toy_last_error());
    cr_expect_neq(memcmp(before, p0->data, toy_nbytes(p0)), 0, "the sync brought nothing back");
    cr_expect_leq(params_diff(&s[1], &s[0]), 1e-5);
    /* released: the host is the truth again and graphs upload from it */
    cr_assert_eq(toy_optim_set_device_resident(s[1].o, false), TOY_OK);
    cr_assert(!toy_optim_on_device(s[1].o));
    for (int k = 0; k < 2; k++) ((float *)toy_optim_param(s[k].o, 0)->data)[0] += 0.25f; /* a host write */
    for (int step = 0; step < 2; step++) {
        struct toy_rng keep = r;
        for (int k = 0; k < 2; k++) {
            r = keep;
            side_step(&s[k], 1, 1.0f, 1e-3f, tp, &r, &n[k]);
        }
    }
    cr_assert(!toy_optim_on_device(s[1].o));
    cr_expect_leq(params_diff(&s[1], &s[0]), 1e-5);
    free(before);
    for (int k = 0; k < 2; k++) toy_ctx_free(ectx[k]);
    toy_threadpool_free(tp);
    side_free(&s[0]);
    side_free(&s[1]);
}

/* A checkpoint of a device-resident optimizer: the write brings the
 * moments and the parameters to the host; a new optimizer that reads them
 * (after it moved to the device: the read reaches the device copies)
 * continues exactly where the CPU, which never stopped, is. */
Test(cuda, device_optimizer_state_round_trips_through_a_checkpoint, .timeout = 300) {
    need_cuda();
    struct side s[2];
    side_init(&s[0], "cpu");
    side_init(&s[1], "cuda:0");
    struct toy_threadpool *tp = toy_threadpool_new(2);
    struct toy_rng r;
    toy_rng_seed(&r, 8);
    float n[2], l[2];
    for (int step = 0; step < 4; step++) {
        struct toy_rng keep = r;
        for (int k = 0; k < 2; k++) {
            r = keep;
            side_step(&s[k], 1, 1.0f, 2e-3f, tp, &r, &n[k]);
        }
    }
    cr_assert(toy_optim_on_device(s[1].o));
    char path[] = "/tmp/toy-cuda-optim-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    close(fd);
    struct toy_gguf_writer *w;
    cr_assert_eq(toy_gguf_writer_init(&w), TOY_OK);
    cr_assert_eq(toy_optim_write_gguf(s[1].o, w), TOY_OK, "%s", toy_last_error());
    cr_assert_eq(toy_gguf_writer_write(w, path), TOY_OK, "%s", toy_last_error());
    toy_gguf_writer_free(w);
    cr_expect_leq(params_diff(&s[1], &s[0]), 1e-5, "the write did not refresh the host's parameters");
    int64_t steps = toy_optim_step_count(s[1].o);
    toy_optim_free(s[1].o); /* leaves the last weights on the host */
    s[1].o = side_optim(&s[1]);
    toy_optim_zero_grad(s[1].o); /* the graph still holds the gradients on the device: it moves at once */
    cr_assert(toy_optim_on_device(s[1].o));
    struct toy_gguf *g;
    cr_assert_eq(toy_gguf_open(path, &g), TOY_OK, "%s", toy_last_error());
    cr_assert_eq(toy_optim_read_gguf(s[1].o, g), TOY_OK, "%s", toy_last_error());
    toy_gguf_close(g);
    unlink(path);
    toy_optim_set_step_count(s[1].o, steps);
    double worst = 0;
    for (int step = 0; step < 4; step++) {
        struct toy_rng keep = r;
        for (int k = 0; k < 2; k++) {
            r = keep;
            l[k] = side_step(&s[k], 1, 1.0f, 2e-3f, tp, &r, &n[k]);
        }
        worst = fmax(worst, fabs(l[1] - l[0]) / (1 + fabs(l[0])));
    }
    cr_assert(toy_optim_on_device(s[1].o));
    cr_assert_eq(toy_optim_sync_host(s[1].o), TOY_OK, "%s", toy_last_error());
    double pd = params_diff(&s[1], &s[0]), md = moment_diff(&s[1], &s[0], 1);
    cr_log_info("resumed on the device: loss %.2e, params %.2e, v %.2e", worst, pd, md);
    cr_expect_leq(worst, 1e-4);
    cr_expect_leq(pd, 2e-3);
    cr_expect_leq(md, 1e-3);
    toy_threadpool_free(tp);
    side_free(&s[0]);
    side_free(&s[1]);
}

/* TOY_CUDA_OPTIM=0 keeps an optimizer on the host: the graph uploads the
 * parameters and downloads the gradients every run, as before, and the
 * result is the same. */
Test(cuda, toy_cuda_optim_0_keeps_the_optimizer_on_the_host) {
    need_cuda();
    if (!mock_copied()) cr_skip_test("needs the mock runtime's copy counters (make CUDA_MOCK=1)");
    setenv("TOY_CUDA_OPTIM", "0", 1); /* (each test runs in its own process) */
    struct side s;
    side_init(&s, "cuda:0");
    struct toy_threadpool *tp = toy_threadpool_new(1);
    struct toy_rng r;
    toy_rng_seed(&r, 9);
    size_t pbytes = 0;
    for (int i = 0; i < toy_optim_n_params(s.o); i++) pbytes += toy_nbytes(toy_optim_param(s.o, i));
    float n;
    side_step(&s, 1, 1.0f, 1e-3f, tp, &r, &n);
    struct toy_tensor *p0 = toy_optim_param(s.o, 0);
    float *before = copy_f32(p0);
    size_t c0 = copied();
    side_step(&s, 1, 1.0f, 1e-3f, tp, &r, &n);
    cr_assert(!toy_optim_on_device(s.o));
    cr_expect_geq(copied() - c0, 2 * pbytes, "a host-optimizer step copied only %zu bytes", copied() - c0);
    cr_expect_neq(memcmp(before, p0->data, toy_nbytes(p0)), 0, "the host step did not update p->data");
    free(before);
    toy_threadpool_free(tp);
    side_free(&s);
    unsetenv("TOY_CUDA_OPTIM");
}
