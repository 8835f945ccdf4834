#include "sidecar/capture_request.h"

#include <unistd.h>

#include <filesystem>

#include "common/base/strings.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sidecar/tracers/gpu_tracer.h"
#include "sidecar/tracers/shm_transport.h"
#include "tests/support/temp_dir.h"

namespace clusterprof::sidecar {
namespace {

using clusterprof::testing::TempDir;
using ::testing::HasSubstr;

constexpr int64_t kNow = 1'767'225'600LL * 1'000'000'000;  // 2026-01-01T00:00:00Z

class CaptureRequestTest : public ::testing::Test {
 protected:
  CaptureRequestTest() {
    policy_.allowed_logdirs.push_back(*storage::ParseLogdir(allowed_.path()));
    policy_.default_host_name = "pod-7";
    request_.mutable_opts()->set_version(1);
    request_.mutable_opts()->set_duration_ms(1500);
    request_.mutable_opts()->set_host_tracer_level(3);
    request_.set_repository_root(allowed_.Join("tb/plugins/profile"));
    request_.set_session_id("run_1");
    request_.set_host_name("10.0.0.2:8466");
  }
  absl::StatusOr<CaptureRequest> Parse() { return ParseCaptureRequest(request_, policy_, kNow); }

  TempDir allowed_;
  RequestPolicy policy_;
  tensorflow::ProfileRequest request_;
};

TEST_F(CaptureRequestTest, AVersion1RequestIsTakenAsGiven) {
  request_.mutable_opts()->set_start_timestamp_ns(kNow + 5);
  request_.set_max_events(99);
  auto parsed = Parse();
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->session_id, "run_1");
  EXPECT_EQ(parsed->host_name, "10.0.0.2_8466") << "':' is replaced as upstream does";
  EXPECT_EQ(parsed->duration_ns, 1500 * 1'000'000LL);
  EXPECT_EQ(parsed->start_timestamp_ns, kNow + 5);
  EXPECT_EQ(parsed->config.max_events, 99u);
  EXPECT_EQ(parsed->config.options.host_tracer_level(), 3u);
  EXPECT_EQ(parsed->config.options.duration_ms(), 1500u);
  ASSERT_TRUE(parsed->layout.has_value());
  EXPECT_EQ(parsed->layout->RunDir(), allowed_.Join("tb/plugins/profile/run_1"));
  EXPECT_TRUE(parsed->warnings.empty());
}

TEST_F(CaptureRequestTest, Version0MeansDefaultsAndDiscardsEveryOption) {
  tensorflow::ProfileOptions* opts = request_.mutable_opts();
  opts->set_version(0);
  opts->set_host_tracer_level(3);
  opts->set_start_timestamp_ns(kNow + 1'000'000'000);
  opts->set_session_id("ignored");
  opts->set_override_hostname("ignored-host");
  request_.set_duration_ms(700);  // the legacy field is what remains
  auto parsed = Parse();
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->config.options.version(), 1u);
  EXPECT_EQ(parsed->config.options.host_tracer_level(), 2u);
  EXPECT_EQ(parsed->config.options.device_tracer_level(), 1u);
  EXPECT_EQ(parsed->config.options.python_tracer_level(), 0u);
  EXPECT_TRUE(parsed->config.options.enable_hlo_proto());
  EXPECT_EQ(parsed->start_timestamp_ns, 0) << "start_timestamp_ns is discarded with version 0";
  EXPECT_EQ(parsed->duration_ns, 700 * 1'000'000LL);
  EXPECT_EQ(parsed->session_id, "run_1");
  EXPECT_EQ(parsed->host_name, "10.0.0.2_8466");
}

// A tracer of the test's own: owns one key, refuses one value of it, and may hand the options on.
class KeyedTracer final : public Tracer {
 public:
  explicit KeyedTracer(bool forwards) : forwards_(forwards) {}
  std::string_view name() const override { return "keyed"; }
  std::vector<std::string_view> OwnedKeys() const override { return {"keyed_mode"}; }
  bool ForwardsOptions() const override { return forwards_; }
  absl::Status Validate(const tensorflow::ProfileOptions& options) const override {
    auto it = options.advanced_configuration().find("keyed_mode");
    if (it != options.advanced_configuration().end() && it->second.string_value() == "bad") {
      return absl::InvalidArgumentError("advanced_configuration[\"keyed_mode\"] is bad");
    }
    return absl::OkStatus();
  }
  bool EnabledFor(const tensorflow::ProfileOptions& options) const override {
    return options.python_tracer_level() >= 1;
  }
  TracerStatus Status() const override { return {true, ""}; }
  absl::Status Start(const CaptureWindow&, const CaptureConfig&) override {
    return absl::OkStatus();
  }
  absl::Status Stop(int64_t) override { return absl::OkStatus(); }
  absl::Status CollectInto(tensorflow::profiler::XSpace*, TracerStats*) override {
    return absl::OkStatus();
  }

 private:
  const bool forwards_;
};

TEST_F(CaptureRequestTest, EachTracerChecksItsOwnKeysAndAKeyNobodyReadsIsAWarning) {
  KeyedTracer keyed(/*forwards=*/false);
  policy_.tracers = {&keyed};
  auto& config = *request_.mutable_opts()->mutable_advanced_configuration();
  config["keyed_mode"].set_string_value("fine");
  config["clusterprof_outlive_client"].set_bool_value(true);
  config["override_hostname"].set_string_value("h");
  absl::StatusOr<CaptureRequest> parsed = Parse();
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_TRUE(parsed->warnings.empty()) << parsed->warnings.front();

  config["keyed_mode"].set_string_value("bad");
  EXPECT_EQ(Parse().status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(Parse().status().message()), HasSubstr("keyed_mode"));

  config["keyed_mode"].set_string_value("fine");
  config["tpu_trace_mode"].set_string_value("TRACE_ONLY_XLA");
  parsed = Parse();
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_EQ(parsed->warnings.size(), 1u);
  EXPECT_THAT(parsed->warnings[0], HasSubstr("\"tpu_trace_mode\""));
  EXPECT_THAT(parsed->warnings[0], HasSubstr("ignored"));
  EXPECT_THAT(parsed->warnings[0], HasSubstr("keyed_mode")) << "names the keys that are read";
  EXPECT_EQ(parsed->config.options.advanced_configuration().count("tpu_trace_mode"), 1u)
      << "the options reach the tracers as sent";

  request_.mutable_opts()->set_version(0);
  request_.set_duration_ms(100);
  parsed = Parse();
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_TRUE(parsed->warnings.empty()) << "version 0 discards every option, so none is unknown";
}

TEST_F(CaptureRequestTest, NoKeyIsUnknownWhileATracerHandsTheOptionsOnWhole) {
  KeyedTracer forwarding(/*forwards=*/true);
  policy_.tracers = {&forwarding};
  (*request_.mutable_opts()->mutable_advanced_configuration())["tpu_trace_mode"].set_string_value(
      "TRACE_ONLY_XLA");
  request_.mutable_opts()->set_python_tracer_level(1);
  absl::StatusOr<CaptureRequest> parsed = Parse();
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_TRUE(parsed->warnings.empty()) << parsed->warnings.front();

  request_.mutable_opts()->set_python_tracer_level(0);  // the forwarding tracer sits this out
  parsed = Parse();
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->warnings.size(), 1u);
}

TEST_F(CaptureRequestTest, BadGpuOptionsAreRefusedNamingTheKey) {
  // The sidecar's own GPU tracer checks its keys.
  TempDir shm_dir;
  std::unique_ptr<ShmTransport> shm = *ShmTransport::Create({.dir = shm_dir.path()});
  std::unique_ptr<GpuTracer> gpu = *GpuTracer::Create(shm.get(), {}, nullptr);
  policy_.tracers = {gpu.get()};
  auto& config = *request_.mutable_opts()->mutable_advanced_configuration();
  config["gpu_max_activity_api_events"].set_string_value("lots");
  absl::StatusOr<CaptureRequest> parsed = Parse();
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(parsed.status().message()),
              ::testing::HasSubstr("gpu_max_activity_api_events"));

  config.clear();
  config["gpu_max_callback_api_events"].set_int64_value(0);
  EXPECT_FALSE(Parse().ok()) << "a cap must be positive";

  config.clear();
  config["gpu_enable_nvtx_tracking"].set_int64_value(1);
  EXPECT_THAT(std::string(Parse().status().message()),
              ::testing::HasSubstr("gpu_enable_nvtx_tracking"));

  config.clear();
  config["clusterprof_gpu_api_tracing"].set_string_value("kernel");
  EXPECT_THAT(std::string(Parse().status().message()), ::testing::HasSubstr("\"kernel\""));
}

TEST_F(CaptureRequestTest, TheDigestsPatternsAreTakenAndABadOneIsRefusedNamingTheKey) {
  auto& config = *request_.mutable_opts()->mutable_advanced_configuration();
  config["clusterprof_step_pattern"].set_string_value("^train_step$");
  config["clusterprof_input_pattern"].set_string_value("my_loader");
  absl::StatusOr<CaptureRequest> parsed = Parse();
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->digest_options.step_pattern, "^train_step$");
  EXPECT_EQ(parsed->digest_options.input_pattern, "my_loader");
  EXPECT_EQ(parsed->digest_options.collective_pattern, analysis::kDefaultCollectivePattern);
  EXPECT_TRUE(parsed->warnings.empty()) << "the sidecar reads these keys itself";

  config["clusterprof_collective_pattern"].set_string_value("nccl[");
  parsed = Parse();
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(parsed.status().message()),
              ::testing::HasSubstr("the collective pattern 'nccl[' is not a regular expression"));

  config.erase("clusterprof_collective_pattern");
  config["clusterprof_step_pattern"].set_int64_value(3);
  EXPECT_THAT(std::string(Parse().status().message()),
              ::testing::HasSubstr("clusterprof_step_pattern\"] must be a string"));
}

TEST_F(CaptureRequestTest, DurationFallsBackToTheRequestField) {
  request_.mutable_opts()->set_duration_ms(0);
  request_.set_duration_ms(250);
  auto parsed = Parse();
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(parsed->duration_ns, 250 * 1'000'000LL);

  request_.set_duration_ms(0);
  EXPECT_EQ(Parse().status().code(), absl::StatusCode::kInvalidArgument);
  request_.set_duration_ms(policy_.max_duration_ms + 1);
  EXPECT_THAT(std::string(Parse().status().message()), HasSubstr("longer than"));
}

TEST_F(CaptureRequestTest, HostNamePrecedence) {
  (*request_.mutable_opts()->mutable_advanced_configuration())["override_hostname"]
      .set_string_value("from-advanced");
  EXPECT_EQ(Parse()->host_name, "from-advanced");
  request_.mutable_opts()->set_override_hostname("from-opts");
  EXPECT_EQ(Parse()->host_name, "from-opts");
  request_.mutable_opts()->clear_override_hostname();
  request_.mutable_opts()->clear_advanced_configuration();
  request_.clear_host_name();
  EXPECT_EQ(Parse()->host_name, "pod-7") << "the sidecar's own name last";
}

TEST_F(CaptureRequestTest, SessionIdFromOptsWinsAndAMissingOneIsDated) {
  request_.mutable_opts()->set_session_id("from_opts");
  EXPECT_EQ(Parse()->session_id, "from_opts");
  request_.mutable_opts()->clear_session_id();
  request_.clear_session_id();
  EXPECT_EQ(Parse()->session_id, "2026_01_01_00_00_00");
}

TEST_F(CaptureRequestTest, UnsafeNamesAreInvalidArguments) {
  const std::string too_long(300, 'x');
  for (const std::string& bad : {std::string(".."), std::string("../../etc"), std::string("a/b"),
                                 std::string("."), too_long}) {
    request_.set_session_id(bad);
    EXPECT_EQ(Parse().status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  request_.set_session_id("ok");
  for (const char* bad : {"../x", "a/b", "..", "evil\n"}) {
    request_.mutable_opts()->set_override_hostname(bad);
    EXPECT_EQ(Parse().status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST_F(CaptureRequestTest, RootsOutsideTheAllowedLogdirsArePermissionDenied) {
  TempDir elsewhere;
  request_.set_repository_root(elsewhere.Join("plugins/profile"));
  auto parsed = Parse();
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(parsed.status().message()), HasSubstr(allowed_.path()));

  // A sibling whose name merely starts with the allowed path.
  request_.set_repository_root(allowed_.path() + "-evil/plugins/profile");
  EXPECT_EQ(Parse().status().code(), absl::StatusCode::kPermissionDenied);

  // '..' never gets past the parser.
  request_.set_repository_root(allowed_.Join("../x/plugins/profile"));
  EXPECT_EQ(Parse().status().code(), absl::StatusCode::kInvalidArgument);

  request_.set_repository_root("gs://bucket/tb/plugins/profile");
  EXPECT_EQ(Parse().status().code(), absl::StatusCode::kPermissionDenied);
}

TEST_F(CaptureRequestTest, ASymlinkCannotLeadOutOfAnAllowedLogdir) {
  TempDir outside;
  ASSERT_EQ(symlink(outside.path().c_str(), allowed_.Join("link").c_str()), 0);
  request_.set_repository_root(allowed_.Join("link/tb/plugins/profile"));
  EXPECT_EQ(Parse().status().code(), absl::StatusCode::kPermissionDenied);
}

// The files are written walking down from the allowed prefix, so the request must name it: as
// configured, or as its real path; a path that reaches it through a link elsewhere is refused
// before anything is captured.
TEST_F(CaptureRequestTest, ARootMustNameTheAllowedPrefixItselfOrItsRealPath) {
  TempDir elsewhere;
  const std::string alias = elsewhere.Join("alias");
  ASSERT_EQ(symlink(allowed_.path().c_str(), alias.c_str()), 0);
  request_.set_repository_root(StrCat(alias, "/tb/plugins/profile"));
  EXPECT_EQ(Parse().status().code(), absl::StatusCode::kPermissionDenied);

  policy_.allowed_logdirs = {*storage::ParseLogdir(alias)};
  EXPECT_TRUE(Parse().ok()) << "named as configured";
  request_.set_repository_root(
      StrCat(std::filesystem::canonical(allowed_.path()).string(), "/tb/plugins/profile"));
  EXPECT_TRUE(Parse().ok()) << "named by its real path";

  // A link inside the prefix that stays inside is fine.
  ASSERT_EQ(symlink("tb", allowed_.Join("inside").c_str()), 0);
  request_.set_repository_root(allowed_.Join("inside/plugins/profile"));
  EXPECT_TRUE(Parse().ok());
}

TEST_F(CaptureRequestTest, RelativeOrMissingRootsAndNoPrefixesAreRefused) {
  request_.set_repository_root("tb/plugins/profile");
  EXPECT_THAT(std::string(Parse().status().message()),
              HasSubstr("repository_root: \"tb/plugins/profile\" is neither gs://bucket/prefix "
                        "nor an absolute path"));
  request_.set_repository_root("");
  EXPECT_THAT(std::string(Parse().status().message()), HasSubstr("emit_xspace"));
  request_.set_repository_root(allowed_.Join("tb/not_the_profile_dir"));
  EXPECT_EQ(Parse().status().code(), absl::StatusCode::kInvalidArgument);

  request_.set_repository_root(allowed_.Join("tb/plugins/profile"));
  policy_.allowed_logdirs.clear();
  auto parsed = Parse();
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(parsed.status().message()), HasSubstr("--allowed-logdir"));
}

TEST_F(CaptureRequestTest, EmitXSpaceNeedsNoRootAndNoPermission) {
  policy_.allowed_logdirs.clear();
  request_.clear_repository_root();
  request_.set_emit_xspace(true);
  auto parsed = Parse();
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_FALSE(parsed->layout.has_value());
}

TEST_F(CaptureRequestTest, GcsPrefixesMatchWholeComponents) {
  policy_.allowed_logdirs = {*storage::ParseLogdir("gs://bucket/team")};
  request_.set_repository_root("gs://bucket/team/run/plugins/profile");
  EXPECT_TRUE(Parse().ok());
  request_.set_repository_root("gs://bucket/teammate/plugins/profile");
  EXPECT_EQ(Parse().status().code(), absl::StatusCode::kPermissionDenied);
}

}  // namespace
}  // namespace clusterprof::sidecar
