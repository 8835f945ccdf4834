// The Kubernetes API as the operator's code sees it: get, list, create, update, patch, delete
// and watch, on JSON objects. RestClient (rest_client.h) is the real one, over HTTP; tests use
// FakeApiClient (tests/support/fake_api_client.h), an in-memory store with resourceVersions,
// watches, conflicts and injected errors, as client-go's fake clientset serves Go controllers.
// Errors are kube::ApiError statuses (api_error.h) from either.
#ifndef CLUSTERPROF_OPERATOR_KUBE_API_CLIENT_H_
#define CLUSTERPROF_OPERATOR_KUBE_API_CLIENT_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cpprest/json.h"
#include "operator/kube/resource.h"

namespace clusterprof::kube {

// The parameters of a list or a watch (metav1.ListOptions).
struct ListOptions {
  std::string label_selector;
  std::string field_selector;
  // Page size; 0 asks for everything at once.
  int64_t limit = 0;
  std::string continue_token;
  // "" reads the latest state (a quorum read); "0" accepts any cached state; for a watch, where
  // to start.
  std::string resource_version;
  // Watch only: the server ends the watch after this many seconds (0 = its default).
  int timeout_seconds = 0;
  bool allow_watch_bookmarks = false;
};

// One page of a list.
struct ObjectList {
  std::string resource_version;
  // Set when more pages follow: pass it as ListOptions::continue_token.
  std::string continue_token;
  std::vector<web::json::value> items;
};

enum class PatchType {
  kMerge,           // application/merge-patch+json (RFC 7386)
  kJson,            // application/json-patch+json (RFC 6902)
  kStrategicMerge,  // application/strategic-merge-patch+json (built-in kinds only)
};

struct DeleteOptions {
  // Preconditions: the delete fails with 409 unless the object still has this uid /
  // resourceVersion.
  std::string uid;
  std::string resource_version;
  // "Orphan", "Background" or "Foreground"; "" leaves the server's default.
  std::string propagation_policy;
  int64_t grace_period_seconds = -1;
};

// A watch event, as the server sent it (watch.Event).
struct WatchEvent {
  enum class Type { kAdded, kModified, kDeleted, kBookmark, kError };
  Type type = Type::kAdded;
  // The object; for kError a meta/v1 Status; for kBookmark an object with only
  // metadata.resourceVersion.
  web::json::value object;
};

std::string_view WatchEventTypeName(WatchEvent::Type type);

// An open watch. Next() is called from one thread at a time; Cancel() from any thread, and
// makes a blocked Next() return. The stream closes when destroyed.
class WatchStream {
 public:
  virtual ~WatchStream() = default;
  // The next event. nullopt when the server ended the stream cleanly (its timeoutSeconds ran
  // out); Unavailable when the connection broke or the stream was cancelled; InvalidArgument
  // (naming the line) when the server sent something that is not a watch event.
  virtual absl::StatusOr<std::optional<WatchEvent>> Next() = 0;
  virtual void Cancel() = 0;
};

// Thread-safe.
class ApiClient {
 public:
  virtual ~ApiClient() = default;

  virtual absl::StatusOr<web::json::value> Get(const ResourceType& type, std::string_view ns,
                                               std::string_view name,
                                               std::string_view subresource) = 0;
  absl::StatusOr<web::json::value> Get(const ResourceType& type, std::string_view ns,
                                       std::string_view name) {
    return Get(type, ns, name, "");
  }
  // One page of the collection (all of it when options.limit is 0).
  virtual absl::StatusOr<ObjectList> List(const ResourceType& type, std::string_view ns,
                                          const ListOptions& options) = 0;
  absl::StatusOr<ObjectList> List(const ResourceType& type, std::string_view ns) {
    return List(type, ns, ListOptions());
  }
  // Every page, following continue tokens; `options.limit` is the page size.
  absl::StatusOr<ObjectList> ListAll(const ResourceType& type, std::string_view ns,
                                     ListOptions options = {});
  // Creates `object` (apiVersion and kind are filled in from `type` when missing).
  virtual absl::StatusOr<web::json::value> Create(const ResourceType& type, std::string_view ns,
                                                  const web::json::value& object) = 0;
  // Replaces the object (PUT) named in object.metadata.name; 409 Conflict when its
  // metadata.resourceVersion is stale. With subresource "status", writes only the status.
  virtual absl::StatusOr<web::json::value> Update(const ResourceType& type, std::string_view ns,
                                                  const web::json::value& object,
                                                  std::string_view subresource) = 0;
  absl::StatusOr<web::json::value> Update(const ResourceType& type, std::string_view ns,
                                          const web::json::value& object) {
    return Update(type, ns, object, "");
  }
  absl::StatusOr<web::json::value> UpdateStatus(const ResourceType& type, std::string_view ns,
                                                const web::json::value& object) {
    return Update(type, ns, object, "status");
  }
  virtual absl::StatusOr<web::json::value> Patch(const ResourceType& type, std::string_view ns,
                                                 std::string_view name, PatchType patch_type,
                                                 const web::json::value& patch,
                                                 std::string_view subresource) = 0;
  absl::StatusOr<web::json::value> Patch(const ResourceType& type, std::string_view ns,
                                         std::string_view name, PatchType patch_type,
                                         const web::json::value& patch) {
    return Patch(type, ns, name, patch_type, patch, "");
  }
  // OK when the object is gone or going; NotFound when it was not there.
  virtual absl::Status Delete(const ResourceType& type, std::string_view ns, std::string_view name,
                              const DeleteOptions& options) = 0;
  absl::Status Delete(const ResourceType& type, std::string_view ns, std::string_view name) {
    return Delete(type, ns, name, DeleteOptions());
  }
  // Starts a watch (options.resource_version says from where). The stream is open when this
  // returns; a 410 Gone (too old a resourceVersion) comes back here or as a kError event.
  virtual absl::StatusOr<std::unique_ptr<WatchStream>> Watch(const ResourceType& type,
                                                             std::string_view ns,
                                                             const ListOptions& options) = 0;
};

}  // namespace clusterprof::kube

#endif  // CLUSTERPROF_OPERATOR_KUBE_API_CLIENT_H_
