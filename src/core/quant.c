/* quant.c: row (de)quantization entry points. F32/F16/BF16 here; the block
 * formats are added by the GGUF work (bit-exact with ggml's reference). */
#include "toy/quant.h"

#include <string.h>

bool toy_can_dequantize(enum toy_dtype t) {
    return t == TOY_F32 || t == TOY_F16 || t == TOY_BF16;
}

bool toy_can_quantize(enum toy_dtype t) {
    return t == TOY_F32 || t == TOY_F16 || t == TOY_BF16;
}

enum toy_status toy_dequantize_row(enum toy_dtype t, const void *src, float *dst, int64_t n) {
    switch (t) {
    case TOY_F32: memcpy(dst, src, (size_t)n * 4); return TOY_OK;
    case TOY_F16: toy_f16_to_f32_row(src, dst, n); return TOY_OK;
    case TOY_BF16: toy_bf16_to_f32_row(src, dst, n); return TOY_OK;
    default: return toy_error(TOY_ERR_UNSUPPORTED, "dequantize: type %s", toy_dtype_name(t));
    }
}

enum toy_status toy_quantize_row(enum toy_dtype t, const float *src, void *dst, int64_t n) {
    switch (t) {
    case TOY_F32: memcpy(dst, src, (size_t)n * 4); return TOY_OK;
    case TOY_F16: toy_f32_to_f16_row(src, dst, n); return TOY_OK;
    case TOY_BF16: toy_f32_to_bf16_row(src, dst, n); return TOY_OK;
    default: return toy_error(TOY_ERR_UNSUPPORTED, "quantize: type %s", toy_dtype_name(t));
    }
}
