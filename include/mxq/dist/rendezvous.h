// Setting up a group of processes on one node before any communicator exists: which rank this
// process is (read from the launcher's environment), and a rendezvous through a folder all ranks
// can see, by which rank 0 hands a small blob (NCCL's 128-byte unique id) to the other ranks.
// CPU-only; always built.
//
//   Rendezvous rendezvous = Rendezvous::from_env();        // torchrun, mpirun or MXQ_RANK=...
//   auto comm = make_nccl_communicator(rendezvous);        // mxq/dist/nccl.h
#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace mxq::dist {

struct RankInfo {
  int rank = 0;
  int size = 1;
  int local_rank = 0;             // index among this node's ranks: the GPU it uses by default
  std::string launcher = "none";  // whose variables were read: mxq, torchrun, openmpi or none
};

// Reads the rank from the environment; the first launcher whose variables are set wins:
//   mxq       MXQ_RANK, MXQ_WORLD_SIZE, MXQ_LOCAL_RANK (default: MXQ_RANK, i.e. one node)
//   torchrun  RANK, WORLD_SIZE, LOCAL_RANK (default: RANK)
//   openmpi   OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK (default:
//   rank)
// None set: rank 0 of 1. A rank set without its size (or the reverse), a value that is not an
// integer, a size below 1 or a rank outside [0, size) is an mxq::Error naming the variable.
RankInfo rank_info_from_env();

struct RendezvousOptions {
  std::string dir;     // a folder every rank sees (created when missing)
  std::string run_id;  // the same on every rank of one launch, different for every launch;
                       // letters, digits, '_' and '-' (it names the files)
  std::chrono::milliseconds timeout = std::chrono::minutes(5);

  // MXQ_RENDEZVOUS_DIR (default <temp dir>/mxq-rendezvous-<uid>), MXQ_RUN_ID (default
  // default_run_id()), MXQ_RENDEZVOUS_TIMEOUT (seconds, default 300).
  static RendezvousOptions from_env();
};

// A run id the ranks of one launch share without being told: torchrun's TORCHELASTIC_RUN_ID
// (with its restart count; not its placeholder "none"), else the PMIx namespace of mpirun
// (PMIX_NAMESPACE), else the launching parent process (its pid and start time: every rank of
// torchrun, mpirun or a shell script on one node is a child of the same process).
std::string default_run_id();

// Rank 0 publishes a blob, every other rank reads it, through files in options.dir:
// `<run id>.id` (then `<run id>.<n>.id` for the n-th later share of the same object) holds the
// blob, the group size and a random nonce, written to a temp file and renamed, so it appears
// whole; each reader acknowledges the nonce it read in `<run id>.ack.<rank>` (same naming); rank 0
// removes every file once all ranks acknowledged its nonce, and a reader returns only after that
// removal. So:
// - a successful share leaves no file behind;
// - a reader that finds a file left by an earlier, crashed launch with the same run id (or one of
//   another group size) waits for this launch's rank 0 to replace it, and never returns it;
// - when rank 0 gives up (timeout), it marks the file abandoned, so the ranks that did read it
//   fail as well instead of going on alone; a later launch replaces the marker.
class Rendezvous {
 public:
  Rendezvous(RendezvousOptions options, RankInfo ranks);
  // rank_info_from_env() and RendezvousOptions::from_env().
  static Rendezvous from_env();

  // Collective over the ranks. Rank 0: publishes `blob` and returns it once every rank has read
  // it. Other ranks: `blob` is ignored; returns rank 0's blob. Throws mxq::Error after the
  // timeout, naming the file, the ranks that did not show up (rank 0) and what the file held
  // (e.g. a group of another size).
  std::vector<std::uint8_t> share_from_rank0(std::span<const std::uint8_t> blob);

  [[nodiscard]] const RankInfo& ranks() const { return ranks_; }
  [[nodiscard]] const RendezvousOptions& options() const { return options_; }
  // The file the next share_from_rank0 uses.
  [[nodiscard]] std::string id_path() const;

 private:
  [[nodiscard]] std::string file_stem() const;
  std::vector<std::uint8_t> publish(std::span<const std::uint8_t> blob);
  std::vector<std::uint8_t> fetch();

  RendezvousOptions options_;
  RankInfo ranks_;
  int shares_ = 0;  // share_from_rank0 calls completed: names the next call's files
};

}  // namespace mxq::dist
