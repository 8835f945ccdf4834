// clusterprof top: the live steps of many sidecars as one table (docs/triggers.md).
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "analysis/stragglers.h"
#include "cli/commands.h"
#include "cli/top_table.h"
#include "common/base/clock.h"
#include "common/base/token_file.h"
#include "coordinator/coordinator.h"
#include "coordinator/step_watcher.h"
#include "fmt/format.h"

namespace clusterprof::cli {
namespace {

std::atomic<bool> g_interrupted{false};

void OnInterrupt(int) { g_interrupted.store(true); }

}  // namespace

int RunTop(const TopOptions& options, std::ostream& out, std::ostream& err) {
  if (options.steps < 2 || options.steps > 1000) {
    err << "clusterprof top: --steps " << options.steps << " is out of range: give 2 to 1000\n";
    return kExitUsage;
  }
  absl::StatusOr<std::vector<coordinator::Target>> targets =
      coordinator::ParseServiceAddresses(options.service_addr);
  if (!targets.ok()) {
    err << "clusterprof top: --service-addr: " << targets.status().message() << "\n";
    return kExitUsage;
  }
  coordinator::StepWatcher::Options watch;
  if (!options.token_file.empty()) {
    absl::StatusOr<std::string> token = ReadTokenFile(options.token_file);
    if (!token.ok()) {
      err << "clusterprof top: --token-file: " << token.status().message() << "\n";
      return kExitUsage;
    }
    watch.auth_token = *token;
  }
  watch.history = std::max(options.steps * 2, 64);
  std::vector<std::string> addresses;
  for (const coordinator::Target& target : *targets) addresses.push_back(target.address);

  coordinator::StepWatcher watcher(watch);
  watcher.SetTargets(addresses);
  Clock& clock = SystemClock();
  const bool terminal = !options.once && isatty(STDOUT_FILENO) == 1;
  g_interrupted.store(false);
  auto previous = std::signal(SIGINT, OnInterrupt);
  const int64_t started = clock.MonotonicNs();
  uint64_t seen = 0;
  int exit_code = kExitOk;
  while (!g_interrupted.load()) {
    const int64_t elapsed_ms = (clock.MonotonicNs() - started) / kNanosPerMilli;
    const std::vector<coordinator::WatchedSidecar> sidecars = watcher.Snapshot();
    if (options.once) {
      const bool all = std::all_of(sidecars.begin(), sidecars.end(),
                                   [](const auto& s) { return !s.steps.empty(); });
      if (!all && elapsed_ms < options.timeout_ms) {
        seen = watcher.WaitForUpdate(seen, absl::Milliseconds(100));
        continue;
      }
    }
    const TopTable table = BuildTopTable(sidecars, options.steps, clock.WallNs());
    if (terminal) out << "\x1b[H\x1b[J";  // draw over the previous table
    out << FormatTopTable(table, options.steps, clock.WallNs());
    out.flush();
    if (options.once) {
      // Exit 1 when a sidecar could not be followed, as capture does for a failed host.
      exit_code = table.unreachable > 0 ? kExitFailure : kExitOk;
      break;
    }
    if (options.seconds > 0 && elapsed_ms >= options.seconds * 1000) break;
    if (!terminal) out << "\n";
    absl::SleepFor(absl::Milliseconds(options.interval_ms));
  }
  std::signal(SIGINT, previous);
  return exit_code;
}

}  // namespace clusterprof::cli
