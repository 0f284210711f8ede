#include "moe_bench_layer.h"

#include <cmath>
#include <vector>

namespace mxq::bench {
namespace {

__device__ __forceinline__ std::uint64_t mix(std::uint64_t z) {
  z += 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}
__device__ __forceinline__ float uniform(std::uint64_t seed, std::size_t i) {  // [-1, 1)
  return static_cast<float>(mix(seed * 0x100000001B3ULL + i) >> 40) * (2.0F / 16777216.0F) - 1.0F;
}

__global__ void fill_fp4_kernel(std::uint8_t* w, std::uint8_t* scale, std::size_t rows, int cols,
                                int valid_cols, int row_period, int valid_a, int pad_start,
                                int valid_b, std::uint64_t seed) {
  const std::size_t bytes = rows * (cols / 2);
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < bytes;
       i += std::size_t{gridDim.x} * blockDim.x) {
    const std::size_t r = i / (cols / 2);
    const int c = static_cast<int>(i % (cols / 2)) * 2;
    const int rr = static_cast<int>(r % row_period);
    const bool valid_row = rr < valid_a || (rr >= pad_start && rr < pad_start + valid_b);
    const bool valid = valid_row && c < valid_cols;
    w[i] = valid ? static_cast<std::uint8_t>(mix(seed + i)) : 0;
    if (c % 32 == 0) {
      scale[r * (cols / 32) + c / 32] =
          valid ? static_cast<std::uint8_t>(118 + mix(seed ^ (i * 7)) % 4) : 127;
    }
  }
}

__global__ void fill_bf16_kernel(__nv_bfloat16* x, std::size_t n, float amplitude,
                                 std::uint64_t seed) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    x[i] = __float2bfloat16_rn(amplitude * uniform(seed, i));
  }
}

__device__ float e2m1_value(unsigned code) {
  const float mag[8] = {0.0F, 0.5F, 1.0F, 1.5F, 2.0F, 3.0F, 4.0F, 6.0F};
  return (code & 8U) ? -mag[code & 7U] : mag[code & 7U];
}

__global__ void dequant_to_bf16_kernel(const std::uint8_t* w, const std::uint8_t* scale, int cols,
                                       __nv_bfloat16* out, std::size_t out_rows, int out_cols,
                                       int row_period, int out_period, int valid_a, int pad_start) {
  const std::size_t n = out_rows * out_cols;
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    const std::size_t orow = i / out_cols;
    const int c = static_cast<int>(i % out_cols);
    const std::size_t block = orow / out_period;
    const int within = static_cast<int>(orow % out_period);
    const int src_within = within < valid_a ? within : pad_start + (within - valid_a);
    const std::size_t r = block * row_period + src_within;
    const std::uint8_t byte = w[r * (cols / 2) + c / 2];
    const unsigned code = (c & 1) ? (byte >> 4) : (byte & 0xF);
    const float s = ldexpf(1.0F, static_cast<int>(scale[r * (cols / 32) + c / 32]) - 127);
    out[i] = __float2bfloat16_rn(e2m1_value(code) * s);
  }
}

// ---- bf16 baseline kernels -------------------------------------------------------------------
__global__ void topk_softmax(const float* logits, int experts, int k, int tokens, int* ids,
                             float* weights) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= tokens) return;
  const float* row = logits + static_cast<std::size_t>(t) * experts;
  int chosen[8];
  float value[8];
  for (int j = 0; j < k; ++j) {
    int best = -1;
    for (int e = 0; e < experts; ++e) {
      bool taken = false;
      for (int q = 0; q < j; ++q) taken = taken || chosen[q] == e;
      if (!taken && (best < 0 || row[e] > row[best])) best = e;
    }
    chosen[j] = best;
    value[j] = row[best];
  }
  float sum = 0.0F;
  for (int j = 0; j < k; ++j) sum += expf(value[j] - value[0]);
  for (int j = 0; j < k; ++j) {
    ids[t * k + j] = chosen[j];
    weights[t * k + j] = expf(value[j] - value[0]) / sum;
  }
}

__global__ void gather_rows(const __nv_bfloat16* x, const int* token_of_slot, int slots, int hidden,
                            __nv_bfloat16* out) {
  const std::size_t n = static_cast<std::size_t>(slots) * hidden;
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    out[i] = x[static_cast<std::size_t>(token_of_slot[i / hidden]) * hidden + i % hidden];
  }
}

__global__ void swiglu_oai_bf16(const __nv_bfloat16* y1, const __nv_bfloat16* b13,
                                const int* expert_of_slot, int slots, int inter,
                                __nv_bfloat16* act) {
  const std::size_t n = static_cast<std::size_t>(slots) * inter;
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    const std::size_t s = i / inter;
    const int j = static_cast<int>(i % inter);
    const std::size_t brow = static_cast<std::size_t>(expert_of_slot[s]) * 2 * inter;
    float g = __bfloat162float(y1[s * 2 * inter + j]) + __bfloat162float(b13[brow + j]);
    float u =
        __bfloat162float(y1[s * 2 * inter + inter + j]) + __bfloat162float(b13[brow + inter + j]);
    g = fminf(g, 7.0F);
    u = fminf(fmaxf(u, -7.0F), 7.0F);
    act[i] = __float2bfloat16_rn((u + 1.0F) * g / (1.0F + expf(-1.702F * g)));
  }
}

__global__ void combine_bf16(const __nv_bfloat16* y2, const __nv_bfloat16* b2,
                             const int* slot_of_pair, const int* ids, const float* weights, int k,
                             int hidden, int tokens, __nv_bfloat16* out) {
  const std::size_t n = static_cast<std::size_t>(tokens) * hidden;
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    const int t = static_cast<int>(i / hidden);
    const int h = static_cast<int>(i % hidden);
    float sum = 0.0F;
    for (int j = 0; j < k; ++j) {
      const int slot = slot_of_pair[t * k + j];
      sum += weights[t * k + j] *
             (__bfloat162float(y2[static_cast<std::size_t>(slot) * hidden + h]) +
              __bfloat162float(b2[static_cast<std::size_t>(ids[t * k + j]) * hidden + h]));
    }
    out[i] = __float2bfloat16_rn(sum);
  }
}

}  // namespace

void fill_fp4(std::uint8_t* w, std::uint8_t* scale, std::size_t rows, int cols, int valid_cols,
              int row_period, int valid_a, int pad_start, int valid_b, std::uint64_t seed,
              cudaStream_t stream) {
  fill_fp4_kernel<<<4096, 256, 0, stream>>>(w, scale, rows, cols, valid_cols, row_period, valid_a,
                                            pad_start, valid_b, seed);
  MXQ_CUDA_CHECK_LAUNCH();
}

void fill_bf16(__nv_bfloat16* x, std::size_t n, float amplitude, std::uint64_t seed,
               cudaStream_t stream) {
  fill_bf16_kernel<<<1024, 256, 0, stream>>>(x, n, amplitude, seed);
  MXQ_CUDA_CHECK_LAUNCH();
}

void dequant_to_bf16(const std::uint8_t* w, const std::uint8_t* scale, int cols, __nv_bfloat16* out,
                     std::size_t out_rows, int out_cols, int row_period, int out_period,
                     int valid_a, int pad_start, cudaStream_t stream) {
  dequant_to_bf16_kernel<<<8192, 256, 0, stream>>>(w, scale, cols, out, out_rows, out_cols,
                                                   row_period, out_period, valid_a, pad_start);
  MXQ_CUDA_CHECK_LAUNCH();
}

void Bf16Baseline::forward(const __nv_bfloat16* x, int tokens, __nv_bfloat16* out,
                           cudaStream_t stream, float* logits, int* ids, float* weights,
                           int* d_token_of_slot, int* d_expert_of_slot, int* d_slot_of_pair,
                           __nv_bfloat16* xg, __nv_bfloat16* y1, __nv_bfloat16* act,
                           __nv_bfloat16* y2) const {
  const float one = 1.0F;
  const float zero = 0.0F;
  MXQ_CUBLAS_CHECK(cublasSetStream(handle, stream));
  MXQ_CUBLAS_CHECK(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, experts, tokens, hidden, &one,
                                router, CUDA_R_16BF, hidden, x, CUDA_R_16BF, hidden, &zero, logits,
                                CUDA_R_32F, experts, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  topk_softmax<<<(tokens + 127) / 128, 128, 0, stream>>>(logits, experts, k, tokens, ids, weights);
  MXQ_CUDA_CHECK_LAUNCH();
  const int pairs = tokens * k;
  std::vector<int> h_ids(static_cast<std::size_t>(pairs));
  MXQ_CUDA_CHECK(
      cudaMemcpyAsync(h_ids.data(), ids, pairs * sizeof(int), cudaMemcpyDeviceToHost, stream));
  MXQ_CUDA_CHECK(cudaStreamSynchronize(stream));  // the host builds the expert lists
  std::vector<int> count(static_cast<std::size_t>(experts), 0),
      offset(static_cast<std::size_t>(experts) + 1, 0);
  for (const int e : h_ids) ++count[static_cast<std::size_t>(e)];
  for (int e = 0; e < experts; ++e) offset[e + 1] = offset[e] + count[e];
  std::vector<int> token_of_slot(pairs), expert_of_slot(pairs), slot_of_pair(pairs),
      cursor(offset.begin(), offset.end() - 1);
  for (int p = 0; p < pairs; ++p) {
    const int e = h_ids[static_cast<std::size_t>(p)];
    const int slot = cursor[e]++;
    token_of_slot[slot] = p / k;
    expert_of_slot[slot] = e;
    slot_of_pair[p] = slot;
  }
  MXQ_CUDA_CHECK(cudaMemcpyAsync(d_token_of_slot, token_of_slot.data(), pairs * sizeof(int),
                                 cudaMemcpyHostToDevice, stream));
  MXQ_CUDA_CHECK(cudaMemcpyAsync(d_expert_of_slot, expert_of_slot.data(), pairs * sizeof(int),
                                 cudaMemcpyHostToDevice, stream));
  MXQ_CUDA_CHECK(cudaMemcpyAsync(d_slot_of_pair, slot_of_pair.data(), pairs * sizeof(int),
                                 cudaMemcpyHostToDevice, stream));
  gather_rows<<<grid_for(static_cast<std::size_t>(pairs) * hidden), 256, 0, stream>>>(
      x, d_token_of_slot, pairs, hidden, xg);
  MXQ_CUDA_CHECK_LAUNCH();
  for (int e = 0; e < experts; ++e) {
    if (count[e] == 0) continue;
    const std::size_t o = static_cast<std::size_t>(offset[e]);
    MXQ_CUBLAS_CHECK(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, 2 * inter, count[e], hidden,
                                  &one, w13 + static_cast<std::size_t>(e) * 2 * inter * hidden,
                                  CUDA_R_16BF, hidden, xg + o * hidden, CUDA_R_16BF, hidden, &zero,
                                  y1 + o * 2 * inter, CUDA_R_16BF, 2 * inter, CUBLAS_COMPUTE_32F,
                                  CUBLAS_GEMM_DEFAULT));
  }
  swiglu_oai_bf16<<<grid_for(static_cast<std::size_t>(pairs) * inter), 256, 0, stream>>>(
      y1, b13, d_expert_of_slot, pairs, inter, act);
  MXQ_CUDA_CHECK_LAUNCH();
  for (int e = 0; e < experts; ++e) {
    if (count[e] == 0) continue;
    const std::size_t o = static_cast<std::size_t>(offset[e]);
    MXQ_CUBLAS_CHECK(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, hidden, count[e], inter, &one,
                                  w2 + static_cast<std::size_t>(e) * hidden * inter, CUDA_R_16BF,
                                  inter, act + o * inter, CUDA_R_16BF, inter, &zero,
                                  y2 + o * hidden, CUDA_R_16BF, hidden, CUBLAS_COMPUTE_32F,
                                  CUBLAS_GEMM_DEFAULT));
  }
  combine_bf16<<<grid_for(static_cast<std::size_t>(tokens) * hidden), 256, 0, stream>>>(
      y2, b2, d_slot_of_pair, ids, weights, k, hidden, tokens, out);
  MXQ_CUDA_CHECK_LAUNCH();
}

}  // namespace mxq::bench
