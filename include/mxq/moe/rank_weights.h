// One rank's expert weights, in the MoE weight contract of DESIGN.md:
//   w13        u8   [E_local, 2 * I_rank, H / 2]   gate rows [0, I_rank), up rows [I_rank, 2
//   I_rank) w13_scale  e8m0 [E_local, 2 * I_rank, H / 32] w2         u8   [E_local, H, I_rank / 2]
//   w2_scale   e8m0 [E_local, H, I_rank / 32]
//   w13_bias   bf16 [E_local, 2 * I_rank]          (only when the layer has biases)
//   w2_bias    bf16 [E_local, H]                   (held by TP rank 0 only; zeros elsewhere)
// Two E2M1 codes per byte, element 2j in the low nibble; scales are E8M0 bytes.
//
// I_rank is MoeRankShape::intermediate_size_per_partition_after_pad, the one owner of that fact:
// every view below, the forward pass and the preparation derive their shapes from it. It is the TP
// width in checkpoint layout and the padded P once prepared (see prepare.h). Only the preparation
// functions change it.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "mxq/core/tensor.h"
#include "mxq/moe/sharding.h"

namespace mxq::moe {

enum class MoeParam { kW13, kW13Scale, kW2, kW2Scale, kW13Bias, kW2Bias };
inline constexpr std::array<MoeParam, 6> kAllMoeParams = {MoeParam::kW13,     MoeParam::kW13Scale,
                                                          MoeParam::kW2,      MoeParam::kW2Scale,
                                                          MoeParam::kW13Bias, MoeParam::kW2Bias};
std::string_view to_string(MoeParam param);

// Whether a parameter holds E8M0 scales (w13_scale, w2_scale).
constexpr bool is_scale(MoeParam param) {
  return param == MoeParam::kW13Scale || param == MoeParam::kW2Scale;
}

// The byte value that pads a parameter: 0 for weights and biases, 127 (= 1.0) for scales, so
// no zero or NaN scale ever appears.
std::byte padding_byte(MoeParam param);

struct MoeRankShape {
  std::int64_t hidden = 0;  // H
  bool has_bias = false;
  TpShard tp;
  EpShard ep;
  // I_rank: tp.width in checkpoint layout, the padded P once prepared.
  std::int64_t intermediate_size_per_partition_after_pad = 0;
  // 0 in checkpoint layout; the alignment the weights were padded to once prepared.
  std::int64_t alignment = 0;

  [[nodiscard]] std::int64_t experts_local() const { return ep.count; }
  [[nodiscard]] bool prepared() const { return alignment != 0; }
  // The shape of `param` in the current layout (bias shapes even when has_bias is false).
  [[nodiscard]] Shape shape_of(MoeParam param) const;
  [[nodiscard]] DType dtype_of(MoeParam param) const;
};

class MoeRankWeights {
 public:
  // Allocates checkpoint-layout storage (I_rank = tp.width) filled with the padding bytes.
  MoeRankWeights(std::int64_t hidden, bool has_bias, const TpShard& tp, const EpShard& ep);
  MoeRankWeights(MoeRankWeights&&) = default;
  MoeRankWeights& operator=(MoeRankWeights&&) = default;
  MoeRankWeights(const MoeRankWeights&) = delete;  // would alias the storage
  MoeRankWeights& operator=(const MoeRankWeights&) = delete;

  [[nodiscard]] const MoeRankShape& shape() const { return shape_; }
  [[nodiscard]] bool has(MoeParam param) const;
  // View of a parameter in the current layout. Throws for a bias the layer does not have.
  [[nodiscard]] TensorView view(MoeParam param) const;
  [[nodiscard]] TensorView w13() const { return view(MoeParam::kW13); }
  [[nodiscard]] TensorView w13_scale() const { return view(MoeParam::kW13Scale); }
  [[nodiscard]] TensorView w2() const { return view(MoeParam::kW2); }
  [[nodiscard]] TensorView w2_scale() const { return view(MoeParam::kW2Scale); }
  [[nodiscard]] TensorView w13_bias() const { return view(MoeParam::kW13Bias); }
  [[nodiscard]] TensorView w2_bias() const { return view(MoeParam::kW2Bias); }
  // Allocated bytes behind a parameter (>= the current view; the padded size once prepared).
  [[nodiscard]] std::size_t capacity(MoeParam param) const;

  // Preparation (src/moe/prepare.cpp; semantics in mxq/moe/prepare.h).
  struct PaddingReport {
    std::int64_t before = 0;   // I_rank before
    std::int64_t after = 0;    // I_rank after (P)
    std::int64_t valid = 0;    // channels holding checkpoint data
    bool reallocated = false;  // storage had to grow (first preparation only)
  };
  PaddingReport pad_intermediate_to_alignment(std::int64_t alignment);
  void restore_checkpoint_layout();

 private:
  [[nodiscard]] std::size_t index(MoeParam param) const;
  void resize_intermediate(std::int64_t new_width, bool* reallocated);
  void refill_padding();

  MoeRankShape shape_;
  std::array<Tensor, 6> storage_;  // flat u8 buffers, indexed by MoeParam
};

}  // namespace mxq::moe
