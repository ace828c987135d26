/* simd-avx512.c: AVX-512 versions of the vector primitives (see simd.c for
 * the reference semantics). Compiled with -mavx512f etc.; only called after
 * run-time detection. exp uses a Cody-Waite range reduction and a degree-6
 * polynomial (max rel. error ~2 ulp over the float range). */
#include <immintrin.h>
#include <math.h>

#include "backends/cpu/cpu-impl.h"

/* Below -87.3 the result would be subnormal or zero: it is set to exactly
 * 0 (exp(-inf) = 0), as the AVX2 version does. Computing those lanes (scalef
 * into the subnormal range) cost a microcode assist per instruction on an
 * Emerald Rapids Xeon: 0.15 against 2.7 G exp/s a core, and every causal
 * softmax feeds the masked scores' -inf through here. */
static inline __m512 exp512(__m512 x) {
    const __m512 hi = _mm512_set1_ps(88.3762626647949f), lo = _mm512_set1_ps(-87.3f);
    __mmask16 tiny = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
    x = _mm512_min_ps(_mm512_max_ps(x, lo), hi);
    __m512 fx = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(0.693359375f), x);
    x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(-2.12194440e-4f), x);
    __m512 y = _mm512_set1_ps(1.9875691500E-4f);
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.3981999507E-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(8.3334519073E-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(4.1665795894E-2f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.6666665459E-1f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(5.0000001201E-1f));
    __m512 x2 = _mm512_mul_ps(x, x);
    y = _mm512_fmadd_ps(y, x2, _mm512_add_ps(x, _mm512_set1_ps(1.0f)));
    /* scale by 2^fx; fx >= -126 here, so the result is normal */
    return _mm512_maskz_mov_ps((__mmask16)~tiny, _mm512_scalef_ps(y, fx));
}

static float dot(const float *a, const float *b, int64_t n) {
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
        s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
    }
    for (; i + 16 <= n; i += 16) s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        s1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), s1);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

static void axpy(float *y, const float *x, float a, int64_t n) {
    __m512 va = _mm512_set1_ps(a);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(y + i, m, _mm512_fmadd_ps(va, _mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i)));
    }
}

static void scale(float *y, const float *x, float s, int64_t n) {
    __m512 vs = _mm512_set1_ps(s);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_mul_ps(vs, _mm512_loadu_ps(x + i)));
    for (; i < n; i++) y[i] = s * x[i];
}

static float sumsq(const float *x, int64_t n) {
    /* accumulate in double for long rows */
    __m512d s0 = _mm512_setzero_pd(), s1 = _mm512_setzero_pd();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_loadu_ps(x + i);
        __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
        __m512d hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
        s0 = _mm512_fmadd_pd(lo, lo, s0);
        s1 = _mm512_fmadd_pd(hi, hi, s1);
    }
    double s = _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
    for (; i < n; i++) s += (double)x[i] * x[i];
    return (float)s;
}

static float vmax(const float *x, int64_t n) {
    __m512 m = _mm512_set1_ps(-INFINITY);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) m = _mm512_max_ps(m, _mm512_loadu_ps(x + i));
    float r = _mm512_reduce_max_ps(m);
    for (; i < n; i++) r = x[i] > r ? x[i] : r;
    return r;
}

static float exp_sum(float *y, const float *x, float shift, int64_t n) {
    __m512 vs = _mm512_set1_ps(shift);
    __m512d acc = _mm512_setzero_pd();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 e = exp512(_mm512_sub_ps(_mm512_loadu_ps(x + i), vs));
        _mm512_storeu_ps(y + i, e);
        acc = _mm512_add_pd(acc, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
        acc = _mm512_add_pd(acc, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1))));
    }
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        __m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), vs));
        e = _mm512_maskz_mov_ps(m, e);
        _mm512_mask_storeu_ps(y + i, m, e);
        acc = _mm512_add_pd(acc, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
        acc = _mm512_add_pd(acc, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1))));
    }
    return (float)_mm512_reduce_add_pd(acc);
}

static void silu_mul(float *y, const float *g, const float *u, int64_t n) {
    const __m512 one = _mm512_set1_ps(1.0f);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 x = _mm512_loadu_ps(g + i);
        __m512 s = _mm512_div_ps(x, _mm512_add_ps(one, exp512(_mm512_sub_ps(_mm512_setzero_ps(), x))));
        _mm512_storeu_ps(y + i, _mm512_mul_ps(s, _mm512_loadu_ps(u + i)));
    }
    for (; i < n; i++) y[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

static void rms_apply(float *y, const float *x, const float *w, float r, int64_t n) {
    __m512 vr = _mm512_set1_ps(r);
    int64_t i = 0;
    if (w) {
        for (; i + 16 <= n; i += 16)
            _mm512_storeu_ps(y + i, _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(x + i), vr), _mm512_loadu_ps(w + i)));
        for (; i < n; i++) y[i] = x[i] * r * w[i];
    } else {
        for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_mul_ps(_mm512_loadu_ps(x + i), vr));
        for (; i < n; i++) y[i] = x[i] * r;
    }
}

static void add(float *y, const float *a, const float *b, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_add_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i)));
    for (; i < n; i++) y[i] = a[i] + b[i];
}

static void mul(float *y, const float *a, const float *b, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_mul_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i)));
    for (; i < n; i++) y[i] = a[i] * b[i];
}

static void adamw(float *p, const float *g, float *m, float *v, int64_t n, float lr, float b1, float b2,
                  float eps, float wd, float bc1, float bc2sqrt) {
    float decay = 1.0f - lr * wd, step = lr / bc1;
    __m512 vdecay = _mm512_set1_ps(decay), vb1 = _mm512_set1_ps(b1), vb2 = _mm512_set1_ps(b2);
    __m512 v1b1 = _mm512_set1_ps(1.0f - b1), v1b2 = _mm512_set1_ps(1.0f - b2);
    __m512 vbc2 = _mm512_set1_ps(bc2sqrt), veps = _mm512_set1_ps(eps), vstep = _mm512_set1_ps(-step);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 vg = _mm512_loadu_ps(g + i);
        __m512 vp = _mm512_mul_ps(_mm512_loadu_ps(p + i), vdecay);
        /* same rounding sequence as the reference: m*b1 + g*(1-b1), no fma */
        __m512 vm = _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(m + i), vb1), _mm512_mul_ps(vg, v1b1));
        __m512 vv = _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(v + i), vb2), _mm512_mul_ps(_mm512_mul_ps(v1b2, vg), vg));
        __m512 den = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(vv), vbc2), veps);
        vp = _mm512_add_ps(vp, _mm512_mul_ps(vstep, _mm512_div_ps(vm, den)));
        _mm512_storeu_ps(p + i, vp);
        _mm512_storeu_ps(m + i, vm);
        _mm512_storeu_ps(v + i, vv);
    }
    for (; i < n; i++) {
        p[i] *= decay;
        m[i] = m[i] * b1 + g[i] * (1.0f - b1);
        v[i] = v[i] * b2 + (1.0f - b2) * g[i] * g[i];
        float den = sqrtf(v[i]) / bc2sqrt + eps;
        p[i] += -step * (m[i] / den);
    }
}

static void swiglu_back(float *dg, float *du, const float *dy, const float *g, const float *u, int64_t n) {
    const __m512 one = _mm512_set1_ps(1.0f);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 x = _mm512_loadu_ps(g + i), d = _mm512_loadu_ps(dy + i);
        __m512 s = _mm512_div_ps(one, _mm512_add_ps(one, exp512(_mm512_sub_ps(_mm512_set1_ps(0.0f), x))));
        __m512 ds = _mm512_mul_ps(d, s);
        _mm512_storeu_ps(du + i, _mm512_mul_ps(ds, x));
        _mm512_storeu_ps(dg + i, _mm512_mul_ps(_mm512_mul_ps(ds, _mm512_loadu_ps(u + i)), _mm512_add_ps(one, _mm512_mul_ps(x, _mm512_sub_ps(one, s)))));
    }
    for (; i < n; i++) {
        float s = 1.0f / (1.0f + expf(-g[i]));
        du[i] = dy[i] * g[i] * s;
        dg[i] = dy[i] * u[i] * s * (1.0f + g[i] * (1.0f - s));
    }
}

/* tanh(u) = 1 - 2 / (exp(2u) + 1): exact at the ends (exp overflows to inf
 * or underflows to 0), accurate to a few ulp in between */
static inline __m512 tanh_v(__m512 u) {
    const __m512 one = _mm512_set1_ps(1.0f), two = _mm512_set1_ps(2.0f);
    return _mm512_sub_ps(one, _mm512_div_ps(two, _mm512_add_ps(exp512(_mm512_mul_ps(two, u)), one)));
}

static void gelu(float *y, const float *x, int64_t n) {
    const __m512 c = _mm512_set1_ps(0.7978845608028654f), k = _mm512_set1_ps(0.044715f), half = _mm512_set1_ps(0.5f), one = _mm512_set1_ps(1.0f);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_loadu_ps(x + i);
        __m512 u = _mm512_mul_ps(c, _mm512_fmadd_ps(_mm512_mul_ps(k, v), _mm512_mul_ps(v, v), v));
        _mm512_storeu_ps(y + i, _mm512_mul_ps(_mm512_mul_ps(half, v), _mm512_add_ps(one, tanh_v(u))));
    }
    for (; i < n; i++) y[i] = 0.5f * x[i] * (1.0f + tanhf(0.7978845608028654f * (x[i] + 0.044715f * x[i] * x[i] * x[i])));
}

static void gelu_back(float *dx, const float *dy, const float *x, int64_t n) {
    const __m512 c = _mm512_set1_ps(0.7978845608028654f), k = _mm512_set1_ps(0.044715f), k3 = _mm512_set1_ps(3.0f * 0.044715f);
    const __m512 half = _mm512_set1_ps(0.5f), one = _mm512_set1_ps(1.0f);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_loadu_ps(x + i), v2 = _mm512_mul_ps(v, v);
        __m512 t = tanh_v(_mm512_mul_ps(c, _mm512_fmadd_ps(_mm512_mul_ps(k, v), v2, v)));
        __m512 d = _mm512_add_ps(_mm512_mul_ps(half, _mm512_add_ps(one, t)),
                       _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(half, v), _mm512_sub_ps(one, _mm512_mul_ps(t, t))), _mm512_mul_ps(c, _mm512_fmadd_ps(k3, v2, one))));
        _mm512_storeu_ps(dx + i, _mm512_mul_ps(_mm512_loadu_ps(dy + i), d));
    }
    for (; i < n; i++) {
        float v = x[i], t = tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v));
        dx[i] = dy[i] * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * 0.7978845608028654f * (1.0f + 3.0f * 0.044715f * v * v));
    }
}

/* acc += s a (b - mu) in double, eight lanes at a time; the same operations
 * per element as the reference (products, then the scale), so the sums
 * match it to the last bit */
static void acc_scaled_prod(double *acc, const float *a, const float *b, double mu, double s, int64_t n) {
    __m512d vm = _mm512_set1_pd(mu), vs = _mm512_set1_pd(s);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m512d x = _mm512_cvtps_pd(_mm256_loadu_ps(a + i));
        __m512d y = _mm512_sub_pd(_mm512_cvtps_pd(_mm256_loadu_ps(b + i)), vm);
        _mm512_storeu_pd(acc + i, _mm512_add_pd(_mm512_loadu_pd(acc + i), _mm512_mul_pd(_mm512_mul_pd(x, y), vs)));
    }
    for (; i < n; i++) acc[i] += (double)a[i] * ((double)b[i] - mu) * s;
}

static void softmax_back(float *d, const float *p, float di, float s, int64_t n) {
    const __m512 vdi = _mm512_set1_ps(di), vs = _mm512_set1_ps(s);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(d + i, _mm512_mul_ps(_mm512_mul_ps(vs, _mm512_loadu_ps(p + i)), _mm512_sub_ps(_mm512_loadu_ps(d + i), vdi)));
    for (; i < n; i++) d[i] = s * p[i] * (d[i] - di);
}

/* the low and high 8 of 16 floats, as doubles */
static inline __m512d lo8(__m512 v) { return _mm512_cvtps_pd(_mm512_castps512_ps256(v)); }
static inline __m512d hi8(__m512 v) {
    return _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
}

static void add_d(double *acc, const float *x, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_loadu_ps(x + i);
        _mm512_storeu_pd(acc + i, _mm512_add_pd(_mm512_loadu_pd(acc + i), lo8(v)));
        _mm512_storeu_pd(acc + i + 8, _mm512_add_pd(_mm512_loadu_pd(acc + i + 8), hi8(v)));
    }
    for (; i < n; i++) acc[i] += x[i];
}

/* The layer norm's row sums: 16 lanes of double partial sums where the
 * reference adds in order (one add's latency per element: the forward's
 * two passes over GPT-2's rows were 2.4% of its training time on a Zen 4) */
static double sum_d(const float *x, int64_t n) {
    __m512d s0 = _mm512_setzero_pd(), s1 = _mm512_setzero_pd();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_loadu_ps(x + i);
        s0 = _mm512_add_pd(s0, lo8(v));
        s1 = _mm512_add_pd(s1, hi8(v));
    }
    double s = _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
    for (; i < n; i++) s += x[i];
    return s;
}

static double sqdev_d(const float *x, double mu, int64_t n) {
    __m512d s0 = _mm512_setzero_pd(), s1 = _mm512_setzero_pd(), vm = _mm512_set1_pd(mu);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_loadu_ps(x + i);
        __m512d a = _mm512_sub_pd(lo8(v), vm), b = _mm512_sub_pd(hi8(v), vm);
        s0 = _mm512_fmadd_pd(a, a, s0);
        s1 = _mm512_fmadd_pd(b, b, s1);
    }
    double s = _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
    for (; i < n; i++) s += ((double)x[i] - mu) * ((double)x[i] - mu);
    return s;
}

/* per element the reference's operations in its order: the same bits */
static void layer_apply(float *y, const float *x, const float *w, const float *b, float mu, float r, int64_t n) {
    const __m512 vm = _mm512_set1_ps(mu), vr = _mm512_set1_ps(r);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(x + i), vm), vr);
        if (w) v = _mm512_mul_ps(v, _mm512_loadu_ps(w + i));
        if (b) v = _mm512_add_ps(v, _mm512_loadu_ps(b + i));
        _mm512_storeu_ps(y + i, v);
    }
    for (; i < n; i++) {
        float v = (x[i] - mu) * r;
        if (w) v *= w[i];
        if (b) v += b[i];
        y[i] = v;
    }
}

/* g = dy w and xh = (x - mu) r of the 8 elements at i that m selects (the
 * others read as zeros), in double */
static inline void layer_g_xh(const float *dy, const float *w, const float *x, int64_t i, __mmask8 m, __m512d vm,
                              __m512d vr, __m512d *g, __m512d *xh) {
    *g = _mm512_cvtps_pd(_mm256_maskz_loadu_ps(m, dy + i));
    if (w) *g = _mm512_mul_pd(*g, _mm512_cvtps_pd(_mm256_maskz_loadu_ps(m, w + i)));
    *xh = _mm512_mul_pd(_mm512_sub_pd(_mm512_cvtps_pd(_mm256_maskz_loadu_ps(m, x + i)), vm), vr);
}

static inline __mmask8 mask8(int64_t left) { return left >= 8 ? (__mmask8)0xff : (__mmask8)((1u << left) - 1); }

/* the tail's lanes past n hold g = 0, adding nothing to either sum */
static void layer_back_sums(double s[2], const float *dy, const float *w, const float *x, double mu, double r,
                            int64_t n) {
    const __m512d vm = _mm512_set1_pd(mu), vr = _mm512_set1_pd(r);
    __m512d a = _mm512_setzero_pd(), c = _mm512_setzero_pd();
    for (int64_t i = 0; i < n; i += 8) {
        __m512d g, xh;
        layer_g_xh(dy, w, x, i, mask8(n - i), vm, vr, &g, &xh);
        a = _mm512_add_pd(a, g);
        c = _mm512_fmadd_pd(g, xh, c);
    }
    s[0] = _mm512_reduce_add_pd(a);
    s[1] = _mm512_reduce_add_pd(c);
}

static void layer_back_apply(float *y, const float *dy, const float *w, const float *x, double mu, double r,
                             double mg, double mgx, int64_t n) {
    const __m512d vm = _mm512_set1_pd(mu), vr = _mm512_set1_pd(r), vg = _mm512_set1_pd(mg), vx = _mm512_set1_pd(mgx);
    for (int64_t i = 0; i < n; i += 8) {
        __mmask8 m = mask8(n - i);
        __m512d g, xh;
        layer_g_xh(dy, w, x, i, m, vm, vr, &g, &xh);
        __m512d t = _mm512_sub_pd(_mm512_sub_pd(g, vg), _mm512_mul_pd(xh, vx));
        _mm256_mask_storeu_ps(y + i, m, _mm512_cvtpd_ps(_mm512_mul_pd(vr, t)));
    }
}

void toy_simd_fill_avx512(struct toy_vec_ops *ops) {
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
    ops->adamw = adamw;
    ops->acc_scaled_prod = acc_scaled_prod;
    ops->softmax_back = softmax_back;
    ops->add_d = add_d;
    ops->sum_d = sum_d;
    ops->sqdev_d = sqdev_d;
    ops->layer_apply = layer_apply;
    ops->layer_back_sums = layer_back_sums;
    ops->layer_back_apply = layer_back_apply;
}
