// The real ops' autotuner tactics: block_fp8_linear (the linear module's CPU tactics) and
// moe_expert_gemm (tilings of the MoE CPU reference), the presets that tune them, and
// `mxq tune --preset tiny-moe --device cpu` end to end.
#include <gtest/gtest.h>

#include <cstring>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "mxq/io/npy.h"
#include "mxq/linear/tune.h"
#include "mxq/moe/synthetic.h"
#include "mxq/moe/tune.h"
#include "mxq/tune/autotuner.h"
#include "mxq/tune/presets.h"
#include "mxq/tune/registry.h"
#include "tune/tune_test_util.h"

namespace mxq::tune {
namespace {

using linear::block_fp8_linear_problem;
using linear::kBlockFp8LinearOp;
using moe::kMoeExpertGemmOp;
using moe::kMoeGpuForwardOp;
using moe::moe_expert_gemm_problem;
using moe::moe_gpu_forward_problem;
using moe::MoeExpertGemmArgs;
using moe::MoeGpuForwardShape;

MoeGpuForwardShape gpu_shape(std::int64_t e, std::int64_t e_local, std::int64_t h,
                             std::int64_t valid, std::int64_t after_pad, std::int64_t k) {
  MoeGpuForwardShape shape;
  shape.experts = e;
  shape.experts_local = e_local;
  shape.hidden = h;
  shape.intermediate_valid = valid;
  shape.intermediate_after_pad = after_pad;
  shape.top_k = k;
  shape.has_bias = true;
  shape.activation = moe::Activation::kSwigluOai;
  return shape;
}

const OpSpec& op_named(std::string_view name) {
  const OpSpec* op = builtin_tactics().find_op(name, Backend::kCpu);
  if (op == nullptr) throw std::runtime_error("op not registered: " + std::string(name));
  return *op;
}

std::set<std::string> tactic_ids(const OpSpec& op) {
  std::set<std::string> ids;
  for (const Tactic* t : builtin_tactics().tactics(op)) ids.insert(t->id());
  return ids;
}

TEST(BlockFp8LinearTactics, AreTheLinearModulesCpuTacticsWithTheReferenceAsDefault) {
  const OpSpec& op = op_named(kBlockFp8LinearOp);
  EXPECT_EQ(op.default_tactic, "reference");
  EXPECT_EQ(tactic_ids(op), (std::set<std::string>{"reference", "blocked_f32[tile_n=16]",
                                                   "blocked_f32[tile_n=64]"}));
  EXPECT_TRUE(builtin_tactics().default_tactic(op).tokens.full());
}

TEST(BlockFp8LinearTactics, EveryTacticMatchesTheReference) {
  const OpSpec& op = op_named(kBlockFp8LinearOp);
  for (const Problem& problem :
       {block_fp8_linear_problem(256, 384), block_fp8_linear_problem(200, 130, {64, 64}),
        block_fp8_linear_problem(96, 256, {128, 128}, ScaleMode::kUe8m0),
        block_fp8_linear_problem(64, 256, {128, 128}, ScaleMode::kFp32, DType::kF32)}) {
    for (const std::int64_t tokens : {1, 7, 32}) {
      const auto workload = op.make_workload(problem, tokens);
      for (const Tactic* tactic : builtin_tactics().tactics(op)) {
        ASSERT_TRUE(tactic->supports(problem).ok) << tactic->id();
        const CheckResult result = workload->check(*tactic);
        EXPECT_TRUE(result.ok) << problem.canonical() << " " << tokens << " " << tactic->id()
                               << ": " << result.detail;
        // The reference is compared with itself: exact.
        if (tactic->variant == "reference") {
          EXPECT_EQ(result.error, 0.0);
        }
      }
    }
  }
}

TEST(BlockFp8LinearTactics, TheOutputDtypeIsPartOfTheKey) {
  EXPECT_NE(block_fp8_linear_problem(64, 256),
            block_fp8_linear_problem(64, 256, {128, 128}, ScaleMode::kFp32, DType::kF32));
  EXPECT_EQ(block_fp8_linear_problem(64, 256).dtype("out"), "bf16");
  EXPECT_THROW((void)block_fp8_linear_problem(64, 256, {128, 128}, ScaleMode::kFp32, DType::kE4M3),
               Error);
}

TEST(MoeExpertGemmTactics, OfferRealAlternativesWithTheReferenceAsDefault) {
  const OpSpec& op = op_named(kMoeExpertGemmOp);
  EXPECT_EQ(op.default_tactic, "reference");
  const std::set<std::string> ids = tactic_ids(op);
  EXPECT_GE(ids.size(), 5U);
  EXPECT_EQ(ids.count("tiled[pairs=4,rows=8,threads=1]"), 1U);
  EXPECT_EQ(ids.count("tiled[pairs=32,rows=64,threads=2]"), 1U);
}

TEST(MoeExpertGemmTactics, EveryTacticIsBitIdenticalToTheReference) {
  const OpSpec& op = op_named(kMoeExpertGemmOp);
  // A whole-model rank and an EP rank holding 3 of 8 experts (other slots are skipped), with and
  // without biases; token counts that do and do not fill the tiles.
  for (const Problem& problem : {moe_expert_gemm_problem({8, 8, 128, 96, 2, true}),
                                 moe_expert_gemm_problem({8, 3, 64, 64, 3, false})}) {
    for (const std::int64_t tokens : {1, 5, 37}) {
      const auto workload = op.make_workload(problem, tokens);
      for (const Tactic* tactic : builtin_tactics().tactics(op)) {
        const CheckResult result = workload->check(*tactic);
        EXPECT_TRUE(result.ok) << problem.canonical() << " " << tokens << " " << tactic->id()
                               << ": " << result.detail;
        EXPECT_EQ(result.error, 0.0);
      }
    }
  }
}

TEST(MoeExpertGemmTactics, TheCheckCatchesASingleFlippedBit) {
  const OpSpec& op = op_named(kMoeExpertGemmOp);
  const Problem problem = moe_expert_gemm_problem({8, 8, 64, 64, 2, true});
  const Tactic& reference = builtin_tactics().default_tactic(op);
  Tactic broken;
  broken.op = std::string(kMoeExpertGemmOp);
  broken.variant = "broken";
  broken.run = TacticRunner::of<MoeExpertGemmArgs>([&reference](const MoeExpertGemmArgs& args) {
    reference.run(args);
    std::uint32_t bits = 0;
    std::memcpy(&bits, &args.partial[args.tokens * 64 - 1], sizeof(bits));
    bits ^= 1U;
    std::memcpy(&args.partial[args.tokens * 64 - 1], &bits, sizeof(bits));
  });
  const auto workload = op.make_workload(problem, 4);
  EXPECT_TRUE(workload->check(reference).ok);
  EXPECT_FALSE(workload->check(broken).ok);
}

std::vector<Problem> problems_of(const std::string& preset, ParallelLayout layout = {}) {
  std::vector<Problem> problems;
  for (const PresetProblem& p : find_preset(preset).problems(layout)) problems.push_back(p.problem);
  return problems;
}

// A MoE preset lists one rank's CPU expert computation and the same rank's GPU forward, whose
// width is padded to the layer's default alignment (128) as `mxq run` / `mxq moe` prepare it.
TEST(Presets, MoePresetsHoldEveryRankShapeForTheCpuAndTheGpu) {
  const auto moe = [](std::int64_t e, std::int64_t e_local, std::int64_t h, std::int64_t i,
                      std::int64_t k) {
    return moe_expert_gemm_problem({e, e_local, h, i, k, true});
  };
  const auto gpu = [](std::int64_t e, std::int64_t e_local, std::int64_t h, std::int64_t i,
                      std::int64_t p, std::int64_t k) {
    return moe_gpu_forward_problem(gpu_shape(e, e_local, h, i, p, k));
  };
  EXPECT_EQ(problems_of("gpt-oss-20b"),
            (std::vector<Problem>{moe(32, 32, 2880, 2880, 4), gpu(32, 32, 2880, 2880, 2944, 4)}));
  EXPECT_EQ(
      problems_of("gpt-oss-120b"),
      (std::vector<Problem>{moe(128, 128, 2880, 2880, 4), gpu(128, 128, 2880, 2880, 2944, 4)}));
  // TP splits I (2880 / 2, padded to 1536), EP splits the experts (128 / 4).
  EXPECT_EQ(problems_of("gpt-oss-120b", {2, 4}),
            (std::vector<Problem>{moe(128, 32, 2880, 1440, 4), gpu(128, 32, 2880, 1440, 1536, 4)}));
  const std::vector<Problem> tiny = problems_of("tiny-moe");
  ASSERT_EQ(tiny.size(), 2U);
  EXPECT_EQ(tiny[0].op(), kMoeExpertGemmOp);
  EXPECT_EQ(tiny[1].op(), kMoeGpuForwardOp);
  EXPECT_LE(tiny[0].dim("H") * tiny[0].dim("I") * tiny[0].dim("E"), 256 * 256 * 16);
  // An uneven EP split: ranks 0 and 1 hold 11 experts, rank 2 holds 10, each shape's key once
  // (serving looks up every rank's own key); more EP ranks than experts is refused.
  EXPECT_EQ(
      problems_of("gpt-oss-20b", {1, 3}),
      (std::vector<Problem>{moe(32, 11, 2880, 2880, 4), moe(32, 10, 2880, 2880, 4),
                            gpu(32, 11, 2880, 2880, 2944, 4), gpu(32, 10, 2880, 2880, 2944, 4)}));
  // An uneven TP split: every rank stores 736 channels (the CPU key), the last holds 672 valid
  // ones (its GPU key) of 2880 = 3 x 736 + 672.
  EXPECT_EQ(problems_of("gpt-oss-120b", {4, 1}),
            (std::vector<Problem>{moe(128, 128, 2880, 736, 4), gpu(128, 128, 2880, 736, 768, 4),
                                  gpu(128, 128, 2880, 672, 768, 4)}));
  EXPECT_THROW(problems_of("gpt-oss-20b", {1, 33}), Error);
  // More TP ranks than 32-channel blocks can fill: I = 128 over 3 ranks stores 64 channels each,
  // and rank 2 holds none. It runs its zero-filled shard on the CPU (the CPU key is the stored
  // width) and no kernel on the GPU (an inactive rank): no GPU key of 0 channels.
  EXPECT_EQ(problems_of("tiny-moe", {3, 1}),
            (std::vector<Problem>{moe(8, 8, 128, 64, 2), gpu(8, 8, 128, 64, 128, 2)}));
}

// The W4A8 presets: the same rank shapes, GPU keys of their own precision (x=fp8_g128), which
// never equal the W4A16 keys; the CPU keys are the W4A16 presets'.
TEST(Presets, W4a8PresetsHoldGpuKeysOfTheirPrecision) {
  MoeGpuForwardShape w4a8 = gpu_shape(128, 32, 2880, 1440, 1536, 4);
  w4a8.activation_quant = moe::ActivationQuant::kFp8Group128;
  const std::vector<Problem> problems = problems_of("gpt-oss-120b-w4a8", {2, 4});
  ASSERT_EQ(problems.size(), 2U);
  EXPECT_EQ(problems[0], problems_of("gpt-oss-120b", {2, 4})[0]);
  EXPECT_EQ(problems[1], moe_gpu_forward_problem(w4a8));
  EXPECT_NE(problems[1], problems_of("gpt-oss-120b", {2, 4})[1]);
  EXPECT_EQ(problems[1].dtype("x"), "fp8_g128");
  EXPECT_EQ(problems_of("gpt-oss-20b-w4a8")[1].dtype("x"), "fp8_g128");
}

TEST(Presets, MoeGpuForwardProblemsRefuseAWidthBelowTheValidChannels) {
  MoeGpuForwardShape shape = gpu_shape(8, 8, 128, 128, 96, 2);  // P < I
  EXPECT_THROW((void)moe_gpu_forward_problem(shape), Error);
  shape.intermediate_after_pad = 144;  // not a multiple of 32
  EXPECT_THROW((void)moe_gpu_forward_problem(shape), Error);
  shape.intermediate_valid = 0;  // a rank without channels has no GPU problem
  shape.intermediate_after_pad = 128;
  EXPECT_THROW((void)moe_gpu_forward_problem(shape), Error);
  shape.intermediate_valid = 128;
  shape.intermediate_after_pad = 256;
  EXPECT_EQ(moe_gpu_forward_problem(shape).canonical(),
            "moe_gpu_forward[E=8,E_local=8,H=128,I=128,P=256,bias=1,top_k=2|act=swiglu_oai,"
            "out=bf16,w=mxfp4,x=bf16]");
  shape.activation_quant = moe::ActivationQuant::kFp8Group128;
  EXPECT_EQ(moe_gpu_forward_problem(shape).canonical(),
            "moe_gpu_forward[E=8,E_local=8,H=128,I=128,P=256,bias=1,top_k=2|act=swiglu_oai,"
            "out=bf16,w=mxfp4,x=fp8_g128]");
}

TEST(Presets, DeepseekV3LinearHoldsTheSixShapesAndSplitsThemOverTp) {
  const auto linear = [](std::int64_t n, std::int64_t k) {
    return block_fp8_linear_problem(n, k, {128, 128});
  };
  EXPECT_EQ(problems_of("deepseek-v3-linear"),
            (std::vector<Problem>{linear(2112, 7168), linear(24576, 1536), linear(32768, 512),
                                  linear(7168, 16384), linear(4096, 7168), linear(7168, 2048)}));
  EXPECT_EQ(problems_of("deepseek-v3-linear", {8, 1}),
            (std::vector<Problem>{linear(2112, 7168), linear(3072, 1536), linear(4096, 512),
                                  linear(7168, 2048), linear(512, 7168), linear(7168, 256)}));
  EXPECT_THROW(problems_of("deepseek-v3-linear", {3, 1}), Error);
}

// The built-in presets are the ops' own (src/moe/moe_presets.cpp, src/linear/linear_presets.cpp);
// the tuner's test op has none among them.
TEST(Presets, TheBuiltInPresetsAreTheOpsOwn) {
  std::set<std::string> names;
  for (const DeploymentPreset& p : deployment_presets()) names.insert(p.name);
  EXPECT_EQ(names, (std::set<std::string>{"deepseek-v3-linear", "gpt-oss-120b", "gpt-oss-20b",
                                          "gpt-oss-120b-w4a8", "gpt-oss-20b-w4a8", "tiny-moe"}));
  try {
    (void)find_preset("toy");
    ADD_FAILURE() << "toy is a test preset";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tiny-moe"), std::string::npos) << e.what();
  }
}

TEST(TinyMoeCli, TunesEveryKeyThenServesAllFromTheCacheWithZeroTuning) {
  testing::TempDir dir;
  const std::string path = dir.file("tiny-moe.json");
  const OpSpec& op = op_named(kMoeExpertGemmOp);
  std::set<std::int64_t> buckets;
  for (const PresetProblem& p : find_preset("tiny-moe").problems({})) {
    for (const std::int64_t t : p.tokens) buckets.insert(op.buckets[bucket_index(op.buckets, t)]);
  }
  const std::vector<std::string> args = {"tune", "--preset", "tiny-moe", "--device",
                                         "cpu",  "--cache",  path,       "--json"};
  const testing::ProcessResult first = testing::run_cli(args);
  ASSERT_EQ(first.exit_code, 0) << first.err;
  const nlohmann::json tuned = nlohmann::json::parse(first.out);
  EXPECT_EQ(tuned["summary"]["tuned"], buckets.size());
  EXPECT_EQ(tuned["summary"]["hit"], 0);
  std::map<std::int64_t, std::string> winners;
  for (const auto& r : tuned["records"]) {
    EXPECT_EQ(r["op"], kMoeExpertGemmOp);
    EXPECT_EQ(r["status"], "tuned") << r.dump();
    // Every candidate was timed: none failed its bit-exact check.
    EXPECT_EQ(r["candidates"].size(), tactic_ids(op).size());
    for (const auto& c : r["candidates"]) EXPECT_EQ(c["status"], "timed") << c.dump();
    winners[r["bucket"].get<std::int64_t>()] = r["tactic"];
  }
  EXPECT_EQ(winners.size(), buckets.size());
  EXPECT_EQ(testing::run_cli({"cache", "verify", path}).exit_code, 0);

  const testing::ProcessResult second = testing::run_cli(args);
  ASSERT_EQ(second.exit_code, 0) << second.err;
  const nlohmann::json served = nlohmann::json::parse(second.out);
  EXPECT_EQ(served["summary"]["tuned"], 0);
  EXPECT_EQ(served["summary"]["hit"], buckets.size());
  for (const auto& r : served["records"]) {
    EXPECT_EQ(r["status"], "hit") << r.dump();
    EXPECT_EQ(r["tactic"], winners[r["bucket"].get<std::int64_t>()]) << r.dump();
  }
}

// E=8 over 3 EP ranks: ranks 0 and 1 hold 3 experts, rank 2 holds 2 (a key of its own). `mxq tune`
// tunes both keys and `mxq moe` serves every rank from the cache (rank 2 ran its default before).
TEST(TinyMoeCli, AnUnevenEpSplitTunesAndServesEveryRanksKey) {
  testing::TempDir dir;
  const std::string cache = dir.file("tiny-moe-ep3.json");
  const std::string checkpoint = dir.file("ckpt");
  ASSERT_EQ(testing::run_cli({"synth", "gpt-oss", checkpoint, "--experts", "8", "--hidden", "128",
                              "--intermediate", "128", "--top-k", "2", "--layers", "1"})
                .exit_code,
            0);
  const testing::ProcessResult tune =
      testing::run_cli({"tune", "--preset", "tiny-moe", "--device", "cpu", "--ep", "3", "--tokens",
                        "4", "--cache", cache, "--ops", std::string(kMoeExpertGemmOp), "--json"});
  ASSERT_EQ(tune.exit_code, 0) << tune.err;
  EXPECT_EQ(nlohmann::json::parse(tune.out)["summary"]["tuned"], 2);
  io::write_npy(dir.file("x.npy"), moe::synthetic_tokens(4, 128, 3));
  const testing::ProcessResult run =
      testing::run_cli({"moe", "--checkpoint", checkpoint, "--ep", "3", "--input",
                        dir.file("x.npy"), "--output", dir.file("y.npy"), "--json"},
                       {"MXQ_AUTOTUNE_CACHE=" + cache});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const nlohmann::json report = nlohmann::json::parse(run.out);
  ASSERT_EQ(report["ranks"].size(), 3U);
  for (const auto& rank : report["ranks"])
    EXPECT_EQ(rank["tactic_from_cache"], true) << rank.dump();
  EXPECT_EQ(report["tactic_from_cache"], true);
}

TEST(TuneCli, BudgetIsTheFlagForAllPassesElseTheVariableForEachPass) {
  testing::TempDir dir;
  const std::vector<std::string> args = {
      "tune",  "--preset", "tiny-moe", "--tokens", "1", "--cache", dir.file("tiny-moe.json"),
      "--json"};
  const auto budget_of = [&](const std::vector<std::string>& extra,
                             const std::vector<std::string>& env) {
    std::vector<std::string> argv = args;
    argv.insert(argv.end(), extra.begin(), extra.end());
    const testing::ProcessResult r = testing::run_cli(argv, env);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return nlohmann::json::parse(r.out)["budget"];
  };
  const nlohmann::json from_env = budget_of({}, {"MXQ_AUTOTUNE_BUDGET=600"});
  EXPECT_EQ(from_env["seconds"], 600.0);
  EXPECT_EQ(from_env["for"], "each pass");
  EXPECT_EQ(from_env["from"], "MXQ_AUTOTUNE_BUDGET");
  const nlohmann::json from_flag = budget_of({"--budget", "300"}, {"MXQ_AUTOTUNE_BUDGET=600"});
  EXPECT_EQ(from_flag["seconds"], 300.0);
  EXPECT_EQ(from_flag["for"], "all passes");
  EXPECT_EQ(from_flag["from"], "--budget");
  const nlohmann::json unlimited = budget_of({}, {});
  EXPECT_EQ(unlimited["seconds"], 0.0);
}

TEST(TuneCli, AnOpThePresetsDoNotTuneIsAnError) {
  testing::TempDir dir;
  const testing::ProcessResult r =
      testing::run_cli({"tune", "--preset", "tiny-moe", "--ops", "moe_expert_gemm,nope", "--cache",
                        dir.file("c.json")});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--ops: 'nope'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("moe_expert_gemm"), std::string::npos) << r.err;  // the ops it could be
  EXPECT_FALSE(std::filesystem::exists(dir.file("c.json")));
}

TEST(TuneCli, DecisionsThatCannotBeSavedFailTheRun) {
  testing::TempDir dir;
  const std::string path = dir.file("c.json");
  const std::vector<std::string> args = {"tune", "--preset", "tiny-moe", "--tokens",
                                         "1",    "--cache",  path};
  ASSERT_EQ(testing::run_cli(args).exit_code, 0);
  // The same file as if tuned on another machine: not served, and not written into (refused
  // before tuning: unwritable_cache_test).
  nlohmann::json file = nlohmann::json::parse(testing::read_file(path));
  file["fingerprint"]["device"] = "another CPU";
  testing::write_file(path, file.dump(2));
  const std::string foreign = testing::read_file(path);
  const testing::ProcessResult r = testing::run_cli(args);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("cannot be tuned into"), std::string::npos) << r.err;
  EXPECT_EQ(testing::read_file(path), foreign);
  // `cache show` says so too: none of its entries is served here.
  const testing::ProcessResult show = testing::run_cli({"cache", "show", path, "--json"});
  ASSERT_EQ(show.exit_code, 0) << show.err;
  const nlohmann::json shown = nlohmann::json::parse(show.out);
  EXPECT_EQ(shown["fingerprint"], file["fingerprint"])
      << "the file's fingerprint, numbers as numbers";
  EXPECT_FALSE(shown["this_machine"].get<bool>());
  EXPECT_NE(shown["not_served_here"].get<std::string>().find("another CPU"), std::string::npos);
  ASSERT_FALSE(shown["entries"].empty());
  for (const auto& e : shown["entries"]) EXPECT_FALSE(e["servable"].get<bool>()) << e.dump();
  // Exit statuses: a verify that finds problems answers 1; an error (a missing file) is 2.
  EXPECT_EQ(testing::run_cli({"cache", "verify", path}).exit_code, 1);
  EXPECT_EQ(testing::run_cli({"cache", "verify", dir.file("missing.json")}).exit_code, 2);
  EXPECT_EQ(testing::run_cli({"cache", "diff", path, dir.file("missing.json")}).exit_code, 2);
  EXPECT_EQ(r.exit_code, 2);  // the tune run that could not save
  // An unreadable file is a negative answer too, not an error.
  testing::write_file(dir.file("truncated.json"), "{");
  const testing::ProcessResult truncated =
      testing::run_cli({"cache", "verify", dir.file("truncated.json")});
  EXPECT_EQ(truncated.exit_code, 1) << truncated.err;
  EXPECT_NE(truncated.out.find("schema: FAIL"), std::string::npos) << truncated.out;
}

// `prune --stale` judges entries by this build's tactics: on a file another build wrote (another
// tactic registry) a tactic this build lacks may be one that build serves, so it is refused and
// the file left as it is, unless --force.
TEST(TuneCli, PruneStaleRefusesAFileOfAnotherBuildUnlessForced) {
  testing::TempDir dir;
  const std::string path = dir.file("c.json");
  ASSERT_EQ(testing::run_cli({"tune", "--preset", "tiny-moe", "--tokens", "1", "--cache", path})
                .exit_code,
            0);
  nlohmann::json file = nlohmann::json::parse(testing::read_file(path));
  file["fingerprint"]["registry_hash"] = "0123456789abcdef";
  ASSERT_FALSE(file["entries"].empty());
  file["entries"][0]["tactic"] =
      "tiled[pairs=64,rows=8,threads=1]";  // a tactic of that other build
  testing::write_file(path, file.dump(2));
  const std::string theirs = testing::read_file(path);
  const testing::ProcessResult refused = testing::run_cli({"cache", "prune", path, "--stale"});
  EXPECT_EQ(refused.exit_code, 2);
  EXPECT_NE(refused.err.find("another mxq build"), std::string::npos) << refused.err;
  EXPECT_EQ(testing::read_file(path), theirs);
  const testing::ProcessResult forced =
      testing::run_cli({"cache", "prune", path, "--stale", "--force"});
  ASSERT_EQ(forced.exit_code, 0) << forced.err;
  EXPECT_NE(forced.out.find("tiled[pairs=64,rows=8,threads=1]"), std::string::npos) << forced.out;
  EXPECT_EQ(nlohmann::json::parse(testing::read_file(path))["entries"].size(),
            file["entries"].size() - 1);
}

TEST(TuneCli, CacheShowOrdersBucketsByValueAndPruneRefusesAnAbsentOp) {
  testing::TempDir dir;
  const std::string path = dir.file("c.json");
  ASSERT_EQ(
      testing::run_cli({"tune", "--preset", "tiny-moe", "--tokens", "1,2,16", "--cache", path})
          .exit_code,
      0);
  const testing::ProcessResult show = testing::run_cli({"cache", "show", path});
  ASSERT_EQ(show.exit_code, 0) << show.err;
  // Each tiny-moe problem's rows come in bucket order 1, 2, 16 (as text, 16 sorts before 2).
  std::vector<long long> buckets;
  std::istringstream lines(show.out);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream words(line);
    std::string op, shape, dtypes;
    long long bucket = 0;
    if (words >> op >> shape >> dtypes >> bucket && op == "moe_expert_gemm")
      buckets.push_back(bucket);
  }
  ASSERT_FALSE(buckets.empty()) << show.out;
  ASSERT_EQ(buckets.size() % 3, 0U) << show.out;
  for (std::size_t i = 0; i < buckets.size(); i += 3) {
    EXPECT_EQ(buckets[i], 1);
    EXPECT_EQ(buckets[i + 1], 2);
    EXPECT_EQ(buckets[i + 2], 16);
  }

  const std::string before = testing::read_file(path);
  const testing::ProcessResult typo =
      testing::run_cli({"cache", "prune", path, "--op", "moe_expert_gem"});
  EXPECT_EQ(typo.exit_code, 2);
  EXPECT_NE(typo.err.find("its ops: moe_expert_gemm"), std::string::npos) << typo.err;
  EXPECT_EQ(testing::read_file(path), before);
  EXPECT_EQ(testing::run_cli({"cache", "prune", path, "--op", "moe_expert_gemm"}).exit_code, 0);
  EXPECT_TRUE(read_cache_file(path).file.entries.empty());
}

}  // namespace
}  // namespace mxq::tune
