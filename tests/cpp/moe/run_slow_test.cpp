// `mxq run` end to end on the default gpt-oss-20b-shaped layer: first run synthesizes into a
// fresh cache directory, the second reuses it, a damaged copy is regenerated. (slow: the
// default layer is 424 MB of MXFP4 weights.)
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "moe_test_util.h"

namespace mxq::moe {
namespace {

nlohmann::json run_main(const std::string& cache, int* exit_code) {
  const std::string command =
      "MXQ_CACHE_DIR=" + cache + " " + std::string(MXQ_CLI_PATH) + " run --json";
  FILE* pipe = ::popen(command.c_str(), "r");
  std::string out;
  char buffer[4096];
  std::size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) out.append(buffer, n);
  const int status = ::pclose(pipe);
  *exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return nlohmann::json::parse(out);
}

std::string run_text(const std::string& cache, int* exit_code) {
  const std::string command =
      "MXQ_CACHE_DIR=" + cache + " " + std::string(MXQ_CLI_PATH) + " run 2>/dev/null";
  FILE* pipe = ::popen(command.c_str(), "r");
  std::string out;
  char buffer[4096];
  std::size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) out.append(buffer, n);
  const int status = ::pclose(pipe);
  *exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

TEST(MxqRun, PassesAndReusesItsCache) {
  testing::TempDir cache("cache");
  int code = -1;
  const nlohmann::json first = run_main(cache.path(), &code);
  EXPECT_EQ(code, 0);
  EXPECT_TRUE(first["pass"].get<bool>());
  EXPECT_EQ(first["intermediate_size_per_partition"], 1440);
  EXPECT_EQ(first["intermediate_size_per_partition_after_pad"], 1536);
  EXPECT_EQ(first["comparison"]["beyond_fp32_bound"], 0);
  EXPECT_LT(first["timings"]["total_seconds"].get<double>(), 60.0);

  const nlohmann::json second = run_main(cache.path(), &code);
  EXPECT_EQ(code, 0);
  EXPECT_LT(second["timings"]["synthesis_or_cache_seconds"].get<double>(), 1.0);
  EXPECT_EQ(second["comparison"], first["comparison"]);  // deterministic

  // The text report explains, right under the comparison, why outputs may differ in bits and
  // what PASS means.
  const std::string text = run_text(cache.path(), &code);
  EXPECT_EQ(code, 0);
  const std::size_t compared = text.find("outputs differ in bits");
  ASSERT_NE(compared, std::string::npos) << text;
  const std::size_t why = text.find('\n', compared) + 1;
  EXPECT_EQ(text.compare(why, 14, "  (the TP=2 ru"), 0) << text;
  for (const char* part : {"fp32 partial sums in another order than TP=1",
                           "bf16 rounding boundary may differ in its last bit",
                           "PASS = every output within the fp32 summation bound and one bf16 ulp"})
    EXPECT_NE(text.find(part, why), std::string::npos) << part << "\n" << text;
  EXPECT_NE(text.find("\nPASS (total "), std::string::npos) << text;

  // Damage the cached copy: it is detected and regenerated.
  const std::filesystem::path dir = first["checkpoint"].get<std::string>();
  std::filesystem::resize_file(dir / "layer-00000.safetensors", 1000);
  const nlohmann::json third = run_main(cache.path(), &code);
  EXPECT_EQ(code, 0);
  EXPECT_TRUE(third["pass"].get<bool>());
  EXPECT_EQ(third["comparison"], first["comparison"]);
}

}  // namespace
}  // namespace mxq::moe
