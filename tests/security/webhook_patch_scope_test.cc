// The admission webhook changes only what docs/webhook.md documents (docs/security.md, "The
// webhook"). The documented set is read from that page's table "What a pod gets": the sidecar
// container, the volumes (their kind, where they are mounted and in which containers), the
// environment variables (in which containers), the pod label and imagePullSecrets. Then the
// webhook answers AdmissionReviews for representative pods (the examples, a real AdmissionReview,
// a pod with every field a workload may set, a bare pod, a hostNetwork pod) under several
// injection settings, and every operation of every patch must be an "add" at a documented path
// with a documented value; applied, the patch leaves every other field of the pod, and of each
// of its containers, as it was.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "common/base/strings.h"
#include "operator/webhook/injection.h"
#include "tests/operator/webhook/webhook_test_util.h"

namespace clusterprof::webhook {
namespace {

using web::json::value;

std::string SourcePath(const std::string& relative) {
  return StrCat(CLUSTERPROF_SOURCE_DIR, "/", relative);
}

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream out;
  out << in.rdbuf();
  return out.str();
}

// Where a documented volume or variable goes.
enum class Scope { kEveryContainer, kGpuContainers, kSidecarOnly };

struct DocumentedVolume {
  std::string kind;  // "emptyDir" or "secret"
  std::string mount_path;
  Scope scope = Scope::kSidecarOnly;
};

struct DocumentedEnv {
  std::string value;
  Scope scope = Scope::kEveryContainer;
};

// docs/webhook.md's table "What a pod gets", read as the set of allowed changes.
struct Documented {
  std::string sidecar_name;
  bool native_as_first_init_container = false;
  bool regular_as_last_container = false;
  std::map<std::string, DocumentedVolume> volumes;
  std::map<std::string, DocumentedEnv> env;
  std::map<std::string, std::string> labels;
  bool image_pull_secrets = false;
  std::vector<std::string> rows;  // as written, for messages
};

std::string FirstQuoted(const std::string& text) {
  const size_t open = text.find('`');
  const size_t close = open == std::string::npos ? open : text.find('`', open + 1);
  return close == std::string::npos ? "" : text.substr(open + 1, close - open - 1);
}

// The first `...` span of `text` that is an absolute path.
std::string FirstQuotedPath(const std::string& text) {
  static const std::regex kPath("`(/[^`]*)`");
  std::smatch match;
  return std::regex_search(text, match, kPath) ? match[1].str() : "";
}

Documented ReadDocumented() {
  Documented out;
  std::ifstream in(SourcePath("docs/webhook.md"));
  bool in_section = false;
  for (std::string line; std::getline(in, line);) {
    if (StartsWith(line, "## ")) {
      in_section = line == "## What a pod gets";
      continue;
    }
    if (!in_section || !StartsWith(line, "|") || StartsWith(line, "|---") ||
        StartsWith(line, "| what |")) {
      continue;
    }
    std::vector<std::string> cells;
    std::stringstream row(line.substr(1));
    for (std::string cell; std::getline(row, cell, '|');) {
      cells.push_back(std::string(StripAsciiWhitespace(cell)));
    }
    if (cells.size() < 2) continue;
    out.rows.push_back(line);
    const std::string& what = cells[0];
    const std::string& where = cells[1];
    const std::string name = FirstQuoted(what);
    if (StartsWith(what, "container ")) {
      out.sidecar_name = name;
      out.native_as_first_init_container = where.find("first init container") != std::string::npos;
      out.regular_as_last_container = where.find("last container") != std::string::npos;
    } else if (StartsWith(what, "volume ")) {
      DocumentedVolume volume;
      volume.kind = where.find("emptyDir") != std::string::npos ? "emptyDir"
                    : where.find("Secret") != std::string::npos ? "secret"
                                                                : "undocumented kind";
      volume.mount_path = FirstQuotedPath(where);
      volume.scope = where.find("every container") != std::string::npos ? Scope::kEveryContainer
                                                                        : Scope::kSidecarOnly;
      out.volumes[name] = volume;
    } else if (StartsWith(what, "env ")) {
      DocumentedEnv env;
      const size_t equals = name.find('=');
      env.value = name.substr(equals + 1);
      env.scope = where.find("every container") != std::string::npos  ? Scope::kEveryContainer
                  : where.find("nvidia.com/gpu") != std::string::npos ? Scope::kGpuContainers
                                                                      : Scope::kSidecarOnly;
      out.env[name.substr(0, equals)] = env;
    } else if (StartsWith(what, "label ")) {
      const size_t colon = name.find(": ");
      std::string label_value = name.substr(colon + 2);
      label_value.erase(std::remove(label_value.begin(), label_value.end(), '"'),
                        label_value.end());
      out.labels[name.substr(0, colon)] = label_value;
    } else if (name == "imagePullSecrets") {
      out.image_pull_secrets = true;
    }
  }
  return out;
}

// A JSON value as text with the members of every object sorted, so that two values compare
// equal whatever order their members were written in.
std::string Canonical(const value& v) {
  if (v.is_object()) {
    std::vector<std::pair<std::string, std::string>> members;
    for (const auto& [key, member] : v.as_object()) members.emplace_back(key, Canonical(member));
    std::sort(members.begin(), members.end());
    std::string out = "{";
    for (const auto& [key, member] : members) {
      StrAppend(&out, out.size() > 1 ? "," : "", value::string(key).serialize(), ":", member);
    }
    return out + "}";
  }
  if (v.is_array()) {
    std::string out = "[";
    for (size_t i = 0; i < v.size(); ++i) StrAppend(&out, i > 0 ? "," : "", Canonical(v.at(i)));
    return out + "]";
  }
  return v.serialize();
}

const value* Member(const value& object, const std::string& name) {
  return object.is_object() && object.has_field(name) ? &object.at(name) : nullptr;
}

const web::json::array& Items(const value& object, const std::string& name) {
  static const value kEmpty = value::array();
  const value* array = Member(object, name);
  return array != nullptr && array->is_array() ? array->as_array() : kEmpty.as_array();
}

bool RequestsGpu(const value& container) {
  const value* resources = Member(container, "resources");
  if (resources == nullptr) return false;
  for (const char* kind : {"limits", "requests"}) {
    const value* quantities = Member(*resources, kind);
    const value* gpus = quantities != nullptr ? Member(*quantities, "nvidia.com/gpu") : nullptr;
    if (gpus != nullptr && Canonical(*gpus) != "\"0\"" && Canonical(*gpus) != "0") return true;
  }
  return false;
}

std::vector<std::string> PointerTokens(const std::string& path) {
  std::vector<std::string> tokens;
  std::stringstream stream(path.substr(1));
  for (std::string token; std::getline(stream, token, '/');) {
    tokens.push_back(testing::Unescape(token));
  }
  return tokens;
}

// The items an "add" puts in a list: the whole new list, or the one item appended.
std::vector<value> AddedItems(bool whole_list, const value& v) {
  std::vector<value> items;
  if (!whole_list) return {v};
  for (const value& item : v.as_array()) items.push_back(item);
  return items;
}

bool IsIndex(const std::string& token) {
  return !token.empty() && std::all_of(token.begin(), token.end(), ::isdigit);
}

// A pod and the settings it is injected with.
struct Scenario {
  std::string name;
  value pod;
  InjectionConfig config;
};

class WebhookPatchScopeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { documented_ = new Documented(ReadDocumented()); }
  static void TearDownTestSuite() {
    delete documented_;
    documented_ = nullptr;
  }

  // The injection settings the chart can give: the defaults; regular containers; a token, TLS,
  // pull secrets, real-time start, more sidecar flags and environment; no GPU library.
  static std::vector<std::pair<std::string, InjectionConfig>> Configs() {
    std::vector<std::pair<std::string, InjectionConfig>> configs;
    configs.emplace_back("defaults", InjectionConfig{});
    InjectionConfig regular;
    regular.native_sidecar = false;
    configs.emplace_back("regular container", regular);
    InjectionConfig everything;
    everything.token_secret = "clusterprof-sidecar-token";
    everything.tls_secret = "clusterprof-sidecar-tls";
    everything.image_pull_secrets = {"registry-a", "registry-b"};
    everything.start_realtime = true;
    everything.allowed_logdirs = {"gs://team-bucket/tb"};
    everything.framework_profiler = "localhost:9012";
    everything.extra_args = {"--log-level=debug"};
    everything.env = {{"HTTPS_PROXY", "http://proxy:3128"}};
    configs.emplace_back("token, TLS, pull secrets, real time, flags, env", everything);
    InjectionConfig everything_regular = everything;
    everything_regular.native_sidecar = false;
    configs.emplace_back("the same as a regular container", everything_regular);
    InjectionConfig no_gpu_library;
    no_gpu_library.gpu_library = "";
    configs.emplace_back("no GPU library", no_gpu_library);
    return configs;
  }

  // Pods a workload may bring.
  static std::vector<std::pair<std::string, value>> Pods() {
    std::vector<std::pair<std::string, value>> pods;
    for (const char* example :
         {"examples/injection/gpu-pod.yaml", "examples/injection/gpu-job.yaml",
          "examples/injection/tpu-jax-pod.yaml"}) {
      pods.emplace_back(example, testing::ExamplePod(SourcePath(example)));
    }
    pods.emplace_back(
        "the AdmissionReview in tests/data/webhook",
        value::parse(ReadText(SourcePath("tests/data/webhook/admission-review-job-pod.json")))
            .at("request")
            .at("object"));
    pods.emplace_back("a pod with every field a workload may set", value::parse(R"({
      "apiVersion": "v1", "kind": "Pod",
      "metadata": {"name": "full", "namespace": "training", "uid": "u-1",
                   "labels": {"app": "trainer", "clusterprof.io/inject": "true", "a/b~c": "d"},
                   "annotations": {"clusterprof.io/port": "9000",
                                   "clusterprof.io/framework-profiler": "localhost:9999",
                                   "clusterprof.io/sidecar-cpu-limit": "2",
                                   "team.example/owner": "ml"},
                   "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "j",
                                        "uid": "u-0", "controller": true}]},
      "spec": {
        "serviceAccountName": "llama-trainer",
        "automountServiceAccountToken": false,
        "securityContext": {"runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 2000,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "hostIPC": false, "hostPID": false, "shareProcessNamespace": true,
        "nodeSelector": {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
          "nodeSelectorTerms": [{"matchExpressions": [{"key": "pool", "operator": "In",
                                                         "values": ["gpu"]}]}]}}},
        "priorityClassName": "training", "runtimeClassName": "nvidia",
        "dnsPolicy": "ClusterFirst", "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 30,
        "imagePullSecrets": [{"name": "registry-a"}],
        "volumes": [
          {"name": "data", "hostPath": {"path": "/mnt/data", "type": "Directory"}},
          {"name": "config", "configMap": {"name": "trainer-config"}},
          {"name": "creds", "secret": {"secretName": "bucket-creds"}}],
        "initContainers": [
          {"name": "fetch", "image": "busybox:1.36", "command": ["sh", "-c", "true"],
           "env": [{"name": "SOURCE", "value": "gs://data"}],
           "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
        "containers": [
          {"name": "trainer", "image": "pytorch:2.3", "command": ["python", "train.py"],
           "args": ["--steps", "1000"], "workingDir": "/work",
           "env": [{"name": "NCCL_DEBUG", "value": "WARN"},
                   {"name": "KEY", "valueFrom": {"secretKeyRef": {"name": "creds",
                                                                  "key": "key"}}}],
           "envFrom": [{"configMapRef": {"name": "trainer-env"}}],
           "ports": [{"name": "tb", "containerPort": 6006}],
           "resources": {"limits": {"nvidia.com/gpu": "2", "memory": "64Gi"},
                         "requests": {"cpu": "8"}},
           "volumeMounts": [{"name": "data", "mountPath": "/data", "readOnly": true},
                            {"name": "creds", "mountPath": "/creds"}],
           "securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}},
           "livenessProbe": {"exec": {"command": ["true"]}},
           "stdin": false, "tty": false},
          {"name": "exporter", "image": "statsd-exporter:0.26",
           "env": [{"name": "CLUSTERPROF_DIR", "value": "/elsewhere"}],
           "securityContext": {"readOnlyRootFilesystem": true}}]}})"));
    pods.emplace_back("a bare pod", value::parse(R"({"apiVersion": "v1", "kind": "Pod",
      "metadata": {"name": "bare"},
      "spec": {"containers": [{"name": "main", "image": "busybox"}]}})"));
    pods.emplace_back("a hostNetwork pod that chose its port", value::parse(R"({
      "apiVersion": "v1", "kind": "Pod",
      "metadata": {"name": "hostnet", "annotations": {"clusterprof.io/port": "18466"}},
      "spec": {"hostNetwork": true,
               "containers": [{"name": "main", "image": "busybox",
                               "resources": {"limits": {"nvidia.com/gpu": 1}}}]}})"));
    return pods;
  }

  static std::vector<Scenario> Scenarios() {
    std::vector<Scenario> scenarios;
    for (const auto& [pod_name, pod] : Pods()) {
      for (const auto& [config_name, config] : Configs()) {
        scenarios.push_back({StrCat(pod_name, ", ", config_name), pod, config});
      }
    }
    return scenarios;
  }

  // The patch the webhook answers an AdmissionReview of `pod` with, as the API server reads it.
  static std::string PatchFor(const Scenario& scenario) {
    value review = value::object();
    review["apiVersion"] = value::string("admission.k8s.io/v1");
    review["kind"] = value::string("AdmissionReview");
    review["request"]["uid"] = value::string("7d0e6c1a-0000-4000-8000-000000000001");
    review["request"]["kind"]["group"] = value::string("");
    review["request"]["kind"]["version"] = value::string("v1");
    review["request"]["kind"]["kind"] = value::string("Pod");
    review["request"]["resource"]["resource"] = value::string("pods");
    review["request"]["namespace"] = value::string("training");
    review["request"]["operation"] = value::string("CREATE");
    review["request"]["object"] = scenario.pod;
    absl::StatusOr<ReviewAnswer> answer = Review(scenario.config, review.serialize());
    EXPECT_TRUE(answer.ok()) << answer.status();
    if (!answer.ok()) return "";
    EXPECT_EQ(answer->result.outcome, "injected")
        << ::testing::PrintToString(answer->result.warnings);
    const value response = value::parse(answer->body).at("response");
    EXPECT_TRUE(response.at("allowed").as_bool());
    if (!response.has_field("patch")) return "";
    EXPECT_EQ(response.at("patchType").as_string(), "JSONPatch");
    std::string patch;
    EXPECT_TRUE(absl::Base64Unescape(response.at("patch").as_string(), &patch));
    return patch;
  }

  // Why `op` (an operation of the patch for `pod`) is outside the documented set; "" when it is
  // documented.
  static std::string Undocumented(const value& op, const value& pod,
                                  const InjectionConfig& config) {
    const Documented& docs = *documented_;
    if (op.at("op").as_string() != "add") return "only \"add\" is documented";
    const std::string path = op.at("path").as_string();
    const value& v = op.at("value");
    const std::vector<std::string> t = PointerTokens(path);

    // The pod's label.
    if (t.size() == 3 && t[0] == "metadata" && t[1] == "labels") {
      auto it = docs.labels.find(t[2]);
      return it != docs.labels.end() && v.is_string() && v.as_string() == it->second
                 ? ""
                 : "not a documented label";
    }
    if (t.size() == 2 && t[0] == "metadata" && t[1] == "labels") {
      if (Member(pod.at("metadata"), "labels") != nullptr) return "replaces the pod's labels";
      for (const auto& [key, label] : v.as_object()) {
        auto it = docs.labels.find(key);
        if (it == docs.labels.end() || !label.is_string() || label.as_string() != it->second) {
          return StrCat("label ", key, " is not documented");
        }
      }
      return "";
    }
    if (t.empty() || t[0] != "spec") return "outside metadata.labels and spec";

    // Volumes: documented names of the documented kind; a Secret only the configured one,
    // optional.
    if ((t.size() == 2 || (t.size() == 3 && t[2] == "-")) && t[1] == "volumes") {
      if (t.size() == 2 && Items(pod.at("spec"), "volumes").size() > 0) {
        return "replaces the pod's volumes";
      }
      for (const value& volume : AddedItems(t.size() == 2, v)) {
        const std::string name = volume.at("name").as_string();
        auto it = docs.volumes.find(name);
        if (it == docs.volumes.end()) return StrCat("volume ", name, " is not documented");
        size_t sources = 0;
        for (const auto& [field, unused] : volume.as_object()) sources += field != "name";
        if (sources != 1 || !volume.has_field(it->second.kind)) {
          return StrCat("volume ", name, " is not only a ", it->second.kind);
        }
        if (it->second.kind == "secret") {
          const value& secret = volume.at("secret");
          if (!secret.has_field("optional") || !secret.at("optional").as_bool() ||
              secret.has_field("items")) {
            return StrCat("volume ", name, " is not a whole, optional Secret");
          }
          if (name == kTokenVolumeName &&
              secret.at("secretName").as_string() != config.token_secret) {
            return StrCat("volume ", name, " is not the configured token Secret");
          }
          if (name == kTlsVolumeName && secret.at("secretName").as_string() != config.tls_secret) {
            return StrCat("volume ", name, " is not the configured TLS Secret");
          }
        }
      }
      return "";
    }
    if ((t.size() == 2 || (t.size() == 3 && t[2] == "-")) && t[1] == "imagePullSecrets") {
      if (!docs.image_pull_secrets) return "imagePullSecrets are not documented";
      if (t.size() == 2 && Items(pod.at("spec"), "imagePullSecrets").size() > 0) {
        return "replaces the pod's imagePullSecrets";
      }
      for (const value& secret : AddedItems(t.size() == 2, v)) {
        const auto& names = config.image_pull_secrets;
        if (std::find(names.begin(), names.end(), secret.at("name").as_string()) == names.end()) {
          return "a pull secret the settings do not name";
        }
      }
      return "";
    }

    // The sidecar container itself.
    const bool whole_container_list = t.size() == 2 || (t.size() == 3 && !IsIndex(t[2])) ||
                                      (t.size() == 3 && t[1] == "initContainers" && t[2] == "0");
    if ((t[1] == "initContainers" || t[1] == "containers") && whole_container_list) {
      const bool native = t[1] == "initContainers";
      if (native && (!config.native_sidecar || !docs.native_as_first_init_container)) {
        return "an init container, undocumented for these settings";
      }
      if (!native && (config.native_sidecar || !docs.regular_as_last_container)) {
        return "a container, undocumented for these settings";
      }
      if (t.size() == 3 && t[2] != (native ? "0" : "-")) return "not where the sidecar goes";
      if (t.size() == 2 && Items(pod.at("spec"), t[1]).size() > 0) {
        return StrCat("replaces the pod's ", t[1]);
      }
      const value& sidecar = t.size() == 2 ? v.at(0) : v;
      if (t.size() == 2 && v.size() != 1) return "more than the sidecar";
      return sidecar.at("name").as_string() == docs.sidecar_name
                 ? ""
                 : "a container other than the sidecar";
    }

    // A variable or a mount in one of the pod's own containers.
    if ((t[1] == "initContainers" || t[1] == "containers") && t.size() >= 4 && IsIndex(t[2])) {
      const web::json::array& containers = Items(pod.at("spec"), t[1]);
      const size_t index = std::stoul(t[2]);
      if (index >= containers.size()) return "a container the pod does not have";
      const value& container = containers.at(index);
      if (t[3] != "env" && t[3] != "volumeMounts") return StrCat("changes the container's ", t[3]);
      const bool appends = t.size() == 5 && t[4] == "-";
      if (t.size() == 4 && Member(container, t[3]) != nullptr &&
          Items(container, t[3]).size() > 0) {
        return StrCat("replaces the container's ", t[3]);
      }
      if (t.size() != 4 && !appends) return "not an append";
      if (!appends && (!v.is_array() || v.size() != 1)) return "not one item in a new list";
      const value& item = appends ? v : v.at(0);
      if (t[3] == "env") {
        const std::string name = item.at("name").as_string();
        auto it = docs.env.find(name);
        if (it == docs.env.end()) return StrCat("variable ", name, " is not documented");
        if (!item.has_field("value") || item.at("value").as_string() != it->second.value ||
            item.size() != 2) {
          return StrCat("variable ", name, " does not have its documented value");
        }
        if (it->second.scope == Scope::kSidecarOnly) return StrCat(name, " is the sidecar's only");
        if (it->second.scope == Scope::kGpuContainers && !RequestsGpu(container)) {
          return StrCat(name, " in a container that requests no GPU");
        }
        return "";
      }
      // A mount.
      const std::string name = item.at("name").as_string();
      auto it = docs.volumes.find(name);
      if (it == docs.volumes.end()) return StrCat("a mount of undocumented volume ", name);
      if (it->second.scope != Scope::kEveryContainer) {
        return StrCat("volume ", name, " is documented for the sidecar only");
      }
      if (item.at("mountPath").as_string() != it->second.mount_path || item.size() != 2) {
        return StrCat("volume ", name, " mounted other than documented");
      }
      return "";
    }
    return "an undocumented path";
  }

  static inline Documented* documented_ = nullptr;
};

TEST_F(WebhookPatchScopeTest, TheDocumentedSetIsReadFromDocsWebhookMd) {
  const Documented& docs = *documented_;
  EXPECT_EQ(docs.sidecar_name, "clusterprof-sidecar") << ::testing::PrintToString(docs.rows);
  EXPECT_TRUE(docs.native_as_first_init_container);
  EXPECT_TRUE(docs.regular_as_last_container);
  ASSERT_TRUE(docs.volumes.count("clusterprof-shm")) << ::testing::PrintToString(docs.rows);
  EXPECT_EQ(docs.volumes.at("clusterprof-shm").kind, "emptyDir");
  EXPECT_EQ(docs.volumes.at("clusterprof-shm").mount_path, "/var/run/clusterprof");
  EXPECT_EQ(docs.volumes.at("clusterprof-shm").scope, Scope::kEveryContainer);
  ASSERT_TRUE(docs.volumes.count("clusterprof-token"));
  EXPECT_EQ(docs.volumes.at("clusterprof-token").kind, "secret");
  EXPECT_EQ(docs.volumes.at("clusterprof-token").scope, Scope::kSidecarOnly);
  ASSERT_TRUE(docs.volumes.count("clusterprof-tls"));
  EXPECT_EQ(docs.volumes.at("clusterprof-tls").kind, "secret");
  EXPECT_EQ(docs.volumes.at("clusterprof-tls").mount_path, "/etc/clusterprof/tls");
  EXPECT_EQ(docs.volumes.at("clusterprof-tls").scope, Scope::kSidecarOnly);
  ASSERT_TRUE(docs.env.count("CUDA_INJECTION64_PATH"));
  EXPECT_EQ(docs.env.at("CUDA_INJECTION64_PATH").scope, Scope::kGpuContainers);
  EXPECT_EQ(docs.env.at("CLUSTERPROF_DIR").scope, Scope::kEveryContainer);
  EXPECT_EQ(docs.labels, (std::map<std::string, std::string>{{"clusterprof.io/injected", "true"}}));
  EXPECT_TRUE(docs.image_pull_secrets);
}

// The check itself: operations a webhook must not make are named as undocumented.
TEST_F(WebhookPatchScopeTest, TheCheckNamesOperationsOutsideTheDocumentedSet) {
  const value pod = value::parse(R"({"metadata": {"name": "p", "labels": {"app": "a"}},
    "spec": {"serviceAccountName": "sa", "volumes": [{"name": "v", "emptyDir": {}}],
             "containers": [{"name": "main", "image": "i", "env": [{"name": "A", "value": "1"}]},
                            {"name": "gpu", "image": "i",
                             "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}})");
  InjectionConfig config;
  config.token_secret = "clusterprof-sidecar-token";
  for (const char* op : {
           R"({"op": "replace", "path": "/spec/serviceAccountName", "value": "admin"})",
           R"({"op": "add", "path": "/spec/hostNetwork", "value": true})",
           R"({"op": "add", "path": "/spec/volumes/-",
               "value": {"name": "clusterprof-shm", "hostPath": {"path": "/"}}})",
           R"({"op": "add", "path": "/spec/volumes/-", "value": {"name": "x", "emptyDir": {}}})",
           R"({"op": "add", "path": "/spec/volumes/-", "value": {"name": "clusterprof-token",
               "secret": {"secretName": "other", "optional": true}}})",
           R"({"op": "add", "path": "/spec/volumes", "value": []})",
           R"({"op": "add", "path": "/spec/containers/0/env/-",
               "value": {"name": "CUDA_INJECTION64_PATH",
                         "value": "/var/run/clusterprof/libclusterprof_cupti.so"}})",
           R"({"op": "add", "path": "/spec/containers/1/env/-",
               "value": {"name": "LD_PRELOAD", "value": "/x.so"}})",
           R"({"op": "add", "path": "/spec/containers/0/env",
               "value": [{"name": "CLUSTERPROF_DIR", "value": "/var/run/clusterprof"}]})",
           R"({"op": "add", "path": "/spec/containers/0/volumeMounts",
               "value": [{"name": "clusterprof-token", "mountPath": "/etc/clusterprof/token"}]})",
           R"({"op": "add", "path": "/spec/containers/0/securityContext",
               "value": {"privileged": true}})",
           R"({"op": "add", "path": "/spec/containers/-",
               "value": {"name": "clusterprof-sidecar", "image": "i"}})",
           R"({"op": "add", "path": "/spec/initContainers",
               "value": [{"name": "miner", "image": "i"}]})",
           R"({"op": "add", "path": "/metadata/labels/clusterprof.io~1injected", "value": "no"})",
           R"({"op": "add", "path": "/metadata/annotations", "value": {"a": "b"}})",
       }) {
    EXPECT_NE(Undocumented(value::parse(op), pod, config), "") << op;
  }
}

TEST_F(WebhookPatchScopeTest, EveryOperationIsADocumentedAdd) {
  for (const Scenario& scenario : Scenarios()) {
    SCOPED_TRACE(scenario.name);
    const std::string patch = PatchFor(scenario);
    ASSERT_FALSE(patch.empty());
    const value ops = value::parse(patch);
    for (const value& op : ops.as_array()) {
      EXPECT_EQ(Undocumented(op, scenario.pod, scenario.config), "") << op.serialize();
    }
  }
}

TEST_F(WebhookPatchScopeTest, EverythingElseOfThePodAndItsContainersIsLeftAsItWas) {
  for (const Scenario& scenario : Scenarios()) {
    SCOPED_TRACE(scenario.name);
    const value& before = scenario.pod;
    const value after = testing::ApplyPatch(before, PatchFor(scenario));

    // metadata: only the label is new.
    value metadata_before = before.at("metadata");
    value metadata_after = after.at("metadata");
    ASSERT_TRUE(metadata_after.has_field("labels"));
    for (const auto& [key, label] : documented_->labels) {
      EXPECT_EQ(metadata_after.at("labels").at(key).as_string(), label);
      metadata_after["labels"].erase(key);
    }
    if (metadata_after.at("labels").size() == 0 && !metadata_before.has_field("labels")) {
      metadata_after.erase("labels");
    }
    EXPECT_EQ(Canonical(metadata_after), Canonical(metadata_before));

    // spec: only the container lists, volumes and pull secrets change, and only by additions.
    const value& spec_before = before.at("spec");
    const value& spec_after = after.at("spec");
    std::set<std::string> keys;
    for (const auto& [key, unused] : spec_before.as_object()) keys.insert(key);
    for (const auto& [key, unused] : spec_after.as_object()) keys.insert(key);
    for (const std::string& key : keys) {
      if (key == "containers" || key == "initContainers" || key == "volumes" ||
          key == "imagePullSecrets") {
        continue;
      }
      ASSERT_TRUE(spec_before.has_field(key) && spec_after.has_field(key)) << "spec." << key;
      EXPECT_EQ(Canonical(spec_after.at(key)), Canonical(spec_before.at(key))) << "spec." << key;
    }
    for (const char* list : {"volumes", "imagePullSecrets"}) {
      const web::json::array& was = Items(spec_before, list);
      const web::json::array& is = Items(spec_after, list);
      ASSERT_GE(is.size(), was.size()) << list;
      for (size_t i = 0; i < was.size(); ++i) {
        EXPECT_EQ(Canonical(is.at(i)), Canonical(was.at(i))) << list << "[" << i << "]";
      }
    }

    // Each of the pod's containers: the same, in the same place, but for added variables and
    // mounts; its own variables and mounts first and unchanged.
    for (const char* list : {"initContainers", "containers"}) {
      const web::json::array& was = Items(spec_before, list);
      const web::json::array& is = Items(spec_after, list);
      const size_t offset =
          std::string(list) == "initContainers" && scenario.config.native_sidecar ? 1 : 0;
      ASSERT_EQ(is.size(),
                was.size() + offset +
                    (std::string(list) == "containers" && !scenario.config.native_sidecar))
          << list;
      for (size_t i = 0; i < was.size(); ++i) {
        const value& old_container = was.at(i);
        value new_container = is.at(i + offset);
        const std::string name = old_container.at("name").as_string();
        for (const char* field : {"env", "volumeMounts"}) {
          const web::json::array& old_items = Items(old_container, field);
          const web::json::array& new_items = Items(new_container, field);
          ASSERT_GE(new_items.size(), old_items.size()) << name << " " << field;
          for (size_t j = 0; j < old_items.size(); ++j) {
            EXPECT_EQ(Canonical(new_items.at(j)), Canonical(old_items.at(j)))
                << name << " " << field << "[" << j << "]";
          }
          for (size_t j = old_items.size(); j < new_items.size(); ++j) {
            const std::string added = new_items.at(j).at("name").as_string();
            if (std::string(field) == "env") {
              EXPECT_TRUE(documented_->env.count(added)) << name << " gets " << added;
            } else {
              ASSERT_TRUE(documented_->volumes.count(added)) << name << " mounts " << added;
              EXPECT_EQ(documented_->volumes.at(added).scope, Scope::kEveryContainer)
                  << name << " mounts " << added << ", documented for the sidecar only";
            }
          }
          if (new_container.has_field(field)) new_container.erase(field);
        }
        value old_rest = old_container;
        for (const char* field : {"env", "volumeMounts"}) {
          if (old_rest.has_field(field)) old_rest.erase(field);
        }
        EXPECT_EQ(Canonical(new_container), Canonical(old_rest)) << name;
      }
    }
  }
}

// The sidecar the webhook adds is the documented one: non-root, read-only root file system, no
// privilege escalation, every capability dropped (SYS_NICE added back only with start_realtime),
// the runtime's seccomp profile, no host port, and only the documented volumes mounted; its
// environment holds no Secret.
TEST_F(WebhookPatchScopeTest, TheSidecarIsLockedDownWhateverThePodAsks) {
  for (const Scenario& scenario : Scenarios()) {
    SCOPED_TRACE(scenario.name);
    const value after = testing::ApplyPatch(scenario.pod, PatchFor(scenario));
    const value* sidecar = testing::FindContainer(after, documented_->sidecar_name);
    ASSERT_NE(sidecar, nullptr);
    const value& security = sidecar->at("securityContext");
    EXPECT_TRUE(security.at("runAsNonRoot").as_bool());
    EXPECT_NE(security.at("runAsUser").as_integer(), 0);
    EXPECT_TRUE(security.at("readOnlyRootFilesystem").as_bool());
    EXPECT_FALSE(security.at("allowPrivilegeEscalation").as_bool());
    EXPECT_FALSE(security.has_field("privileged") && security.at("privileged").as_bool());
    EXPECT_EQ(Canonical(security.at("capabilities").at("drop")), R"(["ALL"])");
    EXPECT_EQ(security.at("capabilities").has_field("add")
                  ? Canonical(security.at("capabilities").at("add"))
                  : "none",
              scenario.config.start_realtime ? R"(["SYS_NICE"])" : "none");
    EXPECT_EQ(security.at("seccompProfile").at("type").as_string(), "RuntimeDefault");
    for (const value& port : Items(*sidecar, "ports")) {
      EXPECT_FALSE(port.has_field("hostPort")) << port.serialize();
    }
    EXPECT_FALSE(sidecar->has_field("envFrom"));
    for (const value& env : Items(*sidecar, "env")) {
      EXPECT_FALSE(env.has_field("valueFrom") && env.at("valueFrom").has_field("secretKeyRef"))
          << env.serialize();
    }
    std::set<std::string> secret_mounts;
    for (const value& mount : Items(*sidecar, "volumeMounts")) {
      const std::string name = mount.at("name").as_string();
      ASSERT_TRUE(documented_->volumes.count(name)) << name;
      if (documented_->volumes.at(name).kind == "secret") secret_mounts.insert(name);
      EXPECT_EQ(mount.at("mountPath").as_string(), documented_->volumes.at(name).mount_path)
          << name;
      if (documented_->volumes.at(name).kind == "secret") {
        EXPECT_TRUE(mount.has_field("readOnly") && mount.at("readOnly").as_bool()) << name;
      }
    }
    std::set<std::string> configured;
    if (!scenario.config.token_secret.empty()) configured.insert(std::string(kTokenVolumeName));
    if (!scenario.config.tls_secret.empty()) configured.insert(std::string(kTlsVolumeName));
    EXPECT_EQ(secret_mounts, configured) << "the sidecar mounts the configured Secrets only";
    // No container of the pod's own mounts a Secret the webhook added.
    for (const char* list : {"initContainers", "containers"}) {
      for (const value& container : Items(after.at("spec"), list)) {
        if (container.at("name").as_string() == documented_->sidecar_name) continue;
        for (const value& mount : Items(container, "volumeMounts")) {
          const std::string name = mount.at("name").as_string();
          EXPECT_FALSE(documented_->volumes.count(name) &&
                       documented_->volumes.at(name).scope == Scope::kSidecarOnly)
              << container.at("name").as_string() << " mounts " << name;
        }
      }
    }
  }
}

}  // namespace
}  // namespace clusterprof::webhook
