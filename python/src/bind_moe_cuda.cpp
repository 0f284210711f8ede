// mxq._mxq.MoeGpuLayer: a MoeLayer's ranks on one CUDA device (mxq::moe::MoeGpuLayer), run on
// the caller's stream. Bound only when mxq is built with CUDA; `_mxq.with_cuda` says which.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "array_bridge.h"
#include "bindings.h"

#if MXQ_WITH_CUDA
#include <cuda_runtime_api.h>

#include "moe_layer_type.h"
#include "mxq/core/cuda_check.h"
#include "mxq/moe/gpu_layer.h"
#include "mxq/tune/autotuner.h"
#include "mxq/tune/problem.h"
#endif

namespace mxq::python {

#if MXQ_WITH_CUDA
namespace {

moe::gpu::GemmVariant gemm_arg(const std::string& text) {
  if (const auto variant = moe::gpu::gemm_variant_from_string(text)) return *variant;
  fail_argument(ErrorCode::kInvalidArgument, "gemm",
                "\"auto\", \"decode_mma\" or \"prefill_wgmma\"", "\"" + text + "\"");
}

const ArrayRequirements kDeviceBf16{{DType::kBF16}, 2, true, false};

}  // namespace
#endif

void bind_moe_cuda(nb::module_& m) {
#if MXQ_WITH_CUDA
  nb::class_<moe::MoeGpuLayer>(
      m, "MoeGpuLayer",
      "mxq::moe::MoeGpuLayer: every rank of a MoeLayer uploaded to one CUDA device. Its "
      "workspace is sized for max_tokens and shared by all calls: calls must be ordered (one "
      "stream, or streams the caller orders).")
      .def_static(
          "upload",
          [](const moe::MoeLayer& layer, int max_tokens, int device, const std::string& gemm,
             const tune::Autotuner* tuner) {
            const moe::gpu::GemmVariant variant = gemm_arg(gemm);
            const nb::gil_scoped_release release;
            return moe::MoeGpuLayer::upload(layer, max_tokens, Device::cuda(device), variant,
                                            tuner);
          },
          nb::arg("layer"), nb::arg("max_tokens"), nb::arg("device") = 0, nb::arg("gemm") = "auto",
          nb::arg("tuner").none() = nb::none(),
          nb::keep_alive<0, 5>(),  // the layer consults the tuner on every forward
          "Copies the layer's current weights (every rank) to CUDA device `device`. With a "
          "`tuner` (an Autotuner of backend cuda), forward() runs the GEMM variant its cache "
          "holds for each rank and token count; `gemm` otherwise.")
      .def_prop_ro("max_tokens", &moe::MoeGpuLayer::max_tokens)
      .def_prop_ro("num_ranks", &moe::MoeGpuLayer::num_ranks)
      .def_prop_ro("tactic_name", [](const moe::MoeGpuLayer& l) { return l.tactic_name(); })
      .def(
          "tactic_for",
          [](const moe::MoeGpuLayer& l, std::int64_t tokens, int rank) {
            if (rank < 0 || rank >= l.num_ranks()) {
              fail_argument(ErrorCode::kOutOfRange, "rank",
                            detail::concat("a rank id in [0, ", l.num_ranks(), ")"), rank);
            }
            nb::dict d;
            d["tactic"] = l.tactic_name(tokens, rank);
            d["from_tuner"] = l.gemm_choice(tokens, rank).from_tuner;
            return d;
          },
          nb::arg("tokens"), nb::arg("rank") = 0,
          "What forward() runs on `rank` for `tokens` tokens, and whether the tuner chose it.")
      .def(
          "tune_problems",
          [](const moe::MoeGpuLayer& l) {
            // One per distinct rank problem (ranks of equal shape share theirs).
            std::vector<tune::Problem> out;
            for (int r = 0; r < l.num_ranks(); ++r) {
              const tune::Problem* p = l.tune_problem(r);
              if (p != nullptr && std::find(out.begin(), out.end(), *p) == out.end()) {
                out.push_back(*p);
              }
            }
            return out;
          },
          "The moe_gpu_forward problems the layer's ranks ask the tuner (what a tuning pass "
          "must measure for this layer).")
      .def_prop_ro("hidden_size", [](const moe::MoeGpuLayer& l) { return l.config().hidden_size; })
      .def(
          "forward",
          [](const moe::MoeGpuLayer& l, nb::handle x, nb::handle out, std::uintptr_t stream,
             nb::handle expert_ids, nb::handle expert_weights) -> nb::object {
            const ArrayArg xa = array_arg(x, "x", kDeviceBf16);
            if (!xa.view.device().is_cuda()) {
              fail(ErrorCode::kDeviceMismatch,
                   "x: expected a CUDA array, found a host array (MoELayer.forward runs host "
                   "arrays on the CPU)");
            }
            const Device device = xa.view.device();
            std::optional<ArrayArg> ids;
            std::optional<ArrayArg> weights;
            if (!expert_ids.is_none() || !expert_weights.is_none()) {
              if (expert_ids.is_none() || expert_weights.is_none()) {
                fail(ErrorCode::kInvalidArgument,
                     "expert_ids and expert_weights: give both or neither (found only one)");
              }
              ids = array_arg(expert_ids, "expert_ids", {{DType::kI32}, 2, true, false});
              weights =
                  array_arg(expert_weights, "expert_weights", {{DType::kF32}, 2, true, false});
            }
            std::optional<ArrayArg> out_arg;
            Tensor owned;
            if (out.is_none()) {
              owned =
                  Tensor::empty(DType::kBF16, {xa.view.size(0), l.config().hidden_size}, device);
            } else {
              out_arg = array_arg(out, "out", kDeviceBf16);
            }
            {
              const nb::gil_scoped_release release;
              l.forward(xa.view, out_arg ? out_arg->view : owned.view(),
                        static_cast<cudaStream_t>(stream_arg(stream)),
                        ids ? ids->view : TensorView{}, weights ? weights->view : TensorView{});
              MXQ_CUDA_CHECK(cudaGetLastError());
            }
            if (out_arg) return nb::none();
            return to_dlpack(std::move(owned));
          },
          nb::arg("x"), nb::arg("out") = nb::none(), nb::arg("stream") = 0,
          nb::arg("expert_ids") = nb::none(), nb::arg("expert_weights") = nb::none(),
          "bf16 y [T, H] for bf16 x [T, H] on the layer's device, queued on `stream` (a "
          "cudaStream_t; 0 = the default stream), no host synchronization. Writes into `out` "
          "(bf16 [T, H] on the device) and returns None, or returns a new DLPack array (uint16 "
          "bits of bf16) when out is None. expert_ids i32 / expert_weights f32 [T, top_k] on the "
          "device give precomputed routing.");
#else
  (void)m;
#endif
}

}  // namespace mxq::python
