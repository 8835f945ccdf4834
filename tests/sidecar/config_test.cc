// sidecar::LoadSidecarConfigFile: YAML files with every setting, none, and the mistakes people
// make (unknown keys, wrong types, missing files).
#include "sidecar/config.h"

#include <sys/stat.h>
#include <unistd.h>

#include <string>

#include "common/base/strings.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sidecar/server.h"
#include "tests/support/temp_dir.h"

namespace clusterprof::sidecar {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::TempDir;

// The file's contents at `dir`/sidecar.yaml; returns its path.
std::string WriteConfig(const TempDir& dir, const std::string& yaml) {
  const std::string path = dir.Join("sidecar.yaml");
  testing::WriteFileOrDie(path, yaml);
  return path;
}

void ExpectDefaults(const SidecarConfig& config) {
  const SidecarConfig defaults;
  EXPECT_EQ(config.address, defaults.address);
  EXPECT_EQ(config.port, defaults.port);
  EXPECT_EQ(config.http_port, defaults.http_port);
  EXPECT_EQ(config.host_name, defaults.host_name);
  EXPECT_EQ(config.allowed_logdirs, defaults.allowed_logdirs);
  EXPECT_EQ(config.shm_dir, defaults.shm_dir);
  EXPECT_EQ(config.max_duration_ms, defaults.max_duration_ms);
  EXPECT_EQ(config.max_profile_calls, defaults.max_profile_calls);
  EXPECT_EQ(config.max_events, defaults.max_events);
  EXPECT_EQ(config.log_format, defaults.log_format);
  EXPECT_EQ(config.log_level, defaults.log_level);
  EXPECT_EQ(config.port_file, defaults.port_file);
}

TEST(SidecarConfigTest, FullFileSetsEverySetting) {
  TempDir dir;
  const std::string path = WriteConfig(dir,
                                       "address: 127.0.0.1\n"
                                       "port: 9466\n"
                                       "http_port: -1\n"
                                       "host_name: worker-3\n"
                                       "allowed_logdirs:\n"
                                       "  - /data/tb\n"
                                       "  - gs://bucket/tb\n"
                                       "shm_dir: /dev/shm/clusterprof\n"
                                       "max_duration_ms: 30000\n"
                                       "max_profile_calls: 8\n"
                                       "max_events: 123456789012\n"
                                       "log_format: json\n"
                                       "log_level: debug\n"
                                       "port_file: /tmp/ports\n"
                                       "start_realtime: false\n"
                                       "start_spin_us: 200\n");
  SidecarConfig config;
  ASSERT_TRUE(LoadSidecarConfigFile(path, &config).ok());
  EXPECT_EQ(config.address, "127.0.0.1");
  EXPECT_EQ(config.port, 9466);
  EXPECT_EQ(config.http_port, -1);
  EXPECT_EQ(config.host_name, "worker-3");
  EXPECT_THAT(config.allowed_logdirs, ElementsAre("/data/tb", "gs://bucket/tb"));
  EXPECT_EQ(config.shm_dir, "/dev/shm/clusterprof");
  EXPECT_EQ(config.max_duration_ms, 30000);
  EXPECT_EQ(config.max_profile_calls, 8);
  EXPECT_EQ(config.max_events, 123456789012u);
  EXPECT_EQ(config.log_format, "json");
  EXPECT_EQ(config.log_level, "debug");
  EXPECT_EQ(config.port_file, "/tmp/ports");
  EXPECT_FALSE(config.start_realtime);
  EXPECT_EQ(config.start_spin_us, 200);
}

TEST(SidecarConfigTest, EmptyFileSetsNothing) {
  TempDir dir;
  for (const char* yaml : {"", "\n", "# only a comment\n", "---\n"}) {
    SidecarConfig config;
    const absl::Status status = LoadSidecarConfigFile(WriteConfig(dir, yaml), &config);
    ASSERT_TRUE(status.ok()) << "'" << yaml << "': " << status;
    ExpectDefaults(config);
  }
}

TEST(SidecarConfigTest, KeepsWhatTheFileDoesNotSet) {
  TempDir dir;
  SidecarConfig config;
  config.host_name = "from-flags";
  config.allowed_logdirs = {"/earlier"};
  ASSERT_TRUE(LoadSidecarConfigFile(WriteConfig(dir, "port: 1234\n"), &config).ok());
  EXPECT_EQ(config.port, 1234);
  EXPECT_EQ(config.host_name, "from-flags");
  EXPECT_THAT(config.allowed_logdirs, ElementsAre("/earlier"));
}

TEST(SidecarConfigTest, AllowedLogdirsMayBeAScalarOrAList) {
  TempDir dir;
  SidecarConfig scalar;
  ASSERT_TRUE(LoadSidecarConfigFile(WriteConfig(dir, "allowed_logdirs: /data/tb\n"), &scalar).ok());
  EXPECT_THAT(scalar.allowed_logdirs, ElementsAre("/data/tb"));

  SidecarConfig flow;
  ASSERT_TRUE(
      LoadSidecarConfigFile(WriteConfig(dir, "allowed_logdirs: [/a, 'gs://b/c']\n"), &flow).ok());
  EXPECT_THAT(flow.allowed_logdirs, ElementsAre("/a", "gs://b/c"));

  // A list in the file replaces what was there, it does not append.
  SidecarConfig replaced;
  replaced.allowed_logdirs = {"/old"};
  ASSERT_TRUE(
      LoadSidecarConfigFile(WriteConfig(dir, "allowed_logdirs:\n  - /new\n"), &replaced).ok());
  EXPECT_THAT(replaced.allowed_logdirs, ElementsAre("/new"));
}

TEST(SidecarConfigTest, UnknownKeyIsAnErrorThatNamesIt) {
  TempDir dir;
  const std::string path = WriteConfig(dir, "port: 1\nallowed_logdir: /data/tb\n");
  SidecarConfig config;
  const absl::Status status = LoadSidecarConfigFile(path, &config);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  // It names the key, the file, and what the known keys are (the likely typo's fix).
  EXPECT_THAT(std::string(status.message()),
              AllOf(HasSubstr("'allowed_logdir'"), HasSubstr(path), HasSubstr("allowed_logdirs")));
}

TEST(SidecarConfigTest, WrongTypeNamesTheKeyAndLine) {
  TempDir dir;
  struct Case {
    const char* yaml;
    const char* key;
    const char* line;
  };
  for (const Case& c : {
           Case{"address: 0.0.0.0\nhost_name: h\nport: \"abc\"\n", "port", "line 3"},
           Case{"http_port: 1.5\n", "http_port", "line 1"},
           Case{"max_duration_ms: [1, 2]\n", "max_duration_ms", "line 1"},
           Case{"\nallowed_logdirs:\n  a: b\n", "allowed_logdirs", "line 3"},
           Case{"allowed_logdirs:\n  - [/nested]\n", "allowed_logdirs", "line 2"},
           Case{"host_name: {a: b}\n", "host_name", "line 1"},
       }) {
    SidecarConfig config;
    const std::string path = WriteConfig(dir, c.yaml);
    const absl::Status status = LoadSidecarConfigFile(path, &config);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.yaml;
    EXPECT_THAT(std::string(status.message()),
                AllOf(HasSubstr(std::string("'") + c.key + "'"), HasSubstr(c.line), HasSubstr(path),
                      HasSubstr("wrong type")))
        << c.yaml;
  }
}

TEST(SidecarConfigTest, NegativeValueForAnUnsignedSettingIsRejected) {
  TempDir dir;
  SidecarConfig config;
  const absl::Status status = LoadSidecarConfigFile(WriteConfig(dir, "max_events: -1\n"), &config);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << config.max_events;
  EXPECT_THAT(std::string(status.message()), HasSubstr("'max_events'"));
}

TEST(SidecarConfigTest, KeyThatIsNotAStringIsAnError) {
  // A key that is a sequence or a mapping is an error naming the file and line, not an
  // exception out of the loader.
  TempDir dir;
  for (const char* yaml : {"[port, http_port]: 1\n", "{a: b}: 1\n", "? - port\n: 1\n"}) {
    SidecarConfig config;
    const std::string path = WriteConfig(dir, yaml);
    absl::Status status;
    EXPECT_NO_THROW(status = LoadSidecarConfigFile(path, &config)) << yaml;
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << yaml;
    EXPECT_THAT(std::string(status.message()), HasSubstr(path)) << yaml;
  }
}

TEST(SidecarConfigTest, MissingFileIsNotFound) {
  TempDir dir;
  SidecarConfig config;
  const absl::Status status = LoadSidecarConfigFile(dir.Join("absent.yaml"), &config);
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(status.message()), HasSubstr(dir.Join("absent.yaml")));
  ExpectDefaults(config);
}

TEST(SidecarConfigTest, NotAMappingOrNotYamlIsInvalidArgument) {
  TempDir dir;
  for (const char* yaml : {"- port\n- 1\n", "just a string\n", "port: [1, 2\n", "a: b: c\n"}) {
    SidecarConfig config;
    const std::string path = WriteConfig(dir, yaml);
    const absl::Status status = LoadSidecarConfigFile(path, &config);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << yaml;
    EXPECT_THAT(std::string(status.message()), HasSubstr(path)) << yaml;
  }
}

// --install-injection-library: the GPU tracing library copied into the pod's shared volume.

TEST(InstallInjectionLibraryTest, CopiesTheLibraryExecutableAndReplacesAnOldCopy) {
  TempDir source_dir, shm_dir;
  const std::string source = source_dir.Join("libclusterprof_cupti.so");
  testing::WriteFileOrDie(source, "new library");
  const std::string target = shm_dir.Join("libclusterprof_cupti.so");
  testing::WriteFileOrDie(target, "an older library, still loaded by a running process");
  struct stat before;
  ASSERT_EQ(stat(target.c_str(), &before), 0);

  ASSERT_TRUE(InstallInjectionLibrary(source, shm_dir.path()).ok());
  EXPECT_EQ(testing::ReadFileOrDie(target), "new library");
  struct stat after;
  ASSERT_EQ(stat(target.c_str(), &after), 0);
  EXPECT_EQ(after.st_mode & 0777, 0755u);
  // A new file, not the old one rewritten: processes that mapped the old copy keep it whole.
  EXPECT_NE(after.st_ino, before.st_ino);
  EXPECT_FALSE(testing::FileExists(StrCat(target, ".tmp")));
}

// The shared-memory directory is the workloads' too: a link one of them left at the temporary
// name must not make the sidecar overwrite the file it points to.
TEST(InstallInjectionLibraryTest, ALinkAtTheTemporaryNameIsNotFollowed) {
  TempDir source_dir, shm_dir, elsewhere;
  const std::string source = source_dir.Join("libclusterprof_cupti.so");
  testing::WriteFileOrDie(source, "new library");
  const std::string victim = elsewhere.Join("victim");
  testing::WriteFileOrDie(victim, "precious");
  const std::string target = shm_dir.Join("libclusterprof_cupti.so");
  ASSERT_EQ(symlink(victim.c_str(), StrCat(target, ".tmp").c_str()), 0);

  ASSERT_TRUE(InstallInjectionLibrary(source, shm_dir.path()).ok());
  EXPECT_EQ(testing::ReadFileOrDie(victim), "precious");
  EXPECT_EQ(testing::ReadFileOrDie(target), "new library");
  EXPECT_FALSE(testing::FileExists(StrCat(target, ".tmp")));
}

TEST(InstallInjectionLibraryTest, SaysWhatIsMissing) {
  TempDir shm_dir;
  absl::Status status =
      InstallInjectionLibrary("/nonexistent/libclusterprof_cupti.so", shm_dir.path());
  EXPECT_TRUE(absl::IsNotFound(status)) << status;
  EXPECT_THAT(status.message(), AllOf(HasSubstr("/nonexistent/libclusterprof_cupti.so"),
                                      HasSubstr("--install-injection-library")));
  TempDir source_dir;
  testing::WriteFileOrDie(source_dir.Join("lib.so"), "x");
  status = InstallInjectionLibrary(source_dir.Join("lib.so"), "/nonexistent-dir");
  EXPECT_FALSE(status.ok());
}

TEST(InstallInjectionLibraryTest, ConfigFileNamesIt) {
  TempDir dir;
  SidecarConfig config;
  ASSERT_TRUE(
      LoadSidecarConfigFile(
          WriteConfig(dir, "install_injection_library: /usr/lib/clusterprof/lib.so\n"), &config)
          .ok());
  EXPECT_EQ(config.install_injection_library, "/usr/lib/clusterprof/lib.so");
}

}  // namespace
}  // namespace clusterprof::sidecar
