// Test 1: a target pass then a draft pass into one file give the union of their entries, and a
// new process serves both with zero tuning. The passes tune tiny MoE expert GEMMs (a built-in op:
// the `mxq` CLI serves, lists and merges their files).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>

#include "mxq/moe/tune.h"
#include "mxq/tune/autotuner.h"
#include "mxq/tune/presets.h"
#include "tune/tune_test_util.h"

namespace mxq::tune {
namespace {

using testing::TempDir;

AutotunerConfig tune_config(const std::string& path) {
  AutotunerConfig config;
  config.options.mode = AutotuneMode::kTune;
  config.options.cache_path = path;
  config.options.measure = testing::quick_measure();
  return config;
}

// The passes of a deployment: a target model and its draft, as tiny MoE problems (a built-in op,
// so that the `mxq` CLI serves their file). A is tiny-moe's CPU problem, B its TP=2 rank shape.
Problem moe_problem(std::int64_t intermediate) {
  return moe::moe_expert_gemm_problem({8, 8, 128, intermediate, 2, true});
}
using Pass = std::vector<PresetProblem>;
Pass target_pass() { return {{moe_problem(128), {1, 2, 4}}}; }
// Shares A with the target (as a draft model shares layer shapes with its target), at odd draft
// token counts, and has B of its own.
Pass draft_pass() { return {{moe_problem(128), {1, 7}}, {moe_problem(64), {1, 3}}}; }

// Every (problem, bucket) key a pass visits.
std::set<std::string> keys_of(const Pass& pass) {
  std::set<std::string> keys;
  const OpSpec* op = builtin_tactics().find_op(moe::kMoeExpertGemmOp, Backend::kCpu);
  for (const PresetProblem& p : pass) {
    for (std::int64_t t : p.tokens) {
      CacheEntry e;
      e.problem = p.problem;
      e.bucket = op->buckets[bucket_index(op->buckets, t)];
      keys.insert(e.key());
    }
  }
  return keys;
}

void run_pass(Autotuner& tuner, const std::string& name, const Pass& pass) {
  TuningSession session(tuner, name);
  for (const PresetProblem& p : pass) {
    session.tune_tokens(p.problem, p.tokens);
  }
}

TEST(MergePasses, TargetThenDraftGiveTheUnionAndANewProcessServesBothWithoutTuning) {
  TempDir dir;
  const std::string path = dir.file("deployment.json");
  const std::set<std::string> target_keys = keys_of(target_pass());
  const std::set<std::string> draft_keys = keys_of(draft_pass());
  std::set<std::string> all_keys = target_keys;
  all_keys.insert(draft_keys.begin(), draft_keys.end());
  ASSERT_LT(all_keys.size(), target_keys.size() + draft_keys.size()) << "passes share a key";
  ASSERT_GT(all_keys.size(), target_keys.size()) << "the draft has keys of its own";
  // The CLI runs below tune tiny-moe's CPU problem under TP=1 (A) and TP=2 (B).
  const auto cpu_problem_of_tiny_moe = [](int tp) {
    for (const PresetProblem& p : find_preset("tiny-moe").problems({tp, 1})) {
      if (p.problem.op() == moe::kMoeExpertGemmOp) return p.problem;
    }
    return Problem();
  };
  ASSERT_EQ(cpu_problem_of_tiny_moe(1), moe_problem(128));
  ASSERT_EQ(cpu_problem_of_tiny_moe(2), moe_problem(64));

  // The draft's tuner exists (and has read the still-empty file) before the target pass runs,
  // as with one tuner per model: its save must merge, not replace.
  Autotuner target_tuner(tune_config(path));
  Autotuner draft_tuner(tune_config(path));
  run_pass(target_tuner, "target", target_pass());
  {
    const ReadResult after_target = read_cache_file(path);
    ASSERT_EQ(after_target.status, ReadStatus::kOk);
    EXPECT_EQ(after_target.file.entries.size(), target_keys.size());
  }
  run_pass(draft_tuner, "draft", draft_pass());
  // A third pass in the first tuner (any order, any number): nothing it already has is lost.
  run_pass(target_tuner, "target-again", target_pass());

  const ReadResult merged = read_cache_file(path);
  ASSERT_EQ(merged.status, ReadStatus::kOk);
  std::set<std::string> file_keys;
  for (const CacheEntry& e : merged.file.entries) {
    file_keys.insert(e.key());
    // A key both passes need is measured once: by the pass that came first.
    EXPECT_EQ(e.pass, target_keys.count(e.key()) != 0 ? "target" : "draft") << e.key();
    EXPECT_TRUE(entry_problem(e, builtin_tactics(), Backend::kCpu).empty()) << e.key();
  }
  EXPECT_EQ(file_keys, all_keys);

  // The same process's tuners now serve every key (the draft tuner the target's entries too,
  // once it reloads; the target tuner everything it saw).
  AutotunerConfig load = tune_config(path);
  load.options.mode = AutotuneMode::kLoad;
  const Autotuner server(load);
  for (const CacheEntry& e : merged.file.entries) {
    const Selection s = server.lookup(e.problem, e.bucket);
    ASSERT_NE(s.tactic, nullptr);
    EXPECT_EQ(s.source, SelectionSource::kTuned) << e.key();
    EXPECT_EQ(s.tactic->id(), e.tactic) << e.key();
  }

  // New processes: the CLI tunes the deployment's keys from this file and measures nothing. A's
  // buckets 1, 2, 4, 8 in a target and a draft pass (both served from the file), then B's (the
  // TP=2 rank shape) at 1 and 4: every key of the file, each in at least one run.
  const std::string before = testing::read_file(path);
  std::map<std::string, std::string> served;
  std::size_t records = 0;
  for (const std::vector<std::string>& layout :
       {std::vector<std::string>{"--draft-preset", "tiny-moe", "--tokens", "1,2,4,8"},
        std::vector<std::string>{"--tp", "2", "--tokens", "1,4"}}) {
    std::vector<std::string> args = {"tune",    "--preset", "tiny-moe", "--ops", "moe_expert_gemm",
                                     "--cache", path,       "--json"};
    args.insert(args.end(), layout.begin(), layout.end());
    const testing::ProcessResult cli = testing::run_cli(args);
    ASSERT_EQ(cli.exit_code, 0) << cli.err;
    const nlohmann::json report = nlohmann::json::parse(cli.out);
    EXPECT_EQ(report["summary"]["tuned"], 0);
    EXPECT_EQ(report["summary"]["hit"], report["records"].size());
    for (const auto& r : report["records"]) {
      EXPECT_EQ(r["status"], "hit") << r.dump();
      served[r["problem"].get<std::string>() + "@" + std::to_string(r["bucket"].get<int>())] =
          r["tactic"];
      ++records;
    }
  }
  EXPECT_EQ(records, 2 * 4 + 2U);  // A: 4 buckets in 2 passes; B: 2 buckets
  EXPECT_EQ(served.size(), all_keys.size());
  for (const CacheEntry& e : merged.file.entries) EXPECT_EQ(served[e.key()], e.tactic) << e.key();
  EXPECT_EQ(testing::read_file(path), before) << "a run without tuning must not rewrite the file";

  // The merge CLI gives the same union from two single-pass files.
  const std::string target_only = dir.file("target.json");
  const std::string draft_only = dir.file("draft.json");
  {
    Autotuner t(tune_config(target_only));
    run_pass(t, "target", target_pass());
    Autotuner d(tune_config(draft_only));
    run_pass(d, "draft", draft_pass());
  }
  const std::string union_path = dir.file("union.json");
  const testing::ProcessResult merge =
      testing::run_cli({"cache", "merge", target_only, draft_only, "-o", union_path});
  ASSERT_EQ(merge.exit_code, 0) << merge.err;
  const ReadResult merged_by_cli = read_cache_file(union_path);
  ASSERT_EQ(merged_by_cli.status, ReadStatus::kOk);
  std::set<std::string> cli_keys;
  for (const CacheEntry& e : merged_by_cli.file.entries) cli_keys.insert(e.key());
  EXPECT_EQ(cli_keys, all_keys);

  // The inspection commands see the same: diff names the draft-only keys, show and ls count.
  const testing::ProcessResult diff = testing::run_cli({"cache", "diff", target_only, union_path});
  EXPECT_EQ(diff.exit_code, 1) << diff.err;
  for (const std::string& key : all_keys) {
    const bool only_in_draft = target_keys.count(key) == 0;
    EXPECT_EQ(diff.out.find("+ " + key + ":") != std::string::npos, only_in_draft) << key;
  }
  EXPECT_EQ(testing::run_cli({"cache", "diff", union_path, union_path}).exit_code, 0);
  const testing::ProcessResult show = testing::run_cli({"cache", "show", union_path, "--json"});
  ASSERT_EQ(show.exit_code, 0) << show.err;
  EXPECT_EQ(nlohmann::json::parse(show.out)["entries"].size(), all_keys.size());
  const testing::ProcessResult ls =
      testing::run_cli({"cache", "ls", dir.path().string(), "--json"});
  ASSERT_EQ(ls.exit_code, 0) << ls.err;
  const nlohmann::json listing = nlohmann::json::parse(ls.out);
  std::map<std::string, std::size_t> counts;
  for (const auto& f : listing["files"]) {
    counts[std::filesystem::path(f["path"].get<std::string>()).filename().string()] =
        f.value("entries", std::size_t{0});
    EXPECT_EQ(f["status"], "this machine") << f.dump();
  }
  EXPECT_EQ(counts["deployment.json"], all_keys.size());
  EXPECT_EQ(counts["target.json"], target_keys.size());
  EXPECT_EQ(counts["draft.json"], draft_keys.size());
  EXPECT_EQ(counts.size(), 4U);  // .lock files are not listed

  // A link to a cache file is listed as a link, not as a second file with the same entries.
  std::filesystem::create_symlink("deployment.json", dir.file("current.json"));
  const nlohmann::json with_link =
      nlohmann::json::parse(testing::run_cli({"cache", "ls", dir.path().string(), "--json"}).out);
  ASSERT_EQ(with_link["files"].size(), 5U);
  for (const auto& f : with_link["files"]) {
    const bool link =
        std::filesystem::path(f["path"].get<std::string>()).filename() == "current.json";
    EXPECT_EQ(f.contains("entries"), !link) << f.dump();
    if (link) {
      EXPECT_EQ(f["status"], "link to deployment.json");
      EXPECT_EQ(f["link_to"], "deployment.json");
    }
  }

  // A path that is no directory is an error, not an empty listing.
  for (const std::string& not_a_dir : {dir.file("missing"), union_path}) {
    const testing::ProcessResult bad = testing::run_cli({"cache", "ls", not_a_dir});
    EXPECT_NE(bad.exit_code, 0) << not_a_dir;
    EXPECT_NE(bad.err.find(not_a_dir), std::string::npos) << bad.err;
  }
}

TEST(MergePasses, EachWinnerIsSavedAtOnceAndLeavingByAnExceptionSavesTheRest) {
  TempDir dir;
  const std::string path = dir.file("cache.json");
  const Problem problem = moe_problem(128);
  Autotuner tuner(tune_config(path));
  {
    TuningSession session(tuner, "target");
    ASSERT_EQ(session.tune(problem, 1).status, TuneStatus::kTuned);
    // Saved before the session ends: a process killed now keeps it.
    ASSERT_EQ(read_cache_file(path).file.entries.size(), 1U);
  }
  // Saving fails for a while (the lock file cannot be opened: a directory stands in its way);
  // the winners stay in memory, and the scope's exit, by an exception, saves them.
  std::filesystem::remove(path + ".lock");
  std::filesystem::create_directory(path + ".lock");
  try {
    TuningSession session(tuner, "draft");
    ASSERT_EQ(session.tune(problem, 2).status, TuneStatus::kTuned);
    ASSERT_EQ(session.tune(problem, 4).status, TuneStatus::kTuned);
    EXPECT_EQ(read_cache_file(path).file.entries.size(), 1U) << "saving was supposed to fail";
    std::filesystem::remove(path + ".lock");
    throw std::runtime_error("the serving engine failed to start");
  } catch (const std::runtime_error&) {
  }
  const ReadResult after = read_cache_file(path);
  ASSERT_EQ(after.status, ReadStatus::kOk);
  EXPECT_EQ(after.file.entries.size(), 3U);
  bool warned = false;
  for (const std::string& w : tuner.warnings())
    warned |= w.find("could not be saved") != std::string::npos;
  EXPECT_TRUE(warned);
}

}  // namespace
}  // namespace mxq::tune
