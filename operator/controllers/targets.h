// Which profiler servers a ProfileJob captures (docs/architecture.md, "Capture semantics",
// step 1): the pods its selector matches that are Running, Ready, have a pod IP and a
// clusterprof sidecar, plus the explicit addresses.
#ifndef CLUSTERPROF_OPERATOR_CONTROLLERS_TARGETS_H_
#define CLUSTERPROF_OPERATOR_CONTROLLERS_TARGETS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/storage/logdir.h"
#include "operator/api/types.h"
#include "operator/kube/object.h"

namespace clusterprof::controllers {

struct ResolvedTarget {
  // The pod name (the host name in the run), or the address for spec.targets.addresses.
  std::string name;
  std::string address;  // host:port
  std::string node;
};

// A matching pod that is not a target yet but is on its way to becoming one (not failed, not
// crash-looping, not without a sidecar), and the step it waits on.
struct StartingPod {
  std::string name;
  // "scheduling", "image pull", "containers starting", "readiness" or "pod IP".
  std::string stage;
  // metadata.creationTimestamp; 0 when unknown.
  int64_t created_ns = 0;
};

struct TargetResolution {
  // Sorted by name; addresses after pods.
  std::vector<ResolvedTarget> targets;
  // Matching pods left out, each with why: "trainer-3: not Ready".
  std::vector<std::string> skipped;
  // Those of `skipped` that may still become targets, in the same order.
  std::vector<StartingPod> starting;
};

// What a job that waits for its targets says it waits on: "1 of 4 pod(s) ready; waiting on
// scheduling (2: trainer-2, trainer-3), image pull (1: trainer-1)", plus the pods that will not
// become targets ("not coming: trainer-9: no clusterprof sidecar ..."). Pods that do not
// exist yet are counted only by `needed`.
std::string DescribeWait(const TargetResolution& resolution, size_t needed);

// Whether `pod` runs a clusterprof sidecar: a container or init container named
// clusterprof-sidecar, a container port named "clusterprof", or the clusterprof.io/port
// annotation.
bool HasSidecar(const kube::Pod& pod);

// The sidecar's port on `pod`: spec.targets.port when set, else the clusterprof.io/port
// annotation, else the port named "clusterprof", else 8466. InvalidArgument for an annotation
// that is not a port number.
absl::StatusOr<int32_t> SidecarPort(const api::ProfileJobSpec& spec, const kube::Pod& pod);

// The addresses of spec.targets.addresses that are not a pod IP (host:port, any port) of one of
// `namespace_pods` (every pod of the job's namespace): a job may reach only its own namespace's
// pods, with the install's token, unless the operator runs with --allow-external-addresses.
std::vector<std::string> AddressesOutsideNamespace(
    const api::ProfileJobSpec& spec, const std::vector<kube::ObjectPtr>& namespace_pods);

// Why `logdir` is refused: "" when it lies under one of `allowed` (the sidecars'
// --allowed-logdir, the chart's sidecar.allowedLogdirs) or when `allowed` is empty (no check);
// else a sentence naming the logdir and the prefixes.
std::string LogdirOutsideAllowlist(const storage::Logdir& logdir,
                                   const std::vector<storage::Logdir>& allowed);

// `pods` are the pods of the job's namespace that its selector matches (any other kind of object
// is ignored).
TargetResolution ResolveTargets(const api::ProfileJobSpec& spec,
                                const std::vector<kube::ObjectPtr>& pods);

}  // namespace clusterprof::controllers

#endif  // CLUSTERPROF_OPERATOR_CONTROLLERS_TARGETS_H_
