// Informers, as client-go's: a cache of one kind of object kept current by list-then-watch, with
// event handlers told of every change.
//
// The informer lists (in pages), then watches from the list's resourceVersion with bookmarks.
// A watch that ends is resumed from the last resourceVersion seen; one that fails, or a 429, is
// retried with jittered exponential backoff (Retry-After honoured). When the server says the
// resourceVersion is too old (410 Gone, at the start of a watch or as an ERROR event), the
// informer lists again and delivers the differences between the cache and the new list as
// events: what disappeared is deleted with final_state_unknown, what changed is updated, what
// is new is added. Handlers therefore see every object's changes in order and never a phantom.
#ifndef CLUSTERPROF_OPERATOR_KUBE_INFORMER_H_
#define CLUSTERPROF_OPERATOR_KUBE_INFORMER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "common/base/clock.h"
#include "common/base/mutex.h"
#include "common/retry/backoff.h"
#include "operator/kube/api_client.h"
#include "operator/kube/object.h"
#include "operator/kube/resource.h"
#include "operator/kube/selector.h"

namespace clusterprof::kube {

// Told of changes to an informer's cache. Calls come from the informer's threads, one at a time
// (never two at once for one informer), after the cache already shows the change. They must be
// quick: a controller's handler only queues the object's key.
class ResourceEventHandler {
 public:
  virtual ~ResourceEventHandler() = default;
  // `initial_list`: the object came with the first list, not a later change.
  virtual void OnAdd(const ObjectPtr& object, bool initial_list) {}
  // Also called with old == new for every object at each resync.
  virtual void OnUpdate(const ObjectPtr& old_object, const ObjectPtr& new_object) {}
  // `object` is the last state the cache had. `final_state_unknown`: the deletion was found by a
  // relist, so the object may have changed before it went.
  virtual void OnDelete(const ObjectPtr& object, bool final_state_unknown) {}
};

// The cache: objects by key, indexed by namespace and by label. Thread-safe. The informer
// writes it; anyone reads it.
class ObjectStore {
 public:
  struct Change {
    enum class Kind { kAdd, kUpdate, kDelete };
    Kind kind;
    ObjectPtr old_object;  // kUpdate, kDelete
    ObjectPtr new_object;  // kAdd, kUpdate
  };

  ObjectPtr Get(std::string_view key) const;
  // Objects in `ns` ("" = every namespace) matching `selector` (nullptr = all), in no order.
  std::vector<ObjectPtr> List(std::string_view ns = "",
                              const LabelSelector* selector = nullptr) const;
  size_t size() const;

  // Inserts or replaces the object with the same key; the change made.
  Change Upsert(ObjectPtr object);
  // Removes the object with `object`'s key; nullopt-like Change with no old_object when absent.
  Change Remove(const ObjectPtr& object);
  // Makes the store hold exactly `objects`; the changes made, deletions first. An object whose
  // resourceVersion did not change is not reported.
  std::vector<Change> Replace(std::vector<ObjectPtr> objects);

 private:
  void IndexLocked(const ObjectPtr& object) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UnindexLocked(const ObjectPtr& object) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable Mutex mu_;
  absl::flat_hash_map<std::string, ObjectPtr> objects_ ABSL_GUARDED_BY(mu_);
  // namespace -> objects; "key=value" -> objects.
  absl::flat_hash_map<std::string, absl::flat_hash_set<ObjectPtr>> by_namespace_
      ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, absl::flat_hash_set<ObjectPtr>> by_label_ ABSL_GUARDED_BY(mu_);
};

struct InformerOptions {
  ResourceType type;
  // "" watches every namespace.
  std::string namespace_;
  std::string label_selector;
  std::string field_selector;
  // Default: JsonDecoder().
  Decoder decoder;
  // Objects per list page.
  int64_t page_size = 500;
  // Every this often, OnUpdate(o, o) for every cached object; 0 = never.
  int64_t resync_period_ns = 0;
  // Each watch asks the server to end it after a random time in [min, 2*min) seconds, so that
  // many informers do not reconnect at once.
  int min_watch_timeout_s = 300;
  // Backoff after failures: doubles from initial to max, with jitter; back to initial after a
  // watch that delivered events.
  int64_t initial_backoff_ns = 800 * kNanosPerMilli;
  int64_t max_backoff_ns = 30 * kNanosPerSecond;
  // For logs: "pods", "profilejobs".
  std::string name;
};

struct InformerStats {
  int64_t lists = 0;         // complete lists (the first one included)
  int64_t relists = 0;       // lists after a 410 Gone
  int64_t watches = 0;       // watches started
  int64_t watch_errors = 0;  // watches that broke or could not start
  int64_t events = 0;        // watch events applied (bookmarks excluded)
  int64_t bookmarks = 0;
  int64_t decode_errors = 0;  // objects skipped because they did not decode
  int64_t throttled = 0;      // 429 answers
};

// Thread-safe. Start() runs the list/watch loop on a thread of its own (and a resync thread when
// a resync period is set); Stop() or destruction ends them promptly, cancelling an open watch.
class Informer {
 public:
  Informer(ApiClient* client, Clock* clock, InformerOptions options);
  ~Informer();
  Informer(const Informer&) = delete;
  Informer& operator=(const Informer&) = delete;

  // A handler added after Start() first gets OnAdd for every cached object. Handlers must
  // outlive the informer's threads (Stop() first).
  void AddEventHandler(ResourceEventHandler* handler);

  void Start();
  void Stop();

  // True once the first list is in the cache.
  bool HasSynced() const;
  // Blocks until HasSynced() or Stop(); returns HasSynced().
  bool WaitForSync();

  const ObjectStore& store() const { return store_; }
  ObjectPtr Get(std::string_view ns, std::string_view name) const;
  std::vector<ObjectPtr> List(std::string_view ns = "",
                              const LabelSelector* selector = nullptr) const;

  // The resourceVersion the cache reflects.
  std::string resource_version() const;
  InformerStats stats() const;
  // The last list or watch error ("" after a success), for readiness reporting.
  std::string last_error() const;

 private:
  void Run();
  void RunResync();
  // Lists everything and replaces the cache; returns the list's resourceVersion.
  absl::Status ListAndReplace(bool relist);
  // Watches from resource_version_ until the watch ends. Returns OutOfRange for 410 Gone.
  absl::Status WatchOnce(bool* delivered);
  void Apply(WatchEvent& event);
  // Where changes come from: the first list (adds are initial_list), a later list (deletions
  // inferred: their final state unknown), or a watch event.
  enum class Source { kInitialList, kRelist, kWatch };
  void Dispatch(const std::vector<ObjectStore::Change>& changes, Source source);
  // Records a failed list or watch (the error HasSynced callers see, a 429 counted); returns
  // how long the server asked to wait (Retry-After), else 0.
  int64_t NoteFailure(const absl::Status& status);
  // Sleeps the backoff (or `at_least_ns`), doubling it; false when stopped.
  bool Backoff(int64_t at_least_ns);
  void SetError(const absl::Status& status);

  ApiClient* const client_;
  Clock* const clock_;
  const InformerOptions options_;
  ObjectStore store_;

  // Serializes handler calls.
  Mutex dispatch_mu_;
  std::vector<ResourceEventHandler*> handlers_ ABSL_GUARDED_BY(dispatch_mu_);

  mutable Mutex mu_;
  std::string resource_version_ ABSL_GUARDED_BY(mu_);
  bool synced_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  WatchStream* watch_ ABSL_GUARDED_BY(mu_) = nullptr;
  InformerStats stats_ ABSL_GUARDED_BY(mu_);
  std::string last_error_ ABSL_GUARDED_BY(mu_);

  std::atomic<bool> stop_{false};
  // After failures: doubling from initial_backoff_ns, up to 50% more at random (client-go's
  // wait.Jitter), reset by a watch that delivered events.
  clusterprof::Backoff backoff_;
  // Spreads the watches' timeouts.
  std::mt19937_64 random_;
  std::thread thread_;
  std::thread resync_thread_;
};

}  // namespace clusterprof::kube

#endif  // CLUSTERPROF_OPERATOR_KUBE_INFORMER_H_
