// What a MoE layer and its CPU forward pass hold in host memory, and the check of a request (a
// TP x EP split, a forced per-rank width, a padding alignment, a token count) against the layer
// and the machine before anything is allocated. A typo such as a TP size of 100000 is then
// refused by name instead of growing until the kernel's OOM killer ends the process.
//
// Sizes (bytes, every rank of the simulated grid; EP ranks together hold every expert once per
// TP rank, so EP changes nothing but the router's copy count, which is one):
//   weights(W)  = tp_size * [E * (2W * H/2 + 2W * H/32 + H * W/2 + H * W/32) + biases]
//                 with biases = E * (2W * 2 + H * 2) when the layer has them; plus the router
//                 (E * H * 2, + E * 2 with biases)
//   layer       = weights(W) at the TP width W, + weights(P) when prepared with an alignment
//                 (the first preparation copies into the padded storage: both are held then)
//   forward(T)  = T * (36 H + top_k * (8 P + 4 H + 16) + 1): the f32/f64 copies of the input,
//                 the accumulator, magnitude, partial and output [T, H], and one rank's
//                 activations [T * top_k, P] (f64) and GEMM2 outputs [T * top_k, H] (f32)
// Each is an upper estimate of the peak, rounded the safe way, saturating at UINT64_MAX.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "mxq/moe/config.h"
#include "mxq/moe/rank_weights.h"
#include "mxq/moe/sharding.h"

namespace mxq::moe {

// The names the checks give the sizes in their messages: the library's argument names by
// default; the CLI and the Python package pass their own (--tp, tp_size, align, ...).
struct SizeArgumentNames {
  std::string_view tp_size = "tp_size";
  std::string_view ep_size = "ep_size";
  std::string_view intermediate_per_rank = "intermediate_per_rank";
  std::string_view alignment = "alignment";
  std::string_view tokens = "tokens";
};

// Host bytes of every rank's expert weights at per-rank width `width`, plus the router.
std::uint64_t layer_weight_bytes(const MoeConfig& config, int tp_size, std::int64_t width);
// Peak host bytes of a layer loaded with `shards` and prepared with `alignment` (0: not prepared).
// `shards` and `alignment` must have passed check_layer_request's size checks.
std::uint64_t layer_host_bytes(const MoeConfig& config, const ShardOptions& shards,
                               std::int64_t alignment = 0);
// Peak host bytes of one CPU forward pass of `tokens` tokens over ranks of width `width`.
std::uint64_t forward_host_bytes(const MoeConfig& config, std::int64_t width, std::int64_t tokens);

// Checks a request before anything is allocated, and throws Error naming the argument:
// - 1 <= tp_size <= I / 32 (a TP rank holds whole 32-channel blocks: more ranks than blocks
//   would hold only zero fill); 1 <= ep_size <= E (every EP rank holds an expert);
//   tp_size * ep_size fits an int; intermediate_per_rank 0 or a multiple of 32 with
//   tp_size * it >= I; alignment 0 (no padding) or a positive multiple of 32;
// - the layer's peak (layer_host_bytes) against host_memory(): when it does not fit, the error
//   names the first argument that makes it too large, in the order tp_size,
//   intermediate_per_rank, alignment (the layer alone, one unpadded rank, is named "layer").
void check_layer_request(const MoeConfig& config, const ShardOptions& shards,
                         std::int64_t alignment, const SizeArgumentNames& names = {});

// `tokens` >= 0 and the forward's buffers (forward_host_bytes) plus `held_bytes` (what the caller
// holds besides: the layer, other buffers) against host_memory(); the error names names.tokens.
void check_forward_request(const MoeConfig& config, std::int64_t width, std::int64_t tokens,
                           std::uint64_t held_bytes, const SizeArgumentNames& names = {});

// The shapes of every rank (rank id = ep_rank * tp_size + tp_rank) of a layer loaded with
// `shards` (MoeLayer::load) and, when alignment != 0, prepared with it: MoeLayer's rank(r).shape()
// computed without loading, for a process that loads only its own rank (MoeDistLayer) and reports
// the others. `shards` and `alignment` must have passed check_layer_request.
std::vector<MoeRankShape> layer_rank_shapes(const MoeConfig& config, const ShardOptions& shards,
                                            std::int64_t alignment = 0);

}  // namespace mxq::moe
