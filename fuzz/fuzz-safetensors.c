/* fuzz-safetensors.c: libFuzzer harness for the safetensors reader
 * (src/io/safetensors.c; format in include/toy/safetensors.h). Inputs are
 * parsed from an exact-size heap copy; accepted files are walked and every
 * float tensor converted, which must stay inside the image. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "toy/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint8_t *copy = malloc(size ? size : 1);
    memcpy(copy, data, size);
    struct toy_safetensors *st = NULL;
    if (toy_safetensors_open_memory(copy, size, "fuzz", &st) == TOY_OK) {
        for (int64_t i = 0; i < toy_safetensors_n_tensors(st); i++) {
            const struct toy_st_tensor *t = toy_safetensors_tensor(st, i);
            if (toy_safetensors_find(st, t->name) != i) abort();
            const uint8_t *p = t->data;
            if (t->nbytes && (p < copy || p + t->nbytes > copy + size)) abort();
            if (t->n_elements <= 1 << 16) {
                float *y = malloc((size_t)(t->n_elements ? t->n_elements : 1) * sizeof(float));
                toy_safetensors_read_f32(st, i, y, t->n_elements);
                free(y);
            }
        }
        toy_safetensors_metadata(st, "format");
        toy_safetensors_close(st);
    } else if (st) {
        abort();
    }
    free(copy);
    return 0;
}
