// `mxq synth gpt-oss OUT_DIR`: writes a deterministic synthetic MXFP4 MoE checkpoint.
#include <sys/statvfs.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <optional>
#include <system_error>

#include "cli_util.h"
#include "commands.h"
#include "interrupt.h"
#include "mxq/core/env.h"
#include "mxq/core/error.h"
#include "mxq/core/memory.h"
#include "mxq/moe/synthetic.h"

namespace mxq::cli {
namespace {

namespace fs = std::filesystem;

struct SynthOptions {
  std::string model;
  std::string out_dir;
  moe::SyntheticSpec spec;
  std::string seed = "0";
  std::string layout = "gpt-oss";
  bool force = false;
};

// Bytes free for an unprivileged writer on the file system that holds `path` (or its nearest
// existing ancestor); nullopt when unknown.
std::optional<std::uint64_t> free_disk_bytes(const std::string& path) {
  fs::path at = fs::absolute(path);
  std::error_code error;
  while (!fs::exists(at, error) && at.has_parent_path() && at != at.parent_path()) {
    at = at.parent_path();
  }
  struct statvfs info {};
  if (::statvfs(at.c_str(), &info) != 0) return std::nullopt;
  return saturating_mul(static_cast<std::uint64_t>(info.f_bavail),
                        static_cast<std::uint64_t>(info.f_frsize));
}

// What the checkpoint will take, before anything is written: one layer in host memory (its
// tensors, the experts' quantized copies they are assembled from, and each thread's f32 draw of
// one matrix) and every layer on disk.
void check_sizes(const SynthOptions& o) {
  const moe::SyntheticSpec& s = o.spec;
  const std::uint64_t layer = moe::synthetic_layer_bytes(s);
  const std::string dims =
      detail::concat("E=", s.experts, ", H=", s.hidden, ", I=", s.intermediate);
  const std::uint64_t draw =
      saturating_mul(saturating_mul(static_cast<std::uint64_t>(s.hidden),
                                    static_cast<std::uint64_t>(s.intermediate)),
                     4 * static_cast<std::uint64_t>(std::max(1, num_threads())));
  require_host_memory(saturating_add(saturating_mul(2, layer), draw),
                      "--experts/--hidden/--intermediate", dims,
                      "synthesizing one layer would hold");
  const std::optional<std::uint64_t> free = free_disk_bytes(o.out_dir);
  if (!free) return;
  if (layer > *free) {
    fail_argument(ErrorCode::kOutOfRange, "--experts/--hidden/--intermediate",
                  detail::concat("a layer that fits in the ", format_bytes(*free),
                                 " free on the file system of OUT_DIR '", o.out_dir, "'"),
                  detail::concat(dims, ": one layer takes ", format_bytes(layer)));
  }
  const std::uint64_t all = saturating_mul(layer, static_cast<std::uint64_t>(s.layers));
  if (all > *free) {
    fail_argument(
        ErrorCode::kOutOfRange, "--layers",
        detail::concat("at most ", *free / std::max<std::uint64_t>(layer, 1), " layers of ",
                       format_bytes(layer), " (", dims, ") in the ", format_bytes(*free),
                       " free on the file system of OUT_DIR '", o.out_dir, "'"),
        detail::concat(s.layers, " (", format_bytes(all), ")"));
  }
}

// The flags' values, checked by flag name before anything is written.
void check_spec(SynthOptions& o) {
  const moe::SyntheticSpec& s = o.spec;
  if (s.experts < 1) fail_argument(ErrorCode::kInvalidArgument, "--experts", ">= 1", s.experts);
  for (const auto& [flag, value] :
       {std::pair{"--hidden", s.hidden}, {"--intermediate", s.intermediate}}) {
    if (value < 32 || value % 32 != 0)
      fail_argument(ErrorCode::kInvalidArgument, flag, "a positive multiple of 32", value);
  }
  if (s.top_k < 1 || s.top_k > s.experts) {
    fail_argument(ErrorCode::kInvalidArgument, "--top-k",
                  "1 .. --experts (" + std::to_string(s.experts) + ")", s.top_k);
  }
  if (s.layers < 1) fail_argument(ErrorCode::kInvalidArgument, "--layers", ">= 1", s.layers);
  // The seed: every digit of an unsigned 64-bit number (no sign, no wrap, no saturation).
  std::uint64_t seed = 0;
  const char* end = o.seed.data() + o.seed.size();
  const auto [stop, error] = std::from_chars(o.seed.data(), end, seed);
  if (o.seed.empty() || error != std::errc() || stop != end) {
    fail_argument(ErrorCode::kInvalidArgument, "--seed", "an integer in 0 .. 2^64 - 1",
                  "'" + o.seed + "'");
  }
  o.spec.seed = seed;
  o.spec.layout = *moe::layout_from_name(o.layout);
  check_sizes(o);
}

// OUT_DIR must be new or empty, or (--force) hold only what synth writes: a directory with
// another checkpoint's layers would otherwise keep them next to the new config.json.
void check_out_dir(const SynthOptions& o) {
  std::error_code error;
  if (!fs::exists(o.out_dir, error)) return;
  if (!fs::is_directory(o.out_dir, error))
    fail(ErrorCode::kIo, "OUT_DIR '", o.out_dir, "' exists and is not a directory");
  for (const fs::directory_entry& entry : fs::directory_iterator(o.out_dir)) {
    const std::string name = entry.path().filename().string();
    const bool ours =
        name == "config.json" || (name.starts_with("layer-") && name.ends_with(".safetensors"));
    if (!o.force || !ours) {
      fail(ErrorCode::kIo, "OUT_DIR '", o.out_dir, "' is not empty (it holds '", name, "')",
           o.force ? "; --force replaces only config.json and layer-*.safetensors"
                   : "; use a new directory, or --force to replace a checkpoint synth wrote");
    }
  }
  for (const fs::directory_entry& entry : fs::directory_iterator(o.out_dir))
    fs::remove(entry.path());
}

void run_synth(SynthOptions& o) {
  check_spec(o);
  check_out_dir(o);
  std::error_code error;
  const bool created = !fs::exists(o.out_dir, error);
  const auto start = std::chrono::steady_clock::now();
  try {
    // Ctrl-C or SIGTERM stops the writing at the next expert and removes what was written.
    const InterruptScope interrupts;
    moe::write_synthetic_checkpoint(
        o.out_dir, o.spec,
        [](std::string_view line) { std::cerr << "mxq synth: " << line << std::endl; },
        [&interrupts] { interrupts.poll(); });
  } catch (...) {
    // Nothing half-written is left behind: the directory goes if synth made it, else its files.
    if (created) {
      fs::remove_all(o.out_dir, error);
    } else {
      for (const fs::directory_entry& entry : fs::directory_iterator(o.out_dir, error))
        fs::remove(entry.path(), error);
    }
    try {
      throw;
    } catch (const std::exception& failure) {
      if (!is_allocation_failure(failure)) throw;
      fail(ErrorCode::kOutOfRange,
           "--experts/--hidden/--intermediate: expected a layer this "
           "machine can give the memory for, found E=",
           o.spec.experts, ", H=", o.spec.hidden, ", I=", o.spec.intermediate,
           ": an allocation failed (", failure.what(), "); choose smaller values");
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << "wrote " << o.out_dir << " (" << o.spec.layers << " layer(s), " << o.layout
            << " layout) in " << seconds << " s\n";
}

}  // namespace

void register_synth(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "synth",
      "Write a deterministic synthetic checkpoint (weights drawn with mxq's PRNG, "
      "quantized with mxq's MXFP4 quantizer) and its config.json into a new or empty OUT_DIR");
  auto options = std::make_shared<SynthOptions>();
  cmd->add_option("model", options->model, "Model family")
      ->required()
      ->check(CLI::IsMember({"gpt-oss"}));
  cmd->add_option("out_dir", options->out_dir, "Output directory (new or empty)")->required();
  cmd->add_option("--experts", options->spec.experts, "Number of experts E")->capture_default_str();
  cmd->add_option("--hidden", options->spec.hidden, "Hidden size H (a multiple of 32)")
      ->capture_default_str();
  cmd->add_option("--intermediate", options->spec.intermediate,
                  "Intermediate size I (a multiple of 32)")
      ->capture_default_str();
  cmd->add_option("--top-k", options->spec.top_k, "Experts per token")->capture_default_str();
  cmd->add_option("--layers", options->spec.layers,
                  "Number of MoE layers (all must fit in the free space of OUT_DIR's file system, "
                  "one in the host memory available)")
      ->capture_default_str();
  cmd->add_option("--seed", options->seed, "PRNG seed (0 .. 2^64 - 1)")->capture_default_str();
  cmd->add_option("--layout", options->layout, "Tensor layout")
      ->check(CLI::IsMember({"gpt-oss", "native"}))
      ->capture_default_str();
  cmd->add_flag("--force", options->force,
                "Replace the checkpoint in a non-empty OUT_DIR (only if it holds nothing but "
                "config.json and layer-*.safetensors)");
  cmd->callback([options] { run_synth(*options); });
}

}  // namespace mxq::cli
