/* images-input.h: how an image-fuzz input becomes a loader call, for
 * fuzz-images.c and for tests/test-vit.c's replay of the inputs it kept
 * (one definition, so a kept input is replayed as it was found). The first
 * byte picks the target:
 *   0  a TOYI file (toy_images_load: the magic picks the reader)
 *   1  an IDX pair: 2 bytes (little-endian) give the images part's length,
 *      the rest is the labels part; either may be gzip (toy_images_load on
 *      "…-images-idx3-ubyte", which finds "…-labels-idx1-ubyte")
 *   2  one PNG/JPEG/BMP/GIF file through stb_image (toy_image_read_file),
 *      1 or 3 channels (bit 2 of the first byte), resized to 8x8
 *   3  a class folder holding that file, loaded at the image's own size
 * The files go into dir (which exists) and are removed again. */
#ifndef TOY_FUZZ_IMAGES_INPUT_H
#define TOY_FUZZ_IMAGES_INPUT_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "toy/images.h"

static void fuzz_images_put(const char *path, const uint8_t *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    if (n && fwrite(p, 1, n, f) != n) abort();
    fclose(f);
}

/* The loader's status; *set: the set targets 0, 1 and 3 loaded, else NULL.
 * TOY_OK with no set for an input too short to pick a target. */
static enum toy_status fuzz_images_run(const uint8_t *data, size_t size, const char *dir,
                                       struct toy_image_set **set) {
    *set = NULL;
    if (size < 1) return TOY_OK;
    const uint8_t *p = data + 1;
    size_t n = size - 1;
    int64_t ch = data[0] & 4 ? 3 : 1;
    char a[512], b[512], c[512];
    enum toy_status st = TOY_OK;
    switch (data[0] % 4) {
    case 0:
        snprintf(a, sizeof a, "%s/set.toyi", dir);
        fuzz_images_put(a, p, n);
        st = toy_images_load(a, NULL, set);
        unlink(a);
        break;
    case 1: {
        if (n < 2) return TOY_OK;
        size_t ni = (size_t)p[0] | (size_t)p[1] << 8;
        p += 2, n -= 2;
        if (ni > n) ni = n;
        snprintf(a, sizeof a, "%s/t-images-idx3-ubyte", dir);
        snprintf(b, sizeof b, "%s/t-labels-idx1-ubyte", dir);
        fuzz_images_put(a, p, ni);
        fuzz_images_put(b, p + ni, n - ni);
        st = toy_images_load(a, NULL, set);
        unlink(a);
        unlink(b);
        break;
    }
    case 2: {
        snprintf(a, sizeof a, "%s/img.png", dir);
        fuzz_images_put(a, p, n);
        uint8_t out[3 * 8 * 8];
        st = toy_image_read_file(a, ch, 8, 8, out);
        unlink(a);
        break;
    }
    default:
        snprintf(a, sizeof a, "%s/cls", dir);
        snprintf(b, sizeof b, "%s/cls/k", dir);
        snprintf(c, sizeof c, "%s/cls/k/img.png", dir);
        mkdir(a, 0700);
        mkdir(b, 0700);
        fuzz_images_put(c, p, n);
        st = toy_images_load(a, &(struct toy_image_load_opts){.channels = ch}, set);
        unlink(c);
        rmdir(b);
        rmdir(a);
        break;
    }
    if (st) *set = NULL;
    return st;
}

#endif
