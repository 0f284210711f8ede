// `mxq --version`, `mxq info [--json]`, `--help` through the binary.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "cli_test_support.h"
#include "mxq/core/build_info.h"
#include "mxq/core/env.h"

namespace mxq {
namespace {

using testing::run_cli;
using testing::ScratchDir;

TEST(InfoCli, VersionPrintsTheLibraryVersion) {
  const ScratchDir dir("mxq-cli-version");
  const auto r = run_cli(dir, "--version");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.out, "mxq " + build_info().version + "\n");
}

TEST(InfoCli, JsonListsBuildGpusCacheDirAndEveryRegisteredVariable) {
  const ScratchDir dir("mxq-cli-info");
  const auto r = run_cli(dir, "info --json", "MXQ_CACHE_DIR=/some/where MXQ_TYPO_VARIABLE=1");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto info = nlohmann::json::parse(r.out);
  EXPECT_EQ(info["version"], build_info().version);
  EXPECT_EQ(info["build"]["cuda"], build_info().cuda);
  EXPECT_EQ(info["build"]["nccl"], build_info().nccl);
  EXPECT_EQ(info["build"]["nccl_version"], build_info().nccl_version);
  EXPECT_EQ(build_info().nccl, MXQ_WITH_NCCL != 0);
  EXPECT_EQ(build_info().nccl_version.empty(), !build_info().nccl);
  EXPECT_TRUE(info["gpus"].is_array());
  EXPECT_EQ(info["cache_dir"], "/some/where");
  ASSERT_EQ(info["environment"].size(), env_registry().size());
  for (std::size_t i = 0; i < env_registry().size(); ++i) {
    EXPECT_EQ(info["environment"][i]["name"], std::string(env_registry()[i].name));
  }
  // The typo, plus whatever unregistered MXQ_* variables the test itself runs under (e.g. the
  // test suite's own MXQ_TEST_QUICK), which the child inherits.
  std::set<std::string> expected = {"MXQ_TYPO_VARIABLE"};
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const std::string text = *entry;
    const std::string name = text.substr(0, text.find('='));
    const bool registered =
        std::any_of(env_registry().begin(), env_registry().end(),
                    [&](const auto& variable) { return variable.name == name; });
    if (name.starts_with("MXQ_") && !registered) expected.insert(name);
  }
  std::set<std::string> unknown;
  for (const auto& name : info["unknown_environment"]) unknown.insert(name.get<std::string>());
  EXPECT_EQ(unknown, expected);
}

TEST(InfoCli, HumanOutputFlagsBadValues) {
  const ScratchDir dir("mxq-cli-info-bad");
  const auto r = run_cli(dir, "info", "MXQ_NUM_THREADS=many");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("MXQ_NUM_THREADS"), std::string::npos);
  EXPECT_NE(r.out.find("expected an integer, found 'many'"), std::string::npos) << r.out;
  const std::string nccl =
      build_info().nccl ? "NCCL on (" + build_info().nccl_version + ")" : std::string("NCCL off");
  EXPECT_NE(r.out.find(nccl), std::string::npos) << r.out;
}

TEST(InfoCli, ABadLogLevelIsSaidOnceAndTheCommandRuns) {
  const ScratchDir dir("mxq-cli-log-level");
  const auto r = run_cli(dir, "cache ls " + dir.path().string(), "MXQ_LOG_LEVEL=loud");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  const std::size_t at = r.err.find("MXQ_LOG_LEVEL");
  ASSERT_NE(at, std::string::npos) << r.err;
  EXPECT_NE(r.err.find("'loud'"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("MXQ_LOG_LEVEL", at + 1), std::string::npos) << "said once: " << r.err;
}

TEST(InfoCli, EveryCommandHasHelp) {
  const ScratchDir dir("mxq-cli-help");
  for (const std::string command :
       {"", "info", "quantize", "quantize mxfp4", "quantize fp8-block", "dequantize"}) {
    const auto r = run_cli(dir, command + " --help");
    EXPECT_EQ(r.exit_code, 0) << command;
    EXPECT_NE(r.out.find("Usage:"), std::string::npos) << command;
  }
  const auto none = run_cli(dir, "");
  EXPECT_NE(none.exit_code, 0);
}

TEST(InfoCli, AnUnknownCommandIsNamedWithTheCommandsThere) {
  const ScratchDir dir("mxq-cli-unknown");
  const auto top = run_cli(dir, "tnue --preset toy");
  EXPECT_NE(top.exit_code, 0);
  EXPECT_NE(top.err.find("unknown command 'tnue' (expected one of: info,"), std::string::npos)
      << top.err;
  EXPECT_NE(top.err.find("tune"), std::string::npos) << top.err;
  const auto nested = run_cli(dir, "cache foo");
  EXPECT_NE(nested.exit_code, 0);
  EXPECT_NE(nested.err.find("unknown command 'foo' of 'mxq cache' (expected one of: ls,"),
            std::string::npos)
      << nested.err;
  // Words after a command that takes positionals are its arguments, not commands.
  EXPECT_EQ(run_cli(dir, "cache ls " + dir.file("none")).err.find("unknown command"),
            std::string::npos);
}

}  // namespace
}  // namespace mxq
