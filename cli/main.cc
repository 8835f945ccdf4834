// clusterprof: the command line tool. Parses flags and runs a subcommand from commands.h.
#include <filesystem>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "CLI/CLI.hpp"
#include "cli/commands.h"
#include "cli/completion.h"
#include "cli/verbs.h"
#include "common/base/logging.h"
#include "common/base/process.h"
#include "common/base/strings.h"
#include "common/grpc/log_bridge.h"
#include "google/protobuf/stubs/logging.h"
#include "pplx/threadpool.h"
#include "spdlog/spdlog.h"

namespace {

// The kubectl plugin: `kubectl clusterprof VERB` runs this binary as kubectl-clusterprof.
bool RunsAsKubectlPlugin(const char* argv0) {
  const std::string name = std::filesystem::path(argv0).filename().string();
  return name == "kubectl-clusterprof" || name == "kubectl_complete-clusterprof";
}

// kubectl's completion of a plugin runs kubectl_complete-<plugin> with the words.
bool RunsAsPluginCompletion(const char* argv0) {
  return std::filesystem::path(argv0).filename().string() == "kubectl_complete-clusterprof";
}

}  // namespace

int main(int argc, char** argv) {
  clusterprof::ApplyProcessSettings();
  // cpprestsdk's HTTP clients (gs:// uploads) run on its thread pool, 40 threads by default; our
  // callers block on them from threads of their own, so 2 do: a 1 GiB upload then holds half the
  // memory, with fewer handoffs between threads (bench/RESULTS.md).
  crossplat::threadpool::initialize_with_threads(2);
  const bool plugin = RunsAsKubectlPlugin(argv[0]);
  CLI::App app{plugin
                   ? "Profile ML jobs on Kubernetes: one synchronized capture of every pod, "
                     "with the verdict on who holds the job back"
                   : "clusterprof: synchronized profiles of ML jobs, and tools for their traces"};
  app.name(plugin ? "kubectl clusterprof" : "clusterprof");
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("clusterprof 0.1.0"));
  const clusterprof::cli::Verbs verbs(&app, plugin);
  if (RunsAsPluginCompletion(argv[0])) {
    return clusterprof::cli::Complete(app, std::vector<std::string>(argv + 1, argv + argc),
                                      std::cout);
  }
  if (argc >= 2 && std::string_view(argv[1]) == "__complete") {
    return clusterprof::cli::Complete(app, std::vector<std::string>(argv + 2, argv + argc),
                                      std::cout);
  }
  // As kubectl does: the tool, or a subcommand, given no arguments at all prints its help.
  if (argc == 1) {
    std::cout << app.help();
    return 0;
  }
  if (argc == 2 && verbs.PrintHelp(argv[1], std::cout)) return 0;
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; every other flag error is a usage error (exit 2).
    const int code = app.exit(e);
    return code == 0 ? 0 : clusterprof::cli::kExitUsage;
  }
  (void)clusterprof::InitLogging(clusterprof::LogFormat::kText, "warn");
  // gRPC's own lines (a sidecar's certificate refused, as this client sees it) as ours,
  // rate-limited, instead of raw lines on stderr; the capture's own message names the cause.
  clusterprof::grpclog::LogBridge grpc_log({});
  (void)grpc_log.Install();
  // protobuf explains parse failures (e.g. invalid UTF-8 in a string field) through its log;
  // show that as a warning next to our own error instead of a raw "[libprotobuf ERROR ...]".
  google::protobuf::SetLogHandler(
      +[](google::protobuf::LogLevel level, const char* file, int line, const std::string& msg) {
        spdlog::warn("protobuf: {}", msg);
      });

  return verbs.Run(std::cout, std::cerr);
}
