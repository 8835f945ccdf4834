#include "sidecar/tracers/gpu_tracer.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>

#include "common/base/check.h"
#include "common/base/strings.h"
#include "sidecar/tracers/gpu_xplane.h"
#include "sidecar/tracers/nvml_api.h"
#include "sidecar/tracers/ring_reader.h"
#include "spdlog/spdlog.h"
#include "tsl/profiler/protos/xplane.pb.h"

namespace clusterprof::sidecar {
namespace {

using tensorflow::profiler::XSpace;

std::string ProcessLabel(const shm::GpuRingReader& reader) {
  return reader.process_name().empty() ? StrCat("pid ", reader.pid())
                                       : StrCat(reader.process_name(), " (pid ", reader.pid(), ")");
}

}  // namespace

absl::StatusOr<GpuCaptureOptions> ParseGpuCaptureOptions(
    const tensorflow::ProfileOptions& options) {
  using Value = tensorflow::ProfileOptions::AdvancedConfigValue;
  GpuCaptureOptions out;
  out.level = options.device_tracer_level();
  const auto& config = options.advanced_configuration();
  for (const auto& [key, field] :
       {std::pair{kGpuMaxActivityEventsKey, &GpuCaptureOptions::max_activity_events},
        std::pair{kGpuMaxApiEventsKey, &GpuCaptureOptions::max_api_events}}) {
    auto it = config.find(key);
    if (it == config.end()) continue;
    if (it->second.value_case() != Value::kInt64Value || it->second.int64_value() <= 0) {
      return absl::InvalidArgumentError(
          StrCat("advanced_configuration[\"", key, "\"] must be a positive int64_value"));
    }
    out.*field = static_cast<uint64_t>(it->second.int64_value());
  }
  if (auto it = config.find(kGpuEnableNvtxKey); it != config.end()) {
    if (it->second.value_case() != Value::kBoolValue) {
      return absl::InvalidArgumentError(
          StrCat("advanced_configuration[\"", kGpuEnableNvtxKey, "\"] must be a bool_value"));
    }
    out.nvtx = it->second.bool_value();
  }
  if (auto it = config.find(kGpuApiTracingKey); it != config.end()) {
    const std::string& value = it->second.string_value();
    if (value == "runtime,driver" || value == "driver,runtime") {
      out.runtime_api = out.driver_api = true;
    } else if (value == "runtime" || value == "driver" || value == "none") {
      out.runtime_api = value == "runtime";
      out.driver_api = value == "driver";
    } else {
      return absl::InvalidArgumentError(
          StrCat("advanced_configuration[\"", kGpuApiTracingKey,
                 "\"] must be a string_value of \"runtime,driver\", \"runtime\", \"driver\" or "
                 "\"none\", not \"",
                 value, "\""));
    }
  }
  return out;
}

absl::StatusOr<std::unique_ptr<GpuTracer>> GpuTracer::Create(
    ShmTransport* shm, Options options, std::unique_ptr<GpuMetricsSampler> metrics) {
  CLUSTERPROF_CHECK(shm != nullptr) << "the GPU tracer needs the shared-memory transport";
  return std::unique_ptr<GpuTracer>(new GpuTracer(shm, std::move(options), std::move(metrics)));
}

GpuTracer::GpuTracer(ShmTransport* shm, Options options, std::unique_ptr<GpuMetricsSampler> metrics)
    : options_(std::move(options)),
      clock_(options_.clock != nullptr ? options_.clock : &SystemClock()),
      shm_(shm),
      metrics_(std::move(metrics)),
      rings_(*shm, shm::kGpuRingPrefix, "GPU ring") {
  drainer_ = std::thread([this] { DrainLoop(); });
}

std::vector<std::string_view> GpuTracer::OwnedKeys() const {
  return {kGpuMaxActivityEventsKey, kGpuMaxApiEventsKey, kGpuEnableNvtxKey, kGpuApiTracingKey};
}

absl::Status GpuTracer::Validate(const tensorflow::ProfileOptions& options) const {
  return ParseGpuCaptureOptions(options).status();
}

GpuTracer::~GpuTracer() {
  shm_->control().DisarmDevice();
  {
    MutexLock lock(&mu_);
    draining_ = false;
    shutting_down_ = true;
  }
  drainer_.join();
}

TracerStatus GpuTracer::Status() const {
  absl::StatusOr<std::vector<std::string>> files = shm_->ListRings(shm::kGpuRingPrefix);
  if (!files.ok()) return {false, std::string(files.status().message())};
  return {true, StrCat(files->size(), " CUDA process(es) with GPU tracing in ", shm_->dir(),
                       metrics_ != nullptr ? "; GPU counters from NVML" : "")};
}

void GpuTracer::ArmLocked(const CaptureWindow& window, const CaptureConfig& config) {
  rings_.Release();
  window_ = window;
  stop_ns_ = window.planned_stop_ns;
  kept_ = 0;
  capped_ = 0;
  warnings_.clear();
  // Whatever the rings hold from before is not this capture's.
  RefreshRingsLocked();
  for (auto& [path, ring] : rings_) ring.reader->Skip();
  // Validate passed on these options when the request arrived; defaults if it was skipped.
  asked_for_gpu_ = false;
  for (std::string_view key : OwnedKeys()) {
    if (config.options.advanced_configuration().contains(std::string(key))) asked_for_gpu_ = true;
  }
  const GpuCaptureOptions gpu =
      ParseGpuCaptureOptions(config.options)
          .value_or(GpuCaptureOptions{.level = config.options.device_tracer_level()});
  shm::ControlWriter::DeviceArming arming;
  arming.level = gpu.level;
  if (gpu.max_activity_events > 0) arming.max_activity_events = gpu.max_activity_events;
  if (gpu.max_api_events > 0) arming.max_api_events = gpu.max_api_events;
  arming.flags = (gpu.nvtx ? uint32_t{shm::kGpuFlagNvtx} : 0u) |
                 (gpu.runtime_api ? 0u : uint32_t{shm::kGpuFlagNoRuntimeApi}) |
                 (gpu.driver_api ? 0u : uint32_t{shm::kGpuFlagNoDriverApi});
  seq_ = shm_->control().ArmDevice(arming);
  armed_ = true;
  // Drain while CUPTI records, from now on: records of the processes' first flushes already
  // come in before the start instant.
  draining_ = true;
}

absl::Status GpuTracer::Prepare(const CaptureWindow& window, const CaptureConfig& config) {
  MutexLock lock(&mu_);
  CLUSTERPROF_CHECK(!armed_) << "GPU tracer prepared while capturing";
  ArmLocked(window, config);
  return absl::OkStatus();
}

absl::Status GpuTracer::Start(const CaptureWindow& window, const CaptureConfig& config) {
  {
    MutexLock lock(&mu_);
    if (!armed_) ArmLocked(window, config);
    window_ = window;
    stop_ns_ = window.planned_stop_ns;
  }
  if (metrics_ != nullptr) {
    absl::Status started = metrics_->Start(window.start_ns);
    MutexLock lock(&mu_);
    metrics_started_ = started.ok();
    if (!started.ok()) warnings_.push_back(StrCat("gpu: no GPU counters: ", started.message()));
  }
  return absl::OkStatus();
}

int64_t GpuTracer::DataStartNs(const CaptureWindow& window) const {
  MutexLock lock(&mu_);
  return !rings_.empty() || metrics_started_ ? window.start_ns : 0;
}

absl::Status GpuTracer::Stop(int64_t stop_ns) {
  shm_->control().DisarmDevice();
  MutexLock lock(&mu_);
  if (metrics_started_) metrics_->Stop(stop_ns);
  stop_ns_ = stop_ns;
  // Each process that armed for this capture flushes CUPTI and says so; wait for that, draining
  // meanwhile (a full ring would hold a flush up). A process that exited has nothing more.
  const int64_t deadline_ns = clock_->MonotonicNs() + options_.flush_timeout_ms * kNanosPerMilli;
  while (true) {
    // A process that saw the arming just before the disarm may create its ring only now.
    RefreshRingsLocked();
    DrainLocked();
    std::vector<const shm::GpuRingReader*> pending;
    for (auto& [path, ring] : rings_) {
      const shm::GpuRingStatus status = ring.reader->ReadStatus();
      if (status.armed_seq == seq_ && status.flushed_seq < seq_ &&
          shm_->WriterAlive(path, ring.reader->pid(), ring.reader->process_start_ticks())) {
        pending.push_back(ring.reader.get());
      }
    }
    if (pending.empty()) break;
    if (clock_->MonotonicNs() >= deadline_ns) {
      for (const shm::GpuRingReader* reader : pending) {
        warnings_.push_back(StrCat(
            "gpu: ", ProcessLabel(*reader), " did not hand over its last GPU records within ",
            options_.flush_timeout_ms, " ms of the stop; the end of its trace may be missing"));
      }
      break;
    }
    mu_.AwaitWithTimeout([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return shutting_down_; },
                         std::chrono::milliseconds(2));
  }
  draining_ = false;
  armed_ = false;
  return absl::OkStatus();
}

void GpuTracer::DrainLoop() {
  MutexLock lock(&mu_);
  while (true) {
    mu_.Await([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return draining_ || shutting_down_; });
    if (shutting_down_) return;
    timespec dir_mtime{};
    while (draining_ && !shutting_down_) {
      if (shm_->DirectoryChanged(&dir_mtime)) RefreshRingsLocked();
      DrainLocked();
      mu_.AwaitWithTimeout(
          [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return !draining_ || shutting_down_; },
          std::chrono::milliseconds(options_.drain_interval_ms));
    }
  }
}

uint64_t GpuTracer::DrainOnce() {
  MutexLock lock(&mu_);
  return DrainLocked();
}

void GpuTracer::RefreshRingsLocked() {
  rings_.Refresh(&warnings_, "gpu: ", [](Ring& ring) {
    ring.dropped_before = ring.reader->ReadStatus().ring_dropped;
  });
}

uint64_t GpuTracer::DrainLocked() {
  uint64_t total = 0;
  for (auto& [path, ring] : rings_) {
    Ring* r = &ring;
    total += r->reader->Drain(
        [this, r](std::span<const shm::GpuRecord> records) ABSL_NO_THREAD_SAFETY_ANALYSIS {
          const uint64_t room = options_.max_records - std::min(kept_, options_.max_records);
          if (records.size() > room) {
            capped_ += records.size() - room;
            records = records.first(room);
          }
          r->records.Append(records);
          kept_ += records.size();
        });
  }
  return total;
}

absl::Status GpuTracer::CollectInto(XSpace* space, TracerStats* stats) {
  MutexLock lock(&mu_);
  GpuXPlaneConverter converter(space, window_.start_ns, stop_ns_);
  uint64_t dropped = capped_;
  bool any_armed = false;
  bool any_failed = false;
  for (auto& [path, ring] : rings_) {
    const shm::GpuRingReader& reader = *ring.reader;
    const shm::GpuRingStatus status = reader.ReadStatus();
    const std::string process = ProcessLabel(reader);
    if (status.state == shm::GpuState::kFailed) {
      space->add_warnings(StrCat("gpu: no GPU activity from ", process, ": ", status.error));
      any_failed = true;
      continue;
    }
    if (status.armed_seq != seq_) {
      // A process that never saw this capture's arming: CUDA started in it after the stop, or
      // it has been idle in a blocked state.
      continue;
    }
    any_armed = true;
    if (status.armed_wall_ns > window_.start_ns + 10 * 1'000'000) {
      space->add_warnings(StrCat("gpu: GPU tracing in ", process, " began ",
                                 (status.armed_wall_ns - window_.start_ns) / 1'000'000,
                                 " ms after the capture start (give the capture a longer delay)"));
    }
    const std::vector<shm::GpuDeviceInfo> devices = reader.Devices();
    converter.AddProcess(
        reader.pid(), reader.process_name(), devices,
        [&records = ring.records](const std::function<void(const shm::GpuRecord&)>& visit) {
          records.ForEach(visit);
        },
        [&reader](uint32_t id) { return reader.String(id); });
    const uint64_t ring_dropped =
        status.ring_dropped - std::min(status.ring_dropped, ring.dropped_before);
    if (status.capped_activity > 0 || status.capped_api > 0) {
      space->add_warnings(StrCat(
          "gpu: ", process, " reached the capture's event caps: ", status.capped_activity,
          " GPU activity and ", status.capped_api,
          " API events were dropped (raise advanced_configuration gpu_max_activity_api_events / "
          "gpu_max_callback_api_events)"));
    }
    if (status.cupti_dropped > 0) {
      space->add_warnings(StrCat("gpu: CUPTI dropped ", status.cupti_dropped, " records of ",
                                 process, " (its activity buffers were full)"));
    }
    if (ring_dropped > 0) {
      space->add_warnings(StrCat("gpu: ", ring_dropped, " GPU records of ", process,
                                 " were dropped because its ring stayed full"));
    }
    if (status.dropped_strings > 0) {
      space->add_warnings(
          StrCat("gpu: the string table of ", process, " is full; some events have no name"));
    }
    dropped += status.capped_activity + status.capped_api + status.cupti_dropped + ring_dropped;
  }
  if (capped_ > 0) {
    space->add_warnings(StrCat("gpu: ", capped_,
                               " GPU records were dropped past the sidecar's "
                               "cap of ",
                               options_.max_records, " per capture"));
  }
  if (rings_.empty() && !options_.host_has_gpus && !asked_for_gpu_) {
    // A host without GPUs: nothing to warn about.
    spdlog::info("gpu: no NVIDIA device on this host and no CUDA process in {}: no GPU activity",
                 shm_->dir());
  } else if (rings_.empty()) {
    space->add_warnings(StrCat(
        "gpu: no CUDA process in ", shm_->dir(),
        " has loaded libclusterprof_cupti, so there is no GPU activity: set "
        "CUDA_INJECTION64_PATH to libclusterprof_cupti.so and CLUSTERPROF_DIR in the workload's "
        "environment (docs/gpu.md)"));
  } else if (!any_armed && !any_failed) {
    space->add_warnings("gpu: no CUDA process was recording GPU activity during the capture");
  }
  for (const std::string& warning : warnings_) space->add_warnings(warning);

  uint64_t events = converter.stats().events;
  if (metrics_started_) {
    const GpuMetricsSampler::CollectResult counters =
        metrics_->CollectInto(space, converter.ordinal_by_uuid());
    events += counters.events;
    dropped += counters.dropped_samples;
    metrics_started_ = false;
  }
  stats->events += events;
  stats->dropped_events += dropped;
  rings_.Release();
  return absl::OkStatus();
}

bool HostHasNvidiaDevices(NvmlApi* nvml) {
  if (nvml != nullptr) {
    absl::StatusOr<int> count = nvml->DeviceCount();
    if (count.ok() && *count > 0) return true;
  }
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator("/dev", error)) {
    const std::string name = entry.path().filename().string();
    if (name.size() > 6 && name.rfind("nvidia", 0) == 0 &&
        name.find_first_not_of("0123456789", 6) == std::string::npos) {
      return true;
    }
  }
  std::filesystem::directory_iterator gpus("/proc/driver/nvidia/gpus", error);
  return !error && gpus != std::filesystem::directory_iterator();
}

}  // namespace clusterprof::sidecar
