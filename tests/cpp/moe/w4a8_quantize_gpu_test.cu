// The W4A8 activation quantization of the MoE forward (quantize_activations.cuh) on the device,
// bit for bit against the CPU quantizer (mxq::quantize_fp8_groups, the reference's rounding
// points): every code at its place in the decode and the wgmma layouts, every scale, for rows
// with a short last group, all-zero and negative-zero groups, NaN and Inf, bf16 subnormals,
// values that saturate E4M3's range and ones that round to zero; and the prefill's gather, which
// quantizes a token once and stores it to each of its pairs' slots (a pair of another rank's
// expert, slot -1, writes nothing).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "moe/cuda/quantize_activations.cuh"
#include "moe/device_array.h"
#include "mxq/core/cuda_check.h"
#include "mxq/core/tensor.h"
#include "mxq/formats/bf16.h"
#include "mxq/formats/fp8_block.h"

namespace mxq {
namespace {

using moe::gpu::detail::kFp8QuantizeThreads;
using testing::DeviceArray;

// rows x k bf16: random magnitudes per group (1e-30 .. 1e30) and groups of special values.
std::vector<std::uint16_t> activations(int rows, int k, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0F, 1.0F);
  std::uniform_int_distribution<int> exponent(-100, 100);
  std::vector<std::uint16_t> x(static_cast<std::size_t>(rows) * k);
  for (int r = 0; r < rows; ++r) {
    for (int g = 0; g * 128 < k; ++g) {
      const float magnitude = std::ldexp(1.0F, exponent(rng));
      const int kind = (r * 7 + g) % 9;
      for (int i = g * 128; i < std::min(k, g * 128 + 128); ++i) {
        float v = normal(rng) * magnitude;
        if (kind == 0) v = 0.0F;                         // all zero: the 1e-4 floor
        if (kind == 1) v = (i % 3 == 0) ? -0.0F : 0.0F;  // negative zeros
        if (kind == 2 && i == g * 128 + 5) v = NAN;      // a NaN scale
        if (kind == 3 && i == g * 128 + 77 % (k - g * 128)) v = -INFINITY;
        if (kind == 4) v = normal(rng) * 1e-39F;  // bf16 subnormals (scale floor)
        if (kind == 5 && i % 17 == 0) v = normal(rng) * magnitude * 1e-6F;  // round to zero
        x[static_cast<std::size_t>(r) * k + i] = float_to_bf16(v);
      }
    }
  }
  return x;
}

struct Expected {
  std::vector<std::uint8_t> q;  // [rows, k]
  std::vector<float> scale;     // [rows, groups]
};

Expected cpu_groups(const std::vector<std::uint16_t>& x, int rows, int k) {
  Tensor t = Tensor::empty(DType::kBF16, {rows, k});
  std::memcpy(t.data(), x.data(), x.size() * sizeof(std::uint16_t));
  const Fp8BlockTensor g = quantize_fp8_groups(t, 128, ScaleMode::kFp32);
  Expected e;
  const auto* q = static_cast<const std::uint8_t*>(g.q.data());
  e.q.assign(q, q + g.q.numel());
  e.scale.assign(g.scale.data_as<float>(), g.scale.data_as<float>() + g.scale.numel());
  return e;
}

bool same_bits(float a, float b) {
  std::uint32_t x = 0;
  std::uint32_t y = 0;
  std::memcpy(&x, &a, 4);
  std::memcpy(&y, &b, 4);
  return x == y || (std::isnan(a) && std::isnan(b));
}

class W4a8QuantizeGpu : public ::testing::TestWithParam<int> {};  // k

TEST_P(W4a8QuantizeGpu, DecodeLayoutMatchesTheCpuQuantizerBitForBit) {
  const int k = GetParam();
  const int rows = 37;
  const int groups = moe::gpu::detail::w4a8_act_groups(k);
  const int pitch = moe::gpu::detail::w4a8_act_pitch(k);
  const std::vector<std::uint16_t> x = activations(rows, k, 11);
  const Expected want = cpu_groups(x, rows, k);
  const DeviceArray<std::uint16_t> d_x(x);
  const DeviceArray<std::uint8_t> d_q(
      std::vector<std::uint8_t>(static_cast<std::size_t>(rows) * pitch, 0xA5));
  const DeviceArray<float> d_s(std::vector<float>(static_cast<std::size_t>(rows) * groups, -1.0F));
  moe::gpu::detail::quantize_fp8_groups_kernel<true>
      <<<moe::gpu::detail::fp8_quantize_blocks(rows, k), kFp8QuantizeThreads>>>(
          d_x.get(), rows, k, d_q.get(), d_s.get());
  MXQ_CUDA_CHECK(cudaGetLastError());
  const auto q = d_q.download();
  const auto s = d_s.download();
  for (int r = 0; r < rows; ++r) {
    for (int i = 0; i < pitch; ++i) {
      const std::uint8_t expected = i < k ? want.q[static_cast<std::size_t>(r) * k + i] : 0;
      ASSERT_EQ(q[static_cast<std::size_t>(r) * pitch + moe::gpu::detail::w4a8_act_offset(i)],
                expected)
          << "row " << r << " k " << i;
    }
    for (int g = 0; g < groups; ++g) {
      const std::size_t at = static_cast<std::size_t>(r) * groups + g;
      ASSERT_TRUE(same_bits(s[at], want.scale[at]))
          << "row " << r << " group " << g << ": " << s[at] << " vs " << want.scale[at];
    }
  }
}

// gather: x by token, stored to the slots of the token's pairs (pair_slot; -1 = another rank's
// expert); else the rows are the slots.
void check_wgmma_layout(int k, bool gather) {
  const int tokens = 29;
  const int top_k = 3;
  const int pairs = tokens * top_k;
  const int rows = gather ? tokens : pairs;
  const int groups = moe::gpu::detail::w4a8_act_groups(k);
  const int pitch = moe::gpu::detail::w4a8_act_pitch(k);
  const std::size_t scale_pitch = moe::gpu::detail::w4a8_wgmma_scale_pitch(pairs);
  const std::vector<std::uint16_t> x = activations(rows, k, 23);
  const Expected want = cpu_groups(x, rows, k);
  // A permutation of the slots, every fifth pair on another rank.
  std::vector<int> pair_slot(pairs);
  for (int p = 0; p < pairs; ++p) pair_slot[p] = p % 5 == 4 ? -1 : (p * 31 + 7) % pairs;
  const DeviceArray<std::uint16_t> d_x(x);
  const DeviceArray<int> d_slots(pair_slot);
  constexpr std::uint8_t kPoison = 0xA5;
  const DeviceArray<std::uint8_t> d_q(
      std::vector<std::uint8_t>(static_cast<std::size_t>(pairs) * pitch, kPoison));
  const DeviceArray<float> d_s(std::vector<float>(scale_pitch * groups, -1.0F));
  const auto kernel = gather ? moe::gpu::detail::quantize_fp8_groups_by_slot_kernel<true>
                             : moe::gpu::detail::quantize_fp8_groups_by_slot_kernel<false>;
  kernel<<<moe::gpu::detail::fp8_quantize_blocks(rows, k), kFp8QuantizeThreads>>>(
      d_x.get(), d_slots.get(), rows, top_k, k, d_q.get(), d_s.get(), scale_pitch);
  MXQ_CUDA_CHECK(cudaGetLastError());
  const auto q = d_q.download();
  const auto s = d_s.download();
  std::vector<int> source_of_slot(pairs, -1);  // the row each slot holds, -1 none
  for (int p = 0; p < pairs; ++p) {
    if (!gather)
      source_of_slot[p] = p;
    else if (pair_slot[p] >= 0)
      source_of_slot[pair_slot[p]] = p / top_k;
  }
  for (int slot = 0; slot < pairs; ++slot) {
    const int row = source_of_slot[slot];
    for (int i = 0; i < pitch; ++i) {
      const std::uint8_t got =
          q[static_cast<std::size_t>(slot) * pitch + moe::gpu::detail::w4a8_wgmma_act_offset(i)];
      if (row < 0) {
        ASSERT_EQ(got, kPoison) << "slot " << slot << " of no pair was written";
        continue;
      }
      const std::uint8_t expected = i < k ? want.q[static_cast<std::size_t>(row) * k + i] : 0;
      ASSERT_EQ(got, expected) << "slot " << slot << " (row " << row << ") k " << i;
    }
    for (int g = 0; g < groups; ++g) {
      const float got = s[static_cast<std::size_t>(g) * scale_pitch + slot];
      if (row < 0) {
        ASSERT_EQ(got, -1.0F) << "slot " << slot;
        continue;
      }
      const float expected = want.scale[static_cast<std::size_t>(row) * groups + g];
      ASSERT_TRUE(same_bits(got, expected))
          << "slot " << slot << " group " << g << ": " << got << " vs " << expected;
    }
  }
}

TEST_P(W4a8QuantizeGpu, WgmmaLayoutBySlotMatchesTheCpuQuantizerBitForBit) {
  check_wgmma_layout(GetParam(), false);
}

TEST_P(W4a8QuantizeGpu, GatherQuantizesATokenOnceIntoEachOfItsSlots) {
  check_wgmma_layout(GetParam(), true);
}

// 2880: gpt-oss (a half last group); 160: a 32-value last group; 256: whole groups.
INSTANTIATE_TEST_SUITE_P(K, W4a8QuantizeGpu, ::testing::Values(2880, 160, 256));

}  // namespace
}  // namespace mxq
