// The wgmma tiles listed as tactics (src/linear/cuda/launch.h) against the kernels the launchers
// have, on the host: the launchers match a shape to the kernel whose template constants equal it
// as a whole value, so each listed shape needs a kernel of exactly its own constants. (The split-K
// tiles' first GPU timings ran the unsplit kernels: the launcher then matched bm, bn and overlap
// only and ignored the split.)
#include <gtest/gtest.h>

#include <set>
#include <string>

#if MXQ_WITH_CUDA
#include "linear/cuda/launch.h"

namespace mxq::linear::gpu {
namespace {

TEST(WgmmaShapes, EveryListedTileHasAKernelOfItsOwnShape) {
  std::set<std::string> names;
  for (const WgmmaShape& shape : kWgmmaShapes) {
    EXPECT_TRUE(wgmma_tile_compiled(shape)) << to_string(shape) << " has no kernel";
    EXPECT_TRUE(names.insert(to_string(shape)).second) << "two tiles named " << to_string(shape);
  }
  names.clear();
  for (const WgmmaShape& shape : kWgmmaAnyBlockShapes) {
    EXPECT_TRUE(wgmma_any_block_tile_compiled(shape)) << to_string(shape) << " has no kernel";
    EXPECT_TRUE(names.insert(to_string(shape)).second) << "two tiles named " << to_string(shape);
  }
}

TEST(WgmmaShapes, AShapeDifferingInOneFieldHasNoKernel) {
  EXPECT_FALSE(wgmma_tile_compiled({64, 64, 8, false, 1, 3}));  // split
  EXPECT_FALSE(wgmma_tile_compiled({64, 64, 7, false}));        // stages
  EXPECT_FALSE(wgmma_tile_compiled({128, 128, 5, false, 2}));   // cluster
  EXPECT_FALSE(wgmma_any_block_tile_compiled({64, 64, 8, false, 1, 2}));
  EXPECT_EQ(to_string(WgmmaShape{64, 128, 6, true, 1, 4}), "m64n128_overlap_splitk4");
}

}  // namespace
}  // namespace mxq::linear::gpu
#else
TEST(WgmmaShapes, NeedsTheCudaKernels) { GTEST_SKIP() << "built without CUDA kernels"; }
#endif
