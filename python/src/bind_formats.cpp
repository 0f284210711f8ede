// mxq.formats: the codecs (E2M1, E4M3, E8M0), MXFP4, block-FP8 and packed UE8M0.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <string>

#include "array_bridge.h"
#include "bindings.h"
#include "block_shape_arg.h"
#include "mxq/core/error.h"
#include "mxq/formats/e2m1.h"
#include "mxq/formats/e4m3.h"
#include "mxq/formats/e8m0.h"
#include "mxq/formats/fp8_block.h"
#include "mxq/formats/mxfp4.h"
#include "mxq/formats/ue8m0_pack.h"

namespace mxq::python {
namespace {

const ArrayRequirements kFloatInput{{DType::kF32, DType::kBF16}, -1, true, true};

// Applies `code_of(value)` to every f32 element of `x`, into a new tensor of `out_dtype`.
template <typename Fn>
nb::object map_f32_to_codes(nb::handle x, const char* argument, DType out_dtype, Fn code_of) {
  const ArrayArg in = array_arg(x, argument, {{DType::kF32}, -1, true, true});
  Tensor out = Tensor::empty(out_dtype, in.view.shape());
  {
    nb::gil_scoped_release release;
    const float* src = static_cast<const float*>(in.view.data());
    auto* dst = static_cast<std::uint8_t*>(out.data());
    for (std::int64_t i = 0; i < in.view.numel(); ++i) dst[i] = code_of(src[i]);
  }
  return to_numpy(std::move(out));
}

template <typename Fn>
nb::object map_codes_to_f32(nb::handle codes, const char* argument, DType code_dtype, Fn value_of) {
  const ArrayArg in = array_arg(codes, argument, {{DType::kU8, code_dtype}, -1, true, true});
  Tensor out = Tensor::empty(DType::kF32, in.view.shape());
  {
    nb::gil_scoped_release release;
    const auto* src = static_cast<const std::uint8_t*>(in.view.data());
    float* dst = out.data_as<float>();
    for (std::int64_t i = 0; i < in.view.numel(); ++i) dst[i] = value_of(src[i]);
  }
  return to_numpy(std::move(out));
}

ScaleMode scale_mode_arg(const std::string& text) { return parse_scale_mode(text, "scale_mode"); }

}  // namespace

std::optional<BlockShape> try_block_shape(nb::handle value) {
  if (nb::isinstance<BlockShape>(value)) return nb::cast<BlockShape>(value);
  if (nb::isinstance<nb::str>(value)) {
    return parse_block_shape(nb::cast<std::string>(value), "block");
  }
  if (nb::isinstance<nb::sequence>(value) && nb::len(value) == 2) {
    // Integers of any kind (int, numpy.int64, ...: anything with __index__), never floats.
    std::int64_t extents[2] = {0, 0};
    for (int i = 0; i < 2; ++i) {
      nb::object item = value[i];
      if (PyFloat_Check(item.ptr())) return std::nullopt;
      PyObject* index = PyNumber_Index(item.ptr());
      if (index == nullptr) {
        PyErr_Clear();
        return std::nullopt;
      }
      extents[i] = PyLong_AsLongLong(index);
      Py_DECREF(index);
      if (PyErr_Occurred()) {
        PyErr_Clear();
        return std::nullopt;
      }
    }
    if (extents[0] < 1 || extents[1] < 1) {
      fail_argument(ErrorCode::kInvalidArgument, "block", "two positive extents (n, k)",
                    detail::concat("(", extents[0], ", ", extents[1], ")"));
    }
    return BlockShape{extents[0], extents[1]};
  }
  return std::nullopt;
}

BlockShape block_shape_arg(nb::handle value, std::string_view argument) {
  if (auto block = try_block_shape(value)) return *block;
  fail(ErrorCode::kDtypeMismatch, argument,
       ": expected a BlockShape, a (n, k) tuple or [n, k] list of positive integers, or a string "
       "like \"128x128\"; found ",
       nb::cast<std::string>(nb::repr(value)));
}

void bind_formats(nb::module_& m) {
  nb::class_<BlockShape>(m, "BlockShape",
                         "A block shape (n rows x k columns), compared as a value: "
                         "BlockShape(128, 128) == (128, 128) == [128, 128].")
      .def(nb::init<>())
      .def(
          "__init__",
          [](BlockShape* self, std::int64_t n, std::int64_t k) {
            if (n < 1 || k < 1) {
              fail_argument(ErrorCode::kInvalidArgument, "BlockShape", "positive extents",
                            detail::concat(n, "x", k));
            }
            new (self) BlockShape{n, k};
          },
          nb::arg("n"), nb::arg("k"))
      .def_ro("n", &BlockShape::n, "rows (the N / M axis)")
      .def_ro("k", &BlockShape::k, "columns (the K axis)")
      .def_static(
          "parse", [](nb::handle value) { return block_shape_arg(value, "block"); },
          nb::arg("value"), "A BlockShape from a BlockShape, (n, k), [n, k] or \"NxK\".")
      .def(
          "__eq__",
          [](const BlockShape& self, nb::handle other) -> nb::object {
            std::optional<BlockShape> value;
            try {
              value = try_block_shape(other);
            } catch (const Error&) {
              return nb::bool_(false);
            }
            if (!value) return nb::borrow(Py_NotImplemented);
            return nb::bool_(self == *value);
          },
          nb::arg("other").none())
      .def("__hash__",
           [](const BlockShape& self) { return nb::hash(nb::make_tuple(self.n, self.k)); })
      .def("__iter__",
           [](const BlockShape& self) { return nb::iter(nb::make_tuple(self.n, self.k)); })
      .def("__str__", [](const BlockShape& self) { return to_string(self); })
      .def("__repr__", [](const BlockShape& self) {
        return "BlockShape(" + std::to_string(self.n) + ", " + std::to_string(self.k) + ")";
      });

  m.def(
      "e2m1_encode",
      [](nb::handle x) {
        return map_f32_to_codes(x, "x", DType::kU8, [](float v) { return float_to_e2m1(v); });
      },
      nb::arg("x"));
  m.def(
      "e2m1_decode",
      [](nb::handle codes) {
        const ArrayArg in = array_arg(codes, "codes", {{DType::kU8}, -1, true, true});
        const auto* src = static_cast<const std::uint8_t*>(in.view.data());
        for (std::int64_t i = 0; i < in.view.numel(); ++i) {
          if (src[i] > 15) {
            fail_argument(ErrorCode::kOutOfRange, "codes", "E2M1 codes in [0, 15]",
                          detail::concat(int(src[i]), " at flat index ", i));
          }
        }
        return map_codes_to_f32(codes, "codes", DType::kU8,
                                [](std::uint8_t c) { return e2m1_to_float(c); });
      },
      nb::arg("codes"));
  m.def(
      "e4m3_encode",
      [](nb::handle x, bool saturate) {
        const Fp8Saturation mode = saturate ? Fp8Saturation::kSatFinite : Fp8Saturation::kNoSat;
        return map_f32_to_codes(x, "x", DType::kE4M3,
                                [mode](float v) { return float_to_e4m3(v, mode); });
      },
      nb::arg("x"), nb::arg("saturate") = true);
  m.def(
      "e4m3_decode",
      [](nb::handle codes) {
        return map_codes_to_f32(codes, "codes", DType::kE4M3,
                                [](std::uint8_t c) { return e4m3_to_float(c); });
      },
      nb::arg("codes"));
  m.def(
      "e8m0_encode",
      [](nb::handle x, const std::string& rounding) {
        E8m0Rounding mode = E8m0Rounding::kFloor;
        if (rounding == "ceil") {
          mode = E8m0Rounding::kCeil;
        } else if (rounding != "floor") {
          fail_argument(ErrorCode::kInvalidArgument, "rounding", "\"floor\" or \"ceil\"",
                        "\"" + rounding + "\"");
        }
        return map_f32_to_codes(x, "x", DType::kE8M0,
                                [mode](float v) { return float_to_e8m0(v, mode); });
      },
      nb::arg("x"), nb::arg("rounding") = "floor");
  m.def(
      "e8m0_decode",
      [](nb::handle codes) {
        return map_codes_to_f32(codes, "codes", DType::kE8M0,
                                [](std::uint8_t c) { return e8m0_to_float(c); });
      },
      nb::arg("codes"));

  m.def(
      "quantize_mxfp4",
      [](nb::handle x, const std::string& scale_rule) {
        const ArrayArg in = array_arg(x, "x", kFloatInput);
        const ScaleRule rule = parse_scale_rule(scale_rule, "scale_rule");
        Mxfp4Tensor q;
        {
          nb::gil_scoped_release release;
          q = quantize_mxfp4(in.view, rule);
        }
        return nb::make_tuple(to_numpy(std::move(q.blocks)), to_numpy(std::move(q.scales)));
      },
      nb::arg("x"), nb::arg("scale_rule") = "floor");
  m.def(
      "dequantize_mxfp4",
      [](nb::handle blocks, nb::handle scales) {
        const ArrayArg b =
            array_arg(blocks, "blocks", {{DType::kU8, DType::kE2M1x2}, -1, true, true});
        const ArrayArg s =
            array_arg(scales, "scales", {{DType::kE8M0, DType::kU8}, -1, true, true});
        Tensor out;
        {
          nb::gil_scoped_release release;
          out = dequantize_mxfp4(b.view, s.view);
        }
        return to_numpy(std::move(out));
      },
      nb::arg("blocks"), nb::arg("scales"));

  m.def(
      "quantize_fp8_block",
      [](nb::handle x, nb::handle block, const std::string& scale_mode) {
        const ArrayArg in = array_arg(x, "x", {{DType::kF32, DType::kBF16}, 2, true, true});
        const BlockShape shape = block_shape_arg(block, "block");
        const ScaleMode mode = scale_mode_arg(scale_mode);
        Fp8BlockTensor q;
        {
          nb::gil_scoped_release release;
          q = quantize_fp8_block(in.view, shape, mode);
        }
        return nb::make_tuple(to_numpy(std::move(q.q)), to_numpy(std::move(q.scale)));
      },
      nb::arg("x"), nb::arg("block"), nb::arg("scale_mode") = "fp32");
  m.def(
      "dequantize_fp8_block",
      [](nb::handle q, nb::handle scale, nb::handle block) {
        const ArrayArg qa = array_arg(q, "q", {{DType::kE4M3, DType::kU8}, 2, true, true});
        const ArrayArg sa = array_arg(scale, "scale", {{DType::kF32}, 2, true, true});
        const BlockShape shape = block_shape_arg(block, "block");
        // The C++ API takes e4m3: a uint8 array of E4M3 codes is read as such.
        const TensorView q_view(qa.view.data(), DType::kE4M3, qa.view.shape(), Device::cpu());
        Tensor out;
        {
          nb::gil_scoped_release release;
          out = dequantize_fp8_block(q_view, sa.view, shape);
        }
        return to_numpy(std::move(out));
      },
      nb::arg("q"), nb::arg("scale"), nb::arg("block"));
  m.def(
      "quantize_fp8_groups",
      [](nb::handle x, std::int64_t group_k, const std::string& scale_mode) {
        const ArrayArg in = array_arg(x, "x", {{DType::kF32, DType::kBF16}, 2, true, true});
        const ScaleMode mode = scale_mode_arg(scale_mode);
        Fp8BlockTensor q;
        {
          nb::gil_scoped_release release;
          q = quantize_fp8_groups(in.view, group_k, mode);
        }
        return nb::make_tuple(to_numpy(std::move(q.q)), to_numpy(std::move(q.scale)));
      },
      nb::arg("x"), nb::arg("group_k") = 128, nb::arg("scale_mode") = "fp32");
  m.def(
      "pack_ue8m0",
      [](nb::handle scales) {
        const ArrayArg in = array_arg(scales, "scales", {{DType::kF32}, 2, true, true});
        Tensor out;
        {
          nb::gil_scoped_release release;
          out = pack_ue8m0(in.view);
        }
        return to_numpy(std::move(out));
      },
      nb::arg("scales"));
  m.def(
      "unpack_ue8m0",
      [](nb::handle packed, std::int64_t mn, std::int64_t groups) {
        const ArrayArg in = array_arg(packed, "packed", {{DType::kI32}, 2, true, true});
        Tensor out;
        {
          nb::gil_scoped_release release;
          out = unpack_ue8m0(in.view, mn, groups);
        }
        return to_numpy(std::move(out));
      },
      nb::arg("packed"), nb::arg("mn"), nb::arg("groups"));
}

}  // namespace mxq::python
