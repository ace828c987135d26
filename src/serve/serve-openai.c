/* serve-openai.c: the OpenAI API of `toy serve`: request bodies of
 * /v1/completions, /v1/chat/completions and /v1/embeddings parsed and
 * checked into engine jobs, and the response objects and stream chunks
 * built from a job's output. Field names, defaults and shapes follow
 * OpenAI's API reference (https://platform.openai.com/docs/api-reference);
 * toy's additions (top_k, min_p, repeat_penalty, ignore_eos, normalize) are
 * listed in docs/serve.md.
 *
 * Every value from the client is checked for type and range before use;
 * a bad one gives a 400 error object naming the parameter. Text that goes
 * back out is valid UTF-8 (tokens that end inside a character get U+FFFD
 * in their "token" string; their raw bytes are in "bytes").
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/serve-internal.h"
#include "toy/chat-template.h"

/* ---- UTF-8 ----------------------------------------------------------------------------- */

json_t *toy_srv_jstr(const char *s, size_t n) {
    if (toy_utf8_valid(s, n)) return json_stringn(s, n);
    size_t m;
    char *c = toy_utf8_clean(s, n, &m);
    json_t *j = c ? json_stringn(c, m) : json_string("");
    free(c);
    return j;
}
#define jstr toy_srv_jstr

json_t *toy_srv_chat_tool(json_t *name, json_t *description, json_t *parameters, json_t *strict) {
    json_t *fn = json_object();
    const char *keys[] = {"name", "description", "parameters", "strict"};
    json_t *vals[] = {name, description, parameters, strict};
    for (int i = 0; i < 4; i++)
        if (vals[i]) json_object_set(fn, keys[i], vals[i]);
    return json_pack("{s:s,s:o}", "type", "function", "function", fn);
}

json_t *toy_srv_join_text(json_t *parts, const char *key) {
    size_t total = 0;
    for (size_t k = 0; k < json_array_size(parts); k++)
        total += json_string_length(json_object_get(json_array_get(parts, k), key));
    char *buf = malloc(total + 1), *w = buf;
    if (!buf) return NULL;
    for (size_t k = 0; k < json_array_size(parts); k++) {
        json_t *t = json_object_get(json_array_get(parts, k), key);
        memcpy(w, json_string_value(t), json_string_length(t));
        w += json_string_length(t);
    }
    json_t *o = json_stringn(buf, total);
    free(buf);
    return o;
}

bool toy_srv_reply_split(const struct srv_request *r, const struct srv_job *j, bool final, struct toy_chat_reply *p) {
    if (r->parse_reply) return toy_chat_reply_parse(&r->syn, j->text, j->text_len, !final, p) == TOY_OK;
    memset(p, 0, sizeof *p); /* a reply that is not split: all content */
    p->reasoning = calloc(1, 1);
    p->content = malloc(j->text_len + 1);
    if (!p->reasoning || !p->content) {
        toy_chat_reply_free(p);
        return false;
    }
    if (j->text_len) memcpy(p->content, j->text, j->text_len);
    p->content[j->text_len] = 0;
    return true;
}

size_t toy_srv_call_steps(const struct toy_chat_reply *p, struct srv_sent *s, bool final, struct srv_call_step *out) {
    size_t n = 0, k0 = s->call_open ? s->calls - 1 : s->calls;
    if (s->call_open && k0 >= p->n_calls) { /* cannot happen (a parse keeps its calls): end it as sent */
        if (final) out[n++] = (struct srv_call_step){.k = k0, .end = true}, s->call_open = false;
        return n;
    }
    for (size_t k = k0; k < p->n_calls; k++) {
        const struct toy_chat_call *c = &p->calls[k];
        struct srv_call_step st = {.k = k, .c = c};
        if (k >= s->calls) st.begin = true, s->calls = k + 1, s->args = 0, s->call_open = true;
        size_t len = strlen(c->arguments);
        if (len > s->args) st.delta = c->arguments + s->args, st.n = len - s->args, s->args = len;
        if (!c->open || final) st.end = true, s->call_open = false;
        out[n++] = st;
    }
    return n;
}

/* a JSON number, or null for NaN and infinities (which JSON cannot carry) */
static json_t *jnum(double x) { return isfinite(x) ? json_real(x) : json_null(); }

/* ---- errors ----------------------------------------------------------------------------- */

bool toy_srv_err(struct srv_error *e, int http, const char *type, const char *code, const char *param,
                 const char *fmt, ...) {
    e->http = http;
    e->type = type;
    e->code = code;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return false;
}

json_t *toy_srv_error_json(const struct srv_error *e) {
    size_t n;
    char *msg = toy_utf8_clean(e->msg, strlen(e->msg), &n);
    json_t *o = json_object();
    json_object_set_new(o, "message", msg ? json_stringn(msg, n) : json_string("error"));
    json_object_set_new(o, "type", json_string(e->type ? e->type : "invalid_request_error"));
    json_object_set_new(o, "param", e->param[0] ? jstr(e->param, strlen(e->param)) : json_null());
    json_object_set_new(o, "code", e->code ? json_string(e->code) : json_null());
    free(msg);
    return json_pack("{s:o}", "error", o);
}

#define BAD(param, ...) toy_srv_err(err, 400, "invalid_request_error", NULL, param, __VA_ARGS__)

/* ---- typed fields -------------------------------------------------------------------------- */

/* number field: absent/null keeps *out; else must be a number in [lo, hi] */
static bool get_num(json_t *o, const char *key, double lo, double hi, double *out, struct srv_error *err) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return true;
    if (!json_is_number(v)) return BAD(key, "'%s' must be a number", key);
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi)) return BAD(key, "'%s' is %g; it must be between %g and %g", key, x, lo, hi);
    *out = x;
    return true;
}

static bool get_int(json_t *o, const char *key, int64_t lo, int64_t hi, int64_t *out, struct srv_error *err) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return true;
    if (!json_is_integer(v)) return BAD(key, "'%s' must be an integer", key);
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return BAD(key, "'%s' is %lld; it must be between %lld and %lld", key, (long long)x, (long long)lo,
                   (long long)hi);
    *out = (int64_t)x;
    return true;
}

static bool get_bool(json_t *o, const char *key, bool *out, struct srv_error *err) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return true;
    if (!json_is_boolean(v)) return BAD(key, "'%s' must be true or false", key);
    *out = json_is_true(v);
    return true;
}

/* ---- prompts ---------------------------------------------------------------------------------- */

/* special: text a template wrote (or a prompt written like one), which gets no second BOS; embed: an embedding's
 * input, which gets the EOS the tokenizer adds (Qwen3-Embedding's: its last-token pooling reads it) */
static bool encode_text(const struct srv_api *api, const char *text, size_t n, bool special, bool embed,
                        struct toy_tokens *out, const char *param, struct srv_error *err) {
    if (!api->tok) return BAD(param, "this model has no tokenizer: send token ids");
    unsigned flags = special ? toy_chat_encode_flags(api->tok, text)
                             : toy_tokenizer_bos(api->tok) >= 0 && toy_tokenizer_add_bos(api->tok) ? TOY_ENCODE_ADD_BOS
                                                                                               : 0;
    if (embed && toy_tokenizer_add_eos(api->tok) && toy_tokenizer_eos(api->tok) >= 0) flags |= TOY_ENCODE_ADD_EOS;
    if (toy_tokenizer_encode(api->tok, text, n, flags, out))
        return toy_srv_err(err, 400, "invalid_request_error", NULL, param, "%s", toy_last_error());
    for (int64_t i = 0; i < out->n; i++) /* a tokenizer larger than the model's embedding table */
        if (out->ids[i] < 0 || out->ids[i] >= api->m->vocab)
            return toy_srv_err(err, 400, "invalid_request_error", NULL, param,
                               "the tokenizer gives id %d, beyond the model's %lld embeddings", out->ids[i],
                               (long long)api->m->vocab);
    return true;
}

/* a JSON array of token ids into out; what names it in errors ("prompt",
 * "input[2]"), param is the error's parameter */
static bool token_array(const struct srv_api *api, json_t *a, struct toy_tokens *out, const char *param,
                        const char *what, struct srv_error *err) {
    size_t n = json_array_size(a);
    out->ids = malloc((n ? n : 1) * sizeof *out->ids);
    if (!out->ids) return toy_srv_err(err, 500, "server_error", NULL, NULL, "out of memory");
    out->cap = (int64_t)(n ? n : 1);
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(a, i);
        if (!json_is_integer(v)) return BAD(param, "'%s'[%zu] is not a token id (an integer)", what, i);
        json_int_t id = json_integer_value(v);
        if (id < 0 || id >= api->m->vocab)
            return BAD(param, "'%s'[%zu] is token %lld; the vocabulary has %lld tokens", what, i, (long long)id,
                       (long long)api->m->vocab);
        out->ids[out->n++] = (int32_t)id;
    }
    return true;
}

static bool is_token_array(json_t *a) {
    return json_is_array(a) && json_array_size(a) > 0 && json_is_integer(json_array_get(a, 0));
}

/* completions' "prompt": a string, an array of ids, or an array of either (several prompts: the at-th, and
 * *n_prompts how many) */
static bool completion_prompt(const struct srv_api *api, json_t *p, int at, int *n_prompts, struct toy_tokens *ids,
                              struct srv_error *err) {
    *n_prompts = 1;
    if (!p) return BAD("prompt", "'prompt' is required");
    if (json_is_array(p) && !is_token_array(p)) {
        size_t k = json_array_size(p);
        if (k == 0 || k > 128) return BAD("prompt", "send 1 to 128 prompts (got %zu)", k);
        *n_prompts = (int)k;
        p = json_array_get(p, (size_t)at);
    }
    if (json_is_string(p)) {
        if (!encode_text(api, json_string_value(p), json_string_length(p), true, false, ids, "prompt", err))
            return false;
        /* text of no tokens starts from BOS, added or not, as toy generate -p "" does */
        if (ids->n == 0 && toy_tokenizer_bos(api->tok) >= 0 &&
            toy_tokenizer_encode(api->tok, "", 0, TOY_ENCODE_ADD_BOS, ids))
            return toy_srv_err(err, 500, "server_error", NULL, NULL, "%s", toy_last_error());
    } else if (is_token_array(p)) {
        if (!token_array(api, p, ids, "prompt", "prompt", err)) return false;
    } else {
        return BAD("prompt", "'prompt' must be a string or an array of token ids");
    }
    if (ids->n == 0) return BAD("prompt", "the prompt is empty (and the model has no BOS token to start from)");
    return true;
}

/* a message's content: a string, null, or an array of {"type": "text", "text": ...} parts */
static bool message_text(json_t *c, size_t i, json_t **out, struct srv_error *err) {
    if (!c || json_is_null(c)) { *out = json_string(""); return true; }
    if (json_is_string(c)) { *out = json_incref(c); return true; }
    if (!json_is_array(c)) return BAD("messages", "messages[%zu].content must be a string or an array of parts", i);
    for (size_t k = 0; k < json_array_size(c); k++) {
        json_t *part = json_array_get(c, k), *t = json_object_get(part, "text");
        const char *type = json_string_value(json_object_get(part, "type"));
        if (!json_is_object(part) || !type) return BAD("messages", "messages[%zu].content[%zu] needs a \"type\"", i, k);
        if (strcmp(type, "text")) return BAD("messages", "messages[%zu].content[%zu]: type '%s' is not supported "
                                             "(text only)", i, k, type);
        if (!json_is_string(t)) return BAD("messages", "messages[%zu].content[%zu].text must be a string", i, k);
    }
    return (*out = toy_srv_join_text(c, "text")) || toy_srv_err(err, 500, "server_error", NULL, NULL, "out of memory");
}

/* an assistant message's tool_calls: [{"id", "type": "function", "function": {"name", "arguments"}}]; arguments
 * that clients send as JSON text become objects, which is what templates print (with tojson) */
static bool message_tool_calls(json_t *c, size_t i, struct srv_error *err) {
    json_t *calls = json_object_get(c, "tool_calls");
    if (!calls || json_is_null(calls)) return true;
    if (!json_is_array(calls)) return BAD("messages", "messages[%zu].tool_calls must be an array", i);
    for (size_t k = 0; k < json_array_size(calls); k++) {
        json_t *f = json_object_get(json_array_get(calls, k), "function");
        json_t *args = json_object_get(f, "arguments");
        if (!json_is_object(f) || !json_is_string(json_object_get(f, "name")))
            return BAD("messages", "messages[%zu].tool_calls[%zu] needs a function with a string name", i, k);
        if (json_is_string(args)) {
            json_t *o = json_loads(json_string_value(args), 0, NULL);
            if (json_is_object(o)) json_object_set_new(f, "arguments", o);
            else json_decref(o);
        }
    }
    return true;
}

/* "tools" and "tool_choice": the tools the template shows and whose calls are parsed (names into r); *force:
 * "required" or a named function's tool_choice (the call is then forced by a grammar, force_call) */
static bool chat_tools(json_t *body, struct srv_request *r, json_t **tools, json_t **force, struct srv_error *err) {
    *tools = json_object_get(body, "tools");
    *force = NULL;
    if (*tools && json_is_null(*tools)) *tools = NULL;
    if (*tools && !json_is_array(*tools)) return BAD("tools", "'tools' must be an array");
    json_t *choice = json_object_get(body, "tool_choice");
    if (choice && !json_is_null(choice)) {
        const char *c = json_string_value(choice);
        const char *type = json_string_value(json_object_get(choice, "type"));
        if (c && !strcmp(c, "none")) *tools = NULL; /* the model is not shown them, so makes no calls */
        else if (c && !strcmp(c, "required")) *force = choice;
        else if (json_is_object(choice) && type && !strcmp(type, "function") &&
                 json_is_string(json_object_get(json_object_get(choice, "function"), "name")))
            *force = choice;
        else if (!c || strcmp(c, "auto"))
            return BAD("tool_choice", "'tool_choice' must be \"auto\", \"none\", \"required\" or "
                       "{\"type\": \"function\", \"function\": {\"name\": ...}}");
        if (*force && !(*tools && json_array_size(*tools)))
            return BAD("tool_choice", "'tool_choice' asks for a call, but 'tools' offers none");
    }
    size_t n = *tools ? json_array_size(*tools) : 0;
    if (n > 1024) return BAD("tools", "at most 1024 tools");
    r->tool_names = calloc(n + 1, sizeof *r->tool_names);
    if (!r->tool_names) return toy_srv_err(err, 500, "server_error", NULL, NULL, "out of memory");
    for (size_t k = 0; k < n; k++) {
        json_t *t = json_array_get(*tools, k), *f = json_object_get(t, "function");
        const char *type = json_string_value(json_object_get(t, "type")), *name = json_string_value(json_object_get(f, "name"));
        if (!json_is_object(t) || !type || strcmp(type, "function"))
            return BAD("tools", "tools[%zu] must be {\"type\": \"function\", \"function\": {...}}", k);
        if (!name || !*name) return BAD("tools", "tools[%zu].function needs a name", k);
        if (!(r->tool_names[k] = strdup(name))) return toy_srv_err(err, 500, "server_error", NULL, NULL, "out of memory");
    }
    r->syn.tools = n > 0;
    r->syn.tool_names = (const char *const *)r->tool_names;
    r->syn.n_tool_names = n;
    return true;
}

/* where a reply's grammar starts: after a reasoning block the prompt opened, or (a JSON answer from gpt-oss) in
 * its final channel; a forced call starts at once. A model that may open a reasoning block itself may do so
 * first, as it likes. */
static enum toy_status grammar_start(struct srv_request *r, bool call) {
    if (r->syn.format == TOY_CHAT_FORMAT_HARMONY && r->ep == SRV_EP_CHAT && !call)
        r->job->grammar_after[0] = "<|channel|>final", r->job->grammar_after[1] = "<|message|>";
    else if (r->syn.in_think)
        r->job->grammar_after[0] = "</think>";
    else if (r->syn.think && r->ep == SRV_EP_CHAT)
        return toy_json_grammar_allow_block(r->job->grammar, "<think>", "</think>");
    return TOY_OK;
}

/* A tool's parameters as a schema of their own (NULL when they use what the grammar cannot enforce: the call's
 * arguments are then any object) */
static json_t *tool_params(json_t *fn) {
    json_t *params = json_object_get(fn, "parameters");
    if (!json_is_object(params)) return NULL;
    char *text = json_dumps(params, JSON_COMPACT);
    struct toy_json_grammar *g = NULL;
    bool ok = text && toy_json_grammar_compile(text, &g) == TOY_OK;
    toy_json_grammar_free(g);
    free(text);
    return ok ? json_deep_copy(params) : NULL;
}

/* s's "$ref"s to its own #/$defs/X (or #/definitions/X, or "#" itself) renamed to #/$defs/<tag>X, so that s can
 * sit inside a larger schema whose $defs take its definitions */
static void rename_refs(json_t *s, const char *tag) {
    if (json_is_array(s)) {
        for (size_t i = 0; i < json_array_size(s); i++) rename_refs(json_array_get(s, i), tag);
        return;
    }
    if (!json_is_object(s)) return;
    const char *key;
    json_t *v;
    json_object_foreach(s, key, v) {
        const char *ref = !strcmp(key, "$ref") ? json_string_value(v) : NULL;
        if (!ref) {
            rename_refs(v, tag);
            continue;
        }
        const char *name = !strncmp(ref, "#/$defs/", 8) ? ref + 8 : !strncmp(ref, "#/definitions/", 14) ? ref + 14
                           : !strcmp(ref, "#")                    ? ""
                                                                  : NULL;
        if (!name) continue;
        char *to = malloc(strlen(tag) + strlen(name) + 16);
        if (!to) continue;
        sprintf(to, "#/$defs/%s%s", tag, name);
        json_object_set_new(s, key, json_string(to));
        free(to);
    }
}

/* the schema of one call {"name": <name>, "<key>": <its parameters>}; their definitions move to defs */
static json_t *call_schema(json_t *fn, const char *key, size_t k, json_t *defs) {
    json_t *params = tool_params(fn);
    char tag[32];
    snprintf(tag, sizeof tag, "tool%zu.", k);
    if (params) {
        json_t *own = json_object_get(params, "$defs");
        if (!own) own = json_object_get(params, "definitions");
        const char *name;
        json_t *d;
        char full[512];
        rename_refs(params, tag);
        json_object_foreach(own, name, d) {
            snprintf(full, sizeof full, "%s%s", tag, name);
            json_object_set(defs, full, d);
        }
        json_object_del(params, "$defs");
        json_object_del(params, "definitions");
        json_object_set(defs, tag, params); /* for a "#" ref: the parameters themselves */
    }
    return json_pack("{s:s,s:{s:{s:O},s:o},s:[s,s],s:b}", "type", "object", "properties", "name", "const",
                     json_object_get(fn, "name"), key, params ? params : json_pack("{s:s}", "type", "object"),
                     "required", "name", key, "additionalProperties", 0);
}

/* tool_choice "required" or a named function: the reply is a call, in the model's own syntax, sampled within a
 * grammar: its markers, and the name of one of the tools with that tool's arguments (any object for a tool
 * whose parameters use what the grammar cannot enforce). Hermes, Llama 3 and Mistral write the name in the
 * JSON, so a call is one of the tools' schemas; DeepSeek and gpt-oss write it in the markers, so a call is one
 * of the tools' forms. */
static bool force_call(struct srv_request *r, json_t *tools, const char *name, struct srv_error *err) {
    enum toy_chat_format f = r->syn.format;
    if (f != TOY_CHAT_FORMAT_HERMES && f != TOY_CHAT_FORMAT_MISTRAL && f != TOY_CHAT_FORMAT_LLAMA3 &&
        f != TOY_CHAT_FORMAT_HARMONY && f != TOY_CHAT_FORMAT_DEEPSEEK)
        return BAD("tool_choice", "this model's template writes tool calls in a form toy cannot force (%s); use "
                   "\"auto\"", toy_chat_format_name(f));
    json_t *fns = json_array();
    for (size_t k = 0; k < json_array_size(tools); k++) {
        json_t *fn = json_object_get(json_array_get(tools, k), "function");
        if (!name || !strcmp(json_string_value(json_object_get(fn, "name")), name)) json_array_append(fns, fn);
    }
    size_t n = json_array_size(fns);
    if (n > 64) {
        json_decref(fns);
        return BAD("tool_choice", "a call can be forced among at most 64 tools (%zu offered); name one", n);
    }
    enum toy_status st = TOY_OK;
    struct toy_json_form forms[64];
    char *texts[64] = {0}, *prefixes[64] = {0}, *suffixes[64] = {0};
    if (f == TOY_CHAT_FORMAT_HARMONY || f == TOY_CHAT_FORMAT_DEEPSEEK) { /* a form per tool */
        for (size_t k = 0; k < n && !st; k++) {
            json_t *fn = json_array_get(fns, k), *params = tool_params(fn);
            texts[k] = params ? json_dumps(params, JSON_COMPACT) : NULL;
            json_decref(params);
            if (!toy_chat_call_frame(&r->syn, json_string_value(json_object_get(fn, "name")), &prefixes[k],
                                     &suffixes[k]))
                st = toy_error(TOY_ERR_NOMEM, "tool_choice");
            forms[k] = (struct toy_json_form){texts[k], prefixes[k], suffixes[k]};
        }
    } else { /* one form: any of the tools' calls */
        const char *key = f == TOY_CHAT_FORMAT_LLAMA3 ? "parameters" : "arguments";
        json_t *defs = json_object(), *alts = json_array();
        for (size_t k = 0; k < n; k++) json_array_append_new(alts, call_schema(json_array_get(fns, k), key, k, defs));
        json_t *schema = json_pack("{s:o}", "anyOf", alts);
        if (schema && f == TOY_CHAT_FORMAT_MISTRAL)
            schema = json_pack("{s:s,s:o,s:i,s:i}", "type", "array", "items", schema, "minItems", 1, "maxItems", 1);
        if (schema) json_object_set(schema, "$defs", defs); /* at the root, where the $refs point */
        json_decref(defs);
        texts[0] = schema ? json_dumps(schema, JSON_COMPACT) : NULL;
        json_decref(schema);
        if (!texts[0] || !toy_chat_call_frame(&r->syn, NULL, &prefixes[0], &suffixes[0]))
            st = toy_error(TOY_ERR_NOMEM, "tool_choice");
        forms[0] = (struct toy_json_form){texts[0], prefixes[0], suffixes[0]};
        n = 1;
    }
    if (!st) st = toy_json_grammar_compile_forms(forms, (int)n, &r->job->grammar);
    for (size_t k = 0; k < n; k++) free(texts[k]), free(prefixes[k]), free(suffixes[k]);
    json_decref(fns);
    if (!st) st = grammar_start(r, true);
    if (st) return toy_srv_err(err, 500, "server_error", NULL, NULL, "tool_choice: %s", toy_last_error());
    r->syn.tools = true;
    r->parse_reply = true;
    r->job->keep_special = toy_chat_syntax_keeps_special(&r->syn);
    return true;
}

static bool chat_prompt(const struct srv_api *api, json_t *body, struct srv_request *r, struct toy_tokens *ids,
                        struct srv_error *err) {
    json_t *msgs = json_object_get(body, "messages");
    if (!json_is_array(msgs) || json_array_size(msgs) == 0)
        return BAD("messages", "'messages' must be a non-empty array of {role, content}");
    if (!api->tmpl) return toy_srv_err(err, 400, "invalid_request_error", NULL, "messages", "no chat template");
    r->syn = api->syntax;
    json_t *tools, *force;
    if (!chat_tools(body, r, &tools, &force, err)) return false;
    const char *forced_name = json_is_object(force)
                                  ? json_string_value(json_object_get(json_object_get(force, "function"), "name"))
                                  : NULL;
    if (forced_name) {
        bool known = false;
        for (size_t k = 0; r->tool_names[k]; k++) known |= !strcmp(r->tool_names[k], forced_name);
        if (!known) return BAD("tool_choice", "tool_choice names '%s', which 'tools' does not offer", forced_name);
    }
    json_t *norm = json_array();
    for (size_t i = 0; i < json_array_size(msgs); i++) {
        json_t *m = json_array_get(msgs, i), *content = NULL;
        if (!json_is_object(m) || !json_is_string(json_object_get(m, "role"))) {
            json_decref(norm);
            return BAD("messages", "messages[%zu] must be an object with a string 'role'", i);
        }
        static const char *const roles[] = {"system", "developer", "user", "assistant", "tool"};
        const char *role = json_string_value(json_object_get(m, "role"));
        size_t k = 0;
        while (k < sizeof roles / sizeof roles[0] && strcmp(role, roles[k])) k++;
        if (k == sizeof roles / sizeof roles[0]) {
            json_decref(norm);
            return BAD("messages", "messages[%zu] has role '%s' (system, developer, user, assistant or tool)", i,
                       role);
        }
        if (!message_text(json_object_get(m, "content"), i, &content, err)) {
            json_decref(norm);
            return false;
        }
        json_t *c = json_deep_copy(m);
        json_object_set_new(c, "content", content);
        /* a reply's reasoning sent back: gpt-oss's template reads it as "thinking" (Qwen3's as it is) */
        json_t *rc = json_object_get(c, "reasoning_content");
        if (r->syn.format == TOY_CHAT_FORMAT_HARMONY && json_is_string(rc) && !json_object_get(c, "thinking"))
            json_object_set(c, "thinking", rc);
        json_array_append_new(norm, c);
        if (!message_tool_calls(c, i, err)) {
            json_decref(norm);
            return false;
        }
    }
    json_t *vars = json_object();
    json_object_set_new(vars, "messages", norm);
    if (tools) json_object_set(vars, "tools", tools);
    /* OpenAI's reasoning_effort (gpt-oss's template reads it), and llama.cpp's chat_template_kwargs: more
     * template variables, which do not replace messages, tools or reasoning_effort */
    json_t *effort = json_object_get(body, "reasoning_effort"), *kw = json_object_get(body, "chat_template_kwargs");
    if ((effort && !json_is_null(effort) && !json_is_string(effort)) || (kw && !json_is_null(kw) && !json_is_object(kw))) {
        json_decref(vars);
        return effort && !json_is_null(effort) && !json_is_string(effort)
                   ? BAD("reasoning_effort", "'reasoning_effort' must be a string (low, medium, high)")
                   : BAD("chat_template_kwargs", "'chat_template_kwargs' must be an object of template variables");
    }
    if (json_is_string(effort)) json_object_set(vars, "reasoning_effort", effort);
    if (json_is_object(kw)) json_object_update_missing(vars, kw);
    char *js = json_dumps(vars, JSON_COMPACT);
    json_decref(vars);
    const struct toy_tokenizer *tok = api->tok;
    int32_t b = toy_tokenizer_bos(tok), e = toy_tokenizer_eos(tok);
    struct toy_chat_vars cv = {.bos_token = b >= 0 ? toy_tokenizer_piece(tok, b) : "",
                               .eos_token = e >= 0 ? toy_tokenizer_piece(tok, e) : "",
                               .add_generation_prompt = true};
    char *text = NULL;
    enum toy_status st = js ? toy_chat_template_render_json(api->tmpl, js, &cv, &text)
                            : toy_error(TOY_ERR_NOMEM, "messages");
    free(js);
    if (st) {
        free(text);
        return toy_srv_err(err, 400, "invalid_request_error", NULL, "messages", "%s", toy_last_error());
    }
    bool ok = encode_text(api, text, strlen(text), true, false, ids, "messages", err);
    /* a reply is split when the model writes reasoning or channels, or may call the tools it was offered */
    r->syn.in_think = r->syn.think && toy_chat_prompt_in_think(text);
    r->parse_reply = r->syn.think || r->syn.format == TOY_CHAT_FORMAT_HARMONY ||
                     (r->syn.tools && r->syn.format != TOY_CHAT_FORMAT_CONTENT);
    r->job->keep_special = r->parse_reply && toy_chat_syntax_keeps_special(&r->syn);
    free(text);
    if (ok && ids->n == 0) return BAD("messages", "the rendered conversation is empty");
    if (ok && force) ok = force_call(r, tools, forced_name, err);
    return ok;
}

/* ---- requests ------------------------------------------------------------------------------------ */

static bool parse_stop(json_t *body, struct srv_job *j, struct srv_error *err) {
    json_t *s = json_object_get(body, "stop");
    if (!s || json_is_null(s)) return true;
    json_t *one[1] = {s};
    size_t n = json_is_array(s) ? json_array_size(s) : 1;
    if (!json_is_array(s) && !json_is_string(s)) return BAD("stop", "'stop' must be a string or an array of strings");
    if (n > SRV_MAX_STOP - 4) return BAD("stop", "at most %d stop strings", SRV_MAX_STOP - 4);
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_is_array(s) ? json_array_get(s, i) : one[0];
        if (!json_is_string(v)) return BAD("stop", "'stop'[%zu] must be a string", i);
        if (json_string_length(v) == 0) continue;
        if (json_string_length(v) > 256) return BAD("stop", "a stop string is at most 256 bytes");
        j->stop[j->n_stop++] = strdup(json_string_value(v));
    }
    j->n_user_stop = j->n_stop;
    return true;
}

/* logit_bias: {"token id": bias in [-100, 100], ...} */
static bool parse_bias(const struct srv_api *api, json_t *body, struct srv_job *j, struct srv_error *err) {
    json_t *b = json_object_get(body, "logit_bias");
    if (!b || json_is_null(b)) return true;
    if (!json_is_object(b)) return BAD("logit_bias", "'logit_bias' must be an object of token id -> bias");
    size_t n = json_object_size(b);
    if (n > 1024) return BAD("logit_bias", "at most 1024 biased tokens");
    j->bias_id = malloc((n ? n : 1) * sizeof *j->bias_id);
    j->bias = malloc((n ? n : 1) * sizeof *j->bias);
    if (!j->bias_id || !j->bias) return toy_srv_err(err, 500, "server_error", NULL, NULL, "out of memory");
    const char *key;
    json_t *v;
    json_object_foreach(b, key, v) {
        char *end;
        long long id = strtoll(key, &end, 10);
        if (end == key || *end || id < 0 || id >= api->m->vocab)
            return BAD("logit_bias", "logit_bias key '%s' is not a token id below %lld", key,
                       (long long)api->m->vocab);
        if (!json_is_number(v) || json_number_value(v) < -100 || json_number_value(v) > 100)
            return BAD("logit_bias", "logit_bias['%s'] must be a number in [-100, 100]", key);
        j->bias_id[j->n_bias] = (int32_t)id;
        j->bias[j->n_bias++] = (float)json_number_value(v);
    }
    return true;
}

/* prediction (OpenAI's Predicted Outputs): {"type": "content", "content": text, or [{"type": "text", "text": ...}],
 * or token ids}: the reply is expected to follow it in long stretches (a file with a few edits), which are drafted
 * and checked as speculative decoding's drafts: the reply is the one it would be without */
static bool parse_prediction(const struct srv_api *api, json_t *body, struct srv_job *j, struct srv_error *err) {
    json_t *p = json_object_get(body, "prediction");
    if (!p || json_is_null(p)) return true;
    const char *type = json_string_value(json_object_get(p, "type"));
    json_t *c = json_object_get(p, "content");
    if (!json_is_object(p) || !type || strcmp(type, "content") || !c)
        return BAD("prediction", "'prediction' must be {\"type\": \"content\", \"content\": the text expected}");
    struct toy_tokens ids = {0};
    bool ok;
    if (is_token_array(c)) {
        ok = token_array(api, c, &ids, "prediction", "prediction.content", err);
    } else {
        char *text = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&text, &len);
        if (!f) return toy_srv_err(err, 500, "server_error", NULL, NULL, "out of memory");
        ok = true;
        if (json_is_string(c)) {
            fwrite(json_string_value(c), 1, json_string_length(c), f);
        } else if (json_is_array(c)) {
            for (size_t i = 0; ok && i < json_array_size(c); i++) {
                json_t *part = json_array_get(c, i), *t = json_object_get(part, "text");
                const char *pt = json_string_value(json_object_get(part, "type"));
                ok = pt && !strcmp(pt, "text") && json_is_string(t);
                if (ok) fwrite(json_string_value(t), 1, json_string_length(t), f);
                else BAD("prediction", "'prediction.content'[%zu] must be {\"type\": \"text\", \"text\": ...}", i);
            }
        } else {
            ok = BAD("prediction", "'prediction.content' must be a string, an array of text parts or token ids");
        }
        fclose(f);
        if (ok && !api->tok) ok = BAD("prediction", "this model has no tokenizer: send the prediction as token ids");
        if (ok && toy_tokenizer_encode(api->tok, text, len, 0, &ids))
            ok = toy_srv_err(err, 400, "invalid_request_error", NULL, "prediction", "%s", toy_last_error());
        free(text);
    }
    if (ok && ids.n > api->n_ctx)
        ok = BAD("prediction", "the prediction has %lld tokens, more than the context's %lld", (long long)ids.n,
                 (long long)api->n_ctx);
    for (int64_t i = 0; ok && i < ids.n; i++)
        if (ids.ids[i] < 0 || ids.ids[i] >= api->m->vocab)
            ok = BAD("prediction", "the tokenizer gives id %d, beyond the model's %lld embeddings", ids.ids[i],
                     (long long)api->m->vocab);
    if (!ok) {
        toy_tokens_free(&ids);
        return false;
    }
    j->pred = ids.ids;
    j->n_pred = ids.n;
    return true;
}

/* response_format: text, json_object (any object; llama.cpp's "schema" beside it narrows it) or json_schema
 * ({"json_schema": {"name", "schema", "strict"}}): the reply is sampled within the schema's grammar */
static bool parse_response_format(const struct srv_api *api, json_t *body, struct srv_request *r,
                                  struct srv_error *err) {
    json_t *rf = json_object_get(body, "response_format");
    if (!rf || json_is_null(rf)) return true;
    const char *type = json_string_value(json_object_get(rf, "type"));
    if (!json_is_object(rf) || !type)
        return BAD("response_format", "'response_format' must be {\"type\": \"text\" | \"json_object\" | \"json_schema\"}");
    if (!strcmp(type, "text")) return true;
    if (r->job->grammar) return BAD("response_format", "a JSON response_format and a forced tool call (tool_choice) "
                                    "cannot both shape the reply");
    json_t *schema = NULL;
    if (!strcmp(type, "json_object")) {
        schema = json_object_get(rf, "schema");
    } else if (!strcmp(type, "json_schema")) {
        json_t *js = json_object_get(rf, "json_schema");
        schema = json_object_get(js, "schema");
        if (!json_is_object(js) || !schema)
            return BAD("response_format", "json_schema needs \"json_schema\": {\"name\": ..., \"schema\": {...}}");
    } else {
        return BAD("response_format", "response_format type '%s' (text, json_object or json_schema)", type);
    }
    if (!api->tok) return BAD("response_format", "this model has no tokenizer, so its text cannot be constrained");
    char *text = schema ? json_dumps(schema, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
    enum toy_status st = schema && !text ? toy_error(TOY_ERR_NOMEM, "schema")
                                         : toy_json_grammar_compile(text, &r->job->grammar);
    free(text);
    if (st) return BAD("response_format", "%s", toy_last_error());
    if (grammar_start(r, false)) return toy_srv_err(err, 500, "server_error", NULL, NULL, "%s", toy_last_error());
    return true;
}

static bool parse_model(const struct srv_api *api, json_t *body, struct srv_error *err) {
    json_t *m = json_object_get(body, "model");
    if (!m || json_is_null(m)) return true;
    if (!json_is_string(m)) return BAD("model", "'model' must be a string");
    if (strcmp(json_string_value(m), api->model_name))
        return toy_srv_err(err, 404, "invalid_request_error", "model_not_found", "model",
                           "The model '%s' does not exist (this server serves '%s')", json_string_value(m),
                           api->model_name);
    return true;
}

/* completions' "suffix": the text to fill in between the prompt and it, as the model's fill-in-the-middle tokens
 * ask: [BOS] <prefix> prompt <suffix> suffix <middle>, and the completion is the middle */
static bool fim_prompt(const struct srv_api *api, struct srv_job *j, json_t *suffix, bool echo, struct srv_error *err) {
    int32_t fim[3];
    for (int k = 0; k < 3; k++) fim[k] = api->tok ? toy_tokenizer_fim(api->tok, k) : -1;
    if (fim[0] < 0 || fim[1] < 0 || fim[2] < 0)
        return BAD("suffix", "this model's vocabulary has no fill-in-the-middle tokens (prefix, suffix, middle)");
    if (echo) return BAD("echo", "\"echo\" with a \"suffix\" is not supported");
    struct toy_tokens sfx = {0};
    if (toy_tokenizer_encode(api->tok, json_string_value(suffix), json_string_length(suffix), 0, &sfx))
        return toy_srv_err(err, 400, "invalid_request_error", NULL, "suffix", "%s", toy_last_error());
    bool bos = j->n_prompt > 0 && j->prompt[0] == toy_tokenizer_bos(api->tok);
    int64_t n = j->n_prompt + sfx.n + 3;
    int32_t *p = malloc((size_t)n * sizeof *p);
    if (!p) {
        toy_tokens_free(&sfx);
        return toy_srv_err(err, 500, "server_error", NULL, NULL, "out of memory");
    }
    int64_t at = 0;
    if (bos) p[at++] = j->prompt[0];
    p[at++] = fim[0];
    for (int64_t i = bos; i < j->n_prompt; i++) p[at++] = j->prompt[i];
    p[at++] = fim[1];
    for (int64_t i = 0; i < sfx.n; i++) p[at++] = sfx.ids[i];
    p[at++] = fim[2];
    toy_tokens_free(&sfx);
    free(j->prompt);
    j->prompt = p;
    j->n_prompt = at;
    for (int64_t i = 0; i < at; i++) /* a tokenizer larger than the model's embedding table */
        if (p[i] >= api->m->vocab)
            return BAD("suffix", "the tokenizer gives id %d, beyond the model's %lld embeddings", p[i],
                       (long long)api->m->vocab);
    if (at >= api->n_ctx)
        return toy_srv_err(err, 400, "invalid_request_error", "context_length_exceeded", "suffix",
                           "This model's maximum context length is %lld tokens; the prompt and suffix take %lld",
                           (long long)api->n_ctx, (long long)at);
    return true;
}

static bool parse_generate(const struct srv_api *api, json_t *body, struct srv_request *r, struct srv_error *err) {
    bool chat = r->ep == SRV_EP_CHAT;
    struct srv_job *j = r->job = toy_srv_job_new(SRV_JOB_GENERATE);
    if (!j) return toy_srv_err(err, 500, "server_error", NULL, NULL, "out of memory");
    struct toy_tokens ids = {0};
    if (!(chat ? chat_prompt(api, body, r, &ids, err)
               : completion_prompt(api, json_object_get(body, "prompt"), r->prompt_at, &r->n_prompts, &ids, err))) {
        toy_tokens_free(&ids);
        return false;
    }
    j->prompt = ids.ids;
    j->n_prompt = ids.n;
    if (r->count_only) return true;
    if (j->n_prompt >= api->n_ctx)
        return toy_srv_err(err, 400, "invalid_request_error", "context_length_exceeded", chat ? "messages" : "prompt",
                           "This model's maximum context length is %lld tokens (prompt and completion); the prompt has "
                           "%lld tokens, at most %lld leave room for a completion",
                           (long long)api->n_ctx, (long long)j->n_prompt, (long long)api->n_ctx - 1);
    double temp = 1, top_p = 1, min_p = 0, fp = 0, pp = 0, rp = 1;
    int64_t max_tokens = chat ? -1 : 16, top_k = 0, n = 1, seed = -1, lp_n = -1, top_lp = 0, best_of = 1;
    if (!get_int(body, "max_tokens", 0, INT32_MAX, &max_tokens, err)) return false;
    if (chat && !get_int(body, "max_completion_tokens", 0, INT32_MAX, &max_tokens, err)) return false;
    if (!get_num(body, "temperature", 0, 2, &temp, err) || !get_num(body, "top_p", 0, 1, &top_p, err) ||
        !get_num(body, "min_p", 0, 1, &min_p, err) || !get_num(body, "frequency_penalty", -2, 2, &fp, err) ||
        !get_num(body, "presence_penalty", -2, 2, &pp, err) || !get_num(body, "repeat_penalty", 0, 10, &rp, err) ||
        !get_int(body, "top_k", 0, INT32_MAX, &top_k, err) || !get_int(body, "n", 1, 128, &n, err) ||
        !get_int(body, "seed", INT64_MIN, INT64_MAX, &seed, err))
        return false;
    r->n_choices = (int)n;
    if (!chat) { /* legacy completion options toy does not implement: refused, not ignored */
        best_of = n; /* absent: n */
        if (!get_bool(body, "echo", &r->echo, err) || !get_int(body, "best_of", 1, 128, &best_of, err)) return false;
        if (best_of < n) return BAD("best_of", "'best_of' (%lld) must be at least 'n' (%lld)", (long long)best_of,
                                    (long long)n);
        json_t *sfx = json_object_get(body, "suffix");
        if (sfx && !json_is_null(sfx) && !json_is_string(sfx)) return BAD("suffix", "'suffix' must be a string");
        if (json_string_length(sfx) && !fim_prompt(api, j, sfx, r->echo, err)) return false;
    }
    j->continues = !chat;
    if (!get_bool(body, "stream", &r->stream, err) || !get_bool(body, "ignore_eos", &j->ignore_eos, err)) return false;
    r->best_of = (int)(best_of > n ? best_of : n);
    if (r->stream && r->best_of > r->n_choices) return BAD("best_of", "best_of > n cannot be streamed");
    json_t *so = json_object_get(body, "stream_options");
    if (so && !json_is_null(so)) {
        if (!json_is_object(so)) return BAD("stream_options", "'stream_options' must be an object");
        if (!get_bool(so, "include_usage", &r->include_usage, err)) return false;
    }
    json_t *lpv = json_object_get(body, "logprobs");
    if (chat) {
        if (!get_bool(body, "logprobs", &r->logprobs, err)) return false;
        if (!get_int(body, "top_logprobs", 0, SRV_MAX_TOP_LOGPROBS, &top_lp, err)) return false;
        if (top_lp > 0 && !r->logprobs) return BAD("top_logprobs", "'top_logprobs' needs \"logprobs\": true");
    } else {
        if (json_is_boolean(lpv)) lp_n = json_is_true(lpv) ? 0 : -1;
        else if (!get_int(body, "logprobs", 0, 5, &lp_n, err)) return false;
        r->logprobs = lp_n >= 0;
        top_lp = lp_n > 0 ? lp_n : 0;
    }
    j->top_logprobs = (int)top_lp;
    j->score_prompt = r->echo && r->logprobs;
    j->want_logprob = r->logprobs || r->best_of > r->n_choices;
    if (!parse_stop(body, j, err) || !parse_bias(api, body, j, err) || !parse_response_format(api, body, r, err) ||
        !parse_prediction(api, body, j, err))
        return false;
    if (chat)
        for (int i = 0; i < api->n_eot_stops; i++) j->stop[j->n_stop++] = strdup(api->eot_stops[i]);
    j->max_tokens = max_tokens;
    j->sp.temperature = (float)temp;
    j->sp.top_p = (float)top_p;
    j->sp.top_k = (int32_t)top_k;
    j->sp.min_p = (float)min_p;
    j->sp.frequency_penalty = (float)fp;
    j->sp.presence_penalty = (float)pp;
    j->sp.repeat_penalty = (float)rp;
    static atomic_ullong seed_counter;
    j->sp.seed = seed != -1 ? (uint64_t)seed /* any seed but -1 (llama.cpp's "random") is reproducible */
                           : (uint64_t)(toy_srv_now() * 1e9) ^ (atomic_fetch_add(&seed_counter, 1) * 0x9E3779B97F4A7C15ull);
    j->timeout_s = api->timeout_s;
    return true;
}

static bool parse_embeddings(const struct srv_api *api, json_t *body, struct srv_request *r, struct srv_error *err) {
    struct srv_job *j = r->job = toy_srv_job_new(SRV_JOB_EMBED);
    if (!j) return toy_srv_err(err, 500, "server_error", NULL, NULL, "out of memory");
    if (api->m->pooling == TOY_POOLING_RANK)
        return BAD("input", "this model is a reranker (pooling_type rank): it scores pairs, it does not embed; "
                   "serve it with --pooling mean|cls|last to embed anyway");
    json_t *in = json_object_get(body, "input");
    if (!in) return BAD("input", "'input' is required");
    /* one input (string or ids) or a list of them */
    bool list = json_is_array(in) && !is_token_array(in);
    size_t n = list ? json_array_size(in) : 1;
    if (n == 0) return BAD("input", "'input' is empty");
    if (n > 2048) return BAD("input", "at most 2048 inputs per request");
    j->inputs = calloc(n, sizeof *j->inputs);
    j->n_input = calloc(n, sizeof *j->n_input);
    if (!j->inputs || !j->n_input) return toy_srv_err(err, 500, "server_error", NULL, NULL, "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_t *v = list ? json_array_get(in, i) : in;
        struct toy_tokens ids = {0};
        bool ok;
        if (json_is_string(v)) ok = encode_text(api, json_string_value(v), json_string_length(v), false, true, &ids,
                                                "input", err);
        else if (is_token_array(v)) {
            char what[32] = "input";
            if (list) snprintf(what, sizeof what, "input[%zu]", i);
            ok = token_array(api, v, &ids, "input", what, err);
        }
        else ok = BAD("input", "'input' must be a string, an array of strings, or token ids");
        j->inputs[i] = ids.ids;
        j->n_input[i] = ids.n;
        j->n_inputs = (int)i + 1;
        if (!ok) return false;
        if (ids.n == 0) return BAD("input", "input %zu is empty", i);
        if (ids.n > api->n_ctx)
            return toy_srv_err(err, 400, "invalid_request_error", "context_length_exceeded", "input",
                               "input %zu has %lld tokens; the maximum is %lld", i, (long long)ids.n,
                               (long long)api->n_ctx);
        r->n_tokens += ids.n;
    }
    r->normalize = true;
    if (!get_bool(body, "normalize", &r->normalize, err)) return false;
    json_t *fmt = json_object_get(body, "encoding_format");
    if (fmt && !json_is_null(fmt)) {
        const char *f = json_string_value(fmt);
        if (!f || (strcmp(f, "float") && strcmp(f, "base64")))
            return BAD("encoding_format", "'encoding_format' must be \"float\" or \"base64\"");
        r->base64 = !strcmp(f, "base64");
    }
    int64_t dims = api->m->d_model;
    if (!get_int(body, "dimensions", 1, INT32_MAX, &dims, err)) return false;
    if (dims != api->m->d_model)
        return BAD("dimensions", "this model's embeddings have %lld dimensions", (long long)api->m->d_model);
    return true;
}

bool toy_srv_parse_request(const struct srv_api *api, enum srv_endpoint ep, const char *body, size_t len,
                           struct srv_request *r, struct srv_error *err) {
    return toy_srv_parse_request_at(api, ep, body, len, 0, r, err);
}

bool toy_srv_parse_request_at(const struct srv_api *api, enum srv_endpoint ep, const char *body, size_t len,
                              int prompt_at, struct srv_request *r, struct srv_error *err) {
    memset(r, 0, sizeof *r);
    r->ep = ep;
    r->n_prompts = 1;
    r->prompt_at = prompt_at;
    if (!toy_utf8_valid(body, len)) return BAD(NULL, "the request body is not valid UTF-8");
    json_error_t je;
    json_t *o = json_loadb(body, len, 0, &je);
    if (!o && json_error_code(&je) == json_error_numeric_overflow)
        return BAD(NULL, "a number at line %d, column %d is out of range (integers are 64-bit): %s", je.line,
                   je.column, je.text);
    if (!o) return BAD(NULL, "malformed JSON at line %d, column %d: %s", je.line, je.column, je.text);
    bool ok;
    if (!json_is_object(o)) ok = BAD(NULL, "the request body must be a JSON object");
    else if (!parse_model(api, o, err)) ok = false;
    else if (ep == SRV_EP_RESPONSES) { /* run as the chat request it translates to */
        json_t *chat = NULL;
        r->ep = SRV_EP_CHAT;
        r->resp_body = json_incref(o);
        ok = toy_srv_responses_to_chat(api, o, &chat, r, err) && parse_generate(api, chat, r, err);
        if (!ok) toy_srv_responses_param(err);
        json_decref(chat);
    } else if (ep == SRV_EP_MESSAGES || ep == SRV_EP_COUNT_TOKENS) {
        json_t *chat = NULL;
        r->ep = SRV_EP_CHAT;
        r->anth_body = json_incref(o);
        r->count_only = ep == SRV_EP_COUNT_TOKENS;
        ok = toy_srv_messages_to_chat(o, ep == SRV_EP_COUNT_TOKENS, &chat, err) && parse_generate(api, chat, r, err);
        json_decref(chat);
    } else ok = ep == SRV_EP_EMBEDDINGS ? parse_embeddings(api, o, r, err) : parse_generate(api, o, r, err);
    json_decref(o);
    return ok;
}

void toy_srv_request_free(struct srv_request *r) {
    toy_srv_job_unref(r->job);
    r->job = NULL;
    for (size_t i = 0; r->tool_names && r->tool_names[i]; i++) free(r->tool_names[i]);
    free(r->tool_names);
    r->tool_names = NULL;
    json_decref(r->resp_body);
    json_decref(r->anth_body);
    json_decref(r->resp_conv);
    json_decref(r->resp_input);
    r->resp_body = r->anth_body = r->resp_conv = r->resp_input = NULL;
}

/* ---- responses ------------------------------------------------------------------------------------ */

const char *toy_srv_finish_reason(const struct srv_job *j) {
    if (j->timed_out) return "length";
    switch (j->reason) {
    case TOY_STOP_LENGTH:
    case TOY_STOP_CONTEXT: return "length";
    default: return j->n_calls ? "tool_calls" : "stop";
    }
}

json_t *toy_srv_usage_json(const struct srv_job *j) {
    int64_t p = j->n_prompt, c = j->n_generated;
    json_t *u = json_pack("{s:I,s:I,s:I,s:{s:I}}", "prompt_tokens", (json_int_t)p, "completion_tokens", (json_int_t)c,
                          "total_tokens", (json_int_t)(p + c), "prompt_tokens_details", "cached_tokens",
                          (json_int_t)j->n_cached);
    if (u && j->pred) /* Predicted Outputs: the prediction's drafted tokens the reply kept, and those it did not */
        json_object_set_new(u, "completion_tokens_details",
                            json_pack("{s:I,s:I}", "accepted_prediction_tokens", (json_int_t)j->pred_accepted,
                                      "rejected_prediction_tokens", (json_int_t)j->pred_rejected));
    return u;
}

static json_t *token_string(const struct srv_api *api, int32_t id) {
    size_t n = 0;
    const char *b = api->tok ? toy_tokenizer_token_bytes(api->tok, id, &n) : NULL;
    if (!b) {
        char buf[32];
        snprintf(buf, sizeof buf, "<%d>", id);
        return json_string(buf);
    }
    return jstr(b, n);
}

static json_t *token_bytes(const struct srv_api *api, int32_t id) {
    size_t n = 0;
    const char *b = api->tok ? toy_tokenizer_token_bytes(api->tok, id, &n) : NULL;
    json_t *a = json_array();
    for (size_t i = 0; b && i < n; i++) json_array_append_new(a, json_integer((unsigned char)b[i]));
    return a;
}

/* chat: {"token", "logprob", "bytes", "top_logprobs": [...]} */
static json_t *chat_logprob(const struct srv_api *api, const struct srv_token *t) {
    json_t *top = json_array();
    for (int k = 0; k < t->n_top; k++)
        json_array_append_new(top, json_pack("{s:o,s:o,s:o}", "token", token_string(api, t->top_id[k]), "logprob",
                                             jnum(t->top_lp[k]), "bytes", token_bytes(api, t->top_id[k])));
    return json_pack("{s:o,s:o,s:o,s:o}", "token", token_string(api, t->id), "logprob", jnum(t->logprob), "bytes",
                     token_bytes(api, t->id), "top_logprobs", top);
}

/* completions: {"tokens", "token_logprobs", "top_logprobs", "text_offset"} over records [from, to) */
static json_t *completion_logprobs(const struct srv_api *api, const struct srv_job *j, int64_t from, int64_t to) {
    json_t *toks = json_array(), *lps = json_array(), *tops = json_array(), *offs = json_array();
    for (int64_t i = from; i < to; i++) {
        const struct srv_token *t = &j->toks[i];
        if (t->id < 0 || t->eog) continue;
        json_array_append_new(toks, token_string(api, t->id));
        json_array_append_new(lps, jnum(t->logprob));
        json_t *top = json_object();
        for (int k = 0; k < t->n_top; k++) { /* best first: tokens that print alike (U+FFFD) keep the best's value */
            json_t *s = token_string(api, t->top_id[k]);
            if (!json_object_get(top, json_string_value(s))) json_object_set_new(top, json_string_value(s), jnum(t->top_lp[k]));
            json_decref(s);
        }
        json_array_append_new(tops, top);
        json_array_append_new(offs, json_integer((json_int_t)t->char_off));
    }
    return json_pack("{s:o,s:o,s:o,s:o}", "tokens", toks, "token_logprobs", lps, "top_logprobs", tops, "text_offset",
                     offs);
}

/* echo: the prompt's text as its tokens decode (special ones, e.g. a BOS, print nothing), with each token's offset
 * in it in characters into offs (n_prompt of them, may be NULL) and its length in characters into *chars */
static char *prompt_text(const struct srv_api *api, const struct srv_job *j, size_t *len, size_t *chars, size_t *offs) {
    size_t cap = 64, n = 0, c = 0;
    char *t = malloc(cap);
    struct toy_decoder *d = NULL;
    if (t && api->tok && toy_decoder_init(api->tok, TOY_DECODE_SKIP_SPECIAL, &d)) d = NULL;
    for (int64_t i = 0; t && i <= j->n_prompt; i++) {
        const char *piece = "";
        size_t plen = 0;
        if (i < j->n_prompt && offs) offs[i] = c;
        if (d && i < j->n_prompt) toy_decoder_push(d, j->prompt[i], &piece, &plen);
        else if (d) toy_decoder_flush(d, &piece, &plen);
        if (n + plen + 1 > cap) {
            char *g = realloc(t, cap = (n + plen + 1) * 2);
            if (!g) free(t);
            t = g;
            if (!t) break;
        }
        memcpy(t + n, piece, plen);
        n += plen;
        c += toy_utf8_chars(piece, plen);
    }
    toy_decoder_free(d);
    if (t) t[n] = 0;
    *len = t ? n : 0;
    *chars = c;
    return t;
}

/* completions with echo and logprobs: the prompt's tokens (the first with no log-probability, as OpenAI's), then
 * the completion's, whose offsets start after the prompt's text */
static json_t *echo_logprobs(const struct srv_api *api, struct srv_job *j, int64_t from, int64_t to, bool prompt) {
    size_t len, chars = j->echo_chars - 1, *offs = prompt ? calloc((size_t)j->n_prompt + 1, sizeof *offs) : NULL;
    if (prompt || !j->echo_chars) { /* the prompt's text once per stream: its chunks offset the completion's */
        free(prompt_text(api, j, &len, &chars, offs));
        j->echo_chars = chars + 1;
    }
    json_t *o = completion_logprobs(api, j, from, to);
    json_t *toks = json_array(), *lps = json_array(), *tops = json_array(), *at = json_array();
    for (int64_t i = 0; prompt && offs && i < j->n_ptoks; i++) {
        const struct srv_token *t = &j->ptoks[i];
        json_array_append_new(toks, token_string(api, j->prompt[i]));
        json_array_append_new(lps, i ? jnum(t->logprob) : json_null());
        json_t *top = i ? json_object() : json_null();
        for (int k = 0; i && k < t->n_top; k++) {
            json_t *s = token_string(api, t->top_id[k]);
            if (!json_object_get(top, json_string_value(s))) json_object_set_new(top, json_string_value(s), jnum(t->top_lp[k]));
            json_decref(s);
        }
        json_array_append_new(tops, top);
        json_array_append_new(at, json_integer((json_int_t)offs[i]));
    }
    free(offs);
    json_t *ct = json_object_get(o, "text_offset");
    for (size_t k = 0; k < json_array_size(ct); k++)
        json_array_append_new(at, json_integer(json_integer_value(json_array_get(ct, k)) + (json_int_t)chars));
    json_array_extend(toks, json_object_get(o, "tokens"));
    json_array_extend(lps, json_object_get(o, "token_logprobs"));
    json_array_extend(tops, json_object_get(o, "top_logprobs"));
    json_decref(o);
    return json_pack("{s:o,s:o,s:o,s:o}", "tokens", toks, "token_logprobs", lps, "top_logprobs", tops, "text_offset", at);
}

/* the completion's text after the prompt's (echo) */
static json_t *echo_text(const struct srv_api *api, const struct srv_job *j) {
    size_t len, chars;
    char *p = prompt_text(api, j, &len, &chars, NULL);
    size_t n = j->text ? j->text_len : 0;
    char *t = p ? realloc(p, len + n + 1) : NULL;
    if (!t) {
        free(p);
        return jstr(j->text ? j->text : "", n);
    }
    memcpy(t + len, j->text ? j->text : "", n);
    json_t *o = jstr(t, len + n);
    free(t);
    return o;
}

static json_t *chat_logprobs(const struct srv_api *api, const struct srv_job *j, int64_t from, int64_t to) {
    json_t *content = json_array();
    for (int64_t i = from; i < to; i++)
        if (j->toks[i].id >= 0 && !j->toks[i].eog) json_array_append_new(content, chat_logprob(api, &j->toks[i]));
    return json_pack("{s:o}", "content", content);
}

static json_t *b64_floats(const float *v, int64_t n) {
    static const char tb[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const unsigned char *p = (const unsigned char *)v; /* little-endian float32, as OpenAI's base64 */
    size_t len = (size_t)n * 4, o = 0;
    char *s = malloc((len + 2) / 3 * 4 + 1);
    if (!s) return json_string("");
    for (size_t i = 0; i < len; i += 3) {
        unsigned x = (unsigned)p[i] << 16 | (i + 1 < len ? (unsigned)p[i + 1] << 8 : 0) | (i + 2 < len ? p[i + 2] : 0);
        s[o++] = tb[(x >> 18) & 63];
        s[o++] = tb[(x >> 12) & 63];
        s[o++] = i + 1 < len ? tb[(x >> 6) & 63] : '=';
        s[o++] = i + 2 < len ? tb[x & 63] : '=';
    }
    s[o] = 0;
    json_t *j = json_string(s);
    free(s);
    return j;
}

static json_t *embeddings_json(const struct srv_api *api, const struct srv_request *r, const struct srv_job *j) {
    json_t *data = json_array();
    float *v = malloc((size_t)j->dim * sizeof(float));
    for (int i = 0; v && i < j->n_inputs; i++) {
        memcpy(v, j->embeddings + (size_t)i * (size_t)j->dim, (size_t)j->dim * sizeof(float));
        if (r->normalize) {
            double ss = 0;
            for (int64_t k = 0; k < j->dim; k++) ss += (double)v[k] * v[k];
            float inv = ss > 0 ? (float)(1.0 / sqrt(ss)) : 0;
            for (int64_t k = 0; k < j->dim; k++) v[k] *= inv;
        }
        json_t *emb;
        if (r->base64) {
            emb = b64_floats(v, j->dim);
        } else {
            emb = json_array();
            for (int64_t k = 0; k < j->dim; k++) json_array_append_new(emb, jnum(v[k]));
        }
        json_array_append_new(data, json_pack("{s:s,s:i,s:o}", "object", "embedding", "index", i, "embedding", emb));
    }
    free(v);
    return json_pack("{s:s,s:o,s:s,s:{s:I,s:I}}", "object", "list", "data", data, "model", api->model_name, "usage",
                     "prompt_tokens", (json_int_t)r->n_tokens, "total_tokens", (json_int_t)r->n_tokens);
}

/* ---- split chat replies (toy/chat-reply.h) ------------------------------------------------------- */

/* a call's id: the completion's id and the call's index */
static void call_id(char *out, size_t n, const char *id, size_t k) {
    const char *dash = strchr(id, '-');
    snprintf(out, n, "call_%s_%zu", dash ? dash + 1 : id, k);
}

/* {"id", "type": "function", "function": {"name", "arguments"}} */
static json_t *tool_call_json(const struct toy_chat_call *c, const char *id, size_t k) {
    char cid[64];
    call_id(cid, sizeof cid, id, k);
    return json_pack("{s:s,s:s,s:{s:o,s:o}}", "id", cid, "type", "function", "function", "name",
                     jstr(c->name, strlen(c->name)), "arguments", jstr(c->arguments, strlen(c->arguments)));
}

/* parses the job's text so far (the whole reply once done); false when out of memory */
static bool reply_parse(const struct srv_request *r, const struct srv_job *j, bool final, struct toy_chat_reply *out) {
    return toy_srv_reply_split(r, j, final, out);
}

/* the whole reply's message: content (null when only calls), reasoning_content, tool_calls */
static json_t *reply_message(const struct srv_request *r, struct srv_job *j, const char *id) {
    struct toy_chat_reply p;
    if (!reply_parse(r, j, true, &p)) return NULL;
    json_t *m = json_pack("{s:s}", "role", "assistant");
    json_object_set_new(m, "content", p.n_calls && !*p.content ? json_null() : jstr(p.content, strlen(p.content)));
    if (*p.reasoning) json_object_set_new(m, "reasoning_content", jstr(p.reasoning, strlen(p.reasoning)));
    if (p.n_calls) {
        json_t *calls = json_array();
        for (size_t k = 0; k < p.n_calls; k++) json_array_append_new(calls, tool_call_json(&p.calls[k], id, k));
        json_object_set_new(m, "tool_calls", calls);
    }
    j->n_calls = p.n_calls;
    toy_chat_reply_free(&p);
    return m;
}

/* the delta from what *sent records to the parse of the reply so far; NULL when it adds nothing */
static json_t *reply_delta(const struct srv_request *r, struct srv_job *j, bool final, struct srv_sent *sent,
                           const char *id) {
    struct toy_chat_reply p;
    if (!reply_parse(r, j, final, &p)) return NULL;
    json_t *d = json_object();
    size_t nr = strlen(p.reasoning), nc = strlen(p.content);
    /* a parse extends the one before (chat-reply.h); were it ever not to, nothing is sent twice */
    if (nr > sent->reasoning) {
        json_object_set_new(d, "reasoning_content", jstr(p.reasoning + sent->reasoning, nr - sent->reasoning));
        sent->reasoning = nr;
    }
    if (nc > sent->content) {
        json_object_set_new(d, "content", jstr(p.content + sent->content, nc - sent->content));
        sent->content = nc;
    }
    struct srv_call_step *st = malloc((p.n_calls + 1) * sizeof *st);
    size_t ns = st ? toy_srv_call_steps(&p, sent, final, st) : 0;
    json_t *calls = json_array();
    for (size_t i = 0; i < ns; i++) { /* a call's id and name first, then its arguments as they come */
        if (!st[i].c || (!st[i].begin && !st[i].n)) continue;
        json_t *fn = json_pack("{s:o}", "arguments", jstr(st[i].delta ? st[i].delta : "", st[i].n));
        json_t *o = json_pack("{s:I,s:o}", "index", (json_int_t)st[i].k, "function", fn);
        if (st[i].begin) {
            char cid[64];
            call_id(cid, sizeof cid, id, st[i].k);
            json_object_set_new(o, "id", json_string(cid));
            json_object_set_new(o, "type", json_string("function"));
            json_object_set_new(fn, "name", jstr(st[i].c->name, strlen(st[i].c->name)));
        }
        json_array_append_new(calls, o);
    }
    free(st);
    if (json_array_size(calls)) json_object_set_new(d, "tool_calls", calls);
    else json_decref(calls);
    j->n_calls = sent->calls;
    toy_chat_reply_free(&p);
    if (json_object_size(d) == 0) {
        json_decref(d);
        return NULL;
    }
    return d;
}

json_t *toy_srv_response_json(const struct srv_api *api, const struct srv_request *r, struct srv_job *j,
                              const char *id, long created) {
    if (r->ep == SRV_EP_EMBEDDINGS) return embeddings_json(api, r, j);
    if (r->resp_body) return toy_srv_responses_json(api, r, j, id, created);
    if (r->anth_body) return toy_srv_messages_json(api, r, j, id);
    bool chat = r->ep == SRV_EP_CHAT;
    json_t *choice = json_object();
    json_object_set_new(choice, "index", json_integer(0));
    json_t *msg = r->parse_reply ? reply_message(r, j, id) : NULL; /* NULL too when out of memory: as written */
    if (msg) {
        json_object_set_new(choice, "message", msg);
    } else {
        json_t *text = jstr(j->text ? j->text : "", j->text_len);
        if (chat) json_object_set_new(choice, "message", json_pack("{s:s,s:o}", "role", "assistant", "content", text));
        else if (r->echo) json_decref(text), json_object_set_new(choice, "text", echo_text(api, j));
        else json_object_set_new(choice, "text", text);
    }
    json_object_set_new(choice, "logprobs",
                        !r->logprobs ? json_null()
                        : chat       ? chat_logprobs(api, j, 0, j->n_toks)
                        : r->echo    ? echo_logprobs(api, j, 0, j->n_toks, true)
                                     : completion_logprobs(api, j, 0, j->n_toks));
    json_object_set_new(choice, "finish_reason", json_string(toy_srv_finish_reason(j)));
    return json_pack("{s:s,s:s,s:I,s:s,s:s,s:[o],s:o}", "id", id, "object", chat ? "chat.completion" : "text_completion",
                     "created", (json_int_t)created, "model", api->model_name, "system_fingerprint", "toy",
                     "choices", choice, "usage", toy_srv_usage_json(j));
}

static json_t *chunk(const struct srv_api *api, const struct srv_request *r, const char *id, long created,
                     json_t *choice) {
    json_t *c = json_pack("{s:s,s:s,s:I,s:s,s:s,s:[o]}", "id", id, "object",
                          r->ep == SRV_EP_CHAT ? "chat.completion.chunk" : "text_completion", "created",
                          (json_int_t)created, "model", api->model_name, "system_fingerprint", "toy", "choices", choice);
    if (r->include_usage) json_object_set_new(c, "usage", json_null());
    return c;
}

json_t *toy_srv_chunk_echo(const struct srv_api *api, const struct srv_request *r, struct srv_job *j, const char *id,
                           long created) {
    size_t len, chars;
    char *p = prompt_text(api, j, &len, &chars, NULL);
    json_t *choice = json_pack("{s:i,s:o,s:o,s:n}", "index", 0, "text", jstr(p ? p : "", p ? len : 0), "logprobs",
                               r->logprobs ? echo_logprobs(api, j, 0, 0, true) : json_null(), "finish_reason");
    free(p);
    return chunk(api, r, id, created, choice);
}

json_t *toy_srv_chunk_json(const struct srv_api *api, const struct srv_request *r, struct srv_job *j, int64_t from,
                           int64_t to, struct srv_sent *sent, const char *id, long created) {
    size_t off = j->toks[from].text_off, n = 0;
    bool any_token = false;
    for (int64_t i = from; i < to; i++) n += j->toks[i].text_len, any_token |= j->toks[i].id >= 0 && !j->toks[i].eog;
    bool chat = r->ep == SRV_EP_CHAT;
    json_t *delta = NULL;
    if (r->parse_reply) {
        delta = reply_delta(r, j, j->done, sent, id);
        if (!delta && !(r->logprobs && any_token)) return NULL;
        if (!delta) delta = json_object();
    } else {
        if (n == 0 && !(r->logprobs && any_token)) return NULL;
    }
    json_t *choice = json_object();
    json_object_set_new(choice, "index", json_integer(0));
    if (delta) json_object_set_new(choice, "delta", delta);
    else if (chat) json_object_set_new(choice, "delta", json_pack("{s:o}", "content", jstr(j->text + off, n)));
    else json_object_set_new(choice, "text", jstr(j->text + off, n));
    json_object_set_new(choice, "logprobs",
                        !r->logprobs ? json_null()
                        : chat       ? chat_logprobs(api, j, from, to)
                        : r->echo    ? echo_logprobs(api, j, from, to, false)
                                     : completion_logprobs(api, j, from, to));
    json_object_set_new(choice, "finish_reason", json_null());
    return chunk(api, r, id, created, choice);
}

json_t *toy_srv_chunk_rest(const struct srv_api *api, const struct srv_request *r, struct srv_job *j,
                           struct srv_sent *sent, const char *id, long created) {
    json_t *delta = r->parse_reply ? reply_delta(r, j, true, sent, id) : NULL;
    if (!delta) return NULL;
    return chunk(api, r, id, created,
                 json_pack("{s:i,s:o,s:n,s:n}", "index", 0, "delta", delta, "logprobs", "finish_reason"));
}

json_t *toy_srv_chunk_role(const struct srv_api *api, const struct srv_request *r, const char *id, long created) {
    return chunk(api, r, id, created,
                 json_pack("{s:i,s:{s:s,s:s},s:n,s:n}", "index", 0, "delta", "role", "assistant", "content", "",
                           "logprobs", "finish_reason"));
}

json_t *toy_srv_chunk_finish(const struct srv_api *api, const struct srv_request *r, const struct srv_job *j,
                             const char *id, long created) {
    json_t *choice = r->ep == SRV_EP_CHAT
                         ? json_pack("{s:i,s:{},s:n,s:s}", "index", 0, "delta", "logprobs", "finish_reason",
                                     toy_srv_finish_reason(j))
                         : json_pack("{s:i,s:s,s:n,s:s}", "index", 0, "text", "", "logprobs", "finish_reason",
                                     toy_srv_finish_reason(j));
    return chunk(api, r, id, created, choice);
}

json_t *toy_srv_chunk_usage(const struct srv_api *api, const struct srv_request *r, const struct srv_job *j,
                            const char *id, long created) {
    json_t *c = json_pack("{s:s,s:s,s:I,s:s,s:s,s:[]}", "id", id, "object",
                          r->ep == SRV_EP_CHAT ? "chat.completion.chunk" : "text_completion", "created",
                          (json_int_t)created, "model", api->model_name, "system_fingerprint", "toy", "choices");
    json_object_set_new(c, "usage", toy_srv_usage_json(j));
    return c;
}
