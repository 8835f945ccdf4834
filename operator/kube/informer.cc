#include "operator/kube/informer.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "common/base/check.h"
#include "common/base/strings.h"
#include "operator/kube/api_error.h"
#include "spdlog/spdlog.h"

namespace clusterprof::kube {
namespace {

std::string LabelIndexKey(std::string_view key, std::string_view value) {
  return StrCat(key, "=", value);
}

// The resourceVersion an ERROR event's Status or a failed call carries no hint of: 410 in a
// Status object.
bool IsGoneStatusObject(const web::json::value& status) {
  return status.is_object() && status.has_integer_field("code") &&
         status.at("code").as_integer() == 410;
}

// A watch shorter than this that delivered nothing counts as a failure.
constexpr int64_t kShortWatchNs = kNanosPerSecond;

}  // namespace

// ObjectStore

ObjectPtr ObjectStore::Get(std::string_view key) const {
  MutexLock lock(&mu_);
  const auto it = objects_.find(AbslView(key));
  return it == objects_.end() ? nullptr : it->second;
}

std::vector<ObjectPtr> ObjectStore::List(std::string_view ns, const LabelSelector* selector) const {
  MutexLock lock(&mu_);
  // Start from the smallest candidate set an index gives: an equality requirement's label
  // index, else the namespace's, else everything.
  const absl::flat_hash_set<ObjectPtr>* candidates = nullptr;
  if (selector != nullptr) {
    for (const LabelRequirement& r : selector->requirements()) {
      if (r.op != LabelRequirement::Operator::kEquals &&
          !(r.op == LabelRequirement::Operator::kIn && r.values.size() == 1)) {
        continue;
      }
      const auto it = by_label_.find(LabelIndexKey(r.key, r.values[0]));
      if (it == by_label_.end()) return {};
      if (candidates == nullptr || it->second.size() < candidates->size()) {
        candidates = &it->second;
      }
    }
  }
  if (!ns.empty()) {
    const auto it = by_namespace_.find(AbslView(ns));
    if (it == by_namespace_.end()) return {};
    if (candidates == nullptr || it->second.size() < candidates->size()) {
      candidates = &it->second;
    }
  }
  std::vector<ObjectPtr> out;
  auto consider = [&](const ObjectPtr& object) {
    if (!ns.empty() && object->metadata.namespace_ != ns) return;
    if (selector != nullptr && !selector->Matches(object->metadata.labels)) return;
    out.push_back(object);
  };
  if (candidates != nullptr) {
    out.reserve(candidates->size());
    for (const ObjectPtr& object : *candidates) consider(object);
  } else {
    out.reserve(objects_.size());
    for (const auto& [key, object] : objects_) consider(object);
  }
  return out;
}

size_t ObjectStore::size() const {
  MutexLock lock(&mu_);
  return objects_.size();
}

void ObjectStore::IndexLocked(const ObjectPtr& object) {
  by_namespace_[object->metadata.namespace_].insert(object);
  for (const auto& [key, value] : object->metadata.labels) {
    by_label_[LabelIndexKey(key, value)].insert(object);
  }
}

void ObjectStore::UnindexLocked(const ObjectPtr& object) {
  auto remove = [&](auto& index, const std::string& key) {
    const auto it = index.find(key);
    if (it == index.end()) return;
    it->second.erase(object);
    if (it->second.empty()) index.erase(it);
  };
  remove(by_namespace_, object->metadata.namespace_);
  for (const auto& [key, value] : object->metadata.labels) {
    remove(by_label_, LabelIndexKey(key, value));
  }
}

ObjectStore::Change ObjectStore::Upsert(ObjectPtr object) {
  MutexLock lock(&mu_);
  ObjectPtr& slot = objects_[object->metadata.Key()];
  Change change{slot == nullptr ? Change::Kind::kAdd : Change::Kind::kUpdate, slot, object};
  if (slot != nullptr) UnindexLocked(slot);
  slot = std::move(object);
  IndexLocked(slot);
  return change;
}

ObjectStore::Change ObjectStore::Remove(const ObjectPtr& object) {
  MutexLock lock(&mu_);
  const auto it = objects_.find(object->metadata.Key());
  if (it == objects_.end()) return {Change::Kind::kDelete, nullptr, nullptr};
  Change change{Change::Kind::kDelete, it->second, nullptr};
  UnindexLocked(it->second);
  objects_.erase(it);
  return change;
}

std::vector<ObjectStore::Change> ObjectStore::Replace(std::vector<ObjectPtr> objects) {
  absl::flat_hash_map<std::string, ObjectPtr> fresh;
  fresh.reserve(objects.size());
  for (ObjectPtr& object : objects) {
    std::string key = object->metadata.Key();
    fresh.insert_or_assign(std::move(key), std::move(object));
  }
  std::vector<Change> changes;
  MutexLock lock(&mu_);
  for (auto it = objects_.begin(); it != objects_.end();) {
    if (!fresh.contains(it->first)) {
      changes.push_back({Change::Kind::kDelete, it->second, nullptr});
      UnindexLocked(it->second);
      objects_.erase(it++);
    } else {
      ++it;
    }
  }
  for (auto& [key, object] : fresh) {
    ObjectPtr& slot = objects_[key];
    if (slot == nullptr) {
      changes.push_back({Change::Kind::kAdd, nullptr, object});
    } else if (slot->metadata.resource_version != object->metadata.resource_version) {
      changes.push_back({Change::Kind::kUpdate, slot, object});
      UnindexLocked(slot);
    } else {
      continue;  // unchanged: keep the cached object
    }
    slot = std::move(object);
    IndexLocked(slot);
  }
  return changes;
}

// Informer

Informer::Informer(ApiClient* client, Clock* clock, InformerOptions options)
    : client_(client),
      clock_(clock),
      options_(std::move(options)),
      backoff_({.initial_ns = options_.initial_backoff_ns,
                .max_ns = options_.max_backoff_ns,
                .multiplier = 2,
                .jitter_mode = BackoffPolicy::Jitter::kUp,
                .jitter = 0.5}),
      random_(std::random_device{}()) {}

Informer::~Informer() { Stop(); }

void Informer::AddEventHandler(ResourceEventHandler* handler) {
  MutexLock lock(&dispatch_mu_);
  handlers_.push_back(handler);
  for (const ObjectPtr& object : store_.List()) handler->OnAdd(object, /*initial_list=*/true);
}

void Informer::Start() {
  CLUSTERPROF_CHECK(!thread_.joinable()) << "Informer::Start called twice";
  thread_ = std::thread([this] { Run(); });
  if (options_.resync_period_ns > 0) resync_thread_ = std::thread([this] { RunResync(); });
}

void Informer::Stop() {
  {
    MutexLock lock(&mu_);
    stopped_ = true;
    if (watch_ != nullptr) watch_->Cancel();
  }
  stop_.store(true, std::memory_order_release);
  clock_->Wake();
  if (thread_.joinable()) thread_.join();
  if (resync_thread_.joinable()) resync_thread_.join();
}

bool Informer::HasSynced() const {
  MutexLock lock(&mu_);
  return synced_;
}

bool Informer::WaitForSync() {
  MutexLock lock(&mu_);
  mu_.Await([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return synced_ || stopped_; });
  return synced_;
}

ObjectPtr Informer::Get(std::string_view ns, std::string_view name) const {
  return store_.Get(ObjectKey(options_.type.namespaced ? ns : "", name));
}

std::vector<ObjectPtr> Informer::List(std::string_view ns, const LabelSelector* selector) const {
  return store_.List(ns, selector);
}

std::string Informer::resource_version() const {
  MutexLock lock(&mu_);
  return resource_version_;
}

InformerStats Informer::stats() const {
  MutexLock lock(&mu_);
  return stats_;
}

std::string Informer::last_error() const {
  MutexLock lock(&mu_);
  return last_error_;
}

void Informer::SetError(const absl::Status& status) {
  MutexLock lock(&mu_);
  last_error_ = status.ok() ? "" : std::string(status.message());
}

void Informer::Dispatch(const std::vector<ObjectStore::Change>& changes, Source source) {
  MutexLock lock(&dispatch_mu_);
  for (const ObjectStore::Change& change : changes) {
    for (ResourceEventHandler* handler : handlers_) {
      switch (change.kind) {
        case ObjectStore::Change::Kind::kAdd:
          handler->OnAdd(change.new_object, /*initial_list=*/source == Source::kInitialList);
          break;
        case ObjectStore::Change::Kind::kUpdate:
          handler->OnUpdate(change.old_object, change.new_object);
          break;
        case ObjectStore::Change::Kind::kDelete:
          // Deletions found by a list are inferred: the final state is unknown.
          handler->OnDelete(change.old_object,
                            /*final_state_unknown=*/source != Source::kWatch);
          break;
      }
    }
  }
}

absl::Status Informer::ListAndReplace(bool relist) {
  const Decoder decoder = options_.decoder ? options_.decoder : JsonDecoder();
  ListOptions list_options;
  list_options.label_selector = options_.label_selector;
  list_options.field_selector = options_.field_selector;
  list_options.limit = options_.page_size;
  // Decode page by page, so that only one page of raw JSON is held at a time.
  std::vector<ObjectPtr> objects;
  std::string resource_version;
  int64_t decode_errors = 0;
  while (true) {
    if (stop_.load(std::memory_order_acquire)) return absl::CancelledError("stopped");
    absl::StatusOr<ObjectList> page =
        client_->List(options_.type, options_.namespace_, list_options);
    if (!page.ok()) {
      // An expired continue token: the snapshot is gone; start the list again.
      if (IsGone(page.status()) && !list_options.continue_token.empty()) {
        objects.clear();
        resource_version.clear();
        list_options.continue_token.clear();
        continue;
      }
      return page.status();
    }
    if (resource_version.empty()) resource_version = page->resource_version;
    for (web::json::value& item : page->items) {
      absl::StatusOr<std::shared_ptr<Object>> object = decoder(item);
      if (!object.ok()) {
        ++decode_errors;
        spdlog::warn("informer {}: skipping an object that does not decode: {}", options_.name,
                     std::string(object.status().message()));
        continue;
      }
      objects.push_back(*std::move(object));
    }
    if (page->continue_token.empty()) break;
    list_options.continue_token = std::move(page->continue_token);
  }
  bool initial;
  {
    MutexLock lock(&mu_);
    initial = !synced_;
  }
  std::vector<ObjectStore::Change> changes = store_.Replace(std::move(objects));
  {
    MutexLock lock(&mu_);
    resource_version_ = resource_version;
    ++stats_.lists;
    if (relist) ++stats_.relists;
    stats_.decode_errors += decode_errors;
  }
  Dispatch(changes, initial ? Source::kInitialList : Source::kRelist);
  {
    MutexLock lock(&mu_);
    synced_ = true;
  }
  return absl::OkStatus();
}

void Informer::Apply(WatchEvent& event) {
  const Decoder& decoder = options_.decoder ? options_.decoder : JsonDecoder();
  absl::StatusOr<std::shared_ptr<Object>> decoded = decoder(event.object);
  if (!decoded.ok()) {
    spdlog::warn("informer {}: skipping a {} event whose object does not decode: {}", options_.name,
                 std::string(WatchEventTypeName(event.type)),
                 std::string(decoded.status().message()));
    MutexLock lock(&mu_);
    ++stats_.decode_errors;
    return;
  }
  ObjectPtr object = *std::move(decoded);
  const std::string resource_version = object->metadata.resource_version;
  std::vector<ObjectStore::Change> changes;
  if (event.type == WatchEvent::Type::kDeleted) {
    ObjectStore::Change change = store_.Remove(object);
    // Deliver the deleted object as the server last had it; nothing when the cache never had
    // it (no phantom deletes).
    if (change.old_object != nullptr) {
      change.old_object = object;
      changes.push_back(std::move(change));
    }
  } else {
    changes.push_back(store_.Upsert(std::move(object)));
  }
  {
    MutexLock lock(&mu_);
    resource_version_ = resource_version;
    ++stats_.events;
  }
  Dispatch(changes, Source::kWatch);
}

absl::Status Informer::WatchOnce(bool* delivered) {
  ListOptions options;
  options.label_selector = options_.label_selector;
  options.field_selector = options_.field_selector;
  options.allow_watch_bookmarks = true;
  options.resource_version = resource_version();
  // In [min, 2 min): informers started together do not reconnect together.
  options.timeout_seconds =
      options_.min_watch_timeout_s +
      std::uniform_int_distribution<int>(0, std::max(1, options_.min_watch_timeout_s) - 1)(random_);
  absl::StatusOr<std::unique_ptr<WatchStream>> watch =
      client_->Watch(options_.type, options_.namespace_, options);
  if (!watch.ok()) return watch.status();
  {
    MutexLock lock(&mu_);
    ++stats_.watches;
    if (stopped_) return absl::CancelledError("stopped");
    watch_ = watch->get();
  }
  absl::Status result = absl::OkStatus();
  while (!stop_.load(std::memory_order_acquire)) {
    absl::StatusOr<std::optional<WatchEvent>> event = (*watch)->Next();
    if (!event.ok()) {
      result = event.status();
      break;
    }
    if (!event->has_value()) break;  // the server's timeout: watch again from here
    WatchEvent& e = **event;
    if (e.type == WatchEvent::Type::kError) {
      if (IsGoneStatusObject(e.object)) {
        result = absl::OutOfRangeError(StrCat("watch of ", options_.type.Describe(),
                                              ": resourceVersion ", options.resource_version,
                                              " is too old (410 Gone)"));
      } else {
        result = absl::UnavailableError(StrCat("watch of ", options_.type.Describe(),
                                               " sent an error: ", e.object.serialize()));
      }
      // The server ends a watch after its error event: read to that end instead of cancelling
      // the stream (cpprestsdk closes a cancelled connection from the cancelling thread while its
      // I/O threads may still be reading it, which crashes now and then). A server that sends
      // more is cancelled after a few events.
      for (int more = 0; more < 16 && !stop_.load(std::memory_order_acquire); ++more) {
        absl::StatusOr<std::optional<WatchEvent>> next = (*watch)->Next();
        if (!next.ok() || !next->has_value()) break;
      }
      break;
    }
    if (e.type == WatchEvent::Type::kBookmark) {
      const web::json::value& object = e.object;
      if (object.has_object_field("metadata") &&
          object.at("metadata").has_string_field("resourceVersion")) {
        MutexLock lock(&mu_);
        resource_version_ = object.at("metadata").at("resourceVersion").as_string();
        ++stats_.bookmarks;
      }
      continue;
    }
    Apply(e);
    *delivered = true;
  }
  MutexLock lock(&mu_);
  watch_ = nullptr;
  return result;
}

bool Informer::Backoff(int64_t at_least_ns) {
  const int64_t wait_ns = std::max(backoff_.NextDelayNs(), at_least_ns);
  return clock_->SleepUntilMonotonicNsUnless(clock_->MonotonicNs() + wait_ns, stop_);
}

void Informer::Run() {
  bool need_list = true;
  bool relist = false;
  while (!stop_.load(std::memory_order_acquire)) {
    if (need_list) {
      absl::Status status = ListAndReplace(relist);
      if (stop_.load(std::memory_order_acquire)) break;
      if (!status.ok()) {
        spdlog::warn("informer {}: list failed: {}", options_.name, std::string(status.message()));
        if (!Backoff(NoteFailure(status))) break;
        continue;
      }
      SetError(absl::OkStatus());
      need_list = false;
      relist = false;
    }
    bool delivered = false;
    const int64_t watch_start_ns = clock_->MonotonicNs();
    absl::Status status = WatchOnce(&delivered);
    if (stop_.load(std::memory_order_acquire)) break;
    if (delivered) backoff_.Reset();
    if (status.ok() && !delivered && clock_->MonotonicNs() - watch_start_ns < kShortWatchNs) {
      // A watch that ends at once with nothing in it is a server (or proxy) in trouble, not
      // its timeout: back off rather than spin.
      status = absl::UnavailableError(
          StrCat("watch of ", options_.type.Describe(), " ended at once with no events"));
    }
    if (status.ok()) continue;  // the server's timeout: watch again at once
    if (IsGone(status) || status.code() == absl::StatusCode::kOutOfRange) {
      spdlog::info("informer {}: {}; listing again", options_.name, std::string(status.message()));
      need_list = true;
      relist = true;
      continue;
    }
    {
      MutexLock lock(&mu_);
      ++stats_.watch_errors;
    }
    spdlog::warn("informer {}: watch failed: {}", options_.name, std::string(status.message()));
    if (!Backoff(NoteFailure(status))) break;
  }
}

int64_t Informer::NoteFailure(const absl::Status& status) {
  SetError(status);
  const std::optional<ApiErrorInfo> info = GetApiErrorInfo(status);
  if (!info) return 0;
  if (info->http_code == 429) {
    MutexLock lock(&mu_);
    ++stats_.throttled;
  }
  return info->retry_after_s > 0 ? info->retry_after_s * kNanosPerSecond : 0;
}

void Informer::RunResync() {
  int64_t next = clock_->MonotonicNs() + options_.resync_period_ns;
  while (clock_->SleepUntilMonotonicNsUnless(next, stop_)) {
    next += options_.resync_period_ns;
    if (!HasSynced()) continue;
    MutexLock lock(&dispatch_mu_);
    for (const ObjectPtr& object : store_.List()) {
      for (ResourceEventHandler* handler : handlers_) handler->OnUpdate(object, object);
    }
  }
}

}  // namespace clusterprof::kube
