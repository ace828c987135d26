/* serve-http.c: the HTTP side of `toy serve` (toy/serve.h) on GNU
 * libmicrohttpd: routing, API-key auth, CORS, body limits, timeouts,
 * Server-Sent Events, /metrics, the toy/v1 event stream and the drain on
 * stop. Endpoint behaviour is specified in docs/serve.md.
 *
 * Threading: libmicrohttpd runs one thread per connection. A connection
 * thread parses the request, submits a job to the engine and then blocks on
 * the job's condition variable: for a plain response until the job is done,
 * for a stream inside the content-reader callback until the next tokens
 * arrive. Blocking is what thread-per-connection is for; it keeps the code
 * straight-line, and the connection limit bounds the threads. While it
 * waits, the thread peeks at its socket every 100 ms: a client that went
 * away cancels its job, which frees the slot at the next decode step.
 *
 * Stop: toy_serve polls *stop; then it closes the listening socket
 * (MHD_quiesce_daemon), answers new requests on open connections with 503,
 * waits for the requests in flight (at most drain_s), stops the engine,
 * joins the connection threads and writes run_end.
 */
#include <limits.h>
#include <math.h>
#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "infer/speculative.h"
#include "serve/serve-internal.h"
#include "toy/chat-template.h"
#include "toy/events.h"
#include "toy/run-dir.h"

enum route { R_HEALTH, R_MODELS, R_MODEL, R_COMPLETIONS, R_CHAT, R_EMBEDDINGS, R_RESPONSES, R_RESPONSE,
             R_RESPONSE_ITEMS, R_MESSAGES, R_COUNT_TOKENS, R_METRICS, R_OTHER, R_COUNT };
static const char *const route_names[R_COUNT] = {"/health",        "/v1/models",    "/v1/models/{model}",
                                                 "/v1/completions", "/v1/chat/completions", "/v1/embeddings",
                                                 "/v1/responses",   "/v1/responses/{id}",
                                                 "/v1/responses/{id}/input_items", "/v1/messages",
                                                 "/v1/messages/count_tokens", "/metrics", "other"};

struct stat_row {
    int route, code;
    int64_t n;
};

struct srv {
    struct srv_model model;          /* what api.m points to */
    struct srv_model draft;          /* --draft's (its llama and gpt2 NULL: none) */
    struct srv_api api;
    struct srv_engine *eng;
    struct srv_metrics met;
    struct toy_serve_options o;
    struct MHD_Daemon *d;
    struct toy_events *ev;
    char *model_name;
    atomic_int inflight;
    atomic_int connections;          /* open TCP connections (MHD's connection notifications) */
    atomic_bool draining;
    atomic_llong n_requests;
    pthread_mutex_t stat_mu;
    struct stat_row stats[128];
    int n_stats;
    long started;
    unsigned long long id_salt; /* 48 random bits in every id: ids stay unique across servers and restarts (kept
                                   responses outlive them) */
};

/* per request (MHD's con_cls) */
struct conn {
    double t0;
    enum route route;
    char *body;
    size_t len, cap;
    bool too_big;
};

/* a streaming response (owned by the MHD response) */
/* A streamed choice after the first ("n" > 1): its request, and what of it went out */
struct stream_choice {
    struct srv_request req;
    int64_t sent;
    struct srv_sent split;
    bool echoed, over;
};

struct stream {
    struct srv *S;
    struct srv_request req;
    char id[48];
    long created, req_no;
    int fd;
    int64_t sent;
    struct srv_sent split; /* what of a split chat reply went out */
    char *buf;
    size_t len, off, cap;
    bool finished;
    bool echoed; /* completions with echo: the prompt's chunk went out */
    double t0;
    struct stream_choice *more; /* "n" > 1: the other choices, indexed from 1 */
    int n_more;
    bool over; /* with more: the first choice's last chunk went out */
};

/* ---- helpers ---------------------------------------------------------------------------------- */

static bool peer_gone(int fd) {
    if (fd < 0) return false;
    struct pollfd p = {.fd = fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return false;
    if (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) return true;
    if (p.revents & POLLIN) {
        char c;
        return recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
    }
    return false;
}

static int conn_fd(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

static void wait_ms(struct srv_job *j, long ms) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += ms * 1000 * 1000;
    if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
    pthread_cond_timedwait(&j->cv, &j->mu, &ts);
}

static void wait_100ms(struct srv_job *j) { wait_ms(j, 100); }

static void count(struct srv *S, enum route r, int code) {
    pthread_mutex_lock(&S->stat_mu);
    int i = 0;
    while (i < S->n_stats && !(S->stats[i].route == (int)r && S->stats[i].code == code)) i++;
    if (i == S->n_stats && S->n_stats < (int)(sizeof S->stats / sizeof S->stats[0]))
        S->stats[S->n_stats++] = (struct stat_row){(int)r, code, 0};
    if (i < S->n_stats) S->stats[i].n++;
    pthread_mutex_unlock(&S->stat_mu);
}

static void add_common_headers(struct srv *S, struct MHD_Response *resp) {
    MHD_add_response_header(resp, "Access-Control-Allow-Origin", S->o.cors_origin);
    if (strcmp(S->o.cors_origin, "*")) MHD_add_response_header(resp, "Vary", "Origin");
    MHD_add_response_header(resp, "Server", "toy");
    if (atomic_load(&S->draining)) MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
}

static enum MHD_Result send_text(struct srv *S, struct MHD_Connection *c, enum route r, int code, char *text,
                                 size_t len, const char *ctype, const char *hname, const char *hval) {
    struct MHD_Response *resp = MHD_create_response_from_buffer(len, text, MHD_RESPMEM_MUST_FREE);
    if (!resp) { free(text); return MHD_NO; }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    add_common_headers(S, resp);
    if (hname) MHD_add_response_header(resp, hname, hval);
    enum MHD_Result res = MHD_queue_response(c, (unsigned)code, resp);
    MHD_destroy_response(resp);
    count(S, r, code);
    return res;
}

/* sends (and frees) a JSON value */
static enum MHD_Result send_json(struct srv *S, struct MHD_Connection *c, enum route r, int code, json_t *o,
                                 const char *hname, const char *hval) {
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!s) s = strdup("{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\"}}"), code = 500;
    if (!s) return MHD_NO;
    return send_text(S, c, r, code, s, strlen(s), "application/json", hname, hval);
}

/* the error object in the API's own shape (Anthropic's for its routes) */
static json_t *error_json(enum route r, const struct srv_error *e) {
    return r == R_MESSAGES || r == R_COUNT_TOKENS ? toy_srv_messages_error_json(e) : toy_srv_error_json(e);
}

static enum MHD_Result send_error(struct srv *S, struct MHD_Connection *c, enum route r, const struct srv_error *e,
                                  const char *hname, const char *hval) {
    return send_json(S, c, r, e->http, error_json(r, e), hname, hval);
}

static enum MHD_Result fail(struct srv *S, struct MHD_Connection *c, enum route r, int http, const char *type,
                            const char *code, const char *fmt, ...) __attribute__((format(printf, 7, 8)));
static enum MHD_Result fail(struct srv *S, struct MHD_Connection *c, enum route r, int http, const char *type,
                            const char *code, const char *fmt, ...) {
    struct srv_error e = {.http = http, .type = type, .code = code};
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e.msg, sizeof e.msg, fmt, ap);
    va_end(ap);
    return send_error(S, c, r, &e, NULL, NULL);
}

/* 405 with the Allow header RFC 9110 requires */
static enum MHD_Result not_allowed(struct srv *S, struct MHD_Connection *c, enum route r, const char *allow,
                                   const char *url) {
    struct srv_error e = {.http = 405, .type = "invalid_request_error"};
    snprintf(e.msg, sizeof e.msg, "use %s for %s", allow, url);
    return send_error(S, c, r, &e, "Allow", allow);
}

/* ---- per-request record: metrics, event, access log --------------------------------------------- */

static void request_done(struct srv *S, const struct srv_request *rq, enum route r, int code, long req_no,
                         double t0, bool stream) {
    double lat = toy_srv_now() - t0;
    struct srv_job *j = rq ? rq->job : NULL;
    int64_t pt = 0, ct = 0, cached = 0, drafted = 0, kept = 0;
    double ttft = -1;
    const char *finish = NULL;
    if (j) {
        pthread_mutex_lock(&j->mu);
        pt = j->kind == SRV_JOB_EMBED ? rq->n_tokens : j->n_prompt;
        ct = j->n_generated;
        cached = j->n_cached;
        drafted = j->n_drafted, kept = j->n_draft_kept;
        if (j->t_first > 0) ttft = j->t_first - j->t_submit;
        if (j->done && !j->err && j->kind == SRV_JOB_GENERATE) finish = toy_srv_finish_reason(j);
        pthread_mutex_unlock(&j->mu);
    }
    if (S->ev) {
        json_t *extra = json_pack("{s:s,s:s,s:i,s:I,s:I,s:I,s:I,s:s,s:b}", "model", S->model_name, "endpoint",
                                  route_names[r], "status", code, "prompt_tokens", (json_int_t)pt,
                                  "completion_tokens", (json_int_t)ct, "cached_tokens", (json_int_t)cached,
                                  "latency_us", (json_int_t)(lat * 1e6), "request_id", "", "stream", stream);
        char rid[32];
        snprintf(rid, sizeof rid, "req-%ld", req_no);
        json_object_set_new(extra, "request_id", json_string(rid));
        if (ttft >= 0) json_object_set_new(extra, "ttft_us", json_integer((json_int_t)(ttft * 1e6)));
        if (finish) json_object_set_new(extra, "finish_reason", json_string(finish));
        if (drafted) /* speculative decoding: the tokens drafted for it, and those kept */
            json_object_set_new(extra, "draft", json_pack("{s:I,s:I}", "drafted", (json_int_t)drafted, "accepted",
                                                          (json_int_t)kept));
        if (j && j->kind == SRV_JOB_GENERATE && (code < 400 || code >= 499)) /* a 400-413 was never parsed whole */
            json_object_set_new(extra, "sampling",
                                json_pack("{s:I,s:f,s:f,s:I}", "max_tokens", (json_int_t)j->max_tokens,
                                          "temperature", (double)j->sp.temperature, "top_p", (double)j->sp.top_p,
                                          "seed", (json_int_t)j->sp.seed));
        json_t *f = json_pack("{s:s,s:I,s:s,s:o}", "phase", "serve", "step", (json_int_t)req_no, "name", "request",
                              "extra", extra);
        toy_events_emit(S->ev, "eval", f);
        json_decref(f);
    }
    if (!S->o.quiet)
        fprintf(stderr, "toy serve: %s %d %lld+%lld tokens %.3f s%s\n", route_names[r], code, (long long)pt,
                (long long)ct, lat, stream ? " (stream)" : "");
}

/* ---- streaming --------------------------------------------------------------------------------- */

static void sse_append(struct stream *s, const char *data, size_t n) {
    if (s->len + n + 8 > s->cap) {
        size_t cap = (s->len + n + 8) * 2;
        char *b = realloc(s->buf, cap);
        if (!b) return;
        s->buf = b, s->cap = cap;
    }
    memcpy(s->buf + s->len, data, n);
    s->len += n;
}

static void sse_json(struct stream *s, json_t *o) {
    if (!o) return;
    char *t = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (!t) return;
    sse_append(s, "data: ", 6);
    sse_append(s, t, strlen(t));
    sse_append(s, "\n\n", 2);
    free(t);
}

/* Responses events: "event: TYPE" and the object as data, each */
static void sse_events(struct stream *s, json_t *events) {
    for (size_t i = 0; i < json_array_size(events); i++) {
        json_t *e = json_array_get(events, i);
        const char *type = json_string_value(json_object_get(e, "type"));
        sse_append(s, "event: ", 7);
        sse_append(s, type ? type : "message", strlen(type ? type : "message"));
        sse_append(s, "\n", 1);
        sse_json(s, json_incref(e));
    }
    json_decref(events);
}

/* a chunk o of a choice as the choice's index i */
static json_t *indexed(json_t *o, int i) {
    json_t *ch = json_array_get(json_object_get(o, "choices"), 0);
    if (ch) json_object_set_new(ch, "index", json_integer(i));
    return o;
}

/* "n" > 1 streamed (chat, completions): the chunks every choice has ready, each with its index, once one has some;
 * after the last choice's last chunk, the usage (every choice's tokens) and [DONE]. False: the client went away
 * (every job cancelled). */
static bool choices_step(struct stream *s) {
    struct srv_api *api = &s->S->api;
    const int n = s->n_more + 1;
    struct srv_request *rq[n];
    int64_t *sent[n];
    struct srv_sent *split[n];
    bool *echoed[n], *over[n];
    rq[0] = &s->req, sent[0] = &s->sent, split[0] = &s->split, echoed[0] = &s->echoed, over[0] = &s->over;
    for (int c = 1; c < n; c++) {
        struct stream_choice *m = &s->more[c - 1];
        rq[c] = &m->req, sent[c] = &m->sent, split[c] = &m->split, echoed[c] = &m->echoed, over[c] = &m->over;
    }
    for (;;) { /* until a choice has news: a wait on the first one not over, 20 ms at a time */
        int wait = -1;
        bool news = false;
        for (int c = 0; c < n && !news; c++) {
            struct srv_job *j = rq[c]->job;
            pthread_mutex_lock(&j->mu);
            news = !*over[c] && (j->n_toks > *sent[c] || j->done);
            pthread_mutex_unlock(&j->mu);
            if (!*over[c] && wait < 0) wait = c;
        }
        if (news || wait < 0) break;
        struct srv_job *j = rq[wait]->job;
        pthread_mutex_lock(&j->mu);
        if (j->n_toks == *sent[wait] && !j->done) wait_ms(j, 20);
        pthread_mutex_unlock(&j->mu);
        if (peer_gone(s->fd)) {
            for (int c = 0; c < n; c++) atomic_store(&rq[c]->job->cancel, true);
            return false;
        }
    }
    bool all_over = true, failed = false;
    for (int c = 0; c < n && !failed; c++) {
        struct srv_job *j = rq[c]->job;
        pthread_mutex_lock(&j->mu);
        if (!*over[c]) {
            if (rq[c]->echo && !*echoed[c] && (j->n_toks > 0 || j->done) && !j->err) {
                sse_json(s, indexed(toy_srv_chunk_echo(api, rq[c], j, s->id, s->created), c));
                *echoed[c] = true;
            }
            if (j->n_toks > *sent[c]) {
                sse_json(s, indexed(toy_srv_chunk_json(api, rq[c], j, *sent[c], j->n_toks, split[c], s->id, s->created), c));
                *sent[c] = j->n_toks;
            }
            if (j->done && *sent[c] == j->n_toks) {
                if (j->err) { /* a choice that failed ends the stream */
                    struct srv_error e = {.http = 500, .type = "server_error"};
                    snprintf(e.msg, sizeof e.msg, "%s", j->errmsg);
                    sse_json(s, toy_srv_error_json(&e));
                    failed = true;
                } else {
                    sse_json(s, indexed(toy_srv_chunk_rest(api, rq[c], j, split[c], s->id, s->created), c));
                    sse_json(s, indexed(toy_srv_chunk_finish(api, rq[c], j, s->id, s->created), c));
                }
                *over[c] = true;
            }
        }
        all_over = all_over && *over[c];
        pthread_mutex_unlock(&j->mu);
    }
    if (!all_over && !failed) return true;
    if (!failed && s->req.include_usage) {
        json_int_t made = 0, prompt = 0; /* every choice's tokens, every prompt's once (its first choice's) */
        for (int c = 0; c < n; c++) {
            made += (json_int_t)rq[c]->job->n_generated; /* all done */
            if (c % s->req.n_choices == 0) prompt += (json_int_t)rq[c]->job->n_prompt;
        }
        json_t *o = toy_srv_chunk_usage(api, &s->req, s->req.job, s->id, s->created);
        json_t *u = json_object_get(o, "usage");
        json_object_set_new(u, "prompt_tokens", json_integer(prompt));
        json_object_set_new(u, "completion_tokens", json_integer(made));
        json_object_set_new(u, "total_tokens", json_integer(prompt + made));
        sse_json(s, o);
    }
    for (int c = 0; failed && c < n; c++) atomic_store(&rq[c]->job->cancel, true);
    sse_append(s, "data: [DONE]\n\n", 14);
    s->finished = true;
    return true;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *out, size_t max) {
    struct stream *s = cls;
    struct srv_api *api = &s->S->api;
    for (;;) {
        if (s->off < s->len) {
            size_t n = s->len - s->off < max ? s->len - s->off : max;
            memcpy(out, s->buf + s->off, n);
            s->off += n;
            if (s->off == s->len) s->off = s->len = 0;
            return (ssize_t)n;
        }
        if (s->finished) return MHD_CONTENT_READER_END_OF_STREAM;
        if (s->n_more) {
            if (!choices_step(s)) return MHD_CONTENT_READER_END_WITH_ERROR;
            continue;
        }
        struct srv_job *j = s->req.job;
        pthread_mutex_lock(&j->mu);
        while (j->n_toks == s->sent && !j->done) {
            wait_100ms(j);
            if (j->n_toks == s->sent && !j->done && peer_gone(s->fd)) {
                atomic_store(&j->cancel, true);
                pthread_mutex_unlock(&j->mu);
                return MHD_CONTENT_READER_END_WITH_ERROR;
            }
        }
        bool resp = s->req.resp_body != NULL, anth = s->req.anth_body != NULL;
        if (s->req.echo && !s->echoed && (j->n_toks > 0 || j->done) && !j->err) { /* prefilled (and scored) */
            sse_json(s, toy_srv_chunk_echo(api, &s->req, j, s->id, s->created));
            s->echoed = true;
        }
        if (j->n_toks > s->sent) {
            if (resp) sse_events(s, toy_srv_responses_events(api, &s->req, j, false, &s->split, s->id, s->created));
            else if (anth) sse_events(s, toy_srv_messages_events(api, &s->req, j, false, &s->split, s->id));
            else sse_json(s, toy_srv_chunk_json(api, &s->req, j, s->sent, j->n_toks, &s->split, s->id, s->created));
            s->sent = j->n_toks;
        }
        if (j->done && s->sent == j->n_toks && resp) { /* no [DONE]: the last event says the response is over */
            sse_events(s, j->err ? toy_srv_responses_failed(api, &s->req, &s->split, s->id, s->created, j->errmsg)
                                 : toy_srv_responses_events(api, &s->req, j, true, &s->split, s->id, s->created));
            s->finished = true;
        } else if (j->done && s->sent == j->n_toks && anth) {
            sse_events(s, j->err ? toy_srv_messages_failed(j->errmsg)
                                 : toy_srv_messages_events(api, &s->req, j, true, &s->split, s->id));
            s->finished = true;
        } else if (j->done && s->sent == j->n_toks) {
            if (j->err) {
                struct srv_error e = {.http = 500, .type = "server_error"};
                snprintf(e.msg, sizeof e.msg, "%s", j->errmsg);
                sse_json(s, toy_srv_error_json(&e));
            } else {
                sse_json(s, toy_srv_chunk_rest(api, &s->req, j, &s->split, s->id, s->created));
                sse_json(s, toy_srv_chunk_finish(api, &s->req, j, s->id, s->created));
                if (s->req.include_usage) sse_json(s, toy_srv_chunk_usage(api, &s->req, j, s->id, s->created));
            }
            sse_append(s, "data: [DONE]\n\n", 14);
            s->finished = true;
        }
        pthread_mutex_unlock(&j->mu);
    }
}

/* 499 (nginx's "client closed request"): the client went away before the end; counted once the stream ends */
static void stream_free(void *cls) {
    struct stream *s = cls;
    if (!s->finished) atomic_store(&s->req.job->cancel, true);
    for (int i = 0; i < s->n_more; i++) {
        if (!s->finished) atomic_store(&s->more[i].req.job->cancel, true);
        json_decref(s->more[i].split.items);
        toy_srv_request_free(&s->more[i].req);
    }
    free(s->more);
    enum route r = s->req.resp_body ? R_RESPONSES : s->req.anth_body ? R_MESSAGES : s->req.ep == SRV_EP_CHAT ? R_CHAT
                                                                                                       : R_COMPLETIONS;
    json_decref(s->split.items);
    count(s->S, r, s->finished ? 200 : 499);
    request_done(s->S, &s->req, r, s->finished ? 200 : 499, s->req_no, s->t0, true);
    toy_srv_request_free(&s->req);
    free(s->buf);
    free(s);
}

/* ---- endpoints ----------------------------------------------------------------------------------- */

static json_t *model_json(struct srv *S) {
    const struct srv_model *c = S->api.m;
    const struct toy_tokenizer *tok = S->api.tok;
    json_t *meta = json_pack("{s:s,s:I,s:I,s:I,s:I,s:i,s:i,s:i}", "arch", c->arch, "vocab", (json_int_t)c->vocab,
                             "d_model", (json_int_t)c->d_model, "n_layers", (json_int_t)c->n_layers, "n_ctx",
                             (json_int_t)S->api.n_ctx, "bos", tok ? toy_tokenizer_bos(tok) : -1, "eos",
                             tok ? toy_tokenizer_eos(tok) : -1, "eot", tok ? toy_tokenizer_eot(tok) : -1);
    return json_pack("{s:s,s:s,s:I,s:s,s:o}", "id", S->model_name, "object", "model", "created",
                     (json_int_t)S->started, "owned_by", "toy", "meta", meta);
}

static enum MHD_Result metrics(struct srv *S, struct MHD_Connection *c) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) return fail(S, c, R_METRICS, 500, "server_error", NULL, "out of memory");
    struct srv_metrics *m = &S->met;
    fprintf(f, "# HELP toy_requests_total HTTP requests answered, by endpoint and status code.\n"
               "# TYPE toy_requests_total counter\n");
    pthread_mutex_lock(&S->stat_mu);
    for (int i = 0; i < S->n_stats; i++)
        fprintf(f, "toy_requests_total{endpoint=\"%s\",code=\"%d\"} %lld\n", route_names[S->stats[i].route],
                S->stats[i].code, (long long)S->stats[i].n);
    pthread_mutex_unlock(&S->stat_mu);
#define COUNTER(name, help, v) \
    fprintf(f, "# HELP " name " " help "\n# TYPE " name " counter\n" name " %lld\n", (long long)(v))
#define GAUGE(name, help, fmt, v) fprintf(f, "# HELP " name " " help "\n# TYPE " name " gauge\n" name " " fmt "\n", v)
    COUNTER("toy_prompt_tokens_total", "Prompt tokens of generation requests.", atomic_load(&m->prompt_tokens));
    COUNTER("toy_prompt_tokens_cached_total", "Prompt tokens served from the prefix cache (not prefilled).",
            atomic_load(&m->cached_tokens));
    COUNTER("toy_completion_tokens_total", "Tokens generated.", atomic_load(&m->completion_tokens));
    COUNTER("toy_embedding_tokens_total", "Tokens embedded.", atomic_load(&m->embed_tokens));
    COUNTER("toy_jobs_cancelled_total", "Generations stopped because the client went away or timed out.",
            atomic_load(&m->jobs_cancelled));
    COUNTER("toy_decode_steps_total", "Batched decode steps run.", atomic_load(&m->decode_steps));
    COUNTER("toy_decode_rows_total", "Sequences decoded, summed over decode steps (rows / steps = mean batch).",
            atomic_load(&m->decode_rows));
    COUNTER("toy_draft_tokens_total", "Tokens drafted (prompt lookup, the draft model, requests' predictions).",
            atomic_load(&m->draft_tokens));
    COUNTER("toy_draft_tokens_accepted_total", "Drafted tokens that were the tokens sampled, kept without a pass of their own.",
            atomic_load(&m->draft_accepted));
    GAUGE("toy_queue_depth", "Requests waiting for a slot.", "%d", atomic_load(&m->queue_depth));
    GAUGE("toy_active_sequences", "Sequences being generated.", "%d", atomic_load(&m->active));
    GAUGE("toy_slots", "Sequences that can be generated together.", "%d", S->o.n_slots);
    GAUGE("toy_requests_in_flight", "HTTP requests being handled.", "%d", atomic_load(&S->inflight));
    int n_kept;
    size_t kept_bytes;
    toy_srv_store_stats(S->api.store, &n_kept, &kept_bytes);
    GAUGE("toy_responses_kept", "Responses API responses kept for previous_response_id (--responses).", "%d", n_kept);
    GAUGE("toy_responses_kept_bytes", "Their JSON's bytes.", "%zu", kept_bytes);
    pthread_mutex_lock(&m->mu);
    GAUGE("toy_decode_tokens_per_second", "Aggregate decode rate over all sequences (moving average).", "%.3f",
          m->tokens_per_s);
    const char *hn[2] = {"toy_time_to_first_token_seconds", "toy_request_duration_seconds"};
    const char *hh[2] = {"Time from queueing a generation to its first token.",
                         "Time from queueing a generation to its last token."};
    const int64_t *hb[2] = {m->ttft_buckets, m->latency_buckets};
    double hs[2] = {m->ttft_sum, m->latency_sum};
    int64_t hc[2] = {m->ttft_count, m->latency_count};
    for (int h = 0; h < 2; h++) {
        fprintf(f, "# HELP %s %s\n# TYPE %s histogram\n", hn[h], hh[h], hn[h]);
        for (int b = 0; b < 12; b++) fprintf(f, "%s_bucket{le=\"%g\"} %lld\n", hn[h], toy_srv_buckets[b], (long long)hb[h][b]);
        fprintf(f, "%s_bucket{le=\"+Inf\"} %lld\n%s_sum %.6f\n%s_count %lld\n", hn[h], (long long)hc[h], hn[h], hs[h],
                hn[h], (long long)hc[h]);
    }
    pthread_mutex_unlock(&m->mu);
#undef COUNTER
#undef GAUGE
    fclose(f);
    return send_text(S, c, R_METRICS, 200, text, len, "text/plain; version=0.0.4", NULL, NULL);
}

/* a done job's mean log-probability per token (best_of's measure) */
static double mean_logprob(struct srv_job *j) {
    double sum = 0;
    pthread_mutex_lock(&j->mu);
    for (int64_t i = 0; i < j->n_toks; i++) sum += j->toks[i].logprob;
    int64_t n = j->n_toks;
    pthread_mutex_unlock(&j->mu);
    return n ? sum / (double)n : 0;
}

/* The response of several done jobs reqs[0, n_all), choices indexed from 0: the first n, or with best_of
 * (n_all > n) the n of the highest mean log-probability per token (the earlier first on ties); usage counts every
 * job's tokens, kept or not. */
static json_t *choices_response(const struct srv_api *api, struct srv_request **reqs, int n_all, int n,
                                const char *id, long created) {
    if (n_all > n) {
        double m[n_all];
        for (int i = 0; i < n_all; i++) m[i] = mean_logprob(reqs[i]->job);
        for (int i = 1; i < n_all; i++) /* insertion sort, stable */
            for (int k = i; k > 0 && m[k] > m[k - 1]; k--) {
                double t = m[k];
                m[k] = m[k - 1], m[k - 1] = t;
                struct srv_request *x = reqs[k];
                reqs[k] = reqs[k - 1], reqs[k - 1] = x;
            }
    }
    json_t *body = NULL, *choices = NULL;
    json_int_t made = 0;
    for (int i = 0; i < n_all; i++) {
        struct srv_job *x = reqs[i]->job;
        pthread_mutex_lock(&x->mu);
        json_t *o = i < n ? toy_srv_response_json(api, reqs[i], x, id, created) : NULL;
        made += (json_int_t)x->n_generated;
        pthread_mutex_unlock(&x->mu);
        if (!o) continue;
        json_t *ch = json_array_get(json_object_get(o, "choices"), 0);
        json_object_set_new(ch, "index", json_integer(i));
        if (!body) {
            body = o, choices = json_object_get(o, "choices");
            continue;
        }
        json_array_append(choices, ch);
        json_decref(o);
    }
    json_t *usage = json_object_get(body, "usage");
    json_object_set_new(usage, "completion_tokens", json_integer(made));
    json_object_set_new(usage, "total_tokens",
                        json_integer(json_integer_value(json_object_get(usage, "prompt_tokens")) + made));
    return body;
}

/* several prompts' responses (jobs reqs[p * per, (p + 1) * per) each, n kept of them) as one: the choices of prompt
 * p indexed p * n + k, and usage summing every prompt's tokens */
static json_t *prompts_response(const struct srv_api *api, struct srv_request **reqs, int n_prompts, int per, int n,
                                const char *id, long created) {
    json_t *body = NULL;
    json_int_t prompt = 0, made = 0;
    for (int p = 0; p < n_prompts; p++) {
        json_t *o = choices_response(api, reqs + p * per, per, n, id, created);
        json_t *u = json_object_get(o, "usage"), *ch = json_object_get(o, "choices");
        prompt += json_integer_value(json_object_get(u, "prompt_tokens"));
        made += json_integer_value(json_object_get(u, "completion_tokens"));
        for (size_t k = 0; k < json_array_size(ch); k++)
            json_object_set_new(json_array_get(ch, k), "index", json_integer((json_int_t)(p * n) + (json_int_t)k));
        if (!body) {
            body = o;
            continue;
        }
        json_array_extend(json_object_get(body, "choices"), ch);
        json_decref(o);
    }
    json_t *u = json_object_get(body, "usage");
    json_object_set_new(u, "prompt_tokens", json_integer(prompt));
    json_object_set_new(u, "completion_tokens", json_integer(made));
    json_object_set_new(u, "total_tokens", json_integer(prompt + made));
    return body;
}

static enum MHD_Result generate(struct srv *S, struct MHD_Connection *c, struct conn *k) {
    enum srv_endpoint ep = k->route == R_CHAT          ? SRV_EP_CHAT
                           : k->route == R_COMPLETIONS ? SRV_EP_COMPLETIONS
                           : k->route == R_RESPONSES   ? SRV_EP_RESPONSES
                           : k->route == R_MESSAGES    ? SRV_EP_MESSAGES
                           : k->route == R_COUNT_TOKENS ? SRV_EP_COUNT_TOKENS
                                                       : SRV_EP_EMBEDDINGS;
    long req_no = (long)atomic_fetch_add(&S->n_requests, 1) + 1;
    struct srv_request rq;
    struct srv_error err = {0};
    if (!toy_srv_parse_request(&S->api, ep, k->body ? k->body : "", k->len, &rq, &err)) {
        request_done(S, &rq, k->route, err.http, req_no, k->t0, false);
        toy_srv_request_free(&rq);
        return send_error(S, c, k->route, &err, NULL, NULL);
    }
    if (k->route == R_COUNT_TOKENS) { /* the prompt's tokens: nothing to run */
        json_t *o = json_pack("{s:I}", "input_tokens", (json_int_t)rq.job->n_prompt);
        request_done(S, &rq, k->route, 200, req_no, k->t0, false);
        toy_srv_request_free(&rq);
        return send_json(S, c, k->route, 200, o, NULL, NULL);
    }
    rq.job->streamed = rq.stream;
    /* "n" choices (best_of of them run) of each of the prompts: the request parsed again for each after the first,
     * a job of its own, prompt-major (job t: prompt t / best_of, choice t % best_of, whose seed is the request's
     * plus the choice's index, or another random one) */
    const int per = rq.best_of > 1 ? rq.best_of : 1, n_jobs = rq.n_prompts * per;
    int n_more = n_jobs - 1;
    struct srv_request *more = n_more ? calloc((size_t)n_more, sizeof *more) : NULL;
    if (n_more && !more) {
        toy_srv_request_free(&rq);
        return fail(S, c, k->route, 500, "server_error", NULL, "out of memory");
    }
    for (int i = 0; i < n_more; i++)
        if (!toy_srv_parse_request_at(&S->api, ep, k->body ? k->body : "", k->len, (i + 1) / per, &more[i], &err)) {
            for (int m = 0; m <= i; m++) toy_srv_request_free(&more[m]);
            free(more);
            toy_srv_request_free(&rq);
            return send_error(S, c, k->route, &err, NULL, NULL);
        } else {
            more[i].job->streamed = rq.stream;
            if (more[i].job->sp.seed == rq.job->sp.seed) more[i].job->sp.seed += (uint64_t)((i + 1) % per);
        }
    enum toy_status st = atomic_load(&S->draining) ? toy_error(TOY_ERR_STATE, "the server is shutting down")
                                                   : toy_srv_engine_submit(S->eng, rq.job);
    for (int i = 0; i < n_more && !st; i++)
        if ((st = toy_srv_engine_submit(S->eng, more[i].job))) { /* the queue is full: none of them runs */
            atomic_store(&rq.job->cancel, true);
            for (int m = 0; m < i; m++) atomic_store(&more[m].job->cancel, true);
        }
    if (st) {
        int code = 503;
        request_done(S, &rq, k->route, code, req_no, k->t0, false);
        toy_srv_request_free(&rq);
        for (int i = 0; i < n_more; i++) toy_srv_request_free(&more[i]);
        free(more);
        struct srv_error e = {.http = code, .type = "server_error", .code = st == TOY_ERR_RANGE ? "queue_full" : NULL};
        snprintf(e.msg, sizeof e.msg, "%s; retry later", toy_last_error());
        return send_error(S, c, k->route, &e, MHD_HTTP_HEADER_RETRY_AFTER, "1");
    }
    char id[48];
    snprintf(id, sizeof id, "%s%012llx%06ld",
             rq.resp_body               ? "resp_"
             : rq.anth_body             ? "msg_"
             : ep == SRV_EP_CHAT        ? "chatcmpl-"
             : ep == SRV_EP_COMPLETIONS ? "cmpl-"
                                        : "emb-",
             S->id_salt, req_no);
    long created = (long)time(NULL);
    int fd = conn_fd(c);
    if (rq.stream && ep != SRV_EP_EMBEDDINGS) {
        struct stream *s = calloc(1, sizeof *s);
        if (!s || (n_more && !(s->more = calloc((size_t)n_more, sizeof *s->more)))) {
            atomic_store(&rq.job->cancel, true);
            for (int i = 0; i < n_more; i++) atomic_store(&more[i].job->cancel, true), toy_srv_request_free(&more[i]);
            free(more);
            toy_srv_request_free(&rq);
            free(s);
            return fail(S, c, k->route, 500, "server_error", NULL, "out of memory");
        }
        s->S = S;
        s->req = rq;
        for (int i = 0; i < n_more; i++) s->more[i].req = more[i];
        s->n_more = n_more;
        free(more);
        snprintf(s->id, sizeof s->id, "%s", id);
        s->created = created;
        s->req_no = req_no;
        s->fd = fd;
        s->t0 = k->t0;
        if (rq.resp_body) sse_events(s, toy_srv_responses_start(&S->api, &rq, &s->split, id, created));
        else if (rq.anth_body) sse_events(s, toy_srv_messages_start(&S->api, &rq, rq.job, id));
        else if (ep == SRV_EP_CHAT)
            for (int i = 0; i <= n_more; i++) sse_json(s, indexed(toy_srv_chunk_role(&S->api, &rq, id, created), i));
        struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, s, stream_free);
        if (!resp) { stream_free(s); return MHD_NO; }
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
        MHD_add_response_header(resp, "X-Accel-Buffering", "no");
        add_common_headers(S, resp);
        enum MHD_Result res = MHD_queue_response(c, 200, resp);
        MHD_destroy_response(resp);
        return res;
    }
    struct srv_job *j = rq.job;
    bool gone = false;
    for (int i = n_more - 1; i >= 0; i--) { /* the other choices first, then the first (held below) */
        struct srv_job *x = more[i].job;
        pthread_mutex_lock(&x->mu);
        while (!x->done) {
            wait_100ms(x);
            if (!x->done && !gone && peer_gone(fd)) {
                gone = true;
                atomic_store(&j->cancel, true);
                for (int m = 0; m < n_more; m++) atomic_store(&more[m].job->cancel, true);
            }
        }
        pthread_mutex_unlock(&x->mu);
    }
    pthread_mutex_lock(&j->mu);
    while (!j->done) {
        wait_100ms(j);
        if (!j->done && !gone && peer_gone(fd)) atomic_store(&j->cancel, true), gone = true;
    }
    for (int i = 0; i < n_more && !j->err; i++) /* a choice that failed fails the request */
        if (more[i].job->err) {
            j->err = more[i].job->err;
            snprintf(j->errmsg, sizeof j->errmsg, "%s", more[i].job->errmsg);
        }
    int code = 200;
    json_t *body;
    if (gone) { /* nobody reads the answer: recorded as the client's doing, not as a success or a server error */
        struct srv_error e = {.http = 499, .type = "invalid_request_error"};
        snprintf(e.msg, sizeof e.msg, "the client closed the connection");
        code = e.http;
        body = error_json(k->route, &e);
    } else if (j->err) {
        struct srv_error e = {.http = j->err == TOY_ERR_INTERRUPTED ? 503 : 500, .type = "server_error"};
        snprintf(e.msg, sizeof e.msg, "%s", j->errmsg);
        code = e.http;
        body = error_json(k->route, &e);
    } else {
        body = n_more ? NULL : toy_srv_response_json(&S->api, &rq, j, id, created);
    }
    pthread_mutex_unlock(&j->mu);
    if (!gone && !j->err && n_more) {
        struct srv_request *all[n_jobs];
        all[0] = &rq;
        for (int i = 0; i < n_more; i++) all[i + 1] = &more[i];
        body = prompts_response(&S->api, all, rq.n_prompts, per, rq.n_choices, id, created);
    }
    request_done(S, &rq, k->route, code, req_no, k->t0, false);
    toy_srv_request_free(&rq);
    for (int i = 0; i < n_more; i++) toy_srv_request_free(&more[i]);
    free(more);
    return send_json(S, c, k->route, code, body, code == 503 ? MHD_HTTP_HEADER_RETRY_AFTER : NULL, "1");
}

/* ---- the access handler --------------------------------------------------------------------------------- */

static enum route route_of(const char *url) {
    if (!strcmp(url, "/health")) return R_HEALTH;
    if (!strcmp(url, "/v1/models")) return R_MODELS;
    if (!strncmp(url, "/v1/models/", 11)) return R_MODEL;
    if (!strcmp(url, "/v1/completions")) return R_COMPLETIONS;
    if (!strcmp(url, "/v1/chat/completions")) return R_CHAT;
    if (!strcmp(url, "/v1/embeddings")) return R_EMBEDDINGS;
    if (!strcmp(url, "/v1/responses")) return R_RESPONSES;
    if (!strncmp(url, "/v1/responses/", 14) && url[14] && !strchr(url + 14, '/')) return R_RESPONSE;
    const char *slash = !strncmp(url, "/v1/responses/", 14) && url[14] ? strchr(url + 14, '/') : NULL;
    if (slash && slash > url + 14 && !strcmp(slash, "/input_items")) return R_RESPONSE_ITEMS;
    if (!strcmp(url, "/v1/messages")) return R_MESSAGES;
    if (!strcmp(url, "/v1/messages/count_tokens")) return R_COUNT_TOKENS;
    if (!strcmp(url, "/metrics")) return R_METRICS;
    return R_OTHER;
}

static bool authorized(struct srv *S, struct MHD_Connection *c) {
    if (!S->o.api_key || !*S->o.api_key) return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (h && !strncasecmp(h, "Bearer ", 7)) h += 7;
    else if (!(h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key"))) return false; /* Anthropic's */
    size_t n = strlen(S->o.api_key), m = strlen(h);
    unsigned char diff = (unsigned char)(n != m);
    for (size_t i = 0; i < n; i++) diff |= (unsigned char)(S->o.api_key[i] ^ (i < m ? h[i] : 0));
    return diff == 0;
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                               const char *version, const char *upload_data, size_t *upload_size, void **con_cls) {
    struct srv *S = cls;
    struct conn *k = *con_cls;
    if (!k) {
        k = calloc(1, sizeof *k);
        if (!k) return MHD_NO;
        k->t0 = toy_srv_now();
        k->route = route_of(url);
        *con_cls = k;
        atomic_fetch_add(&S->inflight, 1);
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl) {
            char *end;
            unsigned long long n = strtoull(cl, &end, 10);
            if (*end || n > S->o.max_body) k->too_big = true;
        }
        if (k->too_big) /* answered before the body is read; the connection closes after */
            return fail(S, c, k->route, 413, "invalid_request_error", "request_too_large",
                        "the request body is larger than %zu bytes", S->o.max_body);
        return MHD_YES;
    }
    if (*upload_size) {
        if (!k->too_big && k->len + *upload_size > S->o.max_body) {
            k->too_big = true;
            free(k->body);
            k->body = NULL;
            k->len = k->cap = 0;
        }
        if (!k->too_big) {
            if (k->len + *upload_size + 1 > k->cap) {
                size_t cap = (k->len + *upload_size + 1) * 2;
                if (cap > S->o.max_body + 1) cap = S->o.max_body + 1;
                char *b = realloc(k->body, cap);
                if (!b) return MHD_NO;
                k->body = b, k->cap = cap;
            }
            memcpy(k->body + k->len, upload_data, *upload_size);
            k->len += *upload_size;
            k->body[k->len] = 0;
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (k->too_big)
        return fail(S, c, k->route, 413, "invalid_request_error", "request_too_large",
                    "the request body is larger than %zu bytes", S->o.max_body);
    if (!strcmp(method, "OPTIONS")) { /* CORS preflight */
        struct MHD_Response *resp = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
        if (!resp) return MHD_NO;
        add_common_headers(S, resp);
        const char *rh = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Access-Control-Request-Headers");
        MHD_add_response_header(resp, "Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS");
        MHD_add_response_header(resp, "Access-Control-Allow-Headers", rh ? rh : "Authorization, Content-Type");
        MHD_add_response_header(resp, "Access-Control-Max-Age", "86400");
        enum MHD_Result res = MHD_queue_response(c, 204, resp);
        MHD_destroy_response(resp);
        count(S, k->route, 204);
        return res;
    }
    if (atomic_load(&S->connections) > S->o.max_connections) { /* beyond --max-connections: refused, not queued */
        struct srv_error e = {.http = 503, .type = "server_error", .code = "too_many_connections"};
        snprintf(e.msg, sizeof e.msg, "more than %d open connections (--max-connections); retry later",
                 S->o.max_connections);
        return send_error(S, c, k->route, &e, MHD_HTTP_HEADER_RETRY_AFTER, "1");
    }
    bool get = !strcmp(method, "GET") || !strcmp(method, "HEAD"), post = !strcmp(method, "POST");
    if (k->route == R_OTHER)
        return fail(S, c, k->route, 404, "invalid_request_error", "not_found", "no such endpoint: %s %s", method, url);
    if (k->route == R_HEALTH) {
        if (!get) return not_allowed(S, c, k->route, "GET, HEAD", url);
        bool d = atomic_load(&S->draining);
        return send_json(S, c, k->route, d ? 503 : 200, json_pack("{s:s}", "status", d ? "draining" : "ok"), NULL,
                         NULL);
    }
    if (!authorized(S, c))
        return fail(S, c, k->route, 401, "invalid_request_error", "invalid_api_key",
                    "missing or wrong API key (send \"Authorization: Bearer KEY\" or \"x-api-key: KEY\")");
    if (k->route == R_RESPONSE) { /* a kept response: read or deleted */
        const char *id = url + 14;
        if (strcmp(method, "DELETE") && !get) return not_allowed(S, c, k->route, "GET, HEAD, DELETE", url);
        json_t *o = strcmp(method, "DELETE") ? toy_srv_store_get(S->api.store, id) : NULL;
        if (!o && !strcmp(method, "DELETE") && toy_srv_store_delete(S->api.store, id))
            o = json_pack("{s:s,s:s,s:b}", "id", id, "object", "response.deleted", "deleted", 1);
        if (!o)
            return fail(S, c, k->route, 404, "invalid_request_error", "not_found",
                        "Response with id '%s' not found (toy keeps the newest responses, in memory)", id);
        return send_json(S, c, k->route, 200, o, NULL, NULL);
    }
    if (k->route == R_RESPONSE_ITEMS) { /* a kept response's input items, a page of them */
        if (!get) return not_allowed(S, c, k->route, "GET, HEAD", url);
        char id[128];
        snprintf(id, sizeof id, "%.*s", (int)(strchr(url + 14, '/') - (url + 14)), url + 14);
        const char *lim = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "limit");
        const char *ord = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "order");
        char *end = NULL;
        long limit = lim ? strtol(lim, &end, 10) : 20;
        if (lim && (!*lim || *end || limit < 1 || limit > 100))
            return fail(S, c, k->route, 400, "invalid_request_error", NULL, "'limit' must be 1 to 100, not '%s'", lim);
        if (ord && strcmp(ord, "asc") && strcmp(ord, "desc"))
            return fail(S, c, k->route, 400, "invalid_request_error", NULL, "'order' must be asc or desc, not '%s'",
                        ord);
        const char *bad = NULL;
        json_t *o = toy_srv_store_input_items(S->api.store, id, (int)limit, ord && !strcmp(ord, "asc"),
                                              MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "after"),
                                              MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "before"), &bad);
        if (bad)
            return fail(S, c, k->route, 400, "invalid_request_error", NULL, "'%s': no input item '%s' in response '%s'",
                        bad, MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, bad), id);
        if (!o)
            return fail(S, c, k->route, 404, "invalid_request_error", "not_found",
                        "Response with id '%s' not found (toy keeps the newest responses, in memory)", id);
        return send_json(S, c, k->route, 200, o, NULL, NULL);
    }
    bool wants_post = k->route == R_COMPLETIONS || k->route == R_CHAT || k->route == R_EMBEDDINGS ||
                      k->route == R_RESPONSES || k->route == R_MESSAGES || k->route == R_COUNT_TOKENS;
    if (wants_post ? !post : !get) return not_allowed(S, c, k->route, wants_post ? "POST" : "GET, HEAD", url);
    switch (k->route) {
    case R_MODELS: return send_json(S, c, k->route, 200, json_pack("{s:s,s:[o]}", "object", "list", "data", model_json(S)), NULL, NULL);
    case R_MODEL:
        if (strcmp(url + 11, S->model_name))
            return fail(S, c, k->route, 404, "invalid_request_error", "model_not_found", "The model '%s' does not exist",
                        url + 11);
        return send_json(S, c, k->route, 200, model_json(S), NULL, NULL);
    case R_METRICS: return metrics(S, c);
    case R_COMPLETIONS:
    case R_CHAT:
    case R_RESPONSES:
    case R_MESSAGES:
    case R_COUNT_TOKENS:
        if (S->api.m->bert)
            return fail(S, c, k->route, 400, "invalid_request_error", NULL,
                        "'%s' is a text encoder (bert): it embeds (/v1/embeddings), it does not generate",
                        S->model_name);
        if (k->route != R_COMPLETIONS && !S->api.tmpl)
            return fail(S, c, k->route, 400, "invalid_request_error", NULL,
                        "this model has no chat template and none was given (--chat-template)");
        return generate(S, c, k);
    default: return generate(S, c, k);
    }
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_ctx, enum MHD_ConnectionNotificationCode t) {
    (void)c, (void)socket_ctx;
    struct srv *S = cls;
    atomic_fetch_add(&S->connections, t == MHD_CONNECTION_NOTIFY_STARTED ? 1 : -1);
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    struct srv *S = cls;
    struct conn *k = *con_cls;
    if (!k) return;
    free(k->body);
    free(k);
    *con_cls = NULL;
    atomic_fetch_sub(&S->inflight, 1);
}

/* ---- the server ------------------------------------------------------------------------------------------ */

struct toy_serve_options toy_serve_defaults(void) {
    return (struct toy_serve_options){.host = "127.0.0.1",
                                      .port = 8080,
                                      .cors_origin = "*",
                                      .n_slots = 4,
                                      .queue_size = 64,
                                      .max_body = 4 << 20,
                                      .timeout_s = 600,
                                      .max_connections = 128,
                                      .drain_s = 30,
                                      .runs_dir = "runs",
                                      .pooling = -1,
                                      .responses = 256,
                                      .draft_p_min = 0.75f};
}

/* the model id: the file's base name without .gguf (through symlinks such as weights/latest) */
static char *default_name(const char *path) {
    char *real = path ? realpath(path, NULL) : NULL;
    const char *p = real ? real : path ? path : "model";
    const char *b = strrchr(p, '/');
    b = b ? b + 1 : p;
    size_t n = strlen(b);
    if (n > 5 && !strcmp(b + n - 5, ".gguf")) n -= 5;
    char *s = strndup(b, n);
    free(real);
    return s;
}

/* the template's end-of-turn markers become stop strings (for tokenizers that spell them as text) */
static void eot_stops(struct srv_api *api, const char *src) {
    const char *marks[4];
    int n = toy_chat_stop_texts(&api->syntax, src, marks);
    for (int i = 0; i < n; i++) api->eot_stops[api->n_eot_stops++] = strdup(marks[i]);
}

static enum toy_status open_events(struct srv *S, const char *model_path) {
    char id[128], dir[4096], path[4200];
    enum toy_status st = toy_run_create(S->o.runs_dir, NULL, "serve", id, sizeof id, dir, sizeof dir);
    if (st) return st;
    snprintf(path, sizeof path, "%s/events.jsonl", dir);
    if ((st = toy_events_open(path, TOY_EVENTS_TRUNCATE, &S->ev))) return st;
    const struct srv_model *c = S->api.m;
    json_t *model = json_pack("{s:s,s:s,s:I,s:I,s:I,s:I,s:I,s:I,s:I}", "arch", c->arch, "name", S->model_name, "vocab",
                              (json_int_t)c->vocab, "d_model", (json_int_t)c->d_model, "n_layers",
                              (json_int_t)c->n_layers, "n_heads", (json_int_t)c->n_heads, "n_kv",
                              (json_int_t)c->n_kv_heads, "d_head", (json_int_t)c->d_head, "d_ff", (json_int_t)c->d_ff);
    json_t *config = json_pack("{s:s,s:i,s:I,s:i,s:i,s:i,s:b,s:i,s:s}", "host", S->o.host, "port", S->o.port, "max_t",
                               (json_int_t)S->api.n_ctx, "slots", S->o.n_slots, "queue", S->o.queue_size,
                               "timeout_s", S->o.timeout_s, "prefix_cache", !S->o.no_prefix_cache, "lookup",
                               S->o.lookup, "model_path", model_path ? model_path : "");
    if (config && (S->draft.llama || S->draft.gpt2))
        json_object_set_new(config, "draft", json_pack("{s:s,s:I,s:I,s:i,s:f}", "arch", S->draft.arch, "n_layers",
                                                       (json_int_t)S->draft.n_layers, "d_model",
                                                       (json_int_t)S->draft.d_model, "draft_max", S->o.draft_max,
                                                       "p_min", (double)S->o.draft_p_min));
    st = toy_events_run_start(S->ev, &(struct toy_run_start){
        .run_id = id, .phase = "serve", .model = model, .config = config});
    json_decref(model);
    json_decref(config);
    if (!S->o.quiet) fprintf(stderr, "toy serve: events in %s\n", path);
    return st;
}

static void srv_free(struct srv *S) {
    toy_srv_engine_free(S->eng);
    toy_srv_store_free(S->api.store);
    toy_chat_template_free(S->api.tmpl);
    for (int i = 0; i < S->api.n_eot_stops; i++) free(S->api.eot_stops[i]);
    toy_events_close(S->ev);
    free(S->model_name);
    pthread_mutex_destroy(&S->stat_mu);
    pthread_mutex_destroy(&S->met.mu);
    free(S);
}

static enum toy_status serve_model(struct srv_model model, const struct toy_tokenizer *tok, const char *model_path,
                                   const struct toy_serve_options *opts) {
    struct toy_serve_options def = toy_serve_defaults(), o = opts ? *opts : def;
    if (!o.host) o.host = def.host;
    if (!o.cors_origin) o.cors_origin = def.cors_origin;
    if (o.n_slots <= 0) o.n_slots = def.n_slots;
    if (o.max_body == 0) o.max_body = def.max_body;
    if (o.max_connections <= 0) o.max_connections = def.max_connections;
    if (o.port < 0 || o.port > 65535) return toy_error(TOY_ERR_INVALID_ARG, "port %d (0..65535)", o.port);
    if (o.pooling > TOY_POOLING_RANK) return toy_error(TOY_ERR_INVALID_ARG, "pooling %d (-1..4)", o.pooling);
    if (o.responses < 0) return toy_error(TOY_ERR_INVALID_ARG, "responses %d (0: none kept)", o.responses);
    if (o.responses == 0 && o.responses_dir)
        return toy_error(TOY_ERR_INVALID_ARG, "responses_dir %s with responses 0: none would be kept", o.responses_dir);
    if (o.draft && o.draft_gpt2) return toy_error(TOY_ERR_INVALID_ARG, "two draft models (draft and draft_gpt2)");
    struct srv_model draft = o.draft        ? toy_srv_model_llama(o.draft)
                             : o.draft_gpt2 ? toy_srv_model_gpt2(o.draft_gpt2)
                                            : (struct srv_model){0};
    enum toy_status dst = o.draft || o.draft_gpt2 ? toy_draft_vocab_check(tok, model.vocab, o.draft_tok, draft.vocab)
                                                  : TOY_OK;
    if (dst) return dst;
    struct srv *S = calloc(1, sizeof *S);
    if (!S) return toy_error(TOY_ERR_NOMEM, "serve");
    pthread_mutex_init(&S->stat_mu, NULL);
    pthread_mutex_init(&S->met.mu, NULL);
    S->o = o;
    S->started = (long)time(NULL);
    if (getrandom(&S->id_salt, sizeof S->id_salt, 0) != (ssize_t)sizeof S->id_salt) /* else the clock's bits */
        S->id_salt = (unsigned long long)(toy_srv_now() * 1e9) * 0x9E3779B97F4A7C15ull ^ (unsigned long long)getpid();
    S->id_salt &= 0xffffffffffffull;
    S->model_name = o.model_name ? strdup(o.model_name) : default_name(model_path);
    if (o.pooling >= 0) model.pooling = (enum toy_pooling)o.pooling;
    S->model = model;
    S->draft = draft;
    const struct srv_model *m = S->api.m = &S->model;
    S->api.tok = tok;
    S->api.model_name = S->model_name;
    enum toy_status sst = o.responses > 0 ? toy_srv_store_open(o.responses, SRV_STORE_BYTES, o.responses_dir,
                                                               &S->api.store)
                                          : TOY_OK;
    if (sst) {
        srv_free(S);
        return sst;
    }
    S->api.timeout_s = o.timeout_s;
    int64_t n_ctx = o.n_ctx > 0 ? o.n_ctx : 4096;
    S->api.n_ctx = n_ctx < m->max_ctx ? n_ctx : m->max_ctx;
    if (o.n_ctx > m->max_ctx)
        fprintf(stderr, "toy serve: --ctx %lld is more than the model's %lld positions; using %lld\n",
                (long long)o.n_ctx, (long long)m->max_ctx, (long long)m->max_ctx);
    enum toy_status st = TOY_OK;
    /* chat template: --chat-template, else the model's, else chatml */
    const char *src = o.chat_template ? o.chat_template : tok ? toy_tokenizer_chat_template(tok) : NULL;
    if (tok && src) {
        st = toy_chat_template_init(src, &S->api.tmpl);
        if (st && o.chat_template) { srv_free(S); return st; }
        if (st) fprintf(stderr, "toy serve: the model's chat template does not parse (%s); using chatml\n",
                        toy_last_error());
    }
    if (tok && !S->api.tmpl) {
        src = "chatml";
        if ((st = toy_chat_template_init(src, &S->api.tmpl))) { srv_free(S); return st; }
    }
    if (tok) {
        const char *tsrc = toy_chat_template_builtin(src) ? toy_chat_template_builtin(src) : src;
        S->api.syntax = toy_chat_syntax_detect(tsrc);
        eot_stops(&S->api, tsrc);
    }
    struct srv_engine_opts eo = {.n_slots = o.n_slots, .queue_size = o.queue_size, .n_ctx = S->api.n_ctx,
                                 .n_threads = o.n_threads, .prefix_cache = !o.no_prefix_cache, .kv_f32 = o.kv_f32,
                                 .lookup = o.lookup, .draft = draft.llama || draft.gpt2 ? &S->draft : NULL,
                                 .draft_max = o.draft_max, .draft_p_min = o.draft_p_min};
    if ((st = toy_srv_engine_new(m, tok, &eo, &S->met, &S->eng))) { srv_free(S); return st; }

    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai = NULL;
    char port[16];
    snprintf(port, sizeof port, "%d", o.port);
    if (getaddrinfo(o.host, port, &hints, &ai) || !ai) {
        srv_free(S);
        return toy_error(TOY_ERR_INVALID_ARG, "cannot resolve host '%s'", o.host);
    }
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ITC |
                     (ai->ai_family == AF_INET6 ? MHD_USE_DUAL_STACK : 0); /* "::" takes IPv4 clients too */
    /* At its own limit libmicrohttpd stops accepting, and new clients hang in the listen backlog. So its limit
     * leaves room beyond --max-connections, and the handler answers the connections past ours with 503. */
    unsigned mhd_limit = (unsigned)o.max_connections + (unsigned)(o.max_connections > 16 ? o.max_connections : 16);
    S->d = MHD_start_daemon(flags, (uint16_t)o.port, NULL, NULL, handler, S, MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)(o.timeout_s > 0 ? o.timeout_s : 0),
                            MHD_OPTION_CONNECTION_LIMIT, mhd_limit, MHD_OPTION_NOTIFY_COMPLETED, completed, S,
                            MHD_OPTION_NOTIFY_CONNECTION, on_connection, S, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!S->d) {
        srv_free(S);
        return toy_error(TOY_ERR_IO, "cannot listen on %s:%d (in use? permission?)", o.host, o.port);
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(S->d, MHD_DAEMON_INFO_BIND_PORT);
    S->o.port = di ? di->port : o.port;
    if (o.bound_port) *o.bound_port = S->o.port;
    if (o.runs_dir && (st = open_events(S, model_path))) {
        fprintf(stderr, "toy serve: no event stream: %s\n", toy_last_error());
        toy_events_close(S->ev);
        S->ev = NULL;
    }
    const struct toy_chat_syntax *cs = &S->api.syntax;
    if (!o.quiet && S->api.tmpl && (cs->think || cs->format != TOY_CHAT_FORMAT_CONTENT))
        fprintf(stderr, "toy serve: chat replies split: %s%s%s%s%s\n", cs->think ? "reasoning in <think>" : "",
                cs->think && cs->format ? ", " : "",
                cs->format == TOY_CHAT_FORMAT_HARMONY ? "reasoning, content and tool calls by gpt-oss channel"
                : cs->format                          ? "tool calls in the "
                                                      : "",
                cs->format && cs->format != TOY_CHAT_FORMAT_HARMONY ? toy_chat_format_name(cs->format) : "",
                cs->format && cs->format != TOY_CHAT_FORMAT_HARMONY ? " form" : "");
    if (!o.quiet && m->pooling >= TOY_POOLING_CLS)
        fprintf(stderr, "toy serve: embeddings: %s\n", m->pooling == TOY_POOLING_CLS ? "the first position's state"
                                                      : m->pooling == TOY_POOLING_LAST ? "the last position's state"
                                                                                       : "none (a reranker; --pooling)");
    bool v6 = strchr(o.host, ':') != NULL;
    char spec[160] = "";
    if (draft.llama || draft.gpt2)
        snprintf(spec, sizeof spec, ", drafts from a %lld-layer %s%s", (long long)draft.n_layers, draft.arch,
                 o.lookup ? " and the text" : "");
    else if (o.lookup)
        snprintf(spec, sizeof spec, ", drafts from the text");
    fprintf(stderr, "toy serve: listening on http://%s%s%s:%d (model %s, %d slots x %lld positions, KV cache %.1f MiB%s)\n",
            v6 ? "[" : "", o.host, v6 ? "]" : "", S->o.port, S->model_name, o.n_slots, (long long)S->api.n_ctx,
            (double)toy_srv_engine_kv_bytes(S->eng) / (1 << 20), spec);
    fflush(stderr);

    while (!o.stop || !*o.stop) usleep(20 * 1000);

    /* drain: no new connections, no new requests, let the running ones finish */
    atomic_store(&S->draining, true);
    MHD_socket lfd = MHD_quiesce_daemon(S->d);
    if (lfd != MHD_INVALID_SOCKET) close(lfd);
    if (!o.quiet) fprintf(stderr, "toy serve: stopping; %d request(s) in flight\n", atomic_load(&S->inflight));
    double t_end = toy_srv_now() + (o.drain_s > 0 ? o.drain_s : 0);
    while ((atomic_load(&S->inflight) > 0 || toy_srv_engine_load(S->eng) > 0) && toy_srv_now() < t_end) usleep(10 * 1000);
    /* what still runs ends as an error; give its connections a moment to send that and close their streams */
    toy_srv_engine_stop(S->eng);
    t_end = toy_srv_now() + 2;
    while (atomic_load(&S->inflight) > 0 && toy_srv_now() < t_end) usleep(10 * 1000);
    MHD_stop_daemon(S->d);
    if (S->ev) {
        json_t *extra = json_pack("{s:I,s:I}", "requests", (json_int_t)atomic_load(&S->n_requests),
                                  "completion_tokens", (json_int_t)atomic_load(&S->met.completion_tokens));
        toy_events_run_end(S->ev, &(struct toy_run_end){.reason = TOY_RUN_COMPLETED, .final_step =
                                                            atomic_load(&S->n_requests), .final_loss = NAN,
                                                        .extra = extra});
        json_decref(extra);
    }
    if (!o.quiet) fprintf(stderr, "toy serve: stopped\n");
    srv_free(S);
    return TOY_OK;
}

enum toy_status toy_serve(struct toy_llama *m, const struct toy_tokenizer *tok, const char *model_path,
                          const struct toy_serve_options *o) {
    if (!m) return toy_error(TOY_ERR_INVALID_ARG, "toy_serve: NULL model");
    return serve_model(toy_srv_model_llama(m), tok, model_path, o);
}

enum toy_status toy_serve_gpt2(struct toy_gpt2 *m, const struct toy_tokenizer *tok, const char *model_path,
                               const struct toy_serve_options *o) {
    if (!m) return toy_error(TOY_ERR_INVALID_ARG, "toy_serve_gpt2: NULL model");
    return serve_model(toy_srv_model_gpt2(m), tok, model_path, o);
}

enum toy_status toy_serve_bert(struct toy_bert *m, const struct toy_tokenizer *tok, const char *model_path,
                               const struct toy_serve_options *o) {
    if (!m) return toy_error(TOY_ERR_INVALID_ARG, "toy_serve_bert: NULL model");
    return serve_model(toy_srv_model_bert(m), tok, model_path, o);
}
