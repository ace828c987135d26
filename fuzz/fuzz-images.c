/* fuzz-images.c: libFuzzer harness for the image-set loaders
 * (src/io/images.c). The loaders take paths, so the input is written to a
 * private temp folder first; images-input.h says how the first byte picks
 * the loader. Loaded sets go through split, stats and an augmented batch.
 * Build: make -f fuzz/Makefile; bounded run: fuzz/run.sh SECONDS. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "images-input.h"
#include "toy/images.h"

static char dir[64];

static void use(struct toy_image_set *s) {
    if (s->n < 1 || s->channels < 1 || s->channels > 4 || s->n_classes < 1) abort();
    for (int64_t i = 0; i < s->n; i++)
        if (s->labels[i] < 0 || s->labels[i] >= s->n_classes) abort();
    struct toy_image_set *tr, *te;
    if (!toy_images_split(s, 0.5, 1, &tr, &te)) {
        toy_images_free(tr);
        toy_images_free(te);
    }
    int64_t chw = s->channels * s->height * s->width;
    if (chw <= (1 << 20)) {
        float mean[4], std[4];
        toy_images_stats(s, mean, std);
        for (int c = 0; c < s->channels; c++) if (!(std[c] > 0)) std[c] = 1;
        int64_t idx[2] = {0, s->n - 1};
        float *x = malloc((size_t)(2 * chw) * sizeof *x);
        int32_t y[2];
        struct toy_rng rng;
        toy_rng_seed(&rng, 1);
        toy_images_batch(s, idx, 2, mean, std, &(struct toy_image_aug){.crop_pad = 2, .flip = true}, &rng, x, y);
        free(x);
    }
    toy_images_free(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/tmp/fuzz-images-%d", (int)getpid());
        mkdir(dir, 0700);
    }
    struct toy_image_set *s;
    if (!fuzz_images_run(data, size, dir, &s) && s) use(s);
    return 0;
}
