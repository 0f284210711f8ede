// Padding and restoring a rank's weights in place (semantics in mxq/moe/prepare.h).
#include "mxq/moe/prepare.h"

#include <cstdio>
#include <cstring>

#include "moe/param_groups.h"
#include "mxq/core/error.h"
#include "mxq/moe/rank_weights.h"

namespace mxq::moe {

void validate_alignment(std::int64_t alignment) {
  if (alignment <= 0 || alignment % 32 != 0) {
    fail_argument(ErrorCode::kInvalidArgument, "alignment",
                  "a positive multiple of 32 (the MXFP4 block size)", alignment);
  }
}

std::int64_t padded_intermediate(std::int64_t width, std::int64_t alignment) {
  validate_alignment(alignment);
  if (width <= 0) return 0;
  // ceil(width / alignment) * alignment, without forming width + alignment (an alignment near
  // INT64_MAX would overflow it).
  return (width - 1) / alignment * alignment + alignment;
}

double PaddingSummary::wasted_fraction() const {
  if (after <= 0 || tp_size <= 0) return 0.0;
  return 1.0 - static_cast<double>(intermediate_size) / static_cast<double>(tp_size * after);
}

std::string PaddingSummary::message() const {
  char fraction[32];
  std::snprintf(fraction, sizeof(fraction), "%.2f%%", 100.0 * wasted_fraction());
  return detail::concat("MoE padding: I_rank ", before, " -> ", after, " on each of ", tp_size,
                        " TP rank(s) (I = ", intermediate_size, "): ", fraction,
                        " of the expert GEMM compute and of the w13/w2 weight memory holds "
                        "padding or zero fill");
}

namespace {

// Moves `groups` runs of `old_bytes` to runs of `new_bytes` inside one buffer. Growing walks
// backwards and compacting forwards, so no run is overwritten before it has moved; the grown
// tail of each run is filled with `fill`.
void resize_groups_in_place(std::byte* base, std::int64_t groups, std::size_t old_bytes,
                            std::size_t new_bytes, std::byte fill) {
  if (new_bytes > old_bytes) {
    for (std::int64_t g = groups - 1; g >= 0; --g) {
      const auto at = static_cast<std::size_t>(g);
      std::memmove(base + at * new_bytes, base + at * old_bytes, old_bytes);
      std::memset(base + at * new_bytes + old_bytes, static_cast<int>(fill), new_bytes - old_bytes);
    }
  } else if (new_bytes < old_bytes) {
    for (std::int64_t g = 0; g < groups; ++g) {
      const auto at = static_cast<std::size_t>(g);
      std::memmove(base + at * new_bytes, base + at * old_bytes, new_bytes);
    }
  }
}

}  // namespace

void MoeRankWeights::resize_intermediate(std::int64_t new_width, bool* reallocated) {
  const std::int64_t old_width = shape_.intermediate_size_per_partition_after_pad;
  for (MoeParam param : kAllMoeParams) {
    if (!has(param) || !depends_on_intermediate(param)) continue;
    const std::int64_t groups = param_groups(shape_, param);
    const std::size_t old_bytes = group_bytes(shape_, param, old_width);
    const std::size_t new_bytes = group_bytes(shape_, param, new_width);
    Tensor& storage = storage_[index(param)];
    const std::size_t needed = static_cast<std::size_t>(groups) * new_bytes;
    if (needed > storage.nbytes()) {
      // First preparation: grow once. Later restore/pad cycles then stay in this storage.
      Tensor grown = Tensor::empty(DType::kU8, {static_cast<std::int64_t>(needed)});
      auto* to = static_cast<std::byte*>(grown.data());
      const auto* from = static_cast<const std::byte*>(storage.data());
      for (std::int64_t g = 0; g < groups; ++g) {
        const auto at = static_cast<std::size_t>(g);
        std::memcpy(to + at * new_bytes, from + at * old_bytes, old_bytes);
        std::memset(to + at * new_bytes + old_bytes, static_cast<int>(padding_byte(param)),
                    new_bytes - old_bytes);
      }
      storage = std::move(grown);
      *reallocated = true;
    } else {
      resize_groups_in_place(static_cast<std::byte*>(storage.data()), groups, old_bytes, new_bytes,
                             padding_byte(param));
    }
  }
  shape_.intermediate_size_per_partition_after_pad = new_width;  // the one place I_rank changes
}

void MoeRankWeights::refill_padding() {
  const std::int64_t width = shape_.tp.width;
  const std::int64_t padded = shape_.intermediate_size_per_partition_after_pad;
  for (MoeParam param : kAllMoeParams) {
    if (!has(param) || !depends_on_intermediate(param)) continue;
    const std::size_t real = group_bytes(shape_, param, width);
    const std::size_t run = group_bytes(shape_, param, padded);
    auto* base = static_cast<std::byte*>(storage_[index(param)].data());
    for (std::int64_t g = 0; g < param_groups(shape_, param); ++g) {
      std::memset(base + static_cast<std::size_t>(g) * run + real,
                  static_cast<int>(padding_byte(param)), run - real);
    }
  }
}

MoeRankWeights::PaddingReport MoeRankWeights::pad_intermediate_to_alignment(
    std::int64_t alignment) {
  validate_alignment(alignment);
  if (shape_.prepared() && shape_.alignment != alignment) restore_checkpoint_layout();
  PaddingReport report;
  report.before = shape_.tp.width;
  report.valid = shape_.tp.valid;
  report.after = padded_intermediate(shape_.tp.width, alignment);
  if (shape_.prepared()) {
    refill_padding();  // same alignment again: only re-establish the padding bytes
  } else {
    resize_intermediate(report.after, &report.reallocated);
    shape_.alignment = alignment;
  }
  return report;
}

void MoeRankWeights::restore_checkpoint_layout() {
  if (!shape_.prepared()) return;
  bool reallocated = false;
  resize_intermediate(shape_.tp.width, &reallocated);
  shape_.alignment = 0;
}

}  // namespace mxq::moe
