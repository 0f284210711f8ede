// The wgmma K order of the activations (src/moe/cuda/wgmma_k_order.h) on the host: it permutes
// each 32-wide MX block onto itself, and with it the A fragments the wgmma kernels decode (lane c
// holds word c of an MX block, register i = 2h + u of the word in k-step h at K 2c + 8u) meet
// the activations they multiply: a simulated warpgroup product equals the plain dot product.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <set>
#include <vector>

#include "moe/cuda/wgmma_k_order.h"

namespace mxq::moe::gpu::detail {
namespace {

TEST(WgmmaKOrder, PermutesEachMxBlockOntoItself) {
  std::set<int> pairs;
  for (int p = 0; p < 16; ++p) pairs.insert(wgmma_pair_position(p));
  EXPECT_EQ(pairs.size(), 16U);
  EXPECT_EQ(*pairs.rbegin(), 15);
  for (int block = 0; block < 4; ++block) {
    std::set<int> positions;
    for (int k = 32 * block; k < 32 * block + 32; ++k) {
      const int position = wgmma_k_position(k);
      EXPECT_EQ(position / 32, block) << k;
      EXPECT_EQ(position % 2, k % 2) << k;  // bf16x2 pairs move whole
      positions.insert(position);
    }
    EXPECT_EQ(positions.size(), 32U);
  }
}

TEST(WgmmaKOrder, PositionPairInvertsPairPosition) {
  for (int p = 0; p < 16; ++p) {
    EXPECT_EQ(wgmma_position_pair(wgmma_pair_position(p)), p) << p;
    EXPECT_EQ(wgmma_pair_position(wgmma_position_pair(p)), p) << p;
  }
}

TEST(WgmmaKOrder, FragmentsMeetTheirActivations) {
  // Lane c, k-step h of block b, register slot u (a0/a1 or a2/a3), half t: the weight decoded
  // there is element 32b + 8c + 2(2h + u) + t; wgmma multiplies it with logical K
  // 16(2b + h) + 8u + 2c + t of the shared-memory activations.
  for (int b = 0; b < 4; ++b)
    for (int c = 0; c < 4; ++c)
      for (int h = 0; h < 2; ++h)
        for (int u = 0; u < 2; ++u)
          for (int t = 0; t < 2; ++t) {
            const int weight_k = 32 * b + 8 * c + 2 * (2 * h + u) + t;
            const int logical_k = 16 * (2 * b + h) + 8 * u + 2 * c + t;
            EXPECT_EQ(wgmma_k_position(weight_k), logical_k) << b << c << h << u << t;
          }
}

TEST(WgmmaKOrder, SimulatedProductEqualsDotProduct) {
  constexpr int kK = 2880;  // gpt-oss H: 90 MX blocks
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> value(-8, 8);
  std::vector<std::int64_t> w(kK);
  std::vector<std::int64_t> x(kK);
  for (int k = 0; k < kK; ++k) {
    w[k] = value(rng);
    x[k] = value(rng);
  }
  std::vector<std::int64_t> x_permuted(kK);
  for (int k = 0; k < kK; ++k) x_permuted[wgmma_k_position(k)] = x[k];
  std::int64_t direct = 0;
  for (int k = 0; k < kK; ++k) direct += w[k] * x[k];
  std::int64_t simulated = 0;
  for (int step = 0; step < kK / 16; ++step) {
    const int b = step / 2;
    const int h = step % 2;
    for (int q = 0; q < 16; ++q) {  // the k-step's logical K
      const int c = (q % 8) / 2;
      const int u = q / 8;
      const int t = q % 2;
      simulated += w[32 * b + 8 * c + 2 * (2 * h + u) + t] * x_permuted[16 * step + q];
    }
  }
  EXPECT_EQ(simulated, direct);
}

}  // namespace
}  // namespace mxq::moe::gpu::detail
