/* cmd-merge.c: `toy merge BASE.gguf ADAPTER.gguf -o MERGED.gguf`: folds a
 * LoRA adapter (llama.cpp's adapter GGUF, as `toy finetune` writes) into a
 * base model; toy_lora_merge_file in toy/finetune.h does the work. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flags.h"
#include "toy/finetune.h"
#include "toy/toy.h"

int toy_cmd_merge(int argc, char **argv) {
    const char *base = NULL, *adapter = NULL, *outp = NULL;
    float scale = 1.0f;
    for (int i = 1; i < argc; i++) {
        if ((!strcmp(argv[i], "-o") || !strcmp(argv[i], "--out")) && i + 1 < argc) outp = argv[++i];
        else if (!strcmp(argv[i], "--lora-scale") && i + 1 < argc) {
            char *end;
            const char *v = argv[++i];
            scale = strtof(v, &end);
            if (end == v || *end || !isfinite(scale)) {
                fprintf(stderr, "toy merge: bad value '%s' for --lora-scale\n", v);
                return 2;
            }
        }
        else if (argv[i][0] == '-') { outp = NULL; base = NULL; break; }
        else if (!base) base = argv[i];
        else if (!adapter) adapter = argv[i];
        else { base = NULL; break; }
    }
    bool help = toy_cli_wants_help(argc, argv);
    if (!base || !adapter || !outp || help) {
        fprintf(help ? stdout : stderr, "usage: toy merge BASE.gguf ADAPTER.gguf -o MERGED.gguf [--lora-scale 1]\n"
                        "Folds a LoRA adapter into the base weights (quantized weights are re-quantized to their type).\n");
        return help ? 0 : 2;
    }
    char resolved[4096];
    if (toy_model_resolve(base, resolved, sizeof resolved)) { fprintf(stderr, "toy merge: %s\n", toy_last_error()); return 1; }
    base = resolved; /* a path, or a name from `toy models` */
    if (toy_lora_merge_file(base, adapter, scale, outp)) { fprintf(stderr, "toy merge: %s\n", toy_last_error()); return 1; }
    fprintf(stderr, "toy merge: %s + %s -> %s\n", base, adapter, outp);
    return 0;
}
