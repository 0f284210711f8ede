// Test oracles for the format codecs, independent of the code under test:
//  - brute-force references that decode every code with a direct formula (double precision) and
//    pick the nearest one (ties to the even code), from the formats' definitions;
//  - thin wrappers over CUDA's host conversion functions (cuda_fp4.h / cuda_fp8.h), available
//    when MXQ_HAVE_CUDA_HEADERS is set;
//  - the input sets the default run sweeps: every rounding boundary of every fp32 binade with
//    its float neighbours, special values, and random inputs.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#if MXQ_HAVE_CUDA_HEADERS
#include <cuda_fp4.h>
#include <cuda_fp8.h>
#endif

namespace mxq::test {

inline float from_bits(std::uint32_t bits) { return std::bit_cast<float>(bits); }
inline std::uint32_t to_bits(float value) { return std::bit_cast<std::uint32_t>(value); }

// ---- direct decode formulas ------------------------------------------------------------------

// E2M1: (-1)^s * {0, 0.5, 1, 1.5, 2, 3, 4, 6}[c & 7].
inline double e2m1_value(std::uint8_t code) {
  static constexpr std::array<double, 8> kMagnitudes = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  const double magnitude = kMagnitudes[code & 7];
  return (code & 8) ? -magnitude : magnitude;
}

// E4M3 fn without the NaN rule: e = 0 -> m * 2^-9, else 2^(e-7) * (1 + m/8). Code 0x7F would
// be 480 in the unbounded format (used as the overflow candidate by the encoder reference).
inline double e4m3_pattern_value(std::uint8_t code) {
  const int exponent = (code >> 3) & 0xF;
  const int mantissa = code & 7;
  const double magnitude =
      exponent == 0 ? std::ldexp(mantissa, -9) : std::ldexp(1.0 + mantissa / 8.0, exponent - 7);
  return (code & 0x80) ? -magnitude : magnitude;
}
inline bool e4m3_is_nan(std::uint8_t code) { return (code & 0x7F) == 0x7F; }

// E8M0: 2^(b-127) for b <= 254, NaN for 255.
inline double e8m0_value(std::uint8_t code) {
  return code == 0xFF ? std::numeric_limits<double>::quiet_NaN() : std::ldexp(1.0, code - 127);
}

// ---- brute-force encoders --------------------------------------------------------------------

// Nearest of the non-negative grid values (ascending, index = code) to |x|; ties to the even
// index. Returns the index.
template <std::size_t N>
int nearest_even(const std::array<double, N>& grid, double magnitude) {
  const auto it = std::lower_bound(grid.begin(), grid.end(), magnitude);
  if (it == grid.begin()) return 0;
  if (it == grid.end()) return static_cast<int>(N) - 1;
  const int above = static_cast<int>(it - grid.begin());
  const int below = above - 1;
  const double up = grid[static_cast<std::size_t>(above)] - magnitude;
  const double down = magnitude - grid[static_cast<std::size_t>(below)];
  if (up < down) return above;
  if (down < up) return below;
  return (above % 2 == 0) ? above : below;
}

// RNE onto E2M1, |x| > 6 and Inf saturate to 6, sign kept on zero; NaN -> 0x7 (the choice of
// CUDA, which mxq follows).
// Takes a double so that exact quotients (x / X in MXFP4) can be passed unrounded.
inline std::uint8_t reference_e2m1(double x) {
  if (std::isnan(x)) return 0x7;
  static const std::array<double, 8> kGrid = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  const double magnitude = std::fabs(x);
  const int code = std::isinf(x) ? 7 : nearest_even(kGrid, magnitude);
  return static_cast<std::uint8_t>((std::signbit(x) ? 8 : 0) | code);
}

// RNE onto E4M3 with an unbounded exponent: 0x7F stands for 480 (the next value past 448), so a
// magnitude above 464 rounds there; that is overflow: 448 when saturating, NaN (0x7F) when not.
// +-Inf overflow the same way. NaN -> 0x7F (CUDA's float path drops the NaN's sign).
inline std::uint8_t reference_e4m3(double x, bool saturate) {
  if (std::isnan(x)) return 0x7F;
  static const std::array<double, 128> kGrid = [] {
    std::array<double, 128> grid{};
    for (int c = 0; c < 128; ++c)
      grid[static_cast<std::size_t>(c)] = e4m3_pattern_value(static_cast<std::uint8_t>(c));
    return grid;
  }();
  const int sign = std::signbit(x) ? 0x80 : 0;
  int code = std::isinf(x) ? 0x7F : nearest_even(kGrid, std::fabs(x));
  if (code == 0x7F) code = saturate ? 0x7E : 0x7F;
  return static_cast<std::uint8_t>(sign | code);
}

// Power of two at or below (floor) or at or above (ceil) |x|, from frexp, clamped to
// [2^-127, 2^127]; 0 -> 2^-127; Inf -> 2^127 (saturating); NaN -> 0xFF.
inline std::uint8_t reference_e8m0(float x, bool ceil) {
  if (std::isnan(x)) return 0xFF;
  if (std::isinf(x)) return 0xFE;
  if (x == 0) return 0x00;
  int exponent = 0;
  const double fraction = std::frexp(std::fabs(static_cast<double>(x)), &exponent);  // [0.5, 1)
  const int floor_log2 = exponent - 1;
  const int log2 = (ceil && fraction != 0.5) ? floor_log2 + 1 : floor_log2;
  return static_cast<std::uint8_t>(std::clamp(log2 + 127, 0, 254));
}

// fp32 -> bf16 by its definition: the nearer of the two bf16 neighbours of x (ties to the even
// pattern); past the largest finite bf16 the next pattern is Inf, which rounding treats as
// 2^128 (IEEE overflow). NaN is not handled here (callers check it separately).
inline std::uint16_t reference_bf16(float x) {
  const std::uint32_t bits = to_bits(x);
  const auto below = static_cast<std::uint16_t>(bits >> 16);  // toward zero
  if ((bits & 0xFFFFU) == 0) return below;                    // exact
  const auto above = static_cast<std::uint16_t>(below + 1);   // away from zero
  const auto magnitude_of = [](std::uint16_t pattern) {
    return (pattern & 0x7F80U) == 0x7F80U
               ? std::ldexp(1.0, 128)
               : std::fabs(
                     static_cast<double>(from_bits(static_cast<std::uint32_t>(pattern) << 16)));
  };
  const double magnitude = std::fabs(static_cast<double>(x));
  const double down = magnitude - magnitude_of(below);
  const double up = magnitude_of(above) - magnitude;
  if (down < up) return below;
  if (up < down) return above;
  return (below & 1) ? above : below;
}

// ---- CUDA's host conversion functions --------------------------------------------------------

#if MXQ_HAVE_CUDA_HEADERS
inline std::uint8_t cuda_e2m1(float x) {
  return static_cast<std::uint8_t>(__nv_cvt_float_to_fp4(x, __NV_E2M1, cudaRoundNearest));
}
inline std::uint8_t cuda_e4m3(float x, bool saturate) {
  return static_cast<std::uint8_t>(
      __nv_cvt_float_to_fp8(x, saturate ? __NV_SATFINITE : __NV_NOSAT, __NV_E4M3));
}
inline std::uint8_t cuda_e8m0(float x, bool ceil) {
  return static_cast<std::uint8_t>(
      __nv_cvt_float_to_e8m0(x, __NV_SATFINITE, ceil ? cudaRoundPosInf : cudaRoundZero));
}
inline float cuda_e2m1_to_float(std::uint8_t code) {
  return __half2float(__half(__nv_cvt_fp4_to_halfraw(code, __NV_E2M1)));
}
inline float cuda_e4m3_to_float(std::uint8_t code) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(code, __NV_E4M3)));
}
inline float cuda_e8m0_to_float(std::uint8_t code) {
  return from_bits(static_cast<std::uint32_t>(__nv_cvt_e8m0_to_bf16raw(code).x) << 16);
}
#endif

// ---- inputs ----------------------------------------------------------------------------------

// For both signs and every fp32 exponent field (0..255, so subnormals, Inf and NaN included),
// the mantissas k * 2^15 (k = 0..255) and their neighbours within 2 ulps. Every rounding
// boundary of E2M1 (mantissa multiples of 2^21 in normal binades, coarser ones below), E4M3
// (multiples of 2^19), E8M0 (powers of two) and of the MXFP4 ceil rule (significand 1.5) is
// one of these mantissas, so each midpoint, each representable value and the floats on either
// side of them are all covered.
inline std::vector<std::uint32_t> boundary_inputs() {
  std::vector<std::uint32_t> inputs;
  inputs.reserve(2 * 256 * 256 * 5);
  for (std::uint32_t sign = 0; sign < 2; ++sign) {
    for (std::uint32_t exponent = 0; exponent < 256; ++exponent) {
      for (std::uint32_t k = 0; k < 256; ++k) {
        const std::uint32_t center = (sign << 31) | (exponent << 23) | (k << 15);
        for (std::int32_t delta = -2; delta <= 2; ++delta) {
          inputs.push_back(center + static_cast<std::uint32_t>(delta));
        }
      }
    }
  }
  return inputs;
}

// `count` uniformly random fp32 bit patterns, then `count` values of random sign, mantissa and
// an exponent in [min_exp, max_exp] (the range where a format's codes live).
inline std::vector<std::uint32_t> random_inputs(std::size_t count, int min_exp, int max_exp,
                                                std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::uint32_t> inputs;
  inputs.reserve(2 * count);
  for (std::size_t i = 0; i < count; ++i) inputs.push_back(static_cast<std::uint32_t>(rng()));
  std::uniform_int_distribution<int> exponent(min_exp + 127, max_exp + 127);
  for (std::size_t i = 0; i < count; ++i) {
    const auto bits = static_cast<std::uint32_t>(rng());
    inputs.push_back((bits & 0x807FFFFFU) | (static_cast<std::uint32_t>(exponent(rng)) << 23));
  }
  return inputs;
}

// Runs `expected` and `actual` over `inputs` (fp32 bit patterns); returns the number of
// mismatches and prints the first few.
template <typename Expected, typename Actual>
std::size_t count_mismatches(const std::vector<std::uint32_t>& inputs, Expected&& expected,
                             Actual&& actual, const char* what) {
  std::size_t mismatches = 0;
  for (const std::uint32_t bits : inputs) {
    const float x = from_bits(bits);
    const unsigned want = expected(x);
    const unsigned got = actual(x);
    if (want != got && ++mismatches <= 5) {
      std::printf("%s: input 0x%08X (%.9g): expected 0x%02X, got 0x%02X\n", what, bits,
                  static_cast<double>(x), want, got);
    }
  }
  return mismatches;
}

}  // namespace mxq::test
