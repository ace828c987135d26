/* cmd-convert.c: `toy convert <hf-model-dir> -o out.gguf [--type T]` and
 * `toy quantize in.gguf out.gguf TYPE`: thin front ends over
 * toy_hf_convert / toy_gguf_quantize (include/toy/convert.h), with a
 * progress bar on a terminal and one summary line in pipes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli-error.h"
#include "flags.h"
#include "progress.h"
#include "toy/convert.h"
#include "toy/gguf.h"
#include "toy/models.h"
#include "toy/quant.h"

static void on_progress(void *ctx, int64_t done, int64_t total, const char *name) {
    struct toy_progress *p = ctx;
    p->total = total;
    toy_progress_update(p, done, (double)done, name);
}

static const char *const types_help = "f32|f16|bf16|q8_0|q4_0|q4_1|q5_0|q5_1|q2_k|q3_k|q4_k|q5_k|q6_k|iq4_nl|iq4_xs|mxfp4";

static int parse_type(const char *s, enum toy_dtype *t) {
    int d = toy_dtype_from_name(s);
    if (d < 0 || !toy_can_quantize((enum toy_dtype)d)) {
        fprintf(stderr, "toy: unknown or unsupported type '%s' (%s)\n", s, types_help);
        return 2;
    }
    *t = (enum toy_dtype)d;
    return 0;
}

static void summary(const char *path, double t0, int64_t n_tensors) {
    struct toy_gguf *g;
    if (toy_gguf_open(path, &g)) return;
    uint64_t params = 0;
    for (int64_t i = 0; i < toy_gguf_n_tensors(g); i++) params += (uint64_t)toy_gguf_tensor(g, i)->n_elements;
    /* GPT-2 files carry the tied output matrix twice (llama.cpp reads output.weight): a copy is not a parameter */
    int64_t ie = toy_gguf_find_tensor(g, "token_embd.weight"), io = toy_gguf_find_tensor(g, "output.weight");
    const struct toy_gguf_tensor *te = ie >= 0 ? toy_gguf_tensor(g, ie) : NULL, *to = io >= 0 ? toy_gguf_tensor(g, io) : NULL;
    bool copy = te && to && te->type == to->type && te->nbytes == to->nbytes && te->ne[0] == to->ne[0] &&
                te->ne[1] == to->ne[1] && !memcmp(te->data, to->data, te->nbytes);
    if (copy) params -= (uint64_t)to->n_elements;
    uint32_t ft = UINT32_MAX;
    toy_gguf_get_u32(g, "general.file_type", &ft);
    fprintf(stderr, "toy: wrote %s: %lld tensors, %.2fM params%s, %s, %.1f MB in %.2f s\n", path,
            (long long)n_tensors, (double)params / 1e6, copy ? " (output.weight a copy of token_embd)" : "",
            toy_file_type_name(ft), (double)toy_gguf_file_size(g) / 1e6, toy_now() - t0);
    toy_gguf_close(g);
}

/* The matrices not written as asked, and why, since the file type names the request: the k-quants need
 * rows of a multiple of 256 and the 32-blocks one of 32, so such a matrix is written in the nearest type
 * that fits (as llama.cpp does); a tensor toy cannot convert at all (integers: i8, i32, ...) is copied as
 * it is, and its rows have nothing to do with it. */
static void fallback_note(const char *path, enum toy_dtype want) {
    struct toy_gguf *g;
    if (toy_gguf_open(path, &g)) return;
    int64_t n = 0, rows = 0, copied = 0, other = 0, ne0 = 0;
    enum toy_dtype got = want, kept = want, elsewise = want;
    int64_t block = toy_dtype_block_size(want);
    for (int64_t i = 0; i < toy_gguf_n_tensors(g); i++) {
        const struct toy_gguf_tensor *t = toy_gguf_tensor(g, i);
        if (t->n_dims < 2) continue;
        n++;
        if (t->type == want) continue;
        if (!toy_can_dequantize(t->type)) copied++, kept = t->type;
        else if (block > 1 && t->ne[0] % block) rows++, got = t->type, ne0 = t->ne[0];
        else other++, elsewise = t->type;
    }
    if (rows)
        fprintf(stderr, "toy: note: %lld of %lld matrices are %s, not %s (rows of %lld%s: %s needs a multiple of "
                "%lld)\n", (long long)rows, (long long)n, toy_dtype_name(got), toy_dtype_name(want), (long long)ne0,
                rows > 1 ? ", e.g." : "", toy_dtype_name(want), (long long)block);
    if (copied)
        fprintf(stderr, "toy: note: %lld of %lld matrices are copied as they are (e.g. %s): toy converts only "
                "float and quantized tensors\n", (long long)copied, (long long)n, toy_dtype_name(kept));
    if (other)
        fprintf(stderr, "toy: note: %lld of %lld matrices are not %s (e.g. %s)\n", (long long)other, (long long)n,
                toy_dtype_name(want), toy_dtype_name(elsewise));
    toy_gguf_close(g);
}

int toy_cmd_convert(int argc, char **argv) {
    const char *in = NULL, *out = NULL;
    struct toy_convert_opts o = {.type = TOY_F16};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-o") && i + 1 < argc) out = argv[++i];
        else if ((!strcmp(argv[i], "-o") || !strcmp(argv[i], "--type")) && i + 1 == argc) {
            fprintf(stderr, "toy convert: %s needs a value\n", argv[i]);
            return 2;
        }
        else if (!strcmp(argv[i], "--type") && i + 1 < argc) {
            int rc = parse_type(argv[++i], &o.type);
            if (rc) return rc;
        } else if (!strcmp(argv[i], "--no-tokenizer")) o.skip_tokenizer = true;
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) in = NULL, out = NULL, i = argc;
        else if (argv[i][0] != '-' && !in) in = argv[i];
        else { fprintf(stderr, "toy convert: unknown argument '%s'\n", argv[i]); return 2; }
    }
    bool help = toy_cli_wants_help(argc, argv);
    if (!in || !out || help) {
        fprintf(help ? stdout : stderr,
                "usage: toy convert <hf-model-dir> -o out.gguf [--type %s] [--no-tokenizer]\n"
                "Converts a Hugging Face folder (config.json, *.safetensors, tokenizer.json) to GGUF\n"
                "(default type f16; norms and biases stay f32). config.json's model_type: llama,\n"
                "mistral, qwen2, qwen3, gemma2, gemma3_text, gemma3 (its text model), smollm3, olmo2,\n"
                "olmo3, granite, phi3, gpt2, mixtral, qwen2_moe, qwen3_moe, olmoe, deepseek_v2, deepseek_v3\n"
                "(docs/model-files.md).\n",
                types_help);
        return help ? 0 : 2;
    }
    struct toy_progress p;
    toy_progress_start(&p, "convert", 0, "tensors/s");
    o.progress = on_progress;
    o.progress_ctx = &p;
    struct toy_convert_report r;
    enum toy_status st = toy_hf_convert(in, out, &o, &r);
    toy_progress_finish(&p);
    if (st) {
        fprintf(stderr, "toy convert: %s\n", toy_last_error());
        return 1;
    }
    if (r.note[0]) fprintf(stderr, "toy: note: %s\n", r.note);
    fprintf(stderr, "toy: %s model, %.2fM params%s\n", r.arch, (double)r.n_params / 1e6,
            r.tokenizer ? ", tokenizer included" : "");
    summary(out, p.t0, r.n_tensors);
    return 0;
}

int toy_cmd_quantize(int argc, char **argv) {
    bool help = toy_cli_wants_help(argc, argv);
    if (argc != 4 || argv[1][0] == '-' || help) {
        fprintf(help ? stdout : stderr,
                "usage: toy quantize <in.gguf|NAME> <out.gguf> <%s>\n"
                "Re-quantizes every 2-D weight (bit-exact with llama.cpp's reference quantizers);\n"
                "1-D tensors are copied as they are.\n", types_help);
        return help ? 0 : 2;
    }
    enum toy_dtype t;
    int rc = parse_type(argv[3], &t);
    if (rc) return rc;
    char in[4096];
    if (toy_model_resolve(argv[1], in, sizeof in)) {
        fprintf(stderr, "toy quantize: %s\n", toy_cli_error("quantize"));
        return 1;
    }
    /* a vocabulary-only file would come out "Q4_0" with nothing quantized in it */
    struct toy_gguf *src;
    if (!toy_gguf_open(in, &src)) {
        int64_t nt = toy_gguf_n_tensors(src);
        toy_gguf_close(src);
        if (!nt) {
            fprintf(stderr, "toy quantize: %s: no tensors to quantize (a vocabulary-only file?)\n", in);
            return 1;
        }
    }
    struct toy_progress p;
    toy_progress_start(&p, "quantize", 0, "tensors/s");
    enum toy_status st = toy_gguf_quantize(in, argv[2], t, on_progress, &p);
    toy_progress_finish(&p);
    if (st) {
        fprintf(stderr, "toy quantize: %s\n", toy_cli_error("quantize"));
        return 1;
    }
    struct toy_gguf *g;
    int64_t n = 0;
    if (!toy_gguf_open(argv[2], &g)) { n = toy_gguf_n_tensors(g); toy_gguf_close(g); }
    summary(argv[2], p.t0, n);
    fallback_note(argv[2], t);
    return 0;
}
