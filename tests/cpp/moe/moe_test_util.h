// Helpers shared by the MoE tests: temporary checkpoints, inputs, byte-level comparisons.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "mxq/core/error.h"
#include "mxq/moe/layer.h"
#include "mxq/moe/synthetic.h"

namespace mxq::moe::testing {

// A fresh directory under the test temp dir, removed when the object dies.
class TempDir {
 public:
  explicit TempDir(const std::string& name) {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = std::filesystem::path(::testing::TempDir()) /
            ("mxq_moe_" + std::to_string(::getpid()) + "_" + info->test_suite_name() + "_" +
             info->name() + "_" + name);
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code error;
    std::filesystem::remove_all(path_, error);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  [[nodiscard]] std::string path() const { return path_.string(); }
  [[nodiscard]] std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

inline SyntheticSpec small_spec(std::uint64_t seed = 7) {
  SyntheticSpec spec;
  spec.experts = 6;
  spec.hidden = 64;
  spec.intermediate = 96;  // 3 blocks: uneven for TP = 2 and 4
  spec.top_k = 2;
  spec.layers = 2;
  spec.seed = seed;
  return spec;
}

inline std::vector<std::uint8_t> bytes_of(const TensorView& view) {
  const auto* p = static_cast<const std::uint8_t*>(view.data());
  return {p, p + view.nbytes()};
}

inline bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.nbytes() == b.nbytes() &&
         std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

// Every parameter of every rank, and the router, bit for bit.
inline void expect_same_weights(const MoeLayer& a, const MoeLayer& b) {
  ASSERT_EQ(a.num_ranks(), b.num_ranks());
  for (int r = 0; r < a.num_ranks(); ++r) {
    EXPECT_EQ(a.rank(r).shape().intermediate_size_per_partition_after_pad,
              b.rank(r).shape().intermediate_size_per_partition_after_pad);
    for (MoeParam param : kAllMoeParams) {
      ASSERT_EQ(a.rank(r).has(param), b.rank(r).has(param));
      if (!a.rank(r).has(param)) continue;
      EXPECT_EQ(a.rank(r).view(param).shape(), b.rank(r).view(param).shape());
      EXPECT_EQ(bytes_of(a.rank(r).view(param)), bytes_of(b.rank(r).view(param)))
          << "rank " << r << " " << to_string(param);
    }
  }
  EXPECT_TRUE(same_bits(a.router_weight(), b.router_weight()));
  if (a.router_bias().defined() || b.router_bias().defined()) {
    EXPECT_TRUE(same_bits(a.router_bias(), b.router_bias()));
  }
}

inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

}  // namespace mxq::moe::testing
