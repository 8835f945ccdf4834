#include "sidecar/config.h"

#include <yaml-cpp/yaml.h>

#include <cstdlib>
#include <functional>
#include <map>

#include "common/base/strings.h"

namespace clusterprof::sidecar {

absl::Status LoadSidecarConfigFile(const std::string& path, SidecarConfig* config) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::BadFile&) {
    return absl::NotFoundError(StrCat("cannot read the config file ", path));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        StrCat("config file ", path, " is not valid YAML: ", e.what()));
  }
  if (root.IsNull()) return absl::OkStatus();  // an empty file sets nothing
  if (!root.IsMap()) {
    return absl::InvalidArgumentError(
        StrCat("config file ", path, " must be a YAML mapping of setting: value"));
  }
  SidecarConfig& c = *config;
  auto scalar = [](auto* field) {
    return [field](const YAML::Node& node) {
      *field = node.as<std::remove_pointer_t<decltype(field)>>();
    };
  };
  const std::map<std::string, std::function<void(const YAML::Node&)>> setters = {
      {"address", scalar(&c.address)},
      {"port", scalar(&c.port)},
      {"http_port", scalar(&c.http_port)},
      {"host_name", scalar(&c.host_name)},
      {"allowed_logdirs",
       [&c](const YAML::Node& node) {
         c.allowed_logdirs = node.IsSequence() ? node.as<std::vector<std::string>>()
                                               : std::vector<std::string>{node.as<std::string>()};
       }},
      {"shm_dir", scalar(&c.shm_dir)},
      {"max_duration_ms", scalar(&c.max_duration_ms)},
      {"max_profile_calls", scalar(&c.max_profile_calls)},
      {"max_events", scalar(&c.max_events)},
      {"recorder_level", scalar(&c.recorder_level)},
      {"recorder_window_ms", scalar(&c.recorder_window_ms)},
      {"recorder_max_bytes", scalar(&c.recorder_max_bytes)},
      {"step_pattern", scalar(&c.step_pattern)},
      {"collective_pattern", scalar(&c.collective_pattern)},
      {"log_format", scalar(&c.log_format)},
      {"log_level", scalar(&c.log_level)},
      {"port_file", scalar(&c.port_file)},
      {"spool_dir", scalar(&c.spool_dir)},
      {"spool_max_bytes", scalar(&c.spool_max_bytes)},
      {"upload_wait_ms", scalar(&c.upload_wait_ms)},
      {"gpu", scalar(&c.gpu)},
      {"gpu_flush_timeout_ms", scalar(&c.gpu_flush_timeout_ms)},
      {"nvml_library", scalar(&c.nvml_library)},
      {"framework_profiler", scalar(&c.framework_profiler)},
      {"framework_grace_ms", scalar(&c.framework_grace_ms)},
      {"auth_token_file", scalar(&c.auth_token_file)},
      {"allow_loopback_without_token", scalar(&c.allow_loopback_without_token)},
      {"token_grace_seconds", scalar(&c.token_grace_seconds)},
      {"tls_cert_file", scalar(&c.tls_cert_file)},
      {"tls_key_file", scalar(&c.tls_key_file)},
      {"handshake_timeout_ms", scalar(&c.handshake_timeout_ms)},
      {"max_connections_per_peer", scalar(&c.max_connections_per_peer)},
      {"max_connections", scalar(&c.max_connections)},
      {"install_injection_library", scalar(&c.install_injection_library)},
      {"start_realtime", scalar(&c.start_realtime)},
      {"start_spin_us", scalar(&c.start_spin_us)},
  };
  for (const auto& entry : root) {
    if (!entry.first.IsScalar()) {
      return absl::InvalidArgumentError(StrCat("config file ", path, ": line ",
                                               entry.first.Mark().line + 1,
                                               ": a key must be a setting name, not a list or "
                                               "mapping"));
    }
    const std::string key = entry.first.Scalar();
    auto setter = setters.find(key);
    if (setter == setters.end()) {
      std::string known;
      for (const auto& [name, unused] : setters) StrAppend(&known, known.empty() ? "" : ", ", name);
      return absl::InvalidArgumentError(
          StrCat("config file ", path, ": unknown setting '", key, "' (known: ", known, ")"));
    }
    try {
      setter->second(entry.second);
    } catch (const YAML::Exception&) {
      return absl::InvalidArgumentError(StrCat("config file ", path, ": setting '", key,
                                               "' has a value of the wrong type (line ",
                                               entry.second.Mark().line + 1, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace clusterprof::sidecar
