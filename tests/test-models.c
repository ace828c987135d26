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
