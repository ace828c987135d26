/* progress.c: see progress.h. Redraws at most 10 times a second. */
#include "progress.h"
#include "toy/trainer.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

double toy_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

void toy_progress_start(struct toy_progress *p, const char *label, int64_t total, const char *unit) {
    p->label = label;
    p->unit = unit;
    p->total = total;
    p->t0 = toy_now();
    p->tty = isatty(2);
    p->last_draw = 0;
}

static void fmt_time(char *buf, size_t n, double s) {
    if (s < 0 || s > 1e7) { snprintf(buf, n, "--:--"); return; }
    int t = (int)(s + 0.5);
    if (t >= 3600) snprintf(buf, n, "%d:%02d:%02d", t / 3600, t / 60 % 60, t % 60);
    else snprintf(buf, n, "%d:%02d", t / 60, t % 60);
}

void toy_progress_update(struct toy_progress *p, int64_t done, double rate_units, const char *extra) {
    if (!p->tty) return;
    double now = toy_now();
    if (done < p->total && now - p->last_draw < 0.1) return;
    p->last_draw = now;
    double el = now - p->t0, frac = p->total > 0 ? (double)done / (double)p->total : 1;
    const int W = 24;
    char bar[W + 1];
    int fill = (int)(frac * W);
    for (int i = 0; i < W; i++) bar[i] = i < fill ? '=' : i == fill ? '>' : ' ';
    bar[W] = 0;
    char eta[16];
    fmt_time(eta, sizeof eta, done > 0 ? el * (1 - frac) / frac : -1);
    double rate = el > 0 ? rate_units / el : 0;
    const char *sfx = "";
    if (rate >= 1e6) { rate /= 1e6; sfx = "M"; } else if (rate >= 1e3) { rate /= 1e3; sfx = "k"; }
    fprintf(stderr, "\r\033[K%s %lld/%lld [%s] %.1f%s %s  ETA %s  %s", p->label, (long long)done,
            (long long)p->total, bar, rate, sfx, p->unit, eta, extra ? extra : "");
    fflush(stderr);
}

void toy_progress_finish(struct toy_progress *p) {
    if (p->tty) fprintf(stderr, "\n");
}

void toy_progress_on_step(void *ud, const struct toy_step_info *s) {
    struct toy_step_progress *p = ud;
    char extra[96];
    if (isnan(s->eval_loss)) snprintf(extra, sizeof extra, "loss %.4f  lr %.2e", s->loss, s->lr);
    else snprintf(extra, sizeof extra, "loss %.4f  eval %.4f  lr %.2e", s->loss, s->eval_loss, s->lr);
    bool due = s->step % p->log_every == 0 || s->step == s->steps || !isnan(s->eval_loss);
    /* a log line goes to stdout unless stdout is the terminal the bar is drawn on: `toy train > log.txt` keeps
     * its log with the bar on screen */
    bool same_terminal = p->pb.tty && isatty(1);
    if (!p->json && due && !same_terminal) {
        printf("step %lld: loss=%.6f", (long long)s->step, s->loss);
        if (!isnan(s->eval_loss)) printf(" eval=%.6f", s->eval_loss);
        printf("\n");
        fflush(stdout);
    }
    if (p->pb.tty) {
        if (!p->json && same_terminal && !isnan(s->eval_loss)) { /* an evaluation stays on screen, above the bar */
            fprintf(stderr, "\r\033[Kstep %lld: loss=%.6f eval=%.6f\n", (long long)s->step, s->loss, s->eval_loss);
            p->pb.last_draw = 0;
        }
        toy_progress_update(&p->pb, s->step, (double)s->tokens_done, extra);
    }
}
