#include "mxq/tune/options.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <ctime>
#include <filesystem>

#include "mxq/core/enum_names.h"
#include "mxq/core/env.h"
#include "mxq/core/error.h"
#include "tune/hash.h"

namespace mxq::tune {

namespace {
constexpr EnumNames<AutotuneMode, 4> kAutotuneModeNames{{{{AutotuneMode::kOff, "off"},
                                                          {AutotuneMode::kLoad, "load"},
                                                          {AutotuneMode::kTune, "tune"},
                                                          {AutotuneMode::kFresh, "fresh"}}}};
}  // namespace

std::string_view to_string(AutotuneMode mode) { return kAutotuneModeNames.name(mode); }

AutotuneMode autotune_mode_from_string(std::string_view text) {
  return kAutotuneModeNames.parse(text, "autotune mode");
}

AutotuneOptions AutotuneOptions::from_env() {
  AutotuneOptions options;
  options.mode = autotune_mode_from_string(env_string("MXQ_AUTOTUNE"));
  options.cache_path = env_string("MXQ_AUTOTUNE_CACHE");
  options.skip_ops = env_list("MXQ_AUTOTUNE_SKIP_OPS");
  const std::int64_t budget = env_int("MXQ_AUTOTUNE_BUDGET");
  if (budget < 0) {
    fail(ErrorCode::kInvalidArgument,
         "environment variable MXQ_AUTOTUNE_BUDGET: expected >= 0 "
         "seconds, found ",
         budget);
  }
  options.budget_seconds = static_cast<double>(budget);
  return options;
}

std::string deployment_key(const Deployment& deployment) {
  std::vector<std::string> problems = deployment.problems;
  std::sort(problems.begin(), problems.end());
  problems.erase(std::unique(problems.begin(), problems.end()), problems.end());
  std::string text = "model=" + deployment.model + "\ndraft=" + deployment.draft_model +
                     "\ntp=" + std::to_string(deployment.tp) +
                     "\nep=" + std::to_string(deployment.ep) + "\n";
  for (const std::string& p : problems) text += "problem=" + p + "\n";
  std::string name;
  for (const char c : deployment.model.empty() ? std::string("deployment") : deployment.model) {
    const bool keep = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                      c == '-' || c == '_' || c == '.';
    name.push_back(keep ? c : '_');
    if (name.size() >= 48) break;
  }
  return name + "-" + detail::hex64(detail::fnv1a(text));
}

std::string default_cache_path(const Fingerprint& fingerprint, const Deployment& deployment) {
  return cache_dir() + "/autotune/" + fingerprint.mxq_version + "/" + fingerprint.slug() + "/" +
         deployment_key(deployment) + ".json";
}

std::string fresh_run_path(const std::string& cache_path) {
  static std::atomic<unsigned> counter{0};
  const std::filesystem::path path(cache_path);
  char stamp[32];
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  std::strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%SZ", &tm);
  std::string name = path.stem().string() + "-" + stamp + "-" + std::to_string(::getpid());
  const unsigned n = counter.fetch_add(1);
  if (n > 0) name.append("-").append(std::to_string(n));
  return (path.parent_path() / "runs" / (name + ".json")).string();
}

}  // namespace mxq::tune
