/* toy.c: the `toy` command: dispatches to cmd-*.c. Uses only include/. */
#include <stdio.h>
#include <string.h>

#include "toy/toy.h"
#include "commands.h"

static const struct toy_command commands[] = {
    TOY_COMMANDS
};

static void usage(FILE *f) {
    fprintf(f, "toy %s: a small, fast transformer framework\n\nusage: toy <command> [args]\n\ncommands:\n",
            TOY_VERSION);
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-14s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "\n`toy <command> --help` shows a command's flags.\n");
}

int main(int argc, char **argv) {
    if (argc < 2) { usage(stderr); return 2; }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
        printf("toy %s\n", TOY_VERSION);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "toy: unknown command '%s' (see toy --help)\n", argv[1]);
    return 2;
}
