#include "interrupt.h"

#include <atomic>
#include <cstdio>
#include <cstring>

namespace mxq::cli {
namespace {

constexpr int kSignals[] = {SIGINT, SIGTERM, SIGHUP};
std::atomic<int> g_signal{0};  // the first signal that arrived while a scope lives
static_assert(std::atomic<int>::is_always_lock_free);

extern "C" void record_signal(int sig) {
  int none = 0;
  g_signal.compare_exchange_strong(none, sig);
}

}  // namespace

Interrupted::Interrupted(int sig)
    : signal(sig),
      message(std::string("interrupted by ") + (sig == SIGINT    ? "SIGINT (Ctrl-C)"
                                                : sig == SIGTERM ? "SIGTERM"
                                                : sig == SIGHUP  ? "SIGHUP"
                                                                 : "a signal")) {}

InterruptScope::InterruptScope() {
  g_signal.store(0);
  struct sigaction action {};
  action.sa_handler = record_signal;
  sigemptyset(&action.sa_mask);
  for (std::size_t i = 0; i < std::size(kSignals); ++i) {
    ::sigaction(kSignals[i], &action, &previous_[i]);
  }
}

InterruptScope::~InterruptScope() {
  for (std::size_t i = 0; i < std::size(kSignals); ++i) {
    ::sigaction(kSignals[i], &previous_[i], nullptr);
  }
  if (const int sig = g_signal.exchange(0); sig != 0 && std::uncaught_exceptions() == 0) {
    ::raise(sig);  // the previous handler (by default: the end of the process)
  }
}

void InterruptScope::poll() const {
  if (const int sig = g_signal.load(); sig != 0) throw Interrupted(sig);
}

void die_by(const Interrupted& interrupted) {
  std::fprintf(stderr, "mxq: %s; what was being written has been removed\n", interrupted.what());
  std::fflush(stderr);
  std::signal(interrupted.signal, SIG_DFL);
  ::raise(interrupted.signal);
  std::_Exit(128 + interrupted.signal);  // if the signal is blocked
}

}  // namespace mxq::cli
