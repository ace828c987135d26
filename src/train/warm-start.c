/* warm-start.c: warm start (toy/finetune.h): a fresh model's token
 * embeddings initialised from a donor GGUF's token_embd.
 *
 * Tokens are matched by piece text through both tokenizers (identity when
 * either has none and the vocabularies are the same size); unmatched tokens
 * keep their random init. Equal widths copy rows. Different widths go
 * through the donor's principal directions (PCA, as the earlier toy's
 * prep/pca_init helper did for its projection lens): E' = (E - mean) V_k,
 * V_k the top-k eigenvectors of the donor embeddings' covariance (LAPACK
 * ssyevd from the OpenBLAS toy links; k = min of the widths, the rest zero),
 * rescaled so E' has the donor's per-element RMS. That projection is then
 * learned: E' = D P + R with D the centred donor rows (zero for unmatched
 * tokens, frozen), P = s V_k (padded with zero columns) trainable, and R =
 * tok_embd the residual (zero for matched tokens, the random init for the
 * others), so training starts exactly from the PCA embedding and P keeps
 * learning with the model; saving folds D P + R into token_embd.weight
 * (src/models/llama-embd-proj.c). A model whose token_embd is not trainable
 * gets the fixed PCA embedding in token_embd.
 * Invariant: only m->tok_embd's data (and the attached projection) change. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "toy/finetune.h"
#include "toy/gguf.h"

/* LAPACK (bundled with OpenBLAS) */
void ssyevd_(const char *jobz, const char *uplo, const int *n, float *a, const int *lda, float *w, float *work,
             const int *lwork, int *iwork, const int *liwork, int *info);

/* top-k eigenvectors of the d x d symmetric c, as columns of v (d x k, row-major) */
static enum toy_status top_eigvecs(float *c, int d, int k, float *v, double *explained) {
    float *w = malloc((size_t)d * sizeof *w), wq;
    int lwork = -1, liwork = -1, iwq, info = 0;
    ssyevd_("V", "U", &d, c, &d, w, &wq, &lwork, &iwq, &liwork, &info);
    lwork = (int)wq;
    liwork = iwq;
    float *work = malloc((size_t)lwork * sizeof *work);
    int *iwork = malloc((size_t)liwork * sizeof *iwork);
    if (!w || !work || !iwork) { free(w); free(work); free(iwork); return toy_error(TOY_ERR_NOMEM, "warm start: PCA"); }
    ssyevd_("V", "U", &d, c, &d, w, work, &lwork, iwork, &liwork, &info);
    enum toy_status st = info ? toy_error(TOY_ERR_NUMERIC, "warm start: eigen-decomposition failed (%d)", info) : TOY_OK;
    double total = 0, top = 0;
    for (int j = 0; j < d; j++) total += w[j] > 0 ? w[j] : 0;
    for (int j = 0; j < k && !st; j++) { /* ascending eigenvalues: the last k; column j of c is eigenvector j */
        int src = d - 1 - j;
        top += w[src] > 0 ? w[src] : 0;
        for (int i = 0; i < d; i++) v[(size_t)i * k + j] = c[(size_t)src * d + i];
    }
    *explained = total > 0 ? top / total : 0;
    free(w);
    free(work);
    free(iwork);
    return st;
}

enum toy_status toy_llama_warm_start(struct toy_llama *m, const struct toy_tokenizer *tok, const char *donor_path,
                                     struct toy_warm_start_report *rep) {
    struct toy_warm_start_report r = {0};
    struct toy_tensor *E = m->tok_embd;
    if (E->type != TOY_F32 || !E->data)
        return toy_error(TOY_ERR_INVALID_ARG, "warm start: the model's token_embd must be f32 in memory");
    struct toy_gguf *g;
    enum toy_status st = toy_gguf_open(donor_path, &g);
    if (st) return st;
    int64_t ti = toy_gguf_find_tensor(g, "token_embd.weight");
    struct toy_tokenizer *dtok = NULL;
    float *D = NULL, *v = NULL, *cov = NULL, *mean = NULL;
    int32_t *map = NULL;
    if (ti < 0) { st = toy_error(TOY_ERR_FORMAT, "%s: no token_embd.weight", donor_path); goto done; }
    const struct toy_gguf_tensor *dt = toy_gguf_tensor(g, ti);
    int64_t dd = dt->ne[0], dv = dt->ne[1], md = E->ne[0], mv = E->ne[1];
    r.donor_d = dd;
    r.model_d = md;
    if (!(D = malloc((size_t)dt->n_elements * sizeof *D)) || !(map = malloc((size_t)mv * sizeof *map))) {
        st = toy_error(TOY_ERR_NOMEM, "warm start: %s", donor_path);
        goto done;
    }
    if ((st = toy_gguf_tensor_read_f32(g, ti, D, dt->n_elements))) goto done;
    /* the token map: model id -> donor id or -1 */
    if (tok && toy_tokenizer_load_gguf(g, &dtok) == TOY_OK) {
        for (int64_t i = 0; i < mv; i++) {
            const char *p = i < toy_tokenizer_n_vocab(tok) ? toy_tokenizer_piece(tok, (int32_t)i) : NULL;
            int32_t j = p ? toy_tokenizer_find(dtok, p, strlen(p)) : -1;
            map[i] = j >= 0 && j < dv ? j : -1;
        }
    } else if (dv == mv) {
        for (int64_t i = 0; i < mv; i++) map[i] = (int32_t)i;
    } else {
        st = toy_error(TOY_ERR_INVALID_ARG, "warm start: vocabularies differ (%lld vs %lld) and there are no "
                       "tokenizers to match tokens by", (long long)dv, (long long)mv);
        goto done;
    }
    float *e = E->data; /* (mv, md) */
    if (dd == md) {
        for (int64_t i = 0; i < mv; i++)
            if (map[i] >= 0) memcpy(e + i * md, D + (int64_t)map[i] * dd, (size_t)md * sizeof *e);
    } else {
        /* PCA over (up to 16384 evenly spaced) donor rows */
        int64_t step = dv > 16384 ? dv / 16384 : 1, n = 0;
        mean = calloc((size_t)dd, sizeof *mean);
        cov = calloc((size_t)(dd * dd), sizeof *cov);
        double *acc = calloc((size_t)(dd * dd), sizeof *acc), *macc = calloc((size_t)dd, sizeof *macc);
        int k = (int)(dd < md ? dd : md);
        v = calloc((size_t)(dd * k), sizeof *v);
        if (!mean || !cov || !acc || !macc || !v) {
            free(acc);
            free(macc);
            st = toy_error(TOY_ERR_NOMEM, "warm start: PCA of %lld x %lld", (long long)dd, (long long)dd);
            goto done;
        }
        for (int64_t i = 0; i < dv; i += step, n++)
            for (int64_t a = 0; a < dd; a++) macc[a] += D[i * dd + a];
        for (int64_t a = 0; a < dd; a++) mean[a] = (float)(macc[a] / (double)n);
        double ss = 0;
        for (int64_t i = 0; i < dv; i += step) {
            const float *x = D + i * dd;
            for (int64_t a = 0; a < dd; a++) {
                double xa = x[a] - mean[a];
                ss += xa * xa;
                for (int64_t b = a; b < dd; b++) acc[a * dd + b] += xa * (x[b] - mean[b]);
            }
        }
        for (int64_t a = 0; a < dd; a++)
            for (int64_t b = a; b < dd; b++) cov[a * dd + b] = cov[b * dd + a] = (float)(acc[a * dd + b] / (double)n);
        free(acc);
        free(macc);
        if ((st = top_eigvecs(cov, (int)dd, k, v, &r.explained))) goto done;
        /* projected rows, then one scale so their RMS is the donor's centred RMS */
        double ps = 0;
        int64_t pn = 0;
        for (int64_t i = 0; i < mv; i++) {
            if (map[i] < 0) continue;
            const float *x = D + (int64_t)map[i] * dd;
            float *y = e + i * md;
            memset(y, 0, (size_t)md * sizeof *y);
            for (int64_t a = 0; a < dd; a++) {
                float xa = x[a] - mean[a];
                for (int j = 0; j < k; j++) y[j] += xa * v[a * k + j];
            }
            for (int64_t j = 0; j < md; j++) ps += (double)y[j] * y[j];
            pn += md;
        }
        double want = sqrt(ss / ((double)n * (double)dd)), got = pn ? sqrt(ps / (double)pn) : 0;
        float s = got > 0 ? (float)(want / got) : 1.0f;
        r.projected = true;
        r.learned = (E->flags & TOY_FLAG_PARAM) != 0;
        if (r.learned) {
            if ((st = toy_llama_embd_proj_attach(m, dd))) goto done;
            float *Dm = m->embd_donor->data, *P = m->embd_proj->data; /* (mv, dd), (dd, md) */
            for (int64_t i = 0; i < mv; i++) {
                if (map[i] < 0) continue;
                const float *x = D + (int64_t)map[i] * dd;
                for (int64_t a = 0; a < dd; a++) Dm[i * dd + a] = x[a] - mean[a];
                memset(e + i * md, 0, (size_t)md * sizeof *e);
            }
            for (int64_t a = 0; a < dd; a++)
                for (int j = 0; j < k; j++) P[a * md + j] = v[a * k + j] * s;
        } else {
            for (int64_t i = 0; i < mv; i++)
                if (map[i] >= 0)
                    for (int64_t j = 0; j < md; j++) e[i * md + j] *= s;
        }
    }
    for (int64_t i = 0; i < mv; i++) {
        if (map[i] >= 0) r.mapped++;
        else r.unmapped++;
    }
done:
    if (rep) *rep = r;
    free(D);
    free(v);
    free(cov);
    free(mean);
    free(map);
    toy_tokenizer_free(dtok);
    toy_gguf_close(g);
    return st;
}
