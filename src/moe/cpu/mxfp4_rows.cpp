#include "moe/cpu/mxfp4_rows.h"

#include <cstdint>

#include "mxq/formats/e2m1.h"
#include "mxq/formats/e8m0.h"

namespace mxq::moe::cpu {
namespace {

Mxfp4DecodeTables build_tables() {
  Mxfp4DecodeTables tables{};
  for (int c = 0; c < 16; ++c) {
    tables.e2m1[static_cast<std::size_t>(c)] = e2m1_to_float(static_cast<std::uint8_t>(c));
  }
  for (int b = 0; b < 256; ++b) {
    tables.scale[static_cast<std::size_t>(b)] = e8m0_to_float(static_cast<std::uint8_t>(b));
  }
  return tables;
}

}  // namespace

const Mxfp4DecodeTables& mxfp4_decode_tables() {
  static const Mxfp4DecodeTables tables = build_tables();  // constant: a cache of the codecs
  return tables;
}

}  // namespace mxq::moe::cpu
