/* cmd-models.c: `toy models [--json]`: the GGUF files already on this
 * machine (include/toy/models.h says where it looks and how names are
 * made); any listed name works wherever a command takes -m or a model. */
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flags.h"
#include "json-out.h"
#include "toy/models.h"

static void human(char *buf, size_t n, double v, const char *unit) {
    const char *sfx[] = {"", "K", "M", "G", "T"};
    int k = 0;
    while (v >= 1000 && k < 4) { v /= 1000; k++; }
    snprintf(buf, n, k ? "%.1f%s%s" : "%.0f%s%s", v, sfx[k], unit);
}

int toy_cmd_models(int argc, char **argv) {
    bool json = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) json = true;
        else {
            bool help = toy_cli_wants_help(argc, argv);
            fprintf(help ? stdout : stderr,
                    "usage: toy models [--json]\n"
                    "Lists GGUF models in $TOY_MODEL_DIR, ./models, the Hugging Face cache, Ollama and\n"
                    "LM Studio, with name, architecture, parameters, file type and size. Any listed\n"
                    "name works with -m. Left out: LoRA adapters, toy training states and\n"
                    "vocabulary-only GGUFs (named on stderr with a count), and files that cannot be\n"
                    "read or are not GGUF (each named on stderr, with why). Two files of one name are\n"
                    "listed as SOURCE:NAME (dir:tiny, models:tiny); the bare name is then ambiguous.\n");
            return help ? 0 : 2;
        }
    }
    struct toy_model_entry *m;
    int64_t n;
    if (toy_models_list(&m, &n)) {
        fprintf(stderr, "toy models: %s\n", toy_last_error());
        return 1;
    }
    /* what is not listed, on stderr so that stdout (and --json) stays the list: an unreadable file by
     * name and why (it would otherwise just vanish), the GGUFs that are not models as a count */
    struct toy_model_entry *s;
    int64_t ns;
    if (!toy_models_skipped(&s, &ns)) {
        int64_t other = 0;
        for (int64_t i = 0; i < ns; i++) {
            if (s[i].unreadable) fprintf(stderr, "toy models: cannot read %s: %s\n", s[i].path, s[i].why);
            else other++;
        }
        if (other)
            fprintf(stderr, "toy models: left out %lld GGUF file%s that %s (LoRA adapters, training states, "
                    "vocabulary-only files)\n", (long long)other, other > 1 ? "s" : "",
                    other > 1 ? "are not models" : "is not a model");
        free(s);
    }
    int rc = 0;
    if (json) {
        json_t *arr = json_array();
        for (int64_t i = 0; i < n; i++)
            /* names and paths need not be UTF-8: a NULL from json_pack was appended as nothing, the model dropped */
            json_array_append_new(arr, json_pack("{s:o, s:o, s:s, s:o, s:I, s:s, s:I}", "name",
                                                 toy_cli_json_text(m[i].name, strlen(m[i].name)), "path",
                                                 toy_cli_json_text(m[i].path, strlen(m[i].path)), "source", m[i].source,
                                                 "architecture", toy_cli_json_text(m[i].arch, strlen(m[i].arch)),
                                                 "params", (json_int_t)m[i].n_params, "file_type",
                                                 toy_file_type_name(m[i].file_type), "size", (json_int_t)m[i].size));
        rc = toy_cli_print_json("models", arr, JSON_INDENT(2));
    } else if (n == 0) {
        printf("no GGUF models found (looked in $TOY_MODEL_DIR, ./models, ~/.cache/huggingface/hub,\n"
               "~/.ollama/models, ~/.lmstudio/models); `toy convert` makes one from a Hugging Face folder\n");
    } else {
        int w = 4;
        for (int64_t i = 0; i < n; i++) if ((int)strlen(m[i].name) > w) w = (int)strlen(m[i].name);
        if (w > 60) w = 60;
        printf("%-*s  %-10s %8s  %-9s %8s  %-11s  %s\n", w, "NAME", "ARCH", "PARAMS", "TYPE", "SIZE", "SOURCE", "PATH");
        for (int64_t i = 0; i < n; i++) {
            char params[32], size[32];
            human(params, sizeof params, (double)m[i].n_params, "");
            human(size, sizeof size, (double)m[i].size, "B");
            printf("%-*s  %-10s %8s  %-9s %8s  %-11s  %s\n", w, m[i].name, m[i].arch[0] ? m[i].arch : "?", params,
                   toy_file_type_name(m[i].file_type), size, m[i].source, m[i].path);
        }
    }
    free(m);
    return rc;
}
