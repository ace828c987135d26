/* ctx.c: arenas (contexts), tensor creation, views and tensor queries.
 *
 * An arena is a list of chunks; allocations are bumped from the newest chunk
 * (64-byte aligned, zeroed) and a new chunk is added when it is full. Large
 * blocks get a chunk of their own. Freeing the context frees every chunk.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/internal.h"

#define CHUNK_BYTES (1u << 20)
#define ALIGN 64

struct chunk {
    struct chunk *next;
    size_t size, used;
    char *mem;
};

struct toy_ctx {
    struct chunk *chunks;
    bool alloc_data;
    size_t data_bytes;
    struct toy_graph **graphs; /* released with the context */
    int n_graphs, cap_graphs;
};

void toy_ctx_register_graph(struct toy_ctx *ctx, struct toy_graph *g) {
    if (ctx->n_graphs == ctx->cap_graphs) {
        ctx->cap_graphs = ctx->cap_graphs ? ctx->cap_graphs * 2 : 8;
        ctx->graphs = realloc(ctx->graphs, (size_t)ctx->cap_graphs * sizeof *ctx->graphs);
        if (!ctx->graphs) TOY_ABORT("out of memory (graph list)");
    }
    ctx->graphs[ctx->n_graphs++] = g;
}

/* Chunks of CHUNK_BYTES that freed contexts left, kept (at most CHUNK_CACHE, all zero) for the next ones. A
 * context is built per graph (each prefill chunk, a decode step's graph when its batch changes), and a fresh chunk's
 * memset faulted in 256 pages: ~3 ms on a VM where a fault costs ~10 us, more than the graph it held took to build.
 * A kept chunk costs a memset of the part that was used. */
#define CHUNK_CACHE 8
static pthread_mutex_t cache_mu = PTHREAD_MUTEX_INITIALIZER;
static struct chunk *chunk_cache;
static int n_chunk_cache;

static struct chunk *chunk_new(size_t size) {
    size = (size + ALIGN - 1) / ALIGN * ALIGN;
    if (size == CHUNK_BYTES) {
        pthread_mutex_lock(&cache_mu);
        struct chunk *c = chunk_cache;
        if (c) chunk_cache = c->next, n_chunk_cache--;
        pthread_mutex_unlock(&cache_mu);
        if (c) {
            c->used = 0;
            c->next = NULL;
            return c;
        }
    }
    struct chunk *c = malloc(sizeof *c);
    if (!c) return NULL;
    c->mem = aligned_alloc(ALIGN, size);
    if (!c->mem) { free(c); return NULL; }
    memset(c->mem, 0, size);
    c->size = size;
    c->used = 0;
    c->next = NULL;
    return c;
}

static void chunk_free(struct chunk *c) {
    if (c->size == CHUNK_BYTES) {
        pthread_mutex_lock(&cache_mu);
        bool keep = n_chunk_cache < CHUNK_CACHE;
        if (keep) {
            memset(c->mem, 0, c->used);
            c->next = chunk_cache, chunk_cache = c, n_chunk_cache++;
        }
        pthread_mutex_unlock(&cache_mu);
        if (keep) return;
    }
    free(c->mem);
    free(c);
}

struct toy_ctx *toy_ctx_init(bool alloc_data) {
    struct toy_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx) return NULL;
    ctx->alloc_data = alloc_data;
    return ctx;
}

void toy_ctx_free(struct toy_ctx *ctx) {
    if (!ctx) return;
    for (int i = 0; i < ctx->n_graphs; i++) toy_graph_release(ctx->graphs[i]);
    free(ctx->graphs);
    for (struct chunk *c = ctx->chunks, *n; c; c = n) {
        n = c->next;
        chunk_free(c);
    }
    free(ctx);
}

bool toy_ctx_allocs_data(const struct toy_ctx *ctx) { return ctx->alloc_data; }

size_t toy_ctx_data_bytes(const struct toy_ctx *ctx) { return ctx->data_bytes; }

void *toy_ctx_alloc(struct toy_ctx *ctx, size_t bytes) {
    bytes = (bytes + ALIGN - 1) / ALIGN * ALIGN;
    if (bytes == 0) bytes = ALIGN;
    struct chunk *c = ctx->chunks;
    if (bytes > CHUNK_BYTES / 4) {
        /* a big block gets its own chunk, linked behind the current one so
         * the current chunk keeps serving small allocations */
        struct chunk *b = chunk_new(bytes);
        if (!b) TOY_ABORT("out of memory allocating %zu bytes", bytes);
        b->used = bytes;
        if (c) { b->next = c->next; c->next = b; } else ctx->chunks = b;
        return b->mem;
    }
    if (!c || c->size - c->used < bytes) {
        struct chunk *n = chunk_new(CHUNK_BYTES);
        if (!n) TOY_ABORT("out of memory allocating an arena chunk");
        n->next = ctx->chunks;
        ctx->chunks = n;
        c = n;
    }
    void *p = c->mem + c->used;
    c->used += bytes;
    return p;
}

/* ---- streamed buffers ------------------------------------------------------------ */

#define HUGE_PAGE ((size_t)2 << 20)

static size_t stream_span(size_t bytes) {
    size_t unit = bytes >= HUGE_PAGE ? HUGE_PAGE : (size_t)sysconf(_SC_PAGESIZE);
    return bytes ? (bytes + unit - 1) / unit * unit : unit;
}

void *toy_stream_alloc(size_t bytes) {
    size_t span = stream_span(bytes), lead = span >= HUGE_PAGE ? HUGE_PAGE : 0;
    if (span < bytes || span + lead < span) return NULL;
    char *m = mmap(NULL, span + lead, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return NULL;
    char *p = m;
    if (lead) { /* keep the 2 MiB-aligned span, give back the rest */
        p = (char *)(((uintptr_t)m + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
        if (p > m) munmap(m, (size_t)(p - m));
        if (m + span + lead > p + span) munmap(p + span, (size_t)(m + span + lead - (p + span)));
#ifdef MADV_HUGEPAGE
        madvise(p, span, MADV_HUGEPAGE); /* a hint: without THP the pages are ordinary */
#endif
    }
    return p;
}

void toy_stream_free(void *p, size_t bytes) {
    if (p) munmap(p, stream_span(bytes));
}

/* ---- tensors ------------------------------------------------------------------ */

static void set_contiguous_strides(struct toy_tensor *t) {
    const struct toy_dtype_info *in = toy_dtype_info(t->type);
    t->nb[0] = in->type_size;
    t->nb[1] = in->type_size * (size_t)(t->ne[0] / in->block_size);
    for (int i = 2; i < TOY_MAX_DIMS; i++) t->nb[i] = t->nb[i - 1] * (size_t)t->ne[i - 1];
}

struct toy_tensor *toy_tensor_alloc_meta(struct toy_ctx *ctx, enum toy_dtype type, int n_dims,
                                         const int64_t *ne) {
    TOY_ASSERT(toy_dtype_valid(type), "invalid dtype %d", (int)type);
    TOY_ASSERT(n_dims >= 1 && n_dims <= TOY_MAX_DIMS, "n_dims %d", n_dims);
    struct toy_tensor *t = toy_ctx_alloc(ctx, sizeof *t);
    t->type = type;
    t->n_dims = n_dims;
    double elems = 1;
    for (int i = 0; i < TOY_MAX_DIMS; i++) {
        t->ne[i] = i < n_dims ? ne[i] : 1;
        TOY_ASSERT(t->ne[i] >= 0, "negative dim %d: %lld", i, (long long)t->ne[i]);
        elems *= (double)t->ne[i];
    }
    /* the element count and byte size are int64 / size_t products: they must not wrap */
    TOY_ASSERT(elems * (double)toy_dtype_type_size(type) < 9.2e18, "tensor of %lld x %lld x %lld x %lld elements is too large",
               (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], (long long)t->ne[3]);
    TOY_ASSERT(t->ne[0] % toy_dtype_block_size(type) == 0,
               "ne0 %lld is not a multiple of %s's block size", (long long)t->ne[0],
               toy_dtype_name(type));
    set_contiguous_strides(t);
    t->id = -1;
    return t;
}

struct toy_tensor *toy_new_tensor(struct toy_ctx *ctx, enum toy_dtype type, int n_dims,
                                  const int64_t *ne) {
    struct toy_tensor *t = toy_tensor_alloc_meta(ctx, type, n_dims, ne);
    if (ctx->alloc_data) {
        size_t n = toy_nbytes(t);
        t->data = toy_ctx_alloc(ctx, n);
        ctx->data_bytes += n;
    }
    return t;
}

struct toy_tensor *toy_new_tensor_1d(struct toy_ctx *ctx, enum toy_dtype type, int64_t ne0) {
    return toy_new_tensor(ctx, type, 1, (int64_t[]){ne0});
}
struct toy_tensor *toy_new_tensor_2d(struct toy_ctx *ctx, enum toy_dtype type, int64_t ne0,
                                     int64_t ne1) {
    return toy_new_tensor(ctx, type, 2, (int64_t[]){ne0, ne1});
}
struct toy_tensor *toy_new_tensor_3d(struct toy_ctx *ctx, enum toy_dtype type, int64_t ne0,
                                     int64_t ne1, int64_t ne2) {
    return toy_new_tensor(ctx, type, 3, (int64_t[]){ne0, ne1, ne2});
}
struct toy_tensor *toy_new_tensor_4d(struct toy_ctx *ctx, enum toy_dtype type, int64_t ne0,
                                     int64_t ne1, int64_t ne2, int64_t ne3) {
    return toy_new_tensor(ctx, type, 4, (int64_t[]){ne0, ne1, ne2, ne3});
}

void toy_set_param(struct toy_tensor *t) { t->flags |= TOY_FLAG_PARAM; }
void toy_set_frozen(struct toy_tensor *t) { t->flags &= ~(uint32_t)TOY_FLAG_PARAM; }
void toy_set_input(struct toy_tensor *t) { t->flags |= TOY_FLAG_INPUT; }
void toy_set_output(struct toy_tensor *t) { t->flags |= TOY_FLAG_OUTPUT; }

struct toy_tensor *toy_set_name(struct toy_tensor *t, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->name, sizeof t->name, fmt, ap);
    va_end(ap);
    return t;
}

void toy_tensor_set_data(struct toy_tensor *t, void *data) { t->data = data; }

int64_t toy_nelements(const struct toy_tensor *t) {
    return t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
}

int64_t toy_nrows(const struct toy_tensor *t) { return t->ne[1] * t->ne[2] * t->ne[3]; }

size_t toy_nbytes(const struct toy_tensor *t) {
    for (int i = 0; i < TOY_MAX_DIMS; i++)
        if (t->ne[i] == 0) return 0;
    size_t n = toy_row_bytes(t->type, t->ne[0]);
    /* the row itself may be strided (a transposed view) */
    if (toy_dtype_block_size(t->type) == 1) n = (size_t)(t->ne[0] - 1) * t->nb[0] + t->nb[0];
    for (int i = 1; i < TOY_MAX_DIMS; i++) n += (size_t)(t->ne[i] - 1) * t->nb[i];
    return n;
}

bool toy_is_contiguous(const struct toy_tensor *t) {
    const struct toy_dtype_info *in = toy_dtype_info(t->type);
    if (t->nb[0] != in->type_size && t->ne[0] > 1) return false;
    size_t expect = toy_row_bytes(t->type, t->ne[0]);
    for (int i = 1; i < TOY_MAX_DIMS; i++) {
        if (t->ne[i] != 1 && t->nb[i] != expect) return false;
        expect *= (size_t)t->ne[i];
    }
    return true;
}

bool toy_same_shape(const struct toy_tensor *a, const struct toy_tensor *b) {
    for (int i = 0; i < TOY_MAX_DIMS; i++)
        if (a->ne[i] != b->ne[i]) return false;
    return true;
}

const char *toy_shape_str(const struct toy_tensor *t, char *buf, size_t n) {
    int nd = TOY_MAX_DIMS;
    while (nd > 1 && t->ne[nd - 1] == 1) nd--;
    size_t off = 0;
    off += (size_t)snprintf(buf + off, n - off, "(");
    for (int i = nd - 1; i >= 0 && off < n; i--)
        off += (size_t)snprintf(buf + off, n - off, "%lld%s", (long long)t->ne[i], i ? ", " : "");
    if (off < n) snprintf(buf + off, n - off, ") %s", toy_dtype_name(t->type));
    return buf;
}

/* The element at (i0, i1, i2, i3); an index outside the shape or a tensor
 * without data is a programming error, named with the shape. */
static char *elem_ptr(const struct toy_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
    const int64_t ix[4] = {i0, i1, i2, i3};
    for (int d = 0; d < 4; d++)
        if (ix[d] < 0 || ix[d] >= t->ne[d]) {
            char shape[96];
            TOY_ABORT("tensor '%s' %s: element index i%d = %lld is outside [0, ne%d = %lld)", toy_label(t),
                      toy_shape_str(t, shape, sizeof shape), d, (long long)ix[d], d, (long long)t->ne[d]);
        }
    TOY_ASSERT(t->data, "tensor '%s' has no data (not allocated or computed yet)", toy_label(t));
    return (char *)t->data + i0 * t->nb[0] + i1 * t->nb[1] + i2 * t->nb[2] + i3 * t->nb[3];
}

float toy_get_f32(const struct toy_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
    const char *p = elem_ptr(t, i0, i1, i2, i3);
    switch (t->type) {
    case TOY_F32: return *(const float *)p;
    case TOY_F16: return toy_f16_to_f32(*(const toy_f16 *)p);
    case TOY_BF16: return toy_bf16_to_f32(*(const toy_bf16 *)p);
    case TOY_I32: return (float)*(const int32_t *)p;
    default: TOY_ABORT("toy_get_f32: unsupported type %s", toy_dtype_name(t->type));
    }
}

void toy_set_f32(struct toy_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3, float v) {
    char *p = elem_ptr(t, i0, i1, i2, i3);
    switch (t->type) {
    case TOY_F32: *(float *)p = v; break;
    case TOY_F16: *(toy_f16 *)p = toy_f32_to_f16(v); break;
    case TOY_BF16: *(toy_bf16 *)p = toy_f32_to_bf16(v); break;
    case TOY_I32: *(int32_t *)p = (int32_t)v; break;
    default: TOY_ABORT("toy_set_f32: unsupported type %s", toy_dtype_name(t->type));
    }
}

void toy_tensor_to_f32(const struct toy_tensor *t, float *dst) {
    int64_t n = 0;
    for (int64_t i3 = 0; i3 < t->ne[3]; i3++)
        for (int64_t i2 = 0; i2 < t->ne[2]; i2++)
            for (int64_t i1 = 0; i1 < t->ne[1]; i1++)
                for (int64_t i0 = 0; i0 < t->ne[0]; i0++) dst[n++] = toy_get_f32(t, i0, i1, i2, i3);
}

void toy_tensor_from_f32(struct toy_tensor *t, const float *src) {
    int64_t n = 0;
    for (int64_t i3 = 0; i3 < t->ne[3]; i3++)
        for (int64_t i2 = 0; i2 < t->ne[2]; i2++)
            for (int64_t i1 = 0; i1 < t->ne[1]; i1++)
                for (int64_t i0 = 0; i0 < t->ne[0]; i0++) toy_set_f32(t, i0, i1, i2, i3, src[n++]);
}

/* ---- views ------------------------------------------------------------------------ */

static struct toy_tensor *base_of(struct toy_tensor *a) { return a->view_src ? a->view_src : a; }

struct toy_tensor *toy_view(struct toy_ctx *ctx, struct toy_tensor *a, int n_dims,
                            const int64_t *ne, const size_t *nb, size_t offset) {
    TOY_ASSERT(a, "toy_view: argument 'a' is NULL (did the call that made it fail?)");
    struct toy_tensor *t = toy_tensor_alloc_meta(ctx, a->type, n_dims, ne);
    for (int i = 0; i < n_dims; i++) t->nb[i] = nb[i];
    for (int i = n_dims; i < TOY_MAX_DIMS; i++) t->nb[i] = t->nb[i - 1] * (size_t)t->ne[i - 1];
    TOY_ASSERT(offset + toy_nbytes(t) <= toy_nbytes(a) || toy_nelements(t) == 0,
               "view of %s out of bounds (offset %zu + %zu > %zu)", toy_label(a), offset,
               toy_nbytes(t), toy_nbytes(a));
    t->op = TOY_OP_VIEW;
    t->src[0] = a;
    t->view_src = base_of(a);
    t->view_offs = (a->view_src ? a->view_offs : 0) + offset;
    t->op_params[0] = (int32_t)(offset & 0x7fffffff);
    t->op_params[1] = (int32_t)(offset >> 31);
    if (a->data) t->data = (char *)a->data + offset;
    return t;
}

struct toy_tensor *toy_reshape(struct toy_ctx *ctx, struct toy_tensor *a, int n_dims,
                               const int64_t *ne) {
    TOY_ASSERT(a, "toy_reshape: argument 'a' is NULL (did the call that made it fail?)");
    TOY_ASSERT(toy_is_contiguous(a), "reshape of non-contiguous tensor %s", toy_label(a));
    struct toy_tensor *t = toy_tensor_alloc_meta(ctx, a->type, n_dims, ne);
    TOY_ASSERT(toy_nelements(t) == toy_nelements(a), "reshape %s: %lld elements to %lld",
               toy_label(a), (long long)toy_nelements(a), (long long)toy_nelements(t));
    t->op = TOY_OP_RESHAPE;
    t->src[0] = a;
    t->view_src = base_of(a);
    t->view_offs = a->view_src ? a->view_offs : 0;
    t->data = a->data;
    return t;
}

struct toy_tensor *toy_reshape_2d(struct toy_ctx *ctx, struct toy_tensor *a, int64_t ne0,
                                  int64_t ne1) {
    return toy_reshape(ctx, a, 2, (int64_t[]){ne0, ne1});
}
struct toy_tensor *toy_reshape_3d(struct toy_ctx *ctx, struct toy_tensor *a, int64_t ne0,
                                  int64_t ne1, int64_t ne2) {
    return toy_reshape(ctx, a, 3, (int64_t[]){ne0, ne1, ne2});
}
struct toy_tensor *toy_reshape_4d(struct toy_ctx *ctx, struct toy_tensor *a, int64_t ne0,
                                  int64_t ne1, int64_t ne2, int64_t ne3) {
    return toy_reshape(ctx, a, 4, (int64_t[]){ne0, ne1, ne2, ne3});
}

struct toy_tensor *toy_permute(struct toy_ctx *ctx, struct toy_tensor *a, int ax0, int ax1,
                               int ax2, int ax3) {
    TOY_ASSERT(a, "toy_permute: argument 'a' is NULL (did the call that made it fail?)");
    int ax[4] = {ax0, ax1, ax2, ax3};
    int seen = 0;
    for (int i = 0; i < 4; i++) {
        TOY_ASSERT(ax[i] >= 0 && ax[i] < 4, "permute axis %d", ax[i]);
        seen |= 1 << ax[i];
    }
    TOY_ASSERT(seen == 15, "permute axes are not a permutation");
    int64_t ne[4];
    for (int i = 0; i < 4; i++) ne[i] = a->ne[ax[i]];
    struct toy_tensor *t = toy_tensor_alloc_meta(ctx, a->type, 4, ne);
    for (int i = 0; i < 4; i++) t->nb[i] = a->nb[ax[i]];
    t->n_dims = a->n_dims;
    t->op = TOY_OP_PERMUTE;
    for (int i = 0; i < 4; i++) t->op_params[i] = ax[i];
    t->src[0] = a;
    t->view_src = base_of(a);
    t->view_offs = a->view_src ? a->view_offs : 0;
    t->data = a->data;
    return t;
}

struct toy_tensor *toy_transpose(struct toy_ctx *ctx, struct toy_tensor *a) {
    return toy_permute(ctx, a, 1, 0, 2, 3);
}
