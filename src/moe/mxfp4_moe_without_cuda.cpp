// The engine-facing MoE op's device backend in a build without CUDA: a clear error (the checks
// already refused CUDA tensors they could not hold; a CUDA view still lands here).
#include "moe/mxfp4_moe_backend.h"

#if !MXQ_WITH_CUDA
#include "mxq/core/error.h"

namespace mxq::moe::detail {
namespace {
[[noreturn]] void no_cuda() {
  fail(ErrorCode::kUnsupported,
       "this build of mxq has no CUDA support (configure with -DMXQ_CUDA=ON)");
}
}  // namespace

void prepare_on_device(const PreparePlan&, void*) { no_cuda(); }
void run_prepared_on_device(const ForwardPlan&, void*) { no_cuda(); }
void route_on_device(const RoutePlan&, void*) { no_cuda(); }
std::size_t device_route_workspace_bytes(std::int64_t, std::int64_t, std::int64_t, std::int64_t) {
  no_cuda();
}
std::size_t device_workspace_bytes(const PreparedMoeShapes&, std::int64_t, std::int64_t,
                                   ActivationQuant, std::int64_t, std::int64_t) {
  no_cuda();
}

}  // namespace mxq::moe::detail
#endif
