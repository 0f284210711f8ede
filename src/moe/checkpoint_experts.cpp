// read_checkpoint_experts: one layer's tensors from a checkpoint in the form the engine-facing op
// prepares from.
#include "mxq/moe/checkpoint_experts.h"

#include <cstddef>
#include <cstring>
#include <string>
#include <utility>

#include "mxq/core/error.h"

namespace mxq::moe {
namespace {

// A validated view of one checkpoint tensor.
TensorView checked_view(const MoeCheckpoint& checkpoint, const MoeConfig& config,
                        const MoeTensorName& name) {
  const std::string label = format_tensor_name(name);
  if (!checkpoint.contains(label)) {
    fail(ErrorCode::kInvalidArgument, "checkpoint ", checkpoint.path(), ": layer ", name.layer,
         " needs tensor ", label, ", which is missing");
  }
  TensorView view = checkpoint.view(label);
  check_tensor_against_spec(config, name.kind, view, label);
  return view;
}

// The experts [expert_begin, expert_begin + experts) and intermediate channels [channel_begin,
// channel_begin + channels) a read keeps: the whole layer, or one rank's part (its EP experts and
// its TP channels; MXFP4 blocks are 32 channels wide and TP ranks start on a block boundary, so
// every cut below falls on whole bytes and whole scales).
struct Cut {
  std::int64_t expert_begin = 0;
  std::int64_t experts = 0;
  std::int64_t channel_begin = 0;
  std::int64_t channels = 0;
};

// `height` rows of `width` bytes from `src` (rows `src_pitch` bytes apart) to `dst` (rows
// `dst_pitch` apart), through memcpy: the mapped data of a multi-byte dtype may be unaligned.
void copy_rows(std::byte* dst, std::size_t dst_pitch, const std::byte* src, std::size_t src_pitch,
               std::size_t width, std::size_t height) {
  if (width == 0 || height == 0) return;
  if (dst_pitch == width && src_pitch == width) {
    std::memcpy(dst, src, width * height);
    return;
  }
  for (std::size_t r = 0; r < height; ++r)
    std::memcpy(dst + r * dst_pitch, src + r * src_pitch, width);
}

const std::byte* bytes(const TensorView& view) {
  return static_cast<const std::byte*>(view.data());
}
std::byte* bytes(const Tensor& tensor) { return static_cast<std::byte*>(tensor.data()); }
std::size_t to_size(std::int64_t n) { return static_cast<std::size_t>(n); }

// Scales are read as u8: E8M0 codes are the same bytes.
DType stored_dtype(DType dtype) { return dtype == DType::kE8M0 ? DType::kU8 : dtype; }

// A host copy of `view` (any tensor the cut leaves whole: the router).
Tensor copy_of(const TensorView& view) {
  Tensor out = Tensor::empty(stored_dtype(view.dtype()), view.shape());
  copy_rows(bytes(out), view.nbytes(), bytes(view), view.nbytes(), view.nbytes(), 1);
  return out;
}

// The cut's experts of `view` [E, ...]: experts [begin, begin + count) are contiguous.
Tensor copy_experts(const TensorView& view, const Cut& cut) {
  Shape shape = view.shape();
  const std::size_t per_expert = view.nbytes() / to_size(shape[0]);
  shape[0] = cut.experts;
  Tensor out = Tensor::empty(stored_dtype(view.dtype()), shape);
  copy_rows(bytes(out), out.nbytes(), bytes(view) + to_size(cut.expert_begin) * per_expert,
            out.nbytes(), out.nbytes(), 1);
  return out;
}

// The cut's part of a gpt-oss gate/up tensor [E, 2I, ...] (gate and up rows interleaved: channel c
// is rows 2c and 2c + 1, so the cut's channels are one run of rows per expert) into [E', 2I', ...].
Tensor copy_interleaved_rows(const TensorView& view, const Cut& cut) {
  Shape shape = view.shape();
  const std::int64_t rows = shape[1];
  const std::size_t row_bytes = view.nbytes() / to_size(shape[0] * rows);
  shape[0] = cut.experts;
  shape[1] = 2 * cut.channels;
  Tensor out = Tensor::empty(stored_dtype(view.dtype()), shape);
  const std::size_t kept = to_size(2 * cut.channels) * row_bytes;
  copy_rows(
      bytes(out), kept,
      bytes(view) + (to_size(cut.expert_begin * rows) + to_size(2 * cut.channel_begin)) * row_bytes,
      to_size(rows) * row_bytes, kept, to_size(cut.experts));
  return out;
}

// The cut's channels of a down tensor [E, H, I * num / den bytes...] (each of the E * H rows holds
// every channel: num / den bytes a channel) into [E', H, I' * num / den ...]; `shape` is the
// output's shape.
Tensor copy_channel_columns(const TensorView& view, const Cut& cut, std::int64_t num,
                            std::int64_t den, const Shape& shape) {
  const std::int64_t rows_per_expert = view.shape()[1];
  const std::size_t row_bytes = view.nbytes() / to_size(view.shape()[0] * rows_per_expert);
  Tensor out = Tensor::empty(stored_dtype(view.dtype()), shape);
  const std::size_t kept = to_size(cut.channels * num / den);
  copy_rows(bytes(out), kept,
            bytes(view) + to_size(cut.expert_begin * rows_per_expert) * row_bytes +
                to_size(cut.channel_begin * num / den),
            row_bytes, kept, to_size(cut.experts * rows_per_expert));
  return out;
}

void read_gpt_oss(const MoeCheckpoint& checkpoint, std::int64_t layer, const Cut& cut,
                  CheckpointExperts& out) {
  const MoeConfig& c = out.config;
  const std::int64_t e = cut.experts, h = c.hidden_size, i = cut.channels;
  const auto view = [&](MoeTensorKind kind) {
    return checked_view(checkpoint, c, MoeTensorName{layer, kind});
  };
  out.w13 = copy_interleaved_rows(view(MoeTensorKind::kGateUpBlocks), cut);
  out.w13_scale = copy_interleaved_rows(view(MoeTensorKind::kGateUpScales), cut);
  out.w2 = copy_channel_columns(view(MoeTensorKind::kDownBlocks), cut, 1, 2, {e, h, i / 32, 16});
  out.w2_scale = copy_channel_columns(view(MoeTensorKind::kDownScales), cut, 1, 32, {e, h, i / 32});
  if (c.has_bias) {
    out.w13_bias = copy_interleaved_rows(view(MoeTensorKind::kGateUpBias), cut);
    out.w2_bias = copy_experts(view(MoeTensorKind::kDownBias), cut);
  }
}

// Rows [channel_begin, channel_begin + channels) of one expert's gate or up tensor [I, ...] into
// slot `expert` of `stacked` [E', 2I', ...], at row `first_row` of that slot.
void place_rows(const Tensor& stacked, std::int64_t expert, std::int64_t first_row,
                const TensorView& view, const Cut& cut) {
  const std::size_t row_bytes = view.nbytes() / to_size(view.shape()[0]);
  const std::size_t per_expert = stacked.nbytes() / to_size(stacked.shape()[0]);
  copy_rows(bytes(stacked) + to_size(expert) * per_expert + to_size(first_row) * row_bytes,
            row_bytes, bytes(view) + to_size(cut.channel_begin) * row_bytes, row_bytes,
            to_size(cut.channels) * row_bytes, 1);
}

// The cut's channels of one expert's down tensor [H, I * num / den bytes] into slot `expert` of
// `stacked` [E', H, I' * num / den bytes].
void place_columns(const Tensor& stacked, std::int64_t expert, const TensorView& view,
                   const Cut& cut, std::int64_t num, std::int64_t den) {
  const std::int64_t h = view.shape()[0];
  const std::size_t row_bytes = view.nbytes() / to_size(h);
  const std::size_t kept = to_size(cut.channels * num / den);
  copy_rows(bytes(stacked) + to_size(expert * h) * kept, kept,
            bytes(view) + to_size(cut.channel_begin * num / den), row_bytes, kept, to_size(h));
}

void read_native(const MoeCheckpoint& checkpoint, std::int64_t layer, const Cut& cut,
                 CheckpointExperts& out) {
  const MoeConfig& c = out.config;
  const std::int64_t e = cut.experts, h = c.hidden_size, i = cut.channels;
  out.w13 = Tensor::empty(DType::kU8, {e, 2 * i, h / 32, 16});
  out.w13_scale = Tensor::empty(DType::kU8, {e, 2 * i, h / 32});
  out.w2 = Tensor::empty(DType::kU8, {e, h, i / 32, 16});
  out.w2_scale = Tensor::empty(DType::kU8, {e, h, i / 32});
  if (c.has_bias) {
    out.w13_bias = Tensor::empty(DType::kBF16, {e, 2 * i});
    out.w2_bias = Tensor::empty(DType::kBF16, {e, h});
  }
  for (std::int64_t slot = 0; slot < e; ++slot) {
    const auto view = [&](MoeTensorKind kind) {
      return checked_view(checkpoint, c, MoeTensorName{layer, kind, cut.expert_begin + slot});
    };
    // Gate rows first, then up rows.
    place_rows(out.w13, slot, 0, view(MoeTensorKind::kGateBlocks), cut);
    place_rows(out.w13, slot, i, view(MoeTensorKind::kUpBlocks), cut);
    place_rows(out.w13_scale, slot, 0, view(MoeTensorKind::kGateScales), cut);
    place_rows(out.w13_scale, slot, i, view(MoeTensorKind::kUpScales), cut);
    place_columns(out.w2, slot, view(MoeTensorKind::kExpertDownBlocks), cut, 1, 2);
    place_columns(out.w2_scale, slot, view(MoeTensorKind::kExpertDownScales), cut, 1, 32);
    if (c.has_bias) {
      place_rows(out.w13_bias, slot, 0, view(MoeTensorKind::kGateBias), cut);
      place_rows(out.w13_bias, slot, i, view(MoeTensorKind::kUpBias), cut);
      const TensorView down_bias = view(MoeTensorKind::kExpertDownBias);
      copy_rows(bytes(out.w2_bias) + to_size(slot) * down_bias.nbytes(), down_bias.nbytes(),
                bytes(down_bias), down_bias.nbytes(), down_bias.nbytes(), 1);
    }
  }
}

CheckpointExperts read_cut(const MoeCheckpoint& checkpoint, std::int64_t layer,
                           CheckpointExperts out, const Cut& cut) {
  if (out.layout == CheckpointLayout::kGptOss) {
    read_gpt_oss(checkpoint, layer, cut, out);
  } else {
    read_native(checkpoint, layer, cut, out);
  }
  if (out.config.router == RouterKind::kTopkSoftmax) {
    out.router_weight =
        copy_of(checked_view(checkpoint, out.config, {layer, MoeTensorKind::kRouterWeight}));
    if (out.config.has_bias) {
      out.router_bias =
          copy_of(checked_view(checkpoint, out.config, {layer, MoeTensorKind::kRouterBias}));
    }
  }
  return out;
}

// The layout and the resolved config, before anything is read.
CheckpointExperts header_of(const MoeCheckpoint& checkpoint, std::int64_t layer,
                            const MoeConfigOverrides& overrides) {
  CheckpointExperts out;
  out.layout = checkpoint.layout(layer);  // kOutOfRange for a layer the checkpoint lacks
  out.config = checkpoint.resolve_config(layer, overrides);
  return out;
}

}  // namespace

CheckpointExperts read_checkpoint_experts(const MoeCheckpoint& checkpoint, std::int64_t layer,
                                          const MoeConfigOverrides& overrides) {
  CheckpointExperts out = header_of(checkpoint, layer, overrides);
  const Cut whole{0, out.config.num_experts, 0, out.config.intermediate_size};
  return read_cut(checkpoint, layer, std::move(out), whole);
}

CheckpointExperts read_checkpoint_experts(const MoeCheckpoint& checkpoint, std::int64_t layer,
                                          const MoeConfigOverrides& overrides,
                                          const MoeRank& rank) {
  CheckpointExperts out = header_of(checkpoint, layer, overrides);
  // The rank's shards as the op computes them (bad ranks are refused here, before any read).
  const PreparedMoeShapes shapes = prepared_moe_shapes(out.layer_shape(), rank);
  const Cut cut{shapes.ep.begin, shapes.ep.count, shapes.tp.begin, shapes.tp.valid};
  return read_cut(checkpoint, layer, std::move(out), cut);
}

}  // namespace mxq::moe
