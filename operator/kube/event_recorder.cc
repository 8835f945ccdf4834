#include "operator/kube/event_recorder.h"

#include <time.h>

#include <algorithm>
#include <cstdio>
#include <utility>

#include "common/base/check.h"
#include "common/base/strings.h"
#include "operator/kube/api_error.h"
#include "operator/kube/resource.h"
#include "spdlog/spdlog.h"

namespace clusterprof::kube {
namespace {

constexpr std::string_view kCombinedPrefix = "(combined from similar events): ";

// RFC 3339 in whole seconds in UTC, as metav1.Time marshals: "2006-01-02T15:04:05Z".
std::string FormatTime(int64_t wall_ns) {
  const time_t seconds = static_cast<time_t>(wall_ns / kNanosPerSecond);
  struct tm utc;
  gmtime_r(&seconds, &utc);
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), "%04d-%02d-%02dT%02d:%02d:%02dZ", utc.tm_year + 1900,
                utc.tm_mon + 1, utc.tm_mday, utc.tm_hour, utc.tm_min, utc.tm_sec);
  return buffer;
}

web::json::value InvolvedObject(const ObjectReference& object) {
  web::json::value reference = web::json::value::object();
  auto set = [&reference](const char* field, const std::string& value) {
    if (!value.empty()) reference[field] = web::json::value(value);
  };
  set("apiVersion", object.api_version);
  set("kind", object.kind);
  set("namespace", object.namespace_);
  set("name", object.name);
  set("uid", object.uid);
  set("resourceVersion", object.resource_version);
  return reference;
}

// Fields joined with a separator that cannot occur in names, kinds or reasons.
template <typename... Fields>
std::string Key(const Fields&... fields) {
  std::string key;
  ((key.append(fields), key.push_back('\x1f')), ...);
  return key;
}

}  // namespace

EventRecorder::EventRecorder(ApiClient* client, Clock* clock, std::string component,
                             std::string host, EventRecorderOptions options)
    : client_(client),
      clock_(clock),
      component_(std::move(component)),
      host_(std::move(host)),
      options_(options) {
  CLUSTERPROF_CHECK(client_ != nullptr);
  CLUSTERPROF_CHECK(clock_ != nullptr);
  CLUSTERPROF_CHECK(options_.max_attempts >= 1) << options_.max_attempts;
  writer_ = std::thread([this] { Loop(); });
}

EventRecorder::~EventRecorder() {
  if (!Flush()) {
    spdlog::warn("events: {} event(s) still unwritten after {} ms; dropping them", pending(),
                 options_.flush_timeout_ns / kNanosPerMilli);
  }
  {
    MutexLock lock(&mu_);
    stop_.store(true, std::memory_order_release);
  }
  clock_->Wake();
  writer_.join();
}

void EventRecorder::Event(const ObjectReference& object, std::string_view type,
                          std::string_view reason, std::string_view message) {
  if (type != kEventTypeNormal && type != kEventTypeWarning) {
    spdlog::error(
        "events: unsupported event type '{}' (want Normal or Warning) for {} {}/{}; "
        "dropped",
        std::string(type), object.kind, object.namespace_, object.name);
    dropped_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  Pending event{object,           std::string(type),    std::string(reason), std::string(message),
                clock_->WallNs(), clock_->MonotonicNs()};
  int64_t dropped = 0;
  {
    MutexLock lock(&mu_);
    if (queue_.size() < options_.queue_limit && !stop_.load(std::memory_order_acquire)) {
      queue_.push_back(std::move(event));
      idle_.store(false, std::memory_order_release);
      return;
    }
    dropped = dropped_.fetch_add(1, std::memory_order_relaxed) + 1;
  }
  // One line for the first drop and every thousandth after it: a flood of drops must not become
  // a flood of log lines.
  if (dropped % 1000 == 1) {
    spdlog::warn(
        "events: the queue is full ({} events); dropped {} {} for {} {}/{} ({} dropped "
        "so far)",
        options_.queue_limit, std::string(type), std::string(reason), object.kind,
        object.namespace_, object.name, dropped);
  }
}

bool EventRecorder::Flush(int64_t timeout_ns) {
  clock_->SleepUntilMonotonicNsUnless(clock_->MonotonicNs() + timeout_ns, idle_);
  return idle_.load(std::memory_order_acquire);
}

size_t EventRecorder::pending() const {
  MutexLock lock(&mu_);
  return queue_.size() + (in_flight_ ? 1 : 0);
}

void EventRecorder::Loop() {
  while (true) {
    Pending event;
    {
      MutexLock lock(&mu_);
      mu_.Await([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
        return !queue_.empty() || stop_.load(std::memory_order_acquire);
      });
      if (stop_.load(std::memory_order_acquire)) {
        dropped_.fetch_add(static_cast<int64_t>(queue_.size()), std::memory_order_relaxed);
        queue_.clear();
        idle_.store(true, std::memory_order_release);
        return;
      }
      event = std::move(queue_.front());
      queue_.pop_front();
      in_flight_ = true;
    }
    Write(event);
    bool drained = false;
    {
      MutexLock lock(&mu_);
      in_flight_ = false;
      if (queue_.empty()) {
        idle_.store(true, std::memory_order_release);
        drained = true;
      }
    }
    if (drained) clock_->Wake();  // for Flush()
  }
}

template <typename Request>
absl::Status EventRecorder::WithRetries(Request request) {
  int64_t backoff_ns = options_.retry_backoff_ns;
  for (int attempt = 1;; ++attempt) {
    absl::Status status = request();
    if (status.ok() || !IsRetryable(status) || attempt >= options_.max_attempts) return status;
    if (!clock_->SleepUntilMonotonicNsUnless(clock_->MonotonicNs() + backoff_ns, stop_)) {
      return status;
    }
    backoff_ns *= 2;
  }
}

std::string EventRecorder::NewEventName(const std::string& object_name) {
  // client-go names events "<name>.<UnixNano in hex>"; two in the same nanosecond get
  // consecutive values instead of the same name.
  last_name_ns_ = std::max(clock_->WallNs(), last_name_ns_ + 1);
  char hex[32];
  std::snprintf(hex, sizeof(hex), "%llx", static_cast<unsigned long long>(last_name_ns_));
  return StrCat(object_name, ".", hex);
}

template <typename Map>
void EventRecorder::Trim(Map& map, int64_t now_mono_ns) {
  if (map.size() <= options_.cache_limit) return;
  std::erase_if(map, [&](const auto& entry) {
    return now_mono_ns - entry.second.last_mono_ns > options_.correlation_window_ns;
  });
  if (map.size() > options_.cache_limit) map.clear();
}

void EventRecorder::Write(const Pending& event) {
  const ObjectReference& object = event.object;
  const std::string ns = object.namespace_.empty() ? "default" : object.namespace_;
  const std::string similar_key =
      Key(component_, host_, object.api_version, object.kind, object.namespace_, object.name,
          object.uid, event.type, event.reason);

  // Aggregation: past max_similar_events distinct messages in the window, combine.
  Similar& similar = similar_[similar_key];
  if (event.mono_ns - similar.last_mono_ns > options_.correlation_window_ns) {
    similar.messages.clear();
  }
  similar.last_mono_ns = event.mono_ns;
  std::string message = event.message;
  std::string dedup_key;
  const bool inserted = similar.messages.insert(message).second;
  if (static_cast<int>(similar.messages.size()) < options_.max_similar_events) {
    dedup_key = Key(similar_key, message);
  } else {
    // Keep the set one short of the limit: messages seen before keep their own Events (and
    // counts), every new one goes to the combined Event (client-go pops one at random).
    if (inserted) similar.messages.erase(message);
    message = StrCat(kCombinedPrefix, message);
    dedup_key = similar_key;
  }

  const std::string now = FormatTime(event.wall_ns);
  auto found = written_events_.find(dedup_key);
  const bool seen = found != written_events_.end() &&
                    event.mono_ns - found->second.last_mono_ns <= options_.correlation_window_ns;
  const int64_t count = seen ? found->second.count + 1 : 1;
  const int64_t first_wall_ns = seen ? found->second.first_wall_ns : event.wall_ns;
  std::string name;
  absl::Status status = absl::NotFoundError("not written yet");
  if (seen) {
    name = found->second.name;
    web::json::value patch = web::json::value::object();
    patch["count"] = web::json::value(count);
    patch["lastTimestamp"] = web::json::value(now);
    patch["message"] = web::json::value(message);
    status = WithRetries([&] {
      return client_
          ->Patch(Events(), found->second.namespace_, name, PatchType::kStrategicMerge, patch)
          .status();
    });
  }
  // A new Event, or the old one is gone (deleted, or expired by the server's event TTL).
  if (absl::IsNotFound(status)) {
    name = NewEventName(object.name);
    web::json::value body = web::json::value::object();
    body["metadata"]["name"] = web::json::value(name);
    body["metadata"]["namespace"] = web::json::value(ns);
    body["involvedObject"] = InvolvedObject(object);
    body["type"] = web::json::value(event.type);
    body["reason"] = web::json::value(event.reason);
    body["message"] = web::json::value(message);
    body["source"]["component"] = web::json::value(component_);
    if (!host_.empty()) body["source"]["host"] = web::json::value(host_);
    body["firstTimestamp"] = web::json::value(FormatTime(first_wall_ns));
    body["lastTimestamp"] = web::json::value(now);
    body["count"] = web::json::value(count);
    body["reportingComponent"] = web::json::value(component_);
    body["reportingInstance"] = web::json::value(host_);
    status = WithRetries([&] { return client_->Create(Events(), ns, body).status(); });
  }
  if (!status.ok()) {
    failed_.fetch_add(1, std::memory_order_relaxed);
    spdlog::warn("events: could not write {} {} for {} {}/{}: {}", event.type, event.reason,
                 object.kind, object.namespace_, object.name, std::string(status.message()));
    return;
  }
  written_.fetch_add(1, std::memory_order_relaxed);
  written_events_[dedup_key] = Written{ns, name, count, first_wall_ns, event.mono_ns};
  Trim(written_events_, event.mono_ns);
  Trim(similar_, event.mono_ns);
}

}  // namespace clusterprof::kube
