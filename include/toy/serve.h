/* toy/serve.h: an OpenAI-compatible HTTP server for a Llama-family model
 * (what `toy serve` runs).
 *
 * Endpoints: GET /health, GET /v1/models, POST /v1/completions,
 * POST /v1/chat/completions, POST /v1/embeddings, GET /metrics (Prometheus
 * text). Completions and chat stream as Server-Sent Events in OpenAI's
 * chunk format when the body says "stream": true. The API, every parameter
 * and flag, and curl examples are in docs/serve.md.
 *
 * Concurrency: HTTP runs on GNU libmicrohttpd, one thread per connection
 * (they only parse, wait and write); one engine thread owns the model and
 * decodes up to n_slots requests together, one shared decode step per token
 * (continuous batching: a request joins or leaves the batch between steps,
 * each with its own KV-cache slot and position). Requests beyond the slots
 * wait in a bounded queue; when it is full the server answers 503 with
 * Retry-After. A slot keeps its tokens after a request ends, and a new
 * request goes to the free slot sharing the longest prefix with its prompt,
 * so only the rest is prefilled (prefix cache).
 *
 *     struct toy_llama *m;  toy_llama_load("model.gguf", false, &m);
 *     struct toy_tokenizer *tok;  toy_tokenizer_load_gguf(m->gguf, &tok);
 *     static volatile int stop;   // set by a SIGTERM handler
 *     struct toy_serve_options o = toy_serve_defaults();
 *     o.port = 8080;
 *     o.stop = &stop;
 *     if (toy_serve(m, tok, "model.gguf", &o)) fprintf(stderr, "%s\n", toy_last_error());
 *
 * toy_serve returns when *stop becomes nonzero: it stops accepting
 * connections, lets the requests in flight finish (at most drain_s
 * seconds), writes run_end to the event stream and frees everything.
 */
#ifndef TOY_SERVE_H
#define TOY_SERVE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "toy/gpt2.h"
#include "toy/llama.h"
#include "toy/status.h"
#include "toy/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

struct toy_serve_options {
    const char *host;          /* address to bind ("127.0.0.1"); "::1" etc. for IPv6 */
    int port;                  /* 0: any free port (the bound port is printed and in *bound_port) */
    const char *model_name;    /* id in /v1/models and responses; NULL: the file's base name */
    const char *api_key;       /* NULL: no auth; else the /v1 endpoints and /metrics need "Authorization: Bearer KEY" */
    const char *chat_template; /* built-in name or Jinja source; NULL: the model's own, else chatml */
    const char *cors_origin;   /* Access-Control-Allow-Origin ("*") */
    int64_t n_ctx;             /* positions per sequence; 0: the model's, at most 4096 */
    int n_slots;               /* sequences decoded together (4) */
    int queue_size;            /* requests waiting beyond the slots before 503 (64) */
    int n_threads;             /* compute threads; 0: all cores */
    size_t max_body;           /* request body limit in bytes (4 MiB); larger: 413 */
    int timeout_s;             /* idle connection timeout and per-request time limit (600) */
    int max_connections;       /* concurrent connections (128) */
    double drain_s;            /* on stop: how long requests in flight may still run (30) */
    const char *runs_dir;      /* event stream in runs_dir/<id>/events.jsonl ("runs"); NULL: none */
    int pooling;               /* embeddings' pooling (enum toy_pooling); -1: the model's (its pooling_type, else mean) */
    int responses;             /* Responses API: the newest this many responses are kept (in memory, and 256 MiB
                                * of them at most) for previous_response_id and GET/DELETE /v1/responses/{id}
                                * (256; 0: none) */
    const char *responses_dir; /* and each of them is a file in this folder (made if need be), read again by the next
                                * server on it, so previous_response_id outlives a restart (NULL: memory only; one
                                * server per folder) */
    bool no_prefix_cache;
    bool kv_f32;               /* KV caches in f32 (twice the memory); default f16, as toy generate */
    int lookup;                /* prompt lookup: each decoding slot drafts up to this many tokens a step, copied
                                * from its own text, and keeps those the model would sample anyway (0: off; ..15) */
    struct toy_llama *draft;   /* a smaller model of the model's vocabulary that drafts for each slot where lookup
                                * finds nothing, greedily (NULL: none); or draft_gpt2. Must outlive toy_serve */
    struct toy_gpt2 *draft_gpt2;
    const struct toy_tokenizer *draft_tok; /* the draft's tokenizer (may be NULL: then only the vocabulary sizes are
                                            * compared, within 256) */
    int draft_max;             /* a draft model's drafts: at most this many tokens (0: 8; ..15) */
    float draft_p_min;         /* it stops before a token it gives less than this (0.75; 0: never) */
    bool quiet;                /* no access log on stderr */
    volatile int *stop;        /* toy_serve returns once *stop != 0 (may be NULL: runs until an error) */
    int *bound_port;           /* out (may be NULL): the port actually bound */
};

struct toy_serve_options toy_serve_defaults(void);

/* Serves until *o->stop. model_path names the model (its base name is the
 * default model id). Errors: TOY_ERR_IO (cannot bind), TOY_ERR_INVALID_ARG
 * (bad options or chat template), TOY_ERR_NOMEM. */
enum toy_status toy_serve(struct toy_llama *m, const struct toy_tokenizer *tok, const char *model_path,
                          const struct toy_serve_options *o);
/* The same for a GPT-2 model (toy/gpt2.h). */
enum toy_status toy_serve_gpt2(struct toy_gpt2 *m, const struct toy_tokenizer *tok, const char *model_path,
                               const struct toy_serve_options *o);
/* The same for a BERT encoder (toy/bert.h): /v1/embeddings only (the
 * generating endpoints answer 400), each input encoded whole, so at most
 * n_ctx (the model's positions) tokens long. */
struct toy_bert;
enum toy_status toy_serve_bert(struct toy_bert *m, const struct toy_tokenizer *tok, const char *model_path,
                               const struct toy_serve_options *o);

#ifdef __cplusplus
}
#endif
#endif
