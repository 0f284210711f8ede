// The routing kernel's launch (routing.cuh): the forward's first kernel.
#include "cuda_common/pdl.cuh"
#include "launch.h"
#include "mxq/core/cuda_check.h"
#include "routing.cuh"

namespace mxq::moe::gpu::detail {

void launch_routing(const RouteArgs& route, bool routed, cudaStream_t stream) {
  const int route_tiles = routed ? route_tiles_for(route.tokens) : 1;
  const int router_blocks = routed ? router_blocks_for(route.router_experts, route_tiles) : 1;
  // The first kernel of the forward: plain stream order after whatever the caller enqueued.
  ptx::launch(route_tiles == 4 ? route_kernel<4> : route_kernel<1>,
              dim3(router_blocks, token_groups_for(route.tokens)), dim3(kRouteWarps * 32),
              route_smem_bytes(route.experts), stream, false, route);
  MXQ_CUDA_CHECK_LAUNCH();
}

void take_routing_block_trace(MoeBlockTraceRecord* all) { take_translation_unit_trace(all); }

}  // namespace mxq::moe::gpu::detail
