/* dp-agree.c: every rank started alike (dp-agree.h). */
#include "dp-agree.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "toy/status.h"

uint64_t toy_cli_hash(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

uint64_t toy_cli_hash_json(json_t *j) {
    char *s = j ? json_dumps(j, JSON_SORT_KEYS | JSON_COMPACT) : NULL;
    uint64_t h = s ? toy_cli_hash(TOY_CLI_HASH0, s, strlen(s)) : 0;
    free(s);
    json_decref(j);
    return h;
}

uint64_t toy_cli_hash_shapes(struct toy_tensor *const *t, int n) {
    uint64_t h = TOY_CLI_HASH0;
    for (int i = 0; i < n; i++) {
        h = toy_cli_hash(h, t[i]->name, strlen(t[i]->name) + 1);
        h = toy_cli_hash(h, &t[i]->type, sizeof t[i]->type);
        h = toy_cli_hash(h, t[i]->ne, sizeof t[i]->ne);
    }
    return h;
}

uint64_t toy_cli_hash_gguf(const struct toy_gguf *g) {
    uint64_t h = TOY_CLI_HASH0;
    for (int64_t i = 0; g && i < toy_gguf_n_tensors(g); i++) {
        const struct toy_gguf_tensor *t = toy_gguf_tensor(g, i);
        h = toy_cli_hash(h, t->name, strlen(t->name) + 1);
        h = toy_cli_hash(h, &t->type, sizeof t->type);
        h = toy_cli_hash(h, t->ne, sizeof t->ne);
        for (size_t k = 0; k < 16 && t->nbytes >= 8; k++) /* 8 bytes at 16 places, the last one included */
            h = toy_cli_hash(h, (const char *)t->data + (t->nbytes - 8) * k / 15, 8);
    }
    return h;
}

int toy_cli_dp_input(const char *cmd, const char *flag, const char *path, int world) {
    struct stat sb;
    if (world <= 1 || !path) return 0;
    if (strcmp(path, "-") && (stat(path, &sb) || S_ISREG(sb.st_mode) || S_ISDIR(sb.st_mode))) return 0;
    fprintf(stderr, "toy %s: %s %s is a pipe or a device: under mpirun only rank 0 reads it (the others read "
            "/dev/null), and every rank reads %s itself; give a file\n", cmd, flag, path, flag);
    return 2;
}

void toy_cli_rank_error(const char *cmd, int rank, int world) {
    const char *e = toy_last_error();
    if (!strncmp(e, "rank ", 5)) fprintf(stderr, "toy %s: %s\n", cmd, e);
    else fprintf(stderr, "toy %s: rank %d of %d: %s\n", cmd, rank, world, e);
}

int toy_cli_dp_agree(const char *cmd, struct toy_collective *coll, const struct toy_cli_agree *items, int n) {
    int rank = toy_collective_rank(coll), world = toy_collective_world(coll), rc = 0;
    for (int i = 0; i < n; i++) {
        int differ;
        bool self;
        if (toy_collective_agree(coll, items[i].hash, &differ, &self)) {
            toy_cli_rank_error(cmd, rank, world);
            return 1;
        }
        if (!differ) continue;
        if (rank == 0)
            fprintf(stderr, "toy %s: the ranks were started with other %s: %d of %d rank(s) differ from rank 0; give "
                    "every rank the same flags and files (mpirun -np N toy %s ...)\n", cmd, items[i].what, differ,
                    world, cmd);
        else if (self)
            fprintf(stderr, "toy %s: rank %d of %d: its %s differ from rank 0's\n", cmd, rank, world, items[i].what);
        rc = 2;
    }
    return rc;
}
