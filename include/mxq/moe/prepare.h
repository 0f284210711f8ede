// Post-load preparation of a rank's expert weights for the kernels: padding of the per-rank
// intermediate size I_rank to the kernel's alignment P (128 for the tensor-core layouts).
//
//   P = ceil(I_rank / alignment) * alignment      (alignment: a positive multiple of 32)
//   w13, w13_scale, w13_bias: the gate half goes to rows [0, I_rank), the up half to
//       [P, P + I_rank); rows [I_rank, P) and [P + I_rank, 2P) are padding.
//   w2, w2_scale: the last dimension grows from I_rank/2 to P/2 bytes (two E2M1 per byte) and
//       from I_rank/32 to P/32 scales.
//   Padding bytes: 0 for weights and biases, 127 (E8M0 1.0) for scales.
//   MoeRankShape::intermediate_size_per_partition_after_pad becomes P (its one owner); nothing else
//   changes.
//
// Padded channels produce exactly zero (zero weights and bias give gate = up = +0, every
// activation maps (+0, +0) to +0, and zero w2 columns add +0 to the sums), so a padded layer's
// output equals the unpadded one bit for bit on the CPU reference.
//
// pad_intermediate_to_alignment is idempotent (padding again with the same alignment only
// rewrites the padding bytes; another alignment restores first). The first preparation grows
// the storage (a new allocation, like SGLang's first build); after that, restoring and padding
// again work in place, so parameter addresses stay fixed across weight-update sessions.
// restore_checkpoint_layout undoes the padding in place (I_rank back to the TP width).
#pragma once

#include <cstdint>
#include <string>

namespace mxq::moe {

inline constexpr std::int64_t kDefaultAlignment = 128;

// Throws mxq::Error(kInvalidArgument) unless alignment is a positive multiple of 32.
void validate_alignment(std::int64_t alignment);
// P for a width and an alignment.
std::int64_t padded_intermediate(std::int64_t width, std::int64_t alignment);

// What the padding costs over a whole layer: every TP rank stores `after` channels per expert
// for `intermediate_size` real ones in total.
struct PaddingSummary {
  std::int64_t intermediate_size = 0;  // I of the checkpoint
  int tp_size = 1;
  std::int64_t before = 0;  // I_rank before preparation (TP width)
  std::int64_t after = 0;   // I_rank after (P)
  // Fraction of the expert GEMM work and of the w13/w2 weight and scale memory spent on
  // channels that hold no checkpoint data (padding plus the zero fill of uneven TP splits):
  // 1 - I / (tp_size * P).
  [[nodiscard]] double wasted_fraction() const;
  [[nodiscard]] std::string message() const;  // the one warning the layer logs
};

}  // namespace mxq::moe
