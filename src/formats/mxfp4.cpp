#include "mxq/formats/mxfp4.h"

#include <algorithm>
#include <array>

#include "formats/tensor_checks.h"
#include "mxq/core/enum_names.h"
#include "mxq/core/parallel.h"
#include "mxq/formats/bf16.h"

namespace mxq {
namespace {

// Blocks per parallel_for chunk: ~128K elements, enough to amortise a thread start.
constexpr std::int64_t kBlocksPerChunk = 4096;

void quantize_blocks_f32(const float* x, std::uint8_t* blocks, std::uint8_t* scales,
                         std::int64_t begin, std::int64_t end, ScaleRule rule) {
  for (std::int64_t b = begin; b < end; ++b) {
    quantize_mxfp4_block(x + b * kMxfp4BlockSize, blocks + b * kMxfp4PackedBlockBytes, scales + b,
                         rule);
  }
}

void quantize_blocks_bf16(const std::uint16_t* x, std::uint8_t* blocks, std::uint8_t* scales,
                          std::int64_t begin, std::int64_t end, ScaleRule rule) {
  std::array<float, kMxfp4BlockSize> block{};
  for (std::int64_t b = begin; b < end; ++b) {
    const std::uint16_t* source = x + b * kMxfp4BlockSize;
    for (int i = 0; i < kMxfp4BlockSize; ++i) block[i] = bf16_to_float(source[i]);
    quantize_mxfp4_block(block.data(), blocks + b * kMxfp4PackedBlockBytes, scales + b, rule);
  }
}

}  // namespace

namespace {
constexpr EnumNames<ScaleRule, 2> kScaleRuleNames{
    {{{ScaleRule::kFloor, "floor"}, {ScaleRule::kCeil, "ceil"}}}};
}  // namespace

std::string_view to_string(ScaleRule rule) { return kScaleRuleNames.name(rule); }

ScaleRule parse_scale_rule(std::string_view text, std::string_view argument) {
  return kScaleRuleNames.parse(text, argument);
}

Mxfp4Tensor quantize_mxfp4(const TensorView& x, ScaleRule rule) {
  formats_detail::require_dtype_in(x, "quantize_mxfp4: x", {DType::kF32, DType::kBF16});
  formats_detail::require_host_contiguous(x, "quantize_mxfp4: x");
  if (x.rank() < 1 || x.rank() >= Shape::kMaxDims) {
    fail_argument(ErrorCode::kShapeMismatch, "quantize_mxfp4: x",
                  detail::concat("a tensor of rank 1 to ", Shape::kMaxDims - 1), x.shape());
  }
  const std::int64_t k = x.size(-1);
  if (k % kMxfp4BlockSize != 0) {
    fail_argument(ErrorCode::kShapeMismatch, "quantize_mxfp4: x",
                  "a last dimension K divisible by 32", x.shape());
  }
  Shape block_shape;
  Shape scale_shape;
  for (int d = 0; d + 1 < x.rank(); ++d) {
    block_shape.push_back(x.shape()[d]);
    scale_shape.push_back(x.shape()[d]);
  }
  block_shape.push_back(k / kMxfp4BlockSize);
  block_shape.push_back(kMxfp4PackedBlockBytes);
  scale_shape.push_back(k / kMxfp4BlockSize);

  Mxfp4Tensor out{Tensor::empty(DType::kU8, block_shape), Tensor::empty(DType::kE8M0, scale_shape)};
  auto* blocks = static_cast<std::uint8_t*>(out.blocks.data());
  auto* scales = static_cast<std::uint8_t*>(out.scales.data());
  const std::int64_t num_blocks = x.numel() / kMxfp4BlockSize;
  if (x.dtype() == DType::kF32) {
    const auto* source = static_cast<const float*>(x.data());
    parallel_for(num_blocks, kBlocksPerChunk, [&](std::int64_t begin, std::int64_t end) {
      quantize_blocks_f32(source, blocks, scales, begin, end, rule);
    });
  } else {
    const auto* source = static_cast<const std::uint16_t*>(x.data());
    parallel_for(num_blocks, kBlocksPerChunk, [&](std::int64_t begin, std::int64_t end) {
      quantize_blocks_bf16(source, blocks, scales, begin, end, rule);
    });
  }
  return out;
}

Tensor dequantize_mxfp4(const TensorView& blocks, const TensorView& scales) {
  formats_detail::require_dtype_in(blocks, "dequantize_mxfp4: blocks",
                                   {DType::kU8, DType::kE2M1x2});
  formats_detail::require_dtype_in(scales, "dequantize_mxfp4: scales", {DType::kE8M0, DType::kU8});
  formats_detail::require_host_contiguous(blocks, "dequantize_mxfp4: blocks");
  formats_detail::require_host_contiguous(scales, "dequantize_mxfp4: scales");
  if (blocks.rank() < 2 || blocks.size(-1) != kMxfp4PackedBlockBytes) {
    fail_argument(ErrorCode::kShapeMismatch, "dequantize_mxfp4: blocks",
                  "shape [..., G, 16] (16 packed bytes per block of 32)", blocks.shape());
  }
  Shape expected_scales;
  Shape out_shape;
  for (int d = 0; d + 1 < blocks.rank(); ++d) expected_scales.push_back(blocks.shape()[d]);
  for (int d = 0; d + 2 < blocks.rank(); ++d) out_shape.push_back(blocks.shape()[d]);
  out_shape.push_back(blocks.size(-2) * kMxfp4BlockSize);
  if (!(scales.shape() == expected_scales)) {
    fail_argument(ErrorCode::kShapeMismatch, "dequantize_mxfp4: scales",
                  detail::concat(expected_scales, " (blocks' shape ", blocks.shape(),
                                 " without its last dimension)"),
                  scales.shape());
  }

  Tensor out = Tensor::empty(DType::kF32, out_shape);
  const auto* packed = static_cast<const std::uint8_t*>(blocks.data());
  const auto* codes = static_cast<const std::uint8_t*>(scales.data());
  float* values = out.data_as<float>();
  parallel_for(scales.numel(), kBlocksPerChunk, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t b = begin; b < end; ++b) {
      dequantize_mxfp4_block(packed + b * kMxfp4PackedBlockBytes, codes[b],
                             values + b * kMxfp4BlockSize);
    }
  });
  return out;
}

}  // namespace mxq
