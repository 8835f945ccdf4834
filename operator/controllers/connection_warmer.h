// Keeps the operator's connections to the sidecars ready before any capture needs them: when a
// pod with a clusterprof sidecar is Running and Ready with a pod IP, its sidecar's channel in the
// pool is made and connects (its TLS handshake done then, off every capture's path); when the pod
// goes, or its address changes, the channel is dropped. A pool that is full warms no more (the
// captures' own connections then take the place of the least recently used).
//
// Inactive until Activate (the leader's: only the replica that captures keeps connections).
// Thread-safe (the informer calls it from its own thread).
#ifndef CLUSTERPROF_OPERATOR_CONTROLLERS_CONNECTION_WARMER_H_
#define CLUSTERPROF_OPERATOR_CONTROLLERS_CONNECTION_WARMER_H_

#include <map>
#include <string>
#include <vector>

#include "common/base/mutex.h"
#include "coordinator/connector.h"
#include "operator/kube/informer.h"

namespace clusterprof::controllers {

class ConnectionWarmer final : public kube::ResourceEventHandler {
 public:
  explicit ConnectionWarmer(coordinator::ChannelPool* pool) : pool_(pool) {}

  // From now on pods are warmed: `pods` (the informer's cache) at once, then as events come.
  void Activate(const std::vector<kube::ObjectPtr>& pods);

  void OnAdd(const kube::ObjectPtr& pod, bool initial_list) override;
  void OnUpdate(const kube::ObjectPtr& old_pod, const kube::ObjectPtr& new_pod) override;
  void OnDelete(const kube::ObjectPtr& pod, bool final_state_unknown) override;

  // The address warmed for each pod (namespace/name), for tests and diagnostics.
  std::map<std::string, std::string> Warmed() const;

 private:
  void Update(const kube::ObjectPtr& pod);
  void Drop(const std::string& key);

  coordinator::ChannelPool* const pool_;
  mutable Mutex mu_;
  bool active_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, std::string> warmed_ ABSL_GUARDED_BY(mu_);
};

}  // namespace clusterprof::controllers

#endif  // CLUSTERPROF_OPERATOR_CONTROLLERS_CONNECTION_WARMER_H_
