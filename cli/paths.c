/* paths.c: absolute paths for saved options, and input checks (paths.h). */
#include "paths.h"

#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "toy/chat-template.h"
#include "toy/file.h"
#include "toy/models.h"
#include "toy/status.h"

const char *toy_cli_template_source(const char *arg, char **owned) {
    *owned = NULL;
    if (!arg || toy_chat_template_builtin(arg) || strstr(arg, "{%") || strstr(arg, "{{")) return arg;
    struct stat sb;
    size_t n;
    if ((strcmp(arg, "-") && (stat(arg, &sb) || S_ISDIR(sb.st_mode))) || toy_file_read_all(arg, owned, &n)) {
        *owned = NULL;
        return arg;
    }
    return *owned;
}

const char *toy_cli_abspath(const char *p, char *buf, size_t n) {
    char full[PATH_MAX];
    if (!p || !realpath(p, full) || strlen(full) >= n) return p;
    memcpy(buf, full, strlen(full) + 1);
    return buf;
}

int toy_cli_check_input(const char *cmd, const char *path) {
    if (!strcmp(path, "-")) return 0;
    struct stat sb;
    const char *why = stat(path, &sb) ? strerror(errno) : S_ISDIR(sb.st_mode) ? "is a directory"
                      : access(path, R_OK) ? strerror(errno) : NULL;
    if (!why) return 0;
    fprintf(stderr, "toy %s: %s: %s\n", cmd, path, why);
    return 1;
}

/* the stream path names, when it is one (not a regular file or a folder) */
static bool stream_of(const char *path, struct stat *sb) {
    if (!strcmp(path, "-")) return fstat(STDIN_FILENO, sb) == 0 && !S_ISREG(sb->st_mode) && !S_ISDIR(sb->st_mode);
    return stat(path, sb) == 0 && !S_ISREG(sb->st_mode) && !S_ISDIR(sb->st_mode);
}

int toy_cli_one_stream(const char *cmd, const char *flag_a, const char *a, const char *flag_b, const char *b) {
    if (!a || !b) return 0;
    struct stat sa, sb;
    bool same = (!strcmp(a, "-") && !strcmp(b, "-")) ||
                (stream_of(a, &sa) && stream_of(b, &sb) && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino);
    if (!same) return 0;
    fprintf(stderr, "toy %s: %s %s and %s %s both read one stream, which can be read only once; give one of them as a "
            "file\n", cmd, flag_a, a, flag_b, b);
    return 1;
}

const char *toy_cli_tokenizer_source(const char *cmd, const char *q, char *buf, size_t n) {
    struct stat sb;
    if (stat(q, &sb) == 0) return q;
    if (toy_model_resolve(q, buf, n)) {
        fprintf(stderr, "toy %s: %s\n", cmd, toy_last_error());
        return NULL;
    }
    return buf;
}
