/* qdot.h: quantized dot products for GEMV over Q8_0 / Q4_0 weights (qdot.c). */
#ifndef TOY_QDOT_H
#define TOY_QDOT_H

#include <stdbool.h>
#include <stdint.h>

#include "toy/dtype.h"

struct toy_qdot_ops {
    float (*q8_0)(const void *w, const void *x_q8, int64_t n); /* n: multiple of 32 */
    float (*q4_0)(const void *w, const void *x_q8, int64_t n);
    void (*quantize_q8_0)(const float *x, void *y, int64_t n);
};
extern struct toy_qdot_ops toy_qdot;
void toy_qdot_init(void);

float toy_qdot_q8_0_ref(const void *w, const void *x, int64_t n);
float toy_qdot_q4_0_ref(const void *w, const void *x, int64_t n);
void toy_quantize_q8_0_ref(const float *x, void *y, int64_t n);

#endif
