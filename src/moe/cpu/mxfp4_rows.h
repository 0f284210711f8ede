// Tables for decoding MXFP4 (packed E2M1 pairs + one E8M0 scale per 32 elements) to doubles,
// exactly: value = e2m1(code) * 2^(scale - 127), E8M0 0xFF decodes to NaN. Built once from the
// formats module's codecs; the tables only cache them.
#pragma once

#include <array>

namespace mxq::moe::cpu {

struct Mxfp4DecodeTables {
  std::array<double, 16> e2m1;    // code -> value
  std::array<double, 256> scale;  // E8M0 byte -> 2^(b - 127), NaN for 0xFF
};

const Mxfp4DecodeTables& mxfp4_decode_tables();

}  // namespace mxq::moe::cpu
