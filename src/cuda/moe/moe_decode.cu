// The decode-regime MXFP4 MoE forward: see include/mxq/moe/cuda_moe.h for the pipeline. The
// launchers and the host API of every GEMM variant; the register-streaming GEMMs' device code is
// in gemm_register_stream.cuh, the single-token GEMM1 in gemm1_single_token.cuh.
#include <cuda_bf16.h>

#include <algorithm>
#include <array>
#include <type_traits>
#include <vector>

#include "block_trace.cuh"
#include "bulk_copy.cuh"
#include "cuda/tensor_map.h"
#include "gemm1_single_token.cuh"
#include "gemm_common.cuh"
#include "gemm_register_stream.cuh"
#include "gemm_wgmma.cuh"
#include "gemm_wide.cuh"
#include "mxfp4_mma.cuh"
#include "mxq/core/cuda_check.h"
#include "mxq/core/error.h"
#include "mxq/formats/fp8_block_scale.h"
#include "mxq/moe/cuda_moe.h"
#include "mxq/moe/cuda_moe_trace.h"
#include "pdl.cuh"
#include "routing.cuh"
#include "row_groups.h"
#include "w4a8_layout.h"
#include "w4a8_mma.cuh"
#include "workspace.cuh"

namespace mxq::moe::cuda {
namespace {

bool w4a8(const MoeParams& p) { return p.activation_quant == GpuActivationQuant::kFp8Group128; }

using detail::allow_dependents;
using detail::gemm1_single_token_kernel;
using detail::gemm1_swiglu_kernel;
using detail::gemm2_kernel;
using detail::GemmArgs;
using detail::kChunk;
using detail::kGemm2Tiles;
using detail::kGemmWarps;
using detail::kSingleTokenMaxRouterExperts;
using detail::kStreamBlocksPerSm;
using detail::kTileRows;
using detail::launch;
using detail::wait_for_predecessor;
using detail::Workspace;

// ---- 3/4 (v3). grouped GEMMs on weight tiles staged in shared memory ----------------------
// One block = 16 weight rows x the whole K x one tile of <= 8 tokens. The 16 rows are fetched
// with bulk asynchronous copies, each K stage of 8 chunks completing on its own mbarrier, so a
// block has its whole tile (23 KB at K = 2880) in flight without registers and starts computing
// as soon as the first stage lands; 8 blocks per SM keep ~180 KB in flight. GEMM1 takes 8
// channels per block: mma rows 0..7 are their gate rows, 8..15 their up rows, so each lane holds
// gate and up of the same (channel, token) and SwiGLU needs no exchange. Shared memory holds the
// rows as their row groups do (row_groups.h: chunk q at q * 1024, row i of a chunk of nb blocks
// at i * nb * 16), so each half tile (8 rows, a half group) of a chunk is one contiguous copy,
// and lane (r, c), reading MX block c of rows r and r + 8, meets the other lanes of its
// quarter-warp (rows 2q, 2q + 1, blocks 0..3) in 128 contiguous bytes: no bank conflicts. Words
// are decoded into natural bf16x2 pairs, which meet the activations' words as they lie.
constexpr int kStageK = 1024;  // K values per bulk-copy stage (a multiple of kChunk)
constexpr int kMaxStages = 16;
constexpr int kTileMaxK = kStageK * kMaxStages;
constexpr int kTileBlocksPerSm = 8;

// GEMM1 (w13, K = H) or GEMM2 (w2, K = I) geometry, the same on host and device.
struct TileShape {
  int k;           // K values
  int stored_k;    // values per stored weight row (GEMM2: the padded P)
  int chunks;      // 128-wide chunks of K
  int scale_row;   // global (and smem) bytes per scale row: moe_scale_pitch
  int smem_bytes;  // dynamic shared memory: the weights' chunks, then the scales
};

__host__ __device__ inline TileShape tile_shape(const MoeDeviceWeights& w, bool gemm1) {
  TileShape t{};
  t.k = detail::streamed_k(w, gemm1);
  t.stored_k = detail::stored_row_k(w, gemm1);
  t.chunks = (t.k + kChunk - 1) / kChunk;
  t.scale_row = moe_scale_pitch(t.stored_k);
  t.smem_bytes = t.chunks * detail::kGroupChunkBytes + (kTileRows * t.scale_row + 15) / 16 * 16;
  return t;
}

template <bool kGemm1>
__global__ void __launch_bounds__(kGemmWarps * 32, kTileBlocksPerSm)
    gemm_tile_kernel(GemmArgs args) {
  wait_for_predecessor();
  const int tile = blockIdx.y;
  if (tile >= *args.ws.num_tiles) return;
  extern __shared__ __align__(128) std::uint8_t tile_smem[];
  __shared__ __align__(8) std::uint64_t stage_bar[kMaxStages];
  __shared__ float red[(kGemmWarps - 1) * 4 * 32];
  const TileShape shape = tile_shape(args.w, kGemm1);
  std::uint8_t* sw = tile_smem;
  std::uint8_t* ss = tile_smem + shape.chunks * detail::kGroupChunkBytes;
  const auto [expert, slot0, rows] = detail::read_work_tile(args.ws, tile);
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;

  // Global row of smem row i: GEMM1 gate rows ch0..ch0+7 then their up rows; GEMM2 h0..h0+15.
  const int P = args.w.inter_padded;
  const std::size_t first_row =
      kGemm1 ? static_cast<std::size_t>(expert) * 2 * P + blockIdx.x * (kTileRows / 2)
             : static_cast<std::size_t>(expert) * args.w.hidden + blockIdx.x * kTileRows;
  const auto global_row = [&](int i) -> std::size_t {
    if (kGemm1) return first_row + (i < 8 ? i : P + i - 8);
    return first_row + i;
  };
  const std::uint8_t* weights = kGemm1 ? args.w.w13 : args.w.w2;
  const std::uint8_t* scales = kGemm1 ? args.w.w13_scale : args.w.w2_scale;
  const int stages = (shape.k + kStageK - 1) / kStageK;
  // Bytes of 8 rows of chunk q as stored (a full chunk of the stored rows even where K ends
  // inside it: GEMM2's padding, zeros).
  const auto half_chunk_bytes = [&](int q) {
    return 8 * 16 * detail::chunk_blocks(shape.stored_k, q);
  };

  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s) detail::mbarrier_init(&stage_bar[s], 1);
    detail::fence_barrier_init();
    for (int s = 0; s < stages; ++s) {
      std::uint32_t bytes = 0;
      for (int q = s * (kStageK / kChunk); q < min((s + 1) * (kStageK / kChunk), shape.chunks); ++q)
        bytes += 2 * half_chunk_bytes(q);
      detail::mbarrier_arrive_expect_tx(&stage_bar[s], bytes);
    }
  }
  __syncthreads();
  for (int item = threadIdx.x; item < 2 * shape.chunks; item += blockDim.x) {
    const int half = item % 2;
    const int q = item / 2;
    const std::uint32_t bytes = half_chunk_bytes(q);
    detail::bulk_copy_g2s(
        detail::smem_addr(sw + q * detail::kGroupChunkBytes + half * bytes),
        weights + detail::grouped_block_offset(global_row(8 * half), shape.stored_k, q * kChunk),
        bytes, detail::smem_addr(&stage_bar[q * kChunk / kStageK]));
  }
  // Scales (1/16 of the bytes) by ordinary 8-byte loads: rows of 8 consecutive channels are
  // contiguous and 8-byte aligned (GEMM1: two such regions; GEMM2: one of 16 rows).
  {
    constexpr int kRegions = kGemm1 ? 2 : 1;
    const int region_words = (kTileRows / kRegions) * shape.scale_row / 8;
    for (int q = threadIdx.x; q < kRegions * region_words; q += blockDim.x) {
      const int g = q / region_words;
      const int j = q % region_words;
      const std::uint8_t* src = scales + global_row(g * 8) * shape.scale_row;
      reinterpret_cast<uint2*>(ss + g * (kTileRows / kRegions) * shape.scale_row)[j] =
          __ldg(reinterpret_cast<const uint2*>(src) + j);
    }
  }
  __syncthreads();

  const int r = lane / 4;
  const int c = lane % 4;
  const int n = lane / 4;  // this lane's token column of the B operand
  const std::uint16_t* brow = nullptr;
  if (n < rows) {
    brow = kGemm1 ? args.x + static_cast<std::size_t>(args.ws.slot_pair[slot0 + n] / args.top_k) *
                                 args.w.hidden
                  : reinterpret_cast<const std::uint16_t*>(args.ws.act) +
                        static_cast<std::size_t>(slot0 + n) * args.w.inter;
  }
  float acc[1][4] = {};
  for (int ch = warp; ch < shape.chunks; ch += kGemmWarps) {
    const int k0 = ch * kChunk + 32 * c;
    const bool has_block = k0 < shape.k;
    const int chunk_row_bytes = 16 * detail::chunk_blocks(shape.stored_k, ch);
    uint4 xv[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      xv[i] = has_block && brow != nullptr ? __ldg(reinterpret_cast<const uint4*>(brow + k0) + i)
                                           : make_uint4(0, 0, 0, 0);
    }
    detail::mbarrier_wait_parity(detail::smem_addr(&stage_bar[ch * kChunk / kStageK]), 0);
    uint4 wv[1][2];
    std::uint32_t sc[1][2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      wv[0][h] = has_block ? *reinterpret_cast<const uint4*>(sw + ch * detail::kGroupChunkBytes +
                                                             (r + 8 * h) * chunk_row_bytes + 16 * c)
                           : make_uint4(0, 0, 0, 0);
      sc[0][h] = has_block ? ss[(r + 8 * h) * shape.scale_row + k0 / 32] : 127U;
    }
    if (detail::warp_any_wide_scale(sc)) {
      detail::mma_mx_chunk<1, true>(wv, sc, xv, acc);
    } else {
      detail::mma_mx_chunk<1, false>(wv, sc, xv, acc);
    }
  }
  allow_dependents();
  // Split-K sum in warp order (deterministic).
  if (warp != 0) {
#pragma unroll
    for (int i = 0; i < 4; ++i) red[((warp - 1) * 4 + i) * 32 + lane] = acc[0][i];
  }
  __syncthreads();
  if (warp != 0) return;
  for (int w = 1; w < kGemmWarps; ++w)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[0][i] += red[((w - 1) * 4 + i) * 32 + lane];

  if constexpr (kGemm1) {
    const int channel = blockIdx.x * (kTileRows / 2) + r;
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      const int col = 2 * c + q;
      if (col < rows)
        detail::store_gemm1(args, detail::load_gemm1_bias(args, expert, channel), channel,
                            slot0 + col, acc[0][q], acc[0][2 + q]);
    }
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int col = 2 * c + (i & 1);
      const int row = blockIdx.x * kTileRows + r + (i >= 2 ? 8 : 0);
      if (col < rows)
        detail::store_gemm2(args, detail::load_gemm2_bias(args, expert, row), row, slot0 + col,
                            acc[0][i]);
    }
  }
}

// The TMA views of the wgmma GEMMs' operands (WgmmaMaps): the activations by slot ([T * k, H] for
// GEMM1, [T * k, I] for GEMM2) in boxes of 64 slots x 64 values, the packed weights (w13 E * 2P
// rows of H values, w2 E * H rows of P values) in their row groups.
detail::WgmmaMaps wgmma_maps(const GemmArgs& args, bool gemm1, int tokens) {
  const MoeDeviceWeights& w = args.w;
  const auto experts = static_cast<std::uint64_t>(w.num_local_experts);
  const std::uint64_t slots = static_cast<std::uint64_t>(tokens) * args.top_k;
  const std::uint64_t k = detail::streamed_k(w, gemm1);
  detail::WgmmaMaps maps;
  maps.x = tma::make_2d(CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
                        gemm1 ? static_cast<const void*>(args.ws.x_wgmma) : args.ws.act, slots, k,
                        k * 2, 64, 64, CU_TENSOR_MAP_SWIZZLE_128B, "MoE wgmma activations");
  // The weights' row groups (row_groups.h): full chunks as [groups][16 * chunks][64 B], the short
  // last chunk as [groups][16][nb * 16 B] from its offset in every group.
  const std::uint64_t groups =
      (gemm1 ? experts * 2 * w.inter_padded : experts * w.hidden) / detail::kGroupRows;
  const int stored_k = detail::stored_row_k(w, gemm1);
  const std::uint64_t group_bytes = detail::kGroupRows * static_cast<std::uint64_t>(stored_k / 2);
  const std::uint64_t full_chunks = stored_k / detail::kLayoutChunk;
  const int short_blocks = detail::chunk_blocks(stored_k, static_cast<int>(full_chunks));
  const std::uint8_t* weights = gemm1 ? w.w13 : w.w2;
  constexpr std::uint32_t kBoxGroups = detail::kWgmmaWBoxGroups;
  // With no full chunk (K < 128) the map is never read; it still needs a valid shape.
  maps.w = tma::make_3d(
      CU_TENSOR_MAP_DATA_TYPE_UINT8, weights,
      {detail::kChunkBytes, detail::kGroupRows * std::max<std::uint64_t>(full_chunks, 1), groups},
      {detail::kChunkBytes, group_bytes}, {detail::kChunkBytes, detail::kGroupRows, kBoxGroups},
      CU_TENSOR_MAP_SWIZZLE_64B, "MoE wgmma weights");
  if (short_blocks > 0) {
    const auto row_bytes = static_cast<std::uint32_t>(16 * short_blocks);
    maps.w_short = tma::make_3d(CU_TENSOR_MAP_DATA_TYPE_UINT8,
                                weights + full_chunks * detail::kGroupChunkBytes,
                                {row_bytes, detail::kGroupRows, groups}, {row_bytes, group_bytes},
                                {row_bytes, detail::kGroupRows, kBoxGroups},
                                CU_TENSOR_MAP_SWIZZLE_NONE, "MoE wgmma weights (short last chunk)");
  }
  return maps;
}

// SMs of the current device (a cached attribute: cheap, and legal while a graph is captured).
int sm_count() {
  int device = 0;
  int sms = 0;
  MXQ_CUDA_CHECK(cudaGetDevice(&device));
  MXQ_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return sms;
}

// The single-token GEMM1's grid for up to max_tiles chosen experts: one wave of `resident`
// blocks, but no more blocks than tiles (a range is at least a tile long: a tile has two parts at
// most) and no fewer than half the tiles (a range is at most two tiles long: three pieces at
// most); 0 when that needs more than kSplitMaxBlocks (the boundary counters).
int single_token_gemm1_blocks(const MoeDeviceWeights& w, int max_tiles, int resident) {
  const int tiles = max_tiles * (w.inter / kTileRows);
  const int blocks = std::max(std::min(resident, tiles), (tiles + 1) / 2);
  return blocks <= detail::kSplitMaxBlocks ? blocks : 0;
}

// Launches the variant's GEMM; shared_tile falls back to the register-streaming one when K does
// not fit a tile.
template <bool kGemm1>
void launch_gemm(const GemmArgs& args, int tokens, int max_tiles, cudaStream_t stream) {
  const int row_blocks = kGemm1 ? args.w.inter / (kTileRows / 2) : args.w.hidden / kTileRows;
  const TileShape shape = tile_shape(args.w, kGemm1);
  if (args.p.gemm == GemmVariant::kWgmmaTile) {
    MXQ_CUDA_CHECK(cudaFuncSetAttribute(detail::gemm_wgmma_kernel<kGemm1>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        detail::kWgmmaSmemBytes));
    launch(detail::gemm_wgmma_kernel<kGemm1>,
           dim3(detail::wgmma_row_blocks(args.w, kGemm1), max_tiles), dim3(detail::kWgmmaThreads),
           static_cast<std::size_t>(detail::kWgmmaSmemBytes), stream, args.p.programmatic_launch,
           args, wgmma_maps(args, kGemm1, tokens));
  } else if (args.p.gemm == GemmVariant::kWideTile) {
    // 3 blocks of 48.5 KB per SM need more than the default carveout may give.
    MXQ_CUDA_CHECK(cudaFuncSetAttribute(detail::gemm_wide_kernel<kGemm1>,
                                        cudaFuncAttributePreferredSharedMemoryCarveout,
                                        cudaSharedmemCarveoutMaxShared));
    MXQ_CUDA_CHECK(cudaFuncSetAttribute(detail::gemm_wide_kernel<kGemm1>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        detail::kWideSmemBytes));
    launch(detail::gemm_wide_kernel<kGemm1>,
           dim3(detail::wide_row_blocks(args.w, kGemm1), max_tiles), dim3(detail::kWideWarps * 32),
           static_cast<std::size_t>(detail::kWideSmemBytes), stream, args.p.programmatic_launch,
           args);
  } else if (args.p.gemm == GemmVariant::kSharedTile && shape.k <= kTileMaxK) {
    // All of the unified L1/shared memory as shared, so 8 tiles fit per SM (the default carveout
    // may leave room for fewer); more than 48 KB of dynamic smem needs the explicit limit.
    MXQ_CUDA_CHECK(cudaFuncSetAttribute(gemm_tile_kernel<kGemm1>,
                                        cudaFuncAttributePreferredSharedMemoryCarveout,
                                        cudaSharedmemCarveoutMaxShared));
    if (shape.smem_bytes > 48 * 1024) {
      MXQ_CUDA_CHECK(cudaFuncSetAttribute(
          gemm_tile_kernel<kGemm1>, cudaFuncAttributeMaxDynamicSharedMemorySize, shape.smem_bytes));
    }
    launch(gemm_tile_kernel<kGemm1>, dim3(row_blocks, max_tiles), dim3(kGemmWarps * 32),
           static_cast<std::size_t>(shape.smem_bytes), stream, args.p.programmatic_launch, args);
  } else if (kGemm1 && args.single_token) {
    launch(gemm1_single_token_kernel,
           dim3(single_token_gemm1_blocks(args.w, max_tiles, kStreamBlocksPerSm * sm_count())),
           dim3(kGemmWarps * 32), 0, stream, args.p.programmatic_launch, args);
  } else if (kGemm1) {
    const auto kernel = w4a8(args.p) ? gemm1_swiglu_kernel<true> : gemm1_swiglu_kernel<false>;
    launch(kernel, dim3(args.w.inter / kTileRows, max_tiles), dim3(kGemmWarps * 32), 0, stream,
           args.p.programmatic_launch, args);
  } else {
    const auto kernel = w4a8(args.p) ? gemm2_kernel<true> : gemm2_kernel<false>;
    launch(kernel, dim3(args.w.hidden / (kTileRows * kGemm2Tiles), max_tiles),
           dim3(kGemmWarps * 32), 0, stream, args.p.programmatic_launch, args);
  }
  MXQ_CUDA_CHECK_LAUNCH();
}

// ---- weight layout ----------------------------------------------------------------------------
// One block per row group (row_groups.h): the group's rows are read into shared memory, then
// each thread writes row chunks, their words converted (W4A16: device words in order; W4A8: its
// words, lane-contiguous), to their place in the group.
template <bool kW4a8>
__global__ void to_row_groups_kernel(std::uint8_t* packed, int k) {
  extern __shared__ uint4 group_smem[];
  const std::size_t row_bytes = static_cast<std::size_t>(k) / 2;
  const std::size_t group_bytes = detail::kGroupRows * row_bytes;
  std::uint8_t* base = packed + blockIdx.x * group_bytes;
  for (std::size_t i = threadIdx.x; i < group_bytes / 16; i += blockDim.x)
    group_smem[i] = reinterpret_cast<const uint4*>(base)[i];
  __syncthreads();
  const auto* group = reinterpret_cast<const std::uint8_t*>(group_smem);
  const int chunks = (k + detail::kLayoutChunk - 1) / detail::kLayoutChunk;
  for (int item = threadIdx.x; item < chunks * detail::kGroupRows; item += blockDim.x) {
    const int q = item / detail::kGroupRows;
    const int i = item % detail::kGroupRows;
    const int nb = detail::chunk_blocks(k, q);
    const auto* in_words = reinterpret_cast<const std::uint32_t*>(
        group + i * row_bytes + static_cast<std::size_t>(q) * detail::kChunkBytes);
    std::uint32_t in[16];
    std::uint32_t out[16];
    for (int j = 0; j < 4 * nb; ++j) in[j] = in_words[j];
    if constexpr (kW4a8) {
      detail::w4a8_convert_chunk(in, nb, out);
    } else {
      detail::device_convert_chunk(in, nb, out);
    }
    auto* out_words = reinterpret_cast<std::uint32_t*>(base + detail::group_offset(k, q, i));
    for (int j = 0; j < 4 * nb; ++j) out_words[j] = out[j];
  }
}

// Rearranges `rows` packed rows of k values into row groups in place (`what` names the caller).
void to_row_groups(bool w4a8, std::uint8_t* packed, std::size_t rows, int k, cudaStream_t stream,
                   const char* what) {
  MXQ_CHECK(k > 0 && k % 32 == 0, ErrorCode::kInvalidArgument, what,
            ": k: expected a positive multiple of 32, found ", k);
  MXQ_CHECK(reinterpret_cast<std::uintptr_t>(packed) % 16 == 0, ErrorCode::kInvalidArgument, what,
            ": expected 16-byte aligned weights");
  MXQ_CHECK(rows % detail::kGroupRows == 0, ErrorCode::kInvalidArgument, what,
            ": rows: expected a multiple of 16, found ", rows);
  MXQ_CHECK(k <= detail::kMaxGroupedK, ErrorCode::kUnsupported, what, ": k: at most ",
            detail::kMaxGroupedK, " values a row (a row group in shared memory), found ", k);
  if (rows == 0) return;
  const int group_bytes = detail::kGroupRows * (k / 2);
  const auto kernel = w4a8 ? to_row_groups_kernel<true> : to_row_groups_kernel<false>;
  MXQ_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, group_bytes));
  kernel<<<static_cast<unsigned>(rows / detail::kGroupRows), 256,
           static_cast<std::size_t>(group_bytes), stream>>>(packed, k);
  MXQ_CUDA_CHECK_LAUNCH();
}

// ---- W4A8 activations -------------------------------------------------------------------------
// One warp per (row, 128-group) of bf16 rows [rows, k]: E4M3 codes of value / scale (saturating,
// round to nearest even) with scale = max(amax, 1e-4) / 448 in fp32 — the CPU reference's
// quantize_dequantize_fp8_groups, with the same codec functions — into the W4A8 activation
// layout (zeros past k), and the scale. A NaN or Inf makes its group's scale NaN.
// kReadsPredecessor: the rows are an earlier kernel's output (GEMM1's activations), so wait
// first; else (the forward's input x) quantize while the routing kernel runs, then wait (so that
// the next kernel's wait covers the routing too).
template <bool kReadsPredecessor>
__global__ void quantize_fp8_groups_kernel(const std::uint16_t* __restrict__ src, int rows, int k,
                                           std::uint8_t* __restrict__ q,
                                           float* __restrict__ scales) {
  if constexpr (kReadsPredecessor) wait_for_predecessor();
  allow_dependents();
  const int groups = detail::w4a8_act_groups(k);
  const int item = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (item < rows * groups) {
    const int row = item / groups;
    const int k0 = (item % groups) * detail::kW4a8Chunk + 4 * lane;
    float v[4] = {0.0F, 0.0F, 0.0F, 0.0F};
    std::uint32_t amax_bits = 0;
    if (k0 < k) {
      const uint2 pair =
          __ldg(reinterpret_cast<const uint2*>(src + static_cast<std::size_t>(row) * k + k0));
      const std::uint32_t half[4] = {pair.x & 0xFFFFU, pair.x >> 16, pair.y & 0xFFFFU,
                                     pair.y >> 16};
      for (int i = 0; i < 4; ++i) {
        v[i] = __uint_as_float(half[i] << 16);
        amax_bits = max(amax_bits, (half[i] << 16) & 0x7FFFFFFFU);
      }
    }
    for (int offset = 16; offset > 0; offset /= 2)
      amax_bits = max(amax_bits, __shfl_xor_sync(0xFFFFFFFFU, amax_bits, offset));
    const float scale = fp8_block_scale(__uint_as_float(amax_bits), ScaleMode::kFp32);
    std::uint32_t codes = 0;
    for (int i = 0; i < 4; ++i)
      codes |= static_cast<std::uint32_t>(float_to_e4m3(v[i] / scale, Fp8Saturation::kSatFinite))
               << (8 * i);
    const std::size_t pitch = detail::w4a8_act_pitch(k);
    *reinterpret_cast<std::uint32_t*>(q + row * pitch + detail::w4a8_act_offset(k0)) = codes;
    if (lane == 0) scales[static_cast<std::size_t>(item)] = scale;
  }
  if constexpr (!kReadsPredecessor) wait_for_predecessor();
}

void launch_quantize_fp8(bool reads_predecessor, const std::uint16_t* src, int rows, int k,
                         std::uint8_t* q, float* scales, bool programmatic, cudaStream_t stream) {
  constexpr int kWarps = 8;
  const int items = rows * detail::w4a8_act_groups(k);
  launch(reads_predecessor ? quantize_fp8_groups_kernel<true> : quantize_fp8_groups_kernel<false>,
         dim3((items + kWarps - 1) / kWarps), dim3(kWarps * 32), 0, stream, programmatic, src, rows,
         k, q, scales);
  MXQ_CUDA_CHECK_LAUNCH();
}

// ---- 5. combine -----------------------------------------------------------------------------
// out[t][h] = sum over the token's k choices, in order, of weight * y[slot][h]; a thread takes
// kVec consecutive h (4 when the outputs are aligned for it: H is a multiple of 32 and the
// workspace's rows are 16-byte aligned). It loads its slots and weights, then all k of its y
// vectors, before the first add: with one element a thread and the loads in the loop, each of the
// T x H / 256 short blocks waited for two dependent round trips per choice (82 us at T = 4096,
// 2.6 TB/s; docs/PERF.md). The sum's order and operations are the same for every kVec.
template <int kVec>
__global__ void combine_kernel(const float* __restrict__ y, const int* __restrict__ pair_slot,
                               const float* __restrict__ topk_w, int top_k, int hidden,
                               float* __restrict__ out_f32, std::uint16_t* __restrict__ out_bf16) {
  static_assert(kVec == 1 || kVec == 4, "one element or a float4");
  using Vec = std::conditional_t<kVec == 4, float4, float>;
  detail::trace_block(MoeTraceKernel::kCombine, MoeTracePoint::kStart);
  wait_for_predecessor();
  detail::trace_block(MoeTraceKernel::kCombine, MoeTracePoint::kReleased);
  const int t = blockIdx.y;
  const int h = (blockIdx.x * blockDim.x + threadIdx.x) * kVec;
  if (h >= hidden) return;
  int slot[detail::kMaxTopK];
  float weight[detail::kMaxTopK];
#pragma unroll
  for (int j = 0; j < detail::kMaxTopK; ++j) {
    slot[j] = j < top_k ? pair_slot[t * top_k + j] : -1;
    weight[j] = j < top_k ? topk_w[t * top_k + j] : 0.0F;
  }
  Vec v[detail::kMaxTopK];
#pragma unroll
  for (int j = 0; j < detail::kMaxTopK; ++j) {
    if (slot[j] >= 0)
      v[j] = *reinterpret_cast<const Vec*>(y + static_cast<std::size_t>(slot[j]) * hidden + h);
  }
  float sum[kVec] = {};
#pragma unroll
  for (int j = 0; j < detail::kMaxTopK; ++j) {
    if (slot[j] < 0) continue;
    const auto* vj = reinterpret_cast<const float*>(&v[j]);
#pragma unroll
    for (int i = 0; i < kVec; ++i) sum[i] += weight[j] * vj[i];
  }
  const std::size_t at = static_cast<std::size_t>(t) * hidden + h;
  if (out_f32 != nullptr) *reinterpret_cast<Vec*>(out_f32 + at) = *reinterpret_cast<Vec*>(sum);
  if (out_bf16 != nullptr) {
    std::uint16_t bits[kVec];
#pragma unroll
    for (int i = 0; i < kVec; ++i) bits[i] = __bfloat16_as_ushort(__float2bfloat16_rn(sum[i]));
    if constexpr (kVec == 4) {
      *reinterpret_cast<uint2*>(out_bf16 + at) =
          make_uint2(bits[0] | (static_cast<std::uint32_t>(bits[1]) << 16),
                     bits[2] | (static_cast<std::uint32_t>(bits[3]) << 16));
    } else {
      out_bf16[at] = bits[0];
    }
  }
  detail::trace_block(MoeTraceKernel::kCombine, MoeTracePoint::kEnd);
}

// The caller's outputs decide the vector width: float4 needs 16-byte aligned fp32 rows, 4 bf16 an
// 8-byte aligned row (H is a multiple of 32, so the row starts keep the base's alignment).
void launch_combine(const Workspace& ws, const float* weights, const MoeParams& p, int hidden,
                    const MoeRun& run, cudaStream_t stream) {
  const auto aligned = [](const void* ptr, std::uintptr_t bytes) {
    return reinterpret_cast<std::uintptr_t>(ptr) % bytes == 0;
  };
  constexpr int kThreads = 256;
  if (aligned(run.out_f32, 16) && aligned(run.out_bf16, 8) && aligned(ws.y, 16)) {
    launch(combine_kernel<4>, dim3((hidden / 4 + kThreads - 1) / kThreads, run.tokens),
           dim3(kThreads), 0, stream, p.programmatic_launch, ws.y, ws.pair_slot, weights, p.top_k,
           hidden, run.out_f32, run.out_bf16);
  } else {
    launch(combine_kernel<1>, dim3((hidden + kThreads - 1) / kThreads, run.tokens), dim3(kThreads),
           0, stream, p.programmatic_launch, ws.y, ws.pair_slot, weights, p.top_k, hidden,
           run.out_f32, run.out_bf16);
  }
  MXQ_CUDA_CHECK_LAUNCH();
}

}  // namespace

const char* moe_decode_unsupported_reason(const MoeDeviceWeights& w, const MoeParams& p) {
  if (w.hidden <= 0 || w.hidden % 32 != 0) return "hidden size must be a positive multiple of 32";
  if (w.inter <= 0 || w.inter % 32 != 0)
    return "intermediate size must be a positive multiple of 32";
  if (w.inter_padded < w.inter || w.inter_padded % 32 != 0)
    return "padded intermediate size must be a multiple of 32 and >= the intermediate size";
  if (p.top_k < 1 || p.top_k > detail::kMaxTopK) return "top-k must be in [1, 8]";
  const auto aligned16 = [](const void* ptr) {
    return reinterpret_cast<std::uintptr_t>(ptr) % 16 == 0;
  };
  if (!aligned16(w.b13) || !aligned16(w.b2))
    return "bias arrays must be 16-byte aligned (the GEMM blocks copy them in 16-byte pieces)";
  if (w4a8(p) && p.gemm != GemmVariant::kRegisterStream && p.gemm != GemmVariant::kAuto)
    return "W4A8 (fp8_g128 activations) runs the register_stream GEMMs only";
  if (w.num_local_experts < 1 || w.num_local_experts > detail::kMaxLocalExperts)
    return "experts must be in [1, 1024]";
  if (w.router_w != nullptr &&
      (w.num_global_experts < p.top_k || w.num_global_experts > detail::kMaxRouterExperts))
    return "router width must be in [top-k, 1024]";
  return nullptr;
}

std::size_t moe_workspace_bytes(const MoeDeviceWeights& w, const MoeParams& p, int max_tokens) {
  std::size_t bytes = 0;
  detail::carve_workspace(w, p, max_tokens, nullptr, &bytes);
  return bytes;
}

void moe_workspace_init(void* workspace, int max_tokens, cudaStream_t stream) {
  MXQ_CUDA_CHECK(cudaMemsetAsync(workspace, 0, detail::sync_region_bytes(max_tokens), stream));
}

void moe_forward(const MoeDeviceWeights& w, const MoeParams& p, const MoeRun& run, void* workspace,
                 std::size_t workspace_bytes, int max_tokens, cudaStream_t stream) {
  if (const char* reason = moe_decode_unsupported_reason(w, p)) {
    fail(ErrorCode::kUnsupported, "CUDA MoE decode tactic: ", reason);
  }
  MXQ_CHECK(run.tokens >= 0 && run.tokens <= max_tokens, ErrorCode::kOutOfRange,
            "moe_forward: tokens: expected 0..", max_tokens, ", found ", run.tokens);
  MXQ_CHECK(workspace_bytes >= moe_workspace_bytes(w, p, max_tokens), ErrorCode::kInvalidArgument,
            "moe_forward: workspace: expected at least ", moe_workspace_bytes(w, p, max_tokens),
            " bytes, found ", workspace_bytes);
  MXQ_CHECK(run.topk_ids != nullptr || w.router_w != nullptr, ErrorCode::kInvalidArgument,
            "moe_forward: no routing: give precomputed top-k ids/weights or router weights");
  if (run.tokens == 0) return;
  const auto mark = [&](int phase) {
    if (run.phase_events != nullptr)
      // External: under stream capture a plain record only orders work inside the graph; this
      // one becomes an event record node that the caller can synchronize on and time.
      MXQ_CUDA_CHECK(
          cudaEventRecordWithFlags(run.phase_events[phase], stream, cudaEventRecordExternal));
  };
  mark(0);
  MoeParams resolved = p;
  resolved.gemm = resolve_gemm_variant(w, p, run.tokens);
  const Workspace ws = detail::carve_workspace(w, p, max_tokens, workspace, nullptr);
  const int pairs = run.tokens * p.top_k;
  const bool routing = run.topk_ids == nullptr;
  // With precomputed routing the kernel only counts the given ids, even when the layer has a
  // router.
  // One token routed on the device, W4A16 register-streaming GEMMs: GEMM1 takes the top-k
  // (route_single_token).
  const bool single_token =
      routing && run.tokens == 1 && !w4a8(p) && resolved.gemm == GemmVariant::kRegisterStream &&
      w.num_global_experts <= kSingleTokenMaxRouterExperts &&
      single_token_gemm1_blocks(w, detail::max_tiles_for(p.top_k, w.num_local_experts), 1) > 0;
  detail::RouteArgs route{run.x,
                          routing ? w.router_w : nullptr,
                          w.router_b,
                          run.topk_ids,
                          w.hidden,
                          w.num_global_experts,
                          p.top_k,
                          run.tokens,
                          w.first_local_expert,
                          w.num_local_experts,
                          detail::tile_tokens_for(resolved.gemm),
                          ws};
  route.logits_only = single_token;
  const int route_tiles = routing ? detail::route_tiles_for(run.tokens) : 1;
  const int router_blocks =
      routing ? detail::router_blocks_for(w.num_global_experts, route_tiles) : 1;
  // The first kernel of the forward: plain stream order after whatever the caller enqueued.
  launch(route_tiles == 4 ? detail::route_kernel<4> : detail::route_kernel<1>,
         dim3(router_blocks, detail::token_groups_for(run.tokens)), dim3(detail::kRouteWarps * 32),
         detail::route_smem_bytes(w.num_local_experts), stream, false, route);
  MXQ_CUDA_CHECK_LAUNCH();
  const float* weights = routing ? ws.topk_w : run.topk_weights;
  if (w4a8(p)) {
    launch_quantize_fp8(false, run.x, run.tokens, w.hidden, ws.x_fp8, ws.x_scale,
                        p.programmatic_launch, stream);
  }
  if (resolved.gemm == GemmVariant::kWgmmaTile) {
    // GEMM1's activations by slot, in the wgmma K order (after the routing kernel's slots).
    // Grid-stride over 16-byte units: two waves of 8 resident 256-thread blocks per SM at most.
    const int sms = sm_count();
    const std::size_t units = static_cast<std::size_t>(pairs) * (w.hidden / 8);
    const int blocks = static_cast<int>(
        std::min<std::size_t>((units + 255) / 256, static_cast<std::size_t>(sms) * 16));
    launch(detail::gather_activations_kernel, dim3(blocks), dim3(256), 0, stream,
           p.programmatic_launch, reinterpret_cast<const std::uint32_t*>(run.x),
           static_cast<const int*>(ws.pair_slot), pairs, p.top_k, w.hidden,
           reinterpret_cast<uint4*>(ws.x_wgmma));
    MXQ_CUDA_CHECK_LAUNCH();
  }

  mark(1);
  const int max_tiles =
      detail::max_tiles_for(pairs, w.num_local_experts, detail::tile_tokens_for(resolved.gemm));
  GemmArgs args{w, resolved, run.x, p.top_k, ws};
  args.single_token = single_token;
  launch_gemm<true>(args, run.tokens, max_tiles, stream);
  if (w4a8(p)) {
    launch_quantize_fp8(true, reinterpret_cast<const std::uint16_t*>(ws.act), pairs, w.inter,
                        ws.act_fp8, ws.act_scale, p.programmatic_launch, stream);
  }
  mark(2);
  launch_gemm<false>(args, run.tokens, max_tiles, stream);
  mark(3);
  launch_combine(ws, weights, p, w.hidden, run, stream);
  mark(4);
}

GemmVariant resolve_gemm_variant(const MoeDeviceWeights& w, const MoeParams& p, int tokens) {
  if (p.gemm != GemmVariant::kAuto) return p.gemm;
  if (w4a8(p)) return GemmVariant::kRegisterStream;
  const int experts =
      std::max(w.num_global_experts > 0 ? w.num_global_experts : w.num_local_experts, 1);
  const double slots_per_expert = static_cast<double>(tokens) * p.top_k / experts;
  return slots_per_expert >= kPrefillMinSlotsPerExpert ? GemmVariant::kWgmmaTile
                                                       : GemmVariant::kRegisterStream;
}

void moe_weights_to_device_layout(std::uint8_t* packed, std::size_t rows, int k,
                                  cudaStream_t stream) {
  to_row_groups(false, packed, rows, k, stream, "moe_weights_to_device_layout");
}

void moe_weights_to_w4a8_layout(std::uint8_t* packed, std::size_t rows, int k,
                                cudaStream_t stream) {
  to_row_groups(true, packed, rows, k, stream, "moe_weights_to_w4a8_layout");
}

void moe_scales_to_device_layout(const std::uint8_t* src, std::size_t rows, int k,
                                 std::uint8_t* dst, cudaStream_t stream) {
  MXQ_CHECK(k > 0 && k % 32 == 0, ErrorCode::kInvalidArgument,
            "moe_scales_to_device_layout: k: expected a positive multiple of 32, found ", k);
  if (rows == 0) return;
  const std::size_t pitch = static_cast<std::size_t>(moe_scale_pitch(k));
  const std::size_t width = static_cast<std::size_t>(k / 32);
  MXQ_CUDA_CHECK(cudaMemsetAsync(dst, 0, rows * pitch, stream));
  MXQ_CUDA_CHECK(cudaMemcpy2DAsync(dst, pitch, src, width, width, rows, cudaMemcpyDefault, stream));
}

const char* to_string(GemmVariant variant) {
  switch (variant) {
    case GemmVariant::kSharedTile:
      return "shared_tile";
    case GemmVariant::kWideTile:
      return "wide_tile";
    case GemmVariant::kWgmmaTile:
      return "wgmma_tile";
    case GemmVariant::kAuto:
      return "auto";
    case GemmVariant::kRegisterStream:
    default:
      return "register_stream";
  }
}

MoeRoutingView moe_routing_view(const MoeDeviceWeights& w, const MoeParams& p, int max_tokens,
                                void* workspace) {
  const Workspace ws = detail::carve_workspace(w, p, max_tokens, workspace, nullptr);
  return {ws.topk_ids, ws.topk_w};
}

bool moe_block_trace_enabled() { return MXQ_MOE_BLOCK_TRACE != 0; }

std::array<std::vector<MoeBlockTraceRecord>, kMoeTraceKernels> moe_block_trace_take() {
#if MXQ_MOE_BLOCK_TRACE
  std::vector<MoeBlockTraceRecord> all(static_cast<std::size_t>(kMoeTraceKernels) *
                                       kMoeTraceMaxBlocks);
  MXQ_CUDA_CHECK(cudaDeviceSynchronize());
  MXQ_CUDA_CHECK(cudaMemcpyFromSymbol(all.data(), detail::g_block_trace,
                                      all.size() * sizeof(MoeBlockTraceRecord)));
  void* records = nullptr;
  MXQ_CUDA_CHECK(cudaGetSymbolAddress(&records, detail::g_block_trace));
  MXQ_CUDA_CHECK(cudaMemset(records, 0, all.size() * sizeof(MoeBlockTraceRecord)));
  std::array<std::vector<MoeBlockTraceRecord>, kMoeTraceKernels> out;
  for (int k = 0; k < kMoeTraceKernels; ++k) {
    const auto first = all.begin() + static_cast<std::ptrdiff_t>(k) * kMoeTraceMaxBlocks;
    auto last = first + kMoeTraceMaxBlocks;
    while (last != first && (last - 1)->at_ns[0] == 0) --last;  // blocks that never started
    out[k].assign(first, last);
  }
  return out;
#else
  fail(ErrorCode::kUnsupported,
       "moe_block_trace_take: this build does not record the MoE block timeline (configure with "
       "-DMXQ_MOE_BLOCK_TRACE=ON)");
#endif
}

std::size_t moe_expert_weight_bytes(const MoeDeviceWeights& w) {
  const std::size_t h = static_cast<std::size_t>(w.hidden);
  const std::size_t i = static_cast<std::size_t>(w.inter);
  const std::size_t w13 = 2 * i * (h / 2 + h / 32) + (w.b13 != nullptr ? 2 * i * 2 : 0);
  const std::size_t w2 = h * (i / 2 + i / 32) + (w.b2 != nullptr ? h * 2 : 0);
  return w13 + w2;
}

}  // namespace mxq::moe::cuda
