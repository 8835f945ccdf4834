// A host digest on the wire (clusterprof.v1alpha1.HostDigest, in Sidecar.GetSession's answer):
// the sidecar makes it as a capture ends, and the coordinator compares hosts without reading
// their traces.
#ifndef CLUSTERPROF_ANALYSIS_DIGEST_PROTO_H_
#define CLUSTERPROF_ANALYSIS_DIGEST_PROTO_H_

#include "absl/status/statusor.h"
#include "analysis/digest.h"

namespace clusterprof::v1alpha1 {
class HostDigest;
}  // namespace clusterprof::v1alpha1
namespace tensorflow {
class ProfileOptions;
}  // namespace tensorflow

namespace clusterprof::analysis {

// The patterns a capture's options ask for (advanced_configuration's clusterprof_*_pattern
// string values, proto/profile_options.h), defaults for the others. INVALID_ARGUMENT, naming the
// key, for a value that is not a string or not a regular expression.
absl::StatusOr<DigestOptions> DigestOptionsFromProfile(const tensorflow::ProfileOptions& options);

void DigestToProto(const HostDigest& digest, v1alpha1::HostDigest* proto);

// The most a digest may hold. A sidecar's digest of 1,000 steps is 40-50 KiB with 40 ops; these
// bounds leave room for captures of 100,000 steps (a 100 s capture of 1 ms steps) and keep one
// sidecar's answer from taking the coordinator's memory when it compares 10,000 hosts: a digest
// past any of them is refused by name, and the report goes on without that host.
inline constexpr int64_t kMaxDigestBytes = 8 << 20;
inline constexpr int kMaxDigestSteps = 100'000;
inline constexpr int kMaxDigestOps = 1'000;
// Host and op names longer than this are not names a tracer makes.
inline constexpr size_t kMaxDigestNameBytes = 4096;

// INVALID_ARGUMENT, naming the host and saying what is wrong, for a digest no sidecar makes:
// larger than the bounds above, steps out of order or repeated, negative durations, a collective
// entry outside its step, times that overflow.
absl::StatusOr<HostDigest> DigestFromProto(const v1alpha1::HostDigest& proto);

}  // namespace clusterprof::analysis

#endif  // CLUSTERPROF_ANALYSIS_DIGEST_PROTO_H_
