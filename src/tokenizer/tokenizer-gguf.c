/* tokenizer-gguf.c: tokenizers to and from GGUF metadata (tokenizer.ggml.*,
 * llama.cpp's keys: model, pre, tokens, scores, token_type, merges, the
 * special ids, add_bos/add_eos, add_space_prefix, tokenizer.chat_template).
 * Waits on include/toy/gguf.h (the GGUF reader/writer of src/io/).
 */
#include "tokenizer-impl.h"

enum toy_status toy_tokenizer_load_gguf_file(const char *path, struct toy_tokenizer **out) {
    *out = NULL;
    return toy_error(TOY_ERR_UNSUPPORTED, "%s: GGUF tokenizers need the GGUF reader (not built yet)", path);
}
