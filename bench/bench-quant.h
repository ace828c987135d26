/* bench-quant.h: a benchmark's f32 weight re-stored in a block type, as a
 * quantized GGUF holds it (rows of toy_quantize_row). */
#ifndef TOY_BENCH_QUANT_H
#define TOY_BENCH_QUANT_H

#include <stdlib.h>

#include "toy/quant.h"
#include "toy/toy.h"

/* t (2-D, f32) now in `type`; returns its new data, which the caller frees */
static inline void *bench_requantize(struct toy_tensor *t, enum toy_dtype type) {
    size_t row = toy_row_bytes(type, t->ne[0]);
    char *q = malloc(row * (size_t)t->ne[1]);
    for (int64_t r = 0; r < t->ne[1]; r++) toy_quantize_row(type, (float *)t->data + r * t->ne[0], q + r * row, t->ne[0]);
    t->type = type;
    t->nb[0] = toy_dtype_type_size(type);
    t->nb[1] = row;
    t->nb[2] = t->nb[3] = row * (size_t)t->ne[1];
    t->data = q;
    return q;
}

#endif
