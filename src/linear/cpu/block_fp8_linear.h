// CPU kernels of the block-FP8 linear op (internal). Both read LinearOperands on the host.
//  * linear_reference: THE reference. Dequantizes every element exactly in fp64
//    (e4m3 value * fp32 scale), accumulates over K in fp64, adds the bias, rounds once to the
//    output type (bf16 via round-to-odd then round-to-nearest-even, which equals one correct
//    rounding of the fp64 sum).
//  * linear_blocked_f32: a faster alternative with the GPU kernels' numerics: per K-block fp32
//    dot products of the decoded codes, promoted with a_scale * w_scale into fp32.
#pragma once

#include <cstdint>

#include "mxq/linear/problem.h"
#include "mxq/linear/tactic.h"

namespace mxq::linear::cpu {

void linear_reference(const LinearOperands& operands, const LinearProblem& problem);
void linear_blocked_f32(const LinearOperands& operands, const LinearProblem& problem, int tile_n);

// One correct rounding of a double to bf16 (bits).
std::uint16_t double_to_bf16_bits(double value);

}  // namespace mxq::linear::cpu
