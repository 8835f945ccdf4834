#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "cli/commands.h"
#include "common/base/clock.h"
#include "common/base/saturating.h"
#include "common/base/strings.h"
#include "common/storage/logdir.h"
#include "common/storage/storage_set.h"
#include "common/xspace/summary.h"
#include "common/xspace/xspace_io.h"
#include "fmt/format.h"

namespace clusterprof::cli {
namespace {

struct HostResult {
  std::string host;
  std::string path;
  uint64_t bytes = 0;
  absl::StatusOr<xspace::SpaceSummary> summary;
};

std::string FormatInstant(int64_t ns) {
  if (ns == 0) return "-";
  return absl::FormatTime("%H:%M:%E6S", absl::FromUnixNanos(ns), absl::UTCTimeZone());
}

int InspectFile(storage::Storage& storage, const std::string& path, const InspectOptions& options,
                std::ostream& out, std::ostream& err) {
  auto local = storage::LocalCopy::Fetch(storage, path);
  auto loaded = local.ok() ? xspace::ReadXSpaceFile((*local)->path())
                           : absl::StatusOr<std::unique_ptr<xspace::LoadedXSpace>>(local.status());
  if (!loaded.ok()) {
    err << "clusterprof inspect: " << loaded.status().message() << "\n";
    return kExitFailure;
  }
  const xspace::SpaceSummary summary = xspace::Summarize((*loaded)->space(), options.top);
  out << xspace::FormatSummary(summary, path, options.max_lines);
  return kExitOk;
}

// A run directory: one table over all hosts, then each host in detail.
int InspectRun(storage::Storage& storage, const std::string& dir,
               const std::vector<storage::Entry>& entries, const InspectOptions& options,
               std::ostream& out, std::ostream& err) {
  std::vector<HostResult> hosts;
  for (const storage::Entry& entry : entries) {
    std::string_view name = entry.name;
    if (entry.is_directory || !ConsumeSuffix(&name, storage::kXPlaneSuffix)) continue;
    HostResult host{std::string(name), StrCat(dir, "/", entry.name), entry.bytes,
                    absl::UnknownError("not read")};
    auto local = storage::LocalCopy::Fetch(storage, host.path);
    auto loaded = local.ok()
                      ? xspace::ReadXSpaceFile((*local)->path())
                      : absl::StatusOr<std::unique_ptr<xspace::LoadedXSpace>>(local.status());
    if (loaded.ok()) {
      host.summary = xspace::Summarize((*loaded)->space(), options.top);
    } else {
      host.summary = loaded.status();
    }
    hosts.push_back(std::move(host));
  }
  out << fmt::format("run {}: {} host{}\n\n", dir, hosts.size(), hosts.size() == 1 ? "" : "s");
  out << fmt::format("  {:<28} {:>7} {:>10} {:>16} {:>14} {:>10}\n", "host", "planes", "events",
                     "first event UTC", "span", "size");
  int failures = 0;
  for (const HostResult& host : hosts) {
    if (!host.summary.ok()) {
      ++failures;
      out << fmt::format("  {:<28} unreadable: {}\n", host.host,
                         StdView(host.summary.status().message()));
      continue;
    }
    const xspace::SpaceSummary& s = *host.summary;
    out << fmt::format("  {:<28} {:>7} {:>10} {:>16} {:>14} {:>8.1f}KB\n", host.host,
                       s.planes.size(), s.events, FormatInstant(s.begin_ns),
                       s.events ? xspace::FormatDurationPs(
                                      SaturatingMul(SaturatingSub(s.end_ns, s.begin_ns), 1000))
                                : "-",
                       host.bytes / 1024.0);
  }
  for (const HostResult& host : hosts) {
    if (options.brief || !host.summary.ok()) continue;
    out << "\n" << xspace::FormatSummary(*host.summary, host.path, options.max_lines);
  }
  if (failures > 0) {
    err << "clusterprof inspect: " << failures << " of " << hosts.size()
        << " host files could not be read (see above)\n";
    return kExitFailure;
  }
  return kExitOk;
}

// A logdir or its plugins/profile directory: list the runs.
int InspectRuns(const std::string& profile_dir, storage::Storage& storage, std::ostream& out,
                std::ostream& err) {
  auto runs = storage.List(profile_dir);
  if (!runs.ok()) {
    err << "clusterprof inspect: " << runs.status().message() << "\n";
    return kExitFailure;
  }
  out << fmt::format("runs in {}\n\n  {:<32} {:>6}\n", profile_dir, "run", "hosts");
  int count = 0;
  for (const storage::Entry& run : *runs) {
    if (!run.is_directory) continue;
    auto files = storage.List(StrCat(profile_dir, "/", run.name));
    int hosts = 0;
    if (files.ok()) {
      for (const storage::Entry& f : *files) {
        if (EndsWith(f.name, storage::kXPlaneSuffix)) ++hosts;
      }
    }
    out << fmt::format("  {:<32} {:>6}\n", run.name, hosts);
    ++count;
  }
  if (count == 0) out << "  (no runs)\n";
  out << "\ninspect one with: clusterprof inspect " << profile_dir << "/<run>\n";
  return kExitOk;
}

}  // namespace

int RunInspect(const InspectOptions& options, std::ostream& out, std::ostream& err) {
  auto path = storage::ParseLogdir(options.path);
  if (!path.ok()) {
    err << "clusterprof inspect: " << path.status().message() << "\n";
    return kExitUsage;
  }
  RealClock clock;
  storage::StorageSet storages(storage::StorageSetOptions{.clock = &clock});
  auto storage = storages.For(*path);
  if (!storage.ok()) {
    err << "clusterprof inspect: " << storage.status().message() << "\n";
    return kExitFailure;
  }
  auto entry = (*storage)->Stat(path->uri);
  if (!entry.ok()) {
    err << "clusterprof inspect: " << entry.status().message() << "\n";
    return kExitFailure;
  }
  if (!entry->is_directory) return InspectFile(**storage, path->uri, options, out, err);

  auto entries = (*storage)->List(path->uri);
  if (!entries.ok()) {
    err << "clusterprof inspect: " << entries.status().message() << "\n";
    return kExitFailure;
  }
  bool has_hosts = false;
  bool has_plugins = false;
  for (const storage::Entry& e : *entries) {
    has_hosts |= !e.is_directory && EndsWith(e.name, storage::kXPlaneSuffix);
    has_plugins |= e.is_directory && e.name == "plugins";
  }
  if (has_hosts) return InspectRun(**storage, path->uri, *entries, options, out, err);
  if (has_plugins) return InspectRuns(path->Join(storage::kProfilePluginDir), **storage, out, err);
  if (EndsWith(path->uri, storage::kProfilePluginDir)) {
    return InspectRuns(path->uri, **storage, out, err);
  }
  err << "clusterprof inspect: " << path->uri
      << " holds no .xplane.pb files and no plugins/profile directory; give a run directory "
         "(<logdir>/plugins/profile/<run>), a logdir, or an .xplane.pb file\n";
  return kExitFailure;
}

}  // namespace clusterprof::cli
