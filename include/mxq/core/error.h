// mxq::Error: the one exception type the library throws, with a code and a message that names
// the argument, what was expected and what was found.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>

namespace mxq {

enum class ErrorCode {
  kInvalidArgument,  // a value the caller passed is not acceptable
  kShapeMismatch,    // shapes disagree with each other or with the contract
  kDtypeMismatch,    // wrong element type
  kDeviceMismatch,   // host vs CUDA memory, or a different GPU
  kOutOfRange,       // index or value outside its valid range
  kIo,               // a file could not be opened, read or written
  kFormat,           // a file's contents are malformed
  kUnsupported,      // valid request that this build or machine cannot serve
  kCuda,             // a CUDA runtime call failed
  kInternal,         // a broken invariant inside mxq (a bug)
};

std::string_view to_string(ErrorCode code);

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message);
  [[nodiscard]] ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

namespace detail {
template <typename... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}
}  // namespace detail

// Throws Error(code, concatenation of the parts streamed with operator<<).
template <typename... Parts>
[[noreturn]] void fail(ErrorCode code, const Parts&... parts) {
  throw Error(code, detail::concat(parts...));
}

// "<argument>: expected <expected>, found <found>" — the standard boundary-check message.
template <typename Expected, typename Found>
[[noreturn]] void fail_argument(ErrorCode code, std::string_view argument, const Expected& expected,
                                const Found& found) {
  fail(code, argument, ": expected ", expected, ", found ", found);
}

}  // namespace mxq

// Throws a kInvalidArgument-style Error when `cond` is false.
#define MXQ_CHECK(cond, code, ...)               \
  do {                                           \
    if (!(cond)) ::mxq::fail(code, __VA_ARGS__); \
  } while (0)
