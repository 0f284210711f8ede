// `mxq tune` into a cache file it cannot save into (its folder cannot be created or written, or
// the file is another fingerprint's) fails before tuning anything, with one message, and leaves
// the file as it was.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "tune_test_util.h"

namespace mxq::tune {
namespace {

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

testing::ProcessResult tune_into(const std::string& cache) {
  return testing::run_cli(
      {"tune", "--preset", "tiny-moe", "--device", "cpu", "--tokens", "1,8", "--cache", cache},
      {"MXQ_AUTOTUNE=tune", "MXQ_LOG_LEVEL=info"});
}

// Refused in one line on stderr (nothing tuned, no warnings, no progress), naming the file.
void expect_refused_up_front(const testing::ProcessResult& result, const std::string& cache,
                             const std::string& why) {
  EXPECT_EQ(result.exit_code, 2) << result.err;
  EXPECT_EQ(count(result.err, "\n"), 1U) << result.err;
  EXPECT_EQ(result.err.rfind("mxq: error: autotune cache " + cache + " cannot be tuned into: ", 0),
            0U)
      << result.err;
  EXPECT_NE(result.err.find(why), std::string::npos) << result.err;
  EXPECT_NE(result.err.find("nothing was tuned"), std::string::npos) << result.err;
  EXPECT_EQ(result.out.find("tuned"), std::string::npos) << result.out;
}

TEST(UnwritableCache, AFolderThatCannotBeMadeIsRefusedBeforeTuning) {
  testing::TempDir dir;
  std::ofstream(dir.file("file")) << "not a folder";
  const std::string cache = dir.file("file") + "/tiny-moe.json";
  expect_refused_up_front(tune_into(cache), cache, "cannot be created");
}

TEST(UnwritableCache, AFolderNoFileCanBeMadeInIsRefusedBeforeTuning) {
  // sysfs: no file can be created at its root, not even by root.
  if (!std::filesystem::is_directory("/sys")) GTEST_SKIP() << "no /sys";
  const std::string cache = "/sys/mxq-unwritable-cache-test.json";
  expect_refused_up_front(tune_into(cache), cache, "/sys/mxq-unwritable-cache-test.json.lock");
  EXPECT_FALSE(std::filesystem::exists(cache));
}

TEST(UnwritableCache, AReadOnlyFolderIsRefusedBeforeTuning) {
  if (::geteuid() == 0) GTEST_SKIP() << "root writes into a read-only folder (see /sys above)";
  testing::TempDir dir;
  const std::string folder = dir.file("read-only");
  ASSERT_EQ(::mkdir(folder.c_str(), 0555), 0);
  const std::string cache = folder + "/tiny-moe.json";
  expect_refused_up_front(tune_into(cache), cache, "Permission denied");
  ::chmod(folder.c_str(), 0755);
}

TEST(UnwritableCache, AnotherFingerprintsFileIsRefusedBeforeTuningAndLeftAsItIs) {
  testing::TempDir dir;
  const std::string cache = dir.file("tiny-moe.json");
  const testing::ProcessResult first = tune_into(cache);
  ASSERT_EQ(first.exit_code, 0) << first.err;
  nlohmann::json file = nlohmann::json::parse(testing::read_file(cache));
  file["fingerprint"]["device"] = "another machine";
  std::ofstream(cache, std::ios::trunc) << file.dump(1);
  const std::string before = testing::read_file(cache);
  expect_refused_up_front(tune_into(cache), cache, "was tuned with another fingerprint (device: ");
  EXPECT_EQ(testing::read_file(cache), before);
}

}  // namespace
}  // namespace mxq::tune
