// Deterministic synthetic gpt-oss-style MoE checkpoints (`mxq synth gpt-oss`, `mxq run`):
// weights drawn from mxq's PRNG, scaled so activations stay O(1), quantized with mxq's MXFP4
// quantizer (floor scale rule); bf16 router and biases; plus config.json.
//
// Values (u = uniform in [-1, 1), one stream per (seed, layer, tensor, expert)):
//   router.weight  u * sqrt(3 / H)            router.bias  0.5 u
//   gate/up row r  u * sqrt(3 / H) * 1.5 * 2^(u_r)   (one gain u_r per row, so block scales vary)
//   down row r     u * sqrt(3 / I) * 2^(u_r)
//   gate/up bias   0.25 u                     down bias    0.1 u
// The gpt-oss layout and the native layout hold the same bytes (only arranged differently).
// Files: one `layer-LLLLL.safetensors` per layer, and config.json.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "mxq/core/tensor.h"
#include "mxq/moe/checkpoint.h"
#include "mxq/moe/config.h"

namespace mxq::moe {

struct SyntheticSpec {
  std::int64_t experts = 32;
  std::int64_t hidden = 2880;
  std::int64_t intermediate = 2880;
  std::int64_t top_k = 4;
  std::int64_t layers = 1;
  std::uint64_t seed = 0;
  CheckpointLayout layout = CheckpointLayout::kGptOss;
  double swiglu_limit = 7.0;
};

MoeConfig synthetic_config(const SyntheticSpec& spec);

// Bytes of one layer's .safetensors file, an upper estimate: its tensor data plus 256 bytes of
// header per tensor; saturating at UINT64_MAX. The spec's dimensions must be valid
// (synthetic_config).
std::uint64_t synthetic_layer_bytes(const SyntheticSpec& spec);

// Writes the checkpoint into `out_dir` (created if missing). `progress` receives one line per
// layer. `poll` is called between pieces of work (before each expert is drawn, before each layer
// is written; from worker threads too): it may throw to stop the writing (e.g. on Ctrl-C), and
// the exception propagates. Throws mxq::Error on bad dimensions or I/O errors.
void write_synthetic_checkpoint(const std::string& out_dir, const SyntheticSpec& spec,
                                const std::function<void(std::string_view)>& progress = {},
                                const std::function<void()>& poll = {});

// The cached copy of a synthetic checkpoint: `<cache_root>/synth/<name>` where the name spells
// the spec. Reused when its marker file (mxq-synth.txt, written last) matches the spec and the
// files have the recorded sizes; otherwise generated into a temporary sibling directory
// `<name>.tmp-<pid>-<random>` and renamed into place, so a crash or a concurrent run never
// leaves a half-written checkpoint under the final name. While it writes, the process holds an
// exclusive flock on `<temporary>.lock`; every call first removes the temporary folders whose
// writer is gone (remove_stale_synthetic_temporaries). An exception (from `poll` too) removes the
// temporary folder before it propagates. Returns the directory.
std::string ensure_synthetic_checkpoint(const SyntheticSpec& spec, const std::string& cache_root,
                                        const std::function<void(std::string_view)>& progress = {},
                                        const std::function<void()>& poll = {});
std::string synthetic_checkpoint_name(const SyntheticSpec& spec);

// Removes from `synth_dir` the temporary folders (`*.tmp-*`, `*.stale-*`) of writers that are
// gone: a folder whose lock file nobody holds (its writer died: the kernel released the lock),
// or, without a lock file (folders of older mxq versions), whose pid names no live process.
// Never one whose writer still runs. Returns how many folders it removed.
int remove_stale_synthetic_temporaries(const std::string& synth_dir);

// A deterministic input batch: f32 [tokens, hidden], values u * sqrt(3) rounded to bf16.
Tensor synthetic_tokens(std::int64_t tokens, std::int64_t hidden, std::uint64_t seed);

}  // namespace mxq::moe
