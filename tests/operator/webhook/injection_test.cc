// Sidecar injection (operator/webhook/injection.h): the patches for the example pods, applied
// and read back; idempotence; opt-outs; annotations; bad input; AdmissionReview in and out.
#include "operator/webhook/injection.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "absl/strings/escaping.h"
#include "common/base/strings.h"
#include "tests/operator/webhook/webhook_test_util.h"

namespace clusterprof::webhook {
namespace {

using ::testing::AllOf;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
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

// Injects into `pod` and returns the patched pod; fails the test when nothing was injected.
value Injected(const InjectionConfig& config, const value& pod) {
  absl::StatusOr<InjectionResult> result = Inject(config, pod.serialize());
  EXPECT_TRUE(result.ok()) << result.status();
  if (!result.ok()) return pod;
  EXPECT_EQ(result->outcome, "injected") << ::testing::PrintToString(result->warnings);
  EXPECT_FALSE(result->patch.empty());
  return testing::ApplyPatch(pod, result->patch);
}

TEST(InjectionTest, StartRealtimeAddsOnlySysNiceToTheSidecar) {
  const value pod = testing::ExamplePod(SourcePath("examples/injection/gpu-pod.yaml"));
  const value plain = Injected(InjectionConfig{}, pod);
  const value& plain_caps = testing::FindContainer(plain, "clusterprof-sidecar")
                                ->at("securityContext")
                                .at("capabilities");
  EXPECT_FALSE(plain_caps.has_field("add")) << "off by default";

  InjectionConfig config;
  config.start_realtime = true;
  const value patched = Injected(config, pod);
  const value& security =
      testing::FindContainer(patched, "clusterprof-sidecar")->at("securityContext");
  EXPECT_EQ(security.at("capabilities").at("drop").size(), 1u);
  EXPECT_EQ(security.at("capabilities").at("drop").at(0).as_string(), "ALL");
  ASSERT_EQ(security.at("capabilities").at("add").size(), 1u);
  EXPECT_EQ(security.at("capabilities").at("add").at(0).as_string(), "SYS_NICE");
  EXPECT_FALSE(security.at("allowPrivilegeEscalation").as_bool());
  // The workload's containers get nothing.
  EXPECT_FALSE(
      testing::FindContainer(patched, "trainer")->has_field("securityContext") &&
      testing::FindContainer(patched, "trainer")->at("securityContext").has_field("capabilities"));
}

TEST(InjectionTest, GpuPodGetsANativeSidecarTheSharedVolumeAndTheInjectionLibrary) {
  const value pod = testing::ExamplePod(SourcePath("examples/injection/gpu-pod.yaml"));
  const value patched = Injected(InjectionConfig{}, pod);

  // The sidecar comes first among the init containers, as a native sidecar.
  const value& init = patched.at("spec").at("initContainers");
  ASSERT_EQ(init.size(), 2u);
  const value& sidecar = init.at(0);
  EXPECT_EQ(sidecar.at("name").as_string(), "clusterprof-sidecar");
  EXPECT_EQ(sidecar.at("restartPolicy").as_string(), "Always");
  EXPECT_EQ(sidecar.at("image").as_string(), StrCat("clusterprof/sidecar:", CLUSTERPROF_VERSION));
  EXPECT_EQ(init.at(1).at("name").as_string(), "fetch-data");
  EXPECT_EQ(testing::FindContainer(patched, "clusterprof-sidecar", "containers"), nullptr);
  EXPECT_THAT(testing::Args(sidecar),
              AllOf(Contains("--port=8466"), Contains("--http-port=8467"),
                    Contains("--shm-dir=/var/run/clusterprof"),
                    Contains("--install-injection-library=/usr/lib/clusterprof/"
                             "libclusterprof_cupti.so"),
                    Not(Contains("--no-gpu"))));
  EXPECT_EQ(sidecar.at("ports").at(0).at("name").as_string(), "clusterprof");
  EXPECT_EQ(sidecar.at("ports").at(0).at("containerPort").as_integer(), 8466);
  for (const value& port : sidecar.at("ports").as_array()) {
    EXPECT_LE(port.at("name").as_string().size(), 15u) << "an IANA_SVC_NAME";
  }
  // The pod's annotation sets the memory limit; the rest are the defaults.
  EXPECT_EQ(sidecar.at("resources").at("limits").at("memory").as_string(), "2Gi");
  EXPECT_EQ(sidecar.at("resources").at("requests").at("cpu").as_string(), "100m");
  const value& security = sidecar.at("securityContext");
  EXPECT_TRUE(security.at("runAsNonRoot").as_bool());
  EXPECT_TRUE(security.at("readOnlyRootFilesystem").as_bool());
  EXPECT_FALSE(security.at("allowPrivilegeEscalation").as_bool());
  EXPECT_EQ(security.at("capabilities").at("drop").at(0).as_string(), "ALL");
  // Nothing of the sidecar gates the pod: no startup probe holds the trainer back, no readiness
  // probe takes the pod out of its Service, no liveness probe restarts the container into a
  // back-off; the process keeps itself running instead.
  EXPECT_FALSE(sidecar.has_field("startupProbe"));
  EXPECT_FALSE(sidecar.has_field("readinessProbe"));
  EXPECT_FALSE(sidecar.has_field("livenessProbe"));
  EXPECT_EQ(testing::Args(sidecar).at(0), "--supervise");

  // Every container sees the shared directory; only the GPU one loads the library.
  for (const char* name : {"clusterprof-sidecar", "fetch-data", "trainer", "metrics-exporter"}) {
    const value* container = testing::FindContainer(patched, name);
    ASSERT_NE(container, nullptr) << name;
    EXPECT_TRUE(testing::MountsShm(*container)) << name;
    EXPECT_EQ(testing::EnvValue(*container, "CLUSTERPROF_DIR"), "/var/run/clusterprof") << name;
  }
  const value& trainer = *testing::FindContainer(patched, "trainer");
  EXPECT_EQ(testing::EnvValue(trainer, "CUDA_INJECTION64_PATH"),
            "/var/run/clusterprof/libclusterprof_cupti.so");
  EXPECT_EQ(testing::EnvValue(trainer, "NCCL_DEBUG"), "WARN");  // the pod's own env is kept
  EXPECT_EQ(testing::EnvValue(*testing::FindContainer(patched, "metrics-exporter"),
                              "CUDA_INJECTION64_PATH"),
            "<unset>");

  const value& volumes = patched.at("spec").at("volumes");
  ASSERT_GE(volumes.size(), 2u);
  EXPECT_EQ(volumes.at(0).at("name").as_string(), "clusterprof-shm");
  EXPECT_EQ(volumes.at(0).at("emptyDir").at("medium").as_string(), "Memory");
  EXPECT_EQ(volumes.at(1).at("name").as_string(), "clusterprof-spool");
  EXPECT_EQ(patched.at("metadata").at("labels").at("clusterprof.io/injected").as_string(), "true");
  EXPECT_EQ(patched.at("metadata").at("labels").at("app").as_string(), "trainer");
}

TEST(InjectionTest, TpuPodForwardsToTheFrameworkProfilerAndHasNoGpuLibrary) {
  const value pod = testing::ExamplePod(SourcePath("examples/injection/tpu-jax-pod.yaml"));
  const value patched = Injected(InjectionConfig{}, pod);
  const value& sidecar = *testing::FindContainer(patched, "clusterprof-sidecar", "initContainers");
  EXPECT_THAT(testing::Args(sidecar),
              AllOf(Contains("--framework-profiler=localhost:9012"), Contains("--no-gpu")));
  const value& jax = *testing::FindContainer(patched, "jax");
  EXPECT_EQ(testing::EnvValue(jax, "CUDA_INJECTION64_PATH"), "<unset>");
  EXPECT_TRUE(testing::MountsShm(jax));
  // The pod had no init containers and no volumes: both arrays are created.
  EXPECT_EQ(patched.at("spec").at("initContainers").size(), 1u);
  EXPECT_EQ(patched.at("spec").at("volumes").size(), 2u);
}

TEST(InjectionTest, JobTemplateGetsTheSidecar) {
  const value pod = testing::ExamplePod(SourcePath("examples/injection/gpu-job.yaml"));
  const value patched = Injected(InjectionConfig{}, pod);
  EXPECT_EQ(testing::EnvValue(*testing::FindContainer(patched, "trainer"), "CUDA_INJECTION64_PATH"),
            "/var/run/clusterprof/libclusterprof_cupti.so");
}

TEST(InjectionTest, RegularContainerModeAppendsTheSidecarToTheContainers) {
  InjectionConfig config;
  config.native_sidecar = false;
  const value pod = testing::ExamplePod(SourcePath("examples/injection/gpu-pod.yaml"));
  const value patched = Injected(config, pod);
  const value& containers = patched.at("spec").at("containers");
  ASSERT_EQ(containers.size(), 3u);
  EXPECT_EQ(containers.at(2).at("name").as_string(), "clusterprof-sidecar");
  EXPECT_FALSE(containers.at(2).has_field("restartPolicy"));
  EXPECT_FALSE(containers.at(2).has_field("startupProbe"));
  EXPECT_FALSE(containers.at(2).has_field("readinessProbe"));
  EXPECT_EQ(testing::Args(containers.at(2)).at(0), "--supervise");
  EXPECT_EQ(patched.at("spec").at("initContainers").size(), 1u);
}

TEST(InjectionTest, NeverInjectsTwice) {
  const value pod = testing::ExamplePod(SourcePath("examples/injection/gpu-pod.yaml"));
  const value patched = Injected(InjectionConfig{}, pod);
  absl::StatusOr<InjectionResult> again = Inject(InjectionConfig{}, patched.serialize());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->outcome, "already-injected");
  EXPECT_EQ(again->patch, "");

  // A sidecar added by hand (no label) counts too.
  value by_hand = pod;
  by_hand["spec"]["containers"][1]["name"] = value::string("clusterprof-sidecar");
  again = Inject(InjectionConfig{}, by_hand.serialize());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->outcome, "already-injected");
}

TEST(InjectionTest, PodLabelledFalseOptsOut) {
  value pod = testing::ExamplePod(SourcePath("examples/injection/gpu-pod.yaml"));
  pod["metadata"]["labels"]["clusterprof.io/inject"] = value::string("false");
  absl::StatusOr<InjectionResult> result = Inject(InjectionConfig{}, pod.serialize());
  ASSERT_TRUE(result.ok());
  EXPECT_EQ(result->outcome, "opted-out");
  EXPECT_EQ(result->patch, "");
}

TEST(InjectionTest, PortAnnotationMovesBothPorts) {
  value pod = testing::ExamplePod(SourcePath("examples/injection/tpu-jax-pod.yaml"));
  pod["metadata"]["annotations"]["clusterprof.io/port"] = value::string("7000");
  const value patched = Injected(InjectionConfig{}, pod);
  const value& sidecar = *testing::FindContainer(patched, "clusterprof-sidecar");
  EXPECT_THAT(testing::Args(sidecar), AllOf(Contains("--port=7000"), Contains("--http-port=7001")));
  EXPECT_EQ(sidecar.at("ports").at(0).at("containerPort").as_integer(), 7000);
  EXPECT_EQ(sidecar.at("ports").at(1).at("containerPort").as_integer(), 7001);
}

// A namespace without the token Secret still starts its pods: the volume is optional, and the
// sidecar (not the pod) waits for the Secret.
TEST(InjectionTest, TheTokenVolumeIsOptionalSoAMissingSecretNeverHoldsThePod) {
  InjectionConfig config;
  config.token_secret = "clusterprof-sidecar-token";
  const value patched =
      Injected(config, testing::ExamplePod(SourcePath("examples/injection/tpu-jax-pod.yaml")));
  const value* token = nullptr;
  for (const value& volume : patched.at("spec").at("volumes").as_array()) {
    if (volume.at("name").as_string() == "clusterprof-token") token = &volume;
  }
  ASSERT_NE(token, nullptr);
  EXPECT_EQ(token->at("secret").at("secretName").as_string(), "clusterprof-sidecar-token");
  EXPECT_TRUE(token->at("secret").at("optional").as_bool());
  EXPECT_THAT(testing::Args(*testing::FindContainer(patched, "clusterprof-sidecar")),
              Contains("--auth-token-file=/etc/clusterprof/token/token"));
}

TEST(InjectionTest, ImagePullSecretsAreAddedToThePodOnce) {
  InjectionConfig config;
  config.image_pull_secrets = {"registry-a", "registry-b"};
  value pod = testing::ExamplePod(SourcePath("examples/injection/tpu-jax-pod.yaml"));
  // Without imagePullSecrets the array is created.
  value patched = Injected(config, pod);
  ASSERT_TRUE(patched.at("spec").has_field("imagePullSecrets"));
  const value& created = patched.at("spec").at("imagePullSecrets");
  ASSERT_EQ(created.size(), 2u);
  EXPECT_EQ(created.at(0).at("name").as_string(), "registry-a");
  EXPECT_EQ(created.at(1).at("name").as_string(), "registry-b");
  // The pod's own are kept, and one it names already is not added twice.
  pod["spec"]["imagePullSecrets"] = value::array(
      {value::parse(R"({"name": "team-registry"})"), value::parse(R"({"name": "registry-b"})")});
  patched = Injected(config, pod);
  std::vector<std::string> names;
  for (const value& secret : patched.at("spec").at("imagePullSecrets").as_array()) {
    names.push_back(secret.at("name").as_string());
  }
  EXPECT_THAT(names, ElementsAre("team-registry", "registry-b", "registry-a"));
}

TEST(InjectionTest, AHostNetworkPodIsInjectedOnlyOnAPortTheUserChose) {
  value pod = testing::ExamplePod(SourcePath("examples/injection/tpu-jax-pod.yaml"));
  pod["spec"]["hostNetwork"] = value::boolean(true);
  absl::StatusOr<InjectionResult> result = Inject(InjectionConfig{}, pod.serialize());
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->outcome, "host-network");
  EXPECT_EQ(result->patch, "");
  ASSERT_EQ(result->warnings.size(), 1u);
  EXPECT_THAT(result->warnings[0],
              AllOf(HasSubstr("hostNetwork"), HasSubstr("clusterprof.io/port"), HasSubstr("8466")));

  pod["metadata"]["annotations"]["clusterprof.io/port"] = value::string("19466");
  const value patched = Injected(InjectionConfig{}, pod);
  EXPECT_THAT(testing::Args(*testing::FindContainer(patched, "clusterprof-sidecar")),
              AllOf(Contains("--port=19466"), Contains("--http-port=19467")));
}

TEST(InjectionTest, ResourceAnnotationsOverrideTheDefaults) {
  value pod = testing::ExamplePod(SourcePath("examples/injection/tpu-jax-pod.yaml"));
  pod["metadata"]["annotations"]["clusterprof.io/sidecar-cpu-request"] = value::string("250m");
  pod["metadata"]["annotations"]["clusterprof.io/sidecar-cpu-limit"] = value::string("2");
  pod["metadata"]["annotations"]["clusterprof.io/sidecar-memory-request"] = value::string("1Gi");
  const value patched = Injected(InjectionConfig{}, pod);
  const value& resources = testing::FindContainer(patched, "clusterprof-sidecar")->at("resources");
  EXPECT_EQ(resources.at("requests").at("cpu").as_string(), "250m");
  EXPECT_EQ(resources.at("requests").at("memory").as_string(), "1Gi");
  EXPECT_EQ(resources.at("limits").at("cpu").as_string(), "2");
  EXPECT_EQ(resources.at("limits").at("memory").as_string(), "1Gi");
}

struct BadAnnotation {
  const char* key;
  const char* value;
  const char* message;
};

class BadAnnotationTest : public ::testing::TestWithParam<BadAnnotation> {};

TEST_P(BadAnnotationTest, LeavesThePodAloneWithAWarningThatNamesTheAnnotation) {
  value pod = testing::ExamplePod(SourcePath("examples/injection/gpu-pod.yaml"));
  pod["metadata"]["annotations"][GetParam().key] = value::string(GetParam().value);
  absl::StatusOr<InjectionResult> result = Inject(InjectionConfig{}, pod.serialize());
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->outcome, "invalid");
  EXPECT_EQ(result->patch, "");
  ASSERT_EQ(result->warnings.size(), 1u);
  EXPECT_THAT(result->warnings[0], AllOf(HasSubstr("not injected"), HasSubstr(GetParam().key),
                                         HasSubstr(GetParam().message)));
}

INSTANTIATE_TEST_SUITE_P(
    Annotations, BadAnnotationTest,
    ::testing::Values(BadAnnotation{"clusterprof.io/port", "http", "not a port number"},
                      BadAnnotation{"clusterprof.io/port", "70000", "not a port number"},
                      BadAnnotation{"clusterprof.io/framework-profiler", "localhost",
                                    "not host:port"},
                      BadAnnotation{"clusterprof.io/sidecar-memory-limit", "2 gigabytes",
                                    "not a Kubernetes quantity"},
                      BadAnnotation{"clusterprof.io/sidecar-cpu-request", "-1", "quantity"}));

TEST(InjectionTest, APortTakenByTheWorkloadIsNotInjectedAndNamesTheContainer) {
  value pod = testing::ExamplePod(SourcePath("examples/injection/tpu-jax-pod.yaml"));
  pod["spec"]["containers"][0]["ports"][0]["containerPort"] = value::number(8466);
  absl::StatusOr<InjectionResult> result = Inject(InjectionConfig{}, pod.serialize());
  ASSERT_TRUE(result.ok());
  EXPECT_EQ(result->patch, "");
  ASSERT_EQ(result->warnings.size(), 1u);
  EXPECT_THAT(result->warnings[0], AllOf(HasSubstr("port 8466 is taken by container jax"),
                                         HasSubstr("clusterprof.io/port")));
}

TEST(InjectionTest, KeepsAContainersOwnInjectionPathAndSaysSo) {
  value pod = testing::ExamplePod(SourcePath("examples/injection/gpu-pod.yaml"));
  value env = value::object();
  env["name"] = value::string("CUDA_INJECTION64_PATH");
  env["value"] = value::string("/opt/other/libinject.so");
  pod["spec"]["containers"][0]["env"][1] = env;
  absl::StatusOr<InjectionResult> result = Inject(InjectionConfig{}, pod.serialize());
  ASSERT_TRUE(result.ok());
  EXPECT_EQ(result->outcome, "injected");
  EXPECT_THAT(result->warnings, ElementsAre(HasSubstr("container trainer sets "
                                                      "CUDA_INJECTION64_PATH itself")));
  const value patched = testing::ApplyPatch(pod, result->patch);
  EXPECT_EQ(testing::EnvValue(*testing::FindContainer(patched, "trainer"), "CUDA_INJECTION64_PATH"),
            "/opt/other/libinject.so");
}

TEST(InjectionTest, AMinimalPodGetsEveryArrayAndMapCreated) {
  const value pod = value::parse(
      R"({"apiVersion":"v1","kind":"Pod","metadata":{"generateName":"x-"},
          "spec":{"containers":[{"name":"main","image":"busybox"}]}})");
  const value patched = Injected(InjectionConfig{}, pod);
  EXPECT_EQ(patched.at("metadata").at("labels").at("clusterprof.io/injected").as_string(), "true");
  const value& main = *testing::FindContainer(patched, "main");
  EXPECT_TRUE(testing::MountsShm(main));
  EXPECT_EQ(testing::EnvValue(main, "CLUSTERPROF_DIR"), "/var/run/clusterprof");
}

TEST(InjectionTest, AMountAlreadyAtTheDirectoryAndAVolumeOfTheSameNameAreKept) {
  const value pod = value::parse(R"({"metadata":{"name":"p"},"spec":{
      "volumes":[{"name":"clusterprof-shm","hostPath":{"path":"/dev/shm/clusterprof"}}],
      "containers":[{"name":"main","image":"busybox","volumeMounts":[
        {"name":"clusterprof-shm","mountPath":"/var/run/clusterprof/"}]}]}})");
  const value patched = Injected(InjectionConfig{}, pod);
  const value& volumes = patched.at("spec").at("volumes");
  ASSERT_EQ(volumes.size(), 2u);  // the pod's own, and the spool
  EXPECT_TRUE(volumes.at(0).has_field("hostPath"));
  EXPECT_EQ(testing::FindContainer(patched, "main")->at("volumeMounts").size(), 1u);
}

TEST(InjectionTest, TokenSecretIsMountedAndRequired) {
  InjectionConfig config;
  config.token_secret = "clusterprof-sidecar-token";
  config.allowed_logdirs = {"gs://bucket/profiles", "/tmp/profiles"};
  const value pod = testing::ExamplePod(SourcePath("examples/injection/tpu-jax-pod.yaml"));
  const value patched = Injected(config, pod);
  const value& sidecar = *testing::FindContainer(patched, "clusterprof-sidecar");
  EXPECT_THAT(testing::Args(sidecar),
              AllOf(Contains("--auth-token-file=/etc/clusterprof/token/token"),
                    Contains("--allowed-logdir=gs://bucket/profiles"),
                    Contains("--allowed-logdir=/tmp/profiles")));
  bool mounted = false;
  for (const value& mount : sidecar.at("volumeMounts").as_array()) {
    if (mount.at("name").as_string() == "clusterprof-token") {
      mounted = mount.at("readOnly").as_bool() &&
                mount.at("mountPath").as_string() == "/etc/clusterprof/token";
    }
  }
  EXPECT_TRUE(mounted);
  bool volume = false;
  for (const value& v : patched.at("spec").at("volumes").as_array()) {
    if (v.at("name").as_string() == "clusterprof-token") {
      volume = v.at("secret").at("secretName").as_string() == "clusterprof-sidecar-token";
    }
  }
  EXPECT_TRUE(volume);
  // The workload containers do not see the token.
  EXPECT_EQ(testing::FindContainer(patched, "jax")->at("volumeMounts").size(), 1u);
}

TEST(InjectionTest, ConfiguredEnvReachesTheSidecarOnly) {
  InjectionConfig config;
  config.env = {{"STORAGE_EMULATOR_HOST", "10.77.0.2:4443"}, {"HTTPS_PROXY", "http://proxy:3128"}};
  const value pod = testing::ExamplePod(SourcePath("examples/injection/tpu-jax-pod.yaml"));
  const value patched = Injected(config, pod);
  const value& sidecar = *testing::FindContainer(patched, "clusterprof-sidecar");
  EXPECT_EQ(testing::EnvValue(sidecar, "STORAGE_EMULATOR_HOST"), "10.77.0.2:4443");
  EXPECT_EQ(testing::EnvValue(sidecar, "HTTPS_PROXY"), "http://proxy:3128");
  EXPECT_EQ(testing::EnvValue(sidecar, "CLUSTERPROF_DIR"), "/var/run/clusterprof");
  EXPECT_EQ(testing::EnvValue(*testing::FindContainer(patched, "jax"), "STORAGE_EMULATOR_HOST"),
            "<unset>");
}

TEST(InjectionTest, LabelKeysWithSlashesAreEscapedInThePatch) {
  const value pod = testing::ExamplePod(SourcePath("examples/injection/gpu-pod.yaml"));
  absl::StatusOr<InjectionResult> result = Inject(InjectionConfig{}, pod.serialize());
  ASSERT_TRUE(result.ok());
  EXPECT_THAT(result->patch, HasSubstr("\"/metadata/labels/clusterprof.io~1injected\""));
}

TEST(InjectionTest, NotAPodIsAnError) {
  EXPECT_THAT(Inject(InjectionConfig{}, "{").status().message(), HasSubstr("not valid JSON"));
  EXPECT_THAT(Inject(InjectionConfig{}, R"({"metadata":{}})").status().message(),
              HasSubstr("no pod spec"));
}

// AdmissionReview in and out.

TEST(ReviewTest, AnswersARealAdmissionReviewWithTheBase64Patch) {
  const std::string review =
      ReadText(SourcePath("tests/data/webhook/admission-review-job-pod.json"));
  absl::StatusOr<ReviewAnswer> answer = Review(InjectionConfig{}, review);
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_EQ(answer->pod, "training/resnet-train-*");
  const value body = value::parse(answer->body);
  EXPECT_EQ(body.at("apiVersion").as_string(), "admission.k8s.io/v1");
  EXPECT_EQ(body.at("kind").as_string(), "AdmissionReview");
  const value& response = body.at("response");
  EXPECT_EQ(response.at("uid").as_string(), "3f6c8a52-8b0e-4d1f-9a8e-5b6f2a7c1d90");
  EXPECT_TRUE(response.at("allowed").as_bool());
  EXPECT_EQ(response.at("patchType").as_string(), "JSONPatch");
  std::string patch;
  ASSERT_TRUE(absl::Base64Unescape(response.at("patch").as_string(), &patch));
  EXPECT_EQ(patch, answer->result.patch);

  const value pod = value::parse(review).at("request").at("object");
  const value patched = testing::ApplyPatch(pod, patch);
  const value& trainer = *testing::FindContainer(patched, "trainer");
  EXPECT_EQ(testing::EnvValue(trainer, "CUDA_INJECTION64_PATH"),
            "/var/run/clusterprof/libclusterprof_cupti.so");
  // The service-account volume and mount stay where they were.
  EXPECT_EQ(patched.at("spec").at("volumes").at(0).at("name").as_string(), "kube-api-access-7xk2p");
  EXPECT_EQ(trainer.at("volumeMounts").size(), 2u);
  EXPECT_FALSE(response.has_field("warnings"));
}

// The volume named `name` of a pod, or null.
const value* FindVolume(const value& pod, const std::string& name) {
  if (!pod.at("spec").has_field("volumes")) return nullptr;
  for (const value& volume : pod.at("spec").at("volumes").as_array()) {
    if (volume.at("name").as_string() == name) return &volume;
  }
  return nullptr;
}

// The mount of volume `name` in `container`, or null.
const value* FindMount(const value& container, const std::string& name) {
  if (!container.has_field("volumeMounts")) return nullptr;
  for (const value& mount : container.at("volumeMounts").as_array()) {
    if (mount.at("name").as_string() == name) return &mount;
  }
  return nullptr;
}

// The pod of the AdmissionReview sample, as the answer's patch leaves it.
value PatchedReviewPod(const InjectionConfig& config) {
  const std::string review =
      ReadText(SourcePath("tests/data/webhook/admission-review-job-pod.json"));
  absl::StatusOr<ReviewAnswer> answer = Review(config, review);
  EXPECT_TRUE(answer.ok()) << answer.status();
  if (!answer.ok()) return value::object();
  EXPECT_EQ(answer->result.outcome, "injected");
  std::string patch;
  EXPECT_TRUE(absl::Base64Unescape(
      value::parse(answer->body).at("response").at("patch").as_string(), &patch));
  return testing::ApplyPatch(value::parse(review).at("request").at("object"), patch);
}

// The sidecar serves TLS from a Secret mounted whole, so that the kubelet's updates of a rotated
// Secret reach the files it rereads; a subPath mount or a list of items would not be updated
// (subPath) or would hide a key the Secret gains, and neither is there.
TEST(ReviewTest, ATlsSecretIsMountedWholeInTheSidecarWhichServesTlsFromIt) {
  InjectionConfig config;
  config.token_secret = "clusterprof-sidecar-token";
  config.tls_secret = "clusterprof-sidecar-tls";
  const value patched = PatchedReviewPod(config);

  const value* volume = FindVolume(patched, "clusterprof-tls");
  ASSERT_NE(volume, nullptr) << patched.serialize();
  const value& secret = volume->at("secret");
  EXPECT_EQ(secret.at("secretName").as_string(), "clusterprof-sidecar-tls");
  EXPECT_TRUE(secret.at("optional").as_bool()) << "a namespace without it still starts pods";
  EXPECT_EQ(secret.at("defaultMode").as_integer(), 0444) << "readable by the sidecar's user";
  EXPECT_FALSE(secret.has_field("items"));
  // The token's volume is mounted whole too.
  const value* token = FindVolume(patched, "clusterprof-token");
  ASSERT_NE(token, nullptr);
  EXPECT_FALSE(token->at("secret").has_field("items"));

  const value& sidecar = *testing::FindContainer(patched, "clusterprof-sidecar");
  for (const char* name : {"clusterprof-tls", "clusterprof-token"}) {
    const value* mount = FindMount(sidecar, name);
    ASSERT_NE(mount, nullptr) << name;
    EXPECT_TRUE(mount->at("readOnly").as_bool()) << name;
    EXPECT_FALSE(mount->has_field("subPath")) << name;
    EXPECT_FALSE(mount->has_field("subPathExpr")) << name;
  }
  EXPECT_EQ(FindMount(sidecar, "clusterprof-tls")->at("mountPath").as_string(),
            "/etc/clusterprof/tls");
  EXPECT_THAT(testing::Args(sidecar),
              AllOf(Contains("--tls-cert-file=/etc/clusterprof/tls/tls.crt"),
                    Contains("--tls-key-file=/etc/clusterprof/tls/tls.key"),
                    Contains("--auth-token-file=/etc/clusterprof/token/token"),
                    Contains("--token-grace-seconds=300")));
  // The workload's containers see neither Secret.
  const value& trainer = *testing::FindContainer(patched, "trainer");
  EXPECT_EQ(FindMount(trainer, "clusterprof-tls"), nullptr);
  EXPECT_EQ(FindMount(trainer, "clusterprof-token"), nullptr);
}

TEST(ReviewTest, WithoutATlsSecretTheSidecarServesPlaintextAsBefore) {
  InjectionConfig config;
  config.token_secret = "clusterprof-sidecar-token";
  config.token_grace_seconds = 0;
  const value patched = PatchedReviewPod(config);
  EXPECT_EQ(FindVolume(patched, "clusterprof-tls"), nullptr);
  const value& sidecar = *testing::FindContainer(patched, "clusterprof-sidecar");
  EXPECT_EQ(FindMount(sidecar, "clusterprof-tls"), nullptr);
  for (const std::string& arg : testing::Args(sidecar)) {
    EXPECT_THAT(arg, Not(HasSubstr("--tls-")));
  }
  EXPECT_THAT(testing::Args(sidecar), Contains("--token-grace-seconds=0"));

  // No token either: no grace period to give.
  const value plain = PatchedReviewPod(InjectionConfig{});
  EXPECT_EQ(FindVolume(plain, "clusterprof-token"), nullptr);
  for (const std::string& arg :
       testing::Args(*testing::FindContainer(plain, "clusterprof-sidecar"))) {
    EXPECT_THAT(arg, AllOf(Not(HasSubstr("--tls-")), Not(HasSubstr("--token-grace-seconds")),
                           Not(HasSubstr("--auth-token-file"))));
  }
}

TEST(ReviewTest, OtherKindsAndOperationsAreAllowedUnchanged) {
  value review =
      value::parse(ReadText(SourcePath("tests/data/webhook/admission-review-job-pod.json")));
  review["request"]["operation"] = value::string("UPDATE");
  absl::StatusOr<ReviewAnswer> answer = Review(InjectionConfig{}, review.serialize());
  ASSERT_TRUE(answer.ok());
  EXPECT_EQ(answer->result.outcome, "ignored");
  const value response = value::parse(answer->body).at("response");
  EXPECT_TRUE(response.at("allowed").as_bool());
  EXPECT_FALSE(response.has_field("patch"));

  review["request"]["operation"] = value::string("CREATE");
  review["request"]["kind"]["kind"] = value::string("Deployment");
  review["request"]["kind"]["group"] = value::string("apps");
  answer = Review(InjectionConfig{}, review.serialize());
  ASSERT_TRUE(answer.ok());
  EXPECT_EQ(answer->result.outcome, "ignored");
}

TEST(ReviewTest, AnInvalidPodIsAllowedWithAWarning) {
  value review =
      value::parse(ReadText(SourcePath("tests/data/webhook/admission-review-job-pod.json")));
  value annotations = value::object();
  annotations["clusterprof.io/port"] = value::string("none");
  review["request"]["object"]["metadata"]["annotations"] = annotations;
  absl::StatusOr<ReviewAnswer> answer = Review(InjectionConfig{}, review.serialize());
  ASSERT_TRUE(answer.ok());
  const value response = value::parse(answer->body).at("response");
  EXPECT_TRUE(response.at("allowed").as_bool());
  EXPECT_FALSE(response.has_field("patch"));
  EXPECT_THAT(response.at("warnings").at(0).as_string(),
              HasSubstr("clusterprof.io/port=\"none\" is not a port number"));
}

TEST(ReviewTest, RejectsWhatIsNotAnAdmissionReviewV1) {
  EXPECT_THAT(Review(InjectionConfig{}, "not json").status().message(), HasSubstr("not JSON"));
  value review =
      value::parse(ReadText(SourcePath("tests/data/webhook/admission-review-job-pod.json")));
  review["apiVersion"] = value::string("admission.k8s.io/v1beta1");
  EXPECT_THAT(Review(InjectionConfig{}, review.serialize()).status().message(),
              AllOf(HasSubstr("admission.k8s.io/v1beta1"), HasSubstr("admissionReviewVersions")));
  review["apiVersion"] = value::string("admission.k8s.io/v1");
  review["request"].erase("uid");
  EXPECT_THAT(Review(InjectionConfig{}, review.serialize()).status().message(),
              HasSubstr("no request with a uid"));
}

TEST(KubernetesVersionTest, ReadsTheMinorVersionWhereTheServerSaysIt) {
  EXPECT_EQ(KubernetesMinorVersion(R"({"major": "1", "minor": "29", "gitVersion": "v1.29.3"})"),
            29);
  EXPECT_EQ(KubernetesMinorVersion(R"({"major": "1", "minor": "27+"})"), 27);
  EXPECT_EQ(KubernetesMinorVersion(R"({"major": "", "minor": "", "gitVersion": "v1.20.2"})"), 20);
  EXPECT_EQ(KubernetesMinorVersion(R"({"gitVersion": "v1.30.1-gke.1329003"})"), 30);
  // Builds from source without version stamps, and garbage: unknown.
  EXPECT_EQ(KubernetesMinorVersion(
                R"({"major": "", "minor": "", "gitVersion": "v0.0.0-master+faecb196815e2"})"),
            std::nullopt);
  EXPECT_EQ(KubernetesMinorVersion(R"({"major": "1", "minor": "x"})"), std::nullopt);
  EXPECT_EQ(KubernetesMinorVersion("<html>"), std::nullopt);
  EXPECT_EQ(KubernetesMinorVersion(""), std::nullopt);
}

// The injection config file.

TEST(InjectionConfigTest, ReadsEveryKey) {
  absl::StatusOr<InjectionConfig> config = ParseInjectionConfig(R"(
image: clusterprof/sidecar:9.9.9
image_pull_policy: Always
native_sidecar: false
port: 9000
http_port: 9001
resources:
  requests: {cpu: 50m, memory: 64Mi}
  limits: {memory: 256Mi}
token_secret: tok
token_grace_seconds: 30
tls_secret: sidecar-tls
image_pull_secrets: [artifact-registry]
allowed_logdirs: [gs://b/p]
framework_profiler: localhost:9012
gpu_library: ""
shm_size_limit: 1Gi
spool_size_limit: ""
log_format: text
extra_args: ["--max-events=100"]
env: {STORAGE_EMULATOR_HOST: "10.0.0.1:4443"}
start_realtime: true
)");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->image, "clusterprof/sidecar:9.9.9");
  EXPECT_EQ(config->image_pull_policy, "Always");
  EXPECT_FALSE(config->native_sidecar);
  EXPECT_EQ(config->port, 9000);
  EXPECT_EQ(config->http_port, 9001);
  EXPECT_EQ(config->requests.at("cpu"), "50m");
  EXPECT_EQ(config->limits.at("memory"), "256Mi");
  EXPECT_FALSE(config->limits.contains("cpu"));
  EXPECT_EQ(config->token_secret, "tok");
  EXPECT_EQ(config->token_grace_seconds, 30);
  EXPECT_EQ(config->tls_secret, "sidecar-tls");
  EXPECT_THAT(config->image_pull_secrets, ElementsAre("artifact-registry"));
  EXPECT_THAT(config->allowed_logdirs, ElementsAre("gs://b/p"));
  EXPECT_EQ(config->framework_profiler, "localhost:9012");
  EXPECT_EQ(config->gpu_library, "");
  EXPECT_EQ(config->spool_size_limit, "");
  EXPECT_THAT(config->extra_args, ElementsAre("--max-events=100"));
  EXPECT_EQ(config->env.at("STORAGE_EMULATOR_HOST"), "10.0.0.1:4443");
  EXPECT_TRUE(config->start_realtime);
}

TEST(InjectionConfigTest, EmptyFileKeepsTheDefaults) {
  absl::StatusOr<InjectionConfig> config = ParseInjectionConfig("");
  ASSERT_TRUE(config.ok());
  EXPECT_TRUE(config->native_sidecar);
  EXPECT_EQ(config->port, 8466);
  EXPECT_EQ(config->token_grace_seconds, 300);
  EXPECT_EQ(config->tls_secret, "");
}

TEST(InjectionConfigTest, BadFilesSayWhatIsWrong) {
  EXPECT_THAT(ParseInjectionConfig("prot: 1").status().message(),
              AllOf(HasSubstr("unknown setting 'prot'"), HasSubstr("port")));
  EXPECT_THAT(ParseInjectionConfig("port: eighty").status().message(),
              HasSubstr("'port' has a value of the wrong type"));
  EXPECT_THAT(ParseInjectionConfig("port: 8467").status().message(),
              HasSubstr("two different ports"));
  EXPECT_THAT(ParseInjectionConfig("image_pull_policy: Sometimes").status().message(),
              HasSubstr("Always, IfNotPresent or Never"));
  EXPECT_THAT(ParseInjectionConfig("resources: {limits: {memory: lots}}").status().message(),
              HasSubstr("'lots' is not a Kubernetes quantity"));
  EXPECT_THAT(ParseInjectionConfig("resources: {limits: {gpu: 1}}").status().message(),
              HasSubstr("must be cpu, memory"));
  EXPECT_THAT(ParseInjectionConfig("gpu_library: lib.so").status().message(),
              HasSubstr("absolute path"));
  EXPECT_THAT(ParseInjectionConfig("- a\n- b").status().message(), HasSubstr("mapping"));
  EXPECT_THAT(ParseInjectionConfig("image_pull_secrets: [Registry_A]").status().message(),
              HasSubstr("'Registry_A' is not a Secret name"));
  EXPECT_THAT(ParseInjectionConfig("env: [A]").status().message(),
              HasSubstr("'env' has a value of the wrong type"));
  EXPECT_THAT(ParseInjectionConfig("env: {CLUSTERPROF_DIR: /x}").status().message(),
              HasSubstr("set by the injection itself"));
  EXPECT_THAT(ParseInjectionConfig("env: {\"1-A\": x}").status().message(),
              HasSubstr("not an environment variable name"));
  EXPECT_THAT(ParseInjectionConfig("token_grace_seconds: -1").status().message(),
              AllOf(HasSubstr("token_grace_seconds -1"), HasSubstr("0 or more")));
  InjectionConfig negative_grace;
  negative_grace.token_grace_seconds = -5;
  EXPECT_THAT(ValidateInjectionConfig(negative_grace).message(),
              HasSubstr("token_grace_seconds -5 must be 0 or more"));
  EXPECT_THAT(ParseInjectionConfig("token_grace_seconds: 5m").status().message(),
              HasSubstr("'token_grace_seconds' has a value of the wrong type"));
  EXPECT_THAT(ParseInjectionConfig("tls_secret: Sidecar_TLS").status().message(),
              AllOf(HasSubstr("tls_secret 'Sidecar_TLS'"), HasSubstr("not a Secret name")));
  EXPECT_THAT(ParseInjectionConfig("token_secret: \"a b\"").status().message(),
              HasSubstr("token_secret 'a b' is not a Secret name"));
  EXPECT_THAT(LoadInjectionConfig("/nonexistent/injection.yaml").status().message(),
              HasSubstr("cannot read the injection config /nonexistent/injection.yaml"));
}

}  // namespace
}  // namespace clusterprof::webhook
