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

#include "generate-gpt2.h"
#include "progress.h"
#include "json-out.h"
#include "toy/finetune.h"
#include "toy/generate.h"
#include "toy/gguf.h"
#include "toy/models.h"
#include "toy/trace.h"
#include "toy/toy.h"

static int usage(void) {
    fprintf(stderr,
            "usage: toy generate -m MODEL.gguf [-p PROMPT | --prompt-ids \"1 2 3\"] [-n 64]\n"
            "                    [--temp 0.8] [--top-k 40] [--top-p 0.95] [--min-p 0] [--repeat-penalty 1]\n"
            "                    [--frequency-penalty 0] [--presence-penalty 0] [--seed 42] [--stop STR]...\n"
            "                    [--ctx N] [--threads N] [--no-bos] [--special] [--json] [--trace out.json]\n"
            "                    [--kv-type f16|f32]   (cache type, default f16)\n"
            "                    [--lora ADAPTER.gguf [--lora-scale 1]]\n"
            "Temperature 0 is greedy. Stops at the model's end-of-generation token, a stop string, or -n.\n");
    return 2;
}

struct out {
    bool json;
    json_t *ids, *lps;
    struct toy_tokens gen;
};

static bool on_token(void *ud, int32_t id, const char *text, size_t len, float lp) {
    struct out *o = ud;
    if (o->json) {
        if (id >= 0) {
            json_array_append_new(o->ids, json_integer(id));
            json_array_append_new(o->lps, json_real(lp));
        }
    } else if (len) {
        fwrite(text, 1, len, stdout);
        fflush(stdout);
    }
    return true;
}

int toy_cmd_generate(int argc, char **argv) {
    const char *model = NULL, *prompt = NULL, *prompt_ids = NULL, *lora_path = NULL, *trace_path = NULL;
    float lora_scale = 1.0f;
    const char *stops[16];
    int n_stop = 0, threads = 0;
    int64_t n_ctx = 0;
    bool json = false, bos = true, special = false;
    int kv_type = TOY_F16; /* half the cache memory and decode attention traffic; llama.cpp's default too */
    struct toy_generate_params gp = {.n_predict = 64,
                                     .sampling = {.temperature = 0.8f, .top_k = 40, .top_p = 0.95f, .seed = 42}};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(); return 0; }
        if (!strcmp(a, "--json")) { json = true; continue; }
        if (!strcmp(a, "--no-bos")) { bos = false; continue; }
        if (!strcmp(a, "--special")) { special = true; continue; }
        if (!strcmp(a, "--ignore-eos")) { gp.ignore_eos = true; continue; }
        if (i + 1 >= argc) { fprintf(stderr, "toy generate: %s needs a value\n", a); return 2; }
        const char *v = argv[++i];
        char *end = NULL;
        double x = strtod(v, &end);
        bool num = end != v && !*end && isfinite(x);
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--lora")) lora_path = v;
        else if (!strcmp(a, "--lora-scale") && num) lora_scale = (float)x;
        else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) prompt = v;
        else if (!strcmp(a, "--prompt-ids")) prompt_ids = v;
        else if (!strcmp(a, "--stop")) { if (n_stop < 16) stops[n_stop++] = v; }
        else if (!strcmp(a, "--trace")) trace_path = v;
        else if (!strcmp(a, "--kv-type")) {
            kv_type = toy_dtype_from_name(v);
            if (kv_type != TOY_F32 && kv_type != TOY_F16) { fprintf(stderr, "toy generate: --kv-type f32|f16\n"); return 2; }
        }
        else if (!num) { fprintf(stderr, "toy generate: bad number '%s' for %s\n", v, a); return 2; }
        else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) gp.n_predict = (int32_t)x;
        else if (!strcmp(a, "--temp") || !strcmp(a, "--temperature")) gp.sampling.temperature = (float)x;
        else if (!strcmp(a, "--top-k")) gp.sampling.top_k = (int32_t)x;
        else if (!strcmp(a, "--top-p")) gp.sampling.top_p = (float)x;
        else if (!strcmp(a, "--min-p")) gp.sampling.min_p = (float)x;
        else if (!strcmp(a, "--repeat-penalty")) gp.sampling.repeat_penalty = (float)x;
        else if (!strcmp(a, "--frequency-penalty")) gp.sampling.frequency_penalty = (float)x;
        else if (!strcmp(a, "--presence-penalty")) gp.sampling.presence_penalty = (float)x;
        else if (!strcmp(a, "--seed")) gp.sampling.seed = (uint64_t)x;
        else if (!strcmp(a, "--ctx")) n_ctx = (int64_t)x;
        else if (!strcmp(a, "--threads")) threads = (int)x;
        else { fprintf(stderr, "toy generate: unknown flag %s\n", a); return usage(); }
    }
    if (!model) { fprintf(stderr, "toy generate: -m MODEL is required\n"); return usage(); }
    if (toy_sampler_params_check(&gp.sampling)) { fprintf(stderr, "toy generate: %s\n", toy_last_error()); return 2; }
    char resolved[4096];
    if (toy_model_resolve(model, resolved, sizeof resolved)) { fprintf(stderr, "toy generate: %s\n", toy_last_error()); return 1; }
    model = resolved; /* a path, or a name from `toy models` */
    gp.stop = stops;
    gp.n_stop = n_stop;
    if (toy_cli_is_gpt2(model)) /* GPT-2 has its own model and generator */
        return toy_cli_generate_gpt2(model, prompt, prompt_ids, &gp, n_ctx, threads, json);

    struct toy_llama *m;
    if (toy_llama_load(model, false, &m)) { fprintf(stderr, "toy generate: %s\n", toy_last_error()); return 1; }
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
    struct toy_threadpool *tp = toy_threadpool_new(threads);
    struct toy_generator *gen;
    if (toy_generator_new_kv(m, tok, n_ctx, (enum toy_dtype)kv_type, tp, &gen)) {
        fprintf(stderr, "toy generate: %s\n", toy_last_error());
        rc = 1;
    } else {
        struct toy_trace *tr = NULL;
        if (trace_path && toy_trace_open(trace_path, 0, &tr)) fprintf(stderr, "toy generate: %s\n", toy_last_error());
        if (tr) toy_generator_set_trace(gen, tr);
        struct out o = {.json = json, .ids = json_array(), .lps = json_array()};
        if (!json && prompt) fputs(prompt, stdout);
        struct toy_generate_result r;
        if (toy_generate(gen, ids.ids, ids.n, &gp, on_token, &o, &r)) {
            fprintf(stderr, "\ntoy generate: %s\n", toy_last_error());
            rc = 1;
        } else if (json) {
            char *text = NULL;
            size_t tl = 0;
            int64_t n = (int64_t)json_array_size(o.ids);
            int32_t *gi = malloc(((size_t)n + 1) * sizeof *gi);
            for (int64_t i = 0; i < n; i++) gi[i] = (int32_t)json_integer_value(json_array_get(o.ids, (size_t)i));
            if (tok) toy_tokenizer_decode(tok, gi, n, TOY_DECODE_SKIP_SPECIAL, &text, &tl);
            const char *reasons[] = {"length", "eos", "stop", "caller", "context"};
            json_t *prompt_arr = json_array();
            for (int64_t i = 0; i < ids.n; i++) json_array_append_new(prompt_arr, json_integer(ids.ids[i]));
            struct rusage ru;
            getrusage(RUSAGE_SELF, &ru);
            json_t *res = json_pack("{s:s,s:o,s:o,s:o,s:o,s:s,s:f,s:f,s:f}", "format", "toy/generate-v1", "prompt_ids",
                                    prompt_arr, "ids", o.ids, "text", toy_cli_json_text(text, tl), "logprobs",
                                    o.lps, "finish_reason", reasons[r.reason], "prefill_tokens_per_s",
                                    r.prefill_s > 0 ? r.n_prompt / r.prefill_s : 0.0, "decode_tokens_per_s",
                                    r.decode_s > 0 ? r.n_generated / r.decode_s : 0.0, "peak_rss_mb",
                                    ru.ru_maxrss / 1024.0);
            if (toy_cli_print_json("generate", res, JSON_COMPACT)) rc = 1;
            free(text);
            free(gi);
            o.ids = o.lps = NULL;
        } else {
            putchar('\n');
            if (isatty(2)) {
                struct rusage ru;
                getrusage(RUSAGE_SELF, &ru);
                fprintf(stderr, "[%lld prompt tokens at %.1f tok/s, %lld generated at %.1f tok/s, peak RSS %.0f MB]\n",
                        (long long)r.n_prompt, r.prefill_s > 0 ? r.n_prompt / r.prefill_s : 0.0,
                        (long long)r.n_generated, r.decode_s > 0 ? r.n_generated / r.decode_s : 0.0,
                        ru.ru_maxrss / 1024.0);
            }
        }
        json_decref(o.ids);
        json_decref(o.lps);
        toy_generator_free(gen);
        if (tr && toy_trace_close(tr)) fprintf(stderr, "toy generate: %s\n", toy_last_error());
    }
    toy_threadpool_free(tp);
done:
    toy_tokens_free(&ids);
    toy_tokenizer_free(tok);
    toy_lora_free(lora);
    toy_llama_free(m);
    return rc;
}
