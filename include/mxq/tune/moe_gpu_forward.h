// moe_gpu_forward: the autotuner's view of one rank's CUDA MXFP4 MoE forward (mxq/moe/cuda_moe.h:
// lists, grouped GEMM1 + SwiGLU, grouped GEMM2, combine). Its tactics are the ways the grouped
// GEMMs stream the MXFP4 weights (cuda::GemmVariant): `register_stream` (the default),
// `shared_tile`, `wide_tile` and `wgmma_tile` (prefill; these two sum K in other orders); the
// workload checks each against the CPU reference (normalized error <= 4e-3, the bound of the GPU
// tests). Registered only in builds with CUDA (src/cuda/moe/moe_gpu_forward_autotune.cpp);
// moe::MoeGpuLayer consults an autotuner given at upload.
#pragma once

#include <cstdint>
#include <string_view>

#include "mxq/moe/config.h"
#include "mxq/tune/moe_expert_gemm.h"
#include "mxq/tune/problem.h"

namespace mxq::tune {

inline constexpr std::string_view kMoeGpuForwardOp = "moe_gpu_forward";

// One rank as the kernels see it: `rank` as for moe_expert_gemm, with `rank.intermediate` the
// channels that hold data (the TP shard's valid width, which the kernels stream), the prepared
// width P >= I (the row offset of the up half and w2's row length; = I when not prepared) and
// the activation. Routing (router or precomputed) costs every tactic the same and is not part of
// the key.
struct MoeGpuForwardShape {
  MoeExpertGemmShape rank;
  std::int64_t intermediate_padded = 0;
  moe::Activation activation = moe::Activation::kSwigluOai;
};

// moe_gpu_forward[E,E_local,H,I,P,bias,top_k|act=...,out=bf16,w=mxfp4,x=bf16]. Throws mxq::Error
// naming the field when the shape is not one the MoE layer runs (as moe_expert_gemm_problem, and
// P must be a multiple of 32 and >= I).
Problem moe_gpu_forward_problem(const MoeGpuForwardShape& shape);

}  // namespace mxq::tune
