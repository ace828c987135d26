/* cli-error.c: the library's message without a repeat of the command's
 * name (cli-error.h). */
#include "cli-error.h"

#include <stdbool.h>
#include <string.h>
#include <unistd.h>

#include "toy/status.h"

/* the names library messages open with that are also commands' (or their labels') */
static const char *const areas[] = {"tokenizer", "chat template", "quantize", NULL};

/* w[0..wn) of a label is `area`, a dash in it matching a space */
static bool names(const char *w, size_t wn, const char *area) {
    if (wn != strlen(area)) return false;
    for (size_t i = 0; i < wn; i++)
        if ((w[i] == '-' ? ' ' : w[i]) != area[i]) return false;
    return true;
}

/* Is `area` the label or one of its words (split at spaces and colons)? */
static bool in_label(const char *label, const char *area) {
    if (names(label, strlen(label), area)) return true;
    for (const char *w = label; *w;) {
        size_t wn = strcspn(w, " :");
        if (names(w, wn, area)) return true;
        w += wn;
        w += strspn(w, " :");
    }
    return false;
}

const char *toy_cli_unprefixed(const char *label, const char *msg) {
    if (!msg) return "";
    if (!label) return msg;
    for (int i = 0; areas[i]; i++) {
        size_t n = strlen(areas[i]);
        if (strncmp(msg, areas[i], n) || strncmp(msg + n, ": ", 2) || !in_label(label, areas[i])) continue;
        if (access(areas[i], F_OK) == 0) return msg; /* a file of that name: the message may be about it */
        return msg + n + 2;
    }
    return msg;
}

const char *toy_cli_error(const char *label) { return toy_cli_unprefixed(label, toy_last_error()); }
