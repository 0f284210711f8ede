#include "moe/cpu/expert_forward.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "moe/cpu/fp8_groups.h"
#include "moe/cpu/mxfp4_gemv.h"
#include "mxq/core/error.h"
#include "mxq/core/parallel.h"
#include "mxq/formats/bf16.h"
#include "mxq/moe/activation.h"

namespace mxq::moe::cpu {
namespace {

// Tiles (ExpertTiling): each weight row is decoded once per tile of routed (token, slot) pairs; a
// task is one expert and a tile of rows, so threads never write the same output.

// parallel_for with an explicit thread cap (0 = num_threads()): chunks of [0, n), at least
// `grain` each, run on at most `threads` threads.
template <typename Body>
void run_chunks(std::int64_t n, std::int64_t grain, int threads, Body&& body) {
  if (n <= 0) return;
  const std::int64_t cap = threads > 0 ? threads : num_threads();
  const std::int64_t chunks = std::min<std::int64_t>(cap, std::max<std::int64_t>(1, n / grain));
  if (chunks <= 1) {
    body(std::int64_t{0}, n);
    return;
  }
  parallel_for(chunks, 1, [&](std::int64_t c0, std::int64_t c1) {
    for (std::int64_t c = c0; c < c1; ++c) body(n * c / chunks, n * (c + 1) / chunks);
  });
}

// The routed (token, slot) pairs of one rank, grouped by local expert (token order within).
struct ExpertGroups {
  std::vector<std::int64_t> token;    // pair -> token
  std::vector<std::int64_t> begin;    // local expert -> first pair (size E_local + 1)
  std::vector<std::int64_t> pair_of;  // token * top_k + slot -> pair, or -1
};

ExpertGroups group_pairs(const RankWeightsView& weights, const RankForwardInput& input) {
  const std::int64_t experts = weights.experts_local;
  const std::int64_t slots = input.tokens * input.top_k;
  ExpertGroups groups;
  groups.begin.assign(static_cast<std::size_t>(experts + 1), 0);
  groups.pair_of.assign(static_cast<std::size_t>(slots), -1);
  const auto local = [&](std::int64_t s) { return input.ids[s] - weights.first_expert; };
  for (std::int64_t s = 0; s < slots; ++s) {
    const std::int64_t e = local(s);
    if (input.ids[s] >= 0 && e >= 0 && e < experts) ++groups.begin[static_cast<std::size_t>(e + 1)];
  }
  for (std::int64_t e = 0; e < experts; ++e) {
    groups.begin[static_cast<std::size_t>(e + 1)] += groups.begin[static_cast<std::size_t>(e)];
  }
  groups.token.resize(static_cast<std::size_t>(groups.begin.back()));
  std::vector<std::int64_t> next(groups.begin.begin(), groups.begin.end() - 1);
  for (std::int64_t s = 0; s < slots; ++s) {
    const std::int64_t e = local(s);
    if (input.ids[s] < 0 || e < 0 || e >= experts) continue;
    const std::int64_t pair = next[static_cast<std::size_t>(e)]++;
    groups.token[static_cast<std::size_t>(pair)] = s / input.top_k;
    groups.pair_of[static_cast<std::size_t>(s)] = pair;
  }
  return groups;
}

struct Task {
  std::int64_t expert;
  std::int64_t row_begin;
  std::int64_t row_end;
};

// Row tiles outermost: parallel_for hands each thread a contiguous range of tasks, and this
// order gives every range a share of every expert, so threads get similar work however
// unevenly the tokens are spread over the experts. Untouched experts are never decoded.
std::vector<Task> make_tasks(const ExpertGroups& groups, std::int64_t rows, std::int64_t row_tile) {
  std::vector<Task> tasks;
  for (std::int64_t r = 0; r < rows; r += row_tile) {
    for (std::size_t e = 0; e + 1 < groups.begin.size(); ++e) {
      if (groups.begin[e + 1] == groups.begin[e]) continue;
      tasks.push_back({static_cast<std::int64_t>(e), r, std::min(rows, r + row_tile)});
    }
  }
  return tasks;
}

double bf16_bits_to_double(const std::uint16_t* bits, std::int64_t i) {
  return bf16_to_float(bits[i]);
}

}  // namespace

RankWeightsView view_of(const MoeRankWeights& weights) {
  const MoeRankShape& shape = weights.shape();
  RankWeightsView view;
  view.hidden = shape.hidden;
  view.width = shape.intermediate_size_per_partition_after_pad;  // I_rank (padded or not)
  view.experts_local = shape.experts_local();
  view.first_expert = shape.ep.begin;
  view.w13 = static_cast<const std::uint8_t*>(weights.w13().data());
  view.w13_scale = static_cast<const std::uint8_t*>(weights.w13_scale().data());
  view.w2 = static_cast<const std::uint8_t*>(weights.w2().data());
  view.w2_scale = static_cast<const std::uint8_t*>(weights.w2_scale().data());
  if (shape.has_bias) {
    view.w13_bias = static_cast<const std::uint16_t*>(weights.w13_bias().data());
    view.w2_bias = static_cast<const std::uint16_t*>(weights.w2_bias().data());
  }
  return view;
}

void rank_expert_forward(const RankWeightsView& weights, const MoeConfig& config,
                         const RankForwardInput& input, float* partial, float* magnitude,
                         const ExpertTiling& tiling) {
  MXQ_CHECK(tiling.pair_tile >= 1 && tiling.row_tile >= 1 && tiling.threads >= 0,
            ErrorCode::kInvalidArgument, "expert tiling: pair_tile=", tiling.pair_tile,
            " row_tile=", tiling.row_tile, " threads=", tiling.threads,
            " (expected >= 1, >= 1, >= 0)");
  const std::int64_t pair_tile = tiling.pair_tile;
  const std::int64_t row_tile = tiling.row_tile;
  const std::int64_t hidden = weights.hidden;
  const std::int64_t width = weights.width;
  const ExpertGroups groups = group_pairs(weights, input);
  const std::int64_t pairs = groups.begin.back();

  const std::uint8_t* w13 = weights.w13;
  const std::uint8_t* w13_scale = weights.w13_scale;
  const std::uint8_t* w2 = weights.w2;
  const std::uint8_t* w2_scale = weights.w2_scale;
  const std::uint16_t* w13_bias = weights.w13_bias;
  const std::uint16_t* w2_bias = weights.w2_bias;

  // W4A8: every token's x replaced by its E4M3 groups (once per token, shared by its slots).
  const bool fp8 = config.activation_quant == ActivationQuant::kFp8Group128;
  std::vector<double> x_fp8;
  if (fp8) {
    x_fp8.assign(input.x, input.x + input.tokens * hidden);
    run_chunks(input.tokens, 8, tiling.threads, [&](std::int64_t t0, std::int64_t t1) {
      for (std::int64_t t = t0; t < t1; ++t)
        quantize_dequantize_fp8_groups(&x_fp8[t * hidden], hidden);
    });
  }
  const double* x = fp8 ? x_fp8.data() : input.x;

  // GEMM1 + bias + activation -> act [pairs, width] (bf16 values held as doubles).
  std::vector<double> act(static_cast<std::size_t>(pairs * width));
  const std::vector<Task> gemm1 = make_tasks(groups, width, row_tile);
  run_chunks(
      static_cast<std::int64_t>(gemm1.size()), 1, tiling.threads,
      [&](std::int64_t t0, std::int64_t t1) {
        std::vector<double> scratch(static_cast<std::size_t>(hidden));
        std::vector<const double*> vectors(pair_tile);
        std::vector<double> gate_out(static_cast<std::size_t>(row_tile * pair_tile));
        std::vector<double> up_out(static_cast<std::size_t>(row_tile * pair_tile));
        for (std::int64_t t = t0; t < t1; ++t) {
          const Task& task = gemm1[static_cast<std::size_t>(t)];
          const std::int64_t rows = task.row_end - task.row_begin;
          const std::int64_t gate0 = task.expert * 2 * width + task.row_begin;  // first gate row
          const std::int64_t up0 = gate0 + width;                               // first up row
          const std::int64_t first = groups.begin[static_cast<std::size_t>(task.expert)];
          const std::int64_t last = groups.begin[static_cast<std::size_t>(task.expert + 1)];
          for (std::int64_t p0 = first; p0 < last; p0 += pair_tile) {
            const std::int64_t n = std::min(last - p0, pair_tile);
            for (std::int64_t v = 0; v < n; ++v) {
              vectors[static_cast<std::size_t>(v)] =
                  x + groups.token[static_cast<std::size_t>(p0 + v)] * hidden;
            }
            mxfp4_rows_dot(w13 + gate0 * (hidden / 2), w13_scale + gate0 * (hidden / 32), rows,
                           hidden, vectors.data(), n, gate_out.data(), scratch.data());
            mxfp4_rows_dot(w13 + up0 * (hidden / 2), w13_scale + up0 * (hidden / 32), rows, hidden,
                           vectors.data(), n, up_out.data(), scratch.data());
            for (std::int64_t r = 0; r < rows; ++r) {
              const double gate_bias = w13_bias ? bf16_bits_to_double(w13_bias, gate0 + r) : 0.0;
              const double up_bias = w13_bias ? bf16_bits_to_double(w13_bias, up0 + r) : 0.0;
              for (std::int64_t v = 0; v < n; ++v) {
                const auto at = static_cast<std::size_t>(r * n + v);
                const auto g = static_cast<float>(gate_out[at] + gate_bias);
                const auto u = static_cast<float>(up_out[at] + up_bias);
                const auto a = static_cast<float>(apply_activation(config, g, u));
                act[static_cast<std::size_t>((p0 + v) * width + task.row_begin + r)] =
                    round_to_bf16(a);
              }
            }
          }
        }
      });

  // W4A8: every pair's activation row replaced by its E4M3 groups. Padded channels are zero, so
  // they change no group's amax: padded and unpadded layers stay identical.
  if (fp8) {
    run_chunks(pairs, 8, tiling.threads, [&](std::int64_t p0, std::int64_t p1) {
      for (std::int64_t p = p0; p < p1; ++p) quantize_dequantize_fp8_groups(&act[p * width], width);
    });
  }

  // GEMM2 + bias -> y [pairs, hidden] (fp32).
  std::vector<float> y(static_cast<std::size_t>(pairs * hidden));
  const std::vector<Task> gemm2 = make_tasks(groups, hidden, row_tile);
  run_chunks(static_cast<std::int64_t>(gemm2.size()), 1, tiling.threads,
             [&](std::int64_t t0, std::int64_t t1) {
               std::vector<double> scratch(static_cast<std::size_t>(width));
               std::vector<const double*> vectors(pair_tile);
               std::vector<double> out(static_cast<std::size_t>(row_tile * pair_tile));
               for (std::int64_t t = t0; t < t1; ++t) {
                 const Task& task = gemm2[static_cast<std::size_t>(t)];
                 const std::int64_t rows = task.row_end - task.row_begin;
                 const std::int64_t row0 = task.expert * hidden + task.row_begin;
                 const std::int64_t first = groups.begin[static_cast<std::size_t>(task.expert)];
                 const std::int64_t last = groups.begin[static_cast<std::size_t>(task.expert + 1)];
                 for (std::int64_t p0 = first; p0 < last; p0 += pair_tile) {
                   const std::int64_t n = std::min(last - p0, pair_tile);
                   for (std::int64_t v = 0; v < n; ++v) {
                     vectors[static_cast<std::size_t>(v)] = act.data() + (p0 + v) * width;
                   }
                   mxfp4_rows_dot(w2 + row0 * (width / 2), w2_scale + row0 * (width / 32), rows,
                                  width, vectors.data(), n, out.data(), scratch.data());
                   for (std::int64_t r = 0; r < rows; ++r) {
                     const double bias = w2_bias ? bf16_bits_to_double(w2_bias, row0 + r) : 0.0;
                     for (std::int64_t v = 0; v < n; ++v) {
                       y[static_cast<std::size_t>((p0 + v) * hidden + task.row_begin + r)] =
                           static_cast<float>(out[static_cast<std::size_t>(r * n + v)] + bias);
                     }
                   }
                 }
               }
             });

  // Weighted sum over the slots, in slot order.
  run_chunks(input.tokens, 8, tiling.threads, [&](std::int64_t t0, std::int64_t t1) {
    for (std::int64_t t = t0; t < t1; ++t) {
      float* out = partial + t * hidden;
      float* mag = magnitude + t * hidden;
      std::fill(out, out + hidden, 0.0F);
      for (std::int64_t k = 0; k < input.top_k; ++k) {
        const std::int64_t pair = groups.pair_of[static_cast<std::size_t>(t * input.top_k + k)];
        if (pair < 0) continue;
        const double weight = input.weights[t * input.top_k + k];
        const float* ys = y.data() + pair * hidden;
        for (std::int64_t h = 0; h < hidden; ++h) {
          // fp32(weight * y): the double product of two floats is exact, so one rounding.
          const auto contribution = static_cast<float>(weight * static_cast<double>(ys[h]));
          out[h] += contribution;
          mag[h] += std::fabs(contribution);
        }
      }
    }
  });
}

}  // namespace mxq::moe::cpu
