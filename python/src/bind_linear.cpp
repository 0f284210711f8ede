// mxq.BlockFp8Linear's core: a block-FP8 weight, the linear op and its dispatch explanation.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <string>

#include "array_bridge.h"
#include "bindings.h"
#include "block_shape_arg.h"
#include "mxq/linear/dispatch.h"
#include "mxq/linear/linear.h"
#include "mxq/linear/weight.h"
#include "mxq/tune/autotuner.h"

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
}

}  // namespace mxq::python
