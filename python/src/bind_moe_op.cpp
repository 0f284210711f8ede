// The engine-facing MoE op (mxq/moe/mxfp4_moe.h) for mxq.torch_ops: stateless functions on the
// caller's arrays (torch tensors through DLPack, host or CUDA), no copies; the layer's shape, the
// rank and the options as plain values.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>

#include "array_bridge.h"
#include "bindings.h"
#include "mxq/moe/checkpoint.h"
#include "mxq/moe/checkpoint_experts.h"
#include "mxq/moe/mxfp4_moe.h"

namespace mxq::python {
namespace {

// (num_experts, hidden_size, intermediate_size, has_bias)
using LayerArg = std::tuple<std::int64_t, std::int64_t, std::int64_t, bool>;
// (tp_rank, tp_size, ep_rank, ep_size, alignment, activation_quant)
using RankArg = std::tuple<int, int, int, int, std::int64_t, std::string>;

moe::MoeLayerShape layer_arg(const LayerArg& l) {
  return {std::get<0>(l), std::get<1>(l), std::get<2>(l), std::get<3>(l)};
}

moe::MoeRank rank_arg(const RankArg& r) {
  moe::MoeRank rank{std::get<0>(r), std::get<1>(r), std::get<2>(r), std::get<3>(r)};
  rank.alignment = std::get<4>(r);
  rank.activation_quant = moe::parse_activation_quant(std::get<5>(r), "activation_quant");
  return rank;
}

// An optional array (None: absent).
ArrayArg optional_arg(nb::handle array, std::string_view name, const ArrayRequirements& req) {
  if (array.is_none()) return {};
  return array_arg(array, name, req);
}

const ArrayRequirements kAny{{}, -1, true, false};

nb::tuple shape_tuple(const Shape& shape) {
  nb::list out;
  for (const std::int64_t d : shape.dims()) out.append(d);
  return nb::tuple(out);
}

}  // namespace

void bind_moe_op(nb::module_& m) {
  m.def(
      "moe_prepared_shapes",
      [](const LayerArg& layer, const RankArg& rank) {
        const moe::PreparedMoeShapes s = moe::prepared_moe_shapes(layer_arg(layer), rank_arg(rank));
        nb::dict d;
        d["w13"] = shape_tuple(s.w13);
        d["w13_scale"] = shape_tuple(s.w13_scale);
        d["w13_bias"] = shape_tuple(s.w13_bias);
        d["w2"] = shape_tuple(s.w2);
        d["w2_scale"] = shape_tuple(s.w2_scale);
        d["w2_bias"] = shape_tuple(s.w2_bias);
        d["intermediate_size_per_partition"] = s.intermediate_size_per_partition;
        d["intermediate_size_per_partition_after_pad"] =
            s.intermediate_size_per_partition_after_pad;
        d["intermediate_valid"] = s.tp.valid;
        d["intermediate_begin"] = s.tp.begin;
        d["first_local_expert"] = s.ep.begin;
        d["experts_local"] = s.ep.count;
        return d;
      },
      nb::arg("layer"), nb::arg("rank"),
      "Shapes of a rank's prepared tensors and its shards (mxq::moe::prepared_moe_shapes).");

  m.def(
      "moe_prepare",
      [](const std::string& layout, nb::handle w13, nb::handle w13_scale, nb::handle w13_bias,
         nb::handle w2, nb::handle w2_scale, nb::handle w2_bias, nb::handle out_w13,
         nb::handle out_w13_scale, nb::handle out_w13_bias, nb::handle out_w2,
         nb::handle out_w2_scale, nb::handle out_w2_bias, const LayerArg& layer,
         const RankArg& rank, std::uintptr_t stream) {
        const auto parsed = moe::layout_from_name(layout);
        if (!parsed) {
          fail_argument(ErrorCode::kInvalidArgument, "layout", "\"gpt-oss\" or \"native\"",
                        "\"" + layout + "\"");
        }
        const ArrayArg in[6] = {array_arg(w13, "w13", kAny),
                                array_arg(w13_scale, "w13_scale", kAny),
                                optional_arg(w13_bias, "w13_bias", kAny),
                                array_arg(w2, "w2", kAny),
                                array_arg(w2_scale, "w2_scale", kAny),
                                optional_arg(w2_bias, "w2_bias", kAny)};
        const ArrayArg out[6] = {array_arg(out_w13, "out_w13", kAny),
                                 array_arg(out_w13_scale, "out_w13_scale", kAny),
                                 optional_arg(out_w13_bias, "out_w13_bias", kAny),
                                 array_arg(out_w2, "out_w2", kAny),
                                 array_arg(out_w2_scale, "out_w2_scale", kAny),
                                 optional_arg(out_w2_bias, "out_w2_bias", kAny)};
        const moe::MoeExpertTensors experts{*parsed,    in[0].view, in[1].view, in[2].view,
                                            in[3].view, in[4].view, in[5].view};
        const moe::PreparedMoe prepared{out[0].view, out[1].view, out[2].view,
                                        out[3].view, out[4].view, out[5].view};
        const nb::gil_scoped_release release;
        moe::prepare_mxfp4_moe(experts, layer_arg(layer), rank_arg(rank), prepared,
                               stream_arg(stream));
      },
      nb::arg("layout"), nb::arg("w13"), nb::arg("w13_scale"), nb::arg("w13_bias").none(),
      nb::arg("w2"), nb::arg("w2_scale"), nb::arg("w2_bias").none(), nb::arg("out_w13"),
      nb::arg("out_w13_scale"), nb::arg("out_w13_bias").none(), nb::arg("out_w2"),
      nb::arg("out_w2_scale"), nb::arg("out_w2_bias").none(), nb::arg("layer"), nb::arg("rank"),
      nb::arg("stream") = 0, "mxq::moe::prepare_mxfp4_moe into the out_* arrays.");

  m.def(
      "moe_workspace_bytes",
      [](const LayerArg& layer, const RankArg& rank, std::int64_t top_k, std::int64_t max_tokens,
         bool cuda) {
        moe::Mxfp4MoeOptions options;
        options.top_k = top_k;
        options.max_tokens = max_tokens;
        return moe::mxfp4_moe_workspace_bytes(layer_arg(layer), rank_arg(rank), options,
                                              cuda ? Device::cuda() : Device::cpu());
      },
      nb::arg("layer"), nb::arg("rank"), nb::arg("top_k"), nb::arg("max_tokens"), nb::arg("cuda"));

  m.def(
      "mxfp4_moe",
      [](nb::handle x, nb::handle w13, nb::handle w13_scale, nb::handle w13_bias, nb::handle w2,
         nb::handle w2_scale, nb::handle w2_bias, nb::handle topk_ids, nb::handle topk_weights,
         nb::handle router_weight, nb::handle router_bias, nb::handle out, nb::handle workspace,
         const LayerArg& layer, const RankArg& rank, std::int64_t top_k,
         const std::string& activation, double swiglu_alpha, double swiglu_limit,
         bool add_down_bias, std::int64_t max_tokens, const std::string& gemm,
         std::uintptr_t stream) {
        const ArrayArg a[13] = {array_arg(x, "x", kAny),
                                array_arg(w13, "w13", kAny),
                                array_arg(w13_scale, "w13_scale", kAny),
                                optional_arg(w13_bias, "w13_bias", kAny),
                                array_arg(w2, "w2", kAny),
                                array_arg(w2_scale, "w2_scale", kAny),
                                optional_arg(w2_bias, "w2_bias", kAny),
                                optional_arg(topk_ids, "topk_ids", kAny),
                                optional_arg(topk_weights, "topk_weights", kAny),
                                optional_arg(router_weight, "router_weight", kAny),
                                optional_arg(router_bias, "router_bias", kAny),
                                array_arg(out, "out", kAny),
                                optional_arg(workspace, "workspace", kAny)};
        moe::Mxfp4MoeOptions options;
        options.top_k = top_k;
        options.activation = moe::parse_activation(activation, "activation");
        options.swiglu_alpha = swiglu_alpha;
        options.swiglu_limit = swiglu_limit;
        options.add_down_bias = add_down_bias;
        options.max_tokens = max_tokens;
        const auto variant = moe::gpu::gemm_variant_from_string(gemm);
        if (!variant) {
          fail_argument(ErrorCode::kInvalidArgument, "gemm",
                        "\"auto\", \"decode_mma\" or \"prefill_wgmma\"", "\"" + gemm + "\"");
        }
        options.gemm = *variant;
        const moe::PreparedMoe prepared{a[1].view, a[2].view, a[3].view,
                                        a[4].view, a[5].view, a[6].view};
        const moe::MoeRouting routing{a[7].view, a[8].view, a[9].view, a[10].view};
        const nb::gil_scoped_release release;
        moe::mxfp4_moe(a[0].view, prepared, layer_arg(layer), rank_arg(rank), routing, options,
                       a[11].view, a[12].view, stream_arg(stream));
      },
      nb::arg("x"), nb::arg("w13"), nb::arg("w13_scale"), nb::arg("w13_bias").none(), nb::arg("w2"),
      nb::arg("w2_scale"), nb::arg("w2_bias").none(), nb::arg("topk_ids").none(),
      nb::arg("topk_weights").none(), nb::arg("router_weight").none(),
      nb::arg("router_bias").none(), nb::arg("out"), nb::arg("workspace").none(), nb::arg("layer"),
      nb::arg("rank"), nb::arg("top_k"), nb::arg("activation"), nb::arg("swiglu_alpha"),
      nb::arg("swiglu_limit"), nb::arg("add_down_bias"), nb::arg("max_tokens"), nb::arg("gemm"),
      nb::arg("stream") = 0, "mxq::moe::mxfp4_moe into `out`.");

  m.def(
      "moe_route_workspace_bytes",
      [](std::int64_t num_experts, std::int64_t hidden, std::int64_t top_k, std::int64_t max_tokens,
         bool cuda) {
        return moe::moe_route_workspace_bytes(num_experts, hidden, top_k, max_tokens,
                                              cuda ? Device::cuda() : Device::cpu());
      },
      nb::arg("num_experts"), nb::arg("hidden"), nb::arg("top_k"), nb::arg("max_tokens"),
      nb::arg("cuda"));

  m.def(
      "moe_route",
      [](nb::handle x, nb::handle router_weight, nb::handle router_bias, std::int64_t top_k,
         nb::handle topk_ids, nb::handle topk_weights, nb::handle workspace,
         std::int64_t max_tokens, std::uintptr_t stream) {
        const ArrayArg a[6] = {array_arg(x, "x", kAny),
                               array_arg(router_weight, "router_weight", kAny),
                               optional_arg(router_bias, "router_bias", kAny),
                               array_arg(topk_ids, "topk_ids", kAny),
                               array_arg(topk_weights, "topk_weights", kAny),
                               optional_arg(workspace, "workspace", kAny)};
        const nb::gil_scoped_release release;
        moe::moe_route(a[0].view, a[1].view, a[2].view, top_k, a[3].view, a[4].view, a[5].view,
                       max_tokens, stream_arg(stream));
      },
      nb::arg("x"), nb::arg("router_weight"), nb::arg("router_bias").none(), nb::arg("top_k"),
      nb::arg("topk_ids"), nb::arg("topk_weights"), nb::arg("workspace").none(),
      nb::arg("max_tokens") = 0, nb::arg("stream") = 0, "mxq::moe::moe_route into the arrays.");
  m.def(
      "moe_checkpoint_experts",
      [](const std::string& path, std::int64_t layer, std::optional<std::int64_t> top_k) {
        moe::CheckpointExperts read;
        {
          const nb::gil_scoped_release release;
          moe::MoeConfigOverrides overrides;
          overrides.top_k = top_k;
          read = moe::read_checkpoint_experts(moe::MoeCheckpoint::open(path), layer, overrides);
        }
        nb::dict d;
        d["config"] = config_dict(read.config);
        d["layout"] = std::string(moe::to_string(read.layout));
        const auto put = [&](const char* name, const Tensor& t) {
          d[name] = t.data() == nullptr ? nb::none() : to_numpy(t);
        };
        put("w13", read.w13);
        put("w13_scale", read.w13_scale);
        put("w13_bias", read.w13_bias);
        put("w2", read.w2);
        put("w2_scale", read.w2_scale);
        put("w2_bias", read.w2_bias);
        put("router_weight", read.router_weight);
        put("router_bias", read.router_bias);
        return d;
      },
      nb::arg("path"), nb::arg("layer") = 0, nb::arg("top_k") = nb::none(),
      "One layer's expert and router tensors (host NumPy arrays) and its config "
      "(mxq::moe::read_checkpoint_experts).");
}

}  // namespace mxq::python
