// clusterprof-chaos: the chaos suite (docs/reliability.md, "The chaos suite"). It runs the real
// operator, sidecars beside annotating workloads, kube-apiserver (through the fault proxy) and the
// GCS test server, injects one kind of fault per scenario at random instants, and after every
// trial checks the invariants against a ledger of every job and every file:
//
//   - every job reaches one final phase, exactly once;
//   - no run is captured twice (each trace object written once; the sidecars' capture counters);
//   - every target the status calls Succeeded has its files in the logdir, whole, with the CRC32C
//     the sidecar reported; files the status calls pending land within the retry window;
//   - no session is left running on a sidecar;
//   - the workloads never block or crash;
//   - the operator's memory returns to its baseline.
//
//   clusterprof-chaos [--seed N] [--long] [--scenario NAME]... [--trials N] [--trial K]
//                     [--results FILE] [--ledger FILE] [--logs DIR]
//
// Every random choice of a trial comes from a seed derived from --seed, the scenario and the
// trial's number, so `--seed N --scenario NAME --trial K` replays that trial's faults at the same
// instants. Exit status: 0 when every invariant held, 1 when one did not, 77 when this machine
// has no control plane to run against (scripts/install-kube-control-plane).
#include <sys/mount.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "CLI/CLI.hpp"
#include "absl/strings/str_join.h"
#include "common/base/strings.h"
#include "common/io/crc32c.h"
#include "common/xspace/xspace_io.h"
#include "operator/api/types.h"
#include "tests/chaos/ledger.h"
#include "tests/chaos/world.h"

namespace clusterprof::chaos {
namespace {

using Steady = std::chrono::steady_clock;
using std::chrono::milliseconds;
using web::json::value;

constexpr char kSourceDir[] = CLUSTERPROF_SOURCE_DIR;
constexpr char kOperator[] = CLUSTERPROF_OPERATOR_PATH;
constexpr char kSidecar[] = CLUSTERPROF_SIDECAR_PATH;
constexpr char kAnnotator[] = CLUSTERPROF_TEST_ANNOTATOR_PATH;

// How long a job may take to end once its faults are over, and a pending upload to land.
constexpr auto kEndTimeout = std::chrono::seconds(180);
constexpr auto kRetryWindow = std::chrono::seconds(120);
// The spool-full scenario's tmpfs.
constexpr uint64_t kSmallSpoolBytes = 4 << 20;
constexpr int64_t kDelayMs = 300;

struct Options {
  uint64_t seed = 1;
  bool long_mode = false;
  std::vector<std::string> scenarios;
  int trials = 0;
  int trial = -1;
  std::string results;
  std::string ledger;
  std::string logs;
};

double Seconds(Steady::duration d) { return std::chrono::duration<double>(d).count(); }

uint64_t TrialSeed(uint64_t seed, std::string_view scenario, int trial) {
  // FNV-1a over the three, then a SplitMix64 finish: stable across platforms and runs.
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](const void* data, size_t size) {
    for (size_t i = 0; i < size; ++i) {
      h ^= static_cast<const unsigned char*>(data)[i];
      h *= 1099511628211ull;
    }
  };
  mix(&seed, sizeof(seed));
  mix(scenario.data(), scenario.size());
  mix(&trial, sizeof(trial));
  h += 0x9e3779b97f4a7c15ull;
  h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
  h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
  return h ^ (h >> 31);
}

std::string Ms(int64_t ms) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.2f s", ms / 1000.0);
  return text;
}

class Chaos;

// One trial: its random source, its jobs, its faults and what the hosts looked like when it began.
struct Trial {
  Chaos* chaos;
  World* world;
  std::string scenario;
  std::mt19937_64 rng;
  TrialRecord record;
  Steady::time_point started = Steady::now();
  Steady::time_point healed = Steady::now();
  std::vector<std::string> jobs;
  std::vector<double> captures_before;
  std::vector<int64_t> heartbeats_before;
  std::set<std::string> sidecars_restarted;
  std::set<std::string> workloads_restarted;

  int64_t Uniform(int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  }
  bool Chance(double p) { return std::bernoulli_distribution(p)(rng); }
  void Fault(std::string what) { record.faults.push_back(std::move(what)); }
  void Heal() { healed = Steady::now(); }
  int64_t SinceStartMs() const {
    return std::chrono::duration_cast<milliseconds>(Steady::now() - started).count();
  }
  void SleepUntilMs(int64_t ms_after_start) {
    std::this_thread::sleep_until(started + milliseconds(ms_after_start));
  }
  void Violation(std::string what) { record.violations.push_back(std::move(what)); }
};

class Chaos {
 public:
  Chaos(World& world, Options options) : world_(world), options_(std::move(options)) {}

  Ledger& ledger() { return ledger_; }
  World& world() { return world_; }

  // A job over every host; `duration_ms` 0 picks one at random.
  std::string CreateJob(Trial& trial, int64_t duration_ms = 0) {
    const std::string name = StrCat(trial.scenario, "-", ++jobs_created_);
    value spec = value::object();
    spec["targets"]["selector"]["matchLabels"]["app"] = value::string("trainer");
    spec["durationMs"] = value::number(duration_ms > 0 ? duration_ms : trial.Uniform(500, 1200));
    spec["delayMs"] = value::number(kDelayMs);
    spec["logdir"] = value::string(StrCat("gs://", World::kBucket, "/", trial.scenario));
    spec["tracingAttempts"] = value::number(3);
    // The API server may be down or storming while a trial creates its job: keep trying.
    for (int attempt = 0;; ++attempt) {
      absl::StatusOr<value> created = world_.CreateJob(name, spec);
      if (created.ok() || absl::IsAlreadyExists(created.status())) break;
      if (attempt == 100) {
        trial.Violation(StrCat("could not create job ", name, ": ", created.status().ToString()));
        return name;
      }
      std::this_thread::sleep_for(milliseconds(200));
    }
    trial.jobs.push_back(name);
    return name;
  }

  // The job's status as the API server has it now; nullopt when it cannot be read or parsed.
  std::optional<api::ProfileJobStatus> JobStatus(const std::string& job) {
    absl::StatusOr<value> got = world_.GetJob(job);
    if (!got.ok() || !got->has_field("status")) return std::nullopt;
    absl::StatusOr<api::ProfileJobStatus> status = api::ParseProfileJobStatus(got->at("status"));
    if (!status.ok()) return std::nullopt;
    return *std::move(status);
  }

  // The job's start instant (wall ns) and run, once the operator has picked them; a start of 0
  // on timeout.
  std::pair<int64_t, std::string> WaitForStart(const std::string& job,
                                               std::chrono::seconds timeout) {
    const auto deadline = Steady::now() + timeout;
    while (Steady::now() < deadline) {
      if (std::optional<api::ProfileJobStatus> status = JobStatus(job);
          status.has_value() && status->start_time_ns != 0) {
        return {status->start_time_ns, status->run_name};
      }
      std::this_thread::sleep_for(milliseconds(50));
    }
    return {0, ""};
  }

  static void SleepUntilWallNs(int64_t wall_ns) {
    const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                            std::chrono::system_clock::now().time_since_epoch())
                            .count();
    if (wall_ns > now) std::this_thread::sleep_for(std::chrono::nanoseconds(wall_ns - now));
  }

  // Starts the operators a scenario runs with and waits for one to lead (with election).
  void StartOperators(bool leader_elect) {
    if (leader_elect) {
      world_.StartOperator(NextOperator(), true);
      world_.StartOperator(NextOperator(), true);
      const auto deadline = Steady::now() + std::chrono::seconds(30);
      while (world_.Leader().empty() && Steady::now() < deadline) {
        std::this_thread::sleep_for(milliseconds(100));
      }
    } else {
      world_.StartOperator(NextOperator(), false);
    }
  }
  std::string NextOperator() { return StrCat("op-", ++operators_started_); }

  // The operator whose memory the figures follow: the leader, or the only one.
  std::string ActingOperator() {
    std::vector<std::string> running = world_.Operators();
    if (running.size() == 1) return running[0];
    const std::string leader = world_.Leader();
    for (const std::string& op : running) {
      if (op == leader) return op;
    }
    return running.empty() ? "" : running[0];
  }

  Trial NewTrial(const std::string& scenario, int number) {
    Trial trial{this, &world_, scenario,
                std::mt19937_64(TrialSeed(options_.seed, scenario, number))};
    trial.record.scenario = scenario;
    trial.record.trial = number;
    trial.record.seed = options_.seed;
    for (Host& host : world_.hosts()) {
      trial.captures_before.push_back(World::Captures(host, "ok") + World::Captures(host, "empty"));
      trial.heartbeats_before.push_back(World::Heartbeat(host));
    }
    world_.gcs().ClearRequests();
    proxy_faults_before_ = world_.proxy().faults_injected();
    watches_dropped_before_ = world_.proxy().watches_dropped();
    return trial;
  }

  // Waits for the trial's jobs to end, checks every invariant, deletes the jobs and records the
  // trial in the ledger. Returns the violations it found.
  std::vector<std::string> Finish(Trial& trial);

 private:
  void CheckJob(Trial& trial, const std::string& name, JobEntry& entry);
  void CheckHosts(Trial& trial, const std::vector<std::string>& runs);

  World& world_;
  Options options_;
  Ledger ledger_;
  int jobs_created_ = 0;
  int operators_started_ = 0;
  int64_t proxy_faults_before_ = 0;
  int64_t watches_dropped_before_ = 0;
};

std::string ObjectName(const std::string& uri) {
  const std::string prefix = StrCat("gs://", World::kBucket, "/");
  return StartsWith(uri, prefix) ? uri.substr(prefix.size()) : uri;
}

// The sidecar-reported upload of each file of the run's manifest, by URI.
std::map<std::string, value> ManifestUploads(World& world, const std::string& manifest_uri) {
  std::map<std::string, value> uploads;
  if (manifest_uri.empty()) return uploads;
  std::optional<testing::GcsObjectSnapshot> manifest =
      world.gcs().GetObject(World::kBucket, ObjectName(manifest_uri));
  if (!manifest.has_value()) return uploads;
  std::error_code error;
  value json = value::parse(manifest->data, error);
  if (error || !json.has_field("targets")) return uploads;
  for (const value& target : json.at("targets").as_array()) {
    if (!target.has_field("uploads")) continue;
    for (const value& upload : target.at("uploads").as_array()) {
      uploads[upload.at("uri").as_string()] = upload;
    }
  }
  return uploads;
}

void Chaos::CheckJob(Trial& trial, const std::string& name, JobEntry& entry) {
  entry.name = name;
  entry.phases = world_.phases().Phases(name);
  absl::StatusOr<value> got = world_.GetJob(name);
  if (!got.ok() || !got->has_field("status")) {
    trial.Violation(StrCat("job ", name, " has no status to check: ", got.status().ToString()));
    return;
  }
  absl::StatusOr<api::ProfileJobStatus> status = api::ParseProfileJobStatus(got->at("status"));
  if (!status.ok()) {
    trial.Violation(
        StrCat("job ", name, ": its status does not parse: ", status.status().ToString()));
    return;
  }
  entry.run = status->run_name;
  entry.final_phase = std::string(api::JobPhaseName(status->phase));
  const std::map<std::string, value> uploads = ManifestUploads(world_, status->manifest_uri);
  std::set<std::string> listed;
  for (const api::TargetStatus& target : status->targets) {
    if (target.message.find("ALREADY_EXISTS") != std::string::npos ||
        target.message.find("already") != std::string::npos) {
      trial.Violation(
          StrCat("job ", name, ": target ", target.name,
                 " met another job's capture instead of waiting its turn: ", target.message));
    }
    std::vector<std::string> files;
    for (const auto& [uri, upload] : uploads) {
      if (uri.find(StrCat("/", target.name, ".")) != std::string::npos) files.push_back(uri);
    }
    if (files.empty() && !target.file.empty()) files.push_back(target.file);
    if (target.phase == "Succeeded" && files.empty()) {
      trial.Violation(StrCat("job ", name, ": target ", target.name, " is Succeeded with no file"));
    }
    for (const std::string& uri : files) {
      FileEntry file;
      file.uri = uri;
      file.target_phase = target.phase;
      file.pending = target.message.find("not uploaded yet") != std::string::npos;
      if (auto upload = uploads.find(uri); upload != uploads.end() &&
                                           upload->second.has_string_field("state") &&
                                           upload->second.at("state").as_string() != "committed") {
        file.pending = true;
      }
      entry.files.push_back(file);
      listed.insert(uri);
    }
  }
  // Files the status does not name still count for duplicates.
  const std::string run_prefix = ObjectName(status->run_uri);
  if (!run_prefix.empty()) {
    for (const std::string& object : world_.gcs().ListObjectNames(World::kBucket)) {
      const std::string uri = StrCat("gs://", World::kBucket, "/", object);
      if (!StartsWith(object, run_prefix) || listed.count(uri) > 0) continue;
      if (!EndsWith(object, ".xplane.pb") && !EndsWith(object, ".trace.json.gz")) continue;
      FileEntry file;
      file.uri = uri;
      file.target_phase = "(not in the status)";
      entry.files.push_back(file);
    }
  }
  // Pending and missing files get the retry window.
  const auto deadline = Steady::now() + kRetryWindow;
  for (FileEntry& file : entry.files) {
    std::optional<testing::GcsObjectSnapshot> object;
    while (true) {
      object = world_.gcs().GetObject(World::kBucket, ObjectName(file.uri));
      if (object.has_value() || file.target_phase != "Succeeded" || Steady::now() > deadline) break;
      std::this_thread::sleep_for(milliseconds(250));
    }
    file.found = object.has_value();
    file.writes = world_.gcs().Writes(World::kBucket, ObjectName(file.uri));
    file.contents = world_.gcs().DistinctContents(World::kBucket, ObjectName(file.uri));
    if (!file.found) continue;
    file.bytes = object->data.size();
    std::string expected = object->crc32c;
    if (auto upload = uploads.find(file.uri);
        upload != uploads.end() && upload->second.has_string_field("crc32c")) {
      expected = upload->second.at("crc32c").as_string();
    }
    file.intact = Crc32cToBase64(Crc32c(object->data)) == expected;
    if (file.intact && EndsWith(file.uri, ".xplane.pb")) {
      file.intact = xspace::ParseXSpace(object->data, file.uri).ok();
    }
  }
}

void Chaos::CheckHosts(Trial& trial, const std::vector<std::string>& runs) {
  std::vector<Host>& hosts = world_.hosts();
  for (size_t i = 0; i < hosts.size(); ++i) {
    Host& host = hosts[i];
    // No session left running.
    for (const std::string& run : runs) {
      if (run.empty()) continue;
      const auto deadline = Steady::now() + std::chrono::seconds(20);
      while (true) {
        absl::StatusOr<v1alpha1::GetSessionResponse> session = World::GetSession(host, run);
        const bool running =
            session.ok() && (session->state() == v1alpha1::SESSION_STATE_WAITING ||
                             session->state() == v1alpha1::SESSION_STATE_CAPTURING ||
                             session->state() == v1alpha1::SESSION_STATE_COLLECTING);
        if (!running) break;
        if (Steady::now() > deadline) {
          trial.Violation(
              StrCat("session ", run, " is still running on ", host.name, " after its job ended"));
          break;
        }
        std::this_thread::sleep_for(milliseconds(200));
      }
    }
    // No run captured twice: a sidecar that lived through the trial finished at most one capture
    // per job.
    if (trial.sidecars_restarted.count(host.name) == 0 && trial.captures_before[i] >= 0) {
      const double now = World::Captures(host, "ok") + World::Captures(host, "empty");
      const double extra = now - trial.captures_before[i] - static_cast<double>(trial.jobs.size());
      if (extra > 0) trial.record.extra_captures += static_cast<int64_t>(extra);
    }
    // The workload neither blocked nor crashed.
    const bool alive = host.workload != nullptr && host.workload->running();
    const int64_t beat = World::Heartbeat(host);
    const bool restarted = trial.workloads_restarted.count(host.name) > 0;
    if (!alive) {
      trial.Violation(StrCat("the workload of ", host.name, " is not running"));
      world_.StartWorkload(host);
    } else if (beat <= 0 || (!restarted && beat <= trial.heartbeats_before[i])) {
      trial.Violation(StrCat("the workload of ", host.name, " made no progress (heartbeat ",
                             trial.heartbeats_before[i], " -> ", beat, ")"));
    }
    if (host.sidecar == nullptr || !host.sidecar->running()) {
      trial.Violation(StrCat("the sidecar of ", host.name, " is not running"));
      (void)world_.StartSidecar(host);
    }
  }
}

std::vector<std::string> Chaos::Finish(Trial& trial) {
  // Each job ends.
  Steady::time_point last_end = trial.healed;
  for (const std::string& job : trial.jobs) {
    world_.phases().WaitForFinal(job, kEndTimeout);
    last_end = std::max(last_end, Steady::now());
  }
  // A final phase that flips afterwards would show here.
  std::this_thread::sleep_for(milliseconds(500));
  std::vector<std::string> runs;
  for (const std::string& job : trial.jobs) {
    JobEntry entry;
    CheckJob(trial, job, entry);
    runs.push_back(entry.run);
    trial.record.jobs.push_back(std::move(entry));
  }
  last_end = std::max(last_end, Steady::now() - milliseconds(500));
  trial.record.recovery_s = std::max(0.0, Seconds(last_end - trial.healed));
  CheckHosts(trial, runs);
  trial.record.bulk_faults += world_.proxy().faults_injected() - proxy_faults_before_;
  trial.record.bulk_faults += world_.proxy().watches_dropped() - watches_dropped_before_;
  const std::vector<testing::GcsRequestRecord> gcs_requests = world_.gcs().Requests();
  int64_t gcs_failed = 0;
  for (const testing::GcsRequestRecord& request : gcs_requests) {
    if (request.code == 0 || request.code == 503) ++gcs_failed;
  }
  trial.record.bulk_faults += gcs_failed;
  for (const std::string& job : trial.jobs) {
    for (int attempt = 0; attempt < 50; ++attempt) {
      if (world_.DeleteJob(job).ok()) break;
      std::this_thread::sleep_for(milliseconds(200));
    }
  }
  std::vector<std::string> found = ledger_.Add(trial.record);
  const TrialRecord& record = ledger_.trials().back();
  std::string phases;
  for (const JobEntry& job : record.jobs) {
    StrAppend(&phases, phases.empty() ? "" : ", ", job.final_phase.empty() ? "?" : job.final_phase);
  }
  std::cout << "[" << trial.scenario << " " << trial.record.trial << "] "
            << (found.empty() ? "ok" : "VIOLATED") << ": " << phases << "; recovered in "
            << Ms(static_cast<int64_t>(record.recovery_s * 1000))
            << (record.faults.empty() ? "" : StrCat("; ", absl::StrJoin(record.faults, "; ")))
            << (record.bulk_faults > 0 ? StrCat(" (+", record.bulk_faults, " failed requests)")
                                       : "")
            << (gcs_failed > 0
                    ? StrCat("; GCS failed ", gcs_failed, " of ", gcs_requests.size(), " requests")
                    : "")
            << "\n";
  for (const std::string& violation : found) std::cout << "    violated: " << violation << "\n";
  std::cout.flush();
  return found;
}

// The scenarios.

void OperatorKill(Trial& t) {
  Chaos& chaos = *t.chaos;
  World& world = *t.world;
  const int64_t duration = t.Uniform(500, 1200);
  chaos.CreateJob(t, duration);
  const int64_t kill_at = t.Uniform(0, kDelayMs + duration + 2000);
  t.SleepUntilMs(kill_at);
  const std::string victim = chaos.ActingOperator();
  world.KillOperator(victim);
  t.Fault(StrCat("operator killed ", Ms(kill_at), " after the job's creation"));
  std::this_thread::sleep_for(milliseconds(t.Uniform(0, 1000)));
  world.StartOperator(chaos.NextOperator(), false);
  t.Heal();
}

void LeaderKill(Trial& t) {
  Chaos& chaos = *t.chaos;
  World& world = *t.world;
  // The previous trial's victim may still hold the Lease (the kill came after its job ended):
  // the trial starts once a running replica leads.
  const auto settle = Steady::now() + std::chrono::seconds(30);
  while (Steady::now() < settle) {
    const std::vector<std::string> running = world.Operators();
    if (std::find(running.begin(), running.end(), world.Leader()) != running.end()) break;
    std::this_thread::sleep_for(milliseconds(100));
  }
  t.started = Steady::now();
  const int64_t duration = t.Uniform(500, 1200);
  chaos.CreateJob(t, duration);
  const int64_t kill_at = t.Uniform(0, kDelayMs + duration + 2000);
  t.SleepUntilMs(kill_at);
  const std::string leader = world.Leader();
  std::vector<std::string> running = world.Operators();
  if (std::find(running.begin(), running.end(), leader) == running.end()) {
    t.Violation(StrCat("no running replica holds the Lease (holder: '", leader, "')"));
    return;
  }
  world.KillOperator(leader);
  t.Fault(StrCat("leader ", leader, " killed ", Ms(kill_at), " after the job's creation"));
  // A replacement replica, as the Deployment would start.
  world.StartOperator(chaos.NextOperator(), true);
  t.Heal();
}

void ApiServerRestart(Trial& t) {
  const int64_t duration = t.Uniform(500, 1200);
  t.chaos->CreateJob(t, duration);
  const int64_t at = t.Uniform(0, kDelayMs + duration + 1000);
  t.SleepUntilMs(at);
  absl::Status restarted = t.world->plane().RestartApiserver();
  t.Fault(StrCat("kube-apiserver killed and restarted ", Ms(at), " after the job's creation"));
  if (!restarted.ok())
    t.Violation(StrCat("kube-apiserver did not come back: ", restarted.ToString()));
  t.Heal();
}

void ApiStorm(Trial& t) {
  testing::KubeFaultProxy& proxy = t.world->proxy();
  const int64_t duration = t.Uniform(500, 1200);
  t.chaos->CreateJob(t, duration);
  static constexpr int kCodes[] = {429, 500, 503, 504};
  const int code = kCodes[t.Uniform(0, 3)];
  const int64_t at = t.Uniform(0, kDelayMs + duration);
  const int64_t length = t.Uniform(500, 3000);
  const bool drop = t.Chance(0.5);
  const int drop_after = t.Chance(0.3) ? static_cast<int>(t.Uniform(1, 4)) : 0;
  if (drop_after > 0) {
    proxy.SetDropWatchesAfterEvents(drop_after);
    t.Fault(StrCat("every watch cut after ", drop_after, " event(s)"));
  }
  t.SleepUntilMs(at);
  // Every request of the window answered with the code (429 with Retry-After: 1).
  proxy.FailNext(1000000, code, "", "", code == 429 ? 1 : -1);
  t.Fault(StrCat("every API request answered ", code, " for ", Ms(length), " from ", Ms(at)));
  if (drop) {
    std::this_thread::sleep_for(milliseconds(t.Uniform(0, length)));
    proxy.DropWatches();
    t.Fault("every open watch cut");
  }
  t.SleepUntilMs(at + length);
  proxy.ClearFailures();
  proxy.SetDropWatchesAfterEvents(0);
  t.Heal();
}

Host& PickHost(Trial& t) {
  std::vector<Host>& hosts = t.world->hosts();
  return hosts[t.Uniform(0, static_cast<int64_t>(hosts.size()) - 1)];
}

void SidecarKillMidCapture(Trial& t) {
  Chaos& chaos = *t.chaos;
  const int64_t duration = t.Uniform(600, 1200);
  const std::string job = chaos.CreateJob(t, duration);
  Host& host = PickHost(t);
  const int64_t into = t.Uniform(0, duration);
  const int64_t down = t.Uniform(0, 1000);
  const int64_t start_ns = chaos.WaitForStart(job, std::chrono::seconds(60)).first;
  if (start_ns == 0) {
    t.Violation(StrCat("job ", job, " got no start time"));
    return;
  }
  Chaos::SleepUntilWallNs(start_ns + into * 1000000);
  t.world->KillSidecar(host);
  t.sidecars_restarted.insert(host.name);
  t.Fault(StrCat("sidecar of ", host.name, " killed ", Ms(into), " into the capture, down for ",
                 Ms(down)));
  std::this_thread::sleep_for(milliseconds(down));
  if (absl::Status started = t.world->StartSidecar(host); !started.ok()) {
    t.Violation(started.ToString());
  }
  t.Heal();
}

void SidecarKillMidUpload(Trial& t) {
  Chaos& chaos = *t.chaos;
  World& world = *t.world;
  // Uploads slowed to ~2 s for a capture's files, so that the kill lands while they go up.
  world.gcs().SetBodyReadRate(128 * 1024);
  const int64_t duration = t.Uniform(500, 1000);
  const std::string job = chaos.CreateJob(t, duration);
  Host& host = PickHost(t);
  const int64_t after = t.Uniform(0, 800);
  const int64_t down = t.Uniform(0, 1000);
  const auto [start_ns, run] = chaos.WaitForStart(job, std::chrono::seconds(60));
  if (start_ns == 0) {
    t.Violation(StrCat("job ", job, " got no start time"));
    world.gcs().SetBodyReadRate(0);
    return;
  }
  // Once the sidecar is writing and uploading the files (the session collects until its uploads
  // are done, or deferred).
  Chaos::SleepUntilWallNs(start_ns + duration * 1000000);
  std::string state = "the session never reached its upload";
  const auto deadline = Steady::now() + std::chrono::seconds(10);
  while (Steady::now() < deadline) {
    absl::StatusOr<v1alpha1::GetSessionResponse> session = World::GetSession(host, run);
    if (session.ok() && session->state() == v1alpha1::SESSION_STATE_COLLECTING) {
      state = "collecting";
      break;
    }
    std::this_thread::sleep_for(milliseconds(10));
  }
  std::this_thread::sleep_for(milliseconds(after));
  world.KillSidecar(host);
  t.sidecars_restarted.insert(host.name);
  t.Fault(StrCat("sidecar of ", host.name, " killed while uploading (", state, ", then ", Ms(after),
                 "), down for ", Ms(down)));
  std::this_thread::sleep_for(milliseconds(down));
  if (absl::Status started = world.StartSidecar(host); !started.ok()) {
    t.Violation(started.ToString());
  }
  world.gcs().SetBodyReadRate(0);
  t.Heal();
}

void SidecarRestart(Trial& t) {
  World& world = *t.world;
  Host& host = PickHost(t);
  world.KillSidecar(host);
  t.sidecars_restarted.insert(host.name);
  const int64_t beat = World::Heartbeat(host);
  const int64_t down = t.Uniform(500, 1500);
  std::this_thread::sleep_for(milliseconds(down));
  t.Fault(StrCat("sidecar of ", host.name, " down for ", Ms(down), " while its workload runs"));
  if (World::Heartbeat(host) <= beat) {
    t.Violation(StrCat("the workload of ", host.name, " stopped while its sidecar was down"));
  }
  if (absl::Status started = world.StartSidecar(host); !started.ok()) {
    t.Violation(started.ToString());
  }
  t.Heal();
  const std::string job = t.chaos->CreateJob(t);
  // Its annotations resumed: the capture after the restart has its events.
  world.phases().WaitForFinal(job, kEndTimeout);
  if (std::optional<api::ProfileJobStatus> status = t.chaos->JobStatus(job)) {
    for (const api::TargetStatus& target : status->targets) {
      if (target.name == host.name && (target.phase != "Succeeded" || target.events == 0)) {
        t.Violation(StrCat("after its sidecar restarted, ", host.name, "'s capture is ",
                           target.phase, " with ", target.events, " events: ", target.message));
      }
    }
  }
}

void WorkloadKill(Trial& t) {
  Chaos& chaos = *t.chaos;
  const int64_t duration = t.Uniform(600, 1200);
  const std::string job = chaos.CreateJob(t, duration);
  Host& host = PickHost(t);
  const int64_t into = t.Uniform(0, duration);
  const int64_t start_ns = chaos.WaitForStart(job, std::chrono::seconds(60)).first;
  if (start_ns == 0) {
    t.Violation(StrCat("job ", job, " got no start time"));
    return;
  }
  Chaos::SleepUntilWallNs(start_ns + into * 1000000);
  t.world->KillWorkload(host);
  t.Fault(StrCat("workload of ", host.name, " killed ", Ms(into), " into the capture"));
  std::this_thread::sleep_for(milliseconds(t.Uniform(0, 500)));
  t.world->StartWorkload(host);
  t.workloads_restarted.insert(host.name);
  t.Heal();
}

// For minutes at a time in --long: half of GCS's answers are 503s, and uploads break off.
void GcsFlaky(Trial& t, int64_t window_ms) {
  World& world = *t.world;
  world.gcs().SetFailureRate(0.5, 503, t.rng());
  t.Fault(StrCat("GCS answers 50% of requests with 503 for ", Ms(window_ms)));
  std::atomic<bool> done{false};
  std::mt19937_64 reset_rng(t.rng());
  std::atomic<int> resets{0};
  std::thread resetter([&] {
    while (!done) {
      world.gcs().ResetNextUpload(std::uniform_int_distribution<uint64_t>(1, 200000)(reset_rng));
      ++resets;
      std::this_thread::sleep_for(milliseconds(500));
    }
  });
  while (t.SinceStartMs() < window_ms) {
    t.chaos->CreateJob(t);
    std::this_thread::sleep_for(milliseconds(t.Uniform(2000, 5000)));
  }
  done = true;
  resetter.join();
  world.gcs().ClearFaults();
  t.Fault(StrCat("connection resets armed ", resets.load(), " times"));
  t.Heal();
}

void SpoolFull(Trial& t) {
  World& world = *t.world;
  Host& host = world.hosts().back();
  const std::string filler = StrCat(host.spool_dir, "/filler");
  struct statvfs fs;
  if (statvfs(host.spool_dir.c_str(), &fs) != 0) {
    t.Violation(StrCat("statvfs ", host.spool_dir, ": ", std::strerror(errno)));
    return;
  }
  const uint64_t available = static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
  const uint64_t left = static_cast<uint64_t>(t.Uniform(0, 160 * 1024));
  {
    std::ofstream out(filler, std::ios::binary);
    const std::string block(64 * 1024, 'x');
    uint64_t written = 0;
    while (written + left < available && out) {
      const uint64_t n = std::min<uint64_t>(block.size(), available - left - written);
      out.write(block.data(), static_cast<std::streamsize>(n));
      written += n;
    }
  }
  statvfs(host.spool_dir.c_str(), &fs);
  t.Fault(StrCat("the spool of ", host.name, " full but ",
                 static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize / 1024, " KiB"));
  const int64_t duration = t.Uniform(500, 1200);
  const std::string job = t.chaos->CreateJob(t, duration);
  world.phases().WaitForFinal(job, kEndTimeout);
  std::filesystem::remove(filler);
  t.Heal();
  if (std::optional<api::ProfileJobStatus> status = t.chaos->JobStatus(job)) {
    for (const api::TargetStatus& target : status->targets) {
      if (target.name == host.name && target.phase == "Failed") {
        t.Fault(StrCat("its target failed: ", target.message.substr(0, 160)));
      }
    }
  }
}

void QueueOverlap(Trial& t) {
  Chaos& chaos = *t.chaos;
  World& world = *t.world;
  chaos.CreateJob(t, t.Uniform(800, 1500));
  const int64_t second_at = t.Uniform(0, 800);
  t.SleepUntilMs(second_at);
  chaos.CreateJob(t, t.Uniform(500, 1000));
  t.Fault(StrCat("a second job over the same pods ", Ms(second_at), " after the first"));
  if (t.Chance(0.5)) {
    const int64_t kill_at = t.Uniform(second_at, 3000);
    t.SleepUntilMs(kill_at);
    world.KillOperator(chaos.ActingOperator());
    t.Fault(StrCat("operator killed ", Ms(kill_at), " after the first job's creation"));
    std::this_thread::sleep_for(milliseconds(t.Uniform(0, 800)));
    world.StartOperator(chaos.NextOperator(), false);
  }
  t.Heal();
}

struct Scenario {
  std::string name;
  std::string what;
  int default_trials;
  int long_trials;
  bool leader_elect = false;
  std::function<void(Trial&)> run;
  // Why it cannot run here; empty when it can.
  std::string unavailable;
};

std::vector<Scenario> Scenarios(const Options& options, const World& world) {
  const bool tmpfs = const_cast<World&>(world).hosts().back().spool_on_tmpfs;
  const int64_t gcs_window_ms = options.long_mode ? 60000 : 15000;
  return {
      {"operator-kill", "the operator SIGKILLed at a random instant of a job", 5, 60, false,
       OperatorKill},
      {"leader-kill", "the leader of two replicas SIGKILLed", 2, 20, true, LeaderKill},
      {"apiserver-restart", "kube-apiserver killed and restarted (etcd keeps its data)", 1, 20,
       false, ApiServerRestart},
      {"api-storm", "429/5xx storms and cut watches through the proxy", 4, 40, false, ApiStorm},
      {"sidecar-kill-capture", "a sidecar SIGKILLed mid-capture and restarted", 3, 30, false,
       SidecarKillMidCapture},
      {"sidecar-kill-upload", "a sidecar SIGKILLed mid-upload and restarted", 3, 30, false,
       SidecarKillMidUpload},
      {"sidecar-restart", "a sidecar down and back while its workload annotates", 2, 20, false,
       SidecarRestart},
      {"workload-kill", "an annotating workload SIGKILLed mid-capture", 3, 30, false, WorkloadKill},
      {"gcs-flaky", "GCS failing half its requests with 503s and resets", 1, 4, false,
       [gcs_window_ms](Trial& t) { GcsFlaky(t, gcs_window_ms); }},
      {"spool-full", "a sidecar's spool disk full (a small tmpfs)", 2, 20, false, SpoolFull,
       tmpfs ? "" : "needs root for a tmpfs spool"},
      {"queue", "two jobs over the same pods at once, the operator sometimes killed", 3, 30, false,
       QueueOverlap},
  };
}

int Run(const Options& options) {
  if (geteuid() == 0) {
    // The spool's tmpfs lives in a mount namespace of our own: it goes away with the process.
    if (unshare(CLONE_NEWNS) != 0 ||
        mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
      std::cerr << "chaos: no private mount namespace (" << std::strerror(errno)
                << "): the spool-full scenario will not run\n";
    }
  }
  WorldOptions world_options;
  world_options.source_dir = kSourceDir;
  world_options.operator_path = kOperator;
  world_options.sidecar_path = kSidecar;
  world_options.annotator_path = kAnnotator;
  world_options.small_spool_bytes = kSmallSpoolBytes;
  std::cout << "chaos: seed " << options.seed << " (replay: --seed " << options.seed
            << "; one trial: --seed " << options.seed << " --scenario NAME --trial K)"
            << (options.long_mode ? ", long mode" : "") << "\n";
  const auto begun = Steady::now();
  absl::StatusOr<std::unique_ptr<World>> world = World::Start(world_options);
  if (absl::IsNotFound(world.status())) {
    std::cout << "chaos: skipped: " << world.status().message() << "\n";
    return 77;
  }
  if (!world.ok()) {
    std::cerr << "chaos: could not set up: " << world.status() << "\n";
    return 1;
  }
  std::cout << "chaos: " << (*world)->hosts().size() << " hosts, control plane and GCS up in "
            << Ms(std::chrono::duration_cast<milliseconds>(Steady::now() - begun).count()) << "\n";
  Chaos chaos(**world, options);
  for (const Scenario& scenario : Scenarios(options, **world)) {
    if (!options.scenarios.empty() && std::find(options.scenarios.begin(), options.scenarios.end(),
                                                scenario.name) == options.scenarios.end()) {
      continue;
    }
    if (!scenario.unavailable.empty()) {
      std::cout << "== " << scenario.name << ": skipped (" << scenario.unavailable << ")\n";
      continue;
    }
    int trials = options.long_mode ? scenario.long_trials : scenario.default_trials;
    if (options.trials > 0) trials = options.trials;
    std::cout << "== " << scenario.name << ": " << scenario.what << ", "
              << (options.trial >= 0 ? 1 : trials) << " trial(s)\n";
    chaos.StartOperators(scenario.leader_elect);
    // One job without faults first: the baseline of the operator's memory is taken warm.
    {
      Trial warm = chaos.NewTrial(StrCat(scenario.name, "-warmup"), -1);
      const std::string job = chaos.CreateJob(warm);
      (*world)->phases().WaitForFinal(job, kEndTimeout);
      (void)(*world)->DeleteJob(job);
      std::this_thread::sleep_for(milliseconds(500));
    }
    const int64_t rss_before = (*world)->OperatorRssKib(chaos.ActingOperator());
    for (int i = 0; i < trials; ++i) {
      if (options.trial >= 0 && i != options.trial) continue;
      Trial trial = chaos.NewTrial(scenario.name, i);
      scenario.run(trial);
      chaos.Finish(trial);
    }
    std::this_thread::sleep_for(milliseconds(1000));
    const std::string acting = chaos.ActingOperator();
    const int64_t rss_after = (*world)->OperatorRssKib(acting);
    chaos.ledger().SetRss(scenario.name, rss_before, rss_after);
    // The operator's memory returns to its baseline: some allocator slack, nothing that grows
    // with the trials.
    if (rss_before > 0 && rss_after > rss_before + std::max<int64_t>(rss_before / 4, 16384)) {
      std::cout << "    violated: the operator's RSS grew from " << rss_before / 1024 << " to "
                << rss_after / 1024 << " MiB over " << scenario.name << "\n";
      TrialRecord memory;
      memory.scenario = scenario.name;
      memory.trial = trials;
      memory.violations.push_back(
          StrCat("operator RSS ", rss_before, " KiB -> ", rss_after, " KiB"));
      chaos.ledger().Add(memory);
    }
    (*world)->StopOperators();
  }
  const std::string table = chaos.ledger().Table();
  std::cout << "\n" << table;
  std::cout << "chaos: " << chaos.ledger().violations() << " violation(s) in "
            << Ms(std::chrono::duration_cast<milliseconds>(Steady::now() - begun).count())
            << "; seed " << options.seed << "\n";
  if (!options.results.empty()) {
    std::ofstream out(options.results);
    out << "Seed " << options.seed << (options.long_mode ? ", --long" : "") << ".\n\n" << table;
  }
  if (!options.logs.empty()) {
    (*world)->SaveLogs(options.logs);
    std::cout << "chaos: the processes' logs are in " << options.logs << "\n";
  }
  if (!options.ledger.empty()) {
    std::filesystem::create_directories(std::filesystem::path(options.ledger).parent_path());
    std::ofstream out(options.ledger);
    out << chaos.ledger().JsonLines();
    std::cout << "chaos: ledger in " << options.ledger << "\n";
  }
  return chaos.ledger().violations() == 0 ? 0 : 1;
}

}  // namespace
}  // namespace clusterprof::chaos

int main(int argc, char** argv) {
  clusterprof::chaos::Options options;
  CLI::App app{"clusterprof's chaos suite: faults at random instants, invariants after each trial"};
  app.add_option("--seed", options.seed, "seed of every random choice (0: one from the clock)")
      ->capture_default_str();
  app.add_flag("--long", options.long_mode, "the full count of trials (RESULTS.md's figures)");
  app.add_option("--scenario", options.scenarios, "run only these scenarios");
  app.add_option("--trials", options.trials, "trials per scenario instead of the mode's count");
  app.add_option("--trial", options.trial, "run only trial K of each scenario (a replay)");
  app.add_option("--results", options.results, "write the figures' Markdown table here");
  app.add_option("--ledger", options.ledger,
                 "write every trial's jobs and files here (JSON lines)");
  app.add_option("--logs", options.logs, "copy every process's log into this directory");
  CLI11_PARSE(app, argc, argv);
  if (options.seed == 0) {
    options.seed =
        static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
  }
  return clusterprof::chaos::Run(options);
}
