/* train-vit.h: `toy train --arch vit` (cli/train-vit.c); cmd-train.c hands
 * such command lines here. */
#ifndef TOY_CLI_TRAIN_VIT_H
#define TOY_CLI_TRAIN_VIT_H

#include <stdbool.h>

/* True for `--arch vit`, or `--resume DIR` of a run whose train.json says
 * "arch": "vit". */
bool toy_train_is_vit(int argc, char **argv);
/* argv as `toy train` got it (with --arch vit); returns the exit code. */
int toy_train_vit(int argc, char **argv);

#endif
