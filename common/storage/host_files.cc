#include "common/storage/host_files.h"

#include "absl/strings/str_cat.h"
#include "common/base/status.h"
#include "common/base/strings.h"
#include "common/io/background_sink.h"
#include "common/io/gzip_sink.h"
#include "common/xspace/builder.h"
#include "common/xspace/trace_json.h"
#include "common/xspace/xspace_io.h"

namespace clusterprof::storage {

absl::StatusOr<HostFiles> WriteHostFiles(Storage& storage, const RunLayout& layout,
                                         std::string_view host_name,
                                         const tensorflow::profiler::XSpace& space,
                                         const HostFilesOptions& options) {
  CLUSTERPROF_ASSIGN_OR_RETURN(const std::string stem, HostFileStem(host_name));
  HostFiles files;
  files.events = xspace::CountEvents(space);
  {
    const std::string path = layout.XPlanePath(stem);
    CLUSTERPROF_ASSIGN_OR_RETURN(auto writer, storage.NewWriter(path));
    CLUSTERPROF_RETURN_IF_ERROR(
        Annotate(xspace::WriteXSpace(space, writer.get()), StrCat("writing ", path)));
    CLUSTERPROF_ASSIGN_OR_RETURN(files.xplane, writer->Commit());
  }
  if (options.write_trace_json) {
    const std::string path = layout.TraceJsonPath(stem);
    CLUSTERPROF_ASSIGN_OR_RETURN(auto writer, storage.NewWriter(path));
    // Generate JSON on this thread; compress and write on the background thread.
    io::GzipSink gzip(writer.get(), options.gzip_level);
    io::BackgroundSink background(&gzip);
    absl::Status status = xspace::WriteTraceJson(space, &background).status();
    const absl::Status finished = background.Finish();
    if (status.ok()) status = finished;
    if (status.ok()) status = gzip.Finish();
    CLUSTERPROF_RETURN_IF_ERROR(Annotate(status, StrCat("writing ", path)));
    CLUSTERPROF_ASSIGN_OR_RETURN(files.trace_json, writer->Commit());
  }
  return files;
}

}  // namespace clusterprof::storage
