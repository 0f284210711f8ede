// Every encoder against CUDA's host conversion functions on all 2^32 fp32 bit patterns, and the
// MXFP4 scale rules and bf16 rounding against their definitions on every input. Label `slow`:
// it runs on all cores (mxq::parallel_for, MXQ_NUM_THREADS) and prints its wall time.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>

#include "formats/codec_oracles.h"
#include "mxq/core/parallel.h"
#include "mxq/formats/bf16.h"
#include "mxq/formats/e2m1.h"
#include "mxq/formats/e4m3.h"
#include "mxq/formats/e8m0.h"
#include "mxq/formats/mxfp4.h"

namespace mxq {
namespace {

using test::from_bits;

// Calls check(bits) for every bits in [0, count) (count <= 2^32) on all worker threads; returns
// how many returned false and prints the first few of them.
template <typename Check>
std::uint64_t sweep(const char* what, std::uint64_t count, Check&& check) {
  const auto start = std::chrono::steady_clock::now();
  std::atomic<std::uint64_t> mismatches{0};
  std::atomic<int> printed{0};
  constexpr std::int64_t kChunk = 1 << 20;
  const auto chunks = static_cast<std::int64_t>((count + kChunk - 1) / kChunk);
  parallel_for(chunks, 1, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t c = begin; c < end; ++c) {
      std::uint64_t local = 0;
      const std::uint64_t first = static_cast<std::uint64_t>(c) * kChunk;
      const std::uint64_t last = std::min<std::uint64_t>(count, first + kChunk);
      for (std::uint64_t i = first; i < last; ++i) {
        const auto bits = static_cast<std::uint32_t>(i);
        if (!check(bits)) {
          ++local;
          if (printed.fetch_add(1) < 5) std::printf("%s: mismatch at input 0x%08X\n", what, bits);
        }
      }
      mismatches += local;
    }
  });
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%s: %llu inputs, %llu mismatches, %.1f s on %d threads\n", what,
              static_cast<unsigned long long>(count),
              static_cast<unsigned long long>(mismatches.load()), seconds, num_threads());
  return mismatches.load();
}

constexpr std::uint64_t kAllFloats = std::uint64_t{1} << 32;
constexpr std::uint64_t kAllMagnitudes = std::uint64_t{1} << 31;  // sign bit clear

#if MXQ_HAVE_CUDA_HEADERS
TEST(Exhaustive, E2M1MatchesCuda) {
  EXPECT_EQ(sweep("e2m1", kAllFloats,
                  [](std::uint32_t bits) {
                    const float x = from_bits(bits);
                    return float_to_e2m1(x) == test::cuda_e2m1(x);
                  }),
            0U);
}

TEST(Exhaustive, E4M3SatFiniteMatchesCuda) {
  EXPECT_EQ(sweep("e4m3 satfinite", kAllFloats,
                  [](std::uint32_t bits) {
                    const float x = from_bits(bits);
                    return float_to_e4m3(x, Fp8Saturation::kSatFinite) == test::cuda_e4m3(x, true);
                  }),
            0U);
}

TEST(Exhaustive, E4M3NoSatMatchesCuda) {
  EXPECT_EQ(sweep("e4m3 nosat", kAllFloats,
                  [](std::uint32_t bits) {
                    const float x = from_bits(bits);
                    return float_to_e4m3(x, Fp8Saturation::kNoSat) == test::cuda_e4m3(x, false);
                  }),
            0U);
}

TEST(Exhaustive, E8M0FloorMatchesCuda) {
  EXPECT_EQ(sweep("e8m0 floor", kAllFloats,
                  [](std::uint32_t bits) {
                    const float x = from_bits(bits);
                    return float_to_e8m0(x, E8m0Rounding::kFloor) == test::cuda_e8m0(x, false);
                  }),
            0U);
}

TEST(Exhaustive, E8M0CeilMatchesCuda) {
  EXPECT_EQ(sweep("e8m0 ceil", kAllFloats,
                  [](std::uint32_t bits) {
                    const float x = from_bits(bits);
                    return float_to_e8m0(x, E8m0Rounding::kCeil) == test::cuda_e8m0(x, true);
                  }),
            0U);
}

// The MXFP4 scale rules compared with CUDA's E8M0 conversion of the fp32 quotients amax/4
// (floor) and amax/6 (ceil). They agree for every amax except one per rule, where the fp32
// division rounds onto a power of two near 2^-126 and mxq's exact exponent arithmetic keeps the
// definition: floor at amax = 2^-124 - 2^-148 (0x017FFFFF; amax/4 rounds up to 2^-126, but
// floor(log2 amax) - 2 = -127), ceil at amax = 6*2^-127 + 2^-148 (0x01400001; amax/6 rounds
// down to 2^-127, which would clamp the block's largest element).
TEST(Exhaustive, Mxfp4ScaleRulesAgainstCudaE8M0) {
  constexpr std::uint32_t kFloorException = 0x017FFFFFU;
  constexpr std::uint32_t kCeilException = 0x01400001U;
  EXPECT_EQ(sweep("mxfp4 floor vs cuda rz(amax/4)", kAllMagnitudes,
                  [](std::uint32_t bits) {
                    const float amax = from_bits(bits);
                    if (std::isnan(amax) || std::isinf(amax) || bits == kFloorException) {
                      return true;
                    }
                    return mxfp4_scale_code(amax, ScaleRule::kFloor) ==
                           test::cuda_e8m0(amax / 4.0F, false);
                  }),
            0U);
  EXPECT_EQ(mxfp4_scale_code(from_bits(kFloorException), ScaleRule::kFloor), 0);
  EXPECT_EQ(test::cuda_e8m0(from_bits(kFloorException) / 4.0F, false), 1);
  EXPECT_EQ(sweep("mxfp4 ceil vs cuda rp(amax/6)", kAllMagnitudes,
                  [](std::uint32_t bits) {
                    const float amax = from_bits(bits);
                    if (std::isnan(amax) || std::isinf(amax) || bits == kCeilException) {
                      return true;
                    }
                    return mxfp4_scale_code(amax, ScaleRule::kCeil) ==
                           test::cuda_e8m0(amax / 6.0F, true);
                  }),
            0U);
  EXPECT_EQ(mxfp4_scale_code(from_bits(kCeilException), ScaleRule::kCeil), 1);
  EXPECT_EQ(test::cuda_e8m0(from_bits(kCeilException) / 6.0F, true), 0);
}
#else
TEST(Exhaustive, CudaComparisons) { GTEST_SKIP() << "CUDA headers not found"; }
#endif

// Both MXFP4 scale rules against their definitions with exact (double, frexp) arithmetic:
// floor X = 2^(floor(log2 amax) - 2); ceil X = the smallest power of two with 6X >= amax; both
// clamped to [2^-127, ...]; non-finite amax -> 0xFF.
TEST(Exhaustive, Mxfp4ScaleRulesMatchTheirDefinitions) {
  const auto expected_code = [](float amax, bool ceil) -> int {
    if (!std::isfinite(amax)) return 0xFF;
    if (amax == 0) return 0;
    int exponent = 0;
    std::frexp(static_cast<double>(amax), &exponent);  // amax = f * 2^exponent, f in [0.5, 1)
    int log2_x = exponent - 1 - 2;
    if (ceil) {
      while (6.0 * std::ldexp(1.0, log2_x) < amax) ++log2_x;
      while (6.0 * std::ldexp(1.0, log2_x - 1) >= amax) --log2_x;
    }
    return std::max(log2_x + 127, 0);
  };
  for (const bool ceil : {false, true}) {
    const ScaleRule rule = ceil ? ScaleRule::kCeil : ScaleRule::kFloor;
    EXPECT_EQ(sweep(ceil ? "mxfp4 ceil rule" : "mxfp4 floor rule", kAllMagnitudes,
                    [&](std::uint32_t bits) {
                      const float amax = from_bits(bits);
                      return mxfp4_scale_code(amax, rule) == expected_code(amax, ceil);
                    }),
              0U);
  }
}

// bf16 rounding against its definition (test::reference_bf16), NaN staying NaN.
TEST(Exhaustive, Bf16RoundingMatchesTheDefinition) {
  EXPECT_EQ(sweep("bf16", kAllFloats,
                  [](std::uint32_t bits) {
                    const float x = from_bits(bits);
                    const std::uint16_t got = float_to_bf16(x);
                    if (std::isnan(x)) return std::isnan(bf16_to_float(got));
                    return got == test::reference_bf16(x);
                  }),
            0U);
}

}  // namespace
}  // namespace mxq
