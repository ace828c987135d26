/* cli-error.h: the library's last message as a command prints it, naming
 * the command once. Library messages that opened with the name of a
 * command ("generate: empty prompt", "convert: ...") no longer do; a few
 * open with the name of a library area that some command shares, and keep
 * it for the library's other callers: "tokenizer: ..." (`toy tokenizer
 * train`, and `toy train`'s "tokenizer: " label), "chat template: ..."
 * (`toy chat-template`), "quantize: ..." (`toy quantize`). Those are where
 * this is used. */
#ifndef TOY_CLI_ERROR_H
#define TOY_CLI_ERROR_H

/* toy_last_error(), less a leading "AREA: " where AREA is one of the
 * library areas above and also what the caller prints just before it:
 * `label` ("chat-template", "train: tokenizer") or one of its words, a
 * dash in the label matching a space. An AREA that is also an existing
 * path is kept: a message may keep a repeat, never lose what it names.
 *     fprintf(stderr, "toy chat-template: %s\n", toy_cli_error("chat-template"));
 * Never NULL. */
const char *toy_cli_error(const char *label);

/* The same for the message msg. */
const char *toy_cli_unprefixed(const char *label, const char *msg);

#endif
