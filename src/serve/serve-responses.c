/* serve-responses.c: OpenAI's Responses API (POST /v1/responses) over the
 * chat path. A request is translated into a chat completion request
 * (input items into messages, instructions into a system message, flat
 * function tools into chat tools, text.format into response_format,
 * max_output_tokens into max_tokens, reasoning.effort into
 * reasoning_effort), which the chat parser then checks and runs as any
 * other; the reply, split as a chat reply is (reasoning, content, calls),
 * becomes output items: a reasoning item, a message with output_text, and
 * a function_call per call. Streamed, it is the Responses event sequence:
 * response.created, response.in_progress, then for each item
 * output_item.added, its deltas and its .done events, and
 * response.completed (or response.incomplete) with the whole response.
 * Responses are kept (unless "store": false) with the conversation
 * through them, in memory and for a bounded number, so a request may
 * continue one by previous_response_id, and GET or DELETE it by its id.
 * With a folder (--responses-dir) each kept response is also a file there,
 * <id>.json, written whole or not at all; a server that starts on the
 * folder keeps them again, so conversations outlive restarts.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "toy/file.h"

#include "serve/serve-internal.h"

#define BAD(param, ...) toy_srv_err(err, 400, "invalid_request_error", NULL, param, __VA_ARGS__)


/* ---- the store ---------------------------------------------------------------------------------- */

struct stored {
    char id[64];
    json_t *response, *messages; /* the response object; the conversation through it, as chat messages */
    json_t *input;               /* its request's input items, each with an id */
    size_t bytes;
    uint64_t used;
};

struct srv_store {
    pthread_mutex_t mu;
    struct stored *v;
    int n, max;
    size_t bytes, max_bytes;
    uint64_t clock;
    char *dir;   /* each kept response is also <dir>/<id>.json (NULL: memory only) */
    int lock_fd; /* dir/.lock, held (flock) while the store is open: one server per folder */
};

/* an id that names a file in the folder as it is: letters, digits, '_' and '-' */
static bool file_id(const char *id, size_t n) {
    if (n == 0 || n >= sizeof ((struct stored *)0)->id) return false;
    for (size_t i = 0; i < n; i++)
        if (!((id[i] >= 'a' && id[i] <= 'z') || (id[i] >= 'A' && id[i] <= 'Z') || (id[i] >= '0' && id[i] <= '9') ||
              id[i] == '_' || id[i] == '-'))
            return false;
    return true;
}

static void file_path(const struct srv_store *st, const char *id, char *out, size_t n) {
    snprintf(out, n, "%s/%s.json", st->dir, id);
}

/* e's file, written whole or not at all; a failure (a full disk) is said on stderr and leaves e in memory only */
static void save(const struct srv_store *st, const struct stored *e) {
    char path[4096];
    file_path(st, e->id, path, sizeof path);
    json_t *o = json_pack("{s:s,s:i,s:O,s:O,s:O}", "object", "toy.stored_response", "version", 1, "response",
                          e->response, "messages", e->messages, "input", e->input);
    struct toy_file_replace r;
    enum toy_status fs = o ? toy_file_replace_begin(path, &r) : TOY_ERR_NOMEM;
    if (!fs) fs = toy_file_replace_end(&r, json_dumpf(o, r.f, JSON_COMPACT) == 0);
    json_decref(o);
    if (fs) fprintf(stderr, "toy serve: response %s is kept in memory only: %s\n", e->id, toy_last_error());
}

static void unlink_file(const struct srv_store *st, const char *id) {
    char path[4096];
    file_path(st, id, path, sizeof path);
    if (unlink(path) && errno != ENOENT)
        fprintf(stderr, "toy serve: cannot remove %s (a dropped response): %s\n", path, strerror(errno));
}

/* a kept response used again: its file's time says so, for the next server's order of keeping */
static void touch_file(const struct srv_store *st, const char *id) {
    char path[4096];
    file_path(st, id, path, sizeof path);
    utimensat(AT_FDCWD, path, NULL, 0);
}

static void drop(struct srv_store *st, int i) {
    json_decref(st->v[i].response);
    json_decref(st->v[i].messages);
    json_decref(st->v[i].input);
    st->bytes -= st->v[i].bytes;
    st->v[i] = st->v[--st->n];
}

/* dropped for good (evicted, deleted): its file too */
static void forget(struct srv_store *st, int i) {
    if (st->dir) unlink_file(st, st->v[i].id);
    drop(st, i);
}

static size_t json_bytes(json_t *response, json_t *messages, json_t *input) {
    return json_dumpb(response, NULL, 0, JSON_COMPACT) + json_dumpb(messages, NULL, 0, JSON_COMPACT) +
           json_dumpb(input, NULL, 0, JSON_COMPACT);
}

struct found {
    char id[64];
    struct timespec t;
};

static int newest_first(const void *a, const void *b) {
    const struct timespec *x = &((const struct found *)a)->t, *y = &((const struct found *)b)->t;
    return x->tv_sec != y->tv_sec ? (x->tv_sec < y->tv_sec) - (x->tv_sec > y->tv_sec)
                                  : (x->tv_nsec < y->tv_nsec) - (x->tv_nsec > y->tv_nsec);
}

/* one file's response, checked; false (and why) when it is not one this store wrote */
static bool load_one(struct srv_store *st, const struct found *f, char *why, size_t n) {
    char path[4096];
    file_path(st, f->id, path, sizeof path);
    json_error_t je;
    json_t *o = json_load_file(path, JSON_REJECT_DUPLICATES, &je), *r = json_object_get(o, "response");
    json_t *m = json_object_get(o, "messages"), *in = json_object_get(o, "input");
    const char *rid = json_string_value(json_object_get(r, "id"));
    if (!o) snprintf(why, n, "line %d: %s", je.line, je.text);
    else if (strcmp(json_string_value(json_object_get(o, "object")) ? json_string_value(json_object_get(o, "object")) : "",
                    "toy.stored_response") || json_integer_value(json_object_get(o, "version")) != 1)
        snprintf(why, n, "not a stored response of version 1 (\"object\": \"toy.stored_response\", \"version\": 1)");
    else if (!json_is_object(r) || !json_is_array(m) || !json_is_array(in))
        snprintf(why, n, "\"response\" (an object), \"messages\" and \"input\" (arrays) are wanted");
    else if (!rid || strcmp(rid, f->id))
        snprintf(why, n, "its response's id is not the file's name");
    else {
        struct stored *e = &st->v[st->n++];
        snprintf(e->id, sizeof e->id, "%s", f->id);
        e->response = json_incref(r), e->messages = json_incref(m), e->input = json_incref(in);
        e->bytes = json_bytes(r, m, in);
        st->bytes += e->bytes;
        json_decref(o);
        return true;
    }
    json_decref(o);
    return false;
}

/* the folder's responses, the most recently used first, as many as the store holds */
static enum toy_status load(struct srv_store *st) {
    DIR *d = opendir(st->dir);
    if (!d) return toy_error(TOY_ERR_IO, "--responses-dir %s: %s", st->dir, strerror(errno));
    struct found *fs = NULL;
    size_t n = 0, cap = 0;
    for (struct dirent *de; (de = readdir(d));) {
        size_t len = strlen(de->d_name);
        if (len <= 5 || strcmp(de->d_name + len - 5, ".json") || !file_id(de->d_name, len - 5)) continue;
        struct stat sb;
        if (fstatat(dirfd(d), de->d_name, &sb, 0) || !S_ISREG(sb.st_mode)) continue;
        if (n == cap) {
            struct found *g = realloc(fs, (cap = cap ? cap * 2 : 64) * sizeof *fs);
            if (!g) {
                free(fs);
                closedir(d);
                return toy_error(TOY_ERR_NOMEM, "--responses-dir %s", st->dir);
            }
            fs = g;
        }
        snprintf(fs[n].id, sizeof fs[n].id, "%.*s", (int)(len - 5), de->d_name);
        fs[n++].t = sb.st_mtim;
    }
    closedir(d);
    if (n) qsort(fs, n, sizeof *fs, newest_first); /* (fs is NULL for an empty folder) */
    size_t kept = 0, bad = 0, over = 0;
    for (size_t i = 0; i < n; i++) {
        char why[320];
        if (st->n == st->max || st->bytes >= st->max_bytes) {
            over = n - i;
            break;
        }
        if (load_one(st, &fs[i], why, sizeof why)) {
            kept++;
            if (st->bytes > st->max_bytes) { /* the one that passed the bound stays out */
                drop(st, st->n - 1);
                kept--, over = n - i;
                break;
            }
        } else {
            bad++;
            fprintf(stderr, "toy serve: %s/%s.json is skipped (left as it is): %s\n", st->dir, fs[i].id, why);
        }
    }
    /* the clock: the newest gets the highest */
    for (int i = 0; i < st->n; i++) st->v[i].used = (uint64_t)(st->n - i);
    st->clock = (uint64_t)st->n;
    if (kept || bad || over)
        fprintf(stderr, "toy serve: %zu responses kept from %s", kept, st->dir);
    if (bad) fprintf(stderr, ", %zu skipped", bad);
    if (over) fprintf(stderr, ", %zu older ones left there unread (past --responses %d or %zu MiB)", over, st->max,
                      st->max_bytes >> 20);
    if (kept || bad || over) fputc('\n', stderr);
    free(fs);
    return TOY_OK;
}

enum toy_status toy_srv_store_open(int max, size_t max_bytes, const char *dir, struct srv_store **out) {
    *out = NULL;
    struct srv_store *st = calloc(1, sizeof *st);
    if (!st || !(st->v = calloc((size_t)(max > 0 ? max : 1), sizeof *st->v))) {
        free(st);
        return toy_error(TOY_ERR_NOMEM, "serve: the responses' store");
    }
    pthread_mutex_init(&st->mu, NULL);
    st->max = max;
    st->max_bytes = max_bytes;
    st->lock_fd = -1;
    enum toy_status fs = TOY_OK;
    if (dir) {
        char lock[4096];
        struct stat sb;
        if (mkdir(dir, 0777) && errno != EEXIST)
            fs = toy_error(TOY_ERR_IO, "--responses-dir %s: cannot create it: %s", dir, strerror(errno));
        else if (stat(dir, &sb) || !S_ISDIR(sb.st_mode))
            fs = toy_error(TOY_ERR_IO, "--responses-dir %s: not a folder", dir);
        else if (snprintf(lock, sizeof lock, "%s/.lock", dir) >= (int)sizeof lock ||
                 (st->lock_fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0666)) < 0)
            fs = toy_error(TOY_ERR_IO, "--responses-dir %s: cannot write in it: %s", dir, strerror(errno));
        else if (flock(st->lock_fd, LOCK_EX | LOCK_NB))
            fs = toy_error(TOY_ERR_IO, "--responses-dir %s: another server keeps its responses there", dir);
        else if (!(st->dir = strdup(dir)))
            fs = toy_error(TOY_ERR_NOMEM, "--responses-dir %s", dir);
        else
            fs = load(st);
    }
    if (fs) {
        toy_srv_store_free(st);
        return fs;
    }
    *out = st;
    return TOY_OK;
}

void toy_srv_store_free(struct srv_store *st) {
    if (!st) return;
    while (st->n) drop(st, 0);
    pthread_mutex_destroy(&st->mu);
    if (st->lock_fd >= 0) close(st->lock_fd); /* and the lock with it */
    free(st->dir);
    free(st->v);
    free(st);
}

static int find(const struct srv_store *st, const char *id) {
    for (int i = 0; i < st->n; i++)
        if (!strcmp(st->v[i].id, id)) return i;
    return -1;
}

/* keeps copies of response, messages and input under id, the least recently used going first to make room; false
 * when they alone are more than the store holds */
static bool store_put(struct srv_store *st, const char *id, json_t *response, json_t *messages, json_t *input) {
    size_t bytes = json_bytes(response, messages, input);
    if (bytes > st->max_bytes || !file_id(id, strlen(id))) return false;
    json_t *r = json_deep_copy(response), *m = json_deep_copy(messages), *in = json_deep_copy(input);
    if (!r || !m || !in) {
        json_decref(r), json_decref(m), json_decref(in);
        return false;
    }
    pthread_mutex_lock(&st->mu);
    int at = find(st, id);
    if (at >= 0) drop(st, at);
    while (st->n && (st->n >= st->max || st->bytes + bytes > st->max_bytes)) {
        int old = 0;
        for (int i = 1; i < st->n; i++)
            if (st->v[i].used < st->v[old].used) old = i;
        forget(st, old);
    }
    struct stored *e = &st->v[st->n++];
    snprintf(e->id, sizeof e->id, "%s", id);
    e->response = r, e->messages = m, e->input = in, e->bytes = bytes, e->used = ++st->clock;
    st->bytes += bytes;
    if (st->dir) save(st, e);
    pthread_mutex_unlock(&st->mu);
    return true;
}

/* copies of what id keeps (either may be NULL, not wanted) */
static bool store_get(struct srv_store *st, const char *id, json_t **response, json_t **messages) {
    pthread_mutex_lock(&st->mu);
    int i = find(st, id);
    if (i >= 0) {
        st->v[i].used = ++st->clock;
        if (st->dir) touch_file(st, id);
        if (response) *response = json_deep_copy(st->v[i].response);
        if (messages) *messages = json_deep_copy(st->v[i].messages);
    }
    pthread_mutex_unlock(&st->mu);
    return i >= 0;
}

json_t *toy_srv_store_get(struct srv_store *st, const char *id) {
    json_t *r = NULL;
    return st && store_get(st, id, &r, NULL) ? r : NULL;
}

/* the item of that id in array a, or NULL */
static json_t *item_in(json_t *a, const char *id) {
    for (size_t i = 0; i < json_array_size(a); i++) {
        const char *x = json_string_value(json_object_get(json_array_get(a, i), "id"));
        if (x && !strcmp(x, id)) return json_array_get(a, i);
    }
    return NULL;
}

/* a copy of the kept item of that id (an input or an output item of a kept response), or NULL */
static json_t *store_item(struct srv_store *st, const char *id) {
    json_t *it = NULL;
    pthread_mutex_lock(&st->mu);
    for (int i = 0; i < st->n && !it; i++)
        if ((it = item_in(st->v[i].input, id)) || (it = item_in(json_object_get(st->v[i].response, "output"), id))) {
            st->v[i].used = ++st->clock;
            if (st->dir) touch_file(st, st->v[i].id);
            it = json_deep_copy(it);
        }
    pthread_mutex_unlock(&st->mu);
    return it;
}

json_t *toy_srv_store_input_items(struct srv_store *st, const char *id, int limit, bool asc, const char *after,
                                  const char *before, const char **bad) {
    *bad = NULL;
    json_t *in = NULL;
    if (!st) return NULL;
    pthread_mutex_lock(&st->mu);
    int i = find(st, id);
    if (i >= 0) {
        st->v[i].used = ++st->clock;
        if (st->dir) touch_file(st, id);
        in = json_deep_copy(st->v[i].input);
    }
    pthread_mutex_unlock(&st->mu);
    if (!in) return NULL;
    /* the items in the asked order, then the range the cursors leave */
    int64_t n = (int64_t)json_array_size(in), lo = 0, hi = n;
    json_t *ord = json_array();
    for (int64_t k = 0; k < n; k++) json_array_append(ord, json_array_get(in, (size_t)(asc ? k : n - 1 - k)));
    json_decref(in);
    for (int c = 0; c < 2; c++) {
        const char *cur = c ? before : after;
        if (!cur) continue;
        int64_t at = -1;
        for (int64_t k = 0; k < n && at < 0; k++)
            if (!strcmp(json_string_value(json_object_get(json_array_get(ord, (size_t)k), "id")), cur)) at = k;
        if (at < 0) {
            json_decref(ord);
            *bad = c ? "before" : "after";
            return NULL;
        }
        if (c) hi = at < hi ? at : hi;
        else lo = at + 1;
    }
    json_t *data = json_array();
    for (int64_t k = lo; k < hi && k < lo + limit; k++) json_array_append(data, json_array_get(ord, (size_t)k));
    size_t got = json_array_size(data);
    json_t *o = json_pack("{s:s,s:o,s:b}", "object", "list", "data", data, "has_more", lo + (int64_t)got < hi);
    json_object_set(o, "first_id", got ? json_object_get(json_array_get(data, 0), "id") : json_null());
    json_object_set(o, "last_id", got ? json_object_get(json_array_get(data, got - 1), "id") : json_null());
    json_decref(ord);
    return o;
}

void toy_srv_store_stats(struct srv_store *st, int *n, size_t *bytes) {
    *n = 0, *bytes = 0;
    if (!st) return;
    pthread_mutex_lock(&st->mu);
    *n = st->n, *bytes = st->bytes;
    pthread_mutex_unlock(&st->mu);
}

bool toy_srv_store_delete(struct srv_store *st, const char *id) {
    if (!st) return false;
    pthread_mutex_lock(&st->mu);
    int i = find(st, id);
    if (i >= 0) forget(st, i);
    pthread_mutex_unlock(&st->mu);
    return i >= 0;
}

/* ---- the request ------------------------------------------------------------------------------ */

/* a message's content: a string, or parts {type: input_text | output_text | text, text} joined */
static bool item_text(json_t *c, size_t i, json_t **out, struct srv_error *err) {
    if (json_is_string(c)) {
        *out = json_incref(c);
        return true;
    }
    if (!json_is_array(c)) return BAD("input", "input[%zu].content must be a string or an array of text parts", i);
    for (size_t k = 0; k < json_array_size(c); k++) {
        json_t *p = json_array_get(c, k);
        const char *type = json_string_value(json_object_get(p, "type"));
        const char *t = json_string_value(json_object_get(p, "text"));
        if (!type || (strcmp(type, "input_text") && strcmp(type, "output_text") && strcmp(type, "text")) || !t)
            return BAD("input", "input[%zu].content[%zu]: type '%s' (toy reads input_text and output_text parts)", i,
                       k, type ? type : "?");
    }
    return (*out = toy_srv_join_text(c, "text")) || toy_srv_err(err, 500, "server_error", NULL, NULL, "out of memory");
}

/* the assistant message calls go into: the last message when it is the assistant's, else a new one */
static json_t *assistant_for_calls(json_t *msgs) {
    json_t *last = json_array_get(msgs, json_array_size(msgs) - 1);
    const char *role = json_string_value(json_object_get(last, "role"));
    if (last && role && !strcmp(role, "assistant")) return last;
    json_t *m = json_pack("{s:s,s:n}", "role", "assistant", "content");
    json_array_append_new(msgs, m);
    return m;
}

static bool input_messages(json_t *in, json_t *msgs, struct srv_error *err) {
    if (json_is_string(in)) {
        json_array_append_new(msgs, json_pack("{s:s,s:O}", "role", "user", "content", in));
        return true;
    }
    if (!json_is_array(in) || json_array_size(in) == 0)
        return BAD("input", "'input' must be a string or a non-empty array of items");
    json_t *reasoning = NULL; /* a reasoning item's text, for the assistant message after it */
    for (size_t i = 0; i < json_array_size(in); i++) {
        json_t *it = json_array_get(in, i);
        if (!json_is_object(it)) return BAD("input", "input[%zu] must be an object", i);
        const char *type = json_string_value(json_object_get(it, "type"));
        const char *role = json_string_value(json_object_get(it, "role"));
        if (!type && role) type = "message";
        if (!type) return BAD("input", "input[%zu] has no type", i);
        if (!strcmp(type, "message")) {
            if (!role || (strcmp(role, "user") && strcmp(role, "system") && strcmp(role, "developer") &&
                          strcmp(role, "assistant")))
                return BAD("input", "input[%zu].role must be user, system, developer or assistant", i);
            json_t *text;
            if (!item_text(json_object_get(it, "content"), i, &text, err)) return false;
            json_t *m = json_pack("{s:s,s:o}", "role", role, "content", text);
            if (!strcmp(role, "assistant") && reasoning) json_object_set(m, "reasoning_content", reasoning);
            json_array_append_new(msgs, m);
            json_decref(reasoning), reasoning = NULL;
        } else if (!strcmp(type, "function_call")) {
            const char *name = json_string_value(json_object_get(it, "name"));
            json_t *args = json_object_get(it, "arguments"), *id = json_object_get(it, "call_id");
            if (!name || !json_is_string(args) || !json_is_string(id))
                return BAD("input", "input[%zu]: a function_call needs call_id, name and arguments (strings)", i);
            json_t *m = assistant_for_calls(msgs);
            if (reasoning) json_object_set(m, "reasoning_content", reasoning);
            json_decref(reasoning), reasoning = NULL;
            json_t *calls = json_object_get(m, "tool_calls");
            if (!calls) json_object_set_new(m, "tool_calls", calls = json_array());
            json_array_append_new(calls, json_pack("{s:O,s:s,s:{s:s,s:O}}", "id", id, "type", "function", "function",
                                                   "name", name, "arguments", args));
        } else if (!strcmp(type, "function_call_output")) {
            json_t *id = json_object_get(it, "call_id"), *text;
            if (!json_is_string(id)) return BAD("input", "input[%zu]: a function_call_output needs a call_id", i);
            if (!item_text(json_object_get(it, "output"), i, &text, err)) return false;
            json_array_append_new(msgs, json_pack("{s:s,s:O,s:o}", "role", "tool", "tool_call_id", id, "content", text));
        } else if (!strcmp(type, "reasoning")) { /* its text, for the template of the assistant turn it preceded */
            json_t *parts = json_object_get(it, "content");
            if (!json_array_size(parts)) parts = json_object_get(it, "summary");
            json_t *text = NULL;
            for (size_t k = 0; k < json_array_size(parts); k++)
                if (!json_is_string(json_object_get(json_array_get(parts, k), "text")))
                    return BAD("input", "input[%zu]: reasoning parts need a text", i);
            if (json_array_size(parts) && !(text = toy_srv_join_text(parts, "text")))
                return toy_srv_err(err, 500, "server_error", NULL, NULL, "out of memory");
            json_decref(reasoning);
            reasoning = text;
        } else {
            return BAD("input", "input[%zu]: item type '%s' (toy reads message, function_call, function_call_output "
                       "and reasoning)", i, type);
        }
    }
    json_decref(reasoning);
    return true;
}

/* in's items, each item_reference replaced by the kept item it names */
static bool resolve_refs(const struct srv_api *api, json_t *in, json_t **out, struct srv_error *err) {
    *out = NULL;
    json_t *r = json_array();
    for (size_t i = 0; json_is_array(in) && i < json_array_size(in); i++) {
        json_t *it = json_array_get(in, i);
        const char *type = json_string_value(json_object_get(it, "type"));
        if (!type || strcmp(type, "item_reference")) {
            json_array_append(r, it);
            continue;
        }
        const char *id = json_string_value(json_object_get(it, "id"));
        json_t *x = id && api->store ? store_item(api->store, id) : NULL;
        if (!x) {
            json_decref(r);
            if (!id) return BAD("input", "input[%zu]: an item_reference needs an id (a string)", i);
            if (!api->store)
                return BAD("input", "input[%zu]: this server keeps no items to refer to (toy serve --responses 0)", i);
            return toy_srv_err(err, 400, "invalid_request_error", "item_not_found", "input",
                               "input[%zu]: no kept item '%s' (toy keeps the items of the newest responses, in "
                               "memory)", i, id);
        }
        json_array_append_new(r, x);
    }
    *out = r;
    return true;
}

/* the input as GET /v1/responses/{id}/input_items lists it (ids given when it is kept): a string as a user
 * message, every message with a type and its content as parts */
static json_t *listed_input(json_t *in) {
    if (json_is_string(in))
        return json_pack("[{s:s,s:s,s:[{s:s,s:O}]}]", "type", "message", "role", "user", "content", "type",
                         "input_text", "text", in);
    json_t *a = json_array();
    for (size_t i = 0; i < json_array_size(in); i++) {
        json_t *x = json_deep_copy(json_array_get(in, i));
        const char *role = json_string_value(json_object_get(x, "role"));
        if (!json_object_get(x, "type") && role) json_object_set_new(x, "type", json_string("message"));
        json_t *c = json_object_get(x, "content");
        if (role && json_is_string(c))
            json_object_set_new(x, "content", json_pack("[{s:s,s:O}]", "type", strcmp(role, "assistant") ?
                                                        "input_text" : "output_text", "text", c));
        json_array_append_new(a, x);
    }
    return a;
}

static bool copy_keys(json_t *from, json_t *to, const char *const *keys) {
    for (const char *const *k = keys; *k; k++) {
        json_t *v = json_object_get(from, *k);
        if (v) json_object_set(to, *k, v);
    }
    return true;
}

bool toy_srv_responses_to_chat(const struct srv_api *api, json_t *body, json_t **out, struct srv_request *r,
                               struct srv_error *err) {
    *out = NULL;
    json_t *bg = json_object_get(body, "background");
    if (json_is_true(bg)) return BAD("background", "background responses are not supported");
    json_t *store = json_object_get(body, "store");
    if (store && !json_is_null(store) && !json_is_boolean(store)) return BAD("store", "'store' must be a boolean");
    json_t *in = json_object_get(body, "input");
    if (!in) return BAD("input", "'input' is required");
    /* the conversation: the previous response's (its instructions are not carried over, as OpenAI's are not),
     * then this input */
    json_t *conv = NULL, *prev = json_object_get(body, "previous_response_id");
    if (prev && !json_is_null(prev)) {
        if (!json_is_string(prev)) return BAD("previous_response_id", "'previous_response_id' must be a string");
        if (!api->store)
            return BAD("previous_response_id", "this server keeps no responses (toy serve --responses 0): send the "
                       "whole conversation as 'input'");
        if (!store_get(api->store, json_string_value(prev), NULL, &conv))
            return toy_srv_err(err, 400, "invalid_request_error", "previous_response_not_found", "previous_response_id",
                               "Previous response with id '%s' not found (toy keeps the newest responses, in memory)",
                               json_string_value(prev));
    }
    if (!conv && !(conv = json_array())) return toy_srv_err(err, 500, "server_error", NULL, NULL, "out of memory");
    json_t *items = NULL;
    if (json_is_array(in) && !resolve_refs(api, in, &items, err)) {
        json_decref(conv);
        return false;
    }
    bool ok = input_messages(items ? items : in, conv, err);
    json_t *listed = ok && api->store && !json_is_false(store) ? listed_input(items ? items : in) : NULL;
    json_decref(items);
    if (!ok) {
        json_decref(conv);
        return false;
    }
    json_t *chat = json_object(), *msgs = json_array();
    json_object_set_new(chat, "messages", msgs);
    *out = chat;
    json_t *instr = json_object_get(body, "instructions");
    if (instr && !json_is_null(instr)) {
        if (!json_is_string(instr)) {
            json_decref(conv);
            json_decref(listed);
            return BAD("instructions", "'instructions' must be a string");
        }
        json_array_append_new(msgs, json_pack("{s:s,s:O}", "role", "system", "content", instr));
    }
    json_t *copy = json_deep_copy(conv); /* the chat parser may rewrite its messages */
    json_array_extend(msgs, copy);
    json_decref(copy);
    if (listed) r->resp_conv = conv, r->resp_input = listed;
    else json_decref(conv);
    static const char *const same[] = {"model", "stream", "temperature", "top_p", "top_k", "min_p", "seed",
                                       "frequency_penalty", "presence_penalty", "repeat_penalty", "logit_bias",
                                       "stop", "chat_template_kwargs", "parallel_tool_calls", NULL};
    copy_keys(body, chat, same);
    json_t *v = json_object_get(body, "max_output_tokens");
    if (v && !json_is_null(v)) json_object_set(chat, "max_tokens", v);
    json_t *tools = json_object_get(body, "tools");
    if (tools && !json_is_null(tools)) {
        if (!json_is_array(tools)) return BAD("tools", "'tools' must be an array");
        json_t *ct = json_array();
        json_object_set_new(chat, "tools", ct);
        for (size_t k = 0; k < json_array_size(tools); k++) {
            json_t *t = json_array_get(tools, k);
            const char *type = json_string_value(json_object_get(t, "type"));
            if (!type || strcmp(type, "function"))
                return BAD("tools", "tools[%zu]: type '%s' (toy runs function tools only)", k, type ? type : "?");
            json_array_append_new(ct, toy_srv_chat_tool(json_object_get(t, "name"), json_object_get(t, "description"),
                                                        json_object_get(t, "parameters"), json_object_get(t, "strict")));
        }
    }
    json_t *tc = json_object_get(body, "tool_choice");
    if (tc && !json_is_null(tc)) {
        const char *tt = json_string_value(json_object_get(tc, "type"));
        if (json_is_object(tc) && tt && !strcmp(tt, "function"))
            json_object_set_new(chat, "tool_choice", json_pack("{s:s,s:{s:O}}", "type", "function", "function", "name",
                                                               json_object_get(tc, "name")));
        else
            json_object_set(chat, "tool_choice", tc);
    }
    json_t *fmt = json_object_get(json_object_get(body, "text"), "format");
    if (fmt && !json_is_null(fmt)) {
        const char *ft = json_string_value(json_object_get(fmt, "type"));
        if (ft && !strcmp(ft, "json_schema")) {
            json_t *js = json_object();
            static const char *const jkeys[] = {"name", "schema", "strict", NULL};
            copy_keys(fmt, js, jkeys);
            json_object_set_new(chat, "response_format", json_pack("{s:s,s:o}", "type", "json_schema", "json_schema", js));
        } else {
            json_object_set(chat, "response_format", fmt);
        }
    }
    json_t *effort = json_object_get(json_object_get(body, "reasoning"), "effort");
    if (json_is_string(effort)) json_object_set(chat, "reasoning_effort", effort);
    return true;
}

/* the chat parameter an error names, as the Responses request calls it */
void toy_srv_responses_param(struct srv_error *err) {
    static const char *const map[][2] = {{"messages", "input"}, {"max_tokens", "max_output_tokens"},
                                         {"response_format", "text.format"}, {"reasoning_effort", "reasoning.effort"}};
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++) {
        if (strcmp(err->param, map[i][0])) continue;
        snprintf(err->param, sizeof err->param, "%s", map[i][1]);
        char quoted[48], *at; /* and the message's 'max_tokens' */
        snprintf(quoted, sizeof quoted, "'%s'", map[i][0]);
        if ((at = strstr(err->msg, quoted))) {
            char rest[512];
            snprintf(rest, sizeof rest, "%s", at + strlen(quoted));
            snprintf(at, sizeof err->msg - (size_t)(at - err->msg), "'%s'%s", map[i][1], rest);
        }
    }
}

/* ---- the reply ---------------------------------------------------------------------------------- */

/* the reply split so far (final: the whole of it): reasoning, content and calls; a reply that is not split is
 * all content */

static json_t *usage_json(const struct srv_job *j) {
    int64_t p = j->n_prompt, c = j->n_generated;
    return json_pack("{s:I,s:{s:I},s:I,s:{s:I},s:I}", "input_tokens", (json_int_t)p, "input_tokens_details",
                     "cached_tokens", (json_int_t)j->n_cached, "output_tokens", (json_int_t)c, "output_tokens_details",
                     "reasoning_tokens", (json_int_t)0, "total_tokens", (json_int_t)(p + c));
}

static json_t *echo(json_t *body, const char *key, json_t *def) {
    json_t *v = body ? json_object_get(body, key) : NULL;
    if (v && !json_is_null(v)) {
        json_decref(def);
        return json_incref(v);
    }
    return def;
}

/* the response object: status, the output items, and what the request asked for */
static json_t *response_object(const struct srv_api *api, const struct srv_request *r, const struct srv_job *j,
                               const char *id, long created, const char *status, json_t *output) {
    json_t *b = r->resp_body;
    json_t *o = json_pack("{s:s,s:s,s:I,s:s,s:n,s:n,s:o,s:o,s:s,s:o,s:b,s:n,s:{s:o,s:n},s:b,s:o,s:o,s:o,s:o,s:o,"
                          "s:s,s:o,s:{}}",
                          "id", id, "object", "response", "created_at", (json_int_t)created, "status", status, "error",
                          "incomplete_details", "instructions", echo(b, "instructions", json_null()),
                          "max_output_tokens", echo(b, "max_output_tokens", json_null()), "model", api->model_name,
                          "output", output, "parallel_tool_calls", 1, "previous_response_id", "reasoning", "effort",
                          echo(json_object_get(b, "reasoning"), "effort", json_null()), "summary", "store",
                          r->resp_conv != NULL,
                          "temperature", echo(b, "temperature", json_real(1)), "text",
                          echo(b, "text", json_pack("{s:{s:s}}", "format", "type", "text")), "tool_choice",
                          echo(b, "tool_choice", json_string("auto")), "tools", echo(b, "tools", json_array()),
                          "top_p", echo(b, "top_p", json_real(1)), "truncation", "disabled", "usage",
                          j && !strcmp(status, "in_progress") ? json_null() : j ? usage_json(j) : json_null(),
                          "metadata");
    if (j && !strcmp(status, "incomplete"))
        json_object_set_new(o, "incomplete_details", json_pack("{s:s}", "reason", "max_output_tokens"));
    json_t *prev = json_object_get(b, "previous_response_id");
    if (json_is_string(prev)) json_object_set(o, "previous_response_id", prev);
    return o;
}

/* a finished response o (output items items) kept with its conversation, when the request asked to store it */
static void keep(const struct srv_api *api, const struct srv_request *r, const char *id, json_t *o, json_t *items) {
    if (!r->resp_conv || !api->store) return;
    json_t *conv = json_deep_copy(r->resp_conv);
    struct srv_error e;
    /* the output items read as input items: a reasoning item, the message, the calls */
    /* the input items, each with an id: the client's, else one after the response's */
    json_t *in = json_deep_copy(r->resp_input);
    for (size_t k = 0; k < json_array_size(in); k++) {
        json_t *x = json_array_get(in, k);
        if (json_is_string(json_object_get(x, "id"))) continue;
        const char *type = json_string_value(json_object_get(x, "type")), *kind = "item";
        static const char *const kinds[][2] = {{"message", "msg"}, {"function_call", "fc"},
                                               {"function_call_output", "fco"}, {"reasoning", "rs"}};
        for (size_t t = 0; type && t < sizeof kinds / sizeof kinds[0]; t++)
            if (!strcmp(type, kinds[t][0])) kind = kinds[t][1];
        const char *u = strchr(id, '_'); /* as the output items' (item_id), with "in" before the index */
        char iid[96];
        snprintf(iid, sizeof iid, "%s_%s_in%zu", kind, u ? u + 1 : id, k);
        json_object_set_new(x, "id", json_string(iid));
    }
    if (conv && in && (!json_array_size(items) || input_messages(items, conv, &e)) &&
        !store_put(api->store, id, o, conv, in))
        json_object_set_new(o, "store", json_false()); /* more than the whole store holds */
    json_decref(conv);
    json_decref(in);
}

static const char *final_status(const struct srv_job *j) {
    return strcmp(toy_srv_finish_reason(j), "length") ? "completed" : "incomplete";
}

/* the item ids: the response's, the kind's prefix and the item's index */
static void item_id(char *out, size_t n, const char *kind, const char *resp_id, int k) {
    const char *u = strchr(resp_id, '_');
    snprintf(out, n, "%s_%s_%d", kind, u ? u + 1 : resp_id, k);
}

static json_t *text_item(const char *kind, const char *id, const char *text, size_t n, const char *status) {
    if (!strcmp(kind, "rs"))
        return json_pack("{s:s,s:s,s:[],s:[{s:s,s:o}]}", "type", "reasoning", "id", id, "summary", "content", "type",
                         "reasoning_text", "text", toy_srv_jstr(text, n));
    return json_pack("{s:s,s:s,s:s,s:s,s:[{s:s,s:o,s:[],s:[]}]}", "type", "message", "id", id, "status", status, "role",
                     "assistant", "content", "type", "output_text", "text", toy_srv_jstr(text, n), "annotations", "logprobs");
}

static json_t *call_item(const struct toy_chat_call *c, const char *id, const char *resp_id, int k, const char *status,
                         bool with_args) {
    char cid[96];
    item_id(cid, sizeof cid, "call", resp_id, k);
    return json_pack("{s:s,s:s,s:s,s:s,s:o,s:s}", "type", "function_call", "id", id, "call_id", cid, "name", c->name,
                     "arguments", with_args ? toy_srv_jstr(c->arguments, strlen(c->arguments)) : json_string(""), "status",
                     status);
}

json_t *toy_srv_responses_json(const struct srv_api *api, const struct srv_request *r, struct srv_job *j,
                               const char *id, long created) {
    struct toy_chat_reply p;
    json_t *out = json_array();
    int k = 0;
    char iid[96];
    if (toy_srv_reply_split(r, j, true, &p)) {
        if (*p.reasoning) {
            item_id(iid, sizeof iid, "rs", id, k++);
            json_array_append_new(out, text_item("rs", iid, p.reasoning, strlen(p.reasoning), "completed"));
        }
        if (*p.content || (!p.n_calls && !*p.reasoning)) {
            item_id(iid, sizeof iid, "msg", id, k++);
            json_array_append_new(out, text_item("msg", iid, p.content, strlen(p.content), "completed"));
        }
        for (size_t c = 0; c < p.n_calls; c++) {
            item_id(iid, sizeof iid, "fc", id, k);
            json_array_append_new(out, call_item(&p.calls[c], iid, id, k++, "completed", true));
        }
        j->n_calls = p.n_calls;
        toy_chat_reply_free(&p);
    }
    json_t *o = response_object(api, r, j, id, created, final_status(j), out);
    keep(api, r, id, o, out);
    return o;
}

/* ---- the stream ----------------------------------------------------------------------------------- */

static void event(json_t *events, struct srv_sent *s, const char *type, json_t *o) {
    json_object_set_new(o, "type", json_string(type));
    json_object_set_new(o, "sequence_number", json_integer(s->seq++));
    json_array_append_new(events, o);
}

json_t *toy_srv_responses_start(const struct srv_api *api, const struct srv_request *r, struct srv_sent *s,
                                const char *id, long created) {
    json_t *ev = json_array();
    s->items = json_array();
    event(ev, s, "response.created",
          json_pack("{s:o}", "response", response_object(api, r, NULL, id, created, "in_progress", json_array())));
    event(ev, s, "response.in_progress",
          json_pack("{s:o}", "response", response_object(api, r, NULL, id, created, "in_progress", json_array())));
    return ev;
}

/* the text item open (reasoning or message) ends */
static void close_item(json_t *ev, struct srv_sent *s) {
    if (!s->open) return;
    json_t *item = json_array_get(s->items, json_array_size(s->items) - 1);
    json_t *part = json_array_get(json_object_get(item, "content"), 0);
    const char *iid = json_string_value(json_object_get(item, "id"));
    int k = (int)json_array_size(s->items) - 1;
    bool rs = s->open == 1;
    event(ev, s, rs ? "response.reasoning_text.done" : "response.output_text.done",
          json_pack("{s:s,s:i,s:i,s:O}", "item_id", iid, "output_index", k, "content_index", 0, "text",
                    json_object_get(part, "text")));
    event(ev, s, "response.content_part.done", json_pack("{s:s,s:i,s:i,s:o}", "item_id", iid, "output_index", k,
                                                         "content_index", 0, "part", json_deep_copy(part)));
    if (!rs) json_object_set_new(item, "status", json_string("completed"));
    event(ev, s, "response.output_item.done", json_pack("{s:i,s:o}", "output_index", k, "item", json_deep_copy(item)));
    s->open = 0;
}

/* the item of kind (1: reasoning, 2: the message) is the open one: another open ends and this one begins */
static void open_item(json_t *ev, struct srv_sent *s, int kind, const char *id) {
    if (s->open == kind) return;
    close_item(ev, s);
    int k = (int)json_array_size(s->items);
    char iid[96];
    item_id(iid, sizeof iid, kind == 1 ? "rs" : "msg", id, k);
    json_t *item = text_item(kind == 1 ? "rs" : "msg", iid, "", 0, "in_progress");
    json_t *part = json_array_get(json_object_get(item, "content"), 0);
    json_t *added = json_deep_copy(item); /* its parts come with their own events */
    json_object_set_new(added, "content", json_array());
    event(ev, s, "response.output_item.added", json_pack("{s:i,s:o}", "output_index", k, "item", added));
    event(ev, s, "response.content_part.added", json_pack("{s:s,s:i,s:i,s:o}", "item_id", iid, "output_index", k,
                                                          "content_index", 0, "part", json_deep_copy(part)));
    json_array_append_new(s->items, item);
    s->open = kind;
}

/* t[0..n) more of the open item's text */
/* obj's string at key, t[0..n) appended (the item the stream has sent so far) */
static void append_text(json_t *obj, const char *key, const char *t, size_t n) {
    json_t *old = json_object_get(obj, key);
    size_t on = json_string_length(old);
    char *joined = malloc(on + n + 1);
    if (!joined) return;
    memcpy(joined, json_string_value(old), on);
    memcpy(joined + on, t, n);
    json_object_set_new(obj, key, toy_srv_jstr(joined, on + n));
    free(joined);
}

static void text_delta(json_t *ev, struct srv_sent *s, int kind, const char *id, const char *t, size_t n) {
    if (!n) return;
    open_item(ev, s, kind, id);
    int k = (int)json_array_size(s->items) - 1;
    json_t *item = json_array_get(s->items, (size_t)k);
    append_text(json_array_get(json_object_get(item, "content"), 0), "text", t, n);
    json_t *d = json_pack("{s:s,s:i,s:i,s:o}", "item_id", json_string_value(json_object_get(item, "id")),
                          "output_index", k, "content_index", 0, "delta", toy_srv_jstr(t, n));
    if (kind == 2) json_object_set_new(d, "logprobs", json_array());
    event(ev, s, kind == 1 ? "response.reasoning_text.delta" : "response.output_text.delta", d);
}

/* a call's step: its item begins (in progress, no arguments yet), takes more of its arguments, ends */
static void call_step(json_t *ev, struct srv_sent *s, const struct srv_call_step *st, const char *id) {
    if (st->begin) {
        close_item(ev, s);
        int k = (int)json_array_size(s->items);
        char iid[96];
        item_id(iid, sizeof iid, "fc", id, k);
        json_t *item = call_item(st->c, iid, id, k, "in_progress", false);
        event(ev, s, "response.output_item.added", json_pack("{s:i,s:o}", "output_index", k, "item", json_deep_copy(item)));
        json_array_append_new(s->items, item);
        s->call_item = k;
    }
    int k = s->call_item;
    json_t *item = json_array_get(s->items, (size_t)k);
    const char *iid = json_string_value(json_object_get(item, "id"));
    if (st->n) {
        append_text(item, "arguments", st->delta, st->n);
        event(ev, s, "response.function_call_arguments.delta",
              json_pack("{s:s,s:i,s:o}", "item_id", iid, "output_index", k, "delta", toy_srv_jstr(st->delta, st->n)));
    }
    if (st->end) {
        event(ev, s, "response.function_call_arguments.done",
              json_pack("{s:s,s:i,s:O,s:O}", "item_id", iid, "output_index", k, "name", json_object_get(item, "name"),
                        "arguments", json_object_get(item, "arguments")));
        json_object_set_new(item, "status", json_string("completed"));
        event(ev, s, "response.output_item.done", json_pack("{s:i,s:o}", "output_index", k, "item", json_deep_copy(item)));
    }
}

json_t *toy_srv_responses_events(const struct srv_api *api, const struct srv_request *r, struct srv_job *j, bool final,
                                 struct srv_sent *s, const char *id, long created) {
    json_t *ev = json_array();
    struct toy_chat_reply p;
    if (!toy_srv_reply_split(r, j, final, &p)) return ev;
    struct srv_call_step *st = malloc((p.n_calls + 1) * sizeof *st);
    size_t ns = st ? toy_srv_call_steps(&p, s, final, st) : 0, i = 0;
    size_t nr = strlen(p.reasoning), nc = strlen(p.content);
    if (nr > s->reasoning) text_delta(ev, s, 1, id, p.reasoning + s->reasoning, nr - s->reasoning), s->reasoning = nr;
    if (ns && !st[0].begin) call_step(ev, s, &st[i++], id); /* the call open before: its text came first */
    if (nc > s->content) text_delta(ev, s, 2, id, p.content + s->content, nc - s->content), s->content = nc;
    for (; i < ns; i++) call_step(ev, s, &st[i], id);
    free(st);
    j->n_calls = s->calls;
    toy_chat_reply_free(&p);
    if (final) {
        if (!json_array_size(s->items)) open_item(ev, s, 2, id); /* an empty reply: still its message */
        close_item(ev, s);
        const char *stt = final_status(j);
        json_t *o = response_object(api, r, j, id, created, stt, json_deep_copy(s->items));
        keep(api, r, id, o, s->items);
        event(ev, s, strcmp(stt, "completed") ? "response.incomplete" : "response.completed",
              json_pack("{s:o}", "response", o));
    }
    return ev;
}

json_t *toy_srv_responses_failed(const struct srv_api *api, const struct srv_request *r, struct srv_sent *s,
                                 const char *id, long created, const char *msg) {
    json_t *ev = json_array();
    json_t *o = response_object(api, r, NULL, id, created, "failed", s->items ? json_incref(s->items) : json_array());
    json_object_set_new(o, "error", json_pack("{s:s,s:s}", "code", "server_error", "message", msg));
    event(ev, s, "response.failed", json_pack("{s:o}", "response", o));
    return ev;
}
