// An in-memory Kubernetes API for controller tests, as client-go's fake clientset serves Go
// controllers: objects with uids, resourceVersions and generations, the status subresource,
// label-selected lists, watches that replay from a resourceVersion (410 Expired once compacted),
// optimistic-concurrency conflicts, merge and JSON patches, and errors injected by reactors.
// Errors are the same kube::ApiError statuses the real client returns (IsConflict, IsGone, ...).
//
// It keeps what a controller can observe of the API server, not its validation: no schemas, no
// admission, no garbage collection, no finalizers. Tests of those run against the real
// kube-apiserver (tests/support/kube_control_plane.h).
//
//   SimulatedClock clock;
//   FakeApiClient api(&clock);
//   api.AddReactor([](const FakeApiClient::Action& action) -> std::optional<absl::Status> {
//     if (action.verb == "update" && action.subresource == "status") return Conflict(...);
//     return std::nullopt;
//   });
#ifndef CLUSTERPROF_TESTS_SUPPORT_FAKE_API_CLIENT_H_
#define CLUSTERPROF_TESTS_SUPPORT_FAKE_API_CLIENT_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "common/base/clock.h"
#include "common/base/mutex.h"
#include "operator/kube/api_client.h"

namespace clusterprof::testing {

class FakeApiClient final : public kube::ApiClient {
 public:
  // What a request asked for, as the reactors and Actions() see it. `object` is the body of
  // create, update and patch requests.
  struct Action {
    std::string verb;  // get, list, watch, create, update, patch, delete
    std::string resource;
    std::string ns;
    std::string name;
    std::string subresource;
    web::json::value object;
  };
  // Returns a status to fail the request with, or nullopt to let it through.
  using Reactor = std::function<std::optional<absl::Status>(const Action& action)>;

  explicit FakeApiClient(Clock* clock);
  ~FakeApiClient() override;

  absl::StatusOr<web::json::value> Get(const kube::ResourceType& type, std::string_view ns,
                                       std::string_view name,
                                       std::string_view subresource) override;
  absl::StatusOr<kube::ObjectList> List(const kube::ResourceType& type, std::string_view ns,
                                        const kube::ListOptions& options) override;
  absl::StatusOr<web::json::value> Create(const kube::ResourceType& type, std::string_view ns,
                                          const web::json::value& object) override;
  absl::StatusOr<web::json::value> Update(const kube::ResourceType& type, std::string_view ns,
                                          const web::json::value& object,
                                          std::string_view subresource) override;
  absl::StatusOr<web::json::value> Patch(const kube::ResourceType& type, std::string_view ns,
                                         std::string_view name, kube::PatchType patch_type,
                                         const web::json::value& patch,
                                         std::string_view subresource) override;
  absl::Status Delete(const kube::ResourceType& type, std::string_view ns, std::string_view name,
                      const kube::DeleteOptions& options) override;
  absl::StatusOr<std::unique_ptr<kube::WatchStream>> Watch(
      const kube::ResourceType& type, std::string_view ns,
      const kube::ListOptions& options) override;
  using ApiClient::Delete;
  using ApiClient::Get;
  using ApiClient::List;
  using ApiClient::Patch;
  using ApiClient::Update;

  // Reactors run before every request, in the order added; the first status one returns fails
  // the request (nothing is changed, the action is still recorded).
  void AddReactor(Reactor reactor);
  // The next `times` requests with this verb on this resource (and subresource) fail with the
  // API error a real server would send for `http_code` ("Conflict" for 409, ...).
  void FailNext(std::string verb, std::string resource, int http_code, int times = 1,
                std::string subresource = "");

  // Every request so far, in order.
  std::vector<Action> Actions() const;
  // How many requests had this verb (and, when given, this resource and subresource).
  int CountActions(std::string_view verb, std::string_view resource = "",
                   std::optional<std::string_view> subresource = std::nullopt) const;
  void ClearActions();

  // Ends every open watch as a server's timeout does (Next() returns nullopt).
  void EndWatches();
  // Forgets the history up to now: a watch from an older resourceVersion gets 410 Expired.
  void Compact();
  int open_watches() const;
  // Blocks until at least `count` watches are open.
  void WaitForWatches(int count) const;

  // Blocks until `predicate` holds for the stored object (nullopt: absent), re-checked after
  // every change, or until `timeout_ns` of real time passed (a guard against a hung test, not a
  // timing assertion). Returns the object as the predicate last saw it, or DeadlineExceeded.
  absl::StatusOr<std::optional<web::json::value>> WaitFor(
      const kube::ResourceType& type, std::string_view ns, std::string_view name,
      const std::function<bool(const std::optional<web::json::value>& object)>& predicate,
      int64_t timeout_ns = 60 * kNanosPerSecond) const;

  // The stored object, read without a request (no action, no reactor).
  std::optional<web::json::value> Peek(const kube::ResourceType& type, std::string_view ns,
                                       std::string_view name) const;

  // The API error a real server sends for `http_code`, about `what`.
  static absl::Status ApiError(int http_code, std::string_view reason, std::string_view message);

 private:
  class FakeWatch;
  struct Change {
    int64_t resource_version;
    std::string key;  // ResourceKey
    kube::WatchEvent event;
  };

  static std::string ResourceKey(const kube::ResourceType& type);
  static std::string ObjectKey(const kube::ResourceType& type, std::string_view ns,
                               std::string_view name);

  // Records the action and runs the reactors.
  absl::Status Admit(Action action) ABSL_LOCKS_EXCLUDED(mu_);
  // Stamps a new resourceVersion on `object`, stores it, and tells the watches.
  web::json::value Commit(const kube::ResourceType& type, const std::string& key,
                          web::json::value object, kube::WatchEvent::Type type_of_change)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes `updated` over the stored `key` as a PUT (or the patched result) would, keeping what
  // the server owns; `subresource` "status" takes only the status.
  absl::StatusOr<web::json::value> Replace(const kube::ResourceType& type, const std::string& key,
                                           web::json::value updated, std::string_view subresource,
                                           bool check_resource_version)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Unregister(FakeWatch* watch);

  Clock* const clock_;
  mutable Mutex mu_;
  int64_t resource_version_ ABSL_GUARDED_BY(mu_) = 1000;
  int64_t compacted_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t next_uid_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<std::string, web::json::value> objects_ ABSL_GUARDED_BY(mu_);
  std::deque<Change> history_ ABSL_GUARDED_BY(mu_);
  std::set<FakeWatch*> watches_ ABSL_GUARDED_BY(mu_);
  std::vector<Reactor> reactors_ ABSL_GUARDED_BY(mu_);
  std::vector<Action> actions_ ABSL_GUARDED_BY(mu_);
};

}  // namespace clusterprof::testing

#endif  // CLUSTERPROF_TESTS_SUPPORT_FAKE_API_CLIENT_H_
