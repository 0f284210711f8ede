// Statistics the benchmark drivers share.
#pragma once

#include <algorithm>
#include <vector>

namespace mxq::bench {

// The median of timed samples (the upper one of an even count); 0 for none.
template <typename T>
T median(std::vector<T> samples) {
  std::sort(samples.begin(), samples.end());
  return samples.empty() ? T{0} : samples[samples.size() / 2];
}

}  // namespace mxq::bench
