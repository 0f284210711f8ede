// A permutation of the 32 bits of a word as four 256-entry tables, one per input byte: each
// output bit comes from exactly one input bit, so a word's image is the OR of its four bytes'
// images. The host converts weights between the checkpoint's and the kernels' word layouts with
// it (four lookups a word instead of a shift and a mask per bit: preparing a layer and the CPU
// forward's reads of prepared weights convert millions of words). Device code keeps the bit
// loops; it never converts weights.
#pragma once

#include <cstdint>

namespace mxq::moe::gpu::detail {

struct WordPermutation {
  std::uint32_t byte[4][256];

  [[nodiscard]] constexpr std::uint32_t operator()(std::uint32_t w) const {
    return byte[0][w & 0xFFU] | byte[1][(w >> 8) & 0xFFU] | byte[2][(w >> 16) & 0xFFU] |
           byte[3][w >> 24];
  }
};

// The tables of `permute`, a bit permutation (called 1024 times, at compile time).
template <typename Permute>
constexpr WordPermutation tabulate_word_permutation(Permute permute) {
  WordPermutation tables{};
  for (int b = 0; b < 4; ++b) {
    for (std::uint32_t v = 0; v < 256; ++v) tables.byte[b][v] = permute(v << (8 * b));
  }
  return tables;
}

}  // namespace mxq::moe::gpu::detail
