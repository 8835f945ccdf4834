// Directory and file helpers shared by the storage backends, the sidecar and the operator.
#ifndef CLUSTERPROF_COMMON_STORAGE_DIRS_H_
#define CLUSTERPROF_COMMON_STORAGE_DIRS_H_

#include <sys/types.h>

#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace clusterprof::storage {

// mkdir -p: creates `dir` and its missing parents with `mode`. FailedPrecondition when a file
// is in the way.
absl::Status MakeDirs(const std::string& dir, mode_t mode);

// Writes `data` to `path` whole or not at all: a temporary file beside it (`path`.tmp, created
// exclusively and never through a symbolic link) with exactly `mode` (whatever the umask),
// fsynced, then renamed over `path`. Readers never see half a file, and a process that opened
// the old file keeps it.
absl::Status WriteFileDurably(const std::string& path, std::string_view data, mode_t mode);

// fsyncs the directory itself, so that a rename or unlink in it is durable.
absl::Status SyncDirectory(const std::string& dir);

}  // namespace clusterprof::storage

#endif  // CLUSTERPROF_COMMON_STORAGE_DIRS_H_
