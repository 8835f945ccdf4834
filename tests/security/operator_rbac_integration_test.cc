// The operator's ServiceAccount can do exactly what the chart's roles grant, and nothing else
// (docs/security.md, "The operator's ServiceAccount"). `helm template` renders the chart as it is
// installed (once with the default ClusterRoleBinding, once with operator.watchNamespace), the
// RBAC objects and the ServiceAccount go to a real kube-apiserver with RBAC authorization
// (tests/support), and the API server itself answers for the ServiceAccount:
//   - SubjectAccessReviews over a matrix of resources (core, apps, batch, RBAC, admission,
//     CRDs, certificates, leases, network policies, clusterprof.io, subresources such as
//     pods/exec and serviceaccounts/token), verbs (the eight usual ones, and escalate, bind,
//     impersonate, approve, use where they apply) and namespaces (the release's, a workload's,
//     another team's, kube-system, all of them): allowed exactly where the rendered rules
//     allow it;
//   - SelfSubjectRulesReviews, impersonating the ServiceAccount: the server's list of its rules
//     in each namespace is the rendered rules, no more;
//   - an explicit list of what it must never do (read Secrets, create or exec into pods,
//     port-forward, mint tokens, impersonate, escalate or bind roles, touch nodes, namespaces,
//     webhooks or CRDs, change its own Deployment or injection config), each with the reason.
// What a ServiceAccount with no bindings at all may do (the server's defaults for every
// authenticated user) is asked too, and counted as allowed for both.
//
// Helm comes from $CLUSTERPROF_HELM, scripts/install-helm's cache or PATH; without helm, the
// control plane or kubectl, the binary exits 77 (ctest: skipped) and says why.
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_join.h"
#include "common/base/status.h"
#include "common/base/strings.h"
#include "cpprest/json.h"
#include "gtest/gtest.h"
#include "operator/kube/resource.h"
#include "tests/operator/kube/kube_fixture.h"
#include "tests/support/kube_control_plane.h"
#include "tests/support/temp_dir.h"
#include "yaml-cpp/yaml.h"

namespace clusterprof {
namespace {

using testing::CommandResult;
using testing::TempDir;
using web::json::value;

constexpr char kSourceDir[] = CLUSTERPROF_SOURCE_DIR;
constexpr char kRelease[] = "clusterprof";
constexpr char kReleaseNamespace[] = "clusterprof-system";
// operator.watchNamespace: the operator of this release watches kWorkload only.
constexpr char kScopedRelease[] = "scoped";
constexpr char kScopedNamespace[] = "scoped-system";
constexpr char kWorkload[] = "training";
constexpr char kOtherTeam[] = "team-b";

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
      const std::string binary = entry.path().string() + "/helm";
      if (entry.path().filename().string().rfind("helm-", 0) == 0 &&
          access(binary.c_str(), X_OK) == 0) {
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

std::vector<std::string> Strings(const YAML::Node& node) {
  std::vector<std::string> out;
  if (node && node.IsSequence()) {
    for (const YAML::Node& item : node) out.push_back(item.as<std::string>());
  }
  return out;
}

// One rule of a Role or ClusterRole.
struct Rule {
  std::set<std::string> groups, resources, verbs, names;
};

// Rules that apply to the ServiceAccount: cluster-wide (a ClusterRoleBinding, `ns` empty) or in
// one namespace (a RoleBinding).
struct Grant {
  std::string ns;
  std::string role;  // "ClusterRole/name" or "Role/ns/name", for messages
  std::vector<Rule> rules;
};

// One question to the authorizer.
struct Request {
  std::string verb, group, resource, subresource, ns, name;
};

std::string Describe(const Request& r) {
  std::string out = StrCat(r.verb, " ", r.group.empty() ? "" : StrCat(r.group, "/"), r.resource,
                           r.subresource.empty() ? "" : StrCat("/", r.subresource));
  if (!r.name.empty()) StrAppend(&out, " ", r.name);
  StrAppend(&out, r.ns.empty() ? " (cluster-wide)" : StrCat(" in ", r.ns));
  return out;
}

bool Contains(const std::set<std::string>& set, const std::string& item) {
  return set.count(item) > 0 || set.count("*") > 0;
}

// Whether `grants` allow `r`, by Kubernetes' RBAC rules.
bool Grants(const std::vector<Grant>& grants, const Request& r) {
  const std::string resource =
      r.subresource.empty() ? r.resource : StrCat(r.resource, "/", r.subresource);
  for (const Grant& grant : grants) {
    if (!grant.ns.empty() && grant.ns != r.ns) continue;
    for (const Rule& rule : grant.rules) {
      if (!Contains(rule.groups, r.group) || !Contains(rule.resources, resource) ||
          !Contains(rule.verbs, r.verb)) {
        continue;
      }
      if (!rule.names.empty() && rule.names.count(r.name) == 0) continue;
      return true;
    }
  }
  return false;
}

// A rendered release: its RBAC objects and ServiceAccount, and what is bound to that account.
struct Install {
  std::string release;
  std::string ns;
  std::string service_account;  // "system:serviceaccount:<ns>:<name>"
  std::string manifests;        // the RBAC documents and the ServiceAccount, for kubectl apply
  std::vector<Grant> grants;
};

absl::StatusOr<Install> Render(const std::string& release, const std::string& ns,
                               const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {*helm,
                                   "template",
                                   release,
                                   StrCat(kSourceDir, "/helm/clusterprof"),
                                   "--namespace",
                                   ns,
                                   "--kube-version",
                                   "1.20.2",
                                   "--skip-tests",
                                   "--set",
                                   "image.registry=registry.example/clusterprof",
                                   "--set",
                                   StrCat("auth.namespaces={", kWorkload, "}")};
  argv.insert(argv.end(), extra.begin(), extra.end());
  absl::StatusOr<CommandResult> rendered = testing::RunCommand(argv, std::chrono::seconds(120));
  if (!rendered.ok()) return rendered.status();
  if (rendered->exit_code != 0) {
    return absl::InternalError(StrCat("helm template failed: ", Describe(*rendered)));
  }
  Install install;
  install.release = release;
  install.ns = ns;
  // The documents, each with its text as rendered (a YAML round trip would drop the quotes that
  // keep label values strings).
  std::vector<std::pair<YAML::Node, std::string>> docs;
  std::vector<std::string> chunks(1);
  std::istringstream lines(rendered->out);
  for (std::string line; std::getline(lines, line);) {
    if (line == "---") {
      chunks.emplace_back();
    } else {
      chunks.back() += line + "\n";
    }
  }
  try {
    for (const std::string& chunk : chunks) docs.emplace_back(YAML::Load(chunk), chunk);
  } catch (const YAML::Exception& e) {
    return absl::InternalError(StrCat("helm template's output is not YAML: ", e.what()));
  }
  std::map<std::string, std::vector<Rule>> roles;  // "ClusterRole/name" or "Role/ns/name"
  std::vector<YAML::Node> bindings;
  std::string account_ns, account_name;
  for (const auto& [doc, text] : docs) {
    if (!doc.IsMap() || !doc["kind"]) continue;
    const std::string kind = doc["kind"].as<std::string>();
    const std::string name = doc["metadata"]["name"].as<std::string>();
    const std::string doc_ns =
        doc["metadata"]["namespace"] ? doc["metadata"]["namespace"].as<std::string>() : "";
    if (kind == "ServiceAccount") {
      account_ns = doc_ns;
      account_name = name;
    } else if (kind == "ClusterRole" || kind == "Role") {
      std::vector<Rule> rules;
      for (const YAML::Node& rule : doc["rules"]) {
        Rule parsed;
        for (const std::string& group : Strings(rule["apiGroups"])) parsed.groups.insert(group);
        for (const std::string& resource : Strings(rule["resources"])) {
          parsed.resources.insert(resource);
        }
        for (const std::string& verb : Strings(rule["verbs"])) parsed.verbs.insert(verb);
        for (const std::string& item : Strings(rule["resourceNames"])) parsed.names.insert(item);
        rules.push_back(parsed);
      }
      roles[kind == "Role" ? StrCat("Role/", doc_ns, "/", name) : StrCat("ClusterRole/", name)] =
          rules;
    } else if (kind == "ClusterRoleBinding" || kind == "RoleBinding") {
      bindings.push_back(doc);
    } else {
      continue;
    }
    install.manifests += StrCat("---\n", text);
  }
  if (account_name.empty()) return absl::InternalError("the chart rendered no ServiceAccount");
  install.service_account = StrCat("system:serviceaccount:", account_ns, ":", account_name);
  for (const YAML::Node& binding : bindings) {
    bool ours = false;
    for (const YAML::Node& subject : binding["subjects"]) {
      ours = ours || (subject["kind"].as<std::string>() == "ServiceAccount" &&
                      subject["name"].as<std::string>() == account_name &&
                      subject["namespace"].as<std::string>() == account_ns);
    }
    if (!ours) continue;
    Grant grant;
    const bool namespaced = binding["kind"].as<std::string>() == "RoleBinding";
    grant.ns = namespaced ? binding["metadata"]["namespace"].as<std::string>() : "";
    const std::string ref_kind = binding["roleRef"]["kind"].as<std::string>();
    const std::string ref_name = binding["roleRef"]["name"].as<std::string>();
    grant.role = ref_kind == "Role" ? StrCat("Role/", grant.ns, "/", ref_name)
                                    : StrCat("ClusterRole/", ref_name);
    auto role = roles.find(grant.role);
    if (role == roles.end()) {
      return absl::InternalError(
          StrCat("the chart binds its ServiceAccount to ", grant.role,
                 ", which it does not render (a built-in role would grant more than it says)"));
    }
    grant.rules = role->second;
    install.grants.push_back(grant);
  }
  return install;
}

// A resource the matrix asks about.
struct Resource {
  std::string group, resource, subresource;
  bool namespaced = true;
  // Verbs beyond the eight usual ones that mean something for it.
  std::vector<std::string> special_verbs;
};

std::vector<Resource> Catalog() {
  return {
      // core
      {"", "pods"},
      {"", "pods", "exec"},
      {"", "pods", "attach"},
      {"", "pods", "portforward"},
      {"", "pods", "proxy"},
      {"", "pods", "log"},
      {"", "pods", "eviction"},
      {"", "pods", "ephemeralcontainers"},
      {"", "pods", "status"},
      {"", "pods", "binding"},
      {"", "secrets"},
      {"", "configmaps"},
      {"", "serviceaccounts", "", true, {"impersonate"}},
      {"", "serviceaccounts", "token"},
      {"", "services"},
      {"", "services", "proxy"},
      {"", "endpoints"},
      {"", "events"},
      {"", "persistentvolumeclaims"},
      {"", "resourcequotas"},
      {"", "namespaces", "", false},
      {"", "namespaces", "finalize", false},
      {"", "nodes", "", false},
      {"", "nodes", "proxy", false},
      {"", "nodes", "status", false},
      {"", "persistentvolumes", "", false},
      {"", "users", "", false, {"impersonate"}},
      {"", "groups", "", false, {"impersonate"}},
      // workloads
      {"apps", "deployments"},
      {"apps", "deployments", "scale"},
      {"apps", "daemonsets"},
      {"apps", "statefulsets"},
      {"batch", "jobs"},
      {"batch", "cronjobs"},
      // access control
      {"rbac.authorization.k8s.io", "roles", "", true, {"escalate", "bind"}},
      {"rbac.authorization.k8s.io", "rolebindings"},
      {"rbac.authorization.k8s.io", "clusterroles", "", false, {"escalate", "bind"}},
      {"rbac.authorization.k8s.io", "clusterrolebindings", "", false},
      {"authentication.k8s.io", "tokenreviews", "", false},
      {"authentication.k8s.io", "userextras", "scopes", false, {"impersonate"}},
      {"authorization.k8s.io", "subjectaccessreviews", "", false},
      {"certificates.k8s.io", "certificatesigningrequests", "", false},
      {"certificates.k8s.io", "certificatesigningrequests", "approval", false},
      {"certificates.k8s.io", "signers", "", false, {"approve", "sign"}},
      {"policy", "podsecuritypolicies", "", false, {"use"}},
      {"policy", "poddisruptionbudgets"},
      // the cluster's extension points
      {"admissionregistration.k8s.io", "mutatingwebhookconfigurations", "", false},
      {"admissionregistration.k8s.io", "validatingwebhookconfigurations", "", false},
      {"apiextensions.k8s.io", "customresourcedefinitions", "", false},
      {"networking.k8s.io", "networkpolicies"},
      {"coordination.k8s.io", "leases"},
      {"events.k8s.io", "events"},
      // clusterprof.io
      {"clusterprof.io", "profilejobs"},
      {"clusterprof.io", "profilejobs", "status"},
      {"clusterprof.io", "profilejobs", "finalizers"},
      {"clusterprof.io", "profileschedules"},
      {"clusterprof.io", "profileschedules", "status"},
      {"clusterprof.io", "profileschedules", "finalizers"},
      {"clusterprof.io", "profiletriggers"},
      {"clusterprof.io", "profiletriggers", "status"},
      {"clusterprof.io", "profiletriggers", "finalizers"},
  };
}

class OperatorRbacTest : public kube::KubeFixture {
 protected:
  static void SetUpTestSuite() {
    KubeFixture::SetUpTestSuite();
    if (start_status_->ok()) setup_ = new absl::Status(InstallBoth());
  }

  static void TearDownTestSuite() {
    delete setup_;
    setup_ = nullptr;
    delete default_install_;
    default_install_ = nullptr;
    delete scoped_install_;
    scoped_install_ = nullptr;
    KubeFixture::TearDownTestSuite();
  }

  void SetUp() override {
    KubeFixture::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    ASSERT_NE(setup_, nullptr);
    ASSERT_TRUE(setup_->ok()) << *setup_;
  }

  static std::string AdminKubeconfig() { return StrCat(plane_->dir(), "/rbac-admin.kubeconfig"); }

  static CommandResult Kubectl(std::vector<std::string> args) {
    std::vector<std::string> argv = {"kubectl", "--kubeconfig", AdminKubeconfig(),
                                     "--request-timeout=30s"};
    argv.insert(argv.end(), args.begin(), args.end());
    absl::StatusOr<CommandResult> result = testing::RunCommand(argv, std::chrono::seconds(90));
    if (result.ok()) return *std::move(result);
    CommandResult failed;
    failed.err = std::string(result.status().message());
    return failed;
  }

  // Renders both releases, creates their namespaces and the workload ones, and applies their
  // RBAC objects and ServiceAccounts.
  static absl::Status InstallBoth() {
    CLUSTERPROF_RETURN_IF_ERROR(plane_->WriteKubeconfig(AdminKubeconfig(), plane_->admin_token()));
    absl::StatusOr<Install> install = Render(kRelease, kReleaseNamespace, {});
    if (!install.ok()) return install.status();
    default_install_ = new Install(*std::move(install));
    install = Render(kScopedRelease, kScopedNamespace,
                     {"--set", StrCat("operator.watchNamespace=", kWorkload)});
    if (!install.ok()) return install.status();
    scoped_install_ = new Install(*std::move(install));
    for (const char* ns : {kReleaseNamespace, kScopedNamespace, kWorkload, kOtherTeam}) {
      const CommandResult created = Kubectl({"create", "namespace", ns});
      if (created.exit_code != 0) {
        return absl::InternalError(StrCat("kubectl create namespace failed: ", Describe(created)));
      }
    }
    for (const Install* rendered : {default_install_, scoped_install_}) {
      const std::string file = StrCat(plane_->dir(), "/", rendered->release, "-rbac.yaml");
      testing::WriteFileOrDie(file, rendered->manifests);
      const CommandResult applied = Kubectl({"apply", "-f", file});
      if (applied.exit_code != 0) {
        return absl::InternalError(StrCat("kubectl apply of the RBAC failed: ", Describe(applied)));
      }
    }
    return absl::OkStatus();
  }

  // The groups the API server gives a ServiceAccount's token.
  static std::vector<std::string> GroupsOf(const std::string& service_account) {
    const std::string ns =
        service_account.substr(0, service_account.rfind(':'));  // system:serviceaccount:<ns>
    return {"system:serviceaccounts",
            StrCat("system:serviceaccounts:", ns.substr(ns.rfind(':') + 1)),
            "system:authenticated"};
  }

  // The API server's answer: may `user` do `r`?
  bool Allowed(const std::string& user, const Request& r) {
    value review = value::object();
    review["apiVersion"] = value::string("authorization.k8s.io/v1");
    review["kind"] = value::string("SubjectAccessReview");
    review["spec"]["user"] = value::string(user);
    const std::vector<std::string> groups = GroupsOf(user);
    review["spec"]["groups"] = value::array(groups.size());
    for (size_t i = 0; i < groups.size(); ++i) {
      review["spec"]["groups"][i] = value::string(groups[i]);
    }
    value& attributes = review["spec"]["resourceAttributes"];
    attributes["verb"] = value::string(r.verb);
    attributes["group"] = value::string(r.group);
    attributes["resource"] = value::string(r.resource);
    if (!r.subresource.empty()) attributes["subresource"] = value::string(r.subresource);
    if (!r.ns.empty()) attributes["namespace"] = value::string(r.ns);
    if (!r.name.empty()) attributes["name"] = value::string(r.name);
    absl::StatusOr<value> answered = admin_->Create(SubjectAccessReviews(), "", review);
    EXPECT_TRUE(answered.ok()) << Describe(r) << ": " << answered.status();
    if (!answered.ok() || !answered->has_object_field("status")) return false;
    const value& status = answered->at("status");
    return status.has_boolean_field("allowed") && status.at("allowed").as_bool();
  }

  // The rules the API server lists for `user` in `ns` (a SelfSubjectRulesReview made as that
  // user: kubectl --as, which the admin may), as (group, resource, verb, name) tuples; name ""
  // when the rule names none.
  std::set<std::string> ServerRules(const std::string& user, const std::string& ns) {
    value review = value::object();
    review["apiVersion"] = value::string("authorization.k8s.io/v1");
    review["kind"] = value::string("SelfSubjectRulesReview");
    review["spec"]["namespace"] = value::string(ns);
    const std::string file = StrCat(plane_->dir(), "/rules-review.json");
    testing::WriteFileOrDie(file, review.serialize());
    const CommandResult created = Kubectl({"create", "-f", file, "-o", "json", "--as", user});
    EXPECT_EQ(created.exit_code, 0) << user << " in " << ns << ": " << Describe(created);
    std::error_code error;
    const value answered = value::parse(created.out, error);
    EXPECT_FALSE(error) << created.out;
    if (created.exit_code != 0 || error || !answered.has_object_field("status")) return {};
    const value& status = answered.at("status");
    EXPECT_FALSE(status.has_boolean_field("incomplete") && status.at("incomplete").as_bool())
        << answered.serialize();
    std::set<std::string> tuples;
    for (const value& rule : status.at("resourceRules").as_array()) {
      auto strings = [&](const char* field) {
        std::vector<std::string> out;
        if (rule.has_array_field(field)) {
          for (const value& item : rule.at(field).as_array()) out.push_back(item.as_string());
        }
        return out;
      };
      std::vector<std::string> names = strings("resourceNames");
      if (names.empty()) names.push_back("");
      for (const std::string& group : strings("apiGroups")) {
        for (const std::string& resource : strings("resources")) {
          for (const std::string& verb : strings("verbs")) {
            for (const std::string& name : names) {
              tuples.insert(StrCat(group, " ", resource, " ", verb, " ", name));
            }
          }
        }
      }
    }
    return tuples;
  }

  // The same tuples from the rendered grants that apply in `ns`.
  static std::set<std::string> RenderedRules(const Install& install, const std::string& ns) {
    std::set<std::string> tuples;
    for (const Grant& grant : install.grants) {
      if (!grant.ns.empty() && grant.ns != ns) continue;
      for (const Rule& rule : grant.rules) {
        std::set<std::string> names = rule.names;
        if (names.empty()) names.insert("");
        for (const std::string& group : rule.groups) {
          for (const std::string& resource : rule.resources) {
            for (const std::string& verb : rule.verbs) {
              for (const std::string& name : names) {
                tuples.insert(StrCat(group, " ", resource, " ", verb, " ", name));
              }
            }
          }
        }
      }
    }
    return tuples;
  }

  // Every (resource, verb, namespace) of the catalog, plus the Lease by name.
  static std::vector<Request> Matrix(const Install& install) {
    static const std::vector<std::string> kVerbs = {
        "get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"};
    std::vector<Request> requests;
    for (const Resource& resource : Catalog()) {
      std::vector<std::string> namespaces = {""};
      if (resource.namespaced) {
        namespaces = {install.ns, kWorkload, kOtherTeam, "kube-system", ""};
      }
      std::vector<std::string> verbs = kVerbs;
      verbs.insert(verbs.end(), resource.special_verbs.begin(), resource.special_verbs.end());
      for (const std::string& ns : namespaces) {
        for (const std::string& verb : verbs) {
          requests.push_back({verb, resource.group, resource.resource, resource.subresource, ns});
        }
      }
    }
    for (const std::string& ns : {install.ns, std::string(kWorkload)}) {
      for (const char* name : {"clusterprof-operator", "kube-controller-manager"}) {
        for (const char* verb : {"get", "update", "patch", "delete"}) {
          requests.push_back({verb, "coordination.k8s.io", "leases", "", ns, name});
        }
      }
    }
    return requests;
  }

  // The matrix asked of the server for `install`'s ServiceAccount, against the rendered rules.
  void ExpectExactlyTheRenderedGrants(const Install& install) {
    const std::string nobody = StrCat("system:serviceaccount:", kOtherTeam, ":nobody");
    int allowed = 0, asked = 0;
    std::vector<std::string> baseline;
    for (const Request& r : Matrix(install)) {
      auto [cached, fresh] = by_default_.try_emplace(Describe(r), false);
      if (fresh) cached->second = Allowed(nobody, r);
      const bool by_default = cached->second;
      if (by_default) baseline.push_back(Describe(r));
      const bool expected = by_default || Grants(install.grants, r);
      const bool answered = Allowed(install.service_account, r);
      EXPECT_EQ(answered, expected) << install.service_account << ": " << Describe(r) << " is "
                                    << (answered ? "allowed" : "refused") << ", the rendered roles "
                                    << (expected ? "allow" : "do not allow") << " it";
      allowed += answered;
      ++asked;
    }
    std::cout << install.service_account << ": " << asked << " requests asked, " << allowed
              << " allowed; allowed to every authenticated account: "
              << (baseline.empty() ? "none" : absl::StrJoin(baseline, ", ")) << "\n";
    EXPECT_GT(allowed, 0);
  }

  static kube::ResourceType SubjectAccessReviews() {
    return {"authorization.k8s.io", "v1", "subjectaccessreviews", "SubjectAccessReview", false};
  }

  // What every authenticated account may do, by Describe(request).
  static inline std::map<std::string, bool> by_default_;
  static inline absl::Status* setup_ = nullptr;
  static inline Install* default_install_ = nullptr;
  static inline Install* scoped_install_ = nullptr;
};

TEST_F(OperatorRbacTest, TheServiceAccountIsAllowedExactlyWhatTheRenderedRolesGrant) {
  ExpectExactlyTheRenderedGrants(*default_install_);
}

TEST_F(OperatorRbacTest, WithWatchNamespaceTheServiceAccountIsAllowedExactlyItsGrants) {
  ExpectExactlyTheRenderedGrants(*scoped_install_);
}

// The server's own list of the ServiceAccount's rules, namespace by namespace: the rendered
// rules that apply there, plus what every authenticated account gets, and nothing more.
TEST_F(OperatorRbacTest, TheServersRulesForTheServiceAccountAreTheRenderedOnes) {
  const std::string nobody = StrCat("system:serviceaccount:", kOtherTeam, ":nobody");
  for (const Install* install : {default_install_, scoped_install_}) {
    for (const std::string& ns : {install->ns, std::string(kWorkload), std::string(kOtherTeam),
                                  std::string("kube-system")}) {
      SCOPED_TRACE(StrCat(install->service_account, " in ", ns));
      std::set<std::string> expected = RenderedRules(*install, ns);
      const std::set<std::string> by_default = ServerRules(nobody, ns);
      expected.insert(by_default.begin(), by_default.end());
      const std::set<std::string> server = ServerRules(install->service_account, ns);
      std::vector<std::string> extra, missing;
      std::set_difference(server.begin(), server.end(), expected.begin(), expected.end(),
                          std::back_inserter(extra));
      std::set_difference(expected.begin(), expected.end(), server.begin(), server.end(),
                          std::back_inserter(missing));
      EXPECT_TRUE(extra.empty()) << "granted beyond the chart: " << absl::StrJoin(extra, "; ");
      EXPECT_TRUE(missing.empty()) << "rendered but not granted: " << absl::StrJoin(missing, "; ");
    }
  }
}

// What the operator must never be able to do, whatever the chart's next version adds by
// accident: each is a way out of "profiles pods" into running code, reading secrets or owning
// the cluster.
TEST_F(OperatorRbacTest, TheServiceAccountCanNeverReachBeyondProfiling) {
  const std::string release = kReleaseNamespace;
  const std::string nobody = StrCat("system:serviceaccount:", kOtherTeam, ":nobody");
  const std::vector<std::pair<Request, std::string>> denied = {
      // Secrets: the sidecar token, the webhook's TLS key, every other workload's.
      {{"get", "", "secrets", "", release}, "read the token and webhook key Secrets"},
      {{"list", "", "secrets", "", release}, "read the token and webhook key Secrets"},
      {{"get", "", "secrets", "", kWorkload, "clusterprof-sidecar-token"},
       "read the workload namespace's copy of the token"},
      {{"list", "", "secrets", "", kWorkload}, "read a workload's Secrets"},
      {{"watch", "", "secrets", "", ""}, "read every Secret"},
      {{"list", "", "secrets", "", "kube-system"}, "read the control plane's Secrets"},
      // Pods: run code, or reach into a running one.
      {{"create", "", "pods", "", kWorkload}, "run a pod (and mount any Secret of its namespace)"},
      {{"delete", "", "pods", "", kWorkload}, "kill a workload"},
      {{"patch", "", "pods", "", kWorkload}, "change a pod (its labels move it between jobs)"},
      {{"get", "", "pods", "", kWorkload}, "(needs only list and watch)"},
      {{"create", "", "pods", "exec", kWorkload}, "exec into a pod"},
      {{"get", "", "pods", "exec", kWorkload}, "exec into a pod over a websocket"},
      {{"create", "", "pods", "attach", kWorkload}, "attach to a pod"},
      {{"create", "", "pods", "portforward", kWorkload}, "port-forward (loopback needs no token)"},
      {{"get", "", "pods", "portforward", kWorkload}, "port-forward over a websocket"},
      {{"get", "", "pods", "proxy", kWorkload}, "proxy to a pod"},
      {{"get", "", "pods", "log", kWorkload}, "read a workload's logs"},
      {{"update", "", "pods", "ephemeralcontainers", kWorkload}, "add a debug container"},
      {{"create", "", "pods", "eviction", kWorkload}, "evict a workload"},
      {{"patch", "", "pods", "status", kWorkload}, "forge a pod's readiness or IP"},
      // Identities.
      {{"create", "", "serviceaccounts", "token", release}, "mint its own tokens"},
      {{"create", "", "serviceaccounts", "token", kWorkload}, "mint a workload's tokens"},
      {{"impersonate", "", "users", "", ""}, "impersonate a user"},
      {{"impersonate", "", "groups", "", ""}, "impersonate system:masters"},
      {{"impersonate", "", "serviceaccounts", "", kWorkload}, "impersonate a workload"},
      {{"create", "authentication.k8s.io", "tokenreviews", "", ""}, "check others' tokens"},
      // RBAC.
      {{"escalate", "rbac.authorization.k8s.io", "clusterroles", "", ""}, "grant itself more"},
      {{"bind", "rbac.authorization.k8s.io", "clusterroles", "", ""}, "bind cluster-admin"},
      {{"update", "rbac.authorization.k8s.io", "clusterroles", "", "", "clusterprof-operator"},
       "widen its own ClusterRole"},
      {{"create", "rbac.authorization.k8s.io", "clusterrolebindings", "", ""}, "bind anything"},
      {{"create", "rbac.authorization.k8s.io", "rolebindings", "", kWorkload}, "bind in a team"},
      {{"escalate", "rbac.authorization.k8s.io", "roles", "", release}, "escalate a Role"},
      // Nodes and namespaces.
      {{"patch", "", "nodes", "", ""}, "label or taint nodes"},
      {{"get", "", "nodes", "proxy", ""}, "reach a kubelet's API"},
      {{"create", "", "nodes", "proxy", ""}, "exec through a kubelet"},
      {{"create", "", "namespaces", "", ""}, "create namespaces"},
      {{"delete", "", "namespaces", "", "", kWorkload}, "delete a team's namespace"},
      {{"patch", "", "namespaces", "", "", kWorkload}, "label a namespace for injection"},
      // Its own install and the cluster's extension points.
      {{"patch", "admissionregistration.k8s.io", "mutatingwebhookconfigurations", "", "",
        "clusterprof-sidecar-injector"},
       "change what its webhook is sent"},
      {{"create", "admissionregistration.k8s.io", "validatingwebhookconfigurations", "", ""},
       "intercept the cluster's requests"},
      {{"update", "apiextensions.k8s.io", "customresourcedefinitions", "", "",
        "profilejobs.clusterprof.io"},
       "change the ProfileJob schema"},
      {{"update", "apps", "deployments", "", release, "clusterprof-operator"},
       "change its own Deployment (image, flags)"},
      {{"update", "", "configmaps", "", release, "clusterprof-injection"},
       "change what the webhook injects"},
      {{"create", "certificates.k8s.io", "certificatesigningrequests", "", ""},
       "ask for a certificate"},
      {{"update", "certificates.k8s.io", "certificatesigningrequests", "approval", ""},
       "approve a certificate"},
      {{"create", "networking.k8s.io", "networkpolicies", "", kWorkload},
       "open the sidecars' port to others"},
      {{"use", "policy", "podsecuritypolicies", "", ""}, "use a privileged pod policy"},
      // Leases other than its own.
      {{"create", "coordination.k8s.io", "leases", "", kWorkload}, "a Lease outside its namespace"},
      {{"update", "coordination.k8s.io", "leases", "", release, "other"}, "another Lease"},
      {{"update", "coordination.k8s.io", "leases", "", "kube-system", "kube-controller-manager"},
       "take the controller manager's leadership"},
      {{"delete", "coordination.k8s.io", "leases", "", release, "clusterprof-operator"},
       "(needs only get and update of its Lease)"},
      // Users' objects: it writes their status, never their spec.
      {{"update", "clusterprof.io", "profilejobs", "", kWorkload}, "rewrite a user's ProfileJob"},
      {{"patch", "clusterprof.io", "profilejobs", "", kWorkload}, "rewrite a user's ProfileJob"},
      {{"create", "clusterprof.io", "profileschedules", "", kWorkload}, "schedule captures"},
      {{"delete", "clusterprof.io", "profileschedules", "", kWorkload}, "delete a schedule"},
      {{"create", "clusterprof.io", "profiletriggers", "", kWorkload}, "set up captures"},
      {{"update", "clusterprof.io", "profiletriggers", "", kWorkload}, "rewrite a trigger"},
      {{"get", "", "events", "", kWorkload}, "(writes events, reads none)"},
      {{"delete", "", "events", "", kWorkload}, "erase events"},
  };
  for (const auto& [r, why] : denied) {
    EXPECT_FALSE(Allowed(default_install_->service_account, r))
        << default_install_->service_account << " may " << Describe(r) << ": it could " << why;
    EXPECT_FALSE(Allowed(scoped_install_->service_account, r))
        << scoped_install_->service_account << " may " << Describe(r) << ": it could " << why;
    EXPECT_FALSE(Allowed(nobody, r)) << "every account may " << Describe(r)
                                     << ": this server's defaults make the check meaningless";
  }

  // And what it needs, so that the refusals above are not a server that refuses everything.
  for (const Request& r : std::vector<Request>{
           {"list", "", "pods", "", ""},
           {"watch", "", "pods", "", kOtherTeam},
           {"create", "", "events", "", kWorkload},
           {"patch", "clusterprof.io", "profilejobs", "status", kWorkload},
           {"delete", "clusterprof.io", "profilejobs", "", kOtherTeam},
           {"update", "clusterprof.io", "profiletriggers", "status", kWorkload},
           {"create", "coordination.k8s.io", "leases", "", release},
           {"update", "coordination.k8s.io", "leases", "", release, "clusterprof-operator"},
       }) {
    EXPECT_TRUE(Allowed(default_install_->service_account, r)) << Describe(r);
  }
}

// With operator.watchNamespace the operator reaches that namespace only.
TEST_F(OperatorRbacTest, WithWatchNamespaceNothingOutsideThatNamespaceIsReachable) {
  const std::string account = scoped_install_->service_account;
  EXPECT_TRUE(Allowed(account, {"list", "", "pods", "", kWorkload}));
  EXPECT_TRUE(Allowed(account, {"update", "clusterprof.io", "profilejobs", "status", kWorkload}));
  for (const Request& r : std::vector<Request>{
           {"list", "", "pods", "", ""},
           {"list", "", "pods", "", kOtherTeam},
           {"watch", "", "pods", "", kReleaseNamespace},
           {"list", "clusterprof.io", "profilejobs", "", ""},
           {"list", "clusterprof.io", "profilejobs", "", kOtherTeam},
           {"update", "clusterprof.io", "profilejobs", "status", kOtherTeam},
           {"create", "", "events", "", kOtherTeam},
           {"create", "", "events", "", "kube-system"},
       }) {
    EXPECT_FALSE(Allowed(account, r)) << Describe(r);
  }
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
