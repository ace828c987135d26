/* test-api.c: libtoy as a program that embeds it sees it: the names it
 * exports, and the public functions called the way a user calls them
 * (including the plausible mistakes: NULL, wrong order, wrong shapes),
 * which must give a status and a message, not a crash. */
#include <criterion/criterion.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "toy/toy.h"

/* The build folder that holds libtoy.a and libtoy.so: TOY_BIN's folder. */
static const char *build_dir(void) {
    static char dir[4096];
    const char *b = getenv("TOY_BIN");
    if (!b) cr_skip("TOY_BIN not set (run through make check)");
    snprintf(dir, sizeof dir, "%s", b);
    return dirname(dir);
}

/* Every global symbol `nm FLAGS LIB` lists as defined must start with
 * toy_: a user's program (or another library) that defines, say, its own
 * tok_push or jinja_parse would otherwise clash with libtoy's. */
static void only_toy_names(const char *lib, const char *flags) {
    char path[4200], cmd[4400], line[512];
    snprintf(path, sizeof path, "%s/%s", build_dir(), lib);
    struct stat sb;
    if (stat(path, &sb)) cr_skip("%s not built", path);
    snprintf(cmd, sizeof cmd, "nm %s --defined-only '%s' 2>/dev/null", flags, path);
    FILE *p = popen(cmd, "r");
    if (!p) cr_skip("cannot run nm");
    int n = 0, bad = 0;
    char first_bad[8][256];
    while (fgets(line, sizeof line, p)) {
        char addr[64], type[8], name[256];
        if (sscanf(line, "%63s %7s %255s", addr, type, name) != 3) continue; /* "file.o:" headers */
        if (strchr("UvVwW", type[0]) || (type[0] >= 'a' && type[0] <= 'z')) continue; /* not a global definition */
        n++;
        /* AddressSanitizer's one-definition-rule indicator of toy_x is __odr_asan.toy_x */
        const char *own = strncmp(name, "__odr_asan.", 11) ? name : name + 11;
        if (strncmp(own, "toy_", 4)) {
            if (bad < 8) snprintf(first_bad[bad], sizeof first_bad[bad], "%s", name);
            bad++;
        }
    }
    int rc = pclose(p);
    if (rc != 0 && n == 0) cr_skip("nm is not available");
    cr_assert_gt(n, 100, "%s: only %d global symbols listed", lib, n);
    for (int i = 0; i < bad && i < 8; i++) cr_log_error("%s exports %s", lib, first_bad[i]);
    cr_assert_eq(bad, 0, "%s: %d global symbols without the toy_ prefix (first: %s)", lib, bad,
                 bad ? first_bad[0] : "");
}

Test(api, shared_library_exports_only_toy_names) { only_toy_names("libtoy.so", "-D"); }
Test(api, static_library_defines_only_toy_globals) { only_toy_names("libtoy.a", "-g"); }

/* A NULL path (an unset environment variable, a missing argv entry) or a
 * NULL GGUF (m->gguf of a model made by toy_llama_new) given to a function
 * that opens something is TOY_ERR_INVALID_ARG with a message naming what
 * is missing: it crashed in nine of them. */
#define NULL_ARG(call, what)                                                                                      \
    do {                                                                                                          \
        toy_clear_error();                                                                                        \
        enum toy_status st_ = (call);                                                                             \
        cr_expect_eq(st_, TOY_ERR_INVALID_ARG, "%s: %s (%s)", #call, toy_status_str(st_), toy_last_error());    \
        cr_expect(strstr(toy_last_error(), what), "%s: '%s' does not say '%s'", #call, toy_last_error(), what); \
        cr_expect_null(strstr(toy_last_error(), "(null)"), "%s: '%s'", #call, toy_last_error());                \
    } while (0)

Test(api, null_paths_are_invalid_arguments) {
    struct toy_tokenizer *tok;
    struct toy_data *d;
    struct toy_safetensors *st;
    struct toy_image_set *is;
    struct toy_trace *tr;
    struct toy_file_bytes fb;
    char path[64];
    NULL_ARG(toy_tokenizer_load(NULL, &tok), "NULL path");
    NULL_ARG(toy_tokenizer_load_hf(NULL, NULL, &tok), "NULL tokenizer.json path");
    NULL_ARG(toy_tokenizer_load_gpt2(NULL, "vocab.bpe", NULL, &tok), "NULL encoder.json path");
    NULL_ARG(toy_tokenizer_load_gpt2("encoder.json", NULL, NULL, &tok), "NULL vocab.bpe path");
    NULL_ARG(toy_tokenizer_load_gguf(NULL, &tok), "NULL GGUF");
    NULL_ARG(toy_data_open(NULL, &(struct toy_data_opts){.batch = 1, .ctx = 8}, &d), "NULL path");
    NULL_ARG(toy_safetensors_open(NULL, &st), "NULL path");
    NULL_ARG(toy_images_load(NULL, NULL, &is), "NULL path");
    NULL_ARG(toy_images_load_idx(NULL, "labels", &is), "NULL images path");
    NULL_ARG(toy_images_load_idx("images", NULL, &is), "NULL labels path");
    NULL_ARG(toy_images_load_toyi(NULL, &is), "NULL path");
    NULL_ARG(toy_trace_open(NULL, 0, &tr), "NULL path");
    NULL_ARG(toy_model_resolve(NULL, path, sizeof path), "NULL name");
    NULL_ARG(toy_hf_convert(NULL, "out.gguf", NULL, NULL), "NULL model folder");
    NULL_ARG(toy_hf_convert("hf/", NULL, NULL, NULL), "NULL output path");
    NULL_ARG(toy_file_bytes_open(NULL, &fb), "NULL path");
    NULL_ARG(toy_events_read(NULL, NULL, NULL, NULL), "NULL path");
    /* a preset by a NULL name is an unknown one, as documented */
    cr_expect_eq(toy_llama_preset(NULL).d_model, 0);
    cr_expect_eq(toy_gpt2_preset(NULL).d_model, 0);
    cr_expect_eq(toy_vit_preset(NULL).d_model, 0);
}

/* NULL parameters are the defaults (every field's zero is documented):
 * toy_generate(g, prompt, n, NULL, ...) and toy_sampler_new(NULL, V)
 * crashed. A NULL model or generator is an error, not a crash. */
Test(api, null_params_are_the_defaults) {
    struct toy_llama_config cfg = toy_llama_preset("tiny");
    cfg.vocab = 32;
    struct toy_llama *m = toy_llama_new(&cfg, 7);
    cr_assert_not_null(m, "%s", toy_last_error());
    struct toy_generator *g;
    NULL_ARG(toy_generator_new(NULL, NULL, 16, NULL, &g), "NULL model");
    cr_assert_eq(toy_generator_new(m, NULL, 16, NULL, &g), TOY_OK, "%s", toy_last_error());
    int32_t prompt[] = {1, 2, 3};
    struct toy_generate_result r;
    cr_assert_eq(toy_generate(g, prompt, 3, NULL, NULL, NULL, &r), TOY_OK, "%s", toy_last_error());
    cr_expect_eq(r.reason, TOY_STOP_CONTEXT); /* no tokenizer, no EOS: until the context is full */
    cr_expect_eq(r.n_generated, 16 - 3);
    /* the same as zeroed params, token for token (greedy) */
    struct toy_generate_params zero = {0};
    struct toy_generate_result r2;
    cr_assert_eq(toy_generate(g, prompt, 3, &zero, NULL, NULL, &r2), TOY_OK, "%s", toy_last_error());
    cr_expect_eq(r2.n_generated, r.n_generated);
    NULL_ARG(toy_generate(NULL, prompt, 3, NULL, NULL, NULL, NULL), "NULL generator");
    NULL_ARG(toy_generate(g, NULL, 3, NULL, NULL, NULL, NULL), "NULL prompt");
    toy_generator_free(g);
    toy_llama_free(m);

    cr_expect_eq(toy_sampler_params_check(NULL), TOY_OK);
    struct toy_sampler *s = toy_sampler_new(NULL, 4);
    cr_assert_not_null(s);
    float logits[4] = {0.5f, 3.0f, -1.0f, 2.0f};
    cr_expect_eq(toy_sampler_sample(s, logits, NULL), 1); /* greedy */
    toy_sampler_free(s);
}
