// The persistent wgmma GEMM's tile order (host and device, so that host tests check it): work
// units over the output tiles, grouped kGroupM m-tiles at a time so that the blocks running at
// once share their A rows and their W columns in L2. A unit is one tile, or with clusters the
// `cluster` neighbouring tiles along N that the cluster's blocks compute together (rank r takes
// the r-th); at a ragged N edge the last unit's later tiles lie past N (their loads are zeros,
// their stores dropped).
#pragma once

#if defined(__CUDACC__)
#define MXQ_HOST_DEVICE __host__ __device__
#else
#define MXQ_HOST_DEVICE
#endif

namespace mxq::linear::gpu {

struct TileSchedule {
  static constexpr int kGroupM = 8;  // m-tiles per rasterisation group

  int tiles_m = 0;
  int tiles_n = 0;
  int cluster = 1;  // blocks per cluster along N

  MXQ_HOST_DEVICE constexpr TileSchedule(int m, int n, int block_m, int block_n,
                                         int blocks_per_cluster)
      : tiles_m((m + block_m - 1) / block_m),
        tiles_n((n + block_n - 1) / block_n),
        cluster(blocks_per_cluster) {}

  // Groups of `cluster` tiles along N.
  [[nodiscard]] MXQ_HOST_DEVICE constexpr int groups_n() const {
    return (tiles_n + cluster - 1) / cluster;
  }
  [[nodiscard]] MXQ_HOST_DEVICE constexpr int units() const { return tiles_m * groups_n(); }

  // The tile that cluster rank `rank` computes in work unit `unit`.
  MXQ_HOST_DEVICE constexpr void tile(int unit, int rank, int& m_tile, int& n_tile) const {
    const int per_group = kGroupM * groups_n();
    const int first_m = unit / per_group * kGroupM;
    const int group_m = tiles_m - first_m < kGroupM ? tiles_m - first_m : kGroupM;
    const int in_group = unit % per_group;
    m_tile = first_m + in_group % group_m;
    n_tile = in_group / group_m * cluster + rank;
  }
};

// The tail split of a tile whose last wave would leave SMs idle: the rows of M that `block_m` x
// `block_n` tiles compute in whole waves on `sms` SMs (whole m-tiles of the first
// floor(tiles / sms) waves' tiles), the rest of M going to a second launch of a smaller tile.
// 0 when the tiles fill less than one wave or their waves are already whole (no split).
// N = 2112 at M = 4096 in 256x128 tiles: 272 tiles are three waves on 132 SMs, the last with 8;
// the split gives 3840 rows (255 tiles, two waves) and leaves 256.
constexpr long long tail_split_rows(long long m, long long n, long long block_m, long long block_n,
                                    long long sms) {
  const long long tiles_n = (n + block_n - 1) / block_n;
  const long long tiles_m = (m + block_m - 1) / block_m;
  const long long whole_waves = tiles_m * tiles_n / sms;
  if (whole_waves == 0 || tiles_m * tiles_n % sms == 0) return 0;
  const long long head_tiles_m = whole_waves * sms / tiles_n;
  return head_tiles_m > 0 && head_tiles_m < tiles_m ? head_tiles_m * block_m : 0;
}

// Weight scales of a tile `tile_n` columns wide over weight blocks `block_n` columns wide (the
// kernel's 8-column accumulator fragments): the first fragment of tile column `n_tile` whose
// columns lie in the next block row, or tile_n / 8 when none does. A tile spans at most two block
// rows (tile_n <= block_n, or block_n == tile_n / 2), and tile_n, block_n are multiples of 8.
MXQ_HOST_DEVICE constexpr int weight_boundary_fragment(int n_tile, int tile_n, int block_n) {
  const int to_next_row = (block_n - n_tile * tile_n % block_n) / 8;
  return to_next_row < tile_n / 8 ? to_next_row : tile_n / 8;
}

// The boundary fragments a tile `tile_n` wide can have over 128-wide weight blocks when its width
// does not divide them: the multiples of this step up to tile_n / 8 (gcd(tile_n, 128) / 8, tile_n
// < 128), which the kernel compiles its K loop for.
MXQ_HOST_DEVICE constexpr int straddle_boundary_step(int tile_n) { return (tile_n & -tile_n) / 8; }

}  // namespace mxq::linear::gpu

#undef MXQ_HOST_DEVICE
