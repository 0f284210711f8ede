// Statistics of timed samples, one definition for the tuner and the benchmarks.
#pragma once

#include <algorithm>
#include <limits>
#include <vector>

namespace mxq {

// The median: the middle sample, or the mean of the two middle ones of an even count; NaN for no
// samples.
template <typename T>
double median(std::vector<T> samples) {
  if (samples.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::sort(samples.begin(), samples.end());
  const std::size_t n = samples.size();
  return n % 2 == 1 ? static_cast<double>(samples[n / 2])
                    : 0.5 * (static_cast<double>(samples[n / 2 - 1]) +
                             static_cast<double>(samples[n / 2]));
}

}  // namespace mxq
