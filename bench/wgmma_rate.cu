// `mxq bench wgmma-rate` (wgmma_rate.h): warpgroups issuing wgmma on zeros, nothing else.
#include "wgmma_rate.h"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "cuda_common/mbarrier.cuh"
#include "cuda_common/smem.cuh"
#include "cuda_common/wgmma.cuh"
#include "graph_timing.h"
#include "mxq/core/cuda_check.h"
#include "mxq/core/error.h"
#include "require_gpu.h"

namespace mxq::bench {
namespace {

constexpr int kOperandBytes = 64 * 1024;          // B at 0 (up to 128 rows), A (E4M3) at 32 KB
constexpr int kSmemBytes = kOperandBytes + 1024;  // + the 1024-byte alignment of swizzled atoms
constexpr int kMaxWarpgroups = 4;

// Each warpgroup: `iterations` commit groups of kSteps wgmma on one accumulator, each group's
// wait leaving kInFlight pending. The bf16 A fragment changes every group, as a decode's would,
// in two register sets as the MoE's loop keeps them: a set is rewritten only after the group that
// read it is done (the wait after the next group leaves at most one pending), never while a wgmma
// may still read it. The operands are zeros, so the sum is 0 and never stored: the store only
// keeps the work alive.
template <bool kE4m3, int kN, int kSteps, int kInFlight>
__global__ void __launch_bounds__(128 * kMaxWarpgroups, 1)
    wgmma_rate_kernel(int iterations, float* sink) {
  static_assert(kInFlight == 0 || kInFlight == 1, "two fragment sets: at most one group pending");
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(1024) std::uint8_t smem_raw[];
  const std::uint32_t raw_addr = ptx::smem_addr(smem_raw);
  std::uint8_t* smem = smem_raw + ((1024U - (raw_addr & 1023U)) & 1023U);
  for (int i = static_cast<int>(threadIdx.x); i < kOperandBytes / 16;
       i += static_cast<int>(blockDim.x)) {
    reinterpret_cast<uint4*>(smem)[i] = make_uint4(0U, 0U, 0U, 0U);
  }
  ptx::fence_proxy_async_shared();  // the zeros are visible to the tensor cores' reads
  __syncthreads();
  const std::uint64_t desc_b = ptx::wgmma_desc_k128_sw128(ptx::smem_addr(smem));
  const std::uint64_t desc_a = desc_b + ((kOperandBytes / 2) >> 4);
  float acc[kN / 2];
#pragma unroll
  for (int i = 0; i < kN / 2; ++i) acc[i] = 0.0F;
  std::uint32_t frag[2][4] = {};
  // One commit group of kSteps wgmma reading fragment set `set`, then the wait.
  const auto group = [&](int set) {
    ptx::wgmma_fence();
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      // k-step s reads 32 bytes further along each 128-byte row (the descriptor's address field
      // counts 16-byte units), as a GEMM's k-steps do; steps 4..7 run past the row into the
      // next rows' bytes, zeros all the same and inside the operand area.
      if constexpr (kE4m3) {
        ptx::wgmma_m64k32_e4m3<kN>(acc, desc_a + 2 * s, desc_b + 2 * s, true);
      } else {
        ptx::wgmma_m64k16_bf16_rs<kN>(acc, frag[set], desc_b + 2 * s, true);
      }
    }
    ptx::wgmma_commit();
    ptx::wgmma_wait<kInFlight>();
  };
  for (int it = 0; it < iterations; it += 2) {
    group(0);
    frag[1][0] ^= 0x80008000U;  // set 1's last group is done: a new fragment (still zeros)
    group(1);
    frag[0][0] ^= 0x80008000U;
  }
  ptx::wgmma_wait<0>();
  ptx::wgmma_fence_operands(acc);
  float sum = 0.0F;
#pragma unroll
  for (int i = 0; i < kN / 2; ++i) sum += acc[i];
  if (sum != 0.0F) sink[threadIdx.x] = sum;
#else
  (void)iterations;
  (void)sink;
#endif
}

using KernelFn = void (*)(int, float*);

template <bool kE4m3, int kN, int kSteps>
KernelFn kernel_for_in_flight(int in_flight) {
  if (in_flight == 0) return &wgmma_rate_kernel<kE4m3, kN, kSteps, 0>;
  if constexpr (wgmma_rate_serialized_by_ptxas(kE4m3, kN, kSteps, 1)) {
    fail(ErrorCode::kInternal, "mxq bench wgmma-rate: a configuration ptxas serializes reached ",
         "the kernel (check_wgmma_rate_options refuses it)");
  } else {
    return &wgmma_rate_kernel<kE4m3, kN, kSteps, 1>;
  }
}

template <bool kE4m3, int kN>
KernelFn kernel_for_steps(int k_steps, int in_flight) {
  switch (k_steps) {
    case 1:
      return kernel_for_in_flight<kE4m3, kN, 1>(in_flight);
    case 2:
      return kernel_for_in_flight<kE4m3, kN, 2>(in_flight);
    case 4:
      return kernel_for_in_flight<kE4m3, kN, 4>(in_flight);
    default:
      return kernel_for_in_flight<kE4m3, kN, 8>(in_flight);
  }
}

template <bool kE4m3>
KernelFn kernel_for_n(int n, int k_steps, int in_flight) {
  switch (n) {
    case 16:
      return kernel_for_steps<kE4m3, 16>(k_steps, in_flight);
    case 32:
      return kernel_for_steps<kE4m3, 32>(k_steps, in_flight);
    case 64:
      return kernel_for_steps<kE4m3, 64>(k_steps, in_flight);
    default:
      return kernel_for_steps<kE4m3, 128>(k_steps, in_flight);
  }
}

}  // namespace

nlohmann::json run_wgmma_rate(const WgmmaRateOptions& options, bool progress) {
  check_wgmma_rate_options(options);
  require_gpu("wgmma-rate");
  cudaDeviceProp props{};
  MXQ_CUDA_CHECK(cudaGetDeviceProperties(&props, 0));
  if (props.major != 9 || props.minor != 0) {
    fail(ErrorCode::kUnsupported, "mxq bench wgmma-rate needs an sm_90 GPU (wgmma); found ",
         props.name, " (sm_", props.major, props.minor, ")");
  }
  float* sink = nullptr;
  MXQ_CUDA_CHECK(cudaMalloc(&sink, 128 * kMaxWarpgroups * sizeof(float)));
  cudaStream_t stream = nullptr;
  MXQ_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  nlohmann::json result;
  result["gpu"] = props.name;
  result["sm_count"] = props.multiProcessorCount;
  const int iterations = (options.iterations + 1) / 2 * 2;  // whole pairs of groups
  result["iterations"] = iterations;
  result["repeats"] = options.repeats;
  result["method"] =
      "one block an SM of `warpgroups` warpgroups, each issuing `iterations` commit groups of "
      "`k_steps` wgmma on one accumulator, waiting after each until `in_flight` groups are "
      "pending; zero operands; CUDA graph per launch, median of `repeats`";
  nlohmann::json configs = nlohmann::json::array();
  for (const std::string& kind : options.kinds) {
    const bool e4m3 = kind == "e4m3-ss";
    const int k = e4m3 ? 32 : 16;
    for (const int n : options.n) {
      for (const int warpgroups : options.warpgroups) {
        for (const int k_steps : options.k_steps) {
          for (const int in_flight : options.in_flight) {
            const KernelFn kernel = e4m3 ? kernel_for_n<true>(n, k_steps, in_flight)
                                         : kernel_for_n<false>(n, k_steps, in_flight);
            MXQ_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                kSmemBytes));
            const unsigned blocks = static_cast<unsigned>(props.multiProcessorCount);
            const unsigned threads = static_cast<unsigned>(128 * warpgroups);
            const double us = time_us(
                [&](int, cudaStream_t st) {
                  kernel<<<blocks, threads, kSmemBytes, st>>>(iterations, sink);
                  MXQ_CUDA_CHECK_LAUNCH();
                },
                1, options.repeats, stream);
            const double wgmma_per_sm =
                static_cast<double>(iterations) * k_steps * static_cast<double>(warpgroups);
            nlohmann::json c;
            c["kind"] = kind;
            c["n"] = n;
            c["k"] = k;
            c["warpgroups"] = warpgroups;
            c["k_steps"] = k_steps;
            c["in_flight"] = in_flight;
            c["us"] = us;
            c["ns_per_wgmma_per_sm"] = us * 1e3 / wgmma_per_sm;
            c["tflops"] =
                2.0 * 64 * n * k * wgmma_per_sm * props.multiProcessorCount / (us * 1e-6) / 1e12;
            configs.push_back(c);
            if (progress) {
              std::fprintf(stderr,
                           "  %s n%-3d warpgroups %d k-steps %d in flight %d: %7.2f ns a wgmma "
                           "per SM, %5.0f TFLOPS\n",
                           kind.c_str(), n, warpgroups, k_steps, in_flight,
                           c["ns_per_wgmma_per_sm"].get<double>(), c["tflops"].get<double>());
            }
          }
        }
      }
    }
  }
  MXQ_CUDA_CHECK(cudaStreamSynchronize(stream));
  MXQ_CUDA_CHECK(cudaStreamDestroy(stream));
  MXQ_CUDA_CHECK(cudaFree(sink));
  result["configs"] = configs;
  return result;
}

}  // namespace mxq::bench
