#include "mxq/moe/rank_weights.h"

#include <cstring>

#include "moe/param_groups.h"
#include "mxq/core/enum_names.h"
#include "mxq/core/error.h"

namespace mxq::moe {

namespace {
constexpr EnumNames<MoeParam, 6> kMoeParamNames{{{{MoeParam::kW13, "w13"},
                                                  {MoeParam::kW13Scale, "w13_scale"},
                                                  {MoeParam::kW2, "w2"},
                                                  {MoeParam::kW2Scale, "w2_scale"},
                                                  {MoeParam::kW13Bias, "w13_bias"},
                                                  {MoeParam::kW2Bias, "w2_bias"}}}};
}  // namespace

std::string_view to_string(MoeParam param) { return kMoeParamNames.name(param); }

std::byte padding_byte(MoeParam param) {
  return (param == MoeParam::kW13Scale || param == MoeParam::kW2Scale) ? std::byte{127}
                                                                       : std::byte{0};
}

Shape MoeRankShape::shape_of(MoeParam param) const {
  const std::int64_t e = experts_local();
  const std::int64_t i = intermediate_size_per_partition_after_pad;
  switch (param) {
    case MoeParam::kW13:
      return {e, 2 * i, hidden / 2};
    case MoeParam::kW13Scale:
      return {e, 2 * i, hidden / 32};
    case MoeParam::kW2:
      return {e, hidden, i / 2};
    case MoeParam::kW2Scale:
      return {e, hidden, i / 32};
    case MoeParam::kW13Bias:
      return {e, 2 * i};
    case MoeParam::kW2Bias:
      return {e, hidden};
  }
  fail(ErrorCode::kInternal, "unknown MoE parameter");
}

DType MoeRankShape::dtype_of(MoeParam param) const {
  switch (param) {
    case MoeParam::kW13:
    case MoeParam::kW2:
      return DType::kU8;
    case MoeParam::kW13Scale:
    case MoeParam::kW2Scale:
      return DType::kE8M0;
    case MoeParam::kW13Bias:
    case MoeParam::kW2Bias:
      return DType::kBF16;
  }
  fail(ErrorCode::kInternal, "unknown MoE parameter");
}

MoeRankWeights::MoeRankWeights(std::int64_t hidden, bool has_bias, const TpShard& tp,
                               const EpShard& ep) {
  if (hidden <= 0 || hidden % 32 != 0) {
    fail_argument(ErrorCode::kInvalidArgument, "hidden_size", "a positive multiple of 32", hidden);
  }
  if (tp.width <= 0 || tp.width % 32 != 0 || tp.valid < 0 || tp.valid > tp.width) {
    fail_argument(ErrorCode::kInvalidArgument, "tp shard",
                  "width a positive multiple of 32 and 0 <= valid <= width", tp);
  }
  if (ep.count <= 0) fail_argument(ErrorCode::kInvalidArgument, "ep shard", "count >= 1", ep);
  shape_.hidden = hidden;
  shape_.has_bias = has_bias;
  shape_.tp = tp;
  shape_.ep = ep;
  shape_.intermediate_size_per_partition_after_pad = tp.width;
  for (MoeParam param : kAllMoeParams) {
    if (!has(param)) continue;
    const std::size_t nbytes = param_bytes(shape_, param, tp.width);
    storage_[index(param)] = Tensor::empty(DType::kU8, {static_cast<std::int64_t>(nbytes)});
    std::memset(storage_[index(param)].data(), static_cast<int>(padding_byte(param)), nbytes);
  }
}

std::size_t MoeRankWeights::index(MoeParam param) const { return static_cast<std::size_t>(param); }

bool MoeRankWeights::has(MoeParam param) const {
  return shape_.has_bias || (param != MoeParam::kW13Bias && param != MoeParam::kW2Bias);
}

TensorView MoeRankWeights::view(MoeParam param) const {
  if (!has(param)) {
    fail(ErrorCode::kInvalidArgument, "MoE rank weights: ", to_string(param),
         " requested but the layer has no biases");
  }
  return TensorView(storage_[index(param)].data(), shape_.dtype_of(param), shape_.shape_of(param));
}

std::size_t MoeRankWeights::capacity(MoeParam param) const {
  return has(param) ? storage_[index(param)].nbytes() : 0;
}

}  // namespace mxq::moe
