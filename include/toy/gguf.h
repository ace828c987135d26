/* toy/gguf.h: GGUF model files (versions 2 and 3): read with mmap (tensor
 * data is the file's pages, never copied), write atomically.
 *
 * Format: ../shared/testdata/gguf-spec/gguf.md (ggml docs/gguf.md). A file
 * is a header (magic "GGUF", version, tensor count, KV count), the metadata
 * key/value pairs, the tensor infos (name, dims innermost-first, ggml type,
 * offset relative to the data section), padding to `general.alignment`
 * (default 32), then the tensor data.
 *
 * Reading:
 *
 *     struct toy_gguf *g;
 *     if (toy_gguf_open("model.gguf", &g)) { puts(toy_last_error()); ... }
 *     uint32_t n_layer;
 *     toy_gguf_get_u32(g, "llama.block_count", &n_layer); // u8..u64, i8..i64
 *     const char *arch;
 *     toy_gguf_get_str(g, "general.architecture", &arch, NULL);
 *     int64_t t = toy_gguf_find_tensor(g, "token_embd.weight");   // -1: absent
 *     if (t >= 0) {
 *         const struct toy_gguf_tensor *ti = toy_gguf_tensor(g, t);
 *         // ti->data points into the mapping: ti->nbytes bytes of ti->type
 *     }
 *     toy_gguf_close(g);
 *
 * Every count, length, offset and shape in the file is checked for overflow
 * and against the bytes present before use; a malformed file gives
 * TOY_ERR_FORMAT (or TOY_ERR_UNSUPPORTED) with a message naming the field,
 * the key or tensor, and the byte offset. No allocation is sized by a field
 * that was not first bounded by the file size.
 *
 * Writing:
 *
 *     struct toy_gguf_writer *w;
 *     toy_gguf_writer_init(&w);
 *     toy_gguf_writer_set_str(w, "general.architecture", "llama");
 *     toy_gguf_writer_set_u32(w, "llama.block_count", 2);
 *     toy_gguf_writer_add_tensor(w, "output_norm.weight", TOY_F32, 1, ne, data);
 *     toy_gguf_writer_write(w, "out.gguf");   // temp file, fsync, rename
 *     toy_gguf_writer_free(w);
 *
 * Neither object is thread-safe for mutation; an open toy_gguf may be read
 * from many threads. Tensor data are the file's pages: a file truncated by
 * another process while it is open makes later reads fault (SIGBUS), as
 * with any mmap; toy's writer never does that (it replaces files by rename).
 */
#ifndef TOY_GGUF_H
#define TOY_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "toy/dtype.h"
#include "toy/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TOY_GGUF_DEFAULT_ALIGNMENT 32
#define TOY_GGUF_MAX_DIMS 4
#define TOY_GGUF_NAME_MAX 64 /* tensor names are < 64 bytes (ggml) */

/* Metadata value types (the file's ids; append only). */
enum toy_gguf_type {
    TOY_GGUF_U8 = 0,
    TOY_GGUF_I8 = 1,
    TOY_GGUF_U16 = 2,
    TOY_GGUF_I16 = 3,
    TOY_GGUF_U32 = 4,
    TOY_GGUF_I32 = 5,
    TOY_GGUF_F32 = 6,
    TOY_GGUF_BOOL = 7,
    TOY_GGUF_STRING = 8,
    TOY_GGUF_ARRAY = 9,
    TOY_GGUF_U64 = 10,
    TOY_GGUF_I64 = 11,
    TOY_GGUF_F64 = 12,
    TOY_GGUF_TYPE_COUNT
};

/* "u8", "i32", "f32", "bool", "str", "arr", ...; "invalid" otherwise. */
const char *toy_gguf_type_name(enum toy_gguf_type t);
/* Bytes of one value of a fixed-size type; 0 for STRING, ARRAY, invalid. */
size_t toy_gguf_type_size(enum toy_gguf_type t);

/* ---- reading -------------------------------------------------------------- */

/* One tensor of an open file (plain data; owned by the toy_gguf). */
struct toy_gguf_tensor {
    char name[TOY_GGUF_NAME_MAX];  /* NUL-terminated */
    enum toy_dtype type;
    int32_t n_dims;                /* 0..4 as stored (0 means one element) */
    int64_t ne[TOY_GGUF_MAX_DIMS]; /* innermost first; unused dims are 1 */
    int64_t n_elements;
    uint64_t offset;               /* relative to the data section */
    size_t file_offset;            /* absolute byte offset in the file */
    size_t nbytes;
    const void *data;              /* the mapped bytes (nbytes of them) */
};

struct toy_gguf;

/* Maps `path` read-only and parses it. On error *out is NULL. */
enum toy_status toy_gguf_open(const char *path, struct toy_gguf **out);
/* Parses a GGUF image in memory (not copied: `data` must outlive the
 * handle). `name` is used in messages (NULL: "<memory>"). */
enum toy_status toy_gguf_open_memory(const void *data, size_t size, const char *name,
                                     struct toy_gguf **out);
/* Unmaps and frees. NULL is a no-op. */
void toy_gguf_close(struct toy_gguf *g);
/* Drops from this process's memory the pages of [p, p + n) of a file
 * mapping (whole pages inside the range; they are read again from the file
 * if touched later): for tensor data a caller has copied elsewhere. A no-op
 * for in-memory images and ranges outside the mapping. */
void toy_gguf_release(struct toy_gguf *g, const void *p, size_t n);
/* Whether [p, p + n) lies in g's file mapping (false for in-memory images). */
bool toy_gguf_maps(const struct toy_gguf *g, const void *p, size_t n);

uint32_t toy_gguf_version(const struct toy_gguf *g);
size_t toy_gguf_alignment(const struct toy_gguf *g);
/* Byte offset of the data section (aligned end of the tensor infos). */
size_t toy_gguf_data_offset(const struct toy_gguf *g);
/* Byte offset just past the last tensor info (before padding). */
size_t toy_gguf_header_end(const struct toy_gguf *g);
size_t toy_gguf_file_size(const struct toy_gguf *g);
const char *toy_gguf_path(const struct toy_gguf *g);

/* -- metadata by index (0 <= i < n_kv; out-of-range i aborts) -- */
int64_t toy_gguf_n_kv(const struct toy_gguf *g);
const char *toy_gguf_kv_key(const struct toy_gguf *g, int64_t i);
enum toy_gguf_type toy_gguf_kv_type(const struct toy_gguf *g, int64_t i);
/* Index of a key, or -1. */
int64_t toy_gguf_find_key(const struct toy_gguf *g, const char *key);

/* Scalars by index, converting between widths when the value fits:
 * any integer or bool type for _int/_uint; F32, F64 or any integer for
 * _float. TOY_ERR_RANGE if it does not fit, TOY_ERR_FORMAT for a value of
 * another kind (a string, an array). */
enum toy_status toy_gguf_kv_int(const struct toy_gguf *g, int64_t i, int64_t *v);
enum toy_status toy_gguf_kv_uint(const struct toy_gguf *g, int64_t i, uint64_t *v);
enum toy_status toy_gguf_kv_float(const struct toy_gguf *g, int64_t i, double *v);
/* STRING: a NUL-terminated copy owned by g (len excludes the NUL; the
 * string may itself contain NULs). len may be NULL. */
enum toy_status toy_gguf_kv_str(const struct toy_gguf *g, int64_t i, const char **s, size_t *len);

/* Scalars by key: TOY_ERR_NOT_FOUND if absent; conversions as above
 * (u32 accepts u8..u64 and signed values in range, and so on). */
enum toy_status toy_gguf_get_u32(const struct toy_gguf *g, const char *key, uint32_t *v);
enum toy_status toy_gguf_get_i32(const struct toy_gguf *g, const char *key, int32_t *v);
enum toy_status toy_gguf_get_u64(const struct toy_gguf *g, const char *key, uint64_t *v);
enum toy_status toy_gguf_get_i64(const struct toy_gguf *g, const char *key, int64_t *v);
enum toy_status toy_gguf_get_f32(const struct toy_gguf *g, const char *key, float *v);
enum toy_status toy_gguf_get_f64(const struct toy_gguf *g, const char *key, double *v);
/* BOOL only (an integer 0/1 is accepted too). */
enum toy_status toy_gguf_get_bool(const struct toy_gguf *g, const char *key, bool *v);
enum toy_status toy_gguf_get_str(const struct toy_gguf *g, const char *key, const char **s,
                                 size_t *len);

/* Whether the file is a model, by general.type (absent or "model": yes). A
 * LoRA adapter ("adapter") or one of toy's resume states ("toy-*-state")
 * is not: *what (if given) then says which, for an error message. */
bool toy_gguf_is_model(const struct toy_gguf *g, const char **what);

/* Arrays. toy_gguf_get_arr finds an ARRAY key and gives its index, element
 * type and length (elem may be NULL). */
enum toy_status toy_gguf_get_arr(const struct toy_gguf *g, const char *key, int64_t *kv_index,
                                 enum toy_gguf_type *elem, uint64_t *n);
enum toy_gguf_type toy_gguf_arr_type(const struct toy_gguf *g, int64_t i);
uint64_t toy_gguf_arr_len(const struct toy_gguf *g, int64_t i);
/* Raw little-endian bytes of a fixed-size-element array (may be unaligned:
 * read with memcpy or the element accessors); NULL for string arrays. */
const void *toy_gguf_arr_data(const struct toy_gguf *g, int64_t i);
/* Element j of array i (j < len; out of range aborts). Strings are NOT
 * NUL-terminated: use *len. */
const char *toy_gguf_arr_str(const struct toy_gguf *g, int64_t i, uint64_t j, size_t *len);
enum toy_status toy_gguf_arr_int(const struct toy_gguf *g, int64_t i, uint64_t j, int64_t *v);
enum toy_status toy_gguf_arr_float(const struct toy_gguf *g, int64_t i, uint64_t j, double *v);

/* -- tensors -- */
int64_t toy_gguf_n_tensors(const struct toy_gguf *g);
/* Tensor i, 0 <= i < toy_gguf_n_tensors (out of range aborts, as a
 * programming error: check toy_gguf_find_tensor's -1 first). Valid until
 * toy_gguf_close. */
const struct toy_gguf_tensor *toy_gguf_tensor(const struct toy_gguf *g, int64_t i);
/* Index of a tensor by name, or -1. */
int64_t toy_gguf_find_tensor(const struct toy_gguf *g, const char *name);
/* Copies tensor i's bytes into dst (dst_bytes >= nbytes): for backends that
 * need their own copy rather than the mapping. */
enum toy_status toy_gguf_tensor_read(const struct toy_gguf *g, int64_t i, void *dst,
                                     size_t dst_bytes);
/* Dequantizes tensor i to f32 (dst holds n_elements floats). Any type
 * toy_can_dequantize accepts. */
enum toy_status toy_gguf_tensor_read_f32(const struct toy_gguf *g, int64_t i, float *dst,
                                         int64_t n);

/* ---- writing -------------------------------------------------------------- */

struct toy_gguf_writer;

/* Produces the tensor bytes of one tensor while the file is written, so
 * that converters never hold every tensor in memory: fill dst with
 * `nbytes` bytes (the whole tensor). */
typedef enum toy_status (*toy_gguf_fill_fn)(void *ctx, void *dst, size_t nbytes);

/* Reports progress while writing (tensors written so far, out of total). */
typedef void (*toy_gguf_progress_fn)(void *ctx, int64_t done, int64_t total, const char *name);

enum toy_status toy_gguf_writer_init(struct toy_gguf_writer **out);
void toy_gguf_writer_free(struct toy_gguf_writer *w);

/* Each setter adds a key or replaces its value in place (keys keep the
 * order of first insertion). Keys must be non-empty and < 65536 bytes.
 * A u32 `general.alignment` (a power of two) sets the data alignment.
 * A NULL key, string or array (of n > 0 values), tensor name or shape is
 * TOY_ERR_INVALID_ARG, and the writer is left as it was. */
enum toy_status toy_gguf_writer_set_u8(struct toy_gguf_writer *w, const char *key, uint8_t v);
enum toy_status toy_gguf_writer_set_i8(struct toy_gguf_writer *w, const char *key, int8_t v);
enum toy_status toy_gguf_writer_set_u16(struct toy_gguf_writer *w, const char *key, uint16_t v);
enum toy_status toy_gguf_writer_set_i16(struct toy_gguf_writer *w, const char *key, int16_t v);
enum toy_status toy_gguf_writer_set_u32(struct toy_gguf_writer *w, const char *key, uint32_t v);
enum toy_status toy_gguf_writer_set_i32(struct toy_gguf_writer *w, const char *key, int32_t v);
enum toy_status toy_gguf_writer_set_u64(struct toy_gguf_writer *w, const char *key, uint64_t v);
enum toy_status toy_gguf_writer_set_i64(struct toy_gguf_writer *w, const char *key, int64_t v);
enum toy_status toy_gguf_writer_set_f32(struct toy_gguf_writer *w, const char *key, float v);
enum toy_status toy_gguf_writer_set_f64(struct toy_gguf_writer *w, const char *key, double v);
enum toy_status toy_gguf_writer_set_bool(struct toy_gguf_writer *w, const char *key, bool v);
enum toy_status toy_gguf_writer_set_str(struct toy_gguf_writer *w, const char *key, const char *s);
enum toy_status toy_gguf_writer_set_strn(struct toy_gguf_writer *w, const char *key, const char *s,
                                         size_t len);
/* An array of fixed-size elements (elem not STRING/ARRAY), n values in
 * native little-endian layout at data. */
enum toy_status toy_gguf_writer_set_arr(struct toy_gguf_writer *w, const char *key,
                                        enum toy_gguf_type elem, const void *data, uint64_t n);
/* An array of n strings; lens may be NULL (then each is NUL-terminated). */
enum toy_status toy_gguf_writer_set_arr_str(struct toy_gguf_writer *w, const char *key,
                                            const char *const *strs, const size_t *lens,
                                            uint64_t n);
/* Copies KV i of an open file (any type) under the same key. */
enum toy_status toy_gguf_writer_copy_kv(struct toy_gguf_writer *w, const struct toy_gguf *g,
                                        int64_t i);
/* Removes a key; TOY_ERR_NOT_FOUND if absent. */
enum toy_status toy_gguf_writer_remove(struct toy_gguf_writer *w, const char *key);
int64_t toy_gguf_writer_n_kv(const struct toy_gguf_writer *w);

/* Adds a tensor whose bytes (toy_row_bytes(type, ne[0]) * rows) are at
 * `data`, which must stay valid until the write. ne innermost-first; ne[0]
 * must be a multiple of the type's block size. Names are unique, < 64 bytes. */
enum toy_status toy_gguf_writer_add_tensor(struct toy_gguf_writer *w, const char *name,
                                           enum toy_dtype type, int n_dims, const int64_t *ne,
                                           const void *data);
/* The same, with bytes produced by `fill(ctx, ...)` during the write. */
enum toy_status toy_gguf_writer_add_tensor_fn(struct toy_gguf_writer *w, const char *name,
                                              enum toy_dtype type, int n_dims, const int64_t *ne,
                                              toy_gguf_fill_fn fill, void *ctx);
int64_t toy_gguf_writer_n_tensors(const struct toy_gguf_writer *w);
void toy_gguf_writer_set_progress(struct toy_gguf_writer *w, toy_gguf_progress_fn fn, void *ctx);

/* Writes the file whole or not at all (toy/file.h: a temp file beside it,
 * fsync, rename; a symbolic link is written through, a device or pipe
 * refused). On any error the temp file is removed and `path` is left as it
 * was. "-" is not accepted. */
enum toy_status toy_gguf_writer_write(struct toy_gguf_writer *w, const char *path);
/* Serializes into a malloc'd buffer (*out, *size; caller frees). */
enum toy_status toy_gguf_writer_write_memory(struct toy_gguf_writer *w, void **out, size_t *size);

#ifdef __cplusplus
}
#endif
#endif
