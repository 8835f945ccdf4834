#include "common/base/process.h"

#include <malloc.h>
#include <sys/resource.h>

#include "absl/synchronization/mutex.h"

namespace clusterprof {

void ApplyProcessSettings(const ProcessSettings& settings) {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  struct rlimit files {};
  if (getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    setrlimit(RLIMIT_NOFILE, &files);
  }
  if (settings.malloc_arenas > 0) mallopt(M_ARENA_MAX, settings.malloc_arenas);
}

}  // namespace clusterprof
