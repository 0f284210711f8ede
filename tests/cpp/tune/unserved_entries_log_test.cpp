// Cache entries that load but are never served (an unknown tactic, a bucket the op does not
// have) run the default quietly at the default log level; at info level one line per file says
// how many there are and points to `mxq cache verify`. Its own binary: the log level is read
// once per process, so MXQ_LOG_LEVEL is set before anything logs.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "mxq/core/log.h"
#include "mxq/tune/autotuner.h"
#include "tune/toy_gemm/toy_gemm.h"
#include "tune/tune_test_util.h"

namespace mxq::tune {
namespace {

using testing::TempDir;

// What `body` writes to stderr (fd 2).
template <typename Body>
std::string stderr_of(const TempDir& dir, Body&& body) {
  const std::string capture = dir.file("stderr.txt");
  std::fflush(stderr);
  const int saved = ::dup(2);
  FILE* file = std::fopen(capture.c_str(), "w");
  ::dup2(::fileno(file), 2);
  body();
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(saved);
  std::fclose(file);
  return testing::read_file(capture);
}

std::size_t count_of(const std::string& text, const std::string& part) {
  std::size_t n = 0;
  for (std::size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

TEST(UnservedEntries, AreSaidOncePerFileAtInfoLevel) {
  ::setenv("MXQ_LOG_LEVEL", "info", 1);
  ASSERT_EQ(log_level(), LogLevel::kInfo) << "something logged before the test set the level";
  TempDir dir;
  const std::string path = dir.file("cache.json");
  testing::write_cpu_cache(
      path, toy_registry(),
      {testing::hand_written_entry(toy_gemm_problem(64, 64), 8, "rowwise"),
       testing::hand_written_entry(toy_gemm_problem(96, 64), 8, "warp_specialized[stages=4]"),
       testing::hand_written_entry(toy_gemm_problem(80, 64), 48, "unrolled[lanes=8]")});

  std::unique_ptr<Autotuner> tuner;
  const std::string err =
      stderr_of(dir, [&] { tuner = testing::load_cpu_tuner(path, &toy_registry()); });
  EXPECT_EQ(tuner->decisions().size(), 1U);
  EXPECT_TRUE(tuner->warnings().empty()) << "not a warning: serving stays quiet";
  EXPECT_EQ(count_of(err, "[mxq info] autotune cache " + path), 1U) << err;
  EXPECT_NE(err.find("2 of 3 entries are not served"), std::string::npos) << err;
  EXPECT_NE(err.find("bucket 48 is not a bucket"), std::string::npos) << err;  // the first one
  EXPECT_NE(err.find("`mxq cache verify " + path + "`"), std::string::npos) << err;

  // A file whose entries all serve says nothing.
  const std::string clean = dir.file("clean.json");
  testing::write_cpu_cache(clean, toy_registry(),
                           {testing::hand_written_entry(toy_gemm_problem(64, 64), 8, "rowwise")});
  const std::string quiet =
      stderr_of(dir, [&] { tuner = testing::load_cpu_tuner(clean, &toy_registry()); });
  EXPECT_EQ(quiet.find(clean), std::string::npos) << quiet;
}

}  // namespace
}  // namespace mxq::tune
