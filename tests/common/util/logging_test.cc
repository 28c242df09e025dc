#include "common/util/logging.h"

#include <gtest/gtest.h>

namespace tandem::util {
namespace {

TEST(LoggingTest, ParsesLevels) {
  LogLevel level;
  EXPECT_TRUE(ParseLogLevel("debug", &level));
  EXPECT_EQ(level, LogLevel::kDebug);
  EXPECT_TRUE(ParseLogLevel("error", &level));
  EXPECT_EQ(level, LogLevel::kError);
  EXPECT_FALSE(ParseLogLevel("loud", &level));
}

TEST(LoggingTest, DropsMessagesBelowTheMinimumLevel) {
  const LogLevel saved = MinLogLevel();
  SetMinLogLevel(LogLevel::kError);
  int evaluated = 0;
  TANDEM_LOG(INFO) << (++evaluated);
  EXPECT_EQ(evaluated, 0);  // the stream expression is not even evaluated
  testing::internal::CaptureStderr();
  TANDEM_LOG(ERROR) << "visible " << 42;
  const std::string out = testing::internal::GetCapturedStderr();
  EXPECT_NE(out.find("visible 42"), std::string::npos);
  EXPECT_EQ(out[0], 'E');
  SetMinLogLevel(saved);
}

TEST(LoggingDeathTest, CheckFailureAborts) {
  EXPECT_DEATH(TANDEM_CHECK(1 + 1 == 3) << "arithmetic", "Check failed: 1 \\+ 1 == 3 arithmetic");
}

}  // namespace
}  // namespace tandem::util
