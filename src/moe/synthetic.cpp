#include "mxq/moe/synthetic.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <vector>

#include "mxq/core/error.h"
#include "mxq/core/memory.h"
#include "mxq/core/parallel.h"
#include "mxq/core/prng.h"
#include "mxq/formats/bf16.h"
#include "mxq/formats/mxfp4.h"
#include "mxq/io/safetensors.h"

namespace mxq::moe {
namespace {

// Stream ids of the synthetic tensors (part of the reproducibility contract: do not renumber).
enum class Stream : std::uint64_t {
  kRouterWeight = 1,
  kRouterBias = 2,
  kGate = 3,
  kUp = 4,
  kDown = 5,
  kGateBias = 6,
  kUpBias = 7,
  kDownBias = 8,
  kTokens = 9,
};

std::uint64_t seed_for(const SyntheticSpec& spec, std::int64_t layer, Stream stream,
                       std::int64_t expert = 0) {
  return stream_seed({spec.seed, static_cast<std::uint64_t>(layer),
                      static_cast<std::uint64_t>(stream), static_cast<std::uint64_t>(expert)});
}

// [rows, cols] f32 weights: u * amplitude * 2^(u_row).
Tensor draw_matrix(std::uint64_t seed, std::int64_t rows, std::int64_t cols, float amplitude) {
  Tensor out = Tensor::empty(DType::kF32, {rows, cols});
  Xoshiro256 rng(seed);
  auto* data = out.data_as<float>();
  for (std::int64_t r = 0; r < rows; ++r) {
    const float gain = amplitude * std::exp2(rng.uniform_symmetric());
    for (std::int64_t c = 0; c < cols; ++c) data[r * cols + c] = rng.uniform_symmetric() * gain;
  }
  return out;
}

// bf16 [count] values u * amplitude, written into `out` (2 bytes each).
void draw_bf16(std::uint64_t seed, std::int64_t count, float amplitude, std::byte* out) {
  Xoshiro256 rng(seed);
  for (std::int64_t i = 0; i < count; ++i) {
    const std::uint16_t bits = float_to_bf16(rng.uniform_symmetric() * amplitude);
    std::memcpy(out + 2 * i, &bits, 2);
  }
}

struct ExpertQuantized {
  Mxfp4Tensor gate;  // blocks [I, H/32, 16], scales [I, H/32]
  Mxfp4Tensor up;
  Mxfp4Tensor down;  // blocks [H, I/32, 16], scales [H, I/32]
};

ExpertQuantized quantize_expert(const SyntheticSpec& spec, std::int64_t layer, std::int64_t e) {
  const auto h = static_cast<float>(spec.hidden);
  const auto i = static_cast<float>(spec.intermediate);
  const float gate_amplitude = std::sqrt(3.0F / h) * 1.5F;
  ExpertQuantized q;
  q.gate = quantize_mxfp4(draw_matrix(seed_for(spec, layer, Stream::kGate, e), spec.intermediate,
                                      spec.hidden, gate_amplitude));
  q.up = quantize_mxfp4(draw_matrix(seed_for(spec, layer, Stream::kUp, e), spec.intermediate,
                                    spec.hidden, gate_amplitude));
  q.down = quantize_mxfp4(draw_matrix(seed_for(spec, layer, Stream::kDown, e), spec.hidden,
                                      spec.intermediate, std::sqrt(3.0F / i)));
  return q;
}

// Interleaves gate and up rows (g0, u0, g1, u1, ...) of `row_bytes` each into `out`.
void interleave_rows(const Tensor& gate, const Tensor& up, std::int64_t rows, std::size_t row_bytes,
                     std::byte* out) {
  const auto* g = static_cast<const std::byte*>(gate.data());
  const auto* u = static_cast<const std::byte*>(up.data());
  for (std::int64_t r = 0; r < rows; ++r) {
    const auto at = static_cast<std::size_t>(r);
    std::memcpy(out + (2 * at) * row_bytes, g + at * row_bytes, row_bytes);
    std::memcpy(out + (2 * at + 1) * row_bytes, u + at * row_bytes, row_bytes);
  }
}

Tensor bytes_tensor(const TensorSpec& spec) { return Tensor::empty(spec.dtype, spec.shape); }

void write_layer(const std::string& path, const SyntheticSpec& spec, std::int64_t layer,
                 const std::function<void()>& poll) {
  const MoeConfig config = synthetic_config(spec);
  const std::int64_t experts = spec.experts;
  const std::int64_t hidden = spec.hidden;
  const std::int64_t inter = spec.intermediate;
  std::vector<std::pair<std::string, Tensor>> tensors;
  const auto add = [&](MoeTensorKind kind, std::int64_t expert, Tensor tensor) {
    tensors.emplace_back(format_tensor_name({layer, kind, expert}), std::move(tensor));
    return static_cast<std::byte*>(tensors.back().second.data());
  };
  // Router.
  Tensor router_weight = bytes_tensor(expected_tensor_spec(config, MoeTensorKind::kRouterWeight));
  draw_bf16(seed_for(spec, layer, Stream::kRouterWeight), experts * hidden,
            std::sqrt(3.0F / static_cast<float>(hidden)),
            static_cast<std::byte*>(router_weight.data()));
  add(MoeTensorKind::kRouterWeight, -1, std::move(router_weight));
  Tensor router_bias = bytes_tensor(expected_tensor_spec(config, MoeTensorKind::kRouterBias));
  draw_bf16(seed_for(spec, layer, Stream::kRouterBias), experts, 0.5F,
            static_cast<std::byte*>(router_bias.data()));
  add(MoeTensorKind::kRouterBias, -1, std::move(router_bias));

  // Experts, quantized in parallel (each expert has its own streams: thread-count independent).
  std::vector<ExpertQuantized> quantized(static_cast<std::size_t>(experts));
  parallel_for(experts, 1, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t e = begin; e < end; ++e) {
      if (poll) poll();
      quantized[static_cast<std::size_t>(e)] = quantize_expert(spec, layer, e);
    }
  });
  if (poll) poll();
  const auto bias_values = [&](Stream stream, std::int64_t e, std::int64_t count, float amplitude) {
    Tensor bias = Tensor::empty(DType::kBF16, {count});
    draw_bf16(seed_for(spec, layer, stream, e), count, amplitude,
              static_cast<std::byte*>(bias.data()));
    return bias;
  };
  const std::size_t w13_row = static_cast<std::size_t>(hidden / 2);
  const std::size_t w13_scale_row = static_cast<std::size_t>(hidden / 32);

  if (spec.layout == CheckpointLayout::kGptOss) {
    std::byte* blocks =
        add(MoeTensorKind::kGateUpBlocks, -1,
            bytes_tensor(expected_tensor_spec(config, MoeTensorKind::kGateUpBlocks)));
    std::byte* scales =
        add(MoeTensorKind::kGateUpScales, -1,
            bytes_tensor(expected_tensor_spec(config, MoeTensorKind::kGateUpScales)));
    std::byte* bias = add(MoeTensorKind::kGateUpBias, -1,
                          bytes_tensor(expected_tensor_spec(config, MoeTensorKind::kGateUpBias)));
    std::byte* down_blocks =
        add(MoeTensorKind::kDownBlocks, -1,
            bytes_tensor(expected_tensor_spec(config, MoeTensorKind::kDownBlocks)));
    std::byte* down_scales =
        add(MoeTensorKind::kDownScales, -1,
            bytes_tensor(expected_tensor_spec(config, MoeTensorKind::kDownScales)));
    std::byte* down_bias =
        add(MoeTensorKind::kDownBias, -1,
            bytes_tensor(expected_tensor_spec(config, MoeTensorKind::kDownBias)));
    for (std::int64_t e = 0; e < experts; ++e) {
      const ExpertQuantized& q = quantized[static_cast<std::size_t>(e)];
      const auto ex = static_cast<std::size_t>(e);
      const auto rows = static_cast<std::size_t>(2 * inter);
      interleave_rows(q.gate.blocks, q.up.blocks, inter, w13_row, blocks + ex * rows * w13_row);
      interleave_rows(q.gate.scales, q.up.scales, inter, w13_scale_row,
                      scales + ex * rows * w13_scale_row);
      const Tensor gate_bias = bias_values(Stream::kGateBias, e, inter, 0.25F);
      const Tensor up_bias = bias_values(Stream::kUpBias, e, inter, 0.25F);
      interleave_rows(gate_bias, up_bias, inter, 2, bias + ex * rows * 2);
      const std::size_t down_bytes = q.down.blocks.nbytes();
      std::memcpy(down_blocks + ex * down_bytes, q.down.blocks.data(), down_bytes);
      const std::size_t down_scale_bytes = q.down.scales.nbytes();
      std::memcpy(down_scales + ex * down_scale_bytes, q.down.scales.data(), down_scale_bytes);
      const Tensor db = bias_values(Stream::kDownBias, e, hidden, 0.1F);
      std::memcpy(down_bias + ex * db.nbytes(), db.data(), db.nbytes());
    }
  } else {
    for (std::int64_t e = 0; e < experts; ++e) {
      ExpertQuantized& q = quantized[static_cast<std::size_t>(e)];
      const auto as_u8 = [&](const Tensor& t, MoeTensorKind kind) {
        Tensor out = bytes_tensor(expected_tensor_spec(config, kind));
        std::memcpy(out.data(), t.data(), out.nbytes());
        return out;
      };
      add(MoeTensorKind::kGateBlocks, e, as_u8(q.gate.blocks, MoeTensorKind::kGateBlocks));
      add(MoeTensorKind::kGateScales, e, as_u8(q.gate.scales, MoeTensorKind::kGateScales));
      add(MoeTensorKind::kGateBias, e, bias_values(Stream::kGateBias, e, inter, 0.25F));
      add(MoeTensorKind::kUpBlocks, e, as_u8(q.up.blocks, MoeTensorKind::kUpBlocks));
      add(MoeTensorKind::kUpScales, e, as_u8(q.up.scales, MoeTensorKind::kUpScales));
      add(MoeTensorKind::kUpBias, e, bias_values(Stream::kUpBias, e, inter, 0.25F));
      add(MoeTensorKind::kExpertDownBlocks, e,
          as_u8(q.down.blocks, MoeTensorKind::kExpertDownBlocks));
      add(MoeTensorKind::kExpertDownScales, e,
          as_u8(q.down.scales, MoeTensorKind::kExpertDownScales));
      add(MoeTensorKind::kExpertDownBias, e, bias_values(Stream::kDownBias, e, hidden, 0.1F));
      q = ExpertQuantized{};  // release as we go
    }
  }
  std::vector<io::NamedTensor> named;
  named.reserve(tensors.size());
  for (const auto& [name, tensor] : tensors) named.emplace_back(name, tensor.view());
  io::write_safetensors(path, named,
                        {{"format", "pt"},
                         {"mxq_synthetic", detail::concat("seed=", spec.seed, " layer=", layer,
                                                          " layout=", to_string(spec.layout))}});
}

}  // namespace

MoeConfig synthetic_config(const SyntheticSpec& spec) {
  MoeConfig config;
  config.hidden_size = spec.hidden;
  config.intermediate_size = spec.intermediate;
  config.num_experts = spec.experts;
  config.top_k = spec.top_k;
  config.swiglu_limit = spec.swiglu_limit;
  config.num_layers = spec.layers;
  config.validate();
  return config;
}

std::uint64_t synthetic_layer_bytes(const SyntheticSpec& spec) {
  const MoeConfig config = synthetic_config(spec);
  std::uint64_t total = 0;
  for (const MoeTensorName& name : required_tensor_names(config, 0, spec.layout)) {
    const TensorSpec tensor = expected_tensor_spec(config, name.kind);
    std::uint64_t bytes = size_of(tensor.dtype);
    for (const std::int64_t extent : tensor.shape.dims()) {
      bytes = saturating_mul(bytes, static_cast<std::uint64_t>(extent));
    }
    total = saturating_add(total, saturating_add(bytes, 256));
  }
  return total;
}

void write_synthetic_checkpoint(const std::string& out_dir, const SyntheticSpec& spec,
                                const std::function<void(std::string_view)>& progress,
                                const std::function<void()>& poll) {
  const MoeConfig config = synthetic_config(spec);
  if (spec.layers < 1) fail_argument(ErrorCode::kInvalidArgument, "layers", ">= 1", spec.layers);
  std::error_code error;
  std::filesystem::create_directories(out_dir, error);
  if (error) fail(ErrorCode::kIo, "cannot create directory ", out_dir, ": ", error.message());
  for (std::int64_t layer = 0; layer < spec.layers; ++layer) {
    char file[64];
    std::snprintf(file, sizeof(file), "layer-%05lld.safetensors", static_cast<long long>(layer));
    if (progress) {
      progress(detail::concat("synthesizing layer ", layer, " of ", spec.layers,
                              " (E=", spec.experts, ", H=", spec.hidden, ", I=", spec.intermediate,
                              ", ", to_string(spec.layout), " layout)"));
    }
    write_layer((std::filesystem::path(out_dir) / file).string(), spec, layer, poll);
  }
  const std::string config_path = (std::filesystem::path(out_dir) / "config.json").string();
  const std::string temp = config_path + ".tmp";
  {
    std::ofstream out(temp, std::ios::trunc);
    out << moe_config_to_json(config);
    if (!out) fail(ErrorCode::kIo, "cannot write ", temp);
  }
  std::filesystem::rename(temp, config_path, error);
  if (error)
    fail(ErrorCode::kIo, "cannot rename ", temp, " to ", config_path, ": ", error.message());
}

Tensor synthetic_tokens(std::int64_t tokens, std::int64_t hidden, std::uint64_t seed) {
  if (tokens < 0 || hidden <= 0) {
    fail_argument(ErrorCode::kInvalidArgument, "tokens x hidden", "non-negative x positive",
                  detail::concat(tokens, " x ", hidden));
  }
  Tensor out = Tensor::empty(DType::kF32, {tokens, hidden});
  Xoshiro256 rng(stream_seed({seed, static_cast<std::uint64_t>(Stream::kTokens)}));
  auto* data = out.data_as<float>();
  for (std::int64_t i = 0; i < tokens * hidden; ++i) {
    data[i] = round_to_bf16(rng.uniform_symmetric() * 1.7320508F);
  }
  return out;
}

}  // namespace mxq::moe

namespace mxq::moe {
namespace {

constexpr int kSyntheticFormatVersion = 1;  // bump when the generated bytes change

std::string spec_marker(const SyntheticSpec& spec) {
  return detail::concat(
      "mxq synthetic checkpoint v", kSyntheticFormatVersion, "\nexperts=", spec.experts,
      "\nhidden=", spec.hidden, "\nintermediate=", spec.intermediate, "\ntop_k=", spec.top_k,
      "\nlayers=", spec.layers, "\nseed=", spec.seed, "\nlayout=", to_string(spec.layout),
      "\nswiglu_limit=", spec.swiglu_limit, "\n");
}

// The marker: the spec, then one "file <name> <bytes>" line per file.
std::string marker_text(const SyntheticSpec& spec, const std::filesystem::path& dir) {
  std::vector<std::string> files;
  for (const auto& item : std::filesystem::directory_iterator(dir)) {
    if (item.path().filename() != "mxq-synth.txt") files.push_back(item.path().filename());
  }
  std::sort(files.begin(), files.end());
  std::string text = spec_marker(spec);
  for (const std::string& file : files) {
    text += detail::concat("file ", file, " ", std::filesystem::file_size(dir / file), "\n");
  }
  return text;
}

bool is_valid_copy(const SyntheticSpec& spec, const std::filesystem::path& dir) {
  std::error_code error;
  if (!std::filesystem::is_directory(dir, error)) return false;
  std::ifstream in(dir / "mxq-synth.txt");
  if (!in) return false;
  const std::string stored((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  try {
    return stored == marker_text(spec, dir);
  } catch (const std::filesystem::filesystem_error&) {
    return false;
  }
}

// An exclusive flock on a lock file for the lifetime of the object; the file is removed on
// destruction. The kernel releases the lock when the process dies (kill -9 included), which is
// how remove_stale_synthetic_temporaries tells a dead writer's folder from a live one's.
class WriterLock {
 public:
  explicit WriterLock(std::string path) : path_(std::move(path)) {
    for (int attempt = 0; attempt < 8; ++attempt) {
      fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
      if (fd_ < 0)
        fail(ErrorCode::kIo, "cannot create the lock file ", path_, ": ", std::strerror(errno));
      while (::flock(fd_, LOCK_EX) != 0) {
        if (errno != EINTR) fail(ErrorCode::kIo, "cannot lock ", path_, ": ", std::strerror(errno));
      }
      // A cleaner may have taken the lock between open and flock and removed the file: then
      // this lock guards nothing, and a new file is made.
      struct stat held {};
      struct stat named {};
      if (::fstat(fd_, &held) == 0 && ::stat(path_.c_str(), &named) == 0 &&
          held.st_dev == named.st_dev && held.st_ino == named.st_ino) {
        return;
      }
      ::close(fd_);
      fd_ = -1;
    }
    fail(ErrorCode::kIo, "cannot hold the lock file ", path_, " (removed again and again)");
  }
  ~WriterLock() {
    ::unlink(path_.c_str());
    ::close(fd_);
  }
  WriterLock(const WriterLock&) = delete;
  WriterLock& operator=(const WriterLock&) = delete;

 private:
  std::string path_;
  int fd_ = -1;
};

// Whether nobody holds the lock file `path` (it is taken and released at once); false when it
// cannot be opened (it is gone: its writer finished).
bool lock_is_free(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool free = ::flock(fd, LOCK_EX | LOCK_NB) == 0;
  ::close(fd);
  return free;
}

}  // namespace

std::string synthetic_checkpoint_name(const SyntheticSpec& spec) {
  return detail::concat("gpt-oss-E", spec.experts, "-H", spec.hidden, "-I", spec.intermediate, "-k",
                        spec.top_k, "-L", spec.layers, "-seed", spec.seed, "-",
                        to_string(spec.layout), "-v", kSyntheticFormatVersion);
}

std::string ensure_synthetic_checkpoint(const SyntheticSpec& spec, const std::string& cache_root,
                                        const std::function<void(std::string_view)>& progress,
                                        const std::function<void()>& poll) {
  namespace fs = std::filesystem;
  const fs::path final_dir = fs::path(cache_root) / "synth" / synthetic_checkpoint_name(spec);
  // Whatever writers that died left behind goes first, also when the copy is there already.
  remove_stale_synthetic_temporaries(final_dir.parent_path().string());
  if (is_valid_copy(spec, final_dir)) return final_dir.string();
  std::error_code error;
  fs::create_directories(final_dir.parent_path(), error);
  if (error) {
    fail(ErrorCode::kIo, "cannot create ", final_dir.parent_path().string(), ": ", error.message());
  }
  std::random_device entropy;
  const fs::path temp_dir =
      final_dir.string() + detail::concat(".tmp-", ::getpid(), "-", entropy(), entropy());
  // Held while the temporary folder exists: the kernel releases it when this process dies, so a
  // later run knows the folder is no longer written.
  const WriterLock lock(temp_dir.string() + ".lock");
  try {
    write_synthetic_checkpoint(temp_dir.string(), spec, progress, poll);
    std::ofstream(temp_dir / "mxq-synth.txt") << marker_text(spec, temp_dir);
    if (poll) poll();
  } catch (...) {
    fs::remove_all(temp_dir, error);
    throw;
  }
  if (fs::exists(final_dir, error) && !is_valid_copy(spec, final_dir)) {
    // A stale or broken copy: move it out of the way first (rename is atomic), then delete.
    const fs::path stale = final_dir.string() + detail::concat(".stale-", ::getpid());
    fs::rename(final_dir, stale, error);
    fs::remove_all(stale, error);
  }
  fs::rename(temp_dir, final_dir, error);
  if (error) {
    // Another process finished first: use its copy if valid.
    fs::remove_all(temp_dir, error);
    if (!is_valid_copy(spec, final_dir)) {
      fail(ErrorCode::kIo, "cannot put the synthetic checkpoint in place at ", final_dir.string());
    }
  }
  return final_dir.string();
}

int remove_stale_synthetic_temporaries(const std::string& synth_dir) {
  namespace fs = std::filesystem;
  std::error_code error;
  std::vector<fs::path> entries;
  for (fs::directory_iterator it(synth_dir, error), end; !error && it != end; it.increment(error)) {
    entries.push_back(it->path());
  }
  int removed = 0;
  for (const fs::path& path : entries) {
    const std::string name = path.filename().string();
    const bool lock_file = name.ends_with(".lock");
    const std::string base = lock_file ? name.substr(0, name.size() - 5) : name;
    const std::size_t tmp = base.rfind(".tmp-");
    const std::size_t stale = base.rfind(".stale-");
    if (tmp == std::string::npos && stale == std::string::npos) continue;
    const fs::path folder = path.parent_path() / base;
    if (lock_file) {
      // A writer's lock: free means the writer is gone (its folder too, or it goes now).
      if (fs::exists(folder, error) || !lock_is_free(path.string())) continue;
      fs::remove(path, error);
      continue;
    }
    if (!fs::is_directory(path, error)) continue;
    const fs::path lock = path.string() + ".lock";
    bool dead = false;
    if (fs::exists(lock, error)) {
      dead = lock_is_free(lock.string());
    } else {
      // No lock: a folder of an mxq that took none (older versions; ".stale-" folders), or of a
      // writer between creating its lock and its folder... which creates the lock first. Its pid
      // decides: removed only when no such process exists.
      const std::size_t digits = (tmp != std::string::npos ? tmp + 5 : stale + 7);
      pid_t pid = 0;
      const char* first = base.data() + digits;
      const auto [end, parse] = std::from_chars(first, base.data() + base.size(), pid);
      dead =
          parse == std::errc() && end != first && pid > 0 && ::kill(pid, 0) != 0 && errno == ESRCH;
    }
    if (!dead) continue;
    if (fs::remove_all(path, error) != static_cast<std::uintmax_t>(-1) && !error) ++removed;
    if (fs::exists(lock, error)) fs::remove(lock, error);
  }
  return removed;
}

}  // namespace mxq::moe
