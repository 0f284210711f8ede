#include "mxq/moe/gemm_variant.h"

#include "mxq/core/enum_names.h"

namespace mxq::moe::gpu {

namespace {
constexpr EnumNames<GemmVariant, 3> kGemmVariantNames{
    {{{GemmVariant::kAuto, "auto"},
      {GemmVariant::kDecodeMma, "decode_mma"},
      {GemmVariant::kPrefillWgmma, "prefill_wgmma"}}}};
}  // namespace

const char* to_string(GemmVariant variant) {
  // The table's names are literals: null-terminated.
  return kGemmVariantNames.name(variant).data();
}

std::optional<GemmVariant> gemm_variant_from_string(std::string_view text) {
  return kGemmVariantNames.find(text);
}

}  // namespace mxq::moe::gpu
