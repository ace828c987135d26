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
#include <string.h>

#include "backends/cuda/kernels-common.cuh"
/* the attention kernels' range logic (the file's extern "C" launchers take
 * the place of the library's copies in this program) */
#include "backends/cuda/kernels-attention.cu"
#include "backends/cuda/kernels-matmul.cu"

extern "C" {
#include "toy/toy.h"
}

/* cuBLAS's column-major strided-batched GEMM, on the host, for F32 */
static void host_gemm(const gemm_call &g) {
    for (int b = 0; b < g.batch; b++) {
        const float *X = (const float *)g.B + b * g.sB, *Y = (const float *)g.A + b * g.sA;
        float *C = (float *)g.C + b * g.sC;
        for (int i = 0; i < g.n; i++)
            for (int j = 0; j < g.m; j++) {
                double acc = 0;
                for (int l = 0; l < g.k; l++) {
                    float x = g.opB == CUBLAS_OP_N ? X[i + (int64_t)l * g.ldb] : X[l + (int64_t)i * g.ldb];
                    float y = g.opA == CUBLAS_OP_N ? Y[l + (int64_t)j * g.lda] : Y[j + (int64_t)l * g.lda];
                    acc += (double)x * y;
                }
                C[i + (int64_t)j * g.ldc] = (float)acc + g.beta * C[i + (int64_t)j * g.ldc];
            }
    }
}

static void describe_host(CT *d, const struct toy_tensor *t) {
    d->data = (char *)t->data;
    d->type = t->type;
    for (int i = 0; i < 4; i++) {
        d->ne[i] = t->ne[i];
        d->nb[i] = (int64_t)t->nb[i];
    }
}

/* one product through the cuBLAS call plan, run by host_gemm, against the CPU */
static int matmul_case(struct toy_rng *r, const int64_t *ane, const int64_t *bne, bool ta, bool tb, int pad,
                       const char *what) {
    struct toy_ctx *ctx = toy_ctx_init(true);
    int64_t big[4] = {ane[0] + pad, ane[1], ane[2], ane[3]};
    struct toy_tensor *abig = toy_new_tensor(ctx, TOY_F32, 4, big);
    struct toy_tensor *a = pad ? toy_view(ctx, abig, 4, ane, abig->nb, 0) : abig;
    struct toy_tensor *b = toy_new_tensor(ctx, TOY_F32, 4, bne);
    for (int64_t i = 0; i < toy_nelements(abig); i++) ((float *)abig->data)[i] = toy_rng_uniform(r) - 0.5f;
    for (int64_t i = 0; i < toy_nelements(b); i++) ((float *)b->data)[i] = toy_rng_uniform(r) - 0.5f;
    struct toy_tensor *y = toy_matmul(ctx, a, b, ta, tb);
    toy_set_output(y);
    struct toy_graph *gr = toy_graph_new(ctx);
    toy_graph_build(gr, y);
    struct toy_threadpool *tp = toy_threadpool_new(1);
    if (toy_graph_compute(gr, tp)) {
        printf("%s: cpu: %s\n", what, toy_last_error());
        return 1;
    }
    int64_t n = toy_nelements(y);
    float *got = (float *)calloc((size_t)n, sizeof(float));
    struct toy_cu_node nd = {};
    nd.op = TOY_OP_MATMUL;
    memcpy(nd.op_params, y->op_params, sizeof nd.op_params);
    describe_host(&nd.dst, y);
    nd.dst.data = (char *)got;
    describe_host(&nd.src[0], a);
    describe_host(&nd.src[1], b);
    if (pad) nd.src[0].data = (char *)abig->data;
    mm s = mm_shape(&nd);
    operand A = as_is(nd.src[0], CUDA_R_32F, 4), B = as_is(nd.src[1], CUDA_R_32F, 4);
    for (int64_t c = 0; c < gemm_count(&nd, A, B); c++) host_gemm(gemm_at(&nd, s, A, B, c));
    double worst = 0;
    for (int64_t i = 0; i < n; i++) worst = fmax(worst, fabs(got[i] - ((float *)y->data)[i]));
    printf("matmul plan %-36s %s (max diff %.1e, %lld calls)\n", what, worst < 1e-4 ? "matches the CPU" : "DIFFERS",
           worst, (long long)gemm_count(&nd, A, B));
    free(got);
    toy_threadpool_free(tp);
    toy_ctx_free(ctx);
    return worst < 1e-4 ? 0 : 1;
}

int main(void) {
    int fails = 0;
    struct toy_rng r;
    toy_rng_seed(&r, 1);
    const int types[] = {TOY_Q8_0, TOY_Q4_0, TOY_Q4_1, TOY_Q5_0, TOY_Q5_1, TOY_Q4_K, TOY_Q5_K, TOY_Q6_K,
                         TOY_Q2_K, TOY_Q3_K, TOY_IQ4_NL, TOY_IQ4_XS, TOY_MXFP4};
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
        if (q_block_bytes(t)) { /* the GEMV's lanes' weight pairs against the dequantized row */
            double want = 0, got = 0;
            for (int64_t i = 0; i < n; i++) want += (double)ref[i] * x[(i * 7) % n];
            int64_t bsz = q_block_bytes(t);
            for (int64_t b = 0; b < n / 32; b++) {
                const uint8_t *bp = (const uint8_t *)q + b * bsz;
                for (int l = 0; l < 16; l++) {
                    int e[2];
                    float w[2], mn;
                    q_block_pair(bp, t, l, e, w, &mn);
                    for (int k = 0; k < 2; k++)
                        got += ((double)q_block_d(bp, t) * w[k] + mn) * x[(b * 32 + e[k]) * 7 % n];
                }
            }
            bool ok = fabs(got - want) <= 1e-4 * (1 + fabs(want));
            printf("%-5s GEMV weight pairs %s (%g vs %g)\n", toy_dtype_name((enum toy_dtype)t),
                   ok ? "matches" : "DIFFERS", got, want);
            bad += !ok;
        }
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
    /* split-key decode: the chunks cover [0, Tk) once, for every cache length */
    for (int64_t Tk = 1; Tk < 3000; Tk += 37) {
        int64_t next = 0;
        for (int sidx = 0; sidx < SPLITS; sidx++) {
            int64_t c0, c1;
            split_chunk(Tk, sidx, &c0, &c1);
            if (c0 != next || c1 < c0) fails++;
            next = c1;
        }
        if (next != Tk) fails++;
    }
    printf("split-key decode: chunks partition every cache length checked\n");

    /* the row-major -> column-major mapping of every matmul form */
    {
        const int64_t a[4] = {24, 10, 4, 2}, at_[4] = {10, 24, 4, 2}, bt[4] = {24, 12, 2, 2}, bn[4] = {12, 24, 4, 1},
                      bn1[4] = {12, 24, 1, 1}, bt1[4] = {24, 12, 1, 1}, btt[4] = {24, 12, 4, 2}, a2[4] = {24, 10, 1, 1},
                      b2[4] = {24, 7, 1, 1};
        fails += matmul_case(&r, a, bt, false, true, 0, "A B^T, GQA ratio 2 in dim 2");
        fails += matmul_case(&r, a, bn, false, false, 0, "A B, B broadcast in dim 3");
        fails += matmul_case(&r, at_, bn, true, false, 0, "A^T B");
        fails += matmul_case(&r, at_, btt, true, true, 0, "A^T B^T");
        fails += matmul_case(&r, a, bn1, false, false, 0, "A B, B broadcast in dims 2, 3");
        fails += matmul_case(&r, a, bt1, false, true, 5, "A (strided view) B^T");
        fails += matmul_case(&r, a2, b2, false, true, 0, "2-D A B^T (a linear layer)");
    }
    /* the device optimizer's AdamW element (toy_cu_adamw_elem, what k_adamw
     * runs) against the CPU library's AdamW: 6 steps, bit for bit */
    {
        const int64_t n = 1000;
        struct toy_ctx *ctx = toy_ctx_init(true);
        struct toy_tensor *p = toy_new_tensor_1d(ctx, TOY_F32, n), *g = toy_new_tensor_1d(ctx, TOY_F32, n);
        p->grad = g;
        float *hp = (float *)malloc(n * sizeof(float)), *hm = (float *)calloc(n, sizeof(float)),
              *hv = (float *)calloc(n, sizeof(float));
        for (int64_t i = 0; i < n; i++) hp[i] = ((float *)p->data)[i] = toy_rng_uniform(&r) * 2 - 1;
        struct toy_optim *o = toy_optim_new(TOY_OPTIM_ADAMW);
        struct toy_optim_group grp = {};
        grp.beta1 = 0.9f, grp.beta2 = 0.95f, grp.eps = 1e-8f, grp.weight_decay = 0.1f;
        toy_optim_add_param(o, p, toy_optim_add_group(o, &grp));
        struct toy_threadpool *tp = toy_threadpool_new(1);
        int bad = 0;
        for (int step = 1; step <= 6; step++) {
            for (int64_t i = 0; i < n; i++) ((float *)g->data)[i] = (toy_rng_uniform(&r) * 2 - 1) * (i % 7 ? 1e-3f : 1.0f);
            float lr = 1e-3f * (float)step;
            if (toy_optim_step(o, lr, tp)) bad++;
            float bc1 = (float)(1.0 - pow(0.9f, (double)step)), bc2s = (float)sqrt(1.0 - pow(0.95f, (double)step));
            for (int64_t i = 0; i < n; i++)
                toy_cu_adamw_elem(hp + i, ((float *)g->data)[i], hm + i, hv + i, lr, 0.9f, 0.95f, 1e-8f, 0.1f, bc1, bc2s);
        }
        bad += memcmp(hp, p->data, n * sizeof(float)) != 0;
        bad += memcmp(hm, toy_optim_state(o, 0, 0), n * sizeof(float)) != 0;
        bad += memcmp(hv, toy_optim_state(o, 0, 1), n * sizeof(float)) != 0;
        printf("adamw: the device element function %s the CPU's AdamW bit for bit (6 steps)\n",
               bad ? "DIFFERS from" : "equals");
        fails += bad;
        toy_threadpool_free(tp);
        toy_optim_free(o);
        free(hp);
        free(hm);
        free(hv);
        toy_ctx_free(ctx);
    }
    printf("%s\n", fails ? "cuda-host-check: FAILED" : "cuda-host-check: ok");
    free(x);
    free(ref);
    free(q);
    return fails ? 1 : 0;
}
