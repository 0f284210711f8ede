// read_checkpoint_experts: one layer's tensors from a checkpoint in the form the engine-facing op
// prepares from.
#include "mxq/moe/checkpoint_experts.h"

#include <cstddef>
#include <cstring>
#include <string>

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

// A host copy of `view` (scales as u8: E8M0 codes are the same bytes), through memcpy: the
// mapped data of a multi-byte dtype may be unaligned.
Tensor copy_of(const TensorView& view) {
  const DType dtype = view.dtype() == DType::kE8M0 ? DType::kU8 : view.dtype();
  Tensor out = Tensor::empty(dtype, view.shape());
  if (view.nbytes() > 0) std::memcpy(out.data(), view.data(), view.nbytes());
  return out;
}

// Copies `view` (one expert's tensor) into slot `expert` of `stacked` at byte `offset` within
// that expert's slice.
void place(const Tensor& stacked, std::int64_t expert, std::size_t offset, const TensorView& view) {
  const std::size_t per_expert = stacked.nbytes() / static_cast<std::size_t>(stacked.shape()[0]);
  auto* base = static_cast<std::byte*>(stacked.data());
  std::memcpy(base + static_cast<std::size_t>(expert) * per_expert + offset, view.data(),
              view.nbytes());
}

void read_gpt_oss(const MoeCheckpoint& checkpoint, std::int64_t layer, CheckpointExperts& out) {
  const MoeConfig& c = out.config;
  const auto view = [&](MoeTensorKind kind) {
    return checked_view(checkpoint, c, MoeTensorName{layer, kind});
  };
  out.w13 = copy_of(view(MoeTensorKind::kGateUpBlocks));
  out.w2 = copy_of(view(MoeTensorKind::kDownBlocks));
  out.w13_scale = copy_of(view(MoeTensorKind::kGateUpScales));
  out.w2_scale = copy_of(view(MoeTensorKind::kDownScales));
  if (c.has_bias) {
    out.w13_bias = copy_of(view(MoeTensorKind::kGateUpBias));
    out.w2_bias = copy_of(view(MoeTensorKind::kDownBias));
  }
}

void read_native(const MoeCheckpoint& checkpoint, std::int64_t layer, CheckpointExperts& out) {
  const MoeConfig& c = out.config;
  const std::int64_t e = c.num_experts, h = c.hidden_size, i = c.intermediate_size;
  out.w13 = Tensor::empty(DType::kU8, {e, 2 * i, h / 32, 16});
  out.w13_scale = Tensor::empty(DType::kU8, {e, 2 * i, h / 32});
  out.w2 = Tensor::empty(DType::kU8, {e, h, i / 32, 16});
  out.w2_scale = Tensor::empty(DType::kU8, {e, h, i / 32});
  if (c.has_bias) {
    out.w13_bias = Tensor::empty(DType::kBF16, {e, 2 * i});
    out.w2_bias = Tensor::empty(DType::kBF16, {e, h});
  }
  for (std::int64_t expert = 0; expert < e; ++expert) {
    const auto view = [&](MoeTensorKind kind) {
      return checked_view(checkpoint, c, MoeTensorName{layer, kind, expert});
    };
    // Gate rows first, then up rows: the up half starts one gate tensor's bytes in.
    const TensorView gate = view(MoeTensorKind::kGateBlocks);
    place(out.w13, expert, 0, gate);
    place(out.w13, expert, gate.nbytes(), view(MoeTensorKind::kUpBlocks));
    const TensorView gate_scales = view(MoeTensorKind::kGateScales);
    place(out.w13_scale, expert, 0, gate_scales);
    place(out.w13_scale, expert, gate_scales.nbytes(), view(MoeTensorKind::kUpScales));
    place(out.w2, expert, 0, view(MoeTensorKind::kExpertDownBlocks));
    place(out.w2_scale, expert, 0, view(MoeTensorKind::kExpertDownScales));
    if (c.has_bias) {
      const TensorView gate_bias = view(MoeTensorKind::kGateBias);
      place(out.w13_bias, expert, 0, gate_bias);
      place(out.w13_bias, expert, gate_bias.nbytes(), view(MoeTensorKind::kUpBias));
      place(out.w2_bias, expert, 0, view(MoeTensorKind::kExpertDownBias));
    }
  }
}

}  // namespace

CheckpointExperts read_checkpoint_experts(const MoeCheckpoint& checkpoint, std::int64_t layer,
                                          const MoeConfigOverrides& overrides) {
  CheckpointExperts out;
  out.layout = checkpoint.layout(layer);  // kOutOfRange for a layer the checkpoint lacks
  out.config = checkpoint.resolve_config(layer, overrides);
  if (out.layout == CheckpointLayout::kGptOss) {
    read_gpt_oss(checkpoint, layer, out);
  } else {
    read_native(checkpoint, layer, out);
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

}  // namespace mxq::moe
