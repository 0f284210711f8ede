#include "array_bridge.h"

#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <sstream>
#include <string>

namespace mxq::python {
namespace {

// ml_dtypes' NumPy dtypes and the mxq dtype their bytes hold.
struct MlDtype {
  std::string_view numpy_name;
  DType dtype;
};
constexpr MlDtype kMlDtypes[] = {
    {"bfloat16", DType::kBF16},
    {"float8_e4m3fn", DType::kE4M3},
    {"float8_e8m0fnu", DType::kE8M0},
};

std::string ml_dtype_name(DType dtype) {
  for (const MlDtype& entry : kMlDtypes) {
    if (entry.dtype == dtype) return std::string(entry.numpy_name);
  }
  return {};
}

std::optional<DType> dtype_from_dlpack(nb::dlpack::dtype t) {
  using Code = nb::dlpack::dtype_code;
  const auto code = static_cast<Code>(t.code);
  if (t.lanes != 1) return std::nullopt;
  switch (code) {
    case Code::Float:
      if (t.bits == 32) return DType::kF32;
      if (t.bits == 16) return DType::kF16;
      break;
    case Code::Bfloat:
      if (t.bits == 16) return DType::kBF16;
      break;
    case Code::Float8_E4M3FN:
      return DType::kE4M3;
    case Code::Float8_E8M0FNU:
      return DType::kE8M0;
    case Code::UInt:
      if (t.bits == 8) return DType::kU8;
      break;
    case Code::Int:
      if (t.bits == 8) return DType::kI8;
      if (t.bits == 32) return DType::kI32;
      if (t.bits == 64) return DType::kI64;
      break;
    case Code::Bool:
      return DType::kBool;
    default:
      break;
  }
  return std::nullopt;
}

std::string describe_dlpack_dtype(nb::dlpack::dtype t) {
  using Code = nb::dlpack::dtype_code;
  std::string kind;
  switch (static_cast<Code>(t.code)) {
    case Code::Int:
      kind = "int";
      break;
    case Code::UInt:
      kind = "uint";
      break;
    case Code::Float:
      kind = "float";
      break;
    case Code::Bfloat:
      kind = "bfloat";
      break;
    case Code::Complex:
      kind = "complex";
      break;
    case Code::Bool:
      kind = "bool";
      break;
    default:
      kind = "dlpack type code " + std::to_string(int(t.code)) + " of ";
      break;
  }
  std::string out = kind + std::to_string(int(t.bits));
  if (t.lanes != 1) out += "x" + std::to_string(int(t.lanes));
  return out;
}

nb::dlpack::dtype storage_dlpack_dtype(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return nb::dtype<float>();
    case DType::kF16:
      return {static_cast<std::uint8_t>(nb::dlpack::dtype_code::Float), 16, 1};
    case DType::kBF16:
      return nb::dtype<std::uint16_t>();  // NumPy has no bfloat16: ml_dtypes view below
    case DType::kI8:
      return nb::dtype<std::int8_t>();
    case DType::kI32:
      return nb::dtype<std::int32_t>();
    case DType::kI64:
      return nb::dtype<std::int64_t>();
    case DType::kBool:
      return nb::dtype<bool>();
    case DType::kU8:
    case DType::kE4M3:
    case DType::kE8M0:
    case DType::kE2M1x2:
      return nb::dtype<std::uint8_t>();
  }
  return nb::dtype<std::uint8_t>();
}

// For ml_dtypes arrays: the uint view of the same bytes and the dtype they hold.
std::optional<std::pair<nb::object, DType>> reinterpret_ml_dtype(nb::handle array) {
  if (!nb::hasattr(array, "dtype") || !nb::hasattr(array, "view")) return std::nullopt;
  nb::object dtype = array.attr("dtype");
  if (!nb::hasattr(dtype, "name")) return std::nullopt;
  const std::string name = nb::cast<std::string>(nb::str(dtype.attr("name")));
  for (const MlDtype& entry : kMlDtypes) {
    if (name == entry.numpy_name) {
      // Only NumPy arrays carry ml_dtypes dtypes; torch/CuPy export float8 through DLPack.
      const nb::module_ numpy = nb::module_::import_("numpy");
      if (!nb::isinstance(array, numpy.attr("ndarray"))) return std::nullopt;
      const char* storage = entry.dtype == DType::kBF16 ? "uint16" : "uint8";
      return std::make_pair(array.attr("view")(numpy.attr(storage)), entry.dtype);
    }
  }
  return std::nullopt;
}

std::string shape_text(const nb::ndarray<nb::ro>& a) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < a.ndim(); ++i) out << (i ? ", " : "") << a.shape(i);
  out << "]";
  return out.str();
}

}  // namespace

std::string dtype_list(const std::vector<DType>& dtypes) {
  std::ostringstream out;
  for (size_t i = 0; i < dtypes.size(); ++i) {
    if (i) out << (i + 1 == dtypes.size() ? " or " : ", ");
    out << name(dtypes[i]);
    const std::string ml = ml_dtype_name(dtypes[i]);
    if (!ml.empty()) out << " (ml_dtypes." << ml << ")";
  }
  return out.str();
}

ArrayArg array_arg(nb::handle array, std::string_view argument,
                   const ArrayRequirements& requirements) {
  const std::string arg(argument);
  ArrayArg result;
  nb::handle source = array;
  std::optional<DType> dtype_override;
  if (auto reinterpreted = reinterpret_ml_dtype(array)) {
    result.keep_alive = reinterpreted->first;
    source = result.keep_alive;
    dtype_override = reinterpreted->second;
  } else {
    result.keep_alive = nb::borrow(array);
  }
  nb::ndarray<nb::ro> a;
  if (!nb::try_cast(source, a, /*convert=*/false)) {
    throw nb::type_error((arg +
                          ": expected an array (NumPy, PyTorch, CuPy or any DLPack "
                          "exporter), found " +
                          nb::cast<std::string>(nb::str(
                              nb::handle(reinterpret_cast<PyObject*>(Py_TYPE(array.ptr()))))))
                             .c_str());
  }
  const std::optional<DType> dtype = dtype_override ? dtype_override : dtype_from_dlpack(a.dtype());
  if (!dtype) {
    throw nb::type_error((arg + ": expected " +
                          (requirements.dtypes.empty() ? std::string("an mxq dtype")
                                                       : dtype_list(requirements.dtypes)) +
                          ", found " + describe_dlpack_dtype(a.dtype()))
                             .c_str());
  }
  if (!requirements.dtypes.empty()) {
    bool accepted = false;
    for (DType d : requirements.dtypes) accepted = accepted || d == *dtype;
    if (!accepted) {
      throw nb::type_error((arg + ": expected " + dtype_list(requirements.dtypes) + ", found " +
                            dtype_list({*dtype}))
                               .c_str());
    }
  }
  if (requirements.rank >= 0 && a.ndim() != static_cast<size_t>(requirements.rank)) {
    throw nb::value_error((arg + ": expected " + std::to_string(requirements.rank) +
                           " dimensions, found shape " + shape_text(a))
                              .c_str());
  }
  if (a.ndim() > static_cast<size_t>(Shape::kMaxDims)) {
    throw nb::value_error((arg + ": expected at most " + std::to_string(Shape::kMaxDims) +
                           " dimensions, found " + std::to_string(a.ndim()))
                              .c_str());
  }
  Device device = Device::cpu();
  if (a.device_type() == nb::device::cuda::value) {
    device = Device::cuda(a.device_id());
  } else if (a.device_type() != nb::device::cpu::value) {
    throw nb::value_error((arg + ": expected host (CPU) or CUDA memory, found DLPack device type " +
                           std::to_string(a.device_type()))
                              .c_str());
  }
  if (requirements.host_only && !device.is_cpu()) {
    std::ostringstream found;
    found << device;
    throw nb::value_error((arg + ": expected a host (CPU) array, found one on " + found.str() +
                           " (this operation runs on the CPU)")
                              .c_str());
  }
  Shape shape;
  Shape strides;
  for (size_t i = 0; i < a.ndim(); ++i) {
    shape.push_back(static_cast<std::int64_t>(a.shape(i)));
    strides.push_back(static_cast<std::int64_t>(a.stride(i)));
  }
  result.view = TensorView(const_cast<void*>(a.data()), *dtype, shape, strides, device);
  if (requirements.contiguous && !result.view.is_contiguous()) {
    throw nb::value_error((arg +
                           ": expected a C-contiguous (row-major, dense) array, found "
                           "shape " +
                           shape.str() + " with element strides " + strides.str() +
                           " (use numpy.ascontiguousarray or .contiguous())")
                              .c_str());
  }
  return result;
}

namespace {

nb::object wrap_storage(void* data, const TensorView& view, nb::handle owner, bool read_only) {
  std::vector<size_t> shape(view.shape().dims().begin(), view.shape().dims().end());
  std::vector<int64_t> strides(view.strides().dims().begin(), view.strides().dims().end());
  const nb::dlpack::dtype storage = storage_dlpack_dtype(view.dtype());
  nb::object array;
  if (read_only) {
    array = nb::cast(nb::ndarray<nb::numpy, nb::ro>(data, shape.size(), shape.data(), owner,
                                                    strides.data(), storage),
                     nb::rv_policy::reference);
  } else {
    array = nb::cast(
        nb::ndarray<nb::numpy>(data, shape.size(), shape.data(), owner, strides.data(), storage),
        nb::rv_policy::reference);
  }
  const std::string ml = ml_dtype_name(view.dtype());
  if (!ml.empty()) array = array.attr("view")(nb::module_::import_("ml_dtypes").attr(ml.c_str()));
  return array;
}

}  // namespace

nb::object to_numpy(Tensor tensor) {
  if (!tensor.device().is_cpu()) {
    throw nb::value_error("internal: to_numpy called with a device tensor");
  }
  auto* owned = new Tensor(std::move(tensor));
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<Tensor*>(p); });
  return wrap_storage(owned->data(), owned->view(), owner, /*read_only=*/false);
}

nb::object view_as_numpy(const TensorView& view, nb::handle owner) {
  return wrap_storage(view.data(), view, owner, /*read_only=*/true);
}

void bind_array_bridge(nb::module_& m) {
  // What the boundary sees of an array (for tests of the no-copy path and for debugging).
  m.def(
      "_inspect_array",
      [](nb::handle array, bool contiguous) {
        ArrayRequirements requirements;
        requirements.contiguous = contiguous;
        requirements.host_only = false;
        const ArrayArg arg = array_arg(array, "array", requirements);
        std::ostringstream device;
        device << arg.view.device();
        nb::dict out;
        out["data"] = reinterpret_cast<std::uintptr_t>(arg.view.data());
        out["dtype"] = std::string(name(arg.view.dtype()));
        out["shape"] = nb::tuple(nb::cast(std::vector<std::int64_t>(
            arg.view.shape().dims().begin(), arg.view.shape().dims().end())));
        out["strides"] = nb::tuple(nb::cast(std::vector<std::int64_t>(
            arg.view.strides().dims().begin(), arg.view.strides().dims().end())));
        out["device"] = device.str();
        return out;
      },
      nb::arg("array"), nb::arg("contiguous") = false,
      "How mxq sees `array` at its boundary: data pointer, dtype, shape, element strides, device.");
}

}  // namespace mxq::python
