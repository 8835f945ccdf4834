// Installs clusterprof's CRDs (crds/) into a test control plane with kubectl, the way a user
// does, and waits until the API server serves them.
#ifndef CLUSTERPROF_TESTS_OPERATOR_CRD_FIXTURE_H_
#define CLUSTERPROF_TESTS_OPERATOR_CRD_FIXTURE_H_

#include <string>

#include "absl/status/status.h"
#include "common/base/strings.h"
#include "tests/support/kube_control_plane.h"

namespace clusterprof::testing {

// NotFound when kubectl is not on PATH. Writes an admin kubeconfig to `kubeconfig` and applies
// `source_dir`/crds/. kube-apiserver 1.20 does not know CEL rules, so kubectl's client-side
// validation is off (the server drops them).
inline absl::Status InstallCrds(const KubeControlPlane& plane, const std::string& source_dir,
                                const std::string& kubeconfig) {
  if (absl::StatusOr<std::string> kubectl = FindProgram("kubectl"); !kubectl.ok()) {
    return absl::NotFoundError("kubectl is not installed: the CRDs are applied the way users do");
  }
  if (absl::Status written = plane.WriteKubeconfig(kubeconfig, plane.admin_token());
      !written.ok()) {
    return written;
  }
  for (std::vector<std::string> argv :
       {std::vector<std::string>{"kubectl", "--kubeconfig", kubeconfig, "apply", "--validate=false",
                                 "-f", StrCat(source_dir, "/crds/")},
        std::vector<std::string>{
            "kubectl", "--kubeconfig", kubeconfig, "wait", "--for=condition=established",
            "--timeout=60s", "crd/profilejobs.clusterprof.io",
            "crd/profileschedules.clusterprof.io", "crd/profiletriggers.clusterprof.io"}}) {
    absl::StatusOr<CommandResult> result = RunCommand(argv, std::chrono::seconds(90));
    if (!result.ok()) return result.status();
    if (result->exit_code != 0) {
      return absl::InternalError(StrCat(argv[3], " failed: ", result->out, result->err));
    }
  }
  return absl::OkStatus();
}

}  // namespace clusterprof::testing

#endif  // CLUSTERPROF_TESTS_OPERATOR_CRD_FIXTURE_H_
