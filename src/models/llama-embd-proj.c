/* llama-embd-proj.c: token embeddings through a learned projection (the
 * warm start of toy/finetune.h when the donor's width differs).
 *
 * With a projection attached the model's embedding table is
 *     E = D P + R
 * D {d_donor, vocab}: the donor's (centred) rows mapped to the model's
 * tokens, zero for tokens the donor lacks; frozen data, not a parameter.
 * P {d_model, d_donor} (a d_donor x d_model matrix): trainable.
 * R: the model's own token_embd, trainable, the residual (zero for mapped
 * tokens at the start, the random init for the others).
 * The graph builder (llama.c) computes E once per forward and uses it for
 * the lookup and, when tied, the output head, so the gradient reaches P
 * through every use. Saving folds: token_embd.weight is written as D P + R
 * and P is not written, so the file is a plain model. Invariant: embd_donor,
 * embd_proj and embd_fold are all set or all NULL. */
#include <cblas.h>
#include <string.h>

#include "toy/llama.h"

enum toy_status toy_llama_embd_proj_attach(struct toy_llama *m, int64_t d_donor) {
    struct toy_tensor *E = m->tok_embd;
    if (m->embd_proj) return toy_error(TOY_ERR_STATE, "the model already has an embedding projection");
    if (E->type != TOY_F32 || !E->data || !(E->flags & TOY_FLAG_PARAM))
        return toy_error(TOY_ERR_INVALID_ARG, "embedding projection: token_embd must be trainable f32 in memory");
    if (d_donor < 1) return toy_error(TOY_ERR_INVALID_ARG, "embedding projection: donor width %lld", (long long)d_donor);
    int64_t V = E->ne[1], d = E->ne[0];
    struct toy_tensor *D = toy_new_tensor_2d(m->ctx, TOY_F32, d_donor, V);
    struct toy_tensor *P = toy_new_tensor_2d(m->ctx, TOY_F32, d, d_donor);
    if (!D->data || !P->data) return toy_error(TOY_ERR_STATE, "embedding projection: the model's arena has no data");
    toy_set_name(D, "token_embd_donor");
    toy_set_name(P, "token_embd_proj.weight");
    toy_set_param(P);
    /* the model file holds D P + R: P and R themselves go to the state file */
    P->flags |= TOY_FLAG_STATE;
    E->flags |= TOY_FLAG_STATE;
    m->embd_fold = toy_ctx_alloc(m->ctx, (size_t)(V * d) * sizeof(float));
    m->embd_donor = D;
    m->embd_proj = P;
    return TOY_OK;
}

void toy_llama_embd_table(const struct toy_llama *m, float *out) {
    const struct toy_tensor *E = m->tok_embd;
    int64_t V = E->ne[1], d = E->ne[0];
    memcpy(out, E->data, (size_t)(V * d) * sizeof *out); /* R, then += D P */
    if (!m->embd_proj) return;
    int64_t dd = m->embd_donor->ne[0];
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)V, (int)d, (int)dd, 1.0f, m->embd_donor->data, (int)dd,
                m->embd_proj->data, (int)d, 1.0f, out, (int)d);
}

void toy_llama_embd_proj_fold(struct toy_llama *m) {
    if (!m->embd_proj) return;
    toy_llama_embd_table(m, m->embd_fold);
    memcpy(m->tok_embd->data, m->embd_fold, toy_nbytes(m->tok_embd));
    m->tok_embd->flags &= ~(uint32_t)TOY_FLAG_STATE;
    m->embd_donor = m->embd_proj = NULL; /* their memory stays in the arena until the model is freed */
    m->embd_fold = NULL;
}
