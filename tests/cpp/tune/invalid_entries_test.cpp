// Test 6: hand-edited entries naming an unknown tactic, a tactic that does not support the
// shape, a tactic outside its token range, an unknown op or a bucket the op does not have are
// never served (the default runs, and runs correctly); `mxq cache verify` names each of them and
// `mxq cache prune --stale` removes exactly them.
//
// Every kind is shown with the test op toy_gemm (toy_registry()), whose tactics have shape
// predicates and token ranges, in process: what verify prints and prune --stale judges by is
// entry_problem() against the registry. The `mxq` CLI knows only the built-in ops, whose CPU
// tactics have no token ranges: its verify and prune run on a file of built-in ops with every
// kind those can have.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "mxq/linear/tune.h"
#include "mxq/moe/tune.h"
#include "mxq/tune/autotuner.h"
#include "tune/toy_gemm/toy_gemm.h"
#include "tune/tune_test_util.h"

namespace mxq::tune {
namespace {

using testing::TempDir;

struct Edited {
  Problem problem;
  std::int64_t bucket;
  std::string tactic;
  std::string why;  // part of verify's message
};

nlohmann::json entry_json(const Problem& p, std::int64_t bucket, const std::string& tactic) {
  nlohmann::json shape = nlohmann::json::object();
  for (const ShapeDim& d : p.dims()) shape[d.name] = d.value;
  nlohmann::json dtypes = nlohmann::json::object();
  for (const DtypeField& d : p.dtypes()) dtypes[d.name] = d.dtype;
  return {{"op", p.op()},
          {"shape", shape},
          {"dtypes", dtypes},
          {"bucket", bucket},
          {"tactic", tactic},
          {"median_us", 1.0},
          {"default_us", 2.0},
          {"pass", "hand-edited"},
          {"tuned_at", "2026-01-01T00:00:00Z"},
          {"ranks", 1},
          {"candidates", nlohmann::json::object()}};
}

// Runs `tactic` on a real toy_gemm of `tokens` rows and returns the relative error.
double run_error(const Tactic& tactic, const Problem& p, std::int64_t tokens) {
  const std::int64_t n = p.dim("N");
  const std::int64_t k = p.dim("K");
  std::vector<float> a(static_cast<std::size_t>(tokens * k));
  std::vector<float> w(static_cast<std::size_t>(n * k));
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>((i * 7 % 13) - 6) / 8;
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>((i * 5 % 11) - 5) / 8;
  std::vector<float> out(static_cast<std::size_t>(tokens * n), NAN);
  std::vector<double> ref(out.size());
  const ToyGemmArgs args{a.data(), w.data(), out.data(), tokens, n, k};
  toy_gemm_reference(args, ref.data());
  tactic.run(args);
  double diff = 0;
  double norm = 0;
  for (std::size_t i = 0; i < out.size(); ++i) {
    diff += (out[i] - ref[i]) * (out[i] - ref[i]);
    norm += ref[i] * ref[i];
  }
  return std::sqrt(diff / norm);
}

// The hand-edited entries as the file holds them: key() -> why each is not served (empty: served).
std::map<std::string, std::string> entry_problems(const std::string& path,
                                                  const TacticRegistry& registry) {
  const ReadResult read = read_cache_file(path);
  EXPECT_EQ(read.status, ReadStatus::kOk);
  EXPECT_TRUE(read.file.skipped.empty());
  std::map<std::string, std::string> out;
  for (const CacheEntry& e : read.file.entries)
    out[e.key()] = entry_problem(e, registry, Backend::kCpu);
  return out;
}

std::string key_of(const Edited& e) {
  return e.problem.canonical() + "@" + std::to_string(e.bucket);
}

TEST(InvalidEntries, AreNeverServedAndEachIsNamedWithItsReason) {
  TempDir dir;
  const std::string path = dir.file("cache.json");
  const Problem good = toy_gemm_problem(64, 64);
  const Problem odd_k = toy_gemm_problem(64, 24);  // 24 % 16 != 0
  const Problem odd_n = toy_gemm_problem(30, 64);  // 30 % 4 != 0
  const std::vector<Edited> edited = {
      {toy_gemm_problem(96, 64), 8, "warp_specialized[stages=4]", "is not registered"},
      {odd_k, 8, "unrolled[lanes=16]", "does not support the problem: K=24"},
      {odd_n, 8, "column_tiled[bn=4,threads=1]", "does not support the problem: N=30"},
      {toy_gemm_problem(48, 64), 64, "small_batch[threads=1]", "valid for tokens [1, 16]"},
      {toy_gemm_problem(48, 64), 1, "row_parallel[threads=2]", "valid for tokens [2, inf]"},
      {toy_gemm_problem(80, 64), 48, "unrolled[lanes=8]", "bucket 48 is not a bucket"},
      {Problem("no_such_op", {{"N", 8}}), 8, "anything", "not registered for cpu"},
  };
  // Start from a real file with one good entry, then edit it by hand.
  {
    Autotuner tuner(testing::tune_cpu_config(path, &toy_registry()));
    TuningSession session(tuner, "target");
    ASSERT_EQ(session.tune(good, 8).status, TuneStatus::kTuned);
  }
  nlohmann::json file = nlohmann::json::parse(testing::read_file(path));
  const std::string good_tactic = file["entries"][0]["tactic"];
  for (const Edited& e : edited)
    file["entries"].push_back(entry_json(e.problem, e.bucket, e.tactic));
  testing::write_file(path, file.dump(2));

  const auto tuner = testing::load_cpu_tuner(path, &toy_registry());
  EXPECT_TRUE(tuner->warnings().empty()) << "well-formed entries load quietly; they are not served";
  ASSERT_EQ(tuner->decisions().size(), 1U);
  EXPECT_EQ(tuner->decisions()[0].tactic, good_tactic);
  EXPECT_EQ(tuner->lookup(good, 8).source, SelectionSource::kTuned);
  for (const Edited& e : edited) {
    SCOPED_TRACE(e.tactic + " @" + std::to_string(e.bucket));
    for (std::int64_t tokens : {e.bucket, e.bucket - 1, e.bucket + 1}) {
      if (tokens < 1) continue;
      const Selection s = tuner->lookup(e.problem, tokens);
      if (e.problem.op() == "no_such_op") {
        EXPECT_EQ(s.source, SelectionSource::kUnknownOp);
        EXPECT_EQ(s.tactic, nullptr);
        continue;
      }
      ASSERT_NE(s.tactic, nullptr);
      EXPECT_NE(s.tactic->id(), e.tactic);
      EXPECT_EQ(s.source, SelectionSource::kDefault);
      EXPECT_LT(run_error(*s.tactic, e.problem, tokens), 1e-5);
    }
  }

  // What `mxq cache verify` prints for each entry, and what `prune --stale` drops by: every edited
  // entry with its reason, the good one servable (1 of 8), nothing else.
  const std::map<std::string, std::string> problems = entry_problems(path, toy_registry());
  ASSERT_EQ(problems.size(), edited.size() + 1);
  std::size_t servable = 0;
  for (const auto& [key, why] : problems) servable += why.empty();
  EXPECT_EQ(servable, 1U);
  EXPECT_EQ(problems.at(good.canonical() + "@8"), "");
  for (const Edited& e : edited) {
    ASSERT_EQ(problems.count(key_of(e)), 1U) << key_of(e);
    EXPECT_NE(problems.at(key_of(e)).find(e.why), std::string::npos) << e.why << "\n"
                                                                     << problems.at(key_of(e));
  }

  // `prune --op` takes any file (it judges no tactic): the toy_gemm entries go, the rest stays.
  const testing::ProcessResult prune_op =
      testing::run_cli({"cache", "prune", path, "--op", std::string(kToyGemmOp)});
  ASSERT_EQ(prune_op.exit_code, 0) << prune_op.err;
  const ReadResult pruned = read_cache_file(path);
  ASSERT_EQ(pruned.file.entries.size(), 1U);
  EXPECT_EQ(pruned.file.entries[0].problem.op(), "no_such_op");
}

// The CLI on a file of built-in ops (block_fp8_linear, moe_expert_gemm): an unknown tactic of
// each op, a tactic whose supports() refuses the shape (the blocked CPU tactics need positive
// block extents), a bucket the op does not have and an unknown op.
TEST(InvalidEntries, VerifyNamesEachAndPruneStaleRemovesExactlyThem) {
  TempDir dir;
  const std::string path = dir.file("cache.json");
  const auto linear_problem = [](std::int64_t n, std::int64_t k) {
    return linear::block_fp8_linear_problem(n, k, {64, 64});
  };
  const Problem good = linear_problem(64, 64);
  // Hand-edited: a block of 0 x 64 (block_fp8_linear_problem() refuses to build it).
  const Problem zero_block(std::string(linear::kBlockFp8LinearOp),
                           {{"N", 64}, {"K", 64}, {"block_n", 0}, {"block_k", 64}},
                           {good.dtypes().begin(), good.dtypes().end()});
  const Problem tiny_moe = moe::moe_expert_gemm_problem({8, 8, 128, 128, 2, true});
  const std::vector<Edited> edited = {
      {linear_problem(96, 64), 8, "blocked_f32[tile_n=32]", "is not registered"},
      {tiny_moe, 8, "tiled[pairs=64,rows=8,threads=1]", "is not registered"},
      {zero_block, 8, "blocked_f32[tile_n=16]",
       "does not support the problem: needs positive block extents"},
      {linear_problem(80, 64), 48, "blocked_f32[tile_n=16]", "bucket 48 is not a bucket"},
      {tiny_moe, 48, "tiled[pairs=8,rows=8,threads=1]", "bucket 48 is not a bucket"},
      {Problem("no_such_op", {{"N", 8}}), 8, "anything", "not registered for cpu"},
  };
  // Start from a real, verified file with one good entry, then edit it by hand.
  {
    Autotuner tuner(testing::tune_cpu_config(path));
    TuningSession session(tuner, "target");
    ASSERT_EQ(session.tune(good, 8).status, TuneStatus::kTuned);
  }
  ASSERT_EQ(testing::run_cli({"cache", "verify", path}).exit_code, 0);
  nlohmann::json file = nlohmann::json::parse(testing::read_file(path));
  const std::string good_tactic = file["entries"][0]["tactic"];
  for (const Edited& e : edited)
    file["entries"].push_back(entry_json(e.problem, e.bucket, e.tactic));
  testing::write_file(path, file.dump(2));

  const auto tuner = testing::load_cpu_tuner(path);
  EXPECT_TRUE(tuner->warnings().empty()) << "well-formed entries load quietly; they are not served";
  ASSERT_EQ(tuner->decisions().size(), 1U);
  EXPECT_EQ(tuner->decisions()[0].tactic, good_tactic);
  EXPECT_EQ(tuner->lookup(good, 8).source, SelectionSource::kTuned);
  for (const Edited& e : edited) {
    SCOPED_TRACE(e.tactic + " @" + std::to_string(e.bucket));
    for (std::int64_t tokens : {e.bucket, e.bucket - 1, e.bucket + 1}) {
      const Selection s = tuner->lookup(e.problem, tokens);
      if (e.problem.op() == "no_such_op") {
        EXPECT_EQ(s.source, SelectionSource::kUnknownOp);
        EXPECT_EQ(s.tactic, nullptr);
        continue;
      }
      ASSERT_NE(s.tactic, nullptr);
      EXPECT_NE(s.tactic->id(), e.tactic);
      EXPECT_EQ(s.source, SelectionSource::kDefault);
      if (e.problem == zero_block) continue;  // no such linear exists to run
      // The default runs correctly there (the op's own check against its reference).
      const OpSpec* op = builtin_tactics().find_op(e.problem.op(), Backend::kCpu);
      ASSERT_NE(op, nullptr);
      const CheckResult check = op->make_workload(e.problem, tokens)->check(*s.tactic);
      EXPECT_TRUE(check.ok) << s.tactic->id() << " at " << tokens << ": " << check.detail;
    }
  }

  const testing::ProcessResult verify = testing::run_cli({"cache", "verify", path});
  EXPECT_NE(verify.exit_code, 0);
  for (const Edited& e : edited) {
    EXPECT_NE(verify.out.find(key_of(e)), std::string::npos) << verify.out;
    EXPECT_NE(verify.out.find("entry " + key_of(e) + ": "), std::string::npos) << verify.out;
    EXPECT_NE(verify.out.find(e.why), std::string::npos) << e.why << "\n" << verify.out;
  }
  EXPECT_NE(verify.out.find("1 of " + std::to_string(edited.size() + 1) + " servable"),
            std::string::npos)
      << verify.out;

  const testing::ProcessResult prune = testing::run_cli({"cache", "prune", path, "--stale"});
  ASSERT_EQ(prune.exit_code, 0) << prune.err;
  const testing::ProcessResult verify_again = testing::run_cli({"cache", "verify", path});
  EXPECT_EQ(verify_again.exit_code, 0) << verify_again.out;
  const ReadResult pruned = read_cache_file(path);
  ASSERT_EQ(pruned.status, ReadStatus::kOk);
  ASSERT_EQ(pruned.file.entries.size(), 1U);
  EXPECT_EQ(pruned.file.entries[0].problem, good);

  const testing::ProcessResult prune_op =
      testing::run_cli({"cache", "prune", path, "--op", std::string(linear::kBlockFp8LinearOp)});
  ASSERT_EQ(prune_op.exit_code, 0) << prune_op.err;
  EXPECT_TRUE(read_cache_file(path).file.entries.empty());
}

// `prune --stale` that finds nothing to prune leaves the file as it is (same bytes, same inode):
// a hand-formatted file is not rewritten, nor one tuned on another machine.
TEST(InvalidEntries, PruningNothingLeavesTheFileUntouched) {
  for (const bool foreign : {false, true}) {
    SCOPED_TRACE(foreign ? "another machine's file" : "this machine's file");
    TempDir dir;
    const std::string path = dir.file("cache.json");
    Fingerprint fingerprint = cpu_fingerprint(builtin_tactics());
    if (foreign) fingerprint.device = "Some Other CPU @ 5 GHz";
    {
      CacheStore store(path, fingerprint);
      const CacheEntry e = testing::hand_written_entry(
          linear::block_fp8_linear_problem(64, 64, {64, 64}), 8, "reference");
      ASSERT_TRUE(store.save({&e, 1}).ok);
    }
    // Formatted by hand (as a user's editor would): a rewrite would change the bytes.
    testing::write_file(path, nlohmann::json::parse(testing::read_file(path)).dump(2));
    const std::string bytes = testing::read_file(path);
    struct stat before {};
    ASSERT_EQ(::stat(path.c_str(), &before), 0);

    const testing::ProcessResult prune = testing::run_cli({"cache", "prune", path, "--stale"});
    ASSERT_EQ(prune.exit_code, 0) << prune.err;
    EXPECT_NE(prune.out.find("pruned 0 entries"), std::string::npos) << prune.out;
    struct stat after {};
    ASSERT_EQ(::stat(path.c_str(), &after), 0);
    EXPECT_EQ(after.st_ino, before.st_ino) << "the file was replaced";
    EXPECT_EQ(testing::read_file(path), bytes);
  }
}

}  // namespace
}  // namespace mxq::tune
