#include "bindings.h"
namespace mxq::python {
void bind_moe(nb::module_&) {}
}
