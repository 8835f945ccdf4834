// Writes one host's capture into a run directory: <host>.xplane.pb for XProf/TensorBoard and
// <host>.trace.json.gz for Perfetto, each streamed and committed atomically through Storage.
#ifndef CLUSTERPROF_COMMON_STORAGE_HOST_FILES_H_
#define CLUSTERPROF_COMMON_STORAGE_HOST_FILES_H_

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/storage/logdir.h"
#include "common/storage/storage.h"
#include "tsl/profiler/protos/xplane.pb.h"

namespace clusterprof::storage {

struct HostFilesOptions {
  bool write_trace_json = true;
  // gzip level for the trace JSON (1 = fastest).
  int gzip_level = 1;
};

struct HostFiles {
  ObjectInfo xplane;
  // Empty uri when not written.
  ObjectInfo trace_json;
  int64_t events = 0;
};

// Writes `space` for `host_name` (sanitized with HostFileStem). The xplane.pb is committed
// before the trace JSON is started, so a failure of the second never loses the first; the error
// then says which file failed.
absl::StatusOr<HostFiles> WriteHostFiles(Storage& storage, const RunLayout& layout,
                                         std::string_view host_name,
                                         const tensorflow::profiler::XSpace& space,
                                         const HostFilesOptions& options = {});

}  // namespace clusterprof::storage

#endif  // CLUSTERPROF_COMMON_STORAGE_HOST_FILES_H_
