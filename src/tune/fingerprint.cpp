#include "mxq/tune/fingerprint.h"

#include <fstream>
#include <thread>

#include "mxq/core/build_info.h"
#include "mxq/core/error.h"
#include "tune/hash.h"

namespace mxq::tune {
namespace {

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon == std::string::npos) break;
      std::string name = line.substr(colon + 1);
      const auto first = name.find_first_not_of(" \t");
      const auto last = name.find_last_not_of(" \t");
      if (first == std::string::npos) break;
      return name.substr(first, last - first + 1);
    }
  }
  return "unknown cpu";
}

}  // namespace

bool Fingerprint::numeric_field(std::string_view name) {
  return name == "cpu_threads" || name == "sm_count" || name == "driver_version" ||
         name == "runtime_version";
}

std::vector<std::pair<std::string, std::string>> Fingerprint::fields() const {
  return {{"backend", backend},
          {"device", device},
          {"cpu_threads", std::to_string(cpu_threads)},
          {"sm_count", std::to_string(sm_count)},
          {"compute_capability", compute_capability},
          {"driver_version", std::to_string(driver_version)},
          {"runtime_version", std::to_string(runtime_version)},
          {"mxq_version", mxq_version},
          {"registry_hash", registry_hash}};
}

std::vector<std::string> Fingerprint::differences(const Fingerprint& other) const {
  std::vector<std::string> out;
  const auto mine = fields();
  const auto theirs = other.fields();
  for (std::size_t i = 0; i < mine.size(); ++i) {
    if (mine[i].second != theirs[i].second) {
      out.push_back(mine[i].first + ": '" + mine[i].second + "' here, '" + theirs[i].second +
                    "' there");
    }
  }
  return out;
}

std::string Fingerprint::hash() const {
  std::string text;
  for (const auto& [name, value] : fields()) text += name + "=" + value + "\n";
  return detail::hex64(detail::fnv1a(text));
}

std::string Fingerprint::slug() const {
  std::string words;
  for (const char c : backend + " " + device) {
    const bool alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    if (alnum) {
      words.push_back(static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c));
    } else if (!words.empty() && words.back() != '-') {
      words.push_back('-');
    }
    if (words.size() >= 48) break;
  }
  while (!words.empty() && words.back() == '-') words.pop_back();
  return words + "-" + hash().substr(0, 12);
}

Fingerprint cpu_fingerprint(const TacticRegistry& registry) {
  Fingerprint fp;
  fp.backend = "cpu";
  fp.device = cpu_model_name();
  const unsigned threads = std::thread::hardware_concurrency();
  fp.cpu_threads = threads == 0 ? 1 : static_cast<int>(threads);
  fp.mxq_version = build_info().version;
  fp.registry_hash = registry.hash();
  return fp;
}

Fingerprint cuda_fingerprint(int device, const TacticRegistry& registry) {
  const GpuQuery query = query_gpus();
  for (const GpuInfo& gpu : query.gpus) {
    if (gpu.index != device) continue;
    Fingerprint fp;
    fp.backend = "cuda";
    fp.device = gpu.name;
    fp.sm_count = gpu.sm_count;
    fp.compute_capability =
        std::to_string(gpu.compute_major) + "." + std::to_string(gpu.compute_minor);
    fp.driver_version = query.driver_version;
    fp.runtime_version = query.runtime_version;
    fp.mxq_version = build_info().version;
    fp.registry_hash = registry.hash();
    return fp;
  }
  fail(ErrorCode::kUnsupported, "no fingerprint for GPU ", device, ": ",
       query.note.empty() ? "no such device" : query.note);
}

Fingerprint current_fingerprint(Backend backend, const TacticRegistry& registry, int device) {
  return backend == Backend::kCpu ? cpu_fingerprint(registry) : cuda_fingerprint(device, registry);
}

}  // namespace mxq::tune
