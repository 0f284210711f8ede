// What this build of mxq is (version, CUDA and NCCL support) and which GPUs the process can see.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mxq {

struct BuildInfo {
  std::string version;       // e.g. "0.1.0"
  bool cuda = false;         // built with CUDA kernels
  std::string cuda_arch;     // e.g. "sm_90a"; empty without CUDA
  std::string cuda_toolkit;  // toolkit version mxq was compiled with; empty without CUDA
  bool nccl = false;         // built with the NCCL communicator (mxq/dist/nccl.h)
  std::string nccl_version;  // nccl.h version mxq was compiled with; empty without NCCL
  std::string compiler;
};

struct GpuInfo {
  int index = 0;
  std::string name;
  int sm_count = 0;
  int compute_major = 0;
  int compute_minor = 0;
  std::uint64_t memory_bytes = 0;
};

struct GpuQuery {
  std::vector<GpuInfo> gpus;
  std::string note;  // why the list is empty (no CUDA build, no driver, no device), else empty
  int driver_version = 0;
  int runtime_version = 0;
};

const BuildInfo& build_info();
GpuQuery query_gpus();

}  // namespace mxq
