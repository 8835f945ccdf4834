// What informers cache: decoded API objects. Every kind has ObjectMeta; a Decoder turns the JSON
// the server sends into an Object of the kind's own shape. JsonObject keeps the whole object
// (for custom resources the operator reads in full); Pod keeps only what the operator uses, so
// that a cache of every pod in a large cluster stays small (bench/RESULTS.md, informer memory).
// Cached objects are immutable and shared: readers hold ObjectPtr, never a reference into the
// cache.
#ifndef CLUSTERPROF_OPERATOR_KUBE_OBJECT_H_
#define CLUSTERPROF_OPERATOR_KUBE_OBJECT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "cpprest/json.h"

namespace clusterprof::kube {

// Labels and annotations: sorted by key, one entry per key. A sorted vector is a quarter of the
// size of a std::map, and objects carry few of them.
using StringMap = std::vector<std::pair<std::string, std::string>>;

// The value of `key`, or nullptr.
const std::string* FindValue(const StringMap& map, std::string_view key);

struct OwnerReference {
  std::string api_version;
  std::string kind;
  std::string name;
  std::string uid;
  bool controller = false;
};

struct ObjectMeta {
  std::string namespace_;
  std::string name;
  std::string uid;
  std::string resource_version;
  int64_t generation = 0;
  std::string creation_timestamp;
  // Set once deletion has begun (finalizers may hold the object a while).
  std::string deletion_timestamp;
  StringMap labels;
  StringMap annotations;
  std::vector<OwnerReference> owner_references;

  // The cache key: "namespace/name", or "name" for cluster-scoped objects.
  std::string Key() const;
};

// "namespace/name" or "name".
std::string ObjectKey(std::string_view ns, std::string_view name);

// Reads metadata from an object. InvalidArgument when there is no metadata.name or a field has
// the wrong type.
absl::StatusOr<ObjectMeta> DecodeObjectMeta(const web::json::value& object);

class Object {
 public:
  virtual ~Object() = default;
  ObjectMeta metadata;
};

using ObjectPtr = std::shared_ptr<const Object>;

// Turns an object from the server into what the cache keeps. May move from `json`.
using Decoder = std::function<absl::StatusOr<std::shared_ptr<Object>>(web::json::value& json)>;

// The whole object, metadata.managedFields dropped (server-side apply bookkeeping, often the
// largest part of an object, that no controller of ours reads).
class JsonObject : public Object {
 public:
  web::json::value json;
};

Decoder JsonDecoder();

struct ContainerPort {
  std::string name;
  int32_t container_port = 0;
  std::string protocol;
};

struct Container {
  std::string name;
  std::vector<ContainerPort> ports;
};

// What the operator reads of a pod: where it runs, whether it is up, and its ports.
class Pod : public Object {
 public:
  std::string node_name;
  // status.phase: Pending, Running, Succeeded, Failed, Unknown.
  std::string phase;
  std::string pod_ip;
  std::string host_ip;
  // status.conditions[type=Ready].status == "True".
  bool ready = false;
  // Why containers wait to run, from status.containerStatuses and initContainerStatuses:
  // "container trainer: ErrImageNeverPull: Container image \"...\" is not present with pull
  // policy of Never". Empty when none waits.
  std::vector<std::string> waiting;
  // The reasons alone, in the same order ("ErrImagePull", "CrashLoopBackOff").
  std::vector<std::string> waiting_reasons;
  // Why the scheduler has not placed it: the message of condition PodScheduled=False
  // ("0/3 nodes are available: 3 Insufficient nvidia.com/gpu."). Empty otherwise.
  std::string unschedulable;
  std::vector<Container> containers;
  // spec.initContainers: where native sidecars (restartPolicy Always) are.
  std::vector<Container> init_containers;
};

Decoder PodDecoder();

// Removes metadata.managedFields from `object`.
void DropManagedFields(web::json::value& object);

}  // namespace clusterprof::kube

#endif  // CLUSTERPROF_OPERATOR_KUBE_OBJECT_H_
