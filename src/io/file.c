/* file.c: whole-file replacement (toy/file.h): temp file beside the target,
 * fsync, rename, fsync of the folder; the record of the temp files in
 * progress that a signal handler removes; and reading a file whole, which
 * never seeks (pipes and /dev/stdin read like files). */
#include "toy/file.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* The temp files being written: slots claimed and released with atomics,
 * so that a signal handler may read them at any moment (a slot's path is
 * complete before the slot reads as in use). */
#define TEMP_SLOTS 8
static struct {
    atomic_int used; /* 0 free, 2 being filled, 1 in use */
    char path[4160];
} temps[TEMP_SLOTS];

static int temp_track(const char *path) {
    if (strlen(path) >= sizeof temps[0].path) return -1;
    for (int i = 0; i < TEMP_SLOTS; i++) {
        int expect = 0;
        if (atomic_compare_exchange_strong(&temps[i].used, &expect, 2)) {
            strcpy(temps[i].path, path);
            atomic_store(&temps[i].used, 1);
            return i;
        }
    }
    return -1; /* untracked: still written and renamed, only not removed on a signal */
}

static void temp_untrack(int slot) {
    if (slot >= 0) atomic_store(&temps[slot].used, 0);
}

void toy_file_remove_temps(void) {
    for (int i = 0; i < TEMP_SLOTS; i++)
        if (atomic_load(&temps[i].used) == 1) unlink(temps[i].path);
}

enum toy_status toy_file_replace_begin(const char *path, struct toy_file_replace *r) {
    if (!r) return toy_error(TOY_ERR_INVALID_ARG, "toy_file_replace_begin: r is NULL");
    memset(r, 0, sizeof *r);
    r->slot = -1;
    r->name = path;
    if (!path || !*path || !strcmp(path, "-"))
        return toy_error(TOY_ERR_INVALID_ARG, "'%s': needs a file path", path ? path : "");
    mode_t mode = 0;
    struct stat sb, lb;
    const char *target = path;
    char real[PATH_MAX];
    if (lstat(path, &lb) == 0) {
        if (S_ISLNK(lb.st_mode)) { /* written through: the link stays, its file is replaced */
            if (stat(path, &sb) != 0 || !realpath(path, real))
                return toy_error(TOY_ERR_IO, "%s: a symbolic link to a file that does not exist", path);
            target = real;
        } else {
            sb = lb;
        }
        if (!S_ISREG(sb.st_mode))
            return toy_error(TOY_ERR_IO, "%s: not a regular file (%s): give the path of a file to write", path,
                             S_ISDIR(sb.st_mode) ? "a folder" : S_ISFIFO(sb.st_mode) ? "a pipe" : "a device or socket");
        mode = sb.st_mode & 07777;
    }
    if (snprintf(r->path, sizeof r->path, "%s", target) >= (int)sizeof r->path ||
        snprintf(r->tmp, sizeof r->tmp, "%s.tmp.%ld", r->path, (long)getpid()) >= (int)sizeof r->tmp)
        return toy_error(TOY_ERR_RANGE, "%s: path too long", path);
    r->slot = temp_track(r->tmp);
    int fd = open(r->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666); /* a new file: as the umask says */
    if (fd < 0) {
        enum toy_status st = toy_error(TOY_ERR_IO, "%s: cannot create it: %s", path, strerror(errno));
        temp_untrack(r->slot);
        r->slot = -1;
        return st;
    }
    if (mode && fchmod(fd, mode) != 0) {} /* best effort: the new file as the old one was */
    if (!(r->f = fdopen(fd, "wb"))) {
        close(fd);
        unlink(r->tmp);
        temp_untrack(r->slot);
        r->slot = -1;
        return toy_error(TOY_ERR_NOMEM, "%s: fdopen", path);
    }
    return TOY_OK;
}

static void fsync_dir(const char *path) {
    char dir[4096];
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if (slash == path) snprintf(dir, sizeof dir, "/");
    else snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        if (fsync(fd) != 0) {} /* best effort: some filesystems refuse */
        close(fd);
    }
}

enum toy_status toy_file_replace_end(struct toy_file_replace *r, bool ok) {
    if (!r->f) return toy_error(TOY_ERR_STATE, "%s: not being written", r->name ? r->name : "file");
    int err = errno; /* !ok: what the caller's failed write left */
    enum toy_status st = TOY_OK;
    const char *why = ok ? NULL : strerror(err ? err : EIO);
    if (ok && (fflush(r->f) != 0 || ferror(r->f))) why = strerror(errno ? errno : EIO);
    if (ok && !why && fsync(fileno(r->f)) != 0) why = strerror(errno);
    if (fclose(r->f) != 0 && ok && !why) why = strerror(errno);
    r->f = NULL;
    if (ok && !why && rename(r->tmp, r->path) != 0) why = strerror(errno);
    if (why) st = toy_error(TOY_ERR_IO, "%s: write: %s", r->name, why);
    if (!ok || why) unlink(r->tmp);
    else fsync_dir(r->path);
    temp_untrack(r->slot);
    r->slot = -1;
    return st;
}

void toy_file_replace_abort(struct toy_file_replace *r) {
    if (r->f) fclose(r->f);
    r->f = NULL;
    unlink(r->tmp);
    temp_untrack(r->slot);
    r->slot = -1;
}

double toy_ram_bytes(void) { return (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE); }

enum toy_status toy_file_read_all(const char *path, char **buf, size_t *len) {
    if (!buf || !len) return toy_error(TOY_ERR_INVALID_ARG, "toy_file_read_all: %s is NULL", buf ? "len" : "buf");
    *buf = NULL;
    *len = 0;
    if (!path) return toy_error(TOY_ERR_INVALID_ARG, "toy_file_read_all: NULL path");
    bool std_in = !strcmp(path, "-");
    int fd = std_in ? STDIN_FILENO : open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return toy_error(TOY_ERR_IO, "%s: %s", path, strerror(errno));
    enum toy_status st = toy_file_read_fd(fd, path, buf, len);
    if (!std_in) close(fd);
    return st;
}

enum toy_status toy_file_read_fd(int fd, const char *name, char **buf, size_t *len) {
    if (!buf || !len) return toy_error(TOY_ERR_INVALID_ARG, "toy_file_read_fd: %s is NULL", buf ? "len" : "buf");
    *buf = NULL;
    *len = 0;
    struct stat sb;
    /* a regular file's size is a hint for the first buffer only: it is read to its end like a pipe */
    size_t cap = 1 << 16;
    if (fstat(fd, &sb) == 0) {
        if (S_ISDIR(sb.st_mode)) return toy_error(TOY_ERR_IO, "%s: is a directory", name);
        if (S_ISREG(sb.st_mode) && sb.st_size > 0 && (uint64_t)sb.st_size < SIZE_MAX - 1)
            cap = (size_t)sb.st_size + 1;
    }
    char *b = malloc(cap);
    if (!b) return toy_error(TOY_ERR_NOMEM, "%s: out of memory (%zu bytes)", name, cap);
    size_t n = 0;
    for (;;) {
        if (n == cap) { /* grow by half, checked: a stream has no size to trust */
            size_t more = cap / 2 > 1 << 16 ? cap / 2 : 1 << 16;
            char *p = cap <= SIZE_MAX - more ? realloc(b, cap + more) : NULL;
            if (!p) { free(b); return toy_error(TOY_ERR_NOMEM, "%s: out of memory after %zu bytes", name, n); }
            b = p;
            cap += more;
        }
        ssize_t r = read(fd, b + n, cap - n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            enum toy_status st = toy_error(TOY_ERR_IO, "%s: read error after %zu bytes: %s", name, n, strerror(errno));
            free(b);
            return st;
        }
        if (r == 0) break;
        n += (size_t)r;
    }
    if (n == cap) { /* room for the NUL */
        char *p = realloc(b, cap + 1);
        if (!p) { free(b); return toy_error(TOY_ERR_NOMEM, "%s: out of memory after %zu bytes", name, n); }
        b = p;
    }
    b[n] = 0;
    *buf = b;
    *len = n;
    return TOY_OK;
}

enum toy_status toy_file_bytes_open(const char *path, struct toy_file_bytes *b) {
    if (!b) return toy_error(TOY_ERR_INVALID_ARG, "toy_file_bytes_open: b is NULL");
    memset(b, 0, sizeof *b);
    if (!path) return toy_error(TOY_ERR_INVALID_ARG, "toy_file_bytes_open: NULL path");
    bool std_in = !strcmp(path, "-");
    int fd = std_in ? STDIN_FILENO : open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return toy_error(TOY_ERR_IO, "%s: %s", path, strerror(errno));
    enum toy_status st = TOY_OK;
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        st = toy_error(TOY_ERR_IO, "%s: %s", path, strerror(errno));
    } else if (!S_ISREG(sb.st_mode)) { /* a pipe, FIFO or device cannot be mapped (a folder: read_fd says so) */
        if (!(st = toy_file_read_fd(fd, path, &b->buf, &b->n))) b->p = (const unsigned char *)b->buf;
    } else if ((uint64_t)sb.st_size > SIZE_MAX) {
        st = toy_error(TOY_ERR_RANGE, "%s: %lld bytes do not fit in memory", path, (long long)sb.st_size);
    } else if (sb.st_size == 0) {
        b->p = (const unsigned char *)"";
    } else {
        void *m = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) st = toy_error(TOY_ERR_IO, "%s: mmap: %s", path, strerror(errno));
        else b->map = m, b->p = m, b->n = (size_t)sb.st_size;
    }
    if (!std_in) close(fd);
    return st;
}

void toy_file_bytes_close(struct toy_file_bytes *b) {
    if (b->map) munmap(b->map, b->n);
    free(b->buf);
    memset(b, 0, sizeof *b);
}
