/* simd-avx2.c: AVX2+FMA versions of the vector primitives (reference
 * semantics in simd.c), for CPUs without AVX-512. */
#include <immintrin.h>
#include <math.h>

#include "backends/cpu/cpu-impl.h"

static inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline __m256 exp256(__m256 x) {
    /* below -87.3 the result underflows: return exactly 0 (exp(-inf) = 0) */
    __m256 tiny = _mm256_cmp_ps(x, _mm256_set1_ps(-87.3f), _CMP_LT_OQ);
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3762626647949f));
    __m256 fx = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 y = _mm256_set1_ps(1.9875691500E-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507E-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073E-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894E-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459E-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201E-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(tiny, _mm256_mul_ps(y, _mm256_castsi256_ps(e)));
}

static float dot(const float *a, const float *b, int64_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    }
    float s = hsum256(_mm256_add_ps(s0, s1));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

static void axpy(float *y, const float *x, float a, int64_t n) {
    __m256 va = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}

static void scale(float *y, const float *x, float s, int64_t n) {
    __m256 vs = _mm256_set1_ps(s);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(vs, _mm256_loadu_ps(x + i)));
    for (; i < n; i++) y[i] = s * x[i];
}

static float sumsq(const float *x, int64_t n) {
    __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(v));
        __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
        s0 = _mm256_fmadd_pd(lo, lo, s0);
        s1 = _mm256_fmadd_pd(hi, hi, s1);
    }
    __m256d s = _mm256_add_pd(s0, s1);
    double r[4];
    _mm256_storeu_pd(r, s);
    double t = r[0] + r[1] + r[2] + r[3];
    for (; i < n; i++) t += (double)x[i] * x[i];
    return (float)t;
}

static float vmax(const float *x, int64_t n) {
    __m256 m = _mm256_set1_ps(-INFINITY);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(x + i));
    float r[8], best = -INFINITY;
    _mm256_storeu_ps(r, m);
    for (int k = 0; k < 8; k++) best = r[k] > best ? r[k] : best;
    for (; i < n; i++) best = x[i] > best ? x[i] : best;
    return best;
}

static float exp_sum(float *y, const float *x, float shift, int64_t n) {
    __m256 vs = _mm256_set1_ps(shift);
    __m256d acc = _mm256_setzero_pd();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(x + i), vs));
        _mm256_storeu_ps(y + i, e);
        acc = _mm256_add_pd(acc, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
        acc = _mm256_add_pd(acc, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
    }
    double r[4];
    _mm256_storeu_pd(r, acc);
    double s = r[0] + r[1] + r[2] + r[3];
    for (; i < n; i++) {
        y[i] = expf(x[i] - shift);
        s += y[i];
    }
    return (float)s;
}

static void silu_mul(float *y, const float *g, const float *u, int64_t n) {
    const __m256 one = _mm256_set1_ps(1.0f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(g + i);
        __m256 s = _mm256_div_ps(x, _mm256_add_ps(one, exp256(_mm256_sub_ps(_mm256_setzero_ps(), x))));
        _mm256_storeu_ps(y + i, _mm256_mul_ps(s, _mm256_loadu_ps(u + i)));
    }
    for (; i < n; i++) y[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

static void rms_apply(float *y, const float *x, const float *w, float r, int64_t n) {
    __m256 vr = _mm256_set1_ps(r);
    int64_t i = 0;
    if (w) {
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), vr), _mm256_loadu_ps(w + i)));
        for (; i < n; i++) y[i] = x[i] * r * w[i];
    } else {
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), vr));
        for (; i < n; i++) y[i] = x[i] * r;
    }
}

static void add(float *y, const float *a, const float *b, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
    for (; i < n; i++) y[i] = a[i] + b[i];
}

static void mul(float *y, const float *a, const float *b, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
    for (; i < n; i++) y[i] = a[i] * b[i];
}

static void swiglu_back(float *dg, float *du, const float *dy, const float *g, const float *u, int64_t n) {
    const __m256 one = _mm256_set1_ps(1.0f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(g + i), d = _mm256_loadu_ps(dy + i);
        __m256 s = _mm256_div_ps(one, _mm256_add_ps(one, exp256(_mm256_sub_ps(_mm256_set1_ps(0.0f), x))));
        __m256 ds = _mm256_mul_ps(d, s);
        _mm256_storeu_ps(du + i, _mm256_mul_ps(ds, x));
        _mm256_storeu_ps(dg + i, _mm256_mul_ps(_mm256_mul_ps(ds, _mm256_loadu_ps(u + i)), _mm256_add_ps(one, _mm256_mul_ps(x, _mm256_sub_ps(one, s)))));
    }
    for (; i < n; i++) {
        float s = 1.0f / (1.0f + expf(-g[i]));
        du[i] = dy[i] * g[i] * s;
        dg[i] = dy[i] * u[i] * s * (1.0f + g[i] * (1.0f - s));
    }
}

/* tanh(u) = 1 - 2 / (exp(2u) + 1): exact at the ends (exp overflows to inf
 * or underflows to 0), accurate to a few ulp in between */
static inline __m256 tanh_v(__m256 u) {
    const __m256 one = _mm256_set1_ps(1.0f), two = _mm256_set1_ps(2.0f);
    return _mm256_sub_ps(one, _mm256_div_ps(two, _mm256_add_ps(exp256(_mm256_mul_ps(two, u)), one)));
}

static void gelu(float *y, const float *x, int64_t n) {
    const __m256 c = _mm256_set1_ps(0.7978845608028654f), k = _mm256_set1_ps(0.044715f), half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        __m256 u = _mm256_mul_ps(c, _mm256_fmadd_ps(_mm256_mul_ps(k, v), _mm256_mul_ps(v, v), v));
        _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_mul_ps(half, v), _mm256_add_ps(one, tanh_v(u))));
    }
    for (; i < n; i++) y[i] = 0.5f * x[i] * (1.0f + tanhf(0.7978845608028654f * (x[i] + 0.044715f * x[i] * x[i] * x[i])));
}

static void gelu_back(float *dx, const float *dy, const float *x, int64_t n) {
    const __m256 c = _mm256_set1_ps(0.7978845608028654f), k = _mm256_set1_ps(0.044715f), k3 = _mm256_set1_ps(3.0f * 0.044715f);
    const __m256 half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i), v2 = _mm256_mul_ps(v, v);
        __m256 t = tanh_v(_mm256_mul_ps(c, _mm256_fmadd_ps(_mm256_mul_ps(k, v), v2, v)));
        __m256 d = _mm256_add_ps(_mm256_mul_ps(half, _mm256_add_ps(one, t)),
                       _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(half, v), _mm256_sub_ps(one, _mm256_mul_ps(t, t))), _mm256_mul_ps(c, _mm256_fmadd_ps(k3, v2, one))));
        _mm256_storeu_ps(dx + i, _mm256_mul_ps(_mm256_loadu_ps(dy + i), d));
    }
    for (; i < n; i++) {
        float v = x[i], t = tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v));
        dx[i] = dy[i] * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * 0.7978845608028654f * (1.0f + 3.0f * 0.044715f * v * v));
    }
}

static void softmax_back(float *d, const float *p, float di, float s, int64_t n) {
    const __m256 vdi = _mm256_set1_ps(di), vs = _mm256_set1_ps(s);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(d + i, _mm256_mul_ps(_mm256_mul_ps(vs, _mm256_loadu_ps(p + i)), _mm256_sub_ps(_mm256_loadu_ps(d + i), vdi)));
    for (; i < n; i++) d[i] = s * p[i] * (d[i] - di);
}

/* ---- double-precision row work (norm statistics and backward) -------------
 * These keep the AVX-512 versions' lanes and reduction trees (16 partial
 * sums for a row's statistics, 8 for the backward's), so a CPU with AVX2
 * only computes a layer norm to the same bits as one with AVX-512. */

/* the 8 floats at x + i, the lanes at and past `left` read as zeros */
static inline __m256i mask_left(int64_t left) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(left < 8 ? left : 8)), lane);
}
static inline __m256d lo4(__m256 v) { return _mm256_cvtps_pd(_mm256_castps256_ps128(v)); }
static inline __m256d hi4(__m256 v) { return _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)); }

/* the sum of 8 double lanes {a, b}, in the tree of _mm512_reduce_add_pd */
static inline double reduce8(__m256d a, __m256d b) {
    __m256d s = _mm256_add_pd(a, b);
    __m128d t = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd(s, 1));
    return _mm_cvtsd_f64(t) + _mm_cvtsd_f64(_mm_unpackhi_pd(t, t));
}

static void acc_scaled_prod(double *acc, const float *a, const float *b, double mu, double s, int64_t n) {
    const __m256d vm = _mm256_set1_pd(mu), vs = _mm256_set1_pd(s);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        __m256d x = _mm256_cvtps_pd(_mm_loadu_ps(a + i)), y = _mm256_sub_pd(_mm256_cvtps_pd(_mm_loadu_ps(b + i)), vm);
        _mm256_storeu_pd(acc + i, _mm256_add_pd(_mm256_loadu_pd(acc + i), _mm256_mul_pd(_mm256_mul_pd(x, y), vs)));
    }
    for (; i < n; i++) acc[i] += (double)a[i] * ((double)b[i] - mu) * s;
}

static void add_d(double *acc, const float *x, int64_t n) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4)
        _mm256_storeu_pd(acc + i, _mm256_add_pd(_mm256_loadu_pd(acc + i), _mm256_cvtps_pd(_mm_loadu_ps(x + i))));
    for (; i < n; i++) acc[i] += x[i];
}

/* lanes 0-7 in s0, 8-15 in s1, each as two halves, as the AVX-512 version */
static double sum_d(const float *x, int64_t n) {
    __m256d a0 = _mm256_setzero_pd(), a1 = a0, b0 = a0, b1 = a0;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 u = _mm256_loadu_ps(x + i), v = _mm256_loadu_ps(x + i + 8);
        a0 = _mm256_add_pd(a0, lo4(u)), a1 = _mm256_add_pd(a1, hi4(u));
        b0 = _mm256_add_pd(b0, lo4(v)), b1 = _mm256_add_pd(b1, hi4(v));
    }
    double s = reduce8(_mm256_add_pd(a0, b0), _mm256_add_pd(a1, b1));
    for (; i < n; i++) s += x[i];
    return s;
}

static double sqdev_d(const float *x, double mu, int64_t n) {
    const __m256d vm = _mm256_set1_pd(mu);
    __m256d a0 = _mm256_setzero_pd(), a1 = a0, b0 = a0, b1 = a0;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 u = _mm256_loadu_ps(x + i), v = _mm256_loadu_ps(x + i + 8);
        __m256d p = _mm256_sub_pd(lo4(u), vm), q = _mm256_sub_pd(hi4(u), vm);
        __m256d r = _mm256_sub_pd(lo4(v), vm), t = _mm256_sub_pd(hi4(v), vm);
        a0 = _mm256_fmadd_pd(p, p, a0), a1 = _mm256_fmadd_pd(q, q, a1);
        b0 = _mm256_fmadd_pd(r, r, b0), b1 = _mm256_fmadd_pd(t, t, b1);
    }
    double s = reduce8(_mm256_add_pd(a0, b0), _mm256_add_pd(a1, b1));
    for (; i < n; i++) s += ((double)x[i] - mu) * ((double)x[i] - mu);
    return s;
}

/* 8 floats to y + i, the lanes m selects (masked stores are slow on AMD's
 * Zen 2 and 3: the full blocks take plain ones) */
static inline void store8(float *y, int64_t i, __m256i m, bool full, __m256 v) {
    if (full) _mm256_storeu_ps(y + i, v);
    else _mm256_maskstore_ps(y + i, m, v);
}

/* per element the reference's operations in its order: the same bits (the
 * tail through masked loads and stores) */
static void layer_apply(float *y, const float *x, const float *w, const float *b, float mu, float r, int64_t n) {
    const __m256 vm = _mm256_set1_ps(mu), vr = _mm256_set1_ps(r);
    for (int64_t i = 0; i < n; i += 8) {
        __m256i m = mask_left(n - i);
        __m256 v = _mm256_mul_ps(_mm256_sub_ps(_mm256_maskload_ps(x + i, m), vm), vr);
        if (w) v = _mm256_mul_ps(v, _mm256_maskload_ps(w + i, m));
        if (b) v = _mm256_add_ps(v, _mm256_maskload_ps(b + i, m));
        store8(y, i, m, n - i >= 8, v);
    }
}

/* g = dy w and xh = (x - mu) r of the 8 elements at i that m selects (the
 * others read as zeros), in double, as two halves */
static inline void layer_g_xh(const float *dy, const float *w, const float *x, int64_t i, __m256i m, __m256d vm,
                              __m256d vr, __m256d g[2], __m256d xh[2]) {
    __m256 d = _mm256_maskload_ps(dy + i, m), v = _mm256_maskload_ps(x + i, m);
    g[0] = lo4(d), g[1] = hi4(d);
    if (w) {
        __m256 u = _mm256_maskload_ps(w + i, m);
        g[0] = _mm256_mul_pd(g[0], lo4(u)), g[1] = _mm256_mul_pd(g[1], hi4(u));
    }
    xh[0] = _mm256_mul_pd(_mm256_sub_pd(lo4(v), vm), vr);
    xh[1] = _mm256_mul_pd(_mm256_sub_pd(hi4(v), vm), vr);
}

/* the tail's lanes past n hold g = 0, adding nothing to either sum */
static void layer_back_sums(double s[2], const float *dy, const float *w, const float *x, double mu, double r,
                            int64_t n) {
    const __m256d vm = _mm256_set1_pd(mu), vr = _mm256_set1_pd(r);
    __m256d a[2] = {_mm256_setzero_pd(), _mm256_setzero_pd()}, c[2] = {a[0], a[0]};
    for (int64_t i = 0; i < n; i += 8) {
        __m256d g[2], xh[2];
        layer_g_xh(dy, w, x, i, mask_left(n - i), vm, vr, g, xh);
        for (int h = 0; h < 2; h++) a[h] = _mm256_add_pd(a[h], g[h]), c[h] = _mm256_fmadd_pd(g[h], xh[h], c[h]);
    }
    s[0] = reduce8(a[0], a[1]);
    s[1] = reduce8(c[0], c[1]);
}

static void layer_back_apply(float *y, const float *dy, const float *w, const float *x, double mu, double r,
                             double mg, double mgx, int64_t n) {
    const __m256d vm = _mm256_set1_pd(mu), vr = _mm256_set1_pd(r), vg = _mm256_set1_pd(mg), vx = _mm256_set1_pd(mgx);
    for (int64_t i = 0; i < n; i += 8) {
        __m256i m = mask_left(n - i);
        __m256d g[2], xh[2];
        __m128 o[2];
        layer_g_xh(dy, w, x, i, m, vm, vr, g, xh);
        for (int h = 0; h < 2; h++)
            o[h] = _mm256_cvtpd_ps(_mm256_mul_pd(vr, _mm256_sub_pd(_mm256_sub_pd(g[h], vg), _mm256_mul_pd(xh[h], vx))));
        store8(y, i, m, n - i >= 8, _mm256_set_m128(o[1], o[0]));
    }
}

void toy_simd_fill_avx2(struct toy_vec_ops *ops) {
    ops->dot = dot;
    ops->axpy = axpy;
    ops->scale = scale;
    ops->sumsq = sumsq;
    ops->max = vmax;
    ops->exp_sum = exp_sum;
    ops->silu_mul = silu_mul;
    ops->rms_apply = rms_apply;
    ops->add = add;
    ops->mul = mul;
    ops->swiglu_back = swiglu_back;
    ops->gelu = gelu;
    ops->gelu_back = gelu_back;
    ops->softmax_back = softmax_back;
    ops->acc_scaled_prod = acc_scaled_prod;
    ops->add_d = add_d;
    ops->sum_d = sum_d;
    ops->sqdev_d = sqdev_d;
    ops->layer_apply = layer_apply;
    ops->layer_back_sums = layer_back_sums;
    ops->layer_back_apply = layer_back_apply;
    /* adamw: the reference loop vectorises well enough at -O2 */
}
