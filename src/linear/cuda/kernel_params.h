// Plain argument structs shared by the block-FP8 CUDA kernels and their host launchers. No
// framework headers: these cross the host/device boundary by value.
#pragma once

#include <cstdint>

namespace mxq::linear::gpu {

// y[M, N] = sum over K-blocks kb of (A[M, kb] x W[N, kb]^T) * a_scale[kb, m] * w_scale[n/bn, kb]
//           (+ bias[n])
// where a K-block is `block_k` wide along K (the activation group equals the weight block's K).
struct BlockFp8GemmArgs {
  const std::uint8_t* a = nullptr;  // e4m3 [M, K], row stride lda bytes
  std::int64_t lda = 0;
  const float* a_scale = nullptr;   // f32 [ceil(K/bk), a_scale_ld]: K-group major, M contiguous
  std::int64_t a_scale_ld = 0;      // >= M, a multiple of 4 (16-byte rows for TMA)
  const std::uint8_t* w = nullptr;  // e4m3 [N, K], row stride ldw bytes
  std::int64_t ldw = 0;
  const float* w_scale = nullptr;   // f32 [ceil(N/bn), w_scale_ld], one per (bn x bk) block
  std::int64_t w_scale_ld = 0;      // >= ceil(K/bk)
  const float* bias_f32 = nullptr;  // optional f32 [N]
  const std::uint16_t* bias_bf16 = nullptr;  // optional bf16 [N] (at most one bias is set)
  void* out = nullptr;                       // [M, N], row stride ldo elements
  std::int64_t ldo = 0;
  bool out_bf16 = true;  // bf16 output, else f32
  int m = 0;
  int n = 0;
  int k = 0;
  int block_n = 128;
  int block_k = 128;
};

// Activation quantization: x bf16 [M, K] -> q e4m3 [M, ldq] (zero padded to ldq) and scales
// f32 [ceil(K/group_k), scale_ld] (K-group major; rows M..scale_ld-1 are written as 0).
struct QuantizeActivationArgs {
  const std::uint16_t* x = nullptr;  // bf16 bits
  std::int64_t ldx = 0;
  std::uint8_t* q = nullptr;
  std::int64_t ldq = 0;  // >= K
  float* scale = nullptr;
  std::int64_t scale_ld = 0;  // >= M
  int m = 0;
  int k = 0;
  int group_k = 128;
  bool ue8m0 = false;  // round scales up to powers of two
};

}  // namespace mxq::linear::gpu
