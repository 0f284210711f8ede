// The wgmma GEMM's persistent tile order (src/linear/cuda/tile_schedule.h), played on the host as
// the kernel plays it: every block (cluster) takes units id, id + clusters, ... and each rank of
// a cluster computes its tile of the unit. Every output tile must be computed exactly once, only
// a cluster at a ragged N edge may compute tiles past N, and the blocks running at once must
// share rows and columns (the grouping's point).
#include "linear/cuda/tile_schedule.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <utility>
#include <vector>

namespace mxq::linear::gpu {
namespace {

struct Case {
  int m;
  int n;
  int block_m;
  int block_n;
  int cluster;
  int clusters;  // persistent workers (blocks, or clusters of blocks)
};

std::string describe(const Case& c) {
  return "M=" + std::to_string(c.m) + " N=" + std::to_string(c.n) + " tile " +
         std::to_string(c.block_m) + "x" + std::to_string(c.block_n) + " cluster " +
         std::to_string(c.cluster) + " workers " + std::to_string(c.clusters);
}

class TileScheduleTest : public ::testing::TestWithParam<Case> {};

TEST_P(TileScheduleTest, EveryTileOnceAndOnlyRaggedClustersPastN) {
  const Case c = GetParam();
  const TileSchedule schedule(c.m, c.n, c.block_m, c.block_n, c.cluster);
  ASSERT_EQ(schedule.tiles_m, (c.m + c.block_m - 1) / c.block_m) << describe(c);
  ASSERT_EQ(schedule.tiles_n, (c.n + c.block_n - 1) / c.block_n) << describe(c);
  std::vector<int> computed(static_cast<std::size_t>(schedule.tiles_m * schedule.tiles_n), 0);
  int past_n = 0;
  for (int worker = 0; worker < c.clusters; ++worker) {
    for (int unit = worker; unit < schedule.units(); unit += c.clusters) {
      for (int rank = 0; rank < c.cluster; ++rank) {
        int m_tile = -1;
        int n_tile = -1;
        schedule.tile(unit, rank, m_tile, n_tile);
        ASSERT_GE(m_tile, 0) << describe(c);
        ASSERT_LT(m_tile, schedule.tiles_m) << describe(c);
        ASSERT_GE(n_tile, 0) << describe(c);
        if (n_tile >= schedule.tiles_n) {
          // Only the last rank of a group that the ragged edge cuts.
          EXPECT_EQ(n_tile, schedule.tiles_n) << describe(c);
          EXPECT_NE(schedule.tiles_n % c.cluster, 0) << describe(c);
          ++past_n;
          continue;
        }
        ++computed[static_cast<std::size_t>(m_tile * schedule.tiles_n + n_tile)];
      }
    }
  }
  for (std::size_t t = 0; t < computed.size(); ++t) {
    EXPECT_EQ(computed[t], 1) << describe(c) << " tile " << t;
  }
  const int missing = schedule.groups_n() * c.cluster - schedule.tiles_n;
  EXPECT_EQ(past_n, schedule.tiles_m * missing) << describe(c);
}

// The first wave (units 0 .. workers - 1) stays within kGroupM m-tiles per group, so the
// blocks running at once read few distinct A rows; and a cluster's tiles share their m-tile.
TEST_P(TileScheduleTest, AWaveTouchesFewRowBlocksAndAClusterOneRowBlock) {
  const Case c = GetParam();
  const TileSchedule schedule(c.m, c.n, c.block_m, c.block_n, c.cluster);
  const int first_wave = c.clusters < schedule.units() ? c.clusters : schedule.units();
  std::set<int> rows;
  for (int unit = 0; unit < first_wave; ++unit) {
    int m0 = -1;
    int n0 = -1;
    schedule.tile(unit, 0, m0, n0);
    rows.insert(m0);
    for (int rank = 1; rank < c.cluster; ++rank) {
      int m = -1;
      int n = -1;
      schedule.tile(unit, rank, m, n);
      EXPECT_EQ(m, m0) << describe(c);
      EXPECT_EQ(n, n0 + rank) << describe(c);
    }
  }
  const int groups_in_wave = (first_wave + TileSchedule::kGroupM * schedule.groups_n() - 1) /
                             (TileSchedule::kGroupM * schedule.groups_n());
  EXPECT_LE(static_cast<int>(rows.size()), groups_in_wave * TileSchedule::kGroupM) << describe(c);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, TileScheduleTest,
    ::testing::Values(
        // One tile; one row of tiles; a ragged M group (5 m-tiles after 8).
        Case{1, 128, 64, 128, 1, 132}, Case{64, 2112, 64, 64, 1, 132},
        Case{1040, 2048, 128, 128, 1, 132},
        // 256-row tiles alone and in clusters of two: N = 2112 (17 tiles, the last pair half
        // past N), 7168 (56, even), more units than workers, fewer, one worker.
        Case{4096, 7168, 256, 128, 1, 132}, Case{4096, 7168, 256, 128, 2, 66},
        Case{4096, 2112, 256, 128, 2, 66}, Case{2100, 2112, 256, 128, 2, 60},
        Case{300, 384, 256, 128, 2, 66}, Case{64, 2112, 256, 128, 2, 1},
        Case{8192, 24576, 256, 128, 2, 64}));

}  // namespace
}  // namespace mxq::linear::gpu

namespace mxq::linear::gpu {
namespace {

TEST(TailSplit, TheHeadFillsWholeWavesAndTheTailTakesTheRest) {
  // N = 2112 in 256x128 tiles on 132 SMs (17 tiles a row of tiles): M = 4096 is 272 tiles, two
  // whole waves and 8; the head takes the 15 m-tiles that fit in two waves (255 tiles).
  EXPECT_EQ(tail_split_rows(4096, 2112, 256, 128, 132), 3840);
  EXPECT_EQ(tail_split_rows(2048, 2112, 256, 128, 132), 1792);  // 136 tiles: 7 m-tiles of 8
  // Less than one whole wave, or waves already whole: no split.
  EXPECT_EQ(tail_split_rows(1024, 2112, 256, 128, 132), 0);   // 68 tiles
  EXPECT_EQ(tail_split_rows(4096, 4224, 256, 128, 132), 0);   // 528 tiles: 4 whole waves
  EXPECT_EQ(tail_split_rows(4096, 33792, 256, 128, 132), 0);  // 264 tiles a row: 4224 = 32 waves
  // A row of tiles wider than the SMs: the head is the whole m-tiles inside the whole waves.
  EXPECT_EQ(tail_split_rows(4096, 32768, 256, 128, 132), 3840);  // 4096 tiles, 31 waves: 15 rows
  // For every split, the head's tiles fit in its whole waves and the tail is a non-empty part
  // of M that the head's m-tiles do not cover.
  for (long long m = 1; m <= 9000; m += 37) {
    for (const long long n : {512LL, 2112LL, 4096LL, 7168LL, 24576LL}) {
      const long long rows = tail_split_rows(m, n, 256, 128, 132);
      if (rows == 0) continue;
      EXPECT_EQ(rows % 256, 0) << m << " " << n;
      EXPECT_LT(rows, m) << m << " " << n;
      const long long tiles = (m + 255) / 256 * ((n + 127) / 128);
      EXPECT_LE(rows / 256 * ((n + 127) / 128), tiles / 132 * 132) << m << " " << n;
    }
  }
}

// The weight block row of each 8-column fragment, as the kernel's promotion picks it (the first
// block row before the boundary fragment, the next from it on), against the row of the fragment's
// first column; and every boundary a straddling tile meets is one its K loop is compiled for (a
// boundary outside that set would run no K loop at all).
TEST(WeightBoundary, EveryFragmentTakesTheScaleOfItsBlockRow) {
  struct Tiling {
    int tile_n;
    int block_n;
  };
  for (const Tiling t : {Tiling{112, 128}, Tiling{128, 128}, Tiling{64, 128}, Tiling{16, 128},
                         Tiling{128, 64}, Tiling{64, 64}, Tiling{32, 256}}) {
    const bool straddles = t.tile_n < t.block_n && t.block_n % t.tile_n != 0;
    const int fragments = t.tile_n / 8;
    std::set<int> seen;
    for (int n_tile = 0; n_tile < 4 * 128; ++n_tile) {
      const int boundary = weight_boundary_fragment(n_tile, t.tile_n, t.block_n);
      const int first_row = n_tile * t.tile_n / t.block_n;
      for (int i = 0; i < fragments; ++i) {
        const int row = (n_tile * t.tile_n + 8 * i) / t.block_n;
        EXPECT_EQ(row, first_row + (i >= boundary ? 1 : 0))
            << "tile " << t.tile_n << " block " << t.block_n << " n_tile " << n_tile << " i " << i;
      }
      seen.insert(boundary);
      if (straddles) {
        const int step = straddle_boundary_step(t.tile_n);
        EXPECT_TRUE(boundary > 0 && boundary % step == 0 && boundary <= fragments)
            << "tile " << t.tile_n << " n_tile " << n_tile << ": boundary " << boundary;
      }
    }
    if (t.tile_n == 112) {  // every compiled boundary occurs: 2, 4, ..., 14
      EXPECT_EQ(seen, (std::set<int>{2, 4, 6, 8, 10, 12, 14}));
    }
    if (!straddles) {
      // Non-straddling tiles: one block row (boundary = fragments) or two equal halves.
      EXPECT_EQ(seen, (std::set<int>{t.block_n < t.tile_n ? fragments / 2 : fragments}));
    }
  }
}

}  // namespace
}  // namespace mxq::linear::gpu
