/* toy.c: the `toy` command: dispatches to cmd-*.c. Uses only include/. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "toy/toy.h"
#include "commands.h"
#include "stop-signals.h"

static const struct toy_command commands[] = {
    TOY_COMMANDS
};

static void usage(FILE *f) {
    fprintf(f, "toy %s: a small, fast transformer framework\n\nusage: toy <command> [args]\n\ncommands:\n",
            TOY_VERSION);
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-14s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "\n`toy <command> --help` shows a command's flags; `toy --manifest` lists the commands as JSON.\n"
               "Every command takes --device cpu|cuda|cuda:N (default cpu; see toy devices; under mpirun, cuda is\n"
               "each rank's local GPU).\n");
}

/* toy --manifest: what this toy can be asked, for programs that drive it
 * (format toy/manifest-v1): the version, the commands with their one-line
 * summaries, the global flags and the exit codes. A command's own flags are
 * in its --help. */
static int manifest(void) {
    json_t *cmds = json_array();
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        json_array_append_new(cmds, json_pack("{s:s, s:s}", "name", commands[i].name, "summary", commands[i].help));
    json_t *m = json_pack("{s:s, s:s, s:o, s:[s,s,s,s], s:{s:s, s:s, s:s}, s:b}", "format", "toy/manifest-v1",
                          "version", TOY_VERSION, "commands", cmds, "global_flags", "--help", "--version", "--manifest",
                          "--device", "exit_codes", "0", "ok", "1", "failure (bad file, I/O, a run that failed)", "2",
                          "bad usage (unknown command or flag, missing or bad value)", "cuda_built",
                          toy_cuda_built());
    if (!m) {
        fprintf(stderr, "toy: --manifest: out of memory\n");
        return 1;
    }
    int rc = json_dumpf(m, stdout, JSON_INDENT(2)) ? 1 : 0;
    json_decref(m);
    putchar('\n');
    errno = 0;
    if (fflush(stdout) != 0 || ferror(stdout) || rc) {
        fprintf(stderr, "toy --manifest: cannot write the output: %s\n", errno ? strerror(errno) : "write error");
        return 1;
    }
    return 0;
}

int main(int argc, char **argv) {
    /* past a file-size limit (ulimit -f) a write fails with EFBIG, reported like a full disk, instead of the
     * default SIGXFSZ killing the process mid-checkpoint without a word */
    signal(SIGXFSZ, SIG_IGN);
    toy_cli_cleanup_signals_install();
    if (argc < 2) { usage(stderr); return 2; }
    if (!strcmp(argv[1], "help") && argc >= 3) /* toy help COMMAND: that command's --help */
        for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
            if (!strcmp(argv[2], commands[i].name)) {
                char *args[] = {argv[2], "--help", NULL};
                return commands[i].fn(2, args);
            }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
        printf("toy %s\n", TOY_VERSION);
        return 0;
    }
    if (!strcmp(argv[1], "--manifest")) return manifest();
    /* --device NAME (or --device=NAME), anywhere after the command: where
     * every graph of the command runs; taken out before the command parses */
    int n = 1;
    for (int i = 1; i < argc; i++) {
        const char *dev = NULL;
        if (!strcmp(argv[i], "--device")) {
            if (i + 1 >= argc) { fprintf(stderr, "toy: --device needs a value (cpu, cuda, cuda:N)\n"); return 2; }
            dev = argv[++i];
        } else if (!strncmp(argv[i], "--device=", 9)) {
            dev = argv[i] + 9;
        } else {
            argv[n++] = argv[i];
            continue;
        }
        /* one process per GPU: a bare "cuda" under a launcher is this rank's local GPU */
        const char *lr = getenv("OMPI_COMM_WORLD_LOCAL_RANK") ? getenv("OMPI_COMM_WORLD_LOCAL_RANK")
                         : getenv("MPI_LOCALRANKID")           ? getenv("MPI_LOCALRANKID")
                         : getenv("SLURM_LOCALID")             ? getenv("SLURM_LOCALID")
                                                               : getenv("LOCAL_RANK");
        char local[32];
        if (!strcmp(dev, "cuda") && lr && *lr && toy_cuda_device_count() > 0) {
            snprintf(local, sizeof local, "cuda:%d", atoi(lr) % toy_cuda_device_count());
            dev = local;
        }
        if (toy_device_set_default(dev)) { fprintf(stderr, "toy: %s\n", toy_last_error()); return 1; }
    }
    argc = n;
    argv[argc] = NULL;
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) {
            int rc = commands[i].fn(argc - 1, argv + 1);
            /* output that did not reach its file (a full disk, /dev/full) is a failure, not exit 0 */
            errno = 0;
            if (fflush(stdout) != 0 || ferror(stdout)) {
                fprintf(stderr, "toy %s: cannot write the output: %s\n", argv[1],
                        errno ? strerror(errno) : "write error");
                if (!rc) rc = 1;
            }
            return rc;
        }
    fprintf(stderr, "toy: unknown command '%s' (see toy --help)\n", argv[1]);
    return 2;
}
