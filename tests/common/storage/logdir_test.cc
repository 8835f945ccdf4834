#include "common/storage/logdir.h"

#include "common/base/strings.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace clusterprof::storage {
namespace {

using ::testing::HasSubstr;

TEST(ParseLogdirTest, LocalPaths) {
  auto a = ParseLogdir("/data//tb/./run/");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->kind, Logdir::Kind::kLocal);
  EXPECT_EQ(a->uri, "/data/tb/run");
  EXPECT_EQ(ParseLogdir("file:///data/tb")->uri, "/data/tb");
  EXPECT_EQ(ParseLogdir("rel/dir", "/home/me")->uri, "/home/me/rel/dir");
  EXPECT_EQ(ParseLogdir("/")->uri, "/");
  EXPECT_EQ(ParseLogdir("/")->Join("plugins/profile"), "/plugins/profile");
}

TEST(ParseLogdirTest, Gcs) {
  auto a = ParseLogdir("gs://my-bucket/tensorboard//llama/");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->kind, Logdir::Kind::kGcs);
  EXPECT_EQ(a->bucket, "my-bucket");
  EXPECT_EQ(a->prefix, "tensorboard/llama");
  EXPECT_EQ(a->uri, "gs://my-bucket/tensorboard/llama");
  EXPECT_EQ(a->Join("plugins/profile"), "gs://my-bucket/tensorboard/llama/plugins/profile");
  EXPECT_EQ(ParseLogdir("gs://bkt")->uri, "gs://bkt");
}

TEST(ParseLogdirTest, Rejections) {
  struct Case {
    const char* input;
    const char* message;
  };
  for (const Case& c :
       {Case{"", "empty"}, Case{"   ", "empty"}, Case{"s3://bucket/x", "unsupported scheme 's3'"},
        Case{"/data/../etc", "'..'"}, Case{"gs://Bad_Bucket/x", "invalid bucket"},
        Case{"gs://ab", "invalid bucket"}, Case{"gs://bucket/a/../b", "'..'"},
        Case{"file://relative", "absolute path"}}) {
    auto result = ParseLogdir(c.input, "/cwd");
    EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument) << c.input;
    EXPECT_THAT(result.status().message(), HasSubstr(c.message)) << c.input;
  }
}

TEST(ValidatePathComponentTest, SafeAndUnsafeNames) {
  EXPECT_TRUE(ValidatePathComponent("run name", "2026_05_06_04_47_36").ok());
  EXPECT_TRUE(ValidatePathComponent("run name", "step-1200.a b").ok());
  for (std::string_view bad :
       {std::string_view(""), std::string_view("."), std::string_view(".."),
        std::string_view("a/b"), std::string_view("a\\b"), std::string_view("x\ny"),
        std::string_view("nul\0x", 5), std::string_view("del\x7f")}) {
    auto status = ValidatePathComponent("run name", bad);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(status.message(), HasSubstr("run name"));
  }
  EXPECT_FALSE(ValidatePathComponent("run name", std::string(256, 'a')).ok());
}

TEST(HostFileStemTest, ReplacesColons) {
  EXPECT_EQ(*HostFileStem("10.0.0.2:8466"), "10.0.0.2_8466");
  EXPECT_EQ(*HostFileStem("llama-trainer-0"), "llama-trainer-0");
  EXPECT_FALSE(HostFileStem("../etc/passwd").ok());
  EXPECT_FALSE(HostFileStem("").ok());
}

TEST(RunLayoutTest, Paths) {
  auto layout = RunLayout::Create(*ParseLogdir("/tb"), "2026_01_01_00_00_00");
  ASSERT_TRUE(layout.ok());
  EXPECT_EQ(layout->RepositoryRoot(), "/tb/plugins/profile");
  EXPECT_EQ(layout->RunDir(), "/tb/plugins/profile/2026_01_01_00_00_00");
  EXPECT_EQ(layout->XPlanePath("h"), "/tb/plugins/profile/2026_01_01_00_00_00/h.xplane.pb");
  EXPECT_EQ(layout->TraceJsonPath("h"), "/tb/plugins/profile/2026_01_01_00_00_00/h.trace.json.gz");
  EXPECT_EQ(layout->ManifestPath(), "/tb/plugins/profile/2026_01_01_00_00_00/clusterprof_run.json");
  EXPECT_FALSE(RunLayout::Create(*ParseLogdir("/tb"), "../x").ok());
}

TEST(RunLayoutTest, FromRepositoryRoot) {
  auto layout = RunLayout::FromRepositoryRoot(*ParseLogdir("gs://bkt/tb/plugins/profile"), "r1");
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->logdir().uri, "gs://bkt/tb");
  EXPECT_EQ(layout->logdir().prefix, "tb");
  EXPECT_EQ(layout->XPlanePath("h"), "gs://bkt/tb/plugins/profile/r1/h.xplane.pb");
  EXPECT_EQ(layout->RunDirLogdir().uri, "gs://bkt/tb/plugins/profile/r1");
  EXPECT_EQ(layout->RunDirLogdir().prefix, "tb/plugins/profile/r1");
  auto bad = RunLayout::FromRepositoryRoot(*ParseLogdir("/tb/somewhere"), "r1");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("plugins/profile"));
  auto root = RunLayout::FromRepositoryRoot(*ParseLogdir("/plugins/profile"), "r1");
  EXPECT_EQ(root.status().code(), absl::StatusCode::kInvalidArgument);
}

// Below and Above give what parsing the longer or shorter text would, without parsing it.
TEST(LogdirTest, BelowAndAboveAgreeWithParsing) {
  auto same = [](const Logdir& a, const Logdir& b) {
    return a.kind == b.kind && a.uri == b.uri && a.bucket == b.bucket && a.prefix == b.prefix;
  };
  for (const std::string root : {"/", "/tb", "/data/tb", "gs://bkt", "gs://bkt/p/q", "file:///x"}) {
    SCOPED_TRACE(root);
    const Logdir parsed = *ParseLogdir(root);
    const Logdir below = parsed.Below("plugins/profile");
    const Logdir longer =
        *ParseLogdir(StrCat(root, root.back() == '/' ? "" : "/", "plugins/profile"));
    EXPECT_TRUE(same(below, longer)) << below.uri << " vs " << longer.uri;
    std::optional<Logdir> above = below.Above("plugins/profile");
    ASSERT_TRUE(above.has_value());
    EXPECT_TRUE(same(*above, parsed)) << above->uri << " vs " << parsed.uri;
  }
  EXPECT_FALSE(ParseLogdir("/tb/xplugins/profile")->Above("plugins/profile").has_value());
  EXPECT_FALSE(ParseLogdir("gs://bkt/xplugins/profile")->Above("plugins/profile").has_value());
  EXPECT_FALSE(ParseLogdir("gs://bkt/tb")->Above("plugins/profile").has_value());
}

TEST(LogdirTest, AbsoluteLogdirsOnlyFromElsewhere) {
  EXPECT_EQ(ParseAbsoluteLogdir("gs://bkt/tb")->uri, "gs://bkt/tb");
  EXPECT_EQ(ParseAbsoluteLogdir("/data/tb/")->uri, "/data/tb");
  EXPECT_EQ(ParseAbsoluteLogdir("file:///data/tb")->uri, "/data/tb");
  for (const char* text : {"relative/dir", "./x", "s3://b/x", "file://host/x", " gs://b/x"}) {
    absl::StatusOr<Logdir> refused = ParseAbsoluteLogdir(text);
    ASSERT_FALSE(refused.ok()) << text;
    EXPECT_THAT(refused.status().message(),
                HasSubstr(StrCat("\"", text,
                                 "\" is neither gs://bucket/prefix nor an absolute "
                                 "path")));
  }
  // What ParseLogdir refuses stays refused, with its own reason.
  EXPECT_THAT(ParseAbsoluteLogdir("gs://B/x").status().message(), HasSubstr("bucket name"));
  EXPECT_THAT(ParseAbsoluteLogdir("").status().message(), HasSubstr("logdir is empty"));
}

TEST(DefaultRunNameTest, UpstreamFormat) {
  // 2026-05-06T04:47:36Z
  EXPECT_EQ(DefaultRunName(1'778'042'856'000'000'000), "2026_05_06_04_47_36");
}

}  // namespace
}  // namespace clusterprof::storage
