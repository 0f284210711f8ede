// How the MoE forward's routing cuts each local expert's expert-sorted slots into GEMM work tiles
// (one tile per GEMM block row), for every GEMM variant: one owner for the cut, used by the host
// (grid and workspace sizes, tests) and the routing kernel.
#pragma once

#include <algorithm>

#include "mxq/core/macros.h"
#include "mxq/moe/gemm_variant.h"

namespace mxq::moe::gpu::detail {

constexpr int kTileTokens = 8;  // slots per work tile of the decode GEMMs (mma n)
// W4A16's decode GEMMs take tiles of 16 slots (two n8 mma on each decoded weight fragment) once an
// expert expects this many slots: with 8-slot tiles, an expert of 9 to 16 slots streamed its
// weights twice (T = 256 of gpt-oss-120b: 8 +- 3 slots an expert, ~1.4 passes). The 16-slot
// kernels stream a pass more slowly (twice the mma and activations a weight byte), so below ~7
// slots an expert, where few experts pass 8, the 8-slot tiles stay faster (H100: T = 128 603
// against 682 µs, T = 192 677 against 718, T = 256 800 against 745; the 16-slot kernels at 4
// blocks an SM since then are 2-4% faster, T = 128 ~690, T = 256 ~743; docs/perf-log/
// moe-decode.md).
constexpr int kWideDecodeTileTokens = 16;
constexpr double kWideDecodeMinSlotsPerExpert = 8.0;
constexpr int kWgmmaTileTokens = 128;  // slots per work tile of the wgmma (prefill) GEMMs
// W4A16's wgmma GEMMs take an expert's last tile up to this many slots past kWgmmaTileTokens (a
// second, narrower wgmma beside the 128-wide one, on the same decoded weights): at T = 4096 of
// gpt-oss-120b an expert has 128 +- 11 slots, and the ~10 past 128 cost a second pass over the
// expert's weights (a tile of its own), as much decode as the 128-slot tile's.
constexpr int kWgmmaTileExtra = 64;
constexpr int kW4a8TileExtra = 32;  // W4A8's (two fp32 sets a slot: 32 fit its 240 registers)

// How the routing kernel cuts each expert's slots into work tiles (one tile per GEMM block row):
// tiles of `tokens` slots, except that the last one also takes a remainder of up to `extra` slots
// (tile_count, tile_rows).
struct TileCut {
  int tokens;
  int extra = 0;
};

// The work tiles of a GEMM variant when an expert expects `slots_per_expert` slots (T * top_k / E).
inline TileCut tile_cut_for(GemmVariant variant, bool w4a8, double slots_per_expert) {
  switch (variant) {
    case GemmVariant::kPrefillWgmma:
      return {kWgmmaTileTokens, w4a8 ? kW4a8TileExtra : kWgmmaTileExtra};
    default:
      return {!w4a8 && slots_per_expert >= kWideDecodeMinSlotsPerExpert ? kWideDecodeTileTokens
                                                                        : kTileTokens};
  }
}

// Tiles of an expert with `slots` slots: ceil(slots / tokens), less one where the last tile's
// remainder (at most `extra` slots) joins the tile before it.
MXQ_HD_INLINE constexpr int tile_count(const TileCut& cut, int slots) {
  if (slots <= 0) return 0;
  const int tiles = (slots + cut.tokens - 1 - cut.extra) / cut.tokens;
  return tiles > 1 ? tiles : 1;
}

// The first slot of tile i of an expert, from the expert's first.
MXQ_HD_INLINE constexpr int tile_first_slot(const TileCut& cut, int i) { return i * cut.tokens; }

// Slots of tile i of an expert with `slots` slots (tiles cut by tile_count): `tokens`, and the
// rest (1 .. tokens + extra) in the last.
MXQ_HD_INLINE constexpr int tile_rows(const TileCut& cut, int slots, int i) {
  return i + 1 < tile_count(cut, slots) ? cut.tokens : slots - i * cut.tokens;
}

// At most this many tiles of tile_tokens slots (tile_count, whatever the extra): an expert with
// n > 0 slots takes at most ceil(n / t) <= floor(n / t) + 1 tiles, the floors sum to at most
// floor(pairs / t), and at most min(pairs, experts) experts have slots. (Exact bound: the GEMM
// grids launch one row of blocks per tile.)
inline int max_tiles_for(int pairs, int experts, int tile_tokens = kTileTokens) {
  return std::min(pairs, experts) + pairs / tile_tokens;
}

}  // namespace mxq::moe::gpu::detail
