#include "mxq/formats/ue8m0_pack.h"

#include <cstring>

#include "formats/tensor_checks.h"
#include "mxq/formats/e8m0.h"

namespace mxq {
namespace {

constexpr std::int64_t kGroupsPerWord = 4;
constexpr std::int64_t kMnAlignment = 4;  // 16-byte TMA alignment of int32 columns

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }
std::int64_t round_up(std::int64_t a, std::int64_t b) { return ceil_div(a, b) * b; }

// The E8M0 byte of an exact power of two in [2^-127, 2^127]; -1 for anything else.
int power_of_two_code(float value) {
  const std::uint32_t bits = detail::float_bits(value);
  if (bits == 0x00400000U) return 0;          // 2^-127, the only subnormal UE8M0 value
  const std::uint32_t exponent = bits >> 23;  // sign bit set -> exponent > 255
  if ((bits & 0x7FFFFFU) != 0 || exponent == 0 || exponent > 254) return -1;
  return static_cast<int>(exponent);
}

}  // namespace

Tensor pack_ue8m0(const TensorView& scales) {
  require_dtype(scales, "pack_ue8m0: scales", DType::kF32);
  formats_detail::require_host_contiguous(scales, "pack_ue8m0: scales");
  require_rank(scales, "pack_ue8m0: scales", 2);
  const std::int64_t mn = scales.size(0);
  const std::int64_t groups = scales.size(1);
  const std::int64_t words = ceil_div(groups, kGroupsPerWord);
  const std::int64_t stride = round_up(mn, kMnAlignment);
  Tensor out = Tensor::zeros(DType::kI32, {words, stride});
  const float* source = static_cast<const float*>(scales.data());
  auto* packed = out.data_as<std::int32_t>();
  for (std::int64_t m = 0; m < mn; ++m) {
    for (std::int64_t g = 0; g < groups; ++g) {
      const float value = source[m * groups + g];
      const int code = power_of_two_code(value);
      if (code < 0) {
        fail_argument(ErrorCode::kInvalidArgument,
                      detail::concat("pack_ue8m0: scales[", m, ", ", g, "]"),
                      "a power of two in [2^-127, 2^127]", value);
      }
      // Little-endian packing, independent of the host's byte order.
      const auto word = static_cast<std::uint32_t>(code) << (8 * (g % kGroupsPerWord));
      auto& target = packed[(g / kGroupsPerWord) * stride + m];
      target = static_cast<std::int32_t>(static_cast<std::uint32_t>(target) | word);
    }
  }
  return out;
}

Tensor unpack_ue8m0(const TensorView& packed, std::int64_t mn, std::int64_t groups) {
  if (mn < 0 || groups < 0) {
    fail_argument(ErrorCode::kInvalidArgument, "unpack_ue8m0: mn and groups",
                  "non-negative extents", detail::concat("mn = ", mn, ", groups = ", groups));
  }
  Tensor out = Tensor::empty(DType::kF32, {mn, groups});
  unpack_ue8m0_into(packed, mn, groups, out);
  return out;
}

void unpack_ue8m0_into(const TensorView& packed, std::int64_t mn, std::int64_t groups,
                       const TensorView& out) {
  if (mn < 0 || groups < 0) {
    fail_argument(ErrorCode::kInvalidArgument, "unpack_ue8m0: mn and groups",
                  "non-negative extents", detail::concat("mn = ", mn, ", groups = ", groups));
  }
  require_dtype(packed, "unpack_ue8m0: packed", DType::kI32);
  formats_detail::require_host_contiguous(packed, "unpack_ue8m0: packed");
  const std::int64_t stride = round_up(mn, kMnAlignment);
  require_shape(packed, "unpack_ue8m0: packed", Shape{ceil_div(groups, kGroupsPerWord), stride});
  require_dtype(out, "unpack_ue8m0: out", DType::kF32);
  require_shape(out, "unpack_ue8m0: out", Shape{mn, groups});
  formats_detail::require_host_contiguous(out, "unpack_ue8m0: out");
  const auto* words = static_cast<const std::int32_t*>(packed.data());
  auto* values = static_cast<float*>(out.data());
  for (std::int64_t m = 0; m < mn; ++m) {
    for (std::int64_t g = 0; g < groups; ++g) {
      const auto word = static_cast<std::uint32_t>(words[(g / kGroupsPerWord) * stride + m]);
      const auto code = static_cast<std::uint8_t>(word >> (8 * (g % kGroupsPerWord)));
      values[m * groups + g] = e8m0_to_float(code);
    }
  }
}

}  // namespace mxq
