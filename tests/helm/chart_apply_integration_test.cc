// The Helm chart (helm/clusterprof) against a real kube-apiserver (tests/support): `helm template`
// renders it for Kubernetes 1.20, kubectl applies everything it renders (CRDs, RBAC, the
// ServiceAccount, the ConfigMap, the Secrets, the Services, the Deployment, the
// MutatingWebhookConfiguration, the NetworkPolicy, the PodDisruptionBudget), and the server
// stores each object with every field the chart set. There is no kubelet: the Deployment's pods
// never run.
//
// Then the proof that the rendered RBAC suffices: the rendered ClusterRole and lease Role are
// bound to the unprivileged user, and the clusterprof-operator binary runs as that user with the
// Deployment's own flags, its files holding what the chart put in the Secrets and the ConfigMap
// (the webhook certificate, the injection config, the sidecar token, the sidecars' CA), and
// POD_NAMESPACE as the downward API sets it. It elects itself through the Lease, serves the
// webhook with the chart's certificate (verified against the webhook's caBundle), and captures a
// ProfileJob from a real sidecar that requires the chart's token and serves TLS with the chart's
// sidecar certificate, which the operator verifies against the chart's CA and server name. The API
// server's audit log shows every request the operator made, and none was forbidden.
//
// Last, what only a cluster shows: `helm template --dry-run=server` renders as `helm upgrade`
// does, reading the installed Secrets back (lookup), so an upgrade keeps the sidecars' CA,
// certificate and token, sidecar.tls.renew=true issues a new certificate from the same CA, and
// auth.token replaces the token.
//
// Helm comes from $CLUSTERPROF_HELM, scripts/install-helm's cache or PATH; without helm, the
// control plane or kubectl, the binary exits 77 (ctest: skipped) and says why.
#include <signal.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_join.h"
#include "common/base/status.h"
#include "common/base/strings.h"
#include "cpprest/json.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "operator/api/types.h"
#include "operator/kube/resource.h"
#include "tests/operator/kube/kube_fixture.h"
#include "tests/operator/local_host.h"
#include "tests/support/kube_control_plane.h"
#include "tests/support/local_http.h"
#include "tests/support/subprocess.h"
#include "tests/support/temp_dir.h"
#include "yaml-cpp/yaml.h"

namespace clusterprof {
namespace {

using testing::CommandResult;
using ::testing::HasSubstr;
using testing::Subprocess;
using testing::TempDir;
using web::json::value;

constexpr char kSourceDir[] = CLUSTERPROF_SOURCE_DIR;
constexpr char kOperator[] = CLUSTERPROF_OPERATOR_PATH;
constexpr char kSidecar[] = CLUSTERPROF_SIDECAR_PATH;
constexpr char kAnnotator[] = CLUSTERPROF_TEST_ANNOTATOR_PATH;

constexpr char kRelease[] = "clusterprof";
constexpr char kReleaseNamespace[] = "clusterprof-system";
constexpr char kWorkloadNamespace[] = "training";

// Set by main().
std::string* helm = nullptr;

// $CLUSTERPROF_HELM, else the newest helm-*/helm in scripts/install-helm's cache, else helm on
// PATH.
absl::StatusOr<std::string> FindHelm() {
  if (const char* explicit_path = getenv("CLUSTERPROF_HELM");
      explicit_path != nullptr && *explicit_path != '\0') {
    if (access(explicit_path, X_OK) != 0) {
      return absl::InvalidArgumentError(
          StrCat("CLUSTERPROF_HELM=", explicit_path, " is not an executable"));
    }
    return std::string(explicit_path);
  }
  std::string cache;
  if (const char* dir = getenv("CLUSTERPROF_HELM_CACHE"); dir != nullptr && *dir != '\0') {
    cache = dir;
  } else if (const char* xdg = getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg != '\0') {
    cache = StrCat(xdg, "/clusterprof");
  } else if (const char* home = getenv("HOME"); home != nullptr) {
    cache = StrCat(home, "/.cache/clusterprof");
  }
  std::vector<std::string> cached;
  std::error_code error;
  if (!cache.empty() && std::filesystem::is_directory(cache, error)) {
    for (const auto& entry : std::filesystem::directory_iterator(cache, error)) {
      const std::string name = entry.path().filename().string();
      const std::string binary = entry.path().string() + "/helm";
      if (name.rfind("helm-", 0) == 0 && access(binary.c_str(), X_OK) == 0) {
        cached.push_back(binary);
      }
    }
  }
  if (!cached.empty()) return *std::max_element(cached.begin(), cached.end());
  absl::StatusOr<std::string> on_path = testing::FindProgram("helm");
  if (on_path.ok()) return on_path;
  return absl::NotFoundError(
      "helm is not installed: scripts/install-helm installs it (or set CLUSTERPROF_HELM)");
}

std::string Describe(const CommandResult& result) {
  return StrCat("exit code ", result.exit_code, "\nstdout: ", result.out, "\nstderr: ", result.err);
}

// One document of the rendering.
struct Manifest {
  std::string api_version;
  std::string kind;
  std::string name;
  std::string ns;  // empty for cluster-scoped objects
  std::string text;
  YAML::Node node;
};

// The documents of `helm template` output.
std::vector<Manifest> ParseManifests(const std::string& rendered) {
  std::vector<Manifest> out;
  std::vector<std::string> chunks(1);
  std::istringstream lines(rendered);
  for (std::string line; std::getline(lines, line);) {
    if (line == "---") {
      chunks.emplace_back();
    } else {
      chunks.back() += line + "\n";
    }
  }
  for (const std::string& chunk : chunks) {
    YAML::Node node = YAML::Load(chunk);
    if (!node.IsMap()) continue;
    Manifest manifest;
    manifest.api_version = node["apiVersion"].as<std::string>();
    manifest.kind = node["kind"].as<std::string>();
    manifest.name = node["metadata"]["name"].as<std::string>();
    if (node["metadata"]["namespace"])
      manifest.ns = node["metadata"]["namespace"].as<std::string>();
    manifest.text = chunk;
    manifest.node = node;
    out.push_back(std::move(manifest));
  }
  return out;
}

// Where `stored` lacks or changes something `rendered` has: one line per path. Maps: every key
// of `rendered`; sequences: the same length, element by element; scalars: the same text (the
// server writes 8466 and "8466" alike in YAML, and defaults only add keys).
void CollectDifferences(const YAML::Node& rendered, const YAML::Node& stored,
                        const std::string& path, std::vector<std::string>& out) {
  if (!rendered) return;
  if (!stored) {
    out.push_back(StrCat(path, ": missing in the stored object"));
    return;
  }
  if (rendered.IsMap()) {
    if (!stored.IsMap()) {
      out.push_back(StrCat(path, ": not a map in the stored object"));
      return;
    }
    for (const auto& entry : rendered) {
      const std::string key = entry.first.as<std::string>();
      CollectDifferences(entry.second, stored[key], StrCat(path, ".", key), out);
    }
  } else if (rendered.IsSequence()) {
    if (!stored.IsSequence() || stored.size() != rendered.size()) {
      out.push_back(StrCat(path, ": ", rendered.size(), " entries rendered, ",
                           stored.IsSequence() ? stored.size() : 0, " stored"));
      return;
    }
    for (size_t i = 0; i < rendered.size(); ++i) {
      CollectDifferences(rendered[i], stored[i], StrCat(path, "[", i, "]"), out);
    }
  } else if (rendered.IsScalar()) {
    if (!stored.IsScalar() || stored.as<std::string>() != rendered.as<std::string>()) {
      out.push_back(StrCat(path, ": rendered ", rendered.as<std::string>(), ", stored ",
                           stored.IsScalar() ? stored.as<std::string>() : "(not a scalar)"));
    }
  }
}

// A pod's sidecar and workload, as local processes. The sidecar requires `token_file`'s token and
// serves TLS with `tls_dir`'s tls.crt and tls.key, as the webhook injects it (the files of the
// chart's Secrets). Its gRPC port (port 0: a free one) is the TLS one; the plaintext listener on
// loopback that comes with TLS gets a port of its own.
class Host : public testing::LocalHost {
 public:
  Host(const TempDir& root, const std::string& name, const std::string& logs,
       const std::string& token_file, const std::string& tls_dir)
      : LocalHost(root, name, logs, kSidecar, kAnnotator,
                  {"--auth-token-file", token_file, "--tls-cert-file", tls_dir + "/tls.crt",
                   "--tls-key-file", tls_dir + "/tls.key"}) {}
};

class HelmChartApplyTest : public kube::KubeFixture {
 protected:
  static void SetUpTestSuite() {
    scratch_ = new TempDir();
    // Every request, with who made it and the answer's code: the proof that the operator was
    // never refused.
    const std::string policy = scratch_->Join("audit-policy.yaml");
    testing::WriteFileOrDie(policy,
                            "apiVersion: audit.k8s.io/v1\nkind: Policy\n"
                            "omitStages: [RequestReceived]\nrules:\n- level: Metadata\n");
    testing::KubeControlPlaneOptions options;
    options.extra_apiserver_flags = {StrCat("--audit-policy-file=", policy),
                                     StrCat("--audit-log-path=", AuditLog())};
    StartPlane(options);
    install_ = new absl::Status(start_status_->ok() ? Install() : *start_status_);
  }

  static void TearDownTestSuite() {
    KubeFixture::TearDownTestSuite();
    delete install_;
    install_ = nullptr;
    delete manifests_;
    manifests_ = nullptr;
    delete scratch_;
    scratch_ = nullptr;
  }

  void SetUp() override {
    KubeFixture::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    ASSERT_TRUE(install_->ok()) << *install_;
  }

  static std::string AuditLog() { return scratch_->Join("audit.log"); }
  static std::string AdminKubeconfig() { return scratch_->Join("admin.kubeconfig"); }

  static CommandResult Run(std::vector<std::string> argv,
                           std::chrono::seconds timeout = std::chrono::seconds(90)) {
    absl::StatusOr<CommandResult> result = testing::RunCommand(argv, timeout);
    if (!result.ok()) {
      CommandResult failed;
      failed.err = std::string(result.status().message());
      return failed;
    }
    return *std::move(result);
  }

  // kubectl with `kubeconfig` (the admin's by default).
  static CommandResult Kubectl(std::vector<std::string> args, const std::string& kubeconfig = "") {
    std::vector<std::string> argv = {"kubectl", "--kubeconfig",
                                     kubeconfig.empty() ? AdminKubeconfig() : kubeconfig,
                                     "--request-timeout=30s"};
    argv.insert(argv.end(), args.begin(), args.end());
    return Run(argv);
  }

  // Renders the chart for this server, creates the namespaces, applies the CRDs, waits for them,
  // then applies everything else.
  static absl::Status Install() {
    CLUSTERPROF_RETURN_IF_ERROR(plane_->WriteKubeconfig(AdminKubeconfig(), plane_->admin_token()));
    const CommandResult rendered =
        Run({*helm, "template", kRelease, StrCat(kSourceDir, "/helm/clusterprof"), "--namespace",
             kReleaseNamespace, "--kube-version", "1.20.2", "--include-crds", "--skip-tests",
             "--set", "image.registry=registry.example/clusterprof", "--set",
             StrCat("auth.namespaces={", kWorkloadNamespace, "}"), "--set",
             StrCat("networkPolicy.namespaces={", kWorkloadNamespace, "}"), "--set",
             "networkPolicy.admitOtherPorts=false"});
    if (rendered.exit_code != 0) {
      return absl::InternalError(StrCat("helm template failed: ", Describe(rendered)));
    }
    manifests_ = new std::vector<Manifest>(ParseManifests(rendered.out));

    for (const char* ns : {kReleaseNamespace, kWorkloadNamespace}) {
      const CommandResult created = Kubectl({"create", "namespace", ns});
      if (created.exit_code != 0) {
        return absl::InternalError(StrCat("kubectl create namespace failed: ", Describe(created)));
      }
    }
    std::string crds, rest;
    for (const Manifest& manifest : *manifests_) {
      (manifest.kind == "CustomResourceDefinition" ? crds : rest) += "---\n" + manifest.text;
    }
    const std::string crd_file = scratch_->Join("crds.yaml");
    const std::string rest_file = scratch_->Join("chart.yaml");
    testing::WriteFileOrDie(crd_file, crds);
    testing::WriteFileOrDie(rest_file, rest);
    // 1.20 does not know the CRDs' CEL rules (crds/README.md): no client-side validation.
    CommandResult applied = Kubectl({"apply", "--validate=false", "-f", crd_file});
    if (applied.exit_code != 0) {
      return absl::InternalError(StrCat("kubectl apply of the CRDs failed: ", Describe(applied)));
    }
    applied = Kubectl({"wait", "--for=condition=established", "--timeout=60s",
                       "crd/profilejobs.clusterprof.io", "crd/profileschedules.clusterprof.io"});
    if (applied.exit_code != 0) {
      return absl::InternalError(StrCat("the CRDs were not established: ", Describe(applied)));
    }
    // Everything else with kubectl's validation against the server's schema: a field this server
    // does not know fails here.
    applied = Kubectl({"apply", "-f", rest_file});
    if (applied.exit_code != 0) {
      return absl::InternalError(StrCat("kubectl apply of the chart failed: ", Describe(applied)));
    }
    return absl::OkStatus();
  }

  static const Manifest& Find(const std::string& kind, const std::string& name = "",
                              const std::string& ns = "") {
    for (const Manifest& manifest : *manifests_) {
      if (manifest.kind == kind && (name.empty() || manifest.name == name) &&
          (ns.empty() || manifest.ns == ns)) {
        return manifest;
      }
    }
    ADD_FAILURE() << "the chart rendered no " << kind << " " << name << " " << ns;
    static const Manifest* none = new Manifest();
    return *none;
  }

  // The sidecar TLS and token Secrets of the chart with `values` (sidecar.tls on, the workload
  // namespace in auth.namespaces). With `from_cluster`, rendered as `helm upgrade` renders them,
  // reading this server's Secrets (helm template --dry-run=server, whose lookup answers);
  // without, as `helm template` does, from nothing.
  static std::vector<Manifest> RenderSecrets(bool from_cluster,
                                             const std::vector<std::string>& values = {}) {
    std::vector<std::string> argv = {
        *helm,         "template",
        kRelease,      StrCat(kSourceDir, "/helm/clusterprof"),
        "--namespace", kReleaseNamespace,
        "--set",       "image.registry=registry.example/clusterprof",
        "--set",       StrCat("auth.namespaces={", kWorkloadNamespace, "}"),
        "--show-only", "templates/sidecar-tls.yaml",
        "--show-only", "templates/token-secret.yaml"};
    if (from_cluster) {
      argv.insert(argv.end(), {"--dry-run=server", "--kubeconfig", AdminKubeconfig()});
    } else {
      argv.insert(argv.end(), {"--kube-version", "1.20.2"});
    }
    for (const std::string& value : values) argv.insert(argv.end(), {"--set", value});
    const CommandResult rendered = Run(argv);
    EXPECT_EQ(rendered.exit_code, 0) << Describe(rendered);
    return ParseManifests(rendered.out);
  }

  // The `data` of Secret ns/name in `manifests`, key by key (base64 as rendered).
  static std::map<std::string, std::string> SecretData(const std::vector<Manifest>& manifests,
                                                       const std::string& name,
                                                       const std::string& ns) {
    std::map<std::string, std::string> data;
    for (const Manifest& manifest : manifests) {
      if (manifest.kind != "Secret" || manifest.name != name || manifest.ns != ns) continue;
      for (const auto& entry : manifest.node["data"]) {
        data[entry.first.as<std::string>()] = entry.second.as<std::string>();
      }
      return data;
    }
    ADD_FAILURE() << "no Secret " << ns << "/" << name << " rendered";
    return data;
  }

  static std::string Decode(const YAML::Node& base64) {
    std::string decoded;
    EXPECT_TRUE(absl::Base64Unescape(base64.as<std::string>(), &decoded));
    return decoded;
  }

  // Creates a pod labelled app=trainer in the workload namespace and sets it Running and Ready
  // at 127.0.0.1, with its sidecar's port in the clusterprof.io/port annotation.
  void CreateRunningPod(const std::string& name, int port) {
    value pod = value::object();
    pod["metadata"]["name"] = value::string(name);
    pod["metadata"]["labels"]["app"] = value::string("trainer");
    pod["metadata"]["annotations"]["clusterprof.io/port"] = value::string(std::to_string(port));
    pod["spec"]["nodeName"] = value::string("node-a");
    pod["spec"]["containers"][0]["name"] = value::string("trainer");
    pod["spec"]["containers"][0]["image"] = value::string("trainer:latest");
    absl::StatusOr<value> created = admin_->Create(kube::Pods(), kWorkloadNamespace, pod);
    ASSERT_TRUE(created.ok()) << created.status();
    value status = value::object();
    status["phase"] = value::string("Running");
    status["podIP"] = value::string("127.0.0.1");
    status["conditions"][0]["type"] = value::string("Ready");
    status["conditions"][0]["status"] = value::string("True");
    (*created)["status"] = status;
    absl::StatusOr<value> updated =
        admin_->UpdateStatus(kube::Pods(), kWorkloadNamespace, *created);
    ASSERT_TRUE(updated.ok()) << updated.status();
  }

  // The audit log's requests by the operator (its user agent): "verb resource[/subresource]" ->
  // the response codes seen.
  static std::map<std::string, std::set<int>> OperatorRequests() {
    std::map<std::string, std::set<int>> requests;
    std::ifstream in(AuditLog());
    for (std::string line; std::getline(in, line);) {
      std::error_code error;
      const value event = value::parse(line, error);
      if (error || !event.has_object_field("user") || !event.has_object_field("objectRef") ||
          !event.has_string_field("userAgent")) {
        continue;
      }
      if (event.at("user").at("username").as_string() != testing::KubeControlPlane::kUser ||
          event.at("userAgent").as_string().rfind("clusterprof-operator", 0) != 0) {
        continue;
      }
      const value& ref = event.at("objectRef");
      std::string resource = ref.has_string_field("resource") ? ref.at("resource").as_string() : "";
      if (ref.has_string_field("subresource")) {
        resource += "/" + ref.at("subresource").as_string();
      }
      const int code = event.has_object_field("responseStatus") &&
                               event.at("responseStatus").has_integer_field("code")
                           ? event.at("responseStatus").at("code").as_integer()
                           : 0;
      requests[StrCat(event.at("verb").as_string(), " ", resource)].insert(code);
    }
    return requests;
  }

  static inline TempDir* scratch_ = nullptr;
  static inline absl::Status* install_ = nullptr;
  static inline std::vector<Manifest>* manifests_ = nullptr;
};

TEST_F(HelmChartApplyTest, TheServerStoresEveryRenderedObjectAsRendered) {
  std::set<std::string> kinds;
  for (const Manifest& manifest : *manifests_) {
    kinds.insert(manifest.kind);
    // crd_apply_integration_test covers the CRDs (this server drops their CEL rules).
    if (manifest.kind == "CustomResourceDefinition") continue;
    SCOPED_TRACE(StrCat(manifest.kind, " ", manifest.ns, "/", manifest.name));
    const std::string group = manifest.api_version.find('/') == std::string::npos
                                  ? ""
                                  : manifest.api_version.substr(0, manifest.api_version.find('/'));
    std::string type = manifest.kind;
    std::transform(type.begin(), type.end(), type.begin(), ::tolower);
    if (!group.empty()) type += "." + group;
    std::vector<std::string> args = {"get", type, manifest.name, "-o", "yaml"};
    if (!manifest.ns.empty()) args.insert(args.end(), {"--namespace", manifest.ns});
    const CommandResult got = Kubectl(args);
    ASSERT_EQ(got.exit_code, 0) << Describe(got);
    const YAML::Node stored = YAML::Load(got.out);
    std::vector<std::string> differences;
    for (const auto& entry : manifest.node) {
      const std::string key = entry.first.as<std::string>();
      if (key == "metadata") {
        CollectDifferences(entry.second["labels"], stored["metadata"]["labels"], "metadata.labels",
                           differences);
        CollectDifferences(entry.second["annotations"], stored["metadata"]["annotations"],
                           "metadata.annotations", differences);
      } else if (key != "apiVersion") {  // served in the preferred version
        CollectDifferences(entry.second, stored[key], key, differences);
      }
    }
    EXPECT_TRUE(differences.empty()) << "\n" << absl::StrJoin(differences, "\n");
  }
  EXPECT_EQ(kinds, (std::set<std::string>{"ClusterRole", "ClusterRoleBinding", "ConfigMap",
                                          "CustomResourceDefinition", "Deployment",
                                          "MutatingWebhookConfiguration", "NetworkPolicy",
                                          "PodDisruptionBudget", "Role", "RoleBinding", "Secret",
                                          "Service", "ServiceAccount"}));
  // The Deployment is there (no kubelet runs its pods).
  absl::StatusOr<testing::HttpResponse> deployment = plane_->Get(
      StrCat("/apis/apps/v1/namespaces/", kReleaseNamespace, "/deployments/clusterprof-operator"),
      plane_->admin_token());
  ASSERT_TRUE(deployment.ok()) << deployment.status();
  EXPECT_EQ(deployment->status_code, 200) << deployment->body;
}

TEST_F(HelmChartApplyTest, TheOperatorWorksUnderTheRenderedRolesWithTheChartsFlagsAndFiles) {
  TempDir root;
  const std::string logs = root.Join("logs");

  // The unprivileged user gets exactly the chart's roles.
  const std::string cluster_role = Find("ClusterRole", "clusterprof-operator").name;
  const std::string lease_role = Find("Role").name;
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"create", "clusterrolebinding", "helm-test-operator",
                                 StrCat("--clusterrole=", cluster_role),
                                 StrCat("--user=", testing::KubeControlPlane::kUser)},
        std::vector<std::string>{"create", "rolebinding", "helm-test-leases", "--namespace",
                                 kReleaseNamespace, StrCat("--role=", lease_role),
                                 StrCat("--user=", testing::KubeControlPlane::kUser)}}) {
    const CommandResult bound = Kubectl(args);
    ASSERT_EQ(bound.exit_code, 0) << Describe(bound);
  }
  const std::string kubeconfig = root.Join("user.kubeconfig");
  ASSERT_TRUE(plane_->WriteKubeconfig(kubeconfig, plane_->user_token()).ok());
  // What the roles allow, and some of what they do not.
  for (const auto& [args, allowed] : std::vector<std::pair<std::vector<std::string>, bool>>{
           {{"patch", "profilejobs.clusterprof.io", "--subresource=status", "-n", "training"},
            true},
           {{"delete", "profilejobs.clusterprof.io", "-n", "training"}, true},
           {{"watch", "pods", "--all-namespaces"}, true},
           {{"update", "leases.coordination.k8s.io/clusterprof-operator", "-n", kReleaseNamespace},
            true},
           {{"update", "leases.coordination.k8s.io/other", "-n", kReleaseNamespace}, false},
           {{"create", "leases.coordination.k8s.io", "-n", "training"}, false},
           {{"get", "secrets", "-n", kReleaseNamespace}, false},
           {{"update", "profilejobs.clusterprof.io", "-n", "training"}, false},
           {{"get", "profileschedules.clusterprof.io", "-n", "training"}, false},
           {{"create", "pods", "-n", "training"}, false}}) {
    std::vector<std::string> can_i = {"auth", "can-i"};
    can_i.insert(can_i.end(), args.begin(), args.end());
    const CommandResult answer = Kubectl(can_i, kubeconfig);
    EXPECT_EQ(answer.exit_code, allowed ? 0 : 1)
        << absl::StrJoin(args, " ") << ": " << Describe(answer);
  }

  // The files the Deployment mounts, with what the chart put in them.
  const YAML::Node tls = Find("Secret", "clusterprof-webhook-tls").node["data"];
  std::filesystem::create_directories(root.Join("webhook"));
  testing::WriteFileOrDie(root.Join("webhook/tls.crt"), Decode(tls["tls.crt"]));
  testing::WriteFileOrDie(root.Join("webhook/tls.key"), Decode(tls["tls.key"]));
  const std::string ca_file = root.Join("ca.crt");
  const YAML::Node webhooks = Find("MutatingWebhookConfiguration").node["webhooks"];
  testing::WriteFileOrDie(ca_file, Decode(webhooks[0]["clientConfig"]["caBundle"]));
  testing::WriteFileOrDie(
      root.Join("config.yaml"),
      Find("ConfigMap", "clusterprof-injection").node["data"]["config.yaml"].as<std::string>());
  const std::string token =
      Decode(Find("Secret", "clusterprof-sidecar-token", kReleaseNamespace).node["data"]["token"]);
  ASSERT_GE(token.size(), 32u);
  ASSERT_EQ(
      Decode(Find("Secret", "clusterprof-sidecar-token", kWorkloadNamespace).node["data"]["token"]),
      token)
      << "the workload namespace's copy holds the operator's token";
  testing::WriteFileOrDie(root.Join("operator-token"), token);
  testing::WriteFileOrDie(root.Join("sidecar-token"), token);
  // The operator trusts the release namespace's ca.crt; the workload namespace's Secret, the one
  // the webhook mounts into the sidecars, holds the certificate it signed.
  const YAML::Node sidecar_tls =
      Find("Secret", "clusterprof-sidecar-tls", kWorkloadNamespace).node["data"];
  std::filesystem::create_directories(root.Join("sidecar-tls"));
  testing::WriteFileOrDie(root.Join("sidecar-tls/tls.crt"), Decode(sidecar_tls["tls.crt"]));
  testing::WriteFileOrDie(root.Join("sidecar-tls/tls.key"), Decode(sidecar_tls["tls.key"]));
  testing::WriteFileOrDie(
      root.Join("sidecar-ca.crt"),
      Decode(Find("Secret", "clusterprof-sidecar-tls", kReleaseNamespace).node["data"]["ca.crt"]));

  // The Deployment's flags, with the mounted paths pointing at those files and the ports free.
  const YAML::Node container = Find("Deployment").node["spec"]["template"]["spec"]["containers"][0];
  const std::map<std::string, std::string> replaced = {
      {"--webhook-cert-dir", root.Join("webhook")},
      {"--injection-config", root.Join("config.yaml")},
      {"--sidecar-token-file", root.Join("operator-token")},
      {"--sidecar-tls-ca-file", root.Join("sidecar-ca.crt")},
      {"--health-port", "0"},
      {"--webhook-port", "0"},
      {"--log-level", "debug"}};
  std::vector<std::string> argv = {kOperator};
  std::set<std::string> seen;
  for (const YAML::Node& arg : container["args"]) {
    std::string flag = arg.as<std::string>();
    const std::string name = flag.substr(0, flag.find('='));
    if (auto it = replaced.find(name); it != replaced.end()) {
      flag = StrCat(name, "=", it->second);
      seen.insert(name);
    }
    argv.push_back(flag);
  }
  for (const auto& [name, unused] : replaced) {
    EXPECT_TRUE(seen.count(name)) << "the Deployment does not pass " << name;
  }
  EXPECT_THAT(argv, ::testing::Contains("--leader-elect"));
  EXPECT_THAT(argv, ::testing::Contains("--sidecar-tls-server-name=clusterprof-sidecar"));
  const std::string port_file = root.Join("operator.ports");
  argv.insert(argv.end(),
              {"--kubeconfig", kubeconfig, "--health-address", "127.0.0.1", "--webhook-address",
               "127.0.0.1", "--port-file", port_file, "--retry-backoff-ms", "300"});
  // The pod of the capture below, in place before the operator starts: a pod created after
  // would race the operator's pod watch (the job resolves its targets from the cache at once).
  Host sidecar(root, "trainer-0", logs, root.Join("sidecar-token"), root.Join("sidecar-tls"));
  CreateRunningPod("trainer-0", sidecar.port());
  const std::string operator_log = root.Join("operator.log");
  Subprocess op(
      argv, {{"POD_NAMESPACE", kReleaseNamespace}, {"CLUSTERPROF_SPOOL_DIR", root.Join("spool")}},
      operator_log);
  auto fail_with_log = [&] {
    return StrCat("operator log:\n", testing::ReadFileOrDie(operator_log));
  };

  ASSERT_TRUE(testing::WaitForFile(port_file, std::chrono::seconds(60))) << fail_with_log();
  std::map<std::string, int> ports;
  ASSERT_TRUE(Eventually([&] {
    ports = testing::ReadPortFile(port_file);
    return ports["http"] != 0 && ports["webhook"] != 0;
  })) << fail_with_log();
  EXPECT_TRUE(Eventually([&] {
    return StripAsciiWhitespace(testing::HttpGet(ports["http"], "/readyz")) == "ok";
  })) << fail_with_log();

  // Leader election through the Role in the release namespace (POD_NAMESPACE).
  std::string holder;
  EXPECT_TRUE(Eventually([&] {
    absl::StatusOr<value> lease =
        admin_->Get(kube::Leases(), kReleaseNamespace, "clusterprof-operator");
    if (!lease.ok() || !lease->at("spec").has_string_field("holderIdentity")) return false;
    holder = lease->at("spec").at("holderIdentity").as_string();
    return !holder.empty();
  })) << fail_with_log();

  // The webhook serves the chart's certificate: curl trusts it through the caBundle under the
  // Service's DNS name, and gets an AdmissionReview back.
  const std::string host = StrCat("clusterprof-webhook.", kReleaseNamespace, ".svc");
  const std::string review =
      R"({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "0f6fc6a4-2ad4-4c1e-9c35-2a7b1d0e3b11",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "namespace": "training", "operation": "CREATE",
        "userInfo": {"username": "someone"},
        "object": {"apiVersion": "v1", "kind": "Pod",
          "metadata": {"name": "trainer-x", "namespace": "training",
                       "labels": {"clusterprof.io/inject": "true"}},
          "spec": {"containers": [{"name": "trainer", "image": "trainer:latest"}]}}}})";
  const std::string review_file = root.Join("review.json");
  testing::WriteFileOrDie(review_file, review);
  const CommandResult posted =
      Run({"curl", "--silent", "--show-error", "--fail", "--max-time", "20", "--cacert", ca_file,
           "--resolve", StrCat(host, ":", ports["webhook"], ":127.0.0.1"), "-H",
           "Content-Type: application/json", "--data-binary", StrCat("@", review_file),
           StrCat("https://", host, ":", ports["webhook"], "/mutate-pods")});
  ASSERT_EQ(posted.exit_code, 0) << Describe(posted) << fail_with_log();
  std::error_code parse_error;
  const value answer = value::parse(posted.out, parse_error);
  ASSERT_FALSE(parse_error) << posted.out;
  EXPECT_EQ(answer.at("response").at("uid").as_string(), "0f6fc6a4-2ad4-4c1e-9c35-2a7b1d0e3b11");
  EXPECT_TRUE(answer.at("response").at("allowed").as_bool()) << posted.out;

  // A capture: a sidecar that requires the chart's token, its pod (created before the operator
  // started, so that its pod cache holds it), a ProfileJob that is deleted after its TTL.
  value job = value::object();
  job["metadata"]["name"] = value::string("chart-rbac");
  job["spec"]["targets"]["selector"]["matchLabels"]["app"] = value::string("trainer");
  job["spec"]["durationMs"] = value::number(500);
  job["spec"]["delayMs"] = value::number(300);
  job["spec"]["logdir"] = value::string(logs);
  job["spec"]["runName"] = value::string("chart_rbac");
  job["spec"]["ttlSecondsAfterFinished"] = value::number(4);
  ASSERT_TRUE(admin_->Create(api::ProfileJobs(), kWorkloadNamespace, job).ok());
  value got;
  ASSERT_TRUE(Eventually(
      [&] {
        absl::StatusOr<value> current =
            admin_->Get(api::ProfileJobs(), kWorkloadNamespace, "chart-rbac");
        if (!current.ok()) return false;
        got = *current;
        return got.has_object_field("status") && got.at("status").has_string_field("phase") &&
               got.at("status").at("phase").as_string() != "Scheduled" &&
               got.at("status").at("phase").as_string() != "Capturing";
      },
      std::chrono::seconds(90)))
      << got.serialize() << fail_with_log();
  ASSERT_EQ(got.at("status").at("phase").as_string(), "Succeeded")
      << got.serialize() << "\n"
      << sidecar.Log() << fail_with_log();
  EXPECT_TRUE(testing::FileExists(StrCat(logs, "/plugins/profile/chart_rbac/trainer-0.xplane.pb")));
  EXPECT_TRUE(Eventually([&] {
    kube::ListOptions options;
    options.field_selector = "involvedObject.name=chart-rbac";
    absl::StatusOr<kube::ObjectList> events =
        admin_->List(kube::Events(), kWorkloadNamespace, options);
    if (!events.ok()) return false;
    for (const value& event : events->items) {
      if (event.at("reason").as_string() == "CaptureSucceeded") return true;
    }
    return false;
  })) << fail_with_log();
  // ttlSecondsAfterFinished: the operator deletes the job.
  EXPECT_TRUE(Eventually(
      [&] {
        return absl::IsNotFound(
            admin_->Get(api::ProfileJobs(), kWorkloadNamespace, "chart-rbac").status());
      },
      std::chrono::seconds(30)))
      << fail_with_log();

  // A schedule's status: an invalid one is marked so.
  value schedule = value::object();
  schedule["metadata"]["name"] = value::string("badcron");
  schedule["spec"]["schedule"] = value::string("61 * * * *");
  schedule["spec"]["jobTemplate"]["spec"] = job.at("spec");
  ASSERT_TRUE(admin_->Create(api::ProfileSchedules(), kWorkloadNamespace, schedule).ok());
  EXPECT_TRUE(Eventually([&] {
    absl::StatusOr<value> current =
        admin_->Get(api::ProfileSchedules(), kWorkloadNamespace, "badcron");
    return current.ok() && current->has_object_field("status") &&
           current->at("status").has_array_field("conditions") &&
           current->at("status").at("conditions").at(0).at("status").as_string() == "False";
  })) << fail_with_log();

  // The audit log: what the operator asked for, and that nothing was forbidden.
  op.Signal(SIGTERM);
  op.Wait(std::chrono::seconds(60));
  const std::map<std::string, std::set<int>> requests = OperatorRequests();
  std::vector<std::string> forbidden, used;
  for (const auto& [request, codes] : requests) {
    used.push_back(request);
    if (codes.count(403)) forbidden.push_back(request);
  }
  std::cout << "the operator's requests (audit log): " << absl::StrJoin(used, ", ") << "\n";
  EXPECT_TRUE(forbidden.empty()) << "forbidden: " << absl::StrJoin(forbidden, ", ") << "\n"
                                 << fail_with_log();
  for (const char* request :
       {"list profilejobs", "watch profilejobs", "get profilejobs", "delete profilejobs",
        "update profilejobs/status", "patch profilejobs/status", "list profileschedules",
        "watch profileschedules", "update profileschedules/status", "list pods", "watch pods",
        "create events", "get leases", "create leases", "update leases"}) {
    EXPECT_TRUE(requests.count(request)) << "the operator never made a " << request
                                         << " request; made: " << absl::StrJoin(used, ", ");
  }
}

// What `helm upgrade` renders for an installed release: the sidecars' CA and certificate and the
// token it reads back, unless asked to renew the certificate (same CA) or given a new token.
TEST_F(HelmChartApplyTest, UpgradesKeepTheSidecarCertificateAndRenewItFromTheSameCa) {
  const std::string ca_name = "clusterprof-sidecar-ca";
  const std::string tls_name = "clusterprof-sidecar-tls";
  const std::string token_name = "clusterprof-sidecar-token";

  // What Install() applied.
  TempDir root;
  const auto ca = SecretData(*manifests_, ca_name, kReleaseNamespace);
  const auto serving = SecretData(*manifests_, tls_name, kReleaseNamespace);
  ASSERT_EQ(serving.at("ca.crt"), ca.at("tls.crt"));
  const std::string token = SecretData(*manifests_, token_name, kReleaseNamespace).at("token");

  // A plain upgrade keeps all of it, in every namespace.
  const std::vector<Manifest> upgraded = RenderSecrets(/*from_cluster=*/true);
  EXPECT_EQ(SecretData(upgraded, ca_name, kReleaseNamespace), ca);
  for (const char* ns : {kReleaseNamespace, kWorkloadNamespace}) {
    EXPECT_EQ(SecretData(upgraded, tls_name, ns), serving) << ns;
    EXPECT_EQ(SecretData(upgraded, token_name, ns).at("token"), token) << ns;
  }
  // Against nothing, a render makes new ones: the upgrade above did read the cluster.
  EXPECT_NE(SecretData(RenderSecrets(/*from_cluster=*/false), tls_name, kReleaseNamespace),
            serving);

  // renew: a new certificate and key, signed by the same CA, which stays as it was; a new token.
  const std::string new_token = "0123456789abcdef0123456789abcdef";
  const std::vector<Manifest> renewed = RenderSecrets(
      /*from_cluster=*/true, {"sidecar.tls.renew=true", StrCat("auth.token=", new_token)});
  EXPECT_EQ(SecretData(renewed, ca_name, kReleaseNamespace), ca);
  const auto fresh = SecretData(renewed, tls_name, kReleaseNamespace);
  EXPECT_NE(fresh.at("tls.crt"), serving.at("tls.crt"));
  EXPECT_NE(fresh.at("tls.key"), serving.at("tls.key"));
  EXPECT_EQ(fresh.at("ca.crt"), ca.at("tls.crt"));
  EXPECT_EQ(SecretData(renewed, tls_name, kWorkloadNamespace), fresh);
  for (const char* ns : {kReleaseNamespace, kWorkloadNamespace}) {
    EXPECT_EQ(Decode(YAML::Node(SecretData(renewed, token_name, ns).at("token"))), new_token) << ns;
  }
  // Both certificates verify against the one CA the operator trusts, as a TLS server.
  auto write_pem = [&](const std::string& name, const std::string& base64) {
    testing::WriteFileOrDie(root.Join(name), Decode(YAML::Node(base64)));
    return root.Join(name);
  };
  const std::string ca_file = write_pem("ca.crt", ca.at("tls.crt"));
  for (const auto& [name, data] : {std::pair{"old.crt", &serving}, std::pair{"new.crt", &fresh}}) {
    const CommandResult verified = Run({"openssl", "verify", "-CAfile", ca_file, "-purpose",
                                        "sslserver", write_pem(name, data->at("tls.crt"))});
    EXPECT_EQ(verified.exit_code, 0) << name << ": " << Describe(verified);
  }

  // A CA Secret that is gone (deleted to replace the CA): a new CA, and a certificate from it.
  const CommandResult deleted =
      Kubectl({"delete", "secret", ca_name, "--namespace", kReleaseNamespace});
  ASSERT_EQ(deleted.exit_code, 0) << Describe(deleted);
  const std::vector<Manifest> replaced = RenderSecrets(/*from_cluster=*/true);
  const auto new_ca = SecretData(replaced, ca_name, kReleaseNamespace);
  EXPECT_NE(new_ca.at("tls.crt"), ca.at("tls.crt"));
  EXPECT_EQ(SecretData(replaced, tls_name, kReleaseNamespace).at("ca.crt"), new_ca.at("tls.crt"));
  EXPECT_NE(SecretData(replaced, tls_name, kReleaseNamespace).at("tls.crt"), serving.at("tls.crt"));
}

}  // namespace
}  // namespace clusterprof

// Exits 77 (ctest: skipped) when helm, the control plane or kubectl is not installed.
int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  absl::StatusOr<std::string> helm = clusterprof::FindHelm();
  absl::Status missing = helm.status();
  if (missing.ok()) missing = clusterprof::testing::FindKubeApiserver().status();
  if (missing.ok()) missing = clusterprof::testing::FindEtcd().status();
  if (missing.ok()) missing = clusterprof::testing::FindProgram("kubectl").status();
  if (absl::IsNotFound(missing)) {
    std::cout << "SKIPPED: " << missing << "\n";
    return 77;
  }
  if (!missing.ok()) {
    std::cerr << missing << "\n";
    return 1;
  }
  clusterprof::helm = new std::string(*helm);
  std::cout << "helm: " << *helm << "\n";
  return RUN_ALL_TESTS();
}
