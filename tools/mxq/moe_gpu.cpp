#include "moe_gpu.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "mxq/core/build_info.h"
#include "mxq/core/error.h"
#include "mxq/core/statistics.h"
#include "mxq/formats/bf16.h"

#if MXQ_WITH_CUDA
#include "mxq/core/cuda_check.h"
#include "mxq/moe/dist_layer.h"
#include "mxq/moe/gpu_layer.h"
#include "mxq/tune/problem.h"
#endif

namespace mxq::cli {

void require_gpu_for_device_cuda() {
#if MXQ_WITH_CUDA
  const GpuQuery query = query_gpus();
  if (query.gpus.empty()) {
    fail(ErrorCode::kUnsupported, "--device cuda: ", query.note, "; use --device cpu");
  }
#else
  fail(ErrorCode::kUnsupported,
       "--device cuda: this build of mxq has no CUDA support (configure with -DMXQ_CUDA=ON)");
#endif
}

GpuMoeRun run_moe_on_gpu(const moe::MoeLayer& layer, const Tensor& x,
                         const tune::Autotuner* tuner) {
  require_gpu_for_device_cuda();
#if MXQ_WITH_CUDA
  const GpuQuery query = query_gpus();
  require_rank(x, "--input", 2);
  const int tokens = static_cast<int>(x.shape()[0]);
  const moe::MoeGpuLayer gpu = moe::MoeGpuLayer::upload(layer, std::max(tokens, 1), Device::cuda(0),
                                                        moe::gpu::GemmVariant::kAuto, tuner);
  GpuMoeRun run;
  for (int r = 0; r < gpu.num_ranks(); ++r) {
    const tune::Problem* problem = gpu.tune_problem(r);
    run.ranks.push_back({gpu.tactic_name(tokens, r), gpu.gemm_choice(tokens, r).from_tuner,
                         problem != nullptr ? problem->canonical() : std::string()});
  }
  run.tactic = run.ranks.front().tactic;
  run.from_tuner = std::all_of(run.ranks.begin(), run.ranks.end(),
                               [](const GpuMoeRun::RankTactic& rank) { return rank.from_tuner; });
  run.gpu = query.gpus.front().name;
  run.output = gpu.forward_host(x);
  // Device time of the forward alone: the input already on the device, events around it.
  Tensor xb = Tensor::empty(DType::kBF16, x.shape());
  auto* xh = static_cast<std::uint16_t*>(xb.data());
  for (std::int64_t i = 0; i < x.numel(); ++i) xh[i] = float_to_bf16(x.data_as<float>()[i]);
  const Tensor x_dev = xb.to(Device::cuda());
  const Tensor out_dev = Tensor::empty(DType::kBF16, x.shape(), Device::cuda());
  cudaEvent_t start;
  cudaEvent_t stop;
  MXQ_CUDA_CHECK(cudaEventCreate(&start));
  MXQ_CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<float> times;
  for (int i = 0; i < 13; ++i) {
    MXQ_CUDA_CHECK(cudaEventRecord(start, nullptr));
    gpu.forward(x_dev, out_dev, nullptr);
    MXQ_CUDA_CHECK(cudaEventRecord(stop, nullptr));
    MXQ_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0.0F;
    MXQ_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    if (i >= 3) times.push_back(ms);
  }
  MXQ_CUDA_CHECK(cudaEventDestroy(start));
  MXQ_CUDA_CHECK(cudaEventDestroy(stop));
  run.forward_ms = median(times);
  return run;
#else
  (void)layer;
  (void)x;
  (void)tuner;
  return {};
#endif
}

GpuMoeRun run_moe_distributed(const DistributedMoeLayer& layer, const Tensor& x,
                              dist::Communicator& comm, int device, const tune::Autotuner* tuner) {
  require_gpu_for_device_cuda();
#if MXQ_WITH_CUDA
  const GpuQuery query = query_gpus();
  require_rank(x, "--input", 2);
  const int tokens = static_cast<int>(x.shape()[0]);
  MXQ_CUDA_CHECK(cudaSetDevice(device));
  const auto setup_start = std::chrono::steady_clock::now();
  const moe::MoeDistLayer dist = moe::MoeDistLayer::from_checkpoint(
      *layer.checkpoint, layer.layer, layer.overrides, comm, layer.tp_size, layer.ep_size,
      layer.alignment, std::max(tokens, 1), Device::cuda(device), moe::gpu::GemmVariant::kAuto,
      tuner);
  GpuMoeRun run;
  run.setup_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - setup_start).count();
  run.world = comm.size();
  run.ranks.resize(static_cast<std::size_t>(comm.size()));
  for (int r = 0; r < comm.size(); ++r) {
    run.ranks[static_cast<std::size_t>(r)].tactic = "(in rank " + std::to_string(r) + "'s process)";
  }
  const tune::Problem* problem = dist.tune_problem();
  run.ranks[static_cast<std::size_t>(comm.rank())] = {
      dist.tactic_name(tokens), dist.gemm_choice(tokens).from_tuner,
      problem != nullptr ? problem->canonical() : std::string()};
  run.tactic = run.ranks[static_cast<std::size_t>(comm.rank())].tactic;
  run.from_tuner = run.ranks[static_cast<std::size_t>(comm.rank())].from_tuner;
  run.gpu = query.gpus.at(static_cast<std::size_t>(device)).name;
  run.output = dist.forward_host(x);
  // Device time: the whole forward (expert computation + all-reduce + rounding) and the
  // all-reduce + rounding alone, events around each; the same number of calls on every rank.
  Tensor xb = Tensor::empty(DType::kBF16, x.shape());
  auto* xh = static_cast<std::uint16_t*>(xb.data());
  for (std::int64_t i = 0; i < x.numel(); ++i) xh[i] = float_to_bf16(x.data_as<float>()[i]);
  const Tensor x_dev = xb.to(Device::cuda(device));
  const Tensor out_dev = Tensor::empty(DType::kBF16, x.shape(), Device::cuda(device));
  cudaEvent_t events[3];
  for (cudaEvent_t& e : events) MXQ_CUDA_CHECK(cudaEventCreate(&e));
  cudaStream_t stream = nullptr;
  MXQ_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::vector<float> total;
  std::vector<float> reduce;
  for (int i = 0; i < 13; ++i) {
    dist.forward(x_dev, out_dev, stream, {}, {}, events);
    MXQ_CUDA_CHECK(cudaEventSynchronize(events[2]));
    float all_ms = 0.0F;
    float reduce_ms = 0.0F;
    MXQ_CUDA_CHECK(cudaEventElapsedTime(&all_ms, events[0], events[2]));
    MXQ_CUDA_CHECK(cudaEventElapsedTime(&reduce_ms, events[1], events[2]));
    if (i >= 3) {
      total.push_back(all_ms);
      reduce.push_back(reduce_ms);
    }
  }
  MXQ_CUDA_CHECK(cudaStreamDestroy(stream));
  for (cudaEvent_t& e : events) MXQ_CUDA_CHECK(cudaEventDestroy(e));
  run.forward_ms = median(total);
  run.allreduce_ms = median(reduce);
  return run;
#else
  (void)layer;
  (void)x;
  (void)comm;
  (void)device;
  (void)tuner;
  return {};
#endif
}

}  // namespace mxq::cli
