// A tactic is one way to run an op: (op, backend, kernel variant, parameters). It says which
// problems it supports and for which token counts it is valid; the autotuner never serves it
// outside either, whatever a cache file says. An op (OpSpec) names its buckets, its default
// tactic (valid for every problem the op accepts and every token count) and how to build a
// Workload: inputs + reference output for one (problem, token count), used to time and check
// the candidates.
#pragma once

#include <any>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <typeinfo>
#include <utility>
#include <vector>

#include "mxq/core/error.h"
#include "mxq/tune/problem.h"

namespace mxq::tune {

enum class Backend : std::uint8_t { kCpu, kCuda };
std::string_view to_string(Backend backend);
Backend backend_from_string(std::string_view text);  // "cpu" / "cuda"; throws otherwise

// Tactic parameters: a small name -> value map, printed canonically (sorted by name).
struct TacticParam {
  std::string name;
  std::string value;
  friend bool operator==(const TacticParam&, const TacticParam&) = default;
};

class TacticParams {
 public:
  TacticParams() = default;
  TacticParams(std::initializer_list<TacticParam> params);
  // Integer parameters, e.g. {{"block_m", 128}, {"stages", 4}} (kernel tile shapes).
  TacticParams(std::initializer_list<std::pair<std::string_view, std::int64_t>> params);
  void set(std::string name, std::string value);
  void set(std::string name, std::int64_t value) { set(std::move(name), std::to_string(value)); }
  [[nodiscard]] const std::string* find(std::string_view name) const;
  [[nodiscard]] std::int64_t get_int(std::string_view name) const;  // throws when absent
  [[nodiscard]] std::string canonical() const;                      // "bk=64,bn=16,threads=2"
  [[nodiscard]] bool empty() const { return params_.empty(); }
  [[nodiscard]] const std::vector<TacticParam>& items() const { return params_; }

 private:
  std::vector<TacticParam> params_;  // sorted by name, unique
};

// Inclusive range of token counts a tactic is valid for.
struct TokenRange {
  static constexpr std::int64_t kUnbounded = std::numeric_limits<std::int64_t>::max();
  std::int64_t min = 1;
  std::int64_t max = kUnbounded;
  [[nodiscard]] constexpr bool contains(std::int64_t tokens) const noexcept {
    return tokens >= min && tokens <= max;
  }
  [[nodiscard]] constexpr bool covers(std::int64_t lo, std::int64_t hi) const noexcept {
    return lo >= min && hi <= max;
  }
  [[nodiscard]] constexpr bool full() const noexcept { return min <= 1 && max == kUnbounded; }
  [[nodiscard]] std::string str() const;  // "[1, inf]"
};

// Whether a tactic runs a problem: ok, or the first reason it does not.
struct Support {
  bool ok = true;
  std::string reason;  // why not, when !ok
  explicit operator bool() const { return ok; }
  static Support yes() { return {}; }
  static Support no(std::string why) { return {false, std::move(why)}; }
};

// Type-erased `void(const Args&)`: each op defines its own argument struct; running a tactic with
// another argument type is an mxq::Error, not undefined behaviour.
class TacticRunner {
 public:
  TacticRunner() = default;
  template <typename Args, typename Fn>
  static TacticRunner of(Fn fn) {
    TacticRunner runner;
    runner.args_type_ = &typeid(Args);
    runner.fn_ = [fn = std::move(fn)](const void* args) { fn(*static_cast<const Args*>(args)); };
    return runner;
  }
  template <typename Args>
  void operator()(const Args& args) const {
    if (args_type_ == nullptr || *args_type_ != typeid(Args)) {
      fail(ErrorCode::kInternal, "tactic run with the wrong argument type");
    }
    fn_(&args);
  }
  explicit operator bool() const { return static_cast<bool>(fn_); }

 private:
  const std::type_info* args_type_ = nullptr;
  std::function<void(const void*)> fn_;
};

struct Tactic {
  std::string op;
  Backend backend = Backend::kCpu;
  std::string variant;  // kernel variant, e.g. "blocked"
  TacticParams params;
  TokenRange tokens;
  // Bump when the variant's behaviour changes so that caches tuned with the old one go stale
  // (it enters the registry hash, hence the cache fingerprint).
  int version = 1;
  std::function<Support(const Problem&)> supports_fn;  // empty = supports every problem
  TacticRunner run;
  // The op's own object behind this tactic (e.g. the linear::LinearTactic it adopts, or a kernel
  // variant enum), so that an op serving a looked-up tactic can map it back to what it launches
  // with std::any_cast<T>(&native): no allocation, type-checked. Not part of the registry hash.
  std::any native;

  // "variant" or "variant[k=v,...]": how the tactic is named in cache files.
  [[nodiscard]] std::string id() const;
  [[nodiscard]] Support supports(const Problem& problem) const;
};

// Result of running a tactic once against the reference output.
struct CheckResult {
  bool ok = false;
  double error = 0;    // e.g. ||out - ref|| / ||ref||
  std::string detail;  // what was wrong, when !ok
};

// Inputs and reference output for one (problem, token count), owned by the op.
class Workload {
 public:
  virtual ~Workload() = default;
  // One call of the tactic on the current input set (timed by the autotuner).
  virtual void run(const Tactic& tactic) = 0;
  // Poisons the output, runs the tactic once and compares with the reference.
  virtual CheckResult check(const Tactic& tactic) = 0;
  // Moves to the next input set (rotating buffers larger than the last-level cache).
  virtual void rotate() {}
};

struct OpSpec {
  std::string name;
  Backend backend = Backend::kCpu;
  std::string description;
  std::vector<std::int64_t> buckets;  // see problem.h; power_of_two_buckets() by default
  std::string default_tactic;         // id of the tactic served when nothing better is known
  std::function<std::unique_ptr<Workload>(const Problem&, std::int64_t tokens)> make_workload;
};

}  // namespace mxq::tune
