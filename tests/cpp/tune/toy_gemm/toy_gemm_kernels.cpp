#include "tune/toy_gemm/toy_gemm_kernels.h"

#include <array>
#include <thread>
#include <vector>

#include "mxq/core/error.h"

namespace mxq::tune::toy_gemm {
namespace {

// Runs body(begin, end) over [0, count) split into `threads` contiguous parts, the first part
// on the calling thread.
template <typename Body>
void split(std::int64_t count, int threads, Body body) {
  if (threads <= 1 || count <= 1) {
    body(std::int64_t{0}, count);
    return;
  }
  std::vector<std::thread> workers;
  workers.reserve(static_cast<std::size_t>(threads - 1));
  for (int t = 1; t < threads; ++t) {
    workers.emplace_back([&, t] { body(count * t / threads, count * (t + 1) / threads); });
  }
  body(0, count / threads);
  for (auto& worker : workers) worker.join();
}

template <int kLanes>
float dot_unrolled(const float* x, const float* y, std::int64_t k) {
  std::array<float, kLanes> acc{};
  for (std::int64_t i = 0; i < k; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) acc[l] += x[i + l] * y[i + l];
  }
  float sum = 0;
  for (int l = 0; l < kLanes; ++l) sum += acc[l];
  return sum;
}

}  // namespace

void rowwise(const ToyGemmArgs& args) {
  for (std::int64_t t = 0; t < args.tokens; ++t) {
    const float* a = args.a + t * args.k;
    for (std::int64_t j = 0; j < args.n; ++j) {
      const float* w = args.w + j * args.k;
      float sum = 0;
      for (std::int64_t i = 0; i < args.k; ++i) sum += a[i] * w[i];
      args.out[t * args.n + j] = sum;
    }
  }
}

void unrolled(const ToyGemmArgs& args, int lanes) {
  MXQ_CHECK(args.k % lanes == 0, ErrorCode::kShapeMismatch, "toy_gemm unrolled: k=", args.k,
            " is not a multiple of lanes=", lanes);
  for (std::int64_t t = 0; t < args.tokens; ++t) {
    const float* a = args.a + t * args.k;
    for (std::int64_t j = 0; j < args.n; ++j) {
      const float* w = args.w + j * args.k;
      args.out[t * args.n + j] =
          lanes == 16 ? dot_unrolled<16>(a, w, args.k) : dot_unrolled<8>(a, w, args.k);
    }
  }
}

void column_tiled(const ToyGemmArgs& args, int bn, int threads) {
  MXQ_CHECK(args.n % bn == 0 && bn <= 8, ErrorCode::kShapeMismatch,
            "toy_gemm column_tiled: n=", args.n, " is not a multiple of bn=", bn);
  const std::int64_t tiles = args.n / bn;
  split(tiles, threads, [&](std::int64_t tile_begin, std::int64_t tile_end) {
    for (std::int64_t t = 0; t < args.tokens; ++t) {
      const float* a = args.a + t * args.k;
      for (std::int64_t tile = tile_begin; tile < tile_end; ++tile) {
        std::array<float, 8> acc{};
        const float* w = args.w + tile * bn * args.k;
        for (std::int64_t i = 0; i < args.k; ++i) {
          const float x = a[i];
          for (int c = 0; c < bn; ++c) acc[c] += x * w[c * args.k + i];
        }
        for (int c = 0; c < bn; ++c) args.out[t * args.n + tile * bn + c] = acc[c];
      }
    }
  });
}

void small_batch(const ToyGemmArgs& args, int threads) {
  MXQ_CHECK(args.tokens <= kMaxSmallBatchRows, ErrorCode::kOutOfRange,
            "toy_gemm small_batch: tokens=", args.tokens, " exceeds ", kMaxSmallBatchRows);
  split(args.n, threads, [&](std::int64_t j_begin, std::int64_t j_end) {
    for (std::int64_t j = j_begin; j < j_end; ++j) {
      std::array<float, kMaxSmallBatchRows> acc{};
      const float* w = args.w + j * args.k;
      for (std::int64_t i = 0; i < args.k; ++i) {
        const float y = w[i];
        for (std::int64_t t = 0; t < args.tokens; ++t) acc[t] += args.a[t * args.k + i] * y;
      }
      for (std::int64_t t = 0; t < args.tokens; ++t) args.out[t * args.n + j] = acc[t];
    }
  });
}

void row_parallel(const ToyGemmArgs& args, int threads) {
  MXQ_CHECK(args.tokens >= threads, ErrorCode::kOutOfRange,
            "toy_gemm row_parallel: tokens=", args.tokens, " is fewer than threads=", threads);
  MXQ_CHECK(args.k % 8 == 0, ErrorCode::kShapeMismatch, "toy_gemm row_parallel: k=", args.k,
            " is not a multiple of 8");
  split(args.tokens, threads, [&](std::int64_t t_begin, std::int64_t t_end) {
    for (std::int64_t t = t_begin; t < t_end; ++t) {
      const float* a = args.a + t * args.k;
      for (std::int64_t j = 0; j < args.n; ++j) {
        args.out[t * args.n + j] = dot_unrolled<8>(a, args.w + j * args.k, args.k);
      }
    }
  });
}

}  // namespace mxq::tune::toy_gemm
