// linear_into, the op as engines call it, on the CPU: it writes the caller's `out` with the bits
// linear() returns for every activation input (bf16, pre-quantized with row-major, MN-major or
// packed UE8M0 scales) and weight scale layout, within a workspace of exactly the size
// linear_workspace_bytes gives and nothing beyond it; and every bad argument is an error naming
// it before anything is written (out stays poisoned).
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "cli/cli_test_support.h"
#include "linear/linear_test_support.h"
#include "mxq/formats/ue8m0_pack.h"
#include "mxq/linear/linear.h"
#include "mxq/linear/tune.h"
#include "mxq/tune/autotuner.h"
#include "mxq/tune/registry.h"
#include "tune/tune_test_util.h"

namespace mxq::linear {
namespace {

using testing::code_of;
using testing::message_of;
using testing::random_bf16;
using testing::random_f32;

bool same_bits(const TensorView& a, const TensorView& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

// [M, N] of `dtype` filled with 0xFF bytes (NaN in bf16 and f32): an unwritten element shows.
Tensor poisoned(std::int64_t m, std::int64_t n, DType dtype) {
  Tensor t = Tensor::empty(dtype, {m, n});
  std::memset(t.data(), 0xFF, t.nbytes());
  return t;
}

bool all_poisoned(const Tensor& t) {
  const auto* bytes = static_cast<const std::uint8_t*>(t.data());
  for (std::size_t i = 0; i < t.nbytes(); ++i) {
    if (bytes[i] != 0xFF) return false;
  }
  return true;
}

// A workspace of exactly `bytes` at the start of a larger buffer whose tail holds a sentinel, so a
// write past the size linear_workspace_bytes gave shows.
class GuardedWorkspace {
 public:
  explicit GuardedWorkspace(std::size_t bytes)
      : bytes_(bytes), memory_(Tensor::empty(DType::kU8, {static_cast<std::int64_t>(bytes + 64)})) {
    std::memset(memory_.data(), 0xA5, memory_.nbytes());
  }
  [[nodiscard]] TensorView view() const {
    return {memory_.data(), DType::kU8, Shape{static_cast<std::int64_t>(bytes_)}};
  }
  [[nodiscard]] bool tail_intact() const {
    const auto* tail = static_cast<const std::uint8_t*>(memory_.data()) + bytes_;
    for (int i = 0; i < 64; ++i) {
      if (tail[i] != 0xA5) return false;
    }
    return true;
  }

 private:
  std::size_t bytes_;
  Tensor memory_;
};

// f32 scales [M, G] stored MN-major: element (m, g) at m + g * ld (DeepGEMM's TMA-aligned layout),
// over `storage` [G, ld].
TensorView mn_major_view(const Tensor& row_major, Tensor& storage, std::int64_t ld) {
  const std::int64_t m = row_major.shape()[0];
  const std::int64_t groups = row_major.shape()[1];
  storage = Tensor::zeros(DType::kF32, {groups, ld});
  for (std::int64_t r = 0; r < m; ++r) {
    for (std::int64_t g = 0; g < groups; ++g) {
      storage.data_as<float>()[g * ld + r] = row_major.data_as<float>()[r * groups + g];
    }
  }
  return {storage.data(), DType::kF32, Shape{m, groups}, Shape{1, ld}, Device::cpu()};
}

struct Inputs {
  Tensor x;
  Fp8BlockTensor xq;
  BlockFp8Weight w;
  BlockFp8Weight w_packed;
  Tensor bias;
};

// Power-of-two (UE8M0) scales throughout, so the weight and the activations can be packed too.
Inputs make_inputs(std::int64_t m, std::int64_t n, std::int64_t k, BlockShape block) {
  Inputs in;
  in.x = random_bf16(m, k, 31);
  in.xq = quantize_fp8_groups(in.x, block.k, ScaleMode::kUe8m0);
  in.w = quantize_weight(random_f32(n, k, 32), block, ScaleMode::kUe8m0);
  in.w_packed = in.w.with_packed_ue8m0_scales();
  in.bias = Tensor::empty(DType::kF32, {n});
  for (std::int64_t i = 0; i < n; ++i) in.bias.data_as<float>()[i] = 0.25F * static_cast<float>(i);
  return in;
}

TEST(LinearInto, WritesTheBitsLinearReturnsForEveryInputFormWithinItsWorkspace) {
  constexpr std::int64_t kM = 7;
  constexpr std::int64_t kN = 70;
  constexpr std::int64_t kK = 300;
  const BlockShape block{64, 128};
  const Inputs in = make_inputs(kM, kN, kK, block);
  Tensor mn_storage;
  const TensorView mn_major = mn_major_view(in.xq.scale, mn_storage, 12);  // ld > M, % 4 == 0
  const Tensor packed_scales = pack_ue8m0(in.xq.scale);
  ASSERT_EQ(activation_input_of(in.xq.scale), ActivationInput::kFp8);
  ASSERT_EQ(activation_input_of(mn_major), ActivationInput::kFp8MnMajor);
  ASSERT_EQ(activation_input_of(packed_scales), ActivationInput::kFp8PackedUe8m0);

  for (const BlockFp8Weight* w : {&in.w, &in.w_packed}) {
    for (const DType out_dtype : {DType::kBF16, DType::kF32}) {
      for (const char* tactic : {"cpu.reference", "cpu.blocked_f32.n16"}) {
        LinearOptions options;
        options.tactic = tactic;
        options.out_dtype = out_dtype;
        options.activation_scales = ScaleMode::kUe8m0;
        const Tensor want_bf16 = linear(in.x, *w, &in.bias.view(), options);
        const Tensor want_fp8 = linear(in.xq, *w, &in.bias.view(), options);
        ASSERT_TRUE(same_bits(want_bf16, want_fp8)) << tactic;  // same quantized inputs
        const std::string what = std::string(tactic) + " " + std::string(name(out_dtype)) +
                                 (w == &in.w_packed ? " packed weight scales" : "");

        const auto check = [&](ActivationInput input, const auto& call) {
          const std::size_t bytes = linear_workspace_bytes(kM, *w, input);
          GuardedWorkspace workspace(bytes);
          Tensor out = poisoned(kM, kN, out_dtype);
          call(out, workspace.view());
          EXPECT_TRUE(same_bits(out, want_bf16)) << to_string(input) << ", " << what;
          EXPECT_TRUE(workspace.tail_intact()) << to_string(input) << ", " << what;
        };
        check(ActivationInput::kBf16, [&](const Tensor& out, const TensorView& ws) {
          linear_into(in.x, *w, &in.bias.view(), out, ws, options);
        });
        check(ActivationInput::kFp8, [&](const Tensor& out, const TensorView& ws) {
          linear_into(in.xq.q, in.xq.scale, *w, &in.bias.view(), out, ws, options);
        });
        check(ActivationInput::kFp8MnMajor, [&](const Tensor& out, const TensorView& ws) {
          linear_into(in.xq.q, mn_major, *w, &in.bias.view(), out, ws, options);
        });
        check(ActivationInput::kFp8PackedUe8m0, [&](const Tensor& out, const TensorView& ws) {
          linear_into(in.xq.q, packed_scales, *w, &in.bias.view(), out, ws, options);
        });
      }
    }
  }
}

TEST(LinearInto, NeedsNoWorkspaceWhereTheCpuReadsTheScalesInPlace) {
  const Inputs in = make_inputs(5, 32, 256, {32, 128});
  Tensor mn_storage;
  const TensorView mn_major = mn_major_view(in.xq.scale, mn_storage, 8);
  EXPECT_EQ(linear_workspace_bytes(5, in.w, ActivationInput::kFp8), 0U);
  EXPECT_EQ(linear_workspace_bytes(5, in.w, ActivationInput::kFp8MnMajor), 0U);
  const Tensor want = linear(in.xq, in.w);
  for (const TensorView& scales : {in.xq.scale.view(), mn_major}) {
    Tensor out = poisoned(5, 32, DType::kBF16);
    linear_into(in.xq.q, scales, in.w, nullptr, out, TensorView{});  // no workspace at all
    EXPECT_TRUE(same_bits(out, want));
  }
}

TEST(LinearInto, ReadsScalesOfAnyStrides) {
  // Every other column of a [M, 2G] buffer: neither row-major nor MN-major.
  const Inputs in = make_inputs(5, 32, 256, {32, 128});
  Tensor wide = Tensor::zeros(DType::kF32, {5, 4});
  for (std::int64_t r = 0; r < 5; ++r) {
    for (std::int64_t g = 0; g < 2; ++g) {
      wide.data_as<float>()[r * 4 + 2 * g] = in.xq.scale.data_as<float>()[r * 2 + g];
    }
  }
  const TensorView strided(wide.data(), DType::kF32, Shape{5, 2}, Shape{4, 2}, Device::cpu());
  ASSERT_EQ(activation_input_of(strided), ActivationInput::kFp8);
  Tensor out = poisoned(5, 32, DType::kBF16);
  linear_into(in.xq.q, strided, in.w, nullptr, out, TensorView{});
  EXPECT_TRUE(same_bits(out, linear(in.xq, in.w)));
}

TEST(LinearInto, WorkspaceSizesAreTheLayoutOfItsParts) {
  // M = 5, N = 200, K = 300, block 64x128: G = 3 K-groups, NB = 4 weight block rows.
  LinearProblem p;
  p.m = 5;
  p.n = 200;
  p.k = 300;
  p.block = {64, 128};
  p.device = Device::cpu();
  // CPU: codes [M, K], then (at a 256-byte boundary) scales [M, G] f32.
  EXPECT_EQ(linear_workspace_bytes(p, ActivationInput::kBf16), 1536U + 5 * 3 * 4);
  EXPECT_EQ(linear_workspace_bytes(p, ActivationInput::kFp8), 0U);
  EXPECT_EQ(linear_workspace_bytes(p, ActivationInput::kFp8MnMajor), 0U);
  EXPECT_EQ(linear_workspace_bytes(p, ActivationInput::kFp8PackedUe8m0), 5U * 3 * 4);
  // CUDA (the size needs no GPU): codes [M, round_up(K, 16)], scales [G, round_up(M, 4)].
  p.device = Device::cuda(0);
  EXPECT_EQ(linear_workspace_bytes(p, ActivationInput::kBf16), 1536U + 3 * 8 * 4);
  EXPECT_EQ(linear_workspace_bytes(p, ActivationInput::kFp8), 3U * 8 * 4);
  EXPECT_EQ(linear_workspace_bytes(p, ActivationInput::kFp8MnMajor), 0U);
  EXPECT_EQ(linear_workspace_bytes(p, ActivationInput::kFp8PackedUe8m0), 3U * 8 * 4);
  // Packed weight scales add [NB, G] f32 at the next 256-byte boundary.
  p.weight_scales = ScaleLayout::kPackedUe8m0;
  EXPECT_EQ(linear_workspace_bytes(p, ActivationInput::kFp8MnMajor), 4U * 3 * 4);
  EXPECT_EQ(linear_workspace_bytes(p, ActivationInput::kFp8), 256U + 4 * 3 * 4);
  EXPECT_EQ(linear_workspace_bytes(p, ActivationInput::kBf16), 1536U + 256 + 4 * 3 * 4);

  // Never decreasing with M, on both devices, for every input: one workspace sized for the
  // largest M serves every smaller one.
  for (const Device device : {Device::cpu(), Device::cuda(0)}) {
    p.device = device;
    for (const ActivationInput input :
         {ActivationInput::kBf16, ActivationInput::kFp8, ActivationInput::kFp8MnMajor,
          ActivationInput::kFp8PackedUe8m0}) {
      std::size_t previous = 0;
      for (std::int64_t m = 0; m <= 300; ++m) {
        p.m = m;
        const std::size_t bytes = linear_workspace_bytes(p, input);
        EXPECT_GE(bytes, previous) << "M=" << m << " " << to_string(input);
        previous = bytes;
      }
    }
  }
  p.m = -1;
  EXPECT_EQ(code_of([&] { (void)linear_workspace_bytes(p, ActivationInput::kBf16); }),
            ErrorCode::kShapeMismatch);
  EXPECT_EQ(parse_activation_input("fp8-mn-major", "input"), ActivationInput::kFp8MnMajor);
  EXPECT_EQ(code_of([&] { (void)parse_activation_input("mn", "input"); }),
            ErrorCode::kInvalidArgument);
}

TEST(LinearInto, ClassifiesScaleLayoutsByTheirStrides) {
  Tensor storage = Tensor::zeros(DType::kF32, {64});
  const auto view = [&](Shape shape, Shape strides) {
    return TensorView(storage.data(), DType::kF32, shape, strides, Device::cpu());
  };
  EXPECT_EQ(activation_input_of(view({6, 3}, {3, 1})), ActivationInput::kFp8);
  EXPECT_EQ(activation_input_of(view({6, 3}, {1, 8})), ActivationInput::kFp8MnMajor);
  EXPECT_EQ(activation_input_of(view({8, 3}, {1, 8})), ActivationInput::kFp8MnMajor);  // ld == M
  EXPECT_EQ(activation_input_of(view({1, 3}, {3, 4})), ActivationInput::kFp8MnMajor);  // M == 1
  EXPECT_EQ(activation_input_of(view({6, 1}, {1, 1})), ActivationInput::kFp8MnMajor);  // G == 1
  EXPECT_EQ(activation_input_of(view({1, 3}, {3, 1})), ActivationInput::kFp8);
  // Any other strides are read through a copy: ld not a multiple of 4 (no 16-byte TMA rows) or
  // below M, every other column, or an MN-major base off a 16-byte boundary.
  EXPECT_EQ(activation_input_of(view({6, 3}, {1, 6})), ActivationInput::kFp8);
  EXPECT_EQ(activation_input_of(view({6, 3}, {1, 4})), ActivationInput::kFp8);
  EXPECT_EQ(activation_input_of(view({6, 3}, {6, 2})), ActivationInput::kFp8);
  const TensorView off_boundary(storage.data_as<float>() + 1, DType::kF32, Shape{6, 3}, Shape{1, 8},
                                Device::cpu());
  EXPECT_EQ(activation_input_of(off_boundary), ActivationInput::kFp8);
  const Tensor f16 = Tensor::zeros(DType::kF16, {2, 2});
  EXPECT_EQ(code_of([&] { (void)activation_input_of(f16); }), ErrorCode::kDtypeMismatch);
  const Tensor packed = Tensor::zeros(DType::kI32, {1, 4});
  EXPECT_EQ(activation_input_of(packed), ActivationInput::kFp8PackedUe8m0);
}

// Every bad argument fails before anything is written: the message names it, `out` keeps its
// poison.
class LinearIntoErrors : public ::testing::Test {
 protected:
  static constexpr std::int64_t kM = 4;
  static constexpr std::int64_t kN = 64;
  static constexpr std::int64_t kK = 256;

  void expect_refused(const std::function<void(const TensorView& out)>& call, ErrorCode code,
                      const std::string& text) {
    Tensor out = poisoned(kM, kN, DType::kBF16);
    const std::string message = message_of([&] { call(out); });
    EXPECT_NE(message.find(text), std::string::npos) << "message: " << message;
    EXPECT_EQ(code_of([&] { call(out); }), code) << message;
    EXPECT_TRUE(all_poisoned(out)) << "written before the error: " << message;
  }

  const Inputs in_ = make_inputs(kM, kN, kK, {64, 128});
  const std::size_t bf16_bytes_ = linear_workspace_bytes(kM, in_.w, ActivationInput::kBf16);
  Tensor workspace_ = Tensor::empty(DType::kU8, {static_cast<std::int64_t>(bf16_bytes_)});
};

TEST_F(LinearIntoErrors, OutMustBeBf16OrF32OfShapeMNContiguousOnTheWeightsDevice) {
  Tensor f16 = Tensor::empty(DType::kF16, {kM, kN});
  EXPECT_EQ(code_of([&] { linear_into(in_.x, in_.w, nullptr, f16, workspace_); }),
            ErrorCode::kDtypeMismatch);
  EXPECT_NE(message_of([&] {
              linear_into(in_.x, in_.w, nullptr, f16, workspace_);
            }).find("out: expected bf16 or f32, found f16"),
            std::string::npos);
  expect_refused(
      [&](const TensorView& out) {
        const TensorView wrong(out.data(), DType::kBF16, Shape{kM, kN - 1});
        linear_into(in_.x, in_.w, nullptr, wrong, workspace_);
      },
      ErrorCode::kShapeMismatch, "out: expected [4, 64]");
  expect_refused(
      [&](const TensorView& out) {
        // Every other column of a [M, 2N] buffer: right shape, not contiguous.
        const TensorView strided(out.data(), DType::kBF16, Shape{kM / 2, kN}, Shape{2 * kN, 1},
                                 Device::cpu());
        const Tensor x = random_bf16(kM / 2, kK, 3);
        linear_into(x, in_.w, nullptr, strided, workspace_);
      },
      ErrorCode::kInvalidArgument, "out: expected a contiguous");
  expect_refused(
      [&](const TensorView& out) {
        const TensorView elsewhere(out.data(), DType::kBF16, out.shape(), Device::cuda(0));
        linear_into(in_.x, in_.w, nullptr, elsewhere, workspace_);
      },
      ErrorCode::kDeviceMismatch, "out");
  expect_refused(
      [&](const TensorView& out) {
        (void)out;
        const TensorView null(nullptr, DType::kBF16, Shape{kM, kN});
        linear_into(in_.x, in_.w, nullptr, null, workspace_);
      },
      ErrorCode::kInvalidArgument, "out: expected a tensor with memory, found a null data");
}

TEST_F(LinearIntoErrors, TheWorkspaceMustHoldWhatTheCallNeeds) {
  ASSERT_GT(bf16_bytes_, 0U);
  expect_refused(
      [&](const TensorView& out) {
        const TensorView small(workspace_.data(), DType::kU8,
                               Shape{static_cast<std::int64_t>(bf16_bytes_ - 1)});
        linear_into(in_.x, in_.w, nullptr, out, small);
      },
      ErrorCode::kShapeMismatch,
      "workspace: expected at least " + std::to_string(bf16_bytes_) +
          " bytes (linear_workspace_bytes for M = 4, bf16 activations, fp32 weight scales, on "
          "cpu), found " +
          std::to_string(bf16_bytes_ - 1) + " bytes");
  expect_refused(
      [&](const TensorView& out) { linear_into(in_.x, in_.w, nullptr, out, TensorView{}); },
      ErrorCode::kInvalidArgument, "workspace: expected at least");
  expect_refused(
      [&](const TensorView& out) {
        const Tensor f32 = Tensor::empty(DType::kF32, {static_cast<std::int64_t>(bf16_bytes_)});
        linear_into(in_.x, in_.w, nullptr, out, f32);
      },
      ErrorCode::kDtypeMismatch, "workspace: expected u8, found f32");
  expect_refused(
      [&](const TensorView& out) {
        const TensorView on_gpu(workspace_.data(), DType::kU8, workspace_.shape(), Device::cuda(0));
        linear_into(in_.x, in_.w, nullptr, out, on_gpu);
      },
      ErrorCode::kDeviceMismatch, "workspace");
  expect_refused(
      [&](const TensorView& out) {
        const Tensor bigger =
            Tensor::empty(DType::kU8, {static_cast<std::int64_t>(bf16_bytes_) + 16});
        const TensorView off_by_one(static_cast<std::uint8_t*>(bigger.data()) + 1, DType::kU8,
                                    Shape{static_cast<std::int64_t>(bf16_bytes_)});
        linear_into(in_.x, in_.w, nullptr, out, off_by_one);
      },
      ErrorCode::kInvalidArgument, "workspace: expected a 16-byte aligned address");
  // Packed weight scales need their unpacked copy on top.
  const std::size_t packed_bytes = linear_workspace_bytes(kM, in_.w_packed, ActivationInput::kBf16);
  ASSERT_GT(packed_bytes, bf16_bytes_);
  expect_refused(
      [&](const TensorView& out) { linear_into(in_.x, in_.w_packed, nullptr, out, workspace_); },
      ErrorCode::kShapeMismatch, "packed-ue8m0 weight scales");
}

TEST_F(LinearIntoErrors, PreQuantizedActivationsAreCheckedAgainstTheWeight) {
  expect_refused(
      [&](const TensorView& out) {
        linear_into(in_.xq.scale, in_.xq.scale, in_.w, nullptr, out, workspace_);
      },
      ErrorCode::kDtypeMismatch, "x_q: expected e4m3, found f32");
  expect_refused(
      [&](const TensorView& out) {
        const Tensor wrong = Tensor::zeros(DType::kF32, {kM, 3});
        linear_into(in_.xq.q, wrong, in_.w, nullptr, out, workspace_);
      },
      ErrorCode::kShapeMismatch,
      "x_scale: expected f32 [4, 2] (one per 1x128 group of x_q [4, 256], the weight block's K "
      "extent), found f32 [4, 3]");
  expect_refused(
      [&](const TensorView& out) {
        const Tensor wrong = Tensor::zeros(DType::kI32, {1, 8});
        linear_into(in_.xq.q, wrong, in_.w, nullptr, out, workspace_);
      },
      ErrorCode::kShapeMismatch, "x_scale: expected packed UE8M0 i32 [1, 4] for 4x2 scales");
  expect_refused(
      [&](const TensorView& out) {
        const Tensor short_k = Tensor::zeros(DType::kE4M3, {kM, kK - 128});
        linear_into(short_k, in_.xq.scale, in_.w, nullptr, out, workspace_);
      },
      ErrorCode::kShapeMismatch, "x_q: expected K = 256 columns (the weight is [64, 256])");
  expect_refused(
      [&](const TensorView& out) {
        const TensorView scales_elsewhere(in_.xq.scale.data(), DType::kF32, in_.xq.scale.shape(),
                                          Device::cuda(0));
        linear_into(in_.xq.q, scales_elsewhere, in_.w, nullptr, out, workspace_);
      },
      ErrorCode::kDeviceMismatch, "x_scale");
  expect_refused(
      [&](const TensorView& out) {
        const Tensor bias = Tensor::zeros(DType::kF32, {kN + 1});
        linear_into(in_.xq.q, in_.xq.scale, in_.w, &bias.view(), out, workspace_);
      },
      ErrorCode::kShapeMismatch, "bias: expected [64]");
}

// The alignment TMA needs is checked on CUDA operands before any CUDA call: these views say
// "cuda:0" over host memory that nothing dereferences, so the test runs without a GPU.
TEST_F(LinearIntoErrors, CudaOperandsMustBe16ByteAligned) {
  const Device gpu = Device::cuda(0);
  const auto on_gpu = [&](const TensorView& t, std::int64_t byte_offset = 0) {
    return TensorView(static_cast<std::uint8_t*>(t.data()) + byte_offset, t.dtype(), t.shape(),
                      t.strides(), gpu);
  };
  const BlockFp8Weight w{Tensor::borrow(on_gpu(in_.w.q), nullptr),
                         Tensor::borrow(on_gpu(in_.w.scale), nullptr), in_.w.block};
  Tensor out_memory = Tensor::empty(DType::kBF16, {kM * kN + 8});
  const TensorView out(out_memory.data(), DType::kBF16, Shape{kM, kN}, gpu);
  const TensorView out_odd(static_cast<std::uint16_t*>(out_memory.data()) + 1, DType::kBF16,
                           Shape{kM, kN}, gpu);
  Tensor q_memory = Tensor::empty(DType::kE4M3, {kM * kK + 16});
  const TensorView x_q_odd(static_cast<std::uint8_t*>(q_memory.data()) + 8, DType::kE4M3,
                           Shape{kM, kK}, gpu);
  const TensorView x_q(q_memory.data(), DType::kE4M3, Shape{kM, kK}, gpu);
  const TensorView workspace(workspace_.data(), DType::kU8, workspace_.shape(), gpu);

  EXPECT_NE(message_of([&] {
              linear_into(x_q, on_gpu(in_.xq.scale), w, nullptr, out_odd, workspace);
            }).find("out: expected a 16-byte aligned address (TMA), found 0x"),
            std::string::npos);
  EXPECT_NE(message_of([&] {
              linear_into(x_q_odd, on_gpu(in_.xq.scale), w, nullptr, out, workspace);
            }).find("x_q: expected a 16-byte aligned address (TMA)"),
            std::string::npos);
  const BlockFp8Weight w_odd{Tensor::borrow(on_gpu(in_.w.q, 4), nullptr),
                             Tensor::borrow(on_gpu(in_.w.scale), nullptr), in_.w.block};
  EXPECT_EQ(
      code_of([&] { linear_into(x_q, on_gpu(in_.xq.scale), w_odd, nullptr, out, workspace); }),
      ErrorCode::kInvalidArgument);
}

TEST(LinearInto, ZeroRowsDoNothing) {
  const BlockFp8Weight w = quantize_weight(random_f32(32, 128, 5), {32, 128});
  const Tensor x = Tensor::empty(DType::kBF16, {0, 128});
  const Tensor out = Tensor::empty(DType::kBF16, {0, 32});
  linear_into(x, w, nullptr, out, TensorView{});
  const Tensor x_q = Tensor::empty(DType::kE4M3, {0, 128});
  const Tensor x_scale = Tensor::empty(DType::kF32, {0, 1});
  linear_into(x_q, x_scale, w, nullptr, out, TensorView{});
  // linear() keeps refusing them (it returns a tensor, and always did).
  EXPECT_EQ(code_of([&] { (void)linear(x, w); }), ErrorCode::kShapeMismatch);
}

TEST(LinearInto, ConsultsTheAutotunerWithAPrebuiltProblem) {
  constexpr std::int64_t kN = 96;
  constexpr std::int64_t kK = 256;
  const BlockShape block{64, 64};
  const mxq::testing::ScratchDir dir("mxq-linear-into-tuner");
  const tune::Problem problem = block_fp8_linear_problem(kN, kK, block);
  tune::testing::write_cpu_cache(
      dir.file("cache.json"), tune::builtin_tactics(),
      {tune::testing::hand_written_entry(problem, 8, "blocked_f32[tile_n=16]")});
  const std::unique_ptr<tune::Autotuner> tuner =
      tune::testing::load_cpu_tuner(dir.file("cache.json"));
  const BlockFp8Weight w = quantize_weight(random_f32(kN, kK, 6), block);
  const Fp8BlockTensor x = quantize_fp8_groups(random_bf16(6, kK, 7), block.k);
  LinearRun ran;
  LinearOptions options;
  options.tuner = tuner.get();
  options.tune_problem = &problem;
  options.ran = &ran;
  Tensor out = poisoned(6, kN, DType::kBF16);
  linear_into(x.q, x.scale, w, nullptr, out, TensorView{}, options);
  ASSERT_NE(ran.tactic, nullptr);
  EXPECT_EQ(ran.tactic->name(), "cpu.blocked_f32.n16");
  EXPECT_TRUE(ran.from_tuner);
  LinearOptions forced;
  forced.tactic = "cpu.blocked_f32.n16";
  EXPECT_TRUE(same_bits(out, linear(x, w, nullptr, forced)));
  // The problem of an f32 output is another key: a mismatch is the caller's error.
  Tensor out_f32 = poisoned(6, kN, DType::kF32);
  EXPECT_EQ(code_of([&] { linear_into(x.q, x.scale, w, nullptr, out_f32, TensorView{}, options); }),
            ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace mxq::linear

namespace mxq::linear {
namespace {

TEST(QuantizeActivationsInto, WritesWhatQuantizeActivationsReturnsAndChecksItsOutputs) {
  const Tensor x = random_bf16(5, 300, 41);
  const Fp8BlockTensor want = quantize_activations(x, 128, ScaleMode::kUe8m0);
  Tensor q = Tensor::zeros(DType::kE4M3, {5, 300});
  Tensor scale = Tensor::zeros(DType::kF32, {5, 3});
  EXPECT_EQ(quantize_activations_workspace_bytes(5, 300, 128, Device::cpu()), 0U);
  EXPECT_EQ(quantize_activations_workspace_bytes(5, 300, 128, Device::cuda()), 5U * 3 * 4);
  quantize_activations_into(x, 128, ScaleMode::kUe8m0, q, scale, TensorView());
  EXPECT_EQ(std::memcmp(q.data(), want.q.data(), q.nbytes()), 0);
  EXPECT_EQ(std::memcmp(scale.data(), want.scale.data(), scale.nbytes()), 0);
  const Tensor short_scale = Tensor::zeros(DType::kF32, {5, 2});
  EXPECT_NE(message_of([&] {
              quantize_activations_into(x, 128, ScaleMode::kFp32, q, short_scale, TensorView());
            }).find("scale"),
            std::string::npos);
  const Tensor f32_q = Tensor::zeros(DType::kF32, {5, 300});
  EXPECT_NE(message_of([&] {
              quantize_activations_into(x, 128, ScaleMode::kFp32, f32_q, scale, TensorView());
            }).find("q"),
            std::string::npos);
  EXPECT_EQ(
      code_of([&] { quantize_activations_into(x, 0, ScaleMode::kFp32, q, scale, TensorView()); }),
      ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace mxq::linear
