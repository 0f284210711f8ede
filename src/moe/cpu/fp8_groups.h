// W4A8 activations on the CPU reference: a GEMM input row replaced by its E4M3 group quantization
// (MoeConfig's ActivationQuant::kFp8Group128), dequantized exactly into doubles.
#pragma once

#include <cstdint>

namespace mxq::moe::cpu {

constexpr std::int64_t kActivationGroup = 128;

// values[0, n): float-representable numbers (bf16 activations held as doubles). Each group of
// kActivationGroup (the last one may be shorter) becomes q * scale with scale =
// fp8_block_scale(amax) (fp32) and q = E4M3(value / scale), saturating round-to-nearest-even: the
// block-FP8 activation rule (quantize_fp8_groups). q * scale is exact in double. A NaN or Inf
// makes its whole group NaN, as the block-FP8 quantizer does.
void quantize_dequantize_fp8_groups(double* values, std::int64_t n);

}  // namespace mxq::moe::cpu
