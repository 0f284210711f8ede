// The wgmma tiles listed as tactics (src/linear/cuda/launch.h) against the kernels the launchers
// run for them, on the host: each listed shape must run the kernel of exactly its own constants.
// (The split-K tiles' first GPU timings ran the unsplit kernels: the launcher matched bm, bn and
// overlap and ignored the split.)
#include <gtest/gtest.h>

#include <set>
#include <string>

#if MXQ_WITH_CUDA
#include "linear/cuda/launch.h"

namespace mxq::linear::gpu {
namespace {

TEST(WgmmaShapes, EveryFastTileRunsTheKernelOfItsOwnShape) {
  std::set<std::string> names;
  for (const WgmmaShape& shape : kWgmmaShapes) {
    const std::optional<WgmmaShape> compiled = compiled_wgmma_shape(shape);
    ASSERT_TRUE(compiled.has_value()) << to_string(shape) << " has no kernel";
    EXPECT_EQ(*compiled, shape) << to_string(shape) << " runs the kernel of "
                                << to_string(*compiled);
    EXPECT_TRUE(names.insert(to_string(shape)).second) << "two tiles named " << to_string(shape);
  }
}

TEST(WgmmaShapes, EveryFallbackTileRunsTheKernelOfItsOwnShape) {
  std::set<std::string> names;
  for (const WgmmaShape& shape : kWgmmaAnyBlockShapes) {
    const std::optional<WgmmaShape> compiled = compiled_wgmma_any_block_shape(shape);
    ASSERT_TRUE(compiled.has_value()) << to_string(shape) << " has no kernel";
    EXPECT_EQ(*compiled, shape) << to_string(shape) << " runs the kernel of "
                                << to_string(*compiled);
    EXPECT_TRUE(names.insert(to_string(shape)).second) << "two tiles named " << to_string(shape);
  }
}

TEST(WgmmaShapes, AShapeDifferingInOneFieldHasNoKernel) {
  EXPECT_FALSE(compiled_wgmma_shape({64, 64, 8, false, 1, 3}).has_value());  // split
  EXPECT_FALSE(compiled_wgmma_shape({64, 64, 7, false}).has_value());        // stages
  EXPECT_FALSE(compiled_wgmma_shape({128, 128, 5, false, 2}).has_value());   // cluster
  EXPECT_FALSE(compiled_wgmma_any_block_shape({64, 64, 8, false, 1, 2}).has_value());
  EXPECT_EQ(to_string(WgmmaShape{64, 128, 6, true, 1, 4}), "m64n128_overlap_splitk4");
}

}  // namespace
}  // namespace mxq::linear::gpu
#else
TEST(WgmmaShapes, NeedsTheCudaKernels) { GTEST_SKIP() << "built without CUDA kernels"; }
#endif
