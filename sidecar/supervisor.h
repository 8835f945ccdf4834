// Keeps the sidecar's container running while the sidecar itself fails.
//
// Kubernetes counts a pod Ready only when every container is: a sidecar container that exits (a
// bad flag, a missing token Secret, a crash) and waits in CrashLoopBackOff would take a serving
// pod out of its Service, and for profiling, which the workload never needs. So the injected
// sidecar runs `clusterprof-sidecar --supervise ...`: this process starts the real sidecar as its
// child and, whenever the child exits, logs why and starts it again after a backoff (1 s,
// doubling to 60 s, back to 1 s after 10 minutes of running). The container stays Running; the
// operator learns whether the sidecar answers by calling it (docs/webhook.md).
//
// SIGTERM and SIGINT are passed to the child, and the supervisor then exits with the child's
// status (0 when the child ended because of that signal). As the container's first process it
// also reaps orphans that end up as its children.
//
// Not thread-safe: call it from main() before any thread starts (it changes the signal mask and
// forks).
#ifndef CLUSTERPROF_SIDECAR_SUPERVISOR_H_
#define CLUSTERPROF_SIDECAR_SUPERVISOR_H_

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace clusterprof::sidecar {

inline constexpr std::string_view kSuperviseFlag = "--supervise";

struct SupervisorOptions {
  std::chrono::milliseconds initial_backoff{1000};
  std::chrono::milliseconds max_backoff{60000};
  // A child that ran this long before exiting restarts after initial_backoff again.
  std::chrono::milliseconds healthy_after{600000};
  // Each line the supervisor has to say (a child's exit, a restart, the end).
  std::function<void(const std::string&)> log;
};

// The child's command when argv asks for supervision (--supervise anywhere in it): argv without
// that flag, with /proc/self/exe as the program. nullopt when argv does not ask for it.
std::optional<std::vector<std::string>> SupervisedCommand(int argc, const char* const* argv);

// Runs `command` (a program path and its arguments) until SIGTERM or SIGINT, restarting it each
// time it exits. Returns the exit status for main().
int RunSupervised(const std::vector<std::string>& command, const SupervisorOptions& options);

// The --log-format value in argv ("" when not given), so that the supervisor's lines match the
// sidecar's.
std::string LogFormatArgument(const std::vector<std::string>& argv);

}  // namespace clusterprof::sidecar

#endif  // CLUSTERPROF_SIDECAR_SUPERVISOR_H_
