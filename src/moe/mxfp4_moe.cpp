// The engine-facing MoE op (mxq/moe/mxfp4_moe.h): shapes, the checks at the boundary, and the
// dispatch to the CPU or CUDA backend (mxfp4_moe_backend.h).
#include "mxq/moe/mxfp4_moe.h"

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "moe/mxfp4_moe_backend.h"
#include "mxq/core/error.h"
#include "mxq/formats/bf16.h"
#include "mxq/moe/prepare.h"
#include "mxq/moe/routing.h"

namespace mxq::moe {
namespace {

using detail::scale_pitch;

// Why the CUDA forward needs 16-byte aligned inputs (the error names it).
constexpr const char* kVectorLoads = "the CUDA kernels read 16-byte vectors";

void check_layer(const MoeLayerShape& layer) {
  const auto positive_multiple = [](const char* name, std::int64_t value, std::int64_t m) {
    if (value < 1 || value % m != 0) {
      fail_argument(ErrorCode::kInvalidArgument, name,
                    m == 1 ? std::string(">= 1") : "a positive multiple of " + std::to_string(m),
                    value);
    }
  };
  positive_multiple("num_experts", layer.num_experts, 1);
  positive_multiple("hidden_size", layer.hidden_size, 32);
  positive_multiple("intermediate_size", layer.intermediate_size, 32);
}

// The argument's pointer as `T*`, after its dtype, device, contiguity and shape are checked.
template <typename T>
T* checked(const TensorView& t, std::string_view name, DType dtype, Device device,
           const Shape& shape) {
  require_dtype(t, name, dtype);
  require_device(t, name, device);
  require_shape(t, name, shape);
  require_contiguous(t, name);
  if (t.numel() > 0 && t.data() == nullptr) {
    fail_argument(ErrorCode::kInvalidArgument, name, "a tensor with data", "a null pointer");
  }
  return static_cast<T*>(t.data());
}

// Packed FP4 rows given as [E, R, K/2] or [E, R, K/32, 16] (the same bytes).
void check_packed(const TensorView& t, std::string_view name, Device device, std::int64_t experts,
                  std::int64_t rows, std::int64_t k) {
  const Shape flat{experts, rows, k / 2};
  const Shape blocked{experts, rows, k / 32, 16};
  if (t.shape() == blocked) {
    (void)checked<std::uint8_t>(t, name, DType::kU8, device, blocked);
  } else {
    (void)checked<std::uint8_t>(t, name, DType::kU8, device, flat);
  }
}

}  // namespace

PreparedMoeShapes prepared_moe_shapes(const MoeLayerShape& layer, const MoeRank& rank) {
  check_layer(layer);
  if (rank.tp_size < 1) fail_argument(ErrorCode::kInvalidArgument, "tp_size", ">= 1", rank.tp_size);
  if (rank.ep_size < 1) fail_argument(ErrorCode::kInvalidArgument, "ep_size", ">= 1", rank.ep_size);
  PreparedMoeShapes s;
  s.tp = tp_shard(layer.intermediate_size, rank.tp_size, rank.tp_rank);
  s.ep = ep_shard(layer.num_experts, rank.ep_size, rank.ep_rank);
  s.intermediate_size_per_partition = s.tp.width;
  s.intermediate_size_per_partition_after_pad =
      rank.alignment == 0 ? s.tp.width : padded_intermediate(s.tp.width, rank.alignment);
  const std::int64_t e = s.ep.count;
  const std::int64_t h = layer.hidden_size;
  const std::int64_t p = s.intermediate_size_per_partition_after_pad;
  s.w13 = {e, 2 * p, h / 2};
  s.w13_scale = {e, 2 * p, scale_pitch(h)};
  s.w13_bias = {e, 2 * p};
  s.w2 = {e, h, p / 2};
  s.w2_scale = {e, h, scale_pitch(p)};
  s.w2_bias = {e, h};
  return s;
}

void prepare_mxfp4_moe(const MoeExpertTensors& experts, const MoeLayerShape& layer,
                       const MoeRank& rank, const PreparedMoe& prepared, void* stream) {
  detail::PreparePlan plan;
  plan.shapes = prepared_moe_shapes(layer, rank);
  const PreparedMoeShapes& s = plan.shapes;
  plan.hidden = layer.hidden_size;
  plan.has_bias = layer.has_bias;
  plan.add_down_bias = rank.tp_rank == 0;
  plan.activation_quant = rank.activation_quant;
  const Device device = experts.w13.device();
  plan.device = device;
  const std::int64_t h = layer.hidden_size;
  const std::int64_t i = layer.intermediate_size;

  // The input holds every expert or only this rank's, every channel or only this rank's.
  const std::int64_t e_in = experts.w13.rank() >= 1 ? experts.w13.size(0) : 0;
  if (e_in != layer.num_experts && e_in != s.ep.count) {
    fail_argument(ErrorCode::kShapeMismatch, "experts.w13",
                  mxq::detail::concat("[E = ", layer.num_experts, " or E_local = ", s.ep.count,
                                      ", 2I, H/2] (every expert, or this EP rank's)"),
                  experts.w13.shape());
  }
  const std::int64_t rows_in = experts.w13.rank() >= 2 ? experts.w13.size(1) : 0;
  if (rows_in != 2 * i && rows_in != 2 * s.tp.valid) {
    fail_argument(ErrorCode::kShapeMismatch, "experts.w13",
                  mxq::detail::concat("[E, 2I = ", 2 * i, " or 2 x this TP rank's channels = ",
                                      2 * s.tp.valid, ", H/2]"),
                  experts.w13.shape());
  }
  detail::ExpertSource& src = plan.source;
  src.interleaved = experts.layout == CheckpointLayout::kGptOss;
  src.expert_offset = e_in == s.ep.count ? 0 : s.ep.begin;
  src.inter_in = rows_in / 2;
  src.channel_offset = src.inter_in == s.tp.valid ? 0 : s.tp.begin;
  check_packed(experts.w13, "experts.w13", device, e_in, rows_in, h);
  src.w13 = static_cast<const std::uint8_t*>(experts.w13.data());
  src.w13_scale = checked<const std::uint8_t>(experts.w13_scale, "experts.w13_scale", DType::kU8,
                                              device, {e_in, rows_in, h / 32});
  check_packed(experts.w2, "experts.w2", device, e_in, h, src.inter_in);
  src.w2 = static_cast<const std::uint8_t*>(experts.w2.data());
  src.w2_scale = checked<const std::uint8_t>(experts.w2_scale, "experts.w2_scale", DType::kU8,
                                             device, {e_in, h, src.inter_in / 32});
  if (layer.has_bias) {
    src.w13_bias = checked<const std::uint16_t>(experts.w13_bias, "experts.w13_bias", DType::kBF16,
                                                device, {e_in, rows_in});
    src.w2_bias = checked<const std::uint16_t>(experts.w2_bias, "experts.w2_bias", DType::kBF16,
                                               device, {e_in, h});
  }
  plan.w13 = checked<std::uint8_t>(prepared.w13, "prepared.w13", DType::kU8, device, s.w13);
  plan.w13_scale = checked<std::uint8_t>(prepared.w13_scale, "prepared.w13_scale", DType::kU8,
                                         device, s.w13_scale);
  plan.w2 = checked<std::uint8_t>(prepared.w2, "prepared.w2", DType::kU8, device, s.w2);
  plan.w2_scale =
      checked<std::uint8_t>(prepared.w2_scale, "prepared.w2_scale", DType::kU8, device, s.w2_scale);
  if (layer.has_bias) {
    plan.w13_bias = checked<std::uint16_t>(prepared.w13_bias, "prepared.w13_bias", DType::kBF16,
                                           device, s.w13_bias);
    plan.w2_bias = checked<std::uint16_t>(prepared.w2_bias, "prepared.w2_bias", DType::kBF16,
                                          device, s.w2_bias);
  }
  if (device.is_cpu()) {
    detail::prepare_on_host(plan);
  } else {
    detail::prepare_on_device(plan, stream);
  }
}

std::size_t mxfp4_moe_workspace_bytes(const MoeLayerShape& layer, const MoeRank& rank,
                                      const Mxfp4MoeOptions& options, Device device) {
  const PreparedMoeShapes shapes = prepared_moe_shapes(layer, rank);
  if (device.is_cpu()) return 0;
  if (options.max_tokens < 1) {
    fail_argument(ErrorCode::kInvalidArgument, "options.max_tokens",
                  "the most tokens a forward with this workspace takes (>= 1)", options.max_tokens);
  }
  return detail::device_workspace_bytes(shapes, layer.num_experts, layer.hidden_size,
                                        rank.activation_quant, options.top_k, options.max_tokens);
}

void mxfp4_moe(const TensorView& x, const PreparedMoe& prepared, const MoeLayerShape& layer,
               const MoeRank& rank, const MoeRouting& routing, const Mxfp4MoeOptions& options,
               const TensorView& out, const TensorView& workspace, void* stream) {
  detail::ForwardPlan plan;
  plan.shapes = prepared_moe_shapes(layer, rank);
  const PreparedMoeShapes& s = plan.shapes;
  const Device device = x.device();
  const std::int64_t h = layer.hidden_size;
  plan.num_experts = layer.num_experts;
  plan.hidden = h;
  plan.has_bias = layer.has_bias;
  plan.activation_quant = rank.activation_quant;
  plan.options = options;

  require_rank(x, "x", 2);
  if (device.is_cuda()) {
    require_dtype(x, "x", DType::kBF16);
  } else if (x.dtype() != DType::kBF16 && x.dtype() != DType::kF32) {
    fail_argument(ErrorCode::kDtypeMismatch, "x", "bf16 (or f32 holding bf16 values, CPU)",
                  x.dtype());
  }
  const std::int64_t t = x.size(0);
  (void)checked<void>(x, "x", x.dtype(), device, {t, h});
  if (device.is_cuda()) require_aligned(x.data(), "x", 16, kVectorLoads);
  plan.x = x;
  plan.tokens = t;
  if (options.top_k < 1 || options.top_k > layer.num_experts) {
    fail_argument(ErrorCode::kInvalidArgument, "options.top_k",
                  mxq::detail::concat("1 .. num_experts (", layer.num_experts, ")"), options.top_k);
  }
  if (options.swiglu_limit <= 0) {
    fail_argument(ErrorCode::kInvalidArgument, "options.swiglu_limit", "> 0", options.swiglu_limit);
  }
  plan.max_tokens = options.max_tokens == 0 ? t : options.max_tokens;
  if (t > plan.max_tokens) {
    fail_argument(ErrorCode::kOutOfRange, "x",
                  mxq::detail::concat("at most options.max_tokens = ", plan.max_tokens, " tokens"),
                  t);
  }

  // The prepared tensors, as prepare_mxfp4_moe writes them.
  const auto weight = [&](const TensorView& v, const char* name, DType dtype, const Shape& shape) {
    (void)checked<void>(v, name, dtype, device, shape);
    return v;
  };
  plan.prepared.w13 = weight(prepared.w13, "prepared.w13", DType::kU8, s.w13);
  plan.prepared.w13_scale =
      weight(prepared.w13_scale, "prepared.w13_scale", DType::kU8, s.w13_scale);
  plan.prepared.w2 = weight(prepared.w2, "prepared.w2", DType::kU8, s.w2);
  plan.prepared.w2_scale = weight(prepared.w2_scale, "prepared.w2_scale", DType::kU8, s.w2_scale);
  if (device.is_cuda()) {
    require_aligned(plan.prepared.w13.data(), "prepared.w13", 16, kVectorLoads);
    require_aligned(plan.prepared.w2.data(), "prepared.w2", 16, kVectorLoads);
  }
  if (layer.has_bias) {
    plan.prepared.w13_bias =
        weight(prepared.w13_bias, "prepared.w13_bias", DType::kBF16, s.w13_bias);
    plan.prepared.w2_bias = weight(prepared.w2_bias, "prepared.w2_bias", DType::kBF16, s.w2_bias);
  }

  // Routing: the engine's top-k, or the router.
  const bool ids_given =
      detail::is_given(routing.topk_ids) || detail::is_given(routing.topk_weights);
  const bool router_given = detail::is_given(routing.router_weight);
  if (ids_given == router_given) {
    fail_argument(ErrorCode::kInvalidArgument, "routing",
                  "either topk_ids and topk_weights, or router_weight",
                  ids_given ? "both" : "neither");
  }
  if (ids_given) {
    (void)checked<void>(routing.topk_ids, "routing.topk_ids", DType::kI32, device,
                        {t, options.top_k});
    (void)checked<void>(routing.topk_weights, "routing.topk_weights", DType::kF32, device,
                        {t, options.top_k});
  } else {
    (void)checked<void>(routing.router_weight, "routing.router_weight", DType::kBF16, device,
                        {layer.num_experts, h});
    if (device.is_cuda())
      require_aligned(routing.router_weight.data(), "routing.router_weight", 16, kVectorLoads);
    if (detail::is_given(routing.router_bias)) {
      (void)checked<void>(routing.router_bias, "routing.router_bias", DType::kBF16, device,
                          {layer.num_experts});
    }
  }
  plan.routing = routing;

  if (out.dtype() != DType::kF32 && out.dtype() != DType::kBF16) {
    fail_argument(ErrorCode::kDtypeMismatch, "out", "f32 or bf16", out.dtype());
  }
  (void)checked<void>(out, "out", out.dtype(), device, {t, h});
  plan.out = out;

  if (device.is_cuda()) {
    const std::size_t need = detail::device_workspace_bytes(
        s, layer.num_experts, h, rank.activation_quant, options.top_k, plan.max_tokens);
    require_dtype(workspace, "workspace", DType::kU8);
    require_device(workspace, "workspace", device);
    require_contiguous(workspace, "workspace");
    if (workspace.nbytes() < need) {
      fail_argument(ErrorCode::kInvalidArgument, "workspace",
                    mxq::detail::concat("at least mxfp4_moe_workspace_bytes = ", need,
                                        " bytes (max_tokens ", plan.max_tokens, ")"),
                    mxq::detail::concat(workspace.nbytes(), " bytes"));
    }
    if (reinterpret_cast<std::uintptr_t>(workspace.data()) % 256 != 0) {
      fail_argument(ErrorCode::kInvalidArgument, "workspace", "a 256-byte aligned pointer",
                    "an address 256 does not divide");
    }
  }
  plan.workspace = workspace;
  if (t == 0) return;
  if (device.is_cpu()) {
    detail::run_prepared_on_host(plan);
  } else {
    detail::run_prepared_on_device(plan, stream);
  }
}

std::size_t moe_route_workspace_bytes(std::int64_t num_experts, std::int64_t hidden,
                                      std::int64_t top_k, std::int64_t max_tokens, Device device) {
  if (device.is_cpu()) return 0;
  if (max_tokens < 1) {
    fail_argument(ErrorCode::kInvalidArgument, "max_tokens", ">= 1", max_tokens);
  }
  return detail::device_route_workspace_bytes(num_experts, hidden, top_k, max_tokens);
}

void moe_route(const TensorView& x, const TensorView& router_weight, const TensorView& router_bias,
               std::int64_t top_k, const TensorView& topk_ids, const TensorView& topk_weights,
               const TensorView& workspace, std::int64_t max_tokens, void* stream) {
  const Device device = x.device();
  require_rank(x, "x", 2);
  require_rank(router_weight, "router_weight", 2);
  const std::int64_t t = x.size(0);
  const std::int64_t h = x.size(1);
  const std::int64_t e = router_weight.size(0);
  if (device.is_cuda()) {
    require_dtype(x, "x", DType::kBF16);
  } else if (x.dtype() != DType::kBF16 && x.dtype() != DType::kF32) {
    fail_argument(ErrorCode::kDtypeMismatch, "x", "bf16 (or f32 holding bf16 values, CPU)",
                  x.dtype());
  }
  (void)checked<void>(x, "x", x.dtype(), device, {t, h});
  (void)checked<void>(router_weight, "router_weight", DType::kBF16, device, {e, h});
  if (device.is_cuda()) {
    require_aligned(x.data(), "x", 16, kVectorLoads);
    require_aligned(router_weight.data(), "router_weight", 16, kVectorLoads);
  }
  const bool has_bias = detail::is_given(router_bias);
  if (has_bias) (void)checked<void>(router_bias, "router_bias", DType::kBF16, device, {e});
  if (top_k < 1 || top_k > e) {
    fail_argument(ErrorCode::kInvalidArgument, "top_k",
                  mxq::detail::concat("1 .. the router's experts (", e, ")"), top_k);
  }
  (void)checked<void>(topk_ids, "topk_ids", DType::kI32, device, {t, top_k});
  (void)checked<void>(topk_weights, "topk_weights", DType::kF32, device, {t, top_k});
  if (device.is_cpu()) {
    // The forward's reference router, on bf16 values; a row that is not finite routes nowhere.
    Tensor xs = Tensor::empty(DType::kF32, {t, h});
    std::vector<std::uint8_t> finite(static_cast<std::size_t>(t), 1);
    for (std::int64_t i = 0; i < t * h; ++i) {
      const float v = x.dtype() == DType::kF32
                          ? round_to_bf16(static_cast<const float*>(x.data())[i])
                          : bf16_to_float(static_cast<const std::uint16_t*>(x.data())[i]);
      xs.data_as<float>()[i] = v;
      if (!std::isfinite(v)) finite[static_cast<std::size_t>(i / h)] = 0;
    }
    const Routing routing = route_topk_softmax(xs, finite.data(), router_weight,
                                               has_bias ? router_bias : TensorView(), top_k);
    std::memcpy(topk_ids.data(), routing.ids.data(), routing.ids.nbytes());
    std::memcpy(topk_weights.data(), routing.weights.data(), routing.weights.nbytes());
    return;
  }
  detail::RoutePlan plan{x,        router_weight, has_bias ? router_bias : TensorView(),
                         e,        top_k,         max_tokens == 0 ? t : max_tokens,
                         topk_ids, topk_weights,  workspace};
  if (t > plan.max_tokens) {
    fail_argument(ErrorCode::kOutOfRange, "x",
                  mxq::detail::concat("at most max_tokens = ", plan.max_tokens, " tokens"), t);
  }
  const std::size_t need = detail::device_route_workspace_bytes(e, h, top_k, plan.max_tokens);
  require_dtype(workspace, "workspace", DType::kU8);
  require_device(workspace, "workspace", device);
  if (workspace.nbytes() < need) {
    fail_argument(ErrorCode::kInvalidArgument, "workspace",
                  mxq::detail::concat("at least moe_route_workspace_bytes = ", need, " bytes"),
                  mxq::detail::concat(workspace.nbytes(), " bytes"));
  }
  if (t == 0) return;
  detail::route_on_device(plan, stream);
}

}  // namespace mxq::moe
