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

// INVALID_ARGUMENT, saying what is wrong, for a digest no sidecar makes: steps out of order or
// repeated, negative durations, a collective entry outside its step, times that overflow.
absl::StatusOr<HostDigest> DigestFromProto(const v1alpha1::HostDigest& proto);

}  // namespace clusterprof::analysis

#endif  // CLUSTERPROF_ANALYSIS_DIGEST_PROTO_H_
