#include "array_bridge.h"

#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
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
    // torch refuses to export a tensor that requires grad; say so instead of "not an array".
    const bool requires_grad = nb::hasattr(array, "requires_grad") &&
                               nb::isinstance<nb::bool_>(array.attr("requires_grad")) &&
                               nb::cast<bool>(array.attr("requires_grad"));
    fail(ErrorCode::kDtypeMismatch, arg,
         ": expected an array (NumPy, PyTorch, CuPy or any DLPack exporter), found ",
         nb::cast<std::string>(
             nb::str(nb::handle(reinterpret_cast<PyObject*>(Py_TYPE(array.ptr()))))),
         requires_grad ? " that requires grad (pass " + arg + ".detach())" : "");
  }
  std::optional<DType> dtype = dtype_override ? dtype_override : dtype_from_dlpack(a.dtype());
  // CuPy (and NumPy without ml_dtypes) have no bfloat16: uint16 bit patterns are read as bf16
  // where bf16 is accepted (an empty list accepts every mxq dtype), as uint8 codes are where
  // E4M3 / E8M0 are.
  const nb::dlpack::dtype u16 = nb::dtype<std::uint16_t>();
  if (!dtype && a.dtype() == u16 &&
      (requirements.dtypes.empty() ||
       std::find(requirements.dtypes.begin(), requirements.dtypes.end(), DType::kBF16) !=
           requirements.dtypes.end())) {
    dtype = DType::kBF16;
  }
  if (!dtype) {
    fail(
        ErrorCode::kDtypeMismatch, arg, ": expected ",
        requirements.dtypes.empty() ? std::string("an mxq dtype") : dtype_list(requirements.dtypes),
        ", found ", describe_dlpack_dtype(a.dtype()));
  }
  if (!requirements.dtypes.empty()) {
    bool accepted = false;
    for (DType d : requirements.dtypes) accepted = accepted || d == *dtype;
    if (!accepted) {
      fail(ErrorCode::kDtypeMismatch, arg, ": expected ", dtype_list(requirements.dtypes),
           ", found ", dtype_list({*dtype}));
    }
  }
  if (requirements.rank >= 0 && a.ndim() != static_cast<size_t>(requirements.rank)) {
    fail(ErrorCode::kShapeMismatch, arg, ": expected ", requirements.rank,
         " dimensions, found shape ", shape_text(a));
  }
  if (a.ndim() > static_cast<size_t>(Shape::kMaxDims)) {
    fail(ErrorCode::kShapeMismatch, arg, ": expected at most ", Shape::kMaxDims,
         " dimensions, found ", a.ndim());
  }
  Device device = Device::cpu();
  if (a.device_type() == nb::device::cuda::value) {
    device = Device::cuda(a.device_id());
  } else if (a.device_type() != nb::device::cpu::value) {
    fail(ErrorCode::kDeviceMismatch, arg,
         ": expected host (CPU) or CUDA memory, found DLPack device type ", a.device_type());
  }
  if (requirements.host_only && !device.is_cpu()) {
    fail(ErrorCode::kDeviceMismatch, arg, ": expected a host (CPU) array, found one on ", device,
         " (this operation runs on the CPU)");
  }
  Shape shape;
  std::vector<std::int64_t> stride_list;
  bool empty = false;
  bool negative = false;
  std::string strides_text = "[";
  for (size_t i = 0; i < a.ndim(); ++i) {
    shape.push_back(static_cast<std::int64_t>(a.shape(i)));
    stride_list.push_back(static_cast<std::int64_t>(a.stride(i)));
    empty |= a.shape(i) == 0;
    negative |= a.stride(i) < 0;
    strides_text += (i ? ", " : "") + std::to_string(a.stride(i));
  }
  strides_text += "]";
  if (negative) {  // a reversed view (x[:, ::-1]): mxq reads memory forward only
    fail(ErrorCode::kInvalidArgument, arg,
         ": expected a C-contiguous (row-major, dense) array, found shape ", shape.str(),
         " with element strides ", strides_text, " (use numpy.ascontiguousarray or .contiguous())");
  }
  if (empty) {
    // No element to address: the exporter's strides (often 0) say nothing, and the array is
    // as contiguous as it can be.
    result.view = TensorView(const_cast<void*>(a.data()), *dtype, shape, device);
  } else {
    Shape strides;
    for (const std::int64_t s : stride_list) strides.push_back(s);
    result.view = TensorView(const_cast<void*>(a.data()), *dtype, shape, strides, device);
  }
  const Shape& strides = result.view.strides();
  if (requirements.contiguous && !result.view.is_contiguous()) {
    fail(ErrorCode::kInvalidArgument, arg,
         ": expected a C-contiguous (row-major, dense) array, found shape ", shape.str(),
         " with element strides ", strides.str(),
         " (use numpy.ascontiguousarray or .contiguous())");
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
    fail(ErrorCode::kInternal, "to_numpy called with a device tensor");
  }
  auto* owned = new Tensor(std::move(tensor));
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<Tensor*>(p); });
  return wrap_storage(owned->data(), owned->view(), owner, /*read_only=*/false);
}

nb::object view_as_numpy(const TensorView& view, nb::handle owner) {
  if (view.device().is_cuda()) {
    // Device memory must never become a NumPy array: a read-only DLPack view instead.
    std::vector<size_t> shape(view.shape().dims().begin(), view.shape().dims().end());
    std::vector<int64_t> strides(view.strides().dims().begin(), view.strides().dims().end());
    nb::ndarray<nb::ro> array(view.data(), shape.size(), shape.data(), owner, strides.data(),
                              storage_dlpack_dtype(view.dtype()), nb::device::cuda::value,
                              view.device().index);
    return nb::cast(array, nb::rv_policy::reference);
  }
  return wrap_storage(view.data(), view, owner, /*read_only=*/true);
}

nb::object to_dlpack(Tensor tensor) {
  auto* owned = new Tensor(std::move(tensor));
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<Tensor*>(p); });
  const TensorView& view = owned->view();
  std::vector<size_t> shape(view.shape().dims().begin(), view.shape().dims().end());
  std::vector<int64_t> strides(view.strides().dims().begin(), view.strides().dims().end());
  const bool cuda = view.device().is_cuda();
  nb::ndarray<> array(owned->data(), shape.size(), shape.data(), owner, strides.data(),
                      storage_dlpack_dtype(view.dtype()),
                      cuda ? nb::device::cuda::value : nb::device::cpu::value,
                      cuda ? view.device().index : 0);
  return nb::cast(array, nb::rv_policy::reference);
}

nb::object to_python(Tensor tensor) {
  if (tensor.device().is_cpu()) return to_numpy(std::move(tensor));
  return to_dlpack(std::move(tensor));
}

std::shared_ptr<void> python_owner(nb::object object) {
  auto* held = new nb::object(std::move(object));
  return {held, [](void* p) noexcept {
            auto* reference = static_cast<nb::object*>(p);
            if (!Py_IsInitialized()) {  // interpreter gone: nothing left to release
              (void)reference->release();
              delete reference;
              return;
            }
            const nb::gil_scoped_acquire gil;
            delete reference;
          }};
}

Tensor borrow_tensor(const ArrayArg& arg, DType dtype, std::string_view argument) {
  if (size_of(dtype) != size_of(arg.view.dtype())) {
    fail(ErrorCode::kDtypeMismatch, argument, ": cannot read ", name(arg.view.dtype()),
         " elements as ", name(dtype));
  }
  const TensorView view(arg.view.data(), dtype, arg.view.shape(), arg.view.strides(),
                        arg.view.device());
  return Tensor::borrow(view, python_owner(arg.keep_alive), argument);
}

Device device_arg(const std::string& text, std::string_view argument) {
  if (text == "cpu") return Device::cpu();
  if (text == "cuda") return Device::cuda(0);
  if (text.rfind("cuda:", 0) == 0 && text.size() > 5 && text.size() < 9 &&
      text.find_first_not_of("0123456789", 5) == std::string::npos) {
    return Device::cuda(std::stoi(text.substr(5)));
  }
  fail_argument(ErrorCode::kInvalidArgument, argument, "\"cpu\", \"cuda\" or \"cuda:N\"",
                "\"" + text + "\"");
}

void bind_array_bridge(nb::module_& m) {
  m.def(
      "_copy_to_device",
      [](nb::handle array, const std::string& device) {
        const ArrayArg arg = array_arg(array, "array", {{}, -1, true, false});
        const Device target = device_arg(device, "device");
        Tensor out;
        {
          const nb::gil_scoped_release release;
          out = Tensor::borrow(arg.view, nullptr, "array").to(target);
        }
        return to_python(std::move(out));
      },
      nb::arg("array"), nb::arg("device"),
      "A contiguous copy of `array` on `device` (a NumPy array on the host, a DLPack array on a "
      "GPU; elements in their storage dtype).");
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
