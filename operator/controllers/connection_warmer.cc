#include "operator/controllers/connection_warmer.h"

#include "common/base/strings.h"
#include "operator/controllers/targets.h"
#include "spdlog/spdlog.h"

namespace clusterprof::controllers {
namespace {

// The sidecar address of `object` when it is a pod that a capture could take now; "" otherwise.
std::string SidecarAddress(const kube::Object& object) {
  const auto* pod = dynamic_cast<const kube::Pod*>(&object);
  if (pod == nullptr || pod->phase != "Running" || !pod->ready || pod->pod_ip.empty() ||
      !pod->metadata.deletion_timestamp.empty() || !HasSidecar(*pod)) {
    return "";
  }
  absl::StatusOr<int32_t> port = SidecarPort(api::ProfileJobSpec(), *pod);
  if (!port.ok()) return "";
  return pod->pod_ip.find(':') != std::string::npos ? StrCat("[", pod->pod_ip, "]:", *port)
                                                    : StrCat(pod->pod_ip, ":", *port);
}

}  // namespace

void ConnectionWarmer::Activate(const std::vector<kube::ObjectPtr>& pods) {
  {
    MutexLock lock(&mu_);
    active_ = true;
  }
  for (const kube::ObjectPtr& pod : pods) Update(pod);
  spdlog::info("keeping connections to the sidecars of {} pod(s) ready for captures",
               Warmed().size());
}

void ConnectionWarmer::OnAdd(const kube::ObjectPtr& pod, bool) { Update(pod); }

void ConnectionWarmer::OnUpdate(const kube::ObjectPtr&, const kube::ObjectPtr& new_pod) {
  Update(new_pod);
}

void ConnectionWarmer::OnDelete(const kube::ObjectPtr& pod, bool) { Drop(pod->metadata.Key()); }

void ConnectionWarmer::Update(const kube::ObjectPtr& pod) {
  const std::string key = pod->metadata.Key();
  const std::string address = SidecarAddress(*pod);
  if (address.empty()) {
    Drop(key);
    return;
  }
  std::string old;
  {
    MutexLock lock(&mu_);
    if (!active_) return;
    auto it = warmed_.find(key);
    if (it != warmed_.end() && it->second == address) return;
    if (it != warmed_.end()) old = it->second;
  }
  if (!old.empty()) pool_->Forget(old);
  const bool warmed = pool_->Warm(address);
  MutexLock lock(&mu_);
  if (warmed) {
    warmed_[key] = address;
  } else {
    warmed_.erase(key);
  }
}

void ConnectionWarmer::Drop(const std::string& key) {
  std::string address;
  {
    MutexLock lock(&mu_);
    auto it = warmed_.find(key);
    if (it == warmed_.end()) return;
    address = std::move(it->second);
    warmed_.erase(it);
  }
  pool_->Forget(address);
}

std::map<std::string, std::string> ConnectionWarmer::Warmed() const {
  MutexLock lock(&mu_);
  return warmed_;
}

}  // namespace clusterprof::controllers
