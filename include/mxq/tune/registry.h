// The tactic registry: every op and every tactic the autotuner may choose. Built once, then
// frozen (immutable, so lookups can hold plain pointers into it). Its hash enters the cache
// fingerprint: a cache tuned against another set of tactics is not served.
//
// Built-in tactics: every source file named `*_autotune.cpp` under src/ (and `*_autotune.cu` /
// `*_autotune.cpp` under src/<op>/cuda/ when CUDA is built) defines
//     void mxq::tune::register_<file stem>(mxq::tune::TacticRegistry&);
// e.g. src/moe/cpu/moe_expert_gemm_autotune.cpp defines register_moe_expert_gemm_autotune(). CMake
// generates the list that calls them all (cmake/MxqTactics.cmake), so adding an op's tactics
// means adding one file.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "mxq/tune/tactic.h"

namespace mxq::tune {

class TacticRegistry {
 public:
  TacticRegistry() = default;
  TacticRegistry(const TacticRegistry&) = delete;
  TacticRegistry& operator=(const TacticRegistry&) = delete;

  void add_op(OpSpec spec);
  const Tactic& add_tactic(Tactic tactic);
  // Checks every op (buckets, a default tactic valid for all token counts, at least one tactic)
  // and computes the hash. add_* afterwards throws.
  void freeze();
  [[nodiscard]] bool frozen() const { return frozen_; }

  [[nodiscard]] const OpSpec* find_op(std::string_view name, Backend backend) const noexcept;
  [[nodiscard]] const Tactic* find_tactic(std::string_view op, Backend backend,
                                          std::string_view id) const noexcept;
  [[nodiscard]] const Tactic& default_tactic(const OpSpec& op) const;
  // The op's tactics in registration order.
  [[nodiscard]] const std::vector<const Tactic*>& tactics(const OpSpec& op) const;
  [[nodiscard]] std::vector<const OpSpec*> ops() const;
  [[nodiscard]] std::vector<const OpSpec*> ops(Backend backend) const;

  // 16 hex digits over ops, buckets, defaults and every tactic's id, token range and version.
  [[nodiscard]] const std::string& hash() const;
  // Human-readable listing (one line per tactic).
  [[nodiscard]] std::string describe() const;

 private:
  struct OpEntry {
    OpSpec spec;
    std::vector<const Tactic*> tactics;
    const Tactic* default_tactic = nullptr;
  };
  void check_mutable(std::string_view what) const;
  OpEntry* find_entry(std::string_view name, Backend backend);
  const OpEntry* find_entry(std::string_view name, Backend backend) const;

  std::deque<OpEntry> ops_;                                   // deque: stable addresses
  std::deque<Tactic> tactics_;                                // deque: stable addresses
  std::map<std::string, const Tactic*, std::less<>> by_key_;  // "backend/op/id"
  bool frozen_ = false;
  std::string hash_;
};

// The registry of mxq's built-in ops (frozen; built on first use, thread-safe).
const TacticRegistry& builtin_tactics();
// Fills `registry` with the built-in tactics (what builtin_tactics() does), for registries that
// add test ops next to them.
void register_builtin_tactics(TacticRegistry& registry);

}  // namespace mxq::tune
