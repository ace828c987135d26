/* grad-sync.c: the gradient all-reduce of data parallelism, bucket by
 * bucket as the backward pass finishes them (toy/collective.h,
 * toy_grad_sync), and its ZeRO-1 form (reduce-scatter of the gradients,
 * all-gather of the updated parameters, gather of the sharded optimizer
 * state for checkpoints).
 *
 * Invariants:
 *  - the buckets are cut once, by toy_bucket_next over the buffers in the
 *    caller's order, so every rank cuts the same ones; a bucket becomes
 *    startable when the largest `ready` of its buffers has been reported;
 *  - buckets start strictly in index order and complete in that order
 *    (bucket k on slot k % TOY_COLLECTIVE_SLOTS), so every rank issues the
 *    same collectives in the same order whether or not the starts are
 *    interleaved with the backward pass: overlap changes when a bucket is
 *    sent, never what is summed, and the results are bit-identical;
 *  - each element is scaled by `prescale` before it is sent and by 1/world
 *    after the sum, by the same host (or transport) loop on both paths;
 *  - ZeRO-1: rank r owns elements [E r / W, E (r+1) / W) of every bucket of
 *    E elements; its shard is the concatenation of those parts in bucket
 *    order (toy_grad_sync_shard), which is also the layout of the sharded
 *    optimizer state that toy_grad_sync_gather_shard collects.
 * Progress: Open MPI advances non-blocking collectives only inside MPI
 * calls, so toy_grad_sync_ready tests the oldest bucket in flight on every
 * call (after every node of the backward pass when it is the graph's node
 * callback); MPI stays MPI_THREAD_FUNNELED (the compute threads never call
 * it). docs/distributed.md has the measurements.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/collective-impl.h"

struct toy_grad_sync {
    struct toy_collective *c;
    int n;
    float **grads, **params;       /* n buffers each (params: ZeRO-1 only) */
    int64_t *counts;
    bool zero, solo;               /* solo: one rank, only the prescale is applied */
    int nb;                        /* buckets */
    int *first, *npieces, *ready;  /* bucket k: pieces[first[k] ..+ npieces[k]), startable at ready[k] */
    int64_t *elems;
    struct toy_bucket_piece *pieces;
    /* ZeRO-1 */
    int *cnt, *dsp;                /* [nb][world]: each rank's part of each bucket */
    struct toy_bucket_piece *shard; /* this rank's parts, bucket after bucket */
    int *shard_first;              /* [nb + 1]: bucket k's are shard[shard_first[k] .. shard_first[k+1]) */
    int64_t *shard_off;            /* [nb]: where bucket k's part starts in the flat shard */
    int64_t shard_elems;
    float *recv[TOY_COLLECTIVE_SLOTS];
    /* the step in progress */
    bool running;
    float prescale;
    int upto, next, done;          /* reported node; buckets started; buckets finished */
    int64_t bytes;
};

static enum toy_status nomem(void) { return toy_error(TOY_ERR_NOMEM, "gradient sync plan"); }

void toy_grad_sync_free(struct toy_grad_sync *s) {
    if (!s) return;
    for (int k = 0; k < TOY_COLLECTIVE_SLOTS; k++) { /* allocated as plan_shards did */
        if (s->recv[k] && s->c->ops && s->c->ops->alloc && s->c->ops->free) s->c->ops->free(s->c, s->recv[k]);
        else free(s->recv[k]);
    }
    free(s->grads);
    free(s->params);
    free(s->counts);
    free(s->first);
    free(s->npieces);
    free(s->ready);
    free(s->elems);
    free(s->pieces);
    free(s->cnt);
    free(s->dsp);
    free(s->shard);
    free(s->shard_first);
    free(s->shard_off);
    free(s);
}

/* ZeRO-1: each rank's part of each bucket and this rank's pieces. */
static enum toy_status plan_shards(struct toy_grad_sync *s) {
    int W = s->c->world, r = s->c->rank;
    s->cnt = malloc((size_t)s->nb * (size_t)W * sizeof *s->cnt);
    s->dsp = malloc((size_t)s->nb * (size_t)W * sizeof *s->dsp);
    s->shard_first = malloc(((size_t)s->nb + 1) * sizeof *s->shard_first);
    s->shard_off = malloc(((size_t)s->nb + 1) * sizeof *s->shard_off);
    /* a part of a bucket crosses at most all of its pieces */
    int total = 0;
    for (int k = 0; k < s->nb; k++) total += s->npieces[k];
    s->shard = malloc((size_t)(total ? total : 1) * sizeof *s->shard);
    if (!s->cnt || !s->dsp || !s->shard_first || !s->shard_off || !s->shard) return nomem();
    int ns = 0;
    int64_t flat = 0;
    for (int k = 0; k < s->nb; k++) {
        int64_t E = s->elems[k];
        for (int q = 0; q < W; q++) {
            int64_t lo = E * q / W, hi = E * (q + 1) / W;
            s->dsp[k * W + q] = (int)lo;
            s->cnt[k * W + q] = (int)(hi - lo);
        }
        int64_t lo = s->dsp[k * W + r], hi = lo + s->cnt[k * W + r], pos = 0;
        s->shard_first[k] = ns;
        s->shard_off[k] = flat;
        for (int i = 0; i < s->npieces[k]; i++) {
            const struct toy_bucket_piece *p = &s->pieces[s->first[k] + i];
            int64_t a = pos > lo ? pos : lo, b = pos + p->count < hi ? pos + p->count : hi;
            if (b > a) s->shard[ns++] = (struct toy_bucket_piece){p->buf, p->off + (a - pos), b - a};
            pos += p->count;
        }
        flat += hi - lo;
    }
    s->shard_first[s->nb] = ns;
    s->shard_off[s->nb] = flat;
    s->shard_elems = flat;
    int64_t most = 0;
    for (int k = 0; k < s->nb; k++)
        if (s->cnt[k * W + r] > most) most = s->cnt[k * W + r];
    for (int k = 0; k < TOY_COLLECTIVE_SLOTS; k++) {
        size_t bytes = (size_t)(most ? most : 1) * sizeof(float);
        s->recv[k] = s->c->ops && s->c->ops->alloc ? s->c->ops->alloc(s->c, bytes) : malloc(bytes);
        if (!s->recv[k]) return nomem();
    }
    return TOY_OK;
}

enum toy_status toy_grad_sync_new(struct toy_collective *c, float *const *grads, float *const *params,
                                  const int64_t *counts, const int *ready, int n, bool zero,
                                  struct toy_grad_sync **out) {
    if (!out) return toy_error(TOY_ERR_INVALID_ARG, "toy_grad_sync_new: out is NULL");
    *out = NULL;
    if (n < 0 || (zero && !params)) return toy_error(TOY_ERR_INVALID_ARG, "gradient sync: %d buffers%s", n,
                                                     zero && !params ? ", ZeRO-1 without parameters" : "");
    bool solo = !c->ops || c->world == 1;
    if (zero && !solo && (!c->ops->start_reduce_scatter_f32 || !c->ops->start_allgather_f32))
        return toy_error(TOY_ERR_UNSUPPORTED, "ZeRO-1: the %s transport has no reduce-scatter / all-gather",
                         c->ops->name);
    struct toy_grad_sync *s = calloc(1, sizeof *s);
    if (!s) return nomem();
    s->c = c;
    s->n = n;
    s->zero = zero;
    s->solo = solo;
    size_t nn = (size_t)(n ? n : 1);
    s->grads = malloc(nn * sizeof *s->grads);
    s->params = malloc(nn * sizeof *s->params);
    s->counts = malloc(nn * sizeof *s->counts);
    if (!s->grads || !s->params || !s->counts) goto oom;
    for (int i = 0; i < n; i++) {
        s->grads[i] = grads[i];
        s->params[i] = params ? params[i] : NULL;
        s->counts[i] = counts[i];
    }
    int64_t cap = (int64_t)(c->bucket_bytes / sizeof(float)), elems;
    struct toy_bucket_piece tmp[TOY_BUCKET_MAX_PIECES];
    struct toy_bucket_cursor cur = {0, 0};
    int capb = 0, capp = 0, np;
    while ((np = toy_bucket_next(s->counts, n, cap, &cur, tmp, TOY_BUCKET_MAX_PIECES, &elems)) > 0) {
        if (s->nb == capb) {
            capb = capb ? capb * 2 : 16;
            int *f = realloc(s->first, (size_t)capb * sizeof *f);
            if (f) s->first = f;
            int *q = realloc(s->npieces, (size_t)capb * sizeof *q);
            if (q) s->npieces = q;
            int *r = realloc(s->ready, (size_t)capb * sizeof *r);
            if (r) s->ready = r;
            int64_t *e = realloc(s->elems, (size_t)capb * sizeof *e);
            if (e) s->elems = e;
            if (!f || !q || !r || !e) goto oom;
        }
        int have = s->nb ? s->first[s->nb - 1] + s->npieces[s->nb - 1] : 0;
        if (have + np > capp) {
            capp = (have + np) * 2;
            struct toy_bucket_piece *p = realloc(s->pieces, (size_t)capp * sizeof *p);
            if (!p) goto oom;
            s->pieces = p;
        }
        int rk = INT_MIN;
        for (int i = 0; i < np; i++) {
            s->pieces[have + i] = tmp[i];
            int r = ready ? ready[tmp[i].buf] : -1;
            if (r > rk) rk = r;
        }
        s->first[s->nb] = have;
        s->npieces[s->nb] = np;
        s->ready[s->nb] = rk;
        s->elems[s->nb] = elems;
        s->nb++;
    }
    if (zero) {
        if (solo) { /* one rank owns everything: a ZeRO plan over a world of one */
            struct toy_collective one = *c;
            one.world = 1;
            one.rank = 0;
            s->c = &one;
            enum toy_status st = plan_shards(s);
            s->c = c;
            if (st) goto fail;
        } else if (plan_shards(s)) {
            goto fail;
        }
    }
    *out = s;
    return TOY_OK;
oom:
    nomem();
fail:
    toy_grad_sync_free(s);
    return TOY_ERR_NOMEM;
}

int toy_grad_sync_n_buckets(const struct toy_grad_sync *s) { return s->nb; }
int toy_grad_sync_bucket_ready(const struct toy_grad_sync *s, int k) { return s->ready[k]; }
int toy_grad_sync_started(const struct toy_grad_sync *s) { return s->next; }

int toy_grad_sync_shard(const struct toy_grad_sync *s, const struct toy_bucket_piece **pieces, int64_t *elems) {
    *pieces = s->shard;
    if (elems) *elems = s->shard_elems;
    return s->zero ? s->shard_first[s->nb] : 0;
}

/* ---- the per-step all-reduce ----------------------------------------------------- */

static void start_bucket(struct toy_grad_sync *s, int k) {
    struct toy_collective *c = s->c;
    const struct toy_bucket_piece *p = &s->pieces[s->first[k]];
    int np = s->npieces[k], slot = k % TOY_COLLECTIVE_SLOTS;
    if (s->solo) { /* the mean over one rank: the prescale alone */
        if (s->prescale != 1.0f)
            for (int i = 0; i < np; i++) toy_coll_scale(c, slot, s->grads[p[i].buf] + p[i].off, p[i].count, s->prescale);
        return;
    }
    float *buf;
    if (np == 1) {
        buf = s->grads[p[0].buf] + p[0].off;
    } else {
        buf = c->stage[slot];
        int64_t at = 0;
        for (int i = 0; i < np; i++) {
            toy_coll_copy(c, slot, buf + at, s->grads[p[i].buf] + p[i].off, (size_t)p[i].count * sizeof(float));
            at += p[i].count;
        }
    }
    if (s->prescale != 1.0f) toy_coll_scale(c, slot, buf, s->elems[k], s->prescale);
    enum toy_status st = s->zero ? c->ops->start_reduce_scatter_f32(c, slot, buf, s->recv[slot], s->cnt + (size_t)k * c->world)
                                 : c->ops->start_allreduce_f32(c, slot, buf, s->elems[k]);
    if (st) toy_coll_fail(c, st);
    s->bytes += s->elems[k] * (int64_t)sizeof(float);
}

/* Scales a summed bucket by 1/world and unpacks it (ZeRO-1: this rank's
 * part, into its positions in the gradients). */
static void finish_bucket(struct toy_grad_sync *s, int k) {
    struct toy_collective *c = s->c;
    if (s->solo) return;
    const struct toy_bucket_piece *p = &s->pieces[s->first[k]];
    int np = s->npieces[k], slot = k % TOY_COLLECTIVE_SLOTS;
    float inv = 1.0f / (float)c->world;
    if (s->zero) {
        float *r = s->recv[slot];
        toy_coll_scale(c, slot, r, s->cnt[(size_t)k * c->world + c->rank], inv);
        for (int i = s->shard_first[k]; i < s->shard_first[k + 1]; i++) {
            toy_coll_copy(c, slot, s->grads[s->shard[i].buf] + s->shard[i].off, r, (size_t)s->shard[i].count * sizeof(float));
            r += s->shard[i].count;
        }
    } else if (np == 1) {
        toy_coll_scale(c, slot, s->grads[p[0].buf] + p[0].off, s->elems[k], inv);
    } else {
        float *stage = c->stage[slot];
        toy_coll_scale(c, slot, stage, s->elems[k], inv);
        for (int i = 0; i < np; i++) {
            toy_coll_copy(c, slot, s->grads[p[i].buf] + p[i].off, stage, (size_t)p[i].count * sizeof(float));
            stage += p[i].count;
        }
    }
}

enum toy_status toy_grad_sync_begin(struct toy_grad_sync *s, float prescale) {
    if (s->c->broken) return toy_coll_broken_error(s->c);
    if (s->running) return toy_error(TOY_ERR_STATE, "gradient sync: begin before the previous step's end");
    if (!s->solo) {
        enum toy_status st = toy_coll_ensure_stage(s->c);
        if (st) return st;
    }
    s->running = true;
    s->prescale = prescale;
    s->upto = INT_MIN;
    s->next = s->done = 0;
    s->bytes = 0;
    toy_grad_sync_ready(s, -1); /* gradients no node writes are final already */
    return TOY_OK;
}

void toy_grad_sync_ready(struct toy_grad_sync *s, int upto) {
    struct toy_collective *c = s->c;
    if (!s->running || c->broken) return;
    if (upto > s->upto) s->upto = upto;
    for (;;) {
        while (s->done < s->next) { /* the oldest first: buckets complete in order */
            int r = s->solo ? 1 : c->ops->test(c, s->done % TOY_COLLECTIVE_SLOTS);
            if (r < 0) {
                char msg[400];
                snprintf(msg, sizeof msg, "%s", toy_last_error());
                toy_coll_fail(c, toy_error(TOY_ERR_IO, "rank %d of %d: %s of bucket %d failed: %s", c->rank, c->world,
                                           s->zero ? "reduce-scatter" : "all-reduce", s->done, msg));
                return;
            }
            if (!r) break;
            finish_bucket(s, s->done++);
        }
        if (s->next < s->nb && s->next - s->done < TOY_COLLECTIVE_SLOTS && s->ready[s->next] <= s->upto) {
            start_bucket(s, s->next++);
            if (c->broken) return;
            continue;
        }
        return;
    }
}

void toy_grad_sync_on_node(void *s, int node) { toy_grad_sync_ready(s, node); }

enum toy_status toy_grad_sync_end(struct toy_grad_sync *s) {
    struct toy_collective *c = s->c;
    if (!s->running) return toy_error(TOY_ERR_STATE, "gradient sync: end without begin");
    if (c->broken) {
        s->running = false;
        return toy_coll_broken_error(c);
    }
    double t0 = toy_coll_now();
    char what[96];
    while (s->done < s->nb) {
        toy_grad_sync_ready(s, INT_MAX);
        if (c->broken) break;
        if (s->done == s->nb) break;
        int k = s->done;
        snprintf(what, sizeof what, "%s of bucket %d of %d (%lld floats)", s->zero ? "reduce-scatter" : "all-reduce",
                 k + 1, s->nb, (long long)s->elems[k]);
        if (toy_coll_wait(c, k % TOY_COLLECTIVE_SLOTS, what, t0)) break;
        finish_bucket(s, s->done++);
    }
    s->running = false;
    if (c->broken) return toy_coll_broken_error(c);
    if (!s->solo) {
        c->stats.calls++;
        c->stats.buckets += s->nb;
        c->stats.bytes += s->bytes;
        c->stats.seconds += toy_coll_now() - t0;
    }
    return TOY_OK;
}

/* ---- ZeRO-1: parameters and optimizer state ---------------------------------------- */

/* An all-gather, bucket by bucket (TOY_COLLECTIVE_SLOTS in flight): of the
 * parameters after a sharded update (each rank's part is in place in the
 * parameters, or packed into the stage at its displacement), or of the
 * flat shards of the optimizer state into root's full arrays. */
struct gather_job {
    struct toy_grad_sync *s;
    const float *shard; /* gather_shard: the flat shard; NULL: the parameters */
    float *const *full; /* gather_shard: root's destinations (NULL elsewhere) */
};

static float *gather_buf(struct gather_job *j, int k) {
    struct toy_grad_sync *s = j->s;
    struct toy_collective *c = s->c;
    int slot = k % TOY_COLLECTIVE_SLOTS;
    const struct toy_bucket_piece *p = &s->pieces[s->first[k]];
    float *stage = c->stage[slot];
    float *mine = stage + s->dsp[(size_t)k * c->world + c->rank];
    if (j->shard) {
        toy_coll_copy(c, slot, mine, j->shard + s->shard_off[k], (size_t)(s->shard_off[k + 1] - s->shard_off[k]) * sizeof(float));
        return stage;
    }
    if (s->npieces[k] == 1) return s->params[p[0].buf] + p[0].off; /* in place */
    for (int i = s->shard_first[k]; i < s->shard_first[k + 1]; i++) {
        toy_coll_copy(c, slot, mine, s->params[s->shard[i].buf] + s->shard[i].off, (size_t)s->shard[i].count * sizeof(float));
        mine += s->shard[i].count;
    }
    return stage;
}

static void gather_done(struct gather_job *j, int k, float *buf) {
    struct toy_grad_sync *s = j->s;
    int slot = k % TOY_COLLECTIVE_SLOTS;
    const struct toy_bucket_piece *p = &s->pieces[s->first[k]];
    float *const *dst = j->shard ? j->full : s->params;
    if (!dst || (!j->shard && s->npieces[k] == 1)) return;
    for (int i = 0; i < s->npieces[k]; i++) {
        toy_coll_copy(s->c, slot, dst[p[i].buf] + p[i].off, buf, (size_t)p[i].count * sizeof(float));
        buf += p[i].count;
    }
}

static enum toy_status run_gather(struct gather_job *j, const char *what_kind) {
    struct toy_grad_sync *s = j->s;
    struct toy_collective *c = s->c;
    if (c->broken) return toy_coll_broken_error(c);
    if (s->running) return toy_error(TOY_ERR_STATE, "gradient sync: %s while gradients are in flight", what_kind);
    enum toy_status st = toy_coll_ensure_stage(c);
    if (st) return st;
    double t0 = toy_coll_now();
    float *bufs[TOY_COLLECTIVE_SLOTS] = {0};
    char what[96];
    int64_t bytes = 0;
    for (int k = 0; k < s->nb + TOY_COLLECTIVE_SLOTS; k++) {
        int w = k - TOY_COLLECTIVE_SLOTS; /* the bucket that used this slot before */
        if (w >= 0 && w < s->nb) {
            snprintf(what, sizeof what, "all-gather of %s bucket %d of %d", what_kind, w + 1, s->nb);
            if ((st = toy_coll_wait(c, w % TOY_COLLECTIVE_SLOTS, what, t0))) return st;
            gather_done(j, w, bufs[w % TOY_COLLECTIVE_SLOTS]);
        }
        if (k >= s->nb) continue;
        int slot = k % TOY_COLLECTIVE_SLOTS;
        bufs[slot] = gather_buf(j, k);
        if ((st = c->ops->start_allgather_f32(c, slot, bufs[slot], s->cnt + (size_t)k * c->world,
                                              s->dsp + (size_t)k * c->world)))
            return toy_coll_fail(c, st);
        bytes += s->elems[k] * (int64_t)sizeof(float);
    }
    c->stats.calls++;
    c->stats.buckets += s->nb;
    c->stats.bytes += bytes;
    c->stats.seconds += toy_coll_now() - t0;
    return TOY_OK;
}

enum toy_status toy_grad_sync_allgather_params(struct toy_grad_sync *s) {
    if (!s->zero) return toy_error(TOY_ERR_STATE, "gradient sync: all-gather of parameters without ZeRO-1");
    if (s->solo) return TOY_OK;
    struct gather_job j = {s, NULL, NULL};
    return run_gather(&j, "parameter");
}

enum toy_status toy_grad_sync_gather_shard(struct toy_grad_sync *s, const float *shard, float *const *full, int root) {
    if (!s->zero) return toy_error(TOY_ERR_STATE, "gradient sync: gather of a shard without ZeRO-1");
    if (s->solo) { /* the shard is everything */
        if (!full) return TOY_OK;
        for (int i = 0; i < s->shard_first[s->nb]; i++) {
            memcpy(full[s->shard[i].buf] + s->shard[i].off, shard, (size_t)s->shard[i].count * sizeof(float));
            shard += s->shard[i].count;
        }
        return TOY_OK;
    }
    struct gather_job j = {s, shard, s->c->rank == root ? full : NULL};
    return run_gather(&j, "optimizer-state");
}
