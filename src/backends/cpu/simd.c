/* simd.c: the vector primitives used by the CPU kernels: plain C reference
 * versions, and run-time selection of the AVX-512 / AVX2 versions
 * (simd-avx512.c, simd-avx2.c) when the CPU has them. $TOY_SIMD=scalar|avx2
 * forces a lower level (tests compare every level against the reference). */
#include <cpuid.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/cpu-impl.h"

static float ref_dot(const float *a, const float *b, int64_t n) {
    float s = 0;
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}
static void ref_axpy(float *y, const float *x, float a, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}
static void ref_scale(float *y, const float *x, float s, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = s * x[i];
}
static float ref_sumsq(const float *x, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += (double)x[i] * x[i];
    return (float)s;
}
static float ref_max(const float *x, int64_t n) {
    float m = -INFINITY;
    for (int64_t i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}
static float ref_exp_sum(float *y, const float *x, float shift, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) {
        y[i] = expf(x[i] - shift);
        s += y[i];
    }
    return (float)s;
}
static void ref_silu_mul(float *y, const float *g, const float *u, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}
static void ref_rms_apply(float *y, const float *x, const float *w, float r, int64_t n) {
    if (w)
        for (int64_t i = 0; i < n; i++) y[i] = x[i] * r * w[i];
    else
        for (int64_t i = 0; i < n; i++) y[i] = x[i] * r;
}
static void ref_add(float *y, const float *a, const float *b, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = a[i] + b[i];
}
static void ref_mul(float *y, const float *a, const float *b, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = a[i] * b[i];
}
static void ref_swiglu_back(float *dg, float *du, const float *dy, const float *g, const float *u, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float s = 1.0f / (1.0f + expf(-g[i]));
        du[i] = dy[i] * g[i] * s;
        dg[i] = dy[i] * u[i] * s * (1.0f + g[i] * (1.0f - s));
    }
}

static void ref_gelu(float *y, const float *x, int64_t n) {
    const float c = 0.7978845608028654f; /* sqrt(2/pi) */
    for (int64_t i = 0; i < n; i++) y[i] = 0.5f * x[i] * (1.0f + tanhf(c * (x[i] + 0.044715f * x[i] * x[i] * x[i])));
}
static void ref_gelu_back(float *dx, const float *dy, const float *x, int64_t n) {
    const float c = 0.7978845608028654f;
    for (int64_t i = 0; i < n; i++) {
        float v = x[i], t = tanhf(c * (v + 0.044715f * v * v * v));
        dx[i] = dy[i] * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * c * (1.0f + 3.0f * 0.044715f * v * v));
    }
}

/* The operation order of torch.optim.AdamW (single-tensor path). */
static void ref_adamw(float *p, const float *g, float *m, float *v, int64_t n, float lr, float b1,
                      float b2, float eps, float wd, float bc1, float bc2sqrt) {
    float decay = 1.0f - lr * wd;
    float step = lr / bc1;
    for (int64_t i = 0; i < n; i++) {
        p[i] *= decay;
        m[i] = m[i] * b1 + g[i] * (1.0f - b1);
        v[i] = v[i] * b2 + (1.0f - b2) * g[i] * g[i];
        float denom = sqrtf(v[i]) / bc2sqrt + eps;
        p[i] += -step * (m[i] / denom);
    }
}

static void ref_acc_scaled_prod(double *acc, const float *a, const float *b, double mu, double s, int64_t n) {
    for (int64_t i = 0; i < n; i++) acc[i] += (double)a[i] * ((double)b[i] - mu) * s;
}

static void ref_softmax_back(float *d, const float *p, float di, float s, int64_t n) {
    for (int64_t i = 0; i < n; i++) d[i] = s * p[i] * (d[i] - di);
}

static void ref_add_d(double *acc, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) acc[i] += x[i];
}
static double ref_sum_d(const float *x, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += x[i];
    return s;
}
static double ref_sqdev_d(const float *x, double mu, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += ((double)x[i] - mu) * ((double)x[i] - mu);
    return s;
}
static void ref_layer_apply(float *y, const float *x, const float *w, const float *b, float mu, float r, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float v = (x[i] - mu) * r;
        if (w) v *= w[i];
        if (b) v += b[i];
        y[i] = v;
    }
}
static void ref_layer_back_sums(double s[2], const float *dy, const float *w, const float *x, double mu, double r,
                                int64_t n) {
    double mg = 0, mgx = 0;
    for (int64_t i = 0; i < n; i++) {
        double g = w ? (double)dy[i] * w[i] : dy[i];
        mg += g;
        mgx += g * (((double)x[i] - mu) * r);
    }
    s[0] = mg;
    s[1] = mgx;
}
static void ref_layer_back_apply(float *y, const float *dy, const float *w, const float *x, double mu, double r,
                                 double mg, double mgx, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        double g = w ? (double)dy[i] * w[i] : dy[i];
        y[i] = (float)(r * (g - mg - ((double)x[i] - mu) * r * mgx));
    }
}

static const struct toy_vec_ops ref_ops = {
    ref_dot, ref_axpy, ref_scale, ref_sumsq, ref_max, ref_exp_sum,
    ref_silu_mul, ref_rms_apply, ref_add, ref_mul, ref_swiglu_back, ref_gelu, ref_gelu_back, ref_adamw,
    ref_acc_scaled_prod, ref_softmax_back, ref_add_d, ref_sum_d, ref_sqdev_d, ref_layer_apply, ref_layer_back_sums,
    ref_layer_back_apply,
};

struct toy_vec_ops toy_vec = {
    ref_dot, ref_axpy, ref_scale, ref_sumsq, ref_max, ref_exp_sum,
    ref_silu_mul, ref_rms_apply, ref_add, ref_mul, ref_swiglu_back, ref_gelu, ref_gelu_back, ref_adamw,
    ref_acc_scaled_prod, ref_softmax_back, ref_add_d, ref_sum_d, ref_sqdev_d, ref_layer_apply, ref_layer_back_sums,
    ref_layer_back_apply,
};

void toy_simd_fill_avx512(struct toy_vec_ops *ops);
void toy_simd_fill_avx2(struct toy_vec_ops *ops);

static const char *level = "scalar";

/* the AVX-512 subsets toy's *-avx512.c files are built for (F, BW, VL, DQ) */
bool toy_cpu_has_avx512(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}

void toy_simd_init(void) {
    const char *force = getenv("TOY_SIMD");
    toy_vec = ref_ops;
    level = "scalar";
    if (force && !strcmp(force, "scalar")) return;
    __builtin_cpu_init();
    bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    bool avx512 = toy_cpu_has_avx512();
    if (avx512 && !(force && !strcmp(force, "avx2"))) {
        toy_simd_fill_avx512(&toy_vec);
        level = "avx512";
    } else if (avx2) {
        toy_simd_fill_avx2(&toy_vec);
        level = "avx2";
    }
}

const char *toy_simd_name(void) { return level; }

/* Decode streams its weights once a token, and how fast depends on the
 * load width more than on the arithmetic: a Zen 4's prefetchers run ahead
 * of 16-byte loads best (its f32 GEMV: 24-28 GB/s a thread, against ~20
 * with 64-byte loads), an Emerald Rapids Xeon's of 64-byte ones (f32 decode
 * 49 against 35 tok/s, Q8_0 216 against 145, BF16 81 against 66 on 2
 * threads). By vendor, so one machine always runs the same kernels (and
 * sums); $TOY_LOADS=narrow or =wide overrides. Wide needs AVX-512, and
 * $TOY_SIMD below avx512 turns it off like the other AVX-512 kernels. */
static bool wide_capable(void) { /* AVX-512, and $TOY_SIMD not below it */
    const char *lvl = getenv("TOY_SIMD");
    return toy_cpu_has_avx512() && !(lvl && strcmp(lvl, "avx512"));
}

bool toy_cpu_wide_loads(void) {
    static int wide = -1;
    if (wide < 0) {
        const char *e = getenv("TOY_LOADS");
        wide = wide_capable() &&
               (e && !strcmp(e, "wide") ? 1 : e && !strcmp(e, "narrow") ? 0 : __builtin_cpu_is("intel"));
    }
    return wide;
}

/* The f32 GEMV's loads: as above, except on AMD's Zen 5 (family 0x1a) and
 * later, whose load path is a full 512 bits wide: there one 64-byte load
 * streams f32 weights faster, while Q8_0 and BF16 keep their narrow ones.
 * SmolLM2-135M decode on a 2-core Zen 5 EPYC, medians of 15 interleaved
 * rounds of 64 tokens: F32 75.2 against 68.6 tok/s and 75.4 against 72.9;
 * Q8_0 207 against 251, BF16 130 against 135 with wide loads. */
bool toy_cpu_wide_loads_f32(void) {
    static int wide = -1;
    if (wide < 0) {
        unsigned eax, ebx, ecx, edx, family = 0;
        if (__get_cpuid(1, &eax, &ebx, &ecx, &edx))
            family = ((eax >> 8) & 0xf) == 0xf ? 0xf + ((eax >> 20) & 0xff) : (eax >> 8) & 0xf;
        const char *e = getenv("TOY_LOADS"); /* set, it decides for every kernel */
        bool zen5 = __builtin_cpu_is("amd") && family >= 0x1a && !(e && (!strcmp(e, "wide") || !strcmp(e, "narrow")));
        wide = toy_cpu_wide_loads() || (zen5 && wide_capable());
    }
    return wide;
}

/* Decode's weight stream also runs faster on some CPUs when each thread
 * asks for the bytes a fixed distance ahead of its loads (one prefetcht0 a
 * cache line): on an Emerald Rapids Xeon, SmolLM2-135M decode on 2 threads
 * with 2 KB ahead against none, means of 3 interleaved runs: F16 62 -> 79
 * tok/s, BF16 68 -> 86, Q8_0 153 -> 211, Q4_0 354 -> 421, Q4_K 126 -> 161
 * (4 pairs; its prefill even), F32 even (its
 * 64-byte loads already keep the stream busy; its 16-byte-load AVX2 GEMV,
 * under TOY_SIMD=avx2, 35 -> 43); 1 KB ahead gained less, and 4 KB cost
 * Q4_0 what it gained. A Zen 4
 * loses ~15% of the bandwidth to the same instructions (its prefetchers
 * already run ahead; see qgemm-avx512.c), so by vendor again: 2048 bytes on
 * Intel, none elsewhere. $TOY_PREFETCH=BYTES (0 to 65536, a multiple of
 * 64; 0 turns it off) overrides; another value is ignored with a warning.
 * Prefetches never fault and change no arithmetic. */
/* A pass over several rows (a speculative pass, batched decode with a few
 * busy slots) does that many times the arithmetic on each byte it streams,
 * and a Zen 4's prefetchers then fall behind: there, 4096 bytes ahead took
 * SmolLM2-135M Q8_0 passes (2 threads, best of 6 interleaved rounds; a
 * one-token pass 2.5-2.8 ms) over 2 tokens from 3.95 to 3.00 ms, 5 tokens
 * from 5.6-5.9 to 3.8-4.3, 8 tokens from 6.7 to 5.5 (1024 bytes gained
 * less, 8192-32768 no more), while one-token passes stay without (2.71
 * against 2.77 ms with it). Intel keeps its 2048 for every row count
 * (not measured there). */
int toy_cpu_prefetch_choice(bool intel, const char *env, int64_t rows, bool *bad) {
    *bad = false;
    if (env && *env) {
        char *end;
        long v = strtol(env, &end, 10);
        if (*env >= '0' && *env <= '9' && !*end && v >= 0 && v <= 65536 && v % 64 == 0) return (int)v;
        *bad = true;
    }
    return intel ? 2048 : rows >= 2 ? 4096 : 0;
}

static int prefetch_for(int64_t rows) {
    const char *e = getenv("TOY_PREFETCH");
    bool bad;
    __builtin_cpu_init();
    int v = toy_cpu_prefetch_choice(__builtin_cpu_is("intel"), e, rows, &bad);
    if (bad && rows < 2) fprintf(stderr, "toy: ignoring TOY_PREFETCH=%s (want bytes: 0 to 65536, a multiple of 64)\n", e);
    return v;
}

int toy_cpu_prefetch_ahead(void) {
    static int ahead = -1;
    if (ahead < 0) ahead = prefetch_for(1);
    return ahead;
}

int toy_cpu_prefetch_ahead_rows(int64_t rows) {
    static int several = -1;
    if (rows < 2) return toy_cpu_prefetch_ahead();
    if (several < 0) several = prefetch_for(2);
    return several;
}

bool toy_cpu_has_avx512bf16(void) {
    __builtin_cpu_init();
    /* gcc 12 has no __builtin_cpu_supports("avx512bf16"): CPUID leaf 7
     * sub-leaf 1, EAX bit 5 */
    unsigned a = 0, b = 0, c = 0, d = 0;
    __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(1));
    return (a >> 5) & 1;
}

bool toy_cpu_amx_bf16(void) {
    static int have = -1;
    if (have < 0) {
        __builtin_cpu_init();
        unsigned a = 0, b = 0, c = 0, d = 0;
        __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(1), "c"(0));
        bool osxsave = (c >> 27) & 1;
        __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(0));
        bool cpu = ((d >> 22) & 1) && ((d >> 24) & 1) && __builtin_cpu_supports("avx512f"); /* AMX-BF16, AMX-TILE */
        bool os = false;
        if (cpu && osxsave) { /* XCR0 bits 17 and 18: the OS saves tile config and data */
            unsigned lo, hi;
            __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
            os = ((lo >> 17) & 3) == 3;
        }
        have = cpu && os && toy_amx_request();
    }
    return have;
}
