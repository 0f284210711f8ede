// The typed description of one block-FP8 linear call, y[M, N] = x[M, K] W[N, K]^T (+ bias):
// everything a tactic's supports() and the dispatcher look at. Block shapes are values
// (BlockShape{128, 128} == BlockShape{128, 128}), never tuples compared with lists.
#pragma once

#include <cstdint>
#include <string>

#include "mxq/core/device.h"
#include "mxq/core/dtype.h"
#include "mxq/formats/fp8_block.h"

namespace mxq::linear {

// How a weight's scales are stored: fp32 per block, or DeepGEMM's packed UE8M0 int32 layout
// (four K-groups per int32; see mxq/formats/ue8m0_pack.h). Tactics that read fp32 get the packed
// scales unpacked first (exact: every UE8M0 value is a power of two).
enum class ScaleLayout { kFp32, kPackedUe8m0 };
std::string_view to_string(ScaleLayout layout);  // "fp32" / "packed-ue8m0"

struct LinearProblem {
  std::int64_t m = 0;          // tokens (rows of x)
  std::int64_t n = 0;          // output features (rows of W)
  std::int64_t k = 0;          // input features
  BlockShape block{128, 128};  // weight block; activations are grouped 1 x block.k
  ScaleLayout weight_scales = ScaleLayout::kFp32;
  ScaleMode activation_scales = ScaleMode::kFp32;  // fp32 or power-of-two (UE8M0) scales
  DType out_dtype = DType::kBF16;
  bool has_bias = false;
  Device device = Device::cpu();
  int sm = 0;        // CUDA compute capability as major * 10 + minor (90 = H100/H200); 0 on CPU
  int sm_count = 0;  // multiprocessors of the CUDA device; 0 on CPU

  // "M=64 N=7168 K=2048 block=128x128 w-scales=fp32 a-scales=fp32 out=bf16 cuda:0 sm_90"
  [[nodiscard]] std::string str() const;
};

// Fills `device`, `sm` and `sm_count` from the device (queries the CUDA runtime for CUDA
// devices; throws mxq::Error(kUnsupported) when this build has no CUDA).
void describe_device(LinearProblem& problem, Device device);

}  // namespace mxq::linear
