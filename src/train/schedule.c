/* schedule.c: learning-rate schedules: constant, linear warmup then cosine
 * decay to a floor, linear warmup then linear decay to a floor. */
#include <math.h>
#include <string.h>

#include "toy/optim.h"

float toy_lr_at(const struct toy_lr_schedule *s, int64_t step) {
    if (s->warmup > 0 && step < s->warmup) return s->lr * (float)(step + 1) / (float)s->warmup;
    if (s->kind == TOY_LR_CONSTANT) return s->lr;
    int64_t span = s->total - s->warmup;
    double prog = span > 0 ? (double)(step - s->warmup) / (double)span : 1.0;
    if (prog > 1) prog = 1;
    if (prog < 0) prog = 0;
    if (s->kind == TOY_LR_COSINE) return (float)(s->lr_min + 0.5 * (s->lr - s->lr_min) * (1 + cos(M_PI * prog)));
    return (float)(s->lr + (s->lr_min - s->lr) * prog);
}

int toy_lr_kind_from_name(const char *name) {
    if (!strcmp(name, "constant")) return TOY_LR_CONSTANT;
    if (!strcmp(name, "cosine")) return TOY_LR_COSINE;
    if (!strcmp(name, "linear")) return TOY_LR_LINEAR;
    return -1;
}
