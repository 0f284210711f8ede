// The MoE kernels' device MXFP4 helpers against the host codec (mxq/formats/mxfp4_block.h):
// the word decode (8 E2M1 codes in the device layout -> 4 bf16x2 pairs (e_{2i}, e_{2i+1}) with
// the E8M0 scale folded in) on every pair of codes at every position under every scale, both
// decode paths; and one 128-wide K chunk of two m16n8k16 tile products sharing their activations
// (decode + mma) against a float64 dot product, which fails if weights and activations disagree
// on the k order.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "moe/cuda/mxfp4_mma.cuh"
#include "moe/device_array.h"
#include "mxq/core/cuda_check.h"
#include "mxq/formats/bf16.h"
#include "mxq/formats/mxfp4_block.h"

namespace mxq {
namespace {

using moe::gpu::detail::decode_e2m1x8;
using moe::gpu::detail::mma_mx_chunk;
using moe::gpu::detail::scale_factors;
using testing::DeviceArray;

// out[4 * (scale * words + i) + p] = register p of word i decoded under `scale`; the wide path
// (two multiplies, e8m0_scale_factors) when `wide`, else the one-multiply path with the one
// factor the kernels take when no scale of the warp exceeds 128 (the test only asks it for
// those scales).
__global__ void decode_words_kernel(const std::uint32_t* words, int count, bool wide,
                                    std::uint32_t* out) {
  const int scale = blockIdx.y;
  const auto f = wide ? scale_factors<true>(static_cast<std::uint32_t>(scale))
                      : scale_factors<false>(static_cast<std::uint32_t>(scale));
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += gridDim.x * blockDim.x) {
    std::uint32_t regs[4];
    if (wide) {
      decode_e2m1x8<true>(words[i], f, regs);
    } else {
      decode_e2m1x8<false>(words[i], f, regs);
    }
    for (int p = 0; p < 4; ++p)
      out[4 * (static_cast<std::size_t>(scale) * count + i) + p] = regs[p];
  }
}

// Checkpoint-layout words covering every (e_{2i}, e_{2i+1}) code pair at every position i, the
// other codes random; plus random words.
std::vector<std::uint32_t> test_words() {
  std::mt19937 rng(12345);
  std::vector<std::uint32_t> words;
  for (int i = 0; i < 4; ++i) {
    for (std::uint32_t a = 0; a < 16; ++a) {
      for (std::uint32_t b = 0; b < 16; ++b) {
        std::uint32_t w = rng();
        w &= ~(0xFFU << (8 * i));
        w |= (a << (8 * i)) | (b << (8 * i + 4));
        words.push_back(w);
      }
    }
  }
  for (int k = 0; k < 1024; ++k) words.push_back(rng());
  return words;
}

// Bit-exact against the host codec (NaN: both NaN).
void check_decode(bool wide) {
  const std::vector<std::uint32_t> words = test_words();
  const int count = static_cast<int>(words.size());
  std::vector<std::uint32_t> device_words(words.size());
  for (std::size_t i = 0; i < words.size(); ++i)
    device_words[i] = moe::gpu::detail::to_device_word(words[i]);
  DeviceArray<std::uint32_t> d_words(words.size());
  d_words.upload(device_words);
  DeviceArray<std::uint32_t> d_out(words.size() * 256 * 4);
  decode_words_kernel<<<dim3(8, 256), 256>>>(d_words.get(), count, wide, d_out.get());
  MXQ_CUDA_CHECK(cudaGetLastError());
  MXQ_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<std::uint32_t> out = d_out.download();
  std::int64_t mismatches = 0;
  for (int scale = 0; scale < 256; ++scale) {
    if (!wide && scale > 128) continue;  // the kernels take the wide path there
    for (int i = 0; i < count; ++i) {
      std::uint8_t packed[16] = {};
      std::memcpy(packed, &words[i], 4);
      float ref[32];
      dequantize_mxfp4_block(packed, static_cast<std::uint8_t>(scale), ref);
      for (int p = 0; p < 4; ++p) {
        const std::uint32_t reg = out[4 * (static_cast<std::size_t>(scale) * count + i) + p];
        const float got[2] = {bf16_to_float(static_cast<std::uint16_t>(reg & 0xFFFFU)),
                              bf16_to_float(static_cast<std::uint16_t>(reg >> 16))};
        const float want[2] = {ref[2 * p], ref[2 * p + 1]};
        for (int half = 0; half < 2; ++half) {
          const bool same = std::isnan(want[half])
                                ? std::isnan(got[half])
                                : std::memcmp(&got[half], &want[half], sizeof(float)) == 0;
          if (!same && ++mismatches <= 5) {
            ADD_FAILURE() << "word 0x" << std::hex << words[i] << std::dec << " scale " << scale
                          << " pair " << p << " half " << half << ": got " << got[half] << ", want "
                          << want[half];
          }
        }
      }
    }
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(Mxfp4WordDecode, OneMultiplyPathMatchesHostCodec) { check_decode(false); }

// The device form of packed_narrow_scale_factor (a byte permute) against the one-scale factor,
// for every scale <= 128 at every position, the other bytes varying.
__global__ void packed_factor_kernel(std::uint32_t* out) {
  const std::uint32_t scale = blockIdx.x;  // 0..128
  const std::uint32_t other = (threadIdx.x * 37U) % 129U;
  for (int position = 0; position < 4; ++position) {
    std::uint32_t packed = 0;
    for (int b = 0; b < 4; ++b) packed |= (b == position ? scale : other) << (8 * b);
    const std::uint32_t biased = packed + moe::gpu::detail::kPackedScaleBias;
    std::uint32_t got = 0;
    switch (position) {
      case 0:
        got = moe::gpu::detail::packed_narrow_scale_factor<0>(biased);
        break;
      case 1:
        got = moe::gpu::detail::packed_narrow_scale_factor<1>(biased);
        break;
      case 2:
        got = moe::gpu::detail::packed_narrow_scale_factor<2>(biased);
        break;
      default:
        got = moe::gpu::detail::packed_narrow_scale_factor<3>(biased);
        break;
    }
    out[(scale * blockDim.x + threadIdx.x) * 4 + position] = got;
  }
}

TEST(Mxfp4WordDecode, PackedScaleFactorsOnTheDevice) {
  constexpr int kThreads = 129;
  DeviceArray<std::uint32_t> d_out(129 * kThreads * 4);
  packed_factor_kernel<<<129, kThreads>>>(d_out.get());
  MXQ_CUDA_CHECK(cudaGetLastError());
  MXQ_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<std::uint32_t> out = d_out.download();
  for (std::uint32_t scale = 0; scale <= 128; ++scale)
    for (int t = 0; t < kThreads; ++t)
      for (int position = 0; position < 4; ++position)
        ASSERT_EQ(out[(scale * kThreads + t) * 4 + position],
                  moe::gpu::detail::narrow_scale_factor(scale))
            << "scale " << scale << " position " << position << " thread " << t;
}
TEST(Mxfp4WordDecode, TwoMultiplyPathMatchesHostCodecOnEveryScale) { check_decode(true); }

// One warp: D[32][8 kNT] = W[32][128] (MXFP4, row-major packed, 4 scales per row) x
// X[8 kNT][128]^T, as two 16-row tiles (rows 0..15 and 16..31, like GEMM1's gate and up) sharing
// each token tile's B operand, and kNT token tiles of 8 sharing the decoded weights (the decode
// GEMMs' 16-slot tiles).
constexpr int kTiles = 2;
constexpr int kRows = 16 * kTiles;

template <int kNT>
__global__ void chunk_mma_kernel(const std::uint8_t* w, const std::uint8_t* scales,
                                 const std::uint16_t* x, bool wide, float* d) {
  constexpr int kTokens = 8 * kNT;
  const int lane = threadIdx.x;
  const int r = lane / 4;
  const int c = lane % 4;
  uint4 wv[kTiles][2];
  std::uint32_t sc[kTiles][2];
  for (int a = 0; a < kTiles; ++a) {
    for (int h = 0; h < 2; ++h) {
      const int row = 16 * a + r + 8 * h;
      wv[a][h] = reinterpret_cast<const uint4*>(w + row * 64)[c];
      sc[a][h] = scales[row * 4 + c];
    }
  }
  uint4 xv[kNT][4];
  for (int n = 0; n < kNT; ++n)
    for (int i = 0; i < 4; ++i)
      xv[n][i] = reinterpret_cast<const uint4*>(x + (8 * n + r) * 128 + 32 * c)[i];
  float acc[kTiles * kNT][4] = {};
  if (wide) {
    mma_mx_chunk<kTiles, true, kNT>(wv, sc, xv, acc);
  } else {
    mma_mx_chunk<kTiles, false, kNT>(wv, sc, xv, acc);
  }
  for (int a = 0; a < kTiles; ++a) {
    for (int n = 0; n < kNT; ++n) {
      float* tile = d + a * 16 * kTokens + 8 * n;
      tile[r * kTokens + 2 * c] = acc[a * kNT + n][0];
      tile[r * kTokens + 2 * c + 1] = acc[a * kNT + n][1];
      tile[(r + 8) * kTokens + 2 * c] = acc[a * kNT + n][2];
      tile[(r + 8) * kTokens + 2 * c + 1] = acc[a * kNT + n][3];
    }
  }
}

template <int kNT>
void check_chunk(bool wide, std::uint32_t seed) {
  constexpr int kTokens = 8 * kNT;
  std::mt19937 rng(seed);
  std::vector<std::uint8_t> w(kRows * 64);
  std::vector<std::uint8_t> scales(kRows * 4);
  std::vector<std::uint16_t> x(kTokens * 128);
  for (auto& b : w) b = static_cast<std::uint8_t>(rng());
  // Distinct scales per block so a block read with another lane's scale shows; the wide run
  // includes scales above 128.
  for (auto& s : scales) s = static_cast<std::uint8_t>((wide ? 125 : 118) + rng() % 8);
  std::uniform_real_distribution<float> uniform(-1.0F, 1.0F);
  for (auto& v : x) v = float_to_bf16(uniform(rng));
  DeviceArray<std::uint8_t> d_w(w.size());
  DeviceArray<std::uint8_t> d_s(scales.size());
  DeviceArray<std::uint16_t> d_x(x.size());
  DeviceArray<float> d_d(kRows * kTokens);
  std::vector<std::uint8_t> w_device = w;
  moe::gpu::detail::to_device_words_host(w_device.data(), w_device.size());
  d_w.upload(w_device);
  d_s.upload(scales);
  d_x.upload(x);
  MXQ_CUDA_CHECK(cudaMemset(d_d.get(), 0xFF, kRows * kTokens * sizeof(float)));  // NaN poison
  chunk_mma_kernel<kNT><<<1, 32>>>(d_w.get(), d_s.get(), d_x.get(), wide, d_d.get());
  MXQ_CUDA_CHECK(cudaGetLastError());
  MXQ_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> d = d_d.download();
  for (int m = 0; m < kRows; ++m) {
    float row[128];
    for (int b = 0; b < 4; ++b)
      dequantize_mxfp4_block(&w[m * 64 + 16 * b], scales[m * 4 + b], &row[32 * b]);
    for (int n = 0; n < kTokens; ++n) {
      double dot = 0.0;
      double magnitude = 0.0;
      for (int k = 0; k < 128; ++k) {
        const double term = static_cast<double>(row[k]) * bf16_to_float(x[n * 128 + k]);
        dot += term;
        magnitude += std::fabs(term);
      }
      EXPECT_NEAR(d[m * kTokens + n], dot, 1e-5 * magnitude + 1e-30)
          << "row " << m << " token " << n << (wide ? " (wide)" : "");
    }
  }
}

TEST(Mxfp4ChunkMma, MatchesFloat64DotProduct) {
  for (std::uint32_t seed = 1; seed <= 4; ++seed) {
    check_chunk<1>(false, seed);
    check_chunk<1>(true, seed);
  }
}

TEST(Mxfp4ChunkMma, TwoTokenTilesMatchFloat64DotProduct) {
  for (std::uint32_t seed = 1; seed <= 4; ++seed) {
    check_chunk<2>(false, seed);
    check_chunk<2>(true, seed);
  }
}

}  // namespace
}  // namespace mxq
