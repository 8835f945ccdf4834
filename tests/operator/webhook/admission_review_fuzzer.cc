// Fuzzes the webhook's answer to an AdmissionReview (operator/webhook/injection.h): the input is
// the body the API server POSTs to /mutate-pods. webhook::Review gives an error (the server
// answers 400) or an answer that
//   - is an admission.k8s.io/v1 AdmissionReview response, valid JSON, for the request's uid;
//   - always allows the pod (the webhook never blocks pod creation);
//   - carries, base64-encoded, exactly the result's JSON Patch, a list of "add" operations, and
//     the result's warnings;
//   - when it injects into a pod shaped as the API server sends pods, has a patch that applies
//     (every add onto an existing parent, and over an existing member only to set the injected
//     label), and the patched pod is then left alone ("already-injected").
// Each input is answered under two injection configs: the default (a native sidecar) and a
// regular sidecar container with a token Secret and no GPU library.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include "absl/strings/escaping.h"
#include "cpprest/json.h"
#include "operator/webhook/injection.h"
#include "tests/operator/webhook/webhook_test_util.h"
#include "tests/support/fuzz_check.h"

namespace {

namespace webhook = clusterprof::webhook;
using web::json::value;

// Absent, or a non-empty list of objects (the API server leaves empty lists out).
bool IsObjectList(const value& parent, const char* field) {
  if (!parent.has_field(field)) return true;
  const value& list = parent.at(field);
  if (!list.is_array() || list.size() == 0) return false;
  for (const value& item : list.as_array()) {
    if (!item.is_object()) return false;
  }
  return true;
}

// Absent, or a map of strings.
bool IsStringMap(const value& parent, const char* field) {
  if (!parent.has_field(field)) return true;
  const value& map = parent.at(field);
  if (!map.is_object()) return false;
  for (const auto& [key, item] : map.as_object()) {
    if (!item.is_string()) return false;
  }
  return true;
}

// Whether the fields the webhook patches have the types of a core/v1 Pod, as the API server
// serializes one: metadata always, never null for a field, and no empty list (Go's omitempty).
bool ShapedAsTheApiServerSendsIt(const value& pod) {
  if (!pod.is_object() || !pod.has_field("metadata")) return false;
  const value& metadata = pod.at("metadata");
  if (!metadata.is_object() || !IsStringMap(metadata, "labels") ||
      !IsStringMap(metadata, "annotations")) {
    return false;
  }
  if (!pod.has_field("spec") || !pod.at("spec").is_object()) return false;
  const value& spec = pod.at("spec");
  if (!IsObjectList(spec, "volumes")) return false;
  for (const char* field : {"initContainers", "containers"}) {
    if (!IsObjectList(spec, field)) return false;
    if (!spec.has_field(field)) continue;
    for (const value& container : spec.at(field).as_array()) {
      if (!IsObjectList(container, "env") || !IsObjectList(container, "volumeMounts")) {
        return false;
      }
    }
  }
  return true;
}

void CheckAnswer(const webhook::InjectionConfig& config, const value& review,
                 const std::string& body) {
  absl::StatusOr<webhook::ReviewAnswer> answer = webhook::Review(config, body);
  if (!answer.ok()) return;
  value response_review;
  try {
    response_review = value::parse(answer->body);
  } catch (const web::json::json_exception&) {
    FUZZ_CHECK(!"the API server could not read the answer");
  }
  FUZZ_CHECK(response_review.at("apiVersion").as_string() == "admission.k8s.io/v1");
  FUZZ_CHECK(response_review.at("kind").as_string() == "AdmissionReview");
  const value& response = response_review.at("response");
  FUZZ_CHECK(response.at("uid") == review.at("request").at("uid"));
  FUZZ_CHECK(response.at("allowed").as_bool());

  const webhook::InjectionResult& result = answer->result;
  FUZZ_CHECK(response.has_field("patch") == !result.patch.empty());
  if (response.has_field("warnings")) {
    const value& warnings = response.at("warnings");
    FUZZ_CHECK(warnings.size() == result.warnings.size());
    for (size_t i = 0; i < result.warnings.size(); ++i) {
      FUZZ_CHECK(warnings.at(i).as_string() == result.warnings[i]);
    }
  } else {
    FUZZ_CHECK(result.warnings.empty());
  }
  if (result.patch.empty()) return;
  FUZZ_CHECK(result.outcome == "injected");
  FUZZ_CHECK(response.at("patchType").as_string() == "JSONPatch");
  std::string patch;
  FUZZ_CHECK(absl::Base64Unescape(response.at("patch").as_string(), &patch));
  FUZZ_CHECK(patch == result.patch);
  const value operations = value::parse(patch);
  FUZZ_CHECK(operations.is_array() && operations.size() > 0);
  for (const value& operation : operations.as_array()) {
    FUZZ_CHECK(operation.at("op").as_string() == "add");
    FUZZ_CHECK(operation.at("path").as_string().starts_with("/"));
  }

  value pod = review.at("request").at("object");
  if (!ShapedAsTheApiServerSendsIt(pod)) return;
  // An injected label with another value than "true" is set: RFC 6902's "add" replaces an
  // object member, which ApplyPatch refuses (for the tests' sake), so it goes first.
  value& metadata = pod.at("metadata");
  const std::string injected(webhook::kInjectedLabel);
  if (metadata.has_field("labels") && metadata.at("labels").has_field(injected)) {
    metadata.at("labels").erase(injected);
  }
  value patched;
  try {
    patched = clusterprof::testing::ApplyPatch(pod, patch);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "the patch %s does not apply: %s\n", patch.c_str(), e.what());
    FUZZ_CHECK(!"the API server would refuse the patch, and so the pod");
  }
  absl::StatusOr<webhook::InjectionResult> again = webhook::Inject(config, patched.serialize());
  FUZZ_CHECK(again.ok() && again->outcome == "already-injected" && again->patch.empty());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const webhook::InjectionConfig* const kConfigs = [] {
    auto* configs = new webhook::InjectionConfig[2];
    configs[1].native_sidecar = false;
    configs[1].token_secret = "clusterprof-token";
    configs[1].tls_secret = "clusterprof-tls";
    configs[1].gpu_library = "";
    return configs;
  }();
  const std::string body(reinterpret_cast<const char*>(data), size);
  value review;
  try {
    review = value::parse(body);
  } catch (const web::json::json_exception&) {
    // Not JSON: an error, never an answer.
    FUZZ_CHECK(!webhook::Review(kConfigs[0], body).ok());
    return 0;
  }
  for (int i = 0; i < 2; ++i) CheckAnswer(kConfigs[i], review, body);
  return 0;
}
