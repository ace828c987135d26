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
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
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

/* Ollama's defaults, left out of the names it shows (types/model/name.go) */
#define OLLAMA_HOST "registry.ollama.ai"
#define OLLAMA_NAMESPACE "library"


/* One file found. Those that toy cannot run as a model are kept too, with
 * e.why set, so that `-m NAME` and `toy models` can say why they are not
 * listed instead of "no such name". */
struct item {
    struct toy_model_entry e;
    char base[256]; /* the name before disambiguation (see unique_names) */
    int64_t order;  /* discovery order: the tie-break that keeps sorting stable */
    bool have_id;
    dev_t dev;
    ino_t ino;
};

struct list {
    struct item *v;
    int64_t n, cap;
};

static bool ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

static struct item *push(struct list *l, const char *name, const char *path, const char *source) {
    if (l->n == l->cap) {
        int64_t cap = l->cap ? l->cap * 2 : 16;
        struct item *v = realloc(l->v, (size_t)cap * sizeof *v);
        if (!v) return NULL;
        l->v = v;
        l->cap = cap;
    }
    struct item *it = &l->v[l->n];
    memset(it, 0, sizeof *it);
    it->order = l->n++;
    snprintf(it->base, sizeof it->base, "%s", name);
    snprintf(it->e.name, sizeof it->e.name, "%s", name);
    char real[PATH_MAX];
    snprintf(it->e.path, sizeof it->e.path, "%s", realpath(path, real) ? real : path);
    snprintf(it->e.source, sizeof it->e.source, "%s", source);
    it->e.file_type = UINT32_MAX;
    return it;
}

/* toy_gguf_open's message starts with the path, which the entry holds already */
static void set_why(struct item *it, const char *path, const char *msg) {
    size_t pl = strlen(path);
    if (!strncmp(msg, path, pl) && !strncmp(msg + pl, ": ", 2)) msg += pl + 2;
    snprintf(it->e.why, sizeof it->e.why, "%s", msg);
}

static void add(struct list *l, const char *name, const char *path, const char *source) {
    struct stat sb, lsb;
    if (stat(path, &sb)) {
        /* a link whose target is gone (a deleted HF blob), a manifest naming a missing blob */
        int err = errno;
        for (int64_t i = 0; i < l->n; i++)
            if (!l->v[i].have_id && !strcmp(l->v[i].e.path, path)) return;
        struct item *it = push(l, name, path, source);
        if (!it) return;
        it->e.unreadable = true;
        if (!lstat(path, &lsb) && S_ISLNK(lsb.st_mode)) snprintf(it->e.why, sizeof it->e.why, "a link to a missing file");
        else snprintf(it->e.why, sizeof it->e.why, "%s", strerror(err));
        return;
    }
    if (!S_ISREG(sb.st_mode)) return;
    for (int64_t i = 0; i < l->n; i++)
        if (l->v[i].have_id && l->v[i].dev == sb.st_dev && l->v[i].ino == sb.st_ino) return;
    struct item *it = push(l, name, path, source);
    if (!it) return;
    it->have_id = true;
    it->dev = sb.st_dev;
    it->ino = sb.st_ino;
    it->e.size = (uint64_t)sb.st_size;
    struct toy_gguf *g;
    if (toy_gguf_open(path, &g)) {
        it->e.unreadable = true;
        set_why(it, path, toy_last_error());
        return;
    }
    struct toy_model_entry *m = &it->e;
    const char *arch, *what;
    if (!toy_gguf_get_str(g, "general.architecture", &arch, NULL)) snprintf(m->arch, sizeof m->arch, "%s", arch);
    for (int64_t i = 0; i < toy_gguf_n_tensors(g); i++) m->n_params += toy_gguf_tensor(g, i)->n_elements;
    if (toy_gguf_get_u32(g, "general.file_type", &m->file_type)) m->file_type = UINT32_MAX;
    /* listed means `toy generate -m NAME` can load it: no adapters, resume states or tokenizer-only files */
    if (!toy_gguf_is_model(g, &what)) snprintf(m->why, sizeof m->why, "%s", what);
    else if (toy_gguf_n_tensors(g) == 0)
        snprintf(m->why, sizeof m->why, "a vocabulary-only file (a tokenizer, no tensors), not a model");
    toy_gguf_close(g);
}

/* *.gguf under dir (depth-limited); names are prefix + the path relative to
 * root without the extension. */
static void scan_dir(struct list *l, const char *root, const char *rel, int depth, const char *source,
                     const char *prefix) {
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
        bool gguf = ends_with(e->d_name, ".gguf");
        if (stat(path, &sb)) {
            /* a *.gguf link to nothing: say so rather than drop it */
            if (gguf && !lstat(path, &sb) && S_ISLNK(sb.st_mode)) sb.st_mode = S_IFREG;
            else continue;
        }
        if (S_ISDIR(sb.st_mode) && depth > 0) scan_dir(l, root, sub, depth - 1, source, prefix);
        else if (S_ISREG(sb.st_mode) && gguf) {
            sub[strlen(sub) - 5] = 0;
            char name[PATH_MAX + 512];
            FMT(name, "%s%s", prefix, sub);
            add(l, name, path, source);
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
        /* models--ORG--REPO -> ORG/REPO/ */
        char repo[512];
        FMT(repo, "%s/", e->d_name + 8);
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
            scan_dir(l, rev, "", 3, "huggingface", repo);
        }
        closedir(s);
    }
    closedir(d);
}

/* manifests/HOST/NS/NAME/TAG, named as Ollama shows them (its
 * Name.DisplayShortest): NAME:TAG in registry.ollama.ai's library,
 * NS/NAME:TAG elsewhere on registry.ollama.ai, HOST/NS/NAME:TAG on any
 * other registry (hf.co/bartowski/Tiny-GGUF:Q4_K_M). */
static void ollama_name(char *buf, size_t n, const char *host, const char *ns, const char *model, const char *tag) {
    if (strcasecmp(host, OLLAMA_HOST)) snprintf(buf, n, "%s/%s/%s:%s", host, ns, model, tag);
    else if (strcasecmp(ns, OLLAMA_NAMESPACE)) snprintf(buf, n, "%s/%s:%s", ns, model, tag);
    else snprintf(buf, n, "%s:%s", model, tag);
}

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
                        char blob[PATH_MAX], name[1024];
                        FMT(blob, "%s/blobs/sha256-%s", root, dg + 7);
                        struct stat sb;
                        if (stat(blob, &sb)) {
                            char old[PATH_MAX]; /* older Ollama: blobs/sha256:HEX */
                            FMT(old, "%s/blobs/%s", root, dg);
                            if (!stat(old, &sb)) FMT(blob, "%s", old);
                        }
                        ollama_name(name, sizeof name, h->d_name, ns->d_name, m->d_name, t->d_name);
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

static int by_base(const void *a, const void *b) {
    const struct item *x = a, *y = b;
    int c = strcmp(x->base, y->base);
    return c ? c : (x->order > y->order) - (x->order < y->order);
}

static int by_name(const void *a, const void *b) {
    const struct item *x = a, *y = b;
    int c = strcmp(x->e.name, y->e.name);
    return c ? c : (x->order > y->order) - (x->order < y->order);
}

/* Distinct files of one name (tiny.gguf in $TOY_MODEL_DIR and another in
 * ./models) get distinct names, so that `-m` never picks one of them
 * silently: SOURCE:NAME ("dir:tiny", "models:tiny"), or, when that is still
 * shared (two Hugging Face revisions, both LM Studio folders), the file's
 * path, which resolves as a path. The bare name is then ambiguous and
 * toy_model_resolve lists the candidates. Listed and left-out files are
 * named separately: an adapter does not make a model's name ambiguous. */
static void unique_names(struct item *v, int64_t n) {
    if (n < 2) return;
    qsort(v, (size_t)n, sizeof *v, by_base);
    for (int64_t i = 0; i < n;) {
        int64_t j = i + 1;
        while (j < n && !strcmp(v[j].base, v[i].base)) j++;
        if (j - i > 1) {
            for (int64_t k = i; k < j; k++) {
                bool same_source = false;
                for (int64_t o = i; o < j; o++)
                    if (o != k && !strcmp(v[o].e.source, v[k].e.source)) same_source = true;
                /* a name past the field (a path of 4 kB) is cut: still unique in practice, and listed in full */
                char *d = v[k].e.name;
                size_t cap = sizeof v[k].e.name, at = 0;
                const char *parts[3] = {same_source ? v[k].e.path : v[k].e.source, same_source ? "" : ":",
                                        same_source ? "" : v[k].base};
                for (int q = 0; q < 3; q++)
                    for (const char *c = parts[q]; *c && at + 1 < cap; c++) d[at++] = *c;
                d[at] = 0;
            }
        }
        i = j;
    }
    qsort(v, (size_t)n, sizeof *v, by_name);
}

/* Every *.gguf found, the models first (*n_models of them), then the files
 * left out, each group with unique names, sorted by name. */
static void scan_all(struct list *l, int64_t *n_models) {
    const char *home = getenv("HOME");
    char p[PATH_MAX];
    const char *env = getenv("TOY_MODEL_DIR");
    if (env && *env) scan_dir(l, env, "", 4, "dir", "");
    scan_dir(l, "models", "", 4, "models", "");
    if ((env = getenv("HF_HUB_CACHE")) && *env) scan_hf(l, env);
    else if ((env = getenv("HF_HOME")) && *env) { FMT(p, "%s/hub", env); scan_hf(l, p); }
    else if (home) { FMT(p, "%s/.cache/huggingface/hub", home); scan_hf(l, p); }
    if ((env = getenv("OLLAMA_MODELS")) && *env) scan_ollama(l, env);
    else if (home) { FMT(p, "%s/.ollama/models", home); scan_ollama(l, p); }
    if (home) {
        FMT(p, "%s/.lmstudio/models", home);
        scan_dir(l, p, "", 3, "lmstudio", "");
        FMT(p, "%s/.cache/lm-studio/models", home);
        scan_dir(l, p, "", 3, "lmstudio", "");
    }
    /* partition, keeping discovery order within each part */
    int64_t k = 0;
    for (int64_t i = 0; i < l->n; i++)
        if (!l->v[i].e.why[0]) {
            struct item t = l->v[i];
            memmove(&l->v[k + 1], &l->v[k], (size_t)(i - k) * sizeof *l->v);
            l->v[k++] = t;
        }
    unique_names(l->v, k);
    unique_names(l->v + k, l->n - k);
    *n_models = k;
}

static enum toy_status entries(struct item *v, int64_t n, struct toy_model_entry **out, int64_t *n_out) {
    *out = calloc((size_t)n + 1, sizeof **out);
    if (!*out) return toy_error(TOY_ERR_NOMEM, "out of memory (model registry)");
    for (int64_t i = 0; i < n; i++) (*out)[i] = v[i].e;
    *n_out = n;
    return TOY_OK;
}

enum toy_status toy_models_list(struct toy_model_entry **out, int64_t *n) {
    if (!out || !n) return toy_error(TOY_ERR_INVALID_ARG, "toy_models_list: %s is NULL", out ? "n" : "out");
    struct list l = {0};
    int64_t k;
    scan_all(&l, &k);
    enum toy_status st = entries(l.v, k, out, n);
    free(l.v);
    return st;
}

enum toy_status toy_models_skipped(struct toy_model_entry **out, int64_t *n) {
    if (!out || !n) return toy_error(TOY_ERR_INVALID_ARG, "toy_models_skipped: %s is NULL", out ? "n" : "out");
    struct list l = {0};
    int64_t k;
    scan_all(&l, &k);
    enum toy_status st = entries(l.v + k, l.n - k, out, n);
    free(l.v);
    return st;
}

/* Whether query q names item it: its name; else its base name (unique, or
 * ambiguous after unique_names); else the end of its base name after a '/'
 * or its start before ':' or '/' (NAME for NAME:TAG). rule 0, 1, 2. */
static bool matches(const struct item *it, const char *q, int rule) {
    if (rule == 0) return !strcmp(it->e.name, q);
    const char *nm = it->base;
    if (rule == 1) return !strcmp(nm, q);
    size_t ql = strlen(q), nl = strlen(nm);
    bool suffix = nl > ql && nm[nl - ql - 1] == '/' && !strcmp(nm + nl - ql, q);
    bool prefix = nl > ql && !strncmp(nm, q, ql) && (nm[ql] == ':' || nm[ql] == '/');
    return suffix || prefix;
}

/* The matches of q in v[0..n) by the first rule that matches any: their count, the first in *hit. */
static int64_t find(const struct item *v, int64_t n, const char *q, int64_t *hit) {
    for (int rule = 0; rule < 3; rule++) {
        int64_t c = 0;
        for (int64_t i = 0; i < n; i++)
            if (matches(&v[i], q, rule)) { if (!c) *hit = i; c++; }
        if (c) return c;
    }
    return 0;
}

/* Ollama's full forms of a name it shows short: registry.ollama.ai/library/x:tag,
 * library/x:tag, registry.ollama.ai/user/x:tag. */
static const char *ollama_short(const char *q) {
    size_t hl = strlen(OLLAMA_HOST), nl = strlen(OLLAMA_NAMESPACE);
    if (!strncasecmp(q, OLLAMA_HOST, hl) && q[hl] == '/') q += hl + 1;
    if (!strncasecmp(q, OLLAMA_NAMESPACE, nl) && q[nl] == '/') q += nl + 1;
    return q;
}

enum toy_status toy_model_resolve(const char *q, char *path, size_t path_size) {
    if (!q || !path) return toy_error(TOY_ERR_INVALID_ARG, "toy_model_resolve: NULL %s", q ? "output path" : "name");
    struct stat sb;
    if (stat(q, &sb) == 0 && S_ISREG(sb.st_mode)) {
        if ((size_t)snprintf(path, path_size, "%s", q) >= path_size)
            return toy_error(TOY_ERR_RANGE, "model path '%s' does not fit %zu bytes", q, path_size);
        return TOY_OK;
    }
    struct list l = {0};
    int64_t n;
    scan_all(&l, &n);
    const char *qs = ollama_short(q);
    int64_t hit = -1, n_hits = find(l.v, n, q, &hit);
    if (!n_hits && qs != q) n_hits = find(l.v, n, qs, &hit);
    enum toy_status st = TOY_OK;
    char msg[1024] = "";
    size_t used = 0;
    if (n_hits == 1) {
        if ((size_t)snprintf(path, path_size, "%s", l.v[hit].e.path) >= path_size)
            st = toy_error(TOY_ERR_RANGE, "the path of model '%s' does not fit %zu bytes", q, path_size);
    } else if (n_hits > 1) {
        /* name the candidates, each by the name that picks it */
        int rule = 0;
        while (rule < 3 && !matches(&l.v[hit], q, rule) && !matches(&l.v[hit], qs, rule)) rule++;
        for (int64_t i = 0; i < n && used < sizeof msg - 80; i++)
            if (matches(&l.v[i], q, rule) || matches(&l.v[i], qs, rule))
                used += (size_t)snprintf(msg + used, sizeof msg - used, "%s%s (%s)", used ? ", " : "", l.v[i].e.name,
                                         l.v[i].e.path);
        st = toy_error(TOY_ERR_INVALID_ARG, "model '%s' is ambiguous: it could be %s; use one of these names or a path",
                       q, msg);
    } else {
        int64_t skip = -1;
        if (find(l.v + n, l.n - n, q, &skip) || (qs != q && find(l.v + n, l.n - n, qs, &skip))) {
            /* found, but not a model toy can load: say why rather than "no such name" */
            const struct item *it = &l.v[n + skip];
            if (it->e.unreadable) st = toy_error(TOY_ERR_IO, "model '%s': cannot read %s: %s", q, it->e.path, it->e.why);
            else st = toy_error(TOY_ERR_INVALID_ARG, "model '%s' (%s) is %s", q, it->e.path, it->e.why);
        } else if (stat(q, &sb) == 0 && S_ISDIR(sb.st_mode)) {
            st = toy_error(TOY_ERR_INVALID_ARG, "%s is a directory, not a GGUF file (a Hugging Face folder: toy "
                           "convert it first)", q);
        } else {
            for (int64_t i = 0; i < n && used < sizeof msg - 64; i++)
                used += (size_t)snprintf(msg + used, sizeof msg - used, "%s%s", used ? ", " : "", l.v[i].e.name);
            st = toy_error(TOY_ERR_NOT_FOUND, "model '%s': no such file and no such name (known: %s)", q,
                           *msg ? msg : "none; see `toy models`");
        }
    }
    free(l.v);
    return st;
}
