// Merges the XSpace of another profiler (the workload's own TF/JAX profiler server) into the one
// a capture is building, so both land in one host file:
//   - its `/host:CPU` plane is added as a plane of its own (several `/host:CPU` planes are
//     allowed; its thread lines stay apart from ours, which may carry the same thread ids);
//   - its device planes (`/device:TPU:<n>`, ...) and any other planes are added, unless a plane
//     of that name is already there (our tracer recorded that device): then it is left out with
//     a warning;
//   - its `Task Environment` plane is left out (the capture has its own);
//   - host names not already listed are added; its warnings and errors are added, prefixed with
//     `source`.
// Added planes get ids after the largest already used.
#ifndef CLUSTERPROF_COMMON_XSPACE_MERGE_H_
#define CLUSTERPROF_COMMON_XSPACE_MERGE_H_

#include <cstdint>
#include <string_view>

#include "tsl/profiler/protos/xplane.pb.h"

namespace clusterprof::xspace {

struct MergeStats {
  int planes = 0;      // planes added
  int64_t events = 0;  // events on them
};

MergeStats MergeXSpace(tensorflow::profiler::XSpace from, tensorflow::profiler::XSpace* into,
                       std::string_view source);

}  // namespace clusterprof::xspace

#endif  // CLUSTERPROF_COMMON_XSPACE_MERGE_H_
