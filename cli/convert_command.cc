#include <chrono>
#include <iostream>
#include <memory>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/base/clock.h"
#include "common/io/background_sink.h"
#include "common/io/gzip_sink.h"
#include "common/io/mapped_file.h"
#include "common/storage/logdir.h"
#include "common/storage/storage_set.h"
#include "common/base/strings.h"
#include "common/xspace/trace_json.h"
#include "common/xspace/xspace_io.h"
#include "fmt/format.h"
#include "cli/commands.h"

namespace clusterprof::cli {
namespace {

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

std::string DefaultOutput(std::string_view input) {
  std::string_view stem = input;
  if (!ConsumeSuffix(&stem, storage::kXPlaneSuffix)) ConsumeSuffix(&stem, ".pb");
  return StrCat(stem, storage::kTraceJsonSuffix);
}

std::string FormatBytes(uint64_t bytes) {
  if (bytes >= 1'000'000'000) return fmt::format("{:.2f} GB", bytes / 1e9);
  if (bytes >= 1'000'000) return fmt::format("{:.1f} MB", bytes / 1e6);
  if (bytes >= 1'000) return fmt::format("{:.1f} kB", bytes / 1e3);
  return fmt::format("{} B", bytes);
}

}  // namespace

int RunConvert(const ConvertOptions& options, std::ostream& out, std::ostream& err) {
  // Convert straight from the mapped file, one event at a time: memory stays small whatever the
  // size of the trace, and pages already converted are dropped as conversion moves on.
  RealClock clock;
  const int64_t started_ns = clock.MonotonicNs();
  storage::StorageSet storages(storage::StorageSetOptions{.clock = &clock});
  absl::StatusOr<storage::Storage*> input_storage = storages.ForUri(options.input);
  absl::StatusOr<std::unique_ptr<storage::LocalCopy>> input =
      input_storage.ok()
          ? storage::LocalCopy::Fetch(**input_storage, options.input)
          : absl::StatusOr<std::unique_ptr<storage::LocalCopy>>(input_storage.status());
  if (!input.ok()) {
    err << "clusterprof convert: " << input.status().message() << "\n";
    return kExitFailure;
  }
  auto file = io::MappedFile::Open((*input)->path());
  if (!file.ok()) {
    err << "clusterprof convert: " << file.status().message() << "\n";
    return kExitFailure;
  }
  io::MappedFile& mapped = **file;
  const auto release = [&mapped](size_t offset) { mapped.ReleaseBelow(offset); };
  const auto convert = [&](io::ByteSink* sink) {
    return xspace::WriteTraceJsonFromSerialized(mapped.data(), options.input, sink,
                                                {.include_metadata = !options.perfetto}, release);
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

  const std::string output = options.output.empty() ? DefaultOutput(options.input) : options.output;
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
  const bool compress = !EndsWith(output, ".json");
  // JSON on this thread; gzip (when compressing) and write(2) on a background thread. The sink
  // chain's own status tells output failures apart from problems with the input.
  absl::StatusOr<xspace::TraceJsonStats> stats;
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
  const double seconds = static_cast<double>(clock.MonotonicNs() - started_ns) / kNanosPerSecond;
  out << fmt::format(
      "wrote {} ({} events, {} counter samples; {} of JSON, {} on disk) in {:.2f} s\n", info->uri,
      stats->complete_events, stats->counter_events, FormatBytes(stats->bytes),
      FormatBytes(info->bytes), seconds);
  out << "open it at https://ui.perfetto.dev (Open trace file) or chrome://tracing\n";
  return kExitOk;
}

}  // namespace clusterprof::cli
