/* toy/images.h: labelled image sets for classification: loading (MNIST's
 * IDX files, gzip or not; toy's TOYI binary format; folders of PNG/JPEG
 * images, one sub-folder per class), a seeded train/test split, per-channel
 * statistics, and batches of normalised float images with optional random
 * crop (zero padding + random offset) and horizontal flip.
 *
 *     struct toy_image_set *all, *train, *test;
 *     if (toy_images_load("../shared/testdata/mnist-t10k", NULL, &all)) die(toy_last_error());
 *     toy_images_split(all, 0.2, 42, &train, &test);       // 80% / 20%, shuffled
 *     float mean[3], std[3];
 *     toy_images_stats(train, mean, std);
 *     float *x = malloc(B * C * H * W * 4); int32_t y[B];   // x: (B, C, H, W)
 *     toy_images_batch(train, idx, B, mean, std, &(struct toy_image_aug){.crop_pad = 2}, &rng, x, y);
 *
 * Pixels are u8, stored image-major then channel, row, column (CHW, as in
 * PyTorch). Formats: IDX (http://yann.lecun.com/exdb/mnist/: big-endian
 * magic 0x00000803 for images N x H x W, 0x00000801 for labels N) read
 * through zlib; TOYI is documented in docs/formats.md; PNG/JPEG are decoded
 * by stb_image (Debian libstb) and resized bilinearly to the requested size.
 * Every count and size read from a file is checked against the bytes present
 * (TOY_ERR_FORMAT naming the file, field and offset).
 */
#ifndef TOY_IMAGES_H
#define TOY_IMAGES_H

#include <stdbool.h>
#include <stdint.h>

#include "toy/rng.h"
#include "toy/status.h"

#ifdef __cplusplus
extern "C" {
#endif

struct toy_image_set {
    int64_t n, channels, height, width, n_classes;
    uint8_t *pixels;      /* (n, channels, height, width) */
    int32_t *labels;      /* (n), each in [0, n_classes) */
    char **class_names;   /* n_classes names, or NULL (IDX, TOYI) */
};

struct toy_image_load_opts {
    int64_t channels;     /* folders, single files: 1 or 3 (0: 3) */
    int64_t height, width;/* folders, single files: resize to this (0: the first image's size) */
};

/* Loads `path`: a TOYI file; an IDX images file (…-images-idx3-ubyte[.gz],
 * labels from the matching …-labels-idx1-ubyte[.gz]); a folder holding such
 * an IDX pair (the first images file with its labels present); or a folder
 * of class sub-folders of .png/.jpg/.jpeg/.bmp images (classes sorted by
 * name). opts may be NULL. A file is opened once (a regular file mapped,
 * anything else read to its end), so "-" (standard input), /dev/stdin or a
 * FIFO holding a TOYI set, or a FIFO named as an IDX images file, loads as
 * the file does. */
enum toy_status toy_images_load(const char *path, const struct toy_image_load_opts *opts, struct toy_image_set **out);
enum toy_status toy_images_load_idx(const char *images_path, const char *labels_path, struct toy_image_set **out);
enum toy_status toy_images_load_toyi(const char *path, struct toy_image_set **out);
/* Writes a set as TOYI (atomically: temp file + rename). */
enum toy_status toy_images_save_toyi(const struct toy_image_set *s, const char *path);
/* One image file (PNG, JPEG, BMP, ...) as u8 CHW of the requested channels
 * and size (resized bilinearly); out holds channels*height*width bytes.
 * Files are untrusted: a header declaring more than 2^26 pixels (8192 x
 * 8192) or a PNG chunk running past the end of the file is TOY_ERR_FORMAT,
 * refused before stb_image allocates what the header says. */
enum toy_status toy_image_read_file(const char *path, int64_t channels, int64_t height, int64_t width, uint8_t *out);
void toy_images_free(struct toy_image_set *s);

/* A seeded shuffle of s split into the first round(n * (1 - test_frac))
 * images (train) and the rest (test); both are new sets (copies). */
enum toy_status toy_images_split(const struct toy_image_set *s, double test_frac, uint64_t seed,
                                 struct toy_image_set **train, struct toy_image_set **test);
/* Per-channel mean and standard deviation of the pixels scaled to [0, 1]. */
void toy_images_stats(const struct toy_image_set *s, float *mean, float *std);

struct toy_image_aug {
    int32_t crop_pad;     /* > 0: pad by this many zero pixels, crop back at a random offset */
    bool flip;            /* random horizontal flip (p = 0.5) */
};

/* Images idx[0..n) as floats ((x / 255 - mean[c]) / std[c]) into out
 * (n, C, H, W) and their labels into labels (may be NULL). aug may be NULL
 * (then rng may be NULL too). */
void toy_images_batch(const struct toy_image_set *s, const int64_t *idx, int64_t n, const float *mean,
                      const float *std, const struct toy_image_aug *aug, struct toy_rng *rng, float *out,
                      int32_t *labels);

#ifdef __cplusplus
}
#endif
#endif
