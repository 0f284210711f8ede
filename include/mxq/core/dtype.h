// Element types. Every fact about a dtype (name, storage size, safetensors/npy spelling) lives
// in the one table in src/core/dtype.cpp.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string_view>

namespace mxq {

enum class DType : std::uint8_t {
  kBool,
  kU8,
  kI8,
  kI32,
  kI64,
  kF32,
  kBF16,
  kF16,
  kE4M3,    // float8 e4m3fn: bias 7, max 448, NaN 0x7F/0xFF, no Inf
  kE8M0,    // unsigned power-of-two scale byte, 0xFF = NaN
  kE2M1x2,  // two E2M1 (FP4) values per byte, element 2j in the low nibble
};

struct DTypeInfo {
  DType dtype;
  std::string_view name;         // mxq's name, e.g. "bf16", "e2m1x2"
  std::size_t size;              // bytes per storage element
  std::string_view safetensors;  // e.g. "BF16"; empty when safetensors has no spelling
};

const DTypeInfo& info(DType dtype);
inline std::size_t size_of(DType dtype) { return info(dtype).size; }
inline std::string_view name(DType dtype) { return info(dtype).name; }
std::optional<DType> dtype_from_name(std::string_view name);
std::optional<DType> dtype_from_safetensors(std::string_view code);
std::ostream& operator<<(std::ostream& out, DType dtype);

// Maps a C++ element type to its DType (for typed accessors).
template <typename T>
struct DTypeOf;
template <>
struct DTypeOf<bool> {
  static constexpr DType value = DType::kBool;
};
template <>
struct DTypeOf<std::uint8_t> {
  static constexpr DType value = DType::kU8;
};
template <>
struct DTypeOf<std::int8_t> {
  static constexpr DType value = DType::kI8;
};
template <>
struct DTypeOf<std::int32_t> {
  static constexpr DType value = DType::kI32;
};
template <>
struct DTypeOf<std::int64_t> {
  static constexpr DType value = DType::kI64;
};
template <>
struct DTypeOf<float> {
  static constexpr DType value = DType::kF32;
};

}  // namespace mxq
