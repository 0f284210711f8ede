// mxq.MoELayer's core: mxq::moe::MoeLayer (every rank of a TP x EP grid simulated in one object).
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <optional>
#include <sstream>
#include <string>

#include "array_bridge.h"
#include "bindings.h"
#include "moe_layer_type.h"
#include "mxq/moe/checkpoint.h"
#include "mxq/moe/footprint.h"
#include "mxq/moe/layer.h"
#include "mxq/tune/autotuner.h"

namespace mxq::python {
namespace {

using moe::MoeLayer;

nb::dict padding_dict(const moe::PaddingSummary& s) {
  nb::dict d;
  d["intermediate_size"] = s.intermediate_size;
  d["tp_size"] = s.tp_size;
  d["before"] = s.before;
  d["after"] = s.after;
  d["wasted_fraction"] = s.wasted_fraction();
  d["message"] = s.message();
  return d;
}

const MoeLayer& checked_rank_layer(const MoeLayer& layer, int rank) {
  if (rank < 0 || rank >= layer.num_ranks()) {
    fail_argument(ErrorCode::kOutOfRange, "rank",
                  detail::concat("a rank id in [0, ", layer.num_ranks(), ")"), rank);
  }
  return layer;
}

moe::MoeParam param_from_name(const std::string& text) {
  for (moe::MoeParam p : moe::kAllMoeParams) {
    if (moe::to_string(p) == text) return p;
  }
  std::ostringstream names;
  for (moe::MoeParam p : moe::kAllMoeParams) names << " " << moe::to_string(p);
  fail_argument(ErrorCode::kInvalidArgument, "param", "one of" + names.str(), text);
}

}  // namespace

nb::dict config_dict(const moe::MoeConfig& c) {
  nb::dict d;
  d["hidden_size"] = c.hidden_size;
  d["intermediate_size"] = c.intermediate_size;
  d["num_experts"] = c.num_experts;
  d["top_k"] = c.top_k;
  d["swiglu_limit"] = c.swiglu_limit;
  d["swiglu_alpha"] = c.swiglu_alpha;
  d["activation"] = std::string(moe::to_string(c.activation));
  d["activation_quant"] = std::string(moe::to_string(c.activation_quant));
  d["has_bias"] = c.has_bias;
  d["router"] = std::string(moe::to_string(c.router));
  d["num_layers"] = c.num_layers;
  return d;
}

void bind_moe(nb::module_& m) {
  nb::class_<MoeLayer>(m, "MoeLayer", "mxq::moe::MoeLayer (all ranks of a TP x EP grid)")
      .def_static(
          "from_checkpoint",
          [](const std::string& path, std::int64_t layer, int tp_size, int ep_size,
             std::int64_t intermediate_per_rank, std::optional<std::int64_t> top_k,
             std::optional<std::string> activation, std::optional<std::string> activation_quant,
             std::int64_t align) {
            nb::gil_scoped_release release;
            const moe::MoeCheckpoint checkpoint = moe::MoeCheckpoint::open(path);
            moe::MoeConfigOverrides overrides;
            overrides.top_k = top_k;
            if (activation) overrides.activation = moe::parse_activation(*activation, "activation");
            if (activation_quant) {
              overrides.activation_quant =
                  moe::parse_activation_quant(*activation_quant, "activation_quant");
            }
            const moe::MoeConfig config = checkpoint.resolve_config(layer, overrides);
            moe::ShardOptions shards;
            shards.tp_size = tp_size;
            shards.ep_size = ep_size;
            shards.intermediate_per_rank = intermediate_per_rank;
            // The sizes, the padding the caller asks next (mxq.MoELayer's `align`) included,
            // against the layer and the machine before anything is allocated.
            moe::check_layer_request(config, shards, align,
                                     {"tp_size", "ep_size", "intermediate_per_rank", "align"});
            return MoeLayer::load(checkpoint, layer, config, shards);
          },
          nb::arg("path"), nb::arg("layer") = 0, nb::arg("tp_size") = 1, nb::arg("ep_size") = 1,
          nb::arg("intermediate_per_rank") = 0, nb::arg("top_k") = nb::none(),
          nb::arg("activation") = nb::none(), nb::arg("activation_quant") = nb::none(),
          nb::arg("align") = 0)
      .def_prop_ro("config", [](const MoeLayer& l) { return config_dict(l.config()); })
      .def_prop_ro("layer_index", &MoeLayer::layer_index)
      .def_prop_ro("tp_size", [](const MoeLayer& l) { return l.shards().tp_size; })
      .def_prop_ro("ep_size", [](const MoeLayer& l) { return l.shards().ep_size; })
      .def_prop_ro("num_ranks", &MoeLayer::num_ranks)
      .def_prop_ro("intermediate_size_per_partition", &MoeLayer::intermediate_size_per_partition)
      .def_prop_ro("intermediate_size_per_partition_after_pad",
                   &MoeLayer::intermediate_size_per_partition_after_pad)
      .def_prop_ro("prepared", &MoeLayer::prepared)
      .def_prop_ro("updating", &MoeLayer::updating)
      .def_prop_ro("padding_summary",
                   [](const MoeLayer& l) { return padding_dict(l.padding_summary()); })
      .def(
          "prepare",
          [](MoeLayer& l, std::int64_t alignment) {
            moe::PaddingSummary summary;
            {
              nb::gil_scoped_release release;
              summary = l.prepare(alignment);
            }
            return padding_dict(summary);
          },
          nb::arg("alignment") = moe::kDefaultAlignment)
      .def("restore_checkpoint_layout", &MoeLayer::restore_checkpoint_layout,
           nb::call_guard<nb::gil_scoped_release>())
      .def(
          "forward",
          [](const MoeLayer& l, nb::handle x, nb::handle ids, nb::handle weights,
             const tune::Autotuner* tuner) {
            const ArrayArg xa = array_arg(x, "x", {{DType::kF32, DType::kBF16}, 2, true, true});
            std::optional<moe::Routing> routing;
            if (!ids.is_none() || !weights.is_none()) {
              if (ids.is_none() || weights.is_none()) {
                fail(ErrorCode::kInvalidArgument,
                     "expert_ids and expert_weights: give both or neither (found only one)");
              }
              const ArrayArg ia = array_arg(ids, "expert_ids", {{DType::kI32}, 2, true, true});
              const ArrayArg wa =
                  array_arg(weights, "expert_weights", {{DType::kF32}, 2, true, true});
              // The C++ Routing owns its tensors: copy the two small [T, K] arrays.
              routing = moe::Routing{Tensor::empty(DType::kI32, ia.view.shape()),
                                     Tensor::empty(DType::kF32, wa.view.shape())};
              std::memcpy(routing->ids.data(), ia.view.data(), ia.view.nbytes());
              std::memcpy(routing->weights.data(), wa.view.data(), wa.view.nbytes());
            }
            moe::MoeForwardResult r;
            {
              nb::gil_scoped_release release;
              r = l.forward(xa.view, routing ? &*routing : nullptr, tuner);
            }
            nb::dict d;
            d["output"] = to_numpy(std::move(r.output));
            d["accumulator"] = to_numpy(std::move(r.accumulator));
            d["magnitude"] = to_numpy(std::move(r.magnitude));
            d["expert_ids"] = to_numpy(std::move(r.routing.ids));
            d["expert_weights"] = to_numpy(std::move(r.routing.weights));
            d["routing_seconds"] = r.routing_seconds;
            d["rank_seconds"] = r.rank_seconds;
            d["total_seconds"] = r.total_seconds;
            d["rank_tactics"] = r.rank_tactics;
            d["rank_tactics_from_cache"] = std::vector<bool>(r.rank_tactics_from_cache.begin(),
                                                             r.rank_tactics_from_cache.end());
            return d;
          },
          nb::arg("x"), nb::arg("expert_ids") = nb::none(), nb::arg("expert_weights") = nb::none(),
          nb::arg("tuner").none() = nb::none(),
          "The CPU reference forward; `tuner` (a cpu Autotuner) picks each rank's expert tiling "
          "from its cache (bit-identical output).")
      .def(
          "tune_problem", [](const MoeLayer& l, int rank) { return l.tune_problem(rank); },
          nb::arg("rank"), "The autotuner's moe_expert_gemm key of rank `rank`.")
      .def("begin_update", &MoeLayer::begin_update)
      .def(
          "load",
          [](MoeLayer& l, const std::string& name, nb::handle tensor) {
            const ArrayArg a = array_arg(tensor, name, {{}, -1, true, true});
            nb::gil_scoped_release release;
            l.load(name, a.view);
          },
          nb::arg("name"), nb::arg("tensor"))
      .def("end_update", &MoeLayer::end_update, nb::call_guard<nb::gil_scoped_release>())
      .def(
          "rank_info",
          [](const MoeLayer& l, int rank) {
            const moe::MoeRankShape& s = checked_rank_layer(l, rank).rank(rank).shape();
            nb::dict d;
            d["tp_rank"] = s.tp.rank;
            d["tp_size"] = s.tp.size;
            d["ep_rank"] = s.ep.rank;
            d["ep_size"] = s.ep.size;
            d["intermediate_begin"] = s.tp.begin;
            d["intermediate_valid"] = s.tp.valid;
            d["intermediate_width"] = s.tp.width;
            d["expert_begin"] = s.ep.begin;
            d["experts_local"] = s.ep.count;
            d["intermediate_size_per_partition_after_pad"] =
                s.intermediate_size_per_partition_after_pad;
            d["alignment"] = s.alignment;
            return d;
          },
          nb::arg("rank"))
      .def(
          "rank_param",
          [](nb::handle self, int rank, const std::string& param) {
            const MoeLayer& l = nb::cast<const MoeLayer&>(self);
            const moe::MoeRankWeights& w = checked_rank_layer(l, rank).rank(rank);
            // A copy: the storage may move or change shape on prepare/restore/update, which a
            // view could not follow.
            return view_as_numpy(w.view(param_from_name(param)), self).attr("copy")();
          },
          nb::arg("rank"), nb::arg("param"),
          "A copy of one rank's parameter in the current layout.")
      .def(
          "rank_param_address",
          [](const MoeLayer& l, int rank, const std::string& param) {
            const moe::MoeRankWeights& w = checked_rank_layer(l, rank).rank(rank);
            return reinterpret_cast<std::uintptr_t>(w.view(param_from_name(param)).data());
          },
          nb::arg("rank"), nb::arg("param"),
          "Address of a parameter's storage (fixed across update sessions once prepared).");
}

}  // namespace mxq::python
