/* toy/quant.h: the ggml quantization formats: dequantize rows to f32 and
 * quantize f32 rows, bit-exact with ggml's reference (de)quantizers.
 * Block layouts: ../shared/testdata/gguf-spec, ggml-common.h.
 *
 *     float row[4096];
 *     toy_dequantize_row(TOY_Q8_0, w_row_bytes, row, 4096);
 */
#ifndef TOY_QUANT_H
#define TOY_QUANT_H

#include <stdbool.h>
#include <stdint.h>

#include "toy/dtype.h"
#include "toy/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* True if rows of this type can be turned into f32. */
bool toy_can_dequantize(enum toy_dtype t);
/* True if f32 rows can be written in this type. */
bool toy_can_quantize(enum toy_dtype t);

/* n elements (a multiple of the type's block size) of type t at src to f32.
 * Also handles F32, F16, BF16. TOY_ERR_UNSUPPORTED for other types. */
enum toy_status toy_dequantize_row(enum toy_dtype t, const void *src, float *dst, int64_t n);
/* The same with the scalar reference kernels only (toy_dequantize_row may
 * use SIMD kernels, which give the same bits): for testing fast kernels. */
enum toy_status toy_dequantize_row_ref(enum toy_dtype t, const void *src, float *dst, int64_t n);
/* n f32 elements to type t at dst (toy_row_bytes(t, n) bytes). */
enum toy_status toy_quantize_row(enum toy_dtype t, const float *src, void *dst, int64_t n);

#ifdef __cplusplus
}
#endif
#endif
