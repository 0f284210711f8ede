// `mxq info`: version, build options, visible GPUs, cache directory, every MXQ_* variable.
#include <cstdio>
#include <iostream>

#include "cli_util.h"
#include "commands.h"
#include "mxq/core/build_info.h"
#include "mxq/core/env.h"

namespace mxq::cli {
namespace {

std::string type_name(EnvType type) {
  switch (type) {
    case EnvType::kString:
      return "string";
    case EnvType::kPath:
      return "path";
    case EnvType::kInt:
      return "int";
    case EnvType::kBool:
      return "bool";
    case EnvType::kChoice:
      return "choice";
    case EnvType::kList:
      return "list";
  }
  return "?";
}

nlohmann::json collect_info() {
  const BuildInfo& build = build_info();
  const GpuQuery gpus = query_gpus();
  nlohmann::json out;
  out["version"] = build.version;
  out["build"] = {{"cuda", build.cuda},
                  {"cuda_arch", build.cuda_arch},
                  {"cuda_toolkit", build.cuda_toolkit},
                  {"nccl", build.nccl},
                  {"nccl_version", build.nccl_version},
                  {"compiler", build.compiler}};
  nlohmann::json gpu_list = nlohmann::json::array();
  for (const GpuInfo& gpu : gpus.gpus) {
    gpu_list.push_back({{"index", gpu.index},
                        {"name", gpu.name},
                        {"sm_count", gpu.sm_count},
                        {"compute_capability", std::to_string(gpu.compute_major) + "." +
                                                   std::to_string(gpu.compute_minor)},
                        {"memory_bytes", gpu.memory_bytes}});
  }
  out["gpus"] = gpu_list;
  out["gpu_note"] = gpus.note;
  out["driver_version"] = gpus.driver_version;
  out["runtime_version"] = gpus.runtime_version;
  out["cache_dir"] = cache_dir();
  nlohmann::json env = nlohmann::json::array();
  for (const EnvVarSpec& spec : env_registry()) {
    const auto raw = env_raw(spec.name);
    const std::string problem = env_validate(spec.name);
    nlohmann::json entry = {{"name", spec.name},
                            {"type", type_name(spec.type)},
                            {"set", raw.has_value()},
                            {"value", raw ? *raw : std::string(spec.default_value)},
                            {"default", spec.default_value},
                            {"meaning", spec.meaning}};
    if (!problem.empty()) entry["error"] = problem;
    env.push_back(entry);
  }
  out["environment"] = env;
  out["unknown_environment"] = env_unknown_variables();
  return out;
}

void print_human(const nlohmann::json& info) {
  std::cout << "mxq " << info["version"].get<std::string>() << "\n";
  const auto& build = info["build"];
  std::cout << "build: CUDA " << (build["cuda"].get<bool>() ? "on" : "off");
  if (build["cuda"].get<bool>()) {
    std::cout << " (" << build["cuda_arch"].get<std::string>() << ", toolkit "
              << build["cuda_toolkit"].get<std::string>() << ")";
  }
  std::cout << ", NCCL " << (build["nccl"].get<bool>() ? "on" : "off");
  if (build["nccl"].get<bool>())
    std::cout << " (" << build["nccl_version"].get<std::string>() << ")";
  std::cout << ", " << build["compiler"].get<std::string>() << "\n";
  if (info["gpus"].empty()) {
    std::cout << "GPUs: none (" << info["gpu_note"].get<std::string>() << ")\n";
  } else {
    std::cout << "GPUs:\n";
    for (const auto& gpu : info["gpus"]) {
      std::printf("  [%d] %s, %d SMs, sm_%s, %.1f GiB\n", gpu["index"].get<int>(),
                  gpu["name"].get<std::string>().c_str(), gpu["sm_count"].get<int>(),
                  gpu["compute_capability"].get<std::string>().c_str(),
                  static_cast<double>(gpu["memory_bytes"].get<std::uint64_t>()) / (1ULL << 30));
    }
  }
  std::cout << "cache directory: " << info["cache_dir"].get<std::string>() << "\n";
  std::cout << "environment:\n";
  for (const auto& var : info["environment"]) {
    const std::string value =
        var["value"].get<std::string>().empty() ? "(unset)" : var["value"].get<std::string>();
    const std::string meaning = std::string(var["set"].get<bool>() ? "[set] " : "[default] ") +
                                var["meaning"].get<std::string>();
    // A value too long for its column (a path) keeps the column: the meaning goes below it.
    if (value.size() > 12) {
      std::printf("  %-22s = %s\n  %-22s   %-12s %s\n", var["name"].get<std::string>().c_str(),
                  value.c_str(), "", "", meaning.c_str());
    } else {
      std::printf("  %-22s = %-12s %s\n", var["name"].get<std::string>().c_str(), value.c_str(),
                  meaning.c_str());
    }
    if (var.contains("error"))
      std::printf("    error: %s\n", var["error"].get<std::string>().c_str());
  }
  for (const auto& name : info["unknown_environment"]) {
    std::printf("  warning: %s is set but mxq does not know it (typo?)\n",
                name.get<std::string>().c_str());
  }
}

}  // namespace

void register_info(CLI::App& app) {
  auto* cmd = app.add_subcommand("info",
                                 "Show version, build options, GPUs, cache directory and "
                                 "every MXQ_* environment variable");
  auto json = std::make_shared<bool>(false);
  cmd->add_flag("--json", *json, "Print machine-readable JSON");
  cmd->callback([json] {
    const nlohmann::json info = collect_info();
    if (*json) {
      print_json(info);
    } else {
      print_human(info);
    }
  });
}

}  // namespace mxq::cli
