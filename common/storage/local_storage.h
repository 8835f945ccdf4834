// Storage on the local file system (local paths and file:// logdirs).
#ifndef CLUSTERPROF_COMMON_STORAGE_LOCAL_STORAGE_H_
#define CLUSTERPROF_COMMON_STORAGE_LOCAL_STORAGE_H_

#include <memory>

#include "common/storage/storage.h"

namespace clusterprof::storage {

struct LocalStorageOptions {
  // fsync files and directories on commit. Off only in benchmarks that measure everything else.
  bool sync = true;
  // Size of the write buffer in front of write(2).
  size_t buffer_size = 1 << 20;
};

// Thread-safe (it has no mutable state). Writers stream into a hidden temporary file in the
// destination directory (".<name>.tmp-XXXXXX") and rename it over the destination on commit, so
// a crash never leaves a partial object under the final name.
std::unique_ptr<Storage> NewLocalStorage(LocalStorageOptions options = {});

}  // namespace clusterprof::storage

#endif  // CLUSTERPROF_COMMON_STORAGE_LOCAL_STORAGE_H_
