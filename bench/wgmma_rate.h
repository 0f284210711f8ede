// `mxq bench wgmma-rate`: a probe of how fast one SM issues Hopper's warpgroup MMA (wgmma) at each
// N, the way mxq's GEMM loops issue it: one block an SM of 1 to 4 warpgroups, each issuing
// `k_steps` wgmma a commit group on one accumulator and then waiting until at most `in_flight`
// groups are pending, a new A fragment each group (bf16 from registers, as the MoE's decoded
// weights) or both operands from shared memory (E4M3, as the linear). Nothing else is done, so
// the time per wgmma is the tensor pipe's issue cost for that shape, or the chain's latency when
// one warpgroup waits for every group: what a narrow tile's MMA costs before any decode or
// promotion is added (docs/perf-log/moe-prefill.md, the T = 512 valley).
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace mxq::bench {

struct WgmmaRateOptions {
  // bf16-rs: m64nNk16 bf16, A from registers; e4m3-ss: m64nNk32 E4M3, A and B from shared memory.
  std::vector<std::string> kinds = {"bf16-rs", "e4m3-ss"};
  std::vector<int> n = {16, 32, 64, 128};
  std::vector<int> warpgroups = {1, 3};  // consumer warpgroups a block (1 to 4)
  std::vector<int> k_steps = {2};        // wgmma a commit group: 1, 2, 4 or 8
  std::vector<int> in_flight = {0, 1};   // groups a wait leaves pending: 0 (serial) or 1
  int iterations = 4000;                 // commit groups each warpgroup issues per launch
  int repeats = 20;                      // timed launches per configuration (median), >= 20
};

// Throws mxq::Error(kInvalidArgument) naming the first option out of range, or a combination
// whose kernel ptxas serializes (every build: probe_options.cpp).
void check_wgmma_rate_options(const WgmmaRateOptions& options);

// Whether ptxas (CUDA 13.0, sm_90a) serializes the probe's wgmma for this configuration, each
// waiting for the one before (C7511 / C7512): bf16 from registers with a group left in flight
// and 8 k-steps a group, or 4 at n128. Such a kernel times the serial chain, not what it was
// asked, so the probe refuses it (check_wgmma_rate_options) and does not compile it.
constexpr bool wgmma_rate_serialized_by_ptxas(bool e4m3, int n, int k_steps, int in_flight) {
  return !e4m3 && in_flight > 0 && (k_steps >= 8 || (k_steps >= 4 && n >= 128));
}

// Runs the probe and returns its results as JSON. Throws mxq::Error(kInvalidArgument) for an
// option out of range (checked before any GPU is looked for), kUnsupported when no GPU is
// visible or it is not sm_90 (wgmma is Hopper's).
nlohmann::json run_wgmma_rate(const WgmmaRateOptions& options, bool progress);

}  // namespace mxq::bench
