/* toy/dtype.h: element types, their sizes, and scalar conversions.
 *
 * The numeric values are ggml's `ggml_type` ids (the GGUF tensor-info type
 * field), so a GGUF tensor type maps to a toy dtype without a table. Values
 * reach files: append only.
 *
 * Block types (Q8_0, Q4_0, K-quants) store `block_size` elements in
 * `type_size` bytes; a row of n elements takes n / block_size * type_size
 * bytes (n must be a multiple of block_size). Plain types have block_size 1.
 *
 *     size_t row = toy_row_bytes(TOY_Q8_0, 4096);   // 4096/32*34 = 4352
 */
#ifndef TOY_DTYPE_H
#define TOY_DTYPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

enum toy_dtype {
    TOY_F32 = 0,
    TOY_F16 = 1,
    TOY_Q4_0 = 2,
    TOY_Q4_1 = 3,
    /* 4, 5: removed Q4_2/Q4_3 in ggml; never valid */
    TOY_Q5_0 = 6,
    TOY_Q5_1 = 7,
    TOY_Q8_0 = 8,
    TOY_Q8_1 = 9,
    TOY_Q2_K = 10,
    TOY_Q3_K = 11,
    TOY_Q4_K = 12,
    TOY_Q5_K = 13,
    TOY_Q6_K = 14,
    TOY_Q8_K = 15,
    TOY_IQ2_XXS = 16,
    TOY_IQ2_XS = 17,
    TOY_IQ3_XXS = 18,
    TOY_IQ1_S = 19,
    TOY_IQ4_NL = 20,
    TOY_IQ3_S = 21,
    TOY_IQ2_S = 22,
    TOY_IQ4_XS = 23,
    TOY_I8 = 24,
    TOY_I16 = 25,
    TOY_I32 = 26,
    TOY_I64 = 27,
    TOY_F64 = 28,
    TOY_IQ1_M = 29,
    TOY_BF16 = 30,
    TOY_TQ1_0 = 34,
    TOY_TQ2_0 = 35,
    TOY_MXFP4 = 39, /* gpt-oss's experts: E8M0 scale byte + 16 bytes of E2M1 nibbles */
    TOY_DTYPE_COUNT = 40
};

struct toy_dtype_info {
    const char *name;      /* "f32", "q8_0", ... ; NULL for unknown ids */
    int64_t block_size;    /* elements per block */
    size_t type_size;      /* bytes per block */
    bool quantized;
};

/* Info for a dtype id; returns an entry with name == NULL for ids that are
 * not valid types (so file readers can reject them). */
const struct toy_dtype_info *toy_dtype_info(int dtype);
bool toy_dtype_valid(int dtype);
const char *toy_dtype_name(enum toy_dtype t);
/* Parses "f32", "bf16", "q8_0", ... (case-insensitive); -1 if unknown. */
int toy_dtype_from_name(const char *name);
int64_t toy_dtype_block_size(enum toy_dtype t);
size_t toy_dtype_type_size(enum toy_dtype t);
/* Bytes of a row of `ne0` elements (ne0 must be a multiple of the block). */
size_t toy_row_bytes(enum toy_dtype t, int64_t ne0);

/* ---- scalar conversions (IEEE half, bfloat16) ---------------------------- */

typedef uint16_t toy_f16;
typedef uint16_t toy_bf16;

static inline uint32_t toy_f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float toy_bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* bf16 -> f32 is exact. */
static inline float toy_bf16_to_f32(toy_bf16 h) { return toy_bits_f32((uint32_t)h << 16); }

/* f32 -> bf16 with round-to-nearest-even; NaN stays a quiet NaN
 * (the same rule as ggml and PyTorch). */
static inline toy_bf16 toy_f32_to_bf16(float f) {
    uint32_t u = toy_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (toy_bf16)((u >> 16) | 64);
    return (toy_bf16)((u + (0x7fffu + ((u >> 16) & 1))) >> 16);
}

/* IEEE 754 binary16 conversions, round-to-nearest-even, with subnormals. */
float toy_f16_to_f32(toy_f16 h);
toy_f16 toy_f32_to_f16(float f);

/* Row conversions (n elements). */
void toy_f16_to_f32_row(const toy_f16 *x, float *y, int64_t n);
void toy_f32_to_f16_row(const float *x, toy_f16 *y, int64_t n);
void toy_bf16_to_f32_row(const toy_bf16 *x, float *y, int64_t n);
void toy_f32_to_bf16_row(const float *x, toy_bf16 *y, int64_t n);

#ifdef __cplusplus
}
#endif
#endif
