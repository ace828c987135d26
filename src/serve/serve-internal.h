/* serve-internal.h: what the pieces of `toy serve` share: the generation
 * engine (serve-engine.c: slots, request queue, continuous batching, prefix
 * cache), the server's forward pass (serve-forward.c), the OpenAI JSON layer
 * (serve-openai.c) and the HTTP layer (serve-http.c). The public surface is
 * include/toy/serve.h; the API is specified by OpenAI's reference
 * (https://platform.openai.com/docs/api-reference) and docs/serve.md.
 *
 * Threads: one engine thread owns the model, the KV slots and the thread
 * pool; HTTP connection threads only submit jobs and read their output.
 * A job's output fields are guarded by job->mu and signalled on job->cv.
 */
#ifndef TOY_SERVE_INTERNAL_H
#define TOY_SERVE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "toy/bert.h"
#include "toy/generate.h"
#include "toy/json-grammar.h"
#include "toy/gpt2.h"
#include "toy/llama.h"
#include "toy/sampler.h"
#include "toy/serve.h"
#include "toy/tokenizer.h"

#define SRV_MAX_TOP_LOGPROBS 20
#define SRV_MAX_STOP 16

/* ---- the model ----------------------------------------------------------------- */

/* What the server runs: a Llama-family model or a GPT-2 (one of the two is
 * set), with the sizes the API and the engine need. */
struct srv_model {
    struct toy_llama *llama;
    struct toy_gpt2 *gpt2;
    struct toy_bert *bert;    /* an encoder: embeddings only, each input whole (no cache, no generation) */
    const char *arch;
    int64_t vocab, d_model, n_layers, n_heads, n_kv_heads, d_head, d_ff, max_ctx;
    enum toy_pooling pooling; /* how embeddings pool the positions */
};
struct srv_model toy_srv_model_llama(struct toy_llama *m);
struct srv_model toy_srv_model_gpt2(struct toy_gpt2 *m);
struct srv_model toy_srv_model_bert(struct toy_bert *m);
/* the model's matrices in the layout of this CPU's inference kernels */
enum toy_status toy_srv_pack(const struct srv_model *m);
/* a KV cache of n_seq sequences of n_ctx positions (TOY_F32 or TOY_F16) */
enum toy_status toy_srv_cache_init(const struct srv_model *m, struct toy_kv_cache *c, int64_t n_ctx, int64_t n_seq,
                                   enum toy_dtype type);

/* ---- forward pass ------------------------------------------------------------- */

enum srv_out {
    SRV_OUT_LOGITS_LAST, /* logits {vocab, 1, B} of each sequence's last position */
    SRV_OUT_LOGITS_ALL,  /* logits of every position {vocab, T, B} */
    SRV_OUT_MEAN_HIDDEN, /* final-norm hidden states averaged over positions {d, 1, B} */
    SRV_OUT_FIRST_HIDDEN, /* the first position's final-norm hidden state {d, 1, B} */
    SRV_OUT_LAST_HIDDEN, /* the last position's */
};

/* The sequences a pass reads through KV caches: n of them, each with a cache
 * of its own (n_seq 1, its own n_past). off NULL: tokens {T, n}, T positions
 * each. Else tokens {R, 1}, and sequence b's positions are rows
 * [off[b], off[b+1]) (R = off[n]): a decode step where each sequence checks
 * a draft of its own length. */
struct srv_seqs {
    struct toy_kv_cache *const *caches;
    const int64_t *off;
    int n;
    /* with off and n > 1: the caches are sequences of pool (toy_kv_cache_view_seq), seq {R} i32 each row's, and
     * the pass stores and attends every row at once (toy_kv_store_rows, toy_attention_rows: row r at pos[r]) */
    const struct toy_kv_cache *pool;
    struct toy_tensor *seq;
};

/* The model's forward of tokens {T, B} at positions pos {T*B}. With seqs,
 * each sequence's keys and values are stored into its cache from its n_past,
 * and its queries attend over them: sequences at different positions share
 * one graph (every projection is one matmul over all the rows; attention runs
 * per sequence). Without: plain causal attention over the T tokens. */
struct toy_tensor *toy_srv_forward(struct toy_ctx *ctx, const struct srv_model *m, struct toy_tensor *tokens,
                                   struct toy_tensor *pos, const struct srv_seqs *seqs, enum srv_out out,
                                   int64_t row_group);
/* The row group decode batches need so that each sequence gets the numbers
 * it gets alone: 8 for models with Q8_0/Q4_0 weights, 0 (no split) otherwise
 * (serve-forward.c explains). With row_group > 0, toy_srv_forward multiplies
 * in groups of at most row_group rows (positions x sequences). */
int64_t toy_srv_row_group(const struct srv_model *m);

/* ---- jobs ---------------------------------------------------------------------- */

enum srv_job_kind { SRV_JOB_GENERATE, SRV_JOB_EMBED };

/* One generated token as the client sees it. text_off/len: the text emitted
 * with this token (held-back text while a stop string may be forming comes
 * out later; id -1 marks the final flush of held text). char_off: where the
 * token's own text starts in the completion, in characters (logprobs'
 * text_offset); eog: the end-of-generation token, which logprobs leave out. */
struct srv_token {
    int32_t id;
    float logprob;
    size_t text_off, text_len, char_off;
    bool eog;
    int n_top;
    int32_t top_id[SRV_MAX_TOP_LOGPROBS];
    float top_lp[SRV_MAX_TOP_LOGPROBS];
};

struct srv_job {
    /* input: set before toy_srv_engine_submit, read-only afterwards */
    enum srv_job_kind kind;
    int32_t *prompt;                 /* generate: the prompt ids */
    int64_t n_prompt;
    struct toy_sampler_params sp;
    int64_t max_tokens;              /* < 0: until EOS or the context is full; 0: none (prompt only) */
    bool continues;                  /* the text continues the prompt (completions): an SPM model's
                                        first token keeps its leading space */
    char *stop[SRV_MAX_STOP];
    int n_stop, n_user_stop;         /* the request's own stop strings first, then the template's end-of-turn texts */
    int top_logprobs;                /* 0..SRV_MAX_TOP_LOGPROBS alternatives per token */
    bool want_logprob;               /* each token's log-probability is computed (logprobs, best_of's ranking);
                                        else it is 0 */
    bool ignore_eos;
    bool streamed;                   /* its reader takes tokens as they come: each one wakes it (else the end) */
    bool keep_special;               /* special tokens are decoded as text: the reply's markers (chat-reply.h) */
    struct toy_json_grammar *grammar; /* response_format: the reply is JSON it takes (NULL: free text) */
    const char *grammar_after[2];    /* it applies once these texts have been generated, in order (static) */
    int32_t *bias_id;                /* logit_bias: added to these logits before sampling */
    float *bias;
    int n_bias;
    int timeout_s;                   /* the longest it may generate, from taking a slot; 0: no limit */
    bool score_prompt;               /* the prompt's tokens get their log-probabilities too (echo with logprobs):
                                        prefilled whole, no prefix-cache reuse */
    int32_t *pred;                   /* prediction (OpenAI's Predicted Outputs): the text expected, as ids; its
                                        stretches are drafted where the reply follows them */
    int64_t n_pred;
    int32_t **inputs;                /* embed: n_inputs id lists */
    int64_t *n_input;
    int n_inputs;

    /* output, under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct srv_token *toks;
    int64_t n_toks, cap_toks;
    struct srv_token *ptoks;         /* score_prompt: the prompt's tokens, each with its log-probability given the
                                        tokens before it (the first's 0, n_top 0), set whole once prefilled */
    int64_t n_ptoks;
    char *text;
    size_t text_len, text_cap;
    int64_t n_generated;             /* sampled tokens (EOS included) */
    int64_t n_cached;                /* prompt tokens served from the prefix cache */
    int64_t pred_accepted, pred_rejected; /* the prediction's drafted tokens kept and refused */
    int64_t n_drafted, n_draft_kept;      /* all drafted tokens (lookup, draft model, prediction), those kept */
    size_t n_calls;                  /* tool calls in the split reply (set by the API layer) */
    size_t echo_chars;               /* echo: the prompt's text in characters, plus 1, once known (the API layer) */
    bool done, timed_out;
    enum toy_stop_reason reason;
    int stop_hit;                    /* reason TOY_STOP_STRING: which of stop[] ended the text (-1: none) */
    enum toy_status err;
    char errmsg[256];
    float *embeddings;               /* embed: n_inputs x dim */
    int64_t dim;
    double t_submit, t_start, t_first, t_end;

    atomic_bool cancel;              /* set by the HTTP side: the client went away */
    atomic_int refs;
};

double toy_srv_now(void);
struct srv_job *toy_srv_job_new(enum srv_job_kind kind);
/* Drops a reference; the last one frees the job. */
void toy_srv_job_unref(struct srv_job *j);

/* ---- engine --------------------------------------------------------------------- */

struct srv_metrics {
    atomic_llong prompt_tokens, cached_tokens, completion_tokens, embed_tokens;
    atomic_llong jobs_done, jobs_cancelled, decode_steps, decode_rows;
    atomic_llong draft_tokens, draft_accepted; /* drafted tokens (lookup, draft model, predictions), those kept */
    atomic_int queue_depth, active;
    double ttft_sum, latency_sum;    /* under the engine's metrics lock */
    int64_t ttft_count, latency_count;
    int64_t ttft_buckets[12], latency_buckets[12];
    double tokens_per_s;             /* aggregate decode rate, moving average */
    double decode_s;                 /* time in decode steps */
    pthread_mutex_t mu;
};
extern const double toy_srv_buckets[12];

struct srv_engine;

struct srv_engine_opts {
    int n_slots;         /* sequences decoded together */
    int queue_size;      /* waiting jobs beyond the running ones */
    int64_t n_ctx;       /* positions per slot */
    int n_threads;
    bool prefix_cache;
    bool kv_f32;         /* KV caches in f32 (else f16) */
    int lookup;          /* prompt lookup: drafts of at most this many tokens per slot and step (0: none; ..15) */
    const struct srv_model *draft; /* a draft model of the same vocabulary (NULL: none); must outlive the engine */
    int draft_max;       /* its drafts' tokens at most (0: 8; ..15) */
    float draft_p_min;   /* it stops before a token it gives less (0..1) */
};

/* m must outlive the engine */
enum toy_status toy_srv_engine_new(const struct srv_model *m, const struct toy_tokenizer *tok,
                                   const struct srv_engine_opts *o, struct srv_metrics *metrics,
                                   struct srv_engine **out);
/* Stops the engine thread: jobs still queued or running end (cancelled);
 * later submits get TOY_ERR_STATE. Idempotent. */
void toy_srv_engine_stop(struct srv_engine *e);
/* Stops (if needed) and frees everything. NULL is a no-op. */
void toy_srv_engine_free(struct srv_engine *e);
/* Queues a job (taking a reference). TOY_ERR_RANGE: the queue is full;
 * TOY_ERR_STATE: the engine is stopping. */
enum toy_status toy_srv_engine_submit(struct srv_engine *e, struct srv_job *j);
/* Jobs queued or running. */
int toy_srv_engine_load(struct srv_engine *e);
int64_t toy_srv_engine_n_ctx(const struct srv_engine *e);
/* Bytes of all the slots' KV caches. */
size_t toy_srv_engine_kv_bytes(const struct srv_engine *e);

/* ---- the OpenAI API (serve-openai.c) -------------------------------------------------- */

#include <jansson.h>

#include "toy/chat-reply.h"

struct toy_chat_template;

/* What the API layer needs to know about the server. */
struct srv_store;

struct srv_api {
    struct srv_store *store;        /* the Responses kept for previous_response_id (NULL: none) */
    const struct srv_model *m;
    const struct toy_tokenizer *tok;
    struct toy_chat_template *tmpl; /* NULL: chat is not available */
    struct toy_chat_syntax syntax;  /* how the template's model writes reasoning and tool calls */
    char *eot_stops[4];             /* the template's end-of-turn text, as stop strings */
    int n_eot_stops;
    const char *model_name;
    int64_t n_ctx;
    int timeout_s;
};

/* SRV_EP_RESPONSES and SRV_EP_MESSAGES (and its token count) are parsed into a chat request (ep SRV_EP_CHAT,
 * resp_body or anth_body set) */
enum srv_endpoint { SRV_EP_COMPLETIONS, SRV_EP_CHAT, SRV_EP_EMBEDDINGS, SRV_EP_RESPONSES, SRV_EP_MESSAGES,
                    SRV_EP_COUNT_TOKENS };

/* An OpenAI-style error: {"error": {"message", "type", "param", "code"}}. */
struct srv_error {
    int http;
    const char *type;  /* "invalid_request_error", "not_found_error", "server_error", ... */
    const char *code;  /* NULL or "context_length_exceeded", "model_not_found", ... */
    char param[64];
    char msg[512];
};
bool toy_srv_err(struct srv_error *e, int http, const char *type, const char *code, const char *param,
                 const char *fmt, ...) __attribute__((format(printf, 6, 7)));
json_t *toy_srv_error_json(const struct srv_error *e);

/* A parsed request: the job to run and how to answer. */
struct srv_request {
    enum srv_endpoint ep;
    struct srv_job *job;
    bool stream, include_usage;
    bool logprobs;          /* completions: "logprobs": N given; chat: "logprobs": true */
    bool normalize, base64; /* embeddings */
    int64_t n_tokens;       /* embeddings: input tokens */
    bool parse_reply;       /* chat: the reply is split into reasoning, content and tool calls */
    struct toy_chat_syntax syn;
    char **tool_names;      /* syn.tool_names, owned */
    json_t *resp_body;      /* a Responses request (POST /v1/responses, run as a chat): its body, owned */
    json_t *resp_conv;      /* ... its conversation as chat messages, instructions left out, to keep with the
                               response (NULL: "store": false, or no store), owned */
    json_t *resp_input;     /* ... and its input items (references resolved), to keep with it, owned */
    json_t *anth_body;      /* an Anthropic Messages request (POST /v1/messages, run as a chat): its body, owned */
    bool count_only;        /* count_tokens: the prompt is all it needs (job->prompt; no context limit, no sampling) */
    int n_choices;          /* chat, completions: "n", each choice a job of its own (the first is job) */
    int best_of;            /* completions: jobs run (>= n_choices), the n_choices best kept */
    bool echo;              /* completions: the text starts with the prompt's (with logprobs: its tokens scored) */
    int n_prompts, prompt_at; /* completions: the prompts the request sends (1: one), and this one's index */
};

/* What a chat stream has sent of the split reply so far. */
struct srv_sent {
    /* the reasoning and content bytes sent, the calls begun, and of the last one the argument bytes sent and
     * whether it is still open */
    size_t reasoning, content, calls, args;
    bool call_open;
    /* a Responses stream: its output items so far (owned), which is open (0: none, 1: reasoning, 2: the
     * message), and the next event's sequence number */
    json_t *items;
    int open, seq;
    int call_item; /* a Responses stream: the open call's item */
};

/* Parses and validates a request body; on false, *err says why (4xx). */
bool toy_srv_parse_request(const struct srv_api *api, enum srv_endpoint ep, const char *body, size_t len,
                           struct srv_request *r, struct srv_error *err);
/* The same for the prompt_at-th of a completion's prompts (r->n_prompts of them) */
bool toy_srv_parse_request_at(const struct srv_api *api, enum srv_endpoint ep, const char *body, size_t len,
                              int prompt_at, struct srv_request *r, struct srv_error *err);
void toy_srv_request_free(struct srv_request *r);

/* A JSON string of s[0..n), invalid UTF-8 replaced. */
json_t *toy_srv_jstr(const char *s, size_t n);
/* A chat request's tool: {"type": "function", "function": {name, description, parameters, strict}}, with the
 * keys whose values are not NULL (the values referenced, not taken). */
json_t *toy_srv_chat_tool(json_t *name, json_t *description, json_t *parameters, json_t *strict);
/* The string values of key in each object of parts, joined (NULL: out of memory; parts checked by the caller). */
json_t *toy_srv_join_text(json_t *parts, const char *key);
/* The reply so far (final: all of it) split into reasoning, content and calls (toy/chat-reply.h), or all
 * content when the request does not split it; false when out of memory. */
bool toy_srv_reply_split(const struct srv_request *r, const struct srv_job *j, bool final, struct toy_chat_reply *p);

/* The Responses API (serve-responses.c): a request body as a chat request's (*out, owned, even on false);
 * the chat parser's error names as the Responses request's; the whole response object; and the stream's
 * events (arrays of event objects with "type"): its start, what the reply so far adds (final: the rest
 * and response.completed), a failure. */
/* The responses kept for previous_response_id and GET/DELETE /v1/responses/{id}: the newest max of them (and
 * at most max_bytes of JSON), in memory until the server stops. Thread-safe. */
#define SRV_STORE_BYTES ((size_t)256 << 20) /* the kept responses' JSON, at most */
/* A store of at most max responses and max_bytes of their JSON; with dir (may be NULL) each is also a file there,
 * and those the folder holds are kept again, the most recently used first. Errors (TOY_ERR_IO, naming dir): the
 * folder cannot be made or written, or another store has it open. */
enum toy_status toy_srv_store_open(int max, size_t max_bytes, const char *dir, struct srv_store **out);
void toy_srv_store_free(struct srv_store *st);
/* a copy of the response object (NULL: none; 404), or deletes it (false: none) */
json_t *toy_srv_store_get(struct srv_store *st, const char *id);
/* the list object of GET /v1/responses/{id}/input_items: its input items, `limit` of them (1-100) from after the
 * item `after` or before the item `before` (either may be NULL) in `order` ("asc" or "desc"); NULL: no such
 * response (*bad NULL), or a cursor that names none of its items (*bad: the parameter) */
json_t *toy_srv_store_input_items(struct srv_store *st, const char *id, int limit, bool asc, const char *after,
                                  const char *before, const char **bad);
bool toy_srv_store_delete(struct srv_store *st, const char *id);
/* the responses kept, and their JSON's bytes (0 without a store) */
void toy_srv_store_stats(struct srv_store *st, int *n, size_t *bytes);
/* body's Responses request as a chat request (*out), its conversation to keep into r->resp_conv */
bool toy_srv_responses_to_chat(const struct srv_api *api, json_t *body, json_t **out, struct srv_request *r,
                               struct srv_error *err);
void toy_srv_responses_param(struct srv_error *err);
json_t *toy_srv_responses_json(const struct srv_api *api, const struct srv_request *r, struct srv_job *j,
                               const char *id, long created);
json_t *toy_srv_responses_start(const struct srv_api *api, const struct srv_request *r, struct srv_sent *s,
                                const char *id, long created);
json_t *toy_srv_responses_events(const struct srv_api *api, const struct srv_request *r, struct srv_job *j, bool final,
                                 struct srv_sent *s, const char *id, long created);
json_t *toy_srv_responses_failed(const struct srv_api *api, const struct srv_request *r, struct srv_sent *s,
                                 const char *id, long created, const char *msg);

/* Anthropic's Messages API (serve-anthropic.c): a request body as a chat request's (*out, owned, even on
 * false; count_only: max_tokens may be absent); the whole message; the stream's events (arrays of objects
 * with "type"): its start, what the reply so far adds (final: the rest, message_delta, message_stop); and
 * Anthropic's error object. */
bool toy_srv_messages_to_chat(json_t *body, bool count_only, json_t **out, struct srv_error *err);
json_t *toy_srv_messages_json(const struct srv_api *api, const struct srv_request *r, struct srv_job *j, const char *id);
json_t *toy_srv_messages_start(const struct srv_api *api, const struct srv_request *r, const struct srv_job *j,
                               const char *id);
json_t *toy_srv_messages_events(const struct srv_api *api, const struct srv_request *r, struct srv_job *j, bool final,
                                struct srv_sent *s, const char *id);
json_t *toy_srv_messages_error_json(const struct srv_error *e);
/* The events that end a Messages stream the model failed in (an api_error event). */
json_t *toy_srv_messages_failed(const char *msg);

/* A step of a streamed tool call: call k (c, NULL when the parse lost it) begins now (its name to send),
 * adds n bytes of arguments at delta, and/or ends now. */
struct srv_call_step {
    size_t k;
    const struct toy_chat_call *c;
    bool begin, end;
    const char *delta;
    size_t n;
};
/* What the parse p adds to the calls *s has sent (updated): the steps in order into out (p->n_calls + 1 at
 * most); the first may continue the call already open, the others are calls begun now. */
size_t toy_srv_call_steps(const struct toy_chat_reply *p, struct srv_sent *s, bool final, struct srv_call_step *out);

/* "stop", "length"; "tool_calls" when the reply made some (j->n_calls). */
const char *toy_srv_finish_reason(const struct srv_job *j);
/* The whole response of a finished job (the caller holds j->mu; a split reply sets j->n_calls). */
json_t *toy_srv_response_json(const struct srv_api *api, const struct srv_request *r, struct srv_job *j,
                              const char *id, long created);
/* One SSE chunk object for the token records [from, to) (NULL if they carry nothing to send); a split chat
 * reply sends what its parse so far adds to *sent. */
json_t *toy_srv_chunk_json(const struct srv_api *api, const struct srv_request *r, struct srv_job *j, int64_t from,
                           int64_t to, struct srv_sent *sent, const char *id, long created);
/* A split chat reply's last delta: what only its end decided (NULL if nothing). Before the finish chunk. */
json_t *toy_srv_chunk_rest(const struct srv_api *api, const struct srv_request *r, struct srv_job *j,
                           struct srv_sent *sent, const char *id, long created);
/* The first chunk of a chat stream (role), the last one (finish_reason) and the usage chunk. */
json_t *toy_srv_chunk_role(const struct srv_api *api, const struct srv_request *r, const char *id, long created);
/* completions with echo: the chunk of the prompt's text (and its tokens' logprobs), before the first token's */
json_t *toy_srv_chunk_echo(const struct srv_api *api, const struct srv_request *r, struct srv_job *j, const char *id,
                           long created);
json_t *toy_srv_chunk_finish(const struct srv_api *api, const struct srv_request *r, const struct srv_job *j,
                             const char *id, long created);
json_t *toy_srv_chunk_usage(const struct srv_api *api, const struct srv_request *r, const struct srv_job *j,
                            const char *id, long created);
json_t *toy_srv_usage_json(const struct srv_job *j);

#endif
