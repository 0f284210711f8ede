// moe::normalized_error: the GPU-vs-reference metric (||out - ref|| / ||ref||, NaN positions).
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "mxq/moe/compare.h"

namespace mxq::moe {
namespace {

Tensor vector_of(std::initializer_list<float> values) {
  Tensor t = Tensor::empty(DType::kF32, {static_cast<std::int64_t>(values.size())});
  std::int64_t i = 0;
  for (const float v : values) t.data_as<float>()[i++] = v;
  return t;
}

TEST(NormalizedError, IsTheRelativeL2NormOfTheDifference) {
  const Tensor ref = vector_of({3.0F, 4.0F, 0.0F});
  const Tensor out = vector_of({3.0F, 4.0F, 0.5F});
  std::int64_t nan_mismatches = -1;
  EXPECT_DOUBLE_EQ(normalized_error(out, ref, &nan_mismatches), 0.5 / 5.0);
  EXPECT_EQ(nan_mismatches, 0);
  EXPECT_EQ(normalized_error(ref, ref, &nan_mismatches), 0.0);
}

TEST(NormalizedError, SkipsSharedNaNsAndCountsMismatchedOnes) {
  const Tensor ref = vector_of({std::nanf(""), 1.0F, 2.0F, 2.0F});
  const Tensor out = vector_of({std::nanf(""), std::nanf(""), 2.0F, 2.0F});
  std::int64_t nan_mismatches = 0;
  EXPECT_EQ(normalized_error(out, ref, &nan_mismatches), 0.0);
  EXPECT_EQ(nan_mismatches, 1);
}

TEST(NormalizedError, RejectsMismatchedShapes) {
  EXPECT_THROW((void)normalized_error(vector_of({1.0F}), vector_of({1.0F, 2.0F}), nullptr), Error);
}

// A host function: a GPU output must be copied back first, not read through a device pointer.
TEST(NormalizedError, RejectsDeviceViews) {
  const Tensor host = vector_of({1.0F, 2.0F});
  const TensorView on_device(host.data(), DType::kF32, {2}, Device::cuda(0));
  try {
    (void)normalized_error(on_device, host, nullptr);
    ADD_FAILURE() << "a device view was read on the host";
  } catch (const Error& error) {
    EXPECT_EQ(std::string(error.what()), "out: expected cpu, found cuda:0");
  }
}

}  // namespace
}  // namespace mxq::moe
