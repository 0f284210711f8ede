// The per-M summary of `mxq bench linear` (linear_summary.h).
#include "linear_summary.h"

#include <cmath>
#include <map>
#include <string>

namespace mxq::bench {
namespace {

bool is_dispatch_choice(const nlohmann::json& timing) {
  const std::string name = timing.value("name", std::string());
  return timing.value("blocks", std::string()) == "128x128" && name.size() >= 2 &&
         name.compare(name.size() - 2, 2, " *") == 0 && timing.contains("speedup_vs_cublaslt");
}

struct Ratios {
  double log_sum = 0.0;
  int count = 0;
  double min = 0.0;
  std::string min_at;
  // cuBLASLt µs / the read floor's µs, at the points that have both.
  double floor_log_sum = 0.0;
  int floor_count = 0;
};

}  // namespace

nlohmann::json summarize_linear_points(const nlohmann::json& points) {
  std::map<int, Ratios> by_m;
  for (const auto& point : points) {
    for (const auto& timing : point.value("timings", nlohmann::json::array())) {
      if (!is_dispatch_choice(timing)) continue;
      const double ratio = timing["speedup_vs_cublaslt"].get<double>();
      Ratios& r = by_m[point["m"].get<int>()];
      if (r.count == 0 || ratio < r.min) {
        r.min = ratio;
        r.min_at =
            std::to_string(point["n"].get<int>()) + "x" + std::to_string(point["k"].get<int>());
      }
      r.log_sum += std::log(ratio);
      ++r.count;
      // cuBLASLt's µs is the choice's µs times its speed-up over cuBLASLt.
      const double floor_us =
          point.contains("read_floor") ? point["read_floor"].value("total_us", 0.0) : 0.0;
      const double chosen_us = timing.value("us", 0.0);
      if (floor_us > 0.0 && chosen_us > 0.0) {
        r.floor_log_sum += std::log(ratio * chosen_us / floor_us);
        ++r.floor_count;
      }
    }
  }
  nlohmann::json summary = nlohmann::json::array();
  for (const auto& [m, r] : by_m) {
    nlohmann::json entry = {{"m", m},
                            {"shapes", r.count},
                            {"geomean_vs_cublaslt", std::exp(r.log_sum / r.count)},
                            {"min_vs_cublaslt", r.min},
                            {"min_at", r.min_at}};
    if (r.floor_count == r.count) {
      entry["read_floor_geomean_vs_cublaslt"] = std::exp(r.floor_log_sum / r.floor_count);
    }
    summary.push_back(std::move(entry));
  }
  return summary;
}

}  // namespace mxq::bench
