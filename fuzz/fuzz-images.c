/* fuzz-images.c: libFuzzer harness for the image-set loaders
 * (src/io/images.c). The loaders take paths, so the input is written to a
 * private temp folder first. The first input byte picks the target:
 *   0  a TOYI file (toy_images_load: the magic picks the reader)
 *   1  an IDX pair: 2 bytes (little-endian) give the images part's length,
 *      the rest is the labels part; either may be gzip (toy_images_load on
 *      "…-images-idx3-ubyte", which finds "…-labels-idx1-ubyte")
 *   2  one PNG/JPEG/BMP/GIF file through stb_image (toy_image_read_file),
 *      1 or 3 channels, resized to 8x8
 *   3  a class folder holding that file, loaded at the image's own size
 * Loaded sets go through split, stats and an augmented batch. Build: make
 * -f fuzz/Makefile; bounded run: fuzz/run.sh SECONDS. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "toy/images.h"

static char dir[64];

static void put(const char *path, const uint8_t *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    if (n && fwrite(p, 1, n, f) != n) abort();
    fclose(f);
}

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
    if (size < 1) return 0;
    const uint8_t *p = data + 1;
    size_t n = size - 1;
    char a[128], b[128], c[128];
    struct toy_image_set *s = NULL;
    switch (data[0] % 4) {
    case 0:
        snprintf(a, sizeof a, "%s/set.toyi", dir);
        put(a, p, n);
        if (!toy_images_load(a, NULL, &s)) use(s);
        unlink(a);
        break;
    case 1: {
        if (n < 2) return 0;
        size_t ni = (size_t)p[0] | (size_t)p[1] << 8;
        p += 2, n -= 2;
        if (ni > n) ni = n;
        snprintf(a, sizeof a, "%s/t-images-idx3-ubyte", dir);
        snprintf(b, sizeof b, "%s/t-labels-idx1-ubyte", dir);
        put(a, p, ni);
        put(b, p + ni, n - ni);
        if (!toy_images_load(a, NULL, &s)) use(s);
        unlink(a);
        unlink(b);
        break;
    }
    case 2: {
        snprintf(a, sizeof a, "%s/img.png", dir);
        put(a, p, n);
        int64_t ch = data[0] & 4 ? 3 : 1;
        uint8_t out[3 * 8 * 8];
        toy_image_read_file(a, ch, 8, 8, out);
        unlink(a);
        break;
    }
    case 3: {
        snprintf(a, sizeof a, "%s/cls", dir);
        snprintf(b, sizeof b, "%s/cls/k", dir);
        snprintf(c, sizeof c, "%s/cls/k/img.png", dir);
        mkdir(a, 0700);
        mkdir(b, 0700);
        put(c, p, n);
        struct toy_image_load_opts o = {.channels = data[0] & 4 ? 3 : 1};
        if (!toy_images_load(a, &o, &s)) use(s);
        unlink(c);
        rmdir(b);
        rmdir(a);
        break;
    }
    }
    return 0;
}
