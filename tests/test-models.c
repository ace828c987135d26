/* test-models.c: model discovery (src/io/model-registry.c) over a fake
 * home holding the Hugging Face cache, Ollama and LM Studio layouts and a
 * TOY_MODEL_DIR, with links that must be listed once; name resolution. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "toy/gguf.h"
#include "toy/models.h"

static void write_gguf(const char *path, const char *arch, int64_t n, uint32_t ft) {
    struct toy_gguf_writer *w;
    toy_gguf_writer_init(&w);
    toy_gguf_writer_set_str(w, "general.architecture", arch);
    toy_gguf_writer_set_u32(w, "general.file_type", ft);
    static float zeros[4096];
    int64_t ne[1] = {n};
    toy_gguf_writer_add_tensor(w, "token_embd.weight", TOY_F32, 1, ne, zeros);
    cr_assert_eq(toy_gguf_writer_write(w, path), TOY_OK, "%s: %s", path, toy_last_error());
    toy_gguf_writer_free(w);
}

static void sh(const char *fmt, const char *root) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, fmt, root, root, root, root, root, root);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
}

static const struct toy_model_entry *find(const struct toy_model_entry *m, int64_t n, const char *name) {
    for (int64_t i = 0; i < n; i++)
        if (!strcmp(m[i].name, name)) return &m[i];
    return NULL;
}

Test(models, discovers_every_store_once) {
    char root[] = "/tmp/toy-models-XXXXXX";
    cr_assert(mkdtemp(root));
    char p[1024];
    /* Hugging Face: snapshot file is a symlink to a blob */
    sh("mkdir -p %s/home/.cache/huggingface/hub/models--acme--tiny-GGUF/blobs "
       "%s/home/.cache/huggingface/hub/models--acme--tiny-GGUF/snapshots/abc123", root);
    snprintf(p, sizeof p, "%s/home/.cache/huggingface/hub/models--acme--tiny-GGUF/blobs/deadbeef", root);
    write_gguf(p, "llama", 100, 7);
    sh("ln -s ../../blobs/deadbeef %s/home/.cache/huggingface/hub/models--acme--tiny-GGUF/snapshots/abc123/tiny-q8_0.gguf", root);
    /* Ollama: manifest -> blob */
    sh("mkdir -p %s/home/.ollama/models/blobs %s/home/.ollama/models/manifests/registry.ollama.ai/library/smol", root);
    snprintf(p, sizeof p, "%s/home/.ollama/models/blobs/sha256-0123abcd", root);
    write_gguf(p, "qwen2", 200, 15);
    snprintf(p, sizeof p, "%s/home/.ollama/models/manifests/registry.ollama.ai/library/smol/135m", root);
    FILE *f = fopen(p, "w");
    fprintf(f, "{\"schemaVersion\":2,\"layers\":[{\"mediaType\":\"application/vnd.ollama.image.template\",\"digest\":\"sha256:ffff\"},"
               "{\"mediaType\":\"application/vnd.ollama.image.model\",\"digest\":\"sha256:0123abcd\",\"size\":1}]}");
    fclose(f);
    /* LM Studio */
    sh("mkdir -p %s/home/.lmstudio/models/pub/repo", root);
    snprintf(p, sizeof p, "%s/home/.lmstudio/models/pub/repo/model-f16.gguf", root);
    write_gguf(p, "gemma2", 300, 1);
    /* TOY_MODEL_DIR: one own file, one link to the HF blob (listed once), one non-GGUF */
    sh("mkdir -p %s/mine && ln -s %s/home/.cache/huggingface/hub/models--acme--tiny-GGUF/blobs/deadbeef %s/mine/link.gguf"
       " && echo junk > %s/mine/junk.gguf", root);
    snprintf(p, sizeof p, "%s/mine/own.gguf", root);
    write_gguf(p, "gpt2", 400, 0);

    snprintf(p, sizeof p, "%s/home", root);
    setenv("HOME", p, 1);
    unsetenv("HF_HOME");
    unsetenv("HF_HUB_CACHE");
    unsetenv("OLLAMA_MODELS");
    snprintf(p, sizeof p, "%s/mine", root);
    setenv("TOY_MODEL_DIR", p, 1);
    cr_assert_eq(chdir(root), 0);

    struct toy_model_entry *m;
    int64_t n;
    cr_assert_eq(toy_models_list(&m, &n), TOY_OK);
    cr_expect_eq(n, 4, "found %lld", (long long)n);
    const struct toy_model_entry *e = find(m, n, "own");
    cr_assert(e);
    cr_expect_str_eq(e->arch, "gpt2");
    cr_expect_eq(e->n_params, 400);
    cr_expect_str_eq(e->source, "dir");
    /* the HF blob was first seen through TOY_MODEL_DIR's link */
    e = find(m, n, "link");
    cr_assert(e);
    cr_expect_eq(e->file_type, 7);
    cr_expect_str_eq(toy_file_type_name(e->file_type), "Q8_0");
    e = find(m, n, "smol:135m");
    cr_assert(e, "ollama model missing");
    cr_expect_str_eq(e->arch, "qwen2");
    cr_expect_str_eq(toy_file_type_name(e->file_type), "Q4_K_M");
    e = find(m, n, "pub/repo/model-f16");
    cr_assert(e, "lmstudio model missing");
    cr_expect_str_eq(e->source, "lmstudio");
    free(m);

    /* without TOY_MODEL_DIR the HF name appears */
    unsetenv("TOY_MODEL_DIR");
    cr_assert_eq(toy_models_list(&m, &n), TOY_OK);
    cr_expect_eq(n, 3);
    cr_expect(find(m, n, "acme/tiny-GGUF/tiny-q8_0") != NULL);
    free(m);

    char path[4096];
    cr_expect_eq(toy_model_resolve("smol:135m", path, sizeof path), TOY_OK);
    cr_expect(strstr(path, "sha256-0123abcd"));
    cr_expect_eq(toy_model_resolve("smol", path, sizeof path), TOY_OK); /* NAME matches NAME:TAG */
    cr_expect_eq(toy_model_resolve("tiny-q8_0", path, sizeof path), TOY_OK);
    cr_expect(strstr(path, "deadbeef"));
    cr_expect_eq(toy_model_resolve("nope", path, sizeof path), TOY_ERR_NOT_FOUND);
    cr_expect(strstr(toy_last_error(), "smol:135m"), "%s", toy_last_error());
    snprintf(p, sizeof p, "%s/mine/own.gguf", root);
    cr_expect_eq(toy_model_resolve(p, path, sizeof path), TOY_OK);
    cr_expect_str_eq(path, p);
    sh("rm -rf %s", root);
}

Test(models, file_type_names) {
    cr_expect_str_eq(toy_file_type_name(0), "F32");
    cr_expect_str_eq(toy_file_type_name(1), "F16");
    cr_expect_str_eq(toy_file_type_name(32), "BF16");
    cr_expect_str_eq(toy_file_type_name(5), "unknown");
    cr_expect_str_eq(toy_file_type_name(1000), "unknown");
}

/* a fake home in a fresh folder, with no other store visible */
static void fresh_home(char *root) {
    cr_assert(mkdtemp(root));
    char p[1024];
    snprintf(p, sizeof p, "%s/home", root);
    cr_assert_eq(mkdir(p, 0755), 0);
    setenv("HOME", p, 1);
    unsetenv("HF_HOME");
    unsetenv("HF_HUB_CACHE");
    unsetenv("OLLAMA_MODELS");
    unsetenv("TOY_MODEL_DIR");
    cr_assert_eq(chdir(root), 0);
}

/* tiny.gguf in $TOY_MODEL_DIR and another tiny.gguf in ./models were both
 * "tiny", and -m tiny took whichever qsort left first. Now they are
 * dir:tiny and models:tiny, the bare name is an error naming both, and a
 * link to one of them is still one file. */
Test(models, same_name_in_two_places_is_ambiguous_not_a_coin_toss) {
    char root[] = "/tmp/toy-models-XXXXXX";
    fresh_home(root);
    char p[1024];
    sh("mkdir -p %s/mine %s/models", root);
    snprintf(p, sizeof p, "%s/mine/tiny.gguf", root);
    write_gguf(p, "llama", 100, 0);
    snprintf(p, sizeof p, "%s/models/tiny.gguf", root);
    write_gguf(p, "llama", 200, 7);
    /* the same file again, through LM Studio's folder (searched after ./models): listed once */
    sh("mkdir -p %s/home/.lmstudio/models/p/r && ln -s %s/models/tiny.gguf %s/home/.lmstudio/models/p/r/tiny.gguf", root);
    snprintf(p, sizeof p, "%s/mine", root);
    setenv("TOY_MODEL_DIR", p, 1);

    struct toy_model_entry *m;
    int64_t n;
    cr_assert_eq(toy_models_list(&m, &n), TOY_OK);
    cr_expect_eq(n, 2, "found %lld", (long long)n);
    const struct toy_model_entry *a = find(m, n, "dir:tiny"), *b = find(m, n, "models:tiny");
    cr_assert(a && b, "names: %s, %s", n > 0 ? m[0].name : "", n > 1 ? m[1].name : "");
    cr_expect_eq(a->n_params, 100);
    cr_expect_eq(b->n_params, 200);
    free(m);

    char path[4096];
    cr_expect_eq(toy_model_resolve("tiny", path, sizeof path), TOY_ERR_INVALID_ARG);
    cr_expect(strstr(toy_last_error(), "ambiguous") && strstr(toy_last_error(), "dir:tiny") &&
              strstr(toy_last_error(), "models:tiny"), "%s", toy_last_error());
    cr_assert_eq(toy_model_resolve("models:tiny", path, sizeof path), TOY_OK, "%s", toy_last_error());
    cr_expect(strstr(path, "/models/tiny.gguf"), "%s", path);
    cr_assert_eq(toy_model_resolve("dir:tiny", path, sizeof path), TOY_OK, "%s", toy_last_error());
    cr_expect(strstr(path, "/mine/tiny.gguf"), "%s", path);
    sh("rm -rf %s", root);
}

/* Two Hugging Face revisions holding different files of one name share the
 * source too: they are named by their paths, which resolve as paths. */
Test(models, same_name_in_one_source_is_named_by_path) {
    char root[] = "/tmp/toy-models-XXXXXX";
    fresh_home(root);
    char p[1024];
    sh("mkdir -p %s/home/.cache/huggingface/hub/models--acme--x/snapshots/r1 "
       "%s/home/.cache/huggingface/hub/models--acme--x/snapshots/r2", root);
    snprintf(p, sizeof p, "%s/home/.cache/huggingface/hub/models--acme--x/snapshots/r1/m.gguf", root);
    write_gguf(p, "llama", 100, 0);
    snprintf(p, sizeof p, "%s/home/.cache/huggingface/hub/models--acme--x/snapshots/r2/m.gguf", root);
    write_gguf(p, "llama", 200, 0);
    struct toy_model_entry *m;
    int64_t n;
    cr_assert_eq(toy_models_list(&m, &n), TOY_OK);
    cr_assert_eq(n, 2);
    cr_expect_str_eq(m[0].name, m[0].path);
    cr_expect_str_eq(m[1].name, m[1].path);
    char path[4096];
    cr_expect_eq(toy_model_resolve("acme/x/m", path, sizeof path), TOY_ERR_INVALID_ARG);
    cr_expect_eq(toy_model_resolve("m", path, sizeof path), TOY_ERR_INVALID_ARG);
    cr_expect(strstr(toy_last_error(), "r1/m.gguf") && strstr(toy_last_error(), "r2/m.gguf"), "%s", toy_last_error());
    cr_expect_eq(toy_model_resolve(m[1].name, path, sizeof path), TOY_OK);
    free(m);
    sh("rm -rf %s", root);
}

static void write_typed(const char *path, const char *type, bool tensor) {
    struct toy_gguf_writer *w;
    toy_gguf_writer_init(&w);
    toy_gguf_writer_set_str(w, "general.architecture", "llama");
    if (type) toy_gguf_writer_set_str(w, "general.type", type);
    static float zeros[8];
    int64_t ne[2] = {8, 1};
    if (tensor) toy_gguf_writer_add_tensor(w, "blk.0.attn_q.weight.lora_a", TOY_F32, 2, ne, zeros);
    cr_assert_eq(toy_gguf_writer_write(w, path), TOY_OK, "%s: %s", path, toy_last_error());
    toy_gguf_writer_free(w);
}

/* Adapters, training states and vocabulary-only files were listed as
 * models that `toy generate -m` then refused; they are left out (and say
 * what they are when named), and so is anything unreadable, which now
 * says why instead of vanishing into "no such name". */
Test(models, lists_only_what_generate_can_load_and_says_why_not) {
    char root[] = "/tmp/toy-models-XXXXXX";
    fresh_home(root);
    char p[1024];
    sh("mkdir -p %s/models", root);
    snprintf(p, sizeof p, "%s/models/real.gguf", root);
    write_gguf(p, "llama", 100, 0);
    snprintf(p, sizeof p, "%s/models/adapter.gguf", root);
    write_typed(p, "adapter", true);
    snprintf(p, sizeof p, "%s/models/state.gguf", root);
    write_typed(p, "toy-pretrain-state", true);
    snprintf(p, sizeof p, "%s/models/vocab.gguf", root);
    write_typed(p, NULL, false);
    sh("echo not a gguf > %s/models/junk.gguf && ln -s %s/gone.gguf %s/models/dead.gguf", root);

    struct toy_model_entry *m;
    int64_t n;
    cr_assert_eq(toy_models_list(&m, &n), TOY_OK);
    cr_expect_eq(n, 1, "found %lld", (long long)n);
    cr_expect(find(m, n, "real"));
    free(m);
    cr_assert_eq(toy_models_skipped(&m, &n), TOY_OK);
    cr_expect_eq(n, 5, "skipped %lld", (long long)n);
    const struct toy_model_entry *e = find(m, n, "vocab");
    cr_assert(e);
    cr_expect(strstr(e->why, "vocabulary-only") && !e->unreadable, "%s", e->why);
    e = find(m, n, "junk");
    cr_assert(e);
    cr_expect(e->unreadable);
    free(m);

    char path[4096];
    cr_expect_eq(toy_model_resolve("adapter", path, sizeof path), TOY_ERR_INVALID_ARG);
    cr_expect(strstr(toy_last_error(), "LoRA adapter"), "%s", toy_last_error());
    cr_expect_eq(toy_model_resolve("state", path, sizeof path), TOY_ERR_INVALID_ARG);
    cr_expect(strstr(toy_last_error(), "training state"), "%s", toy_last_error());
    cr_expect_eq(toy_model_resolve("vocab", path, sizeof path), TOY_ERR_INVALID_ARG);
    cr_expect(strstr(toy_last_error(), "vocabulary-only"), "%s", toy_last_error());
    cr_expect_eq(toy_model_resolve("junk", path, sizeof path), TOY_ERR_IO);
    cr_expect(strstr(toy_last_error(), "cannot read") && strstr(toy_last_error(), "junk.gguf") &&
              strstr(toy_last_error(), "GGUF header"), "%s", toy_last_error());
    cr_expect_eq(toy_model_resolve("dead", path, sizeof path), TOY_ERR_IO);
    cr_expect(strstr(toy_last_error(), "a link to a missing file"), "%s", toy_last_error());
    if (geteuid() != 0) { /* root reads a mode-000 file: this part only means something for other users */
        snprintf(p, sizeof p, "%s/models/locked.gguf", root);
        write_gguf(p, "llama", 100, 0);
        cr_assert_eq(chmod(p, 0), 0);
        cr_expect_eq(toy_model_resolve("locked", path, sizeof path), TOY_ERR_IO);
        cr_expect(strstr(toy_last_error(), "Permission denied"), "%s", toy_last_error());
    }
    sh("rm -rf %s", root);
}

/* Ollama shows a model pulled from another registry with its host
 * (hf.co/bartowski/Tiny-GGUF:Q4_K_M); toy dropped it. Names follow
 * Ollama's DisplayShortest, and its full forms resolve too. */
Test(models, ollama_names_are_the_ones_ollama_shows) {
    char root[] = "/tmp/toy-models-XXXXXX";
    fresh_home(root);
    const char *man[][2] = {{"hf.co/bartowski/Tiny-GGUF/Q4_K_M", "1111"},
                            {"registry.ollama.ai/library/smol/135m", "2222"},
                            {"registry.ollama.ai/someone/thing/latest", "3333"}};
    char p[1024];
    for (int i = 0; i < 3; i++) {
        char cmd[2048];
        snprintf(cmd, sizeof cmd, "mkdir -p %s/home/.ollama/models/blobs && mkdir -p $(dirname %s/home/.ollama/models/manifests/%s)",
                 root, root, man[i][0]);
        cr_assert_eq(system(cmd), 0);
        snprintf(p, sizeof p, "%s/home/.ollama/models/blobs/sha256-%s", root, man[i][1]);
        write_gguf(p, "llama", 100 * (i + 1), 15);
        snprintf(p, sizeof p, "%s/home/.ollama/models/manifests/%s", root, man[i][0]);
        FILE *f = fopen(p, "w");
        cr_assert(f);
        fprintf(f, "{\"layers\":[{\"mediaType\":\"application/vnd.ollama.image.model\",\"digest\":\"sha256:%s\"}]}",
                man[i][1]);
        fclose(f);
    }
    struct toy_model_entry *m;
    int64_t n;
    cr_assert_eq(toy_models_list(&m, &n), TOY_OK);
    cr_expect_eq(n, 3);
    cr_expect(find(m, n, "hf.co/bartowski/Tiny-GGUF:Q4_K_M"), "%s", n ? m[0].name : "");
    cr_expect(find(m, n, "smol:135m"));
    cr_expect(find(m, n, "someone/thing:latest"));
    free(m);
    char path[4096];
    const char *ok[] = {"hf.co/bartowski/Tiny-GGUF:Q4_K_M", "registry.ollama.ai/library/smol:135m", "library/smol:135m",
                        "registry.ollama.ai/someone/thing:latest", "someone/thing", "Tiny-GGUF:Q4_K_M"};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
        cr_expect_eq(toy_model_resolve(ok[i], path, sizeof path), TOY_OK, "%s: %s", ok[i], toy_last_error());
    cr_expect_eq(toy_model_resolve("hf.co/bartowski/Tiny-GGUF:Q4_K_M", path, sizeof path), TOY_OK);
    cr_expect(strstr(path, "sha256-1111"), "%s", path);
    sh("rm -rf %s", root);
}
