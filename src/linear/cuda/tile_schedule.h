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

}  // namespace mxq::linear::gpu

#undef MXQ_HOST_DEVICE
