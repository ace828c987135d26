/* precision.h: `--bf16` on the commands that run a model (generate, eval,
 * bench): mixed-precision inference, toy_llama_infer_bf16 and
 * toy_gpt2_infer_bf16. */
#ifndef TOY_CLI_PRECISION_H
#define TOY_CLI_PRECISION_H

#include <stdbool.h>

struct toy_gpt2;
struct toy_llama;

/* Turns bf16 products on for the f32 and f16 weights of m, a Llama-family
 * model, or else of g, a GPT-2, or says on stderr, as "toy CMD: note: ...",
 * why that changes nothing: a CPU without faster bf16 products, or a model
 * with no f32 or f16 matrix. Returns whether any product now runs in bf16. */
bool toy_cli_infer_bf16(const char *cmd, struct toy_llama *m, struct toy_gpt2 *g);

#endif
