// Logging setup. Code logs through spdlog (SPDLOG_INFO, spdlog::warn, ...); main() calls
// InitLogging once to pick the format: readable text for terminals, one JSON object per line for
// services whose logs are collected.
#ifndef CLUSTERPROF_COMMON_BASE_LOGGING_H_
#define CLUSTERPROF_COMMON_BASE_LOGGING_H_

#include <memory>
#include <string_view>

#include "absl/status/statusor.h"

namespace spdlog {
class formatter;
}

namespace clusterprof {

enum class LogFormat {
  kAuto,  // text when stderr is a terminal, JSON otherwise
  kText,
  kJson,
};

// Parses "auto", "text" or "json".
absl::StatusOr<LogFormat> ParseLogFormat(std::string_view name);

// Sends the default spdlog logger to stderr with `format` at `level` ("trace", "debug", "info",
// "warn", "error", "critical", "off"). Returns InvalidArgument for an unknown level.
absl::Status InitLogging(LogFormat format, std::string_view level);

// A formatter that writes each record as one JSON object:
// {"time":"2026-11-21T10:00:00.123456Z","level":"info","logger":"sidecar","msg":"..."}.
std::unique_ptr<spdlog::formatter> NewJsonLogFormatter();

}  // namespace clusterprof

#endif  // CLUSTERPROF_COMMON_BASE_LOGGING_H_
