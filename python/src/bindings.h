// One bind_* function per C++ module, called once from module.cpp.
#pragma once

#include <nanobind/nanobind.h>

#include "mxq/moe/config.h"

namespace mxq::python {

namespace nb = nanobind;

void bind_errors(nb::module_& m);
void bind_formats(nb::module_& m);
void bind_moe(nb::module_& m);
void bind_linear(nb::module_& m);
void bind_moe_cuda(nb::module_& m);  // MoeGpuLayer, in CUDA builds only
void bind_moe_op(nb::module_& m);    // the engine-facing MoE op (mxq/moe/mxfp4_moe.h)
void bind_tune(nb::module_& m);

// A MoeConfig as the dict mxq.MoELayer.config returns (bind_moe.cpp).
nb::dict config_dict(const moe::MoeConfig& c);

}  // namespace mxq::python
