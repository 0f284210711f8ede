// mxq::Error -> the Python classes of mxq/_errors.py: every one is an mxq.Error (RuntimeError)
// with .code; argument errors are also ValueError / TypeError.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <string>

#include "bindings.h"
#include "mxq/core/error.h"

namespace mxq::python {

void bind_errors(nb::module_& m) {
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const Error& error) {
      nb::gil_scoped_acquire gil;
      nb::object errors = nb::module_::import_("mxq._errors");
      nb::object exception =
          errors.attr("from_code")(std::string(to_string(error.code())), error.what());
      PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exception.ptr())), exception.ptr());
    }
  });
  m.def(
      "_raise_error",
      [](const std::string& code, const std::string& message) {
        for (int c = 0; c <= static_cast<int>(ErrorCode::kInternal); ++c) {
          const auto candidate = static_cast<ErrorCode>(c);
          if (to_string(candidate) == code) throw Error(candidate, message);
        }
        throw nb::value_error(("code: unknown mxq error code " + code).c_str());
      },
      nb::arg("code"), nb::arg("message"),
      "Throws mxq::Error(code, message) in C++ (tests the exception translation).");
}

}  // namespace mxq::python
