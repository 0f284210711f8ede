#include "moe/slice_writer.h"

#include <cstring>

#include "moe/param_groups.h"
#include "mxq/core/error.h"

namespace mxq::moe {
namespace {

MoeParam param_of(MoeTensorKind kind) {
  switch (kind) {
    case MoeTensorKind::kGateUpBlocks:
    case MoeTensorKind::kGateBlocks:
    case MoeTensorKind::kUpBlocks:
      return MoeParam::kW13;
    case MoeTensorKind::kGateUpScales:
    case MoeTensorKind::kGateScales:
    case MoeTensorKind::kUpScales:
      return MoeParam::kW13Scale;
    case MoeTensorKind::kGateUpBias:
    case MoeTensorKind::kGateBias:
    case MoeTensorKind::kUpBias:
      return MoeParam::kW13Bias;
    case MoeTensorKind::kDownBlocks:
    case MoeTensorKind::kExpertDownBlocks:
      return MoeParam::kW2;
    case MoeTensorKind::kDownScales:
    case MoeTensorKind::kExpertDownScales:
      return MoeParam::kW2Scale;
    case MoeTensorKind::kDownBias:
    case MoeTensorKind::kExpertDownBias:
      return MoeParam::kW2Bias;
    default:
      break;
  }
  fail(ErrorCode::kInternal, "write_rank_slice: not an expert tensor");
}

// Bytes per intermediate channel of a w13-side row (blocks: H/2, scales: H/32, bias: 2).
std::size_t w13_row_bytes(const MoeRankShape& shape, MoeParam param) {
  return group_bytes(shape, param, 1);
}

// Writes one expert's gate or up half (`half` 0 or 1) of w13 / w13_scale / w13_bias: channel c
// of the rank comes from source row `source_row(c)` (each row `row_bytes` long).
template <typename SourceRow>
void write_w13_half(const MoeRankWeights& weights, MoeParam param, std::int64_t local_expert,
                    int half, const std::byte* source, SourceRow source_row) {
  const MoeRankShape& shape = weights.shape();
  const std::size_t row_bytes = w13_row_bytes(shape, param);
  const std::int64_t width = shape.tp.width;
  auto* dst = weights.view(param).bytes() +
              static_cast<std::size_t>((local_expert * 2 + half) * width) * row_bytes;
  for (std::int64_t c = 0; c < shape.tp.valid; ++c) {
    std::memcpy(dst + static_cast<std::size_t>(c) * row_bytes,
                source + static_cast<std::size_t>(source_row(shape.tp.begin + c)) * row_bytes,
                row_bytes);
  }
  std::memset(dst + static_cast<std::size_t>(shape.tp.valid) * row_bytes,
              static_cast<int>(padding_byte(param)),
              static_cast<std::size_t>(width - shape.tp.valid) * row_bytes);
}

// Writes one expert's w2 / w2_scale: H rows; the rank's channels [begin, begin + valid) are
// bytes [begin / per_byte, ...) of each source row of `source_row_bytes`.
void write_w2_expert(const MoeRankWeights& weights, MoeParam param, std::int64_t local_expert,
                     const std::byte* source, std::size_t source_row_bytes) {
  const MoeRankShape& shape = weights.shape();
  const std::int64_t channels_per_byte = param == MoeParam::kW2 ? 2 : 32;
  const auto first = static_cast<std::size_t>(shape.tp.begin / channels_per_byte);
  const auto valid = static_cast<std::size_t>(shape.tp.valid / channels_per_byte);
  const std::size_t row_bytes = group_bytes(shape, param, shape.tp.width);
  auto* dst = weights.view(param).bytes() +
              static_cast<std::size_t>(local_expert * shape.hidden) * row_bytes;
  for (std::int64_t h = 0; h < shape.hidden; ++h) {
    const auto row = static_cast<std::size_t>(h);
    std::memcpy(dst + row * row_bytes, source + row * source_row_bytes + first, valid);
    std::memset(dst + row * row_bytes + valid, static_cast<int>(padding_byte(param)),
                row_bytes - valid);
  }
}

// w2_bias is added once per expert: TP rank 0 holds it, the other TP ranks hold zeros.
void write_w2_bias(const MoeRankWeights& weights, std::int64_t local_expert,
                   const std::byte* source) {
  const MoeRankShape& shape = weights.shape();
  const std::size_t bytes = static_cast<std::size_t>(shape.hidden) * 2;
  auto* dst = weights.w2_bias().bytes() + static_cast<std::size_t>(local_expert) * bytes;
  if (shape.tp.rank == 0) {
    std::memcpy(dst, source, bytes);
  } else {
    std::memset(dst, 0, bytes);
  }
}

}  // namespace

bool rank_holds(const MoeRankWeights& weights, const MoeTensorName& name) {
  if (!is_per_expert(name.kind)) return true;
  const EpShard& ep = weights.shape().ep;
  return name.expert >= ep.begin && name.expert < ep.begin + ep.count;
}

void write_rank_slice(MoeRankWeights& weights, const MoeTensorName& name,
                      const TensorView& source) {
  const MoeRankShape& shape = weights.shape();
  MXQ_CHECK(!shape.prepared(), ErrorCode::kInternal,
            "write_rank_slice: weights must be in checkpoint layout");
  if (!rank_holds(weights, name)) return;
  const MoeParam param = param_of(name.kind);
  if (!weights.has(param)) return;  // a bias tensor for a layer built without biases
  const auto* src = source.bytes();
  const std::int64_t experts = shape.experts_local();
  // Source row sizes follow from the checkpoint's full I = the tensor's extent.
  switch (name.kind) {
    case MoeTensorKind::kGateUpBlocks:
    case MoeTensorKind::kGateUpScales:
    case MoeTensorKind::kGateUpBias: {
      // [E, 2I, ...] with rows interleaved: gate channel c is row 2c, up channel c row 2c + 1.
      const std::int64_t rows_per_expert = source.shape()[1];
      const std::size_t row_bytes = w13_row_bytes(shape, param);
      for (std::int64_t el = 0; el < experts; ++el) {
        const std::byte* expert =
            src + static_cast<std::size_t>((shape.ep.begin + el) * rows_per_expert) * row_bytes;
        write_w13_half(weights, param, el, 0, expert, [](std::int64_t c) { return 2 * c; });
        write_w13_half(weights, param, el, 1, expert, [](std::int64_t c) { return 2 * c + 1; });
      }
      return;
    }
    case MoeTensorKind::kGateBlocks:
    case MoeTensorKind::kGateScales:
    case MoeTensorKind::kGateBias:
    case MoeTensorKind::kUpBlocks:
    case MoeTensorKind::kUpScales:
    case MoeTensorKind::kUpBias: {
      const bool up = name.kind == MoeTensorKind::kUpBlocks ||
                      name.kind == MoeTensorKind::kUpScales || name.kind == MoeTensorKind::kUpBias;
      write_w13_half(weights, param, name.expert - shape.ep.begin, up ? 1 : 0, src,
                     [](std::int64_t c) { return c; });
      return;
    }
    case MoeTensorKind::kDownBlocks:
    case MoeTensorKind::kDownScales: {
      // [E, H, I/32, 16] or [E, H, I/32]: one row of I/2 or I/32 bytes per (expert, h).
      const std::size_t row_bytes =
          source.nbytes() / static_cast<std::size_t>(source.shape()[0] * source.shape()[1]);
      for (std::int64_t el = 0; el < experts; ++el) {
        write_w2_expert(
            weights, param, el,
            src + static_cast<std::size_t>((shape.ep.begin + el) * shape.hidden) * row_bytes,
            row_bytes);
      }
      return;
    }
    case MoeTensorKind::kExpertDownBlocks:
    case MoeTensorKind::kExpertDownScales: {
      const std::size_t row_bytes = source.nbytes() / static_cast<std::size_t>(shape.hidden);
      write_w2_expert(weights, param, name.expert - shape.ep.begin, src, row_bytes);
      return;
    }
    case MoeTensorKind::kDownBias:
      for (std::int64_t el = 0; el < experts; ++el) {
        write_w2_bias(weights, el,
                      src + static_cast<std::size_t>((shape.ep.begin + el) * shape.hidden) * 2);
      }
      return;
    case MoeTensorKind::kExpertDownBias:
      write_w2_bias(weights, name.expert - shape.ep.begin, src);
      return;
    default:
      break;
  }
  fail(ErrorCode::kInternal, "write_rank_slice: not an expert tensor");
}

}  // namespace mxq::moe
