/* precision.c: `--bf16` for inference (precision.h). */
#include "precision.h"

#include <stdio.h>
#include <string.h>

#include "toy/toy.h"

bool toy_cli_infer_bf16(const char *cmd, struct toy_llama *m, struct toy_gpt2 *g) {
    if (m ? toy_llama_infer_bf16(m) : toy_gpt2_infer_bf16(g)) return true;
    if (!strcmp(toy_device_default(), "cpu") && !toy_cpu_bf16_native())
        fprintf(stderr, "toy %s: note: --bf16: this CPU multiplies bf16 no faster than f32 (bf16 products: %s); "
                "the products stay f32\n", cmd, toy_cpu_bf16_gemm());
    else
        fprintf(stderr, "toy %s: note: --bf16 changes the products of f32 and f16 weights only; this model's are %s, "
                "which keep their own kernels\n", cmd,
                toy_dtype_name(m ? m->layers[0].wo->type : g->layers[0].w_qkv->type));
    return false;
}
