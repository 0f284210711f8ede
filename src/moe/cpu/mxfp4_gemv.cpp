#include "moe/cpu/mxfp4_gemv.h"

#include <cstring>

#include "moe/cpu/dot.h"
#include "moe/cpu/mxfp4_rows.h"

// The helpers below pass 64-byte vectors by value; they are internal and always inlined into
// the clones, so the psABI note about AVX-512 argument passing does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace mxq::moe::cpu {
namespace {

// Eight doubles: lane l of a vector is lane l of dot_fp64 (GCC vector extensions are
// elementwise IEEE operations, lowered to AVX-512, AVX2 or SSE2 by the clone being compiled).
using V8d = double __attribute__((vector_size(64)));
using V8l = std::int64_t __attribute__((vector_size(64)));
static_assert(kDotLanes == 8);

inline V8d load8(const double* p) {
  V8d v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline void store8(double* p, V8d v) { std::memcpy(p, &v, sizeof(v)); }

inline double sum_lanes(V8d s) {
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

// out[i] = table[codes[i]] over the 16-entry table (low, high): one two-register permutation
// (vpermt2pd on AVX-512) with GCC; clang (used only for static analysis) lacks
// __builtin_shuffle with run-time indices, so it gets the equivalent per-lane lookup.
inline V8d select16(V8d low, V8d high, V8l codes) {
#if defined(__clang__)
  V8d out;
  for (int i = 0; i < 8; ++i) out[i] = codes[i] < 8 ? low[codes[i]] : high[codes[i] - 8];
  return out;
#else
  return __builtin_shuffle(low, high, codes);
#endif
}

// Decodes a row of k elements: per block, the 16 E2M1 values times the block scale form a
// two-register table; each group of 8 elements (4 packed bytes, element 2j in the low nibble
// of byte j) selects from it with one permutation.
inline void decode_row(const Mxfp4DecodeTables& tables, const std::uint8_t* packed,
                       const std::uint8_t* scales, std::int64_t k, double* out) {
  const V8d low = load8(tables.e2m1.data());
  const V8d high = load8(tables.e2m1.data() + 8);
  const V8l shifts = {0, 4, 8, 12, 16, 20, 24, 28};
  for (std::int64_t block = 0; block < k / 32; ++block) {
    const double scale = tables.scale[scales[block]];
    const V8d table_low = low * scale;
    const V8d table_high = high * scale;
    for (int group = 0; group < 4; ++group) {
      std::uint32_t word;
      std::memcpy(&word, packed + block * 16 + group * 4, sizeof(word));  // little-endian
      const V8l codes = ((V8l{} + static_cast<std::int64_t>(word)) >> shifts) & 15;
      store8(out + block * 32 + group * 8, select16(table_low, table_high, codes));
    }
  }
}

// Four dot products sharing the loads of `row`.
inline void dot4(const double* const* vectors, const double* row, std::int64_t k, double* out) {
  V8d acc0 = {}, acc1 = {}, acc2 = {}, acc3 = {};
  const double* a0 = vectors[0];
  const double* a1 = vectors[1];
  const double* a2 = vectors[2];
  const double* a3 = vectors[3];
  for (std::int64_t i = 0; i < k; i += 8) {
    const V8d w = load8(row + i);
    acc0 += load8(a0 + i) * w;
    acc1 += load8(a1 + i) * w;
    acc2 += load8(a2 + i) * w;
    acc3 += load8(a3 + i) * w;
  }
  out[0] = sum_lanes(acc0);
  out[1] = sum_lanes(acc1);
  out[2] = sum_lanes(acc2);
  out[3] = sum_lanes(acc3);
}

inline double dot1(const double* a, const double* row, std::int64_t k) {
  V8d acc = {};
  for (std::int64_t i = 0; i < k; i += 8) acc += load8(a + i) * load8(row + i);
  return sum_lanes(acc);
}

}  // namespace

__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"))) void mxfp4_rows_dot(
    const std::uint8_t* packed, const std::uint8_t* scales, std::int64_t rows, std::int64_t k,
    const double* const* vectors, std::int64_t n, double* out, double* scratch) {
  const Mxfp4DecodeTables& tables = mxfp4_decode_tables();
  for (std::int64_t r = 0; r < rows; ++r) {
    decode_row(tables, packed + r * (k / 2), scales + r * (k / 32), k, scratch);
    std::int64_t v = 0;
    for (; v + 4 <= n; v += 4) dot4(vectors + v, scratch, k, out + r * n + v);
    for (; v < n; ++v) out[r * n + v] = dot1(vectors[v], scratch, k);
  }
}

}  // namespace mxq::moe::cpu
