#include "mxq/moe/routing.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "moe/cpu/dot.h"
#include "mxq/core/error.h"
#include "mxq/core/parallel.h"
#include "mxq/formats/bf16.h"

namespace mxq::moe {
namespace {

std::vector<double> bf16_to_double(const TensorView& view) {
  std::vector<double> out(static_cast<std::size_t>(view.numel()));
  const auto* bits = reinterpret_cast<const std::uint16_t*>(view.data());
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = bf16_to_float(bits[i]);
  return out;
}

// a before b when a's logit is larger; ties: lower index; NaN after every number.
bool ranks_before(float logit_a, std::int64_t a, float logit_b, std::int64_t b) {
  const bool nan_a = std::isnan(logit_a);
  const bool nan_b = std::isnan(logit_b);
  if (nan_a != nan_b) return nan_b;
  if (!nan_a && logit_a != logit_b) return logit_a > logit_b;
  return a < b;
}

}  // namespace

Routing route_topk_softmax(const TensorView& x, const std::uint8_t* finite_rows,
                           const TensorView& router_weight, const TensorView& router_bias,
                           std::int64_t top_k) {
  // A host function: a device view would be read on the host.
  require_rank(x, "x", 2);
  require_dtype(x, "x", DType::kF32);
  require_device(x, "x", Device::cpu());
  require_contiguous(x, "x");
  require_rank(router_weight, "router_weight", 2);
  const std::int64_t tokens = x.size(0);
  const std::int64_t hidden = x.size(1);
  const std::int64_t experts = router_weight.size(0);
  require_dtype(router_weight, "router_weight", DType::kBF16);
  require_shape(router_weight, "router_weight", {experts, hidden});
  require_device(router_weight, "router_weight", Device::cpu());
  require_contiguous(router_weight, "router_weight");
  if (router_bias.data() != nullptr) {
    require_dtype(router_bias, "router_bias", DType::kBF16);
    require_shape(router_bias, "router_bias", {experts});
    require_device(router_bias, "router_bias", Device::cpu());
  }
  if (finite_rows == nullptr && tokens > 0) {
    fail_argument(ErrorCode::kInvalidArgument, "finite_rows",
                  detail::concat(tokens, " bytes (1 for a finite input row)"), "a null pointer");
  }
  if (top_k < 1 || top_k > experts) {
    fail_argument(ErrorCode::kInvalidArgument, "top_k", detail::concat("in [1, ", experts, "]"),
                  top_k);
  }
  const std::vector<double> weight = bf16_to_double(router_weight);
  std::vector<double> bias(static_cast<std::size_t>(experts), 0.0);
  if (router_bias.data() != nullptr) bias = bf16_to_double(router_bias);

  Routing routing;
  routing.ids = Tensor::empty(DType::kI32, {tokens, top_k});
  routing.weights = Tensor::empty(DType::kF32, {tokens, top_k});
  auto* ids = routing.ids.data_as<std::int32_t>();
  auto* weights = routing.weights.data_as<float>();
  const auto* xs = x.data_as<float>();
  parallel_for(tokens, 16, [&](std::int64_t begin, std::int64_t end) {
    std::vector<double> row(static_cast<std::size_t>(hidden));
    std::vector<float> logits(static_cast<std::size_t>(experts));
    std::vector<std::int64_t> order(static_cast<std::size_t>(experts));
    for (std::int64_t t = begin; t < end; ++t) {
      std::int32_t* slot_ids = ids + t * top_k;
      float* slot_weights = weights + t * top_k;
      if (finite_rows[t] == 0) {
        std::fill(slot_ids, slot_ids + top_k, -1);
        std::fill(slot_weights, slot_weights + top_k, std::numeric_limits<float>::quiet_NaN());
        continue;
      }
      for (std::int64_t h = 0; h < hidden; ++h)
        row[static_cast<std::size_t>(h)] = xs[t * hidden + h];
      for (std::int64_t e = 0; e < experts; ++e) {
        const double sum = cpu::dot_fp64(row.data(), weight.data() + e * hidden, hidden);
        logits[static_cast<std::size_t>(e)] =
            static_cast<float>(sum + bias[static_cast<std::size_t>(e)]);
      }
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(order.begin(), order.begin() + top_k, order.end(),
                        [&](std::int64_t a, std::int64_t b) {
                          return ranks_before(logits[static_cast<std::size_t>(a)], a,
                                              logits[static_cast<std::size_t>(b)], b);
                        });
      const double top = logits[static_cast<std::size_t>(order[0])];
      double total = 0.0;
      std::vector<double> exps(static_cast<std::size_t>(top_k));
      for (std::int64_t k = 0; k < top_k; ++k) {
        exps[static_cast<std::size_t>(k)] =
            std::exp(static_cast<double>(
                         logits[static_cast<std::size_t>(order[static_cast<std::size_t>(k)])]) -
                     top);
        total += exps[static_cast<std::size_t>(k)];
      }
      for (std::int64_t k = 0; k < top_k; ++k) {
        slot_ids[k] = static_cast<std::int32_t>(order[static_cast<std::size_t>(k)]);
        slot_weights[k] = static_cast<float>(exps[static_cast<std::size_t>(k)] / total);
      }
    }
  });
  return routing;
}

void validate_routing(const Routing& routing, std::int64_t tokens, std::int64_t top_k,
                      std::int64_t num_experts) {
  require_dtype(routing.ids, "routing.ids", DType::kI32);
  require_dtype(routing.weights, "routing.weights", DType::kF32);
  require_shape(routing.ids, "routing.ids", {tokens, top_k});
  require_shape(routing.weights, "routing.weights", {tokens, top_k});
  require_device(routing.ids, "routing.ids", Device::cpu());
  require_device(routing.weights, "routing.weights", Device::cpu());
  const auto* ids = routing.ids.data_as<std::int32_t>();
  for (std::int64_t i = 0; i < tokens * top_k; ++i) {
    if (ids[i] < -1 || ids[i] >= num_experts) {
      fail_argument(ErrorCode::kOutOfRange,
                    detail::concat("routing.ids[", i / top_k, ", ", i % top_k, "]"),
                    detail::concat("an expert in [0, ", num_experts, ") or -1"), ids[i]);
    }
  }
}

}  // namespace mxq::moe
