/* events.c: the toy/v1 event stream (JSON Lines) writer and reader, and the
 * provenance run_start records (host, git). Schema: docs/events.md, after
 * ../shared/reference/toy-features.md §3; contract: include/toy/events.h.
 *
 * Invariants: an event is encoded whole (jansson) into one buffer ending in
 * '\n' and handed to one write() on an O_APPEND descriptor, under the
 * handle's mutex, so lines never interleave or split between events and `t`
 * is non-decreasing in file order. The handle is a small state machine
 * (before run_start -> running -> ended) so the stream's ordering rules are
 * enforced by the producer rather than hoped for. Numbers: non-finite ->
 * null; reals snapped so floats print in their shortest form (see snap()). */
#include "toy/device.h"
#include "toy/events.h"
#include "toy/tokenizer.h"
#include "toy/run-dir.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

enum { ST_FRESH, ST_RUNNING, ST_ENDED };

struct toy_events {
    int fd;
    char *path;
    double t0;      /* CLOCK_MONOTONIC seconds at open */
    double last_t;  /* t of the last event written */
    int state;
    bool warned;    /* a failed write was reported on stderr (once a stream) */
    bool no_space;  /* the last write failed with ENOSPC, EDQUOT or EFBIG */
    pthread_mutex_t mu;
};

static double mono_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- open / close ------------------------------------------------------------ */

/* The t of the last event in the file (0 if none): the last line, among
 * those in the final 64 KiB, that parses as an object with a number t. */
static double last_t_in(int fd) {
    struct stat sb;
    if (fstat(fd, &sb) != 0 || sb.st_size <= 0) return 0;
    size_t n = sb.st_size < 65536 ? (size_t)sb.st_size : 65536;
    char *buf = malloc(n);
    double t = 0;
    ssize_t got = buf ? pread(fd, buf, n, sb.st_size - (off_t)n) : -1;
    for (ssize_t end = got; end > 0;) {
        while (end > 0 && buf[end - 1] == '\n') end--;
        ssize_t start = end;
        while (start > 0 && buf[start - 1] != '\n') start--;
        if (start == 0 && got == (ssize_t)n && (off_t)n < sb.st_size) break; /* a line cut by the window */
        json_t *o = json_loadb(buf + start, (size_t)(end - start), 0, NULL);
        json_t *jt = json_object_get(o, "t");
        bool ok = json_is_object(o) && json_is_string(json_object_get(o, "kind")) && json_is_number(jt) &&
                  isfinite(json_number_value(jt)) && json_number_value(jt) >= 0;
        if (ok) t = json_number_value(jt);
        json_decref(o);
        if (ok) break;
        end = start;
    }
    free(buf);
    return t;
}

enum toy_status toy_events_open(const char *path, enum toy_events_mode mode, struct toy_events **out) {
    if (!out) return toy_error(TOY_ERR_INVALID_ARG, "toy_events_open: out is NULL");
    *out = NULL;
    if (!path || !*path) return toy_error(TOY_ERR_INVALID_ARG, "events: no path");
    char *dir = strdup(path);
    if (!dir) return toy_error(TOY_ERR_NOMEM, "events: out of memory");
    char *slash = strrchr(dir, '/');
    enum toy_status st = TOY_OK;
    if (slash && slash != dir) {
        *slash = 0;
        st = toy_mkdir_p(dir);
    }
    free(dir);
    if (st) return st;
    int flags = O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC | (mode == TOY_EVENTS_APPEND ? 0 : O_TRUNC);
    int fd = open(path, flags, 0644);
    if (fd < 0) return toy_error(TOY_ERR_IO, "%s: %s", path, strerror(errno));
    if (mode == TOY_EVENTS_APPEND) {
        /* A torn tail (crash mid-line) gets its newline now, so that it stays
         * one skippable line instead of swallowing our first event. */
        struct stat sb;
        char last = '\n';
        if (fstat(fd, &sb) == 0 && sb.st_size > 0 && pread(fd, &last, 1, sb.st_size - 1) == 1 && last != '\n' &&
            write(fd, "\n", 1) != 1) {
            st = toy_error(TOY_ERR_IO, "%s: %s", path, strerror(errno));
            close(fd);
            return st;
        }
    }
    struct toy_events *ev = calloc(1, sizeof *ev);
    if (!ev || !(ev->path = strdup(path))) {
        free(ev);
        close(fd);
        return toy_error(TOY_ERR_NOMEM, "events: out of memory");
    }
    ev->fd = fd;
    /* an appended segment's clock continues from the file's last t, so that
     * t never decreases down the file (the time between segments is not counted) */
    ev->last_t = mode == TOY_EVENTS_APPEND ? last_t_in(fd) : 0;
    ev->t0 = mono_seconds() - ev->last_t;
    ev->state = ST_FRESH;
    pthread_mutex_init(&ev->mu, NULL);
    *out = ev;
    return TOY_OK;
}

void toy_events_close(struct toy_events *ev) {
    if (!ev) return;
    fdatasync(ev->fd);
    close(ev->fd);
    pthread_mutex_destroy(&ev->mu);
    free(ev->path);
    free(ev);
}

double toy_events_now(const struct toy_events *ev) { return mono_seconds() - ev->t0; }

const char *toy_events_path(const struct toy_events *ev) { return ev->path; }

/* ---- encoding ------------------------------------------------------------------ */

static json_t *num_or_null(double v) { return isfinite(v) ? json_real(v) : json_null(); }

/* Reals that are exactly a float (everything a float32 trainer reports) get
 * the shortest decimal that reads back as that float, so that the line says
 * 0.0003 rather than 0.000300000014249235; the dump then prints at most 15
 * significant digits, which shows such decimals exactly. */
static void snap(json_t *j) {
    if (json_is_real(j)) {
        double v = json_real_value(j);
        float f = (float)v;
        if (v == 0 || !isfinite(f) || (double)f != v) return;
        char buf[40];
        for (int p = 1; p <= 9; p++) {
            snprintf(buf, sizeof buf, "%.*g", p, (double)f);
            if ((float)strtod(buf, NULL) == f) {
                json_real_set(j, strtod(buf, NULL));
                return;
            }
        }
    } else if (json_is_object(j)) {
        const char *k;
        json_t *v;
        json_object_foreach(j, k, v) snap(v);
    } else if (json_is_array(j)) {
        size_t i;
        json_t *v;
        json_array_foreach(j, i, v) snap(v);
    }
}

/* A JSON string of C text, invalid UTF-8 bytes replaced by U+FFFD; NULL -> null. */
static json_t *text(const char *s) {
    if (!s) return json_null();
    size_t n = strlen(s);
    json_t *j = json_stringn(s, n);
    if (j) return j;
    char *clean = toy_utf8_clean(s, n, &n);
    if (!clean) return NULL;
    j = json_stringn(clean, n);
    free(clean);
    return j;
}

/* Sets key to v (stolen); a NULL v (jansson out of memory) marks failure. */
static void put(json_t *o, const char *key, json_t *v, bool *ok) {
    if (!v || json_object_set_new(o, key, v)) *ok = false;
}

/* Copies the keys of extra (deep) into o, never overwriting kind and t. */
static void merge(json_t *o, json_t *extra, bool *ok) {
    if (!extra) return;
    const char *k;
    json_t *v;
    json_object_foreach(extra, k, v) {
        if (!strcmp(k, "kind") || !strcmp(k, "t")) continue;
        put(o, k, json_deep_copy(v), ok);
    }
}

/* A new event object whose first keys are kind and t (t filled in at write). */
static json_t *event_new(const char *kind, bool *ok) {
    json_t *o = json_object();
    if (!o) return *ok = false, NULL;
    put(o, "kind", json_string(kind), ok);
    put(o, "t", json_real(0), ok);
    return o;
}

enum { MODE_ANY, MODE_START, MODE_END };

/* Stamps t, encodes and writes o (consumed) as one line. */
static enum toy_status write_event(struct toy_events *ev, json_t *o, bool ok, int mode) {
    if (!ev) {
        json_decref(o);
        return toy_error(TOY_ERR_INVALID_ARG, "events: NULL stream");
    }
    if (!ok || !o) {
        json_decref(o);
        return toy_error(TOY_ERR_NOMEM, "%s: out of memory building an event", ev->path);
    }
    const char *kind = json_string_value(json_object_get(o, "kind"));
    char stack[4096], *heap = NULL, *buf = stack;
    enum toy_status st = TOY_OK;
    pthread_mutex_lock(&ev->mu);
    if (mode == MODE_START ? ev->state != ST_FRESH : ev->state != ST_RUNNING) {
        st = toy_error(TOY_ERR_STATE, "%s: %s event %s", ev->path, kind,
                       ev->state == ST_FRESH ? "before run_start" : ev->state == ST_ENDED ? "after run_end"
                                                                                          : "after run_start");
        goto out;
    }
    double t = floor(toy_events_now(ev) * 1e6 + 0.5) * 1e-6;
    if (t < ev->last_t) t = ev->last_t;
    json_real_set(json_object_get(o, "t"), t);
    snap(o);
    const size_t flags = JSON_COMPACT | JSON_REAL_PRECISION(15);
    size_t n = json_dumpb(o, stack, sizeof stack - 1, flags);
    if (n == 0) {
        st = toy_error(TOY_ERR_INVALID_ARG, "%s: %s event cannot be encoded", ev->path, kind);
        goto out;
    }
    if (n > sizeof stack - 1) {
        if (!(heap = malloc(n + 1))) {
            st = toy_error(TOY_ERR_NOMEM, "%s: out of memory (%zu-byte event)", ev->path, n);
            goto out;
        }
        buf = heap;
        json_dumpb(o, buf, n, flags);
    }
    buf[n++] = '\n';
    off_t before = lseek(ev->fd, 0, SEEK_END); /* where the line starts (O_APPEND: the end) */
    for (size_t off = 0; off < n;) {
        ssize_t w = write(ev->fd, buf + off, n - off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            ev->no_space = w < 0 && (errno == ENOSPC || errno == EDQUOT || errno == EFBIG);
            const char *why = w < 0 ? strerror(errno) : "write returned 0";
            st = toy_error(TOY_ERR_IO, "%s: %s", ev->path, why);
            /* a full disk takes part of a line: cut it off, so the file ends on a whole event */
            if (off > 0 && before >= 0 && ftruncate(ev->fd, before) != 0) {}
            /* Out of space, the trainers stop and say why (toy_events_out_of_space).
             * Otherwise the producers go on without their events, so say it once
             * here rather than fail silently. */
            if (!ev->warned && !ev->no_space) {
                ev->warned = true;
                fprintf(stderr, "toy: warning: cannot write events to %s (%s); going on without them, later "
                        "failures are not reported\n", ev->path, why);
            }
            goto out;
        }
        off += (size_t)w;
    }
    ev->last_t = t;
    ev->no_space = false;
    if (mode == MODE_START) ev->state = ST_RUNNING;
    if (mode == MODE_END) {
        ev->state = ST_ENDED;
        fdatasync(ev->fd);
    }
out:
    pthread_mutex_unlock(&ev->mu);
    free(heap);
    json_decref(o);
    return st;
}

bool toy_events_out_of_space(const struct toy_events *ev) {
    if (!ev) return false;
    pthread_mutex_lock((pthread_mutex_t *)&ev->mu);
    bool r = ev->no_space;
    pthread_mutex_unlock((pthread_mutex_t *)&ev->mu);
    return r;
}

/* ---- provenance ------------------------------------------------------------------ */

char *toy_iso8601_now(char *buf, size_t n) {
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    if (!strftime(buf, n, "%Y-%m-%dT%H:%M:%SZ", &tm) && n) buf[0] = 0;
    return buf;
}

/* First line of a small file, trailing whitespace stripped; false if unreadable. */
static bool read_line(const char *path, char *out, size_t n) {
    FILE *f = fopen(path, "r");
    if (!f) return false;
    bool ok = fgets(out, (int)n, f) != NULL;
    fclose(f);
    if (!ok) return false;
    size_t len = strlen(out);
    while (len && (out[len - 1] == '\n' || out[len - 1] == '\r' || out[len - 1] == ' ')) out[--len] = 0;
    return true;
}

static bool is_sha(const char *s) {
    size_t n = strspn(s, "0123456789abcdef");
    return (n == 40 || n == 64) && (s[n] == 0 || s[n] == ' ' || s[n] == '\t');
}

/* snprintf that says whether everything fit (paths too long just fail). */
__attribute__((format(printf, 3, 4))) static bool fmt(char *out, size_t n, const char *f, ...) {
    va_list ap;
    va_start(ap, f);
    int k = vsnprintf(out, n, f, ap);
    va_end(ap);
    return k >= 0 && (size_t)k < n;
}

/* Joins a path that may be relative to base into out. */
static bool join(char *out, size_t n, const char *base, const char *p) {
    return p[0] == '/' ? fmt(out, n, "%s", p) : fmt(out, n, "%s/%s", base, p);
}

enum toy_status toy_git_info(const char *dir, struct toy_git_info *out) {
    if (!out) return toy_error(TOY_ERR_INVALID_ARG, "toy_git_info: out is NULL");
    memset(out, 0, sizeof *out);
    char cur[PATH_MAX], gitdir[PATH_MAX], common[PATH_MAX], p[PATH_MAX + 64], line[PATH_MAX];
    if (!realpath(dir ? dir : ".", cur)) return toy_error(TOY_ERR_NOT_FOUND, "%s: %s", dir ? dir : ".", strerror(errno));
    for (;;) {
        struct stat sb;
        fmt(p, sizeof p, "%s/.git", strcmp(cur, "/") ? cur : "");
        if (stat(p, &sb) == 0) {
            if (S_ISDIR(sb.st_mode)) {
                fmt(gitdir, sizeof gitdir, "%s", p);
                break;
            }
            /* a worktree or submodule: "gitdir: <path>" */
            if (read_line(p, line, sizeof line) && !strncmp(line, "gitdir: ", 8)) {
                if (join(gitdir, sizeof gitdir, cur, line + 8)) break;
            }
        }
        char *slash = strrchr(cur, '/');
        if (!slash || !strcmp(cur, "/")) return toy_error(TOY_ERR_NOT_FOUND, "%s: not inside a git repository", dir ? dir : ".");
        if (slash == cur) slash[1] = 0;
        else *slash = 0;
    }
    fmt(p, sizeof p, "%s/commondir", gitdir);
    if (read_line(p, line, sizeof line)) join(common, sizeof common, gitdir, line);
    else fmt(common, sizeof common, "%s", gitdir);
    fmt(p, sizeof p, "%s/HEAD", gitdir);
    char head[512];
    if (!read_line(p, head, sizeof head)) return toy_error(TOY_ERR_FORMAT, "%s: unreadable", p);
    if (is_sha(head)) {
        memcpy(out->sha, head, strspn(head, "0123456789abcdef"));
        return TOY_OK; /* detached */
    }
    if (strncmp(head, "ref: refs/", 10) || strstr(head, ".."))
        return toy_error(TOY_ERR_FORMAT, "%s/HEAD: neither a commit nor a ref: '%s'", gitdir, head);
    const char *ref = head + 5;
    fmt(out->branch, sizeof out->branch, "%s", strncmp(ref, "refs/heads/", 11) ? ref : ref + 11);
    char sha[128];
    fmt(p, sizeof p, "%s/%s", common, ref);
    bool found = read_line(p, sha, sizeof sha) && is_sha(sha);
    if (!found) {
        fmt(p, sizeof p, "%s/%s", gitdir, ref);
        found = read_line(p, sha, sizeof sha) && is_sha(sha);
    }
    if (!found) {
        fmt(p, sizeof p, "%s/packed-refs", common);
        FILE *f = fopen(p, "r");
        char *l = NULL;
        size_t cap = 0;
        ssize_t len;
        while (f && !found && (len = getline(&l, &cap, f)) > 0) {
            while (len && (l[len - 1] == '\n' || l[len - 1] == '\r')) l[--len] = 0;
            char *sp = strchr(l, ' ');
            if (l[0] == '#' || l[0] == '^' || !sp || !is_sha(l) || strcmp(sp + 1, ref)) continue;
            *sp = 0;
            fmt(sha, sizeof sha, "%s", l);
            found = true;
        }
        free(l);
        if (f) fclose(f);
    }
    if (!found) {
        out->branch[0] = 0;
        return toy_error(TOY_ERR_NOT_FOUND, "%s: branch %s has no commit", gitdir, ref);
    }
    memcpy(out->sha, sha, strspn(sha, "0123456789abcdef"));
    return TOY_OK;
}

static json_t *host_object(void) {
    char name[256] = "unknown", os[65] = "unknown", arch[65] = "unknown";
    if (gethostname(name, sizeof name - 1) != 0) snprintf(name, sizeof name, "unknown");
    name[sizeof name - 1] = 0;
    struct utsname u;
    if (uname(&u) == 0) {
        snprintf(os, sizeof os, "%s", u.sysname);
        for (char *c = os; *c; c++)
            if (*c >= 'A' && *c <= 'Z') *c = (char)(*c - 'A' + 'a');
        snprintf(arch, sizeof arch, "%s", u.machine);
    }
    return json_pack("{s:o, s:o, s:o}", "name", text(name), "os", text(os), "arch", text(arch));
}

/* ---- the kinds ------------------------------------------------------------------- */

enum toy_status toy_events_run_start(struct toy_events *ev, const struct toy_run_start *rs) {
    if (!rs) return toy_error(TOY_ERR_INVALID_ARG, "toy_events_run_start: NULL event");
    if ((rs->model && !json_is_object(rs->model)) || (rs->config && !json_is_object(rs->config)) ||
        (rs->extra && !json_is_object(rs->extra)))
        return toy_error(TOY_ERR_INVALID_ARG, "run_start: model, config and extra must be JSON objects");
    bool ok = true;
    json_t *o = event_new("run_start", &ok);
    char when[32];
    put(o, "schema", json_string(TOY_EVENTS_SCHEMA), &ok);
    put(o, "started_at", json_string(toy_iso8601_now(when, sizeof when)), &ok);
    put(o, "run_id", text(rs->run_id ? rs->run_id : "anonymous"), &ok);
    put(o, "phase", text(rs->phase ? rs->phase : "train"), &ok);
    put(o, "host", host_object(), &ok);
    /* the device: "cpu", or "cuda[:N]" (kind "cuda", and which device) */
    const char *dev = rs->backend ? rs->backend : toy_device_default();
    bool cuda = !strncmp(dev, "cuda", 4);
    json_t *be = json_pack("{s:s}", "kind", cuda ? "cuda" : "cpu");
    if (be && cuda) json_object_set_new(be, "device", text(dev));
    if (be && !cuda) { /* what CPU speeds depend on (toy devices says the same) */
        json_object_set_new(be, "blas_core", text(toy_blas_core()));
        json_object_set_new(be, "bf16_gemm", text(toy_cpu_bf16_gemm()));
    }
    put(o, "backend", be, &ok);
    struct toy_git_info g;
    if (!rs->no_git && toy_git_info(rs->git_dir, &g) == TOY_OK)
        put(o, "git", json_pack("{s:s, s:o}", "sha", g.sha, "branch", g.branch[0] ? text(g.branch) : json_null()),
            &ok);
    if (rs->model) put(o, "model", json_deep_copy(rs->model), &ok);
    put(o, "config", rs->config ? json_deep_copy(rs->config) : json_object(), &ok);
    merge(o, rs->extra, &ok);
    return write_event(ev, o, ok, MODE_START);
}

enum toy_status toy_events_step(struct toy_events *ev, const struct toy_step_event *s) {
    if (!s) return toy_error(TOY_ERR_INVALID_ARG, "toy_events_step: NULL event");
    if (s->extra && !json_is_object(s->extra)) return toy_error(TOY_ERR_INVALID_ARG, "step: extra must be an object");
    bool ok = true;
    json_t *o = event_new("step", &ok);
    put(o, "phase", text(s->phase ? s->phase : "train"), &ok);
    put(o, "step", json_integer(s->step), &ok);
    put(o, "loss", num_or_null(s->loss), &ok);
    put(o, "lr", num_or_null(s->lr), &ok);
    put(o, "tokens", json_integer(s->tokens), &ok);
    put(o, "wall_us", json_integer(s->wall_us), &ok);
    put(o, "grad_norm", num_or_null(s->grad_norm), &ok);
    merge(o, s->extra, &ok);
    enum toy_status st = write_event(ev, o, ok, MODE_ANY);
    if (st && toy_events_out_of_space(ev)) /* what the trainers, which stop on it, report */
        return toy_error(st, "%s: stopping at step %lld, since checkpoints need space too: free some, then --resume",
                         toy_last_error(), (long long)s->step);
    return st;
}

enum toy_status toy_events_eval(struct toy_events *ev, const struct toy_eval_event *e) {
    if (!e) return toy_error(TOY_ERR_INVALID_ARG, "toy_events_eval: NULL event");
    if (e->extra && !json_is_object(e->extra)) return toy_error(TOY_ERR_INVALID_ARG, "eval: extra must be an object");
    bool ok = true;
    json_t *o = event_new("eval", &ok);
    put(o, "phase", json_string("eval"), &ok);
    put(o, "step", json_integer(e->step), &ok);
    put(o, "name", text(e->name ? e->name : "validation"), &ok);
    put(o, "loss", num_or_null(e->loss), &ok);
    /* at the loss's own precision: a float's digits, not exp()'s 17 */
    double ppl = isfinite(e->loss) ? exp(e->loss) : NAN;
    put(o, "ppl", num_or_null((double)(float)e->loss == e->loss && ppl < 3e38 ? (double)(float)ppl : ppl), &ok);
    put(o, "samples", json_integer(e->samples), &ok);
    if (e->tokens > 0) put(o, "tokens", json_integer(e->tokens), &ok);
    if (e->extra) put(o, "extra", json_deep_copy(e->extra), &ok);
    return write_event(ev, o, ok, MODE_ANY);
}

enum toy_status toy_events_sample(struct toy_events *ev, int64_t step, const char *prompt, const char *txt) {
    bool ok = true;
    json_t *o = event_new("sample", &ok);
    put(o, "phase", json_string("decode"), &ok);
    put(o, "step", json_integer(step), &ok);
    put(o, "prompt", text(prompt ? prompt : ""), &ok);
    put(o, "text", text(txt ? txt : ""), &ok);
    return write_event(ev, o, ok, MODE_ANY);
}

enum toy_status toy_events_note(struct toy_events *ev, int64_t step, const char *txt) {
    bool ok = true;
    json_t *o = event_new("note", &ok);
    put(o, "step", json_integer(step), &ok);
    put(o, "text", text(txt ? txt : ""), &ok);
    return write_event(ev, o, ok, MODE_ANY);
}

enum toy_status toy_events_op_timing(struct toy_events *ev, int64_t step, int64_t compute_us, json_t *buckets) {
    if (buckets && !json_is_object(buckets)) return toy_error(TOY_ERR_INVALID_ARG, "op_timing: buckets must be an object");
    bool ok = true;
    json_t *o = event_new("op_timing", &ok);
    put(o, "step", json_integer(step), &ok);
    put(o, "compute_us", json_integer(compute_us), &ok);
    put(o, "buckets", buckets ? json_deep_copy(buckets) : json_object(), &ok);
    return write_event(ev, o, ok, MODE_ANY);
}

enum toy_status toy_events_emit(struct toy_events *ev, const char *kind, json_t *fields) {
    if (!kind || !*kind || !strcmp(kind, "run_start") || !strcmp(kind, "run_end"))
        return toy_error(TOY_ERR_INVALID_ARG, "events: emit of kind '%s' (run_start/run_end have their own functions)",
                         kind ? kind : "(null)");
    if (fields && !json_is_object(fields)) return toy_error(TOY_ERR_INVALID_ARG, "%s: fields must be an object", kind);
    bool ok = true;
    json_t *o = event_new(kind, &ok);
    merge(o, fields, &ok);
    return write_event(ev, o, ok, MODE_ANY);
}

const char *toy_run_reason_str(enum toy_run_reason r) {
    switch (r) {
    case TOY_RUN_COMPLETED: return "completed";
    case TOY_RUN_INTERRUPTED: return "interrupted";
    case TOY_RUN_ABORTED: return "aborted";
    case TOY_RUN_ERRORED: return "errored";
    }
    return "errored";
}

int toy_run_reason_exit_code(enum toy_run_reason r) {
    return r == TOY_RUN_COMPLETED ? 0 : r == TOY_RUN_INTERRUPTED ? 130 : 1;
}

enum toy_status toy_events_run_end(struct toy_events *ev, const struct toy_run_end *e) {
    if (!e) return toy_error(TOY_ERR_INVALID_ARG, "toy_events_run_end: NULL event");
    if (e->extra && !json_is_object(e->extra)) return toy_error(TOY_ERR_INVALID_ARG, "run_end: extra must be an object");
    bool ok = true;
    json_t *o = event_new("run_end", &ok);
    char when[32];
    put(o, "ended_at", json_string(toy_iso8601_now(when, sizeof when)), &ok);
    put(o, "reason", json_string(toy_run_reason_str(e->reason)), &ok);
    put(o, "error", text(e->error), &ok);
    put(o, "final_step", json_integer(e->final_step), &ok);
    put(o, "final_loss", num_or_null(e->final_loss), &ok);
    put(o, "exit_code", json_integer(e->exit_code), &ok);
    merge(o, e->extra, &ok);
    return write_event(ev, o, ok, MODE_END);
}

/* ---- reading ------------------------------------------------------------------------ */

static const char *const known_kinds[] = {
    "run_start", "step", "eval", "sample", "note", "op_timing", "run_end", "tap", "grad",
    "drift", "compare", "region_enter", "region_exit", "align", "mask",
};

bool toy_events_kind_known(const char *kind) {
    if (!kind) return false;
    for (size_t i = 0; i < sizeof known_kinds / sizeof known_kinds[0]; i++)
        if (!strcmp(kind, known_kinds[i])) return true;
    return false;
}

enum toy_status toy_events_read(const char *path, toy_events_fn fn, void *user, struct toy_events_stats *stats) {
    struct toy_events_stats s = {0};
    if (stats) *stats = s;
    if (!path || !fn) return toy_error(TOY_ERR_INVALID_ARG, "toy_events_read: NULL %s", path ? "callback" : "path");
    FILE *f = fopen(path, "r");
    if (!f) return toy_error(TOY_ERR_IO, "%s: %s", path, strerror(errno));
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    enum toy_status st = TOY_OK;
    while ((len = getline(&line, &cap, f)) > 0) {
        while (len && (line[len - 1] == '\n' || line[len - 1] == '\r' || line[len - 1] == ' ')) len--;
        if (len == 0) continue;
        s.lines++;
        json_t *o = json_loadb(line, (size_t)len, 0, NULL);
        json_t *kind = json_object_get(o, "kind");
        if (!json_is_object(o) || !json_is_string(kind) || !json_is_number(json_object_get(o, "t"))) {
            s.torn++;
        } else if (!toy_events_kind_known(json_string_value(kind))) {
            s.unknown++;
        } else {
            s.events++;
            if (fn && fn(json_string_value(kind), o, user)) {
                json_decref(o);
                break;
            }
        }
        json_decref(o);
    }
    if (ferror(f)) st = toy_error(TOY_ERR_IO, "%s: read error", path);
    free(line);
    fclose(f);
    if (stats) *stats = s;
    return st;
}
