#include "common/base/logging.h"

#include <memory>
#include <sstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "spdlog/sinks/ostream_sink.h"
#include "spdlog/spdlog.h"

namespace clusterprof {
namespace {

using ::testing::HasSubstr;
using ::testing::MatchesRegex;

TEST(LoggingTest, ParseLogFormat) {
  EXPECT_EQ(*ParseLogFormat("JSON"), LogFormat::kJson);
  EXPECT_EQ(*ParseLogFormat("text"), LogFormat::kText);
  EXPECT_EQ(*ParseLogFormat("auto"), LogFormat::kAuto);
  EXPECT_THAT(ParseLogFormat("xml").status().message(), HasSubstr("'xml'"));
}

TEST(LoggingTest, UnknownLevelIsRejected) {
  EXPECT_EQ(InitLogging(LogFormat::kText, "chatty").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(InitLogging(LogFormat::kText, "off").ok());
}

TEST(LoggingTest, JsonFormatterEscapesAndHasFields) {
  std::ostringstream out;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out);
  sink->set_formatter(NewJsonLogFormatter());
  spdlog::logger logger("sidecar", sink);
  logger.warn("quote \" backslash \\ newline \n ctrl \x01 done");
  const std::string line = out.str();
  ASSERT_FALSE(line.empty());
  EXPECT_EQ(line.back(), '\n');
  EXPECT_THAT(line.substr(0, line.size() - 1),
              MatchesRegex(R"(\{"time":"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]+Z","level":"warning",)"
                           R"("logger":"sidecar","msg":".*"\})"));
  EXPECT_THAT(line, HasSubstr(R"(quote \" backslash \\ newline \n ctrl \u0001 done)"));
}

}  // namespace
}  // namespace clusterprof
