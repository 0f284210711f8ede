#include "mxq/linear/weight.h"

#include "linear/device_ops.h"
#include "mxq/core/error.h"
#include "mxq/formats/ue8m0_pack.h"

namespace mxq::linear {
namespace {

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }
std::int64_t round_up(std::int64_t a, std::int64_t b) { return ceil_div(a, b) * b; }

}  // namespace

std::int64_t BlockFp8Weight::row_blocks() const { return block.n > 0 ? ceil_div(n(), block.n) : 0; }

std::int64_t BlockFp8Weight::col_blocks() const { return block.k > 0 ? ceil_div(k(), block.k) : 0; }

ScaleLayout BlockFp8Weight::scale_layout() const {
  return scale.dtype() == DType::kI32 ? ScaleLayout::kPackedUe8m0 : ScaleLayout::kFp32;
}

void BlockFp8Weight::validate(std::string_view argument) const {
  const std::string name(argument);
  if (!q.defined()) fail(ErrorCode::kInvalidArgument, name, ".q: the weight has no codes");
  if (!scale.defined()) fail(ErrorCode::kInvalidArgument, name, ".scale: the weight has no scales");
  require_rank(q, name + ".q", 2);
  require_dtype(q, name + ".q", DType::kE4M3);
  require_contiguous(q, name + ".q");
  require_contiguous(scale, name + ".scale");
  if (block.n < 1 || block.k < 1) {
    fail_argument(ErrorCode::kInvalidArgument, name + ".block", "positive extents (e.g. 128x128)",
                  to_string(block));
  }
  if (q.device() != scale.device()) {
    fail(ErrorCode::kDeviceMismatch, name, ": codes on ", q.device(), " but scales on ",
         scale.device());
  }
  const std::int64_t nb = row_blocks();
  const std::int64_t g = col_blocks();
  if (scale.dtype() == DType::kF32) {
    if (!(scale.shape() == Shape{nb, g})) {
      fail_argument(ErrorCode::kShapeMismatch, name + ".scale",
                    detail::concat("f32 ", Shape{nb, g}, " (ceil of q's ", q.shape(), " / block ",
                                   to_string(block), ")"),
                    detail::concat(scale.dtype(), " ", scale.shape()));
    }
  } else if (scale.dtype() == DType::kI32) {
    const Shape packed{ceil_div(g, 4), round_up(nb, 4)};
    if (!(scale.shape() == packed)) {
      fail_argument(ErrorCode::kShapeMismatch, name + ".scale",
                    detail::concat("packed UE8M0 i32 ", packed, " for ", nb, "x", g, " blocks (q ",
                                   q.shape(), ", block ", to_string(block), ")"),
                    detail::concat(scale.dtype(), " ", scale.shape()));
    }
  } else {
    fail_argument(ErrorCode::kDtypeMismatch, name + ".scale",
                  "f32 scales or i32 packed UE8M0 scales", scale.dtype());
  }
}

BlockFp8Weight BlockFp8Weight::to(Device device) const {
  validate();
  return BlockFp8Weight{q.to(device), scale.to(device), block};
}

BlockFp8Weight BlockFp8Weight::with_fp32_scales() const {
  validate();
  if (scale_layout() == ScaleLayout::kFp32) return *this;
  const std::int64_t nb = row_blocks();
  const std::int64_t g = col_blocks();
  if (device().is_cpu()) return BlockFp8Weight{q, unpack_ue8m0(scale, nb, g), block};
  const mxq::detail::DeviceScope scope(device());
  Tensor unpacked = Tensor::empty(DType::kF32, {nb, g}, device());
  internal::unpack_ue8m0_on_device(scale, nb, g, unpacked.data_as<float>(), nb, g, 1, nullptr);
  return BlockFp8Weight{q, unpacked, block};
}

BlockFp8Weight BlockFp8Weight::with_packed_ue8m0_scales() const {
  validate();
  if (scale_layout() == ScaleLayout::kPackedUe8m0) return *this;
  require_device(scale, "with_packed_ue8m0_scales: weight.scale", Device::cpu());
  return BlockFp8Weight{q, pack_ue8m0(scale), block};
}

BlockFp8Weight make_block_fp8_weight(Tensor q, Tensor scale, BlockShape block) {
  BlockFp8Weight weight{std::move(q), std::move(scale), block};
  weight.validate();
  return weight;
}

BlockFp8Weight quantize_weight(const TensorView& w, BlockShape block, ScaleMode mode) {
  Fp8BlockTensor quantized = quantize_fp8_block(w, block, mode);
  return make_block_fp8_weight(std::move(quantized.q), std::move(quantized.scale), block);
}

}  // namespace mxq::linear
