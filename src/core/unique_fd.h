// A POSIX file descriptor owned by one object: closed when the owner goes out of scope. The one
// such type of the library (src/io, src/tune, src/dist use it); private, not installed.
#pragma once

#include <unistd.h>

#include <cerrno>
#include <utility>

namespace mxq::detail {

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) noexcept : fd_(fd) {}
  ~UniqueFd() { reset(); }
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) reset(other.release());
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  [[nodiscard]] int get() const noexcept { return fd_; }
  [[nodiscard]] bool valid() const noexcept { return fd_ >= 0; }
  // Gives up ownership: the caller closes the descriptor.
  [[nodiscard]] int release() noexcept { return std::exchange(fd_, -1); }
  // Closes the owned descriptor (its error is lost: use close_checked() after writing) and owns
  // `fd` instead.
  void reset(int fd = -1) noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }
  // Closes now and returns 0 or close()'s errno: a delayed write error can surface only here.
  int close_checked() noexcept {
    if (fd_ < 0) return 0;
    const int result = ::close(release());
    return result == 0 ? 0 : errno;
  }

 private:
  int fd_ = -1;
};

}  // namespace mxq::detail
