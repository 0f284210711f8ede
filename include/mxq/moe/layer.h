// MoeLayer: one MXFP4 MoE layer split over a TP x EP grid of ranks simulated in one process
// (rank id = ep_rank * tp_size + tp_rank), with checkpoint loading, preparation (padding),
// the CPU reference forward pass and weight-update sessions.
#pragma once

#include <cstdint>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <vector>

#include "mxq/core/tensor.h"
#include "mxq/moe/checkpoint.h"
#include "mxq/moe/config.h"
#include "mxq/moe/prepare.h"
#include "mxq/moe/rank_weights.h"
#include "mxq/moe/routing.h"
#include "mxq/moe/sharding.h"
#include "mxq/tune/problem.h"

namespace mxq::tune {
class Autotuner;
}  // namespace mxq::tune

namespace mxq::moe {

struct MoeForwardResult {
  Tensor output;       // f32 [T, H]; every value a bf16 (the rank sum rounded once)
  Tensor accumulator;  // f32 [T, H]; the fp32 rank sum before that rounding
  // f32 [T, H]; the sum of |fp32(weight * y)| over every rank and slot: the scale of the fp32
  // summation error, for comparing runs with different TP/EP splits.
  Tensor magnitude;
  Routing routing;  // the routing used (computed, or a copy of the caller's)
  double routing_seconds = 0.0;
  std::vector<double> rank_seconds;  // expert computation per rank
  // Per rank: the moe_expert_gemm tactic that ran ("reference": the layer's own tiling) and
  // whether the tuner's cache chose it.
  std::vector<std::string> rank_tactics;
  std::vector<bool> rank_tactics_from_cache;
  double total_seconds = 0.0;
};

class MoeLayer {
 public:
  // Move-only: its weights are large (a copy would double them), and a layer is what device
  // uploads and weight updates refer to. Moves are noexcept, so std::vector<MoeLayer> grows by
  // moving.
  MoeLayer(const MoeLayer&) = delete;
  MoeLayer& operator=(const MoeLayer&) = delete;
  MoeLayer(MoeLayer&&) noexcept = default;
  MoeLayer& operator=(MoeLayer&&) noexcept = default;
  ~MoeLayer() = default;

  // Loads layer `layer` of `checkpoint` for every rank: each rank copies only its rows/columns
  // of the memory-mapped tensors. Every required tensor is checked (present, shape, dtype)
  // before anything is copied. The layer starts in checkpoint layout (call prepare()).
  static MoeLayer load(const MoeCheckpoint& checkpoint, std::int64_t layer, const MoeConfig& config,
                       const ShardOptions& shards = {});
  // A layer with zero weights, unit scales and zero biases, to be filled by an update session.
  static MoeLayer create(const MoeConfig& config, std::int64_t layer,
                         const ShardOptions& shards = {});

  [[nodiscard]] const MoeConfig& config() const { return config_; }
  [[nodiscard]] std::int64_t layer_index() const { return layer_; }
  [[nodiscard]] const ShardOptions& shards() const { return shards_; }
  [[nodiscard]] int num_ranks() const { return static_cast<int>(ranks_.size()); }
  [[nodiscard]] const MoeRankWeights& rank(int index) const;
  // The ranks' intermediate size in checkpoint layout (the TP width, TpShard::width; every rank
  // stores the same), whether prepared or not.
  [[nodiscard]] std::int64_t intermediate_size_per_partition() const;
  // I_rank as stored now (MoeRankShape's one owner): the TP width in checkpoint layout, the
  // padded P once prepared. docs/moe.md, "Names of the intermediate size".
  [[nodiscard]] std::int64_t intermediate_size_per_partition_after_pad() const;
  [[nodiscard]] bool prepared() const;
  [[nodiscard]] const Tensor& router_weight() const { return router_weight_; }  // bf16 [E, H]
  [[nodiscard]] const Tensor& router_bias() const { return router_bias_; }      // bf16 [E]

  // Pads every rank to `alignment` (see prepare.h). Logs one warning stating the wasted
  // fraction the first time this layer is padded.
  PaddingSummary prepare(std::int64_t alignment = kDefaultAlignment);
  void restore_checkpoint_layout();
  [[nodiscard]] PaddingSummary padding_summary() const;

  // x: [T, H], f32 (values are rounded to bf16 on entry) or bf16. routing: the caller's
  // expert ids and weights (required for RouterKind::kPrecomputed), else the router's.
  // A token whose input row holds a NaN or an infinity is not routed and gets NaN in every
  // output element; other tokens are unaffected.
  // tuner: optional, CPU backend; each rank runs the moe_expert_gemm tiling its cache holds for
  // the rank's problem (tune_problem) and the token count, else the layer's own tiling. Every
  // tiling gives bit-identical output.
  [[nodiscard]] MoeForwardResult forward(const TensorView& x, const Routing* routing = nullptr,
                                         const tune::Autotuner* tuner = nullptr) const;
  // The autotuner's key of rank `rank`'s expert computation (op moe_expert_gemm): the global and
  // local expert counts, H, the rank's TP shard width, top-k, biases. `mxq tune` presets list
  // the same key for rank 0.
  [[nodiscard]] tune::Problem tune_problem(int rank) const;

  // Weight updates. begin_update() restores the checkpoint layout; load() takes full
  // checkpoint tensors (either layout's names, router included) in any order and in any
  // number of calls, and shards them; end_update() prepares again with the previous alignment.
  // Storage is reused (same addresses once the layer was prepared before). A tensor that is
  // unknown, of the wrong shape or dtype is an error that leaves the layer unchanged.
  void begin_update();
  void load(const std::string& name, const TensorView& tensor);
  void end_update();
  [[nodiscard]] bool updating() const { return updating_; }

  // The weights held for reading while the returned lock lives (writers wait; readers share):
  // forward() and the GPU uploads copy the weights under it. During a weight update the weights
  // are half-loaded in checkpoint layout, so it fails then, naming `reader`. Not reentrant: do not
  // call forward() or an upload while holding it (they take it again). The accessors above take
  // no lock; hold this around them when an update may run concurrently.
  [[nodiscard]] std::shared_lock<std::shared_mutex> lock_for_reading(std::string_view reader) const;

 private:
  MoeLayer(const MoeConfig& config, std::int64_t layer, const ShardOptions& shards);
  // Checks a named tensor for this layer; returns its parsed name. Changes nothing.
  MoeTensorName check_tensor(const std::string& name, const TensorView& tensor) const;
  void write_tensor(const MoeTensorName& name, const TensorView& tensor);
  PaddingSummary prepare_locked(std::int64_t alignment);
  void restore_locked();

  // Forwards and uploads read the weights; prepare, restore and the update calls change them. A
  // forward from one thread and an update from another (Python releases the GIL in both) would
  // read half-written weights, so readers hold the lock shared (lock_for_reading) and the writers
  // hold it alone. A moved-to layer gets a lock of its own (a mutex cannot move).
  struct Lock {
    mutable std::shared_mutex mutex;
    Lock() = default;
    Lock(const Lock&) = delete;
    Lock& operator=(const Lock&) = delete;
    Lock(Lock&& /*other*/) noexcept {}
    Lock& operator=(Lock&& /*other*/) noexcept { return *this; }
    ~Lock() = default;
  };
  Lock lock_;

  MoeConfig config_;
  std::int64_t layer_ = 0;
  ShardOptions shards_;
  std::vector<MoeRankWeights> ranks_;
  Tensor router_weight_;
  Tensor router_bias_;
  bool updating_ = false;
  std::int64_t alignment_before_update_ = 0;
  bool padding_warned_ = false;
};

}  // namespace mxq::moe
