/* serve-anthropic.c: Anthropic's Messages API (POST /v1/messages, and
 * /v1/messages/count_tokens) over the chat path, for clients built on
 * Anthropic's SDKs. A request is translated into a chat completion request:
 * system into a system message; each message's content blocks into chat
 * messages (text; an assistant's thinking as reasoning_content and its
 * tool_use blocks as tool_calls; a user's tool_result blocks as tool
 * messages); tools (name, description, input_schema) and tool_choice (auto,
 * any, tool, none) into the chat's; stop_sequences into stop; thinking
 * (enabled / disabled) into the template's enable_thinking. The reply,
 * split as a chat reply is, becomes content blocks (thinking, text,
 * tool_use) with a stop_reason (end_turn, max_tokens, stop_sequence,
 * tool_use); streamed, it is the Messages event sequence: message_start,
 * content_block_start / _delta / _stop per block, message_delta with the
 * stop reason and usage, message_stop. Errors take Anthropic's shape.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/serve-internal.h"

#define BAD(param, ...) toy_srv_err(err, 400, "invalid_request_error", NULL, param, __VA_ARGS__)


/* ---- the request ------------------------------------------------------------------------------ */

/* text blocks (or a string) joined; what names the field in errors */
static bool blocks_text(json_t *c, const char *what, json_t **out, struct srv_error *err) {
    if (json_is_string(c)) {
        *out = json_incref(c);
        return true;
    }
    if (!json_is_array(c)) return BAD("messages", "%s must be a string or an array of content blocks", what);
    for (size_t k = 0; k < json_array_size(c); k++) {
        json_t *b = json_array_get(c, k);
        const char *type = json_string_value(json_object_get(b, "type"));
        if (!type || strcmp(type, "text") || !json_is_string(json_object_get(b, "text")))
            return BAD("messages", "%s[%zu]: block type '%s' (toy reads text here)", what, k, type ? type : "?");
    }
    return (*out = toy_srv_join_text(c, "text")) || toy_srv_err(err, 500, "api_error", NULL, NULL, "out of memory");
}

/* one Anthropic message into chat messages */
static bool message(json_t *m, size_t i, json_t *msgs, struct srv_error *err) {
    const char *role = json_string_value(json_object_get(m, "role"));
    if (!json_is_object(m) || !role || (strcmp(role, "user") && strcmp(role, "assistant")))
        return BAD("messages", "messages[%zu] must be {role: user or assistant, content}", i);
    json_t *c = json_object_get(m, "content");
    char what[64];
    snprintf(what, sizeof what, "messages[%zu].content", i);
    if (json_is_string(c)) {
        json_array_append_new(msgs, json_pack("{s:s,s:O}", "role", role, "content", c));
        return true;
    }
    if (!json_is_array(c)) return BAD("messages", "%s must be a string or an array of content blocks", what);
    bool assistant = !strcmp(role, "assistant");
    json_t *text = json_array(), *calls = json_array(), *thinking = json_array();
    bool ok = true;
    for (size_t k = 0; k < json_array_size(c) && ok; k++) {
        json_t *b = json_array_get(c, k);
        const char *type = json_string_value(json_object_get(b, "type"));
        if (!type) type = "?";
        if (!strcmp(type, "text") && json_is_string(json_object_get(b, "text"))) {
            json_array_append(text, b);
        } else if (assistant && !strcmp(type, "thinking") && json_is_string(json_object_get(b, "thinking"))) {
            json_array_append_new(thinking, json_pack("{s:s,s:O}", "type", "text", "text", json_object_get(b, "thinking")));
        } else if (assistant && !strcmp(type, "redacted_thinking")) {
            continue;
        } else if (assistant && !strcmp(type, "tool_use")) {
            json_t *id = json_object_get(b, "id"), *name = json_object_get(b, "name"), *input = json_object_get(b, "input");
            if (!json_is_string(id) || !json_is_string(name) || !json_is_object(input))
                ok = BAD("messages", "%s[%zu]: tool_use needs an id, a name and an input object", what, k);
            else
                json_array_append_new(calls, json_pack("{s:O,s:s,s:{s:O,s:O}}", "id", id, "type", "function", "function",
                                                       "name", name, "arguments", input));
        } else if (!assistant && !strcmp(type, "tool_result")) {
            json_t *id = json_object_get(b, "tool_use_id"), *res = json_object_get(b, "content"), *t = NULL;
            char rw[96];
            snprintf(rw, sizeof rw, "%s[%zu].content", what, k);
            if (!json_is_string(id)) ok = BAD("messages", "%s[%zu]: tool_result needs a tool_use_id", what, k);
            else if (!res) t = json_string("");
            else ok = blocks_text(res, rw, &t, err);
            if (ok) json_array_append_new(msgs, json_pack("{s:s,s:O,s:o}", "role", "tool", "tool_call_id", id, "content", t));
        } else {
            ok = BAD("messages", "%s[%zu]: block type '%s' (toy reads text, thinking, tool_use and tool_result)", what,
                     k, type);
        }
    }
    json_t *t = NULL, *th = NULL;
    if (ok && json_array_size(text)) ok = blocks_text(text, what, &t, err);
    if (ok && json_array_size(thinking)) ok = blocks_text(thinking, what, &th, err);
    if (ok && (t || json_array_size(calls) || th)) {
        json_t *o = json_pack("{s:s,s:o}", "role", role, "content", t ? t : (assistant ? json_null() : json_string("")));
        t = NULL;
        if (json_array_size(calls)) json_object_set(o, "tool_calls", calls);
        if (th) json_object_set(o, "reasoning_content", th);
        json_array_append_new(msgs, o);
    }
    json_decref(t), json_decref(th), json_decref(text), json_decref(calls), json_decref(thinking);
    return ok;
}

bool toy_srv_messages_to_chat(json_t *body, bool count_only, json_t **out, struct srv_error *err) {
    json_t *chat = json_object(), *msgs = json_array();
    *out = chat;
    json_object_set_new(chat, "messages", msgs);
    json_t *mt = json_object_get(body, "max_tokens");
    if (!count_only && !mt) return BAD("max_tokens", "'max_tokens' is required");
    if (mt) json_object_set(chat, "max_tokens", mt);
    json_t *sys = json_object_get(body, "system");
    if (sys && !json_is_null(sys)) {
        json_t *t;
        if (!blocks_text(sys, "system", &t, err)) {
            snprintf(err->param, sizeof err->param, "system");
            return false;
        }
        json_array_append_new(msgs, json_pack("{s:s,s:o}", "role", "system", "content", t));
    }
    json_t *in = json_object_get(body, "messages");
    if (!json_is_array(in) || json_array_size(in) == 0)
        return BAD("messages", "'messages' must be a non-empty array of {role, content}");
    for (size_t i = 0; i < json_array_size(in); i++)
        if (!message(json_array_get(in, i), i, msgs, err)) return false;
    static const char *const same[] = {"model", "stream", "temperature", "top_p", "top_k", NULL};
    for (const char *const *k = same; *k; k++) {
        json_t *v = json_object_get(body, *k);
        if (v) json_object_set(chat, *k, v);
    }
    json_t *stop = json_object_get(body, "stop_sequences");
    if (stop && !json_is_null(stop)) json_object_set(chat, "stop", stop);
    json_t *tools = json_object_get(body, "tools");
    if (tools && !json_is_null(tools)) {
        if (!json_is_array(tools)) return BAD("tools", "'tools' must be an array");
        json_t *ct = json_array();
        json_object_set_new(chat, "tools", ct);
        for (size_t k = 0; k < json_array_size(tools); k++) {
            json_t *t = json_array_get(tools, k);
            const char *type = json_string_value(json_object_get(t, "type"));
            if (type && strcmp(type, "custom"))
                return BAD("tools", "tools[%zu]: type '%s' (toy runs client tools: name, description, input_schema)", k,
                           type);
            json_array_append_new(ct, toy_srv_chat_tool(json_object_get(t, "name"), json_object_get(t, "description"),
                                                        json_object_get(t, "input_schema"), NULL));
        }
    }
    json_t *tc = json_object_get(body, "tool_choice");
    if (tc && !json_is_null(tc)) {
        const char *type = json_string_value(json_object_get(tc, "type"));
        if (!type) return BAD("tool_choice", "'tool_choice' must be {type: auto, any, tool or none}");
        if (!strcmp(type, "auto") || !strcmp(type, "none")) json_object_set_new(chat, "tool_choice", json_string(type));
        else if (!strcmp(type, "any")) json_object_set_new(chat, "tool_choice", json_string("required"));
        else if (!strcmp(type, "tool"))
            json_object_set_new(chat, "tool_choice", json_pack("{s:s,s:{s:O?}}", "type", "function", "function", "name",
                                                               json_object_get(tc, "name")));
        else return BAD("tool_choice", "tool_choice type '%s' (auto, any, tool or none)", type);
    }
    const char *think = json_string_value(json_object_get(json_object_get(body, "thinking"), "type"));
    if (think) json_object_set_new(chat, "chat_template_kwargs",
                                   json_pack("{s:b}", "enable_thinking", strcmp(think, "disabled") != 0));
    return true;
}

/* ---- the reply ---------------------------------------------------------------------------------- */


/* the request's stop sequence that ended the reply (NULL: none did) */
static const char *user_stop(const struct srv_job *j) {
    return j->reason == TOY_STOP_STRING && j->stop_hit >= 0 && j->stop_hit < j->n_user_stop ? j->stop[j->stop_hit]
                                                                                          : NULL;
}

static const char *stop_reason(const struct srv_request *r, const struct srv_job *j) {
    const char *f = toy_srv_finish_reason(j);
    if (!strcmp(f, "length")) return "max_tokens";
    if (!strcmp(f, "tool_calls")) return "tool_use";
    return user_stop(j) ? "stop_sequence" : "end_turn";
}


static json_t *usage_json(const struct srv_job *j, bool final) {
    int64_t cached = j->n_cached;
    return json_pack("{s:I,s:I,s:I,s:I}", "input_tokens", (json_int_t)(j->n_prompt - cached),
                     "cache_read_input_tokens", (json_int_t)cached, "cache_creation_input_tokens", (json_int_t)0,
                     "output_tokens", (json_int_t)(final ? j->n_generated : 0));
}

static void tool_id(char *out, size_t n, const char *msg_id, size_t k) {
    const char *u = strchr(msg_id, '_');
    snprintf(out, n, "toolu_%s_%zu", u ? u + 1 : msg_id, k);
}

/* a call's input: its arguments (an object) */
static json_t *call_input(const struct toy_chat_call *c) {
    json_t *o = json_loads(c->arguments, 0, NULL);
    if (json_is_object(o)) return o;
    json_decref(o);
    return json_object();
}

json_t *toy_srv_messages_json(const struct srv_api *api, const struct srv_request *r, struct srv_job *j, const char *id) {
    json_t *content = json_array();
    struct toy_chat_reply p;
    if (toy_srv_reply_split(r, j, true, &p)) {
        if (*p.reasoning)
            json_array_append_new(content, json_pack("{s:s,s:o,s:s}", "type", "thinking", "thinking",
                                                     toy_srv_jstr(p.reasoning, strlen(p.reasoning)), "signature", ""));
        if (*p.content || (!p.n_calls && !*p.reasoning))
            json_array_append_new(content, json_pack("{s:s,s:o}", "type", "text", "text", toy_srv_jstr(p.content, strlen(p.content))));
        for (size_t k = 0; k < p.n_calls; k++) {
            char tid[96];
            tool_id(tid, sizeof tid, id, k);
            json_array_append_new(content, json_pack("{s:s,s:s,s:s,s:o}", "type", "tool_use", "id", tid, "name",
                                                     p.calls[k].name, "input", call_input(&p.calls[k])));
        }
        j->n_calls = p.n_calls;
        toy_chat_reply_free(&p);
    }
    const char *seq = user_stop(j);
    return json_pack("{s:s,s:s,s:s,s:s,s:o,s:s,s:o,s:o}", "id", id, "type", "message", "role", "assistant", "model",
                     api->model_name, "content", content, "stop_reason", stop_reason(r, j), "stop_sequence",
                     seq ? json_string(seq) : json_null(), "usage", usage_json(j, true));
}

/* ---- the stream ----------------------------------------------------------------------------------- */

static void event(json_t *ev, const char *type, json_t *o) {
    json_object_set_new(o, "type", json_string(type));
    json_array_append_new(ev, o);
}

json_t *toy_srv_messages_start(const struct srv_api *api, const struct srv_request *r, const struct srv_job *j,
                               const char *id) {
    (void)r;
    json_t *ev = json_array();
    event(ev, "message_start",
          json_pack("{s:{s:s,s:s,s:s,s:s,s:[],s:n,s:n,s:o}}", "message", "id", id, "type", "message", "role", "assistant",
                    "model", api->model_name, "content", "stop_reason", "stop_sequence", "usage", usage_json(j, false)));
    return ev;
}

/* the open text block (1: thinking, 2: text) ends */
static void close_block(json_t *ev, struct srv_sent *s) {
    if (!s->open) return;
    event(ev, "content_block_stop", json_pack("{s:i}", "index", s->seq - 1));
    s->open = 0;
}

static void text_delta(json_t *ev, struct srv_sent *s, int kind, const char *t, size_t n) {
    if (s->open != kind) {
        close_block(ev, s);
        event(ev, "content_block_start",
              json_pack("{s:i,s:o}", "index", s->seq,
                        "content_block", kind == 1 ? json_pack("{s:s,s:s,s:s}", "type", "thinking", "thinking", "", "signature", "")
                                                   : json_pack("{s:s,s:s}", "type", "text", "text", "")));
        s->seq++;
        s->open = kind;
    }
    if (n)
        event(ev, "content_block_delta",
              json_pack("{s:i,s:o}", "index", s->seq - 1, "delta",
                        kind == 1 ? json_pack("{s:s,s:o}", "type", "thinking_delta", "thinking", toy_srv_jstr(t, n))
                                  : json_pack("{s:s,s:o}", "type", "text_delta", "text", toy_srv_jstr(t, n))));
}

/* a call's step: its tool_use block begins, takes more of its input's JSON, ends. The input streams as
 * written when it is an object; anything else becomes {} at the end, as the whole message has it. */
static void call_step(json_t *ev, struct srv_sent *s, const struct srv_call_step *st, const char *id) {
    if (st->begin) {
        close_block(ev, s);
        char tid[96];
        tool_id(tid, sizeof tid, id, st->k);
        event(ev, "content_block_start", json_pack("{s:i,s:{s:s,s:s,s:s,s:{}}}", "index", s->seq, "content_block", "type",
                                                   "tool_use", "id", tid, "name", st->c->name, "input"));
        s->seq++;
        s->open = 3;
    }
    bool raw = st->c && st->c->arguments[0] == '{';
    if (st->n && raw)
        event(ev, "content_block_delta", json_pack("{s:i,s:{s:s,s:o}}", "index", s->seq - 1, "delta", "type",
                                                   "input_json_delta", "partial_json", toy_srv_jstr(st->delta, st->n)));
    if (st->end) {
        if (st->c && !raw)
            event(ev, "content_block_delta", json_pack("{s:i,s:{s:s,s:s}}", "index", s->seq - 1, "delta", "type",
                                                       "input_json_delta", "partial_json", "{}"));
        close_block(ev, s);
    }
}

json_t *toy_srv_messages_events(const struct srv_api *api, const struct srv_request *r, struct srv_job *j, bool final,
                                struct srv_sent *s, const char *id) {
    (void)api;
    json_t *ev = json_array();
    struct toy_chat_reply p;
    if (!toy_srv_reply_split(r, j, final, &p)) return ev;
    struct srv_call_step *st = malloc((p.n_calls + 1) * sizeof *st);
    size_t ns = st ? toy_srv_call_steps(&p, s, final, st) : 0, i = 0;
    size_t nr = strlen(p.reasoning), nc = strlen(p.content);
    if (nr > s->reasoning) text_delta(ev, s, 1, p.reasoning + s->reasoning, nr - s->reasoning), s->reasoning = nr;
    if (ns && !st[0].begin) call_step(ev, s, &st[i++], id); /* the call open before: its text came first */
    if (nc > s->content) text_delta(ev, s, 2, p.content + s->content, nc - s->content), s->content = nc;
    for (; i < ns; i++) call_step(ev, s, &st[i], id);
    free(st);
    j->n_calls = s->calls;
    toy_chat_reply_free(&p);
    if (final) {
        if (!s->seq) text_delta(ev, s, 2, "", 0); /* an empty reply: still its text block */
        close_block(ev, s);
        const char *seq = user_stop(j);
        event(ev, "message_delta", json_pack("{s:{s:s,s:o},s:{s:I}}", "delta", "stop_reason", stop_reason(r, j),
                                             "stop_sequence", seq ? json_string(seq) : json_null(), "usage",
                                             "output_tokens", (json_int_t)j->n_generated));
        event(ev, "message_stop", json_object());
    }
    return ev;
}

/* Anthropic's error object: {"type": "error", "error": {"type", "message"}} */
json_t *toy_srv_messages_error_json(const struct srv_error *e) {
    const char *type = e->http == 401   ? "authentication_error"
                       : e->http == 403 ? "permission_error"
                       : e->http == 404 ? "not_found_error"
                       : e->http == 413 ? "request_too_large"
                       : e->http == 429 ? "rate_limit_error"
                       : e->http == 503 ? "overloaded_error"
                       : e->http >= 500 ? "api_error"
                                        : "invalid_request_error";
    size_t n;
    char *msg = toy_utf8_clean(e->msg, strlen(e->msg), &n);
    json_t *o = json_pack("{s:s,s:{s:s,s:o}}", "type", "error", "error", "type", type, "message",
                          msg ? json_stringn(msg, n) : json_string("error"));
    free(msg);
    return o;
}

json_t *toy_srv_messages_failed(const char *msg) {
    struct srv_error e = {.http = 500, .type = "server_error"};
    snprintf(e.msg, sizeof e.msg, "%s", msg);
    json_t *ev = json_array();
    json_array_append_new(ev, toy_srv_messages_error_json(&e));
    return ev;
}
