/* stop-signals.h: Ctrl-C and SIGTERM for the training commands (train,
 * finetune, train --arch vit, GPT-2) and the server: the first signal raises
 * toy_cli_stop, which the trainers read between steps, so the run ends with
 * a checkpoint and run_end (reason interrupted, exit 130), and on which
 * toy serve drains its requests in flight. */
#ifndef TOY_CLI_STOP_SIGNALS_H
#define TOY_CLI_STOP_SIGNALS_H

#include <signal.h>

/* Raised by the first SIGINT or SIGTERM; give it to the trainer's opts.stop. */
extern volatile sig_atomic_t toy_cli_stop;

/* Installs the handler for SIGINT and SIGTERM. A second signal is ignored
 * when it is a SIGTERM (GNU timeout, systemd and kill send one to the child
 * and another to its process group) or comes within
 * TOY_CLI_STOP_GRACE_S of the first: the run is then writing its
 * checkpoint. A Ctrl-C after that exits at once (130), without one. */
#define TOY_CLI_STOP_GRACE_S 2
void toy_cli_stop_signals_install(void);

/* Puts back the default actions after the run, unless a stop was requested
 * (then the handler stays, to absorb the rest of the request). */
void toy_cli_stop_signals_restore(void);

/* Every command's default (main installs it): SIGINT, SIGTERM and SIGHUP end
 * the process as they would, after removing the temp file of a GGUF being
 * written (toy_file_remove_temps), which convert, quantize and merge
 * left behind half written. */
void toy_cli_cleanup_signals_install(void);

#endif
