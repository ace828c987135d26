/* stop-signals.c: the stop handler shared by the training commands
 * (stop-signals.h). It runs on whichever thread the kernel picks, possibly
 * on two threads at once, so it uses only lock-free atomics, clock_gettime
 * and write, all async-signal-safe. */
#include "stop-signals.h"

#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "toy/file.h"

volatile sig_atomic_t toy_cli_stop;

static atomic_int n_signals;          /* signals seen since install */
static _Atomic int64_t first_ns;      /* CLOCK_MONOTONIC of the first (0: not yet stored) */

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void on_signal(int sig) {
    int64_t now = now_ns();
    if (atomic_fetch_add(&n_signals, 1) == 0) {
        atomic_store(&first_ns, now);
        toy_cli_stop = 1;
        return;
    }
    /* A repeat SIGTERM is the same request again (GNU timeout signals the
     * child, then its process group), never a user's "now"; killing the
     * process for it lost the checkpoint being written. */
    if (sig == SIGTERM) return;
    int64_t first = atomic_load(&first_ns);
    if (first == 0 || now - first < (int64_t)TOY_CLI_STOP_GRACE_S * 1000000000) return; /* 0: the first is still in its handler */
    static const char msg[] = "\ntoy: second Ctrl-C: exiting now, without finishing (no checkpoint, no drain)\n";
    ssize_t w = write(STDERR_FILENO, msg, sizeof msg - 1);
    (void)w;
    toy_file_remove_temps(); /* a checkpoint half written */
    _exit(130);
}

/* the default: a signal ends the process as it would, without the partial
 * GGUF a write in progress leaves */
static void on_fatal_signal(int sig) {
    toy_file_remove_temps();
    signal(sig, SIG_DFL);
    raise(sig);
}

void toy_cli_cleanup_signals_install(void) {
    static const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_fatal_signal;
        sigemptyset(&sa.sa_mask);
        sigaction(sigs[i], &sa, NULL);
    }
}

void toy_cli_stop_signals_install(void) {
    atomic_store(&n_signals, 0);
    atomic_store(&first_ns, 0);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART; /* the checkpoint's writes go on, not EINTR */
    sigemptyset(&sa.sa_mask);
    sigaddset(&sa.sa_mask, SIGINT);
    sigaddset(&sa.sa_mask, SIGTERM);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

void toy_cli_stop_signals_restore(void) {
    /* after a stop request the handler stays: the rest of the request (the
     * process group's SIGTERM) may still be on its way, and would otherwise
     * kill the process between its run_end and its exit status 130 */
    if (toy_cli_stop) return;
    toy_cli_cleanup_signals_install();
}
