/* progress.h: a terminal progress bar with rate and ETA for long commands.
 * On a terminal (stderr is a tty) it redraws one line; in a pipe it stays
 * quiet (callers print their own occasional summary lines). */
#ifndef TOY_CLI_PROGRESS_H
#define TOY_CLI_PROGRESS_H

#include <stdbool.h>
#include <stdint.h>

struct toy_progress {
    const char *label;
    const char *unit;     /* "tok/s", "MB/s", ... */
    int64_t total;
    double t0;
    bool tty;
    double last_draw;
};

void toy_progress_start(struct toy_progress *p, const char *label, int64_t total, const char *unit);
/* done: units finished; rate_units: what the rate counts since start (e.g.
 * tokens); extra: text shown after the bar (e.g. "loss 1.234"). */
void toy_progress_update(struct toy_progress *p, int64_t done, double rate_units, const char *extra);
void toy_progress_finish(struct toy_progress *p);
double toy_now(void);

/* The step callback of `toy train` and `toy finetune` (toy_step_info): the
 * bar on a terminal, else a line every log_every steps, at evaluations and
 * at the last step, unless json (the events say it all). */
struct toy_step_info;
struct toy_step_progress {
    struct toy_progress pb;
    int log_every;
    bool json;
};
void toy_progress_on_step(void *ud, const struct toy_step_info *s);

#endif
