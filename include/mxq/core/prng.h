// A small deterministic PRNG for synthetic weights and inputs: SplitMix64 for seeding and
// xoshiro256** for streams. Unlike std:: distributions, its output is the same on every
// platform and standard library, so synthetic checkpoints are reproducible bit for bit.
#pragma once

#include <cstdint>
#include <initializer_list>

namespace mxq {

inline std::uint64_t splitmix64(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// A seed for an independent stream, derived from a list of integers (seed, layer, tensor, ...).
inline std::uint64_t stream_seed(std::initializer_list<std::uint64_t> parts) {
  std::uint64_t state = 0x6D78712D73796E74ULL;  // "mxq-synt"
  std::uint64_t mixed = 0;
  for (std::uint64_t part : parts) {
    state ^= part;
    mixed = splitmix64(state);
  }
  return mixed;
}

class Xoshiro256 {
 public:
  explicit Xoshiro256(std::uint64_t seed) {
    for (auto& word : state_) word = splitmix64(seed);
  }
  std::uint64_t next() {
    const std::uint64_t result = rotl(state_[1] * 5, 7) * 9;
    const std::uint64_t t = state_[1] << 17;
    state_[2] ^= state_[0];
    state_[3] ^= state_[1];
    state_[1] ^= state_[2];
    state_[0] ^= state_[3];
    state_[2] ^= t;
    state_[3] = rotl(state_[3], 45);
    return result;
  }
  // Uniform in [-1, 1), a multiple of 2^-23 (exact in fp32).
  float uniform_symmetric() { return static_cast<float>(next() >> 40) * 0x1.0p-23F - 1.0F; }

 private:
  static std::uint64_t rotl(std::uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  std::uint64_t state_[4];
};

}  // namespace mxq
