/* cmd-serve.c: `toy serve -m model.gguf`: an OpenAI-compatible HTTP server
 * (toy/serve.h; endpoints, flags and examples in docs/serve.md). Loads a
 * Llama-family or GPT-2 GGUF (weights mapped) and its tokenizer, then serves until
 * SIGINT or SIGTERM, which drain the requests in flight before exiting 0. */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "flags.h"
#include "generate-gpt2.h"
#include "paths.h"
#include "stop-signals.h"
#include "toy/bert.h"
#include "toy/models.h"
#include "toy/serve.h"
#include "toy/toy.h"

static int usage_to(FILE *out) {
    fprintf(out,
            "usage: toy serve -m MODEL.gguf [--host 127.0.0.1] [--port 8080] [--name ID] [--api-key KEY]\n"
            "                 [--chat-template NAME|JINJA|FILE] [--ctx N] [--parallel 4] [--queue 64] [--threads N]\n"
            "                 [--max-body BYTES] [--timeout SECONDS] [--max-connections 128] [--drain SECONDS]\n"
            "                 [--cors-origin '*'] [--runs DIR | --no-events] [--no-prefix-cache] [--kv-type f16|f32]\n"
            "                 [--responses 256] [--responses-dir DIR]\n"
            "                 [--pooling mean|cls|last] [--lookup N] [--draft FILE|NAME [--draft-max 8]\n"
            "                 [--draft-p-min 0.75]] [--quiet]\n"
            "Endpoints: GET /health, GET /v1/models, POST /v1/completions, POST /v1/chat/completions,\n"
            "POST /v1/responses, GET|DELETE /v1/responses/{id}, POST /v1/messages (Anthropic's), POST /v1/embeddings,\n"
            "GET /metrics.\n"
            "--port 0 picks a free port (printed on stderr).\n");
    return 2;
}
static int usage(void) { return usage_to(stderr); }

int toy_cmd_serve(int argc, char **argv) {
    struct toy_serve_options o = toy_serve_defaults();
    const char *model = NULL, *draft = NULL;
    const char *kv = NULL, *pooling = NULL;
    double p_min = o.draft_p_min;
    bool no_events = false;
    int64_t max_body = (int64_t)o.max_body;
    const struct toy_cli_flag flags[] = {
        TOY_FLAG_S("-m", &model), TOY_FLAG_S("--model", &model), TOY_FLAG_S("--host", &o.host),
        TOY_FLAG_S("--name", &o.model_name), TOY_FLAG_S("--api-key", &o.api_key),
        TOY_FLAG_S("--chat-template", &o.chat_template), TOY_FLAG_S("--cors-origin", &o.cors_origin),
        TOY_FLAG_S("--runs", &o.runs_dir), TOY_FLAG_S("--kv-type", &kv),
        TOY_FLAG_S("--pooling", &pooling), TOY_FLAG_S("--responses-dir", &o.responses_dir),
        TOY_FLAG_N("--port", TOY_CLI_INT, &o.port, 0, 65535), TOY_FLAG_N("-p", TOY_CLI_INT, &o.port, 0, 65535),
        TOY_FLAG_N("--ctx", TOY_CLI_I64, &o.n_ctx, 0, INT32_MAX), TOY_FLAG_N("-c", TOY_CLI_I64, &o.n_ctx, 0, INT32_MAX),
        TOY_FLAG_N("--parallel", TOY_CLI_INT, &o.n_slots, 1, 256), TOY_FLAG_N("-np", TOY_CLI_INT, &o.n_slots, 1, 256),
        TOY_FLAG_N("--queue", TOY_CLI_INT, &o.queue_size, 1, 1 << 20),
        TOY_FLAG_N("--responses", TOY_CLI_INT, &o.responses, 0, 1 << 20),
        TOY_FLAG_N("--lookup", TOY_CLI_INT, &o.lookup, 0, TOY_GENERATE_MAX_LOOKUP),
        TOY_FLAG_S("--draft", &draft), TOY_FLAG_N("--draft-max", TOY_CLI_INT, &o.draft_max, 1, TOY_GENERATE_MAX_LOOKUP),
        TOY_FLAG_N("--draft-p-min", TOY_CLI_F64, &p_min, 0, 1),
        TOY_FLAG_N("--threads", TOY_CLI_INT, &o.n_threads, 0, 1024), TOY_FLAG_N("-t", TOY_CLI_INT, &o.n_threads, 0, 1024),
        TOY_FLAG_N("--max-body", TOY_CLI_I64, &max_body, 1, 1LL << 40),
        TOY_FLAG_N("--timeout", TOY_CLI_INT, &o.timeout_s, 0, 1 << 30),
        TOY_FLAG_N("--max-connections", TOY_CLI_INT, &o.max_connections, 1, 1 << 16),
        TOY_FLAG_N("--drain", TOY_CLI_F64, &o.drain_s, 0, 1e6), TOY_FLAG_B("--no-events", &no_events),
        TOY_FLAG_B("--no-prefix-cache", &o.no_prefix_cache), TOY_FLAG_B("--quiet", &o.quiet), TOY_FLAG_END};
    int prc = toy_cli_parse("serve", argc, argv, flags, NULL, 0, NULL);
    if (prc == 1) return usage_to(stdout), 0;
    if (prc) return prc;
    if (no_events) o.runs_dir = NULL;
    o.max_body = (size_t)max_body;
    if (kv && strcmp(kv, "f16") && strcmp(kv, "f32")) { fprintf(stderr, "toy serve: --kv-type f16|f32\n"); return 2; }
    o.kv_f32 = kv && !strcmp(kv, "f32");
    if (pooling) { /* the model's pooling_type overruled */
        o.pooling = !strcmp(pooling, "mean") ? TOY_POOLING_MEAN : !strcmp(pooling, "cls") ? TOY_POOLING_CLS
                    : !strcmp(pooling, "last") ? TOY_POOLING_LAST : -2;
        if (o.pooling == -2) { fprintf(stderr, "toy serve: --pooling mean|cls|last, not '%s'\n", pooling); return 2; }
    }
    if (!model) { fprintf(stderr, "toy serve: -m MODEL is required\n"); return usage(); }
    o.draft_p_min = (float)p_min;
    char resolved[4096], dresolved[4096];
    if (toy_model_resolve(model, resolved, sizeof resolved)) { fprintf(stderr, "toy serve: %s\n", toy_last_error()); return 1; }
    model = resolved;
    if (draft && toy_model_resolve(draft, dresolved, sizeof dresolved)) {
        fprintf(stderr, "toy serve: --draft %s: %s\n", draft, toy_last_error());
        return 1;
    }

    char *tmpl_text = NULL; /* --chat-template FILE: its text */
    o.chat_template = toy_cli_template_source(o.chat_template, &tmpl_text);
    struct toy_llama *m = NULL;
    struct toy_gpt2 *g2 = NULL;
    struct toy_bert *enc = NULL; /* a BERT: embeddings only */
    bool bert = toy_cli_is_bert(model);
    if (bert && draft) {
        fprintf(stderr, "toy serve: %s is a text encoder (bert): it embeds, so --draft has nothing to draft for\n",
                model);
        free(tmpl_text);
        return 2;
    }
    if (bert ? toy_bert_load(model, &enc)
        : toy_cli_is_gpt2(model) ? toy_gpt2_load(model, false, &g2) : toy_llama_load(model, false, &m)) {
        fprintf(stderr, "toy serve: %s\n", toy_last_error());
        free(tmpl_text);
        return 1;
    }
    struct toy_tokenizer *tok = NULL, *dtok = NULL;
    if (toy_tokenizer_load_gguf(m ? m->gguf : g2 ? g2->gguf : enc->gguf, &tok)) {
        fprintf(stderr, "toy serve: %s has no usable tokenizer (%s); only token-id prompts will work\n", model,
                toy_last_error());
        tok = NULL;
    }
    if (draft) { /* a draft without a tokenizer is compared by its vocabulary's size */
        if (toy_cli_is_gpt2(dresolved) ? toy_gpt2_load(dresolved, false, &o.draft_gpt2)
                                       : toy_llama_load(dresolved, false, &o.draft)) {
            fprintf(stderr, "toy serve: --draft %s: %s\n", draft, toy_last_error());
            toy_tokenizer_free(tok);
            toy_llama_free(m);
            toy_gpt2_free(g2);
            free(tmpl_text);
            return 1;
        }
        if (toy_tokenizer_load_gguf(o.draft ? o.draft->gguf : o.draft_gpt2->gguf, &dtok)) dtok = NULL;
        o.draft_tok = dtok;
    }
    toy_cli_stop_signals_install(); /* the first stop drains; see stop-signals.h for a second one */
    signal(SIGPIPE, SIG_IGN);
    o.stop = &toy_cli_stop;
    int rc = 0;
    if (m ? toy_serve(m, tok, model, &o) : g2 ? toy_serve_gpt2(g2, tok, model, &o) : toy_serve_bert(enc, tok, model, &o)) {
        fprintf(stderr, "toy serve: %s\n", toy_last_error());
        rc = 1;
    }
    toy_tokenizer_free(tok);
    toy_tokenizer_free(dtok);
    toy_llama_free(m);
    toy_gpt2_free(g2);
    toy_bert_free(enc);
    toy_llama_free(o.draft);
    toy_gpt2_free(o.draft_gpt2);
    free(tmpl_text);
    return rc;
}
