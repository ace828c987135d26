/* toy/models.h: finding the GGUF models already on this machine, and
 * resolving a model name (as `toy models` prints it) to a file.
 *
 * Places searched, in this order (the first sighting of a file wins; the
 * same file reached twice, e.g. through a symlink, is listed once):
 *   $TOY_MODEL_DIR               *.gguf, up to 4 levels deep
 *   ./models                     *.gguf, up to 4 levels deep
 *   Hugging Face cache           $HF_HUB_CACHE, $HF_HOME/hub or ~/.cache/huggingface/hub:
 *                                models--ORG--REPO/snapshots/REV/... (symlinks to blobs)
 *                                named "ORG/REPO/FILE"
 *   Ollama                       $OLLAMA_MODELS or ~/.ollama/models: manifests name
 *                                the model layer's blob, named as Ollama shows it:
 *                                "NAME:TAG" (registry.ollama.ai/library), "NS/NAME:TAG"
 *                                (registry.ollama.ai/NS), "HOST/NS/NAME:TAG" (any other
 *                                registry, e.g. "hf.co/bartowski/Tiny-GGUF:Q4_K_M")
 *   LM Studio                    ~/.lmstudio/models and ~/.cache/lm-studio/models:
 *                                PUBLISHER/REPO/FILE.gguf, named "PUBLISHER/REPO/FILE"
 *
 * Listed are the files `toy generate -m NAME` can load: not LoRA adapters,
 * toy's training states, vocabulary-only GGUFs (no tensors), nor files that
 * cannot be read or are not GGUF; toy_models_skipped gives those, with why.
 * Names are unique: distinct files of one name are "SOURCE:NAME" ("dir:tiny",
 * "models:tiny"), or their path where the source is shared too; the bare
 * name is then ambiguous (an error naming the candidates).
 *
 *     struct toy_model_entry *m; int64_t n;
 *     toy_models_list(&m, &n);  ...  free(m);
 *     char path[4096];
 *     toy_model_resolve("smollm2:135m", path, sizeof path);   // or a path
 */
#ifndef TOY_MODELS_H
#define TOY_MODELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "toy/status.h"

#ifdef __cplusplus
extern "C" {
#endif

struct toy_model_entry {
    char name[256];
    char path[4096];        /* the real file */
    char source[16];        /* "dir", "models", "huggingface", "ollama", "lmstudio" */
    char arch[32];          /* general.architecture ("" if unreadable) */
    int64_t n_params;       /* elements of all tensors */
    uint32_t file_type;     /* general.file_type, or UINT32_MAX when absent */
    uint64_t size;          /* bytes */
    /* toy_models_skipped only: why the file is not listed ("" for listed ones), and whether that is
     * because it could not be read at all (permission, not a GGUF, a dangling link) */
    char why[256];
    bool unreadable;
};

/* All models found, sorted by name. *out is malloc'd (free() it); never
 * fails for missing directories. */
enum toy_status toy_models_list(struct toy_model_entry **out, int64_t *n);

/* The *.gguf files found that are not listed, each with e.why. */
enum toy_status toy_models_skipped(struct toy_model_entry **out, int64_t *n);

/* name_or_path: an existing file is returned as is; otherwise a listed
 * name (exact; else the bare name of "SOURCE:NAME"; else the unique entry
 * whose name ends with "/NAME" or starts with "NAME:" / "NAME/"; Ollama's
 * full "registry.ollama.ai/library/NAME:TAG" forms too). TOY_ERR_NOT_FOUND,
 * TOY_ERR_INVALID_ARG (ambiguous: the candidates in the message; or a
 * file that is not a model, e.g. an adapter) or TOY_ERR_IO (a file of
 * that name that cannot be read, and why). */
enum toy_status toy_model_resolve(const char *name_or_path, char *path, size_t path_size);

/* "F32", "F16", "Q8_0", "Q4_K_M", ... for a general.file_type (llama_ftype);
 * "unknown" otherwise. */
const char *toy_file_type_name(uint32_t file_type);

#ifdef __cplusplus
}
#endif
#endif
