// The gated activations of the MoE layer, evaluated in double precision by the CPU reference
// (the forward pass rounds the result to fp32, then to bf16; see docs/moe.md).
#pragma once

#include <algorithm>
#include <cmath>

#include "mxq/moe/config.h"

namespace mxq::moe {

inline double sigmoid(double z) { return 1.0 / (1.0 + std::exp(-z)); }

// gpt-oss: g = min(g, L), u = clamp(u, -L, L), out = (u + 1) * g * sigmoid(alpha * g).
inline double swiglu_oai(double gate, double up, double alpha, double limit) {
  const double g = std::min(gate, limit);
  const double u = std::clamp(up, -limit, limit);
  return (u + 1.0) * g * sigmoid(alpha * g);
}

// DeepSeek-V4: silu(min(g, L)) * clamp(u, -L, L).
inline double swiglu_clamp(double gate, double up, double limit) {
  const double g = std::min(gate, limit);
  return g * sigmoid(g) * std::clamp(up, -limit, limit);
}

// Plain SwiGLU: silu(g) * u.
inline double swiglu(double gate, double up) { return gate * sigmoid(gate) * up; }

inline double apply_activation(const MoeConfig& config, double gate, double up) {
  switch (config.activation) {
    case Activation::kSwigluOai:
      return swiglu_oai(gate, up, config.swiglu_alpha, config.swiglu_limit);
    case Activation::kSwigluClamp:
      return swiglu_clamp(gate, up, config.swiglu_limit);
    case Activation::kSwiglu:
      return swiglu(gate, up);
  }
  return 0.0;
}

}  // namespace mxq::moe
