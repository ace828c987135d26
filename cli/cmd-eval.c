/* cmd-eval.c: `toy eval -m model.gguf --data FILE`: mean next-token
 * cross-entropy and perplexity of a model over consecutive windows of a text
 * (tokenized with the model's tokenizer as `toy tokenize --corpus` does,
 * lm-data.h) or TOYT token file, either of them possibly a pipe. With
 * --heldout F only the last fraction F of the file is read (what `toy train`
 * held out with the same F). A progress bar on a terminal. Llama-family and
 * GPT-2 GGUFs (both through toy_lm). */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "flags.h"
#include "generate-gpt2.h"
#include "progress.h"
#include "json-out.h"
#include "lm-data.h"
#include "paths.h"
#include "precision.h"
#include "toy/data.h"
#include "toy/gguf.h"
#include "toy/tokenizer.h"
#include "toy/models.h"
#include "toy/toy.h"

static int usage_to(FILE *out) {
    fprintf(out, "usage: toy eval -m MODEL.gguf --data FILE [--ctx 256] [--batch 4] [--heldout 0] "
                 "[--max-windows N] [--no-bos] [--bf16] [--threads N] [--json]\n"
                 "Mean next-token cross-entropy over the file's windows of --ctx tokens (default 256, at most\n"
                 "the model's), or over the last --heldout fraction, split as toy train splits it: with the\n"
                 "run's --ctx and --max-windows of its evaluation, the same windows and the same loss.\n"
                 "A text is one document, tokenized as `toy tokenize --corpus` does: BOS first when the\n"
                 "model's tokenizer asks for one (--no-bos: never). FILE may be a pipe (/dev/stdin).\n"
                 "--bf16: products over f32 or f16 weights in bf16 (AVX-512 BF16 or AMX), f32 sums.\n"
                 "--json: {format: \"toy/eval-v1\", model, data, loss, ppl, tokens, windows, ctx, bf16}.\n");
    return 2;
}
static int usage(void) { return usage_to(stderr); }

int toy_cmd_eval(int argc, char **argv) {
    const char *model = NULL, *path = NULL;
    int64_t T = 0, B = 4, max_windows = 0;
    double heldout = 0;
    int threads = 0;
    bool json = false, no_bos = false, bf16 = false;
    const struct toy_cli_flag flags[] = {
        TOY_FLAG_S("-m", &model), TOY_FLAG_S("--model", &model), TOY_FLAG_S("--data", &path),
        TOY_FLAG_B("--json", &json), TOY_FLAG_B("--no-bos", &no_bos), TOY_FLAG_B("--bf16", &bf16),
        TOY_FLAG_N("--ctx", TOY_CLI_I64, &T, 0, 16777216),
        TOY_FLAG_N("--batch", TOY_CLI_I64, &B, 1, 1048576), TOY_FLAG_OPEN("--heldout", TOY_CLI_F64, &heldout, 0, 1),
        TOY_FLAG_N("--max-windows", TOY_CLI_I64, &max_windows, 0, 1e15),
        TOY_FLAG_N("--threads", TOY_CLI_INT, &threads, 0, 4096), TOY_FLAG_END,
    };
    int prc = toy_cli_parse("eval", argc, argv, flags, NULL, 0, NULL);
    if (prc == 1) { usage_to(stdout); return 0; }
    if (prc) return prc;
    if (!model || !path) return usage();
    if (toy_cli_check_input("eval", path)) return 1; /* a folder read as unreadable data */
    char resolved[4096];
    if (toy_model_resolve(model, resolved, sizeof resolved)) { fprintf(stderr, "toy eval: %s\n", toy_last_error()); return 1; }
    model = resolved; /* a path, or a name from `toy models` */
    struct toy_llama *m = NULL;
    struct toy_tokenizer *tok = NULL;
    struct toy_data *d = NULL;
    struct toy_ctx *ctx = NULL;
    struct toy_threadpool *tp = NULL;
    struct toy_cli_data in = {0};
    int rc = 1;
    struct toy_gpt2 *g2 = NULL; /* a GPT-2 GGUF runs through the same toy_lm interface */
    if (toy_cli_is_gpt2(model) ? toy_gpt2_load(model, false, &g2) : toy_llama_load(model, false, &m)) {
        fprintf(stderr, "toy eval: %s\n", toy_last_error());
        return 1;
    }
    bool bf16_on = bf16 && toy_cli_infer_bf16("eval", m, g2);
    struct toy_lm lm = g2 ? toy_gpt2_lm(g2) : toy_llama_lm(m);
    if (T > lm.max_ctx) { /* it became 256 without a word */
        fprintf(stderr, "toy eval: note: --ctx %lld is past the model's context of %lld tokens: using %lld\n",
                (long long)T, (long long)lm.max_ctx, (long long)lm.max_ctx);
        T = lm.max_ctx;
    }
    if (T <= 0) T = lm.max_ctx < 256 ? lm.max_ctx : 256;
    /* the whole file is evaluated unless --heldout says which tail to use */
    struct toy_data_opts o = {.batch = B, .ctx = T, .heldout = heldout, .seed = 0, .eval_only = !(heldout > 0)};
    /* read once: --data may be a pipe (/dev/stdin) */
    if (toy_cli_data_read("eval", path, &in)) goto out;
    if (!in.packed && toy_tokenizer_load_gguf(g2 ? g2->gguf : m->gguf, &tok)) {
        fprintf(stderr, "toy eval: %s\n", toy_last_error());
        goto out;
    }
    if (toy_cli_data_load(&in, tok, no_bos ? TOY_ENCODE_NO_BOS : 0, &o, &d)) {
        fprintf(stderr, "toy eval: %s\n", toy_last_error());
        goto out;
    }
    toy_cli_data_free(&in); /* the ids are the loader's */
    if (toy_data_vocab(d) > lm.vocab) {
        fprintf(stderr, "toy eval: the data's vocabulary (%lld) is larger than the model's (%lld)\n",
                (long long)toy_data_vocab(d), (long long)lm.vocab);
        goto out;
    }
    /* Token ids of another vocabulary give a loss that means nothing. The
     * model's tokenizer says what its ids are (its embedding may have more
     * rows, padding); without one, its vocabulary must be the data's. */
    if (!tok && toy_tokenizer_load_gguf(g2 ? g2->gguf : m->gguf, &tok)) tok = NULL;
    int64_t want = tok ? toy_tokenizer_n_vocab(tok) : lm.vocab;
    if (toy_data_vocab(d) != want) {
        fprintf(stderr, "toy eval: %s holds ids of a %lld-token vocabulary, the model's %s has %lld: tokenize the text "
                "with the model's tokenizer (toy tokenize -m MODEL --corpus ...)\n", path,
                (long long)toy_data_vocab(d), tok ? "tokenizer" : "vocabulary", (long long)want);
        goto out;
    }
    int64_t windows = toy_data_eval_windows(d);
    if (max_windows > 0 && windows > max_windows) windows = max_windows;
    if (windows <= 0) { fprintf(stderr, "toy eval: %s is shorter than one window of %lld tokens\n", path, (long long)T); goto out; }
    ctx = toy_ctx_init(true);
    struct toy_tensor *x = toy_new_tensor_2d(ctx, TOY_I32, T, B), *y = toy_new_tensor_2d(ctx, TOY_I32, T, B);
    struct toy_tensor *pos = toy_new_tensor_1d(ctx, TOY_I32, T);
    for (int64_t t = 0; t < T; t++) ((int32_t *)pos->data)[t] = (int32_t)t;
    struct toy_tensor *loss = toy_cross_entropy(ctx, lm.forward(lm.self, ctx, x, pos), y, -100);
    struct toy_graph *g = toy_graph_new(ctx);
    toy_graph_build(g, loss);
    tp = toy_threadpool_new(threads);
    struct toy_progress pb;
    toy_progress_start(&pb, "eval", windows, "tok/s");
    if (json) pb.tty = false;
    double sum = 0;
    int64_t count = 0;
    for (int64_t w = 0; w < windows; w += B) {
        toy_data_eval_batch(d, w, x->data, y->data, -100);
        int64_t n = 0;
        for (int64_t i = 0; i < T * B; i++) {
            if (w + i / T >= windows) ((int32_t *)y->data)[i] = -100;
            n += ((int32_t *)y->data)[i] != -100;
        }
        if (toy_graph_compute(g, tp)) { fprintf(stderr, "\ntoy eval: %s\n", toy_last_error()); goto out; }
        sum += (double)*(float *)loss->data * (double)n;
        count += n;
        char extra[64];
        snprintf(extra, sizeof extra, "loss %.4f", sum / (double)count);
        toy_progress_update(&pb, w + B < windows ? w + B : windows, (double)count, extra);
    }
    toy_progress_finish(&pb);
    double ce = sum / (double)count;
    rc = 0;
    if (json) { /* JSON has no NaN: a loss that is not a number is null */
        json_t *j = json_pack("{s:s,s:o,s:o,s:o,s:o,s:I,s:I,s:I,s:b}", "format", "toy/eval-v1", "model",
                              toy_cli_json_text(model, strlen(model)), "data", toy_cli_json_text(path, strlen(path)), "loss", isfinite(ce) ? json_real(ce) : json_null(), "ppl",
                              isfinite(exp(ce)) ? json_real(exp(ce)) : json_null(), "tokens", (json_int_t)count,
                              "windows", (json_int_t)windows, "ctx", (json_int_t)T, "bf16", bf16_on);
        if (toy_cli_print_json("eval", j, JSON_COMPACT)) rc = 1;
    } else {
        printf("eval_ce: %.6f\nperplexity: %.4f\ntokens: %lld in %lld windows of %lld\n", ce, exp(ce), (long long)count,
               (long long)windows, (long long)T);
    }
    if (!isfinite(ce)) {
        fprintf(stderr, "toy eval: the loss is not finite: %s has weights that are NaN or infinite, or overflow\n", model);
        rc = 1;
    }
out:
    toy_cli_data_free(&in);
    toy_threadpool_free(tp);
    toy_ctx_free(ctx);
    toy_data_free(d);
    toy_tokenizer_free(tok);
    toy_llama_free(m);
    toy_gpt2_free(g2);
    return rc;
}
