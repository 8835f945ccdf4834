// Which profiler servers a ProfileJob captures (docs/architecture.md, "Capture semantics",
// step 1): the pods its selector matches that are Running, Ready, have a pod IP and a
// clusterprof sidecar, plus the explicit addresses.
#ifndef CLUSTERPROF_OPERATOR_CONTROLLERS_TARGETS_H_
#define CLUSTERPROF_OPERATOR_CONTROLLERS_TARGETS_H_

#include <string>
#include <vector>

#include "operator/api/types.h"
#include "operator/kube/object.h"

namespace clusterprof::controllers {

struct ResolvedTarget {
  // The pod name (the host name in the run), or the address for spec.targets.addresses.
  std::string name;
  std::string address;  // host:port
  std::string node;
};

struct TargetResolution {
  // Sorted by name; addresses after pods.
  std::vector<ResolvedTarget> targets;
  // Matching pods left out, each with why: "trainer-3: not Ready".
  std::vector<std::string> skipped;
};

// Whether `pod` runs a clusterprof sidecar: a container or init container named
// clusterprof-sidecar, a container port named "clusterprof", or the clusterprof.io/port
// annotation.
bool HasSidecar(const kube::Pod& pod);

// The sidecar's port on `pod`: spec.targets.port when set, else the clusterprof.io/port
// annotation, else the port named "clusterprof", else 8466. InvalidArgument for an annotation
// that is not a port number.
absl::StatusOr<int32_t> SidecarPort(const api::ProfileJobSpec& spec, const kube::Pod& pod);

// `pods` are the pods of the job's namespace that its selector matches (any other kind of object
// is ignored).
TargetResolution ResolveTargets(const api::ProfileJobSpec& spec,
                                const std::vector<kube::ObjectPtr>& pods);

}  // namespace clusterprof::controllers

#endif  // CLUSTERPROF_OPERATOR_CONTROLLERS_TARGETS_H_
