#include "mxq/core/dtype.h"

#include <array>

namespace mxq {
namespace {

constexpr std::array<DTypeInfo, 11> kDTypes = {{
    {DType::kBool, "bool", 1, "BOOL"},
    {DType::kU8, "u8", 1, "U8"},
    {DType::kI8, "i8", 1, "I8"},
    {DType::kI32, "i32", 4, "I32"},
    {DType::kI64, "i64", 8, "I64"},
    {DType::kF32, "f32", 4, "F32"},
    {DType::kBF16, "bf16", 2, "BF16"},
    {DType::kF16, "f16", 2, "F16"},
    {DType::kE4M3, "e4m3", 1, "F8_E4M3"},
    {DType::kE8M0, "e8m0", 1, "F8_E8M0"},
    {DType::kE2M1x2, "e2m1x2", 1, ""},
}};

}  // namespace

const DTypeInfo& info(DType dtype) { return kDTypes.at(static_cast<std::size_t>(dtype)); }

std::optional<DType> dtype_from_name(std::string_view name) {
  for (const auto& entry : kDTypes) {
    if (entry.name == name) return entry.dtype;
  }
  return std::nullopt;
}

std::optional<DType> dtype_from_safetensors(std::string_view code) {
  if (code.empty()) return std::nullopt;
  for (const auto& entry : kDTypes) {
    if (entry.safetensors == code) return entry.dtype;
  }
  return std::nullopt;
}

std::ostream& operator<<(std::ostream& out, DType dtype) { return out << name(dtype); }

}  // namespace mxq
