// The CUDA MoE forward's grouped-GEMM variants, named without CUDA (the engine-facing op, the
// tuner and the CLI name them in builds without CUDA too).
#pragma once

#include <optional>
#include <string_view>

namespace mxq::moe::gpu {

// The grouped GEMMs' variants (measured in docs/perf-log/moe-decode.md and moe-prefill.md):
//   kDecodeMma:    decode (few slots per expert): each lane loads its 16-byte MX blocks straight
//                  into registers, one 128-wide K chunk ahead of the tensor-core work, and feeds
//                  the decoded bf16 fragments to mma.sync m16n8k16 in 8-slot work tiles, 16-slot
//                  ones (two mma a fragment) from 8 expected slots per expert (W4A8: E4M3
//                  fragments to mma.sync m16n8k32, 8-slot tiles); split-K over the block's warps.
//   kPrefillWgmma: prefill: 128-slot work tiles, the decoded weights the register A operand of
//                  Hopper's wgmma (64 rows x up to 128 slots x 16 per instruction), the
//                  activations and weights brought by a TMA producer warp (the fastest from ~12
//                  slots per expert on; the default there). W4A8: FP8 wgmma (m64 x n x k32) on
//                  weights decoded to E4M3 with the MX block scales folded in.
//   kAuto:         the dispatch rule (resolve_gemm_variant): prefill_wgmma from
//                  kPrefillMinSlotsPerExpert expected slots per expert (T * top_k / E), else
//                  decode_mma — the crossover measured on an H200 for W4A16 (W4A8 takes the same
//                  rule; its own crossover is not measured yet).
// (The numbers are kept from the variants' first definition; they are not part of any file.)
enum class GemmVariant : int {
  kDecodeMma = 0,
  kAuto = 3,
  kPrefillWgmma = 4,
};
// "decode_mma", "prefill_wgmma", "auto"; gemm_variant_from_string is its inverse (nullopt for
// any other text).
const char* to_string(GemmVariant variant);
std::optional<GemmVariant> gemm_variant_from_string(std::string_view text);
inline constexpr int kPrefillMinSlotsPerExpert = 12;

// What a CUDA MoE forward of some token count runs (kAuto resolved), and whether an autotuner's
// cache chose it (MoeGpuLayer::gemm_choice, MoeDistLayer::gemm_choice).
struct GemmChoice {
  GemmVariant gemm = GemmVariant::kDecodeMma;
  bool from_tuner = false;
};

}  // namespace mxq::moe::gpu
