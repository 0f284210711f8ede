#include "mxq/linear/linear.h"

#include "linear/cpu/block_fp8_linear.h"
#include "linear/device_ops.h"
#include "mxq/core/error.h"
#include "mxq/formats/ue8m0_pack.h"
#include "mxq/linear/dispatch.h"

namespace mxq::linear {
namespace {

// Keeps a host tensor alive in PreparedLinear::storage.
std::shared_ptr<void> keep(Tensor tensor) { return std::make_shared<Tensor>(std::move(tensor)); }

// Stream-ordered device scratch of `count` elements of T.
template <typename T>
T* scratch(PreparedLinear& prepared, std::int64_t count, void* stream) {
  prepared.storage.push_back(
      internal::stream_ordered_buffer(static_cast<std::size_t>(count) * sizeof(T), stream));
  return static_cast<T*>(prepared.storage.back().get());
}

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }
std::int64_t round_up(std::int64_t a, std::int64_t b) { return ceil_div(a, b) * b; }

void require_out_dtype(DType dtype) {
  if (dtype != DType::kBF16 && dtype != DType::kF32) {
    fail_argument(ErrorCode::kDtypeMismatch, "options.out_dtype", "bf16 or f32", dtype);
  }
}

// Checks shared by both overloads: the weight, the K of the activations, the bias.
void validate_common(std::int64_t m, std::int64_t k, Device x_device, const BlockFp8Weight& w,
                     const TensorView* bias, const LinearOptions& options) {
  w.validate("weight");
  if (m < 1) fail_argument(ErrorCode::kShapeMismatch, "x", "at least one row (M >= 1)", m);
  if (k != w.k()) {
    fail_argument(ErrorCode::kShapeMismatch, "x",
                  detail::concat("K = ", w.k(), " columns (the weight is ", w.q.shape(), ")"),
                  detail::concat(k, " columns"));
  }
  if (x_device != w.device()) {
    fail(ErrorCode::kDeviceMismatch, "x is on ", x_device, " but the weight is on ", w.device());
  }
  if (bias != nullptr) {
    if (bias->dtype() != DType::kBF16 && bias->dtype() != DType::kF32) {
      fail_argument(ErrorCode::kDtypeMismatch, "bias", "bf16 or f32", bias->dtype());
    }
    require_shape(*bias, "bias", Shape{w.n()});
    require_contiguous(*bias, "bias");
    require_device(*bias, "bias", w.device());
  }
  require_out_dtype(options.out_dtype);
}

LinearProblem problem_for(std::int64_t m, const BlockFp8Weight& w, const TensorView* bias,
                          ScaleMode activation_scales, const LinearOptions& options) {
  LinearProblem problem;
  problem.m = m;
  problem.n = w.n();
  problem.k = w.k();
  problem.block = w.block;
  problem.weight_scales = w.scale_layout();
  problem.activation_scales = activation_scales;
  problem.out_dtype = options.out_dtype;
  problem.has_bias = bias != nullptr;
  describe_device(problem, w.device());
  return problem;
}

// Binds the weight (fp32 scales, unpacked when packed), the bias and the output.
void bind_weight_bias_out(PreparedLinear& prepared, const BlockFp8Weight& w, const TensorView* bias,
                          const TensorView& out, void* stream) {
  LinearOperands& ops = prepared.operands;
  ops.w = static_cast<const std::uint8_t*>(w.q.data());
  ops.ldw = w.k();
  if (w.scale_layout() == ScaleLayout::kFp32) {
    ops.w_scale = w.scale.data_as<float>();
  } else if (w.device().is_cpu()) {
    Tensor unpacked = unpack_ue8m0(w.scale, w.row_blocks(), w.col_blocks());
    ops.w_scale = unpacked.data_as<float>();
    prepared.storage.push_back(keep(std::move(unpacked)));
  } else {
    float* unpacked = scratch<float>(prepared, w.row_blocks() * w.col_blocks(), stream);
    internal::unpack_ue8m0_on_device(w.scale, w.row_blocks(), w.col_blocks(), unpacked,
                                     w.row_blocks(), w.col_blocks(), 1, stream);
    ops.w_scale = unpacked;
  }
  ops.w_scale_ld = w.col_blocks();
  if (bias != nullptr) {
    ops.bias = bias->data();
    ops.bias_dtype = bias->dtype();
  }
  require_dtype(out, "out", prepared.problem.out_dtype);
  require_shape(out, "out", Shape{prepared.problem.m, prepared.problem.n});
  require_contiguous(out, "out");
  require_device(out, "out", w.device());
  ops.out = out.data();
  ops.ldo = prepared.problem.n;
  ops.stream = stream;
}

// The tactic to run (dispatch, with the options' autotuner), reported in options.ran.
const LinearTactic& choose_tactic(const LinearProblem& problem, const LinearOptions& options) {
  bool from_tuner = false;
  const LinearTactic& tactic =
      select_tactic(problem, options.tactic, options.tuner, options.tune_problem, &from_tuner);
  if (options.ran != nullptr) *options.ran = {&tactic, from_tuner};
  return tactic;
}

}  // namespace

LinearProblem make_problem(const TensorView& x, const BlockFp8Weight& w, const TensorView* bias,
                           const LinearOptions& options) {
  require_rank(x, "x", 2);
  require_dtype(x, "x", DType::kBF16);
  require_contiguous(x, "x");
  validate_common(x.size(0), x.size(1), x.device(), w, bias, options);
  return problem_for(x.size(0), w, bias, options.activation_scales, options);
}

PreparedLinear prepare_linear(const Fp8BlockTensor& x, const BlockFp8Weight& w,
                              const TensorView* bias, const TensorView& out,
                              const LinearOptions& options) {
  require_rank(x.q, "x.q", 2);
  require_dtype(x.q, "x.q", DType::kE4M3);
  require_contiguous(x.q, "x.q");
  require_contiguous(x.scale, "x.scale");
  const std::int64_t m = x.q.shape()[0];
  const std::int64_t k = x.q.shape()[1];
  validate_common(m, k, x.q.device(), w, bias, options);
  if (!(x.block == BlockShape{1, w.block.k})) {
    fail_argument(ErrorCode::kInvalidArgument, "x.block",
                  detail::concat("1x", w.block.k, " (the weight block's K extent)"),
                  to_string(x.block));
  }
  require_device(x.scale, "x.scale", x.q.device());
  const std::int64_t groups = ceil_div(k, w.block.k);
  const bool packed = x.scale.dtype() == DType::kI32;
  if (packed) {
    require_shape(x.scale, "x.scale (packed UE8M0)", Shape{ceil_div(groups, 4), round_up(m, 4)});
  } else {
    require_dtype(x.scale, "x.scale", DType::kF32);
    require_shape(x.scale, "x.scale", Shape{m, groups});
  }

  const mxq::detail::DeviceScope scope(w.device());
  PreparedLinear prepared;
  prepared.problem =
      problem_for(m, w, bias, packed ? ScaleMode::kUe8m0 : options.activation_scales, options);
  LinearOperands& ops = prepared.operands;
  ops.a = static_cast<const std::uint8_t*>(x.q.data());
  ops.lda = k;
  if (x.q.device().is_cpu()) {
    Tensor scales = packed ? unpack_ue8m0(x.scale, m, groups) : x.scale;
    ops.a_scale = scales.data_as<float>();
    ops.a_scale_row_stride = groups;
    ops.a_scale_group_stride = 1;
    prepared.storage.push_back(keep(std::move(scales)));
  } else {
    // CUDA tactics read scales K-group major with rows padded to a multiple of 4.
    const std::int64_t ld = round_up(m, 4);
    float* scales = scratch<float>(prepared, groups * ld, options.stream);
    if (packed) {
      internal::unpack_ue8m0_on_device(x.scale, m, groups, scales, ld, 1, ld, options.stream);
    } else {
      internal::transpose_scales_on_device(x.scale.data_as<float>(), m, groups, scales, ld,
                                           options.stream);
    }
    ops.a_scale = scales;
    ops.a_scale_row_stride = 1;
    ops.a_scale_group_stride = ld;
  }
  bind_weight_bias_out(prepared, w, bias, out, options.stream);
  return prepared;
}

Tensor linear(const Fp8BlockTensor& x, const BlockFp8Weight& w, const TensorView* bias,
              const LinearOptions& options) {
  require_rank(x.q, "x.q", 2);
  Tensor out = Tensor::empty(options.out_dtype, {x.q.shape()[0], w.n()}, w.device());
  const PreparedLinear prepared = prepare_linear(x, w, bias, out, options);
  const LinearTactic& tactic = choose_tactic(prepared.problem, options);
  const mxq::detail::DeviceScope scope(w.device());
  tactic.run(prepared.operands, prepared.problem);
  return out;
}

Tensor linear(const TensorView& x, const BlockFp8Weight& w, const TensorView* bias,
              const LinearOptions& options) {
  PreparedLinear prepared;
  prepared.problem = make_problem(x, w, bias, options);
  const mxq::detail::DeviceScope scope(w.device());
  const LinearTactic& tactic = choose_tactic(prepared.problem, options);
  const std::int64_t m = x.size(0);
  const std::int64_t k = x.size(1);
  const std::int64_t group_k = w.block.k;
  LinearOperands& ops = prepared.operands;
  if (x.device().is_cpu()) {
    Fp8BlockTensor quantized = quantize_fp8_groups(x, group_k, options.activation_scales);
    ops.a = static_cast<const std::uint8_t*>(quantized.q.data());
    ops.lda = k;
    ops.a_scale = quantized.scale.data_as<float>();
    ops.a_scale_row_stride = ceil_div(k, group_k);
    ops.a_scale_group_stride = 1;
    prepared.storage.push_back(keep(std::move(quantized.q)));
    prepared.storage.push_back(keep(std::move(quantized.scale)));
  } else {
    // Rows padded to 16 bytes (aligned vector loads), scale rows to a multiple of 4 (TMA).
    const std::int64_t ldq = round_up(k, 16);
    const std::int64_t scale_ld = round_up(m, 4);
    auto* q = scratch<std::uint8_t>(prepared, m * ldq, options.stream);
    float* scales = scratch<float>(prepared, ceil_div(k, group_k) * scale_ld, options.stream);
    internal::quantize_activations_on_device(x, group_k, options.activation_scales, q, ldq, scales,
                                             scale_ld, options.stream);
    ops.a = q;
    ops.lda = ldq;
    ops.a_scale = scales;
    ops.a_scale_row_stride = 1;
    ops.a_scale_group_stride = scale_ld;
  }
  Tensor out = Tensor::empty(options.out_dtype, {m, w.n()}, w.device());
  bind_weight_bias_out(prepared, w, bias, out, options.stream);
  tactic.run(ops, prepared.problem);
  return out;
}

Fp8BlockTensor quantize_activations(const TensorView& x, std::int64_t group_k, ScaleMode mode,
                                    void* stream) {
  require_rank(x, "x", 2);
  require_dtype(x, "x", DType::kBF16);
  require_contiguous(x, "x");
  if (group_k < 1)
    fail_argument(ErrorCode::kInvalidArgument, "group_k", "a positive size", group_k);
  if (x.device().is_cpu()) return quantize_fp8_groups(x, group_k, mode);
  const mxq::detail::DeviceScope scope(x.device());
  const std::int64_t m = x.size(0);
  const std::int64_t k = x.size(1);
  const std::int64_t groups = ceil_div(k, group_k);
  Fp8BlockTensor out{Tensor::empty(DType::kE4M3, {m, k}, x.device()),
                     Tensor::empty(DType::kF32, {m, groups}, x.device()), BlockShape{1, group_k}};
  if (m == 0 || k == 0) return out;
  const std::shared_ptr<void> group_major =
      internal::stream_ordered_buffer(static_cast<std::size_t>(groups * m) * sizeof(float), stream);
  auto* scales = static_cast<float*>(group_major.get());
  internal::quantize_activations_on_device(
      x, group_k, mode, static_cast<std::uint8_t*>(out.q.data()), k, scales, m, stream);
  // [G, M] -> [M, G]: a transpose whose "rows" are the K-groups.
  internal::transpose_scales_on_device(scales, groups, m, out.scale.data_as<float>(), groups,
                                       stream);
  return out;
}

Tensor linear_reference(const Fp8BlockTensor& x, const BlockFp8Weight& w, const TensorView* bias,
                        DType out_dtype) {
  require_device(x.q, "x.q", Device::cpu());
  require_device(w.q, "weight.q", Device::cpu());
  LinearOptions options;
  options.out_dtype = out_dtype;
  require_rank(x.q, "x.q", 2);
  Tensor out = Tensor::empty(out_dtype, {x.q.shape()[0], w.n()});
  const PreparedLinear prepared = prepare_linear(x, w, bias, out, options);
  cpu::linear_reference(prepared.operands, prepared.problem);
  return out;
}

}  // namespace mxq::linear
