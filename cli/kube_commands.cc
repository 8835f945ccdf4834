// The kubectl plugin's verbs (`kubectl clusterprof capture|report|pull`): ProfileJobs through the
// user's kubeconfig, and their runs read from the logdir with the user's own credentials.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <future>
#include <iostream>
#include <memory>
#include <optional>

#include "absl/strings/str_join.h"
#include "cli/commands.h"
#include "cli/completion.h"
#include "cli/format.h"
#include "common/base/clock.h"
#include "common/base/status.h"
#include "common/base/strings.h"
#include "common/storage/logdir.h"
#include "common/storage/storage_set.h"
#include "fmt/format.h"
#include "operator/api/types.h"
#include "operator/controllers/targets.h"
#include "operator/kube/api_error.h"
#include "operator/kube/config.h"
#include "operator/kube/object.h"
#include "operator/kube/resource.h"
#include "operator/kube/rest_client.h"
#include "operator/kube/selector.h"

namespace clusterprof::cli {
namespace {

using web::json::value;

constexpr std::string_view kPlugin = "kubectl clusterprof";

std::atomic<int> interrupts{0};
void OnInterrupt(int) { interrupts.fetch_add(1); }

// The cluster the user's kubeconfig points at, and the namespace to work in.
struct Cluster {
  kube::RestConfig config;
  std::unique_ptr<kube::RestClient> client;
  std::string ns;
};

absl::StatusOr<Cluster> Connect(const KubeFlags& flags, Clock* clock) {
  kube::KubeconfigOptions options;
  if (!flags.kubeconfig.empty()) options.paths = {flags.kubeconfig};
  options.context = flags.context;
  absl::StatusOr<kube::RestConfig> config =
      kube::LoadDefaultConfig(options, kube::ProcessEnvironment(), {}, clock);
  if (!config.ok()) return config.status();
  Cluster cluster;
  cluster.ns = flags.namespace_.empty() ? config->namespace_ : flags.namespace_;
  cluster.config = *config;
  kube::RestClientOptions client_options;
  client_options.user_agent = "kubectl-clusterprof";
  client_options.request_timeout_ns = flags.request_timeout_ns;
  absl::StatusOr<std::unique_ptr<kube::RestClient>> client =
      kube::RestClient::Create(*std::move(config), clock, client_options);
  if (!client.ok()) return client.status();
  cluster.client = *std::move(client);
  return cluster;
}

// An API error as kubectl says it, with where the request went.
std::string ApiError(const Cluster& cluster, const absl::Status& status) {
  return StrCat(status.message(), " (", cluster.config.description, ")");
}

// The namespace exists (a user who may not read namespaces is taken at their word).
absl::Status CheckNamespace(const Cluster& cluster) {
  absl::StatusOr<value> got = cluster.client->Get(kube::Namespaces(), "", cluster.ns);
  if (got.ok() || absl::IsPermissionDenied(got.status())) return absl::OkStatus();
  if (absl::IsNotFound(got.status())) {
    return absl::NotFoundError(
        StrCat("namespace \"", cluster.ns, "\" not found (", cluster.config.description, ")"));
  }
  return absl::UnavailableError(ApiError(cluster, got.status()));
}

value SelectorJson(const kube::LabelSelector& selector) {
  value out = value::object();
  for (const kube::LabelRequirement& requirement : selector.requirements()) {
    using Op = kube::LabelRequirement::Operator;
    if (requirement.op == Op::kEquals) {
      out["matchLabels"][requirement.key] = value::string(requirement.values.at(0));
      continue;
    }
    value expression = value::object();
    expression["key"] = value::string(requirement.key);
    std::string op;
    switch (requirement.op) {
      case Op::kNotEquals:
      case Op::kNotIn:
        op = "NotIn";
        break;
      case Op::kIn:
        op = "In";
        break;
      case Op::kExists:
        op = "Exists";
        break;
      case Op::kDoesNotExist:
        op = "DoesNotExist";
        break;
      case Op::kEquals:
        break;
    }
    expression["operator"] = value::string(op);
    if (!requirement.values.empty()) {
      value values = value::array();
      for (size_t i = 0; i < requirement.values.size(); ++i) {
        values[i] = value::string(requirement.values[i]);
      }
      expression["values"] = values;
    }
    const size_t n = out.has_field("matchExpressions") ? out.at("matchExpressions").size() : 0;
    out["matchExpressions"][n] = expression;
  }
  return out;
}

std::string Seconds(int64_t ns) { return fmt::format("{:.1f} s", static_cast<double>(ns) / 1e9); }

// What the run directory holds so far: host files and their bytes. Read with the user's own
// credentials; nullopt when they cannot read it (the line then shows no bytes).
struct Landed {
  int hosts = 0;
  uint64_t bytes = 0;
};
std::optional<Landed> ListLanded(storage::StorageSet& storages, const std::string& run_uri) {
  absl::StatusOr<storage::Storage*> storage = storages.ForUri(run_uri);
  if (!storage.ok()) return std::nullopt;
  absl::StatusOr<std::vector<storage::Entry>> entries = (*storage)->List(run_uri);
  if (!entries.ok()) return std::nullopt;
  Landed landed;
  for (const storage::Entry& entry : *entries) {
    if (entry.is_directory) continue;
    landed.bytes += entry.bytes;
    if (EndsWith(entry.name, storage::kXPlaneSuffix)) ++landed.hosts;
  }
  return landed;
}

// One line of where the job stands: "Capturing · 4 targets · window 1.2 s of 5.0 s". Without
// `now_ns` (0), the line leaves out the window's clock: plain lines are printed when it changes.
std::string ProgressLine(const api::ProfileJobStatus& status, int64_t duration_ms, int64_t now_ns,
                         const std::optional<Landed>& landed) {
  std::vector<std::string> parts = {std::string(api::JobPhaseName(status.phase))};
  int32_t targets = status.summary.has_value() ? status.summary->targets : 0;
  if (targets == 0) targets = static_cast<int32_t>(status.targets.size());
  if (status.phase == api::JobPhase::kPending) {
    if (!status.message.empty()) parts.push_back(status.message);
  } else if (targets > 0) {
    parts.push_back(StrCat(targets, " target(s)"));
  }
  if (status.start_time_ns > 0 && now_ns > 0 && !api::IsTerminal(status.phase)) {
    const int64_t into = now_ns - status.start_time_ns;
    const int64_t window = duration_ms * kNanosPerMilli;
    if (into < 0) {
      parts.push_back(StrCat("starts in ", Seconds(-into)));
    } else if (into < window) {
      parts.push_back(StrCat("window ", Seconds(into), " of ", Seconds(window)));
    } else {
      parts.push_back("collecting");
    }
  }
  if (landed.has_value() && landed->hosts > 0) {
    parts.push_back(StrCat(landed->hosts, targets > 0 ? StrCat("/", targets) : "",
                           " host file(s) in the logdir, ", FormatBytes(landed->bytes)));
  }
  return absl::StrJoin(parts, " · ");
}

// The verdict of a finished job, from its status.
void PrintVerdict(const std::string& name, const api::ProfileJobStatus& status, std::ostream& out) {
  out << "profilejob/" << name << ": " << api::JobPhaseName(status.phase);
  if (status.summary.has_value()) {
    const api::JobSummary& s = *status.summary;
    out << ", " << s.succeeded << "/" << s.targets << " target(s) captured";
    if (s.failed > 0) out << ", " << s.failed << " failed";
    if (s.empty > 0) out << ", " << s.empty << " empty";
    if (s.skipped > 0) out << ", " << s.skipped << " skipped";
    if (s.max_start_skew_ns >= 0 && s.succeeded > 0) {
      out << ", start skew " << api::FormatDuration(s.max_start_skew_ns);
    }
  }
  out << "\n";
  if (!status.message.empty()) out << "  " << status.message << "\n";
  for (const api::TargetStatus& target : status.targets) {
    if (target.phase == "Failed" && !target.message.empty()) {
      out << "  " << target.name << ": " << target.message << "\n";
    }
  }
  if (status.analysis.has_value()) {
    const api::JobAnalysis& analysis = *status.analysis;
    out << "  stragglers: " << (analysis.stragglers.empty() ? "none" : analysis.stragglers);
    if (analysis.compared_steps > 0) out << " (" << analysis.compared_steps << " steps compared)";
    out << "\n";
    for (const api::HostAnalysis& host : analysis.hosts) {
      if (host.straggler) out << "    " << host.host << ": " << host.evidence << "\n";
    }
  }
  if (!status.run_uri.empty()) out << "  run: " << status.run_uri << "\n";
  if (status.analysis.has_value() && !status.analysis->report_uri.empty()) {
    out << "  report: " << status.analysis->report_uri << "\n";
  }
}

absl::StatusOr<api::ProfileJobStatus> StatusOf(const value& job) {
  if (!job.has_field("status")) return api::ProfileJobStatus{};
  return api::ParseProfileJobStatus(job.at("status"));
}

absl::StatusOr<value> GetJob(const Cluster& cluster, const std::string& name) {
  absl::StatusOr<value> job = cluster.client->Get(api::ProfileJobs(), cluster.ns, name);
  if (absl::IsNotFound(job.status())) {
    return absl::NotFoundError(
        StrCat("profilejob \"", name, "\" not found in namespace ", cluster.ns));
  }
  if (!job.ok()) return absl::UnavailableError(ApiError(cluster, job.status()));
  return job;
}

// Asks on the terminal; false without one.
bool Confirm(const std::string& question, std::ostream& err) {
  if (isatty(STDIN_FILENO) != 1) return false;
  err << "\n" << question << " [y/N] " << std::flush;
  std::string answer;
  if (!std::getline(std::cin, answer)) return false;
  return answer == "y" || answer == "Y" || answer == "yes";
}

// Follows the job until it finishes; returns its last copy, or an error when it went away.
absl::StatusOr<value> Follow(const Cluster& cluster, const std::string& name, int64_t duration_ms,
                             bool terminal, Clock& clock, storage::StorageSet& storages,
                             std::ostream& err) {
  std::string last_line;
  int64_t next_list_ns = 0;
  std::optional<Landed> landed;
  // The logdir is listed beside the loop (a bucket, or credentials, may be slow to answer); a
  // listing that fails (no read access, no credentials) is not tried again.
  std::future<std::optional<Landed>> listing;
  bool can_list = true;
  int handled_interrupts = 0;
  while (true) {
    absl::StatusOr<value> job = GetJob(cluster, name);
    if (absl::IsNotFound(job.status())) {
      if (terminal) err << "\n";
      return absl::NotFoundError(StrCat("profilejob ", name, " was deleted while it ran"));
    }
    if (!job.ok()) {
      // The API server may come back: say so and keep trying.
      const std::string line = StrCat("API server unreachable: ", job.status().message());
      if (line != last_line) err << (terminal ? "\r\033[K" : "") << line << (terminal ? "" : "\n");
      last_line = line;
      clock.SleepForNs(kNanosPerSecond);
      continue;
    }
    absl::StatusOr<api::ProfileJobStatus> status = StatusOf(*job);
    if (!status.ok()) return status.status();
    if (api::IsTerminal(status->phase)) {
      if (terminal && !last_line.empty()) err << "\r\033[K";
      return job;
    }
    const int64_t now = clock.WallNs();
    if (listing.valid() && listing.wait_for(std::chrono::seconds(0)) == std::future_status::ready) {
      std::optional<Landed> listed = listing.get();
      if (listed.has_value()) landed = listed;
      can_list = listed.has_value();
      next_list_ns = clock.MonotonicNs() + kNanosPerSecond;
    }
    if (can_list && !listing.valid() && !status->run_uri.empty() && status->start_time_ns > 0 &&
        now > status->start_time_ns + duration_ms * kNanosPerMilli &&
        clock.MonotonicNs() >= next_list_ns) {
      listing = std::async(std::launch::async, [&storages, uri = status->run_uri] {
        return ListLanded(storages, uri);
      });
    }
    const std::string line = ProgressLine(*status, duration_ms, terminal ? now : 0, landed);
    if (terminal) {
      err << "\r\033[K" << name << ": " << line << std::flush;
    } else if (line != last_line) {
      err << name << ": " << line << "\n";
    }
    last_line = line;
    if (interrupts.load() > handled_interrupts) {
      handled_interrupts = interrupts.load();
      if (Confirm(StrCat("Cancel profilejob ", name,
                         "? The sidecars stop recording now and keep what they recorded; "
                         "a job that has not started ends Failed (Cancelled)."),
                  err)) {
        value patch = value::object();
        patch["metadata"]["annotations"][std::string(api::kCancelAnnotation)] =
            value::string("true");
        absl::StatusOr<value> patched = cluster.client->Patch(api::ProfileJobs(), cluster.ns, name,
                                                              kube::PatchType::kMerge, patch);
        if (!patched.ok()) {
          err << kPlugin << ": cancelling: " << ApiError(cluster, patched.status()) << "\n";
        } else {
          err << "cancel requested; waiting for the operator to end it\n";
        }
      } else {
        if (terminal) err << "\n";
        return absl::CancelledError(
            StrCat("stopped following; the job goes on: kubectl clusterprof report ", name));
      }
    }
    clock.SleepForNs(terminal ? 200 * kNanosPerMilli : 500 * kNanosPerMilli);
  }
}

int Finish(const std::string& name, const value& job, std::ostream& out, std::ostream& err) {
  absl::StatusOr<api::ProfileJobStatus> status = StatusOf(job);
  if (!status.ok()) {
    err << kPlugin << ": " << status.status().message() << "\n";
    return kExitFailure;
  }
  PrintVerdict(name, *status, out);
  if (!status->run_uri.empty()) {
    out << "  next: kubectl clusterprof pull " << name << "   (every host file, to open in "
        << "XProf or Perfetto)\n";
  }
  return status->phase == api::JobPhase::kFailed ? kExitFailure : kExitOk;
}

std::string Error(std::string_view verb, const absl::Status& status) {
  return StrCat(kPlugin, " ", verb, ": ", status.message(), "\n");
}

}  // namespace

absl::StatusOr<int64_t> ParseDurationMs(std::string_view text) {
  // Go's time.ParseDuration units, as kubectl's flags take them: "5s", "1m30s", "500ms", "1.5s".
  std::string_view rest = StripAsciiWhitespace(text);
  if (rest == "0") return 0;
  if (rest.empty()) return absl::InvalidArgumentError("empty duration");
  double total_ms = 0;
  while (!rest.empty()) {
    size_t digits = 0;
    while (digits < rest.size() &&
           (std::isdigit(static_cast<unsigned char>(rest[digits])) || rest[digits] == '.')) {
      ++digits;
    }
    if (digits == 0) {
      return absl::InvalidArgumentError(
          StrCat("\"", text, "\" is not a duration (such as 5s, 500ms, 1m30s)"));
    }
    const std::string number(rest.substr(0, digits));
    rest.remove_prefix(digits);
    size_t unit_length = 0;
    while (unit_length < rest.size() &&
           std::isalpha(static_cast<unsigned char>(rest[unit_length]))) {
      ++unit_length;
    }
    const std::string_view unit = rest.substr(0, unit_length);
    rest.remove_prefix(unit_length);
    double scale = 0;
    if (unit == "ms") scale = 1;
    if (unit == "s") scale = 1000;
    if (unit == "m") scale = 60'000;
    if (unit == "h") scale = 3'600'000;
    if (scale == 0) {
      return absl::InvalidArgumentError(StrCat(
          "\"", text,
          "\": ", unit.empty() ? "a number needs a unit" : StrCat("unknown unit \"", unit, "\""),
          " (ms, s, m or h, as in 5s or 500ms)"));
    }
    char* end = nullptr;
    const double value = std::strtod(number.c_str(), &end);
    if (end != number.c_str() + number.size()) {
      return absl::InvalidArgumentError(StrCat("\"", text, "\" is not a duration"));
    }
    total_ms += value * scale;
  }
  if (total_ms > 1e12) return absl::InvalidArgumentError(StrCat("\"", text, "\" is too long"));
  return static_cast<int64_t>(std::llround(total_ms));
}

namespace {

// The ProfileJob `kubectl clusterprof capture` creates: its flags as the spec.
value CaptureJob(const KubeCaptureOptions& options, const kube::LabelSelector& selector,
                 const std::string& logdir) {
  value job = value::object();
  job["apiVersion"] = value::string("clusterprof.io/v1alpha1");
  job["kind"] = value::string("ProfileJob");
  if (!options.name.empty()) {
    job["metadata"]["name"] = value::string(options.name);
  } else {
    job["metadata"]["generateName"] = value::string("capture-");
  }
  job["metadata"]["labels"]["app.kubernetes.io/created-by"] = value::string("kubectl-clusterprof");
  value& spec = job["spec"];
  spec["targets"]["selector"] = SelectorJson(selector);
  if (options.wait_seconds >= 0) {
    spec["targets"]["waitSeconds"] = value::number(options.wait_seconds);
  }
  spec["durationMs"] = value::number(options.duration_ms);
  spec["delayMs"] = value::number(options.delay_ms);
  if (options.lookback_ms > 0) spec["lookbackMs"] = value::number(options.lookback_ms);
  spec["logdir"] = value::string(logdir);
  spec["options"]["hostTracerLevel"] = value::number(options.host_tracer_level);
  spec["options"]["deviceTracerLevel"] = value::number(options.device_tracer_level);
  spec["options"]["pythonTracerLevel"] = value::number(options.python_tracer_level);
  return job;
}

}  // namespace

int RunKubeCapture(const KubeCaptureOptions& options, std::ostream& out, std::ostream& err) {
  RealClock clock;
  absl::StatusOr<kube::LabelSelector> selector = kube::LabelSelector::Parse(options.selector);
  if (!selector.ok()) {
    err << Error("capture", absl::InvalidArgumentError(StrCat("-l ", options.selector, ": ",
                                                              selector.status().message())));
    return kExitUsage;
  }
  if (selector->empty()) {
    err << Error("capture", absl::InvalidArgumentError(
                                "-l/--selector is required: the pods to capture, e.g. -l "
                                "app=llama-trainer"));
    return kExitUsage;
  }
  std::string logdir = options.logdir;
  if (logdir.empty()) {
    if (const char* env = std::getenv("CLUSTERPROF_LOGDIR"); env != nullptr) logdir = env;
  }
  if (logdir.empty()) {
    err << Error("capture", absl::InvalidArgumentError(
                                "--logdir is required (or set CLUSTERPROF_LOGDIR): where the run "
                                "goes, e.g. --logdir gs://my-bucket/tensorboard"));
    return kExitUsage;
  }
  absl::StatusOr<Cluster> cluster = Connect(options.kube, &clock);
  if (!cluster.ok()) {
    err << Error("capture", cluster.status());
    return kExitFailure;
  }
  if (absl::Status ns = CheckNamespace(*cluster); !ns.ok()) {
    err << Error("capture", ns);
    return kExitFailure;
  }
  // The pods first: a selector that matches nothing is said before anything is created.
  kube::ListOptions list;
  list.label_selector = selector->ToString();
  absl::StatusOr<kube::ObjectList> pods = cluster->client->ListAll(kube::Pods(), cluster->ns, list);
  if (!pods.ok()) {
    err << Error("capture", absl::UnavailableError(
                                StrCat("listing pods: ", ApiError(*cluster, pods.status()))));
    return kExitFailure;
  }
  std::vector<kube::ObjectPtr> decoded;
  const kube::Decoder decode = kube::PodDecoder();
  for (value& pod : pods->items) {
    absl::StatusOr<kube::ObjectPtr> object = decode(pod);
    if (object.ok()) decoded.push_back(*std::move(object));
  }
  const controllers::TargetResolution resolution = controllers::ResolveTargets({}, decoded);
  if (decoded.empty() && !options.force) {
    err << kPlugin << " capture: no pods in namespace " << cluster->ns << " match "
        << selector->ToString() << "; nothing created (--force creates the ProfileJob anyway: "
        << "it waits for matching pods up to its waitSeconds)\n";
    return kExitFailure;
  }
  err << decoded.size() << " pod(s) match " << selector->ToString() << " in namespace "
      << cluster->ns << ", " << resolution.targets.size() << " ready with a clusterprof sidecar\n";

  absl::StatusOr<value> created = cluster->client->Create(api::ProfileJobs(), cluster->ns,
                                                          CaptureJob(options, *selector, logdir));
  if (!created.ok()) {
    // The API server's own words: the CRD's schema and CEL rules say what is wrong.
    err << Error("capture",
                 absl::Status(created.status().code(), ApiError(*cluster, created.status())));
    return kExitFailure;
  }
  const std::string name = created->at("metadata").at("name").as_string();
  out << "profilejob.clusterprof.io/" << name << " created\n" << std::flush;

  storage::StorageSet storages(storage::StorageSetOptions{.clock = &clock});
  const bool terminal = options.progress && isatty(STDERR_FILENO) == 1;
  struct sigaction action = {};
  struct sigaction previous = {};
  action.sa_handler = OnInterrupt;
  sigaction(SIGINT, &action, &previous);
  absl::StatusOr<value> finished =
      Follow(*cluster, name, options.duration_ms, terminal, clock, storages, err);
  sigaction(SIGINT, &previous, nullptr);
  if (!finished.ok()) {
    err << Error("capture", finished.status());
    return absl::IsCancelled(finished.status()) ? 130 : kExitFailure;
  }
  return Finish(name, *finished, out, err);
}

namespace {

// Copies the object at `uri` to the local file `path`.
absl::Status CopyObject(storage::Storage& storage, const std::string& uri,
                        const std::filesystem::path& path) {
  absl::StatusOr<std::unique_ptr<storage::ObjectReader>> reader = storage.NewReader(uri);
  if (!reader.ok()) return reader.status();
  std::filesystem::create_directories(path.parent_path());
  const std::filesystem::path partial = path.string() + ".partial";
  std::ofstream file(partial, std::ios::binary | std::ios::trunc);
  if (!file) return absl::PermissionDeniedError(StrCat("cannot write ", partial.string()));
  std::vector<char> buffer(1 << 20);
  while (true) {
    absl::StatusOr<size_t> n = (*reader)->Read(buffer.data(), buffer.size());
    if (!n.ok()) {
      file.close();
      std::filesystem::remove(partial);
      return n.status();
    }
    if (*n == 0) break;
    file.write(buffer.data(), static_cast<std::streamsize>(*n));
  }
  file.close();
  if (!file) {
    std::filesystem::remove(partial);
    return absl::DataLossError(StrCat("writing ", path.string(), " failed"));
  }
  std::filesystem::rename(partial, path);
  return absl::OkStatus();
}

// The finished job `name` and its status, or a message.
absl::StatusOr<std::pair<Cluster, api::ProfileJobStatus>> FinishedJob(const KubeFlags& flags,
                                                                      const std::string& name,
                                                                      Clock* clock) {
  absl::StatusOr<Cluster> cluster = Connect(flags, clock);
  if (!cluster.ok()) return cluster.status();
  absl::StatusOr<value> job = GetJob(*cluster, name);
  if (!job.ok()) return job.status();
  absl::StatusOr<api::ProfileJobStatus> status = StatusOf(*job);
  if (!status.ok()) return status.status();
  return std::make_pair(*std::move(cluster), *std::move(status));
}

}  // namespace

std::vector<std::string> ClusterNames(const std::string& kind, const std::string& kubeconfig,
                                      const std::string& context, const std::string& ns) {
  RealClock clock;
  absl::StatusOr<Cluster> cluster = Connect({kubeconfig, context, ns, 3 * kNanosPerSecond}, &clock);
  if (!cluster.ok()) return {};
  kube::ListOptions options;
  options.limit = 500;
  absl::StatusOr<kube::ObjectList> listed =
      kind == "namespaces" ? cluster->client->List(kube::Namespaces(), "", options)
                           : cluster->client->List(api::ProfileJobs(), cluster->ns, options);
  std::vector<std::string> names;
  if (!listed.ok()) return names;
  for (const value& item : listed->items) {
    if (item.has_field("metadata") && item.at("metadata").has_string_field("name")) {
      names.push_back(item.at("metadata").at("name").as_string());
    }
  }
  return names;
}

int RunKubeReport(const KubeJobOptions& options, std::ostream& out, std::ostream& err) {
  RealClock clock;
  auto job = FinishedJob(options.kube, options.job, &clock);
  if (!job.ok()) {
    err << Error("report", job.status());
    return kExitFailure;
  }
  const api::ProfileJobStatus& status = job->second;
  if (!api::IsTerminal(status.phase)) {
    err << kPlugin << " report: profilejob " << options.job << " is "
        << api::JobPhaseName(status.phase) << "; the report is written when it finishes\n";
    return kExitFailure;
  }
  PrintVerdict(options.job, status, out);
  if (status.run_uri.empty()) return status.phase == api::JobPhase::kFailed ? kExitFailure : 0;
  storage::StorageSet storages(storage::StorageSetOptions{.clock = &clock});
  absl::StatusOr<storage::Storage*> storage = storages.ForUri(status.run_uri);
  if (!storage.ok()) {
    err << Error("report", storage.status());
    return kExitFailure;
  }
  const std::filesystem::path folder = options.output.empty()
                                           ? std::filesystem::path(StrCat(options.job, "-report"))
                                           : std::filesystem::path(options.output);
  std::vector<std::string> written;
  for (std::string_view file : {storage::kReportHtmlName, storage::kReportJsonName}) {
    const std::string uri = StrCat(status.run_uri, "/", file);
    absl::Status copied = CopyObject(**storage, uri, folder / std::string(file));
    if (absl::IsNotFound(copied)) continue;
    if (!copied.ok()) {
      err << kPlugin << " report: reading " << uri << ": " << copied.message() << "\n";
      return kExitFailure;
    }
    written.push_back((folder / std::string(file)).string());
  }
  if (written.empty()) {
    err << kPlugin << " report: the run " << status.run_uri
        << " has no report files (no host sent step data); the verdict above is all there is\n";
    return status.phase == api::JobPhase::kFailed ? kExitFailure : kExitOk;
  }
  out << "wrote " << absl::StrJoin(written, ", ") << "\n";
  out << "open "
      << std::filesystem::absolute(folder / std::string(storage::kReportHtmlName)).string()
      << " in a browser\n";
  return status.phase == api::JobPhase::kFailed ? kExitFailure : kExitOk;
}

int RunKubePull(const KubeJobOptions& options, std::ostream& out, std::ostream& err) {
  RealClock clock;
  auto job = FinishedJob(options.kube, options.job, &clock);
  if (!job.ok()) {
    err << Error("pull", job.status());
    return kExitFailure;
  }
  const api::ProfileJobStatus& status = job->second;
  if (status.run_uri.empty()) {
    err << kPlugin << " pull: profilejob " << options.job << " has no run yet ("
        << api::JobPhaseName(status.phase)
        << (status.message.empty() ? "" : StrCat(": ", status.message)) << ")\n";
    return kExitFailure;
  }
  if (!api::IsTerminal(status.phase)) {
    err << kPlugin << " pull: profilejob " << options.job << " is still "
        << api::JobPhaseName(status.phase) << "; pulling what has landed so far\n";
  }
  storage::StorageSet storages(storage::StorageSetOptions{.clock = &clock});
  absl::StatusOr<storage::Storage*> storage = storages.ForUri(status.run_uri);
  if (!storage.ok()) {
    err << Error("pull", storage.status());
    return kExitFailure;
  }
  absl::StatusOr<std::vector<storage::Entry>> entries = (*storage)->List(status.run_uri);
  if (!entries.ok()) {
    err << kPlugin << " pull: listing " << status.run_uri << ": " << entries.status().message()
        << "\n";
    return kExitFailure;
  }
  // As a TensorBoard/XProf logdir of its own: <DIR>/plugins/profile/<run>/.
  const std::filesystem::path logdir = options.output.empty()
                                           ? std::filesystem::path(options.job)
                                           : std::filesystem::path(options.output);
  const std::filesystem::path run_dir =
      logdir / std::string(storage::kProfilePluginDir) / status.run_name;
  const bool terminal = isatty(STDERR_FILENO) == 1;
  uint64_t bytes = 0;
  int files = 0;
  int total = 0;
  for (const storage::Entry& entry : *entries) total += entry.is_directory ? 0 : 1;
  for (const storage::Entry& entry : *entries) {
    if (entry.is_directory) continue;
    absl::Status copied =
        CopyObject(**storage, StrCat(status.run_uri, "/", entry.name), run_dir / entry.name);
    if (!copied.ok()) {
      if (terminal) err << "\n";
      err << kPlugin << " pull: " << entry.name << ": " << copied.message() << "\n";
      return kExitFailure;
    }
    ++files;
    bytes += entry.bytes;
    if (terminal) {
      err << "\r\033[K" << files << "/" << total << " file(s), " << FormatBytes(bytes)
          << std::flush;
    }
  }
  if (terminal) err << "\r\033[K";
  out << "pulled " << files << " file(s), " << FormatBytes(bytes) << " into " << run_dir.string()
      << "\n";
  out << "open it:\n"
      << "  XProf/TensorBoard:  xprof --logdir " << logdir.string()
      << "   (or tensorboard --logdir " << logdir.string() << ")\n"
      << "  Perfetto:           clusterprof convert --run " << run_dir.string()
      << " --format perfetto, then https://ui.perfetto.dev (Open trace file)\n";
  const std::filesystem::path html = run_dir / std::string(storage::kReportHtmlName);
  if (std::filesystem::exists(html)) out << "  report:             " << html.string() << "\n";
  return kExitOk;
}

}  // namespace clusterprof::cli
