// Host launcher of the Hopper (sm_90a) block-FP8 GEMM: builds the four TMA tensor maps
// (cuda/tensor_map.h) and launches a persistent grid: one CTA per SM, or as many clusters as fit.
#include <cuda.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>

#include "cuda_common/tensor_map.h"
#include "linear/cuda/launch.h"
#include "linear/cuda/tile_schedule.h"
#include "linear/cuda/wgmma_gemm.cuh"
#include "mxq/core/cuda_check.h"
#include "mxq/core/error.h"

namespace mxq::linear::gpu {
namespace {

bool aligned(const void* pointer, std::uintptr_t bytes) {
  return reinterpret_cast<std::uintptr_t>(pointer) % bytes == 0;
}

void require(bool condition, const char* what) {
  if (!condition) {
    fail(ErrorCode::kInternal, "sm90 wgmma block-FP8 GEMM: ", what,
         " (dispatch should have refused this problem)");
  }
}

// Blocks (or clusters of blocks) of the kernel that fit on the device at once: one block per SM,
// and for clusters what the GPCs can place (on H100/H200 fewer than SMs / 2 pairs of 217 KB
// blocks may fit). Asked once per kernel and device.
template <typename Tile, typename Kernel>
long long resident_units(Kernel kernel, const cudaLaunchConfig_t& config) {
  int device = 0;
  MXQ_CUDA_CHECK(cudaGetDevice(&device));
  int sms = 0;
  MXQ_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  if constexpr (Tile::kClusterBlocks == 1) {
    return sms;
  } else {
    constexpr int kMaxDevices = 64;
    static std::array<std::atomic<int>, kMaxDevices> cached{};  // 0: not asked yet
    if (device < kMaxDevices) {
      if (const int known = cached[static_cast<std::size_t>(device)].load(); known > 0) {
        return known;
      }
    }
    cudaLaunchConfig_t probe = config;
    probe.gridDim = dim3(static_cast<unsigned>(sms / Tile::kClusterBlocks * Tile::kClusterBlocks));
    int clusters = 0;
    MXQ_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&clusters, kernel, &probe));
    if (clusters <= 0) {
      fail(ErrorCode::kInternal, "sm90 wgmma block-FP8 GEMM: no cluster of ", Tile::kClusterBlocks,
           " blocks with ", Tile::kSmemBytes, " bytes of shared memory fits on device ", device);
    }
    if (device < kMaxDevices) cached[static_cast<std::size_t>(device)].store(clusters);
    return clusters;
  }
}

// The launch configuration of a tile's kernel without its grid; `cluster` (the cluster-dimension
// attribute the configuration points to) must outlive it.
template <typename Tile, typename Kernel>
cudaLaunchConfig_t launch_config(Kernel kernel, cudaStream_t stream, cudaLaunchAttribute& cluster) {
  MXQ_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tile::kSmemBytes));
  cudaLaunchConfig_t config{};
  config.blockDim = dim3(Tile::kThreads);
  config.dynamicSmemBytes = Tile::kSmemBytes;
  config.stream = stream;
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = Tile::kClusterBlocks;
  cluster.val.clusterDim.y = 1;
  cluster.val.clusterDim.z = 1;
  if constexpr (Tile::kClusterBlocks > 1) {
    config.attrs = &cluster;
    config.numAttrs = 1;
  }
  return config;
}

template <typename Tile>
void launch_tile(const BlockFp8GemmArgs& args, cudaStream_t stream) {
  const int k_groups = (args.k + args.block_k - 1) / args.block_k;
  const int a_rows = Tile::stage_rows(args.m);
  const CUtensorMap map_a = tma::make_2d(
      CU_TENSOR_MAP_DATA_TYPE_UINT8, args.a, static_cast<std::uint64_t>(args.m),
      static_cast<std::uint64_t>(args.k), static_cast<std::uint64_t>(args.lda),
      static_cast<std::uint32_t>(a_rows / Tile::kCluster), 128, CU_TENSOR_MAP_SWIZZLE_128B,
      "activations");  // a cluster's blocks each load their share of the rows
  const CUtensorMap map_w =
      tma::make_2d(CU_TENSOR_MAP_DATA_TYPE_UINT8, args.w, static_cast<std::uint64_t>(args.n),
                   static_cast<std::uint64_t>(args.k), static_cast<std::uint64_t>(args.ldw),
                   Tile::kBn, 128, CU_TENSOR_MAP_SWIZZLE_128B, "weights");
  const CUtensorMap map_a_scale = tma::make_2d(
      CU_TENSOR_MAP_DATA_TYPE_FLOAT32, args.a_scale, static_cast<std::uint64_t>(k_groups),
      static_cast<std::uint64_t>(args.m), static_cast<std::uint64_t>(args.a_scale_ld) * 4,
      Tile::kKSplit, static_cast<std::uint32_t>(a_rows), CU_TENSOR_MAP_SWIZZLE_NONE,
      "activation scales");
  const CUtensorMap map_out = tma::make_2d(
      CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, args.out, static_cast<std::uint64_t>(args.m),
      static_cast<std::uint64_t>(args.n), static_cast<std::uint64_t>(args.ldo) * 2, 64,
      Tile::kStoreBoxCols,
      Tile::kSwizzledStore ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE, "output");

  WgmmaGemmArgs kernel_args;
  kernel_args.m = args.m;
  kernel_args.n = args.n;
  kernel_args.k = args.k;
  kernel_args.block_n = args.block_n;
  kernel_args.block_k = args.block_k;
  kernel_args.w_scale = args.w_scale;
  kernel_args.w_scale_ld = args.w_scale_ld;
  kernel_args.a_rows = a_rows;
  kernel_args.bias_f32 = args.bias_f32;
  kernel_args.bias_bf16 = args.bias_bf16;

  auto* kernel = &kernels::block_fp8_wgmma_kernel<Tile>;
  const long long units =
      TileSchedule(args.m, args.n, Tile::kBm, Tile::kBn, Tile::kCluster).units();
  cudaLaunchAttribute cluster{};
  cudaLaunchConfig_t config = launch_config<Tile>(kernel, stream, cluster);
  // Persistent: as many blocks (clusters) as can be resident at once, at most one per unit.
  const long long resident = resident_units<Tile>(kernel, config);
  config.gridDim =
      dim3(static_cast<unsigned>((units < resident ? units : resident) * Tile::kClusterBlocks));
  MXQ_CUDA_CHECK(
      cudaLaunchKernelEx(&config, kernel, map_a, map_w, map_a_scale, map_out, kernel_args));
}

// Facts every instantiation relies on (dispatch checks them first; see device_ops.cpp).
void require_common(const BlockFp8GemmArgs& args) {
  require(args.out_bf16, "output must be bf16");
  require(args.n % 16 == 0 && args.k % 16 == 0, "N % 16 == 0 and K % 16 == 0");
  require(args.lda % 16 == 0 && args.ldw % 16 == 0 && args.ldo % 8 == 0,
          "16-byte row strides of A, W and the output");
  require(args.a_scale_ld % 4 == 0 && args.a_scale_ld >= args.m,
          "activation scale rows padded to a multiple of 4");
  require(aligned(args.a, 16) && aligned(args.w, 16) && aligned(args.out, 16) &&
              aligned(args.a_scale, 16),
          "16-byte aligned A, W, scales and output");
}

// One tile shape with the block-dependent template arguments chosen at run time.
template <int kBm, int kBn, int kStages, bool kOverlap>
void launch_any_block(const BlockFp8GemmArgs& args, cudaStream_t stream) {
  const int n_split = args.block_n % kBn == 0 ? 1 : kBn / args.block_n;
  require(n_split == 1 || (n_split == 2 && args.block_n * 2 == kBn),
          "weight block N a multiple of the tile width or half of it");
  if (args.block_k == 128) {
    if (n_split == 1)
      return launch_tile<kernels::WgmmaTile<kBm, kBn, kStages, kOverlap, 1, 1>>(args, stream);
    if constexpr (kBn == 128) {
      return launch_tile<kernels::WgmmaTile<kBm, kBn, kStages, kOverlap, 1, 2>>(args, stream);
    }
  }
  if (args.block_k == 64) {
    if (n_split == 1)
      return launch_tile<kernels::WgmmaTile<kBm, kBn, kStages, kOverlap, 2, 1>>(args, stream);
    if constexpr (kBn == 128) {
      return launch_tile<kernels::WgmmaTile<kBm, kBn, kStages, kOverlap, 2, 2>>(args, stream);
    }
  }
  fail(ErrorCode::kInternal, "sm90 wgmma block-FP8 GEMM: block ", args.block_n, "x", args.block_k,
       " is not compiled for tile m", kBm, "n", kBn);
}

template <typename Tile>
constexpr WgmmaShape shape_of() {
  return {Tile::kBm, Tile::kBn, Tile::kStages, Tile::kOverlap, Tile::kCluster, Tile::kSplitK};
}

// Visits each Tile whose own constants equal `shape` (as a whole value: stages, cluster and split
// included, so a shape never runs another shape's kernel); true when one did.
template <typename... Tiles, typename Visit>
bool visit_matching(const WgmmaShape& shape, Visit& visit) {
  return ((shape == shape_of<Tiles>() ? (visit.template operator()<Tiles>(), true) : false) || ...);
}

// The kernels compiled for kWgmmaShapes (launch.h).
template <typename Visit>
bool visit_fast_tile(const WgmmaShape& shape, Visit&& visit) {
  using kernels::WgmmaTile;
  return visit_matching<
      WgmmaTile<64, 64, 8>, WgmmaTile<64, 128, 8>, WgmmaTile<128, 128, 5>,
      WgmmaTile<64, 128, 8, true>, WgmmaTile<128, 128, 5, true>, WgmmaTile<64, 32, 16>,
      WgmmaTile<64, 16, 16>, WgmmaTile<256, 128, 3>, WgmmaTile<256, 128, 3, false, 1, 1, 2>,
      WgmmaTile<64, 64, 8, false, 1, 1, 1, 2>, WgmmaTile<64, 64, 8, false, 1, 1, 1, 4>,
      WgmmaTile<64, 128, 6, true, 1, 1, 1, 2>, WgmmaTile<64, 128, 6, true, 1, 1, 1, 4>,
      WgmmaTile<128, 128, 4, true, 1, 1, 1, 2>, WgmmaTile<128, 64, 8>, WgmmaTile<64, 32, 16, true>,
      WgmmaTile<128, 112, 5, false, 1, 2>, WgmmaTile<256, 112, 3, false, 1, 2>>(shape, visit);
}

// The tiles compiled for kWgmmaAnyBlockShapes, in their 128x128-block form, whose constants
// launch_any_block takes.
template <typename Visit>
bool visit_any_block_tile(const WgmmaShape& shape, Visit&& visit) {
  using kernels::WgmmaTile;
  return visit_matching<WgmmaTile<64, 64, 8>, WgmmaTile<64, 128, 8>, WgmmaTile<128, 128, 5>,
                        WgmmaTile<64, 128, 8, true>, WgmmaTile<128, 128, 5, true>,
                        WgmmaTile<256, 128, 3>, WgmmaTile<64, 32, 16>, WgmmaTile<64, 16, 16>,
                        WgmmaTile<64, 32, 16, true>, WgmmaTile<64, 16, 16, true>>(shape, visit);
}

}  // namespace

std::string to_string(const WgmmaShape& shape) {
  return detail::concat(
      'm', shape.bm, 'n', shape.bn, shape.overlap ? "_overlap" : "",
      shape.cluster > 1 ? detail::concat("_x", shape.cluster) : std::string(),
      shape.split_k > 1 ? detail::concat("_splitk", shape.split_k) : std::string());
}

void launch_wgmma(const WgmmaShape& shape, const BlockFp8GemmArgs& args, cudaStream_t stream) {
  require_common(args);
  require(args.block_n == 128 && args.block_k == 128, "block must be 128x128");
  require(args.k % 128 == 0, "K % 128 == 0");
  if (args.m <= 0 || args.n <= 0 || args.k <= 0) return;
  const bool compiled =
      visit_fast_tile(shape, [&]<typename Tile>() { launch_tile<Tile>(args, stream); });
  if (!compiled) {
    fail(ErrorCode::kInternal, "sm90 wgmma block-FP8 GEMM: tile ", to_string(shape),
         " is not compiled");
  }
}

void launch_wgmma_any_block(const WgmmaShape& shape, const BlockFp8GemmArgs& args,
                            cudaStream_t stream) {
  require_common(args);
  if (args.m <= 0 || args.n <= 0 || args.k <= 0) return;
  const bool compiled = visit_any_block_tile(shape, [&]<typename Tile>() {
    launch_any_block<Tile::kBm, Tile::kBn, Tile::kStages, Tile::kOverlap>(args, stream);
  });
  if (!compiled) {
    fail(ErrorCode::kInternal, "sm90 wgmma block-FP8 GEMM (any block): tile ", to_string(shape),
         " is not compiled");
  }
}

bool wgmma_tile_compiled(const WgmmaShape& shape) {
  // [&]: a lambda with a capture default has no conversion to a function pointer, on whose
  // unused template parameter nvcc warns.
  return visit_fast_tile(shape, [&]<typename Tile>() {});
}

long long resident_wgmma_units(const WgmmaShape& shape) {
  long long resident = 0;
  const bool compiled = visit_fast_tile(shape, [&]<typename Tile>() {
    auto* kernel = &kernels::block_fp8_wgmma_kernel<Tile>;
    cudaLaunchAttribute cluster{};
    const cudaLaunchConfig_t config = launch_config<Tile>(kernel, nullptr, cluster);
    resident = resident_units<Tile>(kernel, config);
  });
  if (!compiled) {
    fail(ErrorCode::kInternal, "sm90 wgmma block-FP8 GEMM: tile ", to_string(shape),
         " is not compiled");
  }
  return resident;
}

bool wgmma_any_block_tile_compiled(const WgmmaShape& shape) {
  // [&]: a lambda with a capture default has no conversion to a function pointer, on whose
  // unused template parameter nvcc warns.
  return visit_any_block_tile(shape, [&]<typename Tile>() {});
}

}  // namespace mxq::linear::gpu
