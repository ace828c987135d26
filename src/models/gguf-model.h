/* gguf-model.h: what the model loaders and writers share (llama-gguf.c,
 * gpt2-gguf.c, bert.c): a parameter pointed at its mapped file tensor, the
 * error for a shape the config does not give, and a parameter written as it
 * is or converted to another type as the file is written. */
#ifndef TOY_MODELS_GGUF_MODEL_H
#define TOY_MODELS_GGUF_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "toy/gguf.h"
#include "toy/tensor.h"

/* whether the file's general.architecture is arch */
bool toy_model_arch_is(const struct toy_gguf *g, const char *arch);
/* key "<arch>.<suffix>" as an integer: def when absent, or when *st is already an error; a key of another type
 * makes *st that error (naming the key) */
int64_t toy_model_key_int(const struct toy_gguf *g, const char *arch, const char *suffix, int64_t def,
                          enum toy_status *st);
/* TOY_ERR_SHAPE naming the file, the tensor, its shape, the config's and its offset */
enum toy_status toy_model_shape_error(const struct toy_gguf *g, const struct toy_gguf_tensor *gt,
                                      const struct toy_tensor *t);
/* File tensor t->name (its index into *i), of t's shape (more_rows: or more rows, a longer position table) and
 * of a type toy reads; else NULL, the error (missing, shape, type) naming the file and tensor in *st */
const struct toy_gguf_tensor *toy_model_find_tensor(const struct toy_gguf *g, const struct toy_tensor *t,
                                                    bool more_rows, int64_t *i, enum toy_status *st);
/* TOY_ERR_UNSUPPORTED when toy cannot read file tensor gt's type (naming it), else TOY_OK */
enum toy_status toy_model_check_type(const struct toy_gguf *g, const struct toy_gguf_tensor *gt, const char *name);
/* t re-described as the file's type over rows of gt->ne[0] and pointed (frozen) at data, the mapped bytes of
 * its first row in the file */
void toy_model_map_tensor(struct toy_tensor *t, const struct toy_gguf_tensor *gt, const void *data);
/* Adds t (nd dims) to w: as it is (contiguous), or, an f32 tensor written as `type`, converted row by row while
 * the file is written; the conversion's record lives in ctx (the model's), which must outlive the write. */
enum toy_status toy_model_write_tensor(struct toy_gguf_writer *w, struct toy_ctx *ctx, const struct toy_tensor *t,
                                       int nd, enum toy_dtype type);

#endif
