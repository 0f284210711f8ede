#include "mxq/core/tensor.h"

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace mxq {
namespace {

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Shape, NumelStridesAndPrinting) {
  const Shape shape{2, 3, 4};
  EXPECT_EQ(shape.numel(), 24);
  EXPECT_EQ(shape.dim(-1), 4);
  EXPECT_EQ(contiguous_strides(shape), (Shape{12, 4, 1}));
  EXPECT_EQ(shape.str(), "[2, 3, 4]");
  EXPECT_THROW((void)shape.dim(3), Error);
  EXPECT_THROW((Shape{1, -2}), Error);
}

TEST(Tensor, AllocatesAlignedZeroedHostMemory) {
  const Tensor t = Tensor::zeros(DType::kF32, {3, 5});
  EXPECT_EQ(t.nbytes(), 60U);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(t.data()) % 64, 0U);
  for (int i = 0; i < 15; ++i) EXPECT_EQ(t.data_as<float>()[i], 0.0F);
  const Tensor copy = t.to(Device::cpu());
  EXPECT_NE(copy.data(), t.data());
}

TEST(Tensor, TypedAccessChecksDtype) {
  const Tensor t = Tensor::empty(DType::kBF16, {4});
  EXPECT_EQ(message_of([&] { (void)t.data_as<float>(); }),
            "tensor element type: expected f32, found bf16");
}

TEST(TensorView, ContiguityFollowsStrides) {
  float data[12] = {};
  EXPECT_TRUE(TensorView(data, DType::kF32, {3, 4}).is_contiguous());
  EXPECT_FALSE(TensorView(data, DType::kF32, {3, 2}, {4, 1}, Device::cpu()).is_contiguous());
  EXPECT_TRUE(TensorView(data, DType::kF32, {1, 4}, {99, 1}, Device::cpu()).is_contiguous());
}

TEST(Require, MessagesNameArgumentExpectedAndFound) {
  float data[6] = {};
  const TensorView v(data, DType::kF32, {2, 3});
  EXPECT_EQ(message_of([&] { require_rank(v, "x", 3); }),
            "x: expected a 3-D tensor, found shape [2, 3]");
  EXPECT_EQ(message_of([&] { require_dtype(v, "x", DType::kBF16); }),
            "x: expected bf16, found f32");
  EXPECT_EQ(message_of([&] { require_shape(v, "x", {3, 2}); }), "x: expected [3, 2], found [2, 3]");
  EXPECT_EQ(message_of([&] { require_device(v, "x", Device::cuda(1)); }),
            "x: expected cuda:1, found cpu");
  const TensorView strided(data, DType::kF32, {2, 2}, {3, 1}, Device::cpu());
  EXPECT_NE(message_of([&] { require_contiguous(strided, "x"); }).find("contiguous"),
            std::string::npos);
  EXPECT_EQ(message_of([&] { require_rank(v, "x", 2); }), "");
}

// A view with a shape and no memory (an undefined Tensor given a shape, a framework's null
// pointer) and a shape whose size wraps are errors at the boundary, not crashes later.
TEST(Require, NullDataAndOverflowingSizesAreErrors) {
  const TensorView null_data(nullptr, DType::kF32, {4, 128});
  for (const auto& check :
       std::vector<std::function<void()>>{[&] { require_rank(null_data, "x", 2); },
                                          [&] { require_dtype(null_data, "x", DType::kF32); },
                                          [&] {
                                            require_shape(null_data, "x", {4, 128});
                                          },
                                          [&] { require_contiguous(null_data, "x"); }}) {
    EXPECT_NE(message_of(check).find("x: expected a tensor with memory, found a null data pointer"),
              std::string::npos);
  }
  EXPECT_EQ(message_of([&] {
              require_rank(TensorView(nullptr, DType::kF32, {0, 8}), "x", 2);
            }),
            "");  // nothing to read
  EXPECT_NE(message_of([] { (void)Tensor().to(Device::cpu()); }).find("null data pointer"),
            std::string::npos);
  EXPECT_NE(message_of([] {
              (void)Shape({std::int64_t{1} << 62, 4}).numel();
            }).find("overflows"),
            std::string::npos);
  EXPECT_NE(message_of([] {
              (void)Tensor::zeros(DType::kF32, {std::int64_t{1} << 62, 1});
            }).find("overflows"),
            std::string::npos);
}

TEST(DType, TableRoundTrips) {
  for (const DType d : {DType::kBool, DType::kU8, DType::kI8, DType::kI32, DType::kI64, DType::kF32,
                        DType::kBF16, DType::kF16, DType::kE4M3, DType::kE8M0, DType::kE2M1x2}) {
    EXPECT_EQ(dtype_from_name(name(d)), d);
    if (!info(d).safetensors.empty()) {
      EXPECT_EQ(dtype_from_safetensors(info(d).safetensors), d);
    }
  }
  EXPECT_EQ(size_of(DType::kBF16), 2U);
  EXPECT_EQ(size_of(DType::kI64), 8U);
  EXPECT_FALSE(dtype_from_safetensors("F64").has_value());
}

TEST(Tensor, BorrowSharesMemoryAndKeepsOwnerAlive) {
  auto owner = std::make_shared<std::vector<float>>(std::vector<float>{1, 2, 3, 4, 5, 6});
  const std::weak_ptr<std::vector<float>> watch = owner;
  Tensor copy;
  {
    const Tensor t = Tensor::borrow(TensorView(owner->data(), DType::kF32, {2, 3}), owner, "w");
    owner.reset();
    EXPECT_FALSE(watch.expired());  // the Tensor holds the owner
    EXPECT_TRUE(t.defined());
    EXPECT_EQ(t.shape(), (Shape{2, 3}));
    EXPECT_EQ(t.data_as<float>()[4], 5.0F);  // the owner's memory, not a copy
    EXPECT_EQ(t.data(), static_cast<void*>(watch.lock()->data()));
    copy = t;
  }
  EXPECT_FALSE(watch.expired());  // copies share ownership too
  copy = Tensor();
  EXPECT_TRUE(watch.expired());
}

TEST(Tensor, BorrowRejectsStridedAndNullViews) {
  float data[8] = {};
  const TensorView strided(data, DType::kF32, {2, 2}, {4, 2}, Device::cpu());
  EXPECT_NE(message_of([&] {
              (void)Tensor::borrow(strided, nullptr, "weight.q");
            }).find("weight.q: expected a contiguous tensor"),
            std::string::npos);
  EXPECT_NE(message_of([] {
              (void)Tensor::borrow(TensorView(nullptr, DType::kF32, {2}), nullptr, "scale");
            }).find("scale: expected memory to borrow"),
            std::string::npos);
}

#if !MXQ_WITH_CUDA
TEST(Tensor, CudaAllocationWithoutCudaBuildIsAClearError) {
  EXPECT_NE(message_of([] {
              (void)Tensor::empty(DType::kF32, {4}, Device::cuda());
            }).find("no CUDA support"),
            std::string::npos);
}
#endif

}  // namespace
}  // namespace mxq
