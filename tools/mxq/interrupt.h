// Ctrl-C (SIGINT), SIGTERM and SIGHUP while a command writes something it must not leave
// half-written (a synthetic checkpoint): while an InterruptScope lives, these signals only set a
// flag; poll() turns the flag into an Interrupted exception, which unwinds through the writer's
// clean-up, and main() then ends the process by the same signal (exit status 128 + signal, as
// the shell expects). SIGKILL cannot be caught: what it leaves is removed by the next run
// (remove_stale_synthetic_temporaries).
#pragma once

#include <csignal>
#include <exception>
#include <string>

namespace mxq::cli {

struct Interrupted : std::exception {
  explicit Interrupted(int sig);
  int signal = 0;
  std::string message;
  [[nodiscard]] const char* what() const noexcept override { return message.c_str(); }
};

class InterruptScope {
 public:
  InterruptScope();
  // Restores the previous handlers; a signal that came after the last poll() is raised again
  // then, so it is never lost.
  ~InterruptScope();
  InterruptScope(const InterruptScope&) = delete;
  InterruptScope& operator=(const InterruptScope&) = delete;

  // Throws Interrupted when one of the signals arrived (from any thread).
  void poll() const;

 private:
  struct sigaction previous_[3]{};
};

// What main() does with an Interrupted: says so on stderr, then dies by the signal.
[[noreturn]] void die_by(const Interrupted& interrupted);

}  // namespace mxq::cli
