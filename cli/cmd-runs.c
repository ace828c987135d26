/* cmd-runs.c: `toy runs`: lists the runs in ./runs (or --dir) with their
 * model, steps, final and eval loss, wall time and how they ended, read back
 * from each runs/<id>/events.jsonl through toy_events_read (torn lines and
 * unknown kinds skipped, as docs/events.md asks of every consumer). A run
 * resumed into the same stream has several run_start ... run_end segments:
 * the start is the first one's, the wall time the last t (a resumed
 * segment's t continues; in older streams it restarts and the segments'
 * times are summed), the rest the last segment's. Sorted by start time. Uses only include/. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "json-out.h"
#include "toy/events.h"
#include "toy/run-dir.h"
#include "toy/tokenizer.h"

struct run {
    char *id;          /* the folder name */
    char *run_id;      /* run_start.run_id */
    char *arch, *name; /* run_start.model */
    char *started_at;
    char *reason;      /* run_end.reason; NULL: no run_end (still running, or died) */
    bool running;      /* a process holds the run's lock (toy_run_claim) */
    int64_t steps;
    double loss, eval_loss; /* NAN: none */
    double wall_s;          /* earlier segments whose t started again at 0 */
    double seg_t;           /* last t seen since */
    int64_t exit_code;
    bool has_exit;
    int64_t torn;
};

static char *dup_str(json_t *j) {
    const char *s = json_string_value(j);
    return s ? strdup(s) : NULL;
}

static void set_str(char **dst, json_t *j) {
    free(*dst);
    *dst = dup_str(j);
}

static double num(json_t *j) { return json_is_number(j) ? json_number_value(j) : NAN; }

static int on_event(const char *kind, json_t *ev, void *user) {
    struct run *r = user;
    double t = num(json_object_get(ev, "t"));
    if (!strcmp(kind, "run_start")) {
        /* a resumed segment's t continues from the one before (so the last t is the run's time); in streams
         * written before that, each segment's t starts again at 0, and the segments' times add up */
        if (isfinite(t) && t < r->seg_t) {
            r->wall_s += r->seg_t;
            r->seg_t = 0;
        }
        if (!r->started_at) r->started_at = dup_str(json_object_get(ev, "started_at"));
        set_str(&r->run_id, json_object_get(ev, "run_id"));
        json_t *m = json_object_get(ev, "model");
        set_str(&r->arch, json_object_get(m, "arch"));
        set_str(&r->name, json_object_get(m, "name"));
        free(r->reason);
        r->reason = NULL;
        r->has_exit = false;
    } else if (!strcmp(kind, "step")) {
        const char *ph = json_string_value(json_object_get(ev, "phase"));
        if (!ph || !strcmp(ph, "train")) {
            json_t *s = json_object_get(ev, "step");
            if (json_is_integer(s) && json_integer_value(s) > r->steps) r->steps = json_integer_value(s);
            r->loss = num(json_object_get(ev, "loss"));
        }
    } else if (!strcmp(kind, "eval")) {
        r->eval_loss = num(json_object_get(ev, "loss"));
    } else if (!strcmp(kind, "run_end")) {
        set_str(&r->reason, json_object_get(ev, "reason"));
        json_t *s = json_object_get(ev, "final_step");
        if (json_is_integer(s)) r->steps = json_integer_value(s);
        json_t *l = json_object_get(ev, "final_loss");
        if (json_is_number(l) || json_is_null(l)) r->loss = num(l);
        json_t *e = json_object_get(ev, "exit_code");
        r->has_exit = json_is_integer(e);
        r->exit_code = json_integer_value(e);
    }
    if (isfinite(t) && t > r->seg_t) r->seg_t = t;
    return 0;
}

/* Whether a process holds runs/<id>/.lock (what toy_run_claim takes while it writes the run): a run with no
 * run_end is then still running, else it died. */
static bool run_is_locked(const char *root, const char *id) {
    char path[4096];
    if (snprintf(path, sizeof path, "%s/%s/" TOY_RUN_LOCK_FILE, root, id) >= (int)sizeof path) return false;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    bool held = flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK;
    close(fd);
    return held;
}

/* a folder name as JSON can hold it (jansson takes UTF-8 only): invalid bytes as U+FFFD */
static json_t *json_name(const char *s) {
    size_t n;
    char *clean = toy_utf8_clean(s, strlen(s), &n);
    json_t *j = clean ? json_stringn(clean, n) : NULL;
    free(clean);
    return j ? j : json_null();
}

static int by_start(const void *a, const void *b) {
    const struct run *x = a, *y = b;
    if (!x->started_at != !y->started_at) return x->started_at ? -1 : 1;
    int c = x->started_at ? strcmp(x->started_at, y->started_at) : 0;
    return c ? c : strcmp(x->id, y->id);
}

static void fmt_time(char *buf, size_t n, double s) {
    if (!isfinite(s) || s < 0) snprintf(buf, n, "-");
    else if (s < 60) snprintf(buf, n, "%.1fs", s);
    else if (s < 3600) snprintf(buf, n, "%dm%02ds", (int)(s / 60), (int)fmod(s, 60));
    else snprintf(buf, n, "%dh%02dm", (int)(s / 3600), (int)fmod(s / 60, 60));
}

static void fmt_loss(char *buf, size_t n, double v) {
    if (isfinite(v)) snprintf(buf, n, "%.4f", v);
    else snprintf(buf, n, "-");
}

static void model_label(const struct run *r, char *buf, size_t n) {
    if (r->arch && r->name) snprintf(buf, n, "%s/%s", r->arch, r->name);
    else snprintf(buf, n, "%s", r->arch ? r->arch : r->name ? r->name : "-");
}

static json_t *num_or_null(double v) { return isfinite(v) ? json_real(v) : json_null(); }
static json_t *str_or_null(const char *s) { return s ? json_string(s) : json_null(); }

static int usage(FILE *f) {
    fprintf(f, "usage: toy runs [--dir DIR] [--json]\n"
               "Lists the runs in DIR (default ./runs): model, steps, final loss, eval loss,\n"
               "wall time and how each ended (running: a process still writes it; unfinished: it\n"
               "died), read from DIR/<id>/events.jsonl.\n"
               "  --dir DIR   the runs folder (default runs)\n"
               "  --json      one JSON object {format: \"toy/runs-v1\", dir, runs: [...]}\n");
    return f == stdout ? 0 : 2;
}

int toy_cmd_runs(int argc, char **argv) {
    const char *dir = NULL;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return usage(stdout);
        if (!strcmp(argv[i], "--json")) json = true;
        else if (!strcmp(argv[i], "--dir") && i + 1 < argc) dir = argv[++i];
        else {
            fprintf(stderr, "toy runs: unknown argument '%s'\n", argv[i]);
            return usage(stderr);
        }
    }
    const char *root = dir ? dir : "runs";
    DIR *d = opendir(root);
    if (!d && dir) {
        fprintf(stderr, "toy runs: %s: cannot open the runs folder\n", dir);
        return 2;
    }
    struct run *runs = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char path[4096];
        struct stat sb;
        if (snprintf(path, sizeof path, "%s/%s/events.jsonl", root, e->d_name) >= (int)sizeof path) continue;
        if (stat(path, &sb) || !S_ISREG(sb.st_mode)) continue;
        if (n == cap) {
            struct run *nr = realloc(runs, (cap = cap ? 2 * cap : 16) * sizeof *runs);
            if (!nr) break;
            runs = nr;
        }
        struct run *r = &runs[n];
        memset(r, 0, sizeof *r);
        r->loss = r->eval_loss = NAN;
        if (!(r->id = strdup(e->d_name))) break;
        struct toy_events_stats st;
        if (toy_events_read(path, on_event, r, &st)) {
            fprintf(stderr, "toy runs: %s\n", toy_last_error());
            free(r->id);
            continue;
        }
        r->wall_s += r->seg_t;
        r->torn = st.torn;
        r->running = !r->reason && run_is_locked(root, e->d_name);
        n++;
    }
    if (d) closedir(d);
    if (n > 1) qsort(runs, n, sizeof *runs, by_start);

    int rc = 0;
    if (json) {
        json_t *arr = json_array();
        for (size_t i = 0; i < n; i++) {
            struct run *r = &runs[i];
            json_array_append_new(
                arr, json_pack("{s:o, s:o, s:o, s:o, s:o, s:I, s:o, s:o, s:f, s:o, s:b, s:o, s:I}", "id", json_name(r->id), "run_id",
                               str_or_null(r->run_id), "arch", str_or_null(r->arch), "name", str_or_null(r->name),
                               "started_at", str_or_null(r->started_at), "steps", (json_int_t)r->steps, "final_loss",
                               num_or_null(r->loss), "eval_loss", num_or_null(r->eval_loss), "wall_s", r->wall_s,
                               "reason", str_or_null(r->reason), "running", r->running,
                               "exit_code", r->has_exit ? json_integer(r->exit_code) : json_null(), "torn_lines",
                               (json_int_t)r->torn));
        }
        json_t *out = json_pack("{s:s, s:s, s:o}", "format", "toy/runs-v1", "dir", root, "runs", arr);
        if (toy_cli_print_json("runs", out, JSON_INDENT(2) | JSON_REAL_PRECISION(10))) rc = 1;
    } else if (n == 0) {
        printf("no runs in %s\n", root);
    } else {
        int wid = 2, wmod = 5;
        char buf[512];
        for (size_t i = 0; i < n; i++) {
            int k = (int)strlen(runs[i].id);
            if (k > wid) wid = k;
            model_label(&runs[i], buf, sizeof buf);
            if ((k = (int)strlen(buf)) > wmod) wmod = k;
        }
        printf("%-*s  %-16s  %-*s  %8s  %8s  %8s  %8s  %s\n", wid, "ID", "STARTED (UTC)", wmod, "MODEL", "STEPS", "LOSS",
               "EVAL", "TIME", "END");
        for (size_t i = 0; i < n; i++) {
            struct run *r = &runs[i];
            char loss[32], ev[32], tm[32], start[17] = "-";
            if (r->started_at && strlen(r->started_at) >= 16) {
                memcpy(start, r->started_at, 16); /* 2026-11-29T16:42 */
                start[10] = ' ';
            }
            model_label(r, buf, sizeof buf);
            fmt_loss(loss, sizeof loss, r->loss);
            fmt_loss(ev, sizeof ev, r->eval_loss);
            fmt_time(tm, sizeof tm, r->wall_s);
            printf("%-*s  %-16s  %-*s  %8lld  %8s  %8s  %8s  %s\n", wid, r->id, start, wmod, buf, (long long)r->steps,
                   loss, ev, tm, r->reason ? r->reason : r->running ? "running" : "unfinished");
        }
    }
    for (size_t i = 0; i < n; i++) {
        struct run *r = &runs[i];
        free(r->id), free(r->run_id), free(r->arch), free(r->name), free(r->started_at), free(r->reason);
    }
    free(runs);
    return rc;
}
