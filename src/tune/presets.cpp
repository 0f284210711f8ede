#include "mxq/tune/presets.h"

#include <set>
#include <string>
#include <vector>

#include "mxq/core/error.h"

namespace mxq::tune {

std::span<const DeploymentPreset> deployment_presets() {
  static const std::vector<DeploymentPreset> presets = [] {
    std::vector<DeploymentPreset> all;
    register_builtin_presets(all);
    std::set<std::string> names;
    for (const DeploymentPreset& preset : all) {
      MXQ_CHECK(names.insert(preset.name).second, ErrorCode::kInternal,
                "two built-in presets are named ", preset.name);
    }
    return all;
  }();
  return presets;
}

const DeploymentPreset& find_preset(std::span<const DeploymentPreset> presets,
                                    std::string_view name) {
  std::string known;
  for (const DeploymentPreset& preset : presets) {
    if (preset.name == name) return preset;
    known += (known.empty() ? "" : ", ") + preset.name;
  }
  fail_argument(ErrorCode::kInvalidArgument, "preset", "one of " + known,
                std::string("'").append(name).append("'"));
}

const DeploymentPreset& find_preset(std::string_view name) {
  return find_preset(deployment_presets(), name);
}

std::int64_t split_evenly(std::int64_t size, int parts, std::string_view what) {
  if (parts < 1 || size % parts != 0) {
    fail_argument(ErrorCode::kInvalidArgument, "parallel split of " + std::string(what),
                  "a divisor of " + std::to_string(size), parts);
  }
  return size / parts;
}

}  // namespace mxq::tune
