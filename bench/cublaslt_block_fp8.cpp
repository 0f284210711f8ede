// cuBLASLt's block-scaled FP8 GEMM, the baseline of `mxq bench linear` (cublaslt_block_fp8.h).
#include "cublaslt_block_fp8.h"

#include <cstdint>

namespace mxq::bench {

CublasLtBlockFp8::CublasLtBlockFp8(cublasLtHandle_t handle, int m, int n, int k, void* workspace,
                                   const BlockFp8GemmOperands& first, Fp8Scaling scaling)
    : handle_(handle), m_(m), n_(n), k_(k), workspace_(workspace), scaling_(scaling) {
  for (const bool transposed : {false, true}) {
    if (try_orientation(transposed, first)) {
      transposed_ = transposed;
      ok_ = true;
      return;
    }
  }
}

void CublasLtBlockFp8::run(const BlockFp8GemmOperands& s, cudaStream_t stream) {
  const bool block = scaling_ == Fp8Scaling::kBlock;
  const void* w_scale = s.w_scale;
  const void* a_scale = s.x_scale;
  const void* a_ptr = transposed_ ? s.x : s.w;
  const void* b_ptr = transposed_ ? s.w : s.x;
  const void* a_scale_ptr = transposed_ ? a_scale : w_scale;
  const void* b_scale_ptr = transposed_ ? w_scale : a_scale;
  if (block) {
    MXQ_CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                                      &a_scale_ptr, sizeof(a_scale_ptr)));
    MXQ_CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                                      &b_scale_ptr, sizeof(b_scale_ptr)));
  }
  const float alpha = 1.0F;
  const float beta = 0.0F;
  MXQ_CUBLASLT_CHECK(cublasLtMatmul(handle_, desc_, &alpha, a_ptr, a_desc_, b_ptr, b_desc_, &beta,
                                    s.out, d_desc_, s.out, d_desc_, &algo_, workspace_,
                                    kCublasWorkspace, stream));
}

bool CublasLtBlockFp8::try_orientation(bool transposed, const BlockFp8GemmOperands& first) {
  release();
  // cuBLAS sizes: D (rows x cols) = op(A) (rows x K) * op(B) (K x cols), col-major.
  const int rows = transposed ? m_ : n_;
  const int cols = transposed ? n_ : m_;
  if (cublasLtMatmulDescCreate(&desc_, CUBLAS_COMPUTE_32F, CUDA_R_32F) != CUBLAS_STATUS_SUCCESS)
    return false;
  const cublasOperation_t op_t = CUBLAS_OP_T;
  const cublasOperation_t op_n = CUBLAS_OP_N;
  const std::int32_t vec128 = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
  const std::int32_t blk128 = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
  const std::int32_t scalar = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
  const bool block = scaling_ == Fp8Scaling::kBlock;
  const std::int32_t a_mode = !block ? scalar : transposed ? vec128 : blk128;
  const std::int32_t b_mode = !block ? scalar : transposed ? blk128 : vec128;
  bool ok = cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSA, &op_t,
                                           sizeof(op_t)) == CUBLAS_STATUS_SUCCESS &&
            cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSB, &op_n,
                                           sizeof(op_n)) == CUBLAS_STATUS_SUCCESS &&
            cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &a_mode,
                                           sizeof(a_mode)) == CUBLAS_STATUS_SUCCESS &&
            cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &b_mode,
                                           sizeof(b_mode)) == CUBLAS_STATUS_SUCCESS;
  const void* w_scale = first.w_scale;
  const void* a_scale = first.x_scale;
  const void* a_scale_ptr = transposed ? a_scale : w_scale;
  const void* b_scale_ptr = transposed ? w_scale : a_scale;
  if (block) {  // per-tensor: no scale pointers (scales of 1)
    ok = ok &&
         cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a_scale_ptr,
                                        sizeof(a_scale_ptr)) == CUBLAS_STATUS_SUCCESS &&
         cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b_scale_ptr,
                                        sizeof(b_scale_ptr)) == CUBLAS_STATUS_SUCCESS;
  }
  ok = ok &&
       cublasLtMatrixLayoutCreate(&a_desc_, CUDA_R_8F_E4M3, k_, rows, k_) == CUBLAS_STATUS_SUCCESS;
  ok = ok &&
       cublasLtMatrixLayoutCreate(&b_desc_, CUDA_R_8F_E4M3, k_, cols, k_) == CUBLAS_STATUS_SUCCESS;
  ok = ok &&
       cublasLtMatrixLayoutCreate(&d_desc_, CUDA_R_16BF, rows, cols, rows) == CUBLAS_STATUS_SUCCESS;
  ok = ok && cublasLtMatmulPreferenceCreate(&preference_) == CUBLAS_STATUS_SUCCESS;
  const std::size_t workspace = kCublasWorkspace;
  ok = ok &&
       cublasLtMatmulPreferenceSetAttribute(preference_, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                            &workspace, sizeof(workspace)) == CUBLAS_STATUS_SUCCESS;
  int found = 0;
  cublasLtMatmulHeuristicResult_t result{};
  ok = ok &&
       cublasLtMatmulAlgoGetHeuristic(handle_, desc_, a_desc_, b_desc_, d_desc_, d_desc_,
                                      preference_, 1, &result, &found) == CUBLAS_STATUS_SUCCESS &&
       found > 0;
  if (ok) algo_ = result.algo;
  return ok;
}

void CublasLtBlockFp8::release() {
  if (preference_ != nullptr) cublasLtMatmulPreferenceDestroy(preference_);
  if (d_desc_ != nullptr) cublasLtMatrixLayoutDestroy(d_desc_);
  if (b_desc_ != nullptr) cublasLtMatrixLayoutDestroy(b_desc_);
  if (a_desc_ != nullptr) cublasLtMatrixLayoutDestroy(a_desc_);
  if (desc_ != nullptr) cublasLtMatmulDescDestroy(desc_);
  preference_ = nullptr;
  d_desc_ = b_desc_ = a_desc_ = nullptr;
  desc_ = nullptr;
}

}  // namespace mxq::bench
