/* qkv.h: the q, k and v of a fused projection, as GPT-2 and ViT compute
 * them (one product with rows [q; k; v], heads contiguous inside each: HF's
 * split then view). Shared by src/models/ and the server's forward. */
#ifndef TOY_MODELS_QKV_H
#define TOY_MODELS_QKV_H

#include "toy/tensor.h"

/* one of q, k, v (which 0, 1, 2) of qkv {3 hd H, T, B} as a {hd, H, T, B} view */
static inline struct toy_tensor *toy_qkv_part(struct toy_ctx *ctx, struct toy_tensor *qkv, int which, int64_t hd,
                                              int64_t H) {
    const int64_t ne[4] = {hd, H, qkv->ne[1], qkv->ne[2]};
    const size_t nb[4] = {qkv->nb[0], (size_t)hd * qkv->nb[0], qkv->nb[1], qkv->nb[2]};
    return toy_view(ctx, qkv, 4, ne, nb, (size_t)which * (size_t)(hd * H) * qkv->nb[0]);
}

#endif
