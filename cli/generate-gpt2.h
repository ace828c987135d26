/* generate-gpt2.h: `toy generate` for GPT-2 GGUFs (cli/generate-gpt2.c);
 * cmd-generate.c dispatches here on general.architecture = "gpt2". */
#ifndef TOY_CLI_GENERATE_GPT2_H
#define TOY_CLI_GENERATE_GPT2_H

#include <stdbool.h>
#include <stdint.h>

#include "toy/generate.h"

/* True when `path` is a GGUF whose general.architecture is "gpt2". */
bool toy_cli_is_gpt2(const char *path);
/* Loads the GPT-2 GGUF (mapped), encodes the prompt with its tokenizer (or
 * takes prompt_ids, "1 2 3"), generates with the KV cache and prints the
 * text (json: the toy/generate-v1 object). Returns the exit code. */
int toy_cli_generate_gpt2(const char *path, const char *prompt, const char *prompt_ids,
                          const struct toy_generate_params *gp, int64_t n_ctx, int threads, bool json);

#endif
