// The baseline of `mxq bench linear`: cuBLASLt's block-scaled FP8 GEMM
// (CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F activations x
// CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F weights, fp32 accumulation, bf16 out), and the same
// GEMM with one scale per tensor: no per-block promotion at all, so the compute ceiling that a
// block-scaled kernel approaches at large M.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstddef>

#include "mxq/core/error.h"

#define MXQ_CUBLASLT_CHECK(call)                                                                \
  do {                                                                                          \
    const cublasStatus_t status_ = (call);                                                      \
    if (status_ != CUBLAS_STATUS_SUCCESS)                                                       \
      ::mxq::fail(::mxq::ErrorCode::kCuda, #call, " failed: ", cublasGetStatusString(status_)); \
  } while (0)

namespace mxq::bench {

// The workspace cuBLASLt may use (its heuristic is asked for algorithms within it).
inline constexpr std::size_t kCublasWorkspace = 32U << 20;

// Device operands of y = x · Wᵀ: x e4m3 [M, K] with fp32 scales K-group major [K/128, M_pad],
// W e4m3 [N, K] with fp32 block scales [N/128, K/128], y bf16 [M, N].
struct BlockFp8GemmOperands {
  const void* x;
  const void* x_scale;
  const void* w;
  const void* w_scale;
  void* out;
};

// How the operands are scaled.
enum class Fp8Scaling {
  kBlock,      // 1x128 activation groups x 128x128 weight blocks (the op mxq implements)
  kPerTensor,  // one fp32 scale per operand (the ceiling: nothing promoted inside K)
};

// Preferred orientation: A = W with 128x128 block scales, B = activations with 1x128 scales,
// D col-major N x M = y row-major. If cuBLASLt has no algorithm for that, the transposed
// orientation (A = activations VEC128, B = W BLK128x128, D = y^T) is used and reported as such.
class CublasLtBlockFp8 {
 public:
  // `first` provides the scale pointers set while cuBLASLt picks an algorithm; `workspace` holds
  // kCublasWorkspace bytes. With kPerTensor the scale pointers are not used (scales of 1): only
  // the time is meant to be read.
  CublasLtBlockFp8(cublasLtHandle_t handle, int m, int n, int k, void* workspace,
                   const BlockFp8GemmOperands& first, Fp8Scaling scaling = Fp8Scaling::kBlock);
  ~CublasLtBlockFp8() { release(); }
  CublasLtBlockFp8(const CublasLtBlockFp8&) = delete;
  CublasLtBlockFp8& operator=(const CublasLtBlockFp8&) = delete;

  // Whether cuBLASLt has an algorithm for this shape in either orientation.
  [[nodiscard]] bool ok() const { return ok_; }
  [[nodiscard]] bool transposed() const { return transposed_; }

  // Enqueues y = x · Wᵀ on `stream` (ok() must be true).
  void run(const BlockFp8GemmOperands& s, cudaStream_t stream);

 private:
  bool try_orientation(bool transposed, const BlockFp8GemmOperands& first);
  void release();

  cublasLtHandle_t handle_;
  int m_, n_, k_;
  void* workspace_;
  bool ok_ = false;
  bool transposed_ = false;
  Fp8Scaling scaling_;
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t a_desc_ = nullptr;
  cublasLtMatrixLayout_t b_desc_ = nullptr;
  cublasLtMatrixLayout_t d_desc_ = nullptr;
  cublasLtMatmulPreference_t preference_ = nullptr;
  cublasLtMatmulAlgo_t algo_{};
};

}  // namespace mxq::bench
