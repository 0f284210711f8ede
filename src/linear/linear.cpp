#include "mxq/linear/linear.h"

#include <cstdint>
#include <utility>

#include "linear/cpu/block_fp8_linear.h"
#include "linear/device_ops.h"
#include "mxq/core/enum_names.h"
#include "mxq/core/error.h"
#include "mxq/formats/ue8m0_pack.h"
#include "mxq/linear/dispatch.h"

namespace mxq::linear {
namespace {

constexpr EnumNames<ActivationInput, 4> kActivationInputNames{
    {{{ActivationInput::kBf16, "bf16"},
      {ActivationInput::kFp8, "fp8"},
      {ActivationInput::kFp8MnMajor, "fp8-mn-major"},
      {ActivationInput::kFp8PackedUe8m0, "fp8-packed-ue8m0"}}}};

// Parts of the workspace start on this boundary (relative to its base), so a part is as aligned
// as the base (kLinearWorkspaceAlignment) and often more.
constexpr std::size_t kPartAlignment = 256;
// What the CUDA tactics' TMA loads and stores need of a base address.
constexpr std::uintptr_t kCudaOperandAlignment = 16;

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }
std::int64_t round_up(std::int64_t a, std::int64_t b) { return ceil_div(a, b) * b; }

// The activations of one call as the caller gave them.
struct Activations {
  ActivationInput input = ActivationInput::kBf16;
  const TensorView* x = nullptr;        // kBf16
  const TensorView* x_q = nullptr;      // the pre-quantized forms
  const TensorView* x_scale = nullptr;  // the pre-quantized forms
  std::int64_t m = 0;
  std::int64_t k = 0;
  Device device;
};

// Where each temporary of a call sits in its workspace (byte offsets), and the total. One
// function for linear_workspace_bytes and linear_into, so the size a caller is told is the size
// the call uses.
struct WorkspaceLayout {
  static constexpr std::size_t kUnused = SIZE_MAX;
  std::size_t q = kUnused;        // e4m3 [M, q_ld]: quantized bf16 x
  std::int64_t q_ld = 0;          // CUDA: K rounded up to 16 bytes (aligned vector loads, TMA)
  std::size_t a_scale = kUnused;  // f32 activation scales: CUDA [G, a_scale_ld], CPU [M, G]
  std::int64_t a_scale_ld = 0;    // CUDA: M rounded up to 4 (16-byte TMA rows)
  std::size_t w_scale = kUnused;  // f32 [NB, G]: the weight's packed UE8M0 scales unpacked
  std::size_t bytes = 0;
};

WorkspaceLayout workspace_layout(const LinearProblem& p, ActivationInput input) {
  WorkspaceLayout layout;
  const bool cuda = p.device.is_cuda();
  const std::int64_t groups = ceil_div(p.k, p.block.k);
  const auto take = [&](std::int64_t bytes) {
    const std::size_t at = (layout.bytes + kPartAlignment - 1) / kPartAlignment * kPartAlignment;
    layout.bytes = at + static_cast<std::size_t>(bytes);
    return at;
  };
  if (input == ActivationInput::kBf16) {
    layout.q_ld = cuda ? round_up(p.k, 16) : p.k;
    layout.q = take(p.m * layout.q_ld);
  }
  // CPU tactics read activation scales with any strides, so only produced or packed ones need
  // memory there; CUDA tactics read them K-group major, which only MN-major scales already are.
  const bool scales_written = input == ActivationInput::kBf16 ||
                              input == ActivationInput::kFp8PackedUe8m0 ||
                              (cuda && input == ActivationInput::kFp8);
  if (scales_written) {
    layout.a_scale_ld = cuda ? round_up(p.m, 4) : p.m;
    layout.a_scale = take(groups * layout.a_scale_ld * static_cast<std::int64_t>(sizeof(float)));
  }
  if (p.weight_scales == ScaleLayout::kPackedUe8m0) {
    layout.w_scale =
        take(ceil_div(p.n, p.block.n) * groups * static_cast<std::int64_t>(sizeof(float)));
  }
  return layout;
}

void require_out_dtype(DType dtype, std::string_view argument) {
  if (dtype != DType::kBF16 && dtype != DType::kF32) {
    fail_argument(ErrorCode::kDtypeMismatch, argument, "bf16 or f32", dtype);
  }
}

Activations bf16_activations(const TensorView& x) {
  require_rank(x, "x", 2);
  require_dtype(x, "x", DType::kBF16);
  require_contiguous(x, "x");
  Activations a;
  a.input = ActivationInput::kBf16;
  a.x = &x;
  a.m = x.size(0);
  a.k = x.size(1);
  a.device = x.device();
  return a;
}

// x_q and x_scale's dtype, rank, layout and device; the shapes that need the weight come later.
Activations fp8_activations(const TensorView& x_q, const TensorView& x_scale) {
  require_rank(x_q, "x_q", 2);
  require_dtype(x_q, "x_q", DType::kE4M3);
  require_contiguous(x_q, "x_q");
  Activations a;
  a.input = activation_input_of(x_scale);
  a.x_q = &x_q;
  a.x_scale = &x_scale;
  a.m = x_q.size(0);
  a.k = x_q.size(1);
  a.device = x_q.device();
  require_device(x_scale, "x_scale", a.device);
  return a;
}

void check_fp8_scale_shape(const Activations& a, const BlockFp8Weight& w) {
  const std::int64_t groups = ceil_div(a.k, w.block.k);
  const std::string per_group = detail::concat(" (one per 1x", w.block.k, " group of x_q ",
                                               a.x_q->shape(), ", the weight block's K extent)");
  if (a.input == ActivationInput::kFp8PackedUe8m0) {
    const Shape packed{ceil_div(groups, 4), round_up(a.m, 4)};
    if (!(a.x_scale->shape() == packed)) {
      fail_argument(ErrorCode::kShapeMismatch, "x_scale",
                    detail::concat("packed UE8M0 i32 ", packed, " for ", a.m, "x", groups,
                                   " scales", per_group),
                    detail::concat("i32 ", a.x_scale->shape()));
    }
  } else if (!(a.x_scale->shape() == Shape{a.m, groups})) {
    fail_argument(ErrorCode::kShapeMismatch, "x_scale",
                  detail::concat("f32 ", Shape{a.m, groups}, per_group),
                  detail::concat("f32 ", a.x_scale->shape()));
  }
}

LinearProblem problem_for(std::int64_t m, const BlockFp8Weight& w, const TensorView* bias,
                          ScaleMode activation_scales, DType out_dtype) {
  LinearProblem problem;
  problem.m = m;
  problem.n = w.n();
  problem.k = w.k();
  problem.block = w.block;
  problem.weight_scales = w.scale_layout();
  problem.activation_scales = activation_scales;
  problem.out_dtype = out_dtype;
  problem.has_bias = bias != nullptr;
  describe_device(problem, w.device());
  return problem;
}

// Checks the weight, the activations against it, the bias and (when given) the output, and
// returns the call's problem with the output dtype `out_dtype`.
LinearProblem check_call(const Activations& a, const BlockFp8Weight& w, const TensorView* bias,
                         const TensorView* out, DType out_dtype, ScaleMode activation_scales,
                         bool allow_empty) {
  w.validate("weight");
  if (!allow_empty && a.m < 1) {
    fail_argument(ErrorCode::kShapeMismatch, a.x != nullptr ? "x" : "x_q",
                  "at least one row (M >= 1)", a.m);
  }
  if (a.k != w.k()) {
    fail_argument(ErrorCode::kShapeMismatch, a.x != nullptr ? "x" : "x_q",
                  detail::concat("K = ", w.k(), " columns (the weight is ", w.q.shape(), ")"),
                  detail::concat(a.k, " columns"));
  }
  if (a.device != w.device()) {
    fail(ErrorCode::kDeviceMismatch, a.x != nullptr ? "x" : "x_q", " is on ", a.device,
         " but the weight is on ", w.device());
  }
  if (a.x_scale != nullptr) check_fp8_scale_shape(a, w);
  if (bias != nullptr) {
    if (bias->dtype() != DType::kBF16 && bias->dtype() != DType::kF32) {
      fail_argument(ErrorCode::kDtypeMismatch, "bias", "bf16 or f32", bias->dtype());
    }
    require_shape(*bias, "bias", Shape{w.n()});
    require_contiguous(*bias, "bias");
    require_device(*bias, "bias", w.device());
  }
  if (out != nullptr) {
    require_rank(*out, "out", 2);
    require_out_dtype(out->dtype(), "out");
    require_shape(*out, "out", Shape{a.m, w.n()});
    require_contiguous(*out, "out");
    require_device(*out, "out", w.device());
    out_dtype = out->dtype();
  }
  require_out_dtype(out_dtype, "options.out_dtype");
  if (w.device().is_cuda()) {
    // The wgmma tactics read and write these through TMA; the CUDA allocators' (and torch's)
    // tensors always are aligned, a view at an odd offset may not be.
    constexpr std::string_view kTma = "TMA";
    require_aligned(w.q.data(), "weight.q", kCudaOperandAlignment, kTma);
    if (a.x_q != nullptr) require_aligned(a.x_q->data(), "x_q", kCudaOperandAlignment, kTma);
    if (out != nullptr) require_aligned(out->data(), "out", kCudaOperandAlignment, kTma);
  }
  const ScaleMode mode =
      a.input == ActivationInput::kFp8PackedUe8m0 ? ScaleMode::kUe8m0 : activation_scales;
  return problem_for(a.m, w, bias, mode, out_dtype);
}

void check_workspace(const TensorView& workspace, const WorkspaceLayout& layout,
                     const LinearProblem& p, ActivationInput input) {
  if (layout.bytes == 0) return;  // not read
  const std::string needed =
      detail::concat("at least ", layout.bytes, " bytes (linear_workspace_bytes for M = ", p.m,
                     ", ", to_string(input), " activations, ", to_string(p.weight_scales),
                     " weight scales, on ", p.device, ")");
  if (workspace.data() == nullptr) {
    fail_argument(ErrorCode::kInvalidArgument, "workspace", needed, "none (a null pointer)");
  }
  require_dtype(workspace, "workspace", DType::kU8);
  require_rank(workspace, "workspace", 1);
  require_contiguous(workspace, "workspace");
  require_device(workspace, "workspace", p.device);
  if (workspace.nbytes() < layout.bytes) {
    fail_argument(ErrorCode::kShapeMismatch, "workspace", needed,
                  detail::concat(workspace.nbytes(), " bytes"));
  }
  require_aligned(workspace.data(), "workspace", kLinearWorkspaceAlignment,
                  "kLinearWorkspaceAlignment");
}

// Binds the operands of a checked call and brings the activations and the weight's scales into
// the layout the tactics read, writing only into `workspace` (laid out by `layout`): on CUDA
// kernels queued on `stream`, on the CPU host loops.
LinearOperands bind_operands(const Activations& a, const LinearProblem& p, const BlockFp8Weight& w,
                             const TensorView* bias, void* out, std::byte* workspace,
                             const WorkspaceLayout& layout, void* stream) {
  const bool cuda = p.device.is_cuda();
  const std::int64_t m = p.m;
  const std::int64_t groups = ceil_div(p.k, p.block.k);
  const auto part = [&](std::size_t offset) { return workspace + offset; };
  LinearOperands ops;
  float* a_scale = layout.a_scale == WorkspaceLayout::kUnused
                       ? nullptr
                       : reinterpret_cast<float*>(part(layout.a_scale));
  // CUDA tactics read activation scales K-group major [G, ld]; the CPU's written ones are [M, G].
  const auto bind_written_scales = [&] {
    ops.a_scale = a_scale;
    ops.a_scale_row_stride = cuda ? 1 : groups;
    ops.a_scale_group_stride = cuda ? layout.a_scale_ld : 1;
  };
  switch (a.input) {
    case ActivationInput::kBf16: {
      auto* q = reinterpret_cast<std::uint8_t*>(part(layout.q));
      if (cuda) {
        internal::quantize_activations_on_device(*a.x, p.block.k, p.activation_scales, q,
                                                 layout.q_ld, a_scale, layout.a_scale_ld, stream);
      } else {
        quantize_fp8_block_into(*a.x, BlockShape{1, p.block.k}, p.activation_scales,
                                TensorView(q, DType::kE4M3, Shape{m, p.k}),
                                TensorView(a_scale, DType::kF32, Shape{m, groups}));
      }
      ops.a = q;
      ops.lda = layout.q_ld;
      bind_written_scales();
      break;
    }
    case ActivationInput::kFp8:
      if (cuda) {
        internal::transpose_scales_on_device(
            static_cast<const float*>(a.x_scale->data()), m, groups, a.x_scale->strides()[0],
            a.x_scale->strides()[1], a_scale, layout.a_scale_ld, stream);
        bind_written_scales();
      } else {  // the CPU tactics read any strides
        ops.a_scale = static_cast<const float*>(a.x_scale->data());
        ops.a_scale_row_stride = a.x_scale->strides()[0];
        ops.a_scale_group_stride = a.x_scale->strides()[1];
      }
      break;
    case ActivationInput::kFp8MnMajor:
      ops.a_scale = static_cast<const float*>(a.x_scale->data());
      ops.a_scale_row_stride = 1;
      // One group: its stride is never used; the TMA map still wants 16-byte rows.
      ops.a_scale_group_stride = groups == 1 ? round_up(m, 4) : a.x_scale->strides()[1];
      break;
    case ActivationInput::kFp8PackedUe8m0:
      if (cuda) {
        internal::unpack_ue8m0_on_device(*a.x_scale, m, groups, a_scale, layout.a_scale_ld, 1,
                                         layout.a_scale_ld, stream);
      } else {
        unpack_ue8m0_into(*a.x_scale, m, groups,
                          TensorView(a_scale, DType::kF32, Shape{m, groups}));
      }
      bind_written_scales();
      break;
  }
  if (a.x_q != nullptr) {
    ops.a = static_cast<const std::uint8_t*>(a.x_q->data());
    ops.lda = p.k;
  }

  ops.w = static_cast<const std::uint8_t*>(w.q.data());
  ops.ldw = p.k;
  if (w.scale_layout() == ScaleLayout::kFp32) {
    ops.w_scale = w.scale.data_as<float>();
  } else {
    auto* unpacked = reinterpret_cast<float*>(part(layout.w_scale));
    const std::int64_t row_blocks = w.row_blocks();
    if (cuda) {
      internal::unpack_ue8m0_on_device(w.scale, row_blocks, groups, unpacked, row_blocks, groups, 1,
                                       stream);
    } else {
      unpack_ue8m0_into(w.scale, row_blocks, groups,
                        TensorView(unpacked, DType::kF32, Shape{row_blocks, groups}));
    }
    ops.w_scale = unpacked;
  }
  ops.w_scale_ld = groups;
  if (bias != nullptr) {
    ops.bias = bias->data();
    ops.bias_dtype = bias->dtype();
  }
  ops.out = out;
  ops.ldo = p.n;
  ops.stream = stream;
  return ops;
}

// The tactic to run (dispatch, with the options' autotuner), reported in options.ran.
const LinearTactic& choose_tactic(const LinearProblem& problem, const LinearOptions& options) {
  bool from_tuner = false;
  const LinearTactic& tactic =
      select_tactic(problem, options.tactic, options.tuner, options.tune_problem, &from_tuner);
  if (options.ran != nullptr) *options.ran = {&tactic, from_tuner};
  return tactic;
}

// linear_into after the argument checks: chooses the tactic (an unsupported problem fails here,
// before any kernel runs), converts into the workspace and runs.
void run_checked(const Activations& a, const LinearProblem& p, const BlockFp8Weight& w,
                 const TensorView* bias, const TensorView& out, const TensorView& workspace,
                 const WorkspaceLayout& layout, const LinearOptions& options) {
  if (p.m == 0) return;
  const mxq::detail::DeviceScope scope(w.device());
  const LinearTactic& tactic = choose_tactic(p, options);
  const LinearOperands ops = bind_operands(
      a, p, w, bias, out.data(), static_cast<std::byte*>(workspace.data()), layout, options.stream);
  tactic.run(ops, p);
}

// Memory for a convenience call's workspace, kept alive by `storage`: host memory on the CPU,
// stream-ordered device memory on a GPU (released after the kernels queued before its release).
TensorView allocate_workspace(std::size_t bytes, Device device, void* stream,
                              std::vector<std::shared_ptr<void>>& storage) {
  if (bytes == 0) return {};
  const auto count = static_cast<std::int64_t>(bytes);
  if (device.is_cpu()) {
    auto tensor = std::make_shared<Tensor>(Tensor::empty(DType::kU8, {count}));
    storage.push_back(tensor);
    return tensor->view();
  }
  const mxq::detail::DeviceScope scope(device);
  storage.push_back(internal::stream_ordered_buffer(bytes, stream));
  return {storage.back().get(), DType::kU8, Shape{count}, device};
}

}  // namespace

std::string_view to_string(ActivationInput input) { return kActivationInputNames.name(input); }

ActivationInput parse_activation_input(std::string_view text, std::string_view argument) {
  return kActivationInputNames.parse(text, argument);
}

ActivationInput activation_input_of(const TensorView& x_scale) {
  if (x_scale.dtype() == DType::kI32) return ActivationInput::kFp8PackedUe8m0;
  if (x_scale.dtype() != DType::kF32) {
    fail_argument(ErrorCode::kDtypeMismatch, "x_scale", "f32 scales or i32 packed UE8M0 scales",
                  x_scale.dtype());
  }
  require_rank(x_scale, "x_scale", 2);
  const std::int64_t m = x_scale.size(0);
  const std::int64_t groups = x_scale.size(1);
  const std::int64_t ld = x_scale.strides()[1];
  const bool rows_adjacent = m == 1 || x_scale.strides()[0] == 1;
  // What the wgmma tactics' TMA reads in place: 16-byte aligned K-group rows.
  const bool tma_rows = groups == 1 || (ld >= m && ld % 4 == 0);
  const bool aligned =
      reinterpret_cast<std::uintptr_t>(x_scale.data()) % kCudaOperandAlignment == 0;
  return rows_adjacent && tma_rows && aligned ? ActivationInput::kFp8MnMajor
                                              : ActivationInput::kFp8;
}

std::size_t linear_workspace_bytes(const LinearProblem& problem, ActivationInput input) {
  if (problem.m < 0 || problem.n < 1 || problem.k < 1 || problem.block.n < 1 ||
      problem.block.k < 1) {
    fail_argument(ErrorCode::kShapeMismatch, "linear_workspace_bytes: problem",
                  "M >= 0 and N, K and the block's extents >= 1", problem.str());
  }
  return workspace_layout(problem, input).bytes;
}

std::size_t linear_workspace_bytes(std::int64_t m, const BlockFp8Weight& w, ActivationInput input) {
  w.validate("weight");
  LinearProblem problem;
  problem.m = m;
  problem.n = w.n();
  problem.k = w.k();
  problem.block = w.block;
  problem.weight_scales = w.scale_layout();
  problem.device = w.device();  // the kind of device is all the size depends on
  return linear_workspace_bytes(problem, input);
}

void linear_into(const TensorView& x, const BlockFp8Weight& w, const TensorView* bias,
                 const TensorView& out, const TensorView& workspace, const LinearOptions& options) {
  const Activations a = bf16_activations(x);
  const LinearProblem p = check_call(a, w, bias, &out, out.dtype(), options.activation_scales,
                                     /*allow_empty=*/true);
  const WorkspaceLayout layout = workspace_layout(p, a.input);
  check_workspace(workspace, layout, p, a.input);
  run_checked(a, p, w, bias, out, workspace, layout, options);
}

void linear_into(const TensorView& x_q, const TensorView& x_scale, const BlockFp8Weight& w,
                 const TensorView* bias, const TensorView& out, const TensorView& workspace,
                 const LinearOptions& options) {
  const Activations a = fp8_activations(x_q, x_scale);
  const LinearProblem p = check_call(a, w, bias, &out, out.dtype(), options.activation_scales,
                                     /*allow_empty=*/true);
  const WorkspaceLayout layout = workspace_layout(p, a.input);
  check_workspace(workspace, layout, p, a.input);
  run_checked(a, p, w, bias, out, workspace, layout, options);
}

LinearProblem make_problem(const TensorView& x, const BlockFp8Weight& w, const TensorView* bias,
                           const LinearOptions& options) {
  return check_call(bf16_activations(x), w, bias, nullptr, options.out_dtype,
                    options.activation_scales, /*allow_empty=*/false);
}

namespace {

void check_groups(const Fp8BlockTensor& x, const BlockFp8Weight& w) {
  if (!(x.block == BlockShape{1, w.block.k})) {
    fail_argument(ErrorCode::kInvalidArgument, "x.block",
                  detail::concat("1x", w.block.k, " (the weight block's K extent)"),
                  to_string(x.block));
  }
}

// The convenience calls: check (M >= 1), allocate the output and the workspace, run linear_into's
// path.
Tensor linear_allocating(const Activations& a, const BlockFp8Weight& w, const TensorView* bias,
                         const LinearOptions& options) {
  const LinearProblem checked = check_call(a, w, bias, nullptr, options.out_dtype,
                                           options.activation_scales, /*allow_empty=*/false);
  Tensor out = Tensor::empty(options.out_dtype, {a.m, w.n()}, w.device());
  std::vector<std::shared_ptr<void>> storage;
  const TensorView workspace = allocate_workspace(linear_workspace_bytes(checked, a.input),
                                                  w.device(), options.stream, storage);
  if (a.x != nullptr) {
    linear_into(*a.x, w, bias, out, workspace, options);
  } else {
    linear_into(*a.x_q, *a.x_scale, w, bias, out, workspace, options);
  }
  return out;
}

}  // namespace

Tensor linear(const Fp8BlockTensor& x, const BlockFp8Weight& w, const TensorView* bias,
              const LinearOptions& options) {
  const Activations a = fp8_activations(x.q, x.scale);
  check_groups(x, w);
  return linear_allocating(a, w, bias, options);
}

Tensor linear(const TensorView& x, const BlockFp8Weight& w, const TensorView* bias,
              const LinearOptions& options) {
  return linear_allocating(bf16_activations(x), w, bias, options);
}

PreparedLinear prepare_linear(const Fp8BlockTensor& x, const BlockFp8Weight& w,
                              const TensorView* bias, const TensorView& out,
                              const LinearOptions& options) {
  const Activations a = fp8_activations(x.q, x.scale);
  check_groups(x, w);
  PreparedLinear prepared;
  prepared.problem = check_call(a, w, bias, &out, out.dtype(), options.activation_scales,
                                /*allow_empty=*/false);
  const WorkspaceLayout layout = workspace_layout(prepared.problem, a.input);
  const TensorView workspace =
      allocate_workspace(layout.bytes, w.device(), options.stream, prepared.storage);
  const mxq::detail::DeviceScope scope(w.device());
  prepared.operands =
      bind_operands(a, prepared.problem, w, bias, out.data(),
                    static_cast<std::byte*>(workspace.data()), layout, options.stream);
  return prepared;
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
  Fp8BlockTensor out{Tensor::empty(DType::kE4M3, {m, k}, x.device()),
                     Tensor::empty(DType::kF32, {m, ceil_div(k, group_k)}, x.device()),
                     BlockShape{1, group_k}};
  const std::size_t bytes = quantize_activations_workspace_bytes(m, k, group_k, x.device());
  const std::shared_ptr<void> workspace = internal::stream_ordered_buffer(bytes, stream);
  quantize_activations_into(
      x, group_k, mode, out.q, out.scale,
      TensorView(workspace.get(), DType::kU8, {static_cast<std::int64_t>(bytes)}, x.device()),
      stream);
  return out;
}

std::size_t quantize_activations_workspace_bytes(std::int64_t m, std::int64_t k,
                                                 std::int64_t group_k, Device device) {
  if (group_k < 1)
    fail_argument(ErrorCode::kInvalidArgument, "group_k", "a positive size", group_k);
  if (device.is_cpu() || m <= 0 || k <= 0) return 0;
  return static_cast<std::size_t>(ceil_div(k, group_k) * m) * sizeof(float);
}

void quantize_activations_into(const TensorView& x, std::int64_t group_k, ScaleMode mode,
                               const TensorView& q, const TensorView& scale,
                               const TensorView& workspace, void* stream) {
  require_rank(x, "x", 2);
  require_dtype(x, "x", DType::kBF16);
  require_contiguous(x, "x");
  const std::int64_t m = x.size(0);
  const std::int64_t k = x.size(1);
  const std::size_t needed = quantize_activations_workspace_bytes(m, k, group_k, x.device());
  const std::int64_t groups = ceil_div(k, group_k);
  require_shape(q, "q", {m, k});
  require_dtype(q, "q", DType::kE4M3);
  require_shape(scale, "scale", {m, groups});
  require_dtype(scale, "scale", DType::kF32);
  for (const auto& [t, name] : {std::pair{&q, "q"}, std::pair{&scale, "scale"}}) {
    require_device(*t, name, x.device());
    require_contiguous(*t, name);
  }
  if (x.device().is_cpu()) {
    quantize_fp8_block_into(x, BlockShape{1, group_k}, mode, q, scale);
    return;
  }
  if (workspace.nbytes() < needed) {
    fail_argument(ErrorCode::kInvalidArgument, "workspace",
                  detail::concat("at least ", needed, " bytes"),
                  detail::concat(workspace.nbytes(), " bytes"));
  }
  if (needed > 0) require_device(workspace, "workspace", x.device());
  if (reinterpret_cast<std::uintptr_t>(workspace.data()) % 16 != 0) {
    fail_argument(ErrorCode::kInvalidArgument, "workspace", "a 16-byte aligned address",
                  "a misaligned one");
  }
  if (m == 0 || k == 0) return;
  const mxq::detail::DeviceScope scope(x.device());
  auto* scales = static_cast<float*>(workspace.data());
  internal::quantize_activations_on_device(x, group_k, mode, static_cast<std::uint8_t*>(q.data()),
                                           k, scales, m, stream);
  internal::transpose_scales_on_device(scales, groups, m, m, 1, static_cast<float*>(scale.data()),
                                       groups, stream);
}

Tensor linear_reference(const Fp8BlockTensor& x, const BlockFp8Weight& w, const TensorView* bias,
                        DType out_dtype) {
  require_device(x.q, "x.q", Device::cpu());
  require_device(w.q, "weight.q", Device::cpu());
  require_rank(x.q, "x.q", 2);
  Tensor out = Tensor::empty(out_dtype, {x.q.shape()[0], w.n()});
  const PreparedLinear prepared = prepare_linear(x, w, bias, out);
  cpu::linear_reference(prepared.operands, prepared.problem);
  return out;
}

}  // namespace mxq::linear
