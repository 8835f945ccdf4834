// Storage on the local file system (local paths and file:// logdirs).
#ifndef CLUSTERPROF_COMMON_STORAGE_LOCAL_STORAGE_H_
#define CLUSTERPROF_COMMON_STORAGE_LOCAL_STORAGE_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/storage/storage.h"

namespace clusterprof::storage {

struct LocalStorageOptions {
  // fsync files and directories on commit. Off only in benchmarks that measure everything else.
  bool sync = true;
  // Size of the write buffer in front of write(2).
  size_t buffer_size = 1 << 20;
  // Set: writers create objects only beneath these directories (absolute paths; the sidecar
  // passes its --allowed-logdir prefixes), and an empty list refuses every write. A path must
  // name a root as given or as its real path. The root itself is opened as it is (links and
  // all: it is configuration); below it every directory is opened relative to its parent's
  // descriptor without following links blindly: a symbolic link is followed only while it stays
  // beneath the root, and the temporary file is created and renamed relative to the directory's
  // descriptor. A link swapped in after the caller checked the path cannot redirect the write;
  // the write fails with PERMISSION_DENIED naming the link instead. Unset: anywhere, links
  // followed.
  std::optional<std::vector<std::string>> write_roots;
};

// Thread-safe (it has no mutable state). Writers stream into a hidden temporary file in the
// destination directory (".<name>.tmp-XXXXXX", created exclusively, never through a link) and
// rename it over the destination on commit, so a crash never leaves a partial object under the
// final name.
std::unique_ptr<Storage> NewLocalStorage(LocalStorageOptions options = {});

}  // namespace clusterprof::storage

#endif  // CLUSTERPROF_COMMON_STORAGE_LOCAL_STORAGE_H_
