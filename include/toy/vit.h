/* toy/vit.h: the Vision Transformer image classifier (Dosovitskiy et al.
 * 2021, "An Image is Worth 16x16 Words"; shapes as timm's
 * vit_tiny_patch16_224): patch embedding (a P x P stride-P convolution,
 * computed as im2col with reshape/permute plus one matmul), a class token,
 * learned position embeddings, pre-LN blocks (LayerNorm, non-causal
 * multi-head attention with a fused QKV projection, GELU MLP, biases
 * everywhere), a final LayerNorm and a linear head on the class token.
 * GELU is the tanh approximation (timm uses the exact erf form; the two
 * differ by < 1e-3 and a model trained with one is trained for it).
 *
 *     struct toy_vit_config cfg = toy_vit_preset("mnist");   // 28x28x1, 10 classes
 *     struct toy_vit *m = toy_vit_new(&cfg, 1234);
 *     struct toy_tensor *img = toy_new_tensor_4d(ctx, TOY_F32, 28, 28, 1, B); // (B, C, H, W)
 *     struct toy_tensor *logits = toy_vit_forward(ctx, m, img);           // {classes, B}
 *     struct toy_tensor *loss = toy_cross_entropy(ctx, logits, labels, -100);
 *
 * GGUF (toy's own "vit" architecture; no llama.cpp equivalent): keys
 * vit.{image_size, image_height, patch_size, channels, embedding_length,
 * block_count, attention.head_count, feed_forward_length,
 * attention.layer_norm_epsilon, class_count}, optional vit.image_mean,
 * vit.image_std (f32 arrays, per channel) and vit.class_names (strings);
 * tensors patch_embd.weight (d, C*P*P), patch_embd.bias, class_embd (d),
 * position_embd.weight (1 + patches, d), blk.N.{attn_norm, attn_qkv,
 * attn_output, ffn_norm, ffn_up, ffn_down}.{weight,bias} as GPT-2's,
 * output_norm.{weight,bias}, cls_head.{weight,bias} (classes, d).
 *
 * Random init (timm): patch, projections and head ~ N(0, 0.02) (timm's
 * trunc_normal; the head is zero in timm, small random here so the first
 * steps are not degenerate), class token and position embeddings
 * ~ N(0, 0.02), LayerNorm weights 1, biases 0. With fan_in_init (the small
 * presets) the weights are ~ N(0, 1/(3 fan_in)) instead, the variance of
 * PyTorch's default uniform init: at d 64, 0.02 starves the residual stream
 * and MNIST trains about twice as slowly.
 */
#ifndef TOY_VIT_H
#define TOY_VIT_H

#include <stdbool.h>
#include <stdint.h>

#include "toy/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

struct toy_gguf;
struct toy_gguf_writer;

struct toy_vit_config {
    int64_t image_h, image_w, channels, patch;
    int64_t d_model, n_layers, n_heads, d_ff, n_classes;
    float norm_eps;
    bool fan_in_init;       /* random init: PyTorch's nn.Linear/Conv2d default scale instead of timm's 0.02 */
};

struct toy_vit_layer {
    struct toy_tensor *attn_norm, *attn_norm_b, *w_qkv, *b_qkv, *w_o, *b_o;
    struct toy_tensor *ffn_norm, *ffn_norm_b, *w_up, *b_up, *w_down, *b_down;
};

struct toy_vit {
    struct toy_vit_config cfg;
    struct toy_ctx *ctx;
    struct toy_gguf *gguf;             /* the mapped file, when loaded */
    struct toy_tensor *patch_w, *patch_b;   /* (d, C*P*P), (d) */
    struct toy_tensor *cls, *pos;           /* (d), (1 + patches, d) */
    struct toy_vit_layer *layers;
    struct toy_tensor *out_norm, *out_norm_b, *head_w, *head_b; /* (d), (d), (classes, d), (classes) */
    float mean[4], std[4];             /* input normalisation (kept in the GGUF) */
    char **class_names;                /* n_classes names or NULL */
};

/* "tiny" (ViT-Tiny/16: 224x224x3, d 192, 3 heads, 12 layers, d_ff 768,
 * 1000 classes, eps 1e-6), "small-cpu" (32x32x3, patch 4, d 128, 4 heads,
 * 4 layers, 10 classes), "mnist" (28x28x1, patch 7, d 64, 4 heads, 2 layers,
 * d_ff 128, 10 classes); the last two use fan_in_init. Unknown names (and
 * NULL) give d_model 0. */
struct toy_vit_config toy_vit_preset(const char *name);
enum toy_status toy_vit_check_config(const struct toy_vit_config *cfg);
int64_t toy_vit_n_patches(const struct toy_vit_config *cfg);

struct toy_vit *toy_vit_new(const struct toy_vit_config *cfg, uint64_t seed);
void toy_vit_free(struct toy_vit *m);
int64_t toy_vit_n_params(const struct toy_vit *m);
int toy_vit_n_tensors(const struct toy_vit *m);
struct toy_tensor *toy_vit_tensor(const struct toy_vit *m, int i);

/* Logits {n_classes, B} of F32 images {W, H, C, B} (PyTorch (B, C, H, W)),
 * already normalised. */
struct toy_tensor *toy_vit_forward(struct toy_ctx *ctx, struct toy_vit *m, struct toy_tensor *images);

/* GGUF: architecture "vit" (see above). Loaded weights are mapped (frozen)
 * or, trainable, copied to f32 parameters. */
enum toy_status toy_vit_load(const char *path, bool trainable, struct toy_vit **out);
enum toy_status toy_vit_write_gguf(const struct toy_vit *m, struct toy_gguf_writer *w);
/* Sets the class names (copied; NULL clears). */
enum toy_status toy_vit_set_class_names(struct toy_vit *m, char *const *names);

#ifdef __cplusplus
}
#endif
#endif
