/* resume.c: the checks and notes of --resume (resume.h). */
#include "resume.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "toy/threadpool.h"

json_t *toy_cli_resume_load(const char *cmd, const char *dir, const char *file) {
    char path[1200], other[1200];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    struct stat sb;
    if (stat(dir, &sb) || !S_ISDIR(sb.st_mode)) {
        fprintf(stderr, "toy %s: cannot resume: %s: %s\n", cmd, dir, stat(dir, &sb) ? strerror(errno) : "not a folder");
        return NULL;
    }
    if (access(path, F_OK)) { /* which run is it, then? */
        const char *other_file = !strcmp(file, "train.json") ? "finetune.json" : "train.json";
        const char *other_cmd = !strcmp(file, "train.json") ? "finetune" : "train";
        snprintf(other, sizeof other, "%s/%s", dir, other_file);
        const char *base = strrchr(dir, '/') && strrchr(dir, '/')[1] ? strrchr(dir, '/') + 1 : dir;
        snprintf(path, sizeof path, "%s/events.jsonl", dir);
        if (!access(other, F_OK))
            fprintf(stderr, "toy %s: cannot resume: %s is a `toy %s` run: continue it with toy %s --resume %s\n", cmd,
                    dir, other_cmd, other_cmd, dir);
        else if (!strncmp(base, "demo-", 5) && !access(path, F_OK))
            fprintf(stderr, "toy %s: cannot resume: %s is a `toy demo` run, which cannot be resumed (its text is made in "
                    "memory); its checkpoint is in %s/weights, or start a new one with toy demo\n", cmd, dir, dir);
        else
            fprintf(stderr, "toy %s: cannot resume: %s is not a run folder (it has no %s)\n", cmd, dir, file);
        return NULL;
    }
    json_error_t err;
    json_t *j = json_load_file(path, 0, &err);
    if (!j) fprintf(stderr, "toy %s: cannot resume: %s: %s (line %d)\n", cmd, path, err.text, err.line);
    else if (!json_is_object(j)) {
        fprintf(stderr, "toy %s: cannot resume: %s: not a JSON object\n", cmd, path);
        json_decref(j);
        j = NULL;
    }
    return j;
}

int toy_cli_resume_data(const char *cmd, const char *data, uint64_t fp, int64_t n, const char *unit,
                        const char *recorded, int64_t recorded_n, const char *saved, char hex[17]) {
    snprintf(hex, 17, "%016llx", (unsigned long long)fp);
    if (!recorded || !strcmp(recorded, hex)) return 0;
    fprintf(stderr, "toy %s: cannot resume: %s is not the data this run trained on (%lld %s, fingerprint %s; %s "
            "records %lld %s, fingerprint %s): restore that file, or start a new run\n", cmd, data, (long long)n, unit,
            hex, saved, (long long)recorded_n, unit, recorded);
    return 1;
}

/* the notes of toy_cli_resume_changes, said once the run is known to go on */
static char pending[1024];

static void note(const char *fmt, ...) {
    size_t n = strlen(pending);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pending + n, sizeof pending - n, fmt, ap);
    va_end(ap);
}

bool toy_cli_resume_changes(const char *cmd, int run_threads, int threads, int64_t run_steps, int64_t steps,
                            bool constant_lr) {
    bool new_threads = run_threads > 0 && toy_threads_resolve(threads) != run_threads;
    if (new_threads)
        note("toy %s: note: the run trained on %d threads and continues on %d: its losses will differ in the last bits "
             "from a run never interrupted\n", cmd, run_threads, toy_threads_resolve(threads));
    bool new_steps = steps != run_steps;
    if (new_steps && !constant_lr && run_steps <= 0) /* toy finetune --epochs: the step count was the epochs' */
        note("toy %s: note: the run now ends at step %lld, not at the end of its epochs: its learning-rate schedule "
             "spans the new length from here on\n", cmd, (long long)steps);
    else if (new_steps && !constant_lr)
        note("toy %s: note: the run now ends at step %lld, not %lld: its learning-rate schedule spans the new length "
             "from here on\n", cmd, (long long)steps, (long long)run_steps);
    return new_threads || new_steps;
}

void toy_cli_resume_notes(void) {
    fputs(pending, stderr);
    pending[0] = 0;
}

void toy_cli_resume_ignored(const char *cmd, int argc, char **argv, const char *const *applies, const char *saved,
                            const char *which) {
    for (int i = 1; i < argc; i++) {
        bool known = false;
        for (int k = 0; applies[k] && !known; k++) known = !strcmp(argv[i], applies[k]);
        if (argv[i][0] == '-' && argv[i][1] == '-' && !known)
            fprintf(stderr, "toy %s: %s is ignored with --resume: the run keeps the settings in its %s (only %s "
                    "apply)\n", cmd, argv[i], saved, which);
    }
}
