// The device build of the format codecs against the host build: every encoder on all 2^32 fp32
// bit patterns, every decoder on all codes, MXFP4 blocks and FP8 block scales on random inputs.
// The kernels also compare against CUDA's own device conversions (cuda_fp4.h / cuda_fp8.h;
// E4M3 saturating is the sm_89+ `cvt.rn.satfinite` instruction there). Label `gpu`.
#include <cuda_fp4.h>
#include <cuda_fp8.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "mxq/core/cuda_check.h"
#include "mxq/core/parallel.h"
#include "mxq/core/tensor.h"
#include "mxq/formats/e2m1.h"
#include "mxq/formats/e4m3.h"
#include "mxq/formats/e8m0.h"
#include "mxq/formats/fp8_block.h"
#include "mxq/formats/mxfp4.h"

namespace mxq {
namespace {

constexpr int kEncoders = 5;
const char* const kEncoderNames[kEncoders] = {"e2m1", "e4m3 satfinite", "e4m3 nosat", "e8m0 floor",
                                              "e8m0 ceil"};

// Device memory owned for the duration of a test.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t bytes) { MXQ_CUDA_CHECK(cudaMalloc(&data_, bytes)); }
  ~DeviceBuffer() {  // a destructor cannot throw: report a failed cudaFree as a test failure
    const cudaError_t status = cudaFree(data_);
    if (status != cudaSuccess) ADD_FAILURE() << "cudaFree failed: " << cudaGetErrorString(status);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }

 private:
  void* data_ = nullptr;
};

MXQ_HD_INLINE void encode_all(float x, std::uint8_t* out) {
  out[0] = float_to_e2m1(x);
  out[1] = float_to_e4m3(x, Fp8Saturation::kSatFinite);
  out[2] = float_to_e4m3(x, Fp8Saturation::kNoSat);
  out[3] = float_to_e8m0(x, E8m0Rounding::kFloor);
  out[4] = float_to_e8m0(x, E8m0Rounding::kCeil);
}

// Encodes the inputs [base, base + count) with mxq's device codecs into out[e * count + i], and
// counts disagreements with CUDA's device conversions per encoder.
__global__ void encode_range(std::uint32_t base, std::uint32_t count, std::uint8_t* out,
                             unsigned long long* cuda_mismatches, std::uint32_t* first_mismatch) {
  const std::uint32_t stride = gridDim.x * blockDim.x;
  for (std::uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride) {
    const std::uint32_t bits = base + i;
    const float x = __uint_as_float(bits);
    std::uint8_t mine[kEncoders];
    encode_all(x, mine);
    const std::uint8_t cuda[kEncoders] = {
        static_cast<std::uint8_t>(__nv_cvt_float_to_fp4(x, __NV_E2M1, cudaRoundNearest)),
        static_cast<std::uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3)),
        static_cast<std::uint8_t>(__nv_cvt_float_to_fp8(x, __NV_NOSAT, __NV_E4M3)),
        static_cast<std::uint8_t>(__nv_cvt_float_to_e8m0(x, __NV_SATFINITE, cudaRoundZero)),
        static_cast<std::uint8_t>(__nv_cvt_float_to_e8m0(x, __NV_SATFINITE, cudaRoundPosInf))};
    for (int e = 0; e < kEncoders; ++e) {
      out[static_cast<std::size_t>(e) * count + i] = mine[e];
      if (mine[e] != cuda[e]) {
        atomicAdd(&cuda_mismatches[e], 1ULL);
        atomicMin(&first_mismatch[e], bits);
      }
    }
  }
}

TEST(CodecsGpu, EveryEncoderOnAllFloatsMatchesTheHostAndCuda) {
  constexpr std::uint32_t kChunk = 1U << 28;
  constexpr int kChunks = 16;  // 16 * 2^28 = 2^32 inputs
  DeviceBuffer out(static_cast<std::size_t>(kEncoders) * kChunk);
  DeviceBuffer cuda_mismatches(kEncoders * sizeof(unsigned long long));
  DeviceBuffer first_mismatch(kEncoders * sizeof(std::uint32_t));
  MXQ_CUDA_CHECK(cudaMemset(cuda_mismatches.as<void>(), 0, kEncoders * sizeof(unsigned long long)));
  MXQ_CUDA_CHECK(cudaMemset(first_mismatch.as<void>(), 0xFF, kEncoders * sizeof(std::uint32_t)));
  std::vector<std::uint8_t> host(static_cast<std::size_t>(kEncoders) * kChunk);
  std::array<std::atomic<std::uint64_t>, kEncoders> host_mismatches{};
  std::array<std::atomic<std::uint32_t>, kEncoders> first_host_mismatch{};
  for (auto& first : first_host_mismatch) first = 0xFFFFFFFFU;
  double device_seconds = 0;
  double host_seconds = 0;

  for (int chunk = 0; chunk < kChunks; ++chunk) {
    const std::uint32_t base = static_cast<std::uint32_t>(chunk) * kChunk;
    auto start = std::chrono::steady_clock::now();
    encode_range<<<4096, 256>>>(base, kChunk, out.as<std::uint8_t>(),
                                cuda_mismatches.as<unsigned long long>(),
                                first_mismatch.as<std::uint32_t>());
    MXQ_CUDA_CHECK_LAUNCH();
    MXQ_CUDA_CHECK(cudaMemcpy(host.data(), out.as<void>(), host.size(), cudaMemcpyDeviceToHost));
    auto mid = std::chrono::steady_clock::now();
    parallel_for(kChunk, 1 << 20, [&](std::int64_t begin, std::int64_t end) {
      std::array<std::uint64_t, kEncoders> local{};
      for (std::int64_t i = begin; i < end; ++i) {
        const std::uint32_t bits = base + static_cast<std::uint32_t>(i);
        float x = 0;
        std::memcpy(&x, &bits, sizeof(x));
        std::uint8_t mine[kEncoders];
        encode_all(x, mine);
        for (int e = 0; e < kEncoders; ++e) {
          if (host[static_cast<std::size_t>(e) * kChunk + static_cast<std::size_t>(i)] != mine[e]) {
            ++local[e];
            std::uint32_t seen = first_host_mismatch[e].load();
            while (bits < seen && !first_host_mismatch[e].compare_exchange_weak(seen, bits)) {
            }
          }
        }
      }
      for (int e = 0; e < kEncoders; ++e) host_mismatches[e] += local[e];
    });
    auto end = std::chrono::steady_clock::now();
    device_seconds += std::chrono::duration<double>(mid - start).count();
    host_seconds += std::chrono::duration<double>(end - mid).count();
  }

  std::array<unsigned long long, kEncoders> cuda_counts{};
  std::array<std::uint32_t, kEncoders> cuda_first{};
  MXQ_CUDA_CHECK(cudaMemcpy(cuda_counts.data(), cuda_mismatches.as<void>(), sizeof(cuda_counts),
                            cudaMemcpyDeviceToHost));
  MXQ_CUDA_CHECK(cudaMemcpy(cuda_first.data(), first_mismatch.as<void>(), sizeof(cuda_first),
                            cudaMemcpyDeviceToHost));
  std::printf("2^32 inputs x %d encoders: device + copy %.2f s, host check %.2f s\n", kEncoders,
              device_seconds, host_seconds);
  for (int e = 0; e < kEncoders; ++e) {
    EXPECT_EQ(host_mismatches[e].load(), 0U)
        << kEncoderNames[e] << ": device != host, first at input 0x" << std::hex
        << first_host_mismatch[e].load();
    EXPECT_EQ(cuda_counts[e], 0U) << kEncoderNames[e] << ": device != CUDA's device conversion, "
                                  << "first at input 0x" << std::hex << cuda_first[e];
  }
}

// Decoders on all codes: [0, 256) e4m3, [256, 512) e8m0, [512, 528) e2m1 as fp32 bits, and the
// same from CUDA's device conversions; plus e2m1_to_e4m3 on the 16 codes.
__global__ void decode_all(std::uint32_t* mine, std::uint32_t* cuda, std::uint8_t* e2m1_as_e4m3) {
  const int c = static_cast<int>(threadIdx.x);  // one block of 256 threads
  const auto code = static_cast<std::uint8_t>(c);
  mine[c] = __float_as_uint(e4m3_to_float(code));
  cuda[c] = __float_as_uint(__half2float(__half(__nv_cvt_fp8_to_halfraw(code, __NV_E4M3))));
  mine[256 + c] = __float_as_uint(e8m0_to_float(code));
  cuda[256 + c] = static_cast<std::uint32_t>(__nv_cvt_e8m0_to_bf16raw(code).x) << 16;
  if (c < 16) {
    mine[512 + c] = __float_as_uint(e2m1_to_float(code));
    cuda[512 + c] = __float_as_uint(__half2float(__half(__nv_cvt_fp4_to_halfraw(code, __NV_E2M1))));
    e2m1_as_e4m3[c] = e2m1_to_e4m3(code);
  }
}

bool is_nan_bits(std::uint32_t bits) { return (bits & 0x7FFFFFFFU) > 0x7F800000U; }

TEST(CodecsGpu, EveryDecoderOnAllCodesMatchesTheHostAndCuda) {
  DeviceBuffer mine(528 * sizeof(std::uint32_t));
  DeviceBuffer cuda(528 * sizeof(std::uint32_t));
  DeviceBuffer table(16);
  decode_all<<<1, 256>>>(mine.as<std::uint32_t>(), cuda.as<std::uint32_t>(),
                         table.as<std::uint8_t>());
  MXQ_CUDA_CHECK_LAUNCH();
  std::vector<std::uint32_t> device(528);
  std::vector<std::uint32_t> device_cuda(528);
  std::vector<std::uint8_t> device_table(16);
  MXQ_CUDA_CHECK(cudaMemcpy(device.data(), mine.as<void>(), 528 * 4, cudaMemcpyDeviceToHost));
  MXQ_CUDA_CHECK(cudaMemcpy(device_cuda.data(), cuda.as<void>(), 528 * 4, cudaMemcpyDeviceToHost));
  MXQ_CUDA_CHECK(cudaMemcpy(device_table.data(), table.as<void>(), 16, cudaMemcpyDeviceToHost));
  const auto host_bits = [](float value) {
    std::uint32_t bits = 0;
    std::memcpy(&bits, &value, sizeof(bits));
    return bits;
  };
  for (int c = 0; c < 528; ++c) {
    const auto code = static_cast<std::uint8_t>(c & 0xFF);
    const std::uint32_t host = c < 256 ? host_bits(e4m3_to_float(code))
                               : c < 512
                                   ? host_bits(e8m0_to_float(code))
                                   : host_bits(e2m1_to_float(static_cast<std::uint8_t>(c - 512)));
    EXPECT_EQ(device[c], host) << "decoder entry " << c;
    if (is_nan_bits(device_cuda[c])) {
      EXPECT_TRUE(is_nan_bits(device[c])) << "decoder entry " << c;
    } else {
      EXPECT_EQ(device[c], device_cuda[c]) << "decoder entry " << c;
    }
  }
  for (int c = 0; c < 16; ++c) {
    EXPECT_EQ(device_table[c], e2m1_to_e4m3(static_cast<std::uint8_t>(c))) << c;
  }
}

__global__ void mxfp4_blocks(const float* x, std::int64_t blocks, ScaleRule rule,
                             std::uint8_t* packed, std::uint8_t* scales, float* dequantized) {
  const std::int64_t b = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= blocks) return;
  quantize_mxfp4_block(x + b * kMxfp4BlockSize, packed + b * kMxfp4PackedBlockBytes, scales + b,
                       rule);
  dequantize_mxfp4_block(packed + b * kMxfp4PackedBlockBytes, scales[b],
                         dequantized + b * kMxfp4BlockSize);
}

TEST(CodecsGpu, Mxfp4BlocksMatchTheHostTensorApi) {
  constexpr std::int64_t kBlocks = 1 << 20;  // 33.5M elements
  Tensor x = Tensor::empty(DType::kF32, {kBlocks, kMxfp4BlockSize});
  std::mt19937_64 rng(1);
  std::normal_distribution<float> normal(0.0F, 1.0F);
  std::uniform_int_distribution<int> binade(-140, 120);
  float* values = x.data_as<float>();
  for (std::int64_t b = 0; b < kBlocks; ++b) {
    const int block_binade = binade(rng);
    for (int i = 0; i < kMxfp4BlockSize; ++i) {
      values[b * 32 + i] = std::ldexp(normal(rng), block_binade + (i % 5 == 0 ? -20 : 0));
    }
    if (b % 1000 == 1) values[b * 32 + b % 32] = std::nanf("");
    if (b % 1000 == 2) values[b * 32 + b % 32] = -INFINITY;
    if (b % 1000 == 3) std::fill(values + b * 32, values + b * 32 + 32, -0.0F);
  }
  DeviceBuffer device_x(static_cast<std::size_t>(x.nbytes()));
  DeviceBuffer packed(kBlocks * kMxfp4PackedBlockBytes);
  DeviceBuffer scales(kBlocks);
  DeviceBuffer dequantized(static_cast<std::size_t>(x.nbytes()));
  MXQ_CUDA_CHECK(cudaMemcpy(device_x.as<void>(), x.data(), x.nbytes(), cudaMemcpyHostToDevice));
  for (ScaleRule rule : {ScaleRule::kFloor, ScaleRule::kCeil}) {
    mxfp4_blocks<<<kBlocks / 256, 256>>>(device_x.as<float>(), kBlocks, rule,
                                         packed.as<std::uint8_t>(), scales.as<std::uint8_t>(),
                                         dequantized.as<float>());
    MXQ_CUDA_CHECK_LAUNCH();
    std::vector<std::uint8_t> device_packed(kBlocks * kMxfp4PackedBlockBytes);
    std::vector<std::uint8_t> device_scales(kBlocks);
    std::vector<float> device_values(static_cast<std::size_t>(x.numel()));
    MXQ_CUDA_CHECK(cudaMemcpy(device_packed.data(), packed.as<void>(), device_packed.size(),
                              cudaMemcpyDeviceToHost));
    MXQ_CUDA_CHECK(cudaMemcpy(device_scales.data(), scales.as<void>(), device_scales.size(),
                              cudaMemcpyDeviceToHost));
    MXQ_CUDA_CHECK(cudaMemcpy(device_values.data(), dequantized.as<void>(), x.nbytes(),
                              cudaMemcpyDeviceToHost));
    const Mxfp4Tensor host = quantize_mxfp4(x, rule);
    const Tensor host_values = dequantize_mxfp4(host.blocks, host.scales);
    EXPECT_EQ(std::memcmp(device_packed.data(), host.blocks.data(), device_packed.size()), 0);
    EXPECT_EQ(std::memcmp(device_scales.data(), host.scales.data(), device_scales.size()), 0);
    std::int64_t value_mismatches = 0;
    for (std::int64_t i = 0; i < x.numel(); ++i) {
      const float d = device_values[static_cast<std::size_t>(i)];
      const float h = host_values.data_as<float>()[i];
      const bool same = std::isnan(h) ? std::isnan(d) : std::memcmp(&d, &h, sizeof(float)) == 0;
      value_mismatches += same ? 0 : 1;
    }
    EXPECT_EQ(value_mismatches, 0) << to_string(rule);
  }
}

__global__ void block_scales(const float* amax, std::int64_t count, ScaleMode mode, float* out) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) out[i] = fp8_block_scale(amax[i], mode);
}

TEST(CodecsGpu, Fp8BlockScalesMatchTheHost) {
  constexpr std::int64_t kCount = 1 << 26;
  std::vector<float> amax(kCount);
  std::mt19937_64 rng(2);
  for (std::int64_t i = 0; i < kCount; ++i) {
    auto bits = static_cast<std::uint32_t>(rng());
    if (i % 2 == 0) bits = (bits & 0x807FFFFFU) | (static_cast<std::uint32_t>(100 + i % 60) << 23);
    std::memcpy(&amax[static_cast<std::size_t>(i)], &bits, sizeof(float));
  }
  DeviceBuffer device_amax(kCount * sizeof(float));
  DeviceBuffer device_scales(kCount * sizeof(float));
  MXQ_CUDA_CHECK(cudaMemcpy(device_amax.as<void>(), amax.data(), kCount * sizeof(float),
                            cudaMemcpyHostToDevice));
  for (ScaleMode mode : {ScaleMode::kFp32, ScaleMode::kUe8m0}) {
    block_scales<<<kCount / 256, 256>>>(device_amax.as<float>(), kCount, mode,
                                        device_scales.as<float>());
    MXQ_CUDA_CHECK_LAUNCH();
    std::vector<float> scales(kCount);
    MXQ_CUDA_CHECK(cudaMemcpy(scales.data(), device_scales.as<void>(), kCount * sizeof(float),
                              cudaMemcpyDeviceToHost));
    std::int64_t mismatches = 0;
    for (std::int64_t i = 0; i < kCount; ++i) {
      const float h = fp8_block_scale(amax[static_cast<std::size_t>(i)], mode);
      const float d = scales[static_cast<std::size_t>(i)];
      const bool same = std::isnan(h) ? std::isnan(d) : std::memcmp(&d, &h, sizeof(float)) == 0;
      mismatches += same ? 0 : 1;
    }
    EXPECT_EQ(mismatches, 0) << to_string(mode);
  }
}

}  // namespace
}  // namespace mxq
