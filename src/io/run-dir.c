/* run-dir.c: run directories: run ids from a template with a daily counter,
 * exclusive creation of runs/<id>, mkdir -p, and the atomic weights/latest
 * symlink. Contract: include/toy/run-dir.h; behaviour after the earlier
 * system (../shared/reference/toy-features.md §3.1).
 *
 * Invariants: two processes creating runs at once never get the same folder
 * (mkdir is the lock; a lost race moves to the next {seq}); `latest` is
 * always either the old or the new link (symlink to a temporary name, then
 * rename(2), which replaces atomically); a claimed run folder is written by
 * one process at a time (flock on its .lock, which the kernel drops when the
 * process ends, however it ends). */
#include "toy/run-dir.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

enum toy_status toy_mkdir_p(const char *dir) {
    if (!dir || !*dir) return toy_error(TOY_ERR_INVALID_ARG, "mkdir: empty path");
    char p[PATH_MAX];
    if (snprintf(p, sizeof p, "%s", dir) >= (int)sizeof p) return toy_error(TOY_ERR_RANGE, "%s: path too long", dir);
    for (char *c = p + 1;; c++) {
        if (*c == '/' || *c == 0) {
            char keep = *c;
            *c = 0;
            if (mkdir(p, 0755) != 0 && errno != EEXIST) return toy_error(TOY_ERR_IO, "mkdir %s: %s", p, strerror(errno));
            struct stat sb;
            if (stat(p, &sb) != 0 || !S_ISDIR(sb.st_mode)) return toy_error(TOY_ERR_IO, "%s: not a directory", p);
            *c = keep;
            if (!keep) break;
        }
    }
    return TOY_OK;
}

/* Largest number ending a name in runs_dir after `date`, or 0. */
static long max_seq(const char *runs_dir, const char *date) {
    DIR *d = runs_dir ? opendir(runs_dir) : NULL;
    if (!d) return 0;
    long best = 0;
    size_t dl = strlen(date);
    struct dirent *e;
    while ((e = readdir(d))) {
        const char *name = e->d_name, *at = NULL;
        if (name[0] == '.') continue;
        for (const char *s = strstr(name, date); s; s = strstr(s + 1, date)) at = s;
        if (!at) continue;
        size_t n = strlen(name), k = 0;
        while (k < n && isdigit((unsigned char)name[n - 1 - k])) k++;
        /* the digits must follow the date ("x-20260101-007"), not be it */
        if (k == 0 || k > 9 || name + n - k < at + dl) continue;
        long v = strtol(name + n - k, NULL, 10);
        if (v > best) best = v;
    }
    closedir(d);
    return best;
}

static enum toy_status check_id(const char *id) {
    if (!*id || id[0] == '.' || strchr(id, '/'))
        return toy_error(TOY_ERR_INVALID_ARG, "run id '%s': empty, starts with '.', or has '/'", id);
    return TOY_OK;
}

/* The id for a given seq (seq < 0: computed from the folder). */
static enum toy_status make_id(const char *runs_dir, const char *tmpl, const char *arch, time_t now, long seq,
                               char *out, size_t out_size) {
    const char *env = getenv("TOY_RUN_ID");
    if (env && *env) {
        if (snprintf(out, out_size, "%s", env) >= (int)out_size) return toy_error(TOY_ERR_RANGE, "TOY_RUN_ID too long");
        return check_id(out);
    }
    if (!tmpl) tmpl = TOY_RUN_ID_TEMPLATE;
    if (!arch || !*arch) arch = "run";
    if (!now) now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    char date[16], hms[16];
    strftime(date, sizeof date, "%Y%m%d", &tm);
    strftime(hms, sizeof hms, "%H%M%S", &tm);
    size_t o = 0;
    for (const char *p = tmpl; *p;) {
        char piece[64];
        const char *add;
        size_t adv = 1;
        if (*p == '{') {
            const char *close = strchr(p, '}');
            size_t len = close ? (size_t)(close - p + 1) : 0;
            if (len == 6 && !strncmp(p, "{arch}", 6)) add = arch;
            else if (len == 6 && !strncmp(p, "{date}", 6)) add = date;
            else if (len == 6 && !strncmp(p, "{time}", 6)) add = hms;
            else if (len == 5 && !strncmp(p, "{seq}", 5)) {
                snprintf(piece, sizeof piece, "%03ld", seq >= 0 ? seq : max_seq(runs_dir, date) + 1);
                add = piece;
            } else
                return toy_error(TOY_ERR_INVALID_ARG, "run id template '%s': unknown token at '%s' ({arch} {date} {time} {seq})",
                                 tmpl, p);
            adv = len;
        } else {
            piece[0] = *p, piece[1] = 0;
            add = piece;
        }
        size_t k = strlen(add);
        if (o + k >= out_size) return toy_error(TOY_ERR_RANGE, "run id from '%s' longer than %zu bytes", tmpl, out_size);
        memcpy(out + o, add, k);
        o += k;
        p += adv;
    }
    out[o] = 0;
    return check_id(out);
}

enum toy_status toy_run_id_make(const char *runs_dir, const char *tmpl, const char *arch, time_t now, char *out,
                                size_t out_size) {
    if (!out) return toy_error(TOY_ERR_INVALID_ARG, "toy_run_id_make: out is NULL");
    return make_id(runs_dir, tmpl, arch, now, -1, out, out_size);
}

enum toy_status toy_run_create(const char *runs_dir, const char *tmpl, const char *arch, char *id, size_t id_size,
                               char *dir, size_t dir_size) {
    if (!id || !dir) return toy_error(TOY_ERR_INVALID_ARG, "toy_run_create: %s is NULL", id ? "dir" : "id");
    if (!runs_dir || !*runs_dir) runs_dir = "runs";
    enum toy_status st = toy_mkdir_p(runs_dir);
    if (st) return st;
    const char *env = getenv("TOY_RUN_ID");
    bool fixed = env && *env;
    bool has_seq = strstr(tmpl ? tmpl : TOY_RUN_ID_TEMPLATE, "{seq}") != NULL;
    time_t now = time(NULL);
    long seq = -1;
    if (has_seq && !fixed) {
        struct tm tm;
        char date[16];
        localtime_r(&now, &tm);
        strftime(date, sizeof date, "%Y%m%d", &tm);
        seq = max_seq(runs_dir, date) + 1;
    }
    for (int tries = 0; tries < 1000; tries++, seq++) {
        if ((st = make_id(runs_dir, tmpl, arch, now, seq, id, id_size))) return st;
        if (snprintf(dir, dir_size, "%s/%s", runs_dir, id) >= (int)dir_size)
            return toy_error(TOY_ERR_RANGE, "%s/%s: path too long", runs_dir, id);
        if (mkdir(dir, 0755) == 0) return TOY_OK;
        if (errno != EEXIST) return toy_error(TOY_ERR_IO, "mkdir %s: %s", dir, strerror(errno));
        struct stat sb;
        if (fixed) {
            if (stat(dir, &sb) == 0 && S_ISDIR(sb.st_mode)) return TOY_OK;
            return toy_error(TOY_ERR_IO, "%s: exists and is not a directory", dir);
        }
        /* another process won this name: take the next {seq} */
        if (!has_seq) return toy_error(TOY_ERR_STATE, "%s: a run of that name exists (the template has no {seq})", dir);
    }
    return toy_error(TOY_ERR_STATE, "%s: could not find a free run name", runs_dir);
}

enum toy_status toy_run_link_latest(const char *checkpoint_path) {
    const char *slash = checkpoint_path ? strrchr(checkpoint_path, '/') : NULL;
    const char *base = slash ? slash + 1 : checkpoint_path;
    if (!base || !*base || !strcmp(base, "latest") || !strcmp(base, ".") || !strcmp(base, ".."))
        return toy_error(TOY_ERR_INVALID_ARG, "latest: '%s' names no checkpoint file", checkpoint_path ? checkpoint_path : "");
    int dl = slash ? (int)(slash - checkpoint_path) : 1;
    const char *dirp = slash ? checkpoint_path : ".";
    if (slash == checkpoint_path) dl = 1, dirp = "/";
    char link[PATH_MAX], tmp[PATH_MAX];
    if (snprintf(link, sizeof link, "%.*s/latest", dl, dirp) >= (int)sizeof link ||
        snprintf(tmp, sizeof tmp, "%.*s/.latest.tmp.%ld", dl, dirp, (long)getpid()) >= (int)sizeof tmp)
        return toy_error(TOY_ERR_RANGE, "%s: path too long", checkpoint_path);
    unlink(tmp);
    if (symlink(base, tmp) != 0) /* named by the checkpoint: the temporary name means nothing to a caller */
        return toy_error(TOY_ERR_IO, "latest link beside %s: %s", checkpoint_path, strerror(errno));
    if (rename(tmp, link) != 0) {
        enum toy_status st = toy_error(TOY_ERR_IO, "rename %s -> %s: %s", tmp, link, strerror(errno));
        unlink(tmp);
        return st;
    }
    return TOY_OK;
}

/* The first entry of dir other than ., .. and the lock file, into name;
 * false if there is none. */
static bool first_entry(const char *dir, char *name, size_t n) {
    DIR *d = opendir(dir);
    if (!d) return false;
    bool found = false;
    for (struct dirent *e; !found && (e = readdir(d));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") || !strcmp(e->d_name, TOY_RUN_LOCK_FILE)) continue;
        snprintf(name, n, "%s", e->d_name);
        found = true;
    }
    closedir(d);
    return found;
}

/* Removes from dir the temporary files (NAME.tmp.PID, as toy_file_replace_begin and the latest link
 * name them) of processes that no longer exist: what a writer killed with SIGKILL, or by the OOM killer,
 * left behind. Only under the run's lock, where no other toy writes, and only for dead PIDs. */
static void sweep_stale_temps(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    for (struct dirent *e; (e = readdir(d));) {
        const char *t = strstr(e->d_name, ".tmp.");
        while (t && strstr(t + 1, ".tmp.")) t = strstr(t + 1, ".tmp."); /* the last one */
        if (!t || !t[5]) continue;
        char *end;
        long pid = strtol(t + 5, &end, 10);
        if (*end || pid <= 0 || pid == (long)getpid() || kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue;
        char path[PATH_MAX];
        if (snprintf(path, sizeof path, "%s/%s", dir, e->d_name) < (int)sizeof path) unlink(path);
    }
    closedir(d);
}

enum toy_status toy_run_claim(const char *dir, bool fresh, int *lock_fd) {
    if (!lock_fd) return toy_error(TOY_ERR_INVALID_ARG, "toy_run_claim: lock_fd is NULL");
    *lock_fd = -1;
    enum toy_status st = toy_mkdir_p(dir);
    if (st) return st;
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s/%s", dir, TOY_RUN_LOCK_FILE) >= (int)sizeof path)
        return toy_error(TOY_ERR_RANGE, "%s: path too long", dir);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return toy_error(TOY_ERR_IO, "%s: %s", path, strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int err = errno;
        char pid[32] = "";
        ssize_t n = pread(fd, pid, sizeof pid - 1, 0);
        pid[n > 0 ? n : 0] = 0;
        pid[strcspn(pid, "\n")] = 0;
        close(fd);
        if (err == EWOULDBLOCK)
            return toy_error(TOY_ERR_STATE, "%s: another process%s%s%s is writing this run (it holds %s); wait for it "
                             "to end, or stop it first", dir, pid[0] ? " (pid " : "", pid, pid[0] ? ")" : "", path);
        return toy_error(TOY_ERR_IO, "%s: flock: %s", path, strerror(err));
    }
    /* the folder is ours now: a fresh run must not mix with another run's files */
    char name[256];
    if (fresh && first_entry(dir, name, sizeof name)) {
        close(fd);
        char saved[PATH_MAX];
        bool run = false; /* a train or finetune run: --resume continues it */
        static const char *const options[] = {"train.json", "finetune.json"};
        for (int k = 0; k < 2 && !run; k++)
            run = snprintf(saved, sizeof saved, "%s/%s", dir, options[k]) < (int)sizeof saved && !access(saved, F_OK);
        if (run)
            return toy_error(TOY_ERR_STATE, "%s is not empty (it holds %s): a new run would overwrite or mix with what "
                             "is there; continue that run with --resume %s, or choose a new or empty folder", dir, name,
                             dir);
        return toy_error(TOY_ERR_STATE, "%s is not empty (it holds %s, and no run): a new run would mix with what is "
                         "there; choose a new or empty folder", dir, name);
    }
    if (!fresh) {
        sweep_stale_temps(dir);
        char weights[PATH_MAX];
        if (snprintf(weights, sizeof weights, "%s/weights", dir) < (int)sizeof weights) sweep_stale_temps(weights);
    }
    char pid[32];
    int len = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
    if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)len, 0) != len) {} /* the pid only helps the message */
    *lock_fd = fd;
    return TOY_OK;
}

void toy_run_release(int lock_fd) {
    if (lock_fd >= 0) close(lock_fd); /* drops the flock */
}

void toy_run_discard(const char *dir, bool remove_dir) {
    static const char *const files[] = {"events.jsonl", "train.json", "finetune.json", TOY_RUN_LOCK_FILE};
    char path[PATH_MAX];
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++)
        if (snprintf(path, sizeof path, "%s/%s", dir, files[i]) < (int)sizeof path) unlink(path);
    if (remove_dir) rmdir(dir); /* fails, and keeps it, when it holds more */
}
