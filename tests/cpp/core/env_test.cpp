#include "mxq/core/env.h"

#include <gtest/gtest.h>
#include <stdlib.h>  // setenv, unsetenv

#include "mxq/core/error.h"
#include "mxq/core/parallel.h"

#include <atomic>

namespace mxq {
namespace {

class EnvTest : public testing::Test {
 protected:
  void TearDown() override {
    for (const auto& spec : env_registry()) unsetenv(std::string(spec.name).c_str());
    unsetenv("MXQ_NOT_A_VARIABLE");
    unsetenv("XDG_CACHE_HOME");
  }
};

TEST_F(EnvTest, RegistryNamesAreUniqueAndPrefixed) {
  for (const auto& spec : env_registry()) {
    EXPECT_TRUE(spec.name.starts_with("MXQ_")) << spec.name;
    EXPECT_FALSE(spec.meaning.empty()) << spec.name;
    int count = 0;
    for (const auto& other : env_registry()) count += other.name == spec.name;
    EXPECT_EQ(count, 1) << spec.name;
    EXPECT_EQ(env_validate(spec.name), "") << "default of " << spec.name << " must parse";
  }
}

TEST_F(EnvTest, DefaultsApplyWhenUnset) {
  EXPECT_EQ(env_string("MXQ_LOG_LEVEL"), "warn");
  EXPECT_EQ(env_int("MXQ_NUM_THREADS"), 0);
  EXPECT_GE(num_threads(), 1);
}

TEST_F(EnvTest, BadValuesAreErrorsNamingTheVariable) {
  setenv("MXQ_NUM_THREADS", "four", 1);
  try {
    (void)env_int("MXQ_NUM_THREADS");
    FAIL() << "a non-integer must not parse";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "environment variable MXQ_NUM_THREADS: expected an integer, found 'four'");
  }
  setenv("MXQ_NUM_THREADS", "3x", 1);
  EXPECT_THROW((void)env_int("MXQ_NUM_THREADS"), Error);
  setenv("MXQ_NUM_THREADS", "-1", 1);
  EXPECT_THROW((void)num_threads(), Error);
  setenv("MXQ_NUM_THREADS", "3", 1);
  EXPECT_EQ(num_threads(), 3);
  setenv("MXQ_LOG_LEVEL", "loud", 1);
  EXPECT_THROW((void)env_string("MXQ_LOG_LEVEL"), Error);
  EXPECT_NE(env_validate("MXQ_LOG_LEVEL"), "");
  EXPECT_THROW((void)env_spec("MXQ_NOT_A_VARIABLE"), Error);
}

TEST_F(EnvTest, AnUnsetVariableWithoutDefaultIsValidUntilSetBadly) {
  // MXQ_RANK has no default: unset means "not a multi-process launch", not a bad value.
  EXPECT_EQ(env_raw("MXQ_RANK"), std::nullopt);
  EXPECT_EQ(env_validate("MXQ_RANK"), "");
  setenv("MXQ_RANK", "first", 1);
  EXPECT_EQ(env_validate("MXQ_RANK"),
            "environment variable MXQ_RANK: expected an integer, found 'first'");
  setenv("MXQ_RANK", "2", 1);
  EXPECT_EQ(env_int("MXQ_RANK"), 2);
}

TEST_F(EnvTest, UnknownVariablesAreReported) {
  setenv("MXQ_NOT_A_VARIABLE", "1", 1);
  const auto unknown = env_unknown_variables();
  EXPECT_NE(std::find(unknown.begin(), unknown.end(), "MXQ_NOT_A_VARIABLE"), unknown.end());
}

TEST_F(EnvTest, CacheDirPrecedence) {
  setenv("HOME", "/home/someone", 1);
  EXPECT_EQ(cache_dir(), "/home/someone/.cache/mxq");
  setenv("XDG_CACHE_HOME", "/xdg", 1);
  EXPECT_EQ(cache_dir(), "/xdg/mxq");
  setenv("MXQ_CACHE_DIR", "/explicit", 1);
  EXPECT_EQ(cache_dir(), "/explicit");
}

TEST_F(EnvTest, ParallelForCoversEveryIndexOnceAndPropagatesErrors) {
  setenv("MXQ_NUM_THREADS", "4", 1);
  std::vector<std::atomic<int>> hits(1001);
  parallel_for(1001, 10, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) hits[static_cast<std::size_t>(i)]++;
  });
  for (const auto& h : hits) EXPECT_EQ(h.load(), 1);
  EXPECT_THROW(parallel_for(100, 1,
                            [](std::int64_t begin, std::int64_t) {
                              if (begin > 0) fail(ErrorCode::kInternal, "boom");
                            }),
               Error);
}

}  // namespace
}  // namespace mxq
