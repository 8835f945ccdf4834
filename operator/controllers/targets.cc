#include "operator/controllers/targets.h"

#include <algorithm>
#include <cstdlib>

#include "absl/strings/str_join.h"
#include "common/base/strings.h"

namespace clusterprof::controllers {
namespace {

bool IsSidecarContainer(const kube::Container& container) {
  if (container.name == api::kSidecarContainerName) return true;
  return std::any_of(
      container.ports.begin(), container.ports.end(),
      [](const kube::ContainerPort& port) { return port.name == api::kSidecarPortName; });
}

std::string JoinHostPort(const std::string& host, int32_t port) {
  if (host.find(':') != std::string::npos) return StrCat("[", host, "]:", port);
  return StrCat(host, ":", port);
}

}  // namespace

bool HasSidecar(const kube::Pod& pod) {
  if (kube::FindValue(pod.metadata.annotations, api::kPortAnnotation) != nullptr) return true;
  return std::any_of(pod.containers.begin(), pod.containers.end(), IsSidecarContainer) ||
         std::any_of(pod.init_containers.begin(), pod.init_containers.end(), IsSidecarContainer);
}

absl::StatusOr<int32_t> SidecarPort(const api::ProfileJobSpec& spec, const kube::Pod& pod) {
  if (spec.port != 0) return spec.port;
  if (const std::string* text = kube::FindValue(pod.metadata.annotations, api::kPortAnnotation)) {
    const std::optional<int> port = ParsePort(StripAsciiWhitespace(*text));
    if (!port.has_value()) {
      return absl::InvalidArgumentError(StrCat("annotation ", api::kPortAnnotation, "=\"", *text,
                                               "\" is not a port number (1-65535)"));
    }
    return *port;
  }
  for (const auto* containers : {&pod.containers, &pod.init_containers}) {
    for (const kube::Container& container : *containers) {
      for (const kube::ContainerPort& port : container.ports) {
        if (port.name == api::kSidecarPortName && port.container_port > 0)
          return port.container_port;
      }
    }
  }
  return api::kDefaultSidecarPort;
}

TargetResolution ResolveTargets(const api::ProfileJobSpec& spec,
                                const std::vector<kube::ObjectPtr>& pods) {
  TargetResolution resolution;
  std::vector<const kube::Pod*> sorted;
  for (const kube::ObjectPtr& object : pods) {
    if (const auto* pod = dynamic_cast<const kube::Pod*>(object.get())) sorted.push_back(pod);
  }
  std::sort(sorted.begin(), sorted.end(), [](const kube::Pod* a, const kube::Pod* b) {
    return a->metadata.name < b->metadata.name;
  });
  for (const kube::Pod* pod : sorted) {
    const std::string& name = pod->metadata.name;
    std::string why;
    if (!pod->metadata.deletion_timestamp.empty()) {
      why = "being deleted";
    } else if (pod->phase != "Running") {
      why = StrCat("phase ", pod->phase.empty() ? "unknown" : pod->phase, ", not Running");
    } else if (!pod->ready) {
      why = "not Ready";
    } else if (pod->pod_ip.empty()) {
      why = "no pod IP yet";
    } else if (!HasSidecar(*pod)) {
      why = StrCat("no clusterprof sidecar (no ", api::kSidecarContainerName,
                   " container, no container port named ", api::kSidecarPortName, ", no ",
                   api::kPortAnnotation, " annotation)");
    }
    // What keeps its containers from running, when the kubelet says (an image missing on the
    // node, a crash loop): the user's next question.
    if (!why.empty() && !pod->waiting.empty()) {
      StrAppend(&why, " (", absl::StrJoin(pod->waiting, "; "), ")");
    }
    absl::StatusOr<int32_t> port = SidecarPort(spec, *pod);
    if (why.empty() && !port.ok()) why = std::string(port.status().message());
    if (!why.empty()) {
      resolution.skipped.push_back(StrCat(name, ": ", why));
      continue;
    }
    resolution.targets.push_back({name, JoinHostPort(pod->pod_ip, *port), pod->node_name});
  }
  for (const std::string& address : spec.addresses) {
    resolution.targets.push_back({address, address, ""});
  }
  return resolution;
}

}  // namespace clusterprof::controllers
