// clusterprof top: the table from the sidecars' live steps (BuildTopTable, FormatTopTable), and
// `clusterprof top --once` against real sidecars and train_loop ranks, one of them slow.
#include <chrono>
#include <cstdio>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_join.h"
#include "cli/commands.h"
#include "cli/top_table.h"
#include "common/base/strings.h"
#include "common/http/health_server.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/subprocess.h"
#include "tests/support/temp_dir.h"

namespace clusterprof::cli {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kMs = 1'000'000;
constexpr int64_t kNow = 1'800'000'000'000'000'000;

// `steps` 100 ms steps ending 50 ms ago on our clock; the host enters the collectives
// `late_ms` after the others; its clock is `offset_ms` ahead of ours.
coordinator::WatchedSidecar Host(const std::string& name, int late_ms, int offset_ms = 0,
                                 int steps = 30) {
  coordinator::WatchedSidecar s;
  s.address = name + ":8466";
  s.host_name = name;
  s.connected = true;
  s.last_message_ns = kNow;
  s.processes = 1;
  s.recorder_level = 2;
  s.recorder_window_ms = 30'000;
  s.clock_offset_ns = offset_ms * kMs;
  const int64_t end = kNow - 50 * kMs + s.clock_offset_ns;
  for (int i = 0; i < steps; ++i) {
    analysis::StepDigest step;
    step.step = i;
    step.end_ns = end - (steps - 1 - i) * 100 * kMs;
    step.start_ns = step.end_ns - 100 * kMs;
    step.collective_entry_ns = step.start_ns + (50 + late_ms + (i % 3)) * kMs;
    s.steps.push_back(step);
  }
  s.last_step_end_ns = end;
  s.steps_total = steps;
  return s;
}

TEST(TopTableTest, NamesTheLateHostOnOneClockAndSaysWhyOthersHaveNoRow) {
  coordinator::WatchedSidecar down;
  down.address = "10.0.0.9:8466";
  down.error = "UNAVAILABLE: failed to connect to all addresses";
  coordinator::WatchedSidecar silent = Host("idle", 0, 0, 0);
  silent.processes = 2;
  silent.step_source = "events with a step_num stat";
  const TopTable table = BuildTopTable(
      {Host("a", 0, /*offset_ms=*/3000), Host("b", 30), Host("c", 0, -2000), down, silent}, 20,
      kNow);
  ASSERT_EQ(table.rows.size(), 5u);
  EXPECT_EQ(table.rows[0].verdict, "ok");
  EXPECT_EQ(table.rows[1].verdict, "straggler") << table.rows[1].detail;
  EXPECT_EQ(table.rows[2].verdict, "ok") << "its clock is 2 s behind, not its steps";
  EXPECT_NEAR(table.rows[1].lateness_ns, 30 * kMs, 2 * kMs);
  EXPECT_EQ(table.rows[0].lateness_ns, 0);
  EXPECT_EQ(table.rows[1].step_p50_ns, 100 * kMs);
  EXPECT_EQ(table.rows[0].since_last_step_ns, 50 * kMs);
  EXPECT_EQ(table.rows[3].verdict, "unreachable");
  EXPECT_EQ(table.unreachable, 1);
  EXPECT_EQ(table.rows[4].verdict, "no steps");
  EXPECT_THAT(table.rows[4].detail, HasSubstr("2 process(es) attached, none marks steps"));
  EXPECT_EQ(table.compared_steps, 20);

  const std::string text = FormatTopTable(table, 20, kNow);
  EXPECT_THAT(text, HasSubstr("STEP TIME"));
  EXPECT_THAT(text, HasSubstr("b: enters the collectives"));
  EXPECT_THAT(text, HasSubstr("10.0.0.9:8466: UNAVAILABLE"));
}

TEST(TopTableTest, AHostWithoutStepsForLongIsStalled) {
  coordinator::WatchedSidecar stuck = Host("stuck", 0);
  for (analysis::StepDigest& step : stuck.steps) {
    step.start_ns -= 60'000 * kMs;
    step.end_ns -= 60'000 * kMs;
    step.collective_entry_ns -= 60'000 * kMs;
  }
  stuck.last_step_end_ns -= 60'000 * kMs;
  const TopTable table = BuildTopTable({Host("a", 0), stuck}, 20, kNow);
  EXPECT_EQ(table.rows[1].verdict, "stalled");
  EXPECT_THAT(table.rows[1].detail, HasSubstr("no step for 60.0 s"));
}

TEST(TopCommandTest, OnceAgainstRealSidecarsNamesTheSlowRank) {
  testing::TempDir root;
  std::vector<std::unique_ptr<testing::Subprocess>> processes;
  std::vector<std::string> addresses;
  for (int rank = 0; rank < 3; ++rank) {
    const std::string shm = root.Join(StrCat("shm", rank));
    const std::string ports = root.Join(StrCat("ports", rank));
    processes.push_back(std::make_unique<testing::Subprocess>(
        std::vector<std::string>{CLUSTERPROF_SIDECAR_PATH, "--port", "0", "--http-port", "-1",
                                 "--shm-dir", shm, "--port-file", ports, "--host-name",
                                 StrCat("rank-", rank), "--no-gpu"},
        std::map<std::string, std::string>{}, root.Join(StrCat("sidecar", rank, ".log"))));
    const int port = testing::ReadGrpcPort(ports);
    ASSERT_NE(port, 0);
    addresses.push_back(StrCat("127.0.0.1:", port));
    processes.push_back(std::make_unique<testing::Subprocess>(
        std::vector<std::string>{CLUSTERPROF_TRAIN_LOOP_PATH, "--sync-dir", root.Join("sync"),
                                 "--world", "3", "--rank", StrCat(rank), "--step-ms", "60",
                                 "--busy-percent", "20", "--seconds", "60", "--straggle-ms",
                                 rank == 1 ? "40" : "0"},
        std::map<std::string, std::string>{{"CLUSTERPROF_DIR", shm}},
        root.Join(StrCat("rank", rank, ".log"))));
  }
  // A few seconds of steps first: --once prints as soon as every host has sent one.
  std::this_thread::sleep_for(std::chrono::seconds(4));
  TopOptions options;
  options.service_addr = absl::StrJoin(addresses, ",");
  options.once = true;
  options.steps = 20;
  std::ostringstream out, err;
  EXPECT_EQ(RunTop(options, out, err), kExitOk) << err.str();
  const std::string table = out.str();
  EXPECT_THAT(table, HasSubstr("rank-0"));
  EXPECT_THAT(table, ::testing::ContainsRegex("rank-1 +[0-9]+ .* straggler")) << table;
  EXPECT_THAT(table, ::testing::ContainsRegex("rank-2 +[0-9]+ .* ok")) << table;

  // A host that is not there: exit 1, and the row says so.
  options.service_addr = StrCat(addresses[0], ",127.0.0.1:1");
  options.timeout_ms = 3000;
  std::ostringstream out2, err2;
  EXPECT_EQ(RunTop(options, out2, err2), kExitFailure);
  EXPECT_THAT(out2.str(), HasSubstr("unreachable"));
}

TEST(TopCommandTest, TheOperatorsViewOfATriggerMakesTheSameTable) {
  // The operator's health port answers GET /triggers/<namespace>/<name> (manager.cc); a stand-in
  // serves what ProfileTriggerController::StepsJson writes.
  const std::string view = R"({"trigger": "training/t", "sidecars": [
    {"address": "10.0.0.1:8466", "pod": "rank-0", "connected": true, "error": "",
     "lastMessageNs": 1, "clockOffsetNs": 0, "clockUncertaintyNs": 1000, "processes": 1,
     "processesWithSteps": 1, "stepSource": "events with a step_num stat", "stepsTotal": 2,
     "lastStepEndNs": 2000000000, "recorderLevel": 2, "recorderWindowMs": 30000,
     "steps": [[0, 1000000000, 1100000000, 1050000000], [1, 1100000000, 1200000000, 1150000000]]},
    {"address": "10.0.0.2:8466", "pod": "rank-1", "connected": false,
     "error": "UNAVAILABLE: connection refused", "lastMessageNs": 0, "clockOffsetNs": 0,
     "clockUncertaintyNs": -1, "processes": 0, "processesWithSteps": 0, "stepSource": "",
     "stepsTotal": 0, "lastStepEndNs": 0, "recorderLevel": 0, "recorderWindowMs": 0,
     "steps": []}]})";
  auto server =
      http::HealthServer::Start("127.0.0.1", 0, nullptr, nullptr,
                                [&](const std::string& path) -> std::optional<http::HealthAnswer> {
                                  if (path != "/triggers/training/t") return std::nullopt;
                                  return http::HealthAnswer{200, "application/json", view};
                                });
  ASSERT_TRUE(server.ok()) << server.status();
  TopOptions options;
  options.operator_addr = StrCat("127.0.0.1:", (*server)->port());
  options.profile_trigger = "training/t";
  options.once = true;
  options.timeout_ms = 500;
  std::ostringstream out, err;
  EXPECT_EQ(RunTop(options, out, err), kExitFailure) << "rank-1's sidecar is unreachable";
  EXPECT_THAT(out.str(), ::testing::ContainsRegex("rank-0 +1 "));
  EXPECT_THAT(out.str(), HasSubstr("rank-1: UNAVAILABLE: connection refused"));

  options.profile_trigger = "training/other";
  std::ostringstream out2, err2;
  EXPECT_EQ(RunTop(options, out2, err2), kExitFailure);
  EXPECT_THAT(out2.str(), HasSubstr("HTTP 404"));
}

TEST(TopCommandTest, BadOptionsAreUsageErrors) {
  TopOptions options;
  options.service_addr = "";
  std::ostringstream out, err;
  EXPECT_EQ(RunTop(options, out, err), kExitUsage);
  options.service_addr = "127.0.0.1:1";
  options.operator_addr = "127.0.0.1:1";
  options.profile_trigger = "ns/name";
  EXPECT_EQ(RunTop(options, out, err), kExitUsage) << "both modes at once";
  options.service_addr = "";
  options.profile_trigger = "no-namespace";
  EXPECT_EQ(RunTop(options, out, err), kExitUsage);
  options.operator_addr = "";
  options.profile_trigger = "";
  options.service_addr = "127.0.0.1:1";
  options.steps = 1;
  EXPECT_EQ(RunTop(options, out, err), kExitUsage);
  EXPECT_THAT(err.str(), HasSubstr("--steps 1 is out of range"));
}

}  // namespace
}  // namespace clusterprof::cli
