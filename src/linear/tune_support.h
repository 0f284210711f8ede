// How the block-FP8 linear op appears to the autotuner (internal): the conversion between the
// tuner's block_fp8_linear Problem and a LinearProblem, the adoption of the op's own tactics as
// autotuner tactics, and the random inputs, reference and check that the CPU workload
// (src/linear/cpu/block_fp8_linear_autotune.cpp) and the CUDA workload
// (src/linear/cuda/block_fp8_linear_cuda_autotune.cpp) share.
#pragma once

#include <cstdint>
#include <vector>

#include "mxq/core/device.h"
#include "mxq/core/tensor.h"
#include "mxq/formats/fp8_block.h"
#include "mxq/linear/problem.h"
#include "mxq/linear/tactic.h"
#include "mxq/linear/weight.h"
#include "mxq/tune/registry.h"
#include "mxq/tune/tactic.h"

namespace mxq::linear::internal {

// What an adopted tactic runs on. `dispatch_choice` is what select_tactic(*problem, "auto")
// picks, resolved once by the workload so that the "auto" tactic's timing holds no dispatch cost
// (null: resolved on each call).
struct TunedLinearArgs {
  const LinearOperands* operands = nullptr;
  const LinearProblem* problem = nullptr;
  const LinearTactic* dispatch_choice = nullptr;
};

// The LinearProblem of `problem` at M = `tokens` on `device` (a CUDA device is described:
// compute capability, SM count).
LinearProblem linear_problem_of(const tune::Problem& problem, std::int64_t tokens, Device device);

// The block_fp8_linear problem of a call (its M aside).
tune::Problem tune_problem_of(const LinearProblem& problem);

// Whether `tuned` is the block_fp8_linear problem of `problem` (compares fields in place: no
// allocation).
bool tune_problem_matches(const tune::Problem& tuned, const LinearProblem& problem);

// The autotuner tactic that runs `source`: variant = the tactic's name without its device prefix
// up to the next dot, parameters = source.params(), e.g. cuda.sm90_wgmma.m64n128 ->
// sm90_wgmma[block_k=128,block_m=64,block_n=128,stages=4]; when that id is already taken in
// `registry` the variant keeps the whole rest of the name (ids stay unique whatever tactics the
// linear module adds). supports() asks `source` on the problem at M = 1 on `device()` (the
// token range is the tactic's own); without `with_predicate` there is none (a default). Its
// `native` is &source (const LinearTactic*), which linear() maps a served tactic back with.
tune::Tactic adopt_tactic(const LinearTactic& source, tune::Backend backend,
                          const tune::TacticRegistry& registry, Device (*device)(),
                          bool with_predicate);

// The default tactic "auto" of a backend: runs what select_tactic(problem, "auto") picks (the
// rule-based dispatch; docs/linear.md). No supports() predicate: it throws the dispatch's
// "no tactic supports" error at run time for a problem nothing supports. Its `native` is a null
// const LinearTactic*: "the dispatch rule".
tune::Tactic dispatch_rule_tactic(tune::Backend backend);

// Random quantized inputs of one (problem, token count), on the host, and the reference output
// (the fp64 CPU reference rounded to the output dtype) of the rows in `reference_rows`.
struct TuneInputs {
  LinearProblem problem;  // M = the token count, on the workload's device
  BlockFp8Weight weight;
  Fp8BlockTensor x;
  std::vector<std::int64_t> reference_rows;  // ascending
  std::vector<double> reference;             // [reference_rows.size(), N]
};
// Every row is checked while M * N * K stays below `max_reference_macs`; beyond that an evenly
// spread subset of rows (the first and the last included) is, so that the fp64 reference of
// large buckets (M = 4096 at N = 7168, K = 16384) does not take minutes of CPU time per key.
TuneInputs make_tune_inputs(const tune::Problem& problem, std::int64_t tokens, Device device,
                            double max_reference_macs);

// Checks an output [M, N] (host bits of `dtype`, row-major): every element finite (outputs are
// poisoned with NaN before the run, so an unwritten element fails), and the reference rows
// within relative L2 error 4e-3 (the bound of the linear module's GPU tests).
tune::CheckResult check_output(const void* out, DType dtype, const TuneInputs& inputs);

}  // namespace mxq::linear::internal
