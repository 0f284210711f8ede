// The device layouts of the W4A8 MoE GEMMs (MoeParams::activation_quant = kFp8Group128): packed
// MXFP4 weights arranged so that a word decodes to two registers of E4M3 bytes by a byte table,
// and FP8 activations arranged for the operand each GEMM variant reads. Host and device code
// share this header; tests check it on the host.
//
// Why a byte table: one PRMT picks 4 bytes out of 8 by 4 selector nibbles, so with the 3
// magnitude bits of 4 codes in the low 4 nibbles of a word and the 8-byte table {E4M3 of
// m * 2^t : m = 0, 0.5, 1, 1.5, 2, 3, 4, 6}, a PRMT and an OR with the signs give 4 E4M3 bytes
// worth exactly e2m1 * 2^t. The m16n8k32 mma (decode_mma, t = -6: every code exact, 0.5 as the
// subnormal 2^-7) then multiplies one MX block per instruction and its fp32 result takes the
// block scale 2^(s-127) * 2^6; the wgmma GEMMs (prefill_wgmma) fold each block's scale into its
// table instead (t = 6 - e for a block 2^-e below the row's largest scale in the chunk, e <= 11:
// every nonzero value a normal E4M3) and take one factor per row and 128-wide chunk.
//
// Weight word bits (one 32-bit word = 8 codes e0..e7 of one row along K):
//   e_i (i < 4):  magnitude at bits 4i .. 4i + 2 (nibble i),      sign at bit 8i + 7
//   e_{4+i}:      magnitude at bits 16 + 4i .. + 2 (nibble 4 + i), sign at bit 8i + 3
//   register A = prmt(table, w & 0x7777) | (w & 0x80808080)                 byte i = e_i
//   register B = prmt(table, (w >> 16) & 0x7777) | ((w << 4) & 0x80808080)  byte i = e_{4+i}
//
// Word order: a row's K is cut into 128-wide chunks (the last may hold nb < 4 MX blocks); lane c
// of a quad takes word c of every block of the chunk, so within the chunk word c of block b
// moves to position c * nb + b (lane c's words are contiguous: 16 bytes of a full chunk).
//
// Rows: in groups of 16, chunk-major, as in the W4A16 layout (row_groups.h).
//
// Activations: E4M3 rows of round_up(K, 128) bytes (zeros past K) with one fp32 scale per
// 128-group.
// - decode_mma: rows by token, scales [token][group]; within chunk q element 32b + 8c + i
//   (block b, lane c, i < 8) sits at byte 32c + 8b + i, so lane c's 8 values of each block are
//   the mma's B registers (4 + 4 bytes) matching register A and B of its weight word.
// - prefill_wgmma: rows by slot, scales [group][slot] (a stage's scales are one TMA box); within
//   each 32-wide MX block element 8c + i sits at byte 4c + i (i < 4) or 16 + 4c + (i - 4): the
//   wgmma reads B from shared memory in the instruction's K order, in which lane c's register A
//   covers k = 4c .. 4c + 3 and register B k = 16 + 4c .. + 3.
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
  if (e < 4) return b < 3 ? 4 * e + b : 8 * e + 7;
  return b < 3 ? 16 + 4 * (e - 4) + b : 8 * (e - 4) + 3;
}

// The 8 E4M3 bytes of {0, 0.5, 1, 1.5, 2, 3, 4, 6} * 2^t: lo = magnitudes 0..3, hi = 4..7.
struct W4a8Table {
  std::uint32_t lo;
  std::uint32_t hi;
};

// t = -6 (the decode_mma GEMMs): 2^-7 (0.5 * 2^-6) is E4M3's subnormal 4 * 2^-9, the rest normal.
inline constexpr W4a8Table kW4a8TableTimes2m6{0x0C080400U, 0x1C181410U};

// t = 6 - e for e in [0, 11] (the wgmma GEMMs' folded block scales): every nonzero entry a normal
// E4M3 (0.5 * 2^(6 - e) >= 2^-6), so subtracting e from the exponent fields of the e = 0 table
// ({32, 64, 96, 128, 192, 256, 384}: exponent fields 12..15) is exact and never borrows.
MXQ_HD_INLINE constexpr W4a8Table w4a8_folded_table(std::uint32_t e) {
  return {0x6C686000U - e * 0x08080800U, 0x7C787470U - e * 0x08080808U};
}
inline constexpr std::uint32_t kW4a8MaxFoldShift = 11;

// PRMT in its default mode with selector nibbles below 8: byte n of the result is byte s_n of
// the 8 bytes {lo, hi}.
MXQ_HD_INLINE std::uint32_t w4a8_select_bytes(W4a8Table table, std::uint32_t selector) {
#if defined(__CUDA_ARCH__)
  // prmt itself, not __byte_perm: the intrinsic masks its selector to 3 bits a nibble first, one
  // more instruction where the caller's selectors have their bit 3s clear already.
  std::uint32_t out;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(out) : "r"(table.lo), "r"(table.hi), "r"(selector));
  return out;
#else
  std::uint32_t out = 0;
  for (int n = 0; n < 4; ++n) {
    const std::uint32_t s = (selector >> (4 * n)) & 7U;
    const std::uint32_t byte = (s < 4 ? table.lo >> (8 * s) : table.hi >> (8 * (s - 4))) & 0xFFU;
    out |= byte << (8 * n);
  }
  return out;
#endif
}

// Registers A (codes e0..e3) and B (e4..e7) of a device word: 4 E4M3 bytes each, e2m1 * 2^t
// for the table's t (-0.0 stays -0.0: its table entry is 0 and the sign is ORed in).
MXQ_HD_INLINE std::uint32_t w4a8_register_a(std::uint32_t w, W4a8Table table = kW4a8TableTimes2m6) {
  return w4a8_select_bytes(table, w & 0x7777U) | (w & 0x80808080U);
}
MXQ_HD_INLINE std::uint32_t w4a8_register_b(std::uint32_t w, W4a8Table table = kW4a8TableTimes2m6) {
  return w4a8_select_bytes(table, (w >> 16) & 0x7777U) | ((w << 4) & 0x80808080U);
}

// Both registers of a word, one mask serving both selectors (PRMT reads the low 16 bits of its
// selector, so register A's keeps register B's magnitudes above them): 7 instructions a word in
// the W4A8 wgmma GEMMs' SASS, where register_a and register_b mask each selector on its own (8).
MXQ_HD_INLINE void w4a8_registers(std::uint32_t w, W4a8Table table, std::uint32_t& a,
                                  std::uint32_t& b) {
  const std::uint32_t magnitudes = w & 0x77777777U;
  a = w4a8_select_bytes(table, magnitudes) | (w & 0x80808080U);
  b = w4a8_select_bytes(table, magnitudes >> 16) | ((w << 4) & 0x80808080U);
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

// prefill_wgmma: byte offset of element k within its row, and the slots per row of the scales
// (a multiple of 4: TMA wants 16-byte strides).
MXQ_HD_INLINE constexpr int w4a8_wgmma_act_offset(int k) {
  const int r = k % 32;
  const int c = r / 8;
  const int i = r % 8;
  return k - r + (i < 4 ? 4 * c + i : 16 + 4 * c + (i - 4));
}
MXQ_HD_INLINE constexpr std::size_t w4a8_wgmma_scale_pitch(std::size_t slots) {
  return (slots + 3) / 4 * 4;
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

// The folded block scales of one row's 128-wide chunk (the wgmma GEMMs): the largest scale byte
// of its nb MX blocks, each block's shift e = largest - s in byte b (0 for b >= nb, whose
// weights are zero), and whether every shift is at most kW4a8MaxFoldShift (else the chunk takes
// one factor per block). `packed`: the 4 scale bytes, little-endian.
struct W4a8ChunkFold {
  std::uint32_t max_scale;
  std::uint32_t shifts;
  bool folds;
};
MXQ_HD_INLINE W4a8ChunkFold w4a8_fold_chunk(std::uint32_t packed, int nb) {
  const std::uint32_t valid = nb >= 4 ? 0xFFFFFFFFU : (1U << (8 * nb)) - 1U;
  packed &= valid;
  std::uint32_t m = packed & 0xFFU;
  for (int b = 1; b < 4; ++b)
    m = m > ((packed >> (8 * b)) & 0xFFU) ? m : (packed >> (8 * b)) & 0xFFU;
  // Bytewise m - s never borrows (s <= m); a byte > 11 has a bit above 3, or bits 3 and 2.
  const std::uint32_t shifts = (m * 0x01010101U - packed) & valid;
  const std::uint32_t wide = (shifts & 0xF0F0F0F0U) | (shifts & (shifts << 1) & 0x08080808U);
  return {m, shifts, wide == 0U};
}

}  // namespace mxq::moe::gpu::detail
