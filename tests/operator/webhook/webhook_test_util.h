// Helpers for the webhook's tests: YAML manifests as JSON (the API server's view of them), an
// RFC 6902 JSON Patch applier for the webhook's "add" operations, and lookups in a pod.
#ifndef CLUSTERPROF_TESTS_OPERATOR_WEBHOOK_WEBHOOK_TEST_UTIL_H_
#define CLUSTERPROF_TESTS_OPERATOR_WEBHOOK_WEBHOOK_TEST_UTIL_H_

#include <yaml-cpp/yaml.h>

#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpprest/json.h"

namespace clusterprof::testing {

// Plain scalars that read as integers or booleans become JSON numbers and booleans (as the API
// server reads them); quoted ones stay strings.
inline web::json::value YamlToJson(const YAML::Node& node) {
  using web::json::value;
  switch (node.Type()) {
    case YAML::NodeType::Map: {
      value object = value::object(true);
      for (const auto& entry : node) object[entry.first.Scalar()] = YamlToJson(entry.second);
      return object;
    }
    case YAML::NodeType::Sequence: {
      value array = value::array(node.size());
      for (size_t i = 0; i < node.size(); ++i) array[i] = YamlToJson(node[i]);
      return array;
    }
    case YAML::NodeType::Scalar: {
      const std::string& text = node.Scalar();
      if (node.Tag() == "?") {
        if (text == "true" || text == "false") return value::boolean(text == "true");
        if (!text.empty() && text.find_first_not_of("0123456789-") == std::string::npos) {
          return value::number(static_cast<int64_t>(std::stoll(text)));
        }
      }
      return value::string(text);
    }
    default:
      return value::null();
  }
}

inline web::json::value LoadYamlAsJson(const std::string& path) {
  return YamlToJson(YAML::LoadFile(path));
}

// The pod an example describes: a Pod as it is, or a workload's pod template as a Pod.
inline web::json::value ExamplePod(const std::string& path) {
  web::json::value object = LoadYamlAsJson(path);
  if (object.at("kind").as_string() == "Pod") return object;
  web::json::value pod = web::json::value::object(true);
  pod["apiVersion"] = web::json::value::string("v1");
  pod["kind"] = web::json::value::string("Pod");
  const web::json::value& tmpl = object.at("spec").at("template");
  pod["metadata"] = tmpl.has_field("metadata") ? tmpl.at("metadata") : web::json::value::object();
  pod["metadata"]["generateName"] =
      web::json::value::string(object.at("metadata").at("name").as_string() + "-");
  pod["spec"] = tmpl.at("spec");
  return pod;
}

inline std::string Unescape(std::string token) {
  std::string out;
  for (size_t i = 0; i < token.size(); ++i) {
    if (token[i] == '~' && i + 1 < token.size()) {
      out += token[i + 1] == '1' ? '/' : '~';
      ++i;
    } else {
      out += token[i];
    }
  }
  return out;
}

// Applies a JSON Patch of "add" operations (all the webhook makes); throws on anything else, on a
// missing parent, or on an add that would replace an existing member.
inline web::json::value ApplyPatch(web::json::value document, const std::string& patch_text) {
  const web::json::value patch = web::json::value::parse(patch_text);
  for (const web::json::value& op : patch.as_array()) {
    if (op.at("op").as_string() != "add") throw std::runtime_error("not an add: " + op.serialize());
    const std::string path = op.at("path").as_string();
    std::vector<std::string> tokens;
    std::stringstream stream(path.substr(1));
    for (std::string token; std::getline(stream, token, '/');) tokens.push_back(Unescape(token));
    web::json::value* target = &document;
    for (size_t i = 0; i + 1 < tokens.size(); ++i) {
      if (target->is_array()) {
        target = &target->as_array().at(std::stoul(tokens[i]));
      } else {
        if (!target->has_field(tokens[i])) throw std::runtime_error("no parent for " + path);
        target = &target->at(tokens[i]);
      }
    }
    const std::string& last = tokens.back();
    if (target->is_array()) {
      const size_t size = target->size();
      const size_t index = last == "-" ? size : std::stoul(last);
      if (index > size) throw std::runtime_error("index out of range: " + path);
      web::json::value grown = web::json::value::array(size + 1);
      for (size_t i = 0, j = 0; i <= size; ++i) {
        grown[i] = i == index ? op.at("value") : target->at(j++);
      }
      *target = grown;
    } else if (target->is_object()) {
      if (target->has_field(last)) throw std::runtime_error("add over a member: " + path);
      (*target)[last] = op.at("value");
    } else {
      throw std::runtime_error("parent is not a container: " + path);
    }
  }
  return document;
}

// The container (or init container) named `name`, or null.
inline const web::json::value* FindContainer(const web::json::value& pod, const std::string& name,
                                             const char* field = nullptr) {
  for (const char* kind : {"initContainers", "containers"}) {
    if (field != nullptr && std::string(field) != kind) continue;
    if (!pod.at("spec").has_field(kind)) continue;
    for (const web::json::value& container : pod.at("spec").at(kind).as_array()) {
      if (container.at("name").as_string() == name) return &container;
    }
  }
  return nullptr;
}

// The value of env variable `name` in `container`, or "<unset>".
inline std::string EnvValue(const web::json::value& container, const std::string& name) {
  if (!container.has_field("env")) return "<unset>";
  for (const web::json::value& env : container.at("env").as_array()) {
    if (env.at("name").as_string() == name) {
      return env.has_field("value") ? env.at("value").as_string() : "<valueFrom>";
    }
  }
  return "<unset>";
}

inline bool MountsShm(const web::json::value& container) {
  if (!container.has_field("volumeMounts")) return false;
  for (const web::json::value& mount : container.at("volumeMounts").as_array()) {
    if (mount.at("mountPath").as_string() == "/var/run/clusterprof" &&
        mount.at("name").as_string() == "clusterprof-shm") {
      return true;
    }
  }
  return false;
}

inline std::vector<std::string> Args(const web::json::value& container) {
  std::vector<std::string> args;
  if (!container.has_field("args")) return args;
  for (const web::json::value& arg : container.at("args").as_array()) {
    args.push_back(arg.as_string());
  }
  return args;
}

}  // namespace clusterprof::testing

#endif  // CLUSTERPROF_TESTS_OPERATOR_WEBHOOK_WEBHOOK_TEST_UTIL_H_
