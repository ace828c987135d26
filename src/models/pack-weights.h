/* pack-weights.h: the matrices a model multiplies by at inference, laid
 * out once for this CPU (pack-weights.c), for the Llama family and GPT-2. */
#ifndef TOY_MODELS_PACK_WEIGHTS_H
#define TOY_MODELS_PACK_WEIGHTS_H

#include <stdbool.h>
#include <stddef.h>

#include "toy/gguf.h"
#include "toy/tensor.h"

/* Packs the quantized ones of w[0..n) (toy_tensor_pack: the int8 kernels'
 * layout) and copies the float ones the file maps, all into one
 * toy_stream_alloc block (*block, *bytes: NULL, 0 when nothing needed it),
 * and releases the file's pages of each, so the weights stay resident
 * once. The float copies are skipped under $TOY_MAP_WEIGHTS or when they
 * would take more than half the memory available. */
enum toy_status toy_pack_inference_weights(struct toy_gguf *gguf, struct toy_tensor *const *w, int n, void **block,
                                           size_t *bytes);
/* Whether bf16 products over w[0..n) would pay (toy_*_infer_bf16): some are
 * f32 or f16, and the CPU multiplies bf16 faster than f32 or the default
 * device is a GPU. */
bool toy_inference_bf16_pays(struct toy_tensor *const *w, int n);
/* Frees what it made, as the model is freed: the packed layouts
 * (toy_tensor_unpack) and the block. */
void toy_unpack_inference_weights(struct toy_tensor *const *w, int n, void *block, size_t bytes);

#endif
