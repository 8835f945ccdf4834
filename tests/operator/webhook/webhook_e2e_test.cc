// The injection webhook end to end: the clusterprof-operator binary serving it over HTTPS, a
// MutatingWebhookConfiguration registered with the real kube-apiserver (tests/support), and the
// example pods created through the API server, which calls the webhook, applies its patch,
// validates the result and stores it. The API server here is Kubernetes 1.20, older than native
// sidecars (1.29), so the injection config asks for a regular container, as the chart's
// sidecar.nativeSidecar=false does.
#include <signal.h>

#include <thread>

#include "absl/strings/escaping.h"
#include "common/base/strings.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "operator/kube/resource.h"
#include "tests/operator/crd_fixture.h"
#include "tests/operator/kube/kube_fixture.h"
#include "tests/operator/webhook/webhook_test_util.h"
#include "tests/support/local_http.h"
#include "tests/support/subprocess.h"
#include "tests/support/temp_dir.h"
#include "tests/support/test_certificates.h"

namespace clusterprof {
namespace {

using ::testing::AllOf;
using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::Not;
using web::json::value;

constexpr char kSourceDir[] = CLUSTERPROF_SOURCE_DIR;
constexpr char kOperator[] = CLUSTERPROF_OPERATOR_PATH;
constexpr char kWebhookConfig[] = "clusterprof-e2e-sidecar-injector";

std::string Example(const std::string& name) {
  return StrCat(kSourceDir, "/examples/injection/", name);
}

class WebhookE2eTest : public kube::KubeFixture {
 protected:
  static inline std::string* kubeconfig_ = nullptr;
  static inline absl::Status* crds_ = nullptr;

  static void SetUpTestSuite() {
    KubeFixture::SetUpTestSuite();
    if (plane_ == nullptr) return;
    kubeconfig_ = new std::string(plane_->dir() + "/admin.kubeconfig");
    crds_ = new absl::Status(testing::InstallCrds(*plane_, kSourceDir, *kubeconfig_));
  }

  void SetUp() override {
    KubeFixture::SetUp();
    if (IsSkipped()) return;
    if (crds_ != nullptr && absl::IsNotFound(*crds_)) GTEST_SKIP() << *crds_;
    ASSERT_TRUE(crds_ != nullptr && crds_->ok()) << *crds_;
    absl::StatusOr<testing::TestCertificates> certificates =
        testing::MakeTestCertificates(certs_.path());
    ASSERT_TRUE(certificates.ok()) << certificates.status();
    certificates_ = *certificates;
    // The settings a chart renders for a cluster older than 1.29 (this API server is 1.20): a
    // regular sidecar container, a token Secret, a TLS Secret, a logdir.
    testing::WriteFileOrDie(root_.Join("injection.yaml"), R"(image: clusterprof/sidecar:e2e
native_sidecar: false
token_secret: clusterprof-sidecar-token
tls_secret: clusterprof-sidecar-tls
allowed_logdirs: ["gs://profiles/runs"]
)");
    StartOperator();
    ASSERT_NO_FATAL_FAILURE(RegisterWebhook());
  }

  void TearDown() override {
    if (plane_ != nullptr && admin_ != nullptr) {
      (void)admin_->Raw("DELETE", StrCat("/apis/admissionregistration.k8s.io/v1/"
                                         "mutatingwebhookconfigurations/",
                                         kWebhookConfig));
    }
    if (HasFailure() && testing::FileExists(operator_log_)) {
      std::cerr << "---- operator log ----\n" << testing::ReadFileOrDie(operator_log_) << "\n";
    }
    operator_.reset();
    KubeFixture::TearDown();
  }

  void StartOperator() {
    operator_log_ = root_.Join("operator.log");
    port_file_ = root_.Join("operator.ports");
    std::remove(port_file_.c_str());  // a restart must not read its predecessor's ports
    operator_ =
        std::make_unique<testing::Subprocess>(std::vector<std::string>{kOperator,
                                                                       "--kubeconfig",
                                                                       *kubeconfig_,
                                                                       "--namespace",
                                                                       ns_,
                                                                       "--health-port",
                                                                       "0",
                                                                       "--health-address",
                                                                       "127.0.0.1",
                                                                       "--webhook-port",
                                                                       "0",
                                                                       "--webhook-address",
                                                                       "127.0.0.1",
                                                                       "--webhook-cert-dir",
                                                                       certs_.path(),
                                                                       "--injection-config",
                                                                       root_.Join("injection.yaml"),
                                                                       "--port-file",
                                                                       port_file_,
                                                                       "--log-format",
                                                                       "text",
                                                                       "--log-level",
                                                                       "debug"},
                                              std::map<std::string, std::string>{}, operator_log_);
    ASSERT_TRUE(Eventually(
        [&] {
          return testing::FileExists(port_file_) &&
                 testing::ReadPortFile(port_file_)["webhook"] > 0;
        },
        std::chrono::seconds(30)))
        << "the operator did not start its webhook";
    webhook_port_ = testing::ReadPortFile(port_file_)["webhook"];
    http_port_ = testing::ReadPortFile(port_file_)["http"];
  }

  // The chart's two webhooks (pods labelled, namespaces labelled), limited to namespaces this
  // test labels clusterprof-e2e=<test namespace> so that the shared control plane's other
  // namespaces are never touched.
  void RegisterWebhook() {
    const std::string ca = testing::ReadFileOrDie(certificates_.ca_file);
    auto webhook = [&](const std::string& name, value namespace_labels, value object_selector) {
      value hook = value::object();
      hook["name"] = value::string(name);
      hook["admissionReviewVersions"][0] = value::string("v1");
      hook["sideEffects"] = value::string("None");
      hook["failurePolicy"] = value::string("Ignore");
      hook["timeoutSeconds"] = value::number(5);
      hook["reinvocationPolicy"] = value::string("Never");
      hook["clientConfig"]["url"] =
          value::string(StrCat("https://127.0.0.1:", webhook_port_, "/mutate-pods"));
      hook["clientConfig"]["caBundle"] =
          value::string(std::string(StdView(absl::Base64Escape(ca))));
      hook["rules"][0]["apiGroups"][0] = value::string("");
      hook["rules"][0]["apiVersions"][0] = value::string("v1");
      hook["rules"][0]["resources"][0] = value::string("pods");
      hook["rules"][0]["operations"][0] = value::string("CREATE");
      hook["rules"][0]["scope"] = value::string("Namespaced");
      hook["namespaceSelector"]["matchLabels"] = namespace_labels;
      hook["objectSelector"] = object_selector;
      return hook;
    };
    value by_pod_ns = value::object();
    by_pod_ns["clusterprof-e2e"] = value::string(ns_);
    value by_pod = value::object();
    by_pod["matchLabels"]["clusterprof.io/inject"] = value::string("true");
    value by_ns_ns = by_pod_ns;
    by_ns_ns["clusterprof.io/inject"] = value::string("true");
    value by_ns = value::object();
    by_ns["matchExpressions"][0]["key"] = value::string("clusterprof.io/inject");
    by_ns["matchExpressions"][0]["operator"] = value::string("NotIn");
    by_ns["matchExpressions"][0]["values"][0] = value::string("false");
    value config = value::object();
    config["apiVersion"] = value::string("admissionregistration.k8s.io/v1");
    config["kind"] = value::string("MutatingWebhookConfiguration");
    config["metadata"]["name"] = value::string(kWebhookConfig);
    config["webhooks"][0] = webhook("pod-label.sidecar.clusterprof.io", by_pod_ns, by_pod);
    config["webhooks"][1] = webhook("namespaces.sidecar-injector.clusterprof.io", by_ns_ns, by_ns);
    absl::StatusOr<kube::RestResponse> created =
        admin_->Raw("POST", "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
                    config.serialize());
    ASSERT_TRUE(created.ok()) << created.status();
    ASSERT_EQ(created->http_code, 201) << created->body;
    LabelNamespace(ns_, {{"clusterprof-e2e", ns_}});
    // The API server picks the configuration up from a watch.
    ASSERT_NO_FATAL_FAILURE(WaitUntilInjected(testing::ExamplePod(Example("tpu-jax-pod.yaml"))));
    baseline_injected_ = Admissions("injected");
  }

  // Dry-runs `pod` (dry runs call webhooks without side effects) until it comes back injected:
  // the API server matches webhooks against its own caches of the configuration and of the
  // namespaces' labels, which follow changes a moment later.
  void WaitUntilInjected(const value& pod) {
    std::string last;
    const bool injected = Eventually(
        [&] {
          absl::StatusOr<kube::RestResponse> response = admin_->Raw(
              "POST", StrCat("/api/v1/namespaces/", ns_, "/pods?dryRun=All"), pod.serialize());
          last = response.ok() ? StrCat(response->http_code, " ", response->body)
                               : std::string(response.status().message());
          return response.ok() && response->http_code == 201 &&
                 response->body.find("clusterprof-sidecar") != std::string::npos;
        },
        std::chrono::seconds(30));
    ASSERT_TRUE(injected) << "the API server never called the webhook; the last dry run: " << last;
  }

  void LabelNamespace(const std::string& ns, const std::map<std::string, std::string>& labels) {
    value patch = value::object();
    for (const auto& [key, v] : labels) patch["metadata"]["labels"][key] = value::string(v);
    absl::StatusOr<value> patched =
        admin_->Patch(kube::Namespaces(), "", ns, kube::PatchType::kMerge, patch);
    ASSERT_TRUE(patched.ok()) << patched.status();
  }

  // Creates the example's pod in `ns` through the API server; returns the stored pod.
  value CreatePod(const std::string& example, const std::string& ns,
                  const std::function<void(value&)>& edit = nullptr) {
    value pod = testing::ExamplePod(Example(example));
    if (pod.at("metadata").has_field("namespace")) pod["metadata"].erase("namespace");
    if (edit) edit(pod);
    absl::StatusOr<value> created = admin_->Create(kube::Pods(), ns, pod);
    EXPECT_TRUE(created.ok()) << created.status();
    return created.ok() ? *created : value::null();
  }

  static bool Injected(const value& pod) {
    return pod.is_object() && testing::FindContainer(pod, "clusterprof-sidecar") != nullptr;
  }

  double Admissions(const std::string& outcome) const {
    return testing::MetricSum(testing::HttpGet(http_port_, "/metrics"),
                              "clusterprof_webhook_admissions_total",
                              StrCat("outcome=\"", outcome, "\""));
  }

  testing::TempDir root_;
  testing::TempDir certs_;
  testing::TestCertificates certificates_;
  std::unique_ptr<testing::Subprocess> operator_;
  std::string operator_log_;
  std::string port_file_;
  int webhook_port_ = 0;
  int http_port_ = 0;
  double baseline_injected_ = 0;
};

TEST_F(WebhookE2eTest, LabelledGpuPodIsInjectedByTheApiServer) {
  const value pod = CreatePod("gpu-pod.yaml", ns_);
  ASSERT_TRUE(Injected(pod)) << pod.serialize();
  // Kubernetes 1.20: a regular container.
  const value* sidecar = testing::FindContainer(pod, "clusterprof-sidecar", "containers");
  ASSERT_NE(sidecar, nullptr);
  EXPECT_FALSE(sidecar->has_field("restartPolicy"));
  EXPECT_THAT(testing::ReadFileOrDie(operator_log_), HasSubstr("(regular sidecar)"));
  EXPECT_EQ(sidecar->at("image").as_string(), "clusterprof/sidecar:e2e");
  EXPECT_THAT(testing::Args(*sidecar),
              AllOf(Contains("--auth-token-file=/etc/clusterprof/token/token"),
                    Contains("--token-grace-seconds=300"),
                    Contains("--tls-cert-file=/etc/clusterprof/tls/tls.crt"),
                    Contains("--tls-key-file=/etc/clusterprof/tls/tls.key"),
                    Contains("--allowed-logdir=gs://profiles/runs"),
                    Contains("--install-injection-library=/usr/lib/clusterprof/"
                             "libclusterprof_cupti.so")));
  // The server stored the TLS Secret's volume as the patch made it: optional (the namespace has
  // no such Secret), whole, mounted read-only in the sidecar only.
  const value* tls = nullptr;
  for (const value& volume : pod.at("spec").at("volumes").as_array()) {
    if (volume.at("name").as_string() == "clusterprof-tls") tls = &volume;
  }
  ASSERT_NE(tls, nullptr) << pod.serialize();
  EXPECT_EQ(tls->at("secret").at("secretName").as_string(), "clusterprof-sidecar-tls");
  EXPECT_TRUE(tls->at("secret").at("optional").as_bool());
  EXPECT_FALSE(tls->at("secret").has_field("items"));
  for (const char* name : {"fetch-data", "trainer", "metrics-exporter", "clusterprof-sidecar"}) {
    bool mounted = false;
    for (const value& mount : testing::FindContainer(pod, name)->at("volumeMounts").as_array()) {
      if (mount.at("name").as_string() != "clusterprof-tls") continue;
      mounted = true;
      EXPECT_EQ(mount.at("mountPath").as_string(), "/etc/clusterprof/tls");
      EXPECT_TRUE(mount.at("readOnly").as_bool());
      EXPECT_FALSE(mount.has_field("subPath"));
    }
    EXPECT_EQ(mounted, std::string(name) == "clusterprof-sidecar") << name;
  }
  const value& trainer = *testing::FindContainer(pod, "trainer");
  EXPECT_EQ(testing::EnvValue(trainer, "CUDA_INJECTION64_PATH"),
            "/var/run/clusterprof/libclusterprof_cupti.so");
  for (const char* name : {"fetch-data", "trainer", "metrics-exporter", "clusterprof-sidecar"}) {
    const value* container = testing::FindContainer(pod, name);
    ASSERT_NE(container, nullptr) << name;
    EXPECT_TRUE(testing::MountsShm(*container)) << name;
  }
  EXPECT_EQ(pod.at("metadata").at("labels").at("clusterprof.io/injected").as_string(), "true");
  // The API server defaulted what the patch left out, as for any container.
  EXPECT_EQ(sidecar->at("terminationMessagePolicy").as_string(), "File");
  EXPECT_EQ(Admissions("injected") - baseline_injected_, 1);
}

TEST_F(WebhookE2eTest, NamespaceLabelInjectsEveryPodButThoseThatOptOut) {
  LabelNamespace(ns_, {{"clusterprof.io/inject", "true"}});
  ASSERT_NO_FATAL_FAILURE(WaitUntilInjected(testing::ExamplePod(Example("gpu-job.yaml"))));
  // A Job's pod: no label of its own.
  const value job_pod = CreatePod("gpu-job.yaml", ns_);
  EXPECT_TRUE(Injected(job_pod)) << job_pod.serialize();
  // Matched by both webhooks: still one sidecar.
  const value labelled = CreatePod("tpu-jax-pod.yaml", ns_);
  ASSERT_TRUE(Injected(labelled)) << labelled.serialize();
  int sidecars = 0;
  for (const value& container : labelled.at("spec").at("containers").as_array()) {
    sidecars += container.at("name").as_string() == "clusterprof-sidecar";
  }
  EXPECT_EQ(sidecars, 1);
  EXPECT_THAT(testing::Args(*testing::FindContainer(labelled, "clusterprof-sidecar")),
              Contains("--framework-profiler=localhost:9012"));
  // Opted out.
  const value opted_out = CreatePod("gpu-pod.yaml", ns_, [](value& pod) {
    pod["metadata"]["name"] = value::string("opted-out");
    pod["metadata"]["labels"]["clusterprof.io/inject"] = value::string("false");
  });
  EXPECT_FALSE(Injected(opted_out)) << opted_out.serialize();
  EXPECT_EQ(
      testing::EnvValue(*testing::FindContainer(opted_out, "trainer"), "CUDA_INJECTION64_PATH"),
      "<unset>");
}

TEST_F(WebhookE2eTest, UnlabelledPodsAreLeftAlone) {
  const value pod = CreatePod("gpu-pod.yaml", ns_, [](value& pod) {
    pod["metadata"]["labels"].erase("clusterprof.io/inject");
  });
  EXPECT_FALSE(Injected(pod)) << pod.serialize();
  EXPECT_EQ(Admissions("injected") - baseline_injected_, 0);
}

TEST_F(WebhookE2eTest, ABadAnnotationAdmitsThePodUnchanged) {
  const value pod = CreatePod("gpu-pod.yaml", ns_, [](value& pod) {
    pod["metadata"]["annotations"]["clusterprof.io/sidecar-memory-limit"] =
        value::string("two gigs");
  });
  ASSERT_TRUE(pod.is_object());
  EXPECT_FALSE(Injected(pod));
  EXPECT_EQ(Admissions("invalid"), 1);
  EXPECT_THAT(testing::ReadFileOrDie(operator_log_),
              HasSubstr("clusterprof.io/sidecar-memory-limit=\"two gigs\""));
}

TEST_F(WebhookE2eTest, PodsAreCreatedWhileTheWebhookIsDown) {
  operator_->Signal(SIGKILL);
  operator_->Wait();
  // failurePolicy Ignore: the API server cannot reach the webhook and admits the pod as it is.
  const value pod = CreatePod("gpu-pod.yaml", ns_);
  ASSERT_TRUE(pod.is_object()) << "pod creation was blocked";
  EXPECT_FALSE(Injected(pod));
  // Back up (on a new port): injection resumes.
  StartOperator();
  (void)admin_->Raw("DELETE", StrCat("/apis/admissionregistration.k8s.io/v1/"
                                     "mutatingwebhookconfigurations/",
                                     kWebhookConfig));
  ASSERT_NO_FATAL_FAILURE(RegisterWebhook());
  const value next = CreatePod("tpu-jax-pod.yaml", ns_);
  EXPECT_TRUE(Injected(next)) << next.serialize();
}

}  // namespace
}  // namespace clusterprof
