/* Stop signals (signals.h; docs/design.md §8.7). */
#include "commands/signals.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

static volatile sig_atomic_t stop_requested = 0;
static volatile sig_atomic_t file_limit_reached = 0;
/* The pipe the handler writes a byte into, so that a thread can wait for a
 * stop request (signals_wake_fd); -1 until signals_catch_stops. */
static int wake_pipe[2] = {-1, -1};

static void wake(void) {
    if (wake_pipe[1] < 0) return;
    int saved = errno;
    ssize_t n = write(wake_pipe[1], "", 1); /* non-blocking: a full pipe is already awake */
    (void)n;
    errno = saved;
}

/* Async-signal-safe: records the signal, wakes the waiting thread; a SIGINT
 * after a stop was already requested (Ctrl-C twice) ends the process at once. */
static void request_stop(int signo) {
    if (signo == SIGINT && stop_requested != 0) _exit(128 + SIGINT);
    stop_requested = signo;
    wake();
}

/* ulimit -f: the write that crossed the limit fails with EFBIG instead of
 * the default action (death with a core, exit 153), and the failure names
 * the file. */
static void note_file_limit(int signo) {
    (void)signo;
    file_limit_reached = 1;
}

static const int STOP_SIGNALS[] = {SIGTERM, SIGINT, SIGUSR1};
enum { N_STOP_SIGNALS = sizeof STOP_SIGNALS / sizeof STOP_SIGNALS[0] };

static sigset_t stop_signal_set(void) {
    sigset_t set;
    sigemptyset(&set);
    for (int i = 0; i < N_STOP_SIGNALS; i++) sigaddset(&set, STOP_SIGNALS[i]);
    return set;
}

static void install(int signo, void (*handler)(int)) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = handler;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(signo, &sa, NULL);
}

static void install_handler(void) {
    for (int i = 0; i < N_STOP_SIGNALS; i++) install(STOP_SIGNALS[i], request_stop);
}

void signals_guard_startup(void) {
    install_handler();
    install(SIGXFSZ, note_file_limit);
    sigset_t set = stop_signal_set();
    sigprocmask(SIG_BLOCK, &set, NULL);
}

void signals_catch_stops(void) {
    if (wake_pipe[0] < 0 && pipe(wake_pipe) == 0) {
        for (int i = 0; i < 2; i++) fcntl(wake_pipe[i], F_SETFD, FD_CLOEXEC);
        fcntl(wake_pipe[1], F_SETFL, O_NONBLOCK);
    }
    /* a closed stdout (train ... | head) is an EPIPE the log notices
     * (log_output_closed), not a death without a checkpoint */
    signal(SIGPIPE, SIG_IGN);
    install_handler();
    sigset_t set = stop_signal_set();
    sigprocmask(SIG_UNBLOCK, &set, NULL);
}

void signals_release(void) {
    int pending = (int)stop_requested;
    for (int i = 0; i < N_STOP_SIGNALS; i++) signal(STOP_SIGNALS[i], SIG_DFL);
    sigset_t set = stop_signal_set();
    sigprocmask(SIG_UNBLOCK, &set, NULL);
    if (pending) raise(pending);
}

int signals_stop_requested(void) { return (int)stop_requested; }

int signals_wake_fd(void) { return wake_pipe[0]; }
void signals_wake(void) { wake(); }

bool signals_file_limit_reached(void) { return file_limit_reached != 0; }
void signals_clear_file_limit(void) { file_limit_reached = 0; }
