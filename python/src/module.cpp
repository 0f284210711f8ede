// The extension module mxq._mxq. The public API is the Python package `mxq`, which wraps it.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include "array_bridge.h"
#include "bindings.h"
#include "mxq/core/build_info.h"

NB_MODULE(_mxq, m) {
  namespace nb = nanobind;
  m.doc() = "mxq's C++ core (use the `mxq` package, which wraps this module)";
  m.attr("__version__") = mxq::build_info().version;
  m.attr("with_cuda") = static_cast<bool>(MXQ_WITH_CUDA);
  mxq::python::bind_errors(m);
  mxq::python::bind_array_bridge(m);
  mxq::python::bind_formats(m);
  mxq::python::bind_tune(m);  // before the ops that take an Autotuner
  mxq::python::bind_moe(m);
  mxq::python::bind_linear(m);
  mxq::python::bind_moe_cuda(m);
  mxq::python::bind_moe_op(m);
}
