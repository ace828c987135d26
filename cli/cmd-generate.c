/* cmd-generate.c: `toy generate -m model.gguf -p "text"`: loads a
 * Llama-family GGUF (weights mapped), encodes the prompt with the model's own
 * tokenizer, prefills it in one graph and decodes with a KV cache, streaming
 * text to stdout. --json prints ids, text and per-token logprobs instead.
 * A GPT-2 GGUF goes to cli/generate-gpt2.c. */
#include <jansson.h>
#include <sys/resource.h>
#include <unistd.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flags.h"
#include "generate-gpt2.h"
#include "progress.h"
#include "json-out.h"
#include "precision.h"
#include "stop-signals.h"
#include "toy/file.h"
#include "toy/finetune.h"
#include "toy/generate.h"
#include "toy/gguf.h"
#include "toy/models.h"
#include "toy/toy.h"

static int usage_to(FILE *out) {
    fprintf(out,
            "usage: toy generate -m MODEL.gguf [-p PROMPT | --prompt-ids \"1 2 3\"] [-n 64]\n"
            "                    [--temp 0.8] [--top-k 40] [--top-p 0.95] [--min-p 0] [--repeat-penalty 1]\n"
            "                    [--frequency-penalty 0] [--presence-penalty 0] [--repeat-last-n 64] [--seed 42]\n"
            "                    [--stop STR]...\n"
            "                    [--ctx N] [--threads N] [--no-bos] [--special] [--ignore-eos] [--json]\n"
            "                    [--trace out.json] [--kv-type f16|f32]   (cache type, default f16)\n"
            "                    [--lora ADAPTER.gguf [--lora-scale 1]] [--bf16]\n"
            "                    [--json-object | --json-schema SCHEMA.json|JSON] [--lookup N]\n"
            "                    [--draft DRAFT.gguf [--draft-max 8] [--draft-p-min 0.75]]\n"
            "Temperature 0 is greedy; --top-k 0 and --top-p 0 or 1 are off; the penalties look at the last\n"
            "--repeat-last-n tokens, prompt included (-1: all); applied in that order (docs/generate.md).\n"
            "Stops at the model's end-of-generation token, a stop string (at most 16), -n tokens (0: no\n"
            "limit), or a full context (--ctx, default the model's). An empty -p starts from BOS, with or\n"
            "without --no-bos; --prompt-ids are the tokens as given (BOS too). Ctrl-C ends it with the text\n"
            "so far (exit 130).\n"
            "--bf16: the prompt's products over f32 or f16 weights in bf16 (AVX-512 BF16 or AMX).\n"
            "--json-object / --json-schema: the text is a JSON object / a JSON value the schema (a file or\n"
            "JSON text) accepts: tokens that would leave it are never sampled (docs/serve.md, structured output).\n"
            "--lookup N: speculative decoding by prompt lookup: drafts of up to N tokens (at most 15) copied\n"
            "from where the last few tokens came before, checked in one pass; the same text, sooner when it\n"
            "repeats the prompt (docs/generate.md).\n"
            "--draft DRAFT.gguf: speculative decoding with a smaller model of the same vocabulary writing\n"
            "drafts of up to --draft-max tokens (at most 15), ending one before a token it gives less than\n"
            "--draft-p-min; the same text, sooner as far as the draft guesses it.\n"
            "GPT-2 models take no --lora.\n");
    return 2;
}
static int usage(void) { return usage_to(stderr); }


static int toy_cmd_generate_model(const char *model, const char *prompt, const char *prompt_ids, const char *lora_path,
                                  float lora_scale, struct toy_generate_params *gpp, int64_t n_ctx, int kv_type,
                                  int threads, bool json, bool bos, bool special, const char *trace_path, bool bf16,
                                  const char *draft);

int toy_cmd_generate(int argc, char **argv) {
    const char *model = NULL, *prompt = NULL, *prompt_ids = NULL, *lora_path = NULL, *trace_path = NULL;
    float lora_scale = 1.0f;
    const char *stop_items[16], *stops[16], *kv_name = NULL;
    struct toy_cli_list stop_list = {stop_items, 0, 16};
    int n_stop = 0, threads = 0;
    int64_t n_ctx = 0;
    bool json = false, no_bos = false, special = false, bf16 = false, json_object = false;
    const char *json_schema = NULL, *draft = NULL;
    int kv_type = TOY_F16; /* half the cache memory and decode attention traffic; llama.cpp's default too */
    struct toy_generate_params gp = {.n_predict = 64,
                                     .sampling = {.temperature = 0.8f, .top_k = 40, .top_p = 0.95f, .seed = 42},
                                     .draft_max = TOY_GENERATE_DRAFT_MAX, .draft_p_min = 0.75f};
    struct toy_sampler_params *sp = &gp.sampling;
    const struct toy_cli_flag flags[] = {
        TOY_FLAG_S("-m", &model), TOY_FLAG_S("--model", &model), TOY_FLAG_S("-p", &prompt),
        TOY_FLAG_S("--prompt", &prompt), TOY_FLAG_S("--prompt-ids", &prompt_ids), TOY_FLAG_L("--stop", &stop_list),
        TOY_FLAG_S("--lora", &lora_path), TOY_FLAG_N("--lora-scale", TOY_CLI_F32, &lora_scale, -1e6, 1e6),
        TOY_FLAG_S("--trace", &trace_path), TOY_FLAG_S("--kv-type", &kv_name),
        TOY_FLAG_N("-n", TOY_CLI_I32, &gp.n_predict, 0, INT32_MAX),
        TOY_FLAG_N("--n-predict", TOY_CLI_I32, &gp.n_predict, 0, INT32_MAX),
        TOY_FLAG_N("--lookup", TOY_CLI_I32, &gp.lookup, 0, TOY_GENERATE_MAX_LOOKUP), TOY_FLAG_S("--draft", &draft),
        TOY_FLAG_N("--draft-max", TOY_CLI_I32, &gp.draft_max, 1, TOY_GENERATE_MAX_LOOKUP),
        TOY_FLAG_N("--draft-p-min", TOY_CLI_F32, &gp.draft_p_min, 0, 1),
        TOY_FLAG_N("--temp", TOY_CLI_F32, &sp->temperature, 0, 100),
        TOY_FLAG_N("--temperature", TOY_CLI_F32, &sp->temperature, 0, 100),
        TOY_FLAG_N("--top-k", TOY_CLI_I32, &sp->top_k, 0, INT32_MAX), TOY_FLAG_N("--top-p", TOY_CLI_F32, &sp->top_p, 0, 1),
        TOY_FLAG_N("--min-p", TOY_CLI_F32, &sp->min_p, 0, 1),
        TOY_FLAG_N("--repeat-penalty", TOY_CLI_F32, &sp->repeat_penalty, 0, 100),
        TOY_FLAG_N("--repeat-last-n", TOY_CLI_I32, &sp->penalty_last_n, -1, INT32_MAX),
        TOY_FLAG_N("--frequency-penalty", TOY_CLI_F32, &sp->frequency_penalty, -100, 100),
        TOY_FLAG_N("--presence-penalty", TOY_CLI_F32, &sp->presence_penalty, -100, 100),
        TOY_FLAG_U("--seed", &sp->seed), TOY_FLAG_N("--ctx", TOY_CLI_I64, &n_ctx, 1, INT32_MAX),
        TOY_FLAG_N("--threads", TOY_CLI_INT, &threads, 0, 1024), TOY_FLAG_B("--json", &json),
        TOY_FLAG_B("--no-bos", &no_bos), TOY_FLAG_B("--special", &special), TOY_FLAG_B("--ignore-eos", &gp.ignore_eos),
        TOY_FLAG_B("--bf16", &bf16), TOY_FLAG_B("--json-object", &json_object), TOY_FLAG_S("--json-schema", &json_schema),
        TOY_FLAG_END};
    int prc = toy_cli_parse("generate", argc, argv, flags, NULL, 0, NULL);
    if (prc == 1) return usage_to(stdout), 0;
    if (prc) return prc;
    bool bos = !no_bos;
    for (int i = 0; i < stop_list.n; i++) /* an empty stop string would end every generation at once */
        if (*stop_items[i]) stops[n_stop++] = stop_items[i];
    if (kv_name) {
        kv_type = toy_dtype_from_name(kv_name);
        if (kv_type != TOY_F32 && kv_type != TOY_F16) { fprintf(stderr, "toy generate: --kv-type f32|f16\n"); return 2; }
    }
    if (lora_scale != 1.0f && !lora_path) fprintf(stderr, "toy generate: --lora-scale is ignored without --lora\n");
    if (!model) { fprintf(stderr, "toy generate: -m MODEL is required\n"); return usage(); }
    if (prompt && prompt_ids) { fprintf(stderr, "toy generate: give -p or --prompt-ids, not both\n"); return 2; }
    if (toy_sampler_params_check(&gp.sampling)) { fprintf(stderr, "toy generate: %s\n", toy_last_error()); return 2; }
    char resolved[4096];
    if (toy_model_resolve(model, resolved, sizeof resolved)) { fprintf(stderr, "toy generate: %s\n", toy_last_error()); return 1; }
    model = resolved; /* a path, or a name from `toy models` */
    gp.stop = stops;
    gp.n_stop = n_stop;
    struct toy_json_grammar *grammar = NULL;
    if (json_object || json_schema) { /* the schema: JSON text as given, else a file's */
        if (json_object && json_schema) { fprintf(stderr, "toy generate: give --json-object or --json-schema\n"); return 2; }
        char *file = NULL;
        size_t flen;
        if (json_schema && json_schema[strspn(json_schema, " \t\n")] != '{' &&
            toy_file_read_all(json_schema, &file, &flen)) {
            fprintf(stderr, "toy generate: --json-schema %s: %s\n", json_schema, toy_last_error());
            return 2;
        }
        enum toy_status gst = toy_json_grammar_compile(file ? file : json_schema, &grammar);
        free(file);
        if (gst) { fprintf(stderr, "toy generate: --json-schema: %s\n", toy_last_error()); return 2; }
        gp.grammar = grammar;
    }
    int grc = toy_cmd_generate_model(model, prompt, prompt_ids, lora_path, lora_scale, &gp, n_ctx, kv_type, threads,
                                     json, bos, special, trace_path, bf16, draft);
    toy_json_grammar_free(grammar);
    return grc;
}

static int toy_cmd_generate_model(const char *model, const char *prompt, const char *prompt_ids, const char *lora_path,
                                  float lora_scale, struct toy_generate_params *gpp, int64_t n_ctx, int kv_type,
                                  int threads, bool json, bool bos, bool special, const char *trace_path, bool bf16,
                                  const char *draft) {
    struct toy_generate_params gp = *gpp;
    if (toy_cli_is_gpt2(model)) { /* GPT-2: its own model, the same generator; no adapters */
        if (lora_path) { fprintf(stderr, "toy generate: --lora is for Llama-family models; %s is a GPT-2\n", model); return 2; }
        return toy_cli_generate_gpt2(model, prompt, prompt_ids, &gp, n_ctx, (enum toy_dtype)kv_type, threads, json,
                                     special, trace_path, bf16, draft);
    }

    struct toy_llama *m;
    if (toy_llama_load(model, false, &m)) { fprintf(stderr, "toy generate: %s\n", toy_last_error()); return 1; }
    if (bf16) toy_cli_infer_bf16("generate", m, NULL);
    struct toy_lora *lora = NULL;
    if (lora_path && toy_lora_load(m, lora_path, lora_scale, false, &lora)) {
        fprintf(stderr, "toy generate: %s\n", toy_last_error());
        toy_llama_free(m);
        return 1;
    }
    struct toy_tokenizer *tok = NULL;
    if (toy_tokenizer_load_gguf(m->gguf, &tok) && !prompt_ids) {
        fprintf(stderr, "toy generate: %s has no usable tokenizer (%s); pass --prompt-ids\n", model, toy_last_error());
        toy_lora_free(lora);
        toy_llama_free(m);
        return 1;
    }
    struct toy_tokens ids = {0};
    int rc = 0;
    if (prompt_ids) {
        if ((rc = toy_cli_parse_prompt_ids(prompt_ids, &ids))) goto done;
    } else {
        unsigned flags = (special ? TOY_ENCODE_PARSE_SPECIAL : 0) |
                         (bos && toy_tokenizer_add_bos(tok) ? TOY_ENCODE_ADD_BOS : 0);
        const char *text = prompt ? prompt : "";
        if (toy_tokenizer_encode(tok, text, strlen(text), flags, &ids)) {
            fprintf(stderr, "toy generate: %s\n", toy_last_error());
            rc = 1;
            goto done;
        }
        if (ids.n == 0 && toy_tokenizer_bos(tok) >= 0) { /* an empty prompt starts from BOS */
            ids.ids = malloc(sizeof *ids.ids);
            ids.ids[0] = toy_tokenizer_bos(tok);
            ids.n = ids.cap = 1;
        }
    }
    if (n_ctx > m->cfg.max_ctx) /* the generator takes the model's context then */
        fprintf(stderr, "toy generate: note: --ctx %lld is past the model's context of %lld tokens: using %lld\n",
                (long long)n_ctx, (long long)m->cfg.max_ctx, (long long)m->cfg.max_ctx);
    struct toy_threadpool *tp = toy_threadpool_new(threads);
    struct toy_generator *gen;
    if (toy_generator_new_kv(m, tok, n_ctx, (enum toy_dtype)kv_type, tp, &gen)) {
        fprintf(stderr, "toy generate: %s\n", toy_last_error());
        rc = 1;
    } else {
        struct toy_cli_draft_opts dopt = {draft, n_ctx, (enum toy_dtype)kv_type, tp};
        rc = toy_cli_run_generator(gen, &ids, &gp, prompt, json, trace_path, NULL, &dopt);
        toy_generator_free(gen);
    }
    toy_threadpool_free(tp);
done:
    toy_tokens_free(&ids);
    toy_tokenizer_free(tok);
    toy_lora_free(lora);
    toy_llama_free(m);
    return rc;
}
