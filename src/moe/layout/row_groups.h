// Where the packed MXFP4 weight rows of the MoE GEMMs lie on the device (both the W4A16 and the
// W4A8 device layouts): rows in groups of 16 (one mma tile), chunk-major inside a group. A row's
// K is cut into 128-wide chunks (4 MX blocks = 64 bytes; the last chunk holds nb < 4 blocks when
// K is not a multiple of 128), and chunk q of row i of a group sits at q * 16 * 64 + i * nb * 16.
//
// Why: a streaming GEMM's warp loads rows r and r + 8 of a 16-row tile per chunk. Row-major, that
// is 16 pieces of 64 bytes a row apart (1.4 KB at K = 2880); grouped, a tile chunk is 1 KB in one
// piece and a warp's load of its 8 rows is 512 contiguous bytes. Measured on the H200: -10 to -12%
// time at T = 8..256 for the W4A16 decode (docs/PERF.md "W4A16 weights in row groups of 16").
// A group keeps exactly its 16 rows' bytes, so the tensors keep their shapes ([rows, K/2] bytes)
// and the conversion is in place; every tile of the GEMMs starts at a row that is a multiple of
// 16 (GEMM1 tiles at expert * 2P + channel and + P, P a multiple of 32; GEMM2 at expert * H + row).
// Host and device code share this header.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "mxq/core/macros.h"

namespace mxq::moe::gpu::detail {

inline constexpr int kGroupRows = 16;
inline constexpr int kLayoutChunk = 128;                            // K values per chunk
inline constexpr int kChunkBytes = kLayoutChunk / 2;                // packed bytes per row chunk
inline constexpr int kGroupChunkBytes = kGroupRows * kChunkBytes;   // a full chunk of a group
inline constexpr int kMaxGroupedK = 2 * (227 * 1024) / kGroupRows;  // a group fits shared memory

// MX blocks in chunk `chunk` of a K-long row (4, or fewer for the last chunk).
MXQ_HD_INLINE constexpr int chunk_blocks(int k, int chunk) {
  const int left = (k - chunk * kLayoutChunk) / 32;
  return left < 4 ? left : 4;
}

// Byte offset, within its row group, of chunk `chunk` of row `row_in_group` (K values a row).
MXQ_HD_INLINE constexpr std::size_t group_offset(int k, int chunk, int row_in_group) {
  return static_cast<std::size_t>(chunk) * kGroupChunkBytes +
         static_cast<std::size_t>(row_in_group) * chunk_blocks(k, chunk) * 16;
}

// Byte offset of the 16-byte MX block holding value `k_at` (a multiple of 32) of row `row`, in a
// matrix of K-long rows.
MXQ_HD_INLINE constexpr std::size_t grouped_block_offset(std::size_t row, int k, int k_at) {
  return (row / kGroupRows) * kGroupRows * (static_cast<std::size_t>(k) / 2) +
         group_offset(k, k_at / kLayoutChunk, static_cast<int>(row % kGroupRows)) +
         static_cast<std::size_t>((k_at % kLayoutChunk) / 32) * 16;
}

// Rearranges `rows` (a multiple of 16) packed rows of k values (a multiple of 32) into row
// groups in place, calling convert(in, nb, out) on each row chunk (nb blocks = 4 * nb words) to
// place its words within the chunk.
template <typename ConvertChunk>
void to_row_groups_host(std::uint8_t* packed, std::size_t rows, int k, ConvertChunk convert) {
  const std::size_t row_bytes = static_cast<std::size_t>(k) / 2;
  const std::size_t group_bytes = kGroupRows * row_bytes;
  std::vector<std::uint8_t> group(group_bytes);
  for (std::size_t g = 0; g * kGroupRows < rows; ++g) {
    std::uint8_t* base = packed + g * group_bytes;
    std::memcpy(group.data(), base, group_bytes);
    for (int i = 0; i < kGroupRows; ++i) {
      for (int q = 0; q * kLayoutChunk < k; ++q) {
        const int nb = chunk_blocks(k, q);
        std::uint32_t in[16];
        std::uint32_t out[16];
        std::memcpy(in, group.data() + i * row_bytes + static_cast<std::size_t>(q) * kChunkBytes,
                    static_cast<std::size_t>(nb) * 16);
        convert(in, nb, out);
        std::memcpy(base + group_offset(k, q, i), out, static_cast<std::size_t>(nb) * 16);
      }
    }
  }
}

// The inverse: `rows` rows of the grouped layout `grouped` into natural rows `natural` (out of
// place), calling convert_back(in, nb, out) on each row chunk to restore its words.
template <typename ConvertChunk>
void from_row_groups_host(const std::uint8_t* grouped, std::uint8_t* natural, std::size_t rows,
                          int k, ConvertChunk convert_back) {
  const std::size_t row_bytes = static_cast<std::size_t>(k) / 2;
  for (std::size_t r = 0; r < rows; ++r) {
    const std::uint8_t* group = grouped + (r / kGroupRows) * kGroupRows * row_bytes;
    const int i = static_cast<int>(r % kGroupRows);
    for (int q = 0; q * kLayoutChunk < k; ++q) {
      const int nb = chunk_blocks(k, q);
      std::uint32_t in[16];
      std::uint32_t out[16];
      std::memcpy(in, group + group_offset(k, q, i), static_cast<std::size_t>(nb) * 16);
      convert_back(in, nb, out);
      std::memcpy(natural + r * row_bytes + static_cast<std::size_t>(q) * kChunkBytes, out,
                  static_cast<std::size_t>(nb) * 16);
    }
  }
}

}  // namespace mxq::moe::gpu::detail
