#include <chrono>
#include <iostream>
#include <memory>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "analysis/report.h"
#include "cli/commands.h"
#include "cli/format.h"
#include "common/base/clock.h"
#include "common/base/saturating.h"
#include "common/base/status.h"
#include "common/base/strings.h"
#include "common/io/background_sink.h"
#include "common/io/gzip_sink.h"
#include "common/io/mapped_file.h"
#include "common/storage/logdir.h"
#include "common/storage/storage_set.h"
#include "common/xspace/trace_json.h"
#include "common/xspace/trace_perfetto.h"
#include "common/xspace/xspace_io.h"
#include "common/xspace/xspace_stream.h"
#include "fmt/format.h"

namespace clusterprof::cli {
namespace {

// The default name of a Perfetto protobuf trace, as Perfetto's own tools name theirs.
constexpr std::string_view kPerfettoTraceSuffix = ".perfetto-trace";

// Streams to an std::ostream (for "-o -").
class OstreamSink final : public io::ByteSink {
 public:
  explicit OstreamSink(std::ostream& out) : out_(out) {}
  absl::Status Append(std::string_view data) override {
    out_.write(data.data(), static_cast<std::streamsize>(data.size()));
    if (!out_) return absl::DataLossError("writing to standard output failed");
    return absl::OkStatus();
  }

 private:
  std::ostream& out_;
};

bool IsPerfetto(ConvertFormat format) { return format == ConvertFormat::kPerfetto; }

std::string_view OutputSuffix(ConvertFormat format) {
  return IsPerfetto(format) ? kPerfettoTraceSuffix : storage::kTraceJsonSuffix;
}

// The input's name without .xplane.pb (or .pb).
std::string_view Stem(std::string_view input) {
  if (!ConsumeSuffix(&input, storage::kXPlaneSuffix)) ConsumeSuffix(&input, ".pb");
  return input;
}

std::string DefaultOutput(std::string_view input, ConvertFormat format) {
  return StrCat(Stem(input), OutputSuffix(format));
}

// The host a single file is of: its file name without .xplane.pb.
std::string HostOf(std::string_view input) {
  std::string_view stem = Stem(input);
  return std::string(stem.substr(stem.find_last_of('/') + 1));
}

// What a conversion wrote, whatever the format.
struct ConvertStats {
  int64_t complete_events = 0;
  int64_t counter_events = 0;
  uint64_t bytes = 0;  // uncompressed
};

ConvertStats StatsOf(const xspace::TraceJsonStats& stats) {
  return {stats.complete_events, stats.counter_events, stats.bytes};
}

ConvertStats StatsOf(const xspace::PerfettoTraceStats& stats) {
  return {stats.complete_events, stats.counter_events, stats.bytes};
}

// Converts the one file `input`, straight from its mapped pages.
class FileConverter {
 public:
  static absl::StatusOr<std::unique_ptr<FileConverter>> Open(storage::StorageSet& storages,
                                                             const std::string& input) {
    absl::StatusOr<storage::Storage*> storage = storages.ForUri(input);
    if (!storage.ok()) return storage.status();
    auto local = storage::LocalCopy::Fetch(**storage, input);
    if (!local.ok()) return local.status();
    auto file = io::MappedFile::Open((*local)->path());
    if (!file.ok()) return file.status();
    return std::unique_ptr<FileConverter>(
        new FileConverter(input, std::move(*local), std::move(*file)));
  }

  absl::StatusOr<xspace::TraceJsonStats> Convert(io::ByteSink* sink,
                                                 const xspace::TraceJsonOptions& options) {
    io::MappedFile& mapped = *file_;
    return xspace::WriteTraceJsonFromSerialized(
        mapped.data(), input_, sink, options,
        [&mapped](size_t offset) { mapped.ReleaseBelow(offset); });
  }

  absl::StatusOr<xspace::PerfettoTraceStats> Convert(xspace::PerfettoTraceWriter& writer,
                                                     const xspace::PerfettoTraceOptions& options) {
    io::MappedFile& mapped = *file_;
    return writer.Add(mapped.data(), input_, options,
                      [&mapped](size_t offset) { mapped.ReleaseBelow(offset); });
  }

  // Reads the whole file as the Perfetto writer would, writing nothing (a bad host is then left
  // out before any of it is written).
  absl::Status Check() { return xspace::CheckSerializedXSpace(file_->data(), input_); }

 private:
  FileConverter(std::string input, std::unique_ptr<storage::LocalCopy> local,
                std::unique_ptr<io::MappedFile> file)
      : input_(std::move(input)), local_(std::move(local)), file_(std::move(file)) {}
  const std::string input_;
  const std::unique_ptr<storage::LocalCopy> local_;
  const std::unique_ptr<io::MappedFile> file_;
};

// The hosts of a run directory, with their clock offsets.
absl::StatusOr<analysis::RunHosts> ListHosts(storage::StorageSet& storages,
                                             const storage::Logdir& dir, std::ostream& err) {
  absl::StatusOr<storage::Storage*> storage = storages.For(dir);
  if (!storage.ok()) return storage.status();
  absl::StatusOr<analysis::RunHosts> run = analysis::ListRunHosts(**storage, dir.uri);
  if (!run.ok()) return run.status();
  if (!run->manifest_found && run->hosts.size() > 1) {
    err << "clusterprof convert: no clock offsets in " << storage::kManifestName
        << ": the hosts' clocks are taken to agree\n";
  }
  return run;
}

// Every host of a run directory into one trace JSON: each host's planes become processes
// numbered from (index + 1) * 1000, named "<host> <plane>", shifted onto the coordinator's clock.
// One host file is open at a time.
absl::StatusOr<ConvertStats> ConvertRunJson(storage::StorageSet& storages,
                                            const std::string& run_dir, bool include_metadata,
                                            io::ByteSink* sink, std::ostream& err) {
  absl::StatusOr<storage::Logdir> dir = storage::ParseLogdir(run_dir);
  if (!dir.ok()) return dir.status();
  absl::StatusOr<analysis::RunHosts> run = ListHosts(storages, *dir, err);
  if (!run.ok()) return run.status();
  xspace::TraceJsonOptions options{.include_metadata = include_metadata};
  CLUSTERPROF_RETURN_IF_ERROR(xspace::WriteTraceJsonHeader(sink, options));
  ConvertStats total;
  options.write_header = false;
  options.write_footer = false;
  for (size_t i = 0; i < run->hosts.size(); ++i) {
    const std::string& host = run->hosts[i];
    const std::string path = StrCat(dir->uri, "/", host, storage::kXPlaneSuffix);
    absl::StatusOr<std::unique_ptr<FileConverter>> file = FileConverter::Open(storages, path);
    if (!file.ok()) return file.status();
    options.pid_base = static_cast<int>((i + 1) * 1000);
    options.process_name_prefix = StrCat(host, " ");
    options.shift_ps = SaturatingMul(run->OffsetOf(host), 1000);
    absl::StatusOr<xspace::TraceJsonStats> stats = (*file)->Convert(sink, options);
    if (!stats.ok()) return stats.status();
    total.complete_events += stats->complete_events;
    total.counter_events += stats->counter_events;
    total.bytes += stats->bytes;
  }
  CLUSTERPROF_RETURN_IF_ERROR(xspace::WriteTraceJsonFooter(sink, options));
  return total;
}

// The same as one Perfetto trace. A host file that cannot be opened or read is named on `err`
// and left out whole (each file is read through once before any of it is written); an error
// only when no host converted, or when writing fails.
absl::StatusOr<ConvertStats> ConvertRunPerfetto(storage::StorageSet& storages,
                                                const std::string& run_dir, io::ByteSink* sink,
                                                std::ostream& err) {
  absl::StatusOr<storage::Logdir> dir = storage::ParseLogdir(run_dir);
  if (!dir.ok()) return dir.status();
  absl::StatusOr<analysis::RunHosts> run = ListHosts(storages, *dir, err);
  if (!run.ok()) return run.status();
  xspace::PerfettoTraceWriter writer(sink);
  size_t converted = 0;
  std::vector<std::string> skipped;
  for (size_t i = 0; i < run->hosts.size(); ++i) {
    const std::string& host = run->hosts[i];
    const std::string path = StrCat(dir->uri, "/", host, storage::kXPlaneSuffix);
    absl::StatusOr<std::unique_ptr<FileConverter>> file = FileConverter::Open(storages, path);
    absl::Status readable = file.ok() ? (*file)->Check() : file.status();
    if (!readable.ok()) {
      err << "clusterprof convert: skipping host " << host << ": " << readable.message() << "\n";
      skipped.push_back(host);
      continue;
    }
    const xspace::PerfettoTraceOptions options{
        .pid_base = static_cast<int>((i + 1) * 1000),
        .process_name_prefix = StrCat(host, " "),
        .shift_ps = SaturatingMul(run->OffsetOf(host), 1000),
        .flow_id_salt = i,
    };
    // The file read whole above: only writing can fail now.
    absl::StatusOr<xspace::PerfettoTraceStats> stats = (*file)->Convert(writer, options);
    if (!stats.ok()) return stats.status();
    ++converted;
  }
  CLUSTERPROF_RETURN_IF_ERROR(writer.Flush());
  if (converted == 0) {
    return absl::InvalidArgumentError(StrCat("no host of ", dir->uri, " could be converted (",
                                             skipped.size(),
                                             " unreadable: ", absl::StrJoin(skipped, ", "), ")"));
  }
  if (!skipped.empty()) {
    err << "clusterprof convert: " << skipped.size() << " of " << run->hosts.size()
        << " hosts left out: " << absl::StrJoin(skipped, ", ") << "\n";
  }
  return StatsOf(writer.total());
}

// Where the output goes: --output, else beside the input (a run: named after it, here).
std::string OutputFor(const ConvertOptions& options) {
  if (!options.output.empty()) return options.output;
  if (!options.run) return DefaultOutput(options.input, options.format);
  std::string_view run = options.input;
  while (ConsumeSuffix(&run, "/")) {
  }
  return StrCat(run.substr(run.find_last_of('/') + 1), OutputSuffix(options.format));
}

// What was written, and where to open it.
void SayWritten(const storage::ObjectInfo& info, const ConvertStats& stats, bool perfetto,
                double seconds, std::ostream& out) {
  out << fmt::format("wrote {} ({} events, {} counter samples; {} of {}, {} on disk) in {:.2f} s\n",
                     info.uri, stats.complete_events, stats.counter_events,
                     FormatBytes(stats.bytes), perfetto ? "Perfetto protobuf" : "JSON",
                     FormatBytes(info.bytes), seconds);
  if (perfetto) {
    out << "open it at https://ui.perfetto.dev (Open trace file), or query it with "
           "trace_processor\n";
  } else {
    out << "open it at https://ui.perfetto.dev (Open trace file) or chrome://tracing\n";
  }
}

}  // namespace

int RunConvert(const ConvertOptions& options, std::ostream& out, std::ostream& err) {
  // Convert straight from the mapped file, one event at a time: memory stays small whatever the
  // size of the trace, and pages already converted are dropped as conversion moves on.
  RealClock clock;
  const int64_t started_ns = clock.MonotonicNs();
  storage::StorageSet storages(storage::StorageSetOptions{.clock = &clock});
  std::unique_ptr<FileConverter> single;
  if (!options.run) {
    absl::StatusOr<std::unique_ptr<FileConverter>> file =
        FileConverter::Open(storages, options.input);
    if (!file.ok()) {
      err << "clusterprof convert: " << file.status().message() << "\n";
      return kExitFailure;
    }
    single = std::move(*file);
  }
  const bool perfetto = IsPerfetto(options.format);
  const bool include_metadata = options.format == ConvertFormat::kJson;
  const auto convert = [&](io::ByteSink* sink) -> absl::StatusOr<ConvertStats> {
    if (options.run && perfetto) return ConvertRunPerfetto(storages, options.input, sink, err);
    if (options.run) return ConvertRunJson(storages, options.input, include_metadata, sink, err);
    if (perfetto) {
      xspace::PerfettoTraceWriter writer(sink);
      auto stats = single->Convert(writer, {.process_name_prefix = HostOf(options.input) + " "});
      if (!stats.ok()) return stats.status();
      CLUSTERPROF_RETURN_IF_ERROR(writer.Flush());
      return StatsOf(writer.total());
    }
    auto stats = single->Convert(sink, {.include_metadata = include_metadata});
    if (!stats.ok()) return stats.status();
    return StatsOf(*stats);
  };

  if (options.output == "-") {
    OstreamSink sink(out);
    auto stats = convert(&sink);
    if (!stats.ok()) {
      err << "clusterprof convert: " << stats.status().message() << "\n";
      return kExitFailure;
    }
    out.flush();
    return kExitOk;
  }

  const std::string output = OutputFor(options);
  auto path = storage::ParseLogdir(output);  // makes it absolute and rejects '..'
  if (!path.ok()) {
    err << "clusterprof convert: bad output path '" << output << "': " << path.status().message()
        << "\n";
    return kExitUsage;
  }
  auto storage = storages.For(*path);
  if (!storage.ok()) {
    err << "clusterprof convert: " << storage.status().message() << "\n";
    return kExitFailure;
  }
  auto writer = (*storage)->NewWriter(path->uri);
  if (!writer.ok()) {
    err << "clusterprof convert: " << writer.status().message() << "\n";
    return kExitFailure;
  }
  // JSON is gzipped unless asked for as .json (as the sidecar writes it); Perfetto's protobuf,
  // several times smaller, only when asked for as .gz.
  const bool compress = perfetto ? EndsWith(output, ".gz") : !EndsWith(output, ".json");
  // The trace on this thread; gzip (when compressing) and write(2) on a background thread. The
  // sink chain's own status tells output failures apart from problems with the input.
  absl::StatusOr<ConvertStats> stats;
  absl::Status output_status;
  {
    io::GzipSink gzip(writer->get(), options.gzip_level);
    io::ByteSink* target = compress ? static_cast<io::ByteSink*>(&gzip) : writer->get();
    io::BackgroundSink background(target);
    stats = convert(&background);
    output_status = background.Finish();
    if (output_status.ok() && compress && stats.ok()) output_status = gzip.Finish();
  }
  if (!stats.ok() && output_status.ok()) {
    err << "clusterprof convert: " << stats.status().message() << "\n";
    return kExitFailure;
  }
  absl::StatusOr<storage::ObjectInfo> info =
      output_status.ok() ? (*writer)->Commit() : absl::StatusOr<storage::ObjectInfo>(output_status);
  const absl::Status committed = info.ok() ? storage::CheckCommitted(*info) : info.status();
  if (!committed.ok()) {
    err << "clusterprof convert: writing " << output << ": " << committed.message() << "\n";
    return kExitFailure;
  }
  SayWritten(*info, *stats, perfetto,
             static_cast<double>(clock.MonotonicNs() - started_ns) / kNanosPerSecond, out);
  return kExitOk;
}

}  // namespace clusterprof::cli
