/* chat-reply.c: toy/chat-reply.h: a reply split into reasoning, content and
 * tool calls, for each family's markers.
 *
 * One pass over the text per call. Regions of plain text go to the
 * reasoning or the content; a region still open at the end of a partial
 * reply loses the tail that may be a marker's start. Tool calls are taken
 * only once closed (or, for the forms that end with the reply, once it has
 * ended); one that does not parse is put back into the content verbatim.
 * Both texts are trimmed of surrounding whitespace, which is what makes a
 * partial parse a prefix of the final one: whitespace at the end is held
 * until something follows it.
 */
#include "toy/chat-reply.h"

#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define NPOS SIZE_MAX

/* DeepSeek's markers: U+FF5C (fullwidth vertical line) and U+2581 (lower one eighth block) */
#define DS_CALLS_BEGIN "<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "begin\xef\xbd\x9c>"
#define DS_CALLS_END "<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "end\xef\xbd\x9c>"
#define DS_CALL_BEGIN "<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "begin\xef\xbd\x9c>"
#define DS_CALL_END "<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "end\xef\xbd\x9c>"
#define DS_SEP "<\xef\xbd\x9ctool\xe2\x96\x81" "sep\xef\xbd\x9c>"

struct buf {
    char *p;
    size_t n, cap;
};

struct parse {
    const struct toy_chat_syntax *syn;
    const char *t;
    size_t n;
    bool partial, oom;
    struct buf reasoning, content;
    struct toy_chat_call *calls;
    size_t n_calls, cap_calls;
};

static void put(struct parse *P, struct buf *b, const char *s, size_t n) {
    if (P->oom || n == 0) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = (b->n + n + 1) * 2;
        char *np = realloc(b->p, cap);
        if (!np) { P->oom = true; return; }
        b->p = np, b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
}

static bool starts(const struct parse *P, size_t p, const char *lit) {
    size_t k = strlen(lit);
    return p <= P->n && P->n - p >= k && !memcmp(P->t + p, lit, k);
}

/* t[p..n) is a proper start of lit (the empty one too): more text may make it lit */
static bool may_become(const struct parse *P, size_t p, const char *lit) {
    size_t k = strlen(lit), r = P->n - p;
    return r < k && !memcmp(P->t + p, lit, r);
}

static size_t find(const struct parse *P, size_t p, const char *lit) {
    if (p > P->n) return NPOS;
    const char *h = memmem(P->t + p, P->n - p, lit, strlen(lit));
    return h ? (size_t)(h - P->t) : NPOS;
}

static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static size_t skip_ws(const struct parse *P, size_t p) {
    while (p < P->n && is_ws(P->t[p])) p++;
    return p;
}

/* the longest end of t[from..to) that is a proper start of one of the markers */
static size_t marker_tail(const struct parse *P, size_t from, size_t to, const char *const *markers) {
    size_t best = 0;
    for (const char *const *m = markers; m && *m; m++) {
        size_t k = strlen(*m) - 1;
        if (k > to - from) k = to - from;
        for (; k > best; k--)
            if (!memcmp(P->t + to - k, *m, k)) { best = k; break; }
    }
    return best;
}

/* text t[from..to) into b; `open`: it runs to the end of a partial reply, where a marker may be starting */
static void region(struct parse *P, struct buf *b, size_t from, size_t to, bool open, const char *const *markers) {
    if (to <= from) return;
    if (open && P->partial) to -= marker_tail(P, from, to, markers);
    put(P, b, P->t + from, to - from);
}

/* ---- tool calls ------------------------------------------------------------------------ */

static bool add_call(struct parse *P, const char *name, size_t name_len, json_t *args) {
    if (!name_len || !args) return false;
    char *a = json_dumps(args, JSON_COMPACT | JSON_ENCODE_ANY);
    char *nm = strndup(name, name_len);
    if (P->n_calls == P->cap_calls) {
        size_t cap = P->cap_calls ? 2 * P->cap_calls : 4;
        struct toy_chat_call *nc = realloc(P->calls, cap * sizeof *nc);
        if (nc) P->calls = nc, P->cap_calls = cap;
        else P->oom = true;
    }
    if (!a || !nm || P->oom) {
        free(a), free(nm);
        P->oom = true;
        return true; /* not a parse failure */
    }
    P->calls[P->n_calls++] = (struct toy_chat_call){.name = nm, .arguments = a};
    return true;
}

static bool known_tool(const struct parse *P, const char *name) {
    for (size_t i = 0; i < P->syn->n_tool_names; i++)
        if (P->syn->tool_names[i] && !strcmp(P->syn->tool_names[i], name)) return true;
    return false;
}

/* {"name": ..., "arguments" | "parameters": {...} or a JSON string} */
static bool call_from_object(struct parse *P, json_t *o, bool must_be_known) {
    const char *name = json_string_value(json_object_get(o, "name"));
    json_t *args = json_object_get(o, "arguments");
    if (!args) args = json_object_get(o, "parameters");
    if (!json_is_object(o) || !name || !*name || (must_be_known && !known_tool(P, name))) return false;
    json_t *own = NULL;
    if (!args) args = own = json_object();
    else if (json_is_string(args)) { /* arguments already written as JSON text */
        own = json_loads(json_string_value(args), 0, NULL);
        if (!own) return false;
        args = own;
    }
    bool ok = add_call(P, name, strlen(name), args);
    json_decref(own);
    return ok;
}

/* a call whose arguments are JSON text t[a..b) */
static bool call_from_text(struct parse *P, const char *name, size_t name_len, size_t a, size_t b) {
    json_t *args = b > a ? json_loadb(P->t + a, b - a, JSON_DECODE_ANY, NULL) : NULL;
    bool ok = args && add_call(P, name, name_len, args);
    json_decref(args);
    return ok;
}

static void trim(const char *s, size_t *a, size_t *b) {
    while (*a < *b && is_ws(s[*a])) (*a)++;
    while (*b > *a && is_ws(s[*b - 1])) (*b)--;
}

/* ---- the families ---------------------------------------------------------------------- */

static const char *const think_end[] = {"</think>", NULL};

/* the leading <think> block; returns where the rest starts, or NPOS when the reply (so far) is all reasoning */
static size_t think(struct parse *P) {
    size_t p = skip_ws(P, 0);
    if (!P->syn->in_think) {
        if (starts(P, p, "<think>")) p += strlen("<think>");
        else if (P->partial && may_become(P, p, "<think>")) return NPOS;
        else return 0;
    }
    size_t e = find(P, p, "</think>");
    if (e == NPOS) {
        region(P, &P->reasoning, p, P->n, true, think_end);
        return NPOS;
    }
    region(P, &P->reasoning, p, e, false, NULL);
    return e + strlen("</think>");
}

static void hermes(struct parse *P, size_t p) {
    static const char *const open_tag[] = {"<tool_call>", NULL};
    for (;;) {
        size_t s = find(P, p, "<tool_call>");
        if (s == NPOS) return region(P, &P->content, p, P->n, true, open_tag);
        region(P, &P->content, p, s, false, NULL);
        size_t b = s + strlen("<tool_call>"), e = find(P, b, "</tool_call>");
        if (e == NPOS) {
            if (!P->partial) region(P, &P->content, s, P->n, false, NULL); /* cut off: kept as written */
            return;
        }
        json_t *o = json_loadb(P->t + b, e - b, 0, NULL);
        size_t end = e + strlen("</tool_call>");
        if (!call_from_object(P, o, false)) region(P, &P->content, s, end, false, NULL);
        json_decref(o);
        p = end;
    }
}

/* one or more JSON objects (separated by ';' or whitespace) from t[p..n); false if any does not parse */
static bool json_calls(struct parse *P, size_t p, bool must_be_known) {
    size_t n0 = P->n_calls;
    for (;;) {
        while (p < P->n && (is_ws(P->t[p]) || P->t[p] == ';')) p++;
        if (p == P->n) break;
        json_error_t je;
        json_t *o = json_loadb(P->t + p, P->n - p, JSON_DISABLE_EOF_CHECK, &je);
        bool ok = o && call_from_object(P, o, must_be_known);
        json_decref(o);
        if (!ok) return false;
        p += je.position;
    }
    return P->n_calls > n0;
}

static void drop_calls(struct parse *P, size_t n0) {
    while (P->n_calls > n0) {
        P->n_calls--;
        free(P->calls[P->n_calls].name);
        free(P->calls[P->n_calls].arguments);
    }
}

static void llama3(struct parse *P, size_t p) {
    static const char *const tag[] = {"<|python_tag|>", NULL};
    size_t q = skip_ws(P, p), n0 = P->n_calls;
    bool tagged = starts(P, q, "<|python_tag|>");
    if (!tagged && !(q < P->n && P->t[q] == '{')) {
        if (P->partial && q < P->n && may_become(P, q, "<|python_tag|>")) return;
        return region(P, &P->content, p, P->n, true, tag);
    }
    if (P->partial) return; /* a call, or JSON content: known at the end */
    if (!json_calls(P, tagged ? q + strlen("<|python_tag|>") : q, !tagged)) {
        drop_calls(P, n0);
        region(P, &P->content, p, P->n, false, NULL);
    }
}

static void mistral(struct parse *P, size_t p) {
    static const char *const tag[] = {"[TOOL_CALLS]", NULL};
    size_t s = find(P, p, "[TOOL_CALLS]"), n0 = P->n_calls;
    if (s == NPOS) return region(P, &P->content, p, P->n, true, tag);
    region(P, &P->content, p, s, false, NULL);
    if (P->partial) return;
    size_t q = skip_ws(P, s + strlen("[TOOL_CALLS]"));
    bool ok = true;
    if (q < P->n && P->t[q] == '[') { /* v3: a JSON array of {name, arguments} */
        json_error_t je;
        json_t *a = json_loadb(P->t + q, P->n - q, JSON_DISABLE_EOF_CHECK, &je);
        ok = json_is_array(a) && json_array_size(a) > 0 && skip_ws(P, q + je.position) == P->n;
        for (size_t i = 0; ok && i < json_array_size(a); i++) ok = call_from_object(P, json_array_get(a, i), false);
        json_decref(a);
    } else { /* v11+: name[ARGS]{...}, each after its own [TOOL_CALLS]; some write name[CALL_ID]id[ARGS] */
        for (;;) {
            size_t a = find(P, q, "[ARGS]"), nm_end = q;
            while (nm_end < P->n && P->t[nm_end] != '[' && !is_ws(P->t[nm_end])) nm_end++;
            if (a == NPOS || nm_end == q || (nm_end != a && !starts(P, nm_end, "[CALL_ID]"))) { ok = false; break; }
            size_t b = a + strlen("[ARGS]");
            json_error_t je;
            json_t *args = json_loadb(P->t + b, P->n - b, JSON_DISABLE_EOF_CHECK, &je);
            ok = args && add_call(P, P->t + q, nm_end - q, args);
            json_decref(args);
            if (!ok) break;
            q = skip_ws(P, b + je.position);
            if (q == P->n) break;
            if (!starts(P, q, "[TOOL_CALLS]")) { ok = false; break; }
            q += strlen("[TOOL_CALLS]");
        }
    }
    if (!ok) {
        drop_calls(P, n0);
        region(P, &P->content, s, P->n, false, NULL);
    }
}

static void deepseek(struct parse *P, size_t p) {
    static const char *const tags[] = {DS_CALLS_BEGIN, DS_CALL_BEGIN, NULL};
    size_t s = find(P, p, DS_CALLS_BEGIN), s1 = find(P, p, DS_CALL_BEGIN), n0 = P->n_calls;
    if (s1 < s) s = s1;
    if (s == NPOS) return region(P, &P->content, p, P->n, true, tags);
    region(P, &P->content, p, s, false, NULL);
    if (P->partial) return;
    size_t q = starts(P, s, DS_CALLS_BEGIN) ? s + strlen(DS_CALLS_BEGIN) : s;
    bool ok = true;
    for (;;) {
        q = skip_ws(P, q);
        if (q == P->n) break;
        if (starts(P, q, DS_CALLS_END)) {
            q += strlen(DS_CALLS_END);
            break;
        }
        size_t sep = starts(P, q, DS_CALL_BEGIN) ? find(P, q, DS_SEP) : NPOS;
        size_t end = sep == NPOS ? NPOS : find(P, sep, DS_CALL_END);
        if (end == NPOS) { ok = false; break; }
        size_t h0 = q + strlen(DS_CALL_BEGIN), h1 = sep, b0 = sep + strlen(DS_SEP), b1 = end;
        trim(P->t, &h0, &h1);
        if (h1 - h0 == 8 && !memcmp(P->t + h0, "function", 8)) { /* V3 / R1: function<sep>name\n```json\n{...}\n``` */
            size_t nl = find(P, b0, "\n"), f = nl == NPOS ? NPOS : find(P, nl, "```json");
            size_t a0 = f == NPOS ? NPOS : f + strlen("```json"), a1 = a0 == NPOS ? NPOS : find(P, a0, "```");
            if (a1 == NPOS || a1 > b1 || nl > b1) { ok = false; break; }
            size_t n0s = b0, n1s = nl;
            trim(P->t, &n0s, &n1s);
            ok = call_from_text(P, P->t + n0s, n1s - n0s, a0, a1);
        } else { /* V3.1: name<sep>{...} */
            ok = call_from_text(P, P->t + h0, h1 - h0, b0, b1);
        }
        if (!ok) break;
        q = end + strlen(DS_CALL_END);
    }
    if (!ok) {
        drop_calls(P, n0);
        region(P, &P->content, s, P->n, false, NULL);
        return;
    }
    region(P, &P->content, q, P->n, false, NULL);
}

/* gpt-oss: messages "[<|start|>role]<|channel|>C[ to=R][ <|constrain|>T]<|message|>body<|end|>"; the reply
 * starts after the prompt's "<|start|>assistant", so with the first message's channel */
static void harmony(struct parse *P) {
    static const char *const body_end[] = {"<|end|>", "<|call|>", "<|return|>", NULL};
    size_t p = 0;
    while (p < P->n) {
        size_t m = find(P, p, "<|message|>");
        if (m == NPOS) {
            /* a header still coming; or, at the end, text that is not harmony at all: kept as content */
            if (!P->partial) region(P, &P->content, p, P->n, false, NULL);
            return;
        }
        size_t c = find(P, p, "<|channel|>"), to = find(P, p, " to=");
        char channel[32] = "";
        if (c != NPOS && c < m) {
            size_t a = c + strlen("<|channel|>"), b = a;
            while (b < m && P->t[b] != ' ' && P->t[b] != '<' && b - a < sizeof channel - 1) b++;
            memcpy(channel, P->t + a, b - a);
            channel[b - a] = 0;
        }
        size_t r0 = NPOS, r1 = NPOS;
        if (to != NPOS && to < m) {
            r0 = r1 = to + strlen(" to=");
            while (r1 < m && P->t[r1] != ' ' && P->t[r1] != '<') r1++;
        }
        size_t b = m + strlen("<|message|>"), e = NPOS, e_len = 0;
        for (const char *const *k = body_end; *k; k++) {
            size_t x = find(P, b, *k);
            if (x < e) e = x, e_len = strlen(*k);
        }
        bool open = e == NPOS;
        if (open) e = P->n;
        if (r0 != NPOS && P->syn->tools) {
            if (open && P->partial) return;
            size_t a = b, z = e, nm = r0;
            trim(P->t, &a, &z);
            if (r1 - r0 > 10 && !memcmp(P->t + r0, "functions.", 10)) nm += 10;
            if (!call_from_text(P, P->t + nm, r1 - nm, a, z)) region(P, &P->content, b, e, false, NULL);
        } else if (!strcmp(channel, "analysis")) {
            if (P->reasoning.n) put(P, &P->reasoning, "\n", 1); /* messages apart */
            region(P, &P->reasoning, b, e, open, body_end);
        } else {
            region(P, &P->content, b, e, open, body_end);
        }
        p = open ? P->n : e + e_len;
        if (starts(P, p, "<|start|>")) p += strlen("<|start|>");
    }
}

/* ---- the API -------------------------------------------------------------------------------- */

struct toy_chat_syntax toy_chat_syntax_detect(const char *src) {
    struct toy_chat_syntax s = {0};
    if (!src) return s;
    if (strstr(src, "<|channel|>") && strstr(src, "<|message|>")) s.format = TOY_CHAT_FORMAT_HARMONY;
    else if (strstr(src, "<tool_call>")) s.format = TOY_CHAT_FORMAT_HERMES;
    else if (strstr(src, "tool\xe2\x96\x81" "call\xe2\x96\x81" "begin")) s.format = TOY_CHAT_FORMAT_DEEPSEEK;
    else if (strstr(src, "[TOOL_CALLS]")) s.format = TOY_CHAT_FORMAT_MISTRAL;
    else if (strstr(src, "<|python_tag|>") || (strstr(src, "<|start_header_id|>") && strstr(src, "\"parameters\"")))
        s.format = TOY_CHAT_FORMAT_LLAMA3;
    s.fenced = s.format == TOY_CHAT_FORMAT_DEEPSEEK && strstr(src, "```json");
    s.think = s.format != TOY_CHAT_FORMAT_HARMONY && (strstr(src, "<think>") || strstr(src, "</think>"));
    return s;
}

bool toy_chat_call_frame(const struct toy_chat_syntax *s, const char *name, char **prefix, char **suffix) {
    const char *pre = NULL, *post = "";
    char *named = NULL;
    switch (s->format) {
    case TOY_CHAT_FORMAT_HERMES: pre = "<tool_call>\n", post = "\n</tool_call>"; break;
    case TOY_CHAT_FORMAT_LLAMA3: pre = ""; break;
    case TOY_CHAT_FORMAT_MISTRAL: pre = "[TOOL_CALLS]"; break;
    case TOY_CHAT_FORMAT_DEEPSEEK:
        if (asprintf(&named, s->fenced ? DS_CALLS_BEGIN DS_CALL_BEGIN "function" DS_SEP "%s\n```json\n"
                                       : DS_CALLS_BEGIN DS_CALL_BEGIN "%s" DS_SEP, name ? name : "") < 0)
            return false;
        post = s->fenced ? "\n```" DS_CALL_END DS_CALLS_END : DS_CALL_END DS_CALLS_END;
        break;
    case TOY_CHAT_FORMAT_HARMONY: /* the call ends with <|call|>, an end of generation */
        if (asprintf(&named, "<|channel|>commentary to=functions.%s <|constrain|>json<|message|>", name ? name : "") < 0)
            return false;
        break;
    default: return false;
    }
    *prefix = named ? named : strdup(pre);
    *suffix = strdup(post);
    if (!*prefix || !*suffix) {
        free(*prefix), free(*suffix);
        *prefix = *suffix = NULL;
        return false;
    }
    return true;
}

const char *toy_chat_format_name(enum toy_chat_format f) {
    static const char *const names[] = {"content", "hermes", "llama3", "mistral", "deepseek", "harmony"};
    return (unsigned)f < sizeof names / sizeof names[0] ? names[f] : "?";
}

bool toy_chat_syntax_keeps_special(const struct toy_chat_syntax *s) {
    return s->format == TOY_CHAT_FORMAT_HARMONY || s->format == TOY_CHAT_FORMAT_LLAMA3 ||
           s->format == TOY_CHAT_FORMAT_MISTRAL || s->format == TOY_CHAT_FORMAT_DEEPSEEK;
}

bool toy_chat_prompt_in_think(const char *prompt) {
    size_t n = prompt ? strlen(prompt) : 0;
    while (n && is_ws(prompt[n - 1])) n--;
    return n >= 7 && !memcmp(prompt + n - 7, "<think>", 7);
}

int toy_chat_stop_texts(const struct toy_chat_syntax *s, const char *src, const char *out[4]) {
    static const char *const marks[] = {"<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>"};
    int n = 0;
    for (int i = 0; src && i < 4; i++)
        if (strstr(src, marks[i]) && !(i == 3 && s->format == TOY_CHAT_FORMAT_HARMONY)) out[n++] = marks[i];
    return n;
}

static char *finish_text(struct parse *P, struct buf *b) {
    size_t a = 0, z = b->n;
    if (b->p) trim(b->p, &a, &z);
    char *s = malloc(z - a + 1);
    if (!s) { P->oom = true; return NULL; }
    if (z > a) memcpy(s, b->p + a, z - a);
    s[z - a] = 0;
    return s;
}

enum toy_status toy_chat_reply_parse(const struct toy_chat_syntax *s, const char *text, size_t n, bool partial,
                                     struct toy_chat_reply *out) {
    memset(out, 0, sizeof *out);
    struct parse P = {.syn = s, .t = text ? text : "", .n = text ? n : 0, .partial = partial};
    if (s->format == TOY_CHAT_FORMAT_HARMONY) {
        harmony(&P);
    } else {
        size_t p = s->think ? think(&P) : 0;
        if (p != NPOS) {
            enum toy_chat_format f = s->tools ? s->format : TOY_CHAT_FORMAT_CONTENT;
            if (f == TOY_CHAT_FORMAT_HERMES) hermes(&P, p);
            else if (f == TOY_CHAT_FORMAT_LLAMA3) llama3(&P, p);
            else if (f == TOY_CHAT_FORMAT_MISTRAL) mistral(&P, p);
            else if (f == TOY_CHAT_FORMAT_DEEPSEEK) deepseek(&P, p);
            else region(&P, &P.content, p, P.n, true, NULL);
        }
    }
    out->reasoning = finish_text(&P, &P.reasoning);
    out->content = finish_text(&P, &P.content);
    out->calls = P.calls;
    out->n_calls = P.n_calls;
    free(P.reasoning.p);
    free(P.content.p);
    if (P.oom) {
        toy_chat_reply_free(out);
        return toy_error(TOY_ERR_NOMEM, "chat reply");
    }
    return TOY_OK;
}

void toy_chat_reply_free(struct toy_chat_reply *r) {
    if (!r) return;
    free(r->reasoning);
    free(r->content);
    for (size_t i = 0; i < r->n_calls; i++) free(r->calls[i].name), free(r->calls[i].arguments);
    free(r->calls);
    memset(r, 0, sizeof *r);
}
