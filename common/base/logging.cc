#include "common/base/logging.h"

#include <unistd.h>

#include <chrono>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/base/json_escape.h"
#include "common/base/strings.h"
#include "spdlog/pattern_formatter.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"

namespace clusterprof {
namespace {

void AppendEscaped(std::string_view text, spdlog::memory_buf_t& out) {
  std::string escaped;
  AppendJsonEscaped(text, &escaped);
  out.append(escaped.data(), escaped.data() + escaped.size());
}

class JsonLogFormatter final : public spdlog::formatter {
 public:
  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    const absl::Time time = absl::FromChrono(msg.time);
    const std::string timestamp =
        absl::FormatTime("%Y-%m-%dT%H:%M:%E6SZ", time, absl::UTCTimeZone());
    dest.append(std::string_view("{\"time\":\""));
    dest.append(timestamp);
    dest.append(std::string_view("\",\"level\":\""));
    const auto level = spdlog::level::to_string_view(msg.level);
    dest.append(level.data(), level.data() + level.size());
    dest.append(std::string_view("\""));
    if (msg.logger_name.size() > 0) {
      dest.append(std::string_view(",\"logger\":\""));
      AppendEscaped(std::string_view(msg.logger_name.data(), msg.logger_name.size()), dest);
      dest.append(std::string_view("\""));
    }
    dest.append(std::string_view(",\"msg\":\""));
    AppendEscaped(std::string_view(msg.payload.data(), msg.payload.size()), dest);
    dest.append(std::string_view("\"}\n"));
  }

  std::unique_ptr<spdlog::formatter> clone() const override {
    return std::make_unique<JsonLogFormatter>();
  }
};

}  // namespace

absl::StatusOr<LogFormat> ParseLogFormat(std::string_view name) {
  const std::string lower = absl::AsciiStrToLower(AbslView(name));
  if (lower == "auto") return LogFormat::kAuto;
  if (lower == "text") return LogFormat::kText;
  if (lower == "json") return LogFormat::kJson;
  return absl::InvalidArgumentError(
      StrCat("unknown log format '", name, "': use auto, text or json"));
}

std::unique_ptr<spdlog::formatter> NewJsonLogFormatter() {
  return std::make_unique<JsonLogFormatter>();
}

absl::Status InitLogging(LogFormat format, std::string_view level) {
  const spdlog::level::level_enum parsed = spdlog::level::from_str(std::string(level));
  if (parsed == spdlog::level::off && absl::AsciiStrToLower(AbslView(level)) != "off") {
    return absl::InvalidArgumentError(StrCat(
        "unknown log level '", level, "': use trace, debug, info, warn, error, critical or off"));
  }
  if (format == LogFormat::kAuto) {
    format = isatty(STDERR_FILENO) ? LogFormat::kText : LogFormat::kJson;
  }
  auto logger =
      std::make_shared<spdlog::logger>("", std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
  if (format == LogFormat::kJson) {
    logger->set_formatter(NewJsonLogFormatter());
  } else {
    logger->set_pattern("%Y-%m-%d %H:%M:%S.%e %^%-5l%$ %v");
  }
  logger->set_level(parsed);
  spdlog::set_default_logger(std::move(logger));
  return absl::OkStatus();
}

}  // namespace clusterprof
