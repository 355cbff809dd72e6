/* Stop signals (signals.h; docs/design.md §8.7). */
#include "momfmm/signals.h"

#include <signal.h>
#include <string.h>

static volatile sig_atomic_t stop_requested = 0;
static void request_stop(int signo) { stop_requested = signo; }

static const int STOP_SIGNALS[] = {SIGTERM, SIGINT, SIGUSR1};
enum { N_STOP_SIGNALS = sizeof STOP_SIGNALS / sizeof STOP_SIGNALS[0] };

static sigset_t stop_signal_set(void) {
    sigset_t set;
    sigemptyset(&set);
    for (int i = 0; i < N_STOP_SIGNALS; i++) sigaddset(&set, STOP_SIGNALS[i]);
    return set;
}

static void install_handler(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = request_stop;
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < N_STOP_SIGNALS; i++) sigaction(STOP_SIGNALS[i], &sa, NULL);
}

void signals_guard_startup(void) {
    install_handler();
    sigset_t set = stop_signal_set();
    sigprocmask(SIG_BLOCK, &set, NULL);
}

void signals_catch_stops(void) {
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
