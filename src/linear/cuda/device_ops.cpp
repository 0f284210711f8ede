// CUDA side of the linear op: the CUDA tactics (the sm_90 wgmma fast path and the mma.sync
// fallback) and the device helpers declared in src/linear/device_ops.h.
#include "linear/device_ops.h"

#include <climits>
#include <string>

#include "linear/cuda/launch.h"
#include "linear/cuda/tile_schedule.h"
#include "mxq/core/cuda_check.h"
#include "mxq/core/error.h"

namespace mxq::linear::internal {
namespace {

// This build carries machine code for sm_90a only (cmake/MxqCuda.cmake).
constexpr int kBuiltSm = 90;

cudaStream_t as_stream(void* stream) { return static_cast<cudaStream_t>(stream); }

std::string sm_name(int sm) { return "sm_" + std::to_string(sm); }

Support common_cuda_checks(const LinearProblem& p) {
  if (!p.device.is_cuda()) {
    return Support::no(detail::concat("needs a CUDA device; the problem is on ", p.device));
  }
  if (p.m < 1 || p.n < 1 || p.k < 1) {
    return Support::no(detail::concat("needs M, N, K >= 1; found M=", p.m, " N=", p.n, " K=", p.k));
  }
  if (p.m > INT_MAX || p.n > INT_MAX || p.k > INT_MAX) {
    return Support::no("needs M, N and K below 2^31");
  }
  return Support::yes();
}

// What both wgmma kernels (fast path and fallback) need of the device: TMA and wgmma.
Support wgmma_device_checks(const LinearProblem& p) {
  if (Support common = common_cuda_checks(p); !common) return common;
  if (p.sm != 90) {
    return Support::no("needs an sm_90 GPU (H100/H200: wgmma and TMA); the device is " +
                       sm_name(p.sm));
  }
  return Support::yes();
}

// What both wgmma kernels need of the output: bf16 column pairs and 16-byte TMA store rows.
Support wgmma_output_checks(const LinearProblem& p) {
  if (p.n % 16 != 0) {
    return Support::no(detail::concat("needs N % 16 == 0; N = ", p.n));
  }
  if (p.out_dtype != DType::kBF16) {
    return Support::no(detail::concat("needs bf16 output; the output is ", p.out_dtype));
  }
  return Support::yes();
}

// What the fast path's kernels (one tile or a tail split) need beyond the device: 128x128 weight
// blocks and whole 128-byte K blocks.
Support fast_path_checks(const LinearProblem& p) {
  if (Support device = wgmma_device_checks(p); !device) return device;
  if (!(p.block == BlockShape{128, 128})) {
    return Support::no("needs 128x128 weight blocks; the block is " + to_string(p.block));
  }
  if (p.k % 128 != 0) {
    return Support::no(detail::concat("needs K % 128 == 0; K = ", p.k));
  }
  return Support::yes();
}

gpu::BlockFp8GemmArgs gemm_args(const LinearOperands& ops, const LinearProblem& p) {
  if (ops.a_scale_row_stride != 1 || ops.a_scale_group_stride < p.m) {
    fail(ErrorCode::kInternal,
         "CUDA block-FP8 tactics read activation scales K-group major [G, ld >= M]; got row "
         "stride ",
         ops.a_scale_row_stride, ", group stride ", ops.a_scale_group_stride);
  }
  gpu::BlockFp8GemmArgs args;
  args.a = ops.a;
  args.lda = ops.lda;
  args.a_scale = ops.a_scale;
  args.a_scale_ld = ops.a_scale_group_stride;
  args.w = ops.w;
  args.ldw = ops.ldw;
  args.w_scale = ops.w_scale;
  args.w_scale_ld = ops.w_scale_ld;
  if (ops.bias != nullptr) {
    if (ops.bias_dtype == DType::kF32) {
      args.bias_f32 = static_cast<const float*>(ops.bias);
    } else {
      args.bias_bf16 = static_cast<const std::uint16_t*>(ops.bias);
    }
  }
  args.out = ops.out;
  args.ldo = ops.ldo;
  args.out_bf16 = p.out_dtype == DType::kBF16;
  args.m = static_cast<int>(p.m);
  args.n = static_cast<int>(p.n);
  args.k = static_cast<int>(p.k);
  args.block_n = static_cast<int>(p.block.n);
  args.block_k = static_cast<int>(p.block.k);
  return args;
}

// The Hopper fast path: TMA + wgmma, 128x128 weight blocks only.
class WgmmaTactic final : public LinearTactic {
 public:
  explicit WgmmaTactic(gpu::WgmmaShape shape)
      : shape_(shape), name_("cuda.sm90_wgmma." + gpu::to_string(shape)) {}

  [[nodiscard]] const std::string& name() const override { return name_; }
  [[nodiscard]] TacticKind kind() const override { return TacticKind::kFast; }
  [[nodiscard]] TacticParams params() const override {
    TacticParams params{{"block_m", shape_.bm},
                        {"block_n", shape_.bn},
                        {"block_k", 128},
                        {"stages", shape_.stages},
                        {"overlap", shape_.overlap ? 1 : 0}};
    if (shape_.cluster > 1) params.set("cluster", static_cast<std::int64_t>(shape_.cluster));
    if (shape_.split_k > 1) params.set("split_k", static_cast<std::int64_t>(shape_.split_k));
    return params;
  }
  [[nodiscard]] Support check(const LinearProblem& p) const override {
    if (Support fast = fast_path_checks(p); !fast) return fast;
    return wgmma_output_checks(p);
  }

 protected:
  void run_supported(const LinearOperands& ops, const LinearProblem& p) const override {
    gpu::launch_wgmma(shape_, gemm_args(ops, p), as_stream(ops.stream));
  }

 private:
  gpu::WgmmaShape shape_;
  std::string name_;
};

// The fast path with its last, partly idle wave split off: the rows of M that `head_` tiles fill
// whole waves with (tail_split_rows), then the rest of M in a second launch of the smaller
// `tail_` tile, on the caller's stream. N = 2112 at M = 4096: 256x128 tiles for 3840 rows (two
// waves) and 64x64 tiles for the last 256 (one wave of 132 tiles a quarter as long), instead of
// a third wave of 8 tiles on 132 SMs.
class WgmmaTailSplitTactic final : public LinearTactic {
 public:
  WgmmaTailSplitTactic(gpu::WgmmaShape head, gpu::WgmmaShape tail)
      : head_(head),
        tail_(tail),
        name_("cuda.sm90_wgmma." + gpu::to_string(head) + "_tail_" + gpu::to_string(tail)) {}

  [[nodiscard]] const std::string& name() const override { return name_; }
  [[nodiscard]] TacticKind kind() const override { return TacticKind::kFast; }
  [[nodiscard]] TacticParams params() const override {
    return {{"block_m", head_.bm},        {"block_n", head_.bn},      {"block_k", 128},
            {"stages", head_.stages},     {"tail_block_m", tail_.bm}, {"tail_block_n", tail_.bn},
            {"tail_stages", tail_.stages}};
  }
  [[nodiscard]] Support check(const LinearProblem& p) const override {
    if (Support fast = fast_path_checks(p); !fast) return fast;
    if (head_rows(p) == 0) {
      return Support::no(detail::concat("needs a last wave of ", head_.bm, "x", head_.bn,
                                        " tiles that leaves SMs idle after a whole one (", tiles(p),
                                        " tiles on ", sms(p), " SMs)"));
    }
    return wgmma_output_checks(p);
  }

 protected:
  void run_supported(const LinearOperands& ops, const LinearProblem& p) const override {
    const gpu::BlockFp8GemmArgs args = gemm_args(ops, p);
    const long long rows = head_rows(p);
    gpu::BlockFp8GemmArgs head = args;
    head.m = static_cast<int>(rows);
    gpu::launch_wgmma(head_, head, as_stream(ops.stream));
    gpu::BlockFp8GemmArgs tail = args;
    tail.m = static_cast<int>(p.m - rows);
    tail.a = args.a + rows * args.lda;
    tail.a_scale = args.a_scale + rows;  // K-group major: each group's row of M scales
    tail.out = static_cast<std::uint16_t*>(args.out) + rows * args.ldo;  // bf16
    gpu::launch_wgmma(tail_, tail, as_stream(ops.stream));
  }

 private:
  static long long sms(const LinearProblem& p) { return p.sm_count > 0 ? p.sm_count : 132; }
  long long tiles(const LinearProblem& p) const {
    return (p.m + head_.bm - 1) / head_.bm * ((p.n + head_.bn - 1) / head_.bn);
  }
  long long head_rows(const LinearProblem& p) const {
    return gpu::tail_split_rows(p.m, p.n, head_.bm, head_.bn, sms(p));
  }

  gpu::WgmmaShape head_;
  gpu::WgmmaShape tail_;
  std::string name_;
};

// The wgmma fallback: the fast path's kernel for other weight blocks (K extent 64 or 128; N extent
// a multiple of the tile width, or 64 under 128-wide tiles) and ragged K (K % 16 == 0).
class WgmmaAnyBlockTactic final : public LinearTactic {
 public:
  explicit WgmmaAnyBlockTactic(gpu::WgmmaShape shape)
      : shape_(shape), name_("cuda.sm90_wgmma_any." + gpu::to_string(shape)) {}

  [[nodiscard]] const std::string& name() const override { return name_; }
  [[nodiscard]] TacticKind kind() const override { return TacticKind::kFallback; }
  [[nodiscard]] TacticParams params() const override {
    return {{"block_m", shape_.bm},
            {"block_n", shape_.bn},
            {"stages", shape_.stages},
            {"overlap", shape_.overlap ? 1 : 0}};
  }
  [[nodiscard]] Support check(const LinearProblem& p) const override {
    if (Support device = wgmma_device_checks(p); !device) return device;
    if (p.block.k != 64 && p.block.k != 128) {
      return Support::no("needs a weight block K extent of 64 or 128; the block is " +
                         to_string(p.block));
    }
    const bool n_fits = p.block.n % shape_.bn == 0 || (shape_.bn == 128 && p.block.n == 64);
    if (!n_fits) {
      return Support::no(detail::concat(
          "needs a weight block N extent that is a multiple of the tile's ", shape_.bn,
          shape_.bn == 128 ? " or 64" : "", "; the block is ", to_string(p.block)));
    }
    if (p.k % 16 != 0) {
      return Support::no(detail::concat("needs K % 16 == 0 (16-byte TMA rows); K = ", p.k));
    }
    return wgmma_output_checks(p);
  }

 protected:
  void run_supported(const LinearOperands& ops, const LinearProblem& p) const override {
    gpu::launch_wgmma_any_block(shape_, gemm_args(ops, p), as_stream(ops.stream));
  }

 private:
  gpu::WgmmaShape shape_;
  std::string name_;
};

// The general path: mma.sync e4m3 tensor cores (or, as an alternative for the tuner, the same
// fragments unpacked to f16 for mma.sync f16), every block with bn, bk multiples of 16.
class MmaSyncTactic final : public LinearTactic {
 public:
  explicit MmaSyncTactic(gpu::MmaSyncShape shape)
      : shape_(shape),
        name_((shape.f16_mma ? "cuda.mma_f16." : "cuda.mma_sync.") + gpu::to_string(shape)) {}

  [[nodiscard]] const std::string& name() const override { return name_; }
  [[nodiscard]] TacticKind kind() const override { return TacticKind::kFallback; }
  [[nodiscard]] TacticParams params() const override {
    return {{"block_m", shape_.bm},      {"block_n", shape_.bn},
            {"k_chunk", shape_.kc},      {"stages", shape_.stages},
            {"threads", shape_.threads}, {"f16_mma", shape_.f16_mma ? 1 : 0}};
  }
  [[nodiscard]] Support check(const LinearProblem& p) const override {
    if (Support common = common_cuda_checks(p); !common) return common;
    if (p.sm < 89) {
      return Support::no("needs FP8 tensor cores (sm_89 or newer); the device is " + sm_name(p.sm));
    }
    if (p.sm != kBuiltSm) {
      return Support::no("this build has machine code for sm_90a only; the device is " +
                         sm_name(p.sm));
    }
    if (p.block.n % 16 != 0 || p.block.k % 16 != 0) {
      return Support::no("needs block extents that are multiples of 16; the block is " +
                         to_string(p.block));
    }
    if (p.block.n > INT_MAX || p.block.k > INT_MAX) {
      return Support::no("needs block extents below 2^31");
    }
    if (p.out_dtype != DType::kBF16 && p.out_dtype != DType::kF32) {
      return Support::no(detail::concat("needs bf16 or f32 output; the output is ", p.out_dtype));
    }
    return Support::yes();
  }

 protected:
  void run_supported(const LinearOperands& ops, const LinearProblem& p) const override {
    gpu::launch_mma_sync(shape_, gemm_args(ops, p), as_stream(ops.stream));
  }

 private:
  gpu::MmaSyncShape shape_;
  std::string name_;
};

}  // namespace

void append_cuda_tactics(std::vector<std::unique_ptr<LinearTactic>>& tactics) {
  for (const gpu::WgmmaShape& shape : gpu::kWgmmaShapes) {
    tactics.push_back(std::make_unique<WgmmaTactic>(shape));
  }
  for (const gpu::WgmmaTailSplit& split : gpu::kWgmmaTailSplits) {
    tactics.push_back(std::make_unique<WgmmaTailSplitTactic>(split.head, split.tail));
  }
  for (const gpu::WgmmaShape& shape : gpu::kWgmmaAnyBlockShapes) {
    tactics.push_back(std::make_unique<WgmmaAnyBlockTactic>(shape));
  }
  for (const gpu::MmaSyncShape& shape : gpu::kMmaSyncShapes) {
    tactics.push_back(std::make_unique<MmaSyncTactic>(shape));
  }
}

std::shared_ptr<void> stream_ordered_buffer(std::size_t bytes, void* stream) {
  void* data = nullptr;
  MXQ_CUDA_CHECK(cudaMallocAsync(&data, bytes == 0 ? 16 : bytes, as_stream(stream)));
  // No throwing from a deleter; an error here resurfaces at the next checked CUDA call.
  return {data, [stream](void* p) { (void)cudaFreeAsync(p, as_stream(stream)); }};
}

void unpack_ue8m0_on_device(const TensorView& packed, std::int64_t mn, std::int64_t groups,
                            float* out, std::int64_t out_rows, std::int64_t stride_mn,
                            std::int64_t stride_g, void* stream) {
  require_dtype(packed, "packed UE8M0 scales", DType::kI32);
  require_shape(packed, "packed UE8M0 scales", Shape{(groups + 3) / 4, (mn + 3) / 4 * 4});
  gpu::launch_unpack_ue8m0(static_cast<const std::int32_t*>(packed.data()), static_cast<int>(mn),
                           static_cast<int>(groups), out_rows, out, stride_mn, stride_g,
                           as_stream(stream));
}

void transpose_scales_on_device(const float* in, std::int64_t mn, std::int64_t groups,
                                std::int64_t stride_mn, std::int64_t stride_g, float* out,
                                std::int64_t out_ld, void* stream) {
  gpu::launch_transpose_scales(in, static_cast<int>(mn), static_cast<int>(groups), stride_mn,
                               stride_g, out, out_ld, as_stream(stream));
}

void quantize_activations_on_device(const TensorView& x, std::int64_t group_k, ScaleMode mode,
                                    std::uint8_t* q, std::int64_t ldq, float* scale,
                                    std::int64_t scale_ld, void* stream) {
  gpu::QuantizeActivationArgs args;
  args.x = static_cast<const std::uint16_t*>(x.data());
  args.ldx = x.strides()[0];
  args.q = q;
  args.ldq = ldq;
  args.scale = scale;
  args.scale_ld = scale_ld;
  args.m = static_cast<int>(x.size(0));
  args.k = static_cast<int>(x.size(1));
  args.group_k = static_cast<int>(group_k);
  args.ue8m0 = mode == ScaleMode::kUe8m0;
  gpu::launch_quantize_activation(args, as_stream(stream));
}

}  // namespace mxq::linear::internal
