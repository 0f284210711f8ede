// `mxq bench tma-stream` (tma_stream.h): one producer thread streams boxes of a weight matrix
// into a shared-memory ring, one consumer thread hands each stage back once it has landed.
#include "tma_stream.h"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>

#include "cuda_common/mbarrier.cuh"
#include "cuda_common/smem.cuh"
#include "cuda_common/tensor_map.h"
#include "cuda_common/tma.cuh"
#include "graph_timing.h"
#include "mxq/core/cuda_check.h"
#include "mxq/core/error.h"
#include "mxq/core/tensor.h"
#include "read_floor.h"
#include "require_gpu.h"

namespace mxq::bench {
namespace {

constexpr std::int64_t kWorkingSetBytes = 120LL << 20;  // > 2x the H200's 50 MB L2
constexpr int kMaxSets = 16;
constexpr int kMaxSmemBytes = 232448;  // per block on sm_90
constexpr int kSmemSlack = 1024;       // the ring's 1024-byte alignment (swizzle-128B atoms)

struct StreamArgs {
  int tiles = 0;   // ceil(N / rows)
  int steps = 0;   // boxes along K per tile: ceil(K / row_bytes / depth)
  int rows = 0;    // rows of a W box
  int depth = 0;   // K-blocks of a box
  int stages = 0;  // ring depth
  int w_box_bytes = 0;
  int a_box_bytes = 0;  // 0: no second box
  int stage_bytes = 0;
};

__global__ void __launch_bounds__(64, 1)
    tma_stream_kernel(const __grid_constant__ CUtensorMap map_w,
                      const __grid_constant__ CUtensorMap map_a, const StreamArgs args) {
  extern __shared__ __align__(1024) std::uint8_t smem_raw[];
  const std::uint32_t raw_addr = ptx::smem_addr(smem_raw);
  std::uint8_t* smem = smem_raw + ((1024U - (raw_addr & 1023U)) & 1023U);
  auto* full = reinterpret_cast<std::uint64_t*>(smem + args.stages * args.stage_bytes);
  std::uint64_t* empty = full + args.stages;
  if (threadIdx.x == 0) {
    for (int s = 0; s < args.stages; ++s) {
      ptx::mbarrier_init(&full[s], 1);
      ptx::mbarrier_init(&empty[s], 1);
    }
    ptx::fence_barrier_init();
    ptx::fence_proxy_async_shared();
  }
  __syncthreads();
  if (threadIdx.x == 0) {  // the producer
    ptx::prefetch_tensor_map(&map_w);
    if (args.a_box_bytes > 0) ptx::prefetch_tensor_map(&map_a);
    int it = 0;
    for (int tile = static_cast<int>(blockIdx.x); tile < args.tiles;
         tile += static_cast<int>(gridDim.x)) {
      for (int step = 0; step < args.steps; ++step, ++it) {
        const int s = it % args.stages;
        const std::uint32_t phase = static_cast<std::uint32_t>(it / args.stages) & 1U;
        ptx::mbarrier_wait(&empty[s], phase ^ 1U);
        ptx::mbarrier_arrive_expect_tx(
            &full[s], static_cast<std::uint32_t>(args.w_box_bytes + args.a_box_bytes));
        std::uint8_t* stage = smem + s * args.stage_bytes;
        ptx::tma_load_3d(stage, &map_w, &full[s], 0, tile * args.rows, step * args.depth);
        if (args.a_box_bytes > 0) {
          ptx::tma_load_3d(stage + args.w_box_bytes, &map_a, &full[s], 0, 0, step * args.depth);
        }
      }
    }
  } else if (threadIdx.x == 32) {  // the consumer: each stage back as soon as it landed
    int it = 0;
    for (int tile = static_cast<int>(blockIdx.x); tile < args.tiles;
         tile += static_cast<int>(gridDim.x)) {
      for (int step = 0; step < args.steps; ++step, ++it) {
        const int s = it % args.stages;
        ptx::mbarrier_wait(&full[s], static_cast<std::uint32_t>(it / args.stages) & 1U);
        ptx::mbarrier_arrive(&empty[s]);
      }
    }
  }
}

// A [rows, k] byte matrix seen as [k / row_bytes blocks][rows][row_bytes], read in boxes of
// box_rows x row_bytes x depth blocks, swizzled as a GEMM's operands are (64-byte rows 64B, as the
// MoE weights; 128-byte rows 128B, as the linear's).
CUtensorMap blocked_map(const void* base, int rows, int k, int box_rows, int depth, int row_bytes,
                        const char* what) {
  const auto inner = static_cast<std::uint64_t>(row_bytes);
  const std::uint64_t dims[3] = {inner, static_cast<std::uint64_t>(rows),
                                 static_cast<std::uint64_t>(k) / inner};
  const std::uint64_t strides[2] = {static_cast<std::uint64_t>(k), inner};
  const std::uint32_t box[3] = {static_cast<std::uint32_t>(row_bytes),
                                static_cast<std::uint32_t>(box_rows),
                                static_cast<std::uint32_t>(depth)};
  return tma::make_3d(CU_TENSOR_MAP_DATA_TYPE_UINT8, base, dims, strides, box,
                      row_bytes == 64 ? CU_TENSOR_MAP_SWIZZLE_64B : CU_TENSOR_MAP_SWIZZLE_128B,
                      what);
}

}  // namespace

nlohmann::json run_tma_stream(const TmaStreamOptions& options, bool progress) {
  check_tma_stream_options(options);
  require_gpu("tma-stream");
  cudaDeviceProp props{};
  MXQ_CUDA_CHECK(cudaGetDeviceProperties(&props, 0));
  const Device gpu = Device::cuda(0);
  const std::int64_t w_bytes = static_cast<std::int64_t>(options.n) * options.k;
  const int sets = static_cast<int>(
      std::clamp<std::int64_t>((kWorkingSetBytes + w_bytes - 1) / w_bytes, 1, kMaxSets));
  std::vector<Tensor> weights;
  for (int s = 0; s < sets; ++s) {
    weights.push_back(Tensor::empty(DType::kU8, {options.n, options.k}, gpu));
    MXQ_CUDA_CHECK(cudaMemset(weights.back().data(), 0x38 + s, static_cast<std::size_t>(w_bytes)));
  }
  const int max_a_rows = *std::max_element(options.a_rows.begin(), options.a_rows.end());
  Tensor a = Tensor::empty(DType::kU8, {std::max(max_a_rows, 8), options.k}, gpu);
  MXQ_CUDA_CHECK(cudaMemset(a.data(), 0x38, static_cast<std::size_t>(a.nbytes())));
  cudaStream_t stream = nullptr;
  MXQ_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  MXQ_CUDA_CHECK(cudaFuncSetAttribute(tma_stream_kernel,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxSmemBytes));

  nlohmann::json result;
  result["gpu"] = props.name;
  result["sm_count"] = props.multiProcessorCount;
  result["n"] = options.n;
  result["k"] = options.k;
  result["bytes"] = static_cast<double>(w_bytes);
  result["input_sets"] = sets;
  result["method"] =
      "one producer thread issues 3-D TMA boxes (rows x row_bytes x depth K-blocks, swizzle 64B or "
      "128B as row_bytes) "
      "into a ring; one consumer thread hands each stage back once it landed; one block per SM, "
      "persistent over the row tiles; CUDA graph per launch, sets rotated past the L2; median";
  // The plain read floor of the same bytes (16-byte loads, read_floor.h).
  std::vector<ReadPasses> floor_sets;
  for (const Tensor& w : weights) {
    floor_sets.push_back({{DeviceRange{w.data(), static_cast<std::size_t>(w_bytes)}}});
  }
  const ReadFloor floor = time_read_floor(floor_sets, options.repeats, stream, [] {});
  result["read_floor"] = {{"total_us", floor.total_us},
                          {"gbps", static_cast<double>(w_bytes) / (floor.total_us * 1e-6) / 1e9},
                          {"blocks_per_sm", floor.blocks_per_sm}};
  if (progress) {
    std::fprintf(stderr, "  N=%d K=%d read floor (16-byte loads) %9.1f us\n", options.n, options.k,
                 floor.total_us);
  }

  nlohmann::json configs = nlohmann::json::array();
  for (const int row_bytes : options.row_bytes) {
    for (const int rows : options.rows) {
      for (const int depth : options.depth) {
        for (const int a_rows : options.a_rows) {
          for (const int stages : options.stages) {
            StreamArgs args;
            args.rows = rows;
            args.depth = depth;
            args.stages = stages;
            args.tiles = (options.n + rows - 1) / rows;
            args.steps = (options.k / row_bytes + depth - 1) / depth;
            args.w_box_bytes = rows * row_bytes * depth;
            args.a_box_bytes = a_rows * row_bytes * depth;
            args.stage_bytes = args.w_box_bytes + args.a_box_bytes;
            const int smem = stages * args.stage_bytes + 16 * stages + kSmemSlack;
            if (smem > kMaxSmemBytes) continue;  // this ring does not fit
            std::vector<CUtensorMap> w_maps;
            for (const Tensor& w : weights) {
              w_maps.push_back(
                  blocked_map(w.data(), options.n, options.k, rows, depth, row_bytes, "weights"));
            }
            const CUtensorMap a_map =
                blocked_map(a.data(), std::max(a_rows, 8), options.k, std::max(a_rows, 8), depth,
                            row_bytes, "activations");
            const unsigned blocks =
                static_cast<unsigned>(std::min(args.tiles, props.multiProcessorCount));
            const double us = time_us(
                [&](int s, cudaStream_t st) {
                  tma_stream_kernel<<<blocks, 64, static_cast<std::size_t>(smem), st>>>(
                      w_maps[static_cast<std::size_t>(s)], a_map, args);
                  MXQ_CUDA_CHECK_LAUNCH();
                },
                sets, options.repeats, stream);
            nlohmann::json c;
            c["row_bytes"] = row_bytes;
            c["rows"] = rows;
            c["depth"] = depth;
            c["a_rows"] = a_rows;
            c["stages"] = stages;
            c["blocks"] = blocks;
            c["bytes_in_flight_per_block"] = stages * args.w_box_bytes;
            c["us"] = us;
            c["gbps"] = static_cast<double>(w_bytes) / (us * 1e-6) / 1e9;
            c["over_read_floor"] = us / floor.total_us;
            configs.push_back(c);
            if (progress) {
              std::fprintf(stderr,
                           "  %3d-byte rows: rows %3d depth %d a_rows %3d stages %2d (%3u blocks) "
                           "%9.1f us %6.0f GB/s\n",
                           row_bytes, rows, depth, a_rows, stages, blocks, us,
                           c["gbps"].get<double>());
            }
          }
        }
      }
    }
  }
  MXQ_CUDA_CHECK(cudaStreamSynchronize(stream));
  MXQ_CUDA_CHECK(cudaStreamDestroy(stream));
  result["configs"] = configs;
  return result;
}

}  // namespace mxq::bench
