// `mxq cache ls|show|diff|merge|verify|prune`: inspect and maintain autotune cache files.
// Reading commands never modify a file; merge and prune write through the same lock + atomic
// rename as the tuner, and never write into a file with another fingerprint.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "autotune_cli.h"
#include "cli_util.h"
#include "commands.h"
#include "mxq/core/build_info.h"
#include "mxq/core/env.h"
#include "mxq/core/error.h"
#include "mxq/tune/autotuner.h"
#include "mxq/tune/cache_file.h"

namespace mxq::cli {
namespace {

namespace fs = std::filesystem;
using tune::CacheEntry;
using tune::CacheFile;

CacheFile read_or_fail(const std::string& path) {
  tune::ReadResult read = tune::read_cache_file(path);
  if (read.status == tune::ReadStatus::kMissing) {
    fail(ErrorCode::kIo, "autotune cache ", path, " does not exist");
  }
  if (read.status == tune::ReadStatus::kCorrupt) {
    fail(ErrorCode::kFormat, "autotune cache ", path, " is unreadable: ", read.problem);
  }
  return std::move(read.file);
}

tune::Backend backend_of(const CacheFile& file) {
  return tune::backend_from_string(file.fingerprint.backend);
}

// This machine's fingerprint for the file's backend (for cuda: the first GPU of that name).
std::optional<tune::Fingerprint> local_fingerprint(const tune::Fingerprint& theirs,
                                                   std::string& why_not) {
  const tune::TacticRegistry& registry = tune::builtin_tactics();
  if (theirs.backend == "cpu") return tune::cpu_fingerprint(registry);
  if (theirs.backend != "cuda") {
    why_not = "unknown backend '" + theirs.backend + "'";
    return std::nullopt;
  }
  const GpuQuery gpus = query_gpus();
  for (const GpuInfo& gpu : gpus.gpus) {
    if (gpu.name == theirs.device) return tune::cuda_fingerprint(gpu.index, registry);
  }
  if (!gpus.gpus.empty()) return tune::cuda_fingerprint(gpus.gpus.front().index, registry);
  why_not = "no GPU visible (" + gpus.note + ")";
  return std::nullopt;
}

std::string dims_text(const tune::Problem& p) {
  std::string out;
  for (const tune::ShapeDim& d : p.dims()) {
    out += (out.empty() ? "" : ",") + d.name + "=" + std::to_string(d.value);
  }
  return out;
}

// ---- ls ----------------------------------------------------------------------------------

void run_ls(const std::string& dir_arg, bool json) {
  const std::string dir = dir_arg.empty() ? cache_dir() + "/autotune" : dir_arg;
  nlohmann::json rows = nlohmann::json::array();
  std::error_code error;
  // A directory the user named must be one (the default one may not exist yet: no files).
  if (!dir_arg.empty() && !fs::is_directory(dir, error)) {
    fail(ErrorCode::kIo, "cache ls: '", dir, "' ",
         fs::exists(dir, error) ? "is not a directory" : "does not exist");
  }
  if (fs::exists(dir, error)) {
    std::vector<fs::path> files;
    for (auto it = fs::recursive_directory_iterator(dir, error); !error && it != fs::end(it);
         it.increment(error)) {
      const std::string name = it->path().filename().string();
      if (it->is_regular_file(error) &&
          (name.ends_with(".json") || name.find(".json.corrupt-") != std::string::npos)) {
        files.push_back(it->path());
      }
    }
    std::sort(files.begin(), files.end());
    std::map<tune::Backend, std::optional<tune::Fingerprint>> local;
    for (const fs::path& path : files) {
      nlohmann::json row = {{"path", path.string()}, {"bytes", fs::file_size(path, error)}};
      if (fs::is_symlink(path, error)) {
        // The store reads and writes the link's target; the target is listed (and counted) once,
        // under its own name when it is in this directory.
        const fs::path target = fs::read_symlink(path, error);
        row["link_to"] = target.string();
        row["status"] = "link to " + target.string();
      } else if (path.filename().string().find(".json.corrupt-") != std::string::npos) {
        row["status"] = "moved aside";
      } else {
        const tune::ReadResult read = tune::read_cache_file(path.string());
        if (read.status != tune::ReadStatus::kOk) {
          row["status"] = "unreadable: " + read.problem;
        } else {
          const tune::Fingerprint& fp = read.file.fingerprint;
          std::string why;
          const auto mine = local_fingerprint(fp, why);
          row["status"] = mine && *mine == fp ? "this machine" : "other fingerprint";
          row["entries"] = read.file.entries.size();
          row["backend"] = fp.backend;
          row["device"] = fp.device;
          row["mxq_version"] = fp.mxq_version;
        }
      }
      rows.push_back(row);
    }
  }
  if (json) {
    print_json({{"dir", dir}, {"files", rows}});
    return;
  }
  std::printf("%s\n", dir.c_str());
  if (rows.empty()) std::printf("  (no cache files)\n");
  for (const auto& row : rows) {
    const std::string rel = fs::relative(row["path"].get<std::string>(), dir).string();
    if (row.contains("entries")) {
      std::printf("  %-70s %5zu entries  %s %s, mxq %s  [%s]\n", rel.c_str(),
                  row["entries"].get<std::size_t>(), row["backend"].get<std::string>().c_str(),
                  row["device"].get<std::string>().c_str(),
                  row["mxq_version"].get<std::string>().c_str(),
                  row["status"].get<std::string>().c_str());
    } else {
      std::printf("  %-70s [%s]\n", rel.c_str(), row["status"].get<std::string>().c_str());
    }
  }
}

// ---- show --------------------------------------------------------------------------------

void run_show(const std::string& path, bool json) {
  const CacheFile file = read_or_fail(path);
  const tune::Backend backend = backend_of(file);
  const tune::TacticRegistry& registry = tune::builtin_tactics();
  // Why this machine serves none of the entries (another fingerprint); empty when it may.
  std::string machine;
  std::string why;
  if (const auto mine = local_fingerprint(file.fingerprint, why); !mine) {
    machine = "cannot compare the fingerprint with this machine: " + why;
  } else if (const auto diffs = mine->differences(file.fingerprint); !diffs.empty()) {
    machine = "tuned with another fingerprint (";
    for (std::size_t i = 0; i < diffs.size(); ++i) machine += (i ? "; " : "") + diffs[i];
    machine += ")";
  }
  if (json) {
    nlohmann::json entries = nlohmann::json::array();
    for (const CacheEntry& e : file.entries) {
      nlohmann::json shape = nlohmann::json::object();
      for (const tune::ShapeDim& d : e.problem.dims()) shape[d.name] = d.value;
      nlohmann::json dtypes = nlohmann::json::object();
      for (const tune::DtypeField& d : e.problem.dtypes()) dtypes[d.name] = d.dtype;
      nlohmann::json candidates = nlohmann::json::object();
      for (const tune::CandidateTiming& c : e.candidates) candidates[c.tactic] = c.median_us;
      std::string problem = tune::entry_problem(e, registry, backend);
      if (problem.empty()) problem = machine;
      entries.push_back({{"key", e.key()},
                         {"op", e.problem.op()},
                         {"shape", shape},
                         {"dtypes", dtypes},
                         {"bucket", e.bucket},
                         {"tactic", e.tactic},
                         {"median_us", e.median_us},
                         {"default_us", e.default_us},
                         {"pass", e.pass},
                         {"tuned_at", e.tuned_at},
                         {"ranks", e.ranks},
                         {"candidates", candidates},
                         {"servable", problem.empty()},
                         {"problem", problem}});
    }
    print_json({{"path", path},
                {"schema_version", tune::kCacheSchemaVersion},
                {"fingerprint", fingerprint_json(file.fingerprint)},
                {"this_machine", machine.empty()},
                {"not_served_here", machine},
                {"entries", entries},
                {"skipped", file.skipped}});
    return;
  }
  std::printf("%s: %zu entries\n", path.c_str(), file.entries.size());
  for (const auto& [name, value] : file.fingerprint.fields()) {
    std::printf("  %-20s %s\n", name.c_str(), value.c_str());
  }
  if (!machine.empty()) std::printf("not served on this machine: %s\n", machine.c_str());
  // Rows by op, shape and bucket (numerically: the keys sort 16 before 2), columns as wide as
  // their longest value.
  std::vector<const CacheEntry*> rows;
  for (const CacheEntry& e : file.entries) rows.push_back(&e);
  const auto dtypes_text = [](const CacheEntry& e) {
    std::string out;
    for (const tune::DtypeField& d : e.problem.dtypes()) out += (out.empty() ? "" : ",") + d.dtype;
    return out;
  };
  std::sort(rows.begin(), rows.end(), [&](const CacheEntry* a, const CacheEntry* b) {
    return std::tuple(a->problem.op(), dims_text(a->problem), dtypes_text(*a), a->bucket) <
           std::tuple(b->problem.op(), dims_text(b->problem), dtypes_text(*b), b->bucket);
  });
  int op_w = 2, shape_w = 5, dtypes_w = 6, tactic_w = 6;
  for (const CacheEntry* e : rows) {
    op_w = std::max(op_w, static_cast<int>(e->problem.op().size()));
    shape_w = std::max(shape_w, static_cast<int>(dims_text(e->problem).size()));
    dtypes_w = std::max(dtypes_w, static_cast<int>(dtypes_text(*e).size()));
    tactic_w = std::max(tactic_w, static_cast<int>(e->tactic.size()));
  }
  std::printf("\n%-*s %-*s %-*s %7s  %-*s %10s %10s %6s  %s\n", op_w, "op", shape_w, "shape",
              dtypes_w, "dtypes", "bucket", tactic_w, "tactic", "us", "default", "gain", "pass");
  for (const CacheEntry* row : rows) {
    const CacheEntry& e = *row;
    const double gain = e.median_us > 0 && e.default_us > 0 ? e.default_us / e.median_us : 1.0;
    std::printf("%-*s %-*s %-*s %7lld  %-*s %10.2f %10.2f %5.2fx  %s\n", op_w,
                e.problem.op().c_str(), shape_w, dims_text(e.problem).c_str(), dtypes_w,
                dtypes_text(e).c_str(), static_cast<long long>(e.bucket), tactic_w,
                e.tactic.c_str(), e.median_us, e.default_us, gain, e.pass.c_str());
    const std::string problem = tune::entry_problem(e, registry, backend);
    if (!problem.empty()) std::printf("    not served: %s\n", problem.c_str());
  }
  for (const std::string& line : file.skipped) std::printf("unreadable %s\n", line.c_str());
}

// ---- diff --------------------------------------------------------------------------------

void run_diff(const std::string& a_path, const std::string& b_path) {
  const CacheFile a = read_or_fail(a_path);
  const CacheFile b = read_or_fail(b_path);
  int differences = 0;
  for (const std::string& line : a.fingerprint.differences(b.fingerprint)) {
    std::printf("fingerprint %s\n", line.c_str());
    ++differences;
  }
  std::map<std::string, const CacheEntry*> in_b;
  for (const CacheEntry& e : b.entries) in_b.emplace(e.key(), &e);
  std::map<std::string, const CacheEntry*> in_a;
  for (const CacheEntry& e : a.entries) in_a.emplace(e.key(), &e);
  for (const CacheEntry& e : a.entries) {
    const auto it = in_b.find(e.key());
    if (it == in_b.end()) {
      std::printf("- %s: %s\n", e.key().c_str(), e.tactic.c_str());
      ++differences;
    } else if (it->second->tactic != e.tactic) {
      std::printf("~ %s: %s (%.2f us) -> %s (%.2f us)\n", e.key().c_str(), e.tactic.c_str(),
                  e.median_us, it->second->tactic.c_str(), it->second->median_us);
      ++differences;
    }
  }
  for (const CacheEntry& e : b.entries) {
    if (in_a.count(e.key()) == 0) {
      std::printf("+ %s: %s\n", e.key().c_str(), e.tactic.c_str());
      ++differences;
    }
  }
  if (differences == 0) {
    std::printf("same fingerprint and decisions (%zu entries)\n", a.entries.size());
    return;
  }
  std::printf("%d difference(s)\n", differences);
  throw ExitStatus{kExitNo};
}

// ---- merge -------------------------------------------------------------------------------

void run_merge(const std::vector<std::string>& inputs, const std::string& out) {
  if (inputs.empty()) fail_argument(ErrorCode::kInvalidArgument, "inputs", "at least one file", 0);
  std::vector<CacheFile> files;
  for (const std::string& path : inputs) files.push_back(read_or_fail(path));
  for (std::size_t i = 1; i < files.size(); ++i) {
    const auto diffs = files[0].fingerprint.differences(files[i].fingerprint);
    if (!diffs.empty()) {
      fail(ErrorCode::kInvalidArgument, "cannot merge ", inputs[0], " and ", inputs[i],
           ": they were tuned with different fingerprints (", diffs.front(),
           diffs.size() > 1 ? ", ..." : "", ")");
    }
  }
  std::map<std::string, CacheEntry> merged;  // later inputs win
  int conflicts = 0;
  for (const CacheFile& file : files) {
    for (const CacheEntry& e : file.entries) {
      const auto it = merged.find(e.key());
      if (it != merged.end() && it->second.tactic != e.tactic) ++conflicts;
      merged.insert_or_assign(e.key(), e);
    }
  }
  std::vector<CacheEntry> entries;
  for (auto& [key, e] : merged) entries.push_back(std::move(e));
  // The inputs' unreadable entries go along as read (never served; kept for a fix, as saves do).
  std::vector<std::string> malformed;
  for (const CacheFile& file : files) {
    malformed.insert(malformed.end(), file.malformed.begin(), file.malformed.end());
  }
  // An existing OUT of the same fingerprint keeps its other entries (nothing is erased).
  tune::CacheStore store(out, files[0].fingerprint);
  const tune::CacheStore::Outcome outcome = store.save(entries, malformed);
  if (!outcome.ok) {
    fail(ErrorCode::kInvalidArgument, "not written: ", out,
         " holds entries of another fingerprint (see the warning above); merge into another -o");
  }
  std::printf("merged %zu file(s), %zu entries (%d conflicting, later file wins) into %s\n",
              files.size(), entries.size(), conflicts, out.c_str());
  if (!malformed.empty()) {
    std::printf("carried %zu unreadable entr%s as read (never served; `mxq cache verify %s`)\n",
                malformed.size(), malformed.size() == 1 ? "y" : "ies", out.c_str());
  }
}

// ---- verify ------------------------------------------------------------------------------

void run_verify(const std::string& path, bool check_device) {
  std::vector<std::string> failures;
  const tune::ReadResult read = tune::read_cache_file(path);
  if (read.status == tune::ReadStatus::kMissing) fail(ErrorCode::kIo, path, " does not exist");
  if (read.status == tune::ReadStatus::kCorrupt) {  // a negative answer, like any failed check
    std::printf("schema: FAIL (%s)\n", read.problem.c_str());
    answer_no("verify ", path, ": unreadable");
  }
  const CacheFile& file = read.file;
  std::printf("schema: ok (%s v%d)\n", std::string(tune::kCacheFormat).c_str(),
              tune::kCacheSchemaVersion);
  std::string why;
  const auto mine = local_fingerprint(file.fingerprint, why);
  if (!mine) {
    failures.push_back("fingerprint: cannot compare with this machine: " + why);
  } else {
    for (const std::string& line : mine->differences(file.fingerprint)) {
      const bool device_field =
          !line.starts_with("mxq_version") && !line.starts_with("registry_hash");
      if (device_field && !check_device) continue;
      failures.push_back("fingerprint " + line);
    }
  }
  if (failures.empty())
    std::printf("fingerprint: ok%s\n", check_device ? "" : " (device not checked)");
  const tune::TacticRegistry& registry = tune::builtin_tactics();
  std::size_t good = 0;
  for (const CacheEntry& e : file.entries) {
    const std::string problem = tune::entry_problem(e, registry, backend_of(file));
    if (problem.empty()) {
      ++good;
    } else {
      failures.push_back("entry " + e.key() + ": " + problem);
    }
  }
  for (const std::string& line : file.skipped) failures.push_back("unreadable " + line);
  std::printf("entries: %zu of %zu servable\n", good, file.entries.size() + file.skipped.size());
  for (const std::string& f : failures) std::printf("FAIL %s\n", f.c_str());
  if (!failures.empty()) answer_no("verify ", path, ": ", failures.size(), " problem(s)");
  std::printf("ok\n");
}

// ---- prune -------------------------------------------------------------------------------

void run_prune(const std::string& path, bool stale, const std::vector<std::string>& ops,
               bool force) {
  if (!stale && ops.empty()) {
    fail_argument(ErrorCode::kInvalidArgument, "prune", "--stale and/or --op NAME", "neither");
  }
  const CacheFile file = read_or_fail(path);
  const tune::Backend backend = backend_of(file);
  const tune::TacticRegistry& registry = tune::builtin_tactics();
  // Staleness is judged by this build's tactics: a file another mxq build wrote (another version
  // or tactic registry, e.g. a CUDA build's file on a CPU-only build) would lose entries that
  // build serves.
  const std::string& version = build_info().version;
  if (stale && !force &&
      (file.fingerprint.mxq_version != version ||
       file.fingerprint.registry_hash != registry.hash())) {
    fail(ErrorCode::kInvalidArgument, "--stale: ", path, " was written by another mxq build (",
         "mxq ", file.fingerprint.mxq_version, ", tactic registry ", file.fingerprint.registry_hash,
         "; this build: mxq ", version, ", registry ", registry.hash(),
         "), whose tactics this one cannot judge; prune it with that build, or pass --force");
  }
  // An --op the file has no entry of is a typo more often than not: say so, change nothing.
  std::set<std::string> file_ops;
  for (const CacheEntry& e : file.entries) file_ops.insert(e.problem.op());
  for (const std::string& op : ops) {
    if (file_ops.count(op) == 0) {
      std::string list;
      for (const std::string& name : file_ops) list += (list.empty() ? "" : ", ") + name;
      fail(ErrorCode::kInvalidArgument, "--op: ", path, " has no entry of op '", op,
           "' (its ops: ", list.empty() ? "none" : list, ")");
    }
  }
  std::vector<std::string> removed;
  const auto drop = [&](const CacheEntry& e) {
    const bool by_op = std::find(ops.begin(), ops.end(), e.problem.op()) != ops.end();
    const bool by_stale = stale && !tune::entry_problem(e, registry, backend).empty();
    if (by_op || by_stale) removed.push_back(e.key() + ": " + e.tactic);
    return by_op || by_stale;
  };
  tune::CacheStore store(path, file.fingerprint);  // the file's own: prune is asked for
  const tune::CacheStore::Outcome outcome = store.rewrite({}, drop);
  if (!outcome.ok) fail(ErrorCode::kInvalidArgument, "not pruned: ", outcome.warnings.back());
  for (const std::string& line : removed) std::printf("removed %s\n", line.c_str());
  std::printf("pruned %zu entr%s from %s\n", removed.size(), removed.size() == 1 ? "y" : "ies",
              path.c_str());
}

}  // namespace

void register_cache(CLI::App& app) {
  auto* cache = app.add_subcommand("cache", "Inspect and maintain autotune cache files");
  cache->require_subcommand(1);

  auto* ls = cache->add_subcommand("ls", "List cache files (default: <cache dir>/autotune)");
  auto ls_dir = std::make_shared<std::string>();
  auto ls_json = std::make_shared<bool>(false);
  ls->add_option("dir", *ls_dir, "Directory to search");
  ls->add_flag("--json", *ls_json, "Print JSON");
  ls->callback([ls_dir, ls_json] { run_ls(*ls_dir, *ls_json); });

  auto* show = cache->add_subcommand("show", "Print a cache file's fingerprint and decisions");
  auto show_file = std::make_shared<std::string>();
  auto show_json = std::make_shared<bool>(false);
  show->add_option("file", *show_file, "Cache file")->required();
  show->add_flag("--json", *show_json, "Print JSON");
  show->callback([show_file, show_json] { run_show(*show_file, *show_json); });

  auto* diff = cache->add_subcommand("diff", "Compare two cache files (exit 1 when they differ)");
  auto diff_a = std::make_shared<std::string>();
  auto diff_b = std::make_shared<std::string>();
  diff->add_option("a", *diff_a, "First file")->required();
  diff->add_option("b", *diff_b, "Second file")->required();
  diff->callback([diff_a, diff_b] { run_diff(*diff_a, *diff_b); });

  auto* merge = cache->add_subcommand("merge", "Merge cache files of one fingerprint into OUT");
  auto merge_inputs = std::make_shared<std::vector<std::string>>();
  auto merge_out = std::make_shared<std::string>();
  merge->add_option("inputs", *merge_inputs, "Files to merge (later ones win)")->required();
  merge->add_option("-o,--output", *merge_out, "Output file (its other entries are kept)")
      ->required();
  merge->callback([merge_inputs, merge_out] { run_merge(*merge_inputs, *merge_out); });

  auto* verify = cache->add_subcommand(
      "verify", "Check schema, fingerprint and that every entry is servable (exit 1 if not)");
  auto verify_file = std::make_shared<std::string>();
  auto verify_no_device = std::make_shared<bool>(false);
  verify->add_option("file", *verify_file, "Cache file")->required();
  verify->add_flag("--no-device-check", *verify_no_device,
                   "Check mxq version and tactic registry but not the device");
  verify->callback(
      [verify_file, verify_no_device] { run_verify(*verify_file, !*verify_no_device); });

  auto* prune = cache->add_subcommand("prune", "Remove stale entries or an op's entries");
  auto prune_file = std::make_shared<std::string>();
  auto prune_stale = std::make_shared<bool>(false);
  auto prune_ops = std::make_shared<std::vector<std::string>>();
  prune->add_option("file", *prune_file, "Cache file")->required();
  prune->add_flag("--stale", *prune_stale, "Entries that would not be served (see verify)");
  auto prune_force = std::make_shared<bool>(false);
  prune->add_option("--op", *prune_ops, "Entries of this op (repeatable)");
  prune->add_flag(
      "--force", *prune_force,
      "With --stale: prune a file another mxq build (version or tactic registry) wrote, "
      "by this build's tactics");
  prune->callback([prune_file, prune_stale, prune_ops, prune_force] {
    run_prune(*prune_file, *prune_stale, *prune_ops, *prune_force);
  });
}

}  // namespace mxq::cli
