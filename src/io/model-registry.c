/* model-registry.c: `toy models` and `-m NAME`: finds GGUF files in the
 * places users keep them (see include/toy/models.h for the list and the
 * naming). Layouts: Hugging Face hub cache (models--ORG--REPO/snapshots/
 * REV/FILE -> ../../blobs/HASH), Ollama (manifests/HOST/NS/NAME/TAG, a
 * JSON manifest whose layer of mediaType application/vnd.ollama.image.model
 * names blobs/sha256-HEX), LM Studio (models/PUBLISHER/REPO/FILE.gguf).
 * Files are identified by (device, inode) so links are listed once. */
#include "toy/models.h"
#include "toy/gguf.h"

#include <dirent.h>
#include <jansson.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

const char *toy_file_type_name(uint32_t ft) {
    static const char *const names[] = {
        [0] = "F32", [1] = "F16", [2] = "Q4_0", [3] = "Q4_1", [7] = "Q8_0", [8] = "Q5_0", [9] = "Q5_1",
        [10] = "Q2_K", [11] = "Q3_K_S", [12] = "Q3_K_M", [13] = "Q3_K_L", [14] = "Q4_K_S", [15] = "Q4_K_M",
        [16] = "Q5_K_S", [17] = "Q5_K_M", [18] = "Q6_K", [19] = "IQ2_XXS", [20] = "IQ2_XS", [21] = "Q2_K_S",
        [22] = "IQ3_XS", [23] = "IQ3_XXS", [24] = "IQ1_S", [25] = "IQ4_NL", [26] = "IQ3_S", [27] = "IQ3_M",
        [28] = "IQ2_S", [29] = "IQ2_M", [30] = "IQ4_XS", [31] = "IQ1_M", [32] = "BF16", [36] = "TQ1_0",
        [37] = "TQ2_0", [38] = "MXFP4_MOE",
    };
    if (ft < sizeof names / sizeof names[0] && names[ft]) return names[ft];
    return "unknown";
}

/* Paths longer than PATH_MAX are truncated and then simply not found. */
__attribute__((format(printf, 3, 4))) static void fmt_into(char *buf, size_t n, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, n, fmt, ap);
    va_end(ap);
}
#define FMT(buf, ...) fmt_into(buf, sizeof buf, __VA_ARGS__)

struct list {
    struct toy_model_entry *e;
    int64_t n, cap;
    struct { dev_t dev; ino_t ino; } *ids;
};

static bool ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

static void add(struct list *l, const char *name, const char *path, const char *source) {
    struct stat sb;
    if (stat(path, &sb) || !S_ISREG(sb.st_mode)) return;
    for (int64_t i = 0; i < l->n; i++)
        if (l->ids[i].dev == sb.st_dev && l->ids[i].ino == sb.st_ino) return;
    struct toy_gguf *g;
    if (toy_gguf_open(path, &g)) return;
    if (l->n == l->cap) {
        int64_t cap = l->cap ? l->cap * 2 : 16;
        void *e = realloc(l->e, (size_t)cap * sizeof *l->e), *ids = realloc(l->ids, (size_t)cap * sizeof *l->ids);
        if (e) l->e = e;
        if (ids) l->ids = ids;
        if (!e || !ids) { toy_gguf_close(g); return; }
        l->cap = cap;
    }
    struct toy_model_entry *m = &l->e[l->n];
    memset(m, 0, sizeof *m);
    snprintf(m->name, sizeof m->name, "%s", name);
    char real[PATH_MAX];
    snprintf(m->path, sizeof m->path, "%s", realpath(path, real) ? real : path);
    snprintf(m->source, sizeof m->source, "%s", source);
    const char *arch;
    if (!toy_gguf_get_str(g, "general.architecture", &arch, NULL)) snprintf(m->arch, sizeof m->arch, "%s", arch);
    for (int64_t i = 0; i < toy_gguf_n_tensors(g); i++) m->n_params += toy_gguf_tensor(g, i)->n_elements;
    if (toy_gguf_get_u32(g, "general.file_type", &m->file_type)) m->file_type = UINT32_MAX;
    m->size = (uint64_t)sb.st_size;
    l->ids[l->n].dev = sb.st_dev;
    l->ids[l->n].ino = sb.st_ino;
    l->n++;
    toy_gguf_close(g);
}

/* *.gguf under dir (depth-limited); names are paths relative to root
 * without the extension. */
static void scan_dir(struct list *l, const char *root, const char *rel, int depth, const char *source) {
    char dir[PATH_MAX];
    FMT(dir, "%s%s%s", root, *rel ? "/" : "", rel);
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char path[PATH_MAX], sub[PATH_MAX];
        FMT(path, "%s/%s", dir, e->d_name);
        FMT(sub, "%s%s%s", rel, *rel ? "/" : "", e->d_name);
        struct stat sb;
        if (stat(path, &sb)) continue;
        if (S_ISDIR(sb.st_mode) && depth > 0) scan_dir(l, root, sub, depth - 1, source);
        else if (S_ISREG(sb.st_mode) && ends_with(e->d_name, ".gguf")) {
            sub[strlen(sub) - 5] = 0;
            add(l, sub, path, source);
        }
    }
    closedir(d);
}

static void scan_hf(struct list *l, const char *hub) {
    DIR *d = opendir(hub);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, "models--", 8)) continue;
        /* models--ORG--REPO -> ORG/REPO */
        char repo[512];
        FMT(repo, "%s", e->d_name + 8);
        char *sep = strstr(repo, "--");
        if (sep) { sep[0] = '/'; memmove(sep + 1, sep + 2, strlen(sep + 2) + 1); }
        char snaps[PATH_MAX];
        FMT(snaps, "%s/%s/snapshots", hub, e->d_name);
        DIR *s = opendir(snaps);
        if (!s) continue;
        struct dirent *r;
        while ((r = readdir(s))) {
            if (r->d_name[0] == '.') continue;
            char rev[PATH_MAX];
            FMT(rev, "%s/%s", snaps, r->d_name);
            struct list tmp = {0};
            scan_dir(&tmp, rev, "", 3, "huggingface");
            for (int64_t i = 0; i < tmp.n; i++) {
                char name[1024], path[PATH_MAX];
                FMT(name, "%s/%s", repo, tmp.e[i].name);
                FMT(path, "%s", tmp.e[i].path);
                add(l, name, path, "huggingface");
            }
            free(tmp.e);
            free(tmp.ids);
        }
        closedir(s);
    }
    closedir(d);
}

/* manifests/HOST/NS/NAME/TAG */
static void scan_ollama(struct list *l, const char *root) {
    char mroot[PATH_MAX];
    FMT(mroot, "%s/manifests", root);
    DIR *hosts = opendir(mroot);
    if (!hosts) return;
    struct dirent *h;
    while ((h = readdir(hosts))) {
        if (h->d_name[0] == '.') continue;
        char hp[PATH_MAX];
        FMT(hp, "%s/%s", mroot, h->d_name);
        DIR *nss = opendir(hp);
        if (!nss) continue;
        struct dirent *ns;
        while ((ns = readdir(nss))) {
            if (ns->d_name[0] == '.') continue;
            char np[PATH_MAX];
            FMT(np, "%s/%s", hp, ns->d_name);
            DIR *models = opendir(np);
            if (!models) continue;
            struct dirent *m;
            while ((m = readdir(models))) {
                if (m->d_name[0] == '.') continue;
                char mp[PATH_MAX];
                FMT(mp, "%s/%s", np, m->d_name);
                DIR *tags = opendir(mp);
                if (!tags) continue;
                struct dirent *t;
                while ((t = readdir(tags))) {
                    if (t->d_name[0] == '.') continue;
                    char tp[PATH_MAX];
                    FMT(tp, "%s/%s", mp, t->d_name);
                    json_t *man = json_load_file(tp, 0, NULL);
                    json_t *layers = json_object_get(man, "layers");
                    size_t i;
                    json_t *layer;
                    json_array_foreach(layers, i, layer) {
                        const char *mt = json_string_value(json_object_get(layer, "mediaType"));
                        const char *dg = json_string_value(json_object_get(layer, "digest"));
                        if (!mt || !dg || strcmp(mt, "application/vnd.ollama.image.model")) continue;
                        if (strncmp(dg, "sha256:", 7) || strchr(dg, '/')) continue;
                        char blob[PATH_MAX], name[512];
                        FMT(blob, "%s/blobs/sha256-%s", root, dg + 7);
                        struct stat sb;
                        if (stat(blob, &sb)) FMT(blob, "%s/blobs/%s", root, dg);
                        if (!strcmp(ns->d_name, "library"))
                            FMT(name, "%s:%s", m->d_name, t->d_name);
                        else
                            FMT(name, "%s/%s:%s", ns->d_name, m->d_name, t->d_name);
                        add(l, name, blob, "ollama");
                    }
                    json_decref(man);
                }
                closedir(tags);
            }
            closedir(models);
        }
        closedir(nss);
    }
    closedir(hosts);
}

static int by_name(const void *a, const void *b) {
    return strcmp(((const struct toy_model_entry *)a)->name, ((const struct toy_model_entry *)b)->name);
}

enum toy_status toy_models_list(struct toy_model_entry **out, int64_t *n) {
    struct list l = {0};
    const char *home = getenv("HOME");
    char p[PATH_MAX];
    const char *env = getenv("TOY_MODEL_DIR");
    if (env && *env) scan_dir(&l, env, "", 4, "dir");
    scan_dir(&l, "models", "", 4, "models");
    if ((env = getenv("HF_HUB_CACHE")) && *env) scan_hf(&l, env);
    else if ((env = getenv("HF_HOME")) && *env) { FMT(p, "%s/hub", env); scan_hf(&l, p); }
    else if (home) { FMT(p, "%s/.cache/huggingface/hub", home); scan_hf(&l, p); }
    if ((env = getenv("OLLAMA_MODELS")) && *env) scan_ollama(&l, env);
    else if (home) { FMT(p, "%s/.ollama/models", home); scan_ollama(&l, p); }
    if (home) {
        FMT(p, "%s/.lmstudio/models", home);
        scan_dir(&l, p, "", 3, "lmstudio");
        FMT(p, "%s/.cache/lm-studio/models", home);
        scan_dir(&l, p, "", 3, "lmstudio");
    }
    if (l.n > 1) {
        /* keep discovery order within a source; sort by name for display */
        qsort(l.e, (size_t)l.n, sizeof *l.e, by_name);
    }
    free(l.ids);
    *out = l.e ? l.e : calloc(1, sizeof **out);
    *n = l.n;
    return *out ? TOY_OK : toy_error(TOY_ERR_NOMEM, "models: out of memory");
}

enum toy_status toy_model_resolve(const char *q, char *path, size_t path_size) {
    struct stat sb;
    if (stat(q, &sb) == 0 && S_ISREG(sb.st_mode)) {
        if ((size_t)snprintf(path, path_size, "%s", q) >= path_size)
            return toy_error(TOY_ERR_RANGE, "model path '%s' does not fit %zu bytes", q, path_size);
        return TOY_OK;
    }
    struct toy_model_entry *m;
    int64_t n;
    enum toy_status e = toy_models_list(&m, &n);
    if (e) return e;
    int64_t hit = -1, n_hits = 0;
    for (int64_t i = 0; i < n; i++)
        if (!strcmp(m[i].name, q)) { hit = i; n_hits = 1; break; }
    if (hit < 0) {
        size_t ql = strlen(q);
        for (int64_t i = 0; i < n; i++) {
            const char *nm = m[i].name;
            size_t nl = strlen(nm);
            bool suffix = nl > ql && nm[nl - ql - 1] == '/' && !strcmp(nm + nl - ql, q);
            bool prefix = nl > ql && !strncmp(nm, q, ql) && (nm[ql] == ':' || nm[ql] == '/');
            if (suffix || prefix) { hit = i; n_hits++; }
        }
    }
    if (n_hits == 1) {
        bool fits = (size_t)snprintf(path, path_size, "%s", m[hit].path) < path_size;
        free(m);
        return fits ? TOY_OK : toy_error(TOY_ERR_RANGE, "the path of model '%s' does not fit %zu bytes", q, path_size);
    }
    char msg[768] = "";
    size_t used = 0;
    for (int64_t i = 0; i < n && used < sizeof msg - 64; i++)
        used += (size_t)snprintf(msg + used, sizeof msg - used, "%s%s", used ? ", " : "", m[i].name);
    free(m);
    if (n_hits > 1) return toy_error(TOY_ERR_INVALID_ARG, "model '%s' is ambiguous; known: %s", q, msg);
    if (stat(q, &sb) == 0 && S_ISDIR(sb.st_mode))
        return toy_error(TOY_ERR_INVALID_ARG, "%s is a directory, not a GGUF file (a Hugging Face folder: toy convert "
                         "it first)", q);
    return toy_error(TOY_ERR_NOT_FOUND, "model '%s': no such file and no such name (known: %s)", q,
                     *msg ? msg : "none; see `toy models`");
}
