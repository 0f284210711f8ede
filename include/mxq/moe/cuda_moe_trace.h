// A per-block timeline of the CUDA MoE forward, for performance work (docs/PERF.md, "T=1 block
// by block"). Only a build configured with -DMXQ_MOE_BLOCK_TRACE=ON records it: thread 0 of each
// block of the routing kernel, the decode_mma GEMMs and the combine kernel stores
// %globaltimer (ns) at up to four points of the block's life. The default build records nothing
// and its kernels are unchanged; `mxq bench moe --block-trace FILE` writes the records of the
// default tactic's last replays, bench/block_trace_summary.py prints them as a timeline.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

namespace mxq::moe::gpu {

enum class MoeTraceKernel : int { kRouting = 0, kGemm1 = 1, kGemm2 = 2, kCombine = 3 };
inline constexpr int kMoeTraceKernels = 4;

// The points, per kernel:
//   routing: kStart, kReleased = its router logits written, kMid = past the ticket (the last
//            block of a token group only), kEnd = the lists built (the block that built them);
//   GEMMs:   kStart (before griddepcontrol.wait), kReleased (after it), kMid = its weight stream
//            done (warp 0), kEnd = its last store issued; blocks past the forward's tiles stop
//            after kReleased;
//   combine: kStart, kReleased, kEnd.
enum class MoeTracePoint : int { kStart = 0, kReleased = 1, kMid = 2, kEnd = 3 };
inline constexpr int kMoeTracePoints = 4;

// Blocks past this index of a grid (blockIdx.x fastest) are not recorded.
inline constexpr int kMoeTraceMaxBlocks = 8192;

struct MoeBlockTraceRecord {
  std::uint64_t at_ns[kMoeTracePoints];  // %globaltimer at each point; 0 where it did not get
  std::uint32_t sm;                      // the SM the block ran on
  std::uint32_t unused;
};

// Whether this build records the timeline (MXQ_MOE_BLOCK_TRACE).
bool moe_block_trace_enabled();

// Synchronizes the device, returns the records of each kernel (indexed by MoeTraceKernel; up to
// the last block that started, in block order) and clears them. A block index that several
// forwards ran keeps the latest forward's times, so take the records after each forward of
// interest. Throws mxq::Error (kUnsupported) in a build without the trace.
std::array<std::vector<MoeBlockTraceRecord>, kMoeTraceKernels> moe_block_trace_take();

}  // namespace mxq::moe::gpu
