// Process-wide settings every clusterprof binary applies first thing in main().
#ifndef CLUSTERPROF_COMMON_BASE_PROCESS_H_
#define CLUSTERPROF_COMMON_BASE_PROCESS_H_

namespace clusterprof {

struct ProcessSettings {
  // Caps glibc's malloc arenas (0 leaves glibc's default of 8 per core). A process with many
  // threads that each parse large responses otherwise keeps freed memory in one arena per
  // thread: the operator's resident size over 10,000 pods halved with 2 (bench/RESULTS.md).
  // No effect in a process linked with jemalloc (the operator now is), which bounds its own.
  int malloc_arenas = 0;
};

// - Turns off abseil's mutex deadlock detection. Debian builds abseil without NDEBUG, so every
//   absl::Mutex (gRPC's included) feeds a global lock graph: 16% of a 1,000-target fan-out's
//   CPU went there (bench/RESULTS.md).
// - Raises the soft limit on open files to the hard limit, as Go programs do, so that one
//   channel per target does not stop at 1,024.
// - Applies `settings`.
// Failures (a limit that cannot change) are ignored: the defaults still work, only smaller.
void ApplyProcessSettings(const ProcessSettings& settings = {});

}  // namespace clusterprof

#endif  // CLUSTERPROF_COMMON_BASE_PROCESS_H_
