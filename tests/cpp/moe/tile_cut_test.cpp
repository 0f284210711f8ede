// How the routing cuts an expert's slots into GEMM work tiles (src/moe/cuda/tile_cut.h), on the
// host: the tiles cover the slots once and in order, no tile is wider than its GEMM takes, a
// remainder joins the last tile only when it fits there, and the grids' tile bound holds.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "moe/cuda/tile_cut.h"

namespace mxq::moe::gpu::detail {
namespace {

const TileCut kCuts[] = {
    tile_cut_for(GemmVariant::kDecodeMma, false, 1.0),
    tile_cut_for(GemmVariant::kDecodeMma, false, 8.0),       // 16-slot tiles
    tile_cut_for(GemmVariant::kPrefillWgmma, true, 128.0),   // W4A8: + up to 32 in the last
    tile_cut_for(GemmVariant::kPrefillWgmma, false, 128.0),  // W4A16: + up to 64 in the last
};

TEST(TileCut, TilesCoverTheSlotsOnceAndFitTheirGemm) {
  for (const TileCut& cut : kCuts) {
    SCOPED_TRACE(cut.tokens * 1000 + cut.extra);
    for (int slots = 0; slots <= 3000; ++slots) {
      const int tiles = tile_count(cut, slots);
      EXPECT_EQ(tiles == 0, slots == 0) << slots;
      EXPECT_LE(tiles, (slots + cut.tokens - 1) / cut.tokens) << slots;
      int covered = 0;
      for (int i = 0; i < tiles; ++i) {
        const int rows = tile_rows(cut, slots, i);
        EXPECT_EQ(covered, tile_first_slot(cut, i)) << slots;  // consecutive, in order
        EXPECT_GE(rows, 1) << slots;
        EXPECT_LE(rows, i + 1 < tiles ? cut.tokens : cut.tokens + cut.extra) << slots;
        covered += rows;
      }
      EXPECT_EQ(covered, slots);
      // A last tile of at most `extra` slots would have joined the one before it.
      if (tiles > 1) {
        EXPECT_GT(tile_rows(cut, slots, tiles - 1), cut.extra) << slots;
      }
    }
  }
}

TEST(TileCut, W4a16PrefillTakesARemainderOfUpTo64IntoTheLastTile) {
  const TileCut w4a16 = tile_cut_for(GemmVariant::kPrefillWgmma, false, 128.0);
  const TileCut w4a8 = tile_cut_for(GemmVariant::kPrefillWgmma, true, 128.0);
  EXPECT_EQ(tile_count(w4a16, 138), 1);
  EXPECT_EQ(tile_rows(w4a16, 138, 0), 138);
  EXPECT_EQ(tile_count(w4a16, 192), 1);
  EXPECT_EQ(tile_count(w4a16, 193), 2);  // 128 + 65
  EXPECT_EQ(tile_rows(w4a16, 193, 1), 65);
  EXPECT_EQ(tile_count(w4a16, 320), 2);  // 128 + 192
  EXPECT_EQ(tile_rows(w4a16, 320, 1), 192);
  EXPECT_EQ(tile_count(w4a8, 160), 1);  // W4A8: up to 32 past 128
  EXPECT_EQ(tile_count(w4a8, 170), 2);  // 128 + 42
  EXPECT_EQ(tile_rows(w4a8, 170, 1), 42);
  EXPECT_EQ(tile_count(tile_cut_for(GemmVariant::kDecodeMma, false, 1.0), 17), 3);
}

TEST(TileCut, W4a16DecodeTilesWidenTo16SlotsFromEightExpectedSlotsPerExpert) {
  EXPECT_EQ(tile_cut_for(GemmVariant::kDecodeMma, false, 7.99).tokens, kTileTokens);
  EXPECT_EQ(tile_cut_for(GemmVariant::kDecodeMma, false, 8.0).tokens, kWideDecodeTileTokens);
  EXPECT_EQ(tile_cut_for(GemmVariant::kDecodeMma, false, 64.0).tokens, 16);
  EXPECT_EQ(tile_cut_for(GemmVariant::kDecodeMma, true, 64.0).tokens, kTileTokens);  // W4A8: 8
  const TileCut wide = tile_cut_for(GemmVariant::kDecodeMma, false, 8.0);
  EXPECT_EQ(wide.extra, 0);
  EXPECT_EQ(tile_count(wide, 16), 1);
  EXPECT_EQ(tile_count(wide, 17), 2);  // 16 + 1
  EXPECT_EQ(tile_rows(wide, 17, 1), 1);
}

// The GEMM grids launch max_tiles_for rows of blocks: every routing's tiles fit.
TEST(TileCut, MaxTilesBoundsEveryRouting) {
  std::mt19937 rng(5);
  for (const TileCut& cut : kCuts) {
    for (int trial = 0; trial < 2000; ++trial) {
      const int experts = 1 + static_cast<int>(rng() % 64);
      const int pairs = static_cast<int>(rng() % 4000);
      std::vector<int> counts(static_cast<std::size_t>(experts), 0);
      // Skewed: most pairs on a few experts some trials, spread others.
      const int hot = 1 + static_cast<int>(rng() % experts);
      for (int p = 0; p < pairs; ++p) ++counts[rng() % static_cast<unsigned>(hot)];
      int tiles = 0;
      for (const int n : counts) tiles += tile_count(cut, n);
      EXPECT_LE(tiles, max_tiles_for(pairs, experts, cut.tokens));
    }
  }
}

}  // namespace
}  // namespace mxq::moe::gpu::detail
