/* chat-reply.c: toy/chat-reply.h: a reply split into reasoning, content and
 * tool calls, for each family's markers.
 *
 * One pass over the text per call. Regions of plain text go to the
 * reasoning or the content; a region still open at the end of a partial
 * reply loses the tail that may be a marker's start. A tool call is taken
 * once its name is read, and its arguments stream from then on (see
 * commit_call); a call object of another shape (its keys in another order)
 * is taken once closed, or put back into the content verbatim if it does
 * not parse.
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

static void push_call(struct parse *P, char *name, char *args, bool open);

/* a whole call from a parsed object: the arguments as jansson writes them (compact) */
static bool add_call(struct parse *P, const char *name, size_t name_len, json_t *args) {
    if (!name_len || !args) return false;
    push_call(P, strndup(name, name_len), json_dumps(args, JSON_COMPACT | JSON_ENCODE_ANY), false);
    return true; /* out of memory is not a parse failure */
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

static void trim(const char *s, size_t *a, size_t *b) {
    while (*a < *b && is_ws(s[*a])) (*a)++;
    while (*b > *a && is_ws(s[*b - 1])) (*b)--;
}

/* ---- calls taken as they are written ---------------------------------------------------------------- */

/* A call whose name has been read is committed: it stays a call to the end, and its arguments grow as the
 * model writes them (its text without the blanks between JSON tokens, strings as written), even when they
 * end up cut off (the reply's length ran out) or broken, as OpenAI returns a call cut off by max_tokens. */

static bool is_delim(char c) { return c == ',' || c == '}' || c == ']' || is_ws(c); }

static size_t skip_ws_to(const struct parse *P, size_t p, size_t lim) {
    while (p < lim && is_ws(P->t[p])) p++;
    return p;
}

/* the end (past its closing quote) of the JSON string at t[p] == '"', or NPOS when it runs to lim */
static size_t string_end(const struct parse *P, size_t p, size_t lim) {
    for (size_t i = p + 1; i < lim; i++) {
        if (P->t[i] == '\\') i++;
        else if (P->t[i] == '"') return i + 1;
    }
    return NPOS;
}

/* the end of the JSON value at t[p], p < lim: an object or array to its matching close, a string to its
 * quote, anything else to the next delimiter; NPOS when it runs to lim. Its shape only, not its validity. */
static size_t value_end(const struct parse *P, size_t p, size_t lim) {
    char c = P->t[p];
    if (c == '"') return string_end(P, p, lim);
    if (c != '{' && c != '[') {
        while (p < lim && !is_delim(P->t[p])) p++;
        return p < lim ? p : NPOS;
    }
    int depth = 0;
    for (size_t i = p; i < lim; i++) {
        char d = P->t[i];
        if (d == '"') {
            size_t e = string_end(P, i, lim);
            if (e == NPOS) return NPOS;
            i = e - 1;
        } else if (d == '{' || d == '[') {
            depth++;
        } else if ((d == '}' || d == ']') && --depth == 0) {
            return i + 1;
        }
    }
    return NPOS;
}

/* s[0..n) into b without the blanks outside strings */
static void put_compact(struct parse *P, struct buf *b, const char *s, size_t n) {
    bool str = false;
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (str) {
            if (c == '\\') i++;
            else if (c == '"') str = false;
        } else if (c == '"') {
            str = true;
        } else if (is_ws(c)) {
            put(P, b, s + run, i - run);
            run = i + 1;
        }
    }
    if (run < n) put(P, b, s + run, n - run);
}

enum head { HEAD_NO, HEAD_MORE, HEAD_NAME };

/* t[p..lim) as the start of {"name": "x", "arguments" | "parameters": V ...}: HEAD_NAME once the name is read
 * (*name malloc'd; *v where V starts, NPOS while it has not or when it is a JSON string), HEAD_MORE while more
 * text may still make one, HEAD_NO when it cannot */
static enum head call_head(struct parse *P, size_t p, size_t lim, char **name, size_t *v) {
    static const char *const lead[] = {"{", "\"name\"", ":"};
    *name = NULL;
    *v = NPOS;
    for (int s = 0; s < 3; s++) {
        p = skip_ws_to(P, p, lim);
        size_t k = strlen(lead[s]), r = lim - p;
        if (r < k) return memcmp(P->t + p, lead[s], r) ? HEAD_NO : HEAD_MORE;
        if (memcmp(P->t + p, lead[s], k)) return HEAD_NO;
        p += k;
    }
    p = skip_ws_to(P, p, lim);
    if (p == lim) return HEAD_MORE;
    if (P->t[p] != '"') return HEAD_NO;
    size_t e = string_end(P, p, lim);
    if (e == NPOS) return HEAD_MORE;
    json_t *s = json_loadb(P->t + p, e - p, JSON_DECODE_ANY, NULL);
    const char *nm = json_string_value(s);
    if (!nm || !*nm) {
        json_decref(s);
        return HEAD_NO;
    }
    *name = strdup(nm);
    json_decref(s);
    if (!*name) {
        P->oom = true;
        return HEAD_NO;
    }
    p = skip_ws_to(P, e, lim);
    if (p == lim || P->t[p] != ',') return HEAD_NAME;
    p = skip_ws_to(P, p + 1, lim);
    static const char *const keys[] = {"\"arguments\"", "\"parameters\""};
    for (int i = 0; i < 2; i++) {
        size_t k = strlen(keys[i]);
        if (lim - p < k || memcmp(P->t + p, keys[i], k)) continue;
        size_t q = skip_ws_to(P, p + k, lim);
        if (q == lim || P->t[q] != ':') break;
        q = skip_ws_to(P, q + 1, lim);
        if (q < lim && P->t[q] != '"') *v = q;
        break;
    }
    return HEAD_NAME;
}

/* the arguments of the call object t[wa..wz) when they do not follow its name as a JSON value (a JSON string
 * holding JSON text, the keys in another order): compact JSON text into b; "{}" when none can be read */
static void args_from_wrapper(struct parse *P, struct buf *b, size_t wa, size_t wz) {
    json_t *o = wa < wz ? json_loadb(P->t + wa, wz - wa, JSON_DISABLE_EOF_CHECK, NULL) : NULL;
    json_t *args = json_object_get(o, "arguments");
    if (!args) args = json_object_get(o, "parameters");
    if (json_is_string(args)) {
        put_compact(P, b, json_string_value(args), json_string_length(args));
    } else if (args) {
        char *d = json_dumps(args, JSON_COMPACT | JSON_ENCODE_ANY);
        if (d) put(P, b, d, strlen(d));
        else P->oom = true;
        free(d);
    }
    json_decref(o);
    if (!b->n) put(P, b, "{}", 2);
}

static void push_call(struct parse *P, char *name, char *args, bool open) {
    if (P->n_calls == P->cap_calls && !P->oom) {
        size_t cap = P->cap_calls ? 2 * P->cap_calls : 4;
        struct toy_chat_call *nc = realloc(P->calls, cap * sizeof *nc);
        if (nc) P->calls = nc, P->cap_calls = cap;
        else P->oom = true;
    }
    if (!name || !args || P->oom) {
        free(name), free(args);
        P->oom = true;
        return;
    }
    P->calls[P->n_calls++] = (struct toy_chat_call){.name = name, .arguments = args, .open = open};
}

/* A committed call (name malloc'd, taken): its arguments the value at t[v], up to lim at most (v NPOS: not
 * begun, or not a value to stream; once the call is closed they come from the call object t[wa..wz), or are
 * "{}"). open: the reply may add to it. Returns where the value ends (NPOS: it runs to lim). */
static size_t commit_call(struct parse *P, char *name, size_t v, size_t lim, bool open, size_t wa, size_t wz) {
    struct buf a = {0};
    size_t ve = NPOS;
    if (v != NPOS && v < lim) {
        ve = value_end(P, v, lim);
        put_compact(P, &a, P->t + v, (ve == NPOS ? lim : ve) - v);
    } else if (!open) {
        if (wa != NPOS) args_from_wrapper(P, &a, wa, wz);
        else put(P, &a, "{}", 2);
    }
    char *args = a.p ? a.p : calloc(1, 1);
    if (args) args[a.n] = 0;
    push_call(P, name, args, open);
    return ve;
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
    static const char *const open_tag[] = {"<tool_call>", NULL}, *const close_tag[] = {"</tool_call>", NULL};
    for (;;) {
        size_t s = find(P, p, "<tool_call>");
        if (s == NPOS) return region(P, &P->content, p, P->n, true, open_tag);
        region(P, &P->content, p, s, false, NULL);
        size_t b = s + strlen("<tool_call>"), e = find(P, b, "</tool_call>");
        size_t lim = e != NPOS ? e : P->partial ? P->n - marker_tail(P, b, P->n, close_tag) : P->n;
        char *name;
        size_t v;
        enum head h = call_head(P, b, lim, &name, &v);
        if (h == HEAD_NAME) {
            commit_call(P, name, v, lim, e == NPOS && P->partial, b, lim);
            if (e == NPOS) return; /* cut off at the end: the call as far as it went */
            p = e + strlen("</tool_call>");
            continue;
        }
        if (e == NPOS) {
            if (!P->partial) region(P, &P->content, s, P->n, false, NULL); /* cut off before a name: kept as written */
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

/* bare {"name", "parameters"} objects, or after <|python_tag|>; bare JSON is a call only when it names a tool */
static void llama3(struct parse *P, size_t p) {
    static const char *const tag[] = {"<|python_tag|>", NULL};
    size_t q = skip_ws(P, p), n0 = P->n_calls;
    bool tagged = starts(P, q, "<|python_tag|>");
    if (!tagged && !(q < P->n && P->t[q] == '{')) {
        if (P->partial && q < P->n && may_become(P, q, "<|python_tag|>")) return;
        return region(P, &P->content, p, P->n, true, tag);
    }
    if (tagged) q += strlen("<|python_tag|>");
    for (;;) { /* the calls whose names are read, as they come */
        while (q < P->n && (is_ws(P->t[q]) || P->t[q] == ';')) q++;
        if (q == P->n) {
            if (P->partial || P->n_calls > n0) return;
            break;
        }
        char *name;
        size_t v;
        enum head h = call_head(P, q, P->n, &name, &v);
        if (h != HEAD_NAME || !(tagged || known_tool(P, name))) {
            free(name);
            if (P->partial) return; /* a call, or JSON content: known at the end */
            break;
        }
        size_t we = value_end(P, q, P->n);
        commit_call(P, name, v, P->n, we == NPOS && P->partial, q, we == NPOS ? P->n : we);
        if (we == NPOS) return;
        q = we;
    }
    size_t n1 = P->n_calls; /* the rest, all calls or else content */
    if (!json_calls(P, q, !tagged)) {
        drop_calls(P, n1);
        region(P, &P->content, n1 > n0 ? q : p, P->n, false, NULL);
    }
}

/* Mistral v3: [TOOL_CALLS][{name, arguments}, ...] from t[q] == '['; where the text stops being calls (NPOS: it
 * does not, or may not yet) */
static size_t mistral_array(struct parse *P, size_t q) {
    for (q++;;) {
        q = skip_ws(P, q);
        if (q == P->n) return P->partial ? NPOS : q;
        char *name;
        size_t v;
        enum head h = call_head(P, q, P->n, &name, &v);
        size_t we = value_end(P, q, P->n);
        if (h == HEAD_NAME) {
            commit_call(P, name, v, P->n, we == NPOS && P->partial, q, we == NPOS ? P->n : we);
            if (we == NPOS) return NPOS;
        } else {
            if (we == NPOS) return P->partial ? NPOS : q;
            json_t *o = json_loadb(P->t + q, we - q, 0, NULL);
            bool ok = call_from_object(P, o, false);
            json_decref(o);
            if (!ok) return q;
        }
        q = skip_ws(P, we);
        if (q < P->n && P->t[q] == ',') {
            q++;
            continue;
        }
        if (q < P->n && P->t[q] == ']') q = skip_ws(P, q + 1);
        return q == P->n ? NPOS : q;
    }
}

/* Mistral v11+: name[ARGS]{...}, each after its own [TOOL_CALLS] (some write name[CALL_ID]id[ARGS]) from t[q] */
static size_t mistral_named(struct parse *P, size_t q) {
    for (;;) {
        size_t a = find(P, q, "[ARGS]"), nm_end = q;
        while (nm_end < P->n && P->t[nm_end] != '[' && !is_ws(P->t[nm_end])) nm_end++;
        if (a == NPOS) return P->partial ? NPOS : q;
        if (nm_end == q || (nm_end != a && !starts(P, nm_end, "[CALL_ID]"))) return q;
        char *name = strndup(P->t + q, nm_end - q);
        size_t b = skip_ws(P, a + strlen("[ARGS]"));
        size_t ve = commit_call(P, name, b, P->n, P->partial && (b == P->n || value_end(P, b, P->n) == NPOS), NPOS, NPOS);
        if (ve == NPOS) return NPOS;
        q = skip_ws(P, ve);
        if (q == P->n || (P->partial && may_become(P, q, "[TOOL_CALLS]"))) return NPOS;
        if (!starts(P, q, "[TOOL_CALLS]")) return q;
        q = skip_ws(P, q + strlen("[TOOL_CALLS]"));
    }
}

static void mistral(struct parse *P, size_t p) {
    static const char *const tag[] = {"[TOOL_CALLS]", NULL};
    size_t s = find(P, p, "[TOOL_CALLS]"), n0 = P->n_calls;
    if (s == NPOS) return region(P, &P->content, p, P->n, true, tag);
    region(P, &P->content, p, s, false, NULL);
    size_t q = skip_ws(P, s + strlen("[TOOL_CALLS]"));
    size_t rest = q == P->n ? (P->partial ? NPOS : s) : P->t[q] == '[' ? mistral_array(P, q) : mistral_named(P, q);
    if (rest != NPOS && !P->partial) region(P, &P->content, P->n_calls > n0 ? rest : s, P->n, false, NULL);
}

/* DeepSeek: <calls_begin>(<call_begin>header<sep>body<call_end>)*<calls_end>; V3 / R1 write the header
 * "function" and the body name\n```json\n{...}\n```, V3.1 the name as the header and the arguments as the body */
static void deepseek(struct parse *P, size_t p) {
    static const char *const tags[] = {DS_CALLS_BEGIN, DS_CALL_BEGIN, NULL}, *const call_end[] = {DS_CALL_END, NULL};
    size_t s = find(P, p, DS_CALLS_BEGIN), s1 = find(P, p, DS_CALL_BEGIN), n0 = P->n_calls;
    if (s1 < s) s = s1;
    if (s == NPOS) return region(P, &P->content, p, P->n, true, tags);
    region(P, &P->content, p, s, false, NULL);
    size_t q = starts(P, s, DS_CALLS_BEGIN) ? s + strlen(DS_CALLS_BEGIN) : s, bad = NPOS;
    for (;;) {
        q = skip_ws(P, q);
        if (q == P->n) break;
        if (starts(P, q, DS_CALLS_END)) {
            region(P, &P->content, q + strlen(DS_CALLS_END), P->n, true, NULL);
            break;
        }
        if (!starts(P, q, DS_CALL_BEGIN)) {
            if (!P->partial || !(may_become(P, q, DS_CALL_BEGIN) || may_become(P, q, DS_CALLS_END))) bad = q;
            break;
        }
        size_t sep = find(P, q, DS_SEP), e = find(P, q, DS_CALL_END);
        if (sep == NPOS || (e != NPOS && sep > e)) {
            if (!P->partial || e != NPOS) bad = q;
            break;
        }
        size_t lim = e != NPOS ? e : P->partial ? P->n - marker_tail(P, sep, P->n, call_end) : P->n;
        size_t h0 = q + strlen(DS_CALL_BEGIN), h1 = sep, b0 = sep + strlen(DS_SEP), v = NPOS;
        trim(P->t, &h0, &h1);
        size_t nm0 = h0, nm1 = h1;
        if (h1 - h0 == 8 && !memcmp(P->t + h0, "function", 8)) { /* V3 / R1 */
            size_t nl = find(P, b0, "\n");
            if (nl == NPOS || nl >= lim) {
                if (!P->partial || e != NPOS) bad = q;
                break;
            }
            nm0 = b0, nm1 = nl;
            trim(P->t, &nm0, &nm1);
            size_t f = find(P, nl, "```json");
            if (f != NPOS && f + strlen("```json") <= lim) v = skip_ws_to(P, f + strlen("```json"), lim);
        } else { /* V3.1 */
            v = skip_ws_to(P, b0, lim);
        }
        if (nm1 == nm0) {
            bad = q;
            break;
        }
        commit_call(P, strndup(P->t + nm0, nm1 - nm0), v, lim, e == NPOS && P->partial, NPOS, NPOS);
        if (e == NPOS) break;
        q = e + strlen(DS_CALL_END);
    }
    if (bad != NPOS && !P->partial) region(P, &P->content, P->n_calls > n0 ? bad : s, P->n, false, NULL);
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
        size_t nm = r0;
        if (r0 != NPOS && r1 - r0 > 10 && !memcmp(P->t + r0, "functions.", 10)) nm += 10;
        if (r0 != NPOS && P->syn->tools && r1 > nm) { /* a call: its arguments stream as the body comes */
            size_t lim = open && P->partial ? e - marker_tail(P, b, e, body_end) : e;
            commit_call(P, strndup(P->t + nm, r1 - nm), skip_ws_to(P, b, lim), lim, open && P->partial, NPOS, NPOS);
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
