// Kubernetes Events (core/v1) about the objects the operator manages, with client-go's
// tools/record semantics: written in the background, identical events counted on one Event
// object, and floods of similar events combined into one.
#ifndef CLUSTERPROF_OPERATOR_KUBE_EVENT_RECORDER_H_
#define CLUSTERPROF_OPERATOR_KUBE_EVENT_RECORDER_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "common/base/clock.h"
#include "common/base/mutex.h"
#include "operator/kube/api_client.h"

namespace clusterprof::kube {

// The object an event is about (core/v1 ObjectReference).
struct ObjectReference {
  std::string api_version;  // "v1", "clusterprof.dev/v1alpha1"
  std::string kind;         // "Pod"
  std::string namespace_;   // "" for cluster-scoped objects: their events go to "default"
  std::string name;
  std::string uid;
  std::string resource_version;
};

inline constexpr std::string_view kEventTypeNormal = "Normal";
inline constexpr std::string_view kEventTypeWarning = "Warning";

struct EventRecorderOptions {
  // Events waiting to be written; more are dropped (and counted), so a slow or unreachable API
  // server never blocks the caller.
  size_t queue_limit = 1000;
  // Tries per event on retryable errors (429, 5xx, no response), with a backoff that starts at
  // retry_backoff_ns and doubles.
  int max_attempts = 3;
  int64_t retry_backoff_ns = 1 * kNanosPerSecond;
  // How long the destructor waits for the queue to drain.
  int64_t flush_timeout_ns = 10 * kNanosPerSecond;
  // client-go's EventCorrelator: within this window an identical event increments the count of
  // the Event already written, and the max_similar_events-th distinct message for one object,
  // type and reason starts being combined into one Event.
  int64_t correlation_window_ns = 10 * 60 * kNanosPerSecond;
  int max_similar_events = 10;
  // Entries the correlator remembers; past it, expired entries go first, then all.
  size_t cache_limit = 4096;
};

// Writes Events through `client` from a thread of its own. Event() only queues and returns.
//
// Correlation (as client-go's EventCorrelator): an event identical to one written within the
// window (same object, type, reason and message) is a strategic-merge PATCH of the existing
// Event's count, lastTimestamp and message; once max_similar_events distinct messages for the
// same object, type and reason arrive within the window, the new ones go to a single Event whose
// message is "(combined from similar events): <latest message>" and whose count grows. Events
// are named "<object name>.<hex of the wall time in ns>" like client-go's.
//
// Thread-safe: Event(), Flush() and the counters may be called from any thread.
//
// Failure: a full queue drops the event (dropped()); a write that fails for good (a non-retryable
// error such as 403 without RBAC for events, or retries used up) is logged and counted
// (failed()). Neither reaches the caller: events are best effort, as in client-go.
class EventRecorder {
 public:
  // `component` is source.component and reportingComponent ("clusterprof-operator"); `host`
  // is source.host and reportingInstance. `client` and `clock` must outlive the recorder.
  EventRecorder(ApiClient* client, Clock* clock, std::string component, std::string host,
                EventRecorderOptions options = {});
  // Drains the queue (waiting up to options.flush_timeout_ns), then stops the writer; what is
  // left is dropped. A request in flight delays this by up to the client's request timeout.
  ~EventRecorder();
  EventRecorder(const EventRecorder&) = delete;
  EventRecorder& operator=(const EventRecorder&) = delete;

  // Queues an event. `type` is kEventTypeNormal or kEventTypeWarning (others are logged and
  // dropped, as client-go does); `reason` is UpperCamelCase ("CaptureStarted").
  void Event(const ObjectReference& object, std::string_view type, std::string_view reason,
             std::string_view message);

  // Waits until every event queued before the call is written (or has failed), up to
  // `timeout_ns` on the clock. Returns whether the queue drained.
  bool Flush(int64_t timeout_ns);
  bool Flush() { return Flush(options_.flush_timeout_ns); }

  // Events written (created or patched), dropped before writing, and failed for good.
  int64_t written() const { return written_.load(std::memory_order_relaxed); }
  int64_t dropped() const { return dropped_.load(std::memory_order_relaxed); }
  int64_t failed() const { return failed_.load(std::memory_order_relaxed); }
  // Events queued or being written.
  size_t pending() const;

 private:
  struct Pending {
    ObjectReference object;
    std::string type;
    std::string reason;
    std::string message;
    int64_t wall_ns = 0;
    int64_t mono_ns = 0;
  };
  // An Event already written, for deduplication.
  struct Written {
    std::string namespace_;
    std::string name;
    int64_t count = 0;
    int64_t first_wall_ns = 0;
    int64_t last_mono_ns = 0;
  };
  // The distinct messages seen for one object, type and reason.
  struct Similar {
    std::set<std::string> messages;
    int64_t last_mono_ns = 0;
  };

  void Loop();
  // Correlates and writes one event (the writer thread only).
  void Write(const Pending& event);
  // Runs `request` until it succeeds, fails for good, or the tries run out.
  template <typename Request>
  absl::Status WithRetries(Request request);
  std::string NewEventName(const std::string& object_name);
  template <typename Map>
  void Trim(Map& map, int64_t now_mono_ns);

  ApiClient* const client_;
  Clock* const clock_;
  const std::string component_;
  const std::string host_;
  const EventRecorderOptions options_;

  std::atomic<int64_t> written_{0};
  std::atomic<int64_t> dropped_{0};
  std::atomic<int64_t> failed_{0};
  // True when nothing is queued or in flight; Flush() sleeps on it.
  std::atomic<bool> idle_{true};
  // Ends the writer's retry waits; set with mu_ held so the writer's Await sees it too.
  std::atomic<bool> stop_{false};

  mutable Mutex mu_;
  std::deque<Pending> queue_ ABSL_GUARDED_BY(mu_);
  bool in_flight_ ABSL_GUARDED_BY(mu_) = false;

  // The correlator's state: the writer thread only.
  std::map<std::string, Written> written_events_;
  std::map<std::string, Similar> similar_;
  int64_t last_name_ns_ = 0;

  std::thread writer_;
};

}  // namespace clusterprof::kube

#endif  // CLUSTERPROF_OPERATOR_KUBE_EVENT_RECORDER_H_
