// The device layouts of the W4A8 MoE GEMMs (MoeParams::activation_quant = kFp8Group128): packed
// MXFP4 weights arranged so that a word decodes to two registers of E4M3 bytes by bit placement,
// and FP8 activations arranged so that each lane reads its operand of a 128-wide K chunk with
// two 16-byte loads. Host and device code share this header; tests check it on the host.
//
// Why E4M3 by bit placement: an E2M1 code's magnitude bits [e1 e0 m] at bits 2..4 of a byte and
// its sign at bit 7 read as E4M3 (bias 7) give exactly e2m1 * 2^-6, the subnormal 0.5 included
// (E4M3 subnormals are 2^-6 * m/8). The m16n8k32 mma then multiplies one MX block (32 values of
// one row) per instruction, and the block's scale 2^(s-127), with the 2^6, multiplies its fp32
// result once (the scale is per row and block, so it cannot ride in the shared B operand).
//
// Weight word bits (one 32-bit word = 8 codes e0..e7 of one row along K):
//   register A = w & 0x9C9C9C9C                                  byte i = E4M3 of e_i
//   register B = ((w << 2) & 0x8C8C8C8C) | ((w >> 2) & 0x10101010)  byte i = E4M3 of e_{4+i}
// i.e. e_i (i < 4) at bits 8i + {2, 3, 4} (magnitude) and 8i + 7 (sign); e_{4+i} at
// 8i + {0, 1, 6} and 8i + 5.
//
// Word order: a row's K is cut into 128-wide chunks (the last may hold nb < 4 MX blocks); lane c
// of a quad takes word c of every block of the chunk, so within the chunk word c of block b
// moves to position c * nb + b (lane c's words are contiguous: 16 bytes of a full chunk).
//
// Rows: in groups of 16, chunk-major, as in the W4A16 layout (row_groups.h).
//
// Activations: E4M3 rows of round_up(K, 128) bytes (zeros past K) with one fp32 scale per
// 128-group; within chunk q element 32b + 8c + i (block b, lane c, i < 8) sits at byte
// 32c + 8b + i, so lane c's 8 values of each block are the mma's B registers (4 + 4 bytes)
// matching register A and B of its weight word.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "moe/layout/row_groups.h"
#include "moe/layout/word_permutation.h"
#include "mxq/core/macros.h"

namespace mxq::moe::gpu::detail {

inline constexpr int kW4a8Chunk = kLayoutChunk;  // K values per chunk = one activation group

// The device-word bit holding bit b of code e (b = 0..2 magnitude, 3 sign).
MXQ_HD_INLINE constexpr int w4a8_bit(int e, int b) {
  constexpr int kLow[4] = {2, 3, 4, 7};   // e0..e3: register A in place
  constexpr int kHigh[4] = {0, 1, 6, 5};  // e4..e7: register B after the two shifts
  return e < 4 ? 8 * e + kLow[b] : 8 * (e - 4) + kHigh[b];
}

// Registers A (codes e0..e3) and B (e4..e7) of a device word: 4 E4M3 bytes each, e2m1 * 2^-6.
MXQ_HD_INLINE constexpr std::uint32_t w4a8_register_a(std::uint32_t w) { return w & 0x9C9C9C9CU; }
MXQ_HD_INLINE constexpr std::uint32_t w4a8_register_b(std::uint32_t w) {
  return ((w << 2) & 0x8C8C8C8CU) | ((w >> 2) & 0x10101010U);
}

// Checkpoint-layout word (e_j in bits 4j..4j+3) -> device word, and back.
MXQ_HD_INLINE constexpr std::uint32_t to_w4a8_word(std::uint32_t natural) {
  std::uint32_t out = 0;
  for (int e = 0; e < 8; ++e)
    for (int b = 0; b < 4; ++b) out |= ((natural >> (4 * e + b)) & 1U) << w4a8_bit(e, b);
  return out;
}
MXQ_HD_INLINE constexpr std::uint32_t from_w4a8_word(std::uint32_t device) {
  std::uint32_t out = 0;
  for (int e = 0; e < 8; ++e)
    for (int b = 0; b < 4; ++b) out |= ((device >> w4a8_bit(e, b)) & 1U) << (4 * e + b);
  return out;
}

// to_w4a8_word and from_w4a8_word as tables, for the host's conversions (word_permutation.h).
inline constexpr WordPermutation kToW4a8Word =
    tabulate_word_permutation([](std::uint32_t w) { return to_w4a8_word(w); });
inline constexpr WordPermutation kFromW4a8Word =
    tabulate_word_permutation([](std::uint32_t w) { return from_w4a8_word(w); });

// Position within its chunk of word c of block b, for a chunk of nb blocks.
MXQ_HD_INLINE constexpr int w4a8_word_position(int block, int word, int nb) {
  return word * nb + block;
}

// One row-chunk (nb blocks = 4 * nb words from `words`) from the checkpoint layout into the
// device layout, out of place.
MXQ_HD_INLINE void w4a8_convert_chunk(const std::uint32_t* in, int nb, std::uint32_t* out) {
  for (int b = 0; b < nb; ++b) {
    for (int c = 0; c < 4; ++c) {
#if defined(__CUDA_ARCH__)
      out[w4a8_word_position(b, c, nb)] = to_w4a8_word(in[4 * b + c]);
#else
      out[w4a8_word_position(b, c, nb)] = kToW4a8Word(in[4 * b + c]);
#endif
    }
  }
}

// Converts `rows` (a multiple of 16) packed rows of K values (K/2 bytes each, K a multiple of
// 32) in place: words placed by w4a8_convert_chunk, rows in groups (row_groups.h).
inline void to_w4a8_layout_host(std::uint8_t* packed, std::size_t rows, int k) {
  to_row_groups_host(packed, rows, k, w4a8_convert_chunk);
}

// The inverse of w4a8_convert_chunk: checkpoint-layout words in their order.
MXQ_HD_INLINE void w4a8_unconvert_chunk(const std::uint32_t* in, int nb, std::uint32_t* out) {
  for (int b = 0; b < nb; ++b) {
    for (int c = 0; c < 4; ++c) {
#if defined(__CUDA_ARCH__)
      out[4 * b + c] = from_w4a8_word(in[w4a8_word_position(b, c, nb)]);
#else
      out[4 * b + c] = kFromW4a8Word(in[w4a8_word_position(b, c, nb)]);
#endif
    }
  }
}

// The checkpoint layout of `rows` rows in the W4A8 device layout, out of place.
inline void from_w4a8_layout_host(const std::uint8_t* device, std::uint8_t* natural,
                                  std::size_t rows, int k) {
  from_row_groups_host(device, natural, rows, k, w4a8_unconvert_chunk);
}

// ---- activations

// Bytes per E4M3 activation row of K values, and its 128-groups (scales per row).
MXQ_HD_INLINE constexpr int w4a8_act_pitch(int k) {
  return (k + kW4a8Chunk - 1) / kW4a8Chunk * kW4a8Chunk;
}
MXQ_HD_INLINE constexpr int w4a8_act_groups(int k) { return (k + kW4a8Chunk - 1) / kW4a8Chunk; }

// Byte offset of element k within its row.
MXQ_HD_INLINE constexpr int w4a8_act_offset(int k) {
  const int r = k % kW4a8Chunk;
  return k - r + 32 * ((r % 32) / 8) + 8 * (r / 32) + r % 8;
}

// ---- block scales

// Whether any of 4 packed E8M0 bytes is above 248: those (2^122..2^127, and 255 = NaN) overflow
// the fast factor 2^(s - 121) and take the exact path. No carries cross bytes (0x7F + 7 < 0x100).
MXQ_HD_INLINE constexpr bool w4a8_any_large_scale(std::uint32_t packed) {
  return ((((packed & 0x7F7F7F7FU) + 0x07070707U) & packed) & 0x80808080U) != 0U;
}

// Bits of the fp32 factor 2^(s - 121) = 2^(s - 127) * 2^6 of byte kBlock of packed scales all
// <= 248, from biased = packed + kW4a8ScaleBias (each byte s + 6 <= 254: no carries).
inline constexpr std::uint32_t kW4a8ScaleBias = 0x06060606U;
template <int kBlock>
MXQ_HD_INLINE constexpr std::uint32_t w4a8_fast_factor_bits(std::uint32_t biased) {
  static_assert(kBlock >= 0 && kBlock < 4, "4 MX blocks per chunk");
  if constexpr (kBlock == 3) {
    return (biased >> 1) & 0x7F800000U;
  } else {
    return (biased << (23 - 8 * kBlock)) & 0x7F800000U;
  }
}

// Bits of 2^(s - 127) exactly, for every byte: 2^-127 is subnormal, 255 is NaN.
MXQ_HD_INLINE constexpr std::uint32_t w4a8_exact_scale_bits(std::uint32_t s) {
  return s == 0xFFU ? 0x7FC00000U : (s == 0U ? 0x00400000U : s << 23);
}

}  // namespace mxq::moe::gpu::detail
