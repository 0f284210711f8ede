// The per-M summary of `mxq bench linear` (bench/linear_summary.h) on hand-made bench results.
#include "linear_summary.h"

#include <gtest/gtest.h>

#include <cmath>

namespace mxq::bench {
namespace {

nlohmann::json timing(const std::string& name, const std::string& blocks, double speedup) {
  return {{"name", name}, {"blocks", blocks}, {"us", 10.0}, {"speedup_vs_cublaslt", speedup}};
}

nlohmann::json point(int m, int n, int k, nlohmann::json timings) {
  return {{"m", m}, {"n", n}, {"k", k}, {"timings", std::move(timings)}};
}

TEST(LinearSummary, GeomeanAndMinimumOfTheDispatchChoicePerM) {
  nlohmann::json points = nlohmann::json::array();
  // Other tactics, the 64x64 fallback and cuBLASLt's own row must not count.
  points.push_back(point(128, 2112, 7168,
                         {{{"name", "cublaslt"}, {"blocks", "128x128"}, {"us", 20.0}},
                          timing("wgmma_128 *", "128x128", 0.5),
                          timing("mma_sync", "128x128", 9.0),
                          timing("fallback *", "64x64", 9.0)}));
  points.push_back(point(64, 7168, 16384, {timing("wgmma_64 *", "128x128", 2.0)}));
  points.push_back(point(128, 4096, 7168, {timing("wgmma_128 *", "128x128", 2.0)}));
  points.push_back(point(64, 2112, 7168, {timing("wgmma_64 *", "128x128", 1.0)}));
  const nlohmann::json summary = summarize_linear_points(points);
  ASSERT_EQ(summary.size(), 2U);
  EXPECT_EQ(summary[0]["m"], 64);
  EXPECT_EQ(summary[0]["shapes"], 2);
  EXPECT_NEAR(summary[0]["geomean_vs_cublaslt"].get<double>(), std::sqrt(2.0), 1e-12);
  EXPECT_DOUBLE_EQ(summary[0]["min_vs_cublaslt"].get<double>(), 1.0);
  EXPECT_EQ(summary[0]["min_at"], "2112x7168");
  EXPECT_EQ(summary[1]["m"], 128);
  EXPECT_EQ(summary[1]["shapes"], 2);
  EXPECT_NEAR(summary[1]["geomean_vs_cublaslt"].get<double>(), 1.0, 1e-12);
  EXPECT_DOUBLE_EQ(summary[1]["min_vs_cublaslt"].get<double>(), 0.5);
  EXPECT_EQ(summary[1]["min_at"], "2112x7168");
}

TEST(LinearSummary, TheReadFloorsSpeedUpOverCublasWhenEveryPointHasOne) {
  // A point's choice at `us` with `speedup` over cuBLASLt (cuBLASLt took us * speedup), and the
  // point's read floor.
  const auto chosen = [](int m, int n, double us, double speedup, double floor_us) {
    nlohmann::json p = point(
        m, n, 7168,
        {{{"name", "a *"}, {"blocks", "128x128"}, {"us", us}, {"speedup_vs_cublaslt", speedup}}});
    if (floor_us > 0.0) p["read_floor"] = {{"total_us", floor_us}, {"in_graph_us", 1.0}};
    return p;
  };
  nlohmann::json points = nlohmann::json::array();
  points.push_back(chosen(64, 2112, 10.0, 2.0, 10.0));  // cuBLASLt 20 us: 2x the floor
  points.push_back(chosen(64, 4096, 8.0, 2.0, 2.0));    // cuBLASLt 16 us: 8x the floor
  // M = 128: one of its points has no floor, so the entry has none.
  points.push_back(chosen(128, 2112, 4.0, 2.0, 4.0));
  points.push_back(chosen(128, 4096, 4.0, 2.0, 0.0));
  const nlohmann::json summary = summarize_linear_points(points);
  ASSERT_EQ(summary.size(), 2U);
  EXPECT_NEAR(summary[0]["read_floor_geomean_vs_cublaslt"].get<double>(), 4.0, 1e-12);
  EXPECT_NEAR(summary[0]["geomean_vs_cublaslt"].get<double>(), 2.0, 1e-12);
  EXPECT_FALSE(summary[1].contains("read_floor_geomean_vs_cublaslt"));
}

TEST(LinearSummary, PointsWithoutACublasTimeAreLeftOut) {
  nlohmann::json points = nlohmann::json::array();
  points.push_back(
      point(64, 2112, 7168, {{{"name", "wgmma_64 *"}, {"blocks", "128x128"}, {"us", 10.0}}}));
  EXPECT_TRUE(summarize_linear_points(points).empty());
  EXPECT_TRUE(summarize_linear_points(nlohmann::json::array()).empty());
}

}  // namespace
}  // namespace mxq::bench
