#include "tests/support/fake_api_client.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "common/base/check.h"
#include "common/base/status.h"
#include "common/base/strings.h"
#include "operator/kube/api_error.h"
#include "operator/kube/object.h"
#include "operator/kube/selector.h"

namespace clusterprof::testing {
namespace {

using web::json::value;

std::string Rfc3339(int64_t wall_ns) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::FromUnixNanos(wall_ns), absl::UTCTimeZone());
}

value& Metadata(value& object) {
  if (!object.has_object_field("metadata")) object["metadata"] = value::object();
  return object["metadata"];
}

std::string StringField(const value& object, const char* field) {
  return object.has_string_field(field) ? object.at(field).as_string() : "";
}

std::string MetaString(const value& object, const char* field) {
  if (!object.has_object_field("metadata")) return "";
  return StringField(object.at("metadata"), field);
}

value StatusObject(int http_code, std::string_view reason, std::string_view message) {
  return value::parse(kube::StatusBody(http_code, reason, message));
}

// RFC 7386: null removes, objects merge, anything else replaces.
void MergePatch(value& target, const value& patch) {
  if (!patch.is_object()) {
    target = patch;
    return;
  }
  if (!target.is_object()) target = value::object();
  for (const auto& [key, change] : patch.as_object()) {
    if (change.is_null()) {
      if (target.has_field(key)) target.erase(key);
    } else {
      MergePatch(target[key], change);
    }
  }
}

// RFC 6901 tokens of a JSON pointer.
std::vector<std::string> PointerTokens(std::string_view pointer) {
  std::vector<std::string> tokens;
  if (pointer.empty()) return tokens;
  const std::string_view rest = pointer.substr(1);
  for (absl::string_view part : absl::StrSplit(absl::string_view(rest.data(), rest.size()), '/')) {
    std::string token;
    for (size_t i = 0; i < part.size(); ++i) {
      if (part[i] == '~' && i + 1 < part.size()) {
        token.push_back(part[i + 1] == '1' ? '/' : '~');
        ++i;
      } else {
        token.push_back(part[i]);
      }
    }
    tokens.push_back(std::move(token));
  }
  return tokens;
}

// The parent of the pointer's last token, or nullptr when it does not exist.
value* Parent(value& document, const std::vector<std::string>& tokens) {
  value* node = &document;
  for (size_t i = 0; i + 1 < tokens.size(); ++i) {
    if (node->is_object() && node->has_field(tokens[i])) {
      node = &(*node)[tokens[i]];
    } else if (node->is_array()) {
      const size_t index = std::stoul(tokens[i]);
      if (index >= node->size()) return nullptr;
      node = &(*node)[index];
    } else {
      return nullptr;
    }
  }
  return node;
}

// RFC 6902: test, add, replace, remove (what the operator sends).
absl::Status JsonPatch(value& document, const value& patch) {
  if (!patch.is_array()) return absl::InvalidArgumentError("a JSON patch is an array");
  for (const value& op : patch.as_array()) {
    const std::string kind = StringField(op, "op");
    const std::vector<std::string> tokens = PointerTokens(StringField(op, "path"));
    if (tokens.empty()) return absl::InvalidArgumentError("patching the whole document");
    value* parent = Parent(document, tokens);
    const std::string& last = tokens.back();
    if (parent == nullptr) {
      return absl::InvalidArgumentError(
          StrCat(kind, " ", StringField(op, "path"), ": the parent does not exist"));
    }
    const bool exists = parent->is_object() && parent->has_field(last);
    if (kind == "test") {
      if (!exists || parent->at(last) != op.at("value")) {
        return absl::InvalidArgumentError(
            StrCat("testing value ", StringField(op, "path"), " failed"));
      }
    } else if (kind == "add" || kind == "replace") {
      if (kind == "replace" && !exists) {
        return absl::InvalidArgumentError(StrCat(
            "replace operation does not apply: doc is missing path: ", StringField(op, "path")));
      }
      if (parent->is_array()) {
        value copy = value::array();
        const size_t at = last == "-" ? parent->size() : std::stoul(last);
        size_t n = 0;
        for (size_t i = 0; i < parent->size(); ++i) {
          if (i == at) copy[n++] = op.at("value");
          copy[n++] = parent->at(i);
        }
        if (at >= parent->size()) copy[n++] = op.at("value");
        *parent = std::move(copy);
      } else {
        (*parent)[last] = op.at("value");
      }
    } else if (kind == "remove") {
      if (!exists) {
        return absl::InvalidArgumentError(
            StrCat("remove: ", StringField(op, "path"), " is absent"));
      }
      parent->erase(last);
    } else {
      return absl::InvalidArgumentError(StrCat("unsupported JSON patch op '", kind, "'"));
    }
  }
  return absl::OkStatus();
}

bool MatchesLabels(const value& object, const kube::LabelSelector& selector) {
  if (selector.empty()) return true;
  absl::StatusOr<kube::ObjectMeta> meta = kube::DecodeObjectMeta(object);
  return meta.ok() && selector.Matches(meta->labels);
}

}  // namespace

// One watch: events queue under the client's mutex until Next() takes them.
class FakeApiClient::FakeWatch final : public kube::WatchStream {
 public:
  FakeWatch(FakeApiClient* client, std::string key, std::string ns, kube::LabelSelector selector)
      : client_(client), key_(std::move(key)), ns_(std::move(ns)), selector_(std::move(selector)) {}
  ~FakeWatch() override { client_->Unregister(this); }

  absl::StatusOr<std::optional<kube::WatchEvent>> Next() override {
    MutexLock lock(&client_->mu_);
    client_->mu_.Await([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
      return !queue_.empty() || ended_ || cancelled_;
    });
    if (cancelled_) return absl::UnavailableError("the watch was cancelled");
    if (!queue_.empty()) {
      kube::WatchEvent event = std::move(queue_.front());
      queue_.pop_front();
      return std::optional<kube::WatchEvent>(std::move(event));
    }
    return std::optional<kube::WatchEvent>();
  }

  void Cancel() override {
    MutexLock lock(&client_->mu_);
    cancelled_ = true;
  }

  // Under the client's mutex.
  bool Wants(const std::string& key, const value& object) const {
    if (key != key_) return false;
    if (!ns_.empty() && MetaString(object, "namespace") != ns_) return false;
    return MatchesLabels(object, selector_);
  }
  void Push(kube::WatchEvent event) { queue_.push_back(std::move(event)); }
  void End() { ended_ = true; }

 private:
  FakeApiClient* const client_;
  const std::string key_;
  const std::string ns_;
  const kube::LabelSelector selector_;
  // Guarded by client_->mu_.
  std::deque<kube::WatchEvent> queue_;
  bool ended_ = false;
  bool cancelled_ = false;
};

FakeApiClient::FakeApiClient(Clock* clock) : clock_(clock) {}

FakeApiClient::~FakeApiClient() {
  MutexLock lock(&mu_);
  CLUSTERPROF_CHECK(watches_.empty()) << "a watch outlives the FakeApiClient";
}

std::string FakeApiClient::ResourceKey(const kube::ResourceType& type) {
  return StrCat(type.resource, ".", type.group);
}

std::string FakeApiClient::ObjectKey(const kube::ResourceType& type, std::string_view ns,
                                     std::string_view name) {
  return StrCat(ResourceKey(type), "/", type.namespaced ? ns : "", "/", name);
}

absl::Status FakeApiClient::ApiError(int http_code, std::string_view reason,
                                     std::string_view message) {
  return kube::ApiErrorFromResponse(http_code, kube::StatusBody(http_code, reason, message), "",
                                    "fake API request");
}

absl::Status FakeApiClient::Admit(Action action) {
  std::vector<Reactor> reactors;
  {
    MutexLock lock(&mu_);
    actions_.push_back(action);
    reactors = reactors_;
  }
  for (const Reactor& reactor : reactors) {
    if (std::optional<absl::Status> status = reactor(action)) return *status;
  }
  return absl::OkStatus();
}

void FakeApiClient::AddReactor(Reactor reactor) {
  MutexLock lock(&mu_);
  reactors_.push_back(std::move(reactor));
}

void FakeApiClient::FailNext(std::string verb, std::string resource, int http_code, int times,
                             std::string subresource) {
  auto left = std::make_shared<int>(times);
  auto mu = std::make_shared<Mutex>();
  AddReactor([=](const Action& action) -> std::optional<absl::Status> {
    if (action.verb != verb || action.resource != resource || action.subresource != subresource) {
      return std::nullopt;
    }
    MutexLock lock(mu.get());
    if (*left <= 0) return std::nullopt;
    --*left;
    return ApiError(http_code, "", StrCat("injected: ", http_code, " for ", verb, " ", resource));
  });
}

std::vector<FakeApiClient::Action> FakeApiClient::Actions() const {
  MutexLock lock(&mu_);
  return actions_;
}

int FakeApiClient::CountActions(std::string_view verb, std::string_view resource,
                                std::optional<std::string_view> subresource) const {
  MutexLock lock(&mu_);
  return static_cast<int>(std::count_if(actions_.begin(), actions_.end(), [&](const Action& a) {
    return a.verb == verb && (resource.empty() || a.resource == resource) &&
           (!subresource.has_value() || a.subresource == *subresource);
  }));
}

void FakeApiClient::ClearActions() {
  MutexLock lock(&mu_);
  actions_.clear();
}

void FakeApiClient::EndWatches() {
  MutexLock lock(&mu_);
  for (FakeWatch* watch : watches_) watch->End();
}

void FakeApiClient::Compact() {
  MutexLock lock(&mu_);
  compacted_ = resource_version_;
  history_.clear();
}

int FakeApiClient::open_watches() const {
  MutexLock lock(&mu_);
  return static_cast<int>(watches_.size());
}

void FakeApiClient::WaitForWatches(int count) const {
  MutexLock lock(&mu_);
  mu_.Await(
      [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return static_cast<int>(watches_.size()) >= count; });
}

void FakeApiClient::Unregister(FakeWatch* watch) {
  MutexLock lock(&mu_);
  watches_.erase(watch);
}

absl::StatusOr<std::optional<value>> FakeApiClient::WaitFor(
    const kube::ResourceType& type, std::string_view ns, std::string_view name,
    const std::function<bool(const std::optional<value>& object)>& predicate,
    int64_t timeout_ns) const {
  const std::string key = ObjectKey(type, ns, name);
  std::optional<value> seen;
  MutexLock lock(&mu_);
  const bool held = mu_.AwaitWithTimeout(
      [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
        auto it = objects_.find(key);
        seen = it == objects_.end() ? std::nullopt : std::optional<value>(it->second);
        return predicate(seen);
      },
      std::chrono::nanoseconds(timeout_ns));
  if (!held) {
    return absl::DeadlineExceededError(
        StrCat(type.Describe(), " ", ns, "/", name, " never reached the state waited for; last: ",
               seen.has_value() ? seen->serialize() : std::string("absent")));
  }
  return seen;
}

std::optional<value> FakeApiClient::Peek(const kube::ResourceType& type, std::string_view ns,
                                         std::string_view name) const {
  MutexLock lock(&mu_);
  auto it = objects_.find(ObjectKey(type, ns, name));
  if (it == objects_.end()) return std::nullopt;
  return it->second;
}

value FakeApiClient::Commit(const kube::ResourceType& type, const std::string& key, value object,
                            kube::WatchEvent::Type type_of_change) {
  const int64_t rv = ++resource_version_;
  Metadata(object)["resourceVersion"] = value::string(std::to_string(rv));
  if (type_of_change == kube::WatchEvent::Type::kDeleted) {
    objects_.erase(key);
  } else {
    objects_[key] = object;
  }
  kube::WatchEvent event{type_of_change, object};
  const std::string resource_key = ResourceKey(type);
  history_.push_back({rv, resource_key, event});
  for (FakeWatch* watch : watches_) {
    if (watch->Wants(resource_key, object)) watch->Push(event);
  }
  return object;
}

absl::StatusOr<value> FakeApiClient::Get(const kube::ResourceType& type, std::string_view ns,
                                         std::string_view name, std::string_view subresource) {
  CLUSTERPROF_RETURN_IF_ERROR(
      Admit({"get", type.resource, std::string(ns), std::string(name), std::string(subresource)}));
  MutexLock lock(&mu_);
  auto it = objects_.find(ObjectKey(type, ns, name));
  if (it == objects_.end()) {
    return ApiError(404, "NotFound", StrCat(type.Describe(), " \"", name, "\" not found"));
  }
  return it->second;
}

absl::StatusOr<kube::ObjectList> FakeApiClient::List(const kube::ResourceType& type,
                                                     std::string_view ns,
                                                     const kube::ListOptions& options) {
  CLUSTERPROF_RETURN_IF_ERROR(Admit({"list", type.resource, std::string(ns), "", ""}));
  absl::StatusOr<kube::LabelSelector> selector = kube::LabelSelector::Parse(options.label_selector);
  if (!selector.ok()) return ApiError(400, "BadRequest", std::string(selector.status().message()));
  std::string name_field;
  if (!options.field_selector.empty()) {
    std::string_view field = options.field_selector;
    if (!ConsumePrefix(&field, "metadata.name=")) {
      return ApiError(400, "BadRequest",
                      StrCat("the fake supports only metadata.name field selectors, not ",
                             options.field_selector));
    }
    name_field = std::string(field);
  }
  MutexLock lock(&mu_);
  kube::ObjectList list;
  list.resource_version = std::to_string(resource_version_);
  const std::string prefix = StrCat(ResourceKey(type), "/");
  const std::string after = options.continue_token;
  for (auto it = objects_.lower_bound(prefix); it != objects_.end(); ++it) {
    if (!StartsWith(it->first, prefix)) break;
    if (!after.empty() && it->first <= after) continue;
    const value& object = it->second;
    if (type.namespaced && !ns.empty() && MetaString(object, "namespace") != ns) continue;
    if (!name_field.empty() && MetaString(object, "name") != name_field) continue;
    if (!MatchesLabels(object, *selector)) continue;
    if (options.limit > 0 && static_cast<int64_t>(list.items.size()) == options.limit) {
      list.continue_token = ObjectKey(type, MetaString(list.items.back(), "namespace"),
                                      MetaString(list.items.back(), "name"));
      break;
    }
    list.items.push_back(object);
  }
  return list;
}

absl::StatusOr<value> FakeApiClient::Create(const kube::ResourceType& type, std::string_view ns,
                                            const value& object) {
  CLUSTERPROF_RETURN_IF_ERROR(
      Admit({"create", type.resource, std::string(ns), MetaString(object, "name"), "", object}));
  value stored = object;
  if (!stored.has_field("apiVersion")) stored["apiVersion"] = value::string(type.ApiVersion());
  if (!stored.has_field("kind") && !type.kind.empty()) stored["kind"] = value::string(type.kind);
  // (A reference into a cpprest object lasts only until the object gains a field.)
  value& meta = Metadata(stored);
  MutexLock lock(&mu_);
  std::string name = MetaString(stored, "name");
  if (name.empty()) {
    const std::string generate = MetaString(stored, "generateName");
    if (generate.empty()) {
      return ApiError(422, "Invalid", "metadata.name: Required value: name or generateName");
    }
    name = StrCat(generate, "f", next_uid_);
    meta["name"] = value::string(name);
  }
  if (type.namespaced) {
    const std::string given = MetaString(stored, "namespace");
    if (!given.empty() && given != ns) {
      return ApiError(400, "BadRequest", "the namespace of the object does not match the request");
    }
    meta["namespace"] = value::string(std::string(ns));
  }
  const std::string key = ObjectKey(type, ns, name);
  if (objects_.count(key) != 0) {
    return ApiError(409, "AlreadyExists",
                    StrCat(type.Describe(), " \"", name, "\" already exists"));
  }
  meta["uid"] = value::string(StrCat("fake-uid-", next_uid_++));
  meta["creationTimestamp"] = value::string(Rfc3339(clock_->WallNs()));
  meta["generation"] = value::number(1);
  // As the real server: status is the status subresource's; a create does not set it.
  if (stored.has_field("status")) stored.erase("status");
  return Commit(type, key, std::move(stored), kube::WatchEvent::Type::kAdded);
}

absl::StatusOr<value> FakeApiClient::Replace(const kube::ResourceType& type, const std::string& key,
                                             value updated, std::string_view subresource,
                                             bool check_resource_version) {
  auto it = objects_.find(key);
  if (it == objects_.end()) {
    return ApiError(404, "NotFound",
                    StrCat(type.Describe(), " \"", MetaString(updated, "name"), "\" not found"));
  }
  const value& current = it->second;
  const std::string given_rv = MetaString(updated, "resourceVersion");
  if (check_resource_version && !given_rv.empty() &&
      given_rv != MetaString(current, "resourceVersion")) {
    return ApiError(409, "Conflict",
                    StrCat("Operation cannot be fulfilled on ", type.Describe(), " \"",
                           MetaString(current, "name"),
                           "\": the object has been modified; please apply your changes to the "
                           "latest version and try again"));
  }
  value result = current;
  if (subresource == "status") {
    if (updated.has_field("status")) {
      result["status"] = updated.at("status");
    } else if (result.has_field("status")) {
      result.erase("status");
    }
  } else {
    result = std::move(updated);
    if (current.has_field("status")) {
      result["status"] = current.at("status");
    } else if (result.has_field("status")) {
      result.erase("status");
    }
    value& meta = Metadata(result);
    const value& old_meta = current.at("metadata");
    for (const char* owned : {"uid", "creationTimestamp", "namespace", "name"}) {
      if (old_meta.has_field(owned)) meta[owned] = old_meta.at(owned);
    }
    const int64_t generation =
        old_meta.has_field("generation") ? old_meta.at("generation").as_number().to_int64() : 1;
    const bool spec_changed = (current.has_field("spec") ? current.at("spec") : value::null()) !=
                              (result.has_field("spec") ? result.at("spec") : value::null());
    meta["generation"] = value::number(spec_changed ? generation + 1 : generation);
  }
  return Commit(type, key, std::move(result), kube::WatchEvent::Type::kModified);
}

absl::StatusOr<value> FakeApiClient::Update(const kube::ResourceType& type, std::string_view ns,
                                            const value& object, std::string_view subresource) {
  const std::string name = MetaString(object, "name");
  CLUSTERPROF_RETURN_IF_ERROR(
      Admit({"update", type.resource, std::string(ns), name, std::string(subresource), object}));
  MutexLock lock(&mu_);
  return Replace(type, ObjectKey(type, ns, name), object, subresource,
                 /*check_resource_version=*/true);
}

absl::StatusOr<value> FakeApiClient::Patch(const kube::ResourceType& type, std::string_view ns,
                                           std::string_view name, kube::PatchType patch_type,
                                           const value& patch, std::string_view subresource) {
  CLUSTERPROF_RETURN_IF_ERROR(Admit({"patch", type.resource, std::string(ns), std::string(name),
                                     std::string(subresource), patch}));
  MutexLock lock(&mu_);
  const std::string key = ObjectKey(type, ns, name);
  auto it = objects_.find(key);
  if (it == objects_.end()) {
    return ApiError(404, "NotFound", StrCat(type.Describe(), " \"", name, "\" not found"));
  }
  value patched = it->second;
  if (patch_type == kube::PatchType::kJson) {
    if (absl::Status applied = JsonPatch(patched, patch); !applied.ok()) {
      return ApiError(422, "Invalid", std::string(applied.message()));
    }
  } else {
    // Strategic merge patches of the objects the operator patches (Events) merge like RFC 7386.
    MergePatch(patched, patch);
  }
  // A resourceVersion in the patch is a precondition; otherwise the patch applies to the latest.
  const bool precondition = patch.is_object() && patch.has_object_field("metadata") &&
                            patch.at("metadata").has_field("resourceVersion");
  return Replace(type, key, std::move(patched), subresource, precondition);
}

absl::Status FakeApiClient::Delete(const kube::ResourceType& type, std::string_view ns,
                                   std::string_view name, const kube::DeleteOptions& options) {
  CLUSTERPROF_RETURN_IF_ERROR(
      Admit({"delete", type.resource, std::string(ns), std::string(name), ""}));
  MutexLock lock(&mu_);
  const std::string key = ObjectKey(type, ns, name);
  auto it = objects_.find(key);
  if (it == objects_.end()) {
    return ApiError(404, "NotFound", StrCat(type.Describe(), " \"", name, "\" not found"));
  }
  if ((!options.uid.empty() && options.uid != MetaString(it->second, "uid")) ||
      (!options.resource_version.empty() &&
       options.resource_version != MetaString(it->second, "resourceVersion"))) {
    return ApiError(409, "Conflict",
                    StrCat("Precondition failed for ", type.Describe(), " \"", name, "\""));
  }
  Commit(type, key, it->second, kube::WatchEvent::Type::kDeleted);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<kube::WatchStream>> FakeApiClient::Watch(
    const kube::ResourceType& type, std::string_view ns, const kube::ListOptions& options) {
  CLUSTERPROF_RETURN_IF_ERROR(Admit({"watch", type.resource, std::string(ns), "", ""}));
  absl::StatusOr<kube::LabelSelector> selector = kube::LabelSelector::Parse(options.label_selector);
  if (!selector.ok()) return ApiError(400, "BadRequest", std::string(selector.status().message()));
  auto watch = std::make_unique<FakeWatch>(this, ResourceKey(type),
                                           type.namespaced ? std::string(ns) : "", *selector);
  MutexLock lock(&mu_);
  const std::string& from = options.resource_version;
  if (from.empty() || from == "0") {
    // Start at the current state: every object that matches, as ADDED.
    const std::string prefix = StrCat(ResourceKey(type), "/");
    for (auto it = objects_.lower_bound(prefix); it != objects_.end(); ++it) {
      if (!StartsWith(it->first, prefix)) break;
      if (watch->Wants(ResourceKey(type), it->second)) {
        watch->Push({kube::WatchEvent::Type::kAdded, it->second});
      }
    }
  } else {
    const int64_t since = std::stoll(from);
    if (since < compacted_) {
      watch->Push(
          {kube::WatchEvent::Type::kError,
           StatusObject(410, "Expired",
                        StrCat("too old resource version: ", since, " (", compacted_, ")"))});
      watch->End();
    } else {
      for (const Change& change : history_) {
        if (change.resource_version > since && watch->Wants(change.key, change.event.object)) {
          watch->Push(change.event);
        }
      }
    }
  }
  watches_.insert(watch.get());
  return std::unique_ptr<kube::WatchStream>(std::move(watch));
}

}  // namespace clusterprof::testing
