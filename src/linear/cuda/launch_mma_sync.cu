// Host launcher of the mma.sync block-FP8 GEMM (the fallback for every block shape).
#include <cstdint>

#include "linear/cuda/launch.h"
#include "linear/cuda/mma_sync_gemm.cuh"
#include "mxq/core/cuda_check.h"
#include "mxq/core/error.h"

namespace mxq::linear::gpu {
namespace {

using TileM16N64K64 = kernels::MmaSyncTile<16, 64, 64, 1, 4, 6>;
using TileM64N128K64 = kernels::MmaSyncTile<64, 128, 64, 2, 4, 4>;
using TileM64N128K32 = kernels::MmaSyncTile<64, 128, 32, 2, 4, 4>;
using TileM128N128K64 = kernels::MmaSyncTile<128, 128, 64, 4, 4, 4>;

// The table in launch.h (what dispatch offers) and the compiled tiles must agree.
template <typename Tile>
constexpr bool matches(const MmaSyncShape& shape, bool f16_mma) {
  return shape.bm == Tile::kBm && shape.bn == Tile::kBn && shape.kc == Tile::kKc &&
         shape.stages == Tile::kStages && shape.threads == Tile::kThreads &&
         shape.f16_mma == f16_mma;
}
static_assert(matches<TileM16N64K64>(kMmaSyncShapes[0], false));
static_assert(matches<TileM64N128K64>(kMmaSyncShapes[1], false));
static_assert(matches<TileM64N128K32>(kMmaSyncShapes[2], false));
static_assert(matches<TileM128N128K64>(kMmaSyncShapes[3], false));
static_assert(matches<TileM64N128K64>(kMmaSyncShapes[4], true));
static_assert(matches<TileM128N128K64>(kMmaSyncShapes[5], true));

template <typename Tile, bool kVecLoad, bool kOutBf16, bool kF16Mma>
void launch_tile(const BlockFp8GemmArgs& args, cudaStream_t stream) {
  auto* kernel = &kernels::block_fp8_mma_sync_kernel<Tile, kVecLoad, kOutBf16, kF16Mma>;
  MXQ_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tile::kSmemBytes));
  const dim3 grid(static_cast<unsigned>((args.n + Tile::kBn - 1) / Tile::kBn),
                  static_cast<unsigned>((args.m + Tile::kBm - 1) / Tile::kBm));
  if (grid.y > 65535U) {
    fail(ErrorCode::kUnsupported, "mma.sync block-FP8 GEMM: M = ", args.m, " needs ", grid.y,
         " row tiles of ", Tile::kBm, "; at most 65535");
  }
  kernel<<<grid, Tile::kThreads, Tile::kSmemBytes, stream>>>(args);
  MXQ_CUDA_CHECK_LAUNCH();
}

template <typename Tile, bool kF16Mma = false>
void launch_variants(const BlockFp8GemmArgs& args, cudaStream_t stream) {
  const bool vec = mma_sync_vector_loads(args);
  if (vec && args.out_bf16) return launch_tile<Tile, true, true, kF16Mma>(args, stream);
  if (vec && !args.out_bf16) return launch_tile<Tile, true, false, kF16Mma>(args, stream);
  if (!vec && args.out_bf16) return launch_tile<Tile, false, true, kF16Mma>(args, stream);
  return launch_tile<Tile, false, false, kF16Mma>(args, stream);
}

bool aligned(const void* pointer, std::uintptr_t bytes) {
  return reinterpret_cast<std::uintptr_t>(pointer) % bytes == 0;
}

}  // namespace

std::string to_string(const MmaSyncShape& shape) {
  return detail::concat('m', shape.bm, 'n', shape.bn, 'k', shape.kc);
}

bool mma_sync_vector_loads(const BlockFp8GemmArgs& args) {
  return args.k % 16 == 0 && args.lda % 16 == 0 && args.ldw % 16 == 0 && aligned(args.a, 16) &&
         aligned(args.w, 16);
}

void launch_mma_sync(const MmaSyncShape& shape, const BlockFp8GemmArgs& args, cudaStream_t stream) {
  if (args.block_n % 16 != 0 || args.block_k % 16 != 0 || args.block_n <= 0 || args.block_k <= 0) {
    fail(ErrorCode::kInternal, "mma.sync block-FP8 GEMM: block ", args.block_n, "x", args.block_k,
         " is not a multiple of 16 (dispatch should have refused it)");
  }
  if (args.m <= 0 || args.n <= 0 || args.k <= 0) return;
  if (!aligned(args.a_scale, 4) || !aligned(args.w_scale, 4)) {
    fail(ErrorCode::kInternal, "mma.sync block-FP8 GEMM: scale tensors must be 4-byte aligned");
  }
  if (shape.f16_mma) {
    if (shape.bm == 64 && shape.bn == 128 && shape.kc == 64) {
      return launch_variants<TileM64N128K64, true>(args, stream);
    }
    if (shape.bm == 128 && shape.bn == 128 && shape.kc == 64) {
      return launch_variants<TileM128N128K64, true>(args, stream);
    }
  } else {
    if (shape.bm == 16 && shape.bn == 64 && shape.kc == 64) {
      return launch_variants<TileM16N64K64>(args, stream);
    }
    if (shape.bm == 64 && shape.bn == 128 && shape.kc == 64) {
      return launch_variants<TileM64N128K64>(args, stream);
    }
    if (shape.bm == 64 && shape.bn == 128 && shape.kc == 32) {
      return launch_variants<TileM64N128K32>(args, stream);
    }
    if (shape.bm == 128 && shape.bn == 128 && shape.kc == 64) {
      return launch_variants<TileM128N128K64>(args, stream);
    }
  }
  fail(ErrorCode::kInternal, "mma.sync block-FP8 GEMM: tile ", to_string(shape),
       " is not compiled");
}

}  // namespace mxq::linear::gpu
