/* commands.h: the registry of `toy` subcommands. Each lives in cli/cmd-*.c
 * as `int toy_cmd_<name>(int argc, char **argv)` (argv[0] is the command
 * name); exit codes: 0 ok, 1 failure, 2 bad usage. One line per command. */
#ifndef TOY_CLI_COMMANDS_H
#define TOY_CLI_COMMANDS_H

#include <stdlib.h>

struct toy_command {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *help;
};

int toy_cmd_demo(int argc, char **argv);
int toy_cmd_generate(int argc, char **argv);
int toy_cmd_chat(int argc, char **argv);
int toy_cmd_train(int argc, char **argv);
int toy_cmd_eval(int argc, char **argv);
int toy_cmd_describe(int argc, char **argv);
int toy_cmd_models(int argc, char **argv);
int toy_cmd_convert(int argc, char **argv);
int toy_cmd_quantize(int argc, char **argv);
int toy_cmd_runs(int argc, char **argv);
int toy_cmd_finetune(int argc, char **argv);
int toy_cmd_merge(int argc, char **argv);

int toy_cmd_tokenize(int argc, char **argv);
int toy_cmd_tokenizer(int argc, char **argv);
int toy_cmd_chat_template(int argc, char **argv);
int toy_cmd_serve(int argc, char **argv);
int toy_cmd_classify(int argc, char **argv);
int toy_cmd_devices(int argc, char **argv);

/* --bf16 (train, finetune, demo): on a CUDA device the F32 x F32 products
 * (the gradients) and attention run in BF16 as well, as under PyTorch's
 * autocast, unless TOY_CUDA_MATH says otherwise (docs/cuda.md). Read when
 * the device is first used; the CPU ignores it. */
static inline void toy_cli_bf16_math(void) { setenv("TOY_CUDA_MATH", "bf16", 0); }
int toy_cmd_bench(int argc, char **argv);

#define TOY_COMMANDS \
    {"demo", toy_cmd_demo, "train a small Llama on built-in text (what make demo runs) and sample from it"}, \
    {"train", toy_cmd_train, "train a Llama-family model or GPT-2 on text or tokens, or a ViT on images (--arch); resume a run"}, \
    {"finetune", toy_cmd_finetune, "fine-tune a GGUF model on SFT JSONL: LoRA, QLoRA (quantized base) or full; resume a run"}, \
    {"merge", toy_cmd_merge, "fold a LoRA adapter into its base: merge base.gguf adapter.gguf -o merged.gguf"}, \
    {"eval", toy_cmd_eval, "mean cross-entropy and perplexity of a model on a text or token file"}, \
    {"classify", toy_cmd_classify, "top-k classes of images with a ViT GGUF (toy train --arch vit), or accuracy over a set"}, \
    {"generate", toy_cmd_generate, "generate text from a Llama-family or GPT-2 GGUF with a KV cache and sampling"}, \
    {"chat", toy_cmd_chat, "talk with a chat model in the terminal: its template, streamed replies, its reasoning on request"}, \
    {"bench", toy_cmd_bench, "prefill and decode speed of a Llama-family or GPT-2 GGUF on this machine, against the memory bound"}, \
    {"describe", toy_cmd_describe, "what a GGUF model holds, and its forward pass as pseudocode"}, \
    {"models", toy_cmd_models, "list the GGUF models on this machine (HF cache, Ollama, LM Studio, ...)"}, \
    {"convert", toy_cmd_convert, "convert a Hugging Face model folder to GGUF"}, \
    {"quantize", toy_cmd_quantize, "re-quantize a GGUF (q8_0, q4_0, q4_k, ...)"}, \
    {"runs", toy_cmd_runs, "list the training runs in ./runs: model, steps, loss, eval loss, time, how each ended"}, \
    {"tokenize", toy_cmd_tokenize, "text to token ids (and back); a corpus to a packed TOYT token file"}, \
    {"tokenizer", toy_cmd_tokenizer, "train a byte-level BPE tokenizer: tokenizer train --vocab-size N corpus.txt -o tok.gguf"}, \
    {"chat-template", toy_cmd_chat_template, "render a chat prompt with a model's (or a built-in) chat template"}, \
    {"devices", toy_cmd_devices, "list the compute devices (CPU, CUDA GPUs: memory, compute capability); --device picks one"}, \
    {"serve", toy_cmd_serve, "an OpenAI-compatible HTTP server: completions, chat, streaming, embeddings, metrics"},

#endif
