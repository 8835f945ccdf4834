// Directory helpers shared by the storage backends.
#ifndef CLUSTERPROF_COMMON_STORAGE_DIRS_H_
#define CLUSTERPROF_COMMON_STORAGE_DIRS_H_

#include <sys/types.h>

#include <string>

#include "absl/status/status.h"

namespace clusterprof::storage {

// mkdir -p: creates `dir` and its missing parents with `mode`. FailedPrecondition when a file
// is in the way.
absl::Status MakeDirs(const std::string& dir, mode_t mode);

// fsyncs the directory itself, so that a rename or unlink in it is durable.
absl::Status SyncDirectory(const std::string& dir);

}  // namespace clusterprof::storage

#endif  // CLUSTERPROF_COMMON_STORAGE_DIRS_H_
