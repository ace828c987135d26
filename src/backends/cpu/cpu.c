/* cpu.c: the CPU kernels of every op except matmul (matmul.c) and attention
 * (attention.c), and the dispatch from a graph node to its kernel.
 *
 * Every kernel runs on all threads of the pool at once as (ith, nth) and
 * splits its rows; results are contiguous f32 (op results are made
 * contiguous by the constructors); sources may be strided views. Reductions
 * across threads use per-thread partials and the "last thread out" pattern
 * (cpu-impl.h) instead of a barrier.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "backends/cpu/cpu-impl.h"
#include "backends/cpu/qdot.h"
#include "toy/quant.h"
#include <cblas.h>

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static void init_impl(void) {
    toy_simd_init();
    toy_qdot_init();
    toy_blas_init();
    /* the per-CPU kernel choices (each read lazily from $TOY_LOADS,
     * $TOY_PREFETCH, $TOY_BF16_GEMM, $TOY_SGEMM) settle here, once, on one
     * thread: the pool's workers then only read them, and a bad value is
     * warned about once */
    (void)toy_cpu_wide_loads();
    (void)toy_cpu_wide_loads_f32();
    (void)toy_cpu_sgemm_own();
    (void)toy_cpu_prefetch_ahead();
    (void)toy_cpu_bf16_route();
    /* the pool splits GEMMs itself: one BLAS thread per call */
    openblas_set_num_threads(1);
}
void toy_cpu_init(void) { pthread_once(&init_once, init_impl); }

/* ---- row access -------------------------------------------------------------- */

const float *toy_cpu_row_f32(const struct toy_tensor *t, const char *row, float *tmp) {
    int64_t n = t->ne[0];
    if (t->type == TOY_F32) {
        if (t->nb[0] == 4) return (const float *)row;
        for (int64_t i = 0; i < n; i++) tmp[i] = *(const float *)(row + i * t->nb[0]);
        return tmp;
    }
    if (toy_dtype_block_size(t->type) == 1 && t->nb[0] != toy_dtype_type_size(t->type)) {
        for (int64_t i = 0; i < n; i++) {
            const char *p = row + i * t->nb[0];
            tmp[i] = t->type == TOY_F16 ? toy_f16_to_f32(*(const toy_f16 *)p)
                   : t->type == TOY_BF16 ? toy_bf16_to_f32(*(const toy_bf16 *)p)
                   : (float)*(const int32_t *)p;
        }
        return tmp;
    }
    if (toy_dequantize_row(t->type, row, tmp, n) != TOY_OK)
        TOY_ABORT("cannot read rows of type %s (tensor '%s')", toy_dtype_name(t->type), toy_label(t));
    return tmp;
}

static inline float *out_row(struct toy_tensor *t, int64_t r) {
    return (float *)t->data + r * t->ne[0];
}

/* Source row matching output row (i1,i2,i3) with broadcasting. */
static inline const char *bcast_row(const struct toy_tensor *s, int64_t i1, int64_t i2, int64_t i3) {
    return TOY_ROW(s, s->ne[1] == 1 ? 0 : i1, s->ne[2] == 1 ? 0 : i2, s->ne[3] == 1 ? 0 : i3);
}

/* ---- copies ---------------------------------------------------------------------- */

static void k_cont_cast(struct toy_tensor *dst, int ith, int nth, float *tmp) {
    const struct toy_tensor *a = dst->src[0];
    int64_t r0, r1, n = a->ne[0];
    toy_split(toy_nrows(dst), ith, nth, &r0, &r1);
    size_t drow = toy_row_bytes(dst->type, n);
    for (int64_t r = r0; r < r1; r++) {
        int64_t i1, i2, i3;
        toy_unravel(r, a, &i1, &i2, &i3);
        const char *src = TOY_ROW(a, i1, i2, i3);
        char *d = (char *)dst->data + r * drow;
        if (a->type == dst->type && (a->nb[0] == toy_dtype_type_size(a->type) || n == 1)) {
            memcpy(d, src, drow);
            continue;
        }
        const float *f = toy_cpu_row_f32(a, src, tmp);
        switch (dst->type) {
        case TOY_F32: memcpy(d, f, (size_t)n * 4); break;
        case TOY_F16: toy_f32_to_f16_row(f, (toy_f16 *)d, n); break;
        case TOY_BF16: toy_f32_to_bf16_row(f, (toy_bf16 *)d, n); break;
        default: TOY_ABORT("cast to %s", toy_dtype_name(dst->type));
        }
    }
}

/* ---- elementwise -------------------------------------------------------------------- */

static void k_binary(struct toy_tensor *dst, int ith, int nth, float *tmp) {
    const struct toy_tensor *a = dst->src[0], *b = dst->src[1];
    int64_t r0, r1, n = dst->ne[0];
    toy_split(toy_nrows(dst), ith, nth, &r0, &r1);
    float *ta = tmp, *tb = tmp + n;
    for (int64_t r = r0; r < r1; r++) {
        int64_t i1, i2, i3;
        toy_unravel(r, dst, &i1, &i2, &i3);
        const float *x = toy_cpu_row_f32(a, TOY_ROW(a, i1, i2, i3), ta);
        const char *brow = bcast_row(b, i1, i2, i3);
        float *y = out_row(dst, r);
        if (b->ne[0] == 1) {
            float s = *(const float *)brow;
            switch (dst->op) {
            case TOY_OP_ADD: for (int64_t i = 0; i < n; i++) y[i] = x[i] + s; break;
            case TOY_OP_SUB: for (int64_t i = 0; i < n; i++) y[i] = x[i] - s; break;
            case TOY_OP_MUL: for (int64_t i = 0; i < n; i++) y[i] = x[i] * s; break;
            default: for (int64_t i = 0; i < n; i++) y[i] = x[i] / s; break;
            }
            continue;
        }
        const float *z = toy_cpu_row_f32(b, brow, tb);
        switch (dst->op) {
        case TOY_OP_ADD: toy_vec.add(y, x, z, n); break;
        case TOY_OP_SUB: for (int64_t i = 0; i < n; i++) y[i] = x[i] - z[i]; break;
        case TOY_OP_MUL: toy_vec.mul(y, x, z, n); break;
        default: for (int64_t i = 0; i < n; i++) y[i] = x[i] / z[i]; break;
        }
    }
}

static void k_unary(struct toy_tensor *dst, int ith, int nth, float *tmp) {
    const struct toy_tensor *a = dst->src[0];
    int64_t r0, r1, n = dst->ne[0];
    toy_split(toy_nrows(dst), ith, nth, &r0, &r1);
    float s = toy_param_f32(dst, P_SCALE);
    for (int64_t r = r0; r < r1; r++) {
        int64_t i1, i2, i3;
        toy_unravel(r, dst, &i1, &i2, &i3);
        const float *x = toy_cpu_row_f32(a, TOY_ROW(a, i1, i2, i3), tmp);
        float *y = out_row(dst, r);
        switch (dst->op) {
        case TOY_OP_SCALE: toy_vec.scale(y, x, s, n); break;
        case TOY_OP_SQR: for (int64_t i = 0; i < n; i++) y[i] = x[i] * x[i]; break;
        case TOY_OP_SQRT: for (int64_t i = 0; i < n; i++) y[i] = sqrtf(x[i]); break;
        case TOY_OP_NEG: for (int64_t i = 0; i < n; i++) y[i] = -x[i]; break;
        case TOY_OP_TANH: for (int64_t i = 0; i < n; i++) y[i] = tanhf(x[i]); break;
        case TOY_OP_SILU: for (int64_t i = 0; i < n; i++) y[i] = x[i] / (1.0f + expf(-x[i])); break;
        case TOY_OP_GELU: toy_vec.gelu(y, x, n); break;
        default: TOY_ABORT("unary %s", toy_op_name(dst->op));
        }
    }
}

/* dy-based backward of the activations: dst = f'(x) * dy */
static void k_act_back(struct toy_tensor *dst, int ith, int nth, float *tmp) {
    const struct toy_tensor *dy = dst->src[0], *x = dst->src[1];
    int64_t r0, r1, n = dst->ne[0];
    toy_split(toy_nrows(dst), ith, nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        int64_t i1, i2, i3;
        toy_unravel(r, dst, &i1, &i2, &i3);
        const float *g = toy_cpu_row_f32(dy, TOY_ROW(dy, i1, i2, i3), tmp);
        const float *xv = toy_cpu_row_f32(x, TOY_ROW(x, i1, i2, i3), tmp + n);
        float *y = out_row(dst, r);
        if (dst->op == TOY_OP_SILU_BACK) {
            for (int64_t i = 0; i < n; i++) {
                float sg = 1.0f / (1.0f + expf(-xv[i]));
                y[i] = g[i] * sg * (1.0f + xv[i] * (1.0f - sg));
            }
        } else {
            toy_vec.gelu_back(y, g, xv, n);
        }
    }
}

static void k_swiglu(struct toy_tensor *dst, int ith, int nth, float *tmp) {
    const struct toy_tensor *g = dst->src[0], *u = dst->src[1];
    int64_t r0, r1, n = dst->ne[0];
    toy_split(toy_nrows(dst), ith, nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        int64_t i1, i2, i3;
        toy_unravel(r, dst, &i1, &i2, &i3);
        const float *gv = toy_cpu_row_f32(g, TOY_ROW(g, i1, i2, i3), tmp);
        const float *uv = toy_cpu_row_f32(u, TOY_ROW(u, i1, i2, i3), tmp + n);
        toy_vec.silu_mul(out_row(dst, r), gv, uv, n);
    }
}

/* one node gives both gradients: dst = [dg (like gate) | du (like up)] */
static void k_swiglu_back(struct toy_tensor *dst, int ith, int nth, float *tmp) {
    const struct toy_tensor *dy = dst->src[0], *g = dst->src[1], *u = dst->src[2];
    int64_t r0, r1, n = g->ne[0], total = toy_nelements(g);
    toy_split(toy_nrows(g), ith, nth, &r0, &r1);
    float *dg = dst->data, *du = dg + total;
    for (int64_t r = r0; r < r1; r++) {
        int64_t i1, i2, i3;
        toy_unravel(r, g, &i1, &i2, &i3);
        const float *d = toy_cpu_row_f32(dy, TOY_ROW(dy, i1, i2, i3), tmp);
        const float *gv = toy_cpu_row_f32(g, TOY_ROW(g, i1, i2, i3), tmp + n);
        const float *uv = toy_cpu_row_f32(u, TOY_ROW(u, i1, i2, i3), tmp + 2 * n);
        toy_vec.swiglu_back(dg + r * n, du + r * n, d, gv, uv, n);
    }
}

/* gpt-oss's clamped SwiGLU: g' = min(g, limit), u' = clamp(u, -limit, limit),
 * y = g' sigmoid(alpha g') (u' + 1); limit <= 0 clamps nothing. The
 * comparisons pass a NaN through, as PyTorch's clamp does. A plain loop: it
 * runs once per MLP, beside the products. */
static inline float swo_gate(float g, float lim) { return lim > 0 && g > lim ? lim : g; }
static inline float swo_up(float u, float lim) { return lim <= 0 ? u : u > lim ? lim : u < -lim ? -lim : u; }

static void k_swiglu_oai(struct toy_tensor *dst, int ith, int nth, float *tmp) {
    const struct toy_tensor *g = dst->src[0], *u = dst->src[1];
    const float alpha = toy_param_f32(dst, P_SWO_ALPHA), lim = toy_param_f32(dst, P_SWO_LIMIT);
    int64_t r0, r1, n = dst->ne[0];
    toy_split(toy_nrows(dst), ith, nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        int64_t i1, i2, i3;
        toy_unravel(r, dst, &i1, &i2, &i3);
        const float *gv = toy_cpu_row_f32(g, TOY_ROW(g, i1, i2, i3), tmp);     /* (n) */
        const float *uv = toy_cpu_row_f32(u, TOY_ROW(u, i1, i2, i3), tmp + n); /* (n) */
        float *y = out_row(dst, r);                                            /* (n) */
        for (int64_t i = 0; i < n; i++) {
            float gc = swo_gate(gv[i], lim), uc = swo_up(uv[i], lim);
            y[i] = gc / (1.0f + expf(-alpha * gc)) * (uc + 1.0f);
        }
    }
}

/* dst = [dg (like gate) | du (like up)], as SWIGLU_BACK; PyTorch's clamp
 * gradient masks: the bounds themselves pass it (gate == limit, |up| ==
 * limit), a NaN does not */
static void k_swiglu_oai_back(struct toy_tensor *dst, int ith, int nth, float *tmp) {
    const struct toy_tensor *dy = dst->src[0], *g = dst->src[1], *u = dst->src[2];
    const float alpha = toy_param_f32(dst, P_SWO_ALPHA), lim = toy_param_f32(dst, P_SWO_LIMIT);
    int64_t r0, r1, n = g->ne[0], total = toy_nelements(g);
    toy_split(toy_nrows(g), ith, nth, &r0, &r1);
    float *dg = dst->data, *du = dg + total; /* (total) each */
    for (int64_t r = r0; r < r1; r++) {
        int64_t i1, i2, i3;
        toy_unravel(r, g, &i1, &i2, &i3);
        const float *d = toy_cpu_row_f32(dy, TOY_ROW(dy, i1, i2, i3), tmp);         /* (n) */
        const float *gv = toy_cpu_row_f32(g, TOY_ROW(g, i1, i2, i3), tmp + n);      /* (n) */
        const float *uv = toy_cpu_row_f32(u, TOY_ROW(u, i1, i2, i3), tmp + 2 * n);  /* (n) */
        for (int64_t i = 0; i < n; i++) {
            float gc = swo_gate(gv[i], lim), uc = swo_up(uv[i], lim);
            float s = 1.0f / (1.0f + expf(-alpha * gc));
            bool gpass = lim <= 0 || gv[i] <= lim, upass = lim <= 0 || (uv[i] >= -lim && uv[i] <= lim);
            dg[r * n + i] = gpass ? d[i] * (uc + 1.0f) * s * (1.0f + alpha * gc * (1.0f - s)) : 0.0f;
            du[r * n + i] = upass ? d[i] * gc * s : 0.0f;
        }
    }
}

/* ---- indexing ------------------------------------------------------------------------- */

static void flag_error(struct toy_tensor *dst) { dst->op_params[TOY_MAX_OP_PARAMS - 1] = 1; }

static void k_get_rows(struct toy_tensor *dst, int ith, int nth, float *tmp) {
    const struct toy_tensor *tab = dst->src[0], *ids = dst->src[1];
    int64_t r0, r1, n = dst->ne[0];
    toy_split(toy_nrows(dst), ith, nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        int64_t i1, i2, i3;
        toy_unravel(r, dst, &i1, &i2, &i3);
        int32_t id = *(const int32_t *)((const char *)ids->data + i1 * ids->nb[0] + i2 * ids->nb[1] + i3 * ids->nb[2]);
        float *y = out_row(dst, r);
        if (id < 0 || id >= tab->ne[1]) {
            flag_error(dst);
            memset(y, 0, (size_t)n * 4);
            continue;
        }
        const float *x = toy_cpu_row_f32(tab, TOY_ROW(tab, id, 0, 0), tmp);
        if (x != y) memcpy(y, x, (size_t)n * 4);
    }
}

/* dtable[id] += dy[row]; threads own column slices, so no two threads write
 * the same element. */
static void k_get_rows_back(struct toy_tensor *dst, int ith, int nth) {
    const struct toy_tensor *dy = dst->src[0], *ids = dst->src[1];
    int64_t c0, c1, n = dst->ne[0];
    toy_split(n, ith, nth, &c0, &c1);
    if (!dst->op_params[P_GRB_ACCUM])
        for (int64_t r = 0; r < dst->ne[1]; r++) memset(out_row(dst, r) + c0, 0, (size_t)(c1 - c0) * 4);
    int64_t nrows = toy_nrows(dy);
    for (int64_t r = 0; r < nrows; r++) {
        int64_t i1, i2, i3;
        toy_unravel(r, dy, &i1, &i2, &i3);
        int32_t id = *(const int32_t *)((const char *)ids->data + i1 * ids->nb[0] + i2 * ids->nb[1] + i3 * ids->nb[2]);
        if (id < 0 || id >= dst->ne[1]) continue;
        const float *g = (const float *)TOY_ROW(dy, i1, i2, i3);
        float *y = out_row(dst, id);
        for (int64_t c = c0; c < c1; c++) y[c] += g[c];
    }
}

/* ---- reductions, broadcasts -------------------------------------------------------------- */

static void k_sum_dim(struct toy_tensor *dst, int ith, int nth, float *tmp) {
    const struct toy_tensor *a = dst->src[0];
    int dim = dst->op_params[P_DIM];
    double inv = dst->op == TOY_OP_MEAN ? 1.0 / (double)a->ne[dim] : 1.0;
    int64_t r0, r1, n = dst->ne[0];
    toy_split(toy_nrows(dst), ith, nth, &r0, &r1);
    double *acc = (double *)(tmp + 2 * a->ne[0] + 16);
    for (int64_t r = r0; r < r1; r++) {
        int64_t i1, i2, i3;
        toy_unravel(r, dst, &i1, &i2, &i3);
        float *y = out_row(dst, r);
        if (dim == 0) {
            const float *x = toy_cpu_row_f32(a, TOY_ROW(a, i1, i2, i3), tmp);
            double s = 0;
            for (int64_t i = 0; i < a->ne[0]; i++) s += x[i];
            y[0] = (float)(s * inv);
            continue;
        }
        for (int64_t i = 0; i < n; i++) acc[i] = 0;
        int64_t idx[4] = {0, i1, i2, i3};
        for (int64_t k = 0; k < a->ne[dim]; k++) {
            idx[dim] = k;
            const float *x = toy_cpu_row_f32(a, TOY_ROW(a, idx[1], idx[2], idx[3]), tmp);
            for (int64_t i = 0; i < n; i++) acc[i] += x[i];
        }
        for (int64_t i = 0; i < n; i++) y[i] = (float)(acc[i] * inv);
    }
}

static void k_sum_all(struct toy_tensor *dst, int ith, int nth, float *tmp, void *work, size_t ws) {
    const struct toy_tensor *a = dst->src[0];
    int64_t r0, r1;
    toy_split(toy_nrows(a), ith, nth, &r0, &r1);
    double s = 0;
    for (int64_t r = r0; r < r1; r++) {
        int64_t i1, i2, i3;
        toy_unravel(r, a, &i1, &i2, &i3);
        const float *x = toy_cpu_row_f32(a, TOY_ROW(a, i1, i2, i3), tmp);
        for (int64_t i = 0; i < a->ne[0]; i++) s += x[i];
    }
    double *partial = (double *)work; /* first 64 bytes per thread, before the slices */
    (void)ws;
    partial[ith * 8] = s;
    if (toy_last_thread((atomic_int *)&dst->op_params[TOY_MAX_OP_PARAMS - 2], nth)) {
        double t = 0;
        for (int i = 0; i < nth; i++) t += partial[i * 8];
        *(float *)dst->data = (float)t;
    }
}

static void k_repeat(struct toy_tensor *dst, int ith, int nth, float *tmp) {
    const struct toy_tensor *a = dst->src[0];
    int64_t r0, r1, n = dst->ne[0];
    toy_split(toy_nrows(dst), ith, nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        int64_t i1, i2, i3;
        toy_unravel(r, dst, &i1, &i2, &i3);
        const char *src = bcast_row(a, i1, i2, i3);
        float *y = out_row(dst, r);
        if (a->ne[0] == 1) {
            float v = *(const float *)src;
            for (int64_t i = 0; i < n; i++) y[i] = v;
        } else {
            const float *x = toy_cpu_row_f32(a, src, tmp);
            memcpy(y, x, (size_t)n * 4);
        }
    }
}

/* dst (small) = sum of a over the dims where dst has size 1 */
/* SUM_TO: each row of dst sums its rows of a in double, in row order.
 * Fewer rows than threads (a bias's gradient: one row) split the columns
 * instead, in runs of 16: every sum keeps its order either way. */
static void k_sum_to(struct toy_tensor *dst, int ith, int nth, float *tmp) {
    const struct toy_tensor *a = dst->src[0];
    int64_t r0, r1, n = dst->ne[0], i0 = 0, i1 = n;
    if (toy_nrows(dst) < nth && n >= 32 && a->ne[0] == n) {
        int64_t c0, c1;
        toy_split((n + 15) / 16, ith, nth, &c0, &c1);
        i0 = 16 * c0;
        i1 = 16 * c1 < n ? 16 * c1 : n;
        r0 = 0;
        r1 = i0 < i1 ? toy_nrows(dst) : 0;
    } else {
        toy_split(toy_nrows(dst), ith, nth, &r0, &r1);
    }
    double *acc = (double *)(tmp + 2 * a->ne[0] + 16);
    int64_t e1 = dst->ne[1] == 1 ? a->ne[1] : 1, e2 = dst->ne[2] == 1 ? a->ne[2] : 1,
            e3 = dst->ne[3] == 1 ? a->ne[3] : 1;
    for (int64_t r = r0; r < r1; r++) {
        int64_t o1, o2, o3;
        toy_unravel(r, dst, &o1, &o2, &o3);
        for (int64_t i = i0; i < i1; i++) acc[i] = 0;
        for (int64_t j3 = 0; j3 < e3; j3++)
            for (int64_t j2 = 0; j2 < e2; j2++)
                for (int64_t j1 = 0; j1 < e1; j1++) {
                    const char *row = TOY_ROW(a, e1 > 1 ? j1 : o1, e2 > 1 ? j2 : o2, e3 > 1 ? j3 : o3);
                    if (n == 1 && a->ne[0] > 1) {
                        const float *x = toy_cpu_row_f32(a, row, tmp);
                        double s = 0;
                        for (int64_t i = 0; i < a->ne[0]; i++) s += x[i];
                        acc[0] += s;
                    } else {
                        const float *x = toy_cpu_row_f32(a, row, tmp);
                        toy_vec.add_d(acc + i0, x + i0, i1 - i0);
                    }
                }
        float *y = out_row(dst, r);
        for (int64_t i = i0; i < i1; i++) y[i] = (float)acc[i];
    }
}

static void k_concat(struct toy_tensor *dst, int ith, int nth, float *tmp) {
    const struct toy_tensor *a = dst->src[0], *b = dst->src[1];
    int dim = dst->op_params[P_DIM];
    int64_t r0, r1, n = dst->ne[0];
    toy_split(toy_nrows(dst), ith, nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        int64_t i[4] = {0};
        toy_unravel(r, dst, &i[1], &i[2], &i[3]);
        float *y = out_row(dst, r);
        if (dim == 0) {
            const float *x = toy_cpu_row_f32(a, TOY_ROW(a, i[1], i[2], i[3]), tmp);
            memcpy(y, x, (size_t)a->ne[0] * 4);
            x = toy_cpu_row_f32(b, TOY_ROW(b, i[1], i[2], i[3]), tmp);
            memcpy(y + a->ne[0], x, (size_t)b->ne[0] * 4);
            continue;
        }
        const struct toy_tensor *s = i[dim] < a->ne[dim] ? a : b;
        if (s == b) i[dim] -= a->ne[dim];
        const float *x = toy_cpu_row_f32(s, TOY_ROW(s, i[1], i[2], i[3]), tmp);
        memcpy(y, x, (size_t)n * 4);
    }
}

/* ---- norms -------------------------------------------------------------------------------- */

static void k_rms_norm(struct toy_tensor *dst, int ith, int nth, float *tmp) {
    const struct toy_tensor *x = dst->src[0], *w = dst->src[1];
    float eps = toy_param_f32(dst, P_EPS);
    int64_t r0, r1, n = dst->ne[0];
    toy_split(toy_nrows(dst), ith, nth, &r0, &r1);
    const float *wv = w ? toy_cpu_row_f32(w, w->data, tmp + n) : NULL;
    for (int64_t r = r0; r < r1; r++) {
        int64_t i1, i2, i3;
        toy_unravel(r, dst, &i1, &i2, &i3);
        const float *xv = toy_cpu_row_f32(x, TOY_ROW(x, i1, i2, i3), tmp);
        float rstd = 1.0f / sqrtf(toy_vec.sumsq(xv, n) / (float)n + eps);
        toy_vec.rms_apply(out_row(dst, r), xv, wv, rstd, n);
    }
}

static void k_layer_norm(struct toy_tensor *dst, int ith, int nth, float *tmp) {
    const struct toy_tensor *x = dst->src[0], *w = dst->src[1], *b = dst->src[2];
    float eps = toy_param_f32(dst, P_EPS);
    int64_t r0, r1, n = dst->ne[0];
    toy_split(toy_nrows(dst), ith, nth, &r0, &r1);
    const float *wv = w ? toy_cpu_row_f32(w, w->data, tmp + n) : NULL;
    const float *bv = b ? toy_cpu_row_f32(b, b->data, tmp + 2 * n) : NULL;
    for (int64_t r = r0; r < r1; r++) {
        int64_t i1, i2, i3;
        toy_unravel(r, dst, &i1, &i2, &i3);
        const float *xv = toy_cpu_row_f32(x, TOY_ROW(x, i1, i2, i3), tmp);
        double mean = toy_vec.sum_d(xv, n) / (double)n, var = toy_vec.sqdev_d(xv, mean, n) / (double)n;
        toy_vec.layer_apply(out_row(dst, r), xv, wv, bv, (float)mean, (float)(1.0 / sqrt(var + eps)), n);
    }
}

/* dx for rms (layer=false) or layer norm (layer=true):
 *   xhat = (x - mu) r;  g = w dy;
 *   dx = r (g - mean(g) [layer only] - xhat mean(g xhat))
 * (the layer norm's in double, its row statistics as the forward's) */
static void k_norm_back(struct toy_tensor *dst, int ith, int nth, float *tmp, bool layer) {
    const struct toy_tensor *dy = dst->src[0], *x = dst->src[1], *w = dst->src[2];
    float eps = toy_param_f32(dst, P_EPS);
    int64_t r0, r1, n = dst->ne[0];
    toy_split(toy_nrows(dst), ith, nth, &r0, &r1);
    const float *wv = w ? toy_cpu_row_f32(w, w->data, tmp + 2 * n) : NULL;
    for (int64_t r = r0; r < r1; r++) {
        int64_t i1, i2, i3;
        toy_unravel(r, dst, &i1, &i2, &i3);
        const float *xv = toy_cpu_row_f32(x, TOY_ROW(x, i1, i2, i3), tmp);
        const float *d = toy_cpu_row_f32(dy, TOY_ROW(dy, i1, i2, i3), tmp + n);
        if (!layer) {
            /* RMSNorm, vectorised: g = w dy, dx = r g - x r^3 (g . x) / n */
            float *y = out_row(dst, r), *g = tmp + 3 * n;
            float rstd = 1.0f / sqrtf(toy_vec.sumsq(xv, n) / (float)n + eps);
            if (wv) toy_vec.mul(g, d, wv, n);
            else memcpy(g, d, (size_t)n * sizeof *g);
            float c = rstd * rstd * rstd * toy_vec.dot(g, xv, n) / (float)n;
            toy_vec.scale(y, g, rstd, n);
            toy_vec.axpy(y, xv, -c, n);
            continue;
        }
        double mu = toy_vec.sum_d(xv, n) / (double)n, var = toy_vec.sqdev_d(xv, mu, n) / (double)n;
        double rstd = 1.0 / sqrt(var + eps), sums[2];
        toy_vec.layer_back_sums(sums, d, wv, xv, mu, rstd, n);
        toy_vec.layer_back_apply(out_row(dst, r), d, wv, xv, mu, rstd, sums[0] / (double)n, sums[1] / (double)n, n);
    }
}

/* dw = sum over rows of dy * xhat; per-thread partials in double. */
static void k_norm_back_w(struct toy_tensor *dst, int ith, int nth, float *tmp, void *work, bool layer) {
    const struct toy_tensor *dy = dst->src[0], *x = dst->src[1];
    float eps = toy_param_f32(dst, P_EPS);
    int64_t n = dst->ne[0], r0, r1;
    int64_t nr = toy_nrows(x);
    toy_split(nr, ith, nth, &r0, &r1);
    double *part = (double *)((char *)work + TOY_WORK_HEAD) + (size_t)ith * (size_t)n;
    for (int64_t i = 0; i < n; i++) part[i] = 0;
    for (int64_t r = r0; r < r1; r++) {
        int64_t i1, i2, i3;
        toy_unravel(r, x, &i1, &i2, &i3);
        const float *xv = toy_cpu_row_f32(x, TOY_ROW(x, i1, i2, i3), tmp);
        const float *d = toy_cpu_row_f32(dy, TOY_ROW(dy, i1, i2, i3), tmp + n);
        double mu = 0, var;
        if (layer) {
            mu = toy_vec.sum_d(xv, n) / (double)n;
            var = toy_vec.sqdev_d(xv, mu, n); /* as the forward's */
        } else {
            var = toy_vec.sumsq(xv, n); /* summed in double, as the forward's */
        }
        double rstd = 1.0 / sqrt(var / (double)n + eps);
        toy_vec.acc_scaled_prod(part, d, xv, mu, rstd, n);
    }
    if (toy_last_thread((atomic_int *)&dst->op_params[TOY_MAX_OP_PARAMS - 2], nth)) {
        double *base = (double *)((char *)work + TOY_WORK_HEAD);
        float *y = dst->data;
        for (int64_t i = 0; i < n; i++) {
            double s = 0;
            for (int t = 0; t < nth; t++) s += base[(size_t)t * (size_t)n + (size_t)i];
            y[i] = (float)s;
        }
    }
}

/* ---- softmax ---------------------------------------------------------------------------- */

static void k_softmax(struct toy_tensor *dst, int ith, int nth, float *tmp) {
    const struct toy_tensor *x = dst->src[0], *mask = dst->src[1];
    float scale = toy_param_f32(dst, P_SM_SCALE);
    int64_t r0, r1, n = dst->ne[0];
    toy_split(toy_nrows(dst), ith, nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        int64_t i1, i2, i3;
        toy_unravel(r, dst, &i1, &i2, &i3);
        const float *xv = toy_cpu_row_f32(x, TOY_ROW(x, i1, i2, i3), tmp);
        float *y = out_row(dst, r);
        if (mask) {
            const char *mrow = bcast_row(mask, i1, i2, i3);
            if (mask->ne[0] == 1) {
                float mv = *(const float *)mrow;
                for (int64_t i = 0; i < n; i++) y[i] = xv[i] * scale + mv;
            } else {
                const float *m = toy_cpu_row_f32(mask, mrow, tmp + n);
                for (int64_t i = 0; i < n; i++) y[i] = xv[i] * scale + m[i];
            }
        } else {
            toy_vec.scale(y, xv, scale, n);
        }
        float mx = toy_vec.max(y, n);
        if (mx == -INFINITY) { /* fully masked row */
            memset(y, 0, (size_t)n * 4);
            continue;
        }
        float s = toy_vec.exp_sum(y, y, mx, n);
        toy_vec.scale(y, y, 1.0f / s, n);
    }
}

static void k_softmax_back(struct toy_tensor *dst, int ith, int nth, float *tmp) {
    const struct toy_tensor *dy = dst->src[0], *y = dst->src[1];
    float scale = toy_param_f32(dst, P_SM_SCALE);
    int64_t r0, r1, n = dst->ne[0];
    toy_split(toy_nrows(dst), ith, nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        int64_t i1, i2, i3;
        toy_unravel(r, dst, &i1, &i2, &i3);
        const float *d = toy_cpu_row_f32(dy, TOY_ROW(dy, i1, i2, i3), tmp);
        const float *yv = (const float *)TOY_ROW(y, i1, i2, i3);
        float dot = toy_vec.dot(d, yv, n);
        float *o = out_row(dst, r);
        for (int64_t i = 0; i < n; i++) o[i] = scale * yv[i] * (d[i] - dot);
    }
}

/* ---- rope ------------------------------------------------------------------------------------ */

/* Per-dim-pair frequency and yarn ramp mix, then rotate. Follows the
 * Hugging Face definitions of linear, llama3 and YaRN scaling. */
static void rope_freqs(const struct toy_tensor *dst, int n_dims, double *inv_freq) {
    float base = toy_param_f32(dst, P_RP_BASE), factor = toy_param_f32(dst, P_RP_FACTOR);
    int scaling = dst->op_params[P_RP_SCALING];
    int orig = dst->op_params[P_RP_ORIG];
    int half = n_dims / 2;
    for (int i = 0; i < half; i++) {
        double f = 1.0 / pow((double)base, (double)(2 * i) / n_dims);
        if (scaling == TOY_ROPE_SCALING_LINEAR) {
            f /= factor;
        } else if (scaling == TOY_ROPE_SCALING_LLAMA3) {
            double low = toy_param_f32(dst, P_RP_LOW), high = toy_param_f32(dst, P_RP_HIGH);
            double low_wl = orig / low, high_wl = orig / high;
            double wl = 2 * M_PI / f;
            if (wl > low_wl) {
                f /= factor;
            } else if (wl >= high_wl) {
                double smooth = (orig / wl - low) / (high - low);
                f = (1 - smooth) * f / factor + smooth * f;
            }
        } else if (scaling == TOY_ROPE_SCALING_YARN) {
            double bf = toy_param_f32(dst, P_RP_BFAST), bs = toy_param_f32(dst, P_RP_BSLOW);
            double lo = floor(n_dims * log(orig / (bf * 2 * M_PI)) / (2 * log(base)));
            double hi = ceil(n_dims * log(orig / (bs * 2 * M_PI)) / (2 * log(base)));
            if (lo < 0) lo = 0;
            if (hi > n_dims - 1) hi = n_dims - 1;
            if (hi == lo) hi += 0.001;
            double ramp = (i - lo) / (hi - lo);
            ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
            double extrap = 1 - ramp; /* weight of the unscaled frequency */
            f = (f / factor) * (1 - extrap) + f * extrap;
        }
        inv_freq[i] = f;
    }
}

/* Rows sharing a position share their angles: work items are positions
 * (t, b); cos/sin are computed once (in double: float loses ~1e-5 rad at
 * position 300) and applied to every head. */
#define ROPE_CACHE 32768   /* angles (positions x half) a thread keeps between runs */
#define ROPE_CACHE_POS 2048

/* the cos and sin of one position's angles (sin signed for the inverse) */
static void rope_angles(int64_t pv, const double *inv_freq, int half, double mscale, float sign, float *c_, float *s_) {
    for (int i = 0; i < half; i++) {
        double c, sv;
        sincos((double)pv * inv_freq[i], &sv, &c);
        c_[i] = (float)(c * mscale);
        s_[i] = (float)(sv * mscale * sign);
    }
}

/* Every layer rotates q and k at the same positions with the same
 * parameters: each thread keeps the angles of its last run of positions (a
 * decode step's one, a prompt's slice) and reuses them while the
 * positions, parameters and frequency factors are the same. */
static _Thread_local struct {
    int32_t params[TOY_MAX_OP_PARAMS];
    const void *ff;
    int64_t n; /* positions held; -1: none */
    int32_t pos[ROPE_CACHE_POS];
    float cs[ROPE_CACHE], sn[ROPE_CACHE];
} rope_cache = {.n = -1};

/* dst's inverse frequencies, with its frequency factors (src[2]) */
static void rope_inv_freq(const struct toy_tensor *dst, int n_dims, double *inv_freq) {
    rope_freqs(dst, n_dims, inv_freq);
    const struct toy_tensor *ff = dst->src[2];
    if (ff)
        for (int i = 0; i < n_dims / 2; i++) inv_freq[i] /= ((const float *)ff->data)[i];
}

/* Makes rope_cache hold dst's angles for ns slots: slot sl is position
 * pd[sl] (full) or that of row p0 + sl (pd per batch row, else per t of T).
 * False when ns slots do not fit it. inv_freq: n_dims / 2 doubles of scratch. */
static bool rope_cached(const struct toy_tensor *dst, int64_t ns, const int32_t *pd, bool per_batch, bool full,
                        int64_t T, int64_t p0, double *inv_freq) {
    int n_dims = dst->op_params[P_RP_NDIMS], half = n_dims / 2;
    float sign = dst->op_params[P_RP_INVERSE] ? -1.0f : 1.0f;
    double mscale = toy_param_f32(dst, P_RP_ATTN); /* 1 unless YaRN's or a file's attn_factor */
    const struct toy_tensor *ff = dst->src[2];
#define SLOT_POS(sl) (full ? pd[sl] : pd[per_batch ? p0 + (sl) : (p0 + (sl)) % T])
    if (!(ns > 0 && ns <= ROPE_CACHE_POS && ns * half <= ROPE_CACHE)) return false;
    bool hit = rope_cache.n == ns && rope_cache.ff == (ff ? ff->data : NULL) &&
               !memcmp(rope_cache.params, dst->op_params, sizeof rope_cache.params);
    for (int64_t sl = 0; sl < ns && hit; sl++) hit = rope_cache.pos[sl] == SLOT_POS(sl);
    if (hit) return true;
    rope_inv_freq(dst, n_dims, inv_freq);
    for (int64_t sl = 0; sl < ns; sl++) {
        rope_angles(SLOT_POS(sl), inv_freq, half, mscale, sign, rope_cache.cs + sl * half, rope_cache.sn + sl * half);
        rope_cache.pos[sl] = SLOT_POS(sl);
    }
#undef SLOT_POS
    memcpy(rope_cache.params, dst->op_params, sizeof rope_cache.params);
    rope_cache.ff = ff ? ff->data : NULL;
    rope_cache.n = ns;
    return true;
}

/* y = row xv of dst rotated by the angles c_, s_ (dims past n_dims as they are) */
static void rope_row(const struct toy_tensor *dst, const float *xv, float *y, const float *c_, const float *s_) {
    int n_dims = dst->op_params[P_RP_NDIMS], half = n_dims / 2;
    bool neox = dst->op_params[P_RP_MODE] == TOY_ROPE_NEOX;
    for (int i = 0; i < half; i++) {
        int64_t i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
        float a = xv[i0], bb = xv[i1];
        y[i0] = a * c_[i] - bb * s_[i];
        y[i1] = a * s_[i] + bb * c_[i];
    }
    for (int64_t i = n_dims; i < dst->ne[0]; i++) y[i] = xv[i];
}

static void k_rope(struct toy_tensor *dst, int ith, int nth, float *tmp) {
    const struct toy_tensor *x = dst->src[0], *pos = dst->src[1];
    int n_dims = dst->op_params[P_RP_NDIMS];
    float sign = dst->op_params[P_RP_INVERSE] ? -1.0f : 1.0f;
    double mscale = toy_param_f32(dst, P_RP_ATTN); /* 1 unless YaRN's or a file's attn_factor */
    int64_t D = dst->ne[0], H = dst->ne[1], T = dst->ne[2], Bn = dst->ne[3];
    int half = n_dims / 2;
    float *cs = tmp + D, *sn = cs + half;
    double *inv_freq = (double *)(sn + half + 16);
    bool per_batch = toy_nelements(pos) == T * Bn && Bn > 1;
    int64_t p0, p1;
    toy_split(T * Bn, ith, nth, &p0, &p1);
    /* Without per-batch positions, a thread whose rows span a whole
     * sequence sees T positions again and again (training): its angles are
     * those T, slot t; else one slot per row of its range. */
    int64_t np = p1 - p0;
    bool full = !per_batch && np >= T;
    const int32_t *pd = pos->data;
    bool cached = rope_cached(dst, full ? T : np, pd, per_batch, full, T, p0, inv_freq);
    if (!cached) rope_inv_freq(dst, n_dims, inv_freq);
    for (int64_t pi = p0; pi < p1; pi++) {
        int64_t t = pi % T, b = pi / T, sl = full ? t : pi - p0;
        const float *c_ = cs, *s_ = sn;
        if (cached) c_ = rope_cache.cs + sl * half, s_ = rope_cache.sn + sl * half;
        else rope_angles(pd[per_batch ? pi : pi % T], inv_freq, half, mscale, sign, cs, sn);
        for (int64_t h = 0; h < H; h++)
            rope_row(dst, toy_cpu_row_f32(x, TOY_ROW(x, h, t, b), tmp), out_row(dst, (b * T + t) * H + h), c_, s_);
    }
}

void toy_cpu_rope_decode_row(const struct toy_tensor *dst, int64_t h, float *y, float *tmp) {
    const struct toy_tensor *x = dst->src[0];
    rope_cached(dst, 1, dst->src[1]->data, false, false, 1, 0, (double *)(tmp + dst->ne[0] + 16));
    rope_row(dst, toy_cpu_row_f32(x, TOY_ROW(x, h, 0, 0), tmp), y, rope_cache.cs, rope_cache.sn);
}

/* ---- cross-entropy ------------------------------------------------------------------------------ */

static void k_cross_entropy(struct toy_tensor *dst, int ith, int nth, float *tmp, void *work) {
    const struct toy_tensor *lg = dst->src[0], *tg = dst->src[1];
    int32_t ignore = dst->op_params[P_CE_IGNORE];
    int64_t n = lg->ne[0], nr = toy_nrows(lg), r0, r1;
    toy_split(nr, ith, nth, &r0, &r1);
    float *lse = (float *)((char *)dst->data + toy_nbytes(dst)); /* aux: (N) then count */
    double loss = 0;
    int64_t count = 0;
    for (int64_t r = r0; r < r1; r++) {
        int64_t i1, i2, i3;
        toy_unravel(r, lg, &i1, &i2, &i3);
        int32_t target = ((const int32_t *)tg->data)[r];
        const float *x = toy_cpu_row_f32(lg, TOY_ROW(lg, i1, i2, i3), tmp);
        float mx = toy_vec.max(x, n);
        float s = toy_vec.exp_sum(tmp + n, x, mx, n);
        float l = mx + logf(s);
        lse[r] = l;
        if (target == ignore) continue;
        if (target < 0 || target >= n) {
            flag_error(dst);
            continue;
        }
        loss += (double)l - x[target];
        count++;
    }
    double *partial = (double *)work;
    partial[ith * 8] = loss;
    partial[ith * 8 + 1] = (double)count;
    if (toy_last_thread((atomic_int *)&dst->op_params[TOY_MAX_OP_PARAMS - 2], nth)) {
        double tl = 0, tc = 0;
        for (int i = 0; i < nth; i++) {
            tl += partial[i * 8];
            tc += partial[i * 8 + 1];
        }
        lse[nr] = (float)tc;
        *(float *)dst->data = tc > 0 ? (float)(tl / tc) : 0.0f;
    }
}

static void k_cross_entropy_back(struct toy_tensor *dst, int ith, int nth, float *tmp) {
    const struct toy_tensor *dy = dst->src[0], *lg = dst->src[1], *tg = dst->src[2], *ce = dst->src[3];
    int32_t ignore = dst->op_params[P_CE_IGNORE];
    int64_t n = lg->ne[0], nr = toy_nrows(lg), r0, r1;
    const float *lse = (const float *)((const char *)ce->data + toy_nbytes(ce));
    float count = lse[nr];
    float g = *(const float *)dy->data / (count > 0 ? count : 1.0f);
    toy_split(nr, ith, nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        int64_t i1, i2, i3;
        toy_unravel(r, lg, &i1, &i2, &i3);
        int32_t target = ((const int32_t *)tg->data)[r];
        float *y = out_row(dst, r);
        if (target == ignore || target < 0 || target >= n) {
            memset(y, 0, (size_t)n * 4);
            continue;
        }
        const float *x = toy_cpu_row_f32(lg, TOY_ROW(lg, i1, i2, i3), tmp);
        toy_vec.exp_sum(y, x, lse[r], n);
        toy_vec.scale(y, y, g, n);
        y[target] -= g;
    }
}

/* ---- gradient plumbing ------------------------------------------------------------------------------ */

static void k_accum(struct toy_tensor *dst, int ith, int nth, float *tmp) {
    const struct toy_tensor *c = dst->src[0];
    int64_t r0, r1, n = dst->ne[0];
    toy_split(toy_nrows(dst), ith, nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        int64_t i1, i2, i3;
        toy_unravel(r, dst, &i1, &i2, &i3);
        const float *x = toy_cpu_row_f32(c, TOY_ROW(c, i1, i2, i3), tmp);
        float *y = out_row(dst, r);
        toy_vec.add(y, y, x, n);
    }
}

/* zeros shaped like the viewed tensor, with dy written where the view looks */
/* VIEW_BACK: zeros (or, P_VB_ACCUM, what an earlier VIEW_BACK of the same
 * tensor left there) with dy added where the view looks; where the chain's
 * views tile the tensor (P_VB_STORE), dy stored there. Each thread owns
 * a run of whole cache lines of dst and adds, in the view's order, the
 * elements that land in it: no two threads write one line, and an element
 * the view sees twice (a zero stride) sums in the same order on any number
 * of threads. */
static void k_view_back(struct toy_tensor *dst, int ith, int nth, float *tmp) {
    const struct toy_tensor *dy = dst->src[0], *view = dst->src[1];
    int64_t n = toy_nelements(dst), c0, c1;
    toy_split((n + 15) / 16, ith, nth, &c0, &c1);
    int64_t lo = 64 * c0, hi = 16 * c1 < n ? 64 * c1 : 4 * n; /* this thread's bytes of dst */
    if (lo >= hi) return;
    bool store = dst->op_params[P_VB_STORE];
    if (!dst->op_params[P_VB_ACCUM] && !store) memset((char *)dst->data + lo, 0, (size_t)(hi - lo));
    int64_t off = (int64_t)toy_view_offset(view);
    int64_t ne0 = view->ne[0], nb0 = (int64_t)view->nb[0];
    for (int64_t i3 = 0; i3 < view->ne[3]; i3++)
        for (int64_t i2 = 0; i2 < view->ne[2]; i2++)
            for (int64_t i1 = 0; i1 < view->ne[1]; i1++) {
                int64_t at = off + i1 * (int64_t)view->nb[1] + i2 * (int64_t)view->nb[2] + i3 * (int64_t)view->nb[3];
                int64_t a = 0, b = ne0; /* the row's elements [a, b) in [lo, hi) */
                if (at >= hi) continue;
                if (nb0 == 0) {
                    if (at < lo) continue;
                } else {
                    if (at < lo) a = (lo - at + nb0 - 1) / nb0;
                    if ((hi - at + nb0 - 1) / nb0 < b) b = (hi - at + nb0 - 1) / nb0;
                }
                if (a >= b) continue;
                const float *x = toy_cpu_row_f32(dy, TOY_ROW(dy, i1, i2, i3), tmp);
                char *row = (char *)dst->data + at;
                if (store)
                    for (int64_t i = a; i < b; i++) *(float *)(row + i * nb0) = x[i];
                else if (nb0 == sizeof(float))
                    for (int64_t i = a; i < b; i++) ((float *)row)[i] += x[i];
                else
                    for (int64_t i = a; i < b; i++) *(float *)(row + i * nb0) += x[i];
            }
}

/* ---- KV cache ------------------------------------------------------------------------------------------- */

void toy_cpu_kv_put(const struct toy_tensor *cache, int64_t h, int64_t p, int64_t b, const float *row, int64_t n) {
    if (cache->type == TOY_F16) toy_f32_to_f16_row(row, (toy_f16 *)TOY_ROW(cache, h, p, b), n);
    else memcpy(TOY_ROW(cache, h, p, b), row, (size_t)n * 4);
}

/* toy_kv_store_rows: row r at position pos[r] of sequence seq[r]; every row checked first, so a bad one writes
 * nothing */
static void k_kv_store_rows(struct toy_tensor *dst, int ith, int nth) {
    const struct toy_tensor *cache = dst->src[0], *x = dst->src[1];
    const int32_t *pos = dst->src[2]->data, *seq = dst->src[3]->data;
    for (int64_t t = 0; t < x->ne[2]; t++)
        if (pos[t] < 0 || pos[t] >= cache->ne[2] || seq[t] < 0 || seq[t] >= cache->ne[3]) {
            if (ith == 0) flag_error(dst);
            return;
        }
    int64_t rows = x->ne[1] * x->ne[2], r0, r1;
    toy_split(rows, ith, nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        int64_t h = r % x->ne[1], t = r / x->ne[1];
        toy_cpu_kv_put(cache, h, pos[t], seq[t], (const float *)TOY_ROW(x, h, t, 0), x->ne[0]);
    }
}

static void k_kv_store(struct toy_tensor *dst, int ith, int nth) {
    if (dst->op_params[P_KV_ROWS]) {
        k_kv_store_rows(dst, ith, nth);
        return;
    }
    const struct toy_tensor *cache = dst->src[0], *x = dst->src[1];
    int64_t n_past = *(const int32_t *)dst->src[2]->data, Tn = x->ne[2];
    if (n_past < 0 || n_past + Tn > cache->ne[2]) {
        if (ith == 0) flag_error(dst);
        return;
    }
    int64_t rows = x->ne[1] * Tn * x->ne[3], r0, r1;
    toy_split(rows, ith, nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        int64_t h, t, b;
        toy_unravel(r, x, &h, &t, &b);
        toy_cpu_kv_put(cache, h, n_past + t, b, (const float *)TOY_ROW(x, h, t, b), x->ne[0]);
    }
}

/* ---- dispatch ------------------------------------------------------------------------------------------ */


size_t toy_cpu_work_size(const struct toy_tensor *node, int nth) {
    /* attention's kernels slice the scratch their own way; ATTENTION_BACK's dst is the flat dQ|dK|dV, not a
     * row, and the per-row scratch below sized from it took ~20 bytes a gradient value per thread */
    if (node->op == TOY_OP_ATTENTION || node->op == TOY_OP_ATTENTION_BACK) return toy_cpu_attention_work(node, nth);
    size_t row = 0;
    for (int s = 0; s < TOY_MAX_SRC; s++)
        if (node->src[s] && node->src[s]->ne[0] > (int64_t)row) row = (size_t)node->src[s]->ne[0];
    if ((size_t)node->ne[0] > row) row = (size_t)node->ne[0];
    size_t per = (3 * row + 64) * sizeof(float) + row * sizeof(double) + 256;
    size_t w = TOY_WORK_HEAD + per * (size_t)nth;
    if (node->op == TOY_OP_RMS_NORM_BACK_W || node->op == TOY_OP_LAYER_NORM_BACK_W)
        w += (size_t)nth * (size_t)node->ne[0] * sizeof(double);
    if (node->op == TOY_OP_MOE_MATMUL || node->op == TOY_OP_MOE_MATMUL_BACK || node->op == TOY_OP_MOE_MATMUL_BACK_W) {
        size_t m = node->op == TOY_OP_MOE_MATMUL ? toy_cpu_moe_work(node, nth) : toy_cpu_moe_back_work(node, nth);
        if (m > w) w = m;
    }
    if (node->op == TOY_OP_MATMUL) {
        size_t m = toy_cpu_matmul_work(node, nth);
        if (m > w) w = m;
    }
    return w;
}

void toy_cpu_compute(struct toy_tensor *t, int ith, int nth, void *work, size_t ws) {
    size_t head = TOY_WORK_HEAD;
    if (t->op == TOY_OP_RMS_NORM_BACK_W || t->op == TOY_OP_LAYER_NORM_BACK_W)
        head += (size_t)nth * (size_t)t->ne[0] * sizeof(double);
    float *tmp = toy_work_slice((char *)work + head, ws - head, ith, nth);
    switch (t->op) {
    case TOY_OP_CONT:
    case TOY_OP_CAST: k_cont_cast(t, ith, nth, tmp); break;
    case TOY_OP_ADD:
    case TOY_OP_SUB:
    case TOY_OP_MUL:
    case TOY_OP_DIV: k_binary(t, ith, nth, tmp); break;
    case TOY_OP_SCALE:
    case TOY_OP_SQR:
    case TOY_OP_SQRT:
    case TOY_OP_NEG:
    case TOY_OP_TANH:
    case TOY_OP_SILU:
    case TOY_OP_GELU: k_unary(t, ith, nth, tmp); break;
    case TOY_OP_SILU_BACK:
    case TOY_OP_GELU_BACK: k_act_back(t, ith, nth, tmp); break;
    case TOY_OP_SWIGLU: k_swiglu(t, ith, nth, tmp); break;
    case TOY_OP_SWIGLU_BACK: k_swiglu_back(t, ith, nth, tmp); break;
    case TOY_OP_SWIGLU_OAI: k_swiglu_oai(t, ith, nth, tmp); break;
    case TOY_OP_SWIGLU_OAI_BACK: k_swiglu_oai_back(t, ith, nth, tmp); break;
    case TOY_OP_MATMUL: toy_cpu_matmul(t, ith, nth, work, ws); break;
    case TOY_OP_GET_ROWS: k_get_rows(t, ith, nth, tmp); break;
    case TOY_OP_GET_ROWS_BACK: k_get_rows_back(t, ith, nth); break;
    case TOY_OP_SUM:
    case TOY_OP_MEAN: k_sum_dim(t, ith, nth, tmp); break;
    case TOY_OP_SUM_ALL: k_sum_all(t, ith, nth, tmp, work, ws); break;
    case TOY_OP_REPEAT: k_repeat(t, ith, nth, tmp); break;
    case TOY_OP_SUM_TO: k_sum_to(t, ith, nth, tmp); break;
    case TOY_OP_CONCAT: k_concat(t, ith, nth, tmp); break;
    case TOY_OP_RMS_NORM: k_rms_norm(t, ith, nth, tmp); break;
    case TOY_OP_LAYER_NORM: k_layer_norm(t, ith, nth, tmp); break;
    case TOY_OP_RMS_NORM_BACK: k_norm_back(t, ith, nth, tmp, false); break;
    case TOY_OP_LAYER_NORM_BACK: k_norm_back(t, ith, nth, tmp, true); break;
    case TOY_OP_RMS_NORM_BACK_W: k_norm_back_w(t, ith, nth, tmp, work, false); break;
    case TOY_OP_LAYER_NORM_BACK_W: k_norm_back_w(t, ith, nth, tmp, work, true); break;
    case TOY_OP_SOFTMAX: k_softmax(t, ith, nth, tmp); break;
    case TOY_OP_SOFTMAX_BACK: k_softmax_back(t, ith, nth, tmp); break;
    case TOY_OP_ATTENTION: toy_cpu_attention(t, ith, nth, work, ws); break;
    case TOY_OP_ATTENTION_BACK: toy_cpu_attention_back(t, ith, nth, work, ws); break;
    case TOY_OP_ATTN_SINKS_BACK: toy_cpu_attn_sinks_back(t, ith, nth); break;
    case TOY_OP_ROPE: k_rope(t, ith, nth, tmp); break;
    case TOY_OP_CROSS_ENTROPY: k_cross_entropy(t, ith, nth, tmp, work); break;
    case TOY_OP_CROSS_ENTROPY_BACK: k_cross_entropy_back(t, ith, nth, tmp); break;
    case TOY_OP_ACCUM: k_accum(t, ith, nth, tmp); break;
    case TOY_OP_VIEW_BACK: k_view_back(t, ith, nth, tmp); break;
    case TOY_OP_KV_STORE: k_kv_store(t, ith, nth); break;
    case TOY_OP_MOE_ROUTE: toy_cpu_moe_route(t, ith, nth, tmp); break;
    case TOY_OP_MOE_MATMUL: toy_cpu_moe_matmul(t, ith, nth, work, ws); break;
    case TOY_OP_MOE_MATMUL_BACK: toy_cpu_moe_matmul_back(t, ith, nth, work, ws); break;
    case TOY_OP_MOE_MATMUL_BACK_W: toy_cpu_moe_matmul_back_w(t, ith, nth, work, ws); break;
    case TOY_OP_MOE_ROUTE_BACK: toy_cpu_moe_route_back(t, ith, nth, tmp); break;
    default: TOY_ABORT("no CPU kernel for op %s", toy_op_name(t->op));
    }
}
