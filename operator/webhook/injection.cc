#include "operator/webhook/injection.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <functional>
#include <regex>
#include <set>

#include "absl/strings/escaping.h"
#include "common/base/status.h"
#include "common/base/strings.h"
#include "cpprest/json.h"
#include "operator/api/types.h"

namespace clusterprof::webhook {
namespace {

using web::json::value;

using api::kPortAnnotation;
using api::kSidecarContainerName;
using api::kSidecarPortName;

bool IsQuantity(const std::string& text) {
  // resource.Quantity's syntax: a decimal number with an optional binary or decimal suffix.
  static const std::regex pattern(
      R"(^[+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+|Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$)");
  return std::regex_match(text, pattern);
}

bool IsPort(int port) { return port >= 1 && port <= 65535; }

// host:port (common/base/strings.h), and nothing that would split a command-line argument or a
// path.
bool IsAddress(std::string_view address) {
  return IsHostPort(address) && address.find_first_of(" \t\n/") == std::string_view::npos;
}

// A JSON Pointer reference token (RFC 6901): "~" -> "~0", "/" -> "~1".
std::string Escape(std::string_view token) {
  std::string out;
  for (char c : token) {
    if (c == '~') {
      out += "~0";
    } else if (c == '/') {
      out += "~1";
    } else {
      out += c;
    }
  }
  return out;
}

// The member `name` of an object (a field, or a key of a string map such as labels), or null.
const value* Field(const value& object, std::string_view name) {
  if (!object.is_object()) return nullptr;
  const auto& fields = object.as_object();
  auto it = fields.find(std::string(name));
  return it == fields.end() ? nullptr : &it->second;
}

std::string StringField(const value& object, const char* name) {
  const value* field = Field(object, name);
  return field != nullptr && field->is_string() ? field->as_string() : "";
}

std::string MapString(const value* map, std::string_view key) {
  if (map == nullptr) return "";
  const value* entry = Field(*map, key);
  return entry != nullptr && entry->is_string() ? entry->as_string() : "";
}

bool HasMapKey(const value* map, std::string_view key) {
  return map != nullptr && Field(*map, key) != nullptr;
}

value Str(std::string_view s) { return value::string(std::string(s)); }

value Object(std::initializer_list<std::pair<std::string, value>> fields) {
  value object = value::object(true);  // keep the order: the patches read as written
  for (const auto& [name, field] : fields) object[name] = field;
  return object;
}

value Array(const std::vector<value>& items) {
  value array = value::array(items.size());
  for (size_t i = 0; i < items.size(); ++i) array[i] = items[i];
  return array;
}

class Patch {
 public:
  void Add(const std::string& path, value v) {
    ops_.push_back(Object({{"op", Str("add")}, {"path", Str(path)}, {"value", std::move(v)}}));
  }
  // Adds `item` to the array at `path`, creating the array when the object has none.
  void Append(const value& parent, const char* field, const std::string& parent_path, value item) {
    const std::string path = StrCat(parent_path, "/", field);
    if (Exists(parent, field, path)) {
      Add(StrCat(path, "/-"), std::move(item));
    } else {
      Add(path, Array({std::move(item)}));
      created_.insert(path);
    }
  }
  void Prepend(const value& parent, const char* field, const std::string& parent_path, value item) {
    const std::string path = StrCat(parent_path, "/", field);
    if (Exists(parent, field, path)) {
      Add(StrCat(path, "/0"), std::move(item));
    } else {
      Add(path, Array({std::move(item)}));
      created_.insert(path);
    }
  }
  // Sets `key` in the string map at `path` (labels, annotations), creating the map if needed.
  void SetMapEntry(const value& parent, const char* field, const std::string& parent_path,
                   std::string_view key, std::string_view v) {
    const value* map = Field(parent, field);
    if (map == nullptr || !map->is_object()) {
      value fresh = value::object();
      fresh[std::string(key)] = Str(v);
      Add(StrCat(parent_path, "/", field), fresh);
    } else {
      Add(StrCat(parent_path, "/", field, "/", Escape(key)), Str(v));
    }
  }
  std::string Serialize() const { return Array(ops_).serialize(); }

 private:
  // Whether the array at `path` is there: in the object, or made by an earlier operation (an
  // "add" of the whole array again would replace it).
  bool Exists(const value& parent, const char* field, const std::string& path) const {
    const value* array = Field(parent, field);
    return (array != nullptr && array->is_array() && array->size() > 0) || created_.contains(path);
  }

  std::vector<value> ops_;
  std::set<std::string> created_;
};

bool RequestsGpu(const value& container) {
  const value* resources = Field(container, "resources");
  if (resources == nullptr) return false;
  for (const char* kind : {"limits", "requests"}) {
    const value* map = Field(*resources, kind);
    if (map == nullptr) continue;
    const value* gpus = Field(*map, kGpuResource);
    if (gpus == nullptr) continue;
    // Quantities arrive as strings ("1") or, from some clients, numbers.
    if (gpus->is_string() && gpus->as_string() != "0" && !gpus->as_string().empty()) return true;
    if (gpus->is_number() && gpus->as_double() > 0) return true;
  }
  return false;
}

const value* FindEnv(const value& container, std::string_view name) {
  const value* env = Field(container, "env");
  if (env == nullptr || !env->is_array()) return nullptr;
  for (const value& entry : env->as_array()) {
    if (StringField(entry, "name") == name) return &entry;
  }
  return nullptr;
}

bool MountsAt(const value& container, std::string_view path) {
  const value* mounts = Field(container, "volumeMounts");
  if (mounts == nullptr || !mounts->is_array()) return false;
  for (const value& mount : mounts->as_array()) {
    std::string mount_path = StringField(mount, "mountPath");
    while (mount_path.size() > 1 && mount_path.back() == '/') mount_path.pop_back();
    if (mount_path == path) return true;
  }
  return false;
}

const web::json::array& Containers(const value& spec, const char* field) {
  static const value kEmpty = value::array();
  const value* containers = Field(spec, field);
  return containers != nullptr && containers->is_array() ? containers->as_array()
                                                         : kEmpty.as_array();
}

value EnvVar(std::string_view name, std::string_view v) {
  return Object({{"name", Str(name)}, {"value", Str(v)}});
}

value FieldRefEnv(std::string_view name, std::string_view field_path) {
  return Object({{"name", Str(name)},
                 {"valueFrom", Object({{"fieldRef", Object({{"fieldPath", Str(field_path)}})}})}});
}

value ResourceMap(const std::map<std::string, std::string>& quantities) {
  value map = value::object(true);
  for (const auto& [name, quantity] : quantities) {
    if (!quantity.empty()) map[name] = Str(quantity);
  }
  return map;
}

value EmptyDir(std::string_view medium, const std::string& size_limit) {
  value dir = value::object(true);
  if (!medium.empty()) dir["medium"] = Str(medium);
  if (!size_limit.empty()) dir["sizeLimit"] = Str(size_limit);
  return dir;
}

struct PodSettings {
  int port = 0;
  int http_port = 0;
  std::string framework_profiler;
  std::map<std::string, std::string> requests, limits;
  bool gpu = false;
  int64_t recorder_window_ms = 0;
  int64_t recorder_max_bytes = 0;
};

// An annotation's whole number of bytes: digits, optionally with Ki, Mi or Gi.
std::optional<int64_t> ParseBytes(std::string_view text) {
  int64_t unit = 1;
  for (const auto& [suffix, factor] : {std::pair<std::string_view, int64_t>{"Ki", 1 << 10},
                                       {"Mi", 1 << 20},
                                       {"Gi", int64_t{1} << 30}}) {
    if (EndsWith(text, suffix)) {
      text.remove_suffix(2);
      unit = factor;
      break;
    }
  }
  if (text.empty() || text.size() > 12 ||
      !std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return std::nullopt;
  }
  return std::stoll(std::string(text)) * unit;
}

value SidecarContainer(const InjectionConfig& config, const PodSettings& pod) {
  std::vector<value> args = {
      // The container's process keeps the sidecar running and never exits on its failures
      // (sidecar/supervisor.h): a sidecar that fails takes nothing of the pod down with it.
      Str("--supervise"),
      Str(StrCat("--port=", pod.port)),
      Str(StrCat("--http-port=", pod.http_port)),
      Str(StrCat("--shm-dir=", kShmDir)),
      Str(StrCat("--spool-dir=", kSpoolDir)),
      Str(StrCat("--log-format=", config.log_format)),
  };
  for (const std::string& logdir : config.allowed_logdirs) {
    args.push_back(Str(StrCat("--allowed-logdir=", logdir)));
  }
  if (!pod.framework_profiler.empty()) {
    args.push_back(Str(StrCat("--framework-profiler=", pod.framework_profiler)));
  }
  if (pod.gpu) {
    args.push_back(Str(StrCat("--install-injection-library=", config.gpu_library)));
  } else {
    args.push_back(Str("--no-gpu"));
  }
  if (!config.token_secret.empty()) {
    args.push_back(Str(StrCat("--auth-token-file=", kTokenDir, "/token")));
    args.push_back(Str(StrCat("--token-grace-seconds=", config.token_grace_seconds)));
  }
  if (!config.tls_secret.empty()) {
    args.push_back(Str(StrCat("--tls-cert-file=", kTlsDir, "/tls.crt")));
    args.push_back(Str(StrCat("--tls-key-file=", kTlsDir, "/tls.key")));
  }
  args.push_back(Str(StrCat("--recorder-level=", config.recorder_level)));
  args.push_back(Str(StrCat("--recorder-window-ms=", pod.recorder_window_ms)));
  args.push_back(Str(StrCat("--recorder-max-bytes=", pod.recorder_max_bytes)));
  for (const std::string& arg : config.extra_args) args.push_back(Str(arg));

  std::vector<value> mounts = {
      Object({{"name", Str(kShmVolumeName)}, {"mountPath", Str(kShmDir)}}),
      Object({{"name", Str(kSpoolVolumeName)}, {"mountPath", Str(kSpoolDir)}}),
  };
  // Whole volumes, never subPath: the kubelet updates a Secret's files in place only where the
  // volume itself is mounted, and the sidecar rereads them after a rotation.
  if (!config.token_secret.empty()) {
    mounts.push_back(Object(
        {{"name", Str(kTokenVolumeName)}, {"mountPath", Str(kTokenDir)}, {"readOnly", true}}));
  }
  if (!config.tls_secret.empty()) {
    mounts.push_back(
        Object({{"name", Str(kTlsVolumeName)}, {"mountPath", Str(kTlsDir)}, {"readOnly", true}}));
  }
  value resources = value::object(true);
  if (value requests = ResourceMap(pod.requests); requests.size() > 0) {
    resources["requests"] = requests;
  }
  if (value limits = ResourceMap(pod.limits); limits.size() > 0) resources["limits"] = limits;

  std::vector<value> env = {FieldRefEnv("POD_NAME", "metadata.name"),
                            FieldRefEnv("POD_NAMESPACE", "metadata.namespace"),
                            EnvVar(shm::kDirEnv, kShmDir)};
  for (const auto& [name, env_value] : config.env) env.push_back(EnvVar(name, env_value));

  value container = Object({
      {"name", Str(kSidecarContainerName)},
      {"image", Str(config.image.empty() ? StrCat("clusterprof/sidecar:", CLUSTERPROF_VERSION)
                                         : config.image)},
      {"imagePullPolicy", Str(config.image_pull_policy)},
      {"args", Array(args)},
      {"env", Array(env)},
      {"ports", Array({Object({{"name", Str(kSidecarPortName)},
                               {"containerPort", value::number(pod.port)},
                               {"protocol", Str("TCP")}}),
                       Object({{"name", Str("cprof-http")},  // names: 15 characters at most
                               {"containerPort", value::number(pod.http_port)},
                               {"protocol", Str("TCP")}})})},
      {"resources", resources},
      {"volumeMounts", Array(mounts)},
      // No probes. A container's readiness is part of the pod's, a native sidecar's startup
      // probe holds the pod's other containers back, and a liveness probe would restart the
      // container into a back-off that makes the pod unready: each would let a broken profiler
      // take a serving pod out of its Service or delay training. The operator learns whether
      // the sidecar answers by calling it; the supervisor restarts it inside the container.
      {"securityContext",
       Object({{"runAsNonRoot", true},
               {"runAsUser", value::number(65532)},
               {"runAsGroup", value::number(65532)},
               {"readOnlyRootFilesystem", true},
               {"allowPrivilegeEscalation", false},
               {"capabilities", config.start_realtime ? Object({{"drop", Array({Str("ALL")})},
                                                                {"add", Array({Str("SYS_NICE")})}})
                                                      : Object({{"drop", Array({Str("ALL")})}})},
               {"seccompProfile", Object({{"type", Str("RuntimeDefault")}})}})},
  });
  if (config.native_sidecar) {
    // Without a startup probe the kubelet starts the pod's next container as soon as this one
    // runs. The GPU library is copied in its first instants; a CUDA process that initializes
    // before that is not traced, and is otherwise unaffected (the driver skips an injection
    // library it cannot load).
    container["restartPolicy"] = Str("Always");
  }
  return container;
}

absl::Status ReadPodSettings(const InjectionConfig& config, const value& pod, PodSettings* out) {
  const value* metadata = Field(pod, "metadata");
  const value* annotations = metadata != nullptr ? Field(*metadata, "annotations") : nullptr;
  out->port = config.port;
  out->http_port = config.http_port;
  if (HasMapKey(annotations, kPortAnnotation)) {
    const std::string text(StripAsciiWhitespace(MapString(annotations, kPortAnnotation)));
    // 65535 leaves no next port for the HTTP server.
    const std::optional<int> port = ParsePort(text);
    if (!port.has_value() || *port == 65535) {
      return absl::InvalidArgumentError(
          StrCat("annotation ", kPortAnnotation, "=\"", text, "\" is not a port number (1-65534)"));
    }
    out->port = *port;
    // The HTTP port follows the gRPC one, so that one annotation moves both off a taken pair.
    if (*port != config.port) out->http_port = *port + 1;
  }
  out->framework_profiler = config.framework_profiler;
  if (HasMapKey(annotations, kFrameworkProfilerAnnotation)) {
    out->framework_profiler =
        std::string(StripAsciiWhitespace(MapString(annotations, kFrameworkProfilerAnnotation)));
    if (!out->framework_profiler.empty() && !IsAddress(out->framework_profiler)) {
      return absl::InvalidArgumentError(StrCat("annotation ", kFrameworkProfilerAnnotation, "=\"",
                                               out->framework_profiler,
                                               "\" is not host:port (for example localhost:9012)"));
    }
  }
  out->recorder_window_ms = config.recorder_window_ms;
  if (HasMapKey(annotations, kRecorderWindowAnnotation)) {
    const std::string text(StripAsciiWhitespace(MapString(annotations, kRecorderWindowAnnotation)));
    const std::optional<int64_t> ms = ParseBytes(text);  // digits only: no unit
    if (!ms.has_value() || *ms > 3'600'000 || text.find_first_not_of("0123456789") != text.npos) {
      return absl::InvalidArgumentError(
          StrCat("annotation ", kRecorderWindowAnnotation, "=\"", text,
                 "\" is not a window in milliseconds (0, which keeps nothing, to 3600000)"));
    }
    out->recorder_window_ms = *ms;
  }
  out->recorder_max_bytes = config.recorder_max_bytes;
  if (HasMapKey(annotations, kRecorderMaxBytesAnnotation)) {
    const std::string text(
        StripAsciiWhitespace(MapString(annotations, kRecorderMaxBytesAnnotation)));
    const std::optional<int64_t> bytes = ParseBytes(text);
    if (!bytes.has_value() || *bytes < (int64_t{1} << 20)) {
      return absl::InvalidArgumentError(
          StrCat("annotation ", kRecorderMaxBytesAnnotation, "=\"", text,
                 "\" is not a memory bound of at least 1 MiB (bytes, or a quantity such as "
                 "64Mi)"));
    }
    out->recorder_max_bytes = *bytes;
  }
  out->requests = config.requests;
  out->limits = config.limits;
  const std::pair<std::string_view, std::pair<std::map<std::string, std::string>*, const char*>>
      overrides[] = {
          {kCpuRequestAnnotation, {&out->requests, "cpu"}},
          {kCpuLimitAnnotation, {&out->limits, "cpu"}},
          {kMemoryRequestAnnotation, {&out->requests, "memory"}},
          {kMemoryLimitAnnotation, {&out->limits, "memory"}},
      };
  for (const auto& [annotation, target] : overrides) {
    if (!HasMapKey(annotations, annotation)) continue;
    const std::string quantity(StripAsciiWhitespace(MapString(annotations, annotation)));
    if (!IsQuantity(quantity)) {
      return absl::InvalidArgumentError(
          StrCat("annotation ", annotation, "=\"", quantity,
                 "\" is not a Kubernetes quantity (for example 500m, 2, 256Mi, 1Gi)"));
    }
    (*target.first)[target.second] = quantity;
  }
  // The port pair must be free in the pod's network namespace.
  const value& spec = *Field(pod, "spec");
  for (const char* field : {"initContainers", "containers"}) {
    for (const value& container : Containers(spec, field)) {
      const value* ports = Field(container, "ports");
      if (ports == nullptr || !ports->is_array()) continue;
      for (const value& port : ports->as_array()) {
        const value* number = Field(port, "containerPort");
        if (number == nullptr || !number->is_integer()) continue;
        const int taken = number->as_integer();
        if (taken == out->port || taken == out->http_port) {
          return absl::FailedPreconditionError(
              StrCat("port ", taken, " is taken by container ", StringField(container, "name"),
                     "; set the annotation ", kPortAnnotation,
                     " to a free port (the sidecar uses it and the next one)"));
        }
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<InjectionConfig> ParseInjectionConfig(std::string_view yaml) {
  YAML::Node root;
  try {
    root = YAML::Load(std::string(yaml));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(StrCat("not valid YAML: ", e.what()));
  }
  InjectionConfig config;
  if (root.IsNull()) return config;
  if (!root.IsMap()) return absl::InvalidArgumentError("must be a YAML mapping of setting: value");
  auto scalar = [](auto* field) {
    return [field](const YAML::Node& node) {
      *field = node.as<std::remove_pointer_t<decltype(field)>>();
    };
  };
  auto strings = [](std::vector<std::string>* field) {
    return [field](const YAML::Node& node) {
      *field = node.IsNull() ? std::vector<std::string>{} : node.as<std::vector<std::string>>();
    };
  };
  auto resources = [&config](const YAML::Node& node) {
    config.requests.clear();
    config.limits.clear();
    if (node.IsNull()) return;
    for (const auto& entry : node) {
      const std::string kind = entry.first.as<std::string>();
      if (kind != "requests" && kind != "limits") {
        throw YAML::Exception(entry.first.Mark(), "only requests and limits");
      }
      auto& target = kind == "requests" ? config.requests : config.limits;
      if (entry.second.IsNull()) continue;
      for (const auto& quantity : entry.second) {
        target[quantity.first.as<std::string>()] = quantity.second.as<std::string>();
      }
    }
  };
  const std::map<std::string, std::function<void(const YAML::Node&)>> setters = {
      {"image", scalar(&config.image)},
      {"image_pull_policy", scalar(&config.image_pull_policy)},
      {"native_sidecar", scalar(&config.native_sidecar)},
      {"port", scalar(&config.port)},
      {"http_port", scalar(&config.http_port)},
      {"resources", resources},
      {"token_secret", scalar(&config.token_secret)},
      {"token_grace_seconds", scalar(&config.token_grace_seconds)},
      {"tls_secret", scalar(&config.tls_secret)},
      {"image_pull_secrets", strings(&config.image_pull_secrets)},
      {"allowed_logdirs", strings(&config.allowed_logdirs)},
      {"framework_profiler", scalar(&config.framework_profiler)},
      {"gpu_library", scalar(&config.gpu_library)},
      {"shm_size_limit", scalar(&config.shm_size_limit)},
      {"spool_size_limit", scalar(&config.spool_size_limit)},
      {"log_format", scalar(&config.log_format)},
      {"extra_args", strings(&config.extra_args)},
      {"recorder_level", scalar(&config.recorder_level)},
      {"recorder_window_ms", scalar(&config.recorder_window_ms)},
      {"recorder_max_bytes", scalar(&config.recorder_max_bytes)},
      {"start_realtime", scalar(&config.start_realtime)},
      {"env",
       [&config](const YAML::Node& node) {
         config.env.clear();
         if (node.IsNull()) return;
         if (!node.IsMap()) throw YAML::Exception(node.Mark(), "a map of names to values");
         for (const auto& entry : node) {
           config.env[entry.first.as<std::string>()] = entry.second.as<std::string>();
         }
       }},
  };
  for (const auto& entry : root) {
    const std::string key = entry.first.IsScalar() ? entry.first.Scalar() : "";
    auto setter = setters.find(key);
    if (setter == setters.end()) {
      std::string known;
      for (const auto& [name, unused] : setters) StrAppend(&known, known.empty() ? "" : ", ", name);
      return absl::InvalidArgumentError(StrCat("line ", entry.first.Mark().line + 1,
                                               ": unknown setting '", key, "' (known: ", known,
                                               ")"));
    }
    try {
      if (!entry.second.IsNull() || key == "resources" || key == "allowed_logdirs" ||
          key == "extra_args" || key == "env" || key == "image_pull_secrets") {
        setter->second(entry.second);
      }
    } catch (const YAML::Exception&) {
      return absl::InvalidArgumentError(StrCat("line ", entry.second.Mark().line + 1, ": setting '",
                                               key, "' has a value of the wrong type"));
    }
  }
  CLUSTERPROF_RETURN_IF_ERROR(ValidateInjectionConfig(config));
  return config;
}

absl::StatusOr<InjectionConfig> LoadInjectionConfig(const std::string& path) {
  std::string text;
  {
    std::ifstream file(path);
    if (!file) return absl::NotFoundError(StrCat("cannot read the injection config ", path));
    text.assign(std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>());
  }
  absl::StatusOr<InjectionConfig> config = ParseInjectionConfig(text);
  if (!config.ok()) {
    return absl::InvalidArgumentError(
        StrCat("injection config ", path, ": ", StdView(config.status().message())));
  }
  return config;
}

absl::Status ValidateInjectionConfig(const InjectionConfig& config) {
  if (config.recorder_level < 0 || config.recorder_level > 3) {
    return absl::InvalidArgumentError(
        StrCat("recorder_level ", config.recorder_level, " must be 0 (off) to 3"));
  }
  if (config.recorder_window_ms < 0 || config.recorder_window_ms > 3'600'000) {
    return absl::InvalidArgumentError(StrCat("recorder_window_ms ", config.recorder_window_ms,
                                             " must be 0 (keep none) to 3600000"));
  }
  if (config.recorder_max_bytes < (int64_t{1} << 20)) {
    return absl::InvalidArgumentError(
        StrCat("recorder_max_bytes ", config.recorder_max_bytes, " must be at least 1 MiB"));
  }
  if (!IsPort(config.port) || !IsPort(config.http_port) || config.port == config.http_port) {
    return absl::InvalidArgumentError(StrCat("port (", config.port, ") and http_port (",
                                             config.http_port,
                                             ") must be two different ports, 1-65535"));
  }
  static const std::set<std::string> kPullPolicies = {"Always", "IfNotPresent", "Never"};
  if (!kPullPolicies.contains(config.image_pull_policy)) {
    return absl::InvalidArgumentError(StrCat("image_pull_policy '", config.image_pull_policy,
                                             "' must be Always, IfNotPresent or Never"));
  }
  for (const auto* quantities : {&config.requests, &config.limits}) {
    for (const auto& [name, quantity] : *quantities) {
      if (name != "cpu" && name != "memory" && name != "ephemeral-storage") {
        return absl::InvalidArgumentError(
            StrCat("resources: '", name, "' must be cpu, memory or ephemeral-storage"));
      }
      if (!quantity.empty() && !IsQuantity(quantity)) {
        return absl::InvalidArgumentError(
            StrCat("resources: ", name, " '", quantity, "' is not a Kubernetes quantity"));
      }
    }
  }
  for (const auto& [name, quantity] : {std::pair{"shm_size_limit", &config.shm_size_limit},
                                       std::pair{"spool_size_limit", &config.spool_size_limit}}) {
    if (!quantity->empty() && !IsQuantity(*quantity)) {
      return absl::InvalidArgumentError(
          StrCat(name, " '", *quantity, "' is not a Kubernetes quantity"));
    }
  }
  static const std::regex kSecretName("[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?");
  for (const std::string& name : config.image_pull_secrets) {
    if (!std::regex_match(name, kSecretName)) {
      return absl::InvalidArgumentError(StrCat("image_pull_secrets: '", name,
                                               "' is not a Secret name (lower-case letters, "
                                               "digits, '-' and '.', at most 253)"));
    }
  }
  for (const auto& [key, name] : {std::pair{"token_secret", &config.token_secret},
                                  std::pair{"tls_secret", &config.tls_secret}}) {
    if (!name->empty() && !std::regex_match(*name, kSecretName)) {
      return absl::InvalidArgumentError(StrCat(key, " '", *name,
                                               "' is not a Secret name (lower-case letters, "
                                               "digits, '-' and '.', at most 253; \"\" for none)"));
    }
  }
  if (config.token_grace_seconds < 0) {
    return absl::InvalidArgumentError(
        StrCat("token_grace_seconds ", config.token_grace_seconds,
               " must be 0 or more: the seconds the previous token is still accepted after the "
               "token Secret changes (0: refused at once)"));
  }
  if (!config.gpu_library.empty() && config.gpu_library.front() != '/') {
    return absl::InvalidArgumentError(StrCat("gpu_library '", config.gpu_library,
                                             "' must be an absolute path in the sidecar image"));
  }
  if (!config.framework_profiler.empty() && !IsAddress(config.framework_profiler)) {
    return absl::InvalidArgumentError(
        StrCat("framework_profiler '", config.framework_profiler, "' is not host:port"));
  }
  if (config.log_format != "text" && config.log_format != "json") {
    return absl::InvalidArgumentError(
        StrCat("log_format '", config.log_format, "' must be text or json"));
  }
  for (const auto& [name, unused] : config.env) {
    if (name == "POD_NAME" || name == "POD_NAMESPACE" || name == shm::kDirEnv) {
      return absl::InvalidArgumentError(
          StrCat("env: '", name, "' is set by the injection itself and cannot be overridden"));
    }
    const bool valid =
        !name.empty() && (std::isalpha(static_cast<unsigned char>(name[0])) || name[0] == '_') &&
        std::all_of(name.begin(), name.end(),
                    [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; });
    if (!valid) {
      return absl::InvalidArgumentError(
          StrCat("env: '", name, "' is not an environment variable name (letters, digits, _)"));
    }
  }
  return absl::OkStatus();
}

std::optional<int> KubernetesMinorVersion(std::string_view version_json) {
  value version;
  try {
    version = value::parse(std::string(version_json));
  } catch (const web::json::json_exception&) {
    return std::nullopt;
  }
  std::string major = StringField(version, "major");
  std::string minor = StringField(version, "minor");
  if (major.empty() || minor.empty()) {
    // "v1.20.2", "v1.29.3-gke.1"
    const std::string git_version = StringField(version, "gitVersion");
    std::string_view git = git_version;
    if (!ConsumePrefix(&git, "v")) return std::nullopt;
    const std::vector<std::string_view> parts = SplitSkipEmpty(git, '.');
    if (parts.size() < 2) return std::nullopt;
    major = std::string(parts[0]);
    minor = std::string(parts[1]);
  }
  // "29+" from some providers.
  const size_t digits = minor.find_first_not_of("0123456789");
  if (digits == 0 || major != "1") return std::nullopt;
  return std::atoi(minor.substr(0, digits).c_str());
}

namespace {

// Whether the pod already runs a container under the sidecar's name.
bool HasSidecarContainer(const value& spec) {
  for (const char* field : {"initContainers", "containers"}) {
    for (const value& container : Containers(spec, field)) {
      if (StringField(container, "name") == kSidecarContainerName) return true;
    }
  }
  return false;
}

// The volumes the sidecar shares or reads (each kept when the pod has one of that name: the
// user's own) and the image pull secrets, added to `patch`.
void AddVolumes(const InjectionConfig& config, const value& spec, Patch& patch) {
  std::set<std::string> volumes;
  if (const value* existing = Field(spec, "volumes"); existing && existing->is_array()) {
    for (const value& volume : existing->as_array()) volumes.insert(StringField(volume, "name"));
  }
  std::vector<value> new_volumes;
  if (!volumes.contains(std::string(kShmVolumeName))) {
    new_volumes.push_back(Object(
        {{"name", Str(kShmVolumeName)}, {"emptyDir", EmptyDir("Memory", config.shm_size_limit)}}));
  }
  if (!volumes.contains(std::string(kSpoolVolumeName))) {
    new_volumes.push_back(Object(
        {{"name", Str(kSpoolVolumeName)}, {"emptyDir", EmptyDir("", config.spool_size_limit)}}));
  }
  if (!config.token_secret.empty() && !volumes.contains(std::string(kTokenVolumeName))) {
    new_volumes.push_back(Object({{"name", Str(kTokenVolumeName)},
                                  {"secret", Object({{"secretName", Str(config.token_secret)},
                                                     {"defaultMode", value::number(0444)},
                                                     {"optional", true}})}}));
  }
  // All of the Secret's keys (no `items`), readable by the sidecar's user (65532, whatever the
  // pod's fsGroup), and optional: a namespace without the Secret still starts its pods.
  if (!config.tls_secret.empty() && !volumes.contains(std::string(kTlsVolumeName))) {
    new_volumes.push_back(Object({{"name", Str(kTlsVolumeName)},
                                  {"secret", Object({{"secretName", Str(config.tls_secret)},
                                                     {"defaultMode", value::number(0444)},
                                                     {"optional", true}})}}));
  }
  for (value& volume : new_volumes) patch.Append(spec, "volumes", "/spec", std::move(volume));
  std::set<std::string> pull_secrets;
  if (const value* existing = Field(spec, "imagePullSecrets"); existing && existing->is_array()) {
    for (const value& secret : existing->as_array()) {
      pull_secrets.insert(StringField(secret, "name"));
    }
  }
  for (const std::string& name : config.image_pull_secrets) {
    if (pull_secrets.insert(name).second) {
      patch.Append(spec, "imagePullSecrets", "/spec", Object({{"name", Str(name)}}));
    }
  }
}

// Every container sees the shared directory; the GPU ones load the tracing library. A
// container that sets either variable itself keeps it, with a warning.
void PatchContainers(const value& spec, const PodSettings& settings, Patch& patch,
                     std::vector<std::string>* warnings) {
  const std::string library_path = StrCat(kShmDir, "/", kInjectionLibraryName);
  for (const char* field : {"initContainers", "containers"}) {
    const web::json::array& containers = Containers(spec, field);
    for (size_t i = 0; i < containers.size(); ++i) {
      const value& container = containers.at(i);
      const std::string path = StrCat("/spec/", field, "/", i);
      const std::string name = StringField(container, "name");
      if (!MountsAt(container, kShmDir)) {
        patch.Append(container, "volumeMounts", path,
                     Object({{"name", Str(kShmVolumeName)}, {"mountPath", Str(kShmDir)}}));
      }
      if (const value* env = FindEnv(container, shm::kDirEnv); env == nullptr) {
        patch.Append(container, "env", path, EnvVar(shm::kDirEnv, kShmDir));
      } else if (StringField(*env, "value") != kShmDir) {
        warnings->push_back(StrCat("clusterprof: container ", name,
                                   " sets CLUSTERPROF_DIR itself; its annotations reach "
                                   "the sidecar only if that is ",
                                   kShmDir));
      }
      if (settings.gpu && RequestsGpu(container)) {
        if (const value* env = FindEnv(container, "CUDA_INJECTION64_PATH"); env == nullptr) {
          patch.Append(container, "env", path, EnvVar("CUDA_INJECTION64_PATH", library_path));
        } else {
          warnings->push_back(StrCat("clusterprof: container ", name,
                                     " sets CUDA_INJECTION64_PATH itself; its GPU activity "
                                     "is not traced"));
        }
      }
    }
  }
}

}  // namespace

absl::StatusOr<InjectionResult> Inject(const InjectionConfig& config, std::string_view pod_json) {
  value pod;
  try {
    pod = value::parse(std::string(pod_json));
  } catch (const web::json::json_exception& e) {
    return absl::InvalidArgumentError(StrCat("the pod is not valid JSON: ", e.what()));
  }
  const value* spec = Field(pod, "spec");
  if (spec == nullptr || !spec->is_object()) {
    return absl::InvalidArgumentError("the object has no pod spec");
  }
  static const value kNoMetadata = value::object();
  const value& metadata = Field(pod, "metadata") != nullptr ? *Field(pod, "metadata") : kNoMetadata;
  const value* labels = Field(metadata, "labels");

  InjectionResult result;
  if (MapString(labels, kInjectedLabel) == "true" || HasSidecarContainer(*spec)) {
    result.outcome = "already-injected";
    return result;
  }
  if (MapString(labels, kInjectLabel) == "false") {
    result.outcome = "opted-out";
    return result;
  }
  PodSettings settings;
  if (absl::Status status = ReadPodSettings(config, pod, &settings); !status.ok()) {
    result.outcome = "invalid";
    result.warnings.push_back(
        StrCat("clusterprof: sidecar not injected: ", StdView(status.message())));
    return result;
  }
  // In the node's network the sidecar's ports are the node's: two such pods on one node, or
  // anything else of the node on 8466, would collide. Only a port the user chose is used there.
  const value* host_network = Field(*spec, "hostNetwork");
  const value* annotations = Field(metadata, "annotations");
  if (host_network != nullptr && host_network->is_boolean() && host_network->as_bool() &&
      !HasMapKey(annotations, kPortAnnotation)) {
    result.outcome = "host-network";
    result.warnings.push_back(StrCat(
        "clusterprof: sidecar not injected: the pod uses hostNetwork, where the sidecar's ports (",
        config.port, ", ", config.http_port, ") would be the node's; set the annotation ",
        kPortAnnotation,
        " to a port free on the node (the next one is taken too) to inject it there"));
    return result;
  }
  for (const char* field : {"initContainers", "containers"}) {
    for (const value& container : Containers(*spec, field)) {
      if (RequestsGpu(container)) settings.gpu = true;
    }
  }
  settings.gpu = settings.gpu && !config.gpu_library.empty();

  Patch patch;
  patch.SetMapEntry(metadata, "labels", "/metadata", kInjectedLabel, "true");
  AddVolumes(config, *spec, patch);
  PatchContainers(*spec, settings, patch, &result.warnings);
  // Last, as inserting at the front of initContainers moves the indices used above.
  if (config.native_sidecar) {
    patch.Prepend(*spec, "initContainers", "/spec", SidecarContainer(config, settings));
  } else {
    patch.Append(*spec, "containers", "/spec", SidecarContainer(config, settings));
  }
  result.patch = patch.Serialize();
  result.outcome = "injected";
  return result;
}

absl::StatusOr<ReviewAnswer> Review(const InjectionConfig& config, std::string_view review_json) {
  value review;
  try {
    review = value::parse(std::string(review_json));
  } catch (const web::json::json_exception& e) {
    return absl::InvalidArgumentError(StrCat("the body is not JSON: ", e.what()));
  }
  const std::string api_version = StringField(review, "apiVersion");
  if (StringField(review, "kind") != "AdmissionReview" || api_version != "admission.k8s.io/v1") {
    return absl::InvalidArgumentError(
        StrCat("expected an AdmissionReview of admission.k8s.io/v1, got kind '",
               StringField(review, "kind"), "' of '", api_version,
               "' (the MutatingWebhookConfiguration must list admissionReviewVersions: [v1])"));
  }
  const value* request = Field(review, "request");
  if (request == nullptr || !request->is_object() || StringField(*request, "uid").empty()) {
    return absl::InvalidArgumentError("the AdmissionReview has no request with a uid");
  }
  ReviewAnswer answer;
  const value* object = Field(*request, "object");
  const value* kind = Field(*request, "kind");
  const std::string namespace_ = StringField(*request, "namespace");
  std::string name = StringField(*request, "name");
  if (object != nullptr && Field(*object, "metadata") != nullptr) {
    const value& metadata = *Field(*object, "metadata");
    if (name.empty()) name = StringField(metadata, "name");
    if (name.empty()) name = StrCat(StringField(metadata, "generateName"), "*");
  }
  answer.pod = StrCat(namespace_, "/", name);

  value response = Object({{"uid", Str(StringField(*request, "uid"))}, {"allowed", true}});
  const bool is_pod_create = kind != nullptr && StringField(*kind, "kind") == "Pod" &&
                             StringField(*kind, "group").empty() &&
                             StringField(*request, "operation") == "CREATE" && object != nullptr;
  if (!is_pod_create) {
    answer.result.outcome = "ignored";
  } else {
    absl::StatusOr<InjectionResult> result = Inject(config, object->serialize());
    if (result.ok()) {
      answer.result = *std::move(result);
    } else {
      answer.result.outcome = "invalid";
      answer.result.warnings.push_back(
          StrCat("clusterprof: sidecar not injected: ", StdView(result.status().message())));
    }
  }
  if (!answer.result.patch.empty()) {
    response["patchType"] = Str("JSONPatch");
    response["patch"] = Str(StdView(absl::Base64Escape(answer.result.patch)));
  }
  if (!answer.result.warnings.empty()) {
    std::vector<value> warnings;
    for (const std::string& warning : answer.result.warnings) warnings.push_back(Str(warning));
    response["warnings"] = Array(warnings);
  }
  answer.body = Object({{"apiVersion", Str("admission.k8s.io/v1")},
                        {"kind", Str("AdmissionReview")},
                        {"response", response}})
                    .serialize();
  return answer;
}

}  // namespace clusterprof::webhook
