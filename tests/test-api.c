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
    NULL_ARG(toy_generator_new_lm(NULL, NULL, 16, TOY_F32, NULL, &g), "NULL model");
    NULL_ARG(toy_serve(NULL, NULL, NULL, NULL), "NULL model");
    NULL_ARG(toy_serve_gpt2(NULL, NULL, NULL, NULL), "NULL model");
    struct toy_lm no_cache = toy_llama_lm(m); /* a family without KV-cache inference */
    no_cache.forward_cached = NULL;
    cr_assert_eq(toy_generator_new_lm(&no_cache, NULL, 16, TOY_F32, NULL, &g), TOY_ERR_UNSUPPORTED);
    cr_assert(strstr(toy_last_error(), "no KV-cache inference"), "%s", toy_last_error());
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

/* A tiny GGUF in memory: u32 "n", string "s", i32 array "arr", f32 tensor "t" {4}. */
static struct toy_gguf *tiny_gguf(void **bytes) {
    struct toy_gguf_writer *w;
    cr_assert_eq(toy_gguf_writer_init(&w), TOY_OK, "%s", toy_last_error());
    int32_t arr[3] = {1, 2, 3};
    float t[4] = {1, 2, 3, 4};
    cr_assert_eq(toy_gguf_writer_set_u32(w, "n", 7), TOY_OK);
    cr_assert_eq(toy_gguf_writer_set_str(w, "s", "text"), TOY_OK);
    cr_assert_eq(toy_gguf_writer_set_arr(w, "arr", TOY_GGUF_I32, arr, 3), TOY_OK);
    cr_assert_eq(toy_gguf_writer_add_tensor(w, "t", TOY_F32, 1, (int64_t[]){4}, t), TOY_OK, "%s", toy_last_error());
    size_t size;
    cr_assert_eq(toy_gguf_writer_write_memory(w, bytes, &size), TOY_OK, "%s", toy_last_error());
    toy_gguf_writer_free(w);
    struct toy_gguf *g;
    cr_assert_eq(toy_gguf_open_memory(*bytes, size, "tiny", &g), TOY_OK, "%s", toy_last_error());
    return g;
}

/* A tiny byte-level BPE tokenizer (256 bytes, <|endoftext|>, one merge). */
static struct toy_tokenizer *tiny_tokenizer(void) {
    const char text[] = "hello hello hello world";
    struct toy_tokenizer *tok;
    cr_assert_eq(toy_tokenizer_train_bpe(text, sizeof text - 1, &(struct toy_bpe_train_opts){.vocab_size = 258}, &tok),
                 TOY_OK, "%s", toy_last_error());
    return tok;
}

/* A NULL where a function stores its result (the out of toy_llama_load,
 * the kv cache of toy_kv_cache_init, a getter's value) is
 * TOY_ERR_INVALID_ARG naming the function and the parameter, given before
 * any file is opened or memory taken: each of these crashed. Paths are
 * ones nothing can create (/dev/null/...), so a check that went missing
 * crashes the test rather than leaving files behind. */
Test(api, null_outputs_are_invalid_arguments) {
    const char *nowhere = "/dev/null/x";
    void *bytes;
    struct toy_gguf *g = tiny_gguf(&bytes);
    struct toy_tokenizer *tok = tiny_tokenizer();
    struct toy_llama_config cfg = toy_llama_preset("tiny");
    cfg.vocab = 32;
    struct toy_llama *m = toy_llama_new(&cfg, 7);
    cr_assert_not_null(m, "%s", toy_last_error());
    struct toy_data_opts dopts = {.batch = 1, .ctx = 8};
    struct toy_sft_opts sopts = {.ctx = 8};
    struct toy_chat_message msgs[] = {{"user", "hi"}};
    struct toy_tokens ids = {0};
    unsigned char *mask;
    char *text, id[64], dir[256];
    const char *cs;
    size_t len;
    int n;
    int64_t n64;
    bool self;
    struct toy_image_set *train;
    struct toy_model_entry *entries;
    int32_t *tok_ids;
    uint32_t vocab;
    uint64_t count;
    struct toy_device_info infos[4];

    /* constructors and loaders: T **out */
    NULL_ARG(toy_llama_load(nowhere, false, NULL), "toy_llama_load: out is NULL");
    NULL_ARG(toy_gpt2_load(nowhere, false, NULL), "toy_gpt2_load: out is NULL");
    NULL_ARG(toy_vit_load(nowhere, false, NULL), "toy_vit_load: out is NULL");
    NULL_ARG(toy_gguf_open(nowhere, NULL), "toy_gguf_open: out is NULL");
    NULL_ARG(toy_gguf_open(NULL, NULL), "toy_gguf_open: out is NULL");
    NULL_ARG(toy_gguf_open_memory(bytes, 0, NULL, NULL), "toy_gguf_open_memory: out is NULL");
    NULL_ARG(toy_gguf_writer_init(NULL), "toy_gguf_writer_init: out is NULL");
    NULL_ARG(toy_safetensors_open(nowhere, NULL), "toy_safetensors_open: out is NULL");
    NULL_ARG(toy_safetensors_open_memory(NULL, 0, NULL, NULL), "toy_safetensors_open_memory: out is NULL");
    NULL_ARG(toy_tokenizer_init(NULL, NULL), "toy_tokenizer_init: out is NULL");
    NULL_ARG(toy_tokenizer_load(nowhere, NULL), "toy_tokenizer_load: out is NULL");
    NULL_ARG(toy_tokenizer_load_hf(nowhere, NULL, NULL), "toy_tokenizer_load_hf: out is NULL");
    NULL_ARG(toy_tokenizer_load_hf_mem("{}", 2, NULL, 0, NULL), "toy_tokenizer_load_hf_mem: out is NULL");
    NULL_ARG(toy_tokenizer_load_gpt2(nowhere, nowhere, NULL, NULL), "toy_tokenizer_load_gpt2: out is NULL");
    NULL_ARG(toy_tokenizer_load_spm(nowhere, NULL), "toy_tokenizer_load_spm: out is NULL");
    NULL_ARG(toy_tokenizer_load_spm_mem("", 0, NULL), "toy_tokenizer_load_spm_mem: out is NULL");
    NULL_ARG(toy_tokenizer_load_gguf(g, NULL), "toy_tokenizer_load_gguf: out is NULL");
    NULL_ARG(toy_tokenizer_load_gguf_file(nowhere, NULL), "toy_tokenizer_load_gguf_file: out is NULL");
    NULL_ARG(toy_tokenizer_load_llama2c(nowhere, NULL), "toy_tokenizer_load_llama2c: out is NULL");
    NULL_ARG(toy_tokenizer_train_bpe("ab", 2, NULL, NULL), "toy_tokenizer_train_bpe: out is NULL");
    NULL_ARG(toy_decoder_init(tok, 0, NULL), "toy_decoder_init: out is NULL");
    NULL_ARG(toy_chat_template_init("chatml", NULL), "toy_chat_template_init: out is NULL");
    NULL_ARG(toy_data_open(nowhere, &dopts, NULL), "toy_data_open: out is NULL");
    NULL_ARG(toy_data_from_token_bytes(NULL, 0, NULL, &dopts, NULL), "toy_data_from_token_bytes: out is NULL");
    NULL_ARG(toy_data_from_ids((int32_t[]){1, 2, 3}, 3, 8, &dopts, NULL), "toy_data_from_ids: out is NULL");
    NULL_ARG(toy_sft_open(nowhere, tok, &sopts, NULL), "toy_sft_open: out is NULL");
    NULL_ARG(toy_sft_from_text("", 0, tok, &sopts, NULL), "toy_sft_from_text: out is NULL");
    NULL_ARG(toy_images_load(nowhere, NULL, NULL), "toy_images_load: out is NULL");
    NULL_ARG(toy_images_load_idx(nowhere, nowhere, NULL), "toy_images_load_idx: out is NULL");
    NULL_ARG(toy_images_load_toyi(nowhere, NULL), "toy_images_load_toyi: out is NULL");
    NULL_ARG(toy_events_open(nowhere, TOY_EVENTS_TRUNCATE, NULL), "toy_events_open: out is NULL");
    NULL_ARG(toy_trace_open(nowhere, 0, NULL), "toy_trace_open: out is NULL");
    NULL_ARG(toy_generator_new(m, tok, 16, NULL, NULL), "toy_generator_new: out is NULL");
    NULL_ARG(toy_generator_new_kv(m, tok, 16, TOY_F16, NULL, NULL), "toy_generator_new_kv: out is NULL");
    NULL_ARG(toy_generator_new_lm(&(struct toy_lm){0}, tok, 16, TOY_F16, NULL, NULL), "toy_generator_new_lm: out is NULL");
    NULL_ARG(toy_lora_attach(m, &(struct toy_lora_opts){.rank = 2}, NULL), "toy_lora_attach: out is NULL");
    NULL_ARG(toy_lora_load(m, nowhere, 1.0f, false, NULL), "toy_lora_load: out is NULL");
    NULL_ARG(toy_trainer_new(m, tok, NULL, NULL, nowhere, NULL, 1, NULL), "toy_trainer_new: out is NULL");
    NULL_ARG(toy_trainer_new_lm(NULL, tok, NULL, NULL, nowhere, NULL, 1, NULL), "toy_trainer_new_lm: out is NULL");
    NULL_ARG(toy_finetuner_new(m, NULL, tok, NULL, NULL, nowhere, NULL, 1, NULL), "toy_finetuner_new: out is NULL");
    NULL_ARG(toy_classifier_new(NULL, NULL, NULL, NULL, nowhere, NULL, 1, NULL), "toy_classifier_new: out is NULL");
    NULL_ARG(toy_collective_open(TOY_COLLECTIVE_LOCAL, NULL, NULL), "toy_collective_open: out is NULL");
    NULL_ARG(toy_grad_sync_new(NULL, NULL, NULL, NULL, NULL, 0, false, NULL), "toy_grad_sync_new: out is NULL");

    /* caller-owned structs filled in */
    NULL_ARG(toy_kv_cache_init(NULL, m, 8, 1), "toy_kv_cache_init: c is NULL");
    NULL_ARG(toy_kv_cache_init_type(NULL, m, 8, 1, TOY_F16), "toy_kv_cache_init_type: c is NULL");
    NULL_ARG(toy_gpt2_cache_init(NULL, NULL, 8, 1), "toy_gpt2_cache_init: c is NULL");
    NULL_ARG(toy_file_replace_begin(nowhere, NULL), "toy_file_replace_begin: r is NULL");
    NULL_ARG(toy_file_bytes_open(nowhere, NULL), "toy_file_bytes_open: b is NULL");
    NULL_ARG(toy_git_info(NULL, NULL), "toy_git_info: out is NULL");

    /* values, strings and buffers written through pointers */
    int64_t ki = toy_gguf_find_key(g, "n"), ks = toy_gguf_find_key(g, "s"), ka = toy_gguf_find_key(g, "arr");
    cr_assert(ki >= 0 && ks >= 0 && ka >= 0);
    NULL_ARG(toy_gguf_kv_int(g, ki, NULL), "toy_gguf_kv_int: v is NULL");
    NULL_ARG(toy_gguf_kv_uint(g, ki, NULL), "toy_gguf_kv_uint: v is NULL");
    NULL_ARG(toy_gguf_kv_float(g, ki, NULL), "toy_gguf_kv_float: v is NULL");
    NULL_ARG(toy_gguf_kv_str(g, ks, NULL, &len), "toy_gguf_kv_str: s is NULL");
    NULL_ARG(toy_gguf_get_u32(g, "n", NULL), "toy_gguf_get_u32: v is NULL");
    NULL_ARG(toy_gguf_get_i32(g, "n", NULL), "toy_gguf_get_i32: v is NULL");
    NULL_ARG(toy_gguf_get_u64(g, "n", NULL), "toy_gguf_get_u64: v is NULL");
    NULL_ARG(toy_gguf_get_i64(g, "n", NULL), "toy_gguf_get_i64: v is NULL");
    NULL_ARG(toy_gguf_get_f32(g, "n", NULL), "toy_gguf_get_f32: v is NULL");
    NULL_ARG(toy_gguf_get_f64(g, "n", NULL), "toy_gguf_get_f64: v is NULL");
    NULL_ARG(toy_gguf_get_bool(g, "n", NULL), "toy_gguf_get_bool: v is NULL");
    NULL_ARG(toy_gguf_get_str(g, "s", NULL, NULL), "toy_gguf_get_str: s is NULL");
    NULL_ARG(toy_gguf_arr_int(g, ka, 0, NULL), "toy_gguf_arr_int: v is NULL");
    NULL_ARG(toy_gguf_arr_float(g, ka, 0, NULL), "toy_gguf_arr_float: v is NULL");
    NULL_ARG(toy_gguf_tensor_read(g, 0, NULL, 16), "toy_gguf_tensor_read: dst is NULL");
    NULL_ARG(toy_gguf_tensor_read_f32(g, 0, NULL, 4), "toy_gguf_tensor_read_f32: dst is NULL");
    struct toy_gguf_writer *w;
    cr_assert_eq(toy_gguf_writer_init(&w), TOY_OK);
    void *p;
    NULL_ARG(toy_gguf_writer_write_memory(w, NULL, &len), "toy_gguf_writer_write_memory: out is NULL");
    NULL_ARG(toy_gguf_writer_write_memory(w, &p, NULL), "toy_gguf_writer_write_memory: size is NULL");
    toy_gguf_writer_free(w);
    uint8_t st_buf[128];
    const char *st_json = "{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}";
    uint64_t st_n = strlen(st_json);
    memcpy(st_buf, &st_n, 8);
    memcpy(st_buf + 8, st_json, st_n);
    memset(st_buf + 8 + st_n, 0, 4);
    struct toy_safetensors *st;
    cr_assert_eq(toy_safetensors_open_memory(st_buf, 8 + st_n + 4, "t", &st), TOY_OK, "%s", toy_last_error());
    NULL_ARG(toy_safetensors_read_f32(st, 0, NULL, 1), "toy_safetensors_read_f32: dst is NULL");
    toy_safetensors_close(st);
    NULL_ARG(toy_image_read_file(nowhere, 1, 8, 8, NULL), "toy_image_read_file: out is NULL");
    float row[32] = {0};
    NULL_ARG(toy_dequantize_row(TOY_F32, row, NULL, 32), "toy_dequantize_row: dst is NULL");
    NULL_ARG(toy_dequantize_row_ref(TOY_Q8_0, row, NULL, 32), "toy_dequantize_row_ref: dst is NULL");
    NULL_ARG(toy_quantize_row(TOY_Q8_0, row, NULL, 32), "toy_quantize_row: dst is NULL");
    NULL_ARG(toy_images_split(NULL, 0.2, 1, NULL, &train), "toy_images_split: train is NULL");
    NULL_ARG(toy_images_split(NULL, 0.2, 1, &train, NULL), "toy_images_split: test is NULL");
    NULL_ARG(toy_tokenizer_encode(tok, "hi", 2, 0, NULL), "toy_tokenizer_encode: out is NULL");
    NULL_ARG(toy_tokenizer_encode_corpus(tok, "hi", 2, 0, NULL), "toy_tokenizer_encode_corpus: out is NULL");
    NULL_ARG(toy_tokenizer_decode(tok, (int32_t[]){104}, 1, 0, NULL, &len), "toy_tokenizer_decode: text is NULL");
    struct toy_decoder *dec;
    cr_assert_eq(toy_decoder_init(tok, 0, &dec), TOY_OK);
    NULL_ARG(toy_decoder_push(dec, 104, NULL, &len), "toy_decoder_push: text is NULL");
    NULL_ARG(toy_decoder_push(dec, 104, &cs, NULL), "toy_decoder_push: len is NULL");
    toy_decoder_free(dec);
    struct toy_chat_template *t;
    cr_assert_eq(toy_chat_template_init("chatml", &t), TOY_OK, "%s", toy_last_error());
    NULL_ARG(toy_chat_template_render(t, msgs, 1, NULL, NULL), "toy_chat_template_render: out is NULL");
    NULL_ARG(toy_chat_template_render_json(t, "[]", NULL, NULL), "toy_chat_template_render_json: out is NULL");
    toy_chat_template_free(t);
    NULL_ARG(toy_tokenizer_apply_chat(tok, "chatml", msgs, 1, true, NULL), "toy_tokenizer_apply_chat: out is NULL");
    NULL_ARG(toy_chat_encode(tok, "chatml", msgs, 1, NULL, &mask), "toy_chat_encode: ids is NULL");
    NULL_ARG(toy_chat_encode(tok, "chatml", msgs, 1, &ids, NULL), "toy_chat_encode: mask is NULL");
    NULL_ARG(toy_token_file_read(nowhere, NULL, &tok_ids, &n64), "toy_token_file_read: n_vocab is NULL");
    NULL_ARG(toy_token_file_read(nowhere, &n64, NULL, &n64), "toy_token_file_read: ids is NULL");
    NULL_ARG(toy_token_file_read(nowhere, &n64, &tok_ids, NULL), "toy_token_file_read: n is NULL");
    NULL_ARG(toy_token_file_check(st_buf, 0, "x", NULL, &count), "toy_token_file_check: vocab is NULL");
    NULL_ARG(toy_token_file_check(st_buf, 0, "x", &vocab, NULL), "toy_token_file_check: count is NULL");
    NULL_ARG(toy_file_read_all(nowhere, NULL, &len), "toy_file_read_all: buf is NULL");
    NULL_ARG(toy_file_read_all(nowhere, &text, NULL), "toy_file_read_all: len is NULL");
    NULL_ARG(toy_file_read_fd(-1, "fd", NULL, &len), "toy_file_read_fd: buf is NULL");
    NULL_ARG(toy_file_read_fd(-1, "fd", &text, NULL), "toy_file_read_fd: len is NULL");
    NULL_ARG(toy_lora_parse_targets("q,v", NULL), "toy_lora_parse_targets: targets is NULL");
    NULL_ARG(toy_models_list(NULL, &n64), "toy_models_list: out is NULL");
    NULL_ARG(toy_models_list(&entries, NULL), "toy_models_list: n is NULL");
    NULL_ARG(toy_models_skipped(NULL, &n64), "toy_models_skipped: out is NULL");
    NULL_ARG(toy_models_skipped(&entries, NULL), "toy_models_skipped: n is NULL");
    NULL_ARG(toy_run_id_make(nowhere, NULL, "llama", 0, NULL, 64), "toy_run_id_make: out is NULL");
    NULL_ARG(toy_run_create(nowhere, NULL, "llama", NULL, 0, dir, sizeof dir), "toy_run_create: id is NULL");
    NULL_ARG(toy_run_create(nowhere, NULL, "llama", id, sizeof id, NULL, 0), "toy_run_create: dir is NULL");
    NULL_ARG(toy_run_claim(nowhere, true, NULL), "toy_run_claim: lock_fd is NULL");
    NULL_ARG(toy_device_list(infos, 4, NULL), "toy_device_list: n is NULL");
    NULL_ARG(toy_device_list(NULL, 4, &n), "toy_device_list: out is NULL");
    NULL_ARG(toy_collective_agree(NULL, 1, NULL, &self), "toy_collective_agree: differ is NULL");
    NULL_ARG(toy_collective_agree(NULL, 1, &n, NULL), "toy_collective_agree: self is NULL");
    NULL_ARG(toy_reduce_agree(NULL, NULL, 0, 1, NULL, &self), "toy_reduce_agree: differ is NULL");
    NULL_ARG(toy_reduce_agree(NULL, NULL, 0, 1, &n, NULL), "toy_reduce_agree: self is NULL");
    NULL_ARG(toy_trainer_eval(NULL, 1, NULL), "toy_trainer_eval: loss is NULL");
    NULL_ARG(toy_finetuner_eval(NULL, 1, NULL), "toy_finetuner_eval: loss is NULL");

    toy_llama_free(m);
    toy_tokenizer_free(tok);
    toy_gguf_close(g);
    free(bytes);
}

/* Outputs documented as optional stay optional. */
Test(api, optional_outputs_may_be_null) {
    void *bytes;
    struct toy_gguf *g = tiny_gguf(&bytes);
    struct toy_tokenizer *tok = tiny_tokenizer();
    const char *s;
    cr_expect_eq(toy_gguf_get_str(g, "s", &s, NULL), TOY_OK, "%s", toy_last_error());
    cr_expect_eq(toy_gguf_kv_str(g, toy_gguf_find_key(g, "s"), &s, NULL), TOY_OK, "%s", toy_last_error());
    cr_expect_eq(toy_gguf_get_arr(g, "arr", NULL, NULL, NULL), TOY_OK, "%s", toy_last_error());
    int n = -1;
    cr_expect_eq(toy_device_list(NULL, 0, &n), TOY_OK, "%s", toy_last_error()); /* nothing to fill */
    cr_expect_eq(n, 0);
    struct toy_tokens ids = {0};
    cr_assert_eq(toy_tokenizer_encode(tok, "hi", 2, 0, &ids), TOY_OK, "%s", toy_last_error());
    char *text;
    cr_expect_eq(toy_tokenizer_decode(tok, ids.ids, ids.n, 0, &text, NULL), TOY_OK, "%s", toy_last_error());
    cr_expect_str_eq(text, "hi");
    free(text);
    toy_tokens_free(&ids);
    cr_expect_not_null(toy_tokenizer_token_bytes(tok, 104, NULL));
    char *clean = toy_utf8_clean("a\xff", 2, NULL);
    cr_expect_not_null(clean);
    free(clean);
    toy_tokenizer_free(tok);
    toy_gguf_close(g);
    free(bytes);
}
