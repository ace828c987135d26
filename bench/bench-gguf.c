/* bench-gguf.c: model-file figures, each beside a peer measured in the same
 * run (src/io/gguf.c, gguf-write.c, src/core/quant.c).
 *
 *  open      a ~500 MB GGUF (written here to /tmp, 48 f32 tensors) opened
 *            with toy_gguf_open in a fresh child process: wall time and
 *            growth of the resident set, versus reading the same file into memory with read()
 *            (the copy that mmap avoids). Page cache warm in both.
 *  write     the writer's throughput versus a plain write() of one buffer.
 *  quant     quantize and dequantize throughput per format, single thread,
 *            in GB/s of f32 data, versus memcpy of the same f32 bytes.
 * Usage: bench-gguf [MB]   (file size, default 500)
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "toy/gguf.h"
#include "toy/quant.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static enum toy_status fill(void *ctx, void *dst, size_t nbytes) {
    uint32_t s = (uint32_t)(uintptr_t)ctx * 2654435761u + 1;
    float *x = dst;
    for (size_t i = 0; i < nbytes / 4; i++) {
        s = s * 1664525u + 1013904223u;
        x[i] = (float)(int32_t)s * (1.0f / 2147483648.0f);
    }
    return TOY_OK;
}

/* Resident set of this process in KB (/proc/self/statm). */
static long rss_kb(void) {
    long pages = 0, res = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f) {
        if (fscanf(f, "%ld %ld", &pages, &res) != 2) res = 0;
        fclose(f);
    }
    return res * (sysconf(_SC_PAGESIZE) / 1024);
}

/* Opens (mode 0) or reads (mode 1) the file in a child; returns its wall
 * seconds, the growth of its resident set (KB) and a checksum. */
struct child_result {
    double seconds;
    long maxrss_kb;
    double check;
};

static struct child_result in_child(int mode, const char *path) {
    int fds[2];
    struct child_result r = {0};
    if (pipe(fds)) return r;
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        long rss0 = rss_kb();
        double t0 = now();
        struct child_result c = {0};
        if (mode == 0) {
            struct toy_gguf *g;
            if (toy_gguf_open(path, &g) == TOY_OK) {
                /* ready to run: every tensor located and validated; its pages
                 * are read when a kernel first touches them (each first touch
                 * maps a page-cache folio, shared, never a copy) */
                for (int64_t i = 0; i < toy_gguf_n_tensors(g); i++) c.check += (double)toy_gguf_tensor(g, i)->file_offset;
                c.seconds = now() - t0;
                c.maxrss_kb = rss_kb() - rss0;
                toy_gguf_close(g);
            }
        } else {
            int fd = open(path, O_RDONLY);
            off_t size = lseek(fd, 0, SEEK_END);
            lseek(fd, 0, SEEK_SET);
            char *buf = malloc((size_t)size);
            size_t got = 0;
            ssize_t k;
            while (got < (size_t)size && (k = read(fd, buf + got, (size_t)size - got)) > 0) got += (size_t)k;
            c.check = buf[got / 2];
            c.seconds = now() - t0;
            c.maxrss_kb = rss_kb() - rss0;
            free(buf);
            close(fd);
        }
        if (write(fds[1], &c, sizeof c) != sizeof c) _exit(1);
        _exit(0);
    }
    close(fds[1]);
    if (read(fds[0], &r, sizeof r) != sizeof r) r.seconds = -1;
    close(fds[0]);
    waitpid(pid, NULL, 0);
    return r;
}

static double best_of(int reps, double (*fn)(void *), void *ctx) {
    double best = 1e30;
    for (int i = 0; i < reps; i++) {
        double t = fn(ctx);
        if (t < best) best = t;
    }
    return best;
}

struct qctx {
    enum toy_dtype t;
    float *x, *y;
    void *q;
    int64_t n;
};

static double time_quant(void *p) {
    struct qctx *c = p;
    double t0 = now();
    toy_quantize_row(c->t, c->x, c->q, c->n);
    return now() - t0;
}

static double time_dequant(void *p) {
    struct qctx *c = p;
    double t0 = now();
    toy_dequantize_row(c->t, c->q, c->y, c->n);
    return now() - t0;
}

static double time_memcpy(void *p) {
    struct qctx *c = p;
    double t0 = now();
    memcpy(c->y, c->x, (size_t)c->n * 4);
    return now() - t0;
}

int main(int argc, char **argv) {
    int mb = argc > 1 ? atoi(argv[1]) : 500;
    char path[256];
    snprintf(path, sizeof path, "/tmp/toy-bench-gguf-%d.gguf", (int)getpid());

    /* ---- write ---- */
    const int64_t ne[2] = {4096, 640}; /* 10.5 MB per tensor */
    const size_t tbytes = (size_t)ne[0] * (size_t)ne[1] * 4;
    int nt = (int)((size_t)mb * 1000000 / tbytes);
    if (nt < 1) nt = 1;
    struct toy_gguf_writer *w;
    toy_gguf_writer_init(&w);
    toy_gguf_writer_set_str(w, "general.architecture", "llama");
    for (int i = 0; i < nt; i++) {
        char name[64];
        snprintf(name, sizeof name, "blk.%d.ffn_up.weight", i);
        toy_gguf_writer_add_tensor_fn(w, name, TOY_F32, 2, ne, fill, (void *)(uintptr_t)(i + 1));
    }
    double t0 = now();
    if (toy_gguf_writer_write(w, path)) {
        fprintf(stderr, "bench-gguf: %s\n", toy_last_error());
        return 1;
    }
    double t_write = now() - t0;
    toy_gguf_writer_free(w);
    /* peer: one write() of the same number of bytes from a ready buffer */
    char ppath[300];
    snprintf(ppath, sizeof ppath, "%s.peer", path);
    size_t total = tbytes * (size_t)nt;
    char *buf = malloc(tbytes);
    fill(NULL, buf, tbytes);
    t0 = now();
    int fd = open(ppath, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    for (int i = 0; i < nt; i++)
        if (write(fd, buf, tbytes) != (ssize_t)tbytes) break;
    fsync(fd);
    close(fd);
    double t_peer_write = now() - t0;
    unlink(ppath);
    free(buf);
    printf("gguf write: %d tensors, %.0f MB: %.0f MB/s (incl. generating the data, fsync, rename); "
           "plain write()+fsync %.0f MB/s; ratio %.2f\n",
           nt, total / 1e6, total / 1e6 / t_write, total / 1e6 / t_peer_write, t_peer_write / t_write);

    /* ---- open ---- */
    struct child_result best_open = {1e30, 0, 0}, best_read = {1e30, 0, 0};
    for (int rep = 0; rep < 3; rep++) {
        struct child_result a = in_child(0, path), b = in_child(1, path);
        if (a.seconds < best_open.seconds) best_open = a;
        if (b.seconds < best_read.seconds) best_read = b;
    }
    printf("gguf open: %.0f MB file ready in %.3f ms, RSS +%.2f MB (mmap, zero copy); "
           "read() into memory %.1f ms, RSS +%.1f MB; open is %.0fx faster, %.0fx less memory\n",
           total / 1e6, best_open.seconds * 1e3, best_open.maxrss_kb / 1024.0, best_read.seconds * 1e3,
           best_read.maxrss_kb / 1024.0, best_read.seconds / best_open.seconds,
           (double)best_read.maxrss_kb / (double)(best_open.maxrss_kb ? best_open.maxrss_kb : 1));
    unlink(path);

    /* ---- quantize / dequantize ---- */
    const int64_t n = 1 << 22; /* 16 MB of f32 */
    struct qctx c = {0};
    c.n = n;
    c.x = malloc((size_t)n * 4);
    c.y = malloc((size_t)n * 4);
    c.q = malloc((size_t)n * 4);
    fill((void *)7, c.x, (size_t)n * 4);
    for (int64_t i = 0; i < n; i++) c.x[i] *= 3.0f;
    memcpy(c.y, c.x, (size_t)n * 4);
    double t_copy = best_of(5, time_memcpy, &c);
    printf("quant: memcpy of %.0f MB f32: %.2f GB/s (the peer for the ratios below)\n", n * 4 / 1e6, n * 4 / 1e9 / t_copy);
    enum toy_dtype types[] = {TOY_F16, TOY_BF16, TOY_Q8_0, TOY_Q4_0, TOY_Q4_1, TOY_Q5_0, TOY_Q5_1,
                              TOY_Q2_K, TOY_Q3_K, TOY_Q4_K, TOY_Q5_K, TOY_Q6_K, TOY_Q8_K, TOY_IQ4_NL, TOY_IQ4_XS, TOY_MXFP4};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        c.t = types[i];
        char qs[64] = "-";
        if (toy_can_quantize(c.t)) {
            double tq = best_of(c.t == TOY_Q4_K || c.t == TOY_Q5_K ? 2 : 3, time_quant, &c);
            snprintf(qs, sizeof qs, "%6.3f GB/s (%.3fx memcpy)", n * 4 / 1e9 / tq, t_copy / tq);
        } else {
            /* no quantizer: dequantize whatever bytes are there */
            for (size_t k = 0; k < toy_row_bytes(c.t, n); k++) ((uint8_t *)c.q)[k] = (uint8_t)(k * 7);
            if (c.t == TOY_Q8_K)
                for (int64_t b = 0; b < n / 256; b++) { float d = 0.01f; memcpy((uint8_t *)c.q + b * 292, &d, 4); }
            /* normal (not denormal, not NaN) f16 scales so timing is the kernel's */
            const uint16_t h = 0x2000;
            const size_t bs = toy_dtype_type_size(c.t);
            for (int64_t b = 0; b < n / toy_dtype_block_size(c.t); b++) {
                uint8_t *blk = (uint8_t *)c.q + (size_t)b * bs;
                if (c.t == TOY_Q2_K) { memcpy(blk + 80, &h, 2); memcpy(blk + 82, &h, 2); }
                if (c.t == TOY_Q3_K) memcpy(blk + 108, &h, 2);
                if (c.t == TOY_IQ4_NL || c.t == TOY_IQ4_XS) memcpy(blk, &h, 2);
            }
        }
        double td = best_of(3, time_dequant, &c);
        printf("quant %-5s quantize %-32s dequantize %6.2f GB/s (%.2fx memcpy)\n", toy_dtype_name(c.t), qs,
               n * 4 / 1e9 / td, t_copy / td);
    }
    free(c.x);
    free(c.y);
    free(c.q);
    return 0;
}
