/* images.c: labelled image sets (toy/images.h): IDX (MNIST; gzip inflated
 * by zlib in memory, as gzread would read it, or plain), TOYI
 * (docs/formats.md, "Image sets"), folders of class sub-folders decoded by
 * stb_image (Debian libstb), a seeded split, channel statistics and
 * augmented float batches. A TOYI or IDX file is opened once and parsed
 * from its bytes (mapped, or read to its end when it is a pipe), so a
 * pipe's data is not lost to a first look at its magic. Invariants: pixels
 * are u8 CHW per image; every label is < n_classes; sizes read from files
 * are bounded by the bytes present before any allocation they drive. */
#include <dirent.h>
#include <limits.h>
#include <math.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <stb/stb_image.h>

#include "toy/file.h"
#include "toy/images.h"

#define MAX_SIDE 65536
/* PNG/JPEG: stb_image allocates the decoded image from the size the header
 * declares before it reads any pixel data, so a file of a few bytes can make
 * it ask for gigabytes (or fail half-way through); toy reads the header
 * first (stbi_info) and refuses images over this many pixels (8192 x 8192:
 * a 64-megapixel photo, 192 MiB decoded as RGB). The fuzz build lowers it to
 * stay inside libFuzzer's malloc limit. */
#ifndef TOY_MAX_IMAGE_PIXELS
#define TOY_MAX_IMAGE_PIXELS ((int64_t)1 << 26)
#endif
#define MAX_PIXELS ((int64_t)(TOY_MAX_IMAGE_PIXELS))
#define MAX_CLASSES 100000

static struct toy_image_set *set_new(int64_t n, int64_t c, int64_t h, int64_t w, int64_t k) {
    struct toy_image_set *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->n = n, s->channels = c, s->height = h, s->width = w, s->n_classes = k;
    s->pixels = malloc(n * c * h * w > 0 ? (size_t)(n * c * h * w) : 1);
    s->labels = malloc(n > 0 ? (size_t)n * sizeof *s->labels : 1);
    if (!s->pixels || !s->labels) { toy_images_free(s); return NULL; }
    return s;
}

void toy_images_free(struct toy_image_set *s) {
    if (!s) return;
    if (s->class_names)
        for (int64_t i = 0; i < s->n_classes; i++) free(s->class_names[i]);
    free(s->class_names);
    free(s->pixels);
    free(s->labels);
    free(s);
}

/* ---- IDX --------------------------------------------------------------------- */

/* a * b, or UINT64_MAX when it overflows (never equal to a real file size) */
static uint64_t mul_sat(uint64_t a, uint64_t b) { return b && a > UINT64_MAX / b ? UINT64_MAX : a * b; }

static uint32_t be32(const uint8_t *p) { return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]; }

/* The size an IDX file's header (its first `have` bytes) gives the whole
 * file; 0 while too few bytes are here to tell, UINT64_MAX for a header toy
 * does not read (idx_parse says why from the bytes so far). */
static uint64_t idx_size(const uint8_t *b, size_t have) {
    if (have < 4) return 0;
    if (be32(b) != 0x801 && be32(b) != 0x803) return UINT64_MAX;
    if (have < 8) return 0;
    if (be32(b) == 0x801) return 8 + (uint64_t)be32(b + 4);
    if (have < 16) return 0;
    uint64_t s = mul_sat(be32(b + 4), (uint64_t)be32(b + 8) * be32(b + 12));
    return s > UINT64_MAX - 17 ? UINT64_MAX - 1 : 16 + s;
}

/* The gzip members at src (n bytes) inflated into *out (malloc'd), as
 * gzread reads them: member after member, anything after the last one that
 * is not another member ignored. As soon as the header is out, it bounds the
 * output: a file that inflates past what its header gives, or a header that
 * gives more than this machine's memory, is refused before it is held. */
static enum toy_status gunzip(const uint8_t *src, size_t n, const char *path, uint8_t **out, size_t *len) {
    *out = NULL;
    *len = 0;
    z_stream z;
    memset(&z, 0, sizeof z);
    if (inflateInit2(&z, 16 + MAX_WBITS) != Z_OK) return toy_error(TOY_ERR_NOMEM, "%s: gzip: %s", path, "inflateInit");
    double ram = toy_ram_bytes();
    size_t cap = (size_t)1 << 16, have = 0, at = 0; /* at: input handed to zlib */
    uint64_t want = 0;                                /* the size the header gives; 0 until it is out */
    uint8_t *buf = malloc(cap);
    enum toy_status st = buf ? TOY_OK : toy_error(TOY_ERR_NOMEM, "%s", path);
    while (!st) {
        if (!want && (want = idx_size(buf, have)) == UINT64_MAX) break; /* not IDX: idx_parse says so */
        if (want && (double)want > ram) {
            st = toy_error(TOY_ERR_NOMEM, "%s: the IDX header gives %llu bytes, more than this machine's %.1f GiB of "
                           "memory", path, (unsigned long long)want, ram / (1 << 30));
            break;
        }
        if (want && have > want) break; /* refused below */
        if (have == cap) { /* grow: to what the header gives (and a byte to see any more), or by doubling */
            size_t nc = want ? (size_t)want + 1 : cap * 2;
            uint8_t *nb = realloc(buf, nc);
            if (!nb) { st = toy_error(TOY_ERR_NOMEM, "%s: %zu bytes inflated", path, nc); break; }
            buf = nb;
            cap = nc;
        }
        if (z.avail_in == 0 && at < n) { /* zlib counts in 32 bits: at most 1 GiB at a time */
            z.next_in = (Bytef *)(src + at);
            z.avail_in = (uInt)(n - at > (1u << 30) ? (1u << 30) : n - at);
            at += z.avail_in;
        }
        z.next_out = buf + have;
        z.avail_out = (uInt)(cap - have > (1u << 30) ? (1u << 30) : cap - have);
        uInt room = z.avail_out;
        int r = inflate(&z, Z_NO_FLUSH);
        have += room - z.avail_out;
        size_t left = z.avail_in + (n - at); /* input not yet inflated */
        if (r == Z_STREAM_END) {
            const uint8_t *next = src + (n - left);
            if (left < 2 || next[0] != 0x1f || next[1] != 0x8b) break; /* the last member */
            if (inflateReset(&z) != Z_OK) st = toy_error(TOY_ERR_FORMAT, "%s: gzip: %s", path, "inflateReset");
        } else if (r == Z_BUF_ERROR && left == 0) {
            st = toy_error(TOY_ERR_FORMAT, "%s: gzip: unexpected end of file", path);
        } else if (r == Z_MEM_ERROR) {
            st = toy_error(TOY_ERR_NOMEM, "%s: gzip: out of memory", path);
        } else if (r != Z_OK && r != Z_BUF_ERROR) {
            st = toy_error(TOY_ERR_FORMAT, "%s: gzip: %s", path, z.msg ? z.msg : "invalid data");
        }
    }
    if (!st && want && want != UINT64_MAX && have > want)
        st = toy_error(TOY_ERR_FORMAT, "%s: gzip data inflates past the %llu bytes its IDX header gives", path,
                       (unsigned long long)want);
    inflateEnd(&z);
    if (st) { free(buf); return st; }
    *out = buf;
    *len = have;
    return TOY_OK;
}

/* An IDX file's content: its bytes, or the bytes they inflate to when they
 * are gzip (then *owned holds them); zlib's gzread read both ways too. */
static enum toy_status idx_content(const struct toy_file_bytes *in, const char *path, const uint8_t **p, size_t *n,
                                   uint8_t **owned) {
    *owned = NULL;
    if (in->n >= 2 && in->p[0] == 0x1f && in->p[1] == 0x8b) {
        enum toy_status st = gunzip(in->p, in->n, path, owned, n);
        *p = *owned;
        return st;
    }
    *p = in->p;
    *n = in->n;
    return TOY_OK;
}

/* The set of an IDX images file (im, ni bytes, uncompressed) and its labels file (lb, nl bytes). */
static enum toy_status idx_parse(const uint8_t *im, size_t ni, const char *images_path, const uint8_t *lb, size_t nl,
                                 const char *labels_path, struct toy_image_set **out) {
    if (ni < 16 || be32(im) != 0x803)
        return toy_error(TOY_ERR_FORMAT, "%s: not an IDX3 u8 images file (magic at offset 0: %08x, expected 00000803)",
                         images_path, ni >= 4 ? be32(im) : 0);
    if (nl < 8 || be32(lb) != 0x801)
        return toy_error(TOY_ERR_FORMAT, "%s: not an IDX1 u8 labels file (magic at offset 0: %08x, expected 00000801)",
                         labels_path, nl >= 4 ? be32(lb) : 0);
    uint64_t n = be32(im + 4), h = be32(im + 8), w = be32(im + 12), nlab = be32(lb + 4);
    if (n == 0) return toy_error(TOY_ERR_FORMAT, "%s: no images (count 0 at offset 4)", images_path);
    if (h == 0 || w == 0 || h > MAX_SIDE || w > MAX_SIDE || mul_sat(n, h * w) != ni - 16)
        return toy_error(TOY_ERR_FORMAT, "%s: header says %llu images of %llux%llu (%llu bytes), the file holds %zu "
                         "bytes after the 16-byte header", images_path, (unsigned long long)n, (unsigned long long)h,
                         (unsigned long long)w, (unsigned long long)mul_sat(n, h * w), ni - 16);
    if (nlab != n || nl - 8 != n)
        return toy_error(TOY_ERR_FORMAT, "%s: %llu labels (%zu bytes present) for %llu images", labels_path,
                         (unsigned long long)nlab, nl - 8, (unsigned long long)n);
    int64_t k = 0;
    for (uint64_t i = 0; i < n; i++) k = lb[8 + i] + 1 > k ? lb[8 + i] + 1 : k;
    struct toy_image_set *s = set_new((int64_t)n, 1, (int64_t)h, (int64_t)w, k);
    if (!s) return toy_error(TOY_ERR_NOMEM, "%s: %llu images", images_path, (unsigned long long)n);
    memcpy(s->pixels, im + 16, n * h * w);
    for (uint64_t i = 0; i < n; i++) s->labels[i] = lb[8 + i];
    *out = s;
    return TOY_OK;
}

/* The images file already open (images: its bytes), the labels file by path. */
static enum toy_status idx_load(const struct toy_file_bytes *images, const char *images_path, const char *labels_path,
                                struct toy_image_set **out) {
    const uint8_t *im = NULL, *lb = NULL;
    uint8_t *im_owned = NULL, *lb_owned = NULL;
    size_t ni = 0, nl = 0;
    struct toy_file_bytes labels = {0};
    enum toy_status st = idx_content(images, images_path, &im, &ni, &im_owned);
    if (!st) st = toy_file_bytes_open(labels_path, &labels);
    if (!st) st = idx_content(&labels, labels_path, &lb, &nl, &lb_owned);
    if (!st) st = idx_parse(im, ni, images_path, lb, nl, labels_path, out);
    free(im_owned);
    free(lb_owned);
    toy_file_bytes_close(&labels);
    return st;
}

enum toy_status toy_images_load_idx(const char *images_path, const char *labels_path, struct toy_image_set **out) {
    if (!out) return toy_error(TOY_ERR_INVALID_ARG, "toy_images_load_idx: out is NULL");
    *out = NULL;
    if (!images_path || !labels_path)
        return toy_error(TOY_ERR_INVALID_ARG, "toy_images_load_idx: NULL %s path", images_path ? "labels" : "images");
    struct toy_file_bytes in;
    enum toy_status st = toy_file_bytes_open(images_path, &in);
    if (!st) st = idx_load(&in, images_path, labels_path, out);
    toy_file_bytes_close(&in);
    return st;
}

/* ---- TOYI --------------------------------------------------------------------- */

static uint32_t le32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }

/* The set in a TOYI file's bytes (b, size of them). */
static enum toy_status toyi_parse(const uint8_t *b, size_t size, const char *path, struct toy_image_set **out) {
    if (size < 28) return toy_error(TOY_ERR_FORMAT, "%s: shorter than the 28-byte TOYI header", path);
    const uint8_t *h = b;
    uint64_t n = le32(h + 8), c = le32(h + 12), hh = le32(h + 16), w = le32(h + 20), k = le32(h + 24);
    if (memcmp(h, "TOYI", 4)) return toy_error(TOY_ERR_FORMAT, "%s: bad magic (offset 0), expected TOYI", path);
    if (le32(h + 4) != 1)
        return toy_error(TOY_ERR_UNSUPPORTED, "%s: TOYI version %u (offset 4), toy reads 1", path, le32(h + 4));
    if (n == 0) return toy_error(TOY_ERR_FORMAT, "%s: no images (count 0 at offset 8)", path);
    if (c < 1 || c > 4 || hh < 1 || w < 1 || hh > MAX_SIDE || w > MAX_SIDE || k < 1 || k > MAX_CLASSES)
        return toy_error(TOY_ERR_FORMAT, "%s: bad shape: %llu channels, %llux%llu, %llu classes (offset 12)", path,
                         (unsigned long long)c, (unsigned long long)hh, (unsigned long long)w, (unsigned long long)k);
    if (mul_sat(n, c * hh * w) > (uint64_t)size || /* then the sum below cannot wrap */
        (uint64_t)size != 28 + 4 * n + mul_sat(n, c * hh * w))
        return toy_error(TOY_ERR_FORMAT, "%s: %llu images of %llux%llux%llu need %llu bytes, the file has %zu", path,
                         (unsigned long long)n, (unsigned long long)c, (unsigned long long)hh, (unsigned long long)w,
                         (unsigned long long)(28 + 4 * n + mul_sat(n, c * hh * w)), size);
    struct toy_image_set *s = set_new((int64_t)n, (int64_t)c, (int64_t)hh, (int64_t)w, (int64_t)k);
    if (!s) return toy_error(TOY_ERR_NOMEM, "%s: %llu images", path, (unsigned long long)n);
    for (uint64_t i = 0; i < n; i++) {
        uint32_t y = le32(b + 28 + 4 * i);
        if (y >= k) {
            toy_images_free(s);
            return toy_error(TOY_ERR_RANGE, "%s: image %llu has label %u, there are %llu classes (offset %llu)", path,
                             (unsigned long long)i, y, (unsigned long long)k, (unsigned long long)(28 + 4 * i));
        }
        s->labels[i] = (int32_t)y;
    }
    memcpy(s->pixels, b + 28 + 4 * n, n * c * hh * w);
    *out = s;
    return TOY_OK;
}

enum toy_status toy_images_load_toyi(const char *path, struct toy_image_set **out) {
    if (!out) return toy_error(TOY_ERR_INVALID_ARG, "toy_images_load_toyi: out is NULL");
    *out = NULL;
    struct toy_file_bytes in;
    enum toy_status st = toy_file_bytes_open(path, &in);
    if (!st) st = toyi_parse(in.p, in.n, path, out);
    toy_file_bytes_close(&in);
    return st;
}

enum toy_status toy_images_save_toyi(const struct toy_image_set *s, const char *path) {
    struct toy_file_replace r;
    enum toy_status st = toy_file_replace_begin(path, &r);
    if (st) return st;
    uint32_t h[7] = {0, 1, (uint32_t)s->n, (uint32_t)s->channels, (uint32_t)s->height, (uint32_t)s->width,
                     (uint32_t)s->n_classes};
    memcpy(h, "TOYI", 4);
    size_t np = (size_t)(s->n * s->channels * s->height * s->width);
    bool ok = fwrite(h, 4, 7, r.f) == 7; /* little-endian hosts only (x86-64, arm64) */
    for (int64_t i = 0; ok && i < s->n; i++) {
        uint32_t y = (uint32_t)s->labels[i];
        ok = fwrite(&y, 4, 1, r.f) == 1;
    }
    ok = ok && fwrite(s->pixels, 1, np, r.f) == np;
    return toy_file_replace_end(&r, ok);
}

/* ---- PNG / JPEG -------------------------------------------------------------------- */

/* Bilinear resize of u8 HWC (as stb gives) to u8 CHW (align_corners=False). */
static void resize_to_chw(const uint8_t *src, int sw, int sh, int c, uint8_t *dst, int64_t dw, int64_t dh) {
    for (int64_t y = 0; y < dh; y++) {
        float fy = ((float)y + 0.5f) * (float)sh / (float)dh - 0.5f;
        if (fy < 0) fy = 0;
        int y0 = (int)fy, y1 = y0 + 1 < sh ? y0 + 1 : y0;
        float wy = fy - (float)y0;
        for (int64_t x = 0; x < dw; x++) {
            float fx = ((float)x + 0.5f) * (float)sw / (float)dw - 0.5f;
            if (fx < 0) fx = 0;
            int x0 = (int)fx, x1 = x0 + 1 < sw ? x0 + 1 : x0;
            float wx = fx - (float)x0;
            for (int ch = 0; ch < c; ch++) {
                float a = src[((size_t)y0 * sw + x0) * c + ch], b = src[((size_t)y0 * sw + x1) * c + ch];
                float d = src[((size_t)y1 * sw + x0) * c + ch], e = src[((size_t)y1 * sw + x1) * c + ch];
                float v = (a * (1 - wx) + b * wx) * (1 - wy) + (d * (1 - wx) + e * wx) * wy;
                dst[((size_t)ch * dh + y) * dw + x] = (uint8_t)(v + 0.5f);
            }
        }
    }
}

/* stb_image (Debian's 2022 libstb) grows its PNG data buffer to each IDAT
 * chunk's declared length before reading it, so a tiny file declaring a
 * 1 GiB chunk makes it allocate 1 GiB: check that every chunk up to IEND
 * lies inside the file before handing a PNG to stb. NULL: fine (or not a PNG). */
static const char *png_chunks_bad(const uint8_t *p, size_t n) {
    static const uint8_t sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    if (n < 8 || memcmp(p, sig, 8)) return NULL;
    for (size_t at = 8; at < n;) {
        if (n - at < 12) return "a chunk header past the end of the file";
        uint64_t len = be32(p + at);
        if (len > n - at - 12) return "a chunk longer than the rest of the file";
        if (!memcmp(p + at + 4, "IEND", 4)) break;
        at += 12 + len;
    }
    return NULL;
}

enum toy_status toy_image_read_file(const char *path, int64_t channels, int64_t height, int64_t width, uint8_t *out) {
    if (!out) return toy_error(TOY_ERR_INVALID_ARG, "toy_image_read_file: out is NULL");
    if (channels != 1 && channels != 3) return toy_error(TOY_ERR_INVALID_ARG, "%s: %lld channels (1 or 3)", path,
                                                         (long long)channels);
    int w, h, n;
    struct stat sb;
    if (stat(path, &sb) != 0) return toy_error(TOY_ERR_IO, "%s: %s", path, strerror(errno));
    if (S_ISDIR(sb.st_mode)) return toy_error(TOY_ERR_INVALID_ARG, "%s: is a directory, not an image", path);
    if (height < 1 || width < 1 || height > MAX_SIDE || width > MAX_SIDE)
        return toy_error(TOY_ERR_INVALID_ARG, "%s: cannot resize to %lldx%lld", path, (long long)width,
                         (long long)height);
    /* the bytes once, checked, then decoded from memory */
    struct toy_file_bytes in;
    enum toy_status st = toy_file_bytes_open(path, &in);
    if (st) return st;
    const char *bad = png_chunks_bad(in.p, in.n);
    uint8_t *px = NULL;
    if (bad) st = toy_error(TOY_ERR_FORMAT, "%s: corrupt PNG: %s", path, bad);
    else if (in.n > INT_MAX) st = toy_error(TOY_ERR_FORMAT, "%s: %zu bytes, too large an image file", path, in.n);
    else if (stbi_info_from_memory(in.p, (int)in.n, &w, &h, &n) && (w < 1 || h < 1 || (int64_t)w * h > MAX_PIXELS))
        st = toy_error(TOY_ERR_FORMAT, "%s: the header says %dx%d pixels, more than toy reads (%lld)", path, w, h,
                       (long long)MAX_PIXELS);
    else if (!(px = stbi_load_from_memory(in.p, (int)in.n, &w, &h, &n, (int)channels)))
        /* stb's reasons are terse ("outofdata"): say what was being read */
        st = toy_error(TOY_ERR_FORMAT, "%s: not a readable PNG, JPEG, BMP or GIF image (%s%s)", path,
                       stbi_failure_reason(), in.n == 0 ? ", the file is empty" : "");
    toy_file_bytes_close(&in);
    if (st) return st;
    resize_to_chw(px, w, h, (int)channels, out, width, height);
    stbi_image_free(px);
    return TOY_OK;
}

static bool is_image_name(const char *name) {
    const char *dot = strrchr(name, '.');
    return dot && (!strcasecmp(dot, ".png") || !strcasecmp(dot, ".jpg") || !strcasecmp(dot, ".jpeg") ||
                   !strcasecmp(dot, ".bmp"));
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* sorted entries of dir (names not starting with '.'), filtered by want_dir */
static char **list_dir(const char *dir, bool want_dir, int64_t *n) {
    DIR *d = opendir(dir);
    *n = 0;
    if (!d) return NULL;
    char **v = NULL;
    int64_t cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char p[4200];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        struct stat sb;
        if (stat(p, &sb) || (bool)S_ISDIR(sb.st_mode) != want_dir || (!want_dir && !is_image_name(e->d_name))) continue;
        if (*n == cap) {
            cap = cap ? cap * 2 : 16;
            char **nv = realloc(v, (size_t)cap * sizeof *v);
            if (!nv) break;
            v = nv;
        }
        v[(*n)++] = strdup(e->d_name);
    }
    closedir(d);
    if (v) qsort(v, (size_t)*n, sizeof *v, cmp_str);
    return v;
}

static void free_list(char **v, int64_t n) {
    for (int64_t i = 0; i < n; i++) free(v[i]);
    free(v);
}

static enum toy_status load_folder(const char *dir, const struct toy_image_load_opts *o, struct toy_image_set **out) {
    int64_t k, c = o && o->channels ? o->channels : 3, h = o ? o->height : 0, w = o ? o->width : 0;
    char **classes = list_dir(dir, true, &k);
    if (k == 0) return toy_error(TOY_ERR_FORMAT, "%s: no class sub-folders (and no IDX or TOYI files)", dir);
    int64_t total = 0;
    char ***files = calloc((size_t)k, sizeof *files);
    int64_t *nf = calloc((size_t)k, sizeof *nf);
    enum toy_status st = files && nf ? TOY_OK : toy_error(TOY_ERR_NOMEM, "%s", dir);
    for (int64_t i = 0; !st && i < k; i++) {
        char p[4200];
        snprintf(p, sizeof p, "%s/%s", dir, classes[i]);
        files[i] = list_dir(p, false, &nf[i]);
        total += nf[i];
    }
    if (!st && total == 0) st = toy_error(TOY_ERR_FORMAT, "%s: no .png/.jpg/.jpeg/.bmp images in the class folders", dir);
    if (!st && (h <= 0 || w <= 0)) { /* the first image's size */
        for (int64_t i = 0; i < k && h <= 0; i++)
            if (nf[i]) {
                char p[8400];
                snprintf(p, sizeof p, "%s/%s/%s", dir, classes[i], files[i][0]);
                int iw = 0, ih = 0, in = 0;
                if (!stbi_info(p, &iw, &ih, &in)) st = toy_error(TOY_ERR_FORMAT, "%s: %s", p, stbi_failure_reason());
                else if (iw < 1 || ih < 1 || (int64_t)iw * ih > MAX_PIXELS)
                    st = toy_error(TOY_ERR_FORMAT, "%s: the header says %dx%d pixels, more than toy reads (%lld)", p,
                                   iw, ih, (long long)MAX_PIXELS);
                h = ih, w = iw;
                break;
            }
    }
    /* the whole set is allocated at once: total * c * h * w must fit */
    uint64_t bytes = mul_sat(mul_sat((uint64_t)total, (uint64_t)c), mul_sat((uint64_t)h, (uint64_t)w));
    if (!st && (h > MAX_SIDE || w > MAX_SIDE || bytes > (uint64_t)INT64_MAX / 2))
        st = toy_error(TOY_ERR_INVALID_ARG, "%s: %lld images of %lldx%lldx%lld are too many bytes", dir,
                       (long long)total, (long long)c, (long long)h, (long long)w);
    double ram = toy_ram_bytes();
    if (!st && (double)bytes > ram)
        st = toy_error(TOY_ERR_NOMEM, "%s: %lld images of %lldx%lldx%lld need %.1f GiB, more than this machine's %.1f "
                       "GiB of memory; give a smaller image size (--image-size)", dir, (long long)total, (long long)c,
                       (long long)h, (long long)w, (double)bytes / (1 << 30), ram / (1 << 30));
    struct toy_image_set *s = st ? NULL : set_new(total, c, h, w, k);
    if (!st && !s) st = toy_error(TOY_ERR_NOMEM, "%s: %lld images", dir, (long long)total);
    int64_t at = 0;
    for (int64_t i = 0; !st && i < k; i++)
        for (int64_t j = 0; !st && j < nf[i]; j++, at++) {
            char p[8400];
            snprintf(p, sizeof p, "%s/%s/%s", dir, classes[i], files[i][j]);
            st = toy_image_read_file(p, c, h, w, s->pixels + at * c * h * w);
            s->labels[at] = (int32_t)i;
        }
    for (int64_t i = 0; files && i < k; i++) free_list(files[i], nf[i]);
    free(files);
    free(nf);
    if (st) { free_list(classes, k); toy_images_free(s); return st; }
    s->class_names = classes;
    *out = s;
    return TOY_OK;
}

/* the labels file of an IDX images file: "images-idx3" -> "labels-idx1" */
static bool idx_labels_path(const char *images, char *out, size_t n) {
    const char *p = strstr(images, "images-idx3");
    if (!p) return false;
    snprintf(out, n, "%.*slabels-idx1%s", (int)(p - images), images, p + strlen("images-idx3"));
    return access(out, R_OK) == 0;
}

enum toy_status toy_images_load(const char *path, const struct toy_image_load_opts *opts, struct toy_image_set **out) {
    if (!out) return toy_error(TOY_ERR_INVALID_ARG, "toy_images_load: out is NULL");
    *out = NULL;
    if (!path) return toy_error(TOY_ERR_INVALID_ARG, "toy_images_load: NULL path");
    struct stat sb;
    if (strcmp(path, "-") && stat(path, &sb)) return toy_error(TOY_ERR_IO, "%s: %s", path, strerror(errno));
    char lab[4200];
    if (strcmp(path, "-") && S_ISDIR(sb.st_mode)) {
        int64_t n;
        char **v = list_dir(path, false, &n); /* image files: none for IDX folders */
        free_list(v, n);
        DIR *d = opendir(path);
        struct dirent *e;
        char found[4200] = "";
        while (d && (e = readdir(d))) {
            char p[4200];
            snprintf(p, sizeof p, "%s/%s", path, e->d_name);
            if (strstr(e->d_name, "images-idx3") && idx_labels_path(p, lab, sizeof lab) &&
                (!found[0] || strcmp(p, found) < 0))
                snprintf(found, sizeof found, "%s", p);
        }
        if (d) closedir(d);
        if (found[0]) {
            idx_labels_path(found, lab, sizeof lab);
            return toy_images_load_idx(found, lab, out);
        }
        return load_folder(path, opts, out);
    }
    /* opened once, whatever it is: a pipe's bytes are gone once read */
    struct toy_file_bytes in;
    enum toy_status st = toy_file_bytes_open(path, &in);
    if (st) return st;
    if (in.n >= 4 && !memcmp(in.p, "TOYI", 4)) st = toyi_parse(in.p, in.n, path, out);
    else if (!strstr(path, "images-idx3"))
        st = toy_error(TOY_ERR_UNSUPPORTED, "%s: not an image set (a TOYI file, an IDX images file, or a folder)", path);
    else if (!idx_labels_path(path, lab, sizeof lab))
        st = toy_error(TOY_ERR_NOT_FOUND, "%s: no matching labels-idx1 file next to it", path);
    else st = idx_load(&in, path, lab, out);
    toy_file_bytes_close(&in);
    return st;
}

/* ---- split, statistics, batches ----------------------------------------------------- */

static struct toy_image_set *subset(const struct toy_image_set *s, const int64_t *idx, int64_t n) {
    struct toy_image_set *o = set_new(n, s->channels, s->height, s->width, s->n_classes);
    if (!o) return NULL;
    size_t per = (size_t)(s->channels * s->height * s->width);
    for (int64_t i = 0; i < n; i++) {
        memcpy(o->pixels + (size_t)i * per, s->pixels + (size_t)idx[i] * per, per);
        o->labels[i] = s->labels[idx[i]];
    }
    if (s->class_names) {
        o->class_names = calloc((size_t)s->n_classes, sizeof *o->class_names);
        for (int64_t i = 0; o->class_names && i < s->n_classes; i++) o->class_names[i] = strdup(s->class_names[i]);
    }
    return o;
}

enum toy_status toy_images_split(const struct toy_image_set *s, double test_frac, uint64_t seed,
                                 struct toy_image_set **train, struct toy_image_set **test) {
    if (!train || !test)
        return toy_error(TOY_ERR_INVALID_ARG, "toy_images_split: %s is NULL", train ? "test" : "train");
    *train = *test = NULL;
    if (!(test_frac >= 0 && test_frac < 1)) return toy_error(TOY_ERR_INVALID_ARG, "split: test fraction %g", test_frac);
    int64_t *idx = malloc((size_t)(s->n > 0 ? s->n : 1) * sizeof *idx);
    if (!idx) return toy_error(TOY_ERR_NOMEM, "split");
    for (int64_t i = 0; i < s->n; i++) idx[i] = i;
    struct toy_rng r;
    toy_rng_seed(&r, seed);
    for (int64_t i = s->n - 1; i > 0; i--) { /* Fisher-Yates */
        int64_t j = (int64_t)toy_rng_below(&r, (uint64_t)i + 1), t = idx[i];
        idx[i] = idx[j];
        idx[j] = t;
    }
    int64_t ntr = s->n - (int64_t)(s->n * test_frac + 0.5);
    *train = subset(s, idx, ntr);
    *test = subset(s, idx + ntr, s->n - ntr);
    free(idx);
    if (!*train || !*test) {
        toy_images_free(*train);
        toy_images_free(*test);
        *train = *test = NULL;
        return toy_error(TOY_ERR_NOMEM, "split");
    }
    return TOY_OK;
}

void toy_images_stats(const struct toy_image_set *s, float *mean, float *std) {
    int64_t hw = s->height * s->width;
    for (int64_t c = 0; c < s->channels; c++) {
        double sum = 0, sq = 0;
        for (int64_t i = 0; i < s->n; i++) {
            const uint8_t *p = s->pixels + (i * s->channels + c) * hw;
            for (int64_t k = 0; k < hw; k++) sum += p[k], sq += (double)p[k] * p[k];
        }
        double n = (double)(s->n * hw > 0 ? s->n * hw : 1), m = sum / n / 255.0;
        double var = sq / n / (255.0 * 255.0) - m * m;
        mean[c] = (float)m;
        std[c] = (float)(var > 1e-12 ? sqrt(var) : 1.0);
    }
}

void toy_images_batch(const struct toy_image_set *s, const int64_t *idx, int64_t n, const float *mean,
                      const float *std, const struct toy_image_aug *aug, struct toy_rng *rng, float *out,
                      int32_t *labels) {
    const int64_t C = s->channels, H = s->height, W = s->width;
    for (int64_t b = 0; b < n; b++) {
        const uint8_t *src = s->pixels + idx[b] * C * H * W;
        int64_t dx = 0, dy = 0;
        bool flip = false;
        if (aug && rng) {
            if (aug->crop_pad > 0) {
                dx = (int64_t)toy_rng_below(rng, 2 * (uint64_t)aug->crop_pad + 1) - aug->crop_pad;
                dy = (int64_t)toy_rng_below(rng, 2 * (uint64_t)aug->crop_pad + 1) - aug->crop_pad;
            }
            if (aug->flip) flip = toy_rng_below(rng, 2) == 1;
        }
        for (int64_t c = 0; c < C; c++) {
            float m = mean[c], is = 1.0f / std[c], pad = -m * is; /* a zero pixel, normalised */
            float *o = out + ((b * C + c) * H) * W; /* (H, W) */
            for (int64_t y = 0; y < H; y++) {
                int64_t sy = y + dy;
                for (int64_t x = 0; x < W; x++) {
                    int64_t sx = (flip ? W - 1 - x : x) + dx;
                    o[y * W + x] = sy < 0 || sy >= H || sx < 0 || sx >= W
                                       ? pad
                                       : ((float)src[(c * H + sy) * W + sx] * (1.0f / 255.0f) - m) * is;
                }
            }
        }
        if (labels) labels[b] = s->labels[idx[b]];
    }
}
