/* dtype.c: the dtype table (ggml type ids, block sizes and byte sizes as in
 * ggml's type_traits) and IEEE half / bfloat16 conversions.
 * Block layouts: ../shared/testdata/gguf-spec and ggml-common.h. */
#include "toy/dtype.h"
#include "core/internal.h"

#include <ctype.h>
#include <math.h>

#define QK_K 256

static const struct toy_dtype_info infos[TOY_DTYPE_COUNT] = {
    [TOY_F32] = {"f32", 1, 4, false},
    [TOY_F16] = {"f16", 1, 2, false},
    [TOY_Q4_0] = {"q4_0", 32, 18, true},
    [TOY_Q4_1] = {"q4_1", 32, 20, true},
    [TOY_Q5_0] = {"q5_0", 32, 22, true},
    [TOY_Q5_1] = {"q5_1", 32, 24, true},
    [TOY_Q8_0] = {"q8_0", 32, 34, true},
    [TOY_Q8_1] = {"q8_1", 32, 36, true},
    [TOY_Q2_K] = {"q2_k", QK_K, 84, true},
    [TOY_Q3_K] = {"q3_k", QK_K, 110, true},
    [TOY_Q4_K] = {"q4_k", QK_K, 144, true},
    [TOY_Q5_K] = {"q5_k", QK_K, 176, true},
    [TOY_Q6_K] = {"q6_k", QK_K, 210, true},
    [TOY_Q8_K] = {"q8_k", QK_K, 292, true},
    [TOY_IQ2_XXS] = {"iq2_xxs", QK_K, 66, true},
    [TOY_IQ2_XS] = {"iq2_xs", QK_K, 74, true},
    [TOY_IQ3_XXS] = {"iq3_xxs", QK_K, 98, true},
    [TOY_IQ1_S] = {"iq1_s", QK_K, 50, true},
    [TOY_IQ4_NL] = {"iq4_nl", 32, 18, true},
    [TOY_IQ3_S] = {"iq3_s", QK_K, 110, true},
    [TOY_IQ2_S] = {"iq2_s", QK_K, 82, true},
    [TOY_IQ4_XS] = {"iq4_xs", QK_K, 136, true},
    [TOY_I8] = {"i8", 1, 1, false},
    [TOY_I16] = {"i16", 1, 2, false},
    [TOY_I32] = {"i32", 1, 4, false},
    [TOY_I64] = {"i64", 1, 8, false},
    [TOY_F64] = {"f64", 1, 8, false},
    [TOY_IQ1_M] = {"iq1_m", QK_K, 56, true},
    [TOY_BF16] = {"bf16", 1, 2, false},
    [TOY_TQ1_0] = {"tq1_0", QK_K, 54, true},
    [TOY_TQ2_0] = {"tq2_0", QK_K, 66, true},
    [TOY_MXFP4] = {"mxfp4", 32, 17, true},
};

static const struct toy_dtype_info invalid = {NULL, 0, 0, false};

const struct toy_dtype_info *toy_dtype_info(int dtype) {
    if (dtype < 0 || dtype >= TOY_DTYPE_COUNT || !infos[dtype].name) return &invalid;
    return &infos[dtype];
}

bool toy_dtype_valid(int dtype) { return toy_dtype_info(dtype)->name != NULL; }

const char *toy_dtype_name(enum toy_dtype t) {
    const char *n = toy_dtype_info(t)->name;
    return n ? n : "invalid";
}

int toy_dtype_from_name(const char *name) {
    for (int i = 0; i < TOY_DTYPE_COUNT; i++) {
        const char *n = infos[i].name;
        if (!n) continue;
        size_t k = 0;
        while (n[k] && name[k] && tolower((unsigned char)name[k]) == n[k]) k++;
        if (!n[k] && !name[k]) return i;
    }
    return -1;
}

int64_t toy_dtype_block_size(enum toy_dtype t) { return toy_dtype_info(t)->block_size; }
size_t toy_dtype_type_size(enum toy_dtype t) { return toy_dtype_info(t)->type_size; }

size_t toy_row_bytes(enum toy_dtype t, int64_t ne0) {
    const struct toy_dtype_info *in = toy_dtype_info(t);
    if (!in->name) return 0;
    return (size_t)(ne0 / in->block_size) * in->type_size;
}

float toy_f16_to_f32(toy_f16 h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ffu;
    uint32_t u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: normalise */
            int e = -1;
            do { e++; man <<= 1; } while (!(man & 0x400u));
            u = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13) | (man ? 0x400000u : 0); /* a NaN comes out quiet, as F16C and IEEE 754 conversions make it */
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    return toy_bits_f32(u);
}

toy_f16 toy_f32_to_f16(float f) {
    uint32_t u = toy_f32_bits(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (toy_f16)(sign | 0x7e00u | ((a >> 13) & 0x3ffu)); /* NaN */
    if (a >= 0x477ff000u) return (toy_f16)(sign | 0x7c00u); /* overflow (incl. rounding) -> inf */
    if (a < 0x38800000u) { /* result is subnormal or zero */
        if (a < 0x33000000u) return (toy_f16)sign; /* < half of smallest subnormal */
        uint32_t e = a >> 23;
        uint32_t m = (a & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - e; /* 14 + (113 - e) - 1 ... value = m * 2^(e-150); units of 2^-24 */
        /* number of 2^-24 units = m >> (126 - e) with rounding */
        uint32_t q = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1))) q++;
        return (toy_f16)(sign | q);
    }
    /* normal: rebias exponent and round mantissa to 10 bits (RNE) */
    uint32_t r = a + 0xfffu + ((a >> 13) & 1);
    r -= (uint32_t)(127 - 15) << 23;
    return (toy_f16)(sign | (r >> 13));
}

/* Rows through F16C where the CPU has it (KV caches in f16 convert every
 * stored and read row): the same bits as the scalar functions above, which
 * round to nearest even and keep a NaN's upper payload bits the same way. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define TOY_F16C 1
__attribute__((target("avx,f16c"))) static int64_t f16_to_f32_f16c(const toy_f16 *x, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))));
    return i;
}
__attribute__((target("avx,f16c"))) static int64_t f32_to_f16_f16c(const float *x, toy_f16 *y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    return i;
}
/* bf16 rows through AVX2 integer arithmetic, the scalar rules above lane by
 * lane (round to nearest even, a NaN kept quiet with its upper payload):
 * bf16 casts run on every weight of every --bf16 training step, where the
 * scalar loop converted 5.7 GB/s. */
__attribute__((target("avx2"))) static int64_t f32_to_bf16_avx2(const float *x, toy_bf16 *y, int64_t n) {
    const __m256i abs = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
    const __m256i half = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1), quiet = _mm256_set1_epi32(64);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i r[2];
        for (int h = 0; h < 2; h++) {
            __m256i u = _mm256_loadu_si256((const __m256i *)(x + i + 8 * h));
            __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs), inf); /* both below 2^31: signed compare */
            __m256i up = _mm256_add_epi32(u, _mm256_add_epi32(half, _mm256_and_si256(_mm256_srli_epi32(u, 16), one)));
            __m256i q = _mm256_or_si256(_mm256_srli_epi32(u, 16), quiet);
            r[h] = _mm256_blendv_epi8(_mm256_srli_epi32(up, 16), q, nan);
        }
        /* 16 values below 2^16 in two vectors of 32-bit lanes -> 16 halves, in order */
        __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(r[0], r[1]), 0xd8);
        _mm256_storeu_si256((__m256i *)(y + i), p);
    }
    return i;
}
__attribute__((target("avx2"))) static int64_t bf16_to_f32_avx2(const toy_bf16 *x, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_si256((__m256i *)(y + i),
                            _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(x + i))), 16));
    return i;
}
static bool has_avx2(void) {
    static int have = -1;
    if (have < 0) {
        __builtin_cpu_init();
        have = __builtin_cpu_supports("avx2");
    }
    return have;
}
#endif

/* CPUID leaf 1, ECX bit 29 (clang has no __builtin_cpu_supports("f16c")) */
bool toy_cpu_has_f16c(void) {
#ifdef TOY_F16C
    static int have = -1; /* CPUID traps to the hypervisor in a VM: ask once */
    if (have < 0) {
        unsigned a = 0, b = 0, c = 0, d = 0;
        __builtin_cpu_init();
        if (__builtin_cpu_supports("avx")) __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(1), "c"(0));
        have = __builtin_cpu_supports("avx") && ((c >> 29) & 1);
    }
    return have;
#else
    return false;
#endif
}

void toy_f16_to_f32_row(const toy_f16 *x, float *y, int64_t n) {
    int64_t i = 0;
#ifdef TOY_F16C
    if (toy_cpu_has_f16c()) i = f16_to_f32_f16c(x, y, n);
#endif
    for (; i < n; i++) y[i] = toy_f16_to_f32(x[i]);
}
void toy_f32_to_f16_row(const float *x, toy_f16 *y, int64_t n) {
    int64_t i = 0;
#ifdef TOY_F16C
    if (toy_cpu_has_f16c()) i = f32_to_f16_f16c(x, y, n);
#endif
    for (; i < n; i++) y[i] = toy_f32_to_f16(x[i]);
}
void toy_bf16_to_f32_row(const toy_bf16 *x, float *y, int64_t n) {
    int64_t i = 0;
#ifdef TOY_F16C
    if (has_avx2()) i = bf16_to_f32_avx2(x, y, n);
#endif
    for (; i < n; i++) y[i] = toy_bf16_to_f32(x[i]);
}
void toy_f32_to_bf16_row(const float *x, toy_bf16 *y, int64_t n) {
    int64_t i = 0;
#ifdef TOY_F16C
    if (has_avx2()) i = f32_to_bf16_avx2(x, y, n);
#endif
    for (; i < n; i++) y[i] = toy_f32_to_bf16(x[i]);
}
