/* trace.c: Chrome Trace Event Format writer (the "X" complete events of
 * https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU).
 * Threads append to a preallocated array through an atomic index; the JSON
 * is produced once, at close. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "toy/file.h"
#include "toy/trace.h"

struct ev {
    const char *name, *cat;
    char copy[48];
    double ts, dur;
    int tid;
};

struct toy_trace {
    char *path;
    struct ev *ev;
    int64_t cap;
    atomic_llong n;
    atomic_llong dropped;
    struct timespec t0;
};

enum toy_status toy_trace_open(const char *path, int64_t cap, struct toy_trace **out) {
    if (!out) return toy_error(TOY_ERR_INVALID_ARG, "toy_trace_open: out is NULL");
    *out = NULL;
    if (!path) return toy_error(TOY_ERR_INVALID_ARG, "toy_trace_open: NULL path");
    if (cap <= 0) cap = 1 << 20;
    struct toy_trace *tr = calloc(1, sizeof *tr);
    if (!tr) return toy_error(TOY_ERR_NOMEM, "trace");
    tr->path = strdup(path);
    tr->ev = malloc((size_t)cap * sizeof *tr->ev);
    if (!tr->path || !tr->ev) {
        free(tr->path);
        free(tr->ev);
        free(tr);
        return toy_error(TOY_ERR_NOMEM, "trace of %lld events", (long long)cap);
    }
    /* fail now, not after a long run, where the file could not be written
     * (a folder, a device, no such folder, no right to write there): the
     * temp file of the real write is made and removed, and a trace already
     * at the path stays whole until the new one replaces it */
    struct toy_file_replace r;
    if (toy_file_replace_begin(path, &r)) {
        enum toy_status st = toy_error(TOY_ERR_IO, "trace: %s", toy_last_error());
        free(tr->path);
        free(tr->ev);
        free(tr);
        return st;
    }
    toy_file_replace_abort(&r);
    tr->cap = cap;
    atomic_init(&tr->n, 0);
    atomic_init(&tr->dropped, 0);
    clock_gettime(CLOCK_MONOTONIC, &tr->t0);
    *out = tr;
    return TOY_OK;
}

double toy_trace_now(const struct toy_trace *tr) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)(ts.tv_sec - tr->t0.tv_sec) * 1e6 + (double)(ts.tv_nsec - tr->t0.tv_nsec) * 1e-3;
}

static struct ev *slot(struct toy_trace *tr) {
    long long i = atomic_fetch_add_explicit(&tr->n, 1, memory_order_relaxed);
    if (i >= tr->cap) {
        atomic_fetch_add_explicit(&tr->dropped, 1, memory_order_relaxed);
        return NULL;
    }
    return &tr->ev[i];
}

void toy_trace_span(struct toy_trace *tr, const char *name, const char *cat, double ts, double end, int tid) {
    struct ev *e = slot(tr);
    if (!e) return;
    *e = (struct ev){name, cat, "", ts, end - ts, tid};
}

void toy_trace_span_copy(struct toy_trace *tr, const char *name, const char *cat, double ts, double end, int tid) {
    struct ev *e = slot(tr);
    if (!e) return;
    *e = (struct ev){NULL, cat, "", ts, end - ts, tid};
    snprintf(e->copy, sizeof e->copy, "%s", name);
}

int64_t toy_trace_dropped(const struct toy_trace *tr) { return atomic_load(&tr->dropped); }

static void json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

enum toy_status toy_trace_close(struct toy_trace *tr) {
    if (!tr) return TOY_OK;
    struct toy_file_replace r;
    enum toy_status st = toy_file_replace_begin(tr->path, &r);
    if (st) {
        st = toy_error(st, "trace: %s", toy_last_error());
    } else {
        FILE *f = r.f;
        long long n = atomic_load(&tr->n);
        if (n > tr->cap) n = tr->cap;
        fprintf(f, "{\"traceEvents\":[\n");
        for (long long i = 0; i < n; i++) {
            const struct ev *e = &tr->ev[i];
            fprintf(f, "{\"name\":");
            json_str(f, e->name ? e->name : e->copy);
            fprintf(f, ",\"cat\":");
            json_str(f, e->cat);
            fprintf(f, ",\"ph\":\"X\",\"ts\":%.3f,\"dur\":%.3f,\"pid\":1,\"tid\":%d}%s\n", e->ts, e->dur, e->tid,
                    i + 1 < n ? "," : "");
        }
        fprintf(f, "],\"displayTimeUnit\":\"ms\",\"otherData\":{\"producer\":\"toy\",\"dropped_events\":%lld}}\n",
                (long long)atomic_load(&tr->dropped));
        if ((st = toy_file_replace_end(&r, true))) st = toy_error(st, "trace: %s", toy_last_error());
    }
    free(tr->path);
    free(tr->ev);
    free(tr);
    return st;
}
