/* kernels-ops.cu: the CUDA kernels of every op except matmul
 * (kernels-matmul.cu) and attention (kernels-attention.cu), the dispatch
 * from a node descriptor to its kernels, and AdamW.
 *
 * The CPU kernels (src/backends/cpu/cpu.c) define the semantics; these
 * follow them op by op: results are contiguous (F32 unless a cast says
 * otherwise), sources may be strided views of F32 / F16 / BF16 (and
 * Q8_0 / Q4_0 / Q4_K tables for get_rows and cast). Row ops (norms, softmax,
 * cross-entropy) run one block per row (norms up to 4096 wide a warp);
 * sums that the CPU does in double are done in double here too. An
 * out-of-range index sets the graph's error word to the node index + 1
 * (reported by cuda-graph.c after the run).
 */
#include "backends/cuda/kernels-common.cuh"

#define TPB 256

/* ---- copies ---------------------------------------------------------------- */

__global__ void k_cont_cast(CT dst, CT a) {
    int64_t n = ct_nel(dst);
    int ts = dst.type == TOY_F32 || dst.type == TOY_I32 ? 4 : 2;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        int64_t i[4];
        unravel4(e, dst.ne, i);
        char *o = dst.data + e * ts;
        if (a.type == dst.type) { /* bit copy (I32 ids stay exact) */
            const char *s = ct_row(a, i[1], i[2], i[3]) + i[0] * a.nb[0];
            if (ts == 4) *(uint32_t *)o = *(const uint32_t *)s;
            else *(uint16_t *)o = *(const uint16_t *)s;
            continue;
        }
        float v = ld(a, i[0], i[1], i[2], i[3]);
        if (dst.type == TOY_F32) *(float *)o = v;
        else if (dst.type == TOY_F16) *(__half *)o = __float2half_rn(v);
        else *(__nv_bfloat16 *)o = __float2bfloat16_rn(v);
    }
}

/* ---- elementwise -------------------------------------------------------------- */

/* how k_binary indexes its sources: any strides; both contiguous and of
 * dst's shape; or a like that and b one contiguous row (a bias), read at
 * e % ne0 */
enum { BIN_ANY, BIN_FLAT, BIN_ROW };

static int binary_mode(const CT &d, const CT &a, const CT &b) {
    if (!ct_flat(a) || !same_shape(a, d)) return BIN_ANY;
    if (ct_flat(b) && same_shape(b, d)) return BIN_FLAT;
    if (ct_flat(b) && b.ne[0] == d.ne[0] && ct_nel(b) == b.ne[0] && d.ne[0] < 0xffffffffLL) return BIN_ROW;
    return BIN_ANY;
}

__global__ void k_binary(CT dst, CT a, CT b, int op, int mode) {
    int64_t n = ct_nel(dst);
    float *y = (float *)dst.data;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        float x, z;
        if (mode == BIN_FLAT) {
            x = ld_flat(a, e);
            z = ld_flat(b, e);
        } else if (mode == BIN_ROW) {
            x = ld_flat(a, e);
            z = ld_flat(b, e < 0xffffffffLL ? (int64_t)((uint32_t)e % (uint32_t)b.ne[0]) : e % b.ne[0]);
        } else {
            int64_t i[4];
            unravel4(e, dst.ne, i);
            x = ld(a, i[0], i[1], i[2], i[3]);
            z = ld_b(b, i[0], i[1], i[2], i[3]);
        }
        y[e] = op == TOY_OP_ADD ? x + z : op == TOY_OP_SUB ? x - z : op == TOY_OP_MUL ? x * z : x / z;
    }
}

__global__ void k_unary(CT dst, CT a, int op, float s, bool flat) {
    int64_t n = ct_nel(dst);
    float *y = (float *)dst.data;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        float x, r;
        if (flat) {
            x = ld_flat(a, e);
        } else {
            int64_t i[4];
            unravel4(e, dst.ne, i);
            x = ld(a, i[0], i[1], i[2], i[3]);
        }
        switch (op) {
        case TOY_OP_SCALE: r = x * s; break;
        case TOY_OP_SQR: r = x * x; break;
        case TOY_OP_SQRT: r = sqrtf(x); break;
        case TOY_OP_NEG: r = -x; break;
        case TOY_OP_TANH: r = tanhf(x); break;
        case TOY_OP_SILU: r = x / (1.0f + expf(-x)); break;
        default: r = gelu_f(x); break;
        }
        y[e] = r;
    }
}

__global__ void k_act_back(CT dst, CT dy, CT x, int op, bool flat) {
    int64_t n = ct_nel(dst);
    float *y = (float *)dst.data;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        float g, v;
        if (flat) {
            g = ld_flat(dy, e);
            v = ld_flat(x, e);
        } else {
            int64_t i[4];
            unravel4(e, dst.ne, i);
            g = ld(dy, i[0], i[1], i[2], i[3]);
            v = ld(x, i[0], i[1], i[2], i[3]);
        }
        if (op == TOY_OP_SILU_BACK) {
            float sg = 1.0f / (1.0f + expf(-v));
            y[e] = g * sg * (1.0f + v * (1.0f - sg));
        } else {
            float t = tanhf(GELU_C * (v + 0.044715f * v * v * v));
            y[e] = g * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * GELU_C * (1.0f + 3.0f * 0.044715f * v * v));
        }
    }
}

/* SwiGLU, y = g sigmoid(g) u, and gpt-oss's clamped form (cpu.c's
 * k_swiglu_oai), g' = min(g, lim), u' = clamp(u, -lim, lim), y = g'
 * sigmoid(alpha g') (u' + one): the plain one is alpha 1, lim 0 (no clamp),
 * one 0 */
__device__ __forceinline__ float swo_gate(float g, float lim) { return lim > 0 && g > lim ? lim : g; }
__device__ __forceinline__ float swo_up(float u, float lim) {
    return lim <= 0 ? u : u > lim ? lim : u < -lim ? -lim : u;
}

__global__ void k_swiglu(CT dst, CT g, CT u, float alpha, float lim, float one, bool flat) {
    int64_t n = ct_nel(dst);
    float *y = (float *)dst.data;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        float gv, uv;
        if (flat) {
            gv = ld_flat(g, e);
            uv = ld_flat(u, e);
        } else {
            int64_t i[4];
            unravel4(e, dst.ne, i);
            gv = ld(g, i[0], i[1], i[2], i[3]);
            uv = ld(u, i[0], i[1], i[2], i[3]);
        }
        float gc = swo_gate(gv, lim), uc = swo_up(uv, lim);
        y[e] = gc / (1.0f + expf(-alpha * gc)) * (uc + one);
    }
}

/* dst = [dg (like gate) | du (like up)], both contiguous; the clamps'
 * masks as PyTorch's: the bounds pass the gradient, a NaN does not */
__global__ void k_swiglu_back(CT dst, CT dy, CT g, CT u, float alpha, float lim, float one, bool flat) {
    int64_t n = ct_nel(g);
    float *dg = (float *)dst.data, *du = dg + n;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        float d, gv, uv;
        if (flat) {
            d = ld_flat(dy, e);
            gv = ld_flat(g, e);
            uv = ld_flat(u, e);
        } else {
            int64_t i[4];
            unravel4(e, g.ne, i);
            d = ld(dy, i[0], i[1], i[2], i[3]);
            gv = ld(g, i[0], i[1], i[2], i[3]);
            uv = ld(u, i[0], i[1], i[2], i[3]);
        }
        float gc = swo_gate(gv, lim), uc = swo_up(uv, lim);
        float s = 1.0f / (1.0f + expf(-alpha * gc));
        bool gpass = lim <= 0 || gv <= lim, upass = lim <= 0 || (uv >= -lim && uv <= lim);
        dg[e] = gpass ? d * (uc + one) * s * (1.0f + alpha * gc * (1.0f - s)) : 0.0f;
        du[e] = upass ? d * gc * s : 0.0f;
    }
}

/* ---- indexing ---------------------------------------------------------------------- */

__device__ __forceinline__ int32_t id_at(const CT &ids, int64_t i1, int64_t i2, int64_t i3) {
    return *(const int32_t *)(ids.data + i1 * ids.nb[0] + i2 * ids.nb[1] + i3 * ids.nb[2]);
}

__global__ void k_get_rows(CT dst, CT tab, CT ids, int32_t *err, int32_t idx) {
    int64_t n = ct_nel(dst);
    float *y = (float *)dst.data;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        int64_t i[4];
        unravel4(e, dst.ne, i);
        int32_t id = id_at(ids, i[1], i[2], i[3]);
        if (id < 0 || id >= tab.ne[1]) {
            *err = idx + 1;
            y[e] = 0.0f;
            continue;
        }
        y[e] = ld(tab, i[0], id, 0, 0);
    }
}

/* dtable[id] += dy[row] (dst zeroed first unless accumulating), the rows
 * of a repeated id added in row order, as the CPU adds them: a thread owns
 * column c of the table rows [v0, v0 + per) and walks every row of dy,
 * adding those whose id is in its range. Each element has one writer, so
 * the gradient has the CPU's bits, every run; float atomics would add a
 * repeated id's rows (every common token's) in whatever order the threads
 * happen to run. Out-of-range ids are in no thread's range. */
__global__ void k_get_rows_back(CT dst, CT dy, CT ids, int64_t per) {
    int64_t n0 = dst.ne[0], e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    int64_t c = e % n0, v0 = e / n0 * per, v1 = v0 + per < dst.ne[1] ? v0 + per : dst.ne[1];
    if (v0 >= dst.ne[1]) return;
    float *y = (float *)dst.data + c;
    for (int64_t i3 = 0; i3 < dy.ne[3]; i3++)
        for (int64_t i2 = 0; i2 < dy.ne[2]; i2++)
            for (int64_t i1 = 0; i1 < dy.ne[1]; i1++) {
                int32_t id = id_at(ids, i1, i2, i3);
                if (id >= v0 && id < v1) y[id * n0] += ld(dy, c, i1, i2, i3);
            }
}

/* ---- reductions, broadcasts ---------------------------------------------------------------- */

/* along dim 0: one block per row */
__global__ void k_sum_rows(CT dst, CT a, double inv) {
    int64_t r = blockIdx.x;
    int64_t i1 = r % a.ne[1], i2 = (r / a.ne[1]) % a.ne[2], i3 = r / (a.ne[1] * a.ne[2]);
    double s = 0;
    for (int64_t i = threadIdx.x; i < a.ne[0]; i += blockDim.x) s += ld(a, i, i1, i2, i3);
    s = block_sum_d(s);
    if (threadIdx.x == 0) ((float *)dst.data)[r] = (float)(s * inv);
}

/* along dim 1..3: a thread per output element */
__global__ void k_sum_dim(CT dst, CT a, int dim, double inv) {
    int64_t n = ct_nel(dst);
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        int64_t i[4];
        unravel4(e, dst.ne, i);
        double s = 0;
        for (int64_t k = 0; k < a.ne[dim]; k++) {
            i[dim] = k;
            s += ld(a, i[0], i[1], i[2], i[3]);
        }
        ((float *)dst.data)[e] = (float)(s * inv);
    }
}

/* one block: deterministic */
__global__ void k_sum_all(CT dst, CT a) {
    int64_t n = ct_nel(a);
    double s = 0;
    for (int64_t e = threadIdx.x; e < n; e += blockDim.x) {
        int64_t i[4];
        unravel4(e, a.ne, i);
        s += ld(a, i[0], i[1], i[2], i[3]);
    }
    s = block_sum_d(s);
    if (threadIdx.x == 0) *(float *)dst.data = (float)s;
}

__global__ void k_repeat(CT dst, CT a) {
    int64_t n = ct_nel(dst);
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        int64_t i[4];
        unravel4(e, dst.ne, i);
        ((float *)dst.data)[e] = ld_b(a, i[0], i[1], i[2], i[3]);
    }
}

/* dst (small) = sum of a over the dims where dst has size 1 */
__global__ void k_sum_to(CT dst, CT a) {
    int64_t n = ct_nel(dst);
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        int64_t o[4];
        unravel4(e, dst.ne, o);
        int64_t ex[4];
        for (int d = 0; d < 4; d++) ex[d] = dst.ne[d] == 1 ? a.ne[d] : 1;
        double s = 0;
        for (int64_t j3 = 0; j3 < ex[3]; j3++)
            for (int64_t j2 = 0; j2 < ex[2]; j2++)
                for (int64_t j1 = 0; j1 < ex[1]; j1++)
                    for (int64_t j0 = 0; j0 < ex[0]; j0++)
                        s += ld(a, ex[0] > 1 ? j0 : o[0], ex[1] > 1 ? j1 : o[1], ex[2] > 1 ? j2 : o[2],
                                ex[3] > 1 ? j3 : o[3]);
        ((float *)dst.data)[e] = (float)s;
    }
}

__global__ void k_concat(CT dst, CT a, CT b, int dim) {
    int64_t n = ct_nel(dst);
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        int64_t i[4];
        unravel4(e, dst.ne, i);
        float v;
        if (i[dim] < a.ne[dim]) {
            v = ld(a, i[0], i[1], i[2], i[3]);
        } else {
            i[dim] -= a.ne[dim];
            v = ld(b, i[0], i[1], i[2], i[3]);
        }
        ((float *)dst.data)[e] = v;
    }
}

/* ---- norms: a warp or a block per row; column sums -------------------------------------------- */

__device__ __forceinline__ void row_index(int64_t r, const CT &t, int64_t *i1, int64_t *i2, int64_t *i3) {
    *i1 = r % t.ne[1];
    *i2 = (r / t.ne[1]) % t.ne[2];
    *i3 = r / (t.ne[1] * t.ne[2]);
}

/* SUM_TO onto one row (a bias's gradient: dst [n, 1, 1, 1] from a [n, ...]),
 * in two passes that fill the GPU: column partial sums over fixed chunks
 * of a's rows, then each column's partials in chunk order. The chunks
 * depend on the shapes alone, so the result has the same bits every run.
 * (k_sum_to's thread per column walks every row alone: 768 threads for
 * GPT-2's biases, a few SMs, milliseconds each.) */
static int64_t colsum_chunks(int64_t n, int64_t rows) {
    int64_t c = cdiv(256 * 1024, n); /* ~256 K threads in pass 1 */
    c = c < 1024 ? c : 1024;
    c = c < cdiv(rows, 8) ? c : cdiv(rows, 8); /* at least ~8 rows a chunk */
    return c > 1 ? c : 1;
}

static bool colsum_shape(const CT &dst, const CT &a) {
    return dst.ne[0] == a.ne[0] && dst.ne[1] == 1 && dst.ne[2] == 1 && dst.ne[3] == 1 && ct_nrows(a) > 1;
}

/* pass 1: part[chunk][c] = sum of term(c, r) over the chunk's rows, four
 * rows' loads in flight, added in a fixed order */
template <class Term> __global__ void k_chunk_partial(double *part, int64_t n, int64_t nr, int64_t per, Term term) {
    int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (c >= n) return;
    int64_t r0 = blockIdx.y * per, r1 = r0 + per < nr ? r0 + per : nr;
    double s[4] = {0, 0, 0, 0};
    for (int64_t r = r0; r < r1; r += 4)
#pragma unroll
        for (int u = 0; u < 4; u++)
            if (r + u < r1) s[u] += term(c, r + u);
    part[blockIdx.y * n + c] = (s[0] + s[1]) + (s[2] + s[3]);
}

struct colsum_term { /* a[c, r] */
    CT a;
    __device__ double operator()(int64_t c, int64_t r) const {
        int64_t i1, i2, i3;
        row_index(r, a, &i1, &i2, &i3);
        return ld(a, c, i1, i2, i3);
    }
};

__global__ void k_colsum_final(CT dst, const double *part, int64_t n, int64_t chunks) {
    int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (c >= n) return;
    double s = 0;
    for (int64_t k = 0; k < chunks; k++) s += part[k * n + c];
    ((float *)dst.data)[c] = (float)s;
}

/* A row kernel's thread group: a block per row (wide rows), or a warp per
 * row (rows up to ROW_WARP_MAX: no barriers, no shared memory, eight rows
 * a block; a model's norms are rows of 576-4096). Both sum in a fixed
 * order. */
static int row_threads(int64_t n);
#define ROW_WARP_MAX 4096
struct row_block {
    int64_t r;
    int t, nt;
    __device__ row_block() : r(blockIdx.x), t(threadIdx.x), nt(blockDim.x) {}
    __device__ float sum(float v) const { return block_sum(v); }
    __device__ double sum_d(double v) const { return block_sum_d(v); }
};

/* a row kernel's launch over nr rows of n elements: a warp per row up to
 * ROW_WARP_MAX (the kernels take `warp` and pick their group with it),
 * else a block */
static unsigned rows_grid(int64_t nr, int64_t n) { return (unsigned)(n <= ROW_WARP_MAX ? cdiv(nr, 8) : nr); }
static int rows_threads(int64_t n) { return n <= ROW_WARP_MAX ? 256 : row_threads(n); }

template <class G> __device__ void rms_norm_row(CT dst, CT x, CT w, bool has_w, float eps) {
    G g;
    int64_t r = g.r, n = x.ne[0], i1, i2, i3;
    if (r >= ct_nrows(x)) return;
    row_index(r, x, &i1, &i2, &i3);
    float ss = 0;
    for (int64_t i = g.t; i < n; i += g.nt) {
        float v = ld(x, i, i1, i2, i3);
        ss += v * v;
    }
    ss = g.sum(ss);
    float rstd = rsqrtf(ss / (float)n + eps);
    float *y = (float *)dst.data + r * n;
    for (int64_t i = g.t; i < n; i += g.nt) {
        float v = ld(x, i, i1, i2, i3) * rstd;
        y[i] = has_w ? v * ld(w, i, 0, 0, 0) : v;
    }
}

__global__ void k_rms_norm(CT dst, CT x, CT w, bool has_w, float eps, bool warp) {
    if (warp) rms_norm_row<row_warp>(dst, x, w, has_w, eps);
    else rms_norm_row<row_block>(dst, x, w, has_w, eps);
}

/* mean and 1/std of a row in double, as the CPU (kernels-common.cuh) */
template <class G>
__device__ void row_stats(const G &g, const CT &x, int64_t i1, int64_t i2, int64_t i3, bool layer, float eps,
                          double *mu, double *rstd) {
    norm_stats(g, [&](int64_t i) { return ld(x, i, i1, i2, i3); }, x.ne[0], layer, eps, mu, rstd);
}

template <class G> __device__ void layer_norm_row(CT dst, CT x, CT w, CT b, bool has_w, bool has_b, float eps) {
    G g;
    int64_t r = g.r, n = x.ne[0], i1, i2, i3;
    if (r >= ct_nrows(x)) return;
    row_index(r, x, &i1, &i2, &i3);
    double mu, rstd;
    row_stats(g, x, i1, i2, i3, true, eps, &mu, &rstd);
    float *y = (float *)dst.data + r * n;
    for (int64_t i = g.t; i < n; i += g.nt)
        y[i] = layer_out(ld(x, i, i1, i2, i3), (float)mu, (float)rstd, has_w, has_w ? ld(w, i, 0, 0, 0) : 0.0f, has_b,
                         has_b ? ld(b, i, 0, 0, 0) : 0.0f);
}

__global__ void k_layer_norm(CT dst, CT x, CT w, CT b, bool has_w, bool has_b, float eps, bool warp) {
    if (warp) layer_norm_row<row_warp>(dst, x, w, b, has_w, has_b, eps);
    else layer_norm_row<row_block>(dst, x, w, b, has_w, has_b, eps);
}

/* dx: xhat = (x - mu) r; g = w dy; dx = r (g - mean(g) [layer] - xhat mean(g xhat)) */
template <class G> __device__ void norm_back_row(CT dst, CT dy, CT x, CT w, bool has_w, bool layer, float eps) {
    G g;
    int64_t r = g.r, n = x.ne[0], i1, i2, i3;
    if (r >= ct_nrows(x)) return;
    row_index(r, x, &i1, &i2, &i3);
    double mu, rstd;
    row_stats(g, x, i1, i2, i3, layer, eps, &mu, &rstd);
    double mg = 0, mgx = 0;
    for (int64_t i = g.t; i < n; i += g.nt) {
        double gi = ld(dy, i, i1, i2, i3) * (has_w ? ld(w, i, 0, 0, 0) : 1.0f);
        mg += gi;
        mgx += gi * (((double)ld(x, i, i1, i2, i3) - mu) * rstd);
    }
    mg = g.sum_d(mg) / (double)n;
    mgx = g.sum_d(mgx) / (double)n;
    float *y = (float *)dst.data + r * n;
    for (int64_t i = g.t; i < n; i += g.nt) {
        double gi = ld(dy, i, i1, i2, i3) * (has_w ? ld(w, i, 0, 0, 0) : 1.0f);
        double xh = ((double)ld(x, i, i1, i2, i3) - mu) * rstd;
        y[i] = (float)(rstd * (gi - (layer ? mg : 0.0) - xh * mgx));
    }
}

__global__ void k_norm_back(CT dst, CT dy, CT x, CT w, bool has_w, bool layer, float eps, bool warp) {
    if (warp) norm_back_row<row_warp>(dst, dy, x, w, has_w, layer, eps);
    else norm_back_row<row_block>(dst, dy, x, w, has_w, layer, eps);
}

/* dw, pass 1: every row's mean and 1/std */
template <class G> __device__ void row_stats_row(float *stats, CT x, bool layer, float eps) {
    G g;
    int64_t r = g.r, i1, i2, i3;
    if (r >= ct_nrows(x)) return;
    row_index(r, x, &i1, &i2, &i3);
    double mu, rstd;
    row_stats(g, x, i1, i2, i3, layer, eps, &mu, &rstd);
    if (g.t == 0) {
        stats[2 * r] = (float)mu;
        stats[2 * r + 1] = (float)rstd;
    }
}

__global__ void k_row_stats(float *stats, CT x, bool layer, float eps, bool warp) {
    if (warp) row_stats_row<row_warp>(stats, x, layer, eps);
    else row_stats_row<row_block>(stats, x, layer, eps);
}

/* dw, pass 2: column sums of dy * xhat over chunks of rows (as the
 * column sums above: colsum_chunks, k_chunk_partial, k_colsum_final) */
struct norm_w_term {
    CT dy, x;
    const float *stats;
    __device__ double operator()(int64_t c, int64_t r) const {
        int64_t i1, i2, i3;
        row_index(r, x, &i1, &i2, &i3);
        return (double)ld(dy, c, i1, i2, i3) * (((double)ld(x, c, i1, i2, i3) - stats[2 * r]) * stats[2 * r + 1]);
    }
};

/* ---- softmax ----------------------------------------------------------------------------------- */

__global__ void k_softmax(CT dst, CT x, CT mask, bool has_mask, float scale) {
    int64_t r = blockIdx.x, n = x.ne[0], i1, i2, i3;
    row_index(r, dst, &i1, &i2, &i3);
    float *y = (float *)dst.data + r * n;
    float mx = -INFINITY;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        float v = ld(x, i, i1, i2, i3) * scale;
        if (has_mask) v += ld_b(mask, i, i1, i2, i3);
        y[i] = v;
        mx = fmaxf(mx, v);
    }
    mx = block_max(mx);
    if (mx == -INFINITY) { /* fully masked row */
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) y[i] = 0.0f;
        return;
    }
    float s = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        float e = expf(y[i] - mx);
        y[i] = e;
        s += e;
    }
    s = block_sum(s);
    float inv = 1.0f / s;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) y[i] *= inv;
}

__global__ void k_softmax_back(CT dst, CT dy, CT y, float scale) {
    int64_t r = blockIdx.x, n = dst.ne[0], i1, i2, i3;
    row_index(r, dst, &i1, &i2, &i3);
    float dot = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) dot += ld(dy, i, i1, i2, i3) * ld(y, i, i1, i2, i3);
    dot = block_sum(dot);
    float *o = (float *)dst.data + r * n;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
        o[i] = scale * ld(y, i, i1, i2, i3) * (ld(dy, i, i1, i2, i3) - dot);
}

/* ---- rope: angles in double as on the CPU ---------------------------------------------------------- */

/* A ROPE node's arguments (the kernels' view of its toy_cu_node). */
struct rope_args {
    CT x, pos, ff;
    bool has_ff, neox, per_batch;
    const double *inv_freq;
    int n_dims;
    float sign;
    double mscale;
};

static rope_args rope_args_of(const struct toy_cu_node *n) {
    rope_args R;
    memset(&R, 0, sizeof R);
    const CT &d = n->dst;
    R.x = n->src[0];
    R.pos = n->src[1];
    R.has_ff = n->has_src[2];
    if (R.has_ff) R.ff = n->src[2];
    R.inv_freq = n->rope_freq;
    R.n_dims = n->op_params[P_RP_NDIMS];
    R.neox = n->op_params[P_RP_MODE] == TOY_ROPE_NEOX;
    R.sign = n->op_params[P_RP_INVERSE] ? -1.0f : 1.0f;
    float attn;
    memcpy(&attn, &n->op_params[P_RP_ATTN], sizeof attn);
    R.mscale = (double)attn; /* 1 unless YaRN's or a file's attn_factor */
    R.per_batch = ct_nel(n->src[1]) == d.ne[2] * d.ne[3] && d.ne[3] > 1;
    return R;
}

/* slots of a ROPE over x: a thread's work item per (slot, position, batch) */
__host__ __device__ static int64_t rope_items(const rope_args &R) {
    return (R.n_dims / 2 + (R.x.ne[0] - R.n_dims)) * R.x.ne[2] * R.x.ne[3];
}

/* Work item e of a ROPE: slot u < n_dims / 2 rotates pair u over every head
 * (dim 1), its angle (in double, as on the CPU) computed once for all the
 * heads; the slots after it copy the dims past n_dims. put(i0, h, t, b, v)
 * stores element (i0, h, t, b) of the result. (A thread per element
 * computed each angle twice per head.) */
template <class Put> __device__ void rope_item(const rope_args &R, int64_t e, const Put &put) {
    const CT &x = R.x;
    const int half = R.n_dims / 2;
    const int64_t slots = half + (x.ne[0] - R.n_dims), T = x.ne[2];
    int64_t u = e % slots, t = e / slots % T, b = e / (slots * T);
    if (u >= half) { /* past the rotated dims */
        int64_t i0 = R.n_dims + (u - half);
        for (int64_t h = 0; h < x.ne[1]; h++) put(i0, h, t, b, ld(x, i0, h, t, b));
        return;
    }
    int k = (int)u;
    int64_t a0 = R.neox ? k : 2 * k, a1 = R.neox ? k + half : 2 * k + 1;
    int64_t pi = R.per_batch ? b * T + t : t;
    double p = (double)*(const int32_t *)(R.pos.data + pi * R.pos.nb[0]);
    double f = R.inv_freq[k];
    if (R.has_ff) f /= (double)ld(R.ff, k, 0, 0, 0);
    double sn, cs;
    sincos(p * f, &sn, &cs);
    float c = (float)(cs * R.mscale), s = (float)(sn * R.mscale * R.sign);
    for (int64_t h = 0; h < x.ne[1]; h++) {
        float va = ld(x, a0, h, t, b), vb = ld(x, a1, h, t, b);
        put(a0, h, t, b, va * c - vb * s);
        put(a1, h, t, b, va * s + vb * c);
    }
}

/* stores into a contiguous f32 result shaped as the ROPE's x */
struct put_rows {
    float *y;
    int64_t ne0, ne1, ne2;
    __device__ void operator()(int64_t i0, int64_t h, int64_t t, int64_t b, float v) const {
        y[((b * ne2 + t) * ne1 + h) * ne0 + i0] = v;
    }
};
__device__ static put_rows put_rows_of(const CT &d) { return put_rows{(float *)d.data, d.ne[0], d.ne[1], d.ne[2]}; }

/* stores into a KV cache at row n_past + t (F16 or F32), as KV_STORE */
struct put_cache {
    CT cache;
    int64_t n_past;
    __device__ void operator()(int64_t i0, int64_t h, int64_t t, int64_t b, float v) const {
        char *p = cache.data + i0 * cache.nb[0] + h * cache.nb[1] + (n_past + t) * cache.nb[2] + b * cache.nb[3];
        if (cache.type == TOY_F16) *(__half *)p = __float2half_rn(v);
        else *(float *)p = v;
    }
    /* element e of x (logical order) into the cache */
    __device__ void store(const CT &x, int64_t e) const {
        int64_t i[4];
        unravel4(e, x.ne, i);
        (*this)(i[0], i[1], i[2], i[3], ld(x, i[0], i[1], i[2], i[3]));
    }
};

__global__ void k_rope(CT dst, rope_args R) {
    const put_rows put = put_rows_of(dst);
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x, n = rope_items(R); e < n;
         e += (int64_t)gridDim.x * blockDim.x)
        rope_item(R, e, put);
}

/* ---- cross-entropy ----------------------------------------------------------------------------------- */

/* per row: lse into aux, (loss, counted) into part */
__global__ void k_ce_rows(CT lg, CT tg, float *lse, float *part, int32_t ignore, int32_t *err, int32_t idx) {
    int64_t r = blockIdx.x, n = lg.ne[0], i1, i2, i3;
    row_index(r, lg, &i1, &i2, &i3);
    float mx = -INFINITY;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) mx = fmaxf(mx, ld(lg, i, i1, i2, i3));
    mx = block_max(mx);
    float s = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += expf(ld(lg, i, i1, i2, i3) - mx);
    s = block_sum(s);
    if (threadIdx.x) return;
    float l = mx + logf(s);
    lse[r] = l;
    int32_t target = ((const int32_t *)tg.data)[r];
    part[2 * r] = 0.0f;
    part[2 * r + 1] = 0.0f;
    if (target == ignore) return;
    if (target < 0 || target >= n) {
        *err = idx + 1;
        return;
    }
    part[2 * r] = l - ld(lg, target, i1, i2, i3);
    part[2 * r + 1] = 1.0f;
}

__global__ void k_ce_final(CT dst, const float *part, float *lse, int64_t nr) {
    double tl = 0, tc = 0;
    for (int64_t r = threadIdx.x; r < nr; r += blockDim.x) {
        tl += part[2 * r];
        tc += part[2 * r + 1];
    }
    tl = block_sum_d(tl);
    tc = block_sum_d(tc);
    if (threadIdx.x) return;
    lse[nr] = (float)tc;
    *(float *)dst.data = tc > 0 ? (float)(tl / tc) : 0.0f;
}

__global__ void k_ce_back(CT dst, CT dy, CT lg, CT tg, const float *lse, int32_t ignore) {
    int64_t r = blockIdx.x, n = lg.ne[0], nr = ct_nrows(lg), i1, i2, i3;
    row_index(r, lg, &i1, &i2, &i3);
    float count = lse[nr];
    float g = *(const float *)dy.data / (count > 0 ? count : 1.0f);
    int32_t target = ((const int32_t *)tg.data)[r];
    float *y = (float *)dst.data + r * n;
    bool skip = target == ignore || target < 0 || target >= n;
    float l = lse[r];
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        float v = skip ? 0.0f : expf(ld(lg, i, i1, i2, i3) - l) * g;
        if (!skip && i == target) v -= g;
        y[i] = v;
    }
}

/* ---- gradient plumbing, KV cache ------------------------------------------------------------------------ */

__global__ void k_accum(CT dst, CT c, bool flat) {
    int64_t n = ct_nel(dst);
    float *y = (float *)dst.data;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        if (flat) {
            y[e] += ld_flat(c, e);
            continue;
        }
        int64_t i[4];
        unravel4(e, dst.ne, i);
        y[e] += ld(c, i[0], i[1], i[2], i[3]);
    }
}

/* zeros (memset before), or an earlier VIEW_BACK's sums (P_VB_ACCUM), with
 * dy added where the view looks; or, where the chain's views tile dst
 * (P_VB_STORE: each element in one view), dy stored there */
__global__ void k_view_back(CT dst, CT dy, CT view, int64_t off, bool store) {
    int64_t n = ct_nel(view);
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        int64_t i[4];
        unravel4(e, view.ne, i);
        float *p = (float *)(dst.data + off + i[0] * view.nb[0] + i[1] * view.nb[1] + i[2] * view.nb[2] +
                             i[3] * view.nb[3]);
        float v = ld(dy, i[0], i[1], i[2], i[3]);
        if (store) *p = v;
        else atomicAdd(p, v);
    }
}

/* n_past is read on the device (the I32 leaf uploaded with each run), so a
 * captured decode graph replays unchanged from step to step */
/* MOE_ROUTE: a thread a row of router logits, as toy_cpu_moe_route: the
 * experts' scores (softmax over the E experts, or each one's sigmoid), the
 * k largest of the scores plus bias (if any; ties to the lower index, a NaN
 * never above another), weighed by their unbiased scores, renormalised when
 * `norm`; ids into dst, weights to w */
__global__ void k_moe_route(CT dst, CT lg, int k, bool norm, bool sigmoid, const float *bias, float *w) {
    int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x, E = lg.ne[0];
    if (r >= dst.ne[1]) return;
    const float *x = (const float *)(lg.data + r * lg.nb[1]);
    int32_t *id = (int32_t *)(dst.data + r * dst.nb[1]);
    float mx = -INFINITY, sum = sigmoid ? 1.0f : 0.0f, picked = 0;
    if (!sigmoid) {
        for (int64_t e = 0; e < E; e++) mx = fmaxf(mx, x[e]);
        for (int64_t e = 0; e < E; e++) sum += expf(x[e] - mx);
    }
    for (int s = 0; s < k; s++) {
        int64_t best = -1;
        float bp = 0, bc = 0;
        for (int64_t e = 0; e < E; e++) {
            bool taken = false;
            for (int q = 0; q < s; q++) taken |= id[q] == e;
            float p = sigmoid ? 1.0f / (1.0f + expf(-x[e])) : expf(x[e] - mx);
            if (!(p >= 0)) p = 0;
            float c = bias ? p / sum + bias[e] : p;
            if (isnan(c)) c = -INFINITY;
            if (!taken && (best < 0 || c > bc)) best = e, bp = p, bc = c;
        }
        id[s] = (int32_t)best;
        w[r * k + s] = bp / sum;
        picked += bp / sum;
    }
    if (norm)
        for (int s = 0; s < k; s++) w[r * k + s] /= picked;
}

/* MOE_MATMUL: a warp an output column j of a token t, over the token's k
 * slots in order: slot s's row of x times row j of its expert's matrix
 * (any weight dtype, element by element), stored per slot or (combine)
 * summed with the route's weights, so each output has one writer */
__global__ void k_moe_matmul(CT dst, CT x, CT w, const int32_t *ids, const float *wts, int k, bool combine) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t n = w.ne[1], K = x.ne[0], cols = (n + 7) / 8;
    const int64_t t = blockIdx.x / cols, j = (blockIdx.x % cols) * 8 + warp;
    if (j >= n) return;
    float acc = 0;
    for (int s = 0; s < k; s++) {
        int64_t e = ids[t * k + s];
        const float *xr = (const float *)(x.data + (x.ne[1] == 1 ? 0 : s) * x.nb[1] + t * x.nb[2]);
        const char *wr = w.data + e * w.nb[2] + j * w.nb[1];
        float dot = 0;
        for (int64_t i = lane; i < K; i += 32) dot += xr[i] * ld_row(w.type, wr, i, w.nb[0]);
        dot = warp_sum(dot);
        if (combine) acc += wts[t * k + s] * dot;
        else if (lane == 0) *(float *)(dst.data + j * 4 + s * dst.nb[1] + t * dst.nb[2]) = dot;
    }
    if (combine && lane == 0) *(float *)(dst.data + j * 4 + t * dst.nb[1]) = acc;
}

/* MOE_MATMUL_BACK (moe.c says what it computes): a thread an input column i
 * of a (token, slot) pair: g_i = sum over the expert's rows j of dy_p[j]
 * W_e[j][i], dy_p the token's row when combined, else the pair's (dy is
 * contiguous), stored unweighted: k_moe_back_dw then takes g . x_p and
 * weighs the row */
__global__ void k_moe_back_dx(CT dst, CT dy, CT w, const int32_t *ids, int64_t k, int64_t P, bool combine) {
    const int64_t K = w.ne[0], n = w.ne[1];
    int64_t el = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (el >= P * K) return;
    int64_t pair = el / K, i = el % K;
    const float *g = (const float *)dy.data + (combine ? pair / k : pair) * n;
    const char *we = w.data + ids[pair] * w.nb[2];
    float acc = 0;
    for (int64_t j = 0; j < n; j++) acc += g[j] * ld_row(w.type, we + j * w.nb[1], i, w.nb[0]);
    ((float *)dst.data)[el] = acc;
}

/* ... then, combined: a warp a pair, the route weight's gradient g . x_p
 * (x contiguous), and the pair's row times its weight */
__global__ void k_moe_back_dw(float *dx, float *dw, CT x, const float *wts, int64_t k, int64_t P, int64_t K) {
    const int64_t pair = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (pair >= P) return;
    const float *xr = (const float *)x.data + (x.ne[1] == 1 ? pair / k : pair) * K;
    float *g = dx + pair * K, dot = 0;
    for (int64_t i = lane; i < K; i += 32) dot += g[i] * xr[i];
    dot = warp_sum(dot);
    if (lane == 0) dw[pair] = dot;
    for (int64_t i = lane; i < K; i += 32) g[i] *= wts[pair];
}

/* MOE_MATMUL_BACK_W: a thread an element (i, j) of expert e's gradient,
 * summed over the (token, slot) pairs that chose e, in pair order (every
 * pair is looked at: plain, not fast) */
__global__ void k_moe_back_w(CT dst, CT dy, CT x, const int32_t *ids, const float *wts, int64_t k, int64_t P,
                             bool combine) {
    const int64_t K = dst.ne[0], n = dst.ne[1];
    int64_t el = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (el >= K * n * dst.ne[2]) return;
    const int64_t i = el % K, j = el / K % n, e = el / (K * n);
    const float *dyf = (const float *)dy.data, *xf = (const float *)x.data;
    float acc = 0;
    for (int64_t pair = 0; pair < P; pair++) {
        if (ids[pair] != e) continue;
        float g = dyf[(combine ? pair / k : pair) * n + j];
        if (combine) g *= wts[pair];
        acc += g * xf[(x.ne[1] == 1 ? pair / k : pair) * K + i];
    }
    ((float *)dst.data)[el] = acc;
}

/* MOE_ROUTE_BACK: a thread a row, as toy_cpu_moe_route_back: the logits'
 * gradient from the route weights' (dw, contiguous {k, N}) through the
 * softmax or sigmoid scores, renormalised or not; the ids are constants */
__global__ void k_moe_route_back(CT dst, const float *dw, const int32_t *ids, const float *wts, CT lg, int64_t k,
                                 bool norm, bool sigmoid) {
    const int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x, E = lg.ne[0];
    if (r >= dst.ne[1]) return;
    const float *x = (const float *)(lg.data + r * lg.nb[1]), *g = dw + r * k, *w = wts + r * k;
    const int32_t *id = ids + r * k;
    float *d = (float *)(dst.data + r * dst.nb[1]), c = 0, S = 0;
    for (int64_t s = 0; s < k; s++) c += g[s] * w[s];
    if (!sigmoid && !norm) {
        float mx = -INFINITY, sum = 0;
        for (int64_t e = 0; e < E; e++) mx = fmaxf(mx, x[e]);
        for (int64_t e = 0; e < E; e++) sum += expf(x[e] - mx);
        for (int64_t e = 0; e < E; e++) d[e] = -c * expf(x[e] - mx) / sum;
        for (int64_t s = 0; s < k; s++) d[id[s]] += g[s] * expf(x[id[s]] - mx) / sum;
        return;
    }
    for (int64_t e = 0; e < E; e++) d[e] = 0;
    if (!sigmoid) {
        for (int64_t s = 0; s < k; s++) d[id[s]] = w[s] * (g[s] - c);
        return;
    }
    for (int64_t s = 0; s < k; s++) S += 1.0f / (1.0f + expf(-x[id[s]]));
    for (int64_t s = 0; s < k; s++) {
        float sg = 1.0f / (1.0f + expf(-x[id[s]]));
        d[id[s]] = (norm ? (g[s] - c) / S : g[s]) * sg * (1.0f - sg);
    }
}

__global__ void k_kv_store(CT cache, CT x, const int32_t *np) {
    int64_t n = ct_nel(x);
    const put_cache put = {cache, *np};
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x)
        put.store(x, e);
}

/* A decode attention's prologue (graph-fuse.c, P_AT_FUSED), one launch for
 * what were four: the query's ROPE into its result, the key's ROPE straight
 * into the key cache, and the value into the value cache, at n_past (read
 * on the device). The same arithmetic as the ROPE and KV_STORE kernels, so
 * the same bits. */
__global__ void k_attn_prologue(rope_args Rq, CT rq, rope_args Rk, CT kcache, CT v, CT vcache, const int32_t *np) {
    const int64_t nq = rope_items(Rq), nk = rope_items(Rk), n = nq + nk + ct_nel(v), n_past = *np;
    const put_rows pq = put_rows_of(rq);
    const put_cache pk = {kcache, n_past}, pv = {vcache, n_past};
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        if (e < nq) {
            rope_item(Rq, e, pq);
        } else if (e < nq + nk) {
            rope_item(Rk, e - nq, pk);
        } else {
            pv.store(v, e - nq - nk);
        }
    }
}

extern "C" int toy_cu_attention_prologue(const struct toy_cu_node *n, char *msg, size_t msg_size) {
    const struct toy_cu_node *rq = n->led[0], *ks = n->led[1], *rk = n->led[2], *vs = n->led[3];
    if (!rq || !ks || !rk || !vs) {
        snprintf(msg, msg_size, "a fused attention without its ROPEs and KV_STOREs");
        return TOY_ERR_STATE;
    }
    rope_args Rq = rope_args_of(rq), Rk = rope_args_of(rk);
    int64_t total = rope_items(Rq) + rope_items(Rk) + ct_nel(vs->src[1]);
    k_attn_prologue<<<grid_for(total, TPB), TPB, 0, CU_STREAM(n)>>>(Rq, rq->dst, Rk, ks->dst, vs->src[1], vs->dst,
                                                                   (const int32_t *)ks->src[2].data);
    return launch_status("attention prologue", msg, msg_size);
}

/* ---- the device-resident optimizer (src/backends/cuda/cuda-optim.c) ---------------------------------------- */

/* torch.optim.AdamW's operation order (single-tensor path), one element as
 * simd.c's reference: toy_cu_adamw_elem (kernels-common.cuh) rounds every
 * product and sum on its own (no FMA contraction), so p, m and v get the
 * CPU's bits. */
__global__ void k_adamw(float *p, const float *g, float *m, float *v, int64_t n, float lr, float b1, float b2,
                        float eps, float wd, float bc1, float bc2sqrt) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        toy_cu_adamw_elem(p + i, g[i], m + i, v + i, lr, b1, b2, eps, wd, bc1, bc2sqrt);
}

extern "C" int toy_cu_adamw(float *p, const float *g, float *m, float *v, int64_t n, float lr, float b1, float b2,
                            float eps, float wd, float bc1, float bc2sqrt, void *stream) {
    if (n <= 0) return 0;
    k_adamw<<<grid_for(n, TPB), TPB, 0, (cudaStream_t)stream>>>(p, g, m, v, n, lr, b1, b2, eps, wd, bc1, bc2sqrt);
    char msg[256];
    int rc = launch_status("adamw", msg, sizeof msg);
    if (rc) toy_error((enum toy_status)rc, "cuda: %s", msg);
    return rc;
}

/* x *= s, as toy_vec.scale: one rounded product per element */
__global__ void k_scale_f32(float *x, int64_t n, float s) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        x[i] = __fmul_rn(s, x[i]);
}

extern "C" int toy_cu_scale_f32(float *x, int64_t n, float s, void *stream) {
    if (n <= 0) return 0;
    k_scale_f32<<<grid_for(n, TPB), TPB, 0, (cudaStream_t)stream>>>(x, n, s);
    char msg[256];
    int rc = launch_status("scale", msg, sizeof msg);
    if (rc) toy_error((enum toy_status)rc, "cuda: %s", msg);
    return rc;
}

/* Sum of squares in double (each square of a float is exact in double, as
 * in simd.c): TOY_CU_SUMSQ_BLOCKS fixed blocks each write one partial, so
 * the order of the additions, and the result, is the same every run. */
__global__ void k_sumsq_f32(const float *x, int64_t n, double *partial) {
    double s = 0;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        s += (double)x[i] * (double)x[i];
    s = block_sum_d(s);
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void k_sum_f64(const double *x, int64_t n, double *out) {
    double s = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += x[i];
    s = block_sum_d(s);
    if (threadIdx.x == 0) *out = s;
}

extern "C" int toy_cu_sumsq_f32(const float *x, int64_t n, double *partial, void *stream) {
    k_sumsq_f32<<<TOY_CU_SUMSQ_BLOCKS, TPB, 0, (cudaStream_t)stream>>>(x, n, partial);
    char msg[256];
    int rc = launch_status("sumsq", msg, sizeof msg);
    if (rc) toy_error((enum toy_status)rc, "cuda: %s", msg);
    return rc;
}

extern "C" int toy_cu_sum_f64(const double *x, int64_t n, double *out, void *stream) {
    k_sum_f64<<<1, 1024, 0, (cudaStream_t)stream>>>(x, n, out);
    char msg[256];
    int rc = launch_status("sum", msg, sizeof msg);
    if (rc) toy_error((enum toy_status)rc, "cuda: %s", msg);
    return rc;
}

/* ---- dispatch ------------------------------------------------------------------------------------------------ */

static bool type_ok(int t) {
    return t == TOY_F32 || t == TOY_F16 || t == TOY_BF16 || t == TOY_I32 || t == TOY_Q8_0 || t == TOY_Q4_0 ||
           t == TOY_Q4_1 || t == TOY_Q5_0 || t == TOY_Q5_1 || t == TOY_Q4_K || t == TOY_Q5_K || t == TOY_Q6_K ||
           t == TOY_Q2_K || t == TOY_Q3_K || t == TOY_IQ4_NL || t == TOY_IQ4_XS || t == TOY_MXFP4;
}

/* threads of a row kernel: at most 256, so a launch never asks for more
 * registers than an SM has, whatever the compiler gives the kernel */
static int row_threads(int64_t n) { return n >= 256 ? 256 : n > 32 ? 128 : 32; }

#define NORM_ROWS(n) ((unsigned)ct_nrows((n)->dst))

extern "C" size_t toy_cu_work_size(const struct toy_cu_node *n, bool lean) {
    switch (n->op) {
    case TOY_OP_MATMUL: return toy_cu_matmul_work(n);
    case TOY_OP_ATTENTION:
    case TOY_OP_ATTENTION_BACK: return toy_cu_attention_work(n, lean);
    case TOY_OP_CROSS_ENTROPY: return (size_t)ct_nrows(n->src[0]) * 2 * sizeof(float);
    case TOY_OP_RMS_NORM_BACK_W:
    case TOY_OP_LAYER_NORM_BACK_W:
        return (size_t)ct_nrows(n->src[1]) * 2 * sizeof(float) + 256 +
               (size_t)colsum_chunks(n->dst.ne[0], ct_nrows(n->src[1])) * (size_t)n->dst.ne[0] * sizeof(double);
    case TOY_OP_SUM_TO:
        return colsum_shape(n->dst, n->src[0]) ? (size_t)colsum_chunks(n->dst.ne[0], ct_nrows(n->src[0])) *
                                                      (size_t)n->dst.ne[0] * sizeof(double)
                                                : 0;
    default: return 0;
    }
}

extern "C" int toy_cu_run(const struct toy_cu_node *n, char *msg, size_t msg_size) {
    cudaStream_t s = CU_STREAM(n);
    const CT &d = n->dst;
    const CT *src = n->src;
    CT none = {};
    for (int i = 0; i < 6; i++)
        if (n->has_src[i] && !type_ok(src[i].type)) {
            snprintf(msg, msg_size, "source %d has a dtype the CUDA backend does not read yet (type %d)", i,
                     (int)src[i].type);
            return TOY_ERR_UNSUPPORTED;
        }
    int64_t nel = ct_nel(d);
    unsigned gs = grid_for(nel, TPB);
    float fp0;
    memcpy(&fp0, &n->op_params[0], sizeof fp0);
    switch (n->op) {
    case TOY_OP_CONT:
    case TOY_OP_CAST: k_cont_cast<<<gs, TPB, 0, s>>>(d, src[0]); break;
    case TOY_OP_ADD:
    case TOY_OP_SUB:
    case TOY_OP_MUL:
    case TOY_OP_DIV:
        k_binary<<<gs, TPB, 0, s>>>(d, src[0], src[1], n->op, binary_mode(d, src[0], src[1]));
        break;
    case TOY_OP_SCALE:
    case TOY_OP_SQR:
    case TOY_OP_SQRT:
    case TOY_OP_NEG:
    case TOY_OP_TANH:
    case TOY_OP_SILU:
    case TOY_OP_GELU: k_unary<<<gs, TPB, 0, s>>>(d, src[0], n->op, fp0, ct_flat(src[0])); break;
    case TOY_OP_SILU_BACK:
    case TOY_OP_GELU_BACK: k_act_back<<<gs, TPB, 0, s>>>(d, src[0], src[1], n->op, ct_flat(src[0]) && ct_flat(src[1])); break;
    case TOY_OP_SWIGLU:
    case TOY_OP_SWIGLU_BACK:
    case TOY_OP_SWIGLU_OAI:
    case TOY_OP_SWIGLU_OAI_BACK: { /* the plain one: alpha 1, no clamp, no + 1 */
        bool oai = n->op == TOY_OP_SWIGLU_OAI || n->op == TOY_OP_SWIGLU_OAI_BACK;
        float alpha = 1.0f, lim = 0.0f, one = oai ? 1.0f : 0.0f;
        if (oai) {
            memcpy(&alpha, &n->op_params[P_SWO_ALPHA], sizeof alpha);
            memcpy(&lim, &n->op_params[P_SWO_LIMIT], sizeof lim);
        }
        if (n->op == TOY_OP_SWIGLU || n->op == TOY_OP_SWIGLU_OAI)
            k_swiglu<<<gs, TPB, 0, s>>>(d, src[0], src[1], alpha, lim, one, ct_flat(src[0]) && ct_flat(src[1]));
        else
            k_swiglu_back<<<grid_for(ct_nel(src[1]), TPB), TPB, 0, s>>>(
                d, src[0], src[1], src[2], alpha, lim, one, ct_flat(src[0]) && ct_flat(src[1]) && ct_flat(src[2]));
        break;
    }
    case TOY_OP_MATMUL: return toy_cu_matmul(n, msg, msg_size);
    case TOY_OP_GET_ROWS: k_get_rows<<<gs, TPB, 0, s>>>(d, src[0], src[1], n->err, n->index); break;
    case TOY_OP_GET_ROWS_BACK: {
        if (!n->op_params[P_GRB_ACCUM]) cudaMemsetAsync(d.data, 0, (size_t)nel * 4, s);
        if (!nel) break;
        /* the table rows cut into ranges, enough (column, range) threads to
         * fill a GPU: each thread reads every id, and adds about rows /
         * ranges of dy's elements (GPT-2's 50257 x 768 table: 86 ranges of
         * 585 rows, 66 K threads) */
        int64_t ranges = cdiv(65536, d.ne[0]) < d.ne[1] ? cdiv(65536, d.ne[0]) : d.ne[1];
        int64_t per = cdiv(d.ne[1], ranges);
        k_get_rows_back<<<(unsigned)cdiv(d.ne[0] * cdiv(d.ne[1], per), TPB), TPB, 0, s>>>(d, src[0], src[1], per);
        break;
    }
    case TOY_OP_SUM:
    case TOY_OP_MEAN: {
        int dim = n->op_params[P_DIM];
        double inv = n->op == TOY_OP_MEAN ? 1.0 / (double)src[0].ne[dim] : 1.0;
        if (dim == 0) k_sum_rows<<<(unsigned)ct_nrows(src[0]), row_threads(src[0].ne[0]), 0, s>>>(d, src[0], inv);
        else k_sum_dim<<<gs, TPB, 0, s>>>(d, src[0], dim, inv);
        break;
    }
    case TOY_OP_SUM_ALL: k_sum_all<<<1, 256, 0, s>>>(d, src[0]); break;
    case TOY_OP_REPEAT: k_repeat<<<gs, TPB, 0, s>>>(d, src[0]); break;
    case TOY_OP_SUM_TO:
        if (colsum_shape(d, src[0])) {
            int64_t cols = d.ne[0], nr = ct_nrows(src[0]), ch = colsum_chunks(cols, nr);
            dim3 grid((unsigned)cdiv(cols, 128), (unsigned)ch);
            k_chunk_partial<<<grid, 128, 0, s>>>((double *)n->work, cols, nr, cdiv(nr, ch), colsum_term{src[0]});
            k_colsum_final<<<(unsigned)cdiv(cols, 128), 128, 0, s>>>(d, (const double *)n->work, cols, ch);
        } else {
            k_sum_to<<<gs, TPB, 0, s>>>(d, src[0]);
        }
        break;
    case TOY_OP_CONCAT: k_concat<<<gs, TPB, 0, s>>>(d, src[0], src[1], n->op_params[P_DIM]); break;
    case TOY_OP_RMS_NORM:
        k_rms_norm<<<rows_grid(ct_nrows(d), d.ne[0]), rows_threads(d.ne[0]), 0, s>>>(
            d, src[0], n->has_src[1] ? src[1] : none, n->has_src[1], fp0, d.ne[0] <= ROW_WARP_MAX);
        break;
    case TOY_OP_LAYER_NORM:
        k_layer_norm<<<rows_grid(ct_nrows(d), d.ne[0]), rows_threads(d.ne[0]), 0, s>>>(
            d, src[0], n->has_src[1] ? src[1] : none, n->has_src[2] ? src[2] : none, n->has_src[1], n->has_src[2], fp0,
            d.ne[0] <= ROW_WARP_MAX);
        break;
    case TOY_OP_RMS_NORM_BACK:
    case TOY_OP_LAYER_NORM_BACK:
        k_norm_back<<<rows_grid(ct_nrows(d), d.ne[0]), rows_threads(d.ne[0]), 0, s>>>(
            d, src[0], src[1], n->has_src[2] ? src[2] : none, n->has_src[2], n->op == TOY_OP_LAYER_NORM_BACK, fp0,
            d.ne[0] <= ROW_WARP_MAX);
        break;
    case TOY_OP_RMS_NORM_BACK_W:
    case TOY_OP_LAYER_NORM_BACK_W: {
        const CT &x = src[1];
        int64_t nr = ct_nrows(x), cols = d.ne[0];
        float *stats = (float *)n->work;
        double *part = (double *)(n->work + ((size_t)nr * 2 * sizeof(float) + 255) / 256 * 256);
        k_row_stats<<<rows_grid(nr, x.ne[0]), rows_threads(x.ne[0]), 0, s>>>(
            stats, x, n->op == TOY_OP_LAYER_NORM_BACK_W, fp0, x.ne[0] <= ROW_WARP_MAX);
        int64_t ch = colsum_chunks(cols, nr);
        dim3 grid((unsigned)cdiv(cols, 128), (unsigned)ch);
        k_chunk_partial<<<grid, 128, 0, s>>>(part, cols, nr, cdiv(nr, ch), norm_w_term{src[0], x, stats});
        k_colsum_final<<<(unsigned)cdiv(cols, 128), 128, 0, s>>>(d, part, cols, ch);
        break;
    }
    case TOY_OP_SOFTMAX:
        k_softmax<<<NORM_ROWS(n), row_threads(d.ne[0]), 0, s>>>(d, src[0], n->has_src[1] ? src[1] : none,
                                                                n->has_src[1], fp0);
        break;
    case TOY_OP_SOFTMAX_BACK: k_softmax_back<<<NORM_ROWS(n), row_threads(d.ne[0]), 0, s>>>(d, src[0], src[1], fp0); break;
    case TOY_OP_ATTENTION:
        if (n->op_params[P_AT_ROWS]) { /* toy serve's batched decode runs on the CPU */
            snprintf(msg, msg_size, "attention_rows has no CUDA kernel");
            return TOY_ERR_UNSUPPORTED;
        }
        return toy_cu_attention(n, msg, msg_size);
    case TOY_OP_ATTENTION_BACK: return toy_cu_attention_back(n, msg, msg_size);
    case TOY_OP_ATTN_SINKS_BACK: return toy_cu_attn_sinks_back(n, msg, msg_size);
    case TOY_OP_ROPE: {
        rope_args R = rope_args_of(n);
        k_rope<<<grid_for(rope_items(R), TPB), TPB, 0, s>>>(d, R);
        break;
    }
    case TOY_OP_CROSS_ENTROPY: {
        const CT &lg = src[0];
        int64_t nr = ct_nrows(lg);
        float *lse = (float *)(d.data + n->dst_nbytes), *part = (float *)n->work;
        k_ce_rows<<<(unsigned)nr, row_threads(lg.ne[0]), 0, s>>>(lg, src[1], lse, part, n->op_params[P_CE_IGNORE],
                                                                 n->err, n->index);
        k_ce_final<<<1, 256, 0, s>>>(d, part, lse, nr);
        break;
    }
    case TOY_OP_CROSS_ENTROPY_BACK: {
        const CT &ce = src[3];
        int64_t ce_bytes = ce.nb[3] * ce.ne[3]; /* a 1-element contiguous f32 result: 4 */
        const float *lse = (const float *)(ce.data + ce_bytes);
        k_ce_back<<<(unsigned)ct_nrows(src[1]), row_threads(src[1].ne[0]), 0, s>>>(d, src[0], src[1], src[2], lse,
                                                                                  n->op_params[P_CE_IGNORE]);
        break;
    }
    case TOY_OP_ACCUM: k_accum<<<gs, TPB, 0, s>>>(d, src[0], ct_flat(src[0])); break;
    case TOY_OP_VIEW_BACK:
        if (!n->op_params[P_VB_ACCUM] && !n->op_params[P_VB_STORE]) /* else: an earlier one's sums, or a tiling */
            cudaMemsetAsync(d.data, 0, n->dst_nbytes, s);
        k_view_back<<<grid_for(ct_nel(src[1]), TPB), TPB, 0, s>>>(d, src[0], src[1], n->view_off,
                                                                   n->op_params[P_VB_STORE] != 0);
        break;
    case TOY_OP_KV_STORE:
        if (n->op_params[P_KV_ROWS]) {
            snprintf(msg, msg_size, "kv_store_rows has no CUDA kernel");
            return TOY_ERR_UNSUPPORTED;
        }
        k_kv_store<<<grid_for(ct_nel(src[1]), TPB), TPB, 0, s>>>(d, src[1], (const int32_t *)src[2].data);
        break;
    case TOY_OP_MOE_ROUTE:
        k_moe_route<<<grid_for(d.ne[1], 64), 64, 0, s>>>(d, src[0], n->op_params[0], n->op_params[1] != 0,
                                                        n->op_params[2] != 0,
                                                        n->has_src[1] ? (const float *)src[1].data : nullptr,
                                                        (float *)(d.data + n->dst_nbytes));
        break;
    case TOY_OP_MOE_MATMUL: { /* src[2]: the route, its weights after its ids */
        const CT &r = src[2];
        int64_t blocks = r.ne[1] * ((src[1].ne[1] + 7) / 8);
        if (blocks > 0)
            k_moe_matmul<<<(unsigned)blocks, 256, 0, s>>>(d, src[0], src[1], (const int32_t *)r.data,
                                                         (const float *)(r.data + r.ne[0] * r.ne[1] * 4),
                                                         (int)r.ne[0], n->op_params[0] != 0);
        break;
    }
    case TOY_OP_MOE_MATMUL_BACK: { /* src: dy, the weights, the route, x */
        const CT &r = src[2];
        const int64_t k = r.ne[0], P = k * r.ne[1], K = src[1].ne[0];
        const bool combine = n->op_params[0] != 0;
        const int32_t *ids = (const int32_t *)r.data;
        if (P * K > 0) k_moe_back_dx<<<grid_for(P * K, TPB), TPB, 0, s>>>(d, src[0], src[1], ids, k, P, combine);
        if (combine && P > 0)
            k_moe_back_dw<<<grid_for(P * 32, TPB), TPB, 0, s>>>((float *)d.data, (float *)d.data + P * K, src[3],
                                                                (const float *)(r.data + P * 4), k, P, K);
        break;
    }
    case TOY_OP_MOE_MATMUL_BACK_W: { /* src: dy, x, the route */
        const CT &r = src[2];
        const int64_t k = r.ne[0], P = k * r.ne[1];
        if (nel > 0)
            k_moe_back_w<<<gs, TPB, 0, s>>>(d, src[0], src[1], (const int32_t *)r.data,
                                            (const float *)(r.data + P * 4), k, P, n->op_params[0] != 0);
        break;
    }
    case TOY_OP_MOE_ROUTE_BACK: { /* src: the weights' gradient, the route, the logits; the route's parameters */
        const CT &r = src[1];
        const int64_t k = r.ne[0];
        k_moe_route_back<<<grid_for(d.ne[1], 64), 64, 0, s>>>(d, (const float *)src[0].data, (const int32_t *)r.data,
                                                             (const float *)(r.data + k * r.ne[1] * 4), src[2], k,
                                                             n->op_params[1] != 0, n->op_params[2] != 0);
        break;
    }
    default:
        snprintf(msg, msg_size, "no CUDA kernel for this op");
        return TOY_ERR_UNSUPPORTED;
    }
    return launch_status("kernel launch", msg, msg_size);
}
