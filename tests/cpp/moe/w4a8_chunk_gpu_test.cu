// The W4A8 GEMMs' chunk product (w4a8_mma.cuh) on the device: one 128-wide K chunk of two 16-row
// tiles sharing their E4M3 activations, with weights and activations in the W4A8 layouts
// (w4a8_layout.h), against a float64 dot product of the host codecs' values — on the fast scale
// path, the large-scale path (scales above 248), and with a NaN scale (its row NaN, the others
// finite). Fails if weights and activations disagree on the k order or a block takes another
// block's scale.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "moe/cuda/w4a8_mma.cuh"
#include "moe/device_array.h"
#include "mxq/core/cuda_check.h"
#include "mxq/formats/e4m3.h"
#include "mxq/formats/mxfp4_block.h"

namespace mxq {
namespace {

constexpr int kTiles = 2;
constexpr int kRows = 16 * kTiles;
constexpr int kTokens = 8;

// w: kRows rows of 64 bytes (one chunk, W4A8 layout); scales: 4 per row; x: kTokens E4M3 rows of
// 128 bytes (activation layout); xs: one scale per token. d: [kRows, kTokens].
__global__ void w4a8_chunk_kernel(const std::uint8_t* w, const std::uint32_t* scales,
                                  const std::uint8_t* x, const float* xs, float* d) {
  const int lane = threadIdx.x;
  const int r = lane / 4;
  const int c = lane % 4;
  moe::gpu::detail::W4a8ChunkRegs<kTiles> regs;
  for (int a = 0; a < kTiles; ++a) {
    for (int h = 0; h < 2; ++h) {
      const int row = 16 * a + r + 8 * h;
      regs.w[a][h] = reinterpret_cast<const uint4*>(w + row * 64)[c];
      regs.scale[a][h] = scales[row];
    }
  }
  const auto* xrow = reinterpret_cast<const uint4*>(x + r * 128 + 32 * c);
  regs.x[0] = xrow[0];
  regs.x[1] = xrow[1];
  regs.xs[0] = xs[2 * c];
  regs.xs[1] = xs[2 * c + 1];
  float acc[kTiles][4] = {};
  moe::gpu::detail::w4a8_mma_chunk(regs, acc);
  for (int a = 0; a < kTiles; ++a) {
    float* tile = d + a * 16 * kTokens;
    tile[r * kTokens + 2 * c] = acc[a][0];
    tile[r * kTokens + 2 * c + 1] = acc[a][1];
    tile[(r + 8) * kTokens + 2 * c] = acc[a][2];
    tile[(r + 8) * kTokens + 2 * c + 1] = acc[a][3];
  }
}

enum class Scales { kFast, kLarge, kNan };

void check_chunk(Scales mode, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::uint8_t> w(kRows * 64);
  for (auto& b : w) b = static_cast<std::uint8_t>(rng());
  std::vector<std::uint8_t> s(kRows * 4);
  for (auto& v : s) {
    v = static_cast<std::uint8_t>(mode == Scales::kLarge ? 246 + rng() % 7     // 246..252
                                                         : 100 + rng() % 40);  // 2^-27..2^12
  }
  s[4 * 0] = 0;  // 2^-127 on every path
  const int nan_row = 5;
  if (mode == Scales::kNan) s[4 * nan_row + 2] = 0xFF;
  // Activation codes: any finite E4M3, but small ones (exponent field <= 1) for the large scales
  // so that the fp32 products stay finite.
  std::vector<std::uint8_t> x_natural(kTokens * 128);
  for (auto& q : x_natural) {
    std::uint8_t code = 0x7F;
    while ((code & 0x7F) == 0x7F) {
      code = static_cast<std::uint8_t>(rng());
      if (mode == Scales::kLarge) code &= 0x8F;
    }
    q = code;
  }
  std::vector<float> xs(kTokens);
  for (auto& v : xs) v = std::ldexp(1.0F + static_cast<float>(rng() % 100) / 100.0F, -3);

  std::vector<std::uint8_t> w_device = w;
  moe::gpu::detail::to_w4a8_layout_host(w_device.data(), kRows, 128);
  std::vector<std::uint8_t> x_device(x_natural.size());
  for (int n = 0; n < kTokens; ++n)
    for (int k = 0; k < 128; ++k)
      x_device[n * 128 + moe::gpu::detail::w4a8_act_offset(k)] = x_natural[n * 128 + k];
  std::vector<std::uint32_t> packed_scales(kRows);
  std::memcpy(packed_scales.data(), s.data(), s.size());

  const testing::DeviceArray<std::uint8_t> d_w(w_device);
  const testing::DeviceArray<std::uint32_t> d_s(packed_scales);
  const testing::DeviceArray<std::uint8_t> d_x(x_device);
  const testing::DeviceArray<float> d_xs(xs);
  const testing::DeviceArray<float> d_d(
      std::vector<float>(kRows * kTokens, std::numeric_limits<float>::quiet_NaN()));  // poison
  w4a8_chunk_kernel<<<1, 32>>>(d_w.get(), d_s.get(), d_x.get(), d_xs.get(), d_d.get());
  MXQ_CUDA_CHECK(cudaGetLastError());
  const std::vector<float> d = d_d.download();

  for (int m = 0; m < kRows; ++m) {
    float row[128];
    for (int b = 0; b < 4; ++b)
      dequantize_mxfp4_block(&w[m * 64 + 16 * b], s[m * 4 + b], &row[32 * b]);
    for (int n = 0; n < kTokens; ++n) {
      const float got = d[m * kTokens + n];
      if (mode == Scales::kNan && m == nan_row) {
        EXPECT_TRUE(std::isnan(got)) << "token " << n;
        continue;
      }
      double dot = 0.0;
      double magnitude = 0.0;
      for (int k = 0; k < 128; ++k) {
        const double term = static_cast<double>(row[k]) * e4m3_to_float(x_natural[n * 128 + k]);
        dot += term;
        magnitude += std::fabs(term);
      }
      dot *= xs[n];
      magnitude *= xs[n];
      ASSERT_TRUE(std::isfinite(got)) << "row " << m << " token " << n;
      EXPECT_NEAR(got, dot, 1e-5 * magnitude + 1e-37) << "row " << m << " token " << n;
    }
  }
}

TEST(W4a8ChunkMma, FastScalePathMatchesFloat64DotProduct) {
  for (std::uint32_t seed = 1; seed <= 4; ++seed) check_chunk(Scales::kFast, seed);
}

TEST(W4a8ChunkMma, LargeScalePathMatchesFloat64DotProduct) {
  for (std::uint32_t seed = 1; seed <= 4; ++seed) check_chunk(Scales::kLarge, seed);
}

TEST(W4a8ChunkMma, NanScaleMakesItsRowNan) { check_chunk(Scales::kNan, 9); }

}  // namespace
}  // namespace mxq
