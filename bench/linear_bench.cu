// `mxq bench linear`: mxq's block-FP8 tactics against cuBLASLt's block-scaled FP8 GEMM
// (CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F activations x
// CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F weights, bf16 out) on identical device inputs, same
// run. Method: random E4M3 codes and scales generated on the GPU; several input sets rotated so the
// working set exceeds the 50 MB L2; each timed launch replayed from a CUDA graph (no host overhead
// between kernels), CUDA events around each, warm-up first, the median of `repeats` runs. The GEMM
// is timed on pre-quantized activations, which is what cuBLASLt gets.
//
// The op as engines call it, linear_into (the caller's output and workspace, nothing allocated),
// is timed the same way on the same operand sets, per activation input: pre-quantized with
// MN-major scales (read in place: the dispatch's GEMM alone, so its time matches that tactic's
// row), with row-major scales (plus the scale transpose) and bf16 (plus the quantization); and
// the host time of one eager call (argument checks, dispatch, launches).
#include "linear_bench.h"

#include "cublaslt_block_fp8.h"
#include "graph_timing.h"
#include "linear_summary.h"
#include "read_floor.h"
#include "require_gpu.h"

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <vector>

#include "mxq/core/cuda_check.h"
#include "mxq/core/error.h"
#include "mxq/core/statistics.h"
#include "mxq/formats/bf16.h"
#include "mxq/linear/dispatch.h"
#include "mxq/linear/linear.h"

namespace mxq::bench {
namespace {

using linear::BlockFp8Weight;
using linear::LinearTactic;

constexpr std::int64_t kWorkingSetBytes = 120LL << 20;  // > 2x the H200's 50 MB L2
constexpr int kMaxSets = 16;
// cuBLASLt's baseline runs at least this many rows (the first M of them the point's): cuBLASLt
// 13.1's block-scaled GEMM at M = 1, N = 7168, K = 16384 (its heuristic's split-K kernel
// nvjet_sm90_qqtst_128x128_128x6_4x1_v_bz_coopA_algo2_Avec128_Bblk128_splitK_TNT) stopped with
// an illegal address on an H100 (2026-12-05), and 96 MiB of spare workspace did not avoid it;
// M = 8 ran at every preset shape. Reading the weights dominates at such M, so 8 rows cost
// cuBLASLt what 1 does.
constexpr int kCublasMinRows = 8;

__device__ __forceinline__ std::uint64_t mix(std::uint64_t z) {
  z += 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// Random E4M3 codes, never NaN (0x7F / 0xFF).
__global__ void fill_e4m3(std::uint8_t* q, std::size_t n, std::uint64_t seed) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    std::uint8_t code = static_cast<std::uint8_t>(mix(seed + i));
    if ((code & 0x7F) == 0x7F) code ^= 1;
    q[i] = code;
  }
}

// Random positive scales in [2^-14, 2^-8) (zero past `valid` in each row of `ld`).
__global__ void fill_scales(float* s, std::size_t rows, std::size_t ld, std::size_t valid,
                            std::uint64_t seed) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < rows * ld;
       i += std::size_t{gridDim.x} * blockDim.x) {
    const float u = static_cast<float>(mix(seed ^ (i * 0x2545F4914F6CDD1DULL)) >> 40) / 16777216.0F;
    s[i] = (i % ld) < valid ? exp2f(-14.0F + 6.0F * u) : 0.0F;
  }
}

// Random bf16 activations in [-1, 1) (bits of a float with the low half dropped).
__global__ void fill_bf16(std::uint16_t* x, std::size_t n, std::uint64_t seed) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    const float u = static_cast<float>(mix(seed + i) >> 40) / 8388608.0F - 1.0F;
    x[i] = static_cast<std::uint16_t>(__float_as_uint(u) >> 16);
  }
}

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }
std::int64_t round_up(std::int64_t a, std::int64_t b) { return ceil_div(a, b) * b; }

unsigned fill_blocks(std::size_t n) {
  return static_cast<unsigned>(std::min<std::size_t>((n + 255) / 256, 4096));
}

// One set of operands: shared codes, scales for 128x128 weight blocks / 1x128 groups, and for
// 64x64 / 1x64. Activation scales are K-group major [G, M_pad] (what mxq's CUDA tactics and
// cuBLASLt's VEC128 mode read).
struct OperandSet {
  Tensor w;          // e4m3 [N, K]
  Tensor w_scale;    // f32 [ceil(N/128), ceil(K/128)]
  Tensor w_scale64;  // f32 [ceil(N/64), ceil(K/64)]
  Tensor a;          // e4m3 [M, K]
  Tensor a_scale;    // f32 [ceil(K/128), M_pad]
  Tensor a_scale64;  // f32 [ceil(K/64), M_pad]
  Tensor out;        // bf16 [M, N]
  // For linear_into: row-major activation scales f32 [M, ceil(K/128)] and bf16 activations
  // [M, K] (empty unless asked for).
  Tensor a_scale_rows;
  Tensor x_bf16;
  // For cuBLASLt when M < kCublasMinRows: a, a_scale and out with kCublasMinRows rows, the first
  // M of them a's and a_scale's (empty otherwise).
  Tensor cublas_a;
  Tensor cublas_a_scale;
  Tensor cublas_out;
};

OperandSet make_set(int m, int n, int k, std::uint64_t seed, bool with64, bool with_op_inputs) {
  const Device gpu = Device::cuda(0);
  const std::int64_t m_pad = round_up(m, 4);
  OperandSet s;
  s.w = Tensor::empty(DType::kE4M3, {n, k}, gpu);
  s.a = Tensor::empty(DType::kE4M3, {m, k}, gpu);
  s.w_scale = Tensor::empty(DType::kF32, {ceil_div(n, 128), ceil_div(k, 128)}, gpu);
  s.a_scale = Tensor::empty(DType::kF32, {ceil_div(k, 128), m_pad}, gpu);
  s.out = Tensor::empty(DType::kBF16, {m, n}, gpu);
  fill_e4m3<<<fill_blocks(s.w.numel()), 256>>>(static_cast<std::uint8_t*>(s.w.data()), s.w.numel(),
                                               seed);
  fill_e4m3<<<fill_blocks(s.a.numel()), 256>>>(static_cast<std::uint8_t*>(s.a.data()), s.a.numel(),
                                               seed + 1);
  fill_scales<<<fill_blocks(s.w_scale.numel()), 256>>>(s.w_scale.data_as<float>(),
                                                       s.w_scale.shape()[0], s.w_scale.shape()[1],
                                                       s.w_scale.shape()[1], seed + 2);
  fill_scales<<<fill_blocks(s.a_scale.numel()), 256>>>(s.a_scale.data_as<float>(),
                                                       s.a_scale.shape()[0], m_pad, m, seed + 3);
  if (with_op_inputs) {
    s.a_scale_rows = Tensor::empty(DType::kF32, {m, ceil_div(k, 128)}, gpu);
    s.x_bf16 = Tensor::empty(DType::kBF16, {m, k}, gpu);
    fill_scales<<<fill_blocks(s.a_scale_rows.numel()), 256>>>(
        s.a_scale_rows.data_as<float>(), s.a_scale_rows.shape()[0], s.a_scale_rows.shape()[1],
        s.a_scale_rows.shape()[1], seed + 6);
    fill_bf16<<<fill_blocks(s.x_bf16.numel()), 256>>>(static_cast<std::uint16_t*>(s.x_bf16.data()),
                                                      s.x_bf16.numel(), seed + 7);
  }
  if (with64) {
    s.w_scale64 = Tensor::empty(DType::kF32, {ceil_div(n, 64), ceil_div(k, 64)}, gpu);
    s.a_scale64 = Tensor::empty(DType::kF32, {ceil_div(k, 64), m_pad}, gpu);
    fill_scales<<<fill_blocks(s.w_scale64.numel()), 256>>>(
        s.w_scale64.data_as<float>(), s.w_scale64.shape()[0], s.w_scale64.shape()[1],
        s.w_scale64.shape()[1], seed + 4);
    fill_scales<<<fill_blocks(s.a_scale64.numel()), 256>>>(
        s.a_scale64.data_as<float>(), s.a_scale64.shape()[0], m_pad, m, seed + 5);
  }
  MXQ_CUDA_CHECK_LAUNCH();
  if (m < kCublasMinRows) {
    const std::int64_t groups = s.a_scale.shape()[0];
    s.cublas_a = Tensor::empty(DType::kE4M3, {kCublasMinRows, k}, gpu);
    s.cublas_a_scale = Tensor::empty(DType::kF32, {groups, kCublasMinRows}, gpu);
    s.cublas_out = Tensor::empty(DType::kBF16, {kCublasMinRows, n}, gpu);
    fill_e4m3<<<fill_blocks(s.cublas_a.numel()), 256>>>(
        static_cast<std::uint8_t*>(s.cublas_a.data()), s.cublas_a.numel(), seed + 8);
    fill_scales<<<fill_blocks(s.cublas_a_scale.numel()), 256>>>(
        s.cublas_a_scale.data_as<float>(), groups, kCublasMinRows, kCublasMinRows, seed + 9);
    MXQ_CUDA_CHECK_LAUNCH();
    MXQ_CUDA_CHECK(cudaMemcpy(s.cublas_a.data(), s.a.data(), s.a.nbytes(), cudaMemcpyDefault));
    MXQ_CUDA_CHECK(cudaMemcpy2D(s.cublas_a_scale.data(), kCublasMinRows * sizeof(float),
                                s.a_scale.data(), m_pad * sizeof(float), m * sizeof(float),
                                static_cast<std::size_t>(groups), cudaMemcpyDefault));
  }
  return s;
}

linear::LinearOperands operands_of(const OperandSet& s, bool blocks64, cudaStream_t stream) {
  linear::LinearOperands ops;
  ops.a = static_cast<const std::uint8_t*>(s.a.data());
  ops.lda = s.a.shape()[1];
  const Tensor& a_scale = blocks64 ? s.a_scale64 : s.a_scale;
  ops.a_scale = a_scale.data_as<float>();
  ops.a_scale_row_stride = 1;
  ops.a_scale_group_stride = a_scale.shape()[1];
  ops.w = static_cast<const std::uint8_t*>(s.w.data());
  ops.ldw = s.w.shape()[1];
  const Tensor& w_scale = blocks64 ? s.w_scale64 : s.w_scale;
  ops.w_scale = w_scale.data_as<float>();
  ops.w_scale_ld = w_scale.shape()[1];
  ops.out = s.out.data();
  ops.ldo = s.out.shape()[1];
  ops.stream = stream;
  return ops;
}

// cuBLASLt's view of an operand set (128x128 weight blocks, 1x128 activation groups).
BlockFp8GemmOperands cublas_operands(const OperandSet& s) {
  if (s.cublas_a.defined()) {
    return {s.cublas_a.data(), s.cublas_a_scale.data(), s.w.data(), s.w_scale.data(),
            s.cublas_out.data()};
  }
  return {s.a.data(), s.a_scale.data(), s.w.data(), s.w_scale.data(), s.out.data()};
}

// ||a - b|| / ||b|| over a's elements of two bf16 device matrices: `a` [rows, cols], `b`
// [rows_b >= rows, cols] row-major, or (b_transposed) its transpose stored column-major with
// rows_b rows (cuBLASLt's D = y^T of a padded problem).
double normalized_difference(const Tensor& a, const Tensor& b, bool b_transposed) {
  const Tensor ha = a.to(Device::cpu());
  const Tensor hb = b.to(Device::cpu());
  const auto* pa = reinterpret_cast<const std::uint16_t*>(ha.data());
  const auto* pb = reinterpret_cast<const std::uint16_t*>(hb.data());
  const std::int64_t rows = a.shape()[0];
  const std::int64_t cols = a.shape()[1];
  double diff = 0.0;
  double norm = 0.0;
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < cols; ++c) {
      const double x = bf16_to_float(pa[r * cols + c]);
      const double y = bf16_to_float(pb[b_transposed ? c * b.shape()[0] + r : r * cols + c]);
      diff += (x - y) * (x - y);
      norm += y * y;
    }
  }
  return norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

// The views linear_into takes for one operand set (128x128 weight blocks): the weight, the codes,
// the scales K-group major seen as an MN-major [M, G] view, the row-major scales, bf16 x.
struct OpViews {
  linear::BlockFp8Weight w;
  TensorView x_q;
  TensorView x_scale_mn_major;
  TensorView x_scale_rows;
  TensorView x;
  TensorView out;
};

OpViews op_views(const OperandSet& s) {
  const std::int64_t m = s.a.shape()[0];
  const std::int64_t groups = s.a_scale.shape()[0];
  OpViews v;
  v.w = linear::make_block_fp8_weight(Tensor::borrow(s.w, nullptr, "w"),
                                      Tensor::borrow(s.w_scale, nullptr, "w_scale"), {128, 128});
  v.x_q = s.a;
  v.x_scale_mn_major = TensorView(s.a_scale.data(), DType::kF32, Shape{m, groups},
                                  Shape{1, s.a_scale.shape()[1]}, s.a_scale.device());
  v.x_scale_rows = s.a_scale_rows;
  v.x = s.x_bf16;
  v.out = s.out;
  return v;
}

// linear_into per activation input, timed like the tactics (graphs, rotated sets, median), with
// one workspace of the largest size any input needs, allocated here, outside the timed calls.
nlohmann::json time_linear_into(const std::vector<OperandSet>& sets, int m, int n, int k,
                                int repeats, cudaStream_t stream, double cublas_us, double flops,
                                double bytes, bool progress) {
  std::vector<OpViews> views;
  for (const OperandSet& s : sets) views.push_back(op_views(s));
  const linear::ActivationInput inputs[] = {linear::ActivationInput::kFp8MnMajor,
                                            linear::ActivationInput::kFp8,
                                            linear::ActivationInput::kBf16};
  std::size_t workspace_bytes = 0;
  for (const linear::ActivationInput input : inputs) {
    workspace_bytes =
        std::max(workspace_bytes, linear::linear_workspace_bytes(m, views[0].w, input));
  }
  Tensor workspace_memory = Tensor::empty(
      DType::kU8, {std::max<std::int64_t>(1, static_cast<std::int64_t>(workspace_bytes))},
      Device::cuda(0));
  const TensorView workspace = workspace_memory.view();
  nlohmann::json rows = nlohmann::json::array();
  for (const linear::ActivationInput input : inputs) {
    linear::LinearRun ran;
    linear::LinearOptions options;
    options.ran = &ran;
    const auto call = [&](const OpViews& v, cudaStream_t st) {
      options.stream = st;
      if (input == linear::ActivationInput::kBf16) {
        linear::linear_into(v.x, v.w, nullptr, v.out, workspace, options);
      } else {
        const TensorView& scales =
            input == linear::ActivationInput::kFp8 ? v.x_scale_rows : v.x_scale_mn_major;
        linear::linear_into(v.x_q, scales, v.w, nullptr, v.out, workspace, options);
      }
    };
    const double us =
        time_us([&](int s, cudaStream_t st) { call(views[static_cast<std::size_t>(s)], st); },
                static_cast<int>(sets.size()), repeats, stream);
    // Host time of an eager call: back-to-back calls on the stream, no synchronization between.
    constexpr int kHostCalls = 50;
    MXQ_CUDA_CHECK(cudaStreamSynchronize(stream));
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < kHostCalls; ++i)
      call(views[static_cast<std::size_t>(i) % views.size()], stream);
    const double host_us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
            .count() /
        kHostCalls;
    MXQ_CUDA_CHECK(cudaStreamSynchronize(stream));
    nlohmann::json row;
    row["name"] = std::string("linear_into ") + std::string(linear::to_string(input));
    row["input"] = linear::to_string(input);
    row["tactic"] = ran.tactic != nullptr ? ran.tactic->name() : std::string();
    row["workspace_bytes"] = linear::linear_workspace_bytes(m, views[0].w, input);
    row["us"] = us;
    row["tflops"] = flops / (us * 1e-6) / 1e12;
    row["gbps"] = bytes / (us * 1e-6) / 1e9;
    row["host_us"] = host_us;
    if (cublas_us > 0.0) row["speedup_vs_cublaslt"] = cublas_us / us;
    rows.push_back(row);
    if (progress) {
      std::fprintf(stderr, "  N=%d K=%d M=%d %-30s %-8s %9.1f us (host %.1f us)\n", n, k, m,
                   row["name"].get<std::string>().c_str(), "128x128", us, host_us);
    }
  }
  // The MN-major call runs the dispatch's GEMM on the tactics' own operands: same bits.
  const OperandSet& s0 = sets[0];
  linear::LinearProblem p;
  p.m = m;
  p.n = n;
  p.k = k;
  linear::describe_device(p, Device::cuda(0));
  Tensor tactic_out = Tensor::empty(DType::kBF16, {m, n}, Device::cuda(0));
  linear::LinearOperands ops = operands_of(s0, false, stream);
  ops.out = tactic_out.data();
  linear::select_tactic(p).run(ops, p);
  linear::LinearOptions options;
  options.stream = stream;
  linear::linear_into(views[0].x_q, views[0].x_scale_mn_major, views[0].w, nullptr, views[0].out,
                      workspace, options);
  MXQ_CUDA_CHECK(cudaStreamSynchronize(stream));
  const Tensor a = tactic_out.to(Device::cpu());
  const Tensor b = s0.out.to(Device::cpu());
  nlohmann::json result;
  result["timings"] = rows;
  result["mn_major_output_equals_the_tactic"] = std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
  return result;
}

}  // namespace

std::vector<std::pair<int, int>> linear_preset_shapes(const std::string& preset) {
  if (preset == "deepseek-v3") {
    return {{2112, 7168}, {24576, 1536}, {32768, 512}, {7168, 16384}, {4096, 7168}, {7168, 2048}};
  }
  fail_argument(ErrorCode::kInvalidArgument, "--preset", "deepseek-v3", "'" + preset + "'");
}

// A byte range of a tensor for the read floor, cut to whole 16-byte units (a scale tensor's last
// few bytes may be left out: at most 12).
DeviceRange read_range(const Tensor& t) {
  return {t.data(), static_cast<std::size_t>(t.nbytes()) / 16 * 16};
}

// The read floor of one point: each input set's weights, weight scales, activations and
// activation scales read once by read_floor.h's streaming kernel (the sets rotated as the
// tactics' are), and how far the dispatch's tile on 128x128 blocks is above it.
nlohmann::json time_operand_read_floor(const std::vector<OperandSet>& operand_sets,
                                       const nlohmann::json& timings, int repeats,
                                       cudaStream_t stream, bool progress, int n, int k, int m) {
  std::vector<ReadPasses> sets;
  for (const OperandSet& s : operand_sets) {
    sets.push_back(
        {{read_range(s.w), read_range(s.w_scale), read_range(s.a), read_range(s.a_scale)}});
  }
  const ReadFloor floor = time_read_floor(sets, repeats, stream, [] {});
  nlohmann::json result = {{"bytes", floor.bytes},
                           {"total_us", floor.total_us},
                           {"in_graph_us", floor.in_graph_us},
                           {"gbps", floor.bytes / (floor.total_us * 1e-6) / 1e9},
                           {"blocks_per_sm", floor.blocks_per_sm}};
  for (const auto& t : timings) {
    const std::string name = t["name"].get<std::string>();
    if (t["blocks"] == "128x128" && name.ends_with(" *")) {
      result["dispatch_over_floor"] = t["us"].get<double>() / floor.total_us;
    }
  }
  if (progress) {
    std::fprintf(stderr, "  N=%d K=%d M=%d %-30s %-8s %9.1f us (%.0f GB/s)\n", n, k, m,
                 "read floor", "", floor.total_us, result["gbps"].get<double>());
  }
  return result;
}

// The compute ceiling of one point: cuBLASLt's FP8 GEMM on the same operands with one scale per
// tensor, so nothing is promoted inside K (what a block-scaled kernel pays on top of the MMAs).
// Its output is not compared (other numerics); only its time is read.
nlohmann::json time_per_tensor_ceiling(cublasLtHandle_t handle, void* workspace,
                                       const std::vector<OperandSet>& operand_sets, int m, int n,
                                       int k, int repeats, cudaStream_t stream, double flops,
                                       bool progress) {
  const int cublas_m = std::max(m, kCublasMinRows);
  CublasLtBlockFp8 gemm(handle, cublas_m, n, k, workspace, cublas_operands(operand_sets[0]),
                        Fp8Scaling::kPerTensor);
  if (!gemm.ok()) return {{"note", "cuBLASLt returned no algorithm for per-tensor FP8"}};
  const double us = time_us(
      [&](int s, cudaStream_t st) {
        gemm.run(cublas_operands(operand_sets[static_cast<std::size_t>(s)]), st);
      },
      static_cast<int>(operand_sets.size()), repeats, stream);
  if (progress) {
    std::fprintf(stderr, "  N=%d K=%d M=%d %-30s %-8s %9.1f us\n", n, k, m,
                 "cublaslt per-tensor (ceiling)", "", us);
  }
  return {{"name", "cublaslt per-tensor FP8"},
          {"us", us},
          {"tflops", flops / (us * 1e-6) / 1e12},
          {"orientation", gemm.transposed() ? "D=y^T" : "D=y"}};
}

nlohmann::json run_linear_bench(const LinearBenchOptions& options, bool progress) {
  require_gpu("linear");
  if (options.repeats < 20) {
    fail_argument(ErrorCode::kInvalidArgument, "--repeats", "at least 20", options.repeats);
  }
  const auto shapes =
      options.shapes.empty() ? linear_preset_shapes(options.preset) : options.shapes;
  cudaDeviceProp props{};
  MXQ_CUDA_CHECK(cudaGetDeviceProperties(&props, 0));
  cudaStream_t stream = nullptr;
  MXQ_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cublasLtHandle_t handle = nullptr;
  MXQ_CUBLASLT_CHECK(cublasLtCreate(&handle));
  Tensor workspace =
      Tensor::empty(DType::kU8, {static_cast<std::int64_t>(kCublasWorkspace)}, Device::cuda(0));

  nlohmann::json result;
  result["gpu"] = props.name;
  result["sm_count"] = props.multiProcessorCount;
  result["cublaslt_version"] = cublasLtGetVersion();
  result["preset"] = options.preset;  // "shapes" says which pairs ran (--shape replaces them)
  result["shapes"] = shapes;
  result["repeats"] = options.repeats;
  result["method"] =
      "random E4M3 codes and scales on the GPU; input sets rotated past the L2; CUDA graph per "
      "launch; CUDA events; median; GEMM on pre-quantized activations";
  nlohmann::json points = nlohmann::json::array();

  for (const auto& [n, k] : shapes) {
    for (const int m : options.m) {
      if (m < 1) fail_argument(ErrorCode::kInvalidArgument, "--m", "positive token counts", m);
      const std::int64_t set_bytes =
          static_cast<std::int64_t>(n) * k + static_cast<std::int64_t>(m) * k + 2LL * m * n;
      const int sets = static_cast<int>(
          std::clamp<std::int64_t>(ceil_div(kWorkingSetBytes, set_bytes), 1, kMaxSets));
      std::vector<OperandSet> operand_sets;
      for (int s = 0; s < sets; ++s) {
        operand_sets.push_back(make_set(m, n, k, 1000003ULL * static_cast<std::uint64_t>(s + 1),
                                        options.fallback_64, options.op));
      }
      MXQ_CUDA_CHECK(cudaDeviceSynchronize());
      const double flops = 2.0 * m * static_cast<double>(n) * k;
      const double bytes = static_cast<double>(set_bytes) +
                           4.0 * (ceil_div(n, 128) * ceil_div(k, 128) + ceil_div(k, 128) * m);
      nlohmann::json point;
      point["n"] = n;
      point["k"] = k;
      point["m"] = m;
      point["input_sets"] = sets;
      nlohmann::json timings = nlohmann::json::array();
      const auto record = [&](const std::string& name, const std::string& blocks, double us) {
        nlohmann::json t;
        t["name"] = name;
        t["blocks"] = blocks;
        t["us"] = us;
        t["tflops"] = flops / (us * 1e-6) / 1e12;
        t["gbps"] = bytes / (us * 1e-6) / 1e9;
        timings.push_back(t);
        if (progress) {
          std::fprintf(stderr, "  N=%d K=%d M=%d %-30s %-8s %9.1f us\n", n, k, m, name.c_str(),
                       blocks.c_str(), us);
        }
      };

      // cuBLASLt baseline.
      double cublas_us = 0.0;
      if (options.baseline) {
        const int cublas_m = std::max(m, kCublasMinRows);
        if (cublas_m != m) point["cublaslt_m"] = cublas_m;
        CublasLtBlockFp8 cublas(handle, cublas_m, n, k, workspace.data(),
                                cublas_operands(operand_sets[0]));
        if (cublas.ok()) {
          cublas_us = time_us(
              [&](int s, cudaStream_t st) {
                cublas.run(cublas_operands(operand_sets[static_cast<std::size_t>(s)]), st);
              },
              sets, options.repeats, stream);
          record(cublas.transposed() ? "cublaslt (y^T)" : "cublaslt", "128x128", cublas_us);
          point["cublaslt_orientation"] = cublas.transposed() ? "A=x VEC128, B=W BLK128x128, D=y^T"
                                                              : "A=W BLK128x128, B=x VEC128, D=y";
          // Agreement with mxq's choice on set 0 (same inputs).
          const OperandSet& s0 = operand_sets[0];
          Tensor mxq_out = Tensor::empty(DType::kBF16, {m, n}, Device::cuda(0));
          linear::LinearProblem p;
          p.m = m;
          p.n = n;
          p.k = k;
          linear::describe_device(p, Device::cuda(0));
          linear::LinearOperands ops = operands_of(s0, false, stream);
          ops.out = mxq_out.data();
          linear::select_tactic(p).run(ops, p);
          cublas.run(cublas_operands(s0), stream);
          MXQ_CUDA_CHECK(cudaStreamSynchronize(stream));
          const Tensor& cublas_out = s0.cublas_out.defined() ? s0.cublas_out : s0.out;
          point["cublaslt_vs_mxq_normalized_difference"] =
              normalized_difference(mxq_out, cublas_out, cublas.transposed());
        } else {
          point["cublaslt_note"] = "cuBLASLt returned no algorithm for block-scaled FP8";
        }
      }
      if (options.ceiling) {
        point["ceiling"] = time_per_tensor_ceiling(handle, workspace.data(), operand_sets, m, n, k,
                                                   options.repeats, stream, flops, progress);
      }

      // Every supported mxq tactic on 128x128 blocks, then the fallback on 64x64 blocks.
      for (const bool blocks64 : {false, true}) {
        if (blocks64 && !options.fallback_64) continue;
        linear::LinearProblem p;
        p.m = m;
        p.n = n;
        p.k = k;
        p.block = blocks64 ? BlockShape{64, 64} : BlockShape{128, 128};
        linear::describe_device(p, Device::cuda(0));
        const linear::Explanation explanation = linear::explain(p);
        const std::string chosen =
            explanation.chosen != nullptr ? explanation.chosen->name() : std::string();
        const auto asked = [&](const std::string& name) {
          if (options.tactics.empty()) return true;
          return std::ranges::find(options.tactics, name) != options.tactics.end() ||
                 (name == chosen &&
                  std::ranges::find(options.tactics, "auto") != options.tactics.end());
        };
        for (const auto& tactic : linear::linear_tactics()) {
          if (!asked(tactic->name()) || !tactic->supports(p)) continue;
          const double us = time_us(
              [&](int s, cudaStream_t st) {
                tactic->run(operands_of(operand_sets[static_cast<std::size_t>(s)], blocks64, st),
                            p);
              },
              sets, options.repeats, stream);
          record(tactic->name() + (tactic->name() == chosen ? " *" : ""),
                 blocks64 ? "64x64" : "128x128", us);
          if (cublas_us > 0.0 && !blocks64) timings.back()["speedup_vs_cublaslt"] = cublas_us / us;
        }
      }

      if (options.op) {
        point["op"] = time_linear_into(operand_sets, m, n, k, options.repeats, stream, cublas_us,
                                       flops, bytes, progress);
      }
      if (options.read_floor) {
        point["read_floor"] = time_operand_read_floor(operand_sets, timings, options.repeats,
                                                      stream, progress, n, k, m);
      }
      point["timings"] = timings;
      points.push_back(point);
    }
  }
  result["summary"] = summarize_linear_points(points);
  result["points"] = points;
  MXQ_CUBLASLT_CHECK(cublasLtDestroy(handle));
  MXQ_CUDA_CHECK(cudaStreamDestroy(stream));
  return result;
}

}  // namespace mxq::bench
