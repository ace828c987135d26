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
    /* adamw: the reference loop vectorises well enough at -O2 */
}
