#include <algorithm>
#include <array>
#include <vector>

#include "linear/cpu/block_fp8_linear.h"
#include "mxq/core/parallel.h"
#include "mxq/formats/bf16.h"
#include "mxq/formats/e4m3.h"

namespace mxq::linear::cpu {
namespace {

std::array<float, 256> e4m3_table() {
  std::array<float, 256> table{};
  for (int code = 0; code < 256; ++code)
    table[code] = e4m3_to_float(static_cast<std::uint8_t>(code));
  return table;
}

}  // namespace

// For each tile of `tile_n` output columns: the weight tile of one K-block is decoded once,
// transposed to [k][column] so the inner loop runs along columns (vectorisable, no reduction);
// every row of x then forms fp32 partial sums for that K-block and promotes them with its scales.
void linear_blocked_f32(const LinearOperands& ops, const LinearProblem& problem, int tile_n) {
  const std::array<float, 256> decode = e4m3_table();
  const std::int64_t m_total = problem.m;
  const std::int64_t n_total = problem.n;
  const std::int64_t k_total = problem.k;
  const std::int64_t bn = problem.block.n;
  const std::int64_t bk = problem.block.k;
  const std::int64_t k_blocks = (k_total + bk - 1) / bk;
  const std::int64_t tn = tile_n;
  const std::int64_t tiles = (n_total + tn - 1) / tn;

  parallel_for(tiles, 1, [&](std::int64_t begin, std::int64_t end) {
    std::vector<float> w_tile(static_cast<std::size_t>(bk * tn));
    std::vector<float> result(static_cast<std::size_t>(m_total * tn));
    std::vector<float> partial(static_cast<std::size_t>(tn));
    std::vector<float> w_scale(static_cast<std::size_t>(tn));
    std::vector<float> x_row(static_cast<std::size_t>(bk));
    for (std::int64_t tile = begin; tile < end; ++tile) {
      const std::int64_t n0 = tile * tn;
      const std::int64_t cols = std::min(tn, n_total - n0);
      std::fill(result.begin(), result.end(), 0.0F);
      for (std::int64_t kb = 0; kb < k_blocks; ++kb) {
        const std::int64_t k0 = kb * bk;
        const std::int64_t kk = std::min(bk, k_total - k0);
        // Decode the weight tile (columns past `cols` stay 0).
        std::fill(w_tile.begin(), w_tile.end(), 0.0F);
        for (std::int64_t c = 0; c < cols; ++c) {
          const std::uint8_t* codes = ops.w + (n0 + c) * ops.ldw + k0;
          for (std::int64_t k = 0; k < kk; ++k)
            w_tile[static_cast<std::size_t>(k * tn + c)] = decode[codes[k]];
          w_scale[static_cast<std::size_t>(c)] = ops.w_scale[((n0 + c) / bn) * ops.w_scale_ld + kb];
        }
        for (std::int64_t m = 0; m < m_total; ++m) {
          const std::uint8_t* codes = ops.a + m * ops.lda + k0;
          for (std::int64_t k = 0; k < kk; ++k)
            x_row[static_cast<std::size_t>(k)] = decode[codes[k]];
          std::fill(partial.begin(), partial.end(), 0.0F);
          for (std::int64_t k = 0; k < kk; ++k) {
            const float xv = x_row[static_cast<std::size_t>(k)];
            const float* w_k = w_tile.data() + k * tn;
            for (std::int64_t c = 0; c < tn; ++c)
              partial[static_cast<std::size_t>(c)] += xv * w_k[c];
          }
          const float a_scale =
              ops.a_scale[kb * ops.a_scale_group_stride + m * ops.a_scale_row_stride];
          float* out_row = result.data() + m * tn;
          for (std::int64_t c = 0; c < cols; ++c) {
            out_row[c] += partial[static_cast<std::size_t>(c)] *
                          (a_scale * w_scale[static_cast<std::size_t>(c)]);
          }
        }
      }
      for (std::int64_t m = 0; m < m_total; ++m) {
        for (std::int64_t c = 0; c < cols; ++c) {
          const std::int64_t n = n0 + c;
          float value = result[static_cast<std::size_t>(m * tn + c)];
          if (ops.bias != nullptr) {
            value += ops.bias_dtype == DType::kF32
                         ? static_cast<const float*>(ops.bias)[n]
                         : bf16_to_float(static_cast<const std::uint16_t*>(ops.bias)[n]);
          }
          const std::int64_t offset = m * ops.ldo + n;
          if (problem.out_dtype == DType::kF32) {
            static_cast<float*>(ops.out)[offset] = value;
          } else {
            static_cast<std::uint16_t*>(ops.out)[offset] = float_to_bf16(value);
          }
        }
      }
    }
  });
}

}  // namespace mxq::linear::cpu
