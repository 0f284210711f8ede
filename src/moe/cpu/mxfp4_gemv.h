// The hot loop of the MoE CPU reference: MXFP4 weight rows times a few fp64 vectors. Each row
// is decoded once (exactly, to fp64) and dotted with every vector using dot_fp64's order, so
// the result does not depend on how many vectors share a decode or on the instruction set.
// Compiled for AVX-512, AVX2 and baseline x86-64 (function multiversioning picks at run time).
#pragma once

#include <cstdint>

namespace mxq::moe::cpu {

// out[r * n + v] = dot_fp64(vectors[v], decoded row r, k) for r in [0, rows), v in [0, n).
// packed: rows x k/2 bytes; scales: rows x k/32 E8M0 bytes; k % 32 == 0; scratch: k doubles.
void mxfp4_rows_dot(const std::uint8_t* packed, const std::uint8_t* scales, std::int64_t rows,
                    std::int64_t k, const double* const* vectors, std::int64_t n, double* out,
                    double* scratch);

}  // namespace mxq::moe::cpu
