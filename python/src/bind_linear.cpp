// mxq.BlockFp8Linear's core: a block-FP8 weight, the linear op and its dispatch explanation.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>

#include "array_bridge.h"
#include "bindings.h"
#include "block_shape_arg.h"
#include "mxq/linear/dispatch.h"
#include "mxq/linear/linear.h"
#include "mxq/linear/weight.h"
#include "mxq/tune/autotuner.h"
#include "mxq/tune/problem.h"

namespace mxq::python {
namespace {

using linear::BlockFp8Weight;

Tensor copy_to_tensor(const TensorView& view, DType dtype) {
  Tensor out = Tensor::empty(dtype, view.shape());
  std::memcpy(out.data(), view.data(), view.nbytes());
  return out;
}

DType out_dtype_arg(const std::string& text) {
  if (text == "bf16" || text == "bfloat16") return DType::kBF16;
  if (text == "f32" || text == "float32") return DType::kF32;
  fail_argument(ErrorCode::kInvalidArgument, "out_dtype", "\"bf16\" or \"f32\"",
                "\"" + text + "\"");
}

linear::LinearOptions options_arg(const std::string& tactic, const std::string& activation_scales,
                                  const std::string& out_dtype, std::uintptr_t stream = 0) {
  linear::LinearOptions options;
  options.tactic = tactic;
  options.activation_scales = parse_scale_mode(activation_scales, "activation_scales");
  options.out_dtype = out_dtype_arg(out_dtype);
  options.stream = stream_arg(stream);
  return options;
}

// Host or CUDA arrays (the op runs where its operands are).
constexpr bool kAnyDevice = false;

std::optional<ArrayArg> optional_bias(nb::handle bias) {
  if (bias.is_none()) return std::nullopt;
  return array_arg(bias, "bias", {{DType::kBF16, DType::kF32}, 1, true, kAnyDevice});
}

// The workspace of a linear_into call that needs `bytes`: none when 0 (not read); else
// `workspace` itself, or what it returns for `bytes` when callable (e.g. a torch.empty on the
// device: the framework's allocator provides it, mxq allocates nothing).
std::optional<ArrayArg> workspace_arg(nb::handle workspace, std::size_t bytes) {
  if (bytes == 0 || workspace.is_none()) return std::nullopt;
  nb::object array = nb::borrow(workspace);
  if (PyCallable_Check(workspace.ptr()) != 0) array = workspace(bytes);
  return array_arg(array, "workspace", {{DType::kU8}, 1, true, kAnyDevice});
}

struct IntoArgs {
  std::string tactic;
  std::string activation_scales;
  std::uintptr_t stream = 0;
  const tune::Autotuner* tuner = nullptr;
  const tune::Problem* tune_problem = nullptr;
  bool report = false;
};

// Runs `call` (a linear_into) with the GIL released; the tactic it ran when asked.
template <typename Call>
nb::object run_into(const IntoArgs& args, const Call& call) {
  linear::LinearOptions options =
      options_arg(args.tactic, args.activation_scales, "bf16", args.stream);
  linear::LinearRun ran;
  options.tuner = args.tuner;
  options.tune_problem = args.tune_problem;
  options.ran = &ran;
  {
    nb::gil_scoped_release release;
    call(options);
  }
  if (!args.report) return nb::none();
  nb::dict run;
  run["tactic"] = ran.tactic != nullptr ? nb::cast(ran.tactic->name()) : nb::none();
  run["from_tuner"] = ran.from_tuner;
  return run;
}

constexpr const char* kIntoDoc =
    "Writes y = x W^T (+ bias) into `out` ([M, N] bf16 or float32, contiguous, on the weight's "
    "device) with mxq::linear::linear_into: temporaries in `workspace` (uint8 [bytes]; or a "
    "callable returning one for a byte count, called only when the call needs one, e.g. "
    "lambda n: torch.empty(n, dtype=torch.uint8, device=...)), CUDA work queued on `stream` (a "
    "cudaStream_t; 0 = default stream), nothing allocated or synchronized. `tuner` / "
    "`tune_problem`: the autotuner to consult with tactic \"auto\" and its block_fp8_linear "
    "problem. report=True returns {tactic, from_tuner}, else None.";

}  // namespace

void bind_linear(nb::module_& m) {
  nb::class_<BlockFp8Weight>(m, "BlockFp8Weight", "mxq::linear::BlockFp8Weight (host)")
      .def_static(
          "load",
          [](const std::string& checkpoint, const std::string& name) {
            linear::WeightOrigin origin;
            BlockFp8Weight w;
            {
              nb::gil_scoped_release release;
              w = linear::load_weight(checkpoint, name, &origin);
            }
            nb::dict o;
            o["file"] = origin.file;
            o["block_from"] = origin.block_from;
            return nb::make_tuple(nb::cast(std::move(w)), o);
          },
          nb::arg("checkpoint"), nb::arg("name"))
      .def_static(
          "from_arrays",
          [](nb::handle q, nb::handle scale, nb::handle block) {
            const ArrayArg qa = array_arg(q, "q", {{DType::kE4M3, DType::kU8}, 2, true, true});
            const ArrayArg sa =
                array_arg(scale, "scale", {{DType::kF32, DType::kI32}, 2, true, true});
            const BlockShape shape = block_shape_arg(block, "block");
            // The weight owns its parts (the C++ Tensor has no borrowed storage): one copy.
            return linear::make_block_fp8_weight(copy_to_tensor(qa.view, DType::kE4M3),
                                                 copy_to_tensor(sa.view, sa.view.dtype()), shape);
          },
          nb::arg("q"), nb::arg("scale"), nb::arg("block"))
      .def_static(
          "borrow",
          [](nb::handle q, nb::handle scale, nb::handle block) {
            const ArrayArg qa =
                array_arg(q, "weight", {{DType::kE4M3, DType::kU8}, 2, true, kAnyDevice});
            const ArrayArg sa =
                array_arg(scale, "weight_scale", {{DType::kF32, DType::kI32}, 2, true, kAnyDevice});
            const BlockShape shape = block_shape_arg(block, "block");
            return linear::make_block_fp8_weight(borrow_tensor(qa, DType::kE4M3, "weight"),
                                                 borrow_tensor(sa, sa.view.dtype(), "weight_scale"),
                                                 shape);
          },
          nb::arg("q"), nb::arg("scale"), nb::arg("block"),
          "A weight over the arrays' memory (host or CUDA), without a copy; it keeps them alive.")
      .def_static(
          "view",
          [](nb::handle q, nb::handle scale, nb::handle block) {
            const ArrayArg qa =
                array_arg(q, "weight", {{DType::kE4M3, DType::kU8}, 2, true, kAnyDevice});
            const ArrayArg sa =
                array_arg(scale, "weight_scale", {{DType::kF32, DType::kI32}, 2, true, kAnyDevice});
            const BlockShape shape = block_shape_arg(block, "block");
            const auto unowned = [](const ArrayArg& a, DType dtype, std::string_view name) {
              const TensorView v(a.view.data(), dtype, a.view.shape(), a.view.strides(),
                                 a.view.device());
              return Tensor::borrow(v, nullptr, name);
            };
            return linear::make_block_fp8_weight(unowned(qa, DType::kE4M3, "weight"),
                                                 unowned(sa, sa.view.dtype(), "weight_scale"),
                                                 shape);
          },
          nb::arg("q"), nb::arg("scale"), nb::arg("block"),
          "As borrow(), but the weight does not keep the arrays alive: for a caller that holds "
          "them as long as it uses the weight (a wrapper cached next to the arrays without a "
          "reference cycle).")
      .def_static(
          "quantize",
          [](nb::handle w, nb::handle block, const std::string& scale_mode) {
            const ArrayArg wa = array_arg(w, "w", {{DType::kF32, DType::kBF16}, 2, true, true});
            const BlockShape shape = block_shape_arg(block, "block");
            const ScaleMode mode = parse_scale_mode(scale_mode, "scale_mode");
            nb::gil_scoped_release release;
            return linear::quantize_weight(wa.view, shape, mode);
          },
          nb::arg("w"), nb::arg("block"), nb::arg("scale_mode") = "fp32")
      .def_prop_ro("n", &BlockFp8Weight::n)
      .def_prop_ro("k", &BlockFp8Weight::k)
      .def_prop_ro("block", [](const BlockFp8Weight& w) { return w.block; })
      .def_prop_ro("scale_layout",
                   [](const BlockFp8Weight& w) { return std::string(to_string(w.scale_layout())); })
      // The parts never change after construction, so read-only views of them are safe while
      // the weight lives (the view keeps it alive).
      .def_prop_ro("q",
                   [](nb::handle self) {
                     return view_as_numpy(nb::cast<const BlockFp8Weight&>(self).q.view(), self);
                   })
      .def_prop_ro("scale",
                   [](nb::handle self) {
                     return view_as_numpy(nb::cast<const BlockFp8Weight&>(self).scale.view(), self);
                   })
      .def_prop_ro("device",
                   [](const BlockFp8Weight& w) {
                     std::ostringstream out;
                     out << w.device();
                     return out.str();
                   })
      .def(
          "to",
          [](const BlockFp8Weight& w, const std::string& device) {
            const Device target = device_arg(device, "device");
            nb::gil_scoped_release release;
            return w.to(target);
          },
          nb::arg("device"), "A copy of the weight on `device` (\"cpu\", \"cuda\", \"cuda:N\").")
      .def("with_fp32_scales", &BlockFp8Weight::with_fp32_scales)
      .def("with_packed_ue8m0_scales", &BlockFp8Weight::with_packed_ue8m0_scales)
      .def(
          "linear",
          [](const BlockFp8Weight& w, nb::handle x, nb::handle bias, const std::string& tactic,
             const std::string& activation_scales, const std::string& out_dtype,
             std::uintptr_t stream, const tune::Autotuner* tuner, bool report) -> nb::object {
            const ArrayArg xa = array_arg(x, "x", {{DType::kBF16}, 2, true, kAnyDevice});
            std::optional<ArrayArg> ba;
            if (!bias.is_none()) {
              ba = array_arg(bias, "bias", {{DType::kBF16, DType::kF32}, 1, true, kAnyDevice});
            }
            linear::LinearOptions options =
                options_arg(tactic, activation_scales, out_dtype, stream);
            linear::LinearRun ran;
            options.tuner = tuner;
            options.ran = &ran;
            Tensor out;
            {
              nb::gil_scoped_release release;
              out = linear::linear(xa.view, w, ba ? &ba->view : nullptr, options);
            }
            nb::object y = to_python(std::move(out));
            if (!report) return y;
            nb::dict run;
            run["tactic"] = ran.tactic != nullptr ? nb::cast(ran.tactic->name()) : nb::none();
            run["from_tuner"] = ran.from_tuner;
            return nb::make_tuple(y, run);
          },
          nb::arg("x"), nb::arg("bias") = nb::none(), nb::arg("tactic") = "auto",
          nb::arg("activation_scales") = "fp32", nb::arg("out_dtype") = "bf16",
          nb::arg("stream") = 0, nb::arg("tuner").none() = nb::none(), nb::arg("report") = false,
          "y [M, N]: a NumPy array for host operands; for CUDA operands a DLPack array (bf16 as "
          "uint16 bits) computed in the order of `stream` (a cudaStream_t; 0 = default stream). "
          "With tactic \"auto\", `tuner` (an Autotuner of the operands' backend) picks the tactic "
          "its cache holds. report=True returns (y, {tactic, from_tuner}).")
      .def(
          "workspace_bytes",
          [](const BlockFp8Weight& w, std::int64_t rows, const std::string& activation_input) {
            return linear::linear_workspace_bytes(
                rows, w, linear::parse_activation_input(activation_input, "activation_input"));
          },
          nb::arg("m"), nb::arg("activation_input") = "bf16",
          "Bytes of workspace linear_into needs for M rows of activations given as "
          "`activation_input` (\"bf16\", \"fp8\", \"fp8-mn-major\", \"fp8-packed-ue8m0\") on "
          "the weight's device (mxq::linear::linear_workspace_bytes).")
      .def(
          "linear_into",
          [](const BlockFp8Weight& w, nb::handle x, nb::handle out, nb::handle workspace,
             nb::handle bias, const std::string& tactic, const std::string& activation_scales,
             std::uintptr_t stream, const tune::Autotuner* tuner, const tune::Problem* tune_problem,
             bool report) -> nb::object {
            const ArrayArg xa = array_arg(x, "x", {{DType::kBF16}, 2, true, kAnyDevice});
            const ArrayArg oa =
                array_arg(out, "out", {{DType::kBF16, DType::kF32}, 2, true, kAnyDevice});
            const std::optional<ArrayArg> ba = optional_bias(bias);
            const std::optional<ArrayArg> wa = workspace_arg(
                workspace,
                linear::linear_workspace_bytes(xa.view.size(0), w, linear::ActivationInput::kBf16));
            return run_into({tactic, activation_scales, stream, tuner, tune_problem, report},
                            [&](const linear::LinearOptions& options) {
                              linear::linear_into(xa.view, w, ba ? &ba->view : nullptr, oa.view,
                                                  wa ? wa->view : TensorView{}, options);
                            });
          },
          nb::arg("x"), nb::arg("out"), nb::arg("workspace").none() = nb::none(),
          nb::arg("bias").none() = nb::none(), nb::arg("tactic") = "auto",
          nb::arg("activation_scales") = "fp32", nb::arg("stream") = 0,
          nb::arg("tuner").none() = nb::none(), nb::arg("tune_problem").none() = nb::none(),
          nb::arg("report") = false, kIntoDoc)
      .def(
          "fp8_linear_into",
          [](const BlockFp8Weight& w, nb::handle x_q, nb::handle x_scale, nb::handle out,
             nb::handle workspace, nb::handle bias, const std::string& tactic,
             const std::string& activation_scales, std::uintptr_t stream,
             const tune::Autotuner* tuner, const tune::Problem* tune_problem,
             bool report) -> nb::object {
            const ArrayArg qa =
                array_arg(x_q, "x_q", {{DType::kE4M3, DType::kU8}, 2, true, kAnyDevice});
            const TensorView q_view(qa.view.data(), DType::kE4M3, qa.view.shape(),
                                    qa.view.strides(), qa.view.device());
            // MN-major scales are a transposed view: not contiguous.
            const ArrayArg sa =
                array_arg(x_scale, "x_scale", {{DType::kF32, DType::kI32}, 2, false, kAnyDevice});
            const ArrayArg oa =
                array_arg(out, "out", {{DType::kBF16, DType::kF32}, 2, true, kAnyDevice});
            const std::optional<ArrayArg> ba = optional_bias(bias);
            const std::optional<ArrayArg> wa = workspace_arg(
                workspace, linear::linear_workspace_bytes(q_view.size(0), w,
                                                          linear::activation_input_of(sa.view)));
            return run_into({tactic, activation_scales, stream, tuner, tune_problem, report},
                            [&](const linear::LinearOptions& options) {
                              linear::linear_into(q_view, sa.view, w, ba ? &ba->view : nullptr,
                                                  oa.view, wa ? wa->view : TensorView{}, options);
                            });
          },
          nb::arg("x_q"), nb::arg("x_scale"), nb::arg("out"),
          nb::arg("workspace").none() = nb::none(), nb::arg("bias").none() = nb::none(),
          nb::arg("tactic") = "auto", nb::arg("activation_scales") = "fp32", nb::arg("stream") = 0,
          nb::arg("tuner").none() = nb::none(), nb::arg("tune_problem").none() = nb::none(),
          nb::arg("report") = false,
          "The pre-quantized form (DeepGEMM's fp8_gemm_nt((x_q, x_scale), (w, w_scale), out)): "
          "x_q e4m3 (or uint8 codes) [M, K], x_scale float32 [M, G] row-major or MN-major "
          "(element (m, g) at m + g * ld, ld >= M a multiple of 4) or int32 packed UE8M0 "
          "[ceil(G/4), round_up(M, 4)]. The rest as linear_into.")
      .def(
          "explain",
          [](const BlockFp8Weight& w, std::int64_t tokens, bool has_bias, const std::string& tactic,
             const std::string& activation_scales, const std::string& out_dtype,
             const tune::Autotuner* tuner) {
            // make_problem reads only the shape, dtype and device of x and bias, never their data;
            // the views point at a placeholder because views with elements and a null pointer
            // are refused as undefined tensors.
            static std::byte placeholder;
            const TensorView x(&placeholder, DType::kBF16, Shape{tokens, w.k()}, w.device());
            const TensorView bias(&placeholder, DType::kF32, Shape{w.n()}, w.device());
            const linear::LinearOptions options = options_arg(tactic, activation_scales, out_dtype);
            const linear::LinearProblem problem =
                linear::make_problem(x, w, has_bias ? &bias : nullptr, options);
            const linear::Explanation e = linear::explain(problem, tactic, tuner);
            nb::dict d;
            d["from_tuner"] = e.from_tuner;
            d["tuner_note"] = e.tuner_note;
            d["problem"] = problem.str();
            d["requested"] = e.requested;
            d["chosen"] = e.chosen ? nb::cast(e.chosen->name()) : nb::none();
            d["chosen_because"] = e.chosen_because;
            nb::list rejected;
            for (const linear::TacticRejection& r : e.rejected) {
              rejected.append(nb::make_tuple(r.tactic, r.reason));
            }
            d["rejected"] = rejected;
            d["text"] = e.str();
            return d;
          },
          nb::arg("m"), nb::arg("has_bias") = false, nb::arg("tactic") = "auto",
          nb::arg("activation_scales") = "fp32", nb::arg("out_dtype") = "bf16",
          nb::arg("tuner").none() = nb::none());

  m.def(
      "quantize_activations",
      [](nb::handle x, std::int64_t group_k, const std::string& scale_mode, std::uintptr_t stream) {
        const ArrayArg xa = array_arg(x, "x", {{DType::kBF16}, 2, true, kAnyDevice});
        const ScaleMode mode = parse_scale_mode(scale_mode, "scale_mode");
        Fp8BlockTensor q;
        {
          nb::gil_scoped_release release;
          q = linear::quantize_activations(xa.view, group_k, mode, stream_arg(stream));
        }
        return nb::make_tuple(to_python(std::move(q.q)), to_python(std::move(q.scale)));
      },
      nb::arg("x"), nb::arg("group_k"), nb::arg("scale_mode") = "fp32", nb::arg("stream") = 0,
      "The linear op's activation quantization of bf16 x [M, K] (host or CUDA): e4m3 codes and "
      "f32 scales [M, ceil(K/group_k)], on x's device in the order of `stream`.");

  m.def(
      "quantize_activations_into",
      [](nb::handle x, std::int64_t group_k, const std::string& scale_mode, nb::handle q,
         nb::handle scale, nb::handle workspace, std::uintptr_t stream) {
        const ArrayArg xa = array_arg(x, "x", {{DType::kBF16}, 2, true, kAnyDevice});
        const ArrayArg qa = array_arg(q, "q", {{DType::kU8, DType::kE4M3}, 2, true, kAnyDevice});
        const ArrayArg sa = array_arg(scale, "scale", {{DType::kF32}, 2, true, kAnyDevice});
        const ArrayArg wa = array_arg(workspace, "workspace", {{DType::kU8}, 1, true, kAnyDevice});
        const ScaleMode mode = parse_scale_mode(scale_mode, "scale_mode");
        // uint8 codes are e4m3 bytes (float8 tensors cross DLPack as uint8).
        const TensorView q_view(qa.view.data(), DType::kE4M3, qa.view.shape(), qa.view.device());
        const nb::gil_scoped_release release;
        linear::quantize_activations_into(xa.view, group_k, mode, q_view, sa.view, wa.view,
                                          stream_arg(stream));
      },
      nb::arg("x"), nb::arg("group_k"), nb::arg("scale_mode"), nb::arg("q"), nb::arg("scale"),
      nb::arg("workspace"), nb::arg("stream") = 0,
      "quantize_activations into the caller's q (e4m3 bytes) and scale, with its workspace.");
  m.def(
      "quantize_activations_workspace_bytes",
      [](std::int64_t rows, std::int64_t k, std::int64_t group_k, bool cuda) {
        return linear::quantize_activations_workspace_bytes(rows, k, group_k,
                                                            cuda ? Device::cuda() : Device::cpu());
      },
      nb::arg("m"), nb::arg("k"), nb::arg("group_k"), nb::arg("cuda"));
}

}  // namespace mxq::python
