#include "operator/controllers/targets.h"

#include <algorithm>
#include <cstdlib>
#include <set>

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

// Waiting reasons that end only when someone changes something (the image, the pod spec), or
// that mean the container ran and failed.
bool IsStuck(const kube::Pod& pod) {
  static constexpr std::string_view kStuck[] = {
      "CrashLoopBackOff",  "ErrImageNeverPull",          "InvalidImageName",
      "RunContainerError", "CreateContainerConfigError", "CreateContainerError"};
  return std::any_of(
      pod.waiting_reasons.begin(), pod.waiting_reasons.end(), [](const std::string& reason) {
        return std::find(std::begin(kStuck), std::end(kStuck), reason) != std::end(kStuck);
      });
}

// The step a pod that is not a target yet waits on; empty when it is not on its way (deleted,
// finished, stuck).
std::string_view StartingStage(const kube::Pod& pod) {
  if (!pod.metadata.deletion_timestamp.empty() || IsStuck(pod)) return "";
  if (pod.phase == "Pending" || pod.phase.empty()) {
    if (pod.node_name.empty()) return "scheduling";
    for (const std::string& reason : pod.waiting_reasons) {
      if (reason == "ErrImagePull" || reason == "ImagePullBackOff") return "image pull";
    }
    return "containers starting";
  }
  if (pod.phase != "Running") return "";
  if (!pod.ready) return "readiness";
  if (pod.pod_ip.empty()) return "pod IP";
  return "";
}

}  // namespace

std::string DescribeWait(const TargetResolution& resolution, size_t needed) {
  std::string text = StrCat(resolution.targets.size(), " target(s) ready, ", needed, " needed");
  // Stages in the order a pod goes through them.
  static constexpr std::string_view kStages[] = {"scheduling", "image pull", "containers starting",
                                                 "readiness", "pod IP"};
  std::vector<std::string> parts;
  for (std::string_view stage : kStages) {
    std::vector<std::string> names;
    for (const StartingPod& pod : resolution.starting) {
      if (pod.stage == stage) names.push_back(pod.name);
    }
    if (names.empty()) continue;
    std::string part = StrCat(stage, " (", names.size(), ": ");
    for (size_t i = 0; i < names.size() && i < 3; ++i)
      StrAppend(&part, i > 0 ? ", " : "", names[i]);
    if (names.size() > 3) StrAppend(&part, ", ...");
    parts.push_back(StrCat(part, ")"));
  }
  if (!parts.empty()) StrAppend(&text, "; waiting on ", absl::StrJoin(parts, ", "));
  // The pods that will not become targets as they are, with why (the user's next question).
  std::vector<std::string> stuck;
  for (const std::string& skipped : resolution.skipped) {
    const std::string_view name = std::string_view(skipped).substr(0, skipped.find(':'));
    const bool is_starting = std::any_of(resolution.starting.begin(), resolution.starting.end(),
                                         [&](const StartingPod& pod) { return pod.name == name; });
    if (!is_starting) stuck.push_back(skipped);
  }
  if (!stuck.empty()) {
    StrAppend(&text, "; not coming: ", stuck.front());
    if (stuck.size() > 1) StrAppend(&text, " (and ", stuck.size() - 1, " more)");
  }
  return text;
}

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
    const std::string_view stage = StartingStage(*pod);
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
    } else if (!why.empty() && pod->node_name.empty() && !pod->unschedulable.empty()) {
      StrAppend(&why, " (not scheduled: ", pod->unschedulable, ")");
    }
    absl::StatusOr<int32_t> port = SidecarPort(spec, *pod);
    if (why.empty() && !port.ok()) why = std::string(port.status().message());
    if (!why.empty()) {
      resolution.skipped.push_back(StrCat(name, ": ", why));
      if (!stage.empty() && HasSidecar(*pod)) {
        const absl::StatusOr<int64_t> created = api::ParseTime(pod->metadata.creation_timestamp);
        resolution.starting.push_back({name, std::string(stage), created.ok() ? *created : 0});
      }
      continue;
    }
    resolution.targets.push_back({name, JoinHostPort(pod->pod_ip, *port), pod->node_name});
  }
  for (const std::string& address : spec.addresses) {
    resolution.targets.push_back({address, address, ""});
  }
  return resolution;
}

std::vector<std::string> AddressesOutsideNamespace(
    const api::ProfileJobSpec& spec, const std::vector<kube::ObjectPtr>& namespace_pods) {
  std::set<std::string> pod_ips;
  for (const kube::ObjectPtr& object : namespace_pods) {
    if (const auto* pod = dynamic_cast<const kube::Pod*>(object.get());
        pod != nullptr && !pod->pod_ip.empty()) {
      pod_ips.insert(pod->pod_ip);
    }
  }
  std::vector<std::string> outside;
  for (const std::string& address : spec.addresses) {
    if (pod_ips.count(std::string(AddressHost(address))) == 0) outside.push_back(address);
  }
  return outside;
}

std::string LogdirOutsideAllowlist(const storage::Logdir& logdir,
                                   const std::vector<storage::Logdir>& allowed) {
  if (allowed.empty()) return "";
  std::string prefixes;
  for (const storage::Logdir& prefix : allowed) {
    if (storage::IsUnderPrefix(logdir, prefix)) return "";
    StrAppend(&prefixes, prefixes.empty() ? "" : ", ", prefix.uri);
  }
  return StrCat("spec.logdir ", logdir.uri,
                " is outside the logdirs the sidecars may write (the chart's "
                "sidecar.allowedLogdirs: ",
                prefixes, "); nothing was captured and no file written");
}

}  // namespace clusterprof::controllers
