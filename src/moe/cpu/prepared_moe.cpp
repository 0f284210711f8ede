// The engine-facing MoE op on the host (mxfp4_moe_backend.h): preparation into the kernels'
// layout, and the reference forward over that layout (converted back to the checkpoint layout
// the reference reads, so the GPU kernels and the CPU reference share one prepared form).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "moe/cpu/expert_forward.h"
#include "moe/layout/mxfp4_device_layout.h"
#include "moe/layout/w4a8_layout.h"
#include "moe/mxfp4_moe_backend.h"
#include "mxq/core/error.h"
#include "mxq/core/parallel.h"
#include "mxq/formats/bf16.h"
#include "mxq/moe/routing.h"

namespace mxq::moe::detail {
namespace {

constexpr std::uint8_t kPadScale = 127;  // E8M0 1.0: padded channels never hold a zero/NaN scale

// One expert-range task per chunk of experts.
template <typename Body>
void for_each_expert(std::int64_t experts, Body&& body) {
  parallel_for(experts, 1, [&](std::int64_t e0, std::int64_t e1) {
    for (std::int64_t e = e0; e < e1; ++e) body(e);
  });
}

// The natural (checkpoint-layout) prepared rows: w13 gate rows [0, valid) and up rows
// [P, P + valid) from the input, zeros elsewhere; w2 columns [0, valid) from the input. Scales
// to the padded pitch (padding channels 1.0 inside the row's K/32, zeros past it).
void write_natural(const PreparePlan& plan) {
  const PreparedMoeShapes& s = plan.shapes;
  const ExpertSource& src = plan.source;
  const std::int64_t h = plan.hidden;
  const std::int64_t p = s.intermediate_size_per_partition_after_pad;
  const std::int64_t valid = s.tp.valid;
  const std::int64_t in = src.inter_in;
  const std::int64_t pitch1 = scale_pitch(h);
  const std::int64_t pitch2 = scale_pitch(p);
  for_each_expert(s.ep.count, [&](std::int64_t e) {
    const std::int64_t se = e + src.expert_offset;
    for (std::int64_t r = 0; r < 2 * p; ++r) {
      const std::int64_t out_row = e * 2 * p + r;
      std::uint8_t* w = plan.w13 + out_row * (h / 2);
      std::uint8_t* scale = plan.w13_scale + out_row * pitch1;
      const std::int64_t half = r / p;
      const std::int64_t c = r % p;
      std::fill(scale, scale + pitch1, std::uint8_t{0});
      if (c < valid) {
        const std::int64_t ci = src.channel_offset + c;
        const std::int64_t in_row =
            se * 2 * in + (src.interleaved ? 2 * ci + half : half * in + ci);
        std::memcpy(w, src.w13 + in_row * (h / 2), static_cast<std::size_t>(h / 2));
        std::memcpy(scale, src.w13_scale + in_row * (h / 32), static_cast<std::size_t>(h / 32));
        if (plan.w13_bias != nullptr) plan.w13_bias[out_row] = src.w13_bias[in_row];
      } else {
        std::fill(w, w + h / 2, std::uint8_t{0});
        std::fill(scale, scale + h / 32, kPadScale);
        if (plan.w13_bias != nullptr) plan.w13_bias[out_row] = 0;
      }
    }
    for (std::int64_t row = 0; row < h; ++row) {
      const std::int64_t out_row = e * h + row;
      const std::int64_t in_row = se * h + row;
      std::uint8_t* w = plan.w2 + out_row * (p / 2);
      std::uint8_t* scale = plan.w2_scale + out_row * pitch2;
      std::fill(w, w + p / 2, std::uint8_t{0});
      std::memcpy(w, src.w2 + in_row * (in / 2) + src.channel_offset / 2,
                  static_cast<std::size_t>(valid / 2));
      std::fill(scale, scale + pitch2, std::uint8_t{0});
      std::fill(scale, scale + p / 32, kPadScale);
      std::memcpy(scale, src.w2_scale + in_row * (in / 32) + src.channel_offset / 32,
                  static_cast<std::size_t>(valid / 32));
      if (plan.w2_bias != nullptr)
        plan.w2_bias[out_row] = plan.add_down_bias ? src.w2_bias[in_row] : 0;
    }
  });
}

// An expert's rows in a prepared tensor [E_local, rows, ...]: how many, and the K they hold.
struct ExpertRows {
  std::int64_t rows;
  std::int64_t k;
};

// The scale rows (`scale_pitch(k)` bytes each) of the `touched` experts -> [n, rows, k/32], the
// reference's layout.
std::vector<std::uint8_t> unpitched_experts(const std::uint8_t* scales, ExpertRows expert,
                                            const std::vector<std::int64_t>& touched) {
  const std::int64_t width = expert.k / 32;
  const std::int64_t pitch = scale_pitch(expert.k);
  std::vector<std::uint8_t> out(touched.size() * static_cast<std::size_t>(expert.rows * width));
  std::uint8_t* to = out.data();
  for (const std::int64_t e : touched) {
    const std::uint8_t* from = scales + e * expert.rows * pitch;
    for (std::int64_t r = 0; r < expert.rows; ++r, to += width) {
      std::memcpy(to, from + r * pitch, static_cast<std::size_t>(width));
    }
  }
  return out;
}

// The packed rows of the `touched` experts, from the prepared layout back to the checkpoint
// layout -> [n, rows, k/2]. An expert's rows are whole row groups (rows is a multiple of 16), so
// each converts on its own.
std::vector<std::uint8_t> natural_experts(const std::uint8_t* packed, ExpertRows expert,
                                          const std::vector<std::int64_t>& touched,
                                          ActivationQuant quant) {
  MXQ_CHECK(expert.rows % 16 == 0, ErrorCode::kInternal, "prepared experts of ", expert.rows,
            " rows are not whole row groups of 16");
  const auto bytes = static_cast<std::size_t>(expert.rows * expert.k / 2);
  std::vector<std::uint8_t> out(touched.size() * bytes);
  for (std::size_t i = 0; i < touched.size(); ++i) {
    const std::uint8_t* from = packed + static_cast<std::size_t>(touched[i]) * bytes;
    const auto rows = static_cast<std::size_t>(expert.rows);
    if (quant == ActivationQuant::kFp8Group128) {
      gpu::detail::from_w4a8_layout_host(from, out.data() + i * bytes, rows,
                                         static_cast<int>(expert.k));
    } else {
      gpu::detail::from_device_layout_host(from, out.data() + i * bytes, rows,
                                           static_cast<int>(expert.k));
    }
  }
  return out;
}

// The `width`-element bias rows of the `touched` experts -> [n, width].
std::vector<std::uint16_t> touched_rows(const std::uint16_t* rows, std::int64_t width,
                                        const std::vector<std::int64_t>& touched) {
  std::vector<std::uint16_t> out(touched.size() * static_cast<std::size_t>(width));
  for (std::size_t i = 0; i < touched.size(); ++i) {
    std::memcpy(out.data() + i * static_cast<std::size_t>(width), rows + touched[i] * width,
                static_cast<std::size_t>(width) * sizeof(std::uint16_t));
  }
  return out;
}

}  // namespace

void prepare_on_host(const PreparePlan& plan) {
  write_natural(plan);
  const PreparedMoeShapes& s = plan.shapes;
  const std::int64_t p = s.intermediate_size_per_partition_after_pad;
  const auto w13_rows = static_cast<std::size_t>(s.ep.count * 2 * p);
  const auto w2_rows = static_cast<std::size_t>(s.ep.count * plan.hidden);
  if (plan.activation_quant == ActivationQuant::kFp8Group128) {
    gpu::detail::to_w4a8_layout_host(plan.w13, w13_rows, static_cast<int>(plan.hidden));
    gpu::detail::to_w4a8_layout_host(plan.w2, w2_rows, static_cast<int>(p));
  } else {
    gpu::detail::to_device_layout_host(plan.w13, w13_rows, static_cast<int>(plan.hidden));
    gpu::detail::to_device_layout_host(plan.w2, w2_rows, static_cast<int>(p));
  }
}

void run_prepared_on_host(const ForwardPlan& plan) {
  const PreparedMoeShapes& s = plan.shapes;
  const std::int64_t h = plan.hidden;
  const std::int64_t p = s.intermediate_size_per_partition_after_pad;
  const std::int64_t t = plan.tokens;
  const std::int64_t top_k = plan.options.top_k;
  const std::int64_t e_local = s.ep.count;

  // x as bf16 values, and which rows are finite (a token with a NaN or Inf routes nowhere).
  Tensor x_bf16 = Tensor::empty(DType::kF32, {t, h});
  std::vector<double> x_f64(static_cast<std::size_t>(t * h));
  std::vector<std::uint8_t> finite(static_cast<std::size_t>(t), 1);
  auto* xs = x_bf16.data_as<float>();
  for (std::int64_t i = 0; i < t * h; ++i) {
    const float value = plan.x.dtype() == DType::kF32
                            ? round_to_bf16(static_cast<const float*>(plan.x.data())[i])
                            : bf16_to_float(static_cast<const std::uint16_t*>(plan.x.data())[i]);
    xs[i] = value;
    x_f64[static_cast<std::size_t>(i)] = value;
    if (!std::isfinite(value)) finite[static_cast<std::size_t>(i / h)] = 0;
  }

  Routing routing;
  if (is_given(plan.routing.topk_ids)) {
    routing.ids = Tensor::empty(DType::kI32, {t, top_k});
    routing.weights = Tensor::empty(DType::kF32, {t, top_k});
    std::memcpy(routing.ids.data(), plan.routing.topk_ids.data(), routing.ids.nbytes());
    std::memcpy(routing.weights.data(), plan.routing.topk_weights.data(), routing.weights.nbytes());
    validate_routing(routing, t, top_k, plan.num_experts);
    auto* ids = routing.ids.data_as<std::int32_t>();
    for (std::int64_t i = 0; i < t; ++i) {
      if (finite[static_cast<std::size_t>(i)] == 0)
        std::fill(ids + i * top_k, ids + (i + 1) * top_k, -1);
    }
  } else {
    routing = route_topk_softmax(x_bf16, finite.data(), plan.routing.router_weight,
                                 plan.routing.router_bias, top_k);
  }

  // The experts this call routes to on this rank, in increasing order, and each slot's index
  // among them (-1: dropped, or another rank's expert): only their prepared weights go back to
  // the layout the reference reads, so a call costs its tokens' work, not the rank's whole
  // weights (a decode step touches top_k experts of E).
  const std::int64_t slots = t * top_k;
  const auto* global_ids = routing.ids.data_as<std::int32_t>();
  std::vector<std::int64_t> compact_of(static_cast<std::size_t>(e_local), -1);
  for (std::int64_t i = 0; i < slots; ++i) {
    const std::int64_t e = static_cast<std::int64_t>(global_ids[i]) - s.ep.begin;
    if (global_ids[i] >= 0 && e >= 0 && e < e_local) compact_of[static_cast<std::size_t>(e)] = 0;
  }
  std::vector<std::int64_t> touched;
  for (std::int64_t e = 0; e < e_local; ++e) {
    if (compact_of[static_cast<std::size_t>(e)] < 0) continue;
    compact_of[static_cast<std::size_t>(e)] = static_cast<std::int64_t>(touched.size());
    touched.push_back(e);
  }
  std::vector<std::int32_t> compact_ids(static_cast<std::size_t>(slots), -1);
  for (std::int64_t i = 0; i < slots; ++i) {
    const std::int64_t e = static_cast<std::int64_t>(global_ids[i]) - s.ep.begin;
    if (global_ids[i] >= 0 && e >= 0 && e < e_local) {
      compact_ids[static_cast<std::size_t>(i)] =
          static_cast<std::int32_t>(compact_of[static_cast<std::size_t>(e)]);
    }
  }
  const ExpertRows w13_rows{2 * p, h};  // an expert's rows and their K
  const ExpertRows w2_rows{h, p};
  const std::vector<std::uint8_t> w13 =
      natural_experts(static_cast<const std::uint8_t*>(plan.prepared.w13.data()), w13_rows, touched,
                      plan.activation_quant);
  const std::vector<std::uint8_t> w13_scale = unpitched_experts(
      static_cast<const std::uint8_t*>(plan.prepared.w13_scale.data()), w13_rows, touched);
  const std::vector<std::uint8_t> w2 =
      natural_experts(static_cast<const std::uint8_t*>(plan.prepared.w2.data()), w2_rows, touched,
                      plan.activation_quant);
  const std::vector<std::uint8_t> w2_scale = unpitched_experts(
      static_cast<const std::uint8_t*>(plan.prepared.w2_scale.data()), w2_rows, touched);
  std::vector<std::uint16_t> w13_bias;
  std::vector<std::uint16_t> w2_bias;
  cpu::RankWeightsView view;
  view.hidden = h;
  view.width = p;
  view.experts_local = static_cast<std::int64_t>(touched.size());
  view.first_expert = 0;  // compact_ids index the touched experts
  view.w13 = w13.data();
  view.w13_scale = w13_scale.data();
  view.w2 = w2.data();
  view.w2_scale = w2_scale.data();
  if (plan.has_bias) {
    w13_bias = touched_rows(static_cast<const std::uint16_t*>(plan.prepared.w13_bias.data()), 2 * p,
                            touched);
    view.w13_bias = w13_bias.data();
    if (plan.options.add_down_bias) {
      w2_bias =
          touched_rows(static_cast<const std::uint16_t*>(plan.prepared.w2_bias.data()), h, touched);
      view.w2_bias = w2_bias.data();
    }
  }
  MoeConfig config;
  config.hidden_size = h;
  config.num_experts = plan.num_experts;
  config.top_k = top_k;
  config.activation = plan.options.activation;
  config.swiglu_alpha = plan.options.swiglu_alpha;
  config.swiglu_limit = plan.options.swiglu_limit;
  config.activation_quant = plan.activation_quant;

  cpu::RankForwardInput input;
  input.x = x_f64.data();
  input.tokens = t;
  input.ids = compact_ids.data();
  input.weights = routing.weights.data_as<float>();
  input.top_k = top_k;
  std::vector<float> partial(static_cast<std::size_t>(t * h));
  std::vector<float> magnitude(static_cast<std::size_t>(t * h), 0.0F);
  cpu::rank_expert_forward(view, config, input, partial.data(), magnitude.data());
  // As the layer: a token whose input row is not finite routes nowhere and its output row is
  // NaN (on every rank, so the summed partials keep it NaN).
  for (std::int64_t i = 0; i < t; ++i) {
    if (finite[static_cast<std::size_t>(i)] != 0) continue;
    std::fill(partial.begin() + i * h, partial.begin() + (i + 1) * h,
              std::numeric_limits<float>::quiet_NaN());
  }
  if (plan.out.dtype() == DType::kF32) {
    std::memcpy(plan.out.data(), partial.data(), partial.size() * sizeof(float));
  } else {
    auto* out = static_cast<std::uint16_t*>(plan.out.data());
    for (std::size_t i = 0; i < partial.size(); ++i) out[i] = float_to_bf16(partial[i]);
  }
}

}  // namespace mxq::moe::detail
