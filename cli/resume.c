/* resume.c: the checks and notes of --resume (resume.h). */
#include "resume.h"

#include <stdio.h>
#include <string.h>

#include "toy/threadpool.h"

int toy_cli_resume_data(const char *cmd, const char *data, uint64_t fp, int64_t n, const char *unit,
                        const char *recorded, int64_t recorded_n, const char *saved, char hex[17]) {
    snprintf(hex, 17, "%016llx", (unsigned long long)fp);
    if (!recorded || !strcmp(recorded, hex)) return 0;
    fprintf(stderr, "toy %s: cannot resume: %s is not the data this run trained on (%lld %s, fingerprint %s; %s "
            "records %lld %s, fingerprint %s): restore that file, or start a new run\n", cmd, data, (long long)n, unit,
            hex, saved, (long long)recorded_n, unit, recorded);
    return 1;
}

bool toy_cli_resume_changes(const char *cmd, int run_threads, int threads, int64_t run_steps, int64_t steps,
                            bool constant_lr) {
    bool new_threads = run_threads > 0 && toy_threads_resolve(threads) != run_threads;
    if (new_threads)
        fprintf(stderr, "toy %s: note: the run trained on %d threads and continues on %d: its losses will differ in "
                "the last bits from a run never interrupted\n", cmd, run_threads, toy_threads_resolve(threads));
    bool new_steps = steps != run_steps;
    if (new_steps && !constant_lr && run_steps <= 0) /* toy finetune --epochs: the step count was the epochs' */
        fprintf(stderr, "toy %s: note: the run now ends at step %lld, not at the end of its epochs: its learning-rate "
                "schedule spans the new length from here on\n", cmd, (long long)steps);
    else if (new_steps && !constant_lr)
        fprintf(stderr, "toy %s: note: the run now ends at step %lld, not %lld: its learning-rate schedule spans the "
                "new length from here on\n", cmd, (long long)steps, (long long)run_steps);
    return new_threads || new_steps;
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
