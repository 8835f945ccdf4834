#include "operator/kube/object.h"

#include <algorithm>
#include <utility>

#include "common/base/strings.h"

namespace clusterprof::kube {
namespace {

absl::Status WrongType(std::string_view field, std::string_view want) {
  return absl::InvalidArgumentError(StrCat(field, " is not ", want));
}

// Reads an optional string field.
absl::Status ReadString(const web::json::object& object, const char* key, std::string_view where,
                        std::string* out) {
  const auto it = object.find(key);
  if (it == object.end() || it->second.is_null()) return absl::OkStatus();
  if (!it->second.is_string()) return WrongType(StrCat(where, key), "a string");
  *out = it->second.as_string();
  return absl::OkStatus();
}

absl::Status ReadStringMap(const web::json::object& object, const char* key, std::string_view where,
                           StringMap* out) {
  const auto it = object.find(key);
  if (it == object.end() || it->second.is_null()) return absl::OkStatus();
  if (!it->second.is_object()) return WrongType(StrCat(where, key), "an object");
  const web::json::object& map = it->second.as_object();
  out->reserve(map.size());
  for (const auto& [name, value] : map) {
    if (!value.is_string()) return WrongType(StrCat(where, key, ".", name), "a string");
    out->emplace_back(name, value.as_string());
  }
  std::sort(out->begin(), out->end());
  return absl::OkStatus();
}

const web::json::object* ObjectField(const web::json::object& object, const char* key) {
  const auto it = object.find(key);
  if (it == object.end() || !it->second.is_object()) return nullptr;
  return &it->second.as_object();
}

const web::json::array* ArrayField(const web::json::object& object, const char* key) {
  const auto it = object.find(key);
  if (it == object.end() || !it->second.is_array()) return nullptr;
  return &it->second.as_array();
}

}  // namespace

const std::string* FindValue(const StringMap& map, std::string_view key) {
  const auto it = std::lower_bound(map.begin(), map.end(), key,
                                   [](const std::pair<std::string, std::string>& entry,
                                      std::string_view k) { return entry.first < k; });
  if (it == map.end() || it->first != key) return nullptr;
  return &it->second;
}

std::string ObjectKey(std::string_view ns, std::string_view name) {
  return ns.empty() ? std::string(name) : StrCat(ns, "/", name);
}

std::string ObjectMeta::Key() const { return ObjectKey(namespace_, name); }

absl::StatusOr<ObjectMeta> DecodeObjectMeta(const web::json::value& object) {
  if (!object.is_object()) return absl::InvalidArgumentError("the object is not a JSON object");
  const web::json::object* metadata = ObjectField(object.as_object(), "metadata");
  if (metadata == nullptr) return absl::InvalidArgumentError("the object has no metadata");
  ObjectMeta meta;
  constexpr std::string_view kWhere = "metadata.";
  for (const auto& [key, out] :
       {std::pair<const char*, std::string*>{"namespace", &meta.namespace_},
        {"name", &meta.name},
        {"uid", &meta.uid},
        {"resourceVersion", &meta.resource_version},
        {"creationTimestamp", &meta.creation_timestamp},
        {"deletionTimestamp", &meta.deletion_timestamp}}) {
    if (absl::Status status = ReadString(*metadata, key, kWhere, out); !status.ok()) return status;
  }
  if (meta.name.empty()) return absl::InvalidArgumentError("the object has no metadata.name");
  if (const auto it = metadata->find("generation"); it != metadata->end()) {
    if (!it->second.is_integer()) return WrongType("metadata.generation", "an integer");
    meta.generation = it->second.as_number().to_int64();
  }
  if (absl::Status status = ReadStringMap(*metadata, "labels", kWhere, &meta.labels);
      !status.ok()) {
    return status;
  }
  if (absl::Status status = ReadStringMap(*metadata, "annotations", kWhere, &meta.annotations);
      !status.ok()) {
    return status;
  }
  if (const web::json::array* owners = ArrayField(*metadata, "ownerReferences")) {
    for (const web::json::value& owner : *owners) {
      if (!owner.is_object()) return WrongType("metadata.ownerReferences[]", "an object");
      OwnerReference ref;
      const web::json::object& o = owner.as_object();
      constexpr std::string_view kOwner = "metadata.ownerReferences[].";
      for (const auto& [key, out] :
           {std::pair<const char*, std::string*>{"apiVersion", &ref.api_version},
            {"kind", &ref.kind},
            {"name", &ref.name},
            {"uid", &ref.uid}}) {
        if (absl::Status status = ReadString(o, key, kOwner, out); !status.ok()) return status;
      }
      if (const auto it = o.find("controller"); it != o.end() && it->second.is_boolean()) {
        ref.controller = it->second.as_bool();
      }
      meta.owner_references.push_back(std::move(ref));
    }
  }
  return meta;
}

void DropManagedFields(web::json::value& object) {
  if (!object.is_object() || !object.has_object_field("metadata")) return;
  web::json::value& metadata = object.at("metadata");
  if (metadata.has_field("managedFields")) metadata.erase("managedFields");
}

Decoder JsonDecoder() {
  return [](web::json::value& json) -> absl::StatusOr<std::shared_ptr<Object>> {
    absl::StatusOr<ObjectMeta> meta = DecodeObjectMeta(json);
    if (!meta.ok()) return meta.status();
    auto object = std::make_shared<JsonObject>();
    object->metadata = *std::move(meta);
    DropManagedFields(json);
    object->json = std::move(json);
    return object;
  };
}

Decoder PodDecoder() {
  return [](web::json::value& json) -> absl::StatusOr<std::shared_ptr<Object>> {
    absl::StatusOr<ObjectMeta> meta = DecodeObjectMeta(json);
    if (!meta.ok()) return meta.status();
    auto pod = std::make_shared<Pod>();
    pod->metadata = *std::move(meta);
    const web::json::object& root = json.as_object();
    if (const web::json::object* spec = ObjectField(root, "spec")) {
      if (absl::Status s = ReadString(*spec, "nodeName", "spec.", &pod->node_name); !s.ok()) {
        return s;
      }
      // Native sidecars (init containers with restartPolicy Always) are init containers.
      for (const auto& [field, out] :
           {std::pair<const char*, std::vector<Container>*>{"containers", &pod->containers},
            {"initContainers", &pod->init_containers}}) {
        const web::json::array* containers = ArrayField(*spec, field);
        if (containers == nullptr) continue;
        const std::string where = StrCat("spec.", field, "[]");
        for (const web::json::value& c : *containers) {
          if (!c.is_object()) return WrongType(where, "an object");
          Container container;
          if (absl::Status s =
                  ReadString(c.as_object(), "name", StrCat(where, "."), &container.name);
              !s.ok()) {
            return s;
          }
          if (const web::json::array* ports = ArrayField(c.as_object(), "ports")) {
            for (const web::json::value& p : *ports) {
              if (!p.is_object()) continue;
              ContainerPort port;
              const web::json::object& po = p.as_object();
              (void)ReadString(po, "name", "", &port.name);
              (void)ReadString(po, "protocol", "", &port.protocol);
              if (const auto it = po.find("containerPort");
                  it != po.end() && it->second.is_integer()) {
                port.container_port = it->second.as_integer();
              }
              container.ports.push_back(std::move(port));
            }
          }
          out->push_back(std::move(container));
        }
      }
    }
    if (const web::json::object* status = ObjectField(root, "status")) {
      for (const auto& [key, out] : {std::pair<const char*, std::string*>{"phase", &pod->phase},
                                     {"podIP", &pod->pod_ip},
                                     {"hostIP", &pod->host_ip}}) {
        if (absl::Status s = ReadString(*status, key, "status.", out); !s.ok()) return s;
      }
      if (const web::json::array* conditions = ArrayField(*status, "conditions")) {
        for (const web::json::value& condition : *conditions) {
          if (!condition.is_object() || !condition.has_string_field("type") ||
              !condition.has_string_field("status")) {
            continue;
          }
          const std::string& type = condition.at("type").as_string();
          const std::string& status = condition.at("status").as_string();
          if (type == "Ready") pod->ready = status == "True";
          if (type == "PodScheduled" && status == "False") {
            std::string reason, message;
            (void)ReadString(condition.as_object(), "reason", "", &reason);
            (void)ReadString(condition.as_object(), "message", "", &message);
            pod->unschedulable =
                message.empty() ? (reason.empty() ? "unschedulable" : reason) : message;
          }
        }
      }
      for (const char* field : {"initContainerStatuses", "containerStatuses"}) {
        const web::json::array* statuses = ArrayField(*status, field);
        if (statuses == nullptr) continue;
        for (const web::json::value& container : *statuses) {
          if (!container.is_object()) continue;
          const web::json::object* state = ObjectField(container.as_object(), "state");
          const web::json::object* waiting =
              state != nullptr ? ObjectField(*state, "waiting") : nullptr;
          if (waiting == nullptr) continue;
          std::string name, reason, message;
          (void)ReadString(container.as_object(), "name", "", &name);
          (void)ReadString(*waiting, "reason", "", &reason);
          (void)ReadString(*waiting, "message", "", &message);
          // Waiting to be created is what every starting pod does: not a reason to report.
          if (reason.empty() || reason == "ContainerCreating" || reason == "PodInitializing") {
            continue;
          }
          pod->waiting.push_back(
              StrCat("container ", name, ": ", reason, message.empty() ? "" : ": ", message));
          pod->waiting_reasons.push_back(reason);
        }
      }
    }
    return pod;
  };
}

}  // namespace clusterprof::kube
