/* toy/convert.h: model conversion: a Hugging Face model folder
 * (config.json + safetensors + tokenizer.json) to GGUF, and re-quantizing
 * a GGUF, with llama.cpp's tensor names and metadata keys so that toy and
 * llama.cpp read each other's files.
 *
 *     struct toy_convert_opts o = {.type = TOY_Q8_0};
 *     struct toy_convert_report r;
 *     if (toy_hf_convert("SmolLM2-135M/", "smollm2.gguf", &o, &r)) die(toy_last_error());
 *
 * Architectures (config.json model_type): llama, mistral (written as
 * "llama"), qwen2, qwen3, gemma2, gemma3_text (as "gemma3"), gemma3 (the
 * text model of Gemma 3 with its vision tower, as "gemma3"), smollm3,
 * olmo2, olmo3 (as "olmo2" with its sliding window), granite, phi3, gpt2, and the mixtures mixtral (as "llama"),
 * qwen2_moe, qwen3_moe, olmoe, deepseek_v2 and deepseek_v3 (as
 * "deepseek2"); docs/model-files.md has each one's rules. Phi-3's fused
 * qkv_proj and gate_up_proj stay fused (attn_qkv, ffn_up), and its
 * LongRoPE tables become rope_factors_long/short.weight. Conventions (as llama.cpp's
 * convert_hf_to_gguf.py): dims innermost-first (HF shape reversed);
 * Llama/Mistral q/k projection rows permuted from HF's rotate-half layout
 * to llama.cpp's interleaved one; GPT-2 Conv1D weights transposed and
 * output.weight written as a copy of token_embd; Gemma 2 norm weights
 * stored as 1 + w; Llama-3 "rope_scaling" written as rope_freqs.weight.
 * 1-D tensors (norms, biases) stay F32; 2-D weights get opts->type, falling
 * back to Q8_0 then F16 when a row length is not a multiple of the block.
 */
#ifndef TOY_CONVERT_H
#define TOY_CONVERT_H

#include <stdbool.h>
#include <stdint.h>

#include "toy/dtype.h"
#include "toy/gguf.h"
#include "toy/status.h"

#ifdef __cplusplus
extern "C" {
#endif

struct toy_convert_opts {
    enum toy_dtype type;          /* F32 (0, the default), F16, BF16, Q8_0, Q4_0, Q4_K, ... */
    bool skip_tokenizer;          /* do not look for tokenizer files */
    toy_gguf_progress_fn progress; /* called after each tensor is written */
    void *progress_ctx;
};

struct toy_convert_report {
    char arch[32];                /* GGUF architecture written */
    int64_t n_tensors;
    int64_t n_params;
    bool tokenizer;               /* tokenizer keys were written */
    char note[256];               /* why not, or other remarks */
};

/* llama.cpp's general.file_type (llama_ftype) for a uniform tensor type. */
uint32_t toy_file_type_for(enum toy_dtype t);

/* Converts a Hugging Face model folder to a GGUF at out_path (written
 * atomically). report may be NULL. */
enum toy_status toy_hf_convert(const char *hf_dir, const char *out_path, const struct toy_convert_opts *opts,
                               struct toy_convert_report *report);

/* The type a matrix with rows of ne0 elements is stored in when `want` is
 * asked for: want where its blocks fit the rows, else Q8_0 for a quantized
 * want whose rows hold 32-element blocks, else F16 (as llama.cpp's quantize
 * falls back). */
enum toy_dtype toy_row_type_for(enum toy_dtype want, int64_t ne0);

/* Re-quantizes every 2-D weight of a GGUF to `type` (norms and other 1-D
 * tensors are copied as they are); metadata is copied with
 * general.file_type updated. */
enum toy_status toy_gguf_quantize(const char *in_path, const char *out_path, enum toy_dtype type,
                                  toy_gguf_progress_fn progress, void *progress_ctx);

#ifdef __cplusplus
}
#endif
#endif
