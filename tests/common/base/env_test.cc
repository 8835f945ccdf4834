#include "common/base/env.h"

#include <cstdlib>

#include "gtest/gtest.h"

namespace clusterprof {
namespace {

TEST(GetEnvTest, SetUnsetAndEmpty) {
  ASSERT_EQ(setenv("CLUSTERPROF_ENV_TEST", "value", 1), 0);
  EXPECT_EQ(GetEnv("CLUSTERPROF_ENV_TEST"), "value");
  ASSERT_EQ(setenv("CLUSTERPROF_ENV_TEST", "", 1), 0);
  EXPECT_EQ(GetEnv("CLUSTERPROF_ENV_TEST"), std::nullopt);
  ASSERT_EQ(unsetenv("CLUSTERPROF_ENV_TEST"), 0);
  EXPECT_EQ(GetEnv("CLUSTERPROF_ENV_TEST"), std::nullopt);
}

}  // namespace
}  // namespace clusterprof
