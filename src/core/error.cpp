#include "mxq/core/error.h"

namespace mxq {

std::string_view to_string(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument:
      return "invalid argument";
    case ErrorCode::kShapeMismatch:
      return "shape mismatch";
    case ErrorCode::kDtypeMismatch:
      return "dtype mismatch";
    case ErrorCode::kDeviceMismatch:
      return "device mismatch";
    case ErrorCode::kOutOfRange:
      return "out of range";
    case ErrorCode::kIo:
      return "I/O error";
    case ErrorCode::kFormat:
      return "format error";
    case ErrorCode::kUnsupported:
      return "unsupported";
    case ErrorCode::kCuda:
      return "CUDA error";
    case ErrorCode::kInternal:
      return "internal error";
  }
  return "unknown error";
}

Error::Error(ErrorCode code, const std::string& message)
    : std::runtime_error(message), code_(code) {}

}  // namespace mxq
