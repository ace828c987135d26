/* pack-weights.c: a model's inference matrices in one block for this CPU
 * (pack-weights.h): the Llama family's (toy_llama_pack_weights) and
 * GPT-2's (toy_gpt2_pack_weights). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "models/pack-weights.h"
#include "toy/device.h"
#include "toy/status.h"

/* A float matrix read from the file's mapping, which decode would stream
 * from 4 KiB pages */
static bool mapped_float(const struct toy_gguf *gguf, const struct toy_tensor *t) {
    return (t->type == TOY_F32 || t->type == TOY_F16 || t->type == TOY_BF16) && !(t->flags & TOY_FLAG_PARAM) &&
           gguf && toy_gguf_maps(gguf, t->data, toy_nbytes(t));
}

static size_t copy_bytes(const struct toy_tensor *t) { return (toy_nbytes(t) + 63) / 64 * 64; }

/* bytes the system could give without swapping (/proc/meminfo's
 * MemAvailable: free memory plus what the page cache can drop), or the free
 * pages where that is not there */
static double available_bytes(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    char line[128];
    double kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %lf kB", &kb) == 1) break;
    if (f) fclose(f);
    if (kb >= 0) return kb * 1024;
    return (double)sysconf(_SC_AVPHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
}

/* matrices dealt out to threads as they get to them: each packed, or (a
 * float one, at[i] set) copied, into its place at[i] */
struct pack_job {
    struct toy_tensor *const *w;
    int n;
    char **at;
    void **file; /* each matrix's data before: the file's pages */
    atomic_int next;
};

static void *pack_worker(void *arg) {
    struct pack_job *j = arg;
    for (int i; (i = atomic_fetch_add(&j->next, 1)) < j->n;) {
        if (!j->at[i]) continue;
        if (toy_tensor_pack_bytes(j->w[i])) {
            toy_tensor_pack_into(j->w[i], j->at[i]);
        } else {
            memcpy(j->at[i], j->file[i], toy_nbytes(j->w[i]));
            j->w[i]->data = j->at[i];
        }
    }
    return NULL;
}

enum toy_status toy_pack_inference_weights(struct toy_gguf *gguf, struct toy_tensor *const *w, int n, void **out,
                                           size_t *out_bytes) {
    *out = NULL;
    *out_bytes = 0;
    /* Float matrices are copied too (they decode ~10% faster from huge
     * pages: F32 SmolLM2-135M on 2 threads of an Emerald Rapids Xeon, 37
     * against 34 tok/s), unless $TOY_MAP_WEIGHTS is set or the copies would
     * take more than half the memory available: a private copy cannot be
     * dropped and read again under memory pressure as the file's pages can,
     * nor shared with another process mapping the same file. */
    size_t packed = 0, floats = 0;
    for (int i = 0; i < n; i++) {
        packed += toy_tensor_pack_bytes(w[i]);
        if (mapped_float(gguf, w[i])) floats += copy_bytes(w[i]);
    }
    bool copy = floats && !getenv("TOY_MAP_WEIGHTS") && (double)floats <= 0.5 * available_bytes();
    size_t total = packed + (copy ? floats : 0);
    if (!total) return TOY_OK;
    /* one block for all of them: decode streams it, on huge pages where the
     * system has them */
    char *block = toy_stream_alloc(total);
    if (!block) return toy_error(TOY_ERR_NOMEM, "packing weights: %zu bytes", total);
    *out = block;
    *out_bytes = total;
    /* each matrix's place in the block, then the copies made by a few
     * threads (packing runs at 0.2-1.6 GB/s of file a core, so a 1 GB model
     * took seconds on one), then the file's pages let go */
    struct pack_job job = {.w = w, .n = n};
    job.at = malloc((size_t)n * sizeof *job.at);
    job.file = malloc((size_t)n * sizeof *job.file);
    if (!job.at || !job.file) {
        free(job.at);
        free(job.file);
        toy_stream_free(block, total);
        *out = NULL;
        *out_bytes = 0;
        return toy_error(TOY_ERR_NOMEM, "packing weights: %d offsets", n);
    }
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        size_t bytes = toy_tensor_pack_bytes(w[i]);
        if (!bytes && copy && mapped_float(gguf, w[i])) bytes = copy_bytes(w[i]);
        job.at[i] = bytes ? block + off : NULL;
        job.file[i] = w[i]->data;
        off += bytes;
    }
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int nth = cores < 1 ? 1 : cores > 8 ? 8 : (int)cores, started = 0;
    if (nth > n) nth = n;
    pthread_t tid[8];
    for (int t = 1; t < nth; t++)
        if (!pthread_create(&tid[started], NULL, pack_worker, &job)) started++;
    pack_worker(&job); /* this thread too: with none started, all of it */
    for (int t = 0; t < started; t++) pthread_join(tid[t], NULL);
    for (int i = 0; i < n; i++) /* the copies replace the file's pages for inference */
        if (job.at[i]) toy_gguf_release(gguf, job.file[i], toy_nbytes(w[i]));
    free(job.at);
    free(job.file);
    return TOY_OK;
}

void toy_unpack_inference_weights(struct toy_tensor *const *w, int n, void *block, size_t bytes) {
    for (int i = 0; i < n; i++)
        if (w[i]) toy_tensor_unpack(w[i]);
    toy_stream_free(block, bytes);
}

bool toy_inference_bf16_pays(struct toy_tensor *const *w, int n) {
    if (!strcmp(toy_device_default(), "cpu") && !toy_cpu_bf16_native()) return false;
    for (int i = 0; i < n; i++)
        if (w[i]->type == TOY_F32 || w[i]->type == TOY_F16) return true;
    return false; /* nothing to round */
}
