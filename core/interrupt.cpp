#include "core/interrupt.h"

#include <signal.h>
#include <unistd.h>

#include <csignal>
#include <cstring>

namespace moh {

namespace {

volatile std::sig_atomic_t g_signal = 0;  // the first stop request
volatile std::sig_atomic_t g_quiet = 0;
struct sigaction g_old_int, g_old_term;

void say(const char* s) {
  if (!g_quiet) {
    const ssize_t n = ::write(STDERR_FILENO, s, std::strlen(s));
    (void)n;
  }
}

// Async-signal-safe: only flags, write(2) and _exit(2).
extern "C" void on_stop_signal(int sig) {
  if (g_signal != 0) {
    say("\ninterrupted again: exiting now (the last complete checkpoint is kept)\n");
    ::_exit(128 + sig);
  }
  g_signal = sig;
  say(sig == SIGINT ? "\ninterrupt: saving a checkpoint after this step (Ctrl-C again to exit at once)\n"
                    : "\nterminate: saving a checkpoint after this step (a second signal exits at once)\n");
}

}  // namespace

StopOnSignal::StopOnSignal(bool quiet) {
  g_signal = 0;
  g_quiet = quiet ? 1 : 0;
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // reads and waits of the data loaders go on; the loop looks at the flag
  ::sigaction(SIGINT, &sa, &g_old_int);
  ::sigaction(SIGTERM, &sa, &g_old_term);
}

StopOnSignal::~StopOnSignal() {
  ::sigaction(SIGINT, &g_old_int, nullptr);
  ::sigaction(SIGTERM, &g_old_term, nullptr);
}

int StopOnSignal::requested() {
  return g_signal;
}

void StopOnSignal::request(int sig) {
  g_signal = sig;
}

}  // namespace moh
