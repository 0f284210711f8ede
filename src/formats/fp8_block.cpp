#include "mxq/formats/fp8_block.h"

#include <charconv>
#include <vector>

#include "formats/tensor_checks.h"
#include "mxq/core/enum_names.h"
#include "mxq/core/parallel.h"
#include "mxq/formats/bf16.h"

namespace mxq {
namespace {

// Elements per parallel_for chunk, enough to amortise a thread start.
constexpr std::int64_t kElementsPerChunk = 1 << 16;

// Without a + b - 1, which overflows for block extents near INT64_MAX (parse accepts them).
std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return a / b + (a % b != 0 ? 1 : 0); }

// Reads element i of an f32 or bf16 row as float.
inline float load(const float* row, std::int64_t i) { return row[i]; }
inline float load(const std::uint16_t* row, std::int64_t i) { return bf16_to_float(row[i]); }

void require_valid_block(const BlockShape& block, std::string_view argument) {
  if (block.n < 1 || block.k < 1) {
    fail_argument(ErrorCode::kInvalidArgument, argument, "positive extents (e.g. 128x128)",
                  to_string(block));
  }
}

// Quantizes the block rows [row_block_begin, row_block_end) of an [n, k] matrix.
template <typename Element>
void quantize_block_rows(const Element* x, std::int64_t n, std::int64_t k, BlockShape block,
                         ScaleMode mode, std::int64_t row_block_begin, std::int64_t row_block_end,
                         std::uint8_t* q, float* scales) {
  const std::int64_t col_blocks = ceil_div(k, block.k);
  std::vector<std::uint32_t> amax_bits(static_cast<std::size_t>(col_blocks));
  std::vector<float> row_scales(static_cast<std::size_t>(col_blocks));
  for (std::int64_t rb = row_block_begin; rb < row_block_end; ++rb) {
    const std::int64_t row_begin = rb * block.n;
    const std::int64_t row_end = std::min(n, row_begin + block.n);
    // amax as the integer max of |bits|: Inf and NaN compare above every finite magnitude.
    std::fill(amax_bits.begin(), amax_bits.end(), 0U);
    for (std::int64_t i = row_begin; i < row_end; ++i) {
      const Element* row = x + i * k;
      for (std::int64_t cb = 0; cb < col_blocks; ++cb) {
        const std::int64_t col_end = std::min(k, (cb + 1) * block.k);
        std::uint32_t block_max = amax_bits[static_cast<std::size_t>(cb)];
        for (std::int64_t j = cb * block.k; j < col_end; ++j) {
          const std::uint32_t abs_bits = detail::float_bits(load(row, j)) & detail::kF32AbsMask;
          block_max = abs_bits > block_max ? abs_bits : block_max;
        }
        amax_bits[static_cast<std::size_t>(cb)] = block_max;
      }
    }
    for (std::int64_t cb = 0; cb < col_blocks; ++cb) {
      const float scale =
          fp8_block_scale(detail::bits_float(amax_bits[static_cast<std::size_t>(cb)]), mode);
      row_scales[static_cast<std::size_t>(cb)] = scale;
      scales[rb * col_blocks + cb] = scale;
    }
    for (std::int64_t i = row_begin; i < row_end; ++i) {
      const Element* row = x + i * k;
      std::uint8_t* out = q + i * k;
      for (std::int64_t cb = 0; cb < col_blocks; ++cb) {
        const float scale = row_scales[static_cast<std::size_t>(cb)];
        const std::int64_t col_end = std::min(k, (cb + 1) * block.k);
        for (std::int64_t j = cb * block.k; j < col_end; ++j) {
          out[j] = float_to_e4m3(load(row, j) / scale, Fp8Saturation::kSatFinite);
        }
      }
    }
  }
}

void check_quantize_input(const TensorView& x, const BlockShape& block) {
  formats_detail::require_dtype_in(x, "quantize_fp8_block: x", {DType::kF32, DType::kBF16});
  formats_detail::require_host_contiguous(x, "quantize_fp8_block: x");
  require_rank(x, "quantize_fp8_block: x", 2);
  require_valid_block(block, "quantize_fp8_block: block");
}

}  // namespace

BlockShape parse_block_shape(std::string_view text, std::string_view argument) {
  const auto bad = [&]() {
    fail_argument(ErrorCode::kInvalidArgument, argument,
                  "NxK with positive integers N and K (e.g. 128x128)",
                  detail::concat('"', text, '"'));
  };
  const std::size_t x = text.find('x');
  if (x == std::string_view::npos) bad();
  const auto parse_extent = [&](std::string_view part) {
    std::int64_t value = 0;
    const char* end = part.data() + part.size();
    const auto [ptr, error] = std::from_chars(part.data(), end, value);
    if (part.empty() || error != std::errc() || ptr != end || value < 1) bad();
    return value;
  };
  return BlockShape{parse_extent(text.substr(0, x)), parse_extent(text.substr(x + 1))};
}

std::string to_string(const BlockShape& block) { return detail::concat(block.n, 'x', block.k); }

std::ostream& operator<<(std::ostream& out, const BlockShape& block) {
  return out << block.n << 'x' << block.k;
}

namespace {
constexpr EnumNames<ScaleMode, 2> kScaleModeNames{
    {{{ScaleMode::kFp32, "fp32"}, {ScaleMode::kUe8m0, "ue8m0"}}}};
}  // namespace

std::string_view to_string(ScaleMode mode) { return kScaleModeNames.name(mode); }

ScaleMode parse_scale_mode(std::string_view text, std::string_view argument) {
  return kScaleModeNames.parse(text, argument);
}

Fp8BlockTensor quantize_fp8_block(const TensorView& x, BlockShape block, ScaleMode mode) {
  check_quantize_input(x, block);
  const std::int64_t n = x.size(0);
  const std::int64_t k = x.size(1);
  Fp8BlockTensor out{Tensor::empty(DType::kE4M3, {n, k}),
                     Tensor::empty(DType::kF32, {ceil_div(n, block.n), ceil_div(k, block.k)}),
                     block};
  quantize_fp8_block_into(x, block, mode, out.q, out.scale);
  return out;
}

void quantize_fp8_block_into(const TensorView& x, BlockShape block, ScaleMode mode,
                             const TensorView& q, const TensorView& scale) {
  check_quantize_input(x, block);
  const std::int64_t n = x.size(0);
  const std::int64_t k = x.size(1);
  const std::int64_t row_blocks = ceil_div(n, block.n);
  const std::int64_t col_blocks = ceil_div(k, block.k);
  require_dtype(q, "quantize_fp8_block: q", DType::kE4M3);
  require_shape(q, "quantize_fp8_block: q", Shape{n, k});
  formats_detail::require_host_contiguous(q, "quantize_fp8_block: q");
  require_dtype(scale, "quantize_fp8_block: scale", DType::kF32);
  require_shape(scale, "quantize_fp8_block: scale", Shape{row_blocks, col_blocks});
  formats_detail::require_host_contiguous(scale, "quantize_fp8_block: scale");
  auto* codes = static_cast<std::uint8_t*>(q.data());
  auto* scales = static_cast<float*>(scale.data());
  // Block rows per chunk (divisions, not block.n * k, which can overflow).
  const std::int64_t grain =
      std::max<std::int64_t>(1, kElementsPerChunk / std::max<std::int64_t>(1, k) / block.n);
  parallel_for(row_blocks, grain, [&](std::int64_t begin, std::int64_t end) {
    if (x.dtype() == DType::kF32) {
      quantize_block_rows(static_cast<const float*>(x.data()), n, k, block, mode, begin, end, codes,
                          scales);
    } else {
      quantize_block_rows(static_cast<const std::uint16_t*>(x.data()), n, k, block, mode, begin,
                          end, codes, scales);
    }
  });
}

Fp8BlockTensor quantize_fp8_groups(const TensorView& x, std::int64_t group_k, ScaleMode mode) {
  if (group_k < 1) {
    fail_argument(ErrorCode::kInvalidArgument, "quantize_fp8_groups: group_k",
                  "a positive group size (e.g. 128)", group_k);
  }
  return quantize_fp8_block(x, BlockShape{1, group_k}, mode);
}

Tensor dequantize_fp8_block(const TensorView& q, const TensorView& scale, BlockShape block) {
  require_dtype(q, "dequantize_fp8_block: q", DType::kE4M3);
  require_dtype(scale, "dequantize_fp8_block: scale", DType::kF32);
  formats_detail::require_host_contiguous(q, "dequantize_fp8_block: q");
  formats_detail::require_host_contiguous(scale, "dequantize_fp8_block: scale");
  require_rank(q, "dequantize_fp8_block: q", 2);
  require_valid_block(block, "dequantize_fp8_block: block");
  const std::int64_t n = q.size(0);
  const std::int64_t k = q.size(1);
  const std::int64_t col_blocks = ceil_div(k, block.k);
  const Shape expected{ceil_div(n, block.n), col_blocks};
  if (!(scale.shape() == expected)) {
    fail_argument(ErrorCode::kShapeMismatch, "dequantize_fp8_block: scale",
                  detail::concat(expected, " (ceil of q's shape ", q.shape(), " / block ",
                                 to_string(block), ")"),
                  scale.shape());
  }
  Tensor out = Tensor::empty(DType::kF32, {n, k});
  const auto* codes = static_cast<const std::uint8_t*>(q.data());
  const float* scales = static_cast<const float*>(scale.data());
  float* values = out.data_as<float>();
  const std::int64_t grain =
      std::max<std::int64_t>(1, kElementsPerChunk / std::max<std::int64_t>(1, k));
  parallel_for(n, grain, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) {
      const float* row_scales = scales + (i / block.n) * col_blocks;
      for (std::int64_t cb = 0; cb < col_blocks; ++cb) {
        const float s = row_scales[cb];
        const std::int64_t col_end = std::min(k, (cb + 1) * block.k);
        for (std::int64_t j = cb * block.k; j < col_end; ++j) {
          values[i * k + j] = e4m3_to_float(codes[i * k + j]) * s;
        }
      }
    }
  });
  return out;
}

}  // namespace mxq
