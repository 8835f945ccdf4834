// The `clusterprof` subcommands as plain functions: main.cc parses flags into these options and
// calls them; tests call them directly. Each returns the process exit code and writes its
// results to `out` and its errors to `err`.
#ifndef CLUSTERPROF_OPERATOR_CLI_COMMANDS_H_
#define CLUSTERPROF_OPERATOR_CLI_COMMANDS_H_

#include <ostream>
#include <string>

namespace clusterprof::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;

struct ConvertOptions {
  // An .xplane.pb file.
  std::string input;
  // Output path; default: the input with .xplane.pb replaced by .trace.json.gz. A name ending
  // in .json (not .gz) is written uncompressed; "-" writes uncompressed JSON to `out`.
  std::string output;
  // Leave out the top-level "metadata" key (the perfetto_trace.json.gz shape).
  bool perfetto = false;
  int gzip_level = 1;
};

// clusterprof convert <file.xplane.pb> [-o out.trace.json.gz]
int RunConvert(const ConvertOptions& options, std::ostream& out, std::ostream& err);

struct InspectOptions {
  // A run directory (<logdir>/plugins/profile/<run>), a logdir, or an .xplane.pb file.
  std::string path;
  int top = 10;
  int max_lines = 20;
  // Only the per-host table for a run directory; no per-host details.
  bool brief = false;
};

// clusterprof inspect <run dir or file>
int RunInspect(const InspectOptions& options, std::ostream& out, std::ostream& err);

}  // namespace clusterprof::cli

#endif  // CLUSTERPROF_OPERATOR_CLI_COMMANDS_H_
