/* toy/safetensors.h: Hugging Face safetensors checkpoints, mmap'd and
 * validated; single files or sharded sets (model.safetensors.index.json).
 *
 * Format (huggingface/safetensors): u64 little-endian header length N,
 * N bytes of JSON {"name": {"dtype": "F32", "shape": [..], "data_offsets":
 * [begin, end]}, ..., "__metadata__": {str: str}}, then the data, which the
 * offsets (relative to the end of the header) must cover exactly, without
 * holes or overlaps. Shapes are outermost-first (PyTorch order).
 *
 *     struct toy_safetensors *st;
 *     if (toy_safetensors_open("hf-model/", &st)) die(toy_last_error());
 *     int64_t i = toy_safetensors_find(st, "model.norm.weight");
 *     int64_t n = toy_safetensors_tensor(st, i)->n_elements;
 *     float *x = malloc(n * 4);
 *     toy_safetensors_read_f32(st, i, x, n);   // F32, F16, BF16, F64
 *     toy_safetensors_close(st);
 *
 * Every length, offset and shape is checked against the bytes present; a
 * bad file gives TOY_ERR_FORMAT naming the file, tensor and field. */
#ifndef TOY_SAFETENSORS_H
#define TOY_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "toy/dtype.h"
#include "toy/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TOY_ST_MAX_DIMS 8

struct toy_st_tensor {
    const char *name;
    enum toy_dtype type;         /* F32, F16, BF16, F64, I8, I16, I32, I64 */
    int n_dims;                  /* 0..8 */
    int64_t shape[TOY_ST_MAX_DIMS]; /* outermost first, as stored */
    int64_t n_elements;
    size_t nbytes;
    const void *data;            /* mapped; may be unaligned */
    int shard;                   /* index of the file it lives in */
};

struct toy_safetensors;

/* `path`: a .safetensors file, a model.safetensors.index.json, or a
 * directory holding either (the index wins). */
enum toy_status toy_safetensors_open(const char *path, struct toy_safetensors **out);
/* One file's image in memory (not copied; must outlive the handle). */
enum toy_status toy_safetensors_open_memory(const void *data, size_t size, const char *name,
                                            struct toy_safetensors **out);
void toy_safetensors_close(struct toy_safetensors *st);

int64_t toy_safetensors_n_tensors(const struct toy_safetensors *st);
/* Tensors sorted by name. */
const struct toy_st_tensor *toy_safetensors_tensor(const struct toy_safetensors *st, int64_t i);
int64_t toy_safetensors_find(const struct toy_safetensors *st, const char *name);
int toy_safetensors_n_shards(const struct toy_safetensors *st);
/* A "__metadata__" value of the first shard, or NULL. */
const char *toy_safetensors_metadata(const struct toy_safetensors *st, const char *key);

/* Converts tensor i to f32 (n >= n_elements). Float types only. */
enum toy_status toy_safetensors_read_f32(const struct toy_safetensors *st, int64_t i, float *dst, int64_t n);

#ifdef __cplusplus
}
#endif
#endif
