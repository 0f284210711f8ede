// How the MXFP4 MoE appears to the autotuner (mxq/tune/): its two tuning problems.
//
// moe_expert_gemm: one rank's expert computation on the CPU (GEMM1 + bias + activation, GEMM2 +
// bias, weighted sum over the top-k slots; the reference of docs/moe.md,
// src/moe/cpu/expert_forward.h). Its tactics are tilings of the expert GEMMs: tiles of routed
// (token, slot) pairs, of weight rows, and the thread count. Every output element is one
// fixed-order fp64 dot product whatever the tiling, so every tactic must give bit-identical
// output to the reference; the workload checks exactly that
// (src/moe/cpu/moe_expert_gemm_autotune.cpp).
//
// moe_gpu_forward: one rank's CUDA forward (mxq/moe/cuda_moe.h: routing, grouped GEMM1 + SwiGLU,
// grouped GEMM2, combine), W4A16 (x=bf16) or W4A8 (x=fp8_g128: a problem of its own, so the
// two precisions' decisions never meet). Its tactics are the grouped GEMMs' variants
// (gpu::GemmVariant): `decode_mma` (the default) and `prefill_wgmma` (which sums K in another
// order); the workload checks each against the CPU reference of the problem's precision
// (normalized error <= 4e-3, the bound of the GPU tests).
// Registered only in builds with CUDA (src/moe/cuda/moe_gpu_forward_autotune.cpp);
// moe::MoeGpuLayer consults an autotuner given at upload.
//
// The presets of MoE deployments (tiny-moe, gpt-oss-20b, gpt-oss-120b, and the W4A8 ones
// gpt-oss-20b-w4a8, gpt-oss-120b-w4a8) are in src/moe/moe_presets.cpp.
#pragma once

#include <cstdint>
#include <string_view>

#include "mxq/moe/config.h"
#include "mxq/tune/problem.h"

namespace mxq::moe {

class MoeRankWeights;

inline constexpr std::string_view kMoeExpertGemmOp = "moe_expert_gemm";
inline constexpr std::string_view kMoeGpuForwardOp = "moe_gpu_forward";

// One rank's shape as the CPU expert computation runs it: `experts` global experts of which
// `experts_local` live on this rank (EP), hidden size H, the rank's intermediate size in
// checkpoint layout (TpShard::width, a multiple of 32: docs/moe.md, "Names of the intermediate
// size"), top_k.
struct MoeExpertGemmShape {
  std::int64_t experts = 0;
  std::int64_t experts_local = 0;
  std::int64_t hidden = 0;
  std::int64_t intermediate_size_per_partition = 0;
  std::int64_t top_k = 0;
  bool has_bias = true;
};

// moe_expert_gemm[E,E_local,H,I,bias,top_k|out=f32,w=mxfp4,x=bf16] with I =
// intermediate_size_per_partition. Throws mxq::Error naming the field when the shape is not one
// the MoE layer runs.
tune::Problem moe_expert_gemm_problem(const MoeExpertGemmShape& shape);

// What a moe_expert_gemm tactic runs on (the arguments of cpu::rank_expert_forward).
struct MoeExpertGemmArgs {
  const MoeRankWeights* weights = nullptr;
  const MoeConfig* config = nullptr;
  const double* x = nullptr;  // [tokens, H], bf16 values
  std::int64_t tokens = 0;
  const std::int32_t* ids = nullptr;  // [tokens, top_k]
  const float* routing_weights = nullptr;
  std::int64_t top_k = 0;
  float* partial = nullptr;    // [tokens, H]
  float* magnitude = nullptr;  // [tokens, H], zeroed by the caller
};

// One rank as the kernels see it: the channels that hold data (TpShard::valid, which the kernels
// stream) and the prepared width P >= that (the row offset of the up half and w2's row length:
// intermediate_size_per_partition_after_pad; = the valid channels when not prepared), and the
// activation and the activations' quantization (bf16: W4A16; fp8_g128: W4A8). Routing (router
// or precomputed) costs every tactic the same and is not part of the key.
struct MoeGpuForwardShape {
  std::int64_t experts = 0;
  std::int64_t experts_local = 0;
  std::int64_t hidden = 0;
  std::int64_t intermediate_valid = 0;
  std::int64_t intermediate_after_pad = 0;
  std::int64_t top_k = 0;
  bool has_bias = true;
  Activation activation = Activation::kSwigluOai;
  ActivationQuant activation_quant = ActivationQuant::kBf16;
};

// moe_gpu_forward[E,E_local,H,I,P,bias,top_k|act=...,out=bf16,w=mxfp4,x=bf16|fp8_g128] with I =
// intermediate_valid, P = intermediate_after_pad. Throws mxq::Error naming the field when the
// shape is not one the MoE layer runs (the checks of moe_expert_gemm_problem, and P a multiple of
// 32 and >= I).
tune::Problem moe_gpu_forward_problem(const MoeGpuForwardShape& shape);

}  // namespace mxq::moe
