// The device layout of packed MXFP4 weights: within each 32-bit word (8 E2M1 codes e0..e7 along
// K, e_j in bits 4j..4j+3 in the checkpoint's layout) the 32 bits are permuted once at upload so
// that the kernels decode a word into 4 bf16x2 registers with 9 integer instructions (one AND,
// rotations and masks) instead of 16 shifts and masks, and so that register i holds the
// natural pair (e_{2i}, e_{2i+1}): the activations' bf16x2 words then pair with it as they lie
// in memory, with no byte permutes. MX blocks (16 bytes) and their scales do not move.
//
// Register i of a word w reads, before the scale: code e_{2i} at bits 6..8 (magnitude) and 15
// (sign), code e_{2i+1} at bits 22..24 and 31; 3 magnitude bits at bf16 bits 6..8 read as
// exponent/mantissa with bias 127 instead of 1, so every code (the subnormal 0.5 included) is
// exactly e2m1 * 2^-126 (the scale factors of mxfp4_mma.cuh fold 2^126 back in):
//   reg0 = w & M,  reg1 = rotl(w, 4) & M,  reg2 = rotl(w, 10) & M,   M = 0x81C081C0
//   reg3 = (rotl(w, 6) & 0x80C080C0) | (rotl(w, 14) & 0x01000100)
// device_bit below is the inverse: where each bit of each code must sit in w for that to hold.
// Rows are stored in groups of 16, chunk-major (row_groups.h), as in the W4A8 layout.
// Host and device code share this header; tests check the round trip on every bit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "moe/layout/row_groups.h"
#include "moe/layout/word_permutation.h"
#include "mxq/core/macros.h"

namespace mxq::moe::gpu::detail {

// The device-word bit holding bit b of code e (b = 0..2 magnitude, 3 sign).
MXQ_HD_INLINE constexpr int device_bit(int e, int b) {
  constexpr int kBit[8][4] = {
      {6, 7, 8, 15},   {22, 23, 24, 31},  // register 0: e0, e1
      {2, 3, 4, 11},   {18, 19, 20, 27},  // register 1: e2, e3
      {28, 29, 30, 5}, {12, 13, 14, 21},  // register 2: e4, e5
      {0, 1, 26, 9},   {16, 17, 10, 25},  // register 3: e6, e7
  };
  return kBit[e][b];
}

MXQ_HD_INLINE constexpr std::uint32_t rotl32(std::uint32_t w, int n) {
  return (w << n) | (w >> (32 - n));
}

// Register i (0..3) of a device word, unscaled: (e_{2i}, e_{2i+1}) as bf16x2 * 2^-126.
template <int kRegister>
MXQ_HD_INLINE constexpr std::uint32_t device_word_register(std::uint32_t w) {
  static_assert(kRegister >= 0 && kRegister < 4, "register index 0..3");
  constexpr std::uint32_t kMask = 0x81C081C0U;
  if constexpr (kRegister == 0) return w & kMask;
  if constexpr (kRegister == 1) return rotl32(w, 4) & kMask;
  if constexpr (kRegister == 2) return rotl32(w, 10) & kMask;
  return (rotl32(w, 6) & 0x80C080C0U) | (rotl32(w, 14) & 0x01000100U);
}

// ---- E8M0 scale factors for those registers (the decode's fast path; mxfp4_mma.cuh has the
// general e8m0_scale_factors for scales above 128 and NaN).

// The one bf16x2 factor 2^(scale - 1) that turns e2m1 * 2^-126 into e2m1 * 2^(scale - 127), for
// a scale byte <= 128: the biased exponent scale + 126 in bits 7..14 of both halves.
MXQ_HD_INLINE constexpr std::uint32_t narrow_scale_factor(std::uint32_t scale) {
  return scale * 0x00800080U + 0x3F003F00U;
}

// Packed scales (MX block b of a 128-wide K chunk in byte b): whether any byte is above 128
// (129..254 need a second factor, 255 is NaN), i.e. has its top bit and any low bit set. No
// carries cross bytes: 0x7F + 0x7F < 0x100.
MXQ_HD_INLINE constexpr bool any_wide_scale_byte(std::uint32_t packed) {
  return ((((packed & 0x7F7F7F7FU) + 0x7F7F7F7FU) & packed) & 0x80808080U) != 0U;
}

// narrow_scale_factor of byte kBlock of packed scales that are all <= 128, from
// biased = packed + kPackedScaleBias (each byte scale + 126 <= 254: no carries): on the device
// one byte permute (the byte to bits 8..15 and 24..31) and one shift.
inline constexpr std::uint32_t kPackedScaleBias = 0x7E7E7E7EU;
template <int kBlock>
MXQ_HD_INLINE std::uint32_t packed_narrow_scale_factor(std::uint32_t biased) {
  static_assert(kBlock >= 0 && kBlock < 4, "4 MX blocks per chunk");
#if defined(__CUDA_ARCH__)
  return __byte_perm(biased, 0U, 0x0404U | (kBlock << 4) | (kBlock << 12)) >> 1;
#else
  const std::uint32_t exponent = (biased >> (8 * kBlock)) & 0xFFU;
  return (exponent << 7) | (exponent << 23);
#endif
}

// Checkpoint-layout word -> device word.
MXQ_HD_INLINE constexpr std::uint32_t to_device_word(std::uint32_t natural) {
  std::uint32_t out = 0;
  for (int e = 0; e < 8; ++e)
    for (int b = 0; b < 4; ++b) out |= ((natural >> (4 * e + b)) & 1U) << device_bit(e, b);
  return out;
}

// Device word -> checkpoint-layout word.
MXQ_HD_INLINE constexpr std::uint32_t from_device_word(std::uint32_t device) {
  std::uint32_t out = 0;
  for (int e = 0; e < 8; ++e)
    for (int b = 0; b < 4; ++b) out |= ((device >> device_bit(e, b)) & 1U) << (4 * e + b);
  return out;
}

// to_device_word and from_device_word as tables, for the host's conversions.
inline constexpr WordPermutation kToDeviceWord =
    tabulate_word_permutation([](std::uint32_t w) { return to_device_word(w); });
inline constexpr WordPermutation kFromDeviceWord =
    tabulate_word_permutation([](std::uint32_t w) { return from_device_word(w); });

// Converts packed FP4 bytes (a multiple of 4, little-endian words) to device words in place, rows
// untouched (the word-level tests' view).
inline void to_device_words_host(std::uint8_t* packed, std::size_t bytes) {
  for (std::size_t i = 0; i + 4 <= bytes; i += 4) {
    std::uint32_t w;
    std::memcpy(&w, packed + i, 4);
    w = kToDeviceWord(w);
    std::memcpy(packed + i, &w, 4);
  }
}

// One row chunk (nb blocks = 4 * nb words) into the device layout, out of place: device words in
// the checkpoint's order (lane c of a quad reads MX block c: 16 bytes at 16 c).
MXQ_HD_INLINE void device_convert_chunk(const std::uint32_t* in, int nb, std::uint32_t* out) {
#if defined(__CUDA_ARCH__)
  for (int j = 0; j < 4 * nb; ++j) out[j] = to_device_word(in[j]);
#else
  for (int j = 0; j < 4 * nb; ++j) out[j] = kToDeviceWord(in[j]);
#endif
}

// The W4A16 device layout of `rows` (a multiple of 16) packed rows of k values (a multiple of
// 32), in place: device words, rows in groups (row_groups.h).
inline void to_device_layout_host(std::uint8_t* packed, std::size_t rows, int k) {
  to_row_groups_host(packed, rows, k, device_convert_chunk);
}

// The inverse of device_convert_chunk: checkpoint-layout words.
MXQ_HD_INLINE void device_unconvert_chunk(const std::uint32_t* in, int nb, std::uint32_t* out) {
#if defined(__CUDA_ARCH__)
  for (int j = 0; j < 4 * nb; ++j) out[j] = from_device_word(in[j]);
#else
  for (int j = 0; j < 4 * nb; ++j) out[j] = kFromDeviceWord(in[j]);
#endif
}

// The checkpoint layout of `rows` rows in the W4A16 device layout, out of place.
inline void from_device_layout_host(const std::uint8_t* device, std::uint8_t* natural,
                                    std::size_t rows, int k) {
  from_row_groups_host(device, natural, rows, k, device_unconvert_chunk);
}

}  // namespace mxq::moe::gpu::detail
