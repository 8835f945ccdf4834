// XSpaces for tests and benchmarks.
#ifndef CLUSTERPROF_TESTS_SUPPORT_XSPACE_SAMPLES_H_
#define CLUSTERPROF_TESTS_SUPPORT_XSPACE_SAMPLES_H_

#include <cstdint>
#include <string>

#include "tsl/profiler/protos/xplane.pb.h"

namespace clusterprof::testing {

// A small, fully known capture: a /host:CPU plane with two threads (a step with a nested op,
// TraceMe stats of every type), a /device:GPU:0 plane with one kernel and one memcpy linked to
// their launches by flow ids, a counter line, and a Task Environment plane.
// Every timestamp is fixed, so its trace JSON is a golden file.
tensorflow::profiler::XSpace SmallXSpace();

// A large synthetic capture: `threads` host threads with `events_per_thread` nested events each
// (names from a pool of 64, a step_num stat on one in eight), as a training loop produces.
tensorflow::profiler::XSpace SyntheticXSpace(int threads, int64_t events_per_thread);

// The warnings of `space`, one a line (for EXPECT_THAT ... HasSubstr).
std::string WarningsOf(const tensorflow::profiler::XSpace& space);

}  // namespace clusterprof::testing

#endif  // CLUSTERPROF_TESTS_SUPPORT_XSPACE_SAMPLES_H_
