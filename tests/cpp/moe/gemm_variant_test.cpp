// The CUDA MoE forward's GEMM variant names and its dispatch rule (gpu::resolve_gemm_variant),
// host-side: kAuto runs prefill_wgmma from kPrefillMinSlotsPerExpert expected slots per expert
// (T * top_k / router width) and decode_mma below; a concrete variant is kept as given.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "mxq/moe/cuda_moe.h"

namespace mxq::moe::gpu {
namespace {

#if MXQ_WITH_CUDA
MoeDeviceWeights gpt_oss_120b() {
  MoeDeviceWeights w;
  w.num_local_experts = 128;
  w.num_global_experts = 128;
  w.hidden = 2880;
  w.inter = 2880;
  w.inter_padded = 2944;
  return w;
}
#endif

TEST(GemmVariant, AutoRunsPrefillWgmmaFromTwelveSlotsPerExpert) {
#if !MXQ_WITH_CUDA
  GTEST_SKIP() << "built without CUDA";
#else
  const MoeDeviceWeights w = gpt_oss_120b();
  MoeParams p;  // kAuto by default, top-4
  EXPECT_EQ(p.gemm, GemmVariant::kAuto);
  EXPECT_EQ(kPrefillMinSlotsPerExpert, 12);
  EXPECT_EQ(resolve_gemm_variant(w, p, 1), GemmVariant::kDecodeMma);
  EXPECT_EQ(resolve_gemm_variant(w, p, 256), GemmVariant::kDecodeMma);
  EXPECT_EQ(resolve_gemm_variant(w, p, 383), GemmVariant::kDecodeMma);     // 11.97 per expert
  EXPECT_EQ(resolve_gemm_variant(w, p, 384), GemmVariant::kPrefillWgmma);  // 12
  EXPECT_EQ(resolve_gemm_variant(w, p, 4096), GemmVariant::kPrefillWgmma);
  p.top_k = 8;  // twice the slots per token
  EXPECT_EQ(resolve_gemm_variant(w, p, 192), GemmVariant::kPrefillWgmma);
  EXPECT_EQ(resolve_gemm_variant(w, p, 191), GemmVariant::kDecodeMma);
  // EP: the router width, not the local experts, spreads the slots.
  MoeDeviceWeights ep = w;
  ep.num_local_experts = 64;
  p.top_k = 4;
  EXPECT_EQ(resolve_gemm_variant(ep, p, 383), GemmVariant::kDecodeMma);
  // No router (precomputed routing on a layer without one): the local experts.
  MoeDeviceWeights no_router = w;
  no_router.num_global_experts = 0;
  no_router.num_local_experts = 8;
  EXPECT_EQ(resolve_gemm_variant(no_router, p, 24), GemmVariant::kPrefillWgmma);
  EXPECT_EQ(resolve_gemm_variant(no_router, p, 23), GemmVariant::kDecodeMma);
#endif
}

TEST(GemmVariant, ConcreteVariantsAreKept) {
#if !MXQ_WITH_CUDA
  GTEST_SKIP() << "built without CUDA";
#else
  const MoeDeviceWeights w = gpt_oss_120b();
  for (const GemmVariant v : {GemmVariant::kDecodeMma, GemmVariant::kPrefillWgmma}) {
    MoeParams p;
    p.gemm = v;
    EXPECT_EQ(resolve_gemm_variant(w, p, 1), v);
    EXPECT_EQ(resolve_gemm_variant(w, p, 4096), v);
  }
  EXPECT_EQ(std::string(to_string(GemmVariant::kAuto)), "auto");
  EXPECT_EQ(std::string(to_string(GemmVariant::kPrefillWgmma)), "prefill_wgmma");
  EXPECT_EQ(std::string(to_string(GemmVariant::kDecodeMma)), "decode_mma");
  for (const GemmVariant v :
       {GemmVariant::kAuto, GemmVariant::kDecodeMma, GemmVariant::kPrefillWgmma}) {
    EXPECT_EQ(gemm_variant_from_string(to_string(v)), v);
  }
  // The names of the variants measured and removed (docs/perf-log/) are not variants.
  for (const char* gone : {"register_stream", "shared_tile", "wide_tile", "wgmma_tile", ""}) {
    EXPECT_EQ(gemm_variant_from_string(gone), std::nullopt) << gone;
  }
#endif
}

// The forward's host-side checks (no device needed): the GEMM blocks copy a block's biases
// in 16-byte pieces, so bias arrays must be 16-byte aligned; null (no biases) is fine.
TEST(MoeForwardSupport, RequiresSixteenByteAlignedBiases) {
#if !MXQ_WITH_CUDA
  GTEST_SKIP() << "built without CUDA";
#else
  alignas(16) static std::uint16_t storage[64];  // never read: the check looks at addresses
  MoeDeviceWeights w = gpt_oss_120b();
  const MoeParams p;
  EXPECT_EQ(moe_forward_unsupported_reason(w, p), nullptr);  // no biases
  w.b13 = storage;
  w.b2 = storage + 8;
  EXPECT_EQ(moe_forward_unsupported_reason(w, p), nullptr);
  for (int which = 0; which < 2; ++which) {
    MoeDeviceWeights bad = w;
    (which == 0 ? bad.b13 : bad.b2) = storage + 1;  // 2 bytes past a 16-byte boundary
    const char* reason = moe_forward_unsupported_reason(bad, p);
    ASSERT_NE(reason, nullptr) << "bias " << which;
    EXPECT_NE(std::string(reason).find("16-byte aligned"), std::string::npos) << reason;
  }
#endif
}

}  // namespace
}  // namespace mxq::moe::gpu
