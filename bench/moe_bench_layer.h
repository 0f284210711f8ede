// The synthetic gpt-oss-shaped layer of `mxq bench moe` (random MXFP4 weights in the prepared
// layout, bf16 biases, router and tokens, all generated on the device) and the same-run baseline:
// the same layer in bf16 (router GEMM, top-k, host-side expert lists, per-expert cuBLAS GEMMs,
// activation, combine).
#pragma once

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "mxq/core/cuda_check.h"
#include "mxq/core/error.h"

#define MXQ_CUBLAS_CHECK(call)                                                                  \
  do {                                                                                          \
    const cublasStatus_t status_ = (call);                                                      \
    if (status_ != CUBLAS_STATUS_SUCCESS)                                                       \
      ::mxq::fail(::mxq::ErrorCode::kCuda, #call, " failed: ", cublasGetStatusString(status_)); \
  } while (0)

namespace mxq::bench {

template <typename T>
T* device_alloc(std::size_t count) {
  T* p = nullptr;
  MXQ_CUDA_CHECK(cudaMalloc(&p, std::max<std::size_t>(count, 1) * sizeof(T)));
  return p;
}

inline unsigned grid_for(std::size_t n) {
  return static_cast<unsigned>(std::min<std::size_t>((n + 255) / 256, 65535));
}

// Packed FP4 rows [rows, cols/2] whose row index r is "valid" when r % row_period < valid_a or
// in [pad_start, pad_start + valid_b), and whose columns beyond valid_cols are padding (0 weights,
// scale 127), as prepared weights are; random codes and scales 2^-9..2^-6 elsewhere.
void fill_fp4(std::uint8_t* w, std::uint8_t* scale, std::size_t rows, int cols, int valid_cols,
              int row_period, int valid_a, int pad_start, int valid_b, std::uint64_t seed,
              cudaStream_t stream);
// n bf16 values uniform in [-amplitude, amplitude).
void fill_bf16(__nv_bfloat16* x, std::size_t n, float amplitude, std::uint64_t seed,
               cudaStream_t stream);
// The valid rows/cols of packed FP4 [rows, cols] dequantized into a dense bf16 [out_rows,
// out_cols].
void dequant_to_bf16(const std::uint8_t* w, const std::uint8_t* scale, int cols, __nv_bfloat16* out,
                     std::size_t out_rows, int out_cols, int row_period, int out_period,
                     int valid_a, int pad_start, cudaStream_t stream);

struct Bf16Baseline {
  int experts, hidden, inter, k;
  __nv_bfloat16 *w13, *w2, *router, *b13, *b2;  // dense bf16 copies of the same layer
  cublasHandle_t handle;

  void forward(const __nv_bfloat16* x, int tokens, __nv_bfloat16* out, cudaStream_t stream,
               float* logits, int* ids, float* weights, int* d_token_of_slot, int* d_expert_of_slot,
               int* d_slot_of_pair, __nv_bfloat16* xg, __nv_bfloat16* y1, __nv_bfloat16* act,
               __nv_bfloat16* y2) const;
};

}  // namespace mxq::bench
